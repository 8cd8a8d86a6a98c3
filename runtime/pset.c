/*
 * pset.c — the life cycle of a process set on one rank: choosing and
 * connecting its backends (ops/registry.c decides which), learning where
 * the ranks are, starting its background thread (background.c), and
 * stopping it. The API (api.c) starts and stops sets; the loop never
 * calls in here: it returns when its set stops, and the set's thread
 * (set_thread) then asks the other sets to stop with the global set's
 * reason.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "background.h"
#include "complete.h"
#include "connect.h"
#include "hosts.h"
#include "negotiate.h"
#include "peers.h"
#include "pset.h"
#include "straggler.h"

static void pset_free(kolo__pset_t *ps)
{
    if (ps->tune_log != NULL)
        fclose(ps->tune_log);
    free(ps->tune);
    kolo__negotiate_free(ps);
    kolo__queue_destroy(&ps->queue);
    free(ps->exec.fusion);
    free(ps->exec.starts);
    free(ps->ranks);
    free(ps);
}

static int start_threads(kolo__pset_t *ps, kolo__err_t *err);

static void release_host_ops(kolo__pset_t *ps)
{
    if (ps->host_ops_released)
        return;
    ps->host_ops_released = 1;
    if (ps->data_ops != NULL && ps->data_ctx != ps->ctl_ctx)
        ps->data_ops->finalize(ps->data_ctx);
    if (ps->ctl_ops != NULL)
        ps->ctl_ops->finalize(ps->ctl_ctx);
}

/* The set stopped on a failure of this rank's own while the program may
 * go on (it caught the error): the other members must not wait for it
 * until the timeout or its exit. It says why (peers.h), then leaves the
 * set's contexts where the backends allow it (KOLO__OPS_LEAVES: the
 * others' collectives fail at once, naming this rank; MPI's cannot be left
 * while the others are in one). Under sets_mu: the watchdog asks the
 * contexts whom they wait for. */
static void leave(kolo__pset_t *ps)
{
    kolo__runtime_t *rt = ps->rt;
    char prefix[32];

    snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
    kolo__peers_say_why(&rt->cfg, prefix);
    if (ps->ctl_ops == NULL || !(ps->ctl_ops->caps & KOLO__OPS_LEAVES) ||
        (ps->data_ops != NULL && !(ps->data_ops->caps & KOLO__OPS_LEAVES)))
        return;
    pthread_mutex_lock(&rt->sets_mu);
    release_host_ops(ps);
    pthread_mutex_unlock(&rt->sets_mu);
}

/* The set's thread: its loop (background.c) until the set stops; when the
 * global set stops, every other set of the rank stops with its reason. */
static void *set_thread(void *arg)
{
    kolo__pset_t *ps = arg;
    kolo__runtime_t *rt = ps->rt;

    kolo__fault_thread_rank(rt->rank); /* (the unit tests' fault injection) */
    if (kolo__background_main(ps))
        leave(ps);
    if (ps->id == KOLO_GLOBAL_PROCESS_SET && ps->rank == 0)
        kolo__straggler_write(ps);
    if (ps->id == KOLO_GLOBAL_PROCESS_SET) {
        pthread_mutex_lock(&rt->sets_mu);
        for (int i = 1; i < rt->nsets; i++)
            if (rt->sets[i] != NULL)
                kolo__pset_request_stop(rt->sets[i], &ps->stopped);
        pthread_mutex_unlock(&rt->sets_mu);
    }
    return NULL;
}

static void release_ops(kolo__pset_t *ps)
{
    if (ps->exec.dev_ctx != NULL) {
        /* The device may still be working on the last batches (their
         * handles completed when they were queued): let it finish, or
         * fail them, before its context goes. */
        kolo__err_t err;
        if (kolo__inflight_drain(&ps->exec.inflight, kolo__ops_device(),
                                 ps->exec.dev_ctx, ps->rt->rank,
                                 ps->rt->cfg.timeout_s, &err) != KOLO_OK)
            kolo__log(KOLO__LOG_ERROR, "%s", err.msg);
        kolo__ops_device()->finalize(ps->exec.dev_ctx);
    }
    release_host_ops(ps);
}

int kolo__pset_start(kolo__runtime_t *rt, int id, const int *ranks, int size,
                     kolo__outcome_t *watch, kolo__pset_t **out,
                     kolo__err_t *err)
{
    kolo__pset_t *ps = kolo__calloc(1, sizeof(*ps));
    sigset_t pipe_set, saved_mask;
    int rc;

    if (ps == NULL || (ps->ranks = kolo__malloc((size_t)size * sizeof(int))) == NULL) {
        free(ps);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory creating process set %d", id);
    }
    ps->rt = rt;
    ps->id = id;
    ps->size = size;
    ps->watch = watch;
    ps->gpu_device = -1;
    ps->rank = -1;
    for (int i = 0; i < size; i++) {
        ps->ranks[i] = ranks[i];
        if (ranks[i] == rt->rank)
            ps->rank = i;
    }
    if (kolo__queue_init(&ps->queue) != 0) {
        free(ps->ranks);
        free(ps);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot create the queue of process set %d", id);
    }
    ps->tune_fixed = (kolo__tune_params_t){rt->cfg.fusion_threshold,
                                           rt->cfg.chunk_bytes,
                                           rt->cfg.cycle_time_ms};
    if (rt->cfg.autotune && size > 1) {
        ps->tune = kolo__malloc(sizeof(*ps->tune));
        if (ps->tune == NULL) {
            free(ps->ranks);
            free(ps);
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory creating process set %d", id);
        }
        /* start_threads initialises it, once the data backend has chosen
         * KOLO_CHUNK_BYTES=auto. */
        if (id == KOLO_GLOBAL_PROCESS_SET && rt->rank == 0 &&
            rt->cfg.autotune_log[0] != '\0') {
            ps->tune_log = fopen(rt->cfg.autotune_log, "w");
            if (ps->tune_log == NULL) {
                int e = errno;
                free(ps->tune);
                free(ps->ranks);
                free(ps);
                return kolo__err_set(err, KOLO_ERR_CONFIG,
                                     "KOLO_AUTOTUNE_LOG=%s: cannot create it "
                                     "on rank 0: %s", rt->cfg.autotune_log,
                                     strerror(e));
            }
            fprintf(ps->tune_log, "window,parameter,fusion_threshold,"
                    "chunk_bytes,cycle_time_ms,bytes,busy_seconds,"
                    "bytes_per_busy_second,state\n");
        }
    }
    if (kolo__negotiate_init(ps) != 0) {
        pset_free(ps);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory for a response cache of %lld "
                             "entries (KOLO_CACHE_CAPACITY)",
                             (long long)rt->cfg.cache_capacity);
    }
    /* Threads started from here (the backend's and ours) write to sockets
     * whose peer may be gone: they must get EPIPE, not a SIGPIPE that kills
     * the process. They inherit this thread's mask; ours is restored. */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &saved_mask);
    rc = start_threads(ps, err);
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);
    if (rc == KOLO_OK)
        *out = ps;
    return rc;
}

/* Which backend a role uses (the registry decides, ops/registry.c):
 * KOLO_CONTROLLER or KOLO_CPU_OPERATIONS when set (not "auto"), else the
 * default for where the members are. */
static int choose_ops(const kolo__runtime_t *rt, const char *var,
                      const char *want, int all_local, int size,
                      const kolo__ops_t **out, kolo__err_t *err)
{
    kolo__ops_need_t need = {size, all_local, (int)rt->cfg.mpi_launched, rt->rank,
                             var, want};
    char detail[KOLO__ERR_LEN];
    int rc = kolo__ops_choose(&need, out, detail, sizeof(detail));

    if (rc != KOLO_OK)
        return kolo__err_set(err, rc, "%s", detail);
    return KOLO_OK;
}

/* The host index of every rank, exchanged over the global set's controller
 * before its thread starts (the only time the API thread uses a backend),
 * into `placed` (size entries, allocated before the controller connected:
 * once connected, a rank that fails alone leaves the others waiting in
 * this allgather). rt->host_of takes it. */
static int exchange_hosts(kolo__runtime_t *rt, kolo__pset_t *ps, int *placed,
                          kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN] = "";
    int me = (int)rt->cfg.cross_rank;
    int rc = KOLO_OK;

    if (rt->size == 1)
        placed[0] = me;
    else
        rc = ps->ctl_ops->allgather(ps->ctl_ctx, &me, placed, sizeof(int),
                                    detail, sizeof(detail));
    if (rc != KOLO_OK)
        return kolo__err_set(err, rc, "rank %d could not exchange host "
                             "placement: %s", rt->rank, detail);
    rt->host_of = placed;
    return KOLO_OK;
}

/* Whether a set that spans hosts reduces hierarchically (ops/hier): with
 * KOLO_HIERARCHICAL_ALLREDUCE=1, or by default when every host holds the
 * same number of members, more than one. */
static int use_hierarchical(const kolo__runtime_t *rt, const kolo__pset_t *ps,
                            const int *hosts)
{
    kolo__hosts_t g;
    int yes;

    if (rt->cfg.hierarchical == 0 || kolo__ops_hierarchical() == NULL)
        return 0;
    if (kolo__hosts_group(hosts, ps->size, ps->rank, &g) != 0)
        return 0; /* out of memory: flat, which needs none of this */
    yes = g.same && g.nlocal > 1;
    kolo__hosts_free(&g);
    if (yes)
        return 1;
    if (rt->cfg.hierarchical == 1 && ps->rank == 0)
        kolo__log(KOLO__LOG_WARNING, "KOLO_HIERARCHICAL_ALLREDUCE=1, but process "
                  "set %d does not have the same number of ranks (more than "
                  "one) on every host: its allreduce stays flat", ps->id);
    return 0;
}

/* What connecting a set's backends works with (start_threads). */
typedef struct connecting {
    kolo__runtime_t *rt;
    kolo__pset_t *ps;
    int *hosts;    /* [size]: the host of each member */
    int *placed;   /* the global set's first start: rt->host_of to be */
    int all_local; /* every member on this host */
} connecting_t;

/* The first start of the global set learns where every rank is. */
static int learns_hosts(const connecting_t *c)
{
    return c->ps->id == KOLO_GLOBAL_PROCESS_SET && c->rt->host_of == NULL;
}

/* Where the members are, as far as this rank knows before connecting:
 * before the global set has exchanged placements, the configuration says
 * whether the job is on one host. */
static int place_members(connecting_t *c, kolo__err_t *err)
{
    kolo__runtime_t *rt = c->rt;
    kolo__pset_t *ps = c->ps;

    c->hosts = kolo__malloc((size_t)ps->size * sizeof(int));
    if (learns_hosts(c))
        c->placed = kolo__calloc((size_t)ps->size, sizeof(int));
    if (c->hosts == NULL || (c->placed == NULL && learns_hosts(c)))
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory creating process set %d", ps->id);
    for (int i = 0; i < ps->size; i++)
        c->hosts[i] = rt->host_of != NULL ? rt->host_of[ps->ranks[i]]
                                          : (int)rt->cfg.cross_rank;
    if (rt->host_of == NULL)
        c->all_local = rt->cfg.cross_size == 1 && rt->cfg.local_size == rt->size;
    for (int i = 1; i < ps->size; i++)
        c->all_local &= c->hosts[i] == c->hosts[0];
    return KOLO_OK;
}

static int connect_controller(connecting_t *c, kolo__err_t *err)
{
    kolo__pset_t *ps = c->ps;
    int rc = choose_ops(c->rt, "KOLO_CONTROLLER", c->rt->cfg.controller,
                        c->all_local, ps->size, &ps->ctl_ops, err);

    if (rc == KOLO_OK)
        rc = kolo__connect(ps, ps->ctl_ops, "ctl", ps->rank, ps->size,
                           ps->ranks, c->hosts, NULL, &ps->ctl_ctx, err);
    if (rc != KOLO_OK)
        ps->ctl_ops = NULL; /* nothing to finalize */
    return rc;
}

/* The global set's first start: every rank's host, over the controller
 * (rt->host_of takes `placed`), which must agree with a configuration that
 * says one host. */
static int exchange_placement(connecting_t *c, kolo__err_t *err)
{
    kolo__runtime_t *rt = c->rt;
    kolo__pset_t *ps = c->ps;
    int *hosts = c->hosts;

    KOLO__CHECK(exchange_hosts(rt, ps, c->placed, err));
    c->placed = NULL; /* rt->host_of now */
    for (int i = 0; i < ps->size; i++) {
        hosts[i] = rt->host_of[ps->ranks[i]];
        if (hosts[i] != hosts[0] && c->all_local)
            return kolo__err_set(err, KOLO_ERR_CONFIG,
                                 "rank %d is on host %d but rank %d is on "
                                 "host %d, while KOLO_CROSS_SIZE=1 and "
                                 "KOLO_LOCAL_SIZE=%lld say one host",
                                 ps->ranks[0], hosts[0], ps->ranks[i],
                                 hosts[i], (long long)rt->cfg.local_size);
    }
    return KOLO_OK;
}

/* The data backend: hierarchical across hosts where it pays, the
 * controller's context where it is the same backend. */
static int connect_data(connecting_t *c, kolo__err_t *err)
{
    kolo__pset_t *ps = c->ps;
    const char *cross = NULL;
    int rc = choose_ops(c->rt, "KOLO_CPU_OPERATIONS", c->rt->cfg.cpu_operations,
                        c->all_local, ps->size, &ps->data_ops, err);

    if (rc == KOLO_OK && !c->all_local && use_hierarchical(c->rt, ps, c->hosts)) {
        cross = ps->data_ops->name;
        ps->data_ops = kolo__ops_hierarchical();
    }
    if (rc == KOLO_OK && ps->data_ops == ps->ctl_ops)
        ps->data_ctx = ps->ctl_ctx;
    else if (rc == KOLO_OK)
        rc = kolo__connect(ps, ps->data_ops, "data", ps->rank, ps->size,
                           ps->ranks, c->hosts, cross, &ps->data_ctx, err);
    if (rc != KOLO_OK)
        ps->data_ops = NULL; /* not connected (or the controller's) */
    return rc;
}

/* What waited for the data backend: KOLO_CHUNK_BYTES=auto, then the tuner
 * starting from the defaults, and the timeline's phase names. */
static void settle_tuning(kolo__pset_t *ps)
{
    if (ps->tune_fixed.chunk_bytes < 0)
        ps->tune_fixed.chunk_bytes =
            ps->data_ops->chunk_bytes > 0 ? ps->data_ops->chunk_bytes : 4 << 20;
    if (ps->tune != NULL)
        kolo__autotune_init(ps->tune, &ps->tune_fixed,
                            (int)ps->rt->cfg.autotune_window);
    ps->phase = kolo__phase_names(ps->data_ops->name);
}

/* Every rank learns whether every member connected, before any thread
 * runs a round on a set that is not whole (agree.c). */
static int agree_connected(kolo__pset_t *ps, int rc, kolo__err_t *err)
{
    if (ps->watch != NULL) {
        kolo__err_t mine = *err;
        rc = kolo__outcome_agree(ps->watch, rc, &mine, err);
        ps->watch->agreed = 1;
        ps->watch = NULL;
    }
    return rc;
}

/* Connects the set's backends, agrees with every rank that all members
 * did, and starts its thread; on failure frees the set. */
static int start_threads(kolo__pset_t *ps, kolo__err_t *err)
{
    connecting_t c = {ps->rt, ps, NULL, NULL, 1};
    int rc;

    rc = place_members(&c, err);
    if (rc == KOLO_OK)
        rc = connect_controller(&c, err);
    if (rc == KOLO_OK && learns_hosts(&c))
        rc = exchange_placement(&c, err);
    if (rc == KOLO_OK)
        rc = connect_data(&c, err);
    if (rc == KOLO_OK)
        settle_tuning(ps);
    free(c.hosts);
    free(c.placed);
    rc = agree_connected(ps, rc, err);
    if (rc != KOLO_OK) {
        release_ops(ps);
        pset_free(ps);
        return rc;
    }
    if (kolo__thread_create(&ps->thread, NULL, set_thread, ps) != 0) {
        int id = ps->id; /* (the set is freed before the message) */
        release_ops(ps);
        pset_free(ps);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot start the background thread of process "
                             "set %d", id);
    }
    ps->thread_started = 1;
    return KOLO_OK;
}

void kolo__pset_request_stop(kolo__pset_t *ps, const kolo__err_t *why)
{
    if (why != NULL)
        kolo__queue_close(&ps->queue, why);
    kolo__queue_request_shutdown(&ps->queue);
}

void kolo__pset_stop(kolo__pset_t *ps, const kolo__err_t *why)
{
    kolo__pset_request_stop(ps, why);
    if (ps->thread_started)
        pthread_join(ps->thread, NULL);
    release_ops(ps);
    pset_free(ps);
}
