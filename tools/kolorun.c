/*
 * kolorun.c — the launcher: starts N ranks of a command on this machine,
 * carries their output, and ends the job cleanly whatever happens.
 *
 *     kolorun -np 4 python3 train.py
 *
 * HOW IT WORKS
 *
 * Processes. kolorun makes a private rendezvous directory (mkdtemp, mode
 * 0700) and forks one child per rank. Each child sets the KOLO_* variables
 * of its rank, points stdin at /dev/null, its stdout and stderr at two pipes
 * that kolorun reads, and execs the command. Until the exec, a child can
 * tell kolorun what failed (open, dup2, exec: an errno) on a close-on-exec
 * pipe; kolorun waits for that pipe to close, which means the rank runs, or
 * to bring an errno, which it reports as "kolorun: cannot start rank 1:
 * open /dev/null: Too many open files", not as a rank that "exited with
 * status 127". All ranks join ONE new process group, separate from
 * kolorun's own group:
 *  - a terminal sends Ctrl-C (SIGINT) to its foreground group only, that is
 *    to kolorun and not to the ranks; kolorun forwards it once. Had the ranks
 *    stayed in kolorun's group they would get every Ctrl-C twice (from the
 *    terminal and from kolorun), and a Python rank would see its
 *    KeyboardInterrupt raised a second time in the middle of its cleanup;
 *  - one kill(-group) reaches what the ranks started themselves too (a shell
 *    wrapper's children, data-loader workers), which a kill per rank pid
 *    would miss;
 *  - kolorun can signal the group without signalling itself.
 * The group is led by a "holder", a child of kolorun that only waits (it
 * ignores every signal but SIGKILL) until kolorun kills it at the end. While
 * the holder is unreaped the group's id cannot be reused, so kill(-group)
 * can never hit a stranger, even after every rank has been reaped: when a
 * stopped job's ranks are gone but something they started ignores the
 * signal (a shell's `cmd &` ignores SIGINT), the final SIGKILL still reaches
 * it, and no orphan is left holding a GPU.
 * The price: ranks are not in the terminal's foreground group, so they must
 * not read the terminal (hence stdin = /dev/null), and Ctrl-Z would stop
 * kolorun alone, which is why kolorun forwards SIGTSTP and SIGCONT as well.
 * If kolorun dies without a chance to clean up (SIGKILL, a crash), the kernel
 * kills the ranks and the holder for it: each asks for
 * PR_SET_PDEATHSIG(SIGKILL) (the ranks before exec). Only the rendezvous
 * directory, and what ranks started themselves, may be left behind then.
 *
 * Pipes. kolorun is single-threaded; one poll() loop waits on every rank's
 * two pipes and on a self-pipe that signal handlers write to, and never
 * spins. Each pipe has a 64 KiB line buffer. Only whole lines leave it (a
 * line longer than the buffer leaves in 64 KiB pieces, and a last line
 * without a newline leaves at end of file), each batch in one write(), so
 * lines of different ranks never mix. Without --tag-output the bytes pass
 * unchanged; with it every line gets the prefix "[rank]<stdout>:" or
 * "[rank]<stderr>:" — the format of horovodrun and Open MPI's mpirun, so logs
 * and the tools that read them look the same; --prefix-output-with-timestamp
 * puts the local time before it, as horovodrun does. --output-filename DIR
 * also writes what is shown of each rank's stream to DIR/rank.R/stdout or
 * stderr, horovodrun's layout, from the same loop. A rank's stdout and
 * stderr are two pipes, so their relative order is not kept, as under any
 * launcher.
 * If kolorun's own stdout is a closed pipe (kolorun ... | head), kolorun
 * closes the ranks' stdout pipes in turn: they get the EPIPE/SIGPIPE they
 * would have got writing to head themselves, instead of running on unseen.
 *
 * Signals. Handlers only set a flag and write one byte to the self-pipe
 * (both async-signal-safe); the loop does the work. SIGCHLD wakes the loop,
 * which reaps with waitpid(WNOHANG). SIGINT, SIGTERM, SIGHUP and SIGQUIT are
 * forwarded to the ranks; if a rank is still alive GRACE_MS (3 s) later, it
 * gets SIGKILL. A second Ctrl-C kills at once. A signal that was ignored when
 * kolorun started (nohup, `cmd &` in a script) stays ignored, for kolorun and
 * for the ranks, as the shell meant. Signals are blocked around fork() so
 * that a child never runs kolorun's handlers between fork and exec.
 *
 * Ending. When a rank exits non-zero or is killed, and kolorun was not
 * already stopping the job, the job has failed: kolorun prints the rank's
 * remaining output, then one line naming the cause ("kolorun: rank 1
 * (pid 42) exited with status 3"), lets the others report the loss for the
 * failure grace (--failure-grace, 5 s), then sends them SIGTERM (SIGKILL
 * after the grace period) and drains their output. The first rank reaped is
 * not always the cause: when a rank is killed, its peers see their
 * connections close and exit with an error of their own, and on a busy
 * machine kolorun may find several ranks ended at once, where waitpid hands
 * over the oldest child first, whichever ended first. So the cause is
 * chosen among the ranks that failed within KOLORUN_BLAME_MS (a short
 * moment, for a killed process that is still being torn down) of the first
 * failure, or until every rank has ended: a rank killed by a signal (it did
 * not choose to end; the others end because of it), else a rank that a
 * survivor names in the runtime's message "lost rank N (pid P)", else the
 * first one reaped. A rank killed by a signal is the cause at once. Ranks
 * that die because kolorun stopped them are not causes; --verbose reports
 * them, and the failed ranks that were not chosen. When every rank is
 * gone and their pipes are at end of file (or, if something the ranks left
 * behind keeps a pipe open, after the grace period), kolorun removes the
 * rendezvous directory and exits:
 *   0        every rank exited with status 0;
 *   S        the rank named as the cause exited with status S — what
 *            mpirun does, so a script sees the rank's own status (on
 *            another host, 127: the command was not found there);
 *   128+N    the rank named as the cause was killed by signal N, the
 *            shell's way of writing "killed by N";
 *   127      kolorun could not start a rank: the command (or the launch
 *            command) was not found; 126: it could not be executed — the
 *            shell's numbers for the same;
 *   1        kolorun itself failed (rendezvous directory, fork, pipes, file
 *            descriptors), or could not start a rank for another reason;
 *   2        the command line was wrong.
 * When a signal stopped the job, kolorun ends by that same signal (default
 * action, raised on itself), so that a shell script running kolorun stops on
 * Ctrl-C as it would for any other command.
 */
#define _GNU_SOURCE

#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Line buffer per pipe: longer lines are written in pieces of this size. */
#define KOLORUN_LINE_MAX (64 * 1024)
/* Output batch per destination; holds at least one line plus its prefix. */
#define KOLORUN_SINK_CAP (2 * KOLORUN_LINE_MAX)
/* How long ranks get to exit after a forwarded signal before SIGKILL. */
#define KOLORUN_GRACE_MS 3000
/* A second SIGINT closer than this to the first is the same keypress seen
 * twice (by the terminal's group and by a wrapper), not a second Ctrl-C. */
#define KOLORUN_DOUBLE_INT_MS 500
/* After SIGKILL, how long the pipes get to close (the kernel needs moments;
 * longer means a process outside the group, a daemon, holds them). */
#define KOLORUN_SETTLE_MS 1000
/* After a rank exits non-zero, how long kolorun waits for a rank killed by
 * a signal (the likelier cause) before naming the cause: a killed process
 * becomes a zombie only once the kernel has torn it down, which may come
 * after its peers saw its sockets close and gave up. */
#define KOLORUN_BLAME_MS 500
#define KOLORUN_MAX_RANKS 4096
#define KOLORUN_MAX_ENV 24
#define KOLORUN_RMTREE_DEPTH 64

enum { KOLORUN_OUT = 0, KOLORUN_ERR = 1 };

/* The signals that stop the job; each is forwarded to the ranks. */
static const int kolorun_stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define KOLORUN_N_STOP_SIGNALS \
    ((int)(sizeof kolorun_stop_signals / sizeof kolorun_stop_signals[0]))

/* The only globals: what the signal handler needs. The handler records that
 * a signal came and wakes the poll loop; everything else happens there. */
static volatile sig_atomic_t kolorun_pending[NSIG];
static int kolorun_wake_fd = -1;

/* One host of a job over several machines (-H, --hostfile). */
typedef struct kolorun_host {
    char *name;     /* as the user wrote it: what {host} and ssh get */
    int slots;      /* how many ranks it takes at most */
    int first_rank; /* its ranks: first_rank .. first_rank + nranks - 1 */
    int nranks;     /* 0: the job does not reach this host */
    int local;      /* the launching host: its ranks start directly */
} kolorun_host_t;

/* A variable kolorun sets for every rank from a flag (or --config-file):
 * a KOLO_* setting, or NCCL's for --tcp and --network-interfaces. */
typedef struct kolorun_setting {
    const char *var;  /* KOLO_FUSION_THRESHOLD, ... */
    const char *twin; /* the HOROVOD_* variable it supersedes, or NULL */
    char *value;
} kolorun_setting_t;
#define KOLORUN_MAX_SETTINGS 32

typedef struct kolorun_opts {
    int np;
    /* Several hosts. NULL: every rank on this machine, as before. */
    kolorun_host_t *hosts;
    int nhosts;     /* hosts given */
    int nused;      /* hosts that got ranks: KOLO_CROSS_SIZE */
    int any_remote; /* some ranks start through the launch command */
    const char *launch_command; /* --launch-command; NULL: ssh */
    const char *ssh_port;       /* --ssh-port, validated digits */
    const char *ssh_identity;   /* --ssh-identity-file */
    const char *redis;          /* --redis HOST:PORT */
    int start_redis;            /* --start-redis */
    const char *redis_bind;     /* --redis-bind ADDR */
    const char *rdv_base;       /* --rendezvous-dir: shared parent directory */
    char *network_interface; /* the first of --network-interface(s) */
    char *nics;              /* all of them, comma-separated */
    const char **xenv;          /* -x NAME[=VALUE], in order */
    int nxenv;
    int tag_output;
    int timestamp;          /* --prefix-output-with-timestamp */
    const char *output_dir; /* --output-filename DIR */
    int verbose;
    kolorun_setting_t settings[KOLORUN_MAX_SETTINGS]; /* horovodrun's flags */
    int nsettings;
    int tcp;                /* --tcp */
    const char *mpi_args;   /* --mpi-args: more words for mpirun */
    const char *binding_args; /* --binding-args: mpirun's, for --bind-to none */
    const char *start_timeout; /* NULL: not given; validated digits */
    long failure_grace_ms;     /* --failure-grace */
    int mpi;                   /* --mpi: run the job through mpirun */
    int gloo, grace_given;     /* --gloo, --failure-grace given */
    char **argv;               /* the command, NULL-terminated */
} kolorun_opts_t;

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
    int named_lost; /* a survivor's message named it lost */
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

typedef struct kolorun {
    kolorun_opts_t opts;
    char *rdv_dir; /* absolute path, NULL until created */
    kolorun_rank_t *ranks;
    int nstarted;
    int nalive; /* started and not reaped */
    pid_t pgid;        /* the ranks' process group: the holder's pid */
    int holder_reaped; /* the holder is gone: pgid may be reused */
    kolorun_sink_t sinks[2];
    int handled[NSIG]; /* 1 where kolorun installed its handler */
    struct sigaction sigpipe_orig;
    sigset_t mask_orig;

    /* How the job ends. */
    int stopping;      /* a stop signal went to the ranks */
    int killed;        /* SIGKILL went to the ranks */
    int64_t stop_ms;   /* when stopping began */
    int stop_signal;   /* the signal that stopped the job, 0 if none */
    int failed_rank;   /* the rank that caused the failure, -1 if none */
    int64_t failed_ms; /* when the first rank failed: the others get
                        * --failure-grace from then */
    int failed_status; /* its wait status */
    int nsuspects;     /* ranks failed before the cause was chosen */
    int launch_error;  /* kolorun itself could not start the job: its exit
                        * status (1; 127 or 126: the command cannot run) */
    int64_t killed_ms;     /* when SIGKILL went out */
    int64_t all_reaped_ms; /* when the last rank was reaped, 0 before */
    int64_t job_start_us;  /* wall-clock start, for the ranks' timelines */

    /* Several hosts. */
    int *rank_host;        /* host index of every rank (NULL: one host) */
    char redis_addr[300];  /* "HOST:PORT" of the Redis rendezvous, or "" */
    char job_id[200];      /* namespace of this job's keys in Redis */
    pid_t redis_pid;       /* --start-redis: the server; 0 when none */
    int redis_reaped;
} kolorun_t;

static const struct kolorun_host *kolorun_host_of(const kolorun_t *k, int r);
static void kolorun_blame(kolorun_t *k);

static int64_t kolorun_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes everything or fails; a pipe or terminal may take less per call. */
static int kolorun_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* kolorun's own messages: "kolorun: ...", one write so that they stay
 * whole next to the ranks' lines. */
__attribute__((format(printf, 1, 2))) static void kolorun_say(const char *fmt,
                                                              ...)
{
    char line[8192];
    int n = snprintf(line, sizeof line, "kolorun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* truncated: still end the line */
    line[len++] = '\n';
    (void)kolorun_write_all(STDERR_FILENO, line, len);
}

static char *kolorun_strdupf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
static char *kolorun_strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* ------------------------------------------------------------------------
 * Command line
 */

static void kolorun_usage(FILE *f)
{
    fputs(
        "usage: kolorun -np N [options] [--] command [args...]\n"
        "       kolorun --check-build | --version | --help\n"
        "\n"
        "Starts N ranks of command on this machine (or on the hosts of -H or\n"
        "--hostfile), carries their output and waits for them. If one rank\n"
        "fails, the others are stopped. kolorun takes horovodrun's flags, with\n"
        "the same meaning; each tuning flag sets the KOLO_* variable named for\n"
        "every rank (and replaces the HOROVOD_* variable of the same setting).\n"
        "\n"
        "  -np N, --num-proc N, -n N  number of ranks (required without -H or\n"
        "                           --hostfile)\n"
        "  -cb, --check-build       show what this kolo has (frameworks,\n"
        "                           controllers, tensor operations, NCCL's\n"
        "                           version) and whether a GPU is visible now\n"
        "  -v, --version            show kolo's version\n"
        "  --tag-output             prefix every output line with its rank\n"
        "                           and stream, like horovodrun and mpirun:\n"
        "                             [1]<stdout>:text\n"
        "                             [1]<stderr>:text\n"
        "  --prefix-output-with-timestamp, -prefix-timestamp\n"
        "                           prefix every output line with the local\n"
        "                           time, as horovodrun: Mon Jun  5 10:00:00 2023\n"
        "  --output-filename DIR    also write each rank's stdout and stderr to\n"
        "                           DIR/rank.R/stdout and DIR/rank.R/stderr (R\n"
        "                           padded with zeros: rank.03 of 12), as they\n"
        "                           are shown; under --mpi, mpirun's own layout\n"
        "  --config-file FILE       horovodrun's YAML configuration (controller,\n"
        "                           params, autotune, timeline, stall_check,\n"
        "                           library_options, logging); flags on the\n"
        "                           command line win over it\n"
        "  --start-timeout SECONDS  give every rank KOLO_START_TIMEOUT=SECONDS:\n"
        "                           how long ranks wait for each other at start\n"
        "  --failure-grace SECONDS  after a rank fails, let the others report it\n"
        "                           and exit by themselves for this long before\n"
        "                           stopping them (default 5; 0: stop at once)\n"
        "  --disable-cache          accepted: kolorun keeps no cache of its\n"
        "                           checks between runs (horovodrun's of ssh)\n"
        "  --verbose                say what kolorun does: rendezvous directory,\n"
        "                           each rank's pid and environment and end\n"
        "  -h, --help               show this help\n"
        "\n"
        "Controller arguments:\n"
        "  --gloo                   kolorun starts the ranks (the default; on one\n"
        "                           host they use shared memory, see README.md)\n"
        "  --mpi                    run the job through mpirun (Open MPI): the\n"
        "                           ranks take their places from MPI and use the\n"
        "                           mpi backend (KOLO_CONTROLLER and\n"
        "                           KOLO_CPU_OPERATIONS still choose); every\n"
        "                           KOLO_* and HOROVOD_* variable is passed on\n"
        "                           with -x; KOLO_MPIRUN names another mpirun\n"
        "\n"
        "Tuneable parameter arguments:\n"
        "  --fusion-threshold-mb MB KOLO_FUSION_THRESHOLD=MB*1048576 (default 128;\n"
        "                           0: no fusion)\n"
        "  --cycle-time-ms MS       KOLO_CYCLE_TIME=MS (default 5)\n"
        "  --cache-capacity N       KOLO_CACHE_CAPACITY=N (default 1024; 0: off)\n"
        "  --hierarchical-allreduce, --no-hierarchical-allreduce\n"
        "                           KOLO_HIERARCHICAL_ALLREDUCE=1 or 0 (default:\n"
        "                           on across hosts with several ranks each)\n"
        "\n"
        "Autotune arguments:\n"
        "  --autotune               KOLO_AUTOTUNE=1\n"
        "  --autotune-log-file F    KOLO_AUTOTUNE_LOG=F\n"
        "  --autotune-steps-per-sample N\n"
        "                           KOLO_AUTOTUNE_WINDOW=N: rounds per window\n"
        "\n"
        "Timeline arguments:\n"
        "  --timeline-filename F    KOLO_TIMELINE=F\n"
        "  --timeline-mark-cycles   KOLO_TIMELINE_MARK_CYCLES=1\n"
        "\n"
        "Stall check arguments:\n"
        "  --no-stall-check         KOLO_STALL_CHECK_DISABLE=1\n"
        "  --stall-check-warning-time-seconds S\n"
        "                           KOLO_STALL_CHECK_TIME_SECONDS=S (default 60)\n"
        "  --stall-check-shutdown-time-seconds S\n"
        "                           KOLO_STALL_SHUTDOWN_TIME_SECONDS=S (default\n"
        "                           0: never)\n"
        "\n"
        "Library arguments:\n"
        "  --gloo-timeout-seconds S KOLO_TIMEOUT_SECONDS=S (default 60)\n"
        "  --tcp                    NCCL_IB_DISABLE=1; under --mpi, Open MPI on\n"
        "                           TCP (--mca pml ob1 --mca btl ^openib)\n"
        "  --mpi-args ARGS          with --mpi: more words for mpirun\n"
        "  --binding-args ARGS      with --mpi: mpirun's binding, in place of\n"
        "                           --bind-to none\n"
        "  --num-nccl-streams 1     accepted (kolo uses one stream)\n"
        "\n"
        "Logging arguments:\n"
        "  --log-level LEVEL        KOLO_LOG_LEVEL (TRACE, DEBUG, INFO, WARNING,\n"
        "                           ERROR, FATAL; any case)\n"
        "  --log-without-timestamp  accepted (kolo's log lines carry no time)\n"
        "\n"
        "Refused, with the reason (kolo cannot honour them): --hierarchical-\n"
        "allgather, --autotune-warmup-samples, --autotune-bayes-opt-max-samples,\n"
        "--autotune-gaussian-process-noise, --mpi-threads-disable, --num-nccl-\n"
        "streams other than 1, --thread-affinity, --log-with-timestamp, --jsrun,\n"
        "and the elastic arguments (--min-np, --max-np, --slots-per-host,\n"
        "--elastic-timeout, --reset-limit, --blacklist-cooldown-range,\n"
        "--host-discovery-script).\n"
        "\n"
        "Host arguments (see README.md, \"Several hosts\"):\n"
        "  -H, --hosts H:N,...      hosts and their slots (H alone: 1 slot); ranks\n"
        "                           fill the hosts in order, host by host; -np\n"
        "                           defaults to the sum of the slots\n"
        "  --hostfile FILE          the same from a file: lines 'host slots=N'\n"
        "                           (or 'host': 1 slot); '#' starts a comment\n"
        "  --launch-command TMPL    how a rank starts on another host (default:\n"
        "                           ssh -o BatchMode=yes {host} {command}); TMPL is\n"
        "                           split at blanks, then {host} (the host as given),\n"
        "                           {rank}, {local_rank} and {command} (the rank's\n"
        "                           command, environment included, as one shell-\n"
        "                           quoted word) are replaced. Without {command}\n"
        "                           the words env VAR=VALUE... command args... are\n"
        "                           appended, e.g. 'ip netns exec {host}'\n"
        "  -p, --ssh-port PORT      ssh -p PORT\n"
        "  -i, --ssh-identity-file F  ssh -i F\n"
        "  -x NAME[=VALUE]          also pass NAME (from here, or VALUE) to the\n"
        "                           ranks on other hosts; KOLO_* and HOROVOD_*\n"
        "                           always go\n"
        "  --redis HOST:PORT        ranks meet through this Redis server (keys\n"
        "                           under a name of this job, deleted at the end)\n"
        "  --start-redis            start redis-server here for the job, on a free\n"
        "                           port, and stop it at the end\n"
        "  --redis-bind ADDR        the address --start-redis listens on (default:\n"
        "                           this host's address on --network-interface, or\n"
        "                           its first non-loopback IPv4 address)\n"
        "  --rendezvous-dir DIR     ranks meet in a fresh directory under DIR, a\n"
        "                           file system every host shares\n"
        "  --network-interfaces IF,...  (or --network-interface IF, repeatable)\n"
        "                           ranks bind the address of the first IF of\n"
        "                           the last such flag on their host for Gloo;\n"
        "                           NCCL_SOCKET_IFNAME gets them all\n"
        "\n"
        "Each rank gets KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
        "KOLO_CROSS_RANK (its host's index), KOLO_CROSS_SIZE (hosts),\n"
        "KOLO_RENDEZVOUS=file:DIR (a private directory, removed at the end) or\n"
        "redis:HOST:PORT/JOB, and KOLO_HOSTNAME (127.0.0.1 on one host; unless\n"
        "already set). Its standard input is /dev/null. Its output goes\n"
        "to kolorun's stdout and stderr in whole lines (lines over 64 KiB in\n"
        "pieces); without --tag-output the bytes are unchanged.\n"
        "\n"
        "SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the ranks; ranks\n"
        "still alive 3 s later are killed (a second Ctrl-C kills them at once),\n"
        "and kolorun then ends by the same signal.\n"
        "\n"
        "Exit status:\n"
        "  0       every rank exited with status 0\n"
        "  S       the rank named as the cause exited with status S\n"
        "  128+N   the rank named as the cause was killed by signal N (a\n"
        "          rank killed goes before ranks that exited with an error\n"
        "          at about the same time, likely because of it)\n"
        "  127     a rank could not start: command not found (126: not\n"
        "          executable)\n"
        "  1       kolorun itself failed\n"
        "  2       wrong command line\n",
        f);
}

/* Takes the value of an option given as "--opt V" or "--opt=V". Returns the
 * value (advancing *i past it) or NULL if absent. */
static const char *kolorun_opt_value(int argc, char **argv, int *i,
                                     const char *arg, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return NULL;
    if (arg[n] == '=')
        return arg + n + 1;
    if (arg[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        kolorun_say("option %s needs a value (see kolorun --help)", name);
        exit(2);
    }
    return argv[++*i];
}

/* A whole decimal number in [lo, hi], or -1. */
static long kolorun_parse_long(const char *s, long lo, long hi)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return -1;
    return v;
}

/* ------------------------------------------------------------------------
 * Hosts
 *
 * -H a:4,b:4 and --hostfile both give a list of hosts with slots. Ranks fill
 * the hosts in the order given, host by host: with -np 6, a gets ranks 0-3
 * and b ranks 4-5. A host's index among the hosts that got ranks is its
 * KOLO_CROSS_RANK, which the runtime takes as the host's identity (ranks
 * with the same one share memory); ranks on it are numbered by
 * KOLO_LOCAL_RANK.
 */

/* The launching host: its ranks start directly, without ssh. */
static int kolorun_host_is_local(const char *name)
{
    char me[256] = "";
    if (strcmp(name, "localhost") == 0 || strcmp(name, "127.0.0.1") == 0 ||
        strcmp(name, "::1") == 0)
        return 1;
    if (gethostname(me, sizeof me - 1) != 0 || me[0] == '\0')
        return 0;
    if (strcmp(name, me) == 0)
        return 1;
    /* "node1" and "node1.cluster.example" name the same machine. */
    size_t a = strcspn(name, "."), b = strcspn(me, ".");
    return a == b && strncmp(name, me, a) == 0 &&
           (name[a] == '\0' || me[b] == '\0');
}

/* A host name kolorun can pass through a launch command and a shell: no
 * blanks, quotes or shell syntax, and not an option. */
static int kolorun_host_name_ok(const char *name)
{
    if (name[0] == '\0' || name[0] == '-' || strlen(name) > 255)
        return 0;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr(".-_:[]@%", *p))
            return 0;
    return 1;
}

/* Adds a host to the list; exits 2 with a message naming `where` on a
 * wrong or repeated name. */
static void kolorun_host_add(kolorun_opts_t *o, const char *name, size_t len,
                             int slots, const char *where)
{
    char *n = strndup(name, len);
    kolorun_host_t *h = realloc(o->hosts, (size_t)(o->nhosts + 1) * sizeof *h);
    if (!n || !h) {
        kolorun_say("out of memory");
        exit(1);
    }
    o->hosts = h;
    if (!kolorun_host_name_ok(n)) {
        kolorun_say("%s: '%s' is not a host name kolorun can use (letters, "
                    "digits and . - _ : [ ] @ %% only)",
                    where, n);
        exit(2);
    }
    for (int i = 0; i < o->nhosts; i++) {
        if (strcmp(o->hosts[i].name, n) == 0) {
            kolorun_say("%s: host %s is listed twice; give it once with all "
                        "its slots",
                        where, n);
            exit(2);
        }
    }
    memset(&o->hosts[o->nhosts], 0, sizeof o->hosts[0]);
    o->hosts[o->nhosts].name = n;
    o->hosts[o->nhosts].slots = slots;
    o->hosts[o->nhosts].local = kolorun_host_is_local(n);
    o->nhosts++;
}

/* -H host[:slots],... ("[::1]:2" for an IPv6 address with slots). */
static void kolorun_parse_hosts(kolorun_opts_t *o, const char *list)
{
    const char *p = list;
    int entry = 1;
    if (*list == '\0') {
        kolorun_say("-H wants hosts, for example -H hostA:4,hostB:4");
        exit(2);
    }
    for (;; entry++) {
        size_t len = strcspn(p, ",");
        char item[512], where[600];
        snprintf(item, sizeof item, "%.*s", (int)(len < 511 ? len : 511), p);
        snprintf(where, sizeof where, "-H, entry %d ('%s')", entry, item);
        if (len == 0) {
            kolorun_say("-H: entry %d is empty in '%s'", entry, list);
            exit(2);
        }
        /* The slots follow the last ':' unless the name is an IPv6
         * address, which must then be in brackets. */
        const char *name = item, *colon = strrchr(item, ':');
        size_t nlen = strlen(item);
        int slots = 1;
        if (item[0] == '[') {
            const char *close = strchr(item, ']');
            if (!close || (close[1] != '\0' && close[1] != ':')) {
                kolorun_say("%s: write an IPv6 address as [ADDRESS] or "
                            "[ADDRESS]:SLOTS",
                            where);
                exit(2);
            }
            name = item + 1;
            nlen = (size_t)(close - name);
            colon = close[1] == ':' ? close + 1 : NULL;
        } else if (colon && strchr(item, ':') != colon) {
            colon = NULL; /* a bare IPv6 address: one slot */
        } else if (colon) {
            nlen = (size_t)(colon - item);
        }
        if (colon) {
            long v = kolorun_parse_long(colon + 1, 1, KOLORUN_MAX_RANKS);
            if (v < 0) {
                kolorun_say("%s: slots must be a whole number from 1 to %d, "
                            "not '%s'",
                            where, KOLORUN_MAX_RANKS, colon + 1);
                exit(2);
            }
            slots = (int)v;
        }
        kolorun_host_add(o, name, nlen, slots, where);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
}

/* --hostfile: "host slots=N" or "host" per line; '#' to the end of a line
 * is a comment; blank lines are skipped. Errors name FILE:LINE. */
static void kolorun_parse_hostfile(kolorun_opts_t *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kolorun_say("cannot read hostfile %s: %s", path, strerror(errno));
        exit(2);
    }
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        char where[1200], *save = NULL, *tok;
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (!strchr(line, '\n') && !feof(f)) {
            kolorun_say("%s: line longer than %d characters", where,
                        (int)sizeof line - 2);
            exit(2);
        }
        line[strcspn(line, "#\r\n")] = '\0';
        char *host = strtok_r(line, " \t", &save);
        if (!host)
            continue;
        int slots = 1, seen_slots = 0;
        while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
            long v = -1;
            if (strncmp(tok, "slots=", 6) == 0 && !seen_slots)
                v = kolorun_parse_long(tok + 6, 1, KOLORUN_MAX_RANKS);
            if (v < 0) {
                kolorun_say("%s: expected 'host slots=N' (N from 1 to %d), "
                            "and '%s' is not understood",
                            where, KOLORUN_MAX_RANKS, tok);
                exit(2);
            }
            slots = (int)v;
            seen_slots = 1;
        }
        kolorun_host_add(o, host, strlen(host), slots, where);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        kolorun_say("cannot read hostfile %s: %s", path, strerror(errno));
        exit(2);
    }
    if (o->nhosts == 0) {
        kolorun_say("hostfile %s names no host", path);
        exit(2);
    }
}

/* Places the ranks host by host; fills in np when it was not given. */
static void kolorun_place(kolorun_opts_t *o)
{
    long total = 0;
    for (int i = 0; i < o->nhosts; i++)
        total += o->hosts[i].slots;
    if (o->np == 0)
        o->np = total > KOLORUN_MAX_RANKS ? KOLORUN_MAX_RANKS : (int)total;
    if (o->np > total) {
        char list[1024];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; i < o->nhosts && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s:%d",
                                  i ? ", " : "", o->hosts[i].name,
                                  o->hosts[i].slots);
        kolorun_say("-np %d is more than the %ld slot%s of the hosts (%s)",
                    o->np, total, total == 1 ? "" : "s", list);
        exit(2);
    }
    int next = 0;
    for (int i = 0; i < o->nhosts; i++) {
        kolorun_host_t *h = &o->hosts[i];
        h->first_rank = next;
        h->nranks = o->np - next < h->slots ? o->np - next : h->slots;
        next += h->nranks;
        if (h->nranks > 0) {
            o->nused++;
            o->any_remote |= !h->local;
        }
    }
}

static const char *const kolorun_placeholders[] = {"{host}", "{rank}",
                                                   "{local_rank}", "{command}"};

/* Every {word} of a launch command template must be one kolorun knows. */
static void kolorun_check_template(const char *t)
{
    for (const char *p = strchr(t, '{'); p; p = strchr(p + 1, '{')) {
        int known = 0;
        for (size_t i = 0; i < 4; i++)
            known |= strncmp(p, kolorun_placeholders[i],
                             strlen(kolorun_placeholders[i])) == 0;
        if (!known) {
            kolorun_say("--launch-command: unknown placeholder '%.*s' in '%s' "
                        "(known: {host}, {rank}, {local_rank}, {command})",
                        (int)strcspn(p, "}") + 1, p, t);
            exit(2);
        }
    }
    if (strspn(t, " \t") == strlen(t)) {
        kolorun_say("--launch-command wants a command, for example "
                    "'ip netns exec {host}'");
        exit(2);
    }
}

/* ------------------------------------------------------------------------
 * horovodrun's flags
 *
 * kolorun takes horovodrun's flags (Horovod 0.28.1, horovod/runner/
 * launch.py) with their spellings and meanings. Each flag that tunes the
 * runtime sets the KOLO_* variable of the same setting for every rank (the
 * variable horovodrun would set is HOROVOD_*, which kolo also reads; the
 * flag's KOLO_* wins, so kolorun removes that HOROVOD_* twin from the
 * ranks' environment, as horovodrun overwrites it). --config-file reads the
 * same settings from horovodrun's YAML file; flags on the command line win
 * over the file wherever they stand, as in horovodrun (whose help says
 * otherwise). A flag kolo cannot honour is refused with one line saying
 * why and what to use instead, never ignored.
 */

enum kolorun_kind {
    KR_MB,       /* whole MiB >= 0, given to the ranks in bytes */
    KR_COUNT,    /* whole number >= 0 */
    KR_POSITIVE, /* whole number >= 1 */
    KR_MS,       /* a number >= 0 */
    KR_TEXT,     /* a file name: not empty */
    KR_LEVEL,    /* trace, debug, info, warning, error or fatal */
    KR_SWITCH,   /* on: var=1; off (its --no- form, YAML false): var=0 */
    KR_REFUSED,  /* takes a value; refused whatever it is */
    KR_REFUSED_ON, /* a switch refused on; off asks for what kolo does */
    KR_ONE,      /* a count that kolo honours only as 1 */
    KR_NOOP,     /* a switch that asks for what kolorun does anyway */
};

typedef struct kolorun_knob {
    const char *flag, *alias;         /* spellings that turn it on / set it */
    const char *off_flag, *off_alias; /* switches: spellings that turn it off */
    const char *yaml;     /* "section.key" in --config-file, or NULL */
    int yaml_inverted;    /* YAML true means off (stall_check.enabled) */
    enum kolorun_kind kind;
    const char *var;      /* the ranks' variable */
    const char *twin;     /* the HOROVOD_* variable it supersedes */
    const char *why;      /* refused: why, and what to use instead */
} kolorun_knob_t;

#define KR_ELASTIC                                                        \
    "kolorun does not start elastic jobs; give a fixed -np (with -H or "  \
    "--hostfile for several hosts)"
#define KR_BAYES                                                          \
    "kolo's autotune is a coordinate search, not Bayesian optimisation, " \
    "and has no such knob; --autotune-steps-per-sample sets the rounds "  \
    "it measures per window"

static const kolorun_knob_t kolorun_knobs[] = {
    {"--fusion-threshold-mb", NULL, NULL, NULL, "params.fusion_threshold_mb", 0,
     KR_MB, "KOLO_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD", NULL},
    {"--cycle-time-ms", NULL, NULL, NULL, "params.cycle_time_ms", 0, KR_MS,
     "KOLO_CYCLE_TIME", "HOROVOD_CYCLE_TIME", NULL},
    {"--cache-capacity", NULL, NULL, NULL, "params.cache_capacity", 0,
     KR_COUNT, "KOLO_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", NULL},
    {"--hierarchical-allreduce", NULL, "--no-hierarchical-allreduce", NULL,
     "params.hierarchical_allreduce", 0, KR_SWITCH,
     "KOLO_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE", NULL},
    {"--hierarchical-allgather", NULL, "--no-hierarchical-allgather", NULL,
     "params.hierarchical_allgather", 0, KR_REFUSED_ON, NULL, NULL,
     "kolo has no hierarchical allgather (allgather goes through shared "
     "memory within a host, and over Gloo or MPI between hosts); drop it"},
    {"--autotune", NULL, "--no-autotune", NULL, "autotune.enabled", 0,
     KR_SWITCH, "KOLO_AUTOTUNE", "HOROVOD_AUTOTUNE", NULL},
    {"--autotune-log-file", NULL, NULL, NULL, "autotune.log_file", 0, KR_TEXT,
     "KOLO_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", NULL},
    {"--autotune-steps-per-sample", NULL, NULL, NULL,
     "autotune.steps_per_sample", 0, KR_POSITIVE, "KOLO_AUTOTUNE_WINDOW",
     "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", NULL},
    {"--autotune-warmup-samples", NULL, NULL, NULL, "autotune.warmup_samples",
     0, KR_REFUSED, NULL, NULL, KR_BAYES},
    {"--autotune-bayes-opt-max-samples", NULL, NULL, NULL,
     "autotune.bayes_opt_max_samples", 0, KR_REFUSED, NULL, NULL, KR_BAYES},
    {"--autotune-gaussian-process-noise", NULL, NULL, NULL,
     "autotune.gaussian_process_noise", 0, KR_REFUSED, NULL, NULL, KR_BAYES},
    {"--timeline-filename", NULL, NULL, NULL, "timeline.filename", 0, KR_TEXT,
     "KOLO_TIMELINE", "HOROVOD_TIMELINE", NULL},
    {"--timeline-mark-cycles", NULL, "--no-timeline-mark-cycles", NULL,
     "timeline.mark_cycles", 0, KR_SWITCH, "KOLO_TIMELINE_MARK_CYCLES",
     "HOROVOD_TIMELINE_MARK_CYCLES", NULL},
    {"--no-stall-check", NULL, "--stall-check", NULL, "stall_check.enabled", 1,
     KR_SWITCH, "KOLO_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE",
     NULL},
    {"--stall-check-warning-time-seconds", NULL, NULL, NULL,
     "stall_check.warning_time_seconds", 0, KR_COUNT,
     "KOLO_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS", NULL},
    {"--stall-check-shutdown-time-seconds", NULL, NULL, NULL,
     "stall_check.shutdown_time_seconds", 0, KR_COUNT,
     "KOLO_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
     NULL},
    {"--mpi-threads-disable", NULL, "--no-mpi-threads-disable", NULL,
     "library_options.mpi_threads_disable", 0, KR_REFUSED_ON, NULL, NULL,
     "kolo's background thread calls MPI, so kolo needs "
     "MPI_THREAD_MULTIPLE; mpi4py works on top of kolo as it is"},
    {"--num-nccl-streams", NULL, NULL, NULL, "library_options.num_nccl_streams",
     0, KR_ONE, NULL, NULL, "kolo uses one NCCL stream per process set; "
     "drop it (or give 1)"},
    {"--thread-affinity", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     "kolo does not pin its background thread; pin the whole rank "
     "(taskset, numactl, or --mpi with --binding-args)"},
    {"--ccl-bgt-affinity", NULL, NULL, NULL, "library_options.ccl_bgt_affinity",
     0, KR_REFUSED, NULL, NULL, "kolo has no oneCCL backend"},
    {"--gloo-timeout-seconds", NULL, NULL, NULL,
     "library_options.gloo_timeout_seconds", 0, KR_POSITIVE,
     "KOLO_TIMEOUT_SECONDS", "HOROVOD_GLOO_TIMEOUT_SECONDS", NULL},
    {"--log-level", NULL, NULL, NULL, "logging.level", 0, KR_LEVEL,
     "KOLO_LOG_LEVEL", "HOROVOD_LOG_LEVEL", NULL},
    {"--log-with-timestamp", "--no-log-hide-timestamp", "--log-without-timestamp",
     "--log-hide-timestamp", "logging.with_timestamp", 0, KR_REFUSED_ON, NULL,
     NULL, "kolo's log lines carry no time; --prefix-output-with-timestamp "
     "stamps every line of the ranks' output"},
    {"--disable-cache", NULL, NULL, NULL, NULL, 0, KR_NOOP, NULL, NULL, NULL},
    {"--jsrun", NULL, NULL, NULL, NULL, 0, KR_REFUSED_ON, NULL, NULL,
     "kolorun has no jsrun launcher; under LSF use --mpi (mpirun), or -H"},
    {"--min-np", "--min-num-proc", NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     KR_ELASTIC},
    {"--max-np", "--max-num-proc", NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     KR_ELASTIC},
    {"--slots-per-host", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     KR_ELASTIC},
    {"--elastic-timeout", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     KR_ELASTIC},
    {"--reset-limit", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL, NULL,
     KR_ELASTIC},
    {"--blacklist-cooldown-range", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL,
     NULL, KR_ELASTIC},
    {"--host-discovery-script", NULL, NULL, NULL, NULL, 0, KR_REFUSED, NULL,
     NULL, KR_ELASTIC},
};
#define KOLORUN_NKNOBS ((int)(sizeof kolorun_knobs / sizeof kolorun_knobs[0]))

/* Says that `what` (a flag, or FILE:LINE: key) cannot be honoured, and
 * exits 2. */
__attribute__((noreturn)) static void kolorun_refuse(const char *what,
                                                     const char *why)
{
    kolorun_say("%s: kolo cannot honour it: %s", what, why);
    exit(2);
}

/* Records the value a knob gives the ranks (replacing an earlier one). */
static void kolorun_setting_put(kolorun_opts_t *o, const char *var,
                                const char *twin, char *value)
{
    if (!value) {
        kolorun_say("out of memory");
        exit(1);
    }
    for (int i = 0; i < o->nsettings; i++) {
        if (strcmp(o->settings[i].var, var) == 0) {
            free(o->settings[i].value);
            o->settings[i].value = value;
            return;
        }
    }
    if (o->nsettings >= KOLORUN_MAX_SETTINGS) {
        kolorun_say("too many settings");
        exit(2);
    }
    o->settings[o->nsettings].var = var;
    o->settings[o->nsettings].twin = twin;
    o->settings[o->nsettings].value = value;
    o->nsettings++;
}

/* A number in [lo, hi]: whole unless `frac`. -1 when it is not. */
static int kolorun_number(const char *s, int frac, double lo, double hi,
                          double *out)
{
    char *end;
    double v;
    if (!s || *s == '\0' || strchr(" \t+-", *s))
        return -1;
    errno = 0;
    v = frac ? strtod(s, &end) : (double)strtoll(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi || v != v)
        return -1;
    *out = v;
    return 0;
}

/* Applies knob k with value v (NULL for a switch turned on, "0" for a
 * switch turned off). `what` names where it comes from for messages. */
static void kolorun_knob_apply(kolorun_opts_t *o, const kolorun_knob_t *k,
                               const char *v, const char *what)
{
    double d;
    switch (k->kind) {
    case KR_MB:
        if (kolorun_number(v, 0, 0, 8.0 * 1024 * 1024 * 1024, &d) != 0) {
            kolorun_say("%s wants a whole number of megabytes (0 or more), "
                        "not '%s'", what, v);
            exit(2);
        }
        kolorun_setting_put(o, k->var, k->twin,
                            kolorun_strdupf("%lld", (long long)d * 1048576LL));
        return;
    case KR_COUNT:
    case KR_POSITIVE:
        if (kolorun_number(v, 0, k->kind == KR_POSITIVE ? 1 : 0, 1e6, &d) != 0) {
            kolorun_say("%s wants a whole number (%s), not '%s'", what,
                        k->kind == KR_POSITIVE ? "1 or more" : "0 or more", v);
            exit(2);
        }
        kolorun_setting_put(o, k->var, k->twin, kolorun_strdupf("%lld",
                                                                (long long)d));
        return;
    case KR_MS:
        if (kolorun_number(v, 1, 0, 1e6, &d) != 0) {
            kolorun_say("%s wants a number of milliseconds (0 or more), not "
                        "'%s'", what, v);
            exit(2);
        }
        kolorun_setting_put(o, k->var, k->twin, kolorun_strdupf("%s", v));
        return;
    case KR_TEXT:
        if (!v || *v == '\0') {
            kolorun_say("%s wants a file name", what);
            exit(2);
        }
        kolorun_setting_put(o, k->var, k->twin, kolorun_strdupf("%s", v));
        return;
    case KR_LEVEL: {
        static const char *const levels[] = {"trace", "debug", "info",
                                             "warning", "error", "fatal"};
        for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
            if (v && strcasecmp(v, levels[i]) == 0) {
                kolorun_setting_put(o, k->var, k->twin,
                                    kolorun_strdupf("%s", levels[i]));
                return;
            }
        kolorun_say("%s wants one of TRACE, DEBUG, INFO, WARNING, ERROR, "
                    "FATAL (any case), not '%s'", what, v ? v : "");
        exit(2);
    }
    case KR_SWITCH:
        kolorun_setting_put(o, k->var, k->twin,
                            kolorun_strdupf("%s", v ? v : "1"));
        return;
    case KR_REFUSED:
        kolorun_refuse(what, k->why);
    case KR_REFUSED_ON:
        if (!v || strcmp(v, "0") != 0)
            kolorun_refuse(what, k->why);
        return;
    case KR_ONE:
        if (kolorun_number(v, 0, 0, 1e6, &d) != 0 || d != 1)
            kolorun_refuse(what, k->why);
        return;
    case KR_NOOP:
        return;
    }
}

/* Whether arg is one of knob k's spellings: 1 on, 2 off, 0 neither. For a
 * knob with a value, *value gets it (and *i moves past it). */
static int kolorun_knob_match(int argc, char **argv, int *i, const char *arg,
                              const kolorun_knob_t *k, const char **value)
{
    int is_switch = k->kind == KR_SWITCH || k->kind == KR_REFUSED_ON ||
                    k->kind == KR_NOOP;
    *value = NULL;
    if (is_switch) {
        if (strcmp(arg, k->flag) == 0 || (k->alias && strcmp(arg, k->alias) == 0))
            return 1;
        if ((k->off_flag && strcmp(arg, k->off_flag) == 0) ||
            (k->off_alias && strcmp(arg, k->off_alias) == 0))
            return 2;
        return 0;
    }
    /* Refused before its value is read: the refusal says enough. */
    if (k->kind == KR_REFUSED) {
        for (int j = 0; j < 2; j++) {
            const char *name = j == 0 ? k->flag : k->alias;
            size_t n = name ? strlen(name) : 0;
            if (name && strncmp(arg, name, n) == 0 &&
                (arg[n] == '\0' || arg[n] == '='))
                kolorun_refuse(name, k->why);
        }
    }
    if ((*value = kolorun_opt_value(argc, argv, i, arg, k->flag)) ||
        (k->alias && (*value = kolorun_opt_value(argc, argv, i, arg, k->alias))))
        return 1;
    return 0;
}

/* ---- --config-file: horovodrun's YAML --------------------------------- */

/* One scalar of the file: quotes removed; "" for null (absent). */
static int kolorun_yaml_scalar(char *s, char *out, size_t len)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    if (s[0] == '\'' || s[0] == '"') {
        char q = s[0];
        size_t o = 0;
        const char *p = s + 1;
        for (; *p; p++) {
            if (*p == q && q == '\'' && p[1] == '\'') {
                p++;
            } else if (*p == q) {
                break;
            } else if (*p == '\\' && q == '"' && p[1] != '\0') {
                p++;
            }
            if (o + 1 < len)
                out[o++] = *p;
        }
        out[o] = '\0';
        return *p == q && p[1] == '\0' ? 0 : -1;
    }
    if (strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0)
        s[0] = '\0';
    if (strchr("[]{}&*!|>%@`", s[0]) && s[0] != '\0')
        return -1; /* flow collections, anchors, tags, block scalars */
    snprintf(out, len, "%s", s);
    return 0;
}

/* YAML 1.1's booleans (PyYAML reads yes/no/on/off too): 1, 0, or -1. */
static int kolorun_yaml_bool(const char *v)
{
    static const char *const yes[] = {"true", "yes", "on", "y"};
    static const char *const no[] = {"false", "no", "off", "n"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

/* Reads horovodrun's --config-file: top-level `controller: gloo|mpi` and
 * sections of `key: value` (params, autotune, timeline, stall_check,
 * library_options, logging), each key as its flag, unless the command line
 * gave that flag (given[] says). Errors name FILE:LINE; a key horovodrun
 * does not read is warned about and skipped, as horovodrun skips it. */
static void kolorun_config_file(kolorun_opts_t *o, const char *path,
                                const int *given, int controller_given)
{
    FILE *f = fopen(path, "r");
    char line[4096], section[64] = "";
    int lineno = 0, section_indent = -1;
    if (!f) {
        kolorun_say("--config-file %s: %s", path, strerror(errno));
        exit(2);
    }
    while (fgets(line, sizeof line, f)) {
        char where[1200], key[128], *p, *colon, value[4096];
        int indent;
        lineno++;
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        if (!strchr(line, '\n') && !feof(f)) {
            kolorun_say("%s: line longer than %d characters", where,
                        (int)sizeof line - 2);
            exit(2);
        }
        line[strcspn(line, "\r\n")] = '\0';
        /* A comment starts at '#' that begins the line or follows a blank
         * (outside quotes). */
        {
            char q = 0;
            for (p = line; *p; p++) {
                if (q) {
                    if (*p == q)
                        q = 0;
                } else if (*p == '\'' || *p == '"') {
                    q = *p;
                } else if (*p == '#' && (p == line || p[-1] == ' ' || p[-1] == '\t')) {
                    *p = '\0';
                    break;
                }
            }
        }
        indent = (int)strspn(line, " ");
        p = line + indent;
        if (*p == '\t') {
            kolorun_say("%s: YAML indents with blanks, not tabs", where);
            exit(2);
        }
        if (*p == '\0' || strcmp(p, "---") == 0 || strcmp(p, "...") == 0)
            continue;
        colon = strstr(p, ": ");
        if (!colon && p[strlen(p) - 1] == ':')
            colon = p + strlen(p) - 1;
        if (!colon || *p == '-' || colon == p || (size_t)(colon - p) >= sizeof key) {
            kolorun_say("%s: kolorun reads horovodrun's config files, "
                        "'key: value' lines and sections of them, and does "
                        "not understand '%s'", where, p);
            exit(2);
        }
        snprintf(key, sizeof key, "%.*s", (int)(colon - p), p);
        if (kolorun_yaml_scalar(colon + 1 + strspn(colon + 1, " "), value,
                                sizeof value) != 0) {
            kolorun_say("%s: the value of %s is not a plain, quoted or empty "
                        "scalar", where, key);
            exit(2);
        }
        if (indent == 0) {
            section[0] = '\0';
            section_indent = -1;
            if (strcmp(key, "controller") == 0) {
                if (value[0] == '\0')
                    continue;
                if (strcasecmp(value, "gloo") != 0 && strcasecmp(value, "mpi") != 0) {
                    kolorun_say("%s: controller: %s is not a controller "
                                "(gloo or mpi)", where, value);
                    exit(2);
                }
                if (!controller_given) {
                    o->gloo = strcasecmp(value, "gloo") == 0;
                    o->mpi = !o->gloo;
                }
                continue;
            }
            if (value[0] != '\0') {
                kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                            "ignored", where, key);
                continue;
            }
            snprintf(section, sizeof section, "%.63s", key);
            continue;
        }
        if (section[0] == '\0') {
            kolorun_say("%s: %s is indented, but no section is open", where, key);
            exit(2);
        }
        if (section_indent < 0)
            section_indent = indent;
        if (indent != section_indent) {
            kolorun_say("%s: kolorun reads sections one level deep; %s is "
                        "indented differently from the keys before it",
                        where, key);
            exit(2);
        }
        if (value[0] == '\0')
            continue; /* null: not set, as in horovodrun */
        {
            char full[200];
            int found = 0;
            snprintf(full, sizeof full, "%s.%s", section, key);
            for (int i = 0; i < KOLORUN_NKNOBS && !found; i++) {
                const kolorun_knob_t *k = &kolorun_knobs[i];
                char what[1500];
                if (!k->yaml || strcmp(k->yaml, full) != 0)
                    continue;
                found = 1;
                if (given[i])
                    break; /* the command line wins */
                snprintf(what, sizeof what, "%s: %s (%s)", where, full, k->flag);
                if (k->kind == KR_SWITCH || k->kind == KR_REFUSED_ON) {
                    int b = kolorun_yaml_bool(value);
                    if (b < 0) {
                        kolorun_say("%s wants true or false, not '%s'", what,
                                    value);
                        exit(2);
                    }
                    kolorun_knob_apply(o, k, b != k->yaml_inverted ? NULL : "0",
                                       what);
                } else {
                    kolorun_knob_apply(o, k, value, what);
                }
            }
            if (!found)
                kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                            "ignored", where, full);
        }
    }
    fclose(f);
}

/* --network-interface(s): a comma list, repeatable. All of them go to NCCL
 * (NCCL_SOCKET_IFNAME), as horovodrun does; Gloo binds one
 * (KOLO_NETWORK_INTERFACE, horovodrun's HOROVOD_GLOO_IFACE, which it takes
 * from a set in no order): the first of the last flag, so that a later
 * flag overrides an earlier one as everywhere on kolorun's line. */
static void kolorun_add_nics(kolorun_opts_t *o, const char *list,
                             const char *flag)
{
    const char *p = list;
    if (*list == '\0') {
        kolorun_say("%s wants interface names, for example eth0", flag);
        exit(2);
    }
    for (;;) {
        size_t n = strcspn(p, ",");
        char name[64];
        if (n == 0 || n >= 16 || memchr(p, '/', n) || memchr(p, ' ', n)) {
            kolorun_say("%s wants interface names (at most 15 characters, "
                        "e.g. eth0), not '%.*s'", flag, (int)n, p);
            exit(2);
        }
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        if (!o->nics || !strstr(o->nics, name)) {
            char *all = o->nics ? kolorun_strdupf("%s,%s", o->nics, name)
                                : kolorun_strdupf("%s", name);
            if (!all) {
                kolorun_say("out of memory");
                exit(1);
            }
            free(o->nics);
            o->nics = all;
        }
        if (p == list) {
            free(o->network_interface);
            o->network_interface = strndup(p, n);
        }
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
}

/* ------------------------------------------------------------------------
 * --check-build: what this kolo has, in horovodrun's layout
 *
 * The backends are what libkolo says (kolo_built), found as the Python
 * binding finds it: KOLO_LIBRARY, else the build tree next to this kolorun
 * (.libs/), else the libdir kolo was configured for, else the loader's
 * path; where it cannot be loaded, what ./configure found, saying so. The
 * frameworks are what a Python interpreter imports: KOLO_PYTHON, else the
 * one ./configure found (the bindings' own), else python3 on PATH. A GPU
 * is "visible now" when the CUDA driver counts one (CUDA_VISIBLE_DEVICES
 * applies).
 */

#define KOLORUN_PROBE_MS 60000 /* importing torch takes seconds; a bound */

typedef int (*kolorun_built_fn)(const char *);

static void *kolorun_libkolo(char *path, size_t n, char *why, size_t wn)
{
    char self[4096], cand[4][4200];
    int nc = 0;
    const char *env = getenv("KOLO_LIBRARY");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (env && *env)
        snprintf(cand[nc++], sizeof cand[0], "%s", env);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(cand[nc++], sizeof cand[0], "%s/.libs/libkolo.so.0", self);
        }
    }
#ifdef KOLO_LIBDIR
    snprintf(cand[nc++], sizeof cand[0], "%s/libkolo.so.0", KOLO_LIBDIR);
#endif
    snprintf(cand[nc++], sizeof cand[0], "libkolo.so.0");
    why[0] = '\0';
    for (int i = 0; i < nc; i++) {
        if (strchr(cand[i], '/') && access(cand[i], F_OK) != 0) {
            if (i == 0 && env && *env) {
                snprintf(why, wn, "KOLO_LIBRARY=%.400s: %s", env, strerror(errno));
                return NULL; /* KOLO_LIBRARY names the one to use */
            }
            continue;
        }
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (h && dlsym(h, "kolo_built")) {
            snprintf(path, n, "%.4199s", cand[i]);
            return h;
        }
        snprintf(why, wn, "%s", h ? "it has no kolo_built" : dlerror());
        if (h)
            dlclose(h);
        if (env && *env)
            break; /* KOLO_LIBRARY names the one to use */
    }
    if (!why[0])
        snprintf(why, wn, "not found");
    return NULL;
}

/* What ./configure found, where libkolo cannot be asked. */
static int kolorun_configured(const char *what)
{
    (void)what;
#ifdef KOLO_HAVE_GLOO
    if (strcmp(what, "gloo") == 0)
        return 1;
#endif
#ifdef KOLO_HAVE_MPI
    if (strcmp(what, "mpi") == 0)
        return 1;
#endif
#ifdef KOLO_HAVE_SHM
    if (strcmp(what, "shm") == 0)
        return 1;
#endif
#ifdef KOLO_HAVE_GPU
    if (strcmp(what, "cuda") == 0 || strcmp(what, "nccl") == 0)
        return 1;
#endif
    return 0;
}

/* Runs argv with stdout into buf (stderr to /dev/null), for at most
 * KOLORUN_PROBE_MS; 0 when it ran and exited 0. */
static int kolorun_capture(char *const argv[], char *buf, size_t n)
{
    int p[2];
    size_t used = 0;
    buf[0] = '\0';
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, STDIN_FILENO);
            dup2(nul, STDERR_FILENO);
        }
        dup2(p[1], STDOUT_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    int64_t deadline = kolorun_now_ms() + KOLORUN_PROBE_MS;
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int64_t left = deadline - kolorun_now_ms();
        if (left <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        int r = poll(&pf, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        ssize_t got = read(p[0], buf + used, n - 1 - used);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        used += (size_t)got;
        if (used >= n - 1)
            break;
    }
    buf[used] = '\0';
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The version after "name " on a line of the probe's output, or NULL. */
static const char *kolorun_probe_line(const char *out, const char *name,
                                      char *ver, size_t n)
{
    size_t len = strlen(name);
    for (const char *p = out; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        if (strncmp(p, name, len) == 0 && p[len] == ' ') {
            snprintf(ver, n, "%.*s", (int)strcspn(p + len + 1, "\n"), p + len + 1);
            return ver;
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    return NULL;
}

typedef int (*kolorun_cu_int_fn)(unsigned);
typedef int (*kolorun_cu_count_fn)(int *);
typedef int (*kolorun_cu_name_fn)(int, const char **);

/* "yes, N devices" or "no (why)": what the CUDA driver counts now. */
static void kolorun_gpu_visible(char *out, size_t n)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(out, n, "no (no CUDA driver here: libcuda.so.1 cannot be "
                 "loaded)");
        return;
    }
    kolorun_cu_int_fn cu_init = (kolorun_cu_int_fn)dlsym(h, "cuInit");
    kolorun_cu_count_fn cu_count = (kolorun_cu_count_fn)dlsym(h, "cuDeviceGetCount");
    kolorun_cu_name_fn cu_name = (kolorun_cu_name_fn)dlsym(h, "cuGetErrorName");
    int count = 0, rc = cu_init && cu_count ? cu_init(0) : -1;
    if (rc == 0)
        rc = cu_count(&count);
    if (rc == 0 && count > 0) {
        snprintf(out, n, "yes, %d device%s", count, count == 1 ? "" : "s");
    } else if (rc == 0) {
        snprintf(out, n, "no (the CUDA driver counts no device)");
    } else {
        const char *name = NULL;
        if (!cu_name || rc < 0 || cu_name(rc, &name) != 0 || !name)
            name = "an error";
        snprintf(out, n, "no (cuInit: %s)", name);
    }
    dlclose(h);
}

__attribute__((noreturn)) static void kolorun_check_build(void)
{
    char libpath[4200] = "", why[512], probe[4096], tver[128], nver[128], kver[128];
    void *h = kolorun_libkolo(libpath, sizeof libpath, why, sizeof why);
    kolorun_built_fn built = h ? (kolorun_built_fn)dlsym(h, "kolo_built") : NULL;
    const char *python = getenv("KOLO_PYTHON");
#ifdef KOLO_CONFIGURED_PYTHON
    if ((!python || !*python) && strcmp(KOLO_CONFIGURED_PYTHON, ":") != 0 &&
        KOLO_CONFIGURED_PYTHON[0] != '\0')
        python = KOLO_CONFIGURED_PYTHON;
#endif
    char *pyargv[] = {
        (char *)(python && *python ? python : "python3"), "-c",
        "import importlib\n"
        "for m in ('torch', 'numpy', 'kolo'):\n"
        "    try:\n"
        "        v = getattr(importlib.import_module(m), '__version__', '?')\n"
        "        print(m, v)\n"
        "    except Exception as e:\n"
        "        print(m + '-', type(e).__name__)\n",
        NULL};
    int py = kolorun_capture(pyargv, probe, sizeof probe) == 0;
    int have_gloo, have_mpi, have_shm, have_cuda, nccl;
    char gpu[256];

    if (built) {
        have_gloo = built("gloo");
        have_mpi = built("mpi");
        have_shm = built("shm");
        have_cuda = built("cuda");
        nccl = built("nccl");
    } else {
        have_gloo = kolorun_configured("gloo");
        have_mpi = kolorun_configured("mpi");
        have_shm = kolorun_configured("shm");
        have_cuda = kolorun_configured("cuda");
        nccl = kolorun_configured("nccl");
    }
    kolorun_gpu_visible(gpu, sizeof gpu);

    printf("kolo v%s:\n\n", PACKAGE_VERSION);
    printf("Available Frameworks:\n");
    const char *torch = py ? kolorun_probe_line(probe, "torch", tver, sizeof tver) : NULL;
    const char *numpy = py ? kolorun_probe_line(probe, "numpy", nver, sizeof nver) : NULL;
    printf("    [%c] PyTorch%s%s\n", torch ? 'X' : ' ', torch ? " " : "",
           torch ? torch : "");
    printf("    [%c] NumPy%s%s\n", numpy ? 'X' : ' ', numpy ? " " : "",
           numpy ? numpy : "");
    printf("\nAvailable Controllers:\n");
    printf("    [%c] shm\n", have_shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", have_gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", have_mpi ? 'X' : ' ');
    printf("\nAvailable Tensor Operations:\n");
    if (nccl > 1)
        printf("    [X] NCCL %d.%d.%d\n", nccl >= 10000 ? nccl / 10000 : nccl / 1000,
               nccl >= 10000 ? nccl % 10000 / 100 : nccl % 1000 / 100, nccl % 100);
    else
        printf("    [%c] NCCL\n", nccl ? 'X' : ' ');
    printf("    [%c] shm\n", have_shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", have_gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", have_mpi ? 'X' : ' ');
    printf("    [%c] CUDA\n", have_cuda ? 'X' : ' ');
    printf("\nGPU visible now: %s\n", gpu);
    if (built)
        printf("(libkolo: %s)\n", libpath);
    else
        printf("(libkolo could not be loaded: %s; this is what ./configure "
               "found)\n", why);
    if (!py)
        printf("(%s could not be run: no frameworks checked)\n", pyargv[0]);
    else if (!kolorun_probe_line(probe, "kolo", kver, sizeof kver))
        printf("(%s cannot import the kolo package: put bindings/python on "
               "PYTHONPATH, or make install)\n", pyargv[0]);
    fflush(stdout);
    exit(0);
}

/* Parses the options; exits 0 after --help, 2 on a wrong command line. */
static void kolorun_parse(int argc, char **argv, kolorun_opts_t *o)
{
    const char *hosts = NULL, *hostfile = NULL, *config_file = NULL;
    int given[KOLORUN_NKNOBS] = {0}, check_build = 0;
    memset(o, 0, sizeof *o);
    o->failure_grace_ms = 5000;
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        int knob = -1, on = 0;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the command starts here */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            kolorun_usage(stdout);
            exit(0);
        }
        if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
            printf("%s\n", PACKAGE_VERSION); /* as horovodrun: the version */
            exit(0);
        }
        if (strcmp(a, "-cb") == 0 || strcmp(a, "--check-build") == 0) {
            check_build = 1;
            continue;
        }
        if (strcmp(a, "--tag-output") == 0) {
            o->tag_output = 1;
            continue;
        }
        if (strcmp(a, "--prefix-output-with-timestamp") == 0 ||
            strcmp(a, "-prefix-timestamp") == 0) {
            o->timestamp = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--output-filename"))) {
            if (*v == '\0') {
                kolorun_say("--output-filename wants a directory");
                exit(2);
            }
            o->output_dir = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--config-file"))) {
            config_file = v;
            continue;
        }
        if (strcmp(a, "--tcp") == 0) {
            o->tcp = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--mpi-args"))) {
            o->mpi_args = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--binding-args"))) {
            o->binding_args = v;
            continue;
        }
        for (int j = 0; j < KOLORUN_NKNOBS && knob < 0; j++)
            if ((on = kolorun_knob_match(argc, argv, &i, a, &kolorun_knobs[j],
                                         &v)) != 0)
                knob = j;
        if (knob >= 0) {
            /* Messages name the spelling given, without its =VALUE. */
            char what[64];
            snprintf(what, sizeof what, "%.*s", (int)strcspn(a, "="), a);
            kolorun_knob_apply(o, &kolorun_knobs[knob], on == 2 ? "0" : v,
                               what);
            given[knob] = 1;
            continue;
        }
        if (strcmp(a, "--verbose") == 0) {
            o->verbose = 1;
            continue;
        }
        if (strcmp(a, "--gloo") == 0) {
            o->gloo = 1; /* the only controller kolorun has on one machine */
            continue;
        }
        if (strcmp(a, "--mpi") == 0) {
            o->mpi = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "-np")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "--num-proc")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "--np")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "-n"))) {
            long np = kolorun_parse_long(v, 1, KOLORUN_MAX_RANKS);
            if (np < 0) {
                kolorun_say("-np wants a number of ranks from 1 to %d, not "
                            "'%s'",
                            KOLORUN_MAX_RANKS, v);
                exit(2);
            }
            o->np = (int)np;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--failure-grace"))) {
            long s = kolorun_parse_long(v, 0, 3600);
            if (s < 0) {
                kolorun_say("--failure-grace wants a whole number of seconds "
                            "from 0 to 3600, not '%s'",
                            v);
                exit(2);
            }
            o->failure_grace_ms = s * 1000;
            o->grace_given = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--start-timeout"))) {
            if (kolorun_parse_long(v, 1, 1000000000L) < 0) {
                kolorun_say("--start-timeout wants a whole number of seconds "
                            "(at least 1), not '%s'",
                            v);
                exit(2);
            }
            o->start_timeout = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "-H")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "--host")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "--hosts"))) {
            hosts = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--hostfile")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "-hostfile"))) {
            hostfile = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--launch-command"))) {
            kolorun_check_template(v);
            o->launch_command = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--ssh-port")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "-p"))) {
            if (kolorun_parse_long(v, 1, 65535) < 0) {
                kolorun_say("--ssh-port wants a port from 1 to 65535, not "
                            "'%s'",
                            v);
                exit(2);
            }
            o->ssh_port = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--ssh-identity-file")) ||
            (v = kolorun_opt_value(argc, argv, &i, a, "-i"))) {
            if (access(v, R_OK) != 0) {
                kolorun_say("--ssh-identity-file %s: %s", v, strerror(errno));
                exit(2);
            }
            o->ssh_identity = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "-x"))) {
            const char **x = realloc(o->xenv, (size_t)(o->nxenv + 1) *
                                                  sizeof *x);
            if (!x) {
                kolorun_say("out of memory");
                exit(1);
            }
            size_t nl = strcspn(v, "=");
            if (nl == 0 || strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "abcdefghijklmnopqrstuvwxyz"
                                     "0123456789_") != nl) {
                kolorun_say("-x wants NAME or NAME=VALUE, not '%s'", v);
                exit(2);
            }
            o->xenv = x;
            o->xenv[o->nxenv++] = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--redis"))) {
            const char *c = strrchr(v, ':');
            if (!c || c == v || kolorun_parse_long(c + 1, 1, 65535) < 0) {
                kolorun_say("--redis wants HOST:PORT (port from 1 to 65535), "
                            "not '%s'",
                            v);
                exit(2);
            }
            o->redis = v;
            continue;
        }
        if (strcmp(a, "--start-redis") == 0) {
            o->start_redis = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--redis-bind"))) {
            struct in_addr ia;
            if (inet_pton(AF_INET, v, &ia) != 1) {
                kolorun_say("--redis-bind wants an IPv4 address, not '%s'", v);
                exit(2);
            }
            o->redis_bind = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--rendezvous-dir"))) {
            struct stat st;
            int bad = stat(v, &st) != 0      ? errno
                      : !S_ISDIR(st.st_mode) ? ENOTDIR
                                             : 0;
            if (bad) {
                kolorun_say("--rendezvous-dir %s: %s", v, strerror(bad));
                exit(2);
            }
            o->rdv_base = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--network-interfaces"))) {
            kolorun_add_nics(o, v, "--network-interfaces");
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--network-interface"))) {
            kolorun_add_nics(o, v, "--network-interface");
            continue;
        }
        kolorun_say("unknown option '%s' (see kolorun --help)", a);
        exit(2);
    }
    if (config_file)
        kolorun_config_file(o, config_file, given, o->gloo || o->mpi);
    if (check_build)
        kolorun_check_build();
    if (hosts && hostfile) {
        kolorun_say("give the hosts with -H or with --hostfile, not both");
        exit(2);
    }
    if (hosts)
        kolorun_parse_hosts(o, hosts);
    else if (hostfile)
        kolorun_parse_hostfile(o, hostfile);
    if (o->nhosts > 0)
        kolorun_place(o);
    if (o->np == 0) {
        kolorun_say("say how many ranks to start with -np N "
                    "(see kolorun --help)");
        exit(2);
    }
    if (o->redis && o->start_redis) {
        kolorun_say("give --redis HOST:PORT or --start-redis, not both");
        exit(2);
    }
    if (o->redis_bind && !o->start_redis) {
        kolorun_say("--redis-bind only goes with --start-redis");
        exit(2);
    }
    if ((o->redis || o->start_redis) && o->rdv_base) {
        kolorun_say("give --rendezvous-dir or Redis (--redis, --start-redis), "
                    "not both");
        exit(2);
    }
    if (o->any_remote && !o->redis && !o->start_redis && !o->rdv_base) {
        kolorun_say("ranks on other hosts cannot reach this host's private "
                    "rendezvous directory: add --redis HOST:PORT, "
                    "--start-redis, or --rendezvous-dir DIR on a file system "
                    "every host shares");
        exit(2);
    }
    if (i >= argc) {
        kolorun_say("no command to run (see kolorun --help)");
        exit(2);
    }
    o->argv = argv + i;
    if (o->mpi && o->nhosts > 0) {
        kolorun_say("--mpi with -H/--hostfile: start the job with mpirun "
                    "itself (mpirun -H ... prog), or drop --mpi and let "
                    "kolorun start the hosts");
        exit(2);
    }
    if (o->mpi && o->gloo) {
        kolorun_say("--gloo and --mpi choose different launchers: give one "
                    "(under --mpi, KOLO_CONTROLLER=gloo negotiates over Gloo)");
        exit(2);
    }
    if (o->mpi && o->grace_given) {
        kolorun_say("--failure-grace has no effect with --mpi: mpirun stops "
                    "the whole job when a rank fails");
        exit(2);
    }
    if (o->mpi_args && !o->mpi)
        kolorun_refuse("--mpi-args", "kolorun starts the ranks itself "
                       "unless --mpi runs them through mpirun: add --mpi, "
                       "or drop --mpi-args");
    if (o->binding_args && !o->mpi)
        kolorun_refuse("--binding-args", "kolorun does not bind ranks to "
                       "cores; --mpi hands the binding to mpirun");
    /* horovodrun --tcp: NCCL stays off InfiniBand (and, under --mpi, Open
     * MPI on TCP, see kolorun_exec_mpirun); Gloo is TCP already. */
    if (o->tcp)
        kolorun_setting_put(o, "NCCL_IB_DISABLE", NULL, kolorun_strdupf("1"));
    if (o->nics)
        kolorun_setting_put(o, "NCCL_SOCKET_IFNAME", NULL,
                            kolorun_strdupf("%s", o->nics));
}

/* Gives every rank the settings of horovodrun's flags: in kolorun's own
 * environment, which the ranks here inherit, the command line of ranks on
 * other hosts carries (kolorun_remote_command) and mpirun passes on (-x).
 * A flag's KOLO_* variable wins over its HOROVOD_* twin in the runtime
 * anyway; removing the twin spares the ranks the warning that the two
 * differ, as horovodrun overwrites it. */
static void kolorun_settings_apply(const kolorun_opts_t *o)
{
    for (int i = 0; i < o->nsettings; i++) {
        if (setenv(o->settings[i].var, o->settings[i].value, 1) != 0) {
            kolorun_say("out of memory");
            exit(1);
        }
        if (o->settings[i].twin)
            unsetenv(o->settings[i].twin);
    }
}

/* Whether kolorun passes variable NAME=... on to ranks it does not start
 * itself (other hosts, mpirun): kolo's, Horovod's twins, and what the
 * flags set. */
static int kolorun_passed_on(const kolorun_opts_t *o, const char *entry)
{
    size_t n = strcspn(entry, "=");
    if (entry[n] != '=')
        return 0;
    if (strncmp(entry, "KOLO_", 5) == 0 || strncmp(entry, "HOROVOD_", 8) == 0)
        return 1;
    for (int i = 0; i < o->nsettings; i++)
        if (strlen(o->settings[i].var) == n &&
            strncmp(entry, o->settings[i].var, n) == 0)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------------
 * --mpi: the job runs under mpirun
 */

/* A string list that grows; NULL-terminated; strings owned. */
typedef struct kolorun_words {
    char **w;
    int n, cap;
    int oom;
} kolorun_words_t;

static void kolorun_words_add(kolorun_words_t *ws, char *owned)
{
    if (!owned || ws->oom) {
        free(owned);
        ws->oom = 1;
        return;
    }
    if (ws->n + 2 > ws->cap) {
        int cap = ws->cap ? ws->cap * 2 : 32;
        char **w = realloc(ws->w, (size_t)cap * sizeof *w);
        if (!w) {
            free(owned);
            ws->oom = 1;
            return;
        }
        ws->w = w;
        ws->cap = cap;
    }
    ws->w[ws->n++] = owned;
    ws->w[ws->n] = NULL;
}

static void kolorun_words_free(kolorun_words_t *ws)
{
    for (int i = 0; i < ws->n; i++)
        free(ws->w[i]);
    free(ws->w);
    memset(ws, 0, sizeof *ws);
}

/* Splits --mpi-args (or --binding-args) into words at blanks; quotes
 * ('...' or "...") keep blanks in a word, as the shell horovodrun hands its
 * command line to would. */
static void kolorun_split_words(const char *text, kolorun_words_t *out)
{
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            return;
        char *w = malloc(strlen(p) + 1);
        size_t n = 0;
        char q = 0;
        if (!w) {
            out->oom = 1;
            return;
        }
        for (; *p && (q || (*p != ' ' && *p != '\t')); p++) {
            if (q && *p == q)
                q = 0;
            else if (!q && (*p == '\'' || *p == '"'))
                q = *p;
            else
                w[n++] = *p;
        }
        w[n] = '\0';
        kolorun_words_add(out, w);
    }
}

/* Replaces kolorun with `mpirun [--allow-run-as-root] [--oversubscribe]
 * --bind-to none -np N [--tag-output] -x KOLO_... command args`. The ranks
 * learn their places from MPI, so kolorun's own KOLO_RANK/SIZE/LOCAL/CROSS
 * variables must not reach them. --bind-to none: mpirun binds each rank to
 * one core by default, where its background thread would compete with its
 * training thread (shared/MEASUREMENTS.md); --binding-args replaces it.
 * horovodrun's flags go to mpirun as horovodrun's mpi_run.py hands them
 * over: --output-filename and --prefix-output-with-timestamp
 * (--timestamp-output) to mpirun's own, --tcp as Open MPI's ob1 without
 * openib, --network-interfaces as btl_tcp_if_include, the ssh port and
 * identity as plm_rsh_args, and --mpi-args last. Every KOLO_* and
 * HOROVOD_* variable, and what the flags set, goes with -x. Returns only
 * on failure: kolorun's exit status. */
static int kolorun_exec_mpirun(const kolorun_opts_t *o, int64_t job_start_us)
{
    static const char *const placement[] = {
        "KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
        "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"};
    extern char **environ;
    const char *mpirun = getenv("KOLO_MPIRUN");
    char np[16], start_us[32];
    kolorun_words_t av = {0};
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (mpirun == NULL || *mpirun == '\0')
        mpirun = "mpirun";
    for (size_t j = 0; j < sizeof placement / sizeof placement[0]; j++)
        unsetenv(placement[j]);
    snprintf(start_us, sizeof start_us, "%lld", (long long)job_start_us);
    if ((o->start_timeout &&
         setenv("KOLO_START_TIMEOUT", o->start_timeout, 1) != 0) ||
        (o->network_interface &&
         setenv("KOLO_NETWORK_INTERFACE", o->network_interface, 1) != 0) ||
        setenv("KOLO_JOB_START_US", start_us, 1) != 0) {
        kolorun_say("out of memory");
        return 1;
    }
    snprintf(np, sizeof np, "%d", o->np);
    kolorun_words_add(&av, strdup(mpirun));
    if (geteuid() == 0)
        kolorun_words_add(&av, strdup("--allow-run-as-root"));
    if (cpus > 0 && o->np > cpus)
        kolorun_words_add(&av, strdup("--oversubscribe"));
    if (o->binding_args) {
        kolorun_split_words(o->binding_args, &av);
    } else {
        kolorun_words_add(&av, strdup("--bind-to"));
        kolorun_words_add(&av, strdup("none"));
    }
    kolorun_words_add(&av, strdup("-np"));
    kolorun_words_add(&av, strdup(np));
    if (o->tag_output)
        kolorun_words_add(&av, strdup("--tag-output"));
    if (o->timestamp)
        kolorun_words_add(&av, strdup("--timestamp-output"));
    if (o->output_dir) {
        kolorun_words_add(&av, strdup("--output-filename"));
        kolorun_words_add(&av, strdup(o->output_dir));
    }
    if (o->tcp) {
        kolorun_words_add(&av, strdup("--mca"));
        kolorun_words_add(&av, strdup("pml"));
        kolorun_words_add(&av, strdup("ob1"));
        kolorun_words_add(&av, strdup("--mca"));
        kolorun_words_add(&av, strdup("btl"));
        kolorun_words_add(&av, strdup("^openib"));
    }
    if (o->nics) {
        kolorun_words_add(&av, strdup("--mca"));
        kolorun_words_add(&av, strdup("btl_tcp_if_include"));
        kolorun_words_add(&av, strdup(o->nics));
    }
    if (o->ssh_port || o->ssh_identity) {
        kolorun_words_add(&av, strdup("--mca"));
        kolorun_words_add(&av, strdup("plm_rsh_args"));
        kolorun_words_add(&av, kolorun_strdupf(
            "%s%s%s%s%s", o->ssh_port ? "-p " : "", o->ssh_port ? o->ssh_port : "",
            o->ssh_port && o->ssh_identity ? " " : "",
            o->ssh_identity ? "-i " : "", o->ssh_identity ? o->ssh_identity : ""));
    }
    for (char **e = environ; *e; e++) {
        if (!kolorun_passed_on(o, *e))
            continue;
        kolorun_words_add(&av, strdup("-x"));
        kolorun_words_add(&av, kolorun_strdupf("%.*s", (int)strcspn(*e, "="), *e));
    }
    if (o->mpi_args)
        kolorun_split_words(o->mpi_args, &av);
    for (char **a = o->argv; *a; a++)
        kolorun_words_add(&av, strdup(*a));
    if (av.oom) {
        kolorun_say("out of memory");
        return 1;
    }
    if (o->verbose) {
        fprintf(stderr, "kolorun: running");
        for (int j = 0; j < av.n; j++)
            fprintf(stderr, " %s", av.w[j]);
        fputc('\n', stderr);
    }
    fflush(NULL);
    execvp(mpirun, av.w);
    int why = errno;
    kolorun_say("--mpi: cannot run %s: %s (install Open MPI's mpirun, e.g. "
                "the openmpi-bin package, or name one with KOLO_MPIRUN)",
                mpirun, strerror(why));
    kolorun_words_free(&av);
    return why == ENOENT ? 127 : 1;
}

/* ------------------------------------------------------------------------
 * Rendezvous directory
 */

/* Creates a fresh private directory and stores its absolute path. An
 * absolute path, because a rank may change its working directory before it
 * looks for its peers. */
static int kolorun_rdv_create(kolorun_t *k)
{
    const char *base = k->opts.rdv_base ? k->opts.rdv_base : getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base);
    while (n > 1 && base[n - 1] == '/')
        n--;
    char *tmpl = kolorun_strdupf("%.*s/kolo-rdv-XXXXXX", (int)n, base);
    if (!tmpl) {
        kolorun_say("out of memory");
        return -1;
    }
    if (!mkdtemp(tmpl)) {
        kolorun_say("cannot create the rendezvous directory %s: %s", tmpl,
                    strerror(errno));
        free(tmpl);
        return -1;
    }
    k->rdv_dir = realpath(tmpl, NULL);
    if (!k->rdv_dir) {
        k->rdv_dir = tmpl; /* still removable by the path we made */
        return 0;
    }
    free(tmpl);
    return 0;
}

/* Removes directory `name` (relative to dirfd) and everything in it,
 * following no symbolic link: ranks may leave anything there. */
static int kolorun_rmtree_at(int dirfd, const char *name, int depth)
{
    if (depth > KOLORUN_RMTREE_DEPTH) {
        errno = ELOOP;
        return -1;
    }
    /* Empty (ranks that end cleanly leave nothing): no descriptor needed,
     * which counts when kolorun ran out of them. */
    if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0)
        return 0;
    int fd = openat(dirfd, name,
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    /* A rank may have made a directory read-only; it is ours to remove. */
    (void)fchmod(fd, S_IRWXU);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    /* Removing entries while reading the directory may make readdir skip
     * some on some file systems; a few passes settle it. */
    for (int pass = 0; pass < 3; pass++) {
        int removed = 0;
        struct dirent *e;
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (unlinkat(fd, e->d_name, 0) == 0 ||
                ((errno == EISDIR || errno == EPERM) &&
                 kolorun_rmtree_at(fd, e->d_name, depth + 1) == 0))
                removed++;
        }
        if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0) {
            closedir(d);
            return 0;
        }
        if (errno != ENOTEMPTY && errno != EEXIST)
            break;
        if (!removed)
            break;
    }
    int saved = errno;
    closedir(d);
    errno = saved;
    return -1;
}

/* Removes the shared-memory segments (ops/shm) the job's ranks left in
 * /dev/shm. Ranks unlink them as soon as every member has attached, so only
 * a rank killed during start-up leaves one. Their names begin with
 * "kolo-" and the FNV-1a hash of the job's KOLO_RENDEZVOUS, as in
 * shm_ops.c. */
static void kolorun_shm_sweep(const kolorun_t *k, const char *rendezvous)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    char prefix[32];
    DIR *d;
    struct dirent *e;

    for (const char *p = rendezvous; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ULL;
    }
    snprintf(prefix, sizeof(prefix), "kolo-%08x-", (unsigned)(h & 0xffffffffu));
    d = opendir("/dev/shm");
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 &&
            unlinkat(dirfd(d), e->d_name, 0) == 0 && k->opts.verbose)
            kolorun_say("removed leftover shared memory /dev/shm/%s", e->d_name);
    closedir(d);
}

/* The KOLO_RENDEZVOUS every rank gets (NULL: out of memory). */
static char *kolorun_rendezvous(const kolorun_t *k)
{
    if (k->redis_addr[0])
        return kolorun_strdupf("redis:%s/%s", k->redis_addr, k->job_id);
    return kolorun_strdupf("file:%s", k->rdv_dir);
}

static void kolorun_rdv_remove(kolorun_t *k)
{
    char *rdv = k->redis_addr[0] || k->rdv_dir ? kolorun_rendezvous(k) : NULL;
    if (rdv) {
        kolorun_shm_sweep(k, rdv);
        free(rdv);
    }
    if (!k->rdv_dir)
        return;
    if (kolorun_rmtree_at(AT_FDCWD, k->rdv_dir, 0) != 0 && errno != ENOENT)
        kolorun_say("warning: cannot remove the rendezvous directory %s: %s",
                    k->rdv_dir, strerror(errno));
    else if (k->opts.verbose)
        kolorun_say("removed rendezvous directory %s", k->rdv_dir);
    free(k->rdv_dir);
    k->rdv_dir = NULL;
}

/* ------------------------------------------------------------------------
 * Signals
 */

static void kolorun_on_signal(int sig)
{
    int saved = errno;
    kolorun_pending[sig] = 1;
    /* If the pipe is full the loop is already due to wake: drop the byte. */
    char b = 0;
    ssize_t w = write(kolorun_wake_fd, &b, 1);
    (void)w;
    errno = saved;
}

static int kolorun_install(kolorun_t *k, int sig, int respect_ignore)
{
    struct sigaction old, sa;
    if (sigaction(sig, NULL, &old) != 0)
        return -1;
    if (respect_ignore && old.sa_handler == SIG_IGN)
        return 0; /* ignored by whoever started us: stay so */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = kolorun_on_signal;
    sigemptyset(&sa.sa_mask);
    /* SA_RESTART: a write to a slow terminal resumes instead of failing;
     * poll() returns EINTR regardless, and the self-pipe wakes it anyway. */
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    if (sigaction(sig, &sa, NULL) != 0)
        return -1;
    k->handled[sig] = 1;
    return 0;
}

static int kolorun_signals_setup(kolorun_t *k)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
        kolorun_say("cannot create a pipe: %s", strerror(errno));
        return -1;
    }
    kolorun_wake_fd = p[1];
    if (kolorun_install(k, SIGCHLD, 0) != 0 ||
        kolorun_install(k, SIGTSTP, 1) != 0) {
        kolorun_say("cannot install signal handlers: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++) {
        if (kolorun_install(k, kolorun_stop_signals[i], 1) != 0) {
            kolorun_say("cannot install signal handlers: %s", strerror(errno));
            return -1;
        }
    }
    /* A closed output must come back as EPIPE, which kolorun handles, not
     * kill kolorun. The ranks get the original disposition back. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &k->sigpipe_orig);
    /* The signals kolorun handles must reach it even if its parent blocked
     * them; the ranks get the original mask back. */
    sigset_t s;
    sigemptyset(&s);
    for (int sig = 1; sig < NSIG; sig++)
        if (k->handled[sig])
            sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, &k->mask_orig);
    return p[0];
}

/* Sends sig to the ranks' process group — the ranks and whatever they
 * started — and, by pid, to each running rank that left the group (setsid).
 * The group is signalled only while its id is certainly still ours: the
 * holder or a rank in the group is unreaped. */
static void kolorun_signal_ranks(kolorun_t *k, int sig)
{
    if (k->pgid <= 0)
        return;
    int group_ours = !k->holder_reaped;
    for (int r = 0; r < k->nstarted; r++)
        if (!k->ranks[r].reaped && getpgid(k->ranks[r].pid) == k->pgid)
            group_ours = 1;
    if (group_ours)
        kill(-k->pgid, sig);
    for (int r = 0; r < k->nstarted; r++)
        if (!k->ranks[r].reaped && getpgid(k->ranks[r].pid) != k->pgid)
            kill(k->ranks[r].pid, sig);
}

/* The names people know signals by, for kolorun's own messages. */
static const char *kolorun_signame(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGKILL: return "SIGKILL";
    default: return strsignal(sig);
    }
}

/* Starts stopping the job: sig now, SIGKILL after the grace period. */
/* Closes the stdin pipes of the ranks started by ssh: on the other host
 * each one's wrapper sees end of file and sends its rank SIGTERM. (The
 * signal to ssh ends ssh, and with it the connection, to the same effect;
 * closing the pipe also covers a launch process that outlives the signal.) */
static void kolorun_release_remote(kolorun_t *k, int r)
{
    for (int i = r < 0 ? 0 : r; i < (r < 0 ? k->nstarted : r + 1); i++) {
        if (k->ranks[i].hold_fd >= 0)
            close(k->ranks[i].hold_fd);
        k->ranks[i].hold_fd = -1;
    }
}

static void kolorun_stop(kolorun_t *k, int sig)
{
    if (k->stopping)
        return;
    /* Ranks that end from now on are not causes: choose among the failed. */
    if (k->failed_rank < 0)
        kolorun_blame(k);
    kolorun_release_remote(k, -1);
    k->stopping = 1;
    k->stop_ms = kolorun_now_ms();
    if (k->opts.verbose && k->nalive > 0)
        kolorun_say("sending %s to %d running rank%s", kolorun_signame(sig),
                    k->nalive, k->nalive == 1 ? "" : "s");
    kolorun_signal_ranks(k, sig);
}

/* SIGKILL to the group: the ranks still running and anything they left.
 * This ends the holder too. */
static void kolorun_kill_now(kolorun_t *k)
{
    if (k->killed)
        return;
    k->killed = 1;
    k->killed_ms = kolorun_now_ms();
    if (k->opts.verbose)
        kolorun_say("sending SIGKILL to what is left of the job (%d "
                    "rank%s running)",
                    k->nalive, k->nalive == 1 ? "" : "s");
    kolorun_signal_ranks(k, SIGKILL);
}

/* Ctrl-Z: stop the ranks, stop kolorun; on SIGCONT continue both. Without
 * this only kolorun would stop, the ranks being in their own group. */
static void kolorun_suspend(kolorun_t *k)
{
    kolorun_signal_ranks(k, SIGTSTP);
    struct sigaction dfl, mine;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTSTP, &dfl, &mine);
    raise(SIGTSTP); /* returns once someone sends SIGCONT */
    sigaction(SIGTSTP, &mine, NULL);
    kolorun_signal_ranks(k, SIGCONT);
}

static void kolorun_on_stop_signal(kolorun_t *k, int sig)
{
    if (!k->stopping) {
        if (k->nalive > 0)
            kolorun_say("got %s: stopping %d rank%s", kolorun_signame(sig),
                        k->nalive, k->nalive == 1 ? "" : "s");
        k->stop_signal = sig;
        kolorun_stop(k, sig);
        return;
    }
    /* Already stopping. Only a person presses Ctrl-C again to mean "now";
     * repeated SIGTERMs (a supervisor signalling the process and then its
     * group) keep the grace period. */
    if (sig == SIGINT && !k->killed &&
        kolorun_now_ms() - k->stop_ms >= KOLORUN_DOUBLE_INT_MS) {
        if (k->nalive > 0)
            kolorun_say("got %s again: killing the ranks",
                        kolorun_signame(sig));
        kolorun_kill_now(k);
    }
}

/* ------------------------------------------------------------------------
 * Output
 */

static void kolorun_sink_flush(kolorun_sink_t *s)
{
    if (s->len > 0 && !s->broken &&
        kolorun_write_all(s->fd, s->buf, s->len) != 0)
        s->broken = errno ? errno : EIO;
    s->len = 0;
}

/* Adds one record (prefix, data, optional newline) to a sink; a record never
 * straddles two writes. */
static void kolorun_sink_put(kolorun_sink_t *s, const char *prefix,
                             size_t plen, const char *data, size_t n,
                             int newline)
{
    if (s->broken)
        return;
    size_t need = plen + n + (newline ? 1 : 0);
    if (s->len + need > KOLORUN_SINK_CAP)
        kolorun_sink_flush(s);
    /* need <= KOLORUN_LINE_MAX + prefix + 1 < KOLORUN_SINK_CAP */
    memcpy(s->buf + s->len, prefix, plen);
    memcpy(s->buf + s->len + plen, data, n);
    s->len += plen + n;
    if (newline)
        s->buf[s->len++] = '\n';
}

/* The survivors of a lost rank say so in the runtime's words, "lost rank 1
 * (pid 42) has exited or was killed": note each rank of this job so named,
 * for kolorun_blame. A pid that is not the rank's is someone else's text. */
static void kolorun_note_lost(kolorun_t *k, const char *p, size_t n)
{
    static const char key[] = "lost rank ";
    const char *end = p + n;
    while ((p = memmem(p, (size_t)(end - p), key, sizeof key - 1)) != NULL) {
        p += sizeof key - 1;
        char text[64];
        size_t len = (size_t)(end - p) < sizeof text - 1 ? (size_t)(end - p)
                                                          : sizeof text - 1;
        memcpy(text, p, len);
        text[len] = '\0';
        int r;
        long pid;
        if (sscanf(text, "%d (pid %ld)", &r, &pid) == 2 && r >= 0 &&
            r < k->nstarted && (long)k->ranks[r].pid == pid)
            k->ranks[r].named_lost = 1;
    }
}

/* --output-filename: the same record into the rank's file. A file that
 * cannot be written (a full disk) is said once and closed; the job and the
 * terminal's copy go on. */
static void kolorun_file_put(kolorun_t *k, int r, int which, const char *prefix,
                             size_t plen, const char *data, size_t n,
                             int newline)
{
    int *fd = &k->ranks[r].files[which];
    if (*fd < 0)
        return;
    if ((plen > 0 && kolorun_write_all(*fd, prefix, plen) != 0) ||
        kolorun_write_all(*fd, data, n) != 0 ||
        (newline && kolorun_write_all(*fd, "\n", 1) != 0)) {
        kolorun_say("warning: cannot write rank %d's %s to %s/rank.*/%s: %s; "
                    "the rest goes to the terminal only",
                    r, which == KOLORUN_OUT ? "stdout" : "stderr",
                    k->opts.output_dir, which == KOLORUN_OUT ? "stdout" : "stderr",
                    strerror(errno));
        close(*fd);
        *fd = -1;
    }
}

/* What goes before each line of rank r's stream: with
 * --prefix-output-with-timestamp the local time as horovodrun writes it
 * (Python's time.asctime: "Mon Jun  5 10:00:00 2023"), then with
 * --tag-output "[r]<stdout>:"; a blank between the time and an untagged
 * line. Empty: the bytes pass unchanged. */
static size_t kolorun_line_prefix(const kolorun_t *k, int r, int which,
                                  char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    if (k->opts.timestamp) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        len = strftime(out, n, "%a %b %e %H:%M:%S %Y", &tm);
    }
    if (k->opts.tag_output)
        len += (size_t)snprintf(out + len, n - len, "[%d]<%s>:", r,
                                which == KOLORUN_OUT ? "stdout" : "stderr");
    else if (len > 0)
        len += (size_t)snprintf(out + len, n - len, " ");
    return len;
}

/* Moves the whole lines of one stream to its sink (and its file); at end
 * of file, also the last unterminated line; when the buffer is full of one
 * line, a piece. */
static void kolorun_stream_emit(kolorun_t *k, int r, int which, int at_eof)
{
    kolorun_stream_t *st = &k->ranks[r].streams[which];
    kolorun_sink_t *sink = &k->sinks[which];
    size_t done = 0;
    char prefix[96];
    size_t plen = kolorun_line_prefix(k, r, which, prefix, sizeof prefix);

    if (plen == 0) {
        /* Unchanged bytes: everything up to the last newline, in one go. */
        size_t end = st->len;
        while (end > 0 && st->buf[end - 1] != '\n')
            end--;
        if (at_eof || (end == 0 && st->len == KOLORUN_LINE_MAX))
            end = st->len;
        if (end > 0) {
            kolorun_sink_put(sink, "", 0, st->buf, end, 0);
            kolorun_file_put(k, r, which, "", 0, st->buf, end, 0);
        }
        done = end;
    } else {
        for (;;) {
            char *nl = memchr(st->buf + done, '\n', st->len - done);
            if (!nl)
                break;
            size_t n = (size_t)(nl - (st->buf + done)) + 1;
            kolorun_sink_put(sink, prefix, plen, st->buf + done, n, 0);
            kolorun_file_put(k, r, which, prefix, plen, st->buf + done, n, 0);
            done += n;
        }
        /* Prefixed output is made of lines: a piece or a last line without
         * a newline gets one, so that the next prefix starts a line. */
        size_t rest = st->len - done;
        if (rest > 0 && (at_eof || rest == KOLORUN_LINE_MAX)) {
            kolorun_sink_put(sink, prefix, plen, st->buf + done, rest, 1);
            kolorun_file_put(k, r, which, prefix, plen, st->buf + done, rest, 1);
            done = st->len;
        }
    }
    if (k->failed_rank < 0)
        kolorun_note_lost(k, st->buf, done);
    memmove(st->buf, st->buf + done, st->len - done);
    st->len -= done;
}

static void kolorun_stream_close(kolorun_stream_t *st)
{
    if (st->fd >= 0)
        close(st->fd);
    st->fd = -1;
    st->len = 0;
}

/* After kolorun's stdout (or stderr) turned out to be a closed pipe: close
 * the ranks' pipes to it, so they see the broken pipe themselves. */
static void kolorun_sink_check(kolorun_t *k, int which)
{
    kolorun_sink_t *sink = &k->sinks[which];
    if (!sink->broken || sink->sources_closed)
        return;
    sink->sources_closed = 1;
    if (sink->broken != EPIPE)
        return; /* other errors: keep reading, discard */
    if (k->opts.verbose)
        kolorun_say("%s is a closed pipe: closing the ranks' %s too",
                    which == KOLORUN_OUT ? "stdout" : "stderr",
                    which == KOLORUN_OUT ? "stdout" : "stderr");
    for (int r = 0; r < k->nstarted; r++)
        kolorun_stream_close(&k->ranks[r].streams[which]);
}

/* Reads a rank's pipe: once (fair to the other ranks) or, when the rank is
 * gone, until nothing is left, so that its last words come before the line
 * that says how it ended. */
static void kolorun_stream_read(kolorun_t *k, int r, int which, int until_empty)
{
    kolorun_stream_t *st = &k->ranks[r].streams[which];
    /* Bounded: something the rank left behind may still be writing. */
    for (int reads = 0; st->fd >= 0 && reads < 64; reads++) {
        ssize_t n = read(st->fd, st->buf + st->len, KOLORUN_LINE_MAX - st->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) { /* end of file, or an error that ends it the same */
            kolorun_stream_emit(k, r, which, 1);
            kolorun_stream_close(st);
            break;
        }
        st->len += (size_t)n;
        kolorun_stream_emit(k, r, which, 0);
        if (!until_empty)
            break;
    }
    kolorun_sink_flush(&k->sinks[which]);
    kolorun_sink_check(k, which);
}

/* ------------------------------------------------------------------------
 * Ranks
 */

static void kolorun_describe(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "ended with wait status 0x%x", (unsigned)status);
}

/* Says how rank r ended: "rank 1 (pid 42) exited with status 3", with its
 * host on a job of several hosts (for a rank on another host the pid is the
 * launch command's, which stands for it), then hint. */
static void kolorun_rank_say(const kolorun_t *k, int r, const char *hint)
{
    const kolorun_rank_t *rk = &k->ranks[r];
    const kolorun_host_t *h = kolorun_host_of(k, r);
    char how[128], where[400] = "";
    kolorun_describe(rk->status, how, sizeof how);
    if (h)
        snprintf(where, sizeof where, " on host %s", h->name);
    kolorun_say("rank %d%s (pid %ld) %s%s", r, where, (long)rk->pid, how,
                hint);
}

/* How likely rank r, one of the failed, is the cause: killed by a signal
 * beats named lost by a survivor beats exited with an error of its own. */
static int kolorun_blame_weight(const kolorun_rank_t *rk)
{
    if (WIFSIGNALED(rk->status))
        return 2;
    return rk->named_lost ? 1 : 0;
}

/* Chooses the cause among the ranks that have failed so far (see "Ending"
 * at the top of this file) and prints the one line everyone reads. The
 * other ranks are stopped after the failure grace, by the loop: the runtime
 * tells each of them which rank it lost, and a program that reports that
 * and exits should be heard, not killed mid-sentence. */
static void kolorun_blame(kolorun_t *k)
{
    int cause = -1, best = -1, first = 0;
    for (int r = 0; r < k->nstarted; r++) {
        const kolorun_rank_t *rk = &k->ranks[r];
        if (!rk->failed_seq)
            continue;
        int w = kolorun_blame_weight(rk);
        if (w > best || (w == best && rk->failed_seq < first)) {
            cause = r;
            best = w;
            first = rk->failed_seq;
        }
    }
    if (cause < 0)
        return;
    const kolorun_host_t *h = kolorun_host_of(k, cause);
    int status = k->ranks[cause].status;
    const char *hint = "";
    if (h && !h->local && WIFEXITED(status)) {
        if (WEXITSTATUS(status) == 255 && !k->opts.launch_command)
            hint = ": ssh could not reach the host, log in without a "
                   "password (BatchMode), or lost the connection";
        else if (WEXITSTATUS(status) == 127)
            hint = ": the command (or the launch command) was not found "
                   "there";
        else if (WEXITSTATUS(status) == 126)
            hint = ": the command cannot be executed there";
    }
    kolorun_rank_say(k, cause, hint);
    k->failed_rank = cause;
    k->failed_status = status;
    if (k->opts.verbose)
        for (int r = 0; r < k->nstarted; r++)
            if (r != cause && k->ranks[r].failed_seq)
                kolorun_rank_say(k, r, " (not the cause)");
}

static void kolorun_rank_ended(kolorun_t *k, int r, int status)
{
    kolorun_rank_t *rk = &k->ranks[r];
    rk->reaped = 1;
    rk->status = status;
    k->nalive--;
    kolorun_release_remote(k, r);

    kolorun_stream_read(k, r, KOLORUN_OUT, 1);
    kolorun_stream_read(k, r, KOLORUN_ERR, 1);

    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !k->stopping && k->failed_rank < 0) {
        /* A failure: the cause is chosen by kolorun_blame, now if nothing
         * can outrank this one, else once the others had their moment. */
        rk->failed_seq = ++k->nsuspects;
        if (rk->failed_seq == 1)
            k->failed_ms = kolorun_now_ms();
        if (WIFSIGNALED(status))
            kolorun_blame(k);
    } else if (k->opts.verbose) {
        kolorun_rank_say(k, r, k->stopping && !ok ? " (stopped by kolorun)"
                                                  : "");
    }
}

static void kolorun_reap(kolorun_t *k)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            return;
        if (pid == k->pgid) {
            k->holder_reaped = 1;
            continue;
        }
        if (pid == k->redis_pid) {
            k->redis_reaped = 1;
            if (!k->stopping)
                kolorun_say("warning: the redis-server kolorun started "
                            "(pid %ld) has %s during the job",
                            (long)pid, WIFSIGNALED(status) ? "been killed"
                                                           : "exited");
            continue;
        }
        for (int r = 0; r < k->nstarted; r++) {
            if (k->ranks[r].pid == pid && !k->ranks[r].reaped) {
                kolorun_rank_ended(k, r, status);
                break;
            }
        }
    }
}

/* The host of rank r; NULL on a job of one machine without -H. */
static const struct kolorun_host *kolorun_host_of(const kolorun_t *k, int r)
{
    return k->rank_host ? &k->opts.hosts[k->rank_host[r]] : NULL;
}

/* The address rank r's transport binds, when nothing else says. */
static const char *kolorun_bind_host(const kolorun_t *k, int r, char *buf,
                                     size_t n)
{
    const kolorun_host_t *h = kolorun_host_of(k, r);
    if (!h || !k->opts.any_remote)
        return "127.0.0.1"; /* every rank here: loopback reaches them all */
    if (!h->local)
        return h->name;
    /* "localhost" cannot be reached from the other hosts: this host's
     * name can, where it resolves to a routable address (otherwise
     * --network-interface is the way). */
    if (gethostname(buf, n - 1) != 0 || buf[0] == '\0')
        return h->name;
    buf[n - 1] = '\0';
    return buf;
}

/* The environment of rank r, as "NAME=value" strings. */
static int kolorun_rank_env(const kolorun_t *k, int r,
                            char *env[KOLORUN_MAX_ENV])
{
    int n = 0;
    int np = k->opts.np;
    const kolorun_host_t *h = kolorun_host_of(k, r);
    char me[256];
    env[n++] = kolorun_strdupf("KOLO_RANK=%d", r);
    env[n++] = kolorun_strdupf("KOLO_SIZE=%d", np);
    if (!h) {
        /* One machine: local and global numbering are the same. */
        env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", r);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", np);
        env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=0");
        env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=1");
    } else {
        /* Hosts that got ranks are numbered in order: hosts without ranks
         * come after them, so the used ones are 0 .. nused - 1. */
        env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", r - h->first_rank);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", h->nranks);
        env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=%d", k->rank_host[r]);
        env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=%d", k->opts.nused);
    }
    {
        char *rdv = kolorun_rendezvous(k);
        env[n++] = rdv ? kolorun_strdupf("KOLO_RENDEZVOUS=%s", rdv) : NULL;
        free(rdv);
    }
    if (k->opts.network_interface)
        env[n++] = kolorun_strdupf("KOLO_NETWORK_INTERFACE=%s",
                                   k->opts.network_interface);
    else if (!getenv("KOLO_HOSTNAME"))
        env[n++] = kolorun_strdupf("KOLO_HOSTNAME=%s",
                                   kolorun_bind_host(k, r, me, sizeof me));
    /* Every rank's timeline counts time from the same moment. */
    env[n++] = kolorun_strdupf("KOLO_JOB_START_US=%lld",
                               (long long)k->job_start_us);
    if (k->opts.start_timeout)
        env[n++] = kolorun_strdupf("KOLO_START_TIMEOUT=%s",
                                   k->opts.start_timeout);
    /* -x NAME=VALUE holds for every rank; -x NAME only carries NAME to
     * other hosts (ranks here have it already). */
    for (int i = 0; i < k->opts.nxenv && n < KOLORUN_MAX_ENV - 1; i++)
        if (strchr(k->opts.xenv[i], '='))
            env[n++] = kolorun_strdupf("%s", k->opts.xenv[i]);
    for (int i = 0; i < n; i++)
        if (!env[i])
            return -1;
    return n;
}

/* s in single quotes for a POSIX shell: ' becomes '\''. */
static char *kolorun_shell_quote(const char *s)
{
    size_t n = 3;
    for (const char *p = s; *p; p++)
        n += *p == '\'' ? 4 : 1;
    char *q = malloc(n), *o = q;
    if (!q)
        return NULL;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o++ = '\'';
    *o = '\0';
    return q;
}

/* Whether env (n strings NAME=value) sets the variable of "NAME=...". */
static int kolorun_env_has(char **env, int n, const char *var)
{
    size_t len = strcspn(var, "=");
    for (int i = 0; i < n; i++)
        if (strncmp(env[i], var, len) == 0 && env[i][len] == '=')
            return 1;
    return 0;
}

/* What runs on the other host: env VAR=value... command args..., as words.
 * The environment the rank needs goes on this command line because
 * nothing says the launch command carries any (ssh does not): kolorun's
 * KOLO_* variables for the rank, every other KOLO_* set here (the user's
 * KOLO_LOG_LEVEL, KOLO_TIMEOUT_SECONDS, ...) and what -x names. */
static void kolorun_remote_command(const kolorun_t *k, char **env, int nenv,
                                   kolorun_words_t *out)
{
    extern char **environ;
    kolorun_words_add(out, strdup("env"));
    for (int i = 0; i < nenv; i++)
        kolorun_words_add(out, strdup(env[i]));
    for (char **e = environ; *e; e++)
        if (kolorun_passed_on(&k->opts, *e) && !kolorun_env_has(env, nenv, *e))
            kolorun_words_add(out, strdup(*e));
    for (int i = 0; i < k->opts.nxenv; i++) {
        const char *x = k->opts.xenv[i], *val;
        if (strchr(x, '=') || kolorun_env_has(env, nenv, x))
            continue; /* NAME=VALUE is in env already */
        if ((val = getenv(x)) != NULL)
            kolorun_words_add(out, kolorun_strdupf("%s=%s", x, val));
    }
    for (char **a = k->opts.argv; *a; a++)
        kolorun_words_add(out, strdup(*a));
}

/* Replaces the placeholders of one template word. */
static char *kolorun_expand(const char *word, const kolorun_host_t *h, int r,
                            const char *command)
{
    char rank[16], local[16];
    snprintf(rank, sizeof rank, "%d", r);
    snprintf(local, sizeof local, "%d", r - h->first_rank);
    const char *val[4] = {h->name, rank, local, command};
    size_t cap = strlen(word) + 1;
    for (size_t i = 0; i < 4; i++)
        cap += strlen(val[i]) * 4; /* each placeholder a few times at most */
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    for (const char *p = word; *p;) {
        size_t i;
        for (i = 0; i < 4; i++) {
            size_t pl = strlen(kolorun_placeholders[i]);
            if (strncmp(p, kolorun_placeholders[i], pl) == 0 &&
                (size_t)(o - out) + strlen(val[i]) < cap) {
                memcpy(o, val[i], strlen(val[i]));
                o += strlen(val[i]);
                p += pl;
                break;
            }
        }
        if (i == 4 && (size_t)(o - out) + 1 < cap)
            *o++ = *p++;
        else if (i == 4)
            p++;
    }
    *o = '\0';
    return out;
}

/* Whether a shell on the other host runs the rank's command: ssh, or a
 * template with {command}. Such ranks get the stdin wrapper below. */
static int kolorun_remote_shell(const kolorun_t *k)
{
    return !k->opts.launch_command ||
           strstr(k->opts.launch_command, "{command}") != NULL;
}

/* In a child before exec: kolorun's signal handlers back to the default,
 * SIGPIPE back to what kolorun inherited. */
static void kolorun_child_signals(const kolorun_t *k)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++)
        if (k->handled[sig])
            sigaction(sig, &dfl, NULL);
    sigaction(SIGPIPE, &k->sigpipe_orig, NULL);
}

/* The argv that starts rank r on its (other) host: the launch command
 * with its placeholders replaced. ssh by default:
 *   ssh -o BatchMode=yes -o ConnectTimeout=T [-p P] [-i F] HOST
 *       "cd 'CWD' 2>/dev/null; exec env 'KOLO_RANK=3' ... 'prog' 'arg'"
 * BatchMode: a password prompt would hang the start; ConnectTimeout: an
 * unreachable host fails within the start timeout. */
static int kolorun_launch_argv(const kolorun_t *k, int r, char **env,
                               int nenv, kolorun_words_t *argv)
{
    const kolorun_host_t *h = kolorun_host_of(k, r);
    kolorun_words_t cmd = {0}, tmpl = {0};
    char *command = NULL;
    int rc = -1;

    kolorun_remote_command(k, env, nenv, &cmd);
    if (cmd.oom)
        goto free_words;
    /* The same command as one shell word, for {command} and ssh. */
    size_t len = 64;
    char cwd[4096];
    int have_cwd = getcwd(cwd, sizeof cwd) != NULL;
    char *qcwd = have_cwd ? kolorun_shell_quote(cwd) : NULL;
    len += qcwd ? strlen(qcwd) : 0;
    for (int i = 0; i < cmd.n; i++)
        len += strlen(cmd.w[i]) * 4 + 3;
    command = malloc(len);
    if (!command || (have_cwd && !qcwd)) {
        free(qcwd);
        goto free_words;
    }
    size_t used = (size_t)snprintf(command, len, "%s%s%sexec", qcwd ? "cd " : "",
                                   qcwd ? qcwd : "",
                                   qcwd ? " 2>/dev/null; " : "");
    free(qcwd);
    for (int i = 0; i < cmd.n; i++) {
        char *q = kolorun_shell_quote(cmd.w[i]);
        if (!q)
            goto free_words;
        used += (size_t)snprintf(command + used, len - used, " %s", q);
        free(q);
    }

    /* ssh: no signal kolorun sends reaches the remote rank, and killing
     * ssh does not end it either (without a terminal, sshd sends no
     * SIGHUP). So the rank runs under a small sh wrapper that watches its
     * stdin, a pipe from kolorun through ssh: at end of file (kolorun
     * closed it, or ssh or its connection is gone) the wrapper sends the
     * rank SIGTERM. Otherwise it waits for the rank and exits with its
     * status. In sh -c, whatever the login shell on that host is. The
     * same goes for every template with {command}; a template without it
     * (ip netns exec {host}) execs the rank itself, which gets signals. */
    if (kolorun_remote_shell(k)) {
        char *script = kolorun_strdupf(
            "%s </dev/null & p=$!; exec 3<&0; "
            "(read _ <&3; kill -TERM $p 2>/dev/null) & w=$!; exec 3<&-; "
            "wait $p; s=$?; kill $w 2>/dev/null; exit $s",
            command);
        char *q = script ? kolorun_shell_quote(script) : NULL;
        free(script);
        free(command);
        command = q ? kolorun_strdupf("sh -c %s", q) : NULL;
        free(q);
        if (!command)
            goto free_words;
    }

    int has_command = 0;
    if (k->opts.launch_command) {
        char *t = strdup(k->opts.launch_command), *save = NULL, *w;
        if (!t)
            goto free_words;
        for (w = strtok_r(t, " \t", &save); w; w = strtok_r(NULL, " \t", &save))
            kolorun_words_add(&tmpl, strdup(w));
        free(t);
    } else {
        kolorun_words_add(&tmpl, strdup("ssh"));
        kolorun_words_add(&tmpl, strdup("-o"));
        kolorun_words_add(&tmpl, strdup("BatchMode=yes"));
        kolorun_words_add(&tmpl, strdup("-o"));
        kolorun_words_add(&tmpl, kolorun_strdupf(
            "ConnectTimeout=%s",
            k->opts.start_timeout ? k->opts.start_timeout : "60"));
        if (k->opts.ssh_port) {
            kolorun_words_add(&tmpl, strdup("-p"));
            kolorun_words_add(&tmpl, strdup(k->opts.ssh_port));
        }
        if (k->opts.ssh_identity) {
            kolorun_words_add(&tmpl, strdup("-i"));
            kolorun_words_add(&tmpl, strdup(k->opts.ssh_identity));
        }
        kolorun_words_add(&tmpl, strdup("{host}"));
        kolorun_words_add(&tmpl, strdup("{command}"));
    }
    if (tmpl.oom)
        goto free_words;
    for (int i = 0; i < tmpl.n; i++) {
        has_command |= strstr(tmpl.w[i], "{command}") != NULL;
        kolorun_words_add(argv, kolorun_expand(tmpl.w[i], h, r, command));
    }
    if (!has_command)
        for (int i = 0; i < cmd.n; i++)
            kolorun_words_add(argv, strdup(cmd.w[i]));
    rc = argv->oom ? -1 : 0;

free_words:
    free(command);
    kolorun_words_free(&tmpl);
    kolorun_words_free(&cmd);
    return rc;
}

/* What a child that could not become its rank tells kolorun, on a pipe
 * that exec closes (close-on-exec): end of file with nothing read means the
 * rank runs. Without it a child could only exit 127, and kolorun would
 * report a rank that never ran as "exited with status 127". */
typedef struct kolorun_child_error {
    int step; /* what failed: kolorun_child_step */
    int err;  /* its errno */
} kolorun_child_error_t;

enum kolorun_child_step {
    KOLORUN_STEP_STDIN = 1, /* open /dev/null for the rank's stdin */
    KOLORUN_STEP_DUP2,      /* stdin, stdout and stderr onto fds 0, 1, 2 */
    KOLORUN_STEP_PDEATHSIG, /* prctl(PR_SET_PDEATHSIG) */
    KOLORUN_STEP_EXEC,      /* execvp of the command (or launch command) */
};

/* In the child: tells kolorun what failed and exits. */
__attribute__((noreturn)) static void kolorun_child_fail(int status_w,
                                                         int step, int err)
{
    kolorun_child_error_t ce = {step, err};
    /* 8 bytes into an empty pipe: written whole, or kolorun is gone. */
    ssize_t w = write(status_w, &ce, sizeof ce);
    (void)w;
    _exit(127);
}

/* In the child, between fork and exec. kolorun is single-threaded, so the
 * child may call what it likes; it must not return. */
__attribute__((noreturn)) static void
kolorun_child(const kolorun_t *k, pid_t launcher, int status_w, int in_fd,
              int out_w, int err_w, char **env, int nenv, char **exec_argv)
{
    /* Handlers of kolorun make no sense here; exec would reset them anyway,
     * but a signal may come before it. SIGPIPE goes back to what kolorun
     * inherited. */
    kolorun_child_signals(k);

    /* Join the ranks' group. The parent does the same, whichever of the
     * two runs first. */
    setpgid(0, k->pgid);

    int in = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_STDIN, errno);
    if (dup2(in, STDIN_FILENO) < 0 || dup2(out_w, STDOUT_FILENO) < 0 ||
        dup2(err_w, STDERR_FILENO) < 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_DUP2, errno);

    /* Die with the launcher. If it died already, before the request took
     * effect, our parent is someone else now: stop here, telling no one. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_PDEATHSIG, errno);
    if (getppid() != launcher)
        _exit(127);

    for (int i = 0; i < nenv; i++)
        putenv(env[i]);

    sigprocmask(SIG_SETMASK, &k->mask_orig, NULL);
    execvp(exec_argv[0], exec_argv);
    kolorun_child_fail(status_w, KOLORUN_STEP_EXEC, errno);
}

/* After fork: waits until the child has exec'd the rank (0) or failed. A
 * failed child is reaped here, and kolorun says why it could not start the
 * rank; returns kolorun's exit status then: the shell's 127 (not found) or
 * 126 (found, not runnable) for a command that cannot be run, else 1. */
static int kolorun_child_wait(int r, pid_t pid, int status_r,
                              const char *prog, const char *host)
{
    kolorun_child_error_t ce;
    ssize_t n;
    do
        n = read(status_r, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce)
        return 0; /* end of file: exec closed the pipe, the rank runs */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    const char *e = strerror(ce.err);
    switch (ce.step) {
    case KOLORUN_STEP_STDIN:
        kolorun_say("cannot start rank %d: open /dev/null: %s", r, e);
        return 1;
    case KOLORUN_STEP_DUP2:
        kolorun_say("cannot start rank %d: dup2: %s", r, e);
        return 1;
    case KOLORUN_STEP_PDEATHSIG:
        kolorun_say("cannot start rank %d: prctl(PR_SET_PDEATHSIG): %s", r, e);
        return 1;
    default:
        if (host)
            kolorun_say("cannot start rank %d: cannot run the launch command "
                        "'%s' for host %s: %s", r, prog, host, e);
        else
            kolorun_say("cannot start rank %d: cannot run '%s': %s", r, prog,
                        e);
        return ce.err == ENOENT || ce.err == ENOTDIR ? 127 : 126;
    }
}

/* Starts rank r. 0, or kolorun's exit status when it cannot (said why). */
static int kolorun_spawn(kolorun_t *k, int r)
{
    kolorun_rank_t *rk = &k->ranks[r];
    char *env[KOLORUN_MAX_ENV] = {0};
    int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
    int rc = 1;

    kolorun_words_t launch = {0};
    const kolorun_host_t *h = kolorun_host_of(k, r);
    int remote = h && !h->local;
    int hold[2] = {-1, -1};
    int nenv = kolorun_rank_env(k, r, env);
    if (nenv < 0 || (remote && kolorun_launch_argv(k, r, env, nenv,
                                                   &launch) != 0)) {
        kolorun_say("out of memory");
        goto free_env;
    }
    /* ssh: the rank's stdin is a pipe that kolorun keeps open; the remote
     * side ends the rank when it closes (see kolorun_launch_argv). */
    if (remote && kolorun_remote_shell(k) && pipe2(hold, O_CLOEXEC) != 0) {
        kolorun_say("cannot start rank %d: pipe: %s", r, strerror(errno));
        goto close_pipes;
    }
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
        pipe2(status, O_CLOEXEC) != 0) {
        kolorun_say("cannot start rank %d: pipe: %s", r, strerror(errno));
        goto close_pipes;
    }

    /* All signals blocked across fork: the child must not run kolorun's
     * handlers (they write to kolorun's self-pipe) before it resets them. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t launcher = getpid();
    char **exec_argv = remote ? launch.w : k->opts.argv;
    pid_t pid = fork();
    if (pid == 0)
        /* A remote rank gets its environment on the launch command's
         * command line, not from kolorun's environment. */
        kolorun_child(k, launcher, status[1], hold[0], out[1], err[1], env,
                      remote ? 0 : nenv, exec_argv);
    int fork_errno = errno;
    if (pid > 0)
        /* Set the group here too: whichever of parent and child runs first
         * wins, and kolorun may signal the group as soon as fork returns.
         * EACCES: the child has exec'd, after setting it itself. */
        setpgid(pid, k->pgid);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kolorun_say("cannot start rank %d: fork: %s", r, strerror(fork_errno));
        goto close_pipes;
    }
    /* Only the child may hold the write end: exec closes it. */
    close(status[1]);
    status[1] = -1;
    rc = kolorun_child_wait(r, pid, status[0], exec_argv[0],
                            remote ? h->name : NULL);
    if (rc != 0)
        goto close_pipes;
    rk->pid = pid;
    k->nstarted++;
    k->nalive++;

    if (k->opts.verbose) {
        char line[4096];
        size_t n = 0;
        line[0] = '\0';
        for (int i = 0; i < nenv && n < sizeof line; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s", env[i]);
        kolorun_say("rank %d: pid %ld, environment:%s", r, (long)pid, line);
        n = 0;
        line[0] = '\0';
        for (int i = 0; i < launch.n && n < sizeof line; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s",
                                  launch.w[i]);
        if (remote)
            kolorun_say("rank %d: on host %s, started by:%s", r, h->name,
                        line);
    }

    /* Keep the read ends, non-blocking so that draining a finished rank
     * never blocks on a pipe that something else still holds open. */
    rk->streams[KOLORUN_OUT].fd = out[0];
    rk->streams[KOLORUN_ERR].fd = err[0];
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    out[0] = err[0] = -1;
    rk->hold_fd = hold[1];
    hold[1] = -1;
    rc = 0;

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (status[i] >= 0)
            close(status[i]);
        if (hold[i] >= 0)
            close(hold[i]);
        if (out[i] >= 0)
            close(out[i]);
        if (err[i] >= 0)
            close(err[i]);
    }
free_env:
    for (int i = 0; i < KOLORUN_MAX_ENV; i++)
        free(env[i]);
    kolorun_words_free(&launch);
    return rc;
}

/* Starts the holder, the leader of the ranks' process group (see the top
 * of this file). It keeps no file open, so it holds no pipe and no
 * terminal, and dies with kolorun. */
static int kolorun_spawn_holder(kolorun_t *k, int wake_rd)
{
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        for (int sig = 1; sig < NSIG; sig++)
            sigaction(sig, &ign, NULL); /* fails for KILL and STOP: fine */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher)
            _exit(0);
        /* In ps and top, a name that says what it is. */
        prctl(PR_SET_NAME, "kolorun-group");
        close(wake_rd);
        close(kolorun_wake_fd);
        for (int fd = 0; fd < 3; fd++)
            close(fd);
        if (chdir("/") != 0) /* pin no mount point */
            _exit(0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (;;)
            pause();
    }
    int fork_errno = errno;
    if (pid > 0) {
        setpgid(pid, pid); /* also here: ranks join right after */
        k->pgid = pid;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kolorun_say("cannot start: fork: %s", strerror(fork_errno));
        return -1;
    }
    if (k->opts.verbose)
        kolorun_say("ranks' process group %ld, held open by the "
                    "kolorun-group process of the same pid",
                    (long)pid);
    return 0;
}

/* Ends the holder once the job is over. */
static void kolorun_end_holder(kolorun_t *k)
{
    if (k->pgid <= 0 || k->holder_reaped)
        return;
    kill(k->pgid, SIGKILL);
    while (waitpid(k->pgid, NULL, 0) < 0 && errno == EINTR)
        ;
    k->holder_reaped = 1;
}

/* ------------------------------------------------------------------------
 * Redis rendezvous
 *
 * With --redis HOST:PORT or --start-redis the ranks meet through a Redis
 * server (Gloo's RedisStore) instead of the private directory. Each job
 * keeps its keys under its own name (KOLO_RENDEZVOUS=redis:HOST:PORT/JOB,
 * JOB = kolo-<this host>-<pid>-<start time>), so jobs sharing a server do
 * not meet each other's keys. --start-redis runs redis-server here, in a
 * process group of its own (a Ctrl-C for the ranks is not for it) that
 * dies with kolorun, on a free port of an address the other hosts reach,
 * and stops it once the ranks are gone.
 */

/* The IPv4 address of interface iface, or (iface NULL) the first up,
 * non-loopback one. 0, or -1 when there is none. */
static int kolorun_ipv4(const char *iface, char *out, size_t n)
{
    struct ifaddrs *all, *ifa;
    int rc = -1;
    if (getifaddrs(&all) != 0)
        return -1;
    for (ifa = all; ifa && rc != 0; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET)
            continue;
        if (iface ? strcmp(ifa->ifa_name, iface) != 0
                  : (ifa->ifa_flags & IFF_LOOPBACK) || !(ifa->ifa_flags & IFF_UP))
            continue;
        const struct sockaddr_in *sin = (const void *)ifa->ifa_addr;
        if (inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)n))
            rc = 0;
    }
    freeifaddrs(all);
    return rc;
}

static void kolorun_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether something accepts TCP connections at addr:port. */
static int kolorun_tcp_open(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0;
    close(fd);
    return ok;
}

static int kolorun_redis_start(kolorun_t *k)
{
    char addr[INET_ADDRSTRLEN] = "";
    const kolorun_opts_t *o = &k->opts;

    if (o->redis_bind)
        snprintf(addr, sizeof addr, "%s", o->redis_bind);
    else if (o->network_interface &&
             kolorun_ipv4(o->network_interface, addr, sizeof addr) == 0)
        ;
    else if (!o->any_remote)
        snprintf(addr, sizeof addr, "127.0.0.1");
    else if (kolorun_ipv4(NULL, addr, sizeof addr) != 0) {
        kolorun_say("--start-redis: this host has no non-loopback IPv4 "
                    "address that the other hosts could reach; give "
                    "--redis-bind ADDR");
        return -1;
    }

    /* A free port: the kernel picks one for a socket bound to port 0. */
    struct sockaddr_in sa;
    socklen_t salen = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
        kolorun_say("--start-redis: cannot bind %s on this host: %s", addr,
                    strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    char port[16];
    snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));

    /* The server's output goes to an unlinked file, shown if it fails. */
    const char *tmp = getenv("TMPDIR");
    char *logpath = kolorun_strdupf("%s/kolorun-redis-XXXXXX",
                                    tmp && *tmp ? tmp : "/tmp");
    int log = logpath ? mkostemp(logpath, O_CLOEXEC) : -1;
    if (log < 0) {
        kolorun_say("--start-redis: cannot create a log file: %s",
                    strerror(errno));
        free(logpath);
        return -1;
    }
    unlink(logpath);
    free(logpath);

    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        kolorun_child_signals(k);
        setpgid(0, 0);
        int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in < 0 || dup2(in, 0) < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0)
            _exit(127);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher)
            _exit(127);
        sigprocmask(SIG_SETMASK, &k->mask_orig, NULL);
        execlp("redis-server", "redis-server", "--bind", addr, "--port", port,
               "--save", "", "--appendonly", "no", "--protected-mode", "no",
               "--daemonize", "no", (char *)NULL);
        dprintf(2, "cannot run redis-server: %s (install it: apt-get install "
                "redis-server)\n", strerror(errno));
        _exit(127);
    }
    int fork_errno = errno;
    if (pid > 0)
        k->redis_pid = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kolorun_say("--start-redis: fork: %s", strerror(fork_errno));
        close(log);
        return -1;
    }

    /* Ready when it accepts a connection; a short sleep between tries
     * (redis-server starts in milliseconds), bounded by the start timeout. */
    long limit_ms = (o->start_timeout ? atol(o->start_timeout) : 60) * 1000L;
    int64_t t0 = kolorun_now_ms();
    int rc = -1;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char buf[2048];
            ssize_t n = pread(log, buf, sizeof buf - 1, 0);
            buf[n > 0 ? n : 0] = '\0';
            for (char *c = buf; *c; c++)
                if (*c == '\n' && c[1])
                    *c = ' ';
            buf[strcspn(buf, "\n")] = '\0';
            kolorun_say("--start-redis: redis-server on %s:%s ended at start: "
                        "%s",
                        addr, port, buf[0] ? buf : "(no output)");
            k->redis_reaped = 1;
            break;
        }
        if (kolorun_tcp_open(&sa)) {
            snprintf(k->redis_addr, sizeof k->redis_addr, "%s:%s", addr, port);
            rc = 0;
            break;
        }
        int stop = 0;
        for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++)
            stop |= kolorun_pending[kolorun_stop_signals[i]];
        if (stop) /* the loop handles the signal; no job to start */
            break;
        if (kolorun_now_ms() - t0 > limit_ms) {
            kolorun_say("--start-redis: redis-server on %s:%s did not accept "
                        "connections within %ld s",
                        addr, port, limit_ms / 1000);
            break;
        }
        kolorun_sleep_ms(20);
    }
    close(log);
    if (rc == 0 && o->verbose)
        kolorun_say("started redis-server (pid %ld) on %s", (long)pid,
                    k->redis_addr);
    return rc;
}

/* Stops the server of --start-redis: SIGTERM, SIGKILL after 3 s. */
static void kolorun_redis_stop(kolorun_t *k)
{
    if (k->redis_pid <= 0 || k->redis_reaped)
        return;
    kill(k->redis_pid, SIGTERM);
    for (int i = 0;; i++) {
        pid_t w = waitpid(k->redis_pid, NULL, WNOHANG);
        if (w == k->redis_pid || (w < 0 && errno != EINTR))
            break;
        if (i == KOLORUN_GRACE_MS / 20) {
            kill(k->redis_pid, SIGKILL);
            while (waitpid(k->redis_pid, NULL, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        kolorun_sleep_ms(20);
    }
    k->redis_reaped = 1;
    if (k->opts.verbose)
        kolorun_say("stopped redis-server (pid %ld)", (long)k->redis_pid);
}

/* Runs a Lua script on the job's Redis server (EVAL script 0 arg1 arg2),
 * in Redis's own protocol (RESP) over a plain socket, each step bounded
 * by 2 s. The reply: an integer (":N") or a bulk string ("$LEN" and the
 * bytes) into out. Returns NULL, or why it failed. */
static const char *kolorun_redis_eval(const kolorun_t *k, const char *script,
                                      const char *arg1, const char *arg2,
                                      char *out, size_t outlen)
{
    char host[256], port[16];
    const char *colon = strrchr(k->redis_addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - k->redis_addr),
             k->redis_addr);
    snprintf(port, sizeof port, "%s", colon + 1);
    if (host[0] == '[') { /* [IPv6] */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int fd = -1, e = getaddrinfo(host, port, &hints, &ai);
    if (e)
        return gai_strerror(e);
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    struct timeval tv = {2, 0};
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    const char *why = NULL;
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        why = strerror(errno);
    freeaddrinfo(ai);
    char *req = why ? NULL
                    : kolorun_strdupf("*5\r\n$4\r\nEVAL\r\n$%zu\r\n%s\r\n"
                                      "$1\r\n0\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
                                      strlen(script), script, strlen(arg1),
                                      arg1, strlen(arg2), arg2);
    if (!why && (!req || kolorun_write_all(fd, req, strlen(req)) != 0))
        why = req ? strerror(errno) : "out of memory";
    free(req);
    size_t got = 0;
    out[0] = '\0';
    /* Until the first line, and for a bulk string its bytes, are in. */
    while (!why) {
        ssize_t n = read(fd, out + got, outlen - 1 - got);
        if (n <= 0) {
            why = n < 0 ? strerror(errno) : "no reply";
            break;
        }
        got += (size_t)n;
        out[got] = '\0';
        char *eol = strstr(out, "\r\n");
        if (!eol && got < outlen - 1)
            continue;
        if (!eol || (out[0] != ':' && out[0] != '$')) {
            out[strcspn(out, "\r\n")] = '\0';
            why = "unexpected reply";
            break;
        }
        if (out[0] == ':') {
            *eol = '\0';
            break;
        }
        long len = atol(out + 1);
        size_t head = (size_t)(eol + 2 - out);
        if (len < 0 || head + (size_t)len + 2 > outlen - 1) {
            why = "reply too long";
            break;
        }
        if (got >= head + (size_t)len) {
            memmove(out, out + head, (size_t)len);
            out[len] = '\0';
            break;
        }
    }
    if (fd >= 0)
        close(fd);
    return why;
}

/* A job that failed with Redis rendezvous: names the ranks, and their
 * hosts, that never reached it (a host that could not start its ranks,
 * or started them late), when others did. Each rank's first rendezvous
 * key is JOB/kolo0/agree/settings/RANK: the runtime's first kolo_init
 * publishes its settings there before anything else (agree.c). */
static void kolorun_redis_missing(const kolorun_t *k)
{
    static const char script[] =
        "local m = {} local seen = 0 "
        "for r = 0, tonumber(ARGV[2]) - 1 do "
        "if redis.call('EXISTS', ARGV[1] .. r) == 1 then seen = seen + 1 "
        "else m[#m + 1] = r end end "
        "return seen .. ':' .. table.concat(m, ',')";
    char prefix[300], np[16], *reply = malloc(65536);
    if (!reply)
        return;
    snprintf(prefix, sizeof prefix, "%s/kolo0/agree/settings/", k->job_id);
    snprintf(np, sizeof np, "%d", k->opts.np);
    const char *why = kolorun_redis_eval(k, script, prefix, np, reply, 65536);
    char *list = reply[0] != ':' ? strchr(reply, ':') : NULL;
    /* Nobody arrived: the program failed before kolo_init, or is not a
     * kolo program; nothing to say then. */
    if (why || !list || atoi(reply) == 0 || list[1] == '\0') {
        free(reply);
        return;
    }
    char line[4096];
    size_t n = 0;
    int prev_host = -2;
    line[0] = '\0';
    for (char *t = strtok(list + 1, ","); t && n < sizeof line - 64;
         t = strtok(NULL, ",")) {
        int r = atoi(t), h = k->rank_host ? k->rank_host[r] : -1;
        if (h != prev_host && prev_host != -2)
            n += (size_t)snprintf(line + n, sizeof line - n, " on host %s;",
                                  prev_host >= 0 ? k->opts.hosts[prev_host].name
                                                 : "here");
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d",
                              h == prev_host ? ", " : " rank ", r);
        prev_host = h;
    }
    if (prev_host != -2 && n < sizeof line - 64)
        snprintf(line + n, sizeof line - n, " on host %s",
                 prev_host >= 0 ? k->opts.hosts[prev_host].name : "here");
    kolorun_say("never reached the rendezvous at Redis %s:%s", k->redis_addr,
                line);
    free(reply);
}

/* --redis: removes the job's keys once its ranks are gone, so that a
 * long-lived server does not collect them: a script that deletes what
 * KEYS JOB/\* finds. A failure only warns. */
static void kolorun_redis_clean(const kolorun_t *k)
{
    static const char script[] =
        "local n = 0 for _, key in ipairs(redis.call('KEYS', ARGV[1] .. '*')) "
        "do redis.call('DEL', key) n = n + 1 end return n";
    char prefix[256], reply[256];
    snprintf(prefix, sizeof prefix, "%s/", k->job_id);
    const char *why = kolorun_redis_eval(k, script, prefix, "", reply,
                                         sizeof reply);
    if (why)
        kolorun_say("warning: cannot remove this job's keys (%s*) from "
                    "Redis at %s: %s",
                    prefix, k->redis_addr, why);
    else if (k->opts.verbose)
        kolorun_say("removed %s keys of this job from Redis at %s", reply + 1,
                    k->redis_addr);
}

/* Sets up the job over several hosts: which host each rank is on, the
 * job's name, the Redis server. */
static int kolorun_hosts_setup(kolorun_t *k)
{
    const kolorun_opts_t *o = &k->opts;
    char me[200] = "";
    gethostname(me, sizeof me - 1);
    me[strcspn(me, ".")] = '\0';
    snprintf(k->job_id, sizeof k->job_id, "kolo-%s-%ld-%lld",
             me[0] ? me : "host", (long)getpid(), (long long)k->job_start_us);
    if (o->nhosts > 0) {
        k->rank_host = calloc((size_t)o->np, sizeof *k->rank_host);
        if (!k->rank_host) {
            kolorun_say("out of memory");
            return -1;
        }
        for (int h = 0; h < o->nhosts; h++)
            for (int i = 0; i < o->hosts[h].nranks; i++)
                k->rank_host[o->hosts[h].first_rank + i] = h;
    }
    if (o->redis)
        snprintf(k->redis_addr, sizeof k->redis_addr, "%s", o->redis);
    if (o->start_redis)
        return kolorun_redis_start(k);
    return 0;
}

/* ------------------------------------------------------------------------
 * The loop
 */

static int kolorun_streams_open(const kolorun_t *k)
{
    int n = 0;
    for (int r = 0; r < k->nstarted; r++)
        for (int s = 0; s < 2; s++)
            n += k->ranks[r].streams[s].fd >= 0;
    return n;
}

static void kolorun_handle_signals(kolorun_t *k)
{
    if (kolorun_pending[SIGCHLD]) {
        kolorun_pending[SIGCHLD] = 0;
        kolorun_reap(k);
    }
    if (kolorun_pending[SIGTSTP]) {
        kolorun_pending[SIGTSTP] = 0;
        kolorun_suspend(k);
    }
    for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++) {
        int sig = kolorun_stop_signals[i];
        if (kolorun_pending[sig]) {
            kolorun_pending[sig] = 0;
            kolorun_on_stop_signal(k, sig);
        }
    }
}

/* Every rank is reaped, yet some of their pipes are open: something they
 * started holds them. How long to keep reading (-1: no limit yet). */
static int64_t kolorun_drain_deadline(const kolorun_t *k)
{
    /* A stopped job: its SIGKILL, due at the end of the grace period,
     * ends what holds them; wait for that, then briefly. */
    if (k->stopping)
        return k->killed ? k->killed_ms + KOLORUN_SETTLE_MS : -1;
    /* A finished job: give the stragglers the grace period to finish their
     * output, but do not wait for a background process forever. */
    return k->all_reaped_ms + KOLORUN_GRACE_MS;
}

static int kolorun_loop(kolorun_t *k, int wake_rd)
{
    int cap = 1 + 2 * k->nstarted;
    struct pollfd *pfd = calloc((size_t)cap, sizeof *pfd);
    int *who = calloc((size_t)cap, sizeof *who); /* r * 2 + stream */
    if (!pfd || !who) {
        kolorun_say("out of memory");
        free(pfd);
        free(who);
        return -1;
    }

    for (;;) {
        /* Reaping here as well as on SIGCHLD costs one system call and
         * makes a lost wake-up harmless. */
        kolorun_handle_signals(k);
        kolorun_reap(k);

        int64_t now = kolorun_now_ms();
        /* A rank failed a moment ago, or every rank has ended: nothing
         * more is coming that could be the cause. */
        if (k->failed_rank < 0 && k->nsuspects > 0 &&
            (k->nalive == 0 || now - k->failed_ms >= KOLORUN_BLAME_MS))
            kolorun_blame(k);
        /* The failure grace is over: stop the others. */
        if (k->failed_rank >= 0 && !k->stopping &&
            now - k->failed_ms >= k->opts.failure_grace_ms)
            kolorun_stop(k, SIGTERM);
        /* Grace is over: kill the rest, ranks or what they left. */
        if (k->stopping && !k->killed && now - k->stop_ms >= KOLORUN_GRACE_MS)
            kolorun_kill_now(k);

        int open = kolorun_streams_open(k);
        int64_t drain_until = -1;
        if (k->nalive == 0) {
            if (open == 0)
                break;
            if (k->all_reaped_ms == 0)
                k->all_reaped_ms = now;
            drain_until = kolorun_drain_deadline(k);
            if (drain_until >= 0 && now >= drain_until) {
                kolorun_say("warning: every rank has exited, but something "
                            "they started keeps %d output pipe%s open; not "
                            "waiting for it",
                            open, open == 1 ? "" : "s");
                break;
            }
        }

        int n = 0;
        pfd[n].fd = wake_rd;
        pfd[n].events = POLLIN;
        who[n++] = -1;
        for (int r = 0; r < k->nstarted; r++) {
            for (int s = 0; s < 2; s++) {
                if (k->ranks[r].streams[s].fd < 0)
                    continue;
                pfd[n].fd = k->ranks[r].streams[s].fd;
                pfd[n].events = POLLIN;
                who[n++] = r * 2 + s;
            }
        }

        /* Sleep until output, a signal, or the next deadline. */
        int64_t deadline = -1;
        if (k->stopping && !k->killed)
            deadline = k->stop_ms + KOLORUN_GRACE_MS;
        else if (k->failed_rank >= 0 && !k->stopping)
            deadline = k->failed_ms + k->opts.failure_grace_ms;
        else if (k->nsuspects > 0 && !k->stopping)
            deadline = k->failed_ms + KOLORUN_BLAME_MS;
        if (drain_until >= 0 && (deadline < 0 || drain_until < deadline))
            deadline = drain_until;
        int timeout = -1;
        if (deadline >= 0)
            timeout = deadline > now ? (int)(deadline - now) : 0;

        int ready = poll(pfd, (nfds_t)n, timeout);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            kolorun_say("poll: %s", strerror(errno));
            free(pfd);
            free(who);
            return -1;
        }
        for (int i = 1; i < n && ready > 0; i++) {
            if (!pfd[i].revents)
                continue;
            kolorun_stream_read(k, who[i] / 2, who[i] % 2, 0);
        }
        if (pfd[0].revents) {
            char junk[256];
            while (read(wake_rd, junk, sizeof junk) > 0)
                ;
        }
    }
    free(pfd);
    free(who);
    return 0;
}

/* Makes sure fds 0, 1 and 2 are open, so that no pipe of kolorun's takes
 * one of their numbers and gets written to by accident. */
static void kolorun_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
            if (nfd >= 0 && nfd != fd) {
                dup2(nfd, fd);
                close(nfd);
            }
        }
    }
}

/* Pipes (and --output-filename's files) per rank: ask for the file
 * descriptors a big job needs. */
static void kolorun_raise_fd_limit(int np, int files)
{
    struct rlimit rl;
    /* + a stdin pipe per ssh rank */
    rlim_t need = (rlim_t)np * (files ? 5 : 3) + 32;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = need < rl.rlim_max ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Makes directory path and its parents (mkdir -p); 0 or -1 (errno). */
static int kolorun_mkdirs(const char *path)
{
    char *p = strdup(path);
    struct stat st;
    if (!p)
        return -1;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *q = '/';
    }
    int rc = mkdir(p, 0777) != 0 && errno != EEXIST ? -1 : 0;
    free(p);
    if (rc == 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) {
        errno = ENOTDIR;
        return -1;
    }
    return rc;
}

/* --output-filename DIR: each rank's stdout and stderr also go to
 * DIR/rank.R/stdout and DIR/rank.R/stderr, R padded with zeros to the
 * width of the last rank (rank.03 of 12), the layout of horovodrun's
 * gloo_run.py; the files are created anew. 0, or -1 said why. */
static int kolorun_outputs_open(kolorun_t *k)
{
    const char *dir = k->opts.output_dir;
    int width = 1;
    for (int v = k->opts.np - 1; v >= 10; v /= 10)
        width++;
    if (kolorun_mkdirs(dir) != 0) {
        kolorun_say("--output-filename: cannot create the directory %s: %s",
                    dir, strerror(errno));
        return -1;
    }
    for (int r = 0; r < k->opts.np; r++) {
        char *sub = kolorun_strdupf("%s/rank.%0*d", dir, width, r);
        if (!sub || (mkdir(sub, 0777) != 0 && errno != EEXIST)) {
            kolorun_say("--output-filename: cannot create %s: %s",
                        sub ? sub : dir, strerror(errno));
            free(sub);
            return -1;
        }
        for (int s = 0; s < 2; s++) {
            char *f = kolorun_strdupf("%s/%s", sub, s == KOLORUN_OUT ? "stdout"
                                                                     : "stderr");
            k->ranks[r].files[s] = f ? open(f, O_WRONLY | O_CREAT | O_TRUNC |
                                                   O_CLOEXEC, 0666)
                                     : -1;
            if (k->ranks[r].files[s] < 0) {
                kolorun_say("--output-filename: cannot create %s: %s",
                            f ? f : sub, strerror(errno));
                free(f);
                free(sub);
                return -1;
            }
            free(f);
        }
        free(sub);
    }
    return 0;
}

/* Allocates the ranks' and sinks' buffers; -1 when memory is short. */
static int kolorun_alloc(kolorun_t *k)
{
    k->ranks = calloc((size_t)k->opts.np, sizeof *k->ranks);
    if (!k->ranks)
        return -1;
    for (int r = 0; r < k->opts.np; r++) {
        k->ranks[r].hold_fd = -1;
        k->ranks[r].files[0] = k->ranks[r].files[1] = -1;
        for (int s = 0; s < 2; s++) {
            k->ranks[r].streams[s].fd = -1;
            k->ranks[r].streams[s].buf = malloc(KOLORUN_LINE_MAX);
            if (!k->ranks[r].streams[s].buf)
                return -1;
        }
    }
    k->sinks[KOLORUN_OUT].fd = STDOUT_FILENO;
    k->sinks[KOLORUN_ERR].fd = STDERR_FILENO;
    for (int s = 0; s < 2; s++) {
        k->sinks[s].buf = malloc(KOLORUN_SINK_CAP);
        if (!k->sinks[s].buf)
            return -1;
    }
    return 0;
}

static void kolorun_free(kolorun_t *k)
{
    for (int r = 0; k->ranks && r < k->opts.np; r++) {
        if (k->ranks[r].hold_fd >= 0)
            close(k->ranks[r].hold_fd);
        for (int s = 0; s < 2; s++) {
            if (k->ranks[r].files[s] >= 0)
                close(k->ranks[r].files[s]);
            kolorun_stream_close(&k->ranks[r].streams[s]);
            free(k->ranks[r].streams[s].buf);
        }
    }
    free(k->ranks);
    for (int s = 0; s < 2; s++)
        free(k->sinks[s].buf);
    free(k->rank_host);
    for (int h = 0; h < k->opts.nhosts; h++)
        free(k->opts.hosts[h].name);
    free(k->opts.hosts);
    free(k->opts.xenv);
    free(k->opts.nics);
    free(k->opts.network_interface);
    for (int i = 0; i < k->opts.nsettings; i++)
        free(k->opts.settings[i].value);
}

/* The exit status, from how the job ended (see the top of this file). */
static int kolorun_exit_status(const kolorun_t *k)
{
    if (k->launch_error)
        return k->launch_error;
    if (k->stop_signal)
        return 128 + k->stop_signal;
    if (k->failed_rank < 0)
        return 0;
    if (WIFEXITED(k->failed_status))
        return WEXITSTATUS(k->failed_status);
    if (WIFSIGNALED(k->failed_status))
        return 128 + WTERMSIG(k->failed_status);
    return 1;
}

/* Ends kolorun by sig with its default action, so that the shell that
 * started it sees "killed by SIGINT" and stops its script too. */
static void kolorun_raise_default(int sig)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    raise(sig);
}

int main(int argc, char **argv)
{
    kolorun_t k;
    memset(&k, 0, sizeof k);
    k.failed_rank = -1;
    {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        k.job_start_us = (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
    }
    kolorun_std_fds();
    kolorun_parse(argc, argv, &k.opts);
    kolorun_settings_apply(&k.opts);
    if (k.opts.mpi) {
        return kolorun_exec_mpirun(&k.opts, k.job_start_us);
    }
    kolorun_raise_fd_limit(k.opts.np, k.opts.output_dir != NULL);

    int rc = 1;
    int wake_rd = -1;
    if (kolorun_alloc(&k) != 0) {
        kolorun_say("out of memory");
        goto free_memory;
    }
    if (k.opts.output_dir && kolorun_outputs_open(&k) != 0)
        goto free_memory;
    wake_rd = kolorun_signals_setup(&k);
    if (wake_rd < 0)
        goto free_memory;
    if (kolorun_hosts_setup(&k) != 0)
        goto stop_redis;
    if (!k.redis_addr[0] && kolorun_rdv_create(&k) != 0)
        goto stop_redis;
    if (k.opts.verbose && k.rdv_dir)
        kolorun_say("rendezvous directory %s", k.rdv_dir);
    else if (k.opts.verbose)
        kolorun_say("rendezvous redis:%s/%s", k.redis_addr, k.job_id);
    if (kolorun_spawn_holder(&k, wake_rd) != 0)
        goto remove_rdv;

    /* A signal that comes while ranks start is handled once all are
     * started (or the start failed), in the loop. */
    for (int r = 0; r < k.opts.np; r++) {
        int failed = kolorun_spawn(&k, r);
        if (failed) {
            k.launch_error = failed;
            kolorun_stop(&k, SIGTERM);
            break;
        }
    }
    if (kolorun_loop(&k, wake_rd) != 0) {
        /* Cannot watch the ranks any more: do not leave them behind. */
        k.launch_error = 1;
        kolorun_signal_ranks(&k, SIGKILL);
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
            ;
        k.holder_reaped = 1;
    }
    /* A stopped job leaves nothing behind: whatever the ranks started and
     * is still in their group (it ignored the signal, or closed its output
     * so kolorun did not wait for it) goes now. */
    if (k.stopping)
        kolorun_kill_now(&k);
    kolorun_end_holder(&k);
    for (int s = 0; s < 2; s++)
        kolorun_sink_flush(&k.sinks[s]);
    rc = kolorun_exit_status(&k);

remove_rdv:
    kolorun_rdv_remove(&k);
    if (k.redis_addr[0] && k.nstarted > 0 && !k.redis_reaped &&
        (k.failed_rank >= 0 || k.launch_error))
        kolorun_redis_missing(&k);
    if (k.opts.redis && k.nstarted > 0)
        kolorun_redis_clean(&k);
stop_redis:
    kolorun_redis_stop(&k);

free_memory:
    kolorun_free(&k);
    if (k.stop_signal)
        kolorun_raise_default(k.stop_signal);
    return rc;
}
