/*
 * main.c — kolorun's main, the top layer (kolorun.h): the job from start
 * to end (the job description, its tables, signals, rendezvous, the
 * holder, the ranks or the elastic driver, the loop, the cleanup) and the
 * exit status it ends with (see "Ending" in kolorun.h).
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kolorun.h"

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

/* The exit status, from how the job ended (see "Ending" in kolorun.h). */
static int kolorun_exit_status(const kolorun_t *k)
{
    if (k->launch_error)
        return k->launch_error;
    if (k->stop_signal)
        return 128 + k->stop_signal;
    if (kolorun_elastic_status(k) >= 0)
        return kolorun_elastic_status(k);
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

/* The job's secret (runtime/auth.c): drawn here, from the system's random
 * source, unless KOLO_SECRET is set already (the user's, to share with
 * ranks kolorun does not start). It goes into kolorun's own environment,
 * which every rank started here inherits (and mpirun's -x KOLO_SECRET
 * carries by name); ranks on other hosts read it from their stdin, never
 * from a command line (spawn.c). 0, or 1 when no random bytes came. */
static int kolorun_job_secret(void)
{
    const char *set = getenv("KOLO_SECRET");
    unsigned char raw[32];
    char hex[2 * sizeof raw + 1];
    size_t have = 0;

    if (set != NULL && set[0] != '\0')
        return 0;
    while (have < sizeof raw) {
        ssize_t n = getrandom(raw + have, sizeof raw - have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            kolorun_say("cannot draw the job's secret: getrandom: %s",
                        strerror(errno));
            return 1;
        }
        have += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    memset(raw, 0, sizeof raw);
    if (setenv("KOLO_SECRET", hex, 1) != 0) {
        kolorun_say("out of memory");
        return 1;
    }
    memset(hex, 0, sizeof hex);
    return 0;
}

/* Now on the wall clock, in microseconds: the job's start, time zero of
 * every rank's timeline (KOLO_JOB_START_US). */
static int64_t kolorun_wall_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000000 + now.tv_nsec / 1000;
}

/* Starts the ranks, or the elastic driver, which starts its workers from
 * the loop once its hosts are known. A signal that comes while ranks
 * start is handled once all are started (or the start failed), in the
 * loop; a failed start stops the job. */
static void kolorun_start_ranks(kolorun_t *k)
{
    if (k->opts.elastic && kolorun_elastic_start(k) != 0) {
        k->launch_error = 1;
        kolorun_stop(k, SIGTERM);
    }
    for (int r = 0; !k->opts.elastic && r < k->opts.np; r++) {
        int failed = kolorun_rank_start(k, r, NULL);
        if (failed) {
            k->launch_error = failed;
            kolorun_stop(k, SIGTERM);
            break;
        }
    }
}

/* Watches the job to its end, and returns its exit status. */
static int kolorun_watch(kolorun_t *k, int wake_rd)
{
    if (kolorun_loop(k, wake_rd) != 0) {
        /* Cannot watch the ranks any more: do not leave them behind. */
        k->launch_error = 1;
        kolorun_signal_ranks(k, SIGKILL);
        while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
            ;
        k->holder_reaped = 1;
    }
    /* A stopped job leaves nothing behind: whatever the ranks started and
     * is still in their group (it ignored the signal, or closed its output
     * so kolorun did not wait for it) goes now. */
    if (k->stopping)
        kolorun_kill_now(k);
    kolorun_end_holder(k);
    for (int s = 0; s < 2; s++)
        kolorun_sink_flush(&k->sinks[s]);
    return kolorun_exit_status(k);
}

/* The job kolorun starts itself, from its tables to their cleanup: the
 * output files, signals, hosts and Redis, the rendezvous, the holder,
 * then the ranks. Returns the exit status. */
static int kolorun_run(kolorun_t *k)
{
    int rc = 1;
    int wake_rd = -1;
    if (kolorun_job_alloc(k) != 0) {
        kolorun_say("out of memory");
        goto free_memory;
    }
    if (k->opts.output_dir && kolorun_outputs_open(k) != 0)
        goto free_memory;
    wake_rd = kolorun_signals_setup(k);
    if (wake_rd < 0)
        goto free_memory;
    if (kolorun_hosts_setup(k) != 0)
        goto stop_redis;
    if (!k->redis_addr[0] && kolorun_rdv_create(k) != 0)
        goto stop_redis;
    if (k->opts.verbose && k->rdv_dir)
        kolorun_say("rendezvous directory %s", k->rdv_dir);
    else if (k->opts.verbose)
        kolorun_say("rendezvous redis:%s/%s", k->redis_addr, k->job_id);
    kolorun_flight_setup(k, 0);
    if (kolorun_spawn_holder(k, wake_rd) != 0)
        goto remove_rdv;
    kolorun_start_ranks(k);
    rc = kolorun_watch(k, wake_rd);

remove_rdv:
    kolorun_flight_end(k, rc);
    kolorun_rdv_remove(k);
    if (k->redis_addr[0] && k->nstarted > 0 && !k->redis_reaped &&
        !k->opts.elastic &&
        (k->failed_rank >= 0 || k->launch_error))
        kolorun_redis_missing(k);
    if (k->opts.redis && k->nstarted > 0)
        kolorun_redis_clean(k);
stop_redis:
    kolorun_redis_stop(k);

free_memory:
    kolorun_elastic_free(k);
    kolorun_job_free(k);
    return rc;
}

int main(int argc, char **argv)
{
    kolorun_t k;
    int rc;
    memset(&k, 0, sizeof k);
    k.failed_rank = -1;
    k.accused_rank = -1;
    k.job_start_us = kolorun_wall_us();
    kolorun_std_fds();
    kolorun_parse(argc, argv, &k.opts);
    kolorun_settings_apply(&k.opts);
    if (kolorun_job_secret() != 0)
        return 1;
    if (k.opts.mpi) {
        kolorun_flight_setup(&k, 1);
        return kolorun_exec_mpirun(&k.opts, k.job_start_us);
    }
    kolorun_raise_fd_limit(k.opts.elastic ? (k.opts.max_np < 1024
                                                 ? k.opts.max_np : 1024)
                                          : k.opts.np,
                           k.opts.output_dir != NULL);
    rc = kolorun_run(&k);
    if (k.stop_signal)
        kolorun_raise_default(k.stop_signal);
    return rc;
}
