/*
 * kolorun — the launcher: starts N ranks of a command on this machine,
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
 * Ending. (An elastic job ends otherwise: see "Elastic jobs" below.)
 * When a rank exits non-zero or is killed, and kolorun was not
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
 *
 * Elastic jobs. --min-np or --host-discovery-script makes the job elastic
 * (horovodrun's rule; the contract between kolorun, the runtime and Python
 * is ELASTIC-CONTRACT.md of issue 21). A worker is one (host, slot); its id
 * is "host:slot", and "localhost" and "127.0.0.1" are two hosts, so one
 * machine can play two. Hosts come from the discovery script, which
 * kolorun runs with sh -c about once a second, one run at a time, each
 * killed after 10 s, its stdout read by the poll loop ("host:slots" lines,
 * or "host" with --slots-per-host); a run that fails or prints a line
 * kolorun does not understand changes nothing and is said once (a wrong
 * line spoils the whole list: half a list would read as hosts removed).
 * Without a script, -H/--hostfile are fixed hosts: fault tolerance
 * without scaling. Once -np slots are there (within --elastic-timeout),
 * kolorun publishes generation 1 with every slot up to --max-np and starts
 * its workers. A generation is written through the job's rendezvous, as
 * runtime/store.c reads it (a file per key, renamed into place, in the
 * rendezvous directory; SET in Redis): elastic/G/members (one "host:slot"
 * per line, in rank order), elastic/G/update (start, failure, added,
 * removed, mixed), then elastic/generation = G. Rank order: the hosts of
 * the last generation that remain, in their order, then new hosts in the
 * order listed; slots 0, 1, ... of each; the newest cut first at
 * --max-np. Each worker is started with KOLO_ELASTIC=1 (HOROVOD_ELASTIC=1),
 * KOLO_ELASTIC_ID, KOLO_HOSTNAME=host, KOLO_ELASTIC_TIMEOUT and its place
 * in the generation it starts for; the runtime reads the store at every
 * kolo_init and finds its rank there.
 * When a member exits non-zero or is killed, kolorun says so, blacklists
 * its whole host (for the --blacklist-cooldown-range cooldown, else for
 * good) and stops that host's other workers (SIGTERM, SIGKILL 3 s later;
 * their exits do not count). It waits 500 ms for the failures that come
 * with the first, so that one event makes one generation, then publishes
 * the survivors plus any new slots. Hosts that appear (or come back from
 * their cooldown) are added the same way; hosts that disappear are left
 * out of the next generation: their workers learn at kolo_init that they
 * were removed and exit, and kolorun ignores their exits; one still
 * running --elastic-timeout after its removal (or when the job ends) gets
 * SIGTERM. Every generation after the first is a reset; --reset-limit R
 * ends the job rather than publish reset R + 1. With fewer than --min-np
 * slots (or only new hosts, which hold no state) kolorun waits for
 * discovery up to --elastic-timeout. The job ends:
 *   0        once a member of the latest generation has exited 0 and the
 *            others have exited too (no generation is published then; a
 *            member failing at that point ends the job with its status);
 *   S, 128+N every rank failed ("kolorun: every rank failed: rank 0
 *            (localhost:0, pid 42) exited with status 3; ..."): the first
 *            failed member's status;
 *   1        the reset limit, too few ranks for --elastic-timeout, too
 *            few slots at the start: one line saying why.
 * Ending while workers may wait in kolo_init, kolorun first writes that
 * line to elastic/end, and gives them the failure grace to read it before
 * SIGTERM. kolorun stays single-threaded: the driver (elastic.c) runs at
 * every turn of the loop and names the next moment it must run again.
 *
 * FILES
 *
 * This header holds what the files of tools/kolorun/ share: the job
 * (kolorun_t) with its options, ranks and outputs, and the functions one
 * file calls in another. Everything else is static in its file.
 *   main.c         the job from start to end, and the exit status
 *   options.c      the command line (--help, kolorun_parse)
 *   flags.c        horovodrun's flags: the table, and the ranks' settings
 *   config_file.c  --config-file: horovodrun's YAML
 *   hosts.c        -H, --hostfile: hosts, slots, placing the ranks
 *   check_build.c  --check-build
 *   mpi.c          --mpi: the job runs under mpirun
 *   rendezvous.c   the private rendezvous directory
 *   redis.c        Redis rendezvous (--redis, --start-redis)
 *   spawn.c        starting ranks: environment, fork/exec, ssh, the holder
 *   ranks.c        ranks ending: reaping, naming the cause of a failure
 *   signals.c      the signal handler; forwarding, stopping, Ctrl-Z
 *   output.c       the ranks' output: pipes, prefixes, --output-filename
 *   loop.c         the poll() loop
 *   elastic.c      elastic jobs: discovery, generations, blacklisting
 *   util.c         messages, the clock, strings, word lists
 */
#ifndef KOLORUN_H
#define KOLORUN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Line buffer per pipe: longer lines are written in pieces of this size. */
#define KOLORUN_LINE_MAX (64 * 1024)
/* Output batch per destination; holds at least one line plus its prefix. */
#define KOLORUN_SINK_CAP (2 * KOLORUN_LINE_MAX)
/* How long ranks get to exit after a forwarded signal before SIGKILL. */
#define KOLORUN_GRACE_MS 3000
/* The most ranks -np (and the hosts' slots) may ask for. */
#define KOLORUN_MAX_RANKS 4096

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
    /* Elastic jobs (elastic.c): --min-np or --host-discovery-script. */
    int elastic;
    int min_np, max_np;        /* max_np: KOLORUN_MAX_RANKS when not given */
    const char *discovery;     /* --host-discovery-script, run by sh -c */
    int slots_per_host;        /* for its lines without :slots (default 1) */
    int elastic_timeout_s;     /* --elastic-timeout (default 600) */
    int reset_limit;           /* --reset-limit; -1: none */
    int cooldown_lo, cooldown_hi; /* --blacklist-cooldown-range; 0: none */
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

/* The job, main's one: its options, ranks and outputs, the signals kolorun
 * handles, and how the job ends. */
typedef struct kolorun_elastic kolorun_elastic_t; /* elastic.c's */

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

    /* An elastic job's driver; NULL otherwise. Its workers are ranks[]
     * (index: the order they started in), their hosts rank_host[]. */
    kolorun_elastic_t *elastic;
} kolorun_t;

/* A string list that grows; NULL-terminated; strings owned. */
typedef struct kolorun_words {
    char **w;
    int n, cap;
    int oom;
} kolorun_words_t;

/* What a flag of horovodrun's (flags.c) takes, and what kolorun does with
 * it. */
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

/* horovodrun's flags, KOLORUN_NKNOBS of them (flags.c checks the count). */
#define KOLORUN_NKNOBS 25
extern const kolorun_knob_t kolorun_knobs[];

/* The placeholders of a --launch-command template, four of them (hosts.c
 * checks them, spawn.c replaces them). */
extern const char *const kolorun_placeholders[];

/* ---- util.c */
int64_t kolorun_now_ms(void);
int kolorun_write_all(int fd, const char *p, size_t n);
/* kolorun's own messages: "kolorun: ..." and a newline, one write. */
void kolorun_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *kolorun_strdupf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* Adds an owned word (NULL: out of memory); on failure the word is freed
 * and ws->oom set, for the caller to check once at the end. */
void kolorun_words_add(kolorun_words_t *ws, char *owned);
void kolorun_words_free(kolorun_words_t *ws);

/* ---- main.c */
int kolorun_ranks_grow(kolorun_t *k, int n);

/* ---- options.c */
const char *kolorun_opt_value(int argc, char **argv, int *i,
                              const char *arg, const char *name);
long kolorun_parse_long(const char *s, long lo, long hi);
void kolorun_parse(int argc, char **argv, kolorun_opts_t *o);

/* ---- hosts.c */
void kolorun_parse_hosts(kolorun_opts_t *o, const char *list);
void kolorun_parse_hostfile(kolorun_opts_t *o, const char *path);
void kolorun_place(kolorun_opts_t *o);
void kolorun_check_template(const char *t);
int kolorun_host_is_local(const char *name);
int kolorun_host_name_ok(const char *name);

/* ---- flags.c */
__attribute__((noreturn)) void kolorun_refuse(const char *what,
                                              const char *why);
void kolorun_setting_put(kolorun_opts_t *o, const char *var,
                         const char *twin, char *value);
void kolorun_knob_apply(kolorun_opts_t *o, const kolorun_knob_t *k,
                        const char *v, const char *what);
int kolorun_knob_match(int argc, char **argv, int *i, const char *arg,
                       const kolorun_knob_t *k, const char **value);
void kolorun_settings_apply(const kolorun_opts_t *o);
int kolorun_passed_on(const kolorun_opts_t *o, const char *entry);

/* ---- config_file.c */
void kolorun_config_file(kolorun_opts_t *o, const char *path,
                         const int *given, int controller_given);

/* ---- check_build.c */
__attribute__((noreturn)) void kolorun_check_build(void);

/* ---- mpi.c */
int kolorun_exec_mpirun(const kolorun_opts_t *o, int64_t job_start_us);

/* ---- rendezvous.c */
int kolorun_rdv_create(kolorun_t *k);
char *kolorun_rendezvous(const kolorun_t *k);
void kolorun_rdv_remove(kolorun_t *k);

/* ---- redis.c */
int kolorun_hosts_setup(kolorun_t *k);
void kolorun_redis_stop(kolorun_t *k);
void kolorun_redis_missing(const kolorun_t *k);
void kolorun_redis_clean(const kolorun_t *k);
const char *kolorun_redis_set(const kolorun_t *k, const char *key,
                              const char *value);

/* ---- spawn.c */
const struct kolorun_host *kolorun_host_of(const kolorun_t *k, int r);
void kolorun_child_signals(const kolorun_t *k);
int kolorun_spawn(kolorun_t *k, int r);
int kolorun_spawn_holder(kolorun_t *k, int wake_rd);
void kolorun_end_holder(kolorun_t *k);

/* ---- ranks.c */
void kolorun_blame(kolorun_t *k);
void kolorun_reap(kolorun_t *k);

/* ---- signals.c */
int kolorun_signals_setup(kolorun_t *k);
void kolorun_signal_ranks(kolorun_t *k, int sig);
void kolorun_release_remote(kolorun_t *k, int r);
void kolorun_stop(kolorun_t *k, int sig);
void kolorun_kill_now(kolorun_t *k);
void kolorun_suspend(kolorun_t *k);
void kolorun_on_stop_signal(kolorun_t *k, int sig);

/* ---- output.c */
void kolorun_sink_flush(kolorun_sink_t *s);
void kolorun_stream_close(kolorun_stream_t *st);
void kolorun_stream_read(kolorun_t *k, int r, int which, int until_empty);
int kolorun_outputs_open(kolorun_t *k);

/* ---- loop.c */
int kolorun_loop(kolorun_t *k, int wake_rd);

/* ---- elastic.c */
int kolorun_elastic_start(kolorun_t *k);
int64_t kolorun_elastic_tick(kolorun_t *k);
int kolorun_elastic_fd(const kolorun_t *k);
void kolorun_elastic_read(kolorun_t *k);
int kolorun_elastic_reaped(kolorun_t *k, pid_t pid, int status);
void kolorun_elastic_ended(kolorun_t *k, int w, int status);
int kolorun_elastic_done(const kolorun_t *k);
int kolorun_elastic_status(const kolorun_t *k);
int kolorun_elastic_env(const kolorun_t *k, int w, char **env);
void kolorun_elastic_place(const kolorun_t *k, int w, int *rank, int *local);
void kolorun_elastic_free(kolorun_t *k);

#endif /* KOLORUN_H */
