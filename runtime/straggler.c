/*
 * straggler.c — which rank the others keep waiting for, said while the job
 * runs.
 *
 * DESIGN
 *
 * A round that makes tensors ready ends on every rank at about the same
 * time; before it, each rank waited from its own last enqueue of the
 * plan's tensors. That wait is this rank's own measure (a difference of its
 * own clock, so ranks on other hosts compare too): the rank that came last
 * waited least, and the first came waited longest. After every WINDOW such
 * rounds (the plans are the same everywhere, so every rank counts the same
 * rounds) the set's members gather their waits on the coordinator, one
 * small gather per WINDOW rounds. The coordinator then judges each round:
 * the last rank is the one that waited least, and it was late by the
 * longest wait less its own.
 *
 * Per rank it keeps, over the job: how often it was last, how long the
 * others waited for it in all, and its last RING latenesses (their median
 * is what the end of the job says); and over the last NWIN windows the same
 * counts, which is what the warning looks at. A rank that accounts for at
 * least WAIT_SHARE of all the waiting of those windows, the others having
 * waited for it at least KOLO_STRAGGLER_SHARE of their time (default 0.2:
 * a fifth of every step), is a straggler: one warning names it, how late, over what
 * window, and another only when the straggler changes (or the job is no
 * longer held back, and then is again). In a balanced job the last rank
 * changes from round to round and the waits are short: no warning.
 *
 * The figures go into the flight recorder's dumps (flight.h), and at the
 * end of the job rank 0 writes one line on the latest rank to
 * KOLO_FLIGHT_DIR/stragglers.txt, which kolorun prints.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "complete.h"
#include "flight.h"
#include "straggler.h"

#define WINDOW 32     /* rounds per gather */
#define NWIN 8        /* windows the warning looks at */
#define RING 256      /* latenesses kept per rank, for the median */
#define MIN_LATE_US 1000 /* a wait shorter than this is no lateness */
#define WAIT_SHARE 0.6 /* of all the waiting, for one rank */

typedef struct per_rank {
    uint64_t last;                 /* rounds it came last, whole job */
    double late_s;                 /* the others' wait for it, whole job */
    int32_t ring[RING];            /* its latest latenesses (us) as last */
    uint32_t nring;
    uint32_t win_last[NWIN];       /* per window of the last NWIN */
    double win_late[NWIN];
} per_rank_t;

struct kolo__straggler {
    int size, n;                   /* members; rounds in this window */
    int32_t mine[WINDOW];          /* this rank's waits (us) */
    int32_t *all;                  /* [size * WINDOW], the coordinator's */
    per_rank_t *ranks;             /* [size], the coordinator's */
    int64_t start_us;              /* the first judged round */
    int64_t win_start[NWIN];       /* each window's first round */
    int win;                       /* the window being filled */
    uint64_t rounds;               /* rounds in which a rank came late */
    uint64_t rounds_all;           /* rounds gathered */
    int warned;                    /* the rank warned of, or -1 */
};

int kolo__straggler_new(kolo__pset_t *ps)
{
    kolo__straggler_t *s;

    if (ps->rt->cfg.straggler_share <= 0 || ps->size < 2)
        return 0;
    s = kolo__calloc(1, sizeof(*s));
    if (s == NULL)
        return -1;
    s->size = ps->size;
    s->warned = -1;
    if (ps->rank == 0) {
        s->all = kolo__calloc((size_t)ps->size * WINDOW, sizeof(int32_t));
        s->ranks = kolo__calloc((size_t)ps->size, sizeof(per_rank_t));
        if (s->all == NULL || s->ranks == NULL) {
            kolo__straggler_free(s);
            return -1;
        }
    }
    ps->neg.straggler = s;
    return 0;
}

void kolo__straggler_free(kolo__straggler_t *s)
{
    if (s != NULL) {
        free(s->all);
        free(s->ranks);
        free(s);
    }
}

/* ---- the coordinator's judgement --------------------------------------- */

/* Round k of the window: who came last, and how late; a round in which
 * nobody waited MIN_LATE_US says nothing (the ranks came together, as in
 * every round of a step after its first) and is not counted. */
static int judge_round(kolo__straggler_t *s, int k)
{
    int last = 0, n = 0;
    int32_t lo = INT32_MAX, hi = 0;

    for (int r = 0; r < s->size; r++) {
        int32_t w = s->all[(size_t)r * WINDOW + (size_t)k];
        if (w < 0) /* no tensor of its own in the round (joined) */
            continue;
        n++;
        if (w < lo) {
            lo = w;
            last = r;
        }
        if (w > hi)
            hi = w;
    }
    if (n < 2 || hi - lo < MIN_LATE_US)
        return 0;
    per_rank_t *p = &s->ranks[last];
    p->last++;
    p->late_s += (double)(hi - lo) / 1e6;
    p->ring[p->nring++ % RING] = hi - lo;
    p->win_last[s->win]++;
    p->win_late[s->win] += (double)(hi - lo) / 1e6;
    return 1;
}

/* Over the last NWIN windows: the rank the others waited for longest, the
 * share of the rounds it came last, its share of all the waiting, and the
 * share of the time the others waited for it. */
typedef struct leader {
    int rank;
    double last_share, wait_share, time_share, span_s;
    uint64_t rounds;
} leader_t;

static leader_t window_leader(const kolo__straggler_t *s, int64_t now)
{
    leader_t l = {0, 0, 0, 0, 0, 0};
    int64_t first = now;
    uint64_t most_last = 0;
    double most = -1, all = 0;

    for (int w = 0; w < NWIN; w++)
        if (s->win_start[w] != 0 && s->win_start[w] < first)
            first = s->win_start[w];
    for (int r = 0; r < s->size; r++) {
        uint64_t c = 0;
        double late = 0;
        for (int w = 0; w < NWIN; w++) {
            c += s->ranks[r].win_last[w];
            late += s->ranks[r].win_late[w];
        }
        l.rounds += c;
        all += late;
        if (late > most) {
            most = late;
            most_last = c;
            l.rank = r;
        }
    }
    l.span_s = (double)(now - first) / 1e6;
    l.last_share = l.rounds ? (double)most_last / (double)l.rounds : 0;
    l.wait_share = all > 0 ? most / all : 0;
    l.time_share = l.span_s > 0 ? most / l.span_s : 0;
    return l;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The median of rank r's kept latenesses, in seconds. */
static double median_late_s(const per_rank_t *p)
{
    int32_t v[RING];
    uint32_t n = p->nring < RING ? p->nring : RING;

    if (n == 0)
        return 0;
    memcpy(v, p->ring, n * sizeof(int32_t));
    qsort(v, n, sizeof(int32_t), cmp_i32);
    return (double)v[n / 2] / 1e6;
}

/* Warns when the window's leader holds the job back (see the essay). */
static void maybe_warn(kolo__pset_t *ps, kolo__straggler_t *s, int64_t now)
{
    double share = ps->rt->cfg.straggler_share;
    leader_t l = window_leader(s, now);
    int held = l.rounds >= (uint64_t)WINDOW && l.wait_share >= WAIT_SHARE &&
               l.time_share >= share;

    if (!held) {
        if (s->warned >= 0 && l.time_share < share / 2)
            s->warned = -1; /* no longer held back */
        return;
    }
    if (l.rank == s->warned)
        return;
    s->warned = l.rank;
    kolo__log(KOLO__LOG_WARNING,
              "straggler: rank %d kept the others waiting %.0f%% of the last "
              "%.1f s (it came last in %.0f%% of %llu rounds in which a rank "
              "was late, a median "
              "%.0f ms after the first; KOLO_STRAGGLER_SHARE=%g): it computes "
              "slower, or its host, GPU or data loading is busier",
              ps->ranks[l.rank], l.time_share * 100, l.span_s,
              l.last_share * 100, (unsigned long long)l.rounds,
              median_late_s(&s->ranks[l.rank]) * 1e3, share);
}

/* ---- the figures, for the dumps and the end of the job ------------------ */

/* The rank the others waited for longest over the job; -1 before any
 * round. */
static int job_leader(const kolo__straggler_t *s)
{
    int best = -1;
    double most = -1;

    for (int r = 0; r < s->size && s->rounds > 0; r++)
        if (s->ranks[r].late_s > most) {
            most = s->ranks[r].late_s;
            best = r;
        }
    return best;
}

static void publish(kolo__pset_t *ps, kolo__straggler_t *s, int64_t now)
{
    char json[2048];
    size_t used;
    double span = (double)(now - s->start_us) / 1e6;
    char warned[16] = "null";

    if (s->rounds == 0) /* no rank was late yet: nothing to say */
        return;
    if (s->warned >= 0)
        snprintf(warned, sizeof(warned), "%d", ps->ranks[s->warned]);
    used = (size_t)snprintf(json, sizeof(json),
                            "{\"window_s\": %.3f, \"rounds\": %llu, "
                            "\"warned\": %s, \"ranks\": [",
                            span, (unsigned long long)s->rounds, warned);
    for (int r = 0; r < s->size && used < sizeof(json) - 160; r++)
        used += (size_t)snprintf(
            json + used, sizeof(json) - used,
            "%s{\"rank\": %d, \"last_share\": %.3f, \"median_late_s\": "
            "%.6f, \"late_share_of_time\": %.3f}",
            r ? ", " : "", ps->ranks[r],
            s->rounds ? (double)s->ranks[r].last / (double)s->rounds : 0,
            median_late_s(&s->ranks[r]),
            span > 0 ? s->ranks[r].late_s / span : 0);
    snprintf(json + used, sizeof(json) - used, "]}");
    kolo__flight_set_stragglers(ps, json);
}

void kolo__straggler_line(const kolo__pset_t *ps, char *out, size_t len)
{
    const kolo__straggler_t *s = ps->neg.straggler;
    int r;

    out[0] = '\0';
    if (s == NULL || s->ranks == NULL || (r = job_leader(s)) < 0)
        return;
    snprintf(out, len,
             "latest rank: %d, last in %.0f%% of the %llu rounds (of %llu) in "
             "which a rank was 1 ms late or more, over %.1f s, "
             "median %.1f ms late; the others waited for it %.0f%% of the "
             "time",
             ps->ranks[r], 100.0 * (double)s->ranks[r].last / (double)s->rounds,
             (unsigned long long)s->rounds, (unsigned long long)s->rounds_all,
             (double)(kolo__now_us() - s->start_us) / 1e6,
             median_late_s(&s->ranks[r]) * 1e3,
             100.0 * s->ranks[r].late_s /
                 ((double)(kolo__now_us() - s->start_us) / 1e6 + 1e-9));
}

void kolo__straggler_write(const kolo__pset_t *ps)
{
    const char *dir = ps->rt->cfg.flight_dir;
    char line[512], path[4200], tmp[4240];
    FILE *f;

    kolo__straggler_line(ps, line, sizeof(line));
    if (line[0] == '\0' || dir[0] == '\0' || ps->rt->cfg.flight_recorder == 0)
        return; /* (KOLO_FLIGHT_RECORDER=0: no flight files at all) */
    snprintf(path, sizeof(path), "%s/stragglers.txt", dir);
    snprintf(tmp, sizeof(tmp), "%s/.stragglers.txt.%ld.tmp", dir, (long)getpid());
    f = fopen(tmp, "we");
    if (f == NULL)
        return; /* (the flight recorder has said that DIR cannot be written) */
    fprintf(f, "%s\n", line);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        unlink(tmp);
}

/* ---- every rank, every round ------------------------------------------- */

/* This rank's wait before the round that made the plan ready: from its
 * latest enqueue among the plan's tensors. */
static int32_t own_wait(const kolo__pset_t *ps, int64_t now)
{
    int64_t latest = 0;

    for (size_t i = 0; i < ps->nready; i++)
        if (ps->ready[i] != NULL && ps->ready[i]->enqueued_us > latest)
            latest = ps->ready[i]->enqueued_us;
    if (latest == 0) /* a joined rank's stand-ins only: it waits for none */
        return -1;
    if (now <= latest)
        return 0;
    return now - latest > INT32_MAX ? INT32_MAX : (int32_t)(now - latest);
}

/* The window is full: the coordinator gathers every rank's waits and
 * judges them. */
static int window_end(kolo__pset_t *ps, kolo__straggler_t *s, int64_t now,
                      kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN];
    int rc = ps->ctl_ops->gather(ps->ctl_ctx, s->mine, s->all, sizeof(s->mine),
                                 0, detail, sizeof(detail));

    s->n = 0;
    if (rc != KOLO_OK)
        return kolo__fail_backend(ps, rc, detail, err,
                                  "the gather of the ranks' waits (stragglers)");
    if (ps->rank != 0)
        return KOLO_OK;
    for (int k = 0; k < WINDOW; k++)
        s->rounds += (uint64_t)judge_round(s, k);
    s->rounds_all += WINDOW;
    maybe_warn(ps, s, now);
    publish(ps, s, now);
    /* The next window replaces the oldest. */
    s->win = (s->win + 1) % NWIN;
    s->win_start[s->win] = now;
    for (int r = 0; r < s->size; r++) {
        s->ranks[r].win_last[s->win] = 0;
        s->ranks[r].win_late[s->win] = 0;
    }
    return KOLO_OK;
}

int kolo__straggler_round(kolo__pset_t *ps, kolo__err_t *err)
{
    kolo__straggler_t *s = ps->neg.straggler;
    int64_t now;

    if (s == NULL || ps->nready == 0)
        return KOLO_OK;
    now = kolo__now_us();
    if (s->start_us == 0) {
        s->start_us = now;
        s->win_start[0] = now;
    }
    s->mine[s->n++] = own_wait(ps, now);
    return s->n == WINDOW ? window_end(ps, s, now, err) : KOLO_OK;
}
