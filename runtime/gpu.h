/*
 * gpu.h — CUDA tensors: the runtime's GPU path (gpu.c), built when
 * configure finds CUDA, NCCL and nvcc (KOLO_HAVE_GPU).
 *
 * GPU tensors go through the same queue, negotiation and fusion plan as
 * host tensors (params.device_type is part of what ranks must agree on,
 * and of the fusion key). What differs is execution: NCCL does not fit the
 * host ops table (ops/ops.h), because its collectives are queued on CUDA
 * streams and finish later, so the background thread hands a GPU batch to
 * kolo__gpu_run instead of a backend's slots.
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
 *    host network context (Gloo or MPI) per local index across hosts.
 *
 * A batch: the stream waits for each tensor's ready event (recorded on the
 * program's stream at enqueue), kernels pack the tensors into the fusion
 * buffer (prescaling and compressing on the way), NCCL reduces it, kernels
 * average, postscale and unpack. A host function queued after the work
 * signals a condition variable, so the background thread sleeps until the
 * GPU is done, waking every 100 ms to check NCCL's asynchronous errors, a
 * lost peer and the timeout; on any of them the communicators are aborted
 * (which ends NCCL's kernels), the stream is given a few seconds to drain
 * (so nothing writes a user's buffer after its handle failed), and the
 * handles fail with the reason. A kernel fault is seen at the next check
 * too (the host function never runs after one).
 *
 * Known limit: each process set has its own background thread, so CUDA
 * tensors of two sets may run on one device at the same time; NCCL warns
 * that concurrent communicators (and cudaMalloc/cudaFree while NCCL
 * kernels run) can deadlock when ranks order them differently. Keep GPU
 * collectives of overlapping sets from running at once.
 */
#ifndef KOLO_GPU_H
#define KOLO_GPU_H

#include "config.h"

#include "runtime.h"

#ifdef KOLO_HAVE_GPU

/* API thread, under the API lock: checks that a CUDA tensor can run (the
 * device exists and is the set's, the dtype and op are NCCL's, the buffers
 * are memory of that device) and records its ready event on `stream`.
 * Sets e->params.device_type, e->device and the event. input/output may be
 * NULL for a tensor of no elements. */
int kolo__gpu_prepare(kolo__pset_t *ps, kolo__entry_t *e, int device,
                      void *stream, kolo__err_t *err);

/* Background thread: runs the batch ps->ready[idx[0..n)] (one entry unless
 * it is a fused allreduce) on the GPU and returns when the GPU is done with
 * it. Results of allgather, alltoall and reducescatter are attached to the
 * entry in device memory. */
int kolo__gpu_run(kolo__pset_t *ps, const size_t *idx, size_t n,
                  kolo__err_t *err);

/* Releases a set's GPU state (ps->gpu); NULL-safe. */
void kolo__gpu_free(kolo__pset_t *ps);

/* kolo_result_copy and kolo_result_free of a device result. */
int kolo__gpu_result_copy(const kolo_result_t *r, void *dst, kolo__err_t *err);
void kolo__gpu_mem_free(void *data);

/* The number of CUDA devices this process sees (0 when none or no driver). */
int kolo__gpu_device_count(void);
/* NCCL_VERSION_CODE of the NCCL kolo was built with (22809 for 2.28.9). */
int kolo__gpu_nccl_version(void);

#endif /* KOLO_HAVE_GPU */
#endif /* KOLO_GPU_H */
