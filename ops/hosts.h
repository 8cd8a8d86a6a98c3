/*
 * hosts.h — which members of a group share a host, worked out once for
 * every user: the runtime deciding whether a process set reduces
 * hierarchically (runtime/pset.c), the hierarchical backend (ops/hier) and
 * the GPU path's hierarchical allreduce (ops/nccl).
 *
 * Members are numbered 0..size-1; hosts[i] is member i's host index (equal
 * index: same host). Hosts are numbered in order of first appearance.
 */
#ifndef KOLO_HOSTS_H
#define KOLO_HOSTS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kolo__hosts {
    int nhosts;   /* distinct hosts */
    int nlocal;   /* members on member me's host */
    int me_host;  /* me's host, 0..nhosts-1 */
    int me_local; /* me's index among its host's members */
    int same;     /* 1: every host holds nlocal members */
    int *local;   /* [nlocal]: the members on me's host, in order */
    int *cross;   /* [nhosts]: on each host, the member whose index there
                     is me_local (-1 where that host has fewer) */
} kolo__hosts_t;

/* Groups `size` members by host, from member me's point of view. 0, or -1
 * when memory ran out (nothing to free then). */
int kolo__hosts_group(const int *hosts, int size, int me, kolo__hosts_t *out);
void kolo__hosts_free(kolo__hosts_t *h);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_HOSTS_H */
