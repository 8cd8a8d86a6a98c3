/*
 * ranks.h — several ranks as threads of one process, each with its own
 * kolo__runtime_t and global process set built the way kolo_init builds
 * them, over the in-memory backend (ops/mem): the harness of the engine's
 * unit tests (test-protocol.c, test-device.c, test-flight.c), in ranks.c.
 *
 * run_job starts `size` threads, each running `body` on its rank once the
 * global set is up, and stops them as kolo_shutdown would; the first thing
 * a rank finds wrong (EXPECT) fails the Check test, naming the rank.
 */
#ifndef KOLO_TESTS_UNIT_RANKS_H
#define KOLO_TESTS_UNIT_RANKS_H

#include <pthread.h>
#include <stdio.h>

#include "pset.h"
#include "runtime.h"

#define MAXR 4

typedef struct prank prank_t;
typedef void (*body_fn)(prank_t *p);

typedef struct job {
    char rdv[64];
    int size;
    body_fn body;
    double timeout_s; /* KOLO_TIMEOUT_SECONDS of every rank (0: 20) */
    double stall_check_s; /* KOLO_STALL_CHECK_TIME_SECONDS (0: the default) */
    pthread_barrier_t bar;
    prank_t *ranks;
} job_t;

struct prank {
    job_t *job;
    int rank;
    kolo__runtime_t rt;
    kolo__handles_t handles;
    kolo__pset_t *world;
    char fail[4096]; /* the first thing found wrong; "" if none */
};

#define EXPECT(p, cond, ...)                                                  \
    do {                                                                      \
        if (!(cond) && (p)->fail[0] == '\0')                                  \
            snprintf((p)->fail, sizeof((p)->fail), __VA_ARGS__);              \
    } while (0)

/* Starts set `id` of `size` global ranks on this rank (a member) and
 * enters it in the set table. */
kolo__pset_t *set_start(prank_t *p, int id, const int *ranks, int size);
/* KOLO_CACHE_CAPACITY of the ranks of the jobs that start from now on
 * (-1, at first: the default). */
extern int64_t ranks_cache_capacity;
/* Their KOLO_FLIGHT_RECORDER (0, at first: off; the harness opens and
 * closes each rank's recorder as kolo_init and kolo_shutdown do) and
 * KOLO_FLIGHT_DIR ("", at first). */
extern int64_t ranks_flight_recorder;
extern const char *ranks_flight_dir;
/* Runs body on `size` ranks; fails the test with the first rank's
 * complaint. */
void run_job(int size, body_fn body);
/* The same with KOLO_TIMEOUT_SECONDS = timeout_s on every rank. */
void run_job_timeout(int size, body_fn body, double timeout_s);
/* And KOLO_STALL_CHECK_TIME_SECONDS = stall_check_s (0: the default). */
void run_job_stall(int size, body_fn body, double timeout_s,
                   double stall_check_s);
/* Pushes one tensor onto a set's queue as enqueue.c does; 0 on failure,
 * with the message in err (push_try) or recorded (push). */
kolo_handle_t push_try(kolo__pset_t *ps, const char *name,
                       const kolo__params_t *params, const void *in, void *out,
                       kolo__err_t *err);
kolo_handle_t push(prank_t *p, kolo__pset_t *ps, const char *name,
                   const kolo__params_t *params, const void *in, void *out);
kolo__params_t params(int coll, kolo_dtype_t dtype, int op, int64_t count);
/* A float32 SUM allreduce. */
kolo_handle_t allreduce(prank_t *p, kolo__pset_t *ps, const char *name,
                        const float *in, float *out, int64_t count);
/* Waits a handle; its status, the message into msg. */
int wait_h(prank_t *p, kolo_handle_t h, char *msg, size_t len);
void expect_ok(prank_t *p, kolo_handle_t h, const char *what);
/* Rank r's element i of tensor t: small integers, so float sums are exact. */
float rank_val(int r, int t, int64_t i);
/* Expects out (count elements) to be the sum over the job's ranks of
 * rank_val(r, t, i), naming it `name` where it is not. */
void expect_sum(prank_t *p, const char *name, int t, const float *out,
                int64_t count);
/* Rank r's element i of the float64 MAX tests: 0..4. */
double rank_max_val(int r, int i);
/* Expects out (count elements) to be the maximum over the job's ranks of
 * rank_max_val(r, i). */
void expect_max(prank_t *p, const char *name, const double *out, int count);

#endif /* KOLO_TESTS_UNIT_RANKS_H */
