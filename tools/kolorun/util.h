/*
 * util.h — the bottom of kolorun (util.c): the clock, whole writes,
 * kolorun's own messages, strings and word lists, and the small parsers
 * every layer above uses. Calls nothing of kolorun's.
 */
#ifndef KOLORUN_UTIL_H
#define KOLORUN_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A string list that grows; NULL-terminated; strings owned. */
typedef struct kolorun_words {
    char **w;
    int n, cap;
    int oom;
} kolorun_words_t;

int64_t kolorun_now_ms(void);
int kolorun_write_all(int fd, const char *p, size_t n);
/* kolorun's own messages: "kolorun: ..." and a newline, one write. */
void kolorun_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *kolorun_strdupf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
/* Adds an owned word (NULL: out of memory); on failure the word is freed
 * and ws->oom set, for the caller to check once at the end. */
void kolorun_words_add(kolorun_words_t *ws, char *owned);
void kolorun_words_free(kolorun_words_t *ws);
/* The value of option `name` at argv[*i] ("--opt V" or "--opt=V"),
 * advancing *i past it; NULL when arg is another option. A missing value
 * ends kolorun with status 2. */
const char *kolorun_opt_value(int argc, char **argv, int *i,
                              const char *arg, const char *name);
/* A whole decimal number in [lo, hi], or -1. */
long kolorun_parse_long(const char *s, long lo, long hi);
/* How a child ended (its wait status), for kolorun's messages. */
void kolorun_describe(int status, char *buf, size_t n);
/* The next line of a file kolorun reads (--config-file, --hostfile)
 * into line, without its end; where gets "PATH:LINE" for messages. 0 at
 * the end; a line longer than cap - 2 ends kolorun with status 2. */
int kolorun_read_line(FILE *f, const char *path, char *line, size_t cap,
                      int *lineno, char *where, size_t wlen);
/* Grows the table *table (entries of size bytes, *cap of them) to hold
 * n, doubling from 16, the new entries zeroed; 0, or -1 (unchanged). */
int kolorun_grow(void *table, int *cap, int n, size_t size);

#endif /* KOLORUN_UTIL_H */
