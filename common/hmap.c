/* SPDX-License-Identifier: MIT */
/* hmap.c — linear probing with tombstones, FNV-1a hashes (SipHash-1-3
 * under a per-process random key for keys a peer chose), grown at 70%
 * occupancy (tombstones included) so a probe always ends. */
#include "hmap.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

/* ---- SipHash-1-3 (Aumasson and Bernstein), a 128-bit key per process -- */
static uint64_t sip_k0, sip_k1;
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static void sip_key_init(void) {
  uint64_t k[2] = {0, 0};
  size_t got = 0;
  while (got < sizeof k) {
    ssize_t n = getrandom((char *)k + got, sizeof k - got, 0);
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  if (got < sizeof k) { /* no getrandom (an old kernel): the device */
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      got = read(fd, k, sizeof k) == (ssize_t)sizeof k ? sizeof k : 0;
      close(fd);
    }
  }
  if (got < sizeof k) { /* neither: unpredictable enough to spread keys */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    k[0] ^= (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    k[1] ^= (uint64_t)ts.tv_sec * 0xc2b2ae3d27d4eb4full ^ (uintptr_t)&got;
  }
  sip_k0 = k[0];
  sip_k1 = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                               \
  do {                                                                         \
    v0 += v1;                                                                  \
    v1 = ROTL(v1, 13);                                                         \
    v1 ^= v0;                                                                  \
    v0 = ROTL(v0, 32);                                                         \
    v2 += v3;                                                                  \
    v3 = ROTL(v3, 16);                                                         \
    v3 ^= v2;                                                                  \
    v0 += v3;                                                                  \
    v3 = ROTL(v3, 21);                                                         \
    v3 ^= v0;                                                                  \
    v2 += v1;                                                                  \
    v1 = ROTL(v1, 17);                                                         \
    v1 ^= v2;                                                                  \
    v2 = ROTL(v2, 32);                                                         \
  } while (0)

uint64_t hmap__siphash(uint64_t k0, uint64_t k1, int c, int d,
                       const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1,
           v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
  size_t full = len & ~(size_t)7;
  for (size_t i = 0; i < full; i += 8) {
    uint64_t m = 0;
    for (int k = 0; k < 8; k++) /* little-endian words, on any host */
      m |= (uint64_t)p[i + (size_t)k] << (8 * k);
    v3 ^= m;
    for (int r = 0; r < c; r++)
      SIPROUND;
    v0 ^= m;
  }
  uint64_t b = (uint64_t)len << 56;
  for (size_t i = 0; i < (len & 7); i++)
    b |= (uint64_t)p[full + i] << (8 * i);
  v3 ^= b;
  for (int r = 0; r < c; r++)
    SIPROUND;
  v0 ^= b;
  v2 ^= 0xff;
  for (int r = 0; r < d; r++)
    SIPROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}

uint64_t hmap_hash_keyed(const void *key, size_t len) {
  pthread_once(&sip_once, sip_key_init);
  return hmap__siphash(sip_k0, sip_k1, 1, 3, key, len);
}

static uint64_t hash_of(const hmap *m, const void *key, size_t len) {
  return m->keyed ? hmap_hash_keyed(key, len) : hash_bytes(key, len);
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
  hmap_slot *s = find(m, key, len, hash_of(m, key, len));
  if (s == NULL)
    return 0;
  if (value)
    *value = s->value;
  return 1;
}

static int insert(hmap *m, const void *key, size_t len, uint64_t h,
                  uint64_t value);

int hmap_put(hmap *m, const void *key, size_t len, uint64_t value) {
  uint64_t h = hash_of(m, key, len);
  hmap_slot *s = find(m, key, len, h);
  if (s != NULL) {
    s->value = value;
    return GNMR_OK;
  }
  return insert(m, key, len, h, value);
}

int hmap_add(hmap *m, const void *key, size_t len, uint64_t value) {
  return insert(m, key, len, hash_of(m, key, len), value);
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
  hmap_slot *s = find(m, key, len, hash_of(m, key, len));
  if (s == NULL)
    return 0;
  if (!m->borrowed)
    free(s->key);
  s->key = HMAP_TOMB;
  m->live--;
  return 1;
}

void hmap_clear(hmap *m) {
  int borrowed = m->borrowed, keyed = m->keyed;
  for (size_t i = 0; i < m->cap && !borrowed; i++)
    if (m->slots[i].key != NULL && m->slots[i].key != HMAP_TOMB)
      free(m->slots[i].key);
  free(m->slots);
  memset(m, 0, sizeof *m);
  m->borrowed = borrowed;
  m->keyed = keyed;
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
