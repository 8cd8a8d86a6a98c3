/*
 * enqueue.c — the collectives of the public API (kolo.h): argument checks,
 * building queue entries, local gradient accumulation, barrier and join.
 *
 * Every call checks its arguments before touching the runtime, so a wrong
 * argument fails at once on the calling rank with a message naming the
 * tensor and the bad value; what only other ranks can judge (do the ranks
 * agree?) is checked during negotiation and fails the handle on every rank.
 * A group's entries are pushed in one step (kolo__queue_push_many), so the
 * background thread always sees a group whole.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "api.h"
#include "flight.h"
#include "passes.h"
#include "peers.h"
#include "pset.h"
#include "reduce.h"
#include "runtime.h"

void kolo_opts_init(kolo_opts_t *opts)
{
    if (opts != NULL) {
        memset(opts, 0, sizeof(*opts));
        opts->op = KOLO_OP_SUM;
        opts->prescale = opts->postscale = 1.0;
        opts->process_set = KOLO_GLOBAL_PROCESS_SET;
        opts->wire_dtype = -1;
        opts->backward_passes = 1;
    }
}

void kolo_allreduce_opts_init(kolo_allreduce_opts_t *opts) { kolo_opts_init(opts); }

/* The options a call was given, or (NULL) the defaults, in *defaults. */
static const kolo_opts_t *opts_or_defaults(const kolo_opts_t *opts,
                                           kolo_opts_t *defaults)
{
    if (opts != NULL)
        return opts;
    kolo_opts_init(defaults);
    return defaults;
}

/* ---- argument checks ------------------------------------------------------ */

static int check_name(const char *coll, const char *name, kolo__err_t *err)
{
    size_t len;
    if (name == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s: the tensor name is NULL", coll);
    len = strnlen(name, KOLO_MAX_NAME_LEN + 1);
    if (len == 0)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s: the tensor name is empty", coll);
    if (len > KOLO_MAX_NAME_LEN)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s: the tensor name '%.40s...' is longer than %d "
                             "bytes",
                             coll, name, KOLO_MAX_NAME_LEN);
    return KOLO_OK;
}

/* Checks the dtype, and the op unless op is NO_OP (a collective without a
 * reduction). */
#define NO_OP INT32_MIN
static int check_dtype_op(const char *coll, const char *name, kolo_dtype_t dtype,
                          int op, kolo__err_t *err)
{
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT_)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': unknown dtype %d", coll, name,
                             (int)dtype);
    if (op == NO_OP)
        return KOLO_OK;
    if (op < 0 || op >= KOLO_OP_COUNT_)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': unknown reduction op %d", coll,
                             name, op);
    if (!kolo__op_valid_for_dtype(dtype, (kolo_op_t)op))
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "%s of tensor '%s': %s does not apply to %s", coll,
                             name, kolo_op_name((kolo_op_t)op),
                             kolo_dtype_name(dtype));
    return KOLO_OK;
}

/* Checks a shape and returns its element count in *count. */
static int check_shape(const char *coll, const char *name, int ndim,
                       const int64_t *shape, kolo_dtype_t dtype, int64_t *count,
                       kolo__err_t *err)
{
    int64_t n = 1, limit = INT64_MAX / (int64_t)kolo_dtype_size(dtype);

    if (ndim < 0 || ndim > KOLO_MAX_DIMS)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': %d dimensions (at most %d)",
                             coll, name, ndim, KOLO_MAX_DIMS);
    if (ndim > 0 && shape == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': the shape is NULL", coll, name);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "%s of tensor '%s': dimension %d is %lld", coll,
                                 name, i, (long long)shape[i]);
        if (shape[i] > 0 && n > limit / shape[i])
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "%s of tensor '%s': the shape's size overflows",
                                 coll, name);
        n *= shape[i];
    }
    *count = n;
    return KOLO_OK;
}

static int check_count(const char *coll, const char *name, int64_t count,
                       kolo_dtype_t dtype, kolo__err_t *err)
{
    if (count < 0 || count > INT64_MAX / (int64_t)kolo_dtype_size(dtype))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': invalid element count %lld",
                             coll, name, (long long)count);
    return KOLO_OK;
}

static int check_buffer(const char *coll, const char *name, const void *buf,
                        int64_t count, const char *which, kolo__err_t *err)
{
    if (count > 0 && buf == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': the %s buffer is NULL", coll,
                             name, which);
    return KOLO_OK;
}

/* Fills the parts of the parameters that come from the options. */
static void params_from_opts(kolo__params_t *p, const kolo_opts_t *o)
{
    p->prescale = o->prescale;
    p->postscale = o->postscale;
    p->own = o->while_joined != 0;
}

/* Where the tensor lives (opts->device_type): a CUDA tensor is checked and
 * given its ready event by the device backend (ops.h). Under the API
 * lock. */
static int place_entry(kolo__pset_t *ps, kolo__entry_t *e, const kolo_opts_t *o,
                       kolo__err_t *err)
{
    const char *coll = kolo__coll_name(e->params.coll);
    const kolo__dev_ops_t *dev;
    kolo__dev_check_t t;
    char detail[KOLO__ERR_LEN];
    void *event = NULL;
    int rc;

    if (o->device_type == KOLO_DEVICE_HOST)
        return KOLO_OK;
    if (o->device_type != KOLO_DEVICE_CUDA)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': device_type %d is neither "
                             "KOLO_DEVICE_HOST (0) nor KOLO_DEVICE_CUDA (1)",
                             coll, e->name, o->device_type);
    dev = kolo__ops_device();
    if (dev == NULL)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "%s of tensor '%s' on CUDA device %d: this kolo "
                             "was built without GPU support (configure needs "
                             "CUDA, nvcc and NCCL)", coll, e->name, o->device);
    t = (kolo__dev_check_t){
        .coll = coll, .name = e->name, .dtype = e->params.dtype,
        .reduces = e->params.coll == KOLO__COLL_ALLREDUCE ||
                   e->params.coll == KOLO__COLL_REDUCESCATTER,
        .device = o->device, .input = e->input, .output = e->output,
        .stream = o->stream, .rank = ps->rt->rank, .set_id = ps->id,
        .set_device = ps->gpu_device};
    rc = dev->prepare(&t, &event, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return kolo__err_set(err, rc, "%s", detail);
    e->params.device_type = KOLO_DEVICE_CUDA;
    e->device = o->device;
    e->ready_event = event;
    e->ready_free = dev->event_free;
    e->stream = o->stream;
    ps->gpu_device = o->device;
    return KOLO_OK;
}

/* ---- pushing entries ------------------------------------------------------ */

/* Creates the handles and pushes the n entries (one group when n > 1).
 * On failure frees the entries and returns no handle. Under the API lock. */
static int push(kolo__pset_t *ps, kolo__entry_t **es, int n,
                kolo_handle_t *handles, kolo__err_t *err)
{
    int i, rc = KOLO_OK;

    for (i = 0; i < n && rc == KOLO_OK; i++) {
        es[i]->enqueued_us = kolo__now_us();
        rc = kolo__handles_new(ps->rt->handles, &es[i]->handle, err);
        /* Read now: once pushed, the background thread may complete and
         * free an entry before this function reads it again. */
        handles[i] = es[i]->handle;
    }
    for (i = 0; i < n && rc == KOLO_OK; i++)
        kolo__flight_enqueued(ps, es[i]);
    if (rc == KOLO_OK)
        rc = kolo__queue_push_many(&ps->queue, es, (size_t)n, err);
    if (rc != KOLO_OK) {
        /* Never handed out: complete and release them at once (and the
         * flight recorder forgets them, newest first). */
        for (i = n; i-- > 0;)
            kolo__flight_refused(ps, es[i]);
        for (i = 0; i < n; i++) {
            if (es[i]->handle > 0) {
                kolo__handles_complete(ps->rt->handles, es[i]->handle, rc,
                                       err->msg);
                kolo__handles_wait(ps->rt->handles, es[i]->handle, NULL);
            }
            handles[i] = 0;
            kolo__entry_free(es[i]);
        }
        return rc;
    }
    return KOLO_OK;
}

/* An enqueue this rank could not do for want of memory (or a thread):
 * the other ranks would wait for the tensor until the stall inspector or
 * a timeout ends the job. The set stops on this rank instead, which tells
 * the others at its next round, with the cause: "rank 1 has shut down,
 * which stops the job (it had failed: out of memory enqueuing tensor
 * 'x')"; this rank's later calls fail with it. */
static void stop_on_own_failure(kolo__pset_t *ps, int rc, const kolo__err_t *err)
{
    char prefix[32];

    if (ps == NULL || (rc != KOLO_ERR_NO_MEMORY && rc != KOLO_ERR_INTERNAL) ||
        atomic_exchange(&ps->own_stop, 1))
        return;
    snprintf(prefix, sizeof(prefix), "kolo%u", ps->rt->generation);
    kolo__peers_note_cause(rc, err->msg);
    kolo__peers_say_why(&ps->rt->cfg, prefix);
    kolo__pset_request_stop(ps, err);
}

static kolo__entry_t *new_entry(const char *name, kolo__err_t *err)
{
    kolo__entry_t *e = kolo__entry_new(name);
    if (e == NULL)
        kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory enqueuing tensor "
                      "'%s'", name);
    return e;
}

static void free_entries(kolo__entry_t **es, int n)
{
    for (int i = 0; i < n; i++)
        kolo__entry_free(es[i]);
}

/* Marks entries as one group, keyed by the first name. */
static void make_group(kolo__entry_t **es, int n)
{
    if (n <= 1)
        return;
    for (int i = 0; i < n; i++) {
        es[i]->params.group = (uint16_t)n;
        snprintf(es[i]->params.group_key, sizeof(es[i]->params.group_key), "%s",
                 es[0]->name);
    }
}

/* ---- allreduce ------------------------------------------------------------ */

static int allreduce_params(const char *name, int64_t count, kolo_dtype_t dtype,
                            const kolo_opts_t *o, kolo__params_t *p,
                            kolo__err_t *err)
{
    const char *coll = "allreduce";
    int64_t shape_count;

    KOLO__CHECK(check_name(coll, name, err));
    KOLO__CHECK(check_dtype_op(coll, name, dtype, (int)o->op, err));
    KOLO__CHECK(check_count(coll, name, count, dtype, err));
    kolo__params_init(p, KOLO__COLL_ALLREDUCE, dtype, o->op, count);
    params_from_opts(p, o);
    if (o->wire_dtype != -1) {
        if (dtype != KOLO_FLOAT32 ||
            (o->wire_dtype != KOLO_FLOAT16 && o->wire_dtype != KOLO_BFLOAT16 &&
             o->wire_dtype != KOLO_FLOAT32))
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "allreduce of tensor '%s': wire_dtype %s for a "
                                 "%s tensor; compression takes float32 tensors "
                                 "to float16 or bfloat16",
                                 name, kolo_dtype_name((kolo_dtype_t)o->wire_dtype),
                                 kolo_dtype_name(dtype));
        p->wire = (uint8_t)o->wire_dtype;
    }
    if (o->ndim != 0) {
        KOLO__CHECK(check_shape(coll, name, o->ndim, o->shape, dtype,
                                &shape_count, err));
        if (shape_count != count)
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "allreduce of tensor '%s': the shape holds "
                                 "%lld elements, the count is %lld",
                                 name, (long long)shape_count, (long long)count);
        p->ndim = (uint8_t)o->ndim;
        memcpy(p->shape, o->shape, (size_t)o->ndim * sizeof(int64_t));
    }
    return KOLO_OK;
}

/* backward_passes > 1: accumulate locally (passes.c); the last pass of a
 * group returns 1 with the accumulated sum in `output`, earlier passes
 * complete a handle at once and return 0. Under the API lock. */
static int accumulate(kolo__pset_t *ps, const char *name, const void *input,
                      void *output, int64_t count, kolo_dtype_t dtype,
                      const kolo_opts_t *opts, kolo_handle_t *handle,
                      kolo__err_t *err)
{
    int rc = kolo__passes_add(name, input, output, count, dtype,
                              opts->backward_passes, opts->average_passes, err);

    if (rc == 0) {
        /* An intermediate pass: done at once, nothing communicated. */
        KOLO__CHECK(kolo__handles_new(ps->rt->handles, handle, err));
        kolo__handles_complete(ps->rt->handles, *handle, KOLO_OK, NULL);
    }
    return rc;
}

int kolo_allreduce_async_opts(const char *name, const void *input,
                              void *output, int64_t count, kolo_dtype_t dtype,
                              const kolo_opts_t *opts, kolo_handle_t *handle)
{
    kolo_opts_t defaults;
    kolo__err_t err;
    kolo__params_t p;
    kolo__runtime_t *rt;
    kolo__pset_t *ps;
    kolo__entry_t *e;
    int rc;

    kolo__err_clear(&err);
    opts = opts_or_defaults(opts, &defaults);
    if (handle == NULL)
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "allreduce: the handle pointer is NULL");
    if ((rc = allreduce_params(name, count, dtype, opts, &p, &err)) != KOLO_OK ||
        (rc = check_buffer("allreduce", name, input, count, "input", &err)) != KOLO_OK ||
        (rc = check_buffer("allreduce", name, output, count, "output", &err)) != KOLO_OK)
        return kolo__api_fail(&err);
    if (opts->backward_passes < 1)
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "allreduce of tensor '%s': backward_passes must "
                               "be at least 1, not %d",
                               name, opts->backward_passes);
    if (opts->backward_passes > 1 && opts->device_type != KOLO_DEVICE_HOST)
        return kolo__api_failf(KOLO_ERR_UNSUPPORTED,
                               "allreduce of tensor '%s': backward_passes "
                               "accumulates in host memory; accumulate a CUDA "
                               "tensor on its device (kolo.torch does) and "
                               "allreduce every %d passes",
                               name, opts->backward_passes);

    if ((rt = kolo__api_enter("allreduce", &err)) == NULL)
        return kolo__api_fail(&err);
    if ((ps = kolo__api_set(rt, opts->process_set, "allreduce", &err)) == NULL) {
        rc = err.code;
        goto leave;
    }
    if (opts->backward_passes > 1) {
        rc = accumulate(ps, name, input, output, count, dtype, opts, handle, &err);
        if (rc <= 0)
            goto leave; /* an intermediate pass, or an error */
        input = output; /* the last pass allreduces the sum in place */
    }
    if ((e = new_entry(name, &err)) == NULL) {
        rc = err.code;
        goto leave;
    }
    e->input = input;
    e->output = output;
    e->params = p;
    if ((rc = place_entry(ps, e, opts, &err)) != KOLO_OK) {
        kolo__entry_free(e);
        goto leave;
    }
    rc = push(ps, &e, 1, handle, &err);
leave:
    stop_on_own_failure(ps, rc, &err);
    kolo__api_leave();
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

int kolo_allreduce_async(const char *name, const void *input, void *output,
                         int64_t count, kolo_dtype_t dtype, kolo_op_t op,
                         kolo_handle_t *handle)
{
    kolo_opts_t opts;
    kolo_opts_init(&opts);
    opts.op = op;
    return kolo_allreduce_async_opts(name, input, output, count, dtype, &opts,
                                     handle);
}

/* ---- the other collectives ------------------------------------------------ */

/* One collective described for the common path below. */
typedef struct request {
    const char *coll;
    kolo__params_t params;
    const void *input;
    void *output;
    int64_t rows;
    const int64_t *splits; /* alltoall, or NULL */
    int64_t into; /* reducescatter into a buffer: elements per rank */
} request_t;

/* A broadcast's root is a member of the set. */
static int check_root(const kolo__pset_t *ps, const request_t *q,
                      const char *name, kolo__err_t *err)
{
    if (q->params.root >= 0 && q->params.root < ps->size)
        return KOLO_OK;
    return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                         "broadcast of tensor '%s': root rank %d is outside "
                         "process set %d of %d ranks",
                         name, (int)q->params.root, ps->id, ps->size);
}

/* A reducescatter into a buffer: the set's size is known now, so the
 * tensor is one block of `into` elements per rank, as rows (so that the
 * ranks agree on the count per rank in negotiation). */
static int shape_into(const kolo__pset_t *ps, const request_t *q,
                      kolo__entry_t *e, kolo__err_t *err)
{
    if (q->into > INT64_MAX / ps->size /
                      (int64_t)kolo_dtype_size((kolo_dtype_t)q->params.dtype))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': %lld elements per rank "
                             "overflow for %d ranks", q->coll, e->name,
                             (long long)q->into, ps->size);
    e->params.ndim = 2;
    e->params.shape[0] = ps->size;
    e->params.shape[1] = q->into;
    e->params.count = q->into * ps->size;
    return KOLO_OK;
}

/* An alltoall's rows for each rank: the splits given, or the rows shared
 * out evenly; none negative, adding up to the tensor's rows. */
static int split_rows(const kolo__pset_t *ps, const request_t *q,
                      kolo__entry_t *e, kolo__err_t *err)
{
    int64_t total = 0;

    e->splits = kolo__malloc((size_t)ps->size * sizeof(int64_t));
    if (e->splits == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory "
                             "enqueuing tensor '%s'", e->name);
    for (int j = 0; j < ps->size; j++) {
        e->splits[j] = q->splits ? q->splits[j] : q->rows / ps->size;
        if (e->splits[j] < 0)
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "alltoall of tensor '%s': split %d is %lld",
                                 e->name, j, (long long)e->splits[j]);
        total += e->splits[j];
    }
    if (total != q->rows)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             q->splits ? "alltoall of tensor '%s': the "
                             "splits add up to %lld rows, the first "
                             "dimension is %lld"
                                       : "alltoall of tensor '%s': %lld "
                             "rows do not split evenly: the first "
                             "dimension %lld does not divide by the "
                             "number of ranks",
                             e->name, (long long)total, (long long)q->rows);
    return KOLO_OK;
}

/* The entry of request q; *out gets it as soon as it exists (the caller
 * frees it if this fails). Under the API lock. */
static int build_entry(kolo__pset_t *ps, const request_t *q, const char *name,
                       const kolo_opts_t *opts, kolo__entry_t **out,
                       kolo__err_t *err)
{
    kolo__entry_t *e;
    int rc = KOLO_OK;

    *out = NULL;
    if (q->params.coll == KOLO__COLL_BROADCAST)
        KOLO__CHECK(check_root(ps, q, name, err));
    if ((e = new_entry(name, err)) == NULL)
        return err->code;
    *out = e;
    e->params = q->params;
    e->input = q->input;
    e->output = q->output;
    e->rows = q->rows;
    if (q->into > 0)
        rc = shape_into(ps, q, e, err);
    if (rc == KOLO_OK)
        rc = place_entry(ps, e, opts, err);
    if (rc == KOLO_OK && q->params.coll == KOLO__COLL_ALLTOALL)
        rc = split_rows(ps, q, e, err);
    return rc;
}

/* The entries of n requests into ev; on failure frees those built. */
static int build_entries(kolo__pset_t *ps, int n, const char *const *names,
                         const request_t *reqs, const kolo_opts_t *opts,
                         kolo__entry_t **ev, kolo__err_t *err)
{
    int built = 0, rc = KOLO_OK;

    while (rc == KOLO_OK && built < n) {
        kolo__entry_t *e;
        rc = build_entry(ps, &reqs[built], names[built], opts, &e, err);
        if (e != NULL)
            ev[built++] = e;
    }
    if (rc != KOLO_OK)
        free_entries(ev, built);
    return rc;
}

/* Checks what every non-allreduce collective checks and enqueues n of them
 * (a group when n > 1). */
static int enqueue(int n, const char *const *names, request_t *reqs,
                   const kolo_opts_t *opts, kolo_handle_t *handles)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    kolo__pset_t *ps;
    kolo__entry_t *es[64], **ev = es;
    int rc;

    kolo__err_clear(&err);
    if (handles == NULL)
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "%s: the handle pointer is NULL", reqs[0].coll);
    if ((rt = kolo__api_enter(reqs[0].coll, &err)) == NULL)
        return kolo__api_fail(&err);
    if ((ps = kolo__api_set(rt, opts->process_set, reqs[0].coll, &err)) == NULL)
        rc = err.code;
    else if (n > 64 && (ev = kolo__malloc((size_t)n * sizeof(*ev))) == NULL)
        rc = kolo__err_set(&err, KOLO_ERR_NO_MEMORY, "%s: out of memory for a "
                           "group of %d", reqs[0].coll, n);
    else if ((rc = build_entries(ps, n, names, reqs, opts, ev, &err)) == KOLO_OK) {
        make_group(ev, n);
        rc = push(ps, ev, n, handles, &err);
    }
    stop_on_own_failure(ps, rc, &err);
    kolo__api_leave();
    if (ev != es)
        free(ev);
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

int kolo_broadcast_async(const char *name, void *buffer, int64_t count,
                         kolo_dtype_t dtype, int root, const kolo_opts_t *opts,
                         kolo_handle_t *handle)
{
    kolo_opts_t defaults;
    kolo__err_t err;
    request_t q;
    int64_t shape_count;

    kolo__err_clear(&err);
    opts = opts_or_defaults(opts, &defaults);
    if (check_name("broadcast", name, &err) || check_dtype_op("broadcast", name, dtype, NO_OP, &err) ||
        check_count("broadcast", name, count, dtype, &err) ||
        check_buffer("broadcast", name, buffer, count, "in-place", &err))
        return kolo__api_fail(&err);
    memset(&q, 0, sizeof(q));
    q.coll = "broadcast";
    kolo__params_init(&q.params, KOLO__COLL_BROADCAST, dtype, 0, count);
    q.params.root = root;
    if (opts->ndim != 0) {
        if (check_shape("broadcast", name, opts->ndim, opts->shape, dtype,
                        &shape_count, &err))
            return kolo__api_fail(&err);
        if (shape_count != count)
            return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                                   "broadcast of tensor '%s': the shape holds "
                                   "%lld elements, the count is %lld",
                                   name, (long long)shape_count,
                                   (long long)count);
        q.params.ndim = (uint8_t)opts->ndim;
        memcpy(q.params.shape, opts->shape, (size_t)opts->ndim * sizeof(int64_t));
    }
    q.input = q.output = buffer;
    return enqueue(1, &name, &q, opts, handle);
}

/* Builds the request of an allgather, alltoall or reducescatter. */
static int shaped_request(const char *coll, int kind, const char *name,
                          const void *input, int ndim, const int64_t *shape,
                          kolo_dtype_t dtype, const kolo_opts_t *opts,
                          request_t *q, kolo__err_t *err)
{
    int64_t count;
    int op = kind == KOLO__COLL_REDUCESCATTER ? (int)opts->op : NO_OP;

    memset(q, 0, sizeof(*q));
    q->coll = coll;
    KOLO__CHECK(check_name(coll, name, err));
    KOLO__CHECK(check_dtype_op(coll, name, dtype, op, err));
    if (kind == KOLO__COLL_REDUCESCATTER && op != KOLO_OP_SUM &&
        op != KOLO_OP_AVERAGE)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "reducescatter of tensor '%s': %s is not "
                             "supported (SUM or AVERAGE)",
                             name, kolo_op_name((kolo_op_t)op));
    if (ndim < 1)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': a tensor of 0 dimensions (a "
                             "scalar) has no first dimension to %s",
                             coll, name,
                             kind == KOLO__COLL_REDUCESCATTER ? "split" : "concatenate");
    KOLO__CHECK(check_shape(coll, name, ndim, shape, dtype, &count, err));
    KOLO__CHECK(check_buffer(coll, name, input, count, "input", err));
    kolo__params_init(&q->params, kind, dtype, op == NO_OP ? 0 : op, count);
    params_from_opts(&q->params, opts);
    q->params.ndim = (uint8_t)ndim;
    memcpy(q->params.shape, shape, (size_t)ndim * sizeof(int64_t));
    if (kind != KOLO__COLL_REDUCESCATTER) {
        /* Ranks agree on the rows' shape; the number of rows may differ. */
        int64_t row = 1;
        for (int i = 1; i < ndim; i++)
            row *= shape[i];
        q->params.count = row;
        q->params.shape[0] = 0;
        q->rows = shape[0];
    }
    q->input = input;
    return KOLO_OK;
}

/* One tensor's alltoall, or its allgather or reducescatter into a
 * caller's buffer, as the public call describes it (enqueue_single). */
typedef struct single {
    const char *coll;
    int kind;
    const char *name;
    const void *input;
    kolo_dtype_t dtype;
    int ndim;              /* alltoall: the tensor's shape, */
    const int64_t *shape;
    const int64_t *splits; /* and the rows for each rank, or NULL */
    void *output;          /* into a buffer: `count` elements per rank */
    int64_t count;
} single_t;

/* Checks what both collectives into a caller's buffer check. */
static int into_request(const single_t *t, const kolo_opts_t *opts,
                        request_t *q, kolo__err_t *err)
{
    int64_t shape[2] = {1, t->count};

    KOLO__CHECK(shaped_request(t->coll, t->kind, t->name, t->input, 2, shape,
                               t->dtype, opts, q, err));
    if (t->count < 1)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s of tensor '%s': %lld elements per rank (1 "
                             "or more)", t->coll, t->name, (long long)t->count);
    KOLO__CHECK(check_buffer(t->coll, t->name, t->output, t->count, "output",
                             err));
    q->output = t->output;
    if (t->kind == KOLO__COLL_ALLGATHER) {
        /* One row of `count` elements per rank, known to every rank: the
         * runtime need not exchange the rows, and negotiation checks that
         * the ranks agree on the count. */
        q->params.shape[0] = 1;
        q->rows = 1;
    } else {
        q->into = t->count;
    }
    return KOLO_OK;
}

/* Enqueues one tensor's request, built with the options (or, NULL, the
 * defaults). */
static int enqueue_single(const single_t *t, const kolo_opts_t *opts,
                          kolo_handle_t *handle)
{
    kolo_opts_t defaults;
    kolo__err_t err;
    request_t q;
    int rc;

    kolo__err_clear(&err);
    opts = opts_or_defaults(opts, &defaults);
    if (t->kind == KOLO__COLL_ALLTOALL)
        rc = shaped_request(t->coll, t->kind, t->name, t->input, t->ndim,
                            t->shape, t->dtype, opts, &q, &err);
    else
        rc = into_request(t, opts, &q, &err);
    if (rc != KOLO_OK)
        return kolo__api_fail(&err);
    q.splits = t->splits;
    return enqueue(1, &t->name, &q, opts, handle);
}

int kolo_allgather_async(const char *name, const void *input, int ndim,
                         const int64_t *shape, kolo_dtype_t dtype,
                         const kolo_opts_t *opts, kolo_handle_t *handle)
{
    const int64_t *shapes[1] = {shape};
    return kolo_grouped_allgather_async(1, &name, &input, &ndim, shapes, dtype,
                                        opts, handle);
}

int kolo_alltoall_async(const char *name, const void *input, int ndim,
                        const int64_t *shape, kolo_dtype_t dtype,
                        const int64_t *splits, const kolo_opts_t *opts,
                        kolo_handle_t *handle)
{
    single_t t = {.coll = "alltoall", .kind = KOLO__COLL_ALLTOALL,
                  .name = name, .input = input, .dtype = dtype, .ndim = ndim,
                  .shape = shape, .splits = splits};
    return enqueue_single(&t, opts, handle);
}

int kolo_reducescatter_async(const char *name, const void *input, int ndim,
                             const int64_t *shape, kolo_dtype_t dtype,
                             const kolo_opts_t *opts, kolo_handle_t *handle)
{
    const int64_t *shapes[1] = {shape};
    return kolo_grouped_reducescatter_async(1, &name, &input, &ndim, shapes,
                                            dtype, opts, handle);
}

int kolo_reducescatter_into_async(const char *name, const void *input,
                                  void *output, int64_t count,
                                  kolo_dtype_t dtype, const kolo_opts_t *opts,
                                  kolo_handle_t *handle)
{
    single_t t = {.coll = "reducescatter", .kind = KOLO__COLL_REDUCESCATTER,
                  .name = name, .input = input, .dtype = dtype,
                  .output = output, .count = count};
    return enqueue_single(&t, opts, handle);
}

int kolo_allgather_into_async(const char *name, const void *input,
                              void *output, int64_t count, kolo_dtype_t dtype,
                              const kolo_opts_t *opts, kolo_handle_t *handle)
{
    single_t t = {.coll = "allgather", .kind = KOLO__COLL_ALLGATHER,
                  .name = name, .input = input, .dtype = dtype,
                  .output = output, .count = count};
    return enqueue_single(&t, opts, handle);
}

/* ---- grouped collectives -------------------------------------------------- */

static int check_group(const char *coll, int n, const char *const *names,
                       const void *a, const void *b, kolo__err_t *err)
{
    if (n < 1 || n > UINT16_MAX || names == NULL || a == NULL || b == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "grouped %s: needs 1..%d tensors and non-NULL "
                             "arrays, got %d",
                             coll, UINT16_MAX, n);
    for (int i = 0; i < n; i++) {
        KOLO__CHECK(check_name(coll, names[i], err));
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                     "grouped %s: tensor '%s' is in the group "
                                     "twice",
                                     coll, names[i]);
    }
    return KOLO_OK;
}

/* A group's last step: its requests enqueued if all were made (rc), else
 * the error (err) returned; reqs freed either way. */
static int enqueue_group(int rc, int n, const char *const *names,
                         request_t *reqs, const kolo_opts_t *opts,
                         kolo_handle_t *handles, kolo__err_t *err)
{
    rc = rc == KOLO_OK ? enqueue(n, names, reqs, opts, handles)
                       : kolo__api_fail(err);
    free(reqs);
    return rc;
}

static int grouped_shaped(const char *coll, int kind, int n,
                          const char *const *names, const void *const *inputs,
                          const int *ndims, const int64_t *const *shapes,
                          kolo_dtype_t dtype, const kolo_opts_t *opts,
                          kolo_handle_t *handles)
{
    kolo_opts_t defaults;
    kolo__err_t err;
    request_t *reqs;
    int rc = KOLO_OK;

    kolo__err_clear(&err);
    opts = opts_or_defaults(opts, &defaults);
    if (check_group(coll, n, names, inputs, ndims, &err) != KOLO_OK ||
        (shapes == NULL &&
         kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT, "grouped %s: shapes is NULL", coll)))
        return kolo__api_fail(&err);
    reqs = kolo__calloc((size_t)n, sizeof(*reqs));
    if (reqs == NULL)
        return kolo__api_failf(KOLO_ERR_NO_MEMORY, "%s: out of memory", coll);
    for (int i = 0; i < n && rc == KOLO_OK; i++)
        rc = shaped_request(coll, kind, names[i], inputs[i], ndims[i], shapes[i],
                            dtype, opts, &reqs[i], &err);
    return enqueue_group(rc, n, names, reqs, opts, handles, &err);
}

int kolo_grouped_allgather_async(int n, const char *const *names,
                                 const void *const *inputs, const int *ndims,
                                 const int64_t *const *shapes,
                                 kolo_dtype_t dtype, const kolo_opts_t *opts,
                                 kolo_handle_t *handles)
{
    return grouped_shaped("allgather", KOLO__COLL_ALLGATHER, n, names, inputs,
                          ndims, shapes, dtype, opts, handles);
}

int kolo_grouped_reducescatter_async(int n, const char *const *names,
                                     const void *const *inputs, const int *ndims,
                                     const int64_t *const *shapes,
                                     kolo_dtype_t dtype,
                                     const kolo_opts_t *opts,
                                     kolo_handle_t *handles)
{
    return grouped_shaped("reducescatter", KOLO__COLL_REDUCESCATTER, n, names,
                          inputs, ndims, shapes, dtype, opts, handles);
}

int kolo_grouped_allreduce_async(int n, const char *const *names,
                                 const void *const *inputs, void *const *outputs,
                                 const int64_t *counts, kolo_dtype_t dtype,
                                 const kolo_opts_t *opts, kolo_handle_t *handles)
{
    kolo_opts_t defaults, o;
    kolo__err_t err;
    request_t *reqs;
    int rc = KOLO_OK;

    kolo__err_clear(&err);
    opts = opts_or_defaults(opts, &defaults);
    if (check_group("allreduce", n, names, inputs, outputs, &err) != KOLO_OK ||
        (counts == NULL &&
         kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT, "grouped allreduce: counts is NULL")))
        return kolo__api_fail(&err);
    if (opts->backward_passes > 1)
        return kolo__api_failf(KOLO_ERR_UNSUPPORTED,
                               "grouped allreduce of '%s': backward_passes is "
                               "for single tensors; accumulate each member",
                               names[0]);
    o = *opts;
    o.ndim = 0; /* one shape cannot describe several tensors */
    reqs = kolo__calloc((size_t)n, sizeof(*reqs));
    if (reqs == NULL)
        return kolo__api_failf(KOLO_ERR_NO_MEMORY, "allreduce: out of memory");
    for (int i = 0; i < n && rc == KOLO_OK; i++) {
        reqs[i].coll = "allreduce";
        rc = allreduce_params(names[i], counts[i], dtype, &o, &reqs[i].params, &err);
        if (rc == KOLO_OK)
            rc = check_buffer("allreduce", names[i], inputs[i], counts[i], "input", &err);
        if (rc == KOLO_OK)
            rc = check_buffer("allreduce", names[i], outputs[i], counts[i], "output", &err);
        reqs[i].input = inputs[i];
        reqs[i].output = outputs[i];
    }
    return enqueue_group(rc, n, names, reqs, opts, handles, &err);
}

/* ---- barrier and join ----------------------------------------------------- */

int kolo_barrier(int process_set)
{
    const char *name = "kolo.barrier";
    kolo_opts_t opts;
    request_t q;
    kolo_handle_t h;
    int rc;

    kolo_opts_init(&opts);
    opts.process_set = process_set;
    memset(&q, 0, sizeof(q));
    q.coll = "barrier";
    kolo__params_init(&q.params, KOLO__COLL_BARRIER, KOLO_UINT8, 0, 0);
    rc = enqueue(1, &name, &q, &opts, &h);
    return rc == KOLO_OK ? kolo_wait(h) : rc;
}

int kolo_join(int *last_rank)
{
    const char *name = "kolo.join";
    kolo_opts_t opts;
    kolo_result_t res;
    request_t q;
    kolo_handle_t h;
    int rc;

    kolo_opts_init(&opts);
    memset(&q, 0, sizeof(q));
    q.coll = "join";
    kolo__params_init(&q.params, KOLO__COLL_JOIN, KOLO_UINT8, 0, 0);
    rc = enqueue(1, &name, &q, &opts, &h);
    if (rc != KOLO_OK)
        return rc;
    rc = kolo_wait_result(h, &res);
    if (rc == KOLO_OK && last_rank != NULL)
        *last_rank = res.nsplits > 0 ? (int)res.splits[0] : -1;
    kolo_result_free(&res);
    return rc;
}
