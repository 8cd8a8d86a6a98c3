/*
 * test-env.c — unit tests of runtime/env.{h,c}: the KOLO_* configuration.
 *
 * Why these tests: a bad variable must stop kolo_init with a message that
 * names the variable (and the bad value), never be silently replaced by a
 * default; and the defaults must be the ones kolo.h documents. The variables
 * come from a table passed through kolo__config_load's getenv hook, so the
 * tests never touch the process environment.
 */
#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "launchenv.h"
#include "unit.h"

/* ---- a fake environment ------------------------------------------------ */

#define MAX_VARS 32
static char fake_names[MAX_VARS][64];
static const char *fake_values[MAX_VARS];
static int fake_n;
static int fake_lookups_of_unknown; /* names outside KOLO_* and HOROVOD_* */

static void fake_reset(void)
{
    fake_n = 0;
    fake_lookups_of_unknown = 0;
}

/* Sets (or replaces) one variable; the value is kept by reference. */
static void fake_set(const char *name, const char *value)
{
    for (int i = 0; i < fake_n; i++)
        if (strcmp(fake_names[i], name) == 0) {
            fake_values[i] = value;
            return;
        }
    ck_assert_int_lt(fake_n, MAX_VARS);
    ck_assert_uint_lt(strlen(name), sizeof fake_names[0]);
    strcpy(fake_names[fake_n], name);
    fake_values[fake_n] = value;
    fake_n++;
}

/* Sets one "NAME=value" entry, as environ holds it. */
static void fake_put(const char *entry)
{
    char name[sizeof fake_names[0]];
    size_t len = strcspn(entry, "=");

    ck_assert_msg(entry[len] == '=' && len < sizeof name, "entry %s", entry);
    memcpy(name, entry, len);
    name[len] = '\0';
    fake_set(name, entry + len + 1);
}

/* Sets the "NAME=value" entries given (NULL ends the list): a launcher's
 * many variables in one place. */
static void fake_add(const char *first, ...)
{
    va_list ap;

    va_start(ap, first);
    for (const char *e = first; e != NULL; e = va_arg(ap, const char *))
        fake_put(e);
    va_end(ap);
}

static const char *fake_getenv(const char *name)
{
    if (strncmp(name, "KOLO_", 5) != 0 && strncmp(name, "HOROVOD_", 8) != 0)
        fake_lookups_of_unknown++;
    for (int i = 0; i < fake_n; i++)
        if (strcmp(fake_names[i], name) == 0)
            return fake_values[i];
    return NULL;
}

static void load_ok(kolo__config_t *cfg)
{
    kolo__err_t err;
    int rc;
    kolo__err_clear(&err);
    rc = kolo__config_load(cfg, fake_getenv, &err);
    ck_assert_msg(rc == KOLO_OK, "load failed (%d): %s", rc, err.msg);
    ck_assert_int_eq(err.code, KOLO_OK);
}

/* Loads and expects KOLO_ERR_CONFIG with each of the given texts (NULL
 * ends the list) in the message. */
static void load_fails(const char *first, ...)
{
    kolo__config_t cfg;
    kolo__err_t err;
    int rc;
    va_list ap;

    kolo__err_clear(&err);
    rc = kolo__config_load(&cfg, fake_getenv, &err);
    ck_assert_msg(rc == KOLO_ERR_CONFIG, "load returned %d, expected %d (%s)",
                  rc, KOLO_ERR_CONFIG, err.msg);
    ck_assert_int_eq(err.code, KOLO_ERR_CONFIG);
    va_start(ap, first);
    for (const char *want = first; want != NULL; want = va_arg(ap, const char *))
        ck_assert_msg(strstr(err.msg, want) != NULL, "'%s' not in message: %s",
                      want, err.msg);
    va_end(ap);
}

/* One variable set to a bad value: the message names both. */
static void bad_value(const char *name, const char *value)
{
    char quoted[512];
    fake_reset();
    fake_set(name, value);
    /* Values longer than 200 bytes are shown cut, ending in "...". */
    if (strlen(value) > 200)
        snprintf(quoted, sizeof quoted, "'%.200s...'", value);
    else
        snprintf(quoted, sizeof quoted, "'%s'", value);
    load_fails(name, quoted, "expected", (const char *)NULL);
}

/* Where a configuration or a launcher places this rank, compared as a
 * whole (kolo__config_t and kolo__launchenv_t name the fields alike). */
typedef struct placement {
    int64_t rank, size, local_rank, local_size, cross_rank, cross_size;
} placement_t;

#define PLACEMENT_OF(x)                                                        \
    ((placement_t){(x).rank, (x).size, (x).local_rank, (x).local_size,         \
                   (x).cross_rank, (x).cross_size})

/* Rank `rank` of `size`, `local_rank` of `local_size` on its host, whose
 * place among the hosts is `cross_rank` of `cross_size`. */
static placement_t placed(int64_t rank, int64_t size, int64_t local_rank,
                          int64_t local_size, int64_t cross_rank,
                          int64_t cross_size)
{
    return (placement_t){rank, size, local_rank, local_size, cross_rank,
                         cross_size};
}

static void expect_placement(placement_t got, placement_t want)
{
    ck_assert_msg(memcmp(&got, &want, sizeof got) == 0,
                  "rank %lld of %lld, local %lld of %lld, cross %lld of %lld; "
                  "expected rank %lld of %lld, local %lld of %lld, cross %lld "
                  "of %lld",
                  (long long)got.rank, (long long)got.size,
                  (long long)got.local_rank, (long long)got.local_size,
                  (long long)got.cross_rank, (long long)got.cross_size,
                  (long long)want.rank, (long long)want.size,
                  (long long)want.local_rank, (long long)want.local_size,
                  (long long)want.cross_rank, (long long)want.cross_size);
}

/* The variables kolo.h documents first: the rank's place and the knobs
 * every job has. */
typedef struct config_want {
    placement_t at;
    const char *rendezvous, *hostname;
    int64_t fusion_threshold, cache_capacity, log_level;
    double cycle_time_ms, timeout_s, start_timeout_s;
} config_want_t;

static void expect_config(const kolo__config_t *cfg, config_want_t want)
{
    expect_placement(PLACEMENT_OF(*cfg), want.at);
    ck_assert_str_eq(cfg->rendezvous, want.rendezvous);
    ck_assert_str_eq(cfg->hostname, want.hostname);
    ck_assert_int_eq(cfg->fusion_threshold, want.fusion_threshold);
    ck_assert_double_eq(cfg->cycle_time_ms, want.cycle_time_ms);
    ck_assert_int_eq(cfg->cache_capacity, want.cache_capacity);
    ck_assert_double_eq(cfg->timeout_s, want.timeout_s);
    ck_assert_double_eq(cfg->start_timeout_s, want.start_timeout_s);
    ck_assert_int_eq(cfg->log_level, want.log_level);
}

/* A fresh environment of one variable, loaded (it must load). */
static kolo__config_t load_one(const char *name, const char *value)
{
    kolo__config_t cfg;

    fake_reset();
    fake_set(name, value);
    load_ok(&cfg);
    return cfg;
}

/* ---- defaults and parsing ---------------------------------------------- */

START_TEST(defaults)
{
    kolo__config_t cfg;

    fake_reset();
    memset(&cfg, 0x5a, sizeof cfg);
    load_ok(&cfg);
    expect_config(&cfg, (config_want_t){
        .at = placed(0, 1, 0, 1, 0, 1),
        .rendezvous = "", .hostname = "127.0.0.1",
        .fusion_threshold = 128 * 1024 * 1024, /* kolo.h */
        .cycle_time_ms = 5.0, .cache_capacity = 1024, .timeout_s = 60.0,
        .start_timeout_s = 60.0, .log_level = KOLO__LOG_WARNING});
    ck_assert_int_eq(fake_lookups_of_unknown, 0);
}
END_TEST

START_TEST(every_variable_parsed)
{
    kolo__config_t cfg;

    fake_reset();
    fake_add("KOLO_RANK=5", "KOLO_SIZE=8", "KOLO_LOCAL_RANK=1",
             "KOLO_LOCAL_SIZE=4", "KOLO_CROSS_RANK=1", "KOLO_CROSS_SIZE=2",
             "KOLO_RENDEZVOUS=file:/tmp/kolo-job-42",
             "KOLO_HOSTNAME=node7.cluster", "KOLO_FUSION_THRESHOLD=1048577",
             "KOLO_CYCLE_TIME=2.5", "KOLO_CACHE_CAPACITY=0",
             "KOLO_TIMEOUT_SECONDS=0.25", "KOLO_START_TIMEOUT=300",
             "KOLO_LOG_LEVEL=debug", (const char *)NULL);
    load_ok(&cfg);
    expect_config(&cfg, (config_want_t){
        .at = placed(5, 8, 1, 4, 1, 2),
        .rendezvous = "file:/tmp/kolo-job-42", .hostname = "node7.cluster",
        .fusion_threshold = 1048577, .cycle_time_ms = 2.5,
        .cache_capacity = 0, .timeout_s = 0.25, .start_timeout_s = 300.0,
        .log_level = KOLO__LOG_DEBUG});
}
END_TEST

START_TEST(local_rank_and_size_default_to_rank_and_size)
{
    kolo__config_t cfg;

    fake_reset();
    fake_add("KOLO_RANK=2", "KOLO_SIZE=3", "KOLO_RENDEZVOUS=file:/x",
             (const char *)NULL);
    load_ok(&cfg);
    ck_assert_int_eq(cfg.local_rank, 2);
    ck_assert_int_eq(cfg.local_size, 3);
}
END_TEST

START_TEST(fusion_threshold_suffixes)
{
    static const struct {
        const char *text;
        int64_t bytes;
    } cases[] = {
        {"0", 0},
        {"1", 1},
        {"64K", 64 * 1024},
        {"64k", 64 * 1024},
        {"64KB", 64 * 1024},
        {"3M", 3 * 1024 * 1024},
        {"3m", 3 * 1024 * 1024},
        {"3MB", 3 * 1024 * 1024},
        {"2G", 2LL * 1024 * 1024 * 1024},
        {"2g", 2LL * 1024 * 1024 * 1024},
        {"8Gb", 8LL * 1024 * 1024 * 1024},
        {"100B", 100},
        {"0M", 0},
        {"8589934592", 8589934592LL},
        {"8589934591G", 8589934591LL * 1024 * 1024 * 1024},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kolo__config_t cfg = load_one("KOLO_FUSION_THRESHOLD", cases[i].text);
        ck_assert_msg(cfg.fusion_threshold == cases[i].bytes,
                      "KOLO_FUSION_THRESHOLD=%s gave %lld, expected %lld",
                      cases[i].text, (long long)cfg.fusion_threshold,
                      (long long)cases[i].bytes);
    }
}
END_TEST

START_TEST(shm_slot_bytes_auto_or_bytes)
{
    kolo__config_t cfg;

    fake_reset();
    load_ok(&cfg);
    ck_assert_int_eq(cfg.shm_slot_bytes, 0); /* auto: the backend picks */
    fake_set("KOLO_SHM_SLOT_BYTES", "512K");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.shm_slot_bytes, 512 * 1024);
    fake_set("KOLO_SHM_SLOT_BYTES", "auto");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.shm_slot_bytes, 0);
    bad_value("KOLO_SHM_SLOT_BYTES", "automatic");
    bad_value("KOLO_SHM_SLOT_BYTES", "-4K");
    fake_reset();
    fake_set("KOLO_SHM_SLOT_BYTES", "1000");
    load_fails("KOLO_SHM_SLOT_BYTES=1000", "auto or 4K to 1G",
               (const char *)NULL);
    fake_set("KOLO_SHM_SLOT_BYTES", "2G");
    load_fails("KOLO_SHM_SLOT_BYTES=2147483648", (const char *)NULL);
}
END_TEST

START_TEST(ring_send_buffer_bytes_or_kernel)
{
    kolo__config_t cfg;

    fake_reset();
    load_ok(&cfg);
    ck_assert_int_eq(cfg.ring_send_buffer, 128 * 1024);
    fake_set("KOLO_RING_SEND_BUFFER", "1M");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.ring_send_buffer, 1024 * 1024);
    fake_set("KOLO_RING_SEND_BUFFER", "0");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.ring_send_buffer, 0); /* the kernel's autotuning */
    bad_value("KOLO_RING_SEND_BUFFER", "auto");
    bad_value("KOLO_RING_SEND_BUFFER", "-64K");
    fake_reset();
    fake_set("KOLO_RING_SEND_BUFFER", "16K");
    load_fails("KOLO_RING_SEND_BUFFER=16384", "0 (the kernel's) or 64K to 1G",
               (const char *)NULL);
}
END_TEST

START_TEST(chunk_bytes_auto_or_bytes)
{
    kolo__config_t cfg;

    fake_reset();
    load_ok(&cfg);
    ck_assert_int_eq(cfg.chunk_bytes, -1); /* auto: the data backend picks */
    fake_set("KOLO_CHUNK_BYTES", "8M");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.chunk_bytes, 8 * 1024 * 1024);
    fake_set("KOLO_CHUNK_BYTES", "0");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.chunk_bytes, 0); /* whole batches */
    fake_set("KOLO_CHUNK_BYTES", "auto");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.chunk_bytes, -1);
    bad_value("KOLO_CHUNK_BYTES", "automatic");
    bad_value("KOLO_CHUNK_BYTES", "-1");
}
END_TEST

START_TEST(log_levels)
{
    static const struct {
        const char *text;
        int level;
    } cases[] = {
        {"trace", KOLO__LOG_TRACE},     {"debug", KOLO__LOG_DEBUG},
        {"info", KOLO__LOG_INFO},       {"warning", KOLO__LOG_WARNING},
        {"warn", KOLO__LOG_WARNING},    {"error", KOLO__LOG_ERROR},
        {"off", KOLO__LOG_OFF},         {"DEBUG", KOLO__LOG_DEBUG},
        {"Error", KOLO__LOG_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kolo__config_t cfg = load_one("KOLO_LOG_LEVEL", cases[i].text);
        ck_assert_msg(cfg.log_level == cases[i].level,
                      "KOLO_LOG_LEVEL=%s gave %lld", cases[i].text,
                      (long long)cfg.log_level);
    }
}
END_TEST

/* ---- invalid values ------------------------------------------------------ */

START_TEST(bad_fusion_threshold)
{
    const char *bad[] = {"abc", "", "-1", "-1K", "1.5M", "10T", "10KK",
                         "K", "99999999999999999999",
                         "9223372036854775807K", "8589934592G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        bad_value("KOLO_FUSION_THRESHOLD", bad[i]);
}
END_TEST

START_TEST(bad_cycle_time)
{
    const char *bad[] = {"-1", "-0.5", "abc", "", "5ms", "nan", "inf",
                         "1e999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        bad_value("KOLO_CYCLE_TIME", bad[i]);
}
END_TEST

START_TEST(bad_integers)
{
    bad_value("KOLO_SIZE", "0");
    bad_value("KOLO_SIZE", "-2");
    bad_value("KOLO_SIZE", "two");
    bad_value("KOLO_SIZE", "");
    bad_value("KOLO_SIZE", "2147483648"); /* above INT32_MAX */
    bad_value("KOLO_RANK", "-1");
    bad_value("KOLO_RANK", "1x");
    bad_value("KOLO_RANK", "99999999999999999999");
    bad_value("KOLO_LOCAL_RANK", "-3");
    bad_value("KOLO_LOCAL_SIZE", "0");
    bad_value("KOLO_CROSS_RANK", "z");
    bad_value("KOLO_CROSS_SIZE", "0");
    bad_value("KOLO_CACHE_CAPACITY", "-1");
    bad_value("KOLO_CACHE_CAPACITY", "1k");
}
END_TEST

START_TEST(bad_other_values)
{
    char longhost[300], longdir[5000];

    bad_value("KOLO_LOG_LEVEL", "loud");
    bad_value("KOLO_LOG_LEVEL", "");
    bad_value("KOLO_LOG_LEVEL", "2");
    bad_value("KOLO_TIMEOUT_SECONDS", "-5");
    bad_value("KOLO_TIMEOUT_SECONDS", "soon");
    bad_value("KOLO_START_TIMEOUT", "-1");
    bad_value("KOLO_HOSTNAME", "");
    memset(longhost, 'h', sizeof longhost - 1);
    longhost[sizeof longhost - 1] = '\0';
    bad_value("KOLO_HOSTNAME", longhost);
    strcpy(longdir, "file:");
    memset(longdir + 5, 'd', sizeof longdir - 6);
    longdir[sizeof longdir - 1] = '\0';
    fake_reset();
    fake_set("KOLO_RENDEZVOUS", longdir);
    load_fails("KOLO_RENDEZVOUS", (const char *)NULL);
}
END_TEST

/* An environment whose rank is not below its size, and the two settings
 * its message must name. */
typedef struct rank_case {
    const char *env[5]; /* "NAME=value" entries, NULL after the last */
    const char *rank, *size;
} rank_case_t;

static void expect_ranks_refused(const rank_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fake_reset();
        for (const char *const *e = cases[i].env; *e != NULL; e++)
            fake_put(*e);
        load_fails(cases[i].rank, cases[i].size, (const char *)NULL);
    }
}

START_TEST(rank_not_below_size)
{
    static const rank_case_t cases[] = {
        {{"KOLO_RANK=2", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=file:/tmp/r"},
         "KOLO_RANK=2", "KOLO_SIZE=2"},
        {{"KOLO_RANK=7", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=file:/tmp/r"},
         "KOLO_RANK=7", "KOLO_SIZE=2"},
        /* Without KOLO_SIZE a job has one rank: rank 1 is out of range. */
        {{"KOLO_RANK=1"}, "KOLO_RANK=1", "KOLO_SIZE=1"},
    };
    expect_ranks_refused(cases, sizeof cases / sizeof cases[0]);
}
END_TEST

START_TEST(local_and_cross_rank_not_below_size)
{
    static const rank_case_t cases[] = {
        {{"KOLO_SIZE=4", "KOLO_RENDEZVOUS=file:/tmp/r", "KOLO_LOCAL_RANK=2",
          "KOLO_LOCAL_SIZE=2"},
         "KOLO_LOCAL_RANK=2", "KOLO_LOCAL_SIZE=2"},
        {{"KOLO_CROSS_RANK=1"}, "KOLO_CROSS_RANK=1", "KOLO_CROSS_SIZE=1"},
    };
    expect_ranks_refused(cases, sizeof cases / sizeof cases[0]);
}
END_TEST

START_TEST(multi_rank_needs_rendezvous)
{
    kolo__config_t cfg;

    fake_reset();
    fake_set("KOLO_SIZE", "2");
    load_fails("KOLO_SIZE=2", "KOLO_RENDEZVOUS", (const char *)NULL);
    /* Empty counts as unset. */
    fake_set("KOLO_RENDEZVOUS", "");
    load_fails("KOLO_RENDEZVOUS", (const char *)NULL);
    fake_set("KOLO_RENDEZVOUS", "file:/tmp/job");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.size, 2);
}
END_TEST

START_TEST(rendezvous_scheme_checked)
{
    kolo__config_t cfg;
    const char *bad[] = {"redis:x", "/tmp/dir", "FILE:/tmp", "file", "tcp://h:1",
                         "redis::6379", "redis:h:0", "redis:h:65536",
                         "redis:h:12x", "redis:h:6379/", "redis:h:6379/a b",
                         "redis:[::1]", "redis:[]:1", "redis:h"};

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char quoted[64];
        fake_reset();
        fake_set("KOLO_RENDEZVOUS", bad[i]);
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        load_fails("KOLO_RENDEZVOUS", quoted, "file:", (const char *)NULL);
        /* The same with a multi-rank job. */
        fake_set("KOLO_SIZE", "2");
        load_fails("KOLO_RENDEZVOUS", quoted, (const char *)NULL);
    }
    /* A one-rank job may name a rendezvous; it is kept. */
    fake_reset();
    fake_set("KOLO_RENDEZVOUS", "file:/tmp/solo");
    load_ok(&cfg);
    ck_assert_str_eq(cfg.rendezvous, "file:/tmp/solo");
    /* Redis, with and without a job name; an IPv6 host in brackets. */
    const char *good[] = {"redis:10.0.0.1:6379", "redis:h.example:1/kolo-a-1",
                          "redis:[::1]:6379/job", "redis:h:65535"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fake_reset();
        fake_set("KOLO_SIZE", "2");
        fake_set("KOLO_RENDEZVOUS", good[i]);
        load_ok(&cfg);
        ck_assert_str_eq(cfg.rendezvous, good[i]);
    }
}
END_TEST

START_TEST(network_interface_resolved)
{
    kolo__config_t cfg;

    /* lo exists on every Linux host, with 127.0.0.1. */
    fake_reset();
    fake_add("KOLO_NETWORK_INTERFACE=lo", "KOLO_HOSTNAME=10.9.9.9",
             (const char *)NULL);
    load_ok(&cfg);
    ck_assert_str_eq(cfg.network_interface, "lo");
    ck_assert_str_eq(cfg.hostname, "127.0.0.1");
    /* Absent: the message names the interface, the rank and the host, and
     * lists the interfaces there are. */
    fake_reset();
    fake_add("KOLO_RANK=1", "KOLO_SIZE=2", "KOLO_RENDEZVOUS=file:/tmp/x",
             "KOLO_NETWORK_INTERFACE=kolo-nope0", (const char *)NULL);
    load_fails("KOLO_NETWORK_INTERFACE=kolo-nope0", "rank 1 on host",
               "no interface kolo-nope0", "lo", (const char *)NULL);
    bad_value("KOLO_NETWORK_INTERFACE", "much-too-long-interface");
    bad_value("KOLO_NETWORK_INTERFACE", "a/b");
}
END_TEST

/* 0 parses as a number but is refused afterwards; env.h promises the same
 * message as for any bad value: the variable, the value, what was
 * expected. */
START_TEST(timeout_must_be_positive)
{
    const char *zeros[] = {"0", "0.0"};
    for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++) {
        char quoted[16];
        fake_reset();
        fake_set("KOLO_TIMEOUT_SECONDS", zeros[i]);
        snprintf(quoted, sizeof quoted, "'%s'", zeros[i]);
        load_fails("KOLO_TIMEOUT_SECONDS", quoted, "positive",
                   (const char *)NULL);
    }
}
END_TEST

START_TEST(first_bad_variable_reported)
{
    kolo__config_t cfg;
    kolo__err_t err;
    int size_named, level_named;

    /* Two bad variables: the message is about one of them, whole (the
     * variable with its value), not a mix of the two. */
    fake_reset();
    fake_add("KOLO_LOG_LEVEL=loud", "KOLO_SIZE=0", (const char *)NULL);
    ck_assert_int_eq(kolo__config_load(&cfg, fake_getenv, &err),
                     KOLO_ERR_CONFIG);
    size_named = strstr(err.msg, "KOLO_SIZE='0'") != NULL;
    level_named = strstr(err.msg, "KOLO_LOG_LEVEL='loud'") != NULL;
    ck_assert_msg(size_named + level_named == 1, "message: %s", err.msg);
}
END_TEST

START_TEST(print_doc_lists_every_variable)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    const char *names[] = {"KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK",
                           "KOLO_LOCAL_SIZE", "KOLO_CROSS_RANK",
                           "KOLO_CROSS_SIZE", "KOLO_RENDEZVOUS",
                           "KOLO_HOSTNAME", "KOLO_FUSION_THRESHOLD",
                           "KOLO_CYCLE_TIME", "KOLO_CACHE_CAPACITY",
                           "KOLO_TIMEOUT_SECONDS", "KOLO_START_TIMEOUT",
                           "KOLO_LOG_LEVEL"};

    ck_assert_ptr_nonnull(f);
    kolo__config_print_doc(f);
    fclose(f);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ck_assert_msg(strstr(text, names[i]) != NULL, "%s not documented",
                      names[i]);
    ck_assert_ptr_nonnull(strstr(text, "134217728"));
    free(text);
}
END_TEST


/* ---- Horovod's twins ---------------------------------------------------- */

START_TEST(horovod_twins_read)
{
    kolo__config_t cfg;

    fake_reset();
    fake_add("HOROVOD_RANK=1", "HOROVOD_SIZE=2",
             "KOLO_RENDEZVOUS=file:/tmp/job",
             "HOROVOD_FUSION_THRESHOLD=1048576", /* bytes, as kolo */
             "HOROVOD_CYCLE_TIME=2.5",           /* ms, as kolo */
             "HOROVOD_CACHE_CAPACITY=7",
             "HOROVOD_CONTROLLER=GLOO",          /* Horovod's case */
             "HOROVOD_CPU_OPERATIONS=Gloo", "HOROVOD_LOG_LEVEL=FATAL",
             "HOROVOD_GLOO_TIMEOUT_SECONDS=30", "HOROVOD_START_TIMEOUT=45",
             "HOROVOD_TIMELINE=/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES=1",
             "HOROVOD_HIERARCHICAL_ALLREDUCE=0", "HOROVOD_AUTOTUNE=1",
             "HOROVOD_AUTOTUNE_LOG=/tmp/a.csv",
             "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=10",
             "HOROVOD_STALL_CHECK_TIME_SECONDS=5",
             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=9", (const char *)NULL);
    load_ok(&cfg);
    ck_assert_int_eq(cfg.rank, 1);
    ck_assert_int_eq(cfg.size, 2);
    ck_assert_int_eq(cfg.local_rank, 1); /* defaults follow the twin too */
    ck_assert_int_eq(cfg.local_size, 2);
    ck_assert_int_eq(cfg.fusion_threshold, 1048576);
    ck_assert_double_eq(cfg.cycle_time_ms, 2.5);
    ck_assert_int_eq(cfg.cache_capacity, 7);
    ck_assert_str_eq(cfg.controller, "gloo");
    ck_assert_str_eq(cfg.cpu_operations, "gloo");
    ck_assert_int_eq(cfg.log_level, KOLO__LOG_ERROR);
    ck_assert_double_eq(cfg.timeout_s, 30.0);
    ck_assert_double_eq(cfg.start_timeout_s, 45.0);
    ck_assert_int_eq(cfg.log_level, KOLO__LOG_ERROR);
    ck_assert_double_eq(cfg.timeout_s, 30.0);
    ck_assert_double_eq(cfg.start_timeout_s, 45.0);
    ck_assert_str_eq(cfg.timeline, "/tmp/t.json");
    ck_assert_int_eq(cfg.timeline_mark_cycles, 1);
    ck_assert_int_eq(cfg.hierarchical, 0);
    ck_assert_int_eq(cfg.autotune, 1);
    ck_assert_str_eq(cfg.autotune_log, "/tmp/a.csv");
    ck_assert_int_eq(cfg.autotune_window, 10);
    ck_assert_double_eq(cfg.stall_check_s, 5.0);
    ck_assert_double_eq(cfg.stall_shutdown_s, 9.0);

    /* HOROVOD_STALL_CHECK_DISABLE turns warnings and shutdown off. */
    fake_set("HOROVOD_STALL_CHECK_DISABLE", "1");
    load_ok(&cfg);
    ck_assert_double_eq(cfg.stall_check_s, 0.0);
    ck_assert_double_eq(cfg.stall_shutdown_s, 0.0);
    fake_set("HOROVOD_STALL_CHECK_DISABLE", "0");
    load_ok(&cfg);
    ck_assert_double_eq(cfg.stall_check_s, 5.0);
}
END_TEST

START_TEST(kolo_variable_wins_over_twin)
{
    kolo__config_t cfg;

    fake_reset();
    fake_add("HOROVOD_FUSION_THRESHOLD=2097152", "KOLO_FUSION_THRESHOLD=1M",
             (const char *)NULL);
    fake_set("HOROVOD_CYCLE_TIME", "not a number"); /* never read */
    fake_set("KOLO_CYCLE_TIME", "3");
    load_ok(&cfg);
    ck_assert_int_eq(cfg.fusion_threshold, 1048576);
    ck_assert_double_eq(cfg.cycle_time_ms, 3.0);
    ck_assert_str_eq(kolo__config_get("KOLO_FUSION_THRESHOLD", fake_getenv), "1M");
    ck_assert_str_eq(kolo__config_get("KOLO_RANK", fake_getenv) ? "set" : "unset",
                     "unset");
    fake_set("HOROVOD_RANK", "0");
    ck_assert_str_eq(kolo__config_get("KOLO_RANK", fake_getenv), "0");
}
END_TEST

START_TEST(bad_twin_named)
{
    fake_reset();
    fake_set("HOROVOD_CYCLE_TIME", "fast");
    load_fails("HOROVOD_CYCLE_TIME", "'fast'", "expected", (const char *)NULL);
    fake_reset();
    fake_set("HOROVOD_CONTROLLER", "CCL");
    load_fails("HOROVOD_CONTROLLER", "'CCL'", "gloo", (const char *)NULL);
    /* horovodrun's ranks: its rendezvous is not kolo's. */
    fake_reset();
    fake_add("HOROVOD_RANK=0", "HOROVOD_SIZE=2",
             "HOROVOD_GLOO_RENDEZVOUS_ADDR=10.0.0.1", (const char *)NULL);
    load_fails("horovodrun", "kolorun", (const char *)NULL);
}
END_TEST

static char notes[16][1024];
static int nnotes;

static void collect_note(const char *msg, void *arg)
{
    (void)arg;
    ck_assert_int_lt(nnotes, 16);
    snprintf(notes[nnotes++], sizeof notes[0], "%s", msg);
}

/* Runs the scan over env (NULL-terminated) and returns how many notes
 * contain `want` (NULL: how many notes in all). */
static int scan_count(char **env, const char *want)
{
    int n = 0;
    nnotes = 0;
    fake_reset();
    for (char **e = env; *e; e++)
        fake_put(*e);
    kolo__config_scan(env, fake_getenv, collect_note, NULL);
    for (int i = 0; i < nnotes; i++)
        n += want == NULL || strstr(notes[i], want) != NULL;
    return n;
}

START_TEST(scan_warns_once_per_finding)
{
    char *quiet[] = {"KOLO_FUSION_THRESHOLD=1M",
                     "HOROVOD_FUSION_THRESHOLD=1048576", /* the same value */
                     "HOROVOD_HIERARCHICAL_ALLGATHER=0", /* asks for nothing */
                     "HOROVOD_NUM_NCCL_STREAMS=1",
                     "HOROVOD_MPI_THREADS_DISABLE=0",
                     "HOROVOD_WITH_PYTORCH=1",           /* Horovod's build */
                     "HOROVOD_GPU_OPERATIONS=NCCL",
                     "HOROVOD_DYNAMIC_PROCESS_SETS=1",   /* kolo always does */
                     "KOLO_TOP_BUILDDIR=/x", "PATH=/bin",
                     "KOLO_WITHOUT_MPI=1",               /* pip's build */
                     "KOLO_GPU_OPERATIONS=NCCL", "KOLO_NCCL_HOME=/opt/nccl",
                     NULL};
    char *loud[] = {"KOLO_CYCLE_TIME=5", "HOROVOD_CYCLE_TIME=1",
                    "HOROVOD_HIERARCHICAL_ALLGATHER=1",
                    "HOROVOD_NUM_NCCL_STREAMS=2",
                    "HOROVOD_THREAD_AFFINITY=0,1",
                    "HOROVOD_FUSION_TRESHOLD=1",
                    "KOLO_FUSION_TRESHOLD=1",
                    "HOROVOD_GLOO_RENDEZVOUS_ADDR=10.0.0.1", NULL};

    ck_assert_int_eq(scan_count(quiet, NULL), 0);
    ck_assert_int_eq(scan_count(loud, NULL), 7);
    ck_assert_int_eq(scan_count(loud, "KOLO_CYCLE_TIME=5 and "
                                      "HOROVOD_CYCLE_TIME=1 are both set and "
                                      "differ: kolo uses KOLO_CYCLE_TIME"), 1);
    ck_assert_int_eq(scan_count(loud, "HOROVOD_HIERARCHICAL_ALLGATHER=1 is "
                                      "ignored: kolo has no hierarchical"), 1);
    ck_assert_int_eq(scan_count(loud, "HOROVOD_NUM_NCCL_STREAMS=2 is ignored"), 1);
    ck_assert_int_eq(scan_count(loud, "HOROVOD_THREAD_AFFINITY=0,1 is ignored"), 1);
    ck_assert_int_eq(scan_count(loud, "HOROVOD_FUSION_TRESHOLD is not a "
                                      "Horovod variable kolo knows, and is "
                                      "ignored (did you mean "
                                      "HOROVOD_FUSION_THRESHOLD?)"), 1);
    ck_assert_int_eq(scan_count(loud, "did you mean KOLO_FUSION_THRESHOLD?"), 1);
    ck_assert_int_eq(scan_count(loud, "HOROVOD_GLOO_RENDEZVOUS_ADDR=10.0.0.1 "
                                      "is ignored: it is horovodrun's"), 1);
}
END_TEST

/* ---- torchrun and srun (launchenv.c) ----------------------------------- */

static int detect(kolo__launchenv_t *le, kolo__err_t *err)
{
    kolo__err_clear(err);
    return kolo__launchenv_detect(fake_getenv, le, err);
}

/* Detects a launcher, which must be `launcher`, placing this rank at `at`
 * and rank 0's rendezvous server at host:port. */
static void expect_launch(kolo__launchenv_t *le, const char *launcher,
                          placement_t at, const char *host, int port)
{
    kolo__err_t err;
    int rc = detect(le, &err);

    ck_assert_msg(rc == 1, "detect gave %d: %s", rc, err.msg);
    ck_assert_str_eq(le->launcher, launcher);
    expect_placement(PLACEMENT_OF(*le), at);
    ck_assert_str_eq(le->host, host);
    ck_assert_int_eq(le->port, port);
}

/* The launcher's variables are refused with a message that says `want`. */
static void expect_refused(const char *want)
{
    kolo__launchenv_t le;
    kolo__err_t err;

    ck_assert_int_eq(detect(&le, &err), KOLO_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
}

START_TEST(torchrun_places_the_rank)
{
    kolo__launchenv_t le;
    kolo__err_t err;

    fake_reset();
    ck_assert_int_eq(detect(&le, &err), 0); /* no launcher: one rank */
    fake_add("RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
             "GROUP_RANK=1", "GROUP_WORLD_SIZE=2", "MASTER_ADDR=node0.cluster",
             "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=job7",
             "TORCHELASTIC_RESTART_COUNT=2",
             /* srun's variables too (srun torchrun ...): torchrun's are the
              * rank's. */
             "SLURM_PROCID=0", "SLURM_STEP_ID=0", (const char *)NULL);
    expect_launch(&le, "torchrun", placed(5, 8, 1, 4, 1, 2), "node0.cluster",
                  29501);
    ck_assert_str_eq(le.rendezvous, "redis:node0.cluster:29501/torchrun-job7-2");

    /* One node: the server is reached on loopback. */
    fake_add("RANK=1", "LOCAL_RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
             "GROUP_RANK=0", "GROUP_WORLD_SIZE=1", (const char *)NULL);
    expect_launch(&le, "torchrun", placed(1, 2, 1, 2, 0, 1), "127.0.0.1",
                  29501);

    /* torch.distributed's env:// without torchrun's local variables. */
    fake_reset();
    fake_add("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
             "MASTER_PORT=29500", (const char *)NULL);
    expect_refused("LOCAL_RANK is not set");
    fake_add("LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "RANK=2",
             (const char *)NULL);
    expect_refused("rank 2 of 2");
    fake_set("RANK", "x");
    expect_refused("RANK='x'");
}
END_TEST

START_TEST(srun_places_the_rank)
{
    kolo__launchenv_t le;
    kolo__err_t err;

    /* A batch script: SLURM_PROCID, but no step. */
    fake_reset();
    fake_add("SLURM_PROCID=0", "SLURM_NTASKS=7", "SLURM_JOB_ID=4242",
             (const char *)NULL);
    ck_assert_int_eq(detect(&le, &err), 0);

    /* srun -n 7 over 3 nodes, 3+3+1 tasks: task 6 on the third node. */
    fake_add("SLURM_STEP_ID=3", "SLURM_PROCID=6", "SLURM_LOCALID=0",
             "SLURM_NODEID=2", "SLURM_NNODES=3",
             "SLURM_STEP_TASKS_PER_NODE=3(x2),1",
             "SLURM_STEP_NODELIST=gpu[07-09],cpu1", (const char *)NULL);
    expect_launch(&le, "srun", placed(6, 7, 0, 1, 2, 3), "gpu07",
                  30000 + (4242 * 16 + 3) % 30000);
    ck_assert_str_eq(strstr(le.rendezvous, "/"), "/srun-4242.3");
    /* The second node has 3. */
    fake_add("SLURM_NODEID=1", "SLURM_PROCID=4", "SLURM_LOCALID=1",
             (const char *)NULL);
    ck_assert_int_eq(detect(&le, &err), 1);
    ck_assert_int_eq(le.local_size, 3);
    /* MASTER_ADDR and MASTER_PORT, when the script sets them, win. */
    fake_set("MASTER_ADDR", "10.1.1.1");
    fake_set("MASTER_PORT", "29500");
    ck_assert_int_eq(detect(&le, &err), 1);
    ck_assert_str_eq(le.rendezvous, "redis:10.1.1.1:29501/srun-4242.3");
    /* SLURM_NTASKS_PER_NODE when the per-node list is absent. */
    fake_reset();
    fake_add("SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=4",
             "SLURM_LOCALID=1", "SLURM_NODEID=0", "SLURM_NNODES=2",
             "SLURM_NTASKS_PER_NODE=2", "SLURM_JOB_NODELIST=a,b",
             (const char *)NULL);
    ck_assert_int_eq(detect(&le, &err), 1);
    ck_assert_int_eq(le.local_size, 2);
    ck_assert_str_eq(le.host, "a");
    /* One node: loopback, whatever the list says. */
    fake_set("SLURM_NNODES", "1");
    fake_set("SLURM_NTASKS_PER_NODE", "4");
    ck_assert_int_eq(detect(&le, &err), 1);
    ck_assert_str_eq(le.host, "127.0.0.1");
    /* Missing: named. */
    fake_add("SLURM_NNODES=2", "SLURM_NTASKS_PER_NODE=2",
             "SLURM_JOB_NODELIST=bad[1-2", (const char *)NULL);
    expect_refused("MASTER_ADDR");
    fake_set("SLURM_TASKS_PER_NODE", "2(x");
    expect_refused("SLURM_TASKS_PER_NODE='2(x'");
}
END_TEST

KOLO_UNIT_MAIN("env", 30,
        defaults, every_variable_parsed,
        local_rank_and_size_default_to_rank_and_size,
        fusion_threshold_suffixes, shm_slot_bytes_auto_or_bytes,
        ring_send_buffer_bytes_or_kernel, chunk_bytes_auto_or_bytes,
        log_levels, print_doc_lists_every_variable, bad_fusion_threshold,
        bad_cycle_time, bad_integers, bad_other_values, rank_not_below_size,
        local_and_cross_rank_not_below_size, multi_rank_needs_rendezvous,
        rendezvous_scheme_checked, network_interface_resolved,
        timeout_must_be_positive, first_bad_variable_reported,
        horovod_twins_read, kolo_variable_wins_over_twin, bad_twin_named,
        scan_warns_once_per_finding, torchrun_places_the_rank,
        srun_places_the_rank)
