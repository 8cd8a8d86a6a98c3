/*
 * runtime.h — the state of one initialised kolo, shared by the public API
 * (api.c), the background threads (background.c) and negotiation
 * (negotiate.c).
 *
 * The engine's modules, each with its header: pset.c (a set's life
 * cycle), background.c (its thread's loop), negotiate.c (one round's
 * agreement), execute.c (running the round's plan), inflight.c (device
 * batches until the device is done), complete.c (how an entry ends),
 * connect.c (connecting a backend context). They call downwards in that
 * order, never back up: the loop returns to pset.c when its set stops.
 *
 * A job has process sets: the global set (id 0, every rank) and the sets
 * the program adds. Each set a rank belongs to has, on that rank, its own
 * queue, background thread, backend context, response cache and
 * negotiation state (kolo__pset_t), so sets never wait for each other.
 *
 * Ownership: kolo__runtime_t is set up by kolo_init and read-only until
 * kolo_shutdown, except the set table (sets_mu). In a kolo__pset_t, the
 * fields above "background thread only" are set by pset.c before its
 * thread starts (the queue has its own lock, the watchdog's fields are
 * atomic); those below are touched by that thread alone, so they need no
 * lock, and each part names the module that owns it.
 */
#ifndef KOLO_RUNTIME_H
#define KOLO_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "agree.h"
#include "auth.h"
#include "autotune.h"
#include "cache.h"
#include "common.h"
#include "env.h"
#include "handles.h"
#include "inflight.h"
#include "map.h"
#include "message.h"
#include "ops.h"
#include "queue.h"

/* The coordinator's record of one name that some ranks have requested. */
typedef struct kolo__pending_name {
    char *name;
    kolo__params_t *params; /* [size], valid where have[r] */
    uint8_t *have;          /* [size]: 1 asked, 2 asked and its timeline
                               instant written */
    int64_t *at_us;         /* [size]: when each rank's request came */
    int64_t *ready_us;      /* [size]: when each rank enqueued it, on this
                               clock (its request's age) */
    uint64_t *seq;          /* [size]: its place in each rank's enqueues
                               (the request's seq; 0: not known) */
    int nhave;
    int64_t first_us;       /* when the first rank asked */
    int64_t waited_from_us; /* when the first rank enqueued it (the
                               requests' ages): what stall times count */
} kolo__pending_name_t;

typedef struct kolo__runtime kolo__runtime_t;
typedef struct kolo__straggler kolo__straggler_t; /* straggler.c */

typedef struct kolo__pset {
    kolo__runtime_t *rt;
    int id;
    int rank, size;  /* this rank's place in the set */
    int *ranks;      /* [size]: the global rank of each member */
    /* The controller negotiates (and carries wake tokens); the data
     * backend moves tensors. Often the same backend and context. */
    const kolo__ops_t *ctl_ops, *data_ops;
    void *ctl_ctx, *data_ctx;
    int host_ops_released; /* the two contexts finalized (pset.c) */
    const char *const *phase; /* timeline names by collective, static */
    kolo__tune_params_t tune_fixed; /* the configuration's settings */
    kolo__autotune_t *tune;         /* KOLO_AUTOTUNE: the search, or NULL
                                       (its state: the loop's) */
    FILE *tune_log;                 /* KOLO_AUTOTUNE_LOG (global set, rank 0) */
    int gpu_device;  /* the CUDA device of this rank's CUDA tensors in the
                        set: -1 until the first is enqueued (API lock) */
    kolo__outcome_t *watch; /* while it connects: the job's agreement on
                               the outcome (agree.c), or NULL */
    kolo__queue_t queue;
    pthread_t thread;
    int thread_started;
    /* Set by the background thread around calls that wait for peers, read
     * by the watchdog (watchdog.c), which alone uses the two below. */
    _Atomic int64_t wait_since_us; /* 0: not waiting */
    const char *_Atomic wait_what;
    int64_t wait_warned_since, wait_warned_us;
    /* flight.c's (the flight recorder): this rank's enqueues in the set,
     * in all and by collective (under the API lock); the set's fusion
     * batches (its background thread's); what a dump reads of the set
     * while it runs (its background thread stores them, relaxed). */
    struct {
        uint64_t seq, nth[KOLO__COLL_COUNT_];
        int64_t batches;
        _Atomic int64_t rounds;
        _Atomic uint64_t completed;
    } flight;

    /* ---- background thread only, each part with its owner ---- */
    /* negotiate.c's: the protocol's state between rounds. */
    struct {
        kolo__cache_t cache;
        kolo__entry_t **hits;  /* [cache capacity]: entry waiting on that bit */
        size_t nhits;
        kolo__entry_t *uncached_head, *uncached_tail; /* not yet sent */
        kolo__map_t sent;      /* name -> entry sent to the coordinator */
        kolo__map_t table;     /* coordinator: name -> kolo__pending_name_t */
        uint64_t *bits;        /* the round's AND vector */
        size_t nwords, shut_word, join_word, hit_word, inv_word, hit_words,
            check_word;
        uint64_t *lost;        /* [hit_words]: bits this rank could not
                                  store, erased everywhere next round */
        kolo__bytes_t send_buf, recv_buf, resp_buf;
        /* carrying small tensors with the bit vector (negotiate.c's
         * essay): each cached tensor's offset in the carried area
         * ([capacity], SIZE_MAX: none), the round's message and every
         * rank's, the bits of what every rank carried, the reductions */
        size_t *carry_off;
        size_t carry_bytes;    /* one rank's message; 0: nothing carried
                                  this round */
        uint64_t *carry_bits;
        kolo__bytes_t carry_msg, carry_all, carry_out;
        int any_pending;       /* some rank had tensors waiting at the last
                                  round (the loop reads it) */
        /* stall inspector (stall.c; the coordinator's but `blocked`,
         * all_blocked_us and hits_anywhere, which every rank keeps) */
        int64_t stall_warned_us;  /* last warning */
        int stall_hinted;         /* the causes were said (once) */
        kolo__err_t stall_fatal;  /* set: the next round stops the job */
        size_t blocked_word, dump_word; /* the vector's words for them */
        uint8_t *blocked;         /* [size]: rank r's training thread was
                                     blocked in kolo_wait at the last round */
        int64_t *outside_us;      /* [size]: since when rank r has not been
                                     seen blocked (0: it was) */
        int64_t all_blocked_us;   /* since when every rank has been blocked
                                     with nothing ready (0: not) */
        int hits_anywhere;        /* some rank had tensors on cache bits */
        kolo__straggler_t *straggler; /* straggler.c's, or NULL */
        /* join (global set only) */
        kolo__entry_t *join_entry; /* this rank's pending join */
        uint8_t *joined;       /* [size]: ranks joined at the last round */
        int njoined;
    } neg;
    /* The round's plan: negotiate.c fills it, execute.c runs it and
     * empties it (the loop fails what is left when the set stops). */
    kolo__entry_t **ready;
    size_t nready, ready_cap;
    /* execute.c's. */
    struct {
        uint8_t *fusion;       /* persistent fusion buffer */
        size_t fusion_cap;
        size_t *starts;        /* a streamed batch's tensor offsets */
        size_t starts_cap;
        void *dev_ctx;         /* the device backend's context (ops.h),
                                  created by the first CUDA batch */
        kolo__inflight_list_t inflight; /* its batches not yet done */
    } exec;
    /* background.c's: the loop's counters (complete.c counts what
     * completes; negotiate.c reads the round number). */
    int64_t cycles;
    uint64_t completed;    /* entries completed, for progress detection */
    int64_t bytes_done;    /* bytes of completed entries (autotune) */
    int others_waiting;    /* ranks may sleep waiting for this rank's work */
    atomic_int own_stop;   /* an enqueue failed for want of memory: the set
                              stops on this rank (enqueue.c) */
    kolo__err_t stopped;   /* why the loop ended (set before it returns) */
} kolo__pset_t;

struct kolo__runtime {
    kolo__config_t cfg;
    int rank, size;
    kolo__handles_t *handles;
    unsigned generation;   /* counts kolo_init calls: rendezvous prefix */
    int *host_of;          /* [size]: host index of each rank (KOLO_CROSS_RANK,
                              exchanged when the global set starts) */
    struct kolo__timeline *timeline; /* always there; records while started */
    pthread_mutex_t sets_mu;
    kolo__pset_t **sets;   /* [nsets], by id; NULL: removed or not a member */
    int *set_sizes;        /* [nsets]: members, also for non-members; 0: removed */
    int nsets;
    atomic_int other_sets; /* a set besides the global one was ever added
                              (stall.c proves no deadlock then) */
    unsigned set_attempts; /* kolo_add_process_set calls that got as far as
                              agreeing (the same count on every rank) */
    struct kolo__watchdog *watchdog; /* watchdog.c, or NULL */
    /* The job's key (auth.h: from KOLO_SECRET or HOROVOD_SECRET_KEY),
     * which every context's connections prove; have_job_key 0: none. */
    uint8_t job_key[KOLO__KEY_BYTES];
    int have_job_key;
    struct kolo__flight *flight; /* flight.c's recorder, or NULL: off */
};

/* The settings in force: the autotuner's while it runs, else the
 * configuration's. */
static inline const kolo__tune_params_t *kolo__tuned(const kolo__pset_t *ps)
{
    return ps->tune != NULL ? &ps->tune->cur : &ps->tune_fixed;
}

#endif /* KOLO_RUNTIME_H */
