/*
 * test-failures.c — what the surviving ranks see when one rank fails, run as
 * real processes under kolorun (tests/multi/run-failures.sh runs every mode
 * at 2, 3 and 4 ranks, the victim being the last rank and once rank 0).
 *
 *   test-failures MODE [VICTIM]      VICTIM defaults to the last rank
 *
 *   midcoll   every rank is inside a 16M-float allreduce when the victim
 *             SIGKILLs itself: it enqueues, then dies after a fraction
 *             (argv[3], else $FT_KILL_FRACTION, else 0.1) of the time that
 *             allreduce took in the step before. A survivor's allreduce may
 *             still complete, if the victim had sent all it needed before
 *             dying, but then only with the right result
 *   between   the victim SIGKILLs itself after step N completes, while the
 *             others enqueue step N+1
 *   init      the victim SIGKILLs itself before kolo_init; the others' init
 *             must fail, naming it (run with kolorun --start-timeout 3)
 *   exit      the victim calls exit(0) without kolo_shutdown after step N;
 *             the others get KOLO_ERR_SHUTDOWN "rank K has shut down"
 *   stop      the victim SIGSTOPs itself (hung, not dead); the others must
 *             fail within KOLO_TIMEOUT_SECONDS. It writes its pid to
 *             $FT_DIR/victim.pid; the driver SIGCONTs it later, and then it
 *             must find out that its job is gone (it exits 1 after that)
 *   cycles    no victim: 20 kolo_init/kolo_shutdown cycles with an allreduce
 *             each; open file descriptors and threads must be the same
 *             before and after
 *
 * Every survivor checks that its pending handle and a later enqueue complete
 * with an error (< 0) of the expected kind, whose message names the lost
 * rank ("rank K"), within the bound of the mode; that kolo_shutdown then
 * returns promptly; and that the descriptors and threads it had before
 * kolo_init are all it has after kolo_shutdown. It prints one line
 * "rank R of N: PASS MODE victim=K" and exits 0, or prints what failed
 * and exits 1. A watchdog (alarm) turns a hang into a FAIL line naming the
 * phase that hung. With $FT_DIR set, every rank writes its pid to
 * $FT_DIR/pid.R, so that the driver can check that none is left running.
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kolo.h"
#include "testutil.h"

static int rank = -1, size, victim;
static const char *mode;
static int failures;

#define MUST(call) TU_MUST(call, "rank %d: FAIL ", rank)

/* ---- watchdog: a hang becomes a FAIL line naming the phase ---------------- */

/* Starts a phase that must end within `seconds`. */
static void phase(const char *what, unsigned seconds)
{
    tu_watchdog(rank, mode, what, seconds);
}

/* ---- resources ------------------------------------------------------------ */

/* Counts the entries of a /proc directory (not . and ..); for fd, leaves
 * out the descriptor of the listing itself. With list, appends "N->target "
 * for each entry. */
static int count_dir(const char *path, char *list, size_t len)
{
    DIR *d = opendir(path);
    struct dirent *de;
    int n = 0, self;
    size_t used = 0;

    if (d == NULL)
        return -1;
    self = dirfd(d);
    if (list != NULL && len > 0)
        list[0] = '\0';
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (strcmp(path, "/proc/self/fd") == 0 && atoi(de->d_name) == self)
            continue;
        n++;
        if (list != NULL && used + 1 < len) {
            char link[512], target[256] = "";
            ssize_t t;
            int k;
            snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
            t = readlink(link, target, sizeof(target) - 1);
            if (t > 0)
                target[t] = '\0';
            k = snprintf(list + used, len - used, "%s%s%s ", de->d_name,
                         t > 0 ? "->" : "", target);
            if (k > 0 && (size_t)k < len - used)
                used += (size_t)k;
        }
    }
    closedir(d);
    return n;
}

typedef struct resources {
    int fds, threads;
    char fd_list[4096];
} resources_t;

/* ThreadSanitizer starts one thread of its own, the first time it needs
 * it, which is not kolo's: thread counts allow for it in such a build. */
#if defined(__SANITIZE_THREAD__)
#define SANITIZER_THREADS 1
#else
#define SANITIZER_THREADS 0
#endif

static void resources_take(resources_t *r)
{
    r->fds = count_dir("/proc/self/fd", r->fd_list, sizeof(r->fd_list));
    r->threads = count_dir("/proc/self/task", NULL, 0);
}

static void resources_compare(const resources_t *before, const char *when)
{
    resources_t after;
    /* Threads that were told to stop may take a moment to be gone. */
    for (int i = 0; i < 50; i++) {
        resources_take(&after);
        if (after.fds == before->fds && after.threads >= before->threads &&
            after.threads <= before->threads + SANITIZER_THREADS)
            break;
        usleep(20000);
    }
    CHECK(after.fds == before->fds,
          "%s: %d file descriptors open, %d before kolo_init\n    before: "
          "%s\n    after:  %s",
          when, after.fds, before->fds, before->fd_list, after.fd_list);
    CHECK(after.threads >= before->threads &&
              after.threads <= before->threads + SANITIZER_THREADS,
          "%s: %d threads, %d before kolo_init", when, after.threads,
          before->threads);
}

/* ---- checks of a failure --------------------------------------------------- */

/* 1 if msg names rank k: "rank K" or "rank(s) A, K, ..." followed by a
 * non-digit. */
static int names_rank(const char *msg, int k)
{
    for (const char *p = msg; (p = strstr(p, "rank")) != NULL; p++) {
        const char *q = p + 4;
        if (strncmp(q, "(s)", 3) == 0)
            q += 3;
        if (*q != ' ')
            continue;
        for (;;) {
            char *end;
            long v;
            while (*q == ' ')
                q++;
            if (*q < '0' || *q > '9')
                break;
            v = strtol(q, &end, 10);
            if (v == k)
                return 1;
            q = end;
            if (*q != ',')
                break;
            q++;
        }
    }
    return 0;
}

/* The codes a survivor may see in this mode, as a bit mask of -code. */
#define CODE(c) (1u << -(c))

static unsigned expected_codes(void)
{
    if (strcmp(mode, "exit") == 0)
        return CODE(KOLO_ERR_SHUTDOWN);
    if (strcmp(mode, "stop") == 0) /* hung, not dead */
        return CODE(KOLO_ERR_TIMEOUT) | CODE(KOLO_ERR_BACKEND) |
               CODE(KOLO_ERR_RANK_LOST);
    return CODE(KOLO_ERR_RANK_LOST); /* killed */
}

/* How long a survivor may take to see the failure, counted from when it
 * enqueued: the operation timeout (what bounds a hung peer) and a margin. */
static double bound_s;

/* One failed expectation; the same kind of failure is printed only once
 * (a step of four tensors would print it four times), but always counted. */
static void fail_once(int kind, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail_once(int kind, const char *fmt, ...)
{
    static int printed[8];
    va_list ap;

    failures++;
    if (printed[kind]++)
        return;
    fprintf(stderr, "rank %d: FAIL %s victim=%d: ", rank, mode, victim);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

static int reported_ok;

/* Checks one error that a survivor got; prints the first one it saw. */
static void check_failed(const char *what, int rc, const char *msg, double t0)
{
    double dt = now() - t0;
    if (rc >= 0) {
        fail_once(0, "%s: expected an error, got %d", what, rc);
        return;
    }
    if (rc < -31 || !(expected_codes() & CODE(rc)))
        fail_once(1, "%s: unexpected code %d (%s); message: %s", what, rc,
                  kolo_strerror(rc), msg);
    if (!names_rank(msg, victim))
        fail_once(2, "%s: the message does not name rank %d: %s", what,
                  victim, msg);
    if (dt > bound_s)
        fail_once(3, "%s: the error came after %.1f s, more than %.1f s",
                  what, dt, bound_s);
    if (!reported_ok++)
        printf("rank %d: %s: %s (%d) after %.2f s: %s\n", rank, what,
               kolo_strerror(rc), rc, dt, msg);
}

/* Enqueues one small allreduce and waits: must fail. */
static void later_enqueue(const char *name)
{
    float x[4] = {1, 2, 3, 4};
    kolo_handle_t h;
    double t0 = now();
    int rc;

    phase("a later enqueue and its wait", (unsigned)bound_s + 5);
    rc = kolo_allreduce_async(name, x, x, 4, KOLO_FLOAT32, KOLO_OP_SUM, &h);
    reported_ok = 0;
    if (rc == KOLO_OK) {
        rc = kolo_wait(h);
        check_failed("later enqueue (its handle)", rc, kolo_last_error(), t0);
    } else {
        check_failed("later enqueue (refused)", rc, kolo_last_error(), t0);
    }
    alarm(0);
}

/* kolo_shutdown after a failure: returns promptly (its code is printed). */
static void survivor_shutdown(void)
{
    double t0 = now();
    int rc;
    phase("kolo_shutdown after the failure", 10);
    rc = kolo_shutdown();
    alarm(0);
    CHECK(now() - t0 < 5, "kolo_shutdown took %.1f s", now() - t0);
    CHECK(rc == KOLO_OK || rc < 0, "kolo_shutdown returned %d", rc);
    CHECK(!kolo_is_initialized(), "still initialized after kolo_shutdown");
    if (rc != KOLO_OK)
        printf("rank %d: kolo_shutdown after the failure returned %d: %s\n",
               rank, rc, kolo_last_error());
}

/* ---- the steps before the failure ------------------------------------------ */

enum { NT = 4, SMALL = 1000 };
static float small_buf[NT][SMALL];

static void fill_small(int step)
{
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < SMALL; i++)
            small_buf[t][i] = (float)((rank + 1) * (t + 1) + step + i % 7);
}

static int small_ok(int step)
{
    int bad = 0;
    for (int t = 0; t < NT && !bad; t++)
        for (int i = 0; i < SMALL && !bad; i++) {
            float expect = 0;
            for (int r = 0; r < size; r++)
                expect += (float)((r + 1) * (t + 1) + step + i % 7);
            if (small_buf[t][i] != expect) {
                CHECK(0, "step %d tensor %d [%d] = %g, expected %g", step, t,
                      i, small_buf[t][i], expect);
                bad = 1;
            }
        }
    return !bad;
}

static void enqueue_small(kolo_handle_t h[NT])
{
    for (int t = 0; t < NT; t++) {
        char name[32];
        snprintf(name, sizeof(name), "grad/%d", t);
        MUST(kolo_allreduce_async(name, small_buf[t], small_buf[t], SMALL,
                                  KOLO_FLOAT32, KOLO_OP_SUM, &h[t]));
    }
}

/* Steps 0..n-1 of the small tensors, all of which must succeed. */
static void small_steps(int n)
{
    kolo_handle_t h[NT];
    phase("the steps before the failure", 30);
    for (int step = 0; step < n; step++) {
        fill_small(step);
        enqueue_small(h);
        for (int t = 0; t < NT; t++)
            MUST(kolo_wait(h[t]));
        small_ok(step);
    }
    alarm(0);
}

static void die(void)
{
    printf("rank %d: victim: SIGKILL to myself (pid %ld)\n", rank,
           (long)getpid());
    fflush(stdout);
    raise(SIGKILL);
}

/* ---- modes ----------------------------------------------------------------- */

/* A survivor's step after the failure: enqueues the small tensors of
 * `step`, then waits for them. Each enqueue may already be refused (the
 * failure is known), which is as good as a handle that fails; each handle
 * must fail. */
static void step_after_failure(int step, const char *label)
{
    kolo_handle_t h[NT];
    int rc[NT];
    char what[128];
    double t0;

    phase(label, (unsigned)bound_s + 5);
    fill_small(step);
    t0 = now();
    for (int t = 0; t < NT; t++) {
        char name[32];
        snprintf(name, sizeof(name), "grad/%d", t);
        h[t] = 0;
        rc[t] = kolo_allreduce_async(name, small_buf[t], small_buf[t], SMALL,
                                     KOLO_FLOAT32, KOLO_OP_SUM, &h[t]);
        if (rc[t] != KOLO_OK) {
            snprintf(what, sizeof(what), "%s: enqueue of grad/%d (refused)",
                     label, t);
            check_failed(what, rc[t], kolo_last_error(), t0);
        }
    }
    for (int t = 0; t < NT; t++)
        if (rc[t] == KOLO_OK) {
            int w = kolo_wait(h[t]);
            snprintf(what, sizeof(what), "%s: pending handle of grad/%d",
                     label, t);
            check_failed(what, w, kolo_last_error(), t0);
        }
    alarm(0);
}

/* After step N, the victim dies (or exits); the others enqueue step N+1. */
static void mode_between(int by_exit)
{
    enum { N = 3 };

    small_steps(N);
    if (rank == victim) {
        if (by_exit) {
            printf("rank %d: victim: exit(0) without kolo_shutdown\n", rank);
            fflush(stdout);
            exit(0);
        }
        die();
    }
    step_after_failure(N, "step N+1");
    later_enqueue("later/after-failure");
}

/* The victim dies while every rank is inside a large allreduce. */
static void mode_midcoll(double fraction)
{
    const int64_t count = 16 * 1024 * 1024;
    float *in = malloc((size_t)count * sizeof(float));
    float *out = malloc((size_t)count * sizeof(float));
    kolo_handle_t h;
    double t_step = 0, t0;
    int rc;

    if (in == NULL || out == NULL) {
        fprintf(stderr, "rank %d: FAIL out of memory\n", rank);
        exit(1);
    }
    for (int64_t i = 0; i < count; i++)
        in[i] = 1.0f;
    /* Two full steps: the second measures how long one takes. */
    phase("the large allreduces before the failure", 60);
    for (int step = 0; step < 2; step++) {
        memset(out, 0, (size_t)count * sizeof(float));
        t0 = now();
        MUST(kolo_allreduce_async("big", in, out, count, KOLO_FLOAT32,
                                  KOLO_OP_SUM, &h));
        MUST(kolo_wait(h));
        t_step = now() - t0;
        for (int64_t i = 0; i < count; i++)
            if (out[i] != (float)size) {
                CHECK(0, "big step %d [%lld] = %g, expected %d", step,
                      (long long)i, out[i], size);
                break;
            }
    }
    alarm(0);

    phase("the large allreduce during which the victim dies",
          (unsigned)bound_s + 5);
    memset(out, 0, (size_t)count * sizeof(float));
    t0 = now();
    rc = kolo_allreduce_async("big", in, out, count, KOLO_FLOAT32, KOLO_OP_SUM,
                              &h);
    if (rank == victim) {
        /* With the default 0.1: early enough that it has not sent its
         * share yet (the copy into the fusion buffer alone takes longer),
         * late enough that the others have usually begun. Later (0.5), the
         * others are usually sending to it when it dies. */
        usleep((useconds_t)(t_step * fraction * 1e6));
        printf("rank %d: victim: one large allreduce took %.3f s; dying %.3f "
               "s into the next\n", rank, t_step, t_step * fraction);
        die();
    }
    if (rc == KOLO_OK) {
        rc = kolo_wait(h);
        if (rc == KOLO_OK) {
            /* Possible only if the victim had sent everything this rank
             * needed before it died: then the result must be right. */
            int64_t i = 0;
            while (i < count && out[i] == (float)size)
                i++;
            CHECK(i == count, "the large allreduce succeeded without rank %d, "
                  "but [%lld] = %g, expected %d", victim, (long long)i,
                  i < count ? out[i] : 0.0f, size);
            printf("rank %d: the large allreduce completed (correctly) before "
                   "rank %d died\n", rank, victim);
        } else {
            check_failed("large allreduce (pending handle)", rc,
                         kolo_last_error(), t0);
        }
    } else {
        check_failed("large allreduce (refused)", rc, kolo_last_error(), t0);
    }
    alarm(0);
    later_enqueue("later/after-failure");
    free(in);
    free(out);
}

static void mode_stop(void)
{
    const char *dir = getenv("FT_DIR");

    small_steps(2);
    if (rank == victim) {
        char path[4096];
        FILE *f;
        kolo_handle_t h[NT];
        double t0;
        int bad = 0;
        snprintf(path, sizeof(path), "%s/victim.pid", dir ? dir : ".");
        f = fopen(path, "w");
        if (f != NULL) {
            fprintf(f, "%ld\n", (long)getpid());
            fclose(f);
        }
        printf("rank %d: victim: SIGSTOP to myself (pid %ld)\n", rank,
               (long)getpid());
        fflush(stdout);
        raise(SIGSTOP);
        /* Resumed: the others are gone. The next step must fail too, and
         * within the bound: a rank that hung must not hang forever after. */
        t0 = now();
        phase("the resumed victim's next step", (unsigned)bound_s + 5);
        fill_small(2);
        for (int t = 0; t < NT; t++) {
            char name[32];
            int rc;
            snprintf(name, sizeof(name), "grad/%d", t);
            rc = kolo_allreduce_async(name, small_buf[t], small_buf[t], SMALL,
                                      KOLO_FLOAT32, KOLO_OP_SUM, &h[t]);
            if (rc == KOLO_OK)
                rc = kolo_wait(h[t]);
            if (rc >= 0)
                bad = 1;
            printf("rank %d: resumed victim: step 2 tensor %d: %d after %.2f "
                   "s: %s\n", rank, t, rc, now() - t0,
                   rc < 0 ? kolo_last_error() : "(succeeded)");
        }
        alarm(0);
        printf("rank %d: resumed victim: %s\n", rank,
               bad ? "FAIL: a step succeeded without the other ranks"
                   : "its step failed, as it must; exiting with status 1");
        fflush(stdout);
        exit(1);
    }
    step_after_failure(2, "step 2 while the victim is stopped");
    later_enqueue("later/after-failure");
}

static void mode_init(void)
{
    resources_t before;
    double t0;
    int rc;
    float x = 1;
    kolo_handle_t h;

    resources_take(&before);
    t0 = now();
    phase("kolo_init with a rank missing", (unsigned)bound_s + 5);
    rc = kolo_init();
    alarm(0);
    if (rc == KOLO_OK) {
        CHECK(0, "kolo_init succeeded without rank %d", victim);
        return;
    }
    /* The rendezvous names who never arrived; the code says it timed out
     * (or that a rank was lost). */
    CHECK(rc == KOLO_ERR_TIMEOUT || rc == KOLO_ERR_RANK_LOST,
          "kolo_init: unexpected code %d (%s): %s", rc, kolo_strerror(rc),
          kolo_last_error());
    CHECK(names_rank(kolo_last_error(), victim),
          "kolo_init: the message does not name rank %d: %s", victim,
          kolo_last_error());
    CHECK(now() - t0 <= bound_s, "kolo_init failed after %.1f s (bound %.1f s)",
          now() - t0, bound_s);
    printf("rank %d: kolo_init: %s (%d) after %.2f s: %s\n", rank,
           kolo_strerror(rc), rc, now() - t0, kolo_last_error());
    CHECK(!kolo_is_initialized() && kolo_rank() == -1,
          "initialized after a failed kolo_init");
    rc = kolo_allreduce_async("later", &x, &x, 1, KOLO_FLOAT32, KOLO_OP_SUM, &h);
    CHECK(rc == KOLO_ERR_NOT_INITIALIZED,
          "enqueue after a failed kolo_init: %d (%s)", rc, kolo_last_error());
    CHECK(kolo_shutdown() == KOLO_ERR_NOT_INITIALIZED,
          "kolo_shutdown after a failed kolo_init did not say so");
    resources_compare(&before, "after the failed kolo_init");
}

static void mode_cycles(int n)
{
    resources_t before, after_one;
    float x[8];

    resources_take(&before);
    for (int c = 0; c < n; c++) {
        kolo_handle_t h;
        phase("an init/allreduce/shutdown cycle", 30);
        MUST(kolo_init());
        rank = kolo_rank();
        size = kolo_size();
        for (int i = 0; i < 8; i++)
            x[i] = (float)(rank + i + c);
        MUST(kolo_allreduce_async("cycle", x, x, 8, KOLO_FLOAT32, KOLO_OP_SUM,
                                  &h));
        MUST(kolo_wait(h));
        for (int i = 0; i < 8; i++)
            CHECK(x[i] == (float)(size * (size - 1) / 2 + size * (i + c)),
                  "cycle %d x[%d] = %g", c, i, x[i]);
        MUST(kolo_shutdown());
        alarm(0);
        if (c == 0)
            resources_take(&after_one);
    }
    printf("rank %d: fds %d before, %d after 1 cycle; threads %d before, %d "
           "after 1 cycle\n", rank, before.fds, after_one.fds, before.threads,
           after_one.threads);
    resources_compare(&before, "after the init/shutdown cycles");
}

int main(int argc, char **argv)
{
    resources_t before;
    const char *dir = getenv("FT_DIR");

    mode = argc > 1 ? argv[1] : "between";
    signal(SIGALRM, tu_on_alarm);
    setvbuf(stdout, NULL, _IOLBF, 0);
    rank = (int)env_double("KOLO_RANK", 0);
    size = (int)env_double("KOLO_SIZE", 1);
    victim = argc > 2 ? atoi(argv[2]) : size - 1;
    if (dir != NULL) {
        char path[4096];
        FILE *f;
        snprintf(path, sizeof(path), "%s/pid.%d", dir, rank);
        if ((f = fopen(path, "w")) != NULL) {
            fprintf(f, "%ld\n", (long)getpid());
            fclose(f);
        }
    }
    bound_s = env_double("KOLO_TIMEOUT_SECONDS", 60) + 3;

    if (strcmp(mode, "cycles") == 0) {
        mode_cycles(argc > 2 ? atoi(argv[2]) : 20);
        goto done;
    }
    if (strcmp(mode, "init") == 0) {
        if (rank == victim)
            die();
        /* The rendezvous gives up after the start timeout; a second and a
         * half covers the scheduling of a busy machine. */
        bound_s = env_double("KOLO_START_TIMEOUT", 60) + 1.5;
        mode_init();
        goto done;
    }
    resources_take(&before);
    phase("kolo_init", 30);
    MUST(kolo_init());
    alarm(0);
    rank = kolo_rank();
    size = kolo_size();

    if (strcmp(mode, "midcoll") == 0)
        mode_midcoll(argc > 3 ? atof(argv[3])
                              : env_double("FT_KILL_FRACTION", 0.1));
    else if (strcmp(mode, "between") == 0)
        mode_between(0);
    else if (strcmp(mode, "exit") == 0)
        mode_between(1);
    else if (strcmp(mode, "stop") == 0)
        mode_stop();
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    survivor_shutdown();
    resources_compare(&before, "after the failure and kolo_shutdown");
done:
    if (failures) {
        fprintf(stderr, "rank %d: %s victim=%d: %d failures\n", rank, mode,
                victim, failures);
        return 1;
    }
    if (strcmp(mode, "cycles") == 0)
        printf("rank %d of %d: PASS cycles\n", rank, size);
    else
        printf("rank %d of %d: PASS %s victim=%d\n", rank, size, mode, victim);
    return 0;
}
