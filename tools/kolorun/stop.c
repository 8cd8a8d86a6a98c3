/*
 * stop.c — stopping the job: a stop signal forwarded to the ranks, SIGKILL
 * after the grace period or at a second Ctrl-C, and Ctrl-Z passed on (see
 * "Signals" in kolorun.h).
 */
#define _GNU_SOURCE

#include "config.h"

#include <signal.h>
#include <string.h>

#include "supervise.h"

/* A second SIGINT closer than this to the first is the same keypress seen
 * twice (by the terminal's group and by a wrapper), not a second Ctrl-C. */
#define KOLORUN_DOUBLE_INT_MS 500

/* Starts stopping the job: sig now, SIGKILL after the grace period. */
void kolorun_stop(kolorun_t *k, int sig)
{
    if (k->stopping)
        return;
    /* Ranks that end from now on are not causes: choose among the failed. */
    if (k->failed_rank < 0)
        kolorun_blame(k);
    kolorun_release_remote(k, -1);
    k->stopping = 1;
    k->stop_ms = kolorun_now_ms();
    if (k->opts.verbose && k->nalive > 0)
        kolorun_say("sending %s to %d running rank%s", kolorun_signame(sig),
                    k->nalive, k->nalive == 1 ? "" : "s");
    kolorun_signal_ranks(k, sig);
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
