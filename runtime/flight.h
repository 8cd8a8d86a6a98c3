/*
 * flight.h — the flight recorder: every rank keeps its last collectives
 * and its threads' state, and writes them to a file (a "dump") when
 * something goes wrong or it is asked to, so that `kolo-timeline why DIR`
 * can say after the fact which rank stalled the job, and where (design in
 * flight.c; the file's fields in docs/flight.md).
 */
#ifndef KOLO_FLIGHT_H
#define KOLO_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

/* kolo_init: the record ring (KOLO_FLIGHT_RECORDER entries; 0: nothing at
 * all), the SIGUSR1 handler and the thread that writes dumps. */
int kolo__flight_open(kolo__runtime_t *rt, kolo__err_t *err);
/* kolo_shutdown: writes the dump still asked for, restores SIGUSR1. */
void kolo__flight_close(kolo__runtime_t *rt);

/* The life of one collective on this rank (each cheap, none blocks). */
void kolo__flight_enqueued(kolo__pset_t *ps, kolo__entry_t *e);
void kolo__flight_ready(kolo__pset_t *ps, kolo__entry_t *e, int64_t now_us);
void kolo__flight_started(kolo__pset_t *ps, kolo__entry_t *const *es,
                          size_t n, size_t bytes, int64_t now_us);
void kolo__flight_ended(kolo__pset_t *ps, kolo__entry_t *e,
                        const kolo__err_t *err);

/* The training thread inside kolo_wait (on a handle) or back outside. */
void kolo__flight_wait_begin(kolo__runtime_t *rt, kolo_handle_t handle);
void kolo__flight_wait_end(kolo__runtime_t *rt);

/* Asks the flight thread for a dump of this rank (any thread; never
 * blocks; `reason` is copied). */
void kolo__flight_dump(kolo__runtime_t *rt, const char *reason);
/* Asks every rank to dump: this one now, the others at the next
 * negotiation round of the global set (negotiate.c takes the request). */
void kolo__flight_dump_all(kolo__runtime_t *rt, const char *reason);
/* 1 once after kolo__flight_dump_all (or SIGUSR1): negotiate.c then asks
 * every rank to dump. */
int kolo__flight_take_dump_all(kolo__runtime_t *rt);

/* Since when (kolo__now_us) this rank's training thread has been blocked
 * in kolo_wait with everything it enqueued in `ps` taken by the set's
 * background thread; 0 when it is not. */
int64_t kolo__flight_blocked_since(kolo__runtime_t *rt, const kolo__pset_t *ps);
/* Since when the training thread has been outside kolo (returned from its
 * last kolo call); 0 while it is inside. */
int64_t kolo__flight_outside_since(kolo__runtime_t *rt);

/* The negotiation's straggler figures for the dumps: a JSON object's text
 * (copied), or NULL. */
void kolo__flight_set_stragglers(kolo__pset_t *ps, const char *json);

#endif /* KOLO_FLIGHT_H */
