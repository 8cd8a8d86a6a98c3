/*
 * cache.h — the response cache.
 *
 * After a tensor has been negotiated once, every rank remembers its name and
 * parameters under the same bit index. In later steps a rank that enqueues
 * the same name with the same parameters only sets that bit; one bitwise-AND
 * allreduce of the bit vectors tells every rank which cached tensors are
 * ready everywhere, with no names exchanged.
 *
 * The cache must stay identical on every rank. It changes only in
 * kolo__cache_put, kolo__cache_touch and kolo__cache_erase, which the
 * background thread calls in the same order on every rank (in the order of
 * the plan that all ranks execute), so the bit of a name and the choice of
 * the entry evicted when the cache is full (least recently used, by a
 * counter advanced by those same calls) agree everywhere.
 *
 * A rank that cannot store a name (no memory for its copy) must not take
 * another slot than the other ranks: the slot is taken all the same,
 * "lost" (its parameters kept, its name not), so every later put lands
 * where it lands on the others; the negotiation then erases that bit on
 * every rank (recorded nowhere). And so that a divergence, whatever its
 * cause, cannot go unnoticed, the cache keeps a digest of what it holds
 * (every slot's bit, name and parameters, and the LRU clock), which the
 * ranks compare every round (negotiate.c).
 */
#ifndef KOLO_CACHE_H
#define KOLO_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "map.h"
#include "message.h"

typedef struct kolo__cache_entry {
    char *name; /* NULL: a free slot, or a lost one */
    kolo__params_t params;
    uint64_t last_use;
    uint64_t hash; /* of the bit, the name and the parameters */
    int lost;      /* taken, but the name could not be stored */
} kolo__cache_entry_t;

typedef struct kolo__cache {
    kolo__cache_entry_t *entries;
    size_t capacity, count;
    uint64_t clock;
    uint64_t digest;   /* XOR of the taken slots' hashes */
    kolo__map_t index; /* name -> (bit + 1) */
} kolo__cache_t;

typedef enum kolo__cache_result {
    KOLO__CACHE_MISS = 0,
    KOLO__CACHE_HIT = 1,
    KOLO__CACHE_MISMATCH = 2 /* cached under this name with other params */
} kolo__cache_result_t;

int kolo__cache_init(kolo__cache_t *c, size_t capacity);
void kolo__cache_free(kolo__cache_t *c);

/* Looks the name up; on HIT and MISMATCH sets *bit. Changes nothing. */
kolo__cache_result_t kolo__cache_lookup(const kolo__cache_t *c, const char *name,
                                        const kolo__params_t *params,
                                        size_t *bit);

/* Stores name/params (replacing an entry of the same name) and returns its
 * bit. When the cache is full the least recently used entry is evicted and
 * its bit reused: *evicted is set to 1 in that case (the caller must treat
 * tensors pending on that bit as uncached). Returns 0 when stored, -1 when
 * the capacity is 0 (nothing is cached), KOLO__CACHE_LOST when memory ran
 * out: the slot *bit is taken but lost, and the caller must have it erased
 * on every rank. */
#define KOLO__CACHE_LOST 1
int kolo__cache_put(kolo__cache_t *c, const char *name,
                    const kolo__params_t *params, size_t *bit, int *evicted);

void kolo__cache_touch(kolo__cache_t *c, size_t bit);
void kolo__cache_erase(kolo__cache_t *c, size_t bit);

/* The entry at a bit, or NULL for a free slot (a lost slot's entry has no
 * name). */
const kolo__cache_entry_t *kolo__cache_at(const kolo__cache_t *c, size_t bit);

/* What the ranks compare every round: the digest of the entries and the
 * LRU clock, in one word. Equal on every rank while the caches agree. */
uint64_t kolo__cache_check(const kolo__cache_t *c);

/* The hash an entry at `bit` with this name and parameters has (the same
 * on every rank and build of one job). */
uint64_t kolo__cache_hash(size_t bit, const char *name, const kolo__params_t *p);

#endif /* KOLO_CACHE_H */
