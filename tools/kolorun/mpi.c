/*
 * mpi.c — --mpi: the job runs under mpirun. kolorun replaces itself with
 * mpirun, handing horovodrun's flags over as horovodrun does.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
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
