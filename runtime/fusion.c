/*
 * fusion.c — fusion planning (method in fusion.h).
 *
 * Batches are first built as linked lists through next[] (one list per
 * batch, appended at its tail) and then flattened into order[], so that
 * members of a batch are contiguous there and keep their relative order.
 */
#include "alloc.h"
#include "fusion.h"

#include <stdlib.h>

typedef struct open_batch {
    uint32_t key;
    size_t batch; /* index into batches[] */
} open_batch_t;

long kolo__fusion_plan(const kolo__fusion_item_t *items, size_t n,
                       int64_t threshold, size_t *order,
                       kolo__batch_t *batches)
{
    size_t *next = NULL, *head = NULL, *tail = NULL;
    open_batch_t *open = NULL;
    size_t nopen = 0, nbatches = 0, pos = 0;

    if (n == 0)
        return 0;
    next = kolo__malloc(n * sizeof(*next));
    head = kolo__malloc(n * sizeof(*head));
    tail = kolo__malloc(n * sizeof(*tail));
    open = kolo__malloc(n * sizeof(*open));
    if (next == NULL || head == NULL || tail == NULL || open == NULL) {
        free(next), free(head), free(tail), free(open);
        return -1;
    }

    for (size_t i = 0; i < n; i++) {
        size_t o;
        next[i] = SIZE_MAX;
        for (o = 0; o < nopen && open[o].key != items[i].key; o++)
            ;
        if (o < nopen) {
            kolo__batch_t *b = &batches[open[o].batch];
            if (b->bytes + items[i].bytes <= threshold) {
                next[tail[open[o].batch]] = i;
                tail[open[o].batch] = i;
                b->n++;
                b->bytes += items[i].bytes;
                continue;
            }
            open[o] = open[--nopen]; /* closed: full for this tensor */
        }
        batches[nbatches] = (kolo__batch_t){0, 1, items[i].bytes};
        head[nbatches] = tail[nbatches] = i;
        /* A tensor that fills the threshold alone leaves nothing to join. */
        if (items[i].bytes < threshold)
            open[nopen++] = (open_batch_t){items[i].key, nbatches};
        nbatches++;
    }

    for (size_t b = 0; b < nbatches; b++) {
        batches[b].first = pos;
        for (size_t i = head[b]; i != SIZE_MAX; i = next[i])
            order[pos++] = i;
    }
    free(next), free(head), free(tail), free(open);
    return (long)nbatches;
}
