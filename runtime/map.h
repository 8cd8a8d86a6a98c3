/*
 * map.h — a hash map from byte strings to pointers (open addressing,
 * linear probing, tombstones). Used for tensor names, handles (the 8 bytes
 * of the id) and the response cache. Keys are copied; values are not owned.
 * Not thread-safe: each user holds its own lock.
 */
#ifndef KOLO_MAP_H
#define KOLO_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kolo__map_slot {
    void *key; /* NULL: empty; &kolo__map_tombstone: deleted */
    size_t key_len;
    uint64_t hash;
    void *value;
} kolo__map_slot_t;

typedef struct kolo__map {
    kolo__map_slot_t *slots;
    size_t cap;   /* power of two, or 0 before the first insert */
    size_t count; /* live keys */
    size_t used;  /* live keys + tombstones */
} kolo__map_t;

void kolo__map_init(kolo__map_t *m);
void kolo__map_free(kolo__map_t *m);

/* Value for the key, or NULL. */
void *kolo__map_get(const kolo__map_t *m, const void *key, size_t len);
/* Inserts or replaces; returns 0, or -1 when out of memory. */
int kolo__map_put(kolo__map_t *m, const void *key, size_t len, void *value);
/* Removes the key; returns its value, or NULL if absent. */
void *kolo__map_del(kolo__map_t *m, const void *key, size_t len);

/* Shorthands for NUL-terminated strings. */
void *kolo__map_gets(const kolo__map_t *m, const char *key);
int kolo__map_puts(kolo__map_t *m, const char *key, void *value);
void *kolo__map_dels(kolo__map_t *m, const char *key);

/* Iteration: for (size_t i = 0; kolo__map_next(m, &i, &k, &v); ) ... */
int kolo__map_next(const kolo__map_t *m, size_t *iter, const void **key,
                   void **value);

#endif /* KOLO_MAP_H */
