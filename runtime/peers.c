/*
 * peers.c — who is still alive: a small registry in the rendezvous
 * directory that lets a rank name the peer it lost.
 *
 * A backend only says "connection closed by peer [address]:port" when a
 * rank dies. To say which rank that was, every rank writes, at init, a file
 * RDV/<prefix>.rank<R> holding its host name and process id, and removes it
 * at shutdown. When a backend operation fails, the rank reads the files of
 * its peers: a peer on the same host whose process is gone (or a zombie
 * waiting to be reaped) is the one lost. Peers on other hosts cannot be
 * checked this way and are not named.
 */
#include "peers.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int registry_path(const kolo__config_t *cfg, const char *prefix, int rank,
                         char *out, size_t len)
{
    int n;
    if (strncmp(cfg->rendezvous, "file:", 5) != 0)
        return -1;
    n = snprintf(out, len, "%s/%s.rank%d", cfg->rendezvous + 5, prefix, rank);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

void kolo__peers_register(const kolo__config_t *cfg, const char *prefix)
{
    char path[4200], host[256] = "";
    FILE *f;

    if (registry_path(cfg, prefix, (int)cfg->rank, path, sizeof(path)) != 0)
        return;
    gethostname(host, sizeof(host) - 1);
    f = fopen(path, "w");
    if (f == NULL) {
        /* Only failure messages get less precise; say so once. */
        kolo__debug("cannot write %s: %s", path, strerror(errno));
        return;
    }
    fprintf(f, "%s %ld\n", host, (long)getpid());
    fclose(f);
}

void kolo__peers_unregister(const kolo__config_t *cfg, const char *prefix)
{
    char path[4200];
    if (registry_path(cfg, prefix, (int)cfg->rank, path, sizeof(path)) == 0)
        unlink(path);
}

/* 1 if the process is gone or a zombie. */
static int process_gone(long pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    int gone = 0;

    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fgets(buf, sizeof(buf), f) != NULL && (p = strrchr(buf, ')')) != NULL)
        gone = p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
    fclose(f);
    return gone;
}

int kolo__peers_lost(const kolo__config_t *cfg, const char *prefix,
                     const int *ranks, int n, char *out, size_t len)
{
    char host[256] = "", path[4200], theirs[256];
    size_t used = 0;
    int found = 0;

    out[0] = '\0';
    gethostname(host, sizeof(host) - 1);
    for (int i = 0; i < n; i++) {
        long pid;
        FILE *f;
        int r = ranks[i];

        if (r == (int)cfg->rank ||
            registry_path(cfg, prefix, r, path, sizeof(path)) != 0)
            continue;
        f = fopen(path, "r");
        if (f == NULL)
            continue; /* shut down cleanly, or never arrived */
        if (fscanf(f, "%255s %ld", theirs, &pid) == 2 &&
            strcmp(theirs, host) == 0 && process_gone(pid)) {
            int k = snprintf(out + used, len - used, "%srank %d (pid %ld)",
                             found ? ", " : "", r, pid);
            if (k > 0 && (size_t)k < len - used)
                used += (size_t)k;
            found++;
        }
        fclose(f);
    }
    return found;
}
