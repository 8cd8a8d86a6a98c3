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
 * that kolorun reads, and execs the command. All ranks join ONE new process
 * group, separate from kolorun's own group:
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
 * and the tools that read them look the same. A rank's stdout and stderr are
 * two pipes, so their relative order is not kept, as under any launcher.
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
 * already stopping the job, that rank is the cause: kolorun prints its
 * remaining output, then one line naming it ("kolorun: rank 1 (pid 42)
 * exited with status 3"), sends SIGTERM (SIGKILL after the grace period) to
 * the others, and drains their output. Ranks that die because kolorun
 * stopped them are not causes; --verbose reports them. When every rank is
 * gone and their pipes are at end of file (or, if something the ranks left
 * behind keeps a pipe open, after the grace period), kolorun removes the
 * rendezvous directory and exits:
 *   0        every rank exited with status 0;
 *   S        the first failing rank exited with status S (127: the command
 *            was not found, 126: it could not be executed) — what mpirun
 *            does, so a script sees the rank's own status;
 *   128+N    the first failing rank was killed by signal N, the shell's way
 *            of writing "killed by N";
 *   1        kolorun itself failed (rendezvous directory, fork, pipes);
 *   2        the command line was wrong.
 * When a signal stopped the job, kolorun ends by that same signal (default
 * action, raised on itself), so that a shell script running kolorun stops on
 * Ctrl-C as it would for any other command.
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
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
#define KOLORUN_MAX_RANKS 4096
#define KOLORUN_MAX_ENV 16
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

typedef struct kolorun_opts {
    int np;
    int tag_output;
    int verbose;
    const char *timeline;      /* NULL: not given */
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
    kolorun_stream_t streams[2]; /* KOLORUN_OUT, KOLORUN_ERR */
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
    int failed_rank;   /* the first failing rank, -1 if none */
    int64_t failed_ms; /* when it failed: the others get --failure-grace */
    int failed_status; /* its wait status */
    int launch_error;  /* kolorun itself could not start the job */
    int64_t killed_ms;     /* when SIGKILL went out */
    int64_t all_reaped_ms; /* when the last rank was reaped, 0 before */
    int64_t job_start_us;  /* wall-clock start, for the ranks' timelines */
} kolorun_t;

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
        "\n"
        "Starts N ranks of command on this machine, carries their output and\n"
        "waits for them. If one rank fails, the others are stopped.\n"
        "\n"
        "  -np N, -n N, --np N      number of ranks (required)\n"
        "  --tag-output             prefix every output line with its rank\n"
        "                           and stream, like horovodrun and mpirun:\n"
        "                             [1]<stdout>:text\n"
        "                             [1]<stderr>:text\n"
        "  --timeline-filename F    give every rank KOLO_TIMELINE=F\n"
        "  --start-timeout SECONDS  give every rank KOLO_START_TIMEOUT=SECONDS:\n"
        "                           how long ranks wait for each other at start\n"
        "  --failure-grace SECONDS  after a rank fails, let the others report it\n"
        "                           and exit by themselves for this long before\n"
        "                           stopping them (default 5; 0: stop at once)\n"
        "  --gloo                   use the Gloo controller (the default)\n"
        "  --mpi                    run the job through mpirun (Open MPI): the\n"
        "                           ranks take their places from MPI and use the\n"
        "                           mpi backend (KOLO_CONTROLLER and\n"
        "                           KOLO_CPU_OPERATIONS still choose); every\n"
        "                           KOLO_* variable is passed on with -x;\n"
        "                           KOLO_MPIRUN names another mpirun\n"
        "  --verbose                say what kolorun does: rendezvous directory,\n"
        "                           each rank's pid and environment and end\n"
        "  -h, --help               show this help\n"
        "  -H, --hostfile           several machines: not supported yet\n"
        "\n"
        "Each rank gets KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
        "KOLO_CROSS_RANK=0, KOLO_CROSS_SIZE=1, KOLO_RENDEZVOUS=file:DIR (a\n"
        "private directory, removed at the end) and KOLO_HOSTNAME=127.0.0.1\n"
        "(unless already set). Its standard input is /dev/null. Its output goes\n"
        "to kolorun's stdout and stderr in whole lines (lines over 64 KiB in\n"
        "pieces); without --tag-output the bytes are unchanged.\n"
        "\n"
        "SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the ranks; ranks\n"
        "still alive 3 s later are killed (a second Ctrl-C kills them at once),\n"
        "and kolorun then ends by the same signal.\n"
        "\n"
        "Exit status:\n"
        "  0       every rank exited with status 0\n"
        "  S       the first rank to fail exited with status S\n"
        "          (127: command not found, 126: command not executable)\n"
        "  128+N   the first rank to fail was killed by signal N\n"
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

static int kolorun_is(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* Parses the options; exits 0 after --help, 2 on a wrong command line. */
static void kolorun_parse(int argc, char **argv, kolorun_opts_t *o)
{
    static const char *const later[] = {"-H", "--host", "--hosts",
                                        "--hostfile", "-hostfile"};
    memset(o, 0, sizeof *o);
    o->failure_grace_ms = 5000;
    int i;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
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
        if (strcmp(a, "--tag-output") == 0) {
            o->tag_output = 1;
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
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--timeline-filename"))) {
            if (*v == '\0') {
                kolorun_say("--timeline-filename wants a file name");
                exit(2);
            }
            o->timeline = v;
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
        for (size_t j = 0; j < sizeof later / sizeof later[0]; j++) {
            if (kolorun_is(a, later[j])) {
                kolorun_say("%s is not supported yet: this kolorun starts "
                            "every rank on this machine (use -np N alone)",
                            later[j]);
                exit(2);
            }
        }
        kolorun_say("unknown option '%s' (see kolorun --help)", a);
        exit(2);
    }
    if (o->np == 0) {
        kolorun_say("say how many ranks to start with -np N "
                    "(see kolorun --help)");
        exit(2);
    }
    if (i >= argc) {
        kolorun_say("no command to run (see kolorun --help)");
        exit(2);
    }
    o->argv = argv + i;
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
}

/* ------------------------------------------------------------------------
 * --mpi: the job runs under mpirun
 */

/* Replaces kolorun with `mpirun [--allow-run-as-root] [--oversubscribe]
 * --bind-to none -np N [--tag-output] -x KOLO_... command args`. The ranks
 * learn their places from MPI, so kolorun's own KOLO_RANK/SIZE/LOCAL/CROSS
 * variables must not reach them. --bind-to none: mpirun binds each rank to
 * one core by default, where its background thread would compete with its
 * training thread (shared/MEASUREMENTS.md). Returns only on failure: kolorun's exit status. */
static int kolorun_exec_mpirun(const kolorun_opts_t *o, int64_t job_start_us)
{
    static const char *const placement[] = {
        "KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
        "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"};
    extern char **environ;
    const char *mpirun = getenv("KOLO_MPIRUN");
    char np[16], start_us[32], **av;
    size_t nenv = 0, nargs = 0, n = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (mpirun == NULL || *mpirun == '\0')
        mpirun = "mpirun";
    for (size_t j = 0; j < sizeof placement / sizeof placement[0]; j++)
        unsetenv(placement[j]);
    snprintf(start_us, sizeof start_us, "%lld", (long long)job_start_us);
    if ((o->timeline && setenv("KOLO_TIMELINE", o->timeline, 1) != 0) ||
        (o->start_timeout &&
         setenv("KOLO_START_TIMEOUT", o->start_timeout, 1) != 0) ||
        setenv("KOLO_JOB_START_US", start_us, 1) != 0) {
        kolorun_say("out of memory");
        return 1;
    }
    for (char **e = environ; *e; e++)
        nenv += strncmp(*e, "KOLO_", 5) == 0;
    while (o->argv[nargs])
        nargs++;
    av = calloc(12 + 2 * nenv + nargs + 1, sizeof *av);
    if (!av) {
        kolorun_say("out of memory");
        return 1;
    }
    snprintf(np, sizeof np, "%d", o->np);
    av[n++] = (char *)mpirun;
    if (geteuid() == 0)
        av[n++] = "--allow-run-as-root";
    if (cpus > 0 && o->np > cpus)
        av[n++] = "--oversubscribe";
    av[n++] = "--bind-to";
    av[n++] = "none";
    av[n++] = "-np";
    av[n++] = np;
    if (o->tag_output)
        av[n++] = "--tag-output";
    for (char **e = environ; *e; e++) {
        char *eq = strchr(*e, '=');
        if (strncmp(*e, "KOLO_", 5) != 0 || !eq)
            continue;
        av[n++] = "-x";
        av[n] = kolorun_strdupf("%.*s", (int)(eq - *e), *e);
        if (!av[n]) {
            kolorun_say("out of memory");
            return 1;
        }
        n++;
    }
    for (size_t j = 0; j < nargs; j++)
        av[n++] = o->argv[j];
    av[n] = NULL;
    if (o->verbose) {
        fprintf(stderr, "kolorun: running");
        for (size_t j = 0; j < n; j++)
            fprintf(stderr, " %s", av[j]);
        fputc('\n', stderr);
    }
    fflush(NULL);
    execvp(mpirun, av);
    int why = errno;
    kolorun_say("--mpi: cannot run %s: %s (install Open MPI's mpirun, e.g. "
                "the openmpi-bin package, or name one with KOLO_MPIRUN)",
                mpirun, strerror(why));
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
    const char *base = getenv("TMPDIR");
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

static void kolorun_rdv_remove(kolorun_t *k)
{
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
static void kolorun_stop(kolorun_t *k, int sig)
{
    if (k->stopping)
        return;
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

/* Moves the whole lines of one stream to its sink; at end of file, also the
 * last unterminated line; when the buffer is full of one line, a piece. */
static void kolorun_stream_emit(kolorun_t *k, int r, int which, int at_eof)
{
    kolorun_stream_t *st = &k->ranks[r].streams[which];
    kolorun_sink_t *sink = &k->sinks[which];
    size_t done = 0;

    if (!k->opts.tag_output) {
        /* Unchanged bytes: everything up to the last newline, in one go. */
        size_t end = st->len;
        while (end > 0 && st->buf[end - 1] != '\n')
            end--;
        if (at_eof || (end == 0 && st->len == KOLORUN_LINE_MAX))
            end = st->len;
        if (end > 0)
            kolorun_sink_put(sink, "", 0, st->buf, end, 0);
        done = end;
    } else {
        char prefix[48];
        int plen = snprintf(prefix, sizeof prefix, "[%d]<%s>:", r,
                            which == KOLORUN_OUT ? "stdout" : "stderr");
        for (;;) {
            char *nl = memchr(st->buf + done, '\n', st->len - done);
            if (!nl)
                break;
            size_t n = (size_t)(nl - (st->buf + done)) + 1;
            kolorun_sink_put(sink, prefix, (size_t)plen, st->buf + done, n, 0);
            done += n;
        }
        /* Tagged output is made of lines: a piece or a last line without a
         * newline gets one, so that the next prefix starts a line. */
        size_t rest = st->len - done;
        if (rest > 0 && (at_eof || rest == KOLORUN_LINE_MAX)) {
            kolorun_sink_put(sink, prefix, (size_t)plen, st->buf + done, rest,
                             1);
            done = st->len;
        }
    }
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

static void kolorun_rank_ended(kolorun_t *k, int r, int status)
{
    kolorun_rank_t *rk = &k->ranks[r];
    char how[128];
    kolorun_describe(status, how, sizeof how);
    rk->reaped = 1;
    k->nalive--;

    kolorun_stream_read(k, r, KOLORUN_OUT, 1);
    kolorun_stream_read(k, r, KOLORUN_ERR, 1);

    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !k->stopping && k->failed_rank < 0) {
        /* The first failure is the cause, the one line everyone reads. The
         * other ranks are stopped after the failure grace: the runtime
         * tells each of them which rank it lost, and a program that reports
         * that and exits should be heard, not killed mid-sentence. */
        kolorun_say("rank %d (pid %ld) %s", r, (long)rk->pid, how);
        k->failed_rank = r;
        k->failed_status = status;
        k->failed_ms = kolorun_now_ms();
        if (k->opts.failure_grace_ms == 0)
            kolorun_stop(k, SIGTERM);
    } else if (k->opts.verbose) {
        kolorun_say("rank %d (pid %ld) %s%s", r, (long)rk->pid, how,
                    k->stopping && !ok ? " (stopped by kolorun)" : "");
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
        for (int r = 0; r < k->nstarted; r++) {
            if (k->ranks[r].pid == pid && !k->ranks[r].reaped) {
                kolorun_rank_ended(k, r, status);
                break;
            }
        }
    }
}

/* The environment of rank r, as "NAME=value" strings. */
static int kolorun_rank_env(const kolorun_t *k, int r,
                            char *env[KOLORUN_MAX_ENV])
{
    int n = 0;
    int np = k->opts.np;
    env[n++] = kolorun_strdupf("KOLO_RANK=%d", r);
    env[n++] = kolorun_strdupf("KOLO_SIZE=%d", np);
    /* One machine: local and global numbering are the same. */
    env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", r);
    env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", np);
    env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=0");
    env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=1");
    env[n++] = kolorun_strdupf("KOLO_RENDEZVOUS=file:%s", k->rdv_dir);
    if (!getenv("KOLO_HOSTNAME"))
        env[n++] = kolorun_strdupf("KOLO_HOSTNAME=127.0.0.1");
    /* Every rank's timeline counts time from the same moment. */
    env[n++] = kolorun_strdupf("KOLO_JOB_START_US=%lld",
                               (long long)k->job_start_us);
    if (k->opts.timeline)
        env[n++] = kolorun_strdupf("KOLO_TIMELINE=%s", k->opts.timeline);
    if (k->opts.start_timeout)
        env[n++] = kolorun_strdupf("KOLO_START_TIMEOUT=%s",
                                   k->opts.start_timeout);
    for (int i = 0; i < n; i++)
        if (!env[i])
            return -1;
    return n;
}

/* In the child, between fork and exec. kolorun is single-threaded, so the
 * child may call what it likes; it must not return. */
__attribute__((noreturn)) static void
kolorun_child(const kolorun_t *k, pid_t launcher, int out_w, int err_w,
              char **env, int nenv)
{
    /* Handlers of kolorun make no sense here; exec would reset them anyway,
     * but a signal may come before it. SIGPIPE goes back to what kolorun
     * inherited. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++)
        if (k->handled[sig])
            sigaction(sig, &dfl, NULL);
    sigaction(SIGPIPE, &k->sigpipe_orig, NULL);

    /* Join the ranks' group. The parent does the same, whichever of the
     * two runs first. */
    setpgid(0, k->pgid);

    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || dup2(in, STDIN_FILENO) < 0 ||
        dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0) {
        dprintf(err_w, "kolorun: cannot set up the rank's stdio: %s\n",
                strerror(errno));
        _exit(127);
    }

    /* Die with the launcher. If it died already, before the request took
     * effect, our parent is someone else now: stop here. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        dprintf(STDERR_FILENO, "kolorun: prctl(PR_SET_PDEATHSIG): %s\n",
                strerror(errno));
        _exit(127);
    }
    if (getppid() != launcher)
        _exit(127);

    for (int i = 0; i < nenv; i++)
        putenv(env[i]);

    sigprocmask(SIG_SETMASK, &k->mask_orig, NULL);
    execvp(k->opts.argv[0], k->opts.argv);

    int e = errno;
    dprintf(STDERR_FILENO, "kolorun: cannot run '%s': %s\n", k->opts.argv[0],
            strerror(e));
    /* The shell's convention: 127 not found, 126 found but not runnable. */
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

static int kolorun_spawn(kolorun_t *k, int r)
{
    kolorun_rank_t *rk = &k->ranks[r];
    char *env[KOLORUN_MAX_ENV] = {0};
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    int rc = -1;

    int nenv = kolorun_rank_env(k, r, env);
    if (nenv < 0) {
        kolorun_say("out of memory");
        goto free_env;
    }
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        kolorun_say("cannot start rank %d: pipe: %s", r, strerror(errno));
        goto close_pipes;
    }

    /* All signals blocked across fork: the child must not run kolorun's
     * handlers (they write to kolorun's self-pipe) before it resets them. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0)
        kolorun_child(k, launcher, out[1], err[1], env, nenv);
    int fork_errno = errno;
    if (pid > 0) {
        /* Set the group here too: whichever of parent and child runs first
         * wins, and kolorun may signal the group as soon as fork returns.
         * EACCES: the child has exec'd, after setting it itself. */
        setpgid(pid, k->pgid);
        rk->pid = pid;
        k->nstarted++;
        k->nalive++;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kolorun_say("cannot start rank %d: fork: %s", r, strerror(fork_errno));
        goto close_pipes;
    }

    if (k->opts.verbose) {
        char line[4096];
        size_t n = 0;
        line[0] = '\0';
        for (int i = 0; i < nenv && n < sizeof line; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, " %s", env[i]);
        kolorun_say("rank %d: pid %ld, environment:%s", r, (long)pid, line);
    }

    /* Keep the read ends, non-blocking so that draining a finished rank
     * never blocks on a pipe that something else still holds open. */
    rk->streams[KOLORUN_OUT].fd = out[0];
    rk->streams[KOLORUN_ERR].fd = err[0];
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    out[0] = err[0] = -1;
    rc = 0;

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (err[i] >= 0)
            close(err[i]);
    }
free_env:
    for (int i = 0; i < KOLORUN_MAX_ENV; i++)
        free(env[i]);
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

/* Two pipes per rank: ask for the file descriptors a big job needs. */
static void kolorun_raise_fd_limit(int np)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)np * 2 + 32;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = need < rl.rlim_max ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Allocates the ranks' and sinks' buffers; -1 when memory is short. */
static int kolorun_alloc(kolorun_t *k)
{
    k->ranks = calloc((size_t)k->opts.np, sizeof *k->ranks);
    if (!k->ranks)
        return -1;
    for (int r = 0; r < k->opts.np; r++) {
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
        for (int s = 0; s < 2; s++) {
            kolorun_stream_close(&k->ranks[r].streams[s]);
            free(k->ranks[r].streams[s].buf);
        }
    }
    free(k->ranks);
    for (int s = 0; s < 2; s++)
        free(k->sinks[s].buf);
}

/* The exit status, from how the job ended (see the top of this file). */
static int kolorun_exit_status(const kolorun_t *k)
{
    if (k->launch_error)
        return 1;
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
    if (k.opts.mpi) {
        return kolorun_exec_mpirun(&k.opts, k.job_start_us);
    }
    kolorun_raise_fd_limit(k.opts.np);

    int rc = 1;
    int wake_rd = -1;
    if (kolorun_alloc(&k) != 0) {
        kolorun_say("out of memory");
        goto free_memory;
    }
    wake_rd = kolorun_signals_setup(&k);
    if (wake_rd < 0)
        goto free_memory;
    if (kolorun_rdv_create(&k) != 0)
        goto free_memory;
    if (k.opts.verbose)
        kolorun_say("rendezvous directory %s", k.rdv_dir);
    if (kolorun_spawn_holder(&k, wake_rd) != 0)
        goto remove_rdv;

    /* A signal that comes while ranks start is handled once all are
     * started (or the start failed), in the loop. */
    for (int r = 0; r < k.opts.np; r++) {
        if (kolorun_spawn(&k, r) != 0) {
            k.launch_error = 1;
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

free_memory:
    kolorun_free(&k);
    if (k.stop_signal)
        kolorun_raise_default(k.stop_signal);
    return rc;
}
