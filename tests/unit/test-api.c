/*
 * test-api.c — the public C API (kolo.h) given wrong input, in one process
 * (a job of one rank: KOLO_SIZE unset, no launcher).
 *
 * Why these tests: whatever a caller gets wrong — calls before kolo_init or
 * after kolo_shutdown, NULL pointers, bad counts, dtypes, ops, names,
 * handles, process sets, environment variables — must come back as the
 * documented error code with a kolo_last_error() that names the problem
 * (the tensor, the variable, the value), never as a crash or a hang, and
 * never disturb a valid collective in flight at the same time. And
 * kolo_init/kolo_shutdown must give back what they take: descriptors and
 * threads are counted over 100 cycles.
 *
 * Check runs every test in a forked child, so each starts uninitialized
 * and may set the environment freely; a crash fails that test only.
 */
#define _GNU_SOURCE

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kolo.h"
#include "unit.h"

extern char **environ;

/* ---- helpers ----------------------------------------------------------------- */

/* Every test starts from an environment without KOLO_* variables. */
static void clean_env(void)
{
    char name[256];
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e != NULL; e++) {
            const char *eq = strchr(*e, '=');
            size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
            if (strncmp(*e, "KOLO_", 5) == 0 && n < sizeof(name)) {
                memcpy(name, *e, n);
                name[n] = '\0';
                unsetenv(name);
                again = 1; /* environ changed under us: start over */
                break;
            }
        }
    }
}

/* An error with this code whose message contains each of the (up to three)
 * strings. */
#define EXPECT_ERR(call, code, ...)                                           \
    expect_err_((call), (code), #call, __FILE__, __LINE__,                    \
                (const char *[]){__VA_ARGS__, NULL})

static void expect_err_(int rc, int code, const char *call, const char *file,
                        int line, const char **subs)
{
    const char *msg = kolo_last_error();
    ck_assert_msg(rc == code, "%s:%d: %s returned %d (%s), expected %d (%s); "
                  "message: %s", file, line, call, rc, kolo_strerror(rc), code,
                  kolo_strerror(code), msg);
    ck_assert_msg(msg != NULL && msg[0] != '\0',
                  "%s:%d: %s: no message in kolo_last_error()", file, line, call);
    for (int i = 0; subs[i] != NULL; i++)
        ck_assert_msg(strstr(msg, subs[i]) != NULL,
                      "%s:%d: %s: the message does not say '%s': %s", file,
                      line, call, subs[i], msg);
}

#define MUST(call)                                                            \
    do {                                                                      \
        int rc_ = (call);                                                     \
        ck_assert_msg(rc_ == KOLO_OK, "%s returned %d: %s", #call, rc_,       \
                      kolo_last_error());                                     \
    } while (0)

/* An array of n floats (at least one, so that n = 0 has a buffer too). */
static float *floats(int64_t n)
{
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));

    ck_assert_ptr_nonnull(f);
    return f;
}

/* One allreduce of n floats x[i] = i with prescale 2: the result (a job of
 * one rank) is 2i. Returns its status; checks the values on success. */
static int allreduce_ok(const char *name, int64_t n)
{
    float *x = floats(n), *y = floats(n);
    kolo_opts_t o;
    kolo_handle_t h;
    int rc;

    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(i % 1000);
    kolo_opts_init(&o);
    o.prescale = 2.0;
    rc = kolo_allreduce_async_opts(name, x, y, n, KOLO_FLOAT32, &o, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    if (rc == KOLO_OK)
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(y[i] == 2.0f * (float)(i % 1000),
                          "%s[%lld] = %g, expected %g", name, (long long)i,
                          y[i], 2.0f * (float)(i % 1000));
    free(x);
    free(y);
    return rc;
}

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    int n = 0;
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return strcmp(path, "/proc/self/fd") == 0 ? n - 1 : n; /* the listing */
}

static int count_fds(void) { return count_dir("/proc/self/fd"); }

/* ThreadSanitizer starts one thread of its own, the first time it needs
 * it, which is not kolo's: thread counts allow for it in such a build. */
#if defined(__SANITIZE_THREAD__)
#define SANITIZER_THREADS 1
#else
#define SANITIZER_THREADS 0
#endif

/* Threads told to stop may take a moment to be gone from /proc. Returns
 * expect when the count settles at it (or at expect plus the sanitizer's
 * own thread), else the count. */
static int count_threads_settled(int expect)
{
    int n = count_dir("/proc/self/task");
    for (int i = 0; i < 100 && (n < expect || n > expect + SANITIZER_THREADS); i++) {
        usleep(10000);
        n = count_dir("/proc/self/task");
    }
    return n >= expect && n <= expect + SANITIZER_THREADS ? expect : n;
}

/* The calls of an uninitialized kolo: all refused with
 * KOLO_ERR_NOT_INITIALIZED (or, for handles, KOLO_ERR_INVALID_HANDLE). */
static void expect_not_initialized(void)
{
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    const char *names[1] = {"g"};
    const void *ins[1] = {x};
    void *outs[1] = {x};
    int64_t counts[1] = {4};
    int ranks[1] = {0}, id = -1, last = -1;
    kolo_handle_t h = -1, hs[1] = {-1};

    ck_assert_int_eq(kolo_is_initialized(), 0);
    ck_assert_int_eq(kolo_rank(), -1);
    ck_assert_int_eq(kolo_size(), -1);
    ck_assert_int_eq(kolo_local_rank(), -1);
    ck_assert_int_eq(kolo_local_size(), -1);
    ck_assert_int_eq(kolo_cross_rank(), -1);
    ck_assert_int_eq(kolo_cross_size(), -1);
    EXPECT_ERR(kolo_allreduce_async("g", x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    ck_assert_int_eq(h, -1); /* outputs are written only on success */
    EXPECT_ERR(kolo_allreduce_async_opts("g", x, x, 4, KOLO_FLOAT32, NULL, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_broadcast_async("g", x, 4, KOLO_FLOAT32, 0, NULL, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_allgather_async("g", x, 1, shape, KOLO_FLOAT32, NULL, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_alltoall_async("g", x, 1, shape, KOLO_FLOAT32, NULL, NULL, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_reducescatter_async("g", x, 1, shape, KOLO_FLOAT32, NULL, &h),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_grouped_allreduce_async(1, names, ins, outs, counts,
                                            KOLO_FLOAT32, NULL, hs),
               KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_barrier(KOLO_GLOBAL_PROCESS_SET), KOLO_ERR_NOT_INITIALIZED,
               "not initialized");
    EXPECT_ERR(kolo_join(&last), KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_add_process_set(ranks, 1, &id), KOLO_ERR_NOT_INITIALIZED,
               "not initialized");
    ck_assert_int_eq(id, -1);
    EXPECT_ERR(kolo_remove_process_set(1), KOLO_ERR_NOT_INITIALIZED,
               "not initialized");
    ck_assert_int_eq(kolo_process_set_rank(0), -1);
    ck_assert_int_eq(kolo_process_set_size(0), -1);
    ck_assert_int_eq(kolo_enabled("gloo"), 0);
    EXPECT_ERR(kolo_shutdown(), KOLO_ERR_NOT_INITIALIZED, "not initialized");
    EXPECT_ERR(kolo_wait(1 << 20), KOLO_ERR_INVALID_HANDLE, "1048576");
    EXPECT_ERR(kolo_poll(1 << 20), KOLO_ERR_INVALID_HANDLE, "1048576");
    ck_assert_ptr_null(kolo_handle_error(1 << 20));
}

/* What a test ends with: kolo still works after what the test did (an
 * allreduce of n floats), and shuts down. */
static void works_then_shut_down(const char *name, int64_t n)
{
    int rc = allreduce_ok(name, n);

    ck_assert_msg(rc == KOLO_OK, "allreduce %s returned %d: %s", name, rc,
                  kolo_last_error());
    MUST(kolo_shutdown());
}

/* ---- life cycle ------------------------------------------------------------------ */

START_TEST(calls_before_init)
{
    expect_not_initialized();
    /* And then kolo works. */
    MUST(kolo_init());
    ck_assert_int_eq(kolo_rank(), 0);
    ck_assert_int_eq(kolo_size(), 1);
    works_then_shut_down("after", 100);
}
END_TEST

START_TEST(calls_after_shutdown)
{
    float x[4] = {1, 2, 3, 4};
    kolo_handle_t h;
    int rc;

    MUST(kolo_init());
    MUST(allreduce_ok("before", 100));
    /* A handle not yet waited for when kolo shuts down is still waitable:
     * its status is what it was (it completed) or KOLO_ERR_SHUTDOWN. */
    MUST(kolo_allreduce_async("open", x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h));
    MUST(kolo_shutdown());
    rc = kolo_wait(h);
    ck_assert_msg(rc == KOLO_OK || rc == KOLO_ERR_SHUTDOWN,
                  "a handle of before the shutdown: %d %s", rc,
                  kolo_last_error());
    expect_not_initialized();
    /* Initialized again, it works again. */
    MUST(kolo_init());
    works_then_shut_down("again", 100);
}
END_TEST

START_TEST(double_init)
{
    MUST(kolo_init());
    EXPECT_ERR(kolo_init(), KOLO_ERR_ALREADY_INITIALIZED, "kolo_init");
    ck_assert_int_eq(kolo_is_initialized(), 1);
    /* The first init is untouched. */
    works_then_shut_down("after/double-init", 1000);
}
END_TEST

START_TEST(double_shutdown)
{
    MUST(kolo_init());
    MUST(kolo_shutdown());
    EXPECT_ERR(kolo_shutdown(), KOLO_ERR_NOT_INITIALIZED, "kolo_shutdown",
               "not initialized");
    EXPECT_ERR(kolo_shutdown(), KOLO_ERR_NOT_INITIALIZED, "not initialized");
}
END_TEST

/* ---- arguments ------------------------------------------------------------------- */

START_TEST(null_pointers)
{
    float x[4] = {1, 2, 3, 4};
    int64_t shape1[1] = {4};
    kolo_opts_t o;
    kolo_handle_t h = -1, hs[2] = {-1, -1};
    const char *names[2] = {"a", NULL};
    const void *ins[2] = {x, x};
    void *outs[2] = {x, x};
    int64_t counts[2] = {4, 4};
    kolo_result_t res;

    MUST(kolo_init());
    EXPECT_ERR(kolo_allreduce_async(NULL, x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "name", "NULL");
    EXPECT_ERR(kolo_allreduce_async("t/in", NULL, x, 4, KOLO_FLOAT32,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/in", "input", "NULL");
    EXPECT_ERR(kolo_allreduce_async("t/out", x, NULL, 4, KOLO_FLOAT32,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/out", "output", "NULL");
    EXPECT_ERR(kolo_allreduce_async("t/h", x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM,
                                    NULL),
               KOLO_ERR_INVALID_ARGUMENT, "handle", "NULL");
    ck_assert_int_eq(h, -1);
    kolo_opts_init(&o);
    o.ndim = 2;
    o.shape = NULL;
    EXPECT_ERR(kolo_allreduce_async_opts("t/shape", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/shape", "shape");
    EXPECT_ERR(kolo_broadcast_async("t/bc", NULL, 4, KOLO_FLOAT32, 0, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/bc", "NULL");
    EXPECT_ERR(kolo_broadcast_async("t/bc", x, 4, KOLO_FLOAT32, 0, NULL, NULL),
               KOLO_ERR_INVALID_ARGUMENT, "handle");
    EXPECT_ERR(kolo_allgather_async("t/ag", NULL, 1, shape1, KOLO_FLOAT32, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/ag", "input");
    EXPECT_ERR(kolo_allgather_async("t/ag", x, 1, NULL, KOLO_FLOAT32, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/ag", "shape");
    EXPECT_ERR(kolo_alltoall_async("t/a2a", NULL, 1, shape1, KOLO_FLOAT32, NULL,
                                   NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/a2a", "input");
    EXPECT_ERR(kolo_reducescatter_async("t/rs", NULL, 1, shape1, KOLO_FLOAT32,
                                        NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/rs", "input");
    /* Groups: NULL arrays, a NULL member name, a NULL handles array. */
    ck_assert_int_lt(kolo_grouped_allreduce_async(2, NULL, ins, outs, counts,
                                                  KOLO_FLOAT32, NULL, hs), 0);
    ck_assert_int_lt(kolo_grouped_allreduce_async(2, names, ins, outs, counts,
                                                  KOLO_FLOAT32, NULL, hs), 0);
    names[1] = "b";
    EXPECT_ERR(kolo_grouped_allreduce_async(2, names, NULL, outs, counts,
                                            KOLO_FLOAT32, NULL, hs),
               KOLO_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT_ERR(kolo_grouped_allreduce_async(2, names, ins, outs, NULL,
                                            KOLO_FLOAT32, NULL, hs),
               KOLO_ERR_INVALID_ARGUMENT, "counts");
    EXPECT_ERR(kolo_grouped_allreduce_async(2, names, ins, outs, counts,
                                            KOLO_FLOAT32, NULL, NULL),
               KOLO_ERR_INVALID_ARGUMENT, "handle");
    ins[1] = NULL;
    EXPECT_ERR(kolo_grouped_allreduce_async(2, names, ins, outs, counts,
                                            KOLO_FLOAT32, NULL, hs),
               KOLO_ERR_INVALID_ARGUMENT, "'b'", "input");
    ins[1] = x;
    ck_assert_int_eq(hs[0], -1);
    ck_assert_int_eq(hs[1], -1);
    {
        int r0 = 0, id = -1;
        EXPECT_ERR(kolo_add_process_set(NULL, 1, &id),
                   KOLO_ERR_INVALID_ARGUMENT, "rank");
        EXPECT_ERR(kolo_add_process_set(&r0, 1, NULL), KOLO_ERR_INVALID_ARGUMENT,
                   "id");
        ck_assert_int_eq(id, -1);
    }
    EXPECT_ERR(kolo_add_process_sets_from_groups(1, NULL, NULL, 0, NULL),
               KOLO_ERR_INVALID_ARGUMENT, "kolo_add_process_sets_from_groups");
    /* Harmless NULLs. */
    kolo_result_free(NULL);
    memset(&res, 0, sizeof(res));
    kolo_result_free(&res);
    kolo_opts_init(NULL);
    ck_assert_int_eq(kolo_built(NULL), 0);
    ck_assert_int_eq(kolo_enabled(NULL), 0);
    MUST(kolo_join(NULL));
    /* NULL buffers with no elements are fine. */
    MUST(kolo_allreduce_async("t/empty", NULL, NULL, 0, KOLO_FLOAT32,
                              KOLO_OP_SUM, &h));
    MUST(kolo_wait(h));
    MUST(kolo_broadcast_async("t/empty-bc", NULL, 0, KOLO_FLOAT32, 0, NULL, &h));
    MUST(kolo_wait(h));
    /* Nothing above disturbed the job. */
    works_then_shut_down("after/nulls", 1000);
}
END_TEST

START_TEST(bad_counts)
{
    double d[4] = {0};
    float x[4] = {0};
    int64_t shape[2], shape1[1] = {-3};
    kolo_opts_t o;
    kolo_handle_t h = -1;

    MUST(kolo_init());
    EXPECT_ERR(kolo_allreduce_async("t/neg", x, x, -1, KOLO_FLOAT32,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/neg", "-1");
    EXPECT_ERR(kolo_allreduce_async("t/min", x, x, INT64_MIN, KOLO_FLOAT32,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/min");
    /* INT64_MAX float64 elements: the byte count overflows. */
    EXPECT_ERR(kolo_allreduce_async("t/huge", d, d, INT64_MAX, KOLO_FLOAT64,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/huge", "9223372036854775807");
    EXPECT_ERR(kolo_allreduce_async("t/huge8", d, d, INT64_MAX / 8 + 1,
                                    KOLO_FLOAT64, KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/huge8");
    EXPECT_ERR(kolo_broadcast_async("t/bneg", x, -4, KOLO_FLOAT32, 0, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/bneg", "-4");
    EXPECT_ERR(kolo_broadcast_async("t/bhuge", d, INT64_MAX, KOLO_FLOAT64, 0,
                                    NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/bhuge");
    /* Shapes: a negative dimension, a product that overflows, a product
     * that is not the count, too many dimensions. */
    EXPECT_ERR(kolo_allgather_async("t/agneg", x, 1, shape1, KOLO_FLOAT32,
                                    NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/agneg", "-3");
    shape[0] = INT64_MAX / 2;
    shape[1] = 4;
    EXPECT_ERR(kolo_allgather_async("t/agover", x, 2, shape, KOLO_FLOAT32, NULL,
                                    &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/agover", "overflow");
    kolo_opts_init(&o);
    o.ndim = 2;
    o.shape = shape;
    EXPECT_ERR(kolo_allreduce_async_opts("t/arover", x, x, 4, KOLO_FLOAT32, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/arover");
    shape[0] = 2;
    shape[1] = 3;
    EXPECT_ERR(kolo_allreduce_async_opts("t/shape6", x, x, 4, KOLO_FLOAT32, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/shape6", "6", "4");
    o.ndim = KOLO_MAX_DIMS + 1;
    EXPECT_ERR(kolo_allreduce_async_opts("t/ndim", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/ndim", "9");
    o.ndim = -1;
    EXPECT_ERR(kolo_allreduce_async_opts("t/ndimneg", x, x, 4, KOLO_FLOAT32, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/ndimneg");
    EXPECT_ERR(kolo_reducescatter_async("t/rs0", x, 0, NULL, KOLO_FLOAT32, NULL,
                                        &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/rs0");
    kolo_opts_init(&o);
    o.backward_passes = 0;
    EXPECT_ERR(kolo_allreduce_async_opts("t/bp0", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/bp0", "backward_passes");
    EXPECT_ERR(kolo_broadcast_async("t/root", x, 4, KOLO_FLOAT32, 1, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/root", "1");
    EXPECT_ERR(kolo_broadcast_async("t/rootneg", x, 4, KOLO_FLOAT32, -1, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/rootneg", "-1");
    ck_assert_int_eq(h, -1);
    works_then_shut_down("after/counts", 1000);
}
END_TEST

START_TEST(bad_dtypes_and_ops)
{
    float x[4] = {0};
    uint8_t b[4] = {0, 1, 0, 1};
    int64_t shape1[1] = {4};
    kolo_opts_t o;
    kolo_handle_t h = -1;

    MUST(kolo_init());
    EXPECT_ERR(kolo_allreduce_async("t/dt99", x, x, 4, (kolo_dtype_t)99,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/dt99", "dtype", "99");
    EXPECT_ERR(kolo_allreduce_async("t/dtneg", x, x, 4, (kolo_dtype_t)-1,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/dtneg", "dtype");
    EXPECT_ERR(kolo_allreduce_async("t/dtcount", x, x, 4, KOLO_DTYPE_COUNT_,
                                    KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/dtcount", "dtype");
    EXPECT_ERR(kolo_allreduce_async("t/op99", x, x, 4, KOLO_FLOAT32,
                                    (kolo_op_t)99, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/op99", "op", "99");
    EXPECT_ERR(kolo_allreduce_async("t/opcount", x, x, 4, KOLO_FLOAT32,
                                    KOLO_OP_COUNT_, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/opcount", "op");
    /* An op that does not apply: AVERAGE of bool is refused (kolo.h). The
     * header does not say which code; either of the two that fit. */
    {
        int rc = kolo_allreduce_async("t/avgbool", b, b, 4, KOLO_BOOL,
                                      KOLO_OP_AVERAGE, &h);
        const char *msg = kolo_last_error();
        ck_assert_msg(rc == KOLO_ERR_UNSUPPORTED ||
                          rc == KOLO_ERR_INVALID_ARGUMENT,
                      "AVERAGE of bool: %d %s", rc, msg);
        ck_assert_msg(strstr(msg, "t/avgbool") && strstr(msg, "average") &&
                          strstr(msg, "bool"),
                      "AVERAGE of bool: message %s", msg);
    }
    kolo_opts_init(&o);
    o.op = (kolo_op_t)42;
    EXPECT_ERR(kolo_allreduce_async_opts("t/opts42", x, x, 4, KOLO_FLOAT32, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/opts42", "42");
    EXPECT_ERR(kolo_reducescatter_async("t/rsop", x, 1, shape1, KOLO_FLOAT32,
                                        &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/rsop", "42");
    o.op = KOLO_OP_MIN; /* reducescatter takes SUM or AVERAGE */
    ck_assert_int_lt(kolo_reducescatter_async("t/rsmin", x, 1, shape1,
                                              KOLO_FLOAT32, &o, &h), 0);
    ck_assert_ptr_nonnull(strstr(kolo_last_error(), "t/rsmin"));
    kolo_opts_init(&o);
    o.wire_dtype = 99;
    EXPECT_ERR(kolo_allreduce_async_opts("t/wire", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/wire");
    o.wire_dtype = KOLO_FLOAT16; /* compression takes float32 only */
    EXPECT_ERR(kolo_allreduce_async_opts("t/wire64", x, x, 2, KOLO_FLOAT64, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/wire64");
    EXPECT_ERR(kolo_broadcast_async("t/bdt", x, 4, (kolo_dtype_t)99, 0, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/bdt", "99");
    EXPECT_ERR(kolo_allgather_async("t/agdt", x, 1, shape1, (kolo_dtype_t)99,
                                    NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "t/agdt", "99");
    ck_assert_int_eq(h, -1);
    /* The helpers name what they do not know. */
    ck_assert_uint_eq(kolo_dtype_size((kolo_dtype_t)99), 0);
    ck_assert_uint_eq(kolo_dtype_size((kolo_dtype_t)-1), 0);
    ck_assert_str_eq(kolo_dtype_name((kolo_dtype_t)99), "unknown");
    ck_assert_str_eq(kolo_dtype_name((kolo_dtype_t)-1), "unknown");
    ck_assert_str_eq(kolo_op_name((kolo_op_t)99), "unknown");
    ck_assert_str_eq(kolo_op_name((kolo_op_t)-1), "unknown");
    ck_assert_str_eq(kolo_strerror(12345), "unknown status");
    ck_assert_str_eq(kolo_strerror(-12345), "unknown status");
    works_then_shut_down("after/dtypes", 1000);
}
END_TEST

/* A negative op is as unknown as 99: refused at once. Were it accepted, the
 * bad parameters would reach the negotiation, where they may stop the whole
 * job: the test says what happened next, too. */
START_TEST(negative_op_refused)
{
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    kolo_handle_t h = -1;
    int rc, wrc = 0, after;
    char waited[512] = "", later[512] = "";

    MUST(kolo_init());
    rc = kolo_allreduce_async("t/opneg", x, y, 4, KOLO_FLOAT32, (kolo_op_t)-1,
                              &h);
    if (rc == KOLO_OK) {
        wrc = kolo_wait(h);
        snprintf(waited, sizeof(waited), "; its wait returned %d: %s", wrc,
                 kolo_last_error());
    } else {
        EXPECT_ERR(rc, KOLO_ERR_INVALID_ARGUMENT, "t/opneg", "-1");
    }
    after = allreduce_ok("after/opneg", 100);
    if (after != KOLO_OK)
        snprintf(later, sizeof(later), "; a valid allreduce after it failed "
                 "with %d: %s", after, kolo_last_error());
    ck_assert_msg(rc == KOLO_ERR_INVALID_ARGUMENT && after == KOLO_OK,
                  "allreduce with op -1: enqueue returned %d, expected %d "
                  "(invalid argument)%s%s", rc, KOLO_ERR_INVALID_ARGUMENT,
                  waited, later);
    MUST(kolo_shutdown());
}
END_TEST

START_TEST(bad_names)
{
    char name[KOLO_MAX_NAME_LEN + 2];
    float x[4] = {1, 2, 3, 4};
    kolo_handle_t h = -1;

    MUST(kolo_init());
    EXPECT_ERR(kolo_allreduce_async("", x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "empty");
    EXPECT_ERR(kolo_broadcast_async("", x, 4, KOLO_FLOAT32, 0, NULL, &h),
               KOLO_ERR_INVALID_ARGUMENT, "empty");
    /* KOLO_MAX_NAME_LEN + 1 bytes: refused, naming its start and the
     * limit. */
    memset(name, 'n', KOLO_MAX_NAME_LEN + 1);
    memcpy(name, "long/", 5);
    name[KOLO_MAX_NAME_LEN + 1] = '\0';
    EXPECT_ERR(kolo_allreduce_async(name, x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h),
               KOLO_ERR_INVALID_ARGUMENT, "long/nnn", "1024");
    ck_assert_int_eq(h, -1);
    /* KOLO_MAX_NAME_LEN bytes: fine. */
    name[KOLO_MAX_NAME_LEN] = '\0';
    MUST(kolo_allreduce_async(name, x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h));
    MUST(kolo_wait(h));
    ck_assert(x[0] == 1 && x[3] == 4);
    works_then_shut_down("after/names", 1000);
}
END_TEST

START_TEST(bad_handles)
{
    float x[4] = {1, 2, 3, 4};
    kolo_handle_t h, bad[] = {0, -5, (kolo_handle_t)1 << 40, INT64_MAX, INT64_MIN};
    kolo_result_t res;
    char num[32];

    MUST(kolo_init());
    MUST(kolo_allreduce_async("t/twice", x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h));
    ck_assert_int_gt(h, 0);
    MUST(kolo_wait(h));
    snprintf(num, sizeof(num), "%lld", (long long)h);
    EXPECT_ERR(kolo_wait(h), KOLO_ERR_INVALID_HANDLE, num, "released");
    EXPECT_ERR(kolo_poll(h), KOLO_ERR_INVALID_HANDLE, num);
    ck_assert_ptr_null(kolo_handle_error(h));
    memset(&res, 0xff, sizeof(res));
    EXPECT_ERR(kolo_wait_result(h, &res), KOLO_ERR_INVALID_HANDLE, num);
    ck_assert_ptr_null(res.data); /* zeroed, so kolo_result_free is safe */
    kolo_result_free(&res);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(num, sizeof(num), "%lld", (long long)bad[i]);
        EXPECT_ERR(kolo_wait(bad[i]), KOLO_ERR_INVALID_HANDLE, num);
        EXPECT_ERR(kolo_poll(bad[i]), KOLO_ERR_INVALID_HANDLE, num);
        ck_assert_ptr_null(kolo_handle_error(bad[i]));
    }
    works_then_shut_down("after/handles", 1000);
}
END_TEST

START_TEST(bad_process_sets)
{
    float x[4] = {1, 2, 3, 4};
    kolo_opts_t o;
    kolo_handle_t h = -1;
    int r0 = 0, r5 = 5, twice[2] = {0, 0}, id = -1;

    MUST(kolo_init());
    kolo_opts_init(&o);
    o.process_set = 7;
    EXPECT_ERR(kolo_allreduce_async_opts("t/ps7", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "process set 7");
    EXPECT_ERR(kolo_broadcast_async("t/ps7", x, 4, KOLO_FLOAT32, 0, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "process set 7");
    o.process_set = -1;
    EXPECT_ERR(kolo_allreduce_async_opts("t/psneg", x, x, 4, KOLO_FLOAT32, &o,
                                         &h),
               KOLO_ERR_INVALID_ARGUMENT, "process set -1");
    ck_assert_int_lt(kolo_barrier(7), 0);
    ck_assert_ptr_nonnull(strstr(kolo_last_error(), "7"));
    ck_assert_int_eq(kolo_process_set_rank(7), -1);
    ck_assert_int_eq(kolo_process_set_size(7), -1);
    EXPECT_ERR(kolo_remove_process_set(7), KOLO_ERR_INVALID_ARGUMENT,
               "process set 7");
    EXPECT_ERR(kolo_remove_process_set(KOLO_GLOBAL_PROCESS_SET),
               KOLO_ERR_INVALID_ARGUMENT, "global");
    EXPECT_ERR(kolo_add_process_set(&r5, 1, &id), KOLO_ERR_INVALID_ARGUMENT,
               "rank 5");
    EXPECT_ERR(kolo_add_process_set(twice, 2, &id), KOLO_ERR_INVALID_ARGUMENT,
               "rank 0", "twice");
    EXPECT_ERR(kolo_add_process_set(&r0, 0, &id), KOLO_ERR_INVALID_ARGUMENT,
               "at least one");
    ck_assert_int_eq(id, -1);

    /* A set that existed and was removed. */
    MUST(kolo_add_process_set(&r0, 1, &id));
    ck_assert_int_eq(id, 1);
    ck_assert_int_eq(kolo_process_set_size(id), 1);
    o.process_set = id;
    MUST(kolo_allreduce_async_opts("t/ps1", x, x, 4, KOLO_FLOAT32, &o, &h));
    MUST(kolo_wait(h));
    MUST(kolo_remove_process_set(id));
    ck_assert_int_eq(kolo_process_set_size(id), -1);
    EXPECT_ERR(kolo_allreduce_async_opts("t/ps1", x, x, 4, KOLO_FLOAT32, &o, &h),
               KOLO_ERR_INVALID_ARGUMENT, "process set 1", "removed");
    EXPECT_ERR(kolo_remove_process_set(id), KOLO_ERR_INVALID_ARGUMENT,
               "process set 1");
    ck_assert_int_lt(kolo_barrier(id), 0);
    works_then_shut_down("after/psets", 1000);
}
END_TEST

/* ---- the environment ------------------------------------------------------------- */

static const struct {
    const char *name, *value;
} bad_env[] = {
    {"KOLO_FUSION_THRESHOLD", "abc"},
    {"KOLO_FUSION_THRESHOLD", "12Q"},
    {"KOLO_FUSION_THRESHOLD", "-1"},
    {"KOLO_CYCLE_TIME", "-1"},
    {"KOLO_CYCLE_TIME", "fast"},
    {"KOLO_TIMEOUT_SECONDS", "0"},
    {"KOLO_TIMEOUT_SECONDS", "-5"},
    {"KOLO_START_TIMEOUT", "-1"},
    {"KOLO_LOG_LEVEL", "loud"},
    {"KOLO_CACHE_CAPACITY", "-5"},
    {"KOLO_SIZE", "0"},
    {"KOLO_RANK", "x"},
    {"KOLO_STALL_CHECK_TIME_SECONDS", "-1"},
    {"KOLO_STALL_SHUTDOWN_TIME_SECONDS", "soon"},
};

START_TEST(invalid_environment)
{
    const char *name = bad_env[_i].name, *value = bad_env[_i].value;
    int fds, threads;

    /* The first init loads anything loaded once (the logger, ...). */
    MUST(kolo_init());
    MUST(kolo_shutdown());
    fds = count_fds();
    threads = count_dir("/proc/self/task");
    setenv(name, value, 1);
    EXPECT_ERR(kolo_init(), KOLO_ERR_CONFIG, name, value);
    ck_assert_int_eq(kolo_is_initialized(), 0);
    expect_not_initialized();
    ck_assert_int_eq(count_fds(), fds);
    ck_assert_int_eq(count_threads_settled(threads), threads);
    /* With the variable fixed, init works. */
    unsetenv(name);
    MUST(kolo_init());
    works_then_shut_down("after/env", 100);
}
END_TEST

/* A timeline file that cannot be written (/dev/full: every write fails
 * with ENOSPC) is the file's fault, said with its name and the reason: by
 * KOLO_TIMELINE a configuration error, by kolo_start_timeline an invalid
 * argument; never "the communication backend failed". */
START_TEST(unwritable_timeline)
{
    const char *why = strerror(ENOSPC);
    int fds, threads;

    if (access("/dev/full", W_OK) != 0) {
        printf("unwritable_timeline: skipped: no writable /dev/full here\n");
        return;
    }
    MUST(kolo_init());
    MUST(kolo_shutdown());
    fds = count_fds();
    threads = count_dir("/proc/self/task");
    setenv("KOLO_TIMELINE", "/dev/full", 1);
    EXPECT_ERR(kolo_init(), KOLO_ERR_CONFIG, "KOLO_TIMELINE='/dev/full'",
               "cannot write the timeline file '/dev/full'", why);
    ck_assert_int_eq(kolo_is_initialized(), 0);
    ck_assert_int_eq(count_fds(), fds);
    ck_assert_int_eq(count_threads_settled(threads), threads);
    unsetenv("KOLO_TIMELINE");

    MUST(kolo_init());
    EXPECT_ERR(kolo_start_timeline("/dev/full", 0), KOLO_ERR_INVALID_ARGUMENT,
               "cannot write the timeline file '/dev/full'", why);
    /* Said once, by the start: the stop has nothing to add. */
    MUST(kolo_stop_timeline());
    works_then_shut_down("after/timeline", 100);
    ck_assert_int_eq(count_fds(), fds);
}
END_TEST

/* KOLO_TIMELINE=DYNAMIC (Horovod's HOROVOD_TIMELINE=DYNAMIC): no file at
 * init, not even one called DYNAMIC; kolo_start_timeline starts one. */
START_TEST(dynamic_timeline)
{
    char dir[] = "/tmp/test-api-tl.XXXXXX", path[64];
    FILE *f;
    char head[2] = "";

    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chdir(dir), 0);
    setenv("KOLO_TIMELINE", "DYNAMIC", 1);
    MUST(kolo_init());
    ck_assert_int_ne(access("DYNAMIC", F_OK), 0);
    snprintf(path, sizeof(path), "%s/t.json", dir);
    MUST(kolo_start_timeline(path, 0));
    MUST(allreduce_ok("dynamic/timeline", 10));
    MUST(kolo_stop_timeline());
    MUST(kolo_shutdown());
    unsetenv("KOLO_TIMELINE");
    ck_assert_int_ne(access("DYNAMIC", F_OK), 0);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fread(head, 1, 1, f), 1);
    ck_assert_int_eq(head[0], '[');
    fclose(f);
    unlink(path);
    ck_assert_int_eq(chdir("/"), 0);
    rmdir(dir);
}
END_TEST

/* ---- work in flight -------------------------------------------------------------- */

/* Every wrong call of this file's kinds, at once; each must fail. */
static void wrong_calls(void)
{
    float x[4] = {0};
    double d[2] = {0};
    kolo_opts_t o;
    kolo_handle_t h = -1;

    ck_assert_int_eq(kolo_allreduce_async(NULL, x, x, 4, KOLO_FLOAT32,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_allreduce_async("w", NULL, x, 4, KOLO_FLOAT32,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_allreduce_async("w", x, x, -1, KOLO_FLOAT32,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_allreduce_async("w", d, d, INT64_MAX, KOLO_FLOAT64,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_allreduce_async("w", x, x, 4, (kolo_dtype_t)99,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_allreduce_async("w", x, x, 4, KOLO_FLOAT32,
                                          (kolo_op_t)99, &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_lt(kolo_allreduce_async("w", x, x, 4, KOLO_BOOL,
                                          KOLO_OP_AVERAGE, &h), 0);
    ck_assert_int_eq(kolo_allreduce_async("", x, x, 4, KOLO_FLOAT32,
                                          KOLO_OP_SUM, &h), KOLO_ERR_INVALID_ARGUMENT);
    kolo_opts_init(&o);
    o.process_set = 7;
    ck_assert_int_eq(kolo_allreduce_async_opts("w", x, x, 4, KOLO_FLOAT32, &o,
                                               &h), KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo_wait(0), KOLO_ERR_INVALID_HANDLE);
    ck_assert_int_eq(kolo_wait(-5), KOLO_ERR_INVALID_HANDLE);
    ck_assert_int_eq(kolo_poll((kolo_handle_t)1 << 40), KOLO_ERR_INVALID_HANDLE);
    ck_assert_int_eq(kolo_init(), KOLO_ERR_ALREADY_INITIALIZED);
    ck_assert_int_eq(h, -1);
}

START_TEST(valid_work_in_flight_survives)
{
    enum { N = 4 * 1024 * 1024 };
    float *in = floats(N), *out = floats(N);
    kolo_opts_t o;
    kolo_handle_t h;

    for (int i = 0; i < N; i++)
        in[i] = (float)(i % 4096);
    memset(out, 0, N * sizeof(float));
    MUST(kolo_init());
    kolo_opts_init(&o);
    o.prescale = 3.0;
    MUST(kolo_allreduce_async_opts("big/valid", in, out, N, KOLO_FLOAT32, &o, &h));
    for (int k = 0; k < 20; k++)
        wrong_calls();
    MUST(kolo_wait(h));
    for (int i = 0; i < N; i++)
        if (out[i] != 3.0f * (float)(i % 4096))
            ck_abort_msg("big/valid[%d] = %g, expected %g", i, out[i],
                         3.0f * (float)(i % 4096));
    MUST(kolo_shutdown());
    free(in);
    free(out);
}
END_TEST

static void *valid_loop(void *arg)
{
    int *bad = arg;
    float x[1000], y[1000];
    for (int step = 0; step < 300 && !*bad; step++) {
        kolo_handle_t h;
        char name[32];
        snprintf(name, sizeof(name), "valid/%d", step % 7);
        for (int i = 0; i < 1000; i++)
            x[i] = (float)(step + i);
        if (kolo_allreduce_async(name, x, y, 1000, KOLO_FLOAT32,
                                 KOLO_OP_AVERAGE, &h) != KOLO_OK ||
            kolo_wait(h) != KOLO_OK) {
            *bad = 1;
            break;
        }
        for (int i = 0; i < 1000; i++)
            if (y[i] != (float)(step + i))
                *bad = 2;
    }
    return NULL;
}

START_TEST(wrong_calls_from_another_thread)
{
    pthread_t t;
    int bad = 0;

    MUST(kolo_init());
    ck_assert_int_eq(pthread_create(&t, NULL, valid_loop, &bad), 0);
    for (int k = 0; k < 300; k++)
        wrong_calls();
    pthread_join(t, NULL);
    ck_assert_msg(bad == 0, "the valid allreduces of the other thread %s",
                  bad == 1 ? "failed" : "gave wrong results");
    MUST(kolo_shutdown());
}
END_TEST

/* ---- resources ------------------------------------------------------------------- */

START_TEST(init_shutdown_cycles_release_everything)
{
    int fds = count_fds(), threads = count_dir("/proc/self/task");

    for (int c = 0; c < 100; c++) {
        MUST(kolo_init());
        MUST(allreduce_ok("cycle", 64));
        MUST(kolo_shutdown());
    }
    ck_assert_int_eq(count_fds(), fds);
    ck_assert_int_eq(count_threads_settled(threads), threads);
}
END_TEST

/* Adds a test case of the given tests, each run in a clean environment. */
static TCase *api_tcase(Suite *s, const char *name, double timeout,
                        const TTest *const *tests, size_t n)
{
    TCase *tc = kolo_unit_tcase(s, name, timeout, tests, n);

    tcase_add_checked_fixture(tc, clean_env, NULL);
    return tc;
}

static Suite *api_suite(void)
{
    Suite *s = suite_create("api");
    TCase *tc;

    api_tcase(s, "life cycle", 30,
              KOLO_UNIT_TESTS(calls_before_init, calls_after_shutdown,
                              double_init, double_shutdown));
    api_tcase(s, "arguments", 30,
              KOLO_UNIT_TESTS(null_pointers, bad_counts, bad_dtypes_and_ops,
                              negative_op_refused, bad_names, bad_handles,
                              bad_process_sets));
    tc = api_tcase(s, "environment", 30, NULL, 0);
    tcase_add_loop_test(tc, invalid_environment, 0,
                        (int)(sizeof(bad_env) / sizeof(bad_env[0])));
    tcase_add_test(tc, unwritable_timeline);
    tcase_add_test(tc, dynamic_timeline);
    api_tcase(s, "work in flight", 60,
              KOLO_UNIT_TESTS(valid_work_in_flight_survives,
                              wrong_calls_from_another_thread));
    api_tcase(s, "resources", 60,
              KOLO_UNIT_TESTS(init_shutdown_cycles_release_everything));
    return s;
}

int main(void)
{
    return kolo_unit_run(api_suite());
}
