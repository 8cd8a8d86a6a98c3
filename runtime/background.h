/*
 * background.h — the thread of one process set (background.c): the loop
 * that takes what was enqueued, negotiates a round and executes its plan.
 */
#ifndef KOLO_BACKGROUND_H
#define KOLO_BACKGROUND_H

#include "runtime.h"

/* The loop of the set's thread (pset.c runs it); it returns when the set
 * has stopped, the reason in ps->stopped (every pending entry failed with
 * it, the queue closed): 0 when the members agreed to stop (a shutdown),
 * 1 when it stopped on a failure this rank met. */
int kolo__background_main(kolo__pset_t *ps);

#endif /* KOLO_BACKGROUND_H */
