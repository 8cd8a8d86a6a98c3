/*
 * report.c — the report, on rank 0: the header of the run (the job, its
 * backends, the environment), a table per workload with one row per
 * figure, and with --json FILE one JSON document of the same rows; the
 * number formats of both.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ops.h"

static FILE *g_json;
static int g_json_first = 1;

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, const char *key, double v)
{
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* Three significant digits, without an exponent where it fits. */
const char *bench_fmt_num(char *buf, size_t len, double v)
{
    double a = fabs(v);
    if (!isfinite(v))
        snprintf(buf, len, "-");
    else if (a >= 1000 || a == 0)
        snprintf(buf, len, "%.0f", v);
    else if (a >= 100)
        snprintf(buf, len, "%.1f", v);
    else if (a >= 10)
        snprintf(buf, len, "%.2f", v);
    else if (a >= 0.001)
        snprintf(buf, len, "%.3f", v);
    else
        snprintf(buf, len, "%.2e", v);
    return buf;
}

const char *bench_fmt_time(char *buf, size_t len, double s)
{
    if (s < 1e-5)
        snprintf(buf, len, "%.3f us", s * 1e6);
    else if (s < 1e-3)
        snprintf(buf, len, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, len, "%.2f ms", s * 1e3);
    else
        snprintf(buf, len, "%.3f s", s);
    return buf;
}

const char *bench_fmt_bytes(char *buf, size_t len, long long b)
{
    if (b >= GIB && b % GIB == 0)
        snprintf(buf, len, "%lld GiB", b / GIB);
    else if (b >= MIB && b % MIB == 0)
        snprintf(buf, len, "%lld MiB", b / MIB);
    else if (b >= KIB && b % KIB == 0)
        snprintf(buf, len, "%lld KiB", b / KIB);
    else
        snprintf(buf, len, "%lld B", b);
    return buf;
}

/* per_time: scale / time (a bandwidth, a rate), else scale * time. */
bench_figure_t bench_figure(const bench_result_t *r, double scale,
                            int per_time)
{
    bench_figure_t f;
    if (per_time) {
        f.med = scale / r->med;
        f.min = scale / r->max;
        f.max = scale / r->min;
    } else {
        f.med = scale * r->med;
        f.min = scale * r->min;
        f.max = scale * r->max;
    }
    return f;
}

/* The compared backends' figures (r[0..bench_ncmp)): appended to the table's
 * note as "; raw gloo 1.23 GB/s" and to the JSON as "compare": {...}. */
void bench_compare_note(const bench_result_t *r, double scale, int per_time,
                        const char *unit, char *note, size_t nlen,
                        char *json, size_t jlen)
{
    size_t jused;

    jused = (size_t)snprintf(json, jlen, ", \"compare\": {");
    for (int k = 0; k < bench_ncmp; k++) {
        bench_figure_t f = bench_figure(&r[k], scale, per_time);
        size_t used = strlen(note);
        snprintf(note + used, nlen - used, "; %s %.4g %s%s", bench_cmp_side[k],
                 f.med, unit, r[k].wrong ? " WRONG" : "");
        if (jused < jlen)
            jused += (size_t)snprintf(json + jused, jlen - jused,
                                      "%s\"%s\": %.6g", k ? ", " : "",
                                      bench_cmp[k]->name, f.med);
    }
    if (jused < jlen)
        snprintf(json + jused, jlen - jused, "}");
}

/* A table's title and column heads, on rank 0. */
void bench_table_header(const char *title)
{
    if (bench_rank != 0)
        return;
    printf("\n%s\n", title);
    printf("%-9s %-9s %-6s %9s %-24s %9s %-24s %7s  %-5s %s\n", "workload",
           "size", "unit", "kolo", " [min .. max]", "raw", " [min .. max]",
           "ratio", "check", "notes");
    fflush(stdout);
}

/* One row: in the table, and in the JSON document when there is one. */
void bench_emit(const bench_row_t *r)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], range1[48],
        range2[48];

    if (bench_rank != 0)
        return;
    snprintf(range1, sizeof(range1), " [%s .. %s]",
             bench_fmt_num(a, sizeof(a), r->kolo.min),
             bench_fmt_num(b, sizeof(b), r->kolo.max));
    snprintf(range2, sizeof(range2), " [%s .. %s]",
             bench_fmt_num(c, sizeof(c), r->raw.min),
             bench_fmt_num(d, sizeof(d), r->raw.max));
    printf("%-9s %-9s %-6s %9s %-24s %9s %-24s %7s  %-5s %s\n", r->workload,
           r->size_text, r->unit, bench_fmt_num(e, sizeof(e), r->kolo.med),
           range1, bench_fmt_num(f, sizeof(f), r->raw.med), range2,
           bench_fmt_num(g, sizeof(g), r->ratio), r->wrong ? "WRONG" : "ok",
           r->note ? r->note : "");
    fflush(stdout);

    if (g_json == NULL)
        return;
    fprintf(g_json, "%s\n    {\"workload\": ", g_json_first ? "" : ",");
    g_json_first = 0;
    json_string(g_json, r->workload);
    if (r->size_bytes >= 0)
        fprintf(g_json, ", \"size_bytes\": %lld", r->size_bytes);
    fprintf(g_json, ", \"size\": ");
    json_string(g_json, r->size_text);
    fprintf(g_json, ", \"unit\": ");
    json_string(g_json, r->unit);
    json_num(g_json, "kolo", r->kolo.med);
    json_num(g_json, "raw", r->raw.med);
    json_num(g_json, "ratio", r->ratio);
    fprintf(g_json, ", \"ratio_is\": ");
    json_string(g_json, r->ratio_is);
    json_num(g_json, "kolo_min", r->kolo.min);
    json_num(g_json, "kolo_max", r->kolo.max);
    json_num(g_json, "raw_min", r->raw.min);
    json_num(g_json, "raw_max", r->raw.max);
    json_num(g_json, "kolo_time_s", r->kolo_t->med);
    json_num(g_json, "raw_time_s", r->raw_t->med);
    fprintf(g_json, ", \"warmup\": %d, \"iters\": %d", r->warmup, r->iters);
    if (r->extra_json)
        fputs(r->extra_json, g_json);
    fprintf(g_json, ", \"check\": \"%s\"}", r->wrong ? "WRONG" : "ok");
    fflush(g_json);
}

/* Emits a row of the usual two sides: its figures from r[0] (kolo) and r[1]
 * (raw), scale and per_time as bench_figure's; the ratio is kolo's figure
 * over raw's (per_time: raw time / kolo time, else kolo time / raw time). */
void bench_emit_sides(bench_row_t *row, const bench_result_t *r, double scale,
                      int per_time)
{
    row->kolo = bench_figure(&r[0], scale, per_time);
    row->raw = bench_figure(&r[1], scale, per_time);
    row->kolo_t = &r[0];
    row->raw_t = &r[1];
    row->ratio = per_time ? r[1].med / r[0].med : r[0].med / r[1].med;
    row->wrong = r[0].wrong || r[1].wrong;
    bench_emit(row);
}

/* The backend the runtime uses for a role (KOLO_CONTROLLER or
 * KOLO_CPU_OPERATIONS), as the runtime chose it: the variable when set,
 * else shared memory when every rank is on one host, else the network
 * backend the job was started with. `data` also names hierarchical
 * allreduce. Only for the header and the JSON. */
/* The backend the runtime uses for a role, as the registry chooses it
 * (ops/registry.c, the runtime's own chooser): data across hosts with
 * shared memory up is the hierarchical backend over the network one. */
static const char *runtime_backend(const char *var, int data)
{
    static char hier[64];
    const char *cross = getenv("KOLO_CROSS_SIZE");
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); /* mpirun */
    int hosts = cross ? atoi(cross) > 1 : local && atoi(local) < bench_size;
    kolo__ops_need_t need = {bench_size, !hosts, kolo_enabled("mpi"),
                             bench_rank, var, getenv(var)};
    const kolo__ops_t *ops;
    char err[256];

    if (kolo__ops_choose(&need, &ops, err, sizeof(err)) != KOLO_OK)
        return need.want; /* kolo_init took it: cannot happen */
    if (data && hosts && kolo_enabled("shm") && kolo__ops_hierarchical()) {
        snprintf(hier, sizeof(hier), "%s (shm + %s)",
                 kolo__ops_hierarchical()->name, ops->name);
        return hier;
    }
    return ops->name;
}

static const char *g_env_names[] = {
    "KOLO_FUSION_THRESHOLD", "KOLO_CYCLE_TIME", "KOLO_CACHE_CAPACITY",
    "KOLO_TIMELINE", "KOLO_AUTOTUNE", "KOLO_LOG_LEVEL", "KOLO_CONTROLLER",
    "KOLO_CPU_OPERATIONS", "KOLO_SHM_SLOT_BYTES"};
#define N_ENV ((int)(sizeof(g_env_names) / sizeof(g_env_names[0])))

void bench_print_header(void)
{
    char wl[128] = "";
    if (bench_rank != 0)
        return;
    snprintf(
        wl, sizeof(wl), "%s%s%s%s%s", bench_opt.large ? " large" : "",
        bench_opt.resnet50 ? " resnet50" : "", bench_opt.small ? " small" : "",
        bench_opt.latency ? " latency" : "", bench_opt.fp16 ? " fp16" : "");
    if (bench_gpu) {
        printf("kolo-bench %d.%d.%d: %d rank%s; CUDA tensors on device %d "
               "(%s) through kolo (NCCL); raw = NCCL %s called directly on "
               "one device buffer (its own communicator and stream), timed "
               "to cudaStreamSynchronize; barriers over %s (host, not "
               "timed)\n",
               KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH,
               bench_size, bench_size == 1 ? "" : "s", bench_dev,
               bench_gpu_name, bench_nccl_version, bench_raw->name);
    } else {
        printf("kolo-bench %d.%d.%d: %d rank%s; kolo negotiates over %s and "
               "moves tensors over %s (as a training job does; "
               "KOLO_CONTROLLER and KOLO_CPU_OPERATIONS change that); raw = "
               "%s called directly on one buffer\n",
               KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH,
               bench_size, bench_size == 1 ? "" : "s",
               runtime_backend("KOLO_CONTROLLER", 0),
               runtime_backend("KOLO_CPU_OPERATIONS", 1), bench_raw->name);
    }
    printf("environment: KOLO_FUSION_THRESHOLD=%s KOLO_CYCLE_TIME=%s "
           "KOLO_CACHE_CAPACITY=%s KOLO_SHM_SLOT_BYTES=%s KOLO_TIMELINE=%s "
           "KOLO_AUTOTUNE=%s\n",
           bench_env_or("KOLO_FUSION_THRESHOLD", "(default)"),
           bench_env_or("KOLO_CYCLE_TIME", "(default)"),
           bench_env_or("KOLO_CACHE_CAPACITY", "(default)"),
           bench_env_or("KOLO_SHM_SLOT_BYTES", "(auto)"),
           bench_env_or("KOLO_TIMELINE", "(off)"),
           bench_env_or("KOLO_AUTOTUNE", "(off)"));
    printf("workloads:%s%s; times: per iteration the slowest rank's (MAX over "
           "ranks, reduced through the raw context after the run), median "
           "[min .. max] over the timed iterations after warm-up; every "
           "result checked\n",
           wl, bench_opt.quick ? " (--quick)" : "");
    fflush(stdout);
}

void bench_json_begin(void)
{
    if (bench_rank != 0 || bench_opt.json == NULL)
        return;
    g_json = fopen(bench_opt.json, "w");
    if (g_json == NULL)
        bench_die("cannot write %s: %s", bench_opt.json, strerror(errno));
    fprintf(g_json,
            "{\"tool\": \"kolo-bench\", \"version\": \"%d.%d.%d\", "
            "\"ranks\": %d, \"backend\": ",
            KOLO_VERSION_MAJOR, KOLO_VERSION_MINOR, KOLO_VERSION_PATCH,
            bench_size);
    json_string(g_json, bench_gpu         ? "nccl"
                        : bench_size == 1 ? "local"
                                          : bench_opt.backend);
    fprintf(g_json, ", \"raw_backend\": ");
    json_string(g_json, bench_gpu ? "nccl" : bench_raw->name);
    fprintf(g_json, ", \"kolo_controller\": ");
    json_string(g_json, runtime_backend("KOLO_CONTROLLER", 0));
    fprintf(g_json, ", \"kolo_cpu_operations\": ");
    json_string(g_json, runtime_backend("KOLO_CPU_OPERATIONS", 1));
    if (bench_gpu) {
        /* rank 0's device; every rank's is KOLO_LOCAL_RANK mod its count */
        fprintf(g_json, ", \"device\": {\"type\": \"cuda\", \"index\": %d, "
                        "\"name\": ",
                bench_dev);
        json_string(g_json, bench_gpu_name);
        fprintf(g_json, "}, \"nccl_version\": ");
        json_string(g_json, bench_nccl_version);
        fprintf(g_json, ", \"host_backend\": ");
        json_string(g_json, bench_raw->name);
    }
    fprintf(g_json, ", \"quick\": %s, \"max_bytes\": %lld,\n  \"env\": {",
            bench_opt.quick ? "true" : "false", bench_opt.max_bytes);
    for (int i = 0; i < N_ENV; i++) {
        const char *v = getenv(g_env_names[i]);
        fprintf(g_json, "%s\"%s\": ", i ? ", " : "", g_env_names[i]);
        if (v)
            json_string(g_json, v);
        else
            fputs("null", g_json);
    }
    fprintf(g_json, "},\n  \"timing\": \"per iteration the slowest rank's "
                    "time (MAX over ranks); median, min and max over the "
                    "timed iterations after warm-up\",\n  \"results\": [");
}

void bench_json_end(void)
{
    if (g_json == NULL)
        return;
    fprintf(g_json, "\n  ],\n  \"wrong\": %d, \"ok\": %s}\n", bench_wrong,
            bench_wrong ? "false" : "true");
    if (fclose(g_json) != 0)
        bench_die("cannot write %s: %s", bench_opt.json, strerror(errno));
    g_json = NULL;
}
