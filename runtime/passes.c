/*
 * passes.c — local gradient accumulation over several backward passes
 * (passes.h): the enqueue path adds, kolo_shutdown drops what is left.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "map.h"
#include "passes.h"
#include "reduce.h"

static kolo__map_t g_accumulators; /* name -> accumulator_t, under the API lock */

/* One named accumulator (backward_passes > 1). */
typedef struct accumulator {
    void *sum;
    int64_t count;
    kolo_dtype_t dtype;
    int passes, done;
} accumulator_t;

static void drop(const char *name, accumulator_t *acc)
{
    kolo__map_dels(&g_accumulators, name);
    free(acc->sum);
    free(acc);
}

void kolo__passes_free(void)
{
    size_t it = 0;
    void *v;
    while (kolo__map_next(&g_accumulators, &it, NULL, &v)) {
        accumulator_t *acc = v;
        free(acc->sum);
        free(acc);
    }
    kolo__map_free(&g_accumulators);
}

int kolo__passes_add(const char *name, const void *input, void *output,
                     int64_t count, kolo_dtype_t dtype, int passes,
                     int average, kolo__err_t *err)
{
    accumulator_t *acc = kolo__map_gets(&g_accumulators, name);
    int rc;

    if (acc != NULL && acc->done == 0 &&
        (acc->count != count || acc->dtype != dtype || acc->passes != passes)) {
        /* No group in progress: a new one may have another shape or N. */
        drop(name, acc);
        acc = NULL;
    }
    if (acc != NULL && (acc->count != count || acc->dtype != dtype ||
                        acc->passes != passes)) {
        rc = kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                           "allreduce of tensor '%s': pass %d of %d was "
                           "accumulated with %lld %s and %d passes, this call "
                           "has %lld %s and %d passes; the partial sum is "
                           "discarded",
                           name, acc->done + 1, acc->passes,
                           (long long)acc->count, kolo_dtype_name(acc->dtype),
                           acc->passes, (long long)count,
                           kolo_dtype_name(dtype), passes);
        drop(name, acc);
        return rc;
    }
    if (acc == NULL) {
        acc = kolo__calloc(1, sizeof(*acc));
        if (acc != NULL)
            acc->sum = kolo__calloc(count ? (size_t)count : 1,
                              kolo__accumulator_elem_size(dtype));
        if (acc == NULL || acc->sum == NULL ||
            kolo__map_puts(&g_accumulators, name, acc) != 0) {
            if (acc != NULL)
                free(acc->sum);
            free(acc);
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                                 "out of memory for the accumulator of tensor "
                                 "'%s' (%lld %s)",
                                 name, (long long)count, kolo_dtype_name(dtype));
        }
        acc->count = count;
        acc->dtype = dtype;
        acc->passes = passes;
    }
    kolo__accumulate(acc->sum, input, (size_t)count, dtype);
    if (++acc->done < acc->passes)
        return 0;
    kolo__accumulate_finish(output, acc->sum, (size_t)count, dtype,
                            average ? acc->passes : 1);
    memset(acc->sum, 0, (size_t)count * kolo__accumulator_elem_size(dtype));
    acc->done = 0;
    return 1;
}
