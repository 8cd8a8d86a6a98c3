/*
 * simdev_ops.h — a simulated device behind the device table (design in
 * simdev_ops.c): "device memory" is host memory, a stream is an in-order
 * worker thread, events are positions in a stream. Built only into the
 * unit tests' library (with ops/mem), never into libkolo: the tests give
 * it to the runtime with kolo__ops_device_use(&kolo__dev_ops_simdev) and
 * play the program's part through the functions below.
 */
#ifndef KOLO_SIMDEV_OPS_H
#define KOLO_SIMDEV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const kolo__dev_ops_t kolo__dev_ops_simdev;

/* The devices the process "sees": 0..KOLO__SIMDEV_DEVICES-1. */
#define KOLO__SIMDEV_DEVICES 8

/* Memory of `device` (zeroed), and its release. NULL when out of memory or
 * the device does not exist. */
void *kolo__simdev_malloc(int device, size_t bytes);
void kolo__simdev_free(void *p);

/* The program's streams: a new one on `device`, and its release (after
 * what is queued has run). NULL stands for a device's default stream in
 * the calls below, as cudaStream_t 0 does (kolo_opts_t.stream NULL). */
void *kolo__simdev_stream_new(int device);
void kolo__simdev_stream_free(void *stream);
/* Queues fn(arg) on the stream (the program's kernel); the default stream
 * of `device` when stream is NULL. KOLO_OK, or KOLO_ERR_NO_MEMORY. */
int kolo__simdev_launch(void *stream, int device, void (*fn)(void *),
                        void *arg);
/* Sleeps until everything queued on the stream so far has run
 * (cudaStreamSynchronize). */
void kolo__simdev_sync(void *stream, int device);

/* While on, the streams of kolo's contexts on `device` start no new work,
 * as a device whose kernels never finish; aborting a context's
 * communicator ends it for that context (as ncclCommAbort ends NCCL's
 * kernels). */
void kolo__simdev_hold(int device, int on);
/* The next collective that global rank `global_rank` runs on the device
 * (in any context) fails as an asynchronous NCCL error would: it moves no
 * bytes, and the context reports the error to watch. */
void kolo__simdev_fail_next(int global_rank);
/* The next context that global rank `global_rank` starts (simdev_init,
 * a set's first device batch) fails before it meets the other members:
 * KOLO_ERR_NO_MEMORY as device memory that cannot be had, KOLO_ERR_BACKEND
 * as a CUDA/NCCL error at init; KOLO_OK clears it. */
void kolo__simdev_fail_start(int global_rank, int code);
/* Collectives queued and finished so far by global rank `global_rank`'s
 * contexts (either pointer may be NULL). */
void kolo__simdev_counts(int global_rank, uint64_t *queued,
                         uint64_t *finished);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_SIMDEV_OPS_H */
