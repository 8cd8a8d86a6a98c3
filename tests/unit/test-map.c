/*
 * test-map.c — unit tests of runtime/map.{h,c}: the open-addressing hash
 * map behind tensor names, handles and the response cache.
 *
 * Why these tests: every lookup of the runtime goes through this map, and
 * its two tricky parts are invisible from outside until they go wrong: the
 * growth that rehashes (and drops tombstones), and the tombstones themselves,
 * which must neither hide a live key further down a probe chain nor be
 * mistaken for one. So beside the plain put/get/del cases, the tests drive
 * many keys through growth, churn deletes and reinserts at a steady size
 * (which fills the table with tombstones and forces same-size rehashes),
 * and check every step against an independent model: a plain array of
 * which keys should be present.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "map.h"
#include "unit.h"

/* Distinct non-NULL values to store: addresses inside one array. */
static char values[100000];
#define VAL(i) ((void *)&values[(i)])

/* The map under test: every case starts with an empty one, freed after
 * it. */
static kolo__map_t m;

static void map_setup(void)
{
    kolo__map_init(&m);
}

static void map_teardown(void)
{
    kolo__map_free(&m);
}

static void key_of(int i, char *buf, size_t size)
{
    snprintf(buf, size, "tensor/%d/grad", i);
}

/* Puts the keys of 0 .. n - 1, key i with the value VAL(i). */
static void put_keys(int n)
{
    char key[64];

    for (int i = 0; i < n; i++) {
        key_of(i, key, sizeof key);
        ck_assert_int_eq(kolo__map_puts(&m, key, VAL(i)), 0);
    }
}

START_TEST(empty_map)
{
    size_t it = 0;

    ck_assert_ptr_null(kolo__map_gets(&m, "a"));
    ck_assert_ptr_null(kolo__map_dels(&m, "a"));
    ck_assert_int_eq(kolo__map_next(&m, &it, NULL, NULL), 0);
    ck_assert_uint_eq(m.count, 0);
    kolo__map_free(&m);
    /* Free leaves it reusable. */
    ck_assert_int_eq(kolo__map_puts(&m, "a", VAL(1)), 0);
    ck_assert_ptr_eq(kolo__map_gets(&m, "a"), VAL(1));
}
END_TEST

START_TEST(put_get_del)
{
    ck_assert_int_eq(kolo__map_puts(&m, "w1", VAL(1)), 0);
    ck_assert_int_eq(kolo__map_puts(&m, "w2", VAL(2)), 0);
    ck_assert_uint_eq(m.count, 2);
    ck_assert_ptr_eq(kolo__map_gets(&m, "w1"), VAL(1));
    ck_assert_ptr_eq(kolo__map_gets(&m, "w2"), VAL(2));
    ck_assert_ptr_null(kolo__map_gets(&m, "w3"));
    /* A prefix of a key is another key. */
    ck_assert_ptr_null(kolo__map_gets(&m, "w"));
    ck_assert_ptr_null(kolo__map_get(&m, "w1", 1));

    ck_assert_ptr_eq(kolo__map_dels(&m, "w1"), VAL(1));
    ck_assert_uint_eq(m.count, 1);
    ck_assert_ptr_null(kolo__map_gets(&m, "w1"));
    ck_assert_ptr_null(kolo__map_dels(&m, "w1"));
    ck_assert_ptr_eq(kolo__map_gets(&m, "w2"), VAL(2));
    ck_assert_ptr_eq(kolo__map_dels(&m, "w2"), VAL(2));
    ck_assert_uint_eq(m.count, 0);
    ck_assert_ptr_null(kolo__map_gets(&m, "w2"));
}
END_TEST

START_TEST(keys_are_copied)
{
    char key[16] = "layer.0";

    ck_assert_int_eq(kolo__map_puts(&m, key, VAL(7)), 0);
    /* The caller's buffer may change afterwards. */
    strcpy(key, "layer.1");
    ck_assert_ptr_null(kolo__map_gets(&m, "layer.1"));
    ck_assert_ptr_eq(kolo__map_gets(&m, "layer.0"), VAL(7));
}
END_TEST

START_TEST(replace_keeps_one_key)
{
    size_t it = 0, seen = 0;
    void *v;

    ck_assert_int_eq(kolo__map_puts(&m, "k", VAL(1)), 0);
    ck_assert_int_eq(kolo__map_puts(&m, "k", VAL(2)), 0);
    ck_assert_int_eq(kolo__map_puts(&m, "k", VAL(3)), 0);
    ck_assert_uint_eq(m.count, 1);
    ck_assert_ptr_eq(kolo__map_gets(&m, "k"), VAL(3));
    while (kolo__map_next(&m, &it, NULL, &v)) {
        ck_assert_ptr_eq(v, VAL(3));
        seen++;
    }
    ck_assert_uint_eq(seen, 1);
    ck_assert_ptr_eq(kolo__map_dels(&m, "k"), VAL(3));
    ck_assert_ptr_null(kolo__map_gets(&m, "k"));
}
END_TEST

START_TEST(many_keys_force_growth)
{
    enum { N = 20000 };
    char key[64];
    size_t caps_seen = 0, last_cap = 0;

    for (int i = 0; i < N; i++) {
        key_of(i, key, sizeof key);
        ck_assert_int_eq(kolo__map_puts(&m, key, VAL(i)), 0);
        if (m.cap != last_cap) {
            last_cap = m.cap;
            caps_seen++;
        }
        /* The load stays under 70%, so probes end. */
        ck_assert_msg(m.used * 10 < m.cap * 7, "load %zu/%zu after %d puts",
                      m.used, m.cap, i + 1);
        /* Every so often, check everything so far survived the rehashes. */
        if ((i & (i + 1)) == 0 || i == N - 1)
            for (int j = 0; j <= i; j++) {
                key_of(j, key, sizeof key);
                ck_assert_ptr_eq(kolo__map_gets(&m, key), VAL(j));
            }
    }
    ck_assert_uint_eq(m.count, N);
    ck_assert_uint_ge(caps_seen, 10); /* 16 .. 32768: it grew many times */
    ck_assert_uint_eq(m.cap & (m.cap - 1), 0);
    key_of(N, key, sizeof key);
    ck_assert_ptr_null(kolo__map_gets(&m, key));
}
END_TEST

START_TEST(delete_and_reinsert_through_tombstones)
{
    char key[64];

    put_keys(10);
    /* Delete the even keys: tombstones sit in the odd keys' probe chains. */
    for (int i = 0; i < 10; i += 2) {
        key_of(i, key, sizeof key);
        ck_assert_ptr_eq(kolo__map_dels(&m, key), VAL(i));
    }
    ck_assert_uint_eq(m.count, 5);
    ck_assert_uint_eq(m.used, 10); /* tombstones still count as used */
    for (int i = 0; i < 10; i++) {
        key_of(i, key, sizeof key);
        if (i % 2)
            ck_assert_ptr_eq(kolo__map_gets(&m, key), VAL(i));
        else
            ck_assert_ptr_null(kolo__map_gets(&m, key));
    }
    /* Reinsert with new values: each key is present exactly once. */
    for (int i = 0; i < 10; i += 2) {
        key_of(i, key, sizeof key);
        ck_assert_int_eq(kolo__map_puts(&m, key, VAL(100 + i)), 0);
    }
    /* Replacing a live key that sits past a tombstone must not add a
     * second copy of it in the tombstone. */
    for (int i = 1; i < 10; i += 2) {
        key_of(i, key, sizeof key);
        ck_assert_int_eq(kolo__map_puts(&m, key, VAL(200 + i)), 0);
    }
    ck_assert_uint_eq(m.count, 10);
    for (int i = 0; i < 10; i++) {
        key_of(i, key, sizeof key);
        ck_assert_ptr_eq(kolo__map_gets(&m, key),
                         VAL(i % 2 ? 200 + i : 100 + i));
    }
}
END_TEST

/* Churn: keep ~LIVE keys live while inserting and deleting far more keys
 * than the table has slots, so the table is rebuilt from tombstones many
 * times. A model array says what must be there at every step. */
START_TEST(churn_against_model)
{
    enum { KEYS = 3000, LIVE = 40, STEPS = 60000 };
    static unsigned char present[KEYS];
    static int value_of[KEYS];
    char key[64];
    unsigned seed = 12345;
    size_t live = 0, max_cap = 0;

    memset(present, 0, sizeof present);
    for (int step = 0; step < STEPS; step++) {
        int k;
        seed = seed * 1103515245u + 12345u;
        k = (int)((seed >> 8) % KEYS);
        key_of(k, key, sizeof key);
        if (present[k]) {
            ck_assert_ptr_eq(kolo__map_dels(&m, key), VAL(value_of[k]));
            present[k] = 0;
            live--;
        } else if (live < LIVE) {
            value_of[k] = step % 100000;
            ck_assert_int_eq(kolo__map_puts(&m, key, VAL(value_of[k])), 0);
            present[k] = 1;
            live++;
        } else {
            ck_assert_ptr_null(kolo__map_gets(&m, key));
            ck_assert_ptr_null(kolo__map_dels(&m, key));
        }
        ck_assert_uint_eq(m.count, live);
        if (m.cap > max_cap)
            max_cap = m.cap;
        if (step % 997 == 0)
            for (int j = 0; j < KEYS; j++) {
                key_of(j, key, sizeof key);
                if (present[j])
                    ck_assert_ptr_eq(kolo__map_gets(&m, key), VAL(value_of[j]));
                else
                    ck_assert_ptr_null(kolo__map_gets(&m, key));
            }
    }
    /* With at most 40 live keys the table must not have grown without
     * bound: tombstones are dropped by same-size rehashes. */
    ck_assert_uint_le(max_cap, 256);
}
END_TEST

START_TEST(iteration_visits_every_live_key_once)
{
    enum { N = 1000 };
    static int seen[N];
    char key[64];
    size_t it = 0, total = 0;
    const void *k;
    void *v;

    memset(seen, 0, sizeof seen);
    put_keys(N);
    for (int i = 0; i < N; i += 3) {
        key_of(i, key, sizeof key);
        ck_assert_ptr_nonnull(kolo__map_dels(&m, key));
    }
    while (kolo__map_next(&m, &it, &k, &v)) {
        int i = (int)((char *)v - values);
        ck_assert_int_ge(i, 0);
        ck_assert_int_lt(i, N);
        ck_assert_msg(i % 3 != 0, "deleted key %d visited", i);
        /* The key handed out is the key stored with that value. */
        key_of(i, key, sizeof key);
        ck_assert_mem_eq(k, key, strlen(key));
        seen[i]++;
        total++;
    }
    ck_assert_uint_eq(total, m.count);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(seen[i], i % 3 ? 1 : 0);
    /* The iterator stays at its end. */
    ck_assert_int_eq(kolo__map_next(&m, &it, &k, &v), 0);
}
END_TEST

START_TEST(binary_keys_with_nul_bytes)
{
    const char a[] = {'x', '\0', 'a'};
    const char b[] = {'x', '\0', 'b'};
    const char c[] = {'x', '\0'};
    const char d[] = {'\0'};
    int64_t id1 = 1, id256 = 256;

    ck_assert_int_eq(kolo__map_put(&m, a, sizeof a, VAL(1)), 0);
    ck_assert_int_eq(kolo__map_put(&m, b, sizeof b, VAL(2)), 0);
    ck_assert_int_eq(kolo__map_put(&m, c, sizeof c, VAL(3)), 0);
    ck_assert_int_eq(kolo__map_put(&m, d, sizeof d, VAL(4)), 0);
    ck_assert_int_eq(kolo__map_puts(&m, "x", VAL(5)), 0);
    ck_assert_uint_eq(m.count, 5);
    ck_assert_ptr_eq(kolo__map_get(&m, a, sizeof a), VAL(1));
    ck_assert_ptr_eq(kolo__map_get(&m, b, sizeof b), VAL(2));
    ck_assert_ptr_eq(kolo__map_get(&m, c, sizeof c), VAL(3));
    ck_assert_ptr_eq(kolo__map_get(&m, d, sizeof d), VAL(4));
    ck_assert_ptr_eq(kolo__map_gets(&m, "x"), VAL(5));
    ck_assert_ptr_null(kolo__map_get(&m, "x\0c", 3));

    /* Handles use the 8 bytes of an int64 id: mostly zero bytes. */
    ck_assert_int_eq(kolo__map_put(&m, &id1, sizeof id1, VAL(10)), 0);
    ck_assert_int_eq(kolo__map_put(&m, &id256, sizeof id256, VAL(11)), 0);
    ck_assert_ptr_eq(kolo__map_get(&m, &id1, sizeof id1), VAL(10));
    ck_assert_ptr_eq(kolo__map_get(&m, &id256, sizeof id256), VAL(11));

    ck_assert_ptr_eq(kolo__map_del(&m, b, sizeof b), VAL(2));
    ck_assert_ptr_eq(kolo__map_get(&m, a, sizeof a), VAL(1));
    ck_assert_ptr_null(kolo__map_get(&m, b, sizeof b));
}
END_TEST

START_TEST(empty_key)
{
    size_t it = 0;
    const void *k;
    void *v;

    ck_assert_ptr_null(kolo__map_gets(&m, ""));
    ck_assert_int_eq(kolo__map_puts(&m, "", VAL(9)), 0);
    ck_assert_int_eq(kolo__map_puts(&m, "a", VAL(8)), 0);
    ck_assert_ptr_eq(kolo__map_gets(&m, ""), VAL(9));
    ck_assert_ptr_eq(kolo__map_get(&m, "zzz", 0), VAL(9));
    ck_assert_uint_eq(m.count, 2);
    /* It iterates like any key. */
    {
        int found_empty = 0, n = 0;
        while (kolo__map_next(&m, &it, &k, &v)) {
            n++;
            if (v == VAL(9))
                found_empty++;
        }
        ck_assert_int_eq(n, 2);
        ck_assert_int_eq(found_empty, 1);
    }
    ck_assert_ptr_eq(kolo__map_dels(&m, ""), VAL(9));
    ck_assert_ptr_null(kolo__map_gets(&m, ""));
    ck_assert_ptr_eq(kolo__map_gets(&m, "a"), VAL(8));
}
END_TEST

/* A crowded table has long probe chains. Fill 16 slots up to just under
 * the growth point, then delete and reinsert keys in the middle of the
 * crowd, each time checking that every key is still found. */
START_TEST(full_table_probe_chains)
{
    char key[64];

    /* 16 slots hold 11 keys: the 11th insert sees (10+1)*10 < 16*7, the
     * 12th would see (11+1)*10 >= 112 and grow. */
    put_keys(11);
    ck_assert_uint_eq(m.cap, 16);
    for (int round = 0; round < 50; round++) {
        int i = round % 11;
        key_of(i, key, sizeof key);
        ck_assert_ptr_eq(kolo__map_dels(&m, key), VAL(i));
        ck_assert_ptr_null(kolo__map_gets(&m, key));
        ck_assert_int_eq(kolo__map_puts(&m, key, VAL(i)), 0);
        for (int j = 0; j < 11; j++) {
            key_of(j, key, sizeof key);
            ck_assert_ptr_eq(kolo__map_gets(&m, key), VAL(j));
        }
        ck_assert_uint_eq(m.count, 11);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("map");
    TCase *tc = kolo_unit_tcase(
        s, "core", 30,
        KOLO_UNIT_TESTS(empty_map, put_get_del, keys_are_copied,
                        replace_keeps_one_key, many_keys_force_growth,
                        delete_and_reinsert_through_tombstones,
                        churn_against_model,
                        iteration_visits_every_live_key_once,
                        binary_keys_with_nul_bytes, empty_key,
                        full_table_probe_chains));

    tcase_add_checked_fixture(tc, map_setup, map_teardown);
    return kolo_unit_run(s);
}
