/* SPDX-License-Identifier: MIT */
/* seal.c — see seal.h. The sealed bytes: "gnmr-seal-1", the job name and
 * its NUL, run (8 bytes), pass (4), step (8), the count of active ids (4)
 * and each id (4), every integer little-endian: one encoding for every
 * gnmrd, whatever its byte order, and no two field lists give the same
 * bytes (the name ends at its NUL, the ids' count comes first). */
#include "seal.h"

#include <sodium.h>
#include <string.h>

static void put_le(crypto_auth_hmacsha256_state *st, uint64_t v, int bytes) {
  unsigned char b[8];
  for (int i = 0; i < bytes; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  crypto_auth_hmacsha256_update(st, b, (unsigned long long)bytes);
}

void seal_make(const uint8_t key[SEAL_KEY_BYTES], const char *job,
               uint64_t run, uint32_t pass, uint64_t step,
               const uint32_t *active, size_t n,
               uint8_t tag[SEAL_TAG_BYTES]) {
  static const char domain[] = "gnmr-seal-1";
  crypto_auth_hmacsha256_state st;
  unsigned char mac[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_init(&st, key, SEAL_KEY_BYTES);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)domain,
                                sizeof domain - 1);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)job,
                                strlen(job) + 1);
  put_le(&st, run, 8);
  put_le(&st, pass, 4);
  put_le(&st, step, 8);
  put_le(&st, (uint64_t)n, 4);
  for (size_t i = 0; i < n; i++)
    put_le(&st, active[i], 4);
  crypto_auth_hmacsha256_final(&st, mac);
  memcpy(tag, mac, SEAL_TAG_BYTES);
  sodium_memzero(&st, sizeof st);
}

int seal_check(const uint8_t key[SEAL_KEY_BYTES], const char *job,
               uint64_t run, uint32_t pass, uint64_t step,
               const uint32_t *active, size_t n, const uint8_t *tag,
               size_t tag_len) {
  uint8_t want[SEAL_TAG_BYTES];
  if (tag == NULL || tag_len != SEAL_TAG_BYTES || n > UINT32_MAX)
    return 0;
  seal_make(key, job, run, pass, step, active, n, want);
  return sodium_memcmp(want, tag, SEAL_TAG_BYTES) == 0;
}
