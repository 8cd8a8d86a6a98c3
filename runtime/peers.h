/*
 * peers.h — a registry of the job's processes, so that a rank can name the
 * peer it lost (design in peers.c).
 */
#ifndef KOLO_PEERS_H
#define KOLO_PEERS_H

#include <stddef.h>

#include "env.h"

/* Records this rank (host, pid) under `prefix` in the rendezvous
 * directory; a failure only costs precision in later messages. */
void kolo__peers_register(const kolo__config_t *cfg, const char *prefix);
void kolo__peers_unregister(const kolo__config_t *cfg, const char *prefix);

/* Writes "rank 2 (pid 1234) has exited or was killed; ..." for the peers
 * among ranks[n] (global ranks) whose process on this host is gone or
 * stopped; returns how many. */
int kolo__peers_lost(const kolo__config_t *cfg, const char *prefix,
                     const int *ranks, int n, char *out, size_t len);

#endif /* KOLO_PEERS_H */
