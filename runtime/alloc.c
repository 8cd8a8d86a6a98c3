/*
 * alloc.c — libkolo's allocator and thread starter, with the tests' fault
 * injection (the contract is in alloc.h).
 *
 * The fast path is one relaxed load of `active`, false outside the tests.
 * When a test arms a fault (or asks for the count), every allocation of a
 * counted thread takes a number from an atomic counter; the one numbered
 * nth (and, when persistent, every later one) returns NULL instead of
 * memory. Numbers are taken in whatever order the threads of a rank run,
 * so a sweep over n meets each allocation of a deterministic stretch of
 * code once, and the others at some n.
 */
#define _GNU_SOURCE
#include "alloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fault {
    atomic_long count;  /* counted so far */
    atomic_long failed; /* failures injected */
    atomic_long nth;    /* 0: none to inject */
    atomic_int persistent;
    atomic_int rank;    /* the threads that count (-1: all) */
} fault_t;

static fault_t g_fault[KOLO__FAULT_KINDS];
static atomic_int active;             /* some kind counts */
static _Thread_local int thread_rank = -1;
static char count_file[4096];

/* 1 when this call must fail. */
static int inject(kolo__fault_kind_t kind)
{
    fault_t *f = &g_fault[kind];
    int rank = atomic_load_explicit(&f->rank, memory_order_relaxed);
    long n, nth;

    if (rank >= 0 && rank != thread_rank)
        return 0;
    n = atomic_fetch_add_explicit(&f->count, 1, memory_order_relaxed) + 1;
    nth = atomic_load_explicit(&f->nth, memory_order_relaxed);
    if (nth > 0 && (n == nth || (atomic_load_explicit(&f->persistent,
                                                      memory_order_relaxed) &&
                                 n > nth))) {
        atomic_fetch_add_explicit(&f->failed, 1, memory_order_relaxed);
        return 1;
    }
    return 0;
}

#define FAULT(kind)                                                           \
    (atomic_load_explicit(&active, memory_order_relaxed) && inject(kind))

void *kolo__malloc(size_t n)
{
    return FAULT(KOLO__FAULT_ALLOC) ? NULL : malloc(n);
}

void *kolo__calloc(size_t n, size_t size)
{
    return FAULT(KOLO__FAULT_ALLOC) ? NULL : calloc(n, size);
}

void *kolo__realloc(void *p, size_t n)
{
    return FAULT(KOLO__FAULT_ALLOC) ? NULL : realloc(p, n);
}

void *kolo__aligned_alloc(size_t align, size_t n)
{
    return FAULT(KOLO__FAULT_ALLOC) ? NULL : aligned_alloc(align, n);
}

char *kolo__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = kolo__malloc(n);
    if (p != NULL)
        memcpy(p, s, n);
    return p;
}

int kolo__thread_create(pthread_t *t, const pthread_attr_t *attr,
                        void *(*fn)(void *), void *arg)
{
    if (FAULT(KOLO__FAULT_THREAD))
        return EAGAIN; /* what pthread_create says when it cannot */
    return pthread_create(t, attr, fn, arg);
}

void kolo__thread_stop(pthread_t thread, pthread_mutex_t *mu,
                       pthread_cond_t *cv, int *stop)
{
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_signal(cv);
    pthread_mutex_unlock(mu);
    pthread_join(thread, NULL);
}

void kolo__fault_arm(kolo__fault_kind_t kind, long nth, int persistent, int rank)
{
    fault_t *f = &g_fault[kind];
    int any = count_file[0] != '\0';

    /* The count and the target first, then the rank that selects the
     * threads: a thread running meanwhile counts against one or the
     * other arming, never half of each. */
    atomic_store(&f->rank, -2); /* no thread has rank -2: none counts */
    atomic_store(&f->count, 0);
    atomic_store(&f->failed, 0);
    atomic_store(&f->nth, nth > 0 ? nth : 0);
    atomic_store(&f->persistent, persistent);
    atomic_store(&f->rank, rank);
    for (int k = 0; k < KOLO__FAULT_KINDS; k++)
        any |= atomic_load(&g_fault[k].nth) > 0;
    atomic_store(&active, any);
}

void kolo__fault_thread_rank(int rank)
{
    thread_rank = rank;
}

int kolo__fault_get_thread_rank(void)
{
    return thread_rank;
}

long kolo__fault_count(kolo__fault_kind_t kind)
{
    return atomic_load(&g_fault[kind].count);
}

long kolo__fault_failed(kolo__fault_kind_t kind)
{
    return atomic_load(&g_fault[kind].failed);
}

/* ---- armed from the environment (a process of a job) ---------------------- */

static void arm_from(const char *var, kolo__fault_kind_t kind)
{
    const char *v = getenv(var);
    char *end;
    long n;

    if (v == NULL || v[0] == '\0')
        return;
    errno = 0;
    n = strtol(v, &end, 10);
    if (errno != 0 || end == v || n < 1 || (*end != '\0' && strcmp(end, "+") != 0)) {
        fprintf(stderr, "kolo: %s='%s' is not N or N+ (N >= 1); ignored\n", var, v);
        return;
    }
    atomic_store(&g_fault[kind].nth, n);
    atomic_store(&g_fault[kind].persistent, *end == '+');
    atomic_store(&g_fault[kind].rank, -1);
    atomic_store(&active, 1);
}

static void write_counts(void)
{
    FILE *f = fopen(count_file, "w");
    if (f == NULL)
        return;
    fprintf(f, "allocations %ld threads %ld\n",
            kolo__fault_count(KOLO__FAULT_ALLOC),
            kolo__fault_count(KOLO__FAULT_THREAD));
    fclose(f);
}

__attribute__((constructor)) static void fault_from_env(void)
{
    const char *file = getenv("KOLO_TEST_COUNT_FILE");

    for (int k = 0; k < KOLO__FAULT_KINDS; k++)
        atomic_store(&g_fault[k].rank, -1);
    arm_from("KOLO_TEST_FAIL_ALLOC", KOLO__FAULT_ALLOC);
    arm_from("KOLO_TEST_FAIL_THREAD", KOLO__FAULT_THREAD);
    if (file != NULL && file[0] != '\0' && strlen(file) < sizeof(count_file)) {
        strcpy(count_file, file);
        atomic_store(&active, 1);
        atexit(write_counts);
    }
}
