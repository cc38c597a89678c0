/* SPDX-License-Identifier: MIT */
/* fuzz_snapshot.c — libFuzzer: any bytes through policy_import (snapshots
 * come from disk); an import that succeeds must step and export again, and
 * the export must import to an identical export. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  policy *p = NULL, *q = NULL;
  if (policy_import(data, size, &p) != GNMR_OK)
    return 0;
  uint32_t n = policy_units(p);
  if (n <= 65536) {
    double *norm = calloc(n ? n : 1, sizeof *norm);
    policy_result r;
    for (uint32_t u = 0; u < n; u++)
      norm[u] = 1.0 + u % 7;
    policy_step(p, policy_last_step(p) + 1, norm, NULL, &r);
    free(norm);
  }
  size_t len = policy_export_size(p), len2 = 0;
  uint8_t *a = malloc(len), *b = NULL;
  if (policy_export(p, a, len, &len) != GNMR_OK ||
      policy_import(a, len, &q) != GNMR_OK)
    abort(); /* an engine must import its own export */
  len2 = policy_export_size(q);
  b = malloc(len2);
  if (policy_export(q, b, len2, &len2) != GNMR_OK || len != len2 ||
      memcmp(a, b, len) != 0)
    abort();
  free(a);
  free(b);
  policy_destroy(&p);
  policy_destroy(&q);
  return 0;
}
