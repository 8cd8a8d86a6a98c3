/*
 * test-cache.c — unit tests of runtime/cache.{h,c}: the response cache.
 *
 * Why these tests: the cache is only correct if it is identical on every
 * rank, since ranks exchange bit indices instead of names. The bit a name
 * gets and the entry evicted when the cache is full must therefore be a
 * function of the sequence of put / touch / erase calls alone. Beside the
 * single-call contracts (miss, hit, mismatch on any one parameter, the
 * shape, root and scales included, lowest free bit, replace keeps the bit,
 * LRU eviction, erase), the tests feed two caches one long seeded random
 * sequence of calls and check they end identical, and check each step of
 * that sequence against an independent model of the cache written here
 * (arrays and a linear scan, no hash map).
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "unit.h"

/* ck_assert_* reports every passing check to the parent process (one
 * write per check); the long random test uses this instead in its loop:
 * silent on success, a normal failure otherwise. */
#define REQUIRE(cond, ...)                                                    \
    do {                                                                      \
        if (!(cond))                                                          \
            ck_abort_msg(__VA_ARGS__);                                        \
    } while (0)

static kolo__params_t params(int64_t count)
{
    kolo__params_t p;
    kolo__params_init(&p, KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM,
                      count);
    return p;
}

/* put that must succeed; returns the bit. */
static size_t put_ok(kolo__cache_t *c, const char *name, int64_t count,
                     int expect_evicted)
{
    kolo__params_t p = params(count);
    size_t bit = SIZE_MAX;
    int evicted = -1;
    ck_assert_int_eq(kolo__cache_put(c, name, &p, &bit, &evicted), 0);
    ck_assert_int_eq(evicted, expect_evicted);
    ck_assert_uint_lt(bit, c->capacity);
    return bit;
}

static kolo__cache_result_t lookup(const kolo__cache_t *c, const char *name,
                                   int64_t count, size_t *bit)
{
    kolo__params_t p = params(count);
    return kolo__cache_lookup(c, name, &p, bit);
}

/* A lookup of (name, count) that must hit; the entry's bit. */
static size_t expect_hit(const kolo__cache_t *c, const char *name,
                         int64_t count)
{
    size_t bit = SIZE_MAX;
    ck_assert_int_eq(lookup(c, name, count, &bit), KOLO__CACHE_HIT);
    return bit;
}

/* A lookup of (name, count) that must miss. */
static void expect_miss(const kolo__cache_t *c, const char *name,
                        int64_t count)
{
    size_t bit;
    ck_assert_int_eq(lookup(c, name, count, &bit), KOLO__CACHE_MISS);
}

START_TEST(miss_hit_mismatch)
{
    kolo__cache_t c;
    kolo__params_t p;
    size_t bit = 12345;

    ck_assert_int_eq(kolo__cache_init(&c, 8), 0);
    ck_assert_int_eq(lookup(&c, "w", 10, &bit), KOLO__CACHE_MISS);
    ck_assert_uint_eq(bit, 12345); /* untouched on a miss */
    ck_assert_uint_eq(put_ok(&c, "w", 10, 0), 0);
    ck_assert_uint_eq(c.count, 1);

    ck_assert_uint_eq(expect_hit(&c, "w", 10), 0);
    /* Same name, any other parameter: mismatch, with the cached bit. */
    bit = 99;
    ck_assert_int_eq(lookup(&c, "w", 11, &bit), KOLO__CACHE_MISMATCH);
    ck_assert_uint_eq(bit, 0);
    p = params(10);
    p.dtype = KOLO_FLOAT16;
    bit = 99;
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &p, &bit), KOLO__CACHE_MISMATCH);
    ck_assert_uint_eq(bit, 0);
    p = params(10);
    p.op = KOLO_OP_AVERAGE;
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &p, &bit), KOLO__CACHE_MISMATCH);
    p = params(10);
    p.coll = KOLO__COLL_BROADCAST;
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &p, &bit), KOLO__CACHE_MISMATCH);
    /* Other names, including prefixes and extensions, miss. */
    expect_miss(&c, "", 10);
    expect_miss(&c, "w ", 10);
    expect_miss(&c, "W", 10);
    /* Lookup changes nothing. */
    ck_assert_uint_eq(c.count, 1);
    ck_assert_int_eq(kolo__cache_at(&c, 0)->params.count, 10);
    kolo__cache_free(&c);
}
END_TEST

/* The version-2 parameters count too: a tensor cached with one shape,
 * root or scale and enqueued again with another is a mismatch (negotiated
 * afresh), never a hit on the stale entry. */
START_TEST(new_params_fields_mismatch)
{
    kolo__cache_t c;
    kolo__params_t base, p;
    size_t bit;
    int evicted;

    ck_assert_int_eq(kolo__cache_init(&c, 4), 0);
    kolo__params_init(&base, KOLO__COLL_BROADCAST, KOLO_FLOAT32, KOLO_OP_SUM,
                      6);
    base.ndim = 2;
    base.shape[0] = 2;
    base.shape[1] = 3;
    base.root = 1;
    base.prescale = 0.5;
    ck_assert_int_eq(kolo__cache_put(&c, "w", &base, &bit, &evicted), 0);
    ck_assert_uint_eq(bit, 0);
    ck_assert_int_eq(put_ok(&c, "other", 6, 0), 1);

    p = base;
    bit = 99;
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &p, &bit), KOLO__CACHE_HIT);
    ck_assert_uint_eq(bit, 0);

#define MISMATCHES(stmt)                                                      \
    do {                                                                      \
        p = base;                                                             \
        stmt;                                                                 \
        bit = 99;                                                             \
        ck_assert_msg(kolo__cache_lookup(&c, "w", &p, &bit) ==                \
                          KOLO__CACHE_MISMATCH,                               \
                      "not a mismatch after: %s", #stmt);                     \
        ck_assert_uint_eq(bit, 0);                                            \
    } while (0)
    /* Each one alone. */
    MISMATCHES(p.prescale = 0.25);
    MISMATCHES(p.prescale = 1.0);
    MISMATCHES(p.postscale = 2.0);
    MISMATCHES(p.shape[0] = 3; p.shape[1] = 2); /* same count, other shape */
    MISMATCHES(p.shape[1] = 4);
    MISMATCHES(p.ndim = 3; p.shape[2] = 1);
    MISMATCHES(p.root = 0);
    MISMATCHES(p.root = -1);
    MISMATCHES(p.wire = KOLO_FLOAT16);
    MISMATCHES(p.group = 2; strcpy(p.group_key, "w"));
#undef MISMATCHES

    /* A mismatching put replaces the entry under the same bit: then the
     * new parameters hit and the old ones mismatch. */
    p = base;
    p.root = 0;
    ck_assert_int_eq(kolo__cache_put(&c, "w", &p, &bit, &evicted), 0);
    ck_assert_uint_eq(bit, 0);
    ck_assert_int_eq(evicted, 0);
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &p, &bit), KOLO__CACHE_HIT);
    ck_assert_int_eq(kolo__cache_lookup(&c, "w", &base, &bit),
                     KOLO__CACHE_MISMATCH);
    ck_assert_int_eq(kolo__cache_at(&c, 0)->params.root, 0);
    ck_assert(kolo__cache_at(&c, 0)->params.prescale == 0.5);
    ck_assert_int_eq(kolo__cache_at(&c, 0)->params.shape[1], 3);
    /* The other entry was not disturbed. */
    ck_assert_uint_eq(expect_hit(&c, "other", 6), 1);
    kolo__cache_free(&c);
}
END_TEST

START_TEST(put_returns_lowest_free_bit)
{
    kolo__cache_t c;
    char name[32];

    ck_assert_int_eq(kolo__cache_init(&c, 6), 0);
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "t%d", i);
        ck_assert_uint_eq(put_ok(&c, name, i, 0), (size_t)i);
    }
    ck_assert_uint_eq(c.count, 6);
    /* Free bits 4 and 1: the next puts take 1, then 4. */
    kolo__cache_erase(&c, 4);
    kolo__cache_erase(&c, 1);
    ck_assert_uint_eq(c.count, 4);
    ck_assert_uint_eq(put_ok(&c, "new-a", 100, 0), 1);
    ck_assert_uint_eq(put_ok(&c, "new-b", 101, 0), 4);
    ck_assert_uint_eq(c.count, 6);
    ck_assert_str_eq(kolo__cache_at(&c, 1)->name, "new-a");
    ck_assert_str_eq(kolo__cache_at(&c, 4)->name, "new-b");
    kolo__cache_free(&c);
}
END_TEST

/* A cache of `capacity` entries holding the first n of "a", "b", "c", ...
 * with counts 1, 2, 3, ..., put in that order into bits 0, 1, 2, ... */
static void cache_with(kolo__cache_t *c, size_t capacity, int n)
{
    ck_assert_int_eq(kolo__cache_init(c, capacity), 0);
    for (int i = 0; i < n; i++) {
        char name[2] = {(char)('a' + i), '\0'};
        ck_assert_uint_eq(put_ok(c, name, i + 1, 0), (size_t)i);
    }
}

START_TEST(put_existing_name_replaces_params_keeps_bit)
{
    kolo__cache_t c;
    size_t bit;

    cache_with(&c, 4, 3);
    ck_assert_uint_eq(put_ok(&c, "b", 20, 0), 1);
    ck_assert_uint_eq(c.count, 3);
    ck_assert_uint_eq(expect_hit(&c, "b", 20), 1);
    ck_assert_int_eq(lookup(&c, "b", 2, &bit), KOLO__CACHE_MISMATCH);
    ck_assert_int_eq(kolo__cache_at(&c, 1)->params.count, 20);
    /* Replacing in a full cache evicts nothing. */
    put_ok(&c, "d", 4, 0);
    ck_assert_uint_eq(c.count, 4);
    ck_assert_uint_eq(put_ok(&c, "a", 10, 0), 0);
    ck_assert_uint_eq(c.count, 4);
    kolo__cache_free(&c);
}
END_TEST

START_TEST(full_cache_evicts_lru)
{
    kolo__cache_t c;

    cache_with(&c, 3, 3);
    /* "a" is the least recently used: evicted, its bit reused. */
    ck_assert_uint_eq(put_ok(&c, "d", 4, 1), 0);
    ck_assert_uint_eq(c.count, 3);
    expect_miss(&c, "a", 1);
    ck_assert_uint_eq(expect_hit(&c, "d", 4), 0);
    /* Now "b" is the oldest. */
    ck_assert_uint_eq(put_ok(&c, "e", 5, 1), 1);
    expect_miss(&c, "b", 2);
    expect_hit(&c, "c", 3);
    kolo__cache_free(&c);
}
END_TEST

START_TEST(touch_changes_lru)
{
    kolo__cache_t c;

    cache_with(&c, 3, 3);
    kolo__cache_touch(&c, 0); /* a is now the most recent: b is LRU */
    ck_assert_uint_eq(put_ok(&c, "d", 4, 1), 1);
    expect_miss(&c, "b", 2);
    expect_hit(&c, "a", 1);
    /* Order of use now: c, a, d. Touch c and a: d is LRU. */
    kolo__cache_touch(&c, 2);
    kolo__cache_touch(&c, 0);
    ck_assert_uint_eq(put_ok(&c, "e", 5, 1), 1);
    expect_miss(&c, "d", 4);
    /* A replacing put counts as a use: c, a, e -> put(c) -> a is LRU. */
    ck_assert_uint_eq(put_ok(&c, "c", 33, 0), 2);
    ck_assert_uint_eq(put_ok(&c, "f", 6, 1), 0);
    expect_miss(&c, "a", 1);
    expect_hit(&c, "c", 33);
    expect_hit(&c, "e", 5);
    expect_hit(&c, "f", 6);
    /* Touching a free or out-of-range bit is a no-op. */
    kolo__cache_erase(&c, 1);
    {
        uint64_t clock = c.clock;
        kolo__cache_touch(&c, 1);
        kolo__cache_touch(&c, 3);
        kolo__cache_touch(&c, SIZE_MAX);
        ck_assert_uint_eq(c.clock, clock);
    }
    ck_assert_ptr_null(kolo__cache_at(&c, 1));
    kolo__cache_free(&c);
}
END_TEST

START_TEST(erase_frees_bit_and_name)
{
    kolo__cache_t c;

    cache_with(&c, 2, 2);
    kolo__cache_erase(&c, 0);
    ck_assert_uint_eq(c.count, 1);
    ck_assert_ptr_null(kolo__cache_at(&c, 0));
    expect_miss(&c, "a", 1);
    /* The freed bit is reused without eviction, even by the same name. */
    ck_assert_uint_eq(put_ok(&c, "a", 7, 0), 0);
    expect_hit(&c, "a", 7);
    expect_hit(&c, "b", 2);
    /* Erasing a free or out-of-range bit changes nothing. */
    kolo__cache_erase(&c, 0);
    kolo__cache_erase(&c, 0);
    ck_assert_uint_eq(c.count, 1);
    kolo__cache_erase(&c, 2);
    kolo__cache_erase(&c, SIZE_MAX);
    ck_assert_uint_eq(c.count, 1);
    ck_assert_str_eq(kolo__cache_at(&c, 1)->name, "b");
    ck_assert_ptr_null(kolo__cache_at(&c, 2));
    kolo__cache_erase(&c, 1);
    ck_assert_uint_eq(c.count, 0);
    ck_assert_uint_eq(c.index.count, 0);
    expect_miss(&c, "b", 2);
    kolo__cache_free(&c);
}
END_TEST

START_TEST(capacity_zero)
{
    kolo__cache_t c;
    kolo__params_t p = params(1);
    size_t bit = 77;
    int evicted = -1;

    ck_assert_int_eq(kolo__cache_init(&c, 0), 0);
    ck_assert_int_eq(kolo__cache_put(&c, "a", &p, &bit, &evicted), -1);
    ck_assert_int_eq(evicted, 0);
    ck_assert_uint_eq(bit, 77);
    ck_assert_int_eq(kolo__cache_lookup(&c, "a", &p, &bit), KOLO__CACHE_MISS);
    ck_assert_ptr_null(kolo__cache_at(&c, 0));
    kolo__cache_touch(&c, 0);
    kolo__cache_erase(&c, 0);
    ck_assert_uint_eq(c.count, 0);
    kolo__cache_free(&c);
}
END_TEST

START_TEST(capacity_one)
{
    kolo__cache_t c;

    ck_assert_int_eq(kolo__cache_init(&c, 1), 0);
    ck_assert_uint_eq(put_ok(&c, "a", 1, 0), 0);
    ck_assert_uint_eq(put_ok(&c, "a", 2, 0), 0);
    ck_assert_uint_eq(put_ok(&c, "b", 3, 1), 0);
    expect_miss(&c, "a", 2);
    expect_hit(&c, "b", 3);
    ck_assert_uint_eq(c.count, 1);
    kolo__cache_free(&c);
}
END_TEST

/* ---- determinism and a model ------------------------------------------- */

/* An independent model: per bit, a name (empty: free), a count and a
 * last-use stamp; put scans for the name, then for the lowest free bit,
 * then for the smallest stamp. */
#define MODEL_CAP 16
typedef struct model {
    char name[MODEL_CAP][16];
    int64_t count[MODEL_CAP];
    uint64_t stamp[MODEL_CAP];
    uint64_t clock;
} model_t;

static size_t model_put(model_t *m, const char *name, int64_t count,
                        int *evicted)
{
    size_t i, oldest = 0;
    *evicted = 0;
    for (i = 0; i < MODEL_CAP; i++)
        if (strcmp(m->name[i], name) == 0)
            goto store;
    for (i = 0; i < MODEL_CAP; i++)
        if (m->name[i][0] == '\0')
            goto store;
    for (i = 1; i < MODEL_CAP; i++)
        if (m->stamp[i] < m->stamp[oldest])
            oldest = i;
    i = oldest;
    *evicted = 1;
store:
    strcpy(m->name[i], name);
    m->count[i] = count;
    m->stamp[i] = ++m->clock;
    return i;
}

static int model_find(const model_t *m, const char *name)
{
    for (int i = 0; i < MODEL_CAP; i++)
        if (strcmp(m->name[i], name) == 0)
            return i;
    return -1;
}

static void assert_caches_equal(const kolo__cache_t *a, const kolo__cache_t *b)
{
    REQUIRE(a->capacity == b->capacity && a->count == b->count &&
                a->clock == b->clock,
            "caches differ: capacity %zu/%zu, count %zu/%zu, clock %llu/%llu",
            a->capacity, b->capacity, a->count, b->count,
            (unsigned long long)a->clock, (unsigned long long)b->clock);
    for (size_t i = 0; i < a->capacity; i++) {
        const kolo__cache_entry_t *x = kolo__cache_at(a, i),
                                  *y = kolo__cache_at(b, i);
        REQUIRE((x == NULL) == (y == NULL), "bit %zu used in one cache only",
                i);
        if (x == NULL)
            continue;
        REQUIRE(strcmp(x->name, y->name) == 0, "bit %zu: '%s' vs '%s'", i,
                x->name, y->name);
        REQUIRE(kolo__params_equal(&x->params, &y->params),
                "bit %zu: params differ", i);
        REQUIRE(x->last_use == y->last_use, "bit %zu: last use %llu vs %llu",
                i, (unsigned long long)x->last_use,
                (unsigned long long)y->last_use);
    }
}

START_TEST(same_calls_give_identical_caches)
{
    enum { STEPS = 20000, NAMES = 40 };
    kolo__cache_t a, b;
    model_t *model = calloc(1, sizeof *model);
    uint32_t seed = 2024;
    int evictions = 0;

    ck_assert_ptr_nonnull(model);
    ck_assert_int_eq(kolo__cache_init(&a, MODEL_CAP), 0);
    ck_assert_int_eq(kolo__cache_init(&b, MODEL_CAP), 0);
    for (int step = 0; step < STEPS; step++) {
        char name[16];
        uint32_t op;
        seed = seed * 1664525u + 1013904223u;
        op = (seed >> 24) % 10;
        snprintf(name, sizeof name, "g%u", (seed >> 8) % NAMES);
        if (op < 5) {
            kolo__params_t p = params((seed >> 4) % 3);
            size_t ba = SIZE_MAX, bb = SIZE_MAX, bm;
            int ea = -1, eb = -1, em;
            REQUIRE(kolo__cache_put(&a, name, &p, &ba, &ea) == 0 &&
                        kolo__cache_put(&b, name, &p, &bb, &eb) == 0,
                    "step %d: put('%s') failed", step, name);
            bm = model_put(model, name, p.count, &em);
            REQUIRE(ba == bb && ea == eb,
                    "step %d: put('%s'): bit %zu/%zu, evicted %d/%d", step,
                    name, ba, bb, ea, eb);
            REQUIRE(ba == bm && ea == em,
                    "step %d: put('%s'): bit %zu evicted %d, model says bit "
                    "%zu evicted %d",
                    step, name, ba, ea, bm, em);
            evictions += ea;
        } else if (op < 8) {
            size_t bit = (seed >> 3) % (MODEL_CAP + 2); /* a few out of range */
            kolo__cache_touch(&a, bit);
            kolo__cache_touch(&b, bit);
            if (bit < MODEL_CAP && model->name[bit][0] != '\0')
                model->stamp[bit] = ++model->clock;
        } else {
            size_t bit = (seed >> 3) % (MODEL_CAP + 2);
            kolo__cache_erase(&a, bit);
            kolo__cache_erase(&b, bit);
            if (bit < MODEL_CAP)
                model->name[bit][0] = '\0';
        }
        assert_caches_equal(&a, &b);
        /* The cache agrees with the model on every bit and name. */
        for (size_t i = 0; i < MODEL_CAP; i++) {
            const kolo__cache_entry_t *e = kolo__cache_at(&a, i);
            if (model->name[i][0] == '\0') {
                REQUIRE(e == NULL, "step %d: bit %zu should be free", step, i);
            } else {
                REQUIRE(e != NULL && strcmp(e->name, model->name[i]) == 0 &&
                            e->params.count == model->count[i],
                        "step %d: bit %zu should hold '%s' count %lld", step,
                        i, model->name[i], (long long)model->count[i]);
            }
        }
        for (int k = 0; k < NAMES; k += 7) {
            char other[16];
            size_t bit;
            int where;
            snprintf(other, sizeof other, "g%d", k);
            where = model_find(model, other);
            if (where < 0) {
                REQUIRE(lookup(&a, other, 0, &bit) == KOLO__CACHE_MISS,
                        "step %d: '%s' should miss", step, other);
            } else {
                REQUIRE(lookup(&a, other, model->count[where], &bit) ==
                                KOLO__CACHE_HIT &&
                            bit == (size_t)where,
                        "step %d: '%s' should hit at bit %d", step, other,
                        where);
            }
        }
    }
    ck_assert_int_gt(evictions, 100); /* eviction was exercised */
    kolo__cache_free(&a);
    kolo__cache_free(&b);
    free(model);
}
END_TEST

KOLO_UNIT_MAIN("cache", 30,
        miss_hit_mismatch, new_params_fields_mismatch,
        put_returns_lowest_free_bit,
        put_existing_name_replaces_params_keeps_bit, full_cache_evicts_lru,
        touch_changes_lru, erase_frees_bit_and_name, capacity_zero,
        capacity_one, same_calls_give_identical_caches)
