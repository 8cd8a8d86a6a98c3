/*
 * execute.c — runs a round's plan: splits its allreduces into fusion
 * batches (fusion.c), reduces each batch with one backend call, runs the
 * other collectives one by one, and completes every entry of the plan.
 *
 * Called by the set's background thread only, with the plan that
 * negotiation left in ps->ready (the same on every member).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "complete.h"
#include "connect.h"
#include "execute.h"
#include "flight.h"
#include "fusion.h"
#include "peers.h"
#include "half.h"
#include "inflight.h"
#include "reduce.h"
#include "timeline.h"

#define FUSION_ALIGN 64

static int fusion_reserve(kolo__pset_t *ps, size_t bytes)
{
    size_t cap;
    uint8_t *buf;

    if (ps->exec.fusion_cap >= bytes)
        return 0;
    cap = (bytes + FUSION_ALIGN - 1) / FUSION_ALIGN * FUSION_ALIGN;
    buf = kolo__aligned_alloc(FUSION_ALIGN, cap);
    if (buf == NULL)
        return -1;
    /* Touch every page now, so that reductions never fault pages in. */
    memset(buf, 0, cap);
    free(ps->exec.fusion);
    ps->exec.fusion = buf;
    ps->exec.fusion_cap = cap;
    return 0;
}


/* A failed collective's message, naming the tensor (and, for a CUDA
 * tensor, its device), after looking for a lost peer to blame. */
static int backend_error(kolo__pset_t *ps, int rc, const kolo__entry_t *e,
                         size_t nfused, char *detail, kolo__err_t *err)
{
    int cuda = e->params.device_type == KOLO_DEVICE_CUDA;
    char dev[32] = "";

    if (nfused > 1)
        return kolo__fail_backend(ps, rc, detail, err,
                                  "%s of %stensor '%s' fused with %zu others",
                                  kolo__coll_name(e->params.coll),
                                  cuda ? "CUDA " : "", e->name, nfused - 1);
    if (cuda)
        snprintf(dev, sizeof(dev), ", device %d", e->device);
    return kolo__fail_backend(ps, rc, detail, err,
                              "%s of %stensor '%s' (%lld %s%s)",
                              kolo__coll_name(e->params.coll),
                              cuda ? "CUDA " : "", e->name,
                              (long long)e->params.count,
                              kolo_dtype_name((kolo_dtype_t)e->params.dtype), dev);
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
 * input piece by piece and hands the result back the same way, at any
 * element and in any order (kolo's TCP ring works on one segment while
 * it sends another), so every call finds its tensor by binary search in
 * the batch's start offsets. */
typedef struct stream_state {
    kolo__pset_t *ps;
    const size_t *idx;
    size_t n, esize;
    const kolo__params_t *p;
    kolo_dtype_t wire;
    size_t *start; /* [n + 1]: batch element where tensor i starts */
} stream_state_t;

/* The position of batch element `at`: the tensor holding it and the
 * element within (past tensors with no elements). */
static cursor_t seek(const stream_state_t *st, size_t at)
{
    size_t lo = 0, hi = st->n; /* start[lo] <= at < start[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (st->start[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    return (cursor_t){lo, at - st->start[lo]};
}

static void stream_fill(void *arg, void *dst, size_t at, size_t n)
{
    stream_state_t *st = arg;
    cursor_t c = seek(st, at);
    move_range(st->ps, st->idx, &c, dst, n, st->esize, 1);
    if (st->p->prescale != 1.0)
        kolo__scale(dst, n, st->wire, st->p->prescale);
}

static const void *stream_view(void *arg, size_t at, size_t n, size_t *run)
{
    stream_state_t *st = arg;
    const kolo__entry_t *e;
    cursor_t c;
    size_t left;

    if (at >= st->start[st->n])
        return NULL;
    c = seek(st, at);
    e = st->ps->ready[st->idx[c.i]];
    left = (size_t)e->params.count - c.at;
    *run = left < n ? left : n;
    return (const uint8_t *)e->input + c.at * st->esize;
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
    cursor_t c = seek(st, at);
    move_range(st->ps, st->idx, &c, (uint8_t *)src, n, st->esize, 0);
}

static void *stream_place(void *arg, size_t at, size_t n, size_t *run)
{
    stream_state_t *st = arg;
    cursor_t c = seek(st, at);
    kolo__entry_t *e = st->ps->ready[st->idx[c.i]];
    size_t left = (size_t)e->params.count - c.at;
    *run = left < n ? left : n;
    return (uint8_t *)e->output + c.at * st->esize;
}

static int run_allreduce_stream(kolo__pset_t *ps, const size_t *idx, size_t n,
                                size_t count, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    stream_state_t st = {ps, idx, n, 0, &e0->params,
                         (kolo_dtype_t)e0->params.wire, NULL};
    /* Tensors already in the wire dtype and not prescaled can be read
     * where they lie. */
    int viewable = e0->params.wire == e0->params.dtype &&
                   e0->params.prescale == 1.0;
    /* Results in the wire dtype can be reduced where they stay. */
    int placeable = e0->params.wire == e0->params.dtype;
    kolo__ops_stream_t s = {stream_fill, viewable ? stream_view : NULL,
                            stream_finish, stream_drain,
                            placeable ? stream_place : NULL, &st};
    char detail[KOLO__ERR_LEN];
    int rc;

    st.esize = kolo_dtype_size(st.wire);
    if (ps->exec.starts_cap < n + 1) { /* kept: no allocation per batch */
        size_t *p = kolo__realloc(ps->exec.starts, (n + 1) * sizeof(size_t));
        if (p == NULL)
            return no_memory(ps, e0, (n + 1) * sizeof(size_t), err);
        ps->exec.starts = p;
        ps->exec.starts_cap = n + 1;
    }
    st.start = ps->exec.starts;
    st.start[0] = 0;
    for (size_t i = 0; i < n; i++)
        st.start[i + 1] = st.start[i] + (size_t)ps->ready[idx[i]]->params.count;
    kolo__tl_batch(ps, idx, n, kolo__backend_phase(ps, KOLO__COLL_ALLREDUCE));
    rc = ps->data_ops->allreduce_stream(
        ps->data_ctx, count, st.esize,
        kolo__reduce_get(st.wire, (kolo_op_t)e0->params.op), &s, detail,
        sizeof(detail));
    kolo__tl_batch(ps, idx, n, NULL);
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    return KOLO_OK;
}

/* kolo__tl_batch's begin, with args for every tensor's span. */
static void tl_batch_args(kolo__pset_t *ps, const size_t *idx, size_t n,
                          const char *phase, const char *args)
{
    for (size_t i = 0; i < n; i++)
        kolo__tl_entry_begin(ps, ps->ready[idx[i]], phase, args, 0);
}

/* A batch whose every tensor came reduced with the agreement
 * (negotiate.c's essay): no step of the data backend. A tensor alone is
 * copied to its output and scaled as run_allreduce scales it; a fused
 * batch goes through the fusion buffer as a moved one does (the results
 * packed in, scaled there, copied out), so that the timeline shows the
 * same phases whichever way the bytes came. */
static int run_carried(kolo__pset_t *ps, const size_t *idx, size_t n,
                       size_t count, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    kolo_dtype_t wire = (kolo_dtype_t)e0->params.wire;
    size_t esize = kolo_dtype_size(wire), at = 0;
    double post = kolo__postscale_factor(e0->params.op, e0->params.postscale,
                                         ps->size);
    const char *phase = kolo__backend_phase(ps, KOLO__COLL_ALLREDUCE);
    cursor_t cout = {0, 0};
    char args[32];

    /* (the timeline's backend span says so, with the batch's size) */
    snprintf(args, sizeof(args), "\"carried\":%zu", n);
    if (n == 1) {
        tl_batch_args(ps, idx, n, phase, args);
        memcpy(e0->output, e0->carried, count * esize);
        kolo__scale(e0->output, count, wire, post);
        kolo__tl_batch(ps, idx, n, NULL);
        e0->carried = NULL;
        return KOLO_OK;
    }
    if (fusion_reserve(ps, count * esize) != 0)
        return no_memory(ps, e0, count * esize, err);
    kolo__tl_batch(ps, idx, n, "MEMCPY_IN_FUSION_BUFFER");
    for (size_t i = 0; i < n; i++) {
        kolo__entry_t *e = ps->ready[idx[i]];
        size_t bytes = (size_t)e->params.count * esize;
        memcpy(ps->exec.fusion + at, e->carried, bytes);
        at += bytes;
        e->carried = NULL;
    }
    kolo__tl_batch(ps, idx, n, NULL);
    tl_batch_args(ps, idx, n, phase, args);
    kolo__scale(ps->exec.fusion, count, wire, post);
    kolo__tl_batch(ps, idx, n, NULL);
    kolo__tl_batch(ps, idx, n, "MEMCPY_OUT_FUSION_BUFFER");
    move_range(ps, idx, &cout, ps->exec.fusion, count, esize, 0);
    kolo__tl_batch(ps, idx, n, NULL);
    return KOLO_OK;
}

/* An allreduce over a backend that does not stream (run_allreduce_pieces).
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

/* What every piece of such a batch shares. */
typedef struct pieces {
    kolo__pset_t *ps;
    const size_t *idx;
    size_t n;              /* tensors in the batch */
    size_t count, esize;   /* its elements, and their size on the wire */
    const kolo__params_t *p;
    kolo_dtype_t wire;
    kolo__reduce_fn fn;
    /* AVERAGE is SUM and one scaling by postscale / size (Horovod's). */
    double post;
    int direct;            /* a tensor alone, uncompressed: no copies */
    const char *phase;     /* the backend's timeline name */
    cursor_t cin, cout;    /* where the next piece comes from, goes to */
    char *detail;          /* [KOLO__ERR_LEN]: the backend's failure */
} pieces_t;

/* Elements per piece: KOLO_CHUNK_BYTES worth, or the whole batch for a
 * tensor alone that kolo does not pass over (no scale factor). */
static size_t piece_elements(const pieces_t *b)
{
    const kolo__tune_params_t *tuned = kolo__tuned(b->ps);
    size_t piece = tuned->chunk_bytes > 0
                       ? (size_t)tuned->chunk_bytes / b->esize
                       : b->count;

    if (b->direct && b->p->prescale == 1.0 && b->post == 1.0)
        piece = b->count;
    if (piece == 0)
        piece = 1;
    if (piece > b->count)
        piece = b->count;
    return piece;
}

/* A piece of a tensor alone: reduced where its result goes, from its
 * input where it lies (*in), or prescaled into the output first. */
static uint8_t *direct_piece(const pieces_t *b, size_t done, size_t m,
                             const void **in)
{
    const kolo__entry_t *e0 = b->ps->ready[b->idx[0]];
    const uint8_t *src = (const uint8_t *)e0->input + done * b->esize;
    uint8_t *out = (uint8_t *)e0->output + done * b->esize;

    if (b->p->prescale != 1.0) {
        /* Never write the user's input: scale into the output. */
        if (src != out)
            memcpy(out, src, m * b->esize);
        kolo__scale(out, m, b->wire, b->p->prescale);
    } else if (src != out) {
        *in = src;
    }
    return out;
}

/* A piece of a fused (or compressed) batch: packed into the fusion
 * buffer, prescaled there. */
static uint8_t *fused_piece(pieces_t *b, size_t m, int first)
{
    uint8_t *out = b->ps->exec.fusion;

    if (first)
        kolo__tl_batch(b->ps, b->idx, b->n, "MEMCPY_IN_FUSION_BUFFER");
    move_range(b->ps, b->idx, &b->cin, out, m, b->esize, 1);
    if (b->p->prescale != 1.0)
        kolo__scale(out, m, b->wire, b->p->prescale);
    if (first) {
        kolo__tl_batch(b->ps, b->idx, b->n, NULL);
        kolo__tl_batch(b->ps, b->idx, b->n, b->phase);
    }
    return out;
}

/* Reduces the m elements from `done`, postscales them, and (a fused batch)
 * copies them back out while they are still in cache. */
static int reduce_piece(pieces_t *b, size_t done, size_t m)
{
    int first = done == 0, last = done + m == b->count;
    const void *in = NULL;
    uint8_t *out = b->direct ? direct_piece(b, done, m, &in)
                             : fused_piece(b, m, first);
    int rc = b->ps->data_ops->allreduce(b->ps->data_ctx, in, out, m, b->esize,
                                        b->fn, b->detail, KOLO__ERR_LEN);

    if (rc != KOLO_OK)
        return rc;
    kolo__scale(out, m, b->wire, b->post);
    if (b->direct)
        return KOLO_OK;
    if (last) {
        kolo__tl_batch(b->ps, b->idx, b->n, NULL);
        kolo__tl_batch(b->ps, b->idx, b->n, "MEMCPY_OUT_FUSION_BUFFER");
    }
    move_range(b->ps, b->idx, &b->cout, out, m, b->esize, 0);
    return KOLO_OK;
}

static int run_allreduce_pieces(kolo__pset_t *ps, const size_t *idx,
                                size_t n, size_t count, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    const kolo__params_t *p = &e0->params;
    char detail[KOLO__ERR_LEN];
    pieces_t b = {
        .ps = ps, .idx = idx, .n = n, .count = count,
        .esize = kolo_dtype_size((kolo_dtype_t)p->wire), .p = p,
        .wire = (kolo_dtype_t)p->wire,
        .fn = kolo__reduce_get((kolo_dtype_t)p->wire, (kolo_op_t)p->op),
        .post = kolo__postscale_factor(p->op, p->postscale, ps->size),
        .direct = n == 1 && p->wire == p->dtype,
        .phase = kolo__backend_phase(ps, KOLO__COLL_ALLREDUCE),
        .cin = {0, 0}, .cout = {0, 0}, .detail = detail};
    size_t piece = piece_elements(&b);
    int rc = KOLO_OK;

    if (!b.direct && fusion_reserve(ps, piece * b.esize) != 0)
        return no_memory(ps, e0, piece * b.esize, err);
    /* The timeline shows the first copy in, the reduction (which, for a
     * batch of several pieces, includes the copies of the later pieces) and
     * the last copy out. */
    if (b.direct)
        kolo__tl_batch(ps, idx, n, b.phase);
    for (size_t done = 0; done < count && rc == KOLO_OK; done += piece)
        rc = reduce_piece(&b, done, count - done < piece ? count - done : piece);
    kolo__tl_batch(ps, idx, n, NULL);
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    return KOLO_OK;
}

/* Allreduces the batch ps->ready[idx[0..n)]: dtype, op, wire dtype and
 * scale factors are the same for all of it. Results that came with the
 * agreement are only copied out; a backend that streams gets the batch
 * whole; any other reduces it in pieces. */
static int run_allreduce(kolo__pset_t *ps, const size_t *idx, size_t n,
                         kolo__err_t *err)
{
    const kolo__ops_t *ops = ps->data_ops;
    size_t esize = kolo_dtype_size((kolo_dtype_t)ps->ready[idx[0]]->params.wire);
    size_t count = 0, carried = 0;

    for (size_t i = 0; i < n; i++) {
        count += (size_t)ps->ready[idx[i]]->params.count;
        carried += ps->ready[idx[i]]->carried != NULL;
    }
    if (count == 0)
        return KOLO_OK;
    if (carried == n)
        return run_carried(ps, idx, n, count, err);
    if (ops->allreduce_stream != NULL &&
        (ops->streams == NULL || ops->streams(ps->data_ctx, count, esize)))
        return run_allreduce_stream(ps, idx, n, count, err);
    return run_allreduce_pieces(ps, idx, n, count, err);
}

/* ---- the collectives, on host or device memory ----------------------------
 *
 * The bookkeeping of each collective (what every rank contributes, the
 * result's rows, splits and shape) is written once here; the bytes move
 * through the set's data backend (host tensors), or are queued on the
 * device backend's stream (CUDA tensors, `dev` not NULL: run_device
 * records the batch's event afterwards, inflight.c). */

static int run_broadcast(kolo__pset_t *ps, kolo__entry_t *e,
                         const kolo__dev_ops_t *dev, kolo__err_t *err)
{
    size_t bytes = (size_t)e->params.count *
                   kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    char detail[KOLO__ERR_LEN];
    int rc;

    if (bytes == 0)
        return KOLO_OK;
    if (dev != NULL)
        rc = dev->broadcast(ps->exec.dev_ctx, e->output, bytes,
                            e->params.root, detail, sizeof(detail));
    else
        rc = ps->data_ops->broadcast(ps->data_ctx, e->output, bytes,
                                     e->params.root, detail, sizeof(detail));
    return rc == KOLO_OK ? KOLO_OK : backend_error(ps, rc, e, 1, detail, err);
}

/* A new result of `rows` rows shaped like the entry's tensor, of `bytes`
 * bytes in host memory or (dev) the device's, with a split per rank. */
static int new_result(kolo__pset_t *ps, const kolo__entry_t *e, int64_t rows,
                      size_t bytes, const kolo__dev_ops_t *dev,
                      kolo__result_t **out, kolo__err_t *err)
{
    kolo__result_t *r = kolo__calloc(1, sizeof(*r));
    char detail[KOLO__ERR_LEN];
    int rc;

    *out = NULL;
    if (r == NULL || (r->splits = kolo__calloc((size_t)ps->size,
                                         sizeof(int64_t))) == NULL) {
        free(r);
        return no_memory(ps, e, bytes, err);
    }
    r->nsplits = ps->size;
    r->bytes = bytes;
    r->ndim = e->params.ndim;
    memcpy(r->shape, e->params.shape, sizeof(r->shape));
    r->shape[0] = rows;
    if (dev != NULL) {
        rc = dev->alloc(ps->exec.dev_ctx, bytes, &r->data, detail,
                        sizeof(detail));
        if (rc != KOLO_OK) {
            kolo__result_free(r);
            return backend_error(ps, rc, e, 1, detail, err);
        }
        r->data_free = dev->mem_free;
        r->device_type = KOLO_DEVICE_CUDA;
        r->device = e->device;
    } else if ((r->data = kolo__malloc(bytes ? bytes : 1)) == NULL) {
        kolo__result_free(r);
        return no_memory(ps, e, bytes, err);
    }
    *out = r;
    return KOLO_OK;
}

/* The end of a collective that has a result: the entry gets it, or fails
 * naming the tensor (the caller frees what is left in *res). */
static int attach(kolo__pset_t *ps, kolo__entry_t *e, int rc,
                  kolo__result_t **res, char *detail, kolo__err_t *err)
{
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e, 1, detail, err);
    e->result = *res;
    *res = NULL;
    return KOLO_OK;
}

/* Every rank learns `bytes` bytes of every rank's `mine` (a host value of
 * entry e: rows, splits): over the data backend for host tensors, over the
 * controller for CUDA tensors (the device backend moves device memory
 * only). */
static int exchange(kolo__pset_t *ps, const kolo__dev_ops_t *dev,
                    const kolo__entry_t *e, const void *mine, void *all,
                    size_t bytes, kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN];
    int rc;

    if (dev != NULL)
        rc = ps->ctl_ops->allgather(ps->ctl_ctx, mine, all, bytes, detail,
                                    sizeof(detail));
    else
        rc = ps->data_ops->allgather(ps->data_ctx, mine, all, bytes, detail,
                                     sizeof(detail));
    return rc == KOLO_OK ? KOLO_OK : backend_error(ps, rc, e, 1, detail, err);
}

static int run_allgather(kolo__pset_t *ps, kolo__entry_t *e,
                         const kolo__dev_ops_t *dev, kolo__err_t *err)
{
    size_t row_bytes = (size_t)e->params.count *
                       kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *rows = kolo__calloc((size_t)ps->size, sizeof(int64_t)), total = 0;
    size_t *bytes = kolo__calloc((size_t)ps->size, sizeof(size_t));
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int rc;

    if (rows == NULL || bytes == NULL) {
        rc = no_memory(ps, e, (size_t)ps->size * 16, err);
        goto out;
    }
    if (e->params.shape[0] > 0) {
        /* Into the caller's buffer (kolo_allgather_into_async): the ranks
         * agreed on the rows in negotiation. */
        for (int r = 0; r < ps->size; r++)
            rows[r] = e->params.shape[0];
    } else {
        /* The first dimension may differ: exchange it first. */
        rc = exchange(ps, dev, e, &e->rows, rows, sizeof(int64_t), err);
        if (rc != KOLO_OK)
            goto out;
    }
    for (int r = 0; r < ps->size; r++) {
        bytes[r] = (size_t)rows[r] * row_bytes;
        total += rows[r];
    }
    if (e->output != NULL) {
        const void *in = e->input;
        size_t mine = bytes[ps->rank];
        if (dev == NULL && (const uint8_t *)in < (uint8_t *)e->output +
                                                   (size_t)total * row_bytes &&
            (const uint8_t *)in + mine > (uint8_t *)e->output) {
            /* The input lies in the output (in place): the backends read
             * and write distinct buffers. */
            if (fusion_reserve(ps, mine) != 0) {
                rc = no_memory(ps, e, mine, err);
                goto out;
            }
            memcpy(ps->exec.fusion, in, mine);
            in = ps->exec.fusion;
        }
        if (dev != NULL)
            rc = dev->allgatherv(ps->exec.dev_ctx, in, e->output, bytes,
                                 detail, sizeof(detail));
        else
            rc = ps->data_ops->allgatherv(ps->data_ctx, in, e->output, bytes,
                                          detail, sizeof(detail));
        rc = rc == KOLO_OK ? KOLO_OK
                           : backend_error(ps, rc, e, 1, detail, err);
        goto out;
    }
    rc = new_result(ps, e, total, (size_t)total * row_bytes, dev, &res, err);
    if (rc != KOLO_OK)
        goto out;
    memcpy(res->splits, rows, (size_t)ps->size * sizeof(int64_t));
    if (dev != NULL)
        rc = dev->allgatherv(ps->exec.dev_ctx, e->input, res->data, bytes,
                             detail, sizeof(detail));
    else if (res->bytes > 0)
        rc = ps->data_ops->allgatherv(ps->data_ctx, e->input, res->data,
                                      bytes, detail, sizeof(detail));
    rc = attach(ps, e, rc, &res, detail, err);
out:
    kolo__result_free(res);
    free(rows);
    free(bytes);
    return rc;
}

static int run_alltoall(kolo__pset_t *ps, kolo__entry_t *e,
                        const kolo__dev_ops_t *dev, kolo__err_t *err)
{
    size_t n = (size_t)ps->size;
    size_t row_bytes = (size_t)e->params.count *
                       kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *all = kolo__calloc(n * n, sizeof(int64_t)), total = 0;
    size_t *sb = kolo__calloc(n, sizeof(size_t)), *rb = kolo__calloc(n, sizeof(size_t));
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int rc;

    if (all == NULL || sb == NULL || rb == NULL) {
        rc = no_memory(ps, e, n * n * 8, err);
        goto out;
    }
    /* Every rank learns every rank's splits: what it receives from rank j
     * is rank j's split for it. */
    rc = exchange(ps, dev, e, e->splits, all, n * sizeof(int64_t), err);
    if (rc != KOLO_OK)
        goto out;
    for (size_t j = 0; j < n; j++) {
        sb[j] = (size_t)e->splits[j] * row_bytes;
        rb[j] = (size_t)all[j * n + (size_t)ps->rank] * row_bytes;
        total += all[j * n + (size_t)ps->rank];
    }
    rc = new_result(ps, e, total, (size_t)total * row_bytes, dev, &res, err);
    if (rc != KOLO_OK)
        goto out;
    for (size_t j = 0; j < n; j++)
        res->splits[j] = all[j * n + (size_t)ps->rank];
    if (dev != NULL)
        rc = dev->alltoallv(ps->exec.dev_ctx, e->input, sb, res->data, rb,
                            detail, sizeof(detail));
    else
        rc = ps->data_ops->alltoallv(ps->data_ctx, e->input, sb, res->data,
                                     rb, detail, sizeof(detail));
    rc = attach(ps, e, rc, &res, detail, err);
out:
    kolo__result_free(res);
    free(all);
    free(sb);
    free(rb);
    return rc;
}

static int run_reducescatter(kolo__pset_t *ps, kolo__entry_t *e,
                             const kolo__dev_ops_t *dev, kolo__err_t *err)
{
    const kolo__params_t *p = &e->params;
    kolo_dtype_t dtype = (kolo_dtype_t)p->dtype;
    size_t esize = kolo_dtype_size(dtype);
    int64_t d0 = p->shape[0], row = d0 > 0 ? p->count / d0 : 0;
    size_t *counts = kolo__calloc((size_t)ps->size, sizeof(size_t));
    double post = kolo__postscale_factor(p->op, p->postscale, ps->size);
    char detail[KOLO__ERR_LEN];
    kolo__result_t *res = NULL;
    int64_t mine = 0;
    void *out;
    int rc = KOLO_OK;

    if (counts == NULL || (dev == NULL &&
                           fusion_reserve(ps, (size_t)p->count * esize) != 0)) {
        rc = no_memory(ps, e, (size_t)p->count * esize, err);
        goto done;
    }
    /* The first dimension is shared out: the first d0 % size ranks get one
     * row more. */
    for (int r = 0; r < ps->size; r++) {
        int64_t rows = d0 / ps->size + (r < d0 % ps->size ? 1 : 0);
        counts[r] = (size_t)(rows * row);
        if (r == ps->rank)
            mine = rows;
    }
    if (e->output != NULL) {
        /* Into the caller's buffer (kolo_reducescatter_into_async). */
        out = e->output;
    } else {
        rc = new_result(ps, e, mine, counts[ps->rank] * esize, dev, &res, err);
        if (rc != KOLO_OK)
            goto done;
        for (int r = 0; r < ps->size; r++)
            res->splits[r] = row > 0 ? (int64_t)counts[r] / row : 0;
        out = res->data;
    }
    if (dev != NULL) {
        rc = dev->reduce_scatter(ps->exec.dev_ctx, e->input, out,
                                 counts, p->dtype,
                                 p->op == KOLO_OP_AVERAGE ? KOLO_OP_SUM
                                                          : p->op,
                                 p->prescale, post,
                                 kolo__reduce_get(dtype, (kolo_op_t)p->op),
                                 detail, sizeof(detail));
    } else if (p->count > 0) {
        memcpy(ps->exec.fusion, e->input, (size_t)p->count * esize);
        if (p->prescale != 1.0)
            kolo__scale(ps->exec.fusion, (size_t)p->count, dtype, p->prescale);
        rc = ps->data_ops->reduce_scatter(
            ps->data_ctx, ps->exec.fusion, out, counts, esize,
            kolo__reduce_get(dtype, (kolo_op_t)p->op), detail, sizeof(detail));
        if (rc == KOLO_OK)
            kolo__scale(out, counts[ps->rank], dtype, post);
    }
    if (res != NULL)
        rc = attach(ps, e, rc, &res, detail, err);
    else if (rc != KOLO_OK)
        rc = backend_error(ps, rc, e, 1, detail, err);
done:
    kolo__result_free(res);
    free(counts);
    return rc;
}

/* ---- CUDA tensors ----------------------------------------------------------
 *
 * The device backend's context is the set's, created by its first device
 * batch (the same batch on every rank); these are what it asks of the
 * runtime. */

static int dev_allgather(void *arg, const void *in, void *out, size_t bytes,
                         char *err, size_t errlen)
{
    kolo__pset_t *ps = arg;
    return ps->ctl_ops->allgather(ps->ctl_ctx, in, out, bytes, err, errlen);
}

/* A host network context across hosts for the device backend: the set's
 * data backend when it is a network one, else the registry's default
 * between hosts. */
static int dev_connect(void *arg, const char *role, int rank, int size,
                       const int *members, const int *hosts,
                       const kolo__ops_t **ops, void **ctx, char *err,
                       size_t errlen)
{
    kolo__pset_t *ps = arg;
    kolo__ops_need_t need = {ps->size, 0, (int)ps->rt->cfg.mpi_launched,
                             ps->rt->rank, "", NULL};
    kolo__err_t cerr;
    int rc;

    *ops = ps->data_ops;
    if (*ops == NULL || !((*ops)->caps & KOLO__OPS_NETWORK)) {
        if (kolo__ops_choose(&need, ops, err, errlen) != KOLO_OK ||
            !((*ops)->caps & KOLO__OPS_NETWORK)) {
            snprintf(err, errlen, "hierarchical allreduce needs Gloo or MPI "
                     "between hosts, and this build has neither");
            return KOLO_ERR_UNSUPPORTED;
        }
    }
    rc = kolo__connect(ps, *ops, role, rank, size, members, hosts, NULL,
                            ctx, &cerr);
    if (rc != KOLO_OK)
        snprintf(err, errlen, "%s", cerr.msg);
    return rc;
}

static int dev_lost(void *arg, char *who, size_t len)
{
    kolo__pset_t *ps = arg;
    char prefix[32];

    snprintf(prefix, sizeof(prefix), "kolo%u", ps->rt->generation);
    return kolo__peers_lost(&ps->rt->cfg, prefix, ps->ranks, ps->size, who,
                            len, NULL);
}

static void dev_warn(const char *msg)
{
    kolo__log(KOLO__LOG_WARNING, "%s", msg);
}

/* The runtime's arithmetic for a device backend that computes on the host
 * (ops.h: kolo__host_math_t). */
static void math_convert(const void *src, int from, void *dst, int to,
                         size_t n)
{
    if (from == to)
        memcpy(dst, src, n * kolo_dtype_size((kolo_dtype_t)from));
    else if (from == KOLO_FLOAT32 && to == KOLO_FLOAT16)
        kolo__f32_to_f16(src, dst, n);
    else if (from == KOLO_FLOAT32 && to == KOLO_BFLOAT16)
        kolo__f32_to_bf16(src, dst, n);
    else if (from == KOLO_FLOAT16 && to == KOLO_FLOAT32)
        kolo__f16_to_f32(src, dst, n);
    else if (from == KOLO_BFLOAT16 && to == KOLO_FLOAT32)
        kolo__bf16_to_f32(src, dst, n);
}

static void math_scale(void *buf, size_t n, int dtype, double factor)
{
    kolo__scale_device(buf, n, (kolo_dtype_t)dtype, factor);
}

static void math_average(void *buf, size_t n, int dtype, int64_t divisor)
{
    kolo__average(buf, n, (kolo_dtype_t)dtype, divisor);
}

static kolo__ops_reduce_fn math_reduce(int dtype, int op)
{
    return kolo__reduce_get((kolo_dtype_t)dtype, (kolo_op_t)op);
}

static const kolo__host_math_t host_math = {
    .convert = math_convert, .scale = math_scale, .average = math_average,
    .reduce = math_reduce};

/* Whether every rank's device context started (dev_start), agreed over
 * the set's controller: `rc` and `detail` are this rank's; on a rank that
 * started, a failure of another becomes "rank R could not start ...:
 * why" (the first such rank), so that every rank names the cause instead
 * of the lost peer it would meet in the device's first collective. */
static int dev_agree(kolo__pset_t *ps, int rc, char *detail)
{
    enum { WHY = 240 };
    struct {
        int32_t code;
        char why[WHY];
    } mine, *all = kolo__calloc((size_t)ps->size, sizeof(*all));
    char cdetail[KOLO__ERR_LEN];
    int crc;

    if (all == NULL) {
        /* The others meet a lost peer, and learn why from what this rank
         * says when it stops (peers.c). */
        if (rc == KOLO_OK) {
            rc = KOLO_ERR_NO_MEMORY;
            snprintf(detail, KOLO__ERR_LEN, "out of memory agreeing whether "
                     "every rank's CUDA device started");
        }
        return rc;
    }
    memset(&mine, 0, sizeof(mine));
    mine.code = rc;
    if (rc != KOLO_OK) {
        size_t k = strnlen(detail, WHY - 1);
        memcpy(mine.why, detail, k); /* (cut to fit) */
    }
    crc = ps->ctl_ops->allgather(ps->ctl_ctx, &mine, all, sizeof(mine),
                                 cdetail, sizeof(cdetail));
    if (crc != KOLO_OK && rc == KOLO_OK) {
        rc = crc;
        snprintf(detail, KOLO__ERR_LEN, "%s", cdetail);
    } else if (crc == KOLO_OK && rc == KOLO_OK) {
        for (int r = 0; r < ps->size; r++)
            if (all[r].code != KOLO_OK) {
                all[r].why[WHY - 1] = '\0';
                snprintf(detail, KOLO__ERR_LEN,
                         "rank %d could not start its CUDA device: %s",
                         ps->ranks[r], all[r].why);
                rc = KOLO_ERR_BACKEND;
                break;
            }
    }
    free(all);
    return rc;
}

/* The set's device context, at its first device batch: on the device of
 * its tensors (a joined rank's stand-ins only: the device its local rank
 * would use). Every rank learns whether every rank's started. */
static int dev_start(kolo__pset_t *ps, const kolo__dev_ops_t *dev,
                     const size_t *idx, size_t n, char *detail)
{
    kolo__runtime_t *rt = ps->rt;
    kolo__dev_config_t cfg;
    int device = -1, count, rc = KOLO_OK, *hosts = NULL;

    for (size_t i = 0; i < n && device < 0; i++)
        device = ps->ready[idx[i]]->device;
    if (device < 0) {
        count = dev->device_count();
        if (count == 0) {
            snprintf(detail, KOLO__ERR_LEN, "rank %d has joined and must take "
                     "part in a CUDA allreduce, but sees no CUDA device",
                     rt->rank);
            rc = KOLO_ERR_UNSUPPORTED;
        }
        device = count > 0 ? (int)(rt->cfg.local_rank % count) : 0;
    }
    if (rc == KOLO_OK && rt->host_of != NULL) {
        hosts = kolo__malloc((size_t)ps->size * sizeof(int));
        if (hosts == NULL) {
            snprintf(detail, KOLO__ERR_LEN, "out of memory for GPU state");
            rc = KOLO_ERR_NO_MEMORY;
        } else {
            for (int i = 0; i < ps->size; i++)
                hosts[i] = rt->host_of[ps->ranks[i]];
        }
    }
    if (rc == KOLO_OK) {
        cfg = (kolo__dev_config_t){
            .rank = ps->rank, .size = ps->size, .members = ps->ranks,
            .hosts = hosts, .set_id = ps->id, .device = device,
            .hierarchical = rt->cfg.hierarchical == 1,
            .timeout_s = rt->cfg.timeout_s, .allgather = dev_allgather,
            .connect = dev_connect, .lost = dev_lost, .warn = dev_warn,
            .arg = ps, .math = &host_math};
        rc = dev->init(&cfg, &ps->exec.dev_ctx, detail, KOLO__ERR_LEN);
        free(hosts);
    }
    return dev_agree(ps, rc, detail);
}

static int run_allreduce_device(kolo__pset_t *ps, const kolo__dev_ops_t *dev,
                                const size_t *idx, size_t n,
                                kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    const kolo__params_t *p = &e0->params;
    kolo__dev_tensor_t *ts;
    size_t count = 0;
    char detail[KOLO__ERR_LEN];
    int rc;

    for (size_t i = 0; i < n; i++)
        count += (size_t)ps->ready[idx[i]]->params.count;
    if (count == 0)
        return KOLO_OK;
    ts = kolo__malloc(n * sizeof(*ts));
    if (ts == NULL)
        return no_memory(ps, e0, n * sizeof(*ts), err);
    for (size_t i = 0; i < n; i++) {
        kolo__entry_t *e = ps->ready[idx[i]];
        /* A joined rank's stand-in has no device: zeros. */
        ts[i] = (kolo__dev_tensor_t){e->device < 0 ? NULL : e->input,
                                     e->output, (size_t)e->params.count};
    }
    /* AVERAGE is the backend's to do (ops.h): NCCL averages the way
     * Horovod asks it to. */
    rc = dev->allreduce(
        ps->exec.dev_ctx, ts, n, p->dtype, p->wire, p->op, p->prescale,
        p->postscale,
        kolo__reduce_get((kolo_dtype_t)p->wire,
                         p->op == KOLO_OP_AVERAGE ? KOLO_OP_SUM
                                                  : (kolo_op_t)p->op),
        detail, sizeof(detail));
    free(ts);
    return rc == KOLO_OK ? KOLO_OK : backend_error(ps, rc, e0, n, detail, err);
}

/* Runs the collective of a batch, on host tensors (dev NULL) or CUDA
 * tensors (queued on the device backend's stream). A barrier is done once
 * negotiated: every rank has entered it by then. */
static int run_coll(kolo__pset_t *ps, const kolo__dev_ops_t *dev,
                    const size_t *idx, size_t n, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];

    switch (e0->params.coll) {
    case KOLO__COLL_ALLREDUCE:
        return dev != NULL ? run_allreduce_device(ps, dev, idx, n, err)
                           : run_allreduce(ps, idx, n, err);
    case KOLO__COLL_BROADCAST: return run_broadcast(ps, e0, dev, err);
    case KOLO__COLL_ALLGATHER: return run_allgather(ps, e0, dev, err);
    case KOLO__COLL_ALLTOALL: return run_alltoall(ps, e0, dev, err);
    case KOLO__COLL_REDUCESCATTER: return run_reducescatter(ps, e0, dev, err);
    default:
        if (dev == NULL)
            return KOLO_OK;
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "%s has no GPU path",
                             kolo__coll_name(e0->params.coll));
    }
}

/* After a device batch was queued: its completion (the event after its
 * work), in the set's list of batches in flight and on every entry, so
 * that the handles complete now and order their results on the program's
 * streams (inflight.c). *done keeps the caller's reference. */
static int track_device(kolo__pset_t *ps, const kolo__dev_ops_t *dev,
                        const size_t *idx, size_t n, kolo__done_t **done,
                        kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    char detail[KOLO__ERR_LEN], what[KOLO_MAX_NAME_LEN + 96];
    void *event = NULL;
    int rc;

    rc = dev->record(ps->exec.dev_ctx, &event, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    *done = kolo__done_new(dev, event);
    if (*done == NULL)
        return no_memory(ps, e0, sizeof(kolo__done_t), err);
    if (n > 1)
        snprintf(what, sizeof(what), "%s of CUDA tensor '%s' fused with %zu "
                 "others", kolo__coll_name(e0->params.coll), e0->name, n - 1);
    else
        snprintf(what, sizeof(what), "%s of CUDA tensor '%s' (%lld %s, device "
                 "%d)", kolo__coll_name(e0->params.coll), e0->name,
                 (long long)e0->params.count,
                 kolo_dtype_name((kolo_dtype_t)e0->params.dtype), e0->device);
    if (kolo__inflight_add(&ps->exec.inflight, *done, what) != KOLO_OK) {
        /* Nothing to watch it with: wait for the device here instead. */
        rc = kolo__done_settle(*done, NULL, 1, err);
        if (rc != KOLO_OK)
            return rc;
    }
    for (size_t i = 0; i < n; i++)
        ps->ready[idx[i]]->done = *done;
    return KOLO_OK;
}

/* A timed batch's completion gets its marks (taking them), the tensors'
 * names for their lanes, and the set's list the timeline (inflight.c). */
static int time_batch(kolo__pset_t *ps, kolo__done_t *d, const size_t *idx,
                      size_t n, void *marks[2], int64_t queued_us)
{
    const kolo__entry_t *e0 = ps->ready[idx[0]];
    size_t len = 1;
    char *p;

    for (size_t i = 0; i < n; i++)
        len += strlen(ps->ready[idx[i]]->name) + 1;
    if ((d->lanes = kolo__malloc(len)) == NULL)
        return KOLO_ERR_NO_MEMORY;
    p = d->lanes;
    d->bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const kolo__entry_t *e = ps->ready[idx[i]];
        size_t l = strlen(e->name) + 1;
        memcpy(p, e->name, l);
        p += l;
        d->bytes += e->params.count *
                    (int64_t)kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    }
    *p = '\0';
    d->ntensors = (int)n;
    /* (a joined rank's stand-in has no device) */
    d->device = e0->device;
    for (size_t i = 0; i < n && d->device < 0; i++)
        d->device = ps->ready[idx[i]]->device;
    d->queued_us = queued_us;
    d->phase = kolo__phase_names("nccl")[e0->params.coll];
    d->t_start = marks[0];
    d->t_end = marks[1];
    marks[0] = marks[1] = NULL;
    ps->exec.inflight.tl = ps->rt->timeline;
    return KOLO_OK;
}

/* The ready events kolo's stream must wait for: per program stream only
 * the last one recorded (the entry enqueued last: handles grow), since the
 * events of one stream pass in the order they were recorded. A batch of a
 * thousand small tensors from one stream waits for one event. Returns how
 * many were written to events. */
static size_t last_events(kolo__pset_t *ps, const size_t *idx, size_t n,
                          void **events)
{
    size_t nev = 0;
    /* streams[k] owns events[k]; the latest entry's handle in last[k] */
    void *streams[16];
    kolo_handle_t last[16];

    for (size_t i = 0; i < n; i++) {
        const kolo__entry_t *e = ps->ready[idx[i]];
        size_t k;
        if (e->ready_event == NULL)
            continue;
        for (k = 0; k < nev && k < 16; k++)
            if (streams[k] == e->stream)
                break;
        if (k < nev && k < 16) {
            if (e->handle > last[k]) {
                last[k] = e->handle;
                events[k] = e->ready_event;
            }
            continue;
        }
        /* A new stream (past 16 streams every event is kept). */
        if (nev < 16) {
            streams[nev] = e->stream;
            last[nev] = e->handle;
        }
        events[nev++] = e->ready_event;
    }
    return nev;
}

/* A batch of CUDA tensors: the device context (made at the first), the
 * program's work on the inputs first, then the collective, queued; *done
 * gets the batch's completion (NULL when nothing was queued). */
static int run_device(kolo__pset_t *ps, const size_t *idx, size_t n,
                      kolo__done_t **done, kolo__err_t *err)
{
    const kolo__dev_ops_t *dev = kolo__ops_device();
    kolo__entry_t *e0 = ps->ready[idx[0]];
    char detail[KOLO__ERR_LEN];
    void **events, *marks[2] = {NULL, NULL};
    int timed = dev != NULL && dev->mark != NULL && dev->event_time != NULL &&
                kolo__timeline_active(ps->rt->timeline);
    int64_t queued_us = timed ? kolo__now_us() : 0; /* (the timeline's) */
    int rc;

    *done = NULL;
    if (dev == NULL)
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "tensor '%s' is on a "
                             "CUDA device in a build without GPU support",
                             e0->name);
    rc = ps->exec.dev_ctx == NULL ? dev_start(ps, dev, idx, n, detail)
                                  : KOLO_OK;
    if (rc == KOLO_OK)
        rc = dev->begin(ps->exec.dev_ctx, detail, sizeof(detail));
    if (rc == KOLO_OK) {
        size_t nev = 0;
        events = kolo__malloc(n * sizeof(*events));
        if (events == NULL)
            return no_memory(ps, e0, n * sizeof(*events), err);
        nev = last_events(ps, idx, n, events);
        rc = dev->wait_events(ps->exec.dev_ctx, events, nev, detail,
                              sizeof(detail));
        free(events);
    }
    if (rc != KOLO_OK)
        return backend_error(ps, rc, e0, n, detail, err);
    /* The timeline's device side: timed events around the work. A mark
     * that fails leaves the batch untimed, nothing else. */
    if (timed && dev->mark(ps->exec.dev_ctx, 0, NULL, &marks[0]) != KOLO_OK)
        marks[0] = NULL;
    rc = run_coll(ps, dev, idx, n, err);
    if (rc == KOLO_OK && marks[0] != NULL &&
        dev->mark(ps->exec.dev_ctx, 0, NULL, &marks[1]) != KOLO_OK)
        marks[1] = NULL;
    if (rc == KOLO_OK)
        rc = track_device(ps, dev, idx, n, done, err);
    if (rc == KOLO_OK && marks[1] != NULL &&
        time_batch(ps, *done, idx, n, marks, queued_us) == KOLO_OK)
        return KOLO_OK;
    for (int i = 0; i < 2; i++)
        if (marks[i] != NULL)
            dev->event_free(marks[i]);
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

/* The plan's batches (kolo__fusion_plan) into order and batches: their
 * number, or -1 for want of memory. */
static long plan(kolo__pset_t *ps, kolo__fusion_item_t *items, size_t *order,
                 kolo__batch_t *batches)
{
    const kolo__params_t *scales[256];
    uint32_t nscales = 0;

    for (size_t i = 0; i < ps->nready; i++) {
        const kolo__params_t *p = &ps->ready[i]->params;
        items[i].key = fusion_key(p, scales, &nscales);
        items[i].bytes = p->count * (int64_t)kolo_dtype_size((kolo_dtype_t)p->wire);
        if (items[i].key == 0xffffffffu)
            items[i].bytes = INT64_MAX; /* alone */
    }
    return kolo__fusion_plan(items, ps->nready,
                             kolo__tuned(ps)->fusion_threshold, order, batches);
}

/* One batch of the plan, between the timeline's spans: its QUEUE ends,
 * and a collective other than a host allreduce (whose phases are its own)
 * gets the backend's span. *done: a device batch's completion. */
static int run_batch(kolo__pset_t *ps, const size_t *idx, size_t n,
                     kolo__done_t **done, kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    int other = e0->params.coll != KOLO__COLL_ALLREDUCE;
    int gpu = e0->params.device_type == KOLO_DEVICE_CUDA &&
              e0->params.coll <= KOLO__COLL_REDUCESCATTER;
    int rc;

    kolo__tl_batch(ps, idx, n, NULL); /* QUEUE ends */
    if (other || gpu)
        kolo__tl_batch(ps, idx, n,
                       gpu ? kolo__phase_names("nccl")[e0->params.coll]
                           : kolo__backend_phase(ps, e0->params.coll));
    rc = gpu ? run_device(ps, idx, n, done, err) : run_coll(ps, NULL, idx, n, err);
    if (other || gpu)
        kolo__tl_batch(ps, idx, n, NULL);
    return rc;
}

/* Every entry of a batch ends: completed, or failed with its error. */
static void end_batch(kolo__pset_t *ps, const size_t *idx, size_t n, int rc,
                      const kolo__err_t *err)
{
    for (size_t i = 0; i < n; i++) {
        kolo__entry_t *e = ps->ready[idx[i]];
        ps->ready[idx[i]] = NULL;
        if (rc == KOLO_OK)
            kolo__complete(ps, e, KOLO_OK, NULL);
        else
            kolo__fail_entry(ps, e, err);
    }
}

/* The flight recorder (flight.c): every entry of the plan is ready. */
static void flight_ready(kolo__pset_t *ps)
{
    int64_t now;

    if (ps->rt->flight == NULL)
        return;
    now = kolo__now_us();
    for (size_t i = 0; i < ps->nready; i++)
        kolo__flight_ready(ps, ps->ready[i], now);
}

/* ... and a batch goes to the backend: its entries, and its bytes. */
static void flight_started(kolo__pset_t *ps, const size_t *idx, size_t n,
                           kolo__entry_t **es)
{
    size_t bytes = 0;

    if (ps->rt->flight == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        es[i] = ps->ready[idx[i]];
        bytes += (size_t)es[i]->params.count *
                 kolo_dtype_size((kolo_dtype_t)es[i]->params.dtype);
    }
    kolo__flight_started(ps, es, n, bytes, kolo__now_us());
}

/* Executes the plan in ps->ready; completes every entry of it. */
int kolo__execute(kolo__pset_t *ps, kolo__err_t *err)
{
    size_t n = ps->nready;
    kolo__fusion_item_t *items;
    size_t *order;
    kolo__batch_t *batches;
    kolo__entry_t **es; /* a batch's entries (the flight recorder's) */
    long nb = 0;
    int rc = KOLO_OK;

    if (n == 0)
        return KOLO_OK;
    flight_ready(ps);
    items = kolo__malloc(n * sizeof(*items));
    order = kolo__malloc(n * sizeof(*order));
    batches = kolo__malloc(n * sizeof(*batches));
    es = ps->rt->flight != NULL ? kolo__malloc(n * sizeof(*es)) : NULL;
    if (items == NULL || order == NULL || batches == NULL ||
        (ps->rt->flight != NULL && es == NULL) ||
        (nb = plan(ps, items, order, batches)) < 0)
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "rank %d: out of memory planning %zu tensors",
                           ps->rank, n);
    for (long b = 0; b < nb && rc == KOLO_OK; b++) {
        const size_t *idx = order + batches[b].first;
        kolo__done_t *done = NULL;

        flight_started(ps, idx, batches[b].n, es);
        rc = run_batch(ps, idx, batches[b].n, &done, err);
        end_batch(ps, idx, batches[b].n, rc, err);
        kolo__done_release(done);
    }
    /* After a failure, what is left of the plan fails with it: the backend
     * is broken or memory ran out. */
    for (size_t i = 0; rc != KOLO_OK && i < n; i++)
        if (ps->ready[i] != NULL)
            kolo__fail_entry(ps, ps->ready[i], err);
    ps->nready = 0;
    free(items);
    free(order);
    free(batches);
    free(es);
    return rc;
}
