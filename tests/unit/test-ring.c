/*
 * test-ring.c — unit tests of ops/gloo/ring.{h,c}: kolo's own ring
 * allreduce over TCP, with ranks as threads of one process on loopback.
 *
 * Why these tests: the ring carries every large allreduce of a Gloo job,
 * so a wrong schedule is a wrong sum on real training. Each case checks
 * every rank's result against a reference computed here from the inputs
 * (integer-valued, so any order of addition is exact), and that every
 * rank got the same bits where the order matters (random floats). The
 * failures a user can cause are checked by what the message says: a
 * stranger on the ring's port (dropped with a warning, the job goes on),
 * a captured handshake replayed (refused), a rank with another key (its
 * neighbour refuses it, naming the address),
 * a rank that goes away (RANK_LOST, naming it), a rank that never comes
 * to the allreduce (TIMEOUT, naming it).
 */
#define _GNU_SOURCE

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ring.h"
#include "unit.h"

#define MAX_RANKS 4

static const uint8_t secret[KOLO__KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7};

KOLO_UNIT_REDUCE_FN(sum_f32, float, x + y)
KOLO_UNIT_REDUCE_FN(sum_f64, double, x + y)
KOLO_UNIT_REDUCE_FN(sum_u8, uint8_t, x + y)
KOLO_UNIT_REDUCE_FN(max_u16, uint16_t, x > y ? x : y)

/* Warnings the ring gives, counted (its warn function takes no argument). */
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static int warnings;
static char last_warning[512];

static void on_warn(const char *msg)
{
    pthread_mutex_lock(&warn_lock);
    warnings++;
    snprintf(last_warning, sizeof(last_warning), "%s", msg);
    pthread_mutex_unlock(&warn_lock);
}

typedef struct job job_t;
typedef struct {
    job_t *job;
    int rank;
    kolo__ring_t *ring;
    int rc;
    char err[512];
} rank_t;

/* A relay between a rank and its right neighbour that forwards both ways
 * and keeps the first bytes of each direction: what a stranger on the
 * wire would see of the handshake. */
#define SEEN_BYTES (KOLO__HELLO_BYTES + KOLO__PROOF_BYTES)
typedef struct {
    int lfd;
    char addr[KOLO__RING_ADDR_LEN]; /* where the left rank connects */
    const char *target;             /* the right rank's address */
    uint8_t out[SEEN_BYTES], back[KOLO__REPLY_BYTES]; /* left -> right, back */
    size_t nout, nback;
    pthread_t thread;
} relay_t;

struct job {
    int n;
    pthread_barrier_t listening;
    char addr[MAX_RANKS][KOLO__RING_ADDR_LEN];
    const char *dial[MAX_RANKS]; /* where rank r - 1 connects: addr or a relay */
    relay_t relay[MAX_RANKS];
    int relayed;                 /* every connection through a relay */
    int odd_key_rank;            /* this rank holds another key (-1: none) */
    const uint8_t *stranger_bytes; /* what the stranger sends (NULL: noise) */
    size_t stranger_len;
    rank_t ranks[MAX_RANKS];
    void (*body)(rank_t *);
    double timeout_s;
    size_t send_buffer; /* each socket's SO_SNDBUF (0: the kernel's) */
};

/* The send buffer of the next job's sockets (0: the kernel's). */
static size_t cur_send_buffer;

/* A connected socket to "ADDRESS PORT" (loopback). */
static int dial_to(const char *addr)
{
    char host[64];
    unsigned port;
    struct sockaddr_in a = {.sin_family = AF_INET};
    int fd;

    ck_assert_int_eq(sscanf(addr, "%63s %u", host, &port), 2);
    a.sin_port = htons((uint16_t)port);
    ck_assert_int_eq(inet_pton(AF_INET, host, &a.sin_addr), 1);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* A stranger: connects to "ADDRESS PORT", sends `bytes` (NULL: 48 bytes
 * of noise), and keeps the socket open (closed after the job). */
static int strike(const char *addr, const uint8_t *bytes, size_t len)
{
    uint8_t noise[48];
    int fd = dial_to(addr);

    if (bytes == NULL) {
        memset(noise, 'x', sizeof(noise));
        bytes = noise;
        len = sizeof(noise);
    }
    ck_assert_int_eq(send(fd, bytes, len, 0), (ssize_t)len);
    return fd;
}

/* Forwards between the left rank's connection and the right rank until
 * either closes, keeping the first bytes of each direction. */
static void *relay_main(void *arg)
{
    relay_t *rl = arg;
    int a = accept(rl->lfd, NULL, NULL), b = a >= 0 ? dial_to(rl->target) : -1;
    static __thread uint8_t buf[65536];

    while (a >= 0 && b >= 0) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, -1) < 0)
            break;
        int from = p[0].revents ? a : b, to = from == a ? b : a;
        ssize_t n = recv(from, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        uint8_t *keep = from == a ? rl->out : rl->back;
        size_t *kept = from == a ? &rl->nout : &rl->nback;
        size_t cap = from == a ? sizeof(rl->out) : sizeof(rl->back);
        size_t take = (size_t)n < cap - *kept ? (size_t)n : cap - *kept;
        memcpy(keep + *kept, buf, take);
        *kept += take;
        if (send(to, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    if (a >= 0)
        close(a);
    if (b >= 0)
        close(b);
    return NULL;
}

static void relay_start(relay_t *rl, const char *target)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);

    memset(rl, 0, sizeof(*rl));
    rl->target = target;
    rl->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(rl->lfd, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(rl->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(rl->lfd, 4), 0);
    ck_assert_int_eq(getsockname(rl->lfd, (struct sockaddr *)&a, &len), 0);
    snprintf(rl->addr, sizeof(rl->addr), "127.0.0.1 %u", ntohs(a.sin_port));
    ck_assert_int_eq(pthread_create(&rl->thread, NULL, relay_main, rl), 0);
}

static void *rank_main(void *arg)
{
    rank_t *me = arg;
    job_t *job = me->job;
    int n = job->n;

    me->rc = kolo__ring_listen("127.0.0.1", &me->ring, job->addr[me->rank],
                               me->err, sizeof(me->err));
    pthread_barrier_wait(&job->listening); /* every address published */
    pthread_barrier_wait(&job->listening); /* the stranger has struck */
    if (me->rc != 0 || job->ranks[(me->rank + 1) % n].ring == NULL)
        return NULL;
    static const uint8_t other[KOLO__KEY_BYTES] = {7, 6, 5, 4, 3, 2, 1};
    me->rc = kolo__ring_connect(me->ring, me->rank, n, job->dial[(me->rank + 1) % n],
                                me->rank == job->odd_key_rank ? other : secret,
                                job->timeout_s, job->send_buffer, on_warn,
                                me->err, sizeof(me->err));
    if (me->rc == 0)
        job->body(me);
    return NULL;
}

/* How the next job is set up beyond run_job's arguments (reset by it). */
static int next_relayed, next_odd_key_rank = -1;
static const uint8_t *next_stranger_bytes;
static size_t next_stranger_len;

/* Runs body on n ranks; returns once every rank is done, with their
 * codes and messages in the job. */
static job_t *run_job(int n, void (*body)(rank_t *), double timeout_s,
                      int stranger)
{
    static job_t job;
    pthread_t t[MAX_RANKS];
    int fd = -1;

    memset(&job, 0, sizeof(job));
    job.relayed = next_relayed;
    job.odd_key_rank = next_odd_key_rank;
    job.stranger_bytes = next_stranger_bytes;
    job.stranger_len = next_stranger_len;
    next_relayed = 0;
    next_odd_key_rank = -1;
    next_stranger_bytes = NULL;
    job.n = n;
    job.body = body;
    job.timeout_s = timeout_s;
    job.send_buffer = cur_send_buffer;
    pthread_barrier_init(&job.listening, NULL, (unsigned)n + 1);
    for (int r = 0; r < n; r++) {
        job.ranks[r].job = &job;
        job.ranks[r].rank = r;
        ck_assert_int_eq(pthread_create(&t[r], NULL, rank_main, &job.ranks[r]), 0);
    }
    pthread_barrier_wait(&job.listening);
    for (int r = 0; r < n; r++) {
        job.dial[r] = job.addr[r];
        if (job.relayed) {
            relay_start(&job.relay[r], job.addr[r]);
            job.dial[r] = job.relay[r].addr;
        }
    }
    if (stranger)
        fd = strike(job.addr[0], job.stranger_bytes, job.stranger_len);
    pthread_barrier_wait(&job.listening);
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    if (fd >= 0)
        close(fd);
    pthread_barrier_destroy(&job.listening);
    for (int r = 0; r < n; r++)
        kolo__ring_close(job.ranks[r].ring);
    for (int r = 0; r < n && job.relayed; r++) {
        pthread_join(job.relay[r].thread, NULL);
        close(job.relay[r].lfd);
    }
    return &job;
}

static void expect_ok(const job_t *job, const char *what)
{
    for (int r = 0; r < job->n; r++)
        ck_assert_msg(job->ranks[r].rc == 0, "%s, %d ranks: rank %d: %d: %s",
                      what, job->n, r, job->ranks[r].rc, job->ranks[r].err);
}

/* ---- results against a reference ---------------------------------------- */

static const size_t counts[] = {0, 1, 2, 3, 5, 7, 1000, 65537, (1u << 20) + 3};
static size_t cur_count;
static int cur_n;

static float input_f32(int rank, size_t i)
{
    return (float)((long)((i * 7 + (size_t)rank * 13) % 1000) - 500);
}

/* Sums integer-valued floats (exact in any order) in place, or out of
 * place (in != out) for odd counts, and checks every element. */
static void body_sum_f32(rank_t *me)
{
    size_t count = cur_count;
    float *buf = malloc((count + 1) * sizeof(float));
    float *in = malloc((count + 1) * sizeof(float));
    ck_assert(buf != NULL && in != NULL);
    for (size_t i = 0; i < count; i++)
        in[i] = buf[i] = input_f32(me->rank, i);
    me->rc = kolo__ring_allreduce(me->ring, count % 2 ? in : NULL, buf, count,
                                  sizeof(float), sum_f32, 10.0, me->err,
                                  sizeof(me->err));
    for (size_t i = 0; i < count && me->rc == 0; i++) {
        float want = 0;
        for (int r = 0; r < cur_n; r++)
            want += input_f32(r, i);
        if (buf[i] != want || in[i] != input_f32(me->rank, i)) {
            snprintf(me->err, sizeof(me->err),
                     "element %zu of %zu is %g, not %g (input %g)", i, count,
                     buf[i], want, in[i]);
            me->rc = -1000;
        }
    }
    free(buf);
    free(in);
}

START_TEST(sums_every_size_and_rank_count)
{
    char what[64];
    for (int n = 2; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            cur_n = n;
            cur_count = counts[c];
            snprintf(what, sizeof(what), "%zu floats", counts[c]);
            expect_ok(run_job(n, body_sum_f32, 10.0, 0), what);
        }
}
END_TEST

/* Other element sizes and operations, several calls on one ring: bytes
 * (wrapping sum), 16-bit max, doubles. */
static void body_types(rank_t *me)
{
    enum { N = 300007 };
    uint8_t *u8 = malloc(N);
    uint16_t *u16 = malloc(N * 2);
    double *f64 = malloc(N * 8);
    ck_assert(u8 != NULL && u16 != NULL && f64 != NULL);
    for (int round = 0; round < 3 && me->rc == 0; round++) {
        for (size_t i = 0; i < N; i++) {
            u8[i] = (uint8_t)(i * 31 + (size_t)me->rank * 101 + (size_t)round);
            u16[i] = (uint16_t)((i * 2654435761u) >> (me->rank + 3));
            f64[i] = (double)i * 0.5 + me->rank;
        }
        me->rc = kolo__ring_allreduce(me->ring, NULL, u8, N, 1, sum_u8, 10.0,
                                      me->err, sizeof(me->err));
        if (me->rc == 0)
            me->rc = kolo__ring_allreduce(me->ring, NULL, u16, N, 2, max_u16,
                                          10.0, me->err, sizeof(me->err));
        if (me->rc == 0)
            me->rc = kolo__ring_allreduce(me->ring, NULL, f64, N, 8, sum_f64,
                                          10.0, me->err, sizeof(me->err));
        for (size_t i = 0; i < N && me->rc == 0; i++) {
            uint8_t w8 = 0;
            uint16_t w16 = 0;
            double w64 = 0;
            for (int r = 0; r < cur_n; r++) {
                uint16_t v = (uint16_t)((i * 2654435761u) >> (r + 3));
                w8 = (uint8_t)(w8 + (uint8_t)(i * 31 + (size_t)r * 101 +
                                              (size_t)round));
                w16 = v > w16 ? v : w16;
                w64 += (double)i * 0.5 + r;
            }
            if (u8[i] != w8 || u16[i] != w16 || f64[i] != w64) {
                snprintf(me->err, sizeof(me->err),
                         "round %d element %zu: %u/%u/%g, not %u/%u/%g", round,
                         i, u8[i], u16[i], f64[i], w8, w16, w64);
                me->rc = -1000;
            }
        }
    }
    free(u8);
    free(u16);
    free(f64);
}

/* body at 2, 3 and 4 ranks, every rank passing. */
static void at_every_rank_count(void (*body)(rank_t *), const char *what)
{
    for (int n = 2; n <= MAX_RANKS; n++) {
        cur_n = n;
        expect_ok(run_job(n, body, 10.0, 0), what);
    }
}

START_TEST(other_types_and_repeated_calls)
{
    at_every_rank_count(body_types, "bytes, u16 max, doubles");
}
END_TEST

/* Random floats: the order of addition shows in the bits, and every rank
 * must still get the same bits. */
static uint32_t got_bits[MAX_RANKS][4099];

static void body_same_bits(rank_t *me)
{
    enum { N = 4099 };
    float buf[N];
    uint32_t seed = 12345u + (uint32_t)me->rank * 7919u;
    for (size_t i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        buf[i] = (float)(seed >> 8) / (float)(1u << 20) - 8.0f;
    }
    me->rc = kolo__ring_allreduce(me->ring, NULL, buf, N, sizeof(float),
                                  sum_f32, 10.0, me->err, sizeof(me->err));
    memcpy(got_bits[me->rank], buf, sizeof(buf));
}

START_TEST(every_rank_gets_the_same_bits)
{
    for (int n = 3; n <= MAX_RANKS; n++) {
        expect_ok(run_job(n, body_same_bits, 10.0, 0), "random floats");
        for (int r = 1; r < n; r++)
            ck_assert_msg(memcmp(got_bits[r], got_bits[0], sizeof(got_bits[0])) == 0,
                          "%d ranks: rank %d's bits differ from rank 0's", n, r);
    }
}
END_TEST

/* The streamed form: a batch of tensors, some read where they lie
 * (view), some packed (fill), the sum halved (finish) and drained into
 * outputs. Every element must be drained exactly once, with the right
 * value, whatever order the ring asks in. */
#define NT 7
static const size_t tensor_counts[NT] = {3, 0, 1000, 1, 700001, 17, 4099};

typedef struct {
    size_t off[NT + 1];
    int viewable[NT];
    float *in, *out;
    unsigned char *drained;
    int misuse;
    int prescale; /* fill doubles the input (halved again by finish) */
} batch_t;

static size_t tensor_of(const batch_t *b, size_t at)
{
    size_t t = 0;
    while (t + 1 < NT + 1 && b->off[t + 1] <= at)
        t++;
    return t;
}

static const void *b_view(void *arg, size_t at, size_t n, size_t *run)
{
    batch_t *b = arg;
    size_t t = tensor_of(b, at);
    if (at >= b->off[NT] || n == 0) {
        b->misuse = 1;
        return NULL;
    }
    if (!b->viewable[t])
        return NULL;
    *run = b->off[t + 1] - at < n ? b->off[t + 1] - at : n;
    return b->in + at;
}

static void b_fill(void *arg, void *dst, size_t at, size_t n)
{
    batch_t *b = arg;
    if (at + n > b->off[NT]) {
        b->misuse = 1;
        return;
    }
    memmove(dst, b->in + at, n * sizeof(float));
    if (b->prescale) /* as the runtime's prescale: on what it filled */
        for (size_t i = 0; i < n; i++)
            ((float *)dst)[i] *= 2.0f;
}

static void b_finish(void *arg, void *buf, size_t n)
{
    float *f = buf;
    (void)arg;
    for (size_t i = 0; i < n; i++)
        f[i] *= 0.5f;
}

static void b_drain(void *arg, const void *src, size_t at, size_t n)
{
    batch_t *b = arg;
    if (at + n > b->off[NT]) {
        b->misuse = 1;
        return;
    }
    memcpy(b->out + at, src, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        b->drained[at + i]++;
}

/* Results written where they stay: each tensor's output. */
static void *b_place(void *arg, size_t at, size_t n, size_t *run)
{
    batch_t *b = arg;
    size_t t = tensor_of(b, at);
    if (at >= b->off[NT] || n == 0) {
        b->misuse = 1;
        return b->out;
    }
    *run = b->off[t + 1] - at < n ? b->off[t + 1] - at : n;
    for (size_t i = 0; i < *run; i++)
        b->drained[at + i] = 1; /* placed: counts as drained once */
    return b->out + at;
}

/* 0: every tensor viewed, 1: none, 2: every other; 3-5: the same, results
 * placed in the outputs; 6: placed, in place (input and output alike);
 * 7: in place, prescaled (fill doubles, so no view), the runtime's
 * in-place AVERAGE with a prescale: a second fill of an element would
 * double it twice. */
static int view_mode;

static void body_stream(rank_t *me)
{
    batch_t b = {.misuse = 0, .prescale = view_mode == 7};
    const int views = view_mode == 7 ? 1 : view_mode % 3;
    const int in_place = view_mode >= 6;
    kolo__ops_stream_t s = {b_fill, views == 1 ? NULL : b_view, b_finish,
                            b_drain, view_mode >= 3 ? b_place : NULL, &b};
    size_t total;

    for (int t = 0; t < NT; t++) {
        b.off[t + 1] = b.off[t] + tensor_counts[t];
        b.viewable[t] = views == 0 || (views == 2 && t % 2 == 0);
    }
    total = b.off[NT];
    b.in = malloc(total * sizeof(float));
    b.out = in_place ? b.in : malloc(total * sizeof(float));
    b.drained = calloc(total, 1);
    ck_assert(b.in != NULL && b.out != NULL && b.drained != NULL);
    for (int round = 0; round < 2 && me->rc == 0; round++) {
        for (size_t i = 0; i < total; i++) {
            if (!in_place)
                b.out[i] = -1e9f;
            b.in[i] = input_f32(me->rank, i + (size_t)round);
            b.drained[i] = 0;
        }
        me->rc = kolo__ring_allreduce_stream(me->ring, total, sizeof(float),
                                             sum_f32, &s, 10.0, me->err,
                                             sizeof(me->err));
        for (size_t i = 0; i < total && me->rc == 0; i++) {
            float want = 0;
            for (int r = 0; r < cur_n; r++)
                want += input_f32(r, i + (size_t)round);
            want *= view_mode == 7 ? 1.0f : 0.5f;
            if (b.out[i] != want || b.drained[i] != 1 || b.misuse ||
                (!in_place && b.in[i] != input_f32(me->rank, i + (size_t)round))) {
                snprintf(me->err, sizeof(me->err),
                         "view mode %d, round %d, element %zu of %zu: %g "
                         "drained %d times, want %g once%s",
                         view_mode, round, i, total, b.out[i], b.drained[i],
                         want, b.misuse ? "; a call out of range" : "");
                me->rc = -1000;
            }
        }
    }
    free(b.in);
    if (!in_place)
        free(b.out);
    free(b.drained);
}

START_TEST(streams_a_batch_of_tensors)
{
    for (int n = 2; n <= MAX_RANKS; n++)
        for (view_mode = 0; view_mode <= 7; view_mode++) {
            cur_n = n;
            expect_ok(run_job(n, body_stream, 10.0, 0), "streamed batch");
        }
}
END_TEST

/* The smallest send buffers: every step goes out in many partial sends,
 * each gathering the pieces of several tensors, and the receiver's
 * scattering them into place in as many partial receives. */
START_TEST(streams_through_small_send_buffers)
{
    cur_send_buffer = 65536;
    for (int n = 2; n <= 4; n++)
        for (view_mode = 0; view_mode <= 7; view_mode++) {
            cur_n = n;
            expect_ok(run_job(n, body_stream, 10.0, 0),
                      "streamed batch, 64K send buffers");
        }
    cur_n = 3;
    cur_count = (1u << 20) + 3;
    expect_ok(run_job(3, body_sum_f32, 10.0, 0), "sums, 64K send buffers");
    cur_send_buffer = 0;
}
END_TEST

static uint8_t gathered_byte(int rank, size_t i, size_t k)
{
    return (uint8_t)(i * 13 + (size_t)rank * 57 + k * 3 + 1);
}

static void body_allgather(rank_t *me)
{
    static const size_t sizes[] = {1, 8, 4099, 1 << 20};
    const int n = cur_n;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]) && me->rc == 0; k++) {
        size_t bytes = sizes[k];
        uint8_t *mine = malloc(bytes), *slots = malloc(bytes * (size_t)n);
        ck_assert(mine != NULL && slots != NULL);
        for (size_t i = 0; i < bytes; i++)
            mine[i] = gathered_byte(me->rank, i, k);
        memset(slots, 0xee, bytes * (size_t)n);
        me->rc = kolo__ring_allgather(me->ring, mine, slots, bytes, 10.0,
                                      me->err, sizeof(me->err));
        for (int r = 0; r < n && me->rc == 0; r++)
            for (size_t i = 0; i < bytes; i++) {
                /* this rank's own slot stays as it was */
                uint8_t want = r == me->rank ? 0xee : gathered_byte(r, i, k);
                uint8_t got = slots[(size_t)r * bytes + i];
                if (got != want) {
                    snprintf(me->err, sizeof(me->err),
                             "allgather of %zu bytes on %d ranks: slot %d byte "
                             "%zu is %u, not %u", bytes, n, r, i, got, want);
                    me->rc = -1000;
                    break;
                }
            }
        free(mine);
        free(slots);
    }
}

START_TEST(an_allgather_brings_every_ranks_bytes)
{
    at_every_rank_count(body_allgather, "allgather");
}
END_TEST

/* ---- what a user can cause ------------------------------------------------ */

START_TEST(a_stranger_is_dropped_with_a_warning)
{
    warnings = 0;
    cur_n = 3;
    cur_count = 1000;
    expect_ok(run_job(3, body_sum_f32, 10.0, 1), "with a stranger");
    ck_assert_int_eq(warnings, 1);
    ck_assert_msg(strstr(last_warning, "Gloo: dropped a connection from 127.0.0.1:") &&
                      strstr(last_warning, "to rank 0's ring socket: ") &&
                      strstr(last_warning, "is not the left neighbour's hello"),
                  "warning: %s", last_warning);
}
END_TEST

/* Whether the n bytes at a occur anywhere in the len bytes at hay. */
static int occurs(const uint8_t *a, size_t n, const uint8_t *hay, size_t len)
{
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(hay + i, a, n) == 0)
            return 1;
    return 0;
}

/* What crosses the wire of each connection of a 3-rank ring, seen by a
 * relay: beyond the fixed head of the hello (magic and ranks), no 8 bytes
 * of one connection's handshake appear in another's, nor the key. Then
 * the handshake rank 2 sent rank 0, replayed to rank 0 of a new ring
 * with the same key, is refused and that ring connects all the same. */
START_TEST(handshakes_never_repeat_and_a_replay_is_refused)
{
    enum { M = SEEN_BYTES - 16 + KOLO__REPLY_BYTES };
    uint8_t seen[MAX_RANKS][M];
    uint8_t replay[SEEN_BYTES];
    job_t *job;

    cur_n = 3;
    cur_count = 1000;
    next_relayed = 1;
    job = run_job(3, body_sum_f32, 10.0, 0);
    expect_ok(job, "through relays");
    for (int r = 0; r < 3; r++) {
        ck_assert_uint_eq(job->relay[r].nout, SEEN_BYTES);
        ck_assert_uint_eq(job->relay[r].nback, KOLO__REPLY_BYTES);
        ck_assert_msg(memcmp(job->relay[r].out, "KOLORING", 8) == 0,
                      "connection to rank %d: no hello", r);
        /* The part that changes: the nonce, the reply, the proof. */
        memcpy(seen[r], job->relay[r].out + 16, SEEN_BYTES - 16);
        memcpy(seen[r] + SEEN_BYTES - 16, job->relay[r].back, KOLO__REPLY_BYTES);
        ck_assert_msg(!occurs(secret, 8, job->relay[r].out, SEEN_BYTES) &&
                          !occurs(secret, 8, job->relay[r].back, KOLO__REPLY_BYTES),
                      "the key crossed the wire to rank %d", r);
    }
    for (int r = 0; r < 3; r++)
        for (int q = 0; q < 3; q++)
            for (size_t i = 0; q != r && i + 8 <= M; i++)
                ck_assert_msg(!occurs(seen[r] + i, 8, seen[q], M),
                              "bytes %zu.. of the handshake into rank %d "
                              "appear in the one into rank %d", i, r, q);
    memcpy(replay, job->relay[0].out, SEEN_BYTES); /* rank 2 -> rank 0 */

    warnings = 0;
    next_stranger_bytes = replay;
    next_stranger_len = sizeof(replay);
    expect_ok(run_job(3, body_sum_f32, 10.0, 1), "with a replayed handshake");
    ck_assert_int_eq(warnings, 1);
    ck_assert_msg(strstr(last_warning, "to rank 0's ring socket: it did not "
                                       "prove the job's secret") != NULL,
                  "warning: %s", last_warning);
}
END_TEST

/* A rank that holds another key: its right neighbour does not prove the
 * key it holds, and the connection is refused, naming the address. */
START_TEST(a_rank_with_another_key_is_refused)
{
    job_t *job;

    warnings = 0;
    cur_n = 2;
    cur_count = 10;
    next_odd_key_rank = 1;
    job = run_job(2, body_sum_f32, 2.0, 0);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_ne(job->ranks[r].rc, 0);
        ck_assert_msg(strstr(job->ranks[r].err, "did not prove the job's secret") ||
                          strstr(job->ranks[r].err, "before the handshake ended"),
                      "rank %d: %s", r, job->ranks[r].err);
    }
    ck_assert_msg(strstr(job->ranks[0].err, "did not prove the job's secret") ||
                      strstr(job->ranks[1].err, "did not prove the job's secret"),
                  "%s / %s", job->ranks[0].err, job->ranks[1].err);
}
END_TEST

/* Rank 1 goes away after the ring connected; rank 0 must say so. */
static void body_leaves(rank_t *me)
{
    float buf[50000] = {0};
    if (me->rank == 1) {
        kolo__ring_close(me->ring);
        me->ring = NULL;
        return;
    }
    me->rc = kolo__ring_allreduce(me->ring, NULL, buf, 50000, sizeof(float),
                                  sum_f32, 10.0, me->err, sizeof(me->err));
    if (me->rc != 0) { /* a broken ring says so at once, again */
        char again[512];
        int rc = kolo__ring_allreduce(me->ring, NULL, buf, 1, sizeof(float),
                                      sum_f32, 10.0, again, sizeof(again));
        ck_assert_int_eq(rc, me->rc);
        ck_assert_ptr_nonnull(strstr(again, "the ring broke earlier"));
    }
}

START_TEST(a_rank_that_leaves_is_named)
{
    job_t *job = run_job(2, body_leaves, 10.0, 0);
    ck_assert_int_eq(job->ranks[0].rc, KOLO_ERR_RANK_LOST);
    ck_assert_msg(strstr(job->ranks[0].err, "rank 1 (127.0.0.1:") != NULL,
                  "message: %s", job->ranks[0].err);
}
END_TEST

/* Rank 1 gives up on an exchange (its timeout) after its bytes went out,
 * and leaves; rank 0 comes late and finds rank 1's bytes waiting: the
 * exchange must still fail there, since rank 1 failed it. */
static void body_abandons(rank_t *me)
{
    uint8_t out[64] = {0}, slots[2 * 64];
    if (me->rank == 1) {
        me->rc = kolo__ring_allgather(me->ring, out, slots, sizeof(out), 0.2,
                                      me->err, sizeof(me->err));
        kolo__ring_close(me->ring);
        me->ring = NULL;
        return;
    }
    usleep(600 * 1000);
    me->rc = kolo__ring_allgather(me->ring, out, slots, sizeof(out), 10.0,
                                  me->err, sizeof(me->err));
}

START_TEST(an_exchange_a_rank_abandoned_fails_everywhere)
{
    job_t *job = run_job(2, body_abandons, 10.0, 0);
    ck_assert_int_eq(job->ranks[1].rc, KOLO_ERR_TIMEOUT);
    ck_assert_msg(job->ranks[0].rc == KOLO_ERR_RANK_LOST,
                  "rank 0: %d: %s", job->ranks[0].rc, job->ranks[0].err);
    ck_assert_msg(strstr(job->ranks[0].err, "rank 1 (127.0.0.1:") != NULL,
                  "message: %s", job->ranks[0].err);
}
END_TEST

/* Rank 1 finishes an exchange and leaves at once (a rank that exits
 * after its last step): rank 0, which may find rank 1's bytes and its
 * close together, must still succeed. */
static void body_finishes_and_leaves(rank_t *me)
{
    uint8_t out[20000], slots[2 * 20000];
    const uint8_t *in = slots + (size_t)(1 - me->rank) * sizeof(out);
    memset(out, me->rank + 1, sizeof(out));
    me->rc = kolo__ring_allgather(me->ring, out, slots, sizeof(out), 10.0,
                                  me->err, sizeof(me->err));
    if (me->rc == 0 && in[0] != (uint8_t)(2 - me->rank)) {
        snprintf(me->err, sizeof(me->err), "got %u", in[0]);
        me->rc = -1000;
    }
    if (me->rank == 1) {
        kolo__ring_close(me->ring);
        me->ring = NULL;
    }
}

START_TEST(a_neighbour_that_finished_and_left_is_no_failure)
{
    for (int i = 0; i < 20; i++)
        expect_ok(run_job(2, body_finishes_and_leaves, 10.0, 0),
                  "exchange, then rank 1 leaves");
}
END_TEST

/* Rank 2 of 3 never comes to the allreduce: rank 0, its right neighbour,
 * times out waiting for it and says so. */
static void body_absent(rank_t *me)
{
    float buf[1000] = {0};
    if (me->rank == 2) {
        usleep(1500 * 1000);
        return;
    }
    me->rc = kolo__ring_allreduce(me->ring, NULL, buf, 1000, sizeof(float),
                                  sum_f32, 0.5, me->err, sizeof(me->err));
}

START_TEST(a_rank_that_never_comes_is_named)
{
    job_t *job = run_job(3, body_absent, 10.0, 0);
    ck_assert_int_eq(job->ranks[0].rc, KOLO_ERR_TIMEOUT);
    ck_assert_msg(strstr(job->ranks[0].err, "timed out after 0.5 s: waiting "
                                            "for rank 2 (127.0.0.1:") != NULL,
                  "message: %s", job->ranks[0].err);
    ck_assert_int_eq(job->ranks[1].rc, KOLO_ERR_TIMEOUT);
}
END_TEST

START_TEST(connect_names_a_rank_that_never_connects)
{
    kolo__ring_t *a = NULL, *b = NULL;
    char addr_a[KOLO__RING_ADDR_LEN], addr_b[KOLO__RING_ADDR_LEN], err[512];
    int rc;

    ck_assert_int_eq(kolo__ring_listen("127.0.0.1", &a, addr_a, err, sizeof(err)), 0);
    ck_assert_int_eq(kolo__ring_listen("127.0.0.1", &b, addr_b, err, sizeof(err)), 0);
    /* Rank 0 of 2 connects to b's socket, but rank 1 never connects back. */
    rc = kolo__ring_connect(a, 0, 2, addr_b, secret, 0.3, 0, on_warn, err,
                            sizeof(err));
    ck_assert_int_eq(rc, KOLO_ERR_TIMEOUT);
    ck_assert_msg(strstr(err, "waited 0.3 s for rank 1 to connect") != NULL,
                  "message: %s", err);
    kolo__ring_close(a);
    kolo__ring_close(b);
}
END_TEST

KOLO_UNIT_MAIN("ring", 120,
        sums_every_size_and_rank_count, other_types_and_repeated_calls,
        every_rank_gets_the_same_bits, streams_a_batch_of_tensors,
        streams_through_small_send_buffers,
        an_allgather_brings_every_ranks_bytes,
        a_stranger_is_dropped_with_a_warning,
        handshakes_never_repeat_and_a_replay_is_refused,
        a_rank_with_another_key_is_refused, a_rank_that_leaves_is_named,
        a_rank_that_never_comes_is_named,
        an_exchange_a_rank_abandoned_fails_everywhere,
        a_neighbour_that_finished_and_left_is_no_failure,
        connect_names_a_rank_that_never_connects)
