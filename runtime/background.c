/*
 * background.c — the background thread of one process set on one rank.
 *
 * DESIGN
 *
 * Threads. The training threads only enqueue (queue.c) and wait on handles
 * (handles.c). Every process set a rank belongs to has one background
 * thread on that rank (the global set included), which does everything
 * else for that set: its backend context is only ever called from that
 * thread, in the same order on every member, and sets never wait for each
 * other.
 *
 * The cycle. The thread takes what was enqueued since the last cycle, runs
 * one negotiation round with the other members (negotiate.c), which yields
 * the plan: the tensors now ready on every rank, in an order all ranks
 * share. It executes the plan (execute.c): splits its allreduces into
 * fusion batches (fusion.c), reduces each batch with one backend call,
 * runs the other collectives one by one, and completes the handles.
 * kolo__background_main is that cycle as a list of its steps: take_work
 * (sleeping: below), wake_peers, negotiate_round, execute_plan, tune (the
 * autotuner, autotune.c) and pace (the next sleep); a failure on the way
 * stops the set (stop_failed), and so does a round in which a member asked
 * to shut down, after its plan ran (stop_agreed: "Stopping", below).
 *
 * Sleeping. Negotiation is a collective: every member must join every
 * round. After a round that completed something, every rank starts the
 * next round at once (they all know it: the plan is the same everywhere).
 * Otherwise every rank sleeps on the queue's condition variable until
 *  - new work or a shutdown request on this rank: it starts the coming
 *    round, so no timer sits on the path of a tensor. If the last round
 *    made no progress while some rank had tensors waiting (the round's
 *    vector says so), those ranks are asleep waiting for others: it first
 *    sends every peer a wake token for the round (ops.h). After a round
 *    that made progress, ranks with tensors waiting go straight into the
 *    next round (blocking in it), so no token is needed to reach them;
 *  - a peer's token for the coming round: it joins;
 *  - a timer (KOLO_CYCLE_TIME, doubling for each round that finds nothing
 *    to do anywhere, up to SLEEP_MAX_US): it sends tokens and runs a round,
 *    which keeps failure detection and shutdown going in a quiet job.
 * An idle job thus costs one wake-up a second per rank and set. While a
 * round waits for slower ranks, the thread is blocked inside the backend
 * (in the kernel), never spinning. While CUDA batches are in flight (they
 * complete their handles once queued: inflight.c) the thread also watches
 * them after every round and sleeps at most WATCH_US, so that a failure
 * on the device is seen within that time: the rank then stops the set as
 * if shut down (its reason in the queue's close error), so every member
 * stops in the next round.
 *
 * Stopping. The first rank to shut down sets its bit in the round's vector;
 * every member sees it in the same round, completes that round's plan,
 * fails everything still pending with a message naming that rank, closes
 * its queue (later enqueues fail with the same message) and leaves the
 * loop. A backend failure does the same with the backend's message. The
 * loop then returns with the reason in ps->stopped: when the global set
 * stops, pset.c asks every other set on the rank to stop with it; their
 * members do the same, so each set still stops in one shared round.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "background.h"
#include "complete.h"
#include "execute.h"
#include "flight.h"
#include "negotiate.h"
#include "peers.h"
#include "reduce.h"
#include "watchdog.h"

#define SLEEP_MAX_US 1000000 /* longest sleep between rounds */
#define WATCH_US 100000      /* ... while device batches are in flight */
#define STOP_GRACE_S 2.0     /* how long a set stopped by a failure gives
                                the device to finish what is in flight */

/* Watches the device batches in flight (inflight.c). */
static int watch_device(kolo__pset_t *ps, kolo__err_t *err)
{
    if (ps->exec.inflight.head == NULL && ps->exec.inflight.timed == NULL)
        return KOLO_OK;
    return kolo__inflight_watch(&ps->exec.inflight, kolo__ops_device(),
                                ps->exec.dev_ctx, ps->rt->rank,
                                ps->rt->cfg.timeout_s, err);
}

/* When the set stops, what the device still has in flight either finishes
 * (a shutdown: every rank queued the same work) or fails, so that a handle
 * waited afterwards says which. After a failure the peers may never do
 * their part: the device gets STOP_GRACE_S at most. */
static void drain_device(kolo__pset_t *ps, const kolo__err_t *why)
{
    double limit = ps->rt->cfg.timeout_s;
    kolo__err_t err;

    if (ps->exec.inflight.head == NULL && ps->exec.inflight.timed == NULL)
        return;
    if (why->code != KOLO_ERR_SHUTDOWN && limit > STOP_GRACE_S)
        limit = STOP_GRACE_S;
    if (kolo__inflight_drain(&ps->exec.inflight, kolo__ops_device(),
                             ps->exec.dev_ctx, ps->rt->rank, limit,
                             &err) != KOLO_OK)
        kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
}

/* Ends this rank's part in the set: no more enqueues, everything pending
 * fails with `why`. `own`: this rank's own shutdown stops it. The flight
 * recorder keeps the set's last state, and dumps when the stop is an
 * error here: not a shutdown (its cause, first), or another rank's
 * shutdown that failed work of this rank. */
static void stop_all(kolo__pset_t *ps, const kolo__err_t *cause, int own)
{
    kolo__err_t mapped = *cause, *why = &mapped;
    uint64_t completed = ps->completed;
    int shutdown;
    kolo__entry_t *e;

    /* An elastic job re-forms after a loss: what fails says so. */
    mapped.code = kolo__elastic_status(ps->rt, cause->code);
    /* The cause first: what fails with it comes after. */
    if (cause->code != KOLO_ERR_SHUTDOWN)
        kolo__flight_dump_error(ps->rt, cause);

    kolo__queue_close(&ps->queue, why);
    drain_device(ps, why);
    e = kolo__queue_take(&ps->queue, 0, &shutdown);
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        kolo__fail_entry(ps, e, why);
        e = next;
    }
    for (size_t i = 0; i < ps->nready; i++)
        if (ps->ready[i] != NULL)
            kolo__fail_entry(ps, ps->ready[i], why);
    ps->nready = 0;
    kolo__negotiate_drain(ps, kolo__fail_entry, why);
    ps->stopped = *why;
    kolo__flight_set_stopped(ps, cause, cause->code == KOLO_ERR_SHUTDOWN &&
                                            !own && ps->completed != completed);
}

/* The reason a set stops when a rank asked to shut down, or the reason the
 * runtime gave when it closed the queue (the global set stopped); 1 when
 * it is this rank's own shutdown. */
static int stop_reason(kolo__pset_t *ps, int stop_rank, kolo__err_t *err)
{
    int gstop = ps->ranks[stop_rank];

    pthread_mutex_lock(&ps->queue.mu);
    if (ps->queue.closed) {
        *err = ps->queue.close_err;
        pthread_mutex_unlock(&ps->queue.mu);
        return 0;
    }
    pthread_mutex_unlock(&ps->queue.mu);
    if (gstop == ps->rt->rank) {
        kolo__err_set(err, KOLO_ERR_SHUTDOWN,
                      "kolo was shut down on this rank (rank %d)", gstop);
        return 1;
    }
    if (ps->id == KOLO_GLOBAL_PROCESS_SET) {
        /* In an elastic job a rank that leaves changes the membership.
         * A rank that stopped after a failure of its own said which
         * (peers.h). */
        char prefix[32], why[KOLO__ERR_LEN / 2];
        snprintf(prefix, sizeof(prefix), "kolo%u", ps->rt->generation);
        int told = kolo__peers_why(&ps->rt->cfg, prefix, gstop, why, sizeof(why));
        kolo__err_set(err, ps->rt->cfg.elastic ? KOLO_ERR_MEMBERSHIP
                                               : KOLO_ERR_SHUTDOWN,
                      "rank %d has shut down, which stops the job%s%s%s",
                      gstop, told ? " (it " : "", told ? why : "",
                      told ? ")" : "");
    }
    else
        kolo__err_set(err, KOLO_ERR_SHUTDOWN,
                      "process set %d was removed or stopped (by rank %d)",
                      ps->id, gstop);
    return 0;
}

/* Counts a round that did work; at the end of a window, agrees on the
 * slowest rank's busy time and lets the autotuner decide (autotune.c). */
static int autotune_round(kolo__pset_t *ps, int64_t bytes, int64_t busy_us,
                          kolo__err_t *err)
{
    kolo__tune_row_t row;
    double busy;
    char detail[KOLO__ERR_LEN];
    int rc;

    if (!kolo__autotune_round(ps->tune, bytes, busy_us))
        return KOLO_OK;
    busy = kolo__autotune_busy_s(ps->tune);
    rc = ps->ctl_ops->allreduce(ps->ctl_ctx, NULL, &busy, 1, sizeof(busy),
                                kolo__reduce_get(KOLO_FLOAT64, KOLO_OP_MAX),
                                detail, sizeof(detail));
    if (rc != KOLO_OK) {
        return kolo__fail_backend(ps, rc, detail, err,
                                  "autotune's agreement on a window's time");
    }
    kolo__autotune_window(ps->tune, busy, &row);
    if (kolo__autotune_settled(ps->tune) && ps->rank == 0)
        kolo__log(KOLO__LOG_INFO, "autotune of process set %d settled after "
                  "%lld windows: fusion threshold %lld bytes, chunk %lld "
                  "bytes, cycle time %g ms", ps->id, (long long)row.window + 1,
                  (long long)ps->tune->cur.fusion_threshold,
                  (long long)ps->tune->cur.chunk_bytes, ps->tune->cur.cycle_ms);
    if (ps->tune_log != NULL && kolo__autotune_settled(ps->tune)) {
        /* The last row: what stays. */
        row.parameter = "settled";
        row.params = ps->tune->cur;
    }
    if (ps->tune_log != NULL) {
        fprintf(ps->tune_log, "%lld,%s,%lld,%lld,%g,%lld,%.6f,%.6g,%s\n",
                (long long)row.window, row.parameter,
                (long long)row.params.fusion_threshold,
                (long long)row.params.chunk_bytes, row.params.cycle_ms,
                (long long)row.bytes, row.busy_s, row.score,
                row.warmup ? "warmup" : kolo__autotune_settled(ps->tune)
                                            ? "settled" : "sample");
        if (fflush(ps->tune_log) != 0) {
            kolo__log(KOLO__LOG_WARNING, "KOLO_AUTOTUNE_LOG=%s: write failed "
                      "(%s); the log stops here, tuning goes on",
                      ps->rt->cfg.autotune_log, strerror(errno));
            fclose(ps->tune_log);
            ps->tune_log = NULL;
        }
    }
    return KOLO_OK;
}

/* What the loop carries from one cycle to the next, and what one cycle
 * measures on its way. */
typedef struct cycle {
    int64_t sleep_start;   /* the first sleep after a busy round */
    int64_t sleep_us;      /* the next idle sleep (see the essay) */
    int progressed;        /* the last round completed something */
    int64_t timeout;       /* this cycle's wait for work */
    int64_t t0, t1, t2;    /* before the wait, after it, after negotiating */
    uint64_t done_before;  /* ps->completed before the round */
    int64_t bytes_before;  /* ps->bytes_done before the round */
    kolo__entry_t *fresh;  /* taken from the queue, not yet negotiated */
    int shutdown;          /* this rank asks to shut down */
    int stop_rank;         /* the round's lowest rank that stops, or -1 */
    kolo__wake_reason_t reason;
} cycle_t;

/* The shortest sleep: the cycle time (which the autotuner may move), at
 * least 1 ms. */
static int64_t sleep_start_us(kolo__pset_t *ps)
{
    int64_t cycle_us = (int64_t)(kolo__tuned(ps)->cycle_ms * 1000.0);
    return cycle_us > 1000 ? cycle_us : 1000;
}

/* Sleeps until there is work, a peer's token or the timer (see the essay),
 * and takes what was enqueued. */
static void take_work(kolo__pset_t *ps, cycle_t *c)
{
    int pending = kolo__negotiate_pending(ps);

    c->timeout = pending && c->progressed ? 0 : c->sleep_us;
    if ((ps->exec.inflight.head != NULL || ps->exec.inflight.timed != NULL) &&
        c->timeout > WATCH_US)
        c->timeout = WATCH_US;
    c->t0 = kolo__now_us();
    c->fresh = kolo__queue_take_round(&ps->queue, c->timeout,
                                      (uint64_t)ps->cycles, &c->shutdown,
                                      &c->reason);
    c->t1 = kolo__now_us();
}

/* Peers may be asleep waiting: asks them to join the round (see the
 * essay), unless a peer's token woke this rank or nobody waits. */
static int wake_peers(kolo__pset_t *ps, const cycle_t *c, kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN];
    int rc;

    if (c->timeout <= 0 || c->reason == KOLO__WOKE_PEER ||
        (c->reason == KOLO__WOKE_WORK && !ps->others_waiting))
        return KOLO_OK;
    rc = ps->ctl_ops->wake_peers(ps->ctl_ctx, (uint64_t)ps->cycles, detail,
                                 sizeof(detail));
    if (rc != KOLO_OK)
        return kolo__fail_backend(ps, rc, detail, err,
                                  "wake-up of the other ranks");
    return KOLO_OK;
}

/* One negotiation round (negotiate.c), which yields the plan; the entries
 * taken are the round's from here on. */
static int negotiate_round(kolo__pset_t *ps, cycle_t *c, kolo__err_t *err)
{
    kolo__entry_t *fresh = c->fresh;
    int rc;

    c->fresh = NULL;
    c->done_before = ps->completed;
    c->bytes_before = ps->bytes_done;
    kolo__watchdog_enter(ps, "a negotiation round");
    rc = kolo__negotiate(ps, fresh, c->shutdown, &c->stop_rank, err);
    kolo__watchdog_enter(ps, NULL);
    atomic_store_explicit(&ps->flight.rounds, ps->cycles, memory_order_relaxed);
    if (rc == KOLO_OK)
        c->t2 = kolo__now_us();
    return rc;
}

/* Executes the plan (execute.c), then watches the device batches in
 * flight. */
static int execute_plan(kolo__pset_t *ps, kolo__err_t *err)
{
    int rc;

    if (ps->nready > 0)
        kolo__watchdog_enter(ps, "a collective");
    rc = kolo__execute(ps, err);
    kolo__watchdog_enter(ps, NULL);
    if (rc == KOLO_OK && watch_device(ps, err) != KOLO_OK) {
        /* The device failed, the controller did not: later enqueues
         * fail with the reason, and the next round tells the other
         * members that this rank stops, so they stop with it. */
        kolo__log(KOLO__LOG_ERROR, "%s", err->msg);
        kolo__queue_close(&ps->queue, err);
        kolo__queue_request_shutdown(&ps->queue);
    }
    return rc;
}

/* A round that completed something counts for the autotuner. */
static int tune(kolo__pset_t *ps, cycle_t *c, kolo__err_t *err)
{
    c->progressed = ps->completed != c->done_before;
    if (c->progressed && ps->tune != NULL)
        return autotune_round(ps, ps->bytes_done - c->bytes_before,
                              kolo__now_us() - c->t1, err);
    return KOLO_OK;
}

/* Sets the next sleep. It grows while rounds find nothing to do anywhere.
 * Both inputs are the same on every rank, so all ranks back off alike and
 * a token from one does not reset the others. */
static void pace(kolo__pset_t *ps, cycle_t *c)
{
    if (ps->tune != NULL) /* the autotuner may have moved it */
        c->sleep_start = sleep_start_us(ps);
    ps->others_waiting = !c->progressed && ps->neg.any_pending;
    if (c->progressed || ps->neg.any_pending)
        c->sleep_us = c->sleep_start;
    else
        c->sleep_us = c->sleep_us * 2 < SLEEP_MAX_US ? c->sleep_us * 2
                                                    : SLEEP_MAX_US;
}

static void trace_cycle(kolo__pset_t *ps, const cycle_t *c)
{
    kolo__trace("set %d round %lld: slept %lld us (timeout %lld), "
                "negotiated in %lld us, executed in %lld us, %llu "
                "completed, %s pending",
                ps->id, (long long)ps->cycles, (long long)(c->t1 - c->t0),
                (long long)c->timeout, (long long)(c->t2 - c->t1),
                (long long)(kolo__now_us() - c->t2),
                (unsigned long long)(ps->completed - c->done_before),
                kolo__negotiate_pending(ps) ? "some" : "none");
}

/* Stopping on a failure this rank met: what this cycle took and did not
 * hand on fails with everything pending. */
static int stop_failed(kolo__pset_t *ps, cycle_t *c, const kolo__err_t *err)
{
    kolo__log(KOLO__LOG_ERROR, "%s", err->msg);
    while (c->fresh != NULL) {
        kolo__entry_t *next = c->fresh->next;
        kolo__fail_entry(ps, c->fresh, err);
        c->fresh = next;
    }
    stop_all(ps, err, 0);
    return 1;
}

/* Stopping because a member asked to shut down (or the set was stopped):
 * every member does so after the same round. */
static int stop_agreed(kolo__pset_t *ps, int stop_rank)
{
    kolo__err_t err;
    int own = stop_reason(ps, stop_rank, &err);

    if (kolo__negotiate_pending(ps))
        kolo__log(KOLO__LOG_WARNING, "%s; tensors still pending on "
                  "this rank fail", err.msg);
    stop_all(ps, &err, own);
    return 0;
}

int kolo__background_main(kolo__pset_t *ps)
{
    cycle_t c;
    kolo__err_t err;

    memset(&c, 0, sizeof(c));
    c.sleep_start = c.sleep_us = sleep_start_us(ps);
    for (;;) {
        take_work(ps, &c);
        kolo__err_clear(&err);
        if (wake_peers(ps, &c, &err) != KOLO_OK ||
            negotiate_round(ps, &c, &err) != KOLO_OK ||
            execute_plan(ps, &err) != KOLO_OK || tune(ps, &c, &err) != KOLO_OK)
            return stop_failed(ps, &c, &err);
        pace(ps, &c);
        trace_cycle(ps, &c);
        if (c.stop_rank >= 0)
            return stop_agreed(ps, c.stop_rank);
    }
}
