/*
 * test-mpi.c — kolo under mpirun, where MPI itself is the launcher:
 *
 *   placement      rank, size, local and cross rank/size come from MPI and
 *                  agree with MPI_COMM_WORLD and the launcher's variables;
 *                  kolo_enabled("mpi"); an allreduce; kolo_init again after
 *                  kolo_shutdown works (MPI stays initialised)
 *   own-multiple   the program calls MPI_Init_thread(MPI_THREAD_MULTIPLE)
 *                  first: kolo uses that MPI, and after kolo_shutdown the
 *                  program still uses MPI and finalizes it itself
 *   own-single     the program calls MPI_Init (one thread): kolo_init fails
 *                  with a message that asks for MPI_THREAD_MULTIPLE
 *
 * Run by tests/multi/run-mpi.sh; prints "rank R of N: PASS mode" and exits
 * 0, or names what was wrong and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "kolo.h"

static int g_bad;

#define EXPECT(cond, ...)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "rank %d: %s:%d: ", kolo_rank(), __FILE__,       \
                    __LINE__);                                               \
            fprintf(stderr, __VA_ARGS__);                                    \
            fputc('\n', stderr);                                             \
            g_bad++;                                                         \
        }                                                                    \
    } while (0)

/* Every rank contributes rank+1: the sum is n(n+1)/2. */
static void check_allreduce(const char *name)
{
    float v[3];
    kolo_handle_t h;
    int n = kolo_size();

    for (int i = 0; i < 3; i++)
        v[i] = (float)(kolo_rank() + 1);
    EXPECT(kolo_allreduce_async(name, v, v, 3, KOLO_FLOAT32, KOLO_OP_SUM,
                                &h) == KOLO_OK,
           "allreduce_async: %s", kolo_last_error());
    EXPECT(kolo_wait(h) == KOLO_OK, "wait: %s", kolo_last_error());
    for (int i = 0; i < 3; i++)
        EXPECT(v[i] == (float)(n * (n + 1) / 2), "allreduce %s: %g, not %d",
               name, (double)v[i], n * (n + 1) / 2);
}

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static int is_gloo(const char *var)
{
    const char *v = getenv(var);
    return v != NULL && strcmp(v, "gloo") == 0;
}

static void placement(void)
{
    int wrank = -1, wsize = -1, inited = 0;

    for (int round = 0; round < 2; round++) {
        EXPECT(kolo_init() == KOLO_OK, "kolo_init (round %d): %s", round,
               kolo_last_error());
        MPI_Initialized(&inited);
        EXPECT(inited, "kolo_init did not initialise MPI");
        MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
        MPI_Comm_size(MPI_COMM_WORLD, &wsize);
        EXPECT(kolo_rank() == wrank && kolo_size() == wsize,
               "kolo says rank %d of %d, MPI says %d of %d", kolo_rank(),
               kolo_size(), wrank, wsize);
        EXPECT(kolo_rank() == env_int("OMPI_COMM_WORLD_RANK"),
               "rank %d, OMPI_COMM_WORLD_RANK=%d", kolo_rank(),
               env_int("OMPI_COMM_WORLD_RANK"));
        /* One machine: every rank is local, one host. */
        EXPECT(kolo_local_rank() == env_int("OMPI_COMM_WORLD_LOCAL_RANK") &&
                   kolo_local_size() == env_int("OMPI_COMM_WORLD_LOCAL_SIZE"),
               "local %d of %d, Open MPI says %d of %d", kolo_local_rank(),
               kolo_local_size(), env_int("OMPI_COMM_WORLD_LOCAL_RANK"),
               env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
        EXPECT(kolo_cross_rank() == 0 && kolo_cross_size() == 1,
               "cross %d of %d on one host", kolo_cross_rank(),
               kolo_cross_size());
        /* MPI started the job: enabled, whatever carries the tensors. */
        EXPECT(kolo_enabled("mpi") == 1,
               "kolo_enabled(\"mpi\") = %d", kolo_enabled("mpi"));
        EXPECT(kolo_enabled("gloo") == (is_gloo("KOLO_CONTROLLER") ||
                                        is_gloo("KOLO_CPU_OPERATIONS")),
               "kolo_enabled(\"gloo\") = %d", kolo_enabled("gloo"));
        check_allreduce(round ? "placement/b" : "placement/a");
        EXPECT(kolo_shutdown() == KOLO_OK, "shutdown: %s", kolo_last_error());
    }
}

static void own_init(int multiple)
{
    int provided = -1, in, out = 0, finalized = 0;
    int rc;

    if (multiple)
        MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(NULL, NULL);
    rc = kolo_init();
    if (!multiple) {
        EXPECT(rc == KOLO_ERR_UNSUPPORTED, "kolo_init returned %d", rc);
        EXPECT(strstr(kolo_last_error(), "MPI_THREAD_MULTIPLE") != NULL,
               "message does not ask for MPI_THREAD_MULTIPLE: %s",
               kolo_last_error());
        MPI_Finalize();
        return;
    }
    EXPECT(rc == KOLO_OK, "kolo_init: %s", kolo_last_error());
    check_allreduce("own/a");
    EXPECT(kolo_shutdown() == KOLO_OK, "shutdown: %s", kolo_last_error());
    MPI_Finalized(&finalized);
    EXPECT(!finalized, "kolo_shutdown finalized the program's MPI");
    in = 1;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    EXPECT(out == size, "MPI_Allreduce after kolo_shutdown: %d, not %d", out,
           size);
    MPI_Finalize();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int rank = -1, size = -1;

    if (strcmp(mode, "placement") == 0)
        placement();
    else if (strcmp(mode, "own-multiple") == 0)
        own_init(1);
    else if (strcmp(mode, "own-single") == 0)
        own_init(0);
    else {
        fprintf(stderr, "usage: test-mpi placement|own-multiple|own-single\n");
        return 2;
    }
    rank = env_int("OMPI_COMM_WORLD_RANK");
    size = env_int("OMPI_COMM_WORLD_SIZE");
    if (g_bad)
        return 1;
    printf("rank %d of %d: PASS %s\n", rank, size, mode);
    return 0;
}
