/*
 * test-message.c — unit tests of runtime/message.{h,c}: the negotiation
 * messages and their wire format.
 *
 * Why these tests: these bytes cross between processes, so the decoder is
 * the runtime's one parser of untrusted input, and the format is a contract
 * between ranks. The tests check
 *  - the exact bytes of small encoded messages against the format (version
 *    2) written out in message.h, built here by hand (raw_* below, not by
 *    the encoder) and once as a literal byte array;
 *  - round trips of request and response lists of 0, 1 and many items,
 *    names of the maximum length, error texts, every status, and every
 *    version-2 field: every collective, a wire dtype other than the dtype,
 *    0..KOLO_MAX_DIMS dimensions, groups with keys up to 63 bytes, roots,
 *    scales whose bits must survive (-0, NaN, infinities);
 *  - kolo__params_init's defaults, and that kolo__params_equal tells apart
 *    parameters differing in any one field;
 *  - that every malformed input named in message.h is refused with
 *    KOLO_ERR_INVALID_ARGUMENT and leaves an empty message: every prefix of
 *    valid messages, and each field made bad on its own (including ndim >
 *    KOLO_MAX_DIMS, a negative dimension, wire or coll out of range, a group
 *    key too long, holding a NUL or cut short);
 *  - a seeded fuzz test: random valid messages with random bytes changed,
 *    cut or appended. Decoding either fails cleanly or succeeds, and when it
 *    succeeds the message re-encodes to exactly the input bytes (the format
 *    has one encoding per message, so anything else means a field was
 *    misread).
 * Every decode reads from a heap copy of exactly the input length, so an
 * AddressSanitizer build catches a read past the end.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"
#include "unit.h"

/* ---- helpers ------------------------------------------------------------ */

/* A hand-written little-endian writer, independent of message.c. */
typedef struct raw {
    uint8_t buf[1 << 16];
    size_t len;
    unsigned kind; /* the header's: a request item ends with age and seq */
} raw_t;

static void raw_u8(raw_t *r, unsigned v) { r->buf[r->len++] = (uint8_t)v; }
static void raw_u16(raw_t *r, unsigned v)
{
    raw_u8(r, v & 0xff);
    raw_u8(r, (v >> 8) & 0xff);
}
static void raw_u32(raw_t *r, uint32_t v)
{
    raw_u16(r, v & 0xffff);
    raw_u16(r, v >> 16);
}
static void raw_i64(raw_t *r, int64_t v)
{
    uint64_t u = (uint64_t)v;
    raw_u32(r, (uint32_t)(u & 0xffffffffu));
    raw_u32(r, (uint32_t)(u >> 32));
}
static void raw_bytes(raw_t *r, const void *p, size_t n)
{
    if (n == 0)
        return;
    memcpy(r->buf + r->len, p, n);
    r->len += n;
}
static void raw_header(raw_t *r, unsigned kind, int32_t rank, uint32_t n)
{
    r->len = 0;
    r->kind = kind;
    raw_u32(r, KOLO__MSG_MAGIC);
    raw_u16(r, KOLO__MSG_VERSION);
    raw_u16(r, kind);
    raw_u32(r, (uint32_t)rank);
    raw_u32(r, n);
}
static void raw_f64(raw_t *r, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    raw_i64(r, (int64_t)u);
}

/* The parameter fields as raw_params writes them. `shape` has room for more
 * than KOLO_MAX_DIMS entries so that hostile ndim values can be written
 * with their bytes present (entries past the array are written as 0). */
#define RAW_MAX_SHAPE 32
typedef struct raw_params {
    unsigned coll, dtype, op, flags;
    int64_t count;
    unsigned wire, ndim, device_type, group;
    int32_t root;
    double prescale, postscale;
    int64_t shape[RAW_MAX_SHAPE];
    const char *key; /* written when group > 1, unless omit_key */
    size_t key_len;
    int omit_key;
} raw_params_t;

/* The version-2 defaults: wire = dtype, no shape, no group, root 0, scales
 * 1. */
static raw_params_t rp(unsigned coll, unsigned dtype, unsigned op,
                       unsigned flags, int64_t count)
{
    raw_params_t p;
    memset(&p, 0, sizeof p);
    p.coll = coll;
    p.dtype = dtype;
    p.op = op;
    p.flags = flags;
    p.count = count;
    p.wire = dtype;
    p.prescale = p.postscale = 1.0;
    return p;
}

/* params: u8 coll | u8 dtype | u8 op | u8 flags | i64 count | u8 wire |
 *         u8 ndim | u8 device_type | u16 group | i32 root | f64 prescale | f64 postscale |
 *         i64 shape[ndim] | [group > 1: u16 key_len | key] */
static void raw_params(raw_t *r, const raw_params_t *p)
{
    raw_u8(r, p->coll);
    raw_u8(r, p->dtype);
    raw_u8(r, p->op);
    raw_u8(r, p->flags);
    raw_i64(r, p->count);
    raw_u8(r, p->wire);
    raw_u8(r, p->ndim);
    raw_u8(r, p->device_type);
    raw_u16(r, p->group);
    raw_u32(r, (uint32_t)p->root);
    raw_f64(r, p->prescale);
    raw_f64(r, p->postscale);
    for (unsigned i = 0; i < p->ndim; i++)
        raw_i64(r, i < RAW_MAX_SHAPE ? p->shape[i] : 0);
    if (p->group > 1 && !p->omit_key) {
        raw_u16(r, (unsigned)p->key_len);
        raw_bytes(r, p->key, p->key_len);
    }
}

/* One item: u16 name_len | name | params, and a request's i64 age_us |
 * u64 seq (here 5 and 7). */
static void raw_item(raw_t *r, const char *name, size_t name_len,
                     const raw_params_t *p)
{
    raw_u16(r, (unsigned)name_len);
    raw_bytes(r, name, name_len);
    raw_params(r, p);
    if (r->kind == KOLO__MSG_REQUESTS && p->flags == 0) {
        raw_i64(r, 5);
        raw_i64(r, 7);
    }
}

/* One item with the default values of the version-2 fields. */
static void raw_request(raw_t *r, const char *name, size_t name_len,
                        unsigned coll, unsigned dtype, unsigned op,
                        unsigned flags, int64_t count)
{
    raw_params_t p = rp(coll, dtype, op, flags, count);
    raw_item(r, name, name_len, &p);
}

/* Bytes of the fixed part of the parameters (no shape, no key). */
#define RAW_PARAMS_FIXED (4 + 8 + 1 + 1 + 1 + 2 + 4 + 8 + 8)

/* Decodes from an exact-size heap copy (so ASan sees over-reads). */
static int decode(const uint8_t *data, size_t len, kolo__msg_t *msg,
                  kolo__err_t *err)
{
    uint8_t *copy = malloc(len ? len : 1);
    int rc;
    ck_assert_ptr_nonnull(copy);
    if (len)
        memcpy(copy, data, len);
    rc = kolo__msg_decode(copy, len, 7, msg, err);
    free(copy);
    return rc;
}

/* Checks that the input is refused cleanly, leaving an empty message, and,
 * when `what` starts with "bad ", that the error names that field. */
static void expect_refused(const uint8_t *data, size_t len, const char *what)
{
    kolo__msg_t msg;
    kolo__err_t err;
    int rc;

    memset(&msg, 0xab, sizeof msg);
    kolo__err_clear(&err);
    rc = decode(data, len, &msg, &err);
    ck_assert_msg(rc == KOLO_ERR_INVALID_ARGUMENT,
                  "%s: decode of %zu bytes returned %d (%s)", what, len, rc,
                  err.msg);
    ck_assert_int_eq(err.code, KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.msg, "malformed negotiation message from rank 7") !=
                      NULL,
                  "%s: message: %s", what, err.msg);
    /* Nothing is left allocated in the message. */
    ck_assert_uint_eq(msg.n, 0);
    ck_assert_ptr_null(msg.u.requests);
    if (what != NULL && strncmp(what, "bad ", 4) == 0)
        ck_assert_msg(strstr(err.msg, what) != NULL,
                      "expected '%s' in: %s", what, err.msg);
}

static void expect_refused_raw(const raw_t *r, const char *what)
{
    expect_refused(r->buf, r->len, what);
}

/* At least n bytes of filler, for names and texts at their limit and one
 * byte past it. */
static const char *filler(size_t n)
{
    static char bytes[KOLO__MSG_MAX_TEXT + KOLO_MAX_NAME_LEN];

    ck_assert_uint_le(n, sizeof bytes);
    memset(bytes, 'f', sizeof bytes);
    return bytes;
}

/* The message r holds, which must decode. */
static kolo__msg_t decoded(const raw_t *r)
{
    kolo__msg_t m;
    kolo__err_t err;
    int rc = decode(r->buf, r->len, &m, &err);

    ck_assert_msg(rc == KOLO_OK, "refused (%d): %s", rc, err.msg);
    return m;
}

/* A message of `kind` from rank 0 of one item, with the default
 * parameters but for the flags (a response's status). */
static void raw_one(raw_t *r, unsigned kind, const char *name, size_t name_len,
                    unsigned flags)
{
    raw_header(r, kind, 0, 1);
    raw_request(r, name, name_len, 0, 0, 0, flags, 1);
}

/* A message of one item named so is refused for its name. */
static void expect_name_refused(unsigned kind, const char *name,
                                size_t name_len)
{
    raw_t r;

    raw_one(&r, kind, name, name_len, 0);
    expect_refused_raw(&r, "bad tensor name");
}

/* An error response whose text is `len` (the length field) and n bytes. */
static void raw_error_response(raw_t *r, unsigned len, const void *text,
                               size_t n)
{
    raw_one(r, KOLO__MSG_RESPONSES, "t", 1, 1);
    raw_u16(r, len);
    raw_bytes(r, text, n);
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Gives item i non-default values of the version-2 fields, cycling through
 * every collective, wire dtype, ndim 0..KOLO_MAX_DIMS, no group, group 1
 * and groups with a key (empty now and then); item 0 keeps the defaults. */
static void vary_params(kolo__params_t *p, uint32_t i)
{
    if (i == 0)
        return;
    p->coll = (uint8_t)(i % KOLO__COLL_COUNT_);
    p->wire = (uint8_t)((i * 5) % KOLO_DTYPE_COUNT_);
    p->ndim = (uint8_t)(i % (KOLO_MAX_DIMS + 1));
    p->device_type = (uint8_t)(i % 3 == 1 ? KOLO_DEVICE_CUDA : KOLO_DEVICE_HOST);
    for (int d = 0; d < p->ndim; d++)
        p->shape[d] = (int64_t)i * 100 + d;
    p->group = (uint16_t)(i % 4); /* 0, 1: no group; 2, 3: a group */
    if (p->group > 1 && i % 8 != 7)
        snprintf(p->group_key, sizeof p->group_key, "group/%u", i - i % 4);
    p->root = (int32_t)(i * 2654435761u);
    p->prescale = 1.0 / (i + 1);
    p->postscale = -(double)i * 0.75;
}

/* A message of `kind` from `rank` with a list of n zeroed items of
 * `item_size` bytes (at least one item, for n = 0 too), which it returns. */
static void *make_message(kolo__msg_t *m, unsigned kind, uint32_t n,
                          int32_t rank, size_t item_size)
{
    void *items = calloc(n ? n : 1, item_size);

    ck_assert_ptr_nonnull(items);
    memset(m, 0, sizeof *m);
    m->kind = (uint16_t)kind;
    m->rank = rank;
    m->n = n;
    return items;
}

/* Request and response lists owned by the test. */
static void make_requests(kolo__msg_t *m, uint32_t n, int32_t rank)
{
    m->u.requests = make_message(m, KOLO__MSG_REQUESTS, n, rank,
                                 sizeof(kolo__request_t));
    for (uint32_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "model/layer%u/weight", i);
        m->u.requests[i].name = xstrdup(name);
        kolo__params_init(&m->u.requests[i].params, KOLO__COLL_ALLREDUCE,
                          (int)(i % KOLO_DTYPE_COUNT_), (int)(i % KOLO_OP_COUNT_),
                          (int64_t)i * 1000003);
        vary_params(&m->u.requests[i].params, i);
        m->u.requests[i].age_us = (int64_t)i * 61000000 - 3;
        m->u.requests[i].seq = (uint64_t)i * 0x100000001ULL + 1;
    }
}

static void make_responses(kolo__msg_t *m, uint32_t n, int32_t rank)
{
    m->u.responses = make_message(m, KOLO__MSG_RESPONSES, n, rank,
                                  sizeof(kolo__response_t));
    for (uint32_t i = 0; i < n; i++) {
        char name[64], text[128];
        kolo__response_t *r = &m->u.responses[i];
        snprintf(name, sizeof name, "grad.%u", i);
        r->name = xstrdup(name);
        kolo__params_init(&r->params, KOLO__COLL_ALLREDUCE,
                          (int)((i * 7) % KOLO_DTYPE_COUNT_),
                          (int)((i * 3) % KOLO_OP_COUNT_), (int64_t)i << 33);
        vary_params(&r->params, i);
        /* Every status from OK down to ERR_INTERNAL, in turn. */
        r->status = -(int32_t)(i % 15);
        if (r->status != KOLO_OK) {
            snprintf(text, sizeof text,
                     "tensor 'grad.%u' has count %u on rank 0 and %u on rank 1",
                     i, i, i + 1);
            r->text = xstrdup(text);
        }
    }
}

/* Field by field (not through kolo__params_equal, which is under test
 * too), the group's key aside: `got` was decoded from what `want` says. */
static void assert_params_fields(const kolo__params_t *want,
                                 const kolo__params_t *got)
{
    ck_assert_uint_eq(got->coll, want->coll);
    ck_assert_uint_eq(got->dtype, want->dtype);
    ck_assert_uint_eq(got->op, want->op);
    ck_assert_int_eq(got->count, want->count);
    ck_assert_uint_eq(got->wire, want->wire);
    ck_assert_uint_eq(got->ndim, want->ndim);
    ck_assert_uint_eq(got->device_type, want->device_type);
    ck_assert_uint_eq(got->group, want->group);
    ck_assert_int_eq(got->root, want->root);
    ck_assert_mem_eq(&got->prescale, &want->prescale, sizeof(double));
    ck_assert_mem_eq(&got->postscale, &want->postscale, sizeof(double));
    for (int d = 0; d < KOLO_MAX_DIMS; d++)
        ck_assert_int_eq(got->shape[d], d < want->ndim ? want->shape[d] : 0);
}

/* `got` was decoded from the encoding of `want`. */
static void assert_params_same(const kolo__params_t *want,
                               const kolo__params_t *got)
{
    assert_params_fields(want, got);
    /* The key is only sent for a group. */
    ck_assert_str_eq(got->group_key, want->group > 1 ? want->group_key : "");
    ck_assert_int_eq(kolo__params_equal(want, got), 1);
}

static void assert_same(const kolo__msg_t *a, const kolo__msg_t *b)
{
    ck_assert_uint_eq(a->kind, b->kind);
    ck_assert_int_eq(a->rank, b->rank);
    ck_assert_uint_eq(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->kind == KOLO__MSG_REQUESTS) {
            const kolo__request_t *x = &a->u.requests[i], *y = &b->u.requests[i];
            ck_assert_str_eq(x->name, y->name);
            assert_params_same(&x->params, &y->params);
            ck_assert_int_eq(x->age_us, y->age_us);
            ck_assert_uint_eq(x->seq, y->seq);
        } else {
            const kolo__response_t *x = &a->u.responses[i],
                                   *y = &b->u.responses[i];
            ck_assert_str_eq(x->name, y->name);
            assert_params_same(&x->params, &y->params);
            ck_assert_int_eq(x->status, y->status);
            if (x->status == KOLO_OK) {
                ck_assert_ptr_null(y->text);
            } else {
                ck_assert_ptr_nonnull(y->text);
                ck_assert_str_eq(x->text ? x->text : "", y->text);
            }
        }
    }
}

static void roundtrip(const kolo__msg_t *m)
{
    kolo__bytes_t b = {0};
    kolo__msg_t d;
    kolo__err_t err;

    kolo__err_clear(&err);
    ck_assert_int_eq(kolo__msg_encode(m, &b, &err), KOLO_OK);
    ck_assert_int_eq(decode(b.data, b.len, &d, &err), KOLO_OK);
    ck_assert_int_eq(err.code, KOLO_OK);
    assert_same(m, &d);
    kolo__msg_free(&d);
    ck_assert_uint_eq(d.n, 0);
    kolo__bytes_free(&b);
}

/* ---- format and round trips -------------------------------------------- */

START_TEST(small_request_has_documented_bytes)
{
    kolo__msg_t m;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    raw_t want;
    kolo__request_t req = {(char *)"ab", {0}, 5, 7};

    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_REQUESTS;
    m.rank = 3;
    m.n = 1;
    kolo__params_init(&req.params, KOLO__COLL_ALLREDUCE, KOLO_FLOAT32,
                      KOLO_OP_AVERAGE, 0x0102030405060708LL);
    m.u.requests = &req;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);

    raw_header(&want, KOLO__MSG_REQUESTS, 3, 1);
    raw_request(&want, "ab", 2, 0, KOLO_FLOAT32, KOLO_OP_AVERAGE, 0,
                0x0102030405060708LL);
    /* header | u16 + "ab" | 4 u8 | count | wire ndim device | group | root
     * | prescale | postscale; no shape, no key | age | seq. */
    ck_assert_uint_eq(b.len, 16 + 2 + 2 + 4 + 8 + 1 + 1 + 1 + 2 + 4 + 8 + 8 + 8 + 8);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert_mem_eq(b.data, want.buf, want.len);
    /* "KOLO" in memory, as the magic's comment says, then version 4. */
    ck_assert_mem_eq(b.data, "KOLO\x04\x00", 6);
    /* wire = dtype by default; the scales are 1.0 (0x3ff0000000000000). */
    ck_assert_uint_eq(b.data[32], KOLO_FLOAT32);
    ck_assert_mem_eq(b.data + 41, "\0\0\0\0\0\0\xf0\x3f\0\0\0\0\0\0\xf0\x3f", 16);

    /* Encoding again into the same buffer starts over. */
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert_mem_eq(b.data, want.buf, want.len);
    kolo__bytes_free(&b);
    ck_assert_ptr_null(b.data);
}
END_TEST

/* Every version-2 field set, against bytes written out literally. */
START_TEST(full_request_has_literal_bytes)
{
    static const uint8_t expected[] = {
        'K', 'O', 'L', 'O', 4, 0, /* magic, version */
        1, 0,                     /* kind: requests */
        0xfe, 0xff, 0xff, 0xff,   /* rank -2 */
        1, 0, 0, 0,               /* n */
        2, 0, 'a', 'b',           /* name */
        KOLO__COLL_BROADCAST, KOLO_FLOAT32, KOLO_OP_MAX, 0,
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* count */
        KOLO_BFLOAT16,                                  /* wire */
        2,                                              /* ndim */
        KOLO_DEVICE_CUDA,                               /* device_type */
        0x03, 0x01,                                     /* group 259 */
        0xfd, 0xff, 0xff, 0x7f,                         /* root 0x7ffffffd */
        0, 0, 0, 0, 0, 0, 0xe0, 0x3f,                   /* prescale 0.5 */
        0, 0, 0, 0, 0, 0, 0x10, 0xc0,                   /* postscale -4 */
        0x05, 0, 0, 0, 0, 0, 0, 0,                      /* shape[0] 5 */
        0x00, 0x01, 0, 0, 0, 0, 0, 0x7f,                /* shape[1] */
        3, 0, 'g', '/', 'x',                            /* group key */
        5, 0, 0, 0, 0, 0, 0, 0,                         /* age_us */
        7, 0, 0, 0, 0, 0, 0, 0,                         /* seq */
    };
    kolo__msg_t m, d;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    kolo__request_t req = {(char *)"ab", {0}, 5, 7};
    raw_t want;
    raw_params_t p;

    kolo__params_init(&req.params, KOLO__COLL_BROADCAST, KOLO_FLOAT32,
                      KOLO_OP_MAX, 0x0102030405060708LL);
    req.params.wire = KOLO_BFLOAT16;
    req.params.ndim = 2;
    req.params.device_type = KOLO_DEVICE_CUDA;
    req.params.shape[0] = 5;
    req.params.shape[1] = 0x7f00000000000100LL;
    req.params.shape[2] = 99; /* past ndim: not sent */
    req.params.group = 259;
    strcpy(req.params.group_key, "g/x");
    req.params.root = 0x7ffffffd;
    req.params.prescale = 0.5;
    req.params.postscale = -4.0;
    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_REQUESTS;
    m.rank = -2;
    m.n = 1;
    m.u.requests = &req;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
    ck_assert_uint_eq(b.len, sizeof expected);
    ck_assert_mem_eq(b.data, expected, sizeof expected);

    /* The raw writer agrees with the literal bytes. */
    raw_header(&want, KOLO__MSG_REQUESTS, -2, 1);
    p = rp(KOLO__COLL_BROADCAST, KOLO_FLOAT32, KOLO_OP_MAX, 0,
           0x0102030405060708LL);
    p.wire = KOLO_BFLOAT16;
    p.ndim = 2;
    p.device_type = KOLO_DEVICE_CUDA;
    p.shape[0] = 5;
    p.shape[1] = 0x7f00000000000100LL;
    p.group = 259;
    p.key = "g/x";
    p.key_len = 3;
    p.root = 0x7ffffffd;
    p.prescale = 0.5;
    p.postscale = -4.0;
    raw_item(&want, "ab", 2, &p);
    ck_assert_uint_eq(want.len, sizeof expected);
    ck_assert_mem_eq(want.buf, expected, sizeof expected);

    /* And it decodes back to every field. */
    ck_assert_int_eq(decode(expected, sizeof expected, &d, &err), KOLO_OK);
    ck_assert_int_eq(d.rank, -2);
    ck_assert_str_eq(d.u.requests[0].name, "ab");
    req.params.shape[2] = 0;
    assert_params_same(&req.params, &d.u.requests[0].params);
    kolo__msg_free(&d);
    kolo__bytes_free(&b);
}
END_TEST

/* The key is sent only for group > 1: with group 0 or 1 nothing follows
 * the shape, and group 2 with an empty key sends a zero length. */
START_TEST(group_key_sent_only_for_groups)
{
    kolo__msg_t m, d;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    kolo__request_t req = {(char *)"t", {0}, 5, 7};
    const size_t base = 16 + 2 + 1 + RAW_PARAMS_FIXED + 16; /* age, seq */

    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_REQUESTS;
    m.n = 1;
    m.u.requests = &req;
    for (unsigned group = 0; group < 4; group++) {
        kolo__params_init(&req.params, KOLO__COLL_ALLREDUCE, KOLO_INT32,
                          KOLO_OP_SUM, 4);
        req.params.group = (uint16_t)group;
        ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
        ck_assert_uint_eq(b.len, base + (group > 1 ? 2 : 0));
        if (group > 1) { /* an empty key's length, before age and seq */
            ck_assert_int_eq(b.data[b.len - 18], 0);
            ck_assert_int_eq(b.data[b.len - 17], 0);
        }
        ck_assert_int_eq(decode(b.data, b.len, &d, &err), KOLO_OK);
        assert_params_same(&req.params, &d.u.requests[0].params);
        kolo__msg_free(&d);
    }
    kolo__bytes_free(&b);
}
END_TEST

START_TEST(small_response_has_documented_bytes)
{
    kolo__msg_t m;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    raw_t want;
    raw_params_t p;
    kolo__response_t resp[2] = {
        {(char *)"x", {0}, KOLO_OK, NULL},
        {(char *)"yz", {0}, KOLO_ERR_MISMATCH, (char *)"bad"},
    };

    kolo__params_init(&resp[0].params, KOLO__COLL_ALLREDUCE, KOLO_INT64,
                      KOLO_OP_MAX, 9);
    kolo__params_init(&resp[1].params, KOLO__COLL_ALLGATHER, KOLO_BOOL,
                      KOLO_OP_MIN, 0);
    resp[1].params.ndim = 1;
    resp[1].params.group = 2;
    strcpy(resp[1].params.group_key, "k");
    resp[1].params.root = 1;
    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_RESPONSES;
    m.rank = -1;
    m.n = 2;
    m.u.responses = resp;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);

    raw_header(&want, KOLO__MSG_RESPONSES, -1, 2);
    raw_request(&want, "x", 1, 0, KOLO_INT64, KOLO_OP_MAX, 0, 9);
    p = rp(KOLO__COLL_ALLGATHER, KOLO_BOOL, KOLO_OP_MIN, 5, 0);
    p.ndim = 1; /* shape[0] = 0 */
    p.group = 2;
    p.key = "k";
    p.key_len = 1;
    p.root = 1;
    raw_item(&want, "yz", 2, &p);
    /* The error text follows the key. */
    raw_u16(&want, 3);
    raw_bytes(&want, "bad", 3);
    ck_assert_uint_eq(b.len, 16 + (2 + 1 + RAW_PARAMS_FIXED) +
                                 (2 + 2 + RAW_PARAMS_FIXED + 8 + 2 + 1) +
                                 (2 + 3));
    ck_assert_uint_eq(b.len, want.len);
    ck_assert_mem_eq(b.data, want.buf, want.len);
    kolo__bytes_free(&b);
}
END_TEST

static const uint32_t list_sizes[] = {0, 1, 2, 15, 300};

START_TEST(roundtrip_requests)
{
    kolo__msg_t m;
    make_requests(&m, list_sizes[_i], 5);
    roundtrip(&m);
    kolo__msg_free(&m);
}
END_TEST

START_TEST(roundtrip_responses)
{
    kolo__msg_t m;
    make_responses(&m, list_sizes[_i], 0);
    roundtrip(&m);
    kolo__msg_free(&m);
}
END_TEST

START_TEST(roundtrip_extreme_values)
{
    kolo__msg_t m;
    char *longname = malloc(KOLO_MAX_NAME_LEN + 1);
    char *longtext = malloc(KOLO__MSG_MAX_TEXT + 1);

    ck_assert_ptr_nonnull(longname);
    ck_assert_ptr_nonnull(longtext);
    for (int i = 0; i < KOLO_MAX_NAME_LEN; i++)
        longname[i] = (char)('a' + i % 26);
    longname[KOLO_MAX_NAME_LEN] = '\0';
    for (int i = 0; i < KOLO__MSG_MAX_TEXT; i++)
        longtext[i] = (char)(' ' + i % 95);
    longtext[KOLO__MSG_MAX_TEXT] = '\0';

    /* Requests: a name of exactly KOLO_MAX_NAME_LEN bytes, a one-byte name,
     * non-ASCII bytes, counts 0 and INT64_MAX, the last dtype and op, a
     * negative rank. */
    make_requests(&m, 4, -12345);
    free(m.u.requests[0].name);
    m.u.requests[0].name = xstrdup(longname);
    m.u.requests[0].params.count = INT64_MAX;
    m.u.requests[0].params.dtype = KOLO_DTYPE_COUNT_ - 1;
    m.u.requests[0].params.op = KOLO_OP_COUNT_ - 1;
    free(m.u.requests[1].name);
    m.u.requests[1].name = xstrdup("x");
    m.u.requests[1].params.count = 0;
    free(m.u.requests[2].name);
    m.u.requests[2].name = xstrdup("\xc3\xa9t\xff\x01\x7f");
    /* Version-2 fields at their limits: the last collective and wire
     * dtype, KOLO_MAX_DIMS dimensions from 0 to INT64_MAX, the largest
     * group with a 63-byte key of high and low byte values, the extreme
     * roots, and scales whose bits must survive: -0, NaN, infinities, a
     * subnormal. */
    {
        kolo__params_t *p = &m.u.requests[0].params;
        p->coll = KOLO__COLL_COUNT_ - 1;
        p->wire = KOLO_DTYPE_COUNT_ - 1;
        p->ndim = KOLO_MAX_DIMS;
        for (int d = 0; d < KOLO_MAX_DIMS; d++)
            p->shape[d] = d == 0 ? 0 : d == 1 ? INT64_MAX : (int64_t)1 << (7 * d);
        p->group = UINT16_MAX;
        for (size_t k = 0; k < sizeof p->group_key - 1; k++)
            p->group_key[k] = (char)(k < 8 ? 0xff - k : 1 + k * 4);
        p->group_key[sizeof p->group_key - 1] = '\0';
        p->root = INT32_MIN;
        p->prescale = -0.0;
        p->postscale = NAN;
        p = &m.u.requests[1].params;
        p->root = INT32_MAX;
        p->prescale = INFINITY;
        p->postscale = -INFINITY;
        p->group = 2;
        p->ndim = 1;
        p->shape[0] = 0;
        p = &m.u.requests[2].params;
        p->prescale = DBL_MIN / 4; /* subnormal */
        p->postscale = DBL_MAX;
        p->group = 1; /* no group: no key (and none sent) */
        p->group_key[0] = '\0';
        p->ndim = KOLO_MAX_DIMS;
        p->shape[KOLO_MAX_DIMS - 1] = INT64_MAX;
    }
    roundtrip(&m);
    kolo__msg_free(&m);

    /* Responses: an error text of exactly the maximum length, an empty
     * text. */
    make_responses(&m, 4, INT32_MAX);
    free(m.u.responses[0].name);
    m.u.responses[0].name = xstrdup(longname);
    m.u.responses[0].status = KOLO_ERR_INTERNAL;
    free(m.u.responses[0].text);
    m.u.responses[0].text = xstrdup(longtext);
    m.u.responses[2].status = KOLO_ERR_BACKEND;
    free(m.u.responses[2].text);
    m.u.responses[2].text = xstrdup("");
    roundtrip(&m);
    kolo__msg_free(&m);

    free(longname);
    free(longtext);
}
END_TEST

/* An error response whose text is NULL (negotiate.c leaves it NULL when
 * strdup of the mismatch text fails) is sent with an empty text and decodes
 * as "". Run under -fsanitize=undefined: encoding must not pass NULL to
 * memcpy. */
/* Encodes m into b, which must be `len` bytes long, and decodes that into
 * d. */
static void encode_decode(const kolo__msg_t *m, size_t len, kolo__bytes_t *b,
                          kolo__msg_t *d)
{
    kolo__err_t err;

    ck_assert_int_eq(kolo__msg_encode(m, b, &err), KOLO_OK);
    ck_assert_uint_eq(b->len, len);
    ck_assert_int_eq(decode(b->data, b->len, d, &err), KOLO_OK);
}

START_TEST(error_response_without_text_roundtrips)
{
    kolo__msg_t m, d;
    kolo__bytes_t b = {0};

    make_responses(&m, 1, 0);
    m.u.responses[0].status = KOLO_ERR_MISMATCH;
    m.u.responses[0].text = NULL;
    /* header | u16 len "grad.0" | params without shape or key | u16 0 */
    encode_decode(&m, 16 + 2 + 6 + RAW_PARAMS_FIXED + 2, &b, &d);
    ck_assert_int_eq(b.data[b.len - 2], 0);
    ck_assert_int_eq(b.data[b.len - 1], 0);
    ck_assert_int_eq(d.u.responses[0].status, KOLO_ERR_MISMATCH);
    ck_assert_str_eq(d.u.responses[0].text, "");
    kolo__msg_free(&d);
    kolo__msg_free(&m);
    kolo__bytes_free(&b);
}
END_TEST

START_TEST(every_status_roundtrips)
{
    for (int status = KOLO_ERR_INTERNAL; status <= KOLO_OK; status++) {
        kolo__msg_t m;
        make_responses(&m, 1, 1);
        m.u.responses[0].status = status;
        free(m.u.responses[0].text);
        m.u.responses[0].text = status ? xstrdup(kolo_strerror(status)) : NULL;
        roundtrip(&m);
        kolo__msg_free(&m);
    }
}
END_TEST

START_TEST(ok_response_text_is_not_sent)
{
    kolo__msg_t m, d;
    kolo__bytes_t b = {0};

    make_responses(&m, 1, 0);
    ck_assert_int_eq(m.u.responses[0].status, KOLO_OK);
    m.u.responses[0].text = xstrdup("ignored");
    encode_decode(&m, 16 + 2 + strlen("grad.0") + RAW_PARAMS_FIXED, &b, &d);
    ck_assert_ptr_null(d.u.responses[0].text);
    kolo__msg_free(&d);
    kolo__msg_free(&m);
    kolo__bytes_free(&b);
}
END_TEST

START_TEST(params_init_defaults)
{
    kolo__params_t p;

    memset(&p, 0x5a, sizeof p);
    kolo__params_init(&p, KOLO__COLL_REDUCESCATTER, KOLO_FLOAT16,
                      KOLO_OP_PRODUCT, 77);
    ck_assert_uint_eq(p.coll, KOLO__COLL_REDUCESCATTER);
    ck_assert_uint_eq(p.dtype, KOLO_FLOAT16);
    ck_assert_uint_eq(p.op, KOLO_OP_PRODUCT);
    ck_assert_int_eq(p.count, 77);
    ck_assert_uint_eq(p.wire, KOLO_FLOAT16);
    ck_assert_uint_eq(p.ndim, 0);
    ck_assert_uint_eq(p.group, 0);
    ck_assert_int_eq(p.root, 0);
    ck_assert(p.prescale == 1.0);
    ck_assert(p.postscale == 1.0);
    for (int d = 0; d < KOLO_MAX_DIMS; d++)
        ck_assert_int_eq(p.shape[d], 0);
    ck_assert_str_eq(p.group_key, "");
}
END_TEST

START_TEST(params_equal_and_coll_name)
{
    kolo__params_t a, b;

    kolo__params_init(&a, KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, 10);
    a.wire = KOLO_FLOAT16;
    a.ndim = 3;
    a.shape[0] = 2;
    a.shape[1] = 5;
    a.shape[2] = 1;
    a.group = 4;
    strcpy(a.group_key, "layer0/w");
    a.root = 2;
    a.prescale = 0.125;
    a.postscale = 3.0;
    b = a;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 1);
    ck_assert_int_eq(kolo__params_equal(&b, &a), 1);

    /* Each field alone makes them unequal, both ways round. */
#define DIFFERS(stmt)                                                         \
    do {                                                                      \
        b = a;                                                                \
        stmt;                                                                 \
        ck_assert_msg(!kolo__params_equal(&a, &b) && !kolo__params_equal(&b, &a), \
                      "equal after: %s", #stmt);                              \
    } while (0)
    DIFFERS(b.count = 11);
    DIFFERS(b.dtype = KOLO_FLOAT64);
    DIFFERS(b.op = KOLO_OP_MAX);
    DIFFERS(b.coll = KOLO__COLL_BROADCAST);
    DIFFERS(b.wire = KOLO_FLOAT32);
    DIFFERS(b.ndim = 2);
    DIFFERS(b.ndim = 4); /* shape[3] is 0 in both */
    DIFFERS(b.shape[0] = 3);
    DIFFERS(b.shape[2] = 0);
    DIFFERS(b.group = 5);
    DIFFERS(b.group = 0);
    DIFFERS(b.group_key[7] = 'x');
    DIFFERS(strcpy(b.group_key, "layer0/"));
    DIFFERS(b.root = -2);
    DIFFERS(b.prescale = 0.25);
    DIFFERS(b.postscale = 3.0000000000000004);
    /* The scales compare bit for bit: -0 is not 0. */
    DIFFERS(b.prescale = -0.125);
    a.postscale = 0.0;
    DIFFERS(b.postscale = -0.0);
#undef DIFFERS
    /* ...and a NaN equals the same NaN. */
    a.prescale = NAN;
    b = a;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 1);
    /* Dimensions past ndim are not compared. */
    b.shape[3] = 42;
    b.shape[KOLO_MAX_DIMS - 1] = -1;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 1);

    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_ALLREDUCE), "allreduce");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_BROADCAST), "broadcast");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_ALLGATHER), "allgather");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_ALLTOALL), "alltoall");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_REDUCESCATTER),
                     "reducescatter");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_BARRIER), "barrier");
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_JOIN), "join");
    ck_assert_int_eq(KOLO__COLL_COUNT_, 7);
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_COUNT_), "unknown collective");
    ck_assert_str_eq(kolo__coll_name(-1), "unknown collective");
    ck_assert_str_eq(kolo__coll_name(99), "unknown collective");
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

/* Every proper prefix of a valid message is refused. */
static void check_all_prefixes(const kolo__msg_t *m)
{
    kolo__bytes_t b = {0};
    kolo__err_t err;

    ck_assert_int_eq(kolo__msg_encode(m, &b, &err), KOLO_OK);
    for (size_t len = 0; len < b.len; len++)
        expect_refused(b.data, len, "truncation");
    kolo__bytes_free(&b);
}

START_TEST(every_truncation_refused)
{
    kolo__msg_t m;
    uint32_t sizes[] = {0, 1, 3, 16};

    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        make_requests(&m, sizes[k], 2);
        check_all_prefixes(&m);
        kolo__msg_free(&m);
        make_responses(&m, sizes[k], 2);
        check_all_prefixes(&m);
        kolo__msg_free(&m);
    }
}
END_TEST

START_TEST(null_data_refused)
{
    kolo__msg_t msg;
    kolo__err_t err;
    ck_assert_int_eq(kolo__msg_decode(NULL, 0, 1, &msg, &err),
                     KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(kolo__msg_decode(NULL, 100, 1, &msg, &err),
                     KOLO_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "rank 1"));
    ck_assert_uint_eq(msg.n, 0);
}
END_TEST

START_TEST(bad_header_refused)
{
    raw_t r;
    kolo__msg_t m;

    /* A valid one first, so the refusals below are for the one field. */
    raw_one(&r, KOLO__MSG_REQUESTS, "t", 1, 0);
    m = decoded(&r);
    ck_assert_str_eq(m.u.requests[0].name, "t");
    kolo__msg_free(&m);
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 0);
    m = decoded(&r);
    ck_assert_uint_eq(m.kind, KOLO__MSG_RESPONSES);
    ck_assert_uint_eq(m.n, 0);
    kolo__msg_free(&m);

    raw_one(&r, KOLO__MSG_REQUESTS, "t", 1, 0);
    r.buf[0] ^= 0x20; /* "kOLO" */
    expect_refused_raw(&r, "bad magic or version");
    r.buf[0] ^= 0x20;
    r.buf[3] = 0;
    expect_refused_raw(&r, "bad magic or version");
    r.buf[3] = 'O';

    for (unsigned v = 0; v < 4; v++) {
        if (v == KOLO__MSG_VERSION)
            continue;
        r.buf[4] = (uint8_t)v;
        expect_refused_raw(&r, "bad magic or version");
    }
    r.buf[4] = KOLO__MSG_VERSION;
    r.buf[5] = 1; /* version 257 */
    expect_refused_raw(&r, "bad magic or version");
    r.buf[5] = 0;

    {
        unsigned kinds[] = {0, 3, 4, 0x100 + KOLO__MSG_REQUESTS, 0xffff};
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            r.buf[6] = (uint8_t)(kinds[k] & 0xff);
            r.buf[7] = (uint8_t)(kinds[k] >> 8);
            expect_refused_raw(&r, "bad kind");
        }
    }
}
END_TEST

START_TEST(bad_count_of_items_refused)
{
    raw_t r;
    uint32_t huge[] = {2, 3, 1000, 0x10000, 0x7fffffff, 0xffffffffu};

    for (size_t k = 0; k < sizeof huge / sizeof huge[0]; k++) {
        raw_header(&r, KOLO__MSG_REQUESTS, 0, huge[k]);
        raw_request(&r, "t", 1, 0, 0, 0, 0, 1);
        expect_refused_raw(&r, "bad tensor count");
        raw_header(&r, KOLO__MSG_RESPONSES, 0, huge[k]);
        raw_request(&r, "t", 1, 0, 0, 0, 0, 1);
        expect_refused_raw(&r, "bad tensor count");
    }
    /* n = 0 with an item after it: trailing bytes. */
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 0);
    raw_request(&r, "t", 1, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad trailing bytes");
}
END_TEST

START_TEST(bad_names_refused)
{
    raw_t r;
    kolo__msg_t m;
    const char *big = filler(KOLO_MAX_NAME_LEN + 1);

    raw_one(&r, KOLO__MSG_REQUESTS, "", 0, 0);
    raw_bytes(&r, "padding-padding", 15); /* enough bytes for n = 1 */
    expect_refused_raw(&r, "bad tensor name");

    /* Exactly the maximum is fine; one more is not. */
    raw_one(&r, KOLO__MSG_REQUESTS, big, KOLO_MAX_NAME_LEN, 0);
    m = decoded(&r);
    ck_assert_uint_eq(strlen(m.u.requests[0].name), KOLO_MAX_NAME_LEN);
    kolo__msg_free(&m);
    expect_name_refused(KOLO__MSG_REQUESTS, big, KOLO_MAX_NAME_LEN + 1);
    expect_name_refused(KOLO__MSG_RESPONSES, big, KOLO_MAX_NAME_LEN + 1);
    /* A length of 0xffff with few bytes after it. */
    raw_one(&r, KOLO__MSG_REQUESTS, "abcdefghijklmnopqrstuvwxyz", 26, 0);
    r.buf[16] = 0xff;
    r.buf[17] = 0xff;
    expect_refused_raw(&r, "bad tensor name");

    /* NUL bytes inside, first or last. */
    expect_name_refused(KOLO__MSG_REQUESTS, "ab\0cd", 5);
    expect_name_refused(KOLO__MSG_REQUESTS, "\0abcd", 5);
    expect_name_refused(KOLO__MSG_RESPONSES, "abcd\0", 5);

    /* A bad second name after a good first one (frees the first). */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 2);
    raw_request(&r, "good", 4, 0, 0, 0, 3, 1);
    raw_u16(&r, 4);
    raw_bytes(&r, "text", 4);
    raw_request(&r, "b\0d", 3, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
}
END_TEST

/* An item with these parameters, alone, as a response, after a good item
 * and followed by padding (so running out of bytes is not the reason), is
 * refused naming the parameters. `tail` is written right after the
 * parameters (for keys written by hand). */
static void expect_params_refused(const raw_params_t *bad, const void *tail,
                                  size_t tail_len, const char *why)
{
    raw_t *r = malloc(sizeof *r);
    raw_params_t good = rp(0, KOLO_FLOAT32, 0, 0, 3);
    ck_assert_ptr_nonnull(r);

    for (int variant = 0; variant < 4; variant++) {
        raw_params_t p = *bad;
        unsigned kind = variant == 1 ? KOLO__MSG_RESPONSES : KOLO__MSG_REQUESTS;
        raw_header(r, kind, 0, variant == 2 ? 2 : 1);
        if (variant == 2)
            raw_item(r, "good", 4, &good);
        /* (no request's age and seq: the decoder stops at the params) */
        raw_u16(r, 1);
        raw_bytes(r, "t", 1);
        raw_params(r, &p);
        raw_bytes(r, tail, tail_len);
        if (variant == 3)
            for (int k = 0; k < 64; k++)
                raw_u8(r, 0);
        /* Padding would complete a key written by hand or left out. */
        if (variant != 3 || (tail_len == 0 && !bad->omit_key)) {
            kolo__msg_t msg;
            kolo__err_t err;
            int rc = decode(r->buf, r->len, &msg, &err);
            ck_assert_msg(rc == KOLO_ERR_INVALID_ARGUMENT &&
                              strstr(err.msg, "bad tensor parameters") != NULL,
                          "%s (variant %d): rc %d: %s", why, variant, rc,
                          rc ? err.msg : "accepted");
            expect_refused_raw(r, "bad tensor parameters");
        }
    }
    free(r);
}

/* What the raw parameters of an item that decodes say, the group's key
 * aside. */
static kolo__params_t params_of(const raw_params_t *p)
{
    kolo__params_t want;

    memset(&want, 0, sizeof want);
    want.coll = (uint8_t)p->coll;
    want.dtype = (uint8_t)p->dtype;
    want.op = (uint8_t)p->op;
    want.count = p->count;
    want.wire = (uint8_t)p->wire;
    want.ndim = (uint8_t)p->ndim;
    want.device_type = (uint8_t)p->device_type;
    want.group = (uint16_t)p->group;
    want.root = p->root;
    want.prescale = p->prescale;
    want.postscale = p->postscale;
    for (unsigned d = 0; d < KOLO_MAX_DIMS && d < p->ndim; d++)
        want.shape[d] = p->shape[d];
    return want;
}

/* A request with these parameters decodes to exactly them. */
static void expect_params_ok(const raw_params_t *p)
{
    raw_t *r = malloc(sizeof *r);
    kolo__msg_t m;
    kolo__err_t err;
    kolo__params_t want;
    const kolo__params_t *got;
    int rc;

    ck_assert_ptr_nonnull(r);
    raw_header(r, KOLO__MSG_REQUESTS, 0, 1);
    raw_item(r, "t", 1, p);
    rc = decode(r->buf, r->len, &m, &err);
    ck_assert_msg(rc == KOLO_OK, "refused: %s", err.msg);
    got = &m.u.requests[0].params;
    want = params_of(p);
    assert_params_fields(&want, got);
    ck_assert_uint_eq(strlen(got->group_key), p->group > 1 ? p->key_len : 0);
    if (p->group > 1)
        ck_assert_mem_eq(got->group_key, p->key, p->key_len);
    kolo__msg_free(&m);
    free(r);
}

START_TEST(bad_params_refused)
{
    raw_t r;
    struct {
        unsigned coll, dtype, op;
        int64_t count;
    } bad[] = {
        {KOLO__COLL_COUNT_, 0, 0, 1},
        {255, 0, 0, 1},
        {0, KOLO_DTYPE_COUNT_, 0, 1},
        {0, 255, 0, 1},
        {0, 0, KOLO_OP_COUNT_, 1},
        {0, 0, 200, 1},
        {0, 0, 0, -1},
        {0, 0, 0, INT64_MIN},
    };

    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        raw_params_t p = rp(bad[k].coll, bad[k].dtype, bad[k].op, 0,
                            bad[k].count);
        /* wire stays valid when dtype is the bad field. */
        if (p.wire >= KOLO_DTYPE_COUNT_)
            p.wire = 0;
        expect_params_refused(&p, NULL, 0, "coll/dtype/op/count");
    }
    /* Every collective id below the count is accepted. */
    for (unsigned c = 0; c < KOLO__COLL_COUNT_; c++) {
        raw_params_t p = rp(c, 0, 0, 0, 1);
        expect_params_ok(&p);
    }
    /* Request flags are reserved: must be 0. */
    for (unsigned f = 1; f < 256; f *= 2) {
        raw_one(&r, KOLO__MSG_REQUESTS, "t", 1, f);
        expect_refused_raw(&r, "bad request flags");
    }
}
END_TEST

START_TEST(bad_v2_params_refused)
{
    raw_params_t p;
    char key[300];

    memset(key, 'k', sizeof key);

    /* The limits are accepted. */
    p = rp(KOLO__COLL_COUNT_ - 1, KOLO_FLOAT64, KOLO_OP_SUM, 0, 1);
    p.wire = KOLO_DTYPE_COUNT_ - 1;
    p.ndim = KOLO_MAX_DIMS;
    p.shape[0] = 0;
    p.shape[KOLO_MAX_DIMS - 1] = INT64_MAX;
    p.group = UINT16_MAX;
    p.key = key;
    p.key_len = 63;
    p.root = INT32_MIN;
    p.prescale = NAN;
    p.postscale = -0.0;
    expect_params_ok(&p);
    p.group = 2;
    p.key_len = 0; /* a group with an empty key */
    expect_params_ok(&p);
    p.group = 1; /* no group: no key follows */
    expect_params_ok(&p);

    /* wire >= KOLO_DTYPE_COUNT_. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.wire = KOLO_DTYPE_COUNT_;
    expect_params_refused(&p, NULL, 0, "wire = KOLO_DTYPE_COUNT_");
    p.wire = 255;
    expect_params_refused(&p, NULL, 0, "wire = 255");

    /* ndim > KOLO_MAX_DIMS, with the bytes of every dimension present. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    for (unsigned nd = KOLO_MAX_DIMS + 1; nd < 256; nd = nd * 2 + 1) {
        p.ndim = nd;
        expect_params_refused(&p, NULL, 0, "ndim > KOLO_MAX_DIMS");
    }
    p.ndim = 255;
    expect_params_refused(&p, NULL, 0, "ndim = 255");

    /* A negative dimension, first, in the middle or last. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.ndim = 1;
    p.shape[0] = -1;
    expect_params_refused(&p, NULL, 0, "shape[0] = -1");
    p.ndim = 3;
    p.shape[0] = 2;
    p.shape[1] = INT64_MIN;
    p.shape[2] = 2;
    expect_params_refused(&p, NULL, 0, "shape[1] = INT64_MIN");
    p.ndim = KOLO_MAX_DIMS;
    p.shape[1] = 1;
    p.shape[KOLO_MAX_DIMS - 1] = -1;
    expect_params_refused(&p, NULL, 0, "shape[last] = -1");

    /* A group key of 64 bytes or more, all present. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.group = 2;
    p.key = key;
    p.key_len = 64;
    expect_params_refused(&p, NULL, 0, "key of 64 bytes");
    p.key_len = sizeof key;
    expect_params_refused(&p, NULL, 0, "key of 300 bytes");
    p.group = UINT16_MAX;
    p.key_len = 65;
    expect_params_refused(&p, NULL, 0, "key of 65 bytes");
    /* ...a length of 0xffff with few bytes after it. */
    p.omit_key = 1;
    {
        uint8_t tail[2 + 100];
        tail[0] = 0xff;
        tail[1] = 0xff;
        memset(tail + 2, 'k', 100);
        expect_params_refused(&p, tail, sizeof tail, "key length 0xffff");
    }

    /* A NUL inside the key, first or last. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.group = 3;
    p.key = "a\0b";
    p.key_len = 3;
    expect_params_refused(&p, NULL, 0, "key a\\0b");
    p.key = "\0";
    p.key_len = 1;
    expect_params_refused(&p, NULL, 0, "key \\0");
    p.key = "abc\0";
    p.key_len = 4;
    expect_params_refused(&p, NULL, 0, "key abc\\0");
    {
        char k63[63];
        memset(k63, 'q', sizeof k63);
        k63[62] = '\0';
        p.key = k63;
        p.key_len = 63;
        expect_params_refused(&p, NULL, 0, "63-byte key ending in NUL");
    }

    /* A truncated key: its length runs past the end, only one byte of the
     * length, or no length at all. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.group = 2;
    p.omit_key = 1;
    expect_params_refused(&p, "\x0a\x00short", 7, "key length 10, 5 bytes");
    expect_params_refused(&p, "\x01\x00", 2, "key length 1, no bytes");
    expect_params_refused(&p, "\x3f\x00", 2, "key length 63, no bytes");
    expect_params_refused(&p, "\x01", 1, "one byte of key length");
    expect_params_refused(&p, NULL, 0, "no key length");
    /* Truncated shapes: ndim says more dimensions than there are bytes. */
    p = rp(0, KOLO_FLOAT32, 0, 0, 4);
    p.ndim = KOLO_MAX_DIMS;
    {
        raw_t r;
        for (size_t cut = 1; cut <= 8 * KOLO_MAX_DIMS; cut++) {
            raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
            raw_item(&r, "t", 1, &p);
            r.len -= cut + 16; /* (and the request's age and seq) */
            expect_refused_raw(&r, "bad tensor parameters");
        }
        /* A request cut in its age or seq. */
        for (size_t cut = 1; cut <= 16; cut++) {
            raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
            raw_item(&r, "t", 1, &p);
            r.len -= cut;
            expect_refused_raw(&r, "bad request age and sequence");
        }
    }
}
END_TEST

START_TEST(bad_status_and_text_refused)
{
    const char *big = filler(KOLO__MSG_MAX_TEXT + 1);
    raw_t r;
    kolo__msg_t m;

    /* Status bytes 15..255 decode below KOLO_ERR_INTERNAL. */
    for (unsigned s = 15; s < 256; s++) {
        raw_one(&r, KOLO__MSG_RESPONSES, "t", 1, s);
        raw_u16(&r, 1);
        raw_u8(&r, 'x');
        expect_refused_raw(&r, "bad response status");
    }
    /* An error status without its text. */
    raw_one(&r, KOLO__MSG_RESPONSES, "t", 1, 1);
    expect_refused_raw(&r, "bad error text");
    /* A text of the maximum length is fine; one byte more is not. */
    raw_error_response(&r, KOLO__MSG_MAX_TEXT, big, KOLO__MSG_MAX_TEXT);
    m = decoded(&r);
    ck_assert_int_eq(m.u.responses[0].status, -1);
    ck_assert_uint_eq(strlen(m.u.responses[0].text), KOLO__MSG_MAX_TEXT);
    kolo__msg_free(&m);
    raw_error_response(&r, KOLO__MSG_MAX_TEXT + 1, big,
                       KOLO__MSG_MAX_TEXT + 1);
    expect_refused_raw(&r, "bad error text");
    /* A text with a NUL inside. */
    raw_error_response(&r, 3, "a\0b", 3);
    expect_refused_raw(&r, "bad error text");
    /* A text length running past the end. */
    raw_error_response(&r, 10, "short", 5);
    expect_refused_raw(&r, "bad error text");
}
END_TEST

START_TEST(trailing_bytes_refused)
{
    kolo__msg_t m;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    uint8_t *longer;

    for (int kind = 0; kind < 2; kind++) {
        if (kind == 0)
            make_requests(&m, 3, 0);
        else
            make_responses(&m, 3, 0);
        ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
        longer = malloc(b.len + 64);
        ck_assert_ptr_nonnull(longer);
        memcpy(longer, b.data, b.len);
        memset(longer + b.len, 0, 64);
        for (size_t extra = 1; extra <= 64; extra++)
            expect_refused(longer, b.len + extra, "bad trailing bytes");
        free(longer);
        kolo__msg_free(&m);
    }
    kolo__bytes_free(&b);
}
END_TEST

/* ---- fuzzing ------------------------------------------------------------- */

static uint64_t rng_state;

static uint32_t rnd(void)
{
    /* xorshift64*: deterministic for a fixed seed. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

static char *random_string(size_t max_len, int allow_empty)
{
    size_t n = (size_t)rnd() % (max_len + 1);
    char *s;
    if (n == 0 && !allow_empty)
        n = 1;
    s = malloc(n + 1);
    ck_assert_ptr_nonnull(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(1 + rnd() % 255);
    s[n] = '\0';
    return s;
}

static void random_msg(kolo__msg_t *m)
{
    uint32_t n = rnd() % 6;
    memset(m, 0, sizeof *m);
    m->kind = rnd() % 2 ? KOLO__MSG_REQUESTS : KOLO__MSG_RESPONSES;
    m->rank = (int32_t)rnd();
    m->n = n;
    if (m->kind == KOLO__MSG_REQUESTS)
        m->u.requests = calloc(n ? n : 1, sizeof(kolo__request_t));
    else
        m->u.responses = calloc(n ? n : 1, sizeof(kolo__response_t));
    ck_assert_ptr_nonnull(m->u.requests);
    for (uint32_t i = 0; i < n; i++) {
        /* Mostly short names, now and then a long one. */
        size_t max = rnd() % 8 ? 12 : KOLO_MAX_NAME_LEN;
        kolo__params_t p;
        kolo__params_init(&p, (int)(rnd() % KOLO__COLL_COUNT_),
                          (int)(rnd() % KOLO_DTYPE_COUNT_),
                          (int)(rnd() % KOLO_OP_COUNT_),
                          (int64_t)(((uint64_t)rnd() << 31) ^ rnd()));
        /* Half the items keep the defaults of the version-2 fields. */
        if (rnd() % 2) {
            uint64_t bits;
            p.wire = (uint8_t)(rnd() % KOLO_DTYPE_COUNT_);
            p.ndim = (uint8_t)(rnd() % (KOLO_MAX_DIMS + 1));
            for (int d = 0; d < p.ndim; d++)
                p.shape[d] = rnd() % 4 ? rnd() % 1000
                                       : (int64_t)(((uint64_t)rnd() << 31) ^ rnd());
            p.group = (uint16_t)(rnd() % 3 ? rnd() % 5 : rnd());
            if (p.group > 1) {
                char *key = random_string(rnd() % 4 ? 10 : 63, 1);
                strcpy(p.group_key, key);
                free(key);
            }
            p.root = (int32_t)rnd();
            bits = ((uint64_t)rnd() << 32) | rnd();
            memcpy(&p.prescale, &bits, 8); /* any bits, NaNs included */
            p.postscale = (double)(int32_t)rnd() / 1024;
        }
        if (m->kind == KOLO__MSG_REQUESTS) {
            m->u.requests[i].name = random_string(max, 0);
            m->u.requests[i].params = p;
        } else {
            kolo__response_t *r = &m->u.responses[i];
            r->name = random_string(max, 0);
            r->params = p;
            r->status = rnd() % 2 ? KOLO_OK : -(int32_t)(1 + rnd() % 14);
            if (r->status != KOLO_OK)
                r->text = random_string(rnd() % 8 ? 40 : KOLO__MSG_MAX_TEXT, 1);
        }
    }
}

START_TEST(fuzz_mutated_messages)
{
    enum { ROUNDS = 20000 };
    int decoded_ok = 0, refused = 0;
    kolo__bytes_t b = {0}, again = {0};

    rng_state = 0x9e3779b97f4a7c15ULL;
    for (int round = 0; round < ROUNDS; round++) {
        kolo__msg_t m, d;
        kolo__err_t err;
        uint8_t *buf;
        size_t len, cap;
        int rc, mode = (int)(rnd() % 8);

        random_msg(&m);
        ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
        /* The unmutated message decodes to itself. */
        if (round % 16 == 0) {
            ck_assert_int_eq(decode(b.data, b.len, &d, &err), KOLO_OK);
            assert_same(&m, &d);
            kolo__msg_free(&d);
        }
        cap = b.len + 16;
        buf = malloc(cap);
        ck_assert_ptr_nonnull(buf);
        memcpy(buf, b.data, b.len);
        len = b.len;

        if (mode <= 4) {
            /* Flip 1 to 4 random bytes; often in the header and the first
             * item, where the lengths are. */
            int flips = 1 + (int)(rnd() % 4);
            for (int f = 0; f < flips; f++) {
                size_t at = rnd() % 2 ? rnd() % (len < 40 ? len : 40)
                                      : rnd() % len;
                buf[at] = mode == 0 ? (uint8_t)(buf[at] ^ (1u << (rnd() % 8)))
                                    : (uint8_t)rnd();
            }
        } else if (mode == 5) {
            len = rnd() % len; /* cut */
        } else if (mode == 6) {
            size_t extra = 1 + rnd() % 16;
            for (size_t i = 0; i < extra; i++)
                buf[len + i] = (uint8_t)rnd();
            len += extra; /* append */
        } else {
            /* Change one random byte and cut or pad. */
            buf[rnd() % len] = (uint8_t)rnd();
            if (rnd() % 2)
                len -= rnd() % (len - 15);
        }

        memset(&d, 0xcd, sizeof d);
        kolo__err_clear(&err);
        rc = decode(buf, len, &d, &err);
        if (rc == KOLO_OK) {
            decoded_ok++;
            ck_assert_int_eq(err.code, KOLO_OK);
            /* Every decoded field is in range... */
            ck_assert(d.kind == KOLO__MSG_REQUESTS ||
                      d.kind == KOLO__MSG_RESPONSES);
            for (uint32_t i = 0; i < d.n; i++) {
                const char *name = d.kind == KOLO__MSG_REQUESTS
                                       ? d.u.requests[i].name
                                       : d.u.responses[i].name;
                const kolo__params_t *p = d.kind == KOLO__MSG_REQUESTS
                                              ? &d.u.requests[i].params
                                              : &d.u.responses[i].params;
                size_t nl = strlen(name);
                ck_assert_uint_ge(nl, 1);
                ck_assert_uint_le(nl, KOLO_MAX_NAME_LEN);
                ck_assert_uint_lt(p->coll, KOLO__COLL_COUNT_);
                ck_assert_uint_lt(p->dtype, KOLO_DTYPE_COUNT_);
                ck_assert_uint_lt(p->op, KOLO_OP_COUNT_);
                ck_assert_int_ge(p->count, 0);
                ck_assert_uint_lt(p->wire, KOLO_DTYPE_COUNT_);
                ck_assert_uint_le(p->ndim, KOLO_MAX_DIMS);
                {
                    int dims_ok = 1;
                    for (int dd = 0; dd < KOLO_MAX_DIMS; dd++)
                        dims_ok &= p->shape[dd] >= 0 &&
                                   (dd < p->ndim || p->shape[dd] == 0);
                    ck_assert_msg(dims_ok, "round %d: bad shape", round);
                }
                ck_assert_uint_lt(strlen(p->group_key), sizeof p->group_key);
                if (p->group <= 1)
                    ck_assert_str_eq(p->group_key, "");
                if (d.kind == KOLO__MSG_RESPONSES) {
                    int32_t s = d.u.responses[i].status;
                    ck_assert_int_le(s, KOLO_OK);
                    ck_assert_int_ge(s, KOLO_ERR_INTERNAL);
                    ck_assert_int_eq(d.u.responses[i].text == NULL,
                                     s == KOLO_OK);
                }
            }
            /* ...and the message re-encodes to exactly the input. */
            ck_assert_int_eq(kolo__msg_encode(&d, &again, &err), KOLO_OK);
            ck_assert_msg(again.len == len && memcmp(again.data, buf, len) == 0,
                          "round %d: decoded %zu bytes re-encode to %zu "
                          "different bytes",
                          round, len, again.len);
            kolo__msg_free(&d);
        } else {
            refused++;
            ck_assert_int_eq(rc, KOLO_ERR_INVALID_ARGUMENT);
            ck_assert_int_eq(err.code, rc);
            ck_assert_uint_gt(strlen(err.msg), 0);
            ck_assert_uint_eq(d.n, 0);
            ck_assert_ptr_null(d.u.requests);
        }
        free(buf);
        kolo__msg_free(&m);
    }
    /* Both outcomes were exercised many times. */
    ck_assert_int_gt(decoded_ok, ROUNDS / 50);
    ck_assert_int_gt(refused, ROUNDS / 2);
    kolo__bytes_free(&b);
    kolo__bytes_free(&again);
}
END_TEST

/* Random bytes after a valid header: the item parser on garbage. */
START_TEST(fuzz_random_bodies)
{
    enum { ROUNDS = 20000 };
    raw_t *r = malloc(sizeof *r);
    kolo__bytes_t again = {0};

    ck_assert_ptr_nonnull(r);
    rng_state = 42;
    for (int round = 0; round < ROUNDS; round++) {
        kolo__msg_t d;
        kolo__err_t err;
        /* An item is at least 39 bytes now: room for up to three. */
        size_t body = rnd() % 128;
        int rc;

        raw_header(r, 1 + rnd() % 2, (int32_t)rnd(), rnd() % 3);
        for (size_t i = 0; i < body; i++) {
            /* Small values make plausible lengths and fields. */
            raw_u8(r, rnd() % 4 ? rnd() % 8 : rnd() % 256);
        }
        rc = decode(r->buf, r->len, &d, &err);
        if (rc == KOLO_OK) {
            ck_assert_int_eq(kolo__msg_encode(&d, &again, &err), KOLO_OK);
            ck_assert_uint_eq(again.len, r->len);
            ck_assert_mem_eq(again.data, r->buf, r->len);
            kolo__msg_free(&d);
        } else {
            ck_assert_int_eq(rc, KOLO_ERR_INVALID_ARGUMENT);
            ck_assert_uint_eq(d.n, 0);
        }
    }
    kolo__bytes_free(&again);
    free(r);
}
END_TEST

static Suite *message_suite(void)
{
    Suite *s = suite_create("message");
    TCase *tc = tcase_create("format");
    tcase_add_test(tc, small_request_has_documented_bytes);
    tcase_add_test(tc, full_request_has_literal_bytes);
    tcase_add_test(tc, group_key_sent_only_for_groups);
    tcase_add_test(tc, small_response_has_documented_bytes);
    tcase_add_loop_test(tc, roundtrip_requests, 0,
                        sizeof list_sizes / sizeof list_sizes[0]);
    tcase_add_loop_test(tc, roundtrip_responses, 0,
                        sizeof list_sizes / sizeof list_sizes[0]);
    tcase_add_test(tc, roundtrip_extreme_values);
    tcase_add_test(tc, error_response_without_text_roundtrips);
    tcase_add_test(tc, every_status_roundtrips);
    tcase_add_test(tc, ok_response_text_is_not_sent);
    tcase_add_test(tc, params_init_defaults);
    tcase_add_test(tc, params_equal_and_coll_name);
    suite_add_tcase(s, tc);

    tc = tcase_create("refusals");
    tcase_add_test(tc, every_truncation_refused);
    tcase_add_test(tc, null_data_refused);
    tcase_add_test(tc, bad_header_refused);
    tcase_add_test(tc, bad_count_of_items_refused);
    tcase_add_test(tc, bad_names_refused);
    tcase_add_test(tc, bad_params_refused);
    tcase_add_test(tc, bad_v2_params_refused);
    tcase_add_test(tc, bad_status_and_text_refused);
    tcase_add_test(tc, trailing_bytes_refused);
    suite_add_tcase(s, tc);

    tc = tcase_create("fuzz");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fuzz_mutated_messages);
    tcase_add_test(tc, fuzz_random_bodies);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return kolo_unit_run(message_suite());
}
