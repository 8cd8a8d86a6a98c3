/*
 * mpienv.c — what a job started by `mpirun -np N prog` learns from MPI.
 * Part of the MPI backend (built when kolo has MPI); the runtime calls it
 * through runtime/mpienv.h, which names no MPI type.
 *
 * Without kolorun there are no KOLO_RANK and KOLO_SIZE; the launcher's own
 * variables say that MPI started the process (kolo__launchenv_mpi,
 * runtime/launchenv.c, which needs no MPI). kolo_init (api.c) then calls
 * kolo__mpienv_start, which initialises MPI (or adopts the program's MPI)
 * and reads the job's shape from it: rank and size from MPI_COMM_WORLD, the
 * local rank and size from the shared-memory split (one communicator per
 * node), the cross rank and size from a split by local rank. The runtime
 * needs a job-unique rendezvous string; rank 0 draws a token and
 * broadcasts it ("mpi:TOKEN"), or, when a Gloo backend was asked for, makes
 * a rendezvous directory (Gloo meets through files) and broadcasts its path.
 *
 * All of this runs on the API thread inside kolo_init, on a private
 * duplicate of MPI_COMM_WORLD, so it never mixes with the program's own
 * messages. MPI cannot be initialised again once finalized, so MPI stays up
 * across kolo_shutdown and kolo_init; the atexit handler registered here,
 * which runs after kolo's own shutdown-at-exit, removes the directory and
 * finalizes MPI when kolo was the one that initialised it.
 */
#define _GNU_SOURCE /* nftw */
#include "config.h"

#include "mpienv.h"
#include "ops.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <mpi.h>

static MPI_Comm g_comm = MPI_COMM_NULL; /* kolo's duplicate of the world */
static int g_we_initialised;
static char g_dir[4096]; /* the rendezvous directory rank 0 made, or "" */
static int g_dir_owner;  /* rank 0: removes it at exit */
static char g_token[64];

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void mpienv_at_exit(void)
{
    int finalized = 0;

    MPI_Finalized(&finalized);
    /* Every rank must be done with the directory before rank 0 removes it
     * (when MPI is still up to say so). */
    if (!finalized && g_comm != MPI_COMM_NULL)
        MPI_Barrier(g_comm);
    if (g_dir_owner)
        nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (!finalized && g_comm != MPI_COMM_NULL)
        MPI_Comm_free(&g_comm);
    if (!finalized && g_we_initialised)
        MPI_Finalize();
}

static int mpi_error(int mrc, const char *what, char *err, size_t errlen)
{
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;

    if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS)
        len = snprintf(msg, sizeof(msg), "MPI error %d", mrc);
    msg[len] = '\0';
    return kolo__ops_fail(err, errlen, KOLO_ERR_BACKEND, "%s failed: %s", what, msg);
}

#define MPI_TRY(what, call)                                             \
    do {                                                                \
        int mrc_ = (call);                                              \
        if (mrc_ != MPI_SUCCESS)                                        \
            return mpi_error(mrc_, (what), err, errlen);                        \
    } while (0)

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
    }
}

/* MPI itself, once per process. */
static int mpienv_init_mpi(char *err, size_t errlen)
{
    int inited = 0, finalized = 0, level = 0;

    MPI_Finalized(&finalized);
    if (finalized)
        return kolo__ops_fail(err, errlen, KOLO_ERR_UNSUPPORTED,
                             "kolo_init under mpirun: MPI was already "
                             "finalized in this process, and MPI cannot be "
                             "initialised again (call kolo_init before "
                             "MPI_Finalize)");
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_TRY("MPI_Init_thread",
                MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level));
        g_we_initialised = 1;
        if (level < MPI_THREAD_MULTIPLE)
            return kolo__ops_fail(err, errlen, KOLO_ERR_UNSUPPORTED,
                                 "kolo needs MPI_THREAD_MULTIPLE (every "
                                 "process set's thread calls MPI), but this "
                                 "MPI provides only %s", level_name(level));
    } else {
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_MULTIPLE)
            return kolo__ops_fail(err, errlen, KOLO_ERR_UNSUPPORTED,
                                 "the program initialised MPI at %s, but "
                                 "kolo needs MPI_THREAD_MULTIPLE: call "
                                 "MPI_Init_thread(&argc, &argv, "
                                 "MPI_THREAD_MULTIPLE, &provided) instead of "
                                 "MPI_Init, or let kolo_init initialise MPI",
                                 level_name(level));
    }
    if (g_comm == MPI_COMM_NULL) {
        MPI_TRY("MPI_Comm_dup of MPI_COMM_WORLD",
                MPI_Comm_dup(MPI_COMM_WORLD, &g_comm));
        MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
        if (atexit(mpienv_at_exit) != 0)
            return kolo__ops_fail(err, errlen, KOLO_ERR_INTERNAL,
                                 "cannot register MPI's finalization at exit");
    }
    return KOLO_OK;
}

/* The job's shape: rank and size in the world, on this node (the
 * shared-memory split) and across nodes (a split by local rank). */
static int mpienv_shape(kolo__mpienv_t *out, char *err, size_t errlen)
{
    MPI_Comm local, cross;

    MPI_Comm_rank(g_comm, &out->rank);
    MPI_Comm_size(g_comm, &out->size);
    MPI_TRY("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)",
            MPI_Comm_split_type(g_comm, MPI_COMM_TYPE_SHARED, out->rank,
                                MPI_INFO_NULL, &local));
    MPI_Comm_rank(local, &out->local_rank);
    MPI_Comm_size(local, &out->local_size);
    MPI_Comm_free(&local);
    MPI_TRY("MPI_Comm_split by local rank",
            MPI_Comm_split(g_comm, out->local_rank, out->rank, &cross));
    MPI_Comm_rank(cross, &out->cross_rank);
    MPI_Comm_size(cross, &out->cross_size);
    MPI_Comm_free(&cross);
    return KOLO_OK;
}

/* The job's token, drawn by rank 0 and broadcast, once per process. */
static int mpienv_token(const kolo__mpienv_t *out, char *err, size_t errlen)
{
    char buf[64];

    if (g_token[0] != '\0')
        return KOLO_OK;
    memset(buf, 0, sizeof(buf));
    if (out->rank == 0) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        snprintf(buf, sizeof(buf), "%lx-%lx-%lx", (long)getpid(),
                 (long)tv.tv_sec, (long)tv.tv_usec);
    }
    MPI_TRY("MPI_Bcast of the job's token",
            MPI_Bcast(buf, 64, MPI_CHAR, 0, g_comm));
    buf[sizeof(g_token) - 1] = '\0';
    memcpy(g_token, buf, sizeof(g_token));
    return KOLO_OK;
}

/* The rendezvous directory for Gloo, which meets through files: rank 0
 * makes it and broadcasts its path (every rank must be on its host). */
static int mpienv_make_dir(const kolo__mpienv_t *out, char *err, size_t errlen)
{
    char buf[4096 + 1];
    int bad = 0, any_bad = 0, hosts = out->size / out->local_size;

    memset(buf, 0, sizeof(buf));
    bad = out->local_size != out->size;
    MPI_TRY("MPI_Allreduce", MPI_Allreduce(&bad, &any_bad, 1, MPI_INT,
                                           MPI_MAX, g_comm));
    if (any_bad)
        return kolo__ops_fail(err, errlen, KOLO_ERR_CONFIG,
                             "KOLO_CONTROLLER or KOLO_CPU_OPERATIONS asks "
                             "for gloo under mpirun, and the ranks span "
                             "about %d hosts: Gloo needs a rendezvous "
                             "directory that every host shares; set "
                             "KOLO_RENDEZVOUS=file:DIR on a shared file "
                             "system, or use the mpi backend",
                             hosts > 1 ? hosts : 2);
    if (out->rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(buf, sizeof(buf), "%s/kolo-mpi-XXXXXX",
                 tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
        if (mkdtemp(buf) == NULL)
            buf[0] = '\0';
    }
    MPI_TRY("MPI_Bcast of the rendezvous directory",
            MPI_Bcast(buf, 4096, MPI_CHAR, 0, g_comm));
    if (buf[0] == '\0')
        return kolo__ops_fail(err, errlen, KOLO_ERR_CONFIG,
                             "rank 0 could not create a rendezvous "
                             "directory for Gloo under mpirun (in "
                             "$TMPDIR or /tmp); set KOLO_RENDEZVOUS="
                             "file:DIR");
    g_dir_owner = out->rank == 0;
    buf[4000] = '\0';
    snprintf(g_dir, sizeof(g_dir), "%s", buf);
    return KOLO_OK;
}

int kolo__mpienv_start(int need_dir, kolo__mpienv_t *out, char *err, size_t errlen)
{
    int any = need_dir, rc;

    memset(out, 0, sizeof(*out));
    if ((rc = mpienv_init_mpi(err, errlen)) != KOLO_OK ||
        (rc = mpienv_shape(out, err, errlen)) != KOLO_OK ||
        (rc = mpienv_token(out, err, errlen)) != KOLO_OK)
        return rc;
    /* Every rank must take the same branch below (its calls are
     * collective), even when only some ranks asked for Gloo: the settings
     * check in kolo_init then names the difference. */
    MPI_TRY("MPI_Allreduce", MPI_Allreduce(&need_dir, &any, 1, MPI_INT,
                                           MPI_MAX, g_comm));
    if (any && g_dir[0] == '\0' &&
        (rc = mpienv_make_dir(out, err, errlen)) != KOLO_OK)
        return rc;
    if (any)
        snprintf(out->rendezvous, sizeof(out->rendezvous), "file:%.4000s", g_dir);
    else
        snprintf(out->rendezvous, sizeof(out->rendezvous), "mpi:%s", g_token);
    return KOLO_OK;
}

int kolo__mpienv_allgather(const char *mine, size_t each, char *all,
                           char *err, size_t errlen)
{
    if (g_comm == MPI_COMM_NULL)
        return kolo__ops_fail(err, errlen, KOLO_ERR_INTERNAL, "MPI is not started");
    MPI_TRY("MPI_Allgather", MPI_Allgather(mine, (int)each, MPI_CHAR, all,
                                           (int)each, MPI_CHAR, g_comm));
    return KOLO_OK;
}
