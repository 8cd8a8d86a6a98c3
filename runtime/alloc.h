/*
 * alloc.h — every allocation libkolo makes, and every thread it starts,
 * goes through these functions, so that the tests can make the n-th one
 * fail (SQLite's way of testing what happens when memory runs out).
 *
 * Outside the tests they are malloc, calloc, realloc, aligned_alloc,
 * strdup and pthread_create, behind one relaxed atomic load that is false.
 * A test arms a fault in one of two ways:
 *
 *  - a process (one rank of a job: tests/fault/run-faults.sh) through its
 *    environment, read once when the library loads:
 *      KOLO_TEST_FAIL_ALLOC=N    the N-th allocation fails (1-based); with
 *                                a '+' (N+) it and every later one fail
 *      KOLO_TEST_FAIL_THREAD=N   the same for the threads kolo starts
 *      KOLO_TEST_COUNT_FILE=F    at exit, F gets "allocations A threads T":
 *                                how many there were (the sweep's range)
 *    Every thread of the process counts.
 *  - the unit tests' ranks-as-threads (tests/unit/ranks.c) with
 *    kolo__fault_arm(): only the threads marked with that rank
 *    (kolo__fault_thread_rank) count; a rank's background thread is marked
 *    with its rank when it starts.
 *
 * Nothing else in kolo reads these variables; they are for tests only.
 */
#ifndef KOLO_ALLOC_H
#define KOLO_ALLOC_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *kolo__malloc(size_t n);
void *kolo__calloc(size_t n, size_t size);
void *kolo__realloc(void *p, size_t n);
void *kolo__aligned_alloc(size_t align, size_t n);
/* NULL when memory runs out: the caller reports KOLO_ERR_NO_MEMORY with
 * what it was allocating. */
char *kolo__strdup(const char *s);
/* pthread_create, or EAGAIN when a test says this thread cannot be had. */
int kolo__thread_create(pthread_t *t, const pthread_attr_t *attr,
                        void *(*fn)(void *), void *arg);

/* Stops a worker thread that kolo started and that waits on `cv` under
 * `mu` until *stop is set (the watchdog, the timeline's writer, a test
 * backend's delivery thread): sets *stop under the lock, wakes the thread
 * and waits for it to end. */
void kolo__thread_stop(pthread_t thread, pthread_mutex_t *mu,
                       pthread_cond_t *cv, int *stop);

/* ---- for the tests ------------------------------------------------------- */

typedef enum kolo__fault_kind {
    KOLO__FAULT_ALLOC,
    KOLO__FAULT_THREAD,
    KOLO__FAULT_KINDS
} kolo__fault_kind_t;

/* From now on, the nth (1-based) allocation or thread of `kind` made by a
 * thread marked `rank` fails (rank -1: by any thread), and with
 * `persistent` every one after it too; nth 0 disarms. Resets the count. */
void kolo__fault_arm(kolo__fault_kind_t kind, long nth, int persistent, int rank);
/* Marks the calling thread as working for `rank` (-1: for none). */
void kolo__fault_thread_rank(int rank);
int kolo__fault_get_thread_rank(void);
/* How many of `kind` were counted since the last arm; how many failed. */
long kolo__fault_count(kolo__fault_kind_t kind);
long kolo__fault_failed(kolo__fault_kind_t kind);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_ALLOC_H */
