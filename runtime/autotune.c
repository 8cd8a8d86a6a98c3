/*
 * autotune.c — KOLO_AUTOTUNE=1: the fusion threshold, the chunk size and
 * the cycle time tuned on the live workload.
 *
 * What is measured. A window is KOLO_AUTOTUNE_WINDOW rounds that completed
 * work. Its score is the bytes they moved divided by the background
 * thread's busy time (negotiation plus execution; sleeps and the training
 * loop's own time are left out, so a slower model does not look like a
 * worse setting). The busy time is the slowest rank's: at the end of each
 * window the ranks take the maximum with one allreduce of the controller.
 * Rounds and bytes are the same on every rank (the plan of a round is
 * agreed), so windows end at the same round everywhere, every rank scores
 * the same numbers and takes the same decision: the ranks change settings
 * at the same round without a message of their own, as a fusion plan
 * requires.
 *
 * The search. Coordinate descent over a few values per parameter, one
 * parameter after another (fusion threshold, chunk size, cycle time): for
 * each candidate, one warm-up window that is not scored, then the median of
 * three windows. The first candidate of each parameter is its current value,
 * measured again under the same conditions as the others, and a challenger
 * must beat it by more than 3% to replace it. Why not Bayesian optimisation
 * as Horovod does: three parameters with a handful of meaningful values
 * each, on machines where a single window's noise is ±30%, are better
 * served by repeated medians of a short grid than by a model fitted to
 * single noisy samples; and the rule "the incumbent stays unless clearly
 * beaten" means the settled setting is never slower than the defaults by
 * more than the noise. After the last parameter the settings stay.
 */
#include "autotune.h"

#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)
#define MARGIN 1.03

static const char *const param_names[KOLO__TUNE_PARAMS] = {
    "fusion_threshold", "chunk_bytes", "cycle_time_ms"};

static double get(const kolo__tune_params_t *p, int which)
{
    switch (which) {
    case 0: return (double)p->fusion_threshold;
    case 1: return (double)p->chunk_bytes;
    default: return p->cycle_ms;
    }
}

static void set(kolo__tune_params_t *p, int which, double v)
{
    switch (which) {
    case 0: p->fusion_threshold = (int64_t)v; break;
    case 1: p->chunk_bytes = (int64_t)v; break;
    default: p->cycle_ms = v; break;
    }
}

/* The current value first, then the grid without it. */
static void candidates(kolo__autotune_t *t, int which, const double *grid,
                       int n)
{
    double now = get(&t->cur, which);
    int k = 0;

    t->cand[which][k++] = now;
    for (int i = 0; i < n && k < KOLO__TUNE_MAX_CANDIDATES; i++)
        if (grid[i] != now)
            t->cand[which][k++] = grid[i];
    t->ncand[which] = k;
}

static void plan(kolo__autotune_t *t, int which)
{
    static const double fusion[] = {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB,
                                    128 * MIB};
    static const double chunk[] = {1 * MIB, 4 * MIB, 16 * MIB, 0};
    static const double cycle[] = {1, 2.5, 5, 10};

    if (which == 0)
        candidates(t, 0, fusion, (int)(sizeof(fusion) / sizeof(fusion[0])));
    else if (which == 1)
        candidates(t, 1, chunk, (int)(sizeof(chunk) / sizeof(chunk[0])));
    else
        candidates(t, 2, cycle, (int)(sizeof(cycle) / sizeof(cycle[0])));
}

void kolo__autotune_init(kolo__autotune_t *t, const kolo__tune_params_t *dflt,
                         int window_rounds)
{
    memset(t, 0, sizeof(*t));
    t->dflt = t->cur = *dflt;
    t->window_rounds = window_rounds > 0 ? window_rounds : 1;
    t->sample = -1;
    plan(t, 0);
}

int kolo__autotune_round(kolo__autotune_t *t, int64_t bytes, int64_t busy_us)
{
    if (kolo__autotune_settled(t))
        return 0; /* settled: nothing more to measure */
    t->rounds++;
    t->bytes += bytes;
    t->busy_us += busy_us;
    return t->rounds >= t->window_rounds;
}

double kolo__autotune_busy_s(const kolo__autotune_t *t)
{
    return (double)t->busy_us * 1e-6;
}

int kolo__autotune_settled(const kolo__autotune_t *t)
{
    return t->param >= KOLO__TUNE_PARAMS;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v)
{
    double s[KOLO__TUNE_SAMPLES];
    memcpy(s, v, sizeof(s));
    qsort(s, KOLO__TUNE_SAMPLES, sizeof(double), cmp_double);
    return s[KOLO__TUNE_SAMPLES / 2];
}

/* All candidates of the parameter measured: keep the best. */
static void decide(kolo__autotune_t *t)
{
    int p = t->param, best = 0;
    double best_score = median(t->scores[0]);

    for (int c = 1; c < t->ncand[p]; c++) {
        double m = median(t->scores[c]);
        if (m > best_score * MARGIN && m > median(t->scores[best])) {
            best = c;
            best_score = m;
        }
    }
    set(&t->cur, p, t->cand[p][best]);
    t->param++;
    t->ci = 0;
    if (t->param < KOLO__TUNE_PARAMS)
        plan(t, t->param);
}

void kolo__autotune_window(kolo__autotune_t *t, double max_busy_s,
                           kolo__tune_row_t *row)
{
    double score = (double)t->bytes / (max_busy_s > 1e-9 ? max_busy_s : 1e-9);

    row->window = t->windows++;
    row->parameter = kolo__autotune_settled(t) ? "settled" : param_names[t->param];
    row->params = t->cur;
    row->bytes = t->bytes;
    row->busy_s = max_busy_s;
    row->score = score;
    row->warmup = !kolo__autotune_settled(t) && t->sample < 0;
    t->rounds = 0;
    t->bytes = 0;
    t->busy_us = 0;
    if (kolo__autotune_settled(t))
        return;
    if (t->sample < 0) {
        t->sample = 0;
        return;
    }
    t->scores[t->ci][t->sample++] = score;
    if (t->sample < KOLO__TUNE_SAMPLES)
        return;
    t->sample = -1;
    if (++t->ci == t->ncand[t->param])
        decide(t);
    if (!kolo__autotune_settled(t))
        set(&t->cur, t->param, t->cand[t->param][t->ci]);
}
