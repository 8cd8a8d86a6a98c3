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
 * The timeline's device side. While a timeline records (and the backend
 * keeps time: the device table's mark and event_time), a batch gets timed
 * events on kolo's stream before and after its work, and the first wait
 * for it marks the program's stream where it waits. A passed batch moves
 * to a second list, in order, until its times are known and the program
 * has waited for it (or TIMED_WAIT_US went by); then its spans go on its
 * tensors' lanes (write_times): how long the device waited before starting
 * it (counted from the end of kolo's batch before it, if later than its
 * queuing), how long it ran, and how long the program's stream waited for
 * it. Spans of batches still in flight when the timeline stops are lost;
 * those queued before the current file began are dropped.
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
#include "timeline.h"

/* A host wait for a batch sleeps this long at first, doubling up to
 * SETTLE_MAX_NS: short results are seen soon, long ones cost a wake-up a
 * millisecond. */
#define SETTLE_MIN_NS 20000L
#define SETTLE_MAX_NS 1000000L
/* A drain looks at the device this often. */
#define DRAIN_NS 5000000L
/* A passed batch's device times wait at most this long for the program to
 * wait for it (and so to learn how long its stream waited). */
#define TIMED_WAIT_US 10000000

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
    atomic_init(&d->t_reach, NULL);
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

    void *reach;

    if (d == NULL ||
        atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1)
        return;
    d->dev->event_free(d->event);
    if (d->t_start != NULL)
        d->dev->event_free(d->t_start);
    if (d->t_end != NULL)
        d->dev->event_free(d->t_end);
    reach = atomic_load_explicit(&d->t_reach, memory_order_acquire);
    if (reach != NULL)
        d->dev->event_free(reach);
    free(d->lanes);
    free(d);
}

/* The program's stream waits here for a timed batch: a timed event marks
 * where, the first time (a fused batch's other handles find it there). */
static void mark_reach(kolo__done_t *d, void *stream)
{
    void *ev = NULL, *none = NULL;

    if (d->t_end == NULL ||
        atomic_load_explicit(&d->t_reach, memory_order_acquire) != NULL ||
        d->dev->mark(NULL, d->device, stream, &ev) != KOLO_OK)
        return;
    if (!atomic_compare_exchange_strong_explicit(&d->t_reach, &none, ev,
                                                 memory_order_acq_rel,
                                                 memory_order_acquire))
        d->dev->event_free(ev);
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
        mark_reach(d, stream);
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

/* Puts b at the end of a list (the batches in flight, or the timed ones
 * that passed), counting it in *n. */
static void append(kolo__inflight_t **head, kolo__inflight_t **tail,
                   size_t *n, kolo__inflight_t *b)
{
    b->next = NULL;
    if (*tail != NULL)
        (*tail)->next = b;
    else
        *head = b;
    *tail = b;
    (*n)++;
}

int kolo__inflight_add(kolo__inflight_list_t *l, kolo__done_t *d,
                       const char *what)
{
    kolo__inflight_t *b = kolo__malloc(sizeof(*b));

    if (b == NULL)
        return KOLO_ERR_NO_MEMORY;
    kolo__done_ref(d);
    b->done = d;
    b->queued_us = kolo__now_us();
    snprintf(b->what, sizeof(b->what), "%s", what);
    append(&l->head, &l->tail, &l->n, b);
    return KOLO_OK;
}

/* Takes the oldest batch off the list; a timed one that passed (keep)
 * moves to the end of the timed list. */
static void pop(kolo__inflight_list_t *l, int keep)
{
    kolo__inflight_t *b = l->head;

    l->head = b->next;
    if (l->head == NULL)
        l->tail = NULL;
    l->n--;
    if (keep && b->done->t_end != NULL && l->tl != NULL) {
        append(&l->timed, &l->timed_tail, &l->ntimed, b);
        return;
    }
    kolo__done_release(b->done);
    free(b);
}

/* Writes one passed batch's device side on each of its tensors' lanes:
 * in their "device" row, WAIT_FOR_DATA from when the host began to queue
 * it, or kolo's batch before it finished, until the device started it (the
 * device waited for the program's work on the inputs), and the collective
 * under Horovod's name (NCCL_ALLREDUCE, ...) while the device ran it; in
 * their "program stream" row, PROGRAM_STREAM_WAIT from where the
 * program's stream reached its wait for the batch until the batch was
 * done, when that was later. */
static void write_times(kolo__timeline_t *tl, const kolo__done_t *d,
                        int64_t from, int64_t start, int64_t end,
                        int64_t reach)
{
    char args[160];

    snprintf(args, sizeof(args), "\"device\":%d,\"tensors\":%d,\"bytes\":%lld",
             d->device, d->ntensors, (long long)d->bytes);
    if (start < from)
        start = from; /* the clocks agree to a few microseconds */
    if (end < start)
        end = start;
    for (const char *name = d->lanes; *name != '\0';
         name += strlen(name) + 1) {
        if (start > from)
            kolo__tl_device(tl, name, KOLO__TL_ROW_DEVICE, "WAIT_FOR_DATA",
                            NULL, from, start - from);
        kolo__tl_device(tl, name, KOLO__TL_ROW_DEVICE, d->phase, args, start,
                        end - start);
        if (reach > 0 && reach < end)
            kolo__tl_device(tl, name, KOLO__TL_ROW_STREAM,
                            "PROGRAM_STREAM_WAIT", NULL, reach, end - reach);
    }
}

/* The timed batches whose times are known, oldest first: written and
 * dropped. Unless `all`, the oldest one stays (and the ones after it) while
 * the program has not waited for all its handles, or its stream has not
 * reached its wait, for TIMED_WAIT_US at most; with `all` every one goes,
 * with what is known. A batch queued before the timeline's file began is
 * dropped unwritten. */
static void write_timed(kolo__inflight_list_t *l, int all)
{
    int64_t now = kolo__now_us();
    int64_t since = kolo__timeline_started_us(l->tl);

    while (l->timed != NULL) {
        kolo__inflight_t *b = l->timed;
        kolo__done_t *d = b->done;
        const kolo__dev_ops_t *dev = d->dev;
        /* refs first: the wait that marks t_reach drops its reference
         * afterwards, so refs == 1 means t_reach is there if it ever is. */
        int waited = atomic_load_explicit(&d->refs, memory_order_acquire) == 1;
        void *reach = atomic_load_explicit(&d->t_reach, memory_order_acquire);
        int64_t start = 0, end = 0, at = 0;
        int late = all || now - b->queued_us > TIMED_WAIT_US;
        int qe, qr = 0;

        if (!late && reach == NULL && !waited)
            break;
        qe = dev->event_time(d->t_end, &end);
        if (reach != NULL)
            qr = dev->event_time(reach, &at);
        if (!late && (qe == 0 || (reach != NULL && qr == 0)))
            break;
        if (qe > 0 && dev->event_time(d->t_start, &start) > 0) {
            int64_t from = d->queued_us > l->last_end_us ? d->queued_us
                                                         : l->last_end_us;
            if (since > 0 && d->queued_us >= since)
                write_times(l->tl, d, from, start, end, qr > 0 ? at : 0);
            l->last_end_us = end;
        }
        l->timed = b->next;
        if (l->timed == NULL)
            l->timed_tail = NULL;
        l->ntimed--;
        kolo__done_release(d);
        free(b);
    }
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
        pop(l, 0);
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
        pop(l, 1);
    }
    return 0;
}

int kolo__inflight_watch(kolo__inflight_list_t *l, const kolo__dev_ops_t *dev,
                         void *ctx, int rank, double timeout_s,
                         kolo__err_t *err)
{
    char fault[KOLO__ERR_LEN], detail[KOLO__ERR_LEN];
    int q, rc, expired;

    if (l->timed != NULL)
        write_timed(l, 0);
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
    write_timed(l, 1);
    return rc;
}
