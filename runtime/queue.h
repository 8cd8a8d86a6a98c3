/*
 * queue.h — the tensor queue between the training threads and the
 * background thread.
 *
 * Training threads push entries (an enqueued tensor: name, buffers,
 * parameters, handle); the background thread takes everything pushed so
 * far in one call. The queue also owns the set of names in flight on this
 * rank, so a second enqueue of a name that has not completed is refused at
 * once, and it carries the two signals that end the background thread's
 * sleep: new work, and a shutdown request.
 *
 * One mutex and one condition variable; the background thread sleeps on the
 * condition variable with a timeout and is woken by every push, so it never
 * spins and never misses work. A third signal comes from other ranks: a
 * wake token (ops.h) asking this rank to join negotiation round r. It
 * counts only while this rank has not run round r yet, so a token that
 * arrives while the rank is already in that round is not taken for a new
 * request later.
 */
#ifndef KOLO_QUEUE_H
#define KOLO_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common.h"
#include "map.h"
#include "message.h"

typedef struct kolo__entry {
    struct kolo__entry *next; /* link in the queue or a pending list */
    char *name;               /* owned */
    kolo_handle_t handle;
    const void *input;
    void *output;
    kolo__params_t params;
    int64_t enqueued_us;
    uint64_t seq;     /* this rank's enqueue count in its set, 1-based
                         (flight.c sets it; 0: not counted) */
    int64_t asked_us; /* when this rank last sent it to the coordinator */
    int64_t rows;    /* allgather, alltoall: this rank's first dimension */
    int64_t *splits; /* alltoall: rows sent to each rank (owned) */
    void *scratch;   /* a buffer the entry owns (a join's zeros) */
    struct kolo__result *result; /* output for the handle, owned until
                                    completion hands it over */
    /* CUDA tensors (params.device_type KOLO_DEVICE_CUDA): the device, and
     * an event recorded on the program's stream at enqueue, released with
     * ready_free when the entry is freed. A join's stand-in has no event
     * and host zeros in scratch. */
    int device;
    void *ready_event;
    void (*ready_free)(void *event);
    void *stream; /* the program's stream at enqueue (kolo_opts_t) */
    /* Once the entry's batch is queued on the device: its completion
     * (inflight.h), borrowed from execute.c, which holds a reference until
     * the entry is completed (the handle takes one of its own). */
    struct kolo__done *done;
    int tl_depth; /* timeline spans open on this tensor's lane */
    /* An allreduce whose reduction came with the agreement (negotiate.c):
     * the result, valid until the round's plan has run; else NULL. */
    const void *carried;
    /* Its record in the flight recorder (flight.c: the recorder's count of
     * records when it was made, which names the ring's slot); 0: none. */
    uint64_t flight;
} kolo__entry_t;

/* Output of an allgather, alltoall or reducescatter (or a join's last
 * rank), attached to its handle until kolo_wait_result hands it over. */
typedef struct kolo__result {
    void *data;
    size_t bytes;
    int ndim;
    int64_t shape[KOLO_MAX_DIMS];
    int nsplits;
    int64_t *splits;
    int device_type, device; /* where data lives (kolo_result_t) */
    void (*data_free)(void *data); /* device memory: its release */
} kolo__result_t;

/* Frees a result and what it holds; takes a void * to serve as the handle
 * table's destructor. */
void kolo__result_free(void *result);

/* Allocates an entry with a copy of the name; NULL when out of memory. */
kolo__entry_t *kolo__entry_new(const char *name);
void kolo__entry_free(kolo__entry_t *e);

typedef struct kolo__queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kolo__entry_t *head, *tail;
    kolo__map_t in_flight; /* name -> entry, from push until release */
    int shutdown_requested;
    int wake_set;        /* a peer asked for round wake_round */
    uint64_t wake_round; /* the highest round asked for */
    int closed; /* pushes are refused with close_err */
    kolo__err_t close_err;
    /* Entries pushed in all, and how many of them the background thread
     * had taken at its last take (written under mu, read without it by
     * the flight recorder: pushed == taken, nothing waits in the queue). */
    _Atomic uint64_t pushed, taken;
} kolo__queue_t;

int kolo__queue_init(kolo__queue_t *q);
/* Frees the entries still queued (the caller has completed them). */
void kolo__queue_destroy(kolo__queue_t *q);

/* Adds the entry and wakes the background thread. Fails with
 * KOLO_ERR_DUPLICATE_NAME when the name is in flight, or with the close
 * error once the queue is closed; the entry is not taken then. */
int kolo__queue_push(kolo__queue_t *q, kolo__entry_t *e, kolo__err_t *err);

/* Adds n entries at once (a group): all or none. Fails like
 * kolo__queue_push, naming the first name in flight. */
int kolo__queue_push_many(kolo__queue_t *q, kolo__entry_t **es, size_t n,
                          kolo__err_t *err);

/* Waits until work is queued, a shutdown is requested, or timeout_us
 * passes (0: do not wait; < 0: no timeout), then detaches and returns the
 * queued entries in push order (NULL if none). *shutdown is set to 1 once a
 * shutdown has been requested. */
kolo__entry_t *kolo__queue_take(kolo__queue_t *q, int64_t timeout_us,
                                int *shutdown);

/* Why kolo__queue_take_round returned. */
typedef enum kolo__wake_reason {
    KOLO__WOKE_WORK = 1,     /* entries were queued */
    KOLO__WOKE_SHUTDOWN = 2, /* a shutdown was requested */
    KOLO__WOKE_PEER = 3,     /* a peer asked for this round */
    KOLO__WOKE_TIMEOUT = 4   /* nothing; the timeout passed (or was 0) */
} kolo__wake_reason_t;

/* kolo__queue_take for the background thread: also returns when a peer
 * asked for round `next_round` or a later one, and says why it returned.
 * Tokens for rounds before next_round are stale and ignored. */
kolo__entry_t *kolo__queue_take_round(kolo__queue_t *q, int64_t timeout_us,
                                      uint64_t next_round, int *shutdown,
                                      kolo__wake_reason_t *reason);

/* A peer asks this rank to run round `round` (called from the backend's
 * thread). */
void kolo__queue_peer_wake(kolo__queue_t *q, uint64_t round);

/* Like take's wait, without taking: returns 1 when work or a shutdown
 * request is there. */
int kolo__queue_wait(kolo__queue_t *q, int64_t timeout_us);

/* The name's operation has completed: it may be enqueued again. */
void kolo__queue_release(kolo__queue_t *q, const char *name);

void kolo__queue_request_shutdown(kolo__queue_t *q);

/* From now on pushes fail with this error. */
void kolo__queue_close(kolo__queue_t *q, const kolo__err_t *err);

#endif /* KOLO_QUEUE_H */
