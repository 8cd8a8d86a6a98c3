/*
 * api.h — what the two halves of the public API (api.c and enqueue.c)
 * share: entering the API under its lock, reporting a failure to the
 * calling thread, finding a process set. api.c defines them; enqueue.c
 * only calls them (nothing in api.c calls back into enqueue.c).
 */
#ifndef KOLO_API_H
#define KOLO_API_H

#include "runtime.h"

/* Takes the API lock and returns the runtime, or NULL (lock released) with
 * KOLO_ERR_NOT_INITIALIZED in err. `what` names the call in the message. */
kolo__runtime_t *kolo__api_enter(const char *what, kolo__err_t *err);
void kolo__api_leave(void);

/* The set `id` if it exists and this rank is a member; else NULL and an
 * error. Called under the API lock. */
kolo__pset_t *kolo__api_set(kolo__runtime_t *rt, int id, const char *what,
                            kolo__err_t *err);

/* Records the message for kolo_last_error() and returns the code. */
int kolo__api_fail(const kolo__err_t *err);
int kolo__api_failf(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

kolo__handles_t *kolo__api_handles(void);

#endif /* KOLO_API_H */
