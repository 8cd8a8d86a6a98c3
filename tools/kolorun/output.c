/*
 * output.c — the ranks' output (see "Pipes" in kolorun.h): reading their
 * pipes into line buffers, the rank prefix (on unless --no-tag-output)
 * and --prefix-output-with-timestamp, kolorun's batched writes to its own
 * stdout and stderr, and the files of --output-filename. On the way it
 * reads what the runtime says of the job's end, for kolorun_blame: the
 * ranks a survivor names as lost, the rank a stall shutdown or a deadlock
 * names, the tensor ranks disagree on.
 */
#define _GNU_SOURCE

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "procs.h"

void kolorun_sink_flush(kolorun_sink_t *s)
{
    if (s->len > 0 && !s->broken &&
        kolorun_write_all(s->fd, s->buf, s->len) != 0)
        s->broken = errno ? errno : EIO;
    s->len = 0;
}

/* Adds one record (prefix, data, optional newline) to a sink; a record never
 * straddles two writes. */
static void kolorun_sink_put(kolorun_sink_t *s, const char *prefix,
                             size_t plen, const char *data, size_t n,
                             int newline)
{
    if (s->broken)
        return;
    size_t need = plen + n + (newline ? 1 : 0);
    if (s->len + need > KOLORUN_SINK_CAP)
        kolorun_sink_flush(s);
    /* need <= KOLORUN_LINE_MAX + prefix + 1 < KOLORUN_SINK_CAP */
    memcpy(s->buf + s->len, prefix, plen);
    memcpy(s->buf + s->len + plen, data, n);
    s->len += plen + n;
    if (newline)
        s->buf[s->len++] = '\n';
}

/* The survivors of a rank that caused a failure name it in the runtime's
 * words: "lost rank 1 (pid 42) has exited or was killed", "rank 1 (pid 42)
 * left the shared-memory allreduce ...", "rank 1 has shut down, which
 * stops the job", "...; rank 1 had failed: ...", and kolo_init's (above).
 * Note each rank of this job
 * so named, for kolorun_blame. A pid that is not the rank's is someone
 * else's text. */
/* kolo_init's agreed failures name the rank that failed the same way on
 * every rank: "kolo_init failed: rank 1: out of memory ...", "rank 1 of 2
 * could not join the job (...)". rank_at points at "rank ", after past its
 * number. */
static int kolorun_init_names(const char *start, const char *rank_at,
                              const char *after)
{
    static const char init[] = "kolo_init failed: ";
    size_t ilen = sizeof init - 1;
    int m = 0;

    if (after[0] == ':' && (size_t)(rank_at - start) >= ilen &&
        memcmp(rank_at - ilen, init, ilen) == 0)
        return 1;
    return sscanf(after, " of %*d could not join the job%n", &m) == 0 && m > 0;
}

static void kolorun_note_lost(kolorun_t *k, const char *p, size_t n)
{
    static const char key[] = "rank ";
    static const char *const tails[] = {" has shut down, which stops the job",
                                        " had failed"};
    const char *start = p, *end = p + n;
    while ((p = memmem(p, (size_t)(end - p), key, sizeof key - 1)) != NULL) {
        int word = p > start && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        p += sizeof key - 1;
        if (word)
            continue;
        char text[96];
        size_t len = (size_t)(end - p) < sizeof text - 1 ? (size_t)(end - p)
                                                          : sizeof text - 1;
        memcpy(text, p, len);
        text[len] = '\0';
        int r, used = 0;
        long pid;
        if (sscanf(text, "%d%n", &r, &used) != 1 || r < 0 || r >= k->nstarted)
            continue;
        const char *after = text + used;
        if (kolorun_init_names(start, p - (sizeof key - 1), after)) {
            k->ranks[r].named_lost = 1;
            continue;
        }
        if (sscanf(after, " (pid %ld)", &pid) == 1) {
            if ((long)k->ranks[r].pid == pid)
                k->ranks[r].named_lost = 1;
            continue;
        }
        for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++)
            if (strncmp(after, tails[t], strlen(tails[t])) == 0)
                k->ranks[r].named_lost = 1;
    }
}

/* Where the stall shutdown says rank r's training thread was (text, from
 * the runtime's "; rank 2 has been outside kolo for 61.8 s (in its own
 * code)" or "; rank 2 is waiting inside kolo"): " and was outside kolo
 * for 61.8 s (in its own code)", " and was waiting inside kolo", or "". */
static void kolorun_stall_where(const char *text, int r, char *out, size_t n)
{
    char key[64];
    const char *p;
    double secs;
    out[0] = '\0';
    snprintf(key, sizeof key, "rank %d has been outside kolo for ", r);
    if ((p = strstr(text, key)) != NULL &&
        sscanf(p + strlen(key), "%lf s", &secs) == 1)
        snprintf(out, n, " and was outside kolo for %.1f s (in its own "
                 "code)", secs);
    snprintf(key, sizeof key, "rank %d is waiting inside kolo", r);
    if (!out[0] && strstr(text, key))
        snprintf(out, n, " and was waiting inside kolo");
}

/* The runtime's words for a stall that ends the job (runtime/stall.c):
 *   "stall: ranks waited more than 60 s (KOLO_STALL_SHUTDOWN_TIME_SECONDS)
 *    for tensors other ranks never enqueued: rank 2 is missing 'x' (61 s),
 *    'y' (61 s); rank 2 has been outside kolo for 61.8 s (in its own
 *    code); rank 3 is missing ..."
 * The first rank so named stalled the job. (The stall warning, which
 * names KOLO_STALL_CHECK_TIME_SECONDS, ends nothing: not read.) */
static void kolorun_note_stall(kolorun_t *k, const char *line, size_t n)
{
    static const char key[] = "(KOLO_STALL_SHUTDOWN_TIME_SECONDS)";
    static const char missing[] = " is missing '";
    char text[2048], where[100];
    const char *p = memmem(line, n, key, sizeof key - 1);
    int r, used = 0;
    double secs = 0;
    if (!p)
        return;
    snprintf(text, sizeof text, "%.*s", (int)(line + n - p), p);
    for (char *q = strstr(text, "rank "); q; q = strstr(q + 1, "rank ")) {
        char *name, *end;
        if (sscanf(q, "rank %d%n", &r, &used) != 1 ||
            strncmp(q + used, missing, sizeof missing - 1) != 0)
            continue;
        name = q + used + sizeof missing - 1;
        if (r < 0 || r >= k->nstarted || !(end = strstr(name, "' (")) ||
            sscanf(end, "' (%lf s)", &secs) != 1)
            continue;
        kolorun_stall_where(text, r, where, sizeof where);
        k->accused_rank = r;
        k->ranks[r].named_lost = 1;
        snprintf(k->accused_why, sizeof k->accused_why,
                 "stalled the job: it never enqueued '%.*s' (the others "
                 "waited %.0f s)%s", (int)(end - name), name, secs, where);
        return;
    }
}

/* Text from p to the end of a line, without the blanks that end it. */
static int kolorun_rest_len(const char *p, const char *end)
{
    while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
        end--;
    return (int)(end - p);
}

/* The first sentence from p on: up to a ". " outside quotes (a tensor's
 * name may hold one), else the rest of the line. */
static int kolorun_sentence_len(const char *p, const char *end)
{
    int quoted = 0;
    for (const char *q = p; q < end; q++) {
        if (*q == '\'')
            quoted = !quoted;
        else if (!quoted && *q == '.' && q + 1 < end && q[1] == ' ')
            return (int)(q - p);
    }
    return kolorun_rest_len(p, end);
}

/* The runtime's words for a proven deadlock (runtime/stall.c): "deadlock:
 * rank 2 skipped 'grad.b' (...) and waits on 'metric.a' (...); ranks 0, 1
 * wait on 'grad.b'. Every rank is waiting inside kolo, ...". Rank 2 (the
 * first named) is the cause; the first sentence says why. With no rank
 * that skipped: "deadlock: the ranks went different ways: rank 0 waits on
 * 'a'; rank 1 waits on 'b'. ...", which names no single cause. */
static void kolorun_note_deadlock(kolorun_t *k, const char *line, size_t n)
{
    static const char key[] = "deadlock: ", ways[] = "the ranks went ";
    const char *p = memmem(line, n, key, sizeof key - 1), *end = line + n;
    char text[32];
    int r, used = 0;
    if (!p)
        return;
    p += sizeof key - 1;
    if ((size_t)(end - p) > sizeof ways &&
        strncmp(p, ways, sizeof ways - 1) == 0) {
        if (!k->verdict[0])
            snprintf(k->verdict, sizeof k->verdict, "the ranks deadlocked: "
                     "they %.*s", kolorun_sentence_len(p + 10, end), p + 10);
        return;
    }
    snprintf(text, sizeof text, "%.*s", (int)(end - p), p);
    if (sscanf(text, "rank %d%n", &r, &used) != 1 || r < 0 ||
        r >= k->nstarted || strncmp(text + used, " skipped ", 9) != 0)
        return;
    p += used + 1;
    k->accused_rank = r;
    k->ranks[r].named_lost = 1;
    snprintf(k->accused_why, sizeof k->accused_why,
             "deadlocked the job: it %.*s", kolorun_sentence_len(p, end), p);
}

/* The runtime's words for ranks that disagree on a tensor (negotiate.c's
 * describe_mismatch): "allreduce of tensor 'x': ranks disagree on the
 * shape: rank 0 has [2, 3], rank 1 has [4]", or "tensor 'x': ranks
 * disagree on the collective: rank 0 enqueued allreduce, rank 1 enqueued
 * allgather". No rank caused it alone: kolorun_blame says so ("the ranks
 * disagreed on tensor 'x' (the shape: ...)"). */
static void kolorun_note_disagreement(kolorun_t *k, const char *line,
                                      size_t n)
{
    static const char key[] = "': ranks disagree on ", tensor[] = "tensor '";
    const char *p = memmem(line, n, key, sizeof key - 1), *name = NULL;
    if (!p)
        return;
    for (const char *q = line; q < p;) {
        const char *t = memmem(q, (size_t)(p - q), tensor, sizeof tensor - 1);
        if (!t)
            break;
        name = t + sizeof tensor - 1;
        q = name;
    }
    if (!name)
        return;
    const char *detail = p + sizeof key - 1;
    snprintf(k->verdict, sizeof k->verdict,
             "the ranks disagreed on tensor '%.*s' (%.*s)", (int)(p - name),
             name, kolorun_rest_len(detail, line + n), detail);
}

/* What the ranks' whole lines (n bytes at p) say of the job's end. */
static void kolorun_note_messages(kolorun_t *k, const char *p, size_t n)
{
    kolorun_note_lost(k, p, n);
    for (const char *end = p + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (k->accused_rank < 0)
            kolorun_note_stall(k, p, len);
        if (k->accused_rank < 0)
            kolorun_note_deadlock(k, p, len);
        if (!k->verdict[0])
            kolorun_note_disagreement(k, p, len);
        p += len + (nl != NULL);
    }
}

/* --output-filename: the same record into the rank's file. A file that
 * cannot be written (a full disk) is said once and closed; the job and the
 * terminal's copy go on. */
static void kolorun_file_put(kolorun_t *k, int r, int which, const char *prefix,
                             size_t plen, const char *data, size_t n,
                             int newline)
{
    int *fd = &k->ranks[r].files[which];
    if (*fd < 0)
        return;
    if ((plen > 0 && kolorun_write_all(*fd, prefix, plen) != 0) ||
        kolorun_write_all(*fd, data, n) != 0 ||
        (newline && kolorun_write_all(*fd, "\n", 1) != 0)) {
        kolorun_say("warning: cannot write rank %d's %s to %s/rank.*/%s: %s; "
                    "the rest goes to the terminal only",
                    r, which == KOLORUN_OUT ? "stdout" : "stderr",
                    k->opts.output_dir, which == KOLORUN_OUT ? "stdout" : "stderr",
                    strerror(errno));
        close(*fd);
        *fd = -1;
    }
}

/* What goes before each line of rank r's stream: with
 * --prefix-output-with-timestamp the local time as horovodrun writes it
 * (Python's time.asctime: "Mon Jun  5 10:00:00 2023"), then, unless
 * --no-tag-output, "[r]<stdout>:"; a blank between the time and an
 * untagged line. Empty: the bytes pass unchanged. */
static size_t kolorun_line_prefix(const kolorun_t *k, int r, int which,
                                  char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    if (k->opts.timestamp) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        len = strftime(out, n, "%a %b %e %H:%M:%S %Y", &tm);
    }
    if (k->opts.tag_output)
        len += (size_t)snprintf(out + len, n - len, "[%d]<%s>:", r,
                                which == KOLORUN_OUT ? "stdout" : "stderr");
    else if (len > 0)
        len += (size_t)snprintf(out + len, n - len, " ");
    return len;
}

/* The length of the first line of the n bytes at p, its end (\n or \r)
 * included; 0 when they hold no line end. */
static size_t kolorun_line_end(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n')
            return i + 1;
        if (p[i] == '\r') /* "\r\n" is one end; "\r" at the end waits */
            return i + 1 == n ? 0 : p[i + 1] == '\n' ? i + 2 : i + 1;
    }
    return 0;
}

/* Moves the whole lines of one stream to its sink (and its file); at end
 * of file, also the last unterminated line; when the buffer is full of one
 * line, a piece. */
static void kolorun_stream_emit(kolorun_t *k, int r, int which, int at_eof)
{
    kolorun_stream_t *st = &k->ranks[r].streams[which];
    kolorun_sink_t *sink = &k->sinks[which];
    size_t done = 0;
    char prefix[96];
    size_t plen = kolorun_line_prefix(k, r, which, prefix, sizeof prefix);

    if (plen == 0) {
        /* Unchanged bytes: everything up to the last newline, in one go. */
        size_t end = st->len;
        while (end > 0 && st->buf[end - 1] != '\n')
            end--;
        if (at_eof || (end == 0 && st->len == KOLORUN_LINE_MAX))
            end = st->len;
        if (end > 0) {
            kolorun_sink_put(sink, "", 0, st->buf, end, 0);
            kolorun_file_put(k, r, which, "", 0, st->buf, end, 0);
        }
        done = end;
    } else {
        for (;;) {
            /* A line ends at \n or at \r, as in horovodrun's
             * safe_shell_exec: a progress bar redrawn with \r shows as
             * it goes, each redraw prefixed. */
            size_t n = kolorun_line_end(st->buf + done, st->len - done);
            if (n == 0)
                break;
            kolorun_sink_put(sink, prefix, plen, st->buf + done, n, 0);
            kolorun_file_put(k, r, which, prefix, plen, st->buf + done, n, 0);
            done += n;
        }
        /* Prefixed output is made of lines: a piece or a last line without
         * a newline gets one, so that the next prefix starts a line. */
        size_t rest = st->len - done;
        if (rest > 0 && (at_eof || rest == KOLORUN_LINE_MAX)) {
            kolorun_sink_put(sink, prefix, plen, st->buf + done, rest, 1);
            kolorun_file_put(k, r, which, prefix, plen, st->buf + done, rest, 1);
            done = st->len;
        }
    }
    if (k->failed_rank < 0)
        kolorun_note_messages(k, st->buf, done);
    memmove(st->buf, st->buf + done, st->len - done);
    st->len -= done;
}

void kolorun_stream_close(kolorun_stream_t *st)
{
    if (st->fd >= 0)
        close(st->fd);
    st->fd = -1;
    st->len = 0;
}

/* After kolorun's stdout (or stderr) turned out to be a closed pipe: close
 * the ranks' pipes to it, so they see the broken pipe themselves. */
static void kolorun_sink_check(kolorun_t *k, int which)
{
    kolorun_sink_t *sink = &k->sinks[which];
    if (!sink->broken || sink->sources_closed)
        return;
    sink->sources_closed = 1;
    if (sink->broken != EPIPE)
        return; /* other errors: keep reading, discard */
    if (k->opts.verbose)
        kolorun_say("%s is a closed pipe: closing the ranks' %s too",
                    which == KOLORUN_OUT ? "stdout" : "stderr",
                    which == KOLORUN_OUT ? "stdout" : "stderr");
    for (int r = 0; r < k->nstarted; r++)
        kolorun_stream_close(&k->ranks[r].streams[which]);
}

/* Reads a rank's pipe: once (fair to the other ranks) or, when the rank is
 * gone, until nothing is left, so that its last words come before the line
 * that says how it ended. */
void kolorun_stream_read(kolorun_t *k, int r, int which, int until_empty)
{
    kolorun_stream_t *st = &k->ranks[r].streams[which];
    /* Bounded: something the rank left behind may still be writing. */
    for (int reads = 0; st->fd >= 0 && reads < 64; reads++) {
        ssize_t n = read(st->fd, st->buf + st->len, KOLORUN_LINE_MAX - st->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) { /* end of file, or an error that ends it the same */
            kolorun_stream_emit(k, r, which, 1);
            kolorun_stream_close(st);
            break;
        }
        st->len += (size_t)n;
        kolorun_stream_emit(k, r, which, 0);
        if (!until_empty)
            break;
    }
    kolorun_sink_flush(&k->sinks[which]);
    kolorun_sink_check(k, which);
}

int kolorun_mkdirs(const char *path, mode_t mode)
{
    char *p = strdup(path);
    struct stat st;
    if (!p)
        return -1;
    for (char *q = p + 1; *q; q++) {
        if (*q != '/')
            continue;
        *q = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *q = '/';
    }
    int rc = mkdir(p, mode) != 0 && errno != EEXIST ? -1 : 0;
    free(p);
    if (rc == 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) {
        errno = ENOTDIR;
        return -1;
    }
    return rc;
}

/* --output-filename DIR: each rank's stdout and stderr also go to
 * DIR/rank.R/stdout and DIR/rank.R/stderr, R padded with zeros to the
 * width of the last rank (rank.03 of 12), the layout of horovodrun's
 * gloo_run.py; the files are created anew. 0, or -1 said why. */
int kolorun_outputs_open(kolorun_t *k)
{
    const char *dir = k->opts.output_dir;
    int width = 1;
    for (int v = k->opts.np - 1; v >= 10; v /= 10)
        width++;
    if (kolorun_mkdirs(dir, 0777) != 0) {
        kolorun_say("--output-filename: cannot create the directory %s: %s",
                    dir, strerror(errno));
        return -1;
    }
    for (int r = 0; r < k->opts.np; r++) {
        char *sub = kolorun_strdupf("%s/rank.%0*d", dir, width, r);
        if (!sub || (mkdir(sub, 0777) != 0 && errno != EEXIST)) {
            kolorun_say("--output-filename: cannot create %s: %s",
                        sub ? sub : dir, strerror(errno));
            free(sub);
            return -1;
        }
        for (int s = 0; s < 2; s++) {
            char *f = kolorun_strdupf("%s/%s", sub, s == KOLORUN_OUT ? "stdout"
                                                                     : "stderr");
            k->ranks[r].files[s] = f ? open(f, O_WRONLY | O_CREAT | O_TRUNC |
                                                   O_CLOEXEC, 0666)
                                     : -1;
            if (k->ranks[r].files[s] < 0) {
                kolorun_say("--output-filename: cannot create %s: %s",
                            f ? f : sub, strerror(errno));
                free(f);
                free(sub);
                return -1;
            }
            free(f);
        }
        free(sub);
    }
    return 0;
}
