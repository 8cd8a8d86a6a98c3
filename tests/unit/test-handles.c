/*
 * test-handles.c — unit tests of runtime/handles.{h,c}: the handle table
 * that kolo_poll, kolo_wait and kolo_handle_error read.
 *
 * Why these tests: this is where kolo.h's completion contract is kept.
 * Handles are positive and only grow, so a stale id is recognised; a poll
 * does not release, a wait does, and a second wait says the handle was
 * already released while an id never handed out says so; the first
 * completion wins; the message of a failure reaches the caller through
 * both the error record and kolo__handles_error; and a waiter blocked in
 * another thread is woken by the completion, not by a timeout.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "handles.h"
#include "unit.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static kolo_handle_t new_handle(kolo__handles_t *h)
{
    kolo_handle_t id = -7;
    kolo__err_t err;
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__handles_new(h, &id, &err), KOLO_OK);
    ck_assert_int_eq(err.code, KOLO_OK);
    return id;
}

/* A fresh table with one handle in flight; its id. */
static kolo_handle_t table_with_one(kolo__handles_t *h)
{
    ck_assert_int_eq(kolo__handles_init(h), 0);
    return new_handle(h);
}

/* What a poll (or a wait) of id says: `code`, and for an error `msg`,
 * in the error record and from kolo__handles_error (before the wait
 * released it: after, nothing). */
static void expect_completed(kolo__handles_t *h, kolo_handle_t id, int code,
                             const char *msg, int wait)
{
    kolo__err_t err;

    kolo__err_clear(&err);
    if (wait)
        ck_assert_int_eq(kolo__handles_wait(h, id, &err), code);
    else
        ck_assert_int_eq(kolo__handles_poll(h, id, &err), code);
    ck_assert_int_eq(err.code, code);
    if (code != KOLO_OK)
        ck_assert_str_eq(err.msg, msg);
    if (code == KOLO_OK || wait)
        ck_assert_ptr_null(kolo__handles_error(h, id));
    else
        ck_assert_str_eq(kolo__handles_error(h, id), msg);
}

static void expect_invalid(kolo__handles_t *h, kolo_handle_t id,
                           const char *why)
{
    kolo__err_t err;
    char idtext[32];

    snprintf(idtext, sizeof idtext, "handle %lld ", (long long)id);
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__handles_poll(h, id, &err), KOLO_ERR_INVALID_HANDLE);
    ck_assert_int_eq(err.code, KOLO_ERR_INVALID_HANDLE);
    ck_assert_msg(strstr(err.msg, why) != NULL, "poll(%lld): %s",
                  (long long)id, err.msg);
    ck_assert_msg(strstr(err.msg, idtext) != NULL, "poll(%lld): %s",
                  (long long)id, err.msg);
    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__handles_wait(h, id, &err), KOLO_ERR_INVALID_HANDLE);
    ck_assert_msg(strstr(err.msg, why) != NULL, "wait(%lld): %s",
                  (long long)id, err.msg);
    ck_assert_msg(strstr(err.msg, idtext) != NULL, "wait(%lld): %s",
                  (long long)id, err.msg);
    ck_assert_ptr_null(kolo__handles_error(h, id));
}

START_TEST(ids_start_at_one_and_grow)
{
    kolo__handles_t h;

    ck_assert_int_eq(kolo__handles_init(&h), 0);
    ck_assert_uint_eq(kolo__handles_count(&h), 0);
    for (kolo_handle_t want = 1; want <= 100; want++)
        ck_assert_int_eq(new_handle(&h), want);
    ck_assert_uint_eq(kolo__handles_count(&h), 100);
    /* Releasing does not recycle ids. */
    kolo__handles_complete(&h, 100, KOLO_OK, NULL);
    ck_assert_int_eq(kolo__handles_wait(&h, 100, NULL), KOLO_OK);
    kolo__handles_complete(&h, 1, KOLO_OK, NULL);
    ck_assert_int_eq(kolo__handles_wait(&h, 1, NULL), KOLO_OK);
    ck_assert_uint_eq(kolo__handles_count(&h), 98);
    ck_assert_int_eq(new_handle(&h), 101);
    kolo__handles_destroy(&h); /* with 99 records left: freed, no leak */
}
END_TEST

START_TEST(poll_in_progress)
{
    kolo__handles_t h;
    kolo__err_t err;
    kolo_handle_t id = table_with_one(&h);

    kolo__err_clear(&err);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(kolo__handles_poll(&h, id, &err), KOLO_IN_PROGRESS);
    ck_assert_int_eq(err.code, KOLO_OK); /* not an error */
    ck_assert_ptr_null(kolo__handles_error(&h, id));
    ck_assert_uint_eq(kolo__handles_count(&h), 1);
    kolo__handles_destroy(&h);
}
END_TEST

/* A handle completed with `code` and the message `given` (in a buffer
 * overwritten at once: the table keeps its own copy): polled twice (a poll
 * releases nothing), then waited for (which releases it), each saying
 * `code` and `said`. */
static void completion_is_read(int code, const char *given, const char *said)
{
    kolo__handles_t h;
    kolo_handle_t id = table_with_one(&h);
    char buf[128];

    if (given != NULL)
        snprintf(buf, sizeof buf, "%s", given);
    kolo__handles_complete(&h, id, code, given != NULL ? buf : NULL);
    memset(buf, 'x', sizeof buf - 1);
    buf[sizeof buf - 1] = '\0';
    expect_completed(&h, id, code, said, 0);
    expect_completed(&h, id, code, said, 0);
    expect_completed(&h, id, code, said, 1);
    ck_assert_uint_eq(kolo__handles_count(&h), 0);
    kolo__handles_destroy(&h);
}

START_TEST(complete_ok_then_poll_and_wait)
{
    /* A message with KOLO_OK is ignored. */
    completion_is_read(KOLO_OK, "ignored", NULL);
}
END_TEST

START_TEST(complete_error_message_reaches_poll_error_and_wait)
{
    const char *msg = "tensor 'fc1' has 10 elements on rank 0 and 12 on rank 1";
    completion_is_read(KOLO_ERR_MISMATCH, msg, msg);
}
END_TEST

START_TEST(complete_error_without_message_uses_strerror)
{
    completion_is_read(KOLO_ERR_SHUTDOWN, NULL,
                       kolo_strerror(KOLO_ERR_SHUTDOWN));
}
END_TEST

START_TEST(second_wait_says_already_released)
{
    kolo__handles_t h;
    kolo_handle_t id = table_with_one(&h);

    new_handle(&h); /* a later one, so id is not the newest */
    kolo__handles_complete(&h, id, KOLO_ERR_BACKEND, "the backend failed");
    ck_assert_int_eq(kolo__handles_wait(&h, id, NULL), KOLO_ERR_BACKEND);
    expect_invalid(&h, id, "already released");
    /* Completing a released handle does nothing. */
    kolo__handles_complete(&h, id, KOLO_OK, NULL);
    expect_invalid(&h, id, "already released");
    ck_assert_uint_eq(kolo__handles_count(&h), 1);
    kolo__handles_destroy(&h);
}
END_TEST

START_TEST(never_issued_ids)
{
    kolo__handles_t h;
    kolo_handle_t ids[] = {0, -1, -1000, INT64_MIN, 3, 4, 1000, INT64_MAX};

    ck_assert_int_eq(kolo__handles_init(&h), 0);
    /* Before any handle exists, 1 is not issued either. */
    expect_invalid(&h, 1, "never issued");
    ck_assert_int_eq(new_handle(&h), 1);
    ck_assert_int_eq(new_handle(&h), 2);
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        expect_invalid(&h, ids[i], "never issued");
        /* Completing an id that was never issued does nothing either. */
        kolo__handles_complete(&h, ids[i], KOLO_ERR_INTERNAL, "x");
    }
    ck_assert_uint_eq(kolo__handles_count(&h), 2);
    ck_assert_int_eq(kolo__handles_poll(&h, 1, NULL), KOLO_IN_PROGRESS);
    ck_assert_int_eq(kolo__handles_poll(&h, 2, NULL), KOLO_IN_PROGRESS);
    /* The next id is 3 all the same. */
    ck_assert_int_eq(new_handle(&h), 3);
    kolo__handles_destroy(&h);
}
END_TEST

START_TEST(complete_twice_keeps_first)
{
    kolo__handles_t h;
    kolo_handle_t a = table_with_one(&h), b = new_handle(&h);

    kolo__handles_complete(&h, a, KOLO_ERR_MISMATCH, "first");
    kolo__handles_complete(&h, a, KOLO_OK, NULL);
    kolo__handles_complete(&h, a, KOLO_ERR_SHUTDOWN, "second");
    kolo__handles_complete(&h, b, KOLO_OK, NULL);
    kolo__handles_complete(&h, b, KOLO_ERR_SHUTDOWN, "too late");
    expect_completed(&h, a, KOLO_ERR_MISMATCH, "first", 0);
    expect_completed(&h, b, KOLO_OK, NULL, 0);
    expect_completed(&h, a, KOLO_ERR_MISMATCH, "first", 1);
    expect_completed(&h, b, KOLO_OK, NULL, 1);
    kolo__handles_destroy(&h);
}
END_TEST

START_TEST(handles_are_independent)
{
    kolo__handles_t h;
    kolo_handle_t id[10];

    ck_assert_int_eq(kolo__handles_init(&h), 0);
    for (int i = 0; i < 10; i++)
        id[i] = new_handle(&h);
    for (int i = 0; i < 10; i += 2)
        kolo__handles_complete(&h, id[i], i % 4 ? KOLO_ERR_TIMEOUT : KOLO_OK,
                               "timed out");
    for (int i = 0; i < 10; i++) {
        int want = i % 2 ? KOLO_IN_PROGRESS
                         : (i % 4 ? KOLO_ERR_TIMEOUT : KOLO_OK);
        ck_assert_int_eq(kolo__handles_poll(&h, id[i], NULL), want);
    }
    kolo__handles_destroy(&h);
}
END_TEST

typedef struct waiter {
    kolo__handles_t *h;
    kolo_handle_t id;
    atomic_int status; /* read by the main thread while the waiter runs */
    kolo__err_t err;
    int64_t returned_us;
} waiter_t;

static void *wait_thread(void *arg)
{
    waiter_t *w = arg;
    kolo__err_clear(&w->err);
    atomic_store(&w->status, kolo__handles_wait(w->h, w->id, &w->err));
    w->returned_us = kolo__now_us();
    return NULL;
}

START_TEST(wait_in_other_thread_woken_by_complete)
{
    enum { W = 3 };
    kolo__handles_t h;
    waiter_t w[W];
    pthread_t th[W];
    int64_t completed_us;

    ck_assert_int_eq(kolo__handles_init(&h), 0);
    for (int i = 0; i < W; i++) {
        w[i].h = &h;
        w[i].id = new_handle(&h);
        atomic_init(&w[i].status, 12345);
        w[i].returned_us = 0;
        ck_assert_int_eq(pthread_create(&th[i], NULL, wait_thread, &w[i]), 0);
    }
    sleep_ms(150);
    /* Still blocked: nothing completed yet. */
    for (int i = 0; i < W; i++)
        ck_assert_int_eq(atomic_load(&w[i].status), 12345);
    /* Complete the last one first: each waiter wakes for its own handle
     * (the condition variable is shared, so the others go back to sleep). */
    completed_us = kolo__now_us();
    kolo__handles_complete(&h, w[2].id, KOLO_ERR_RANK_LOST, "rank 3 was lost");
    ck_assert_int_eq(pthread_join(th[2], NULL), 0);
    ck_assert_int_eq(w[2].status, KOLO_ERR_RANK_LOST);
    ck_assert_str_eq(w[2].err.msg, "rank 3 was lost");
    ck_assert_msg(w[2].returned_us - completed_us < 5000000,
                  "waiter returned %lld us after the completion",
                  (long long)(w[2].returned_us - completed_us));
    sleep_ms(50);
    ck_assert_int_eq(atomic_load(&w[0].status), 12345);
    ck_assert_int_eq(atomic_load(&w[1].status), 12345);

    kolo__handles_complete(&h, w[0].id, KOLO_OK, NULL);
    kolo__handles_complete(&h, w[1].id, KOLO_ERR_SHUTDOWN, "rank 0 shut down");
    ck_assert_int_eq(pthread_join(th[0], NULL), 0);
    ck_assert_int_eq(pthread_join(th[1], NULL), 0);
    ck_assert_int_eq(w[0].status, KOLO_OK);
    ck_assert_int_eq(w[0].err.code, KOLO_OK);
    ck_assert_int_eq(w[1].status, KOLO_ERR_SHUTDOWN);
    ck_assert_str_eq(w[1].err.msg, "rank 0 shut down");
    ck_assert_uint_eq(kolo__handles_count(&h), 0);
    kolo__handles_destroy(&h);
}
END_TEST

/* kolo.h: every function is thread-safe, and a released handle gives
 * KOLO_ERR_INVALID_HANDLE. So when two threads wait on the same handle, one
 * gets its status and releases it, and the other is told it was already
 * released. (The second waiter must not touch the record the first one
 * freed.) */
START_TEST(two_waiters_on_one_handle)
{
    kolo__handles_t h;
    waiter_t w[2];
    pthread_t th[2];
    kolo_handle_t id;
    int ok = 0, released = 0;

    ck_assert_int_eq(kolo__handles_init(&h), 0);
    id = new_handle(&h);
    for (int i = 0; i < 2; i++) {
        w[i].h = &h;
        w[i].id = id;
        atomic_init(&w[i].status, 12345);
        ck_assert_int_eq(pthread_create(&th[i], NULL, wait_thread, &w[i]), 0);
    }
    sleep_ms(150); /* both are blocked in the wait */
    kolo__handles_complete(&h, id, KOLO_ERR_MISMATCH, "counts differ");
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
        if (w[i].status == KOLO_ERR_MISMATCH &&
            strcmp(w[i].err.msg, "counts differ") == 0)
            ok++;
        else if (w[i].status == KOLO_ERR_INVALID_HANDLE &&
                 strstr(w[i].err.msg, "already released") != NULL)
            released++;
        else
            ck_abort_msg("waiter %d got %d (%s)", i, (int)w[i].status,
                         w[i].err.msg);
    }
    ck_assert_int_eq(ok, 1);
    ck_assert_int_eq(released, 1);
    ck_assert_uint_eq(kolo__handles_count(&h), 0);
    kolo__handles_destroy(&h);
}
END_TEST

/* Many threads create handles concurrently: ids are unique and dense. */
typedef struct creator {
    kolo__handles_t *h;
    kolo_handle_t ids[500];
    int failures;
} creator_t;

static void *create_thread(void *arg)
{
    creator_t *c = arg;
    for (int i = 0; i < 500; i++)
        if (kolo__handles_new(c->h, &c->ids[i], NULL) != KOLO_OK)
            c->failures++;
    return NULL;
}

START_TEST(concurrent_new_gives_unique_ids)
{
    enum { T = 4 };
    kolo__handles_t h;
    static creator_t c[T];
    pthread_t th[T];
    static unsigned char seen[T * 500 + 1];

    memset(seen, 0, sizeof seen);
    ck_assert_int_eq(kolo__handles_init(&h), 0);
    for (int t = 0; t < T; t++) {
        c[t].h = &h;
        c[t].failures = 0;
        ck_assert_int_eq(pthread_create(&th[t], NULL, create_thread, &c[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        ck_assert_int_eq(pthread_join(th[t], NULL), 0);
        ck_assert_int_eq(c[t].failures, 0);
        for (int i = 0; i < 500; i++) {
            kolo_handle_t id = c[t].ids[i];
            ck_assert_int_ge(id, 1);
            ck_assert_int_le(id, T * 500);
            ck_assert_int_eq(seen[id], 0);
            seen[id] = 1;
            if (i > 0)
                ck_assert_int_gt(id, c[t].ids[i - 1]); /* grows per thread */
        }
    }
    ck_assert_uint_eq(kolo__handles_count(&h), T * 500);
    kolo__handles_destroy(&h);
}
END_TEST

KOLO_UNIT_MAIN("handles", 30,
        ids_start_at_one_and_grow, poll_in_progress,
        complete_ok_then_poll_and_wait,
        complete_error_message_reaches_poll_error_and_wait,
        complete_error_without_message_uses_strerror,
        second_wait_says_already_released, never_issued_ids,
        complete_twice_keeps_first, handles_are_independent,
        wait_in_other_thread_woken_by_complete, two_waiters_on_one_handle,
        concurrent_new_gives_unique_ids)
