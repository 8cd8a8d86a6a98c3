/*
 * negotiate.c — how the ranks agree on what to reduce, one round per cycle.
 *
 * DESIGN
 *
 * Every rank's background thread runs the same sequence of collectives, in
 * lockstep; a round is:
 *
 *  1. The bit vector. Each rank builds a vector of 64-bit words and all
 *     ranks AND-reduce it (one small allreduce):
 *       word 0            flags, stored inverted: bit 0 clear = "I have
 *                         tensors the cache cannot settle"; bit 1 clear =
 *                         "I have tensors waiting for other ranks"
 *       shutdown words    bit r clear = "rank r asks to shut down"
 *       join words        bit r clear = "rank r has joined" (global set)
 *       hit words         bit b set = "I have enqueued the cached tensor b,
 *                         with its cached parameters"
 *       invalid words     bit b clear = "I enqueued the name of cached
 *                         tensor b with other parameters: forget b"
 *     Storing "or" flags inverted lets one AND serve both kinds. After the
 *     reduction a hit bit is set only if every rank has that tensor: those
 *     tensors are ready, in bit order, with no names exchanged. This is the
 *     whole cost of a steady training step.
 *
 *  2. The full round, only when some rank had uncached tensors. Every rank
 *     sends its uncached requests (name and parameters) to the coordinator,
 *     rank 0: an allgather of lengths, then a gather padded to the longest.
 *     The coordinator keeps a table of names and which ranks asked; a name
 *     that every rank has now asked for gets a response: OK, or an error
 *     naming the tensor and the values when the ranks disagree. The list of
 *     responses, in the order names completed, is broadcast to all ranks.
 *     Every rank adds the OK ones to its response cache in that order, so
 *     the caches stay identical.
 *
 * The plan of the cycle is the cache hits followed by the OK responses.
 * Because it is derived only from collective results, every rank gets the
 * same plan, whatever order its training loop enqueued in.
 *
 * In the code, kolo__negotiate is the round as a list of its steps:
 * sort_fresh (a cache hit waits on its bit, the rest go to the full round);
 * step 1 as bits_build, bits_reduce and bits_read; the plan's cache hits
 * (plan_hits) and the hits that cannot be ready, sent on to the full round
 * (unhit_invalid); then step 2, full_round, itself a list: requests_encode,
 * requests_track, requests_gather, coordinate (rank 0), responses_broadcast
 * and responses_apply. The round's collectives are those of bits_reduce,
 * requests_gather and responses_broadcast (and diverged's, after a fault):
 * a rank stuck in a round waits in one of them for a rank that has not come.
 *
 * Join. A rank that has joined (kolo_join) sets the hit bit of every
 * cached allreduce, and the coordinator counts it as having asked for
 * every name; when such a tensor is ready, the joined rank reduces a
 * zero-filled stand-in. Any other collective that becomes ready while a
 * rank is joined fails, with a message naming the joined rank. When every
 * rank has joined, the joins complete with the rank that joined last.
 *
 * Groups. The members of a group are enqueued together, so every rank
 * sends them in the same request list and the coordinator completes them in
 * the same pass; if one member fails, it fails the others with it. Grouped
 * tensors always take the full round (they are not cached), which keeps
 * the members of a group together in every plan.
 *
 * Stalls. A tensor that waits on a cache bit for half the stall time
 * invalidates the bit, so that it and its copies on the other ranks go
 * through the full round, where the coordinator sees which ranks have it;
 * a tensor sent to the coordinator and still unanswered after half the
 * stall time (30 s with the inspector off) is sent again, which costs the
 * coordinator nothing when it has it and heals its table when it lost it.
 * So the coordinator's table holds every tensor every rank has enqueued,
 * a tensor every rank holds is always scheduled, and the inspector names
 * as missing only what a rank has not enqueued.
 * The coordinator looks over its table every round: tensors some ranks
 * have enqueued and others not for KOLO_STALL_CHECK_TIME_SECONDS give one
 * warning (at most one per check time) naming each missing rank and what it
 * misses; after KOLO_STALL_SHUTDOWN_TIME_SECONDS it forces a full round
 * whose answer stops the job on every rank with the list of every tensor
 * some rank is then missing, each with how long it has waited.
 *
 * A cached name enqueued with different parameters invalidates its bit
 * everywhere; ranks that were waiting on that bit resend the tensor through
 * the full round, where the coordinator sees the disagreement and reports
 * it. Eviction (cache full) does the same for the evicted bit.
 *
 * What the round also carries (stall.c, straggler.c, flight.h). The vector
 * has two more words per 64 ranks: "blocked" (bit r clear: rank r's
 * training thread is blocked in kolo_wait with its queue empty) and "dump"
 * (bit r clear: rank r asks every rank for a flight-recorder dump), and a
 * flag, FLAG_NO_HITS (clear: some rank has tensors on cache bits). After
 * every round kolo__stall_observe reads them; while every rank is blocked
 * with nothing ready, each rank sends its tensors on cache bits to the
 * full round (bits_invalid), so that the coordinator can prove a deadlock
 * (stall.c's essay). Every 32 rounds that had a plan, the straggler
 * measure gathers every rank's waits on the coordinator: one more
 * collective of the round, at the same round on every rank (the plans are
 * the same everywhere).
 *
 * Carrying small tensors with the agreement. Where the data moves through
 * a network step of its own (a data backend not limited to one host:
 * Gloo, MPI, hierarchical; not shared memory, whose step costs a few
 * microseconds), a steady round of small tensors would cost two network
 * steps: the bit vector, then the data. Instead the data rides with the
 * bits. Every cached host allreduce that is small enough (in bit order,
 * until CARRY_MAX_BYTES / (ranks - 1)), uncompressed and not prescaled,
 * has a slot in a carried area at an offset that every rank computes alike
 * from its cache (the caches are identical). Each rank writes the input of every tensor
 * it has on a hit bit into that bit's slot, sets the bit in a second
 * vector (carry bits: "my slot b holds my tensor"), and the ranks
 * allgather [bits | carry bits | area] instead of AND-reducing the bits.
 * Whether a round carries depends on the cache alone, so every rank takes
 * the same path. Each rank then ANDs every rank's bits itself, and for
 * every tensor that is ready and carried by all (a joined rank carries
 * nothing: its zeros go the usual way) reduces the slots x0 (op) x1 (op)
 * ... in rank order, as the backends' one-step exchange does. execute.c
 * takes such a batch's result from there (averaging and postscale as
 * usual) instead of moving it again. A batch that mixes carried and other
 * tensors moves as before: what was carried is dropped, every rank alike.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "complete.h"
#include "negotiate.h"
#include "reduce.h"
#include "flight.h"
#include "runtime.h"
#include "stall.h"
#include "straggler.h"
#include "timeline.h"

#define FLAG_NO_UNCACHED 1ULL
#define FLAG_NONE_PENDING 2ULL
#define FLAG_NO_HITS 4ULL

#define BIT_GET(words, b) (((words)[(b) / 64] >> ((b) % 64)) & 1ULL)
#define BIT_SET(words, b) ((words)[(b) / 64] |= 1ULL << ((b) % 64))
#define BIT_CLR(words, b) ((words)[(b) / 64] &= ~(1ULL << ((b) % 64)))

/* The most bytes carried in a round, times the number of peers: each rank
 * sends its message to every other, and that stays well within what the
 * backends move in one step (Gloo's exchange: 64 KiB in all per rank, the
 * bits included, up to about 100 ranks): 16 KiB with two ranks, 8 KiB
 * with three, 2 KiB with nine. */
#define CARRY_MAX_BYTES ((size_t)16 * 1024)

static int bytes_reserve(kolo__bytes_t *b, size_t n)
{
    if (b->cap < n) {
        uint8_t *nd = kolo__realloc(b->data, n);
        if (nd == NULL)
            return -1;
        b->data = nd;
        b->cap = n;
    }
    return 0;
}

#ifdef KOLO_HAVE_MEM
void (*kolo__negotiate_test_hook)(kolo__pset_t *ps);
#endif

static void band64(void *out, const void *a, const void *b, size_t n)
{
    uint64_t *o = out;
    const uint64_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        o[i] = x[i] & y[i];
}

int kolo__negotiate_init(kolo__pset_t *ps)
{
    size_t cap = (size_t)ps->rt->cfg.cache_capacity;
    size_t rank_words = ((size_t)ps->size + 63) / 64;

    if (kolo__cache_init(&ps->neg.cache, cap) != 0 || kolo__stall_init(ps) != 0 ||
        kolo__straggler_new(ps) != 0)
        return -1;
    ps->neg.hits = kolo__calloc(cap ? cap : 1, sizeof(*ps->neg.hits));
    ps->neg.joined = kolo__calloc((size_t)ps->size, 1);
    ps->neg.hit_words = (cap + 63) / 64;
    ps->neg.shut_word = 1;
    ps->neg.join_word = ps->neg.shut_word + rank_words;
    ps->neg.blocked_word = ps->neg.join_word + rank_words;
    ps->neg.dump_word = ps->neg.blocked_word + rank_words;
    ps->neg.hit_word = ps->neg.dump_word + rank_words;
    ps->neg.inv_word = ps->neg.hit_word + ps->neg.hit_words;
    ps->neg.check_word = ps->neg.inv_word + ps->neg.hit_words;
    ps->neg.nwords = ps->neg.check_word + 2;
    ps->neg.bits = kolo__calloc(ps->neg.nwords, sizeof(uint64_t));
    ps->neg.carry_off = kolo__calloc(cap ? cap : 1, sizeof(size_t));
    ps->neg.carry_bits = kolo__calloc(ps->neg.hit_words ? ps->neg.hit_words : 1,
                                sizeof(uint64_t));
    ps->neg.lost = kolo__calloc(ps->neg.hit_words ? ps->neg.hit_words : 1,
                                sizeof(uint64_t));
    kolo__map_init(&ps->neg.sent);
    kolo__map_init(&ps->neg.table);
    if (ps->neg.hits == NULL || ps->neg.bits == NULL || ps->neg.joined == NULL ||
        ps->neg.carry_off == NULL || ps->neg.carry_bits == NULL ||
        ps->neg.lost == NULL)
        return -1;
    /* What a round needs after its first collective is had now, so that a
     * rank cannot fail half-way through a steady round (see the essay):
     * the plan's room for every cached tensor, and the carried area. */
    ps->ready = kolo__malloc((cap + 1) * sizeof(*ps->ready));
    if (ps->ready == NULL)
        return -1;
    ps->ready_cap = cap + 1;
    if (ps->size > 1 && cap > 0) {
        size_t msg = (ps->neg.nwords + ps->neg.hit_words) * sizeof(uint64_t) +
                     CARRY_MAX_BYTES / (size_t)(ps->size - 1);
        if (bytes_reserve(&ps->neg.carry_msg, msg) != 0 ||
            bytes_reserve(&ps->neg.carry_all, msg * (size_t)ps->size) != 0 ||
            bytes_reserve(&ps->neg.carry_out, CARRY_MAX_BYTES) != 0)
            return -1;
    }
    return 0;
}

/* Timeline: rank r's request for p reached the coordinator (its instant,
 * once). A timeline started after the request came (kolo_start_timeline
 * on rank 0 while the others already asked) gets it when this rank's own
 * request begins the negotiation on it. */
static void tl_asked(kolo__pset_t *ps, kolo__pending_name_t *p, int r)
{
    char who[16];

    if (p->have[r] != 1 || !kolo__timeline_active(ps->rt->timeline))
        return;
    p->have[r] = 2;
    snprintf(who, sizeof(who), "%d", r);
    kolo__tl_instant(ps->rt->timeline, p->name, who, p->at_us[r]);
}

static void pending_name_free(kolo__pending_name_t *p)
{
    if (p != NULL) {
        free(p->name);
        free(p->params);
        free(p->have);
        free(p->at_us);
        free(p->seq);
        free(p->ready_us);
        free(p);
    }
}

void kolo__negotiate_free(kolo__pset_t *ps)
{
    size_t it = 0;
    void *v;

    while (kolo__map_next(&ps->neg.table, &it, NULL, &v))
        pending_name_free(v);
    kolo__map_free(&ps->neg.table);
    kolo__map_free(&ps->neg.sent);
    kolo__cache_free(&ps->neg.cache);
    kolo__stall_free(ps);
    kolo__straggler_free(ps->neg.straggler);
    ps->neg.straggler = NULL;
    free(ps->neg.hits);
    free(ps->neg.bits);
    free(ps->neg.joined);
    free(ps->ready);
    kolo__bytes_free(&ps->neg.send_buf);
    kolo__bytes_free(&ps->neg.recv_buf);
    kolo__bytes_free(&ps->neg.resp_buf);
    kolo__bytes_free(&ps->neg.carry_msg);
    kolo__bytes_free(&ps->neg.carry_all);
    kolo__bytes_free(&ps->neg.carry_out);
    free(ps->neg.carry_off);
    free(ps->neg.carry_bits);
    free(ps->neg.lost);
    ps->neg.lost = NULL;
    ps->neg.carry_off = NULL;
    ps->neg.carry_bits = NULL;
    ps->neg.hits = NULL;
    ps->neg.bits = NULL;
    ps->ready = NULL;
}

int kolo__negotiate_pending(const kolo__pset_t *ps)
{
    return ps->neg.nhits > 0 || ps->neg.uncached_head != NULL || ps->neg.sent.count > 0 ||
           ps->neg.join_entry != NULL;
}

void kolo__negotiate_drain(kolo__pset_t *ps,
                           void (*fn)(kolo__pset_t *, kolo__entry_t *,
                                      const kolo__err_t *),
                           const kolo__err_t *why)
{
    size_t it = 0;
    void *v;
    kolo__entry_t *e;

    for (size_t b = 0; b < ps->neg.cache.capacity; b++)
        if (ps->neg.hits[b] != NULL) {
            fn(ps, ps->neg.hits[b], why);
            ps->neg.hits[b] = NULL;
        }
    ps->neg.nhits = 0;
    e = ps->neg.uncached_head;
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        fn(ps, e, why);
        e = next;
    }
    ps->neg.uncached_head = ps->neg.uncached_tail = NULL;
    while (kolo__map_next(&ps->neg.sent, &it, NULL, &v))
        fn(ps, v, why);
    kolo__map_free(&ps->neg.sent);
    if (ps->neg.join_entry != NULL) {
        fn(ps, ps->neg.join_entry, why);
        ps->neg.join_entry = NULL;
    }
}

/* A zero-filled tensor that stands in for an allreduce this rank does not
 * have because it has joined, in *out. It has no handle. */
static int standin(kolo__pset_t *ps, const char *name, const kolo__params_t *p,
                   kolo__entry_t **out, kolo__err_t *err)
{
    kolo__entry_t *e = kolo__entry_new(name);
    size_t bytes = (size_t)p->count * kolo_dtype_size((kolo_dtype_t)p->dtype);

    if (e != NULL && (e->scratch = kolo__calloc(bytes ? bytes : 1, 1)) == NULL) {
        kolo__entry_free(e);
        e = NULL;
    }
    if (e == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "rank %d: out of memory for the zeros of tensor "
                             "'%s' during a join",
                             ps->rank, name);
    e->params = *p;
    e->input = e->output = e->scratch;
    e->device = -1; /* a CUDA allreduce's stand-in: the GPU path zeros its
                       share of the fusion buffer instead */
    *out = e;
    return KOLO_OK;
}

static void uncached_append(kolo__pset_t *ps, kolo__entry_t *e)
{
    e->next = NULL;
    if (ps->neg.uncached_tail != NULL)
        ps->neg.uncached_tail->next = e;
    else
        ps->neg.uncached_head = e;
    ps->neg.uncached_tail = e;
}

/* Timeline: the tensor is negotiated; its operation starts, queued. */
static void tl_ready(kolo__pset_t *ps, kolo__entry_t *e)
{
    kolo__timeline_t *tl = ps->rt->timeline;
    char args[256];
    size_t n;

    if (!kolo__timeline_active(tl))
        return;
    kolo__tl_entry_end(ps, e); /* the negotiation */
    n = (size_t)snprintf(args, sizeof(args), "\"dtype\":\"%s\",\"shape\":[",
                         kolo_dtype_name((kolo_dtype_t)e->params.dtype));
    if (e->params.ndim == 0)
        n += (size_t)snprintf(args + n, sizeof(args) - n, "%lld",
                              (long long)e->params.count);
    for (int i = 0; i < e->params.ndim && n < sizeof(args); i++)
        n += (size_t)snprintf(args + n, sizeof(args) - n, i ? ",%lld" : "%lld",
                              (long long)(i == 0 && e->rows ? e->rows
                                                            : e->params.shape[i]));
    if (n < sizeof(args))
        snprintf(args + n, sizeof(args) - n, "]");
    kolo__tl_entry_begin(ps, e, kolo__coll_phase(e->params.coll), args, 0);
    kolo__tl_entry_begin(ps, e, "QUEUE", NULL, 0);
}

static int ready_push(kolo__pset_t *ps, kolo__entry_t *e, kolo__err_t *err)
{
    tl_ready(ps, e);
    if (ps->nready == ps->ready_cap) {
        size_t ncap = ps->ready_cap ? ps->ready_cap * 2 : 64;
        kolo__entry_t **nr = kolo__realloc(ps->ready, ncap * sizeof(*nr));
        if (nr == NULL)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory planning %zu tensors",
                                 ps->nready + 1);
        ps->ready = nr;
        ps->ready_cap = ncap;
    }
    ps->ready[ps->nready++] = e;
    return KOLO_OK;
}

/* ready_push for an entry that no list holds any more (taken off `sent`,
 * or a joined rank's stand-in): if it cannot be pushed, it fails here,
 * since stopping the set fails only the entries its lists hold. */
static int ready_or_fail(kolo__pset_t *ps, kolo__entry_t *e, kolo__err_t *err)
{
    int rc = ready_push(ps, e, err);

    if (rc != KOLO_OK)
        kolo__fail_entry(ps, e, err);
    return rc;
}

/* Takes a waiting entry off a cache bit and sends it through the full round
 * next cycle. */
static void unhit(kolo__pset_t *ps, size_t bit)
{
    if (ps->neg.hits[bit] != NULL) {
        uncached_append(ps, ps->neg.hits[bit]);
        ps->neg.hits[bit] = NULL;
        ps->neg.nhits--;
    }
}

/* Completes this rank's join: every rank has joined; last_joined is the
 * rank that joined last (the highest of those that joined in the same
 * round). */
static int finish_join(kolo__pset_t *ps, int last_joined, kolo__err_t *err)
{
    kolo__entry_t *e = ps->neg.join_entry;
    kolo__result_t *res = kolo__calloc(1, sizeof(*res));

    if (res == NULL || (res->splits = kolo__malloc(sizeof(int64_t))) == NULL) {
        free(res);
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "rank %d: out of memory completing a join",
                             ps->rank);
    }
    res->nsplits = 1;
    res->splits[0] = last_joined;
    e->result = res;
    ps->neg.join_entry = NULL;
    kolo__complete(ps, e, KOLO_OK, NULL);
    return KOLO_OK;
}

/* ---- the coordinator ---------------------------------------------------- */

static void shape_text(const kolo__params_t *p, char *out, size_t len)
{
    size_t n = 0;
    n += (size_t)snprintf(out + n, len - n, "[");
    for (int i = 0; i < p->ndim && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, i ? ", %lld" : "%lld",
                              (p->coll == KOLO__COLL_ALLGATHER ||
                               p->coll == KOLO__COLL_ALLTOALL) && i == 0 &&
                                      p->shape[0] == 0
                                  ? -1LL : (long long)p->shape[i]);
    if (n < len)
        snprintf(out + n, len - n, "]");
    if (p->coll == KOLO__COLL_ALLGATHER || p->coll == KOLO__COLL_ALLTOALL) {
        char *d = strstr(out, "-1");
        if (d != NULL) /* the first dimension may differ: show it as N */
            memmove(d + 1, d + 2, strlen(d + 2) + 1), d[0] = 'N';
    }
}

/* The parameters two ranks may disagree on, after the collective, in the
 * order a disagreement is reported (the group: whatever is left). */
enum {
    MM_DTYPE, MM_SHAPE, MM_COUNT, MM_OP, MM_ROOT, MM_PRESCALE, MM_POSTSCALE,
    MM_PLACE, MM_WIRE, MM_GROUP
};

/* How each reads in "ranks disagree on <what>: rank A <verb_a><A's value>,
 * rank B <verb_b><B's value>". */
static const struct {
    const char *what, *verb_a, *verb_b;
} mismatch_words[] = {
    [MM_DTYPE] = {"the dtype", "has ", "has "},
    [MM_SHAPE] = {"the shape", "has ", "has "},
    [MM_COUNT] = {"the number of elements", "has ", "has "},
    [MM_OP] = {"the reduction", "asks for ", "for "},
    [MM_ROOT] = {"the root", "names rank ", "names rank "},
    [MM_PRESCALE] = {"the prescale factor", "has ", "has "},
    [MM_POSTSCALE] = {"the postscale factor", "has ", "has "},
    [MM_PLACE] = {"where it lives", "has it in ", "in "},
    [MM_WIRE] = {"the wire compression", "sends ", "sends "},
    [MM_GROUP] = {"its group", "has it in ", "in "},
};

/* Whether a and b differ in the parameter f (in the group: always, it
 * being what is left when all else agrees). */
static int mismatch_in(int f, const kolo__params_t *a, const kolo__params_t *b)
{
    switch (f) {
    case MM_DTYPE: return a->dtype != b->dtype;
    case MM_SHAPE:
        return a->ndim != b->ndim ||
               memcmp(a->shape, b->shape, sizeof(int64_t) * a->ndim) != 0;
    case MM_COUNT: return a->count != b->count;
    case MM_OP: return a->op != b->op;
    case MM_ROOT: return a->root != b->root;
    case MM_PRESCALE:
        return memcmp(&a->prescale, &b->prescale, sizeof(double)) != 0;
    case MM_POSTSCALE:
        return memcmp(&a->postscale, &b->postscale, sizeof(double)) != 0;
    case MM_PLACE: return a->device_type != b->device_type;
    case MM_WIRE: return a->wire != b->wire;
    default: return 1;
    }
}

/* p's value of the parameter f, as a mismatch shows it. */
static void mismatch_value(int f, const kolo__params_t *p, char *out,
                           size_t len)
{
    switch (f) {
    case MM_DTYPE:
        snprintf(out, len, "%s", kolo_dtype_name((kolo_dtype_t)p->dtype));
        break;
    case MM_SHAPE: shape_text(p, out, len); break;
    case MM_COUNT: snprintf(out, len, "%lld", (long long)p->count); break;
    case MM_OP: snprintf(out, len, "%s", kolo_op_name((kolo_op_t)p->op)); break;
    case MM_ROOT: snprintf(out, len, "%d", (int)p->root); break;
    case MM_PRESCALE: snprintf(out, len, "%.17g", p->prescale); break;
    case MM_POSTSCALE: snprintf(out, len, "%.17g", p->postscale); break;
    case MM_PLACE:
        snprintf(out, len, "%s memory",
                 p->device_type == KOLO_DEVICE_CUDA ? "CUDA device" : "host");
        break;
    case MM_WIRE:
        snprintf(out, len, "%s", kolo_dtype_name((kolo_dtype_t)p->wire));
        break;
    default:
        snprintf(out, len, "a group of %d led by '%s'", p->group, p->group_key);
    }
}

/* Writes why two ranks' requests for one name disagree: the first
 * parameter that differs, with each rank's value. */
static void describe_mismatch(const char *name, int ra, const kolo__params_t *a,
                              int rb, const kolo__params_t *b, char *out,
                              size_t len)
{
    int gathered = a->coll == KOLO__COLL_ALLGATHER ||
                   a->coll == KOLO__COLL_ALLTOALL;
    char va[200], vb[200];
    int f = MM_DTYPE;

    if (a->coll != b->coll) {
        snprintf(out, len,
                 "tensor '%s': ranks disagree on the collective: rank %d "
                 "enqueued %s, rank %d enqueued %s",
                 name, ra, kolo__coll_name(a->coll), rb,
                 kolo__coll_name(b->coll));
        return;
    }
    while (f < MM_GROUP && !mismatch_in(f, a, b))
        f++;
    mismatch_value(f, a, va, sizeof(va));
    mismatch_value(f, b, vb, sizeof(vb));
    snprintf(out, len,
             "%s of tensor '%s': ranks disagree on %s%s: rank %d %s%s, rank %d "
             "%s%s",
             kolo__coll_name(a->coll), name, mismatch_words[f].what,
             f == MM_SHAPE && gathered && a->shape[0] == 0
                 ? " (beyond the first dimension)" : "",
             ra, mismatch_words[f].verb_a, va, rb, mismatch_words[f].verb_b,
             vb);
}

typedef struct resp_list {
    kolo__response_t *items;
    uint32_t n, cap;
} resp_list_t;

/* Appends the response for a name that every rank has asked for (or has
 * joined): OK with the agreed parameters, or an error that says why. */
static int resp_push(kolo__pset_t *ps, resp_list_t *l, kolo__pending_name_t *p)
{
    kolo__response_t *r;
    char text[KOLO__MSG_MAX_TEXT];
    int base = -1, joined_rank = -1;

    if (l->n == l->cap) {
        uint32_t ncap = l->cap ? l->cap * 2 : 32;
        kolo__response_t *ni = kolo__realloc(l->items, ncap * sizeof(*ni));
        if (ni == NULL)
            return -1;
        l->items = ni;
        l->cap = ncap;
    }
    for (int rk = 0; rk < ps->size; rk++) {
        if (p->have[rk] && base < 0)
            base = rk;
        if (!p->have[rk] && joined_rank < 0)
            joined_rank = rk;
    }
    r = &l->items[l->n];
    memset(r, 0, sizeof(*r));
    r->name = p->name;
    p->name = NULL;
    r->params = p->params[base];
    r->status = KOLO_OK;
    if (joined_rank >= 0 && r->params.coll != KOLO__COLL_ALLREDUCE) {
        snprintf(text, sizeof(text),
                 "%s of tensor '%s' cannot run while rank %d has joined "
                 "(kolo_join): only allreduce goes on during a join",
                 kolo__coll_name(r->params.coll), r->name,
                 ps->ranks[joined_rank]);
        r->status = KOLO_ERR_UNSUPPORTED;
        r->text = kolo__strdup(text);
    }
    for (int rk = base + 1; rk < ps->size && r->status == KOLO_OK; rk++) {
        if (p->have[rk] && !kolo__params_equal(&p->params[base], &p->params[rk])) {
            describe_mismatch(r->name, ps->ranks[base], &p->params[base],
                              ps->ranks[rk], &p->params[rk], text, sizeof(text));
            r->status = KOLO_ERR_MISMATCH;
            r->text = kolo__strdup(text);
        }
    }
    l->n++;
    return 0;
}

/* The members of a group complete in the same pass; if one failed, the
 * others fail with it. */
static void fail_groups_together(resp_list_t *l)
{
    for (uint32_t i = 0; i < l->n; i++) {
        kolo__response_t *bad = &l->items[i];
        if (bad->status == KOLO_OK || bad->params.group <= 1)
            continue;
        for (uint32_t j = 0; j < l->n; j++) {
            kolo__response_t *r = &l->items[j];
            char text[KOLO__MSG_MAX_TEXT];
            if (r->status != KOLO_OK || r->params.group <= 1 ||
                strcmp(r->params.group_key, bad->params.group_key) != 0)
                continue;
            snprintf(text, sizeof(text),
                     "%s of tensor '%s' failed with its group: %s",
                     kolo__coll_name(r->params.coll), r->name,
                     bad->text ? bad->text : "");
            r->status = bad->status;
            r->text = kolo__strdup(text);
        }
    }
}

/* A name is complete when every rank has asked for it or has joined
 * (unless the name is one that joined ranks enqueue too: params.own). */
static int complete(const kolo__pset_t *ps, const kolo__pending_name_t *p)
{
    int own = 0;

    for (int r = 0; r < ps->size; r++)
        if (p->have[r]) {
            own = p->params[r].own;
            break;
        }
    for (int r = 0; r < ps->size; r++)
        if (!p->have[r] && (own || !ps->neg.joined[r]))
            return 0;
    return p->nhave > 0;
}

static void resp_list_free(resp_list_t *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        free(l->items[i].name), free(l->items[i].text);
    free(l->items);
}

/* Answers a name that is complete: takes it off the table and appends its
 * response. */
static int answer(kolo__pset_t *ps, resp_list_t *out, kolo__pending_name_t *p,
                  kolo__err_t *err)
{
    const kolo__entry_t *mine = kolo__map_gets(&ps->neg.sent, p->name);
    int failed;

    if (mine != NULL) /* the flight recorder: when each member asked */
        kolo__flight_asked(ps, mine, p->ready_us);
    kolo__map_dels(&ps->neg.table, p->name);
    failed = resp_push(ps, out, p) != 0;
    pending_name_free(p);
    return failed ? kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                  "out of memory in the coordinator")
                  : KOLO_OK;
}

/* The table's entry for a name no rank had asked for; it takes q's name. */
static kolo__pending_name_t *pending_name_new(kolo__pset_t *ps,
                                              kolo__request_t *q)
{
    kolo__pending_name_t *p = kolo__calloc(1, sizeof(*p));

    if (p == NULL ||
        (p->params = kolo__calloc((size_t)ps->size, sizeof(*p->params))) == NULL ||
        (p->have = kolo__calloc((size_t)ps->size, 1)) == NULL ||
        (p->at_us = kolo__calloc((size_t)ps->size, sizeof(*p->at_us))) == NULL ||
        (p->seq = kolo__calloc((size_t)ps->size, sizeof(*p->seq))) == NULL ||
        (p->ready_us = kolo__calloc((size_t)ps->size, sizeof(int64_t))) == NULL ||
        kolo__map_puts(&ps->neg.table, q->name, p) != 0) {
        pending_name_free(p);
        return NULL;
    }
    p->name = q->name;
    q->name = NULL;
    p->first_us = p->waited_from_us = kolo__now_us();
    return p;
}

/* Rank r asks for q: the table notes who asked, and with which parameters;
 * a name every rank has now asked for is answered. */
static int table_ask(kolo__pset_t *ps, resp_list_t *out, int r,
                     kolo__request_t *q, kolo__err_t *err)
{
    kolo__pending_name_t *p = kolo__map_gets(&ps->neg.table, q->name);

    if (p == NULL && (p = pending_name_new(ps, q)) == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory in the coordinator");
    if (!p->have[r]) {
        p->have[r] = 1;
        p->nhave++;
        /* The first request's instant is the negotiation's start, to the
         * microsecond. */
        p->at_us[r] = p->nhave == 1 ? p->first_us : kolo__now_us();
        if (r != ps->rank)
            tl_asked(ps, p, r);
    }
    /* Waits count from the enqueue (the essay of stall.c). */
    if (p->ready_us[r] == 0)
        p->ready_us[r] = kolo__now_us() - (q->age_us > 0 ? q->age_us : 0);
    if (p->ready_us[r] < p->waited_from_us)
        p->waited_from_us = p->ready_us[r];
    p->seq[r] = q->seq;
    p->params[r] = q->params;
    return complete(ps, p) ? answer(ps, out, p, err) : KOLO_OK;
}

/* A rank that joined completes the names that only it was missing. */
static int answer_joined(kolo__pset_t *ps, resp_list_t *out, kolo__err_t *err)
{
    size_t it = 0;
    void *v;

    while (kolo__map_next(&ps->neg.table, &it, NULL, &v))
        if (complete(ps, v))
            KOLO__CHECK(answer(ps, out, v, err));
    return KOLO_OK;
}

/* Decodes rank r's request list into msg; 0, with why in derr, where it
 * is malformed or not rank r's request list. */
static int requests_decode(int r, const uint8_t *data, uint64_t len,
                           kolo__msg_t *msg, kolo__err_t *derr)
{
    kolo__err_clear(derr);
    if (kolo__msg_decode(data, len, r, msg, derr) == KOLO_OK &&
        msg->kind == KOLO__MSG_REQUESTS && msg->rank == r)
        return 1;
    if (derr->code == KOLO_OK) /* decoded, but not a request list */
        snprintf(derr->msg, sizeof(derr->msg),
                 "negotiation message from rank %d has kind %d and claims "
                 "rank %d",
                 r, msg->kind, msg->rank);
    kolo__msg_free(msg);
    return 0;
}

/* Encodes into neg.resp_buf the answer that stops the job on every rank:
 * a response list whose rank field is -1, its one response the error. */
static int answer_stop(kolo__pset_t *ps, int status, char *text,
                       kolo__err_t *err)
{
    kolo__response_t fatal;
    kolo__msg_t m = {KOLO__MSG_RESPONSES, -1, 1, {.responses = &fatal}};

    memset(&fatal, 0, sizeof(fatal));
    fatal.name = (char *)"*";
    fatal.status = status;
    fatal.text = text;
    return kolo__msg_encode(&m, &ps->neg.resp_buf, err);
}

/* Rank 0: reads every rank's requests (rank r's are at recv + r * stride,
 * lens[r] bytes), updates the table and encodes the responses into
 * ps->neg.resp_buf; a malformed message, or the stall inspector's verdict,
 * stops every rank instead (answer_stop). */
static int coordinate(kolo__pset_t *ps, const uint8_t *recv, size_t stride,
                      const uint64_t *lens, kolo__err_t *err)
{
    resp_list_t out = {NULL, 0, 0};
    kolo__msg_t msg;
    kolo__err_t derr;
    int rc = KOLO_OK;

    if (ps->neg.stall_fatal.code != KOLO_OK)
        return answer_stop(ps, ps->neg.stall_fatal.code,
                           ps->neg.stall_fatal.msg, err);
    for (int r = 0; r < ps->size && rc == KOLO_OK; r++) {
        if (!requests_decode(r, recv + (size_t)r * stride, lens[r], &msg,
                             &derr)) {
            resp_list_free(&out);
            if (derr.code == KOLO_ERR_NO_MEMORY) /* the coordinator's own */
                return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                     "rank %d (the coordinator): %s",
                                     ps->ranks[0], derr.msg);
            kolo__log(KOLO__LOG_ERROR, "%s", derr.msg);
            return answer_stop(ps, KOLO_ERR_INTERNAL, derr.msg, err);
        }
        for (uint32_t i = 0; i < msg.n && rc == KOLO_OK; i++)
            rc = table_ask(ps, &out, r, &msg.u.requests[i], err);
        kolo__msg_free(&msg);
    }
    if (rc == KOLO_OK && ps->neg.njoined > 0)
        rc = answer_joined(ps, &out, err);
    if (rc == KOLO_OK) {
        fail_groups_together(&out);
        kolo__msg_t m = {KOLO__MSG_RESPONSES, 0, out.n, {.responses = out.items}};
        rc = kolo__msg_encode(&m, &ps->neg.resp_buf, err);
    }
    resp_list_free(&out);
    return rc;
}

/* ---- one round ------------------------------------------------------------ */

/* How long a tensor sent to the coordinator waits unanswered before it is
 * sent again: half the stall time, or 30 s with the inspector off (the
 * essay's "Stalls"). */
static int64_t reask_us(const kolo__pset_t *ps)
{
    int64_t half = kolo__stall_half_us(ps);
    return half > 0 ? half : 30 * 1000000LL;
}

/* Whether some tensor this rank sent is due to be sent again. */
static int reask_due(const kolo__pset_t *ps, int64_t now)
{
    int64_t half = reask_us(ps);
    size_t it = 0;
    void *v;

    if (ps->neg.sent.count == 0)
        return 0;
    while (kolo__map_next(&ps->neg.sent, &it, NULL, &v))
        if (now - ((const kolo__entry_t *)v)->asked_us >= half)
            return 1;
    return 0;
}

static int backend_failed(kolo__pset_t *ps, int rc, const char *what,
                          char *detail, kolo__err_t *err)
{
    return kolo__fail_backend(ps, rc, detail, err, "negotiation (%s)", what);
}

/* What the steps of one full round share. */
typedef struct full_round {
    kolo__request_t *reqs; /* this rank's requests (names borrowed) */
    uint64_t *lens;        /* every rank's request list's length */
    uint64_t maxlen;       /* the longest: the gather's stride */
    uint64_t resplen;      /* the coordinator's answer's length */
} full_round_t;

/* Encodes this rank's request list into neg.send_buf: its uncached
 * tensors, and those sent long ago and still unanswered (sent again: the
 * essay's "Stalls"). */
/* The request for e (its name borrowed). */
static kolo__request_t request_of(const kolo__entry_t *e, int64_t now)
{
    return (kolo__request_t){e->name, e->params, now - e->enqueued_us, e->seq};
}

static int requests_encode(kolo__pset_t *ps, full_round_t *fr, kolo__err_t *err)
{
    int64_t now = kolo__now_us(), again = reask_us(ps);
    uint32_t n = 0, nnew;
    size_t it = 0;
    void *v;

    for (kolo__entry_t *e = ps->neg.uncached_head; e != NULL; e = e->next)
        n++;
    nnew = n;
    n += (uint32_t)ps->neg.sent.count;
    fr->reqs = kolo__calloc(n ? n : 1, sizeof(*fr->reqs));
    fr->lens = kolo__calloc((size_t)ps->size, sizeof(*fr->lens));
    if (fr->reqs == NULL || fr->lens == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory sending %u requests", nnew);
    n = 0;
    for (kolo__entry_t *e = ps->neg.uncached_head; e != NULL; e = e->next) {
        e->asked_us = now;
        fr->reqs[n++] = request_of(e, now);
    }
    while (kolo__map_next(&ps->neg.sent, &it, NULL, &v)) {
        kolo__entry_t *e = v;
        if (now - e->asked_us < again)
            continue;
        e->asked_us = now;
        fr->reqs[n++] = request_of(e, now);
    }
    kolo__msg_t m = {KOLO__MSG_REQUESTS, ps->rank, n, {.requests = fr->reqs}};
    return kolo__msg_encode(&m, &ps->neg.send_buf, err);
}

/* The new requests wait for their answer in `sent`. */
static int requests_track(kolo__pset_t *ps, kolo__err_t *err)
{
    for (kolo__entry_t *e = ps->neg.uncached_head, *next; e != NULL; e = next) {
        next = e->next;
        /* Unlinked only once it is in `sent`: where it fails, it and the
         * rest stay on the list, and fail with the set. */
        if (kolo__map_puts(&ps->neg.sent, e->name, e) != 0)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory tracking tensor '%s'", e->name);
        e->next = NULL;
        ps->neg.uncached_head = next;
    }
    ps->neg.uncached_tail = NULL;
    return KOLO_OK;
}

/* Every rank's request list to the coordinator: an allgather of their
 * lengths, then a gather padded to the longest. */
static int requests_gather(kolo__pset_t *ps, full_round_t *fr, kolo__err_t *err)
{
    const kolo__ops_t *ops = ps->ctl_ops;
    uint64_t mylen = ps->neg.send_buf.len;
    char detail[KOLO__ERR_LEN];
    int rc;

    rc = ops->allgather(ps->ctl_ctx, &mylen, fr->lens, sizeof(mylen), detail,
                        sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "allgather of request sizes", detail,
                              err);
    for (int r = 0; r < ps->size; r++)
        if (fr->lens[r] > fr->maxlen)
            fr->maxlen = fr->lens[r];
    if (bytes_reserve(&ps->neg.send_buf, fr->maxlen) != 0 ||
        (ps->rank == 0 &&
         bytes_reserve(&ps->neg.recv_buf, fr->maxlen * (uint64_t)ps->size) != 0))
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory for %llu bytes of requests",
                             (unsigned long long)fr->maxlen * (uint64_t)ps->size);
    memset(ps->neg.send_buf.data + mylen, 0, fr->maxlen - mylen);
    rc = ops->gather(ps->ctl_ctx, ps->neg.send_buf.data, ps->neg.recv_buf.data,
                     fr->maxlen, 0, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "gather of requests", detail, err);
    return KOLO_OK;
}

/* The coordinator's answer (neg.resp_buf) to every rank: its length, then
 * the list. */
static int responses_broadcast(kolo__pset_t *ps, full_round_t *fr,
                               kolo__err_t *err)
{
    const kolo__ops_t *ops = ps->ctl_ops;
    char detail[KOLO__ERR_LEN];
    int rc;

    fr->resplen = ps->rank == 0 ? ps->neg.resp_buf.len : 0;
    rc = ops->broadcast(ps->ctl_ctx, &fr->resplen, sizeof(fr->resplen), 0,
                        detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "broadcast of the response size", detail,
                              err);
    if (bytes_reserve(&ps->neg.resp_buf, fr->resplen) != 0)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory for %llu bytes of responses",
                             (unsigned long long)fr->resplen);
    rc = ops->broadcast(ps->ctl_ctx, ps->neg.resp_buf.data, fr->resplen, 0,
                        detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "broadcast of responses", detail, err);
    return KOLO_OK;
}

/* Decodes the coordinator's answer; one it sent with rank -1 stops the job
 * on every rank, with its message. */
static int responses_decode(kolo__pset_t *ps, uint64_t len, kolo__msg_t *resp,
                            kolo__err_t *err)
{
    int rc;

    KOLO__CHECK(kolo__msg_decode(ps->neg.resp_buf.data, len, 0, resp, err));
    if (resp->kind == KOLO__MSG_RESPONSES && resp->rank >= 0)
        return KOLO_OK;
    rc = kolo__err_set(err,
                       resp->n > 0 && resp->u.responses[0].status < 0
                           ? resp->u.responses[0].status
                           : KOLO_ERR_INTERNAL,
                       "the coordinator stopped the job: %s",
                       resp->n > 0 && resp->u.responses[0].text
                           ? resp->u.responses[0].text
                           : "malformed response");
    kolo__msg_free(resp);
    return rc;
}

/* Adds an OK response to the cache; every rank does so in the same order,
 * so the caches stay identical. */
static void cache_response(kolo__pset_t *ps, const kolo__response_t *r)
{
    size_t bit;
    int evicted;

    if (kolo__cache_put(&ps->neg.cache, r->name, &r->params, &bit, &evicted) ==
        KOLO__CACHE_LOST) {
        /* Taken but not stored: erased on every rank next round (cache.h);
         * the tensor itself goes on. */
        kolo__log(KOLO__LOG_WARNING, "rank %d: out of memory caching "
                  "'%s'; it is negotiated in full until cached again",
                  ps->rank, r->name);
        BIT_SET(ps->neg.lost, bit);
    }
    /* An eviction counts even when the insertion then failed (out of
     * memory): the evicted bit's waiters must be resent either way. */
    if (evicted)
        unhit(ps, bit);
}

/* Applies one response: an OK one puts its tensor in the plan and, unless
 * grouped (see the essay), its parameters in the cache; a failed one
 * completes its tensor with the coordinator's message. */
static int response_apply(kolo__pset_t *ps, const kolo__response_t *r,
                          kolo__err_t *err)
{
    kolo__entry_t *e = kolo__map_dels(&ps->neg.sent, r->name);

    if (e == NULL && ps->neg.joined[ps->rank]) {
        /* A tensor this joined rank never enqueued: zeros, or nothing when
         * it failed. */
        if (r->status != KOLO_OK)
            return KOLO_OK;
        KOLO__CHECK(standin(ps, r->name, &r->params, &e, err));
    } else if (e == NULL)
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "rank %d: the coordinator answered for tensor "
                             "'%s', which this rank never sent",
                             ps->rank, r->name);
    if (r->status != KOLO_OK) {
        kolo__log(KOLO__LOG_ERROR, "%s", r->text ? r->text : "");
        kolo__complete(ps, e, r->status, r->text);
        return KOLO_OK;
    }
    if (r->params.group <= 1)
        cache_response(ps, r);
    return ready_or_fail(ps, e, err);
}

/* Applies the coordinator's answer, in its order. */
static int responses_apply(kolo__pset_t *ps, uint64_t len, kolo__err_t *err)
{
    kolo__msg_t resp;
    int rc = KOLO_OK;

    KOLO__CHECK(responses_decode(ps, len, &resp, err));
    for (uint32_t i = 0; i < resp.n && rc == KOLO_OK; i++)
        rc = response_apply(ps, &resp.u.responses[i], err);
    kolo__msg_free(&resp);
    return rc;
}

/* The full round (step 2 of the essay): every rank sends its requests to
 * the coordinator, which answers every rank; each applies the answer. */
static int full_round(kolo__pset_t *ps, kolo__err_t *err)
{
    full_round_t fr = {NULL, NULL, 0, 0};
    int rc;

    KOLO__CHECK_GOTO(requests_encode(ps, &fr, err), rc, free_requests);
    KOLO__CHECK_GOTO(requests_track(ps, err), rc, free_requests);
    KOLO__CHECK_GOTO(requests_gather(ps, &fr, err), rc, free_requests);
    if (ps->rank == 0)
        KOLO__CHECK_GOTO(coordinate(ps, ps->neg.recv_buf.data, fr.maxlen,
                                    fr.lens, err),
                         rc, free_requests);
    KOLO__CHECK_GOTO(responses_broadcast(ps, &fr, err), rc, free_requests);
    rc = responses_apply(ps, fr.resplen, err);

free_requests:
    free(fr.reqs);
    free(fr.lens);
    return rc;
}

/* ---- when the caches disagree -------------------------------------------- */

static void bor8(void *out, const void *a, const void *b, size_t n)
{
    uint8_t *o = out;
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        o[i] = x[i] | y[i];
}

/* What this rank's cache holds at bit b, in words. */
static void slot_text(const kolo__pset_t *ps, size_t b, char *out, size_t len)
{
    const kolo__cache_entry_t *c = kolo__cache_at(&ps->neg.cache, b);
    char shape[96];

    if (c == NULL) {
        snprintf(out, len, "rank %d holds nothing", ps->ranks[ps->rank]);
        return;
    }
    shape_text(&c->params, shape, sizeof(shape));
    snprintf(out, len, "rank %d holds %s%.100s%s (%s %s %s)", ps->ranks[ps->rank],
             c->name ? "'" : "", c->name ? c->name : "a name it could not store",
             c->name ? "'" : "", kolo__coll_name(c->params.coll),
             kolo_dtype_name((kolo_dtype_t)c->params.dtype), shape);
}

/* The round's check words say the ranks' response caches differ (cache.h),
 * which only a fault of kolo's own can cause: every rank finds the first
 * bit where they differ and the views of rank 0 and of the first rank
 * that differs from it, with collectives on fixed buffers (nothing here
 * may fail on one rank only), and the set stops with that message. */
static int diverged(kolo__pset_t *ps, kolo__err_t *err)
{
    enum { CHUNK = 64, VIEW = 300 };
    const kolo__ops_t *ops = ps->ctl_ops;
    size_t cap = ps->neg.cache.capacity, first = SIZE_MAX;
    uint64_t w[2 * CHUNK], mine = 0;
    int32_t odd;
    char detail[KOLO__ERR_LEN], views[2][VIEW];
    int rc = KOLO_OK;

    /* The first bit whose entries differ: per chunk of bits, the AND of
     * every rank's hashes and of their complements. */
    for (size_t at = 0; at < cap && first == SIZE_MAX && rc == KOLO_OK; at += CHUNK) {
        size_t n = cap - at < CHUNK ? cap - at : CHUNK;
        for (size_t i = 0; i < n; i++) {
            const kolo__cache_entry_t *c = kolo__cache_at(&ps->neg.cache, at + i);
            w[i] = c ? c->hash : 0;
            w[CHUNK + i] = ~w[i];
        }
        rc = ops->allreduce(ps->ctl_ctx, NULL, w, 2 * CHUNK, sizeof(uint64_t),
                            band64, detail, sizeof(detail));
        for (size_t i = 0; i < n && rc == KOLO_OK; i++)
            if (w[i] != ~w[CHUNK + i]) {
                first = at + i;
                break;
            }
    }
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "comparing the response caches", detail, err);
    if (first == SIZE_MAX)
        return kolo__err_set(err, KOLO_ERR_INTERNAL,
                             "process set %d: the ranks' response caches hold "
                             "the same entries but disagree on their use "
                             "counts (kolo's own inconsistency: please report "
                             "it); the set stops",
                             ps->id);
    /* Rank 0's entry there, then the first rank whose entry differs. */
    {
        const kolo__cache_entry_t *c = kolo__cache_at(&ps->neg.cache, first);
        mine = c ? c->hash : 0;
    }
    w[0] = mine;
    rc = ops->broadcast(ps->ctl_ctx, w, sizeof(uint64_t), 0, detail, sizeof(detail));
    odd = rc == KOLO_OK && w[0] != mine ? ps->rank : INT32_MAX;
    if (rc == KOLO_OK)
        rc = ops->allreduce(ps->ctl_ctx, NULL, &odd, 1, sizeof(odd),
                            kolo__reduce_get(KOLO_INT32, KOLO_OP_MIN), detail,
                            sizeof(detail));
    if (rc == KOLO_OK) {
        memset(views, 0, sizeof(views));
        if (ps->rank == 0)
            slot_text(ps, first, views[0], VIEW);
        else if (ps->rank == odd)
            slot_text(ps, first, views[1], VIEW);
        rc = ops->allreduce(ps->ctl_ctx, NULL, views, sizeof(views), 1, bor8,
                            detail, sizeof(detail));
    }
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "comparing the response caches", detail, err);
    views[0][VIEW - 1] = views[1][VIEW - 1] = '\0';
    return kolo__err_set(err, KOLO_ERR_INTERNAL,
                         "process set %d: the ranks' response caches differ "
                         "at bit %zu, where %s and %s (kolo's own "
                         "inconsistency: please report it); the set stops",
                         ps->id, first, views[0], views[1]);
}

/* ---- carrying small tensors with the agreement (see the essay) ---------- */

static int carry_eligible(const kolo__params_t *p)
{
    return p->coll == KOLO__COLL_ALLREDUCE && p->device_type == KOLO_DEVICE_HOST &&
           p->wire == p->dtype && p->prescale == 1.0 && p->group <= 1 &&
           p->count > 0 &&
           kolo__reduce_get((kolo_dtype_t)p->dtype, (kolo_op_t)p->op) != NULL;
}

/* Lays out the carried area from the cache (the same on every rank) and
 * returns its bytes: 0 where nothing is carried this round. */
static size_t carry_layout(kolo__pset_t *ps)
{
    size_t cap = ps->neg.cache.capacity, total = 0, budget;

    if (ps->size < 2 || ps->data_ops == NULL ||
        (ps->data_ops->caps & KOLO__OPS_ONE_HOST))
        return 0;
    budget = CARRY_MAX_BYTES / (size_t)(ps->size - 1);
    for (size_t b = 0; b < cap; b++) {
        const kolo__cache_entry_t *c = kolo__cache_at(&ps->neg.cache, b);
        size_t bytes;
        ps->neg.carry_off[b] = SIZE_MAX;
        if (c == NULL || !carry_eligible(&c->params))
            continue;
        bytes = (size_t)c->params.count * kolo_dtype_size((kolo_dtype_t)c->params.dtype);
        bytes = (bytes + 7) & ~(size_t)7; /* total stays within the budget */
        if (bytes > budget - total)
            continue;
        ps->neg.carry_off[b] = total;
        total += bytes;
    }
    return total;
}

/* Step 1 with the carried area: every rank's [bits | carry bits | area] to
 * every rank; then this rank ANDs the bits into v and the carry bits into
 * neg.carry_bits. */
static int carry_round(kolo__pset_t *ps, uint64_t *v, size_t area, char *detail,
                       size_t len)
{
    size_t hw = ps->neg.hit_words, cap = ps->neg.cache.capacity;
    size_t head = (ps->neg.nwords + hw) * sizeof(uint64_t);
    size_t msg = head + area, n = (size_t)ps->size;
    uint64_t *bits, *cb;
    uint8_t *slots;
    int rc;

    if (bytes_reserve(&ps->neg.carry_msg, msg) != 0 ||
        bytes_reserve(&ps->neg.carry_all, msg * n) != 0 ||
        bytes_reserve(&ps->neg.carry_out, area) != 0) {
        snprintf(detail, len, "out of memory for %zu bytes of carried tensors",
                 msg * n);
        return KOLO_ERR_NO_MEMORY;
    }
    bits = (uint64_t *)ps->neg.carry_msg.data;
    cb = bits + ps->neg.nwords;
    slots = ps->neg.carry_msg.data + head;
    memcpy(bits, v, ps->neg.nwords * sizeof(uint64_t));
    memset(cb, 0, hw * sizeof(uint64_t));
    memset(slots, 0, area); /* (what is not carried: deterministic bytes) */
    for (size_t b = 0; b < cap; b++) {
        const kolo__entry_t *e = ps->neg.hits[b];
        if (e == NULL || ps->neg.carry_off[b] == SIZE_MAX)
            continue;
        memcpy(slots + ps->neg.carry_off[b], e->input,
               (size_t)e->params.count * kolo_dtype_size((kolo_dtype_t)e->params.dtype));
        BIT_SET(cb, b);
    }
    rc = ps->ctl_ops->allgather(ps->ctl_ctx, ps->neg.carry_msg.data,
                                ps->neg.carry_all.data, msg, detail, len);
    if (rc != KOLO_OK)
        return rc;
    ps->neg.carry_bytes = msg;
    memcpy(v, ps->neg.carry_all.data, ps->neg.nwords * sizeof(uint64_t));
    memcpy(ps->neg.carry_bits, ps->neg.carry_all.data + ps->neg.nwords * sizeof(uint64_t),
           hw * sizeof(uint64_t));
    for (size_t r = 1; r < n; r++) {
        const uint64_t *o = (const uint64_t *)(ps->neg.carry_all.data + r * msg);
        band64(v, v, o, ps->neg.nwords);
        band64(ps->neg.carry_bits, ps->neg.carry_bits, o + ps->neg.nwords, hw);
    }
    return KOLO_OK;
}

/* The reduction of the tensor carried on bit b, in rank order, as the
 * backends' one-step exchange reduces: x0 (op) x1, then (op) x2, ... */
static const void *carry_reduce(kolo__pset_t *ps, size_t b, const kolo__params_t *p)
{
    size_t head = (ps->neg.nwords + ps->neg.hit_words) * sizeof(uint64_t);
    size_t msg = ps->neg.carry_bytes, off = ps->neg.carry_off[b];
    kolo__reduce_fn fn = kolo__reduce_get((kolo_dtype_t)p->dtype, (kolo_op_t)p->op);
    const uint8_t *all = ps->neg.carry_all.data;
    uint8_t *out = ps->neg.carry_out.data + off;
    size_t count = (size_t)p->count;

    fn(out, all + head + off, all + msg + head + off, count);
    for (int r = 2; r < ps->size; r++)
        fn(out, out, all + (size_t)r * msg + head + off, count);
    return out;
}

/* ---- step 1: the bit vector ---------------------------------------------- */

/* Timeline: the tensor's negotiation begins; on the coordinator, with the
 * first rank's request, which may have come before this rank's. */
static void tl_negotiating(kolo__pset_t *ps, kolo__entry_t *e)
{
    char me[16];
    int64_t start = e->enqueued_us;
    kolo__pending_name_t *p = kolo__map_gets(&ps->neg.table, e->name);

    if (p != NULL && p->first_us < start)
        start = p->first_us;
    snprintf(me, sizeof(me), "%d", ps->rank);
    kolo__tl_entry_begin(ps, e, kolo__coll_negotiate_phase(e->params.coll),
                         NULL, start);
    kolo__tl_instant(ps->rt->timeline, e->name, me, e->enqueued_us);
    for (int r = 0; p != NULL && r < ps->size; r++)
        if (r != ps->rank)
            tl_asked(ps, p, r);
}

/* Sorts the entries taken from the queue this cycle: a cache hit waits on
 * its bit, the rest go to the full round, and a join waits for every rank
 * to join. */
static void sort_fresh(kolo__pset_t *ps, kolo__entry_t *fresh)
{
    for (kolo__entry_t *e = fresh, *next; e != NULL; e = next) {
        size_t bit;
        next = e->next;
        if (kolo__timeline_active(ps->rt->timeline))
            tl_negotiating(ps, e);
        if (e->params.coll == KOLO__COLL_JOIN) {
            ps->neg.join_entry = e; /* a second one is refused at enqueue */
            continue;
        }
        /* Groups are never cached. A name cached with other parameters
         * (a mismatch) invalidates its bit (bits_invalid), and is resent
         * next round. */
        if (e->params.group <= 1 &&
            kolo__cache_lookup(&ps->neg.cache, e->name, &e->params, &bit) ==
                KOLO__CACHE_HIT) {
            ps->neg.hits[bit] = e;
            ps->neg.nhits++;
        } else
            uncached_append(ps, e);
    }
}

/* The hit words: the cached tensors this rank has; a joined rank has every
 * cached allreduce, as zeros. */
static void bits_hits(kolo__pset_t *ps, uint64_t *v)
{
    uint64_t *hit = v + ps->neg.hit_word;
    size_t cap = ps->neg.cache.capacity;

    memset(hit, 0, ps->neg.hit_words * sizeof(uint64_t));
    for (size_t b = 0; b < cap; b++) {
        const kolo__cache_entry_t *c;
        if (ps->neg.hits[b] != NULL ||
            (ps->neg.join_entry != NULL && (c = kolo__cache_at(&ps->neg.cache, b)) != NULL &&
             c->name != NULL && c->params.coll == KOLO__COLL_ALLREDUCE &&
             !c->params.own))
            BIT_SET(hit, b);
    }
}

/* The invalid words: the bits every rank forgets this round. */
static void bits_invalid(kolo__pset_t *ps, uint64_t *v)
{
    uint64_t *inv = v + ps->neg.inv_word;
    size_t cap = ps->neg.cache.capacity;
    int64_t half = kolo__stall_half_us(ps);

    /* Bits this rank could not store last round (cache.h). */
    for (size_t w = 0; w < ps->neg.hit_words; w++) {
        inv[w] &= ~ps->neg.lost[w];
        ps->neg.lost[w] = 0;
    }
    if (half > 0 || kolo__stall_release_hits(ps, kolo__now_us())) {
        /* Tensors long on a cache bit go to the coordinator, who can tell
         * which ranks are missing (the essay's "Stalls"); all of them when
         * every rank is blocked (a deadlock is suspected: stall.c). */
        int64_t now = kolo__now_us();
        int all = kolo__stall_release_hits(ps, now);
        for (size_t b = 0; b < cap; b++)
            if (ps->neg.hits[b] != NULL &&
                (all || now - ps->neg.hits[b]->enqueued_us > half))
                BIT_CLR(inv, b);
    }
    /* Names this rank enqueued with other parameters than cached. */
    for (kolo__entry_t *e = ps->neg.uncached_head; e != NULL; e = e->next) {
        size_t bit;
        if (kolo__cache_lookup(&ps->neg.cache, e->name, &e->params, &bit) ==
            KOLO__CACHE_MISMATCH)
            BIT_CLR(inv, bit);
    }
}

/* Word 0's flags, this rank's join and shutdown bits, and the check
 * words. */
static void bits_flags(kolo__pset_t *ps, uint64_t *v, int shutdown)
{
    /* The caches' check (cache.h), and its complement: after the AND, the
     * two are complements only if every rank had the same. */
    uint64_t check = kolo__cache_check(&ps->neg.cache);

    v[ps->neg.check_word] = check;
    v[ps->neg.check_word + 1] = ~check;
    if (ps->neg.join_entry != NULL) {
        BIT_CLR(v + ps->neg.join_word, (size_t)ps->rank);
        /* The round in which a rank joins runs the full round, so that the
         * coordinator completes the names that only this rank was missing
         * (no other rank may have anything new to send). */
        if (!ps->neg.joined[ps->rank])
            v[0] &= ~FLAG_NO_UNCACHED;
    }
    if (ps->neg.stall_fatal.code != KOLO_OK)
        v[0] &= ~FLAG_NO_UNCACHED; /* the coordinator has something to say */
    if (ps->neg.uncached_head != NULL || reask_due(ps, kolo__now_us()))
        v[0] &= ~FLAG_NO_UNCACHED;
    if (kolo__negotiate_pending(ps))
        v[0] &= ~FLAG_NONE_PENDING;
    if (ps->neg.nhits > 0)
        v[0] &= ~FLAG_NO_HITS;
    if (shutdown)
        BIT_CLR(v + ps->neg.shut_word, (size_t)ps->rank);
    /* What the stall inspector and the flight recorder learn (stall.c) */
    if (kolo__flight_blocked_since(ps->rt, ps) != 0)
        BIT_CLR(v + ps->neg.blocked_word, (size_t)ps->rank);
    if (ps->id == KOLO_GLOBAL_PROCESS_SET && kolo__flight_take_dump_all(ps->rt))
        BIT_CLR(v + ps->neg.dump_word, (size_t)ps->rank);
}

/* Builds this rank's vector (its layout in the essay). */
static void bits_build(kolo__pset_t *ps, int shutdown)
{
    uint64_t *v = ps->neg.bits;

    memset(v, 0xff, ps->neg.nwords * sizeof(uint64_t)); /* every flag clear */
    bits_hits(ps, v);
    bits_invalid(ps, v);
    bits_flags(ps, v, shutdown);
}

/* All ranks AND their vectors; where small tensors ride with the bits (the
 * layout comes from the cache alone: every rank takes the same path), the
 * allgather of bits and tensors that carry_round runs instead. */
static int bits_reduce(kolo__pset_t *ps, kolo__err_t *err)
{
    char detail[KOLO__ERR_LEN];
    size_t area;
    int rc;

    ps->neg.carry_bytes = 0;
    area = carry_layout(ps);
    if (area > 0) {
        rc = carry_round(ps, ps->neg.bits, area, detail, sizeof(detail));
        if (rc != KOLO_OK)
            return backend_failed(ps, rc,
                                  "allgather of the readiness bits and the "
                                  "carried tensors",
                                  detail, err);
        return KOLO_OK;
    }
    rc = ps->ctl_ops->allreduce(ps->ctl_ctx, NULL, ps->neg.bits, ps->neg.nwords,
                                sizeof(uint64_t), band64, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(ps, rc, "allreduce of the readiness bits",
                              detail, err);
    return KOLO_OK;
}

/* Who has joined (kolo_join); when every rank has, the joins complete, all
 * alike, with the rank that joined last. */
static int read_joins(kolo__pset_t *ps, kolo__err_t *err)
{
    const uint64_t *joins = ps->neg.bits + ps->neg.join_word;
    int last_joined = -1, njoined = 0;

    for (int r = 0; r < ps->size; r++) {
        int j = !BIT_GET(joins, (size_t)r);
        if (j && !ps->neg.joined[r])
            last_joined = r; /* the highest of those new this round */
        ps->neg.joined[r] = (uint8_t)j;
        njoined += j;
    }
    ps->neg.njoined = njoined;
    if (njoined == ps->size && ps->neg.join_entry != NULL)
        return finish_join(ps, last_joined, err);
    return KOLO_OK;
}

/* A rank that was asked for a flight-recorder dump (SIGUSR1, a stall)
 * asks every rank: each writes its own (the asker has). */
static void read_dumps(kolo__pset_t *ps)
{
    const uint64_t *dump = ps->neg.bits + ps->neg.dump_word;
    char why[48];

    for (int r = 0; r < ps->size; r++)
        if (!BIT_GET(dump, (size_t)r)) {
            if (r != ps->rank) {
                snprintf(why, sizeof(why), "asked by rank %d", ps->ranks[r]);
                kolo__flight_dump(ps->rt, why);
            }
            return;
        }
}

/* What the reduced vector says besides its hits: whether the caches still
 * agree, whether some rank has tensors waiting, the lowest rank that asks
 * to shut down (*stop_rank), and who has joined. */
static int bits_read(kolo__pset_t *ps, int *stop_rank, kolo__err_t *err)
{
    const uint64_t *v = ps->neg.bits;

    if (v[ps->neg.check_word] != ~v[ps->neg.check_word + 1])
        return diverged(ps, err);
    ps->neg.any_pending = !(v[0] & FLAG_NONE_PENDING);
    for (int r = 0; r < ps->size; r++)
        if (!BIT_GET(v + ps->neg.shut_word, (size_t)r)) {
            *stop_rank = r;
            break;
        }
    read_dumps(ps);
    return read_joins(ps, err);
}

/* ---- the plan ------------------------------------------------------------ */

/* The plan begins with the cached tensors ready on every rank, in bit
 * order, each a use of its cache entry; a joined rank reduces zeros for
 * those it lacks. */
static int plan_hits(kolo__pset_t *ps, kolo__err_t *err)
{
    const uint64_t *hit = ps->neg.bits + ps->neg.hit_word;
    size_t cap = ps->neg.cache.capacity;

    for (size_t b = 0; b < cap; b++) {
        const kolo__cache_entry_t *c;
        kolo__entry_t *e;
        if (!BIT_GET(hit, b))
            continue;
        kolo__cache_touch(&ps->neg.cache, b);
        if ((e = ps->neg.hits[b]) != NULL) {
            e->carried = ps->neg.carry_bytes > 0 && BIT_GET(ps->neg.carry_bits, b)
                             ? carry_reduce(ps, b, &e->params)
                             : NULL;
            KOLO__CHECK(ready_push(ps, e, err));
            ps->neg.hits[b] = NULL;
            ps->neg.nhits--;
        } else if (ps->neg.joined[ps->rank] &&
                   (c = kolo__cache_at(&ps->neg.cache, b)) != NULL && c->name != NULL) {
            KOLO__CHECK(standin(ps, c->name, &c->params, &e, err));
            KOLO__CHECK(ready_or_fail(ps, e, err));
        }
    }
    return KOLO_OK;
}

/* The hits that cannot be ready go to the full round: while a rank is
 * joined, every cached collective but allreduce (the coordinator says why
 * it cannot run), and whatever waits on a bit that is forgotten now. */
static void unhit_invalid(kolo__pset_t *ps)
{
    const uint64_t *inv = ps->neg.bits + ps->neg.inv_word;
    size_t cap = ps->neg.cache.capacity;

    for (size_t b = 0; ps->neg.njoined > 0 && b < cap; b++)
        if (ps->neg.hits[b] != NULL &&
            ps->neg.hits[b]->params.coll != KOLO__COLL_ALLREDUCE)
            unhit(ps, b);
    for (size_t b = 0; b < cap; b++) {
        if (!BIT_GET(inv, b)) {
            unhit(ps, b);
            kolo__cache_erase(&ps->neg.cache, b);
        }
    }
}

int kolo__negotiate(kolo__pset_t *ps, kolo__entry_t *fresh, int shutdown,
                    int *stop_rank, kolo__err_t *err)
{
    ps->nready = 0;
    *stop_rank = -1;
#ifdef KOLO_HAVE_MEM
    if (kolo__negotiate_test_hook != NULL)
        kolo__negotiate_test_hook(ps);
#endif
    if (kolo__timeline_marks_cycles(ps->rt->timeline))
        kolo__tl_cycle(ps->rt->timeline);

    sort_fresh(ps, fresh);
    /* Step 1: the bit vector, built, AND-reduced and read. */
    bits_build(ps, shutdown);
    KOLO__CHECK(bits_reduce(ps, err));
    KOLO__CHECK(bits_read(ps, stop_rank, err));
    /* The plan: the cache hits, then what the full round answers OK. */
    KOLO__CHECK(plan_hits(ps, err));
    unhit_invalid(ps);
    /* Step 2, only when some rank has tensors the cache cannot settle. */
    if (!(ps->neg.bits[0] & FLAG_NO_UNCACHED))
        KOLO__CHECK(full_round(ps, err));
    kolo__stall_observe(ps, ps->neg.bits + ps->neg.blocked_word,
                        !(ps->neg.bits[0] & FLAG_NO_HITS));
    kolo__stall_check(ps);
    KOLO__CHECK(kolo__straggler_round(ps, err));
    ps->cycles++;
    return KOLO_OK;
}
