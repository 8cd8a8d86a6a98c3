/*
 * watchdog.c — a rank that does not join says so while it happens.
 *
 * Every round of negotiation is a collective: a rank that is frozen
 * (SIGSTOP, a debugger, a swapping machine) or stuck outside kolo keeps
 * every peer waiting inside the backend, where the background thread can
 * say nothing until the backend's own timeout (KOLO_TIMEOUT_SECONDS)
 * fails the job. The coordinator's stall inspector (negotiate.c) only sees
 * tensors that some ranks enqueued and others did not; it runs between
 * rounds, so it cannot see a round that never ends.
 *
 * So each rank has one more thread, this one. A set's background thread
 * marks when it enters a call that waits for peers and what it is
 * (kolo__watchdog_enter: two atomic stores, nothing else on the hot path).
 * The watchdog sleeps on a condition variable until the earliest moment
 * one of those calls could reach KOLO_STALL_CHECK_TIME_SECONDS (a quiet
 * job: one wake-up per stall-check period), and warns for every call
 * that has: which set, for how long, and which rank it waits for, as far
 * as can be told: the backend names the member it is waiting on when it
 * knows (ops.h: waiting_for; shared memory does), and the peers registry
 * (peers.c) tells whether a rank on this host is stopped or gone. The
 * warning repeats every stall-check period while the wait lasts, each
 * with a flight recorder dump of this rank (flight.c); a rank that comes
 * back lets the job go on as if nothing happened.
 */
#include "alloc.h"
#include "watchdog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flight.h"
#include "peers.h"

struct kolo__watchdog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int stop;
};

void kolo__watchdog_enter(kolo__pset_t *ps, const char *what)
{
    if (what == NULL) {
        atomic_store_explicit(&ps->wait_since_us, 0, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&ps->wait_what, what, memory_order_relaxed);
    atomic_store_explicit(&ps->wait_since_us, kolo__now_us(),
                          memory_order_relaxed);
}

/* Warns about one set's wait; the caller holds sets_mu. */
static void warn(kolo__runtime_t *rt, kolo__pset_t *ps, int64_t waited_us)
{
    char prefix[32], who[256] = "", trouble[512] = "";
    int peer = -1;

    if (ps->ctl_ops->waiting_for != NULL)
        peer = ps->ctl_ops->waiting_for(ps->ctl_ctx);
    if (peer < 0 && ps->data_ops != NULL && ps->data_ctx != ps->ctl_ctx &&
        ps->data_ops->waiting_for != NULL)
        peer = ps->data_ops->waiting_for(ps->data_ctx);
    if (peer >= 0)
        snprintf(who, sizeof(who), " for rank %d, which has not joined it",
                 peer);
    else
        snprintf(who, sizeof(who), " for a rank that has not joined it (the "
                 "%s backend cannot tell which)", ps->ctl_ops->name);
    snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
    if (kolo__peers_lost(&rt->cfg, prefix, peer >= 0 ? &peer : ps->ranks,
                         peer >= 0 ? 1 : ps->size, trouble + 2,
                         sizeof(trouble) - 4, NULL) > 0) {
        trouble[0] = ':';
        trouble[1] = ' ';
    }
    kolo__log(KOLO__LOG_WARNING, "stall: rank %d has waited %.1f s in %s of "
              "process set %d%s%s; it fails after KOLO_TIMEOUT_SECONDS=%g s "
              "without progress", rt->rank, (double)waited_us / 1e6,
              atomic_load_explicit(&ps->wait_what, memory_order_relaxed),
              ps->id, who, trouble, rt->cfg.timeout_s);
    kolo__flight_dump(rt, "stall warning");
}

static void *watchdog_main(void *arg)
{
    kolo__runtime_t *rt = arg;
    struct kolo__watchdog *w = rt->watchdog;
    int64_t period = (int64_t)(rt->cfg.stall_check_s * 1e6);

    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        int64_t now = kolo__now_us(), next = now + period;
        struct timespec ts;

        pthread_mutex_lock(&rt->sets_mu);
        for (int i = 0; i < rt->nsets; i++) {
            kolo__pset_t *ps = rt->sets[i];
            int64_t since, due;
            if (ps == NULL)
                continue;
            since = atomic_load_explicit(&ps->wait_since_us, memory_order_relaxed);
            if (since == 0)
                continue;
            /* Once per period of one wait: the first after `period`. */
            due = since + period;
            if (ps->wait_warned_since == since)
                due = ps->wait_warned_us + period;
            if (now >= due) {
                warn(rt, ps, now - since);
                ps->wait_warned_since = since;
                ps->wait_warned_us = now;
                due = now + period;
            }
            if (due < next)
                next = due;
        }
        pthread_mutex_unlock(&rt->sets_mu);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        next -= now;
        ts.tv_sec += (time_t)(next / 1000000);
        ts.tv_nsec += (long)(next % 1000000) * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int kolo__watchdog_start(kolo__runtime_t *rt, kolo__err_t *err)
{
    struct kolo__watchdog *w;
    pthread_condattr_t ca;

    if (rt->cfg.stall_check_s <= 0 || rt->size == 1)
        return KOLO_OK;
    if ((w = kolo__calloc(1, sizeof(*w))) == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory starting "
                             "the stall watchdog in kolo_init");
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    rt->watchdog = w;
    if (kolo__thread_create(&w->thread, NULL, watchdog_main, rt) != 0) {
        rt->watchdog = NULL;
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot start the stall watchdog thread");
    }
    return KOLO_OK;
}

void kolo__watchdog_stop(kolo__runtime_t *rt)
{
    struct kolo__watchdog *w = rt->watchdog;

    if (w == NULL)
        return;
    kolo__thread_stop(w->thread, &w->mu, &w->cv, &w->stop);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    rt->watchdog = NULL;
}
