/*
 * elastic.h — the elastic driver (elastic.c), a policy on top of
 * supervision (supervise.h): hosts from discovery, workers per slot,
 * generations published through the rendezvous, blacklisting.
 */
#ifndef KOLORUN_ELASTIC_H
#define KOLORUN_ELASTIC_H

#include "supervise.h"

/* Sets the job up as elastic (k->policy, k->elastic); 0, or -1 having
 * said why. */
int kolorun_elastic_start(kolorun_t *k);
/* The exit status the driver chose, or -1 while it has chosen none. */
int kolorun_elastic_status(const kolorun_t *k);
void kolorun_elastic_free(kolorun_t *k);

#endif /* KOLORUN_ELASTIC_H */
