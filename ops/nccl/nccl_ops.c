/*
 * nccl_ops.c — the device backend: CUDA tensors on NCCL, behind the device
 * table of ops.h (built when configure finds CUDA, NCCL and nvcc).
 *
 * GPU tensors go through the same queue, negotiation and fusion plan as
 * host tensors (params.device_type is part of what ranks must agree on,
 * and of the fusion key), and through the same execution module
 * (runtime/execute.c), which keeps the bookkeeping of every collective
 * (rows, splits, shards, the results' shapes) for both tables. What this
 * file does is move the bytes on the device.
 *
 * Per process set, created on the first GPU batch (the same batch, in plan
 * order, on every rank):
 *  - the set's CUDA device (every CUDA tensor of a rank in a set is on it),
 *    a stream of kolo's own and a fusion buffer in device memory;
 *  - an NCCL communicator over the set, its unique id exchanged over the
 *    set's controller; created non-blocking, so that a rank that fails or
 *    never arrives ends in a message after KOLO_TIMEOUT_SECONDS, not a hang;
 *  - with KOLO_HIERARCHICAL_ALLREDUCE=1 on a set that spans hosts with the
 *    same number of ranks on each: an NCCL communicator per host, and a
 *    host network context (Gloo or MPI, as the runtime chooses) per local
 *    index across hosts.
 *
 * A batch: the stream waits for each tensor's ready event (recorded on the
 * program's stream at enqueue), kernels pack the tensors into the fusion
 * buffer (prescaling and compressing on the way), NCCL reduces it, kernels
 * average, postscale and unpack, and an event is recorded after the work
 * (record). Nothing here waits for the GPU: the runtime completes the
 * batch's handles at once, the program's stream waits for the event
 * (order), and between rounds the runtime asks `watch` to check NCCL's
 * asynchronous errors, a kernel fault, a lost peer and the timeout; on any
 * of them the communicators are aborted (which ends NCCL's kernels), the
 * stream is given a few seconds to drain (so nothing writes a user's
 * buffer after its handle failed), and the runtime fails the batches in
 * flight with the reason (runtime/inflight.c). Only the hierarchical
 * allreduce waits within a batch, for its shard to reach the host: a host
 * function queued after the work signals a condition variable, and the
 * thread sleeps until then, checking the same things every 100 ms.
 *
 * Events, ready and done, come from a pool per device (event_get,
 * event_free), so that a tensor costs no cudaEventCreate.
 *
 * Every context slot is called by a set's background thread, one batch at
 * a time, in the same order on every rank; its CUDA calls go to the set's
 * device (begin makes it current: the thread may have another current
 * device from an earlier set). Failures write one sentence to the slot's
 * err; the runtime turns it into the message of the batch's handles,
 * naming the tensor and the rank.
 *
 * Known limit: each process set has its own background thread, so CUDA
 * tensors of two sets may run on one device at the same time; NCCL warns
 * that concurrent communicators (and cudaMalloc/cudaFree while NCCL
 * kernels run) can deadlock when ranks order them differently. Keep GPU
 * collectives of overlapping sets from running at once.
 */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "alloc.h"
#include "common.h"
#include "gpu_kernels.h"
#include "hosts.h"
#include "ops.h"

#define WATCH_NS 100000000L  /* a wait checks errors, peers, time this often */
#define PEERS_EVERY_US 1000000 /* and looks for lost peers this often */

#define CHECK(call)                                                          \
    do {                                                                     \
        int check_rc_ = (call);                                              \
        if (check_rc_ != KOLO_OK)                                            \
            return check_rc_;                                                \
    } while (0)

/* An event of the pool: made on `device`, recorded on its streams. */
typedef struct nccl_event {
    cudaEvent_t ev;
    int device;
    int timed; /* made with timing (the timeline's marks) */
    struct nccl_event *next; /* in the pool */
} nccl_event_t;

/* The timeline's clock per device: a timed event the device passed at
 * host time base_us; re-made every BASE_SPAN_MS, so that the float
 * milliseconds of cudaEventElapsedTime keep microseconds. */
#define MAX_DEVICES 64
#define BASE_SPAN_MS 10000.0f
static pthread_mutex_t g_base_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaEvent_t g_base[MAX_DEVICES];
static int64_t g_base_us[MAX_DEVICES];

static _Atomic int g_device_count; /* 0: not known yet */
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static nccl_event_t *g_pool; /* free events, any device */

typedef struct nccl_ctx {
    kolo__dev_config_t cfg; /* members and hosts point into the copies below */
    int *members, *hosts;
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
    int64_t peers_at; /* when watch last looked for a lost peer */
    /* Where the slot being run writes its sentence. */
    char *err;
    size_t errlen;
} nccl_ctx_t;

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Starts a slot: its failures go to err. */
static nccl_ctx_t *enter(void *ctx, char *err, size_t errlen)
{
    nccl_ctx_t *c = ctx;
    c->err = err;
    c->errlen = errlen;
    return c;
}

/* The slot's sentence into its err (ops.h). */
#define failf(c, ...) kolo__ops_fail((c)->err, (c)->errlen, __VA_ARGS__)

static int cuda_ok(nccl_ctx_t *c, cudaError_t rc, const char *what)
{
    if (rc == cudaSuccess)
        return KOLO_OK;
    return failf(c, KOLO_ERR_BACKEND, "%s on CUDA device %d: %s", what,
                 c->device, cudaGetErrorString(rc));
}

static int kernel_ok(nccl_ctx_t *c, int rc, const char *what)
{
    return cuda_ok(c, (cudaError_t)rc, what);
}

static void abort_comms(nccl_ctx_t *c)
{
    if (c->comm != NULL)
        ncclCommAbort(c->comm);
    if (c->local != NULL)
        ncclCommAbort(c->local);
    c->comm = c->local = NULL;
    c->broken = 1;
}

static int nccl_code(ncclResult_t rc)
{
    return rc == ncclRemoteError ? KOLO_ERR_RANK_LOST : KOLO_ERR_BACKEND;
}

/* Finishes an NCCL call on a non-blocking communicator: while it says
 * ncclInProgress, polls its state (1 ms at most between looks) until it
 * settles, KOLO_TIMEOUT_SECONDS pass (the communicator is aborted) or it
 * fails. */
static int nccl_ok(nccl_ctx_t *c, ncclComm_t comm, ncclResult_t rc,
                   const char *what)
{
    int64_t start = now_us();
    double limit_us = c->cfg.timeout_s * 1e6;
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
        if ((double)(now_us() - start) > limit_us) {
            abort_comms(c);
            return failf(c, KOLO_ERR_TIMEOUT, "%s did not finish within %g s "
                         "(KOLO_TIMEOUT_SECONDS): a rank did not take part; "
                         "the NCCL communicators were aborted", what,
                         c->cfg.timeout_s);
        }
        usleep(pause);
        pause = pause < 1000 ? pause * 2 : 1000;
    }
    if (rc == ncclSuccess)
        return KOLO_OK;
    failf(c, nccl_code(rc), "%s: %s (%s)", what, ncclGetErrorString(rc),
          ncclGetLastError(comm));
    /* Past a wrong argument, nothing can be assumed of the work queued so
     * far (peers may wait in a kernel launched by half a group): abort. */
    if (rc != ncclInvalidArgument && rc != ncclInvalidUsage)
        abort_comms(c);
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

/* ---- any thread ----------------------------------------------------------- */

static int nccl_version(void) { return NCCL_VERSION_CODE; }

static int nccl_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* Makes `device` current; *prev gets the one that was (-1: unknown). */
static cudaError_t use_device(int device, int *prev)
{
    if (cudaGetDevice(prev) != cudaSuccess)
        *prev = -1;
    return *prev == device ? cudaSuccess : cudaSetDevice(device);
}

static void restore_device(int device, int prev)
{
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
}

/* An event of `device` from the pool (timed: one that keeps time), or a
 * new one (the device is made current for it, and restored). */
static cudaError_t event_get(int device, int timed, nccl_event_t **out)
{
    nccl_event_t *e, **link;
    cudaError_t rc;
    int prev;

    pthread_mutex_lock(&g_pool_mu);
    for (link = &g_pool; *link != NULL; link = &(*link)->next)
        if ((*link)->device == device && (*link)->timed == timed)
            break;
    e = *link;
    if (e != NULL)
        *link = e->next;
    pthread_mutex_unlock(&g_pool_mu);
    if (e != NULL) {
        *out = e;
        return cudaSuccess;
    }
    if ((e = kolo__calloc(1, sizeof(*e))) == NULL)
        return cudaErrorMemoryAllocation;
    e->device = device;
    e->timed = timed;
    rc = use_device(device, &prev);
    if (rc == cudaSuccess)
        rc = cudaEventCreateWithFlags(&e->ev, timed ? cudaEventDefault
                                                    : cudaEventDisableTiming);
    restore_device(device, prev);
    if (rc != cudaSuccess) {
        free(e);
        return rc;
    }
    *out = e;
    return cudaSuccess;
}

/* Back to the pool: an event may be recorded again once it is released
 * (its waits were queued already; a later record does not disturb them). */
static void nccl_event_free(void *event)
{
    nccl_event_t *e = event;

    if (e == NULL)
        return;
    pthread_mutex_lock(&g_pool_mu);
    e->next = g_pool;
    g_pool = e;
    pthread_mutex_unlock(&g_pool_mu);
}

static int nccl_event_query(void *event, char *err, size_t errlen)
{
    nccl_event_t *e = event;
    cudaError_t rc = cudaEventQuery(e->ev);

    if (rc == cudaSuccess)
        return 1;
    if (rc == cudaErrorNotReady)
        return 0;
    cudaGetLastError();
    snprintf(err, errlen, "CUDA device %d failed: %s", e->device,
             cudaGetErrorString(rc));
    return KOLO_ERR_BACKEND;
}

/* The legacy default stream (NULL) is the current device's: the event's
 * device is made current for it, as prepare does. */
static int nccl_order(void *event, void *stream, char *err, size_t errlen)
{
    nccl_event_t *e = event;
    cudaError_t rc;
    int prev = -1;

    rc = stream != NULL ? cudaSuccess : use_device(e->device, &prev);
    if (rc == cudaSuccess)
        rc = cudaStreamWaitEvent((cudaStream_t)stream, e->ev, 0);
    if (stream == NULL)
        restore_device(e->device, prev);
    if (rc == cudaSuccess)
        return KOLO_OK;
    cudaGetLastError();
    snprintf(err, errlen, "ordering the result on the program's stream %p "
             "after kolo's on CUDA device %d: %s", stream, e->device,
             cudaGetErrorString(rc));
    return KOLO_ERR_BACKEND;
}

/* Checks that buf is memory of CUDA device `device`. */
static int check_pointer(const kolo__dev_check_t *t, const void *buf,
                         const char *which, char *err, size_t errlen)
{
    struct cudaPointerAttributes attr;
    cudaError_t rc;

    if (buf == NULL)
        return KOLO_OK;
    memset(&attr, 0, sizeof(attr));
    rc = cudaPointerGetAttributes(&attr, buf);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "%s of tensor '%s': CUDA cannot tell where the "
                 "%s buffer %p lives: %s", t->coll, t->name, which, buf,
                 cudaGetErrorString(rc));
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
        snprintf(err, errlen, "%s of tensor '%s': device_type is "
                 "KOLO_DEVICE_CUDA, but the %s buffer %p is host memory",
                 t->coll, t->name, which, buf);
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    if (attr.type == cudaMemoryTypeDevice && attr.device != t->device) {
        snprintf(err, errlen, "%s of tensor '%s': the %s buffer is on CUDA "
                 "device %d, the options name device %d", t->coll, t->name,
                 which, attr.device, t->device);
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    return KOLO_OK;
}

static int nccl_prepare(const kolo__dev_check_t *t, void **event, char *err,
                        size_t errlen)
{
    int count = 0, prev = -1, rc;
    cudaError_t crc;
    nccl_event_t *ev = NULL;
    ncclDataType_t nt;

    *event = NULL;
    /* The devices a process sees do not change: asked once. */
    count = g_device_count;
    crc = cudaSuccess;
    if (count <= 0 && (crc = cudaGetDeviceCount(&count)) == cudaSuccess)
        g_device_count = count;
    if (crc != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(err, errlen, "%s of tensor '%s' on CUDA device %d: rank %d "
                 "sees no CUDA device (cudaGetDeviceCount: %s)", t->coll,
                 t->name, t->device, t->rank,
                 crc != cudaSuccess ? cudaGetErrorString(crc) : "0 devices");
        return KOLO_ERR_UNSUPPORTED;
    }
    if ((rc = kolo__dev_check_placement(t, count, err, errlen)) != KOLO_OK)
        return rc;
    if (t->reduces && nccl_type(t->dtype, &nt) != 0) {
        snprintf(err, errlen, "%s of tensor '%s': NCCL cannot reduce %s; "
                 "convert the CUDA tensor to int32 first", t->coll, t->name,
                 kolo_dtype_name((kolo_dtype_t)t->dtype));
        return KOLO_ERR_UNSUPPORTED;
    }
    CHECK(check_pointer(t, t->input, "input", err, errlen));
    if (t->output != t->input)
        CHECK(check_pointer(t, t->output, "output", err, errlen));

    /* The program's stream gets an event now; kolo's stream waits for it
     * before reading the input. */
    crc = event_get(t->device, 0, &ev);
    if (crc == cudaSuccess) {
        crc = use_device(t->device, &prev);
        if (crc == cudaSuccess)
            crc = cudaEventRecord(ev->ev, (cudaStream_t)t->stream);
        restore_device(t->device, prev);
        if (crc != cudaSuccess) {
            nccl_event_free(ev);
            ev = NULL;
        }
    }
    if (crc != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "%s of tensor '%s': cannot record an event on "
                 "the program's stream %p on CUDA device %d: %s", t->coll,
                 t->name, t->stream, t->device, cudaGetErrorString(crc));
        return KOLO_ERR_BACKEND;
    }
    *event = ev;
    return KOLO_OK;
}

static void nccl_mem_free(void *data)
{
    if (data != NULL)
        cudaFree(data);
}

static int nccl_result_copy(int device, const void *src, void *dst,
                            size_t bytes, char *err, size_t errlen)
{
    cudaStream_t s = NULL;
    int prev = -1;
    cudaError_t rc;

    if (bytes == 0)
        return KOLO_OK;
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    rc = prev == device ? cudaSuccess : cudaSetDevice(device);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (rc == cudaSuccess) {
        rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
        if (rc == cudaSuccess)
            rc = cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
    }
    if (prev >= 0 && prev != device)
        cudaSetDevice(prev);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "kolo_result_copy: copying %zu bytes from CUDA "
                 "device %d failed: %s", bytes, device, cudaGetErrorString(rc));
        return KOLO_ERR_BACKEND;
    }
    return KOLO_OK;
}

/* ---- waiting for the GPU -------------------------------------------------- */

/* Runs on a CUDA runtime thread when the stream reaches it: no CUDA calls. */
static void CUDART_CB host_done(void *arg)
{
    nccl_ctx_t *c = arg;
    pthread_mutex_lock(&c->mu);
    c->finished++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
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
static void drain(nccl_ctx_t *c)
{
    for (int i = 0; i < 500; i++) {
        cudaError_t rc = cudaStreamQuery(c->stream);
        if (rc != cudaErrorNotReady)
            break;
        usleep(10000);
    }
    cudaGetLastError();
}

/* Looks for what would keep the queued work from finishing: a fault in
 * a kernel (the stream is in error), NCCL's asynchronous error, a lost
 * peer (at most once every PEERS_EVERY_US), and with `expired` the
 * timeout. On any of them aborts the communicators (which ends NCCL's
 * kernels), lets the stream drain and fails naming `what`. */
static int check_health(nccl_ctx_t *c, const char *what, int expired)
{
    int64_t t = now_us();
    ncclResult_t bad;
    cudaError_t crc;
    char lost[512];

    crc = cudaStreamQuery(c->stream);
    if (crc != cudaSuccess && crc != cudaErrorNotReady) {
        abort_comms(c);
        drain(c);
        return cuda_ok(c, crc, what);
    }
    if ((bad = async_error(c->comm)) != ncclSuccess ||
        (bad = async_error(c->local)) != ncclSuccess) {
        int code = nccl_code(bad);
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", ncclGetLastError(NULL));
        abort_comms(c);
        drain(c);
        return failf(c, code, "NCCL failed during %s: %s (%s); the NCCL "
                     "communicators were aborted", what,
                     ncclGetErrorString(bad), msg);
    }
    if (t - c->peers_at >= PEERS_EVERY_US) {
        c->peers_at = t;
        if (c->cfg.lost != NULL &&
            c->cfg.lost(c->cfg.arg, lost, sizeof(lost)) > 0) {
            abort_comms(c);
            drain(c);
            return failf(c, KOLO_ERR_RANK_LOST, "lost %s during %s; the "
                         "NCCL communicators were aborted", lost, what);
        }
    }
    if (expired) {
        abort_comms(c);
        drain(c);
        return failf(c, KOLO_ERR_TIMEOUT, "%s did not finish within %g s "
                     "(KOLO_TIMEOUT_SECONDS): some rank is not taking part, "
                     "or the device is stuck; the NCCL communicators were "
                     "aborted", what, c->cfg.timeout_s);
    }
    return KOLO_OK;
}

/* Sleeps until the GPU has done everything queued on the stream so far
 * (the hierarchical allreduce, for its shard on the host), checking the
 * queued work's health every 100 ms. */
static int gpu_wait(nccl_ctx_t *c, const char *what)
{
    int64_t start = now_us();
    double limit_us = c->cfg.timeout_s * 1e6;
    uint64_t target;
    cudaError_t crc;

    c->issued++;
    target = c->issued;
    crc = cudaLaunchHostFunc(c->stream, host_done, c);
    if (crc != cudaSuccess) {
        c->issued--;
        return cuda_ok(c, crc, "queueing the completion of the GPU work");
    }
    pthread_mutex_lock(&c->mu);
    while (c->finished < target) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += WATCH_NS;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (c->finished >= target)
            break;
        pthread_mutex_unlock(&c->mu);
        CHECK(check_health(c, what, (double)(now_us() - start) > limit_us));
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    /* A kernel that faulted leaves the stream in error. */
    crc = cudaStreamQuery(c->stream);
    if (crc != cudaSuccess && crc != cudaErrorNotReady)
        return cuda_ok(c, crc, what);
    return KOLO_OK;
}

static int nccl_watch(void *ctx, const char *what, int expired, char *err,
                      size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);

    if (c->broken)
        return failf(c, KOLO_ERR_BACKEND, "an earlier NCCL failure aborted "
                     "this process set's communicators");
    return check_health(c, what, expired);
}

static int nccl_record(void *ctx, void **event, char *err, size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    nccl_event_t *e = NULL;

    *event = NULL;
    CHECK(cuda_ok(c, event_get(c->device, 0, &e), "creating a CUDA event"));
    if (cudaEventRecord(e->ev, c->stream) != cudaSuccess) {
        nccl_event_free(e);
        return cuda_ok(c, cudaGetLastError(), "recording the batch's event");
    }
    *event = e;
    return KOLO_OK;
}

/* ---- the timeline's device side ------------------------------------------ */

static int nccl_mark(void *ctx, int device, void *stream, void **event)
{
    nccl_ctx_t *c = ctx;
    nccl_event_t *e = NULL;
    cudaError_t rc;
    int prev = -1;

    *event = NULL;
    if (c != NULL) {
        device = c->device;
        stream = c->stream;
    }
    if (event_get(device, 1, &e) != cudaSuccess) {
        cudaGetLastError();
        return KOLO_ERR_BACKEND;
    }
    rc = use_device(device, &prev);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(e->ev, (cudaStream_t)stream);
    restore_device(device, prev);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        nccl_event_free(e);
        return KOLO_ERR_BACKEND;
    }
    *event = e;
    return KOLO_OK;
}

/* A new base for `device`: a timed event on an idle stream of its own,
 * waited for; its host time is the middle of the record and the wait's
 * return (tried again, up to 3 times, while that takes over 50 us). A
 * failure leaves no CUDA error behind. Under g_base_mu. */
static cudaError_t new_base(int device)
{
    cudaStream_t s = NULL;
    cudaEvent_t ev = NULL;
    cudaError_t rc;
    int prev = -1;

    int64_t t0 = 0, t1 = 0;

    rc = use_device(device, &prev);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaEventCreate(&ev);
    for (int i = 0; rc == cudaSuccess && i < 3; i++) {
        t0 = kolo__now_us();
        rc = cudaEventRecord(ev, s);
        if (rc == cudaSuccess)
            rc = cudaEventSynchronize(ev);
        t1 = kolo__now_us();
        if (t1 - t0 <= 50)
            break;
    }
    if (rc == cudaSuccess) {
        if (g_base[device] != NULL)
            cudaEventDestroy(g_base[device]);
        g_base[device] = ev;
        g_base_us[device] = t0 + (t1 - t0) / 2;
        ev = NULL;
    } else {
        cudaGetLastError();
    }
    if (ev != NULL)
        cudaEventDestroy(ev);
    if (s != NULL)
        cudaStreamDestroy(s);
    restore_device(device, prev);
    return rc;
}

static int nccl_event_time(void *event, int64_t *us)
{
    nccl_event_t *e = event;
    cudaError_t rc;
    float ms = 0;
    int d = e->device;

    if (!e->timed || d < 0 || d >= MAX_DEVICES)
        return KOLO_ERR_INVALID_ARGUMENT;
    rc = cudaEventQuery(e->ev);
    if (rc == cudaErrorNotReady)
        return 0;
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return KOLO_ERR_BACKEND;
    }
    pthread_mutex_lock(&g_base_mu);
    rc = g_base[d] == NULL ? new_base(d) : cudaSuccess;
    if (rc == cudaSuccess)
        rc = cudaEventElapsedTime(&ms, g_base[d], e->ev);
    if (rc == cudaSuccess && ms > BASE_SPAN_MS && new_base(d) == cudaSuccess)
        rc = cudaEventElapsedTime(&ms, g_base[d], e->ev);
    if (rc == cudaSuccess)
        *us = g_base_us[d] + (int64_t)((double)ms * 1000.0);
    pthread_mutex_unlock(&g_base_mu);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return KOLO_ERR_BACKEND;
    }
    return 1;
}

/* ---- set-up --------------------------------------------------------------- */

/* Every member shares a 128-byte NCCL id over the set's controller; a
 * member that leads a communicator fills its slot. */
static int exchange_ids(nccl_ctx_t *c, int lead, ncclUniqueId *all)
{
    ncclUniqueId mine;
    ncclResult_t nrc;

    memset(&mine, 0, sizeof(mine));
    if (lead && (nrc = ncclGetUniqueId(&mine)) != ncclSuccess)
        return failf(c, KOLO_ERR_BACKEND, "ncclGetUniqueId: %s (%s)",
                     ncclGetErrorString(nrc), ncclGetLastError(NULL));
    return c->cfg.allgather(c->cfg.arg, &mine, all, sizeof(mine), c->err,
                            c->errlen);
}

static int comm_init(nccl_ctx_t *c, const ncclUniqueId *id, int n, int me,
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
    rc = nccl_ok(c, comm, nrc, what);
    if (rc != KOLO_OK) {
        if (comm != NULL)
            ncclCommAbort(comm); /* not in c yet: abort_comms missed it */
        return rc;
    }
    *out = comm;
    return KOLO_OK;
}

/* The set's communicator over every member. */
static int ensure_comm(nccl_ctx_t *c)
{
    ncclUniqueId *ids;
    char what[96];
    int rc;

    if (c->comm != NULL)
        return KOLO_OK;
    ids = kolo__calloc((size_t)c->cfg.size, sizeof(*ids));
    if (ids == NULL)
        return failf(c, KOLO_ERR_NO_MEMORY, "out of memory for NCCL ids");
    rc = exchange_ids(c, c->cfg.rank == 0, ids);
    snprintf(what, sizeof(what), "creating the NCCL communicator of process "
             "set %d (%d ranks)", c->cfg.set_id, c->cfg.size);
    if (rc == KOLO_OK)
        rc = comm_init(c, &ids[0], c->cfg.size, c->cfg.rank, &c->comm, what);
    free(ids);
    return rc;
}

/* Decides, once per set, whether allreduce is hierarchical, and sets it up:
 * an NCCL communicator per host and a network context per local index. */
static int ensure_hier(nccl_ctx_t *c)
{
    const int *hosts = c->cfg.hosts;
    int n = c->cfg.size, rc = KOLO_OK;
    int *xmem = NULL, *xhost = NULL;
    ncclUniqueId *ids = NULL;
    kolo__hosts_t g = {0};
    char role[64], what[128];

    if (c->hier >= 0)
        return KOLO_OK;
    c->hier = 0;
    if (!c->cfg.hierarchical || hosts == NULL || n == 1)
        return KOLO_OK;
    xmem = kolo__malloc((size_t)n * sizeof(int));
    xhost = kolo__malloc((size_t)n * sizeof(int));
    ids = kolo__calloc((size_t)n, sizeof(*ids));
    if (!xmem || !xhost || !ids ||
        kolo__hosts_group(hosts, n, c->cfg.rank, &g) != 0) {
        rc = failf(c, KOLO_ERR_NO_MEMORY, "out of memory setting up "
                   "hierarchical allreduce");
        goto out;
    }
    c->nlocal = g.nlocal;
    c->nhosts = g.nhosts;
    c->me_local = g.me_local;
    c->me_host = g.me_host;
    if (!g.same || g.nhosts < 2) {
        if (c->cfg.rank == 0 && c->cfg.warn != NULL) {
            char msg[256];
            snprintf(msg, sizeof(msg), "KOLO_HIERARCHICAL_ALLREDUCE=1, but "
                     "process set %d %s: its CUDA allreduce stays flat on "
                     "NCCL", c->cfg.set_id, !g.same ? "does not have the same "
                     "number of ranks on every host" : "is on one host");
            c->cfg.warn(msg);
        }
        goto out;
    }
    for (int k = 0; k < g.nhosts; k++) {
        xmem[k] = c->cfg.members[g.cross[k]];
        xhost[k] = hosts[g.cross[k]];
    }
    /* Within the host: NCCL, led by the host's first member. */
    rc = exchange_ids(c, g.local[0] == c->cfg.rank, ids);
    snprintf(what, sizeof(what), "creating the NCCL communicator of host %d "
             "in process set %d (%d ranks)", hosts[c->cfg.rank],
             c->cfg.set_id, c->nlocal);
    if (rc == KOLO_OK)
        rc = comm_init(c, &ids[g.local[0]], c->nlocal, c->me_local, &c->local,
                       what);
    if (rc != KOLO_OK)
        goto out;
    /* Across hosts: the runtime's network backend, one context per local
     * index. */
    snprintf(role, sizeof(role), "gpu-cross%d", c->me_local);
    rc = c->cfg.connect(c->cfg.arg, role, c->me_host, c->nhosts, xmem, xhost,
                        &c->cross_ops, &c->cross_ctx, c->err, c->errlen);
    if (rc != KOLO_OK) {
        c->cross_ctx = NULL;
        goto out;
    }
    c->hier = 1;
out:
    kolo__hosts_free(&g);
    free(xmem);
    free(xhost);
    free(ids);
    return rc;
}

static void ctx_free(nccl_ctx_t *c)
{
    free(c->members);
    free(c->hosts);
    free(c);
}

static int nccl_init(const kolo__dev_config_t *cfg, void **out, char *err,
                     size_t errlen)
{
    nccl_ctx_t *c = kolo__calloc(1, sizeof(*c));
    pthread_condattr_t attr;
    int rc;

    *out = NULL;
    if (c == NULL) {
        snprintf(err, errlen, "out of memory for GPU state");
        return KOLO_ERR_NO_MEMORY;
    }
    c->cfg = *cfg;
    c->members = kolo__malloc((size_t)cfg->size * sizeof(int));
    c->hosts = cfg->hosts ? kolo__malloc((size_t)cfg->size * sizeof(int)) : NULL;
    if (c->members == NULL || (cfg->hosts != NULL && c->hosts == NULL)) {
        ctx_free(c);
        snprintf(err, errlen, "out of memory for GPU state");
        return KOLO_ERR_NO_MEMORY;
    }
    memcpy(c->members, cfg->members, (size_t)cfg->size * sizeof(int));
    if (cfg->hosts != NULL)
        memcpy(c->hosts, cfg->hosts, (size_t)cfg->size * sizeof(int));
    c->cfg.members = c->members;
    c->cfg.hosts = c->hosts;
    c->device = cfg->device;
    c->hier = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &attr);
    pthread_condattr_destroy(&attr);
    enter(c, err, errlen);
    /* From here on the state is the set's (finalize frees it), even when
     * the stream cannot be made: the runtime keeps *out. */
    *out = c;
    rc = cuda_ok(c, cudaSetDevice(c->device), "cudaSetDevice");
    if (rc == KOLO_OK)
        rc = cuda_ok(c, cudaStreamCreateWithFlags(&c->stream,
                                                  cudaStreamNonBlocking),
                     "creating kolo's CUDA stream");
    return rc;
}

static void nccl_finalize(void *ctx)
{
    nccl_ctx_t *c = ctx;
    int prev = -1;

    if (c == NULL)
        return;
    if (c->cross_ctx != NULL)
        c->cross_ops->finalize(c->cross_ctx);
    /* Abort rather than destroy: every batch has finished (the runtime saw
     * every event pass before calling this), so there is nothing to flush,
     * and abort never waits for a peer that is already gone. */
    if (c->comm != NULL)
        ncclCommAbort(c->comm);
    if (c->local != NULL)
        ncclCommAbort(c->local);
    if (c->broken)
        return; /* a host function may still run: keep the state */
    if (cudaGetDevice(&prev) != cudaSuccess)
        prev = -1;
    cudaSetDevice(c->device);
    if (c->fusion != NULL)
        cudaFree(c->fusion);
    if (c->stage != NULL)
        cudaFreeHost(c->stage);
    if (c->stream != NULL)
        cudaStreamDestroy(c->stream);
    if (prev >= 0 && prev != c->device)
        cudaSetDevice(prev);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    ctx_free(c);
}

static int nccl_begin(void *ctx, char *err, size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);

    if (c->stream == NULL)
        return failf(c, KOLO_ERR_BACKEND, "kolo's CUDA stream on device %d "
                     "could not be created", c->device);
    CHECK(cuda_ok(c, cudaSetDevice(c->device), "cudaSetDevice"));
    if (c->broken)
        return failf(c, KOLO_ERR_BACKEND, "an earlier NCCL failure aborted "
                     "this process set's communicators");
    return KOLO_OK;
}

/* Grows *buf (*cap bytes) to at least `bytes`: device memory, or pinned
 * host memory (pinned). The old buffer goes first; cudaFree and
 * cudaFreeHost wait for the work that uses it. */
static int reserve(nccl_ctx_t *c, void **buf, size_t *cap, size_t bytes,
                   int pinned)
{
    void *p = NULL;

    if (*cap >= bytes)
        return KOLO_OK;
    if (*buf != NULL) {
        if (pinned)
            cudaFreeHost(*buf);
        else
            cudaFree(*buf);
        *buf = NULL;
        *cap = 0;
    }
    CHECK(cuda_ok(c, pinned ? cudaMallocHost(&p, bytes) : cudaMalloc(&p, bytes),
                  pinned ? "allocating pinned host memory"
                         : "allocating the fusion buffer"));
    *buf = p;
    *cap = bytes;
    return KOLO_OK;
}

/* kolo's stream waits for the program's work on every input. The events
 * are prepare's: entries of the pool, each holding its CUDA event. */
static int nccl_wait_events(void *ctx, void *const *events, size_t n,
                            char *err, size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);

    for (size_t i = 0; i < n; i++) {
        const nccl_event_t *e = events[i];
        if (e != NULL)
            CHECK(cuda_ok(c, cudaStreamWaitEvent(c->stream, e->ev, 0),
                          "waiting for the program's stream"));
    }
    return KOLO_OK;
}

static int nccl_alloc(void *ctx, size_t bytes, void **out, char *err,
                      size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    void *data = NULL;

    *out = NULL;
    if (cudaMalloc(&data, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return failf(c, KOLO_ERR_NO_MEMORY, "out of memory on CUDA device %d "
                     "for a result of %zu bytes", c->device, bytes);
    }
    *out = data;
    return KOLO_OK;
}

/* ---- allreduce ------------------------------------------------------------ */

/* The hierarchical steps on buf (padded elements, a multiple of nlocal):
 * reduce-scatter within the host, the shard allreduced across hosts in
 * host memory, allgather within the host. */
static int allreduce_hier(nccl_ctx_t *c, uint8_t *buf, size_t padded,
                          size_t esize, int wire, int op,
                          kolo__ops_reduce_fn reduce)
{
    size_t shard = padded / (size_t)c->nlocal;
    uint8_t *mine = buf + (size_t)c->me_local * shard * esize;
    ncclDataType_t t;
    ncclRedOp_t nop = nccl_op(op, wire);

    nccl_type(wire, &t);
    if (c->nlocal > 1)
        CHECK(nccl_ok(c, c->local, ncclReduceScatter(buf, mine, shard, t, nop,
                                                     c->local, c->stream),
                      "ncclReduceScatter within the host"));
    if (shard > 0) {
        CHECK(reserve(c, &c->stage, &c->stage_cap, shard * esize, 1));
        CHECK(cuda_ok(c, cudaMemcpyAsync(c->stage, mine, shard * esize,
                                         cudaMemcpyDeviceToHost, c->stream),
                      "copying the shard to the host"));
        CHECK(gpu_wait(c, "the reduce-scatter within the host"));
        CHECK(c->cross_ops->allreduce(c->cross_ctx, NULL, c->stage, shard,
                                      esize, reduce, c->err, c->errlen));
        CHECK(cuda_ok(c, cudaMemcpyAsync(mine, c->stage, shard * esize,
                                         cudaMemcpyHostToDevice, c->stream),
                      "copying the shard back to the device"));
    }
    if (c->nlocal > 1)
        CHECK(nccl_ok(c, c->local, ncclAllGather(mine, buf, shard, t, c->local,
                                                 c->stream),
                      "ncclAllGather within the host"));
    return KOLO_OK;
}

/* Copies the batch's tensors into (in = 1) or out of the fusion buffer,
 * converting between dtype and wire; a joined rank's stand-ins are zeros
 * going in and dropped coming out. */
static int move_batch(nccl_ctx_t *c, const kolo__dev_tensor_t *ts, size_t n,
                      int dtype, int wire, int in, double scale)
{
    size_t esize = kolo_dtype_size((kolo_dtype_t)wire), at = 0, k = 0;
    kolo__gpu_copy_t *copies = kolo__malloc(n * sizeof(*copies));
    uint8_t *fusion = c->fusion;
    int rc = KOLO_OK;

    if (copies == NULL)
        return failf(c, KOLO_ERR_NO_MEMORY, "out of memory packing %zu "
                     "tensors", n);
    for (size_t i = 0; i < n && rc == KOLO_OK; i++) {
        if (ts[i].in == NULL) {
            if (in)
                rc = kernel_ok(c, kolo__gpu_zero(fusion + at * esize,
                                                 ts[i].count, wire, c->stream),
                               "zeroing a joined rank's share");
        } else if (in) {
            copies[k++] = (kolo__gpu_copy_t){ts[i].in, fusion + at * esize,
                                             ts[i].count};
        } else {
            copies[k++] = (kolo__gpu_copy_t){fusion + at * esize, ts[i].out,
                                             ts[i].count};
        }
        at += ts[i].count;
    }
    if (rc == KOLO_OK && k > 0)
        rc = kernel_ok(c, in ? kolo__gpu_copy_batch(copies, k, dtype, wire,
                                                     scale, c->stream)
                             : kolo__gpu_copy_batch(copies, k, wire, dtype,
                                                    1.0, c->stream),
                       in ? "packing the fusion buffer"
                          : "unpacking the fusion buffer");
    free(copies);
    return rc;
}

/* AVERAGE as Horovod's NCCL allreduce does it: ncclAvg on a flat
 * communicator for floating types (NCCL >= 2.10: each rank's input is
 * multiplied by 1/size in the tensor's type, then summed), else a sum and
 * postscale / size. */
static ncclRedOp_t average_op(nccl_ctx_t *c, int wire, double *post)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    if (!c->hier && (wire == KOLO_FLOAT16 || wire == KOLO_BFLOAT16 ||
                     wire == KOLO_FLOAT32 || wire == KOLO_FLOAT64))
        return ncclAvg;
#endif
    if (c->cfg.size > 1)
        *post /= (double)c->cfg.size;
    return ncclSum;
}

static int nccl_allreduce(void *ctx, const kolo__dev_tensor_t *ts, size_t n,
                          int dtype, int wire, int op, double prescale,
                          double post, kolo__ops_reduce_fn reduce, char *err,
                          size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    size_t esize = kolo_dtype_size((kolo_dtype_t)wire), count = 0, padded;
    int standins = 0;
    ncclDataType_t t;
    ncclRedOp_t nop;
    uint8_t *buf;

    for (size_t i = 0; i < n; i++) {
        count += ts[i].count;
        standins |= ts[i].in == NULL;
    }
    if (count == 0)
        return KOLO_OK;
    if (nccl_type(wire, &t) != 0)
        return failf(c, KOLO_ERR_UNSUPPORTED, "NCCL cannot reduce %s",
                     kolo_dtype_name((kolo_dtype_t)wire));
    CHECK(ensure_hier(c));
    if (!c->hier)
        CHECK(ensure_comm(c));
    nop = op == KOLO_OP_AVERAGE ? average_op(c, wire, &post)
                                : nccl_op(op, wire);
    padded = c->hier ? (count + (size_t)c->nlocal - 1) / (size_t)c->nlocal *
                           (size_t)c->nlocal
                     : count;

    if (n == 1 && wire == dtype && !standins && !c->hier) {
        /* Alone and uncompressed: reduced from the user's buffers. */
        const void *in = ts[0].in;
        buf = ts[0].out;
        if (prescale != 1.0) {
            if (in != buf) {
                kolo__gpu_copy_t cp = {in, buf, count};
                CHECK(kernel_ok(c, kolo__gpu_copy_batch(&cp, 1, wire, wire,
                                                        prescale, c->stream),
                                "prescaling"));
            } else {
                CHECK(kernel_ok(c, kolo__gpu_scale(buf, count, wire, prescale,
                                                   c->stream),
                                "prescaling"));
            }
            in = buf;
        }
        CHECK(nccl_ok(c, c->comm, ncclAllReduce(in, buf, count, t, nop,
                                                c->comm, c->stream),
                      "ncclAllReduce"));
    } else {
        CHECK(reserve(c, &c->fusion, &c->fusion_cap, padded * esize, 0));
        buf = c->fusion;
        CHECK(move_batch(c, ts, n, dtype, wire, 1, prescale));
        if (padded > count)
            CHECK(kernel_ok(c, kolo__gpu_zero(buf + count * esize,
                                              padded - count, wire, c->stream),
                            "zeroing the padding"));
        if (c->hier)
            CHECK(allreduce_hier(c, buf, padded, esize, wire, op, reduce));
        else
            CHECK(nccl_ok(c, c->comm, ncclAllReduce(buf, buf, count, t, nop,
                                                    c->comm, c->stream),
                          "ncclAllReduce"));
    }
    if (post != 1.0)
        CHECK(kernel_ok(c, kolo__gpu_scale(buf, count, wire, post, c->stream),
                        "postscaling"));
    if (buf == c->fusion)
        CHECK(move_batch(c, ts, n, dtype, wire, 0, 1.0));
    return KOLO_OK;
}

/* ---- the other collectives ------------------------------------------------ */

static int nccl_broadcast(void *ctx, void *buf, size_t bytes, int root,
                          char *err, size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);

    CHECK(ensure_comm(c));
    return nccl_ok(c, c->comm, ncclBroadcast(buf, buf, bytes, ncclUint8, root,
                                             c->comm, c->stream),
                   "ncclBroadcast");
}

static int nccl_allgatherv(void *ctx, const void *in, void *out,
                           const size_t *bytes, char *err, size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    size_t total = 0;
    int equal = 1;

    for (int i = 0; i < c->cfg.size; i++) {
        total += bytes[i];
        equal &= bytes[i] == bytes[0];
    }
    CHECK(ensure_comm(c));
    if (equal && bytes[0] > 0)
        return nccl_ok(c, c->comm, ncclAllGather(in, out, bytes[0], ncclUint8,
                                                 c->comm, c->stream),
                       "ncclAllGather");
    if (total > 0) {
        /* Sizes differ: one broadcast per rank, grouped. */
        size_t off = 0;
        ncclResult_t nrc = ncclGroupStart(), end;
        for (int i = 0; nrc == ncclSuccess && i < c->cfg.size; i++) {
            uint8_t *dst = (uint8_t *)out + off;
            if (bytes[i] > 0)
                nrc = ncclBroadcast(i == c->cfg.rank ? in : dst, dst, bytes[i],
                                    ncclUint8, i, c->comm, c->stream);
            off += bytes[i];
        }
        end = ncclGroupEnd();
        return nccl_ok(c, c->comm, nrc != ncclSuccess ? nrc : end,
                       "allgather (grouped ncclBroadcast)");
    }
    return KOLO_OK;
}

static int nccl_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                          void *out, const size_t *recv_bytes, char *err,
                          size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    size_t soff = 0, roff = 0;
    ncclResult_t nrc, end;

    CHECK(ensure_comm(c));
    nrc = ncclGroupStart();
    for (int j = 0; nrc == ncclSuccess && j < c->cfg.size; j++) {
        if (send_bytes[j] > 0)
            nrc = ncclSend((const uint8_t *)in + soff, send_bytes[j], ncclUint8,
                           j, c->comm, c->stream);
        if (nrc == ncclSuccess && recv_bytes[j] > 0)
            nrc = ncclRecv((uint8_t *)out + roff, recv_bytes[j], ncclUint8, j,
                           c->comm, c->stream);
        soff += send_bytes[j];
        roff += recv_bytes[j];
    }
    end = ncclGroupEnd();
    return nccl_ok(c, c->comm, nrc != ncclSuccess ? nrc : end,
                   "alltoall (grouped ncclSend/ncclRecv)");
}

static int nccl_reduce_scatter(void *ctx, const void *in, void *out,
                               const size_t *counts, int dtype, int op,
                               double prescale, double post,
                               kolo__ops_reduce_fn reduce, char *err,
                               size_t errlen)
{
    nccl_ctx_t *c = enter(ctx, err, errlen);
    size_t esize = kolo_dtype_size((kolo_dtype_t)dtype), total = 0;
    size_t mine = counts[c->cfg.rank];

    (void)reduce; /* NCCL reduces on the device */
    const uint8_t *src = in;
    ncclDataType_t t;
    int equal = 1;

    for (int i = 0; i < c->cfg.size; i++) {
        total += counts[i];
        equal &= counts[i] == counts[0];
    }
    nccl_type(dtype, &t);
    CHECK(ensure_comm(c));
    if (total > 0 && prescale != 1.0) {
        kolo__gpu_copy_t cp = {in, NULL, total};
        CHECK(reserve(c, &c->fusion, &c->fusion_cap, total * esize, 0));
        cp.dst = c->fusion;
        CHECK(kernel_ok(c, kolo__gpu_copy_batch(&cp, 1, dtype, dtype, prescale,
                                                c->stream),
                        "prescaling"));
        src = c->fusion;
    }
    if (total > 0) {
        ncclRedOp_t nop = nccl_op(op, dtype);
        if (equal) {
            CHECK(nccl_ok(c, c->comm, ncclReduceScatter(src, out, mine, t, nop,
                                                        c->comm, c->stream),
                          "ncclReduceScatter"));
        } else {
            /* Uneven shares: one reduce per rank to that rank, grouped. */
            size_t off = 0;
            ncclResult_t nrc = ncclGroupStart(), end;
            for (int i = 0; nrc == ncclSuccess && i < c->cfg.size; i++) {
                if (counts[i] > 0)
                    nrc = ncclReduce(src + off * esize,
                                     i == c->cfg.rank ? out : NULL, counts[i],
                                     t, nop, i, c->comm, c->stream);
                off += counts[i];
            }
            end = ncclGroupEnd();
            CHECK(nccl_ok(c, c->comm, nrc != ncclSuccess ? nrc : end,
                          "reducescatter (grouped ncclReduce)"));
        }
    }
    if (mine > 0 && post != 1.0)
        CHECK(kernel_ok(c, kolo__gpu_scale(out, mine, dtype, post, c->stream),
                        "postscaling"));
    return KOLO_OK;
}

const kolo__dev_ops_t kolo__dev_ops_nccl = {
    .name = "nccl",
    .device_count = nccl_device_count,
    .version = nccl_version,
    .prepare = nccl_prepare,
    .event_free = nccl_event_free,
    .event_query = nccl_event_query,
    .order = nccl_order,
    .result_copy = nccl_result_copy,
    .mem_free = nccl_mem_free,
    .init = nccl_init,
    .finalize = nccl_finalize,
    .begin = nccl_begin,
    .wait_events = nccl_wait_events,
    .alloc = nccl_alloc,
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgatherv = nccl_allgatherv,
    .alltoallv = nccl_alltoallv,
    .reduce_scatter = nccl_reduce_scatter,
    .record = nccl_record,
    .watch = nccl_watch,
    .mark = nccl_mark,
    .event_time = nccl_event_time,
};
