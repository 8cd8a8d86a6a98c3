/*
 * stall.h — the stall inspector and the deadlock proof (design in
 * stall.c), called by the negotiation (negotiate.c) once per round.
 */
#ifndef KOLO_STALL_H
#define KOLO_STALL_H

#include <stdint.h>

#include "runtime.h"

int kolo__stall_init(kolo__pset_t *ps);
void kolo__stall_free(kolo__pset_t *ps);

/* Half the stall time: a tensor waiting that long on a cache bit goes to
 * the coordinator, one unanswered that long is sent again (0 without a
 * stall check). */
int64_t kolo__stall_half_us(const kolo__pset_t *ps);

/* After each round, every rank: the round's blocked words (bit r clear:
 * rank r blocked in kolo_wait) and whether some rank had tensors on cache
 * bits. */
void kolo__stall_observe(kolo__pset_t *ps, const uint64_t *blocked_words,
                         int hits_anywhere);
/* Whether this rank's tensors on cache bits go to the coordinator now (a
 * deadlock is suspected). */
int kolo__stall_release_hits(const kolo__pset_t *ps, int64_t now);
/* The coordinator, after each round: a deadlock proven or a stall timed
 * out stops the job at the next round (neg.stall_fatal); a stall warns. */
void kolo__stall_check(kolo__pset_t *ps);

#endif /* KOLO_STALL_H */
