/*
 * job.c — the job's tables: a rank's entry with its line buffers (an
 * elastic job's table grows as its workers start), kolorun's two outputs,
 * and freeing all of it with what the job description holds.
 */
#define _GNU_SOURCE

#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "procs.h"

/* Makes room for n ranks (an elastic job's workers, as they come): the
 * new entries closed, with their line buffers. 0, or -1 when memory is
 * short. */
int kolorun_ranks_grow(kolorun_t *k, int n)
{
    if (n <= k->nranks)
        return 0;
    kolorun_rank_t *r = realloc(k->ranks, (size_t)n * sizeof *r);
    if (!r)
        return -1;
    k->ranks = r;
    for (; k->nranks < n; k->nranks++) {
        kolorun_rank_t *rk = &k->ranks[k->nranks];
        memset(rk, 0, sizeof *rk);
        rk->hold_fd = -1;
        rk->files[0] = rk->files[1] = -1;
        rk->streams[0].fd = rk->streams[1].fd = -1;
        for (int s = 0; s < 2; s++) {
            rk->streams[s].buf = malloc(KOLORUN_LINE_MAX);
            if (!rk->streams[s].buf) {
                k->nranks++; /* freed with the others */
                return -1;
            }
        }
    }
    return 0;
}

/* Allocates the ranks' and sinks' buffers; -1 when memory is short. An
 * elastic job's workers are added as they start. */
int kolorun_job_alloc(kolorun_t *k)
{
    if (!k->opts.elastic && kolorun_ranks_grow(k, k->opts.np) != 0)
        return -1;
    k->sinks[KOLORUN_OUT].fd = STDOUT_FILENO;
    k->sinks[KOLORUN_ERR].fd = STDERR_FILENO;
    for (int s = 0; s < 2; s++) {
        k->sinks[s].buf = malloc(KOLORUN_SINK_CAP);
        if (!k->sinks[s].buf)
            return -1;
    }
    return 0;
}

void kolorun_job_free(kolorun_t *k)
{
    for (int r = 0; k->ranks && r < k->nranks; r++) {
        if (k->ranks[r].hold_fd >= 0)
            close(k->ranks[r].hold_fd);
        for (int s = 0; s < 2; s++) {
            if (k->ranks[r].files[s] >= 0)
                close(k->ranks[r].files[s]);
            kolorun_stream_close(&k->ranks[r].streams[s]);
            free(k->ranks[r].streams[s].buf);
        }
    }
    free(k->ranks);
    for (int s = 0; s < 2; s++)
        free(k->sinks[s].buf);
    free(k->rank_host);
    for (int h = 0; h < k->opts.nhosts; h++)
        free(k->opts.hosts[h].name);
    free(k->opts.hosts);
    free(k->opts.xenv);
    free(k->opts.nics);
    free(k->opts.network_interface);
    for (int i = 0; i < k->opts.nsettings; i++)
        free(k->opts.settings[i].value);
}
