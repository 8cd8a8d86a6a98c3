/*
 * main.c — kolo-bench's main: the command line, then kolo and the raw
 * side, the workloads asked for, the summary, and the way out (bench.h
 * describes the tool; the exit statuses are the usage's, in options.c).
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"
#include "bench.h"

/* --backend: one this build has, and that can run where we are. */
static void check_backend(void)
{
    bench_gpu = strcmp(bench_opt.backend, "nccl") == 0;
    if (bench_gpu && bench_opt.compare != NULL)
        bench_bad_usage("--compare %s: it adds host backends, not with "
                        "--backend nccl", bench_opt.compare);
    if (!bench_gpu && kolo__ops_named(bench_opt.backend) == NULL) {
        char msg[256];
        kolo__ops_names(msg, sizeof(msg));
        snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
                 "%s", " are in this build, and nccl for CUDA tensors; "
                 "not '%s'");
        bench_bad_usage(msg, bench_opt.backend);
    }
    if (bench_gpu)
        bench_gpu_require(); /* or exit 77, saying why */
    if (strcmp(bench_opt.backend, "mpi") == 0 && getenv("KOLO_RANK") != NULL)
        bench_bad_usage("--backend mpi needs the job started by MPI: run %s",
                        "kolorun --mpi -np N kolo-bench --backend mpi (or "
                        "mpirun -np N kolo-bench --backend mpi)");
}

/* Both sides up: the runtime, the raw backend (and NCCL's), the expected
 * results, and the header of the report. The runtime runs as this job
 * would run a training loop: its backends are the environment's
 * (KOLO_CONTROLLER, KOLO_CPU_OPERATIONS), by default its own choice
 * (shared memory for the ranks of one host). --backend picks what it is
 * measured against. */
static void start(void)
{
    int rc;

    bench_sum_f32 = kolo__reduce_get(KOLO_FLOAT32, KOLO_OP_SUM);
    bench_max_f64 = kolo__reduce_get(KOLO_FLOAT64, KOLO_OP_MAX);
    bench_max_i32 = kolo__reduce_get(KOLO_INT32, KOLO_OP_MAX);
    if (!bench_sum_f32 || !bench_max_f64 || !bench_max_i32)
        bench_die("internal error: no reduction kernel");

    if ((rc = kolo_init()) != KOLO_OK)
        bench_die("kolo_init failed: %s (%s)", kolo_last_error(),
                  kolo_strerror(rc));
    bench_rank = kolo_rank();
    bench_size = kolo_size();
    bench_parse_compare();
    bench_raw_init(bench_gpu ? bench_nccl_host_backend() : bench_opt.backend);
    if (bench_gpu)
        bench_gpu_init();
    bench_data_init();
    bench_print_header();
    bench_json_begin();
}

static void run_workloads(void)
{
    if (bench_opt.large)
        bench_workload_large();
    if (bench_opt.resnet50)
        bench_workload_resnet50();
    if (bench_opt.small)
        bench_workload_many(BENCH_SMALL_TENSORS);
    if (bench_opt.latency)
        bench_workload_many(1);
    if (bench_opt.fp16)
        bench_workload_fp16();
}

/* The summary, then both sides down. */
static void finish(void)
{
    bench_json_end();
    if (bench_rank == 0) {
        if (bench_wrong)
            printf("\n%d result%s WRONG\n", bench_wrong,
                   bench_wrong == 1 ? "" : "s");
        else
            printf("\nevery result checked: ok\n");
        fflush(stdout);
    }
    /* Every rank is done with kolo before the first one shuts it down. */
    bench_barrier();
    if (kolo_shutdown() != KOLO_OK)
        bench_die("kolo_shutdown failed: %s", kolo_last_error());
    if (bench_gpu)
        bench_gpu_finalize();
    bench_raw_finalize();
}

int main(int argc, char **argv)
{
    const char *r = getenv("KOLO_RANK");

    /* Usage errors before connecting: only rank 0 talks. */
    bench_rank = r ? atoi(r) : 0;
    bench_parse_args(argc, argv);
    check_backend();
    bench_resnet50_selfcheck();
    bench_fault = bench_env_or("KOLO_BENCH_FAULT", "0")[0] == '1';

    start();
    run_workloads();
    finish();
    return bench_wrong ? 1 : 0;
}
