/*
 * mem_ops.h — the in-memory backend (design in mem_ops.c): the ranks of a
 * job are threads of one process. Built only into the unit tests' library
 * (KOLO_HAVE_MEM), never into libkolo.
 */
#ifndef KOLO_MEM_OPS_H
#define KOLO_MEM_OPS_H

#include <stdint.h>

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const kolo__ops_t kolo__ops_mem;

/* Marks global rank `global_rank` as stopped in every context of the
 * rendezvous `rendezvous` whose prefix begins with `prefix` ("": all), as
 * if its process had died: its peers' waits fail with KOLO_ERR_RANK_LOST
 * naming it, sleeping peers get a lost-connection token (ops.h), and its
 * own later calls fail. Returns the number of contexts marked. Tests only. */
int kolo__mem_kill(const char *rendezvous, const char *prefix, int global_rank);

/* How many times global rank `global_rank` has called the collective
 * `slot` ("allreduce", "allgather", "gather", "broadcast", "allgatherv",
 * "alltoallv", "reduce_scatter", "wake_peers") on the context of exactly
 * that rendezvous and prefix; 0 when there is no such context (any more).
 * Tests only: what a round did, seen from outside. */
uint64_t kolo__mem_calls(const char *rendezvous, const char *prefix,
                         int global_rank, const char *slot);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_MEM_OPS_H */
