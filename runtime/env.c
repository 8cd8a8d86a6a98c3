/*
 * env.c — one table drives the parsing, the defaults and the documentation
 * of every KOLO_* variable, so the three can never disagree.
 *
 * Each row: {name, default, doc, parser, offset into kolo__config_t, agree,
 * twin}. A parser takes the text and a pointer to the field and returns 0,
 * or -1 with a short description of what it expected; kolo__config_load
 * turns that into a message naming the variable. Cross-field checks (rank <
 * size, ...) come after the table.
 *
 * Horovod's twins. A row's twin is the HOROVOD_* variable of the same
 * setting, in the same unit (HOROVOD_FUSION_THRESHOLD in bytes,
 * HOROVOD_CYCLE_TIME in milliseconds), so that a job written for Horovod
 * runs with the settings it had. The twin is read, through the row's own
 * parser, only where the KOLO_* variable is not set: KOLO_* wins, and
 * kolo__config_scan warns when both are set to different values. A bad
 * twin's value fails kolo_init naming the twin. The settings the ranks
 * compare (agree.c) are the parsed fields, so a twin on one rank and the
 * KOLO_* name on another agree when their values do. Horovod variables
 * without a kolo meaning are listed below the table (horovod_notes), each
 * with the reason kolo_init gives when one is set.
 */
#include "edit.h"
#include "env.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*parse_fn)(const char *text, void *field, const char **expected);

typedef struct config_row {
    const char *name;
    const char *dflt; /* NULL: no default, the field keeps its preset */
    const char *doc;
    parse_fn parse;
    size_t offset;
    int agree; /* AGREE: every rank must have the same value (kolo_init
                * compares them, agree.c); 0: a per-rank value is harmless */
    const char *twin; /* Horovod's variable for the same setting, read when
                       * `name` is not set; NULL: none */
} config_row_t;

#define AGREE 1
#define PER_RANK 0

static int parse_int(const char *text, int64_t *out, int64_t lo, int64_t hi)
{
    char *end;
    long long v;

    errno = 0;
    v = strtoll(text, &end, 10);
    while (*end == ' ')
        end++;
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_nonneg(const char *text, void *field, const char **expected)
{
    *expected = "a non-negative integer";
    return parse_int(text, field, 0, INT64_MAX);
}

static int parse_positive(const char *text, void *field, const char **expected)
{
    *expected = "a positive integer";
    return parse_int(text, field, 1, INT32_MAX);
}

/* Byte counts accept a K, M or G suffix (powers of 1024). */
static int parse_bytes(const char *text, void *field, const char **expected)
{
    char *end;
    long long v;
    int64_t mult = 1;

    *expected = "a number of bytes (optionally with K, M or G)";
    errno = 0;
    v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || v < 0)
        return -1;
    switch (*end) {
    case 'k': case 'K': mult = 1024; end++; break;
    case 'm': case 'M': mult = 1024 * 1024; end++; break;
    case 'g': case 'G': mult = 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v > INT64_MAX / mult)
        return -1;
    *(int64_t *)field = v * mult;
    return 0;
}

/* "auto" (auto_value) or a number of bytes. */
static int auto_or_bytes(const char *text, int64_t auto_value, void *field,
                         const char **expected)
{
    if (strcmp(text, "auto") == 0) {
        *(int64_t *)field = auto_value;
        return 0;
    }
    if (parse_bytes(text, field, expected) != 0) {
        *expected = "auto or a number of bytes (optionally with K, M or G)";
        return -1;
    }
    return 0;
}

/* KOLO_SHM_SLOT_BYTES: auto is 0, the transport chooses. */
static int parse_seconds(const char *text, void *field, const char **expected);

static int parse_bytes_auto(const char *text, void *field, const char **expected)
{
    return auto_or_bytes(text, 0, field, expected);
}

/* KOLO_CHUNK_BYTES: auto is -1, the data backend chooses (0 means whole
 * batches). */
static int parse_chunk(const char *text, void *field, const char **expected)
{
    return auto_or_bytes(text, -1, field, expected);
}

/* KOLO_TIMEOUT_SECONDS and KOLO_START_TIMEOUT: 0 would mean failing at
 * once, so they take a positive number. */
static int parse_positive_seconds(const char *text, void *field,
                                  const char **expected)
{
    int rc = parse_seconds(text, field, expected);
    *expected = "a positive number of seconds, at most 1000000";
    return rc == 0 && *(double *)field > 0 ? 0 : -1;
}

static int parse_seconds(const char *text, void *field, const char **expected)
{
    char *end;
    double v;

    /* The upper bound (about 11 days) keeps every conversion to integer
     * micro- or milliseconds far from overflow. */
    *expected = "a number from 0 to 1000000";
    errno = 0;
    v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < 0 ||
        v > 1e6)
        return -1;
    *(double *)field = v;
    return 0;
}

/* A share of something: 0 to 1. */
static int parse_share(const char *text, void *field, const char **expected)
{
    int rc = parse_seconds(text, field, expected);
    *expected = "a number from 0 to 1";
    return rc == 0 && *(double *)field <= 1 ? 0 : -1;
}

static int parse_string(const char *text, void *field, const char **expected)
{
    *expected = "at most 4095 characters";
    if (strlen(text) >= 4096)
        return -1;
    strcpy(field, text);
    return 0;
}

/* KOLO_FLIGHT_RECORDER: its ring takes about 600 bytes a record. */
static int parse_records(const char *text, void *field, const char **expected)
{
    *expected = "a number of records from 0 (off) to 1000000";
    return parse_int(text, field, 0, 1000000);
}

static int parse_elastic_id(const char *text, void *field,
                            const char **expected)
{
    *expected = "host:slot, at most 299 characters";
    if (strlen(text) >= 300)
        return -1;
    strcpy(field, text);
    return 0;
}

static int parse_host(const char *text, void *field, const char **expected)
{
    *expected = "a host name or address of at most 255 characters";
    if (strlen(text) >= 256 || text[0] == '\0')
        return -1;
    strcpy(field, text);
    return 0;
}

static int parse_iface(const char *text, void *field, const char **expected)
{
    *expected = "an interface name of at most 15 characters (e.g. eth0)";
    if (strlen(text) >= 16 || strchr(text, '/') != NULL ||
        strchr(text, ' ') != NULL)
        return -1;
    strcpy(field, text);
    return 0;
}

/* In any case: Horovod's HOROVOD_CONTROLLER=GLOO means gloo. */
static int parse_backend(const char *text, void *field, const char **expected)
{
    static const char *const names[] = {"auto", "gloo", "mpi", "shm"};

    *expected = "auto, gloo, mpi or shm";
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(text, names[i]) == 0) {
            strcpy(field, names[i]);
            return 0;
        }
    return -1;
}

static int parse_auto_bool(const char *text, void *field, const char **expected)
{
    *expected = "auto, 0 or 1";
    if (strcmp(text, "auto") == 0)
        *(int64_t *)field = -1;
    else if (strcmp(text, "0") == 0 || strcmp(text, "1") == 0)
        *(int64_t *)field = text[0] - '0';
    else
        return -1;
    return 0;
}

static int parse_level(const char *text, void *field, const char **expected)
{
    int level;

    *expected = "one of trace, debug, info, warning, error, off";
    /* Horovod's FATAL: kolo logs nothing above its errors. */
    if (strcasecmp(text, "fatal") == 0)
        level = KOLO__LOG_ERROR;
    else if (kolo__log_level_parse(text, &level) != 0)
        return -1;
    *(int64_t *)field = level;
    return 0;
}

#define F(field) offsetof(kolo__config_t, field)

static const config_row_t rows[] = {
    {"KOLO_RANK", "0", "rank of this process", parse_nonneg, F(rank), PER_RANK,
     "HOROVOD_RANK"},
    {"KOLO_SIZE", "1", "number of ranks in the job", parse_positive, F(size),
     AGREE, "HOROVOD_SIZE"},
    {"KOLO_LOCAL_RANK", NULL, "rank among the ranks of this host (default: KOLO_RANK)",
     parse_nonneg, F(local_rank), PER_RANK, "HOROVOD_LOCAL_RANK"},
    {"KOLO_LOCAL_SIZE", NULL, "ranks on this host (default: KOLO_SIZE)",
     parse_positive, F(local_size), PER_RANK, "HOROVOD_LOCAL_SIZE"},
    {"KOLO_CROSS_RANK", "0", "index of this host", parse_nonneg, F(cross_rank),
     PER_RANK, "HOROVOD_CROSS_RANK"},
    {"KOLO_CROSS_SIZE", "1", "number of hosts", parse_positive, F(cross_size),
     AGREE, "HOROVOD_CROSS_SIZE"},
    {"KOLO_RENDEZVOUS", "", "where ranks meet: file:DIR or "
     "redis:HOST:PORT[/JOB] (kolorun sets it)",
     parse_string, F(rendezvous), PER_RANK, NULL},
    {"KOLO_HOSTNAME", "127.0.0.1", "address this rank's transport binds",
     parse_host, F(hostname), PER_RANK, "HOROVOD_HOSTNAME"},
    {"KOLO_NETWORK_INTERFACE", "", "bind this interface's address instead "
     "of KOLO_HOSTNAME (kolorun --network-interface)", parse_iface,
     F(network_interface), PER_RANK, "HOROVOD_GLOO_IFACE"},
    {"KOLO_FUSION_THRESHOLD", "134217728",
     "bytes of tensors fused into one reduction (0: no fusion)", parse_bytes,
     F(fusion_threshold), AGREE, "HOROVOD_FUSION_THRESHOLD"},
    {"KOLO_CHUNK_BYTES", "auto",
     "allreduces are reduced in pieces of this many bytes, each copied in, "
     "reduced and copied out while it is in cache (0: whole batches; auto: "
     "16M over Gloo, 4M otherwise; over Gloo or MPI a lone tensor that is "
     "neither scaled nor averaged goes whole)",
     parse_chunk, F(chunk_bytes), AGREE, NULL},
    {"KOLO_CYCLE_TIME", "5",
     "milliseconds between negotiation rounds while tensors wait for other ranks",
     parse_seconds, F(cycle_time_ms), AGREE, "HOROVOD_CYCLE_TIME"},
    {"KOLO_CACHE_CAPACITY", "1024",
     "negotiated tensors remembered by the response cache (0: off)",
     parse_nonneg, F(cache_capacity), AGREE, "HOROVOD_CACHE_CAPACITY"},
    {"KOLO_TIMEOUT_SECONDS", "60",
     "a backend operation that makes no progress this long fails",
     parse_positive_seconds, F(timeout_s), PER_RANK,
     "HOROVOD_GLOO_TIMEOUT_SECONDS"},
    {"KOLO_START_TIMEOUT", "60",
     "seconds init waits for every rank to arrive", parse_positive_seconds,
     F(start_timeout_s), PER_RANK, "HOROVOD_START_TIMEOUT"},
    {"KOLO_LOG_LEVEL", "warning", "trace, debug, info, warning, error or off "
     "(Horovod's fatal: error)", parse_level, F(log_level), PER_RANK,
     "HOROVOD_LOG_LEVEL"},
    {"KOLO_TIMELINE", "", "write a Chrome-trace timeline to this file (rank 0, "
     "or every rank with KOLO_TIMELINE_ALL_RANKS=1); DYNAMIC: none until "
     "start_timeline", parse_string, F(timeline), PER_RANK, "HOROVOD_TIMELINE"},
    {"KOLO_TIMELINE_MARK_CYCLES", "0", "1: mark every negotiation round",
     parse_nonneg, F(timeline_mark_cycles), PER_RANK,
     "HOROVOD_TIMELINE_MARK_CYCLES"},
    {"KOLO_TIMELINE_ALL_RANKS", "0",
     "1: every rank writes its own timeline, FILE with the rank before .json",
     parse_nonneg, F(timeline_all_ranks), PER_RANK, NULL},
    {"KOLO_FLIGHT_RECORDER", "2048", "the flight recorder: the last N "
     "collectives of this rank (tensor, timings, fusion batch, how each "
     "ended) and where its threads are, written to KOLO_FLIGHT_DIR when "
     "kolo reports an error, a stall or a timeout, on SIGUSR1 and at "
     "shutdown (0: off, no records, no SIGUSR1 handler)", parse_records,
     F(flight_recorder), PER_RANK, NULL},
    {"KOLO_FLIGHT_DIR", "", "where the flight recorder writes its dumps "
     "(DIR/rankR.json; created if missing; kolorun sets it, --flight-dir); "
     "unset: no dump files; read them with kolo-timeline why DIR",
     parse_string, F(flight_dir), PER_RANK, NULL},
    {"KOLO_JOB_START_US", "0", "the job's start (kolorun sets it): time zero "
     "of every rank's timeline", parse_nonneg, F(job_start_us), PER_RANK, NULL},
    {"KOLO_STALL_CHECK_DISABLE", "0", "1: no stall check at all, neither "
     "warnings nor shutdown (kolorun --no-stall-check)", parse_nonneg,
     F(stall_check_disable), PER_RANK, "HOROVOD_STALL_CHECK_DISABLE"},
    {"KOLO_STALL_CHECK_TIME_SECONDS", "60",
     "warn when some ranks wait this long for a tensor others have not "
     "enqueued (0: off)",
     parse_seconds, F(stall_check_s), PER_RANK,
     "HOROVOD_STALL_CHECK_TIME_SECONDS"},
    {"KOLO_STALL_SHUTDOWN_TIME_SECONDS", "0",
     "stop the job when a tensor waits this long for other ranks (0: off)",
     parse_seconds, F(stall_shutdown_s), PER_RANK,
     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
    {"KOLO_DEADLOCK_CHECK_SECONDS", "2",
     "stop the job when every rank has waited this long inside kolo for "
     "tensors that some rank never enqueued, none able to go on (0: off, "
     "wait as Horovod does)",
     parse_seconds, F(deadlock_check_s), PER_RANK, NULL},
    {"KOLO_STRAGGLER_SHARE", "0.2",
     "warn when one rank is the last to be ready in most rounds and the "
     "others wait for it at least this share of the time (0: no measure)",
     parse_share, F(straggler_share), AGREE, NULL},
    {"KOLO_CONTROLLER", "auto", "backend that negotiates: shm when every "
     "rank is on one host, else gloo (auto), gloo, mpi or shm",
     parse_backend, F(controller), AGREE, "HOROVOD_CONTROLLER"},
    {"KOLO_CPU_OPERATIONS", "auto", "backend that moves host tensors: shm "
     "when every rank is on one host, else gloo (auto), gloo, mpi or shm",
     parse_backend, F(cpu_operations), AGREE, "HOROVOD_CPU_OPERATIONS"},
    {"KOLO_HIERARCHICAL_ALLREDUCE", "auto", "allreduce through shared memory "
     "within each host and the network across hosts (auto: on when a job "
     "spans hosts with several ranks on each)", parse_auto_bool,
     F(hierarchical), AGREE, "HOROVOD_HIERARCHICAL_ALLREDUCE"},
    {"KOLO_SHM_SLOT_BYTES", "auto", "shared memory: bytes each rank "
     "writes per step (a chunk of an allreduce); 4K to 1G, or auto: a "
     "quarter of the L2 cache, 256K to 1M", parse_bytes_auto,
     F(shm_slot_bytes), AGREE, NULL},
    {"KOLO_RING_SEND_BUFFER", "128K", "kolo's ring over Gloo: the send "
     "buffer (SO_SNDBUF) of each of its sockets, which bounds the bytes in "
     "flight on a link; 64K to 1G, or 0: the kernel's autotuning (raise it "
     "where a link's bandwidth times its round trip is larger)", parse_bytes,
     F(ring_send_buffer), PER_RANK, NULL},
    {"KOLO_SHM_SPIN_US", "50", "shared memory: microseconds a rank spins "
     "before it sleeps, when the host has a core per rank (0: never spin)",
     parse_nonneg, F(shm_spin_us), PER_RANK, NULL},
    {"KOLO_AUTOTUNE", "0", "1: tune the fusion threshold, chunk size and "
     "cycle time on the running job", parse_nonneg, F(autotune), AGREE,
     "HOROVOD_AUTOTUNE"},
    {"KOLO_AUTOTUNE_LOG", "", "rank 0 writes every autotune window there "
     "(CSV)", parse_string, F(autotune_log), PER_RANK, "HOROVOD_AUTOTUNE_LOG"},
    {"KOLO_AUTOTUNE_WINDOW", "20", "autotune: rounds with work per measured "
     "window", parse_positive, F(autotune_window), AGREE,
     "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
    {"KOLO_ELASTIC", "0", "1: an elastic job (kolorun --min-np or "
     "--host-discovery-script sets it): kolo_init takes this rank's place "
     "from the membership kolorun publishes", parse_nonneg, F(elastic), AGREE,
     "HOROVOD_ELASTIC"},
    {"KOLO_ELASTIC_ID", "", "this worker's host:slot in an elastic job "
     "(kolorun sets it)", parse_elastic_id, F(elastic_id), PER_RANK, NULL},
    {"KOLO_ELASTIC_TIMEOUT", "600", "kolorun --elastic-timeout: an elastic "
     "kolo_init waits this long, and 5 s more, for a membership that "
     "includes this worker",
     parse_positive_seconds, F(elastic_timeout_s), PER_RANK,
     "HOROVOD_ELASTIC_TIMEOUT"},
};

#undef F

/* file:DIR, or redis:HOST:PORT[/JOB] (HOST may be [IPv6]; JOB names the
 * job's keys, without blanks). */
static int rendezvous_ok(const char *r)
{
    const char *host, *colon, *slash;
    char *end;
    long port;

    if (strncmp(r, "file:", 5) == 0)
        return r[5] != '\0';
    if (strncmp(r, "mpi:", 4) == 0)
        return r[4] != '\0';
    if (strncmp(r, "redis:", 6) != 0)
        return 0;
    host = r + 6;
    /* The port follows the host: after "]" for [IPv6], else the last ":"
     * before the job name. */
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (close == NULL || close == host + 1 || close[1] != ':')
            return 0;
        colon = close + 1;
    } else {
        slash = strchr(host, '/');
        colon = NULL;
        for (const char *p = host; *p && (slash == NULL || p < slash); p++)
            if (*p == ':')
                colon = p;
        if (colon == NULL || colon == host)
            return 0;
    }
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    if (errno != 0 || end == colon + 1 || port < 1 || port > 65535 ||
        (*end != '\0' && *end != '/'))
        return 0;
    if (*end == '/' && (end[1] == '\0' || strpbrk(end + 1, " \t\n") != NULL))
        return 0;
    return 1;
}

/* The address of `iface` on this host (IPv4 first, else IPv6 that is not
 * link-local) into out; -1 when it has none. `names` gets the interfaces
 * that exist, for the message. */
static int interface_address(const char *iface, char *out, size_t len,
                             char *names, size_t nlen)
{
    struct ifaddrs *all, *ifa;
    int found = -1;
    size_t used = 0;

    names[0] = '\0';
    if (getifaddrs(&all) != 0)
        return -1;
    for (int pass = 0; pass < 2 && found != 0; pass++) {
        for (ifa = all; ifa != NULL && found != 0; ifa = ifa->ifa_next) {
            if (ifa->ifa_addr == NULL || strcmp(ifa->ifa_name, iface) != 0)
                continue;
            if (pass == 0 && ifa->ifa_addr->sa_family == AF_INET) {
                const struct sockaddr_in *a = (const void *)ifa->ifa_addr;
                if (inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)len))
                    found = 0;
            } else if (pass == 1 && ifa->ifa_addr->sa_family == AF_INET6) {
                const struct sockaddr_in6 *a = (const void *)ifa->ifa_addr;
                if (!IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr) &&
                    inet_ntop(AF_INET6, &a->sin6_addr, out, (socklen_t)len))
                    found = 0;
            }
        }
    }
    for (ifa = all; ifa != NULL; ifa = ifa->ifa_next) {
        size_t n = strlen(ifa->ifa_name);
        char *seen = strstr(names, ifa->ifa_name);
        if (seen != NULL && (seen[n] == '\0' || seen[n] == ',') &&
            (seen == names || seen[-1] == ' '))
            continue;
        if (used + n + 3 < nlen) {
            used += (size_t)snprintf(names + used, nlen - used, "%s%s",
                                     used ? ", " : "", ifa->ifa_name);
        }
    }
    freeifaddrs(all);
    return found;
}

/* The text of a row's variable: NAME, else its Horovod twin (*from says
 * which), else NULL. */
static const char *row_text(const config_row_t *row,
                            const char *(*getenv_fn)(const char *),
                            const char **from)
{
    const char *value = getenv_fn(row->name);

    *from = row->name;
    if (value == NULL && row->twin != NULL &&
        (value = getenv_fn(row->twin)) != NULL)
        *from = row->twin;
    return value;
}

/* Every row's field: from its variable, else its twin, else its default
 * (a row with neither keeps the field's preset, zero). */
static int read_rows(kolo__config_t *cfg,
                     const char *(*getenv_fn)(const char *), kolo__err_t *err)
{
    const char *from;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const config_row_t *row = &rows[i];
        const char *value = row_text(row, getenv_fn, &from);
        const char *expected = "";
        void *field = (char *)cfg + row->offset;

        if (value == NULL)
            value = row->dflt;
        if (value == NULL)
            continue;
        if (row->parse(value, field, &expected) != 0)
            return kolo__err_set(err, KOLO_ERR_CONFIG,
                                 "environment variable %s='%.200s%s' is "
                                 "invalid: expected %s",
                                 from, value,
                                 strlen(value) > 200 ? "..." : "", expected);
    }
    return KOLO_OK;
}

/* The settings that follow from others where their own variable is not
 * set. */
static void derive(kolo__config_t *cfg, const char *(*getenv_fn)(const char *))
{
    if (kolo__config_get("KOLO_LOCAL_RANK", getenv_fn) == NULL)
        cfg->local_rank = cfg->rank;
    if (kolo__config_get("KOLO_LOCAL_SIZE", getenv_fn) == NULL)
        cfg->local_size = cfg->size;
    /* Horovod's HOROVOD_STALL_CHECK_DISABLE turns the stall inspector off,
     * warnings and shutdown alike. */
    if (cfg->stall_check_disable > 0)
        cfg->stall_check_s = cfg->stall_shutdown_s = cfg->deadlock_check_s = 0;
}

/* KOLO_<scope>RANK below KOLO_<scope>SIZE, scope "", "LOCAL_" or
 * "CROSS_". */
static int rank_below(const char *scope, int64_t rank, int64_t size,
                      kolo__err_t *err)
{
    if (rank < size)
        return KOLO_OK;
    return kolo__err_set(err, KOLO_ERR_CONFIG,
                         "KOLO_%sRANK=%lld is not below KOLO_%sSIZE=%lld",
                         scope, (long long)rank, scope, (long long)size);
}

/* A job of several ranks meets at a rendezvous, of a form kolo reads. */
static int check_rendezvous(const kolo__config_t *cfg,
                            const char *(*getenv_fn)(const char *),
                            kolo__err_t *err)
{
    if (cfg->size > 1 && cfg->rendezvous[0] == '\0') {
        /* horovodrun's ranks meet through its own HTTP server, which kolo
         * does not speak; its command line works with kolorun. */
        if (getenv_fn("HOROVOD_GLOO_RENDEZVOUS_ADDR") != NULL)
            return kolo__err_set(err, KOLO_ERR_CONFIG,
                                 "HOROVOD_SIZE=%lld: this process was "
                                 "started by horovodrun, whose rendezvous "
                                 "kolo cannot use; run the same command "
                                 "line with kolorun in place of horovodrun",
                                 (long long)cfg->size);
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "%s=%lld but KOLO_RENDEZVOUS is not set: "
                             "start multi-rank jobs with kolorun, mpirun, "
                             "torchrun or srun",
                             getenv_fn("KOLO_SIZE") ? "KOLO_SIZE"
                                                    : "HOROVOD_SIZE",
                             (long long)cfg->size);
    }
    /* mpi:TOKEN is the form kolo_init sets itself under mpirun. */
    if (cfg->rendezvous[0] != '\0' && !rendezvous_ok(cfg->rendezvous))
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable KOLO_RENDEZVOUS='%s' is "
                             "invalid: expected file:DIR or "
                             "redis:HOST:PORT[/JOB] (port 1 to 65535)",
                             cfg->rendezvous);
    return KOLO_OK;
}

/* The buffer sizes within what the backends take. */
static int check_buffers(const kolo__config_t *cfg, kolo__err_t *err)
{
    if (cfg->shm_slot_bytes != 0 &&
        (cfg->shm_slot_bytes < 4096 || cfg->shm_slot_bytes > ((int64_t)1 << 30)))
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable KOLO_SHM_SLOT_BYTES=%lld is "
                             "invalid: expected auto or 4K to 1G bytes",
                             (long long)cfg->shm_slot_bytes);
    if (cfg->ring_send_buffer != 0 &&
        (cfg->ring_send_buffer < 65536 || cfg->ring_send_buffer > ((int64_t)1 << 30)))
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable KOLO_RING_SEND_BUFFER=%lld "
                             "is invalid: expected 0 (the kernel's) or 64K to "
                             "1G bytes",
                             (long long)cfg->ring_send_buffer);
    return KOLO_OK;
}

/* KOLO_NETWORK_INTERFACE: this rank's address on it becomes the host name
 * its peers reach it at. */
static int resolve_interface(kolo__config_t *cfg, kolo__err_t *err)
{
    char names[512], host[256] = "";

    if (cfg->network_interface[0] == '\0')
        return KOLO_OK;
    gethostname(host, sizeof(host) - 1);
    if (interface_address(cfg->network_interface, cfg->hostname,
                          sizeof(cfg->hostname), names, sizeof(names)) != 0)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_NETWORK_INTERFACE=%s: rank %lld on "
                             "host %s has no interface %s with an IP "
                             "address (interfaces there: %s)",
                             cfg->network_interface,
                             (long long)cfg->rank, host,
                             cfg->network_interface,
                             names[0] ? names : "none");
    return KOLO_OK;
}

int kolo__config_load(kolo__config_t *cfg, const char *(*getenv_fn)(const char *),
                      kolo__err_t *err)
{
    memset(cfg, 0, sizeof(*cfg));
    KOLO__CHECK(read_rows(cfg, getenv_fn, err));
    derive(cfg, getenv_fn);
    KOLO__CHECK(rank_below("", cfg->rank, cfg->size, err));
    KOLO__CHECK(rank_below("LOCAL_", cfg->local_rank, cfg->local_size, err));
    KOLO__CHECK(rank_below("CROSS_", cfg->cross_rank, cfg->cross_size, err));
    KOLO__CHECK(check_rendezvous(cfg, getenv_fn, err));
    KOLO__CHECK(check_buffers(cfg, err));
    return resolve_interface(cfg, err);
}

void kolo__config_print_doc(void *out)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char twin[64] = "";
        if (rows[i].twin != NULL)
            snprintf(twin, sizeof(twin), " [Horovod: %s]", rows[i].twin);
        fprintf(out, "%-24s %-12s %s%s%s\n", rows[i].name,
                rows[i].dflt ? rows[i].dflt : "-", rows[i].doc,
                rows[i].agree ? " [same on every rank]" : "", twin);
    }
}

const char *kolo__config_get(const char *name,
                             const char *(*getenv_fn)(const char *))
{
    const char *from;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (strcmp(rows[i].name, name) == 0)
            return row_text(&rows[i], getenv_fn, &from);
    return getenv_fn(name);
}

/* The value of a row's field as text: numbers as parsed (so that "16M"
 * and "16777216" agree), strings as given. */
static void row_value(const config_row_t *row, const kolo__config_t *cfg,
                      char *out, size_t len)
{
    const void *field = (const char *)cfg + row->offset;

    if (row->parse == parse_seconds || row->parse == parse_positive_seconds)
        snprintf(out, len, "%g", *(const double *)field);
    else if (row->parse == parse_string || row->parse == parse_host ||
             row->parse == parse_iface || row->parse == parse_backend)
        snprintf(out, len, "%s", (const char *)field);
    else if ((row->parse == parse_chunk || row->parse == parse_auto_bool) &&
             *(const int64_t *)field == -1)
        snprintf(out, len, "auto");
    else if (row->parse == parse_bytes_auto && *(const int64_t *)field == 0)
        snprintf(out, len, "auto");
    else
        snprintf(out, len, "%lld", (long long)*(const int64_t *)field);
}

size_t kolo__config_agreed(const kolo__config_t *cfg, const char *build,
                           char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "kolo=%s\n", build);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]) && used < len; i++) {
        char v[256];
        if (!rows[i].agree)
            continue;
        row_value(&rows[i], cfg, v, sizeof(v));
        used += (size_t)snprintf(out + used, len - used, "%s=%s\n",
                                 rows[i].name, v);
    }
    return used;
}

/* ---- typos -------------------------------------------------------------- */

/* KOLO_* variables that are not settings of the runtime but are still
 * ours: the test suite's and the tools', and pip's build variables (the
 * twins of Horovod's, read by setup.py). */
static const char *const other_names[] = {
    "KOLO_TOP_BUILDDIR", "KOLO_TOP_SRCDIR", "KOLO_TEST_*", "KOLO_PYTEST_*",
    "KOLO_FUZZ_SECONDS", "KOLO_SOAK_STEPS", "KOLO_LIBRARY", "KOLO_PYTHON",
    "KOLO_MPIRUN", "KOLO_MPI_TEST_MAX_COUNT", "KOLO_BENCH_FAULT",
    "KOLO_WITH_*", "KOLO_WITHOUT_*", "KOLO_GPU", "KOLO_GPU_OPERATIONS",
    "KOLO_GPU_ALLREDUCE", "KOLO_GPU_ALLGATHER", "KOLO_GPU_BROADCAST",
    "KOLO_GPU_ALLTOALL", "KOLO_GPU_REDUCESCATTER", "KOLO_CUDA_HOME",
    "KOLO_NCCL_HOME", "KOLO_NCCL_INCLUDE", "KOLO_NCCL_LIB",
    "KOLO_BUILD_CUDA_CC_LIST", "KOLO_BUILD_ARCH_FLAGS", "KOLO_DEBUG",
    /* The job's secret (auth.c): never a setting, never printed. */
    "KOLO_SECRET", "KOLO_REQUIRE_SECRET", "KOLO_REDIS_PASSWORD",
    "KOLO_REDIS_USER",
};

int kolo__config_is_known(const char *name)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (strcmp(rows[i].name, name) == 0)
            return 1;
    for (size_t i = 0; i < sizeof(other_names) / sizeof(other_names[0]); i++) {
        size_t n = strlen(other_names[i]);
        if (other_names[i][n - 1] == '*' ? strncmp(other_names[i], name, n - 1) == 0
                                         : strcmp(other_names[i], name) == 0)
            return 1;
    }
    return 0;
}

/* The search for the known name closest to a misspelled one. */
typedef struct closest {
    const char *name;  /* the misspelled one */
    const char *best;  /* the closest so far, or NULL */
    size_t best_d;     /* its edit distance */
} closest_t;

static void consider(closest_t *c, const char *candidate)
{
    size_t d = kolo__edit_distance(c->name, candidate);

    if (d < c->best_d) {
        c->best_d = d;
        c->best = candidate;
    }
}

/* The closest name, unless even it is too far: past a third of the name it
 * is no longer a typo of it. */
static const char *typo_of(const closest_t *c)
{
    return c->best != NULL && c->best_d * 3 <= strlen(c->name) ? c->best : NULL;
}

const char *kolo__config_closest(const char *name)
{
    closest_t c = {name, NULL, 99};

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        consider(&c, rows[i].name);
    return typo_of(&c);
}

/* ---- Horovod's variables without a kolo meaning ------------------------ */

/* When a set variable deserves a warning. Horovod reads its switches as
 * integers, "on" when above 0 (strtol), and so does this. */
typedef enum {
    NOTE_ALWAYS,     /* it asks for what kolo does not do */
    NOTE_IF_ON,      /* only when on: off asks for what kolo does anyway */
    NOTE_IF_OFF,     /* only when off */
    NOTE_UNLESS_ONE, /* only for another number than 1 */
    NOTE_NEVER,      /* kolo does what it asks anyway, or it is read when
                      * Horovod is built, not at run time */
} note_when_t;

/* The reasons several variables share. */
#define WHY_AUTOTUNE                                                          \
    "kolo's autotune is a coordinate search, not Bayesian optimisation; "     \
    "KOLO_AUTOTUNE_WINDOW sets its window"
#define WHY_HOROVODRUN                                                        \
    "it is horovodrun's, whose rendezvous kolo cannot use: start the job "    \
    "with kolorun, which takes horovodrun's flags"

static const struct horovod_note {
    const char *name; /* a trailing '*' matches any end */
    note_when_t when;
    const char *why;
} horovod_notes[] = {
    {"HOROVOD_HIERARCHICAL_ALLGATHER", NOTE_IF_ON, "kolo has no hierarchical "
     "allgather (allgather goes through shared memory within a host)"},
    {"HOROVOD_MPI_THREADS_DISABLE", NOTE_IF_ON, "kolo's background thread "
     "calls MPI, so kolo needs MPI_THREAD_MULTIPLE"},
    {"HOROVOD_NUM_NCCL_STREAMS", NOTE_UNLESS_ONE, "kolo uses one NCCL stream "
     "per process set"},
    {"HOROVOD_THREAD_AFFINITY", NOTE_ALWAYS, "kolo does not pin its "
     "background thread (taskset or numactl pin the whole rank)"},
    {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", NOTE_ALWAYS, WHY_AUTOTUNE},
    {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", NOTE_ALWAYS, WHY_AUTOTUNE},
    {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", NOTE_ALWAYS, WHY_AUTOTUNE},
    {"HOROVOD_CCL_*", NOTE_ALWAYS, "kolo has no oneCCL backend"},
    {"HOROVOD_BATCH_D2D_MEMCOPIES", NOTE_IF_OFF, "kolo always packs GPU "
     "tensors with its own batched kernels"},
    {"HOROVOD_DISABLE_GROUP_FUSION", NOTE_IF_ON, "kolo always fuses a "
     "group's tensors together"},
    {"HOROVOD_ENABLE_XLA_OPS", NOTE_IF_ON, "kolo has no TensorFlow binding"},
    {"HOROVOD_ADASUM_*", NOTE_ALWAYS, "kolo has no Adasum"},
    {"HOROVOD_LOG_HIDE_TIME", NOTE_IF_OFF, "kolo's log lines carry no time "
     "(kolorun --prefix-output-with-timestamp stamps every line)"},
    {"HOROVOD_GLOO_RENDEZVOUS_ADDR", NOTE_ALWAYS, WHY_HOROVODRUN},
    {"HOROVOD_GLOO_RENDEZVOUS_PORT", NOTE_ALWAYS, WHY_HOROVODRUN},
    {"HOROVOD_ENABLE_ASYNC_COMPLETION", NOTE_NEVER, "kolo completes GPU "
     "work asynchronously always"},
    {"HOROVOD_DYNAMIC_PROCESS_SETS", NOTE_NEVER, "kolo adds and removes "
     "process sets at any time"},
    {"HOROVOD_DISABLE_NVTX_RANGES", NOTE_NEVER, "kolo marks no NVTX ranges"},
    /* Read by Horovod's build (pip install), not by a running job. */
    {"HOROVOD_WITH_*", NOTE_NEVER, ""},
    {"HOROVOD_WITHOUT_*", NOTE_NEVER, ""},
    {"HOROVOD_BUILD_*", NOTE_NEVER, ""},
    {"HOROVOD_GPU", NOTE_NEVER, ""},
    {"HOROVOD_GPU_*", NOTE_NEVER, ""},
    {"HOROVOD_CUDA_*", NOTE_NEVER, ""},
    {"HOROVOD_NCCL_HOME", NOTE_NEVER, ""},
    {"HOROVOD_NCCL_INCLUDE", NOTE_NEVER, ""},
    {"HOROVOD_NCCL_LIB", NOTE_NEVER, ""},
    {"HOROVOD_NCCL_LINK", NOTE_NEVER, ""},
    {"HOROVOD_ROCM_*", NOTE_NEVER, ""},
    {"HOROVOD_MPICXX_SHOW", NOTE_NEVER, ""},
    {"HOROVOD_CMAKE", NOTE_NEVER, ""},
    {"HOROVOD_DEBUG", NOTE_NEVER, ""},
    {"HOROVOD_CPU_OPERATIONS_DEFAULT", NOTE_NEVER, ""},
    {"HOROVOD_CONTROLLER_DEFAULT", NOTE_NEVER, ""},
    {"HOROVOD_ALLOW_MIXED_GPU_IMPL", NOTE_NEVER, ""},
};

static const struct horovod_note *horovod_note(const char *name)
{
    for (size_t i = 0; i < sizeof(horovod_notes) / sizeof(horovod_notes[0]); i++) {
        const char *n = horovod_notes[i].name;
        size_t len = strlen(n);
        if (n[len - 1] == '*' ? strncmp(n, name, len - 1) == 0
                              : strcmp(n, name) == 0)
            return &horovod_notes[i];
    }
    return NULL;
}

static int note_applies(note_when_t when, const char *value)
{
    long v = strtol(value, NULL, 10);

    switch (when) {
    case NOTE_ALWAYS: return 1;
    case NOTE_IF_ON: return v > 0;
    case NOTE_IF_OFF: return v <= 0;
    case NOTE_UNLESS_ONE: return v != 1;
    default: return 0;
    }
}

/* The HOROVOD_* name closest to a misspelled one: twins and notes. */
static const char *horovod_closest(const char *name)
{
    closest_t c = {name, NULL, 99};

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (rows[i].twin != NULL)
            consider(&c, rows[i].twin);
    for (size_t i = 0; i < sizeof(horovod_notes) / sizeof(horovod_notes[0]); i++) {
        const char *n = horovod_notes[i].name;
        if (n[strlen(n) - 1] != '*')
            consider(&c, n);
    }
    return typo_of(&c);
}

/* Both a KOLO_* variable and its twin are set: do they say the same? They
 * are compared parsed ("1M" and "1048576" agree); a twin that does not
 * parse is kolo__config_load's to report. */
static int twin_differs(const config_row_t *row, const char *mine,
                        const char *twin)
{
    kolo__config_t a, b;
    const char *expected;
    char va[4200], vb[4200];

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    if (row->parse(mine, (char *)&a + row->offset, &expected) != 0 ||
        row->parse(twin, (char *)&b + row->offset, &expected) != 0)
        return 0;
    row_value(row, &a, va, sizeof(va));
    row_value(row, &b, vb, sizeof(vb));
    return strcmp(va, vb) != 0;
}

void kolo__config_scan(char *const *env,
                       const char *(*getenv_fn)(const char *),
                       void (*note)(const char *msg, void *arg), void *arg)
{
    char msg[1024];

    for (char *const *e = env; e != NULL && *e != NULL; e++) {
        char name[128];
        const char *value = *e + strcspn(*e, "=");
        size_t n = (size_t)(value - *e);

        if (n >= sizeof(name) || *value != '=')
            continue;
        memcpy(name, *e, n);
        name[n] = '\0';
        value++;
        if (strncmp(name, "KOLO_", 5) == 0 && !kolo__config_is_known(name)) {
            const char *close = kolo__config_closest(name);
            snprintf(msg, sizeof(msg),
                     "%s is not a variable kolo knows, and is ignored%s%s%s",
                     name, close ? " (did you mean " : "", close ? close : "",
                     close ? "?)" : "; the README's table lists the known "
                                    "ones");
            note(msg, arg);
        } else if (strncmp(name, "HOROVOD_", 8) == 0) {
            const config_row_t *twin = NULL;
            const struct horovod_note *h;

            for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
                if (rows[i].twin && strcmp(rows[i].twin, name) == 0)
                    twin = &rows[i];
            if (twin != NULL) {
                const char *mine = getenv_fn(twin->name);
                if (mine != NULL && twin_differs(twin, mine, value)) {
                    snprintf(msg, sizeof(msg),
                             "%s=%.200s and %s=%.200s are both set and "
                             "differ: kolo uses %s", twin->name, mine, name,
                             value, twin->name);
                    note(msg, arg);
                }
            } else if ((h = horovod_note(name)) != NULL) {
                if (note_applies(h->when, value)) {
                    snprintf(msg, sizeof(msg), "%s=%.200s is ignored: %s",
                             name, value, h->why);
                    note(msg, arg);
                }
            } else {
                const char *close = horovod_closest(name);
                snprintf(msg, sizeof(msg),
                         "%s is not a Horovod variable kolo knows, and is "
                         "ignored%s%s%s",
                         name, close ? " (did you mean " : "",
                         close ? close : "", close ? "?)" : "");
                note(msg, arg);
            }
        }
    }
}
