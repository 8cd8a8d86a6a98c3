/*
 * rdvserver.h — the rendezvous that rank 0 serves for a job started by
 * torchrun or srun (design in rdvserver.c).
 */
#ifndef KOLO_RDVSERVER_H
#define KOLO_RDVSERVER_H

#include "common.h"

/* The ports a job's rendezvous may take: the launcher's port and the next
 * ones, KOLO__RDV_PORTS in all. Another program on the first (a client
 * connection's local port, most often: MASTER_PORT+1 is even, the parity
 * Linux gives outgoing connections) does not stop the job. */
#define KOLO__RDV_PORTS 8

/* Serves the store on every address of this host, on the first free port
 * of port .. port + KOLO__RDV_PORTS - 1 (into *served), for the job named
 * `job`, from a thread that lives until the process exits (the keys of
 * one kolo_init are under their own prefix, so a later kolo_init reuses
 * it, and the server answers for that job too). `why` says in a message
 * where the port comes from. job_key (auth.h; NULL: the job has no
 * secret): every connection must prove it first (rdvserver.c). */
int kolo__rdvserver_start(int port, const char *job, const uint8_t *job_key,
                          const char *why, int *served, kolo__err_t *err);

/* Waits until the server of job `job` answers at host, on one of the
 * ports port .. port + KOLO__RDV_PORTS - 1 (connecting and asking each
 * whether it serves the job, every few hundred milliseconds; never
 * spinning), for at most timeout_s seconds: KOLO_OK with its port in
 * *found, or KOLO_ERR_TIMEOUT naming the addresses and `why`. */
int kolo__rdvserver_wait(const char *host, int port, const char *job,
                         double timeout_s, const char *why, int *found,
                         kolo__err_t *err);

#endif /* KOLO_RDVSERVER_H */
