/*
 * rdvserver.h — the rendezvous that rank 0 serves for a job started by
 * torchrun or srun (design in rdvserver.c).
 */
#ifndef KOLO_RDVSERVER_H
#define KOLO_RDVSERVER_H

#include "common.h"

/* Serves the store on every address of this host, port `port`, from a
 * thread that lives until the process exits (the keys of one kolo_init are
 * under their own prefix, so a later kolo_init reuses it). A second call
 * with the same port does nothing. `why` says in a message where the port
 * comes from. */
int kolo__rdvserver_start(int port, const char *why, kolo__err_t *err);

/* Waits until a server answers at host:port (connecting, and asking
 * PING, every few hundred milliseconds; never spinning), for at most
 * timeout_s seconds: KOLO_OK, or KOLO_ERR_TIMEOUT naming the address and
 * `why`. */
int kolo__rdvserver_wait(const char *host, int port, double timeout_s,
                         const char *why, kolo__err_t *err);

#endif /* KOLO_RDVSERVER_H */
