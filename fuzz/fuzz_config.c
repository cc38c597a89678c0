/* SPDX-License-Identifier: MIT */
/* fuzz_config.c — libFuzzer: any text through gnmrd's config reader
 * (libinih and the key table); an accepted file must leave valid policy
 * defaults. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gnmr/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1), err[512];
  memcpy(text, data, size);
  text[size] = '\0';
  gnmrd_config c;
  config_defaults(&c);
  if (config_load_string(text, "fuzz", &c, err, sizeof err) == GNMR_OK &&
      policy_params_validate(&c.policy, NULL) != GNMR_OK)
    abort(); /* the reader let invalid policy defaults through */
  free(text);
  return 0;
}
