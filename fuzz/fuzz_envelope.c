/* SPDX-License-Identifier: MIT */
/* fuzz_envelope.c — libFuzzer: any bytes through the envelope decoder and,
 * when they decode, through the validation gnmrd applies before touching
 * its state (Hello, Report, admin settings); a decoded envelope must
 * re-encode and decode again. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "params.h"
#include "validate.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Gnmr__Envelope *env;
  char msg[256];
  const char *ref;
  uint32_t pv;
  uint64_t ps;
  int peeked = gnmr__wire_peek(data, size, &pv, &ps); /* any bytes */
  if (gnmr__wire_decode(data, size, &env, msg, sizeof msg) != GNMR_OK)
    return 0;
  /* what the peek takes for a Report (refused unread from a peer that
   * never joined) decodes as one, with the step the refusal names */
  if (peeked == GNMR__ENVELOPE__BODY_REPORT &&
      (env->body_case != GNMR__ENVELOPE__BODY_REPORT ||
       ps != env->report->step))
    abort();
  switch (env->body_case) {
  case GNMR__ENVELOPE__BODY_HELLO: {
    policy_params p;
    uint32_t barrier;
    policy_params defaults;
    policy_params_default(&defaults);
    gnmr__validate_hello(env->hello, &defaults, 2000, &p, &barrier, &ref, msg,
                         sizeof msg);
    break;
  }
  case GNMR__ENVELOPE__BODY_REPORT:
    gnmr__validate_report(env->report, (uint32_t)env->report->n_sumsq, &ref,
                          msg, sizeof msg);
    gnmr__validate_report(env->report, 3, &ref, msg, sizeof msg);
    break;
  case GNMR__ENVELOPE__BODY_ADMIN_REQUEST: {
    policy_params p;
    policy_params_default(&p);
    gnmr__policy_settings_apply(&p, env->admin_request->settings,
                                env->admin_request->n_settings, msg,
                                sizeof msg);
    break;
  }
  default:
    break;
  }
  uint8_t *buf;
  size_t len;
  if (gnmr__wire_encode(env, &buf, &len) == GNMR_OK) {
    Gnmr__Envelope *again;
    if (gnmr__wire_decode(buf, len, &again, NULL, 0) != GNMR_OK)
      abort(); /* what we encode we must be able to decode */
    gnmr__wire_free(&again);
    free(buf);
  }
  gnmr__wire_free(&env);
  return 0;
}
