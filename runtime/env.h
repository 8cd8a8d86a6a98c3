/*
 * env.h — the runtime's configuration, read from KOLO_* environment
 * variables through one table (env.c) that holds each variable's name,
 * default, documentation, parser and place in kolo__config_t.
 */
#ifndef KOLO_ENV_H
#define KOLO_ENV_H

#include <stdint.h>

#include "common.h"

typedef struct kolo__config {
    int64_t rank, size;
    int64_t local_rank, local_size;
    int64_t cross_rank, cross_size;
    char rendezvous[4096];   /* "file:DIR" or "redis:HOST:PORT[/JOB]";
                              * empty for a job of one rank */
    char hostname[256];      /* address the Gloo transport binds */
    char network_interface[64]; /* KOLO_NETWORK_INTERFACE: its address
                                 * becomes hostname; "" none */
    int64_t fusion_threshold; /* bytes */
    int64_t chunk_bytes;      /* reduction pieces; 0: whole batches; -1:
                               * auto (the data backend's choice) */
    double cycle_time_ms;
    int64_t cache_capacity;
    double timeout_s;
    double start_timeout_s;
    int64_t log_level;
    char timeline[4096];     /* KOLO_TIMELINE; "" off */
    int64_t timeline_mark_cycles, timeline_all_ranks;
    int64_t job_start_us;    /* set by kolorun: the timeline's time zero */
    int64_t stall_check_disable; /* KOLO_STALL_CHECK_DISABLE: the two
                                  * below are then 0 */
    double stall_check_s;    /* 0: off */
    double stall_shutdown_s; /* 0: off */
    double deadlock_check_s; /* KOLO_DEADLOCK_CHECK_SECONDS; 0: off */
    double straggler_share;  /* KOLO_STRAGGLER_SHARE; 0: off */
    char controller[16];     /* KOLO_CONTROLLER: auto, gloo, mpi, shm */
    char cpu_operations[16]; /* KOLO_CPU_OPERATIONS: auto, gloo, mpi, shm */
    int64_t hierarchical;    /* KOLO_HIERARCHICAL_ALLREDUCE: -1 auto, 0, 1 */
    int64_t mpi_launched;    /* started by mpirun/srun, not kolorun */
    int64_t shm_slot_bytes;  /* KOLO_SHM_SLOT_BYTES */
    int64_t shm_spin_us;     /* KOLO_SHM_SPIN_US */
    int64_t ring_send_buffer; /* KOLO_RING_SEND_BUFFER */
    int64_t autotune;        /* KOLO_AUTOTUNE */
    char autotune_log[4096]; /* KOLO_AUTOTUNE_LOG */
    int64_t autotune_window; /* KOLO_AUTOTUNE_WINDOW: rounds per window */
    int64_t elastic;         /* KOLO_ELASTIC: kolorun's elastic mode */
    char elastic_id[300];    /* KOLO_ELASTIC_ID: this worker's host:slot */
    double elastic_timeout_s; /* KOLO_ELASTIC_TIMEOUT */
    int64_t flight_recorder; /* KOLO_FLIGHT_RECORDER: records kept; 0 off */
    char flight_dir[4096];   /* KOLO_FLIGHT_DIR: where dumps go; "" none */
} kolo__config_t;

/* Reads every variable through `getenv_fn` (getenv in the runtime; a fake
 * in the tests). On a bad value returns KOLO_ERR_CONFIG with a message that
 * names the variable, the value and what was expected. */
int kolo__config_load(kolo__config_t *cfg, const char *(*getenv_fn)(const char *),
                      kolo__err_t *err);

/* Writes "NAME  default  doc" lines for every variable to `out` (FILE*). */
void kolo__config_print_doc(void *out);

/* Writes "NAME=value" lines for every setting that must be the same on
 * every rank, after a first line "kolo=BUILD" (version and build); returns
 * the length. kolo_init compares them across ranks (agree.c). */
size_t kolo__config_agreed(const kolo__config_t *cfg, const char *build,
                           char *out, size_t len);

/* Whether NAME is a KOLO_* variable kolo knows; the known setting closest
 * to a misspelled one, or NULL when none is close. */
int kolo__config_is_known(const char *name);
const char *kolo__config_closest(const char *name);

/* The text of a setting as kolo__config_load reads it: the variable NAME,
 * else its Horovod twin (HOROVOD_RANK for KOLO_RANK, ...), else NULL.
 * Names that are not settings are looked up as they are. */
const char *kolo__config_get(const char *name,
                             const char *(*getenv_fn)(const char *));

/* Looks through an environment (NAME=value strings, NULL-terminated) for
 * what deserves a warning, calling note once per finding with a one-line
 * message: a KOLO_* variable kolo does not know (naming the closest one);
 * a KOLO_* variable set together with its HOROVOD_* twin to another value
 * (KOLO_* wins); a HOROVOD_* variable kolo cannot honour, with the reason;
 * a HOROVOD_* variable kolo does not know. */
void kolo__config_scan(char *const *env,
                       const char *(*getenv_fn)(const char *),
                       void (*note)(const char *msg, void *arg), void *arg);

#endif /* KOLO_ENV_H */
