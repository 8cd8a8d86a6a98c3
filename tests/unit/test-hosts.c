/*
 * test-hosts.c — unit tests of ops/hosts.{h,c}: grouping the members of a
 * group by host.
 *
 * Why these tests: three users act on the grouping (whether a set reduces
 * hierarchically, the shared-memory/network split of ops/hier, the GPU
 * path's communicators), and a member placed in the wrong group connects
 * to the wrong peers: every rank waits for a partner that never comes. So
 * each case is checked from every member's point of view, against what a
 * reference written here from hosts.h's description says.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "hosts.h"
#include "unit.h"

/* The reference: plain counting, the way hosts.h describes the fields. */
static void check_all_members(const int *hosts, int size)
{
    for (int me = 0; me < size; me++) {
        kolo__hosts_t g;
        int nhosts = 0, distinct[64], mine = 0, before = 0, same = 1;

        ck_assert_int_eq(kolo__hosts_group(hosts, size, me, &g), 0);
        for (int i = 0; i < size; i++) {
            int k;
            for (k = 0; k < nhosts && distinct[k] != hosts[i]; k++)
                ;
            if (k == nhosts)
                distinct[nhosts++] = hosts[i];
            if (hosts[i] == hosts[me]) {
                ck_assert_int_lt(mine, g.nlocal);
                ck_assert_int_eq(g.local[mine], i);
                mine++;
                if (i < me)
                    before++;
                if (i == me)
                    ck_assert_int_eq(g.me_host, k);
            }
        }
        ck_assert_int_eq(g.nhosts, nhosts);
        ck_assert_int_eq(g.nlocal, mine);
        ck_assert_int_eq(g.me_local, before);
        for (int k = 0; k < nhosts; k++) {
            int here = 0, want = -1;
            for (int i = 0; i < size; i++)
                if (hosts[i] == distinct[k]) {
                    if (here == before)
                        want = i;
                    here++;
                }
            same &= here == mine;
            ck_assert_int_eq(g.cross[k], want);
        }
        ck_assert_int_eq(g.same, same);
        kolo__hosts_free(&g);
        ck_assert_ptr_null(g.local);
    }
}

/* The grouping of `hosts` from member me's point of view, after every
 * member's was checked against the reference. */
static kolo__hosts_t grouped(const int *hosts, int size, int me)
{
    kolo__hosts_t g;

    check_all_members(hosts, size);
    ck_assert_int_eq(kolo__hosts_group(hosts, size, me, &g), 0);
    return g;
}

START_TEST(one_host)
{
    int hosts[] = {3, 3, 3};
    kolo__hosts_t g = grouped(hosts, 3, 1);

    ck_assert_int_eq(g.nhosts, 1);
    ck_assert_int_eq(g.nlocal, 3);
    ck_assert_int_eq(g.me_local, 1);
    ck_assert_int_eq(g.cross[0], 1);
    ck_assert_int_eq(g.same, 1);
    kolo__hosts_free(&g);
}
END_TEST

START_TEST(two_by_two_interleaved)
{
    /* Hosts in order of first appearance: 7 is host 0, 5 is host 1. */
    int hosts[] = {7, 5, 7, 5};
    kolo__hosts_t g = grouped(hosts, 4, 3);

    ck_assert_int_eq(g.nhosts, 2);
    ck_assert_int_eq(g.me_host, 1);
    ck_assert_int_eq(g.me_local, 1);
    ck_assert_int_eq(g.local[0], 1);
    ck_assert_int_eq(g.local[1], 3);
    ck_assert_int_eq(g.cross[0], 2);
    ck_assert_int_eq(g.cross[1], 3);
    ck_assert_int_eq(g.same, 1);
    kolo__hosts_free(&g);
}
END_TEST

START_TEST(uneven_hosts)
{
    /* 3 + 1 + 2: nlocal * nhosts equals size on the third host, and still
     * the hosts are not even. */
    int hosts[] = {0, 0, 0, 1, 2, 2};
    kolo__hosts_t g = grouped(hosts, 6, 5);

    ck_assert_int_eq(g.nlocal * g.nhosts, 6);
    ck_assert_int_eq(g.same, 0);
    ck_assert_int_eq(g.cross[0], 1);
    ck_assert_int_eq(g.cross[1], -1); /* host 1 has one member only */
    ck_assert_int_eq(g.cross[2], 5);
    kolo__hosts_free(&g);
}
END_TEST

START_TEST(random_placements)
{
    unsigned seed = 12345;
    for (int round = 0; round < 200; round++) {
        int size = 1 + (int)(rand_r(&seed) % 16), hosts[16];
        int nh = 1 + (int)(rand_r(&seed) % 4);
        for (int i = 0; i < size; i++)
            hosts[i] = (int)(rand_r(&seed) % (unsigned)nh) * 10;
        check_all_members(hosts, size);
    }
}
END_TEST

KOLO_UNIT_MAIN("hosts", 30,
        one_host, two_by_two_interleaved, uneven_hosts, random_placements)
