/*
 * passes.h — local gradient accumulation (kolo_opts_t.backward_passes,
 * Horovod's backward_passes_per_step): the partial sums kept by tensor name
 * until the last pass of a group (passes.c). Called under the API lock.
 */
#ifndef KOLO_PASSES_H
#define KOLO_PASSES_H

#include <stdint.h>

#include "common.h"

/* Adds `input` to the sum of tensor `name`. Returns 0 for an earlier pass
 * of a group, 1 for its last (the sum, divided by `passes` when `average`,
 * is then in `output` and the sum starts over), or a negative error: a
 * pass whose count, dtype or number of passes differs from its group's
 * (the partial sum is discarded), or no memory. */
int kolo__passes_add(const char *name, const void *input, void *output,
                     int64_t count, kolo_dtype_t dtype, int passes,
                     int average, kolo__err_t *err);
/* Drops every partial sum (kolo_shutdown). */
void kolo__passes_free(void);

#endif /* KOLO_PASSES_H */
