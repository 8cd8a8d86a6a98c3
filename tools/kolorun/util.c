/*
 * util.c — small helpers every part of kolorun uses: the monotonic clock,
 * whole writes, kolorun's own messages ("kolorun: ..."), formatted strings,
 * and a growing list of words (mpirun's argv, the launch command's).
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* Milliseconds of the monotonic clock, for deadlines. */
int64_t kolorun_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes everything or fails; a pipe or terminal may take less per call. */
int kolorun_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* kolorun's own messages: "kolorun: ...", one write so that they stay
 * whole next to the ranks' lines. */
void kolorun_say(const char *fmt, ...)
{
    char line[8192];
    int n = snprintf(line, sizeof line, "kolorun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* truncated: still end the line */
    line[len++] = '\n';
    (void)kolorun_write_all(STDERR_FILENO, line, len);
}

/* A string printed into fresh memory, or NULL when memory is short. */
char *kolorun_strdupf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

void kolorun_words_add(kolorun_words_t *ws, char *owned)
{
    if (!owned || ws->oom) {
        free(owned);
        ws->oom = 1;
        return;
    }
    if (ws->n + 2 > ws->cap) {
        int cap = ws->cap ? ws->cap * 2 : 32;
        char **w = realloc(ws->w, (size_t)cap * sizeof *w);
        if (!w) {
            free(owned);
            ws->oom = 1;
            return;
        }
        ws->w = w;
        ws->cap = cap;
    }
    ws->w[ws->n++] = owned;
    ws->w[ws->n] = NULL;
}

void kolorun_words_free(kolorun_words_t *ws)
{
    for (int i = 0; i < ws->n; i++)
        free(ws->w[i]);
    free(ws->w);
    memset(ws, 0, sizeof *ws);
}

/* Takes the value of an option given as "--opt V" or "--opt=V". Returns the
 * value (advancing *i past it) or NULL if absent. */
const char *kolorun_opt_value(int argc, char **argv, int *i,
                              const char *arg, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return NULL;
    if (arg[n] == '=')
        return arg + n + 1;
    if (arg[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        kolorun_say("option %s needs a value (see kolorun --help)", name);
        exit(2);
    }
    return argv[++*i];
}

/* A whole decimal number in [lo, hi], or -1. */
long kolorun_parse_long(const char *s, long lo, long hi)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return -1;
    return v;
}

/* How a child ended, for kolorun's messages: "exited with status 3", "was
 * killed by signal 9 (Killed)". */
void kolorun_describe(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, n, "ended with wait status 0x%x", (unsigned)status);
}

int kolorun_read_line(FILE *f, const char *path, char *line, size_t cap,
                      int *lineno, char *where, size_t wlen)
{
    if (!fgets(line, (int)cap, f))
        return 0;
    ++*lineno;
    snprintf(where, wlen, "%s:%d", path, *lineno);
    if (!strchr(line, '\n') && !feof(f)) {
        kolorun_say("%s: line longer than %d characters", where,
                    (int)cap - 2);
        exit(2);
    }
    line[strcspn(line, "\r\n")] = '\0';
    return 1;
}

int kolorun_grow(void *table, int *cap, int n, size_t size)
{
    void **t = table;
    int ncap = *cap ? *cap * 2 : 16;
    while (ncap < n)
        ncap *= 2;
    char *p = realloc(*t, (size_t)ncap * size);
    if (!p)
        return -1;
    memset(p + (size_t)*cap * size, 0, (size_t)(ncap - *cap) * size);
    *t = p;
    *cap = ncap;
    return 0;
}
