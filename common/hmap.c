/* SPDX-License-Identifier: MIT */
/* hmap.c — linear probing with tombstones, FNV-1a hashes, grown at 70%
 * occupancy (tombstones included) so a probe always ends. */
#include "hmap.h"

#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"

static char tomb;
#define HMAP_TOMB (&tomb)

static uint64_t hash_bytes(const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

static hmap_slot *find(const hmap *m, const void *key, size_t len,
                       uint64_t h) {
  if (m->cap == 0)
    return NULL;
  for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    hmap_slot *s = &m->slots[i];
    if (s->key == NULL)
      return NULL;
    if (s->key != HMAP_TOMB && s->hash == h && s->len == len &&
        memcmp(s->key, key, len) == 0)
      return s;
  }
}

uint64_t hmap_hash(const void *key, size_t len) {
  return hash_bytes(key, len);
}

/* Rehashes into ncap slots (a power of two holding every live key). */
static int rehash(hmap *m, size_t ncap) {
  hmap_slot *ns = calloc(ncap, sizeof *ns);
  if (ns == NULL)
    return GNMR_E_NOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    hmap_slot *s = &m->slots[i];
    if (s->key == NULL || s->key == HMAP_TOMB)
      continue;
    size_t j = s->hash & (ncap - 1);
    while (ns[j].key != NULL)
      j = (j + 1) & (ncap - 1);
    ns[j] = *s;
  }
  free(m->slots);
  m->slots = ns;
  m->cap = ncap;
  m->used = m->live;
  return GNMR_OK;
}

static int grow(hmap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 16;
  if (m->live * 2 < m->cap) /* mostly tombstones: rehash at the same size */
    ncap = m->cap;
  return rehash(m, ncap);
}

int hmap_reserve(hmap *m, size_t n) {
  if ((m->used + n) * 10 <= m->cap * 7)
    return GNMR_OK;
  size_t want = m->live + n, ncap = 16;
  if (want > SIZE_MAX / 20)
    return GNMR_E_NOMEM;
  while (want * 10 > ncap * 7) /* below 70% with the new keys */
    ncap *= 2;
  return rehash(m, ncap);
}

int hmap_get(const hmap *m, const void *key, size_t len, uint64_t *value) {
  if (m->live == 0)
    return 0; /* a new job's units: nothing to hash for */
  hmap_slot *s = find(m, key, len, hash_bytes(key, len));
  if (s == NULL)
    return 0;
  if (value)
    *value = s->value;
  return 1;
}

static int insert(hmap *m, const void *key, size_t len, uint64_t h,
                  uint64_t value);

int hmap_put(hmap *m, const void *key, size_t len, uint64_t value) {
  uint64_t h = hash_bytes(key, len);
  hmap_slot *s = find(m, key, len, h);
  if (s != NULL) {
    s->value = value;
    return GNMR_OK;
  }
  return insert(m, key, len, h, value);
}

int hmap_add(hmap *m, const void *key, size_t len, uint64_t value) {
  return insert(m, key, len, hash_bytes(key, len), value);
}

static int insert(hmap *m, const void *key, size_t len, uint64_t h,
                  uint64_t value) {
  if ((m->used + 1) * 10 > m->cap * 7 && grow(m) != GNMR_OK)
    return GNMR_E_NOMEM;
  char *k = m->borrowed ? (char *)(uintptr_t)key : malloc(len ? len : 1);
  if (k == NULL)
    return GNMR_E_NOMEM;
  if (!m->borrowed)
    memcpy(k, key, len);
  size_t i = h & (m->cap - 1);
  while (m->slots[i].key != NULL && m->slots[i].key != HMAP_TOMB)
    i = (i + 1) & (m->cap - 1);
  if (m->slots[i].key == NULL)
    m->used++;
  m->slots[i] = (hmap_slot){k, len, h, value};
  m->live++;
  return GNMR_OK;
}

int hmap_del(hmap *m, const void *key, size_t len) {
  hmap_slot *s = find(m, key, len, hash_bytes(key, len));
  if (s == NULL)
    return 0;
  if (!m->borrowed)
    free(s->key);
  s->key = HMAP_TOMB;
  m->live--;
  return 1;
}

void hmap_clear(hmap *m) {
  int borrowed = m->borrowed;
  for (size_t i = 0; i < m->cap && !borrowed; i++)
    if (m->slots[i].key != NULL && m->slots[i].key != HMAP_TOMB)
      free(m->slots[i].key);
  free(m->slots);
  memset(m, 0, sizeof *m);
  m->borrowed = borrowed;
}

int hmap_next(const hmap *m, size_t *pos, const void **key, size_t *len,
              uint64_t *value) {
  for (; *pos < m->cap; (*pos)++) {
    const hmap_slot *s = &m->slots[*pos];
    if (s->key == NULL || s->key == HMAP_TOMB)
      continue;
    if (key)
      *key = s->key;
    if (len)
      *len = s->len;
    if (value)
      *value = s->value;
    (*pos)++;
    return 1;
  }
  return 0;
}
