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
 * The flags themselves (their spellings, YAML keys, variables and kinds)
 * are rows of options.c's table of every flag, kolorun_options. This file
 * holds what each kind of flag does with its value (kolorun_knob_apply),
 * and how the settings reach the ranks.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cmdline.h"

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
void kolorun_knob_apply(kolorun_opts_t *o, const kolorun_option_t *k,
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
    case KR_NONE:
    case KR_NOOP:
        return;
    }
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
