/*
 * test-elastic.c — unit tests of runtime/elastic.{h,c}: a worker's place
 * in a generation kolorun published, and joining one through a file
 * rendezvous.
 *
 * Why these tests: every worker derives its rank, local and cross places
 * from the member list on its own; two workers that read the same list
 * differently connect to the wrong peers or disagree on KOLO_CROSS_SIZE,
 * and the job cannot re-form. So each list is checked from every member's
 * point of view against a reference written here, and joining is checked
 * for each answer kolo_init can give: a place, removed, ended, timed out.
 */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elastic.h"
#include "unit.h"

static const char *ids[] = {"localhost:0", "localhost:1", "127.0.0.1:0",
                            "localhost:2", "127.0.0.1:1", "h3:0"};

START_TEST(places_of_every_member)
{
    const char *list = "localhost:0\nlocalhost:1\n127.0.0.1:0\n\nlocalhost:2\r\n"
                       "127.0.0.1:1\nh3:0\n";
    /* host index, by order of first appearance: localhost 0, 127.0.0.1 1,
     * h3 2. */
    const int host[] = {0, 0, 1, 0, 1, 2}, local[] = {0, 1, 0, 2, 1, 0};
    const int lsize[] = {3, 3, 2, 3, 2, 1};

    for (int r = 0; r < 6; r++) {
        kolo__elastic_place_t p;
        ck_assert_int_eq(kolo__elastic_place(list, ids[r], &p), 0);
        ck_assert_int_eq(p.rank, r);
        ck_assert_int_eq(p.size, 6);
        ck_assert_int_eq(p.local_rank, local[r]);
        ck_assert_int_eq(p.local_size, lsize[r]);
        ck_assert_int_eq(p.cross_rank, host[r]);
        ck_assert_int_eq(p.cross_size, 3);
    }
}
END_TEST

START_TEST(absent_and_prefixes)
{
    kolo__elastic_place_t p;

    /* "localhost:1" is not "localhost:10", nor "localhost:1" a prefix. */
    ck_assert_int_eq(kolo__elastic_place("localhost:10\nlocalhost:0\n",
                                         "localhost:1", &p), -1);
    ck_assert_int_eq(kolo__elastic_place("", "localhost:0", &p), -1);
    ck_assert_int_eq(kolo__elastic_place("a:b:0\na:b:1\n", "a:b:1", &p), 0);
    ck_assert_int_eq(p.local_rank, 1); /* the host is "a:b" */
}
END_TEST

static char dir[256];

static void put(const char *name, const char *text)
{
    char path[512];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Publishes generation g as the driver does: its members (one per line)
 * and its update, then the generation's number. */
static void publish(int g, const char *members, const char *update)
{
    char name[64], number[32];

    snprintf(name, sizeof(name), "elastic.%d.members", g);
    put(name, members);
    snprintf(name, sizeof(name), "elastic.%d.update", g);
    put(name, update);
    snprintf(number, sizeof(number), "%d\n", g);
    put("elastic.generation", number);
}

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kolo-test-elastic.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(join_answers)
{
    char rdv[300];
    kolo__elastic_place_t p;
    kolo__err_t err;

    setup();
    snprintf(rdv, sizeof(rdv), "file:%s", dir);
    /* Nothing published: a bounded wait. */
    ck_assert_int_eq(kolo__elastic_join(rdv, "h:0", 0, 0.2, &p, &err),
                     KOLO_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "KOLO_ELASTIC_TIMEOUT"));
    publish(1, "h:0\nh:1\n", "start\n");
    ck_assert_int_eq(kolo__elastic_join(rdv, "h:1", 0, 1, &p, &err), KOLO_OK);
    ck_assert_int_eq(p.generation, 1);
    ck_assert_int_eq(p.rank, 1);
    ck_assert_str_eq(p.update, "start");
    /* Joined 1 already: waits for a newer one. */
    ck_assert_int_eq(kolo__elastic_join(rdv, "h:1", 1, 0.2, &p, &err),
                     KOLO_ERR_TIMEOUT);
    ck_assert_int_eq(kolo__elastic_updates(rdv, 1), 0);
    publish(2, "h:0\n", "removed\n");
    ck_assert_int_eq(kolo__elastic_updates(rdv, 1), KOLO__ELASTIC_REMOVED);
    ck_assert_int_eq(kolo__elastic_join(rdv, "h:1", 1, 1, &p, &err),
                     KOLO_ERR_REMOVED);
    ck_assert_ptr_nonnull(strstr(err.msg, "h:1 has been removed"));
    publish(3, "h:0\nh2:0\n", "added\n");
    ck_assert_int_eq(kolo__elastic_updates(rdv, 2), KOLO__ELASTIC_ADDED);
    ck_assert_int_eq(kolo__elastic_updates(rdv, 1),
                     KOLO__ELASTIC_ADDED | KOLO__ELASTIC_REMOVED);
    put("elastic.end", "every rank failed\n");
    ck_assert_int_eq(kolo__elastic_join(rdv, "h:0", 3, 5, &p, &err),
                     KOLO_ERR_SHUTDOWN);
    ck_assert_ptr_nonnull(strstr(err.msg, "every rank failed"));
    ck_assert_int_eq(kolo__elastic_join(rdv, "", 0, 1, &p, &err),
                     KOLO_ERR_CONFIG);
    kolo__elastic_close();
    teardown();
}
END_TEST

KOLO_UNIT_MAIN("elastic", 30,
        places_of_every_member, absent_and_prefixes, join_answers)
