/*
 * cmdline.h — the command line, the top layer's input: argv, horovodrun's
 * flags, the config file and host lists become the job description
 * (kolorun_opts_t), which every layer above reads and none writes.
 *   options.c      the command line: the one table of kolorun's flags
 *                  (kolorun_options), which drives kolorun_parse, --help
 *                  and the suggestion for a mistyped flag; the top of
 *                  this layer, calling the files below
 *   config_file.c  --config-file: horovodrun's YAML, applied as its flags
 *   flags.c        horovodrun's tuning flags: their values become the
 *                  ranks' settings
 *   hosts.c        -H, --hostfile: hosts, slots, placing the ranks
 *   check_build.c  --check-build (prints and exits)
 */
#ifndef KOLORUN_CMDLINE_H
#define KOLORUN_CMDLINE_H

#include "util.h"

/* The most ranks -np (and the hosts' slots) may ask for. */
#define KOLORUN_MAX_RANKS 4096

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
    const char *redis_password; /* --redis-password PW (else KOLO_REDIS_PASSWORD) */
    const char *redis_user;     /* --redis-user USER (else KOLO_REDIS_USER) */
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

/* What one of horovodrun's tuning flags takes, and what kolorun does with
 * it (flags.c, kolorun_knob_apply). */
enum kolorun_kind {
    KR_NONE,     /* not a tuning flag: the row's store does all there is */
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

/* How a flag bears on an elastic job (--min-np, --host-discovery-script). */
enum kolorun_elastic_role {
    KR_ANY_JOB,
    KR_MAKES_ELASTIC, /* giving it makes the job elastic */
    KR_ELASTIC_ONLY,  /* it only goes with an elastic job */
};

/* One spelling of a flag. */
typedef struct kolorun_spelling {
    const char *name;
    unsigned how; /* KR_OFF, KR_HIDDEN, or both */
} kolorun_spelling_t;
#define KR_OFF 1u    /* turns a switch off (--no-autotune) */
#define KR_HIDDEN 2u /* accepted, not shown by --help (horovodrun's other
                      * spellings, and the off forms it does not show) */
#define KR_SPELLINGS 4

/* kolorun_parse's state (options.c): the job description being filled,
 * what is read once the whole line is known, and the cursor in argv. */
typedef struct kolorun_cmdline kolorun_cmdline_t;
typedef struct kolorun_option kolorun_option_t;

/* What giving a flag does: most check the value and store it at the
 * row's field; a wrong value ends kolorun with status 2 (1: out of
 * memory). `flag` is the spelling given; `value` is NULL for a switch
 * turned on, "0" for one turned off. */
typedef void kolorun_store_fn(kolorun_cmdline_t *c,
                              const kolorun_option_t *opt, const char *flag,
                              const char *value);

/* A row of kolorun_options, the one table of kolorun's flags: it drives
 * the parsing, --help and the "did you mean" of a mistyped flag, and
 * --config-file finds horovodrun's YAML keys in it. A row is a flag, or
 * (text) a paragraph of --help, which shows the table in its order. */
struct kolorun_option {
    kolorun_spelling_t names[KR_SPELLINGS]; /* the first: its name */
    const char *arg;        /* --help's word for its value; NULL: a switch */
    const char *help;       /* --help's lines ('\n' between), after var's
                             * name for a tuning flag; NULL: not shown */
    kolorun_store_fn *store; /* NULL for a tuning flag: flags.c's kind */
    size_t field;           /* where store puts it (in kolorun_cmdline_t) */
    long lo, hi;            /* a number's range */
    const char *expects;    /* a wrong value's message: "wants <expects>";
                             * NULL: "a whole number from <lo> to <hi>" */
    enum kolorun_elastic_role elastic;
    const char *text;       /* a paragraph of --help, not a flag */
    int refused_list;       /* the paragraph goes on with the refused flags */
    /* horovodrun's tuning flags (kind != KR_NONE), for flags.c: */
    enum kolorun_kind kind;
    const char *yaml;     /* "section.key" in --config-file, or NULL */
    int yaml_inverted;    /* YAML true means off (stall_check.enabled) */
    const char *var;      /* the ranks' variable */
    const char *twin;     /* the HOROVOD_* variable it supersedes */
    const char *why;      /* refused: why, and what to use instead */
};

/* kolorun's flags and --help's paragraphs, KOLORUN_NOPTIONS rows
 * (options.c checks the count). */
#define KOLORUN_NOPTIONS 74
extern const kolorun_option_t kolorun_options[];

/* The placeholders of a --launch-command template, four of them (hosts.c
 * checks them, spawn.c replaces them). */
extern const char *const kolorun_placeholders[];

/* ---- options.c */
void kolorun_parse(int argc, char **argv, kolorun_opts_t *o);

/* ---- config_file.c */
/* given[i]: the command line gave kolorun_options[i] (it wins over the
 * file); controller_given: --gloo or --mpi. */
void kolorun_config_file(kolorun_opts_t *o, const char *path,
                         const int *given, int controller_given);

/* ---- flags.c */
__attribute__((noreturn)) void kolorun_refuse(const char *what,
                                              const char *why);
void kolorun_setting_put(kolorun_opts_t *o, const char *var,
                         const char *twin, char *value);
void kolorun_knob_apply(kolorun_opts_t *o, const kolorun_option_t *k,
                        const char *v, const char *what);
void kolorun_settings_apply(const kolorun_opts_t *o);
int kolorun_passed_on(const kolorun_opts_t *o, const char *entry);

/* ---- hosts.c */
void kolorun_parse_hosts(kolorun_opts_t *o, const char *list);
void kolorun_parse_hostfile(kolorun_opts_t *o, const char *path);
void kolorun_place(kolorun_opts_t *o);
void kolorun_check_template(const char *t);
int kolorun_host_is_local(const char *name);
int kolorun_host_name_ok(const char *name);

/* ---- check_build.c */
__attribute__((noreturn)) void kolorun_check_build(void);

#endif /* KOLORUN_CMDLINE_H */
