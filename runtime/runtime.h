/*
 * runtime.h — the state of one initialised kolo, shared by the public API
 * (api.c) and the background thread (background.c, negotiate.c).
 *
 * Ownership: fields above "background thread only" are set by kolo_init and
 * read-only until kolo_shutdown, or are thread-safe objects (the queue, the
 * handle table). Fields below are touched by the background thread alone,
 * so they need no lock.
 */
#ifndef KOLO_RUNTIME_H
#define KOLO_RUNTIME_H

#include <pthread.h>
#include <stdint.h>

#include "cache.h"
#include "common.h"
#include "env.h"
#include "handles.h"
#include "map.h"
#include "message.h"
#include "ops.h"
#include "queue.h"

/* The coordinator's record of one name that some ranks have requested. */
typedef struct kolo__pending_name {
    char *name;
    kolo__params_t *params; /* [size], valid where have[r] */
    uint8_t *have;          /* [size] */
    int nhave;
} kolo__pending_name_t;

typedef struct kolo__runtime {
    kolo__config_t cfg;
    int rank, size;
    const kolo__ops_t *ops;
    void *ops_ctx;
    kolo__queue_t queue;
    kolo__handles_t *handles; /* the process-wide table (api.c) */
    pthread_t thread;
    int thread_started;

    /* ---- background thread only ---- */
    kolo__cache_t cache;
    kolo__entry_t **hits;  /* [cache capacity]: entry waiting on that bit */
    kolo__entry_t *uncached_head, *uncached_tail; /* not yet sent */
    kolo__map_t sent;      /* name -> entry sent to the coordinator */
    kolo__map_t table;     /* coordinator: name -> kolo__pending_name_t */
    uint64_t *bits;        /* the cycle's AND vector */
    size_t nwords, shut_word, hit_word, inv_word, hit_words;
    size_t nhits;          /* entries in hits[] */
    kolo__entry_t **ready; /* this cycle's plan, filled by kolo__negotiate */
    size_t nready, ready_cap;
    uint8_t *fusion;       /* persistent fusion buffer */
    size_t fusion_cap;
    kolo__bytes_t send_buf, recv_buf, resp_buf;
    int64_t cycles;
    int any_pending;       /* some rank had tensors waiting at the last round */
    int others_waiting;    /* ranks may sleep waiting for this rank's work */
    uint64_t completed; /* entries completed, for progress detection */
} kolo__runtime_t;

/* background.c. The queue is initialised by the caller first (the backend
 * may deliver wake tokens to it as soon as it is connected). */
int kolo__runtime_start(kolo__runtime_t *rt, kolo__err_t *err);
/* Finishes what kolo__runtime_start set up; the thread has been joined. */
void kolo__runtime_free(kolo__runtime_t *rt);
/* The backend's on_wake callback; arg is the runtime. */
void kolo__wake_from_peer(void *arg, uint64_t round);
void *kolo__background_main(void *arg);

/* Completes an entry: releases its name and completes its handle. Frees
 * the entry. */
void kolo__complete(kolo__runtime_t *rt, kolo__entry_t *e, int status,
                    const char *msg);

/* negotiate.c: one negotiation round. `fresh` are the entries taken from
 * the queue this cycle. Fills rt->ready / rt->nready with the entries that
 * are ready on every rank, in plan order, and completes the ones that
 * failed negotiation (mismatches). Sets *stop_rank to the lowest rank that
 * asked to shut down, or -1. A failure returned here (the backend, or a
 * protocol error) ends the job. */
int kolo__negotiate(kolo__runtime_t *rt, kolo__entry_t *fresh, int shutdown,
                    int *stop_rank, kolo__err_t *err);
int kolo__negotiate_init(kolo__runtime_t *rt);
void kolo__negotiate_free(kolo__runtime_t *rt);
/* Calls fn on every entry the negotiation still holds, removing them. */
void kolo__negotiate_drain(kolo__runtime_t *rt,
                           void (*fn)(kolo__runtime_t *, kolo__entry_t *,
                                      const kolo__err_t *),
                           const kolo__err_t *why);
/* 1 when this rank holds entries that wait for other ranks. */
int kolo__negotiate_pending(const kolo__runtime_t *rt);

#endif /* KOLO_RUNTIME_H */
