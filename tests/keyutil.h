/* SPDX-License-Identifier: MIT */
/* keyutil.h — CURVE key pairs for the tests, made by `gnmrctl keygen` as
 * an operator makes them. */
#ifndef GNMR_KEYUTIL_H
#define GNMR_KEYUTIL_H

#include "keys.h"
#include "testutil.h"

typedef struct keypair {
  char pub[41], sec[41], path[160];
} keypair;

/* DIR/NAME.key and .pub by gnmrctl keygen, read back; it printed the
 * public key. */
static inline keypair keygen(const char *dir, const char *name) {
  keypair k;
  char prefix[140];
  snprintf(prefix, sizeof prefix, "%s/%s", dir, name);
  char *argv[] = {"gnmrctl", "keygen", prefix, NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_msg(r.code == 0, "keygen: %s", r.err);
  snprintf(k.path, sizeof k.path, "%s.key", prefix);
  char err[256];
  ck_assert_int_eq(gnmr__key_file_read(k.path, k.pub, k.sec, err, sizeof err),
                   GNMR_OK);
  ck_assert(strncmp(r.out, k.pub, 40) == 0); /* it printed the public key */
  tu_run_free(&r);
  return k;
}

#endif /* GNMR_KEYUTIL_H */
