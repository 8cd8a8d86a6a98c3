/*
 * elastic.c — the elastic driver (see "Elastic jobs" in kolorun.h): hosts
 * from a discovery script or -H, workers per (host, slot), generations
 * published through the job's rendezvous store, failures that blacklist
 * their host, and the ways an elastic job ends.
 *
 * A policy on top of supervision (kolorun_policy_t, supervise.h): it runs
 * in kolorun's one poll loop, which calls el_tick to make the decisions
 * and say when it next needs to run, polls the discovery script's stdout
 * for it, and tells it of every worker that ended (el_ended) and of the
 * script's end (el_reaped); it asks supervision to start workers
 * (kolorun_rank_start, placed in their generation) and to stop them
 * (kolorun_rank_stop), and writes generations through the rendezvous
 * (kolorun_rdv_set).
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "elastic.h"

/* How often the discovery script runs (from one start to the next). */
#define EL_DISCOVERY_MS 1000
/* How long one run of it may take before kolorun kills it. */
#define EL_DISCOVERY_LIMIT_MS 10000
/* The most it may print: more is taken for garbage. */
#define EL_DISCOVERY_CAP (64 * 1024)
/* After a worker fails, how long kolorun waits for the failures that come
 * with it (its peers, its host) before it decides the next generation, so
 * that one event makes one generation and counts one reset. */
#define EL_SETTLE_MS 500
#define EL_FOREVER INT64_MAX

typedef struct el_worker {
    int host, slot;
    int gone;          /* reaped */
    int dropped;       /* removed, or stopped with its host: exit ignored */
    int failed;        /* exited non-zero or was killed, as a member */
    int succeeded;     /* exited 0 as a member */
    int status;        /* wait status, once gone */
    int64_t term_ms;   /* when kolorun sent it SIGTERM (0: not yet) */
    int64_t removed_ms; /* when a generation left it out (0: never) */
} el_worker_t;

typedef struct el_host {
    int listed;        /* slots in the latest host list; 0: not listed */
    int order;         /* its place in that list */
    int64_t bl_until;  /* blacklisted until then (EL_FOREVER); 0: not */
    int bl_count;      /* times blacklisted, for the cooldown */
    int unreachable;   /* another host without a shared rendezvous */
} el_host_t;

typedef struct el_slot {
    int host, slot, worker; /* worker -1: to be started */
} el_slot_t;

struct kolorun_elastic {
    el_worker_t *w; /* per worker: the same index as k->ranks */
    int wcap;
    el_host_t *h;   /* per host of k->opts.hosts */
    int hcap;
    int gen;        /* the latest generation published, 0 before */
    int *members;   /* its workers, in rank order */
    int nmembers;
    int resets;
    int64_t start_ms;
    int64_t wait_since;   /* too few slots since then; 0: not waiting */
    int64_t settle_until; /* a failure: decide from then on */
    int failure;          /* a member failed since the last generation */
    int finishing;        /* a member of the latest generation exited 0 */
    int ended;            /* the driver ended the job */
    int64_t end_ms;
    int status;           /* the exit status it chose */
    int end_written;
    int dirty;            /* something changed: decide again */
    int64_t recheck_at;   /* a timed event: decide again then (0: none) */
    /* The discovery script. */
    pid_t dpid;
    int dfd, dreaped, dstatus, dkilled, druns, dgood;
    int64_t dstarted, dnext;
    char *dbuf;
    size_t dlen;
    char dwarn[1024]; /* the last warning, said once */
};

/* ---- workers ------------------------------------------------------------- */

static int el_start_worker(kolorun_t *k, int w);

static int el_grow_workers(kolorun_t *k, int n)
{
    kolorun_elastic_t *e = k->elastic;
    if (n <= e->wcap)
        return 0;
    if (kolorun_grow(&e->w, &e->wcap, n, sizeof *e->w) != 0)
        return -1;
    int *rh = realloc(k->rank_host, (size_t)e->wcap * sizeof *rh);
    if (!rh)
        return -1;
    k->rank_host = rh;
    return kolorun_ranks_grow(k, e->wcap);
}

static int el_alive(const kolorun_t *k, int w)
{
    return w < k->nstarted && !k->elastic->w[w].gone;
}

/* The live worker for (host, slot), or -1. */
static int el_worker_at(const kolorun_t *k, int host, int slot)
{
    for (int w = 0; w < k->nstarted; w++)
        if (el_alive(k, w) && k->elastic->w[w].host == host &&
            k->elastic->w[w].slot == slot)
            return w;
    return -1;
}

static int el_rank_of(const kolorun_elastic_t *e, int w)
{
    for (int i = 0; i < e->nmembers; i++)
        if (e->members[i] == w)
            return i;
    return -1;
}

static const char *el_host_name(const kolorun_t *k, int w)
{
    return k->opts.hosts[k->elastic->w[w].host].name;
}

/* The status kolorun exits with for a worker's wait status. */
static int el_exit_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

/* Stops worker w (removed, or on a blacklisted host): SIGTERM now, SIGKILL
 * after the grace period (el_tick). */
static void el_terminate(kolorun_t *k, int w)
{
    el_worker_t *ew = &k->elastic->w[w];
    if (!el_alive(k, w) || ew->term_ms)
        return;
    ew->term_ms = kolorun_now_ms();
    kolorun_rank_stop(k, w, SIGTERM);
}

/* ---- ending -------------------------------------------------------------- */

/* Ends the job: why is said (one line), written to elastic/end for the
 * workers that wait in kolo_init, and the workers get the failure grace to
 * see it before kolorun stops them. */
static void el_end(kolorun_t *k, int status, const char *why)
{
    kolorun_elastic_t *e = k->elastic;
    if (e->ended)
        return;
    e->ended = 1;
    e->status = status;
    e->end_ms = kolorun_now_ms();
    if (why) {
        kolorun_say("%s", why);
        if (e->gen > 0) {
            char *line = kolorun_strdupf("%s\n", why);
            if (line && kolorun_rdv_set(k, "elastic/end", line) == 0)
                e->end_written = 1;
            free(line);
        }
    }
}

/* ---- hosts --------------------------------------------------------------- */

static int el_grow_hosts(kolorun_t *k, int n)
{
    kolorun_elastic_t *e = k->elastic;
    if (n <= e->hcap)
        return 0;
    return kolorun_grow(&e->h, &e->hcap, n, sizeof *e->h);
}

/* The index of host name in k->opts.hosts, added if new; -1: out of
 * memory. */
static int el_host_index(kolorun_t *k, const char *name)
{
    kolorun_opts_t *o = &k->opts;
    for (int i = 0; i < o->nhosts; i++)
        if (strcmp(o->hosts[i].name, name) == 0)
            return i;
    kolorun_host_t *h = realloc(o->hosts, (size_t)(o->nhosts + 1) * sizeof *h);
    if (h)
        o->hosts = h;
    char *n = strdup(name);
    if (!h || !n || el_grow_hosts(k, o->nhosts + 1) != 0) {
        free(n);
        return -1;
    }
    memset(&o->hosts[o->nhosts], 0, sizeof *h);
    o->hosts[o->nhosts].name = n;
    o->hosts[o->nhosts].local = kolorun_host_is_local(n);
    return o->nhosts++;
}

static int el_usable(const kolorun_t *k, int h, int64_t now)
{
    const el_host_t *eh = &k->elastic->h[h];
    return eh->listed > 0 && !eh->unreachable && eh->bl_until <= now;
}

/* Blacklists the host of worker w and stops its other workers. */
static void el_blacklist(kolorun_t *k, int host)
{
    kolorun_elastic_t *e = k->elastic;
    el_host_t *eh = &e->h[host];
    int64_t now = kolorun_now_ms();
    if (eh->bl_until > now)
        return; /* already: the cooldown is not extended */
    eh->bl_count++;
    char until[64] = "";
    if (k->opts.cooldown_lo > 0) {
        /* Horovod's: A * 2^count + U(0, 1) * A seconds, within [A, B]. */
        double a = k->opts.cooldown_lo, b = k->opts.cooldown_hi;
        double d = a * (double)(1LL << (eh->bl_count < 20 ? eh->bl_count : 20)) +
                   a * ((double)rand() / RAND_MAX);
        d = d < a ? a : d > b ? b : d;
        eh->bl_until = now + (int64_t)(d * 1000);
        snprintf(until, sizeof until, " for %.1f s", d);
    } else {
        eh->bl_until = EL_FOREVER;
    }
    int stopped = 0;
    for (int w = 0; w < k->nstarted; w++) {
        el_worker_t *ew = &e->w[w];
        if (ew->host != host || !el_alive(k, w) || ew->dropped)
            continue;
        ew->dropped = 1;
        el_terminate(k, w);
        stopped++;
    }
    kolorun_say("blacklisting host %s%s%s", k->opts.hosts[host].name, until,
                stopped ? "; stopping its other workers" : "");
}

/* ---- generations --------------------------------------------------------- */

/* The generation kolorun would have now: the hosts of the latest one that
 * remain, in their order, then the other hosts in the order of the host
 * list; slots 0, 1, ... of each; at most --max-np. A slot whose old worker
 * is still running without being a member (removed, or stopped) waits for
 * it to go: two processes with one id would both join. Returns the count
 * (-1: out of memory); *out is malloc'd. */
static int el_desired(kolorun_t *k, el_slot_t **out)
{
    kolorun_elastic_t *e = k->elastic;
    int nh = k->opts.nhosts, n = 0, cap = 16;
    int64_t now = kolorun_now_ms();
    int *order = malloc((size_t)(nh + 1) * sizeof *order);
    el_slot_t *s = malloc((size_t)cap * sizeof *s);
    if (!order || !s) {
        free(order);
        free(s);
        return -1;
    }
    int no = 0;
    for (int i = 0; i < e->nmembers; i++) {
        int h = e->w[e->members[i]].host, seen = 0;
        for (int j = 0; j < no; j++)
            seen |= order[j] == h;
        if (!seen && el_usable(k, h, now))
            order[no++] = h;
    }
    int first_new = no;
    for (int h = 0; h < nh; h++) {
        int seen = 0;
        for (int j = 0; j < first_new; j++)
            seen |= order[j] == h;
        if (seen || !el_usable(k, h, now))
            continue;
        /* in the order of the host list */
        int at = no;
        while (at > first_new && e->h[order[at - 1]].order > e->h[h].order) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = h;
        no++;
    }
    for (int j = 0; j < no; j++) {
        int h = order[j];
        for (int slot = 0; slot < e->h[h].listed && n < k->opts.max_np;
             slot++) {
            int w = el_worker_at(k, h, slot);
            if (w >= 0 && (e->w[w].dropped || el_rank_of(e, w) < 0))
                continue;
            if (n == cap) {
                el_slot_t *t = realloc(s, (size_t)(cap *= 2) * sizeof *s);
                if (!t) {
                    free(order);
                    free(s);
                    return -1;
                }
                s = t;
            }
            s[n++] = (el_slot_t){h, slot, w};
        }
    }
    free(order);
    *out = s;
    return n;
}

/* Gives every slot without a worker a new one (started later, by
 * el_start_new), puts the slots' workers in members, in rank order, and
 * the generation's members record ("host:slot" lines) in text. Returns
 * the index after the last new worker. */
static int el_assign(kolorun_t *k, el_slot_t *s, int n, int *members,
                     char *text, size_t cap)
{
    kolorun_elastic_t *e = k->elastic;
    size_t used = 0;
    int next = k->nstarted;
    text[0] = '\0';
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(text + used, cap - used, "%s:%d\n",
                                 k->opts.hosts[s[i].host].name, s[i].slot);
        if (s[i].worker < 0) {
            s[i].worker = next++;
            memset(&e->w[s[i].worker], 0, sizeof e->w[0]);
            e->w[s[i].worker].host = s[i].host;
            e->w[s[i].worker].slot = s[i].slot;
            k->rank_host[s[i].worker] = s[i].host;
        }
        members[i] = s[i].worker;
    }
    return next;
}

/* Writes generation g through the rendezvous: its members, its update,
 * then elastic/generation, which the workers watch. 0, or -1 (said). */
static int el_write_generation(const kolorun_t *k, int g, const char *text,
                               const char *update)
{
    char key[64], num[32];
    snprintf(key, sizeof key, "elastic/%d/members", g);
    int rc = kolorun_rdv_set(k, key, text);
    snprintf(key, sizeof key, "elastic/%d/update", g);
    if (rc == 0)
        rc = kolorun_rdv_set(k, key, update);
    snprintf(num, sizeof num, "%d", g);
    if (rc == 0)
        rc = kolorun_rdv_set(k, "elastic/generation", num);
    return rc;
}

/* Members of the old generation that the new one (members, n) leaves
 * out: removed as of now, their exits ignored from then on. */
static void el_drop_left_out(kolorun_t *k, const int *members, int n,
                             int64_t now)
{
    kolorun_elastic_t *e = k->elastic;
    for (int i = 0; i < e->nmembers; i++) {
        int w = e->members[i], kept = 0;
        for (int j = 0; j < n; j++)
            kept |= members[j] == w;
        if (!kept && el_alive(k, w) && !e->w[w].dropped) {
            e->w[w].dropped = 1;
            e->w[w].removed_ms = now;
        }
    }
}

/* "generation 2 (failure): 3 ranks: host:0 host:1 other:0" */
static void el_say_generation(const kolorun_t *k, int g, const char *update,
                              const el_slot_t *s, int n)
{
    char line[4096];
    size_t m = 0;
    line[0] = '\0';
    for (int i = 0; i < n && m < sizeof line - 300; i++)
        m += (size_t)snprintf(line + m, sizeof line - m, " %s:%d",
                              k->opts.hosts[s[i].host].name, s[i].slot);
    kolorun_say("generation %d (%s): %d rank%s:%s%s", g, update, n,
                n == 1 ? "" : "s", line, m >= sizeof line - 300 ? " ..." : "");
}

/* Starts the new workers, up to index next; one that cannot start ends
 * the job. */
static void el_start_new(kolorun_t *k, int next)
{
    while (k->nstarted < next) {
        int failed = el_start_worker(k, k->nstarted);
        if (failed) {
            k->launch_error = failed;
            el_end(k, failed, "cannot start a worker: the job ends");
            return;
        }
    }
}

/* Publishes generation gen + 1 with these slots: writes its members and
 * update, then elastic/generation, then starts the new workers and stops
 * nothing (left-out workers learn at kolo_init that they were removed). */
static int el_publish(kolorun_t *k, el_slot_t *s, int n, const char *update)
{
    kolorun_elastic_t *e = k->elastic;
    int g = e->gen + 1;
    int64_t now = kolorun_now_ms();
    int *members = malloc((size_t)n * sizeof *members);
    size_t cap = 64;
    for (int i = 0; i < n; i++)
        cap += strlen(k->opts.hosts[s[i].host].name) + 16;
    char *text = malloc(cap);
    if (!members || !text || el_grow_workers(k, k->nstarted + n) != 0) {
        free(members);
        free(text);
        kolorun_say("out of memory");
        return -1;
    }
    int next = el_assign(k, s, n, members, text, cap);
    int rc = el_write_generation(k, g, text, update);
    free(text);
    if (rc != 0) {
        free(members);
        return -1;
    }
    el_drop_left_out(k, members, n, now);
    free(e->members);
    e->members = members;
    e->nmembers = n;
    e->gen = g;
    e->failure = 0;
    e->wait_since = 0;
    el_say_generation(k, g, update, s, n);
    el_start_new(k, next);
    return 0;
}

/* The word for why the next generation exists. */
static const char *el_update(const kolorun_t *k, const el_slot_t *s, int n)
{
    const kolorun_elastic_t *e = k->elastic;
    if (e->failure)
        return "failure";
    int added = 0, removed = 0;
    for (int i = 0; i < n; i++)
        added |= s[i].worker < 0;
    for (int i = 0; i < e->nmembers; i++) {
        int kept = 0;
        for (int j = 0; j < n; j++)
            kept |= s[j].worker == e->members[i];
        removed |= !kept;
    }
    return added && removed ? "mixed" : added ? "added" : "removed";
}

/* "every rank failed: rank 0 (localhost:0, pid 42) exited with status 3;
 * ..." */
static void el_all_failed(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    char line[8192];
    size_t m = (size_t)snprintf(line, sizeof line, "every rank failed:");
    int first = -1;
    for (int i = 0; i < e->nmembers && m < sizeof line - 400; i++) {
        int w = e->members[i];
        const el_worker_t *ew = &e->w[w];
        char how[128];
        if (ew->failed)
            kolorun_describe(ew->status, how, sizeof how);
        else
            snprintf(how, sizeof how, "was stopped with its host");
        if (ew->failed && first < 0)
            first = w;
        m += (size_t)snprintf(line + m, sizeof line - m,
                              "%s rank %d (%s:%d, pid %ld) %s",
                              i ? ";" : "", i, el_host_name(k, w), ew->slot,
                              (long)k->ranks[w].pid, how);
    }
    el_end(k, first >= 0 ? el_exit_code(e->w[first].status) : 1, line);
}

/* A member of the latest generation exited 0: no more generations; the
 * job ends once every member has ended. */
static void el_decide_finish(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    for (int i = 0; i < e->nmembers; i++)
        if (!e->w[e->members[i]].gone)
            return;
    el_end(k, 0, NULL);
}

/* Members of the latest generation still taking part. */
static int el_members_alive(const kolorun_elastic_t *e)
{
    int alive = 0;
    for (int i = 0; i < e->nmembers; i++)
        alive += !e->w[e->members[i]].gone && !e->w[e->members[i]].dropped;
    return alive;
}

/* No member of the latest generation is left: the job ends, as the ranks
 * that waited for more ending, or as every rank having failed. */
static void el_decide_none_left(kolorun_t *k)
{
    if (k->elastic->wait_since) {
        char why[256];
        snprintf(why, sizeof why, "fewer than --min-np %d ranks, and the "
                 "ranks that waited for more have ended", k->opts.min_np);
        el_end(k, 1, why);
        return;
    }
    el_all_failed(k);
}

/* Before the first generation: publish it once -np slots are there, or
 * end the job when they are not within the elastic timeout. */
static void el_decide_first(kolorun_t *k, el_slot_t *s, int n, int64_t now)
{
    const kolorun_opts_t *o = &k->opts;
    if (n >= o->np) {
        if (el_publish(k, s, n, "start") != 0)
            el_end(k, 1, NULL);
    } else if (now - k->elastic->start_ms >=
               (int64_t)o->elastic_timeout_s * 1000) {
        char why[256];
        snprintf(why, sizeof why, "timed out after %d s waiting for "
                 "-np %d slots (the hosts offer %d)",
                 o->elastic_timeout_s, o->np, n);
        el_end(k, 1, why);
    }
}

/* Too few slots (n) for --min-np, or only new hosts' (no survivors):
 * wait for discovery, up to the elastic timeout. */
static void el_decide_wait(kolorun_t *k, int n, int survivors, int64_t now)
{
    kolorun_elastic_t *e = k->elastic;
    const kolorun_opts_t *o = &k->opts;
    if (!e->wait_since) {
        e->wait_since = now;
        kolorun_say("%d slot%s available%s, fewer than --min-np %d: "
                    "waiting up to %d s for more",
                    n, n == 1 ? "" : "s",
                    survivors == 0 && n > 0 ? " on new hosts only" : "",
                    o->min_np, o->elastic_timeout_s);
    } else if (now - e->wait_since >= (int64_t)o->elastic_timeout_s * 1000) {
        char why[256];
        snprintf(why, sizeof why, "fewer than --min-np %d ranks for %d s",
                 o->min_np, o->elastic_timeout_s);
        el_end(k, 1, why);
    }
}

/* After the first generation: the next one, where the slots changed,
 * enough of them are there, and --reset-limit allows another reset. */
static void el_decide_next(kolorun_t *k, el_slot_t *s, int n, int64_t now)
{
    kolorun_elastic_t *e = k->elastic;
    const kolorun_opts_t *o = &k->opts;
    int same = n == e->nmembers, survivors = 0;
    for (int i = 0; i < n; i++) {
        same = same && s[i].worker == e->members[i];
        survivors += s[i].worker >= 0;
    }
    if (same) {
        e->wait_since = 0;
        return;
    }
    if (n < o->min_np || survivors == 0) {
        el_decide_wait(k, n, survivors, now);
        return;
    }
    const char *update = el_update(k, s, n);
    if (o->reset_limit >= 0 && e->resets >= o->reset_limit) {
        char why[256];
        snprintf(why, sizeof why, "the job needs another reset (%s), and "
                 "--reset-limit %d allows no more",
                 update, o->reset_limit);
        el_end(k, 1, why);
        return;
    }
    e->resets++;
    if (el_publish(k, s, n, update) != 0)
        el_end(k, 1, NULL);
}

/* Decides what the job needs now; called at every turn of the loop. */
static void el_decide(kolorun_t *k, int64_t now)
{
    kolorun_elastic_t *e = k->elastic;
    if (e->ended || k->stopping || now < e->settle_until)
        return;
    e->dirty = 0;
    if (e->finishing) {
        el_decide_finish(k);
        return;
    }
    if (e->gen > 0 && el_members_alive(e) == 0) {
        el_decide_none_left(k);
        return;
    }
    el_slot_t *s = NULL;
    int n = el_desired(k, &s);
    if (n < 0) {
        kolorun_say("out of memory");
        el_end(k, 1, NULL);
        return;
    }
    if (e->gen == 0)
        el_decide_first(k, s, n, now);
    else
        el_decide_next(k, s, n, now);
    free(s);
}

/* ---- discovery ----------------------------------------------------------- */

/* A warning about the discovery script, said once until it changes. */
static void el_dwarn(kolorun_t *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void el_dwarn(kolorun_t *k, const char *fmt, ...)
{
    kolorun_elastic_t *e = k->elastic;
    char msg[sizeof e->dwarn];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (strcmp(msg, e->dwarn) == 0)
        return;
    snprintf(e->dwarn, sizeof e->dwarn, "%s", msg);
    kolorun_say("warning: %s", msg);
}

static void el_discovery_start(kolorun_t *k, int64_t now)
{
    kolorun_elastic_t *e = k->elastic;
    int p[2];
    e->dnext = now + EL_DISCOVERY_MS;
    if (pipe2(p, O_CLOEXEC) != 0) {
        el_dwarn(k, "cannot run the host discovery script: pipe: %s",
                 strerror(errno));
        return;
    }
    char *argv[] = {"sh", "-c", (char *)k->opts.discovery, NULL};
    pid_t pid = kolorun_start_helper(k, "/bin/sh", argv, -1, p[1], -1, NULL);
    int fork_errno = errno;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        el_dwarn(k, "cannot run the host discovery script: fork: %s",
                 strerror(fork_errno));
        return;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    e->dpid = pid;
    e->dfd = p[0];
    e->dreaped = e->dkilled = 0;
    e->dlen = 0;
    e->dstarted = now;
}

/* One line of the script's output: "host:slots" or "host" (then
 * --slots-per-host). 0, or -1 (why says why). */
static int el_parse_line(const kolorun_t *k, char *line, char *name,
                         size_t nlen, int *slots, char *why, size_t wlen)
{
    char *colon = NULL;
    if (line[0] == '[') { /* [IPv6] or [IPv6]:slots */
        char *close = strchr(line, ']');
        if (!close || (close[1] && close[1] != ':')) {
            snprintf(why, wlen, "'%s' is not 'host' or 'host:slots'", line);
            return -1;
        }
        *close = '\0';
        colon = close[1] ? close + 1 : NULL;
        memmove(line, line + 1, strlen(line + 1) + 1);
    } else {
        colon = strrchr(line, ':');
        if (colon && strchr(line, ':') != colon)
            colon = NULL; /* a bare IPv6 address */
        if (colon)
            *colon = '\0';
    }
    *slots = k->opts.slots_per_host;
    if (colon) {
        long v = kolorun_parse_long(colon + 1, 1, KOLORUN_MAX_RANKS);
        if (v < 0) {
            snprintf(why, wlen, "host %s: slots must be a whole number from "
                     "1 to %d, not '%s'", line, KOLORUN_MAX_RANKS, colon + 1);
            return -1;
        }
        *slots = (int)v;
    }
    if (!kolorun_host_name_ok(line) || strlen(line) >= nlen) {
        snprintf(why, wlen, "'%s' is not a host name kolorun can use", line);
        return -1;
    }
    snprintf(name, nlen, "%s", line);
    return 0;
}

/* The run of the script failed (killed, exited non-zero, printed too
 * much): 1, having said so once; 0 when its output is to be read. */
static int el_discovery_failed(kolorun_t *k, const char *keep)
{
    const kolorun_elastic_t *e = k->elastic;
    const char *script = k->opts.discovery;
    if (e->dkilled) {
        el_dwarn(k, "the host discovery script '%s' ran longer than %d s "
                 "and was killed; %s", script, EL_DISCOVERY_LIMIT_MS / 1000,
                 keep);
        return 1;
    }
    if (!WIFEXITED(e->dstatus) || WEXITSTATUS(e->dstatus) != 0) {
        char how[128];
        kolorun_describe(e->dstatus, how, sizeof how);
        el_dwarn(k, "the host discovery script '%s' %s; %s", script, how,
                 keep);
        return 1;
    }
    if (e->dlen >= EL_DISCOVERY_CAP) {
        el_dwarn(k, "the host discovery script '%s' printed more than %d "
                 "bytes; %s", script, EL_DISCOVERY_CAP, keep);
        return 1;
    }
    return 0;
}

/* The hosts of one run of the script, in its order, each once. */
typedef struct el_list {
    struct {
        char name[256];
        int slots;
    } *l;
    int n, cap;
} el_list_t;

/* line without the blanks around it. */
static char *el_trim(char *t)
{
    while (*t == ' ' || *t == '\t' || *t == '\r')
        t++;
    size_t len = strlen(t);
    while (len && strchr(" \t\r", t[len - 1]))
        t[--len] = '\0';
    return t;
}

/* Adds host name with its slots; a host listed again is taken once, with
 * the same slots. 0; 1: it is not (why says so); -1: out of memory (the
 * list freed). */
static int el_list_add(el_list_t *list, const char *name, int slots,
                       char *why, size_t wlen)
{
    int dup = -1;
    for (int i = 0; i < list->n; i++)
        if (strcmp(list->l[i].name, name) == 0)
            dup = i;
    if (dup >= 0 && list->l[dup].slots != slots) {
        snprintf(why, wlen, "host %s is listed with %d and with %d slots",
                 name, list->l[dup].slots, slots);
        return 1;
    }
    if (dup >= 0)
        return 0;
    if (list->n == list->cap) {
        void *t2 = realloc(list->l, (size_t)(list->cap *= 2) * sizeof *list->l);
        if (!t2) {
            free(list->l);
            list->l = NULL;
            return -1;
        }
        list->l = t2;
    }
    snprintf(list->l[list->n].name, sizeof list->l[list->n].name, "%s", name);
    list->l[list->n++].slots = slots;
    return 0;
}

/* Parses the script's output (text, changed) into list: all of it first,
 * for a list with a wrong line is not taken at all (half a list would
 * look like hosts removed); why says what is wrong, "" when nothing is.
 * 0, or -1: out of memory (list->l NULL). */
static int el_parse_hosts(const kolorun_t *k, char *text, el_list_t *list,
                          char *why, size_t wlen)
{
    list->n = 0;
    list->cap = 16;
    list->l = malloc((size_t)list->cap * sizeof *list->l);
    for (char *save = NULL, *t = strtok_r(text, "\n", &save); t && list->l;
         t = strtok_r(NULL, "\n", &save)) {
        t = el_trim(t);
        if (!*t)
            continue;
        char name[256];
        int slots;
        if (el_parse_line(k, t, name, sizeof name, &slots, why, wlen) != 0 ||
            el_list_add(list, name, slots, why, wlen) != 0)
            break;
    }
    return list->l ? 0 : -1;
}

/* The list replaces the last one: a host not in it has no slots now.
 * Another host is of no use without a shared rendezvous, said once. */
static void el_take_hosts(kolorun_t *k, const el_list_t *list)
{
    kolorun_elastic_t *e = k->elastic;
    int shared = k->redis_addr[0] || k->opts.rdv_base;
    for (int h = 0; h < k->opts.nhosts; h++)
        e->h[h].listed = 0;
    for (int i = 0; i < list->n; i++) {
        int h = el_host_index(k, list->l[i].name);
        if (h < 0) {
            kolorun_say("out of memory");
            break;
        }
        e->h[h].listed = list->l[i].slots;
        e->h[h].order = i;
        if (!k->opts.hosts[h].local && !shared && !e->h[h].unreachable) {
            e->h[h].unreachable = 1;
            kolorun_say("warning: host %s is another host, and workers there "
                        "cannot reach this host's private rendezvous "
                        "directory (give --redis, --start-redis or "
                        "--rendezvous-dir): not using it", list->l[i].name);
        }
    }
}

/* The run of the script is over: its host list replaces the last one,
 * unless it failed or printed something else, which is said once. */
static void el_discovery_done(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    e->dpid = 0;
    e->druns++;
    const char *keep = e->dgood ? "keeping the hosts it gave before"
                                : "no hosts yet";
    if (el_discovery_failed(k, keep))
        return;
    e->dbuf[e->dlen] = '\0';
    el_list_t list;
    char why[600] = "";
    if (el_parse_hosts(k, e->dbuf, &list, why, sizeof why) != 0) {
        kolorun_say("out of memory");
        return;
    }
    if (why[0]) {
        el_dwarn(k, "the host discovery script '%s' printed a line kolorun "
                 "does not understand (%s); %s", k->opts.discovery, why, keep);
        free(list.l);
        return;
    }
    el_take_hosts(k, &list);
    free(list.l);
    e->dgood = 1;
    e->dirty = 1;
    e->dwarn[0] = '\0'; /* a later problem is said again */
}

static void el_discovery_read(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    for (;;) {
        char junk[4096];
        char *to = e->dlen < EL_DISCOVERY_CAP ? e->dbuf + e->dlen : junk;
        size_t room = e->dlen < EL_DISCOVERY_CAP ? EL_DISCOVERY_CAP - e->dlen
                                                 : sizeof junk;
        ssize_t n = read(e->dfd, to, room);
        if (n > 0) {
            e->dlen += (size_t)n;
            if (e->dlen > EL_DISCOVERY_CAP)
                e->dlen = EL_DISCOVERY_CAP;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        close(e->dfd); /* end of file, or an error: the run is over */
        e->dfd = -1;
        return;
    }
}

static void el_discovery_kill(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    if (e->dpid > 0 && !e->dreaped) {
        kill(-e->dpid, SIGKILL);
        e->dkilled = 1;
    }
}

/* ---- what supervision calls (kolorun_policy_t) and main ------------------- */

static int64_t el_tick(kolorun_t *k);
static int el_fd(const kolorun_t *k);
static void el_read(kolorun_t *k);
static int el_reaped(kolorun_t *k, pid_t pid, int status);
static void el_ended(kolorun_t *k, int w, int status);
static int el_done(const kolorun_t *k);

static const kolorun_policy_t el_policy = {
    .tick = el_tick, .fd = el_fd, .read = el_read, .reaped = el_reaped,
    .ended = el_ended, .done = el_done};

int kolorun_elastic_start(kolorun_t *k)
{
    kolorun_elastic_t *e = calloc(1, sizeof *e);
    if (!e) {
        kolorun_say("out of memory");
        return -1;
    }
    k->elastic = e;
    k->policy = &el_policy;
    e->dfd = -1;
    e->status = -1;
    e->dirty = 1;
    e->start_ms = kolorun_now_ms();
    srand((unsigned)(getpid() ^ (unsigned)k->job_start_us));
    if (el_grow_hosts(k, k->opts.nhosts + 1) != 0) {
        kolorun_say("out of memory");
        return -1;
    }
    /* -H or --hostfile: the fixed hosts, always listed. */
    for (int h = 0; h < k->opts.nhosts; h++) {
        e->h[h].listed = k->opts.hosts[h].slots;
        e->h[h].order = h;
    }
    if (k->opts.discovery) {
        e->dbuf = malloc(EL_DISCOVERY_CAP + 1);
        if (!e->dbuf) {
            kolorun_say("out of memory");
            return -1;
        }
    }
    return 0;
}

/* *next becomes t where t is sooner (never before now): when el_tick
 * must run again. */
static void el_at(int64_t *next, int64_t now, int64_t t)
{
    if (*next < 0 || t < *next)
        *next = t > now ? t : now;
}

/* The discovery script: one run at a time, about once a second, each
 * killed after EL_DISCOVERY_LIMIT_MS, none once the job ends. */
static void el_discovery_tick(kolorun_t *k, int64_t now, int64_t *next)
{
    kolorun_elastic_t *e = k->elastic;
    if (e->dpid > 0 && e->dreaped && e->dfd >= 0 &&
        now - e->dstarted >= EL_DISCOVERY_LIMIT_MS) {
        close(e->dfd); /* something it started holds the pipe */
        e->dfd = -1;
    }
    if (e->dpid > 0 && e->dreaped && e->dfd < 0)
        el_discovery_done(k);
    if (e->dpid > 0 && !e->dkilled &&
        now - e->dstarted >= EL_DISCOVERY_LIMIT_MS)
        el_discovery_kill(k);
    if (k->stopping || e->ended)
        el_discovery_kill(k);
    else if (e->dpid == 0 && now >= e->dnext)
        el_discovery_start(k, now);
    if (e->dpid > 0)
        el_at(next, now, e->dstarted + EL_DISCOVERY_LIMIT_MS);
    else if (!k->stopping && !e->ended)
        el_at(next, now, e->dnext);
}

/* Workers that were removed or stopped with their host: removed ones
 * leave by themselves at their next kolo_init, and one that has not
 * within the elastic timeout gets SIGTERM; SIGKILL follows the grace
 * period. */
static void el_stop_dropped(kolorun_t *k, int64_t now, int64_t *next)
{
    kolorun_elastic_t *e = k->elastic;
    for (int w = 0; w < k->nstarted; w++) {
        el_worker_t *ew = &e->w[w];
        if (!el_alive(k, w) || !ew->dropped)
            continue;
        if (ew->removed_ms && !ew->term_ms) {
            int64_t due = ew->removed_ms +
                          (int64_t)k->opts.elastic_timeout_s * 1000;
            if (now >= due)
                el_terminate(k, w);
            else
                el_at(next, now, due);
        }
        if (ew->term_ms && !k->killed) {
            if (now - ew->term_ms >= KOLORUN_GRACE_MS)
                kolorun_rank_stop(k, w, SIGKILL);
            else
                el_at(next, now, ew->term_ms + KOLORUN_GRACE_MS);
        }
    }
}

/* The driver ended the job: on success whatever still runs was removed,
 * and is stopped now; after a failure the workers get the failure grace
 * to read elastic/end. */
static void el_stop_at_end(kolorun_t *k, int64_t now, int64_t *next)
{
    const kolorun_elastic_t *e = k->elastic;
    if (!e->ended || k->stopping || k->nalive == 0)
        return;
    int64_t due = e->status == 0 ? now : e->end_ms + k->opts.failure_grace_ms;
    if (now >= due)
        kolorun_stop(k, SIGTERM);
    else
        el_at(next, now, due);
}

/* *at becomes t where t is sooner. */
static void el_sooner(int64_t *at, int64_t t)
{
    if (*at < 0 || t < *at)
        *at = t;
}

/* The timed events of el_decide: the end of a failure's settling, the
 * elastic timeout (at the start, or while too few), a cooldown. */
static void el_plan_recheck(kolorun_t *k, int64_t now, int64_t *next)
{
    kolorun_elastic_t *e = k->elastic;
    int64_t at = -1;
    e->recheck_at = 0;
    if (e->ended || k->stopping)
        return;
    if (now < e->settle_until)
        el_sooner(&at, e->settle_until);
    if (e->gen == 0)
        el_sooner(&at, e->start_ms + (int64_t)k->opts.elastic_timeout_s * 1000);
    if (e->wait_since)
        el_sooner(&at, e->wait_since + (int64_t)k->opts.elastic_timeout_s * 1000);
    for (int h = 0; h < k->opts.nhosts; h++)
        if (e->h[h].bl_until > now && e->h[h].bl_until != EL_FOREVER)
            el_sooner(&at, e->h[h].bl_until);
    if (at >= 0) {
        e->recheck_at = at;
        el_at(next, now, at);
    }
}

/* At every turn of the loop: the discovery script, the decisions, the
 * workers to stop; when it next needs to run, or -1. */
static int64_t el_tick(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    int64_t now = kolorun_now_ms(), next = -1;

    if (k->opts.discovery)
        el_discovery_tick(k, now, &next);
    /* Decide when something changed or a timed event is due, and only
     * once the first host list is in (or could not come). */
    if ((!k->opts.discovery || e->druns > 0) &&
        (e->dirty || (e->recheck_at && now >= e->recheck_at)))
        el_decide(k, now);
    /* A signal stopped the job: workers waiting in kolo_init learn it. */
    if (k->stopping && !e->end_written && e->gen > 0) {
        e->end_written = 1;
        kolorun_rdv_set(k, "elastic/end", "kolorun was stopped by a signal\n");
    }
    el_stop_dropped(k, now, &next);
    el_stop_at_end(k, now, &next);
    el_plan_recheck(k, now, &next);
    return next;
}

static int el_fd(const kolorun_t *k)
{
    return k->elastic->dfd;
}

static void el_read(kolorun_t *k)
{
    if (k->elastic->dfd >= 0)
        el_discovery_read(k);
}

static int el_reaped(kolorun_t *k, pid_t pid, int status)
{
    kolorun_elastic_t *e = k->elastic;
    if (pid != e->dpid || e->dpid <= 0)
        return 0;
    e->dreaped = 1;
    e->dstatus = status;
    if (e->dfd >= 0)
        el_discovery_read(k);
    return 1;
}

static void el_ended(kolorun_t *k, int w, int status)
{
    kolorun_elastic_t *e = k->elastic;
    el_worker_t *ew = &e->w[w];
    ew->gone = 1;
    ew->status = status;
    e->dirty = 1;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int rank = el_rank_of(e, w);
    char how[128];
    kolorun_describe(status, how, sizeof how);
    if (k->stopping || e->ended || ew->dropped || rank < 0) {
        if (k->opts.verbose)
            kolorun_say("worker %s:%d (pid %ld) %s (%s)", el_host_name(k, w),
                        ew->slot, (long)k->ranks[w].pid, how,
                        ew->dropped && ew->removed_ms
                            ? "removed from the job"
                        : ew->dropped ? "stopped with its host"
                                      : "the job is ending");
        return;
    }
    if (ok) {
        ew->succeeded = 1;
        e->finishing = 1;
        if (k->opts.verbose)
            kolorun_say("rank %d (%s:%d, pid %ld) %s", rank,
                        el_host_name(k, w), ew->slot, (long)k->ranks[w].pid,
                        how);
        return;
    }
    ew->failed = 1;
    kolorun_say("rank %d of generation %d (%s:%d, pid %ld) %s", rank, e->gen,
                el_host_name(k, w), ew->slot, (long)k->ranks[w].pid, how);
    if (e->finishing) {
        char why[256];
        snprintf(why, sizeof why, "rank %d failed while the job was "
                 "finishing (other ranks had exited 0): the job ends", rank);
        el_end(k, el_exit_code(status), why);
        return;
    }
    el_blacklist(k, ew->host);
    if (!e->failure)
        e->settle_until = kolorun_now_ms() + EL_SETTLE_MS;
    e->failure = 1;
}

static int el_done(const kolorun_t *k)
{
    return k->elastic->ended || k->stopping;
}

int kolorun_elastic_status(const kolorun_t *k)
{
    return k->elastic && k->elastic->ended ? k->elastic->status : -1;
}

/* Worker w's place in the latest generation, as contract §2 derives it. */
static void el_place(const kolorun_t *k, int w, int p[6])
{
    const kolorun_elastic_t *e = k->elastic;
    int rank = el_rank_of(e, w), host = e->w[w].host;
    int local = 0, local_size = 0;
    for (int i = 0; i < e->nmembers; i++) {
        if (e->w[e->members[i]].host != host)
            continue;
        if (i < rank)
            local++;
        local_size++;
    }
    /* cross: the hosts having a member with this local rank, in order of
     * first appearance */
    int cross = 0, cross_size = 0;
    for (int i = 0; i < e->nmembers; i++) {
        int h = e->w[e->members[i]].host, li = 0;
        for (int j = 0; j < i; j++)
            li += e->w[e->members[j]].host == h;
        if (li != local)
            continue;
        if (h == host)
            cross = cross_size;
        cross_size++;
    }
    p[0] = rank;
    p[1] = e->nmembers;
    p[2] = local;
    p[3] = local_size;
    p[4] = cross;
    p[5] = cross_size;
}

/* Starts worker w where the latest generation places it: its place, its
 * id and host as given (the contract: KOLO_HOSTNAME is the host), asked
 * of supervision. 0, or the status that says why not. */
static int el_start_worker(kolorun_t *k, int w)
{
    const el_worker_t *ew = &k->elastic->w[w];
    int p[6], rc = 1;
    char *extra[5] = {
        kolorun_strdupf("KOLO_ELASTIC=1"),
        kolorun_strdupf("HOROVOD_ELASTIC=1"),
        kolorun_strdupf("KOLO_ELASTIC_ID=%s:%d",
                        k->opts.hosts[ew->host].name, ew->slot),
        kolorun_strdupf("KOLO_HOSTNAME=%s", k->opts.hosts[ew->host].name),
        kolorun_strdupf("KOLO_ELASTIC_TIMEOUT=%d",
                        k->opts.elastic_timeout_s)};
    kolorun_place_t place;
    int ok = 1;

    for (int i = 0; i < 5; i++)
        ok &= extra[i] != NULL;
    el_place(k, w, p);
    place = (kolorun_place_t){p[0], p[1], p[2], p[3], p[4], p[5], ew->slot,
                              extra, 5};
    if (ok)
        rc = kolorun_rank_start(k, w, &place);
    else
        kolorun_say("out of memory");
    for (int i = 0; i < 5; i++)
        free(extra[i]);
    return rc;
}

void kolorun_elastic_free(kolorun_t *k)
{
    kolorun_elastic_t *e = k->elastic;
    if (!e)
        return;
    if (e->dpid > 0 && !e->dreaped) {
        kill(-e->dpid, SIGKILL);
        while (waitpid(e->dpid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (e->dfd >= 0)
        close(e->dfd);
    free(e->dbuf);
    free(e->members);
    free(e->w);
    free(e->h);
    free(e);
    k->elastic = NULL;
}
