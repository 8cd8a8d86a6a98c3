/*
 * test-message.c — unit tests of runtime/message.{h,c}: the negotiation
 * messages and their wire format.
 *
 * Why these tests: these bytes cross between processes, so the decoder is
 * the runtime's one parser of untrusted input, and the format is a contract
 * between ranks. The tests check
 *  - the exact bytes of a small encoded message against the format written
 *    out in message.h (built here by hand, not by the encoder);
 *  - round trips of request and response lists of 0, 1 and many items,
 *    names of the maximum length, error texts, every status;
 *  - that every malformed input named in message.h is refused with
 *    KOLO_ERR_INVALID_ARGUMENT and leaves an empty message: every prefix of
 *    valid messages, and each field made bad on its own;
 *  - a seeded fuzz test: random valid messages with random bytes changed,
 *    cut or appended. Decoding either fails cleanly or succeeds, and when it
 *    succeeds the message re-encodes to exactly the input bytes (the format
 *    has one encoding per message, so anything else means a field was
 *    misread).
 * Every decode reads from a heap copy of exactly the input length, so an
 * AddressSanitizer build catches a read past the end.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"

/* ---- helpers ------------------------------------------------------------ */

/* A hand-written little-endian writer, independent of message.c. */
typedef struct raw {
    uint8_t buf[1 << 16];
    size_t len;
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
    memcpy(r->buf + r->len, p, n);
    r->len += n;
}
static void raw_header(raw_t *r, unsigned kind, int32_t rank, uint32_t n)
{
    r->len = 0;
    raw_u32(r, KOLO__MSG_MAGIC);
    raw_u16(r, KOLO__MSG_VERSION);
    raw_u16(r, kind);
    raw_u32(r, (uint32_t)rank);
    raw_u32(r, n);
}
/* One request item: u16 name_len | name | coll dtype op flags | i64 count */
static void raw_request(raw_t *r, const char *name, size_t name_len,
                        unsigned coll, unsigned dtype, unsigned op,
                        unsigned flags, int64_t count)
{
    raw_u16(r, (unsigned)name_len);
    raw_bytes(r, name, name_len);
    raw_u8(r, coll);
    raw_u8(r, dtype);
    raw_u8(r, op);
    raw_u8(r, flags);
    raw_i64(r, count);
}

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

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* Request and response lists owned by the test. */
static void make_requests(kolo__msg_t *m, uint32_t n, int32_t rank)
{
    memset(m, 0, sizeof *m);
    m->kind = KOLO__MSG_REQUESTS;
    m->rank = rank;
    m->n = n;
    m->u.requests = calloc(n ? n : 1, sizeof(kolo__request_t));
    ck_assert_ptr_nonnull(m->u.requests);
    for (uint32_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "model/layer%u/weight", i);
        m->u.requests[i].name = xstrdup(name);
        m->u.requests[i].params = (kolo__params_t){
            KOLO__COLL_ALLREDUCE, (uint8_t)(i % KOLO_DTYPE_COUNT_),
            (uint8_t)(i % KOLO_OP_COUNT_), (int64_t)i * 1000003};
    }
}

static void make_responses(kolo__msg_t *m, uint32_t n, int32_t rank)
{
    memset(m, 0, sizeof *m);
    m->kind = KOLO__MSG_RESPONSES;
    m->rank = rank;
    m->n = n;
    m->u.responses = calloc(n ? n : 1, sizeof(kolo__response_t));
    ck_assert_ptr_nonnull(m->u.responses);
    for (uint32_t i = 0; i < n; i++) {
        char name[64], text[128];
        kolo__response_t *r = &m->u.responses[i];
        snprintf(name, sizeof name, "grad.%u", i);
        r->name = xstrdup(name);
        r->params = (kolo__params_t){KOLO__COLL_ALLREDUCE,
                                     (uint8_t)((i * 7) % KOLO_DTYPE_COUNT_),
                                     (uint8_t)((i * 3) % KOLO_OP_COUNT_),
                                     (int64_t)i << 33};
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

static void assert_same(const kolo__msg_t *a, const kolo__msg_t *b)
{
    ck_assert_uint_eq(a->kind, b->kind);
    ck_assert_int_eq(a->rank, b->rank);
    ck_assert_uint_eq(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        if (a->kind == KOLO__MSG_REQUESTS) {
            const kolo__request_t *x = &a->u.requests[i], *y = &b->u.requests[i];
            ck_assert_str_eq(x->name, y->name);
            ck_assert_int_eq(kolo__params_equal(&x->params, &y->params), 1);
        } else {
            const kolo__response_t *x = &a->u.responses[i],
                                   *y = &b->u.responses[i];
            ck_assert_str_eq(x->name, y->name);
            ck_assert_int_eq(kolo__params_equal(&x->params, &y->params), 1);
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

    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_REQUESTS;
    m.rank = 3;
    m.n = 1;
    kolo__request_t req = {(char *)"ab",
                           {KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_AVERAGE,
                            0x0102030405060708LL}};
    m.u.requests = &req;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);

    raw_header(&want, KOLO__MSG_REQUESTS, 3, 1);
    raw_request(&want, "ab", 2, 0, KOLO_FLOAT32, KOLO_OP_AVERAGE, 0,
                0x0102030405060708LL);
    ck_assert_uint_eq(b.len, 16 + 2 + 2 + 4 + 8);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert_mem_eq(b.data, want.buf, want.len);
    /* "KOLO" in memory, as the magic's comment says. */
    ck_assert_mem_eq(b.data, "KOLO", 4);

    /* Encoding again into the same buffer starts over. */
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
    ck_assert_uint_eq(b.len, want.len);
    ck_assert_mem_eq(b.data, want.buf, want.len);
    kolo__bytes_free(&b);
    ck_assert_ptr_null(b.data);
}
END_TEST

START_TEST(small_response_has_documented_bytes)
{
    kolo__msg_t m;
    kolo__bytes_t b = {0};
    kolo__err_t err;
    raw_t want;
    kolo__response_t resp[2] = {
        {(char *)"x", {0, KOLO_INT64, KOLO_OP_MAX, 9}, KOLO_OK, NULL},
        {(char *)"yz", {0, KOLO_BOOL, KOLO_OP_MIN, 0}, KOLO_ERR_MISMATCH,
         (char *)"bad"},
    };

    memset(&m, 0, sizeof m);
    m.kind = KOLO__MSG_RESPONSES;
    m.rank = -1;
    m.n = 2;
    m.u.responses = resp;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);

    raw_header(&want, KOLO__MSG_RESPONSES, -1, 2);
    raw_request(&want, "x", 1, 0, KOLO_INT64, KOLO_OP_MAX, 0, 9);
    raw_request(&want, "yz", 2, 0, KOLO_BOOL, KOLO_OP_MIN, 5, 0);
    raw_u16(&want, 3);
    raw_bytes(&want, "bad", 3);
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
START_TEST(error_response_without_text_roundtrips)
{
    kolo__msg_t m, d;
    kolo__bytes_t b = {0};
    kolo__err_t err;

    make_responses(&m, 1, 0);
    m.u.responses[0].status = KOLO_ERR_MISMATCH;
    m.u.responses[0].text = NULL;
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
    /* header | u16 len "grad.0" | 4 bytes | count | u16 0 */
    ck_assert_uint_eq(b.len, 16 + 2 + 6 + 4 + 8 + 2);
    ck_assert_int_eq(b.data[b.len - 2], 0);
    ck_assert_int_eq(b.data[b.len - 1], 0);
    ck_assert_int_eq(decode(b.data, b.len, &d, &err), KOLO_OK);
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
    kolo__err_t err;

    make_responses(&m, 1, 0);
    ck_assert_int_eq(m.u.responses[0].status, KOLO_OK);
    m.u.responses[0].text = xstrdup("ignored");
    ck_assert_int_eq(kolo__msg_encode(&m, &b, &err), KOLO_OK);
    ck_assert_uint_eq(b.len, 16 + 2 + strlen("grad.0") + 4 + 8);
    ck_assert_int_eq(decode(b.data, b.len, &d, &err), KOLO_OK);
    ck_assert_ptr_null(d.u.responses[0].text);
    kolo__msg_free(&d);
    kolo__msg_free(&m);
    kolo__bytes_free(&b);
}
END_TEST

START_TEST(params_equal_and_coll_name)
{
    kolo__params_t a = {KOLO__COLL_ALLREDUCE, KOLO_FLOAT32, KOLO_OP_SUM, 10};
    kolo__params_t b = a;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 1);
    b.count = 11;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 0);
    b = a;
    b.dtype = KOLO_FLOAT16;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 0);
    b = a;
    b.op = KOLO_OP_MAX;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 0);
    b = a;
    b.coll = 1;
    ck_assert_int_eq(kolo__params_equal(&a, &b), 0);
    ck_assert_str_eq(kolo__coll_name(KOLO__COLL_ALLREDUCE), "allreduce");
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

    /* A valid one first, so the refusals below are for the one field. */
    {
        kolo__msg_t m;
        kolo__err_t err;
        raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
        raw_request(&r, "t", 1, 0, 0, 0, 0, 1);
        ck_assert_int_eq(decode(r.buf, r.len, &m, &err), KOLO_OK);
        ck_assert_str_eq(m.u.requests[0].name, "t");
        kolo__msg_free(&m);
        raw_header(&r, KOLO__MSG_RESPONSES, 0, 0);
        ck_assert_int_eq(decode(r.buf, r.len, &m, &err), KOLO_OK);
        ck_assert_uint_eq(m.kind, KOLO__MSG_RESPONSES);
        ck_assert_uint_eq(m.n, 0);
        kolo__msg_free(&m);
    }

    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 0, 1);
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
    char big[KOLO_MAX_NAME_LEN + 2];

    memset(big, 'n', sizeof big);

    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, "", 0, 0, 0, 0, 0, 1);
    raw_bytes(&r, "padding-padding", 15); /* enough bytes for n = 1 */
    expect_refused_raw(&r, "bad tensor name");

    /* Exactly the maximum is fine; one more is not. */
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, big, KOLO_MAX_NAME_LEN, 0, 0, 0, 0, 1);
    {
        kolo__msg_t m;
        kolo__err_t err;
        ck_assert_int_eq(decode(r.buf, r.len, &m, &err), KOLO_OK);
        ck_assert_uint_eq(strlen(m.u.requests[0].name), KOLO_MAX_NAME_LEN);
        kolo__msg_free(&m);
    }
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, big, KOLO_MAX_NAME_LEN + 1, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, big, KOLO_MAX_NAME_LEN + 1, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
    /* A length of 0xffff with few bytes after it. */
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, "abcdefghijklmnopqrstuvwxyz", 26, 0, 0, 0, 0, 1);
    r.buf[16] = 0xff;
    r.buf[17] = 0xff;
    expect_refused_raw(&r, "bad tensor name");

    /* NUL bytes inside, first or last. */
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, "ab\0cd", 5, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
    raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
    raw_request(&r, "\0abcd", 5, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "abcd\0", 5, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");

    /* A bad second name after a good first one (frees the first). */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 2);
    raw_request(&r, "good", 4, 0, 0, 0, 3, 1);
    raw_u16(&r, 4);
    raw_bytes(&r, "text", 4);
    raw_request(&r, "b\0d", 3, 0, 0, 0, 0, 1);
    expect_refused_raw(&r, "bad tensor name");
}
END_TEST

START_TEST(bad_params_refused)
{
    raw_t r;
    struct {
        unsigned coll, dtype, op;
        int64_t count;
    } bad[] = {
        {1, 0, 0, 1},
        {255, 0, 0, 1},
        {0, KOLO_DTYPE_COUNT_, 0, 1},
        {0, 255, 0, 1},
        {0, 0, KOLO_OP_COUNT_, 1},
        {0, 0, 200, 1},
        {0, 0, 0, -1},
        {0, 0, 0, INT64_MIN},
    };

    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
        raw_request(&r, "t", 1, bad[k].coll, bad[k].dtype, bad[k].op, 0,
                    bad[k].count);
        expect_refused_raw(&r, "bad tensor parameters");
        raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
        raw_request(&r, "t", 1, bad[k].coll, bad[k].dtype, bad[k].op, 0,
                    bad[k].count);
        expect_refused_raw(&r, "bad tensor parameters");
    }
    /* Request flags are reserved: must be 0. */
    for (unsigned f = 1; f < 256; f *= 2) {
        raw_header(&r, KOLO__MSG_REQUESTS, 0, 1);
        raw_request(&r, "t", 1, 0, 0, 0, f, 1);
        expect_refused_raw(&r, "bad request flags");
    }
}
END_TEST

START_TEST(bad_status_and_text_refused)
{
    raw_t r;
    char big[KOLO__MSG_MAX_TEXT + 1];

    memset(big, 't', sizeof big);
    /* Status bytes 15..255 decode below KOLO_ERR_INTERNAL. */
    for (unsigned s = 15; s < 256; s++) {
        raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
        raw_request(&r, "t", 1, 0, 0, 0, s, 1);
        raw_u16(&r, 1);
        raw_u8(&r, 'x');
        expect_refused_raw(&r, "bad response status");
    }
    /* An error status without its text. */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 1, 1);
    expect_refused_raw(&r, "bad error text");
    /* A text of the maximum length is fine; one byte more is not. */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 1, 1);
    raw_u16(&r, KOLO__MSG_MAX_TEXT);
    raw_bytes(&r, big, KOLO__MSG_MAX_TEXT);
    {
        kolo__msg_t m;
        kolo__err_t err;
        ck_assert_int_eq(decode(r.buf, r.len, &m, &err), KOLO_OK);
        ck_assert_int_eq(m.u.responses[0].status, -1);
        ck_assert_uint_eq(strlen(m.u.responses[0].text), KOLO__MSG_MAX_TEXT);
        kolo__msg_free(&m);
    }
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 1, 1);
    raw_u16(&r, KOLO__MSG_MAX_TEXT + 1);
    raw_bytes(&r, big, KOLO__MSG_MAX_TEXT + 1);
    expect_refused_raw(&r, "bad error text");
    /* A text with a NUL inside. */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 1, 1);
    raw_u16(&r, 3);
    raw_bytes(&r, "a\0b", 3);
    expect_refused_raw(&r, "bad error text");
    /* A text length running past the end. */
    raw_header(&r, KOLO__MSG_RESPONSES, 0, 1);
    raw_request(&r, "t", 1, 0, 0, 0, 1, 1);
    raw_u16(&r, 10);
    raw_bytes(&r, "short", 5);
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
        kolo__params_t p = {0, (uint8_t)(rnd() % KOLO_DTYPE_COUNT_),
                            (uint8_t)(rnd() % KOLO_OP_COUNT_),
                            (int64_t)(((uint64_t)rnd() << 31) ^ rnd())};
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
        size_t body = rnd() % 64;
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
    tcase_add_test(tc, small_response_has_documented_bytes);
    tcase_add_loop_test(tc, roundtrip_requests, 0,
                        sizeof list_sizes / sizeof list_sizes[0]);
    tcase_add_loop_test(tc, roundtrip_responses, 0,
                        sizeof list_sizes / sizeof list_sizes[0]);
    tcase_add_test(tc, roundtrip_extreme_values);
    tcase_add_test(tc, error_response_without_text_roundtrips);
    tcase_add_test(tc, every_status_roundtrips);
    tcase_add_test(tc, ok_response_text_is_not_sent);
    tcase_add_test(tc, params_equal_and_coll_name);
    suite_add_tcase(s, tc);

    tc = tcase_create("refusals");
    tcase_add_test(tc, every_truncation_refused);
    tcase_add_test(tc, null_data_refused);
    tcase_add_test(tc, bad_header_refused);
    tcase_add_test(tc, bad_count_of_items_refused);
    tcase_add_test(tc, bad_names_refused);
    tcase_add_test(tc, bad_params_refused);
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
    SRunner *sr = srunner_create(message_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
