/*
 * mpi.c — --mpi: the job runs under mpirun. kolorun replaces itself with
 * mpirun, handing horovodrun's flags over as horovodrun does.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "procs.h"

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

/* Adds words (strdup'd) up to a NULL to av. */
static void kolorun_add_words(kolorun_words_t *av, const char *word, ...)
{
    va_list ap;
    va_start(ap, word);
    for (; word; word = va_arg(ap, const char *))
        kolorun_words_add(av, strdup(word));
    va_end(ap);
}

/* The environment mpirun hands on: not kolorun's places (MPI gives the
 * ranks theirs), but what kolorun's flags set. 0, or -1 (said why). */
static int kolorun_mpirun_env(const kolorun_opts_t *o, int64_t job_start_us)
{
    static const char *const placement[] = {
        "KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
        "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE"};
    char start_us[32];
    for (size_t j = 0; j < sizeof placement / sizeof placement[0]; j++)
        unsetenv(placement[j]);
    snprintf(start_us, sizeof start_us, "%lld", (long long)job_start_us);
    if ((o->start_timeout &&
         setenv("KOLO_START_TIMEOUT", o->start_timeout, 1) != 0) ||
        (o->network_interface &&
         setenv("KOLO_NETWORK_INTERFACE", o->network_interface, 1) != 0) ||
        setenv("KOLO_JOB_START_US", start_us, 1) != 0) {
        kolorun_say("out of memory");
        return -1;
    }
    return 0;
}

/* mpirun's own flags: root, oversubscription, binding, -np, and the
 * output flags horovodrun hands over to mpirun's. */
static void kolorun_mpirun_flags(const kolorun_opts_t *o, kolorun_words_t *av)
{
    char np[16];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(np, sizeof np, "%d", o->np);
    if (geteuid() == 0)
        kolorun_add_words(av, "--allow-run-as-root", NULL);
    if (cpus > 0 && o->np > cpus)
        kolorun_add_words(av, "--oversubscribe", NULL);
    if (o->binding_args)
        kolorun_split_words(o->binding_args, av);
    else
        kolorun_add_words(av, "--bind-to", "none", NULL);
    kolorun_add_words(av, "-np", np, NULL);
    if (o->tag_output)
        kolorun_add_words(av, "--tag-output", NULL);
    if (o->timestamp)
        kolorun_add_words(av, "--timestamp-output", NULL);
    if (o->output_dir)
        kolorun_add_words(av, "--output-filename", o->output_dir, NULL);
}

/* Open MPI's parameters for --tcp, --network-interfaces and ssh. */
static void kolorun_mpirun_mca(const kolorun_opts_t *o, kolorun_words_t *av)
{
    if (o->tcp)
        kolorun_add_words(av, "--mca", "pml", "ob1", "--mca", "btl", "^openib",
                          NULL);
    if (o->nics)
        kolorun_add_words(av, "--mca", "btl_tcp_if_include", o->nics, NULL);
    if (o->ssh_port || o->ssh_identity) {
        kolorun_add_words(av, "--mca", "plm_rsh_args", NULL);
        kolorun_words_add(av, kolorun_strdupf(
            "%s%s%s%s%s", o->ssh_port ? "-p " : "", o->ssh_port ? o->ssh_port : "",
            o->ssh_port && o->ssh_identity ? " " : "",
            o->ssh_identity ? "-i " : "", o->ssh_identity ? o->ssh_identity : ""));
    }
}

/* Every variable kolorun passes on, with -x; then --mpi-args, then the
 * command. */
static void kolorun_mpirun_tail(const kolorun_opts_t *o, kolorun_words_t *av)
{
    extern char **environ;
    for (char **e = environ; *e; e++) {
        if (!kolorun_passed_on(o, *e))
            continue;
        kolorun_add_words(av, "-x", NULL);
        kolorun_words_add(av, kolorun_strdupf("%.*s", (int)strcspn(*e, "="), *e));
    }
    if (o->mpi_args)
        kolorun_split_words(o->mpi_args, av);
    for (char **a = o->argv; *a; a++)
        kolorun_words_add(av, strdup(*a));
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
int kolorun_exec_mpirun(const kolorun_opts_t *o, int64_t job_start_us)
{
    const char *mpirun = getenv("KOLO_MPIRUN");
    kolorun_words_t av = {0};

    if (mpirun == NULL || *mpirun == '\0')
        mpirun = "mpirun";
    if (kolorun_mpirun_env(o, job_start_us) != 0)
        return 1;
    kolorun_add_words(&av, mpirun, NULL);
    kolorun_mpirun_flags(o, &av);
    kolorun_mpirun_mca(o, &av);
    kolorun_mpirun_tail(o, &av);
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
