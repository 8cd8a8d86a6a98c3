/*
 * cache.c — the response cache (design in cache.h). Free slots are taken
 * lowest index first and the eviction victim is the smallest last_use, so
 * both choices depend only on the sequence of calls, which is the same on
 * every rank.
 */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

int kolo__cache_init(kolo__cache_t *c, size_t capacity)
{
    memset(c, 0, sizeof(*c));
    kolo__map_init(&c->index);
    if (capacity == 0)
        return 0;
    c->entries = calloc(capacity, sizeof(*c->entries));
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

void kolo__cache_erase(kolo__cache_t *c, size_t bit)
{
    kolo__cache_entry_t *e;
    if (bit >= c->capacity || c->entries[bit].name == NULL)
        return;
    e = &c->entries[bit];
    kolo__map_dels(&c->index, e->name);
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

    *evicted = 0;
    if (c->capacity == 0)
        return -1;
    v = (uintptr_t)kolo__map_gets(&c->index, name);
    if (v != 0) {
        slot = v - 1;
        c->entries[slot].params = *params;
        c->entries[slot].last_use = ++c->clock;
        *bit = slot;
        return 0;
    }
    if (c->count < c->capacity) {
        for (slot = 0; c->entries[slot].name != NULL; slot++)
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
    copy = kolo__strdup(name);
    if (copy == NULL)
        return -1;
    if (kolo__map_puts(&c->index, copy, (void *)(slot + 1)) != 0) {
        free(copy);
        return -1;
    }
    c->entries[slot] = (kolo__cache_entry_t){copy, *params, ++c->clock};
    c->count++;
    *bit = slot;
    return 0;
}

void kolo__cache_touch(kolo__cache_t *c, size_t bit)
{
    if (bit < c->capacity && c->entries[bit].name != NULL)
        c->entries[bit].last_use = ++c->clock;
}

const kolo__cache_entry_t *kolo__cache_at(const kolo__cache_t *c, size_t bit)
{
    if (bit >= c->capacity || c->entries[bit].name == NULL)
        return NULL;
    return &c->entries[bit];
}
