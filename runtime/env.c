/*
 * env.c — one table drives the parsing, the defaults and the documentation
 * of every KOLO_* variable, so the three can never disagree.
 *
 * Each row: {name, default, doc, parser, offset into kolo__config_t}. A
 * parser takes the text and a pointer to the field and returns 0, or -1 with
 * a short description of what it expected; kolo__config_load turns that into
 * a message naming the variable. Cross-field checks (rank < size, ...) come
 * after the table.
 */
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

static int parse_string(const char *text, void *field, const char **expected)
{
    *expected = "at most 4095 characters";
    if (strlen(text) >= 4096)
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

static int parse_backend(const char *text, void *field, const char **expected)
{
    *expected = "auto, gloo, mpi or shm";
    if (strcmp(text, "auto") != 0 && strcmp(text, "gloo") != 0 &&
        strcmp(text, "mpi") != 0 && strcmp(text, "shm") != 0)
        return -1;
    strcpy(field, text);
    return 0;
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
    if (kolo__log_level_parse(text, &level) != 0)
        return -1;
    *(int64_t *)field = level;
    return 0;
}

#define F(field) offsetof(kolo__config_t, field)

static const config_row_t rows[] = {
    {"KOLO_RANK", "0", "rank of this process", parse_nonneg, F(rank), PER_RANK},
    {"KOLO_SIZE", "1", "number of ranks in the job", parse_positive, F(size), AGREE},
    {"KOLO_LOCAL_RANK", NULL, "rank among the ranks of this host (default: KOLO_RANK)",
     parse_nonneg, F(local_rank), PER_RANK},
    {"KOLO_LOCAL_SIZE", NULL, "ranks on this host (default: KOLO_SIZE)",
     parse_positive, F(local_size), PER_RANK},
    {"KOLO_CROSS_RANK", "0", "index of this host", parse_nonneg, F(cross_rank), PER_RANK},
    {"KOLO_CROSS_SIZE", "1", "number of hosts", parse_positive, F(cross_size), AGREE},
    {"KOLO_RENDEZVOUS", "", "where ranks meet: file:DIR or "
     "redis:HOST:PORT[/JOB] (kolorun sets it)",
     parse_string, F(rendezvous), PER_RANK},
    {"KOLO_HOSTNAME", "127.0.0.1", "address this rank's transport binds",
     parse_host, F(hostname), PER_RANK},
    {"KOLO_NETWORK_INTERFACE", "", "bind this interface's address instead "
     "of KOLO_HOSTNAME (kolorun --network-interface)", parse_iface,
     F(network_interface), PER_RANK},
    {"KOLO_FUSION_THRESHOLD", "134217728",
     "bytes of tensors fused into one reduction (0: no fusion)", parse_bytes,
     F(fusion_threshold), AGREE},
    {"KOLO_CHUNK_BYTES", "auto",
     "allreduces are reduced in pieces of this many bytes, each copied in, "
     "reduced and copied out while it is in cache (0: whole batches; auto: "
     "16M over Gloo, 4M otherwise; over Gloo or MPI a lone tensor that is "
     "neither scaled nor averaged goes whole)",
     parse_chunk, F(chunk_bytes), AGREE},
    {"KOLO_CYCLE_TIME", "5",
     "milliseconds between negotiation rounds while tensors wait for other ranks",
     parse_seconds, F(cycle_time_ms), AGREE},
    {"KOLO_CACHE_CAPACITY", "1024",
     "negotiated tensors remembered by the response cache (0: off)",
     parse_nonneg, F(cache_capacity), AGREE},
    {"KOLO_TIMEOUT_SECONDS", "60",
     "a backend operation that makes no progress this long fails",
     parse_positive_seconds, F(timeout_s), PER_RANK},
    {"KOLO_START_TIMEOUT", "60",
     "seconds init waits for every rank to arrive", parse_positive_seconds,
     F(start_timeout_s), PER_RANK},
    {"KOLO_LOG_LEVEL", "warning", "trace, debug, info, warning, error or off",
     parse_level, F(log_level), PER_RANK},
    {"KOLO_TIMELINE", "", "write a Chrome-trace timeline to this file (rank 0, "
     "or every rank with KOLO_TIMELINE_ALL_RANKS=1); DYNAMIC: none until "
     "start_timeline", parse_string, F(timeline), PER_RANK},
    {"KOLO_TIMELINE_MARK_CYCLES", "0", "1: mark every negotiation round",
     parse_nonneg, F(timeline_mark_cycles), PER_RANK},
    {"KOLO_TIMELINE_ALL_RANKS", "0",
     "1: every rank writes its own timeline, FILE with the rank before .json",
     parse_nonneg, F(timeline_all_ranks), PER_RANK},
    {"KOLO_JOB_START_US", "0", "the job's start (kolorun sets it): time zero "
     "of every rank's timeline", parse_nonneg, F(job_start_us), PER_RANK},
    {"KOLO_STALL_CHECK_TIME_SECONDS", "60",
     "warn when some ranks wait this long for a tensor others have not "
     "enqueued (0: off)",
     parse_seconds, F(stall_check_s), PER_RANK},
    {"KOLO_STALL_SHUTDOWN_TIME_SECONDS", "0",
     "stop the job when a tensor waits this long for other ranks (0: off)",
     parse_seconds, F(stall_shutdown_s), PER_RANK},
    {"KOLO_CONTROLLER", "auto", "backend that negotiates: shm when every "
     "rank is on one host, else gloo (auto), gloo, mpi or shm",
     parse_backend, F(controller), AGREE},
    {"KOLO_CPU_OPERATIONS", "auto", "backend that moves host tensors: shm "
     "when every rank is on one host, else gloo (auto), gloo, mpi or shm",
     parse_backend, F(cpu_operations), AGREE},
    {"KOLO_HIERARCHICAL_ALLREDUCE", "auto", "allreduce through shared memory "
     "within each host and the network across hosts (auto: on when a job "
     "spans hosts with several ranks on each)", parse_auto_bool,
     F(hierarchical), AGREE},
    {"KOLO_SHM_SLOT_BYTES", "auto", "shared memory: bytes each rank "
     "writes per step (a chunk of an allreduce); 4K to 1G, or auto: a "
     "quarter of the L2 cache, 256K to 1M", parse_bytes_auto,
     F(shm_slot_bytes), AGREE},
    {"KOLO_SHM_SPIN_US", "50", "shared memory: microseconds a rank spins "
     "before it sleeps, when the host has a core per rank (0: never spin)",
     parse_nonneg, F(shm_spin_us), PER_RANK},
    {"KOLO_AUTOTUNE", "0", "1: tune the fusion threshold, chunk size and "
     "cycle time on the running job", parse_nonneg, F(autotune), AGREE},
    {"KOLO_AUTOTUNE_LOG", "", "rank 0 writes every autotune window there "
     "(CSV)", parse_string, F(autotune_log), PER_RANK},
    {"KOLO_AUTOTUNE_WINDOW", "20", "autotune: rounds with work per measured "
     "window", parse_positive, F(autotune_window), AGREE},
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

int kolo__config_load(kolo__config_t *cfg, const char *(*getenv_fn)(const char *),
                      kolo__err_t *err)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const config_row_t *row = &rows[i];
        const char *value = getenv_fn(row->name);
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
                                 row->name, value,
                                 strlen(value) > 200 ? "..." : "", expected);
    }
    if (getenv_fn("KOLO_LOCAL_RANK") == NULL)
        cfg->local_rank = cfg->rank;
    if (getenv_fn("KOLO_LOCAL_SIZE") == NULL)
        cfg->local_size = cfg->size;

    if (cfg->rank >= cfg->size)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_RANK=%lld is not below KOLO_SIZE=%lld",
                             (long long)cfg->rank, (long long)cfg->size);
    if (cfg->local_rank >= cfg->local_size)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_LOCAL_RANK=%lld is not below KOLO_LOCAL_SIZE=%lld",
                             (long long)cfg->local_rank, (long long)cfg->local_size);
    if (cfg->cross_rank >= cfg->cross_size)
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_CROSS_RANK=%lld is not below KOLO_CROSS_SIZE=%lld",
                             (long long)cfg->cross_rank, (long long)cfg->cross_size);
    if (cfg->size > 1 && cfg->rendezvous[0] == '\0')
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "KOLO_SIZE=%lld but KOLO_RENDEZVOUS is not set: "
                             "start multi-rank jobs with kolorun or mpirun",
                             (long long)cfg->size);
    /* mpi:TOKEN is the form kolo_init sets itself under mpirun. */
    if (cfg->rendezvous[0] != '\0' && !rendezvous_ok(cfg->rendezvous))
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable KOLO_RENDEZVOUS='%s' is "
                             "invalid: expected file:DIR or "
                             "redis:HOST:PORT[/JOB] (port 1 to 65535)",
                             cfg->rendezvous);
    if (cfg->shm_slot_bytes != 0 &&
        (cfg->shm_slot_bytes < 4096 || cfg->shm_slot_bytes > ((int64_t)1 << 30)))
        return kolo__err_set(err, KOLO_ERR_CONFIG,
                             "environment variable KOLO_SHM_SLOT_BYTES=%lld is "
                             "invalid: expected auto or 4K to 1G bytes",
                             (long long)cfg->shm_slot_bytes);
    if (cfg->network_interface[0] != '\0') {
        char names[512], host[256] = "";
        gethostname(host, sizeof(host) - 1);
        if (interface_address(cfg->network_interface, cfg->hostname,
                              sizeof(cfg->hostname), names,
                              sizeof(names)) != 0)
            return kolo__err_set(err, KOLO_ERR_CONFIG,
                                 "KOLO_NETWORK_INTERFACE=%s: rank %lld on "
                                 "host %s has no interface %s with an IP "
                                 "address (interfaces there: %s)",
                                 cfg->network_interface,
                                 (long long)cfg->rank, host,
                                 cfg->network_interface,
                                 names[0] ? names : "none");
    }
    return KOLO_OK;
}

void kolo__config_print_doc(void *out)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        fprintf(out, "%-24s %-12s %s%s\n", rows[i].name,
                rows[i].dflt ? rows[i].dflt : "-", rows[i].doc,
                rows[i].agree ? " [same on every rank]" : "");
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
 * ours: the test suite's and the tools'. */
static const char *const other_names[] = {
    "KOLO_TOP_BUILDDIR", "KOLO_TOP_SRCDIR", "KOLO_TEST_*", "KOLO_PYTEST_*",
    "KOLO_FUZZ_SECONDS", "KOLO_SOAK_STEPS", "KOLO_LIBRARY", "KOLO_PYTHON",
    "KOLO_MPIRUN", "KOLO_MPI_TEST_MAX_COUNT", "KOLO_BENCH_FAULT",
};

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];

    if (la >= 63 || lb >= 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof(size_t));
    }
    return prev[lb];
}

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

const char *kolo__config_closest(const char *name)
{
    const char *best = NULL;
    size_t best_d = 99, d;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if ((d = edit_distance(name, rows[i].name)) < best_d) {
            best_d = d;
            best = rows[i].name;
        }
    /* Past a third of the name it is no longer a typo of it. */
    return best != NULL && best_d * 3 <= strlen(name) ? best : NULL;
}
