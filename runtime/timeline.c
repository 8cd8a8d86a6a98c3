/*
 * timeline.c — the Chrome-trace timeline.
 *
 * DESIGN
 *
 * Recording. Background threads call kolo__tl_begin/end/instant. Each call
 * copies the event (time, tensor name, phase, args) into a bounded ring
 * under a mutex held for a few instructions, and signals the writer. When
 * the ring is full the event is dropped and counted: the background loop
 * never waits for the disk. The count appears in the file as a
 * "dropped_events" counter.
 *
 * Writing. One writer thread per runtime drains the ring every 100 ms (or
 * sooner when it fills up) and formats the events as JSON. The file is a
 * JSON array that is valid at every moment, also when the process is
 * killed with SIGKILL in the middle of a write. That takes care: Linux
 * stops a write to a regular file between pages when the process gets a
 * fatal signal, so a write that spans pages can be cut short (a killed
 * job once left a file ending inside a string). Only a write within one
 * page is all or nothing. So the file is laid out as
 *     [ header ,event ,event ... <spaces> \n]\n
 * with room (spaces) reserved before the closing bracket, and every write
 * puts whole events, each starting with its comma, into the spaces, never
 * across a page boundary (an event that does not fit in the rest of a
 * page goes to the next one; the spaces it skips stay). Each write leaves
 * the array whole: events, whitespace, the bracket. When the room runs
 * out, or an event is larger than a page, the writer writes a new file
 * beside it (the events so far, the new ones, twice the room) and renames
 * it over the old one, which is atomic: the file is the old one or the
 * new one, whole. Stopping the timeline renames a copy without the room
 * over it the same way.
 *
 * A failed write. When a write fails (a full disk: the new file does not
 * fit), the file is what the last complete write left, valid JSON (the
 * new file is removed). The timeline then stops: a warning says once that
 * events are dropped from now on, and kolo_stop_timeline returns the
 * error.
 *
 * Lanes. Like Horovod's timeline, every tensor is a "process" of its own
 * (a pid, named by a process_name metadata event the first time the tensor
 * appears), so a viewer shows one lane per tensor with its phases nested.
 * pid 0 is the job's own lane (CYCLE_START markers, dropped events).
 *
 * Time. Events carry monotonic microseconds; the file's ts values count
 * from the job's epoch (start_time_since_epoch_in_micros in the first
 * event), which every rank shares, so per-rank files line up.
 */
#include "alloc.h"
#include "timeline.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "map.h"

#define RING_SIZE 65536
#define FLUSH_EVERY_MS 100

typedef enum ev_type { EV_BEGIN, EV_END, EV_INSTANT, EV_CYCLE, EV_DEVICE } ev_type_t;

typedef struct event {
    ev_type_t type;
    int64_t ts;
    char *tensor; /* owned; NULL for the job lane */
    const char *phase; /* static string (NULL for an instant) */
    char *args;   /* owned, may be NULL; an instant's name */
    int64_t dur;  /* EV_DEVICE: the span's length */
    int row;      /* EV_DEVICE: the lane's row (tid) */
} event_t;

struct kolo__timeline {
    int rank, size;
    int64_t epoch_us, offset_us; /* file ts = monotonic + offset */

    pthread_mutex_t mu;
    pthread_cond_t cv, idle_cv;
    event_t *ring;
    size_t head, count; /* events at ring[(head + i) % RING_SIZE] */
    uint64_t dropped, dropped_written;
    int active, mark_cycles, stopping, quit, writing;
    pthread_t writer;
    int writer_started;

    /* Writer thread only (and start/stop, with the writer idle). */
    int fd;
    off_t pos; /* where the next event goes: spaces from here */
    off_t room_end; /* where the closing "\n]\n" starts (the file's end - 3) */
    int first; /* no event written yet after the header */
    char *path;
    kolo__map_t pids; /* tensor name -> pid */
    int next_pid;
    int64_t started_us; /* when this file began (kolo__now_us) */
    int *depth;       /* [depth_cap]: spans open on each lane */
    int depth_cap;
    unsigned char *dev_named; /* [dev_cap]: bit r: the lane's row r named */
    int dev_cap;
    kolo__err_t error;
};

int64_t kolo__tl_now(void) { return kolo__now_us(); }

static int64_t realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int kolo__timeline_active(const kolo__timeline_t *tl)
{
    /* A racy read is fine: it only decides whether to build an event. */
    return tl != NULL && __atomic_load_n(&tl->active, __ATOMIC_RELAXED);
}

int kolo__timeline_marks_cycles(const kolo__timeline_t *tl)
{
    return kolo__timeline_active(tl) &&
           __atomic_load_n(&tl->mark_cycles, __ATOMIC_RELAXED);
}

/* ---- recording -------------------------------------------------------------- */

static void record(kolo__timeline_t *tl, ev_type_t type, const char *tensor,
                   const char *phase, const char *args, int64_t ts,
                   int64_t dur, int row)
{
    event_t ev = {type, ts ? ts : kolo__now_us(), NULL, phase, NULL, dur, row};
    int active;

    if (!kolo__timeline_active(tl))
        return;
    if (tensor != NULL && (ev.tensor = kolo__strdup(tensor)) == NULL)
        return;
    if (args != NULL && (ev.args = kolo__strdup(args)) == NULL) {
        free(ev.tensor);
        return;
    }
    pthread_mutex_lock(&tl->mu);
    /* active is also cleared outside the lock, by a write that failed
     * (write_failed): always read it atomically. */
    active = __atomic_load_n(&tl->active, __ATOMIC_RELAXED);
    if (!active || tl->count == RING_SIZE) {
        if (active)
            tl->dropped++;
        pthread_mutex_unlock(&tl->mu);
        free(ev.tensor);
        free(ev.args);
        return;
    }
    tl->ring[(tl->head + tl->count) % RING_SIZE] = ev;
    tl->count++;
    if (tl->count >= RING_SIZE / 2)
        pthread_cond_signal(&tl->cv); /* do not wait for the next flush */
    pthread_mutex_unlock(&tl->mu);
}

void kolo__tl_begin(kolo__timeline_t *tl, const char *tensor, const char *phase,
                    const char *args, int64_t ts_us)
{
    record(tl, EV_BEGIN, tensor, phase, args, ts_us, 0, 0);
}

void kolo__tl_end(kolo__timeline_t *tl, const char *tensor, int64_t ts_us)
{
    record(tl, EV_END, tensor, NULL, NULL, ts_us, 0, 0);
}

void kolo__tl_instant(kolo__timeline_t *tl, const char *tensor,
                      const char *name, int64_t ts_us)
{
    /* The name may live on the caller's stack: it travels as the owned
     * args string. */
    record(tl, EV_INSTANT, tensor, NULL, name, ts_us, 0, 0);
}

void kolo__tl_device(kolo__timeline_t *tl, const char *tensor, int row,
                     const char *phase, const char *args, int64_t ts_us,
                     int64_t dur_us)
{
    record(tl, EV_DEVICE, tensor, phase, args, ts_us, dur_us > 0 ? dur_us : 0,
           row);
}

int64_t kolo__timeline_started_us(const kolo__timeline_t *tl)
{
    return kolo__timeline_active(tl)
               ? __atomic_load_n(&tl->started_us, __ATOMIC_RELAXED) : 0;
}

void kolo__tl_cycle(kolo__timeline_t *tl)
{
    record(tl, EV_CYCLE, NULL, "CYCLE_START", NULL, 0, 0, 0);
}

/* ---- writing ---------------------------------------------------------------- */

/* Formatted events; cuts[i] is where event i starts (its comma), so that
 * the writer puts whole events into the file. */
typedef struct text {
    char *buf;
    size_t len, cap;
    size_t *cuts, ncuts, cuts_cap;
} text_t;

static void text_free(text_t *t)
{
    free(t->buf);
    free(t->cuts);
}

static void put(text_t *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 65536;
        char *nb;
        while (ncap < t->len + n + 1)
            ncap *= 2;
        nb = kolo__realloc(t->buf, ncap);
        if (nb == NULL)
            return; /* the event is lost; the file stays valid */
        t->buf = nb;
        t->cap = ncap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void putf(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(text_t *t, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        put(t, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* The length of the well-formed UTF-8 sequence that starts at s, or 0
 * where the bytes at s are not one (Unicode's table 3-7: no overlong form,
 * no surrogate, nothing above U+10FFFF, no sequence cut short). Stops at
 * the first byte that does not fit, so it never reads past the NUL. */
static size_t utf8_len(const unsigned char *s)
{
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    size_t n;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3;
        if (s[0] == 0xe0)
            lo = 0xa0; /* overlong below U+0800 */
        else if (s[0] == 0xed)
            hi = 0x9f; /* U+D800..U+DFFF, the surrogates */
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4;
        if (s[0] == 0xf0)
            lo = 0x90; /* overlong below U+10000 */
        else if (s[0] == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0; /* a continuation byte, C0, C1 or F5..FF */
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* A JSON string, escaped. Tensor names are bytes, not always UTF-8, and
 * JSON is UTF-8: a byte that is not part of a well-formed UTF-8 sequence
 * is written as the escape of the lone surrogate U+DC00 + byte ("\xe9"
 * becomes "\udce9"), as Python's "surrogateescape" decodes it. Well-formed
 * UTF-8 never encodes a surrogate, so two different names stay two
 * different strings (a Latin-1 "\xe9" is not the UTF-8 "\xc3\xa9"), and
 * name.encode("utf-8", "surrogateescape") gives the bytes back. JSON
 * parsers (Python's json, JavaScript's JSON.parse, and so chrome://tracing)
 * accept such an escape; the file itself stays pure UTF-8. */
static void put_json_string(text_t *t, const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *run = p;

    put(t, "\"", 1);
    while (*p) {
        size_t n = utf8_len(p);
        if (n > 0 && *p != '"' && *p != '\\' && *p >= 0x20) {
            p += n; /* written as it is, with the run it belongs to */
            continue;
        }
        put(t, (const char *)run, (size_t)(p - run));
        if (n == 0) {
            putf(t, "\\udc%02x", *p);
        } else if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            put(t, esc, 2);
        } else {
            putf(t, "\\u%04x", *p);
        }
        run = ++p;
    }
    put(t, (const char *)run, (size_t)(p - run));
    put(t, "\"", 1);
}

/* Starts an event: its comma (none before the first) and its cut. */
static void event_sep(kolo__timeline_t *tl, text_t *t)
{
    if (t->ncuts == t->cuts_cap) {
        size_t ncap = t->cuts_cap ? t->cuts_cap * 2 : 1024;
        size_t *nc = kolo__realloc(t->cuts, ncap * sizeof(*nc));
        if (nc != NULL) {
            t->cuts = nc;
            t->cuts_cap = ncap;
        }
    }
    /* (out of memory: this event is written with the one before it) */
    if (t->ncuts < t->cuts_cap)
        t->cuts[t->ncuts++] = t->len;
    put(t, tl->first ? "" : ",\n", tl->first ? 0 : 2);
    tl->first = 0;
}

/* The pid of a tensor's lane, announcing a new one. */
static int lane(kolo__timeline_t *tl, text_t *t, const char *tensor)
{
    void *v;
    int pid;

    if (tensor == NULL)
        return 0;
    v = kolo__map_gets(&tl->pids, tensor);
    if (v != NULL)
        return (int)(intptr_t)v;
    pid = ++tl->next_pid;
    if (kolo__map_puts(&tl->pids, tensor, (void *)(intptr_t)pid) != 0)
        return 0;
    event_sep(tl, t);
    putf(t, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":", pid);
    put_json_string(t, tensor);
    put(t, "}},\n", 4);
    putf(t, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
            "\"args\":{\"sort_index\":%d}}",
         pid, pid);
    return pid;
}

/* Counts the spans open on a lane: an end with nothing open (its begin went
 * to an earlier file, before a stop and start) is dropped, and stopping
 * closes what is still open, so every file nests correctly. Returns 0 when
 * the event must be dropped. */
static int track_depth(kolo__timeline_t *tl, int pid, ev_type_t type)
{
    if (pid >= tl->depth_cap) {
        int ncap = tl->depth_cap ? tl->depth_cap * 2 : 256;
        int *nd;
        while (ncap <= pid)
            ncap *= 2;
        nd = kolo__realloc(tl->depth, (size_t)ncap * sizeof(int));
        if (nd == NULL)
            return type != EV_END;
        memset(nd + tl->depth_cap, 0, (size_t)(ncap - tl->depth_cap) * sizeof(int));
        tl->depth = nd;
        tl->depth_cap = ncap;
    }
    if (type == EV_BEGIN)
        tl->depth[pid]++;
    else if (type == EV_END) {
        if (tl->depth[pid] == 0)
            return 0;
        tl->depth[pid]--;
    }
    return 1;
}

/* An event's args object, if any, and its closing brace. */
static void end_with_args(text_t *t, const char *args)
{
    if (args != NULL) {
        put(t, ",\"args\":{", 9);
        put(t, args, strlen(args));
        put(t, "}", 1);
    }
    put(t, "}", 1);
}

/* A lane's rows of device spans are named before their first span: tid 1
 * "device", tid 2 "program stream". */
static void name_row(kolo__timeline_t *tl, text_t *t, int pid, int row)
{
    if (pid >= tl->dev_cap) {
        int ncap = tl->dev_cap ? tl->dev_cap * 2 : 256;
        unsigned char *nd;
        while (ncap <= pid)
            ncap *= 2;
        nd = kolo__realloc(tl->dev_named, (size_t)ncap);
        if (nd == NULL)
            return; /* unnamed: the viewer shows its number */
        memset(nd + tl->dev_cap, 0, (size_t)(ncap - tl->dev_cap));
        tl->dev_named = nd;
        tl->dev_cap = ncap;
    }
    if (tl->dev_named[pid] & (1u << row))
        return;
    tl->dev_named[pid] |= (unsigned char)(1u << row);
    event_sep(tl, t);
    putf(t, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"%s\"}}", pid, row,
         row == KOLO__TL_ROW_STREAM ? "program stream" : "device");
}

static void format_event(kolo__timeline_t *tl, text_t *t, const event_t *ev)
{
    int pid = lane(tl, t, ev->tensor);
    long long ts = (long long)(ev->ts + tl->offset_us);

    if (!track_depth(tl, pid, ev->type))
        return;
    if (ev->type == EV_DEVICE)
        name_row(tl, t, pid, ev->row);
    event_sep(tl, t);
    switch (ev->type) {
    case EV_BEGIN:
        put(t, "{\"name\":", 8);
        put_json_string(t, ev->phase);
        putf(t, ",\"ph\":\"B\",\"ts\":%lld,\"pid\":%d,\"tid\":0", ts, pid);
        end_with_args(t, ev->args);
        break;
    case EV_END:
        putf(t, "{\"ph\":\"E\",\"ts\":%lld,\"pid\":%d,\"tid\":0}", ts, pid);
        break;
    case EV_DEVICE:
        put(t, "{\"name\":", 8);
        put_json_string(t, ev->phase);
        putf(t, ",\"cat\":\"device\",\"ph\":\"X\",\"ts\":%lld,\"dur\":%lld,"
                "\"pid\":%d,\"tid\":%d", ts, (long long)ev->dur, pid, ev->row);
        end_with_args(t, ev->args);
        break;
    case EV_INSTANT:
    case EV_CYCLE:
        put(t, "{\"name\":", 8);
        put_json_string(t, ev->type == EV_INSTANT ? ev->args : ev->phase);
        putf(t, ",\"ph\":\"i\",\"ts\":%lld,\"pid\":%d,\"tid\":0,\"s\":\"%s\"}", ts,
             pid, ev->type == EV_CYCLE ? "g" : "t");
        break;
    }
}

/* All of buf at `at`; -1 with errno set when it cannot (a full disk: a
 * short write, then ENOSPC). */
static int pwrite_all(int fd, const char *buf, size_t len, off_t at)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, buf, len, at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0) { /* defensive: no progress, no error */
            errno = EIO;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
        at += n;
    }
    return 0;
}

#define PAGE_BYTES ((off_t)4096) /* the unit a fatal signal cannot cut */
#define ROOM_MIN ((off_t)64 * 1024)

/* A write failed (errno_: why): the file is as the last complete write
 * left it. Stops the timeline: what is recorded from now on is dropped.
 * Said once, here; kolo_stop_timeline returns it. A failed header is the
 * caller's to report (kolo__timeline_start fails). */
static void write_failed(kolo__timeline_t *tl, int errno_)
{
    off_t keep = tl->pos > 0 ? tl->room_end + 3 : 0;
    close(tl->fd);
    tl->fd = -1;
    __atomic_store_n(&tl->active, 0, __ATOMIC_RELAXED);
    if (tl->pos == 0) {
        kolo__err_set(&tl->error, KOLO_ERR_INVALID_ARGUMENT,
                      "cannot write the timeline file '%s': %s", tl->path,
                      strerror(errno_));
        return;
    }
    kolo__err_set(&tl->error, KOLO_ERR_INVALID_ARGUMENT,
                  "timeline %s: cannot write: %s; events are dropped from now "
                  "on (the file keeps the %lld bytes written before, valid "
                  "JSON)",
                  tl->path, strerror(errno_), (long long)keep);
    kolo__log(KOLO__LOG_WARNING, "%s", tl->error.msg);
}

/* n bytes of `c` at `at`. */
static int pwrite_repeat(int fd, char c, off_t n, off_t at)
{
    char block[8192];
    memset(block, c, sizeof(block));
    while (n > 0) {
        size_t m = n < (off_t)sizeof(block) ? (size_t)n : sizeof(block);
        if (pwrite_all(fd, block, m, at) != 0)
            return -1;
        n -= (off_t)m;
        at += (off_t)m;
    }
    return 0;
}

/* The first n bytes of file `from` into file `to`. */
static int copy_head(int from, int to, off_t n)
{
    char block[65536];
    off_t at = 0;
    while (at < n) {
        size_t want = n - at < (off_t)sizeof(block) ? (size_t)(n - at) : sizeof(block);
        ssize_t got = pread(from, block, want, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = EIO; /* the file is shorter than it should be */
            return -1;
        }
        if (pwrite_all(to, block, (size_t)got, at) != 0)
            return -1;
        at += got;
    }
    return 0;
}

/* Writes a new file: this one up to pos, then `rest`, then `room` bytes of
 * spaces and the closing bracket; renames it over this one and carries on
 * in it. On failure this file stays as it was; errno says why. */
static int rewrite(kolo__timeline_t *tl, const char *rest, size_t len, off_t room)
{
    size_t plen = strlen(tl->path);
    char *tmp = kolo__malloc(plen + 8);
    struct stat st;
    off_t end = tl->pos + (off_t)len;
    int fd, e;

    if (tmp == NULL)
        return -1;
    memcpy(tmp, tl->path, plen);
    memcpy(tmp + plen, ".XXXXXX", 8);
    fd = mkstemp(tmp);
    if (fd >= 0)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (fd < 0) {
        free(tmp);
        return -1;
    }
    if (fstat(tl->fd, &st) != 0 || fchmod(fd, st.st_mode & 07777) != 0 ||
        copy_head(tl->fd, fd, tl->pos) != 0 ||
        pwrite_all(fd, rest, len, tl->pos) != 0 ||
        pwrite_repeat(fd, ' ', room, end) != 0 ||
        pwrite_all(fd, "\n]\n", 3, end + room) != 0 ||
        rename(tmp, tl->path) != 0) {
        e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        errno = e;
        return -1;
    }
    free(tmp);
    close(tl->fd);
    tl->fd = fd;
    tl->pos = end;
    tl->room_end = end + room;
    return 0;
}

/* Writes the events in `t` (file layout: see the top of this file). On
 * failure the file is as the last write left it (write_failed). */
static int write_out(kolo__timeline_t *tl, text_t *t)
{
    size_t i = 0, n = t->ncuts;

    if (t->len == 0 || tl->fd < 0)
        goto done;
    if (n == 0 || t->cuts[0] != 0) { /* (cannot happen: every event cuts) */
        errno = EINVAL;
        goto failed;
    }
    while (i < n) {
        off_t page_end = (tl->pos / PAGE_BYTES + 1) * PAGE_BYTES;
        off_t limit = page_end < tl->room_end ? page_end : tl->room_end;
        size_t from = t->cuts[i], j = i, to = from, len;
        /* The events from i on that end within this page and the room. */
        while (j < n) {
            size_t next = j + 1 < n ? t->cuts[j + 1] : t->len;
            if (tl->pos + (off_t)(next - from) > limit)
                break;
            to = next;
            j++;
        }
        if (j > i) {
            if (pwrite_all(tl->fd, t->buf + from, to - from, tl->pos) != 0) {
                /* (best effort: blank what may have been written) */
                int e = errno;
                pwrite_repeat(tl->fd, ' ', (off_t)(to - from), tl->pos);
                errno = e;
                goto failed;
            }
            tl->pos += (off_t)(to - from);
            i = j;
            continue;
        }
        len = (i + 1 < n ? t->cuts[i + 1] : t->len) - from;
        if ((off_t)len <= PAGE_BYTES && page_end + (off_t)len <= tl->room_end) {
            tl->pos = page_end; /* on to the next page */
            continue;
        }
        /* No room left, or an event larger than a page: a new file. */
        len = t->len - from;
        /* (room for as much again as the file will hold: the file at most
         * doubles, so the copies cost a constant per byte) */
        if (rewrite(tl, t->buf + from, len,
                    tl->pos + (off_t)len > ROOM_MIN ? tl->pos + (off_t)len
                                                    : ROOM_MIN) != 0)
            goto failed;
        break;
    }
done:
    t->len = 0;
    t->ncuts = 0;
    return 0;
failed:
    write_failed(tl, errno);
    t->len = 0;
    t->ncuts = 0;
    return -1;
}

/* Takes every queued event and writes it. Called by the writer with the
 * lock held; drops it while formatting and writing. */
static void flush_locked(kolo__timeline_t *tl, text_t *t)
{
    size_t n = tl->count, head = tl->head;
    uint64_t dropped = tl->dropped;
    event_t *batch = kolo__malloc((n ? n : 1) * sizeof(*batch));

    if (batch == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        batch[i] = tl->ring[(head + i) % RING_SIZE];
    tl->head = (head + n) % RING_SIZE;
    tl->count = 0;
    tl->writing = 1;
    pthread_mutex_unlock(&tl->mu);

    for (size_t i = 0; i < n; i++) {
        if (tl->fd >= 0)
            format_event(tl, t, &batch[i]);
        free(batch[i].tensor);
        free(batch[i].args);
    }
    if (dropped != tl->dropped_written && tl->fd >= 0) {
        event_sep(tl, t);
        putf(t, "{\"name\":\"dropped_events\",\"ph\":\"C\",\"ts\":%lld,\"pid\":0,"
                "\"args\":{\"dropped\":%llu}}",
             (long long)(kolo__now_us() + tl->offset_us),
             (unsigned long long)dropped);
        tl->dropped_written = dropped;
    }
    write_out(tl, t);
    free(batch);

    pthread_mutex_lock(&tl->mu);
    tl->writing = 0;
    pthread_cond_broadcast(&tl->idle_cv);
}

static void *writer_main(void *arg)
{
    kolo__timeline_t *tl = arg;
    text_t t = {0};

    pthread_mutex_lock(&tl->mu);
    while (!tl->quit) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_nsec += FLUSH_EVERY_MS * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        if (tl->count == 0 && !tl->stopping)
            pthread_cond_timedwait(&tl->cv, &tl->mu, &deadline);
        if (tl->count > 0 || tl->dropped != tl->dropped_written)
            flush_locked(tl, &t);
        if (tl->stopping && tl->count == 0) {
            tl->stopping = 0;
            pthread_cond_broadcast(&tl->idle_cv);
        }
    }
    pthread_mutex_unlock(&tl->mu);
    text_free(&t);
    return NULL;
}

/* ---- life cycle ------------------------------------------------------------- */

kolo__timeline_t *kolo__timeline_new(int rank, int size, int64_t epoch_us)
{
    kolo__timeline_t *tl = kolo__calloc(1, sizeof(*tl));
    pthread_condattr_t attr;

    if (tl == NULL || (tl->ring = kolo__calloc(RING_SIZE, sizeof(event_t))) == NULL) {
        free(tl);
        return NULL;
    }
    tl->rank = rank;
    tl->size = size;
    tl->epoch_us = epoch_us > 0 ? epoch_us : realtime_us();
    tl->offset_us = realtime_us() - tl->epoch_us - kolo__now_us();
    tl->fd = -1;
    kolo__map_init(&tl->pids);
    pthread_mutex_init(&tl->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&tl->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&tl->idle_cv, NULL);
    return tl;
}

int kolo__timeline_start(kolo__timeline_t *tl, const char *path, int mark_cycles,
                         kolo__err_t *err)
{
    text_t t = {0};
    int fd, rc = KOLO_OK;

    kolo__timeline_stop(tl, NULL);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return kolo__err_set(err, KOLO_ERR_INVALID_ARGUMENT,
                             "cannot create the timeline file '%s': %s", path,
                             strerror(errno));
    pthread_mutex_lock(&tl->mu);
    tl->fd = fd;
    tl->pos = tl->room_end = 0;
    tl->first = 1;
    __atomic_store_n(&tl->mark_cycles, mark_cycles, __ATOMIC_RELAXED);
    tl->dropped = tl->dropped_written = 0;
    kolo__err_clear(&tl->error);
    free(tl->path);
    tl->path = kolo__strdup(path);
    kolo__map_free(&tl->pids);
    tl->next_pid = 0;
    __atomic_store_n(&tl->started_us, kolo__now_us(), __ATOMIC_RELAXED);
    if (tl->depth != NULL)
        memset(tl->depth, 0, (size_t)tl->depth_cap * sizeof(int));
    if (tl->dev_named != NULL)
        memset(tl->dev_named, 0, (size_t)tl->dev_cap);
    /* The header: the array and its first events, already closed, in one
     * write within the first page (all or nothing, see the top). The first
     * events' room comes with the first rewrite. */
    put(&t, "[\n", 2);
    tl->first = 0;
    putf(&t, "{\"name\":\"kolo_timeline\",\"ph\":\"M\",\"pid\":0,\"args\":{"
             "\"start_time_since_epoch_in_micros\":%lld,\"rank\":%d,"
             "\"size\":%d}},\n",
         (long long)tl->epoch_us, tl->rank, tl->size);
    putf(&t, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{"
             "\"name\":\"kolo rank %d\"}}", tl->rank);
    put(&t, "\n]\n", 3);
    if (t.buf == NULL || pwrite_all(fd, t.buf, t.len, 0) != 0) {
        write_failed(tl, t.buf == NULL ? ENOMEM : errno);
        rc = kolo__err_set(err, tl->error.code, "%s", tl->error.msg);
        kolo__err_clear(&tl->error); /* reported here */
    } else {
        tl->pos = tl->room_end = (off_t)t.len - 3;
        __atomic_store_n(&tl->active, 1, __ATOMIC_RELAXED);
    }
    if (rc == KOLO_OK && !tl->writer_started) {
        tl->quit = 0;
        if (kolo__thread_create(&tl->writer, NULL, writer_main, tl) != 0) {
            __atomic_store_n(&tl->active, 0, __ATOMIC_RELAXED);
            close(tl->fd);
            tl->fd = -1;
            rc = kolo__err_set(err, KOLO_ERR_INTERNAL,
                               "timeline: cannot start the writer thread");
        } else {
            tl->writer_started = 1;
        }
    }
    pthread_mutex_unlock(&tl->mu);
    text_free(&t);
    return rc;
}

int kolo__timeline_stop(kolo__timeline_t *tl, kolo__err_t *err)
{
    int rc = KOLO_OK;

    pthread_mutex_lock(&tl->mu);
    __atomic_store_n(&tl->active, 0, __ATOMIC_RELAXED);
    /* Let the writer write what is queued and go idle: then the file (and
     * whether a write failed) is this thread's to look at. */
    if (tl->writer_started) {
        tl->stopping = 1;
        pthread_cond_signal(&tl->cv);
        while (tl->stopping || tl->writing || tl->count > 0)
            pthread_cond_wait(&tl->idle_cv, &tl->mu);
    }
    /* Close the spans still open (operations in flight), so that the file
     * nests correctly on its own. */
    if (tl->fd >= 0 && tl->depth != NULL) {
        text_t t = {0};
        long long ts = (long long)(kolo__now_us() + tl->offset_us);
        for (int pid = 0; pid < tl->depth_cap; pid++)
            for (; tl->depth[pid] > 0; tl->depth[pid]--) {
                event_sep(tl, &t);
                putf(&t, "{\"ph\":\"E\",\"ts\":%lld,\"pid\":%d,\"tid\":0}", ts, pid);
            }
        write_out(tl, &t);
        text_free(&t);
    }
    /* The room is not needed any more: the file without it takes its
     * place (where that cannot be written, the file keeps it: trailing
     * spaces, valid JSON all the same). */
    if (tl->fd >= 0 && tl->room_end > tl->pos && rewrite(tl, "", 0, 0) != 0)
        kolo__debug("timeline %s: the reserved room stays at the end: %s",
                    tl->path, strerror(errno));
    /* A write that failed, now or earlier (the writer stopped the timeline
     * then): reported once. */
    if (tl->error.code != KOLO_OK) {
        rc = kolo__err_set(err, tl->error.code, "%s", tl->error.msg);
        kolo__err_clear(&tl->error);
    }
    if (tl->fd >= 0) {
        close(tl->fd);
        tl->fd = -1;
    }
    pthread_mutex_unlock(&tl->mu);
    return rc;
}

void kolo__timeline_free(kolo__timeline_t *tl)
{
    if (tl == NULL)
        return;
    kolo__timeline_stop(tl, NULL);
    if (tl->writer_started)
        kolo__thread_stop(tl->writer, &tl->mu, &tl->cv, &tl->quit);
    for (size_t i = 0; i < tl->count; i++) {
        free(tl->ring[(tl->head + i) % RING_SIZE].tensor);
        free(tl->ring[(tl->head + i) % RING_SIZE].args);
    }
    free(tl->ring);
    free(tl->depth);
    free(tl->dev_named);
    free(tl->path);
    kolo__map_free(&tl->pids);
    pthread_cond_destroy(&tl->cv);
    pthread_cond_destroy(&tl->idle_cv);
    pthread_mutex_destroy(&tl->mu);
    free(tl);
}
