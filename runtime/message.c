/*
 * message.c — encode and decode negotiation messages (format in
 * message.h). The decoder reads through a cursor that knows how many bytes
 * are left; every read checks first, so no input can make it read out of
 * bounds, and counts are checked against the bytes that could hold them
 * before anything is allocated.
 */
#include "alloc.h"
#include "message.h"

#include <stdlib.h>
#include <string.h>

/* Smallest encoded request / response: name_len + 1 name byte + the fixed
 * part of the parameters. Used to bound `n` before allocating. */
#define MIN_ITEM_BYTES (2 + 1 + 4 + 8 + 1 + 1 + 2 + 4 + 8 + 8)
#define HEADER_BYTES (4 + 2 + 2 + 4 + 4)

const char *kolo__coll_name(int coll)
{
    switch (coll) {
    case KOLO__COLL_ALLREDUCE: return "allreduce";
    case KOLO__COLL_BROADCAST: return "broadcast";
    case KOLO__COLL_ALLGATHER: return "allgather";
    case KOLO__COLL_ALLTOALL: return "alltoall";
    case KOLO__COLL_REDUCESCATTER: return "reducescatter";
    case KOLO__COLL_BARRIER: return "barrier";
    case KOLO__COLL_JOIN: return "join";
    default: return "unknown collective";
    }
}

static const char *const phase_names[KOLO__COLL_COUNT_][2] = {
    [KOLO__COLL_ALLREDUCE] = {"ALLREDUCE", "NEGOTIATE_ALLREDUCE"},
    [KOLO__COLL_BROADCAST] = {"BROADCAST", "NEGOTIATE_BROADCAST"},
    [KOLO__COLL_ALLGATHER] = {"ALLGATHER", "NEGOTIATE_ALLGATHER"},
    [KOLO__COLL_ALLTOALL] = {"ALLTOALL", "NEGOTIATE_ALLTOALL"},
    [KOLO__COLL_REDUCESCATTER] = {"REDUCESCATTER", "NEGOTIATE_REDUCESCATTER"},
    [KOLO__COLL_BARRIER] = {"BARRIER", "NEGOTIATE_BARRIER"},
    [KOLO__COLL_JOIN] = {"JOIN", "NEGOTIATE_JOIN"},
};

const char *kolo__coll_phase(int coll)
{
    return coll >= 0 && coll < KOLO__COLL_COUNT_ ? phase_names[coll][0] : "UNKNOWN";
}

const char *kolo__coll_negotiate_phase(int coll)
{
    return coll >= 0 && coll < KOLO__COLL_COUNT_ ? phase_names[coll][1]
                                                 : "NEGOTIATE_UNKNOWN";
}

void kolo__params_init(kolo__params_t *p, int coll, int dtype, int op,
                       int64_t count)
{
    memset(p, 0, sizeof(*p));
    p->coll = (uint8_t)coll;
    p->dtype = (uint8_t)dtype;
    p->op = (uint8_t)op;
    p->count = count;
    p->wire = (uint8_t)dtype;
    p->prescale = p->postscale = 1.0;
}

int kolo__params_equal(const kolo__params_t *a, const kolo__params_t *b)
{
    if (a->coll != b->coll || a->dtype != b->dtype || a->op != b->op ||
        a->count != b->count || a->wire != b->wire || a->ndim != b->ndim ||
        a->device_type != b->device_type || a->own != b->own ||
        a->group != b->group || a->root != b->root ||
        /* The scales are compared bit for bit: the same code computes
         * them on every rank. */
        memcmp(&a->prescale, &b->prescale, sizeof(double)) != 0 ||
        memcmp(&a->postscale, &b->postscale, sizeof(double)) != 0 ||
        strcmp(a->group_key, b->group_key) != 0)
        return 0;
    for (int i = 0; i < a->ndim && i < KOLO_MAX_DIMS; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

void kolo__bytes_free(kolo__bytes_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct writer {
    kolo__bytes_t *out;
    int failed;
} writer_t;

static void put(writer_t *w, const void *p, size_t n)
{
    kolo__bytes_t *b = w->out;
    if (w->failed || n == 0)
        return;
    if (b->len + n > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        uint8_t *nd;
        while (ncap < b->len + n)
            ncap *= 2;
        nd = kolo__realloc(b->data, ncap);
        if (nd == NULL) {
            w->failed = 1;
            return;
        }
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

/* The wire is little-endian; so is every machine we build for, which the
 * static assertion below makes explicit instead of swapping bytes. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "kolo's wire format assumes a little-endian host");

static void put_u8(writer_t *w, uint8_t v) { put(w, &v, 1); }
static void put_u16(writer_t *w, uint16_t v) { put(w, &v, 2); }
static void put_u32(writer_t *w, uint32_t v) { put(w, &v, 4); }
static void put_i64(writer_t *w, int64_t v) { put(w, &v, 8); }

static void put_str(writer_t *w, const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n > max)
        n = max;
    put_u16(w, (uint16_t)n);
    put(w, s, n);
}

static void put_params(writer_t *w, const kolo__params_t *p, uint8_t last)
{
    put_u8(w, p->coll);
    put_u8(w, p->dtype);
    put_u8(w, p->op);
    put_u8(w, last);
    put_i64(w, p->count);
    put_u8(w, p->wire);
    put_u8(w, p->ndim);
    /* own rides in the device byte's top bit */
    put_u8(w, (uint8_t)(p->device_type | (p->own ? 0x80 : 0)));
    put_u16(w, p->group);
    put_u32(w, (uint32_t)p->root);
    put(w, &p->prescale, 8);
    put(w, &p->postscale, 8);
    for (int i = 0; i < p->ndim && i < KOLO_MAX_DIMS; i++)
        put_i64(w, p->shape[i]);
    if (p->group > 1)
        put_str(w, p->group_key, sizeof(p->group_key) - 1);
}

int kolo__msg_encode(const kolo__msg_t *msg, kolo__bytes_t *out,
                     kolo__err_t *err)
{
    writer_t w = {out, 0};

    out->len = 0;
    put_u32(&w, KOLO__MSG_MAGIC);
    put_u16(&w, KOLO__MSG_VERSION);
    put_u16(&w, msg->kind);
    put_u32(&w, (uint32_t)msg->rank);
    put_u32(&w, msg->n);
    for (uint32_t i = 0; i < msg->n; i++) {
        if (msg->kind == KOLO__MSG_REQUESTS) {
            const kolo__request_t *r = &msg->u.requests[i];
            put_str(&w, r->name, KOLO_MAX_NAME_LEN);
            put_params(&w, &r->params, 0);
            put_i64(&w, r->age_us);
            put_i64(&w, (int64_t)r->seq);
        } else {
            const kolo__response_t *r = &msg->u.responses[i];
            put_str(&w, r->name, KOLO_MAX_NAME_LEN);
            /* The status travels as its negated value in one byte. */
            put_params(&w, &r->params, (uint8_t)(-r->status));
            if (r->status != KOLO_OK)
                put_str(&w, r->text, KOLO__MSG_MAX_TEXT);
        }
    }
    if (w.failed)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory encoding a negotiation message "
                             "of %u tensors",
                             msg->n);
    return KOLO_OK;
}

/* ---- reading ----------------------------------------------------------- */

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader_t;

static int get(reader_t *r, void *dst, size_t n)
{
    if (r->left < n)
        return -1;
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

/* What a reading step returns when it fails (0 when it did not). */
#define MALFORMED (-1)
#define NO_MEMORY (-2)

/* Reads a u16-prefixed string of at most `max` bytes into a new
 * NUL-terminated copy. */
static int get_str(reader_t *r, size_t max, size_t min, char **out)
{
    uint16_t n;
    char *s;

    if (get(r, &n, 2) != 0 || n > max || n < min || r->left < n)
        return MALFORMED;
    if (memchr(r->p, '\0', n) != NULL)
        return MALFORMED;
    s = kolo__malloc((size_t)n + 1);
    if (s == NULL)
        return NO_MEMORY;
    memcpy(s, r->p, n);
    s[n] = '\0';
    r->p += n;
    r->left -= n;
    *out = s;
    return 0;
}

static int get_params(reader_t *r, kolo__params_t *p, uint8_t *last)
{
    uint16_t klen;

    memset(p, 0, sizeof(*p));
    if (get(r, &p->coll, 1) || get(r, &p->dtype, 1) || get(r, &p->op, 1) ||
        get(r, last, 1) || get(r, &p->count, 8) || get(r, &p->wire, 1) ||
        get(r, &p->ndim, 1) || get(r, &p->device_type, 1) ||
        get(r, &p->group, 2) || get(r, &p->root, 4) ||
        get(r, &p->prescale, 8) || get(r, &p->postscale, 8))
        return -1;
    if (p->coll >= KOLO__COLL_COUNT_ || p->dtype >= KOLO_DTYPE_COUNT_ ||
        p->op >= KOLO_OP_COUNT_ || p->count < 0 ||
        p->wire >= KOLO_DTYPE_COUNT_ || p->ndim > KOLO_MAX_DIMS ||
        (p->device_type & 0x7f) > KOLO_DEVICE_CUDA)
        return -1;
    p->own = p->device_type >> 7;
    p->device_type &= 0x7f;
    for (int i = 0; i < p->ndim; i++)
        if (get(r, &p->shape[i], 8) || p->shape[i] < 0)
            return -1;
    if (p->group > 1) {
        if (get(r, &klen, 2) || klen >= sizeof(p->group_key) || r->left < klen ||
            memchr(r->p, '\0', klen) != NULL)
            return -1;
        memcpy(p->group_key, r->p, klen);
        p->group_key[klen] = '\0';
        r->p += klen;
        r->left -= klen;
    }
    return 0;
}

void kolo__msg_free(kolo__msg_t *msg)
{
    if (msg->kind == KOLO__MSG_REQUESTS && msg->u.requests != NULL) {
        for (uint32_t i = 0; i < msg->n; i++)
            free(msg->u.requests[i].name);
        free(msg->u.requests);
    } else if (msg->kind == KOLO__MSG_RESPONSES && msg->u.responses != NULL) {
        for (uint32_t i = 0; i < msg->n; i++) {
            free(msg->u.responses[i].name);
            free(msg->u.responses[i].text);
        }
        free(msg->u.responses);
    }
    memset(msg, 0, sizeof(*msg));
}

/* A message being decoded: the cursor, and what it reads now (for the
 * message that names the first part that was wrong). */
typedef struct decoder {
    reader_t r;
    const char *what;
} decoder_t;

/* The header, checked; msg gets its kind and rank, *n its tensor count. */
static int read_header(decoder_t *d, kolo__msg_t *msg, uint32_t *n)
{
    uint32_t magic, rank;
    uint16_t version, kind;

    if (get(&d->r, &magic, 4) || get(&d->r, &version, 2) ||
        get(&d->r, &kind, 2) || get(&d->r, &rank, 4) || get(&d->r, n, 4))
        return MALFORMED;
    d->what = "magic or version";
    if (magic != KOLO__MSG_MAGIC || version != KOLO__MSG_VERSION)
        return MALFORMED;
    d->what = "kind";
    if (kind != KOLO__MSG_REQUESTS && kind != KOLO__MSG_RESPONSES)
        return MALFORMED;
    d->what = "tensor count";
    if (*n > d->r.left / MIN_ITEM_BYTES)
        return MALFORMED;
    msg->kind = kind;
    msg->rank = (int32_t)rank;
    return 0;
}

/* Room for n requests or responses (at least one). */
static int new_items(kolo__msg_t *msg, uint32_t n)
{
    if (msg->kind == KOLO__MSG_REQUESTS) {
        msg->u.requests = kolo__calloc(n ? n : 1, sizeof(kolo__request_t));
        return msg->u.requests != NULL ? 0 : NO_MEMORY;
    }
    msg->u.responses = kolo__calloc(n ? n : 1, sizeof(kolo__response_t));
    return msg->u.responses != NULL ? 0 : NO_MEMORY;
}

/* A response's status, and its error text when it failed. */
static int read_status(decoder_t *d, kolo__response_t *resp, uint8_t last)
{
    resp->status = -(int32_t)last;
    d->what = "response status";
    if (resp->status < KOLO_ERR_INTERNAL)
        return MALFORMED;
    if (resp->status == KOLO_OK)
        return 0;
    d->what = "error text";
    return get_str(&d->r, KOLO__MSG_MAX_TEXT, 0, &resp->text);
}

/* Item i: its name, its parameters and (a response) its status. */
static int read_item(decoder_t *d, kolo__msg_t *msg, uint32_t i)
{
    int requests = msg->kind == KOLO__MSG_REQUESTS;
    char **name = requests ? &msg->u.requests[i].name
                           : &msg->u.responses[i].name;
    kolo__params_t *p = requests ? &msg->u.requests[i].params
                                 : &msg->u.responses[i].params;
    uint8_t last;
    int rc;

    d->what = "tensor name";
    rc = get_str(&d->r, KOLO_MAX_NAME_LEN, 1, name);
    if (rc == NO_MEMORY)
        return rc;
    msg->n = i + 1; /* so that kolo__msg_free frees what was read */
    if (rc != 0)
        return rc;
    d->what = "tensor parameters";
    if (get_params(&d->r, p, &last) != 0)
        return MALFORMED;
    if (!requests)
        return read_status(d, &msg->u.responses[i], last);
    d->what = "request flags";
    if (last != 0)
        return MALFORMED;
    d->what = "request age and sequence";
    if (get(&d->r, &msg->u.requests[i].age_us, 8) != 0 ||
        get(&d->r, &msg->u.requests[i].seq, 8) != 0)
        return MALFORMED;
    return 0;
}

int kolo__msg_decode(const uint8_t *data, size_t len, int from_rank,
                     kolo__msg_t *msg, kolo__err_t *err)
{
    decoder_t d = {{data, len}, "header"};
    uint32_t n = 0;
    int rc;

    memset(msg, 0, sizeof(*msg));
    if (data == NULL && len > 0)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "negotiation message from rank %d is NULL",
                             from_rank);
    rc = read_header(&d, msg, &n);
    if (rc == 0)
        rc = new_items(msg, n);
    for (uint32_t i = 0; i < n && rc == 0; i++)
        rc = read_item(&d, msg, i);
    if (rc == 0) {
        msg->n = n;
        d.what = "trailing bytes";
        if (d.r.left == 0)
            return KOLO_OK;
        rc = MALFORMED;
    }
    if (rc == NO_MEMORY)
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory decoding a negotiation message of "
                           "%zu bytes from rank %d",
                           len, from_rank);
    else
        rc = kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                           "malformed negotiation message from rank %d: bad "
                           "%s at byte %zu of %zu",
                           from_rank, d.what, len - d.r.left, len);
    kolo__msg_free(msg);
    return rc;
}
