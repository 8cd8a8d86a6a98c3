/*
 * watchdog.h — says so when a rank's background thread has waited too long
 * for peers inside a backend call (design in watchdog.c).
 */
#ifndef KOLO_WATCHDOG_H
#define KOLO_WATCHDOG_H

#include "runtime.h"

/* Starts the watchdog of an initialised runtime (nothing when
 * KOLO_STALL_CHECK_TIME_SECONDS is 0 or the job has one rank). */
int kolo__watchdog_start(kolo__runtime_t *rt, kolo__err_t *err);
/* Stops it; before any set is freed. */
void kolo__watchdog_stop(kolo__runtime_t *rt);

/* The background thread of a set, around a call that waits for its peers:
 * `what` (static) names it, NULL when the call returned. */
void kolo__watchdog_enter(kolo__pset_t *ps, const char *what);

#endif /* KOLO_WATCHDOG_H */
