/*
 * pset.h — the life cycle of a process set on one rank (pset.c): the API
 * starts and stops sets; execution connects the extra network contexts of
 * the device backend's hierarchical allreduce here.
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

/* Connects a backend context among `size` members of the set (global
 * ranks members[], host indices hosts[]), this rank being member `rank`;
 * `role` makes its rendezvous keys unique within the set. Background
 * thread or set start-up; every member calls it. */
int kolo__pset_connect(kolo__pset_t *ps, const kolo__ops_t *ops,
                       const char *role, int rank, int size,
                       const int *members, const int *hosts,
                       const char *cross_ops, void **ctx, kolo__err_t *err);

/* The backend's on_wake callback; arg is the set. */
void kolo__wake_from_peer(void *arg, uint64_t round);

#endif /* KOLO_PSET_H */
