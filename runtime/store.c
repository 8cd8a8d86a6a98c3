/*
 * store.c — a small key-value store over the job's rendezvous.
 *
 * Some things must be agreed by the ranks before any backend connects:
 * the settings that decide which backend connects at all, and the
 * membership of a process set that is about to connect. A backend cannot
 * carry that agreement (the ranks would first have to agree on it), so it
 * goes through the rendezvous that every rank already reaches:
 *
 *  - file:DIR: one file per key in DIR, the key's '/' written as '.'.
 *    A value is written to a temporary file and renamed into place, so a
 *    reader sees all of it or nothing.
 *  - redis:HOST:PORT[/JOB]: SET and GET in Redis's own protocol (RESP)
 *    over one plain socket, the keys under "JOB/" as the backends' keys are
 *    (kolorun removes them when the job ends).
 *
 * Waiting for a key polls it, sleeping 1 ms at first and doubling up to
 * 50 ms between looks: this runs on the API thread during kolo_init or a
 * process set's creation, never on a hot path, and never spins.
 *
 * Logging in. A connection first sends PING. A server that wants more
 * answers NOAUTH: rank 0's rendezvous server (rdvserver.c), when the job
 * has a secret, asks for auth.c's handshake (KOLO.HELLO with this side's
 * hello, KOLO.PROVE with its proof, after checking the server's), keyed
 * by a key derived from the job's key and the job's name; a Redis server
 * takes AUTH with KOLO_REDIS_PASSWORD (and KOLO_REDIS_USER, an ACL user),
 * or else with the password derived from the job's secret that kolorun
 * gives the server it starts (--start-redis). The job's key comes from
 * the environment (KOLO_SECRET, auth.c), read at the first open.
 *
 * Entries. With a secret, every value put in Redis ends with the MAC of
 * its key and bytes (auth.c's entry MAC, 64 hex digits; kolorun adds the
 * same to what it writes), checked and taken off on every read: whoever
 * can write to the server but lacks the secret cannot make a rank read an
 * address or a setting of theirs; such an entry fails the read, naming
 * it.
 */
#define _GNU_SOURCE
#include "alloc.h"
#include "auth.h"
#include "store.h"

#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct kolo__store {
    char dir[4096];  /* file: the directory; "" for Redis */
    char job[512];   /* redis: the keys' prefix ("JOB/" or "") */
    char where[600]; /* for messages: "file:DIR" or "Redis HOST:PORT" */
    int fd;          /* redis: the connection; -1 for files */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(double ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The job's key, read from the environment once. */
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static uint8_t job_key[KOLO__KEY_BYTES];
static int have_job_key;
static kolo__err_t key_err;

static const char *env_of(const char *name) { return getenv(name); }

static void load_key(void)
{
    if (kolo__auth_job_key(env_of, job_key, &have_job_key, &key_err) != KOLO_OK)
        have_job_key = -1;
}

static int redis_login(kolo__store_t *s, kolo__err_t *err);

static int redis_connect(kolo__store_t *s, const char *hostport,
                         double io_timeout_s, kolo__err_t *err)
{
    char host[256], port[16];
    const char *colon, *slash = strchr(hostport, '/');
    size_t hlen = slash ? (size_t)(slash - hostport) : strlen(hostport);
    struct addrinfo hints, *ai = NULL, *a;
    struct timeval tv;
    int e;

    /* env.c checked the form: HOST:PORT or [IPv6]:PORT, then /JOB. */
    snprintf(host, sizeof(host), "%.*s", (int)hlen, hostport);
    colon = strrchr(host, ':');
    if (colon == NULL)
        return kolo__err_set(err, KOLO_ERR_CONFIG, "bad Redis address %s", host);
    snprintf(port, sizeof(port), "%s", colon + 1);
    host[colon - host] = '\0';
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    if (slash != NULL)
        snprintf(s->job, sizeof(s->job), "%s/", slash + 1);
    snprintf(s->where, sizeof(s->where), "Redis %.*s", (int)hlen, hostport);

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if ((e = getaddrinfo(host, port, &hints, &ai)) != 0)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "cannot reach the rendezvous "
                             "at %s: %s", s->where, gai_strerror(e));
    tv.tv_sec = (time_t)io_timeout_s;
    tv.tv_usec = (suseconds_t)((io_timeout_s - (double)tv.tv_sec) * 1e6);
    for (a = ai; a != NULL && s->fd < 0; a = a->ai_next) {
        s->fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (s->fd < 0)
            continue;
        setsockopt(s->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(s->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        {
            int one = 1; /* requests are small and each waits for its reply */
            setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (connect(s->fd, a->ai_addr, a->ai_addrlen) != 0) {
            e = errno;
            close(s->fd);
            s->fd = -1;
            errno = e;
        }
    }
    freeaddrinfo(ai);
    if (s->fd < 0)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "cannot reach the rendezvous "
                             "at %s: %s", s->where, strerror(errno));
    return redis_login(s, err);
}

int kolo__store_open(const char *rendezvous, double io_timeout_s,
                     kolo__store_t **out, kolo__err_t *err)
{
    kolo__store_t *s = kolo__calloc(1, sizeof(*s));
    int rc = KOLO_OK;

    *out = NULL;
    if (s == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory opening "
                             "the rendezvous %s", rendezvous);
    s->fd = -1;
    if (strncmp(rendezvous, "file:", 5) == 0) {
        snprintf(s->dir, sizeof(s->dir), "%s", rendezvous + 5);
        snprintf(s->where, sizeof(s->where), "%.590s", rendezvous);
    } else if (strncmp(rendezvous, "redis:", 6) == 0) {
        rc = redis_connect(s, rendezvous + 6, io_timeout_s, err);
    } else {
        rc = kolo__err_set(err, KOLO_ERR_CONFIG, "rendezvous '%s' has no store",
                           rendezvous);
    }
    if (rc != KOLO_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return KOLO_OK;
}

void kolo__store_close(kolo__store_t *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s);
}

/* ---- files ---------------------------------------------------------------- */

static void file_path(const kolo__store_t *s, const char *key, const char *suffix,
                      char *out, size_t len)
{
    int n = snprintf(out, len, "%s/", s->dir);
    for (const char *k = key; *k && (size_t)n < len - 1; k++)
        out[n++] = *k == '/' ? '.' : *k;
    out[n] = '\0';
    snprintf(out + n, len - (size_t)n, "%s", suffix);
}

static int file_set(kolo__store_t *s, const char *key, const char *value,
                    size_t len, kolo__err_t *err)
{
    char tmp[4500], path[4400];
    FILE *f;
    int ok;

    file_path(s, key, "", path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (f == NULL)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "cannot write %s in the "
                             "rendezvous directory: %s", tmp, strerror(errno));
    ok = fwrite(value, 1, len, f) == len;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return kolo__err_set(err, KOLO_ERR_BACKEND, "cannot write %s in the "
                             "rendezvous directory: %s", path, strerror(e));
    }
    return KOLO_OK;
}

/* 1 and the value (len bytes) when the key is there, 0 when not, or an
 * error. */
static int file_get(kolo__store_t *s, const char *key, char **value,
                    size_t *len, kolo__err_t *err)
{
    char path[4400];
    FILE *f;
    struct stat st;
    char *buf;
    size_t got;

    file_path(s, key, "", path, sizeof(path));
    f = fopen(path, "r");
    if (f == NULL) {
        if (errno == ENOENT)
            return 0;
        return kolo__err_set(err, KOLO_ERR_BACKEND, "cannot read %s: %s", path,
                             strerror(errno));
    }
    if (fstat(fileno(f), &st) != 0 || (buf = kolo__malloc((size_t)st.st_size + 1)) == NULL) {
        fclose(f);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory reading %s", path);
    }
    got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    buf[got] = '\0';
    *value = buf;
    *len = got;
    return 1;
}

/* ---- Redis ---------------------------------------------------------------- */

static int redis_fail(kolo__store_t *s, const char *what, kolo__err_t *err)
{
    int e = errno;
    return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s: %s: %s",
                         s->where, what,
                         e == EAGAIN || e == EWOULDBLOCK ? "no answer in time"
                                                         : strerror(e));
}

static int redis_send(kolo__store_t *s, const char *const *args,
                      const size_t *lens, int n, kolo__err_t *err)
{
    char head[64];
    int k = snprintf(head, sizeof(head), "*%d\r\n", n);
    struct part {
        const char *p;
        size_t n;
    } parts[16];
    int np = 0;
    char hdrs[4][32];

    parts[np++] = (struct part){head, (size_t)k};
    for (int i = 0; i < n; i++) {
        int h = snprintf(hdrs[i], sizeof(hdrs[i]), "$%zu\r\n", lens[i]);
        parts[np++] = (struct part){hdrs[i], (size_t)h};
        parts[np++] = (struct part){args[i], lens[i]};
        parts[np++] = (struct part){"\r\n", 2};
    }
    /* One call for the whole request: sent piece by piece, Nagle's
     * algorithm held each later piece for the server's delayed ACK, 40 ms
     * a request. */
    {
        struct iovec iov[16];
        struct msghdr m;
        int first = 0;
        for (int i = 0; i < np; i++) {
            iov[i].iov_base = (void *)parts[i].p;
            iov[i].iov_len = parts[i].n;
        }
        while (first < np) {
            ssize_t w;
            memset(&m, 0, sizeof(m));
            m.msg_iov = iov + first;
            m.msg_iovlen = (size_t)(np - first);
            w = sendmsg(s->fd, &m, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return redis_fail(s, "cannot send", err);
            while (first < np && (size_t)w >= iov[first].iov_len) {
                w -= (ssize_t)iov[first].iov_len;
                first++;
            }
            if (first < np) {
                iov[first].iov_base = (char *)iov[first].iov_base + w;
                iov[first].iov_len -= (size_t)w;
            }
        }
    }
    return KOLO_OK;
}

/* Reads exactly n bytes. */
static int redis_read(kolo__store_t *s, char *buf, size_t n, kolo__err_t *err)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(s->fd, buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = ECONNRESET;
        if (r <= 0)
            return redis_fail(s, "cannot read its reply", err);
        got += (size_t)r;
    }
    return KOLO_OK;
}

/* One reply line (without CRLF) into line[len]. */
static int redis_line(kolo__store_t *s, char *line, size_t len, kolo__err_t *err)
{
    size_t n = 0;
    for (;;) {
        char c;
        KOLO__CHECK(redis_read(s, &c, 1, err));
        if (c == '\n' && n > 0 && line[n - 1] == '\r') {
            line[n - 1] = '\0';
            return KOLO_OK;
        }
        if (n + 1 < len)
            line[n++] = c;
    }
}

/* The job's name, as the entry MACs and the handshake know it. */
static size_t job_len(const kolo__store_t *s)
{
    return s->job[0] ? strlen(s->job) - 1 : 0;
}

static int redis_set(kolo__store_t *s, const char *key, const char *value,
                     size_t len, kolo__err_t *err)
{
    char full[4600], line[512], *macd = NULL;
    const char *args[3] = {"SET", full, value};
    size_t lens[3];
    int rc;

    snprintf(full, sizeof(full), "%s%s", s->job, key);
    lens[0] = 3;
    lens[1] = strlen(full);
    lens[2] = len;
    if (have_job_key == 1) {
        if ((macd = kolo__malloc(len + KOLO__ENTRY_MAC_CHARS + 1)) == NULL)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory "
                                 "writing %s to %s", full, s->where);
        memcpy(macd, value, len);
        kolo__auth_entry_mac(job_key, s->job, job_len(s), key, value, len,
                             macd + len);
        args[2] = macd;
        lens[2] = len + KOLO__ENTRY_MAC_CHARS;
    }
    rc = redis_send(s, args, lens, 3, err);
    free(macd);
    KOLO__CHECK(rc);
    KOLO__CHECK(redis_line(s, line, sizeof(line), err));
    if (line[0] != '+')
        return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                             "refused SET %s: %s", s->where, full, line);
    return KOLO_OK;
}

static int redis_get(kolo__store_t *s, const char *key, char **value,
                     size_t *len, kolo__err_t *err)
{
    char full[4600], line[512], *buf;
    const char *args[2] = {"GET", full};
    size_t lens[2];
    long n;

    snprintf(full, sizeof(full), "%s%s", s->job, key);
    lens[0] = 3;
    lens[1] = strlen(full);
    KOLO__CHECK(redis_send(s, args, lens, 2, err));
    KOLO__CHECK(redis_line(s, line, sizeof(line), err));
    if (line[0] != '$')
        return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                             "refused GET %s: %s", s->where, full, line);
    n = atol(line + 1);
    if (n < 0)
        return 0;
    if ((buf = kolo__malloc((size_t)n + 2)) == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory reading "
                             "%s from %s", full, s->where);
    if (redis_read(s, buf, (size_t)n + 2, err) != KOLO_OK) {
        free(buf);
        return err->code;
    }
    if (have_job_key == 1) {
        char want[KOLO__ENTRY_MAC_CHARS + 1];
        int right = n >= KOLO__ENTRY_MAC_CHARS;
        if (right) {
            n -= KOLO__ENTRY_MAC_CHARS;
            kolo__auth_entry_mac(job_key, s->job, job_len(s), key, buf,
                                 (size_t)n, want);
            right = kolo__auth_equal(want, buf + n, KOLO__ENTRY_MAC_CHARS);
        }
        if (!right) {
            free(buf);
            return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                                 "holds %s without the job's MAC: something "
                                 "without the job's secret wrote it (or a rank "
                                 "with another KOLO_SECRET)", s->where, full);
        }
    }
    buf[n] = '\0';
    *value = buf;
    *len = (size_t)n;
    return 1;
}

/* ---- logging in ----------------------------------------------------------- */

/* Sends one command; reads a bulk reply of exactly want bytes into out
 * (want 0: a status line, into line). Returns KOLO_OK; 1 when the server
 * answered something else (its reply's first line in line); or a failure
 * to talk to it (err written). */
static int redis_call(kolo__store_t *s, const char *const *args,
                      const size_t *lens, int n, char *line, size_t linelen,
                      uint8_t *out, size_t want, kolo__err_t *err)
{
    KOLO__CHECK(redis_send(s, args, lens, n, err));
    KOLO__CHECK(redis_line(s, line, linelen, err));
    if (want == 0)
        return line[0] == '+' ? KOLO_OK : 1;
    if (line[0] != '$' || atol(line + 1) != (long)want)
        return 1;
    {
        char tail[2];
        KOLO__CHECK(redis_read(s, (char *)out, want, err));
        KOLO__CHECK(redis_read(s, tail, 2, err));
    }
    return KOLO_OK;
}

/* Rank 0's rendezvous server: auth.c's handshake over two commands. */
static int kolo_login(kolo__store_t *s, kolo__err_t *err)
{
    static const char magic[8] = {'K', 'O', 'L', 'O', 'S', 'T', 'O', 'R'};
    uint8_t key[KOLO__KEY_BYTES], hello[KOLO__HELLO_BYTES],
        reply[KOLO__REPLY_BYTES], proof[KOLO__PROOF_BYTES];
    kolo__handshake_t hs;
    char line[512];
    size_t joblen = job_len(s);

    if (have_job_key != 1)
        return kolo__err_set(err, KOLO_ERR_CONFIG, "the rendezvous at %s wants "
                             "the job's secret, and this rank has none: set the "
                             "same KOLO_SECRET on every rank", s->where);
    kolo__auth_derive(key, job_key, "kolo store", s->job, joblen);
    kolo__handshake_init(&hs, magic, 0, 0, key);
    if (kolo__handshake_hello(&hs, hello) != 0)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "no random bytes for the "
                             "handshake with %s", s->where);
    {
        const char *args[3] = {"KOLO.HELLO", (const char *)hello, s->job};
        size_t lens[3] = {10, sizeof(hello), joblen};
        int rc = redis_call(s, args, lens, 3, line, sizeof(line), reply,
                            sizeof(reply), err);
        if (rc < 0)
            return rc;
        if (rc > 0)
            return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                                 "did not answer kolo's hello: %s", s->where,
                                 line);
    }
    if (kolo__handshake_prove(&hs, reply, proof) != 0)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s did "
                             "not prove the job's secret: another program on "
                             "that port, or a rank 0 with another KOLO_SECRET",
                             s->where);
    {
        const char *args[2] = {"KOLO.PROVE", (const char *)proof};
        size_t lens[2] = {10, sizeof(proof)};
        int rc = redis_call(s, args, lens, 2, line, sizeof(line), NULL, 0, err);
        if (rc < 0)
            return rc;
        if (rc > 0)
            return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                                 "refused this rank's proof: %s (is KOLO_SECRET "
                                 "the same on every rank?)", s->where, line);
    }
    return KOLO_OK;
}

/* A Redis server that wants a password: KOLO_REDIS_PASSWORD (with
 * KOLO_REDIS_USER), else the one derived from the job's secret. */
static int auth_login(kolo__store_t *s, kolo__err_t *err)
{
    const char *pw = getenv("KOLO_REDIS_PASSWORD"), *user = getenv("KOLO_REDIS_USER");
    char derived[2 * KOLO__KEY_BYTES + 1], line[512];
    const char *args[3];
    size_t lens[3];
    int n = 0;

    if (pw == NULL || pw[0] == '\0') {
        if (have_job_key != 1)
            return kolo__err_set(err, KOLO_ERR_CONFIG, "the rendezvous at %s "
                                 "wants a password: give kolorun "
                                 "--redis-password (or set "
                                 "KOLO_REDIS_PASSWORD)", s->where);
        kolo__auth_redis_password(job_key, derived);
        pw = derived;
    }
    args[n] = "AUTH";
    lens[n++] = 4;
    if (user != NULL && user[0] != '\0') {
        args[n] = user;
        lens[n++] = strlen(user);
    }
    args[n] = pw;
    lens[n++] = strlen(pw);
    int rc = redis_call(s, args, lens, n, line, sizeof(line), NULL, 0, err);
    if (rc <= 0)
        return rc;
    if (pw == derived)
        return kolo__err_set(err, KOLO_ERR_CONFIG, "the rendezvous at %s wants "
                             "a password and refused the one derived from the "
                             "job's secret (kolorun --start-redis's): for a "
                             "server of your own give kolorun --redis-password "
                             "(or KOLO_REDIS_PASSWORD) (%s)", s->where, line);
    return kolo__err_set(err, KOLO_ERR_CONFIG, "the rendezvous at %s refused "
                         "KOLO_REDIS_PASSWORD%s (%s)", s->where,
                         user != NULL && user[0] != '\0'
                             ? " for KOLO_REDIS_USER"
                             : "",
                         line);
}

static int redis_login(kolo__store_t *s, kolo__err_t *err)
{
    const char *args[1] = {"PING"};
    size_t lens[1] = {4};
    char line[512];

    pthread_once(&key_once, load_key);
    if (have_job_key < 0) {
        *err = key_err;
        return err->code;
    }
    int rc = redis_call(s, args, lens, 1, line, sizeof(line), NULL, 0, err);
    if (rc <= 0)
        return rc; /* +PONG: nothing to prove; or no answer */
    if (strncmp(line, "-NOAUTH", 7) != 0)
        return kolo__err_set(err, KOLO_ERR_BACKEND, "the rendezvous at %s "
                             "answered PING with: %s", s->where, line);
    return strstr(line, "KOLO.HELLO") != NULL ? kolo_login(s, err)
                                             : auth_login(s, err);
}

/* ---- both ----------------------------------------------------------------- */

int kolo__store_set(kolo__store_t *s, const char *key, const char *value,
                    size_t len, kolo__err_t *err)
{
    return s->fd >= 0 ? redis_set(s, key, value, len, err)
                      : file_set(s, key, value, len, err);
}

int kolo__store_set_once(const char *rendezvous, double io_timeout_s,
                         const char *key, const char *value, size_t len,
                         kolo__err_t *err)
{
    kolo__store_t *s, files;
    int rc;

    if (strncmp(rendezvous, "file:", 5) == 0) {
        /* A file store is only its names: on the stack, nothing to
         * allocate (the rank telling may be out of memory). */
        snprintf(files.dir, sizeof(files.dir), "%s", rendezvous + 5);
        snprintf(files.where, sizeof(files.where), "%.590s", rendezvous);
        files.job[0] = '\0';
        files.fd = -1;
        return file_set(&files, key, value, len, err);
    }
    KOLO__CHECK(kolo__store_open(rendezvous, io_timeout_s, &s, err));
    rc = kolo__store_set(s, key, value, len, err);
    kolo__store_close(s);
    return rc;
}

int kolo__store_get(kolo__store_t *s, const char *key, double wait_s,
                    char **value, kolo__err_t *err)
{
    size_t len;
    return kolo__store_get_bytes(s, key, wait_s, value, &len, err);
}

int kolo__store_get_bytes(kolo__store_t *s, const char *key, double wait_s,
                          char **value, size_t *len, kolo__err_t *err)
{
    double deadline = now_s() + wait_s, pause_ms = 1;

    *value = NULL;
    *len = 0;
    for (;;) {
        int rc = s->fd >= 0 ? redis_get(s, key, value, len, err)
                            : file_get(s, key, value, len, err);
        if (rc == 1)
            return KOLO_OK;
        if (rc < 0)
            return rc;
        if (now_s() >= deadline)
            return KOLO_ERR_TIMEOUT;
        sleep_ms(pause_ms);
        if (pause_ms < 50)
            pause_ms *= 2;
    }
}
