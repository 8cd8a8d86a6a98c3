/*
 * options.c — kolorun's command line: the --help text, and kolorun_parse,
 * which fills the job's options (kolorun_opts_t) from argv, checks that they
 * go together, and exits 0 after --help or --version, 2 on a wrong command
 * line. horovodrun's tuning flags are matched through the table in flags.c,
 * -H and --hostfile are read by hosts.c, --config-file by config_file.c.
 */
#define _GNU_SOURCE

#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmdline.h"
#include "edit.h"

static const char kolorun_help[] =
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
        "  (what negotiates and moves the tensors; without either, kolo's\n"
        "  choice: shared memory on one host, Gloo across hosts)\n"
        "  --gloo                   Gloo, as horovodrun --gloo: sets\n"
        "                           KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo\n"
        "                           (unless set); kolorun starts the ranks\n"
        "  --mpi                    MPI, as horovodrun --mpi: the job runs\n"
        "                           through mpirun (Open MPI), the ranks take\n"
        "                           their places from MPI and use the mpi\n"
        "                           backend (as under plain mpirun;\n"
        "                           KOLO_CONTROLLER and KOLO_CPU_OPERATIONS\n"
        "                           still choose); every KOLO_* and HOROVOD_*\n"
        "                           variable is passed on with -x; KOLO_MPIRUN\n"
        "                           names another mpirun\n"
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
        "streams other than 1, --thread-affinity, --log-with-timestamp, --jsrun.\n"
        "\n"
        "Elastic arguments (an elastic job: --min-np or --host-discovery-script;\n"
        "the script wraps its loop in hvd.elastic.run; see \"Elastic jobs\" in\n"
        "kolo's README.md, and docs/launching.md):\n"
        "  --min-np N, --min-num-proc N\n"
        "                           the job goes on while at least N ranks are\n"
        "                           available (default -np); -np N ranks start it\n"
        "  --max-np N, --max-num-proc N\n"
        "                           at most N ranks (default: every slot)\n"
        "  --host-discovery-script S\n"
        "                           run S (sh -c) about once a second; its lines\n"
        "                           'host:slots' or 'host' are the hosts now; a\n"
        "                           failing run or a wrong line keeps the last\n"
        "                           list (one warning). Without it, -H/--hostfile\n"
        "                           are fixed hosts: fault tolerance, no scaling\n"
        "  --slots-per-host N       slots of a script line without :slots (1)\n"
        "  --elastic-timeout S      how long to wait for enough slots, at the start\n"
        "                           and after a loss, before ending the job (default\n"
        "                           HOROVOD_ELASTIC_TIMEOUT, else 600)\n"
        "  --reset-limit N          end the job rather than publish more than N new\n"
        "                           generations (default: no limit)\n"
        "  --blacklist-cooldown-range A B\n"
        "                           a failed host comes back after A*2^n + U(0,A)\n"
        "                           seconds, within [A, B] (default: never)\n"
        "A worker runs per (host, slot); when one fails, its host is blacklisted\n"
        "and its other workers stopped, and the survivors (with any new slots)\n"
        "form the next generation; kolorun ends non-zero, with one line saying\n"
        "why, when every rank failed, the reset limit is reached, or too few\n"
        "ranks remain for --elastic-timeout; 0 when the latest generation's\n"
        "ranks all exit 0. --tag-output numbers workers in the order they\n"
        "started. Each worker also gets KOLO_ELASTIC=1, HOROVOD_ELASTIC=1,\n"
        "KOLO_ELASTIC_ID=host:slot, KOLO_HOSTNAME=host, KOLO_ELASTIC_TIMEOUT.\n"
        "\n"
        "Host arguments (see \"Running on several hosts\" in kolo's README.md):\n"
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
        "                           under a name of this job, deleted at the end);\n"
        "                           or redis://[[USER]:PASSWORD@]HOST[:PORT]\n"
        "  --start-redis            start redis-server here for the job, on a free\n"
        "                           port, and stop it at the end\n"
        "  --redis-bind ADDR        the address --start-redis listens on (default:\n"
        "                           this host's address on --network-interface, or\n"
        "                           its first non-loopback IPv4 address)\n"
        "  --redis-password PW      the password of --redis's server (better: export\n"
        "                           KOLO_REDIS_PASSWORD, which ps does not show);\n"
        "                           --start-redis's has one derived from the job's\n"
        "                           secret\n"
        "  --redis-user USER        with --redis-password: a Redis ACL user\n"
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
        "  2       wrong command line\n";

static void kolorun_usage(FILE *f)
{
    fputs(kolorun_help, f);
}

/* The option of --help nearest a mistyped one ("--verbos": "--verbose"),
 * or NULL when none is within a third of its length. */
static const char *kolorun_closest_option(const char *typed)
{
    static char best[64];
    char want[64], word[64];
    size_t best_d = 99;
    snprintf(want, sizeof want, "%.*s", (int)strcspn(typed, "="), typed);
    for (const char *p = kolorun_help; (p = strchr(p, '-')) != NULL;) {
        /* An option starts a word: after a blank, a comma or a '('. */
        int starts = p > kolorun_help && strchr(" ,(", p[-1]) != NULL;
        size_t n = strspn(p, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (starts && n > 2 && n < sizeof word) {
            memcpy(word, p, n);
            word[n] = '\0';
            size_t d = kolo__edit_distance(want, word);
            if (d < best_d) {
                best_d = d;
                memcpy(best, word, n + 1);
            }
        }
        p += n > 0 ? n : 1;
    }
    return best_d > 0 && best_d * 3 <= strlen(want) ? best : NULL;
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

/* A whole number in [lo, hi] for an elastic flag; exits 2 otherwise. */
static int kolorun_elastic_number(const char *v, const char *flag, long lo,
                                  long hi)
{
    long n = kolorun_parse_long(v, lo, hi);
    if (n < 0) {
        kolorun_say("%s wants a whole number from %ld to %ld, not '%s'", flag,
                    lo, hi, v);
        exit(2);
    }
    return (int)n;
}

/* The numbers of an elastic job: each flag (and horovodrun's other
 * spelling), where it goes, its range; --min-np alone makes a job elastic
 * by itself (the others only go with it, kolorun_elastic_options). */
static const struct {
    const char *flag, *alias;
    size_t field; /* offsetof kolorun_opts_t, an int */
    long lo, hi;
    int makes_elastic;
} kolorun_elastic_flags[] = {
    {"--min-np", "--min-num-proc", offsetof(kolorun_opts_t, min_np), 1,
     KOLORUN_MAX_RANKS, 1},
    {"--max-np", "--max-num-proc", offsetof(kolorun_opts_t, max_np), 1,
     KOLORUN_MAX_RANKS, 0},
    {"--slots-per-host", NULL, offsetof(kolorun_opts_t, slots_per_host), 1,
     KOLORUN_MAX_RANKS, 0},
    {"--elastic-timeout", NULL, offsetof(kolorun_opts_t, elastic_timeout_s),
     1, 1000000, 0},
    {"--reset-limit", NULL, offsetof(kolorun_opts_t, reset_limit), 0, 1000000,
     0},
};

/* Takes argv[*i] when it is one of kolorun_elastic_flags; 1 then. */
static int kolorun_elastic_numbers(kolorun_opts_t *o, int argc, char **argv,
                                   int *i, const char *a,
                                   const char **elastic_flag)
{
    size_t n = sizeof kolorun_elastic_flags / sizeof kolorun_elastic_flags[0];
    for (size_t f = 0; f < n; f++) {
        const char *v = kolorun_opt_value(argc, argv, i, a,
                                          kolorun_elastic_flags[f].flag);
        if (!v && kolorun_elastic_flags[f].alias)
            v = kolorun_opt_value(argc, argv, i, a,
                                  kolorun_elastic_flags[f].alias);
        if (!v)
            continue;
        *(int *)((char *)o + kolorun_elastic_flags[f].field) =
            kolorun_elastic_number(v, kolorun_elastic_flags[f].flag,
                                   kolorun_elastic_flags[f].lo,
                                   kolorun_elastic_flags[f].hi);
        if (kolorun_elastic_flags[f].makes_elastic)
            o->elastic = 1;
        else
            *elastic_flag = kolorun_elastic_flags[f].flag;
        return 1;
    }
    return 0;
}

/* An elastic job's options, checked and completed: hosts from the script
 * or from -H/--hostfile (fixed hosts: fault tolerance without scaling),
 * -np and --min-np defaulting to each other, --max-np unbounded (as in
 * horovodrun's code), the timeout from HOROVOD_ELASTIC_TIMEOUT or 600 s. */
static void kolorun_elastic_options(kolorun_opts_t *o)
{
    if (o->mpi) {
        kolorun_say("--mpi cannot run an elastic job (--min-np, "
                    "--host-discovery-script): mpirun's jobs have a fixed "
                    "size; drop --mpi");
        exit(2);
    }
    if (o->discovery && o->nhosts > 0) {
        kolorun_say("give --host-discovery-script or -H/--hostfile, not "
                    "both");
        exit(2);
    }
    if (!o->discovery && o->nhosts == 0) {
        kolorun_say("an elastic job needs its hosts: --host-discovery-script "
                    "SCRIPT, or -H/--hostfile for fixed hosts");
        exit(2);
    }
    if (o->slots_per_host && !o->discovery) {
        kolorun_say("--slots-per-host goes with --host-discovery-script (-H "
                    "gives each host's slots)");
        exit(2);
    }
    if (o->output_dir) {
        kolorun_say("--output-filename is not supported in an elastic job "
                    "yet: its workers come and go; drop it");
        exit(2);
    }
    long total = 0;
    for (int h = 0; h < o->nhosts; h++) {
        total += o->hosts[h].slots;
        o->any_remote |= !o->hosts[h].local;
    }
    if (o->np == 0)
        o->np = o->nhosts > 0 ? (int)(total < KOLORUN_MAX_RANKS
                                      ? total : KOLORUN_MAX_RANKS)
                              : o->min_np;
    if (o->np == 0) {
        kolorun_say("say how many ranks the job starts with, -np N (or "
                    "--min-np N)");
        exit(2);
    }
    if (o->min_np == 0)
        o->min_np = o->np;
    if (o->min_np > o->np) {
        kolorun_say("--min-np %d is more than -np %d", o->min_np, o->np);
        exit(2);
    }
    if (o->max_np == 0)
        o->max_np = KOLORUN_MAX_RANKS;
    if (o->max_np < o->np) {
        kolorun_say("--max-np %d is less than -np %d", o->max_np, o->np);
        exit(2);
    }
    if (o->nhosts > 0 && o->np > total) {
        kolorun_say("-np %d is more than the %ld slot%s of the hosts", o->np,
                    total, total == 1 ? "" : "s");
        exit(2);
    }
    if (!o->slots_per_host)
        o->slots_per_host = 1;
    if (!o->elastic_timeout_s) {
        const char *env = getenv("HOROVOD_ELASTIC_TIMEOUT");
        long t = env ? kolorun_parse_long(env, 1, 1000000) : -1;
        if (env && t < 0)
            kolorun_say("warning: HOROVOD_ELASTIC_TIMEOUT='%s' is not a whole "
                        "number of seconds; using 600", env);
        o->elastic_timeout_s = t > 0 ? (int)t : 600;
    }
}

/* Parses the options; exits 0 after --help, 2 on a wrong command line. */
void kolorun_parse(int argc, char **argv, kolorun_opts_t *o)
{
    const char *hosts = NULL, *hostfile = NULL, *config_file = NULL;
    int given[KOLORUN_NKNOBS] = {0}, check_build = 0;
    const char *elastic_flag = NULL; /* one that needs elastic mode */
    memset(o, 0, sizeof *o);
    o->failure_grace_ms = 5000;
    o->reset_limit = -1;
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
            o->gloo = 1;
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
        if (kolorun_elastic_numbers(o, argc, argv, &i, a, &elastic_flag))
            continue;
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--host-discovery-script"))) {
            if (*v == '\0') {
                kolorun_say("--host-discovery-script wants a script");
                exit(2);
            }
            o->discovery = v;
            o->elastic = 1;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a,
                                   "--blacklist-cooldown-range"))) {
            /* two values: A B (horovodrun's nargs=2), A >= 1, B <= 3600 */
            const char *b = i + 1 < argc ? argv[i + 1] : NULL;
            long lo = kolorun_parse_long(v, 1, 3600);
            long hi = b ? kolorun_parse_long(b, 1, 3600) : -1;
            if (lo < 0 || hi < lo) {
                kolorun_say("--blacklist-cooldown-range wants two whole "
                            "numbers of seconds A B, 1 <= A <= B <= 3600, "
                            "not '%s %s'", v, b ? b : "");
                exit(2);
            }
            i++;
            o->cooldown_lo = (int)lo;
            o->cooldown_hi = (int)hi;
            elastic_flag = "--blacklist-cooldown-range";
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
            if (strncmp(v, "redis://", 8) == 0) {
                /* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]: the user and
                 * password as --redis-user and --redis-password. Parsed in
                 * place in a copy that lives as long as kolorun. */
                static char url[1024], hostport[1100];
                char *at, *slash;
                if ((size_t)snprintf(url, sizeof url, "%s", v + 8) >= sizeof url) {
                    kolorun_say("--redis: the URL is longer than %zu characters",
                                sizeof url - 1);
                    exit(2);
                }
                if ((at = strrchr(url, '@')) != NULL) {
                    char *colon;
                    *at = '\0';
                    if ((colon = strchr(url, ':')) != NULL) {
                        *colon = '\0';
                        o->redis_password = colon + 1;
                        if (url[0])
                            o->redis_user = url;
                    } else {
                        o->redis_password = url;
                    }
                }
                v = at ? at + 1 : url;
                if ((slash = strchr(v, '/')) != NULL)
                    *slash = '\0';
                if (!strrchr(v, ':') || (v[0] == '[' && strrchr(v, ']') >
                                                          strrchr(v, ':'))) {
                    snprintf(hostport, sizeof hostport, "%s:6379", v);
                    v = hostport;
                }
            }
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
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--redis-password"))) {
            o->redis_password = v;
            continue;
        }
        if ((v = kolorun_opt_value(argc, argv, &i, a, "--redis-user"))) {
            o->redis_user = v;
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
        const char *close = kolorun_closest_option(a);
        kolorun_say("unknown option '%s'%s%s%s (see kolorun --help)", a,
                    close ? " (did you mean " : "", close ? close : "",
                    close ? "?)" : "");
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
    if (o->elastic)
        kolorun_elastic_options(o);
    else if (elastic_flag) {
        kolorun_say("%s only goes with an elastic job (--min-np or "
                    "--host-discovery-script)", elastic_flag);
        exit(2);
    }
    if (o->nhosts > 0 && !o->elastic)
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
    if ((o->redis_password || o->redis_user) && !o->redis) {
        kolorun_say("--redis-password and --redis-user go with --redis "
                    "HOST:PORT (--start-redis's server has a password of "
                    "its own)");
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
    /* --gloo (or the configuration file's "controller: gloo") means what
     * it means to horovodrun: Gloo negotiates and moves the tensors, unless
     * the user named the backends. */
    if (o->gloo) {
        static const char *const pairs[][2] = {
            {"KOLO_CONTROLLER", "HOROVOD_CONTROLLER"},
            {"KOLO_CPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS"}};
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
            if (!getenv(pairs[p][0]) && !getenv(pairs[p][1]))
                kolorun_setting_put(o, pairs[p][0], pairs[p][1],
                                    kolorun_strdupf("gloo"));
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
