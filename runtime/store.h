/*
 * store.h — a small key-value store over the job's rendezvous, for what
 * the ranks must agree on before any backend connects (design in store.c).
 */
#ifndef KOLO_STORE_H
#define KOLO_STORE_H

#include <stddef.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kolo__store kolo__store_t;

/* Opens the store of a rendezvous string: file:DIR or
 * redis:HOST:PORT[/JOB] (a Redis server or rank 0's rendezvous server,
 * logged in as the job's secret says: store.c). Every call on it is
 * bounded by io_timeout_s. */
int kolo__store_open(const char *rendezvous, double io_timeout_s,
                     kolo__store_t **out, kolo__err_t *err);
void kolo__store_close(kolo__store_t *s);

/* Sets key to the len bytes of value (readers see all of it or none). */
int kolo__store_set(kolo__store_t *s, const char *key, const char *value,
                    size_t len, kolo__err_t *err);

/* Opens, sets one key and closes; for a file rendezvous without
 * allocating anything, so that a rank out of memory can still tell the
 * others why it fails. */
int kolo__store_set_once(const char *rendezvous, double io_timeout_s,
                         const char *key, const char *value, size_t len,
                         kolo__err_t *err);

/* The value of key into *value (malloc'ed, NUL-terminated; the caller
 * frees it), waiting for it up to wait_s seconds (0: look once). Returns
 * KOLO_OK, KOLO_ERR_TIMEOUT when the key did not appear (with *value
 * NULL and no message), or another error with a message. */
int kolo__store_get(kolo__store_t *s, const char *key, double wait_s,
                    char **value, kolo__err_t *err);

/* The same, for values that may hold any byte: their length in *len. */
int kolo__store_get_bytes(kolo__store_t *s, const char *key, double wait_s,
                          char **value, size_t *len, kolo__err_t *err);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_STORE_H */
