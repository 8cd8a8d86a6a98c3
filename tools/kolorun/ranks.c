/*
 * ranks.c — ranks starting and ending: reaping them, saying how one ended,
 * choosing which of the failed ranks caused the failure (see "Ending" in
 * kolorun.h), or telling the policy (the elastic driver) that a rank
 * ended; starting and stopping one rank when the policy asks.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>

#include "supervise.h"

/* Says how rank r ended: "rank 1 (pid 42) exited with status 3", with its
 * host on a job of several hosts (for a rank on another host the pid is the
 * launch command's, which stands for it), then hint. */
static void kolorun_rank_line(const kolorun_t *k, int r, const char *hint,
                              char *out, size_t n)
{
    const kolorun_rank_t *rk = &k->ranks[r];
    const kolorun_host_t *h = kolorun_host_of(k, r);
    char how[128], where[400] = "";
    kolorun_describe(rk->status, how, sizeof how);
    if (h)
        snprintf(where, sizeof where, " on host %s", h->name);
    snprintf(out, n, "rank %d%s (pid %ld) %s%s", r, where, (long)rk->pid, how,
             hint);
}

static void kolorun_rank_say(const kolorun_t *k, int r, const char *hint)
{
    char line[800];
    kolorun_rank_line(k, r, hint, line, sizeof line);
    kolorun_say("%s", line);
}

/* How likely rank r, one of the failed, is the cause: killed by a signal
 * beats named by a survivor beats exited with an error of its own. */
static int kolorun_blame_weight(const kolorun_rank_t *rk)
{
    if (WIFSIGNALED(rk->status))
        return 2;
    return rk->named_lost ? 1 : 0;
}

/* The failed rank most likely the cause, and its weight (-1: none). */
static int kolorun_best_suspect(const kolorun_t *k, int *weight)
{
    int cause = -1, best = -1, first = 0;
    for (int r = 0; r < k->nstarted; r++) {
        const kolorun_rank_t *rk = &k->ranks[r];
        if (!rk->failed_seq)
            continue;
        int w = kolorun_blame_weight(rk);
        if (w > best || (w == best && rk->failed_seq < first)) {
            cause = r;
            best = w;
            first = rk->failed_seq;
        }
    }
    *weight = best;
    return cause;
}

/* A rank the survivors name as the cause that is still running, or -1. */
static int kolorun_named_running(const kolorun_t *k)
{
    for (int r = 0; r < k->nstarted; r++)
        if (k->ranks[r].named_lost && !k->ranks[r].reaped && k->ranks[r].pid > 0)
            return r;
    return -1;
}

int kolorun_blame_waits(const kolorun_t *k, int64_t now)
{
    int weight;
    if (k->failed_rank >= 0 || k->nsuspects == 0 || k->stopping ||
        now - k->failed_ms >= k->opts.failure_grace_ms)
        return 0;
    kolorun_best_suspect(k, &weight);
    return weight <= 0 && kolorun_named_running(k) >= 0;
}

/* --verbose: the failed ranks that are not the cause. */
static void kolorun_say_not_causes(const kolorun_t *k, int cause)
{
    if (k->opts.verbose)
        for (int r = 0; r < k->nstarted; r++)
            if (r != cause && k->ranks[r].failed_seq)
                kolorun_rank_say(k, r, " (not the cause)");
}

/* The rank the runtime's messages accuse (a stall shutdown, a deadlock,
 * output.c) is the cause: "rank 2 stalled the job: it never enqueued 'x'
 * (the others waited 61 s); rank 2 (pid 42) exited with status 1", or
 * "... is still running" (running: it has not ended); into out. */
static void kolorun_accused_line(const kolorun_t *k, int r, int running,
                                 char *out, size_t n)
{
    const kolorun_host_t *h = kolorun_host_of(k, r);
    char how[128], where[400] = "";
    if (h)
        snprintf(where, sizeof where, " on host %s", h->name);
    if (running)
        snprintf(how, sizeof how, "is still running");
    else
        kolorun_describe(k->ranks[r].status, how, sizeof how);
    snprintf(out, n, "rank %d %s; rank %d%s (pid %ld) %s", r, k->accused_why,
             r, where, (long)k->ranks[r].pid, how);
}

/* The usual line: how the cause ended ("rank 1 (pid 42) exited with
 * status 3"), with what it means for a rank on another host; into out. */
static void kolorun_cause_line(const kolorun_t *k, int cause, char *out,
                               size_t n)
{
    const kolorun_host_t *h = kolorun_host_of(k, cause);
    int status = k->ranks[cause].status;
    const char *hint = "";
    if (h && !h->local && WIFEXITED(status)) {
        if (WEXITSTATUS(status) == 255 && !k->opts.launch_command)
            hint = ": ssh could not reach the host, log in without a "
                   "password (BatchMode), or lost the connection";
        else if (WEXITSTATUS(status) == 127)
            hint = ": the command (or the launch command) was not found "
                   "there";
        else if (WEXITSTATUS(status) == 126)
            hint = ": the command cannot be executed there";
    }
    kolorun_rank_line(k, cause, hint, out, n);
}

/* Chooses the cause among the ranks that have failed so far (see "Ending"
 * in kolorun.h) and prints the one line everyone reads. The other ranks
 * are stopped after the failure grace, by the loop: the runtime tells each
 * of them which rank it lost, and a program that reports that and exits
 * should be heard, not killed mid-sentence. */
void kolorun_blame(kolorun_t *k)
{
    int best, cause = kolorun_best_suspect(k, &best), running;
    char *line = k->cause_line;
    size_t n = sizeof k->cause_line;
    if (cause < 0)
        return;
    if (best <= 0 && (running = kolorun_named_running(k)) >= 0) {
        /* The others name a rank that stopped taking part but has not
         * ended (it caught the error and went on, or is stuck): it is the
         * cause, and the job's status is a failure of its own. */
        if (running == k->accused_rank)
            kolorun_accused_line(k, running, 1, line, n);
        else
            snprintf(line, n, "rank %d (pid %ld) stopped taking part in the "
                     "job (the other ranks name it) and is still running",
                     running, (long)k->ranks[running].pid);
        k->failed_rank = running;
        k->failed_status = 1 << 8; /* as exit(1) */
        kolorun_say("%s", line);
        kolorun_say_not_causes(k, -1);
        return;
    }
    k->failed_rank = cause;
    k->failed_status = k->ranks[cause].status;
    if (best == 1 && cause == k->accused_rank)
        kolorun_accused_line(k, cause, 0, line, n);
    else if (best <= 0 && k->verdict[0])
        /* No rank caused it: they disagree, or went different ways. (The
         * status is the first failed rank's.) */
        snprintf(line, n, "%s", k->verdict);
    else
        kolorun_cause_line(k, cause, line, n);
    kolorun_say("%s", line);
    kolorun_say_not_causes(k, cause);
}


static void kolorun_rank_ended(kolorun_t *k, int r, int status)
{
    kolorun_rank_t *rk = &k->ranks[r];
    rk->reaped = 1;
    rk->status = status;
    k->nalive--;
    kolorun_release_remote(k, r);

    kolorun_stream_read(k, r, KOLORUN_OUT, 1);
    kolorun_stream_read(k, r, KOLORUN_ERR, 1);

    if (k->policy) { /* the policy says what an end means */
        k->policy->ended(k, r, status);
        return;
    }
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !k->stopping && k->failed_rank < 0) {
        /* A failure: the cause is chosen by kolorun_blame, now if nothing
         * can outrank this one, else once the others had their moment. */
        rk->failed_seq = ++k->nsuspects;
        if (rk->failed_seq == 1)
            k->failed_ms = kolorun_now_ms();
        if (WIFSIGNALED(status))
            kolorun_blame(k);
    } else if (k->opts.verbose) {
        kolorun_rank_say(k, r, k->stopping && !ok ? " (stopped by kolorun)"
                                                  : "");
    }
}

void kolorun_reap(kolorun_t *k)
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
        if (k->policy && k->policy->reaped(k, pid, status))
            continue;
        if (pid == k->redis_pid) {
            k->redis_reaped = 1;
            if (!k->stopping)
                kolorun_say("warning: the redis-server kolorun started "
                            "(pid %ld) has %s during the job",
                            (long)pid, WIFSIGNALED(status) ? "been killed"
                                                           : "exited");
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

int kolorun_rank_start(kolorun_t *k, int r, const kolorun_place_t *place)
{
    return kolorun_spawn(k, r, place);
}

void kolorun_rank_stop(kolorun_t *k, int r, int sig)
{
    if (r >= k->nstarted || k->ranks[r].reaped)
        return;
    kolorun_release_remote(k, r);
    kill(k->ranks[r].pid, sig);
}
