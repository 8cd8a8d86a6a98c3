/*
 * agree.c — agreement among all ranks before a backend connects.
 *
 * Some things are only safe when every rank has them the same: the
 * settings that decide which backend connects, how tensors are fused and
 * cut, the size of the response cache (negotiate.c), the message format;
 * and the members of a process set about to connect. A rank that differs
 * must not get as far as a backend: there it would wait for peers that
 * never come, or exchange buffers whose sizes the others do not expect
 * (wrong sums, or a Gloo assertion in a thread where nothing can catch it).
 *
 * So each rank publishes a text and the ranks agree on a verdict:
 *  - Under a rendezvous store (store.c: file or Redis), rank r sets
 *    kolo<gen>/agree/<topic>/<r>. Rank 0 waits for every rank's text (up to
 *    KOLO_START_TIMEOUT), judges them, and sets .../verdict to "CODE
 *    MESSAGE". The others wait for that verdict and return it, so every
 *    rank fails, or goes on, together. A rank that waited for the verdict
 *    in vain looks at which texts are there: missing ones are ranks that
 *    never arrived; when all are there rank 0 is only slow, and it waits
 *    once more for up to KOLO_TIMEOUT_SECONDS.
 *  - Under mpirun, MPI is up before anything else: the texts are gathered
 *    with MPI_Allgather and every rank judges them itself.
 * A job of one rank agrees with itself.
 */
#include "config.h"

#include "alloc.h"
#include "agree.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/mpienv.h"
#include "store.h"

/* "0, 2, 5" for ranks[n] (after eight: "... and 3 more"). */
static void list_ranks(const int *ranks, int n, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        int k;
        if (i == 8 && n > 9) {
            snprintf(out + used, len - used, " and %d more", n - i);
            return;
        }
        k = snprintf(out + used, len - used, "%s%d", i ? ", " : "", ranks[i]);
        if (k < 0 || (size_t)k >= len - used)
            return;
        used += (size_t)k;
    }
}

/* The value of line "name=..." in text into out ("(not set)" if none). */
static void field(const char *text, const char *name, char *out, size_t len)
{
    size_t nl = strlen(name);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t vl = strcspn(p + nl + 1, "\n");
            snprintf(out, len, "%.*s", (int)(vl < len ? vl : len - 1), p + nl + 1);
            return;
        }
    }
    snprintf(out, len, "(unknown to this kolo)");
}

/* The first name (in rank 0's order, then the others') whose value is
 * not the same on every rank, or 0. */
static int first_difference(char *const *texts, int n, char *name, size_t len)
{
    char a[512], b[512];
    for (int r = 0; r < n; r++) {
        for (const char *p = texts[r]; *p; ) {
            size_t l = strcspn(p, "=\n");
            snprintf(name, len, "%.*s", (int)(l < len ? l : len - 1), p);
            field(texts[0], name, a, sizeof(a));
            for (int q = 1; q < n; q++) {
                field(texts[q], name, b, sizeof(b));
                if (strcmp(a, b) != 0)
                    return 1;
            }
            p += strcspn(p, "\n");
            if (*p == '\n')
                p++;
        }
    }
    return 0;
}

int kolo__agree_settings(char *const *texts, int n, void *arg, kolo__err_t *err)
{
    char name[128], msg[KOLO__ERR_LEN], v[512], ranks_txt[160];
    char (*values)[512];
    int *ranks, *which, nvalues = 0;
    size_t used;

    (void)arg;
    if (!first_difference(texts, n, name, sizeof(name)))
        return KOLO_OK;
    values = kolo__malloc((size_t)n * sizeof(*values));
    ranks = kolo__malloc((size_t)n * sizeof(int));
    which = kolo__malloc((size_t)n * sizeof(int));
    if (values == NULL || ranks == NULL || which == NULL) {
        free(values);
        free(ranks);
        free(which);
        return kolo__err_set(err, KOLO_ERR_CONFIG, "%s differs across ranks",
                             name);
    }
    /* Group the ranks by value, in the order values first appear. */
    for (int r = 0; r < n; r++) {
        int k;
        field(texts[r], name, v, sizeof(v));
        for (k = 0; k < nvalues && strcmp(values[k], v) != 0; k++)
            ;
        if (k == nvalues)
            memcpy(values[nvalues++], v, sizeof(v));
        which[r] = k;
    }
    used = (size_t)snprintf(msg, sizeof(msg), "the ranks' settings differ: %s is",
                            name);
    for (int k = 0; k < nvalues && used < sizeof(msg); k++) {
        int m = 0;
        for (int r = 0; r < n; r++)
            if (which[r] == k)
                ranks[m++] = r;
        list_ranks(ranks, m, ranks_txt, sizeof(ranks_txt));
        used += (size_t)snprintf(msg + used, sizeof(msg) - used, "%s %s on rank%s %s",
                                 k == 0 ? "" : k == nvalues - 1 ? " and" : ",",
                                 values[k], m > 1 ? "s" : "", ranks_txt);
    }
    free(values);
    free(ranks);
    free(which);
    return kolo__err_set(err, KOLO_ERR_CONFIG,
                         "%s; it must be the same on every rank (it decides "
                         "what goes on the wire or how work is cut)", msg);
}

/* ---- the exchange ----------------------------------------------------------- */

/* "rank R: ", what goes before this rank's message of its own failure,
 * or "" when the message already begins with "rank R". */
static const char *who_failed(const kolo__config_t *cfg, const char *msg,
                              char *buf, size_t len)
{
    int n = snprintf(buf, len, "rank %lld", (long long)cfg->rank);
    if (n > 0 && strncmp(msg, buf, (size_t)n) == 0 &&
        (msg[n] == ' ' || msg[n] == ':'))
        return "";
    snprintf(buf, len, "rank %lld: ", (long long)cfg->rank);
    return buf;
}

/* The first byte of a rank's text when it failed instead of taking part:
 * "!CODE MESSAGE" (no text of a judge starts so). */
#define FAILED_MARK '!'

static void key_of(char *out, size_t len, unsigned gen, const char *topic,
                   const char *who)
{
    snprintf(out, len, "kolo%u/agree/%s/%s", gen, topic, who);
}

/* The ranks (of n) whose text is not in the store, as "2, 3"; how many. */
static int missing_ranks(kolo__store_t *st, unsigned gen, const char *topic,
                         int n, char *out, size_t len)
{
    char key[256], who[16];
    int *miss = kolo__calloc((size_t)n, sizeof(int)), m = 0;
    kolo__err_t e;

    out[0] = '\0';
    if (miss == NULL)
        return 0;
    for (int r = 0; r < n; r++) {
        char *v = NULL;
        snprintf(who, sizeof(who), "%d", r);
        key_of(key, sizeof(key), gen, topic, who);
        if (kolo__store_get(st, key, 0, &v, &e) == KOLO_ERR_TIMEOUT)
            miss[m++] = r;
        free(v);
    }
    list_ranks(miss, m, out, len);
    free(miss);
    return m;
}

/* In an elastic job: whether kolorun published a newer membership than
 * `gen` (elastic.c), which the ranks being waited for have gone to. */
static int overtaken(const kolo__config_t *cfg, kolo__store_t *st,
                     unsigned gen, kolo__err_t *err)
{
    char *text = NULL;
    kolo__err_t e;
    unsigned newest;

    if (!cfg->elastic ||
        kolo__store_get(st, "elastic/generation", 0, &text, &e) != KOLO_OK)
        return 0;
    newest = (unsigned)strtoul(text, NULL, 10);
    free(text);
    if (newest <= gen)
        return 0;
    kolo__err_set(err, KOLO_ERR_MEMBERSHIP, "rank %lld of %lld: generation "
                  "%u of the elastic job was published while generation %u "
                  "formed; join the new one (kolo_init again)",
                  (long long)cfg->rank, (long long)cfg->size, newest, gen);
    return 1;
}

/* kolo__store_get; in an elastic job, given up (KOLO_ERR_MEMBERSHIP) as
 * soon as a newer membership is published. */
static int wait_key(const kolo__config_t *cfg, kolo__store_t *st,
                    unsigned gen, const char *key, double wait_s,
                    char **value, kolo__err_t *err)
{
    int64_t deadline = kolo__now_us() + (int64_t)(wait_s * 1e6);

    if (!cfg->elastic)
        return kolo__store_get(st, key, wait_s, value, err);
    for (;;) {
        double left = (double)(deadline - kolo__now_us()) / 1e6;
        int rc = kolo__store_get(st, key, left < 0.2 ? (left > 0 ? left : 0)
                                                      : 0.2, value, err);
        if (rc != KOLO_ERR_TIMEOUT)
            return rc;
        if (overtaken(cfg, st, gen, err))
            return KOLO_ERR_MEMBERSHIP;
        if (left <= 0.2)
            return KOLO_ERR_TIMEOUT;
    }
}

static int never_arrived(const kolo__config_t *cfg, const char *list, int m,
                         kolo__err_t *err)
{
    return kolo__err_set(err, KOLO_ERR_TIMEOUT,
                         "rank %lld of %lld could not join the job: rank%s %s "
                         "never arrived (waited %g s, KOLO_START_TIMEOUT)",
                         (long long)cfg->rank, (long long)cfg->size,
                         m > 1 ? "s" : "", list, cfg->start_timeout_s);
}

/* Rank 0 publishes the verdict, "RC MESSAGE", through the store it
 * holds and from a buffer of its own: every other rank waits for it, so
 * a verdict that is not published (memory ran out) must not let rank 0
 * go on alone while they wait out their timeouts; it fails instead. */
static int publish_verdict(const kolo__config_t *cfg, kolo__store_t *st,
                           unsigned gen, const char *topic, int rc,
                           const char *msg, kolo__err_t *err)
{
    char key[256], verdict[KOLO__ERR_LEN + 16];
    kolo__err_t e;

    snprintf(verdict, sizeof(verdict), "%d %s", rc, msg);
    key_of(key, sizeof(key), gen, topic, "verdict");
    if (kolo__store_set(st, key, verdict, strlen(verdict), &e) == KOLO_OK)
        return KOLO_OK;
    return kolo__err_set(err, e.code, "rank %lld: cannot publish the "
                         "verdict on %s: %s", (long long)cfg->rank, topic,
                         e.msg);
}

/* Rank 0's own failure while judging (memory, the store) is the verdict:
 * the others return it ("rank 0: out of memory reading ...") instead of
 * waiting for one. A newer elastic membership is not: they see it too. */
static int judge_failed(const kolo__config_t *cfg, kolo__store_t *st,
                        unsigned gen, const char *topic, kolo__err_t *err)
{
    char self[32], msg[KOLO__ERR_LEN + 32];
    kolo__err_t e;

    if (err->code != KOLO_ERR_MEMBERSHIP) {
        snprintf(msg, sizeof(msg), "%s%s",
                 who_failed(cfg, err->msg, self, sizeof(self)), err->msg);
        if (publish_verdict(cfg, st, gen, topic, err->code, msg, &e) != KOLO_OK)
            kolo__debug("cannot tell the other ranks why: %s", e.msg);
    }
    return err->code;
}

/* Rank 0: every rank's text (texts[r], NULL for those that did not come
 * within KOLO_START_TIMEOUT, listed in miss[*m]). */
static int collect_texts(const kolo__config_t *cfg, kolo__store_t *st,
                         unsigned gen, const char *topic, char **texts,
                         int *miss, int *m, kolo__err_t *err)
{
    int64_t deadline = kolo__now_us() + (int64_t)(cfg->start_timeout_s * 1e6);
    char key[256], who[16];
    int rc = KOLO_OK;

    for (int r = 0; r < (int)cfg->size && rc == KOLO_OK; r++) {
        snprintf(who, sizeof(who), "%d", r);
        key_of(key, sizeof(key), gen, topic, who);
        /* The start timeout is one budget for all ranks, not one each. */
        int64_t left = deadline - kolo__now_us();
        rc = wait_key(cfg, st, gen, key, left > 0 ? (double)left / 1e6 : 0,
                      &texts[r], err);
        if (rc == KOLO_ERR_TIMEOUT) {
            miss[(*m)++] = r;
            rc = KOLO_OK;
        }
    }
    return rc;
}

/* Rank 0's verdict on the texts collected: a rank's failure, the ranks
 * that never arrived, or the judge's. */
static int decide(const kolo__config_t *cfg, char **texts, const int *miss,
                  int m, kolo__agree_judge_fn judge, void *arg,
                  kolo__err_t *verdict)
{
    int n = (int)cfg->size;

    for (int r = 0; r < n; r++)
        if (texts[r] != NULL && texts[r][0] == FAILED_MARK) {
            /* A rank that failed before it could take part (agree.h:
             * kolo__agree_failed): its reason is every rank's. */
            const char *sp = strchr(texts[r], ' ');
            int code = atoi(texts[r] + 1);
            return kolo__err_set(verdict, code != KOLO_OK ? code : KOLO_ERR_INTERNAL,
                                 "%s", sp != NULL ? sp + 1 : texts[r] + 1);
        }
    if (m > 0) {
        char list[160];
        list_ranks(miss, m, list, sizeof(list));
        return never_arrived(cfg, list, m, verdict);
    }
    return judge(texts, n, arg, verdict);
}

/* Rank 0: waits for every text, judges, publishes the verdict. */
static int judge_all(const kolo__config_t *cfg, kolo__store_t *st, unsigned gen,
                     const char *topic, kolo__agree_judge_fn judge, void *arg,
                     kolo__err_t *err)
{
    int n = (int)cfg->size, rc, m = 0;
    char **texts = kolo__calloc((size_t)n, sizeof(char *));
    int *miss = kolo__calloc((size_t)n, sizeof(int));
    kolo__err_t verdict_err;

    kolo__err_clear(&verdict_err);
    if (texts == NULL || miss == NULL) {
        free(texts);
        free(miss);
        kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory agreeing "
                      "on %s", topic);
        return judge_failed(cfg, st, gen, topic, err);
    }
    rc = collect_texts(cfg, st, gen, topic, texts, miss, &m, err);
    if (rc != KOLO_OK) {
        judge_failed(cfg, st, gen, topic, err);
    } else {
        kolo__err_t unpublished;
        rc = decide(cfg, texts, miss, m, judge, arg, &verdict_err);
        if (publish_verdict(cfg, st, gen, topic, rc, verdict_err.msg,
                            &unpublished) != KOLO_OK && rc == KOLO_OK) {
            verdict_err = unpublished; /* not going on alone */
            rc = unpublished.code;
        }
        if (rc != KOLO_OK)
            *err = verdict_err;
    }
    for (int r = 0; r < n; r++)
        free(texts[r]);
    free(texts);
    free(miss);
    return rc;
}

/* Ranks other than 0: the verdict. */
static int await_verdict(const kolo__config_t *cfg, kolo__store_t *st,
                         unsigned gen, const char *topic, kolo__err_t *err)
{
    char key[256], list[160], *verdict = NULL, *sp;
    int rc, m;

    key_of(key, sizeof(key), gen, topic, "verdict");
    rc = wait_key(cfg, st, gen, key, cfg->start_timeout_s, &verdict, err);
    if (rc == KOLO_ERR_TIMEOUT) {
        m = missing_ranks(st, gen, topic, (int)cfg->size, list, sizeof(list));
        if (m > 0)
            return never_arrived(cfg, list, m, err);
        /* Everyone is there: rank 0 is slow, not gone. */
        rc = wait_key(cfg, st, gen, key, cfg->timeout_s, &verdict, err);
        if (rc == KOLO_ERR_TIMEOUT)
            return kolo__err_set(err, KOLO_ERR_TIMEOUT,
                                 "rank %lld of %lld: every rank arrived, but "
                                 "rank 0 gave no verdict on %s within %g s",
                                 (long long)cfg->rank, (long long)cfg->size,
                                 topic, cfg->start_timeout_s + cfg->timeout_s);
    }
    if (rc != KOLO_OK)
        return rc;
    rc = atoi(verdict);
    sp = strchr(verdict, ' ');
    if (rc != KOLO_OK)
        kolo__err_set(err, rc, "%s", sp != NULL ? sp + 1 : verdict);
    free(verdict);
    return rc;
}

#ifdef KOLO_HAVE_MPI
static int agree_mpi(const kolo__config_t *cfg, const char *mine,
                     kolo__agree_judge_fn judge, void *arg, kolo__err_t *err)
{
    int n = (int)cfg->size, rc;
    char *all = kolo__calloc((size_t)n, KOLO__AGREE_MAX);
    char *own = kolo__calloc(1, KOLO__AGREE_MAX);
    char **texts = kolo__calloc((size_t)n, sizeof(char *));

    if (all == NULL || own == NULL || texts == NULL) {
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    snprintf(own, KOLO__AGREE_MAX, "%s", mine);
    {
        char why[KOLO__ERR_LEN];
        rc = kolo__mpienv_allgather(own, KOLO__AGREE_MAX, all, why,
                                    sizeof(why));
        if (rc != KOLO_OK)
            kolo__err_set(err, rc, "%s", why);
    }
    for (int r = 0; r < n; r++) {
        texts[r] = all + (size_t)r * KOLO__AGREE_MAX;
        texts[r][KOLO__AGREE_MAX - 1] = '\0';
    }
    if (rc == KOLO_OK)
        rc = judge(texts, n, arg, err);
out:
    free(all);
    free(own);
    free(texts);
    return rc;
}
#endif

/* kolo__agree; own (or NULL): this rank's failure, which its text
 * carries, told the others (and returned) in place of the store's when
 * its text cannot be published (memory ran out opening the store): what
 * it failed at, not what it then could not do. */
static int agree(const kolo__config_t *cfg, unsigned gen, const char *topic,
                 const char *mine, kolo__agree_judge_fn judge, void *arg,
                 const kolo__err_t *own, kolo__err_t *err)
{
    kolo__store_t *st = NULL;
    char key[256], who[16];
    int rc;

    if (cfg->size == 1) {
        char *text = kolo__strdup(mine);
        if (text == NULL)
            return kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory "
                                 "agreeing on %s", topic);
        rc = judge(&text, 1, arg, err);
        free(text);
        return rc;
    }
#ifdef KOLO_HAVE_MPI
    if (cfg->mpi_launched)
        return agree_mpi(cfg, mine, judge, arg, err);
#endif
    rc = kolo__store_open(cfg->rendezvous, cfg->timeout_s, &st, err);
    if (rc == KOLO_OK) {
        snprintf(who, sizeof(who), "%lld", (long long)cfg->rank);
        key_of(key, sizeof(key), gen, topic, who);
        rc = kolo__store_set(st, key, mine, strlen(mine), err);
        if (rc == KOLO_OK) {
            rc = cfg->rank == 0 ? judge_all(cfg, st, gen, topic, judge, arg, err)
                                : await_verdict(cfg, st, gen, topic, err);
            kolo__store_close(st);
            return rc;
        }
        kolo__store_close(st);
    }
    /* This rank's text is not there: the others would wait for it. */
    if (own != NULL) {
        char self[32];
        const char *prefix = who_failed(cfg, own->msg, self, sizeof(self));
        rc = kolo__err_set(err, own->code, "%s%s", prefix, own->msg);
    }
    kolo__agree_failed(cfg, gen, topic, err);
    return rc;
}

int kolo__agree(const kolo__config_t *cfg, unsigned gen, const char *topic,
                const char *mine, kolo__agree_judge_fn judge, void *arg,
                kolo__err_t *err)
{
    return agree(cfg, gen, topic, mine, judge, arg, NULL, err);
}

/* One descriptor kept for telling the others: a rank that failed for
 * want of descriptors (ulimit -n) could not open the store to say so. */
static int g_reserve = -1;

void kolo__agree_reserve(void)
{
    if (g_reserve < 0)
        g_reserve = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void kolo__agree_release(void)
{
    if (g_reserve >= 0)
        close(g_reserve);
    g_reserve = -1;
}

void kolo__agree_failed(const kolo__config_t *cfg, unsigned gen,
                        const char *topic, const kolo__err_t *why)
{
    char key[256], who[16], text[KOLO__ERR_LEN + 64];
    kolo__err_t e;
    int len;

    kolo__agree_release();
    if (cfg->size == 1 || cfg->mpi_launched || cfg->rendezvous[0] == '\0')
        return; /* under MPI the launcher ends the job */
    /* Rank 0 judges: its failure is the verdict itself. */
    char self[32], mark[2] = {FAILED_MARK, '\0'};

    if (cfg->rank == 0)
        snprintf(who, sizeof(who), "verdict");
    else
        snprintf(who, sizeof(who), "%lld", (long long)cfg->rank);
    len = snprintf(text, sizeof(text), "%s%d %s%s", cfg->rank == 0 ? "" : mark,
                   why->code != KOLO_OK ? why->code : KOLO_ERR_INTERNAL,
                   who_failed(cfg, why->msg, self, sizeof(self)), why->msg);
    key_of(key, sizeof(key), gen, topic, who);
    /* (without allocating where it can: this rank may be out of memory) */
    if (len > 0 && kolo__store_set_once(cfg->rendezvous, cfg->timeout_s, key,
                                        text, strlen(text), &e) != KOLO_OK)
        kolo__debug("cannot tell the other ranks why: %s", e.msg);
}

/* ---- the outcome of a connection ------------------------------------------ */

/* An outcome text: "RC GAVE_UP MESSAGE"; GAVE_UP is 1 when this rank only
 * stopped because a peer had failed. */
#define GAVE_UP_PREFIX "a peer failed first: "

void kolo__outcome_init(kolo__outcome_t *o, const kolo__config_t *cfg,
                        unsigned gen, const char *topic, const int *members,
                        int n)
{
    memset(o, 0, sizeof(*o));
    o->cfg = cfg;
    o->gen = gen;
    snprintf(o->topic, sizeof(o->topic), "%s", topic);
    o->members = members;
    o->n = n;
}

int kolo__outcome_abandoned(void *arg, char *why, size_t len)
{
    kolo__outcome_t *o = arg;
    char key[256], who[16];
    kolo__err_t e;

    if (o->cfg->mpi_launched && strncmp(o->cfg->rendezvous, "mpi:", 4) == 0)
        return 0; /* no store to look in */
    if (o->store == NULL &&
        kolo__store_open(o->cfg->rendezvous, o->cfg->timeout_s, &o->store,
                         &e) != KOLO_OK)
        return 0;
    if (overtaken(o->cfg, o->store, o->gen, &e)) {
        snprintf(why, len, "%s", e.msg);
        return 1;
    }
    {
        /* Rank 0 decided already: it failed before it could connect. */
        char *text = NULL;
        key_of(key, sizeof(key), o->gen, o->topic, "verdict");
        if (kolo__store_get(o->store, key, 0, &text, &e) == KOLO_OK &&
            atoi(text) != KOLO_OK && strchr(text, ' ') != NULL) {
            snprintf(why, len, "%s%s", GAVE_UP_PREFIX, strchr(text, ' ') + 1);
            free(text);
            return 1;
        }
        free(text);
    }
    for (int i = 0; i < o->n; i++) {
        char *text = NULL, *msg;
        int rc;
        if (o->members[i] == (int)o->cfg->rank)
            continue;
        snprintf(who, sizeof(who), "%d", o->members[i]);
        key_of(key, sizeof(key), o->gen, o->topic, who);
        if (kolo__store_get(o->store, key, 0, &text, &e) != KOLO_OK)
            continue;
        if (text[0] == FAILED_MARK) {
            /* It failed before it could connect (kolo__agree_failed). */
            msg = strchr(text, ' ');
            snprintf(why, len, "%s%s", GAVE_UP_PREFIX,
                     msg != NULL ? msg + 1 : text + 1);
            free(text);
            return 1;
        }
        rc = atoi(text);
        msg = strchr(text, ' ');
        if (rc != KOLO_OK && msg != NULL && strlen(msg) >= 3) {
            snprintf(why, len, "%s%s",
                     strstr(msg + 3, GAVE_UP_PREFIX) ? "" : GAVE_UP_PREFIX,
                     msg + 3);
            free(text);
            return 1;
        }
        free(text);
    }
    return 0;
}

static int judge_outcome(char *const *texts, int n, void *arg, kolo__err_t *err)
{
    int pick = -1, best = 0;

    (void)arg;
    /* The cause, not its echoes: a member's own failure before one that
     * lost a peer or timed out waiting (what the others see when one rank
     * fails and closes its sockets), before one that only gave up. */
    for (int r = 0; r < n; r++) {
        const char *sp = strchr(texts[r], ' ');
        int code = atoi(texts[r]), rank;
        if (code == KOLO_OK || sp == NULL)
            continue;
        rank = sp[1] == '1' ? 1
               : code == KOLO_ERR_RANK_LOST || code == KOLO_ERR_TIMEOUT ? 2
                                                                         : 3;
        if (rank > best) {
            best = rank;
            pick = r;
        }
    }
    if (pick < 0)
        return KOLO_OK;
    return kolo__err_set(err, atoi(texts[pick]), "%s", strchr(texts[pick], ' ') + 3);
}

int kolo__outcome_agree(kolo__outcome_t *o, int rc, const kolo__err_t *mine,
                        kolo__err_t *err)
{
    /* (on the stack: a member that ran out of memory connecting must
     * still say what for, not only that it could not agree) */
    char text[KOLO__ERR_LEN + 64];
    int gave_up = rc != KOLO_OK &&
                  strstr(mine->msg, GAVE_UP_PREFIX) != NULL;

    if (o->store != NULL) {
        kolo__store_close(o->store);
        o->store = NULL;
    }
    if (rc != KOLO_OK)
        kolo__agree_release();
    o->agreed = 1;
    if (rc == KOLO_OK) {
        snprintf(text, sizeof(text), "%d 0 ", rc);
    } else {
        /* Every rank returns the message that wins: it names the rank it
         * comes from ("rank 1: out of memory creating process set 0"). */
        char self[32];
        snprintf(text, sizeof(text), "%d %d %s%s", rc, gave_up,
                 gave_up ? "" : who_failed(o->cfg, mine->msg, self, sizeof(self)),
                 mine->msg);
    }
    return agree(o->cfg, o->gen, o->topic, text, judge_outcome, NULL,
                 rc != KOLO_OK && !gave_up ? mine : NULL, err);
}
