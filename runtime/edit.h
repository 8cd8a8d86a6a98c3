/*
 * edit.h — how far one word is from another (Levenshtein's distance: the
 * fewest insertions, deletions and substitutions), for "did you mean"
 * suggestions: mistyped KOLO_* variables (env.c) and kolorun options
 * (tools/kolorun/options.c). Header-only, so that kolorun, which links no
 * part of the runtime, shares it.
 */
#ifndef KOLO_EDIT_H
#define KOLO_EDIT_H

#include <stddef.h>
#include <string.h>

/* 99 for words of 63 characters or more (no suggestion is made for them). */
static inline size_t kolo__edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];

    if (la >= 63 || lb >= 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof(size_t));
    }
    return prev[lb];
}

#endif /* KOLO_EDIT_H */
