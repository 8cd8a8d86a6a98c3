/*
 * timeline.h — the Chrome-trace timeline (design in timeline.c).
 *
 * The background threads record events; a writer thread turns them into
 * JSON. Recording never blocks on the file: a full queue drops the event
 * and counts it. Phase names follow Horovod's timeline (NEGOTIATE_ALLREDUCE,
 * QUEUE, MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, ...), so the habits and
 * tools of Horovod users carry over.
 */
#ifndef KOLO_TIMELINE_H
#define KOLO_TIMELINE_H

#include <stdint.h>

#include "common.h"

typedef struct kolo__timeline kolo__timeline_t;

/* A timeline object for the life of the runtime; inactive until started.
 * epoch_us: the job's common time zero (CLOCK_REALTIME, microseconds; 0:
 * now). */
kolo__timeline_t *kolo__timeline_new(int rank, int size, int64_t epoch_us);
void kolo__timeline_free(kolo__timeline_t *tl);

/* Starts writing to path (truncating it); an active timeline is stopped
 * first. mark_cycles adds a CYCLE_START instant per negotiation round. */
int kolo__timeline_start(kolo__timeline_t *tl, const char *path,
                         int mark_cycles, kolo__err_t *err);
/* Writes what is queued, closes the file. Returns the write error, if any. */
int kolo__timeline_stop(kolo__timeline_t *tl, kolo__err_t *err);

/* 1 while recording (a cheap check before building an event). */
int kolo__timeline_active(const kolo__timeline_t *tl);
int kolo__timeline_marks_cycles(const kolo__timeline_t *tl);

/* Events of one tensor's lane, at ts_us (0: now). args, if not NULL, is
 * the inside of a JSON object ("\"dtype\":\"float32\""). */
void kolo__tl_begin(kolo__timeline_t *tl, const char *tensor, const char *phase,
                    const char *args, int64_t ts_us);
void kolo__tl_end(kolo__timeline_t *tl, const char *tensor, int64_t ts_us);
void kolo__tl_instant(kolo__timeline_t *tl, const char *tensor,
                      const char *name, int64_t ts_us);
/* A span measured by the device's events (inflight.c) on the tensor's
 * lane, in one of its rows: KOLO__TL_ROW_DEVICE (tid 1, "device": kolo's
 * stream) or KOLO__TL_ROW_STREAM (tid 2, "program stream": the program's
 * stream waiting for kolo). A Chrome-trace complete event ("ph":"X",
 * "cat":"device") from ts_us, lasting dur_us. */
#define KOLO__TL_ROW_DEVICE 1
#define KOLO__TL_ROW_STREAM 2
void kolo__tl_device(kolo__timeline_t *tl, const char *tensor, int row,
                     const char *phase, const char *args, int64_t ts_us,
                     int64_t dur_us);
/* When the file being written was started (kolo__now_us); 0 when none. */
int64_t kolo__timeline_started_us(const kolo__timeline_t *tl);
/* A CYCLE_START marker. */
void kolo__tl_cycle(kolo__timeline_t *tl);

/* Microseconds on the clock the timeline uses (monotonic). */
int64_t kolo__tl_now(void);

#endif /* KOLO_TIMELINE_H */
