/*
 * cache.c — the response cache (design in cache.h). Free slots are taken
 * lowest index first and the eviction victim is the smallest last_use, so
 * both choices depend only on the sequence of calls, which is the same on
 * every rank.
 */
#include "alloc.h"
#include "cache.h"

#include <stdlib.h>
#include <string.h>

int kolo__cache_init(kolo__cache_t *c, size_t capacity)
{
    memset(c, 0, sizeof(*c));
    kolo__map_init(&c->index);
    if (capacity == 0)
        return 0;
    c->entries = kolo__calloc(capacity, sizeof(*c->entries));
    if (c->entries == NULL)
        return -1;
    c->capacity = capacity;
    return 0;
}

void kolo__cache_free(kolo__cache_t *c)
{
    for (size_t i = 0; i < c->capacity; i++)
        free(c->entries[i].name);
    free(c->entries);
    kolo__map_free(&c->index);
    memset(c, 0, sizeof(*c));
}

kolo__cache_result_t kolo__cache_lookup(const kolo__cache_t *c, const char *name,
                                        const kolo__params_t *params,
                                        size_t *bit)
{
    uintptr_t v = (uintptr_t)kolo__map_gets(&c->index, name);
    if (v == 0)
        return KOLO__CACHE_MISS;
    *bit = v - 1;
    return kolo__params_equal(&c->entries[v - 1].params, params)
               ? KOLO__CACHE_HIT
               : KOLO__CACHE_MISMATCH;
}

/* FNV-1a, 64 bits, over `n` bytes, continuing from h. */
static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const uint8_t *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

#define FNV(h, x) fnv((h), &(x), sizeof(x))

uint64_t kolo__cache_hash(size_t bit, const char *name, const kolo__params_t *p)
{
    uint64_t h = 0xcbf29ce484222325ULL, b = bit;
    int64_t count = p->count;
    int32_t root = p->root;
    uint16_t group = p->group;

    /* Field by field, as kolo__params_equal compares them: the struct's
     * padding holds anything. */
    h = FNV(h, b);
    h = fnv(h, name, strlen(name) + 1);
    h = FNV(h, p->coll);
    h = FNV(h, p->dtype);
    h = FNV(h, p->op);
    h = FNV(h, count);
    h = FNV(h, p->wire);
    h = FNV(h, p->ndim);
    h = FNV(h, p->device_type);
    h = FNV(h, group);
    h = FNV(h, root);
    h = FNV(h, p->prescale);
    h = FNV(h, p->postscale);
    for (int i = 0; i < p->ndim && i < KOLO_MAX_DIMS; i++)
        h = FNV(h, p->shape[i]);
    return fnv(h, p->group_key, strnlen(p->group_key, sizeof(p->group_key)));
}

uint64_t kolo__cache_check(const kolo__cache_t *c)
{
    /* (the clock spread over the word, so that it cannot cancel a hash) */
    return c->digest ^ (c->clock * 0x9e3779b97f4a7c15ULL);
}

void kolo__cache_erase(kolo__cache_t *c, size_t bit)
{
    kolo__cache_entry_t *e;
    if (bit >= c->capacity || (c->entries[bit].name == NULL && !c->entries[bit].lost))
        return;
    e = &c->entries[bit];
    if (e->name != NULL)
        kolo__map_dels(&c->index, e->name);
    c->digest ^= e->hash;
    free(e->name);
    memset(e, 0, sizeof(*e));
    c->count--;
}

int kolo__cache_put(kolo__cache_t *c, const char *name,
                    const kolo__params_t *params, size_t *bit, int *evicted)
{
    uintptr_t v;
    size_t slot = SIZE_MAX;
    char *copy;
    kolo__cache_entry_t *e;

    *evicted = 0;
    if (c->capacity == 0)
        return -1;
    v = (uintptr_t)kolo__map_gets(&c->index, name);
    if (v != 0) {
        slot = v - 1;
        e = &c->entries[slot];
        c->digest ^= e->hash;
        e->params = *params;
        e->hash = kolo__cache_hash(slot, name, params);
        c->digest ^= e->hash;
        e->last_use = ++c->clock;
        *bit = slot;
        return 0;
    }
    if (c->count < c->capacity) {
        for (slot = 0; c->entries[slot].name != NULL || c->entries[slot].lost; slot++)
            ;
    } else {
        uint64_t oldest = UINT64_MAX;
        for (size_t i = 0; i < c->capacity; i++)
            if (c->entries[i].last_use < oldest) {
                oldest = c->entries[i].last_use;
                slot = i;
            }
        kolo__cache_erase(c, slot);
        *evicted = 1;
    }
    e = &c->entries[slot];
    *e = (kolo__cache_entry_t){NULL, *params, ++c->clock,
                               kolo__cache_hash(slot, name, params), 0};
    c->digest ^= e->hash;
    c->count++;
    *bit = slot;
    copy = kolo__strdup(name);
    if (copy != NULL && kolo__map_puts(&c->index, copy, (void *)(slot + 1)) != 0) {
        free(copy);
        copy = NULL;
    }
    if (copy == NULL) {
        /* Taken all the same, so that the next put lands where it lands on
         * the other ranks (see cache.h). */
        e->lost = 1;
        return KOLO__CACHE_LOST;
    }
    e->name = copy;
    return 0;
}

void kolo__cache_touch(kolo__cache_t *c, size_t bit)
{
    if (bit < c->capacity && (c->entries[bit].name != NULL || c->entries[bit].lost))
        c->entries[bit].last_use = ++c->clock;
}

const kolo__cache_entry_t *kolo__cache_at(const kolo__cache_t *c, size_t bit)
{
    if (bit >= c->capacity || (c->entries[bit].name == NULL && !c->entries[bit].lost))
        return NULL;
    return &c->entries[bit];
}
