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
 *   KOLO_RENDEZVOUS                 where ranks meet: "file:DIR"
 *   KOLO_FUSION_THRESHOLD           fusion buffer size in bytes (128 MiB)
 *   KOLO_CYCLE_TIME                 ms between negotiation rounds while
 *                                   tensors wait for other ranks (5)
 *   KOLO_CACHE_CAPACITY             response cache entries (1024; 0 = off)
 *   KOLO_TIMEOUT_SECONDS            a backend operation that makes no
 *                                   progress for this long fails (60)
 *   KOLO_LOG_LEVEL                  trace|debug|info|warning|error (warning)
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
    X(ERR_INTERNAL, -14, "internal error")

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

/* Reduction operations. AVERAGE is SUM divided by the number of ranks
 * (integers truncate toward zero). On bool, SUM and MAX are logical or,
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
 * fails with KOLO_ERR_ALREADY_INITIALIZED. */
KOLO_EXPORT int kolo_init(void);

/* Stops this rank. The first rank to shut down stops the job: every handle
 * still pending on any rank completes with KOLO_ERR_SHUTDOWN, and a message
 * naming the rank that shut down. Later calls on this rank are refused with
 * KOLO_ERR_NOT_INITIALIZED (until kolo_init is called again). Returns
 * KOLO_ERR_NOT_INITIALIZED if kolo is not initialized. */
KOLO_EXPORT int kolo_shutdown(void);

/* 1 between a successful kolo_init and kolo_shutdown, else 0. */
KOLO_EXPORT int kolo_is_initialized(void);

/* This rank's place in the job; -1 when not initialized. Local: among the
 * ranks of this host; cross: among the hosts (the rank of this host's rank
 * group with the same local rank). */
KOLO_EXPORT int kolo_rank(void);
KOLO_EXPORT int kolo_size(void);
KOLO_EXPORT int kolo_local_rank(void);
KOLO_EXPORT int kolo_local_size(void);
KOLO_EXPORT int kolo_cross_rank(void);
KOLO_EXPORT int kolo_cross_size(void);

/* ---- Allreduce --------------------------------------------------------- */

/* Options of an allreduce; kolo_allreduce_opts_init() sets the defaults. */
typedef struct kolo_allreduce_opts {
    kolo_op_t op; /* default KOLO_OP_SUM */

    /* Local gradient accumulation (Horovod's backward_passes_per_step).
     * With backward_passes = N > 1, the calls for one name form groups of N
     * passes. Passes 1..N-1 add `input` into a private accumulator (kept in
     * float32 for float16/bfloat16, else in the tensor's dtype) and complete
     * at once with KOLO_OK: no negotiation, no communication, and `output`
     * is not written. Pass N adds its input too, writes the accumulated sum
     * (divided by N, when average_passes is nonzero) into `output`,
     * allreduces `output` in place with `op`, and resets the accumulator.
     * So N passes of g1..gN give exactly allreduce(g1 + ... + gN), or
     * allreduce((g1 + ... + gN) / N). Every pass of a group must use the
     * same count, dtype and N; a call that differs fails with
     * KOLO_ERR_INVALID_ARGUMENT and the group is discarded. Default 1. */
    int backward_passes;
    int average_passes; /* default 0 */
} kolo_allreduce_opts_t;

KOLO_EXPORT void kolo_allreduce_opts_init(kolo_allreduce_opts_t *opts);

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
                                          const kolo_allreduce_opts_t *opts,
                                          kolo_handle_t *handle);

/* ---- Completion -------------------------------------------------------- */

/* Non-blocking: KOLO_IN_PROGRESS while the operation runs, then its final
 * status (KOLO_OK or an error). Polling does not release the handle. */
KOLO_EXPORT int kolo_poll(kolo_handle_t handle);

/* Blocks until the handle is done, releases it and returns its status. On
 * failure the message is available through kolo_last_error() on this
 * thread. A released or never-issued handle gives KOLO_ERR_INVALID_HANDLE. */
KOLO_EXPORT int kolo_wait(kolo_handle_t handle);

/* The error message of a done, not yet released handle that failed; NULL
 * when the handle is unknown, still running or succeeded. The string lives
 * until the handle is released (kolo_wait). */
KOLO_EXPORT const char *kolo_handle_error(kolo_handle_t handle);

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
