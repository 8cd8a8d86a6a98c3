/*
 * names.c — what kolo.h's enums mean: status messages, dtype and op names
 * and sizes. Pure, with kolo.h, below the runtime and the backends, which
 * both name dtypes and statuses in their messages; apart from api.c, so
 * that the unit tests link it without the whole API.
 */
#include <stddef.h>

#include "kolo.h"

#define KOLO_STATUS_CASE_(name, value, msg)                                   \
    case KOLO_##name:                                                         \
        return msg;

const char *kolo_strerror(int status)
{
    switch (status) {
        KOLO_STATUS_MAP(KOLO_STATUS_CASE_)
    default:
        return "unknown status";
    }
}

static const struct {
    const char *name;
    size_t size;
} dtypes[KOLO_DTYPE_COUNT_] = {
    [KOLO_UINT8] = {"uint8", 1},       [KOLO_INT8] = {"int8", 1},
    [KOLO_UINT16] = {"uint16", 2},     [KOLO_INT16] = {"int16", 2},
    [KOLO_INT32] = {"int32", 4},       [KOLO_INT64] = {"int64", 8},
    [KOLO_FLOAT16] = {"float16", 2},   [KOLO_BFLOAT16] = {"bfloat16", 2},
    [KOLO_FLOAT32] = {"float32", 4},   [KOLO_FLOAT64] = {"float64", 8},
    [KOLO_BOOL] = {"bool", 1},
};

static const char *const op_names[KOLO_OP_COUNT_] = {
    [KOLO_OP_SUM] = "sum",         [KOLO_OP_AVERAGE] = "average",
    [KOLO_OP_MIN] = "min",         [KOLO_OP_MAX] = "max",
    [KOLO_OP_PRODUCT] = "product",
};

size_t kolo_dtype_size(kolo_dtype_t dtype)
{
    return (unsigned)dtype < KOLO_DTYPE_COUNT_ ? dtypes[dtype].size : 0;
}

const char *kolo_dtype_name(kolo_dtype_t dtype)
{
    return (unsigned)dtype < KOLO_DTYPE_COUNT_ ? dtypes[dtype].name : "unknown";
}

const char *kolo_op_name(kolo_op_t op)
{
    return (unsigned)op < KOLO_OP_COUNT_ ? op_names[op] : "unknown";
}

