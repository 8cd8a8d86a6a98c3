/*
 * ring.c — kolo's own ring allreduce over TCP (ring.h says why and how it
 * is set up).
 *
 * The schedule. The buffer is cut into n segments (n ranks). Rank r sends
 * to its right neighbour r+1 and receives from its left one r-1, in
 * 2(n-1) steps:
 *   reduce-scatter, step k = 0 .. n-2: send segment r-k, receive segment
 *     r-k-1 and reduce it into this rank's copy (received (op) own is
 *     never needed: each element is reduced once per step, by one rank,
 *     as `own = own (op) received`);
 *   after it rank r holds segment r+1 reduced over every rank;
 *   allgather, step k = n-1 .. 2n-3, j = k-(n-1): send segment r+1-j,
 *     receive segment r-j into place.
 * What a step sends is what the step before received (segment r-k at step
 * k >= 1 is segment r-(k-1)-1), so nothing waits for a whole step: the
 * bytes of step k go out as soon as the same bytes of step k-1 have been
 * received and reduced. The sockets are non-blocking, and one thread
 * sends what is ready, receives what has come, and sleeps in poll(2) only
 * when it can do neither; each socket carries one direction of one step
 * after the other, so the peers never need to agree on anything but the
 * segment sizes, which every rank computes alike. The allgather copies
 * the reduced bits, so every rank ends with the same bits.
 *
 * With two ranks this is exactly Gloo's reduction (each element is a+b
 * once); a segment of zero elements (fewer elements than ranks) is a step
 * that moves nothing, on both sides alike.
 *
 * Bytes in flight. Each socket's send buffer is set (KOLO_RING_SEND_BUFFER,
 * 128K, which the kernel doubles for its bookkeeping) rather than left to
 * the kernel, which grows it to megabytes on a link that loses nothing.
 * Between network namespaces on one machine (veth pairs and a bridge), a
 * long flight comes with reordering: nstat counts segments the receiver
 * reports out of order (TcpExtTCPSACKReorder), the sender retransmits
 * some that had arrived (TcpExtTCPDSACKRecvSegs, TCPSpuriousRtxHostQueues)
 * and shrinks its window, and every byte waits in long queues, out of
 * cache. Three such hosts streaming 136 MB around a ring retransmitted
 * 4629 segments in ten rounds with autotuned buffers and 12 with 128K,
 * using 0.39 s of CPU instead of 0.66 s; a 3-host ResNet-50 step went
 * from 1.0x raw Gloo's time to 0.63x. The bound it sets: about 256K per
 * round trip, 2.5 GB/s at 100 us; a link whose bandwidth times its round
 * trip is larger wants a larger buffer (or 0, the kernel's).
 *
 * Strangers. The listening socket is open only while the ring connects.
 * Each connection proves the context's key in auth.c's handshake: the
 * connecting side writes its hello, the listening side answers every
 * connection it accepts, without blocking, keeps the first that proves
 * the key and drops every other with a warning, as Gloo's pairs do in
 * gloo_ops.cc; the connecting side sends nothing more before the right
 * neighbour has proved the key too.
 */
#define _GNU_SOURCE

#include "config.h"

#include "alloc.h"
#include "auth.h"
#include "ring.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_STRANGERS 16
#define MAX_WARNINGS 5
/* Received bytes of a reduce-scatter step land here before they are
 * reduced into place: small enough to stay in cache. */
#define SCRATCH_BYTES (1u << 20)
/* Pieces (runs of a tensor) sent or received by one call. */
#define MAX_IOV 64

static const char hello_magic[8] = {'K', 'O', 'L', 'O', 'R', 'I', 'N', 'G'};

struct kolo__ring {
    int rank, size;
    int lfd;                  /* listening, until connected */
    int to_right, from_left;  /* connected sockets, non-blocking */
    char self[KOLO__RING_ADDR_LEN];
    char right[KOLO__RING_ADDR_LEN], left[INET6_ADDRSTRLEN + 8];
    uint8_t *scratch;         /* SCRATCH_BYTES + 8 */
    uint8_t *work;            /* the streamed form's buffer */
    size_t work_bytes;
    int broken;
    char why[256];            /* the first failure, for later calls */
    atomic_int waiting;       /* the rank waited for, or -1 */
    int warned;
    int (*gave_up)(void *arg, char *why, size_t len); /* may be NULL */
    void *gave_up_arg;
};

void kolo__ring_set_gave_up(kolo__ring_t *r,
                            int (*gave_up)(void *arg, char *why, size_t len),
                            void *arg)
{
    r->gave_up = gave_up;
    r->gave_up_arg = arg;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Milliseconds left until deadline, for poll (at least 0). */
static int ms_left(double deadline)
{
    double left = (deadline - now_s()) * 1000.0;
    if (left <= 0)
        return 0;
    return left > 2e9 ? 2000000000 : (int)left + 1;
}

static int set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* No delay for small messages; the send buffer set (not autotuned) where
 * send_buffer > 0 (the file's head says why). */
static void tune(int fd, size_t send_buffer)
{
    int one = 1, bytes = send_buffer > INT_MAX ? INT_MAX : (int)send_buffer;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (bytes > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

int kolo__ring_listen(const char *hostname, kolo__ring_t **out,
                      char addr[KOLO__RING_ADDR_LEN], char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL, *ai;
    char name[256] = "", host[INET6_ADDRSTRLEN];
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    kolo__ring_t *r;
    int rc, fd = -1, saved = 0;

    if (hostname == NULL || hostname[0] == '\0')
        gethostname(name, sizeof(name) - 1);
    else
        snprintf(name, sizeof(name), "%s", hostname);
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    rc = getaddrinfo(name, "0", &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "ring: cannot resolve '%s': %s", name,
                 gai_strerror(rc));
        return KOLO_ERR_BACKEND;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0 &&
            set_nonblocking(fd) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "ring: cannot listen on '%s': %s", name,
                 strerror(saved));
        return KOLO_ERR_BACKEND;
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        snprintf(err, errlen, "ring: getsockname: %s", strerror(errno));
        close(fd);
        return KOLO_ERR_BACKEND;
    }
    r = kolo__calloc(1, sizeof(*r));
    if (r != NULL)
        r->scratch = kolo__malloc(SCRATCH_BYTES + 8);
    if (r == NULL || r->scratch == NULL) {
        free(r);
        close(fd);
        snprintf(err, errlen, "ring: out of memory");
        return KOLO_ERR_NO_MEMORY;
    }
    r->lfd = fd;
    r->to_right = r->from_left = -1;
    atomic_init(&r->waiting, -1);
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host,
                  sizeof(host));
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host,
                  sizeof(host));
    snprintf(addr, KOLO__RING_ADDR_LEN, "%s %u", host,
             (unsigned)ntohs(ss.ss_family == AF_INET6
                                 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                 : ((struct sockaddr_in *)&ss)->sin_port));
    snprintf(r->self, sizeof(r->self), "%s", addr);
    *out = r;
    return KOLO_OK;
}

/* Connects to "ADDRESS PORT" within deadline; a refused connection is
 * tried again (the peer listens before it publishes, but a retry costs
 * nothing). Returns the socket, non-blocking, or -1 with err written. */
static int dial(kolo__ring_t *r, const char *where, double deadline, char *err,
                size_t errlen)
{
    char host[INET6_ADDRSTRLEN + 1], port[16];
    struct addrinfo hints, *res = NULL;
    int rc, fd = -1, e = 0;

    if (sscanf(where, "%46s %15s", host, port) != 2) {
        snprintf(err, errlen, "ring: rank %d's address '%s' is malformed",
                 (r->rank + 1) % r->size, where);
        return -1;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "ring: rank %d's address '%s': %s",
                 (r->rank + 1) % r->size, where, gai_strerror(rc));
        return -1;
    }
    for (;;) {
        struct pollfd p;
        socklen_t len = sizeof(e);
        fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC |
                                        SOCK_NONBLOCK, res->ai_protocol);
        if (fd < 0) {
            e = errno;
            break;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            e = 0;
            break;
        }
        e = errno;
        if (e == EINPROGRESS) {
            p.fd = fd;
            p.events = POLLOUT;
            rc = poll(&p, 1, ms_left(deadline));
            if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 &&
                e == 0)
                break;
            if (rc == 0)
                e = ETIMEDOUT;
        }
        close(fd);
        fd = -1;
        if (e != ECONNREFUSED || now_s() >= deadline)
            break;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen,
                 "ring: rank %d cannot connect to rank %d at %s: %s",
                 r->rank, (r->rank + 1) % r->size, where, strerror(e));
    return fd;
}

/* Writes all of buf to a non-blocking socket within deadline. */
static int write_all(int fd, const uint8_t *buf, size_t n, double deadline)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = send(fd, buf + done, n - done, MSG_NOSIGNAL);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, ms_left(deadline)) == 0) {
                errno = ETIMEDOUT;
                return -1;
            }
            continue;
        }
        return -1;
    }
    return 0;
}

/* A connection accepted while the ring connects, until it has proved the
 * job's secret: `got` bytes of its hello (stage 0), then of its proof
 * (stage 1, after this rank's reply went out). */
typedef struct {
    int fd;
    int stage;
    size_t got;
    uint8_t buf[KOLO__HELLO_BYTES];
    kolo__handshake_t hs;
    char from[INET6_ADDRSTRLEN + 8];
} stranger_t;

static void drop(kolo__ring_t *r, stranger_t *s, kolo__ops_warn_fn warn,
                 const char *why)
{
    char msg[512];
    close(s->fd);
    s->fd = -1;
    if (why == NULL || warn == NULL || ++r->warned > MAX_WARNINGS)
        return;
    snprintf(msg, sizeof(msg),
             "Gloo: dropped a connection from %s to rank %d's ring socket: "
             "%s; the job goes on%s",
             s->from, r->rank, why,
             r->warned == MAX_WARNINGS
                 ? " (further dropped connections are not reported)"
                 : "");
    warn(msg);
}

/* Reads what a stranger has sent so far and takes the handshake a step
 * further: its hello answered, its proof checked. Returns 1 once it has
 * proved the secret (it is the left neighbour), 0 while it has more to
 * send, -1 when it was dropped. */
static int screen(kolo__ring_t *r, stranger_t *c, kolo__ops_warn_fn warn)
{
    for (;;) {
        size_t want = c->stage == 0 ? KOLO__HELLO_BYTES : KOLO__PROOF_BYTES;
        ssize_t n = recv(c->fd, c->buf + c->got, want - c->got, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0) {
            drop(r, c, warn,
                 n == 0 ? "it closed the connection before proving the "
                          "job's secret"
                        : "reading its handshake failed");
            return -1;
        }
        c->got += (size_t)n;
        if (c->got < want)
            continue;
        c->got = 0;
        if (c->stage == 1) {
            if (kolo__handshake_check(&c->hs, c->buf) != 0) {
                drop(r, c, warn, "it did not prove the job's secret");
                return -1;
            }
            return 1;
        }
        uint8_t reply[KOLO__REPLY_BYTES];
        if (kolo__handshake_reply(&c->hs, c->buf, reply) != 0) {
            drop(r, c, warn, "what it sent is not the left neighbour's hello");
            return -1;
        }
        /* A fresh connection's send buffer takes the reply whole. */
        if (send(c->fd, reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT) !=
            (ssize_t)sizeof(reply)) {
            drop(r, c, warn, "answering its hello failed");
            return -1;
        }
        c->stage = 1;
    }
}

/* The connecting side's half: reads the right neighbour's reply to this
 * rank's hello and sends the proof. Returns 1 when done, 0 while the
 * reply is incomplete, -1 with err written. */
static int answer_right(kolo__ring_t *r, kolo__handshake_t *hs, uint8_t *buf,
                        size_t *got, double deadline, char *err, size_t errlen)
{
    for (;;) {
        ssize_t n = recv(r->to_right, buf + *got, KOLO__REPLY_BYTES - *got,
                         MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0) {
            snprintf(err, errlen,
                     "ring: rank %d's connection to rank %d at %s %s before "
                     "the handshake ended (is rank %d alive, with the same "
                     "KOLO_SECRET?)",
                     r->rank, (r->rank + 1) % r->size, r->right,
                     n == 0 ? "was closed" : strerror(errno),
                     (r->rank + 1) % r->size);
            return -2; /* the peer is gone: an echo of its own failure */
        }
        *got += (size_t)n;
        if (*got < KOLO__REPLY_BYTES)
            continue;
        uint8_t proof[KOLO__PROOF_BYTES];
        if (kolo__handshake_prove(hs, buf, proof) != 0) {
            snprintf(err, errlen,
                     "ring: what answered rank %d at %s (rank %d's address) "
                     "did not prove the job's secret: another program on "
                     "that port, or a rank with another KOLO_SECRET",
                     r->rank, r->right, (r->rank + 1) % r->size);
            return -1;
        }
        if (write_all(r->to_right, proof, sizeof(proof), deadline) != 0) {
            snprintf(err, errlen, "ring: rank %d cannot send its proof to "
                     "rank %d at %s: %s", r->rank, (r->rank + 1) % r->size,
                     r->right, strerror(errno));
            return -1;
        }
        return 1;
    }
}

/* What meet() carries from one step to the next. */
typedef struct {
    kolo__ring_t *r;
    const uint8_t *key;
    kolo__handshake_t *right; /* this rank's handshake with its right one */
    double deadline, timeout_s;
    kolo__ops_warn_fn warn;
    char *err;
    size_t errlen;
    int left;       /* the left neighbour's rank */
    int found;      /* the left socket; negative while none (meet says) */
    int right_done; /* the right neighbour has proved the key */
    uint8_t reply[KOLO__REPLY_BYTES]; /* the right neighbour's, so far */
    size_t reply_got;
    stranger_t s[MAX_STRANGERS];
    struct pollfd p[MAX_STRANGERS + 2];
    int idx[MAX_STRANGERS + 2]; /* p[k] is: -1 listening, -2 right, i s[i] */
} meeting_t;

static int meet_watch(meeting_t *m, int np, int fd, int what)
{
    m->p[np].fd = fd;
    m->p[np].events = POLLIN;
    m->idx[np] = what;
    return np + 1;
}

/* The sockets to wait on: the listening one and the strangers' until the
 * left neighbour is found, the right one until it has proved the key. */
static int meet_fds(meeting_t *m)
{
    int np = 0;

    if (m->found < 0)
        np = meet_watch(m, np, m->r->lfd, -1);
    if (!m->right_done)
        np = meet_watch(m, np, m->r->to_right, -2);
    for (int i = 0; i < MAX_STRANGERS && m->found < 0; i++)
        if (m->s[i].fd >= 0)
            np = meet_watch(m, np, m->s[i].fd, i);
    return np;
}

/* The wait ran out: says who did not come. */
static void meet_timed_out(meeting_t *m)
{
    const kolo__ring_t *r = m->r;
    const int right = (r->rank + 1) % r->size;

    if (m->found < 0)
        snprintf(m->err, m->errlen,
                 "ring: rank %d (%s) waited %.1f s for rank %d to "
                 "connect its ring socket (is rank %d alive, and "
                 "KOLO_START_TIMEOUT long enough?)",
                 r->rank, r->self, m->timeout_s, m->left, m->left);
    else
        snprintf(m->err, m->errlen,
                 "ring: rank %d waited %.1f s for rank %d at %s to "
                 "answer its hello (is rank %d alive, and "
                 "KOLO_START_TIMEOUT long enough?)",
                 r->rank, m->timeout_s, right, r->right, right);
    if (m->found >= 0)
        close(m->found);
    m->found = -2;
}

/* Sleeps until one of the np sockets is ready: 1 when some is, 0 to look
 * again (interrupted, or a slice passed and no peer gave up), -1 when
 * meet() ends (found and err say how). */
static int meet_wait(meeting_t *m, int np)
{
    kolo__ring_t *r = m->r;
    int wait_ms = ms_left(m->deadline), rc;

    if (r->gave_up != NULL && wait_ms > 200)
        wait_ms = 200; /* a slice: then ask whether a peer gave up */
    rc = poll(m->p, (nfds_t)np, wait_ms);
    if (rc < 0 && errno == EINTR)
        return 0;
    if (rc == 0 && r->gave_up != NULL) {
        if (r->gave_up(r->gave_up_arg, m->err, m->errlen)) {
            if (m->found >= 0)
                close(m->found); /* the left neighbour's, no longer used */
            m->found = -3;
            return -1;
        }
        if (ms_left(m->deadline) > 0)
            return 0;
    }
    if (rc <= 0) {
        meet_timed_out(m);
        return -1;
    }
    return 1;
}

/* Stranger c proved the key: it is the left neighbour. */
static void meet_left(meeting_t *m, stranger_t *c)
{
    m->found = c->fd;
    c->fd = -1;
    snprintf(m->r->left, sizeof(m->r->left), "%s", c->from);
}

/* Takes the handshakes of the ready sockets further (the right
 * neighbour's reply, the strangers' hellos and proofs); returns whether
 * the listening socket has connections to accept. */
static int meet_serve(meeting_t *m, int np)
{
    int accept_now = 0;

    for (int k = 0; k < np; k++) {
        if (m->p[k].revents == 0)
            continue;
        if (m->idx[k] == -1) {
            accept_now = 1;
            continue;
        }
        if (m->idx[k] == -2) {
            int a = answer_right(m->r, m->right, m->reply, &m->reply_got,
                                 m->deadline, m->err, m->errlen);
            if (a < 0) {
                if (m->found >= 0)
                    close(m->found);
                m->found = a == -2 ? -4 : -3;
                break;
            }
            m->right_done = a;
            continue;
        }
        stranger_t *c = &m->s[m->idx[k]];
        if (m->found >= 0 || c->fd < 0)
            continue;
        if (screen(m->r, c, m->warn) == 1)
            meet_left(m, c);
    }
    return accept_now;
}

/* A free place for a stranger; when all are taken, the first held goes. */
static stranger_t *meet_slot(meeting_t *m)
{
    for (int i = 0; i < MAX_STRANGERS; i++)
        if (m->s[i].fd < 0)
            return &m->s[i];
    drop(m->r, &m->s[0], m->warn,
         "more connections were waiting to prove the job's "
         "secret than the ring holds");
    return &m->s[0];
}

/* Accepts every connection waiting on the listening socket, each a
 * stranger until it proves the key. */
static void meet_accept(meeting_t *m)
{
    kolo__ring_t *r = m->r;

    while (m->found < 0) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(r->lfd, (struct sockaddr *)&ss, &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE ||
                       errno == ENOBUFS || errno == ENOMEM)) {
            /* The connection stays queued and the socket readable:
             * waiting on would only spin until the deadline. */
            snprintf(m->err, m->errlen, "ring: rank %d cannot accept "
                     "rank %d's connection: %s%s", r->rank, m->left,
                     strerror(errno), errno == EMFILE ? " (ulimit -n)" : "");
            m->found = -3;
            break;
        }
        if (fd < 0)
            break;
        stranger_t *c = meet_slot(m);
        c->fd = fd;
        c->stage = 0;
        c->got = 0;
        kolo__handshake_init(&c->hs, hello_magic, (uint32_t)m->left,
                             (uint32_t)r->rank, m->key);
        kolo__addr_text(&ss, c->from, sizeof(c->from));
        /* Its hello may be there already. */
        if (screen(r, c, m->warn) == 1)
            meet_left(m, c);
    }
}

/* Drops every connection that has not proved the key: those still in the
 * backlog would go with the listening socket, unreported. */
static void meet_drop_rest(meeting_t *m)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        stranger_t late = {.got = 0};
        late.fd = accept4(m->r->lfd, (struct sockaddr *)&ss, &len,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (late.fd < 0)
            break;
        kolo__addr_text(&ss, late.from, sizeof(late.from));
        drop(m->r, &late, m->warn,
             "it had not proved the job's secret when the ring connected");
    }
    for (int i = 0; i < MAX_STRANGERS; i++)
        if (m->s[i].fd >= 0)
            drop(m->r, &m->s[i], m->warn,
                 "it had not proved the job's secret when the ring connected");
}

/* Accepts connections until one proves to be the left neighbour, while
 * answering the right neighbour's handshake on to_right; returns the left
 * socket (-2: timed out, -3: failed, -4: the right neighbour went away
 * mid-handshake; err written). */
static int meet(kolo__ring_t *r, const uint8_t *key, kolo__handshake_t *right,
                double deadline, double timeout_s, kolo__ops_warn_fn warn,
                char *err, size_t errlen)
{
    meeting_t m = {.r = r, .key = key, .right = right, .deadline = deadline,
                   .timeout_s = timeout_s, .warn = warn, .err = err,
                   .errlen = errlen, .left = (r->rank - 1 + r->size) % r->size,
                   .found = -1};

    for (int i = 0; i < MAX_STRANGERS; i++)
        m.s[i].fd = -1;
    while (m.found < 0 || !m.right_done) {
        int np = meet_fds(&m), ready = meet_wait(&m, np);
        if (ready < 0)
            break;
        if (ready == 0)
            continue;
        int accept_now = meet_serve(&m, np);
        if (m.found == -3 || m.found == -4)
            break;
        if (accept_now)
            meet_accept(&m);
    }
    meet_drop_rest(&m);
    return m.found;
}

int kolo__ring_connect(kolo__ring_t *r, int rank, int size,
                       const char *right_addr,
                       const uint8_t key[KOLO__KEY_BYTES],
                       double timeout_s, size_t send_buffer,
                       kolo__ops_warn_fn warn, char *err, size_t errlen)
{
    const double deadline = now_s() + timeout_s;
    uint8_t hello[KOLO__HELLO_BYTES];
    kolo__handshake_t right;

    char host[INET6_ADDRSTRLEN + 1] = "?";
    unsigned port = 0;

    r->rank = rank;
    r->size = size;
    sscanf(right_addr, "%46s %u", host, &port);
    snprintf(r->right, sizeof(r->right), strchr(host, ':') ? "[%s]:%u" : "%s:%u",
             host, port);
    /* Connecting first cannot deadlock: the kernel completes a connection
     * to a listening socket, and the hello fits its buffers, before the
     * peer accepts; the rest of both handshakes goes on in meet(), which
     * answers the left neighbour while it waits for the right one. */
    r->to_right = dial(r, right_addr, deadline, err, errlen);
    if (r->to_right < 0)
        return KOLO_ERR_BACKEND;
    kolo__handshake_init(&right, hello_magic, (uint32_t)rank,
                         (uint32_t)((rank + 1) % size), key);
    if (kolo__handshake_hello(&right, hello) != 0 ||
        write_all(r->to_right, hello, sizeof(hello), deadline) != 0) {
        snprintf(err, errlen,
                 "ring: rank %d cannot present itself to rank %d at %s: %s",
                 rank, (rank + 1) % size, right_addr, strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    r->from_left = meet(r, key, &right, deadline, timeout_s, warn, err, errlen);
    close(r->lfd);
    r->lfd = -1;
    if (r->from_left < 0)
        return r->from_left == -3   ? KOLO_ERR_BACKEND
               : r->from_left == -4 ? KOLO_ERR_RANK_LOST
                                    : KOLO_ERR_TIMEOUT;
    tune(r->to_right, send_buffer);
    tune(r->from_left, send_buffer);
    return KOLO_OK;
}

int kolo__ring_waiting_for(const kolo__ring_t *r)
{
    return r == NULL ? -1 : atomic_load(&r->waiting);
}

void kolo__ring_close(kolo__ring_t *r)
{
    if (r == NULL)
        return;
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->to_right >= 0)
        close(r->to_right);
    if (r->from_left >= 0)
        close(r->from_left);
    free(r->scratch);
    free(r->work);
    free(r);
}

/* ---- the allreduce ------------------------------------------------------ */

typedef struct {
    size_t count, esize;
    int n, r;
} plan_t;

static size_t mod_n(long v, int n)
{
    long m = v % n;
    return (size_t)(m < 0 ? m + n : m);
}

/* Element offset of segment i. */
static size_t seg_at(const plan_t *pl, size_t i)
{
    /* Divided first: count * i could overflow. */
    size_t q = pl->count / (size_t)pl->n, rem = pl->count % (size_t)pl->n;
    return q * i + (i < rem ? i : rem);
}

static size_t seg_bytes(const plan_t *pl, size_t i)
{
    return (seg_at(pl, i + 1) - seg_at(pl, i)) * pl->esize;
}

static size_t send_seg(const plan_t *pl, int k)
{
    if (k < pl->n - 1)
        return mod_n((long)pl->r - k, pl->n);
    return mod_n((long)pl->r + 1 - (k - (pl->n - 1)), pl->n);
}

static size_t recv_seg(const plan_t *pl, int k)
{
    if (k < pl->n - 1)
        return mod_n((long)pl->r - k - 1, pl->n);
    return mod_n((long)pl->r - (k - (pl->n - 1)), pl->n);
}

/* The bytes of send step ks that may go: all of step 0's, and those of
 * step k once step k-1 received and reduced (or placed) them. */
static size_t ready_bytes(const plan_t *pl, int ks, int kr, size_t done)
{
    size_t len = seg_bytes(pl, send_seg(pl, ks));
    if (ks == 0 || ks - 1 < kr)
        return len;
    return ks - 1 == kr ? done : 0;
}


/* Where the bytes of one allreduce live and come from. The segments are
 * reduced and gathered in the caller's buffer (plain form), or, streamed
 * (s not NULL), where the results are to stay (s->place: the output
 * tensors) or else in the ring's work buffer, whose results go out
 * through s->drain; this rank's input is read through s (view where it
 * lies, else fill). The reducing rank finishes each result (s->finish)
 * before anyone else sees it. */
typedef struct {
    uint8_t *buf; /* NULL where every result is placed */
    const kolo__ops_stream_t *s;
    kolo__ops_reduce_fn reduce;
    size_t esize;
    size_t filled;  /* streamed, step 0: bytes of the segment filled */
    size_t settled; /* streamed: bytes of the current step settled */
} io_t;

/* Where byte `at` of the batch lives: in *len, how many of the `want`
 * bytes follow it there. */
static uint8_t *at_ptr(const io_t *io, size_t at, size_t want, size_t *len)
{
    if (io->buf == NULL) {
        const size_t es = io->esize, skip = at % es;
        size_t run = 0;
        uint8_t *p = io->s->place(io->s->arg, at / es,
                                  (want + skip + es - 1) / es, &run);
        *len = run * es - skip < want ? run * es - skip : want;
        return p + skip;
    }
    *len = want;
    return io->buf + at;
}

/* Fills n elements of this rank's input from element el, in place. */
static void fill_at(const io_t *io, size_t el, size_t n)
{
    const size_t es = io->esize;
    while (n > 0) {
        size_t len;
        uint8_t *p = at_ptr(io, el * es, n * es, &len);
        io->s->fill(io->s->arg, p, el, len / es);
        el += len / es;
        n -= len / es;
    }
}

/* Finishes the n results from element el and drains those not placed. */
static void settle(const io_t *io, size_t el, size_t n, int finish)
{
    const size_t es = io->esize;
    while (n > 0) {
        size_t len;
        uint8_t *p = at_ptr(io, el * es, n * es, &len);
        if (finish && io->s->finish != NULL)
            io->s->finish(io->s->arg, p, len / es);
        if (io->buf != NULL)
            io->s->drain(io->s->arg, p, el, len / es);
        el += len / es;
        n -= len / es;
    }
}

/* Up to want bytes of step 0's segment (which ends at byte `end`) from
 * byte `at`, where they lie. */
static const uint8_t *input_at(io_t *io, size_t at, size_t want, size_t end,
                               size_t *len)
{
    const size_t es = io->esize, el = at / es, skip = at % es;
    if (io->s->view != NULL) {
        size_t run = 0;
        const uint8_t *p =
            io->s->view(io->s->arg, el, (want + skip + es - 1) / es, &run);
        if (p != NULL) {
            *len = run * es - skip < want ? run * es - skip : want;
            return p + skip;
        }
    }
    if (io->filled <= at) { /* fill the next piece, in cache */
        size_t n;
        if (io->filled < el * es) /* the bytes before were viewed */
            io->filled = el * es;
        n = (end - io->filled) / es;
        if (n > SCRATCH_BYTES / es)
            n = SCRATCH_BYTES / es;
        fill_at(io, io->filled / es, n);
        io->filled += n * es;
    }
    if (want > io->filled - at)
        want = io->filled - at;
    return at_ptr(io, at, want, len);
}

/* The m elements from byte `at` = this rank's input there (op) received. */
static void reduce_in(io_t *io, size_t at, const uint8_t *received, size_t m)
{
    const size_t es = io->esize;
    size_t el = at / es;
    if (io->s == NULL) {
        io->reduce(io->buf + at, io->buf + at, received, m);
        return;
    }
    while (m > 0) {
        size_t run = 0, len;
        const uint8_t *p =
            io->s->view != NULL ? io->s->view(io->s->arg, el, m, &run) : NULL;
        uint8_t *dst;
        if (p == NULL) {
            /* Filled once (a fill may scale an input that is also the
             * output), then reduced there, run by run. */
            fill_at(io, el, m);
            for (; m > 0; el += run, received += run * es, m -= run) {
                dst = at_ptr(io, el * es, m * es, &len);
                run = len / es;
                io->reduce(dst, dst, received, run);
            }
            return;
        }
        dst = at_ptr(io, el * es, run * es, &len);
        run = len / es;
        io->reduce(dst, p, received, run);
        el += run;
        received += run * es;
        m -= run;
    }
}

static int fail(kolo__ring_t *r, int code, char *err, size_t errlen,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int fail(kolo__ring_t *r, int code, char *err, size_t errlen,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof(r->why), fmt, ap);
    va_end(ap);
    r->broken = code;
    atomic_store(&r->waiting, -1);
    snprintf(err, errlen, "%s", r->why);
    return code;
}

static int lost(int e)
{
    return e == ECONNRESET || e == EPIPE || e == ECONNABORTED ||
           e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH;
}

/* What an operation has done so far, for its failure's message. */
typedef struct {
    const char *what; /* "ring allreduce", "ring exchange" */
    size_t total;     /* its bytes */
    int step, steps;  /* the step receiving (1-based) */
    size_t got, want; /* bytes of that step received, expected */
} where_t;

static int fail_where(kolo__ring_t *r, int code, const where_t *w,
                      char *err, size_t errlen, const char *fmt, int rank,
                      const char *addr, const char *detail)
{
    return fail(r, code, err, errlen,
                "%s of %zu bytes%s rank %d (%s)%s, at step %d of %d, %zu of "
                "%zu bytes received",
                w->what, w->total, fmt, rank, addr, detail, w->step, w->steps,
                w->got, w->want);
}

/* Sends what the socket takes now of the niov pieces: the bytes sent, 0
 * where it takes none, -1 when the ring failed (err written). */
static ssize_t send_some(kolo__ring_t *r, struct iovec *iov, int niov,
                         const where_t *w, char *err, size_t errlen)
{
    char detail[128];
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(r->to_right, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0)
        return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    int e = n < 0 ? errno : EPIPE;
    snprintf(detail, sizeof(detail), " failed: %s (connection closed by peer?)",
             strerror(e));
    fail_where(r, lost(e) ? KOLO_ERR_RANK_LOST : KOLO_ERR_BACKEND, w, err,
               errlen, ": sending to", (r->rank + 1) % r->size, r->right,
               detail);
    return -1;
}

/* Receives what has come into the niov pieces: the bytes received, 0
 * where none, -1 when the ring failed (err written). */
static ssize_t recv_some(kolo__ring_t *r, struct iovec *iov, int niov,
                         const where_t *w, char *err, size_t errlen)
{
    char detail[128];
    const int left = (r->rank - 1 + r->size) % r->size;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = recvmsg(r->from_left, &m, MSG_DONTWAIT);
    if (n > 0)
        return n;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    if (n == 0) {
        fail_where(r, KOLO_ERR_RANK_LOST, w, err, errlen, ":", left, r->left,
                   " closed its connection (connection closed by peer)");
        return -1;
    }
    int e = errno;
    snprintf(detail, sizeof(detail), " failed: %s", strerror(e));
    fail_where(r, lost(e) ? KOLO_ERR_RANK_LOST : KOLO_ERR_BACKEND, w, err,
               errlen, ": receiving from", left, r->left, detail);
    return -1;
}

/* Sleeps until the right socket takes bytes (want_send) or the left one
 * has some (want_recv), at most timeout_s. */
static int wait_io(kolo__ring_t *r, int want_send, int want_recv,
                   double timeout_s, const where_t *w, char *err, size_t errlen)
{
    const int left = (r->rank - 1 + r->size) % r->size;
    const int right = (r->rank + 1) % r->size;
    const int wait_ms = timeout_s > 0 && timeout_s < 2e6
                            ? (int)(timeout_s * 1000.0) + 1
                            : -1;
    struct pollfd p[2];
    int np = 0, rc;
    char detail[64];

    if (want_send) {
        p[np].fd = r->to_right;
        p[np++].events = POLLOUT;
    }
    if (want_recv) {
        p[np].fd = r->from_left;
        p[np++].events = POLLIN;
    }
    atomic_store(&r->waiting, want_recv ? left : right);
    do
        rc = poll(p, (nfds_t)np, wait_ms);
    while (rc < 0 && errno == EINTR);
    atomic_store(&r->waiting, -1);
    if (rc > 0)
        return KOLO_OK;
    if (rc < 0)
        return fail(r, KOLO_ERR_BACKEND, err, errlen, "%s: poll: %s", w->what,
                    strerror(errno));
    snprintf(detail, sizeof(detail), " timed out after %.1f s:", timeout_s);
    if (want_recv)
        return fail_where(r, KOLO_ERR_TIMEOUT, w, err, errlen,
                          strcat(detail, " waiting for"), left, r->left, "");
    return fail_where(r, KOLO_ERR_TIMEOUT, w, err, errlen, detail, right,
                      r->right, " takes no more bytes");
}

/* After an operation's last byte: did the neighbours finish it too? A
 * neighbour that closed its connection is not a failure by itself: it may
 * have finished and left (its last bytes, then end of file). But the right
 * neighbour must have read every byte this rank sent it: where it closed
 * before they came (it gave up on the operation, or died in it), its
 * kernel answers them with a reset, and the operation must not succeed
 * here either. So once the right neighbour's socket shows its close, this
 * waits (sleeping, bounded by the timeout) until every byte sent is
 * acknowledged, or the reset comes. An error on either socket fails. */
static int closed_after(kolo__ring_t *r, const char *what, size_t bytes,
                        double timeout_s, char *err, size_t errlen)
{
    const int fds[2] = {r->from_left, r->to_right};
    const int ranks[2] = {(r->rank - 1 + r->size) % r->size,
                          (r->rank + 1) % r->size};
    const char *addrs[2] = {r->left, r->right};
    const double deadline = now_s() + (timeout_s > 0 ? timeout_s : 60.0);
    for (int i = 0; i < 2; i++) {
        for (;;) {
            char c;
            int unacked = 0;
            ssize_t n = recv(fds[i], &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                errno != EINTR)
                return fail(r, KOLO_ERR_RANK_LOST, err, errlen,
                            "%s of %zu bytes: rank %d (%s) closed its "
                            "connection (connection closed by peer) without "
                            "finishing the operation (%s)",
                            what, bytes, ranks[i], addrs[i], strerror(errno));
            if (n != 0 || i == 0 || ioctl(fds[i], SIOCOUTQ, &unacked) != 0 ||
                unacked == 0)
                break; /* open, or closed with every byte read */
            if (now_s() >= deadline)
                return fail(r, KOLO_ERR_RANK_LOST, err, errlen,
                            "%s of %zu bytes: rank %d (%s) closed its "
                            "connection (connection closed by peer) with %d "
                            "of this rank's bytes unacknowledged",
                            what, bytes, ranks[i], addrs[i], unacked);
            struct timespec pause = {0, 100 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    return KOLO_OK;
}

/* One allreduce as run_ring() moves it around the ring: the steps sending
 * and receiving, and how far each has come. */
typedef struct {
    kolo__ring_t *r;
    const plan_t *pl;
    io_t *io;
    int steps, last_rs;
    int ks, kr;       /* the steps sending and receiving */
    size_t sent, got; /* bytes of those steps so far */
    size_t done;      /* bytes of step kr reduced or placed */
    size_t have;      /* bytes in scratch, not yet reduced */
    where_t w;
    char *err;
    size_t errlen;
    struct iovec iov[MAX_IOV];
} lap_t;

/* Moves past the steps done, and past those that move nothing (both sides
 * skip them alike); 0 once every step is sent and received. */
static int next_steps(lap_t *x)
{
    const plan_t *pl = x->pl;

    while (x->ks < x->steps && x->sent == seg_bytes(pl, send_seg(pl, x->ks))) {
        x->ks++;
        x->sent = 0;
    }
    while (x->kr < x->steps && x->done == seg_bytes(pl, recv_seg(pl, x->kr))) {
        x->kr++;
        x->got = x->done = 0;
        x->io->settled = 0;
    }
    if (x->ks == x->steps && x->kr == x->steps)
        return 0;
    x->w.step = x->kr + 1;
    x->w.got = x->got;
    x->w.want = x->kr < x->steps ? seg_bytes(pl, recv_seg(pl, x->kr)) : 0;
    return 1;
}

/* Sends what is ready of step ks: where it lies in several pieces
 * (tensors), up to MAX_IOV of them (past the first, up to SCRATCH_BYTES)
 * at once, so that small tensors do not each go out in a packet of their
 * own. 1: some bytes went, 0: none, -1: the ring failed. */
static int send_ready(lap_t *x, size_t ready)
{
    const plan_t *pl = x->pl;
    io_t *io = x->io;
    const size_t es = pl->esize, seg = send_seg(pl, x->ks);
    size_t at = seg_at(pl, seg) * es + x->sent;
    size_t left = ready - x->sent, gathered = 0;
    int niov = 0;
    ssize_t n;

    while (left > 0 && niov < MAX_IOV && gathered < SCRATCH_BYTES) {
        size_t len = left;
        const uint8_t *from =
            x->ks == 0 && io->s != NULL
                ? input_at(io, at, len, seg_at(pl, seg + 1) * es, &len)
                : at_ptr(io, at, len, &len);
        x->iov[niov].iov_base = (void *)(uintptr_t)from;
        x->iov[niov++].iov_len = len;
        at += len;
        left -= len;
        gathered += len;
    }
    n = send_some(x->r, x->iov, niov, &x->w, x->err, x->errlen);
    if (n < 0)
        return -1;
    x->sent += (size_t)n;
    return n > 0;
}

/* n more bytes of a reduce-scatter step came into scratch: the whole
 * elements among them are reduced into place (and, at the last such step,
 * finished: these results are complete). */
static void reduce_received(lap_t *x, size_t at, size_t n)
{
    io_t *io = x->io;
    const size_t es = x->pl->esize;
    size_t m;

    x->have += n;
    m = x->have / es;
    reduce_in(io, at + x->done, x->r->scratch, m);
    if (x->kr == x->last_rs && io->s != NULL && m > 0)
        settle(io, (at + x->done) / es, m, 1); /* complete */
    x->done += m * es;
    x->have -= m * es;
    if (x->have > 0)
        memmove(x->r->scratch, x->r->scratch + m * es, x->have);
}

/* More bytes of an allgather step came straight into place: the whole
 * elements among them are settled (drained where they are not placed). */
static void place_received(lap_t *x, size_t at)
{
    io_t *io = x->io;
    const size_t es = x->pl->esize;

    x->done = x->got;
    if (io->s != NULL && x->done / es * es > io->settled) {
        size_t upto = x->done / es * es;
        settle(io, (at + io->settled) / es, (upto - io->settled) / es, 0);
        io->settled = upto;
    }
}

/* Receives what has come of step kr: into scratch and reduced into place
 * during the reduce-scatter, straight into place after. 1: some bytes
 * came, 0: none, -1: the ring failed. */
static int recv_come(lap_t *x)
{
    const plan_t *pl = x->pl;
    const size_t len = x->w.want;
    const size_t at = seg_at(pl, recv_seg(pl, x->kr)) * pl->esize;
    const int rs = x->kr <= x->last_rs;
    size_t room = rs ? SCRATCH_BYTES - x->have : len - x->got;
    int niov = 0;
    ssize_t n;

    if (room > len - x->got)
        room = len - x->got;
    if (rs) {
        x->iov[0].iov_base = x->r->scratch + x->have;
        x->iov[niov++].iov_len = room;
    }
    /* (straight into place: up to MAX_IOV pieces at once) */
    for (size_t off = x->got; !rs && room > 0 && niov < MAX_IOV;) {
        size_t run = room;
        x->iov[niov].iov_base = at_ptr(x->io, at + off, room, &run);
        x->iov[niov++].iov_len = run;
        off += run;
        room -= run;
    }
    n = recv_some(x->r, x->iov, niov, &x->w, x->err, x->errlen);
    if (n <= 0)
        return n < 0 ? -1 : 0;
    x->got += (size_t)n;
    if (rs)
        reduce_received(x, at, (size_t)n);
    else
        place_received(x, at);
    return 1;
}

static int run_ring(kolo__ring_t *r, const plan_t *pl, io_t *io,
                    double timeout_s, char *err, size_t errlen)
{
    const int steps = 2 * (r->size - 1);
    lap_t x = {.r = r, .pl = pl, .io = io, .steps = steps,
               .last_rs = r->size - 2, .err = err, .errlen = errlen,
               .w = {"ring allreduce", pl->count * pl->esize, 0, steps, 0, 0}};

    io->filled = seg_at(pl, send_seg(pl, 0)) * pl->esize;
    io->settled = 0;
    while (next_steps(&x)) {
        size_t ready = x.ks < steps ? ready_bytes(pl, x.ks, x.kr, x.done) : 0;
        int moved = 0, n;

        if (x.sent < ready) {
            if ((n = send_ready(&x, ready)) < 0)
                return r->broken;
            moved |= n;
        }
        if (x.kr < steps) {
            if ((n = recv_come(&x)) < 0)
                return r->broken;
            moved |= n;
        }
        /* Neither could move: sleep until one can. */
        if (!moved && wait_io(r, x.sent < ready, x.kr < steps, timeout_s,
                              &x.w, err, errlen) != KOLO_OK)
            return r->broken;
    }
    return closed_after(r, x.w.what, x.w.total, timeout_s, err, errlen);
}

static int check_broken(const kolo__ring_t *r, char *err, size_t errlen)
{
    if (!r->broken)
        return KOLO_OK;
    snprintf(err, errlen, "%s (the ring broke earlier)", r->why);
    return r->broken;
}

/* One step of an allgather: `bytes` from out to the right
 * neighbour while as many come from the left one into in. */
static int shift_step(kolo__ring_t *r, const void *out, void *in, size_t bytes,
                      where_t *w, double timeout_s, char *err, size_t errlen)
{
    size_t sent = 0;
    int rc = KOLO_OK;

    w->got = 0;
    w->want = bytes;
    while (rc == KOLO_OK && (sent < bytes || w->got < bytes)) {
        ssize_t s = 0, g = 0;
        struct iovec o = {(uint8_t *)(uintptr_t)out + sent, bytes - sent};
        struct iovec i = {(uint8_t *)in + w->got, bytes - w->got};
        if (sent < bytes && (s = send_some(r, &o, 1, w, err, errlen)) < 0)
            return r->broken;
        if (w->got < bytes && (g = recv_some(r, &i, 1, w, err, errlen)) < 0)
            return r->broken;
        sent += (size_t)s;
        w->got += (size_t)g;
        if (s == 0 && g == 0)
            rc = wait_io(r, sent < bytes, w->got < bytes, timeout_s, w, err,
                         errlen);
    }
    return rc;
}

int kolo__ring_allgather(kolo__ring_t *r, const void *mine, uint8_t *slots,
                         size_t bytes, double timeout_s, char *err,
                         size_t errlen)
{
    const int n = r->size;
    where_t w = {"ring allgather", bytes * (size_t)n, 0, n - 1, 0, bytes};
    int rc = check_broken(r, err, errlen);

    /* Step k sends the block that came in step k - 1 (this rank's own at
     * step 0) and receives the one from k + 1 ranks to the left. */
    for (int k = 0; rc == KOLO_OK && k < n - 1; k++) {
        const int from = (r->rank - k + n) % n, to = (r->rank - k - 1 + n) % n;
        w.step = k + 1;
        rc = shift_step(r, k == 0 ? mine : slots + (size_t)from * bytes,
                        slots + (size_t)to * bytes, bytes, &w, timeout_s, err,
                        errlen);
    }
    return rc != KOLO_OK ? rc
                         : closed_after(r, w.what, w.total, timeout_s, err, errlen);
}

int kolo__ring_allreduce(kolo__ring_t *r, const void *in, void *out,
                         size_t count, size_t esize,
                         kolo__ops_reduce_fn reduce, double timeout_s,
                         char *err, size_t errlen)
{
    const plan_t pl = {count, esize, r->size, r->rank};
    io_t io = {.buf = out, .reduce = reduce, .esize = esize};
    int rc = check_broken(r, err, errlen);

    if (rc != KOLO_OK)
        return rc;
    if (in != NULL && in != out)
        memcpy(out, in, count * esize);
    if (count == 0 || r->size < 2)
        return KOLO_OK;
    return run_ring(r, &pl, &io, timeout_s, err, errlen);
}

int kolo__ring_allreduce_stream(kolo__ring_t *r, size_t count, size_t esize,
                                kolo__ops_reduce_fn reduce,
                                const kolo__ops_stream_t *s, double timeout_s,
                                char *err, size_t errlen)
{
    const plan_t pl = {count, esize, r->size, r->rank};
    io_t io = {.s = s, .reduce = reduce, .esize = esize};
    int rc = check_broken(r, err, errlen);

    if (rc != KOLO_OK || count == 0)
        return rc;
    if (s->place == NULL && r->work_bytes < count * esize) {
        free(r->work);
        r->work_bytes = 0;
        r->work = kolo__malloc(count * esize);
        if (r->work == NULL) {
            snprintf(err, errlen, "ring: out of memory for a work buffer of "
                                  "%zu bytes", count * esize);
            return KOLO_ERR_NO_MEMORY;
        }
        r->work_bytes = count * esize;
    }
    io.buf = s->place == NULL ? r->work : NULL;
    if (r->size < 2) {
        fill_at(&io, 0, count);
        settle(&io, 0, count, 1);
        return KOLO_OK;
    }
    return run_ring(r, &pl, &io, timeout_s, err, errlen);
}
