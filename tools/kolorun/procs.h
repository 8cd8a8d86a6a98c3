/*
 * procs.h — the job's processes, below supervision: the job's state
 * (kolorun_t) and what starts, feeds and signals its processes, from the
 * job description (cmdline.h).
 *   job.c          the job's tables: ranks (with their buffers), outputs
 *   redis.c        Redis rendezvous (--redis, --start-redis); a key
 *                  written through whichever rendezvous the job has
 *   spawn.c        starting ranks: environment, fork/exec, ssh, the holder
 *   rendezvous.c   the private rendezvous directory, and keys written there
 *   output.c       the ranks' output: pipes, prefixes, --output-filename
 *   signals.c      the signal handler; signalling the ranks' group
 *   flight.c       the flight recorder's directory (KOLO_FLIGHT_DIR), the
 *                  ranks' dumps asked for with SIGUSR1, its end-of-job
 *                  lines
 *   mpi.c          --mpi: the job runs under mpirun instead
 */
#ifndef KOLORUN_PROCS_H
#define KOLORUN_PROCS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cmdline.h"

/* Line buffer per pipe: longer lines are written in pieces of this size. */
#define KOLORUN_LINE_MAX (64 * 1024)
/* Output batch per destination; holds at least one line plus its prefix. */
#define KOLORUN_SINK_CAP (2 * KOLORUN_LINE_MAX)
/* How long processes get to exit after a signal before SIGKILL. */
#define KOLORUN_GRACE_MS 3000

enum { KOLORUN_OUT = 0, KOLORUN_ERR = 1 };

/* The signals that stop the job; each is forwarded to the ranks
 * (signals.c). */
#define KOLORUN_N_STOP_SIGNALS 4
extern const int kolorun_stop_signals[];

/* The only globals: what the signal handler needs (signals.c). The handler
 * records that a signal came and wakes the poll loop; everything else
 * happens there. */
extern volatile sig_atomic_t kolorun_pending[NSIG];
extern int kolorun_wake_fd;

/* One pipe from a rank: stdout or stderr. */
typedef struct kolorun_stream {
    int fd;     /* read end, non-blocking; -1 once at end of file or closed */
    size_t len; /* bytes in buf not yet written */
    char *buf;  /* KOLORUN_LINE_MAX bytes */
} kolorun_stream_t;

typedef struct kolorun_rank {
    pid_t pid; /* 0 until started */
    int reaped;
    int status;     /* its wait status, once reaped */
    int failed_seq; /* 1, 2...: it failed before the cause was chosen */
    int named_lost; /* a survivor's message named it as the cause */
    kolorun_stream_t streams[2]; /* KOLORUN_OUT, KOLORUN_ERR */
    int files[2]; /* --output-filename: DIR/rank.R/stdout, stderr; -1 none */
    int hold_fd; /* ssh: write end of its stdin; closing it ends the rank */
} kolorun_rank_t;

/* One of kolorun's own outputs (fd 1 or 2), with its batch buffer. */
typedef struct kolorun_sink {
    int fd;
    int broken;         /* 0, or the errno of the write that failed */
    int sources_closed; /* after EPIPE: ranks' pipes to it closed */
    size_t len;
    char *buf; /* KOLORUN_SINK_CAP bytes */
} kolorun_sink_t;

/* The job, main's one: its options, ranks and outputs, the signals kolorun
 * handles, and how the job ends. Each layer writes its own fields. */
struct kolorun_policy;  /* supervise.h: what supervises beyond the ranks */
typedef struct kolorun_elastic kolorun_elastic_t; /* elastic.c's state */

typedef struct kolorun {
    kolorun_opts_t opts;
    char *rdv_dir; /* absolute path, NULL until created */
    kolorun_rank_t *ranks;
    int nranks; /* entries of ranks (an elastic job grows it) */
    int nstarted;
    int nalive; /* started and not reaped */
    pid_t pgid;        /* the ranks' process group: the holder's pid */
    int holder_reaped; /* the holder is gone: pgid may be reused */
    kolorun_sink_t sinks[2];
    int handled[NSIG]; /* 1 where kolorun installed its handler */
    struct sigaction sigpipe_orig;
    sigset_t mask_orig;

    /* How the job ends. */
    int stopping;      /* a stop signal went to the ranks (or goes once
                        * their dumps are written: dumping) */
    int dumping;       /* stopping, but first waiting for the ranks' flight
                        * recorder dumps (flight.c) */
    int stop_sig;      /* the signal the ranks get when stopping */
    int killed;        /* SIGKILL went to the ranks */
    int64_t stop_ms;   /* when stopping began */
    int stop_signal;   /* the signal that stopped the job, 0 if none */
    int failed_rank;   /* the rank that caused the failure, -1 if none */
    int64_t failed_ms; /* when the first rank failed: the others get
                        * --failure-grace from then */
    int failed_status; /* its wait status */
    int nsuspects;     /* ranks failed before the cause was chosen */
    /* What the ranks' messages say of a stalled, deadlocked or divergent
     * job (output.c reads them, kolorun_blame says it): the rank they name
     * (-1: none) with what it did ("stalled the job: it never enqueued
     * 'x' (the others waited 61 s)"); or, naming no single cause, what
     * the ranks did ("the ranks disagreed on tensor 'x' (the shape:
     * ...)", "the ranks deadlocked: went different ways: ..."). */
    int accused_rank;
    char accused_why[600];
    char verdict[600];
    char cause_line[1400]; /* the line that named the cause (kolorun_blame),
                            * without "kolorun: "; "" before */
    int launch_error;  /* kolorun itself could not start the job: its exit
                        * status (1; 127 or 126: the command cannot run) */
    int64_t killed_ms;     /* when SIGKILL went out */
    int64_t all_reaped_ms; /* when the last rank was reaped, 0 before */
    int64_t job_start_us;  /* wall-clock start, for the ranks' timelines */

    /* Several hosts. */
    int *rank_host;        /* host index of every rank (NULL: one host) */
    char redis_addr[300];  /* "HOST:PORT" of the Redis rendezvous, or "" */
    char job_id[200];      /* namespace of this job's keys in Redis */
    /* What kolorun says to its Redis server first: AUTH [user] password
     * (--redis-password, KOLO_REDIS_PASSWORD, or --start-redis's, derived
     * from the job's secret); "" when none. */
    char redis_password[256], redis_user[128];
    pid_t redis_pid;       /* --start-redis: the server; 0 when none */
    int redis_reaped;

    /* A policy on top of supervision (the elastic driver), told of the
     * ranks' ends and asked whether the job is over; NULL for a plain job.
     * The elastic driver's own state (opaque below it): its workers are
     * ranks[] (index: the order they started in), their hosts
     * rank_host[]. */
    const struct kolorun_policy *policy;
    kolorun_elastic_t *elastic;

    /* The flight recorder (flight.c): KOLO_FLIGHT_DIR of every rank,
     * absolute, NULL when none; whether kolorun made it (then it removes
     * it after a job that succeeded); the dumps it waits for. */
    char *flight_dir;
    int flight_own;
    struct kolorun_flight *flight;
} kolorun_t;

/* Where a rank stands when a policy places it (an elastic worker in the
 * generation it starts for): its place, its slot on its host (the launch
 * command's {local_rank}), and more variables for it, set after the six
 * of its place; they bring their own KOLO_HOSTNAME. NULL place: the plain
 * job's ranks, placed by the job description. */
typedef struct kolorun_place {
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    int slot;
    char *const *extra;
    int nextra;
} kolorun_place_t;

/* ---- job.c */
/* The ranks' and outputs' buffers (a plain job's -np ranks; an elastic
 * job's are added as they start); -1 when memory is short. */
int kolorun_job_alloc(kolorun_t *k);
/* Makes room for n ranks, the new entries closed; 0, or -1. */
int kolorun_ranks_grow(kolorun_t *k, int n);
void kolorun_job_free(kolorun_t *k);

/* ---- rendezvous.c */
int kolorun_rdv_create(kolorun_t *k);
char *kolorun_rendezvous(const kolorun_t *k);
void kolorun_rdv_remove(kolorun_t *k);
/* Removes directory path and all in it, following no link; 0 or -1. */
int kolorun_rmtree(const char *path);
/* Writes key = value into the rendezvous directory, as runtime/store.c
 * reads it; 0, or -1 having said why. */
int kolorun_rdv_dir_set(const kolorun_t *k, const char *key,
                        const char *value);

/* ---- redis.c */
int kolorun_hosts_setup(kolorun_t *k);
void kolorun_redis_stop(kolorun_t *k);
void kolorun_redis_missing(const kolorun_t *k);
void kolorun_redis_clean(const kolorun_t *k);
const char *kolorun_redis_set(const kolorun_t *k, const char *key,
                              const char *value);
/* Writes key = value through the job's rendezvous (Redis or the
 * directory), as runtime/store.c reads it; 0, or -1 having said why. */
int kolorun_rdv_set(const kolorun_t *k, const char *key, const char *value);

/* ---- spawn.c */
const struct kolorun_host *kolorun_host_of(const kolorun_t *k, int r);
void kolorun_child_signals(const kolorun_t *k);
/* Starts rank r (place: see kolorun_place_t); 0, or the exit status that
 * says why it could not (1, 126, 127), having said so. */
int kolorun_spawn(kolorun_t *k, int r, const kolorun_place_t *place);
int kolorun_spawn_holder(kolorun_t *k, int wake_rd);
/* Starts a helper of kolorun's (the host discovery script, redis-server)
 * in a process group of its own, stdin in_fd (-1: /dev/null), stdout out_fd (stderr
 * err_fd too, when >= 0), dying with kolorun, with the signals and mask
 * the ranks get: execvp(file, argv); if that fails, with fail_hint, it
 * says "cannot run FILE: why" and the hint on its stderr. Its pid, or -1
 * (errno: fork's). */
pid_t kolorun_start_helper(const kolorun_t *k, const char *file,
                           char *const argv[], int in_fd, int out_fd,
                           int err_fd, const char *fail_hint);
void kolorun_end_holder(kolorun_t *k);

/* ---- output.c */
void kolorun_sink_flush(kolorun_sink_t *s);
void kolorun_stream_close(kolorun_stream_t *st);
void kolorun_stream_read(kolorun_t *k, int r, int which, int until_empty);
int kolorun_outputs_open(kolorun_t *k);
/* Makes directory path, mode `mode`, and its parents (mkdir -p; an
 * existing directory will do); 0 or -1 (errno). */
int kolorun_mkdirs(const char *path, mode_t mode);

/* ---- signals.c */
int kolorun_signals_setup(kolorun_t *k);
void kolorun_signal_ranks(kolorun_t *k, int sig);
void kolorun_release_remote(kolorun_t *k, int r);
/* The names people know signals by ("SIGINT"), for messages. */
const char *kolorun_signame(int sig);

/* ---- flight.c */
/* KOLO_FLIGHT_DIR for every rank: --flight-dir's or the user's, made
 * absolute, else a directory of kolorun's own (none under --mpi: mpi 1).
 * A directory that cannot be made is said; the job goes on without. */
void kolorun_flight_setup(kolorun_t *k, int mpi);
/* SIGUSR1 to the ranks that announced a flight recorder (DIR/rank<R>.ready,
 * holding the pid that takes it); their count. With wait, kolorun then
 * waits for their dumps (kolorun_flight_waiting), having written why to
 * DIR/kolorun-stop.txt. */
int kolorun_flight_ask(kolorun_t *k, int wait, const char *why);
/* kill -USR1 to kolorun: the ranks dump, the job goes on. */
void kolorun_flight_on_usr1(kolorun_t *k);
/* While dumps are awaited: the inotify descriptor that wakes the loop when
 * DIR changes (-1: none), reading it, and whether to wait on (0 once every
 * dump is renewed or the 2 s are over, said for the ranks that wrote
 * none); *until: the deadline. */
int kolorun_flight_fd(const kolorun_t *k);
void kolorun_flight_read(kolorun_t *k);
int kolorun_flight_waiting(kolorun_t *k, int64_t now, int64_t *until);
/* The job is over with exit status rc: the stragglers' line, the
 * directory named (a failure) or removed (kolorun's, after a success). */
void kolorun_flight_end(kolorun_t *k, int rc);

/* ---- mpi.c */
int kolorun_exec_mpirun(const kolorun_opts_t *o, int64_t job_start_us);

#endif /* KOLORUN_PROCS_H */
