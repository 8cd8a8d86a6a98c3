/*
 * flags.c — horovodrun's flags
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
 *
 * This file holds the table of those flags (kolorun_knobs), how a flag's
 * value becomes a setting, and how the settings reach the ranks.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cmdline.h"

#define KR_BAYES                                                          \
    "kolo's autotune is a coordinate search, not Bayesian optimisation, " \
    "and has no such knob; --autotune-steps-per-sample sets the rounds "  \
    "it measures per window"

const kolorun_knob_t kolorun_knobs[] = {
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
};
_Static_assert(sizeof kolorun_knobs / sizeof kolorun_knobs[0] == KOLORUN_NKNOBS,
               "KOLORUN_NKNOBS in kolorun.h counts kolorun_knobs");

/* Says that `what` (a flag, or FILE:LINE: key) cannot be honoured, and
 * exits 2. */
__attribute__((noreturn)) void kolorun_refuse(const char *what,
                                              const char *why)
{
    kolorun_say("%s: kolo cannot honour it: %s", what, why);
    exit(2);
}

/* Records the value a knob gives the ranks (replacing an earlier one). */
void kolorun_setting_put(kolorun_opts_t *o, const char *var,
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
void kolorun_knob_apply(kolorun_opts_t *o, const kolorun_knob_t *k,
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
int kolorun_knob_match(int argc, char **argv, int *i, const char *arg,
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

/* Gives every rank the settings of horovodrun's flags: in kolorun's own
 * environment, which the ranks here inherit, the command line of ranks on
 * other hosts carries (kolorun_remote_command) and mpirun passes on (-x).
 * A flag's KOLO_* variable wins over its HOROVOD_* twin in the runtime
 * anyway; removing the twin spares the ranks the warning that the two
 * differ, as horovodrun overwrites it. */
void kolorun_settings_apply(const kolorun_opts_t *o)
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
int kolorun_passed_on(const kolorun_opts_t *o, const char *entry)
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
