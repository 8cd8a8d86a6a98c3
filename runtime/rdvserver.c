/*
 * rdvserver.c — a tiny key-value server in rank 0, for jobs started by
 * torchrun or srun (launchenv.c says why).
 *
 * DESIGN
 *
 * The ranks of such a job have nowhere to meet: no private directory made
 * by kolorun, no Redis server. kolo's store (store.c) and Gloo's RedisStore
 * both speak Redis's protocol, so rank 0 serves the few commands they send
 * and every rank, rank 0 too, uses KOLO_RENDEZVOUS=redis:HOST:PORT/JOB as
 * with a real Redis server:
 *
 *   PING                 +PONG
 *   SET key value        +OK
 *   SETNX key value      :1 when the key was new, else :0 (Gloo)
 *   GET key              the value, or the null bulk string
 *   EXISTS key...        how many exist (Gloo waits with it)
 *   DEL key...           how many were removed
 *   KOLO.SERVES job      :1 when this server serves that job, else :0
 *
 * The port. The launcher's (MASTER_PORT+1, ...) may be taken by another
 * program when the job starts: MASTER_PORT is often one the kernel gave
 * torchrun (odd), and the next one is of the parity Linux gives outgoing
 * connections. So rank 0 takes the first free port of KOLO__RDV_PORTS
 * from there, and the other ranks ask each of those ports KOLO.SERVES
 * with the job's name: a stranger there (another program, another job's
 * rendezvous, a Redis server) does not answer :1.
 *
 * Requests are RESP arrays of bulk strings, as every client library sends
 * them; anything else gets an error reply. One thread runs a poll() loop
 * over the listening socket and its connections, sleeping in poll() until
 * one of them has something, so it costs nothing between rendezvous. Keys
 * live in an array searched from the end: a job's rendezvous holds a few
 * keys per rank and per process set. The thread and its keys live until
 * the process exits: rank 0 may leave kolo_shutdown before the others have
 * read their last key, and a later kolo_init finds the server still there
 * (its keys are under a new prefix).
 *
 * Strangers. When the job has a secret (KOLO_SECRET, auth.c), a
 * connection must prove it before anything else: every command but
 * KOLO.SERVES is answered NOAUTH until the client has run auth.c's
 * handshake through two commands of its own,
 *
 *   KOLO.HELLO hello job   its nonce and the server's proof (64 bytes)
 *   KOLO.PROVE proof       +OK, and the connection may read and write
 *
 * keyed by a key derived from the job's key and the job's name (store.c
 * is the client). A proof that is wrong closes the connection with a
 * warning naming its address (the first few). Without a secret anyone
 * who reaches the port can read and write the keys, as with torchrun's
 * own store: the README says so.
 */
#define _GNU_SOURCE
#include "alloc.h"
#include "auth.h"
#include "rdvserver.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* A request larger than this is not a rendezvous: the connection closes. */
#define RDV_MAX_REQUEST (64 << 20)
#define RDV_MAX_ARGS 4096

typedef struct rdv_key {
    char *key, *value;
    size_t klen, vlen;
} rdv_key_t;

typedef struct rdv_conn {
    int fd;
    char *in; /* bytes received, not yet a whole request */
    size_t len, cap;
    int proved;           /* it proved the job's secret (or none is needed) */
    int hello_seen;       /* KOLO.HELLO answered: hs holds the nonces */
    kolo__handshake_t hs;
    char from[INET6_ADDRSTRLEN + 8];
} rdv_conn_t;

typedef struct rdv_server {
    int listen_fd;
    rdv_key_t *keys;
    size_t nkeys, cap;
    rdv_conn_t *conns;
    size_t nconns;
} rdv_server_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_port; /* the port served, 0 when none */
/* The jobs served (one per kolo_init of this process, at most a few). */
#define RDV_MAX_JOBS 16
static char g_jobs[RDV_MAX_JOBS][128];
static uint8_t g_keys[RDV_MAX_JOBS][KOLO__KEY_BYTES]; /* each job's store key */
static int g_keyed[RDV_MAX_JOBS];                     /* it has one */
static int g_njobs;
static int g_warned; /* dropped connections reported so far */
#define RDV_MAX_WARNINGS 5

static int serves_job(const char *job, size_t len)
{
    int yes = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_njobs && !yes; i++)
        yes = strlen(g_jobs[i]) == len && memcmp(g_jobs[i], job, len) == 0;
    pthread_mutex_unlock(&g_mu);
    return yes;
}

/* The store key of a job served (store.c derives the same), into key:
 * 1, or 0 when the job is not served or has no secret. */
static int job_key_of(const char *job, size_t len, uint8_t key[KOLO__KEY_BYTES])
{
    int found = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_njobs && !found; i++)
        if (strlen(g_jobs[i]) == len && memcmp(g_jobs[i], job, len) == 0 &&
            g_keyed[i]) {
            memcpy(key, g_keys[i], KOLO__KEY_BYTES);
            found = 1;
        }
    pthread_mutex_unlock(&g_mu);
    return found;
}

/* Whether a connection must prove a secret: some job served has one. */
static int needs_proof(void)
{
    int yes = 0;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_njobs && !yes; i++)
        yes = g_keyed[i];
    pthread_mutex_unlock(&g_mu);
    return yes;
}

/* Called with g_mu held. */
static void add_job(const char *job, const uint8_t *job_key)
{
    int i;
    for (i = 0; i < g_njobs; i++)
        if (strcmp(g_jobs[i], job) == 0)
            break;
    if (i == g_njobs) {
        if (g_njobs == RDV_MAX_JOBS) { /* the oldest goes */
            memmove(g_jobs[0], g_jobs[1], sizeof(g_jobs[0]) * (RDV_MAX_JOBS - 1));
            memmove(g_keys[0], g_keys[1], sizeof(g_keys[0]) * (RDV_MAX_JOBS - 1));
            memmove(g_keyed, g_keyed + 1, sizeof(g_keyed[0]) * (RDV_MAX_JOBS - 1));
            g_njobs--;
        }
        i = g_njobs++;
        snprintf(g_jobs[i], sizeof(g_jobs[0]), "%s", job);
    }
    g_keyed[i] = job_key != NULL;
    if (job_key != NULL)
        kolo__auth_derive(g_keys[i], job_key, "kolo store", job, strlen(job));
}

/* One warning for a connection dropped, the first few only. */
static void warn_dropped(const rdv_conn_t *c, const char *why)
{
    int n;
    pthread_mutex_lock(&g_mu);
    n = ++g_warned;
    pthread_mutex_unlock(&g_mu);
    if (n <= RDV_MAX_WARNINGS)
        kolo__log(KOLO__LOG_WARNING,
                  "rendezvous: dropped a connection from %s to rank 0's "
                  "rendezvous server: %s; the job goes on%s",
                  c->from, why,
                  n == RDV_MAX_WARNINGS
                      ? " (further dropped connections are not reported)"
                      : "");
}

/* ---- keys ----------------------------------------------------------------- */

static rdv_key_t *key_find(rdv_server_t *s, const char *k, size_t klen)
{
    for (size_t i = s->nkeys; i-- > 0;)
        if (s->keys[i].klen == klen && memcmp(s->keys[i].key, k, klen) == 0)
            return &s->keys[i];
    return NULL;
}

/* Sets a key; -1 when out of memory. */
static int key_set(rdv_server_t *s, const char *k, size_t klen, const char *v,
                   size_t vlen)
{
    rdv_key_t *e = key_find(s, k, klen);
    char *value = kolo__malloc(vlen + 1);

    if (value == NULL)
        return -1;
    memcpy(value, v, vlen);
    value[vlen] = '\0';
    if (e == NULL) {
        if (s->nkeys == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 64;
            rdv_key_t *keys = kolo__realloc(s->keys, cap * sizeof(*keys));
            if (keys == NULL) {
                free(value);
                return -1;
            }
            s->keys = keys;
            s->cap = cap;
        }
        e = &s->keys[s->nkeys];
        if ((e->key = kolo__malloc(klen + 1)) == NULL) {
            free(value);
            return -1;
        }
        memcpy(e->key, k, klen);
        e->key[klen] = '\0';
        e->klen = klen;
        e->value = NULL;
        s->nkeys++;
    }
    free(e->value);
    e->value = value;
    e->vlen = vlen;
    return 0;
}

static void key_del(rdv_server_t *s, rdv_key_t *e)
{
    free(e->key);
    free(e->value);
    *e = s->keys[--s->nkeys];
}

/* ---- the protocol --------------------------------------------------------- */

/* Parses one request at the start of buf: its argument count into *argc
 * and pointers and lengths into argv/alen. Returns the bytes it takes, 0
 * when more are needed, -1 when it is not a RESP array of bulk strings. */
static long parse_request(const char *buf, size_t len, int *argc,
                          const char **argv, size_t *alen)
{
    const char *p = buf, *end = buf + len, *nl;
    long n;

    if (len == 0)
        return 0;
    if (*p != '*')
        return -1;
    if ((nl = memchr(p, '\n', (size_t)(end - p))) == NULL)
        return len > 32 ? -1 : 0;
    n = strtol(p + 1, NULL, 10);
    if (n < 1 || n > RDV_MAX_ARGS)
        return -1;
    p = nl + 1;
    for (long i = 0; i < n; i++) {
        long blen;
        if (p >= end)
            return 0;
        if (*p != '$')
            return -1;
        if ((nl = memchr(p, '\n', (size_t)(end - p))) == NULL)
            return (size_t)(end - p) > 32 ? -1 : 0;
        blen = strtol(p + 1, NULL, 10);
        if (blen < 0 || blen > RDV_MAX_REQUEST)
            return -1;
        p = nl + 1;
        if ((size_t)(end - p) < (size_t)blen + 2)
            return 0;
        argv[i] = p;
        alen[i] = (size_t)blen;
        p += blen + 2;
    }
    *argc = (int)n;
    return (long)(p - buf);
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int send_str(int fd, const char *text)
{
    return send_all(fd, text, strlen(text));
}

static int reply_int(int fd, long long v)
{
    char line[32];
    int n = snprintf(line, sizeof(line), ":%lld\r\n", v);
    return send_all(fd, line, (size_t)n);
}

static int is_cmd(const char *arg, size_t len, const char *name)
{
    return len == strlen(name) && strncasecmp(arg, name, len) == 0;
}

/* The handshake's two commands (the file's head); -1 when the connection
 * should close. */
static int serve_proof(rdv_conn_t *c, int argc, const char **argv,
                       const size_t *alen)
{
    static const char magic[8] = {'K', 'O', 'L', 'O', 'S', 'T', 'O', 'R'};
    int fd = c->fd;

    if (is_cmd(argv[0], alen[0], "KOLO.HELLO") && argc == 3 &&
        alen[1] == KOLO__HELLO_BYTES) {
        uint8_t key[KOLO__KEY_BYTES], reply[KOLO__REPLY_BYTES];
        if (!job_key_of(argv[2], alen[2], key)) {
            warn_dropped(c, "it asked for a job this server does not serve");
            send_str(fd, "-ERR kolo's rendezvous does not serve that job\r\n");
            return -1;
        }
        kolo__handshake_init(&c->hs, magic, 0, 0, key);
        if (kolo__handshake_reply(&c->hs, (const uint8_t *)argv[1], reply) != 0) {
            warn_dropped(c, "what it sent is not kolo's hello");
            send_str(fd, "-ERR not kolo's hello\r\n");
            return -1;
        }
        c->hello_seen = 1;
        if (send_str(fd, "$64\r\n") != 0 ||
            send_all(fd, (const char *)reply, sizeof(reply)) != 0)
            return -1;
        return send_str(fd, "\r\n");
    }
    if (is_cmd(argv[0], alen[0], "KOLO.PROVE") && argc == 2 && c->hello_seen &&
        alen[1] == KOLO__PROOF_BYTES) {
        if (kolo__handshake_check(&c->hs, (const uint8_t *)argv[1]) != 0) {
            warn_dropped(c, "it did not prove the job's secret");
            send_str(fd, "-ERR that does not prove the job's secret\r\n");
            return -1;
        }
        c->proved = 1;
        return send_str(fd, "+OK\r\n");
    }
    return send_str(fd, "-NOAUTH kolo's rendezvous: prove the job's secret "
                        "with KOLO.HELLO\r\n");
}

/* Answers one request; -1 when the connection should close. */
static int serve_request(rdv_server_t *s, rdv_conn_t *c, int argc,
                         const char **argv, const size_t *alen)
{
    char head[48];
    int fd = c->fd;

    if (is_cmd(argv[0], alen[0], "KOLO.SERVES") && argc == 2)
        return reply_int(fd, serves_job(argv[1], alen[1]));
    if (!c->proved && !(c->proved = !needs_proof()))
        return serve_proof(c, argc, argv, alen);
    if (is_cmd(argv[0], alen[0], "PING") && argc == 1)
        return send_all(fd, "+PONG\r\n", 7);
    if (is_cmd(argv[0], alen[0], "SET") && argc == 3) {
        if (key_set(s, argv[1], alen[1], argv[2], alen[2]) != 0)
            return send_all(fd, "-ERR out of memory\r\n", 20);
        return send_all(fd, "+OK\r\n", 5);
    }
    if (is_cmd(argv[0], alen[0], "SETNX") && argc == 3) {
        if (key_find(s, argv[1], alen[1]) != NULL)
            return reply_int(fd, 0);
        if (key_set(s, argv[1], alen[1], argv[2], alen[2]) != 0)
            return send_all(fd, "-ERR out of memory\r\n", 20);
        return reply_int(fd, 1);
    }
    if (is_cmd(argv[0], alen[0], "GET") && argc == 2) {
        rdv_key_t *e = key_find(s, argv[1], alen[1]);
        int n;
        if (e == NULL)
            return send_all(fd, "$-1\r\n", 5);
        n = snprintf(head, sizeof(head), "$%zu\r\n", e->vlen);
        if (send_all(fd, head, (size_t)n) != 0 ||
            send_all(fd, e->value, e->vlen) != 0)
            return -1;
        return send_all(fd, "\r\n", 2);
    }
    if ((is_cmd(argv[0], alen[0], "EXISTS") || is_cmd(argv[0], alen[0], "DEL")) &&
        argc >= 2) {
        int del = is_cmd(argv[0], alen[0], "DEL");
        long long count = 0;
        for (int i = 1; i < argc; i++) {
            rdv_key_t *e = key_find(s, argv[i], alen[i]);
            count += e != NULL;
            if (e != NULL && del)
                key_del(s, e);
        }
        return reply_int(fd, count);
    }
    {
        char line[160];
        int n = snprintf(line, sizeof(line),
                         "-ERR kolo's rendezvous does not serve '%.*s' with "
                         "%d arguments\r\n",
                         (int)(alen[0] < 40 ? alen[0] : 40), argv[0], argc - 1);
        return send_all(fd, line, (size_t)n);
    }
}

/* Reads what a connection sent and answers its whole requests; -1 when it
 * is closed or broken. */
static int serve_conn(rdv_server_t *s, rdv_conn_t *c)
{
    static const char *argv[RDV_MAX_ARGS];
    static size_t alen[RDV_MAX_ARGS];
    ssize_t n;
    long used;
    int argc;

    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? c->cap * 2 : 131072;
        char *in;
        if (cap > RDV_MAX_REQUEST + 131072 || (in = kolo__realloc(c->in, cap)) == NULL)
            return -1;
        c->in = in;
        c->cap = cap;
    }
    do
        n = recv(c->fd, c->in + c->len, c->cap - c->len, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    c->len += (size_t)n;
    while ((used = parse_request(c->in, c->len, &argc, argv, alen)) > 0) {
        if (serve_request(s, c, argc, argv, alen) != 0)
            return -1;
        memmove(c->in, c->in + used, c->len - (size_t)used);
        c->len -= (size_t)used;
    }
    if (used < 0) {
        if (!c->proved)
            warn_dropped(c, "what it sent is not a request of Redis's protocol");
        send_all(c->fd, "-ERR kolo's rendezvous reads RESP arrays only\r\n", 47);
        return -1;
    }
    return 0;
}

static void conn_close(rdv_server_t *s, size_t i)
{
    close(s->conns[i].fd);
    free(s->conns[i].in);
    s->conns[i] = s->conns[--s->nconns];
}

static void conn_accept(rdv_server_t *s)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sslen,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    rdv_conn_t *conns;

    if (fd < 0)
        return;
    {
        int one = 1; /* a reply in pieces must not wait for the client's ACK */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    conns = kolo__realloc(s->conns, (s->nconns + 1) * sizeof(*conns));
    if (conns == NULL) {
        close(fd);
        return;
    }
    s->conns = conns;
    memset(&s->conns[s->nconns], 0, sizeof(s->conns[0]));
    kolo__addr_text(&ss, s->conns[s->nconns].from, sizeof(s->conns[0].from));
    s->conns[s->nconns++].fd = fd;
}

static void *server_main(void *arg)
{
    rdv_server_t *s = arg;
    struct pollfd *pfd = NULL;
    size_t cap = 0;

    for (;;) {
        if (cap < s->nconns + 1) {
            struct pollfd *p = kolo__realloc(pfd, (s->nconns + 16) * sizeof(*p));
            if (p == NULL) {
                /* Out of memory: serve what fits, wait a moment. */
                poll(NULL, 0, 100);
                continue;
            }
            pfd = p;
            cap = s->nconns + 16;
        }
        pfd[0].fd = s->listen_fd;
        pfd[0].events = POLLIN;
        for (size_t i = 0; i < s->nconns; i++) {
            pfd[i + 1].fd = s->conns[i].fd;
            pfd[i + 1].events = POLLIN;
        }
        if (poll(pfd, s->nconns + 1, -1) < 0)
            continue; /* EINTR */
        /* Connections first, from the end: closing one moves the last. */
        for (size_t i = s->nconns; i-- > 0;)
            if (pfd[i + 1].revents != 0 && serve_conn(s, &s->conns[i]) != 0)
                conn_close(s, i);
        if (pfd[0].revents & POLLIN)
            conn_accept(s);
    }
    return NULL;
}

/* A socket listening on every address of this host, IPv6 and IPv4 where
 * the host has IPv6, else IPv4 only. */
static int listen_any(int port, int *err_no)
{
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    int fd, on = 1, off = 0;

    memset(&a6, 0, sizeof(a6));
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
        if (bind(fd, (struct sockaddr *)&a6, sizeof(a6)) == 0 &&
            listen(fd, 512) == 0)
            return fd;
        *err_no = errno;
        close(fd);
        if (*err_no == EADDRINUSE)
            return -1;
    }
    memset(&a4, 0, sizeof(a4));
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err_no = errno;
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, (struct sockaddr *)&a4, sizeof(a4)) != 0 ||
        listen(fd, 512) != 0) {
        *err_no = errno;
        close(fd);
        return -1;
    }
    return fd;
}

int kolo__rdvserver_start(int port, const char *job, const uint8_t *job_key,
                          const char *why, int *served, kolo__err_t *err)
{
    rdv_server_t *s;
    pthread_t tid;
    pthread_attr_t attr;
    sigset_t all, old;
    int fd = -1, e = 0, rc, p;

    pthread_mutex_lock(&g_mu);
    if (g_port != 0) {
        rc = g_port >= port && g_port < port + KOLO__RDV_PORTS
                 ? KOLO_OK
                 : kolo__err_set(err, KOLO_ERR_CONFIG,
                                 "this process already serves a rendezvous "
                                 "on port %d, and is asked for ports %d..%d "
                                 "(%s)",
                                 g_port, port, port + KOLO__RDV_PORTS - 1, why);
        if (rc == KOLO_OK) {
            add_job(job, job_key);
            *served = g_port;
        }
        pthread_mutex_unlock(&g_mu);
        return rc;
    }
    for (p = port; p < port + KOLO__RDV_PORTS && p <= 65535; p++) {
        if ((fd = listen_any(p, &e)) >= 0)
            break;
        if (e != EADDRINUSE && e != EACCES)
            break; /* not about this port: the next one fares no better */
        kolo__debug("rendezvous port %d (%s) is taken: %s; trying the next",
                    p, why, strerror(e));
    }
    if (fd < 0) {
        pthread_mutex_unlock(&g_mu);
        return kolo__err_set(err, KOLO_ERR_BACKEND,
                             "rank 0 cannot serve the job's rendezvous on "
                             "ports %d..%d (%s): %s; set KOLO_RENDEZVOUS to "
                             "a Redis server (redis:HOST:PORT) or a shared "
                             "directory (file:DIR)",
                             port, p < port + KOLO__RDV_PORTS ? p : p - 1, why,
                             strerror(e));
    }
    if ((s = kolo__calloc(1, sizeof(*s))) == NULL) {
        close(fd);
        pthread_mutex_unlock(&g_mu);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory");
    }
    s->listen_fd = fd;
    fcntl(fd, F_SETFL, O_NONBLOCK);
    /* The program's signals are not this thread's to take. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    rc = kolo__thread_create(&tid, &attr, server_main, s);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        close(fd);
        free(s);
        pthread_mutex_unlock(&g_mu);
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "cannot start the rendezvous thread: %s",
                             strerror(rc));
    }
    g_port = p;
    add_job(job, job_key);
    *served = p;
    pthread_mutex_unlock(&g_mu);
    kolo__debug("serving the job's rendezvous on port %d (%s)", p, why);
    return KOLO_OK;
}

/* One try: connect and ask KOLO.SERVES job within a second. 0 when the
 * server at host:port serves that job. */
static int ask_serves(const char *host, int port, const char *job)
{
    struct addrinfo hints, *ai = NULL, *a;
    struct timeval tv = {1, 0};
    char service[16], request[256], reply[4];
    int ok = 0, len;

    len = snprintf(request, sizeof(request),
                   "*2\r\n$11\r\nKOLO.SERVES\r\n$%zu\r\n%s\r\n", strlen(job),
                   job);
    if (len < 0 || (size_t)len >= sizeof(request))
        return -1;
    snprintf(service, sizeof(service), "%d", port);
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, service, &hints, &ai) != 0)
        return -1;
    for (a = ai; a != NULL && !ok; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        ssize_t n = 0, got;
        if (fd < 0)
            continue;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            send_all(fd, request, (size_t)len) == 0) {
            while (n < 4 && (got = recv(fd, reply + n, (size_t)(4 - n), 0)) > 0)
                n += got;
            ok = n == 4 && memcmp(reply, ":1\r\n", 4) == 0;
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return ok ? 0 : -1;
}

int kolo__rdvserver_wait(const char *host, int port, const char *job,
                         double timeout_s, const char *why, int *found,
                         kolo__err_t *err)
{
    struct timespec t0, now;
    long pause_ms = 10;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        double waited;
        for (int p = port; p < port + KOLO__RDV_PORTS && p <= 65535; p++)
            if (ask_serves(host, p, job) == 0) {
                *found = p;
                return KOLO_OK;
            }
        clock_gettime(CLOCK_MONOTONIC, &now);
        waited = (double)(now.tv_sec - t0.tv_sec) +
                 (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
        if (waited >= timeout_s)
            return kolo__err_set(err, KOLO_ERR_TIMEOUT,
                                 "rank 0's rendezvous at %s, ports %d..%d "
                                 "(%s), did not answer within %g s "
                                 "(KOLO_START_TIMEOUT): has rank 0 started, "
                                 "and is %s reachable from here?",
                                 host, port, port + KOLO__RDV_PORTS - 1, why,
                                 timeout_s, host);
        poll(NULL, 0, (int)pause_ms);
        pause_ms = pause_ms < 200 ? pause_ms * 2 : 200;
    }
}
