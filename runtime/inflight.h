/*
 * inflight.h — device batches between being queued and done (inflight.c,
 * where the design essay is): the completion a CUDA tensor's handle
 * carries, and the set's list of batches the device has not finished.
 */
#ifndef KOLO_INFLIGHT_H
#define KOLO_INFLIGHT_H

#include <stdatomic.h>
#include <stdint.h>

#include "common.h"
#include "ops.h"

/* The completion of one device batch: the backend's event after its work,
 * shared by the handles of its tensors and the set's list (a reference
 * each). `failed` is set (after err is written) when the batch failed
 * after its handles completed. */
typedef struct kolo__done {
    _Atomic int refs;
    _Atomic int failed; /* 0, or the failure's status code */
    const kolo__dev_ops_t *dev;
    void *event;
    kolo__err_t err;
    /* The timeline's device side: set when a timeline recorded as the
     * batch was queued (and the backend keeps time), else NULL. Timed
     * events on kolo's stream before and after the batch's work, and on
     * the program's stream where it first waited for the batch (order). */
    void *t_start, *t_end;
    _Atomic(void *) t_reach;
    int device;
    int64_t queued_us;   /* when the host began to queue the batch */
    const char *phase;   /* NCCL_ALLREDUCE, ... (static) */
    char *lanes;         /* the tensors' names, each ended by '\0', then "" */
    int ntensors;
    int64_t bytes;
} kolo__done_t;

/* One batch in flight, in the set's list (background thread only). */
typedef struct kolo__inflight {
    struct kolo__inflight *next;
    kolo__done_t *done;
    int64_t queued_us;
    char what[KOLO_MAX_NAME_LEN + 96]; /* "allreduce of CUDA tensor 'x' ..." */
} kolo__inflight_t;

typedef struct kolo__inflight_list {
    kolo__inflight_t *head, *tail;
    size_t n;
    /* Passed batches whose device times wait to be written to the
     * timeline, oldest first (until the program has waited for them, to
     * know how long its stream waited), and that timeline. */
    kolo__inflight_t *timed, *timed_tail;
    size_t ntimed;
    struct kolo__timeline *tl;
    int64_t last_end_us; /* when the device finished the last one written */
} kolo__inflight_list_t;

/* A new completion holding one reference, for the event `event` of `dev`;
 * NULL when out of memory (the event is then freed). */
kolo__done_t *kolo__done_new(const kolo__dev_ops_t *dev, void *event);
void kolo__done_ref(kolo__done_t *d);
/* Drops a reference; the last frees the event. void * for the handle
 * table's destructor. */
void kolo__done_release(void *done);

/* The program's side, when it waits for a handle that carries `d` (API
 * thread). With host = 0, the work queued on `stream` from now on waits
 * for the batch (the host does not); with host = 1, sleeps until the
 * device has passed the batch (the program reads a result). Either way,
 * returns the batch's late failure if one is known, naming the tensor. */
int kolo__done_settle(kolo__done_t *d, void *stream, int host,
                      kolo__err_t *err);

/* The set's side (background thread). Adds a queued batch, taking a
 * reference to d; `what` names it for messages. KOLO_ERR_NO_MEMORY if the
 * node cannot be made (the caller then waits for the device itself). */
int kolo__inflight_add(kolo__inflight_list_t *l, kolo__done_t *d,
                       const char *what);
/* Drops the batches the device has passed, and while some remain asks
 * the backend's watch whether they can still finish (the oldest against
 * timeout_s). On a failure every batch still listed is marked failed with
 * a message naming it and this rank, the list is emptied, and the first
 * message goes to err. */
int kolo__inflight_watch(kolo__inflight_list_t *l, const kolo__dev_ops_t *dev,
                         void *ctx, int rank, double timeout_s,
                         kolo__err_t *err);
/* At a set's end: waits (sleeping, watching as above) until every batch
 * has passed, or fails them; then the list is empty. */
int kolo__inflight_drain(kolo__inflight_list_t *l, const kolo__dev_ops_t *dev,
                         void *ctx, int rank, double timeout_s,
                         kolo__err_t *err);

#endif /* KOLO_INFLIGHT_H */
