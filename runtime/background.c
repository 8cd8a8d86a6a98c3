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
 * share. It splits the allreduces of the plan into fusion batches
 * (fusion.c), reduces each batch with one backend call, runs the other
 * collectives one by one, and completes the handles.
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
 * (in the kernel), never spinning.
 *
 * Stopping. The first rank to shut down sets its bit in the round's vector;
 * every member sees it in the same round, completes that round's plan,
 * fails everything still pending with a message naming that rank, closes
 * its queue (later enqueues fail with the same message) and leaves the
 * loop. A backend failure does the same with the backend's message. When
 * the global set stops, it asks every other set on the rank to stop with
 * the same reason; their members do the same, so each set still stops in
 * one shared round.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "fusion.h"
#include "half.h"
#include "peers.h"
#include "reduce.h"
#include "gpu.h"
#include "runtime.h"
#include "timeline.h"
#include "watchdog.h"

#define SLEEP_MAX_US 1000000 /* longest sleep between rounds */
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
static const char *const *phase_names(const char *backend)
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

static const char *backend_phase(const kolo__pset_t *ps, int coll)
{
    if (coll < 0 || coll >= KOLO__COLL_COUNT_ || ps->phase == NULL)
        return "BACKEND";
    return ps->phase[coll];
}

/* The settings in force: the autotuner's while it runs, else the
 * configuration's. */
static const kolo__tune_params_t *tuned(const kolo__pset_t *ps)
{
    return ps->tune != NULL ? &ps->tune->cur : &ps->tune_fixed;
}

/* Every entry of a batch enters or leaves a phase. */
static void tl_batch(kolo__pset_t *ps, const size_t *idx, size_t n,
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

void kolo__complete(kolo__pset_t *ps, kolo__entry_t *e, int status,
                    const char *msg)
{
    while (e->tl_depth > 0)
        kolo__tl_entry_end(ps, e);
    if (e->handle > 0) {
        /* The name is released before the handle completes, so that a
         * training thread returning from kolo_wait can enqueue the same
         * name again. */
        kolo__queue_release(&ps->queue, e->name);
        kolo__handles_complete_output(ps->rt->handles, e->handle, status, msg,
                                      status == KOLO_OK ? e->result : NULL,
                                      kolo__result_free);
        if (status == KOLO_OK)
            e->result = NULL;
    }
    if (status == KOLO_OK)
        ps->bytes_done += e->params.count *
                          (int64_t)kolo_dtype_size((kolo_dtype_t)e->params.wire);
    kolo__entry_free(e);
    ps->completed++;
}

/* Completes an entry that will never run, with a sentence naming it. */
static void fail_entry(kolo__pset_t *ps, kolo__entry_t *e,
                       const kolo__err_t *why)
{
    char msg[KOLO__ERR_LEN + KOLO_MAX_NAME_LEN + 64];
    if (strstr(why->msg, e->name) != NULL)
        snprintf(msg, sizeof(msg), "%s", why->msg);
    else
        snprintf(msg, sizeof(msg), "%s of tensor '%s' did not complete: %s",
                 kolo__coll_name(e->params.coll), e->name, why->msg);
    kolo__complete(ps, e, why->code, msg);
}

/* Ends this rank's part in the set: no more enqueues, everything pending
 * fails with `why`. */
static void stop_all(kolo__pset_t *ps, const kolo__err_t *why)
{
    int shutdown;
    kolo__entry_t *e;

    kolo__queue_close(&ps->queue, why);
    e = kolo__queue_take(&ps->queue, 0, &shutdown);
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        fail_entry(ps, e, why);
        e = next;
    }
    for (size_t i = 0; i < ps->nready; i++)
        if (ps->ready[i] != NULL)
            fail_entry(ps, ps->ready[i], why);
    ps->nready = 0;
    kolo__negotiate_drain(ps, fail_entry, why);
    if (ps->id == KOLO_GLOBAL_PROCESS_SET) {
        kolo__runtime_t *rt = ps->rt;
        pthread_mutex_lock(&rt->sets_mu);
        for (int i = 1; i < rt->nsets; i++)
            if (rt->sets[i] != NULL)
                kolo__pset_request_stop(rt->sets[i], why);
        pthread_mutex_unlock(&rt->sets_mu);
    }
}

/* ---- execution ------------------------------------------------------------ */

static int fusion_reserve(kolo__pset_t *ps, size_t bytes)
{
    size_t cap;
    uint8_t *buf;

    if (ps->fusion_cap >= bytes)
        return 0;
    cap = (bytes + FUSION_ALIGN - 1) / FUSION_ALIGN * FUSION_ALIGN;
    buf = aligned_alloc(FUSION_ALIGN, cap);
    if (buf == NULL)
        return -1;
    /* Touch every page now, so that reductions never fault pages in. */
    memset(buf, 0, cap);
    free(ps->fusion);
    ps->fusion = buf;
    ps->fusion_cap = cap;
    return 0;
}

int kolo__explain_failure(kolo__pset_t *ps, int rc, char *detail, size_t len)
{
    char lost[512], prefix[32], copy[KOLO__ERR_LEN];

    if (rc != KOLO_ERR_RANK_LOST && rc != KOLO_ERR_BACKEND && rc != KOLO_ERR_TIMEOUT)
        return rc;
    snprintf(prefix, sizeof(prefix), "kolo%u", ps->rt->generation);
    /* A peer's sockets close while its process is still being torn down:
     * give it a moment to be gone before deciding nobody died. */
    for (int tries = 0; tries < 10; tries++) {
        if (kolo__peers_lost(&ps->rt->cfg, prefix, ps->ranks, ps->size, lost,
                             sizeof(lost)) > 0) {
            snprintf(copy, sizeof(copy), "%s", detail);
            snprintf(detail, len, "lost %s (%s)", lost, copy);
            return KOLO_ERR_RANK_LOST;
        }
        if (rc == KOLO_ERR_TIMEOUT)
            break;
        usleep(20000);
    }
    return rc;
}

static int backend_error(kolo__pset_t *ps, int rc, const kolo__entry_t *e,
                         size_t nfused, char *detail, kolo__err_t *err)
{
    rc = kolo__explain_failure(ps, rc, detail, KOLO__ERR_LEN);
    if (nfused > 1)
        return kolo__err_set(err, rc,
                             "rank %d: %s of tensor '%s' fused with %zu others "
                             "failed: %s",
                             ps->rank, kolo__coll_name(e->params.coll), e->name,
                             nfused - 1, detail);
    return kolo__err_set(err, rc, "rank %d: %s of tensor '%s' (%lld %s) failed: %s",
                         ps->rank, kolo__coll_name(e->params.coll), e->name,
                         (long long)e->params.count,
                         kolo_dtype_name((kolo_dtype_t)e->params.dtype), detail);
}

static int no_memory(kolo__pset_t *ps, const kolo__entry_t *e, size_t bytes,
                     kolo__err_t *err)
{
    return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                         "rank %d: out of memory (%zu bytes) for %s of tensor "
                         "'%s'",
                         ps->rank, bytes, kolo__coll_name(e->params.coll),
                         e->name);
}

/* Copies n elements of a tensor, from element `at`, into a buffer of the
 * wire dtype (compressing float32 to float16/bfloat16), or back. */
static void pack(void *dst, const kolo__entry_t *e, size_t at, size_t n)
{
    size_t esize = kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    const uint8_t *src = (const uint8_t *)e->input + at * esize;
    if (e->params.wire == KOLO_FLOAT16 && e->params.dtype == KOLO_FLOAT32)
        kolo__f32_to_f16((const float *)src, dst, n);
    else if (e->params.wire == KOLO_BFLOAT16 && e->params.dtype == KOLO_FLOAT32)
        kolo__f32_to_bf16((const float *)src, dst, n);
    else
        memcpy(dst, src, n * esize);
}

static void unpack(kolo__entry_t *e, size_t at, const void *src, size_t n)
{
    size_t esize = kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    uint8_t *dst = (uint8_t *)e->output + at * esize;
    if (e->params.wire == KOLO_FLOAT16 && e->params.dtype == KOLO_FLOAT32)
        kolo__f16_to_f32(src, (float *)dst, n);
    else if (e->params.wire == KOLO_BFLOAT16 && e->params.dtype == KOLO_FLOAT32)
        kolo__bf16_to_f32(src, (float *)dst, n);
    else
        memcpy(dst, src, n * esize);
}

/* A position in a batch: entry idx[i], element `at` of it. */
typedef struct cursor {
    size_t i, at;
} cursor_t;

/* Moves the next n elements of the batch between the tensors and buf,
 * advancing the cursor: into buf (in = 1) or back out of it (in = 0). */
static void move_range(kolo__pset_t *ps, const size_t *idx, cursor_t *c,
                       uint8_t *buf, size_t n, size_t esize, int in)
{
    while (n > 0) {
        kolo__entry_t *e = ps->ready[idx[c->i]];
        size_t left = (size_t)e->params.count - c->at;
        size_t take = left < n ? left : n;
        if (take > 0) {
            if (in)
                pack(buf, e, c->at, take);
            else
                unpack(e, c->at, buf, take);
            buf += take * esize;
            n -= take;
            c->at += take;
        }
        if (c->at == (size_t)e->params.count) {
            c->i++;
            c->at = 0;
        }
    }
}

/* A streamed allreduce (ops.h) over the batch: the backend asks for the
 * input piece by piece and hands the result back the same way. */
typedef struct stream_state {
    kolo__pset_t *ps;
    const size_t *idx;
    size_t n, esize;
    const kolo__params_t *p;
    kolo_dtype_t wire;
    cursor_t in, out;
    size_t in_pos; /* the batch element `in` points at */
} stream_state_t;

/* Moves the input cursor forward to batch element `at`, past tensors
 * with no elements left. */
static void seek_in(stream_state_t *st, size_t at)
{
    while (st->in.i < st->n) {
        size_t count = (size_t)st->ps->ready[st->idx[st->in.i]]->params.count;
        size_t skip = count - st->in.at;
        if (skip > at - st->in_pos)
            skip = at - st->in_pos;
        st->in.at += skip;
        st->in_pos += skip;
        if (st->in.at < count)
            break;
        st->in.i++;
        st->in.at = 0;
    }
}

static void stream_fill(void *arg, void *dst, size_t at, size_t n)
{
    stream_state_t *st = arg;
    seek_in(st, at);
    move_range(st->ps, st->idx, &st->in, dst, n, st->esize, 1);
    st->in_pos += n;
    if (st->p->prescale != 1.0)
        kolo__scale(dst, n, st->wire, st->p->prescale);
}

static const void *stream_view(void *arg, size_t at, size_t n, size_t *run)
{
    stream_state_t *st = arg;
    const kolo__entry_t *e;
    size_t left;

    seek_in(st, at);
    if (st->in.i >= st->n)
        return NULL;
    e = st->ps->ready[st->idx[st->in.i]];
    left = (size_t)e->params.count - st->in.at;
    *run = left < n ? left : n;
    return (const uint8_t *)e->input + st->in.at * st->esize;
}

static void stream_finish(void *arg, void *buf, size_t n)
{
    stream_state_t *st = arg;
    kolo__scale(buf, n, st->wire,
                kolo__postscale_factor(st->p->op, st->p->postscale,
                                       st->ps->size));
}

static void stream_drain(void *arg, const void *src, size_t at, size_t n)
{
    stream_state_t *st = arg;
    (void)at;
    move_range(st->ps, st->idx, &st->out, (uint8_t *)src, n, st->esize, 0);
}

static int run_allreduce_stream(kolo__pset_t *ps, const size_t *idx, size_t n,
                                size_t count, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    stream_state_t st = {ps, idx, n, 0, &e0->params,
                         (kolo_dtype_t)e0->params.wire, {0, 0}, {0, 0}, 0};
    /* Tensors already in the wire dtype and not prescaled can be read
     * where they lie. */
    int viewable = e0->params.wire == e0->params.dtype &&
                   e0->params.prescale == 1.0;
    kolo__ops_stream_t s = {stream_fill, viewable ? stream_view : NULL,
                            stream_finish, stream_drain, &st};
    char detail[KOLO__ERR_LEN];
    int rc;

    st.esize = kolo_dtype_size(st.wire);
    tl_batch(ps, idx, n, backend_phase(ps, KOLO__COLL_ALLREDUCE));
    rc = ps->data_ops->allreduce_stream(
        ps->data_ctx, count, st.esize,
        kolo__reduce_get(st.wire, (kolo_op_t)e0->params.op), &s, detail,
        sizeof(detail));
    tl_batch(ps, idx, n, NULL);
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    return KOLO_OK;
}

/* Allreduces the batch ps->ready[idx[0..n)]: dtype, op, wire dtype and
 * scale factors are the same for all of it.
 *
 * Cache-aware: the batch is reduced in pieces of KOLO_CHUNK_BYTES. Each
 * piece is copied into the fusion buffer, prescaled, reduced, postscaled
 * (AVERAGE's division included), and copied out while it is still in cache, instead of making
 * each of those passes over the whole batch at memory speed
 * (shared/MEASUREMENTS.md: 1-4 MiB pieces reduce 2-4 times faster than one
 * 64 MiB buffer). A tensor alone and uncompressed is reduced from the
 * user's buffers: no copy. It is cut into pieces only when kolo itself
 * passes over the result (a scale factor, or AVERAGE's division), to make
 * that pass in cache; otherwise the backend gets it whole, since every
 * piece would cost a call (over Gloo, 64-256 MiB tensors in 4 MiB pieces
 * reached 0.72-0.84 of the backend's own speed, whole 0.97-1.01). */
static int run_allreduce(kolo__pset_t *ps, const size_t *idx, size_t n,
                         kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    const kolo__params_t *p = &e0->params;
    kolo_dtype_t wire = (kolo_dtype_t)p->wire;
    size_t esize = kolo_dtype_size(wire), count = 0, piece;
    kolo__reduce_fn fn = kolo__reduce_get(wire, (kolo_op_t)p->op);
    int direct = n == 1 && p->wire == p->dtype;
    /* AVERAGE is SUM and one scaling by postscale / size (Horovod's). */
    double post = kolo__postscale_factor(p->op, p->postscale, ps->size);
    const char *phase = backend_phase(ps, KOLO__COLL_ALLREDUCE);
    char detail[KOLO__ERR_LEN];
    cursor_t cin = {0, 0}, cout = {0, 0};
    int rc = KOLO_OK;

    for (size_t i = 0; i < n; i++)
        count += (size_t)ps->ready[idx[i]]->params.count;
    if (count == 0)
        return KOLO_OK;
    if (ps->data_ops->allreduce_stream != NULL)
        return run_allreduce_stream(ps, idx, n, count, err);
    piece = tuned(ps)->chunk_bytes > 0 ? (size_t)tuned(ps)->chunk_bytes / esize
                                        : count;
    if (direct && p->prescale == 1.0 && post == 1.0)
        piece = count;
    if (piece == 0)
        piece = 1;
    if (piece > count)
        piece = count;
    if (!direct && fusion_reserve(ps, piece * esize) != 0)
        return no_memory(ps, e0, piece * esize, err);

    /* The timeline shows the first copy in, the reduction (which, for a
     * batch of several pieces, includes the copies of the later pieces) and
     * the last copy out. */
    if (direct)
        tl_batch(ps, idx, n, phase);
    for (size_t done = 0; done < count && rc == KOLO_OK; done += piece) {
        size_t m = count - done < piece ? count - done : piece;
        int first = done == 0, last = done + m == count;
        const void *in = NULL;
        uint8_t *out;

        if (direct) {
            const uint8_t *src = (const uint8_t *)e0->input + done * esize;
            out = (uint8_t *)e0->output + done * esize;
            if (p->prescale != 1.0) {
                /* Never write the user's input: scale into the output. */
                if (src != out)
                    memcpy(out, src, m * esize);
                kolo__scale(out, m, wire, p->prescale);
            } else if (src != out) {
                in = src;
            }
        } else {
            out = ps->fusion;
            if (first)
                tl_batch(ps, idx, n, "MEMCPY_IN_FUSION_BUFFER");
            move_range(ps, idx, &cin, out, m, esize, 1);
            if (p->prescale != 1.0)
                kolo__scale(out, m, wire, p->prescale);
            if (first) {
                tl_batch(ps, idx, n, NULL);
                tl_batch(ps, idx, n, phase);
            }
        }
        rc = ps->data_ops->allreduce(ps->data_ctx, in, out, m, esize, fn,
                                     detail, sizeof(detail));
        if (rc != KOLO_OK)
            break;
        kolo__scale(out, m, wire, post);
        if (!direct && last) {
            tl_batch(ps, idx, n, NULL);
            tl_batch(ps, idx, n, "MEMCPY_OUT_FUSION_BUFFER");
        }
        if (!direct)
            move_range(ps, idx, &cout, out, m, esize, 0);
    }
    tl_batch(ps, idx, n, NULL);
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    return KOLO_OK;
}

static int run_broadcast(kolo__pset_t *ps, kolo__entry_t *e, kolo__err_t *err)
{
    size_t bytes = (size_t)e->params.count *
                   kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    char detail[KOLO__ERR_LEN];
    int rc;

    if (bytes == 0)
        return KOLO_OK;
    rc = ps->data_ops->broadcast(ps->data_ctx, e->output, bytes, e->params.root,
                                 detail, sizeof(detail));
    return rc == KOLO_OK ? KOLO_OK : backend_error(ps, rc, e, 1, detail, err);
}

/* A new result of `rows` rows shaped like the entry's tensor. */
static kolo__result_t *new_result(const kolo__entry_t *e, int64_t rows,
                                  int nsplits)
{
    size_t row_bytes = (size_t)e->params.count *
                       kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    kolo__result_t *r = calloc(1, sizeof(*r));

    if (r == NULL)
        return NULL;
    r->bytes = (size_t)rows * row_bytes;
    r->data = malloc(r->bytes ? r->bytes : 1);
    r->splits = calloc((size_t)nsplits, sizeof(int64_t));
    if (r->data == NULL || r->splits == NULL) {
        kolo__result_free(r);
        return NULL;
    }
    r->nsplits = nsplits;
    r->ndim = e->params.ndim;
    memcpy(r->shape, e->params.shape, sizeof(r->shape));
    r->shape[0] = rows;
    return r;
}

static int run_allgather(kolo__pset_t *ps, kolo__entry_t *e, kolo__err_t *err)
{
    size_t row_bytes = (size_t)e->params.count *
                       kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *rows = calloc((size_t)ps->size, sizeof(int64_t)), total = 0;
    size_t *bytes = calloc((size_t)ps->size, sizeof(size_t));
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int rc;

    if (rows == NULL || bytes == NULL) {
        rc = no_memory(ps, e, (size_t)ps->size * 16, err);
        goto out;
    }
    /* The first dimension may differ: exchange it first. */
    rc = ps->data_ops->allgather(ps->data_ctx, &e->rows, rows, sizeof(int64_t),
                                 detail, sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_error(ps, rc, e, 1, detail, err);
        goto out;
    }
    for (int r = 0; r < ps->size; r++) {
        bytes[r] = (size_t)rows[r] * row_bytes;
        total += rows[r];
    }
    res = new_result(e, total, ps->size);
    if (res == NULL) {
        rc = no_memory(ps, e, (size_t)total * row_bytes, err);
        goto out;
    }
    memcpy(res->splits, rows, (size_t)ps->size * sizeof(int64_t));
    if (res->bytes > 0) {
        rc = ps->data_ops->allgatherv(ps->data_ctx, e->input, res->data,
                                      bytes, detail, sizeof(detail));
        if (rc != KOLO_OK) {
            rc = backend_error(ps, rc, e, 1, detail, err);
            goto out;
        }
    }
    e->result = res;
    res = NULL;
out:
    kolo__result_free(res);
    free(rows);
    free(bytes);
    return rc;
}

static int run_alltoall(kolo__pset_t *ps, kolo__entry_t *e, kolo__err_t *err)
{
    size_t n = (size_t)ps->size;
    size_t row_bytes = (size_t)e->params.count *
                       kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *all = calloc(n * n, sizeof(int64_t)), total = 0;
    size_t *sb = calloc(n, sizeof(size_t)), *rb = calloc(n, sizeof(size_t));
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int rc;

    if (all == NULL || sb == NULL || rb == NULL) {
        rc = no_memory(ps, e, n * n * 8, err);
        goto out;
    }
    /* Every rank learns every rank's splits: what it receives from rank j
     * is rank j's split for it. */
    rc = ps->data_ops->allgather(ps->data_ctx, e->splits, all,
                                 n * sizeof(int64_t), detail, sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_error(ps, rc, e, 1, detail, err);
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        sb[j] = (size_t)e->splits[j] * row_bytes;
        rb[j] = (size_t)all[j * n + (size_t)ps->rank] * row_bytes;
        total += all[j * n + (size_t)ps->rank];
    }
    res = new_result(e, total, ps->size);
    if (res == NULL) {
        rc = no_memory(ps, e, (size_t)total * row_bytes, err);
        goto out;
    }
    for (size_t j = 0; j < n; j++)
        res->splits[j] = all[j * n + (size_t)ps->rank];
    rc = ps->data_ops->alltoallv(ps->data_ctx, e->input, sb, res->data, rb,
                                 detail, sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_error(ps, rc, e, 1, detail, err);
        goto out;
    }
    e->result = res;
    res = NULL;
out:
    kolo__result_free(res);
    free(all);
    free(sb);
    free(rb);
    return rc;
}

static int run_reducescatter(kolo__pset_t *ps, kolo__entry_t *e,
                             kolo__err_t *err)
{
    const kolo__params_t *p = &e->params;
    kolo_dtype_t dtype = (kolo_dtype_t)p->dtype;
    size_t esize = kolo_dtype_size(dtype);
    int64_t d0 = p->shape[0], row = d0 > 0 ? p->count / d0 : 0;
    size_t *counts = calloc((size_t)ps->size, sizeof(size_t));
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int64_t mine = 0;
    int rc = KOLO_OK;

    if (counts == NULL || fusion_reserve(ps, (size_t)p->count * esize) != 0) {
        rc = no_memory(ps, e, (size_t)p->count * esize, err);
        goto out;
    }
    for (int r = 0; r < ps->size; r++) {
        int64_t rows = d0 / ps->size + (r < d0 % ps->size ? 1 : 0);
        counts[r] = (size_t)(rows * row);
        if (r == ps->rank)
            mine = rows;
    }
    res = calloc(1, sizeof(*res));
    if (res == NULL || (res->splits = calloc((size_t)ps->size, 8)) == NULL ||
        (res->data = malloc(counts[ps->rank] * esize + 1)) == NULL) {
        rc = no_memory(ps, e, counts[ps->rank] * esize, err);
        goto out;
    }
    res->bytes = counts[ps->rank] * esize;
    res->ndim = p->ndim;
    memcpy(res->shape, p->shape, sizeof(res->shape));
    res->shape[0] = mine;
    res->nsplits = ps->size;
    for (int r = 0; r < ps->size; r++)
        res->splits[r] = row > 0 ? (int64_t)counts[r] / row : 0;
    if (p->count > 0) {
        memcpy(ps->fusion, e->input, (size_t)p->count * esize);
        if (p->prescale != 1.0)
            kolo__scale(ps->fusion, (size_t)p->count, dtype, p->prescale);
        rc = ps->data_ops->reduce_scatter(
            ps->data_ctx, ps->fusion, res->data, counts, esize,
            kolo__reduce_get(dtype, (kolo_op_t)p->op), detail, sizeof(detail));
        if (rc != KOLO_OK) {
            rc = backend_error(ps, rc, e, 1, detail, err);
            goto out;
        }
        kolo__scale(res->data, counts[ps->rank], dtype,
                    kolo__postscale_factor(p->op, p->postscale, ps->size));
    }
    e->result = res;
    res = NULL;
out:
    kolo__result_free(res);
    free(counts);
    return rc;
}

/* The fusion key: allreduces fuse only with the same place (host or
 * CUDA), dtype, op, wire dtype and scale factors (the scales get a small index per plan). */
static uint32_t fusion_key(const kolo__params_t *p, const kolo__params_t **scales,
                           uint32_t *nscales)
{
    uint32_t s;
    if (p->coll != KOLO__COLL_ALLREDUCE)
        return 0xffffffffu; /* never fused */
    for (s = 0; s < *nscales; s++)
        if (scales[s]->prescale == p->prescale &&
            scales[s]->postscale == p->postscale)
            break;
    if (s == *nscales) {
        if (s == 256)
            return 0xffffffffu; /* too many distinct scales: alone */
        scales[(*nscales)++] = p;
    }
    return (uint32_t)p->device_type << 30 | (uint32_t)p->dtype << 24 |
           (uint32_t)p->op << 16 | (uint32_t)p->wire << 8 | (s & 0xff);
}

/* Executes the plan in ps->ready; completes every entry of it. */
static int execute(kolo__pset_t *ps, kolo__err_t *err)
{
    size_t n = ps->nready;
    kolo__fusion_item_t *items;
    const kolo__params_t *scales[256];
    uint32_t nscales = 0;
    size_t *order;
    kolo__batch_t *batches;
    long nb = 0;
    int rc = KOLO_OK;

    if (n == 0)
        return KOLO_OK;
    items = malloc(n * sizeof(*items));
    order = malloc(n * sizeof(*order));
    batches = malloc(n * sizeof(*batches));
    if (items == NULL || order == NULL || batches == NULL) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "rank %d: out of memory planning %zu tensors",
                           ps->rank, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const kolo__params_t *p = &ps->ready[i]->params;
        items[i].key = fusion_key(p, scales, &nscales);
        items[i].bytes = p->count * (int64_t)kolo_dtype_size((kolo_dtype_t)p->wire);
        if (items[i].key == 0xffffffffu)
            items[i].bytes = INT64_MAX; /* alone */
    }
    nb = kolo__fusion_plan(items, n, tuned(ps)->fusion_threshold, order, batches);
    if (nb < 0) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "rank %d: out of memory planning %zu tensors",
                           ps->rank, n);
        goto out;
    }
    for (long b = 0; b < nb; b++) {
        const size_t *idx = order + batches[b].first;
        kolo__entry_t *e0 = ps->ready[idx[0]];
        int other = e0->params.coll != KOLO__COLL_ALLREDUCE;
        int gpu = e0->params.device_type == KOLO_DEVICE_CUDA &&
                  e0->params.coll <= KOLO__COLL_REDUCESCATTER;
        tl_batch(ps, idx, batches[b].n, NULL); /* QUEUE ends */
        if (other || gpu)
            tl_batch(ps, idx, batches[b].n,
                     gpu ? phase_names("nccl")[e0->params.coll]
                         : backend_phase(ps, e0->params.coll));
        if (gpu) {
#ifdef KOLO_HAVE_GPU
            rc = kolo__gpu_run(ps, idx, batches[b].n, err);
#else
            rc = kolo__err_set(err, KOLO_ERR_INTERNAL, "tensor '%s' is on a "
                               "CUDA device in a build without GPU support",
                               e0->name);
#endif
        } else switch (e0->params.coll) {
        case KOLO__COLL_ALLREDUCE:
            rc = run_allreduce(ps, idx, batches[b].n, err);
            break;
        case KOLO__COLL_BROADCAST:
            rc = run_broadcast(ps, e0, err);
            break;
        case KOLO__COLL_ALLGATHER:
            rc = run_allgather(ps, e0, err);
            break;
        case KOLO__COLL_ALLTOALL:
            rc = run_alltoall(ps, e0, err);
            break;
        case KOLO__COLL_REDUCESCATTER:
            rc = run_reducescatter(ps, e0, err);
            break;
        default:
            /* A barrier is done once negotiated: every rank has entered
             * it by then. */
            rc = KOLO_OK;
            break;
        }
        if (other || gpu)
            tl_batch(ps, idx, batches[b].n, NULL);
        for (size_t i = 0; i < batches[b].n; i++) {
            kolo__entry_t *e = ps->ready[idx[i]];
            ps->ready[idx[i]] = NULL;
            if (rc == KOLO_OK)
                kolo__complete(ps, e, KOLO_OK, NULL);
            else
                fail_entry(ps, e, err);
        }
        if (rc != KOLO_OK)
            break;
    }
out:
    /* After a failure, what is left of the plan fails with it: the backend
     * is broken or memory ran out. */
    for (size_t i = 0; rc != KOLO_OK && i < n; i++)
        if (ps->ready[i] != NULL)
            fail_entry(ps, ps->ready[i], err);
    ps->nready = 0;
    free(items);
    free(order);
    free(batches);
    return rc;
}

/* ---- the loop ------------------------------------------------------------- */

/* The reason a set stops when a rank asked to shut down, or the reason the
 * runtime gave when it closed the queue (the global set stopped). */
static void stop_reason(kolo__pset_t *ps, int stop_rank, kolo__err_t *err)
{
    int gstop = ps->ranks[stop_rank];

    pthread_mutex_lock(&ps->queue.mu);
    if (ps->queue.closed) {
        *err = ps->queue.close_err;
        pthread_mutex_unlock(&ps->queue.mu);
        return;
    }
    pthread_mutex_unlock(&ps->queue.mu);
    if (gstop == ps->rt->rank)
        kolo__err_set(err, KOLO_ERR_SHUTDOWN,
                      "kolo was shut down on this rank (rank %d)", gstop);
    else if (ps->id == KOLO_GLOBAL_PROCESS_SET)
        kolo__err_set(err, KOLO_ERR_SHUTDOWN,
                      "rank %d has shut down, which stops the job", gstop);
    else
        kolo__err_set(err, KOLO_ERR_SHUTDOWN,
                      "process set %d was removed or stopped (by rank %d)",
                      ps->id, gstop);
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
        rc = kolo__explain_failure(ps, rc, detail, sizeof(detail));
        return kolo__err_set(err, rc, "rank %d: autotune could not agree on "
                             "a window's time: %s", ps->rank, detail);
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

void *kolo__background_main(void *arg)
{
    kolo__pset_t *ps = arg;
    int64_t cycle_us = (int64_t)(tuned(ps)->cycle_ms * 1000.0);
    int64_t sleep_start = cycle_us > 1000 ? cycle_us : 1000;
    int64_t sleep_us = sleep_start;
    int progressed = 0;
    kolo__err_t err;

    for (;;) {
        int pending = kolo__negotiate_pending(ps), shutdown, stop_rank, rc;
        int64_t timeout = pending && progressed ? 0 : sleep_us;
        kolo__wake_reason_t reason;
        uint64_t done_before;
        int64_t bytes_before;
        int64_t t0 = kolo__now_us();
        kolo__entry_t *fresh = kolo__queue_take_round(
            &ps->queue, timeout, (uint64_t)ps->cycles, &shutdown, &reason);
        int64_t t1 = kolo__now_us(), t2;
        char detail[KOLO__ERR_LEN];

        kolo__err_clear(&err);
        /* Peers may be asleep waiting: ask them to join (see the essay). */
        if (timeout > 0 && reason != KOLO__WOKE_PEER &&
            (reason != KOLO__WOKE_WORK || ps->others_waiting) &&
            (rc = ps->ctl_ops->wake_peers(ps->ctl_ctx, (uint64_t)ps->cycles, detail,
                                          sizeof(detail))) != KOLO_OK) {
            rc = kolo__explain_failure(ps, rc, detail, sizeof(detail));
            kolo__err_set(&err, rc, "rank %d: cannot wake the other ranks: %s",
                          ps->rank, detail);
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            while (fresh != NULL) {
                kolo__entry_t *next = fresh->next;
                fail_entry(ps, fresh, &err);
                fresh = next;
            }
            stop_all(ps, &err);
            break;
        }

        done_before = ps->completed;
        bytes_before = ps->bytes_done;
        kolo__watchdog_enter(ps, "a negotiation round");
        rc = kolo__negotiate(ps, fresh, shutdown, &stop_rank, &err);
        kolo__watchdog_enter(ps, NULL);
        if (rc != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            stop_all(ps, &err);
            break;
        }
        t2 = kolo__now_us();
        if (ps->nready > 0)
            kolo__watchdog_enter(ps, "a collective");
        rc = execute(ps, &err);
        kolo__watchdog_enter(ps, NULL);
        if (rc != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            stop_all(ps, &err);
            break;
        }
        progressed = ps->completed != done_before;
        if (progressed && ps->tune != NULL &&
            autotune_round(ps, ps->bytes_done - bytes_before,
                           kolo__now_us() - t1, &err) != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
            stop_all(ps, &err);
            break;
        }
        if (ps->tune != NULL) { /* the autotuner may have moved it */
            cycle_us = (int64_t)(tuned(ps)->cycle_ms * 1000.0);
            sleep_start = cycle_us > 1000 ? cycle_us : 1000;
        }
        ps->others_waiting = !progressed && ps->any_pending;
        /* The sleep grows while rounds find nothing to do anywhere. Both
         * inputs are the same on every rank, so all ranks back off alike
         * and a token from one does not reset the others. */
        if (progressed || ps->any_pending)
            sleep_us = sleep_start;
        else
            sleep_us = sleep_us * 2 < SLEEP_MAX_US ? sleep_us * 2 : SLEEP_MAX_US;
        kolo__trace("set %d round %lld: slept %lld us (timeout %lld), "
                    "negotiated in %lld us, executed in %lld us, %llu "
                    "completed, %s pending",
                    ps->id, (long long)ps->cycles, (long long)(t1 - t0),
                    (long long)timeout, (long long)(t2 - t1),
                    (long long)(kolo__now_us() - t2),
                    (unsigned long long)(ps->completed - done_before),
                    kolo__negotiate_pending(ps) ? "some" : "none");
        if (stop_rank >= 0) {
            stop_reason(ps, stop_rank, &err);
            if (kolo__negotiate_pending(ps))
                kolo__log(KOLO__LOG_WARNING, "%s; tensors still pending on "
                          "this rank fail", err.msg);
            stop_all(ps, &err);
            break;
        }
    }
    return NULL;
}

/* ---- process sets ---------------------------------------------------------- */

void kolo__wake_from_peer(void *arg, uint64_t round)
{
    kolo__pset_t *ps = arg;
    kolo__queue_peer_wake(&ps->queue, round);
}

static void pset_free(kolo__pset_t *ps)
{
    if (ps->tune_log != NULL)
        fclose(ps->tune_log);
    free(ps->tune);
    kolo__negotiate_free(ps);
    kolo__queue_destroy(&ps->queue);
    free(ps->fusion);
    free(ps->ranks);
    free(ps);
}

static int start_threads(kolo__runtime_t *rt, kolo__pset_t *ps, int id,
                         int size, kolo__err_t *err);

static void release_ops(kolo__pset_t *ps)
{
#ifdef KOLO_HAVE_GPU
    kolo__gpu_free(ps);
#endif
    if (ps->data_ops != NULL && ps->data_ctx != ps->ctl_ctx)
        ps->data_ops->finalize(ps->data_ctx);
    if (ps->ctl_ops != NULL)
        ps->ctl_ops->finalize(ps->ctl_ctx);
}

int kolo__pset_start(kolo__runtime_t *rt, int id, const int *ranks, int size,
                     kolo__outcome_t *watch, kolo__pset_t **out,
                     kolo__err_t *err)
{
    kolo__pset_t *ps = calloc(1, sizeof(*ps));
    sigset_t pipe_set, saved_mask;
    int rc;

    if (ps == NULL || (ps->ranks = malloc((size_t)size * sizeof(int))) == NULL) {
        free(ps);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory creating process set %d", id);
    }
    ps->rt = rt;
    ps->id = id;
    ps->size = size;
    ps->watch = watch;
    ps->gpu_device = -1;
    ps->rank = -1;
    for (int i = 0; i < size; i++) {
        ps->ranks[i] = ranks[i];
        if (ranks[i] == rt->rank)
            ps->rank = i;
    }
    if (kolo__queue_init(&ps->queue) != 0) {
        free(ps->ranks);
        free(ps);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot create the queue of process set %d", id);
    }
    ps->tune_fixed = (kolo__tune_params_t){rt->cfg.fusion_threshold,
                                           rt->cfg.chunk_bytes,
                                           rt->cfg.cycle_time_ms};
    if (rt->cfg.autotune && size > 1) {
        ps->tune = malloc(sizeof(*ps->tune));
        if (ps->tune == NULL) {
            free(ps->ranks);
            free(ps);
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory creating process set %d", id);
        }
        /* start_threads initialises it, once the data backend has chosen
         * KOLO_CHUNK_BYTES=auto. */
        if (id == KOLO_GLOBAL_PROCESS_SET && rt->rank == 0 &&
            rt->cfg.autotune_log[0] != '\0') {
            ps->tune_log = fopen(rt->cfg.autotune_log, "w");
            if (ps->tune_log == NULL) {
                int e = errno;
                free(ps->tune);
                free(ps->ranks);
                free(ps);
                return kolo__err_set(err, KOLO_ERR_CONFIG,
                                     "KOLO_AUTOTUNE_LOG=%s: cannot create it "
                                     "on rank 0: %s", rt->cfg.autotune_log,
                                     strerror(e));
            }
            fprintf(ps->tune_log, "window,parameter,fusion_threshold,"
                    "chunk_bytes,cycle_time_ms,bytes,busy_seconds,"
                    "bytes_per_busy_second,state\n");
        }
    }
    if (kolo__negotiate_init(ps) != 0) {
        pset_free(ps);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory for a response cache of %lld "
                             "entries (KOLO_CACHE_CAPACITY)",
                             (long long)rt->cfg.cache_capacity);
    }
    /* Threads started from here (the backend's and ours) write to sockets
     * whose peer may be gone: they must get EPIPE, not a SIGPIPE that kills
     * the process. They inherit this thread's mask; ours is restored. */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &saved_mask);
    rc = start_threads(rt, ps, id, size, err);
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
    if (rc == KOLO_OK)
        *out = ps;
    return rc;
}

/* Which backend a role uses: KOLO_CONTROLLER or KOLO_CPU_OPERATIONS when
 * set (not "auto"), else shared memory when every member is on this host and
 * this build has it, else the first network backend this build has. */
static int choose_ops(const kolo__runtime_t *rt, const char *var,
                      const char *want, int all_local, int size,
                      const kolo__ops_t **out, kolo__err_t *err)
{
    static const char *const network[] = {"gloo", "mpi"};
    char names[128];

    *out = NULL;
    if (size == 1) {
        *out = &kolo__ops_local;
        return KOLO_OK;
    }
    if (want[0] != '\0' && strcmp(want, "auto") != 0) {
        *out = kolo__ops_named(want);
        if (*out == NULL) {
            kolo__ops_names(names, sizeof(names));
            return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                                 "%s=%s: this kolo has no backend of that "
                                 "name (it has: %s)", var, want,
                                 names[0] ? names : "none");
        }
        if (strcmp(want, "mpi") == 0 && !rt->cfg.mpi_launched)
            return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                                 "%s=mpi: the mpi backend needs the job to be "
                                 "started by mpirun (or kolorun --mpi), and "
                                 "rank %d was started by kolorun without "
                                 "--mpi", var, rt->rank);
        if (strcmp(want, "shm") == 0 && !all_local)
            return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                                 "%s=shm: the ranks of this job or process "
                                 "set are not all on one host", var);
        return KOLO_OK;
    }
    if (all_local && (*out = kolo__ops_find("shm")) != NULL)
        return KOLO_OK;
    if (rt->cfg.mpi_launched && (*out = kolo__ops_find("mpi")) != NULL)
        return KOLO_OK;
    for (size_t i = 0; i < sizeof(network) / sizeof(network[0]); i++)
        if ((*out = kolo__ops_find(network[i])) != NULL)
            return KOLO_OK;
    return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                         "a process set of %d ranks needs a communication "
                         "backend, and this kolo was built without one", size);
}

/* The message of a backend that could not connect. Every rank of the job
 * has arrived by then (kolo_init agreed on the settings first), so what
 * failed is the connection itself. */
static int connect_failed(kolo__runtime_t *rt, kolo__pset_t *ps,
                          const kolo__ops_t *ops, int rc, const char *detail,
                          kolo__err_t *err)
{
    if (ps->id != KOLO_GLOBAL_PROCESS_SET)
        return kolo__err_set(err, rc, "rank %d could not connect process set "
                             "%d (%s): %s", rt->rank, ps->id, ops->name, detail);
    return kolo__err_set(err, rc, "rank %d of %d could not join the job "
                         "(%s, rendezvous %s): %s", rt->rank, rt->size,
                         ops->name,
                         rt->cfg.rendezvous[0] ? rt->cfg.rendezvous : "none",
                         detail);
}

/* A backend's warning (Gloo: a stranger's connection it dropped), from
 * whatever thread the backend runs. */
static void warn_from_backend(const char *msg)
{
    kolo__log(KOLO__LOG_WARNING, "%s", msg);
}

int kolo__pset_connect(kolo__pset_t *ps, const kolo__ops_t *ops,
                       const char *role, int rank, int size,
                       const int *members, const int *hosts,
                       const char *cross_ops, void **ctx, kolo__err_t *err)
{
    kolo__runtime_t *rt = ps->rt;
    kolo__ops_config_t ocfg;
    char prefix[96], detail[KOLO__ERR_LEN];
    int rc;

    snprintf(prefix, sizeof(prefix), "kolo%u/set%d/%s", rt->generation,
             ps->id, role);
    ocfg = (kolo__ops_config_t){
        .rank = rank, .size = size, .members = members,
        .hosts = hosts, .global_rank = rt->rank,
        .rendezvous = rt->cfg.rendezvous, .prefix = prefix,
        .hostname = rt->cfg.hostname, .timeout_s = rt->cfg.timeout_s,
        .start_timeout_s = rt->cfg.start_timeout_s,
        .on_wake = kolo__wake_from_peer, .wake_arg = ps,
        .abandoned = ps->watch != NULL ? kolo__outcome_abandoned : NULL,
        .abandoned_arg = ps->watch,
        .warn = warn_from_backend,
        .cross_ops = cross_ops,
        .shm_slot_bytes = (size_t)rt->cfg.shm_slot_bytes,
        .shm_spin_us = (int)rt->cfg.shm_spin_us};
    detail[0] = '\0';
    rc = ops->init(&ocfg, ctx, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return connect_failed(rt, ps, ops, rc, detail, err);
    return KOLO_OK;
}

/* The host index of every rank, exchanged over the global set's controller
 * before its thread starts (the only time the API thread uses a backend). */
static int exchange_hosts(kolo__runtime_t *rt, kolo__pset_t *ps,
                          kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN] = "";
    int me = (int)rt->cfg.cross_rank;
    int rc;

    rt->host_of = calloc((size_t)rt->size, sizeof(int));
    if (rt->host_of == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory in kolo_init");
    if (rt->size == 1)
        return KOLO_OK;
    rc = ps->ctl_ops->allgather(ps->ctl_ctx, &me, rt->host_of, sizeof(int),
                                detail, sizeof(detail));
    if (rc != KOLO_OK)
        return kolo__err_set(err, rc, "rank %d could not exchange host "
                             "placement: %s", rt->rank, detail);
    return KOLO_OK;
}

/* Whether a set that spans hosts reduces hierarchically (ops/hier): with
 * KOLO_HIERARCHICAL_ALLREDUCE=1, or by default when every host holds the
 * same number of members, more than one. */
static int use_hierarchical(const kolo__runtime_t *rt, const kolo__pset_t *ps,
                            const int *hosts)
{
    int first = -1, same = 1;

    if (rt->cfg.hierarchical == 0 || kolo__ops_find("hier") == NULL)
        return 0;
    for (int i = 0; i < ps->size; i++) {
        int here = 0;
        for (int j = 0; j < ps->size; j++)
            here += hosts[j] == hosts[i];
        if (first < 0)
            first = here;
        same &= here == first;
    }
    if (same && first > 1)
        return 1;
    if (rt->cfg.hierarchical == 1 && ps->rank == 0)
        kolo__log(KOLO__LOG_WARNING, "KOLO_HIERARCHICAL_ALLREDUCE=1, but process "
                  "set %d does not have the same number of ranks (more than "
                  "one) on every host: its allreduce stays flat", ps->id);
    return 0;
}

static int start_threads(kolo__runtime_t *rt, kolo__pset_t *ps, int id,
                         int size, kolo__err_t *err)
{
    int *hosts = NULL;
    const char *cross = NULL;
    int rc = KOLO_OK, all_local = 1;

    hosts = malloc((size_t)size * sizeof(int));
    if (hosts == NULL) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory creating process set %d", id);
        goto agree;
    }
    /* Before the global set has exchanged placements, the configuration
     * says whether the job is on one host. */
    for (int i = 0; i < size; i++)
        hosts[i] = rt->host_of != NULL ? rt->host_of[ps->ranks[i]]
                                       : (int)rt->cfg.cross_rank;
    if (rt->host_of == NULL)
        all_local = rt->cfg.cross_size == 1 && rt->cfg.local_size == rt->size;
    for (int i = 1; i < size; i++)
        all_local &= hosts[i] == hosts[0];

    rc = choose_ops(rt, "KOLO_CONTROLLER", rt->cfg.controller, all_local,
                    size, &ps->ctl_ops, err);
    if (rc == KOLO_OK)
        rc = kolo__pset_connect(ps, ps->ctl_ops, "ctl", ps->rank, ps->size,
                                ps->ranks, hosts, NULL, &ps->ctl_ctx, err);
    if (rc != KOLO_OK) {
        ps->ctl_ops = NULL; /* nothing to finalize */
        goto agree;
    }
    if (id == KOLO_GLOBAL_PROCESS_SET && rt->host_of == NULL) {
        rc = exchange_hosts(rt, ps, err);
        for (int i = 0; rc == KOLO_OK && i < size; i++) {
            hosts[i] = rt->host_of[ps->ranks[i]];
            if (hosts[i] != hosts[0] && all_local)
                rc = kolo__err_set(err, KOLO_ERR_CONFIG,
                                   "rank %d is on host %d but rank %d is on "
                                   "host %d, while KOLO_CROSS_SIZE=1 and "
                                   "KOLO_LOCAL_SIZE=%lld say one host",
                                   ps->ranks[0], hosts[0], ps->ranks[i],
                                   hosts[i], (long long)rt->cfg.local_size);
        }
    }
    if (rc == KOLO_OK)
        rc = choose_ops(rt, "KOLO_CPU_OPERATIONS", rt->cfg.cpu_operations,
                        all_local, size, &ps->data_ops, err);
    if (rc == KOLO_OK && !all_local && use_hierarchical(rt, ps, hosts)) {
        cross = ps->data_ops->name;
        ps->data_ops = kolo__ops_find("hier");
    }
    if (rc == KOLO_OK && ps->data_ops == ps->ctl_ops)
        ps->data_ctx = ps->ctl_ctx;
    else if (rc == KOLO_OK)
        rc = kolo__pset_connect(ps, ps->data_ops, "data", ps->rank, ps->size,
                                ps->ranks, hosts, cross, &ps->data_ctx, err);
    if (rc != KOLO_OK)
        ps->data_ops = NULL; /* not connected (or the controller's) */
    /* KOLO_CHUNK_BYTES=auto: now that the data backend is known; then the
     * tuner starts from the defaults. */
    if (rc == KOLO_OK && ps->tune_fixed.chunk_bytes < 0)
        ps->tune_fixed.chunk_bytes =
            ps->data_ops->chunk_bytes > 0 ? ps->data_ops->chunk_bytes : 4 << 20;
    if (rc == KOLO_OK && ps->tune != NULL)
        kolo__autotune_init(ps->tune, &ps->tune_fixed,
                            (int)rt->cfg.autotune_window);
    if (rc == KOLO_OK)
        ps->phase = phase_names(ps->data_ops->name);
agree:
    free(hosts);
    /* Every rank learns whether every member connected, before any thread
     * runs a round on a set that is not whole (agree.c). */
    if (ps->watch != NULL) {
        kolo__err_t mine = *err;
        rc = kolo__outcome_agree(ps->watch, rc, &mine, err);
        ps->watch->agreed = 1;
        ps->watch = NULL;
    }
    if (rc != KOLO_OK) {
        release_ops(ps);
        pset_free(ps);
        return rc;
    }
    if (pthread_create(&ps->thread, NULL, kolo__background_main, ps) != 0) {
        release_ops(ps);
        pset_free(ps);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot start the background thread of process "
                             "set %d", id);
    }
    ps->thread_started = 1;
    return KOLO_OK;
}

void kolo__pset_request_stop(kolo__pset_t *ps, const kolo__err_t *why)
{
    if (why != NULL)
        kolo__queue_close(&ps->queue, why);
    kolo__queue_request_shutdown(&ps->queue);
}

void kolo__pset_stop(kolo__pset_t *ps, const kolo__err_t *why)
{
    kolo__pset_request_stop(ps, why);
    if (ps->thread_started)
        pthread_join(ps->thread, NULL);
    release_ops(ps);
    pset_free(ps);
}
