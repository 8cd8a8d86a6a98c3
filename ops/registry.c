/*
 * registry.c — the backends this build has, by the names users give them in
 * KOLO_CONTROLLER and KOLO_CPU_OPERATIONS, and the one place that chooses
 * among them (from their capability fields, ops.h): the runtime asks here
 * for every role of every process set, and kolo-bench asks here to say
 * which backends the runtime uses.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

static const kolo__ops_t *const all_ops[] = {
#ifdef KOLO_HAVE_GLOO
    &kolo__ops_gloo,
#endif
#ifdef KOLO_HAVE_SHM
    &kolo__ops_shm,
    &kolo__ops_hier,
#endif
#ifdef KOLO_HAVE_MPI
    &kolo__ops_mpi,
#endif
#ifdef KOLO_HAVE_MEM
    /* Ranks as threads of one process: only the unit tests' library
     * (ops/mem/Makefile.include) defines KOLO_HAVE_MEM, so libkolo never
     * has it and no user can pick it. */
    &kolo__ops_mem,
#endif
    &kolo__ops_local,
};
#define NOPS (sizeof(all_ops) / sizeof(all_ops[0]))

const kolo__ops_t *kolo__ops_find(const char *name)
{
    for (size_t i = 0; i < NOPS; i++)
        if (strcmp(all_ops[i]->name, name) == 0)
            return all_ops[i];
    return NULL;
}

/* local and hier are composed by the runtime, never named by users. */
static int user_named(const kolo__ops_t *ops)
{
    return (ops->caps & KOLO__OPS_USER) != 0;
}

/* The first backend with every capability in `caps`, in table order. */
static const kolo__ops_t *first_with(unsigned caps)
{
    for (size_t i = 0; i < NOPS; i++)
        if ((all_ops[i]->caps & caps) == caps)
            return all_ops[i];
    return NULL;
}

int kolo__ops_choose(const kolo__ops_need_t *need, const kolo__ops_t **out,
                     char *err, size_t errlen)
{
    const char *want = need->want != NULL ? need->want : "";
    const kolo__ops_t *ops = NULL;
    char names[128];

    *out = NULL;
    if (need->size == 1) {
        *out = &kolo__ops_local;
        return KOLO_OK;
    }
    if (want[0] != '\0' && strcmp(want, "auto") != 0) {
        ops = kolo__ops_named(want);
        if (ops == NULL) {
            kolo__ops_names(names, sizeof(names));
            snprintf(err, errlen, "%s=%s: this kolo has no backend of that "
                     "name (it has: %s)", need->var, want,
                     names[0] ? names : "none");
            return KOLO_ERR_UNSUPPORTED;
        }
        if ((ops->caps & KOLO__OPS_MPIRUN) && !need->mpi_launched) {
            snprintf(err, errlen, "%s=%s: the %s backend needs the job to be "
                     "started by mpirun (or kolorun --mpi), and rank %d was "
                     "started by kolorun without --mpi", need->var, want,
                     ops->name, need->rank);
            return KOLO_ERR_UNSUPPORTED;
        }
        if ((ops->caps & KOLO__OPS_ONE_HOST) && !need->all_local) {
            snprintf(err, errlen, "%s=%s: the ranks of this job or process "
                     "set are not all on one host", need->var, want);
            return KOLO_ERR_UNSUPPORTED;
        }
        *out = ops;
        return KOLO_OK;
    }
    if (need->mpi_launched)
        ops = first_with(KOLO__OPS_USER | KOLO__OPS_MPIRUN);
    if (ops == NULL && need->all_local)
        ops = first_with(KOLO__OPS_USER | KOLO__OPS_ONE_HOST);
    if (ops == NULL)
        ops = first_with(KOLO__OPS_USER | KOLO__OPS_NETWORK);
    if (ops == NULL) {
        snprintf(err, errlen, "a process set of %d ranks needs a "
                 "communication backend, and this kolo was built without "
                 "one", need->size);
        return KOLO_ERR_UNSUPPORTED;
    }
    *out = ops;
    return KOLO_OK;
}

#ifdef KOLO_HAVE_MEM
/* The unit tests put their simulated device (ops/simdev) here. */
static const kolo__dev_ops_t *_Atomic test_device;

void kolo__ops_device_use(const kolo__dev_ops_t *dev)
{
    test_device = dev;
}
#endif

/* KOLO_OPS_HOST_ONLY: kolo-bench's private copy of the host backends
 * (libkolo_raw), which has no device backend. */
const kolo__dev_ops_t *kolo__ops_device(void)
{
#ifdef KOLO_HAVE_MEM
    const kolo__dev_ops_t *dev = test_device;
    if (dev != NULL)
        return dev;
#endif
#if defined(KOLO_HAVE_GPU) && !defined(KOLO_OPS_HOST_ONLY)
    return &kolo__dev_ops_nccl;
#else
    return NULL;
#endif
}

const kolo__ops_t *kolo__ops_hierarchical(void)
{
    return first_with(KOLO__OPS_HOSTS);
}

const kolo__ops_t *kolo__ops_named(const char *name)
{
    const kolo__ops_t *ops = kolo__ops_find(name);
    return ops != NULL && user_named(ops) ? ops : NULL;
}

void kolo__ops_names(char *out, size_t len)
{
    size_t used = 0;

    if (len == 0)
        return;
    out[0] = '\0';
    for (size_t i = 0; i < NOPS; i++) {
        /* The tests' backend is not listed: messages read as in libkolo. */
        if (!user_named(all_ops[i]) || (all_ops[i]->caps & KOLO__OPS_TESTS))
            continue;
        int n = snprintf(out + used, len - used, "%s%s", used ? ", " : "",
                         all_ops[i]->name);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}

int kolo__ops_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

int kolo__dev_check_placement(const kolo__dev_check_t *t, int count,
                              char *err, size_t errlen)
{
    if (t->device < 0 || t->device >= count)
        return kolo__ops_fail(err, errlen, KOLO_ERR_INVALID_ARGUMENT,
                              "%s of tensor '%s': there is no CUDA device "
                              "%d; rank %d sees %d (0..%d)", t->coll, t->name,
                              t->device, t->rank, count, count - 1);
    if (t->set_device >= 0 && t->set_device != t->device)
        return kolo__ops_fail(err, errlen, KOLO_ERR_INVALID_ARGUMENT,
                              "%s of tensor '%s' is on CUDA device %d, but "
                              "rank %d's CUDA tensors in process set %d are "
                              "on device %d: a rank uses one device per set "
                              "(its NCCL communicator's)", t->coll, t->name,
                              t->device, t->rank, t->set_id, t->set_device);
    return KOLO_OK;
}
