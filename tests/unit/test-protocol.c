/*
 * test-protocol.c — the engine's protocol with several ranks as threads of
 * one process: negotiation (negotiate.c), the background loop, fusion and
 * execution (execute.c), process sets, over the in-memory backend
 * (ops/mem).
 *
 * Why these tests: the multi-rank suites (tests/multi) run real processes
 * under kolorun, which says that the job works, not which part of the
 * protocol broke. Here each rank is a thread with its own kolo__runtime_t
 * and global process set, built the way kolo_init builds them, with
 * KOLO_CONTROLLER and KOLO_CPU_OPERATIONS set to "mem" in its
 * configuration; tensors are pushed onto the set's queue the way
 * enqueue.c does, and the handles are waited in the rank's own handle
 * table. The tests check what the essays of negotiate.c and background.c
 * promise: ranks agree on tensors enqueued in any order; fused results are
 * right element by element; a repeated step is settled by the response
 * cache alone (no request reaches the coordinator: the controller's gather
 * count does not move) and a changed shape invalidates the entry and still
 * gives the right answer; every disagreement the coordinator can find
 * fails the tensor on every rank with a message naming it, the ranks and
 * their values; a joined rank reduces zeros and holds back other
 * collectives; a process set of some ranks works beside the global one; a
 * rank that stops fails its peers' work with a message naming it, and
 * nothing hangs (each test has Check's time bound).
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mem/mem_ops.h"
#include "ranks.h"
#include "timeline.h"
#include "unit.h"

/* ---- agreement and fusion ------------------------------------------------- */

#define NT 8
static const int64_t counts[NT] = {1, 7, 1000, 33, 4096, 2, 513, 64};

static void body_agreement(prank_t *p)
{
    int n = p->job->size, me = p->rank;
    float *in[NT], *out[NT];
    kolo_handle_t h[NT];
    double d_in[5], d_out[5];
    int32_t bc[6];
    kolo__params_t pd = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT64, KOLO_OP_MAX, 5);
    kolo__params_t pb = params(KOLO__COLL_BROADCAST, KOLO_INT32, KOLO_OP_SUM, 6);
    kolo_handle_t hd = 0, hb = 0;
    char name[32];

    for (int t = 0; t < NT; t++) {
        in[t] = malloc((size_t)counts[t] * sizeof(float));
        out[t] = malloc((size_t)counts[t] * sizeof(float));
        for (int64_t i = 0; i < counts[t]; i++) {
            in[t][i] = rank_val(me, t, i);
            out[t][i] = -1;
        }
    }
    for (int i = 0; i < 5; i++)
        d_in[i] = rank_max_val(me, i);
    for (int i = 0; i < 6; i++)
        bc[i] = me == n - 1 ? 100 + i : -1;
    pb.root = n - 1;
    /* Every rank pushes in its own order: rotated by its rank, and every
     * other rank backwards; the float64 MAX and the broadcast in between. */
    for (int k = 0; k < NT; k++) {
        int t = (me % 2 ? NT - 1 - k : k);
        t = (t + me) % NT;
        snprintf(name, sizeof(name), "agree.%d", t);
        h[t] = allreduce(p, p->world, name, in[t], out[t], counts[t]);
        if (k == me % NT)
            hd = push(p, p->world, "agree.max64", &pd, d_in, d_out);
        if (k == (me + 3) % NT)
            hb = push(p, p->world, "agree.bcast", &pb, bc, bc);
    }
    for (int t = 0; t < NT; t++)
        expect_ok(p, h[t], "an allreduce");
    expect_ok(p, hd, "the float64 MAX allreduce");
    expect_ok(p, hb, "the broadcast");
    for (int t = 0; t < NT; t++) {
        snprintf(name, sizeof(name), "agree.%d", t);
        expect_sum(p, name, t, out[t], counts[t]);
    }
    expect_max(p, "agree.max64", d_out, 5);
    for (int i = 0; i < 6; i++)
        EXPECT(p, bc[i] == 100 + i, "agree.bcast[%d] = %d", i, bc[i]);
    for (int t = 0; t < NT; t++) {
        free(in[t]);
        free(out[t]);
    }
}

START_TEST(ranks_agree_whatever_the_order)
{
    for (int n = 2; n <= 4; n++)
        run_job(n, body_agreement);
}
END_TEST

/* ---- the response cache ---------------------------------------------------- */

/* Requests that reached the coordinator so far: one gather per full round. */
static uint64_t full_rounds(prank_t *p)
{
    return kolo__mem_calls(p->job->rdv, "kolo0/set0/ctl", p->rank, "gather");
}

/* One training step: NC tensors; tensor 1 has count1 elements. */
#define NC 4
static void step(prank_t *p, int s, int64_t count1)
{
    float in[NC][300], out[NC][300];
    kolo_handle_t h[NC];
    char name[32];

    for (int k = 0; k < NC; k++) {
        /* Not all ranks in the same order. */
        int t = p->rank % 2 ? NC - 1 - k : k;
        int64_t c = t == 1 ? count1 : 100 + t;
        for (int64_t i = 0; i < c; i++)
            in[t][i] = rank_val(p->rank, t + s, i);
        snprintf(name, sizeof(name), "cache.%d", t);
        h[t] = allreduce(p, p->world, name, in[t], out[t], c);
    }
    for (int t = 0; t < NC; t++)
        expect_ok(p, h[t], "a step's allreduce");
    for (int t = 0; t < NC; t++) {
        snprintf(name, sizeof(name), "step %d cache.%d", s, t);
        expect_sum(p, name, t + s, out[t], t == 1 ? count1 : 100 + t);
    }
    /* Every rank has done this step's rounds before counting. */
    pthread_barrier_wait(&p->job->bar);
}

static void body_cache(prank_t *p)
{
    uint64_t g0, g1, g2, g3, g4;

    g0 = full_rounds(p);
    step(p, 0, 200);
    g1 = full_rounds(p);
    EXPECT(p, g1 > g0, "the first step sent no request (%llu, %llu)",
           (unsigned long long)g0, (unsigned long long)g1);
    step(p, 1, 200);
    g2 = full_rounds(p);
    EXPECT(p, g2 == g1, "the repeated step was not settled by the cache: "
           "%llu full rounds", (unsigned long long)(g2 - g1));
    /* cache.1 changes shape on every rank: the cached entry is invalid. */
    step(p, 2, 250);
    g3 = full_rounds(p);
    EXPECT(p, g3 > g2, "a changed shape did not go through the coordinator");
    step(p, 3, 250);
    g4 = full_rounds(p);
    EXPECT(p, g4 == g3, "the new shape was not cached: %llu full rounds",
           (unsigned long long)(g4 - g3));
    {
        /* Only rank 2 changes the shape of cached cache.2: its request
         * invalidates the bit on which ranks 0 and 1 wait, they resend
         * through the coordinator, which reports the disagreement. */
        float in[110] = {0}, out[110];
        char msg[KOLO__ERR_LEN + 64];
        int64_t c = p->rank == 2 ? 101 : 102, t0 = kolo__now_us();
        int rc = wait_h(p, allreduce(p, p->world, "cache.2", in, out, c), msg,
                        sizeof(msg));
        /* At once, not after the stall inspector's half check time (the
         * other way a waiting tensor reaches the coordinator). */
        EXPECT(p, kolo__now_us() - t0 < 5000000 &&
                      p->rt.cfg.stall_check_s >= 20,
               "the changed cached tensor was reported after %.1f s "
               "(stall check time %g s)", (kolo__now_us() - t0) / 1e6,
               p->rt.cfg.stall_check_s);
        EXPECT(p, rc == KOLO_ERR_MISMATCH &&
                      strstr(msg, "allreduce of tensor 'cache.2': ranks "
                                  "disagree on the number of elements: rank 0 "
                                  "has 102, rank 2 has 101") != NULL,
               "a cached tensor changed on one rank: %d %s", rc, msg);
        pthread_barrier_wait(&p->job->bar);
    }
    step(p, 4, 250);
}

START_TEST(response_cache_hits_and_invalidates)
{
    run_job(3, body_cache);
}
END_TEST

/* ---- mismatches --------------------------------------------------------------- */

typedef struct mismatch {
    const char *name;
    kolo__params_t base, other;
    const char *want; /* in the message, after "tensor '<name>'" */
} mismatch_t;

#define NM 11

static void mismatches(mismatch_t *m)
{
    kolo__params_t ar = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, 6);
    kolo__params_t bc = params(KOLO__COLL_BROADCAST, KOLO_FLOAT32, KOLO_OP_SUM, 6);
    int i = 0;

    m[i] = (mismatch_t){"mm.coll", ar, bc, "ranks disagree on the collective: "
                        "rank 0 enqueued allreduce, rank 2 enqueued broadcast"};
    m[i].other.root = 0;
    i++;
    m[i] = (mismatch_t){"mm.dtype", ar, ar, "ranks disagree on the dtype: rank 0 "
                        "has float32, rank 2 has int32"};
    m[i++].other.dtype = KOLO_INT32;
    m[i] = (mismatch_t){"mm.shape", ar, ar, "ranks disagree on the shape: rank 0 "
                        "has [2, 3], rank 2 has [3, 2]"};
    m[i].base.ndim = m[i].other.ndim = 2;
    m[i].base.shape[0] = 2, m[i].base.shape[1] = 3;
    m[i].other.shape[0] = 3, m[i++].other.shape[1] = 2;
    m[i] = (mismatch_t){"mm.count", ar, ar, "ranks disagree on the number of "
                        "elements: rank 0 has 6, rank 2 has 5"};
    m[i++].other.count = 5;
    m[i] = (mismatch_t){"mm.op", ar, ar, "ranks disagree on the reduction: rank "
                        "0 asks for "};
    m[i++].other.op = KOLO_OP_MAX;
    m[i] = (mismatch_t){"mm.root", bc, bc, "ranks disagree on the root: rank 0 "
                        "names rank 0, rank 2 names rank 1"};
    m[i++].other.root = 1;
    m[i] = (mismatch_t){"mm.prescale", ar, ar, "ranks disagree on the prescale "
                        "factor: rank 0 has 1, rank 2 has 2"};
    m[i++].other.prescale = 2.0;
    m[i] = (mismatch_t){"mm.postscale", ar, ar, "ranks disagree on the postscale "
                        "factor: rank 0 has 1, rank 2 has 0.5"};
    m[i++].other.postscale = 0.5;
    m[i] = (mismatch_t){"mm.device", ar, ar, "ranks disagree on where it lives: "
                        "rank 0 has it in host memory, rank 2 in CUDA device "
                        "memory"};
    m[i++].other.device_type = KOLO_DEVICE_CUDA;
    m[i] = (mismatch_t){"mm.wire", ar, ar, "ranks disagree on the wire "
                        "compression: rank 0 sends float32, rank 2 sends "
                        "float16"};
    m[i++].other.wire = KOLO_FLOAT16;
    m[i] = (mismatch_t){"mm.group", ar, ar, "ranks disagree on its group: rank "
                        "0 has it in a group of 0 led by '', rank 2 in a group "
                        "of 2 led by 'mm.group'"};
    m[i].other.group = 2;
    snprintf(m[i++].other.group_key, sizeof(m[0].other.group_key), "mm.group");
    ck_assert_int_eq(i, NM);
}

static void body_mismatch(prank_t *p)
{
    mismatch_t m[NM];
    kolo_handle_t h[NM], ok;
    float buf[NM][8], in[4] = {1, 2, 3, 4}, out[4];
    char msg[KOLO__ERR_LEN + 64], want[512];

    mismatches(m);
    for (int i = 0; i < NM; i++) {
        for (int k = 0; k < 8; k++)
            buf[i][k] = (float)k;
        /* Rank 2 is the odd one out. */
        h[i] = push(p, p->world, m[i].name, p->rank == 2 ? &m[i].other
                                                         : &m[i].base,
                    buf[i], buf[i]);
    }
    for (int i = 0; i < NM; i++) {
        int rc = wait_h(p, h[i], msg, sizeof(msg));
        EXPECT(p, rc == KOLO_ERR_MISMATCH, "%s gave %d (%s), not a mismatch",
               m[i].name, rc, msg);
        snprintf(want, sizeof(want), "tensor '%s': %s", m[i].name, m[i].want);
        EXPECT(p, strstr(msg, want) != NULL, "%s: the message\n  %s\ndoes not "
               "say\n  %s", m[i].name, msg, want);
    }
    {
        /* The reduction: both names, whatever kolo_op_name calls them. */
        int rc;
        snprintf(want, sizeof(want), "asks for %s, rank 2 for %s",
                 kolo_op_name(KOLO_OP_SUM), kolo_op_name(KOLO_OP_MAX));
        h[0] = push(p, p->world, "mm.op2", p->rank == 2 ? &m[4].other : &m[4].base,
                    buf[0], buf[0]);
        rc = wait_h(p, h[0], msg, sizeof(msg));
        EXPECT(p, rc == KOLO_ERR_MISMATCH && strstr(msg, want) != NULL,
               "mm.op2: %d %s", rc, msg);
    }
    /* The job goes on. */
    ok = allreduce(p, p->world, "mm.after", in, out, 4);
    expect_ok(p, ok, "the allreduce after the mismatches");
    for (int i = 0; i < 4; i++)
        EXPECT(p, out[i] == 3 * in[i], "mm.after[%d] = %g", i, out[i]);
}

START_TEST(every_mismatch_is_reported_on_every_rank)
{
    run_job(3, body_mismatch);
}
END_TEST

/* ---- join ---------------------------------------------------------------------- */

static kolo_handle_t push_join(prank_t *p)
{
    kolo__params_t pj = params(KOLO__COLL_JOIN, KOLO_UINT8, 0, 0);
    return push(p, p->world, "kolo.join", &pj, NULL, NULL);
}

static int wait_join(prank_t *p, kolo_handle_t h, int *last)
{
    kolo__err_t err;
    void *out = NULL;
    int rc;

    kolo__err_clear(&err);
    rc = kolo__handles_wait_output(p->rt.handles, h, &err, &out);
    EXPECT(p, rc == KOLO_OK, "rank %d: join failed: %s", p->rank, err.msg);
    if (out != NULL) {
        kolo__result_t *r = out;
        *last = r->nsplits > 0 ? (int)r->splits[0] : -1;
        kolo__result_free(r);
    }
    return rc;
}

static int g_last[MAXR];

static void body_join(prank_t *p)
{
    int me = p->rank;
    float in[50], out[50];
    char msg[KOLO__ERR_LEN + 64];
    kolo_handle_t hj = 0, h;
    int last = -2;

    if (me == 2)
        hj = push_join(p); /* joins at once: it has no data */
    for (int s = 0; s < 3 && me != 2; s++) {
        /* The first step goes through the coordinator, the later ones
         * through the cache: rank 2's stand-in is zeros either way. */
        for (int i = 0; i < 50; i++)
            in[i] = rank_val(me, s, i);
        h = allreduce(p, p->world, "join.t", in, out, 50);
        expect_ok(p, h, "an allreduce during the join");
        for (int i = 0; i < 50; i++)
            EXPECT(p, out[i] == rank_val(0, s, i) + rank_val(1, s, i),
                   "step %d join.t[%d] = %g, expected %g (rank 2 adds zeros)",
                   s, i, out[i], rank_val(0, s, i) + rank_val(1, s, i));
    }
    if (me != 2) {
        /* Only allreduces go on while a rank has joined. */
        kolo__params_t pb = params(KOLO__COLL_BROADCAST, KOLO_FLOAT32,
                                   KOLO_OP_SUM, 50);
        int rc;
        h = push(p, p->world, "join.bcast", &pb, out, out);
        rc = wait_h(p, h, msg, sizeof(msg));
        EXPECT(p, rc == KOLO_ERR_UNSUPPORTED, "broadcast during a join: %d %s",
               rc, msg);
        EXPECT(p, strstr(msg, "broadcast of tensor 'join.bcast' cannot run "
                              "while rank 2 has joined") != NULL,
               "broadcast during a join: %s", msg);
        if (me == 1)
            usleep(20000); /* rank 0 tends to join first */
        hj = push_join(p);
    }
    wait_join(p, hj, &last);
    g_last[me] = last;
    EXPECT(p, last == 0 || last == 1, "the last rank to join is %d", last);
    pthread_barrier_wait(&p->job->bar);
    for (int r = 0; r < p->job->size; r++)
        EXPECT(p, g_last[r] == last, "rank %d says %d joined last, rank %d "
               "says %d", r, g_last[r], me, last);
    /* After the join, everyone reduces again. */
    for (int i = 0; i < 50; i++)
        in[i] = rank_val(me, 9, i);
    h = allreduce(p, p->world, "join.t", in, out, 50);
    expect_ok(p, h, "the allreduce after the join");
    for (int i = 0; i < 50; i++)
        EXPECT(p,
               out[i] == rank_val(0, 9, i) + rank_val(1, 9, i) +
                             rank_val(2, 9, i),
               "after the join join.t[%d] = %g", i, out[i]);
}

START_TEST(joined_rank_reduces_zeros)
{
    run_job(3, body_join);
}
END_TEST

/* ---- a process set of some ranks ----------------------------------------------- */

static void body_pset(prank_t *p)
{
    static const int members[2] = {1, 3};
    int me = p->rank, in_set = me == 1 || me == 3;
    float a[20], b[20], ga[20], gb[20];
    kolo__pset_t *ps = NULL;
    kolo_handle_t h1 = 0, h2;

    if (in_set) {
        ps = set_start(p, 1, members, 2);
        EXPECT(p, ps == NULL || ps->rank == (me == 1 ? 0 : 1),
               "rank %d is member %d of the set", me, ps ? ps->rank : -1);
    } else {
        pthread_mutex_lock(&p->rt.sets_mu);
        p->rt.set_sizes[1] = 2;
        p->rt.nsets = 2;
        pthread_mutex_unlock(&p->rt.sets_mu);
    }
    for (int i = 0; i < 20; i++) {
        a[i] = rank_val(me, 1, i);
        ga[i] = rank_val(me, 2, i);
    }
    /* The same name in both sets: each set has its own negotiation. */
    if (ps != NULL)
        h1 = allreduce(p, ps, "pset.t", a, b, 20);
    h2 = allreduce(p, p->world, "pset.t", ga, gb, 20);
    if (ps != NULL) {
        expect_ok(p, h1, "the set's allreduce");
        for (int i = 0; i < 20; i++)
            EXPECT(p, b[i] == rank_val(1, 1, i) + rank_val(3, 1, i),
                   "set 1: pset.t[%d] = %g", i, b[i]);
    }
    expect_ok(p, h2, "the global allreduce");
    for (int i = 0; i < 20; i++) {
        float want = 0;
        for (int r = 0; r < 4; r++)
            want += rank_val(r, 2, i);
        EXPECT(p, gb[i] == want, "global: pset.t[%d] = %g", i, gb[i]);
    }
}

START_TEST(process_set_beside_the_global_set)
{
    run_job(4, body_pset);
}
END_TEST

/* ---- a rank that stops ---------------------------------------------------------- */

static void body_stop(prank_t *p)
{
    int me = p->rank;
    float in[10], out[10];
    char msg[KOLO__ERR_LEN + 64];
    kolo_handle_t h;
    int rc;

    for (int i = 0; i < 10; i++)
        in[i] = rank_val(me, 0, i);
    h = allreduce(p, p->world, "stop.t", in, out, 10);
    expect_ok(p, h, "the allreduce before the stop");
    pthread_barrier_wait(&p->job->bar);
    if (me == 0)
        EXPECT(p, kolo__mem_kill(p->job->rdv, "kolo0/", 2) >= 1,
               "kolo__mem_kill found no context of rank 2");
    pthread_barrier_wait(&p->job->bar);
    if (me == 2)
        return; /* stopped: its thread only cleans up */
    /* The set may have stopped already (an idle round met rank 2's stop):
     * then the enqueue itself is refused, for the same reason. */
    kolo__params_t pr = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, 10);
    kolo__err_t err;
    h = push_try(p->world, "stop.t", &pr, in, out, &err);
    if (h != 0) {
        rc = wait_h(p, h, msg, sizeof(msg));
    } else {
        rc = err.code;
        snprintf(msg, sizeof(msg), "%s", err.msg);
    }
    EXPECT(p, rc == KOLO_ERR_RANK_LOST, "rank %d: the allreduce after rank 2 "
           "stopped gave %d: %s", me, rc, msg);
    EXPECT(p, strstr(msg, "rank 2 has stopped") != NULL &&
                  strstr(msg, "'stop.t'") != NULL,
           "rank %d: the message does not name rank 2 and the tensor: %s", me,
           msg);
}

START_TEST(stopped_rank_fails_its_peers_work)
{
    run_job(3, body_stop);
}
END_TEST

KOLO_UNIT_MAIN("protocol", 60,
        ranks_agree_whatever_the_order, response_cache_hits_and_invalidates,
        every_mismatch_is_reported_on_every_rank, joined_rank_reduces_zeros,
        process_set_beside_the_global_set, stopped_rank_fails_its_peers_work)
