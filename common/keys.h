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

/* What an allowed key may do. An allow-list line is
 *   KEY [NAME...] [role=operator|agent] [jobs=GLOB]
 * An operator key may do anything to any job. Tenancy is on when one line
 * names a role: then an agent key (the default role) owns the jobs it
 * creates, may join and read those and the jobs whose name matches its
 * GLOB (fnmatch), and may not retune, finish or export. With no role in
 * the list, every listed key is trusted with everything (as before). */
typedef struct gnmr_grant {
  int operator;
  char *jobs; /* GLOB, or NULL */
  char *owns; /* GLOB of the names only this key may start, or NULL */
  char *name; /* NAME, or NULL */
  int line;   /* its line in the file */
} gnmr_grant;

typedef struct gnmr_allow {
  hmap keys;          /* Z85 key -> index in grants */
  gnmr_grant *grants;
  size_t n;
  int tenancy;        /* some line names a role */
} gnmr_allow;

/* Reads an allow list. Errors as above; an empty list is an error (it
 * would let nobody in), as is an unknown role or an empty GLOB. */
int gnmr__allow_load(const char *path, gnmr_allow *a, char *err,
                     size_t errlen);
void gnmr__allow_clear(gnmr_allow *a);
/* The grant of a key (Z85), or NULL when it is not listed. */
const gnmr_grant *gnmr__allow_find(const gnmr_allow *a, const char *key);
/* Whether key may act on job as its owner would: no tenancy, an operator,
 * the owner (owner NULL: a job nobody owns yet, or without CURVE), or a
 * GLOB that matches the job's name. */
int gnmr__allow_may(const gnmr_allow *a, const char *key, const char *owner,
                    const char *job);
/* The grant of another key whose owns= pattern matches job, when key is
 * no operator: a name in another tenant's reserved namespace, which only
 * that tenant may start (a squatter that started it first would own its
 * later runs). NULL otherwise. */
const gnmr_grant *gnmr__allow_reserved(const gnmr_allow *a, const char *key,
                                       const char *job);
/* Whether key is an operator (or tenancy is off). */
int gnmr__allow_operator(const gnmr_allow *a, const char *key);

/* Writes PREFIX.key (0600, the pair) and PREFIX.pub; refuses to overwrite.
 * Returns 0, GNMR_E_DUP (exists) or GNMR_E_IO with a message. */
int gnmr__keygen(const char *prefix, char *pub, char *err, size_t errlen);

#endif /* GNMR_KEYS_H */
