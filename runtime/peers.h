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
 * stopped; returns how many. `watched` (may be NULL) gets how many of them
 * are registered as other processes of this host: those it could ever find
 * gone (0 where the registry is elsewhere, or there is none, or the ranks
 * are threads of this process). */
int kolo__peers_lost(const kolo__config_t *cfg, const char *prefix,
                     const int *ranks, int n, char *out, size_t len,
                     int *watched);

/* Why a rank stopped, for the others' messages. kolo__peers_note_cause
 * keeps the first failure of this rank that is its own (out of memory, a
 * thread it could not start: KOLO_ERR_NO_MEMORY, KOLO_ERR_INTERNAL),
 * from any thread; kolo_shutdown publishes it (kolo__peers_say_why, under
 * kolo<gen>/why/<rank> in the rendezvous store, before it announces the
 * shutdown), and a peer told "rank 1 has shut down" reads it
 * (kolo__peers_why: 1 and the text in out when there is one). The text
 * follows "rank R " in the others' messages: "had failed: MSG", or, from
 * kolo__peers_note_exit (a program that ends without kolo_shutdown, at
 * exit), "ended its program without calling shutdown ...". */
void kolo__peers_note_cause(int code, const char *msg);
void kolo__peers_note_exit(const char *reason);
void kolo__peers_forget_cause(void);
/* kolo_init opens the store kolo__peers_say_why will write with (and
 * close: it is called once per kolo_init, at shutdown or on failure). */
void kolo__peers_prepare_why(const kolo__config_t *cfg);
void kolo__peers_say_why(const kolo__config_t *cfg, const char *prefix);
int kolo__peers_why(const kolo__config_t *cfg, const char *prefix, int rank,
                    char *out, size_t len);

#endif /* KOLO_PEERS_H */
