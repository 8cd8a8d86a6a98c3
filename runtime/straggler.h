/*
 * straggler.h — the rank the others keep waiting for (design in
 * straggler.c), measured by the negotiation after every round.
 */
#ifndef KOLO_STRAGGLER_H
#define KOLO_STRAGGLER_H

#include <stddef.h>

#include "runtime.h"

/* The set's measure (nothing with KOLO_STRAGGLER_SHARE=0 or one rank);
 * -1 when out of memory. */
int kolo__straggler_new(kolo__pset_t *ps);
void kolo__straggler_free(kolo__straggler_t *s);
/* After a round's plan is known, on every rank: counts this rank's wait;
 * every WINDOW rounds with a plan, one gather to the coordinator, which
 * judges and may warn. */
int kolo__straggler_round(kolo__pset_t *ps, kolo__err_t *err);
/* The coordinator's one line on the latest rank over the job ("" when it
 * has none). */
void kolo__straggler_line(const kolo__pset_t *ps, char *out, size_t len);
/* The coordinator of the global set, when it stops: that line in
 * KOLO_FLIGHT_DIR/stragglers.txt, which kolorun prints. */
void kolo__straggler_write(const kolo__pset_t *ps);

#endif /* KOLO_STRAGGLER_H */
