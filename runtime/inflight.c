/*
 * inflight.c — device batches between being queued and done.
 *
 * DESIGN
 *
 * Why. A CUDA tensor's collective runs on the device backend's stream.
 * If the background thread slept until the device had finished each
 * batch, every batch would cost a round trip through the host, the next
 * batch could not be launched meanwhile, and a training thread waiting for
 * its gradients would sit idle instead of queuing the optimizer's kernels
 * behind them. So, as DDP does and as Horovod does with
 * HOROVOD_ENABLE_ASYNC_COMPLETION, a device batch completes its handles as
 * soon as its work is queued: what the handle carries is a completion
 * (kolo__done_t), the backend's event recorded after the batch.
 *
 * The program's side (api.c). Waiting for such a handle orders the result
 * on the program's stream: the stream waits for the event, the host does
 * not (kolo__done_settle with host = 0). Only where the host reads what the
 * device wrote (a result that kolo_wait_result hands over, to be copied
 * out) does the waiting thread sleep until the event has passed, in short
 * sleeps that also look for a late failure.
 *
 * The set's side (background thread). The set keeps the batches it queued
 * in a list, oldest first, each with a reference to its completion.
 * Between rounds the loop drops the batches whose event has passed, and
 * while any remain it asks the backend to watch them (the device table's
 * `watch`): an asynchronous error, a fault, a lost peer, or the oldest
 * batch in flight for longer than KOLO_TIMEOUT_SECONDS makes the backend
 * abort its communicators (which ends the kernels waiting for peers) and
 * let the stream drain. Then every batch still listed is marked failed,
 * with a message naming its tensors and this rank: a handle not yet waited
 * returns that failure from kolo_wait, and the loop stops the set with it
 * (background.c), so every later call on the set says why. While batches
 * are in flight the loop sleeps at most WATCH_US between rounds, so a
 * failure is seen within that time. When a set stops for any reason, what
 * is in flight is drained first: it finishes, or fails the same way.
 *
 * Lifetimes. A completion is freed (and its event released) when its last
 * reference goes: the list's, once the batch has passed or failed, and each
 * handle's, once waited. Its fields other than the counts are written
 * before it is shared, and `err` before `failed` is set (release order),
 * so a reader that sees `failed` sees the message.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "inflight.h"

/* A host wait for a batch sleeps this long at first, doubling up to
 * SETTLE_MAX_NS: short results are seen soon, long ones cost a wake-up a
 * millisecond. */
#define SETTLE_MIN_NS 20000L
#define SETTLE_MAX_NS 1000000L
/* A drain looks at the device this often. */
#define DRAIN_NS 5000000L

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

kolo__done_t *kolo__done_new(const kolo__dev_ops_t *dev, void *event)
{
    kolo__done_t *d = kolo__calloc(1, sizeof(*d));

    if (d == NULL) {
        dev->event_free(event);
        return NULL;
    }
    atomic_init(&d->refs, 1);
    atomic_init(&d->failed, 0);
    d->dev = dev;
    d->event = event;
    return d;
}

void kolo__done_ref(kolo__done_t *d)
{
    atomic_fetch_add_explicit(&d->refs, 1, memory_order_relaxed);
}

void kolo__done_release(void *done)
{
    kolo__done_t *d = done;

    if (d == NULL ||
        atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1)
        return;
    d->dev->event_free(d->event);
    free(d);
}

/* The batch's late failure, if one is known. */
static int late_failure(kolo__done_t *d, kolo__err_t *err)
{
    int code = atomic_load_explicit(&d->failed, memory_order_acquire);
    if (code == 0)
        return KOLO_OK;
    return kolo__err_set(err, code, "%s", d->err.msg);
}

int kolo__done_settle(kolo__done_t *d, void *stream, int host,
                      kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN];
    long ns = SETTLE_MIN_NS;
    int rc;

    if (!host) {
        rc = d->dev->order(d->event, stream, detail, sizeof(detail));
        if (rc != KOLO_OK)
            return kolo__err_set(err, rc, "%s", detail);
        return late_failure(d, err);
    }
    for (;;) {
        KOLO__CHECK(late_failure(d, err));
        rc = d->dev->event_query(d->event, detail, sizeof(detail));
        if (rc < 0)
            return kolo__err_set(err, rc, "%s", detail);
        if (rc > 0)
            return late_failure(d, err);
        /* The background thread's watch ends a batch that cannot finish
         * (it aborts the communicators), so this sleep is bounded. */
        nap(ns);
        ns = ns * 2 < SETTLE_MAX_NS ? ns * 2 : SETTLE_MAX_NS;
    }
}

int kolo__inflight_add(kolo__inflight_list_t *l, kolo__done_t *d,
                       const char *what)
{
    kolo__inflight_t *b = kolo__malloc(sizeof(*b));

    if (b == NULL)
        return KOLO_ERR_NO_MEMORY;
    kolo__done_ref(d);
    b->next = NULL;
    b->done = d;
    b->queued_us = kolo__now_us();
    snprintf(b->what, sizeof(b->what), "%s", what);
    if (l->tail != NULL)
        l->tail->next = b;
    else
        l->head = b;
    l->tail = b;
    l->n++;
    return KOLO_OK;
}

static void pop(kolo__inflight_list_t *l)
{
    kolo__inflight_t *b = l->head;

    l->head = b->next;
    if (l->head == NULL)
        l->tail = NULL;
    l->n--;
    kolo__done_release(b->done);
    free(b);
}

/* Every batch still listed fails with `detail`; the first one's message
 * goes to err. */
static int fail_all(kolo__inflight_list_t *l, int rc, int rank,
                    const char *detail, kolo__err_t *err)
{
    int first = 1;

    while (l->head != NULL) {
        kolo__done_t *d = l->head->done;
        kolo__err_set(&d->err, rc, "rank %d: %s failed after its handle "
                      "completed: %s", rank, l->head->what, detail);
        if (first)
            kolo__err_set(err, rc, "%s", d->err.msg);
        first = 0;
        atomic_store_explicit(&d->failed, rc, memory_order_release);
        pop(l);
    }
    return rc;
}

/* Drops what has passed; 1 when something is still in flight, 0 when
 * nothing is, a negative code after a fault (detail says which). */
static int reap(kolo__inflight_list_t *l, char *detail, size_t len)
{
    while (l->head != NULL) {
        int q = l->head->done->dev->event_query(l->head->done->event, detail,
                                                len);
        if (q < 0)
            return q;
        if (q == 0)
            return 1;
        pop(l);
    }
    return 0;
}

int kolo__inflight_watch(kolo__inflight_list_t *l, const kolo__dev_ops_t *dev,
                         void *ctx, int rank, double timeout_s,
                         kolo__err_t *err)
{
    char fault[KOLO__ERR_LEN], detail[KOLO__ERR_LEN];
    int q, rc, expired;

    if (l->head == NULL)
        return KOLO_OK;
    q = reap(l, fault, sizeof(fault));
    if (q == 0)
        return KOLO_OK;
    expired = (double)(kolo__now_us() - l->head->queued_us) > timeout_s * 1e6;
    /* A fault seen by the event is the backend's to handle too: it aborts
     * and drains before the handles fail. */
    rc = dev->watch(ctx, "the work queued on the device", expired || q < 0,
                    detail, sizeof(detail));
    if (rc == KOLO_OK && q < 0) {
        rc = q;
        snprintf(detail, sizeof(detail), "%s", fault);
    }
    if (rc == KOLO_OK)
        return KOLO_OK;
    return fail_all(l, rc, rank, detail, err);
}

int kolo__inflight_drain(kolo__inflight_list_t *l, const kolo__dev_ops_t *dev,
                         void *ctx, int rank, double timeout_s,
                         kolo__err_t *err)
{
    int rc = KOLO_OK;

    while (l->head != NULL && rc == KOLO_OK) {
        rc = kolo__inflight_watch(l, dev, ctx, rank, timeout_s, err);
        if (rc == KOLO_OK && l->head != NULL)
            nap(DRAIN_NS);
    }
    return rc;
}
