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
    if (kolorun_pending[SIGUSR1]) {
        kolorun_pending[SIGUSR1] = 0;
        kolorun_flight_on_usr1(k);
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

/* A rank failed, a stop is under way, or the job is over: what the time
 * asks for now. *dump_until: while the ranks' dumps are awaited before a
 * stop, when to look again. */
static void kolorun_act_on_deadlines(kolorun_t *k, int64_t now,
                                     int64_t *dump_until)
{
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
    /* The dumps are written, or their time is over: stop the ranks. */
    if (k->dumping &&
        (k->killed || !kolorun_flight_waiting(k, now, dump_until)))
        kolorun_stop_send(k);
    /* Grace is over: kill the rest, ranks or what they left. */
    if (k->stopping && !k->dumping && !k->killed &&
        now - k->stop_ms >= KOLORUN_GRACE_MS)
        kolorun_kill_now(k);
}

/* Whether the loop is over: no rank is running (and the policy, if any,
 * agrees) and their pipes are closed, or some stay open past the drain
 * deadline. *drain_until: that deadline while the loop waits for them. */
static int kolorun_job_over(kolorun_t *k, int64_t now, int64_t *drain_until)
{
    int open = kolorun_streams_open(k);
    /* An elastic job may have no worker running for a while (waiting
     * for hosts, between generations): it ends when its driver says. */
    if (k->nalive != 0 || (k->policy && !k->policy->done(k)))
        return 0;
    if (open == 0)
        return 1;
    if (k->all_reaped_ms == 0)
        k->all_reaped_ms = now;
    *drain_until = kolorun_drain_deadline(k);
    if (*drain_until >= 0 && now >= *drain_until) {
        kolorun_say("warning: every rank has exited, but something "
                    "they started keeps %d output pipe%s open; not "
                    "waiting for it",
                    open, open == 1 ? "" : "s");
        return 1;
    }
    return 0;
}

/* What one poll() waits on: the self-pipe first, then every open pipe
 * of the ranks, then the policy's descriptor. */
typedef struct kolorun_pollset {
    struct pollfd *pfd;
    int *who; /* r * 2 + stream; -1 the self-pipe, -2 the policy's, -3
               * the flight recorder's directory */
    int n, cap;
} kolorun_pollset_t;

static void kolorun_pollset_add(kolorun_pollset_t *ps, int fd, int who)
{
    ps->pfd[ps->n].fd = fd;
    ps->pfd[ps->n].events = POLLIN;
    ps->who[ps->n++] = who;
}

/* Fills the set for this turn, with room for the ranks started since the
 * last; 0, or -1 when memory is short (said). */
static int kolorun_pollset_fill(kolorun_t *k, kolorun_pollset_t *ps,
                                int wake_rd)
{
    if (ps->cap < 3 + 2 * k->nstarted) {
        int ncap = 3 + 2 * k->nstarted + 32;
        struct pollfd *p = realloc(ps->pfd, (size_t)ncap * sizeof *p);
        if (p)
            ps->pfd = p;
        int *w = realloc(ps->who, (size_t)ncap * sizeof *w);
        if (w)
            ps->who = w;
        if (!p || !w) {
            kolorun_say("out of memory");
            return -1;
        }
        ps->cap = ncap;
    }
    ps->n = 0;
    kolorun_pollset_add(ps, wake_rd, -1);
    for (int r = 0; r < k->nstarted; r++)
        for (int s = 0; s < 2; s++)
            if (k->ranks[r].streams[s].fd >= 0)
                kolorun_pollset_add(ps, k->ranks[r].streams[s].fd, r * 2 + s);
    if (k->policy && k->policy->fd(k) >= 0)
        kolorun_pollset_add(ps, k->policy->fd(k), -2);
    if (kolorun_flight_fd(k) >= 0)
        kolorun_pollset_add(ps, kolorun_flight_fd(k), -3);
    return 0;
}

/* How long poll() may sleep: until the next deadline of a failure, a stop
 * (the ranks' dumps first), the drain or the policy; -1 when none is due. */
static int kolorun_poll_timeout(const kolorun_t *k, int64_t now,
                                int64_t drain_until, int64_t policy_at,
                                int64_t dump_until)
{
    int64_t deadline = -1;
    if (k->dumping && !k->killed)
        deadline = dump_until;
    else if (k->stopping && !k->killed)
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
    if (deadline < 0)
        return -1;
    return deadline > now ? (int)(deadline - now) : 0;
}

/* After poll(): reads what is ready, and empties the self-pipe. */
static void kolorun_poll_dispatch(kolorun_t *k, const kolorun_pollset_t *ps,
                                  int ready, int wake_rd)
{
    for (int i = 1; i < ps->n && ready > 0; i++) {
        if (!ps->pfd[i].revents)
            continue;
        if (ps->who[i] == -2)
            k->policy->read(k);
        else if (ps->who[i] == -3)
            kolorun_flight_read(k);
        else
            kolorun_stream_read(k, ps->who[i] / 2, ps->who[i] % 2, 0);
    }
    if (ps->pfd[0].revents) {
        char junk[256];
        while (read(wake_rd, junk, sizeof junk) > 0)
            ;
    }
}

/* The job's one loop: each turn handles the signals, reaps, runs the
 * policy, acts on the deadlines, and sleeps in poll() until output, a
 * signal or the next deadline. 0 once the job is over, -1 if the loop
 * itself failed (said). */
int kolorun_loop(kolorun_t *k, int wake_rd)
{
    kolorun_pollset_t ps = {0};
    int rc = 0;

    for (;;) {
        /* Reaping here as well as on SIGCHLD costs one system call and
         * makes a lost wake-up harmless. */
        kolorun_handle_signals(k);
        kolorun_reap(k);
        /* The policy (an elastic job's driver): its decisions, and when it
         * next needs to run. */
        int64_t policy_at = k->policy ? k->policy->tick(k) : -1;
        int64_t now = kolorun_now_ms(), drain_until = -1, dump_until = now;
        kolorun_act_on_deadlines(k, now, &dump_until);
        if (kolorun_job_over(k, now, &drain_until))
            break;
        if (kolorun_pollset_fill(k, &ps, wake_rd) != 0) {
            rc = -1;
            break;
        }
        int timeout = kolorun_poll_timeout(k, now, drain_until, policy_at,
                                           dump_until);
        int ready = poll(ps.pfd, (nfds_t)ps.n, timeout);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0) {
            kolorun_say("poll: %s", strerror(errno));
            rc = -1;
            break;
        }
        kolorun_poll_dispatch(k, &ps, ready, wake_rd);
    }
    free(ps.pfd);
    free(ps.who);
    return rc;
}
