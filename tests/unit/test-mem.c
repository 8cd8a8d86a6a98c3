/*
 * test-mem.c — unit tests of ops/mem: the in-memory backend whose ranks are
 * threads of one process.
 *
 * Why these tests: test-protocol runs the whole engine over this backend,
 * so the backend must first be right on its own. Every collective slot
 * runs at 2, 3 and 4 ranks against the reference each thread computes
 * itself (integers: exact); wake tokens must arrive through on_wake from a
 * thread that is not the caller's; a rank that does not come is named in
 * a KOLO_ERR_TIMEOUT, and one that was stopped (kolo__mem_kill) or whose
 * context was finalized in a KOLO_ERR_RANK_LOST, without anyone hanging;
 * two ranks that call different collectives at the same step are refused.
 *
 * Each rank is a thread; it records the first thing it found wrong, and
 * the test's own thread asserts on that after joining them (Check's
 * assertions belong to the test's thread).
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "mem/mem_ops.h"
#include "unit.h"

#define MAXR 4

typedef struct rank_ctx rank_ctx_t;
typedef void (*body_fn)(rank_ctx_t *rc);

typedef struct job {
    char rdv[64];
    int size;
    double timeout_s, start_timeout_s;
    body_fn body;
    pthread_barrier_t bar;
    rank_ctx_t *ranks;
    int skip_init[MAXR]; /* this rank never arrives */
    int init_fails;      /* the body checks init's failure, not its success */
} job_t;

struct rank_ctx {
    job_t *job;
    int rank;
    void *ctx;
    int init_rc;
    char init_err[256];
    char fail[512]; /* the first thing found wrong; "" if none */
    int32_t sum;    /* the result of the rank's last count_ranks */
    char err[256];  /* and its message */
    pthread_t self;
    /* wake tokens received */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t last_round;
    int tokens, lost;
    int foreign_thread; /* every token came from another thread */
};

#define EXPECT(r, cond, ...)                                                  \
    do {                                                                      \
        if (!(cond) && (r)->fail[0] == '\0')                                  \
            snprintf((r)->fail, sizeof((r)->fail), __VA_ARGS__);              \
    } while (0)

static atomic_int g_job_counter;

static void on_wake(void *arg, uint64_t round)
{
    rank_ctx_t *r = arg;
    pthread_mutex_lock(&r->mu);
    if (pthread_equal(pthread_self(), r->self))
        r->foreign_thread = 0;
    if (round == UINT64_MAX)
        r->lost++;
    else {
        r->tokens++;
        r->last_round = round;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Waits (at most 5 s) until `*field` reaches n. */
static int wait_count(rank_ctx_t *r, int *field, int n)
{
    struct timespec until;
    int ok;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&r->mu);
    while (*field < n && pthread_cond_timedwait(&r->cv, &r->mu, &until) == 0)
        ;
    ok = *field >= n;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static void *rank_main(void *arg)
{
    rank_ctx_t *r = arg;
    job_t *j = r->job;
    int members[MAXR];
    kolo__ops_config_t cfg;

    r->self = pthread_self();
    for (int i = 0; i < j->size; i++)
        members[i] = i;
    memset(&cfg, 0, sizeof(cfg));
    cfg.rank = r->rank;
    cfg.size = j->size;
    cfg.members = members;
    cfg.global_rank = r->rank;
    cfg.rendezvous = j->rdv;
    cfg.prefix = "kolo0/set0/ctl";
    cfg.timeout_s = j->timeout_s;
    cfg.start_timeout_s = j->start_timeout_s;
    cfg.on_wake = on_wake;
    cfg.wake_arg = r;
    cfg.shm_spin_us = -1;
    if (!j->skip_init[r->rank]) {
        r->init_rc = kolo__ops_mem.init(&cfg, &r->ctx, r->init_err,
                                        sizeof(r->init_err));
        if (r->init_rc == KOLO_OK)
            EXPECT(r, r->ctx != NULL, "rank %d: init gave no context", r->rank);
        if (!j->init_fails)
            EXPECT(r, r->init_rc == KOLO_OK, "init: %s", r->init_err);
    }
    j->body(r);
    if (r->ctx != NULL)
        kolo__ops_mem.finalize(r->ctx);
    return NULL;
}

static void free_job(job_t *j)
{
    for (int i = 0; i < j->size; i++) {
        pthread_mutex_destroy(&j->ranks[i].mu);
        pthread_cond_destroy(&j->ranks[i].cv);
    }
    free(j->ranks);
}

/* Runs `body` on `size` rank threads of a fresh job set up as `j` says
 * (its timeouts, 10 s where 0; ranks that never arrive); asserts that no
 * rank found anything wrong. */
static void run_job(job_t j, int size, body_fn body)
{
    pthread_t th[MAXR];

    snprintf(j.rdv, sizeof(j.rdv), "mem:test-%d-%d", (int)getpid(),
             atomic_fetch_add(&g_job_counter, 1));
    j.size = size;
    j.body = body;
    if (j.timeout_s == 0)
        j.timeout_s = 10;
    if (j.start_timeout_s == 0)
        j.start_timeout_s = 10;
    j.ranks = calloc((size_t)size, sizeof(*j.ranks));
    ck_assert_ptr_nonnull(j.ranks);
    ck_assert_int_eq(pthread_barrier_init(&j.bar, NULL, (unsigned)size), 0);
    for (int i = 0; i < size; i++) {
        rank_ctx_t *r = &j.ranks[i];
        r->job = &j;
        r->rank = i;
        r->foreign_thread = 1;
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->cv, NULL);
        ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, r), 0);
    }
    for (int i = 0; i < size; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < size; i++)
        ck_assert_msg(j.ranks[i].fail[0] == '\0', "rank %d of %d: %s", i,
                      size, j.ranks[i].fail);
    pthread_barrier_destroy(&j.bar);
    free_job(&j);
}

KOLO_UNIT_REDUCE_FN(sum_i32, int32_t, x + y)
KOLO_UNIT_REDUCE_FN(max_i32, int32_t, x > y ? x : y)

/* A SUM allreduce of a 1 from every rank: r->sum counts the ranks that
 * took part; the status, and its message in r->err. */
static int count_ranks(rank_ctx_t *r)
{
    r->sum = 1;
    return kolo__ops_mem.allreduce(r->ctx, NULL, &r->sum, 1, 4, sum_i32,
                                   r->err, sizeof(r->err));
}

/* The value rank r contributes at element i. */
static int32_t val(int r, size_t i) { return (int32_t)(r * 1000 + (int)i * 7 - 3); }

/* ---- every slot against a reference --------------------------------------- */

static void body_collectives(rank_ctx_t *r)
{
    int n = r->job->size, me = r->rank, rc;
    char err[256];
    enum { C = 37 };
    int32_t in[C], out[C], ref[C];
    int32_t all[MAXR * C];

    if (r->ctx == NULL)
        return;

    /* allreduce, out of place, SUM */
    for (size_t i = 0; i < C; i++) {
        in[i] = val(me, i);
        ref[i] = 0;
        for (int k = 0; k < n; k++)
            ref[i] += val(k, i);
    }
    rc = kolo__ops_mem.allreduce(r->ctx, in, out, C, 4, sum_i32, err, sizeof(err));
    EXPECT(r, rc == KOLO_OK, "allreduce: %d %s", rc, err);
    for (size_t i = 0; i < C; i++)
        EXPECT(r, out[i] == ref[i], "allreduce[%zu] = %d, expected %d", i,
               out[i], ref[i]);
    EXPECT(r, in[5] == val(me, 5), "allreduce wrote its input");

    /* allreduce in place (in == NULL), MAX */
    for (size_t i = 0; i < C; i++) {
        out[i] = (int32_t)((me * 13 + (int)i * 5) % 17);
        ref[i] = 0;
        for (int k = 0; k < n; k++) {
            int32_t v = (int32_t)((k * 13 + (int)i * 5) % 17);
            ref[i] = k == 0 || v > ref[i] ? v : ref[i];
        }
    }
    rc = kolo__ops_mem.allreduce(r->ctx, NULL, out, C, 4, max_i32, err, sizeof(err));
    EXPECT(r, rc == KOLO_OK, "allreduce in place: %d %s", rc, err);
    for (size_t i = 0; i < C; i++)
        EXPECT(r, out[i] == ref[i], "allreduce max[%zu] = %d, expected %d", i,
               out[i], ref[i]);

    /* allgather */
    for (size_t i = 0; i < C; i++)
        in[i] = val(me, i);
    memset(all, 0, sizeof(all));
    rc = kolo__ops_mem.allgather(r->ctx, in, all, sizeof(in), err, sizeof(err));
    EXPECT(r, rc == KOLO_OK, "allgather: %d %s", rc, err);
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < C; i++)
            EXPECT(r, all[k * C + i] == val(k, i), "allgather[%d][%zu]", k, i);

    /* gather to the last rank */
    memset(all, 0, sizeof(all));
    rc = kolo__ops_mem.gather(r->ctx, in, all, sizeof(in), n - 1, err, sizeof(err));
    EXPECT(r, rc == KOLO_OK, "gather: %d %s", rc, err);
    for (int k = 0; k < n && me == n - 1; k++)
        for (size_t i = 0; i < C; i++)
            EXPECT(r, all[k * C + i] == val(k, i), "gather[%d][%zu]", k, i);
    if (me != n - 1)
        EXPECT(r, all[0] == 0, "gather wrote a non-root's output");

    /* broadcast from rank 1 */
    for (size_t i = 0; i < C; i++)
        out[i] = me == 1 ? val(1, i) : -1;
    rc = kolo__ops_mem.broadcast(r->ctx, out, sizeof(out), 1, err, sizeof(err));
    EXPECT(r, rc == KOLO_OK, "broadcast: %d %s", rc, err);
    for (size_t i = 0; i < C; i++)
        EXPECT(r, out[i] == val(1, i), "broadcast[%zu] = %d", i, out[i]);

    /* allgatherv: rank k gives k + 1 elements (rank 0 of 3 gives none) */
    {
        size_t bytes[MAXR], at = 0;
        for (int k = 0; k < n; k++)
            bytes[k] = (size_t)(n == 3 && k == 0 ? 0 : k + 1) * 4;
        memset(all, 0, sizeof(all));
        rc = kolo__ops_mem.allgatherv(r->ctx, in, all, bytes, err, sizeof(err));
        EXPECT(r, rc == KOLO_OK, "allgatherv: %d %s", rc, err);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < bytes[k] / 4; i++, at++)
                EXPECT(r, all[at] == val(k, i), "allgatherv rank %d [%zu]", k, i);
    }

    /* alltoallv: rank k sends (k + j) % 3 elements to rank j, element i of
     * the block for j being val(k, 100 * j + i) */
    {
        size_t sb[MAXR], rb[MAXR], at = 0;
        int32_t send[MAXR * 4], recv[MAXR * 4];
        for (int j = 0; j < n; j++) {
            sb[j] = (size_t)((me + j) % 3) * 4;
            rb[j] = (size_t)((j + me) % 3) * 4;
            for (size_t i = 0; i < sb[j] / 4; i++)
                send[at++] = val(me, 100 * (size_t)j + i);
        }
        rc = kolo__ops_mem.alltoallv(r->ctx, send, sb, recv, rb, err, sizeof(err));
        EXPECT(r, rc == KOLO_OK, "alltoallv: %d %s", rc, err);
        at = 0;
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < rb[k] / 4; i++, at++)
                EXPECT(r, recv[at] == val(k, 100 * (size_t)me + i),
                       "alltoallv from rank %d [%zu] = %d", k, i, recv[at]);
    }

    /* reduce_scatter: blocks of 3, 0, 5, 2 elements (the first n) */
    {
        static const size_t blocks[MAXR] = {3, 0, 5, 2};
        size_t counts[MAXR], total = 0, from = 0;
        int32_t work[16], got[8];
        for (int k = 0; k < n; k++) {
            counts[k] = blocks[k];
            if (k < me)
                from += blocks[k];
            total += blocks[k];
        }
        for (size_t i = 0; i < total; i++)
            work[i] = val(me, i);
        rc = kolo__ops_mem.reduce_scatter(r->ctx, work, got, counts, 4, sum_i32,
                                          err, sizeof(err));
        EXPECT(r, rc == KOLO_OK, "reduce_scatter: %d %s", rc, err);
        for (size_t i = 0; i < counts[me]; i++) {
            int32_t want = 0;
            for (int k = 0; k < n; k++)
                want += val(k, from + i);
            EXPECT(r, got[i] == want, "reduce_scatter[%zu] = %d, expected %d",
                   i, got[i], want);
        }
    }

    /* Many small steps back to back: the two slots per member take turns. */
    for (int step = 0; step < 200; step++) {
        int32_t x = me + step, want = 0;
        for (int k = 0; k < n; k++)
            want += k + step;
        rc = kolo__ops_mem.allreduce(r->ctx, NULL, &x, 1, 4, sum_i32, err,
                                     sizeof(err));
        EXPECT(r, rc == KOLO_OK && x == want, "step %d: %d %s, %d != %d", step,
               rc, err, x, want);
    }
}

START_TEST(collectives_match_references)
{
    for (int n = 2; n <= 4; n++)
        run_job((job_t){0}, n, body_collectives);
}
END_TEST

/* ---- wake tokens -------------------------------------------------------------- */

static void body_wake(rank_ctx_t *r)
{
    char err[256];
    int rc;

    if (r->rank == 0) {
        rc = kolo__ops_mem.wake_peers(r->ctx, 7, err, sizeof(err));
        EXPECT(r, rc == KOLO_OK, "wake_peers: %d %s", rc, err);
    } else {
        EXPECT(r, wait_count(r, &r->tokens, 1), "rank %d got no token",
               r->rank);
        pthread_mutex_lock(&r->mu);
        EXPECT(r, r->last_round == 7, "token for round %llu, not 7",
               (unsigned long long)r->last_round);
        EXPECT(r, r->foreign_thread, "on_wake ran on the rank's own thread");
        pthread_mutex_unlock(&r->mu);
    }
    /* Before anyone finalizes (which does send lost-peer tokens). */
    pthread_barrier_wait(&r->job->bar);
    pthread_mutex_lock(&r->mu);
    EXPECT(r, r->rank != 0 || r->tokens == 0, "rank 0 woke itself");
    EXPECT(r, r->lost == 0, "a lost-peer token while everyone is there");
    pthread_mutex_unlock(&r->mu);
    pthread_barrier_wait(&r->job->bar);
}

START_TEST(wake_tokens_arrive_from_another_thread)
{
    run_job((job_t){0}, 3, body_wake);
}
END_TEST

/* ---- a rank that does not come -------------------------------------------------- */

static void body_timeout(rank_ctx_t *r)
{
    int64_t t0 = kolo__now_us();
    int rc;

    if (r->rank == 2) {
        /* Never joins the allreduce; leaves once the others gave up. */
        pthread_barrier_wait(&r->job->bar);
        return;
    }
    rc = count_ranks(r);
    EXPECT(r, rc == KOLO_ERR_TIMEOUT, "allreduce gave %d (%s), not a timeout",
           rc, r->err);
    EXPECT(r, strstr(r->err, "rank 2 did not join allreduce") != NULL,
           "the timeout does not name rank 2: %s", r->err);
    EXPECT(r, kolo__now_us() - t0 >= 250000, "timed out after %lld us",
           (long long)(kolo__now_us() - t0));
    pthread_barrier_wait(&r->job->bar);
}

START_TEST(timeout_names_the_missing_rank)
{
    run_job((job_t){.timeout_s = 0.3}, 3, body_timeout);
}
END_TEST

static void body_start_timeout(rank_ctx_t *r)
{
    if (r->rank == 0) {
        EXPECT(r, r->init_rc == KOLO_ERR_TIMEOUT, "init gave %d (%s)",
               r->init_rc, r->init_err);
        EXPECT(r, strstr(r->init_err, "member 1") != NULL,
               "init does not name member 1: %s", r->init_err);
        EXPECT(r, r->ctx == NULL, "a context after a failed init");
    }
}

START_TEST(init_times_out_without_every_rank)
{
    run_job((job_t){.start_timeout_s = 0.3, .skip_init[1] = 1, .init_fails = 1},
            2, body_start_timeout);
}
END_TEST

/* ---- a rank that stops ------------------------------------------------------------ */

static void body_killed(rank_ctx_t *r)
{
    int rc;

    rc = count_ranks(r);
    EXPECT(r, rc == KOLO_OK && r->sum == 3, "first allreduce: %d %s", rc,
           r->err);
    pthread_barrier_wait(&r->job->bar);
    if (r->rank == 0)
        EXPECT(r, kolo__mem_kill(r->job->rdv, "kolo0/", 1) == 1,
               "kolo__mem_kill marked no context");
    pthread_barrier_wait(&r->job->bar);
    rc = count_ranks(r);
    EXPECT(r, rc == KOLO_ERR_RANK_LOST, "allreduce after the kill: %d %s", rc,
           r->err);
    if (r->rank == 1) {
        EXPECT(r, strstr(r->err, "this rank (rank 1) has stopped") != NULL,
               "the stopped rank's own message: %s", r->err);
        rc = kolo__ops_mem.wake_peers(r->ctx, 3, r->err, sizeof(r->err));
        EXPECT(r, rc == KOLO_ERR_RANK_LOST, "its wake_peers: %d", rc);
    } else {
        EXPECT(r, strstr(r->err, "rank 1 has stopped") != NULL,
               "the lost rank is not named: %s", r->err);
        /* Sleeping peers learn it from a lost-connection token. */
        EXPECT(r, wait_count(r, &r->lost, 1), "no lost-peer token");
        rc = kolo__ops_mem.wake_peers(r->ctx, 3, r->err, sizeof(r->err));
        EXPECT(r, rc == KOLO_ERR_RANK_LOST && strstr(r->err, "rank 1") != NULL,
               "wake_peers to a stopped rank: %d %s", rc, r->err);
    }
    pthread_barrier_wait(&r->job->bar);
}

START_TEST(killed_rank_is_named_by_its_peers)
{
    run_job((job_t){0}, 3, body_killed);
}
END_TEST

static void body_finalized(rank_ctx_t *r)
{
    int rc;

    if (r->rank == 1) {
        kolo__ops_mem.finalize(r->ctx);
        r->ctx = NULL;
        return;
    }
    rc = count_ranks(r);
    EXPECT(r, rc == KOLO_ERR_RANK_LOST, "allreduce: %d %s", rc, r->err);
    EXPECT(r, strstr(r->err, "rank 1 has left") != NULL,
           "the finalized rank is not named: %s", r->err);
}

START_TEST(finalized_rank_is_lost)
{
    /* It fails by the loss, long before the timeout. */
    run_job((job_t){.timeout_s = 30}, 2, body_finalized);
}
END_TEST

/* ---- disagreement and the watchdog's question ----------------------------------- */

static void body_mismatch(rank_ctx_t *r)
{
    char err[256] = "";
    int32_t x[4] = {0};
    int rc;

    if (r->rank == 0)
        rc = kolo__ops_mem.allreduce(r->ctx, NULL, x, 4, 4, sum_i32, err, sizeof(err));
    else
        rc = kolo__ops_mem.broadcast(r->ctx, x, 16, 0, err, sizeof(err));
    EXPECT(r, rc == KOLO_ERR_BACKEND, "different collectives gave %d (%s)",
           rc, err);
    EXPECT(r, strstr(err, "allreduce") != NULL && strstr(err, "broadcast") != NULL,
           "the message does not name both: %s", err);
}

START_TEST(different_collectives_are_refused)
{
    run_job((job_t){0}, 2, body_mismatch);
}
END_TEST

static void body_waiting_for(rank_ctx_t *r)
{
    int rc;

    pthread_barrier_wait(&r->job->bar); /* rank 0's context is stored */
    if (r->rank == 1) {
        void *c0 = r->job->ranks[0].ctx;
        int who = -1;
        EXPECT(r, kolo__ops_mem.waiting_for(r->ctx) == -1,
               "waiting for someone outside a collective");
        /* Rank 0 enters the allreduce; ask until it waits in it. */
        for (int i = 0; i < 2500 && who != 1; i++) {
            usleep(2000);
            who = kolo__ops_mem.waiting_for(c0);
        }
        EXPECT(r, who == 1, "rank 0 waits for %d, not rank 1", who);
    }
    rc = count_ranks(r);
    EXPECT(r, rc == KOLO_OK && r->sum == 2, "allreduce: %d %s", rc, r->err);
}

START_TEST(waiting_for_names_the_late_rank)
{
    run_job((job_t){0}, 2, body_waiting_for);
}
END_TEST

KOLO_UNIT_MAIN("mem", 30,
        collectives_match_references, wake_tokens_arrive_from_another_thread,
        timeout_names_the_missing_rank, init_times_out_without_every_rank,
        killed_rank_is_named_by_its_peers, finalized_rank_is_lost,
        different_collectives_are_refused, waiting_for_names_the_late_rank)
