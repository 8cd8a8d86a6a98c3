/*
 * elastic.c — an elastic job's membership (kolorun --min-np,
 * --host-discovery-script).
 *
 * DESIGN
 *
 * In an elastic job the set of ranks changes while the job runs: a worker
 * fails or its host goes away, a host comes. kolorun decides each new
 * membership, a "generation", and publishes it in the job's store
 * (store.c: files or Redis), where every worker already looks when it
 * starts:
 *
 *   elastic/<g>/members   one host:slot a line, in rank order
 *   elastic/<g>/update    why g exists: start, failure, added, removed,
 *                         mixed
 *   elastic/generation    the newest g (written last; it only grows)
 *   elastic/end           why kolorun ended the job, if it did
 *
 * A worker is a (host, slot) pair, KOLO_ELASTIC_ID = "host:slot". Its
 * kolo_init waits for a generation newer than the one it last joined,
 * takes its rank, size, local and cross places from the member list
 * (kolo__elastic_place) and forms the job under rendezvous keys of that
 * generation only, so workers of different generations never meet. The
 * runtime never decides membership: it reads what kolorun wrote.
 *
 * When a member is lost, the survivors' process sets stop as in any job,
 * but their operations fail with KOLO_ERR_MEMBERSHIP (background.c,
 * complete.c) instead of the loss's own status: the program recovers with
 * kolo_shutdown and kolo_init, which joins the next generation. Scaling
 * changes (hosts added or removed, nothing failed) are not failures: the
 * program asks kolo_hosts_updated() at its commits (kolo.torch.elastic's
 * State.commit does) and re-forms the job itself.
 */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "elastic.h"
#include "store.h"

#define IO_TIMEOUT_S 5.0
#define POLL_MAX_MS 100

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The host of a "host:slot" line of `len` bytes (up to its last ':'). */
static size_t host_len(const char *line, size_t len)
{
    for (size_t i = len; i > 0; i--)
        if (line[i - 1] == ':')
            return i - 1;
    return len;
}

/* The lines of a member list: starts and lengths, blank lines skipped. */
typedef struct lines {
    const char **at;
    size_t *len;
    int n;
} lines_t;

static int split_lines(const char *text, lines_t *l)
{
    int cap = 1;
    const char *p;

    for (p = text; *p != '\0'; p++)
        cap += *p == '\n';
    l->at = kolo__malloc((size_t)cap * sizeof(*l->at));
    l->len = kolo__malloc((size_t)cap * sizeof(*l->len));
    l->n = 0;
    if (l->at == NULL || l->len == NULL) {
        free(l->at);
        free(l->len);
        return -1;
    }
    for (p = text; *p != '\0';) {
        const char *end = strchr(p, '\n');
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' '))
            n--;
        if (n > 0) {
            l->at[l->n] = p;
            l->len[l->n++] = n;
        }
        p += end != NULL ? (size_t)(end - p) + 1 : strlen(p);
    }
    return 0;
}

static int same_host(const lines_t *l, int a, int b)
{
    size_t ha = host_len(l->at[a], l->len[a]), hb = host_len(l->at[b], l->len[b]);
    return ha == hb && memcmp(l->at[a], l->at[b], ha) == 0;
}

int kolo__elastic_place(const char *members, const char *id,
                        kolo__elastic_place_t *out)
{
    lines_t l;
    int me = -1;

    if (split_lines(members, &l) != 0)
        return -1;
    for (int i = 0; i < l.n && me < 0; i++)
        if (l.len[i] == strlen(id) && memcmp(l.at[i], id, l.len[i]) == 0)
            me = i;
    if (me >= 0) {
        out->rank = me;
        out->size = l.n;
        out->local_rank = out->local_size = 0;
        for (int i = 0; i < l.n; i++) {
            if (!same_host(&l, i, me))
                continue;
            out->local_size++;
            if (i < me)
                out->local_rank++;
        }
        /* Cross: this host's index among the hosts, in order of first
         * appearance, and their number (as kolorun's KOLO_CROSS_RANK and
         * KOLO_CROSS_SIZE of a job that does not change). */
        out->cross_rank = out->cross_size = 0;
        for (int i = 0; i < l.n; i++) {
            int first = 1;
            for (int j = 0; j < i && first; j++)
                first = !same_host(&l, i, j);
            if (!first)
                continue;
            if (same_host(&l, i, me))
                out->cross_rank = out->cross_size;
            out->cross_size++;
        }
    }
    free(l.at);
    free(l.len);
    return me >= 0 ? 0 : -1;
}

static int read_generation(kolo__store_t *s, unsigned *g, kolo__err_t *err)
{
    char *text = NULL;
    int rc = kolo__store_get(s, "elastic/generation", 0, &text, err);

    *g = 0;
    if (rc == KOLO_ERR_TIMEOUT)
        return KOLO_OK; /* not published yet */
    if (rc != KOLO_OK)
        return rc;
    *g = (unsigned)strtoul(text, NULL, 10);
    free(text);
    return KOLO_OK;
}

int kolo__elastic_join(const char *rendezvous, const char *id,
                       unsigned after, double timeout_s,
                       kolo__elastic_place_t *out, kolo__err_t *err)
{
    kolo__store_t *s = NULL;
    double deadline = now_s() + timeout_s;
    long pause = 1;
    unsigned g = 0;
    char key[64], *text = NULL;
    int rc;

    if (id[0] == '\0')
        return kolo__err_set(err, KOLO_ERR_CONFIG, "KOLO_ELASTIC=1 without "
                             "KOLO_ELASTIC_ID: elastic jobs are started by "
                             "kolorun --min-np or --host-discovery-script");
    KOLO__CHECK(kolo__store_open(rendezvous, IO_TIMEOUT_S, &s, err));
    for (;;) {
        if (kolo__store_get(s, "elastic/end", 0, &text, err) == KOLO_OK) {
            rc = kolo__err_set(err, KOLO_ERR_SHUTDOWN, "worker %s: kolorun "
                               "ended the elastic job: %s", id, text);
            goto out;
        }
        rc = read_generation(s, &g, err);
        if (rc != KOLO_OK)
            goto out;
        if (g > after)
            break;
        if (now_s() > deadline) {
            rc = kolo__err_set(err, KOLO_ERR_TIMEOUT, "worker %s: kolorun "
                               "published no membership after generation %u "
                               "within %g s (KOLO_ELASTIC_TIMEOUT)", id,
                               after, timeout_s);
            goto out;
        }
        sleep_ms(pause);
        pause = pause * 2 < POLL_MAX_MS ? pause * 2 : POLL_MAX_MS;
    }
    /* The members and the update are written before the generation. */
    snprintf(key, sizeof(key), "elastic/%u/members", g);
    rc = kolo__store_get(s, key, IO_TIMEOUT_S, &text, err);
    if (rc == KOLO_ERR_TIMEOUT)
        rc = kolo__err_set(err, KOLO_ERR_TIMEOUT, "worker %s: generation %u "
                           "has no member list in the store", id, g);
    if (rc != KOLO_OK)
        goto out;
    memset(out, 0, sizeof(*out));
    out->generation = g;
    if (kolo__elastic_place(text, id, out) != 0) {
        rc = kolo__err_set(err, KOLO_ERR_REMOVED, "worker %s has been removed "
                           "from the elastic job (generation %u does not "
                           "include it)", id, g);
        goto out;
    }
    free(text);
    text = NULL;
    snprintf(key, sizeof(key), "elastic/%u/update", g);
    if (kolo__store_get(s, key, IO_TIMEOUT_S, &text, err) == KOLO_OK)
        snprintf(out->update, sizeof(out->update), "%.*s",
                 (int)strcspn(text, " \r\n"), text);
    rc = KOLO_OK;
out:
    free(text);
    kolo__store_close(s);
    if (rc == KOLO_OK)
        kolo__err_clear(err);
    return rc;
}

/* kolo_hosts_updated() runs at every commit: one store, kept open. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static kolo__store_t *g_store;
static char g_where[4096];

static int update_bits(const char *word)
{
    if (strncmp(word, "removed", 7) == 0)
        return KOLO__ELASTIC_REMOVED;
    if (strncmp(word, "added", 5) == 0)
        return KOLO__ELASTIC_ADDED;
    return KOLO__ELASTIC_REMOVED | KOLO__ELASTIC_ADDED;
}

int kolo__elastic_updates(const char *rendezvous, unsigned joined)
{
    kolo__err_t err;
    unsigned g = 0;
    int bits = 0, rc;

    pthread_mutex_lock(&g_mu);
    if (g_store != NULL && strcmp(g_where, rendezvous) != 0) {
        kolo__store_close(g_store);
        g_store = NULL;
    }
    if (g_store == NULL) {
        rc = kolo__store_open(rendezvous, IO_TIMEOUT_S, &g_store, &err);
        if (rc != KOLO_OK) {
            g_store = NULL;
            goto out;
        }
        snprintf(g_where, sizeof(g_where), "%s", rendezvous);
    }
    rc = read_generation(g_store, &g, &err);
    for (unsigned k = joined + 1; rc == KOLO_OK && k <= g; k++) {
        char key[64], *text = NULL;
        snprintf(key, sizeof(key), "elastic/%u/update", k);
        if (kolo__store_get(g_store, key, 0, &text, &err) == KOLO_OK) {
            bits |= update_bits(text);
            free(text);
        } else {
            bits |= KOLO__ELASTIC_REMOVED | KOLO__ELASTIC_ADDED;
        }
    }
    if (rc != KOLO_OK) {
        /* A broken connection is not kept: the next look reconnects. */
        kolo__store_close(g_store);
        g_store = NULL;
    }
out:
    pthread_mutex_unlock(&g_mu);
    return rc != KOLO_OK ? rc : bits;
}

void kolo__elastic_close(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_store != NULL)
        kolo__store_close(g_store);
    g_store = NULL;
    pthread_mutex_unlock(&g_mu);
}
