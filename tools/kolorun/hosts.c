/*
 * hosts.c — the hosts of a job over several machines
 *
 * -H a:4,b:4 and --hostfile both give a list of hosts with slots. Ranks fill
 * the hosts in the order given, host by host: with -np 6, a gets ranks 0-3
 * and b ranks 4-5. A host's index among the hosts that got ranks is its
 * KOLO_CROSS_RANK, which the runtime takes as the host's identity (ranks
 * with the same one share memory); ranks on it are numbered by
 * KOLO_LOCAL_RANK. The placeholders of --launch-command are checked here
 * too; spawn.c replaces them.
 */
#define _GNU_SOURCE

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmdline.h"

/* The launching host: its ranks start directly, without ssh. */
int kolorun_host_is_local(const char *name)
{
    char me[256] = "";
    if (strcmp(name, "localhost") == 0 || strcmp(name, "127.0.0.1") == 0 ||
        strcmp(name, "::1") == 0)
        return 1;
    if (gethostname(me, sizeof me - 1) != 0 || me[0] == '\0')
        return 0;
    if (strcmp(name, me) == 0)
        return 1;
    /* "node1" and "node1.cluster.example" name the same machine. */
    size_t a = strcspn(name, "."), b = strcspn(me, ".");
    return a == b && strncmp(name, me, a) == 0 &&
           (name[a] == '\0' || me[b] == '\0');
}

/* A host name kolorun can pass through a launch command and a shell: no
 * blanks, quotes or shell syntax, and not an option. */
int kolorun_host_name_ok(const char *name)
{
    if (name[0] == '\0' || name[0] == '-' || strlen(name) > 255)
        return 0;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr(".-_:[]@%", *p))
            return 0;
    return 1;
}

/* Adds a host to the list; exits 2 with a message naming `where` on a
 * wrong or repeated name. */
static void kolorun_host_add(kolorun_opts_t *o, const char *name, size_t len,
                             int slots, const char *where)
{
    char *n = strndup(name, len);
    kolorun_host_t *h = realloc(o->hosts, (size_t)(o->nhosts + 1) * sizeof *h);
    if (!n || !h) {
        kolorun_say("out of memory");
        exit(1);
    }
    o->hosts = h;
    if (!kolorun_host_name_ok(n)) {
        kolorun_say("%s: '%s' is not a host name kolorun can use (letters, "
                    "digits and . - _ : [ ] @ %% only)",
                    where, n);
        exit(2);
    }
    for (int i = 0; i < o->nhosts; i++) {
        if (strcmp(o->hosts[i].name, n) == 0) {
            kolorun_say("%s: host %s is listed twice; give it once with all "
                        "its slots",
                        where, n);
            exit(2);
        }
    }
    memset(&o->hosts[o->nhosts], 0, sizeof o->hosts[0]);
    o->hosts[o->nhosts].name = n;
    o->hosts[o->nhosts].slots = slots;
    o->hosts[o->nhosts].local = kolorun_host_is_local(n);
    o->nhosts++;
}

/* -H host[:slots],... ("[::1]:2" for an IPv6 address with slots). */
void kolorun_parse_hosts(kolorun_opts_t *o, const char *list)
{
    const char *p = list;
    int entry = 1;
    if (*list == '\0') {
        kolorun_say("-H wants hosts, for example -H hostA:4,hostB:4");
        exit(2);
    }
    for (;; entry++) {
        size_t len = strcspn(p, ",");
        char item[512], where[600];
        snprintf(item, sizeof item, "%.*s", (int)(len < 511 ? len : 511), p);
        snprintf(where, sizeof where, "-H, entry %d ('%s')", entry, item);
        if (len == 0) {
            kolorun_say("-H: entry %d is empty in '%s'", entry, list);
            exit(2);
        }
        /* The slots follow the last ':' unless the name is an IPv6
         * address, which must then be in brackets. */
        const char *name = item, *colon = strrchr(item, ':');
        size_t nlen = strlen(item);
        int slots = 1;
        if (item[0] == '[') {
            const char *close = strchr(item, ']');
            if (!close || (close[1] != '\0' && close[1] != ':')) {
                kolorun_say("%s: write an IPv6 address as [ADDRESS] or "
                            "[ADDRESS]:SLOTS",
                            where);
                exit(2);
            }
            name = item + 1;
            nlen = (size_t)(close - name);
            colon = close[1] == ':' ? close + 1 : NULL;
        } else if (colon && strchr(item, ':') != colon) {
            colon = NULL; /* a bare IPv6 address: one slot */
        } else if (colon) {
            nlen = (size_t)(colon - item);
        }
        if (colon) {
            long v = kolorun_parse_long(colon + 1, 1, KOLORUN_MAX_RANKS);
            if (v < 0) {
                kolorun_say("%s: slots must be a whole number from 1 to %d, "
                            "not '%s'",
                            where, KOLORUN_MAX_RANKS, colon + 1);
                exit(2);
            }
            slots = (int)v;
        }
        kolorun_host_add(o, name, nlen, slots, where);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
}

/* --hostfile: "host slots=N" or "host" per line; '#' to the end of a line
 * is a comment; blank lines are skipped. Errors name FILE:LINE. */
void kolorun_parse_hostfile(kolorun_opts_t *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kolorun_say("cannot read hostfile %s: %s", path, strerror(errno));
        exit(2);
    }
    char line[1024], where[1200];
    int lineno = 0;
    while (kolorun_read_line(f, path, line, sizeof line, &lineno, where,
                             sizeof where)) {
        char *save = NULL, *tok;
        line[strcspn(line, "#")] = '\0';
        char *host = strtok_r(line, " \t", &save);
        if (!host)
            continue;
        int slots = 1, seen_slots = 0;
        while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
            long v = -1;
            if (strncmp(tok, "slots=", 6) == 0 && !seen_slots)
                v = kolorun_parse_long(tok + 6, 1, KOLORUN_MAX_RANKS);
            if (v < 0) {
                kolorun_say("%s: expected 'host slots=N' (N from 1 to %d), "
                            "and '%s' is not understood",
                            where, KOLORUN_MAX_RANKS, tok);
                exit(2);
            }
            slots = (int)v;
            seen_slots = 1;
        }
        kolorun_host_add(o, host, strlen(host), slots, where);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        kolorun_say("cannot read hostfile %s: %s", path, strerror(errno));
        exit(2);
    }
    if (o->nhosts == 0) {
        kolorun_say("hostfile %s names no host", path);
        exit(2);
    }
}

/* Places the ranks host by host; fills in np when it was not given. */
void kolorun_place(kolorun_opts_t *o)
{
    long total = 0;
    for (int i = 0; i < o->nhosts; i++)
        total += o->hosts[i].slots;
    if (o->np == 0)
        o->np = total > KOLORUN_MAX_RANKS ? KOLORUN_MAX_RANKS : (int)total;
    if (o->np > total) {
        char list[1024];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; i < o->nhosts && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s:%d",
                                  i ? ", " : "", o->hosts[i].name,
                                  o->hosts[i].slots);
        kolorun_say("-np %d is more than the %ld slot%s of the hosts (%s)",
                    o->np, total, total == 1 ? "" : "s", list);
        exit(2);
    }
    int next = 0;
    for (int i = 0; i < o->nhosts; i++) {
        kolorun_host_t *h = &o->hosts[i];
        h->first_rank = next;
        h->nranks = o->np - next < h->slots ? o->np - next : h->slots;
        next += h->nranks;
        if (h->nranks > 0) {
            o->nused++;
            o->any_remote |= !h->local;
        }
    }
}

const char *const kolorun_placeholders[] = {"{host}", "{rank}",
                                            "{local_rank}", "{command}"};
_Static_assert(sizeof kolorun_placeholders / sizeof kolorun_placeholders[0] ==
                   4,
               "kolorun_check_template and kolorun_expand know four");

/* Every {word} of a launch command template must be one kolorun knows. */
void kolorun_check_template(const char *t)
{
    for (const char *p = strchr(t, '{'); p; p = strchr(p + 1, '{')) {
        int known = 0;
        for (size_t i = 0; i < 4; i++)
            known |= strncmp(p, kolorun_placeholders[i],
                             strlen(kolorun_placeholders[i])) == 0;
        if (!known) {
            kolorun_say("--launch-command: unknown placeholder '%.*s' in '%s' "
                        "(known: {host}, {rank}, {local_rank}, {command})",
                        (int)strcspn(p, "}") + 1, p, t);
            exit(2);
        }
    }
    if (strspn(t, " \t") == strlen(t)) {
        kolorun_say("--launch-command wants a command, for example "
                    "'ip netns exec {host}'");
        exit(2);
    }
}
