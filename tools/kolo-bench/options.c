/*
 * options.c — the command line: the usage, the options into bench_opt,
 * and the iterations each workload runs unless --iters and --warmup say.
 * Usage errors are said by rank 0 before anything connects, exit status 2.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define DEFAULT_MAX_BYTES (256 * MIB)
#define QUICK_MAX_BYTES (1 * MIB)

bench_options_t bench_opt;

int bench_iters_or(int def)
{
    return bench_opt.iters > 0 ? bench_opt.iters : def;
}

int bench_warmup_or(int def)
{
    return bench_opt.warmup >= 0 ? bench_opt.warmup : def;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kolorun -np N kolo-bench [options]\n"
        "  --workload W      large, resnet50, small, latency, fp16 or all\n"
        "                    (several: comma-separated; default all)\n"
        "  --backend B       the backend called directly (raw): gloo (default),\n"
        "                    mpi, shm (kolo's own shared-memory transport), or\n"
        "                    nccl: the tensors on CUDA devices (device\n"
        "                    KOLO_LOCAL_RANK mod the devices visible), kolo\n"
        "                    against NCCL called directly on the same bytes.\n"
        "                    kolo itself runs as in training: KOLO_CONTROLLER\n"
        "                    and KOLO_CPU_OPERATIONS choose its backends\n"
        "                    (default: shared memory within a host)\n"
        "  --compare B,B     more backends called directly in the same run, as\n"
        "                    extra figures of large, resnet50, small, latency\n"
        "                    (mpi: run under kolorun --mpi or mpirun)\n"
        "  --json FILE       rank 0 writes the results there as JSON\n"
        "  --iters N         timed iterations per figure (default: by workload\n"
        "                    and size, e.g. 30 for small tensors, 5 for 64 MiB)\n"
        "  --warmup N        untimed iterations before them (default: 1-20)\n"
        "  --max-bytes B     largest tensor of large and fp16 (default 256M;\n"
        "                    suffixes K, M, G are powers of 1024)\n"
        "  --quick           a short run: sizes up to 1 MiB, few iterations\n"
        "Every figure is measured through kolo and with the backend called\n"
        "directly on one buffer of the same bytes (raw), in the same run;\n"
        "times are the slowest rank's, median over the iterations.\n"
        "Exit status: 0, 1 if a result was WRONG, 2 on any other failure,\n"
        "77 if --backend nccl cannot run here (a build without GPU support,\n"
        "or no CUDA device visible; one line on stderr says which).\n");
}

long long bench_parse_bytes(const char *s)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        v *= KIB, end++;
    else if (*end == 'M' || *end == 'm')
        v *= MIB, end++;
    else if (*end == 'G' || *end == 'g')
        v *= GIB, end++;
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0' || v > 64.0 * GIB)
        return -1;
    return (long long)v;
}

static int parse_int(const char *s, int min)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > 1000000)
        return -1;
    return (int)v;
}

void bench_bad_usage(const char *fmt, const char *arg)
{
    if (bench_rank == 0) {
        fprintf(stderr, "kolo-bench: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n");
        usage(stderr);
    }
    exit(2);
}

static void parse_workloads(const char *list)
{
    char buf[256], *save = NULL, *w;
    snprintf(buf, sizeof(buf), "%s", list);
    for (w = strtok_r(buf, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        if (strcmp(w, "all") == 0)
            bench_opt.large = bench_opt.resnet50 = bench_opt.small =
                bench_opt.latency = bench_opt.fp16 = 1;
        else if (strcmp(w, "large") == 0)
            bench_opt.large = 1;
        else if (strcmp(w, "resnet50") == 0)
            bench_opt.resnet50 = 1;
        else if (strcmp(w, "small") == 0)
            bench_opt.small = 1;
        else if (strcmp(w, "latency") == 0)
            bench_opt.latency = 1;
        else if (strcmp(w, "fp16") == 0)
            bench_opt.fp16 = 1;
        else
            bench_bad_usage("unknown workload '%s'", w);
    }
}

void bench_parse_args(int argc, char **argv)
{
    int any = 0;
    bench_opt.backend = "gloo";
    bench_opt.iters = -1;
    bench_opt.warmup = -1;
    bench_opt.max_bytes = DEFAULT_MAX_BYTES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (bench_rank == 0)
                usage(stdout);
            exit(0);
        } else if (strcmp(a, "--quick") == 0) {
            bench_opt.quick = 1;
            continue;
        }
        if (v == NULL)
            bench_bad_usage("%s needs a value", a);
        i++;
        if (strcmp(a, "--workload") == 0) {
            parse_workloads(v);
            any = 1;
        } else if (strcmp(a, "--backend") == 0) {
            bench_opt.backend = v;
        } else if (strcmp(a, "--compare") == 0) {
            bench_opt.compare = v;
        } else if (strcmp(a, "--json") == 0) {
            bench_opt.json = v;
        } else if (strcmp(a, "--iters") == 0) {
            if ((bench_opt.iters = parse_int(v, 1)) < 0)
                bench_bad_usage("--iters: '%s' is not a number >= 1", v);
        } else if (strcmp(a, "--warmup") == 0) {
            if ((bench_opt.warmup = parse_int(v, 0)) < 0)
                bench_bad_usage("--warmup: '%s' is not a number >= 0", v);
        } else if (strcmp(a, "--max-bytes") == 0) {
            if ((bench_opt.max_bytes = bench_parse_bytes(v)) < 4)
                bench_bad_usage(
                    "--max-bytes: '%s' is not a size of 4 bytes or more "
                    "(like 4096, 64M, 1G)",
                    v);
        } else {
            bench_bad_usage("unknown option '%s'", a);
        }
    }
    if (!any)
        parse_workloads("all");
    if (bench_opt.quick && bench_opt.max_bytes > QUICK_MAX_BYTES)
        bench_opt.max_bytes = QUICK_MAX_BYTES;
}
