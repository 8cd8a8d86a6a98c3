/*
 * config_file.c — --config-file: horovodrun's YAML
 *
 * The file gives the settings of horovodrun's tuning flags (the rows of
 * options.c's table, kolorun_options, that have a YAML key) and the
 * controller, in sections one level deep; kolorun reads the small part of
 * YAML that horovodrun's files use, and a flag on the command line wins
 * over the file. Each line is read in steps (comment, key and value, the
 * top level or a section's key) that share one kolorun_yaml_t.
 */
#define _GNU_SOURCE

#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cmdline.h"

/* One scalar of the file: quotes removed; "" for null (absent). */
static int kolorun_yaml_scalar(char *s, char *out, size_t len)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    if (s[0] == '\'' || s[0] == '"') {
        char q = s[0];
        size_t o = 0;
        const char *p = s + 1;
        for (; *p; p++) {
            if (*p == q && q == '\'' && p[1] == '\'') {
                p++;
            } else if (*p == q) {
                break;
            } else if (*p == '\\' && q == '"' && p[1] != '\0') {
                p++;
            }
            if (o + 1 < len)
                out[o++] = *p;
        }
        out[o] = '\0';
        return *p == q && p[1] == '\0' ? 0 : -1;
    }
    if (strcmp(s, "~") == 0 || strcasecmp(s, "null") == 0)
        s[0] = '\0';
    if (strchr("[]{}&*!|>%@`", s[0]) && s[0] != '\0')
        return -1; /* flow collections, anchors, tags, block scalars */
    snprintf(out, len, "%s", s);
    return 0;
}

/* YAML 1.1's booleans (PyYAML reads yes/no/on/off too): 1, 0, or -1. */
static int kolorun_yaml_bool(const char *v)
{
    static const char *const yes[] = {"true", "yes", "on", "y"};
    static const char *const no[] = {"false", "no", "off", "n"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

/* What reading the file carries from line to line, and the line read. */
typedef struct kolorun_yaml {
    kolorun_opts_t *o;
    const int *given;     /* the rows of kolorun_options the line gave */
    int controller_given; /* --gloo or --mpi */
    char where[1200];     /* "FILE:LINE", for messages */
    char section[64];     /* the open section; "" at the top level */
    int section_indent;   /* its keys' indent; -1 before the first */
    char key[128], value[4096];
    int indent;
} kolorun_yaml_t;

/* Cuts a comment off: it starts at a '#' that begins the line or follows
 * a blank, outside quotes. */
static void kolorun_yaml_uncomment(char *line)
{
    char q = 0;
    for (char *p = line; *p; p++) {
        if (q) {
            if (*p == q)
                q = 0;
        } else if (*p == '\'' || *p == '"') {
            q = *p;
        } else if (*p == '#' && (p == line || p[-1] == ' ' || p[-1] == '\t')) {
            *p = '\0';
            return;
        }
    }
}

/* Splits a line into y's indent, key and value; 1 for a line without one
 * (blank, or a document marker). A line kolorun does not understand ends
 * it with status 2. */
static int kolorun_yaml_split(kolorun_yaml_t *y, char *line)
{
    char *p, *colon;
    y->indent = (int)strspn(line, " ");
    p = line + y->indent;
    if (*p == '\t') {
        kolorun_say("%s: YAML indents with blanks, not tabs", y->where);
        exit(2);
    }
    if (*p == '\0' || strcmp(p, "---") == 0 || strcmp(p, "...") == 0)
        return 1;
    colon = strstr(p, ": ");
    if (!colon && p[strlen(p) - 1] == ':')
        colon = p + strlen(p) - 1;
    if (!colon || *p == '-' || colon == p ||
        (size_t)(colon - p) >= sizeof y->key) {
        kolorun_say("%s: kolorun reads horovodrun's config files, "
                    "'key: value' lines and sections of them, and does "
                    "not understand '%s'", y->where, p);
        exit(2);
    }
    snprintf(y->key, sizeof y->key, "%.*s", (int)(colon - p), p);
    if (kolorun_yaml_scalar(colon + 1 + strspn(colon + 1, " "), y->value,
                            sizeof y->value) != 0) {
        kolorun_say("%s: the value of %s is not a plain, quoted or empty "
                    "scalar", y->where, y->key);
        exit(2);
    }
    return 0;
}

/* A top-level key: `controller: gloo|mpi` (unless --gloo or --mpi said),
 * or a section's name, which opens it. */
static void kolorun_yaml_top(kolorun_yaml_t *y)
{
    y->section[0] = '\0';
    y->section_indent = -1;
    if (strcmp(y->key, "controller") == 0) {
        if (y->value[0] == '\0')
            return;
        if (strcasecmp(y->value, "gloo") != 0 &&
            strcasecmp(y->value, "mpi") != 0) {
            kolorun_say("%s: controller: %s is not a controller "
                        "(gloo or mpi)", y->where, y->value);
            exit(2);
        }
        if (!y->controller_given) {
            y->o->gloo = strcasecmp(y->value, "gloo") == 0;
            y->o->mpi = !y->o->gloo;
        }
        return;
    }
    if (y->value[0] != '\0') {
        kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                    "ignored", y->where, y->key);
        return;
    }
    snprintf(y->section, sizeof y->section, "%.63s", y->key);
}

/* Checks that an indented key belongs to the open section, one level
 * deep; exits 2 otherwise. */
static void kolorun_yaml_section_key(kolorun_yaml_t *y)
{
    if (y->section[0] == '\0') {
        kolorun_say("%s: %s is indented, but no section is open", y->where,
                    y->key);
        exit(2);
    }
    if (y->section_indent < 0)
        y->section_indent = y->indent;
    if (y->indent != y->section_indent) {
        kolorun_say("%s: kolorun reads sections one level deep; %s is "
                    "indented differently from the keys before it",
                    y->where, y->key);
        exit(2);
    }
}

/* A section's key: the flag whose YAML key it is, as if given with the
 * value (a switch's as true or false), unless the command line gave the
 * flag; a key horovodrun does not read is warned about. */
static void kolorun_yaml_setting(const kolorun_yaml_t *y)
{
    char full[200];
    int found = 0;
    snprintf(full, sizeof full, "%s.%s", y->section, y->key);
    for (int i = 0; i < KOLORUN_NOPTIONS && !found; i++) {
        const kolorun_option_t *k = &kolorun_options[i];
        char what[1500];
        if (!k->yaml || strcmp(k->yaml, full) != 0)
            continue;
        found = 1;
        if (y->given[i])
            break; /* the command line wins */
        snprintf(what, sizeof what, "%s: %s (%s)", y->where, full,
                 k->names[0].name);
        if (k->kind == KR_SWITCH || k->kind == KR_REFUSED_ON) {
            int b = kolorun_yaml_bool(y->value);
            if (b < 0) {
                kolorun_say("%s wants true or false, not '%s'", what,
                            y->value);
                exit(2);
            }
            kolorun_knob_apply(y->o, k, b != k->yaml_inverted ? NULL : "0",
                               what);
        } else {
            kolorun_knob_apply(y->o, k, y->value, what);
        }
    }
    if (!found)
        kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                    "ignored", y->where, full);
}

/* Reads horovodrun's --config-file: top-level `controller: gloo|mpi` and
 * sections of `key: value` (params, autotune, timeline, stall_check,
 * library_options, logging), each key as its flag, unless the command line
 * gave that flag (given[] says). Errors name FILE:LINE; a key horovodrun
 * does not read is warned about and skipped, as horovodrun skips it. */
void kolorun_config_file(kolorun_opts_t *o, const char *path,
                         const int *given, int controller_given)
{
    kolorun_yaml_t y = {.o = o, .given = given,
                        .controller_given = controller_given,
                        .section_indent = -1};
    FILE *f = fopen(path, "r");
    char line[4096];
    int lineno = 0;
    if (!f) {
        kolorun_say("--config-file %s: %s", path, strerror(errno));
        exit(2);
    }
    while (kolorun_read_line(f, path, line, sizeof line, &lineno, y.where,
                             sizeof y.where)) {
        kolorun_yaml_uncomment(line);
        if (kolorun_yaml_split(&y, line) != 0)
            continue;
        if (y.indent == 0)
            kolorun_yaml_top(&y);
        else {
            kolorun_yaml_section_key(&y);
            if (y.value[0] != '\0') /* null: not set, as in horovodrun */
                kolorun_yaml_setting(&y);
        }
    }
    fclose(f);
}
