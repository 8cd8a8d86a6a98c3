/*
 * signals.c — signals: the handler that wakes the loop (see "Signals" in
 * kolorun.h), and signalling the ranks: their group, and by pid those
 * that left it; closing the stdin of ranks on other hosts. What the loop
 * does with a signal (stop the job, pass Ctrl-Z on) is supervision's
 * (stop.c); SIGUSR1 asks the ranks for dumps (flight.c).
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "procs.h"

/* The signals that stop the job; each is forwarded to the ranks. */
const int kolorun_stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
_Static_assert(sizeof kolorun_stop_signals / sizeof kolorun_stop_signals[0] ==
                   KOLORUN_N_STOP_SIGNALS,
               "KOLORUN_N_STOP_SIGNALS counts kolorun_stop_signals");

/* The only globals: what the signal handler needs. The handler records that
 * a signal came and wakes the poll loop; everything else happens there. */
volatile sig_atomic_t kolorun_pending[NSIG];
int kolorun_wake_fd = -1;

static void kolorun_on_signal(int sig)
{
    int saved = errno;
    kolorun_pending[sig] = 1;
    /* If the pipe is full the loop is already due to wake: drop the byte. */
    char b = 0;
    ssize_t w = write(kolorun_wake_fd, &b, 1);
    (void)w;
    errno = saved;
}

static int kolorun_install(kolorun_t *k, int sig, int respect_ignore)
{
    struct sigaction old, sa;
    if (sigaction(sig, NULL, &old) != 0)
        return -1;
    if (respect_ignore && old.sa_handler == SIG_IGN)
        return 0; /* ignored by whoever started us: stay so */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = kolorun_on_signal;
    sigemptyset(&sa.sa_mask);
    /* SA_RESTART: a write to a slow terminal resumes instead of failing;
     * poll() returns EINTR regardless, and the self-pipe wakes it anyway. */
    sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    if (sigaction(sig, &sa, NULL) != 0)
        return -1;
    k->handled[sig] = 1;
    return 0;
}

int kolorun_signals_setup(kolorun_t *k)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
        kolorun_say("cannot create a pipe: %s", strerror(errno));
        return -1;
    }
    kolorun_wake_fd = p[1];
    /* SIGUSR1: the ranks' flight recorder dumps (flight.c). */
    if (kolorun_install(k, SIGCHLD, 0) != 0 ||
        kolorun_install(k, SIGTSTP, 1) != 0 ||
        kolorun_install(k, SIGUSR1, 1) != 0) {
        kolorun_say("cannot install signal handlers: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++) {
        if (kolorun_install(k, kolorun_stop_signals[i], 1) != 0) {
            kolorun_say("cannot install signal handlers: %s", strerror(errno));
            return -1;
        }
    }
    /* A closed output must come back as EPIPE, which kolorun handles, not
     * kill kolorun. The ranks get the original disposition back. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &k->sigpipe_orig);
    /* The signals kolorun handles must reach it even if its parent blocked
     * them; the ranks get the original mask back. */
    sigset_t s;
    sigemptyset(&s);
    for (int sig = 1; sig < NSIG; sig++)
        if (k->handled[sig])
            sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, &k->mask_orig);
    return p[0];
}

/* Sends sig to the ranks' process group — the ranks and whatever they
 * started — and, by pid, to each running rank that left the group (setsid).
 * The group is signalled only while its id is certainly still ours: the
 * holder or a rank in the group is unreaped. */
void kolorun_signal_ranks(kolorun_t *k, int sig)
{
    if (k->pgid <= 0)
        return;
    int group_ours = !k->holder_reaped;
    for (int r = 0; r < k->nstarted; r++)
        if (!k->ranks[r].reaped && getpgid(k->ranks[r].pid) == k->pgid)
            group_ours = 1;
    if (group_ours)
        kill(-k->pgid, sig);
    for (int r = 0; r < k->nstarted; r++)
        if (!k->ranks[r].reaped && getpgid(k->ranks[r].pid) != k->pgid)
            kill(k->ranks[r].pid, sig);
}

/* The names people know signals by, for kolorun's own messages. */
const char *kolorun_signame(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGKILL: return "SIGKILL";
    default: return strsignal(sig);
    }
}

/* Closes the stdin pipes of the ranks started by ssh: on the other host
 * each one's wrapper sees end of file and sends its rank SIGTERM. (The
 * signal to ssh ends ssh, and with it the connection, to the same effect;
 * closing the pipe also covers a launch process that outlives the signal.) */
void kolorun_release_remote(kolorun_t *k, int r)
{
    for (int i = r < 0 ? 0 : r; i < (r < 0 ? k->nstarted : r + 1); i++) {
        if (k->ranks[i].hold_fd >= 0)
            close(k->ranks[i].hold_fd);
        k->ranks[i].hold_fd = -1;
    }
}
