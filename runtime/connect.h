/*
 * connect.h — connecting a backend context for a process set (connect.c).
 */
#ifndef KOLO_CONNECT_H
#define KOLO_CONNECT_H

#include "runtime.h"

/* Connects a backend context among `size` members of the set (global
 * ranks members[], host indices hosts[]), this rank being member `rank`;
 * `role` makes its rendezvous keys unique within the set. Background
 * thread or set start-up; every member calls it. */
int kolo__connect(kolo__pset_t *ps, const kolo__ops_t *ops, const char *role,
                  int rank, int size, const int *members, const int *hosts,
                  const char *cross_ops, void **ctx, kolo__err_t *err);

#endif /* KOLO_CONNECT_H */
