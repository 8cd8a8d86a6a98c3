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
 * A cached name enqueued with different parameters invalidates its bit
 * everywhere; ranks that were waiting on that bit resend the tensor through
 * the full round, where the coordinator sees the disagreement and reports
 * it. Eviction (cache full) does the same for the evicted bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define FLAG_NO_UNCACHED 1ULL
#define FLAG_NONE_PENDING 2ULL

#define BIT_GET(words, b) (((words)[(b) / 64] >> ((b) % 64)) & 1ULL)
#define BIT_SET(words, b) ((words)[(b) / 64] |= 1ULL << ((b) % 64))
#define BIT_CLR(words, b) ((words)[(b) / 64] &= ~(1ULL << ((b) % 64)))

static void band64(void *out, const void *a, const void *b, size_t n)
{
    uint64_t *o = out;
    const uint64_t *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        o[i] = x[i] & y[i];
}

int kolo__negotiate_init(kolo__runtime_t *rt)
{
    size_t cap = (size_t)rt->cfg.cache_capacity;
    size_t shut_words = ((size_t)rt->size + 63) / 64;

    if (kolo__cache_init(&rt->cache, cap) != 0)
        return -1;
    rt->hits = calloc(cap ? cap : 1, sizeof(*rt->hits));
    rt->hit_words = (cap + 63) / 64;
    rt->shut_word = 1;
    rt->hit_word = rt->shut_word + shut_words;
    rt->inv_word = rt->hit_word + rt->hit_words;
    rt->nwords = rt->inv_word + rt->hit_words;
    rt->bits = calloc(rt->nwords, sizeof(uint64_t));
    kolo__map_init(&rt->sent);
    kolo__map_init(&rt->table);
    if (rt->hits == NULL || rt->bits == NULL)
        return -1;
    return 0;
}

static void pending_name_free(kolo__pending_name_t *p)
{
    if (p != NULL) {
        free(p->name);
        free(p->params);
        free(p->have);
        free(p);
    }
}

void kolo__negotiate_free(kolo__runtime_t *rt)
{
    size_t it = 0;
    void *v;

    while (kolo__map_next(&rt->table, &it, NULL, &v))
        pending_name_free(v);
    kolo__map_free(&rt->table);
    kolo__map_free(&rt->sent);
    kolo__cache_free(&rt->cache);
    free(rt->hits);
    free(rt->bits);
    free(rt->ready);
    kolo__bytes_free(&rt->send_buf);
    kolo__bytes_free(&rt->recv_buf);
    kolo__bytes_free(&rt->resp_buf);
    rt->hits = NULL;
    rt->bits = NULL;
    rt->ready = NULL;
}

int kolo__negotiate_pending(const kolo__runtime_t *rt)
{
    return rt->nhits > 0 || rt->uncached_head != NULL || rt->sent.count > 0;
}

void kolo__negotiate_drain(kolo__runtime_t *rt,
                           void (*fn)(kolo__runtime_t *, kolo__entry_t *,
                                      const kolo__err_t *),
                           const kolo__err_t *why)
{
    size_t it = 0;
    void *v;
    kolo__entry_t *e;

    for (size_t b = 0; b < rt->cache.capacity; b++)
        if (rt->hits[b] != NULL) {
            fn(rt, rt->hits[b], why);
            rt->hits[b] = NULL;
        }
    rt->nhits = 0;
    e = rt->uncached_head;
    while (e != NULL) {
        kolo__entry_t *next = e->next;
        fn(rt, e, why);
        e = next;
    }
    rt->uncached_head = rt->uncached_tail = NULL;
    while (kolo__map_next(&rt->sent, &it, NULL, &v))
        fn(rt, v, why);
    kolo__map_free(&rt->sent);
}

static void uncached_append(kolo__runtime_t *rt, kolo__entry_t *e)
{
    e->next = NULL;
    if (rt->uncached_tail != NULL)
        rt->uncached_tail->next = e;
    else
        rt->uncached_head = e;
    rt->uncached_tail = e;
}

static int ready_push(kolo__runtime_t *rt, kolo__entry_t *e, kolo__err_t *err)
{
    if (rt->nready == rt->ready_cap) {
        size_t ncap = rt->ready_cap ? rt->ready_cap * 2 : 64;
        kolo__entry_t **nr = realloc(rt->ready, ncap * sizeof(*nr));
        if (nr == NULL)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory planning %zu tensors",
                                 rt->nready + 1);
        rt->ready = nr;
        rt->ready_cap = ncap;
    }
    rt->ready[rt->nready++] = e;
    return KOLO_OK;
}

/* Takes a waiting entry off a cache bit and sends it through the full round
 * next cycle. */
static void unhit(kolo__runtime_t *rt, size_t bit)
{
    if (rt->hits[bit] != NULL) {
        uncached_append(rt, rt->hits[bit]);
        rt->hits[bit] = NULL;
        rt->nhits--;
    }
}

/* ---- the coordinator ---------------------------------------------------- */

/* Writes why two ranks' requests for one name disagree. */
static void describe_mismatch(const char *name, int ra, const kolo__params_t *a,
                              int rb, const kolo__params_t *b, char *out,
                              size_t len)
{
    if (a->coll != b->coll)
        snprintf(out, len,
                 "tensor '%s': ranks disagree on the collective: rank %d "
                 "enqueued %s, rank %d enqueued %s",
                 name, ra, kolo__coll_name(a->coll), rb,
                 kolo__coll_name(b->coll));
    else if (a->dtype != b->dtype)
        snprintf(out, len,
                 "%s of tensor '%s': ranks disagree on the dtype: rank %d has "
                 "%s, rank %d has %s",
                 kolo__coll_name(a->coll), name, ra,
                 kolo_dtype_name((kolo_dtype_t)a->dtype), rb,
                 kolo_dtype_name((kolo_dtype_t)b->dtype));
    else if (a->count != b->count)
        snprintf(out, len,
                 "%s of tensor '%s': ranks disagree on the number of "
                 "elements: rank %d has %lld, rank %d has %lld",
                 kolo__coll_name(a->coll), name, ra, (long long)a->count, rb,
                 (long long)b->count);
    else
        snprintf(out, len,
                 "%s of tensor '%s': ranks disagree on the reduction: rank %d "
                 "asks for %s, rank %d for %s",
                 kolo__coll_name(a->coll), name, ra,
                 kolo_op_name((kolo_op_t)a->op), rb,
                 kolo_op_name((kolo_op_t)b->op));
}

typedef struct resp_list {
    kolo__response_t *items;
    uint32_t n, cap;
} resp_list_t;

static int resp_push(resp_list_t *l, kolo__pending_name_t *p, int size)
{
    kolo__response_t *r;
    char text[KOLO__MSG_MAX_TEXT];

    if (l->n == l->cap) {
        uint32_t ncap = l->cap ? l->cap * 2 : 32;
        kolo__response_t *ni = realloc(l->items, ncap * sizeof(*ni));
        if (ni == NULL)
            return -1;
        l->items = ni;
        l->cap = ncap;
    }
    r = &l->items[l->n];
    memset(r, 0, sizeof(*r));
    r->name = p->name;
    p->name = NULL;
    r->params = p->params[0];
    r->status = KOLO_OK;
    for (int rk = 1; rk < size; rk++) {
        if (!kolo__params_equal(&p->params[0], &p->params[rk])) {
            describe_mismatch(r->name, 0, &p->params[0], rk, &p->params[rk],
                              text, sizeof(text));
            r->status = KOLO_ERR_MISMATCH;
            r->text = kolo__strdup(text);
            break;
        }
    }
    l->n++;
    return 0;
}

/* Rank 0: reads every rank's requests (rank r's are at recv + r * stride,
 * lens[r] bytes), updates the table and encodes the responses into
 * rt->resp_buf. A malformed message yields a response list whose rank field
 * is -1 and whose only response carries the error: every rank stops. */
static int coordinate(kolo__runtime_t *rt, const uint8_t *recv, size_t stride,
                      const uint64_t *lens, kolo__err_t *err)
{
    resp_list_t out = {NULL, 0, 0};
    kolo__msg_t msg;
    kolo__err_t derr;
    int rc = KOLO_OK;

    for (int r = 0; r < rt->size; r++) {
        kolo__err_clear(&derr);
        if (kolo__msg_decode(recv + (size_t)r * stride, lens[r], r, &msg,
                             &derr) != KOLO_OK ||
            msg.kind != KOLO__MSG_REQUESTS || msg.rank != r) {
            kolo__response_t fatal = {(char *)"*", {0, 0, 0, 0},
                                      KOLO_ERR_INTERNAL, derr.msg};
            kolo__msg_t m = {KOLO__MSG_RESPONSES, -1, 1, {.responses = &fatal}};
            if (derr.code == KOLO_OK) /* decoded, but not a request list */
                snprintf(derr.msg, sizeof(derr.msg),
                         "negotiation message from rank %d has kind %d and "
                         "claims rank %d",
                         r, msg.kind, msg.rank);
            kolo__msg_free(&msg);
            for (uint32_t i = 0; i < out.n; i++)
                free(out.items[i].name), free(out.items[i].text);
            free(out.items);
            kolo__log(KOLO__LOG_ERROR, "%s", derr.msg);
            return kolo__msg_encode(&m, &rt->resp_buf, err);
        }
        derr.code = KOLO_OK;
        for (uint32_t i = 0; i < msg.n; i++) {
            kolo__request_t *q = &msg.u.requests[i];
            kolo__pending_name_t *p = kolo__map_gets(&rt->table, q->name);
            if (p == NULL) {
                p = calloc(1, sizeof(*p));
                if (p == NULL ||
                    (p->params = calloc((size_t)rt->size, sizeof(*p->params))) == NULL ||
                    (p->have = calloc((size_t)rt->size, 1)) == NULL ||
                    kolo__map_puts(&rt->table, q->name, p) != 0) {
                    pending_name_free(p);
                    rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                       "out of memory in the coordinator");
                    goto free_msg;
                }
                p->name = q->name;
                q->name = NULL;
            }
            if (!p->have[r]) {
                p->have[r] = 1;
                p->nhave++;
            }
            p->params[r] = q->params;
            if (p->nhave == rt->size) {
                kolo__map_dels(&rt->table, p->name);
                if (resp_push(&out, p, rt->size) != 0) {
                    pending_name_free(p);
                    rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                       "out of memory in the coordinator");
                    goto free_msg;
                }
                pending_name_free(p);
            }
        }
        kolo__msg_free(&msg);
    }
    {
        kolo__msg_t m = {KOLO__MSG_RESPONSES, 0, out.n, {.responses = out.items}};
        rc = kolo__msg_encode(&m, &rt->resp_buf, err);
    }
    goto free_out;

free_msg:
    kolo__msg_free(&msg);
free_out:
    for (uint32_t i = 0; i < out.n; i++)
        free(out.items[i].name), free(out.items[i].text);
    free(out.items);
    return rc;
}

/* ---- one round ------------------------------------------------------------ */

static int bytes_reserve(kolo__bytes_t *b, size_t n)
{
    if (b->cap < n) {
        uint8_t *nd = realloc(b->data, n);
        if (nd == NULL)
            return -1;
        b->data = nd;
        b->cap = n;
    }
    return 0;
}

static int backend_failed(kolo__runtime_t *rt, int rc, const char *what,
                          const char *detail, kolo__err_t *err)
{
    return kolo__err_set(err, rc, "rank %d: negotiation (%s) failed: %s",
                         rt->rank, what, detail);
}

/* The full round (step 2 of the essay). */
static int full_round(kolo__runtime_t *rt, kolo__err_t *err)
{
    const kolo__ops_t *ops = rt->ops;
    char detail[KOLO__ERR_LEN];
    kolo__request_t *reqs = NULL;
    uint32_t n = 0;
    uint64_t mylen, maxlen = 0, resplen;
    uint64_t *lens = NULL;
    kolo__msg_t resp;
    int rc;

    /* Encode this rank's uncached requests and move them to `sent`. */
    for (kolo__entry_t *e = rt->uncached_head; e != NULL; e = e->next)
        n++;
    reqs = calloc(n ? n : 1, sizeof(*reqs));
    lens = calloc((size_t)rt->size, sizeof(*lens));
    if (reqs == NULL || lens == NULL) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory sending %u requests", n);
        goto out;
    }
    n = 0;
    for (kolo__entry_t *e = rt->uncached_head; e != NULL; e = e->next)
        reqs[n++] = (kolo__request_t){e->name, e->params};
    {
        kolo__msg_t m = {KOLO__MSG_REQUESTS, rt->rank, n, {.requests = reqs}};
        KOLO__CHECK_GOTO(kolo__msg_encode(&m, &rt->send_buf, err), rc, out);
    }
    for (kolo__entry_t *e = rt->uncached_head, *next; e != NULL; e = next) {
        next = e->next;
        e->next = NULL;
        if (kolo__map_puts(&rt->sent, e->name, e) != 0) {
            rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                               "out of memory tracking tensor '%s'", e->name);
            goto out;
        }
        rt->uncached_head = next;
    }
    rt->uncached_tail = NULL;

    /* Gather the requests at the coordinator. */
    mylen = rt->send_buf.len;
    rc = ops->allgather(rt->ops_ctx, &mylen, lens, sizeof(mylen), detail,
                        sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_failed(rt, rc, "allgather of request sizes", detail, err);
        goto out;
    }
    for (int r = 0; r < rt->size; r++)
        if (lens[r] > maxlen)
            maxlen = lens[r];
    if (bytes_reserve(&rt->send_buf, maxlen) != 0 ||
        (rt->rank == 0 && bytes_reserve(&rt->recv_buf, maxlen * (uint64_t)rt->size) != 0)) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory for %llu bytes of requests",
                           (unsigned long long)maxlen * (uint64_t)rt->size);
        goto out;
    }
    memset(rt->send_buf.data + mylen, 0, maxlen - mylen);
    rc = ops->gather(rt->ops_ctx, rt->send_buf.data, rt->recv_buf.data, maxlen,
                     0, detail, sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_failed(rt, rc, "gather of requests", detail, err);
        goto out;
    }

    /* The coordinator decides; everyone learns the decision. */
    if (rt->rank == 0)
        KOLO__CHECK_GOTO(coordinate(rt, rt->recv_buf.data, maxlen, lens, err),
                         rc, out);
    resplen = rt->rank == 0 ? rt->resp_buf.len : 0;
    rc = ops->broadcast(rt->ops_ctx, &resplen, sizeof(resplen), 0, detail,
                        sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_failed(rt, rc, "broadcast of the response size", detail, err);
        goto out;
    }
    if (bytes_reserve(&rt->resp_buf, resplen) != 0) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory for %llu bytes of responses",
                           (unsigned long long)resplen);
        goto out;
    }
    rc = ops->broadcast(rt->ops_ctx, rt->resp_buf.data, resplen, 0, detail,
                        sizeof(detail));
    if (rc != KOLO_OK) {
        rc = backend_failed(rt, rc, "broadcast of responses", detail, err);
        goto out;
    }
    KOLO__CHECK_GOTO(kolo__msg_decode(rt->resp_buf.data, resplen, 0, &resp, err),
                     rc, out);
    if (resp.kind != KOLO__MSG_RESPONSES || resp.rank < 0) {
        rc = kolo__err_set(err, KOLO_ERR_INTERNAL, "the coordinator stopped "
                           "the job: %s",
                           resp.n > 0 && resp.u.responses[0].text
                               ? resp.u.responses[0].text
                               : "malformed response");
        kolo__msg_free(&resp);
        goto out;
    }

    /* Apply the responses in order: cache the OK ones, fail the others. */
    for (uint32_t i = 0; i < resp.n && rc == KOLO_OK; i++) {
        kolo__response_t *r = &resp.u.responses[i];
        kolo__entry_t *e = kolo__map_dels(&rt->sent, r->name);
        size_t bit;
        int evicted;

        if (e == NULL) {
            rc = kolo__err_set(err, KOLO_ERR_INTERNAL,
                               "rank %d: the coordinator answered for tensor "
                               "'%s', which this rank never sent",
                               rt->rank, r->name);
            break;
        }
        if (r->status != KOLO_OK) {
            kolo__log(KOLO__LOG_ERROR, "%s", r->text ? r->text : "");
            kolo__complete(rt, e, r->status, r->text);
            continue;
        }
        /* An eviction counts even when the insertion then failed (out of
         * memory): the evicted bit's waiters must be resent either way. */
        kolo__cache_put(&rt->cache, r->name, &r->params, &bit, &evicted);
        if (evicted)
            unhit(rt, bit);
        rc = ready_push(rt, e, err);
    }
    kolo__msg_free(&resp);

out:
    free(reqs);
    free(lens);
    return rc;
}

int kolo__negotiate(kolo__runtime_t *rt, kolo__entry_t *fresh, int shutdown,
                    int *stop_rank, kolo__err_t *err)
{
    uint64_t *v = rt->bits;
    char detail[KOLO__ERR_LEN];
    size_t cap = rt->cache.capacity;
    int rc;

    rt->nready = 0;
    *stop_rank = -1;

    /* Sort the new entries: cache hits wait on their bit, the rest go to
     * the full round. */
    for (kolo__entry_t *e = fresh, *next; e != NULL; e = next) {
        size_t bit;
        next = e->next;
        switch (kolo__cache_lookup(&rt->cache, e->name, &e->params, &bit)) {
        case KOLO__CACHE_HIT:
            rt->hits[bit] = e;
            rt->nhits++;
            break;
        case KOLO__CACHE_MISMATCH:
            /* Marked below through the invalid bits; resent next round. */
            uncached_append(rt, e);
            break;
        case KOLO__CACHE_MISS:
            uncached_append(rt, e);
            break;
        }
    }

    /* Build this rank's vector (layout in the essay). */
    memset(v, 0xff, rt->nwords * sizeof(uint64_t));
    memset(v + rt->hit_word, 0, rt->hit_words * sizeof(uint64_t));
    for (size_t b = 0; b < cap; b++)
        if (rt->hits[b] != NULL)
            BIT_SET(v + rt->hit_word, b);
    for (kolo__entry_t *e = rt->uncached_head; e != NULL; e = e->next) {
        size_t bit;
        if (kolo__cache_lookup(&rt->cache, e->name, &e->params, &bit) ==
            KOLO__CACHE_MISMATCH)
            BIT_CLR(v + rt->inv_word, bit);
    }
    if (rt->uncached_head != NULL)
        v[0] &= ~FLAG_NO_UNCACHED;
    if (kolo__negotiate_pending(rt))
        v[0] &= ~FLAG_NONE_PENDING;
    if (shutdown)
        BIT_CLR(v + rt->shut_word, (size_t)rt->rank);

    rc = rt->ops->allreduce(rt->ops_ctx, NULL, v, rt->nwords, sizeof(uint64_t),
                            band64, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return backend_failed(rt, rc, "allreduce of the readiness bits", detail,
                              err);

    rt->any_pending = !(v[0] & FLAG_NONE_PENDING);
    for (int r = 0; r < rt->size; r++)
        if (!BIT_GET(v + rt->shut_word, (size_t)r)) {
            *stop_rank = r;
            break;
        }

    /* Ready cached tensors, in bit order; then forget invalidated bits. */
    for (size_t b = 0; b < cap; b++) {
        if (BIT_GET(v + rt->hit_word, b) && rt->hits[b] != NULL) {
            kolo__cache_touch(&rt->cache, b);
            KOLO__CHECK(ready_push(rt, rt->hits[b], err));
            rt->hits[b] = NULL;
            rt->nhits--;
        }
    }
    for (size_t b = 0; b < cap; b++) {
        if (!BIT_GET(v + rt->inv_word, b)) {
            unhit(rt, b);
            kolo__cache_erase(&rt->cache, b);
        }
    }

    if (!(v[0] & FLAG_NO_UNCACHED))
        KOLO__CHECK(full_round(rt, err));
    rt->cycles++;
    return KOLO_OK;
}
