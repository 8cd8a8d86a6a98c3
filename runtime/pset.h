/*
 * pset.h — the life cycle of a process set on one rank (pset.c): the API
 * starts and stops sets (their contexts are connected by connect.c).
 */
#ifndef KOLO_PSET_H
#define KOLO_PSET_H

#include "runtime.h"

/* Connects a set's backend, starts its thread. ranks[size] are global
 * ranks; this rank must be among them. With a watch, every rank of the job
 * agrees on the outcome before the thread starts (kolo__outcome_agree;
 * watch->agreed says whether it got that far). */
int kolo__pset_start(kolo__runtime_t *rt, int id, const int *ranks, int size,
                     kolo__outcome_t *watch, kolo__pset_t **out,
                     kolo__err_t *err);
/* Stops a set (its pending work fails with `why`), joins its thread and
 * frees it. Every member calls it for the same set. */
void kolo__pset_stop(kolo__pset_t *ps, const kolo__err_t *why);
/* Asks a set's thread to stop with `why` without waiting for it. */
void kolo__pset_request_stop(kolo__pset_t *ps, const kolo__err_t *why);

#endif /* KOLO_PSET_H */
