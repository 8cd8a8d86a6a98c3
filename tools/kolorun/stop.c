/*
 * stop.c — stopping the job: the ranks' flight recorder dumps first (at
 * most 2 s, flight.c), then a stop signal forwarded to the ranks, SIGKILL
 * after the grace period or at a second Ctrl-C, and Ctrl-Z passed on (see
 * "Signals" in kolorun.h).
 */
#define _GNU_SOURCE

#include "config.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "supervise.h"

/* A second SIGINT closer than this to the first is the same keypress seen
 * twice (by the terminal's group and by a wrapper), not a second Ctrl-C. */
#define KOLORUN_DOUBLE_INT_MS 500

/* Why kolorun stops the job, in a line for DIR/kolorun-stop.txt: the
 * signal it got, or the line that named the cause. */
static void kolorun_stop_why(const kolorun_t *k, char *out, size_t n)
{
    if (k->stop_signal)
        snprintf(out, n, "kolorun stopped the job: it got %s",
                 kolorun_signame(k->stop_signal));
    else if (k->cause_line[0])
        snprintf(out, n, "kolorun stopped the job: %s", k->cause_line);
    else
        snprintf(out, n, "kolorun stopped the job");
}

/* Starts stopping the job: the ranks' dumps first (the loop waits for
 * them, then calls kolorun_stop_send), sig, SIGKILL after the grace
 * period. */
void kolorun_stop(kolorun_t *k, int sig)
{
    char why[1500];
    if (k->stopping)
        return;
    /* Ranks that end from now on are not causes: choose among the failed. */
    if (k->failed_rank < 0)
        kolorun_blame(k);
    k->stopping = 1;
    k->stop_sig = sig;
    k->stop_ms = kolorun_now_ms();
    kolorun_stop_why(k, why, sizeof why);
    int asked = k->killed ? 0 : kolorun_flight_ask(k, 1, why);
    if (asked > 0) {
        k->dumping = 1;
        if (k->opts.verbose)
            kolorun_say("asked %d rank%s for a flight recorder dump before "
                        "stopping the job (waiting at most 2 s)", asked,
                        asked == 1 ? "" : "s");
        return;
    }
    kolorun_stop_send(k);
}

/* The dumps are written (or their time is over): the stop signal goes to
 * the ranks, and the grace period begins. */
void kolorun_stop_send(kolorun_t *k)
{
    k->dumping = 0;
    if (k->killed)
        return;
    kolorun_release_remote(k, -1);
    k->stop_ms = kolorun_now_ms();
    if (k->opts.verbose && k->nalive > 0)
        kolorun_say("sending %s to %d running rank%s",
                    kolorun_signame(k->stop_sig), k->nalive,
                    k->nalive == 1 ? "" : "s");
    kolorun_signal_ranks(k, k->stop_sig);
}

/* SIGKILL to the group: the ranks still running and anything they left.
 * This ends the holder too. */
void kolorun_kill_now(kolorun_t *k)
{
    if (k->killed)
        return;
    k->killed = 1;
    k->killed_ms = kolorun_now_ms();
    if (k->opts.verbose)
        kolorun_say("sending SIGKILL to what is left of the job (%d "
                    "rank%s running)",
                    k->nalive, k->nalive == 1 ? "" : "s");
    kolorun_signal_ranks(k, SIGKILL);
}

/* Ctrl-Z: stop the ranks, stop kolorun; on SIGCONT continue both. Without
 * this only kolorun would stop, the ranks being in their own group. */
void kolorun_suspend(kolorun_t *k)
{
    kolorun_signal_ranks(k, SIGTSTP);
    struct sigaction dfl, mine;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGTSTP, &dfl, &mine);
    raise(SIGTSTP); /* returns once someone sends SIGCONT */
    sigaction(SIGTSTP, &mine, NULL);
    kolorun_signal_ranks(k, SIGCONT);
}

void kolorun_on_stop_signal(kolorun_t *k, int sig)
{
    if (!k->stopping) {
        if (k->nalive > 0)
            kolorun_say("got %s: stopping %d rank%s", kolorun_signame(sig),
                        k->nalive, k->nalive == 1 ? "" : "s");
        k->stop_signal = sig;
        kolorun_stop(k, sig);
        return;
    }
    /* Already stopping. Only a person presses Ctrl-C again to mean "now";
     * repeated SIGTERMs (a supervisor signalling the process and then its
     * group) keep the grace period. */
    if (sig == SIGINT && !k->killed &&
        kolorun_now_ms() - k->stop_ms >= KOLORUN_DOUBLE_INT_MS) {
        if (k->nalive > 0)
            kolorun_say("got %s again: killing the ranks",
                        kolorun_signame(sig));
        kolorun_kill_now(k);
    }
}
