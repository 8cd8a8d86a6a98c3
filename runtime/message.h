/*
 * message.h — the negotiation messages and their wire format.
 *
 * A request list goes from every rank to the coordinator: the tensors this
 * rank has enqueued that the response cache could not settle. A response
 * list goes from the coordinator to every rank: the tensors that are now
 * ready everywhere (or failed), in the order every rank executes them.
 *
 * Wire format (little-endian, no padding), version 4:
 *   header:   u32 magic 'KOLO' | u16 version | u16 kind | i32 rank | u32 n
 *   request:  u16 name_len | name | params(flags = 0) | i64 age_us | u64 seq
 *   response: u16 name_len | name | params(flags = -status) |
 *             [status != OK: u16 text_len | text]
 *   params:   u8 coll | u8 dtype | u8 op | u8 flags | i64 count |
 *             u8 wire | u8 ndim | u8 device_type | u16 group | i32 root | f64 prescale |
 *             f64 postscale | i64 shape[ndim] |
 *             [group > 1: u16 key_len | group key]
 *   (device_type's top bit is params.own)
 * Decoding checks every length against what is left of the buffer, so a
 * truncated or hostile message is refused, never read past its end.
 */
#ifndef KOLO_MESSAGE_H
#define KOLO_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define KOLO__MSG_MAGIC 0x4f4c4f4bu /* "KOLO" */
#define KOLO__MSG_VERSION 4
#define KOLO__MSG_MAX_TEXT 4000

/* The collectives, numbered 0, 1, ... in this order: the numbers travel
 * in every message, so a new one goes last. */
typedef enum kolo__coll {
    KOLO__COLL_ALLREDUCE, KOLO__COLL_BROADCAST, KOLO__COLL_ALLGATHER,
    KOLO__COLL_ALLTOALL, KOLO__COLL_REDUCESCATTER, KOLO__COLL_BARRIER,
    KOLO__COLL_JOIN,
    KOLO__COLL_COUNT_
} kolo__coll_t;

const char *kolo__coll_name(int coll);
/* Horovod's timeline names: "ALLREDUCE" and "NEGOTIATE_ALLREDUCE". */
const char *kolo__coll_phase(int coll);
const char *kolo__coll_negotiate_phase(int coll);

typedef enum kolo__msg_kind {
    KOLO__MSG_REQUESTS = 1,
    KOLO__MSG_RESPONSES = 2
} kolo__msg_kind_t;

/* What must agree across ranks for one tensor. */
typedef struct kolo__params {
    uint8_t coll;  /* kolo__coll_t */
    uint8_t dtype; /* kolo_dtype_t */
    uint8_t op;    /* kolo_op_t */
    /* allreduce, broadcast, reducescatter: elements of the tensor;
     * allgather, alltoall: elements of one row (the first dimension may
     * differ between ranks and is exchanged when the operation runs) */
    int64_t count;
    uint8_t wire;  /* dtype on the wire (allreduce compression), else dtype */
    uint8_t ndim;  /* shape[0] is 0 for allgather and alltoall */
    uint8_t device_type; /* KOLO_DEVICE_HOST or KOLO_DEVICE_CUDA (the device
                            number may differ between ranks) */
    uint8_t own;    /* every rank enqueues it, joined ranks too
                       (kolo_opts_t.while_joined): no stand-in for them */
    uint16_t group; /* members of the tensor's group; 0 or 1: no group */
    int32_t root;   /* broadcast */
    double prescale, postscale;
    int64_t shape[KOLO_MAX_DIMS];
    char group_key[64]; /* the group's first name, cut; "" without group */
} kolo__params_t;

/* Fills the defaults: prescale = postscale = 1, wire = dtype, no shape. */
void kolo__params_init(kolo__params_t *p, int coll, int dtype, int op,
                       int64_t count);

int kolo__params_equal(const kolo__params_t *a, const kolo__params_t *b);

typedef struct kolo__request {
    char *name; /* owned, NUL-terminated */
    kolo__params_t params;
    /* Not compared between ranks; for the coordinator's stall inspector:
     * how long the sender has had the tensor (so that a wait is counted
     * from its enqueue, not from when the request came), and the sender's
     * enqueue count in the set (its "21st collective"; 0: not known). */
    int64_t age_us;
    uint64_t seq;
} kolo__request_t;

typedef struct kolo__response {
    char *name; /* owned */
    kolo__params_t params;
    int32_t status; /* KOLO_OK or a KOLO_ERR_* code */
    char *text;     /* owned; the error message, NULL when OK */
} kolo__response_t;

typedef struct kolo__msg {
    uint16_t kind;
    int32_t rank; /* the sender */
    uint32_t n;
    union {
        kolo__request_t *requests;
        kolo__response_t *responses;
    } u;
} kolo__msg_t;

/* A growable byte buffer. */
typedef struct kolo__bytes {
    uint8_t *data;
    size_t len, cap;
} kolo__bytes_t;

void kolo__bytes_free(kolo__bytes_t *b);

/* Encoding appends to `out` (which it resets first). */
int kolo__msg_encode(const kolo__msg_t *msg, kolo__bytes_t *out,
                     kolo__err_t *err);
/* Decodes `len` bytes into `msg` (allocating its arrays and strings).
 * Returns KOLO_ERR_INVALID_ARGUMENT with a description of the first problem
 * on malformed input; `from_rank` is only used in that message. */
int kolo__msg_decode(const uint8_t *data, size_t len, int from_rank,
                     kolo__msg_t *msg, kolo__err_t *err);
void kolo__msg_free(kolo__msg_t *msg);

#endif /* KOLO_MESSAGE_H */
