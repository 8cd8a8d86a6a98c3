/*
 * ops.h — the small tables where the runtime meets a backend.
 *
 * The runtime never includes a backend's header and a backend never reaches
 * into the runtime's tables: everything between them passes through
 * kolo__ops_t (tensors in host memory) or kolo__dev_ops_t (tensors in
 * device memory, further down). A backend is a folder ops/<name>/ with its
 * source, its configure checks (configure.m4) and its build lines
 * (Makefile.include); its source defines one const table filled with
 * designated initializers, every slot set, and its capabilities (caps),
 * from which the one chooser (ops/registry.c) picks a backend for each
 * role of each process set.
 *
 * Contract for every slot:
 *  - Called from the runtime's background thread only, one call at a time,
 *    and in the same order on every rank (these are collectives).
 *  - Returns KOLO_OK or a negative KOLO_ERR_* code; on failure writes one
 *    sentence to err (errlen bytes, NUL-terminated) that says what failed,
 *    including the peer rank when known. KOLO_ERR_TIMEOUT when no progress
 *    was made within the configured timeout; KOLO_ERR_RANK_LOST when a peer
 *    closed its connection; KOLO_ERR_BACKEND otherwise.
 *  - Blocks in the kernel (sockets, condition variables) while waiting for
 *    peers: it must never spin, because ranks share cores with the
 *    training threads.
 *  - Must not throw, longjmp or exit: C++ backends catch everything at the
 *    boundary.
 *
 * Wake tokens. A rank whose background thread sleeps cannot see that a peer
 * started a negotiation round, and the peer would block until the sleeper's
 * timer fired. So a rank that starts a round after sleeping sends every
 * peer a token carrying the round's number (wake_peers), and the backend
 * delivers tokens from peers by calling cfg->on_wake from a thread of its
 * own, which wakes the background thread. The same callback reports a lost
 * connection (round = UINT64_MAX), so a sleeping rank learns of a dead peer
 * at once.
 */
#ifndef KOLO_OPS_H
#define KOLO_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kolo.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element-wise reduction: out[i] = a[i] (op) b[i] for n elements; out may
 * alias a or b. Supplied by the runtime, so every backend reduces every
 * dtype the same way. */
typedef void (*kolo__ops_reduce_fn)(void *out, const void *a, const void *b,
                                    size_t n);

typedef void (*kolo__ops_wake_fn)(void *arg, uint64_t round);

/* A warning the backend wants the user to see (one sentence, no newline).
 * May be called from a backend thread; must not block for long. */
typedef void (*kolo__ops_warn_fn)(const char *msg);

/* Where a streamed allreduce (allreduce_stream) takes its input and puts
 * its result, so that a backend with buffers of its own (shared memory,
 * kolo's TCP ring) packs the user's tensors straight into them, with no
 * fusion buffer in between. Elements are numbered 0..count-1 across the
 * whole batch, in the wire dtype. fill, view and drain may be called at
 * any element, in any order. */
typedef struct kolo__ops_stream {
    /* Writes elements [at, at + n) of this rank's input to dst. Elements
     * that no call fills (or views) are skipped. */
    void (*fill)(void *arg, void *dst, size_t at, size_t n);
    /* Where elements from `at` can be read where they lie (one tensor,
     * already in the wire dtype and prescaled): a pointer to element `at`,
     * valid for the whole collective, and in *run how many of the n
     * elements follow it there (at least 1). Else NULL: fill them. NULL
     * function: always fill. A rank reduces its own shard straight from
     * its input this way, instead of copying it first. */
    const void *(*view)(void *arg, size_t at, size_t n, size_t *run);
    /* Called on n reduced elements before they are drained (averaging,
     * postscale); it does the same on every rank. NULL: nothing. */
    void (*finish)(void *arg, void *buf, size_t n);
    /* Takes reduced elements [at, at + n) from src. */
    void (*drain)(void *arg, const void *src, size_t at, size_t n);
    /* Where results from element `at` can be written where they stay (the
     * output tensor, in the wire dtype): a pointer to element `at`, valid
     * for the whole collective, and in *run how many of the n elements
     * follow it there (at least 1); never NULL for an element of the
     * batch. A backend that writes results there finishes them in place
     * and does not drain them; until then it may use that memory as its
     * own (this rank's input there is read first, through view or fill).
     * NULL function: drain every result. */
    void *(*place)(void *arg, size_t at, size_t n, size_t *run);
    void *arg;
} kolo__ops_stream_t;

typedef struct kolo__ops_config {
    int rank, size;         /* this rank's place in the context */
    const int *members;     /* [size]: the global rank of each member */
    const int *hosts;       /* [size]: the host index of each member (equal
                               index: same host, same shared memory) */
    int global_rank;        /* this rank in the whole job */
    const char *cross_ops;  /* hier: the network backend between hosts */
    size_t shm_slot_bytes;  /* shm: bytes per rank and step (0: auto) */
    int shm_spin_us;        /* shm: spin this long before sleeping (< 0:
                               the default, 50) */
    size_t ring_send_buffer; /* gloo: SO_SNDBUF of kolo's ring sockets (0:
                               the kernel's autotuning) */
    const char *rendezvous; /* "file:DIR" or "redis:HOST:PORT[/JOB]" */
    const char *prefix;     /* keys of this context in the rendezvous store:
                               unique per kolo_init and process set */
    const char *hostname;   /* address to bind */
    double timeout_s;       /* per-operation progress timeout */
    double start_timeout_s; /* how long init waits for every rank */
    kolo__ops_wake_fn on_wake; /* called from a backend thread; must only
                                  set a flag and signal (never block) */
    void *wake_arg;
    /* While init waits for peers it calls this every few tens of ms (NULL:
     * never): non-zero means a peer has already failed to connect, with
     * its reason in why, and init must give up at once with
     * KOLO_ERR_BACKEND instead of waiting out the start timeout. */
    int (*abandoned)(void *arg, char *why, size_t len);
    void *abandoned_arg;
    kolo__ops_warn_fn warn;    /* NULL: the backend's warnings are dropped */
    /* The job's key (KOLO__KEY_BYTES, auth.h), from which each context's
     * connections prove they belong; NULL: the job has no secret (the Gloo
     * backend then shares a random one through the rendezvous store). */
    const uint8_t *job_key;
} kolo__ops_config_t;

/* What a backend can do, for the one chooser (ops/registry.c). */
enum {
    KOLO__OPS_USER = 1 << 0,     /* users may name it: KOLO_CONTROLLER,
                                    KOLO_CPU_OPERATIONS, kolo-bench */
    KOLO__OPS_ONE_HOST = 1 << 1, /* only between the ranks of one host */
    KOLO__OPS_NETWORK = 1 << 2,  /* between hosts */
    KOLO__OPS_MPIRUN = 1 << 3,   /* only in a job that mpirun started */
    KOLO__OPS_HOSTS = 1 << 4,    /* composes one-host and network backends
                                    (hierarchical allreduce) */
    KOLO__OPS_TESTS = 1 << 5,    /* the unit tests' in-memory backend
                                    (ops/mem): named by them only, never
                                    listed, never a default */
    KOLO__OPS_LEAVES = 1 << 6    /* finalize may run while the others are
                                    inside a collective, and ends theirs at
                                    once: they meet a closed connection or
                                    a member that left (not MPI's) */
};

/* Slots both tables have (host memory in kolo__ops_t, device memory in
 * kolo__dev_ops_t). broadcast: root's buf is copied into every rank's
 * buf. allgatherv: rank r contributes bytes[r] bytes (in, of bytes[rank]
 * bytes); out receives them concatenated in rank order. alltoallv: this
 * rank sends send_bytes[j] bytes of `in` (in order) to rank j and receives
 * recv_bytes[j] bytes from rank j into `out`, concatenated in rank order. */
typedef int kolo__ops_broadcast_fn(void *ctx, void *buf, size_t bytes,
                                   int root, char *err, size_t errlen);
typedef int kolo__ops_allgatherv_fn(void *ctx, const void *in, void *out,
                                    const size_t *bytes, char *err,
                                    size_t errlen);
typedef int kolo__ops_alltoallv_fn(void *ctx, const void *in,
                                   const size_t *send_bytes, void *out,
                                   const size_t *recv_bytes, char *err,
                                   size_t errlen);

typedef struct kolo__ops {
    const char *name;
    unsigned caps; /* KOLO__OPS_* */

    /* Connects to every rank of the job. On success *ctx is the backend's
     * state, passed to every other call. */
    int (*init)(const kolo__ops_config_t *cfg, void **ctx, char *err,
                size_t errlen);
    /* Releases everything init acquired (sockets, threads, files). */
    void (*finalize)(void *ctx);

    /* Allreduce of count elements of elem_size bytes with `reduce`. in may
     * equal out; in == NULL means out holds the input. */
    int (*allreduce)(void *ctx, const void *in, void *out, size_t count,
                     size_t elem_size, kolo__ops_reduce_fn reduce, char *err,
                     size_t errlen);
    /* Every rank contributes `bytes` bytes; out receives size * bytes,
     * rank-major. */
    int (*allgather)(void *ctx, const void *in, void *out, size_t bytes,
                     char *err, size_t errlen);
    /* Like allgather, but only root's out is written (out is ignored
     * elsewhere and may be NULL). */
    int (*gather)(void *ctx, const void *in, void *out, size_t bytes, int root,
                  char *err, size_t errlen);
    kolo__ops_broadcast_fn *broadcast;
    kolo__ops_allgatherv_fn *allgatherv; /* variable-size allgather */
    kolo__ops_alltoallv_fn *alltoallv;
    /* Reduce-scatter: `work` holds this rank's whole tensor, counts[r]
     * elements of elem_size per rank block, blocks in rank order; it is
     * used as scratch. out receives the reduction of this rank's block. */
    int (*reduce_scatter)(void *ctx, void *work, void *out,
                          const size_t *counts, size_t elem_size,
                          kolo__ops_reduce_fn reduce, char *err,
                          size_t errlen);
    /* Sends a wake token for `round` to every other rank; never blocks on a
     * peer that is not reading. May be called only from the background
     * thread, like the collectives. */
    int (*wake_peers)(void *ctx, uint64_t round, char *err, size_t errlen);

    /* Optional (NULL: the runtime packs a fusion buffer and calls
     * allreduce): allreduce of count elements taken from and returned
     * through `s`. */
    int (*allreduce_stream)(void *ctx, size_t count, size_t elem_size,
                            kolo__ops_reduce_fn reduce,
                            const kolo__ops_stream_t *s, char *err,
                            size_t errlen);
    /* Optional (NULL: every batch): whether allreduce_stream takes a batch
     * of count elements; the others go through the fusion buffer and
     * allreduce. The answer must be the same on every rank. */
    int (*streams)(void *ctx, size_t count, size_t elem_size);

    /* Optional (NULL: cannot tell): the global rank of the peer whose step
     * the background thread is waiting for right now, or -1. Called from
     * another thread (the stall watchdog) while a collective runs: it may
     * only read what it can read safely then. */
    int (*waiting_for)(void *ctx);

    /* KOLO_CHUNK_BYTES=auto: the bytes of the pieces in which the runtime
     * hands a fused allreduce to `allreduce` (0: 4 MiB, which keeps a
     * piece's copies in cache). A backend whose every call costs much more
     * than a copy asks for more. */
    int64_t chunk_bytes;
} kolo__ops_t;

/* ---- the device table: tensors in device memory ---------------------------
 *
 * A device backend (ops/nccl: CUDA tensors on NCCL; ops/simdev: the unit
 * tests' simulated device) does not fit the host table, because its
 * collectives are queued on a stream of its own and finish later. The
 * runtime keeps all the bookkeeping (which tensors, in which order, the
 * rows, splits and shards of every rank, the results' shapes) in one
 * execution module for both tables (runtime/execute.c): what it asks of a
 * device backend is to queue the moving of bytes on its stream, and an
 * event after each batch (record). The background thread never waits for
 * the device: a batch's handles complete once its work is queued, and the
 * program's stream waits for the event (order) when the program waits for
 * the handle; the batches in flight are watched between rounds
 * (runtime/inflight.c).
 *
 * Contract: the same as the host table's (errors into err, the same order
 * on every rank, never spinning, never throwing), and:
 *  - the context slots are called by one set's background thread only,
 *    and `begin` first at every batch (it makes the context's device the
 *    thread's current one, and fails once the context is broken);
 *  - the collectives queue their work and return; a failure found while
 *    queuing (a wrong argument, a communicator that cannot be made) is
 *    returned at once. A failure found later (an asynchronous error, a
 *    lost peer, the timeout) is found by `watch`, which aborts the
 *    communicators and lets the queued work drain for a few seconds, so
 *    nothing writes a user's buffer after its handle failed; the context
 *    stays broken after that.
 *  - events (ready events from prepare, batch events from record) are
 *    released with event_free, from any thread.
 */

/* One tensor of a fused allreduce: `in` NULL is a joined rank's stand-in,
 * zeros going in, nothing coming out. */
typedef struct kolo__dev_tensor {
    const void *in;
    void *out;
    size_t count;
} kolo__dev_tensor_t;

/* What a tensor needs checked at enqueue (the API thread). */
typedef struct kolo__dev_check {
    const char *coll, *name; /* for messages: "allreduce", the tensor */
    int dtype;
    int reduces;             /* allreduce or reducescatter */
    int device;              /* where the options say it lives */
    const void *input, *output;
    void *stream;            /* the program's, to record the ready event on */
    int rank;                /* this rank in the job */
    int set_id, set_device;  /* the set's device so far (-1: none yet) */
} kolo__dev_check_t;

/* The runtime's element-wise arithmetic (runtime/reduce.c, half.c), for a
 * device backend that computes on the host (ops/simdev): it reduces as
 * the runtime does, and scales as Horovod's CUDA kernels do. */
typedef struct kolo__host_math {
    /* n elements from dtype `from` to dtype `to` (the same: a copy;
     * float32 <-> float16 or bfloat16, rounded to nearest even). */
    void (*convert)(const void *src, int from, void *dst, int to, size_t n);
    /* buf *= factor, as Horovod's CUDA kernels scale (kolo__scale_device:
     * float16 in half precision, the factor rounded to float16 first). */
    void (*scale)(void *buf, size_t n, int dtype, double factor);
    /* buf /= divisor, as the runtime averages (integers truncate). */
    void (*average)(void *buf, size_t n, int dtype, int64_t divisor);
    /* The reduction of (dtype, op); AVERAGE gives SUM's. */
    kolo__ops_reduce_fn (*reduce)(int dtype, int op);
} kolo__host_math_t;

typedef struct kolo__dev_config {
    int rank, size;         /* this rank's place in the set */
    const int *members;     /* [size]: global ranks */
    const int *hosts;       /* [size]: host indices (NULL: not known) */
    int set_id;
    int device;             /* the device of the set's tensors on this rank */
    int hierarchical;       /* KOLO_HIERARCHICAL_ALLREDUCE=1 */
    double timeout_s;       /* KOLO_TIMEOUT_SECONDS */
    /* The set's controller: every member contributes `bytes`; out gets
     * them all, rank-major (communicator ids go through it). */
    int (*allgather)(void *arg, const void *in, void *out, size_t bytes,
                     char *err, size_t errlen);
    /* A host network context among `size` members (global ranks members[],
     * hosts hosts[]), this rank being `rank`, under `role`: the runtime's
     * choice of backend (*ops) and its connection (*ctx). */
    int (*connect)(void *arg, const char *role, int rank, int size,
                   const int *members, const int *hosts,
                   const kolo__ops_t **ops, void **ctx, char *err,
                   size_t errlen);
    /* Non-zero when a member's process is gone, naming it in who. */
    int (*lost)(void *arg, char *who, size_t len);
    kolo__ops_warn_fn warn;
    void *arg;
    const kolo__host_math_t *math;
} kolo__dev_config_t;

typedef struct kolo__dev_ops {
    const char *name;

    /* Any thread: the devices this process sees (0: none, or no driver);
     * the version of the library (NCCL_VERSION_CODE). */
    int (*device_count)(void);
    int (*version)(void);
    /* API thread: checks that a tensor can run (the device exists and is
     * the set's, the dtype can be reduced, the buffers are memory of that
     * device) and records its ready event on the program's stream. */
    int (*prepare)(const kolo__dev_check_t *t, void **event, char *err,
                   size_t errlen);
    void (*event_free)(void *event);
    /* Any thread, never blocking: 1 once the device has passed the event,
     * 0 while it has not, a negative code (the device failed: a fault)
     * with a sentence in err. */
    int (*event_query)(void *event, char *err, size_t errlen);
    /* Any thread: the work queued on `stream` (the program's: a
     * cudaStream_t, NULL for the legacy default stream) from now on waits
     * for the event; the host does not wait. */
    int (*order)(void *event, void *stream, char *err, size_t errlen);
    /* Any thread: a result's bytes to host or device memory (dst), and
     * freeing a result's data. */
    int (*result_copy)(int device, const void *src, void *dst, size_t bytes,
                       char *err, size_t errlen);
    void (*mem_free)(void *data);

    /* A set's context, created at its first device batch, on this rank
     * alone: init meets no other rank (communicators are made later, at
     * the first batch), so that the runtime can agree over the set's
     * controller whether every rank's device started and name the rank
     * whose did not. finalize is called once the runtime has seen every
     * batch's event pass (or the context broken), and also for a context
     * whose init failed after setting *ctx. */
    int (*init)(const kolo__dev_config_t *cfg, void **ctx, char *err,
                size_t errlen);
    void (*finalize)(void *ctx);
    int (*begin)(void *ctx, char *err, size_t errlen);
    /* The device's work waits for the program's (the ready events). */
    int (*wait_events)(void *ctx, void *const *events, size_t n, char *err,
                       size_t errlen);
    /* Device memory for a result, freed by mem_free. */
    int (*alloc)(void *ctx, size_t bytes, void **out, char *err,
                 size_t errlen);
    /* Allreduce of n tensors of `dtype` as one, sent as `wire`, each
     * element scaled by prescale before and by post after, as Horovod's
     * CUDA path scales (kolo__scale_device); AVERAGE divides by the set's
     * size the way Horovod does on that backend (NCCL: ncclAvg for floats,
     * else post / size). `reduce` is the host reduction of (wire, op; SUM
     * for AVERAGE), for the steps of a hierarchical allreduce that run on
     * the host. */
    int (*allreduce)(void *ctx, const kolo__dev_tensor_t *t, size_t n,
                     int dtype, int wire, int op, double prescale,
                     double post, kolo__ops_reduce_fn reduce, char *err,
                     size_t errlen);
    /* As in the host table. */
    kolo__ops_broadcast_fn *broadcast;
    kolo__ops_allgatherv_fn *allgatherv;
    kolo__ops_alltoallv_fn *alltoallv;
    /* Rank r's block of counts[r] elements of `in` (blocks in rank order),
     * reduced over the ranks, scaled by prescale before and post after
     * (AVERAGE's division is in post: op is SUM), into this rank's out;
     * `reduce` as for allreduce. */
    int (*reduce_scatter)(void *ctx, const void *in, void *out,
                          const size_t *counts, int dtype, int op,
                          double prescale, double post,
                          kolo__ops_reduce_fn reduce, char *err,
                          size_t errlen);
    /* After a batch's work is queued: an event that the device passes once
     * it has done that work (and everything queued before it). */
    int (*record)(void *ctx, void **event, char *err, size_t errlen);
    /* Between rounds while batches are in flight (never blocking for
     * long): looks for what would keep queued work from finishing: an
     * asynchronous error, a fault, a lost peer (at most once a second),
     * and with `expired` the oldest batch has been in flight longer than
     * timeout_s. On any of them it aborts the communicators, lets the
     * stream drain and returns the failure, naming `what` (the batch). */
    int (*watch)(void *ctx, const char *what, int expired, char *err,
                 size_t errlen);
    /* The timeline's device side (NULL where the backend cannot time its
     * work; called only while a timeline records). mark: a timed event at
     * the current end of kolo's stream (ctx, from the background thread) or,
     * with ctx NULL, of the program's `stream` on `device` (any thread);
     * released with event_free. event_time: once the device has passed a
     * timed event, the host's monotonic clock (kolo__now_us) when it did:
     * 1 and *us; 0 while it has not; a negative code on an error. */
    int (*mark)(void *ctx, int device, void *stream, void **event);
    int (*event_time)(void *event, int64_t *us);
} kolo__dev_ops_t;

/* The device backend this build has, or NULL (ops/registry.c). */
const kolo__dev_ops_t *kolo__ops_device(void);
#ifdef KOLO_HAVE_MEM
/* The unit tests' library only: the device backend kolo__ops_device
 * returns from now on (NULL: the build's again). */
void kolo__ops_device_use(const kolo__dev_ops_t *dev);
#endif
#ifdef KOLO_HAVE_GPU
extern const kolo__dev_ops_t kolo__dev_ops_nccl;
#endif

/* The backends this build has. kolo__ops_local serves jobs of one rank. */
extern const kolo__ops_t kolo__ops_local;
#ifdef KOLO_HAVE_GLOO
extern const kolo__ops_t kolo__ops_gloo;
#endif
#ifdef KOLO_HAVE_SHM
extern const kolo__ops_t kolo__ops_shm;
extern const kolo__ops_t kolo__ops_hier;
#endif
#ifdef KOLO_HAVE_MPI
extern const kolo__ops_t kolo__ops_mpi;
#endif
#ifdef KOLO_HAVE_MEM /* the unit tests' library only (ops/mem) */
extern const kolo__ops_t kolo__ops_mem;
#endif

/* Writes one sentence (fmt, ...) into err[errlen], as every slot does on
 * failure, and returns code (ops/registry.c). */
int kolo__ops_fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The placement checks every device backend's prepare makes: t->device is
 * one of the `count` devices this rank sees, and the one its CUDA tensors
 * in t's set are on (ops/registry.c). KOLO_OK, or the error (err). */
int kolo__dev_check_placement(const kolo__dev_check_t *t, int count,
                              char *err, size_t errlen);

/* The backend called `name` ("gloo", "mpi", "shm", ...) when this build has
 * it, else NULL (ops/registry.c). */
const kolo__ops_t *kolo__ops_find(const char *name);
/* Like kolo__ops_find, for the backends users may name (KOLO_CONTROLLER,
 * KOLO_CPU_OPERATIONS, kolo-bench): not "local" or "hier". */
const kolo__ops_t *kolo__ops_named(const char *name);
/* Writes those names, comma-separated, for error messages. */
void kolo__ops_names(char *out, size_t len);

/* What a role of a process set (its controller, its data) needs. */
typedef struct kolo__ops_need {
    int size;          /* members */
    int all_local;     /* every member on this host */
    int mpi_launched;  /* mpirun (or kolorun --mpi) started the job */
    int rank;          /* this rank in the job, for messages */
    const char *var;   /* the variable that names a choice, for messages */
    const char *want;  /* its value: a backend's name; NULL, "" or "auto":
                          the default */
} kolo__ops_need_t;

/* The one place the backend is chosen: the one named (when this build has
 * it and it can serve), else the default — kolo__ops_local for one member;
 * MPI when mpirun (or kolorun --mpi) started the job, as Horovod under
 * mpirun negotiates and reduces with MPI; else a one-host backend (shared
 * memory) when every member is on this host, else the first network
 * backend (Gloo, then MPI). (kolorun --gloo names Gloo through
 * KOLO_CONTROLLER and KOLO_CPU_OPERATIONS.) KOLO_OK, or
 * KOLO_ERR_UNSUPPORTED with a sentence in err. */
int kolo__ops_choose(const kolo__ops_need_t *need, const kolo__ops_t **out,
                     char *err, size_t errlen);
/* The backend that composes a one-host backend with a network one across
 * hosts (hierarchical allreduce), or NULL when this build has none. */
const kolo__ops_t *kolo__ops_hierarchical(void);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_OPS_H */
