/*
 * local_ops.c — the backend of a job of one rank: every collective is a
 * copy (or nothing). It lets a program written for kolo run unchanged as a
 * single process, without a launcher or a rendezvous.
 */
#include <stdio.h>
#include <string.h>

#include "ops.h"

static int local_init(const kolo__ops_config_t *cfg, void **ctx, char *err,
                      size_t errlen)
{
    (void)err, (void)errlen;
    if (cfg->size != 1) {
        snprintf(err, errlen, "the local backend serves jobs of one rank, "
                              "not %d", cfg->size);
        return KOLO_ERR_INTERNAL;
    }
    *ctx = NULL;
    return KOLO_OK;
}

static void local_finalize(void *ctx) { (void)ctx; }

static int local_allreduce(void *ctx, const void *in, void *out, size_t count,
                           size_t elem_size, kolo__ops_reduce_fn reduce,
                           char *err, size_t errlen)
{
    (void)ctx, (void)reduce, (void)err, (void)errlen;
    if (in != NULL && in != out)
        memcpy(out, in, count * elem_size);
    return KOLO_OK;
}

static int local_allgather(void *ctx, const void *in, void *out, size_t bytes,
                           char *err, size_t errlen)
{
    (void)ctx, (void)err, (void)errlen;
    if (in != out)
        memmove(out, in, bytes);
    return KOLO_OK;
}

static int local_gather(void *ctx, const void *in, void *out, size_t bytes,
                        int root, char *err, size_t errlen)
{
    (void)root;
    return local_allgather(ctx, in, out, bytes, err, errlen);
}

static int local_broadcast(void *ctx, void *buf, size_t bytes, int root,
                           char *err, size_t errlen)
{
    (void)ctx, (void)buf, (void)bytes, (void)root, (void)err, (void)errlen;
    return KOLO_OK;
}

static int local_allgatherv(void *ctx, const void *in, void *out,
                            const size_t *bytes, char *err, size_t errlen)
{
    return local_allgather(ctx, in, out, bytes[0], err, errlen);
}

static int local_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                           void *out, const size_t *recv_bytes, char *err,
                           size_t errlen)
{
    (void)recv_bytes;
    return local_allgather(ctx, in, out, send_bytes[0], err, errlen);
}

static int local_reduce_scatter(void *ctx, void *work, void *out,
                                const size_t *counts, size_t elem_size,
                                kolo__ops_reduce_fn reduce, char *err,
                                size_t errlen)
{
    (void)reduce;
    return local_allgather(ctx, work, out, counts[0] * elem_size, err, errlen);
}

static int local_wake_peers(void *ctx, uint64_t round, char *err,
                            size_t errlen)
{
    (void)ctx, (void)round, (void)err, (void)errlen;
    return KOLO_OK;
}

const kolo__ops_t kolo__ops_local = {
    .name = "local",
    .caps = 0, /* one rank: nothing to choose */
    .init = local_init,
    .finalize = local_finalize,
    .allreduce = local_allreduce,
    .allgather = local_allgather,
    .gather = local_gather,
    .broadcast = local_broadcast,
    .allgatherv = local_allgatherv,
    .alltoallv = local_alltoallv,
    .reduce_scatter = local_reduce_scatter,
    .wake_peers = local_wake_peers,
};
