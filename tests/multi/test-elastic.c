/*
 * test-elastic.c — one worker of an elastic job, following the life cycle
 * kolo.h documents: kolo_init joins a generation, a lost rank fails the
 * step with KOLO_ERR_MEMBERSHIP (restore the last commit, re-form), a
 * published scaling change is seen at the commit by kolo_hosts_updated
 * (re-form without restoring), a worker the newest generation leaves out
 * gets KOLO_ERR_REMOVED from kolo_init.
 *
 *   test-elastic STEPS [PAUSE_MS]
 *
 * The state is a step counter and a vector w of 4 doubles. Each step every
 * rank adds its rank + 1 to a copy of w and the copies are averaged
 * (allreduce AVERAGE), so after a step every element of w grows by
 * (size + 1) / 2 — a value each rank computes itself and checks exactly
 * (small integers and halves are exact in double). The step is then
 * committed. PAUSE_MS before each step leaves the driver time to act. After a re-form, rank 0's committed state is broadcast.
 *
 * Cues from the test driver (TEST_DIR): a file kill.<id>.<step> makes this
 * worker SIGKILL itself before that step's allreduce; this worker writes
 * its committed step to progress.<id> after each commit. Output lines, for
 * the driver: "JOIN id gen rank size", "LOST id step", "UPDATED id bits",
 * "REMOVED id", "DONE id step w0 gen size". Exit status 0, or 1 with a
 * line "FAIL id: why".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kolo.h"

static const char *id;
static const char *dir;

#define FAIL(...)                                                            \
    do {                                                                     \
        printf("FAIL %s: ", id);                                             \
        printf(__VA_ARGS__);                                                 \
        printf("\n");                                                        \
        fflush(stdout);                                                      \
        exit(1);                                                             \
    } while (0)

typedef struct state {
    double step;
    double w[4];
} state_t;

static int exists(const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void progress(int step)
{
    char path[4096], tmp[4200];
    FILE *f;
    snprintf(path, sizeof(path), "%s/progress.%s", dir, id);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if ((f = fopen(tmp, "w")) == NULL)
        FAIL("cannot write %s", tmp);
    fprintf(f, "%d\n", step);
    fclose(f);
    rename(tmp, path);
}

/* kolo_init, again while a newer generation overtook the one it joined;
 * then rank 0's committed state reaches every rank. 0, or 1: removed. */
static int join(state_t *committed, state_t *live)
{
    kolo_handle_t h;
    int rc;

    while ((rc = kolo_init()) == KOLO_ERR_MEMBERSHIP)
        ;
    if (rc == KOLO_ERR_REMOVED) {
        printf("REMOVED %s\n", id);
        fflush(stdout);
        return 1;
    }
    if (rc != KOLO_OK)
        FAIL("kolo_init: %s: %s", kolo_strerror(rc), kolo_last_error());
    if (kolo_elastic() != 1 || kolo_elastic_generation() < 1)
        FAIL("kolo_elastic %d, generation %d", kolo_elastic(),
             kolo_elastic_generation());
    printf("JOIN %s %d %d %d\n", id, kolo_elastic_generation(), kolo_rank(),
           kolo_size());
    fflush(stdout);
    rc = kolo_broadcast_async("state", committed, 5, KOLO_FLOAT64, 0, NULL, &h);
    if (rc == KOLO_OK)
        rc = kolo_wait(h);
    if (rc != KOLO_OK)
        FAIL("broadcast of the state: %s", kolo_last_error());
    *live = *committed;
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 10;
    long pause_us = argc > 2 ? atol(argv[2]) * 1000 : 0;
    state_t committed = {0, {0, 0, 0, 0}}, live;
    char cue[512];

    id = getenv("KOLO_ELASTIC_ID");
    dir = getenv("TEST_DIR");
    if (id == NULL || dir == NULL)
        FAIL("KOLO_ELASTIC_ID and TEST_DIR must be set");
    if (join(&committed, &live))
        return 0;
    while (live.step < steps) {
        int size = kolo_size(), rank = kolo_rank(), rc, bits;
        double g[4], want;
        kolo_handle_t h;

        if (pause_us > 0)
            usleep((useconds_t)pause_us); /* time for the driver's cues */
        snprintf(cue, sizeof(cue), "kill.%s.%d", id, (int)live.step);
        if (exists(cue))
            raise(SIGKILL);
        for (int i = 0; i < 4; i++)
            g[i] = live.w[i] + rank + 1;
        rc = kolo_allreduce_async("grad", g, g, 4, KOLO_FLOAT64, KOLO_OP_AVERAGE, &h);
        if (rc == KOLO_OK)
            rc = kolo_wait(h);
        if (rc == KOLO_ERR_MEMBERSHIP) {
            /* A rank was lost: back to the last commit, then re-form. */
            printf("LOST %s %d\n", id, (int)live.step);
            fflush(stdout);
            live = committed;
            kolo_shutdown();
            if (join(&committed, &live))
                return 0;
            continue;
        }
        if (rc != KOLO_OK)
            FAIL("step %d: allreduce: %s (%s)", (int)live.step,
                 kolo_strerror(rc), kolo_last_error());
        want = (size + 1) / 2.0;
        for (int i = 0; i < 4; i++) {
            if (g[i] != live.w[i] + want)
                FAIL("step %d: w[%d] = %g, expected %g at %d ranks",
                     (int)live.step, i, g[i], live.w[i] + want, size);
            live.w[i] = g[i];
        }
        live.step++;
        committed = live;
        progress((int)live.step);
        /* The commit asks whether hosts changed; rank 0's answer counts. */
        bits = kolo_hosts_updated();
        if (bits < 0)
            FAIL("kolo_hosts_updated: %s", kolo_strerror(bits));
        rc = kolo_broadcast_async("updated", &bits, 1, KOLO_INT32, 0, NULL, &h);
        if (rc == KOLO_OK)
            rc = kolo_wait(h);
        if (rc == KOLO_ERR_MEMBERSHIP) {
            printf("LOST %s %d\n", id, (int)live.step);
            fflush(stdout);
            kolo_shutdown();
            if (join(&committed, &live))
                return 0;
            continue;
        }
        if (rc != KOLO_OK)
            FAIL("broadcast of the update: %s", kolo_last_error());
        if (bits != 0) {
            printf("UPDATED %s %d\n", id, bits);
            fflush(stdout);
            kolo_shutdown();
            if (join(&committed, &live))
                return 0;
        }
    }
    printf("DONE %s %d %g %d %d\n", id, (int)live.step, live.w[0],
           kolo_elastic_generation(), kolo_size());
    fflush(stdout);
    kolo_shutdown();
    return 0;
}
