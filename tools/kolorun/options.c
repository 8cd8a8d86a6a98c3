/*
 * options.c — kolorun's command line
 *
 * One table, kolorun_options, holds every flag kolorun takes: its
 * spellings (horovodrun's other spellings among them), whether it takes a
 * value, its lines in --help, and how the value is checked and where it
 * is stored (the row's store function and field; for horovodrun's tuning
 * flags, the row's kind, which flags.c turns into the ranks' setting).
 * The table drives the parsing (kolorun_take_flag finds the row a flag
 * spells and hands it the value), the --help text (kolorun_usage prints
 * the table in its order: paragraphs of text, and each flag's row) and
 * the suggestion for a mistyped flag (the nearest spelling of any row),
 * so the three cannot disagree; as UCX's configuration table does, and
 * runtime/env.c's for the KOLO_* variables. config_file.c finds the
 * tuning flags' YAML keys in it.
 *
 * kolorun_parse reads the flags in order, a later flag winning over an
 * earlier one; then the configuration file (whose settings the command
 * line's win over), the hosts (hosts.c) and the checks that the flags go
 * together, in that order, which decides which message a wrong line
 * gets. It exits 0 after --help or --version, 2 on a wrong command line.
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

struct kolorun_cmdline {
    kolorun_opts_t opts;     /* the job description, copied out at the end */
    const char *hosts;       /* -H: read once the line is known */
    const char *hostfile;    /* --hostfile */
    const char *config_file; /* --config-file */
    int check_build;         /* --check-build */
    const char *elastic_flag; /* the last flag given that needs an elastic
                               * job */
    int given[KOLORUN_NOPTIONS]; /* the rows given: they win over the file */
    int argc;
    char **argv;
    int i; /* argv[i]: the flag being read */
};

/* Where a row's store puts the value: a field of the job description, or
 * of the parse's own state. */
#define KR_OPT(field) offsetof(kolorun_cmdline_t, opts.field)
#define KR_CMD(field) offsetof(kolorun_cmdline_t, field)
#define KR_FIELD(c, opt, type) ((type *)((char *)(c) + (opt)->field))
#define KR_STR_(x) #x
#define KR_STR(x) KR_STR_(x)

static void kolorun_usage(FILE *f);

/* ---- What each flag does: the rows' store functions. */

/* The name a flag's messages give it, whichever spelling was used: its
 * first of more than one letter (--ssh-port for -p, -np for -n). */
static const char *kolorun_option_name(const kolorun_option_t *opt)
{
    if (strlen(opt->names[0].name) == 2 && opt->names[1].name)
        return opt->names[1].name;
    return opt->names[0].name;
}

/* A switch: the int at the row's field becomes 1. */
static void kolorun_store_on(kolorun_cmdline_t *c, const kolorun_option_t *opt,
                             const char *flag, const char *v)
{
    (void)flag, (void)v;
    *KR_FIELD(c, opt, int) = 1;
}

/* A switch with an off form: the int at the row's field becomes 1, or 0
 * for the off form (value "0"). */
static void kolorun_store_switch(kolorun_cmdline_t *c,
                                 const kolorun_option_t *opt,
                                 const char *flag, const char *v)
{
    (void)flag;
    *KR_FIELD(c, opt, int) = v == NULL || strcmp(v, "0") != 0;
}

/* A value kept as it is (checked where it is used, or not at all). */
static void kolorun_store_text(kolorun_cmdline_t *c,
                               const kolorun_option_t *opt, const char *flag,
                               const char *v)
{
    (void)flag;
    *KR_FIELD(c, opt, const char *) = v;
}

/* A value that must not be empty: "--output-filename wants a directory". */
static void kolorun_store_nonempty(kolorun_cmdline_t *c,
                                   const kolorun_option_t *opt,
                                   const char *flag, const char *v)
{
    if (*v == '\0') {
        kolorun_say("%s wants %s", kolorun_option_name(opt), opt->expects);
        exit(2);
    }
    kolorun_store_text(c, opt, flag, v);
}

/* A whole number in the row's [lo, hi]; exits 2 otherwise, saying what
 * the row expects ("a port from 1 to 65535"), by default its range. */
static long kolorun_option_number(const kolorun_option_t *opt, const char *v)
{
    long n = kolorun_parse_long(v, opt->lo, opt->hi);
    if (n >= 0)
        return n;
    if (opt->expects)
        kolorun_say("%s wants %s, not '%s'", kolorun_option_name(opt),
                    opt->expects, v);
    else
        kolorun_say("%s wants a whole number from %ld to %ld, not '%s'",
                    kolorun_option_name(opt), opt->lo, opt->hi, v);
    exit(2);
}

static void kolorun_store_int(kolorun_cmdline_t *c, const kolorun_option_t *opt,
                              const char *flag, const char *v)
{
    (void)flag;
    *KR_FIELD(c, opt, int) = (int)kolorun_option_number(opt, v);
}

/* A number kept as its digits, as the ranks' environment or ssh's command
 * line takes it. */
static void kolorun_store_digits(kolorun_cmdline_t *c,
                                 const kolorun_option_t *opt,
                                 const char *flag, const char *v)
{
    (void)kolorun_option_number(opt, v);
    kolorun_store_text(c, opt, flag, v);
}

/* --failure-grace: seconds, kept in milliseconds, and remembered as given
 * (--mpi refuses it). */
static void kolorun_store_grace(kolorun_cmdline_t *c,
                                const kolorun_option_t *opt, const char *flag,
                                const char *v)
{
    (void)flag;
    c->opts.failure_grace_ms = kolorun_option_number(opt, v) * 1000;
    c->opts.grace_given = 1;
}

static void kolorun_show_help(kolorun_cmdline_t *c, const kolorun_option_t *opt,
                              const char *flag, const char *v)
{
    (void)c, (void)opt, (void)flag, (void)v;
    kolorun_usage(stdout);
    exit(0);
}

static void kolorun_show_version(kolorun_cmdline_t *c,
                                 const kolorun_option_t *opt,
                                 const char *flag, const char *v)
{
    (void)c, (void)opt, (void)flag, (void)v;
    printf("%s\n", PACKAGE_VERSION); /* as horovodrun: the version */
    exit(0);
}

/* --launch-command: its placeholders are checked now, not on every host. */
static void kolorun_store_template(kolorun_cmdline_t *c,
                                   const kolorun_option_t *opt,
                                   const char *flag, const char *v)
{
    kolorun_check_template(v);
    kolorun_store_text(c, opt, flag, v);
}

/* A path that is not what its flag wants: "--rendezvous-dir D: Not a
 * directory". */
__attribute__((noreturn)) static void kolorun_bad_path(
    const kolorun_option_t *opt, const char *path, int err)
{
    kolorun_say("%s %s: %s", kolorun_option_name(opt), path, strerror(err));
    exit(2);
}

/* A file that must be readable (ssh's identity), checked here rather than
 * by every ssh. */
static void kolorun_store_readable(kolorun_cmdline_t *c,
                                   const kolorun_option_t *opt,
                                   const char *flag, const char *v)
{
    if (access(v, R_OK) != 0)
        kolorun_bad_path(opt, v, errno);
    kolorun_store_text(c, opt, flag, v);
}

/* A directory that must exist (--rendezvous-dir). */
static void kolorun_store_dir(kolorun_cmdline_t *c, const kolorun_option_t *opt,
                              const char *flag, const char *v)
{
    struct stat st;
    if (stat(v, &st) != 0)
        kolorun_bad_path(opt, v, errno);
    if (!S_ISDIR(st.st_mode))
        kolorun_bad_path(opt, v, ENOTDIR);
    kolorun_store_text(c, opt, flag, v);
}

static void kolorun_store_ipv4(kolorun_cmdline_t *c,
                               const kolorun_option_t *opt,
                               const char *flag, const char *v)
{
    struct in_addr ia;
    if (inet_pton(AF_INET, v, &ia) != 1) {
        kolorun_say("%s wants an IPv4 address, not '%s'",
                    kolorun_option_name(opt), v);
        exit(2);
    }
    kolorun_store_text(c, opt, flag, v);
}

/* -x NAME[=VALUE], repeatable: the names, in order. */
static void kolorun_store_xenv(kolorun_cmdline_t *c,
                               const kolorun_option_t *opt,
                               const char *flag, const char *v)
{
    kolorun_opts_t *o = &c->opts;
    const char **x = realloc(o->xenv, (size_t)(o->nxenv + 1) * sizeof *x);
    size_t nl = strcspn(v, "=");
    (void)opt, (void)flag;
    if (!x) {
        kolorun_say("out of memory");
        exit(1);
    }
    if (nl == 0 || strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "abcdefghijklmnopqrstuvwxyz"
                             "0123456789_") != nl) {
        kolorun_say("-x wants NAME or NAME=VALUE, not '%s'", v);
        exit(2);
    }
    o->xenv = x;
    o->xenv[o->nxenv++] = v;
}

/* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]: the user and password go
 * where --redis-user and --redis-password put them; HOST:PORT (port 6379
 * when none is given) is returned. Parsed in place in a copy that lives
 * as long as kolorun. */
static const char *kolorun_redis_url(kolorun_opts_t *o, const char *v)
{
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
    if (!strrchr(v, ':') ||
        (v[0] == '[' && strrchr(v, ']') > strrchr(v, ':'))) {
        snprintf(hostport, sizeof hostport, "%s:6379", v);
        v = hostport;
    }
    return v;
}

/* --redis HOST:PORT, or a redis:// URL. */
static void kolorun_store_redis(kolorun_cmdline_t *c,
                                const kolorun_option_t *opt, const char *flag,
                                const char *v)
{
    const char *colon;
    if (strncmp(v, "redis://", 8) == 0)
        v = kolorun_redis_url(&c->opts, v);
    colon = strrchr(v, ':');
    if (!colon || colon == v || kolorun_parse_long(colon + 1, 1, 65535) < 0) {
        kolorun_say("--redis wants HOST:PORT (port from 1 to 65535), not '%s'",
                    v);
        exit(2);
    }
    kolorun_store_text(c, opt, flag, v);
}

/* --network-interface(s): a comma list, repeatable. All of them go to NCCL
 * (NCCL_SOCKET_IFNAME), as horovodrun does; Gloo binds one
 * (KOLO_NETWORK_INTERFACE, horovodrun's HOROVOD_GLOO_IFACE, which it takes
 * from a set in no order): the first of the last flag, so that a later
 * flag overrides an earlier one as everywhere on kolorun's line. Messages
 * name the spelling given. */
static void kolorun_store_nics(kolorun_cmdline_t *c,
                               const kolorun_option_t *opt, const char *flag,
                               const char *list)
{
    kolorun_opts_t *o = &c->opts;
    const char *p = list;
    (void)opt;
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

/* --blacklist-cooldown-range A B: two values (horovodrun's nargs=2), the
 * second the next word; 1 <= A <= B <= 3600. */
static void kolorun_store_cooldown(kolorun_cmdline_t *c,
                                   const kolorun_option_t *opt,
                                   const char *flag, const char *v)
{
    const char *b = c->i + 1 < c->argc ? c->argv[c->i + 1] : NULL;
    long lo = kolorun_parse_long(v, 1, 3600);
    long hi = b ? kolorun_parse_long(b, 1, 3600) : -1;
    (void)opt, (void)flag;
    if (lo < 0 || hi < lo) {
        kolorun_say("--blacklist-cooldown-range wants two whole "
                    "numbers of seconds A B, 1 <= A <= B <= 3600, "
                    "not '%s %s'", v, b ? b : "");
        exit(2);
    }
    c->i++;
    c->opts.cooldown_lo = (int)lo;
    c->opts.cooldown_hi = (int)hi;
}

/* ---- The table. */

#define KR_BAYES                                                          \
    "kolo's autotune is a coordinate search, not Bayesian optimisation, " \
    "and has no such knob; --autotune-steps-per-sample sets the rounds "  \
    "it measures per window"

/* In --help's order: a row of text is a paragraph of it; a flag's row
 * without help is not shown (the refused flags are named in a paragraph
 * instead); a tuning flag's help goes on from its variable's name, which
 * --help writes first ("KOLO_CYCLE_TIME" "=MS (default 5)"). Whatever the
 * order, a spelling matches only itself (or itself=VALUE). */
const kolorun_option_t kolorun_options[] = {
    {.text =
        "usage: kolorun -np N [options] [--] command [args...]\n"
        "       kolorun --check-build | --version | --help\n"
        "\n"
        "Starts N ranks of command on this machine (or on the hosts of -H or\n"
        "--hostfile), carries their output and waits for them. If one rank\n"
        "fails, the others are stopped. kolorun takes horovodrun's flags, with\n"
        "the same meaning; each tuning flag sets the KOLO_* variable named for\n"
        "every rank (and replaces the HOROVOD_* variable of the same setting).\n"
        "\n"},
    {.names = {{"-np"}, {"--num-proc"}, {"-n"}, {"--np", KR_HIDDEN}},
     .arg = "N",
     .help = "number of ranks (required without -H or\n"
             "--hostfile)",
     .store = kolorun_store_int, .field = KR_OPT(np), .lo = 1,
     .hi = KOLORUN_MAX_RANKS,
     .expects = "a number of ranks from 1 to " KR_STR(KOLORUN_MAX_RANKS)},
    {.names = {{"-cb"}, {"--check-build"}},
     .help = "show what this kolo has (frameworks,\n"
             "controllers, tensor operations, NCCL's\n"
             "version) and whether a GPU is visible now",
     .store = kolorun_store_on, .field = KR_CMD(check_build)},
    {.names = {{"-v"}, {"--version"}}, .help = "show kolo's version",
     .store = kolorun_show_version},
    {.names = {{"--no-tag-output", KR_OFF}, {"--tag-output"}},
     .help = "pass the ranks' output unchanged; by default\n"
             "every line (ended by \\n or \\r) is prefixed\n"
             "with its rank and stream, as horovodrun\n"
             "does (and mpirun --tag-output):\n"
             "  [1]<stdout>:text\n"
             "  [1]<stderr>:text\n"
             "horovodrun has no --no-tag-output;\n"
             "--tag-output (the default) is accepted",
     .store = kolorun_store_switch, .field = KR_OPT(tag_output)},
    {.names = {{"--prefix-output-with-timestamp"}, {"-prefix-timestamp"}},
     .help = "prefix every output line with the local\n"
             "time, as horovodrun: Mon Jun  5 10:00:00 2023",
     .store = kolorun_store_on, .field = KR_OPT(timestamp)},
    {.names = {{"--output-filename"}}, .arg = "DIR",
     .help = "also write each rank's stdout and stderr to\n"
             "DIR/rank.R/stdout and DIR/rank.R/stderr (R\n"
             "padded with zeros: rank.03 of 12), as they\n"
             "are shown; under --mpi, mpirun's own layout",
     .store = kolorun_store_nonempty, .field = KR_OPT(output_dir),
     .expects = "a directory"},
    {.names = {{"--flight-dir"}}, .arg = "DIR",
     .help = "=DIR (made absolute) for every\n"
             "rank: where ranks write their flight\n"
             "recorder dumps (DIR/rank<R>.json; read\n"
             "them with kolo-timeline why DIR). Default:\n"
             "KOLO_FLIGHT_DIR if set here, else a new\n"
             "$TMPDIR/kolo-flight-USER-TIME-PID (mode\n"
             "700), removed after a job that succeeded;\n"
             "after a job that failed, kept and named in\n"
             "kolorun's last lines if a rank wrote to it.\n"
             "Under --mpi: none unless given",
     .kind = KR_TEXT, .var = "KOLO_FLIGHT_DIR"},
    {.names = {{"--config-file"}}, .arg = "FILE",
     .help = "horovodrun's YAML configuration (controller,\n"
             "params, autotune, timeline, stall_check,\n"
             "library_options, logging); flags on the\n"
             "command line win over it",
     .store = kolorun_store_text, .field = KR_CMD(config_file)},
    {.names = {{"--start-timeout"}}, .arg = "SECONDS",
     .help = "give every rank KOLO_START_TIMEOUT=SECONDS:\n"
             "how long ranks wait for each other at start",
     .store = kolorun_store_digits, .field = KR_OPT(start_timeout), .lo = 1,
     .hi = 1000000000L, .expects = "a whole number of seconds (at least 1)"},
    {.names = {{"--failure-grace"}}, .arg = "SECONDS",
     .help = "after a rank fails, let the others report it\n"
             "and exit by themselves for this long before\n"
             "stopping them (default 5; 0: stop at once)",
     .store = kolorun_store_grace, .lo = 0, .hi = 3600,
     .expects = "a whole number of seconds from 0 to 3600"},
    {.names = {{"--disable-cache"}},
     .help = "accepted: kolorun keeps no cache of its\n"
             "checks between runs (horovodrun's of ssh)",
     .kind = KR_NOOP},
    {.names = {{"--verbose"}},
     .help = "say what kolorun does: rendezvous directory,\n"
             "each rank's pid and environment and end",
     .store = kolorun_store_on, .field = KR_OPT(verbose)},
    {.names = {{"-h"}, {"--help"}}, .help = "show this help",
     .store = kolorun_show_help},

    {.text =
        "\n"
        "Controller arguments:\n"
        "  (what negotiates and moves the tensors; without either, kolo's\n"
        "  choice: shared memory on one host, Gloo across hosts)\n"},
    {.names = {{"--gloo"}},
     .help = "Gloo, as horovodrun --gloo: sets\n"
             "KOLO_CONTROLLER=gloo KOLO_CPU_OPERATIONS=gloo\n"
             "(unless set); kolorun starts the ranks",
     .store = kolorun_store_on, .field = KR_OPT(gloo)},
    {.names = {{"--mpi"}},
     .help = "MPI, as horovodrun --mpi: the job runs\n"
             "through mpirun (Open MPI), the ranks take\n"
             "their places from MPI and use the mpi\n"
             "backend (as under plain mpirun;\n"
             "KOLO_CONTROLLER and KOLO_CPU_OPERATIONS\n"
             "still choose); every KOLO_* and HOROVOD_*\n"
             "variable is passed on with -x; KOLO_MPIRUN\n"
             "names another mpirun",
     .store = kolorun_store_on, .field = KR_OPT(mpi)},

    {.text = "\nTuneable parameter arguments:\n"},
    {.names = {{"--fusion-threshold-mb"}}, .arg = "MB",
     .help = "=MB*1048576 (default 128;\n"
             "0: no fusion)",
     .kind = KR_MB, .yaml = "params.fusion_threshold_mb",
     .var = "KOLO_FUSION_THRESHOLD", .twin = "HOROVOD_FUSION_THRESHOLD"},
    {.names = {{"--cycle-time-ms"}}, .arg = "MS", .help = "=MS (default 5)",
     .kind = KR_MS, .yaml = "params.cycle_time_ms", .var = "KOLO_CYCLE_TIME",
     .twin = "HOROVOD_CYCLE_TIME"},
    {.names = {{"--cache-capacity"}}, .arg = "N",
     .help = "=N (default 1024; 0: off)", .kind = KR_COUNT,
     .yaml = "params.cache_capacity", .var = "KOLO_CACHE_CAPACITY",
     .twin = "HOROVOD_CACHE_CAPACITY"},
    {.names = {{"--hierarchical-allreduce"},
               {"--no-hierarchical-allreduce", KR_OFF}},
     .help = "=1 or 0 (default:\n"
             "on across hosts with several ranks each)",
     .kind = KR_SWITCH, .yaml = "params.hierarchical_allreduce",
     .var = "KOLO_HIERARCHICAL_ALLREDUCE",
     .twin = "HOROVOD_HIERARCHICAL_ALLREDUCE"},
    {.names = {{"--hierarchical-allgather"},
               {"--no-hierarchical-allgather", KR_OFF | KR_HIDDEN}},
     .kind = KR_REFUSED_ON, .yaml = "params.hierarchical_allgather",
     .why = "kolo has no hierarchical allgather (allgather goes through "
            "shared memory within a host, and over Gloo or MPI between "
            "hosts); drop it"},

    {.text = "\nAutotune arguments:\n"},
    {.names = {{"--autotune"}, {"--no-autotune", KR_OFF | KR_HIDDEN}},
     .help = "=1", .kind = KR_SWITCH, .yaml = "autotune.enabled",
     .var = "KOLO_AUTOTUNE", .twin = "HOROVOD_AUTOTUNE"},
    {.names = {{"--autotune-log-file"}}, .arg = "F", .help = "=F",
     .kind = KR_TEXT, .yaml = "autotune.log_file", .var = "KOLO_AUTOTUNE_LOG",
     .twin = "HOROVOD_AUTOTUNE_LOG"},
    {.names = {{"--autotune-steps-per-sample"}}, .arg = "N",
     .help = "=N: rounds per window", .kind = KR_POSITIVE,
     .yaml = "autotune.steps_per_sample", .var = "KOLO_AUTOTUNE_WINDOW",
     .twin = "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
    {.names = {{"--autotune-warmup-samples"}}, .arg = "N", .kind = KR_REFUSED,
     .yaml = "autotune.warmup_samples", .why = KR_BAYES},
    {.names = {{"--autotune-bayes-opt-max-samples"}}, .arg = "N",
     .kind = KR_REFUSED, .yaml = "autotune.bayes_opt_max_samples",
     .why = KR_BAYES},
    {.names = {{"--autotune-gaussian-process-noise"}}, .arg = "X",
     .kind = KR_REFUSED, .yaml = "autotune.gaussian_process_noise",
     .why = KR_BAYES},

    {.text = "\nTimeline arguments:\n"},
    {.names = {{"--timeline-filename"}}, .arg = "F", .help = "=F",
     .kind = KR_TEXT, .yaml = "timeline.filename", .var = "KOLO_TIMELINE",
     .twin = "HOROVOD_TIMELINE"},
    {.names = {{"--timeline-mark-cycles"},
               {"--no-timeline-mark-cycles", KR_OFF | KR_HIDDEN}},
     .help = "=1", .kind = KR_SWITCH, .yaml = "timeline.mark_cycles",
     .var = "KOLO_TIMELINE_MARK_CYCLES",
     .twin = "HOROVOD_TIMELINE_MARK_CYCLES"},

    {.text = "\nStall check arguments:\n"},
    {.names = {{"--no-stall-check"}, {"--stall-check", KR_OFF | KR_HIDDEN}},
     .help = "=1", .kind = KR_SWITCH, .yaml = "stall_check.enabled",
     .yaml_inverted = 1, .var = "KOLO_STALL_CHECK_DISABLE",
     .twin = "HOROVOD_STALL_CHECK_DISABLE"},
    {.names = {{"--stall-check-warning-time-seconds"}}, .arg = "S",
     .help = "=S (default 60)", .kind = KR_COUNT,
     .yaml = "stall_check.warning_time_seconds",
     .var = "KOLO_STALL_CHECK_TIME_SECONDS",
     .twin = "HOROVOD_STALL_CHECK_TIME_SECONDS"},
    {.names = {{"--stall-check-shutdown-time-seconds"}}, .arg = "S",
     .help = "=S (default\n"
             "0: never)",
     .kind = KR_COUNT, .yaml = "stall_check.shutdown_time_seconds",
     .var = "KOLO_STALL_SHUTDOWN_TIME_SECONDS",
     .twin = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},

    {.text = "\nLibrary arguments:\n"},
    {.names = {{"--gloo-timeout-seconds"}}, .arg = "S",
     .help = "=S (default 60)", .kind = KR_POSITIVE,
     .yaml = "library_options.gloo_timeout_seconds",
     .var = "KOLO_TIMEOUT_SECONDS", .twin = "HOROVOD_GLOO_TIMEOUT_SECONDS"},
    {.names = {{"--tcp"}},
     .help = "NCCL_IB_DISABLE=1; under --mpi, Open MPI on\n"
             "TCP (--mca pml ob1 --mca btl ^openib)",
     .store = kolorun_store_on, .field = KR_OPT(tcp)},
    {.names = {{"--mpi-args"}}, .arg = "ARGS",
     .help = "with --mpi: more words for mpirun", .store = kolorun_store_text,
     .field = KR_OPT(mpi_args)},
    {.names = {{"--binding-args"}}, .arg = "ARGS",
     .help = "with --mpi: mpirun's binding, in place of\n"
             "--bind-to none",
     .store = kolorun_store_text, .field = KR_OPT(binding_args)},
    {.names = {{"--mpi-threads-disable"},
               {"--no-mpi-threads-disable", KR_OFF | KR_HIDDEN}},
     .kind = KR_REFUSED_ON, .yaml = "library_options.mpi_threads_disable",
     .why = "kolo's background thread calls MPI, so kolo needs "
            "MPI_THREAD_MULTIPLE; mpi4py works on top of kolo as it is"},
    {.names = {{"--num-nccl-streams"}}, .arg = "1",
     .help = "accepted (kolo uses one stream)", .kind = KR_ONE,
     .yaml = "library_options.num_nccl_streams",
     .why = "kolo uses one NCCL stream per process set; drop it (or give 1)"},
    {.names = {{"--thread-affinity"}}, .arg = "N", .kind = KR_REFUSED,
     .why = "kolo does not pin its background thread; pin the whole rank "
            "(taskset, numactl, or --mpi with --binding-args)"},
    {.names = {{"--ccl-bgt-affinity"}}, .arg = "N", .kind = KR_REFUSED,
     .yaml = "library_options.ccl_bgt_affinity",
     .why = "kolo has no oneCCL backend"},

    {.text = "\nLogging arguments:\n"},
    {.names = {{"--log-level"}}, .arg = "LEVEL",
     .help = " (TRACE, DEBUG, INFO, WARNING,\n"
             "ERROR, FATAL; any case)",
     .kind = KR_LEVEL, .yaml = "logging.level", .var = "KOLO_LOG_LEVEL",
     .twin = "HOROVOD_LOG_LEVEL"},
    {.names = {{"--log-with-timestamp", KR_HIDDEN},
               {"--no-log-hide-timestamp", KR_HIDDEN},
               {"--log-without-timestamp", KR_OFF},
               {"--log-hide-timestamp", KR_OFF | KR_HIDDEN}},
     .help = "accepted (kolo's log lines carry no time)",
     .kind = KR_REFUSED_ON, .yaml = "logging.with_timestamp",
     .why = "kolo's log lines carry no time; --prefix-output-with-timestamp "
            "stamps every line of the ranks' output"},
    {.names = {{"--jsrun"}}, .kind = KR_REFUSED_ON,
     .why = "kolorun has no jsrun launcher; under LSF use --mpi (mpirun), or "
            "-H"},

    {.text = "\nRefused, with the reason (kolo cannot honour them):",
     .refused_list = 1},
    {.text =
        "\n"
        "Elastic arguments (an elastic job: --min-np or --host-discovery-script;\n"
        "the script wraps its loop in hvd.elastic.run; see \"Elastic jobs\" in\n"
        "kolo's README.md, and docs/launching.md):\n"},
    {.names = {{"--min-np"}, {"--min-num-proc"}}, .arg = "N",
     .help = "the job goes on while at least N ranks are\n"
             "available (default -np); -np N ranks start it",
     .store = kolorun_store_int, .field = KR_OPT(min_np), .lo = 1,
     .hi = KOLORUN_MAX_RANKS, .elastic = KR_MAKES_ELASTIC},
    {.names = {{"--max-np"}, {"--max-num-proc"}}, .arg = "N",
     .help = "at most N ranks (default: every slot)",
     .store = kolorun_store_int, .field = KR_OPT(max_np), .lo = 1,
     .hi = KOLORUN_MAX_RANKS, .elastic = KR_ELASTIC_ONLY},
    {.names = {{"--host-discovery-script"}}, .arg = "S",
     .help = "run S (sh -c) about once a second; its lines\n"
             "'host:slots' or 'host' are the hosts now; a\n"
             "failing run or a wrong line keeps the last\n"
             "list (one warning). Without it, -H/--hostfile\n"
             "are fixed hosts: fault tolerance, no scaling",
     .store = kolorun_store_nonempty, .field = KR_OPT(discovery),
     .expects = "a script", .elastic = KR_MAKES_ELASTIC},
    {.names = {{"--slots-per-host"}}, .arg = "N",
     .help = "slots of a script line without :slots (1)",
     .store = kolorun_store_int, .field = KR_OPT(slots_per_host), .lo = 1,
     .hi = KOLORUN_MAX_RANKS, .elastic = KR_ELASTIC_ONLY},
    {.names = {{"--elastic-timeout"}}, .arg = "S",
     .help = "how long to wait for enough slots, at the start\n"
             "and after a loss, before ending the job (default\n"
             "HOROVOD_ELASTIC_TIMEOUT, else 600)",
     .store = kolorun_store_int, .field = KR_OPT(elastic_timeout_s), .lo = 1,
     .hi = 1000000, .elastic = KR_ELASTIC_ONLY},
    {.names = {{"--reset-limit"}}, .arg = "N",
     .help = "end the job rather than publish more than N new\n"
             "generations (default: no limit)",
     .store = kolorun_store_int, .field = KR_OPT(reset_limit), .lo = 0,
     .hi = 1000000, .elastic = KR_ELASTIC_ONLY},
    {.names = {{"--blacklist-cooldown-range"}}, .arg = "A B",
     .help = "a failed host comes back after A*2^n + U(0,A)\n"
             "seconds, within [A, B] (default: never)",
     .store = kolorun_store_cooldown, .elastic = KR_ELASTIC_ONLY},

    {.text =
        "A worker runs per (host, slot); when one fails, its host is blacklisted\n"
        "and its other workers stopped, and the survivors (with any new slots)\n"
        "form the next generation; kolorun ends non-zero, with one line saying\n"
        "why, when every rank failed, the reset limit is reached, or too few\n"
        "ranks remain for --elastic-timeout; 0 when the latest generation's\n"
        "ranks all exit 0. The rank prefix numbers workers in the order they\n"
        "started. Each worker also gets KOLO_ELASTIC=1, HOROVOD_ELASTIC=1,\n"
        "KOLO_ELASTIC_ID=host:slot, KOLO_HOSTNAME=host, KOLO_ELASTIC_TIMEOUT.\n"
        "\n"
        "Host arguments (see \"Running on several hosts\" in kolo's README.md):\n"},
    {.names = {{"-H"}, {"--hosts"}, {"--host", KR_HIDDEN}}, .arg = "H:N,...",
     .help = "hosts and their slots (H alone: 1 slot); ranks\n"
             "fill the hosts in order, host by host; -np\n"
             "defaults to the sum of the slots",
     .store = kolorun_store_text, .field = KR_CMD(hosts)},
    {.names = {{"--hostfile"}, {"-hostfile", KR_HIDDEN}}, .arg = "FILE",
     .help = "the same from a file: lines 'host slots=N'\n"
             "(or 'host': 1 slot); '#' starts a comment",
     .store = kolorun_store_text, .field = KR_CMD(hostfile)},
    {.names = {{"--launch-command"}}, .arg = "TMPL",
     .help = "how a rank starts on another host (default:\n"
             "ssh -o BatchMode=yes {host} {command}); TMPL is\n"
             "split at blanks, then {host} (the host as given),\n"
             "{rank}, {local_rank} and {command} (the rank's\n"
             "command, environment included, as one shell-\n"
             "quoted word) are replaced. Without {command}\n"
             "the words env VAR=VALUE... command args... are\n"
             "appended, e.g. 'ip netns exec {host}'",
     .store = kolorun_store_template, .field = KR_OPT(launch_command)},
    {.names = {{"-p"}, {"--ssh-port"}}, .arg = "PORT", .help = "ssh -p PORT",
     .store = kolorun_store_digits, .field = KR_OPT(ssh_port), .lo = 1,
     .hi = 65535, .expects = "a port from 1 to 65535"},
    {.names = {{"-i"}, {"--ssh-identity-file"}}, .arg = "F",
     .help = "ssh -i F", .store = kolorun_store_readable,
     .field = KR_OPT(ssh_identity)},
    {.names = {{"-x"}}, .arg = "NAME[=VALUE]",
     .help = "also pass NAME (from here, or VALUE) to the\n"
             "ranks on other hosts; KOLO_* and HOROVOD_*\n"
             "always go",
     .store = kolorun_store_xenv},
    {.names = {{"--redis"}}, .arg = "HOST:PORT",
     .help = "ranks meet through this Redis server (keys\n"
             "under a name of this job, deleted at the end);\n"
             "or redis://[[USER]:PASSWORD@]HOST[:PORT]",
     .store = kolorun_store_redis, .field = KR_OPT(redis)},
    {.names = {{"--start-redis"}},
     .help = "start redis-server here for the job, on a free\n"
             "port, and stop it at the end",
     .store = kolorun_store_on, .field = KR_OPT(start_redis)},
    {.names = {{"--redis-bind"}}, .arg = "ADDR",
     .help = "the address --start-redis listens on (default:\n"
             "this host's address on --network-interface, or\n"
             "its first non-loopback IPv4 address)",
     .store = kolorun_store_ipv4, .field = KR_OPT(redis_bind)},
    {.names = {{"--redis-password"}}, .arg = "PW",
     .help = "the password of --redis's server (better: export\n"
             "KOLO_REDIS_PASSWORD, which ps does not show);\n"
             "--start-redis's has one derived from the job's\n"
             "secret",
     .store = kolorun_store_text, .field = KR_OPT(redis_password)},
    {.names = {{"--redis-user"}}, .arg = "USER",
     .help = "with --redis-password: a Redis ACL user",
     .store = kolorun_store_text, .field = KR_OPT(redis_user)},
    {.names = {{"--rendezvous-dir"}}, .arg = "DIR",
     .help = "ranks meet in a fresh directory under DIR, a\n"
             "file system every host shares",
     .store = kolorun_store_dir, .field = KR_OPT(rdv_base)},
    {.names = {{"--network-interfaces"}, {"--network-interface", KR_HIDDEN}},
     .arg = "IF,...",
     .help = "(or --network-interface IF, repeatable)\n"
             "ranks bind the address of the first IF of\n"
             "the last such flag on their host for Gloo;\n"
             "NCCL_SOCKET_IFNAME gets them all",
     .store = kolorun_store_nics},
    {.text =
        "\n"
        "Each rank gets KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
        "KOLO_CROSS_RANK (its host's index), KOLO_CROSS_SIZE (hosts),\n"
        "KOLO_RENDEZVOUS=file:DIR (a private directory, removed at the end) or\n"
        "redis:HOST:PORT/JOB, KOLO_HOSTNAME (127.0.0.1 on one host; unless\n"
        "already set) and KOLO_FLIGHT_DIR (see --flight-dir). Its standard\n"
        "input is /dev/null. Its output goes to kolorun's stdout and stderr in\n"
        "whole lines (lines over 64 KiB in pieces), each prefixed with\n"
        "[rank]<stream>: unless --no-tag-output, which passes the bytes\n"
        "unchanged.\n"
        "\n"
        "SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the ranks; ranks\n"
        "still alive 3 s later are killed (a second Ctrl-C kills them at once),\n"
        "and kolorun then ends by the same signal. SIGUSR1 (kill -USR1 PID of\n"
        "kolorun) asks the ranks here for a flight recorder dump, and the job\n"
        "goes on; it goes only to ranks whose kolo said it takes it (it wrote\n"
        "KOLO_FLIGHT_DIR/rank<R>.ready): any other program would die of it.\n"
        "Before kolorun stops a job (a rank failed, a signal), those ranks get\n"
        "SIGUSR1 first, and kolorun waits up to 2 s for their dumps. At the\n"
        "end, the job's stragglers as rank 0 saw them (DIR/stragglers.txt).\n"
        "\n"
        "Exit status:\n"
        "  0       every rank exited with status 0\n"
        "  S       the rank named as the cause exited with status S (1: it\n"
        "          was still running): one the others name (lost, stalled\n"
        "          the job, skipped a collective), else the first to fail;\n"
        "          when the ranks disagreed on a tensor, no rank is named\n"
        "          and S is the first failed rank's\n"
        "  128+N   the rank named as the cause was killed by signal N (a\n"
        "          rank killed goes before ranks that exited with an error\n"
        "          at about the same time, likely because of it)\n"
        "  127     a rank could not start: command not found (126: not\n"
        "          executable)\n"
        "  1       kolorun itself failed\n"
        "  2       wrong command line\n"},
};
_Static_assert(sizeof kolorun_options / sizeof kolorun_options[0] ==
                   KOLORUN_NOPTIONS,
               "KOLORUN_NOPTIONS in cmdline.h counts kolorun_options");

/* ---- --help: the table in its order. */

#define KR_HELP_COLUMN 27 /* where a flag's description starts */
#define KR_HELP_WIDTH 72  /* the width of a paragraph's lines */

/* A row's spellings as --help shows them: "-np N, --num-proc N, -n N";
 * a one-letter spelling followed by a longer one leaves the value's word
 * to it, as getopt's usage does ("-p, --ssh-port PORT"). */
static size_t kolorun_usage_words(const kolorun_option_t *opt, char *buf,
                                  size_t cap)
{
    const char *shown[KR_SPELLINGS];
    size_t n = 0, len = 0;
    for (int s = 0; s < KR_SPELLINGS && opt->names[s].name; s++)
        if (!(opt->names[s].how & KR_HIDDEN))
            shown[n++] = opt->names[s].name;
    buf[0] = '\0';
    for (size_t s = 0; s < n && len < cap; s++) {
        int word = opt->arg && !(strlen(shown[s]) == 2 && s + 1 < n);
        len += (size_t)snprintf(buf + len, cap - len, "%s%s%s%s",
                                s ? ", " : "", shown[s], word ? " " : "",
                                word ? opt->arg : "");
    }
    return len;
}

/* A row: its spellings, then its help from KR_HELP_COLUMN on, on the same
 * line when they leave room, else on the next. */
static void kolorun_usage_row(FILE *f, const kolorun_option_t *opt)
{
    char words[200];
    const char *p = opt->help;
    if (kolorun_usage_words(opt, words, sizeof words) + 2 < KR_HELP_COLUMN)
        fprintf(f, "  %-*s", KR_HELP_COLUMN - 2, words);
    else
        fprintf(f, "  %s\n%*s", words, KR_HELP_COLUMN, "");
    if (opt->var)
        fputs(opt->var, f); /* a tuning flag's help goes on from it */
    for (;;) {
        size_t n = strcspn(p, "\n");
        fprintf(f, "%.*s\n", (int)n, p);
        if (p[n] == '\0')
            break;
        p += n + 1;
        fprintf(f, "%*s", KR_HELP_COLUMN, "");
    }
}

/* The flags kolo refuses (whatever their value, or on), each by its
 * first spelling, as the rest of a paragraph whose last line is col
 * characters long: they have no lines of their own. */
static void kolorun_usage_refused(FILE *f, size_t col)
{
    const char *sep = "";
    for (size_t i = 0; i < KOLORUN_NOPTIONS; i++) {
        const kolorun_option_t *opt = &kolorun_options[i];
        char item[100];
        size_t n;
        if (opt->kind != KR_REFUSED && opt->kind != KR_REFUSED_ON &&
            opt->kind != KR_ONE)
            continue;
        n = (size_t)snprintf(item, sizeof item, "%s%s", opt->names[0].name,
                             opt->kind == KR_ONE ? " other than 1" : "");
        col += (size_t)fprintf(f, "%s", sep);
        /* + 1: the comma or full stop that follows it */
        if (col + 1 + n + 1 > KR_HELP_WIDTH) {
            fputc('\n', f);
            col = 0;
        } else {
            fputc(' ', f);
            col++;
        }
        col += (size_t)fprintf(f, "%s", item);
        sep = ",";
    }
    fputs(".\n", f);
}

/* --help: the table in order, its paragraphs and its flags' rows. */
static void kolorun_usage(FILE *f)
{
    for (size_t i = 0; i < KOLORUN_NOPTIONS; i++) {
        const kolorun_option_t *opt = &kolorun_options[i];
        if (opt->text)
            fputs(opt->text, f);
        if (opt->refused_list)
            kolorun_usage_refused(f, strlen(strrchr(opt->text, '\n') + 1));
        if (opt->help)
            kolorun_usage_row(f, opt);
    }
}

/* ---- Reading the command line. */

/* The row that arg spells ("--flag", or "--flag=V" for a flag that takes
 * a value), and *spelling which of its spellings; NULL when none does. */
static const kolorun_option_t *kolorun_option_find(
    const char *arg, const kolorun_spelling_t **spelling)
{
    for (size_t i = 0; i < KOLORUN_NOPTIONS; i++) {
        const kolorun_option_t *opt = &kolorun_options[i];
        for (int s = 0; s < KR_SPELLINGS && opt->names[s].name; s++) {
            size_t n = strlen(opt->names[s].name);
            if (strncmp(arg, opt->names[s].name, n) == 0 &&
                (arg[n] == '\0' || (arg[n] == '=' && opt->arg))) {
                *spelling = &opt->names[s];
                return opt;
            }
        }
    }
    return NULL;
}

/* The spelling nearest a mistyped flag ("--verbos": "--verbose"), or NULL
 * when none is within a third of its length. Every spelling of the table
 * counts, shown by --help or not, but for one-letter flags, too short to
 * guess at. */
static const char *kolorun_closest_option(const char *typed)
{
    const char *best = NULL;
    char want[64];
    size_t best_d = 99;
    int best_hidden = 0;
    snprintf(want, sizeof want, "%.*s", (int)strcspn(typed, "="), typed);
    for (size_t i = 0; i < KOLORUN_NOPTIONS; i++) {
        const kolorun_spelling_t *names = kolorun_options[i].names;
        for (int s = 0; s < KR_SPELLINGS && names[s].name; s++) {
            size_t d = strlen(names[s].name) > 2
                           ? kolo__edit_distance(want, names[s].name)
                           : 99;
            /* On a tie, a spelling --help shows wins over a hidden one
             * (--cp: --tcp, not horovodrun's other spelling --np). */
            int shown = !(names[s].how & KR_HIDDEN);
            if (d < best_d ||
                (d == best_d && shown && best_hidden)) {
                best_hidden = !shown;
                best_d = d;
                best = names[s].name;
            }
        }
    }
    return best_d > 0 && best_d * 3 <= strlen(want) ? best : NULL;
}

__attribute__((noreturn)) static void kolorun_unknown(const char *a)
{
    const char *close = kolorun_closest_option(a);
    kolorun_say("unknown option '%s'%s%s%s (see kolorun --help)", a,
                close ? " (did you mean " : "", close ? close : "",
                close ? "?)" : "");
    exit(2);
}

/* Takes the flag at argv[c->i], and its value: its row's store keeps it
 * (or the row refuses it, or it ends kolorun: --help). */
static void kolorun_take_flag(kolorun_cmdline_t *c)
{
    const char *a = c->argv[c->i], *v = NULL;
    const kolorun_spelling_t *spelling;
    const kolorun_option_t *opt = kolorun_option_find(a, &spelling);
    if (!opt)
        kolorun_unknown(a);
    /* Refused before its value is read: the refusal says enough. */
    if (opt->kind == KR_REFUSED)
        kolorun_refuse(spelling->name, opt->why);
    if (opt->arg)
        v = kolorun_opt_value(c->argc, c->argv, &c->i, a, spelling->name);
    else if (spelling->how & KR_OFF)
        v = "0";
    /* A tuning flag's kind says what it does (flags.c); its messages name
     * the spelling given. */
    if (opt->kind != KR_NONE)
        kolorun_knob_apply(&c->opts, opt, v, spelling->name);
    else
        opt->store(c, opt, spelling->name, v);
    c->given[opt - kolorun_options] = 1;
    if (opt->elastic == KR_MAKES_ELASTIC)
        c->opts.elastic = 1;
    else if (opt->elastic == KR_ELASTIC_ONLY)
        c->elastic_flag = opt->names[0].name;
}

/* Takes the flags before the command; c->i ends at the command's first
 * word (after "--", if given). */
static void kolorun_read_flags(kolorun_cmdline_t *c)
{
    for (c->i = 1; c->i < c->argc; c->i++) {
        const char *a = c->argv[c->i];
        if (strcmp(a, "--") == 0) {
            c->i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the command starts here */
        kolorun_take_flag(c);
    }
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


/* ---- Once the whole line is read: the checks that the flags go
 * together, in the order that decides which message a wrong line gets. */

/* Where the ranks go and how many: the hosts (-H or --hostfile), an
 * elastic job's numbers, the ranks placed on fixed hosts, and -np. */
static void kolorun_size_job(kolorun_cmdline_t *c)
{
    kolorun_opts_t *o = &c->opts;
    if (c->hosts && c->hostfile) {
        kolorun_say("give the hosts with -H or with --hostfile, not both");
        exit(2);
    }
    if (c->hosts)
        kolorun_parse_hosts(o, c->hosts);
    else if (c->hostfile)
        kolorun_parse_hostfile(o, c->hostfile);
    if (o->elastic)
        kolorun_elastic_options(o);
    else if (c->elastic_flag) {
        kolorun_say("%s only goes with an elastic job (--min-np or "
                    "--host-discovery-script)", c->elastic_flag);
        exit(2);
    }
    if (o->nhosts > 0 && !o->elastic)
        kolorun_place(o);
    if (o->np == 0) {
        kolorun_say("say how many ranks to start with -np N "
                    "(see kolorun --help)");
        exit(2);
    }
}

/* Where the ranks meet: one of a private directory, --rendezvous-dir and
 * Redis, which ranks on other hosts must be able to reach. */
static void kolorun_check_rendezvous(const kolorun_opts_t *o)
{
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
}

/* --mpi hands the job to mpirun, which places the ranks itself and is a
 * launcher of its own, unlike --gloo. */
static void kolorun_check_launcher(const kolorun_opts_t *o)
{
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
}

/* --gloo (or the configuration file's "controller: gloo") means what it
 * means to horovodrun: Gloo negotiates and moves the tensors, unless the
 * user named the backends. */
static void kolorun_gloo_backends(kolorun_opts_t *o)
{
    static const char *const pairs[][2] = {
        {"KOLO_CONTROLLER", "HOROVOD_CONTROLLER"},
        {"KOLO_CPU_OPERATIONS", "HOROVOD_CPU_OPERATIONS"}};
    if (!o->gloo)
        return;
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        if (!getenv(pairs[p][0]) && !getenv(pairs[p][1]))
            kolorun_setting_put(o, pairs[p][0], pairs[p][1],
                                kolorun_strdupf("gloo"));
}

/* The flags that mean something only with --mpi, or only without it. */
static void kolorun_check_mpi_flags(const kolorun_opts_t *o)
{
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
}

/* The network flags, as NCCL's variables for every rank: horovodrun --tcp
 * keeps NCCL off InfiniBand (and, under --mpi, Open MPI on TCP, see
 * kolorun_exec_mpirun; Gloo is TCP already), and NCCL gets every
 * interface of --network-interfaces. */
static void kolorun_network_settings(kolorun_opts_t *o)
{
    if (o->tcp)
        kolorun_setting_put(o, "NCCL_IB_DISABLE", NULL, kolorun_strdupf("1"));
    if (o->nics)
        kolorun_setting_put(o, "NCCL_SOCKET_IFNAME", NULL,
                            kolorun_strdupf("%s", o->nics));
}

/* Parses the options; exits 0 after --help, 2 on a wrong command line. */
void kolorun_parse(int argc, char **argv, kolorun_opts_t *o)
{
    kolorun_cmdline_t c;
    memset(&c, 0, sizeof c);
    c.argc = argc;
    c.argv = argv;
    c.opts.failure_grace_ms = 5000;
    c.opts.reset_limit = -1;
    c.opts.tag_output = 1; /* horovodrun's prefix, unless --no-tag-output */
    kolorun_read_flags(&c);
    if (c.config_file)
        kolorun_config_file(&c.opts, c.config_file, c.given,
                            c.opts.gloo || c.opts.mpi);
    if (c.check_build)
        kolorun_check_build();
    kolorun_size_job(&c);
    kolorun_check_rendezvous(&c.opts);
    if (c.i >= argc) {
        kolorun_say("no command to run (see kolorun --help)");
        exit(2);
    }
    c.opts.argv = argv + c.i;
    kolorun_check_launcher(&c.opts);
    kolorun_gloo_backends(&c.opts);
    kolorun_check_mpi_flags(&c.opts);
    kolorun_network_settings(&c.opts);
    *o = c.opts;
}
