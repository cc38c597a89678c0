/* SPDX-License-Identifier: MIT */
/* keys.h — CURVE key files. A key pair file (written by gnmrctl keygen,
 * mode 0600) holds `public = Z85` and `secret = Z85` lines; a public file
 * only `public = Z85`; an allow list holds one public key per line,
 * optionally followed by a name, with '#' comments. Z85 keys are 40
 * characters. */
#ifndef GNMR_KEYS_H
#define GNMR_KEYS_H

#include <stddef.h>

#include "hmap.h"

#define GNMR_Z85_KEY_LEN 40

/* 1 when s is a 40-character Z85 key that decodes, else 0. */
int gnmr__key_valid(const char *s);

/* Reads a key file; pub and/or sec (41 bytes each, may be NULL) receive
 * the keys. A wanted key that is missing or malformed is GNMR_E_PARSE with
 * "PATH:LINE: ..." in err; an unreadable file GNMR_E_IO. */
int gnmr__key_file_read(const char *path, char *pub, char *sec, char *err,
                        size_t errlen);

/* Reads an allow list into allowed (Z85 key -> line number). Errors as
 * above; an empty list is an error (it would let nobody in). */
int gnmr__allow_file_read(const char *path, hmap *allowed, char *err,
                          size_t errlen);

/* Writes PREFIX.key (0600, the pair) and PREFIX.pub; refuses to overwrite.
 * Returns 0, GNMR_E_DUP (exists) or GNMR_E_IO with a message. */
int gnmr__keygen(const char *prefix, char *pub, char *err, size_t errlen);

#endif /* GNMR_KEYS_H */
