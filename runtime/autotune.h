/*
 * autotune.h — KOLO_AUTOTUNE: the fusion threshold, the chunk size and the
 * cycle time tuned on the live workload (design in autotune.c).
 */
#ifndef KOLO_AUTOTUNE_H
#define KOLO_AUTOTUNE_H

#include <stdint.h>

enum { KOLO__TUNE_PARAMS = 3, KOLO__TUNE_MAX_CANDIDATES = 8,
       KOLO__TUNE_SAMPLES = 3 };

typedef struct kolo__tune_params {
    int64_t fusion_threshold; /* bytes */
    int64_t chunk_bytes;
    double cycle_ms;
} kolo__tune_params_t;

/* One scored window, for the log. */
typedef struct kolo__tune_row {
    int64_t window;
    const char *parameter; /* the one being searched, or "settled" */
    kolo__tune_params_t params;
    int64_t bytes;
    double busy_s;  /* the slowest rank's busy time in the window */
    double score;   /* bytes per busy second */
    int warmup;     /* 1: the first window after a change, not scored */
} kolo__tune_row_t;

typedef struct kolo__autotune {
    kolo__tune_params_t dflt, cur;
    int window_rounds;
    /* the search */
    int param;          /* 0 fusion, 1 chunk, 2 cycle; KOLO__TUNE_PARAMS: done */
    int ncand[KOLO__TUNE_PARAMS];
    double cand[KOLO__TUNE_PARAMS][KOLO__TUNE_MAX_CANDIDATES];
    int ci;             /* candidate under test */
    int sample;         /* -1: warm-up window; then 0 .. SAMPLES-1 */
    double scores[KOLO__TUNE_MAX_CANDIDATES][KOLO__TUNE_SAMPLES];
    /* the window being measured */
    int rounds;
    int64_t bytes, busy_us, windows;
} kolo__autotune_t;

/* Starts the search from the configured values. */
void kolo__autotune_init(kolo__autotune_t *t, const kolo__tune_params_t *dflt,
                         int window_rounds);
/* Records a round that completed work; returns 1 when the window is full
 * (the caller then agrees on the busy time and calls _window). Once
 * settled, always 0: the settings stay and nothing is measured. */
int kolo__autotune_round(kolo__autotune_t *t, int64_t bytes, int64_t busy_us);
/* This rank's busy seconds in the full window. */
double kolo__autotune_busy_s(const kolo__autotune_t *t);
/* Scores the window with the slowest rank's busy time (the same on every
 * rank, so every rank takes the same decision) and moves the search. */
void kolo__autotune_window(kolo__autotune_t *t, double max_busy_s,
                           kolo__tune_row_t *row);
int kolo__autotune_settled(const kolo__autotune_t *t);

#endif /* KOLO_AUTOTUNE_H */
