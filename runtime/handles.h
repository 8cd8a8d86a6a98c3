/*
 * handles.h — the handle table: what the training thread polls and waits
 * on.
 *
 * A handle is created IN_PROGRESS when a tensor is enqueued, completed once
 * by the background thread with a status and, on failure, a message, and
 * released by kolo_wait. Ids only grow, so a released or never-issued id is
 * recognised and refused. The table outlives kolo_shutdown, so a handle
 * completed by the shutdown can still be waited afterwards.
 */
#ifndef KOLO_HANDLES_H
#define KOLO_HANDLES_H

#include <pthread.h>
#include <stdatomic.h>

#include "common.h"
#include "map.h"

/* Where the training threads are (the flight recorder's, flight.c, which
 * also writes it): kept in the handle table because a kolo_wait may
 * outlast the runtime that kolo_shutdown frees, never the table. */
typedef struct kolo__handles_waits {
    atomic_int inside;            /* threads blocked in kolo_wait */
    _Atomic int64_t since_us;     /* when the first of them entered; 0: none */
    _Atomic int64_t outside_us;   /* when a thread last left kolo */
    _Atomic kolo_handle_t handle; /* the handle waited on last */
} kolo__handles_waits_t;

typedef struct kolo__handles {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* broadcast on every completion */
    kolo__map_t map;   /* id -> record */
    kolo_handle_t next_id;
    kolo__handles_waits_t waits;
} kolo__handles_t;

int kolo__handles_init(kolo__handles_t *h);
void kolo__handles_destroy(kolo__handles_t *h);

/* A new IN_PROGRESS handle. */
int kolo__handles_new(kolo__handles_t *h, kolo_handle_t *id, kolo__err_t *err);

/* Sets the final status (msg may be NULL when status is KOLO_OK) and wakes
 * the waiters. Completing twice keeps the first result. */
void kolo__handles_complete(kolo__handles_t *h, kolo_handle_t id, int status,
                            const char *msg);

/* The same, attaching an output that kolo__handles_wait_output hands over;
 * the table frees it with free_fn if nobody takes it. Takes ownership of
 * output in every case. */
void kolo__handles_complete_output(kolo__handles_t *h, kolo_handle_t id,
                                   int status, const char *msg, void *output,
                                   void (*free_fn)(void *));

/* What a completed handle hands its waiter besides the status: an output
 * (a result), and for a tensor in device memory the completion of its
 * batch (inflight.h) and the program's stream at enqueue. Each pointer
 * comes with the function that frees it. */
typedef struct kolo__handoff {
    void *output;
    void (*output_free)(void *);
    void *done;
    void (*done_free)(void *);
    void *stream;
} kolo__handoff_t;

/* kolo__handles_complete with a handoff; takes ownership of what it holds
 * in every case (a failed handle drops it). */
void kolo__handles_complete_handoff(kolo__handles_t *h, kolo_handle_t id,
                                    int status, const char *msg,
                                    const kolo__handoff_t *ho);

/* KOLO_IN_PROGRESS, the final status, or KOLO_ERR_INVALID_HANDLE. */
int kolo__handles_poll(kolo__handles_t *h, kolo_handle_t id, kolo__err_t *err);

/* Blocks until done, releases the handle and returns its status; the
 * message of a failure goes to err. */
int kolo__handles_wait(kolo__handles_t *h, kolo_handle_t id, kolo__err_t *err);

/* kolo__handles_wait, handing over the attached output (NULL if none). */
int kolo__handles_wait_output(kolo__handles_t *h, kolo_handle_t id,
                              kolo__err_t *err, void **output);

/* kolo__handles_wait, handing over the whole handoff (zeroed if none): the
 * caller frees what it holds. */
int kolo__handles_wait_handoff(kolo__handles_t *h, kolo_handle_t id,
                               kolo__err_t *err, kolo__handoff_t *ho);

/* The message of a done, failed, unreleased handle, else NULL. */
const char *kolo__handles_error(kolo__handles_t *h, kolo_handle_t id);

/* Number of handles not yet released. */
size_t kolo__handles_count(kolo__handles_t *h);

#endif /* KOLO_HANDLES_H */
