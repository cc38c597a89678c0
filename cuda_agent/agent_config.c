/* SPDX-License-Identifier: MIT */
/* agent_config.c — the agent's configuration: defaults, checks, and the
 * GNMR_* environment variables (the policy's from the parameter table). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_priv.h"
#include "ipc.h"
#include "keys.h"
#include "num.h"
#include "text.h"
#include "validate.h"

void gnmr_params_default(gnmr_params *p) {
  policy_params d;
  policy_params_default(&d);
  policy_params_to_public(&d, p);
}

uint64_t gnmr__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int gnmr_endpoint_check(const char *endpoints, char *why, size_t cap) {
  char buf[700];
  int rv = gnmr__endpoint_check(endpoints, 0, buf, sizeof buf);
  if (rv == GNMR_OK &&
      gnmr__ipc_dir_check_peer(endpoints, buf, sizeof buf) == GNMR_E_INVAL)
    rv = GNMR_E_DENIED; /* another user's socket directory, say */
  if (why != NULL && cap > 0)
    snprintf(why, cap, "%s", rv == GNMR_OK ? "" : buf);
  return rv;
}

int gnmr__agent_check_config(const gnmr_agent_config *c) {
  policy_params p;
  int erv = c != NULL ? gnmr_endpoint_check(c->endpoint, NULL, 0) : GNMR_OK;
  if (erv == GNMR_E_DENIED)
    return erv; /* a socket directory another user could serve from */
  if (c == NULL || erv != GNMR_OK ||
      !gnmr__printable(c->job, GNMR_MAX_JOB_NAME) || c->reporters == 0 ||
      c->rank >= c->reporters || c->n_units == 0 || c->unit_names == NULL ||
      c->fallback_route > GNMR_ROUTE_HIGH || c->barrier_ms > 600000 ||
      c->observer > 1 || c->start > GNMR_START_RESUME ||
      c->node_ranks > 4096)
    return GNMR_E_INVAL;
  for (uint32_t i = 0; i < c->n_units; i++)
    if (!gnmr__printable(c->unit_names[i], GNMR_MAX_UNIT_NAME))
      return GNMR_E_INVAL;
  int keys = (c->curve_server_key != NULL) + (c->curve_public_key != NULL) +
             (c->curve_secret_key != NULL);
  if (keys != 0 && (keys != 3 || !gnmr__key_valid(c->curve_server_key) ||
                    !gnmr__key_valid(c->curve_public_key) ||
                    !gnmr__key_valid(c->curve_secret_key)))
    return GNMR_E_INVAL;
  policy_params_from_public(&c->params, &p);
  return policy_params_validate(&p, NULL);
}

/* Frees the copied configuration and the route bitmap (any part of it
 * may be missing: an open that ran out of memory). */
void gnmr__agent_free_config(gnmr_agent *a) {
  for (uint32_t i = 0; a->names != NULL && i < a->n_units; i++)
    free(a->names[i]);
  free(a->names);
  free(a->req_ids);
  free(a->routes);
  free(a->risky_units);
  free(a->risky_gds);
  free(a->bounds);
  free(a->endpoint);
  free(a->job);
}

int gnmr_agent_config_from_env(gnmr_agent_config *cfg, const char **bad_var) {
  static const struct {
    const char *var;
    size_t off;
    int kind; /* 0 string, 1 u32, 2 u64, 3 double, 4 route */
  } vars[] = {
      {"GNMR_ENDPOINT", offsetof(gnmr_agent_config, endpoint), 0},
      {"GNMR_JOB", offsetof(gnmr_agent_config, job), 0},
      {"GNMR_RANK", offsetof(gnmr_agent_config, rank), 1},
      {"GNMR_REPORTERS", offsetof(gnmr_agent_config, reporters), 1},
      {"GNMR_BARRIER_MS", offsetof(gnmr_agent_config, barrier_ms), 1},
      {"GNMR_FALLBACK_ROUTE", offsetof(gnmr_agent_config, fallback_route), 4},
      {"GNMR_FALLBACK_AFTER", offsetof(gnmr_agent_config, fallback_after), 1},
#define ENV_KIND_THRESHOLD 3
#define ENV_KIND_WINDOW 1
#define ENV_KIND_U32 1
#define ENV_KIND_U64 2
#define ENV_KIND_FLAG 1
#define ENV_KIND_SIGNAL 5
#define GNMR__PARAM_ENV(name, ctype, kind, opt, env, def, inh)               \
  {env, offsetof(gnmr_agent_config, params.name), ENV_KIND_##kind},
      GNMR_PARAMS_MAP(GNMR__PARAM_ENV)
#undef GNMR__PARAM_ENV
      {"GNMR_OBSERVER", offsetof(gnmr_agent_config, observer), 1},
      {"GNMR_NODE_RANKS", offsetof(gnmr_agent_config, node_ranks), 1},
      {"GNMR_CURVE_SERVER_KEY", offsetof(gnmr_agent_config, curve_server_key),
       0},
      {"GNMR_CURVE_PUBLIC_KEY", offsetof(gnmr_agent_config, curve_public_key),
       0},
      {"GNMR_CURVE_SECRET_KEY", offsetof(gnmr_agent_config, curve_secret_key),
       0},
  };
  gnmr_agent_config c;
  if (cfg == NULL)
    return GNMR_E_INVAL;
  c = *cfg;
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i].var);
    char *field = (char *)&c + vars[i].off;
    uint64_t u;
    double dv;
    int ok = 1;
    if (v == NULL)
      continue;
    switch (vars[i].kind) {
    case 0:
      memcpy(field, &v, sizeof v);
      break;
    case 1:
      ok = gnmr__parse_u64(v, UINT32_MAX, &u) == 0;
      if (ok) {
        uint32_t u32 = (uint32_t)u;
        memcpy(field, &u32, sizeof u32);
      }
      break;
    case 2:
      ok = gnmr__parse_u64(v, UINT64_MAX, &u) == 0;
      if (ok)
        memcpy(field, &u, sizeof u);
      break;
    case 3:
    case 5: /* a threshold (> 0), a signal's (>= 0, 0: off) */
      ok = gnmr__parse_double(v, 0, &dv) == 0 &&
           (vars[i].kind == 5 ? dv >= 0 : dv > 0);
      if (ok)
        memcpy(field, &dv, sizeof dv);
      break;
    default: {
      uint32_t route = strcmp(v, "high") == 0  ? GNMR_ROUTE_HIGH
                       : strcmp(v, "low") == 0 ? GNMR_ROUTE_LOW
                                               : UINT32_MAX;
      ok = route != UINT32_MAX;
      if (ok)
        memcpy(field, &route, sizeof route);
    }
    }
    if (!ok) {
      if (bad_var != NULL)
        *bad_var = vars[i].var;
      return GNMR_E_INVAL;
    }
  }
  /* not a field: how long gnmr_agent_wait spins; checked here so that a
   * bad value is an error where the environment is read */
  if (gnmr__wait_spin_env() < 0) {
    if (bad_var != NULL)
      *bad_var = "GNMR_WAIT_SPIN_US";
    return GNMR_E_INVAL;
  }
  *cfg = c;
  if (bad_var != NULL)
    *bad_var = NULL;
  return GNMR_OK;
}

int64_t gnmr__wait_spin_env(void) {
  const char *v = getenv("GNMR_WAIT_SPIN_US");
  uint64_t u;
  if (v == NULL)
    return WAIT_SPIN_US;
  if (gnmr__parse_u64(v, WAIT_SPIN_MAX_US, &u) != 0)
    return -1;
  return (int64_t)u;
}

