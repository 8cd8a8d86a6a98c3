/*
 * map.c — open-addressing hash map. The table grows to keep live keys and
 * tombstones under 70% of the slots, so a probe always ends at an empty
 * slot. FNV-1a hashes the key bytes; the full hash is kept per slot so a
 * probe compares key bytes only when hashes match.
 */
#include "alloc.h"
#include "map.h"

#include <stdlib.h>
#include <string.h>

static char tombstone;
#define TOMB ((void *)&tombstone)

static uint64_t hash_bytes(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

void kolo__map_init(kolo__map_t *m) { memset(m, 0, sizeof(*m)); }

void kolo__map_free(kolo__map_t *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key != NULL && m->slots[i].key != TOMB)
            free(m->slots[i].key);
    free(m->slots);
    kolo__map_init(m);
}

/* Index of the slot holding the key, or of the first free slot (a tombstone
 * seen on the way, else the empty slot that ended the probe). */
static size_t probe(const kolo__map_t *m, const void *key, size_t len,
                    uint64_t h, int *found)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask, first_free = SIZE_MAX;

    for (;;) {
        const kolo__map_slot_t *s = &m->slots[i];
        if (s->key == NULL) {
            *found = 0;
            return first_free != SIZE_MAX ? first_free : i;
        }
        if (s->key == TOMB) {
            if (first_free == SIZE_MAX)
                first_free = i;
        } else if (s->hash == h && s->key_len == len &&
                   memcmp(s->key, key, len) == 0) {
            *found = 1;
            return i;
        }
        i = (i + 1) & mask;
    }
}

static int grow(kolo__map_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    kolo__map_slot_t *old = m->slots;
    size_t ocap = m->cap;

    /* Rehashing into the same size only drops tombstones. */
    if (m->count * 2 < m->cap)
        ncap = m->cap;
    m->slots = kolo__calloc(ncap, sizeof(*m->slots));
    if (m->slots == NULL) {
        m->slots = old;
        return -1;
    }
    m->cap = ncap;
    m->used = m->count;
    for (size_t i = 0; i < ocap; i++) {
        kolo__map_slot_t *s = &old[i];
        int found;
        if (s->key == NULL || s->key == TOMB)
            continue;
        m->slots[probe(m, s->key, s->key_len, s->hash, &found)] = *s;
    }
    free(old);
    return 0;
}

void *kolo__map_get(const kolo__map_t *m, const void *key, size_t len)
{
    int found;
    size_t i;

    if (m->count == 0)
        return NULL;
    i = probe(m, key, len, hash_bytes(key, len), &found);
    return found ? m->slots[i].value : NULL;
}

int kolo__map_put(kolo__map_t *m, const void *key, size_t len, void *value)
{
    uint64_t h = hash_bytes(key, len);
    int found;
    size_t i;
    void *copy;

    if ((m->used + 1) * 10 >= m->cap * 7 && grow(m) != 0)
        return -1;
    i = probe(m, key, len, h, &found);
    if (found) {
        m->slots[i].value = value;
        return 0;
    }
    copy = kolo__malloc(len ? len : 1);
    if (copy == NULL)
        return -1;
    memcpy(copy, key, len);
    if (m->slots[i].key == NULL)
        m->used++;
    m->slots[i] = (kolo__map_slot_t){copy, len, h, value};
    m->count++;
    return 0;
}

void *kolo__map_del(kolo__map_t *m, const void *key, size_t len)
{
    int found;
    size_t i;
    void *value;

    if (m->count == 0)
        return NULL;
    i = probe(m, key, len, hash_bytes(key, len), &found);
    if (!found)
        return NULL;
    value = m->slots[i].value;
    free(m->slots[i].key);
    m->slots[i].key = TOMB;
    m->slots[i].value = NULL;
    m->count--;
    return value;
}

void *kolo__map_gets(const kolo__map_t *m, const char *key)
{
    return kolo__map_get(m, key, strlen(key));
}

int kolo__map_puts(kolo__map_t *m, const char *key, void *value)
{
    return kolo__map_put(m, key, strlen(key), value);
}

void *kolo__map_dels(kolo__map_t *m, const char *key)
{
    return kolo__map_del(m, key, strlen(key));
}

int kolo__map_next(const kolo__map_t *m, size_t *iter, const void **key,
                   void **value)
{
    while (*iter < m->cap) {
        const kolo__map_slot_t *s = &m->slots[(*iter)++];
        if (s->key != NULL && s->key != TOMB) {
            if (key)
                *key = s->key;
            if (value)
                *value = s->value;
            return 1;
        }
    }
    return 0;
}
