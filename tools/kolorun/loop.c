/*
 * loop.c — the loop: one poll() over the ranks' pipes and the self-pipe of
 * the signal handler. Each turn handles the signals that came, reaps,
 * names the cause of a failure, stops the job when its deadlines pass, and
 * carries output, until every rank is gone and its pipes are closed.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervise.h"

/* After SIGKILL, how long the pipes get to close (the kernel needs moments;
 * longer means a process outside the group, a daemon, holds them). */
#define KOLORUN_SETTLE_MS 1000
/* After a rank exits non-zero, how long kolorun waits for a rank killed by
 * a signal (the likelier cause) before naming the cause: a killed process
 * becomes a zombie only once the kernel has torn it down, which may come
 * after its peers saw its sockets close and gave up. */
#define KOLORUN_BLAME_MS 500

static int kolorun_streams_open(const kolorun_t *k)
{
    int n = 0;
    for (int r = 0; r < k->nstarted; r++)
        for (int s = 0; s < 2; s++)
            n += k->ranks[r].streams[s].fd >= 0;
    return n;
}

static void kolorun_handle_signals(kolorun_t *k)
{
    if (kolorun_pending[SIGCHLD]) {
        kolorun_pending[SIGCHLD] = 0;
        kolorun_reap(k);
    }
    if (kolorun_pending[SIGTSTP]) {
        kolorun_pending[SIGTSTP] = 0;
        kolorun_suspend(k);
    }
    for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++) {
        int sig = kolorun_stop_signals[i];
        if (kolorun_pending[sig]) {
            kolorun_pending[sig] = 0;
            kolorun_on_stop_signal(k, sig);
        }
    }
}

/* Every rank is reaped, yet some of their pipes are open: something they
 * started holds them. How long to keep reading (-1: no limit yet). */
static int64_t kolorun_drain_deadline(const kolorun_t *k)
{
    /* A stopped job: its SIGKILL, due at the end of the grace period,
     * ends what holds them; wait for that, then briefly. */
    if (k->stopping)
        return k->killed ? k->killed_ms + KOLORUN_SETTLE_MS : -1;
    /* A finished job: give the stragglers the grace period to finish their
     * output, but do not wait for a background process forever. */
    return k->all_reaped_ms + KOLORUN_GRACE_MS;
}

int kolorun_loop(kolorun_t *k, int wake_rd)
{
    int cap = 0;
    struct pollfd *pfd = NULL;
    int *who = NULL; /* r * 2 + stream; -1 the self-pipe, -2 the policy's */

    for (;;) {
        /* Reaping here as well as on SIGCHLD costs one system call and
         * makes a lost wake-up harmless. */
        kolorun_handle_signals(k);
        kolorun_reap(k);
        /* The policy (an elastic job's driver): its decisions, and when it
         * next needs to run. */
        int64_t policy_at = k->policy ? k->policy->tick(k) : -1;

        int64_t now = kolorun_now_ms();
        /* A rank failed a moment ago, or every rank has ended: nothing
         * more is coming that could be the cause. */
        if (k->failed_rank < 0 && k->nsuspects > 0 &&
            (k->nalive == 0 || now - k->failed_ms >= KOLORUN_BLAME_MS) &&
            !kolorun_blame_waits(k, now))
            kolorun_blame(k);
        /* The failure grace is over: stop the others. */
        if (k->failed_rank >= 0 && !k->stopping &&
            now - k->failed_ms >= k->opts.failure_grace_ms)
            kolorun_stop(k, SIGTERM);
        /* Grace is over: kill the rest, ranks or what they left. */
        if (k->stopping && !k->killed && now - k->stop_ms >= KOLORUN_GRACE_MS)
            kolorun_kill_now(k);

        int open = kolorun_streams_open(k);
        int64_t drain_until = -1;
        /* An elastic job may have no worker running for a while (waiting
         * for hosts, between generations): it ends when its driver says. */
        if (k->nalive == 0 && (!k->policy || k->policy->done(k))) {
            if (open == 0)
                break;
            if (k->all_reaped_ms == 0)
                k->all_reaped_ms = now;
            drain_until = kolorun_drain_deadline(k);
            if (drain_until >= 0 && now >= drain_until) {
                kolorun_say("warning: every rank has exited, but something "
                            "they started keeps %d output pipe%s open; not "
                            "waiting for it",
                            open, open == 1 ? "" : "s");
                break;
            }
        }

        /* Ranks started since the last turn need room. */
        if (cap < 2 + 2 * k->nstarted) {
            int ncap = 2 + 2 * k->nstarted + 32;
            struct pollfd *p = realloc(pfd, (size_t)ncap * sizeof *pfd);
            if (p)
                pfd = p;
            int *w = realloc(who, (size_t)ncap * sizeof *who);
            if (w)
                who = w;
            if (!p || !w) {
                kolorun_say("out of memory");
                free(pfd);
                free(who);
                return -1;
            }
            cap = ncap;
        }
        int n = 0;
        pfd[n].fd = wake_rd;
        pfd[n].events = POLLIN;
        who[n++] = -1;
        for (int r = 0; r < k->nstarted; r++) {
            for (int s = 0; s < 2; s++) {
                if (k->ranks[r].streams[s].fd < 0)
                    continue;
                pfd[n].fd = k->ranks[r].streams[s].fd;
                pfd[n].events = POLLIN;
                who[n++] = r * 2 + s;
            }
        }
        if (k->policy && k->policy->fd(k) >= 0) {
            pfd[n].fd = k->policy->fd(k);
            pfd[n].events = POLLIN;
            who[n++] = -2;
        }

        /* Sleep until output, a signal, or the next deadline. */
        int64_t deadline = -1;
        if (k->stopping && !k->killed)
            deadline = k->stop_ms + KOLORUN_GRACE_MS;
        else if (k->failed_rank >= 0 && !k->stopping)
            deadline = k->failed_ms + k->opts.failure_grace_ms;
        else if (kolorun_blame_waits(k, now))
            deadline = k->failed_ms + k->opts.failure_grace_ms;
        else if (k->nsuspects > 0 && !k->stopping)
            deadline = k->failed_ms + KOLORUN_BLAME_MS;
        if (drain_until >= 0 && (deadline < 0 || drain_until < deadline))
            deadline = drain_until;
        if (policy_at >= 0 && (deadline < 0 || policy_at < deadline))
            deadline = policy_at;
        int timeout = -1;
        if (deadline >= 0)
            timeout = deadline > now ? (int)(deadline - now) : 0;

        int ready = poll(pfd, (nfds_t)n, timeout);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            kolorun_say("poll: %s", strerror(errno));
            free(pfd);
            free(who);
            return -1;
        }
        for (int i = 1; i < n && ready > 0; i++) {
            if (!pfd[i].revents)
                continue;
            if (who[i] == -2)
                k->policy->read(k);
            else
                kolorun_stream_read(k, who[i] / 2, who[i] % 2, 0);
        }
        if (pfd[0].revents) {
            char junk[256];
            while (read(wake_rd, junk, sizeof junk) > 0)
                ;
        }
    }
    free(pfd);
    free(who);
    return 0;
}
