/*
 * shm_ops.h — the halves of an allreduce through shared memory, for the
 * hierarchical backend (ops/hier), which runs the network between them.
 * Both take the batch through a stream (ops.h: kolo__ops_stream_t), so
 * that the user's tensors go straight into the shared slots and the
 * results straight back into them, with no fusion buffer in between.
 *
 * Rank j's block of the batch is elements [offs[j], offs[j] + counts[j]),
 * offs[j] the sum of the counts before j; every member passes the same
 * counts (ctx: a context of kolo__ops_shm).
 */
#ifndef KOLO_OPS_SHM_OPS_H
#define KOLO_OPS_SHM_OPS_H

#include <stddef.h>

#include "ops.h"

/* Reduces this rank's block over every member, in rank order, into out
 * (counts[this rank] elements), or, out NULL, where the results stay
 * (s->place), reading the input through s->view where it lies and
 * s->fill elsewhere. */
int kolo__shm_reduce_scatter_stream(void *ctx, const kolo__ops_stream_t *s,
                                    void *out, const size_t *counts,
                                    size_t esize, kolo__ops_reduce_fn reduce,
                                    char *err, size_t errlen);

/* Gives every member every rank's block: this rank's from mine (NULL:
 * already where it stays, read through s->place), written through
 * s->place where the stream has one, else s->drain (s->finish is not
 * called: the blocks come finished). */
int kolo__shm_allgather_stream(void *ctx, const void *mine,
                               const kolo__ops_stream_t *s,
                               const size_t *counts, size_t esize, char *err,
                               size_t errlen);

#endif /* KOLO_OPS_SHM_OPS_H */
