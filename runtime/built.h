/*
 * built.h — what ./configure built into this kolo (config.h), by the names
 * kolo_built() takes: the backends "gloo", "mpi", "shm", and "cuda". One
 * table for libkolo (api.c) and for kolorun --check-build, which says the
 * same where it cannot load libkolo. Include config.h first.
 */
#ifndef KOLO_BUILT_H
#define KOLO_BUILT_H

#include <string.h>

/* 1 if this build has `what`, else 0 (NCCL is the device backend's to
 * answer: its version). */
static inline int kolo__built(const char *what)
{
    static const char *const names[] = {
#ifdef KOLO_HAVE_GLOO
        "gloo",
#endif
#ifdef KOLO_HAVE_MPI
        "mpi",
#endif
#ifdef KOLO_HAVE_SHM
        "shm",
#endif
#ifdef KOLO_HAVE_CUDA
        "cuda",
#endif
        NULL};
    for (int i = 0; what != NULL && names[i] != NULL; i++)
        if (strcmp(names[i], what) == 0)
            return 1;
    return 0;
}

#endif /* KOLO_BUILT_H */
