/*
 * stall.c — what the ranks learn when a tensor waits for a rank that does
 * not come: the stall inspector's warnings and shutdown, and the proof of a
 * deadlock.
 *
 * DESIGN
 *
 * What every round says of each rank. Besides its tensors, every rank
 * tells the others in each round's vector (negotiate.c) whether its
 * training thread is blocked in kolo_wait with everything it enqueued in
 * the set already taken by the background thread (flight.h), and whether
 * it has tensors waiting on cache bits. kolo__stall_observe reads that
 * after every round, on every rank alike: `blocked` per rank, since when
 * every rank has been blocked with nothing ready (all_blocked_us), and, on
 * the coordinator, since when each rank has not been seen blocked
 * (outside_us: its training thread has been in its own code, or at least
 * not waiting inside kolo, that long).
 *
 * Stalls. The coordinator's table (negotiate.c) holds every name some rank
 * has sent it, with which ranks did and since when each has waited (the
 * requests carry their age, so a wait counts from the enqueue, not from
 * when a cached tensor went to the coordinator). Names some ranks have
 * enqueued and others not for KOLO_STALL_CHECK_TIME_SECONDS give one
 * warning per check time, naming each missing rank, what it misses and
 * where its training thread is: outside kolo for how long ("stuck in its
 * own code"), or waiting inside kolo; after KOLO_STALL_SHUTDOWN_TIME_SECONDS
 * the job stops on every rank with the same list. Both ask every rank for
 * a flight-recorder dump (flight.h).
 *
 * Deadlocks. When every rank is blocked inside kolo with nothing ready,
 * none of them can enqueue anything more (a rank's collectives come from
 * its training thread), so the tensors they wait for can never all be
 * enqueued: the job is deadlocked, not stalled. Once that has lasted half of
 * KOLO_DEADLOCK_CHECK_SECONDS, every rank sends what waits on cache bits to
 * the coordinator (negotiate.c invalidates those bits), so that its table
 * holds every waiting name; once it has lasted the whole, and no rank has
 * anything left on a bit, the coordinator stops the job on every rank with
 * both sides named: which rank skipped which tensor (the others' Nth
 * collective) and what it waits on instead. Horovod would hang there.
 * A program that enqueues from another thread while its training thread
 * waits could be taken for deadlocked: KOLO_DEADLOCK_CHECK_SECONDS=0 (or
 * KOLO_STALL_CHECK_DISABLE=1) turns the check off. There is no proof while
 * a rank is joined (kolo.torch's join waits in one thread while another
 * steps the optimizer), nor in a job that added process sets (a rank
 * blocked on another set's handle is not stuck in this one): the stall
 * inspector speaks there.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "flight.h"
#include "stall.h"

#define BIT_GET(words, b) (((words)[(b) / 64] >> ((b) % 64)) & 1ULL)

enum { MAX_RANKS = 8, MAX_NAMES = 5 };

int kolo__stall_init(kolo__pset_t *ps)
{
    ps->neg.blocked = kolo__calloc((size_t)ps->size, 1);
    ps->neg.outside_us = kolo__calloc((size_t)ps->size, sizeof(int64_t));
    return ps->neg.blocked != NULL && ps->neg.outside_us != NULL ? 0 : -1;
}

void kolo__stall_free(kolo__pset_t *ps)
{
    free(ps->neg.blocked);
    free(ps->neg.outside_us);
    ps->neg.blocked = NULL;
    ps->neg.outside_us = NULL;
}

int64_t kolo__stall_half_us(const kolo__pset_t *ps)
{
    const kolo__config_t *cfg = &ps->rt->cfg;
    double limit = cfg->stall_check_s > 0 ? cfg->stall_check_s
                                          : cfg->stall_shutdown_s;
    return limit > 0 ? (int64_t)(limit * 5e5) : 0;
}

void kolo__stall_observe(kolo__pset_t *ps, const uint64_t *blocked_words,
                         int hits_anywhere)
{
    int64_t now = kolo__now_us();
    int all = 1;

    for (int r = 0; r < ps->size; r++) {
        int b = !BIT_GET(blocked_words, (size_t)r);
        ps->neg.blocked[r] = (uint8_t)b;
        all &= b;
        if (b)
            ps->neg.outside_us[r] = 0;
        else if (ps->neg.outside_us[r] == 0)
            ps->neg.outside_us[r] = now;
    }
    ps->neg.hits_anywhere = hits_anywhere;
    /* No proof while a rank is joined (kolo.torch's join waits in one
     * thread while another computes) or where other process sets exist (a
     * rank blocked on one of their handles is not blocked in this set). */
    if (!all || ps->nready > 0 || !ps->neg.any_pending || ps->size < 2 ||
        ps->neg.njoined > 0 || ps->neg.join_entry != NULL ||
        atomic_load(&ps->rt->other_sets))
        ps->neg.all_blocked_us = 0;
    else if (ps->neg.all_blocked_us == 0)
        ps->neg.all_blocked_us = now;
}

/* How long every rank has been blocked with nothing ready (0: not). */
static int64_t all_blocked_for(const kolo__pset_t *ps, int64_t now)
{
    return ps->neg.all_blocked_us != 0 ? now - ps->neg.all_blocked_us : 0;
}

static int64_t deadlock_us(const kolo__pset_t *ps)
{
    return (int64_t)(ps->rt->cfg.deadlock_check_s * 1e6);
}

int kolo__stall_release_hits(const kolo__pset_t *ps, int64_t now)
{
    int64_t limit = deadlock_us(ps);
    return limit > 0 && ps->neg.nhits > 0 &&
           all_blocked_for(ps, now) * 2 >= limit;
}

/* ---- text ------------------------------------------------------------- */

typedef struct text {
    char *buf;
    size_t len, used;
} text_t;

static void say(text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void say(text_t *t, const char *fmt, ...)
{
    va_list ap;
    int k;

    if (t->used >= t->len)
        return;
    va_start(ap, fmt);
    k = vsnprintf(t->buf + t->used, t->len - t->used, fmt, ap);
    va_end(ap);
    if (k > 0)
        t->used += (size_t)k < t->len - t->used ? (size_t)k
                                                 : t->len - t->used - 1;
}

/* "5th", "21st", "112th". */
static const char *ordinal(uint64_t n)
{
    if (n % 100 >= 11 && n % 100 <= 13)
        return "th";
    return n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
}

/* The first rank that has p, or -1. */
static int first_having(const kolo__pset_t *ps, const kolo__pending_name_t *p)
{
    for (int r = 0; r < ps->size; r++)
        if (p->have[r])
            return r;
    return -1;
}

/* "'grad.b' (the 21st collective of rank 0)" */
static void say_missed(text_t *t, const kolo__pset_t *ps,
                       const kolo__pending_name_t *p)
{
    int h = first_having(ps, p);

    say(t, "'%.100s'", p->name);
    if (h >= 0 && p->seq[h] > 0)
        say(t, " (the %llu%s collective of rank %d)",
            (unsigned long long)p->seq[h], ordinal(p->seq[h]), ps->ranks[h]);
}

/* Where rank r's training thread is, as the rounds saw it. */
static void say_where(text_t *t, const kolo__pset_t *ps, int r, int64_t now)
{
    if (ps->neg.outside_us[r] != 0)
        say(t, "; rank %d has been outside kolo for %.1f s (in its own "
            "code)", ps->ranks[r], (double)(now - ps->neg.outside_us[r]) / 1e6);
    else if (ps->neg.blocked[r])
        say(t, "; rank %d is waiting inside kolo", ps->ranks[r]);
}

/* ---- the stall inspector ---------------------------------------------- */

/* Whether rank r lacks p, which has waited at least limit_us. */
static int lacks(const kolo__pset_t *ps, const kolo__pending_name_t *p, int r,
                 int64_t now, int64_t limit_us)
{
    return !p->have[r] && !ps->neg.joined[r] &&
           now - p->waited_from_us >= limit_us;
}

/* "rank 1 is missing 'x' (61 s), 'y' (61 s)"; how many names that is. */
static int say_missing(text_t *t, const kolo__pset_t *ps, int r, int64_t now,
                       int64_t limit_us)
{
    size_t it = 0;
    void *v;
    int listed = 0, more = 0;

    while (kolo__map_next(&ps->neg.table, &it, NULL, &v)) {
        const kolo__pending_name_t *p = v;
        if (!lacks(ps, p, r, now, limit_us))
            continue;
        if (listed == MAX_NAMES) {
            more++;
            continue;
        }
        say(t, "%s'%.100s' (%.0f s)", listed ? ", " : "", p->name,
            (double)(now - p->waited_from_us) / 1e6);
        listed++;
    }
    if (more)
        say(t, " and more");
    return listed + more;
}

/* The longest wait of a name some rank lacks. */
static int64_t oldest_wait(const kolo__pset_t *ps, int64_t now)
{
    int64_t oldest = 0;

    for (int r = 0; r < ps->size; r++) {
        size_t it = 0;
        void *v;
        while (kolo__map_next(&ps->neg.table, &it, NULL, &v))
            if (lacks(ps, v, r, now, 0) &&
                now - ((const kolo__pending_name_t *)v)->waited_from_us > oldest)
                oldest = now - ((const kolo__pending_name_t *)v)->waited_from_us;
    }
    return oldest;
}

/* Whether rank r lacks any name that waited at least limit_us. */
static int rank_lacks(const kolo__pset_t *ps, int r, int64_t now,
                      int64_t limit_us)
{
    size_t it = 0;
    void *v;

    while (kolo__map_next(&ps->neg.table, &it, NULL, &v))
        if (lacks(ps, v, r, now, limit_us))
            return 1;
    return 0;
}

/* Writes which ranks miss which tensors, and where those ranks are: the
 * ranks missing a tensor that has waited limit_us (culprits), or the
 * others missing some (!culprits), each with what it misses that has
 * waited names_us; returns how many tensors that is, and in *outside how
 * many of those ranks are outside kolo. */
static int stall_report(const kolo__pset_t *ps, int64_t now, int64_t limit_us,
                        int64_t names_us, int culprits, text_t *t,
                        int *outside)
{
    int nstalled = 0, nranks = 0;

    for (int r = 0; r < ps->size && nranks < MAX_RANKS; r++) {
        int old = rank_lacks(ps, r, now, limit_us);
        if (culprits ? !old : old || !rank_lacks(ps, r, now, 0))
            continue;
        say(t, "%srank %d is missing ", t->used ? "; " : "", ps->ranks[r]);
        nstalled += say_missing(t, ps, r, now, names_us);
        say_where(t, ps, r, now);
        *outside += ps->neg.outside_us[r] != 0;
        nranks++;
    }
    return nstalled;
}

static const char hint_outside[] =
    "stall: a rank outside kolo all this time is stuck in its own code (a "
    "loop, I/O, data loading, a lock?): every rank has written a dump with "
    "what it was doing (a Python rank's dump has its threads' stacks) to "
    "KOLO_FLIGHT_DIR (kolorun's is named at the end; `kill -USR1` to "
    "kolorun writes them again); `kolo-timeline why DIR` reads them";
static const char hint_inside[] =
    "stall: this usually means that a rank skipped a collective the others "
    "ran (a condition true on some ranks only) or ran fewer steps (uneven "
    "data: hvd.join() lets the others finish); to end the job instead of "
    "waiting, set KOLO_STALL_SHUTDOWN_TIME_SECONDS (kolorun "
    "--stall-check-shutdown-time-seconds S)";

static void stall_shutdown(kolo__pset_t *ps, int64_t now)
{
    const kolo__config_t *cfg = &ps->rt->cfg;
    char list[KOLO__MSG_MAX_TEXT - 200];
    text_t t = {list, sizeof(list), 0};
    int64_t limit = (int64_t)(cfg->stall_shutdown_s * 1e6);
    int outside;

    /* The ranks that crossed the limit first, then everything some rank
     * is missing now (two ranks, each waiting for what the other never
     * sends, cross it milliseconds apart). */
    list[0] = '\0';
    stall_report(ps, now, limit, 0, 1, &t, &outside);
    stall_report(ps, now, limit, 0, 0, &t, &outside);
    kolo__err_set(&ps->neg.stall_fatal, KOLO_ERR_TIMEOUT,
                  "stall: ranks waited more than %g s "
                  "(KOLO_STALL_SHUTDOWN_TIME_SECONDS) for tensors other "
                  "ranks never enqueued: %s",
                  cfg->stall_shutdown_s, list);
    kolo__log(KOLO__LOG_ERROR, "%s", ps->neg.stall_fatal.msg);
    kolo__flight_dump_all(ps->rt, "stall shutdown");
}

static void stall_warn(kolo__pset_t *ps, int64_t now, const char *list,
                       int outside)
{
    const kolo__config_t *cfg = &ps->rt->cfg;

    ps->neg.stall_warned_us = now;
    kolo__log(KOLO__LOG_WARNING,
              "stall: some ranks have waited more than %g s "
              "(KOLO_STALL_CHECK_TIME_SECONDS) for tensors other ranks "
              "have not enqueued: %s",
              cfg->stall_check_s, list);
    /* (after the list, which may be long; each kind of hint once) */
    if (outside && !(ps->neg.stall_hinted & 2))
        kolo__log(KOLO__LOG_WARNING, "%s", hint_outside);
    else if (!outside && !(ps->neg.stall_hinted & 1))
        kolo__log(KOLO__LOG_WARNING, "%s", hint_inside);
    ps->neg.stall_hinted |= outside ? 2 : 1;
    kolo__flight_dump_all(ps->rt, "stall warning");
}

/* ---- the deadlock ----------------------------------------------------- */

/* A name most ranks have enqueued: a rank without it skipped it (with as
 * many ranks on each side, nobody can say who went astray). */
static int expected(const kolo__pset_t *ps, const kolo__pending_name_t *p)
{
    return p->nhave * 2 > ps->size;
}

/* Whether rank r lacks a name most ranks have. */
static int skipped_some(const kolo__pset_t *ps, int r)
{
    size_t it = 0;
    void *v;

    if (ps->neg.joined[r])
        return 0;
    while (kolo__map_next(&ps->neg.table, &it, NULL, &v))
        if (!((const kolo__pending_name_t *)v)->have[r] && expected(ps, v))
            return 1;
    return 0;
}

/* "'a' (its 21st), 'b'": the names rank r has (have = 1; with_seq: with
 * their place in its enqueues), or the expected names it lacks (have = 0,
 * each with its place on a rank that has it). */
static void say_names(text_t *t, const kolo__pset_t *ps, int r, int have,
                      int with_seq)
{
    size_t it = 0;
    void *v;
    int n = 0;

    while (kolo__map_next(&ps->neg.table, &it, NULL, &v)) {
        const kolo__pending_name_t *p = v;
        if (have ? !p->have[r] : p->have[r] || !expected(ps, p))
            continue;
        if (n == MAX_NAMES) {
            say(t, " and more");
            return;
        }
        say(t, "%s", n++ ? ", " : "");
        if (!have)
            say_missed(t, ps, p);
        else if (with_seq && p->seq[r] > 0)
            say(t, "'%.100s' (its %llu%s)", p->name,
                (unsigned long long)p->seq[r], ordinal(p->seq[r]));
        else
            say(t, "'%.100s'", p->name);
    }
    if (n == 0)
        say(t, "a collective of another process set");
}

/* The ranks that skipped nothing, and what they wait on: "ranks 0, 1 wait
 * on 'grad.b'". */
static void say_waiters(text_t *t, const kolo__pset_t *ps)
{
    int n = 0, last = -1;

    for (int r = 0; r < ps->size; r++)
        if (!skipped_some(ps, r)) {
            n++;
            last = r;
        }
    if (n == 0)
        return;
    say(t, "; %s ", n == 1 ? "rank" : "ranks");
    for (int r = 0, k = 0; r < ps->size; r++)
        if (!skipped_some(ps, r))
            say(t, "%s%d", k++ ? ", " : "", ps->ranks[r]);
    say(t, " wait%s on ", n == 1 ? "s" : "");
    say_names(t, ps, last, 1, 0);
}

/* No side has most ranks: each rank's wait, with its place. */
static void say_diverged(text_t *t, const kolo__pset_t *ps)
{
    say(t, "the ranks went different ways: ");
    for (int r = 0, n = 0; r < ps->size && n < MAX_RANKS; r++, n++) {
        say(t, "%srank %d waits on ", n ? "; " : "", ps->ranks[r]);
        say_names(t, ps, r, 1, 1);
    }
}

static void deadlock_text(const kolo__pset_t *ps, char *out, size_t len)
{
    text_t t = {out, len, 0};
    int n = 0;

    say(&t, "deadlock: ");
    for (int r = 0; r < ps->size && n < MAX_RANKS; r++) {
        if (!skipped_some(ps, r))
            continue;
        say(&t, "%srank %d skipped ", n++ ? "; " : "", ps->ranks[r]);
        say_names(&t, ps, r, 0, 0);
        say(&t, " and waits on ");
        say_names(&t, ps, r, 1, 1);
    }
    if (n > 0)
        say_waiters(&t, ps);
    else
        say_diverged(&t, ps);
    say(&t, ". Every rank is waiting inside kolo, so none of these can "
        "ever be enqueued: a collective that some ranks run and others "
        "skip (a condition true on some ranks only?). Horovod would hang "
        "here; KOLO_DEADLOCK_CHECK_SECONDS=0 waits as it does");
}

/* The proof (see the essay): every rank blocked with nothing ready for
 * the whole check time, nothing left on a cache bit, and names waiting. */
static int deadlocked(const kolo__pset_t *ps, int64_t now)
{
    int64_t limit = deadlock_us(ps);

    return limit > 0 && all_blocked_for(ps, now) >= limit &&
           !ps->neg.hits_anywhere && ps->neg.table.count > 0;
}

static void deadlock_stop(kolo__pset_t *ps)
{
    char text[KOLO__MSG_MAX_TEXT - 200];

    deadlock_text(ps, text, sizeof(text));
    kolo__err_set(&ps->neg.stall_fatal, KOLO_ERR_MISMATCH, "%s", text);
    kolo__log(KOLO__LOG_ERROR, "%s", text);
    kolo__flight_dump_all(ps->rt, "deadlock");
}

void kolo__stall_check(kolo__pset_t *ps)
{
    const kolo__config_t *cfg = &ps->rt->cfg;
    int64_t now = kolo__now_us(), check = (int64_t)(cfg->stall_check_s * 1e6);
    char list[KOLO__MSG_MAX_TEXT - 200];
    text_t t = {list, sizeof(list), 0};
    int outside;

    list[0] = '\0';
    if (ps->rank != 0 || ps->neg.table.count == 0 ||
        ps->neg.stall_fatal.code != KOLO_OK)
        return;
    if (deadlocked(ps, now)) {
        deadlock_stop(ps);
        return;
    }
    if (cfg->stall_shutdown_s > 0 &&
        oldest_wait(ps, now) >= (int64_t)(cfg->stall_shutdown_s * 1e6)) {
        stall_shutdown(ps, now);
        return;
    }
    if (cfg->stall_check_s > 0 && now - ps->neg.stall_warned_us >= check &&
        stall_report(ps, now, check, check, 1, &t, &outside) > 0)
        stall_warn(ps, now, list, outside);
}
