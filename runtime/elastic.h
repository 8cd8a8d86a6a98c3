/*
 * elastic.h — an elastic job's membership as kolorun publishes it in the
 * job's store (design in elastic.c).
 */
#ifndef KOLO_ELASTIC_H
#define KOLO_ELASTIC_H

#include "common.h"

/* The updates that made a generation (elastic/<g>/update), as the bits
 * kolo_hosts_updated() returns. */
#define KOLO__ELASTIC_REMOVED 1
#define KOLO__ELASTIC_ADDED 2

/* A worker's place in one generation. */
typedef struct kolo__elastic_place {
    unsigned generation;
    int rank, size, local_rank, local_size, cross_rank, cross_size;
    char update[16]; /* why the generation exists: start, failure, ... */
} kolo__elastic_place_t;

/* Waits, up to timeout_s, for a generation newer than `after` and finds
 * worker `id` in it. KOLO_OK with *out; KOLO_ERR_REMOVED when the newest
 * generation does not include the worker; KOLO_ERR_SHUTDOWN when kolorun
 * ended the job (its reason in the message); KOLO_ERR_TIMEOUT. */
int kolo__elastic_join(const char *rendezvous, const char *id,
                       unsigned after, double timeout_s,
                       kolo__elastic_place_t *out, kolo__err_t *err);

/* Derives the place of worker `id` from a generation's member list (one
 * host:slot a line, in rank order). 0, or -1 when id is not there. */
int kolo__elastic_place(const char *members, const char *id,
                        kolo__elastic_place_t *out);

/* The updates of the generations after `joined`, OR'ed
 * (KOLO__ELASTIC_*; a failure counts as both); 0 when there is none. A
 * negative status when the store cannot be read. */
int kolo__elastic_updates(const char *rendezvous, unsigned joined);

/* Closes the store kolo__elastic_updates keeps open. */
void kolo__elastic_close(void);

#endif /* KOLO_ELASTIC_H */
