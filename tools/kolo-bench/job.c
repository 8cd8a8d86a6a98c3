/*
 * job.c — the job as kolo-bench sees it: this rank, the number of ranks,
 * the count of WRONG results, and the helpers every file uses (dying with
 * a message, aligned allocation, the environment). The tool as a whole is
 * described in bench.h.
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench.h"

int bench_rank, bench_size;
int bench_wrong; /* WRONG results seen (any rank) */
int bench_fault; /* KOLO_BENCH_FAULT=1: see bench_measure() */

void bench_die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kolo-bench: rank %d: ", bench_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    /* kolorun stops the other ranks when one exits non-zero. */
    exit(2);
}

void *bench_xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        bench_die("out of memory allocating %zu bytes", bytes);
    return p;
}

const char *bench_env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && v[0] ? v : def;
}
