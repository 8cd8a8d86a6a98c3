/*
 * simdev_ops.c — a simulated device behind the device table (ops.h), so
 * that the runtime's device path (batches in flight, completion ordered
 * on a stream, a failure in the middle of a pipeline, a device that never
 * finishes and the timeout, shutdown with work in flight, Horovod's CUDA
 * arithmetic) runs in `make check` on machines without a GPU. Built only
 * into the unit tests' library, as ops/mem is; libkolo never has it.
 *
 * DESIGN
 *
 * Memory. kolo__simdev_malloc hands out host memory and enters the block
 * in a table with its device, so that prepare can tell device memory from
 * host memory and one device from another, as cudaPointerGetAttributes
 * does for NCCL.
 *
 * Streams. A stream is a worker thread that runs its tasks one at a time,
 * in the order they were queued: the device. An event recorded on a
 * stream is a position in it (the number of tasks queued so far); it has
 * passed once the worker has finished that many tasks. Making a stream
 * wait for an event queues a task that sleeps until the event has passed
 * (cudaStreamWaitEvent); the program's "kernels" are tasks too
 * (kolo__simdev_launch). Each device has a default stream, made when first
 * used, standing for CUDA's legacy default stream (a NULL stream). An
 * event keeps its stream alive (a reference), so it can be queried after
 * the stream was released.
 *
 * Collectives. The contexts of one process set form a group, found by an
 * id that member 0 makes and every member learns over the set's
 * controller at the first batch (init meets no one: ops.h), as NCCL's
 * unique id travels. A collective is a task on each
 * member's stream: it posts its contribution (a copy) for its sequence
 * number s, sleeps until every member has posted s, and computes its own
 * result from the posts in rank order, so every member gets the same
 * bits. Two posts per member are kept (s % 2), by the argument of
 * ops/mem: a member posts s + 1 only after finishing s, which needs every
 * member to have posted s, so every member is done reading s - 1. The
 * arithmetic is the runtime's (kolo__dev_config_t.math), which scales as
 * Horovod's CUDA kernels do (float16 in half precision); AVERAGE is NCCL's
 * ncclAvg (each contribution of a float multiplied by 1/size in its own
 * type, then summed; integers summed and divided).
 *
 * Failures. kolo__simdev_fail_start makes a rank's next context fail to
 * start, before it meets its group (as cudaSetDevice, a stream or the
 * fusion buffer failing before NCCL's init), with out of memory or a
 * device error. kolo__simdev_fail_next makes a rank's next collective fail as
 * an asynchronous NCCL error: it posts nothing, marks its context (watch
 * reports it) and, like a kernel whose peers never come, ends only when
 * the context is aborted. Aborting a context (watch, on any failure) aborts its
 * group: every member's waiting task ends at once, later tasks skip their
 * work, and the streams drain. kolo__simdev_hold stops kolo's streams on a
 * device from starting tasks until released or until their context is
 * aborted: a device that never finishes, which only the timeout ends.
 *
 * Locking. One mutex and one condition variable guard everything here;
 * every change of state broadcasts. Workers and waiters sleep on the
 * condition variable: nothing spins.
 */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "common.h"
#include "simdev_ops.h"

#define MAX_RANKS 64 /* global ranks the fault and count tables know */
#define DRAIN_S 5.0  /* how long an aborted stream may take to drain */

/* ---- state ------------------------------------------------------------ */

typedef struct block {
    struct block *next;
    uint8_t *p;
    size_t bytes;
    int device;
} block_t;

typedef struct task {
    struct task *next;
    void (*fn)(void *arg);
    void *arg;
} task_t;

typedef struct sim_ctx sim_ctx_t;

typedef struct slot_out {
    char *err;
    size_t len;
} slot_out_t;

typedef struct stream {
    int device;
    sim_ctx_t *owner; /* kolo's stream of a context (hold applies), or NULL */
    pthread_t thread;
    task_t *head, **tailp; /* tailp: the link the next task goes in */
    uint64_t queued, done;
    int stop, refs;   /* refs: its owner or program, and each event */
} stream_t;

/* When a stream reached a timed event (the timeline's marks): shared by
 * the event and the task that stamps it, freed by the last of them. */
typedef struct stamp {
    int refs, set;
    int64_t us;
} stamp_t;

typedef struct event {
    stream_t *s;
    uint64_t seq;
    int device;
    stamp_t *stamp; /* timed events only */
} event_t;

/* One member's contribution to one collective. */
typedef struct post {
    uint8_t *data;
    size_t len;
    size_t *sizes; /* alltoallv: bytes for each member */
} post_t;

typedef struct group {
    struct group *next;
    uint64_t id;
    int size, attached;
    int aborted_by;     /* -1, or the member that aborted it */
    sim_ctx_t **m;      /* [size] */
    uint64_t *posted;   /* [size]: the last sequence number each posted */
    post_t (*slot)[2];  /* [size][2] */
} group_t;

struct sim_ctx {
    kolo__dev_config_t cfg;
    int global_rank, device, me;
    stream_t *stream;
    group_t *g;
    uint64_t seq;       /* collectives queued (background thread) */
    int aborted;        /* under g_mu */
    int error;          /* under g_mu: the asynchronous error, or 0 */
    int broken;
    slot_out_t out; /* where the slot being run writes its sentence */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static block_t *g_blocks;
static stream_t *g_default[KOLO__SIMDEV_DEVICES];
static int g_hold[KOLO__SIMDEV_DEVICES];
static group_t *g_groups;
static uint64_t g_next_id;
static int g_fail_next[MAX_RANKS];
static int g_fail_start[MAX_RANKS];
static uint64_t g_queued[MAX_RANKS], g_finished[MAX_RANKS];

static void init_once(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cv, &a);
    pthread_condattr_destroy(&a);
}

static void lock(void)
{
    pthread_once(&g_once, init_once);
    pthread_mutex_lock(&g_mu);
}

static void unlock(void) { pthread_mutex_unlock(&g_mu); }

/* Sleeps on the condition variable until woken or `deadline`. */
static void sleep_until(const struct timespec *deadline)
{
    if (deadline == NULL)
        pthread_cond_wait(&g_cv, &g_mu);
    else
        pthread_cond_timedwait(&g_cv, &g_mu, deadline);
}

static struct timespec after(double s)
{
    struct timespec ts;
    int64_t ns;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (int64_t)(s * 1e9);
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000),
                             .tv_nsec = (long)(ns % 1000000000)};
}

static int passed(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec ||
           (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/* ---- memory ------------------------------------------------------------- */

void *kolo__simdev_malloc(int device, size_t bytes)
{
    block_t *b;

    if (device < 0 || device >= KOLO__SIMDEV_DEVICES ||
        (b = kolo__calloc(1, sizeof(*b))) == NULL)
        return NULL;
    if ((b->p = kolo__calloc(1, bytes ? bytes : 1)) == NULL) {
        free(b);
        return NULL;
    }
    b->bytes = bytes ? bytes : 1;
    b->device = device;
    lock();
    b->next = g_blocks;
    g_blocks = b;
    unlock();
    return b->p;
}

void kolo__simdev_free(void *p)
{
    block_t **link, *b = NULL;

    if (p == NULL)
        return;
    lock();
    for (link = &g_blocks; *link != NULL; link = &(*link)->next)
        if ((*link)->p == p) {
            b = *link;
            *link = b->next;
            break;
        }
    unlock();
    if (b != NULL) {
        free(b->p);
        free(b);
    }
}

/* The device whose memory holds [p, p + bytes), or -1 (host memory). */
static int device_of(const void *p, size_t bytes)
{
    const uint8_t *q = p;
    int dev = -1;

    lock();
    for (block_t *b = g_blocks; b != NULL; b = b->next)
        if (q >= b->p && q < b->p + b->bytes) {
            if ((size_t)(b->p + b->bytes - q) >= bytes)
                dev = b->device;
            break;
        }
    unlock();
    return dev;
}

/* ---- streams ------------------------------------------------------------- */

/* Whether kolo's stream may not start tasks now. Under g_mu. */
static int held(const stream_t *s)
{
    return s->owner != NULL && g_hold[s->device] && !s->owner->aborted;
}

static void *worker_main(void *arg)
{
    stream_t *s = arg;

    lock();
    for (;;) {
        task_t *t;
        while (!(s->stop && s->head == NULL) && (s->head == NULL || held(s)))
            sleep_until(NULL);
        if (s->head == NULL)
            break; /* stopped, and nothing left */
        t = s->head;
        s->head = t->next;
        if (s->head == NULL)
            s->tailp = &s->head;
        unlock();
        t->fn(t->arg);
        free(t);
        lock();
        s->done++;
        pthread_cond_broadcast(&g_cv);
    }
    unlock();
    return NULL;
}

static stream_t *stream_make(int device, sim_ctx_t *owner)
{
    stream_t *s = kolo__calloc(1, sizeof(*s));

    if (s == NULL)
        return NULL;
    s->device = device;
    s->owner = owner;
    s->refs = 1;
    s->tailp = &s->head;
    pthread_once(&g_once, init_once);
    if (kolo__thread_create(&s->thread, NULL, worker_main, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Drops a reference. Under g_mu; the thread was joined already. */
static void stream_unref(stream_t *s)
{
    if (--s->refs == 0)
        free(s);
}

/* Stops the worker once its queue is empty, joins it, drops the
 * reference. Not under g_mu. */
static void stream_release(stream_t *s)
{
    lock();
    s->stop = 1;
    pthread_cond_broadcast(&g_cv);
    unlock();
    pthread_join(s->thread, NULL);
    lock();
    stream_unref(s);
    unlock();
}

/* A program's stream, NULL meaning the device's default one. Under g_mu. */
static stream_t *program_stream(void *stream, int device)
{
    if (stream != NULL)
        return stream;
    if (device < 0 || device >= KOLO__SIMDEV_DEVICES)
        return NULL;
    if (g_default[device] == NULL)
        g_default[device] = stream_make(device, NULL);
    return g_default[device];
}

/* Queues fn(arg) on s. Under g_mu. */
static int enqueue(stream_t *s, void (*fn)(void *), void *arg)
{
    task_t *t = kolo__calloc(1, sizeof(*t));

    if (t == NULL)
        return KOLO_ERR_NO_MEMORY;
    t->fn = fn;
    t->arg = arg;
    *s->tailp = t;
    s->tailp = &t->next;
    s->queued++;
    pthread_cond_broadcast(&g_cv);
    return KOLO_OK;
}

void *kolo__simdev_stream_new(int device)
{
    if (device < 0 || device >= KOLO__SIMDEV_DEVICES)
        return NULL;
    return stream_make(device, NULL);
}

void kolo__simdev_stream_free(void *stream)
{
    if (stream != NULL)
        stream_release(stream);
}

int kolo__simdev_launch(void *stream, int device, void (*fn)(void *),
                        void *arg)
{
    stream_t *s;
    int rc;

    lock();
    s = program_stream(stream, device);
    rc = s != NULL ? enqueue(s, fn, arg) : KOLO_ERR_INVALID_ARGUMENT;
    unlock();
    return rc;
}

void kolo__simdev_sync(void *stream, int device)
{
    stream_t *s;

    lock();
    s = program_stream(stream, device);
    if (s != NULL) {
        uint64_t target = s->queued;
        while (s->done < target)
            sleep_until(NULL);
    }
    unlock();
}

void kolo__simdev_hold(int device, int on)
{
    if (device < 0 || device >= KOLO__SIMDEV_DEVICES)
        return;
    lock();
    g_hold[device] = on;
    pthread_cond_broadcast(&g_cv);
    unlock();
}

/* Sets a rank's entry of a table of armed failures (g_fail_next,
 * g_fail_start) to `value` and returns what it held (0 for a rank out of
 * range, which nothing arms). */
static int swap_armed(int *table, int global_rank, int value)
{
    int was;

    if (global_rank < 0 || global_rank >= MAX_RANKS)
        return 0;
    lock();
    was = table[global_rank];
    table[global_rank] = value;
    unlock();
    return was;
}

void kolo__simdev_fail_next(int global_rank)
{
    swap_armed(g_fail_next, global_rank, 1);
}

void kolo__simdev_fail_start(int global_rank, int code)
{
    swap_armed(g_fail_start, global_rank, code);
}

/* The failure kolo__simdev_fail_start armed for this rank, taken. */
static int take_fail_start(int global_rank)
{
    return swap_armed(g_fail_start, global_rank, 0);
}

void kolo__simdev_counts(int global_rank, uint64_t *queued, uint64_t *finished)
{
    lock();
    if (queued != NULL)
        *queued = global_rank >= 0 && global_rank < MAX_RANKS
                      ? g_queued[global_rank] : 0;
    if (finished != NULL)
        *finished = global_rank >= 0 && global_rank < MAX_RANKS
                        ? g_finished[global_rank] : 0;
    unlock();
}

/* ---- events ---------------------------------------------------------------- */

/* An event at the current end of s. Under g_mu. */
static event_t *event_at(stream_t *s)
{
    event_t *e = kolo__calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->s = s;
    e->seq = s->queued;
    e->device = s->device;
    s->refs++;
    return e;
}

static void stamp_unref(stamp_t *st)
{
    if (st != NULL && --st->refs == 0)
        free(st);
}

static void simdev_event_free(void *event)
{
    if (event != NULL) {
        lock();
        stream_unref(((event_t *)event)->s);
        stamp_unref(((event_t *)event)->stamp);
        unlock();
        free(event);
    }
}

static int simdev_event_query(void *event, char *err, size_t errlen)
{
    event_t *e = event;
    int r;

    (void)err, (void)errlen;
    lock();
    r = e->s->done >= e->seq;
    unlock();
    return r;
}

/* A task that waits for an event (its stream and position, held here: the
 * event itself may be freed while the task is queued), or for the context
 * that queued it to be aborted. */
typedef struct wait_task {
    stream_t *s;
    uint64_t seq;
    sim_ctx_t *ctx; /* kolo's context, or NULL (the program's stream) */
} wait_task_t;

static void wait_run(void *arg)
{
    wait_task_t *w = arg;

    lock();
    while (w->s->done < w->seq && !(w->ctx != NULL && w->ctx->aborted))
        sleep_until(NULL);
    stream_unref(w->s);
    unlock();
    free(w);
}

/* Queues on `on` a wait for e. Under g_mu. */
static int queue_wait(stream_t *on, const event_t *e, sim_ctx_t *ctx)
{
    wait_task_t *w = kolo__calloc(1, sizeof(*w));
    int rc;

    if (w == NULL)
        return KOLO_ERR_NO_MEMORY;
    w->s = e->s;
    w->seq = e->seq;
    w->ctx = ctx;
    e->s->refs++;
    rc = enqueue(on, wait_run, w);
    if (rc != KOLO_OK) {
        stream_unref(e->s);
        free(w);
    }
    return rc;
}

static int simdev_order(void *event, void *stream, char *err, size_t errlen)
{
    event_t *e = event;
    stream_t *on;
    int rc;

    lock();
    on = program_stream(stream, e->device);
    rc = on != NULL ? queue_wait(on, e, NULL) : KOLO_ERR_NO_MEMORY;
    unlock();
    if (rc != KOLO_OK)
        snprintf(err, errlen, "simulated device %d: cannot order the result "
                 "on the program's stream", e->device);
    return rc;
}

/* ---- the API thread ---------------------------------------------------------- */

static int simdev_device_count(void) { return KOLO__SIMDEV_DEVICES; }
static int simdev_version(void) { return 1; }

/* The dtypes NCCL reduces (no 16-bit integers). */
static int reducible(int dtype)
{
    return dtype != KOLO_INT16 && dtype != KOLO_UINT16;
}

static int check_buffer(const kolo__dev_check_t *t, const void *buf,
                        const char *which, char *err, size_t errlen)
{
    int dev;

    if (buf == NULL)
        return KOLO_OK;
    dev = device_of(buf, 1);
    if (dev < 0) {
        snprintf(err, errlen, "%s of tensor '%s': device_type is "
                 "KOLO_DEVICE_CUDA, but the %s buffer %p is host memory",
                 t->coll, t->name, which, buf);
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    if (dev != t->device) {
        snprintf(err, errlen, "%s of tensor '%s': the %s buffer is on CUDA "
                 "device %d, the options name device %d", t->coll, t->name,
                 which, dev, t->device);
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    return KOLO_OK;
}

static int simdev_prepare(const kolo__dev_check_t *t, void **event, char *err,
                          size_t errlen)
{
    stream_t *s;
    int rc;

    *event = NULL;
    rc = kolo__dev_check_placement(t, KOLO__SIMDEV_DEVICES, err, errlen);
    if (rc != KOLO_OK)
        return rc;
    if (t->reduces && !reducible(t->dtype)) {
        snprintf(err, errlen, "%s of tensor '%s': NCCL cannot reduce %s",
                 t->coll, t->name, kolo_dtype_name((kolo_dtype_t)t->dtype));
        return KOLO_ERR_UNSUPPORTED;
    }
    if ((rc = check_buffer(t, t->input, "input", err, errlen)) != KOLO_OK)
        return rc;
    if (t->output != t->input &&
        (rc = check_buffer(t, t->output, "output", err, errlen)) != KOLO_OK)
        return rc;
    lock();
    s = program_stream(t->stream, t->device);
    *event = s != NULL ? event_at(s) : NULL;
    unlock();
    if (*event == NULL) {
        snprintf(err, errlen, "%s of tensor '%s': out of memory for an event",
                 t->coll, t->name);
        return KOLO_ERR_NO_MEMORY;
    }
    return KOLO_OK;
}

static int simdev_result_copy(int device, const void *src, void *dst,
                              size_t bytes, char *err, size_t errlen)
{
    (void)device, (void)err, (void)errlen;
    if (bytes > 0)
        memcpy(dst, src, bytes);
    return KOLO_OK;
}

static void simdev_mem_free(void *data) { kolo__simdev_free(data); }

/* ---- contexts ----------------------------------------------------------------- */

/* A slot's context, its failures going to err (failf). */
static sim_ctx_t *enter(void *ctx, char *err, size_t errlen)
{
    sim_ctx_t *c = ctx;
    c->out = (slot_out_t){err, errlen};
    return c;
}

#define failf(c, ...) kolo__ops_fail((c)->out.err, (c)->out.len, __VA_ARGS__)

/* Joins group `id` of `size` members as member `me`. Under g_mu. */
static group_t *group_attach(uint64_t id, int size, int me, sim_ctx_t *c)
{
    group_t *g;

    for (g = g_groups; g != NULL; g = g->next)
        if (g->id == id)
            break;
    if (g == NULL) {
        /* The group and its three arrays in one block, freed at once. */
        size_t n = (size_t)size;
        g = kolo__calloc(1, sizeof(*g) + n * (sizeof(*g->slot) +
                                        sizeof(*g->posted) + sizeof(*g->m)));
        if (g == NULL)
            return NULL;
        g->slot = (post_t(*)[2])(g + 1);
        g->posted = (uint64_t *)(g->slot + n);
        g->m = (sim_ctx_t **)(g->posted + n);
        g->id = id;
        g->size = size;
        g->aborted_by = -1;
        g->next = g_groups;
        g_groups = g;
    }
    g->m[me] = c;
    g->attached++;
    return g;
}

/* Leaves the group; the last member frees it. Under g_mu. */
static void group_detach(group_t *g, int me)
{
    group_t **link;

    g->m[me] = NULL;
    if (--g->attached > 0)
        return;
    for (link = &g_groups; *link != NULL; link = &(*link)->next)
        if (*link == g) {
            *link = g->next;
            break;
        }
    for (int i = 0; i < g->size; i++)
        for (int k = 0; k < 2; k++) {
            free(g->slot[i][k].data);
            free(g->slot[i][k].sizes);
        }
    free(g);
}

/* The context, on this rank alone (ops.h: init meets no other rank); the
 * group is met at the first batch (meet). */
static int simdev_init(const kolo__dev_config_t *cfg, void **out, char *err,
                       size_t errlen)
{
    sim_ctx_t *c;

    *out = NULL;
    switch (take_fail_start(cfg->members[cfg->rank])) {
    case KOLO_ERR_NO_MEMORY:
        snprintf(err, errlen, "out of memory on simulated device %d for "
                 "kolo's stream and fusion buffer", cfg->device);
        return KOLO_ERR_NO_MEMORY;
    case KOLO_ERR_BACKEND:
        snprintf(err, errlen, "simulated device %d failed to start "
                 "(cudaErrorDevicesUnavailable, as a GPU in exclusive "
                 "mode taken by another process)", cfg->device);
        return KOLO_ERR_BACKEND;
    default:
        break;
    }
    c = kolo__calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory for the simulated device");
        return KOLO_ERR_NO_MEMORY;
    }
    c->cfg = *cfg;
    c->cfg.members = NULL; /* not kept: the runtime's copy may go */
    c->cfg.hosts = NULL;
    c->global_rank = cfg->members[cfg->rank];
    c->device = cfg->device;
    c->me = cfg->rank;
    c->stream = stream_make(c->device, c);
    if (c->stream == NULL) {
        free(c);
        snprintf(err, errlen, "out of memory for the simulated device");
        return KOLO_ERR_NO_MEMORY;
    }
    *out = c;
    return KOLO_OK;
}

/* The group of the set's contexts, met at the first batch: its id travels
 * over the set's controller, as NCCL's unique id does. */
static int meet(sim_ctx_t *c)
{
    uint64_t mine = 0, *ids = kolo__calloc((size_t)c->cfg.size, sizeof(*ids));
    int rc;

    if (ids == NULL)
        return failf(c, KOLO_ERR_NO_MEMORY, "out of memory for the simulated "
                     "device's group");
    if (c->me == 0) {
        lock();
        mine = ++g_next_id;
        unlock();
    }
    rc = c->cfg.allgather(c->cfg.arg, &mine, ids, sizeof(mine), c->out.err,
                          c->out.len);
    if (rc == KOLO_OK) {
        lock();
        c->g = group_attach(ids[0], c->cfg.size, c->me, c);
        unlock();
        if (c->g == NULL)
            rc = failf(c, KOLO_ERR_NO_MEMORY, "out of memory for the "
                       "simulated device's group");
    }
    free(ids);
    return rc;
}

static void simdev_finalize(void *ctx)
{
    sim_ctx_t *c = ctx;

    /* Tasks still queued (a broken context's) skip their work once the
     * context is aborted: the worker ends. */
    if (c != NULL) {
        lock();
        c->aborted = 1;
        pthread_cond_broadcast(&g_cv);
        unlock();
        stream_release(c->stream);
        lock();
        if (c->g != NULL)
            group_detach(c->g, c->me);
        unlock();
        free(c);
    }
}

static int simdev_begin(void *ctx, char *err, size_t errlen)
{
    sim_ctx_t *c = enter(ctx, err, errlen);

    if (c->broken)
        return failf(c, KOLO_ERR_BACKEND, "an earlier failure aborted this "
                     "process set's communicator on simulated device %d",
                     c->device);
    return c->g == NULL ? meet(c) : KOLO_OK;
}

static int simdev_wait_events(void *ctx, void *const *events, size_t n,
                              char *err, size_t errlen)
{
    sim_ctx_t *c = enter(ctx, err, errlen);
    int rc = KOLO_OK;

    lock();
    for (size_t i = 0; i < n && rc == KOLO_OK; i++)
        if (events[i] != NULL)
            rc = queue_wait(c->stream, events[i], c);
    unlock();
    return rc == KOLO_OK ? KOLO_OK
                         : failf(c, rc, "out of memory queuing a wait");
}

static int simdev_alloc(void *ctx, size_t bytes, void **out, char *err,
                        size_t errlen)
{
    sim_ctx_t *c = enter(ctx, err, errlen);

    *out = kolo__simdev_malloc(c->device, bytes);
    if (*out == NULL)
        return failf(c, KOLO_ERR_NO_MEMORY, "out of memory on simulated "
                     "device %d for a result of %zu bytes", c->device, bytes);
    return KOLO_OK;
}

/* ---- collectives ------------------------------------------------------------- */

typedef enum { C_ALLREDUCE, C_BROADCAST, C_ALLGATHERV, C_ALLTOALLV,
               C_REDUCE_SCATTER } kind_t;

/* A collective queued on a member's stream: what it was asked, copied. */
typedef struct coll {
    sim_ctx_t *c;
    kind_t kind;
    uint64_t seq;
    kolo__dev_tensor_t *ts; /* allreduce */
    size_t n, count;
    int dtype, wire, op;
    double prescale, post;
    kolo__ops_reduce_fn reduce;
    const void *in;          /* broadcast (buf), allgatherv, alltoallv, r-s */
    void *out;
    size_t bytes;            /* broadcast */
    int root;
    size_t *sizes;           /* [size]: allgatherv bytes, alltoallv send
                                bytes, reduce_scatter counts */
    size_t *recv;            /* [size]: alltoallv receive bytes */
} coll_t;

static void coll_free(coll_t *k)
{
    free(k->ts);
    free(k->sizes);
    free(k->recv);
    free(k);
}

/* Posts this member's contribution (taking data and sizes) and sleeps
 * until every member has posted this collective; 0 then, -1 when the
 * context was aborted meanwhile. */
static int post_and_wait(coll_t *k, uint8_t *data, size_t len, size_t *sizes)
{
    sim_ctx_t *c = k->c;
    group_t *g = c->g;
    post_t *p;
    int all;

    lock();
    if (c->aborted) {
        unlock();
        free(data);
        free(sizes);
        return -1;
    }
    p = &g->slot[c->me][k->seq % 2];
    free(p->data);
    free(p->sizes);
    p->data = data;
    p->len = len;
    p->sizes = sizes;
    g->posted[c->me] = k->seq;
    pthread_cond_broadcast(&g_cv);
    for (;;) {
        all = 1;
        for (int j = 0; j < g->size; j++)
            all &= g->posted[j] >= k->seq;
        /* A peer's abort does not end this member's wait (nor does it
         * end an NCCL kernel): its own abort, by watch, does. */
        if (all || c->aborted)
            break;
        sleep_until(NULL);
    }
    unlock();
    return all ? 0 : -1;
}

static const post_t *peer(const coll_t *k, int j)
{
    return &k->c->g->slot[j][k->seq % 2];
}

/* The float dtypes, whose AVERAGE is ncclAvg's: every contribution
 * multiplied by 1/size in the tensor's type (scaled as the device scales),
 * then summed; integers are summed, then divided. */
static int is_float(int dtype)
{
    return dtype == KOLO_FLOAT16 || dtype == KOLO_BFLOAT16 ||
           dtype == KOLO_FLOAT32 || dtype == KOLO_FLOAT64;
}

static void run_allreduce(coll_t *k)
{
    const kolo__host_math_t *m = k->c->cfg.math;
    size_t es = kolo_dtype_size((kolo_dtype_t)k->wire), at = 0;
    int size = k->c->g->size;
    uint8_t *mine = kolo__calloc(k->count ? k->count : 1, es), *acc;

    if (mine == NULL)
        return;
    for (size_t i = 0; i < k->n; i++) {
        if (k->ts[i].in != NULL) /* else a joined rank's zeros */
            m->convert(k->ts[i].in, k->dtype, mine + at * es, k->wire,
                       k->ts[i].count);
        at += k->ts[i].count;
    }
    m->scale(mine, k->count, k->wire, k->prescale);
    if (k->op == KOLO_OP_AVERAGE && is_float(k->wire))
        m->scale(mine, k->count, k->wire, 1.0 / (double)size);
    if (post_and_wait(k, mine, k->count * es, NULL) != 0)
        return;
    if ((acc = kolo__malloc(k->count * es + 1)) == NULL)
        return;
    memcpy(acc, peer(k, 0)->data, k->count * es);
    for (int j = 1; j < size; j++)
        k->reduce(acc, acc, peer(k, j)->data, k->count);
    if (k->op == KOLO_OP_AVERAGE && !is_float(k->wire))
        m->average(acc, k->count, k->wire, size);
    m->scale(acc, k->count, k->wire, k->post);
    at = 0;
    for (size_t i = 0; i < k->n; i++) {
        if (k->ts[i].in != NULL)
            m->convert(acc + at * es, k->wire, k->ts[i].out, k->dtype,
                       k->ts[i].count);
        at += k->ts[i].count;
    }
    free(acc);
}

static void run_broadcast(coll_t *k)
{
    uint8_t *mine = NULL;

    if (k->c->me == k->root && (mine = kolo__malloc(k->bytes)) != NULL)
        memcpy(mine, k->out, k->bytes);
    if (post_and_wait(k, mine, mine ? k->bytes : 0, NULL) != 0)
        return;
    if (k->c->me != k->root && peer(k, k->root)->data != NULL)
        memcpy(k->out, peer(k, k->root)->data, k->bytes);
}

static void run_allgatherv(coll_t *k)
{
    size_t len = k->sizes[k->c->me], off = 0;
    uint8_t *mine = kolo__malloc(len + 1);

    if (mine == NULL)
        return;
    memcpy(mine, k->in, len);
    if (post_and_wait(k, mine, len, NULL) != 0)
        return;
    for (int j = 0; j < k->c->g->size; j++) {
        memcpy((uint8_t *)k->out + off, peer(k, j)->data, k->sizes[j]);
        off += k->sizes[j];
    }
}

static void run_alltoallv(coll_t *k)
{
    int size = k->c->g->size, me = k->c->me;
    size_t total = 0, roff = 0;
    size_t *sizes = kolo__malloc((size_t)size * sizeof(size_t));
    uint8_t *mine;

    for (int j = 0; j < size; j++)
        total += k->sizes[j];
    mine = kolo__malloc(total + 1);
    if (mine == NULL || sizes == NULL) {
        free(mine);
        free(sizes);
        return;
    }
    memcpy(mine, k->in, total);
    memcpy(sizes, k->sizes, (size_t)size * sizeof(size_t));
    if (post_and_wait(k, mine, total, sizes) != 0)
        return;
    for (int j = 0; j < size; j++) {
        const post_t *p = peer(k, j);
        size_t off = 0;
        for (int i = 0; i < me; i++)
            off += p->sizes[i];
        memcpy((uint8_t *)k->out + roff, p->data + off, k->recv[j]);
        roff += k->recv[j];
    }
}

static void run_reduce_scatter(coll_t *k)
{
    int size = k->c->g->size, me = k->c->me;
    size_t es = kolo_dtype_size((kolo_dtype_t)k->dtype), total = 0, off = 0;
    size_t n = k->sizes[me];
    uint8_t *mine, *acc;

    for (int j = 0; j < size; j++) {
        if (j < me)
            off += k->sizes[j];
        total += k->sizes[j];
    }
    if ((mine = kolo__malloc(total * es + 1)) == NULL)
        return;
    memcpy(mine, k->in, total * es);
    k->c->cfg.math->scale(mine, total, k->dtype, k->prescale);
    if (post_and_wait(k, mine, total * es, NULL) != 0)
        return;
    if ((acc = kolo__malloc(n * es + 1)) == NULL)
        return;
    memcpy(acc, peer(k, 0)->data + off * es, n * es);
    for (int j = 1; j < size; j++)
        k->reduce(acc, acc, peer(k, j)->data + off * es, n);
    k->c->cfg.math->scale(acc, n, k->dtype, k->post);
    memcpy(k->out, acc, n * es);
    free(acc);
}

/* The task: a collective on the member's stream. */
static void coll_run(void *arg)
{
    coll_t *k = arg;
    sim_ctx_t *c = k->c;
    int fail = 0;

    lock();
    if (c->global_rank < MAX_RANKS && g_fail_next[c->global_rank]) {
        /* As an NCCL kernel after an asynchronous error: it moves nothing
         * and does not end until the communicator is aborted. */
        g_fail_next[c->global_rank] = 0;
        fail = 1;
        if (c->error == 0)
            c->error = KOLO_ERR_BACKEND;
        pthread_cond_broadcast(&g_cv);
        while (!c->aborted)
            sleep_until(NULL);
    }
    unlock();
    if (!fail) {
        switch (k->kind) {
        case C_ALLREDUCE: run_allreduce(k); break;
        case C_BROADCAST: run_broadcast(k); break;
        case C_ALLGATHERV: run_allgatherv(k); break;
        case C_ALLTOALLV: run_alltoallv(k); break;
        case C_REDUCE_SCATTER: run_reduce_scatter(k); break;
        }
    }
    lock();
    if (c->global_rank < MAX_RANKS)
        g_finished[c->global_rank]++;
    unlock();
    coll_free(k);
}

/* Queues a collective on the context's stream: a copy of k, with copies
 * of the per-member sizes (sizes, recv: [size] or NULL) and of the
 * tensors (k.ts: [k.n] or NULL). */
static int queue_coll(sim_ctx_t *c, coll_t k, const size_t *sizes,
                      const size_t *recv)
{
    size_t nm = (size_t)c->cfg.size * sizeof(size_t);
    coll_t *q = kolo__calloc(1, sizeof(*q));
    int rc = KOLO_ERR_NO_MEMORY;

    if (q == NULL)
        return failf(c, rc, "out of memory queuing a collective");
    *q = k;
    q->c = c;
    q->ts = NULL;
    q->sizes = q->recv = NULL;
    if ((k.ts != NULL && (q->ts = kolo__malloc(k.n * sizeof(*k.ts) + 1)) == NULL) ||
        (sizes != NULL && (q->sizes = kolo__malloc(nm)) == NULL) ||
        (recv != NULL && (q->recv = kolo__malloc(nm)) == NULL))
        goto out_of_memory;
    if (k.ts != NULL)
        memcpy(q->ts, k.ts, k.n * sizeof(*k.ts));
    if (sizes != NULL)
        memcpy(q->sizes, sizes, nm);
    if (recv != NULL)
        memcpy(q->recv, recv, nm);
    q->seq = ++c->seq;
    lock();
    rc = enqueue(c->stream, coll_run, q);
    if (rc == KOLO_OK && c->global_rank < MAX_RANKS)
        g_queued[c->global_rank]++;
    unlock();
    if (rc == KOLO_OK)
        return KOLO_OK;
    c->seq--;
out_of_memory:
    coll_free(q);
    return failf(c, KOLO_ERR_NO_MEMORY, "out of memory queuing a collective");
}

static int simdev_allreduce(void *ctx, const kolo__dev_tensor_t *ts, size_t n,
                            int dtype, int wire, int op, double prescale,
                            double post, kolo__ops_reduce_fn reduce,
                            char *err, size_t errlen)
{
    size_t count = 0;

    for (size_t i = 0; i < n; i++)
        count += ts[i].count;
    return queue_coll(enter(ctx, err, errlen),
                      (coll_t){.kind = C_ALLREDUCE,
                               .ts = (kolo__dev_tensor_t *)ts, .n = n,
                               .count = count, .dtype = dtype, .wire = wire,
                               .op = op, .prescale = prescale, .post = post,
                               .reduce = reduce},
                      NULL, NULL);
}

static int simdev_broadcast(void *ctx, void *buf, size_t bytes, int root,
                            char *err, size_t errlen)
{
    return queue_coll(enter(ctx, err, errlen),
                      (coll_t){.kind = C_BROADCAST, .out = buf,
                               .bytes = bytes, .root = root},
                      NULL, NULL);
}

static int simdev_allgatherv(void *ctx, const void *in, void *out,
                             const size_t *bytes, char *err, size_t errlen)
{
    return queue_coll(enter(ctx, err, errlen),
                      (coll_t){.kind = C_ALLGATHERV, .in = in, .out = out},
                      bytes, NULL);
}

static int simdev_alltoallv(void *ctx, const void *in,
                            const size_t *send_bytes, void *out,
                            const size_t *recv_bytes, char *err,
                            size_t errlen)
{
    return queue_coll(enter(ctx, err, errlen),
                      (coll_t){.kind = C_ALLTOALLV, .in = in, .out = out},
                      send_bytes, recv_bytes);
}

/* op: reduce is (dtype, op)'s. */
static int simdev_reduce_scatter(void *ctx, const void *in, void *out,
                                 const size_t *counts, int dtype, int op,
                                 double prescale, double post,
                                 kolo__ops_reduce_fn reduce, char *err,
                                 size_t errlen)
{
    (void)op;
    return queue_coll(enter(ctx, err, errlen),
                      (coll_t){.kind = C_REDUCE_SCATTER, .in = in, .out = out,
                               .dtype = dtype, .prescale = prescale,
                               .post = post, .reduce = reduce},
                      counts, NULL);
}

static int simdev_record(void *ctx, void **event, char *err, size_t errlen)
{
    sim_ctx_t *c = enter(ctx, err, errlen);

    lock();
    *event = event_at(c->stream);
    unlock();
    return *event != NULL ? KOLO_OK
                          : failf(c, KOLO_ERR_NO_MEMORY, "out of memory for "
                                  "an event");
}

/* Aborts the context and its group, then gives the stream DRAIN_S to
 * finish what is queued (every task skips its work now). */
static void abort_and_drain(sim_ctx_t *c)
{
    struct timespec deadline = after(DRAIN_S);

    lock();
    c->aborted = 1;
    if (c->g->aborted_by < 0)
        c->g->aborted_by = c->me;
    pthread_cond_broadcast(&g_cv);
    while (c->stream->done < c->stream->queued && !passed(&deadline))
        sleep_until(&deadline);
    unlock();
    c->broken = 1;
}

static int simdev_watch(void *ctx, const char *what, int expired, char *err,
                        size_t errlen)
{
    sim_ctx_t *c = enter(ctx, err, errlen);
    int error, by;

    if (c->broken)
        return failf(c, KOLO_ERR_BACKEND, "an earlier failure aborted this "
                     "process set's communicator");
    lock();
    error = c->error;
    by = c->g->aborted_by;
    unlock();
    if (error != 0) {
        abort_and_drain(c);
        return failf(c, error, "the simulated device reported an "
                     "asynchronous error during %s; its communicator was "
                     "aborted", what);
    }
    if (by >= 0 && by != c->me) {
        abort_and_drain(c);
        return failf(c, KOLO_ERR_BACKEND, "member %d aborted the "
                     "communicator during %s", by, what);
    }
    if (expired) {
        abort_and_drain(c);
        return failf(c, KOLO_ERR_TIMEOUT, "%s did not finish within %g s "
                     "(KOLO_TIMEOUT_SECONDS): some rank is not taking part, "
                     "or the device is stuck; the communicator was aborted",
                     what, c->cfg.timeout_s);
    }
    return KOLO_OK;
}

/* ---- the timeline's device side ------------------------------------------- */

static void stamp_run(void *arg)
{
    stamp_t *st = arg;

    lock();
    st->us = kolo__now_us();
    st->set = 1;
    stamp_unref(st);
    unlock();
}

static int simdev_mark(void *ctx, int device, void *stream, void **event)
{
    sim_ctx_t *c = ctx;
    stamp_t *st = kolo__calloc(1, sizeof(*st));
    stream_t *on;
    event_t *e = NULL;
    int rc = KOLO_ERR_NO_MEMORY;

    *event = NULL;
    if (st == NULL)
        return rc;
    st->refs = 2;
    lock();
    on = c != NULL ? c->stream : program_stream(stream, device);
    if (on != NULL && (rc = enqueue(on, stamp_run, st)) == KOLO_OK) {
        e = event_at(on);
        if (e != NULL)
            e->stamp = st;
        else
            stamp_unref(st); /* the task keeps its reference */
    } else {
        free(st);
    }
    unlock();
    if (rc == KOLO_OK && e == NULL)
        rc = KOLO_ERR_NO_MEMORY;
    *event = e;
    return rc;
}

static int simdev_event_time(void *event, int64_t *us)
{
    event_t *e = event;
    int r;

    if (e->stamp == NULL)
        return KOLO_ERR_INVALID_ARGUMENT;
    lock();
    r = e->stamp->set;
    if (r)
        *us = e->stamp->us;
    unlock();
    return r;
}

const kolo__dev_ops_t kolo__dev_ops_simdev = {
    .name = "simdev", .device_count = simdev_device_count,
    .version = simdev_version, .prepare = simdev_prepare,
    .event_free = simdev_event_free, .event_query = simdev_event_query,
    .order = simdev_order, .result_copy = simdev_result_copy,
    .mem_free = simdev_mem_free, .init = simdev_init,
    .finalize = simdev_finalize, .begin = simdev_begin,
    .wait_events = simdev_wait_events, .alloc = simdev_alloc,
    .allreduce = simdev_allreduce, .broadcast = simdev_broadcast,
    .allgatherv = simdev_allgatherv, .alltoallv = simdev_alltoallv,
    .reduce_scatter = simdev_reduce_scatter, .record = simdev_record,
    .watch = simdev_watch, .mark = simdev_mark,
    .event_time = simdev_event_time};
