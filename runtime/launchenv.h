/*
 * launchenv.h — a job started by torchrun or by Slurm's srun, without
 * kolorun and without MPI: where this process stands in it, and where its
 * ranks meet (design in launchenv.c); and whether an MPI launcher started
 * this process.
 */
#ifndef KOLO_LAUNCHENV_H
#define KOLO_LAUNCHENV_H

#include "common.h"

typedef struct kolo__launchenv {
    const char *launcher; /* "torchrun" or "srun", for messages */
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    /* The rendezvous that rank 0 serves (rdvserver.c), used when the user
     * names none (KOLO_RENDEZVOUS): redis:HOST:PORT/JOB. */
    char host[256];       /* where the others reach rank 0's server */
    int port;             /* its port */
    char job[100];        /* the job's name: torchrun-RUN-RESTART, srun-J.S */
    char rendezvous[600]; /* "redis:HOST:PORT/JOB" */
    char where[200];      /* how host and port were chosen, for messages:
                           * "MASTER_ADDR:MASTER_PORT+1", ... */
} kolo__launchenv_t;

/* Looks for a launcher's variables through getenv_fn, in this order:
 * torchrun (torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, with LOCAL_RANK, LOCAL_WORLD_SIZE and, when given,
 * GROUP_RANK, GROUP_WORLD_SIZE), then srun (SLURM_PROCID with
 * SLURM_STEP_ID: a task of a job step, not the batch script). Returns 1 and
 * fills *out when one placed this process, 0 when none did, or
 * KOLO_ERR_CONFIG with a message naming the variable that is missing or
 * wrong. */
int kolo__launchenv_detect(const char *(*getenv_fn)(const char *),
                           kolo__launchenv_t *out, kolo__err_t *err);

/* Writes redis:HOST:PORT/JOB (HOST in brackets where it is an IPv6
 * address) of le's host and job, on `port`, into buf of n bytes. */
void kolo__launchenv_rendezvous(const kolo__launchenv_t *le, int port,
                                char *buf, size_t n);

/* Whether an MPI launcher (mpirun, or srun with an MPI plugin) started this
 * process: one of its variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK,
 * ...) is set through getenv_fn. *size gets the job's size when the
 * launcher says it, else 0. Needs no MPI: a kolo built without MPI uses it
 * to refuse such a job (mpienv.h describes it from MPI). */
int kolo__launchenv_mpi(const char *(*getenv_fn)(const char *), int *size);

#endif /* KOLO_LAUNCHENV_H */
