/*
 * registry.c — the backends this build has, by the names users give them in
 * KOLO_CONTROLLER and KOLO_CPU_OPERATIONS.
 */
#include "config.h"

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

const kolo__ops_t *kolo__ops_find(const char *name)
{
    for (size_t i = 0; i < sizeof(all_ops) / sizeof(all_ops[0]); i++)
        if (strcmp(all_ops[i]->name, name) == 0)
            return all_ops[i];
    return NULL;
}

/* local and hier are composed by the runtime, never named by users. */
static int user_named(const kolo__ops_t *ops)
{
    return strcmp(ops->name, "local") != 0 && strcmp(ops->name, "hier") != 0;
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
    for (size_t i = 0; i < sizeof(all_ops) / sizeof(all_ops[0]); i++) {
        /* mem is not listed: messages read as they do in libkolo. */
        if (!user_named(all_ops[i]) || strcmp(all_ops[i]->name, "mem") == 0)
            continue;
        int n = snprintf(out + used, len - used, "%s%s", used ? ", " : "",
                         all_ops[i]->name);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}
