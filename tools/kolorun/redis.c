/*
 * redis.c — Redis rendezvous
 *
 * With --redis HOST:PORT or --start-redis the ranks meet through a Redis
 * server (Gloo's RedisStore) instead of the private directory. Each job
 * keeps its keys under its own name (KOLO_RENDEZVOUS=redis:HOST:PORT/JOB,
 * JOB = kolo-<this host>-<pid>-<start time>), so jobs sharing a server do
 * not meet each other's keys. --start-redis runs redis-server here, in a
 * process group of its own (a Ctrl-C for the ranks is not for it) that
 * dies with kolorun, on a free port of an address the other hosts reach,
 * and stops it once the ranks are gone. kolorun_hosts_setup, which sets up
 * a job over several hosts, starts it.
 *
 * Strangers. The server kolorun starts wants a password, derived from the
 * job's secret (runtime/auth.c: the ranks derive the same one), and runs
 * in protected mode; the password reaches it on its stdin, as its
 * configuration, never on its command line. A server of the user's takes
 * --redis-password (or KOLO_REDIS_PASSWORD) and --redis-user, which the
 * ranks get in their environment. kolorun itself says AUTH first.
 */
#define _GNU_SOURCE

#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "procs.h"

/* The IPv4 address of interface iface, or (iface NULL) the first up,
 * non-loopback one. 0, or -1 when there is none. */
static int kolorun_ipv4(const char *iface, char *out, size_t n)
{
    struct ifaddrs *all, *ifa;
    int rc = -1;
    if (getifaddrs(&all) != 0)
        return -1;
    for (ifa = all; ifa && rc != 0; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET)
            continue;
        if (iface ? strcmp(ifa->ifa_name, iface) != 0
                  : (ifa->ifa_flags & IFF_LOOPBACK) || !(ifa->ifa_flags & IFF_UP))
            continue;
        const struct sockaddr_in *sin = (const void *)ifa->ifa_addr;
        if (inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)n))
            rc = 0;
    }
    freeifaddrs(all);
    return rc;
}

static const char *kolorun_getenv(const char *name) { return getenv(name); }

static void kolorun_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether something accepts TCP connections at addr:port. */
static int kolorun_tcp_open(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0;
    close(fd);
    return ok;
}

/* What --start-redis sets up, step by step (kolorun_redis_start). */
typedef struct kolorun_redis_boot {
    char addr[INET_ADDRSTRLEN]; /* the address it listens on */
    char port[16];
    struct sockaddr_in sa; /* addr:port, to see when it accepts */
    int log;               /* its output: an unlinked file */
    pid_t pid;
} kolorun_redis_boot_t;

/* The address the server listens on: --redis-bind, else that of
 * --network-interface, else loopback when every rank is here, else this
 * host's first non-loopback IPv4 address. 0, or -1 having said why. */
static int kolorun_redis_pick_addr(const kolorun_opts_t *o, char *addr,
                                   size_t n)
{
    if (o->redis_bind) {
        snprintf(addr, n, "%s", o->redis_bind);
        return 0;
    }
    if (o->network_interface &&
        kolorun_ipv4(o->network_interface, addr, n) == 0)
        return 0;
    if (!o->any_remote) {
        snprintf(addr, n, "127.0.0.1");
        return 0;
    }
    if (kolorun_ipv4(NULL, addr, n) == 0)
        return 0;
    kolorun_say("--start-redis: this host has no non-loopback IPv4 "
                "address that the other hosts could reach; give "
                "--redis-bind ADDR");
    return -1;
}

/* A free port: the kernel picks one for a socket bound to port 0. */
static int kolorun_redis_pick_port(kolorun_redis_boot_t *b)
{
    socklen_t salen = sizeof b->sa;
    memset(&b->sa, 0, sizeof b->sa);
    b->sa.sin_family = AF_INET;
    inet_pton(AF_INET, b->addr, &b->sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&b->sa, sizeof b->sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&b->sa, &salen) != 0) {
        kolorun_say("--start-redis: cannot bind %s on this host: %s", b->addr,
                    strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    snprintf(b->port, sizeof b->port, "%d", ntohs(b->sa.sin_port));
    return 0;
}

/* The server's output goes to an unlinked file, shown if it fails. */
static int kolorun_redis_open_log(kolorun_redis_boot_t *b)
{
    const char *tmp = getenv("TMPDIR");
    char *logpath = kolorun_strdupf("%s/kolorun-redis-XXXXXX",
                                    tmp && *tmp ? tmp : "/tmp");
    b->log = logpath ? mkostemp(logpath, O_CLOEXEC) : -1;
    if (b->log < 0) {
        kolorun_say("--start-redis: cannot create a log file: %s",
                    strerror(errno));
        free(logpath);
        return -1;
    }
    unlink(logpath);
    free(logpath);
    return 0;
}

/* Starts redis-server with "-": its configuration from stdin, first the
 * password, so that it is on no command line. 0, or -1 having said why. */
static int kolorun_redis_launch(kolorun_t *k, kolorun_redis_boot_t *b)
{
    int conf[2];
    if (pipe2(conf, O_CLOEXEC) != 0) {
        kolorun_say("--start-redis: pipe: %s", strerror(errno));
        return -1;
    }
    char *text = kolorun_strdupf("requirepass %s\nprotected-mode yes\n",
                                 k->redis_password);
    int wrote = text && kolorun_write_all(conf[1], text, strlen(text)) == 0;
    if (text) {
        memset(text, 0, strlen(text));
        free(text);
    }
    close(conf[1]);
    if (!wrote) {
        kolorun_say("--start-redis: cannot pass redis-server its configuration");
        close(conf[0]);
        return -1;
    }
    char *argv[] = {"redis-server", "-", "--bind", b->addr, "--port", b->port,
                    "--save", "", "--appendonly", "no", "--daemonize", "no",
                    NULL};
    b->pid = kolorun_start_helper(k, "redis-server", argv, conf[0], b->log,
                                  b->log, " (install it: apt-get install "
                                  "redis-server)");
    int fork_errno = errno;
    close(conf[0]);
    if (b->pid < 0) {
        kolorun_say("--start-redis: fork: %s", strerror(fork_errno));
        return -1;
    }
    k->redis_pid = b->pid;
    return 0;
}

/* The server ended at its start: what it said, on one line. */
static void kolorun_redis_ended(const kolorun_redis_boot_t *b)
{
    char buf[2048];
    ssize_t n = pread(b->log, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    for (char *c = buf; *c; c++)
        if (*c == '\n' && c[1])
            *c = ' ';
    buf[strcspn(buf, "\n")] = '\0';
    kolorun_say("--start-redis: redis-server on %s:%s ended at start: %s",
                b->addr, b->port, buf[0] ? buf : "(no output)");
}

/* Whether a signal that stops the job has come (the loop handles it). */
static int kolorun_stop_pending(void)
{
    int stop = 0;
    for (int i = 0; i < KOLORUN_N_STOP_SIGNALS; i++)
        stop |= kolorun_pending[kolorun_stop_signals[i]];
    return stop;
}

/* Ready when it accepts a connection; a short sleep between tries
 * (redis-server starts in milliseconds), bounded by the start timeout.
 * 0, or -1: it ended, a signal came (no job to start), or time is up. */
static int kolorun_redis_wait_ready(kolorun_t *k, const kolorun_redis_boot_t *b)
{
    const kolorun_opts_t *o = &k->opts;
    long limit_ms = (o->start_timeout ? atol(o->start_timeout) : 60) * 1000L;
    int64_t t0 = kolorun_now_ms();
    for (;;) {
        int status;
        if (waitpid(b->pid, &status, WNOHANG) == b->pid) {
            kolorun_redis_ended(b);
            k->redis_reaped = 1;
            return -1;
        }
        if (kolorun_tcp_open(&b->sa)) {
            snprintf(k->redis_addr, sizeof k->redis_addr, "%s:%s", b->addr,
                     b->port);
            return 0;
        }
        if (kolorun_stop_pending())
            return -1;
        if (kolorun_now_ms() - t0 > limit_ms) {
            kolorun_say("--start-redis: redis-server on %s:%s did not accept "
                        "connections within %ld s",
                        b->addr, b->port, limit_ms / 1000);
            return -1;
        }
        kolorun_sleep_ms(20);
    }
}

/* --start-redis: redis-server here, with the job's password, on a free
 * port; 0 once it accepts connections, or -1 having said why. */
static int kolorun_redis_start(kolorun_t *k)
{
    kolorun_redis_boot_t b = {.addr = "", .log = -1};
    if (kolorun_redis_pick_addr(&k->opts, b.addr, sizeof b.addr) != 0 ||
        kolorun_redis_pick_port(&b) != 0 || kolorun_redis_open_log(&b) != 0)
        return -1;
    int rc = kolorun_redis_launch(k, &b);
    if (rc == 0)
        rc = kolorun_redis_wait_ready(k, &b);
    close(b.log);
    if (rc == 0 && k->opts.verbose)
        kolorun_say("started redis-server (pid %ld) on %s", (long)b.pid,
                    k->redis_addr);
    return rc;
}

/* Stops the server of --start-redis: SIGTERM, SIGKILL after 3 s. */
void kolorun_redis_stop(kolorun_t *k)
{
    if (k->redis_pid <= 0 || k->redis_reaped)
        return;
    kill(k->redis_pid, SIGTERM);
    for (int i = 0;; i++) {
        pid_t w = waitpid(k->redis_pid, NULL, WNOHANG);
        if (w == k->redis_pid || (w < 0 && errno != EINTR))
            break;
        if (i == KOLORUN_GRACE_MS / 20) {
            kill(k->redis_pid, SIGKILL);
            while (waitpid(k->redis_pid, NULL, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        kolorun_sleep_ms(20);
    }
    k->redis_reaped = 1;
    if (k->opts.verbose)
        kolorun_say("stopped redis-server (pid %ld)", (long)k->redis_pid);
}

/* Connects to the job's Redis server ("HOST:PORT" or "[IPv6]:PORT"), each
 * later send and receive bounded by 2 s: *fd, or (-1) why not. NULL, or
 * why it failed. */
static const char *kolorun_redis_connect(const char *addr, int *fd)
{
    char host[256], port[16];
    const char *colon = strrchr(addr, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - addr), addr);
    snprintf(port, sizeof port, "%s", colon + 1);
    if (host[0] == '[') { /* [IPv6] */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e)
        return gai_strerror(e);
    *fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    struct timeval tv = {2, 0};
    if (*fd >= 0) {
        setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(*fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    const char *why = NULL;
    if (*fd < 0 || connect(*fd, ai->ai_addr, ai->ai_addrlen) != 0)
        why = strerror(errno);
    freeaddrinfo(ai);
    return why;
}

/* The password first: AUTH [user] password, and its reply, one line read
 * a byte at a time (what follows is EVAL's). A refusal leaves the
 * server's line in out. NULL, or why it failed. */
static const char *kolorun_redis_auth(const kolorun_t *k, int fd, char *out,
                                      size_t outlen)
{
    const char *u = k->redis_user, *p = k->redis_password, *why = NULL;
    char *auth = u[0] ? kolorun_strdupf("*3\r\n$4\r\nAUTH\r\n$%zu\r\n%s\r\n"
                                        "$%zu\r\n%s\r\n",
                                        strlen(u), u, strlen(p), p)
                      : kolorun_strdupf("*2\r\n$4\r\nAUTH\r\n$%zu\r\n%s\r\n",
                                        strlen(p), p);
    char line[256];
    size_t n = 0;
    if (!auth || kolorun_write_all(fd, auth, strlen(auth)) != 0)
        why = auth ? strerror(errno) : "out of memory";
    if (auth) {
        memset(auth, 0, strlen(auth));
        free(auth);
    }
    while (!why && n < sizeof line - 1) {
        ssize_t r = read(fd, line + n, 1);
        if (r <= 0) {
            why = r < 0 ? strerror(errno) : "no reply";
            break;
        }
        if (line[n++] == '\n')
            break;
    }
    line[n] = '\0';
    if (!why && strncmp(line, "+OK", 3) != 0) {
        line[strcspn(line, "\r\n")] = '\0';
        snprintf(out, outlen, "%s", line);
        why = "the server refused the password";
    }
    return why;
}

/* Sends EVAL script 0 arg1 arg2. NULL, or why it failed. */
static const char *kolorun_redis_send_eval(int fd, const char *script,
                                           const char *arg1, const char *arg2)
{
    const char *why = NULL;
    char *req = kolorun_strdupf("*5\r\n$4\r\nEVAL\r\n$%zu\r\n%s\r\n"
                                "$1\r\n0\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
                                strlen(script), script, strlen(arg1), arg1,
                                strlen(arg2), arg2);
    if (!req || kolorun_write_all(fd, req, strlen(req)) != 0)
        why = req ? strerror(errno) : "out of memory";
    free(req);
    return why;
}

/* Reads the reply into out: until the first line, and for a bulk string
 * its bytes, are in. An integer stays ":N"; a bulk string becomes its
 * bytes. NULL, or why it failed. */
static const char *kolorun_redis_reply(int fd, char *out, size_t outlen)
{
    size_t got = 0;
    out[0] = '\0';
    for (;;) {
        ssize_t n = read(fd, out + got, outlen - 1 - got);
        if (n <= 0)
            return n < 0 ? strerror(errno) : "no reply";
        got += (size_t)n;
        out[got] = '\0';
        char *eol = strstr(out, "\r\n");
        if (!eol && got < outlen - 1)
            continue;
        if (!eol || (out[0] != ':' && out[0] != '$')) {
            out[strcspn(out, "\r\n")] = '\0';
            return "unexpected reply";
        }
        if (out[0] == ':') {
            *eol = '\0';
            return NULL;
        }
        long len = atol(out + 1);
        size_t head = (size_t)(eol + 2 - out);
        if (len < 0 || head + (size_t)len + 2 > outlen - 1)
            return "reply too long";
        if (got >= head + (size_t)len) {
            memmove(out, out + head, (size_t)len);
            out[len] = '\0';
            return NULL;
        }
    }
}

/* Runs a Lua script on the job's Redis server (EVAL script 0 arg1 arg2),
 * in Redis's own protocol (RESP) over a plain socket, each step bounded
 * by 2 s. The reply: an integer (":N") or a bulk string ("$LEN" and the
 * bytes) into out. Returns NULL, or why it failed. */
static const char *kolorun_redis_eval(const kolorun_t *k, const char *script,
                                      const char *arg1, const char *arg2,
                                      char *out, size_t outlen)
{
    int fd = -1;
    const char *why = kolorun_redis_connect(k->redis_addr, &fd);
    if (!why && k->redis_password[0])
        why = kolorun_redis_auth(k, fd, out, outlen);
    if (!why)
        why = kolorun_redis_send_eval(fd, script, arg1, arg2);
    if (!why)
        why = kolorun_redis_reply(fd, out, outlen);
    if (fd >= 0)
        close(fd);
    return why;
}

/* A job that failed with Redis rendezvous: names the ranks, and their
 * hosts, that never reached it (a host that could not start its ranks,
 * or started them late), when others did. Each rank's first rendezvous
 * key is JOB/kolo0/agree/settings/RANK: the runtime's first kolo_init
 * publishes its settings there before anything else (agree.c). */
void kolorun_redis_missing(const kolorun_t *k)
{
    static const char script[] =
        "local m = {} local seen = 0 "
        "for r = 0, tonumber(ARGV[2]) - 1 do "
        "if redis.call('EXISTS', ARGV[1] .. r) == 1 then seen = seen + 1 "
        "else m[#m + 1] = r end end "
        "return seen .. ':' .. table.concat(m, ',')";
    char prefix[300], np[16], *reply = malloc(65536);
    if (!reply)
        return;
    snprintf(prefix, sizeof prefix, "%s/kolo0/agree/settings/", k->job_id);
    snprintf(np, sizeof np, "%d", k->opts.np);
    const char *why = kolorun_redis_eval(k, script, prefix, np, reply, 65536);
    char *list = reply[0] != ':' ? strchr(reply, ':') : NULL;
    /* Nobody arrived: the program failed before kolo_init, or is not a
     * kolo program; nothing to say then. */
    if (why || !list || atoi(reply) == 0 || list[1] == '\0') {
        free(reply);
        return;
    }
    char line[4096];
    size_t n = 0;
    int prev_host = -2;
    line[0] = '\0';
    for (char *t = strtok(list + 1, ","); t && n < sizeof line - 64;
         t = strtok(NULL, ",")) {
        int r = atoi(t), h = k->rank_host ? k->rank_host[r] : -1;
        if (h != prev_host && prev_host != -2)
            n += (size_t)snprintf(line + n, sizeof line - n, " on host %s;",
                                  prev_host >= 0 ? k->opts.hosts[prev_host].name
                                                 : "here");
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d",
                              h == prev_host ? ", " : " rank ", r);
        prev_host = h;
    }
    if (prev_host != -2 && n < sizeof line - 64)
        snprintf(line + n, sizeof line - n, " on host %s",
                 prev_host >= 0 ? k->opts.hosts[prev_host].name : "here");
    kolorun_say("never reached the rendezvous at Redis %s:%s", k->redis_addr,
                line);
    free(reply);
}

/* --redis: removes the job's keys once its ranks are gone, so that a
 * long-lived server does not collect them: a script that deletes what
 * KEYS JOB/\* finds. A failure only warns. */
void kolorun_redis_clean(const kolorun_t *k)
{
    static const char script[] =
        "local n = 0 for _, key in ipairs(redis.call('KEYS', ARGV[1] .. '*')) "
        "do redis.call('DEL', key) n = n + 1 end return n";
    char prefix[256], reply[256];
    snprintf(prefix, sizeof prefix, "%s/", k->job_id);
    const char *why = kolorun_redis_eval(k, script, prefix, "", reply,
                                         sizeof reply);
    if (why)
        kolorun_say("warning: cannot remove this job's keys (%s*) from "
                    "Redis at %s: %s",
                    prefix, k->redis_addr, why);
    else if (k->opts.verbose)
        kolorun_say("removed %s keys of this job from Redis at %s", reply + 1,
                    k->redis_addr);
}

/* SET JOB/key value on the job's server (elastic.c's records), with the
 * MAC of the job's secret the ranks check (runtime/store.c). NULL, or why
 * it failed. */
const char *kolorun_redis_set(const kolorun_t *k, const char *key,
                              const char *value)
{
    static const char script[] =
        "redis.call('SET', ARGV[1], ARGV[2]) return 1";
    char full[512], reply[64];
    uint8_t job_key[KOLO__KEY_BYTES];
    int have = 0;
    kolo__err_t e;
    snprintf(full, sizeof full, "%s/%s", k->job_id, key);
    if (kolo__auth_job_key(kolorun_getenv, job_key, &have, &e) != KOLO_OK)
        return "no job secret for the entry's MAC";
    if (!have)
        return kolorun_redis_eval(k, script, full, value, reply, sizeof reply);
    char *macd = malloc(strlen(value) + KOLO__ENTRY_MAC_CHARS + 1);
    if (!macd)
        return "out of memory";
    strcpy(macd, value);
    kolo__auth_entry_mac(job_key, k->job_id, strlen(k->job_id), key, value,
                         strlen(value), macd + strlen(value));
    memset(job_key, 0, sizeof job_key);
    const char *why = kolorun_redis_eval(k, script, full, macd, reply,
                                         sizeof reply);
    free(macd);
    return why;
}

/* Sets up the job over several hosts: which host each rank is on, the
 * job's name, the Redis server. */
int kolorun_hosts_setup(kolorun_t *k)
{
    const kolorun_opts_t *o = &k->opts;
    char me[200] = "";
    gethostname(me, sizeof me - 1);
    me[strcspn(me, ".")] = '\0';
    snprintf(k->job_id, sizeof k->job_id, "kolo-%s-%ld-%lld",
             me[0] ? me : "host", (long)getpid(), (long long)k->job_start_us);
    if (o->nhosts > 0 && !o->elastic) {
        k->rank_host = calloc((size_t)o->np, sizeof *k->rank_host);
        if (!k->rank_host) {
            kolorun_say("out of memory");
            return -1;
        }
        for (int h = 0; h < o->nhosts; h++)
            for (int i = 0; i < o->hosts[h].nranks; i++)
                k->rank_host[o->hosts[h].first_rank + i] = h;
    }
    if (o->redis)
        snprintf(k->redis_addr, sizeof k->redis_addr, "%s", o->redis);
    if (o->redis) {
        /* The user's server: its password goes to the ranks in their
         * environment (spawn.c keeps it off command lines). */
        const char *pw = o->redis_password ? o->redis_password
                                           : getenv("KOLO_REDIS_PASSWORD");
        const char *user = o->redis_user ? o->redis_user : getenv("KOLO_REDIS_USER");
        snprintf(k->redis_password, sizeof k->redis_password, "%s", pw ? pw : "");
        snprintf(k->redis_user, sizeof k->redis_user, "%s", user ? user : "");
        if ((o->redis_password && setenv("KOLO_REDIS_PASSWORD", pw, 1) != 0) ||
            (o->redis_user && setenv("KOLO_REDIS_USER", user, 1) != 0)) {
            kolorun_say("out of memory");
            return -1;
        }
    }
    if (o->start_redis) {
        /* The password the ranks derive from the job's secret (store.c). */
        uint8_t key[KOLO__KEY_BYTES];
        int have = 0;
        kolo__err_t e;
        if (kolo__auth_job_key(kolorun_getenv, key, &have, &e) != KOLO_OK ||
            !have) {
            kolorun_say("--start-redis: %s", have ? e.msg : "no job secret");
            return -1;
        }
        kolo__auth_redis_password(key, k->redis_password);
        memset(key, 0, sizeof key);
        /* Not the user's: the ranks must not take it for theirs. */
        unsetenv("KOLO_REDIS_PASSWORD");
        unsetenv("KOLO_REDIS_USER");
        return kolorun_redis_start(k);
    }
    return 0;
}

int kolorun_rdv_set(const kolorun_t *k, const char *key, const char *value)
{
    if (k->redis_addr[0]) {
        const char *why = kolorun_redis_set(k, key, value);
        if (why)
            kolorun_say("cannot write %s to Redis at %s: %s", key,
                        k->redis_addr, why);
        return why ? -1 : 0;
    }
    return kolorun_rdv_dir_set(k, key, value);
}
