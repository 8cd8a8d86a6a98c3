/*
 * complete.c — how an entry ends: its timeline lane (the phases a tensor
 * passes through, named as in Horovod's timeline) and its completion, with
 * a result or with a message that names the tensor and, after a backend
 * failure, the rank that was lost.
 *
 * Called by the set's background thread only (the loop, negotiation and
 * execution): nothing here calls back into them.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <unistd.h>

#include "complete.h"
#include "flight.h"
#include "inflight.h"
#include "peers.h"
#include "timeline.h"

#define FUSION_ALIGN 64

void kolo__tl_entry_begin(kolo__pset_t *ps, kolo__entry_t *e, const char *phase,
                          const char *args, int64_t ts)
{
    if (kolo__timeline_active(ps->rt->timeline)) {
        kolo__tl_begin(ps->rt->timeline, e->name, phase, args, ts);
        e->tl_depth++;
    }
}

void kolo__tl_entry_end(kolo__pset_t *ps, kolo__entry_t *e)
{
    if (e->tl_depth > 0) {
        kolo__tl_end(ps->rt->timeline, e->name, 0);
        e->tl_depth--;
    }
}

/* The backend's phase names, as in Horovod's timeline: "GLOO_ALLREDUCE".
 * Static: timeline events keep the pointer after the set is gone. */
#define KOLO__PHASES(B)                                                      \
    {#B "_ALLREDUCE", #B "_BROADCAST", #B "_ALLGATHER", #B "_ALLTOALL",      \
     #B "_REDUCESCATTER", #B "_BARRIER", #B "_JOIN"}
const char *const *kolo__phase_names(const char *backend)
{
    static const char *const names[][KOLO__COLL_COUNT_] = {
        KOLO__PHASES(LOCAL), KOLO__PHASES(GLOO), KOLO__PHASES(SHM),
        KOLO__PHASES(MPI), KOLO__PHASES(HIER), KOLO__PHASES(NCCL),
        KOLO__PHASES(BACKEND)};
    static const char *const keys[] = {"local", "gloo", "shm", "mpi", "hier",
                                       "nccl"};

    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(keys[i], backend) == 0)
            return names[i];
    return names[sizeof(keys) / sizeof(keys[0])];
}
#undef KOLO__PHASES

const char *kolo__backend_phase(const kolo__pset_t *ps, int coll)
{
    if (coll < 0 || coll >= KOLO__COLL_COUNT_ || ps->phase == NULL)
        return "BACKEND";
    return ps->phase[coll];
}

/* Every entry of a batch enters or leaves a phase. */
void kolo__tl_batch(kolo__pset_t *ps, const size_t *idx, size_t n,
                     const char *phase)
{
    if (!kolo__timeline_active(ps->rt->timeline))
        return;
    for (size_t i = 0; i < n; i++) {
        kolo__entry_t *e = ps->ready[idx[i]];
        if (phase != NULL)
            kolo__tl_entry_begin(ps, e, phase, NULL, 0);
        else
            kolo__tl_entry_end(ps, e);
    }
}

int kolo__elastic_status(const kolo__runtime_t *rt, int code)
{
    if (rt->cfg.elastic && (code == KOLO_ERR_RANK_LOST ||
                            code == KOLO_ERR_TIMEOUT ||
                            code == KOLO_ERR_BACKEND))
        return KOLO_ERR_MEMBERSHIP;
    return code;
}

/* The flight recorder's record of the entry ends (flight.c). */
static void flight_end(kolo__pset_t *ps, kolo__entry_t *e, int status,
                       const char *msg)
{
    kolo__err_t why;

    if (ps->rt->flight == NULL)
        return;
    if (status == KOLO_OK) {
        kolo__flight_ended(ps, e, NULL);
        return;
    }
    kolo__err_set(&why, status, "%s", msg != NULL ? msg : "");
    kolo__flight_ended(ps, e, &why);
}

void kolo__complete(kolo__pset_t *ps, kolo__entry_t *e, int status,
                    const char *msg)
{
    status = kolo__elastic_status(ps->rt, status);
    flight_end(ps, e, status, msg);
    if (status != KOLO_OK)
        kolo__peers_note_cause(status, msg);
    while (e->tl_depth > 0)
        kolo__tl_entry_end(ps, e);
    if (e->handle > 0) {
        /* The name is released before the handle completes, so that a
         * training thread returning from kolo_wait can enqueue the same
         * name again. */
        kolo__handoff_t ho = {0};
        kolo__queue_release(&ps->queue, e->name);
        if (status == KOLO_OK) {
            ho.output = e->result;
            ho.output_free = kolo__result_free;
            e->result = NULL;
            if (e->done != NULL) {
                /* A CUDA tensor: done once its batch is queued; the
                 * handle orders the result on the program's stream. */
                kolo__done_ref(e->done);
                ho.done = e->done;
                ho.done_free = kolo__done_release;
                ho.stream = e->stream;
            }
        }
        kolo__handles_complete_handoff(ps->rt->handles, e->handle, status, msg,
                                       &ho);
    }
    if (status == KOLO_OK)
        ps->bytes_done += e->params.count *
                          (int64_t)kolo_dtype_size((kolo_dtype_t)e->params.wire);
    kolo__entry_free(e);
    ps->completed++;
}

/* Completes an entry that will never run, with a sentence naming it. */
void kolo__fail_entry(kolo__pset_t *ps, kolo__entry_t *e,
                       const kolo__err_t *why)
{
    char msg[KOLO__ERR_LEN + KOLO_MAX_NAME_LEN + 64];
    if (strstr(why->msg, e->name) != NULL)
        snprintf(msg, sizeof(msg), "%s", why->msg);
    else if (strstr(why->msg, "; so rank ") != NULL) /* kolo__fail_backend's:
                                                       who first */
        snprintf(msg, sizeof(msg), "%s, and %s of tensor '%s' did not complete",
                 why->msg, kolo__coll_name(e->params.coll), e->name);
    else
        snprintf(msg, sizeof(msg), "%s of tensor '%s' did not complete: %s",
                 kolo__coll_name(e->params.coll), e->name, why->msg);
    kolo__complete(ps, e, why->code, msg);
}


/* Writes "rank R had failed: WHY" (or "rank R ended its program ...") for
 * the first member that stopped after a failure of its own and said so
 * (peers.h), after `sep`; 0 (nothing written) when none did. */
static int member_why(kolo__pset_t *ps, const char *prefix, const char *sep,
                      char *out, size_t len)
{
    char why[KOLO__ERR_LEN / 2 - 64];

    for (int i = 0; i < ps->size && i < 64; i++) {
        if (ps->ranks[i] == ps->rt->rank ||
            !kolo__peers_why(&ps->rt->cfg, prefix, ps->ranks[i], why, sizeof(why)))
            continue;
        snprintf(out, len, "%srank %d %s", sep, ps->ranks[i], why);
        return 1;
    }
    return 0;
}

int kolo__fail_backend(kolo__pset_t *ps, int rc, const char *detail,
                       kolo__err_t *err, const char *fmt, ...)
{
    char what[KOLO__ERR_LEN / 2], lost[512] = "", why[KOLO__ERR_LEN / 2] = "";
    char prefix[32];
    int said, watched = 0;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (rc != KOLO_ERR_RANK_LOST && rc != KOLO_ERR_BACKEND && rc != KOLO_ERR_TIMEOUT)
        return kolo__err_set(err, rc, "rank %d: %s failed: %s", ps->rank,
                             what, detail);
    snprintf(prefix, sizeof(prefix), "kolo%u", ps->rt->generation);
    said = member_why(ps, prefix, "; ", why, sizeof(why));
    /* A peer's sockets close while its process is still being torn down:
     * give it a moment to be gone before deciding nobody died; not where
     * no peer's process can be watched from here (other hosts, no
     * registry: ranks as threads), nor where a peer said why it stopped. */
    for (int tries = 0; tries < 10; tries++) {
        if (kolo__peers_lost(&ps->rt->cfg, prefix, ps->ranks, ps->size, lost,
                             sizeof(lost), &watched) > 0) {
            rc = KOLO_ERR_RANK_LOST;
            break;
        }
        if (rc == KOLO_ERR_TIMEOUT || watched == 0 || said)
            break;
        usleep(20000);
    }
    if (!said && watched > 0) /* it may have said so while we waited */
        said = member_why(ps, prefix, "; ", why, sizeof(why));
    /* What happened to whom first, then what it did here. */
    if (lost[0] != '\0')
        return kolo__err_set(err, rc, "lost %s%s; so rank %d's %s failed (%s)",
                             lost, why, ps->rank, what, detail);
    if (said) /* why + 2: without its "; " */
        return kolo__err_set(err, rc, "%s; so rank %d's %s failed (%s)",
                             why + 2, ps->rank, what, detail);
    return kolo__err_set(err, rc, "rank %d: %s failed: %s", ps->rank, what,
                         detail);
}
