/*
 * flight.c — the flight recorder (interface in flight.h, the dump's
 * fields in docs/flight.md).
 *
 * What it keeps. A ring of KOLO_FLIGHT_RECORDER records per rank, one per
 * collective this rank enqueued, newest overwriting oldest: the set, the
 * tensor's name (cut to 120 bytes), the operation, dtype, shape, bytes and
 * device, its numbers on this rank (seq: the set's enqueues so far; nth:
 * only this collective's), the times it was enqueued, put in the plan
 * ("ready"), handed to the backend and ended, its fusion batch, and how it
 * ended (the error cut to 300 bytes). About 600 bytes a record, allocated
 * once at kolo_init; nothing else grows with the job.
 *
 * Who writes. A record is made by the training thread at enqueue (under
 * the API lock), which numbers it with the recorder's count of records;
 * the entry carries that number (e->flight), which names its slot. That
 * part (the tensor's description) is written under one of 64 striped
 * mutexes, which the dump takes one record at a time. The set's
 * background thread then writes the record's other part (ready, started,
 * ended, batch, state) with plain atomic stores, in cache lines the
 * training thread never touches, the state last (rec_run_t), and only
 * while no newer record took the slot (more than N collectives in
 * flight). The cost, measured alone: about 50 ns per collective on the
 * training thread and 40 on the background thread (a clock read among
 * them), where one tiny allreduce costs kolo some 2.5 us all told
 * (kolo-bench's small).
 *
 * Where the threads are. The training threads' state (inside kolo_wait
 * since when, on which handle; outside since when) is kept in the handle
 * table (handles.h), which outlives any runtime, by a few relaxed atomics
 * around each wait; the enqueue marks when the thread last left kolo. A
 * set's background thread says what it is doing through the watchdog's
 * two atomics (wait_what, wait_since_us: a negotiation round or a
 * collective; neither: idle). The queue counts what was pushed and what
 * the background thread took, so that "blocked in kolo_wait with nothing
 * of its own waiting in the queue" (kolo__flight_blocked_since, the
 * negotiation's deadlock proof) is two loads and a compare.
 *
 * Dumps. One thread per recorder writes them; it blocks reading a pipe,
 * never on a timer. Asking for a dump (any thread: an error, the stall
 * inspector, the watchdog, the negotiation relaying another rank's
 * request) stores the reason, unless one is pending or the same reason was
 * dumped within a second, and writes a byte to the pipe. The SIGUSR1
 * handler only writes a byte too (async-signal safe); the thread tells the
 * signal's bytes from the requests' by counting the signals kolo raised
 * itself, and answers a signal from outside with a dump of this rank and
 * a request that every rank dump (kolo__flight_take_dump_all, at the
 * global set's next round). The dump goes to DIR/.rankR.json.PID.tmp,
 * then rename() makes it DIR/rankR.json: a reader sees the previous dump
 * or the new one, whole. A directory that cannot be written is said once;
 * the rank then stops trying, and the job goes on.
 *
 * Python's stacks. A Python binding registers faulthandler on a signal
 * of its own, a real-time one (chain=False), writing every thread's stack
 * to DIR/rankR.stacks, and hands kolo that file and that signal
 * (kolo_flight_stacks). Before each dump the dump thread sends that
 * signal to the thread that registered it (Python's main thread), which
 * stands still while faulthandler writes the stacks (ask_stacks), and the
 * dump copies what the file gained since the last one.
 * kolo never raises SIGUSR1 itself, so a program's own SIGUSR1 handler
 * (a checkpoint before preemption, a faulthandler the user registered)
 * runs only when someone sends the signal.
 */
#define _GNU_SOURCE /* pipe2 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "flight.h"

#define NAME_BYTES 120    /* of a tensor's name kept */
#define ERROR_BYTES 300   /* of an error's text kept */
#define STRIPES 64        /* mutexes over the ring's slots */
#define COALESCE_US 1000000 /* the same reason again within this: no dump */
#define HISTORY 8         /* earlier dumps named in each */
#define STACKS_MAX (1 << 20) /* of Python's stacks per dump */

enum { ST_EMPTY, ST_ENQUEUED, ST_READY, ST_RUNNING, ST_DONE, ST_FAILED };
#define ASKED_MAX 8 /* members whose request times a record keeps */
#define STACKS_WAIT_MS 300 /* for the stacks a dump asked for */

/* A record is two parts, each written by one thread under its own
 * mutexes, so that the training thread and the background thread never
 * write the same cache lines. What the enqueue writes (256 bytes): */
typedef struct rec_enq {
    uint64_t id; /* the recorder's count when it was made; 0: empty */
    uint64_t seq, nth;
    kolo_handle_t handle;
    int64_t enqueued_us, bytes;
    int64_t shape[KOLO_MAX_DIMS];
    int32_t set, device;
    uint8_t coll, dtype, ndim, device_type;
    char name[NAME_BYTES + 4];
} rec_enq_t;

/* What the set's background thread writes, valid for record `id` only
 * (an older id: nothing happened to this record since its enqueue). One
 * writer, the background thread of the record's set, and no lock: every
 * field is atomic (a plain store on x86), the state stored last and read
 * first, so that a dump reading it meanwhile sees the times the state
 * speaks of. (Where the ring went round while a collective was still in
 * flight, an update of the old record may land in the new one's fields:
 * a time off in a record of a job with more than N collectives in
 * flight, never anything worse.) The error text, rare, is under the
 * slot's mutex; its first 64 bytes are all that a collective that
 * succeeds touches. */
typedef struct rec_run {
    _Atomic uint64_t id;
    _Atomic int64_t ready_us, started_us, ended_us;
    _Atomic int64_t asked_us[ASKED_MAX]; /* the coordinator's: when each
                                            member enqueued it (full round) */
    atomic_int nasked;
    _Atomic int64_t batch, batch_bytes;
    _Atomic int32_t batch_tensors;
    atomic_int state;
    char error[ERROR_BYTES + 12];
} rec_run_t;

/* The background part as a dump copies it. */
typedef struct run_view {
    uint64_t id;
    int64_t ready_us, started_us, ended_us, batch, batch_bytes;
    int64_t asked_us[ASKED_MAX];
    int nasked;
    int32_t batch_tensors;
    int state;
    char error[ERROR_BYTES + 12];
} run_view_t;

/* A record as a dump reads it. */
typedef struct rec {
    rec_enq_t e;
    run_view_t r;
} rec_t;

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define STORE(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

/* A mutex on a cache line of its own. */
typedef union stripe {
    pthread_mutex_t mu;
    char line[128];
} stripe_t;

/* What the dumps keep of a set besides the set itself: its straggler
 * figures, and once it stopped, its last state. */
typedef struct set_note {
    int id, rank, size, stopped;
    int *ranks;
    int64_t rounds;
    uint64_t enqueued, completed;
    char why[ERROR_BYTES + 4];
    char *stragglers;
} set_note_t;

typedef struct earlier {
    char reason[160];
    int64_t us;
} earlier_t;

struct kolo__flight {
    kolo__runtime_t *rt;
    size_t n;
    rec_enq_t *enq;      /* [n], and their mutexes: */
    stripe_t *enq_mu;    /* [STRIPES] */
    rec_run_t *run;      /* [n], the same */
    stripe_t *run_mu;
    int64_t clock_offset_us; /* unix = monotonic + this */
    char line[64];       /* (the training thread's counters on a line of
                            their own) */
    _Atomic uint64_t total;        /* records made */
    _Atomic uint64_t last_enqueue; /* the newest record's id */
    char line2[64];
    /* The dump thread and its requests (mu guards what follows it). */
    pthread_t thread;
    int pipe[2];
    int owns_signal;
    int ready_written;   /* DIR/rankR.ready is there (announce_ready) */
    atomic_int dump_all;   /* kolo__flight_take_dump_all's */
    atomic_int broken;     /* a dump failed: no more */
    atomic_int has_stacks; /* stacks_fd is set */
    atomic_int stacks_sig; /* the signal its writer takes (0: none) */
    pthread_t stacks_thread; /* the thread that registered it */
    pthread_mutex_t mu;
    char pending[KOLO__ERR_LEN + 32];
    int has_pending, quit, final;
    char last[KOLO__ERR_LEN + 32];
    int64_t last_us;
    earlier_t history[HISTORY];
    int nhistory;
    set_note_t *notes;
    size_t nnotes;
    int stacks_fd;         /* our own descriptor of it; -1: none */
    off_t stacks_seen;
};

/* ---- SIGUSR1 ------------------------------------------------------------- */

static pthread_mutex_t g_sig_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kolo__flight *g_sig_owner; /* under g_sig_mu */
static struct sigaction g_sig_prev;      /* the disposition kolo replaced */
static atomic_int g_sig_fd = -1;         /* the owner's pipe */
static atomic_int g_sig_depth;

/* Async-signal safe: a byte to the pipe, then the handler kolo replaced,
 * if it was a function (once: faulthandler chains back to here). */
static void on_signal(int sig, siginfo_t *info, void *uc)
{
    int saved = errno, fd = atomic_load(&g_sig_fd);

    if (fd >= 0) {
        char b = 'S';
        ssize_t w = write(fd, &b, 1);
        (void)w;
    }
    if (atomic_fetch_add(&g_sig_depth, 1) == 0) {
        if (g_sig_prev.sa_flags & SA_SIGINFO) {
            if (g_sig_prev.sa_sigaction != NULL)
                g_sig_prev.sa_sigaction(sig, info, uc);
        } else if (g_sig_prev.sa_handler != SIG_DFL &&
                   g_sig_prev.sa_handler != SIG_IGN &&
                   g_sig_prev.sa_handler != NULL)
            g_sig_prev.sa_handler(sig);
    }
    atomic_fetch_sub(&g_sig_depth, 1);
    errno = saved;
}

static void claim_signal(struct kolo__flight *fl)
{
    struct sigaction sa;

    pthread_mutex_lock(&g_sig_mu);
    if (g_sig_owner == NULL) {
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        atomic_store(&g_sig_fd, fl->pipe[1]);
        if (sigaction(SIGUSR1, &sa, &g_sig_prev) == 0) {
            g_sig_owner = fl;
            fl->owns_signal = 1;
        } else {
            atomic_store(&g_sig_fd, -1);
            kolo__log(KOLO__LOG_WARNING, "flight recorder: cannot install "
                      "a SIGUSR1 handler (%s): no dumps on SIGUSR1",
                      strerror(errno));
        }
    }
    pthread_mutex_unlock(&g_sig_mu);
}

/* Restores the disposition kolo replaced, unless something was installed
 * over kolo's since (it may call kolo's handler, which then does
 * nothing but chain). */
static void release_signal(struct kolo__flight *fl)
{
    struct sigaction cur;

    pthread_mutex_lock(&g_sig_mu);
    if (g_sig_owner == fl) {
        atomic_store(&g_sig_fd, -1);
        if (sigaction(SIGUSR1, NULL, &cur) == 0 &&
            (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal)
            sigaction(SIGUSR1, &g_sig_prev, NULL);
        g_sig_owner = NULL;
        fl->owns_signal = 0;
    }
    pthread_mutex_unlock(&g_sig_mu);
}

/* ---- records ------------------------------------------------------------- */

/* Copies at most max bytes of src, cut where a UTF-8 character starts,
 * with "..." when cut. */
static void copy_cut(char *dst, const char *src, size_t max)
{
    size_t len = strnlen(src, max + 1);

    if (len <= max) {
        memcpy(dst, src, len + 1);
        return;
    }
    len = max;
    while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
        len--;
    memcpy(dst, src, len);
    memcpy(dst + len, "...", 4);
}

static size_t slot_of(const struct kolo__flight *fl, uint64_t id)
{
    return (size_t)((id - 1) % fl->n);
}

static pthread_mutex_t *enq_mu(struct kolo__flight *fl, uint64_t id)
{
    return &fl->enq_mu[slot_of(fl, id) % STRIPES].mu;
}

static pthread_mutex_t *run_mu(struct kolo__flight *fl, uint64_t id)
{
    return &fl->run_mu[slot_of(fl, id) % STRIPES].mu;
}

/* Record id's background part, made record id's if it was an older
 * record's; NULL when a newer record's background thread has written it
 * already (the ring went round while this collective was in flight). */
static rec_run_t *run_of(struct kolo__flight *fl, uint64_t id)
{
    rec_run_t *r = &fl->run[slot_of(fl, id)];
    uint64_t cur = LOAD(r->id);

    if (cur > id)
        return NULL;
    if (cur != id) {
        STORE(r->state, ST_ENQUEUED);
        STORE(r->ready_us, 0);
        STORE(r->started_us, 0);
        STORE(r->ended_us, 0);
        STORE(r->batch, 0);
        STORE(r->batch_bytes, 0);
        STORE(r->batch_tensors, 0);
        STORE(r->nasked, 0);
        atomic_store_explicit(&r->id, id, memory_order_release);
    }
    return r;
}

/* The state last: a dump that reads it sees the fields it speaks of. */
static void set_state(rec_run_t *r, int state)
{
    atomic_store_explicit(&r->state, state, memory_order_release);
}

/* The tensor's description, from the entry (the training thread's). */
static void describe(rec_enq_t *r, const kolo__pset_t *ps,
                     const kolo__entry_t *e)
{
    const kolo__params_t *p = &e->params;
    int rows = p->coll == KOLO__COLL_ALLGATHER || p->coll == KOLO__COLL_ALLTOALL;

    r->set = ps->id;
    r->handle = e->handle;
    r->coll = p->coll;
    r->dtype = p->dtype;
    r->ndim = p->ndim <= KOLO_MAX_DIMS ? p->ndim : KOLO_MAX_DIMS;
    memcpy(r->shape, p->shape, sizeof(r->shape));
    if (rows && r->ndim > 0)
        r->shape[0] = e->rows;
    if (r->ndim == 0 && !rows) { /* a count without a shape (C API) */
        r->ndim = 1;
        r->shape[0] = p->count;
    }
    r->bytes = (rows ? e->rows : 1) * p->count *
               (int64_t)kolo_dtype_size((kolo_dtype_t)p->dtype);
    r->device_type = p->device_type;
    r->device = e->device;
    r->enqueued_us = e->enqueued_us;
    copy_cut(r->name, e->name, NAME_BYTES);
}

void kolo__flight_enqueued(kolo__pset_t *ps, kolo__entry_t *e)
{
    struct kolo__flight *fl = ps->rt->flight;
    uint64_t id, nth;
    rec_enq_t *r;

    if (ps->rt->handles != NULL)
        atomic_store_explicit(&ps->rt->handles->waits.outside_us,
                              e->enqueued_us, memory_order_relaxed);
    /* Counted with the recorder off too: the requests carry it (the
     * stall inspector's "21st collective"). */
    e->seq = ++ps->flight.seq;
    nth = e->params.coll < KOLO__COLL_COUNT_ ? ++ps->flight.nth[e->params.coll]
                                             : 0;
    if (fl == NULL)
        return;
    /* (one writer: enqueues are made under the API lock) */
    id = atomic_load_explicit(&fl->total, memory_order_relaxed) + 1;
    atomic_store_explicit(&fl->total, id, memory_order_relaxed);
    e->flight = id;
    r = &fl->enq[slot_of(fl, id)];
    pthread_mutex_lock(enq_mu(fl, id));
    r->id = id;
    r->seq = e->seq;
    r->nth = nth;
    describe(r, ps, e);
    pthread_mutex_unlock(enq_mu(fl, id));
    atomic_store_explicit(&fl->last_enqueue, id, memory_order_relaxed);
}

void kolo__flight_refused(kolo__pset_t *ps, kolo__entry_t *e)
{
    struct kolo__flight *fl = ps->rt->flight;
    uint64_t id = e->flight, newest = id;

    if (e->seq != 0) {
        e->seq = 0;
        ps->flight.seq--;
        if (e->params.coll < KOLO__COLL_COUNT_)
            ps->flight.nth[e->params.coll]--;
    }
    if (fl == NULL || id == 0)
        return;
    e->flight = 0;
    pthread_mutex_lock(enq_mu(fl, id));
    if (fl->enq[slot_of(fl, id)].id == id)
        fl->enq[slot_of(fl, id)].id = 0;
    pthread_mutex_unlock(enq_mu(fl, id));
    /* Enqueues are made under the API lock: it is the newest record. */
    if (atomic_compare_exchange_strong(&fl->total, &newest, id - 1))
        atomic_store_explicit(&fl->last_enqueue, id - 1, memory_order_relaxed);
}

void kolo__flight_ready(kolo__pset_t *ps, kolo__entry_t *e, int64_t now_us)
{
    struct kolo__flight *fl = ps->rt->flight;
    rec_run_t *r;

    if (fl == NULL || e->flight == 0 || (r = run_of(fl, e->flight)) == NULL)
        return;
    STORE(r->ready_us, now_us);
    set_state(r, ST_READY);
}

void kolo__flight_asked(kolo__pset_t *ps, const kolo__entry_t *e,
                        const int64_t *at_us)
{
    struct kolo__flight *fl = ps->rt->flight;
    rec_run_t *r;
    int n = ps->size < ASKED_MAX ? ps->size : ASKED_MAX;

    if (fl == NULL || e->flight == 0 || (r = run_of(fl, e->flight)) == NULL)
        return;
    for (int i = 0; i < n; i++)
        STORE(r->asked_us[i], at_us[i]);
    atomic_store_explicit(&r->nasked, n, memory_order_release);
}

void kolo__flight_started(kolo__pset_t *ps, kolo__entry_t *const *es,
                          size_t n, size_t bytes, int64_t now_us)
{
    struct kolo__flight *fl = ps->rt->flight;
    int64_t batch;

    if (fl == NULL)
        return;
    batch = ++ps->flight.batches;
    for (size_t i = 0; i < n; i++) {
        rec_run_t *r;
        if (es[i]->flight == 0 || (r = run_of(fl, es[i]->flight)) == NULL)
            continue;
        STORE(r->started_us, now_us);
        STORE(r->batch, batch);
        STORE(r->batch_tensors, (int32_t)n);
        STORE(r->batch_bytes, (int64_t)bytes);
        set_state(r, ST_RUNNING);
    }
}

void kolo__flight_ended(kolo__pset_t *ps, kolo__entry_t *e,
                        const kolo__err_t *err)
{
    struct kolo__flight *fl = ps->rt->flight;
    int failed = err != NULL && err->code != KOLO_OK;
    rec_run_t *r;

    if (fl == NULL)
        return;
    atomic_store_explicit(&ps->flight.completed,
                          atomic_load_explicit(&ps->flight.completed,
                                               memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (e->flight != 0 && (r = run_of(fl, e->flight)) != NULL) {
        STORE(r->ended_us, kolo__now_us());
        if (failed) {
            pthread_mutex_lock(run_mu(fl, e->flight));
            copy_cut(r->error, err->msg[0] ? err->msg : kolo_strerror(err->code),
                     ERROR_BYTES);
            pthread_mutex_unlock(run_mu(fl, e->flight));
        }
        set_state(r, failed ? ST_FAILED : ST_DONE);
    }
    /* An error reported through a handle (a shutdown is judged where the
     * set stops: kolo__flight_set_stopped). */
    if (failed && err->code != KOLO_ERR_SHUTDOWN)
        kolo__flight_dump_error(ps->rt, err);
}

/* ---- the training threads ----------------------------------------------- */

/* kolo__now_us's clock to the kernel's tick (a few ms; "since" is read in
 * seconds), for a few ns instead of tens: it runs twice per kolo_wait.
 * Never before the thread's last mark (an enqueue's is exact), so that
 * the marks keep their order. */
static int64_t coarse_now_us(const kolo__handles_waits_t *w)
{
    struct timespec ts;
    int64_t now, last = atomic_load_explicit(&w->outside_us,
                                             memory_order_relaxed);

    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return kolo__now_us();
    now = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    return now > last ? now : last;
}

void kolo__flight_waits_begin(kolo__handles_t *h, kolo_handle_t handle)
{
    kolo__handles_waits_t *w = &h->waits;

    atomic_store_explicit(&w->handle, handle, memory_order_relaxed);
    if (atomic_fetch_add(&w->inside, 1) == 0)
        atomic_store(&w->since_us, coarse_now_us(w));
}

void kolo__flight_waits_end(kolo__handles_t *h)
{
    kolo__handles_waits_t *w = &h->waits;

    atomic_store_explicit(&w->outside_us, coarse_now_us(w),
                          memory_order_relaxed);
    if (atomic_fetch_sub(&w->inside, 1) == 1)
        atomic_store(&w->since_us, 0);
}

void kolo__flight_wait_begin(kolo__runtime_t *rt, kolo_handle_t handle)
{
    if (rt->handles != NULL)
        kolo__flight_waits_begin(rt->handles, handle);
}

void kolo__flight_wait_end(kolo__runtime_t *rt)
{
    if (rt->handles != NULL)
        kolo__flight_waits_end(rt->handles);
}

int64_t kolo__flight_blocked_since(kolo__runtime_t *rt, const kolo__pset_t *ps)
{
    kolo__handles_waits_t *w;
    int64_t since;

    if (rt->handles == NULL)
        return 0;
    w = &rt->handles->waits;
    since = atomic_load(&w->since_us);
    if (since == 0 || atomic_load(&w->inside) == 0)
        return 0;
    if (atomic_load_explicit(&ps->queue.pushed, memory_order_relaxed) !=
        atomic_load_explicit(&ps->queue.taken, memory_order_relaxed))
        return 0;
    return since;
}

int64_t kolo__flight_outside_since(kolo__runtime_t *rt)
{
    if (rt->handles == NULL || atomic_load(&rt->handles->waits.inside) > 0)
        return 0;
    return atomic_load_explicit(&rt->handles->waits.outside_us,
                                memory_order_relaxed);
}

/* ---- asking for dumps ---------------------------------------------------- */

/* A byte for the dump thread (EAGAIN: the pipe is full of bytes it has
 * yet to read, which wake it as well). */
static void poke(struct kolo__flight *fl, char b)
{
    ssize_t w = write(fl->pipe[1], &b, 1);
    (void)w;
}

/* Whether two reasons are of one kind: the same text up to the first
 * ':' ("error: ...", "timeout: ..."), or the same text. */
static int same_kind(const char *a, const char *b)
{
    size_t n = strcspn(a, ":");

    return n == strcspn(b, ":") && strncmp(a, b, n) == 0;
}

/* Stores the reason for the dump thread unless a dump is pending (this
 * request joins it), one of the same kind was dumped within COALESCE_US,
 * or there is nowhere to write; 1 when a dump is now pending. */
static int request(struct kolo__flight *fl, const char *reason)
{
    int64_t now = kolo__now_us();
    int fresh = 0;

    if (fl->rt->cfg.flight_dir[0] == '\0' || atomic_load(&fl->broken))
        return 0;
    pthread_mutex_lock(&fl->mu);
    if (!fl->has_pending && !fl->quit &&
        !(same_kind(fl->last, reason) && now - fl->last_us < COALESCE_US)) {
        snprintf(fl->pending, sizeof(fl->pending), "%s", reason);
        fl->has_pending = fresh = 1;
    }
    pthread_mutex_unlock(&fl->mu);
    return fresh;
}

void kolo__flight_dump(kolo__runtime_t *rt, const char *reason)
{
    struct kolo__flight *fl = rt->flight;

    if (fl == NULL || !request(fl, reason))
        return;
    poke(fl, 'D');
}

void kolo__flight_dump_error(kolo__runtime_t *rt, const kolo__err_t *err)
{
    char reason[KOLO__ERR_LEN + 16];

    if (rt->flight == NULL)
        return;
    snprintf(reason, sizeof(reason), "%s: %s",
             err->code == KOLO_ERR_TIMEOUT ? "timeout" : "error",
             err->msg[0] ? err->msg : kolo_strerror(err->code));
    kolo__flight_dump(rt, reason);
}

void kolo__flight_dump_all(kolo__runtime_t *rt, const char *reason)
{
    if (rt->flight == NULL)
        return;
    atomic_store(&rt->flight->dump_all, 1);
    kolo__flight_dump(rt, reason);
}

int kolo__flight_take_dump_all(kolo__runtime_t *rt)
{
    /* (every round of the global set asks: a plain load first, the
     * locked exchange only when a request is there) */
    return rt->flight != NULL && atomic_load_explicit(&rt->flight->dump_all,
                                                      memory_order_relaxed) &&
           atomic_exchange(&rt->flight->dump_all, 0);
}

/* ---- what the dumps keep of the sets ------------------------------------- */

/* Set id's note, made if missing; under fl->mu; NULL for want of memory. */
static set_note_t *note_for(struct kolo__flight *fl, int id)
{
    set_note_t *notes;

    for (size_t i = 0; i < fl->nnotes; i++)
        if (fl->notes[i].id == id)
            return &fl->notes[i];
    notes = kolo__realloc(fl->notes, (fl->nnotes + 1) * sizeof(*notes));
    if (notes == NULL)
        return NULL;
    fl->notes = notes;
    notes += fl->nnotes++;
    memset(notes, 0, sizeof(*notes));
    notes->id = id;
    return notes;
}

void kolo__flight_set_stopped(kolo__pset_t *ps, const kolo__err_t *why,
                              int failed)
{
    struct kolo__flight *fl = ps->rt->flight;
    set_note_t *n;

    if (fl == NULL)
        return;
    pthread_mutex_lock(&fl->mu);
    if ((n = note_for(fl, ps->id)) != NULL) {
        if (n->ranks == NULL)
            n->ranks = kolo__malloc((size_t)ps->size * sizeof(int));
        if (n->ranks != NULL)
            memcpy(n->ranks, ps->ranks, (size_t)ps->size * sizeof(int));
        n->rank = ps->rank;
        n->size = ps->size;
        n->stopped = 1;
        n->rounds = ps->cycles;
        n->enqueued = atomic_load(&ps->queue.pushed);
        n->completed = atomic_load(&ps->flight.completed);
        copy_cut(n->why, why->msg[0] ? why->msg : kolo_strerror(why->code),
                 ERROR_BYTES);
    }
    pthread_mutex_unlock(&fl->mu);
    if (failed)
        kolo__flight_dump_error(ps->rt, why);
}

void kolo__flight_set_stragglers(kolo__pset_t *ps, const char *json)
{
    struct kolo__flight *fl = ps->rt->flight;
    set_note_t *n;

    if (fl == NULL)
        return;
    pthread_mutex_lock(&fl->mu);
    if ((n = note_for(fl, ps->id)) != NULL) {
        free(n->stragglers);
        n->stragglers = json != NULL ? kolo__strdup(json) : NULL;
    }
    pthread_mutex_unlock(&fl->mu);
}

/* ---- the dump's JSON ----------------------------------------------------- */

/* The length of the valid UTF-8 character at s; 0 if none starts there. */
static size_t utf8_char(const unsigned char *s)
{
    unsigned char c = s[0], lo, hi;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
        return s[1] >= lo && s[1] <= hi && (s[2] & 0xC0) == 0x80 &&
                       (s[3] & 0xC0) == 0x80 ? 4 : 0;
    }
    return 0;
}

/* A JSON string (null for NULL): escaped, bytes that are not UTF-8 as
 * U+FFFD. */
static void put_str(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;

    if (text == NULL) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    while (*s != '\0') {
        size_t n = utf8_char(s);
        if (n == 0)
            fputs("\\ufffd", f);
        else if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (*s < 0x20 || *s == 0x7f)
            fprintf(f, "\\u%04x", *s);
        else
            fwrite(s, 1, n, f);
        s += n > 0 ? n : 1;
    }
    fputc('"', f);
}

/* A time: unix seconds with microseconds, from kolo__now_us's clock;
 * null for 0 (not reached). */
static void put_unix(FILE *f, int64_t t)
{
    fprintf(f, "%s%lld.%06lld", t < 0 ? "-" : "", (long long)llabs(t / 1000000),
            (long long)llabs(t % 1000000));
}

static void put_time(FILE *f, const struct kolo__flight *fl, int64_t us)
{
    if (us == 0)
        fputs("null", f);
    else
        put_unix(f, us + fl->clock_offset_us);
}

static const char *state_name(int state)
{
    static const char *const names[] = {"empty", "enqueued", "ready",
                                        "running", "done", "failed"};
    return state >= 0 && state <= ST_FAILED ? names[state] : "unknown";
}

/* {"set", "name", "seq"} of a record, with its enqueue time. */
static void put_ref(FILE *f, const struct kolo__flight *fl, const rec_enq_t *r,
                    int with_time)
{
    fprintf(f, "{\"set\": %d, \"name\": ", r->set);
    put_str(f, r->name);
    fprintf(f, ", \"seq\": %llu", (unsigned long long)r->seq);
    if (with_time) {
        fputs(", \"time\": ", f);
        put_time(f, fl, r->enqueued_us);
    }
    fputc('}', f);
}

/* What happened to the record after its enqueue: times, batch, state. */
static void put_run(FILE *f, const struct kolo__flight *fl, const run_view_t *r)
{
    const int64_t *times[] = {&r->ready_us, &r->started_us, &r->ended_us};
    const char *keys[] = {"ready", "started", "ended"};

    for (int i = 0; i < 3; i++) {
        fprintf(f, ", \"%s\": ", keys[i]);
        put_time(f, fl, *times[i]);
    }
    fputs(", \"members_ready\": ", f);
    if (r->nasked == 0)
        fputs("null", f);
    for (int i = 0; i < r->nasked && i < ASKED_MAX; i++) {
        fputs(i ? ", " : "[", f);
        put_time(f, fl, r->asked_us[i]);
    }
    if (r->nasked > 0)
        fputc(']', f);
    if (r->batch > 0)
        fprintf(f, ", \"batch\": %lld, \"batch_tensors\": %d, \"batch_bytes\": "
                "%lld", (long long)r->batch, r->batch_tensors,
                (long long)r->batch_bytes);
    else
        fputs(", \"batch\": null, \"batch_tensors\": null, \"batch_bytes\": null",
              f);
    fprintf(f, ", \"state\": \"%s\", \"error\": ", state_name(r->state));
    put_str(f, r->state == ST_FAILED ? r->error : NULL);
}

static void put_rec(FILE *f, const struct kolo__flight *fl, const rec_t *r)
{
    const rec_enq_t *e = &r->e;
    run_view_t none = {.state = ST_ENQUEUED};

    fprintf(f, "{\"seq\": %llu, \"nth\": %llu, \"set\": %d, \"name\": ",
            (unsigned long long)e->seq, (unsigned long long)e->nth, e->set);
    put_str(f, e->name);
    fprintf(f, ", \"op\": \"%s\", \"dtype\": \"%s\", \"shape\": [",
            kolo__coll_name(e->coll), kolo_dtype_name((kolo_dtype_t)e->dtype));
    for (int d = 0; d < e->ndim; d++)
        fprintf(f, "%s%lld", d ? ", " : "", (long long)e->shape[d]);
    fprintf(f, "], \"bytes\": %lld, \"device\": ", (long long)e->bytes);
    if (e->device_type == KOLO_DEVICE_CUDA)
        fprintf(f, "\"cuda:%d\"", e->device);
    else
        fputs("\"cpu\"", f);
    fputs(", \"enqueued\": ", f);
    put_time(f, fl, e->enqueued_us);
    put_run(f, fl, r->r.id == e->id ? &r->r : &none);
    fputc('}', f);
}

/* Record id's enqueue part, if the ring still holds it. */
static int copy_enq(struct kolo__flight *fl, uint64_t id, rec_enq_t *out)
{
    int ok;

    if (id == 0)
        return 0;
    pthread_mutex_lock(enq_mu(fl, id));
    *out = fl->enq[slot_of(fl, id)];
    pthread_mutex_unlock(enq_mu(fl, id));
    ok = out->id == id;
    return ok;
}

/* Record id's background part: the state first (see rec_run_t), the
 * error under its mutex; out->id 0 when it is not record id's (nothing
 * happened to the record since its enqueue). */
static void copy_run(struct kolo__flight *fl, uint64_t id, run_view_t *out)
{
    rec_run_t *r = &fl->run[slot_of(fl, id)];

    out->id = atomic_load_explicit(&r->id, memory_order_acquire);
    out->state = atomic_load_explicit(&r->state, memory_order_acquire);
    out->ready_us = LOAD(r->ready_us);
    out->started_us = LOAD(r->started_us);
    out->ended_us = LOAD(r->ended_us);
    out->batch = LOAD(r->batch);
    out->batch_bytes = LOAD(r->batch_bytes);
    out->batch_tensors = LOAD(r->batch_tensors);
    out->nasked = LOAD(r->nasked);
    for (int i = 0; i < out->nasked && i < ASKED_MAX; i++)
        out->asked_us[i] = LOAD(r->asked_us[i]);
    out->error[0] = '\0';
    if (out->state == ST_FAILED) {
        pthread_mutex_lock(run_mu(fl, id));
        memcpy(out->error, r->error, sizeof(out->error));
        pthread_mutex_unlock(run_mu(fl, id));
    }
    if (out->id != id || LOAD(r->id) != id) /* (made another's meanwhile) */
        out->id = 0;
}

/* A copy of record id, if the ring still holds it. */
static int copy_rec(struct kolo__flight *fl, uint64_t id, rec_t *out)
{
    if (!copy_enq(fl, id, &out->e))
        return 0;
    copy_run(fl, id, &out->r);
    return 1;
}

/* The oldest record the ring can still hold. */
static uint64_t first_kept(const struct kolo__flight *fl, uint64_t total)
{
    return total > fl->n ? total - fl->n + 1 : 1;
}

static void write_records(FILE *f, struct kolo__flight *fl)
{
    uint64_t total = atomic_load(&fl->total);
    int any = 0;
    rec_t r;

    fputs("\"records\": [", f);
    for (uint64_t id = first_kept(fl, total); id <= total; id++) {
        if (!copy_rec(fl, id, &r))
            continue;
        fputs(any ? ",\n  " : "\n  ", f);
        put_rec(f, fl, &r);
        any = 1;
    }
    fputs("]\n", f);
}

/* The newest record of the handle, if the ring still has it. */
static int find_handle(struct kolo__flight *fl, kolo_handle_t handle,
                       rec_enq_t *out)
{
    uint64_t total = atomic_load(&fl->total), first = first_kept(fl, total);

    for (uint64_t id = total; id >= first && id > 0; id--)
        if (copy_enq(fl, id, out) && out->handle == handle)
            return 1;
    return 0;
}

static void write_training(FILE *f, struct kolo__flight *fl)
{
    kolo__handles_t *h = fl->rt->handles;
    int inside = h != NULL && atomic_load(&h->waits.inside) > 0;
    kolo_handle_t handle = h != NULL ? atomic_load(&h->waits.handle) : 0;
    rec_enq_t r;

    fprintf(f, "\"training\": {\"inside\": %s, \"since\": ",
            inside ? "\"kolo_wait\"" : "null");
    put_time(f, fl, h == NULL ? 0
                    : inside ? atomic_load(&h->waits.since_us)
                             : atomic_load(&h->waits.outside_us));
    fputs(", \"waiting_on\": ", f);
    if (!inside)
        fputs("null", f);
    else if (find_handle(fl, handle, &r))
        put_ref(f, fl, &r, 0);
    else
        fprintf(f, "{\"set\": null, \"name\": null, \"seq\": null, "
                "\"handle\": %lld}", (long long)handle);
    fputs(", \"last_enqueue\": ", f);
    if (copy_enq(fl, atomic_load(&fl->last_enqueue), &r))
        put_ref(f, fl, &r, 1);
    else
        fputs("null", f);
    fputs("},\n", f);
}

/* One set as a dump shows it, copied under the locks, written after. */
typedef struct set_view {
    int id, rank, size, stopped;
    int *ranks; /* owned */
    const char *doing;
    int64_t since, rounds;
    uint64_t enqueued, completed;
    char why[ERROR_BYTES + 4];
    char *stragglers; /* owned */
} set_view_t;

static int *copy_ranks(const int *ranks, int size)
{
    int *copy = ranks != NULL ? kolo__malloc((size_t)size * sizeof(int)) : NULL;

    if (copy != NULL)
        memcpy(copy, ranks, (size_t)size * sizeof(int));
    return copy;
}

/* A running set: its counters and what its background thread does
 * (the watchdog's marks). */
static void view_live(set_view_t *v, kolo__pset_t *ps)
{
    int64_t since = atomic_load_explicit(&ps->wait_since_us,
                                         memory_order_relaxed);

    v->id = ps->id;
    v->rank = ps->rank;
    v->size = ps->size;
    v->ranks = copy_ranks(ps->ranks, ps->size);
    v->doing = since != 0 ? atomic_load_explicit(&ps->wait_what,
                                                 memory_order_relaxed)
                          : "idle";
    v->since = since;
    v->rounds = atomic_load_explicit(&ps->flight.rounds, memory_order_relaxed);
    v->enqueued = atomic_load_explicit(&ps->queue.pushed, memory_order_relaxed);
    v->completed = atomic_load_explicit(&ps->flight.completed,
                                        memory_order_relaxed);
}

/* A note on the view of its set; a stopped set no longer in the table
 * gets a view of its own, from the note. */
static void apply_note(set_view_t *v, size_t *n, const set_note_t *note)
{
    set_view_t *x = NULL;

    for (size_t i = 0; i < *n && x == NULL; i++)
        if (v[i].id == note->id)
            x = &v[i];
    if (x == NULL && !note->stopped)
        return;
    if (x == NULL) {
        x = &v[(*n)++];
        x->id = note->id;
        x->rank = note->rank;
        x->size = note->size;
        x->ranks = copy_ranks(note->ranks, note->size);
        x->doing = "idle";
        x->rounds = note->rounds;
        x->enqueued = note->enqueued;
        x->completed = note->completed;
    }
    if (note->stopped) {
        x->stopped = 1;
        memcpy(x->why, note->why, sizeof(x->why));
    }
    if (note->stragglers != NULL)
        x->stragglers = kolo__strdup(note->stragglers);
}

/* Every set of the rank: those in the set table, and those stopped. */
static set_view_t *gather_sets(struct kolo__flight *fl, size_t *count)
{
    kolo__runtime_t *rt = fl->rt;
    set_view_t *v;
    size_t n = 0;

    pthread_mutex_lock(&rt->sets_mu);
    pthread_mutex_lock(&fl->mu);
    v = kolo__calloc((size_t)rt->nsets + fl->nnotes + 1, sizeof(*v));
    if (v != NULL) {
        for (int i = 0; i < rt->nsets && rt->sets != NULL; i++)
            if (rt->sets[i] != NULL)
                view_live(&v[n++], rt->sets[i]);
        for (size_t k = 0; k < fl->nnotes; k++)
            apply_note(v, &n, &fl->notes[k]);
    }
    pthread_mutex_unlock(&fl->mu);
    pthread_mutex_unlock(&rt->sets_mu);
    *count = n;
    return v;
}

static void free_views(set_view_t *v, size_t n)
{
    for (size_t i = 0; i < n && v != NULL; i++) {
        free(v[i].ranks);
        free(v[i].stragglers);
    }
    free(v);
}

static void put_set(FILE *f, const struct kolo__flight *fl, const set_view_t *v)
{
    fprintf(f, "{\"id\": %d, \"rank\": %d, \"size\": %d, \"ranks\": [", v->id,
            v->rank, v->size);
    for (int i = 0; i < v->size && v->ranks != NULL; i++)
        fprintf(f, "%s%d", i ? ", " : "", v->ranks[i]);
    fputs("], \"background\": {\"doing\": ", f);
    put_str(f, v->doing);
    fputs(", \"since\": ", f);
    put_time(f, fl, v->since);
    fprintf(f, "}, \"rounds\": %lld, \"enqueued\": %llu, \"completed\": %llu, "
            "\"stopped\": ", (long long)v->rounds,
            (unsigned long long)v->enqueued, (unsigned long long)v->completed);
    put_str(f, v->stopped ? v->why : NULL);
    fprintf(f, ", \"stragglers\": %s}", v->stragglers ? v->stragglers : "null");
}

static void write_sets(FILE *f, const struct kolo__flight *fl,
                       const set_view_t *v, size_t n)
{
    const char *global = NULL;

    fputs("\"sets\": [", f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",\n  " : "\n  ", f);
        put_set(f, fl, &v[i]);
        if (v[i].id == KOLO_GLOBAL_PROCESS_SET)
            global = v[i].stragglers;
    }
    fprintf(f, "],\n\"stragglers\": %s,\n", global ? global : "null");
}

/* What the stacks file gained since the last dump (its last STACKS_MAX
 * bytes at most), or NULL. */
static char *take_stacks(struct kolo__flight *fl)
{
    struct stat st;
    char *buf = NULL;

    pthread_mutex_lock(&fl->mu);
    if (fl->stacks_fd >= 0 && fstat(fl->stacks_fd, &st) == 0) {
        off_t from = fl->stacks_seen;
        size_t len;
        if (st.st_size - from > STACKS_MAX)
            from = st.st_size - STACKS_MAX;
        len = st.st_size > from ? (size_t)(st.st_size - from) : 0;
        if (len > 0 && (buf = kolo__malloc(len + 1)) != NULL) {
            ssize_t got = pread(fl->stacks_fd, buf, len, from);
            if (got >= 0)
                buf[got] = '\0';
            else {
                free(buf);
                buf = NULL;
            }
        }
        fl->stacks_seen = st.st_size;
    }
    pthread_mutex_unlock(&fl->mu);
    return buf;
}

static void write_head(FILE *f, struct kolo__flight *fl, const char *reason,
                       int64_t now)
{
    const kolo__runtime_t *rt = fl->rt;
    char host[256] = "";

    if (gethostname(host, sizeof(host) - 1) != 0)
        host[0] = '\0';
    fprintf(f, "{\"kolo_flight\": 1,\n\"rank\": %d, \"size\": %d, "
            "\"local_rank\": %lld, \"cross_rank\": %lld, \"host\": ", rt->rank,
            rt->size, (long long)rt->cfg.local_rank,
            (long long)rt->cfg.cross_rank);
    put_str(f, host);
    fprintf(f, ", \"pid\": %d, \"elastic_generation\": %u,\n\"reason\": ",
            (int)getpid(), rt->cfg.elastic ? rt->generation : 0);
    put_str(f, reason);
    fputs(", \"time\": ", f);
    put_time(f, fl, now);
    fputs(", \"clock_offset\": ", f);
    put_unix(f, fl->clock_offset_us);
    fprintf(f, ",\n\"records_kept\": %zu, \"records_total\": %llu,\n"
            "\"earlier_dumps\": [", fl->n,
            (unsigned long long)atomic_load(&fl->total));
    pthread_mutex_lock(&fl->mu);
    for (int i = 0; i < fl->nhistory; i++) {
        fputs(i ? ", {\"reason\": " : "{\"reason\": ", f);
        put_str(f, fl->history[i].reason);
        fputs(", \"time\": ", f);
        put_time(f, fl, fl->history[i].us);
        fputc('}', f);
    }
    pthread_mutex_unlock(&fl->mu);
    fputs("],\n", f);
}

static void write_json(FILE *f, struct kolo__flight *fl, const char *reason,
                       int64_t now)
{
    size_t nsets = 0;
    set_view_t *sets = gather_sets(fl, &nsets);
    char *stacks = take_stacks(fl);

    write_head(f, fl, reason, now);
    write_training(f, fl);
    write_sets(f, fl, sets, nsets);
    fputs("\"python_stacks\": ", f);
    put_str(f, stacks);
    fputs(",\n", f);
    write_records(f, fl);
    fputs("}\n", f);
    free_views(sets, nsets);
    free(stacks);
}

/* ---- writing a dump ------------------------------------------------------ */

/* mkdir -p, new directories mode 0700. */
static int make_dirs(const char *dir)
{
    char path[sizeof(((kolo__config_t *)0)->flight_dir)];

    snprintf(path, sizeof(path), "%s", dir);
    for (char *s = path + 1; *s != '\0'; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/* Said once; the rank writes no more dumps. */
static void give_up(struct kolo__flight *fl, const char *path, int e)
{
    atomic_store(&fl->broken, 1);
    kolo__log(KOLO__LOG_WARNING, "flight recorder: cannot write %s: %s; no "
              "dumps from this rank, the job goes on", path, strerror(e));
}

/* DIR/.rankR.json.PID.tmp, renamed DIR/rankR.json once whole. */
static void write_dump(struct kolo__flight *fl, const char *reason, int64_t now)
{
    const char *dir = fl->rt->cfg.flight_dir;
    char path[4200], tmp[4200];
    FILE *f;
    int e = 0;

    snprintf(path, sizeof(path), "%s/rank%d.json", dir, fl->rt->rank);
    snprintf(tmp, sizeof(tmp), "%s/.rank%d.json.%d.tmp", dir, fl->rt->rank,
             (int)getpid());
    if (make_dirs(dir) != 0 || (f = fopen(tmp, "we")) == NULL) {
        give_up(fl, path, errno);
        return;
    }
    setvbuf(f, NULL, _IOFBF, 1 << 16);
    write_json(f, fl, reason, now);
    if (ferror(f))
        e = errno ? errno : EIO;
    if (fclose(f) != 0 && e == 0)
        e = errno;
    if (e == 0 && rename(tmp, path) != 0)
        e = errno;
    if (e != 0) {
        unlink(tmp);
        give_up(fl, path, e);
    }
}

/* DIR/rankR.ready, holding this process's pid: kolorun sends SIGUSR1 only
 * to ranks that wrote it (a program without a handler dies of it), and
 * only to that pid (a rank may be a shell wrapper of this process).
 * Written whole, after the handler is in place; removed before it goes. */
static void ready_path(const struct kolo__flight *fl, char *path, size_t len)
{
    snprintf(path, len, "%s/rank%d.ready", fl->rt->cfg.flight_dir,
             fl->rt->rank);
}

static void announce_ready(struct kolo__flight *fl)
{
    const char *dir = fl->rt->cfg.flight_dir;
    char path[4200], tmp[4240];
    FILE *f;

    if (!fl->owns_signal || dir[0] == '\0')
        return;
    ready_path(fl, path, sizeof(path));
    snprintf(tmp, sizeof(tmp), "%s/.rank%d.ready.%d.tmp", dir, fl->rt->rank,
             (int)getpid());
    if (make_dirs(dir) != 0 || (f = fopen(tmp, "we")) == NULL) {
        give_up(fl, path, errno);
        return;
    }
    fprintf(f, "%d\n", (int)getpid());
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        give_up(fl, path, e);
        return;
    }
    fl->ready_written = 1;
}

/* Removed only while it still holds this pid: after an elastic re-form
 * another process may have written it under the same rank. */
static void withdraw_ready(struct kolo__flight *fl)
{
    char path[4200], text[32] = "";
    FILE *f;

    if (!fl->ready_written)
        return;
    fl->ready_written = 0;
    ready_path(fl, path, sizeof(path));
    if ((f = fopen(path, "re")) == NULL)
        return;
    if (fgets(text, sizeof(text), f) == NULL)
        text[0] = '\0';
    fclose(f);
    if (atol(text) == (long)getpid())
        unlink(path);
}

/* The Python stacks, written by faulthandler in its handler of the
 * binding's signal, raised here in the dump thread (see the essay). */
/* The stacks file's size, or -1. */
static off_t stacks_size(const struct kolo__flight *fl)
{
    struct stat st;

    return fl->stacks_fd >= 0 && fstat(fl->stacks_fd, &st) == 0 ? st.st_size
                                                                 : -1;
}

/* The signal goes to the thread that registered the stacks (the binding's:
 * Python's main thread), which it interrupts: faulthandler then reads that
 * thread's frames while it stands still (read from another thread while it
 * runs, they can be half-written: a crash). The dump waits for the file to
 * stop growing, STACKS_WAIT_MS at most; a thread that never takes the
 * signal leaves the dump without stacks. */
static void ask_stacks(struct kolo__flight *fl)
{
    int sig = atomic_load(&fl->stacks_sig);
    off_t before, prev, now;
    struct timespec tick = {0, 5 * 1000000L};

    if (sig <= 0 || !atomic_load(&fl->has_stacks) ||
        (before = stacks_size(fl)) < 0 ||
        pthread_kill(fl->stacks_thread, sig) != 0)
        return;
    prev = before;
    for (int waited = 0; waited < STACKS_WAIT_MS; waited += 5) {
        nanosleep(&tick, NULL);
        now = stacks_size(fl);
        if (now > before && now == prev)
            return;
        prev = now;
    }
}

/* A dump now, remembered as the last (requests of its kind coalesce with
 * it from now on) and, once written, among the earlier ones the next
 * dumps name. */
static void dump_now(struct kolo__flight *fl, const char *reason)
{
    int64_t now = kolo__now_us();
    earlier_t *h;

    if (atomic_load(&fl->broken))
        return;
    ask_stacks(fl);
    pthread_mutex_lock(&fl->mu);
    snprintf(fl->last, sizeof(fl->last), "%s", reason);
    fl->last_us = now;
    pthread_mutex_unlock(&fl->mu);
    write_dump(fl, reason, now);
    pthread_mutex_lock(&fl->mu);
    if (fl->nhistory == HISTORY)
        memmove(fl->history, fl->history + 1, (HISTORY - 1) * sizeof(*h));
    else
        fl->nhistory++;
    h = &fl->history[fl->nhistory - 1];
    copy_cut(h->reason, reason, sizeof(h->reason) - 4);
    h->us = now;
    pthread_mutex_unlock(&fl->mu);
}

/* Takes the pending request and writes its dump. */
static void write_pending(struct kolo__flight *fl)
{
    char reason[sizeof(fl->pending)];

    pthread_mutex_lock(&fl->mu);
    if (!fl->has_pending) {
        pthread_mutex_unlock(&fl->mu);
        return;
    }
    memcpy(reason, fl->pending, sizeof(reason));
    fl->has_pending = 0;
    pthread_mutex_unlock(&fl->mu);
    dump_now(fl, reason);
}

/* ---- the dump thread ----------------------------------------------------- */

/* Whether the bytes read hold a SIGUSR1 (kolo never raises it itself). */
static int from_outside(const char *buf, size_t n)
{
    return memchr(buf, 'S', n) != NULL;
}

static void *flight_main(void *arg)
{
    struct kolo__flight *fl = arg;
    char buf[64];
    int quit = 0, final;

    while (!quit) {
        ssize_t got = read(fl->pipe[0], buf, sizeof(buf));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        if (from_outside(buf, (size_t)got)) {
            /* Someone wants to see this job: this rank now, every rank at
             * the next round. */
            atomic_store(&fl->dump_all, 1);
            request(fl, "SIGUSR1");
        }
        write_pending(fl);
        pthread_mutex_lock(&fl->mu);
        quit = fl->quit;
        pthread_mutex_unlock(&fl->mu);
    }
    write_pending(fl);
    pthread_mutex_lock(&fl->mu);
    final = fl->final;
    pthread_mutex_unlock(&fl->mu);
    if (final)
        dump_now(fl, "shutdown");
    return NULL;
}

/* ---- open and close ------------------------------------------------------ */

/* unix - monotonic, microseconds, from the closest of three readings. */
static int64_t clock_offset(void)
{
    int64_t best = INT64_MAX, off = 0;

    for (int i = 0; i < 3; i++) {
        struct timespec real;
        int64_t a = kolo__now_us(), b;
        clock_gettime(CLOCK_REALTIME, &real);
        b = kolo__now_us();
        if (b - a < best) {
            best = b - a;
            off = (int64_t)real.tv_sec * 1000000 + real.tv_nsec / 1000 -
                  (a + b) / 2;
        }
    }
    return off;
}

static void flight_free(struct kolo__flight *fl)
{
    for (int i = 0; i < 2; i++)
        if (fl->pipe[i] >= 0)
            close(fl->pipe[i]);
    if (fl->stacks_fd >= 0)
        close(fl->stacks_fd);
    for (size_t i = 0; i < fl->nnotes; i++) {
        free(fl->notes[i].ranks);
        free(fl->notes[i].stragglers);
    }
    free(fl->notes);
    for (int i = 0; i < STRIPES && fl->enq_mu && fl->run_mu; i++) {
        pthread_mutex_destroy(&fl->enq_mu[i].mu);
        pthread_mutex_destroy(&fl->run_mu[i].mu);
    }
    pthread_mutex_destroy(&fl->mu);
    free(fl->enq);
    free(fl->run);
    free(fl->enq_mu);
    free(fl->run_mu);
    free(fl);
}

/* The pipe (its write end never blocks: a signal handler writes it) and
 * the thread, which takes no signals. */
static int start_thread(struct kolo__flight *fl, kolo__err_t *err)
{
    sigset_t all, saved;
    int rc;

    if (pipe2(fl->pipe, O_CLOEXEC) != 0) {
        fl->pipe[0] = fl->pipe[1] = -1;
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "rank %d: cannot create "
                             "the flight recorder's pipe: %s", fl->rt->rank,
                             strerror(errno));
    }
    fcntl(fl->pipe[1], F_SETFL, fcntl(fl->pipe[1], F_GETFL) | O_NONBLOCK);
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &saved);
    rc = kolo__thread_create(&fl->thread, NULL, flight_main, fl);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0)
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "rank %d: cannot start "
                             "the flight recorder's thread (KOLO_FLIGHT_RECORDER"
                             "=0 turns it off)", fl->rt->rank);
    return KOLO_OK;
}

/* The ring and its mutexes, on cache lines of their own; NULL for want
 * of memory. */
static struct kolo__flight *flight_new(size_t n)
{
    struct kolo__flight *fl = kolo__calloc(1, sizeof(*fl));

    if (fl == NULL)
        return NULL;
    fl->n = n;
    fl->enq = kolo__aligned_alloc(64, n * sizeof(rec_enq_t));
    fl->run = kolo__aligned_alloc(64, n * sizeof(rec_run_t));
    fl->enq_mu = kolo__aligned_alloc(64, STRIPES * sizeof(stripe_t));
    fl->run_mu = kolo__aligned_alloc(64, STRIPES * sizeof(stripe_t));
    fl->pipe[0] = fl->pipe[1] = fl->stacks_fd = -1;
    pthread_mutex_init(&fl->mu, NULL);
    for (int i = 0; i < STRIPES && fl->enq_mu && fl->run_mu; i++) {
        pthread_mutex_init(&fl->enq_mu[i].mu, NULL);
        pthread_mutex_init(&fl->run_mu[i].mu, NULL);
    }
    if (fl->enq == NULL || fl->run == NULL || fl->enq_mu == NULL ||
        fl->run_mu == NULL) {
        if (fl->enq_mu == NULL || fl->run_mu == NULL) { /* none to destroy */
            free(fl->enq_mu);
            free(fl->run_mu);
            fl->enq_mu = fl->run_mu = NULL;
        }
        flight_free(fl);
        return NULL;
    }
    memset(fl->enq, 0, n * sizeof(rec_enq_t));
    memset(fl->run, 0, n * sizeof(rec_run_t));
    return fl;
}

int kolo__flight_open(kolo__runtime_t *rt, kolo__err_t *err)
{
    size_t n = (size_t)rt->cfg.flight_recorder;
    struct kolo__flight *fl;

    if (n == 0)
        return KOLO_OK;
    if ((fl = flight_new(n)) == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "rank %d: out of memory "
                             "for the flight recorder's %zu records (%zu "
                             "bytes; KOLO_FLIGHT_RECORDER sets how many, 0 "
                             "none)", rt->rank, n,
                             n * (sizeof(rec_enq_t) + sizeof(rec_run_t)));
    fl->rt = rt;
    fl->clock_offset_us = clock_offset();
    if (start_thread(fl, err) != KOLO_OK) {
        flight_free(fl);
        return err->code;
    }
    if (rt->handles != NULL)
        atomic_store(&rt->handles->waits.outside_us, kolo__now_us());
    claim_signal(fl);
    announce_ready(fl);
    rt->flight = fl;
    return KOLO_OK;
}

void kolo__flight_close(kolo__runtime_t *rt)
{
    struct kolo__flight *fl = rt->flight;

    if (fl == NULL)
        return;
    pthread_mutex_lock(&fl->mu);
    fl->quit = 1;
    fl->final = rt->cfg.flight_dir[0] != '\0' && rt->nsets > 0;
    pthread_mutex_unlock(&fl->mu);
    poke(fl, 'Q');
    pthread_join(fl->thread, NULL);
    withdraw_ready(fl);
    release_signal(fl);
    rt->flight = NULL;
    flight_free(fl);
}

int kolo__flight_stacks(kolo__runtime_t *rt, int fd, int signum,
                        kolo__err_t *err)
{
    struct kolo__flight *fl = rt->flight;
    struct stat st;
    int mine = -1, old, mode;

    if (fl == NULL)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED, "kolo_flight_stacks: "
                             "the flight recorder is off "
                             "(KOLO_FLIGHT_RECORDER=0)");
    if (rt->cfg.flight_dir[0] == '\0' && fd >= 0)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED, "kolo_flight_stacks: "
                             "KOLO_FLIGHT_DIR is not set, so no dumps are "
                             "written");
    if (fd >= 0 && (signum <= 0 || signum == SIGUSR1 || signum >= 65))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "kolo_flight_stacks(%d, %d): the signal must be "
                             "one of the program's own, not SIGUSR1", fd,
                             signum);
    if (fd >= 0 && ((mode = fcntl(fd, F_GETFL)) < 0 ||
                    (mode & O_ACCMODE) == O_WRONLY))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "kolo_flight_stacks(%d): %s", fd, mode < 0
                             ? strerror(errno)
                             : "the file must be open for reading too (mode "
                               "\"a+\")");
    if (fd >= 0 && (mine = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
        return kolo__err_set(err, KOLO_ERR_INTERNAL, "kolo_flight_stacks(%d): "
                             "%s", fd, strerror(errno));
    pthread_mutex_lock(&fl->mu);
    old = fl->stacks_fd;
    fl->stacks_fd = mine;
    fl->stacks_seen = mine >= 0 && fstat(mine, &st) == 0 ? st.st_size : 0;
    fl->stacks_thread = pthread_self();
    atomic_store(&fl->stacks_sig, mine >= 0 ? signum : 0);
    atomic_store(&fl->has_stacks, mine >= 0);
    pthread_mutex_unlock(&fl->mu);
    if (old >= 0)
        close(old);
    return KOLO_OK;
}
