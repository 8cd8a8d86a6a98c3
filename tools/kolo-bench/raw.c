/*
 * raw.c — the raw side: the backend named by --backend, and those of
 * --compare, called directly through their ops tables (a private static
 * copy, libkolo_raw), each in a context of its own under the rendezvous
 * prefix "kolo-bench-raw" (--compare: "kolo-bench-compare-<name>"), next
 * to the runtime's. The raw backend also carries the barriers and the
 * reduction of the times, never timed; under --backend nccl that is a host
 * backend, and NCCL itself is gpu.c's.
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "env.h"
#include "bench.h"

const kolo__ops_t *bench_raw; /* the backend, called directly */
static void *g_raw_ctx;
static int *g_raw_members; /* the raw contexts keep a pointer to it */
const kolo__ops_t *bench_cmp[BENCH_MAX_COMPARE];
static void *g_cmp_ctx[BENCH_MAX_COMPARE];
int bench_ncmp;
char bench_cmp_side[BENCH_MAX_COMPARE][32]; /* "raw gloo" */
kolo__ops_reduce_fn bench_sum_f32, bench_max_f64, bench_max_i32;

/* which < 0: the raw backend; else compared backend `which`. */
void bench_raw_allreduce_on(int which, void *buf, size_t count,
                            size_t elem_size, kolo__ops_reduce_fn fn)
{
    const kolo__ops_t *ops = which < 0 ? bench_raw : bench_cmp[which];
    char err[512] = "";
    int rc = ops->allreduce(which < 0 ? g_raw_ctx : g_cmp_ctx[which], NULL, buf,
                            count, elem_size, fn, err, sizeof(err));
    if (rc != KOLO_OK)
        bench_die("raw %s allreduce of %zu bytes failed: %s (%s)", ops->name,
                  count * elem_size, err, kolo_strerror(rc));
}

void bench_raw_allreduce(void *buf, size_t count, size_t elem_size,
                         kolo__ops_reduce_fn fn)
{
    bench_raw_allreduce_on(-1, buf, count, elem_size, fn);
}

/* Every rank leaves after every rank has arrived. */
void bench_barrier(void)
{
    float one = 1.0f;
    bench_raw_allreduce(&one, 1, sizeof(one), bench_sum_f32);
}

/* KOLO_SHM_SLOT_BYTES as the runtime reads it: auto (0) or bytes. */
static size_t raw_slot_bytes(void)
{
    long long v =
        bench_parse_bytes(bench_env_or("KOLO_SHM_SLOT_BYTES", "auto"));
    return v > 0 ? (size_t)v : 0;
}

static const char *env_get(const char *name) { return getenv(name); }

/* Where the raw side meets its peers: the rendezvous and the address it
 * binds, as the runtime's backends find them. */
typedef struct {
    const char *rdv;
    const char *host;
} raw_place_t;

/* The backend measured directly, and where it meets its peers: the
 * job's rendezvous, or nothing for one rank and for MPI. */
static void raw_choose(const char *backend, raw_place_t *place)
{
    const char *iface = getenv("KOLO_NETWORK_INTERFACE");
    static kolo__config_t kc; /* its hostname outlives this call */

    if (bench_size == 1) {
        bench_raw = &kolo__ops_local;
        return;
    }
    if (strcmp(backend, "mpi") == 0) {
        /* kolo_init initialised MPI; the raw side uses it too. */
        bench_raw = kolo__ops_find("mpi");
        return;
    }
    bench_raw = kolo__ops_named(backend);
    if (bench_raw == NULL)
        bench_die("this kolo-bench has no raw backend '%s'", backend);
    if (iface != NULL && iface[0] != '\0') {
        /* Bind where the runtime binds: the interface's address, as
         * env.c finds it (kolorun --network-interface). */
        kolo__err_t e;
        if (kolo__config_load(&kc, env_get, &e) != 0)
            bench_die("%s", e.msg);
        place->host = kc.hostname;
    }
    if ((place->rdv == NULL || place->rdv[0] == '\0') &&
        getenv("PMIX_NAMESPACE") && strcmp(backend, "gloo") != 0) {
        /* Started by mpirun: shared memory keys its segment on the job's
         * PMIx namespace, unique per job. */
        static char mpi_rdv[300];
        snprintf(mpi_rdv, sizeof(mpi_rdv), "mpi-bench:%s",
                 getenv("PMIX_NAMESPACE"));
        place->rdv = mpi_rdv;
    }
    if (place->rdv == NULL || place->rdv[0] == '\0')
        bench_die("KOLO_RENDEZVOUS is not set: run kolo-bench under kolorun "
                  "(--backend gloo and --compare gloo need kolorun without "
                  "--mpi)");
}

/* The raw contexts' configuration: every rank of the job, as the
 * runtime's global set. */
static void raw_config(const raw_place_t *place, kolo__ops_config_t *cfg)
{
    int *members = g_raw_members = malloc((size_t)bench_size * sizeof(int));
    if (members == NULL)
        bench_die("out of memory");
    for (int i = 0; i < bench_size; i++)
        members[i] = i;
    *cfg = (kolo__ops_config_t){
        .rank = bench_rank, .size = bench_size, .members = members,
        .global_rank = bench_rank, .rendezvous = place->rdv ? place->rdv : "",
        .prefix = "kolo-bench-raw",
        .hostname = place->host && place->host[0] ? place->host : "127.0.0.1",
        .timeout_s = 300, .start_timeout_s = 60, .on_wake = NULL,
        .wake_arg = NULL,
        /* The raw side runs as the runtime's does (env.c checked these). */
        .shm_slot_bytes = raw_slot_bytes(),
        .shm_spin_us = atoi(bench_env_or("KOLO_SHM_SPIN_US", "50"))};

    /* Its connections prove the job's secret, as the runtime's do. */
    static uint8_t key[KOLO__KEY_BYTES];
    int have = 0;
    kolo__err_t e;
    if (kolo__auth_job_key(env_get, key, &have, &e) != KOLO_OK)
        bench_die("%s", e.msg);
    cfg->job_key = have ? key : NULL;
}

/* The raw side: the backend's own context, next to the runtime's.
 * --backend nccl: the host backend of barriers and of the reduction of the
 * times; the raw NCCL side is bench_gpu_init's. */
void bench_raw_init(const char *backend)
{
    raw_place_t place = {getenv("KOLO_RENDEZVOUS"), getenv("KOLO_HOSTNAME")};
    kolo__ops_config_t cfg;
    char err[512] = "";

    raw_choose(backend, &place);
    raw_config(&place, &cfg);
    int rc = bench_raw->init(&cfg, &g_raw_ctx, err, sizeof(err));
    if (rc != KOLO_OK)
        bench_die("raw %s backend: init failed: %s (%s)", bench_raw->name, err,
                  kolo_strerror(rc));
    /* --compare: each backend in a context of its own prefix. */
    for (int k = 0; k < bench_ncmp; k++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "kolo-bench-compare-%s",
                 bench_cmp[k]->name);
        cfg.prefix = prefix;
        rc = bench_cmp[k]->init(&cfg, &g_cmp_ctx[k], err, sizeof(err));
        if (rc != KOLO_OK)
            bench_die("raw %s backend (--compare): init failed: %s (%s)",
                      bench_cmp[k]->name, err, kolo_strerror(rc));
    }
}

/* --compare B[,B...]: the backends this build has, not the one measured. */
void bench_parse_compare(void)
{
    char list[128], *save = NULL;

    if (bench_opt.compare == NULL || bench_size == 1)
        return;
    snprintf(list, sizeof(list), "%s", bench_opt.compare);
    for (char *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        const kolo__ops_t *ops = kolo__ops_named(w);
        if (ops == NULL)
            bench_bad_usage("--compare: no backend '%s' in this build", w);
        if (bench_ncmp == BENCH_MAX_COMPARE)
            bench_bad_usage("--compare: at most 3 backends ('%s' is one more)",
                            w);
        bench_cmp[bench_ncmp] = ops;
        snprintf(bench_cmp_side[bench_ncmp], sizeof(bench_cmp_side[bench_ncmp]),
                 "raw %s", w);
        bench_ncmp++;
    }
}

/* --backend nccl: barriers and the reduction of the times go through a host
 * backend called directly (never timed): one that spans every rank, as the
 * runtime's negotiation does. Shared memory only when nothing else is up:
 * the runtime enables it within each host of a hierarchical job too. */
const char *bench_nccl_host_backend(void)
{
    static const char *const names[] = {"gloo", "mpi", "shm"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (kolo_enabled(names[i]) && kolo__ops_find(names[i]) != NULL)
            return names[i];
    return "gloo";
}

/* After kolo_shutdown: the raw contexts, the compared ones first. */
void bench_raw_finalize(void)
{
    for (int k = 0; k < bench_ncmp; k++)
        bench_cmp[k]->finalize(g_cmp_ctx[k]);
    bench_raw->finalize(g_raw_ctx);
    free(g_raw_members);
}
