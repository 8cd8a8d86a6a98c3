/*
 * negotiate.h — one negotiation round (negotiate.c, whose opening essay
 * describes the protocol).
 */
#ifndef KOLO_NEGOTIATE_H
#define KOLO_NEGOTIATE_H

#include "runtime.h"

/* One negotiation round. `fresh` are the entries taken from the queue this
 * cycle. Fills ps->ready / ps->nready with the entries that are ready on
 * every rank, in plan order (with zero-filled stand-ins for the allreduces
 * of ranks that joined), and completes the ones that failed negotiation.
 * Sets *stop_rank to the lowest set rank that asked to shut down, or -1. A
 * failure returned here (the backend, or a protocol error) ends the set. */
int kolo__negotiate(kolo__pset_t *ps, kolo__entry_t *fresh, int shutdown,
                    int *stop_rank, kolo__err_t *err);
int kolo__negotiate_init(kolo__pset_t *ps);
void kolo__negotiate_free(kolo__pset_t *ps);
/* Calls fn on every entry the negotiation still holds, removing them. */
void kolo__negotiate_drain(kolo__pset_t *ps,
                           void (*fn)(kolo__pset_t *, kolo__entry_t *,
                                      const kolo__err_t *),
                           const kolo__err_t *why);
/* 1 when this rank holds entries that wait for other ranks. */
int kolo__negotiate_pending(const kolo__pset_t *ps);

#ifdef KOLO_HAVE_MEM
/* The unit tests' (libkolo_mem only): called on the background thread at
 * the start of every round, where a test may change this rank's state
 * (the check of the response caches is tested so). */
extern void (*kolo__negotiate_test_hook)(kolo__pset_t *ps);
#endif

#endif /* KOLO_NEGOTIATE_H */
