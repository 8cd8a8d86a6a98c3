/*
 * shm_ops.c — the backend of ranks that share a host: every collective goes
 * through one POSIX shared-memory segment per context.
 *
 * The segment. Member 0 creates it (shm_open, named from a hash of the
 * job's rendezvous and the context's prefix), sizes it and marks it ready;
 * the others open it; every member maps it pre-faulted (MAP_POPULATE), so
 * the steady state takes no page faults. Once every member has attached,
 * every member unlinks the name: from then on the memory lives exactly as
 * long as some member maps it, and nothing is left in /dev/shm whatever
 * way the ranks exit. (kolorun also removes names of its job left by ranks
 * killed during start-up.)
 *
 * Steps. A collective is a sequence of steps. In a step each member writes
 * its piece into its own slot, then posts the step's number in its line of
 * the segment; every member waits until all lines show that step, then
 * reads what it needs. Slots come in two banks used by alternate steps. A
 * member writes a bank for step s only after every member posted step s-1,
 * and a member posts s-1 only after reading everything of step s-2 (the
 * last use of that bank): one post and one wait per step is all the
 * synchronisation there is.
 *
 * Allreduce is a reduce-scatter then an allgather, per chunk of at most one
 * slot: every member copies its chunk in (step a) but for its own shard,
 * which only it reads; reduces that shard across its input and every
 * peer's slot into its slot of the other bank, and copies the whole reduced
 * chunk out of all the slots (step a+1). Every core reduces its share, and
 * a chunk stays in cache: a step touches about three slots' worth per
 * member (its slot, its shard of the peers', its reduced shard and the
 * peers' reduced shards, plus the user's chunk), so the slot is by default
 * a quarter of the L2 cache, from 256 KiB to 1 MiB (with 2 MiB of L2,
 * 512 KiB slots moved 4-256 MiB allreduces 15-20% faster than 1 MiB slots,
 * and a ResNet-50 step 10%). Every member reads the size of cpu0's cache,
 * so the ranks of a host agree even on a CPU whose cores differ.
 *
 * Waiting. A member spins for at most KOLO_SHM_SPIN_US microseconds, and
 * only while the context has no more members than the process may use
 * cores; then it sleeps on a futex in the peer's line. Posting wakes
 * sleepers only when some sleep, counted in the line. The spin yields the
 * core every few microseconds: the scheduler may have put the peer it
 * waits for on the same core (with 2 ranks on 2 cores, 10 us steps became
 * 100-300 us for whole runs while it did), and a yield with nobody else to
 * run returns at once.
 *
 * Failures. A thread per member polls a pidfd of every peer (and the wake
 * socket): when a peer's process ends it marks the context broken, wakes
 * every sleeper and reports a lost connection (ops.h). A peer that stops
 * (SIGSTOP) fails the wait after the operation timeout, naming the rank
 * whose step never came.
 *
 * Wake tokens travel as datagrams over abstract Unix sockets named like
 * the segment, one per member. Any local process can send to such a
 * socket: a token is taken only from a process of the job's members (its
 * pid, from the kernel's credentials of the datagram, among the pids the
 * members put in the segment, and this process's user); others are
 * dropped, the first with a warning.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ops.h"
#include "shm_ops.h"

#define SEG_MAGIC 0x6b6f6c6f73686d32ULL /* "kolo shm2" */
#define SEG_ALIGN 4096
#define MIN_AUTO_SLOT_BYTES (256u << 10)
#define MAX_AUTO_SLOT_BYTES (1u << 20)
#define DEFAULT_SPIN_US 50

/* One cache line per member. */
typedef struct line {
    _Alignas(64) atomic_uint seq; /* the last step this member posted */
    atomic_uint waiters;          /* peers sleeping on seq */
    atomic_int pid;
    atomic_uint more[2];          /* alltoallv: data left, per bank */
    atomic_int left;              /* 1: finalized, posts nothing more */
} line_t;

typedef struct header {
    _Alignas(64) _Atomic uint64_t magic; /* SEG_MAGIC once initialised */
    uint64_t total_bytes;
    uint64_t slot_bytes;
    uint32_t members;
    atomic_uint attached;
} header_t;

typedef struct shm_ctx {
    int me, n;
    int *members; /* global ranks, for messages */
    uint8_t *base;
    size_t total;
    header_t *hdr;
    line_t *lines;
    uint8_t *slots; /* [2 banks][n][slot] */
    size_t slot;
    uint32_t step;
    int spin_us;
    double timeout_s;
    char name[96];
    int created, unlinked;
    uint64_t key;

    int sock;
    int stop_fd;
    int *pidfds;
    pthread_t listener;
    int listener_started;
    atomic_int lost; /* member index of a peer whose process ended, or -1 */
    atomic_int waiting_on; /* member index a wait sleeps on, or -1 */
    kolo__ops_wake_fn on_wake;
    void *wake_arg;
    kolo__ops_warn_fn warn; /* NULL: dropped datagrams go unreported */
    int warned;             /* a stranger's datagram was reported */
    struct pollfd *fds; /* the listener's, made before it starts */
    /* While init waits for the members' first step: the config whose
     * `abandoned` says a member failed to start (it never posts). */
    const kolo__ops_config_t *starting;
} shm_ctx_t;

static int peer_gave_up(const kolo__ops_config_t *cfg, char *err, size_t errlen);

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pause_cpu(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long futex(atomic_uint *word, int op, unsigned val,
                  const struct timespec *timeout)
{
    return syscall(SYS_futex, (uint32_t *)word, op, val, timeout, NULL, 0);
}

static uint8_t *slot_of(shm_ctx_t *c, uint32_t step, int member)
{
    return c->slots + ((size_t)(step & 1) * (size_t)c->n + (size_t)member) * c->slot;
}


/* ---- posting and waiting ------------------------------------------------------ */

/* Posts this member's next step and returns its number. */
static uint32_t post(shm_ctx_t *c)
{
    line_t *l = &c->lines[c->me];
    uint32_t s = ++c->step;

    atomic_store(&l->seq, s);
    if (atomic_load(&l->waiters) != 0)
        futex(&l->seq, FUTEX_WAKE, INT_MAX, NULL);
    return s;
}

static int reached(line_t *l, uint32_t s)
{
    return (int32_t)(atomic_load_explicit(&l->seq, memory_order_acquire) - s) >= 0;
}

static int wait_sleeping(shm_ctx_t *c, int j, uint32_t s, const char *what,
                         char *err, size_t errlen);

/* Waits until member j has posted step s: spins briefly where the host
 * has a core per rank, then sleeps (wait_sleeping). */
static int wait_one(shm_ctx_t *c, int j, uint32_t s, const char *what,
                    char *err, size_t errlen)
{
    line_t *l = &c->lines[j];
    int rc;

    if (reached(l, s))
        return KOLO_OK;
    if (c->spin_us > 0) {
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned i = 1;; i++) {
            if (reached(l, s))
                return KOLO_OK;
            pause_cpu();
            if ((i & 63) == 0) {
                /* Lets a peer that shares this core run: the step it owes
                 * comes sooner than from spinning on (a no-op when no other
                 * thread waits for the core). */
                sched_yield();
                clock_gettime(CLOCK_MONOTONIC, &t);
                if ((t.tv_sec - t0.tv_sec) * 1000000L +
                        (t.tv_nsec - t0.tv_nsec) / 1000 >= c->spin_us)
                    break;
            }
        }
    }
    rc = wait_sleeping(c, j, s, what, err, errlen);
    atomic_store_explicit(&c->waiting_on, -1, memory_order_relaxed);
    return rc;
}

static int wait_sleeping(shm_ctx_t *c, int j, uint32_t s, const char *what,
                         char *err, size_t errlen)
{
    line_t *l = &c->lines[j];
    double start = now_s(), deadline = start + c->timeout_s;

    atomic_store_explicit(&c->waiting_on, j, memory_order_relaxed);
    for (;;) {
        int lost = atomic_load(&c->lost);
        unsigned v;
        double left;

        /* A peer that posted step s and then ended (a rank leaving after
         * its last round) left what step s needs: only a step it never
         * posted is lost. */
        if (reached(l, s))
            return KOLO_OK;
        if (atomic_load(&l->left)) {
            snprintf(err, errlen, "rank %d (pid %d) left the shared-memory "
                     "%s without taking part: kolo stopped on that rank",
                     c->members[j], atomic_load(&l->pid), what);
            return KOLO_ERR_RANK_LOST;
        }
        if (lost >= 0) {
            snprintf(err, errlen, "rank %d (pid %d) exited during a "
                     "shared-memory %s", c->members[lost],
                     atomic_load(&c->lines[lost].pid), what);
            return KOLO_ERR_RANK_LOST;
        }
        if (c->starting != NULL && peer_gave_up(c->starting, err, errlen))
            return KOLO_ERR_BACKEND;
        left = deadline - now_s();
        if (left <= 0) {
            snprintf(err, errlen, "shared-memory %s: rank %d (pid %d) made no "
                     "progress for %.1f s (KOLO_TIMEOUT_SECONDS); is it "
                     "stopped?", what, c->members[j],
                     atomic_load(&c->lines[j].pid), now_s() - start);
            return KOLO_ERR_TIMEOUT;
        }
        atomic_fetch_add(&l->waiters, 1);
        v = atomic_load(&l->seq);
        if ((int32_t)(v - s) < 0) {
            /* The listener wakes every sleeper when a peer dies; the bound
             * covers a death that falls between the check above and the
             * sleep. */
            double most = c->starting != NULL ? 0.05 : 1.0;
            double nap = left < most ? left : most;
            struct timespec ts = {(time_t)nap,
                                  (long)((nap - (double)(time_t)nap) * 1e9)};
            futex(&l->seq, FUTEX_WAIT, v, &ts);
        }
        atomic_fetch_sub(&l->waiters, 1);
        if (reached(l, s))
            return KOLO_OK;
    }
}

/* Posts a step and waits until every member has posted it. */
static int step_all(shm_ctx_t *c, const char *what, char *err, size_t errlen)
{
    uint32_t s = post(c);

    for (int j = 0; j < c->n; j++) {
        int rc;
        if (j == c->me)
            continue;
        rc = wait_one(c, j, s, what, err, errlen);
        if (rc != KOLO_OK)
            return rc;
    }
    return KOLO_OK;
}

/* ---- the listener: wake tokens and peers that end ----------------------------- */

static void sock_name(const shm_ctx_t *c, int member, struct sockaddr_un *a,
                      socklen_t *len)
{
    int n;

    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* Abstract namespace: a leading NUL, gone with the socket. */
    n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "kolo-shm-%016llx-%d",
                 (unsigned long long)c->key, member);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void mark_lost(shm_ctx_t *c, int j)
{
    int none = -1;

    atomic_compare_exchange_strong(&c->lost, &none, j);
    for (int k = 0; k < c->n; k++)
        if (atomic_load(&c->lines[k].waiters) != 0)
            futex(&c->lines[k].seq, FUTEX_WAKE, INT_MAX, NULL);
    if (c->on_wake != NULL)
        c->on_wake(c->wake_arg, UINT64_MAX);
}

/* Takes every datagram waiting on the wake socket; hands on the tokens
 * that come from a member's process (the file's head). */
static void take_tokens(shm_ctx_t *c)
{
    for (;;) {
        uint64_t round;
        char ctl[CMSG_SPACE(sizeof(struct ucred))];
        struct iovec iov = {.iov_base = &round, .iov_len = sizeof(round)};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1,
                           .msg_control = ctl, .msg_controllen = sizeof(ctl)};
        struct cmsghdr *cm;
        const struct ucred *who = NULL;
        int member = 0;
        ssize_t n = recvmsg(c->sock, &m, MSG_DONTWAIT);

        if (n < 0)
            return;
        for (cm = CMSG_FIRSTHDR(&m); cm != NULL; cm = CMSG_NXTHDR(&m, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS)
                who = (const struct ucred *)CMSG_DATA(cm);
        for (int j = 0; who != NULL && j < c->n && !member; j++)
            member = j != c->me && who->uid == getuid() &&
                     who->pid == atomic_load(&c->lines[j].pid);
        if (!member) {
            if (c->warn != NULL && !c->warned) {
                char msg[256];
                c->warned = 1;
                snprintf(msg, sizeof(msg),
                         "shared memory: dropped a datagram to rank %d's wake "
                         "socket from pid %ld (uid %ld), not a rank of this "
                         "job; the job goes on (further ones are not "
                         "reported)",
                         c->members[c->me], who ? (long)who->pid : -1L,
                         who ? (long)who->uid : -1L);
                c->warn(msg);
            }
            continue;
        }
        if (n == (ssize_t)sizeof(round) && c->on_wake != NULL)
            c->on_wake(c->wake_arg, round);
    }
}

static void *listener_main(void *arg)
{
    shm_ctx_t *c = arg;
    struct pollfd *fds = c->fds;
    int use_pidfd = 1;

    fds[0] = (struct pollfd){.fd = c->stop_fd, .events = POLLIN};
    fds[1] = (struct pollfd){.fd = c->sock, .events = POLLIN};
    for (int j = 0; j < c->n; j++) {
        fds[2 + j] = (struct pollfd){.fd = c->pidfds[j], .events = POLLIN};
        if (j != c->me && c->pidfds[j] < 0)
            use_pidfd = 0;
    }
    for (;;) {
        /* Without pidfds (old kernels) peers are checked once a second. */
        int rc = poll(fds, (nfds_t)c->n + 2, use_pidfd ? -1 : 1000);
        if (rc < 0 && errno != EINTR)
            break;
        if (fds[0].revents)
            break;
        if (fds[1].revents & POLLIN)
            take_tokens(c);
        for (int j = 0; j < c->n; j++) {
            int gone;
            if (j == c->me)
                continue;
            if (use_pidfd)
                gone = fds[2 + j].fd >= 0 && (fds[2 + j].revents & POLLIN);
            else
                gone = kill(atomic_load(&c->lines[j].pid), 0) != 0 && errno == ESRCH;
            if (gone) {
                fds[2 + j].fd = -1;
                mark_lost(c, j);
            }
        }
    }
    return NULL;
}

/* ---- init and finalize ------------------------------------------------------------ */

static void shm_finalize(void *ctx)
{
    shm_ctx_t *c = ctx;

    if (c == NULL)
        return;
    if (c->listener_started) {
        uint64_t one = 1;
        if (write(c->stop_fd, &one, sizeof(one)) < 0) {
            /* an eventfd write of 1 cannot fail short of a full counter */
        }
        pthread_join(c->listener, NULL);
    }
    if (c->lines != NULL) {
        /* Peers waiting for a step this member will never post fail now
         * (a rank whose set stopped on a failure of its own leaves while
         * its process goes on). */
        line_t *l = &c->lines[c->me];
        atomic_store(&l->left, 1);
        if (atomic_load(&l->waiters) != 0)
            futex(&l->seq, FUTEX_WAKE, INT_MAX, NULL);
    }
    if (c->created && !c->unlinked)
        shm_unlink(c->name);
    if (c->base != NULL)
        munmap(c->base, c->total);
    if (c->sock >= 0)
        close(c->sock);
    if (c->stop_fd >= 0)
        close(c->stop_fd);
    if (c->pidfds != NULL)
        for (int j = 0; j < c->n; j++)
            if (c->pidfds[j] >= 0)
                close(c->pidfds[j]);
    free(c->pidfds);
    free(c->fds);
    free(c->members);
    free(c);
}

static size_t layout(int n, size_t slot, size_t *slots_off)
{
    size_t off = (sizeof(header_t) + (size_t)n * sizeof(line_t) + SEG_ALIGN - 1) &
                 ~(size_t)(SEG_ALIGN - 1);
    *slots_off = off;
    return off + 2 * (size_t)n * slot;
}

static int map_segment(shm_ctx_t *c, int fd, size_t total, char *err,
                       size_t errlen)
{
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot map shared memory %s (%zu bytes): %s",
                 c->name, total, strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    c->base = p;
    c->total = total;
    return KOLO_OK;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether a peer has failed to connect (ops.h: abandoned), asked at most
 * every 50 ms of a wait. */
static int peer_gave_up(const kolo__ops_config_t *cfg, char *err, size_t errlen)
{
    static _Thread_local double last;
    double t = now_s();

    if (cfg->abandoned == NULL || t - last < 0.05)
        return 0;
    last = t;
    return cfg->abandoned(cfg->abandoned_arg, err, errlen);
}

/* Member 0 creates and initialises the segment. */
static int create_segment(shm_ctx_t *c, char *err, size_t errlen)
{
    size_t slots_off, total = layout(c->n, c->slot, &slots_off);
    int fd, rc;

    fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Left by an earlier job killed during start-up with the same
         * rendezvous: it is not ours to keep. */
        shm_unlink(c->name);
        fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
        snprintf(err, errlen, "cannot create shared memory %s: %s", c->name,
                 strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    c->created = 1;
    if (ftruncate(fd, (off_t)total) != 0) {
        snprintf(err, errlen, "cannot size shared memory %s to %zu bytes: %s "
                 "(is /dev/shm full?)", c->name, total, strerror(errno));
        close(fd);
        return KOLO_ERR_BACKEND;
    }
    /* Reserve the pages now, so a full /dev/shm fails here and not with a
     * SIGBUS in the middle of a step. */
    if ((rc = posix_fallocate(fd, 0, (off_t)total)) != 0) {
        snprintf(err, errlen, "cannot reserve %zu bytes of shared memory %s: "
                 "%s (is /dev/shm full?)", total, c->name, strerror(rc));
        close(fd);
        return KOLO_ERR_BACKEND;
    }
    rc = map_segment(c, fd, total, err, errlen);
    close(fd);
    if (rc != KOLO_OK)
        return rc;
    c->hdr = (header_t *)c->base;
    c->hdr->total_bytes = total;
    c->hdr->slot_bytes = c->slot;
    c->hdr->members = (uint32_t)c->n;
    atomic_store(&c->hdr->magic, SEG_MAGIC);
    return KOLO_OK;
}

/* The other members open it once member 0 has marked it ready. */
static int open_segment(shm_ctx_t *c, const kolo__ops_config_t *cfg,
                        double deadline, char *err, size_t errlen)
{
    header_t h;
    int fd = -1, rc, nap = 1;

    for (;;) {
        struct stat st;
        fd = shm_open(c->name, O_RDWR, 0);
        if (fd < 0 && errno != ENOENT) {
            /* Not "not there yet": out of descriptors, or not allowed. */
            snprintf(err, errlen, "rank %d cannot open shared memory %s: %s%s",
                     c->members[c->me], c->name, strerror(errno),
                     errno == EMFILE ? " (ulimit -n)" : "");
            return KOLO_ERR_BACKEND;
        }
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(h) &&
            pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
            h.magic == SEG_MAGIC && (size_t)st.st_size >= h.total_bytes)
            break;
        if (fd >= 0)
            close(fd);
        if (now_s() > deadline) {
            snprintf(err, errlen, "rank %d found no shared memory from rank %d "
                     "(%s) within the start timeout", c->members[c->me],
                     c->members[0], c->name);
            return KOLO_ERR_TIMEOUT;
        }
        if (peer_gave_up(cfg, err, errlen))
            return KOLO_ERR_BACKEND;
        sleep_ms(nap);
        nap = nap < 20 ? nap * 2 : 20;
    }
    if (h.members != (uint32_t)c->n || h.slot_bytes != c->slot) {
        snprintf(err, errlen, "shared memory %s holds %u members with %llu-byte "
                 "slots, but this rank expects %d with %zu (is KOLO_SHM_SLOT_BYTES "
                 "the same on every rank?)", c->name, h.members,
                 (unsigned long long)h.slot_bytes, c->n, c->slot);
        close(fd);
        return KOLO_ERR_CONFIG;
    }
    rc = map_segment(c, fd, (size_t)h.total_bytes, err, errlen);
    close(fd);
    if (rc == KOLO_OK)
        c->hdr = (header_t *)c->base;
    return rc;
}

/* The default slot size: a quarter of cpu0's L2 cache, a power of two from
 * MIN_AUTO_SLOT_BYTES to MAX_AUTO_SLOT_BYTES; the most where sysfs does not
 * say. */
static size_t auto_slot_bytes(void)
{
    size_t l2 = 0, slot = MIN_AUTO_SLOT_BYTES;

    for (int i = 0; i < 8 && l2 == 0; i++) {
        char path[96], text[32];
        int level = 0;
        unsigned long kib = 0;
        FILE *f;

        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if ((f = fopen(path, "r")) == NULL)
            break;
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
        if (level != 2)
            continue;
        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if ((f = fopen(path, "r")) == NULL)
            break;
        if (fgets(text, sizeof(text), f) != NULL &&
            sscanf(text, "%luK", &kib) == 1)
            l2 = (size_t)kib << 10;
        fclose(f);
    }
    if (l2 == 0)
        return MAX_AUTO_SLOT_BYTES;
    while (slot * 2 <= l2 / 4 && slot < MAX_AUTO_SLOT_BYTES)
        slot *= 2;
    return slot;
}

static int cores_available(void)
{
    cpu_set_t set;

    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        return CPU_COUNT(&set);
    return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

/* Starting the backend fails for want of memory: says so. */
static int shm_oom(char *err, size_t errlen)
{
    snprintf(err, errlen, "out of memory starting the shared-memory backend");
    return KOLO_ERR_NO_MEMORY;
}

/* Fills in what the context takes from cfg: its members (every one on this
 * host), the slot size, the spin and the segment's name. */
static int shm_configure(shm_ctx_t *c, const kolo__ops_config_t *cfg,
                         char *err, size_t errlen)
{
    c->sock = c->stop_fd = -1;
    atomic_init(&c->lost, -1);
    atomic_init(&c->waiting_on, -1);
    c->me = cfg->rank;
    c->n = cfg->size;
    c->timeout_s = cfg->timeout_s;
    c->on_wake = cfg->on_wake;
    c->wake_arg = cfg->wake_arg;
    c->warn = cfg->warn;
    c->members = kolo__malloc((size_t)c->n * sizeof(int));
    c->pidfds = kolo__malloc((size_t)c->n * sizeof(int));
    /* None open yet, whatever fails next: shm_finalize closes what is not
     * -1, and would otherwise close whatever numbers the memory held. */
    for (int j = 0; c->pidfds != NULL && j < c->n; j++)
        c->pidfds[j] = -1;
    if (c->members == NULL || c->pidfds == NULL)
        return shm_oom(err, errlen);
    for (int j = 0; j < c->n; j++) {
        c->members[j] = cfg->members != NULL ? cfg->members[j] : j;
        if (cfg->hosts != NULL && cfg->hosts[j] != cfg->hosts[0]) {
            snprintf(err, errlen, "shared memory joins ranks of one host, but "
                     "rank %d is on host %d and rank %d on host %d",
                     c->members[0], cfg->hosts[0], c->members[j], cfg->hosts[j]);
            return KOLO_ERR_UNSUPPORTED;
        }
    }
    /* Slots hold whole 64-byte lines for every member's shard. */
    c->slot = (cfg->shm_slot_bytes >= 4096 ? cfg->shm_slot_bytes
                                           : auto_slot_bytes()) & ~(size_t)63;
    c->spin_us = c->n > cores_available() ? 0
                 : cfg->shm_spin_us >= 0  ? cfg->shm_spin_us
                                          : DEFAULT_SPIN_US;
    c->key = fnv1a(fnv1a(0xcbf29ce484222325ULL, cfg->rendezvous), "|");
    c->key = fnv1a(c->key, cfg->prefix);
    /* The first part names the job, so kolorun can find what its ranks
     * left behind; the second the context. */
    snprintf(c->name, sizeof(c->name), "/kolo-%08x-%016llx",
             (unsigned)(fnv1a(0xcbf29ce484222325ULL, cfg->rendezvous) & 0xffffffffu),
             (unsigned long long)c->key);
    return KOLO_OK;
}

/* The wake socket comes first, so peers can send as soon as they attach. */
static int open_wake_socket(shm_ctx_t *c, char *err, size_t errlen)
{
    struct sockaddr_un addr;
    socklen_t alen;
    int one = 1;

    c->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    c->stop_fd = eventfd(0, EFD_CLOEXEC);
    sock_name(c, c->me, &addr, &alen);
    /* Each datagram comes with its sender's credentials. */
    if (c->sock >= 0)
        setsockopt(c->sock, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
    if (c->sock < 0 || c->stop_fd < 0 ||
        bind(c->sock, (struct sockaddr *)&addr, alen) != 0) {
        snprintf(err, errlen, "cannot open the wake socket of rank %d: %s",
                 c->members[c->me], strerror(errno));
        return KOLO_ERR_BACKEND;
    }
    return KOLO_OK;
}

/* Maps the segment (member 0 creates it, the others open it) and waits
 * until every member has; then unlinks its name, needed by no one now. */
static int attach_segment(shm_ctx_t *c, const kolo__ops_config_t *cfg,
                          double deadline, char *err, size_t errlen)
{
    size_t slots_off;
    int rc = c->me == 0 ? create_segment(c, err, errlen)
                        : open_segment(c, cfg, deadline, err, errlen);
    int nap = 1;

    if (rc != KOLO_OK)
        return rc;
    layout(c->n, c->slot, &slots_off);
    c->lines = (line_t *)(c->base + sizeof(header_t));
    c->slots = c->base + slots_off;
    atomic_store(&c->lines[c->me].pid, (int)getpid());
    atomic_fetch_add(&c->hdr->attached, 1);
    while (atomic_load(&c->hdr->attached) < (unsigned)c->n) {
        if (now_s() > deadline) {
            char missing[256] = "";
            size_t used = 0;
            for (int j = 0; j < c->n && used < sizeof(missing) - 16; j++)
                if (atomic_load(&c->lines[j].pid) == 0)
                    used += (size_t)snprintf(missing + used, sizeof(missing) - used,
                                             "%s%d", used ? ", " : "", c->members[j]);
            snprintf(err, errlen, "rank(s) %s never attached to shared memory "
                     "%s within the start timeout", missing, c->name);
            return KOLO_ERR_TIMEOUT;
        }
        if (peer_gave_up(cfg, err, errlen))
            return KOLO_ERR_BACKEND;
        sleep_ms(nap);
        nap = nap < 20 ? nap * 2 : 20;
    }
    if (shm_unlink(c->name) == 0 || errno == ENOENT)
        c->unlinked = 1;
    return KOLO_OK;
}

/* A pidfd of every peer and the listener thread that polls them. */
static int watch_peers(shm_ctx_t *c, char *err, size_t errlen)
{
    int rc;

    for (int j = 0; j < c->n; j++) {
        if (j == c->me)
            continue;
        c->pidfds[j] = (int)syscall(SYS_pidfd_open, atomic_load(&c->lines[j].pid), 0);
        if (c->pidfds[j] < 0 && errno == ESRCH) {
            snprintf(err, errlen, "rank %d (pid %d) exited while joining shared "
                     "memory", c->members[j], atomic_load(&c->lines[j].pid));
            return KOLO_ERR_RANK_LOST;
        }
    }
    c->fds = kolo__calloc((size_t)c->n + 2, sizeof(*c->fds));
    if (c->fds == NULL)
        return shm_oom(err, errlen);
    rc = kolo__thread_create(&c->listener, NULL, listener_main, c);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the shared-memory listener "
                 "thread: %s", strerror(rc));
        return KOLO_ERR_BACKEND;
    }
    c->listener_started = 1;
    return KOLO_OK;
}

/* A first step together: every member's listener runs before any
 * collective starts. */
static int first_step(shm_ctx_t *c, const kolo__ops_config_t *cfg, char *err,
                      size_t errlen)
{
    int rc;

    c->starting = cfg;
    rc = step_all(c, "start", err, errlen);
    c->starting = NULL;
    return rc;
}

static int shm_init(const kolo__ops_config_t *cfg, void **out, char *err,
                    size_t errlen)
{
    shm_ctx_t *c = kolo__calloc(1, sizeof(*c));
    double deadline = now_s() + cfg->start_timeout_s;
    int rc;

    *out = NULL;
    if (c == NULL)
        return shm_oom(err, errlen);
    if ((rc = shm_configure(c, cfg, err, errlen)) != KOLO_OK ||
        (rc = open_wake_socket(c, err, errlen)) != KOLO_OK ||
        (rc = attach_segment(c, cfg, deadline, err, errlen)) != KOLO_OK ||
        (rc = watch_peers(c, err, errlen)) != KOLO_OK ||
        (rc = first_step(c, cfg, err, errlen)) != KOLO_OK) {
        shm_finalize(c);
        return rc;
    }
    *out = c;
    return KOLO_OK;
}

/* ---- collectives ---------------------------------------------------------------- */

/* Where this member's shard of a chunk is read from: runs of its input
 * read where they lie (stream views or the caller's buffer), the rest
 * filled into its slot. */
#define MAX_RUNS 16
typedef struct own_runs {
    int n;
    size_t len[MAX_RUNS];
    const uint8_t *src[MAX_RUNS];
} own_runs_t;

/* Fills this member's slot for the chunk [done, done + m) but for its own
 * shard [lo, hi), which the reduction reads in place where it can. */
static void fill_chunk(const uint8_t *src, size_t done,
                       size_t m, size_t lo, size_t hi, size_t esize,
                       const kolo__ops_stream_t *s, uint8_t *slot,
                       own_runs_t *own)
{
    size_t pos = lo;

    own->n = 0;
    if (s == NULL) {
        memcpy(slot, src + done * esize, lo * esize);
        memcpy(slot + hi * esize, src + (done + hi) * esize, (m - hi) * esize);
        if (hi > lo) {
            own->src[0] = src + (done + lo) * esize;
            own->len[0] = hi - lo;
            own->n = 1;
        }
        return;
    }
    if (lo > 0)
        s->fill(s->arg, slot, done, lo);
    while (pos < hi) {
        size_t run = 0;
        const void *p = NULL;
        if (s->view != NULL && own->n < MAX_RUNS - 1)
            p = s->view(s->arg, done + pos, hi - pos, &run);
        if (p == NULL || run == 0) {
            /* The rest of the shard goes through the slot. */
            s->fill(s->arg, slot + pos * esize, done + pos, hi - pos);
            p = slot + pos * esize;
            run = hi - pos;
        }
        own->src[own->n] = p;
        own->len[own->n++] = run;
        pos += run;
    }
    if (m > hi)
        s->fill(s->arg, slot + hi * esize, done + hi, m - hi);
}

/* Member j's input at byte `at` of the shard: its slot of step a, or, for
 * this member, where its own shard is read from. */
static const uint8_t *input_of(shm_ctx_t *c, uint32_t a, int j,
                               const uint8_t *own, size_t at)
{
    return j == c->me ? own : slot_of(c, a, j) + at;
}

/* The allreduce of both entry points: input from `s->fill` or `in`,
 * output to `s->drain` or `out`. A member's own shard is never copied in:
 * only its peers read its slot, and they read only their shards, so it
 * reduces its shard straight from its input (2 ranks: about a fifth less
 * memory traffic per chunk). The order of the reduction (member 0, 1, ...)
 * is the same either way, so results are too. */
static int allreduce_common(shm_ctx_t *c, const uint8_t *src, uint8_t *dst,
                            size_t count, size_t esize,
                            kolo__ops_reduce_fn reduce,
                            const kolo__ops_stream_t *s, char *err,
                            size_t errlen)
{
    size_t per_chunk = c->slot / esize;
    /* Shards in whole 64-byte lines where the chunk allows. */
    size_t line_elems = esize <= 64 && 64 % esize == 0 ? 64 / esize : 1;
    own_runs_t own;

    for (size_t done = 0; done < count;) {
        size_t m = count - done < per_chunk ? count - done : per_chunk;
        size_t share = (m + (size_t)c->n - 1) / (size_t)c->n;
        size_t lo, hi;
        uint32_t a;
        int rc;

        share = (share + line_elems - 1) / line_elems * line_elems;
        lo = share * (size_t)c->me;
        hi = lo + share;
        lo = lo < m ? lo : m;
        hi = hi < m ? hi : m;

        a = c->step + 1;
        fill_chunk(src, done, m, lo, hi, esize, s, slot_of(c, a, c->me), &own);
        if ((rc = step_all(c, "allreduce", err, errlen)) != KOLO_OK)
            return rc;
        for (size_t k = 0, off = lo; k < (size_t)own.n; off += own.len[k++]) {
            size_t at = off * esize, len = own.len[k];
            uint8_t *mine = slot_of(c, a + 1, c->me) + at;
            const uint8_t *own_in = own.src[k];
            if (c->n == 1) {
                memcpy(mine, own_in, len * esize);
                continue;
            }
            reduce(mine, input_of(c, a, 0, own_in, at),
                   input_of(c, a, 1, own_in, at), len);
            for (int j = 2; j < c->n; j++)
                reduce(mine, mine, input_of(c, a, j, own_in, at), len);
        }
        if (hi > lo && s != NULL && s->finish != NULL)
            s->finish(s->arg, slot_of(c, a + 1, c->me) + lo * esize, hi - lo);
        if ((rc = step_all(c, "allreduce", err, errlen)) != KOLO_OK)
            return rc;
        for (int j = 0; j < c->n; j++) {
            size_t jlo = share * (size_t)j, jhi = jlo + share;
            const uint8_t *from;
            jlo = jlo < m ? jlo : m;
            jhi = jhi < m ? jhi : m;
            if (jhi <= jlo)
                continue;
            from = slot_of(c, a + 1, j) + jlo * esize;
            if (s != NULL)
                s->drain(s->arg, from, done + jlo, jhi - jlo);
            else
                memcpy(dst + (done + jlo) * esize, from, (jhi - jlo) * esize);
        }
        done += m;
    }
    return KOLO_OK;
}

static int shm_allreduce(void *ctx, const void *in, void *out, size_t count,
                         size_t esize, kolo__ops_reduce_fn reduce, char *err,
                         size_t errlen)
{
    return allreduce_common(ctx, in != NULL ? in : out, out, count, esize,
                            reduce, NULL, err, errlen);
}

static int shm_allreduce_stream(void *ctx, size_t count, size_t esize,
                                kolo__ops_reduce_fn reduce,
                                const kolo__ops_stream_t *s, char *err,
                                size_t errlen)
{
    return allreduce_common(ctx, NULL, NULL, count, esize, reduce, s, err,
                            errlen);
}

/* Rank r contributes bytes[r] (all equal for allgather); root < 0: every
 * member receives, else only root. */
static int gather_common(shm_ctx_t *c, const void *in, void *out,
                         const size_t *bytes, size_t same, int root,
                         const char *what, char *err, size_t errlen)
{
    size_t most = 0, mine = bytes != NULL ? bytes[c->me] : same;
    int rc;

    for (int j = 0; j < c->n; j++) {
        size_t b = bytes != NULL ? bytes[j] : same;
        most = b > most ? b : most;
    }
    for (size_t off = 0; off < most; off += c->slot) {
        uint32_t s = c->step + 1;
        size_t pos = 0;
        if (off < mine)
            memcpy(slot_of(c, s, c->me), (const uint8_t *)in + off,
                   mine - off < c->slot ? mine - off : c->slot);
        if ((rc = step_all(c, what, err, errlen)) != KOLO_OK)
            return rc;
        if (root >= 0 && root != c->me)
            continue;
        for (int j = 0; j < c->n; j++) {
            size_t b = bytes != NULL ? bytes[j] : same;
            /* (this rank's block already in its place: nothing to copy) */
            if (off < b && !(j == c->me && (uint8_t *)out + pos == in))
                memcpy((uint8_t *)out + pos + off, slot_of(c, s, j),
                       b - off < c->slot ? b - off : c->slot);
            pos += b;
        }
    }
    return KOLO_OK;
}

static int shm_allgather(void *ctx, const void *in, void *out, size_t bytes,
                         char *err, size_t errlen)
{
    return gather_common(ctx, in, out, NULL, bytes, -1, "allgather", err, errlen);
}

static int shm_gather(void *ctx, const void *in, void *out, size_t bytes,
                      int root, char *err, size_t errlen)
{
    return gather_common(ctx, in, out, NULL, bytes, root, "gather", err, errlen);
}

static int shm_allgatherv(void *ctx, const void *in, void *out,
                          const size_t *bytes, char *err, size_t errlen)
{
    return gather_common(ctx, in, out, bytes, 0, -1, "allgatherv", err, errlen);
}

static int shm_broadcast(void *ctx, void *buf, size_t bytes, int root,
                         char *err, size_t errlen)
{
    shm_ctx_t *c = ctx;
    int rc;

    for (size_t off = 0; off < bytes; off += c->slot) {
        size_t m = bytes - off < c->slot ? bytes - off : c->slot;
        uint32_t s = c->step + 1;
        if (c->me == root)
            memcpy(slot_of(c, s, root), (uint8_t *)buf + off, m);
        if ((rc = step_all(c, "broadcast", err, errlen)) != KOLO_OK)
            return rc;
        if (c->me != root)
            memcpy((uint8_t *)buf + off, slot_of(c, s, root), m);
    }
    return KOLO_OK;
}

static int shm_alltoallv(void *ctx, const void *in, const size_t *send_bytes,
                         void *out, const size_t *recv_bytes, char *err,
                         size_t errlen)
{
    shm_ctx_t *c = ctx;
    size_t part = c->slot / (size_t)c->n & ~(size_t)63;
    size_t *sent = kolo__calloc((size_t)c->n * 4, sizeof(size_t));
    size_t *got, *send_off, *recv_off;
    int rc = KOLO_OK;

    if (sent == NULL) {
        snprintf(err, errlen, "out of memory in a shared-memory alltoall");
        return KOLO_ERR_NO_MEMORY;
    }
    got = sent + c->n;
    send_off = got + c->n;
    recv_off = send_off + c->n;
    for (int j = 1; j < c->n; j++) {
        send_off[j] = send_off[j - 1] + send_bytes[j - 1];
        recv_off[j] = recv_off[j - 1] + recv_bytes[j - 1];
    }
    for (;;) {
        uint32_t s = c->step + 1;
        unsigned more = 0, any = 0;
        for (int j = 0; j < c->n; j++) {
            size_t m = send_bytes[j] - sent[j] < part ? send_bytes[j] - sent[j] : part;
            memcpy(slot_of(c, s, c->me) + (size_t)j * part,
                   (const uint8_t *)in + send_off[j] + sent[j], m);
            sent[j] += m;
            more |= sent[j] < send_bytes[j];
        }
        atomic_store(&c->lines[c->me].more[s & 1], more);
        if ((rc = step_all(c, "alltoall", err, errlen)) != KOLO_OK)
            break;
        for (int j = 0; j < c->n; j++) {
            size_t m = recv_bytes[j] - got[j] < part ? recv_bytes[j] - got[j] : part;
            memcpy((uint8_t *)out + recv_off[j] + got[j],
                   slot_of(c, s, j) + (size_t)c->me * part, m);
            got[j] += m;
            any |= atomic_load(&c->lines[j].more[s & 1]);
        }
        if (!any)
            break;
    }
    free(sent);
    return rc;
}

/* This rank's block of the chunk from `done` (m elements) in runs of its
 * input: read where it lies (own, or the stream's views where may_view),
 * else copied into the rank's part of its slot, `mine_slot`, first. */
static void own_block_runs(const uint8_t *own, const kolo__ops_stream_t *s,
                           int may_view, size_t at, size_t done, size_t m,
                           size_t esize, uint8_t *mine_slot, own_runs_t *runs)
{
    size_t pos = 0;

    runs->n = 0;
    if (m == 0)
        return;
    if (s == NULL) {
        if (own == NULL) /* (the caller copied it into the slot) */
            own = mine_slot;
        runs->src[0] = own;
        runs->len[0] = m;
        runs->n = 1;
        return;
    }
    while (pos < m) {
        size_t run = 0;
        const void *p = NULL;
        if (may_view && s->view != NULL && runs->n < MAX_RUNS - 1)
            p = s->view(s->arg, at + done + pos, m - pos, &run);
        if (p == NULL || run == 0) { /* the rest through the slot */
            s->fill(s->arg, mine_slot + pos * esize, at + done + pos, m - pos);
            p = mine_slot + pos * esize;
            run = m - pos;
        }
        runs->src[runs->n] = p;
        runs->len[runs->n++] = run;
        pos += run;
    }
}

/* dst = the len elements of every member's piece, in member order: this
 * member's from own, member j's from its slot of step s at byte skip. */
static void reduce_members(shm_ctx_t *c, uint32_t s, size_t skip,
                           const uint8_t *own, uint8_t *dst, size_t len,
                           size_t esize, kolo__ops_reduce_fn reduce)
{
    const uint8_t *from[2] = {NULL, NULL};
    for (int j = 0; j < 2 && j < c->n; j++)
        from[j] = j == c->me ? own : slot_of(c, s, j) + skip;
    if (c->n == 1)
        memmove(dst, from[0], len * esize);
    else
        reduce(dst, from[0], from[1], len);
    for (int j = 2; j < c->n; j++)
        reduce(dst, dst, j == c->me ? own : slot_of(c, s, j) + skip, len);
}

/* One reduce-scatter as rs_common() moves it, chunk by chunk. */
typedef struct rs {
    shm_ctx_t *c;
    const uint8_t *work;
    const kolo__ops_stream_t *st;
    void *out;
    const size_t *counts;
    size_t esize;
    kolo__ops_reduce_fn reduce;
    size_t part;       /* elements of each rank's part of a slot */
    size_t *offs;      /* [n]: where each rank's block starts */
    const uint8_t *own; /* this rank's block in work, or NULL */
    int own_in_slot;   /* it goes through the slot nonetheless */
    int may_view;      /* the stream's views may be read in place */
} rs_t;

/* Where each block starts, and whether this rank's own is read where it
 * lies. Returns the largest block. */
static size_t rs_plan(rs_t *x)
{
    shm_ctx_t *c = x->c;
    const size_t esize = x->esize;
    size_t most = 0;

    for (int j = 0; j < c->n; j++) {
        x->offs[j] = j == 0 ? 0 : x->offs[j - 1] + x->counts[j - 1];
        most = x->counts[j] > most ? x->counts[j] : most;
    }
    /* From a buffer, this rank's own block is read where it lies unless
     * out overlaps it other than as the same buffer (which a reduction
     * may write), or this rank comes third or later: the first
     * reduction, of ranks 0 and 1, would then overwrite it before its
     * turn. Then it goes through the slot like the others. */
    x->own = x->work != NULL ? x->work + x->offs[c->me] * esize : NULL;
    const size_t own_bytes = x->counts[c->me] * esize;
    const uint8_t *out = x->out;
    x->own_in_slot = x->own != NULL && out < x->own + own_bytes &&
                     x->own < out + own_bytes && (c->me >= 2 || out != x->own);
    /* The same through a stream that places results where the input may
     * lie (an in-place allreduce): from the third rank on, its own block
     * is copied first. */
    x->may_view = x->out != NULL || c->me < 2;
    return most;
}

/* Elements of rank j's block in the chunk from `done`. */
static size_t rs_block(const rs_t *x, int j, size_t done)
{
    size_t m = x->counts[j] > done ? x->counts[j] - done : 0;
    return m < x->part ? m : x->part;
}

/* Copies the other ranks' blocks of the chunk from `done` into the parts
 * of this rank's slot (and its own, where it goes through the slot). */
static void rs_fill(const rs_t *x, uint8_t *slot, size_t done)
{
    const shm_ctx_t *c = x->c;
    const size_t pslot = x->part * x->esize;

    for (int j = 0; j < c->n; j++) {
        size_t m;
        if (j == c->me && !x->own_in_slot)
            continue;
        m = rs_block(x, j, done);
        if (x->st != NULL && m > 0)
            x->st->fill(x->st->arg, slot + (size_t)j * pslot,
                        x->offs[j] + done, m);
        else if (x->st == NULL)
            memcpy(slot + (size_t)j * pslot,
                   x->work + (x->offs[j] + done) * x->esize, m * x->esize);
    }
}

/* Reduces this rank's block of the chunk from `done` (its runs of its own
 * input, the peers' slots of step s at byte `at`) into out, or where it
 * stays, through st->place, tensor by tensor. */
static void rs_reduce(const rs_t *x, uint32_t s, size_t at, size_t done,
                      const own_runs_t *runs)
{
    shm_ctx_t *c = x->c;
    const size_t esize = x->esize;

    for (size_t k = 0, pos = 0; k < (size_t)runs->n; pos += runs->len[k++]) {
        size_t len = runs->len[k], skip = at + pos * esize, run;
        if (x->out != NULL) {
            reduce_members(c, s, skip, runs->src[k],
                           (uint8_t *)x->out + (done + pos) * esize, len,
                           esize, x->reduce);
            continue;
        }
        for (size_t sub = 0; sub < len; sub += run) { /* by tensor */
            uint8_t *dst = x->st->place(x->st->arg,
                                        x->offs[c->me] + done + pos + sub,
                                        len - sub, &run);
            reduce_members(c, s, skip + sub * esize,
                           runs->src[k] + sub * esize, dst, run, esize,
                           x->reduce);
        }
    }
}

/* The reduce-scatter of both entry points: rank j's block of the result
 * is elements [offs[j], offs[j] + counts[j]) of the input, which comes
 * from `work` or (st not NULL) through st->fill and st->view; this rank's
 * block is reduced into out, or (out NULL) where it stays, through
 * st->place, in rank order. Per chunk of at most one slot's part per
 * rank, every rank copies the blocks of the others into the parts of its
 * slot, and reduces its own from its peers' slots and its own input where
 * it lies (no other rank reads it). */
static int rs_common(shm_ctx_t *c, const uint8_t *work,
                     const kolo__ops_stream_t *st, void *out,
                     const size_t *counts, size_t esize,
                     kolo__ops_reduce_fn reduce, char *err, size_t errlen)
{
    rs_t x = {.c = c, .work = work, .st = st, .out = out, .counts = counts,
              .esize = esize, .reduce = reduce,
              .part = (c->slot / (size_t)c->n & ~(size_t)63) / esize,
              .offs = kolo__malloc((size_t)c->n * sizeof(size_t))};
    own_runs_t runs;
    size_t most;
    int rc = KOLO_OK;

    if (x.offs == NULL) {
        snprintf(err, errlen, "out of memory in a shared-memory reducescatter");
        return KOLO_ERR_NO_MEMORY;
    }
    if (x.part == 0) {
        free(x.offs);
        snprintf(err, errlen, "shared-memory slots of %zu bytes are too small "
                 "for %d ranks of %zu-byte elements (KOLO_SHM_SLOT_BYTES)",
                 c->slot, c->n, esize);
        return KOLO_ERR_CONFIG;
    }
    most = rs_plan(&x);
    for (size_t done = 0; done < most || (most == 0 && done == 0);
         done += x.part) {
        uint32_t s = c->step + 1;
        size_t at = (size_t)c->me * x.part * esize;
        uint8_t *slot = slot_of(c, s, c->me);
        rs_fill(&x, slot, done);
        own_block_runs(x.own == NULL || x.own_in_slot ? NULL
                                                      : x.own + done * esize,
                       st, x.may_view, x.offs[c->me], done,
                       rs_block(&x, c->me, done), esize, slot + at, &runs);
        if ((rc = step_all(c, "reducescatter", err, errlen)) != KOLO_OK)
            break;
        rs_reduce(&x, s, at, done, &runs);
        if (most == 0)
            break;
    }
    free(x.offs);
    return rc;
}

static int shm_reduce_scatter(void *ctx, void *work, void *out,
                              const size_t *counts, size_t esize,
                              kolo__ops_reduce_fn reduce, char *err,
                              size_t errlen)
{
    return rs_common(ctx, work, NULL, out, counts, esize, reduce, err, errlen);
}

int kolo__shm_reduce_scatter_stream(void *ctx, const kolo__ops_stream_t *s,
                                    void *out, const size_t *counts,
                                    size_t esize, kolo__ops_reduce_fn reduce,
                                    char *err, size_t errlen)
{
    return rs_common(ctx, NULL, s, out, counts, esize, reduce, err, errlen);
}

int kolo__shm_allgather_stream(void *ctx, const void *mine,
                               const kolo__ops_stream_t *s,
                               const size_t *counts, size_t esize, char *err,
                               size_t errlen)
{
    shm_ctx_t *c = ctx;
    size_t per = c->slot / esize, most = 0, at = 0;
    size_t *offs = kolo__malloc((size_t)c->n * sizeof(size_t));
    int rc = KOLO_OK;

    if (offs == NULL) {
        snprintf(err, errlen, "out of memory in a shared-memory allgather");
        return KOLO_ERR_NO_MEMORY;
    }
    for (int j = 0; j < c->n; j++) {
        offs[j] = at;
        at += counts[j];
        most = counts[j] > most ? counts[j] : most;
    }
    for (size_t off = 0; off < most && rc == KOLO_OK; off += per) {
        uint32_t step = c->step + 1;
        size_t m = counts[c->me] > off ? counts[c->me] - off : 0, run = 0;
        m = m < per ? m : per;
        if (mine != NULL)
            memcpy(slot_of(c, step, c->me), (const uint8_t *)mine + off * esize,
                   m * esize);
        for (size_t k = 0; mine == NULL && k < m; k += run) { /* by tensor */
            const void *p = s->place(s->arg, offs[c->me] + off + k, m - k, &run);
            memcpy(slot_of(c, step, c->me) + k * esize, p, run * esize);
        }
        if ((rc = step_all(c, "allgather", err, errlen)) != KOLO_OK)
            break;
        for (int j = 0; j < c->n; j++) {
            const uint8_t *from;
            size_t el = offs[j] + off;
            if (j == c->me && mine == NULL)
                continue; /* already where it stays */
            from = j == c->me ? (const uint8_t *)mine + off * esize
                              : slot_of(c, step, j);
            m = counts[j] > off ? counts[j] - off : 0;
            m = m < per ? m : per;
            if (s->place == NULL) {
                if (m > 0)
                    s->drain(s->arg, from, el, m);
                continue;
            }
            for (size_t k = 0; k < m; k += run) { /* by tensor */
                void *p = s->place(s->arg, el + k, m - k, &run);
                memcpy(p, from + k * esize, run * esize);
            }
        }
    }
    free(offs);
    return rc;
}

static int shm_wake_peers(void *ctx, uint64_t round, char *err, size_t errlen)
{
    shm_ctx_t *c = ctx;

    (void)err, (void)errlen;
    for (int j = 0; j < c->n; j++) {
        struct sockaddr_un a;
        socklen_t len;
        if (j == c->me)
            continue;
        sock_name(c, j, &a, &len);
        /* A full queue already holds a token; a closed socket is a peer
         * that ended, which its pidfd reports. */
        (void)sendto(c->sock, &round, sizeof(round), MSG_DONTWAIT,
                     (struct sockaddr *)&a, len);
    }
    return KOLO_OK;
}

static int shm_waiting_for(void *ctx)
{
    shm_ctx_t *c = ctx;
    int j = atomic_load_explicit(&c->waiting_on, memory_order_relaxed);
    return j >= 0 ? c->members[j] : -1;
}

const kolo__ops_t kolo__ops_shm = {
    .name = "shm",
    .caps = KOLO__OPS_USER | KOLO__OPS_ONE_HOST | KOLO__OPS_LEAVES,
    .init = shm_init,
    .finalize = shm_finalize,
    .allreduce = shm_allreduce,
    .allgather = shm_allgather,
    .gather = shm_gather,
    .broadcast = shm_broadcast,
    .allgatherv = shm_allgatherv,
    .alltoallv = shm_alltoallv,
    .reduce_scatter = shm_reduce_scatter,
    .wake_peers = shm_wake_peers,
    .allreduce_stream = shm_allreduce_stream,
    .waiting_for = shm_waiting_for,
};
