/*
 * execute.h — running a round's plan (execute.c).
 */
#ifndef KOLO_EXECUTE_H
#define KOLO_EXECUTE_H

#include "runtime.h"

/* Executes the plan in ps->ready: fusion batches of allreduces, the other
 * collectives one by one; completes every entry of it. A failure returned
 * here (the backend, memory) has failed what was left of the plan too, and
 * ends the set. */
int kolo__execute(kolo__pset_t *ps, kolo__err_t *err);

#endif /* KOLO_EXECUTE_H */
