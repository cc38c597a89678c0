/* SPDX-License-Identifier: MIT */
/* seal.h — gnmrd's seal on the decisions it sends (Decision.tag), so that
 * a decision handed back in Hello.held is taken only when gnmrd made it.
 * The seal is HMAC-SHA-256 (libsodium) under a 32-byte key kept in the
 * store (meta 'held_key'): a restarted gnmrd, or a standby on the same
 * PostgreSQL database, checks what an earlier one sealed. It covers the
 * job's name, its run, pass, step and active set, the fields a held
 * decision changes the job by; the scores it does not (agents drop them).
 * docs/reliability.md, "Held decisions". */
#ifndef GNMR_SEAL_H
#define GNMR_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define SEAL_KEY_BYTES 32
#define SEAL_TAG_BYTES 16 /* HMAC-SHA-256 cut to 128 bits */

/* Seals (job, run, pass, step, active[0..n)) under key into tag. */
void seal_make(const uint8_t key[SEAL_KEY_BYTES], const char *job,
               uint64_t run, uint32_t pass, uint64_t step,
               const uint32_t *active, size_t n,
               uint8_t tag[SEAL_TAG_BYTES]);

/* 1 when tag (tag_len bytes, from a peer) is the seal of those fields;
 * compared in constant time. */
int seal_check(const uint8_t key[SEAL_KEY_BYTES], const char *job,
               uint64_t run, uint32_t pass, uint64_t step,
               const uint32_t *active, size_t n, const uint8_t *tag,
               size_t tag_len);

#endif /* GNMR_SEAL_H */
