/*
 * complete.h — how an entry ends (complete.c): its timeline lane and its
 * completion. Used by negotiation, execution and the loop.
 */
#ifndef KOLO_COMPLETE_H
#define KOLO_COMPLETE_H

#include "runtime.h"

/* Completes an entry: releases its name and completes its handle (with
 * the entry's result, if any). Frees the entry. */
void kolo__complete(kolo__pset_t *ps, kolo__entry_t *e, int status,
                    const char *msg);
/* In an elastic job (KOLO_ELASTIC=1), the status a loss turns into: a rank
 * lost, a timeout or a backend failure is KOLO_ERR_MEMBERSHIP, which the
 * program recovers from by re-forming the job (elastic.c). Elsewhere, and
 * for any other status, `code` itself. */
int kolo__elastic_status(const kolo__runtime_t *rt, int code);

/* Completes an entry that will never run, with a sentence naming it. */
void kolo__fail_entry(kolo__pset_t *ps, kolo__entry_t *e,
                      const kolo__err_t *why);

/* Timeline spans on an entry's lane (no-ops while the timeline is off);
 * kolo__complete closes what is still open. ts 0: now. */
void kolo__tl_entry_begin(kolo__pset_t *ps, kolo__entry_t *e, const char *phase,
                          const char *args, int64_t ts);
void kolo__tl_entry_end(kolo__pset_t *ps, kolo__entry_t *e);
/* Every entry ps->ready[idx[0..n)] enters `phase`, or (NULL) leaves the
 * one it is in. */
void kolo__tl_batch(kolo__pset_t *ps, const size_t *idx, size_t n,
                    const char *phase);
/* A backend's phase names, by collective, as in Horovod's timeline
 * ("GLOO_ALLREDUCE"); static, so events may keep the pointers. */
const char *const *kolo__phase_names(const char *backend);
/* The phase of collective `coll` on the set's data backend. */
const char *kolo__backend_phase(const kolo__pset_t *ps, int coll);

/* Sets err after a backend failure (rc, the backend's detail) of what
 * this rank was doing (fmt...: "allreduce of tensor 'x' (10 float32)").
 * Where a peer's process is gone, or a peer said why it stopped (peers.h),
 * the sentence leads with that, and a lost peer makes the code
 * KOLO_ERR_RANK_LOST: "lost rank 2 (pid 1234) has exited or was killed; so
 * rank 0's allreduce of tensor 'x' (10 float32) failed (connection closed
 * by peer)", "rank 2 had failed: out of memory ...; so rank 0's ...";
 * else "rank 0: allreduce of tensor 'x' (10 float32) failed: DETAIL".
 * Returns the code. */
int kolo__fail_backend(kolo__pset_t *ps, int rc, const char *detail,
                       kolo__err_t *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif /* KOLO_COMPLETE_H */
