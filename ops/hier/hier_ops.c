/*
 * hier_ops.c — hierarchical allreduce for jobs that span hosts with several
 * ranks on each: shared memory within a host, a network backend across.
 *
 * A context holds three inner contexts:
 *   local  the members on this rank's host, over shared memory (ops/shm);
 *   cross  the members with this rank's local index on every host, over
 *          the network backend (cfg->cross_ops: gloo or mpi);
 *   flat   every member over the network backend, for the collectives
 *          other than allreduce, which have nothing to gain here.
 * Allreduce of a piece: a reduce-scatter through shared memory leaves each
 * local rank the sum of its host's share; the local ranks allreduce their
 * shares across hosts at the same time, each over its own connections; an
 * allgather through shared memory gives every rank the whole result. Each
 * host sends 1/L of the bytes per rank over the network instead of all of
 * them.
 *
 * Every host must hold the same number of members (the runtime chooses this
 * backend only then); members are ordered by host, then by rank.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "hosts.h"
#include "ops.h"
#include "shm/shm_ops.h"

typedef struct hier_ctx {
    const kolo__ops_t *net, *shm;
    void *local, *cross, *flat;
    int nlocal, nhosts;
    int me_local;    /* this rank's index among its host's */
    size_t *counts;  /* [nlocal]: elements of each local rank's share */
    size_t *bytes;   /* [nlocal] */
    uint8_t *shard;  /* a streamed allreduce's share of this rank */
    size_t shard_cap;
} hier_ctx_t;

static void hier_finalize(void *ctx)
{
    hier_ctx_t *h = ctx;

    if (h == NULL)
        return;
    if (h->flat != NULL)
        h->net->finalize(h->flat);
    if (h->cross != NULL)
        h->net->finalize(h->cross);
    if (h->local != NULL)
        h->shm->finalize(h->local);
    free(h->counts);
    free(h->bytes);
    free(h->shard);
    free(h);
}

/* Starts `ops` on part of cfg's ranks: this rank as `rank` of `size`, with
 * those members and hosts, its keys under prefix; its context into *ctx. */
static int sub_init(const kolo__ops_t *ops, const kolo__ops_config_t *cfg,
                    int rank, int size, const int *members, const int *hosts,
                    const char *prefix, void **ctx, char *err, size_t errlen)
{
    kolo__ops_config_t sub = *cfg;

    sub.rank = rank;
    sub.size = size;
    sub.members = members;
    sub.hosts = hosts;
    sub.prefix = prefix;
    return ops->init(&sub, ctx, err, errlen);
}

/* Whom this rank meets in its host's context and in its cross-host one:
 * the members grouped by host, and each inner context's members and
 * hosts. */
typedef struct hier_plan {
    kolo__hosts_t g;
    int *lmem, *lhost; /* [nlocal]: this rank's host */
    int *xmem, *xhost; /* [nhosts]: this local index on every host */
} hier_plan_t;

static void plan_free(hier_plan_t *p)
{
    free(p->lmem), free(p->lhost), free(p->xmem), free(p->xhost);
    kolo__hosts_free(&p->g);
}

static int hier_oom(char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory starting hierarchical allreduce");
    return KOLO_ERR_NO_MEMORY;
}

/* The backends underneath: shared memory within a host, cfg->cross_ops
 * across. */
static int find_backends(hier_ctx_t *h, const kolo__ops_config_t *cfg,
                         char *err, size_t errlen)
{
    h->net = cfg->cross_ops != NULL ? kolo__ops_find(cfg->cross_ops) : NULL;
    h->shm = kolo__ops_find("shm");
    if (h->net == NULL || h->shm == NULL || cfg->hosts == NULL) {
        snprintf(err, errlen, "hierarchical allreduce needs shared memory and "
                 "the '%s' backend in this build",
                 cfg->cross_ops ? cfg->cross_ops : "(none)");
        return KOLO_ERR_UNSUPPORTED;
    }
    return KOLO_OK;
}

/* Groups the members by host (every host must hold as many) and lists
 * the members of this rank's host and those with its local index. */
static int plan_make(hier_plan_t *p, hier_ctx_t *h,
                     const kolo__ops_config_t *cfg, char *err, size_t errlen)
{
    kolo__hosts_t *g = &p->g;

    if (kolo__hosts_group(cfg->hosts, cfg->size, cfg->rank, g) != 0)
        return hier_oom(err, errlen);
    h->nlocal = g->nlocal;
    h->nhosts = g->nhosts;
    h->me_local = g->me_local;
    if (!g->same) {
        snprintf(err, errlen, "hierarchical allreduce needs the same number "
                 "of ranks on every host: %d ranks on %d hosts, %d on this one",
                 cfg->size, h->nhosts, h->nlocal);
        return KOLO_ERR_UNSUPPORTED;
    }
    p->lmem = kolo__malloc((size_t)g->nlocal * sizeof(int));
    p->lhost = kolo__malloc((size_t)g->nlocal * sizeof(int));
    p->xmem = kolo__malloc((size_t)g->nhosts * sizeof(int));
    p->xhost = kolo__malloc((size_t)g->nhosts * sizeof(int));
    if (!p->lmem || !p->lhost || !p->xmem || !p->xhost)
        return hier_oom(err, errlen);
    for (int j = 0; j < g->nlocal; j++) {
        p->lmem[j] = cfg->members[g->local[j]];
        p->lhost[j] = cfg->hosts[g->local[j]];
    }
    for (int k = 0; k < g->nhosts; k++) {
        p->xmem[k] = cfg->members[g->cross[k]];
        p->xhost[k] = cfg->hosts[g->cross[k]];
    }
    return KOLO_OK;
}

/* Starts the three inner contexts (the essay), each under a prefix of its
 * own. */
static int start_inner(hier_ctx_t *h, const kolo__ops_config_t *cfg,
                       const hier_plan_t *p, char *err, size_t errlen)
{
    char prefix[256];
    int rc;

    snprintf(prefix, sizeof(prefix), "%s/host%d", cfg->prefix,
             cfg->hosts[cfg->rank]);
    rc = sub_init(h->shm, cfg, p->g.me_local, h->nlocal, p->lmem, p->lhost,
                  prefix, &h->local, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    snprintf(prefix, sizeof(prefix), "%s/cross%d", cfg->prefix, p->g.me_local);
    rc = sub_init(h->net, cfg, p->g.me_host, h->nhosts, p->xmem, p->xhost,
                  prefix, &h->cross, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    snprintf(prefix, sizeof(prefix), "%s/flat", cfg->prefix);
    return sub_init(h->net, cfg, cfg->rank, cfg->size, cfg->members,
                    cfg->hosts, prefix, &h->flat, err, errlen);
}

static int hier_init(const kolo__ops_config_t *cfg, void **out, char *err,
                     size_t errlen)
{
    hier_ctx_t *h = kolo__calloc(1, sizeof(*h));
    hier_plan_t p = {.lmem = NULL};
    int rc;

    *out = NULL;
    if (h == NULL)
        return hier_oom(err, errlen);
    if ((rc = find_backends(h, cfg, err, errlen)) == KOLO_OK &&
        (rc = plan_make(&p, h, cfg, err, errlen)) == KOLO_OK &&
        (rc = start_inner(h, cfg, &p, err, errlen)) == KOLO_OK) {
        h->counts = kolo__calloc((size_t)h->nlocal, sizeof(size_t));
        h->bytes = kolo__calloc((size_t)h->nlocal, sizeof(size_t));
        if (h->counts == NULL || h->bytes == NULL)
            rc = hier_oom(err, errlen);
    }
    plan_free(&p);
    if (rc != KOLO_OK) {
        hier_finalize(h);
        return rc;
    }
    *out = h;
    return KOLO_OK;
}

/* Each local rank's share of a batch of count elements: the first ones
 * ceil(count / nlocal) each, the last what is left (maybe none). */
static void shares(hier_ctx_t *h, size_t count, size_t esize)
{
    size_t share = (count + (size_t)h->nlocal - 1) / (size_t)h->nlocal;
    size_t left = count;

    for (int j = 0; j < h->nlocal; j++) {
        h->counts[j] = left < share ? left : share;
        h->bytes[j] = h->counts[j] * esize;
        left -= h->counts[j];
    }
}

/* This rank's share as a stream of its own for the network backend's
 * streamed allreduce: element x is element offs + x of the batch, read
 * and reduced where the batch's results stay (s->place). */
typedef struct share_stream {
    const kolo__ops_stream_t *s;
    size_t offs, esize;
} share_stream_t;

static void *share_place(void *arg, size_t at, size_t n, size_t *run)
{
    const share_stream_t *sh = arg;
    return sh->s->place(sh->s->arg, sh->offs + at, n, run);
}

/* (the share's input is the reduce-scatter's result, where it stays) */
static const void *share_view(void *arg, size_t at, size_t n, size_t *run)
{
    return share_place(arg, at, n, run);
}

static void share_fill(void *arg, void *dst, size_t at, size_t n)
{
    const share_stream_t *sh = arg;
    for (size_t k = 0, run = 0; k < n; k += run) {
        const void *p = share_place(arg, at + k, n - k, &run);
        memcpy((uint8_t *)dst + k * sh->esize, p, run * sh->esize);
    }
}

static void share_drain(void *arg, const void *src, size_t at, size_t n)
{
    const share_stream_t *sh = arg;
    for (size_t k = 0, run = 0; k < n; k += run) {
        void *p = share_place(arg, at + k, n - k, &run);
        memcpy(p, (const uint8_t *)src + k * sh->esize, run * sh->esize);
    }
}

static void share_finish(void *arg, void *buf, size_t n)
{
    const share_stream_t *sh = arg;
    sh->s->finish(sh->s->arg, buf, n);
}

/* One piece of a batch (hier_allreduce_stream cuts it), taken from and
 * returned through a stream (ops.h): the user's tensors go straight into
 * the shared slots (this rank's own block read where it lies), and the
 * results straight from the slots into the output tensors, with no fusion
 * buffer in between. This rank's share of the result is reduced where it
 * stays, in the output tensors, where the stream places results and the
 * network backend streams too (kolo's ring over Gloo), and allreduced
 * across hosts there; else it is reduced into a buffer of this context's,
 * allreduced and finished there, and copied out with the others. */
static int allreduce_piece(hier_ctx_t *h, size_t count, size_t esize,
                           kolo__ops_reduce_fn reduce,
                           const kolo__ops_stream_t *s, char *err,
                           size_t errlen)
{
    size_t mine, offs = 0;
    int rc;

    shares(h, count, esize);
    mine = h->counts[h->me_local];
    for (int j = 0; j < h->me_local; j++)
        offs += h->counts[j];
    if (s->place != NULL && h->nhosts > 1 && mine > 0 &&
        h->net->allreduce_stream != NULL &&
        (h->net->streams == NULL || h->net->streams(h->cross, mine, esize))) {
        share_stream_t sh = {s, offs, esize};
        kolo__ops_stream_t sub = {share_fill, share_view,
                                  s->finish != NULL ? share_finish : NULL,
                                  share_drain, share_place, &sh};
        rc = kolo__shm_reduce_scatter_stream(h->local, s, NULL, h->counts,
                                             esize, reduce, err, errlen);
        if (rc == KOLO_OK)
            rc = h->net->allreduce_stream(h->cross, mine, esize, reduce, &sub,
                                          err, errlen);
        if (rc == KOLO_OK)
            rc = kolo__shm_allgather_stream(h->local, NULL, s, h->counts,
                                            esize, err, errlen);
        return rc;
    }
    /* (a rank whose share is empty touches no buffer: h->shard may stay
     * NULL then) */
    if (h->bytes[h->me_local] > h->shard_cap) {
        uint8_t *p = kolo__realloc(h->shard, h->bytes[h->me_local]);
        if (p == NULL) {
            snprintf(err, errlen, "out of memory for a %zu-byte share of a "
                     "hierarchical allreduce", h->bytes[h->me_local]);
            return KOLO_ERR_NO_MEMORY;
        }
        h->shard = p;
        h->shard_cap = h->bytes[h->me_local];
    }
    rc = kolo__shm_reduce_scatter_stream(h->local, s, h->shard, h->counts,
                                         esize, reduce, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    if (h->nhosts > 1 && mine > 0) {
        rc = h->net->allreduce(h->cross, NULL, h->shard, mine, esize, reduce,
                               err, errlen);
        if (rc != KOLO_OK)
            return rc;
    }
    if (s->finish != NULL && mine > 0)
        s->finish(s->arg, h->shard, mine);
    return kolo__shm_allgather_stream(h->local, h->shard, s, h->counts, esize,
                                      err, errlen);
}

/* A piece of a stream: its element x is element base + x of the batch. */
typedef struct piece_stream {
    const kolo__ops_stream_t *s;
    size_t base;
} piece_stream_t;

static void piece_fill(void *arg, void *dst, size_t at, size_t n)
{
    const piece_stream_t *p = arg;
    p->s->fill(p->s->arg, dst, p->base + at, n);
}

static const void *piece_view(void *arg, size_t at, size_t n, size_t *run)
{
    const piece_stream_t *p = arg;
    return p->s->view(p->s->arg, p->base + at, n, run);
}

static void piece_finish(void *arg, void *buf, size_t n)
{
    const piece_stream_t *p = arg;
    p->s->finish(p->s->arg, buf, n);
}

static void piece_drain(void *arg, const void *src, size_t at, size_t n)
{
    const piece_stream_t *p = arg;
    p->s->drain(p->s->arg, src, p->base + at, n);
}

static void *piece_place(void *arg, size_t at, size_t n, size_t *run)
{
    const piece_stream_t *p = arg;
    return p->s->place(p->s->arg, p->base + at, n, run);
}

/* Allreduce of a batch through a stream, as the runtime calls it, in
 * pieces of PIECE_STEP_BYTES per rank and host (each ring step across
 * hosts then moves PIECE_STEP_BYTES): a piece's shares, its ring and its
 * copies out stay in cache, where a whole batch went through each stage
 * at memory speed. A 2x2 ResNet-50 step took 0.49x raw Gloo's time in
 * 1 MiB pieces against 0.54x whole, and with hosts joined by 4 Gbit/s
 * links 0.66x against 0.89x. Smaller pieces were faster still here
 * (0.40x in 256K), but every piece costs the ring's 2(n-1) steps of
 * latency, which across many real hosts would dominate. */
#define PIECE_STEP_BYTES ((size_t)256 << 10)

static int hier_allreduce_stream(void *ctx, size_t count, size_t esize,
                                 kolo__ops_reduce_fn reduce,
                                 const kolo__ops_stream_t *s, char *err,
                                 size_t errlen)
{
    hier_ctx_t *h = ctx;
    size_t piece = PIECE_STEP_BYTES * (size_t)h->nlocal * (size_t)h->nhosts /
                   esize;
    int rc = KOLO_OK;

    if (piece == 0 || count <= piece)
        return allreduce_piece(h, count, esize, reduce, s, err, errlen);
    for (size_t base = 0; base < count && rc == KOLO_OK; base += piece) {
        piece_stream_t p = {s, base};
        kolo__ops_stream_t sub = {piece_fill, s->view ? piece_view : NULL,
                                  s->finish ? piece_finish : NULL, piece_drain,
                                  s->place ? piece_place : NULL, &p};
        rc = allreduce_piece(h, count - base < piece ? count - base : piece,
                             esize, reduce, &sub, err, errlen);
    }
    return rc;
}

/* A buffer as a stream (for hier_allreduce): input read where it lies,
 * results written where they stay. */
typedef struct buf_stream {
    const uint8_t *in;
    uint8_t *out;
    size_t esize;
} buf_stream_t;

static void buf_fill(void *arg, void *dst, size_t at, size_t n)
{
    const buf_stream_t *b = arg;
    memcpy(dst, b->in + at * b->esize, n * b->esize);
}

static const void *buf_view(void *arg, size_t at, size_t n, size_t *run)
{
    const buf_stream_t *b = arg;
    *run = n;
    return b->in + at * b->esize;
}

static void buf_drain(void *arg, const void *src, size_t at, size_t n)
{
    const buf_stream_t *b = arg;
    memcpy(b->out + at * b->esize, src, n * b->esize);
}

static void *buf_place(void *arg, size_t at, size_t n, size_t *run)
{
    const buf_stream_t *b = arg;
    *run = n;
    return b->out + at * b->esize;
}

static int hier_allreduce(void *ctx, const void *in, void *out, size_t count,
                          size_t esize, kolo__ops_reduce_fn reduce, char *err,
                          size_t errlen)
{
    /* (in place too: every rank reads its input before any result of the
     * allgather is written back, and peers read only the slots) */
    buf_stream_t b = {in != NULL ? in : out, out, esize};
    kolo__ops_stream_t s = {buf_fill, buf_view, NULL, buf_drain, buf_place,
                            &b};
    return hier_allreduce_stream(ctx, count, esize, reduce, &s, err, errlen);
}

static int hier_allgather(void *ctx, const void *in, void *out, size_t bytes,
                          char *err, size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->allgather(h->flat, in, out, bytes, err, errlen);
}

static int hier_gather(void *ctx, const void *in, void *out, size_t bytes,
                       int root, char *err, size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->gather(h->flat, in, out, bytes, root, err, errlen);
}

static int hier_broadcast(void *ctx, void *buf, size_t bytes, int root,
                          char *err, size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->broadcast(h->flat, buf, bytes, root, err, errlen);
}

static int hier_allgatherv(void *ctx, const void *in, void *out,
                           const size_t *bytes, char *err, size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->allgatherv(h->flat, in, out, bytes, err, errlen);
}

static int hier_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                          void *out, const size_t *recv_bytes, char *err,
                          size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->alltoallv(h->flat, in, send_bytes, out, recv_bytes, err,
                             errlen);
}

static int hier_reduce_scatter(void *ctx, void *work, void *out,
                               const size_t *counts, size_t esize,
                               kolo__ops_reduce_fn reduce, char *err,
                               size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->reduce_scatter(h->flat, work, out, counts, esize, reduce,
                                  err, errlen);
}

static int hier_wake_peers(void *ctx, uint64_t round, char *err, size_t errlen)
{
    hier_ctx_t *h = ctx;
    return h->net->wake_peers(h->flat, round, err, errlen);
}

const kolo__ops_t kolo__ops_hier = {
    .name = "hier",
    .caps = KOLO__OPS_HOSTS,
    .init = hier_init,
    .finalize = hier_finalize,
    .allreduce = hier_allreduce,
    .allgather = hier_allgather,
    .gather = hier_gather,
    .broadcast = hier_broadcast,
    .allgatherv = hier_allgatherv,
    .alltoallv = hier_alltoallv,
    .reduce_scatter = hier_reduce_scatter,
    .wake_peers = hier_wake_peers,
    .allreduce_stream = hier_allreduce_stream,
};
