/*
 * mem_ops.c — a backend whose ranks are threads of one process, so that the
 * protocol (negotiation, fusion, execution, join, process sets, a rank
 * that stops) can be unit-tested in one process, as Gloo tests its
 * algorithms over an in-memory store. Built only into the unit tests'
 * library (KOLO_HAVE_MEM); libkolo never has it.
 *
 * DESIGN
 *
 * Rendezvous. Contexts find each other in a process-wide registry (one
 * mutex, g_mu) by the pair (rendezvous string, prefix): the first to
 * arrive creates the group, the others attach to it, and init waits on the
 * group's condition variable until all `size` members are there (or the
 * start timeout passes, or cfg->abandoned says a peer gave up). A group is
 * freed when the last of its members has finalized.
 *
 * A collective. Each member counts its collectives (seq 1, 2, ...). For
 * collective s it copies its contribution (the input, and for the
 * variable-size slots the per-rank sizes) into its slot s % 2, marks
 * itself posted for s, and waits on the group's condition variable until
 * every member has posted s. Then it reads every member's slot s % 2 and
 * computes its own output from them, in rank order, so every rank gets the
 * same bits. Copying the input in means a member never reads another's
 * user buffers, and two slots per member are enough: a member can post
 * s + 1 only after returning from s, which needs every member to have
 * posted s, so every member is done reading s - 1 (the slot s + 1 reuses).
 * While it waits the thread sleeps in pthread_cond_timedwait: nothing
 * spins. All members compare the posts of s (same collective, same sizes,
 * same root) and refuse a disagreement with KOLO_ERR_BACKEND, so an engine
 * whose ranks diverge fails loudly instead of reading garbage.
 *
 * Failures. A wait fails with KOLO_ERR_TIMEOUT naming the lowest member
 * that has not posted when no member posted for timeout_s seconds; with
 * KOLO_ERR_RANK_LOST naming a member that has not posted and never will:
 * its context was finalized, or a test stopped it (kolo__mem_kill). A
 * stopped member's own calls fail at once.
 *
 * Wake tokens. Every context has a delivery thread that calls cfg->on_wake
 * (never the caller's thread, as ops.h asks). wake_peers hands each live
 * peer's thread the round; a member that stops or finalizes hands every
 * live peer a lost-connection token (UINT64_MAX). A context is unhooked
 * from the group (under g_mu) before its delivery thread is joined, so no
 * callback runs after finalize returns.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "mem_ops.h"

typedef enum mem_kind {
    MEM_ALLREDUCE,
    MEM_ALLGATHER,
    MEM_GATHER,
    MEM_BROADCAST,
    MEM_ALLGATHERV,
    MEM_ALLTOALLV,
    MEM_REDUCE_SCATTER,
    MEM_WAKE_PEERS,
    MEM_NKINDS
} mem_kind_t;

static const char *const kind_names[MEM_NKINDS] = {
    "allreduce", "allgather", "gather", "broadcast", "allgatherv",
    "alltoallv", "reduce_scatter", "wake_peers"};

/* One member's contribution to one collective. */
typedef struct mem_slot {
    int kind;
    size_t count, elem; /* allreduce, reduce_scatter: elements and size */
    size_t bytes;       /* allgather, gather, broadcast */
    int root;
    kolo__ops_reduce_fn reduce;
    uint8_t *data;      /* the input, copied */
    size_t len, cap;
    size_t *sizes;      /* [size]: allgatherv, alltoallv, reduce_scatter */
} mem_slot_t;

typedef struct mem_ctx mem_ctx_t;

typedef struct mem_member {
    mem_ctx_t *ctx;   /* NULL when not attached, or finalized */
    int attached;
    int global_rank;
    int stopped;      /* kolo__mem_kill */
    int finalized;
    uint64_t posted;  /* the last collective it posted */
    mem_slot_t slot[2];
    uint64_t calls[MEM_NKINDS];
} mem_member_t;

typedef struct mem_group {
    struct mem_group *next;
    char *rendezvous, *prefix;
    int size, nattached, refs;
    pthread_cond_t cv; /* under g_mu: posts, arrivals, departures */
    mem_member_t *m;   /* [size] */
} mem_group_t;

struct mem_ctx {
    mem_group_t *g;
    int rank, size;
    uint64_t seq;       /* collectives started (background thread) */
    uint64_t wait_seq;  /* under g_mu: the collective it waits in, or 0 */
    double timeout_s;
    const mem_slot_t **peer; /* [size]: the slots of the last collective */
    /* delivery of wake tokens */
    kolo__ops_wake_fn on_wake;
    void *wake_arg;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t dmu;
    pthread_cond_t dcv;
    int dstop, dhave, dlost;
    uint64_t dround;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_group_t *g_groups;

/* ---- time ------------------------------------------------------------------ */

static struct timespec deadline_after(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (s > 1e6)
        s = 1e6;
    ts.tv_sec += (time_t)s;
    ts.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec ||
           (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* The deadline of a wait of s seconds; of none (1e6 s) where s is not
 * positive. */
static struct timespec deadline_within(double s)
{
    return deadline_after(s > 0 ? s : 1e6);
}

/* Whether the deadline has come. */
static int passed(const struct timespec *until)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return !before(&now, until);
}

/* ---- wake tokens --------------------------------------------------------- */

static void *delivery_main(void *arg)
{
    mem_ctx_t *c = arg;

    pthread_mutex_lock(&c->dmu);
    for (;;) {
        while (!c->dstop && !c->dhave && !c->dlost)
            pthread_cond_wait(&c->dcv, &c->dmu);
        if (c->dstop)
            break;
        int have = c->dhave, lost = c->dlost;
        uint64_t round = c->dround;
        c->dhave = c->dlost = 0;
        pthread_mutex_unlock(&c->dmu);
        if (have)
            c->on_wake(c->wake_arg, round);
        if (lost)
            c->on_wake(c->wake_arg, UINT64_MAX);
        pthread_mutex_lock(&c->dmu);
    }
    pthread_mutex_unlock(&c->dmu);
    return NULL;
}

/* Hands a token to a context's delivery thread; never blocks for long. */
static void deliver(mem_ctx_t *c, uint64_t round, int lost)
{
    pthread_mutex_lock(&c->dmu);
    if (lost) {
        c->dlost = 1;
    } else if (!c->dhave || round > c->dround) {
        c->dhave = 1;
        c->dround = round;
    }
    pthread_cond_signal(&c->dcv);
    pthread_mutex_unlock(&c->dmu);
}

/* Every live member but `except` learns that a peer is gone. Under g_mu. */
static void deliver_lost(mem_group_t *g, int except)
{
    for (int j = 0; j < g->size; j++)
        if (j != except && g->m[j].ctx != NULL && !g->m[j].stopped)
            deliver(g->m[j].ctx, 0, 1);
}

/* ---- the registry ---------------------------------------------------------- */

static const char *orempty(const char *s) { return s != NULL ? s : ""; }

static mem_group_t *group_find(const char *rendezvous, const char *prefix)
{
    for (mem_group_t *g = g_groups; g != NULL; g = g->next)
        if (strcmp(g->rendezvous, orempty(rendezvous)) == 0 &&
            strcmp(g->prefix, orempty(prefix)) == 0)
            return g;
    return NULL;
}

static mem_group_t *group_new(const char *rendezvous, const char *prefix,
                              int size)
{
    mem_group_t *g = kolo__calloc(1, sizeof(*g));
    pthread_condattr_t attr;

    if (g == NULL)
        return NULL;
    g->rendezvous = kolo__strdup(orempty(rendezvous));
    g->prefix = kolo__strdup(orempty(prefix));
    g->m = kolo__calloc((size_t)size, sizeof(*g->m));
    if (g->rendezvous == NULL || g->prefix == NULL || g->m == NULL) {
        free(g->rendezvous);
        free(g->prefix);
        free(g->m);
        free(g);
        return NULL;
    }
    g->size = size;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &attr);
    pthread_condattr_destroy(&attr);
    g->next = g_groups;
    g_groups = g;
    return g;
}

/* Drops a reference; the last one unlinks and frees the group. Under g_mu. */
static void group_unref(mem_group_t *g)
{
    if (--g->refs > 0)
        return;
    for (mem_group_t **p = &g_groups; *p != NULL; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    for (int j = 0; j < g->size; j++)
        for (int s = 0; s < 2; s++) {
            free(g->m[j].slot[s].data);
            free(g->m[j].slot[s].sizes);
        }
    pthread_cond_destroy(&g->cv);
    free(g->m);
    free(g->rendezvous);
    free(g->prefix);
    free(g);
}

/* ---- init and finalize ------------------------------------------------------ */

static void ctx_free(mem_ctx_t *c)
{
    if (c->thread_started)
        kolo__thread_stop(c->thread, &c->dmu, &c->dcv, &c->dstop);
    pthread_cond_destroy(&c->dcv);
    pthread_mutex_destroy(&c->dmu);
    free(c->peer);
    free(c);
}

/* A context for cfg's rank, with its delivery thread where it takes wake
 * tokens; into *out. */
static int ctx_new(const kolo__ops_config_t *cfg, mem_ctx_t **out, char *err,
                   size_t errlen)
{
    mem_ctx_t *c = kolo__calloc(1, sizeof(*c));

    if (c == NULL || (c->peer = kolo__calloc((size_t)cfg->size, sizeof(*c->peer))) == NULL) {
        free(c);
        snprintf(err, errlen, "mem: out of memory");
        return KOLO_ERR_NO_MEMORY;
    }
    c->rank = cfg->rank;
    c->size = cfg->size;
    c->timeout_s = cfg->timeout_s;
    c->on_wake = cfg->on_wake;
    c->wake_arg = cfg->wake_arg;
    pthread_mutex_init(&c->dmu, NULL);
    pthread_cond_init(&c->dcv, NULL);
    if (c->on_wake != NULL) {
        if (kolo__thread_create(&c->thread, NULL, delivery_main, c) != 0) {
            ctx_free(c);
            snprintf(err, errlen, "mem: cannot start the delivery thread");
            return KOLO_ERR_BACKEND;
        }
        c->thread_started = 1;
    }
    *out = c;
    return KOLO_OK;
}

/* Finds the group of cfg's context, or makes it, and attaches c as its
 * member cfg->rank. Under g_mu. */
static int group_join(mem_ctx_t *c, const kolo__ops_config_t *cfg, char *err,
                      size_t errlen)
{
    mem_group_t *g = group_find(cfg->rendezvous, cfg->prefix);
    mem_member_t *m;
    int rc = KOLO_OK;

    if (g == NULL && (g = group_new(cfg->rendezvous, cfg->prefix, cfg->size)) == NULL) {
        snprintf(err, errlen, "mem: out of memory");
        return KOLO_ERR_NO_MEMORY;
    }
    if (g->size != cfg->size) {
        snprintf(err, errlen, "mem: context %s has %d ranks, and rank %d "
                 "says %d", g->prefix, g->size, cfg->global_rank, cfg->size);
        rc = KOLO_ERR_BACKEND;
    } else if (g->m[cfg->rank].attached || g->m[cfg->rank].finalized) {
        snprintf(err, errlen, "mem: member %d of context %s arrived twice",
                 cfg->rank, g->prefix);
        rc = KOLO_ERR_BACKEND;
    }
    if (rc != KOLO_OK) {
        g->refs++; /* (a group just made goes with it) */
        group_unref(g);
        return rc;
    }
    m = &g->m[cfg->rank];
    m->attached = 1;
    m->ctx = c;
    m->global_rank = cfg->members != NULL ? cfg->members[cfg->rank]
                                          : cfg->global_rank;
    g->nattached++;
    g->refs++;
    c->g = g;
    pthread_cond_broadcast(&g->cv);
    return KOLO_OK;
}

/* Detaches c from its group again (its start failed). Under g_mu. */
static void group_leave(mem_ctx_t *c)
{
    mem_member_t *m = &c->g->m[c->rank];

    m->attached = 0;
    m->ctx = NULL;
    c->g->nattached--;
    group_unref(c->g);
}

/* Waits until every member has attached, asking every 50 ms whether a peer
 * gave up (cfg->abandoned), within the start timeout. Under g_mu, which it
 * releases while it asks. */
static int group_wait_all(mem_ctx_t *c, const kolo__ops_config_t *cfg,
                          char *err, size_t errlen)
{
    mem_group_t *g = c->g;
    struct timespec until = deadline_within(cfg->start_timeout_s);

    while (g->nattached < g->size) {
        struct timespec slice = deadline_after(0.05);
        char why[512];

        if (passed(&until)) {
            int missing = 0;
            while (missing < g->size && g->m[missing].attached)
                missing++;
            snprintf(err, errlen, "mem: member %d of context %s did not "
                     "arrive within %g s", missing, g->prefix,
                     cfg->start_timeout_s);
            return KOLO_ERR_TIMEOUT;
        }
        if (cfg->abandoned != NULL) {
            why[0] = '\0';
            pthread_mutex_unlock(&g_mu);
            int gave_up = cfg->abandoned(cfg->abandoned_arg, why, sizeof(why));
            pthread_mutex_lock(&g_mu);
            if (gave_up) {
                snprintf(err, errlen, "%s", why);
                return KOLO_ERR_BACKEND;
            }
        }
        pthread_cond_timedwait(&g->cv, &g_mu, before(&slice, &until) ? &slice
                                                                     : &until);
    }
    return KOLO_OK;
}

static int mem_init(const kolo__ops_config_t *cfg, void **ctx, char *err,
                    size_t errlen)
{
    mem_ctx_t *c;
    int rc;

    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size) {
        snprintf(err, errlen, "mem: rank %d of %d is not a place in the "
                 "context", cfg->rank, cfg->size);
        return KOLO_ERR_INTERNAL;
    }
    if ((rc = ctx_new(cfg, &c, err, errlen)) != KOLO_OK)
        return rc;
    pthread_mutex_lock(&g_mu);
    rc = group_join(c, cfg, err, errlen);
    if (rc == KOLO_OK && (rc = group_wait_all(c, cfg, err, errlen)) != KOLO_OK)
        group_leave(c);
    pthread_mutex_unlock(&g_mu);
    if (rc == KOLO_OK)
        *ctx = c;
    else
        ctx_free(c);
    return rc;
}

static void mem_finalize(void *ctx)
{
    mem_ctx_t *c = ctx;
    mem_group_t *g;

    if (c == NULL)
        return;
    g = c->g;
    pthread_mutex_lock(&g_mu);
    g->m[c->rank].ctx = NULL;
    g->m[c->rank].finalized = 1;
    if (!g->m[c->rank].stopped)
        deliver_lost(g, c->rank);
    pthread_cond_broadcast(&g->cv);
    group_unref(g);
    pthread_mutex_unlock(&g_mu);
    ctx_free(c);
}

/* ---- one collective ---------------------------------------------------------- */

static int slot_grow(mem_slot_t *s, size_t len)
{
    if (s->cap < len || s->data == NULL) {
        uint8_t *d = kolo__realloc(s->data, len ? len : 1);
        if (d == NULL)
            return -1;
        s->data = d;
        s->cap = len ? len : 1;
    }
    s->len = len;
    return 0;
}

/* Why member j will never post: NULL while it may. Under g_mu. */
static const char *gone(const mem_member_t *m)
{
    if (m->stopped)
        return "has stopped (kolo__mem_kill)";
    if (m->finalized)
        return "has left (its context was finalized)";
    return NULL;
}

static int same_sizes(const mem_slot_t *a, const mem_slot_t *b, int n)
{
    if (a->sizes == NULL || b->sizes == NULL)
        return a->sizes == b->sizes;
    return memcmp(a->sizes, b->sizes, (size_t)n * sizeof(size_t)) == 0;
}

/* Whether two members' posts of one collective agree; else writes why. */
static int agree(const mem_group_t *g, int ja, const mem_slot_t *a, int jb,
                 const mem_slot_t *b, char *err, size_t errlen)
{
    int ok = a->kind == b->kind;

    if (ok) {
        switch (a->kind) {
        case MEM_ALLREDUCE:
            ok = a->count == b->count && a->elem == b->elem &&
                 a->reduce == b->reduce;
            break;
        case MEM_ALLGATHER:
            ok = a->bytes == b->bytes;
            break;
        case MEM_GATHER:
        case MEM_BROADCAST:
            ok = a->bytes == b->bytes && a->root == b->root;
            break;
        case MEM_ALLGATHERV:
            ok = same_sizes(a, b, g->size);
            break;
        case MEM_REDUCE_SCATTER:
            ok = a->elem == b->elem && a->reduce == b->reduce &&
                 same_sizes(a, b, g->size);
            break;
        default: /* alltoallv: each reader checks what it receives */
            break;
        }
    }
    if (!ok)
        snprintf(err, errlen, "mem: rank %d and rank %d called different "
                 "collectives at the same step: %s (%zu elements of %zu bytes, "
                 "%zu bytes, root %d) and %s (%zu elements of %zu bytes, %zu "
                 "bytes, root %d)", g->m[ja].global_rank, g->m[jb].global_rank,
                 kind_names[a->kind], a->count, a->elem, a->bytes, a->root,
                 kind_names[b->kind], b->count, b->elem, b->bytes, b->root);
    return ok;
}

/* This rank's own calls fail at once once it has stopped. */
static int stopped_here(const mem_member_t *me, char *err, size_t errlen)
{
    snprintf(err, errlen, "mem: this rank (rank %d) has stopped "
             "(kolo__mem_kill)", me->global_rank);
    return KOLO_ERR_RANK_LOST;
}

/* Copies this member's contribution (mine, its data and sizes) into its
 * slot of the collective. */
static int slot_write(mem_ctx_t *c, mem_slot_t *slot, const mem_slot_t *mine,
                      const void *data, char *err, size_t errlen)
{
    if (slot_grow(slot, mine->len) != 0 ||
        (mine->sizes != NULL && slot->sizes == NULL &&
         (slot->sizes = kolo__malloc((size_t)c->size * sizeof(size_t))) == NULL)) {
        snprintf(err, errlen, "mem: out of memory for %zu bytes", mine->len);
        return KOLO_ERR_NO_MEMORY;
    }
    slot->kind = mine->kind;
    slot->count = mine->count;
    slot->elem = mine->elem;
    slot->bytes = mine->bytes;
    slot->root = mine->root;
    slot->reduce = mine->reduce;
    if (mine->len > 0)
        memcpy(slot->data, data, mine->len);
    if (mine->sizes != NULL)
        memcpy(slot->sizes, mine->sizes, (size_t)c->size * sizeof(size_t));
    else {
        free(slot->sizes);
        slot->sizes = NULL;
    }
    return KOLO_OK;
}

/* Waits until every member has posted collective s (of kind `kind`). It
 * fails when this rank stops, when a member that has not posted never
 * will, and when no member posted for timeout_s. Under g_mu. */
static int wait_posts(mem_ctx_t *c, uint64_t s, int kind, char *err,
                      size_t errlen)
{
    mem_group_t *g = c->g;
    const mem_member_t *me = &g->m[c->rank];
    struct timespec until = deadline_within(c->timeout_s);
    int last = -1;

    for (;;) {
        int n = 0, missing = -1, lost = -1;

        if (me->stopped)
            return stopped_here(me, err, errlen);
        for (int j = 0; j < g->size; j++) {
            if (g->m[j].posted >= s) {
                n++;
            } else {
                if (missing < 0)
                    missing = j;
                if (lost < 0 && gone(&g->m[j]) != NULL)
                    lost = j;
            }
        }
        if (n == g->size)
            return KOLO_OK;
        if (lost >= 0) {
            snprintf(err, errlen, "mem: rank %d %s", g->m[lost].global_rank,
                     gone(&g->m[lost]));
            return KOLO_ERR_RANK_LOST;
        }
        if (n > last) { /* progress: the timeout counts from here */
            last = n;
            until = deadline_within(c->timeout_s);
        }
        if (passed(&until)) {
            snprintf(err, errlen, "mem: rank %d did not join %s within %g s",
                     g->m[missing].global_rank, kind_names[kind],
                     c->timeout_s);
            return KOLO_ERR_TIMEOUT;
        }
        pthread_cond_timedwait(&g->cv, &g_mu, &until);
    }
}

/* Posts this member's contribution to its next collective (`mine`, whose
 * data and sizes are copied) and waits for every member's; on success
 * c->peer[j] is member j's slot. */
static int post_and_gather(mem_ctx_t *c, const mem_slot_t *mine, const void *data,
                    char *err, size_t errlen)
{
    mem_group_t *g = c->g;
    mem_member_t *me = &g->m[c->rank];
    uint64_t s;
    int rc;

    pthread_mutex_lock(&g_mu);
    me->calls[mine->kind]++;
    if (me->stopped) {
        pthread_mutex_unlock(&g_mu);
        return stopped_here(me, err, errlen);
    }
    pthread_mutex_unlock(&g_mu);

    /* Slot s % 2 is ours to write: see the essay. */
    s = ++c->seq;
    if ((rc = slot_write(c, &me->slot[s % 2], mine, data, err, errlen)) != KOLO_OK)
        return rc;
    pthread_mutex_lock(&g_mu);
    me->posted = s;
    c->wait_seq = s;
    pthread_cond_broadcast(&g->cv);
    rc = wait_posts(c, s, mine->kind, err, errlen);
    c->wait_seq = 0;
    for (int j = 0; rc == KOLO_OK && j < g->size; j++) {
        c->peer[j] = &g->m[j].slot[s % 2];
        if (j > 0 && !agree(g, 0, c->peer[0], j, c->peer[j], err, errlen))
            rc = KOLO_ERR_BACKEND;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ---- the slots ------------------------------------------------------------- */

static int mem_allreduce(void *ctx, const void *in, void *out, size_t count,
                         size_t elem_size, kolo__ops_reduce_fn reduce,
                         char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_ALLREDUCE, .count = count,
                       .elem = elem_size, .reduce = reduce,
                       .len = count * elem_size};
    int rc = post_and_gather(c, &mine, in != NULL ? in : out, err, errlen);

    if (rc != KOLO_OK)
        return rc;
    /* In rank order, the same on every rank. */
    if (count > 0)
        memcpy(out, c->peer[0]->data, count * elem_size);
    for (int j = 1; j < c->size; j++)
        reduce(out, out, c->peer[j]->data, count);
    return KOLO_OK;
}

static int mem_allgather(void *ctx, const void *in, void *out, size_t bytes,
                         char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_ALLGATHER, .bytes = bytes, .len = bytes};
    int rc = post_and_gather(c, &mine, in, err, errlen);

    if (rc != KOLO_OK)
        return rc;
    for (int j = 0; j < c->size && bytes > 0; j++)
        memcpy((uint8_t *)out + (size_t)j * bytes, c->peer[j]->data, bytes);
    return KOLO_OK;
}

static int mem_gather(void *ctx, const void *in, void *out, size_t bytes,
                      int root, char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_GATHER, .bytes = bytes, .root = root,
                       .len = bytes};
    int rc = post_and_gather(c, &mine, in, err, errlen);

    if (rc != KOLO_OK || c->rank != root)
        return rc;
    for (int j = 0; j < c->size && bytes > 0; j++)
        memcpy((uint8_t *)out + (size_t)j * bytes, c->peer[j]->data, bytes);
    return KOLO_OK;
}

static int mem_broadcast(void *ctx, void *buf, size_t bytes, int root,
                         char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_BROADCAST, .bytes = bytes, .root = root,
                       .len = c->rank == root ? bytes : 0};
    int rc;

    if (root < 0 || root >= c->size) {
        snprintf(err, errlen, "mem: broadcast from rank %d of %d", root,
                 c->size);
        return KOLO_ERR_BACKEND;
    }
    rc = post_and_gather(c, &mine, buf, err, errlen);
    if (rc == KOLO_OK && c->rank != root && bytes > 0)
        memcpy(buf, c->peer[root]->data, bytes);
    return rc;
}

static int mem_allgatherv(void *ctx, const void *in, void *out,
                          const size_t *bytes, char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_ALLGATHERV, .len = bytes[c->rank],
                       .sizes = (size_t *)bytes};
    size_t at = 0;
    int rc = post_and_gather(c, &mine, in, err, errlen);

    if (rc != KOLO_OK)
        return rc;
    for (int j = 0; j < c->size; j++) {
        if (bytes[j] > 0)
            memcpy((uint8_t *)out + at, c->peer[j]->data, bytes[j]);
        at += bytes[j];
    }
    return KOLO_OK;
}

static int mem_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                         void *out, const size_t *recv_bytes, char *err,
                         size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_ALLTOALLV, .sizes = (size_t *)send_bytes};
    size_t at = 0;
    int rc;

    for (int j = 0; j < c->size; j++)
        mine.len += send_bytes[j];
    rc = post_and_gather(c, &mine, in, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    for (int j = 0; j < c->size; j++) {
        const mem_slot_t *p = c->peer[j];
        size_t from = 0;
        for (int k = 0; k < c->rank; k++)
            from += p->sizes[k];
        if (p->sizes[c->rank] != recv_bytes[j]) {
            snprintf(err, errlen, "mem: alltoallv: rank %d sends %zu bytes "
                     "to rank %d, which expects %zu",
                     c->g->m[j].global_rank, p->sizes[c->rank],
                     c->g->m[c->rank].global_rank, recv_bytes[j]);
            return KOLO_ERR_BACKEND;
        }
        if (recv_bytes[j] > 0)
            memcpy((uint8_t *)out + at, p->data + from, recv_bytes[j]);
        at += recv_bytes[j];
    }
    return KOLO_OK;
}

static int mem_reduce_scatter(void *ctx, void *work, void *out,
                              const size_t *counts, size_t elem_size,
                              kolo__ops_reduce_fn reduce, char *err,
                              size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_slot_t mine = {.kind = MEM_REDUCE_SCATTER, .elem = elem_size,
                       .reduce = reduce, .sizes = (size_t *)counts};
    size_t from = 0, n = counts[c->rank];
    int rc;

    for (int j = 0; j < c->size; j++) {
        if (j < c->rank)
            from += counts[j];
        mine.len += counts[j] * elem_size;
    }
    rc = post_and_gather(c, &mine, work, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    if (n > 0)
        memcpy(out, c->peer[0]->data + from * elem_size, n * elem_size);
    for (int j = 1; j < c->size; j++)
        reduce(out, out, c->peer[j]->data + from * elem_size, n);
    return KOLO_OK;
}

static int mem_wake_peers(void *ctx, uint64_t round, char *err, size_t errlen)
{
    mem_ctx_t *c = ctx;
    mem_group_t *g = c->g;
    int rc = KOLO_OK;

    pthread_mutex_lock(&g_mu);
    g->m[c->rank].calls[MEM_WAKE_PEERS]++;
    if (g->m[c->rank].stopped) {
        snprintf(err, errlen, "mem: this rank (rank %d) has stopped "
                 "(kolo__mem_kill)", g->m[c->rank].global_rank);
        rc = KOLO_ERR_RANK_LOST;
    }
    for (int j = 0; rc == KOLO_OK && j < g->size; j++) {
        const char *why = gone(&g->m[j]);
        if (j == c->rank)
            continue;
        if (why != NULL) {
            snprintf(err, errlen, "mem: rank %d %s", g->m[j].global_rank, why);
            rc = KOLO_ERR_RANK_LOST;
        } else if (g->m[j].ctx != NULL) {
            deliver(g->m[j].ctx, round, 0);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* The member this context's collective waits for, as a global rank. */
static int mem_waiting_for(void *ctx)
{
    mem_ctx_t *c = ctx;
    int who = -1;

    pthread_mutex_lock(&g_mu);
    for (int j = 0; c->wait_seq != 0 && j < c->g->size && who < 0; j++)
        if (c->g->m[j].posted < c->wait_seq)
            who = c->g->m[j].global_rank;
    pthread_mutex_unlock(&g_mu);
    return who;
}

/* ---- for tests ------------------------------------------------------------- */

int kolo__mem_kill(const char *rendezvous, const char *prefix, int global_rank)
{
    int marked = 0;
    size_t plen = strlen(orempty(prefix));

    pthread_mutex_lock(&g_mu);
    for (mem_group_t *g = g_groups; g != NULL; g = g->next) {
        if (strcmp(g->rendezvous, orempty(rendezvous)) != 0 ||
            strncmp(g->prefix, orempty(prefix), plen) != 0)
            continue;
        for (int j = 0; j < g->size; j++) {
            mem_member_t *m = &g->m[j];
            if (!m->attached || m->global_rank != global_rank || m->stopped ||
                m->finalized)
                continue;
            m->stopped = 1;
            marked++;
            deliver_lost(g, j);
            pthread_cond_broadcast(&g->cv);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return marked;
}

uint64_t kolo__mem_calls(const char *rendezvous, const char *prefix,
                         int global_rank, const char *slot)
{
    uint64_t n = 0;
    int kind = -1;

    for (int k = 0; k < MEM_NKINDS; k++)
        if (strcmp(kind_names[k], slot) == 0)
            kind = k;
    if (kind < 0)
        return 0;
    pthread_mutex_lock(&g_mu);
    mem_group_t *g = group_find(rendezvous, prefix);
    for (int j = 0; g != NULL && j < g->size; j++)
        if (g->m[j].attached && g->m[j].global_rank == global_rank)
            n = g->m[j].calls[kind];
    pthread_mutex_unlock(&g_mu);
    return n;
}

const kolo__ops_t kolo__ops_mem = {
    .name = "mem",
    .caps = KOLO__OPS_USER | KOLO__OPS_TESTS | KOLO__OPS_LEAVES,
    .init = mem_init,
    .finalize = mem_finalize,
    .allreduce = mem_allreduce,
    .allgather = mem_allgather,
    .gather = mem_gather,
    .broadcast = mem_broadcast,
    .allgatherv = mem_allgatherv,
    .alltoallv = mem_alltoallv,
    .reduce_scatter = mem_reduce_scatter,
    .wake_peers = mem_wake_peers,
    .waiting_for = mem_waiting_for,
};
