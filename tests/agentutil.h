/* SPDX-License-Identifier: MIT */
/* agentutil.h — what the tests that open agents against a real gnmrd
 * share: a configuration with the common defaults, and opening an agent
 * that has joined. */
#ifndef GNMR_AGENTUTIL_H
#define GNMR_AGENTUTIL_H

#include "gnmr/agent.h"
#include "testutil.h"

/* One reporter, the spec's first default parameters (alpha = beta = 2, the
 * optional rules off: what these tests' spikes are sized for; the
 * defaults in force are quieter, docs/policy.md); callers adjust the
 * rest. */
static inline gnmr_agent_config tu_agent_config(const char *endpoint,
                                                const char *job,
                                                const char **names,
                                                uint32_t n_units) {
  gnmr_agent_config c = {0};
  c.endpoint = endpoint;
  c.job = job;
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = n_units;
  gnmr_params_default(&c.params);
  c.params.alpha = c.params.beta = 2;
  c.params.mean_horizon = 0;
  c.params.job_relative = 0;
  c.params.confirm_steps = 0;
  return c;
}

/* Opens an agent and waits up to 5 s for gnmrd's Welcome. */
static inline gnmr_agent *tu_agent_open_joined(const gnmr_agent_config *c) {
  gnmr_agent *a = NULL;
  ck_assert_int_eq(gnmr_agent_open(c, &a), GNMR_OK);
  for (int i = 0; i < 500 && !gnmr_agent_joined(a); i++)
    tu_sleep_ms(10);
  ck_assert_msg(gnmr_agent_joined(a), "agent of job %s did not join", c->job);
  return a;
}

#endif /* GNMR_AGENTUTIL_H */
