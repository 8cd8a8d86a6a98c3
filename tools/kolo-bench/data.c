/*
 * data.c — data and checks: what every rank puts in its tensors, and the
 * check of every result against the sum that the ranks' inputs give.
 */
#define _GNU_SOURCE

#include "config.h"

#include <math.h>
#include <stdio.h>

#include "bench.h"

/* Rank r holds 1 + ((r + t + i) & 7) at element i of tensor t; the sum over
 * ranks at that element is g_expect[(t + i) & 7]. */
static float g_expect[8];

void bench_data_init(void)
{
    for (int k = 0; k < 8; k++) {
        long s = 0;
        for (int r = 0; r < bench_size; r++)
            s += 1 + ((r + k) & 7);
        g_expect[k] = (float)s;
    }
}

void bench_fill(float *p, size_t n, int t)
{
    float pat[8];
    for (int k = 0; k < 8; k++)
        pat[k] = (float)(1 + ((bench_rank + k) & 7));
    for (size_t i = 0; i < n; i++)
        p[i] = pat[(i + (size_t)t) & 7];
}

/* 0 when every element holds the expected sum (within tol, relative, when
 * tol > 0); else 1 and a sentence in detail (if detail is still empty). */
int bench_check(const float *p, size_t n, int t, float tol, const char *what,
                char *detail)
{
    for (size_t i = 0; i < n; i++) {
        float e = g_expect[(i + (size_t)t) & 7];
        int bad = tol > 0 ? !(fabsf(p[i] - e) <= tol * e) : p[i] != e;
        if (bad) {
            if (detail[0] == '\0')
                snprintf(detail, BENCH_DETAIL_LEN,
                         "%s: element %zu is %.9g, expected %.9g", what, i,
                         (double)p[i], (double)e);
            return 1;
        }
    }
    return 0;
}

void bench_kolo_must(int rc, const char *what, const char *name)
{
    if (rc != KOLO_OK)
        bench_die("%s of '%s' failed: %s (%s)", what, name, kolo_last_error(),
                  kolo_strerror(rc));
}
