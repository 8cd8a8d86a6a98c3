/*
 * config_file.c — --config-file: horovodrun's YAML
 *
 * The file gives the settings of horovodrun's tuning flags (the rows of
 * options.c's table, kolorun_options, that have a YAML key) and the
 * controller, in sections one level deep; kolorun reads the small part of
 * YAML that horovodrun's files use, and a flag on the command line wins
 * over the file.
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

/* Reads horovodrun's --config-file: top-level `controller: gloo|mpi` and
 * sections of `key: value` (params, autotune, timeline, stall_check,
 * library_options, logging), each key as its flag, unless the command line
 * gave that flag (given[] says). Errors name FILE:LINE; a key horovodrun
 * does not read is warned about and skipped, as horovodrun skips it. */
void kolorun_config_file(kolorun_opts_t *o, const char *path,
                         const int *given, int controller_given)
{
    FILE *f = fopen(path, "r");
    char line[4096], section[64] = "";
    int lineno = 0, section_indent = -1;
    if (!f) {
        kolorun_say("--config-file %s: %s", path, strerror(errno));
        exit(2);
    }
    char where[1200];
    while (kolorun_read_line(f, path, line, sizeof line, &lineno, where,
                             sizeof where)) {
        char key[128], *p, *colon, value[4096];
        int indent;
        /* A comment starts at '#' that begins the line or follows a blank
         * (outside quotes). */
        {
            char q = 0;
            for (p = line; *p; p++) {
                if (q) {
                    if (*p == q)
                        q = 0;
                } else if (*p == '\'' || *p == '"') {
                    q = *p;
                } else if (*p == '#' && (p == line || p[-1] == ' ' || p[-1] == '\t')) {
                    *p = '\0';
                    break;
                }
            }
        }
        indent = (int)strspn(line, " ");
        p = line + indent;
        if (*p == '\t') {
            kolorun_say("%s: YAML indents with blanks, not tabs", where);
            exit(2);
        }
        if (*p == '\0' || strcmp(p, "---") == 0 || strcmp(p, "...") == 0)
            continue;
        colon = strstr(p, ": ");
        if (!colon && p[strlen(p) - 1] == ':')
            colon = p + strlen(p) - 1;
        if (!colon || *p == '-' || colon == p || (size_t)(colon - p) >= sizeof key) {
            kolorun_say("%s: kolorun reads horovodrun's config files, "
                        "'key: value' lines and sections of them, and does "
                        "not understand '%s'", where, p);
            exit(2);
        }
        snprintf(key, sizeof key, "%.*s", (int)(colon - p), p);
        if (kolorun_yaml_scalar(colon + 1 + strspn(colon + 1, " "), value,
                                sizeof value) != 0) {
            kolorun_say("%s: the value of %s is not a plain, quoted or empty "
                        "scalar", where, key);
            exit(2);
        }
        if (indent == 0) {
            section[0] = '\0';
            section_indent = -1;
            if (strcmp(key, "controller") == 0) {
                if (value[0] == '\0')
                    continue;
                if (strcasecmp(value, "gloo") != 0 && strcasecmp(value, "mpi") != 0) {
                    kolorun_say("%s: controller: %s is not a controller "
                                "(gloo or mpi)", where, value);
                    exit(2);
                }
                if (!controller_given) {
                    o->gloo = strcasecmp(value, "gloo") == 0;
                    o->mpi = !o->gloo;
                }
                continue;
            }
            if (value[0] != '\0') {
                kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                            "ignored", where, key);
                continue;
            }
            snprintf(section, sizeof section, "%.63s", key);
            continue;
        }
        if (section[0] == '\0') {
            kolorun_say("%s: %s is indented, but no section is open", where, key);
            exit(2);
        }
        if (section_indent < 0)
            section_indent = indent;
        if (indent != section_indent) {
            kolorun_say("%s: kolorun reads sections one level deep; %s is "
                        "indented differently from the keys before it",
                        where, key);
            exit(2);
        }
        if (value[0] == '\0')
            continue; /* null: not set, as in horovodrun */
        {
            char full[200];
            int found = 0;
            snprintf(full, sizeof full, "%s.%s", section, key);
            for (int i = 0; i < KOLORUN_NOPTIONS && !found; i++) {
                const kolorun_option_t *k = &kolorun_options[i];
                char what[1500];
                if (!k->yaml || strcmp(k->yaml, full) != 0)
                    continue;
                found = 1;
                if (given[i])
                    break; /* the command line wins */
                snprintf(what, sizeof what, "%s: %s (%s)", where, full,
                         k->names[0].name);
                if (k->kind == KR_SWITCH || k->kind == KR_REFUSED_ON) {
                    int b = kolorun_yaml_bool(value);
                    if (b < 0) {
                        kolorun_say("%s wants true or false, not '%s'", what,
                                    value);
                        exit(2);
                    }
                    kolorun_knob_apply(o, k, b != k->yaml_inverted ? NULL : "0",
                                       what);
                } else {
                    kolorun_knob_apply(o, k, value, what);
                }
            }
            if (!found)
                kolorun_say("%s: warning: %s is not a key horovodrun reads; "
                            "ignored", where, full);
        }
    }
    fclose(f);
}
