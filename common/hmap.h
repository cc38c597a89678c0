/* SPDX-License-Identifier: MIT */
/* hmap.h — a small open-addressing hash map from byte strings to uint64
 * values (unit names -> ids, connection identities -> agents). Keys are
 * copied (or borrowed, below). Not thread-safe: one owner thread. */
#ifndef GNMR_HMAP_H
#define GNMR_HMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct hmap_slot {
  char *key;      /* NULL: empty; HMAP_TOMB: deleted */
  size_t len;
  uint64_t hash;
  uint64_t value;
} hmap_slot;

typedef struct hmap {
  hmap_slot *slots;
  size_t cap;   /* power of two, 0 before the first put */
  size_t used;  /* live + tombstones */
  size_t live;
  int borrowed; /* keys are the caller's: put stores the pointer, and del
                   and free leave the bytes alone (set before the first
                   put; the caller keeps each key alive while it is in) */
  int keyed;    /* keys a peer chose (unit names): hashed with this
                   process's random key (SipHash-1-3, hmap_hash_keyed), so
                   no peer can send keys that all fall in one probe run
                   (set before the first put); else FNV-1a, whose order
                   of iteration is the same in every process */
} hmap;

/* Returns 1 and sets *value when key is present, else 0. */
int hmap_get(const hmap *m, const void *key, size_t len, uint64_t *value);
/* Inserts or replaces; 0 or GNMR_E_NOMEM. */
int hmap_put(hmap *m, const void *key, size_t len, uint64_t value);
/* Inserts a key the caller knows is absent (one probe, not two); 0 or
 * GNMR_E_NOMEM. */
int hmap_add(hmap *m, const void *key, size_t len, uint64_t value);
/* Makes room for n more keys without growing while they are put (one
 * rehash now, not one per doubling); 0 or GNMR_E_NOMEM. */
int hmap_reserve(hmap *m, size_t n);
/* The hash an hmap uses for key (for callers' own tables of borrowed
 * keys): FNV-1a, and SipHash-1-3 under a key drawn once per process from
 * getrandom() for keys a peer chose (a multicollision of FNV-1a's low
 * bits takes a few thousand tries a pair of blocks: 2^16 names that share
 * one probe run cost 2^31 probes). */
uint64_t hmap_hash(const void *key, size_t len);
uint64_t hmap_hash_keyed(const void *key, size_t len);
/* SipHash-c-d of key under (k0, k1), for tests against its reference. */
uint64_t hmap__siphash(uint64_t k0, uint64_t k1, int c, int d,
                       const void *key, size_t len);
/* Removes key if present; returns 1 when it was. */
int hmap_del(hmap *m, const void *key, size_t len);
void hmap_clear(hmap *m);
/* Iteration: start with *pos = 0; returns 1 with the next live entry (key
 * and len may be NULL), 0 at the end. The map must not change meanwhile. */
int hmap_next(const hmap *m, size_t *pos, const void **key, size_t *len,
              uint64_t *value);

#endif /* GNMR_HMAP_H */
