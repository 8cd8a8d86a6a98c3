/*
 * background.h — the thread of one process set (background.c): the loop
 * that takes what was enqueued, negotiates a round and executes its plan.
 */
#ifndef KOLO_BACKGROUND_H
#define KOLO_BACKGROUND_H

#include "runtime.h"

/* The thread's body; arg is the set (pset.c starts it). */
void *kolo__background_main(void *arg);

#endif /* KOLO_BACKGROUND_H */
