/*
 * api.c — the public C API (kolo.h) outside the collectives: init and
 * shutdown, ranks, handles, process sets, and error strings. The
 * collectives are enqueued in enqueue.c.
 *
 * Locks: g_mu guards the runtime pointer, the process-set table (with
 * sets_mu, which the global set's thread also takes) and the accumulators;
 * init and shutdown hold it throughout, so an enqueue racing a shutdown
 * either completes before it or sees "not initialized". Waiting on a handle
 * takes only the handle table's lock, which the background threads need to
 * complete handles, so a waiter never blocks init or shutdown.
 */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc.h"
#include "agree.h"
#include "built.h"
#include "elastic.h"
#include "api.h"
#include "flight.h"
#include "launchenv.h"
#include "mpi/mpienv.h"
#include "peers.h"
#include "rdvserver.h"
#include "timeline.h"
#include "reduce.h"
#include "passes.h"
#include "pset.h"
#include "runtime.h"
#include "watchdog.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static kolo__runtime_t *g_rt;
static unsigned g_generation;
static atomic_int g_rank = -1, g_size = -1, g_local_rank = -1,
                  g_local_size = -1, g_cross_rank = -1, g_cross_size = -1;

static kolo__handles_t g_handles;
static pthread_once_t g_handles_once = PTHREAD_ONCE_INIT;
static int g_handles_ok;

static _Thread_local char t_last_error[KOLO__ERR_LEN];

static void handles_init_once(void)
{
    g_handles_ok = kolo__handles_init(&g_handles) == 0;
}

kolo__handles_t *kolo__api_handles(void)
{
    pthread_once(&g_handles_once, handles_init_once);
    return g_handles_ok ? &g_handles : NULL;
}

/* Every public function that fails returns through here, so that
 * kolo_last_error() always describes the latest failure. */
int kolo__api_fail(const kolo__err_t *err)
{
    strcpy(t_last_error, err->msg[0] ? err->msg : kolo_strerror(err->code));
    kolo__peers_note_cause(err->code, t_last_error);
    return err->code;
}

int kolo__api_failf(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_last_error, sizeof(t_last_error), fmt, ap);
    va_end(ap);
    kolo__peers_note_cause(code, t_last_error);
    return code;
}

const char *kolo_last_error(void) { return t_last_error; }

kolo__runtime_t *kolo__api_enter(const char *what, kolo__err_t *err)
{
    pthread_mutex_lock(&g_mu);
    if (g_rt == NULL) {
        pthread_mutex_unlock(&g_mu);
        kolo__err_set(err, KOLO_ERR_NOT_INITIALIZED,
                      "%s: kolo is not initialized (call kolo_init first)",
                      what);
        return NULL;
    }
    return g_rt;
}

void kolo__api_leave(void) { pthread_mutex_unlock(&g_mu); }

kolo__pset_t *kolo__api_set(kolo__runtime_t *rt, int id, const char *what,
                            kolo__err_t *err)
{
    if (id < 0 || id >= rt->nsets || rt->set_sizes[id] == 0) {
        kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                      "%s: process set %d does not exist%s", what, id,
                      id > 0 && id < rt->nsets ? " (it was removed)" : "");
        return NULL;
    }
    if (rt->sets[id] == NULL) {
        kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                      "%s: rank %d is not a member of process set %d",
                      what, rt->rank, id);
        return NULL;
    }
    return rt->sets[id];
}

/* ---- life cycle ----------------------------------------------------------- */

/* The variables kolo_init reads: the environment, except where a job
 * started by mpirun supplies them from MPI (mpi_configure), or one started
 * by torchrun or srun from their variables (launcher_configure). */
static struct {
    const char *name;
    char value[4200];
} g_env_override[12];
static int g_env_noverride;
/* An elastic job: the generation this process joined last (0: none yet),
 * and its place in it. */
static kolo__elastic_place_t g_elastic;

/* torchrun or srun: rank 0 serves the rendezvous at g_serve's host, port
 * and job, the others wait for it there (after the configuration is read:
 * KOLO_START_TIMEOUT bounds the wait). port 0: no such job, or the user
 * named a rendezvous. */
static kolo__launchenv_t g_serve;

static const char *env_get(const char *name)
{
    for (int i = 0; i < g_env_noverride; i++)
        if (strcmp(g_env_override[i].name, name) == 0)
            return g_env_override[i].value;
    return getenv(name);
}

static void env_override(const char *name, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void env_override(const char *name, const char *fmt, ...)
{
    va_list ap;
    if (g_env_noverride >= (int)(sizeof(g_env_override) / sizeof(g_env_override[0])))
        return;
    g_env_override[g_env_noverride].name = name;
    va_start(ap, fmt);
    vsnprintf(g_env_override[g_env_noverride].value,
              sizeof(g_env_override[0].value), fmt, ap);
    va_end(ap);
    g_env_noverride++;
}

#ifdef KOLO_HAVE_MPI
static int wants_gloo(const char *var)
{
    const char *v = getenv(var);
    return v != NULL && strcmp(v, "gloo") == 0;
}
#endif

static const char *plain_getenv(const char *name) { return getenv(name); }

/* A launcher's (or the elastic membership's) placement of this rank, in
 * place of the KOLO_* placement variables. */
static void override_place(int rank, int size, int local_rank, int local_size,
                           int cross_rank, int cross_size)
{
    env_override("KOLO_RANK", "%d", rank);
    env_override("KOLO_SIZE", "%d", size);
    env_override("KOLO_LOCAL_RANK", "%d", local_rank);
    env_override("KOLO_LOCAL_SIZE", "%d", local_size);
    env_override("KOLO_CROSS_RANK", "%d", cross_rank);
    env_override("KOLO_CROSS_SIZE", "%d", cross_size);
}

/* A job started by torchrun or by srun without MPI (launchenv.c): the
 * ranks take their places from the launcher's variables, and meet at the
 * rendezvous rank 0 serves unless KOLO_RENDEZVOUS names one. */
static int launcher_configure(kolo__err_t *err)
{
    kolo__launchenv_t le;
    const char *rdv = getenv("KOLO_RENDEZVOUS");
    int rc = kolo__launchenv_detect(plain_getenv, &le, err);

    if (rc <= 0)
        return rc;
    override_place(le.rank, le.size, le.local_rank, le.local_size,
                   le.cross_rank, le.cross_size);
    if ((rdv == NULL || rdv[0] == '\0') && le.size > 1) {
        env_override("KOLO_RENDEZVOUS", "%s", le.rendezvous);
        g_serve = le;
    }
    /* Peers on other nodes must reach this rank's transport. */
    if (kolo__config_get("KOLO_HOSTNAME", plain_getenv) == NULL &&
        kolo__config_get("KOLO_NETWORK_INTERFACE", plain_getenv) == NULL &&
        le.cross_size > 1) {
        char host[256] = "";
        if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0')
            env_override("KOLO_HOSTNAME", "%s", host);
    }
    kolo__debug("started by %s: rank %d of %d, local rank %d of %d, node %d "
                "of %d", le.launcher, le.rank, le.size, le.local_rank,
                le.local_size, le.cross_rank, le.cross_size);
    return KOLO_OK;
}

/* Rank 0 of a job started by torchrun or srun serves the rendezvous; the
 * others wait until it answers, for at most KOLO_START_TIMEOUT. Where the
 * launcher's port was taken, rank 0 serves on one of the next ones
 * (rdvserver.c), and every rank's KOLO_RENDEZVOUS says the one found. */
static int serve_rendezvous(kolo__config_t *cfg, const uint8_t *job_key,
                            kolo__err_t *err)
{
    const kolo__launchenv_t *le = &g_serve;
    int port = 0;

    if (le->port == 0)
        return KOLO_OK;
    if (cfg->rank == 0)
        KOLO__CHECK(kolo__rdvserver_start(le->port, le->job, job_key,
                                          le->where, &port, err));
    else
        KOLO__CHECK(kolo__rdvserver_wait(le->host, le->port, le->job,
                                         cfg->start_timeout_s, le->where,
                                         &port, err));
    if (port == le->port)
        return KOLO_OK;
    kolo__launchenv_rendezvous(le, port, cfg->rendezvous,
                               sizeof(cfg->rendezvous));
    env_override("KOLO_RENDEZVOUS", "%s", cfg->rendezvous);
    kolo__debug("port %d was taken: the job's rendezvous is %s", le->port,
                cfg->rendezvous);
    return KOLO_OK;
}

/* An elastic job (KOLO_ELASTIC=1): the place comes from the newest
 * generation kolorun published that includes this worker (elastic.c). */
static int elastic_configure(int *elastic, kolo__err_t *err)
{
    const char *on = kolo__config_get("KOLO_ELASTIC", plain_getenv);
    const char *id = kolo__config_get("KOLO_ELASTIC_ID", plain_getenv);
    const char *t = kolo__config_get("KOLO_ELASTIC_TIMEOUT", plain_getenv);
    const char *rdv = getenv("KOLO_RENDEZVOUS");
    /* kolorun ends the job at --elastic-timeout and writes why in the
     * store; the worker's own bound comes a little later, so that it reads
     * that reason instead of giving up at the same moment. */
    double timeout_s = (t != NULL && atof(t) > 0 ? atof(t) : 600) + 5;
    kolo__elastic_place_t p;

    *elastic = on != NULL && strcmp(on, "1") == 0;
    if (!*elastic)
        return KOLO_OK;
    if (rdv == NULL || rdv[0] == '\0')
        return kolo__err_set(err, KOLO_ERR_CONFIG, "KOLO_ELASTIC=1 without "
                             "KOLO_RENDEZVOUS: elastic jobs are started by "
                             "kolorun --min-np or --host-discovery-script");
    KOLO__CHECK(kolo__elastic_join(rdv, id != NULL ? id : "",
                                   g_elastic.generation, timeout_s, &p, err));
    g_elastic = p;
    override_place(p.rank, p.size, p.local_rank, p.local_size,
                   p.cross_rank, p.cross_size);
    kolo__debug("elastic worker %s: rank %d of %d in generation %u (%s)",
                id, p.rank, p.size, p.generation, p.update);
    return KOLO_OK;
}

/* Where this process stands when kolorun did not start it (no KOLO_RANK,
 * KOLO_SIZE or their Horovod twins): from MPI under mpirun (or srun with
 * an MPI plugin), else from torchrun's or srun's variables, else a job of
 * one rank. Sets *mpi_launched. */
static int mpi_configure(int *mpi_launched, kolo__err_t *err)
{
    int launched_size = 0;

    *mpi_launched = 0;
    g_env_noverride = 0;
    memset(&g_serve, 0, sizeof(g_serve));
    if (kolo__config_get("KOLO_RANK", plain_getenv) != NULL ||
        kolo__config_get("KOLO_SIZE", plain_getenv) != NULL)
        return KOLO_OK;
    if (!kolo__launchenv_mpi(plain_getenv, &launched_size))
        return launcher_configure(err);
#ifdef KOLO_HAVE_MPI
    {
        kolo__mpienv_t m;
        const char *rdv = getenv("KOLO_RENDEZVOUS");
        int user_rdv = rdv != NULL && rdv[0] != '\0';
        char why[KOLO__ERR_LEN];
        int rc = kolo__mpienv_start(
            !user_rdv && (wants_gloo("KOLO_CONTROLLER") ||
                          wants_gloo("KOLO_CPU_OPERATIONS")),
            &m, why, sizeof(why));
        if (rc != KOLO_OK)
            return kolo__err_set(err, rc, "%s", why);
        override_place(m.rank, m.size, m.local_rank, m.local_size,
                       m.cross_rank, m.cross_size);
        if (!user_rdv)
            env_override("KOLO_RENDEZVOUS", "%s", m.rendezvous);
        /* Wake-up sockets across hosts need an address peers can reach. */
        if (getenv("KOLO_HOSTNAME") == NULL && m.cross_size > 1) {
            char host[256] = "";
            if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0')
                env_override("KOLO_HOSTNAME", "%s", host);
        }
        *mpi_launched = 1;
        return KOLO_OK;
    }
#else
    {
        /* srun with an MPI plugin also sets PMI's variables: without MPI,
         * Slurm's own say the same. */
        kolo__launchenv_t le;
        kolo__err_t ignored;
        if (kolo__launchenv_detect(plain_getenv, &le, &ignored) != 0)
            return launcher_configure(err);
    }
    if (launched_size > 1)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED,
                             "this process was started by an MPI launcher "
                             "as one of %d ranks, but this kolo was built "
                             "without MPI: rebuild it with --with-mpi, or "
                             "start the job with kolorun -np %d",
                             launched_size, launched_size);
    return KOLO_OK;
#endif
}

/* Room in the table for one more set, made before the ranks agree that it
 * connected: once they have, adding it cannot fail on one rank alone
 * (which would leave that rank without a set the others use). */
static int table_reserve(kolo__runtime_t *rt)
{
    kolo__pset_t **sets;
    int *sizes;

    pthread_mutex_lock(&rt->sets_mu);
    sets = kolo__realloc(rt->sets, (size_t)(rt->nsets + 1) * sizeof(*sets));
    if (sets != NULL)
        rt->sets = sets;
    sizes = kolo__realloc(rt->set_sizes, (size_t)(rt->nsets + 1) * sizeof(*sizes));
    if (sizes != NULL)
        rt->set_sizes = sizes;
    pthread_mutex_unlock(&rt->sets_mu);
    return sets != NULL && sizes != NULL ? 0 : -1;
}

/* Adds a set to the table (id = rt->nsets) in the room table_reserve
 * made; ps is NULL on non-members. */
static void table_add(kolo__runtime_t *rt, kolo__pset_t *ps, int size)
{
    pthread_mutex_lock(&rt->sets_mu);
    if (rt->nsets > 0)
        atomic_store(&rt->other_sets, 1);
    rt->sets[rt->nsets] = ps;
    rt->set_sizes[rt->nsets] = size;
    rt->nsets++;
    pthread_mutex_unlock(&rt->sets_mu);
}

/* Takes set id out of the table (the flight recorder's dumps read it) so
 * that it can be stopped and freed; NULL if it is not there. */
static kolo__pset_t *table_take(kolo__runtime_t *rt, int id)
{
    kolo__pset_t *ps;

    pthread_mutex_lock(&rt->sets_mu);
    ps = id < rt->nsets ? rt->sets[id] : NULL;
    if (ps != NULL)
        rt->sets[id] = NULL;
    pthread_mutex_unlock(&rt->sets_mu);
    return ps;
}

static void runtime_free(kolo__runtime_t *rt)
{
    kolo__timeline_free(rt->timeline);
    free(rt->sets);
    free(rt->host_of);
    free(rt->set_sizes);
    pthread_mutex_destroy(&rt->sets_mu);
    free(rt);
}

static void note_variable(const char *msg, void *arg)
{
    kolo__log(*(int *)arg == 0 ? KOLO__LOG_WARNING : KOLO__LOG_DEBUG, "%s", msg);
}

/* KOLO_* variables that kolo does not know are typos more often than
 * not, and a HOROVOD_* variable kolo cannot honour should not pass in
 * silence: say so once per kolo_init (env.c's kolo__config_scan; rank 0
 * warns, the others, whose environment is usually the same, at debug). */
static void warn_unknown_variables(int rank)
{
    extern char **environ;

    kolo__config_scan(environ, env_get, note_variable, &rank);
}

/* The settings every rank must share, compared before any backend
 * connects (agree.c): a rank with another fusion threshold, cache
 * capacity or backend would otherwise exchange buffers the others do not
 * expect, or wait for peers that are elsewhere. */
static int agree_settings(const kolo__runtime_t *rt, kolo__err_t *err)
{
    char build[256], names[128], *text;
    int rc;

    kolo__ops_names(names, sizeof(names));
    snprintf(build, sizeof(build), "%s, messages v%d, backends %s",
             PACKAGE_VERSION, KOLO__MSG_VERSION, names);
    if ((text = kolo__malloc(KOLO__AGREE_MAX)) == NULL) {
        kolo__err_set(err, KOLO_ERR_NO_MEMORY, "out of memory in kolo_init");
        kolo__agree_failed(&rt->cfg, rt->generation, "settings", err);
        return err->code;
    }
    kolo__config_agreed(&rt->cfg, build, text, KOLO__AGREE_MAX);
    rc = kolo__agree(&rt->cfg, rt->generation, "settings", text,
                     kolo__agree_settings, NULL, err);
    free(text);
    return rc;
}

/* A test seam (tests/multi/run-stranger.sh): with KOLO_TEST_HOLD_CONNECT
 * naming a FIFO, this rank waits between the agreement and the connection
 * until a line arrives there, so that a test can reach the listening
 * sockets of the ranks that went ahead. */
static void hold_for_test(void)
{
    const char *fifo = getenv("KOLO_TEST_HOLD_CONNECT");
    char line[16];
    FILE *f;

    if (fifo == NULL || fifo[0] == '\0' || (f = fopen(fifo, "r")) == NULL)
        return;
    if (fgets(line, sizeof(line), f) == NULL)
        kolo__debug("KOLO_TEST_HOLD_CONNECT: %s closed without a line", fifo);
    fclose(f);
}

/* A rank that exits without kolo_shutdown still announces it: the other
 * ranks then fail with "rank N has shut down" instead of a lost
 * connection. */
static void shutdown_at_exit(void)
{
    if (kolo_is_initialized()) {
        kolo__debug("the process exits without kolo_shutdown: shutting down");
        kolo_shutdown_at_exit(NULL);
    }
}

int kolo_shutdown_at_exit(const char *reason)
{
    if (!kolo_is_initialized())
        return kolo_shutdown(); /* (its refusal) */
    kolo__peers_note_exit(reason); /* (unless it failed: that says more) */
    return kolo_shutdown();
}

/* What kolo_init builds, step by step, and what its failure must undo
 * or tell the others. */
typedef struct init {
    kolo__runtime_t *rt;
    kolo__pset_t *world;    /* the global set, once connected */
    int *all;               /* [size]: every rank, the global set's members */
    int mpi_launched, elastic;
    int told;               /* the others need not hear of a failure from
                               here (agree.h) */
    unsigned joined_before; /* the elastic generation joined before */
    kolo__err_t err;
} init_t;

/* A new runtime, its set table's lock ready. */
static int runtime_new(init_t *in)
{
    in->rt = kolo__calloc(1, sizeof(*in->rt));
    if (in->rt == NULL)
        return kolo__err_set(&in->err, KOLO_ERR_NO_MEMORY,
                             "out of memory in kolo_init");
    pthread_mutex_init(&in->rt->sets_mu, NULL);
    return KOLO_OK;
}

/* The settings: where the launcher (or the elastic membership) places
 * this rank, then every KOLO_* variable, and the job's key. */
static int read_settings(init_t *in)
{
    kolo__runtime_t *rt = in->rt;
    kolo__err_t *err = &in->err;

    KOLO__CHECK(mpi_configure(&in->mpi_launched, err));
    KOLO__CHECK(elastic_configure(&in->elastic, err));
    if (in->elastic && in->mpi_launched)
        return kolo__err_set(err, KOLO_ERR_UNSUPPORTED, "an MPI job cannot "
                             "change size: KOLO_ELASTIC=1 under mpirun");
    KOLO__CHECK(kolo__config_load(&rt->cfg, env_get, err));
    KOLO__CHECK(kolo__auth_job_key(env_get, rt->job_key, &rt->have_job_key,
                                   err));
    rt->cfg.mpi_launched = in->mpi_launched;
    if (!in->mpi_launched && strncmp(rt->cfg.rendezvous, "mpi:", 4) == 0)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_RENDEZVOUS='%s': the mpi: form is kolo's "
                             "own under mpirun; start the job with mpirun (or "
                             "kolorun --mpi), or use file:DIR",
                             rt->cfg.rendezvous);
    return KOLO_OK;
}

/* This rank's place, as the settings say, for the runtime and the log. */
static void take_place(init_t *in)
{
    kolo__runtime_t *rt = in->rt;

    kolo__log_threshold = (int)rt->cfg.log_level;
    rt->rank = (int)rt->cfg.rank;
    rt->size = (int)rt->cfg.size;
    rt->handles = &g_handles;
    /* Rendezvous keys are unique per kolo_init; in an elastic job per
     * generation, which every member shares (new workers included). */
    rt->generation = in->elastic ? g_elastic.generation : g_generation++;
    kolo__log_set_rank(rt->rank);
    warn_unknown_variables(rt->rank);
}

/* The timeline's file: KOLO_TIMELINE, or with KOLO_TIMELINE_ALL_RANKS one
 * per rank (NAME.R.json, NAME.R). */
static int start_timeline(kolo__runtime_t *rt, kolo__err_t *err)
{
    const char *name = rt->cfg.timeline;
    size_t len = strlen(name);
    char path[4200], why[KOLO__ERR_LEN];

    if (!rt->cfg.timeline_all_ranks)
        snprintf(path, sizeof(path), "%s", name);
    else if (len > 5 && strcmp(name + len - 5, ".json") == 0)
        snprintf(path, sizeof(path), "%.*s.%d.json", (int)(len - 5), name,
                 rt->rank);
    else
        snprintf(path, sizeof(path), "%s.%d", name, rt->rank);
    if (kolo__timeline_start(rt->timeline, path,
                             (int)rt->cfg.timeline_mark_cycles, err) == KOLO_OK)
        return KOLO_OK;
    /* A file that cannot be created or written: the variable's value is
     * wrong, as kolo.h promises for KOLO_* variables. */
    snprintf(why, sizeof(why), "%s", err->msg);
    return kolo__err_set(err, KOLO_ERR_CONFIG, "environment variable "
                         "KOLO_TIMELINE='%s' is invalid: %s", name, why);
}

/* The timeline, recording from now where KOLO_TIMELINE names a file for
 * this rank (DYNAMIC, Horovod's HOROVOD_TIMELINE=DYNAMIC: no file until
 * kolo_start_timeline). */
static int open_timeline(init_t *in)
{
    kolo__runtime_t *rt = in->rt;

    rt->timeline = kolo__timeline_new(rt->rank, rt->size, rt->cfg.job_start_us);
    if (rt->timeline == NULL)
        return kolo__err_set(&in->err, KOLO_ERR_NO_MEMORY,
                             "out of memory in kolo_init");
    if (rt->cfg.timeline[0] != '\0' && strcmp(rt->cfg.timeline, "DYNAMIC") != 0 &&
        (rt->rank == 0 || rt->cfg.timeline_all_ranks))
        KOLO__CHECK(start_timeline(rt, &in->err));
    if (in->elastic && kolo__timeline_active(rt->timeline)) {
        /* Each membership change marks the timeline (kolo-timeline
         * summary lists them). */
        char mark[128];
        snprintf(mark, sizeof(mark), "MEMBERSHIP generation %u: %d ranks (%s)",
                 g_elastic.generation, rt->size,
                 g_elastic.update[0] ? g_elastic.update : "start");
        kolo__tl_instant(rt->timeline, "elastic", mark, 0);
    }
    return KOLO_OK;
}

/* The global set's members, every rank: listed before the agreement, so
 * that running out of memory here is told as this rank's settings. */
static int list_world(init_t *in)
{
    in->all = kolo__malloc((size_t)in->rt->size * sizeof(int));
    if (in->all == NULL)
        return kolo__err_set(&in->err, KOLO_ERR_NO_MEMORY,
                             "out of memory in kolo_init");
    for (int r = 0; r < in->rt->size; r++)
        in->all[r] = r;
    return KOLO_OK;
}

/* This rank enters the registry that names a lost rank (peers.c), and the
 * ranks agree on the settings before any backend connects. */
static int agree_with_the_others(init_t *in)
{
    kolo__runtime_t *rt = in->rt;
    char prefix[32];
    int rc;

    snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
    kolo__peers_register(&rt->cfg, prefix);
    in->told = 1;
    rc = agree_settings(rt, &in->err);
    if (rc != KOLO_OK)
        /* Where only this rank failed (it could not read the verdict),
         * the others go on to connect: they learn why from there. */
        kolo__agree_failed(&rt->cfg, rt->generation, "init.connect", &in->err);
    return rc;
}

/* The global set connects (pset.c), and every rank learns whether every
 * rank did (agree.c); then it joins the set table. */
static int connect_world(init_t *in)
{
    kolo__runtime_t *rt = in->rt;
    kolo__outcome_t watch;
    int rc;

    kolo__outcome_init(&watch, &rt->cfg, rt->generation, "init.connect",
                       in->all, rt->size);
    rc = table_reserve(rt) == 0
             ? kolo__pset_start(rt, KOLO_GLOBAL_PROCESS_SET, in->all, rt->size,
                                &watch, &in->world, &in->err)
             : kolo__err_set(&in->err, KOLO_ERR_NO_MEMORY,
                             "out of memory in kolo_init");
    if (!watch.agreed) {
        kolo__err_t mine = in->err;
        rc = kolo__outcome_agree(&watch, rc, &mine, &in->err);
    }
    if (rc != KOLO_OK)
        return rc;
    table_add(rt, in->world, rt->size);
    free(in->all);
    in->all = NULL;
    return KOLO_OK;
}

/* What carries the job: at debug level on every rank; at info level
 * (KOLO_LOG_LEVEL=info) on rank 0, with the same names as kolorun
 * --check-build, hvd.mpi_enabled() and hvd.gloo_enabled(). */
static void announce(const kolo__runtime_t *rt, const kolo__pset_t *world)
{
    kolo__debug("initialised: rank %d of %d, %s backend, fusion threshold "
                "%lld bytes, cycle time %.3g ms",
                rt->rank, rt->size, world->data_ops->name,
                (long long)rt->cfg.fusion_threshold, rt->cfg.cycle_time_ms);
    if (rt->rank == 0)
        kolo__log(KOLO__LOG_INFO, "%d ranks: negotiation over %s, host "
                  "tensors over %s%s; fusion threshold %lld bytes, cycle "
                  "time %.3g ms", rt->size, world->ctl_ops->name,
                  world->data_ops->name,
                  rt->cfg.mpi_launched ? " (started by mpirun)" : "",
                  (long long)rt->cfg.fusion_threshold, rt->cfg.cycle_time_ms);
}

/* The runtime in force, and this rank's place for the lock-free getters. */
static void publish(kolo__runtime_t *rt)
{
    g_rank = rt->rank;
    g_size = rt->size;
    g_local_rank = (int)rt->cfg.local_rank;
    g_local_size = (int)rt->cfg.local_size;
    g_cross_rank = (int)rt->cfg.cross_rank;
    g_cross_size = (int)rt->cfg.cross_size;
    g_rt = rt;
}

/* This rank's failure, for the others to name when they lose it
 * (peers.c). */
static void say_why(const kolo__runtime_t *rt, const kolo__err_t *err)
{
    char prefix[32];

    snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
    kolo__peers_note_cause(err->code, err->msg);
    kolo__peers_say_why(&rt->cfg, prefix);
}

/* A failed kolo_init's runtime: the others told (the registry entry
 * stays: peers still waiting must see that this rank arrived; kolorun
 * removes the directory at the end), then freed. */
static void forget_runtime(init_t *in)
{
    kolo__runtime_t *rt = in->rt;

    if (!in->told)
        kolo__agree_failed(&rt->cfg, rt->generation, "settings", &in->err);
    /* Ranks that went on without this one (it alone could not read a
     * verdict) learn why when they lose it. */
    if (rt->rank >= 0 && rt->size > 1)
        say_why(rt, &in->err);
    /* The flight recorder, if it opened, dumps why (and nothing more). */
    kolo__flight_dump_error(rt, &in->err);
    kolo__flight_close(rt);
    free(in->all);
    runtime_free(rt);
}

/* A failed kolo_init's report. In an elastic job whose membership moved
 * on while this one formed, the peers went to the newer generation and
 * kolo_init again joins it: a warning, not an error. */
static int init_failed(init_t *in)
{
    if (in->elastic && g_elastic.generation > in->joined_before &&
        in->err.code != KOLO_ERR_MEMBERSHIP &&
        kolo__elastic_updates(getenv("KOLO_RENDEZVOUS"),
                              g_elastic.generation) > 0)
        in->err.code = KOLO_ERR_MEMBERSHIP;
    if (in->elastic && in->err.code == KOLO_ERR_MEMBERSHIP) {
        kolo__log(KOLO__LOG_WARNING, "kolo_init: %s", in->err.msg);
        return kolo__api_fail(&in->err);
    }
    kolo__log(KOLO__LOG_ERROR, "kolo_init failed: %s", in->err.msg);
    return kolo__api_fail(&in->err);
}

int kolo_init(void)
{
    static int at_exit_registered;
    init_t in = {.told = 1, .joined_before = g_elastic.generation};
    int rc;

    kolo__err_clear(&in.err);
    if (kolo__api_handles() == NULL)
        return kolo__api_failf(KOLO_ERR_INTERNAL,
                               "cannot create the handle table's lock");
    pthread_mutex_lock(&g_mu);
    if (g_rt != NULL) {
        pthread_mutex_unlock(&g_mu);
        return kolo__api_failf(KOLO_ERR_ALREADY_INITIALIZED,
                               "kolo_init called twice without kolo_shutdown");
    }
    kolo__peers_forget_cause();
    KOLO__CHECK_GOTO(runtime_new(&in), rc, unlock);
    KOLO__CHECK_GOTO(read_settings(&in), rc, free_runtime);
    take_place(&in);
    KOLO__CHECK_GOTO(serve_rendezvous(&in.rt->cfg, in.rt->have_job_key
                                                       ? in.rt->job_key : NULL,
                                      &in.err),
                     rc, free_runtime);
    kolo__agree_reserve();
    kolo__peers_prepare_why(&in.rt->cfg);
    /* From here until the settings are agreed, a failure of this rank is
     * published where the others wait for its settings (agree.h). */
    in.told = 0;
    KOLO__CHECK_GOTO(kolo__flight_open(in.rt, &in.err), rc, free_runtime);
    KOLO__CHECK_GOTO(open_timeline(&in), rc, free_runtime);
    KOLO__CHECK_GOTO(list_world(&in), rc, free_runtime);
    KOLO__CHECK_GOTO(agree_with_the_others(&in), rc, free_runtime);
    hold_for_test();
    KOLO__CHECK_GOTO(connect_world(&in), rc, free_runtime);
    KOLO__CHECK_GOTO(kolo__watchdog_start(in.rt, &in.err), rc, stop_world);
    announce(in.rt, in.world);
    publish(in.rt);
    kolo__agree_release();
    if (!at_exit_registered)
        at_exit_registered = atexit(shutdown_at_exit) == 0;
    pthread_mutex_unlock(&g_mu);
    return KOLO_OK;

stop_world:
    /* The others are past the agreement: they learn of it from the set's
     * shutdown, and why from here. */
    say_why(in.rt, &in.err);
    kolo__pset_stop(table_take(in.rt, KOLO_GLOBAL_PROCESS_SET), NULL);
free_runtime:
    forget_runtime(&in);
    kolo__agree_release();
unlock:
    pthread_mutex_unlock(&g_mu);
    return init_failed(&in);
}

int kolo_shutdown(void)
{
    kolo__runtime_t *rt;
    kolo__err_t why;

    pthread_mutex_lock(&g_mu);
    rt = g_rt;
    if (rt == NULL) {
        pthread_mutex_unlock(&g_mu);
        return kolo__api_failf(KOLO_ERR_NOT_INITIALIZED,
                               "kolo_shutdown called, but kolo is not "
                               "initialized");
    }
    kolo__watchdog_stop(rt);
    {
        /* What made this rank stop, if it was its own failure: the others
         * name it beside "rank N has shut down". */
        char prefix[32];
        snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
        kolo__peers_say_why(&rt->cfg, prefix);
    }
    /* The global set announces the shutdown to the other ranks in its next
     * round, fails what is pending and asks the other sets to stop. */
    kolo__pset_stop(table_take(rt, KOLO_GLOBAL_PROCESS_SET), NULL);
    kolo__err_set(&why, KOLO_ERR_SHUTDOWN,
                  "kolo was shut down on this rank (rank %d)", rt->rank);
    for (int i = 1; i < rt->nsets; i++) {
        kolo__pset_t *ps = table_take(rt, i);
        if (ps != NULL)
            kolo__pset_stop(ps, &why);
    }
    /* Every set stopped: the last dump shows how each ended. */
    kolo__flight_close(rt);
    kolo__passes_free();
    {
        char prefix[32];
        snprintf(prefix, sizeof(prefix), "kolo%u", rt->generation);
        kolo__peers_unregister(&rt->cfg, prefix);
    }
    runtime_free(rt);
    g_rt = NULL;
    g_rank = g_size = g_local_rank = g_local_size = -1;
    g_cross_rank = g_cross_size = -1;
    pthread_mutex_unlock(&g_mu);
    return KOLO_OK;
}

int kolo_is_initialized(void) { return atomic_load(&g_size) > 0; }

int kolo_elastic(void)
{
    const char *on = kolo__config_get("KOLO_ELASTIC", plain_getenv);
    return on != NULL && strcmp(on, "1") == 0;
}

int kolo_elastic_generation(void)
{
    return kolo_elastic() && kolo_is_initialized() ? (int)g_elastic.generation
                                                   : 0;
}

int kolo_hosts_updated(void)
{
    const char *rdv = getenv("KOLO_RENDEZVOUS");

    if (!kolo_elastic() || !kolo_is_initialized() || rdv == NULL)
        return 0;
    return kolo__elastic_updates(rdv, g_elastic.generation);
}
int kolo_rank(void) { return g_rank; }
int kolo_size(void) { return g_size; }
int kolo_local_rank(void) { return g_local_rank; }
int kolo_local_size(void) { return g_local_size; }
int kolo_cross_rank(void) { return g_cross_rank; }
int kolo_cross_size(void) { return g_cross_size; }

int kolo_built(const char *what)
{
    if (what == NULL)
        return 0;
    if (kolo__built(what))
        return 1;
    /* Horovod's nccl_built() is the version: scripts compare it. */
    if (strcmp(what, "nccl") == 0 && kolo__ops_device() != NULL)
        return kolo__ops_device()->version();
    return 0;
}

int kolo_enabled(const char *what)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    int on = 0;

    if (what == NULL || (rt = kolo__api_enter("kolo_enabled", &err)) == NULL)
        return 0;
    /* A backend is enabled when it carries the global set's negotiation or
     * its tensors (hierarchical allreduce: shared memory too); MPI also
     * whenever MPI started the job, since MPI is then up for the program. */
    {
        const kolo__pset_t *w = rt->sets[KOLO_GLOBAL_PROCESS_SET];
        on = strcmp(w->ctl_ops->name, what) == 0 ||
             strcmp(w->data_ops->name, what) == 0 ||
             (strcmp(what, "shm") == 0 && strcmp(w->data_ops->name, "hier") == 0) ||
             (strcmp(what, "mpi") == 0 && rt->cfg.mpi_launched);
        /* NCCL carries CUDA tensors whenever this process sees a GPU. */
        on |= strcmp(what, "nccl") == 0 && kolo__ops_device() != NULL &&
              kolo__ops_device()->device_count() > 0;
    }
    kolo__api_leave();
    return on;
}

int kolo_start_timeline(const char *path, int mark_cycles)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    int rc;

    kolo__err_clear(&err);
    if (path == NULL || path[0] == '\0')
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "kolo_start_timeline: no file name");
    if ((rt = kolo__api_enter("kolo_start_timeline", &err)) == NULL)
        return kolo__api_fail(&err);
    rc = kolo__timeline_start(rt->timeline, path, mark_cycles, &err);
    kolo__api_leave();
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

int kolo_stop_timeline(void)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    int rc;

    kolo__err_clear(&err);
    if ((rt = kolo__api_enter("kolo_stop_timeline", &err)) == NULL)
        return kolo__api_fail(&err);
    rc = kolo__timeline_stop(rt->timeline, &err);
    kolo__api_leave();
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

int kolo_flight_stacks(int fd, int signum)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    int rc;

    kolo__err_clear(&err);
    if ((rt = kolo__api_enter("kolo_flight_stacks", &err)) == NULL)
        return kolo__api_fail(&err);
    rc = kolo__flight_stacks(rt, fd, signum, &err);
    kolo__api_leave();
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

/* ---- process sets --------------------------------------------------------- */

/* Checks a list of global ranks: in range, each once. */
static int check_ranks(const kolo__runtime_t *rt, const int *ranks, int n,
                       const char *what, kolo__err_t *err)
{
    if (ranks == NULL || n < 1)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "%s: a process set needs at least one rank", what);
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= rt->size)
            return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                 "%s: rank %d is not a rank of this job of %d",
                                 what, ranks[i], rt->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                                     "%s: rank %d is listed twice", what,
                                     ranks[i]);
    }
    return KOLO_OK;
}

/* The judge of a new set's membership: every rank must have asked for the
 * same ranks; else the message lists what each rank asked for. */
static int judge_members(char *const *texts, int n, void *arg, kolo__err_t *err)
{
    char msg[KOLO__ERR_LEN];
    size_t used;
    int differ = 0;

    for (int r = 1; r < n; r++)
        differ |= strcmp(texts[r], texts[0]) != 0;
    if (!differ)
        return KOLO_OK;
    used = (size_t)snprintf(msg, sizeof(msg), "the ranks asked for different "
                            "members of process set %d:", *(int *)arg);
    /* Ranks that asked for the same set are listed together. */
    for (int r = 0; r < n && used < sizeof(msg); r++) {
        char who[160];
        size_t w = 0;
        int first = 1, k = 0;
        for (int q = 0; q < r && first; q++)
            first = strcmp(texts[q], texts[r]) != 0;
        if (!first)
            continue;
        for (int q = r; q < n && w < sizeof(who) - 16; q++)
            if (strcmp(texts[q], texts[r]) == 0)
                w += (size_t)snprintf(who + w, sizeof(who) - w, "%s%d",
                                      k++ ? ", " : "", q);
        used += (size_t)snprintf(msg + used, sizeof(msg) - used,
                                 "%s rank%s %s asked for {%s}", r ? ";" : "",
                                 k > 1 ? "s" : "", who, texts[r]);
    }
    return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT, "%s; every rank must "
                         "add the same process sets in the same order", msg);
}

/* Creates set rt->nsets; the caller holds g_mu and checked the ranks.
 * Every rank of the job takes part: first they agree on the members
 * (before any of them connects), then on whether every member connected
 * (agree.c), so that the set exists everywhere or nowhere. */
static int add_set_reserved(kolo__runtime_t *rt, const int *ranks, int n,
                            int *id, kolo__err_t *err);

static int add_set(kolo__runtime_t *rt, const int *ranks, int n, int *id,
                   kolo__err_t *err)
{
    int rc;

    kolo__agree_reserve();
    rc = add_set_reserved(rt, ranks, n, id, err);
    kolo__agree_release();
    return rc;
}

static int add_set_reserved(kolo__runtime_t *rt, const int *ranks, int n,
                            int *id, kolo__err_t *err)
{
    kolo__pset_t *ps = NULL;
    kolo__outcome_t watch;
    int member = 0, new_id = rt->nsets, rc;
    char topic[32], *text;
    size_t used = 0;
    /* Attempts, not ids, name the agreements: a failed add leaves no id
     * behind, and its keys must not answer the next one. */
    unsigned attempt = rt->set_attempts++;

    snprintf(topic, sizeof(topic), "add%u", attempt);
    if ((text = kolo__malloc(KOLO__AGREE_MAX)) == NULL) {
        kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                      "out of memory adding process set %d", new_id);
        kolo__agree_failed(&rt->cfg, rt->generation, topic, err);
        return err->code;
    }
    text[0] = '\0';
    for (int i = 0; i < n && used < KOLO__AGREE_MAX - 16; i++)
        used += (size_t)snprintf(text + used, KOLO__AGREE_MAX - used, "%s%d",
                                 i ? "," : "", ranks[i]);
    rc = kolo__agree(&rt->cfg, rt->generation, topic, text, judge_members,
                     &new_id, err);
    free(text);
    snprintf(topic, sizeof(topic), "add%u.connect", attempt);
    if (rc != KOLO_OK) {
        /* Where only this rank failed (it could not read the verdict),
         * the others go on to connect: they learn why from there. */
        kolo__agree_failed(&rt->cfg, rt->generation, topic, err);
        return rc;
    }

    for (int i = 0; i < n; i++)
        member |= ranks[i] == rt->rank;
    kolo__outcome_init(&watch, &rt->cfg, rt->generation, topic, ranks, n);
    /* Members connect among themselves; the others only count the id. */
    if (table_reserve(rt) != 0)
        rc = kolo__err_set(err, KOLO_ERR_NO_MEMORY,
                           "out of memory adding process set %d", new_id);
    else
        rc = member ? kolo__pset_start(rt, new_id, ranks, n, &watch, &ps, err)
                    : KOLO_OK;
    if (!watch.agreed) {
        kolo__err_t mine = *err;
        rc = kolo__outcome_agree(&watch, rc, &mine, err);
    }
    if (rc != KOLO_OK)
        return rc;
    table_add(rt, ps, n);
    *id = new_id;
    return KOLO_OK;
}

int kolo_add_process_set(const int *ranks, int nranks, int *id)
{
    kolo__err_t err;
    kolo__runtime_t *rt;
    int rc, new_id;

    kolo__err_clear(&err);
    if (id == NULL)
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "kolo_add_process_set: id is NULL");
    if ((rt = kolo__api_enter("kolo_add_process_set", &err)) == NULL)
        return kolo__api_fail(&err);
    rc = check_ranks(rt, ranks, nranks, "kolo_add_process_set", &err);
    if (rc == KOLO_OK)
        rc = add_set(rt, ranks, nranks, &new_id, &err);
    kolo__api_leave();
    if (rc != KOLO_OK)
        return kolo__api_fail(&err);
    *id = new_id;
    return KOLO_OK;
}

int kolo_add_process_sets_from_groups(int ngroups, const int *const *groups,
                                      const int *group_sizes,
                                      int require_equal_size, int *ids)
{
    const char *what = "kolo_add_process_sets_from_groups";
    kolo__err_t err;
    kolo__runtime_t *rt;
    int *seen = NULL, rc = KOLO_OK;

    kolo__err_clear(&err);
    if (ngroups < 1 || groups == NULL || group_sizes == NULL || ids == NULL)
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "%s: needs at least one group, and non-NULL "
                               "groups, sizes and ids", what);
    if ((rt = kolo__api_enter(what, &err)) == NULL)
        return kolo__api_fail(&err);
    seen = kolo__calloc((size_t)rt->size, sizeof(int));
    if (seen == NULL) {
        rc = kolo__err_set(&err, KOLO_ERR_NO_MEMORY, "%s: out of memory", what);
        goto out;
    }
    /* Validate the whole assignment before creating anything. */
    for (int g = 0; g < ngroups && rc == KOLO_OK; g++) {
        rc = check_ranks(rt, groups[g], group_sizes[g], what, &err);
        if (rc == KOLO_OK && require_equal_size && group_sizes[g] != group_sizes[0])
            rc = kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT,
                               "%s: groups must have equal sizes, but group 0 "
                               "has %d ranks and group %d has %d",
                               what, group_sizes[0], g, group_sizes[g]);
        for (int i = 0; rc == KOLO_OK && i < group_sizes[g]; i++) {
            int r = groups[g][i];
            if (seen[r])
                rc = kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT,
                                   "%s: rank %d appears in group %d and in "
                                   "group %d; every rank must appear exactly "
                                   "once",
                                   what, r, seen[r] - 1, g);
            seen[r] = g + 1;
        }
    }
    for (int r = 0; rc == KOLO_OK && r < rt->size; r++)
        if (!seen[r])
            rc = kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT,
                               "%s: rank %d is in no group; every rank must "
                               "appear exactly once",
                               what, r);
    for (int g = 0; g < ngroups && rc == KOLO_OK; g++)
        rc = add_set(rt, groups[g], group_sizes[g], &ids[g], &err);
out:
    kolo__api_leave();
    free(seen);
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

int kolo_remove_process_set(int id)
{
    kolo__err_t err, why;
    kolo__runtime_t *rt;
    kolo__pset_t *ps = NULL;
    int rc = KOLO_OK;

    kolo__err_clear(&err);
    if ((rt = kolo__api_enter("kolo_remove_process_set", &err)) == NULL)
        return kolo__api_fail(&err);
    if (id == KOLO_GLOBAL_PROCESS_SET)
        rc = kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT,
                           "kolo_remove_process_set: the global process set "
                           "cannot be removed");
    else if (id < 0 || id >= rt->nsets || rt->set_sizes[id] == 0)
        rc = kolo__err_set(&err, KOLO_ERR_INVALID_ARGUMENT,
                           "kolo_remove_process_set: process set %d does not "
                           "exist", id);
    if (rc == KOLO_OK) {
        pthread_mutex_lock(&rt->sets_mu);
        ps = rt->sets[id];
        rt->sets[id] = NULL;
        rt->set_sizes[id] = 0;
        pthread_mutex_unlock(&rt->sets_mu);
        kolo__err_set(&why, KOLO_ERR_INVALID_ARGUMENT,
                      "process set %d was removed", id);
        /* Members stop the set together: its thread announces the stop in
         * one more round. */
        if (ps != NULL)
            kolo__pset_stop(ps, &why);
    }
    kolo__api_leave();
    return rc == KOLO_OK ? KOLO_OK : kolo__api_fail(&err);
}

/* This rank's rank in process set id (want_size 0) or the set's size (1);
 * -1 where the set is not known here or kolo is not running. */
static int set_query(const char *fn, int id, int want_size)
{
    kolo__err_t err;
    kolo__runtime_t *rt = kolo__api_enter(fn, &err);
    int v = -1;
    if (rt == NULL)
        return -1;
    if (id >= 0 && id < rt->nsets) {
        if (!want_size && rt->sets[id] != NULL)
            v = rt->sets[id]->rank;
        else if (want_size && rt->set_sizes[id] > 0)
            v = rt->set_sizes[id];
    }
    kolo__api_leave();
    return v;
}

int kolo_process_set_rank(int id)
{
    return set_query("kolo_process_set_rank", id, 0);
}

int kolo_process_set_size(int id)
{
    return set_query("kolo_process_set_size", id, 1);
}

/* ---- completion ----------------------------------------------------------- */

int kolo_poll(kolo_handle_t handle)
{
    kolo__err_t err;
    kolo__handles_t *h = kolo__api_handles();
    int rc;

    if (h == NULL)
        return kolo__api_failf(KOLO_ERR_INTERNAL, "the handle table is unavailable");
    kolo__err_clear(&err);
    rc = kolo__handles_poll(h, handle, &err);
    return rc < 0 ? kolo__api_fail(&err) : rc;
}

/* Waits for a handle; for a tensor in device memory, orders its result on
 * the program's stream (`stream` if given, else the one at enqueue), or,
 * for a result handed over to the host, waits until the device has
 * written it (inflight.c). */
static int wait_done(kolo__handles_t *h, kolo_handle_t handle,
                     kolo_result_t *result, int given, void *stream)
{
    kolo__err_t err;
    kolo__handoff_t ho;
    kolo__result_t *out;
    int rc;

    kolo__err_clear(&err);
    rc = kolo__handles_wait_handoff(h, handle, &err, &ho);
    if (rc < 0)
        return kolo__api_fail(&err);
    out = ho.output;
    if (ho.done != NULL) {
        int host = out != NULL && out->device_type == KOLO_DEVICE_CUDA &&
                   result != NULL;
        rc = kolo__done_settle(ho.done, given ? stream : ho.stream, host,
                               &err);
        ho.done_free(ho.done);
        if (rc != KOLO_OK) {
            kolo__result_free(out);
            return kolo__api_fail(&err);
        }
    }
    if (out != NULL && result != NULL) {
        result->data = out->data;
        result->bytes = out->bytes;
        result->ndim = out->ndim;
        memcpy(result->shape, out->shape, sizeof(result->shape));
        result->nsplits = out->nsplits;
        result->splits = out->splits;
        result->device_type = out->device_type;
        result->device = out->device;
        out->data = NULL;
        out->splits = NULL;
    }
    kolo__result_free(out);
    return rc;
}

/* wait_done, the thread marked inside kolo_wait meanwhile (the flight
 * recorder's, kept in the handle table). */
static int wait_handle(kolo_handle_t handle, kolo_result_t *result,
                       int given, void *stream)
{
    kolo__handles_t *h = kolo__api_handles();
    int rc;

    if (result != NULL)
        memset(result, 0, sizeof(*result));
    if (h == NULL)
        return kolo__api_failf(KOLO_ERR_INTERNAL, "the handle table is unavailable");
    kolo__flight_waits_begin(h, handle);
    rc = wait_done(h, handle, result, given, stream);
    kolo__flight_waits_end(h);
    return rc;
}

int kolo_wait(kolo_handle_t handle)
{
    return wait_handle(handle, NULL, 0, NULL);
}

int kolo_wait_on_stream(kolo_handle_t handle, void *stream)
{
    return wait_handle(handle, NULL, 1, stream);
}

int kolo_wait_result(kolo_handle_t handle, kolo_result_t *result)
{
    return wait_handle(handle, result, 0, NULL);
}

int kolo_result_copy(const kolo_result_t *result, void *dst)
{
    if (result == NULL || (result->bytes > 0 && (dst == NULL || result->data == NULL)))
        return kolo__api_failf(KOLO_ERR_INVALID_ARGUMENT,
                               "kolo_result_copy: the result, its data or the "
                               "destination is NULL");
    if (result->device_type == KOLO_DEVICE_CUDA) {
        const kolo__dev_ops_t *dev = kolo__ops_device();
        char detail[KOLO__ERR_LEN];
        int rc;

        if (dev == NULL)
            return kolo__api_failf(KOLO_ERR_UNSUPPORTED,
                                   "kolo_result_copy: a CUDA result in a "
                                   "build without GPU support");
        rc = dev->result_copy(result->device, result->data, dst,
                              result->bytes, detail, sizeof(detail));
        return rc == KOLO_OK ? KOLO_OK : kolo__api_failf(rc, "%s", detail);
    }
    if (result->bytes > 0)
        memcpy(dst, result->data, result->bytes);
    return KOLO_OK;
}

void kolo_result_free(kolo_result_t *result)
{
    if (result != NULL) {
        if (result->device_type == KOLO_DEVICE_CUDA && kolo__ops_device())
            kolo__ops_device()->mem_free(result->data);
        else
            free(result->data);
        free(result->splits);
        memset(result, 0, sizeof(*result));
    }
}

const char *kolo_handle_error(kolo_handle_t handle)
{
    kolo__handles_t *h = kolo__api_handles();
    return h ? kolo__handles_error(h, handle) : NULL;
}
