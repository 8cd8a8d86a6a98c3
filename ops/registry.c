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
    &kolo__ops_local,
};

const kolo__ops_t *kolo__ops_find(const char *name)
{
    for (size_t i = 0; i < sizeof(all_ops) / sizeof(all_ops[0]); i++)
        if (strcmp(all_ops[i]->name, name) == 0)
            return all_ops[i];
    return NULL;
}

void kolo__ops_names(char *out, size_t len)
{
    size_t used = 0;

    if (len == 0)
        return;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(all_ops) / sizeof(all_ops[0]); i++) {
        if (strcmp(all_ops[i]->name, "local") == 0 ||
            strcmp(all_ops[i]->name, "hier") == 0)
            continue;
        int n = snprintf(out + used, len - used, "%s%s", used ? ", " : "",
                         all_ops[i]->name);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}
