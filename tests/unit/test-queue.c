/*
 * test-queue.c — unit tests of runtime/queue.{h,c}: the tensor queue
 * between the training threads and the background thread.
 *
 * Why these tests: the queue is the one place where the training threads
 * and the background thread meet, and what kolo.h promises about enqueuing
 * is decided here: pushes come out in order, a name in flight is refused,
 * a released name may come back, a closed queue refuses with the error that
 * closed it (naming the tensor refused). Its waits are what keep the background thread from spinning,
 * so the tests also check that a take with no work sleeps (for roughly its
 * timeout) and that a push or a shutdown request from another thread wakes
 * a sleeping take. Timings are only bounded below, plus a generous upper
 * bound that catches a take which never wakes.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "queue.h"
#include "unit.h"

static kolo__entry_t *entry(const char *name, kolo_handle_t handle)
{
    kolo__entry_t *e = kolo__entry_new(name);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->name, name);
    ck_assert_ptr_ne(e->name, name); /* a copy */
    e->handle = handle;
    return e;
}

static void free_list(kolo__entry_t *e)
{
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        kolo__entry_free(e);
        e = next;
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The queue under test: every case starts with an empty one, destroyed
 * after it (with whatever it still holds). */
static kolo__queue_t q;

static void queue_setup(void)
{
    ck_assert_int_eq(kolo__queue_init(&q), 0);
}

static void queue_teardown(void)
{
    kolo__queue_destroy(&q);
}

START_TEST(take_returns_pushes_in_order)
{
    kolo__err_t err;
    kolo__entry_t *list, *e;
    int shutdown = -1, i = 0;
    const char *names[] = {"a", "b", "c", "d", "e"};

    for (int k = 0; k < 5; k++) {
        kolo__err_clear(&err);
        ck_assert_int_eq(kolo__queue_push(&q, entry(names[k], k + 1), &err),
                         KOLO_OK);
        ck_assert_int_eq(err.code, KOLO_OK);
    }
    ck_assert_int_eq(kolo__queue_wait(&q, 0), 1);
    list = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_int_eq(shutdown, 0);
    for (e = list; e != NULL; e = e->next, i++) {
        ck_assert_int_lt(i, 5);
        ck_assert_str_eq(e->name, names[i]);
        ck_assert_int_eq(e->handle, i + 1);
    }
    ck_assert_int_eq(i, 5);
    /* Everything was detached: the queue is empty now. */
    ck_assert_ptr_null(kolo__queue_take(&q, 0, &shutdown));
    ck_assert_int_eq(kolo__queue_wait(&q, 0), 0);

    /* Later pushes form a new list, not appended to the taken one. */
    ck_assert_int_eq(kolo__queue_push(&q, entry("f", 6), &err), KOLO_OK);
    e = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->name, "f");
    ck_assert_ptr_null(e->next);
    kolo__entry_free(e);
    free_list(list);
}
END_TEST

START_TEST(duplicate_name_refused)
{
    kolo__err_t err;
    kolo__entry_t *dup, *list;
    int shutdown;

    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__queue_push(&q, entry("layer1/weight", 1), &err),
                     KOLO_OK);
    dup = entry("layer1/weight", 2);
    ck_assert_int_eq(kolo__queue_push(&q, dup, &err), KOLO_ERR_DUPLICATE_NAME);
    ck_assert_int_eq(err.code, KOLO_ERR_DUPLICATE_NAME);
    ck_assert_msg(strstr(err.msg, "'layer1/weight'") != NULL,
                  "message does not name the tensor: %s", err.msg);
    /* The refused entry was not taken: still ours to free. */
    kolo__entry_free(dup);

    /* Still refused after the first was taken: in flight until release. */
    list = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_ptr_nonnull(list);
    dup = entry("layer1/weight", 3);
    ck_assert_int_eq(kolo__queue_push(&q, dup, &err), KOLO_ERR_DUPLICATE_NAME);
    kolo__entry_free(dup);
    ck_assert_ptr_null(kolo__queue_take(&q, 0, &shutdown));

    /* Another name is fine meanwhile. */
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__queue_push(&q, entry("layer1/bias", 4), &err),
                     KOLO_OK);
    ck_assert_int_eq(err.code, KOLO_OK);
    free_list(list);
    /* The teardown's kolo__queue_destroy frees the queued "layer1/bias". */
}
END_TEST

START_TEST(release_allows_repush)
{
    kolo__err_t err;
    kolo__entry_t *list;
    int shutdown;

    ck_assert_int_eq(kolo__queue_push(&q, entry("g", 1), &err), KOLO_OK);
    list = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_ptr_nonnull(list);
    /* Releasing a name never pushed changes nothing. */
    kolo__queue_release(&q, "other");
    kolo__entry_t *dup = entry("g", 2);
    ck_assert_int_eq(kolo__queue_push(&q, dup, &err), KOLO_ERR_DUPLICATE_NAME);
    kolo__entry_free(dup);

    kolo__queue_release(&q, "g");
    kolo__entry_free(list);
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__queue_push(&q, entry("g", 3), &err), KOLO_OK);
    ck_assert_int_eq(err.code, KOLO_OK);
    list = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_ptr_nonnull(list);
    ck_assert_int_eq(list->handle, 3);
    ck_assert_ptr_null(list->next);
    kolo__queue_release(&q, "g");
    kolo__entry_free(list);
}
END_TEST

START_TEST(take_timeout_zero_returns_at_once)
{
    int shutdown = -1;
    int64_t t0, dt;

    t0 = kolo__now_us();
    for (int i = 0; i < 100; i++)
        ck_assert_ptr_null(kolo__queue_take(&q, 0, &shutdown));
    ck_assert_int_eq(kolo__queue_wait(&q, 0), 0);
    dt = kolo__now_us() - t0;
    ck_assert_int_eq(shutdown, 0);
    /* 100 non-blocking takes: far below one second even on a loaded
     * machine. */
    ck_assert_msg(dt < 1000000, "100 takes with timeout 0 took %lld us",
                  (long long)dt);
}
END_TEST

START_TEST(take_with_timeout_waits_when_empty)
{
    int shutdown = -1;
    int64_t t0, dt;

    t0 = kolo__now_us();
    ck_assert_ptr_null(kolo__queue_take(&q, 200000, &shutdown));
    dt = kolo__now_us() - t0;
    ck_assert_int_eq(shutdown, 0);
    ck_assert_msg(dt >= 190000, "take(200 ms) returned after %lld us",
                  (long long)dt);
    ck_assert_msg(dt < 5000000, "take(200 ms) returned after %lld us",
                  (long long)dt);

    /* A timeout with a whole second and a fraction exercises the
     * nanosecond carry of the deadline. */
    t0 = kolo__now_us();
    ck_assert_int_eq(kolo__queue_wait(&q, 1300000), 0);
    dt = kolo__now_us() - t0;
    ck_assert_msg(dt >= 1290000 && dt < 5000000,
                  "wait(1.3 s) returned after %lld us", (long long)dt);
}
END_TEST

START_TEST(take_with_timeout_returns_queued_work_at_once)
{
    kolo__err_t err;
    kolo__entry_t *list;
    int shutdown;
    int64_t t0, dt;

    ck_assert_int_eq(kolo__queue_push(&q, entry("x", 1), &err), KOLO_OK);
    t0 = kolo__now_us();
    list = kolo__queue_take(&q, 3000000, &shutdown);
    dt = kolo__now_us() - t0;
    ck_assert_ptr_nonnull(list);
    ck_assert_msg(dt < 2000000, "take with work queued slept %lld us",
                  (long long)dt);
    kolo__entry_free(list);
}
END_TEST

typedef struct taker {
    kolo__queue_t *q;
    int64_t timeout_us;
    kolo__entry_t *got;
    int shutdown;
    int64_t woke_us;
} taker_t;

static void *take_thread(void *arg)
{
    taker_t *t = arg;
    t->got = kolo__queue_take(t->q, t->timeout_us, &t->shutdown);
    t->woke_us = kolo__now_us();
    return NULL;
}

/* A take blocked with timeout `timeout_us` (< 0: none) is woken by a push
 * from this thread. */
static void check_push_wakes(int64_t timeout_us)
{
    kolo__queue_t wq; /* its own: the test makes two */
    kolo__err_t err;
    taker_t t = {0};
    pthread_t th;
    int64_t pushed_us;

    ck_assert_int_eq(kolo__queue_init(&wq), 0);
    t.q = &wq;
    t.timeout_us = timeout_us;
    t.shutdown = -1;
    ck_assert_int_eq(pthread_create(&th, NULL, take_thread, &t), 0);
    sleep_ms(100); /* let it block */
    pushed_us = kolo__now_us();
    ck_assert_int_eq(kolo__queue_push(&wq, entry("woken", 7), &err), KOLO_OK);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_ptr_nonnull(t.got);
    ck_assert_str_eq(t.got->name, "woken");
    ck_assert_int_eq(t.shutdown, 0);
    ck_assert_msg(t.woke_us - pushed_us < 5000000,
                  "take woke %lld us after the push",
                  (long long)(t.woke_us - pushed_us));
    kolo__entry_free(t.got);
    kolo__queue_destroy(&wq);
}

START_TEST(push_from_other_thread_wakes_blocked_take)
{
    check_push_wakes(-1);           /* no timeout */
    check_push_wakes(60 * 1000000); /* a minute: must not run out */
}
END_TEST

START_TEST(request_shutdown_wakes_take)
{
    taker_t t = {0};
    pthread_t th;
    int shutdown = -1;

    t.q = &q;
    t.timeout_us = -1;
    t.shutdown = -1;
    ck_assert_int_eq(pthread_create(&th, NULL, take_thread, &t), 0);
    sleep_ms(100);
    kolo__queue_request_shutdown(&q);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_ptr_null(t.got);
    ck_assert_int_eq(t.shutdown, 1);

    /* The request stays: later takes and waits return at once with it. */
    ck_assert_ptr_null(kolo__queue_take(&q, -1, &shutdown));
    ck_assert_int_eq(shutdown, 1);
    ck_assert_int_eq(kolo__queue_wait(&q, -1), 1);
}
END_TEST

START_TEST(shutdown_take_still_returns_queued_work)
{
    kolo__err_t err;
    kolo__entry_t *list;
    int shutdown = -1;

    ck_assert_int_eq(kolo__queue_push(&q, entry("late", 1), &err), KOLO_OK);
    kolo__queue_request_shutdown(&q);
    /* A request does not refuse pushes; only close does. */
    ck_assert_int_eq(kolo__queue_push(&q, entry("later", 2), &err), KOLO_OK);
    list = kolo__queue_take(&q, -1, &shutdown);
    ck_assert_int_eq(shutdown, 1);
    ck_assert_ptr_nonnull(list);
    ck_assert_str_eq(list->name, "late");
    ck_assert_ptr_nonnull(list->next);
    ck_assert_str_eq(list->next->name, "later");
    free_list(list);
}
END_TEST

START_TEST(close_makes_push_fail_with_close_error)
{
    kolo__err_t err, close_err, second;
    kolo__entry_t *e, *list;
    int shutdown;

    ck_assert_int_eq(kolo__queue_push(&q, entry("before", 1), &err), KOLO_OK);
    kolo__err_set(&close_err, KOLO_ERR_SHUTDOWN,
                  "rank 2 shut down: no more tensors can be enqueued");
    kolo__queue_close(&q, &close_err);
    /* A second close does not replace the first error. */
    kolo__err_set(&second, KOLO_ERR_RANK_LOST, "rank 1 was lost");
    kolo__queue_close(&q, &second);

    e = entry("after", 2);
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__queue_push(&q, e, &err), KOLO_ERR_SHUTDOWN);
    ck_assert_int_eq(err.code, KOLO_ERR_SHUTDOWN);
    /* It names the tensor refused, and why the queue closed. */
    ck_assert_str_eq(err.msg, "tensor 'after' cannot be enqueued: rank 2 shut "
                              "down: no more tensors can be enqueued");
    /* A name already in flight gets the close error too, not a duplicate. */
    kolo__entry_t *dup = entry("before", 3);
    ck_assert_int_eq(kolo__queue_push(&q, dup, &err), KOLO_ERR_SHUTDOWN);
    kolo__entry_free(dup);
    kolo__entry_free(e);

    /* What was queued before the close is still there to complete. */
    list = kolo__queue_take(&q, 0, &shutdown);
    ck_assert_ptr_nonnull(list);
    ck_assert_str_eq(list->name, "before");
    ck_assert_ptr_null(list->next);
    kolo__entry_free(list);
}
END_TEST

/* Several producers push concurrently while one consumer takes: every
 * entry comes out once, and each producer's entries keep their order. */
typedef struct producer {
    kolo__queue_t *q;
    int id, n, failures;
} producer_t;

static void *produce(void *arg)
{
    producer_t *p = arg;
    char name[64];
    for (int i = 0; i < p->n; i++) {
        kolo__err_t err;
        kolo__entry_t *e;
        snprintf(name, sizeof name, "p%d/t%d", p->id, i);
        e = kolo__entry_new(name);
        if (e == NULL) {
            p->failures++;
            continue;
        }
        e->handle = (kolo_handle_t)p->id * 1000000 + i;
        if (kolo__queue_push(p->q, e, &err) != KOLO_OK) {
            p->failures++;
            kolo__entry_free(e);
        }
    }
    return NULL;
}

START_TEST(concurrent_producers)
{
    enum { P = 4, N = 2000 };
    producer_t prod[P];
    pthread_t th[P];
    int next[P] = {0};
    int total = 0, shutdown;

    for (int p = 0; p < P; p++) {
        prod[p] = (producer_t){&q, p, N, 0};
        ck_assert_int_eq(pthread_create(&th[p], NULL, produce, &prod[p]), 0);
    }
    while (total < P * N) {
        kolo__entry_t *list = kolo__queue_take(&q, 5000000, &shutdown);
        ck_assert_msg(list != NULL, "no work for 5 s after %d entries", total);
        for (kolo__entry_t *e = list; e != NULL; e = e->next) {
            int p = (int)(e->handle / 1000000), i = (int)(e->handle % 1000000);
            ck_assert_int_ge(p, 0);
            ck_assert_int_lt(p, P);
            ck_assert_int_eq(i, next[p]);
            next[p]++;
            total++;
            kolo__queue_release(&q, e->name);
        }
        free_list(list);
    }
    for (int p = 0; p < P; p++) {
        ck_assert_int_eq(pthread_join(th[p], NULL), 0);
        ck_assert_int_eq(prod[p].failures, 0);
        ck_assert_int_eq(next[p], N);
    }
    ck_assert_uint_eq(q.in_flight.count, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("queue");
    TCase *tc = kolo_unit_tcase(
        s, "core", 30,
        KOLO_UNIT_TESTS(take_returns_pushes_in_order, duplicate_name_refused,
                        release_allows_repush,
                        take_timeout_zero_returns_at_once,
                        take_with_timeout_waits_when_empty,
                        take_with_timeout_returns_queued_work_at_once,
                        push_from_other_thread_wakes_blocked_take,
                        request_shutdown_wakes_take,
                        shutdown_take_still_returns_queued_work,
                        close_makes_push_fail_with_close_error,
                        concurrent_producers));

    tcase_add_checked_fixture(tc, queue_setup, queue_teardown);
    return kolo_unit_run(s);
}
