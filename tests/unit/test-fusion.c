/*
 * test-fusion.c — unit tests of runtime/fusion.{h,c}: which ready tensors
 * are reduced together.
 *
 * Why these tests: every rank runs the planner on the same list and must
 * get the same batches, and the executor trusts the plan blindly: a tensor
 * missing from order[], or present twice, or a batch over the fusion
 * buffer's size, corrupts memory or loses a gradient. So the tests check the
 * small cases by exact expected plans, and then check the invariants on many
 * seeded random inputs:
 *  - order[] is a permutation of 0..n-1;
 *  - batches tile order[] in sequence, each non-empty;
 *  - a batch holds one key, its members in increasing input order, and its
 *    bytes field is the sum of its members;
 *  - a batch of more than one tensor stays within the threshold;
 *  - batches come in the order of their first members;
 *  - the plan equals the one of a reference planner written here from the
 *    description in fusion.h, and is the same when computed twice.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion.h"
#include "unit.h"

/* ck_assert_* reports every passing check to the parent process (one
 * write per check); the property test makes millions of checks, so its
 * inner loops use this instead: silent on success, a normal failure. */
#define REQUIRE(cond, ...)                                                    \
    do {                                                                      \
        if (!(cond))                                                          \
            ck_abort_msg(__VA_ARGS__);                                        \
    } while (0)

typedef struct plan {
    long nb;
    size_t *order;
    kolo__batch_t *batches;
} plan_t;

static plan_t plan_of(const kolo__fusion_item_t *items, size_t n,
                      int64_t threshold)
{
    plan_t p;
    /* Pre-fill with garbage: the planner must write what it returns. */
    p.order = malloc((n ? n : 1) * sizeof *p.order);
    p.batches = malloc((n ? n : 1) * sizeof *p.batches);
    ck_assert_ptr_nonnull(p.order);
    ck_assert_ptr_nonnull(p.batches);
    memset(p.order, 0xee, (n ? n : 1) * sizeof *p.order);
    memset(p.batches, 0xee, (n ? n : 1) * sizeof *p.batches);
    p.nb = kolo__fusion_plan(items, n, threshold, p.order, p.batches);
    return p;
}

static void plan_free(plan_t *p)
{
    free(p->order);
    free(p->batches);
}

/* Checks the invariants listed at the top; aborts with a description. */
static void check_invariants(const kolo__fusion_item_t *items, size_t n,
                             int64_t threshold, const plan_t *p)
{
    unsigned char *seen = calloc(n ? n : 1, 1);
    size_t pos = 0;

    ck_assert_ptr_nonnull(seen);
    ck_assert_int_ge(p->nb, n ? 1 : 0);
    ck_assert_int_le(p->nb, (long)n);
    for (long b = 0; b < p->nb; b++) {
        const kolo__batch_t *bt = &p->batches[b];
        int64_t sum = 0;
        REQUIRE(bt->first == pos, "batch %ld starts at %zu, expected %zu",
                      b, bt->first, pos);
        REQUIRE(bt->n >= 1, "batch %ld is empty", b);
        ck_assert_uint_le(bt->first + bt->n, n);
        for (size_t k = 0; k < bt->n; k++) {
            size_t i = p->order[bt->first + k];
            REQUIRE(i < n, "order[%zu] = %zu out of range", bt->first + k,
                          i);
            REQUIRE(!seen[i], "index %zu appears twice", i);
            seen[i] = 1;
            REQUIRE(items[i].key == items[p->order[bt->first]].key,
                          "batch %ld mixes keys", b);
            if (k > 0)
                REQUIRE(i > p->order[bt->first + k - 1],
                              "batch %ld members out of order", b);
            sum += items[i].bytes;
        }
        REQUIRE(bt->bytes == sum, "batch %ld bytes %lld, members %lld", b,
                      (long long)bt->bytes, (long long)sum);
        if (bt->n > 1)
            REQUIRE(sum <= threshold,
                          "batch %ld of %zu tensors holds %lld > %lld bytes", b,
                          bt->n, (long long)sum, (long long)threshold);
        if (b > 0)
            REQUIRE(p->order[bt->first] >
                              p->order[p->batches[b - 1].first],
                          "batch %ld opened before batch %ld", b, b - 1);
        pos += bt->n;
    }
    ck_assert_uint_eq(pos, n);
    for (size_t i = 0; i < n; i++)
        REQUIRE(seen[i], "index %zu missing", i);
    free(seen);
}

/* Expected plan, written as batches of input indices ending in -1 each,
 * the whole list ending in -2. */
static void expect_plan(const kolo__fusion_item_t *items, size_t n,
                        int64_t threshold, const int *want)
{
    plan_t p = plan_of(items, n, threshold);
    long b = 0;
    size_t pos = 0;

    check_invariants(items, n, threshold, &p);
    while (*want != -2) {
        REQUIRE(b < p.nb, "only %ld batches", p.nb);
        size_t k = 0;
        for (; *want >= 0; want++, k++) {
            REQUIRE(k < p.batches[b].n, "batch %ld has %zu members", b,
                          p.batches[b].n);
            REQUIRE(p.order[pos + k] == (size_t)*want,
                          "batch %ld member %zu is %zu, expected %d", b, k,
                          p.order[pos + k], *want);
        }
        REQUIRE(k == p.batches[b].n, "batch %ld has %zu members, not %zu",
                      b, p.batches[b].n, k);
        pos += k;
        b++;
        want++; /* the -1 */
    }
    ck_assert_int_eq(p.nb, b);
    plan_free(&p);
}

START_TEST(empty_input)
{
    size_t order[1] = {77};
    kolo__batch_t batches[1] = {{77, 77, 77}};
    ck_assert_int_eq(kolo__fusion_plan(NULL, 0, 100, order, batches), 0);
    ck_assert_int_eq(kolo__fusion_plan(NULL, 0, 0, order, batches), 0);
    ck_assert_uint_eq(order[0], 77);
    ck_assert_uint_eq(batches[0].n, 77);
}
END_TEST

START_TEST(one_item)
{
    kolo__fusion_item_t items[] = {{3, 40}};
    plan_t p = plan_of(items, 1, 100);
    ck_assert_int_eq(p.nb, 1);
    ck_assert_uint_eq(p.order[0], 0);
    ck_assert_uint_eq(p.batches[0].first, 0);
    ck_assert_uint_eq(p.batches[0].n, 1);
    ck_assert_int_eq(p.batches[0].bytes, 40);
    plan_free(&p);
    /* Alone even when larger than the threshold, or the threshold is 0. */
    p = plan_of(items, 1, 10);
    ck_assert_int_eq(p.nb, 1);
    ck_assert_int_eq(p.batches[0].bytes, 40);
    plan_free(&p);
    p = plan_of(items, 1, 0);
    ck_assert_int_eq(p.nb, 1);
    plan_free(&p);
}
END_TEST

START_TEST(one_key_all_fit)
{
    kolo__fusion_item_t items[] = {{1, 10}, {1, 20}, {1, 30}, {1, 5}};
    const int want[] = {0, 1, 2, 3, -1, -2};
    plan_t p;
    expect_plan(items, 4, 1000, want);
    p = plan_of(items, 4, 1000);
    ck_assert_int_eq(p.batches[0].bytes, 65);
    plan_free(&p);
    /* Exactly the sum also fits all in one batch. */
    expect_plan(items, 4, 65, want);
}
END_TEST

START_TEST(threshold_exactly_reached)
{
    /* 40 + 60 = 100 fills the first batch exactly; 1 starts the next. */
    kolo__fusion_item_t items[] = {{0, 40}, {0, 60}, {0, 1}, {0, 99}, {0, 1}};
    const int want[] = {0, 1, -1, 2, 3, -1, 4, -1, -2};
    expect_plan(items, 5, 100, want);
    /* One byte less and 60 no longer joins 40. */
    {
        const int want99[] = {0, -1, 1, 2, -1, 3, -1, 4, -1, -2};
        expect_plan(items, 5, 99, want99);
    }
}
END_TEST

START_TEST(item_larger_than_threshold_alone)
{
    kolo__fusion_item_t items[] = {{0, 10}, {0, 500}, {0, 10}, {0, 100},
                                   {0, 10}, {0, 10}};
    /* 500 > 100 goes alone; 100 == threshold fills a batch alone. */
    const int want[] = {0, -1, 1, -1, 2, -1, 3, -1, 4, 5, -1, -2};
    plan_t p;
    expect_plan(items, 6, 100, want);
    p = plan_of(items, 6, 100);
    ck_assert_int_eq(p.batches[1].bytes, 500);
    plan_free(&p);
}
END_TEST

START_TEST(threshold_zero_every_item_alone)
{
    kolo__fusion_item_t items[] = {{0, 4}, {0, 4}, {1, 0}, {1, 0}, {0, 8}};
    const int want[] = {0, -1, 1, -1, 2, -1, 3, -1, 4, -1, -2};
    expect_plan(items, 5, 0, want);
}
END_TEST

START_TEST(interleaved_keys_batch_per_key)
{
    /* Keys A=7 and B=9, interleaved: one batch per key, the batch of the
     * first tensor first, each keeping its members' relative order. */
    kolo__fusion_item_t items[] = {{7, 1}, {9, 1}, {9, 1}, {7, 1},
                                   {9, 1}, {7, 1}, {7, 1}};
    const int want[] = {0, 3, 5, 6, -1, 1, 2, 4, -1, -2};
    expect_plan(items, 7, 1000, want);
    {
        /* B first this time. */
        kolo__fusion_item_t rev[] = {{9, 1}, {7, 1}, {9, 1}, {7, 1}};
        const int want_rev[] = {0, 2, -1, 1, 3, -1, -2};
        expect_plan(rev, 4, 1000, want_rev);
    }
    {
        /* Three keys and a threshold that splits them: A fills at 3. */
        kolo__fusion_item_t three[] = {{1, 2}, {2, 2}, {1, 2}, {3, 2},
                                       {1, 2}, {2, 2}, {1, 2}};
        const int want3[] = {0, 2, -1, 1, 5, -1, 3, -1, 4, 6, -1, -2};
        expect_plan(three, 7, 5, want3);
    }
}
END_TEST

START_TEST(zero_byte_items)
{
    kolo__fusion_item_t items[] = {{0, 0}, {0, 0}, {0, 10}, {0, 0}};
    const int want[] = {0, 1, 2, 3, -1, -2};
    expect_plan(items, 4, 10, want);
}
END_TEST

/* ---- random property test ------------------------------------------------ */

static uint32_t rng = 1;
static uint32_t rnd(void)
{
    rng = rng * 1103515245u + 12345u;
    return rng >> 1;
}

/* The method of fusion.h, written plainly: for each tensor, look for the
 * open batch of its key; join it if the bytes fit, else close it and open a
 * new batch (which stays open only if something could still join it).
 * Batches are numbered in the order opened. Fills batch_of[i]. */
static size_t reference_plan(const kolo__fusion_item_t *items, size_t n,
                             int64_t threshold, size_t *batch_of)
{
    size_t nbatches = 0;
    long *open_of_key = malloc(256 * sizeof *open_of_key); /* keys < 256 */
    int64_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    ck_assert_ptr_nonnull(open_of_key);
    ck_assert_ptr_nonnull(bytes);
    for (int k = 0; k < 256; k++)
        open_of_key[k] = -1;
    for (size_t i = 0; i < n; i++) {
        long o = open_of_key[items[i].key];
        if (o >= 0 && bytes[o] + items[i].bytes <= threshold) {
            bytes[o] += items[i].bytes;
            batch_of[i] = (size_t)o;
            continue;
        }
        bytes[nbatches] = items[i].bytes;
        batch_of[i] = nbatches;
        open_of_key[items[i].key] =
            items[i].bytes < threshold ? (long)nbatches : -1;
        nbatches++;
    }
    free(open_of_key);
    free(bytes);
    return nbatches;
}

START_TEST(random_plans_keep_invariants)
{
    enum { ROUNDS = 3000 };
    size_t max_batch_seen = 0;

    rng = 20240601;
    for (int round = 0; round < ROUNDS; round++) {
        size_t n = rnd() % 200, *batch_of;
        uint32_t nkeys = 1 + rnd() % 6;
        int64_t threshold;
        kolo__fusion_item_t *items = malloc((n ? n : 1) * sizeof *items);
        plan_t p, q;

        ck_assert_ptr_nonnull(items);
        switch (rnd() % 5) {
        case 0: threshold = 0; break;
        case 1: threshold = 1 + rnd() % 64; break;
        case 2: threshold = 1000; break;
        case 3: threshold = (int64_t)128 << 20; break;
        default: threshold = rnd() % 5000; break;
        }
        for (size_t i = 0; i < n; i++) {
            items[i].key = (rnd() % nkeys) * 37 % 251;
            switch (rnd() % 6) {
            case 0: items[i].bytes = 0; break;
            case 1: items[i].bytes = threshold; break;
            case 2: items[i].bytes = threshold + 1 + rnd() % 100; break;
            case 3: items[i].bytes = (int64_t)(rnd() % 8) * 4; break;
            default: items[i].bytes = rnd() % (threshold / 3 + 2); break;
            }
        }
        p = plan_of(items, n, threshold);
        check_invariants(items, n, threshold, &p);

        /* Equal to the reference planner, batch for batch. */
        batch_of = malloc((n ? n : 1) * sizeof *batch_of);
        ck_assert_ptr_nonnull(batch_of);
        ck_assert_int_eq(p.nb, (long)reference_plan(items, n, threshold,
                                                    batch_of));
        for (long b = 0; b < p.nb; b++) {
            for (size_t k = 0; k < p.batches[b].n; k++)
                REQUIRE(batch_of[p.order[p.batches[b].first + k]] ==
                                  (size_t)b,
                              "round %d: tensor %zu in batch %ld, reference "
                              "says %zu",
                              round, p.order[p.batches[b].first + k], b,
                              batch_of[p.order[p.batches[b].first + k]]);
            if (p.batches[b].n > max_batch_seen)
                max_batch_seen = p.batches[b].n;
        }
        /* With threshold 0 every tensor is alone. */
        if (threshold == 0)
            ck_assert_int_eq(p.nb, (long)n);

        /* A pure function: the same input gives the same plan. */
        q = plan_of(items, n, threshold);
        ck_assert_int_eq(q.nb, p.nb);
        if (n) {
            ck_assert_mem_eq(q.order, p.order, n * sizeof *p.order);
            ck_assert_mem_eq(q.batches, p.batches,
                             (size_t)p.nb * sizeof *p.batches);
        }
        plan_free(&q);
        plan_free(&p);
        free(batch_of);
        free(items);
    }
    ck_assert_uint_gt(max_batch_seen, 20); /* real fusion happened */
}
END_TEST

KOLO_UNIT_MAIN("fusion", 30,
        empty_input, one_item, one_key_all_fit, threshold_exactly_reached,
        item_larger_than_threshold_alone, threshold_zero_every_item_alone,
        interleaved_keys_batch_per_key, zero_byte_items,
        random_plans_keep_invariants)
