/*
 * gpu.c — CUDA tensors on NCCL (design in gpu.h).
 *
 * Every function here that runs a batch is called by a set's background
 * thread, one batch at a time, in the same order on every rank; its CUDA
 * calls go to the set's device (cudaSetDevice first: the thread may have
 * another current device from an earlier set). Failures write one sentence
 * to run->detail; kolo__gpu_run turns it into the message of the batch's
 * handles, naming the tensor and the rank.
 */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "gpu.h"
#include "complete.h"
#include "gpu_kernels.h"
#include "peers.h"
#include "pset.h"
#include "reduce.h"

#define WATCH_NS 100000000L  /* a wait checks errors, peers, time this often */
#define PEERS_EVERY_US 1000000 /* and looks for lost peers this often */

typedef struct kolo__gpu kolo__gpu_t;

struct kolo__gpu {
    int device;
    cudaStream_t stream;
    ncclComm_t comm;      /* every member of the set; created when needed */
    /* Hierarchical allreduce (KOLO_HIERARCHICAL_ALLREDUCE=1 across hosts). */
    int hier;             /* -1: not decided yet; 0: flat; 1: hierarchical */
    ncclComm_t local;     /* the members on this rank's host */
    int nlocal, me_local, nhosts, me_host;
    const kolo__ops_t *cross_ops; /* the members with this local index */
    void *cross_ctx;
    void *stage;          /* pinned host memory for the shard */
    size_t stage_cap;
    void *fusion;         /* device memory */
    size_t fusion_cap;
    /* A host function queued after each batch's work counts it done. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t issued, finished;
    int broken; /* aborted: host functions may still run, so the state
                   outlives the set (freed never) */
};

/* One batch being run. */
typedef struct run {
    kolo__pset_t *ps;
    kolo__gpu_t *g;
    char detail[KOLO__ERR_LEN];
} run_t;

static int failf(run_t *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int failf(run_t *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof(r->detail), fmt, ap);
    va_end(ap);
    return code;
}

static int cuda_ok(run_t *r, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return KOLO_OK;
    return failf(r, KOLO_ERR_BACKEND, "%s on CUDA device %d: %s", what,
                 r->g != NULL ? r->g->device : -1, cudaGetErrorString(rc));
}

static int kernel_ok(run_t *r, int rc, const char *what)
{
    return cuda_ok(r, (cudaError_t)rc, what);
}

static void abort_comms(kolo__gpu_t *g)
{
    if (g->comm != NULL)
        ncclCommAbort(g->comm);
    if (g->local != NULL)
        ncclCommAbort(g->local);
    g->comm = g->local = NULL;
    g->broken = 1;
}

static int nccl_code(ncclResult_t rc)
{
    return rc == ncclRemoteError ? KOLO_ERR_RANK_LOST : KOLO_ERR_BACKEND;
}

/* Finishes an NCCL call on a non-blocking communicator: while it says
 * ncclInProgress, polls its state (1 ms at most between looks) until it
 * settles, KOLO_TIMEOUT_SECONDS pass (the communicator is aborted) or it
 * fails. */
static int nccl_ok(run_t *r, ncclComm_t comm, ncclResult_t rc, const char *what)
{
    int64_t start = kolo__now_us();
    double limit_us = r->ps->rt->cfg.timeout_s * 1e6;
    useconds_t pause = 10;

    while (rc == ncclInProgress && comm != NULL) {
        ncclResult_t state = ncclSuccess, q;
        if ((q = ncclCommGetAsyncError(comm, &state)) != ncclSuccess) {
            rc = q;
            break;
        }
        rc = state;
        if (rc != ncclInProgress)
            break;
        if ((double)(kolo__now_us() - start) > limit_us) {
            abort_comms(r->g);
            return failf(r, KOLO_ERR_TIMEOUT, "%s did not finish within %g s "
                         "(KOLO_TIMEOUT_SECONDS): a rank did not take part; "
                         "the NCCL communicators were aborted", what,
                         r->ps->rt->cfg.timeout_s);
        }
        usleep(pause);
        pause = pause < 1000 ? pause * 2 : 1000;
    }
    if (rc == ncclSuccess)
        return KOLO_OK;
    failf(r, nccl_code(rc), "%s: %s (%s)", what, ncclGetErrorString(rc),
          ncclGetLastError(comm));
    /* Past a wrong argument, nothing can be assumed of the work queued so
     * far (peers may wait in a kernel launched by half a group): abort. */
    if (rc != ncclInvalidArgument && rc != ncclInvalidUsage)
        abort_comms(r->g);
    return nccl_code(rc);
}

static int nccl_type(int dtype, ncclDataType_t *t)
{
    switch (dtype) {
    case KOLO_UINT8: case KOLO_BOOL: *t = ncclUint8; return 0;
    case KOLO_INT8: *t = ncclInt8; return 0;
    case KOLO_INT32: *t = ncclInt32; return 0;
    case KOLO_INT64: *t = ncclInt64; return 0;
    case KOLO_FLOAT16: *t = ncclFloat16; return 0;
    case KOLO_BFLOAT16: *t = ncclBfloat16; return 0;
    case KOLO_FLOAT32: *t = ncclFloat32; return 0;
    case KOLO_FLOAT64: *t = ncclFloat64; return 0;
    default: return -1;
    }
}

/* AVERAGE is a sum scaled afterwards by postscale / size, as on the host;
 * on bool, SUM and MAX are "or", MIN and PRODUCT "and" (values 0 and 1). */
static ncclRedOp_t nccl_op(int op, int dtype)
{
    if (dtype == KOLO_BOOL)
        return op == KOLO_OP_SUM || op == KOLO_OP_MAX ? ncclMax : ncclMin;
    switch (op) {
    case KOLO_OP_MIN: return ncclMin;
    case KOLO_OP_MAX: return ncclMax;
    case KOLO_OP_PRODUCT: return ncclProd;
    default: return ncclSum;
    }
}

/* ---- the API thread ------------------------------------------------------- */

int kolo__gpu_nccl_version(void) { return NCCL_VERSION_CODE; }

int kolo__gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static void event_free(void *event)
{
    if (event != NULL)
        cudaEventDestroy((cudaEvent_t)event);
}

/* Checks that buf is memory of CUDA device `device`. */
static int check_pointer(const kolo__entry_t *e, const void *buf,
                         const char *which, int device, kolo__err_t *err)
{
    struct cudaPointerAttributes attr;
    const char *coll = kolo__coll_name(e->params.coll);
    cudaError_t rc;

    if (buf == NULL)
        return KOLO_OK;
    memset(&attr, 0, sizeof(attr));
    rc = cudaPointerGetAttributes(&attr, buf);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': CUDA cannot tell where the %s "
                             "buffer %p lives: %s", coll, e->name, which, buf,
                             cudaGetErrorString(rc));
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': device_type is "
                             "KOLO_DEVICE_CUDA, but the %s buffer %p is host "
                             "memory", coll, e->name, which, buf);
    if (attr.type == cudaMemoryTypeDevice && attr.device != device)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': the %s buffer is on CUDA "
                             "device %d, the options name device %d", coll,
                             e->name, which, attr.device, device);
    return KOLO_OK;
}

int kolo__gpu_prepare(kolo__pset_t *ps, kolo__entry_t *e, int device,
                      void *stream, kolo__err_t *err)
{
    const char *coll = kolo__coll_name(e->params.coll);
    int count = 0, prev = -1, reduces;
    cudaError_t crc;
    cudaEvent_t ev = NULL;
    ncclDataType_t t;

    crc = cudaGetDeviceCount(&count);
    if (crc != cudaSuccess || count == 0) {
        cudaGetLastError();
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "%s of tensor '%s' on CUDA device %d: rank %d "
                             "sees no CUDA device (cudaGetDeviceCount: %s)",
                             coll, e->name, device, ps->rt->rank,
                             crc != cudaSuccess ? cudaGetErrorString(crc)
                                                : "0 devices");
    }
    if (device < 0 || device >= count)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': there is no CUDA device %d; "
                             "rank %d sees %d (0..%d)", coll, e->name, device,
                             ps->rt->rank, count, count - 1);
    if (ps->gpu_device >= 0 && ps->gpu_device != device)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s' is on CUDA device %d, but rank "
                             "%d's CUDA tensors in process set %d are on "
                             "device %d: a rank uses one device per set (its "
                             "NCCL communicator's)", coll, e->name, device,
                             ps->rt->rank, ps->id, ps->gpu_device);
    reduces = e->params.coll == KOLO__COLL_ALLREDUCE ||
              e->params.coll == KOLO__COLL_REDUCESCATTER;
    if (reduces && nccl_type(e->params.dtype, &t) != 0)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "%s of tensor '%s': NCCL cannot reduce %s; "
                             "convert the CUDA tensor to int32 first", coll,
                             e->name,
                             kolo_dtype_name((kolo_dtype_t)e->params.dtype));
    KOLO__CHECK(check_pointer(e, e->input, "input", device, err));
    if (e->output != e->input)
        KOLO__CHECK(check_pointer(e, e->output, "output", device, err));

    /* The program's stream gets an event now; kolo's stream waits for it
     * before reading the input. */
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    crc = prev == device ? cudaSuccess : cudaSetDevice(device);
    if (crc == cudaSuccess)
        crc = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (crc == cudaSuccess) {
        crc = cudaEventRecord(ev, (cudaStream_t)stream);
        if (crc != cudaSuccess) {
            cudaEventDestroy(ev);
            ev = NULL;
        }
    }
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    if (crc != cudaSuccess) {
        cudaGetLastError();
        return kolo__err_set(err, KOLO_ERR_BACKEND,
                             "%s of tensor '%s': cannot record an event on the "
                             "program's stream %p on CUDA device %d: %s", coll,
                             e->name, stream, device, cudaGetErrorString(crc));
    }
    e->params.device_type = KOLO_DEVICE_CUDA;
    e->device = device;
    e->ready_event = ev;
    e->ready_free = event_free;
    ps->gpu_device = device;
    return KOLO_OK;
}

void kolo__gpu_mem_free(void *data)
{
    if (data != NULL)
        cudaFree(data);
}

int kolo__gpu_result_copy(const kolo_result_t *res, void *dst, kolo__err_t *err)
{
    cudaStream_t s = NULL;
    int prev = -1;
    cudaError_t rc;

    if (res->bytes == 0)
        return KOLO_OK;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    rc = prev == res->device ? cudaSuccess : cudaSetDevice(res->device);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (rc == cudaSuccess) {
        rc = cudaMemcpyAsync(dst, res->data, res->bytes, cudaMemcpyDefault, s);
        if (rc == cudaSuccess)
            rc = cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
    }
    if (prev >= 0 && prev != res->device)
        cudaSetDevice(prev);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return kolo__err_set(err, KOLO_ERR_BACKEND,
                             "kolo_result_copy: copying %zu bytes from CUDA "
                             "device %d failed: %s", res->bytes, res->device,
                             cudaGetErrorString(rc));
    }
    return KOLO_OK;
}

/* ---- waiting for the GPU -------------------------------------------------- */

/* Runs on a CUDA runtime thread when the stream reaches it: no CUDA calls. */
static void CUDART_CB host_done(void *arg)
{
    kolo__gpu_t *g = arg;
    pthread_mutex_lock(&g->mu);
    g->finished++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* NCCL's asynchronous error on a communicator, if any. */
static ncclResult_t async_error(ncclComm_t comm)
{
    ncclResult_t state = ncclSuccess;
    if (comm == NULL || ncclCommGetAsyncError(comm, &state) != ncclSuccess)
        return ncclSuccess;
    return state == ncclInProgress ? ncclSuccess : state;
}

/* After an abort: gives the stream up to 5 s to drain, so that no kernel
 * queued behind NCCL's writes a user's buffer after its handle failed. A
 * stream that does not drain leaves the state broken (never freed). */
static void drain(kolo__gpu_t *g)
{
    for (int i = 0; i < 500; i++) {
        cudaError_t rc = cudaStreamQuery(g->stream);
        if (rc != cudaErrorNotReady)
            break;
        usleep(10000);
    }
    cudaGetLastError();
}

/* Sleeps until the GPU has done everything queued on the stream so far.
 * Every 100 ms it checks NCCL's asynchronous errors and the timeout, and
 * every second whether a peer's process is gone; on any of them it aborts
 * the communicators, which ends NCCL's kernels. */
static int gpu_wait(run_t *r, const char *what)
{
    kolo__gpu_t *g = r->g;
    kolo__runtime_t *rt = r->ps->rt;
    int64_t start = kolo__now_us(), peers_at = start;
    double limit_us = rt->cfg.timeout_s * 1e6;
    uint64_t target;
    cudaError_t crc;

    g->issued++;
    target = g->issued;
    crc = cudaLaunchHostFunc(g->stream, host_done, g);
    if (crc != cudaSuccess) {
        g->issued--;
        return cuda_ok(r, crc, "queueing the completion of the GPU work");
    }
    pthread_mutex_lock(&g->mu);
    while (g->finished < target) {
        struct timespec ts;
        ncclResult_t bad;
        char lost[512], prefix[32];
        int64_t t;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += WATCH_NS;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        if (g->finished >= target)
            break;
        pthread_mutex_unlock(&g->mu);
        t = kolo__now_us();
        /* A fault in a kernel: the host function will never run. */
        crc = cudaStreamQuery(g->stream);
        if (crc != cudaSuccess && crc != cudaErrorNotReady) {
            abort_comms(g);
            drain(g);
            return cuda_ok(r, crc, what);
        }
        if ((bad = async_error(g->comm)) != ncclSuccess ||
            (bad = async_error(g->local)) != ncclSuccess) {
            int code = nccl_code(bad);
            char msg[512];
            snprintf(msg, sizeof(msg), "%s", ncclGetLastError(NULL));
            abort_comms(g);
            drain(g);
            return failf(r, code, "NCCL failed during %s: %s (%s); the NCCL "
                         "communicators were aborted", what,
                         ncclGetErrorString(bad), msg);
        }
        if (t - peers_at >= PEERS_EVERY_US) {
            peers_at = t;
            snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
            if (kolo__peers_lost(&rt->cfg, prefix, r->ps->ranks, r->ps->size,
                                 lost, sizeof(lost)) > 0) {
                abort_comms(g);
                drain(g);
                return failf(r, KOLO_ERR_RANK_LOST, "lost %s during %s; the "
                             "NCCL communicators were aborted", lost, what);
            }
        }
        if ((double)(t - start) > limit_us) {
            abort_comms(g);
            drain(g);
            return failf(r, KOLO_ERR_TIMEOUT, "%s did not finish within %g s "
                         "(KOLO_TIMEOUT_SECONDS): some rank is not taking "
                         "part; the NCCL communicators were aborted", what,
                         rt->cfg.timeout_s);
        }
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    /* A kernel that faulted leaves the stream in error. */
    crc = cudaStreamQuery(g->stream);
    if (crc != cudaSuccess && crc != cudaErrorNotReady)
        return cuda_ok(r, crc, what);
    return KOLO_OK;
}

/* ---- set-up --------------------------------------------------------------- */

/* Every member shares a 128-byte NCCL id over the set's controller; a
 * member that leads a communicator fills its slot. */
static int exchange_ids(run_t *r, int lead, ncclUniqueId *all)
{
    kolo__pset_t *ps = r->ps;
    ncclUniqueId mine;
    ncclResult_t nrc;
    int rc;

    memset(&mine, 0, sizeof(mine));
    if (lead && (nrc = ncclGetUniqueId(&mine)) != ncclSuccess)
        return failf(r, KOLO_ERR_BACKEND, "ncclGetUniqueId: %s (%s)",
                     ncclGetErrorString(nrc), ncclGetLastError(NULL));
    rc = ps->ctl_ops->allgather(ps->ctl_ctx, &mine, all, sizeof(mine),
                                r->detail, sizeof(r->detail));
    return rc;
}

static int comm_init(run_t *r, const ncclUniqueId *id, int n, int me,
                     ncclComm_t *out, const char *what)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclResult_t nrc;
    int rc;

    cfg.blocking = 0; /* a peer that never comes must not hang us */
    nrc = ncclCommInitRankConfig(&comm, n, *id, me, &cfg);
    if (nrc != ncclSuccess && nrc != ncclInProgress)
        comm = NULL;
    rc = nccl_ok(r, comm, nrc, what);
    if (rc != KOLO_OK) {
        if (comm != NULL)
            ncclCommAbort(comm); /* not in g yet: abort_comms missed it */
        return rc;
    }
    *out = comm;
    return KOLO_OK;
}

/* The set's communicator over every member. */
static int ensure_comm(run_t *r)
{
    kolo__pset_t *ps = r->ps;
    ncclUniqueId *ids;
    char what[96];
    int rc;

    if (r->g->comm != NULL)
        return KOLO_OK;
    ids = calloc((size_t)ps->size, sizeof(*ids));
    if (ids == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory for NCCL ids");
    rc = exchange_ids(r, ps->rank == 0, ids);
    snprintf(what, sizeof(what), "creating the NCCL communicator of process "
             "set %d (%d ranks)", ps->id, ps->size);
    if (rc == KOLO_OK)
        rc = comm_init(r, &ids[0], ps->size, ps->rank, &r->g->comm, what);
    free(ids);
    return rc;
}

/* The network backend between hosts: the set's own when it is one, else
 * the registry's default across hosts. */
static const kolo__ops_t *network_ops(const kolo__pset_t *ps)
{
    const kolo__ops_t *ops = ps->data_ops;
    kolo__ops_need_t need = {ps->size, 0, (int)ps->rt->cfg.mpi_launched,
                             ps->rt->rank, "", NULL};
    char detail[KOLO__ERR_LEN];

    if (ops != NULL && (ops->caps & KOLO__OPS_NETWORK))
        return ops;
    if (kolo__ops_choose(&need, &ops, detail, sizeof(detail)) != KOLO_OK)
        return NULL;
    return ops;
}

/* Decides, once per set, whether allreduce is hierarchical, and sets it up:
 * an NCCL communicator per host and a network context per local index. */
static int ensure_hier(run_t *r)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = r->g;
    const int *host_of = ps->rt->host_of;
    int n = ps->size, rc = KOLO_OK, same = 1, first = -1, leader = -1;
    int *lmem = NULL, *xmem = NULL, *xhost = NULL, *hostlist = NULL;
    ncclUniqueId *ids = NULL;
    char role[64], what[128];

    if (g->hier >= 0)
        return KOLO_OK;
    g->hier = 0;
    if (ps->rt->cfg.hierarchical != 1 || host_of == NULL || n == 1)
        return KOLO_OK;
    lmem = malloc((size_t)n * sizeof(int));
    xmem = malloc((size_t)n * sizeof(int));
    xhost = malloc((size_t)n * sizeof(int));
    hostlist = malloc((size_t)n * sizeof(int));
    ids = calloc((size_t)n, sizeof(*ids));
    if (!lmem || !xmem || !xhost || !hostlist || !ids) {
        rc = failf(r, KOLO_ERR_NO_MEMORY, "out of memory setting up "
                   "hierarchical allreduce");
        goto out;
    }
    g->nlocal = g->nhosts = 0;
    for (int i = 0; i < n; i++) {
        int h = host_of[ps->ranks[i]], k, here = 0;
        for (k = 0; k < g->nhosts && hostlist[k] != h; k++)
            ;
        if (k == g->nhosts)
            hostlist[g->nhosts++] = h;
        for (int j = 0; j < n; j++)
            here += host_of[ps->ranks[j]] == h;
        if (first < 0)
            first = here;
        same &= here == first;
        if (h == host_of[ps->ranks[ps->rank]]) {
            if (leader < 0)
                leader = i;
            if (i == ps->rank)
                g->me_local = g->nlocal;
            lmem[g->nlocal++] = ps->ranks[i];
        }
        if (i == ps->rank)
            g->me_host = k;
    }
    if (!same || g->nhosts < 2) {
        if (ps->rank == 0)
            kolo__log(KOLO__LOG_WARNING, "KOLO_HIERARCHICAL_ALLREDUCE=1, but "
                      "process set %d %s: its CUDA allreduce stays flat on "
                      "NCCL", ps->id, !same ? "does not have the same number "
                      "of ranks on every host" : "is on one host");
        goto out;
    }
    for (int k = 0; k < g->nhosts; k++) {
        int seen = 0;
        for (int i = 0; i < n; i++) {
            if (host_of[ps->ranks[i]] != hostlist[k])
                continue;
            if (seen++ == g->me_local) {
                xmem[k] = ps->ranks[i];
                xhost[k] = hostlist[k];
                break;
            }
        }
    }
    /* Within the host: NCCL, led by the host's first member. */
    rc = exchange_ids(r, leader == ps->rank, ids);
    snprintf(what, sizeof(what), "creating the NCCL communicator of host %d "
             "in process set %d (%d ranks)", host_of[ps->ranks[ps->rank]],
             ps->id, g->nlocal);
    if (rc == KOLO_OK)
        rc = comm_init(r, &ids[leader], g->nlocal, g->me_local, &g->local,
                       what);
    if (rc != KOLO_OK)
        goto out;
    /* Across hosts: the network backend, one context per local index. */
    g->cross_ops = network_ops(ps);
    if (g->cross_ops == NULL) {
        rc = failf(r, KOLO_ERR_UNSUPPORTED, "hierarchical allreduce needs "
                   "Gloo or MPI between hosts, and this build has neither");
        goto out;
    }
    snprintf(role, sizeof(role), "gpu-cross%d", g->me_local);
    {
        kolo__err_t cerr;
        rc = kolo__pset_connect(ps, g->cross_ops, role, g->me_host, g->nhosts,
                                xmem, xhost, NULL, &g->cross_ctx, &cerr);
        if (rc != KOLO_OK) {
            g->cross_ctx = NULL;
            rc = failf(r, rc, "%s", cerr.msg);
            goto out;
        }
    }
    g->hier = 1;
out:
    free(lmem);
    free(xmem);
    free(xhost);
    free(hostlist);
    free(ids);
    return rc;
}

static int gpu_get(run_t *r, const size_t *idx, size_t n)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = ps->exec.gpu;
    pthread_condattr_t attr;
    int device = -1, count;

    if (g != NULL) {
        r->g = g;
        return cuda_ok(r, cudaSetDevice(g->device), "cudaSetDevice");
    }
    for (size_t i = 0; i < n && device < 0; i++)
        device = ps->ready[idx[i]]->device;
    if (device < 0) {
        /* Only a joined rank's stand-ins: the device its local rank
         * would use. */
        count = kolo__gpu_device_count();
        if (count == 0)
            return failf(r, KOLO_ERR_UNSUPPORTED, "rank %d has joined and "
                         "must take part in a CUDA allreduce, but sees no "
                         "CUDA device", ps->rt->rank);
        device = (int)(ps->rt->cfg.local_rank % count);
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory for GPU state");
    g->device = device;
    g->hier = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &attr);
    pthread_condattr_destroy(&attr);
    r->g = g;
    ps->exec.gpu = g;
    KOLO__CHECK(cuda_ok(r, cudaSetDevice(device), "cudaSetDevice"));
    return cuda_ok(r, cudaStreamCreateWithFlags(&g->stream,
                                                cudaStreamNonBlocking),
                   "creating kolo's CUDA stream");
}

void kolo__gpu_free(kolo__pset_t *ps)
{
    kolo__gpu_t *g = ps->exec.gpu;
    int prev = -1;

    if (g == NULL)
        return;
    ps->exec.gpu = NULL;
    if (g->cross_ctx != NULL)
        g->cross_ops->finalize(g->cross_ctx);
    /* Abort rather than destroy: every batch has finished (each waits), so
     * there is nothing to flush, and abort never waits for a peer that is
     * already gone. */
    if (g->comm != NULL)
        ncclCommAbort(g->comm);
    if (g->local != NULL)
        ncclCommAbort(g->local);
    if (g->broken)
        return; /* a host function may still run: keep the state */
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    cudaSetDevice(g->device);
    if (g->fusion != NULL)
        cudaFree(g->fusion);
    if (g->stage != NULL)
        cudaFreeHost(g->stage);
    if (g->stream != NULL)
        cudaStreamDestroy(g->stream);
    if (prev >= 0 && prev != g->device)
        cudaSetDevice(prev);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

static int fusion_reserve(run_t *r, size_t bytes)
{
    kolo__gpu_t *g = r->g;
    void *p = NULL;

    if (g->fusion_cap >= bytes)
        return KOLO_OK;
    if (g->fusion != NULL) {
        cudaFree(g->fusion);
        g->fusion = NULL;
        g->fusion_cap = 0;
    }
    KOLO__CHECK(cuda_ok(r, cudaMalloc(&p, bytes), "allocating the fusion buffer"));
    g->fusion = p;
    g->fusion_cap = bytes;
    return KOLO_OK;
}

static int stage_reserve(run_t *r, size_t bytes)
{
    kolo__gpu_t *g = r->g;
    void *p = NULL;

    if (g->stage_cap >= bytes)
        return KOLO_OK;
    if (g->stage != NULL) {
        cudaFreeHost(g->stage);
        g->stage = NULL;
        g->stage_cap = 0;
    }
    KOLO__CHECK(cuda_ok(r, cudaMallocHost(&p, bytes),
                        "allocating pinned host memory"));
    g->stage = p;
    g->stage_cap = bytes;
    return KOLO_OK;
}

/* kolo's stream waits for the program's work on every input. */
static int wait_ready(run_t *r, const size_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kolo__entry_t *e = r->ps->ready[idx[i]];
        if (e->ready_event != NULL)
            KOLO__CHECK(cuda_ok(r, cudaStreamWaitEvent(r->g->stream,
                                                       (cudaEvent_t)e->ready_event, 0),
                                "waiting for the program's stream"));
    }
    return KOLO_OK;
}

/* ---- allreduce ------------------------------------------------------------ */

/* The hierarchical steps on buf (padded elements, a multiple of nlocal):
 * reduce-scatter within the host, the shard allreduced across hosts in
 * host memory, allgather within the host. */
static int allreduce_hier(run_t *r, uint8_t *buf, size_t padded, size_t esize,
                          int wire, int op)
{
    kolo__gpu_t *g = r->g;
    size_t shard = padded / (size_t)g->nlocal;
    uint8_t *mine = buf + (size_t)g->me_local * shard * esize;
    ncclDataType_t t;
    ncclRedOp_t nop = nccl_op(op, wire);
    int rc;

    nccl_type(wire, &t);
    if (g->nlocal > 1)
        KOLO__CHECK(nccl_ok(r, g->local, ncclReduceScatter(buf, mine, shard, t,
                                                           nop, g->local,
                                                           g->stream),
                            "ncclReduceScatter within the host"));
    if (shard > 0) {
        KOLO__CHECK(stage_reserve(r, shard * esize));
        KOLO__CHECK(cuda_ok(r, cudaMemcpyAsync(g->stage, mine, shard * esize,
                                               cudaMemcpyDeviceToHost,
                                               g->stream),
                            "copying the shard to the host"));
        KOLO__CHECK(gpu_wait(r, "the reduce-scatter within the host"));
        rc = g->cross_ops->allreduce(
            g->cross_ctx, NULL, g->stage, shard, esize,
            kolo__reduce_get((kolo_dtype_t)wire,
                             op == KOLO_OP_AVERAGE ? KOLO_OP_SUM : (kolo_op_t)op),
            r->detail, sizeof(r->detail));
        if (rc != KOLO_OK)
            return rc;
        KOLO__CHECK(cuda_ok(r, cudaMemcpyAsync(mine, g->stage, shard * esize,
                                               cudaMemcpyHostToDevice,
                                               g->stream),
                            "copying the shard back to the device"));
    }
    if (g->nlocal > 1)
        KOLO__CHECK(nccl_ok(r, g->local, ncclAllGather(mine, buf, shard, t,
                                                       g->local, g->stream),
                            "ncclAllGather within the host"));
    return KOLO_OK;
}

/* Copies the batch's tensors into (in = 1) or out of the fusion buffer,
 * converting between dtype and wire; a joined rank's stand-ins are zeros
 * going in and dropped coming out. */
static int move_batch(run_t *r, const size_t *idx, size_t n, int in,
                      double scale)
{
    kolo__entry_t *e0 = r->ps->ready[idx[0]];
    int dtype = e0->params.dtype, wire = e0->params.wire;
    size_t esize = kolo_dtype_size((kolo_dtype_t)wire), at = 0, k = 0;
    kolo__gpu_copy_t *copies = malloc(n * sizeof(*copies));
    uint8_t *fusion = r->g->fusion;
    int rc = KOLO_OK;

    if (copies == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory packing %zu "
                     "tensors", n);
    for (size_t i = 0; i < n && rc == KOLO_OK; i++) {
        kolo__entry_t *e = r->ps->ready[idx[i]];
        size_t count = (size_t)e->params.count;
        if (e->device < 0) {
            if (in)
                rc = kernel_ok(r, kolo__gpu_zero(fusion + at * esize, count,
                                                 wire, r->g->stream),
                               "zeroing a joined rank's share");
        } else if (in) {
            copies[k++] = (kolo__gpu_copy_t){e->input, fusion + at * esize,
                                             count};
        } else {
            copies[k++] = (kolo__gpu_copy_t){fusion + at * esize, e->output,
                                             count};
        }
        at += count;
    }
    if (rc == KOLO_OK && k > 0)
        rc = kernel_ok(r, in ? kolo__gpu_copy_batch(copies, k, dtype, wire,
                                                     scale, r->g->stream)
                             : kolo__gpu_copy_batch(copies, k, wire, dtype,
                                                    1.0, r->g->stream),
                       in ? "packing the fusion buffer"
                          : "unpacking the fusion buffer");
    free(copies);
    return rc;
}

static int run_allreduce(run_t *r, const size_t *idx, size_t n)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = r->g;
    kolo__entry_t *e0 = ps->ready[idx[0]];
    const kolo__params_t *p = &e0->params;
    int wire = p->wire, standins = 0;
    size_t esize = kolo_dtype_size((kolo_dtype_t)wire), count = 0, padded;
    /* AVERAGE is SUM and one scaling by postscale / size (Horovod's). */
    double post = kolo__postscale_factor(p->op, p->postscale, ps->size);
    ncclDataType_t t;
    uint8_t *buf;

    for (size_t i = 0; i < n; i++) {
        count += (size_t)ps->ready[idx[i]]->params.count;
        standins |= ps->ready[idx[i]]->device < 0;
    }
    if (count == 0)
        return KOLO_OK;
    if (nccl_type(wire, &t) != 0)
        return failf(r, KOLO_ERR_UNSUPPORTED, "NCCL cannot reduce %s",
                     kolo_dtype_name((kolo_dtype_t)wire));
    KOLO__CHECK(ensure_hier(r));
    if (!g->hier)
        KOLO__CHECK(ensure_comm(r));
    padded = g->hier ? (count + (size_t)g->nlocal - 1) / (size_t)g->nlocal *
                           (size_t)g->nlocal
                     : count;

    if (n == 1 && wire == p->dtype && !standins && !g->hier) {
        /* Alone and uncompressed: reduced from the user's buffers. */
        const void *in = e0->input;
        buf = e0->output;
        if (p->prescale != 1.0) {
            if (in != buf) {
                kolo__gpu_copy_t c = {in, buf, count};
                KOLO__CHECK(kernel_ok(r, kolo__gpu_copy_batch(&c, 1, wire, wire,
                                                              p->prescale,
                                                              g->stream),
                                      "prescaling"));
            } else {
                KOLO__CHECK(kernel_ok(r, kolo__gpu_scale(buf, count, wire,
                                                         p->prescale,
                                                         g->stream),
                                      "prescaling"));
            }
            in = buf;
        }
        KOLO__CHECK(nccl_ok(r, g->comm, ncclAllReduce(in, buf, count, t,
                                                      nccl_op(p->op, wire),
                                                      g->comm, g->stream),
                            "ncclAllReduce"));
    } else {
        KOLO__CHECK(fusion_reserve(r, padded * esize));
        buf = g->fusion;
        KOLO__CHECK(move_batch(r, idx, n, 1, p->prescale));
        if (padded > count)
            KOLO__CHECK(kernel_ok(r, kolo__gpu_zero(buf + count * esize,
                                                    padded - count, wire,
                                                    g->stream),
                                  "zeroing the padding"));
        if (g->hier)
            KOLO__CHECK(allreduce_hier(r, buf, padded, esize, wire, p->op));
        else
            KOLO__CHECK(nccl_ok(r, g->comm, ncclAllReduce(buf, buf, count, t,
                                                          nccl_op(p->op, wire),
                                                          g->comm, g->stream),
                                "ncclAllReduce"));
    }
    if (post != 1.0)
        KOLO__CHECK(kernel_ok(r, kolo__gpu_scale(buf, count, wire, post,
                                                 g->stream),
                              "postscaling"));
    if (buf == g->fusion)
        KOLO__CHECK(move_batch(r, idx, n, 0, 1.0));
    return gpu_wait(r, "the allreduce");
}

/* ---- the other collectives ------------------------------------------------ */

static int run_broadcast(run_t *r, kolo__entry_t *e)
{
    size_t bytes = (size_t)e->params.count *
                   kolo_dtype_size((kolo_dtype_t)e->params.dtype);

    if (bytes == 0)
        return KOLO_OK;
    KOLO__CHECK(ensure_comm(r));
    KOLO__CHECK(nccl_ok(r, r->g->comm,
                        ncclBroadcast(e->output, e->output, bytes, ncclUint8,
                                      e->params.root, r->g->comm, r->g->stream),
                        "ncclBroadcast"));
    return gpu_wait(r, "the broadcast");
}

/* A result of `rows` rows shaped like the entry's tensor, in device memory;
 * `elems` elements (allgather, alltoall: rows * row). */
static int device_result(run_t *r, const kolo__entry_t *e, int64_t rows,
                         size_t bytes, kolo__result_t **out)
{
    kolo__result_t *res = calloc(1, sizeof(*res));
    void *data = NULL;

    if (res == NULL || (res->splits = calloc((size_t)r->ps->size,
                                             sizeof(int64_t))) == NULL) {
        free(res);
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory for the result");
    }
    if (cudaMalloc(&data, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        free(res->splits);
        free(res);
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory on CUDA device %d "
                     "for a result of %zu bytes", r->g->device, bytes);
    }
    res->data = data;
    res->data_free = kolo__gpu_mem_free;
    res->bytes = bytes;
    res->device_type = KOLO_DEVICE_CUDA;
    res->device = r->g->device;
    res->nsplits = r->ps->size;
    res->ndim = e->params.ndim;
    memcpy(res->shape, e->params.shape, sizeof(res->shape));
    res->shape[0] = rows;
    *out = res;
    return KOLO_OK;
}

static int run_allgather(run_t *r, kolo__entry_t *e)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = r->g;
    size_t row = (size_t)e->params.count *
                 kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *rows = calloc((size_t)ps->size, sizeof(int64_t)), total = 0;
    kolo__result_t *res = NULL;
    int rc, equal = 1;

    if (rows == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory");
    rc = ps->ctl_ops->allgather(ps->ctl_ctx, &e->rows, rows, sizeof(int64_t),
                                r->detail, sizeof(r->detail));
    for (int i = 0; rc == KOLO_OK && i < ps->size; i++) {
        total += rows[i];
        equal &= rows[i] == rows[0];
    }
    if (rc == KOLO_OK)
        rc = ensure_comm(r);
    if (rc == KOLO_OK)
        rc = device_result(r, e, total, (size_t)total * row, &res);
    if (rc == KOLO_OK) {
        memcpy(res->splits, rows, (size_t)ps->size * sizeof(int64_t));
        if (equal && rows[0] > 0) {
            rc = nccl_ok(r, g->comm, ncclAllGather(e->input, res->data,
                                                   (size_t)rows[0] * row,
                                                   ncclUint8, g->comm,
                                                   g->stream),
                         "ncclAllGather");
        } else if (total > 0) {
            /* First dimensions differ: one broadcast per rank, grouped. */
            size_t off = 0;
            ncclResult_t nrc = ncclGroupStart();
            for (int i = 0; nrc == ncclSuccess && i < ps->size; i++) {
                uint8_t *dst = (uint8_t *)res->data + off;
                size_t bytes = (size_t)rows[i] * row;
                if (bytes > 0)
                    nrc = ncclBroadcast(i == ps->rank ? e->input : dst, dst,
                                        bytes, ncclUint8, i, g->comm,
                                        g->stream);
                off += bytes;
            }
            ncclResult_t end = ncclGroupEnd();
            rc = nccl_ok(r, g->comm, nrc != ncclSuccess ? nrc : end,
                         "allgather (grouped ncclBroadcast)");
        }
    }
    if (rc == KOLO_OK)
        rc = gpu_wait(r, "the allgather");
    if (rc == KOLO_OK) {
        e->result = res;
        res = NULL;
    }
    kolo__result_free(res);
    free(rows);
    return rc;
}

static int run_alltoall(run_t *r, kolo__entry_t *e)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = r->g;
    size_t n = (size_t)ps->size, me = (size_t)ps->rank;
    size_t row = (size_t)e->params.count *
                 kolo_dtype_size((kolo_dtype_t)e->params.dtype);
    int64_t *all = calloc(n * n, sizeof(int64_t)), total = 0;
    kolo__result_t *res = NULL;
    int rc;

    if (all == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory");
    rc = ps->ctl_ops->allgather(ps->ctl_ctx, e->splits, all,
                                n * sizeof(int64_t), r->detail,
                                sizeof(r->detail));
    for (size_t j = 0; rc == KOLO_OK && j < n; j++)
        total += all[j * n + me];
    if (rc == KOLO_OK)
        rc = ensure_comm(r);
    if (rc == KOLO_OK)
        rc = device_result(r, e, total, (size_t)total * row, &res);
    if (rc == KOLO_OK) {
        size_t soff = 0, roff = 0;
        ncclResult_t nrc = ncclGroupStart(), end;
        for (size_t j = 0; j < n; j++)
            res->splits[j] = all[j * n + me];
        for (size_t j = 0; nrc == ncclSuccess && j < n; j++) {
            size_t sb = (size_t)e->splits[j] * row;
            size_t rb = (size_t)all[j * n + me] * row;
            if (sb > 0)
                nrc = ncclSend((const uint8_t *)e->input + soff, sb, ncclUint8,
                               (int)j, g->comm, g->stream);
            if (nrc == ncclSuccess && rb > 0)
                nrc = ncclRecv((uint8_t *)res->data + roff, rb, ncclUint8,
                               (int)j, g->comm, g->stream);
            soff += sb;
            roff += rb;
        }
        end = ncclGroupEnd();
        rc = nccl_ok(r, g->comm, nrc != ncclSuccess ? nrc : end,
                     "alltoall (grouped ncclSend/ncclRecv)");
    }
    if (rc == KOLO_OK)
        rc = gpu_wait(r, "the alltoall");
    if (rc == KOLO_OK) {
        e->result = res;
        res = NULL;
    }
    kolo__result_free(res);
    free(all);
    return rc;
}

static int run_reducescatter(run_t *r, kolo__entry_t *e)
{
    kolo__pset_t *ps = r->ps;
    kolo__gpu_t *g = r->g;
    const kolo__params_t *p = &e->params;
    size_t esize = kolo_dtype_size((kolo_dtype_t)p->dtype);
    int64_t d0 = p->shape[0], row = d0 > 0 ? p->count / d0 : 0;
    size_t *counts = calloc((size_t)ps->size, sizeof(size_t)), mine;
    double post = kolo__postscale_factor(p->op, p->postscale, ps->size);
    const uint8_t *src = e->input;
    kolo__result_t *res = NULL;
    ncclDataType_t t;
    int rc, equal = 1;

    if (counts == NULL)
        return failf(r, KOLO_ERR_NO_MEMORY, "out of memory");
    nccl_type(p->dtype, &t);
    for (int i = 0; i < ps->size; i++) {
        int64_t rows = d0 / ps->size + (i < d0 % ps->size ? 1 : 0);
        counts[i] = (size_t)(rows * row);
        equal &= counts[i] == counts[0];
    }
    mine = counts[ps->rank];
    rc = ensure_comm(r);
    if (rc == KOLO_OK)
        rc = device_result(r, e, row > 0 ? (int64_t)mine / row : 0,
                           mine * esize, &res);
    if (rc == KOLO_OK) {
        for (int i = 0; i < ps->size; i++)
            res->splits[i] = row > 0 ? (int64_t)counts[i] / row : 0;
    }
    if (rc == KOLO_OK && p->count > 0 && p->prescale != 1.0) {
        kolo__gpu_copy_t c = {e->input, NULL, (size_t)p->count};
        rc = fusion_reserve(r, (size_t)p->count * esize);
        c.dst = g->fusion;
        if (rc == KOLO_OK)
            rc = kernel_ok(r, kolo__gpu_copy_batch(&c, 1, p->dtype, p->dtype,
                                                   p->prescale, g->stream),
                           "prescaling");
        src = g->fusion;
    }
    if (rc == KOLO_OK && p->count > 0) {
        ncclRedOp_t op = nccl_op(p->op, p->dtype);
        if (equal) {
            rc = nccl_ok(r, g->comm, ncclReduceScatter(src, res->data, mine, t,
                                                       op, g->comm, g->stream),
                         "ncclReduceScatter");
        } else {
            /* Uneven shares: one reduce per rank to that rank, grouped. */
            size_t off = 0;
            ncclResult_t nrc = ncclGroupStart(), end;
            for (int i = 0; nrc == ncclSuccess && i < ps->size; i++) {
                if (counts[i] > 0)
                    nrc = ncclReduce(src + off * esize,
                                     i == ps->rank ? res->data : NULL,
                                     counts[i], t, op, i, g->comm, g->stream);
                off += counts[i];
            }
            end = ncclGroupEnd();
            rc = nccl_ok(r, g->comm, nrc != ncclSuccess ? nrc : end,
                         "reducescatter (grouped ncclReduce)");
        }
    }
    if (rc == KOLO_OK && mine > 0 && post != 1.0)
        rc = kernel_ok(r, kolo__gpu_scale(res->data, mine, p->dtype, post,
                                          g->stream),
                       "postscaling");
    if (rc == KOLO_OK)
        rc = gpu_wait(r, "the reducescatter");
    if (rc == KOLO_OK) {
        e->result = res;
        res = NULL;
    }
    kolo__result_free(res);
    free(counts);
    return rc;
}

/* ---- the entry point ------------------------------------------------------ */

int kolo__gpu_run(kolo__pset_t *ps, const size_t *idx, size_t n,
                  kolo__err_t *err)
{
    kolo__entry_t *e0 = ps->ready[idx[0]];
    run_t r;
    int rc;

    memset(&r, 0, sizeof(r));
    r.ps = ps;
    rc = gpu_get(&r, idx, n);
    if (rc == KOLO_OK && r.g->broken)
        rc = failf(&r, KOLO_ERR_BACKEND, "an earlier NCCL failure aborted "
                   "this process set's communicators");
    if (rc == KOLO_OK)
        rc = wait_ready(&r, idx, n);
    if (rc == KOLO_OK) {
        switch (e0->params.coll) {
        case KOLO__COLL_ALLREDUCE: rc = run_allreduce(&r, idx, n); break;
        case KOLO__COLL_BROADCAST: rc = run_broadcast(&r, e0); break;
        case KOLO__COLL_ALLGATHER: rc = run_allgather(&r, e0); break;
        case KOLO__COLL_ALLTOALL: rc = run_alltoall(&r, e0); break;
        case KOLO__COLL_REDUCESCATTER: rc = run_reducescatter(&r, e0); break;
        default:
            rc = failf(&r, KOLO_ERR_INTERNAL, "%s has no GPU path",
                       kolo__coll_name(e0->params.coll));
        }
    }
    if (rc == KOLO_OK)
        return KOLO_OK;
    rc = kolo__explain_failure(ps, rc, r.detail, sizeof(r.detail));
    if (n > 1)
        return kolo__err_set(err, rc, "rank %d: %s of CUDA tensor '%s' fused "
                             "with %zu others failed: %s", ps->rank,
                             kolo__coll_name(e0->params.coll), e0->name, n - 1,
                             r.detail);
    return kolo__err_set(err, rc, "rank %d: %s of CUDA tensor '%s' (%lld %s, "
                         "device %d) failed: %s", ps->rank,
                         kolo__coll_name(e0->params.coll), e0->name,
                         (long long)e0->params.count,
                         kolo_dtype_name((kolo_dtype_t)e0->params.dtype),
                         e0->device, r.detail);
}
