/*
 * spawn.c — how ranks start (see "Processes" in kolorun.h): each rank's
 * environment, the fork and exec of a rank on this host or of the launch
 * command (ssh by default) that starts it on another, the pipe on which a
 * child says what failed before its exec, and the holder that leads the
 * ranks' process group.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "procs.h"

/* Room for the variables kolorun sets for one rank (kolorun_rank_env). */
#define KOLORUN_MAX_ENV 32

/* One rank's start, step by step (kolorun_spawn): what it needs, and the
 * pipes that kolorun_spawn closes at the end unless a step kept them. */
typedef struct kolorun_spawn {
    int r;
    const kolorun_host_t *h;
    int remote; /* on another host, started by the launch command */
    char *env[KOLORUN_MAX_ENV];
    int nenv;
    kolorun_words_t launch; /* remote: the launch command's argv */
    int out[2], err[2], status[2], hold[2];
    pid_t pid;
} kolorun_spawn_t;

/* The host of rank r; NULL on a job of one machine without -H. */
const struct kolorun_host *kolorun_host_of(const kolorun_t *k, int r)
{
    return k->rank_host ? &k->opts.hosts[k->rank_host[r]] : NULL;
}

/* fork() with every signal blocked, so that the child never runs
 * kolorun's handlers between fork and exec; *old gets the mask to restore
 * (in the parent, once the child's pid is noted). */
static pid_t fork_blocked(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, old);
    return fork();
}

/* The address rank r's transport binds, when nothing else says. */
static const char *kolorun_bind_host(const kolorun_t *k, int r, char *buf,
                                     size_t n)
{
    const kolorun_host_t *h = kolorun_host_of(k, r);
    if (!h || !k->opts.any_remote)
        return "127.0.0.1"; /* every rank here: loopback reaches them all */
    if (!h->local)
        return h->name;
    /* "localhost" cannot be reached from the other hosts: this host's
     * name can, where it resolves to a routable address (otherwise
     * --network-interface is the way). */
    if (gethostname(buf, n - 1) != 0 || buf[0] == '\0')
        return h->name;
    buf[n - 1] = '\0';
    return buf;
}

/* The environment of rank r, as "NAME=value" strings. */
static int kolorun_rank_env(const kolorun_t *k, int r,
                            const kolorun_place_t *place,
                            char *env[KOLORUN_MAX_ENV])
{
    int n = 0;
    int np = k->opts.np;
    const kolorun_host_t *h = kolorun_host_of(k, r);
    char me[256];
    if (place) {
        /* Placed by a policy (an elastic worker: its place in the
         * generation it starts for, then its id and host). */
        env[n++] = kolorun_strdupf("KOLO_RANK=%d", place->rank);
        env[n++] = kolorun_strdupf("KOLO_SIZE=%d", place->size);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", place->local_rank);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", place->local_size);
        env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=%d", place->cross_rank);
        env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=%d", place->cross_size);
        for (int i = 0; i < place->nextra && n < KOLORUN_MAX_ENV - 8; i++)
            env[n++] = kolorun_strdupf("%s", place->extra[i]);
    } else if (!h) {
        env[n++] = kolorun_strdupf("KOLO_RANK=%d", r);
        env[n++] = kolorun_strdupf("KOLO_SIZE=%d", np);
        /* One machine: local and global numbering are the same. */
        env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", r);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", np);
        env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=0");
        env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=1");
    } else {
        env[n++] = kolorun_strdupf("KOLO_RANK=%d", r);
        env[n++] = kolorun_strdupf("KOLO_SIZE=%d", np);
        /* Hosts that got ranks are numbered in order: hosts without ranks
         * come after them, so the used ones are 0 .. nused - 1. */
        env[n++] = kolorun_strdupf("KOLO_LOCAL_RANK=%d", r - h->first_rank);
        env[n++] = kolorun_strdupf("KOLO_LOCAL_SIZE=%d", h->nranks);
        env[n++] = kolorun_strdupf("KOLO_CROSS_RANK=%d", k->rank_host[r]);
        env[n++] = kolorun_strdupf("KOLO_CROSS_SIZE=%d", k->opts.nused);
    }
    {
        char *rdv = kolorun_rendezvous(k);
        env[n++] = rdv ? kolorun_strdupf("KOLO_RENDEZVOUS=%s", rdv) : NULL;
        free(rdv);
    }
    if (k->opts.network_interface)
        env[n++] = kolorun_strdupf("KOLO_NETWORK_INTERFACE=%s",
                                   k->opts.network_interface);
    else if (!place && !getenv("KOLO_HOSTNAME"))
        env[n++] = kolorun_strdupf("KOLO_HOSTNAME=%s",
                                   kolorun_bind_host(k, r, me, sizeof me));
    /* Every rank's timeline counts time from the same moment. */
    env[n++] = kolorun_strdupf("KOLO_JOB_START_US=%lld",
                               (long long)k->job_start_us);
    if (k->opts.start_timeout)
        env[n++] = kolorun_strdupf("KOLO_START_TIMEOUT=%s",
                                   k->opts.start_timeout);
    /* -x NAME=VALUE holds for every rank; -x NAME only carries NAME to
     * other hosts (ranks here have it already). */
    for (int i = 0; i < k->opts.nxenv && n < KOLORUN_MAX_ENV - 1; i++)
        if (strchr(k->opts.xenv[i], '='))
            env[n++] = kolorun_strdupf("%s", k->opts.xenv[i]);
    for (int i = 0; i < n; i++)
        if (!env[i])
            return -1;
    return n;
}

/* s in single quotes for a POSIX shell: ' becomes '\''. */
static char *kolorun_shell_quote(const char *s)
{
    size_t n = 3;
    for (const char *p = s; *p; p++)
        n += *p == '\'' ? 4 : 1;
    char *q = malloc(n), *o = q;
    if (!q)
        return NULL;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o++ = '\'';
    *o = '\0';
    return q;
}

/* Whether env (n strings NAME=value) sets the variable of "NAME=...". */
static int kolorun_env_has(char **env, int n, const char *var)
{
    size_t len = strcspn(var, "=");
    for (int i = 0; i < n; i++)
        if (strncmp(env[i], var, len) == 0 && env[i][len] == '=')
            return 1;
    return 0;
}

/* Whether "NAME=..." (or NAME) is a secret, which never goes on a command
 * line: KOLO_SECRET, Horovod's HOROVOD_SECRET_KEY, KOLO_REDIS_PASSWORD. */
static int kolorun_is_secret(const char *var)
{
    size_t len = strcspn(var, "=");
    return (len == 11 && strncmp(var, "KOLO_SECRET", len) == 0) ||
           (len == 18 && strncmp(var, "HOROVOD_SECRET_KEY", len) == 0) ||
           (len == 19 && strncmp(var, "_HOROVOD_SECRET_KEY", len) == 0) ||
           (len == 19 && strncmp(var, "KOLO_REDIS_PASSWORD", len) == 0);
}

/* What runs on the other host: env VAR=value... command args..., as words.
 * The environment the rank needs goes on this command line because
 * nothing says the launch command carries any (ssh does not): kolorun's
 * KOLO_* variables for the rank, every other KOLO_* set here (the user's
 * KOLO_LOG_LEVEL, KOLO_TIMEOUT_SECONDS, ...) and what -x names; but not
 * the job's secret, which anyone on either host could read there (ps):
 * a shell on the other side reads it from its stdin (kolorun_launch_argv),
 * a launcher without one inherits it in its environment. */
static void kolorun_remote_command(const kolorun_t *k, char **env, int nenv,
                                   kolorun_words_t *out)
{
    extern char **environ;
    kolorun_words_add(out, strdup("env"));
    for (int i = 0; i < nenv; i++)
        if (!kolorun_is_secret(env[i]))
            kolorun_words_add(out, strdup(env[i]));
    for (char **e = environ; *e; e++)
        if (kolorun_passed_on(&k->opts, *e) && !kolorun_is_secret(*e) &&
            !kolorun_env_has(env, nenv, *e))
            kolorun_words_add(out, strdup(*e));
    for (int i = 0; i < k->opts.nxenv; i++) {
        const char *x = k->opts.xenv[i], *val;
        if (strchr(x, '=') || kolorun_env_has(env, nenv, x) ||
            kolorun_is_secret(x))
            continue; /* NAME=VALUE is in env already; no secret here */
        if ((val = getenv(x)) != NULL)
            kolorun_words_add(out, kolorun_strdupf("%s=%s", x, val));
    }
    for (char **a = k->opts.argv; *a; a++)
        kolorun_words_add(out, strdup(*a));
}

/* Replaces the placeholders of one template word. */
static char *kolorun_expand(const char *word, const kolorun_host_t *h,
                            int r, int lr, const char *command)
{
    char rank[16], local[16];
    snprintf(rank, sizeof rank, "%d", r);
    snprintf(local, sizeof local, "%d", lr);
    const char *val[4] = {h->name, rank, local, command};
    size_t cap = strlen(word) + 1;
    for (size_t i = 0; i < 4; i++)
        cap += strlen(val[i]) * 4; /* each placeholder a few times at most */
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    for (const char *p = word; *p;) {
        size_t i;
        for (i = 0; i < 4; i++) {
            size_t pl = strlen(kolorun_placeholders[i]);
            if (strncmp(p, kolorun_placeholders[i], pl) == 0 &&
                (size_t)(o - out) + strlen(val[i]) < cap) {
                memcpy(o, val[i], strlen(val[i]));
                o += strlen(val[i]);
                p += pl;
                break;
            }
        }
        if (i == 4 && (size_t)(o - out) + 1 < cap)
            *o++ = *p++;
        else if (i == 4)
            p++;
    }
    *o = '\0';
    return out;
}

/* Whether a shell on the other host runs the rank's command: ssh, or a
 * template with {command}. Such ranks get the stdin wrapper below. */
static int kolorun_remote_shell(const kolorun_t *k)
{
    return !k->opts.launch_command ||
           strstr(k->opts.launch_command, "{command}") != NULL;
}

/* In a child before exec: kolorun's signal handlers back to the default,
 * SIGPIPE back to what kolorun inherited. */
void kolorun_child_signals(const kolorun_t *k)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++)
        if (k->handled[sig])
            sigaction(sig, &dfl, NULL);
    sigaction(SIGPIPE, &k->sigpipe_orig, NULL);
}

/* The remote command (cmd's words) as one shell word, for {command} and
 * ssh: "cd 'CWD' 2>/dev/null; exec 'w1' 'w2' ...". NULL: out of memory. */
static char *kolorun_command_line(const kolorun_words_t *cmd)
{
    size_t len = 64;
    char cwd[4096];
    int have_cwd = getcwd(cwd, sizeof cwd) != NULL;
    char *qcwd = have_cwd ? kolorun_shell_quote(cwd) : NULL;
    len += qcwd ? strlen(qcwd) : 0;
    for (int i = 0; i < cmd->n; i++)
        len += strlen(cmd->w[i]) * 4 + 3;
    char *command = malloc(len);
    if (!command || (have_cwd && !qcwd)) {
        free(qcwd);
        free(command);
        return NULL;
    }
    size_t used = (size_t)snprintf(command, len, "%s%s%sexec", qcwd ? "cd " : "",
                                   qcwd ? qcwd : "",
                                   qcwd ? " 2>/dev/null; " : "");
    free(qcwd);
    for (int i = 0; i < cmd->n; i++) {
        char *q = kolorun_shell_quote(cmd->w[i]);
        if (!q) {
            free(command);
            return NULL;
        }
        used += (size_t)snprintf(command + used, len - used, " %s", q);
        free(q);
    }
    return command;
}

/* ssh: no signal kolorun sends reaches the remote rank, and killing ssh
 * does not end it either (without a terminal, sshd sends no SIGHUP). So
 * the rank runs under a small sh wrapper that watches its stdin, a pipe
 * from kolorun through ssh: at end of file (kolorun closed it, or ssh or
 * its connection is gone) the wrapper sends the rank SIGTERM. Otherwise it
 * waits for the rank and exits with its status. In sh -c, whatever the
 * login shell on that host is. The same goes for every template with
 * {command}; a template without it (ip netns exec {host}) execs the rank
 * itself, which gets signals. The first lines on that stdin are the job's
 * secret and the Redis password, if any (kolorun_spawn writes them there):
 * they travel inside ssh's own encrypted channel, on no command line.
 * Takes command (freed); the wrapped one, or NULL: out of memory. */
static char *kolorun_stdin_wrapper(char *command)
{
    char *script = kolorun_strdupf(
        "IFS= read -r KOLO_SECRET || exit 1; export KOLO_SECRET; "
        "IFS= read -r KOLO_REDIS_PASSWORD || exit 1; "
        "[ -n \"$KOLO_REDIS_PASSWORD\" ] && export KOLO_REDIS_PASSWORD; "
        "%s </dev/null & p=$!; exec 3<&0; "
        "(read _ <&3; kill -TERM $p 2>/dev/null) & w=$!; exec 3<&-; "
        "wait $p; s=$?; kill $w 2>/dev/null; exit $s",
        command);
    char *q = script ? kolorun_shell_quote(script) : NULL;
    free(script);
    free(command);
    command = q ? kolorun_strdupf("sh -c %s", q) : NULL;
    free(q);
    return command;
}

/* The launch command's words, placeholders still in: --launch-command's
 * words, or ssh's (see kolorun_launch_argv). 0, or -1: out of memory. */
static int kolorun_launch_template(const kolorun_opts_t *o,
                                   kolorun_words_t *tmpl)
{
    if (o->launch_command) {
        char *t = strdup(o->launch_command), *save = NULL, *w;
        if (!t)
            return -1;
        for (w = strtok_r(t, " \t", &save); w; w = strtok_r(NULL, " \t", &save))
            kolorun_words_add(tmpl, strdup(w));
        free(t);
        return tmpl->oom ? -1 : 0;
    }
    kolorun_words_add(tmpl, strdup("ssh"));
    kolorun_words_add(tmpl, strdup("-o"));
    kolorun_words_add(tmpl, strdup("BatchMode=yes"));
    kolorun_words_add(tmpl, strdup("-o"));
    kolorun_words_add(tmpl, kolorun_strdupf(
        "ConnectTimeout=%s", o->start_timeout ? o->start_timeout : "60"));
    if (o->ssh_port) {
        kolorun_words_add(tmpl, strdup("-p"));
        kolorun_words_add(tmpl, strdup(o->ssh_port));
    }
    if (o->ssh_identity) {
        kolorun_words_add(tmpl, strdup("-i"));
        kolorun_words_add(tmpl, strdup(o->ssh_identity));
    }
    kolorun_words_add(tmpl, strdup("{host}"));
    kolorun_words_add(tmpl, strdup("{command}"));
    return tmpl->oom ? -1 : 0;
}

/* The argv that starts rank r on its (other) host: the launch command
 * with its placeholders replaced. ssh by default:
 *   ssh -o BatchMode=yes -o ConnectTimeout=T [-p P] [-i F] HOST
 *       "cd 'CWD' 2>/dev/null; exec env 'KOLO_RANK=3' ... 'prog' 'arg'"
 * BatchMode: a password prompt would hang the start; ConnectTimeout: an
 * unreachable host fails within the start timeout. */
static int kolorun_launch_argv(const kolorun_t *k, int r,
                               const kolorun_place_t *place, char **env,
                               int nenv, kolorun_words_t *argv)
{
    const kolorun_host_t *h = kolorun_host_of(k, r);
    kolorun_words_t cmd = {0}, tmpl = {0};
    char *command = NULL;
    int rc = -1;

    kolorun_remote_command(k, env, nenv, &cmd);
    if (cmd.oom || !(command = kolorun_command_line(&cmd)))
        goto free_words;
    if (kolorun_remote_shell(k) && !(command = kolorun_stdin_wrapper(command)))
        goto free_words;
    if (kolorun_launch_template(&k->opts, &tmpl) != 0)
        goto free_words;
    /* {rank}, {local_rank}: a placed rank's (an elastic worker's rank in
     * the generation it starts for, and its slot on the host). */
    int rank = r, local = r - h->first_rank, has_command = 0;
    if (place) {
        rank = place->rank;
        local = place->slot;
    }
    for (int i = 0; i < tmpl.n; i++) {
        has_command |= strstr(tmpl.w[i], "{command}") != NULL;
        kolorun_words_add(argv, kolorun_expand(tmpl.w[i], h, rank, local,
                                               command));
    }
    if (!has_command)
        for (int i = 0; i < cmd.n; i++)
            kolorun_words_add(argv, strdup(cmd.w[i]));
    rc = argv->oom ? -1 : 0;

free_words:
    free(command);
    kolorun_words_free(&tmpl);
    kolorun_words_free(&cmd);
    return rc;
}

/* What a child that could not become its rank tells kolorun, on a pipe
 * that exec closes (close-on-exec): end of file with nothing read means the
 * rank runs. Without it a child could only exit 127, and kolorun would
 * report a rank that never ran as "exited with status 127". */
typedef struct kolorun_child_error {
    int step; /* what failed: kolorun_child_step */
    int err;  /* its errno */
} kolorun_child_error_t;

enum kolorun_child_step {
    KOLORUN_STEP_STDIN = 1, /* open /dev/null for the rank's stdin */
    KOLORUN_STEP_DUP2,      /* stdin, stdout and stderr onto fds 0, 1, 2 */
    KOLORUN_STEP_PDEATHSIG, /* prctl(PR_SET_PDEATHSIG) */
    KOLORUN_STEP_EXEC,      /* execvp of the command (or launch command) */
};

/* In the child: tells kolorun what failed and exits. */
__attribute__((noreturn)) static void kolorun_child_fail(int status_w,
                                                         int step, int err)
{
    kolorun_child_error_t ce = {step, err};
    /* 8 bytes into an empty pipe: written whole, or kolorun is gone. */
    ssize_t w = write(status_w, &ce, sizeof ce);
    (void)w;
    _exit(127);
}

/* In the child, between fork and exec. kolorun is single-threaded, so the
 * child may call what it likes; it must not return. */
__attribute__((noreturn)) static void
kolorun_child(const kolorun_t *k, pid_t launcher, const kolorun_spawn_t *s,
              char **exec_argv)
{
    /* A remote rank gets its environment on the launch command's command
     * line, not from kolorun's environment. */
    int status_w = s->status[1], nenv = s->remote ? 0 : s->nenv;
    /* Handlers of kolorun make no sense here; exec would reset them anyway,
     * but a signal may come before it. SIGPIPE goes back to what kolorun
     * inherited. */
    kolorun_child_signals(k);

    /* Join the ranks' group. The parent does the same, whichever of the
     * two runs first. */
    setpgid(0, k->pgid);

    int in = s->hold[0] >= 0 ? s->hold[0]
                             : open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_STDIN, errno);
    if (dup2(in, STDIN_FILENO) < 0 || dup2(s->out[1], STDOUT_FILENO) < 0 ||
        dup2(s->err[1], STDERR_FILENO) < 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_DUP2, errno);

    /* Die with the launcher. If it died already, before the request took
     * effect, our parent is someone else now: stop here, telling no one. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        kolorun_child_fail(status_w, KOLORUN_STEP_PDEATHSIG, errno);
    if (getppid() != launcher)
        _exit(127);

    for (int i = 0; i < nenv; i++)
        putenv(s->env[i]);

    sigprocmask(SIG_SETMASK, &k->mask_orig, NULL);
    execvp(exec_argv[0], exec_argv);
    kolorun_child_fail(status_w, KOLORUN_STEP_EXEC, errno);
}

/* What a user who typed `kolorun -np 2 train.py` meant: a file here that
 * the search of PATH does not find, or a script without its execute bit
 * (or its interpreter). "" when there is nothing to add. */
static const char *kolorun_run_hint(const char *prog, int err)
{
    static char hint[512];
    struct stat st;
    size_t n = strlen(prog);
    int py = n > 3 && strcmp(prog + n - 3, ".py") == 0;
    if (stat(prog, &st) != 0 || !S_ISREG(st.st_mode))
        return "";
    if (err == ENOENT && !strchr(prog, '/') && py)
        snprintf(hint, sizeof hint, " (a command without a '/' is looked "
                 "for in PATH, not here: run python3 %s, or ./%s if it is "
                 "executable)", prog, prog);
    else if (err == ENOENT && !strchr(prog, '/'))
        snprintf(hint, sizeof hint, " (a command without a '/' is looked "
                 "for in PATH, not here: run ./%s)", prog);
    else if (err == EACCES && py)
        snprintf(hint, sizeof hint, " (run python3 %s, or chmod +x it and "
                 "begin it with #!/usr/bin/env python3)", prog);
    else if (err == EACCES)
        snprintf(hint, sizeof hint, " (it is not executable: chmod +x %s)",
                 prog);
    else
        return "";
    return hint;
}

/* After fork: waits until the child has exec'd the rank (0) or failed. A
 * failed child is reaped here, and kolorun says why it could not start the
 * rank; returns kolorun's exit status then: the shell's 127 (not found) or
 * 126 (found, not runnable) for a command that cannot be run, else 1. */
static int kolorun_child_wait(int r, pid_t pid, int status_r,
                              const char *prog, const char *host)
{
    kolorun_child_error_t ce;
    ssize_t n;
    do
        n = read(status_r, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce)
        return 0; /* end of file: exec closed the pipe, the rank runs */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    const char *e = strerror(ce.err);
    switch (ce.step) {
    case KOLORUN_STEP_STDIN:
        kolorun_say("cannot start rank %d: open /dev/null: %s", r, e);
        return 1;
    case KOLORUN_STEP_DUP2:
        kolorun_say("cannot start rank %d: dup2: %s", r, e);
        return 1;
    case KOLORUN_STEP_PDEATHSIG:
        kolorun_say("cannot start rank %d: prctl(PR_SET_PDEATHSIG): %s", r, e);
        return 1;
    default:
        if (host)
            kolorun_say("cannot start rank %d: cannot run the launch command "
                        "'%s' for host %s: %s", r, prog, host, e);
        else
            kolorun_say("cannot start rank %d: cannot run '%s': %s%s", r, prog,
                        e, kolorun_run_hint(prog, ce.err));
        return ce.err == ENOENT || ce.err == ENOTDIR ? 127 : 126;
    }
}

/* ssh: the rank's stdin is a pipe that kolorun keeps open; the remote
 * side ends the rank when it closes (see kolorun_launch_argv). Its first
 * lines: the secret and the Redis password, for the wrapper's reads (a
 * pipe takes these few bytes without blocking). 0, or -1 having said
 * why. */
static int kolorun_spawn_stdin(kolorun_spawn_t *s)
{
    const char *secret = getenv("KOLO_SECRET");
    const char *pw = getenv("KOLO_REDIS_PASSWORD");
    if (pipe2(s->hold, O_CLOEXEC) != 0) {
        kolorun_say("cannot start rank %d: pipe: %s", s->r, strerror(errno));
        return -1;
    }
    if (kolorun_write_all(s->hold[1], secret ? secret : "", secret ? strlen(secret) : 0) != 0 ||
        kolorun_write_all(s->hold[1], "\n", 1) != 0 ||
        kolorun_write_all(s->hold[1], pw ? pw : "", pw ? strlen(pw) : 0) != 0 ||
        kolorun_write_all(s->hold[1], "\n", 1) != 0) {
        kolorun_say("cannot start rank %d: writing to its stdin pipe: %s",
                    s->r, strerror(errno));
        return -1;
    }
    return 0;
}

/* Its stdout, its stderr, and the pipe on which the child says what
 * failed before its exec. 0, or -1 having said why. */
static int kolorun_spawn_pipes(kolorun_spawn_t *s)
{
    if (pipe2(s->out, O_CLOEXEC) != 0 || pipe2(s->err, O_CLOEXEC) != 0 ||
        pipe2(s->status, O_CLOEXEC) != 0) {
        kolorun_say("cannot start rank %d: pipe: %s", s->r, strerror(errno));
        return -1;
    }
    return 0;
}

/* Forks the child that becomes the rank, and waits until it has exec'd.
 * 0, or kolorun's exit status (said why). */
static int kolorun_spawn_fork(kolorun_t *k, kolorun_spawn_t *s)
{
    /* All signals blocked across fork: the child must not run kolorun's
     * handlers (they write to kolorun's self-pipe) before it resets them. */
    sigset_t old;
    pid_t launcher = getpid();
    char **exec_argv = s->remote ? s->launch.w : k->opts.argv;
    s->pid = fork_blocked(&old);
    if (s->pid == 0)
        kolorun_child(k, launcher, s, exec_argv);
    int fork_errno = errno;
    if (s->pid > 0)
        /* Set the group here too: whichever of parent and child runs first
         * wins, and kolorun may signal the group as soon as fork returns.
         * EACCES: the child has exec'd, after setting it itself. */
        setpgid(s->pid, k->pgid);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (s->pid < 0) {
        kolorun_say("cannot start rank %d: fork: %s", s->r,
                    strerror(fork_errno));
        return 1;
    }
    /* Only the child may hold the write end: exec closes it. */
    close(s->status[1]);
    s->status[1] = -1;
    return kolorun_child_wait(s->r, s->pid, s->status[0], exec_argv[0],
                              s->remote ? s->h->name : NULL);
}

/* words, each after a blank, into line (cut short where it is full). */
static void kolorun_join_words(char *line, size_t cap, char *const *words,
                               int n)
{
    size_t used = 0;
    line[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(line + used, cap - used, " %s", words[i]);
}

/* --verbose: the rank's pid and environment, and what started it. */
static void kolorun_spawn_report(const kolorun_spawn_t *s)
{
    char line[4096];
    kolorun_join_words(line, sizeof line, s->env, s->nenv);
    kolorun_say("rank %d: pid %ld, environment:%s", s->r, (long)s->pid, line);
    kolorun_join_words(line, sizeof line, s->launch.w, s->launch.n);
    if (s->remote)
        kolorun_say("rank %d: on host %s, started by:%s", s->r, s->h->name,
                    line);
}

/* The rank runs: kolorun keeps the read ends of its pipes, non-blocking
 * so that draining a finished rank never blocks on a pipe that something
 * else still holds open, and the write end of its stdin (ssh). */
static void kolorun_spawn_keep(kolorun_t *k, kolorun_spawn_t *s)
{
    kolorun_rank_t *rk = &k->ranks[s->r];
    rk->pid = s->pid;
    k->nstarted++;
    k->nalive++;
    if (k->opts.verbose)
        kolorun_spawn_report(s);
    rk->streams[KOLORUN_OUT].fd = s->out[0];
    rk->streams[KOLORUN_ERR].fd = s->err[0];
    fcntl(s->out[0], F_SETFL, O_NONBLOCK);
    fcntl(s->err[0], F_SETFL, O_NONBLOCK);
    s->out[0] = s->err[0] = -1;
    rk->hold_fd = s->hold[1];
    s->hold[1] = -1;
}

/* Starts rank r. 0, or kolorun's exit status when it cannot (said why). */
int kolorun_spawn(kolorun_t *k, int r, const kolorun_place_t *place)
{
    kolorun_spawn_t s = {.r = r, .out = {-1, -1}, .err = {-1, -1},
                         .status = {-1, -1}, .hold = {-1, -1}};
    int rc = 1;

    s.h = kolorun_host_of(k, r);
    s.remote = s.h && !s.h->local;
    s.nenv = kolorun_rank_env(k, r, place, s.env);
    if (s.nenv < 0 || (s.remote && kolorun_launch_argv(k, r, place, s.env,
                                                       s.nenv, &s.launch) != 0)) {
        kolorun_say("out of memory");
        goto free_env;
    }
    if ((s.remote && kolorun_remote_shell(k) && kolorun_spawn_stdin(&s) != 0) ||
        kolorun_spawn_pipes(&s) != 0)
        goto close_pipes;
    rc = kolorun_spawn_fork(k, &s);
    if (rc == 0)
        kolorun_spawn_keep(k, &s);

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (s.status[i] >= 0)
            close(s.status[i]);
        if (s.hold[i] >= 0)
            close(s.hold[i]);
        if (s.out[i] >= 0)
            close(s.out[i]);
        if (s.err[i] >= 0)
            close(s.err[i]);
    }
free_env:
    for (int i = 0; i < KOLORUN_MAX_ENV; i++)
        free(s.env[i]);
    kolorun_words_free(&s.launch);
    return rc;
}

pid_t kolorun_start_helper(const kolorun_t *k, const char *file,
                           char *const argv[], int in_fd, int out_fd,
                           int err_fd, const char *fail_hint)
{
    sigset_t old;
    pid_t launcher = getpid();
    pid_t pid = fork_blocked(&old);
    if (pid == 0) {
        kolorun_child_signals(k);
        setpgid(0, 0); /* its own group: one kill ends all it started */
        int in = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in < 0 || dup2(in, 0) < 0 || dup2(out_fd, 1) < 0 ||
            (err_fd >= 0 && dup2(err_fd, 2) < 0))
            _exit(127);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher)
            _exit(127);
        sigprocmask(SIG_SETMASK, &k->mask_orig, NULL);
        execvp(file, argv);
        if (fail_hint)
            dprintf(2, "cannot run %s: %s%s\n", file, strerror(errno),
                    fail_hint);
        _exit(127);
    }
    int fork_errno = errno;
    if (pid > 0)
        setpgid(pid, pid);
    sigprocmask(SIG_SETMASK, &old, NULL);
    errno = fork_errno;
    return pid;
}

/* Starts the holder, the leader of the ranks' process group (see
 * "Processes" in kolorun.h). It keeps no file open, so it holds no pipe and
 * no terminal, and dies with kolorun. */
int kolorun_spawn_holder(kolorun_t *k, int wake_rd)
{
    sigset_t old;
    pid_t launcher = getpid();
    pid_t pid = fork_blocked(&old);
    if (pid == 0) {
        setpgid(0, 0);
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        for (int sig = 1; sig < NSIG; sig++)
            sigaction(sig, &ign, NULL); /* fails for KILL and STOP: fine */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher)
            _exit(0);
        /* In ps and top, a name that says what it is. */
        prctl(PR_SET_NAME, "kolorun-group");
        close(wake_rd);
        close(kolorun_wake_fd);
        for (int fd = 0; fd < 3; fd++)
            close(fd);
        if (chdir("/") != 0) /* pin no mount point */
            _exit(0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (;;)
            pause();
    }
    int fork_errno = errno;
    if (pid > 0) {
        setpgid(pid, pid); /* also here: ranks join right after */
        k->pgid = pid;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        kolorun_say("cannot start: fork: %s", strerror(fork_errno));
        return -1;
    }
    if (k->opts.verbose)
        kolorun_say("ranks' process group %ld, held open by the "
                    "kolorun-group process of the same pid",
                    (long)pid);
    return 0;
}

/* Ends the holder once the job is over. */
void kolorun_end_holder(kolorun_t *k)
{
    if (k->pgid <= 0 || k->holder_reaped)
        return;
    kill(k->pgid, SIGKILL);
    while (waitpid(k->pgid, NULL, 0) < 0 && errno == EINTR)
        ;
    k->holder_reaped = 1;
}
