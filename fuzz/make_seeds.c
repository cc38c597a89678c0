/* SPDX-License-Identifier: MIT */
/* make_seeds.c — writes the binary seed inputs of the fuzzers (encoded
 * envelopes of each kind, policy snapshots) into fuzz/corpus/; run by
 * `make fuzz-seeds`, its output is kept in the repository. */
#include <stdio.h>
#include <stdlib.h>

#include "policy.h"
#include "wire.h"

static void put(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static void put_env(const char *path, Gnmr__Envelope *env) {
  uint8_t *b;
  size_t n;
  gnmr__wire_encode(env, &b, &n);
  put(path, b, n);
  free(b);
}

int main(void) {
  char *units[] = {"layer0.attn", "layer0.mlp", "expert.3"};
  uint64_t ids[] = {0, 1, 7};
  uint32_t active[] = {0, 1};
  double sumsq[] = {1.5, 0, 2.25};
  uint64_t nf[] = {0, 0, 2};
  protobuf_c_boolean nr[] = {0, 1, 0};
  policy_params prm;
  policy_params_default(&prm);
  Gnmr__Params wp;
  gnmr__params_to_wire(&prm, &wp);

  Gnmr__Envelope env = GNMR__ENVELOPE__INIT;
  Gnmr__Hello h = GNMR__HELLO__INIT;
  h.protocol = 1;
  h.job = "seed-job";
  h.rank = 1;
  h.reporters = 2;
  h.n_units = 3;
  h.units = units;
  h.n_unit_ids = 3;
  h.unit_ids = ids;
  h.params = &wp;
  h.barrier_ms = 500;
  env.body_case = GNMR__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  put_env("fuzz/corpus/envelope/hello", &env);

  Gnmr__Report r = GNMR__REPORT__INIT;
  r.job = "seed-job";
  r.rank = 1;
  r.step = 42;
  r.n_sumsq = 3;
  r.sumsq = sumsq;
  r.n_nonfinite = 3;
  r.nonfinite = nf;
  r.n_not_reported = 3;
  r.not_reported = nr;
  r.n_shadowed = 3; /* Report.shadowed: one per unit, as not_reported */
  r.shadowed = nr;
  env.body_case = GNMR__ENVELOPE__BODY_REPORT;
  env.report = &r;
  put_env("fuzz/corpus/envelope/report", &env);

  Gnmr__Decision d = GNMR__DECISION__INIT;
  d.job = "seed-job";
  d.step = 42;
  d.n_active = 2;
  d.active = active;
  env.body_case = GNMR__ENVELOPE__BODY_DECISION;
  env.decision = &d;
  put_env("fuzz/corpus/envelope/decision", &env);

  char *settings[] = {"max_active=2", "alpha=1.5"};
  Gnmr__AdminRequest ar = GNMR__ADMIN_REQUEST__INIT;
  ar.command = "set";
  ar.job = "seed-job";
  ar.n_settings = 2;
  ar.settings = settings;
  env.body_case = GNMR__ENVELOPE__BODY_ADMIN_REQUEST;
  env.admin_request = &ar;
  put_env("fuzz/corpus/envelope/admin_set", &env);

  /* a snapshot after a few steps with a spike, a NaN and an idle unit */
  policy *p;
  prm.window = 3;
  prm.warmup_steps = 0;
  policy_create(&prm, 4, &p);
  for (uint64_t t = 1; t <= 12; t++) {
    double norm[4] = {1, 2, t == 9 ? 40 : 3, t == 10 ? 0.0 / 0.0 : 0};
    policy_result res;
    policy_step(p, t, norm, NULL, &res);
  }
  size_t len = policy_export_size(p);
  uint8_t *snap = malloc(len);
  policy_export(p, snap, len, &len);
  put("fuzz/corpus/snapshot/four_units", snap, len);
  free(snap);
  policy_destroy(&p);
  return 0;
}
