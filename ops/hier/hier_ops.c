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

#include "hosts.h"
#include "ops.h"

typedef struct hier_ctx {
    const kolo__ops_t *net, *shm;
    void *local, *cross, *flat;
    int nlocal, nhosts;
    int me_local;    /* this rank's index among its host's */
    size_t *counts;  /* [nlocal]: elements of each local rank's share */
    size_t *bytes;   /* [nlocal] */
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
    free(h);
}

static int hier_init(const kolo__ops_config_t *cfg, void **out, char *err,
                     size_t errlen)
{
    hier_ctx_t *h = calloc(1, sizeof(*h));
    int *lmem = NULL, *lhost = NULL, *xmem = NULL, *xhost = NULL;
    int rc = KOLO_ERR_NO_MEMORY;
    char prefix[256];
    kolo__ops_config_t sub;
    kolo__hosts_t g = {0};

    *out = NULL;
    if (h == NULL)
        goto oom;
    h->net = cfg->cross_ops != NULL ? kolo__ops_find(cfg->cross_ops) : NULL;
    h->shm = kolo__ops_find("shm");
    if (h->net == NULL || h->shm == NULL || cfg->hosts == NULL) {
        snprintf(err, errlen, "hierarchical allreduce needs shared memory and "
                 "the '%s' backend in this build",
                 cfg->cross_ops ? cfg->cross_ops : "(none)");
        hier_finalize(h);
        return KOLO_ERR_UNSUPPORTED;
    }
    if (kolo__hosts_group(cfg->hosts, cfg->size, cfg->rank, &g) != 0)
        goto oom;
    h->nlocal = g.nlocal;
    h->nhosts = g.nhosts;
    if (!g.same) {
        snprintf(err, errlen, "hierarchical allreduce needs the same number "
                 "of ranks on every host: %d ranks on %d hosts, %d on this one",
                 cfg->size, h->nhosts, h->nlocal);
        rc = KOLO_ERR_UNSUPPORTED;
        goto fail;
    }
    lmem = malloc((size_t)g.nlocal * sizeof(int));
    lhost = malloc((size_t)g.nlocal * sizeof(int));
    xmem = malloc((size_t)g.nhosts * sizeof(int));
    xhost = malloc((size_t)g.nhosts * sizeof(int));
    if (!lmem || !lhost || !xmem || !xhost)
        goto oom;
    /* This rank's host; the member of each host with this local index. */
    for (int j = 0; j < g.nlocal; j++) {
        lmem[j] = cfg->members[g.local[j]];
        lhost[j] = cfg->hosts[g.local[j]];
    }
    for (int k = 0; k < g.nhosts; k++) {
        xmem[k] = cfg->members[g.cross[k]];
        xhost[k] = cfg->hosts[g.cross[k]];
    }

    sub = *cfg;
    snprintf(prefix, sizeof(prefix), "%s/host%d", cfg->prefix, cfg->hosts[cfg->rank]);
    sub.rank = g.me_local;
    sub.size = h->nlocal;
    sub.members = lmem;
    sub.hosts = lhost;
    sub.prefix = prefix;
    rc = h->shm->init(&sub, &h->local, err, errlen);
    if (rc != KOLO_OK)
        goto fail;

    sub = *cfg;
    snprintf(prefix, sizeof(prefix), "%s/cross%d", cfg->prefix, g.me_local);
    sub.rank = g.me_host;
    sub.size = h->nhosts;
    sub.members = xmem;
    sub.hosts = xhost;
    sub.prefix = prefix;
    rc = h->net->init(&sub, &h->cross, err, errlen);
    if (rc != KOLO_OK)
        goto fail;

    sub = *cfg;
    snprintf(prefix, sizeof(prefix), "%s/flat", cfg->prefix);
    sub.prefix = prefix;
    rc = h->net->init(&sub, &h->flat, err, errlen);
    if (rc != KOLO_OK)
        goto fail;

    h->me_local = g.me_local;
    h->counts = calloc((size_t)h->nlocal, sizeof(size_t));
    h->bytes = calloc((size_t)h->nlocal, sizeof(size_t));
    if (h->counts == NULL || h->bytes == NULL)
        goto oom;
    free(lmem), free(lhost), free(xmem), free(xhost);
    kolo__hosts_free(&g);
    *out = h;
    return KOLO_OK;
oom:
    snprintf(err, errlen, "out of memory starting hierarchical allreduce");
    rc = KOLO_ERR_NO_MEMORY;
fail:
    free(lmem), free(lhost), free(xmem), free(xhost);
    kolo__hosts_free(&g);
    hier_finalize(h);
    return rc;
}

static int hier_allreduce(void *ctx, const void *in, void *out, size_t count,
                          size_t esize, kolo__ops_reduce_fn reduce, char *err,
                          size_t errlen)
{
    hier_ctx_t *h = ctx;
    size_t share = (count + (size_t)h->nlocal - 1) / (size_t)h->nlocal;
    size_t left = count, mine;
    uint8_t *shard;
    int rc;

    for (int j = 0; j < h->nlocal; j++) {
        h->counts[j] = left < share ? left : share;
        h->bytes[j] = h->counts[j] * esize;
        left -= h->counts[j];
    }
    /* This rank's share of the result is built where it ends up, in out:
     * the reduce-scatter reduces it there (reading this rank's own block
     * of the input where it lies, ops/shm), the ring allreduces it in
     * place across hosts, and the allgather leaves it there, copying only
     * the other ranks' shares. The shared-memory reduce-scatter only reads
     * its input. */
    shard = (uint8_t *)out + (size_t)h->me_local * share * esize;
    rc = h->shm->reduce_scatter(h->local, (void *)(in != NULL ? in : out),
                                shard, h->counts, esize, reduce, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    mine = h->counts[h->me_local];
    if (h->nhosts > 1 && mine > 0) {
        rc = h->net->allreduce(h->cross, NULL, shard, mine, esize, reduce,
                               err, errlen);
        if (rc != KOLO_OK)
            return rc;
    }
    return h->shm->allgatherv(h->local, shard, out, h->bytes, err, errlen);
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
};
