/*
 * test-agree.c — what every rank must agree on before a backend connects
 * (runtime/agree.c), run under kolorun by tests/multi/run-agree.sh:
 *
 *   test-agree settings ok
 *       kolo_init must succeed; then 200 allreduces of sizes from 1 to
 *       100,000 floats, each checked against the sum every rank computes
 *       itself, so a rank that cuts work differently would show.
 *   test-agree settings fail VAR VALUE...
 *       kolo_init must fail on this rank with KOLO_ERR_CONFIG and a message
 *       that names VAR and every VALUE; kolo must stay uninitialized.
 *   test-agree sets
 *       each rank adds the process set AGREE_SET (its own "0,1" list, from
 *       the environment): when every rank asked for the same set it must
 *       work (an allreduce among its members); when they differ, the add
 *       must fail on every rank with KOLO_ERR_INVALID_ARGUMENT, naming
 *       each list that was asked for, and no set is made (the next one
 *       gets id 1 everywhere). A global allreduce follows either way.
 *   test-agree setfull
 *       after kolo_init, rank 0 fills /dev/shm (the driver gives the job a
 *       private, small /dev/shm); then every rank adds the set of all
 *       ranks, whose shared memory cannot be reserved: the add must fail
 *       on every rank, members or not, with the member's reason ("/dev/shm
 *       full"), and at once: the driver sets KOLO_START_TIMEOUT far above
 *       its own bound, so waiting for the start timeout fails the test.
 *   test-agree initfail WORD
 *       kolo_init must fail on this rank with a message that holds WORD
 *       (the driver makes it fail: /dev/shm too small for the job).
 *   test-agree freeze SECONDS
 *       the last rank stops itself (SIGSTOP) for SECONDS (a child sends
 *       SIGCONT), while the others wait for it in an allreduce; then
 *       everyone goes on. The driver checks the others' stall warnings
 *       (KOLO_STALL_CHECK_TIME_SECONDS below SECONDS).
 *
 * Prints "rank R: PASS" at the end, or FAIL lines; exits 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "kolo.h"

static int rank = -1, failures;
#include "testutil.h"

#define MUST(call) TU_MUST(call, "rank %d: ", rank)

/* weight: the sum of (r + 1) over the set's members r. */
static void allreduce_check(int set, int weight, const char *tag, int n)
{
    float *x = malloc((size_t)n * sizeof(float));
    kolo_handle_t h;
    kolo_opts_t o;
    char name[64];
    int bad = 0;

    for (int i = 0; i < n; i++)
        x[i] = (float)(rank + 1) * (float)((i % 7) + 1);
    kolo_opts_init(&o);
    o.process_set = set;
    snprintf(name, sizeof(name), "%s.%d", tag, n);
    MUST(kolo_allreduce_async_opts(name, x, x, n, KOLO_FLOAT32, &o, &h));
    MUST(kolo_wait(h));
    for (int i = 0; i < n && !bad; i++) {
        /* Every member contributes (r + 1) * k: the sum is exact. */
        double want = (double)weight * ((i % 7) + 1);
        bad = x[i] != (float)want;
        CHECK(!bad, "%s: element %d is %g, expected %g", name, i, x[i], want);
    }
    free(x);
}

static int all_weight(void)
{
    return kolo_size() * (kolo_size() + 1) / 2;
}

static void mode_settings(int argc, char **argv)
{
    int rc = kolo_init();

    if (argc > 2 && strcmp(argv[2], "ok") == 0) {
        if (rc != KOLO_OK) {
            TU_FAIL_HERE("kolo_init failed: %d %s", rc, kolo_last_error());
            exit(1);
        }
        rank = kolo_rank();
        for (int i = 0; i < 200; i++)
            allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "ok",
                            1 + (int)(mix((uint64_t)i) % 100000));
        MUST(kolo_shutdown());
        return;
    }
    rank = atoi(getenv("KOLO_RANK") ? getenv("KOLO_RANK") : "-1");
    CHECK(rc == KOLO_ERR_CONFIG, "kolo_init returned %d (%s), expected "
          "KOLO_ERR_CONFIG: %s", rc, kolo_strerror(rc), kolo_last_error());
    for (int i = 3; i < argc; i++)
        CHECK(strstr(kolo_last_error(), argv[i]) != NULL,
              "the message does not name '%s': %s", argv[i], kolo_last_error());
    CHECK(!kolo_is_initialized(), "initialized after a failed kolo_init");
    printf("rank %d: kolo_init: %s\n", rank, kolo_last_error());
}

/* "0,1" -> ranks; returns how many. */
static int parse_set(const char *text, int *ranks)
{
    int n = 0;
    for (const char *p = text; *p; p++) {
        ranks[n++] = atoi(p);
        p += strcspn(p, ",");
        if (*p == '\0')
            break;
    }
    return n;
}

static void mode_sets(void)
{
    const char *mine = getenv("AGREE_SET"), *want = getenv("AGREE_EXPECT");
    int ranks[64], n, id = -1, rc, again;

    MUST(kolo_init());
    rank = kolo_rank();
    if (mine == NULL || want == NULL) {
        TU_FAIL_HERE("AGREE_SET and AGREE_EXPECT must be set");
        exit(1);
    }
    n = parse_set(mine, ranks);
    rc = kolo_add_process_set(ranks, n, &id);
    if (strcmp(want, "ok") == 0) {
        CHECK(rc == KOLO_OK, "kolo_add_process_set(%s): %d %s", mine, rc,
              kolo_last_error());
        int weight = 0, member = 0;
        for (int i = 0; i < n; i++) {
            weight += ranks[i] + 1;
            member |= ranks[i] == rank;
        }
        if (rc == KOLO_OK && member)
            allreduce_check(id, weight, "set", 1000);
    } else {
        CHECK(rc == KOLO_ERR_INVALID_ARGUMENT, "kolo_add_process_set(%s) "
              "returned %d (%s), expected KOLO_ERR_INVALID_ARGUMENT: %s", mine,
              rc, kolo_strerror(rc), kolo_last_error());
        CHECK(strstr(kolo_last_error(), mine) != NULL,
              "the message does not name this rank's set {%s}: %s", mine,
              kolo_last_error());
        printf("rank %d: kolo_add_process_set: %s\n", rank, kolo_last_error());
        /* Nothing was made: the next set is id 1 on every rank. */
        for (int i = 0; i < kolo_size(); i++)
            ranks[i] = i;
        MUST(kolo_add_process_set(ranks, kolo_size(), &again));
        CHECK(again == 1, "the next set has id %d, expected 1", again);
    }
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "global", 4096);
    MUST(kolo_shutdown());
}

static void mode_setfull(void)
{
    const char *fill = "/dev/shm/test-agree-fill";
    int ranks[64], id = -1, rc;

    MUST(kolo_init());
    rank = kolo_rank();
    if (rank == 0) {
        static char block[65536];
        int fd = open(fill, O_CREAT | O_WRONLY | O_TRUNC, 0600);
        CHECK(fd >= 0, "cannot create %s: %s", fill, strerror(errno));
        while (fd >= 0 && write(fd, block, sizeof(block)) > 0)
            ;
        if (fd >= 0)
            close(fd);
    }
    /* Every rank fills its part only after rank 0's file is full. */
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "filled", 16);
    for (int i = 0; i < kolo_size(); i++)
        ranks[i] = i;
    rc = kolo_add_process_set(ranks, kolo_size() > 2 ? 2 : kolo_size(), &id);
    CHECK(rc != KOLO_OK, "kolo_add_process_set succeeded with /dev/shm full");
    CHECK(strstr(kolo_last_error(), "/dev/shm") != NULL,
          "the message does not give the member's reason: %s",
          kolo_last_error());
    printf("rank %d: kolo_add_process_set: %s (%d)\n", rank, kolo_last_error(),
           rc);
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "after", 16);
    if (rank == 0)
        unlink(fill);
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "freed", 16);
    /* With room again, the same set can be made. */
    rc = kolo_add_process_set(ranks, kolo_size() > 2 ? 2 : kolo_size(), &id);
    CHECK(rc == KOLO_OK, "kolo_add_process_set after freeing /dev/shm: %d %s",
          rc, kolo_last_error());
    MUST(kolo_shutdown());
}

static void mode_initfail(const char *word)
{
    int rc = kolo_init();

    rank = atoi(getenv("KOLO_RANK") ? getenv("KOLO_RANK") : "-1");
    CHECK(rc != KOLO_OK, "kolo_init succeeded");
    CHECK(strstr(kolo_last_error(), word) != NULL,
          "the message does not say '%s': %s", word, kolo_last_error());
    CHECK(strstr(kolo_last_error(), "never arrived") == NULL,
          "the message blames ranks that arrived: %s", kolo_last_error());
    printf("rank %d: kolo_init: %s\n", rank, kolo_last_error());
}

static void mode_freeze(double seconds)
{
    MUST(kolo_init());
    rank = kolo_rank();
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "before", 64);
    if (rank == kolo_size() - 1) {
        pid_t me = getpid();
        if (fork() == 0) {
            usleep((useconds_t)(seconds * 1e6));
            kill(me, SIGCONT);
            _exit(0);
        }
        alarm(0); /* the watchdog's clock would run while stopped */
        raise(SIGSTOP);
        tu_watchdog(rank, "freeze", "after the freeze", 60);
    }
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "during", 64);
    allreduce_check(KOLO_GLOBAL_PROCESS_SET, all_weight(), "after", 64);
    MUST(kolo_shutdown());
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";

    signal(SIGALRM, tu_on_alarm);
    tu_watchdog(atoi(getenv("KOLO_RANK") ? getenv("KOLO_RANK") : "-1"), mode,
                "the whole test", 120);
    if (strcmp(mode, "settings") == 0)
        mode_settings(argc, argv);
    else if (strcmp(mode, "sets") == 0)
        mode_sets();
    else if (strcmp(mode, "setfull") == 0)
        mode_setfull();
    else if (strcmp(mode, "initfail") == 0 && argc > 2)
        mode_initfail(argv[2]);
    else if (strcmp(mode, "freeze") == 0 && argc > 2)
        mode_freeze(atof(argv[2]));
    else {
        fprintf(stderr, "usage: test-agree settings ok|fail VAR VALUE... | "
                "sets | setfull | initfail WORD | freeze SECONDS\n");
        return 2;
    }
    if (failures == 0)
        printf("rank %d: PASS\n", rank);
    return failures == 0 ? 0 : 1;
}
