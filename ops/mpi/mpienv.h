/*
 * mpienv.h — a job started by mpirun (or srun) without kolorun: the runtime
 * takes the ranks from MPI itself, through this part of the MPI backend
 * (mpienv.c, built when kolo has MPI), which the runtime calls as it calls
 * the backends below it. It names no MPI type, so the runtime never
 * includes mpi.h; failures write one sentence to err, as the ops tables'
 * slots do. Whether an MPI launcher started the process at all is
 * kolo__launchenv_mpi (runtime/launchenv.h), which needs no MPI.
 */
#ifndef KOLO_MPIENV_H
#define KOLO_MPIENV_H

#include <stddef.h>

#include "kolo.h"

typedef struct kolo__mpienv {
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    char rendezvous[4096]; /* "mpi:TOKEN", or "file:DIR" when asked for */
} kolo__mpienv_t;

#ifdef KOLO_HAVE_MPI
/* Initialises MPI at MPI_THREAD_MULTIPLE unless the program already did
 * (then checks its thread level and leaves it to the program to finalize),
 * and describes the job. need_dir: a Gloo backend was asked for, so the
 * rendezvous must be a directory: rank 0 creates one (every rank must be on
 * one host) and broadcasts its path. MPI stays initialised until the
 * process exits (MPI cannot be initialised twice), when an atexit handler
 * removes that directory and finalizes MPI if kolo initialised it. */
int kolo__mpienv_start(int need_dir, kolo__mpienv_t *out, char *err,
                       size_t errlen);
/* Gathers each rank's `each` bytes into all[size * each], in rank order,
 * over kolo's duplicate of MPI_COMM_WORLD (after kolo__mpienv_start). */
int kolo__mpienv_allgather(const char *mine, size_t each, char *all,
                           char *err, size_t errlen);
#endif

#endif /* KOLO_MPIENV_H */
