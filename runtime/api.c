/*
 * api.c — the public C API (kolo.h): argument checks, init and shutdown,
 * enqueue, handles, local gradient accumulation, and error strings.
 *
 * Locks: g_mu guards the runtime pointer and the accumulators; init and
 * shutdown hold it throughout, so an enqueue racing a shutdown either
 * completes before it or sees "not initialized". Waiting on a handle takes
 * only the handle table's lock, which the background thread needs to
 * complete handles, so a waiter never blocks init or shutdown.
 */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"
#include "runtime.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static kolo__runtime_t *g_rt;
static kolo__map_t g_accumulators; /* name -> accumulator_t */
static atomic_int g_rank = -1, g_size = -1, g_local_rank = -1,
                  g_local_size = -1, g_cross_rank = -1, g_cross_size = -1;

static kolo__handles_t g_handles;
static pthread_once_t g_handles_once = PTHREAD_ONCE_INIT;
static int g_handles_ok;

static _Thread_local char t_last_error[KOLO__ERR_LEN];

static void handles_init_once(void)
{
    g_handles_ok = kolo__handles_init(&g_handles) == 0;
}

static kolo__handles_t *handles(void)
{
    pthread_once(&g_handles_once, handles_init_once);
    return g_handles_ok ? &g_handles : NULL;
}

/* Every public function that fails returns through here, so that
 * kolo_last_error() always describes the latest failure. */
static int fail(const kolo__err_t *err)
{
    strcpy(t_last_error, err->msg[0] ? err->msg : kolo_strerror(err->code));
    return err->code;
}

static int failf(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int failf(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof(t_last_error), fmt, ap);
    va_end(ap);
    return code;
}

const char *kolo_last_error(void) { return t_last_error; }

/* ---- life cycle ----------------------------------------------------------- */

static const char *env_get(const char *name) { return getenv(name); }

static const kolo__ops_t *choose_ops(int size)
{
    if (size == 1)
        return &kolo__ops_local;
#ifdef KOLO_HAVE_GLOO
    return &kolo__ops_gloo;
#else
    return NULL;
#endif
}

int kolo_init(void)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    kolo__ops_config_t ocfg;
    char detail[KOLO__ERR_LEN];
    int rc;

    kolo__err_clear(&err);
    if (handles() == NULL)
        return failf(KOLO_ERR_INTERNAL, "cannot create the handle table's lock");
    pthread_mutex_lock(&g_mu);
    if (g_rt != NULL) {
        pthread_mutex_unlock(&g_mu);
        return failf(KOLO_ERR_ALREADY_INITIALIZED,
                     "kolo_init called twice without kolo_shutdown");
    }
    rt = calloc(1, sizeof(*rt));
    if (rt == NULL) {
        rc = kolo__err_set(&err, KOLO_ERR_NO_MEMORY, "out of memory in kolo_init");
        goto unlock;
    }
    KOLO__CHECK_GOTO(kolo__config_load(&rt->cfg, env_get, &err), rc, free_rt);
    kolo__log_threshold = (int)rt->cfg.log_level;
    rt->rank = (int)rt->cfg.rank;
    rt->size = (int)rt->cfg.size;
    rt->handles = &g_handles;
    kolo__log_set_rank(rt->rank);

    rt->ops = choose_ops(rt->size);
    if (rt->ops == NULL) {
        rc = kolo__err_set(&err, KOLO_ERR_UNSUPPORTED,
                           "KOLO_SIZE=%d needs a communication backend, and "
                           "this kolo was built without Gloo",
                           rt->size);
        goto free_rt;
    }
    if (kolo__queue_init(&rt->queue) != 0) {
        rc = kolo__err_set(&err, KOLO_ERR_INTERNAL,
                           "cannot create the tensor queue's lock");
        goto free_rt;
    }
    ocfg = (kolo__ops_config_t){rt->rank, rt->size, rt->cfg.rendezvous,
                                rt->cfg.hostname, rt->cfg.timeout_s,
                                rt->cfg.start_timeout_s, kolo__wake_from_peer,
                                rt};
    detail[0] = '\0';
    rc = rt->ops->init(&ocfg, &rt->ops_ctx, detail, sizeof(detail));
    if (rc != KOLO_OK) {
        kolo__err_set(&err, rc, "rank %d of %d could not join the job (%s "
                      "backend, rendezvous %s): %s",
                      rt->rank, rt->size, rt->ops->name,
                      rt->cfg.rendezvous[0] ? rt->cfg.rendezvous : "none",
                      detail);
        goto destroy_queue;
    }
    KOLO__CHECK_GOTO(kolo__runtime_start(rt, &err), rc, finalize_ops);

    kolo__debug("initialised: rank %d of %d, %s backend, fusion threshold "
                "%lld bytes, cycle time %.3g ms",
                rt->rank, rt->size, rt->ops->name,
                (long long)rt->cfg.fusion_threshold, rt->cfg.cycle_time_ms);
    g_rank = rt->rank;
    g_size = rt->size;
    g_local_rank = (int)rt->cfg.local_rank;
    g_local_size = (int)rt->cfg.local_size;
    g_cross_rank = (int)rt->cfg.cross_rank;
    g_cross_size = (int)rt->cfg.cross_size;
    g_rt = rt;
    pthread_mutex_unlock(&g_mu);
    return KOLO_OK;

finalize_ops:
    rt->ops->finalize(rt->ops_ctx);
destroy_queue:
    kolo__queue_destroy(&rt->queue);
free_rt:
    free(rt);
unlock:
    pthread_mutex_unlock(&g_mu);
    kolo__log(KOLO__LOG_ERROR, "kolo_init failed: %s", err.msg);
    return fail(&err);
}

/* One named accumulator (backward_passes > 1). */
typedef struct accumulator {
    void *sum;
    int64_t count;
    kolo_dtype_t dtype;
    int passes, done;
} accumulator_t;

static void accumulators_free(void)
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

int kolo_shutdown(void)
{
    kolo__runtime_t *rt;

    pthread_mutex_lock(&g_mu);
    rt = g_rt;
    if (rt == NULL) {
        pthread_mutex_unlock(&g_mu);
        return failf(KOLO_ERR_NOT_INITIALIZED,
                     "kolo_shutdown called, but kolo is not initialized");
    }
    /* The background thread announces the shutdown to the other ranks in
     * its next round, fails what is pending and returns. */
    kolo__queue_request_shutdown(&rt->queue);
    pthread_join(rt->thread, NULL);
    rt->ops->finalize(rt->ops_ctx);
    kolo__runtime_free(rt);
    kolo__queue_destroy(&rt->queue);
    free(rt);
    accumulators_free();
    g_rt = NULL;
    g_rank = g_size = g_local_rank = g_local_size = -1;
    g_cross_rank = g_cross_size = -1;
    pthread_mutex_unlock(&g_mu);
    return KOLO_OK;
}

int kolo_is_initialized(void)
{
    return atomic_load(&g_size) > 0;
}

int kolo_rank(void) { return g_rank; }
int kolo_size(void) { return g_size; }
int kolo_local_rank(void) { return g_local_rank; }
int kolo_local_size(void) { return g_local_size; }
int kolo_cross_rank(void) { return g_cross_rank; }
int kolo_cross_size(void) { return g_cross_size; }

/* ---- enqueue -------------------------------------------------------------- */

void kolo_allreduce_opts_init(kolo_allreduce_opts_t *opts)
{
    if (opts != NULL) {
        memset(opts, 0, sizeof(*opts));
        opts->op = KOLO_OP_SUM;
        opts->backward_passes = 1;
        opts->average_passes = 0;
    }
}

static int check_args(const char *name, const void *input, void *output,
                      int64_t count, kolo_dtype_t dtype, kolo_op_t op,
                      const kolo_handle_t *handle, kolo__err_t *err)
{
    size_t len;

    if (handle == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce: the handle pointer is NULL");
    if (name == NULL)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce: the tensor name is NULL");
    len = strnlen(name, KOLO_MAX_NAME_LEN + 1);
    if (len == 0)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce: the tensor name is empty");
    if (len > KOLO_MAX_NAME_LEN)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce: the tensor name '%.40s...' is longer "
                             "than %d bytes",
                             name, KOLO_MAX_NAME_LEN);
    if ((unsigned)dtype >= KOLO_DTYPE_COUNT_)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce of tensor '%s': unknown dtype %d",
                             name, (int)dtype);
    if ((unsigned)op >= KOLO_OP_COUNT_)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce of tensor '%s': unknown reduction op %d",
                             name, (int)op);
    if (!kolo__op_valid_for_dtype(dtype, op))
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "allreduce of tensor '%s': %s does not apply to %s",
                             name, kolo_op_name(op), kolo_dtype_name(dtype));
    if (count < 0 || count > INT64_MAX / (int64_t)kolo_dtype_size(dtype))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce of tensor '%s': invalid element count "
                             "%lld",
                             name, (long long)count);
    if (count > 0 && (input == NULL || output == NULL))
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "allreduce of tensor '%s': the %s buffer is NULL",
                             name, input == NULL ? "input" : "output");
    return KOLO_OK;
}

/* Creates a handle and queues the allreduce. Called with g_mu held. */
static int enqueue(kolo__runtime_t *rt, const char *name, const void *input,
                   void *output, int64_t count, kolo_dtype_t dtype,
                   kolo_op_t op, kolo_handle_t *handle, kolo__err_t *err)
{
    kolo__entry_t *e = kolo__entry_new(name);
    kolo_handle_t id;
    int rc;

    if (e == NULL)
        return kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                             "out of memory enqueuing tensor '%s'", name);
    rc = kolo__handles_new(rt->handles, &id, err);
    if (rc != KOLO_OK) {
        kolo__entry_free(e);
        return rc;
    }
    e->handle = id;
    e->input = input;
    e->output = output;
    e->params = (kolo__params_t){KOLO__COLL_ALLREDUCE, (uint8_t)dtype,
                                 (uint8_t)op, count};
    e->enqueued_us = kolo__now_us();
    rc = kolo__queue_push(&rt->queue, e, err);
    if (rc != KOLO_OK) {
        /* Never handed out: complete and release it at once. */
        kolo__handles_complete(rt->handles, id, rc, err->msg);
        kolo__handles_wait(rt->handles, id, NULL);
        kolo__entry_free(e);
        return rc;
    }
    *handle = id;
    return KOLO_OK;
}

/* backward_passes > 1: accumulate locally; the last pass of a group
 * enqueues the allreduce of the sum. Called with g_mu held. */
static int accumulate(kolo__runtime_t *rt, const char *name, const void *input,
                      void *output, int64_t count, kolo_dtype_t dtype,
                      const kolo_allreduce_opts_t *opts, kolo_handle_t *handle,
                      kolo__err_t *err)
{
    accumulator_t *acc = kolo__map_gets(&g_accumulators, name);
    kolo_handle_t id;
    int rc;

    if (acc != NULL && (acc->count != count || acc->dtype != dtype ||
                        acc->passes != opts->backward_passes)) {
        rc = kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                           "allreduce of tensor '%s': pass %d of %d was "
                           "accumulated with %lld %s and %d passes, this call "
                           "has %lld %s and %d passes; the partial sum is "
                           "discarded",
                           name, acc->done + 1, acc->passes,
                           (long long)acc->count, kolo_dtype_name(acc->dtype),
                           acc->passes, (long long)count,
                           kolo_dtype_name(dtype), opts->backward_passes);
        kolo__map_dels(&g_accumulators, name);
        free(acc->sum);
        free(acc);
        return rc;
    }
    if (acc == NULL) {
        acc = calloc(1, sizeof(*acc));
        if (acc != NULL)
            acc->sum = calloc(count ? (size_t)count : 1,
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
        acc->passes = opts->backward_passes;
    }
    kolo__accumulate(acc->sum, input, (size_t)count, dtype);
    if (++acc->done < acc->passes) {
        /* An intermediate pass: done at once, nothing communicated. */
        KOLO__CHECK(kolo__handles_new(rt->handles, &id, err));
        kolo__handles_complete(rt->handles, id, KOLO_OK, NULL);
        *handle = id;
        return KOLO_OK;
    }
    kolo__accumulate_finish(output, acc->sum, (size_t)count, dtype,
                            opts->average_passes ? acc->passes : 1);
    memset(acc->sum, 0, (size_t)count * kolo__accumulator_elem_size(dtype));
    acc->done = 0;
    return enqueue(rt, name, output, output, count, dtype, opts->op, handle, err);
}

int kolo_allreduce_async_opts(const char *name, const void *input,
                              void *output, int64_t count, kolo_dtype_t dtype,
                              const kolo_allreduce_opts_t *opts,
                              kolo_handle_t *handle)
{
    kolo_allreduce_opts_t defaults;
    kolo__err_t err;
    int rc;

    kolo__err_clear(&err);
    if (opts == NULL) {
        kolo_allreduce_opts_init(&defaults);
        opts = &defaults;
    }
    rc = check_args(name, input, output, count, dtype, opts->op, handle, &err);
    if (rc != KOLO_OK)
        return fail(&err);
    if (opts->backward_passes < 1)
        return failf(KOLO_ERR_INVALID_ARGUMENT,
                     "allreduce of tensor '%s': backward_passes must be at "
                     "least 1, not %d",
                     name, opts->backward_passes);

    pthread_mutex_lock(&g_mu);
    if (g_rt == NULL)
        rc = kolo__err_set(&err, KOLO_ERR_NOT_INITIALIZED,
                           "allreduce of tensor '%s': kolo is not initialized "
                           "(call kolo_init first)",
                           name);
    else if (opts->backward_passes > 1)
        rc = accumulate(g_rt, name, input, output, count, dtype, opts, handle,
                        &err);
    else
        rc = enqueue(g_rt, name, input, output, count, dtype, opts->op, handle,
                     &err);
    pthread_mutex_unlock(&g_mu);
    return rc == KOLO_OK ? KOLO_OK : fail(&err);
}

int kolo_allreduce_async(const char *name, const void *input, void *output,
                         int64_t count, kolo_dtype_t dtype, kolo_op_t op,
                         kolo_handle_t *handle)
{
    kolo_allreduce_opts_t opts;
    kolo_allreduce_opts_init(&opts);
    opts.op = op;
    return kolo_allreduce_async_opts(name, input, output, count, dtype, &opts,
                                     handle);
}

/* ---- completion ----------------------------------------------------------- */

int kolo_poll(kolo_handle_t handle)
{
    kolo__err_t err;
    kolo__handles_t *h = handles();
    int rc;

    if (h == NULL)
        return failf(KOLO_ERR_INTERNAL, "the handle table is unavailable");
    kolo__err_clear(&err);
    rc = kolo__handles_poll(h, handle, &err);
    return rc < 0 ? fail(&err) : rc;
}

int kolo_wait(kolo_handle_t handle)
{
    kolo__err_t err;
    kolo__handles_t *h = handles();
    int rc;

    if (h == NULL)
        return failf(KOLO_ERR_INTERNAL, "the handle table is unavailable");
    kolo__err_clear(&err);
    rc = kolo__handles_wait(h, handle, &err);
    return rc < 0 ? fail(&err) : rc;
}

const char *kolo_handle_error(kolo_handle_t handle)
{
    kolo__handles_t *h = handles();
    return h ? kolo__handles_error(h, handle) : NULL;
}
