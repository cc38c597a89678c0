/* SPDX-License-Identifier: MIT */
/* fuzz_settings.c — libFuzzer: `gnmrctl set` settings (key=value, one per
 * line) through the parser gnmrd uses; accepted settings must be valid
 * policy parameters. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1), *settings[64];
  size_t n = 0;
  char err[256];
  memcpy(text, data, size);
  text[size] = '\0';
  for (char *save = NULL, *tok = strtok_r(text, "\n", &save);
       tok != NULL && n < 64; tok = strtok_r(NULL, "\n", &save))
    settings[n++] = tok;
  policy_params p;
  policy_params_default(&p);
  if (gnmr__policy_settings_apply(&p, settings, n, err, sizeof err) == 0 &&
      policy_params_validate(&p, NULL) != GNMR_OK)
    abort(); /* the parser let an invalid parameter set through */
  free(text);
  return 0;
}
