/*
 * queue.c — the tensor queue (design in queue.h).
 */
#include "alloc.h"
#include "queue.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

kolo__entry_t *kolo__entry_new(const char *name)
{
    kolo__entry_t *e = kolo__calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->name = kolo__strdup(name);
    if (e->name == NULL) {
        free(e);
        return NULL;
    }
    return e;
}

void kolo__result_free(void *result)
{
    kolo__result_t *r = result;
    if (r != NULL) {
        if (r->data_free != NULL)
            r->data_free(r->data);
        else
            free(r->data);
        free(r->splits);
        free(r);
    }
}

void kolo__entry_free(kolo__entry_t *e)
{
    if (e != NULL) {
        free(e->name);
        free(e->splits);
        free(e->scratch);
        if (e->ready_free != NULL)
            e->ready_free(e->ready_event);
        kolo__result_free(e->result);
        free(e);
    }
}

int kolo__queue_init(kolo__queue_t *q)
{
    pthread_condattr_t attr;

    memset(q, 0, sizeof(*q));
    kolo__map_init(&q->in_flight);
    if (pthread_mutex_init(&q->mu, NULL) != 0)
        return -1;
    /* Timed waits use the monotonic clock, immune to wall-clock jumps. */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&q->cv, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        pthread_mutex_destroy(&q->mu);
        return -1;
    }
    pthread_condattr_destroy(&attr);
    return 0;
}

void kolo__queue_destroy(kolo__queue_t *q)
{
    kolo__entry_t *e = q->head;
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        kolo__entry_free(e);
        e = next;
    }
    kolo__map_free(&q->in_flight);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

int kolo__queue_push(kolo__queue_t *q, kolo__entry_t *e, kolo__err_t *err)
{
    return kolo__queue_push_many(q, &e, 1, err);
}

int kolo__queue_push_many(kolo__queue_t *q, kolo__entry_t **es, size_t n,
                          kolo__err_t *err)
{
    int rc = KOLO_OK;
    size_t i;

    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        /* The reason names the tensor that failed first; say which one
         * this refusal is about, unless it is the same. */
        if (n == 0 || strstr(q->close_err.msg, es[0]->name) != NULL)
            rc = kolo__err_set(err, q->close_err.code, "%s", q->close_err.msg);
        else
            rc = kolo__err_set(err, q->close_err.code, "tensor '%s' cannot be "
                               "enqueued: %s", es[0]->name, q->close_err.msg);
        goto unlock;
    }
    for (i = 0; i < n; i++) {
        if (kolo__map_gets(&q->in_flight, es[i]->name) != NULL) {
            rc = kolo__err_set(err, KOLO_ERR_DUPLICATE_NAME,
                               "tensor '%s' is already in flight on this "
                               "rank: wait for its handle before enqueuing it "
                               "again",
                               es[i]->name);
            break;
        }
        if (kolo__map_puts(&q->in_flight, es[i]->name, es[i]) != 0) {
            rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                               "out of memory enqueuing tensor '%s'",
                               es[i]->name);
            break;
        }
    }
    if (rc != KOLO_OK) {
        /* Undo the names this call added (a repeated name within the call
         * was found in flight: it was added by this call). */
        while (i-- > 0)
            kolo__map_dels(&q->in_flight, es[i]->name);
        goto unlock;
    }
    for (i = 0; i < n; i++) {
        es[i]->next = NULL;
        if (q->tail != NULL)
            q->tail->next = es[i];
        else
            q->head = es[i];
        q->tail = es[i];
    }
    atomic_store_explicit(&q->pushed,
                          atomic_load_explicit(&q->pushed, memory_order_relaxed) + n,
                          memory_order_relaxed);
    pthread_cond_signal(&q->cv);
unlock:
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static int peer_asks(const kolo__queue_t *q, uint64_t next_round)
{
    return q->wake_set && q->wake_round >= next_round;
}

/* Waits with q->mu held; returns when there is something to do or the
 * deadline passes. */
static void wait_locked(kolo__queue_t *q, int64_t timeout_us,
                        uint64_t next_round)
{
    struct timespec deadline;

    if (timeout_us == 0)
        return;
    if (timeout_us > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_us / 1000000;
        deadline.tv_nsec += (timeout_us % 1000000) * 1000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
    }
    while (q->head == NULL && !q->shutdown_requested &&
           !peer_asks(q, next_round)) {
        if (timeout_us < 0)
            pthread_cond_wait(&q->cv, &q->mu);
        else if (pthread_cond_timedwait(&q->cv, &q->mu, &deadline) == ETIMEDOUT)
            break;
    }
}

int kolo__queue_wait(kolo__queue_t *q, int64_t timeout_us)
{
    int ready;
    pthread_mutex_lock(&q->mu);
    wait_locked(q, timeout_us, UINT64_MAX);
    ready = q->head != NULL || q->shutdown_requested;
    pthread_mutex_unlock(&q->mu);
    return ready;
}

kolo__entry_t *kolo__queue_take_round(kolo__queue_t *q, int64_t timeout_us,
                                      uint64_t next_round, int *shutdown,
                                      kolo__wake_reason_t *reason)
{
    kolo__entry_t *list;

    pthread_mutex_lock(&q->mu);
    wait_locked(q, timeout_us, next_round);
    list = q->head;
    q->head = q->tail = NULL;
    atomic_store_explicit(&q->taken,
                          atomic_load_explicit(&q->pushed, memory_order_relaxed),
                          memory_order_relaxed);
    *shutdown = q->shutdown_requested;
    if (peer_asks(q, next_round))
        *reason = KOLO__WOKE_PEER;
    else if (list != NULL)
        *reason = KOLO__WOKE_WORK;
    else if (*shutdown)
        *reason = KOLO__WOKE_SHUTDOWN;
    else
        *reason = KOLO__WOKE_TIMEOUT;
    /* The round about to run answers every token received so far. */
    q->wake_set = 0;
    pthread_mutex_unlock(&q->mu);
    return list;
}

kolo__entry_t *kolo__queue_take(kolo__queue_t *q, int64_t timeout_us,
                                int *shutdown)
{
    kolo__wake_reason_t reason;
    return kolo__queue_take_round(q, timeout_us, UINT64_MAX, shutdown, &reason);
}

void kolo__queue_peer_wake(kolo__queue_t *q, uint64_t round)
{
    pthread_mutex_lock(&q->mu);
    if (!q->wake_set || round > q->wake_round) {
        q->wake_set = 1;
        q->wake_round = round;
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void kolo__queue_release(kolo__queue_t *q, const char *name)
{
    pthread_mutex_lock(&q->mu);
    kolo__map_dels(&q->in_flight, name);
    pthread_mutex_unlock(&q->mu);
}

void kolo__queue_request_shutdown(kolo__queue_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->shutdown_requested = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void kolo__queue_close(kolo__queue_t *q, const kolo__err_t *err)
{
    pthread_mutex_lock(&q->mu);
    if (!q->closed) {
        q->closed = 1;
        q->close_err = *err;
    }
    pthread_mutex_unlock(&q->mu);
}
