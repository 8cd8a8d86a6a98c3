/*
 * flight.h — the flight recorder: every rank keeps its last collectives
 * and its threads' state, and writes them to a file (a "dump") when
 * something goes wrong or it is asked to, so that `kolo-timeline why DIR`
 * can say after the fact which rank stalled the job, and where (design in
 * flight.c; the file's fields in docs/flight.md).
 *
 * With KOLO_FLIGHT_RECORDER=0 rt->flight is NULL and every call below is
 * a test and a return, except the training threads' state (where they
 * are, in the handle table), which the negotiation reads either way.
 */
#ifndef KOLO_FLIGHT_H
#define KOLO_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

/* kolo_init: the record ring (KOLO_FLIGHT_RECORDER entries; 0: nothing at
 * all), the SIGUSR1 handler and the thread that writes dumps. */
int kolo__flight_open(kolo__runtime_t *rt, kolo__err_t *err);
/* kolo_shutdown (after its sets stopped): writes the dump still asked
 * for, then, when KOLO_FLIGHT_DIR is set and the global set had started,
 * a last one ("shutdown"); restores SIGUSR1 and frees the recorder. */
void kolo__flight_close(kolo__runtime_t *rt);

/* The life of one collective on this rank (each cheap, none blocks).
 * enqueued: under the API lock, before the entry is pushed (it numbers
 * the entry in its set); refused: the queue did not take it after all
 * (its record and numbers are taken back). The others: the set's
 * background thread; ended is called for every entry that completes,
 * err NULL on success; a failure other than KOLO_ERR_SHUTDOWN asks for a
 * dump ("error: ..."). */
void kolo__flight_enqueued(kolo__pset_t *ps, kolo__entry_t *e);
void kolo__flight_refused(kolo__pset_t *ps, kolo__entry_t *e);
void kolo__flight_ready(kolo__pset_t *ps, kolo__entry_t *e, int64_t now_us);
/* The coordinator, answering a name every member has asked for in the
 * full round: when each member enqueued it, on the coordinator's clock
 * (its request's age), for its first ASKED_MAX members, kept in e's
 * record (e: the coordinator's own entry). */
void kolo__flight_asked(kolo__pset_t *ps, const kolo__entry_t *e,
                        const int64_t *at_us);
void kolo__flight_started(kolo__pset_t *ps, kolo__entry_t *const *es,
                          size_t n, size_t bytes, int64_t now_us);
void kolo__flight_ended(kolo__pset_t *ps, kolo__entry_t *e,
                        const kolo__err_t *err);

/* The training thread inside kolo_wait (on a handle) or back outside.
 * The state lives in the handle table: api.c, whose waits may outlast the
 * runtime, calls the _waits_ forms on it; the first two call them on
 * rt->handles. */
void kolo__flight_wait_begin(kolo__runtime_t *rt, kolo_handle_t handle);
void kolo__flight_wait_end(kolo__runtime_t *rt);
void kolo__flight_waits_begin(kolo__handles_t *h, kolo_handle_t handle);
void kolo__flight_waits_end(kolo__handles_t *h);

/* Asks the flight thread for a dump of this rank (any thread; never
 * blocks; `reason` is copied). A request while one is pending, or of the
 * kind of the last dump (its text up to the first ':') within a second of
 * it, adds nothing. */
void kolo__flight_dump(kolo__runtime_t *rt, const char *reason);
/* kolo__flight_dump with "error: MSG", or "timeout: MSG" for
 * KOLO_ERR_TIMEOUT. */
void kolo__flight_dump_error(kolo__runtime_t *rt, const kolo__err_t *err);
/* Asks every rank to dump: this one now, the others at the next
 * negotiation round of the global set (negotiate.c takes the request). */
void kolo__flight_dump_all(kolo__runtime_t *rt, const char *reason);
/* 1 once after kolo__flight_dump_all (or SIGUSR1): negotiate.c then asks
 * every rank to dump. */
int kolo__flight_take_dump_all(kolo__runtime_t *rt);

/* background.c, when a set's loop ends with `why`: the set's last state
 * for the dumps (the set itself may be gone by the next), and, when
 * `failed` (the stop is an error on this rank, not its own shutdown), a
 * dump with that reason. */
void kolo__flight_set_stopped(kolo__pset_t *ps, const kolo__err_t *why,
                              int failed);

/* Since when (kolo__now_us's clock, to its tick: a few ms) this rank's
 * training thread has been blocked in kolo_wait with everything it
 * enqueued in `ps` taken by the set's background thread; 0 when it is
 * not. */
int64_t kolo__flight_blocked_since(kolo__runtime_t *rt, const kolo__pset_t *ps);
/* Since when the training thread has been outside kolo (returned from its
 * last kolo_wait or enqueue; the same clock); 0 while it is inside. */
int64_t kolo__flight_outside_since(kolo__runtime_t *rt);

/* The negotiation's straggler figures for the dumps: a JSON object's text
 * (copied), or NULL. */
void kolo__flight_set_stragglers(kolo__pset_t *ps, const char *json);

/* kolo_flight_stacks (kolo.h): the file a Python binding's faulthandler
 * writes every thread's stack to on SIGUSR1 (fd < 0: none any more). */
int kolo__flight_stacks(kolo__runtime_t *rt, int fd, int signum,
                        kolo__err_t *err);

#endif /* KOLO_FLIGHT_H */
