/*
 * supervise.h — supervision, above the processes: one poll loop runs the
 * job, reaps its ranks, names the cause of a failure and stops the job.
 * A policy (the elastic driver) may stand on top of it: supervision tells
 * it of every rank's end and of the children it does not know, asks it
 * whether the job is over, and runs it at every turn of the loop; the
 * policy asks supervision to start and stop ranks.
 *   loop.c         the poll() loop
 *   ranks.c        ranks starting and ending: reaping, naming the cause
 *   stop.c         stopping the job: the ranks' dumps first, forwarded
 *                  signals, SIGKILL, Ctrl-Z
 */
#ifndef KOLORUN_SUPERVISE_H
#define KOLORUN_SUPERVISE_H

#include "procs.h"

/* What a policy gives supervision (every slot set). */
typedef struct kolorun_policy {
    /* At every turn of the loop: its decisions; when it next needs to run
     * (kolorun_now_ms), or -1. */
    int64_t (*tick)(kolorun_t *k);
    /* A descriptor the loop polls for it (-1: none), and its reading. */
    int (*fd)(const kolorun_t *k);
    void (*read)(kolorun_t *k);
    /* A reaped child that is no rank: 1 if it was the policy's. */
    int (*reaped)(kolorun_t *k, pid_t pid, int status);
    /* Rank r ended with this wait status (its output drained): what it
     * means for the job is the policy's to decide. */
    void (*ended)(kolorun_t *k, int r, int status);
    /* With no rank running: whether the job is over. */
    int (*done)(const kolorun_t *k);
} kolorun_policy_t;

/* ---- loop.c */
int kolorun_loop(kolorun_t *k, int wake_rd);

/* ---- ranks.c */
void kolorun_reap(kolorun_t *k);
void kolorun_blame(kolorun_t *k);
/* Whether kolorun_blame should wait: no failed rank was killed or named by
 * the others, but a rank they name has not ended yet (a program printing
 * its traceback, tearing down) and the failure grace is not over. */
int kolorun_blame_waits(const kolorun_t *k, int64_t now);
/* Starts rank r (kolorun_spawn); 0, or the status that says why not. */
int kolorun_rank_start(kolorun_t *k, int r, const kolorun_place_t *place);
/* Sends rank r alone sig (SIGTERM, then SIGKILL once the caller has
 * waited long enough), its ssh's stdin closed (a rank on another host
 * ends with it). */
void kolorun_rank_stop(kolorun_t *k, int r, int sig);

/* ---- stop.c */
void kolorun_stop(kolorun_t *k, int sig);
void kolorun_stop_send(kolorun_t *k);
void kolorun_kill_now(kolorun_t *k);
void kolorun_suspend(kolorun_t *k);
void kolorun_on_stop_signal(kolorun_t *k, int sig);

#endif /* KOLORUN_SUPERVISE_H */
