/*
 * background.c — the background thread of one rank.
 *
 * DESIGN
 *
 * Threads. The training threads only enqueue (queue.c) and wait on handles
 * (handles.c). One background thread per rank does everything else, so the
 * backend is only ever called from one thread, in the same order on every
 * rank.
 *
 * The cycle. The thread takes what was enqueued since the last cycle, runs
 * one negotiation round with the other ranks (negotiate.c), which yields
 * the plan: the tensors now ready on every rank, in an order all ranks
 * share. It splits the plan into fusion batches (fusion.c), reduces each
 * batch with one backend call and completes the handles.
 *
 * Sleeping. Negotiation is a collective: every rank must join every round.
 * After a round that completed something, every rank starts the next round
 * at once (they all know it: the plan is the same everywhere). Otherwise
 * every rank sleeps on the queue's condition variable until
 *  - new work or a shutdown request on this rank: it starts the coming
 *    round, so no timer sits on the path of a tensor. If the last round
 *    made no progress while some rank had tensors waiting (the round's
 *    vector says so), those ranks are asleep waiting for others: it first
 *    sends every peer a wake token for the round (ops.h). After a round
 *    that made progress, ranks with tensors waiting go straight into the
 *    next round (blocking in it), so no token is needed to reach them;
 *  - a peer's token for the coming round: it joins;
 *  - a timer (KOLO_CYCLE_TIME, doubling for each round that finds nothing
 *    to do, up to SLEEP_MAX_US): it sends tokens and runs a round, which
 *    keeps failure detection and shutdown going in a quiet job.
 * An idle job thus costs one wake-up a second per rank. While a round waits
 * for slower ranks, the thread is blocked inside the backend (in the
 * kernel), never spinning.
 *
 * Stopping. The first rank to shut down sets its bit in the round's vector;
 * every rank sees it in the same round, completes that round's plan, fails
 * everything still pending with a message naming that rank, closes its
 * queue (later enqueues fail with the same message) and leaves the loop. A
 * backend failure does the same with the backend's message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion.h"
#include "reduce.h"
#include "runtime.h"

#define SLEEP_MAX_US 1000000 /* longest sleep between rounds */
#define FUSION_ALIGN 64

void kolo__complete(kolo__runtime_t *rt, kolo__entry_t *e, int status,
                    const char *msg)
{
    /* The name is released before the handle completes, so that a training
     * thread returning from kolo_wait can enqueue the same name again. */
    kolo__queue_release(&rt->queue, e->name);
    kolo__handles_complete(rt->handles, e->handle, status, msg);
    kolo__entry_free(e);
    rt->completed++;
}

/* Completes an entry that will never run, with a sentence naming it. */
static void fail_entry(kolo__runtime_t *rt, kolo__entry_t *e,
                       const kolo__err_t *why)
{
    char msg[KOLO__ERR_LEN + KOLO_MAX_NAME_LEN + 64];
    snprintf(msg, sizeof(msg), "%s of tensor '%s' did not complete: %s",
             kolo__coll_name(e->params.coll), e->name, why->msg);
    kolo__complete(rt, e, why->code, msg);
}

/* Ends this rank's part in the job: no more enqueues, everything pending
 * fails with `why`. */
static void stop_all(kolo__runtime_t *rt, size_t first_ready,
                     const kolo__err_t *why)
{
    int shutdown;
    kolo__entry_t *e;

    kolo__queue_close(&rt->queue, why);
    e = kolo__queue_take(&rt->queue, 0, &shutdown);
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        fail_entry(rt, e, why);
        e = next;
    }
    for (size_t i = first_ready; i < rt->nready; i++)
        fail_entry(rt, rt->ready[i], why);
    rt->nready = 0;
    kolo__negotiate_drain(rt, fail_entry, why);
}

/* ---- execution ------------------------------------------------------------ */

static int fusion_reserve(kolo__runtime_t *rt, size_t bytes)
{
    size_t cap;
    uint8_t *buf;

    if (rt->fusion_cap >= bytes)
        return 0;
    cap = (bytes + FUSION_ALIGN - 1) / FUSION_ALIGN * FUSION_ALIGN;
    buf = aligned_alloc(FUSION_ALIGN, cap);
    if (buf == NULL)
        return -1;
    /* Touch every page now, so that reductions never fault pages in. */
    memset(buf, 0, cap);
    free(rt->fusion);
    rt->fusion = buf;
    rt->fusion_cap = cap;
    return 0;
}

/* Reduces the batch rt->ready[order[first..first+n)] with one backend
 * call. On failure, err says which tensors and why. */
static int run_batch(kolo__runtime_t *rt, const size_t *idx, size_t n,
                     int64_t bytes, kolo__err_t *err)
{
    kolo__entry_t *e0 = rt->ready[idx[0]];
    kolo_dtype_t dtype = (kolo_dtype_t)e0->params.dtype;
    kolo_op_t op = (kolo_op_t)e0->params.op;
    size_t esize = kolo_dtype_size(dtype);
    kolo__reduce_fn fn = kolo__reduce_get(dtype, op);
    char detail[KOLO__ERR_LEN];
    const void *in;
    void *out;
    size_t count;
    int rc;

    if (bytes == 0)
        return KOLO_OK;
    if (n == 1) {
        /* Alone: reduce straight from the user's buffers, no copy. */
        in = e0->input == e0->output ? NULL : e0->input;
        out = e0->output;
        count = (size_t)e0->params.count;
    } else {
        size_t off = 0;
        if (fusion_reserve(rt, (size_t)bytes) != 0)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "rank %d: out of memory for a fusion buffer "
                                 "of %lld bytes",
                                 rt->rank, (long long)bytes);
        for (size_t i = 0; i < n; i++) {
            kolo__entry_t *e = rt->ready[idx[i]];
            size_t b = (size_t)e->params.count * esize;
            memcpy(rt->fusion + off, e->input, b);
            off += b;
        }
        in = NULL;
        out = rt->fusion;
        count = (size_t)bytes / esize;
    }

    rc = rt->ops->allreduce(rt->ops_ctx, in, out, count, esize, fn, detail,
                            sizeof(detail));
    if (rc != KOLO_OK) {
        if (n == 1)
            return kolo__err_set(err, rc,
                                 "rank %d: allreduce of tensor '%s' (%lld %s) "
                                 "failed: %s",
                                 rt->rank, e0->name, (long long)count,
                                 kolo_dtype_name(dtype), detail);
        return kolo__err_set(err, rc,
                             "rank %d: allreduce of tensor '%s' fused with %zu "
                             "others (%lld bytes of %s) failed: %s",
                             rt->rank, e0->name, n - 1, (long long)bytes,
                             kolo_dtype_name(dtype), detail);
    }
    if (op == KOLO_OP_AVERAGE)
        kolo__average(out, count, dtype, rt->size);
    if (n > 1) {
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            kolo__entry_t *e = rt->ready[idx[i]];
            size_t b = (size_t)e->params.count * esize;
            memcpy(e->output, rt->fusion + off, b);
            off += b;
        }
    }
    return KOLO_OK;
}

/* Executes the plan in rt->ready; completes every entry of it. */
static int execute(kolo__runtime_t *rt, kolo__err_t *err)
{
    size_t n = rt->nready;
    kolo__fusion_item_t *items;
    size_t *order;
    kolo__batch_t *batches;
    long nb;
    int rc = KOLO_OK;

    if (n == 0)
        return KOLO_OK;
    items = malloc(n * sizeof(*items));
    order = malloc(n * sizeof(*order));
    batches = malloc(n * sizeof(*batches));
    if (items == NULL || order == NULL || batches == NULL) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "rank %d: out of memory planning %zu tensors",
                           rt->rank, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const kolo__params_t *p = &rt->ready[i]->params;
        items[i].key = (uint32_t)p->coll << 16 | (uint32_t)p->dtype << 8 | p->op;
        items[i].bytes = p->count * (int64_t)kolo_dtype_size((kolo_dtype_t)p->dtype);
    }
    nb = kolo__fusion_plan(items, n, rt->cfg.fusion_threshold, order, batches);
    if (nb < 0) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "rank %d: out of memory planning %zu tensors",
                           rt->rank, n);
        goto out;
    }
    for (long b = 0; b < nb; b++) {
        const size_t *idx = order + batches[b].first;
        rc = run_batch(rt, idx, batches[b].n, batches[b].bytes, err);
        for (size_t i = 0; i < batches[b].n; i++) {
            kolo__entry_t *e = rt->ready[idx[i]];
            rt->ready[idx[i]] = NULL;
            if (rc == KOLO_OK)
                kolo__complete(rt, e, KOLO_OK, NULL);
            else
                fail_entry(rt, e, err);
        }
        if (rc != KOLO_OK)
            break;
    }
out:
    /* After a failure, what is left of the plan fails with it: the backend
     * is broken or memory ran out. */
    for (size_t i = 0; rc != KOLO_OK && i < n; i++)
        if (rt->ready[i] != NULL)
            fail_entry(rt, rt->ready[i], err);
    rt->nready = 0;
    free(items);
    free(order);
    free(batches);
    return rc;
}

/* ---- the loop ------------------------------------------------------------- */

void *kolo__background_main(void *arg)
{
    kolo__runtime_t *rt = arg;
    int64_t cycle_us = (int64_t)(rt->cfg.cycle_time_ms * 1000.0);
    int64_t sleep_start = cycle_us > 1000 ? cycle_us : 1000;
    int64_t sleep_us = sleep_start;
    int progressed = 0;
    kolo__err_t err;

    for (;;) {
        int pending = kolo__negotiate_pending(rt), shutdown, stop_rank, rc;
        int64_t timeout = pending && progressed ? 0 : sleep_us;
        kolo__wake_reason_t reason;
        size_t done_before;
        int64_t t0 = kolo__now_us();
        kolo__entry_t *fresh = kolo__queue_take_round(
            &rt->queue, timeout, (uint64_t)rt->cycles, &shutdown, &reason);
        int64_t t1 = kolo__now_us();
        char detail[KOLO__ERR_LEN];

        kolo__err_clear(&err);
        /* Peers may be asleep waiting: ask them to join (see the essay). */
        if (timeout > 0 && reason != KOLO__WOKE_PEER &&
            (reason != KOLO__WOKE_WORK || rt->others_waiting) &&
            (rc = rt->ops->wake_peers(rt->ops_ctx, (uint64_t)rt->cycles, detail,
                                      sizeof(detail))) != KOLO_OK) {
            kolo__err_set(&err, rc, "rank %d: cannot wake the other ranks: %s",
                          rt->rank, detail);
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            while (fresh != NULL) {
                kolo__entry_t *next = fresh->next;
                fail_entry(rt, fresh, &err);
                fresh = next;
            }
            stop_all(rt, 0, &err);
            break;
        }

        done_before = (size_t)rt->completed;
        if (kolo__negotiate(rt, fresh, shutdown, &stop_rank, &err) != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            stop_all(rt, 0, &err);
            break;
        }
        int64_t t2 = kolo__now_us();
        if (execute(rt, &err) != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            stop_all(rt, 0, &err);
            break;
        }
        progressed = (size_t)rt->completed != done_before;
        rt->others_waiting = !progressed && rt->any_pending;
        /* The sleep grows while rounds find nothing to do anywhere. Both
         * inputs are the same on every rank, so all ranks back off alike
         * and a token from one does not reset the others. */
        if (progressed || rt->any_pending)
            sleep_us = sleep_start;
        else
            sleep_us = sleep_us * 2 < SLEEP_MAX_US ? sleep_us * 2 : SLEEP_MAX_US;
        kolo__trace("round %lld: slept %lld us (timeout %lld), negotiated in "
                    "%lld us, executed in %lld us, %zu completed, %s pending",
                    (long long)rt->cycles, (long long)(t1 - t0), (long long)timeout,
                    (long long)(t2 - t1), (long long)(kolo__now_us() - t2),
                    (size_t)rt->completed - done_before,
                    kolo__negotiate_pending(rt) ? "some" : "none");
        if (stop_rank >= 0) {
            if (stop_rank == rt->rank)
                kolo__err_set(&err, KOLO_ERR_SHUTDOWN,
                              "kolo was shut down on this rank (rank %d)",
                              rt->rank);
            else
                kolo__err_set(&err, KOLO_ERR_SHUTDOWN,
                              "rank %d has shut down, which stops the job",
                              stop_rank);
            if (kolo__negotiate_pending(rt))
                kolo__log(KOLO__LOG_WARNING, "%s; tensors still pending on "
                          "this rank fail", err.msg);
            stop_all(rt, 0, &err);
            break;
        }
    }
    return NULL;
}

int kolo__runtime_start(kolo__runtime_t *rt, kolo__err_t *err)
{
    if (kolo__negotiate_init(rt) != 0) {
        kolo__negotiate_free(rt);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory for a response cache of %lld "
                             "entries (KOLO_CACHE_CAPACITY)",
                             (long long)rt->cfg.cache_capacity);
    }
    if (pthread_create(&rt->thread, NULL, kolo__background_main, rt) != 0) {
        kolo__negotiate_free(rt);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot start the background thread");
    }
    rt->thread_started = 1;
    return KOLO_OK;
}

void kolo__wake_from_peer(void *arg, uint64_t round)
{
    kolo__runtime_t *rt = arg;
    kolo__queue_peer_wake(&rt->queue, round);
}

void kolo__runtime_free(kolo__runtime_t *rt)
{
    kolo__negotiate_free(rt);
    free(rt->fusion);
    rt->fusion = NULL;
    rt->fusion_cap = 0;
}
