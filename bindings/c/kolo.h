/*
 * kolo.h — the one public header of kolo, a runtime for data-parallel
 * distributed training.
 *
 * How it works, in one paragraph: every rank (process) of a job calls
 * kolo_init(), which starts one background thread and connects the ranks.
 * The training thread then enqueues named tensors (gradients, mostly) with
 * kolo_allreduce_async(); the call returns at once with a handle. The
 * background threads of all ranks agree on which names are ready on every
 * rank, pack ready tensors of the same kind into a fusion buffer, reduce them
 * across ranks, and complete the handles. The training thread polls
 * (kolo_poll) or blocks (kolo_wait) on a handle. A name may be enqueued on
 * different ranks in different orders and at different times: the runtime
 * executes the same plan in the same order everywhere.
 *
 * Conventions
 *  - Every function that can fail returns an int status: KOLO_OK (0) on
 *    success, KOLO_IN_PROGRESS (> 0) from kolo_poll() while a handle is not
 *    done, a negative KOLO_ERR_* code on failure. kolo_strerror() names every
 *    code. After a failure, kolo_last_error() returns a sentence that says
 *    what went wrong on this thread (the tensor, the rank, the values).
 *  - Output arguments come last and are written only on success.
 *  - All functions are thread-safe unless said otherwise.
 *
 * Environment (read by kolo_init; kolorun sets the first six):
 *   KOLO_RANK, KOLO_SIZE            this rank and the number of ranks
 *                                   (absent: a job of one rank)
 *   KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE, KOLO_CROSS_RANK, KOLO_CROSS_SIZE
 *   KOLO_RENDEZVOUS                 where ranks meet: "file:DIR" or
 *                                   "redis:HOST:PORT/JOB"
 *   KOLO_CONTROLLER                 backend that negotiates: auto|gloo|mpi|shm
 *   KOLO_CPU_OPERATIONS             backend that moves host tensors: same
 *                                   choices; auto: shm (shared memory) when
 *                                   every rank of the set is on one host,
 *                                   else mpi under mpirun, else gloo
 *   KOLO_HIERARCHICAL_ALLREDUCE     auto|0|1: across hosts, shared memory
 *                                   within each and the network between
 *                                   (auto: on with equal ranks per host);
 *                                   CUDA tensors only with 1: NCCL within
 *                                   each host, Gloo or MPI between
 *   KOLO_SHM_SLOT_BYTES, KOLO_SHM_SPIN_US  shared memory: chunk per rank
 *                                   and step (1 MiB); spin before sleeping
 *                                   (50 us, only with a core per rank)
 *   KOLO_RING_SEND_BUFFER           kolo's ring over Gloo: SO_SNDBUF of its
 *                                   sockets, the bytes in flight per link
 *                                   (128K; 0: the kernel's autotuning)
 *   KOLO_NETWORK_INTERFACE          bind this interface's address
 *   KOLO_AUTOTUNE, KOLO_AUTOTUNE_LOG, KOLO_AUTOTUNE_WINDOW  tune fusion
 *                                   threshold, chunk size and cycle time on
 *                                   the running job; CSV log on rank 0
 *   KOLO_FUSION_THRESHOLD           fusion buffer size in bytes (128 MiB)
 *   KOLO_CYCLE_TIME                 ms between negotiation rounds while
 *                                   tensors wait for other ranks (5)
 *   KOLO_CACHE_CAPACITY             response cache entries (1024; 0 = off)
 *   KOLO_TIMEOUT_SECONDS            a backend operation that makes no
 *                                   progress for this long fails (60)
 *   KOLO_LOG_LEVEL                  trace|debug|info|warning|error (warning)
 *   KOLO_FLIGHT_RECORDER            collectives the flight recorder keeps
 *                                   per rank (2048; 0 = off: no records,
 *                                   no dumps, no SIGUSR1 handler)
 *   KOLO_FLIGHT_DIR                 where its dumps go (kolorun sets it;
 *                                   unset: none); see "Flight recorder"
 * A variable with an invalid value makes kolo_init fail with
 * KOLO_ERR_CONFIG and a message naming the variable.
 */
#ifndef KOLO_H
#define KOLO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KOLO_EXPORT __attribute__((visibility("default")))
#else
#define KOLO_EXPORT
#endif

#define KOLO_VERSION_MAJOR 0
#define KOLO_VERSION_MINOR 1
#define KOLO_VERSION_PATCH 0

/* Status codes. X(name, value, message). OK = 0, in progress > 0,
 * errors < 0. */
#define KOLO_STATUS_MAP(X)                                                    \
    X(OK, 0, "success")                                                       \
    X(IN_PROGRESS, 1, "operation in progress")                                \
    X(ERR_INVALID_ARGUMENT, -1, "invalid argument")                           \
    X(ERR_NOT_INITIALIZED, -2, "kolo is not initialized")                     \
    X(ERR_ALREADY_INITIALIZED, -3, "kolo is already initialized")             \
    X(ERR_SHUTDOWN, -4, "kolo has been shut down")                            \
    X(ERR_MISMATCH, -5, "tensors of the same name differ across ranks")       \
    X(ERR_BACKEND, -6, "the communication backend failed")                    \
    X(ERR_NO_MEMORY, -7, "out of memory")                                     \
    X(ERR_INVALID_HANDLE, -8, "unknown or already released handle")          \
    X(ERR_DUPLICATE_NAME, -9, "a tensor of this name is already in flight")   \
    X(ERR_CONFIG, -10, "invalid configuration")                               \
    X(ERR_UNSUPPORTED, -11, "operation not supported")                        \
    X(ERR_RANK_LOST, -12, "a rank was lost")                                  \
    X(ERR_TIMEOUT, -13, "timed out")                                          \
    X(ERR_INTERNAL, -14, "internal error")                                    \
    X(ERR_MEMBERSHIP, -15, "the elastic job's membership changed")           \
    X(ERR_REMOVED, -16, "this worker was removed from the elastic job")

#define KOLO_STATUS_ENUM_(name, value, msg) KOLO_##name = value,
typedef enum kolo_status {
    KOLO_STATUS_MAP(KOLO_STATUS_ENUM_)
} kolo_status_t;
#undef KOLO_STATUS_ENUM_

/* Element types. The numbering is part of the wire format: do not reorder. */
typedef enum kolo_dtype {
    KOLO_UINT8 = 0,
    KOLO_INT8 = 1,
    KOLO_UINT16 = 2,
    KOLO_INT16 = 3,
    KOLO_INT32 = 4,
    KOLO_INT64 = 5,
    KOLO_FLOAT16 = 6,  /* IEEE 754 binary16, stored as uint16_t */
    KOLO_BFLOAT16 = 7, /* bfloat16, stored as uint16_t */
    KOLO_FLOAT32 = 8,
    KOLO_FLOAT64 = 9,
    KOLO_BOOL = 10, /* one byte, 0 or 1 */
    KOLO_DTYPE_COUNT_
} kolo_dtype_t;

/* Reduction operations. AVERAGE is SUM whose result is multiplied by
 * postscale / n (n the number of ranks of the process set, the quotient
 * computed in double) with the scaling rules of kolo_opts_t: Horovod's
 * arithmetic, so float32 gets sum * (float)(1.0 / n) and integers the
 * double product truncated toward zero. On bool, SUM and MAX are logical or,
 * MIN and PRODUCT logical and; AVERAGE of bool is refused. float16 and
 * bfloat16 are reduced in float32 and rounded once per step. */
typedef enum kolo_op {
    KOLO_OP_SUM = 0,
    KOLO_OP_AVERAGE = 1,
    KOLO_OP_MIN = 2,
    KOLO_OP_MAX = 3,
    KOLO_OP_PRODUCT = 4,
    KOLO_OP_COUNT_
} kolo_op_t;

/* A handle names one enqueued operation. Valid handles are > 0. */
typedef int64_t kolo_handle_t;

/* Longest tensor name, in bytes, without the terminating NUL. */
#define KOLO_MAX_NAME_LEN 1024

/* ---- Life cycle -------------------------------------------------------- */

/* Reads the environment, connects to the other ranks (all ranks must call
 * it) and starts the background thread. A second call without shutdown
 * fails with KOLO_ERR_ALREADY_INITIALIZED.
 *
 * Agreement. Before any backend connects, the ranks compare every setting
 * that changes what goes on the wire or how work is cut (KOLO_SIZE,
 * KOLO_CROSS_SIZE, KOLO_FUSION_THRESHOLD, KOLO_CHUNK_BYTES,
 * KOLO_CYCLE_TIME, KOLO_CACHE_CAPACITY, KOLO_CONTROLLER,
 * KOLO_CPU_OPERATIONS, KOLO_HIERARCHICAL_ALLREDUCE, KOLO_SHM_SLOT_BYTES,
 * KOLO_AUTOTUNE, KOLO_AUTOTUNE_WINDOW, and kolo's version, message format
 * and backends): where one differs, kolo_init fails on every rank with
 * KOLO_ERR_CONFIG and a message naming the variable and which ranks have
 * which value. Numbers are compared as parsed (16M equals 16777216). The
 * other variables may differ per rank. A rank that never arrives makes the
 * others fail after KOLO_START_TIMEOUT with KOLO_ERR_TIMEOUT, naming it;
 * a rank whose backend cannot connect (a full /dev/shm, say) makes every
 * rank fail at once with its reason. A KOLO_* variable kolo does not know
 * is warned about (rank 0), naming the closest known one.
 *
 * Horovod's variables. Where a KOLO_* variable is not set, its HOROVOD_*
 * twin is read in its place (HOROVOD_FUSION_THRESHOLD for
 * KOLO_FUSION_THRESHOLD, HOROVOD_RANK for KOLO_RANK, ...; README.md lists
 * them); a twin set to another value than its KOLO_* variable, a HOROVOD_*
 * variable kolo cannot honour, and an unknown HOROVOD_* name are warned
 * about (rank 0).
 *
 * torchrun and srun. A process without KOLO_RANK and KOLO_SIZE (or their
 * twins) and without an MPI launcher's variables takes its place from
 * torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
 * GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else from those srun gives
 * the tasks of a job step (SLURM_PROCID, SLURM_STEP_ID, ...). Unless
 * KOLO_RENDEZVOUS names one, rank 0 then serves the job's rendezvous on
 * MASTER_PORT+1 (srun without MASTER_PORT: a port from the job and step
 * ids), or on one of the 7 ports after it where another program holds
 * that one, from a thread that lives until the process exits, and the
 * others find it there, waiting up to KOLO_START_TIMEOUT
 * (KOLO_ERR_TIMEOUT, naming the ports).
 *
 * Under MPI. A process started by mpirun or srun (OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE, PMIX_RANK, ... set) without KOLO_RANK and KOLO_SIZE takes its
 * place from MPI: rank and size from MPI_COMM_WORLD, the local rank and
 * size from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the cross rank and
 * size from a split by local rank. kolo_init initialises MPI with
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) when the program has not; a program
 * that initialised MPI itself must have asked for MPI_THREAD_MULTIPLE
 * (else kolo_init fails with KOLO_ERR_UNSUPPORTED and says so), and keeps
 * MPI: kolo never finalizes it, and the program may use MPI after
 * kolo_shutdown and finalizes it itself. MPI cannot be initialised twice,
 * so MPI that kolo initialised stays up across kolo_shutdown (kolo_init
 * may be called again) and is finalized when the process exits (atexit).
 * kolo_init must not be called after the program's MPI_Finalize.
 * KOLO_CONTROLLER=gloo or KOLO_CPU_OPERATIONS=gloo under mpirun makes rank
 * 0 create a rendezvous directory (removed at exit); that needs every rank
 * on one host, or KOLO_RENDEZVOUS=file:DIR on a shared file system. A
 * job built without MPI but started by mpirun as several ranks fails with
 * KOLO_ERR_UNSUPPORTED, unless srun's variables place it (above). */
KOLO_EXPORT int kolo_init(void);

/* Stops this rank. The first rank to shut down stops the job: every handle
 * still pending on any rank completes with KOLO_ERR_SHUTDOWN, and a message
 * naming the rank that shut down. Later calls on this rank are refused with
 * KOLO_ERR_NOT_INITIALIZED (until kolo_init is called again). Returns
 * KOLO_ERR_NOT_INITIALIZED if kolo is not initialized. */
KOLO_EXPORT int kolo_shutdown(void);

/* kolo_shutdown for a program's exit hook, when the program ends without
 * having called kolo_shutdown: the other ranks, if still running, are told
 * "rank R has shut down, which stops the job (it ended its program without
 * calling shutdown: REASON)". reason: what ended it ("an uncaught
 * RuntimeError: ..."), or NULL (then "an uncaught exception, an exit, or
 * fewer steps than the others"). A failure of kolo's own on this rank (out
 * of memory) is said instead when there was one. kolo registers this with
 * atexit at kolo_init (reason NULL); the Python binding calls it from its
 * own exit hook with the uncaught exception. Returns as kolo_shutdown. */
KOLO_EXPORT int kolo_shutdown_at_exit(const char *reason);

/* 1 between a successful kolo_init and kolo_shutdown, else 0. */
KOLO_EXPORT int kolo_is_initialized(void);

/* ---- Elastic jobs ------------------------------------------------------
 *
 * A job started by kolorun with --min-np or --host-discovery-script
 * (KOLO_ELASTIC=1) goes on when ranks are lost or hosts come and go.
 * kolorun decides each new membership, a "generation", and publishes it in
 * the job's rendezvous (design in runtime/elastic.c). A worker is a
 * host:slot pair (KOLO_ELASTIC_ID); in a new generation the surviving
 * workers keep their relative order, rank 0 stays on the oldest surviving
 * host, and new workers come after.
 *
 * The life cycle of an elastic program (kolo.torch.elastic.run does this
 * for Python; examples/elastic_mlp.c does it in C):
 *
 *   kolo_init();            joins the newest generation that includes
 *                           this worker (waiting for it up to
 *                           KOLO_ELASTIC_TIMEOUT + 5 s; KOLO_ERR_SHUTDOWN
 *                           with kolorun's reason when it ended the job
 *                           meanwhile); KOLO_ERR_REMOVED: this
 *                           worker is not in it, the process should exit
 *   loop:
 *     train a step;         a collective that fails with
 *                           KOLO_ERR_MEMBERSHIP means a rank was lost:
 *                           restore the last committed state, then
 *                           kolo_shutdown(), kolo_init() (again while it
 *                           returns KOLO_ERR_MEMBERSHIP), re-create the
 *                           process sets, broadcast the state from rank 0,
 *                           and go on
 *     commit the state;     then kolo_hosts_updated(): non-zero means
 *                           hosts were added or removed: kolo_shutdown(),
 *                           kolo_init(), broadcast the state, go on (no
 *                           restore: nothing failed)
 *
 * In an elastic job every operation of a process set that stopped because
 * a rank was lost, timed out, failed in the backend or shut down fails
 * with KOLO_ERR_MEMBERSHIP (its message still says what happened), and so
 * do later enqueues until kolo_shutdown. The response cache starts empty
 * in every generation. */

/* 1 when this process runs in an elastic job (KOLO_ELASTIC=1, or
 * HOROVOD_ELASTIC=1), else 0. Callable before kolo_init. */
KOLO_EXPORT int kolo_elastic(void);

/* The generation this process joined at its last kolo_init; 0 when not
 * initialized or not elastic. */
KOLO_EXPORT int kolo_elastic_generation(void);

/* Whether kolorun published a newer generation than the joined one: 0
 * none; else bits: 1 ranks were removed (hosts gone; nothing failed), 2
 * ranks were added; both for a failure or a mixed change. Reads the
 * rendezvous (a small file, or one Redis GET); no collective, so ranks may
 * see a new generation at different times: decide on rank 0's answer
 * (kolo.torch.elastic's State.check_host_updates broadcasts it). Negative
 * (a KOLO_ERR_* code) when the rendezvous cannot be read; 0 when not
 * elastic or not initialized. */
KOLO_EXPORT int kolo_hosts_updated(void);

/* This rank's place in the job; -1 when not initialized. Local: among the
 * ranks of this host; cross: among the hosts (the rank of this host's rank
 * group with the same local rank). */
KOLO_EXPORT int kolo_rank(void);
KOLO_EXPORT int kolo_size(void);
KOLO_EXPORT int kolo_local_rank(void);
KOLO_EXPORT int kolo_local_size(void);
KOLO_EXPORT int kolo_cross_rank(void);
KOLO_EXPORT int kolo_cross_size(void);

/* ---- Options shared by the collectives ----------------------------------- */

/* The global process set: every rank of the job. */
#define KOLO_GLOBAL_PROCESS_SET 0

/* Most dimensions a tensor shape may have. */
#define KOLO_MAX_DIMS 8

/* Where a tensor lives (kolo_opts_t.device_type). */
#define KOLO_DEVICE_HOST 0
#define KOLO_DEVICE_CUDA 1

/* Options of a collective; kolo_opts_init() sets the defaults. Fields a
 * collective does not use are ignored. Everything here except
 * backward_passes/average_passes must be the same on every rank for one
 * name (else KOLO_ERR_MISMATCH on every rank, naming both values). */
typedef struct kolo_opts {
    /* allreduce and reducescatter: the reduction (default KOLO_OP_SUM;
     * reducescatter takes SUM or AVERAGE). */
    kolo_op_t op;

    /* allreduce and reducescatter: every rank's input is multiplied by
     * prescale before the reduction and the result by postscale after it
     * (defaults 1.0; AVERAGE uses postscale / n), in one pass over the
     * fusion buffer, with the arithmetic of Horovod's CPU path so that
     * results agree with it bit for bit: float32 elements are multiplied in
     * float32 by the factor rounded to float32; float16 and bfloat16 are
     * widened to float32, multiplied by (float)factor and rounded once
     * (to nearest even); float64 in double; integers in double, truncated
     * toward zero (saturating at the type's limits, NaN giving 0). A factor
     * of exactly 1.0 leaves the data untouched; bool is never scaled. */
    double prescale, postscale;

    /* The process set the collective runs in (default
     * KOLO_GLOBAL_PROCESS_SET). Ranks (root, splits) are relative to it. */
    int process_set;

    /* allreduce of float32 only: the dtype the data travels as. -1 (the
     * default) sends float32; KOLO_FLOAT16 or KOLO_BFLOAT16 compress the
     * fusion buffer, reduce in that dtype (each step computed in float32,
     * rounded once) and expand the result on the way out. */
    int wire_dtype;

    /* allreduce only: local gradient accumulation (Horovod's
     * backward_passes_per_step). With backward_passes = N > 1, the calls
     * for one name form groups of N passes. Passes 1..N-1 add `input` into
     * a private accumulator (kept in float32 for float16/bfloat16, else in
     * the tensor's dtype) and complete at once with KOLO_OK: no
     * negotiation, no communication, and `output` is not written. Pass N
     * adds its input too, writes the accumulated sum (divided by N, when
     * average_passes is nonzero) into `output`, allreduces `output` in place
     * and resets the accumulator. So N passes of g1..gN give exactly
     * allreduce(g1 + ... + gN), or allreduce((g1 + ... + gN) / N). Every
     * pass of a group must use the same count, dtype and N; a call that
     * differs fails with KOLO_ERR_INVALID_ARGUMENT and the group is
     * discarded. Default 1 and 0. */
    int backward_passes;
    int average_passes;

    /* allreduce and broadcast: an optional shape (ndim 0: none). Its
     * product must equal `count`; ranks must agree on every dimension. */
    int ndim;
    const int64_t *shape;

    /* Where the tensors live. device_type KOLO_DEVICE_HOST (0, the
     * default): host memory. KOLO_DEVICE_CUDA: input and output are device
     * pointers on CUDA device `device`, and the collective runs on NCCL,
     * with fusion, scaling and float16/bfloat16 compression done by kernels
     * on the device (needs kolo_built("nccl"); a device that is not there
     * fails at once, naming it). Ranks must agree on host or CUDA for a
     * name (the device number may differ between ranks), else
     * KOLO_ERR_MISMATCH. Every CUDA tensor of a rank in one process set must
     * be on the same device (its NCCL communicator's). NCCL has no 16-bit
     * integers: int16 and uint16 CUDA tensors are refused. */
    int device_type;
    int device;

    /* KOLO_DEVICE_CUDA: the stream (a cudaStream_t) on which the program queued
     * the work that produces `input`; NULL: the legacy default stream. At
     * enqueue kolo records an event there and its own stream waits for it:
     * the caller is not blocked, and the collective never reads the input
     * before the program's kernels have written it. Completion is ordered
     * on a stream too, as DDP does (Horovod with
     * HOROVOD_ENABLE_ASYNC_COMPLETION): the handle is done once the
     * collective is queued on the device, and kolo_wait makes this stream
     * (kolo_wait_on_stream: another) wait for it, without blocking the
     * host. Work queued there afterwards sees the output; the host reads it
     * after synchronizing that stream. A failure found on the device after
     * the handle was done is returned by kolo_wait, and stops the process
     * set, so every later call on it fails with the same message. */
    void *stream;

    /* Nonzero: every rank of the set enqueues this collective itself, also
     * a rank that has joined (kolo_join): it completes once every rank has
     * enqueued it, a joined rank neither standing in with zeros (allreduce)
     * nor failing it (the others). For a program that keeps taking part in
     * some collectives after it joined, as a sharded optimizer's rank that
     * ran out of data updates its share for the others. The ranks must
     * agree on it. Default 0. */
    int while_joined;
} kolo_opts_t;

KOLO_EXPORT void kolo_opts_init(kolo_opts_t *opts);

/* The name of earlier versions; the same type and defaults. */
typedef kolo_opts_t kolo_allreduce_opts_t;
KOLO_EXPORT void kolo_allreduce_opts_init(kolo_allreduce_opts_t *opts);

/* ---- Allreduce and broadcast ---------------------------------------------- */

/* Enqueues an allreduce of `count` elements of `dtype` under `name` and
 * returns at once, with a new handle in *handle. `input` and `output` may be
 * the same buffer; both must stay valid, and `output` untouched, until the
 * handle is done. `name` must be 1..KOLO_MAX_NAME_LEN bytes and may not be
 * in flight already on this rank (KOLO_ERR_DUPLICATE_NAME). If ranks enqueue
 * the same name with a different count, dtype or op, the handle completes
 * with KOLO_ERR_MISMATCH on every rank, with a message naming the tensor and
 * the values, and the job goes on. */
KOLO_EXPORT int kolo_allreduce_async(const char *name, const void *input,
                                     void *output, int64_t count,
                                     kolo_dtype_t dtype, kolo_op_t op,
                                     kolo_handle_t *handle);

/* The same with options (NULL: the defaults, with op SUM). */
KOLO_EXPORT int kolo_allreduce_async_opts(const char *name, const void *input,
                                          void *output, int64_t count,
                                          kolo_dtype_t dtype,
                                          const kolo_opts_t *opts,
                                          kolo_handle_t *handle);

/* Broadcast of `count` elements in place: when done, every rank's `buffer`
 * holds what the root's held. `root` is the root's rank within the process
 * set (0 .. set size - 1: its position in the `ranks` given to
 * kolo_add_process_set), not its global rank; for the global set the two
 * are the same. (The Python bindings take a global rank, as Horovod does,
 * and translate it.) */
KOLO_EXPORT int kolo_broadcast_async(const char *name, void *buffer,
                                     int64_t count, kolo_dtype_t dtype,
                                     int root, const kolo_opts_t *opts,
                                     kolo_handle_t *handle);

/* ---- Collectives whose output size is known after negotiation ------------ */

/* The output of an allgather, alltoall or reducescatter, handed over by
 * kolo_wait_result. */
typedef struct kolo_result {
    void *data;   /* the output, malloc'd: free with kolo_result_free */
    size_t bytes; /* its size */
    int ndim;     /* its shape */
    int64_t shape[KOLO_MAX_DIMS];
    /* Rows (first-dimension entries), one per rank of the process set:
     * allgather: each rank's contribution; alltoall: received from each
     * rank; reducescatter: each rank's share of the result. */
    int nsplits;
    int64_t *splits;
    /* Where data lives: KOLO_DEVICE_HOST, or KOLO_DEVICE_CUDA on CUDA
     * device `device` (the collective's); kolo_result_free releases it
     * either way, and kolo_result_copy copies it out. */
    int device_type;
    int device;
} kolo_result_t;

/* Allgather: every rank contributes a tensor of `ndim` dimensions whose
 * first dimension may differ between ranks (the others must agree); the
 * output is the ranks' tensors concatenated along the first dimension, in
 * rank order. */
KOLO_EXPORT int kolo_allgather_async(const char *name, const void *input,
                                     int ndim, const int64_t *shape,
                                     kolo_dtype_t dtype,
                                     const kolo_opts_t *opts,
                                     kolo_handle_t *handle);

/* Alltoall: rank i sends splits[j] rows (first-dimension entries) of its
 * input to rank j, in order, and receives from every rank what that rank
 * sends it, concatenated in rank order. splits has one entry per rank of
 * the process set and must sum to shape[0]; NULL splits the first
 * dimension evenly (it must then divide by the number of ranks). The
 * received rows per rank are in the result's splits. */
KOLO_EXPORT int kolo_alltoall_async(const char *name, const void *input,
                                    int ndim, const int64_t *shape,
                                    kolo_dtype_t dtype, const int64_t *splits,
                                    const kolo_opts_t *opts,
                                    kolo_handle_t *handle);

/* Reducescatter: the tensors of all ranks (same shape) are reduced with
 * opts->op (SUM or AVERAGE) and the first dimension of the result is split
 * as evenly as possible: rank r of n gets shape[0] / n rows, plus one if
 * r < shape[0] % n. A tensor of 0 dimensions is refused. */
KOLO_EXPORT int kolo_reducescatter_async(const char *name, const void *input,
                                         int ndim, const int64_t *shape,
                                         kolo_dtype_t dtype,
                                         const kolo_opts_t *opts,
                                         kolo_handle_t *handle);

/* ---- Collectives into the caller's buffers ------------------------------ */

/* A reducescatter and an allgather of blocks of the same size on every rank,
 * written into the caller's memory instead of a result to copy out: what
 * a sharded optimizer (ZeRO) does with a fused bucket of gradients and the
 * bucket's parameters. Wait for them with kolo_wait (or kolo_wait_result,
 * which hands over an empty result). The ranks must agree on `count`, the
 * dtype and the options, else KOLO_ERR_MISMATCH on every rank naming the
 * values; they meet like the other collectives (by name, as soon as every
 * rank has enqueued it), and CUDA tensors go to NCCL as elsewhere.
 *
 * kolo_reducescatter_into_async: `input` holds count * n elements (n: the
 * process set's size), rank r's block being elements [r * count,
 * (r + 1) * count); the blocks of every rank are reduced with opts->op (SUM
 * or AVERAGE, with prescale and postscale as for allreduce) and `output`
 * (count elements) receives this rank's. `output` may be this rank's block
 * of `input` (in place: the rest of `input` is then left as it was), and may
 * not overlap `input` otherwise; out of place, `input` is not modified.
 *
 * kolo_allgather_into_async: every rank contributes `count` elements
 * (`input`); `output` (count * n elements) receives them in rank order. In
 * place: `input` may be this rank's block of `output` (output + rank *
 * count elements), as a shard updated where it lies. */
KOLO_EXPORT int kolo_reducescatter_into_async(const char *name,
                                              const void *input, void *output,
                                              int64_t count,
                                              kolo_dtype_t dtype,
                                              const kolo_opts_t *opts,
                                              kolo_handle_t *handle);
KOLO_EXPORT int kolo_allgather_into_async(const char *name, const void *input,
                                          void *output, int64_t count,
                                          kolo_dtype_t dtype,
                                          const kolo_opts_t *opts,
                                          kolo_handle_t *handle);

/* Like kolo_wait, and on success hands over the output of an allgather,
 * alltoall or reducescatter (for other collectives *result is zeroed). A
 * CUDA result is handed over once the device has written it (the calling
 * thread sleeps until then), so that it can be copied out at once. */
KOLO_EXPORT int kolo_wait_result(kolo_handle_t handle, kolo_result_t *result);

/* Frees what kolo_wait_result handed over; result may be zeroed. */
KOLO_EXPORT void kolo_result_free(kolo_result_t *result);

/* Copies the result's bytes to dst, which lives where the data does: host
 * memory for a host result, memory on the same CUDA device for a device
 * result (a device-to-device copy, finished when this returns). For
 * bindings whose framework allocates the output tensor. */
KOLO_EXPORT int kolo_result_copy(const kolo_result_t *result, void *dst);

/* ---- Grouped collectives -------------------------------------------------- */

/* n tensors enqueued as one group: the group is negotiated as a unit (it is
 * ready only when every member is ready on every rank; if one member fails,
 * all fail) and its members are reduced together. Each member gets its own
 * handle in handles[i]; names must be distinct. On failure no member is
 * enqueued. */
KOLO_EXPORT int kolo_grouped_allreduce_async(int n, const char *const *names,
                                             const void *const *inputs,
                                             void *const *outputs,
                                             const int64_t *counts,
                                             kolo_dtype_t dtype,
                                             const kolo_opts_t *opts,
                                             kolo_handle_t *handles);
KOLO_EXPORT int kolo_grouped_allgather_async(int n, const char *const *names,
                                             const void *const *inputs,
                                             const int *ndims,
                                             const int64_t *const *shapes,
                                             kolo_dtype_t dtype,
                                             const kolo_opts_t *opts,
                                             kolo_handle_t *handles);
KOLO_EXPORT int kolo_grouped_reducescatter_async(int n,
                                                 const char *const *names,
                                                 const void *const *inputs,
                                                 const int *ndims,
                                                 const int64_t *const *shapes,
                                                 kolo_dtype_t dtype,
                                                 const kolo_opts_t *opts,
                                                 kolo_handle_t *handles);

/* ---- Barrier and join ----------------------------------------------------- */

/* Blocks until every rank of the process set has called kolo_barrier. */
KOLO_EXPORT int kolo_barrier(int process_set);

/* For a rank that has run out of data. Blocks until every rank of the job
 * has joined. Meanwhile the allreduces of the other ranks go on, this rank
 * contributing zeros (AVERAGE still divides by the full size); any other
 * collective enqueued while a rank is joined fails with a message. On
 * success *last_rank (may be NULL) is the rank that joined last, the same
 * on every rank. Global process set only. */
KOLO_EXPORT int kolo_join(int *last_rank);

/* ---- Process sets --------------------------------------------------------- */

/* Process sets are subgroups of ranks that reduce among themselves, each
 * with its own negotiation, response cache and queue. Every rank of the job
 * must make the same add/remove calls in the same order (ranks outside a
 * set too): ids are handed out in call order, starting at 1. `ranks` lists
 * global ranks, each once. The ranks agree on the members before any of
 * them connects: where they asked for different ones, the call fails on
 * every rank with KOLO_ERR_INVALID_ARGUMENT, listing what each rank asked
 * for. A member that cannot connect (a full /dev/shm, say) makes the call
 * fail at once on every rank, members or not, with its reason. A failed
 * call creates no set and uses no id. */
KOLO_EXPORT int kolo_add_process_set(const int *ranks, int nranks, int *id);

/* Removes a set; its pending operations fail. Every rank calls it. */
KOLO_EXPORT int kolo_remove_process_set(int id);

/* A group assignment (as for a TPU cross-replica sum): ngroups lists of
 * ranks; every rank of the job must appear exactly once, and with
 * require_equal_size all groups must have the same size. Creates one
 * process set per group (ids[i] for groups[i]); on a bad assignment,
 * KOLO_ERR_INVALID_ARGUMENT naming the problem, and no set is created. */
KOLO_EXPORT int kolo_add_process_sets_from_groups(int ngroups,
                                                  const int *const *groups,
                                                  const int *group_sizes,
                                                  int require_equal_size,
                                                  int *ids);

/* kolo_process_set_rank: this rank's rank in the set, or -1 when it is not
 * a member or there is no such set. kolo_process_set_size: the number of
 * ranks in the set (members and others alike see it), or -1 when there is
 * no such set. */
KOLO_EXPORT int kolo_process_set_rank(int id);
KOLO_EXPORT int kolo_process_set_size(int id);

/* ---- Completion -------------------------------------------------------- */

/* Non-blocking: KOLO_IN_PROGRESS while the operation runs, then its final
 * status (KOLO_OK or an error). Polling does not release the handle. A
 * CUDA tensor's handle is done once its collective is queued on the device
 * (see kolo_opts_t.stream). */
KOLO_EXPORT int kolo_poll(kolo_handle_t handle);

/* Blocks until the handle is done, releases it and returns its status. On
 * failure the message is available through kolo_last_error() on this
 * thread. A released or never-issued handle gives KOLO_ERR_INVALID_HANDLE.
 * For a CUDA tensor, done means queued on the device: the stream given at
 * enqueue (kolo_opts_t.stream) is made to wait for the output, and the
 * host does not wait for the device. */
KOLO_EXPORT int kolo_wait(kolo_handle_t handle);

/* kolo_wait, ordering a CUDA tensor's output on `stream` (a cudaStream_t;
 * NULL: the legacy default stream) instead of the stream given at enqueue:
 * for a program whose current stream changed in between (kolo.torch orders
 * on the current stream at synchronize, as Horovod does). For a host
 * tensor the same as kolo_wait. */
KOLO_EXPORT int kolo_wait_on_stream(kolo_handle_t handle, void *stream);

/* The error message of a done, not yet released handle that failed; NULL
 * when the handle is unknown, still running or succeeded. The string lives
 * until the handle is released (kolo_wait). */
KOLO_EXPORT const char *kolo_handle_error(kolo_handle_t handle);

/* ---- Timeline ----------------------------------------------------------- */

/* Starts writing a Chrome-trace timeline (a JSON array that Perfetto and
 * chrome://tracing open, valid at every moment, even if the job is killed)
 * to `path` on this rank, replacing one being written. mark_cycles adds a
 * CYCLE_START marker per negotiation round. The same as KOLO_TIMELINE and
 * KOLO_TIMELINE_MARK_CYCLES at init (KOLO_TIMELINE=DYNAMIC, Horovod's
 * HOROVOD_TIMELINE=DYNAMIC, starts none at init and leaves it to this
 * call). Any rank may call it; usually rank 0 does (its file shows every
 * rank's readiness); kolo.torch's start_timeline calls it on rank 0 only,
 * as Horovod writes the coordinator's timeline. A file that cannot be
 * created or written: KOLO_ERR_INVALID_ARGUMENT, the message naming the
 * file and why (at init, by KOLO_TIMELINE: KOLO_ERR_CONFIG). */
KOLO_EXPORT int kolo_start_timeline(const char *path, int mark_cycles);

/* Writes what was recorded and closes the file. Reports, once, a failed
 * write (a full disk, say) that stopped the timeline earlier: the file
 * then holds what was written before it, valid JSON. */
KOLO_EXPORT int kolo_stop_timeline(void);

/* ---- Flight recorder ---------------------------------------------------- */

/* Every rank keeps its last KOLO_FLIGHT_RECORDER collectives (name,
 * operation, dtype, shape, bytes, device; when each was enqueued, put in
 * the plan, started and ended; its fusion batch; how it ended) and where
 * its threads are (the training thread inside kolo_wait since when and on
 * what, or outside kolo since when; each process set's background thread
 * in a negotiation round, a collective, or idle). Where KOLO_FLIGHT_DIR
 * names a directory (created, mode 0700, if missing), the rank writes all
 * that as one JSON object to DIR/rank<R>.json, whole or not at all
 * (written beside it, then renamed), each dump replacing the last: when
 * kolo reports an error (a handle's, kolo_init's), when the stall check
 * warns or stops the job, on a timeout, at kolo_shutdown ("shutdown"), and
 * on SIGUSR1. kolo_init installs the SIGUSR1 handler (the one it replaces
 * is called after it, if a function; kolo_shutdown restores it): a SIGUSR1
 * from outside (kill -USR1 PID, or kolorun's, which signals every rank)
 * dumps this rank, and every other rank of the job at its next
 * negotiation round, within about a second; the job goes on. A directory
 * that cannot be written is said once, then the rank writes no more dumps
 * and the job goes on. `kolo-timeline why DIR` reads the dumps; the
 * fields are in docs/flight.md. The recorder's cost is a few stores per
 * collective and about 600 bytes per record kept.
 *
 * kolo_flight_stacks: `fd` is a file, open for reading and appending
 * (mode "a+"), where the program's handler of signal `signum` (one of its
 * own: a real-time signal, never SIGUSR1) writes every thread's stack
 * (Python: faulthandler.register(signum, file=f, all_threads=True)).
 * Before each dump kolo sends `signum` to the thread that called
 * kolo_flight_stacks (which must outlive the registration) and waits a
 * moment for the stacks, and puts what the file gained since the last
 * dump in the dump's "python_stacks". kolo never raises SIGUSR1 itself.
 * kolo keeps its own descriptor of the file; fd < 0 forgets it (call it
 * before removing that handler). KOLO_ERR_UNSUPPORTED (fd not used) when
 * the recorder is off or KOLO_FLIGHT_DIR is not set;
 * KOLO_ERR_INVALID_ARGUMENT for a descriptor that cannot be read or
 * SIGUSR1. kolo.init does all this for Python programs. */
KOLO_EXPORT int kolo_flight_stacks(int fd, int signum);

/* ---- What this build has ----------------------------------------------- */

/* Nonzero if this kolo was built with the backend or device support named
 * ("gloo", "mpi", "shm", "cuda", "nccl"), else 0: 1, except for "nccl", which
 * gives NCCL's version code (22809 for NCCL 2.28.9), as Horovod's
 * nccl_built() does. */
KOLO_EXPORT int kolo_built(const char *what);

/* 1 if the named backend carries this job's negotiation or host
 * collectives ("gloo", "mpi", "shm": shared memory, the default for ranks
 * on one host) or device collectives ("nccl"); "mpi" also whenever mpirun
 * started the job (MPI is then initialized for the program). 0 otherwise
 * or when not initialized. */
KOLO_EXPORT int kolo_enabled(const char *what);

/* ---- Errors ------------------------------------------------------------ */

/* A fixed sentence for every status code ("unknown status" otherwise). */
KOLO_EXPORT const char *kolo_strerror(int status);

/* The message of the last failure returned to this thread by any kolo_*
 * call (an empty string if none). Valid until the next kolo_* call on this
 * thread. */
KOLO_EXPORT const char *kolo_last_error(void);

/* Size in bytes of one element; 0 for an unknown dtype. */
KOLO_EXPORT size_t kolo_dtype_size(kolo_dtype_t dtype);
/* "float32", "sum", ...; "unknown" otherwise. */
KOLO_EXPORT const char *kolo_dtype_name(kolo_dtype_t dtype);
KOLO_EXPORT const char *kolo_op_name(kolo_op_t op);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_H */
