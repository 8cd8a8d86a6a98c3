/*
 * mpi_ops.c — the MPI backend: kolo's ops table over an MPI communicator.
 *
 * DESIGN
 *
 * Communicators. MPI_COMM_WORLD's ranks are the job's global ranks (the
 * runtime takes them from MPI when mpirun started the job, ops/mpi/mpienv.c).
 * Each context (one per process set and role, ctl or data) owns a
 * communicator of cfg->members made with MPI_Comm_create_group, which only
 * the members call: a process set is created by its members alone. The tag
 * of the creation is a hash of the runtime's prefix, so two sets created one
 * after the other never match each other's messages. Every communicator
 * returns errors (MPI_ERRORS_RETURN) instead of aborting, so a failure
 * becomes a KOLO_ERR_BACKEND and a sentence; a lost peer in Open MPI 4.1 is
 * handled by mpirun, which stops the whole job.
 *
 * Limits. MPI collectives cannot be bounded in time or cancelled, so
 * KOLO_TIMEOUT_SECONDS does not apply to this backend: a stuck peer is
 * MPI's and mpirun's to handle. While a collective waits for a peer, Open
 * MPI polls (it yields the core when mpirun oversubscribes); the runtime
 * keeps those waits short, since a rank only starts a round after it has
 * woken its peers, and an idle job makes no MPI call at all.
 *
 * Threads. Every process set has its own background thread and they call
 * MPI at the same time, each on its own communicator: MPI must run at
 * MPI_THREAD_MULTIPLE (checked at init).
 *
 * Reductions. The runtime supplies the element-wise kernel per call, and an
 * MPI user op is a plain function pointer without an argument: the kernel
 * travels in a _Thread_local variable set just before the call. Open MPI
 * runs user ops in the calling thread, so each background thread sees its
 * own kernel. Elements are a contiguous datatype of elem_size bytes, so
 * float16 and bfloat16 are reduced by our own kernels.
 *
 * Counts beyond int. MPI counts are ints. Allreduce runs in pieces of at
 * most max_count elements; byte buffers larger than max_count become one
 * element of a derived datatype (chunks of max_count bytes and a
 * remainder); allgatherv and reduce-scatter whose displacements do not fit
 * fall back to one broadcast or reduce per rank (every rank knows every
 * size, so all take the same path); alltoallv is always pairwise
 * send-receives.
 * max_count is INT_MAX; KOLO_MPI_TEST_MAX_COUNT lowers it so that the tests
 * run these paths on small tensors (test use only).
 *
 * Wake tokens (ops.h). Open MPI's blocking receive polls, so a listener
 * thread waiting in MPI_Recv would burn a core while the job is idle.
 * Tokens travel over a UDP socket per context instead: its address is
 * allgathered over the communicator at init, a listener thread sleeps in
 * poll() and hands each token to cfg->on_wake, and wake_peers sends
 * non-blocking datagrams (a datagram lost under pressure costs one cycle
 * time, never correctness: the runtime's timer runs the round anyway).
 */
#define _GNU_SOURCE /* pipe2 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mpi.h>

#include "alloc.h"
#include "ops.h"

#define WAKE_MAGIC 0x6b6f6c6f77616b65ULL /* "kolowake" */
#define MAX_ELEM 32                     /* element types cached by size */

typedef struct wake_addr {
    struct sockaddr_storage addr;
    socklen_t len;
} wake_addr_t;

typedef struct mpi_ctx {
    MPI_Comm comm;
    int rank, size, global_rank;
    size_t max_count;
    MPI_Op op;
    MPI_Datatype elem[MAX_ELEM + 1]; /* contiguous types by elem_size */
    /* wake tokens */
    int sock, stop_pipe[2];
    wake_addr_t *peers;
    pthread_t listener;
    int listener_started;
    kolo__ops_wake_fn on_wake;
    void *wake_arg;
} mpi_ctx_t;

static _Thread_local kolo__ops_reduce_fn t_reduce;

static void user_op(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    t_reduce(inout, inout, in, (size_t)*len);
}

/* Writes "what failed on rank R: MPI's message" and returns the code. */
static int mpi_fail(const mpi_ctx_t *c, int mrc, const char *what, char *err,
                    size_t errlen)
{
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;

    if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof(msg), "MPI error %d", mrc);
    else
        msg[len] = '\0';
    snprintf(err, errlen, "%s failed on rank %d (rank %d of the %d-rank "
             "communicator): %s", what, c ? c->global_rank : -1,
             c ? c->rank : -1, c ? c->size : 0, msg);
    return KOLO_ERR_BACKEND;
}

#define MPI_CALL(c, what, call)                                         \
    do {                                                                \
        int mrc_ = (call);                                              \
        if (mrc_ != MPI_SUCCESS)                                        \
            return mpi_fail((c), mrc_, (what), err, errlen);            \
    } while (0)

/* ---- datatypes --------------------------------------------------------- */

static int elem_type(mpi_ctx_t *c, size_t elem_size, MPI_Datatype *out,
                     char *err, size_t errlen)
{
    MPI_Datatype t;

    if (elem_size == 0 || elem_size > MAX_ELEM) {
        snprintf(err, errlen, "the MPI backend reduces elements of 1 to %d "
                 "bytes, not %zu", MAX_ELEM, elem_size);
        return KOLO_ERR_INTERNAL;
    }
    if (c->elem[elem_size] == MPI_DATATYPE_NULL) {
        MPI_CALL(c, "MPI_Type_contiguous",
                 MPI_Type_contiguous((int)elem_size, MPI_BYTE, &t));
        MPI_CALL(c, "MPI_Type_commit", MPI_Type_commit(&t));
        c->elem[elem_size] = t;
    }
    *out = c->elem[elem_size];
    return KOLO_OK;
}

/* A buffer of `bytes` bytes as (count, type): MPI_BYTE when the count fits,
 * else one element of a derived type whose extent is exactly `bytes`.
 * *owned says whether the caller frees the type. */
typedef struct byte_span {
    MPI_Datatype type;
    int count, owned;
} byte_span_t;

static int span_make(mpi_ctx_t *c, size_t bytes, byte_span_t *s, char *err,
                     size_t errlen)
{
    MPI_Datatype chunk, body, rem, parts[2];
    MPI_Aint displ[2];
    int lens[2] = {1, 1};
    size_t q, r, unit = c->max_count;

    s->owned = 0;
    if (bytes <= c->max_count) {
        s->type = MPI_BYTE;
        s->count = (int)bytes;
        return KOLO_OK;
    }
    q = bytes / unit;
    r = bytes % unit;
    if (q > INT_MAX) {
        snprintf(err, errlen, "a buffer of %zu bytes is too large for the "
                 "MPI backend", bytes);
        return KOLO_ERR_INVALID_ARGUMENT;
    }
    MPI_CALL(c, "MPI_Type_contiguous",
             MPI_Type_contiguous((int)unit, MPI_BYTE, &chunk));
    MPI_CALL(c, "MPI_Type_contiguous",
             MPI_Type_contiguous((int)q, chunk, &body));
    MPI_Type_free(&chunk);
    if (r == 0) {
        s->type = body;
    } else {
        MPI_CALL(c, "MPI_Type_contiguous",
                 MPI_Type_contiguous((int)r, MPI_BYTE, &rem));
        parts[0] = body;
        parts[1] = rem;
        displ[0] = 0;
        displ[1] = (MPI_Aint)(q * unit);
        MPI_CALL(c, "MPI_Type_create_struct",
                 MPI_Type_create_struct(2, lens, displ, parts, &s->type));
        MPI_Type_free(&body);
        MPI_Type_free(&rem);
    }
    MPI_CALL(c, "MPI_Type_commit", MPI_Type_commit(&s->type));
    s->count = 1;
    s->owned = 1;
    return KOLO_OK;
}

static void span_free(byte_span_t *s)
{
    if (s->owned)
        MPI_Type_free(&s->type);
    s->owned = 0;
}

/* ---- wake tokens ------------------------------------------------------- */

static void *listener_main(void *arg)
{
    mpi_ctx_t *c = arg;
    struct pollfd fds[2] = {{.fd = c->sock, .events = POLLIN},
                            {.fd = c->stop_pipe[0], .events = POLLIN}};

    for (;;) {
        uint64_t msg[2];
        ssize_t n;

        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return NULL;
        }
        if (fds[1].revents != 0)
            return NULL;
        /* Drain every token that is there; the runtime keeps the latest. */
        while ((n = recv(c->sock, msg, sizeof(msg), MSG_DONTWAIT)) >= 0)
            if (n == (ssize_t)sizeof(msg) && msg[0] == WAKE_MAGIC)
                c->on_wake(c->wake_arg, msg[1]);
    }
}

/* Binds the UDP socket, exchanges addresses, starts the listener. */
static int wake_start(mpi_ctx_t *c, const kolo__ops_config_t *cfg, char *err,
                      size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM},
                    *ai = NULL;
    wake_addr_t mine;
    int grc;

    if (cfg->on_wake == NULL)
        return KOLO_OK; /* nobody to wake (kolo-bench's raw context) */

    grc = getaddrinfo(cfg->hostname, "0", &hints, &ai);
    if (grc != 0) {
        snprintf(err, errlen, "rank %d cannot resolve KOLO_HOSTNAME '%s' for "
                 "its wake-up socket: %s", cfg->global_rank, cfg->hostname,
                 gai_strerror(grc));
        return KOLO_ERR_BACKEND;
    }
    c->sock = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (c->sock < 0 || bind(c->sock, ai->ai_addr, ai->ai_addrlen) != 0) {
        snprintf(err, errlen, "rank %d cannot bind its wake-up socket to "
                 "'%s': %s", cfg->global_rank, cfg->hostname, strerror(errno));
        freeaddrinfo(ai);
        return KOLO_ERR_BACKEND;
    }
    freeaddrinfo(ai);
    memset(&mine, 0, sizeof(mine));
    mine.len = sizeof(mine.addr);
    if (getsockname(c->sock, (struct sockaddr *)&mine.addr, &mine.len) != 0) {
        snprintf(err, errlen, "rank %d: getsockname on its wake-up socket: %s",
                 cfg->global_rank, strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    c->peers = kolo__calloc((size_t)c->size, sizeof(*c->peers));
    if (c->peers == NULL) {
        snprintf(err, errlen, "out of memory on rank %d", cfg->global_rank);
        return KOLO_ERR_NO_MEMORY;
    }
    MPI_CALL(c, "MPI_Allgather of the wake-up addresses",
             MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, c->peers,
                           (int)sizeof(mine), MPI_BYTE, c->comm));
    if (pipe2(c->stop_pipe, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "rank %d: pipe: %s", cfg->global_rank,
                 strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    if (kolo__thread_create(&c->listener, NULL, listener_main, c) != 0) {
        snprintf(err, errlen, "rank %d cannot start the MPI backend's wake-up "
                 "thread", cfg->global_rank);
        return KOLO_ERR_INTERNAL;
    }
    c->listener_started = 1;
    return KOLO_OK;
}

static int mpi_wake_peers(void *ctx, uint64_t round, char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    uint64_t msg[2] = {WAKE_MAGIC, round};

    (void)err, (void)errlen;
    for (int r = 0; r < c->size && c->sock >= 0; r++) {
        if (r == c->rank)
            continue;
        /* Never blocks. A token that cannot be sent (full buffer, peer
         * gone) is dropped: it only saves the peer a cycle time, and a
         * lost peer is MPI's to report (see the essay). */
        ssize_t sent = sendto(c->sock, msg, sizeof(msg), MSG_DONTWAIT,
                              (const struct sockaddr *)&c->peers[r].addr,
                              c->peers[r].len);
        (void)sent;
    }
    return KOLO_OK;
}

/* ---- life cycle --------------------------------------------------------- */

static void mpi_finalize(void *ctx)
{
    mpi_ctx_t *c = ctx;
    int finalized = 0;

    if (c == NULL)
        return;
    if (c->listener_started) {
        ssize_t ignored = write(c->stop_pipe[1], "x", 1);
        (void)ignored;
        pthread_join(c->listener, NULL);
    }
    if (c->stop_pipe[0] >= 0) {
        close(c->stop_pipe[0]);
        close(c->stop_pipe[1]);
    }
    if (c->sock >= 0)
        close(c->sock);
    free(c->peers);
    /* After the program's own MPI_Finalize nothing may be freed any more. */
    MPI_Finalized(&finalized);
    if (!finalized) {
        for (int i = 0; i <= MAX_ELEM; i++)
            if (c->elem[i] != MPI_DATATYPE_NULL)
                MPI_Type_free(&c->elem[i]);
        if (c->op != MPI_OP_NULL)
            MPI_Op_free(&c->op);
        if (c->comm != MPI_COMM_NULL)
            MPI_Comm_free(&c->comm);
    }
    free(c);
}

static int prefix_tag(const char *prefix)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = prefix; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return (int)(h % 32768); /* MPI guarantees tags up to 32767 */
}

/* Whether MPI can carry cfg's context: initialised and not finalized, at
 * MPI_THREAD_MULTIPLE, with the job's ranks as MPI_COMM_WORLD's. */
static int mpi_usable(const kolo__ops_config_t *cfg, char *err, size_t errlen)
{
    int inited = 0, finalized = 0, level = 0, wrank = -1, wsize = 0;

    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) {
        snprintf(err, errlen, "the MPI backend needs a job started by mpirun "
                 "(or kolorun --mpi), and MPI is %s in this process (rank %d)",
                 finalized ? "already finalized" : "not initialised",
                 cfg->global_rank);
        return KOLO_ERR_UNSUPPORTED;
    }
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
        snprintf(err, errlen, "the MPI backend needs MPI_THREAD_MULTIPLE, but "
                 "MPI runs at thread level %d on rank %d: initialise MPI with "
                 "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)", level,
                 cfg->global_rank);
        return KOLO_ERR_UNSUPPORTED;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (wrank != cfg->global_rank) {
        snprintf(err, errlen, "rank %d of the job is rank %d of "
                 "MPI_COMM_WORLD: the MPI backend needs the job's ranks to be "
                 "MPI's (start the job with mpirun, or kolorun --mpi)",
                 cfg->global_rank, wrank);
        return KOLO_ERR_UNSUPPORTED;
    }
    for (int i = 0; i < cfg->size; i++)
        if (cfg->members[i] < 0 || cfg->members[i] >= wsize) {
            snprintf(err, errlen, "rank %d: member %d of the process set is "
                     "not a rank of MPI_COMM_WORLD (size %d)",
                     cfg->global_rank, cfg->members[i], wsize);
            return KOLO_ERR_UNSUPPORTED;
        }
    return KOLO_OK;
}

/* A context for cfg that holds no MPI object yet (NULL: out of memory). */
static mpi_ctx_t *ctx_new(const kolo__ops_config_t *cfg)
{
    const char *test_max = getenv("KOLO_MPI_TEST_MAX_COUNT");
    mpi_ctx_t *c = kolo__calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->comm = MPI_COMM_NULL;
    c->op = MPI_OP_NULL;
    for (int i = 0; i <= MAX_ELEM; i++)
        c->elem[i] = MPI_DATATYPE_NULL;
    c->sock = c->stop_pipe[0] = c->stop_pipe[1] = -1;
    c->rank = cfg->rank;
    c->size = cfg->size;
    c->global_rank = cfg->global_rank;
    c->on_wake = cfg->on_wake;
    c->wake_arg = cfg->wake_arg;
    c->max_count = INT_MAX;
    if (test_max != NULL && atol(test_max) > 0 && atol(test_max) < INT_MAX)
        c->max_count = (size_t)atol(test_max);
    return c;
}

/* The communicator of cfg's members, which only they call for (tagged by
 * the prefix, see the essay); it returns errors instead of aborting. */
static int comm_create(mpi_ctx_t *c, const kolo__ops_config_t *cfg, char *err,
                       size_t errlen)
{
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    int rc = KOLO_OK, mrc, wrank = -1;

    if ((mrc = MPI_Comm_group(MPI_COMM_WORLD, &world_group)) != MPI_SUCCESS ||
        (mrc = MPI_Group_incl(world_group, cfg->size, cfg->members, &group)) !=
            MPI_SUCCESS ||
        (mrc = MPI_Comm_create_group(MPI_COMM_WORLD, group,
                                     prefix_tag(cfg->prefix), &c->comm)) !=
            MPI_SUCCESS)
        rc = mpi_fail(c, mrc, "creating the communicator of the process set",
                      err, errlen);
    if (group != MPI_GROUP_NULL)
        MPI_Group_free(&group);
    if (world_group != MPI_GROUP_NULL)
        MPI_Group_free(&world_group);
    if (rc != KOLO_OK)
        return rc;
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &wrank);
    if (wrank != cfg->rank) {
        snprintf(err, errlen, "rank %d is rank %d of its MPI communicator, "
                 "not %d", cfg->global_rank, wrank, cfg->rank);
        return KOLO_ERR_INTERNAL;
    }
    return KOLO_OK;
}

static int mpi_init(const kolo__ops_config_t *cfg, void **ctxp, char *err,
                    size_t errlen)
{
    mpi_ctx_t *c;
    int rc, mrc;

    if ((rc = mpi_usable(cfg, err, errlen)) != KOLO_OK)
        return rc;
    if ((c = ctx_new(cfg)) == NULL) {
        snprintf(err, errlen, "out of memory on rank %d", cfg->global_rank);
        return KOLO_ERR_NO_MEMORY;
    }
    rc = comm_create(c, cfg, err, errlen);
    if (rc == KOLO_OK && (mrc = MPI_Op_create(user_op, 1, &c->op)) != MPI_SUCCESS)
        rc = mpi_fail(c, mrc, "MPI_Op_create", err, errlen);
    if (rc == KOLO_OK)
        rc = wake_start(c, cfg, err, errlen);
    if (rc != KOLO_OK) {
        mpi_finalize(c);
        return rc;
    }
    *ctxp = c;
    return KOLO_OK;
}

/* ---- collectives -------------------------------------------------------- */

static int mpi_allreduce(void *ctx, const void *in, void *out, size_t count,
                         size_t elem_size, kolo__ops_reduce_fn reduce,
                         char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    MPI_Datatype t;
    int rc;

    if ((rc = elem_type(c, elem_size, &t, err, errlen)) != KOLO_OK)
        return rc;
    t_reduce = reduce;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < c->max_count ? count - done : c->max_count;
        char *o = (char *)out + done * elem_size;
        const void *i = in == NULL || in == out
                            ? MPI_IN_PLACE
                            : (const char *)in + done * elem_size;
        MPI_CALL(c, "MPI_Allreduce",
                 MPI_Allreduce(i, o, (int)n, t, c->op, c->comm));
        done += n;
    }
    return KOLO_OK;
}

static int mpi_allgather(void *ctx, const void *in, void *out, size_t bytes,
                         char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    byte_span_t s;
    int rc, mrc;
    const void *src = in == (char *)out + (size_t)c->rank * bytes ? MPI_IN_PLACE
                                                                  : in;

    if ((rc = span_make(c, bytes, &s, err, errlen)) != KOLO_OK)
        return rc;
    mrc = MPI_Allgather(src, s.count, s.type, out, s.count, s.type, c->comm);
    span_free(&s);
    return mrc == MPI_SUCCESS ? KOLO_OK
                              : mpi_fail(c, mrc, "MPI_Allgather", err, errlen);
}

static int mpi_gather(void *ctx, const void *in, void *out, size_t bytes,
                      int root, char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    byte_span_t s;
    int rc, mrc;
    const void *src = c->rank == root && in == (char *)out + (size_t)root * bytes
                          ? MPI_IN_PLACE
                          : in;

    if ((rc = span_make(c, bytes, &s, err, errlen)) != KOLO_OK)
        return rc;
    mrc = MPI_Gather(src, s.count, s.type, out, s.count, s.type, root, c->comm);
    span_free(&s);
    return mrc == MPI_SUCCESS ? KOLO_OK
                              : mpi_fail(c, mrc, "MPI_Gather", err, errlen);
}

static int mpi_broadcast(void *ctx, void *buf, size_t bytes, int root,
                         char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    byte_span_t s;
    int rc, mrc;

    if ((rc = span_make(c, bytes, &s, err, errlen)) != KOLO_OK)
        return rc;
    mrc = MPI_Bcast(buf, s.count, s.type, root, c->comm);
    span_free(&s);
    return mrc == MPI_SUCCESS ? KOLO_OK
                              : mpi_fail(c, mrc, "MPI_Bcast", err, errlen);
}

/* Offsets of a list of byte counts; returns 1 when every offset, count and
 * the total fit in max_count (then ints can describe them). */
static int offsets(const mpi_ctx_t *c, const size_t *bytes, size_t *off)
{
    int fits = 1;
    off[0] = 0;
    for (int r = 0; r < c->size; r++) {
        off[r + 1] = off[r] + bytes[r];
        fits &= off[r + 1] <= c->max_count;
    }
    return fits;
}

static int mpi_allgatherv(void *ctx, const void *in, void *out,
                          const size_t *bytes, char *err, size_t errlen)
{
    mpi_ctx_t *c = ctx;
    size_t *off = kolo__malloc(((size_t)c->size + 1) * sizeof(size_t));
    int *counts = kolo__malloc(2 * (size_t)c->size * sizeof(int)), *displs;
    int rc = KOLO_OK, mrc = MPI_SUCCESS;

    if (off == NULL || counts == NULL) {
        free(off);
        free(counts);
        snprintf(err, errlen, "out of memory on rank %d", c->global_rank);
        return KOLO_ERR_NO_MEMORY;
    }
    displs = counts + c->size;
    if (offsets(c, bytes, off)) {
        for (int r = 0; r < c->size; r++) {
            counts[r] = (int)bytes[r];
            displs[r] = (int)off[r];
        }
        mrc = MPI_Allgatherv(in == (char *)out + off[c->rank] ? MPI_IN_PLACE
                                                              : in,
                             counts[c->rank], MPI_BYTE, out, counts, displs,
                             MPI_BYTE, c->comm);
        if (mrc != MPI_SUCCESS)
            rc = mpi_fail(c, mrc, "MPI_Allgatherv", err, errlen);
    } else {
        /* Too large for int displacements: every rank broadcasts its part. */
        if (in != (char *)out + off[c->rank])
            memmove((char *)out + off[c->rank], in, bytes[c->rank]);
        for (int r = 0; r < c->size && rc == KOLO_OK; r++)
            rc = mpi_broadcast(c, (char *)out + off[r], bytes[r], r, err,
                               errlen);
    }
    free(off);
    free(counts);
    return rc;
}

/* Pairwise exchange, as Open MPI's own alltoallv does: step k sends to
 * rank+k and receives from rank-k. Not MPI_Alltoallv: its int counts and
 * displacements may not fit, and only this rank knows its own sizes, so
 * the ranks could not agree on switching to a fallback without one more
 * collective. */
static int mpi_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                         void *out, const size_t *recv_bytes, char *err,
                         size_t errlen)
{
    mpi_ctx_t *c = ctx;
    size_t n = (size_t)c->size;
    size_t *soff = kolo__malloc(2 * (n + 1) * sizeof(size_t)), *roff;
    int rc = KOLO_OK, mrc;

    if (soff == NULL) {
        snprintf(err, errlen, "out of memory on rank %d", c->global_rank);
        return KOLO_ERR_NO_MEMORY;
    }
    roff = soff + n + 1;
    offsets(c, send_bytes, soff);
    offsets(c, recv_bytes, roff);
    memcpy((char *)out + roff[c->rank], (const char *)in + soff[c->rank],
           recv_bytes[c->rank]);
    for (int k = 1; k < c->size && rc == KOLO_OK; k++) {
        int to = (c->rank + k) % c->size;
        int from = (c->rank - k + c->size) % c->size;
        byte_span_t s, r;
        if ((rc = span_make(c, send_bytes[to], &s, err, errlen)) != KOLO_OK)
            break;
        if ((rc = span_make(c, recv_bytes[from], &r, err, errlen)) != KOLO_OK) {
            span_free(&s);
            break;
        }
        mrc = MPI_Sendrecv((const char *)in + soff[to], s.count, s.type, to, 7,
                           (char *)out + roff[from], r.count, r.type, from, 7,
                           c->comm, MPI_STATUS_IGNORE);
        span_free(&s);
        span_free(&r);
        if (mrc != MPI_SUCCESS)
            rc = mpi_fail(c, mrc, "MPI_Sendrecv of an alltoall", err, errlen);
    }
    free(soff);
    return rc;
}

static int mpi_reduce_scatter(void *ctx, void *work, void *out,
                              const size_t *counts, size_t elem_size,
                              kolo__ops_reduce_fn reduce, char *err,
                              size_t errlen)
{
    mpi_ctx_t *c = ctx;
    size_t *off = kolo__malloc(((size_t)c->size + 1) * sizeof(size_t));
    int *icounts = kolo__malloc((size_t)c->size * sizeof(int));
    MPI_Datatype t;
    int rc, mrc, fits;

    if (off == NULL || icounts == NULL) {
        free(off);
        free(icounts);
        snprintf(err, errlen, "out of memory on rank %d", c->global_rank);
        return KOLO_ERR_NO_MEMORY;
    }
    if ((rc = elem_type(c, elem_size, &t, err, errlen)) != KOLO_OK)
        goto out;
    t_reduce = reduce;
    fits = offsets(c, counts, off);
    if (fits) {
        for (int r = 0; r < c->size; r++)
            icounts[r] = (int)counts[r];
        /* In place: the whole input is in work, this rank's block lands at
         * its start. */
        mrc = MPI_Reduce_scatter(MPI_IN_PLACE, work, icounts, t, c->op,
                                 c->comm);
        if (mrc != MPI_SUCCESS) {
            rc = mpi_fail(c, mrc, "MPI_Reduce_scatter", err, errlen);
            goto out;
        }
        memmove(out, work, counts[c->rank] * elem_size);
    } else {
        /* Too large for int counts: block r is reduced onto rank r, in
         * pieces of at most max_count elements. */
        for (int r = 0; r < c->size && rc == KOLO_OK; r++)
            for (size_t done = 0; done < counts[r] && rc == KOLO_OK;) {
                size_t n = counts[r] - done < c->max_count ? counts[r] - done
                                                           : c->max_count;
                char *p = (char *)work + (off[r] + done) * elem_size;
                mrc = MPI_Reduce(c->rank == r ? MPI_IN_PLACE : p, p, (int)n, t,
                                 c->op, r, c->comm);
                if (mrc != MPI_SUCCESS)
                    rc = mpi_fail(c, mrc, "MPI_Reduce of a reduce-scatter",
                                  err, errlen);
                done += n;
            }
        if (rc == KOLO_OK)
            memmove(out, (char *)work + off[c->rank] * elem_size,
                    counts[c->rank] * elem_size);
    }
out:
    free(off);
    free(icounts);
    return rc;
}

const kolo__ops_t kolo__ops_mpi = {
    .name = "mpi",
    .caps = KOLO__OPS_USER | KOLO__OPS_NETWORK | KOLO__OPS_MPIRUN,
    .init = mpi_init,
    .finalize = mpi_finalize,
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .gather = mpi_gather,
    .broadcast = mpi_broadcast,
    .allgatherv = mpi_allgatherv,
    .alltoallv = mpi_alltoallv,
    .reduce_scatter = mpi_reduce_scatter,
    .wake_peers = mpi_wake_peers,
};
