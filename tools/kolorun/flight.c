/*
 * flight.c — kolorun's side of the flight recorder (docs: issue 52's
 * shared design). Each rank's runtime keeps a ring of its recent
 * collectives and writes it whole to KOLO_FLIGHT_DIR/rank<R>.json when
 * something goes wrong, or when it gets SIGUSR1. kolorun's part:
 *
 * The directory. Every rank gets the same KOLO_FLIGHT_DIR: --flight-dir's
 * (a tuning flag: flags.c put it in kolorun's environment), else the one
 * the user exported, made absolute (a rank may change its directory;
 * ranks on other hosts start in the same path), else a new directory of
 * kolorun's own, $TMPDIR/kolo-flight-USER-YYYYmmdd-HHMMSS-PID, mode 0700,
 * on the launching host. Being in kolorun's environment, it reaches the
 * ranks started here, those on other hosts (every KOLO_* goes on their
 * command line) and mpirun's (-x). At the end of a job that failed,
 * kolorun names the directory if a rank wrote to it; its own is removed
 * after a job that succeeded (or is left empty by one that failed); the
 * user's is never removed. A job that succeeded leaves nothing to read
 * but what the user asked to keep with --flight-dir.
 *
 * Who takes SIGUSR1. A program that has not installed a handler dies of
 * SIGUSR1 (its default action), so kolorun must not send it to a rank
 * that is not a kolo program past kolo_init with its recorder on. The
 * runtime says it takes it by writing DIR/rank<R>.ready (after installing
 * its handler, removed before restoring the old disposition at
 * kolo_shutdown), holding the pid that installed it in decimal (empty:
 * the rank's own pid, which kolorun knows for a plain job's rank R). That
 * pid, not the rank's, gets the signal: a rank may be a shell wrapper
 * whose child runs kolo. kolorun believes a file only if it was written
 * after kolorun started and its pid is a process of the ranks' group (or
 * a rank that left it) — not the holder, not a launcher of a rank on
 * another host: a stale file, or one from another host on a shared file
 * system, can never make kolorun signal a stranger.
 *
 * When. kill -USR1 of kolorun passes SIGUSR1 to those pids, and the job
 * goes on (their runtimes have every other rank, here or elsewhere, dump
 * too). Before kolorun stops a job (a rank failed and the failure grace
 * is over, a stop signal came, an elastic job ended), it writes why to
 * DIR/kolorun-stop.txt, sends them SIGUSR1 and waits, up to
 * KOLORUN_DUMP_GRACE_MS, until each one's DIR/rank<R>.json is renewed
 * (the runtime renames a whole new file into place: a new inode), then
 * goes on stopping the job; ranks that wrote nothing in time are named.
 * The waiting is the loop's: inotify on DIR wakes it when a file lands
 * (without inotify it looks every 50 ms), output keeps flowing, and a
 * second Ctrl-C still kills at once.
 */
#define _GNU_SOURCE

#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "procs.h"

/* How long kolorun waits for the ranks' dumps before stopping a job. */
#define KOLORUN_DUMP_GRACE_MS 2000
/* Without inotify: how often it looks. */
#define KOLORUN_DUMP_LOOK_MS 50
/* The ranks named in one line about dumps that did not come. */
#define KOLORUN_DUMP_NAMED 8

/* A rank asked for a dump: the R of its files, the pid that takes
 * SIGUSR1, its .ready file's time, and its dump as it was before. */
typedef struct kolorun_dumper {
    int rank;
    pid_t pid;
    struct timespec ready;
    int had; /* DIR/rank<R>.json existed before the signal */
    struct stat before;
    int done; /* renewed, or the process is gone */
} kolorun_dumper_t;

typedef struct kolorun_dumpers {
    kolorun_dumper_t *d;
    int n, cap;
} kolorun_dumpers_t;

/* The dumps a stop waits for. */
struct kolorun_flight {
    kolorun_dumpers_t asked;
    int fd; /* inotify on DIR, or -1 */
    int64_t until_ms;
};

/* ---- The directory. */

/* The user's name for the directory's name: letters, digits, . _ - only. */
static void kolorun_flight_user(char *out, size_t n)
{
    struct passwd *pw = getpwuid(geteuid());
    const char *name = pw && pw->pw_name ? pw->pw_name : getenv("USER");
    if (!name || !*name)
        snprintf(out, n, "uid%ld", (long)geteuid());
    else
        snprintf(out, n, "%s", name);
    for (char *p = out; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789._-", *p))
            *p = '_';
}

/* path, absolute (from the working directory); NULL: out of memory. */
static char *kolorun_absolute(const char *path)
{
    char cwd[4096];
    if (path[0] == '/')
        return strdup(path);
    if (!getcwd(cwd, sizeof cwd))
        return strdup(path); /* the best there is */
    return kolorun_strdupf("%s/%s", cwd, path);
}

/* A new directory of kolorun's own: $TMPDIR/kolo-flight-USER-TIME-PID. */
static char *kolorun_flight_make(void)
{
    const char *base = getenv("TMPDIR");
    char user[64], when[32];
    time_t now = time(NULL);
    struct tm tm;
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base);
    while (n > 1 && base[n - 1] == '/')
        n--;
    kolorun_flight_user(user, sizeof user);
    localtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y%m%d-%H%M%S", &tm);
    char *made = kolorun_strdupf("%.*s/kolo-flight-%s-%s-%ld", (int)n, base,
                                 user, when, (long)getpid());
    char *path = made ? kolorun_absolute(made) : NULL;
    free(made);
    if (!path) {
        kolorun_say("out of memory");
        return NULL;
    }
    if (mkdir(path, 0700) != 0) {
        kolorun_say("warning: cannot create the flight recorder's directory "
                    "%s: %s; the ranks write no dumps (--flight-dir DIR "
                    "names another)", path, strerror(errno));
        free(path);
        return NULL;
    }
    return path;
}

/* KOLO_FLIGHT_RECORDER=0: the ranks record nothing and dump nothing. */
static int kolorun_recorder_off(void)
{
    const char *v = getenv("KOLO_FLIGHT_RECORDER");
    return v && kolorun_parse_long(v, 0, 0) == 0;
}

void kolorun_flight_setup(kolorun_t *k, int mpi)
{
    const char *given = getenv("KOLO_FLIGHT_DIR");
    char *dir;
    if (kolorun_recorder_off())
        return; /* nothing to make: the ranks write nothing */
    if (given && *given) {
        dir = kolorun_absolute(given);
        if (dir && kolorun_mkdirs(dir, 0700) != 0)
            kolorun_say("warning: cannot create the flight recorder's "
                        "directory %s: %s; the ranks will say whether they "
                        "can write there", dir, strerror(errno));
    } else if (mpi) {
        return;
    } else {
        dir = kolorun_flight_make();
        k->flight_own = dir != NULL;
    }
    if (!dir || setenv("KOLO_FLIGHT_DIR", dir, 1) != 0) {
        if (dir && k->flight_own)
            rmdir(dir);
        k->flight_own = 0;
        free(dir);
        return;
    }
    k->flight_dir = dir;
    if (k->opts.verbose && !mpi)
        kolorun_say("flight recorder directory %s", dir);
}

/* ---- Who takes SIGUSR1. */

/* Whether pid is a process of this job that may get SIGUSR1: in the
 * ranks' group (while its id is surely ours) or a running rank that left
 * it, but not the holder, kolorun, or what starts a rank on another
 * host. */
static int kolorun_pid_ours(const kolorun_t *k, pid_t pid)
{
    int rank = 0;
    if (pid <= 1 || pid == k->pgid || pid == getpid())
        return 0;
    for (int r = 0; r < k->nstarted; r++) {
        if (k->ranks[r].pid != pid || k->ranks[r].reaped)
            continue;
        const kolorun_host_t *h = kolorun_host_of(k, r);
        if (h && !h->local)
            return 0;
        rank = 1;
    }
    return rank || (!k->holder_reaped && k->pgid > 0 &&
                    getpgid(pid) == k->pgid);
}

/* The pid in rank R's .ready file (at dirfd), or, empty, rank R's own
 * (a plain job's); 0 when there is none to believe. A plain job's rank on
 * another host (a directory all hosts share) is its host's to signal. */
static pid_t kolorun_ready_pid(const kolorun_t *k, int dirfd,
                               const char *name, int rank)
{
    const kolorun_host_t *h = NULL;
    char text[32] = "";
    long pid = 0;
    if (!k->policy && rank < k->nstarted) {
        h = kolorun_host_of(k, rank);
        if (h && !h->local)
            return 0;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    if (sscanf(text, "%ld", &pid) != 1) {
        if (k->policy || rank >= k->nstarted)
            return 0;
        pid = k->ranks[rank].pid;
    }
    return kolorun_pid_ours(k, (pid_t)pid) ? (pid_t)pid : 0;
}

/* Adds (rank, pid) to the list; a pid there already keeps the newer
 * file (an elastic worker renumbered writes rank<R>.ready anew). */
static void kolorun_dumpers_add(kolorun_dumpers_t *l, int rank, pid_t pid,
                                const struct timespec *ready)
{
    for (int i = 0; i < l->n; i++) {
        if (l->d[i].pid != pid)
            continue;
        if (ready->tv_sec > l->d[i].ready.tv_sec ||
            (ready->tv_sec == l->d[i].ready.tv_sec &&
             ready->tv_nsec > l->d[i].ready.tv_nsec)) {
            l->d[i].rank = rank;
            l->d[i].ready = *ready;
        }
        return;
    }
    if (kolorun_grow(&l->d, &l->cap, l->n + 1, sizeof *l->d) != 0)
        return; /* out of memory: this one is not asked */
    l->d[l->n++] = (kolorun_dumper_t){.rank = rank, .pid = pid,
                                      .ready = *ready};
}

/* The ranks that said they take SIGUSR1: DIR/rank<R>.ready files written
 * since kolorun started (a second's slack for the file system's clock),
 * with a pid of this job. */
static void kolorun_dumpers_find(const kolorun_t *k, kolorun_dumpers_t *l)
{
    DIR *d = opendir(k->flight_dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        int rank, end = 0;
        pid_t pid;
        if (sscanf(e->d_name, "rank%d.ready%n", &rank, &end) != 1 ||
            e->d_name[end] != '\0' || end == 0 || rank < 0 ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) ||
            (int64_t)st.st_mtim.tv_sec * 1000000 + st.st_mtim.tv_nsec / 1000 <
                k->job_start_us - 1000000)
            continue;
        pid = kolorun_ready_pid(k, dirfd(d), e->d_name, rank);
        if (pid > 0)
            kolorun_dumpers_add(l, rank, pid, &st.st_mtim);
    }
    closedir(d);
}

/* ---- Asking for dumps, and waiting for them. */

/* DIR/rank<R>.json as it is now (*st); 0 when absent. */
static int kolorun_dump_stat(const kolorun_t *k, int rank, struct stat *st)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/rank%d.json", k->flight_dir, rank);
    return stat(path, st) == 0;
}

/* Writes why kolorun stops the job to DIR/kolorun-stop.txt, for
 * `kolo-timeline why` and the runtimes: whole, or not at all. */
static void kolorun_write_stop(const kolorun_t *k, const char *why)
{
    char *path = kolorun_strdupf("%s/kolorun-stop.txt", k->flight_dir);
    char *tmp = path ? kolorun_strdupf("%s.%ld.tmp", path, (long)getpid())
                     : NULL;
    int fd = tmp ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                 : -1;
    if (fd >= 0) {
        int ok = kolorun_write_all(fd, why, strlen(why)) == 0 &&
                 kolorun_write_all(fd, "\n", 1) == 0;
        if (close(fd) != 0 || !ok || rename(tmp, path) != 0)
            unlink(tmp);
    }
    free(tmp);
    free(path);
}

/* Starts waiting for the dumps of the ranks in f->asked: their files as
 * they are, and inotify on DIR. */
static void kolorun_wait_begin(kolorun_t *k, struct kolorun_flight *f)
{
    for (int i = 0; i < f->asked.n; i++)
        f->asked.d[i].had = kolorun_dump_stat(k, f->asked.d[i].rank,
                                              &f->asked.d[i].before);
    f->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (f->fd >= 0 &&
        inotify_add_watch(f->fd, k->flight_dir,
                          IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB) < 0) {
        close(f->fd);
        f->fd = -1;
    }
    f->until_ms = kolorun_now_ms() + KOLORUN_DUMP_GRACE_MS;
}

/* Ends the wait: closes inotify. */
static void kolorun_wait_end(struct kolorun_flight *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

static void kolorun_flight_free(kolorun_t *k)
{
    if (!k->flight)
        return;
    kolorun_wait_end(k->flight);
    free(k->flight->asked.d);
    free(k->flight);
    k->flight = NULL;
}

int kolorun_flight_ask(kolorun_t *k, int wait, const char *why)
{
    kolorun_dumpers_t l = {0};
    int n = 0;
    if (!k->flight_dir || k->nalive == 0)
        return 0;
    kolorun_dumpers_find(k, &l);
    if (wait && l.n > 0) {
        struct kolorun_flight *f = calloc(1, sizeof *f);
        if (!f) {
            free(l.d);
            return 0; /* no dumps then: the job is stopped as before */
        }
        kolorun_flight_free(k); /* (a job is stopped once) */
        k->flight = f;
        f->asked = l;
        kolorun_write_stop(k, why);
        kolorun_wait_begin(k, f);
    }
    for (int i = 0; i < l.n; i++) {
        if (kill(l.d[i].pid, SIGUSR1) == 0)
            n++;
        else if (wait)
            k->flight->asked.d[i].done = 1; /* gone since */
    }
    if (!wait)
        free(l.d);
    return n;
}

void kolorun_flight_on_usr1(kolorun_t *k)
{
    int n;
    if (!k->flight_dir) {
        kolorun_say("got SIGUSR1: the ranks have no flight recorder "
                    "directory (KOLO_FLIGHT_DIR), so none was asked for a "
                    "dump; the job goes on");
        return;
    }
    n = kolorun_flight_ask(k, 0, NULL);
    if (n > 0)
        kolorun_say("got SIGUSR1: asked %d rank%s for a flight recorder "
                    "dump (in %s); the job goes on", n, n == 1 ? "" : "s",
                    k->flight_dir);
    else
        kolorun_say("got SIGUSR1: no rank here has said it takes it (%s/"
                    "rank<R>.ready: a kolo program past kolo_init, its "
                    "recorder on), so none was sent; the job goes on",
                    k->flight_dir);
}

int kolorun_flight_fd(const kolorun_t *k)
{
    return k->dumping && k->flight ? k->flight->fd : -1;
}

void kolorun_flight_read(kolorun_t *k)
{
    char buf[4096];
    if (!k->flight || k->flight->fd < 0)
        return;
    while (read(k->flight->fd, buf, sizeof buf) > 0)
        ; /* what changed does not matter: kolorun_flight_waiting looks */
}

/* Whether asked rank i is done: its dump renewed (a new file, or the same
 * one written again), or its process gone. */
static int kolorun_dumper_done(const kolorun_t *k, kolorun_dumper_t *d)
{
    struct stat now;
    if (d->done)
        return 1;
    if (kolorun_dump_stat(k, d->rank, &now) &&
        (!d->had || now.st_ino != d->before.st_ino ||
         now.st_mtim.tv_sec != d->before.st_mtim.tv_sec ||
         now.st_mtim.tv_nsec != d->before.st_mtim.tv_nsec ||
         now.st_ctim.tv_sec != d->before.st_ctim.tv_sec ||
         now.st_ctim.tv_nsec != d->before.st_ctim.tv_nsec))
        d->done = 1;
    else if (kill(d->pid, 0) != 0 && errno == ESRCH)
        d->done = 1;
    return d->done;
}

/* The 2 s are over: names the ranks whose dump did not come. */
static void kolorun_dumps_missing(const kolorun_dumpers_t *l)
{
    char names[600] = "";
    size_t used = 0;
    int missing = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->d[i].done)
            continue;
        if (missing++ < KOLORUN_DUMP_NAMED && used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used,
                                     "%srank %d (pid %ld)",
                                     used ? ", " : "", l->d[i].rank,
                                     (long)l->d[i].pid);
    }
    if (missing > KOLORUN_DUMP_NAMED && used < sizeof names)
        snprintf(names + used, sizeof names - used, " and %d more",
                 missing - KOLORUN_DUMP_NAMED);
    kolorun_say("no flight recorder dump within %d s of SIGUSR1 from %s "
                "(stopped, or stuck where signals wait?); stopping the job "
                "anyway", KOLORUN_DUMP_GRACE_MS / 1000, names);
}

int kolorun_flight_waiting(kolorun_t *k, int64_t now, int64_t *until)
{
    struct kolorun_flight *f = k->flight;
    int pending = 0;
    if (!f)
        return 0;
    for (int i = 0; i < f->asked.n; i++)
        pending += !kolorun_dumper_done(k, &f->asked.d[i]);
    if (pending > 0 && now < f->until_ms) {
        *until = f->fd >= 0 || now + KOLORUN_DUMP_LOOK_MS > f->until_ms
                     ? f->until_ms
                     : now + KOLORUN_DUMP_LOOK_MS;
        return 1;
    }
    if (pending > 0)
        kolorun_dumps_missing(&f->asked);
    else if (k->opts.verbose)
        kolorun_say("the ranks asked for flight recorder dumps wrote them");
    kolorun_wait_end(f);
    return 0;
}

/* ---- The end of the job. */

/* "kolorun: stragglers: ..." from rank 0's DIR/stragglers.txt (its first
 * line), when there is one. */
static void kolorun_say_stragglers(const kolorun_t *k)
{
    char *path = kolorun_strdupf("%s/stragglers.txt", k->flight_dir);
    FILE *f = path ? fopen(path, "re") : NULL;
    char line[1024];
    if (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0])
            kolorun_say("stragglers: %s", line);
    }
    if (f)
        fclose(f);
    free(path);
}

/* Whether the directory holds nothing (or cannot be read). */
static int kolorun_dir_empty(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int empty = 1;
    if (!d)
        return 1;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

void kolorun_flight_end(kolorun_t *k, int rc)
{
    char *dir = k->flight_dir;
    kolorun_flight_free(k);
    if (!dir)
        return;
    kolorun_say_stragglers(k);
    if (rc != 0 && !kolorun_dir_empty(dir))
        kolorun_say("flight recorder dumps in %s; read them with: "
                    "kolo-timeline why %s", dir, dir);
    else if (k->flight_own && kolorun_rmtree(dir) != 0 && errno != ENOENT)
        kolorun_say("warning: cannot remove the flight recorder's "
                    "directory %s: %s", dir, strerror(errno));
    free(dir);
    k->flight_dir = NULL;
}
