/* SPDX-License-Identifier: MIT */
/* fuzz_trace.c — libFuzzer: any bytes through the trace parser; small
 * traces that parse are replayed through the policy as gnmrctl does. */
#include <stdint.h>
#include <stdio.h>

#include "replay.h"
#include "trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *sink;
  trace t;
  trace_error err;
  if (sink == NULL && (sink = fopen("/dev/null", "w")) == NULL)
    return 0;
  if (trace_parse((const char *)data, size, &t, &err) != 0)
    return 0;
  if (t.n_units <= 4096 && t.last_step - t.first_step < 4096) {
    policy_params p;
    policy_params_default(&p);
    p.warmup_steps = 0;
    gnmr__replay(&t, &p, NULL, sink, sink);
  }
  trace_clear(&t);
  return 0;
}
