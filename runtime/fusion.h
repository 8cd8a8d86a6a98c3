/*
 * fusion.h — fusion planning: which ready tensors are reduced together.
 *
 * Input: the ready tensors in plan order, each with a key (collective,
 * dtype, op: only tensors of one key can share a reduction) and a size in
 * bytes. Output: batches, each a run of indices into a permutation of the
 * input, whose bytes stay within the threshold. A tensor larger than the
 * threshold, or any tensor when the threshold is 0, is a batch of its own.
 *
 * The plan is a pure function of its input, so every rank, given the same
 * ordered list, computes the same batches in the same order.
 *
 * Method: walk the tensors in order, keeping one open batch per key; a
 * tensor joins its key's open batch if it fits, else that batch is closed
 * and a new one opened. Batches are emitted in the order they were opened,
 * so the first ready tensor is in the first reduction. Cost O(n * keys).
 */
#ifndef KOLO_FUSION_H
#define KOLO_FUSION_H

#include <stddef.h>
#include <stdint.h>

typedef struct kolo__fusion_item {
    uint32_t key;
    int64_t bytes;
} kolo__fusion_item_t;

typedef struct kolo__batch {
    size_t first; /* index into order[] */
    size_t n;
    int64_t bytes;
} kolo__batch_t;

/* order[] and batches[] must each hold n elements. Returns the number of
 * batches, or -1 when out of memory. */
long kolo__fusion_plan(const kolo__fusion_item_t *items, size_t n,
                       int64_t threshold, size_t *order,
                       kolo__batch_t *batches);

#endif /* KOLO_FUSION_H */
