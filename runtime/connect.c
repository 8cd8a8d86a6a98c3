/*
 * connect.c — connecting a backend context for a process set: the
 * configuration a backend's init gets from the runtime (its rendezvous
 * keys, timeouts, the callbacks by which it wakes the set's thread and
 * warns), and the message when it cannot connect. Called by pset.c when a
 * set starts (its controller and data contexts) and by execute.c when the
 * device backend needs a network context between hosts.
 */
#include "config.h"

#include <stdio.h>

#include "agree.h"
#include "connect.h"

/* The backend's on_wake callback (ops.h), from the backend's thread: a
 * peer asks the set's thread to join a round. */
static void wake_from_peer(void *arg, uint64_t round)
{
    kolo__pset_t *ps = arg;
    kolo__queue_peer_wake(&ps->queue, round);
}

/* The message of a backend that could not connect. Every rank of the job
 * has arrived by then (kolo_init agreed on the settings first), so what
 * failed is the connection itself. */
static int connect_failed(kolo__runtime_t *rt, kolo__pset_t *ps,
                          const kolo__ops_t *ops, int rc, const char *detail,
                          kolo__err_t *err)
{
    if (ps->id != KOLO_GLOBAL_PROCESS_SET)
        return kolo__err_set(err, rc, "rank %d could not connect process set "
                             "%d (%s): %s", rt->rank, ps->id, ops->name, detail);
    return kolo__err_set(err, rc, "rank %d of %d could not join the job "
                         "(%s, rendezvous %s): %s", rt->rank, rt->size,
                         ops->name,
                         rt->cfg.rendezvous[0] ? rt->cfg.rendezvous : "none",
                         detail);
}

/* A backend's warning (Gloo: a stranger's connection it dropped), from
 * whatever thread the backend runs. */
static void warn_from_backend(const char *msg)
{
    kolo__log(KOLO__LOG_WARNING, "%s", msg);
}

int kolo__connect(kolo__pset_t *ps, const kolo__ops_t *ops,
                  const char *role, int rank, int size,
                  const int *members, const int *hosts,
                  const char *cross_ops, void **ctx, kolo__err_t *err)
{
    kolo__runtime_t *rt = ps->rt;
    kolo__ops_config_t ocfg;
    char prefix[96], detail[KOLO__ERR_LEN];
    int rc;

    snprintf(prefix, sizeof(prefix), "kolo%u/set%d/%s", rt->generation,
             ps->id, role);
    ocfg = (kolo__ops_config_t){
        .rank = rank, .size = size, .members = members,
        .hosts = hosts, .global_rank = rt->rank,
        .rendezvous = rt->cfg.rendezvous, .prefix = prefix,
        .hostname = rt->cfg.hostname, .timeout_s = rt->cfg.timeout_s,
        .start_timeout_s = rt->cfg.start_timeout_s,
        .on_wake = wake_from_peer, .wake_arg = ps,
        .abandoned = ps->watch != NULL ? kolo__outcome_abandoned : NULL,
        .abandoned_arg = ps->watch,
        .warn = warn_from_backend,
        .cross_ops = cross_ops,
        .shm_slot_bytes = (size_t)rt->cfg.shm_slot_bytes,
        .shm_spin_us = (int)rt->cfg.shm_spin_us,
        .ring_send_buffer = (size_t)rt->cfg.ring_send_buffer,
        .job_key = rt->have_job_key ? rt->job_key : NULL};
    detail[0] = '\0';
    rc = ops->init(&ocfg, ctx, detail, sizeof(detail));
    if (rc != KOLO_OK)
        return connect_failed(rt, ps, ops, rc, detail, err);
    return KOLO_OK;
}
