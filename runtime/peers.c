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
 *
 * With a Redis rendezvous (redis:HOST:PORT/JOB, jobs over several hosts)
 * there is no directory, and the registry is skipped: every function here
 * does nothing and names no one. Only messages lose precision: a lost peer
 * is reported as the backend's "connection closed by peer"; kolorun still
 * names the rank and host that failed first. (Ranks that never arrive are
 * named by kolo_init's agreement, agree.c, through either rendezvous.) Storing the registry in Redis
 * would give ranks of the same host their names back, but for peers on
 * other hosts (the case Redis is for) a process id says nothing anyway.
 */
#include "peers.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

static int registry_path(const kolo__config_t *cfg, const char *prefix, int rank,
                         char *out, size_t len)
{
    int n;
    if (strncmp(cfg->rendezvous, "file:", 5) != 0)
        return -1; /* Redis, or no rendezvous: no registry (see the top) */
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

/* What is wrong with a peer's process: NULL if it looks alive. */
static const char *process_trouble(long pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    const char *trouble = NULL;

    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH ? "has exited or was killed" : NULL;
    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    if (fgets(buf, sizeof(buf), f) != NULL && (p = strrchr(buf, ')')) != NULL &&
        p[1] == ' ') {
        if (p[2] == 'Z' || p[2] == 'X')
            trouble = "has exited or was killed";
        else if (p[2] == 'T' || p[2] == 't')
            trouble = "is stopped (SIGSTOP, or a debugger)";
    }
    fclose(f);
    return trouble;
}

int kolo__peers_lost(const kolo__config_t *cfg, const char *prefix,
                     const int *ranks, int n, char *out, size_t len,
                     int *watched)
{
    char host[256] = "", path[4200], theirs[256];
    size_t used = 0;
    int found = 0;

    out[0] = '\0';
    if (watched != NULL)
        *watched = 0;
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
        const char *trouble;
        int here = fscanf(f, "%255s %ld", theirs, &pid) == 2 &&
                   strcmp(theirs, host) == 0;
        if (here && watched != NULL && pid != (long)getpid())
            (*watched)++;
        if (here && (trouble = process_trouble(pid)) != NULL) {
            int k = snprintf(out + used, len - used, "%srank %d (pid %ld) %s",
                             found ? "; " : "", r, pid, trouble);
            if (k > 0 && (size_t)k < len - used)
                used += (size_t)k;
            found++;
        }
        fclose(f);
    }
    return found;
}

/* ---- why a rank stopped ---------------------------------------------------- */

static pthread_mutex_t g_cause_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_cause[KOLO__ERR_LEN + 128];

void kolo__peers_note_cause(int code, const char *msg)
{
    /* Only what this rank could not do itself (memory, a thread it could
     * not start): other failures (a lost or stopped peer, a timeout, a
     * mismatch all ranks see) are the peers' own to report. */
    if ((code != KOLO_ERR_NO_MEMORY && code != KOLO_ERR_INTERNAL) ||
        msg == NULL || msg[0] == '\0')
        return;
    pthread_mutex_lock(&g_cause_mu);
    if (g_cause[0] == '\0')
        snprintf(g_cause, sizeof(g_cause), "had failed: %s", msg);
    pthread_mutex_unlock(&g_cause_mu);
}

void kolo__peers_note_exit(const char *reason)
{
    pthread_mutex_lock(&g_cause_mu);
    if (g_cause[0] == '\0')
        snprintf(g_cause, sizeof(g_cause), "ended its program without "
                 "calling shutdown: %.*s", KOLO__ERR_LEN / 2,
                 reason != NULL && reason[0] != '\0'
                     ? reason
                     : "an uncaught exception, an exit, or fewer steps than "
                       "the others");
    pthread_mutex_unlock(&g_cause_mu);
}

void kolo__peers_forget_cause(void)
{
    pthread_mutex_lock(&g_cause_mu);
    g_cause[0] = '\0';
    pthread_mutex_unlock(&g_cause_mu);
}

static void why_key(char *out, size_t len, const char *prefix, int rank)
{
    snprintf(out, len, "%s/why/%d", prefix, rank);
}

static int has_store(const kolo__config_t *cfg)
{
    return strncmp(cfg->rendezvous, "file:", 5) == 0 ||
           strncmp(cfg->rendezvous, "redis:", 6) == 0;
}

/* Opened while the rank runs, so that saying why needs no memory: the
 * cause may be that there is none. */
static kolo__store_t *g_why_store;

void kolo__peers_prepare_why(const kolo__config_t *cfg)
{
    kolo__err_t e;

    /* A file store holds no descriptor while open; a Redis one would hold
     * a connection for the whole job: that one opens when needed. */
    kolo__store_t *st = NULL;

    if (cfg->size > 1 && strncmp(cfg->rendezvous, "file:", 5) == 0 &&
        kolo__store_open(cfg->rendezvous, cfg->timeout_s, &st, &e) != KOLO_OK)
        st = NULL;
    /* (under g_cause_mu: a set's thread and kolo_shutdown may say why at
     * once, and the unit tests' ranks share this process) */
    pthread_mutex_lock(&g_cause_mu);
    if (g_why_store == NULL) {
        g_why_store = st;
        st = NULL;
    }
    pthread_mutex_unlock(&g_cause_mu);
    kolo__store_close(st);
}

void kolo__peers_say_why(const kolo__config_t *cfg, const char *prefix)
{
    char cause[sizeof(g_cause)], key[128];
    kolo__store_t *st;
    kolo__err_t e;

    pthread_mutex_lock(&g_cause_mu);
    st = g_why_store;
    g_why_store = NULL;
    snprintf(cause, sizeof(cause), "%s", g_cause);
    pthread_mutex_unlock(&g_cause_mu);
    if (cause[0] == '\0' || cfg->size == 1 || !has_store(cfg) ||
        (st == NULL &&
         kolo__store_open(cfg->rendezvous, cfg->timeout_s, &st, &e) != KOLO_OK)) {
        kolo__store_close(st);
        return;
    }
    why_key(key, sizeof(key), prefix, (int)cfg->rank);
    if (kolo__store_set(st, key, cause, strlen(cause), &e) != KOLO_OK)
        kolo__debug("cannot tell the other ranks why this one stops: %s", e.msg);
    kolo__store_close(st);
}

int kolo__peers_why(const kolo__config_t *cfg, const char *prefix, int rank,
                    char *out, size_t len)
{
    char key[128], *v = NULL;
    kolo__store_t *st = NULL;
    kolo__err_t e;
    int found = 0;

    if (!has_store(cfg) ||
        kolo__store_open(cfg->rendezvous, cfg->timeout_s, &st, &e) != KOLO_OK)
        return 0;
    why_key(key, sizeof(key), prefix, rank);
    if (kolo__store_get(st, key, 0, &v, &e) == KOLO_OK && v != NULL) {
        snprintf(out, len, "%s", v);
        found = 1;
    }
    free(v);
    kolo__store_close(st);
    return found;
}
