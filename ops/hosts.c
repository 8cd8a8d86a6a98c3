/*
 * hosts.c — grouping the members of a group by host (hosts.h).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "hosts.h"

int kolo__hosts_group(const int *hosts, int size, int me, kolo__hosts_t *out)
{
    int *first = kolo__malloc((size_t)size * sizeof(int)); /* a member of each host */
    int *count = kolo__calloc((size_t)size, sizeof(int));  /* members per host */

    memset(out, 0, sizeof(*out));
    out->local = kolo__malloc((size_t)size * sizeof(int));
    out->cross = kolo__malloc((size_t)size * sizeof(int));
    if (first == NULL || count == NULL || out->local == NULL ||
        out->cross == NULL) {
        free(first);
        free(count);
        kolo__hosts_free(out);
        return -1;
    }
    for (int i = 0; i < size; i++) {
        int k;
        for (k = 0; k < out->nhosts && hosts[first[k]] != hosts[i]; k++)
            ;
        if (k == out->nhosts) {
            first[out->nhosts] = i;
            out->cross[out->nhosts++] = -1;
        }
        /* Member i is the count[k]-th of its host. */
        if (hosts[i] == hosts[me]) {
            if (i == me) {
                out->me_local = count[k];
                out->me_host = k;
            }
            out->local[out->nlocal++] = i;
        }
        count[k]++;
    }
    out->same = 1;
    for (int k = 0; k < out->nhosts; k++)
        out->same &= count[k] == out->nlocal;
    /* The cross group: on each host, the member with me's local index. */
    for (int k = 0; k < out->nhosts; k++) {
        int seen = 0;
        for (int i = 0; i < size; i++)
            if (hosts[i] == hosts[first[k]] && seen++ == out->me_local) {
                out->cross[k] = i;
                break;
            }
    }
    free(first);
    free(count);
    return 0;
}

void kolo__hosts_free(kolo__hosts_t *h)
{
    free(h->local);
    free(h->cross);
    h->local = h->cross = NULL;
}
