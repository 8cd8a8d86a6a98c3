/*
 * ranks.c — the unit tests' ranks as threads (ranks.h).
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flight.h"
#include "ranks.h"
#include "timeline.h"

static atomic_int g_job_counter;

static const char *no_env(const char *name)
{
    (void)name;
    return NULL;
}

int64_t ranks_cache_capacity = -1;
int64_t ranks_flight_recorder = 0;
const char *ranks_flight_dir = "";

/* A runtime for one rank, as kolo_init sets one up, over ops/mem. */
static int runtime_init(prank_t *p, kolo__err_t *err)
{
    kolo__runtime_t *rt = &p->rt;
    int n = p->job->size;

    memset(rt, 0, sizeof(*rt));
    pthread_mutex_init(&rt->sets_mu, NULL);
    KOLO__CHECK(kolo__config_load(&rt->cfg, no_env, err));
    rt->cfg.rank = p->rank;
    rt->cfg.size = n;
    rt->cfg.local_rank = p->rank;
    rt->cfg.local_size = n;
    rt->cfg.cross_rank = 0;
    rt->cfg.cross_size = 1;
    snprintf(rt->cfg.rendezvous, sizeof(rt->cfg.rendezvous), "%s", p->job->rdv);
    snprintf(rt->cfg.controller, sizeof(rt->cfg.controller), "mem");
    snprintf(rt->cfg.cpu_operations, sizeof(rt->cfg.cpu_operations), "mem");
    rt->cfg.timeout_s = p->job->timeout_s > 0 ? p->job->timeout_s : 20;
    if (p->job->stall_check_s > 0)
        rt->cfg.stall_check_s = p->job->stall_check_s;
    if (ranks_cache_capacity >= 0)
        rt->cfg.cache_capacity = ranks_cache_capacity;
    rt->cfg.flight_recorder = ranks_flight_recorder;
    snprintf(rt->cfg.flight_dir, sizeof(rt->cfg.flight_dir), "%s",
             ranks_flight_dir);
    rt->rank = p->rank;
    rt->size = n;
    if (kolo__handles_init(&p->handles) != 0)
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "handles");
    rt->handles = &p->handles;
    rt->generation = 0;
    rt->timeline = kolo__timeline_new(p->rank, n, 0);
    rt->sets = calloc(4, sizeof(*rt->sets));
    rt->set_sizes = calloc(4, sizeof(*rt->set_sizes));
    if (rt->timeline == NULL || rt->sets == NULL || rt->set_sizes == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "runtime");
    return kolo__flight_open(rt, err);
}

/* Starts set `id` of `size` global ranks on this rank (a member) and
 * enters it in the set table. */
kolo__pset_t *set_start(prank_t *p, int id, const int *ranks, int size)
{
    kolo__pset_t *ps = NULL;
    kolo__err_t err;
    int rc;

    kolo__err_clear(&err);
    rc = kolo__pset_start(&p->rt, id, ranks, size, NULL, &ps, &err);
    EXPECT(p, rc == KOLO_OK, "rank %d: process set %d did not start: %s",
           p->rank, id, err.msg);
    if (rc != KOLO_OK)
        return NULL;
    pthread_mutex_lock(&p->rt.sets_mu);
    p->rt.sets[id] = ps;
    p->rt.set_sizes[id] = size;
    if (p->rt.nsets <= id)
        p->rt.nsets = id + 1;
    pthread_mutex_unlock(&p->rt.sets_mu);
    return ps;
}

/* Set id, taken out of the set table (the flight recorder reads it). */
static kolo__pset_t *set_take(kolo__runtime_t *rt, int id)
{
    kolo__pset_t *ps = NULL;

    pthread_mutex_lock(&rt->sets_mu);
    if (rt->sets != NULL && id < rt->nsets) {
        ps = rt->sets[id];
        rt->sets[id] = NULL;
    }
    pthread_mutex_unlock(&rt->sets_mu);
    return ps;
}

/* As kolo_shutdown: the global set first, then the others, then the
 * flight recorder. */
static void runtime_stop(prank_t *p)
{
    kolo__runtime_t *rt = &p->rt;
    kolo__pset_t *ps;
    kolo__err_t why;

    if ((ps = set_take(rt, KOLO_GLOBAL_PROCESS_SET)) != NULL)
        kolo__pset_stop(ps, NULL);
    kolo__err_set(&why, KOLO_ERR_SHUTDOWN,
                  "kolo was shut down on this rank (rank %d)", rt->rank);
    for (int i = 1; i < rt->nsets; i++)
        if ((ps = set_take(rt, i)) != NULL)
            kolo__pset_stop(ps, &why);
    kolo__flight_close(rt);
    kolo__timeline_free(rt->timeline);
    free(rt->sets);
    free(rt->set_sizes);
    free(rt->host_of);
    pthread_mutex_destroy(&rt->sets_mu);
    if (rt->handles != NULL)
        kolo__handles_destroy(&p->handles);
}

static void *rank_main(void *arg)
{
    prank_t *p = arg;
    int all[MAXR];
    kolo__err_t err;

    kolo__err_clear(&err);
    kolo__fault_thread_rank(p->rank); /* a test's faults may be this rank's */
    for (int i = 0; i < p->job->size; i++)
        all[i] = i;
    if (runtime_init(p, &err) != KOLO_OK)
        EXPECT(p, 0, "rank %d: runtime: %s", p->rank, err.msg);
    else
        p->world = set_start(p, KOLO_GLOBAL_PROCESS_SET, all, p->job->size);
    if (p->world != NULL)
        p->job->body(p);
    runtime_stop(p);
    return NULL;
}

void run_job(int size, body_fn body)
{
    run_job_timeout(size, body, 0);
}

void run_job_timeout(int size, body_fn body, double timeout_s)
{
    run_job_stall(size, body, timeout_s, 0);
}

void run_job_stall(int size, body_fn body, double timeout_s,
                   double stall_check_s)
{
    job_t j;
    pthread_t th[MAXR];

    memset(&j, 0, sizeof(j));
    snprintf(j.rdv, sizeof(j.rdv), "mem:protocol-%d-%d", (int)getpid(),
             atomic_fetch_add(&g_job_counter, 1));
    j.size = size;
    j.body = body;
    j.timeout_s = timeout_s;
    j.stall_check_s = stall_check_s;
    j.ranks = calloc((size_t)size, sizeof(*j.ranks));
    ck_assert_ptr_nonnull(j.ranks);
    ck_assert_int_eq(pthread_barrier_init(&j.bar, NULL, (unsigned)size), 0);
    for (int i = 0; i < size; i++) {
        j.ranks[i].job = &j;
        j.ranks[i].rank = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &j.ranks[i]), 0);
    }
    for (int i = 0; i < size; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < size; i++)
        ck_assert_msg(j.ranks[i].fail[0] == '\0', "rank %d of %d: %s", i, size,
                      j.ranks[i].fail);
    pthread_barrier_destroy(&j.bar);
    free(j.ranks);
}

/* Pushes one tensor onto a set's queue as enqueue.c does; 0 on failure,
 * with the message in err. */
kolo_handle_t push_try(kolo__pset_t *ps, const char *name,
                       const kolo__params_t *params, const void *in, void *out,
                       kolo__err_t *err)
{
    kolo__entry_t *e = kolo__entry_new(name);
    kolo_handle_t h = 0;

    kolo__err_clear(err);
    if (e == NULL) {
        kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory queueing '%s'", name);
        return 0;
    }
    e->params = *params;
    e->input = in;
    e->output = out;
    e->enqueued_us = kolo__now_us();
    if (kolo__handles_new(ps->rt->handles, &e->handle, err) != KOLO_OK) {
        kolo__entry_free(e);
        return 0;
    }
    h = e->handle;
    kolo__flight_enqueued(ps, e);
    if (kolo__queue_push(&ps->queue, e, err) != KOLO_OK) {
        kolo__flight_refused(ps, e);
        kolo__handles_complete(ps->rt->handles, h, err->code, err->msg);
        kolo__handles_wait(ps->rt->handles, h, NULL);
        kolo__entry_free(e);
        return 0;
    }
    return h;
}

/* Pushes one tensor onto a set's queue as enqueue.c does; 0 on failure
 * (recorded). */
kolo_handle_t push(prank_t *p, kolo__pset_t *ps, const char *name,
                   const kolo__params_t *params, const void *in, void *out)
{
    kolo__err_t err;
    kolo_handle_t h = push_try(ps, name, params, in, out, &err);

    EXPECT(p, h != 0, "push of '%s': %s", name, err.msg);
    return h;
}

kolo__params_t params(int coll, kolo_dtype_t dtype, int op, int64_t count)
{
    kolo__params_t pr;
    kolo__params_init(&pr, coll, dtype, op, count);
    return pr;
}

kolo_handle_t allreduce(prank_t *p, kolo__pset_t *ps, const char *name,
                               const float *in, float *out, int64_t count)
{
    kolo__params_t pr = params(KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM,
                               count);
    return push(p, ps, name, &pr, in, out);
}

/* Waits a handle; its status, the message into msg. */
int wait_h(prank_t *p, kolo_handle_t h, char *msg, size_t len)
{
    kolo__err_t err;
    int rc;

    kolo__err_clear(&err);
    if (h == 0)
        return KOLO_ERR_INVALID_HANDLE;
    kolo__flight_wait_begin(&p->rt, h);
    rc = kolo__handles_wait(p->rt.handles, h, &err);
    kolo__flight_wait_end(&p->rt);
    if (msg != NULL)
        snprintf(msg, len, "%s", rc == KOLO_OK ? "" : err.msg);
    return rc;
}

void expect_ok(prank_t *p, kolo_handle_t h, const char *what)
{
    char msg[KOLO__ERR_LEN + 64];
    int rc = wait_h(p, h, msg, sizeof(msg));
    EXPECT(p, rc == KOLO_OK, "rank %d: %s failed (%d): %s", p->rank, what, rc,
           msg);
}

float rank_val(int r, int t, int64_t i)
{
    return (float)((r + 1) * (t + 2) + (int)(i % 11));
}

void expect_sum(prank_t *p, const char *name, int t, const float *out,
                int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < p->job->size; r++)
            want += rank_val(r, t, i);
        EXPECT(p, out[i] == want, "%s[%lld] = %g, expected %g", name,
               (long long)i, out[i], want);
    }
}

double rank_max_val(int r, int i)
{
    return (double)((r * 7 + i * 3) % 5);
}

void expect_max(prank_t *p, const char *name, const double *out, int count)
{
    for (int i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < p->job->size; r++)
            want = fmax(want, rank_max_val(r, i));
        EXPECT(p, out[i] == want, "%s[%d] = %g, expected %g", name, i, out[i],
               want);
    }
}
