/*
 * common.h — what every runtime file shares: the error record that climbs
 * from where an error is decided to the handle that reports it, logging,
 * the two check macros, and small helpers.
 *
 * Errors: a function that can fail returns a kolo status (< 0 on failure)
 * and fills a kolo__err_t with one sentence that names the tensor, the rank
 * and the values. The sentence is written once, where the error is first
 * decided; callers add nothing but pass the record along, so the message a
 * user reads is the one written by the code that knew most.
 */
#ifndef KOLO_COMMON_H
#define KOLO_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "kolo.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KOLO__ERR_LEN 1024

typedef struct kolo__err {
    int code;                /* a KOLO_ERR_* value, or KOLO_OK */
    char msg[KOLO__ERR_LEN]; /* one sentence; "" when code is KOLO_OK */
} kolo__err_t;

/* Sets err->code and formats err->msg; returns code, so that a failing path
 * reads `return kolo__err_set(err, KOLO_ERR_..., "...", ...);`. err may be
 * NULL. */
int kolo__err_set(kolo__err_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kolo__err_clear(kolo__err_t *err);

/* Logging. Messages go to stderr as "[kolo rank R] LEVEL: text". */
/* Levels from the most verbose (0) up. */
typedef enum kolo__log_level {
    KOLO__LOG_TRACE, KOLO__LOG_DEBUG, KOLO__LOG_INFO, KOLO__LOG_WARNING,
    KOLO__LOG_ERROR, KOLO__LOG_OFF
} kolo__log_level_t;

extern int kolo__log_threshold; /* messages below it are dropped */
void kolo__log_set_rank(int rank);
void kolo__log(kolo__log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int kolo__log_level_parse(const char *text, int *level);

#define KOLO__LOG_ON(level) ((int)(level) >= kolo__log_threshold)
#define kolo__debug(...)                                                      \
    do {                                                                      \
        if (KOLO__LOG_ON(KOLO__LOG_DEBUG))                                    \
            kolo__log(KOLO__LOG_DEBUG, __VA_ARGS__);                          \
    } while (0)
#define kolo__trace(...)                                                      \
    do {                                                                      \
        if (KOLO__LOG_ON(KOLO__LOG_TRACE))                                    \
            kolo__log(KOLO__LOG_TRACE, __VA_ARGS__);                          \
    } while (0)

/* KOLO__CHECK(call): propagate a failing status, logging file:line at debug
 * level on the way up so that KOLO_LOG_LEVEL=debug shows a cheap backtrace.
 * The message itself was written where the error was decided. */
#define KOLO__CHECK(call)                                                     \
    do {                                                                      \
        int kolo__rc_ = (call);                                               \
        if (kolo__rc_ < 0) {                                                  \
            kolo__debug("%s:%d -> %d", __FILE__, __LINE__, kolo__rc_);        \
            return kolo__rc_;                                                 \
        }                                                                     \
    } while (0)

/* KOLO__CHECK_GOTO(call, rc, label): the same inside a function with
 * cleanup: stores the status in rc and jumps to the label that undoes what
 * was done so far. */
#define KOLO__CHECK_GOTO(call, rc, label)                                     \
    do {                                                                      \
        (rc) = (call);                                                        \
        if ((rc) < 0) {                                                       \
            kolo__debug("%s:%d -> %d", __FILE__, __LINE__, (rc));             \
            goto label;                                                       \
        }                                                                     \
    } while (0)

/* Monotonic time. */
int64_t kolo__now_us(void);


/* "ADDRESS:PORT" ("[ADDRESS]:PORT" for IPv6, "?" for another family) of
 * a socket address (a struct sockaddr_storage), for messages naming
 * where a connection came from. */
void kolo__addr_text(const void *sockaddr_storage, char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_COMMON_H */
