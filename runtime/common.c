/*
 * common.c — error records, logging, time.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

int kolo__log_threshold = KOLO__LOG_WARNING;
static int log_rank = -1;

static const char *const level_names[] = {"TRACE", "DEBUG", "INFO",
                                          "WARNING", "ERROR", "OFF"};

int kolo__err_set(kolo__err_t *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

void kolo__err_clear(kolo__err_t *err)
{
    err->code = KOLO_OK;
    err->msg[0] = '\0';
}

void kolo__log_set_rank(int rank) { log_rank = rank; }

void kolo__log(kolo__log_level_t level, const char *fmt, ...)
{
    char line[2048];
    int n;
    va_list ap;

    if (!KOLO__LOG_ON(level))
        return;
    if (log_rank >= 0)
        n = snprintf(line, sizeof(line), "[kolo rank %d] %s: ", log_rank,
                     level_names[level]);
    else
        n = snprintf(line, sizeof(line), "[kolo] %s: ", level_names[level]);
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* One fprintf call per line keeps lines of different threads whole. */
    fprintf(stderr, "%s\n", line);
}

int kolo__log_level_parse(const char *text, int *level)
{
    for (int i = 0; i <= KOLO__LOG_OFF; i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *level = i;
            return 0;
        }
    }
    if (strcasecmp(text, "warn") == 0) {
        *level = KOLO__LOG_WARNING;
        return 0;
    }
    return -1;
}

int64_t kolo__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void kolo__addr_text(const void *sockaddr_storage, char *out, size_t len)
{
    const struct sockaddr_storage *ss = sockaddr_storage;
    char host[INET6_ADDRSTRLEN] = "?";

    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(out, len, "%s:%u", host, (unsigned)ntohs(in->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, len, "[%s]:%u", host, (unsigned)ntohs(in6->sin6_port));
    } else {
        snprintf(out, len, "?");
    }
}
