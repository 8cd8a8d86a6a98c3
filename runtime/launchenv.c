/*
 * launchenv.c — a job started by torchrun or by Slurm's srun.
 *
 * Clusters that already start their jobs with torchrun or srun should run
 * a kolo program unchanged. Neither launcher speaks kolo's KOLO_* variables,
 * but each tells every process where it stands:
 *
 *   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
 *             (the node's index), GROUP_WORLD_SIZE (nodes), MASTER_ADDR and
 *             MASTER_PORT (the node of rank 0, and a port torchrun chose or
 *             was given), TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT;
 *   srun      SLURM_PROCID, SLURM_STEP_NUM_TASKS (or SLURM_NTASKS),
 *             SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_NODES (or
 *             SLURM_NNODES), SLURM_STEP_TASKS_PER_NODE (or
 *             SLURM_TASKS_PER_NODE, "2(x3),1": 2 tasks on each of 3 nodes,
 *             then 1; or SLURM_NTASKS_PER_NODE), SLURM_STEP_NODELIST (or
 *             SLURM_JOB_NODELIST, "node[01-04]"), SLURM_JOB_ID and
 *             SLURM_STEP_ID.
 *
 * torchrun's variables are looked at first: under `srun torchrun ...` a
 * worker sees both, and torchrun's are the worker's own (Slurm's describe
 * the agent). A batch script run by sbatch has SLURM_PROCID too, but no
 * SLURM_STEP_ID: it is not a task of a step, and stays a job of one rank.
 *
 * Where the ranks meet. torchrun runs a TCPStore at MASTER_ADDR:MASTER_PORT
 * (its agent's, or the one torch.distributed's rank 0 starts), in PyTorch's
 * own protocol, which changes between PyTorch versions; srun runs no store
 * at all. So rank 0 of kolo serves one itself (rdvserver.c: a few commands
 * of Redis's protocol, which kolo's store and Gloo's RedisStore already
 * speak), and every rank uses KOLO_RENDEZVOUS=redis:HOST:PORT/JOB:
 *
 *   torchrun  HOST = MASTER_ADDR (127.0.0.1 when every rank is on one
 *             node), PORT = MASTER_PORT + 1, JOB = torchrun-RUN_ID-RESTARTS;
 *   srun      HOST = MASTER_ADDR when set, else 127.0.0.1 on one node,
 *             else the first node of the step; PORT = MASTER_PORT + 1 when
 *             MASTER_PORT is set, else 30000 + (job id * 16 + step id) mod
 *             30000; JOB = srun-JOBID.STEPID.
 *
 * Where another program holds PORT, rank 0 serves on one of the next few
 * ports and every rank finds it there (rdvserver.c, KOLO__RDV_PORTS).
 *
 * A KOLO_RENDEZVOUS the user sets (file: on a shared file system, or a
 * Redis server) is used instead, and then no rank serves anything.
 *
 * An MPI launcher (mpirun, or srun with an MPI plugin) is only recognised
 * here (kolo__launchenv_mpi): such a job learns where it stands from MPI
 * itself (ops/mpi/mpienv.c). A kolo built without MPI takes srun's own
 * variables instead when they are there, and otherwise refuses a job of
 * more than one rank (api.c).
 */
#include "launchenv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The integer value of variable `name` in [lo, hi]: 0, 1 when the variable
 * is not set, or KOLO_ERR_CONFIG naming it. */
static int get_int(const char *(*getenv_fn)(const char *), const char *name,
                   long lo, long hi, int *out, kolo__err_t *err)
{
    const char *text = getenv_fn(name);
    char *end;
    long v;

    if (text == NULL)
        return 1;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable %s='%.100s' is invalid: "
                             "expected a whole number from %ld to %ld",
                             name, text, lo, hi);
    *out = (int)v;
    return 0;
}

static int missing(const char *launcher, const char *name, const char *also,
                   kolo__err_t *err)
{
    return kolo__err_set(err, KOLO_ERR_CONFIG,
                         "this process was started by %s (its variables "
                         "are set), but %s is not set%s: kolo cannot tell "
                         "where it stands; set KOLO_RANK, KOLO_SIZE, "
                         "KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE, KOLO_CROSS_RANK "
                         "and KOLO_CROSS_SIZE yourself, or start it with "
                         "kolorun", launcher, name, also);
}

/* A variable the launcher sets, read as get_int; Slurm names some twice,
 * step-wide (`step_name`, read first when set) and job-wide (`name`).
 * Neither set: KOLO_ERR_CONFIG, naming the job-wide one. */
static int need_int(const char *(*getenv_fn)(const char *),
                    const char *launcher, const char *step_name,
                    const char *name, long lo, int *out, kolo__err_t *err)
{
    const char *which = name;
    char also[64] = "";
    int rc;

    if (step_name != NULL) {
        snprintf(also, sizeof(also), " (nor %s)", step_name);
        if (getenv_fn(step_name) != NULL)
            which = step_name;
    }
    rc = get_int(getenv_fn, which, lo, 1 << 24, out, err);
    return rc <= 0 ? rc : missing(launcher, name, also, err);
}

/* Slurm's tasks per node, "2(x3),1": the count on node `node`; 0 when the
 * text does not say (malformed, or too few nodes). */
static int tasks_on_node(const char *text, int node)
{
    const char *p = text;
    int seen = 0;

    while (*p != '\0') {
        char *end;
        long count = strtol(p, &end, 10), times = 1;
        if (end == p || count < 1)
            return 0;
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            times = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || times < 1)
                return 0;
            p = end + 1;
        }
        if (node < seen + times)
            return (int)count;
        seen += (int)times;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            return 0;
    }
    return 0;
}

/* The first host of a Slurm host list: "node[01-04,07],gpu5" gives
 * "node01" (the zeros are part of the name); -1 when it is malformed. */
static int first_host(const char *list, char *out, size_t len)
{
    size_t n = 0;

    for (const char *p = list; *p != '\0' && *p != ','; p++) {
        if (*p == '[') {
            /* The first number of the range, then past the ']'. */
            for (p++; *p >= '0' && *p <= '9'; p++)
                if (n + 1 < len)
                    out[n++] = *p;
            p = strchr(p, ']');
            if (p == NULL)
                return -1;
        } else if (n + 1 < len) {
            out[n++] = *p;
        }
    }
    out[n] = '\0';
    return n > 0 && n + 1 < len ? 0 : -1;
}

static int detect_torchrun(const char *(*getenv_fn)(const char *),
                           kolo__launchenv_t *le, kolo__err_t *err)
{
    const char *addr = getenv_fn("MASTER_ADDR");
    const char *run_id = getenv_fn("TORCHELASTIC_RUN_ID");
    const char *restarts = getenv_fn("TORCHELASTIC_RESTART_COUNT");
    int port = 0;

    le->launcher = "torchrun";
    KOLO__CHECK(get_int(getenv_fn, "RANK", 0, 1 << 24, &le->rank, err));
    KOLO__CHECK(get_int(getenv_fn, "WORLD_SIZE", 1, 1 << 24, &le->size, err));
    KOLO__CHECK(get_int(getenv_fn, "MASTER_PORT", 1, 65534, &port, err));
    KOLO__CHECK(need_int(getenv_fn, "torchrun", NULL, "LOCAL_RANK", 0,
                         &le->local_rank, err));
    KOLO__CHECK(need_int(getenv_fn, "torchrun", NULL, "LOCAL_WORLD_SIZE", 1,
                         &le->local_size, err));
    /* torchrun gives every node the same number of workers; GROUP_RANK and
     * GROUP_WORLD_SIZE say so when present. */
    le->cross_rank = le->rank / le->local_size;
    le->cross_size = (le->size + le->local_size - 1) / le->local_size;
    KOLO__CHECK(get_int(getenv_fn, "GROUP_RANK", 0, 1 << 24, &le->cross_rank,
                        err));
    KOLO__CHECK(get_int(getenv_fn, "GROUP_WORLD_SIZE", 1, 1 << 24,
                        &le->cross_size, err));
    if (le->cross_size == 1 || strcmp(addr, "localhost") == 0)
        snprintf(le->host, sizeof(le->host), "127.0.0.1");
    else if (strlen(addr) < sizeof(le->host) && addr[0] != '\0' &&
             strpbrk(addr, " /") == NULL)
        snprintf(le->host, sizeof(le->host), "%s", addr);
    else
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable MASTER_ADDR='%.100s' is "
                             "invalid: expected a host name or address",
                             addr);
    le->port = port + 1;
    snprintf(le->where, sizeof(le->where), "torchrun's MASTER_ADDR and "
             "MASTER_PORT+1");
    /* The job's keys: one run of torchrun, one restart of its workers. */
    if (run_id == NULL || run_id[0] == '\0' || strpbrk(run_id, " /") != NULL)
        run_id = "none";
    if (restarts == NULL || strspn(restarts, "0123456789") != strlen(restarts))
        restarts = "0";
    snprintf(le->job, sizeof(le->job), "torchrun-%.60s-%.20s", run_id,
             restarts);
    kolo__launchenv_rendezvous(le, le->port, le->rendezvous,
                               sizeof(le->rendezvous));
    return 1;
}

/* Where an srun task stands: its rank and node, and the sizes. */
static int srun_place(const char *(*getenv_fn)(const char *),
                      kolo__launchenv_t *le, kolo__err_t *err)
{
    KOLO__CHECK(get_int(getenv_fn, "SLURM_PROCID", 0, 1 << 24, &le->rank, err));
    KOLO__CHECK(need_int(getenv_fn, "srun", "SLURM_STEP_NUM_TASKS",
                         "SLURM_NTASKS", 1, &le->size, err));
    KOLO__CHECK(need_int(getenv_fn, "srun", NULL, "SLURM_LOCALID", 0,
                         &le->local_rank, err));
    KOLO__CHECK(need_int(getenv_fn, "srun", NULL, "SLURM_NODEID", 0,
                         &le->cross_rank, err));
    KOLO__CHECK(need_int(getenv_fn, "srun", "SLURM_STEP_NUM_NODES",
                         "SLURM_NNODES", 1, &le->cross_size, err));
    return KOLO_OK;
}

/* The tasks of this node: from the step's (or the job's) tasks per node,
 * else SLURM_NTASKS_PER_NODE, else all of them on a job of one node. */
static int srun_local_size(const char *(*getenv_fn)(const char *),
                           kolo__launchenv_t *le, kolo__err_t *err)
{
    const char *tpn = getenv_fn("SLURM_STEP_TASKS_PER_NODE");
    const char *which = "SLURM_STEP_TASKS_PER_NODE";

    if (tpn == NULL) {
        tpn = getenv_fn("SLURM_TASKS_PER_NODE");
        which = "SLURM_TASKS_PER_NODE";
    }
    le->local_size = 0;
    if (tpn != NULL && (le->local_size = tasks_on_node(tpn, le->cross_rank)) == 0)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable %s='%.100s' is invalid "
                             "for node %d (SLURM_NODEID): expected counts "
                             "such as 2(x3),1", which, tpn, le->cross_rank);
    if (le->local_size == 0)
        KOLO__CHECK(get_int(getenv_fn, "SLURM_NTASKS_PER_NODE", 1, 1 << 24,
                            &le->local_size, err));
    if (le->local_size == 0 && le->cross_size == 1)
        le->local_size = le->size;
    if (le->local_size == 0)
        return missing("srun", "SLURM_STEP_TASKS_PER_NODE",
                       " (nor SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE)",
                       err);
    return KOLO_OK;
}

/* Rank 0's node and a port for its server, and the job's name there. */
static int srun_server(const char *(*getenv_fn)(const char *),
                       kolo__launchenv_t *le, kolo__err_t *err)
{
    const char *step = getenv_fn("SLURM_STEP_ID");
    const char *nodes, *addr = getenv_fn("MASTER_ADDR");
    int job = 0, step_id = 0, master_port = 0;

    if (step == NULL)
        step = getenv_fn("SLURM_STEPID");
    KOLO__CHECK(get_int(getenv_fn, "SLURM_JOB_ID", 0, 0x7fffffff, &job, err));
    if (step != NULL && strspn(step, "0123456789") == strlen(step))
        step_id = atoi(step);
    KOLO__CHECK(get_int(getenv_fn, "MASTER_PORT", 1, 65534, &master_port, err));
    nodes = getenv_fn("SLURM_STEP_NODELIST");
    if (nodes == NULL)
        nodes = getenv_fn("SLURM_JOB_NODELIST");
    if (nodes == NULL)
        nodes = getenv_fn("SLURM_NODELIST");
    if (addr != NULL && addr[0] != '\0' && strlen(addr) < sizeof(le->host) &&
        strpbrk(addr, " /") == NULL) {
        snprintf(le->host, sizeof(le->host), "%s", addr);
    } else if (le->cross_size == 1) {
        snprintf(le->host, sizeof(le->host), "127.0.0.1");
    } else if (nodes == NULL || first_host(nodes, le->host, sizeof(le->host)) != 0) {
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "a job of srun over %d nodes needs the node of "
                             "rank 0: SLURM_STEP_NODELIST (or "
                             "SLURM_JOB_NODELIST) is %s%.100s%s; set "
                             "MASTER_ADDR to it, or KOLO_RENDEZVOUS",
                             le->cross_size, nodes ? "'" : "not set",
                             nodes ? nodes : "", nodes ? "', not a host list" : "");
    }
    le->port = master_port > 0 ? master_port + 1
                               : 30000 + (int)(((long long)job * 16 + step_id) % 30000);
    snprintf(le->where, sizeof(le->where), "%s and %s",
             addr ? "MASTER_ADDR" : le->cross_size == 1 ? "this node"
                                                        : "the step's first node",
             master_port > 0 ? "MASTER_PORT+1" : "a port from the job and step ids");
    snprintf(le->job, sizeof(le->job), "srun-%d.%d", job, step_id);
    return KOLO_OK;
}

static int detect_srun(const char *(*getenv_fn)(const char *),
                       kolo__launchenv_t *le, kolo__err_t *err)
{
    le->launcher = "srun";
    KOLO__CHECK(srun_place(getenv_fn, le, err));
    KOLO__CHECK(srun_local_size(getenv_fn, le, err));
    KOLO__CHECK(srun_server(getenv_fn, le, err));
    kolo__launchenv_rendezvous(le, le->port, le->rendezvous,
                               sizeof(le->rendezvous));
    return 1;
}

void kolo__launchenv_rendezvous(const kolo__launchenv_t *le, int port,
                                char *buf, size_t n)
{
    int v6 = strchr(le->host, ':') != NULL;

    snprintf(buf, n, "redis:%s%s%s:%d/%s", v6 ? "[" : "", le->host,
             v6 ? "]" : "", port, le->job);
}

int kolo__launchenv_detect(const char *(*getenv_fn)(const char *),
                           kolo__launchenv_t *out, kolo__err_t *err)
{
    int rc;

    memset(out, 0, sizeof(*out));
    if (getenv_fn("RANK") != NULL && getenv_fn("WORLD_SIZE") != NULL &&
        getenv_fn("MASTER_ADDR") != NULL && getenv_fn("MASTER_PORT") != NULL)
        rc = detect_torchrun(getenv_fn, out, err);
    else if (getenv_fn("SLURM_PROCID") != NULL &&
             (getenv_fn("SLURM_STEP_ID") != NULL ||
              getenv_fn("SLURM_STEPID") != NULL))
        rc = detect_srun(getenv_fn, out, err);
    else
        return 0;
    if (rc < 0)
        return rc;
    if (out->rank >= out->size || out->local_rank >= out->local_size ||
        out->cross_rank >= out->cross_size || out->local_size > out->size)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "%s's variables do not add up: rank %d of %d, "
                             "local rank %d of %d, node %d of %d",
                             out->launcher, out->rank, out->size,
                             out->local_rank, out->local_size,
                             out->cross_rank, out->cross_size);
    return 1;
}

int kolo__launchenv_mpi(const char *(*getenv_fn)(const char *), int *size)
{
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                            "PMIX_SIZE", "MPI_LOCALNRANKS"};
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                            "PMIX_RANK", "MV2_COMM_WORLD_RANK"};
    int launched = 0;

    *size = 0;
    for (size_t i = 0; i < sizeof(size_vars) / sizeof(size_vars[0]); i++) {
        const char *v = getenv_fn(size_vars[i]);
        if (v != NULL && *size == 0 && i != 3)
            *size = atoi(v);
        launched |= v != NULL;
    }
    for (size_t i = 0; i < sizeof(rank_vars) / sizeof(rank_vars[0]); i++)
        launched |= getenv_fn(rank_vars[i]) != NULL;
    return launched;
}
