/* SPDX-License-Identifier: MIT */
/* validate.c — see validate.h. Every refusal names the field (ref) and
 * says what is wrong in words a user can act on. */
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"
#include "hmap.h"
#include "text.h"
#include "wire.h"

#define FAIL(code, field, ...)                   \
  do {                                           \
    *ref = (field);                              \
    snprintf(msg, msglen, __VA_ARGS__);          \
    return (code);                               \
  } while (0)

/* The Hello's unit names: each a valid name, none twice. The table
 * borrows the Hello's strings (no copy a name: a 2^20-unit Hello is
 * checked in one allocation), open addressing at most half full. */
static int names_check(const Gnmr__Hello *h, const char **ref, char *msg,
                       size_t msglen) {
  typedef struct {
    uint64_t hash;
    const char *name;
    size_t len;
  } seen_slot;
  char why[96];
  size_t cap = 16;
  while (cap < 2 * h->n_units)
    cap *= 2;
  seen_slot *seen = calloc(cap, sizeof *seen);
  if (seen == NULL)
    FAIL(GNMR_E_NOMEM, "units", "out of memory");
  int rv = GNMR_OK;
  for (size_t i = 0; i < h->n_units && rv == GNMR_OK; i++) {
    const char *u = h->units[i];
    if (!gnmr__name_check(u, GNMR_MAX_UNIT_NAME, why, sizeof why)) {
      *ref = "units";
      snprintf(msg, msglen, "unit %zu: name %s (1..%u bytes of UTF-8 without "
               "control or format characters)", i, why, GNMR_MAX_UNIT_NAME);
      rv = GNMR_E_INVAL;
      break;
    }
    size_t len = strlen(u);
    uint64_t hv = hmap_hash_keyed(u, len); /* a peer chose the names */
    size_t k = hv & (cap - 1);
    for (; seen[k].name != NULL; k = (k + 1) & (cap - 1))
      if (seen[k].hash == hv && seen[k].len == len &&
          memcmp(seen[k].name, u, len) == 0) {
        *ref = "units";
        snprintf(msg, msglen, "unit name '%.64s' listed twice", u);
        rv = GNMR_E_DUP;
        break;
      }
    seen[k] = (seen_slot){hv, u, len};
  }
  free(seen);
  return rv;
}

int gnmr__validate_hello(const Gnmr__Hello *h, const policy_params *defaults,
                         uint32_t default_barrier, policy_params *prm,
                         uint32_t *barrier_ms, const char **ref, char *msg,
                         size_t msglen) {
  const char *what = NULL;
  uint32_t barrier = h->barrier_ms   ? h->barrier_ms
                     : default_barrier ? default_barrier
                                       : GNMR_DEFAULT_BARRIER_MS;
  if (h->protocol != GNMR_PROTOCOL_VERSION)
    FAIL(GNMR_E_VERSION, "protocol", "protocol %u, this daemon speaks %u",
         h->protocol, GNMR_PROTOCOL_VERSION);
  char why[96];
  if (!gnmr__name_check(h->job, GNMR_MAX_JOB_NAME, why, sizeof why))
    FAIL(GNMR_E_INVAL, "job", "job name: %s (1..%u bytes of UTF-8 without "
         "control or format characters)", why, GNMR_MAX_JOB_NAME);
  /* who the agent is (host, pid): shown in logs and in the refusal of a
   * second agent for a rank, so a name like any other */
  if (h->instance != NULL && h->instance[0] != '\0' &&
      !gnmr__name_check(h->instance, 256, why, sizeof why))
    FAIL(GNMR_E_INVAL, "instance", "instance: %s (1..256 bytes of UTF-8 "
         "without control or format characters)", why);
  if (h->start > 2) /* gnmr/agent.h: GNMR_START_RESUME */
    FAIL(GNMR_E_INVAL, "start", "start %u: 0 (nothing said), 1 (a fresh "
         "start) or 2 (a resume)", h->start);
  if (h->node_ranks > GNMR_MAX_REPORTERS)
    FAIL(GNMR_E_INVAL, "node_ranks", "node_ranks %u: at most %u ranks a "
         "node (0 or 1: every rank its own)", h->node_ranks,
         GNMR_MAX_REPORTERS);
  if (h->n_held > GNMR_MAX_HELD)
    FAIL(GNMR_E_RANGE, "held", "%zu held decisions: an agent holds at most "
         "%u", h->n_held, GNMR_MAX_HELD);
  uint64_t held_ids = 0; /* every id the held decisions carry */
  for (size_t i = 0; i < h->n_held; i++) {
    const Gnmr__Decision *d = h->held[i], *prev = i ? h->held[i - 1] : NULL;
    if (d != NULL)
      held_ids += (uint64_t)d->n_active + d->n_risky + d->n_g + d->n_d +
                  d->n_s;
    if (held_ids > GNMR_MAX_HELD_IDS)
      FAIL(GNMR_E_RANGE, "held", "the held decisions carry more than %u "
           "ids and scores in all (an agent keeps only active sets)",
           GNMR_MAX_HELD_IDS);
    if (d == NULL || d->job == NULL || strcmp(d->job, h->job) != 0)
      FAIL(GNMR_E_MISMATCH, "held", "held decision %zu is not of job %.64s",
           i, h->job);
    if (d->run == 0 || d->pass == 0 || d->step == 0 ||
        d->step > GNMR_MAX_STEP || d->run > GNMR_MAX_STEP ||
        d->pass == UINT32_MAX)
      FAIL(GNMR_E_RANGE, "held", "held decision %zu: run, pass and step must "
           "be 1 or more (run and step at most 2^63 - 1025)", i);
    if (prev != NULL && d->run != prev->run)
      FAIL(GNMR_E_INVAL, "held", "held decisions %zu and %zu are of "
           "different runs", i - 1, i);
    if (prev != NULL && (d->pass < prev->pass ||
                         (d->pass == prev->pass && d->step <= prev->step)))
      FAIL(GNMR_E_INVAL, "held", "held decision %zu is not after the one "
           "before it (oldest first)", i);
    if (d->n_active > GNMR_MAX_AGENT_UNITS)
      FAIL(GNMR_E_RANGE, "held", "held decision %zu has %zu active units",
           i, d->n_active);
    for (size_t k = 1; k < d->n_active; k++)
      if (d->active[k] <= d->active[k - 1])
        FAIL(GNMR_E_INVAL, "held", "held decision %zu: active ids are not "
             "ascending", i);
  }
  if (h->reporters == 0 || h->reporters > GNMR_MAX_REPORTERS)
    FAIL(GNMR_E_INVAL, "reporters", "reporters must be 1..%u",
         GNMR_MAX_REPORTERS);
  if (h->rank >= h->reporters && !h->observer)
    FAIL(GNMR_E_INVAL, "rank", "rank %u is not below reporters %u", h->rank,
         h->reporters);
  if (h->n_units == 0 || h->n_units > GNMR_MAX_AGENT_UNITS)
    FAIL(GNMR_E_INVAL, "units", "an agent has 1..%u units, not %zu",
         GNMR_MAX_AGENT_UNITS, h->n_units);
  if (barrier > 600000)
    FAIL(GNMR_E_INVAL, "barrier_ms", "barrier_ms must be 1..600000");
  if (h->n_unit_ids != 0 && h->n_unit_ids != h->n_units)
    FAIL(GNMR_E_PROTO, "unit_ids", "unit_ids has %zu entries for %zu units",
         h->n_unit_ids, h->n_units);
  for (size_t i = 0; i < h->n_unit_ids; i++)
    if (h->unit_ids[i] >= UINT32_MAX) /* UINT32_MAX: no unit */
      FAIL(GNMR_E_RANGE, "unit_ids", "unit id %llu is not below %u",
           (unsigned long long)h->unit_ids[i], UINT32_MAX);
  if (h->params == NULL && defaults == NULL)
    FAIL(GNMR_E_INVAL, "params", "Hello without policy parameters");
  if (h->params != NULL)
    gnmr__params_from_wire(h->params, prm);
  else
    *prm = *defaults;
  if (policy_params_validate(prm, &what) != GNMR_OK)
    FAIL(GNMR_E_INVAL, what, "invalid policy parameter %s", what);
  int rv = names_check(h, ref, msg, msglen);
  if (rv == GNMR_OK)
    *barrier_ms = barrier;
  return rv;
}

/* The Hello inside an Envelope's bytes, when the Envelope's body is one
 * Hello and nothing else (a later body member would replace it). */
static int hello_bytes(const uint8_t *p, const uint8_t *end,
                       const uint8_t **hb, const uint8_t **he) {
  int bodies = 0;
  while (p < end) {
    uint64_t key;
    const uint8_t *at;
    if (!gnmr__varint_get(&p, end, &key))
      return 0;
    at = p;
    if (!gnmr__wire_skip(&p, end, (unsigned)(key & 7)))
      return 0;
    if ((key & 7) != GNMR_WIRE_LEN || key >> 3 < GNMR_WIRE_ENVELOPE_HELLO)
      continue;
    uint64_t n;
    if (++bodies > 1 || key >> 3 != GNMR_WIRE_ENVELOPE_HELLO ||
        !gnmr__varint_get(&at, p, &n))
      return 0;
    *hb = at;
    *he = p;
  }
  return bodies == 1;
}

/* Hello.units' next name in [*p, end): its bytes as the decoder's C
 * string holds them (up to a NUL). 1 with a name, 0 at the end, -1 for
 * bytes this scan does not read. */
static int next_unit(const uint8_t **p, const uint8_t *end,
                     const char **name, size_t *len) {
  while (*p < end) {
    uint64_t key, n;
    if (!gnmr__varint_get(p, end, &key))
      return -1;
    if (key != GNMR_WIRE_KEY(GNMR_WIRE_HELLO_UNITS, GNMR_WIRE_LEN)) {
      if (!gnmr__wire_skip(p, end, (unsigned)(key & 7)))
        return -1;
      continue;
    }
    if (!gnmr__varint_get(p, end, &n) || n > (uint64_t)(end - *p))
      return -1;
    *name = (const char *)*p;
    *len = strnlen(*name, (size_t)n);
    *p += n;
    return 1;
  }
  return 0;
}

int gnmr__hello_bytes_dup(const void *buf, size_t len, const char **ref,
                          char *msg, size_t msglen) {
  const uint8_t *hb, *he, *p;
  const char *u;
  size_t ul, n = 0;
  int r;
  if (!hello_bytes(buf, (const uint8_t *)buf + len, &hb, &he))
    return GNMR_OK;
  for (p = hb; (r = next_unit(&p, he, &u, &ul)) == 1;)
    n++;
  if (r < 0 || n < 2 || n > GNMR_MAX_AGENT_UNITS)
    return GNMR_OK; /* the decoder says what is wrong */
  size_t cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  typedef struct {
    uint64_t hash;
    const char *name;
    size_t len;
  } slot;
  slot *seen = calloc(cap, sizeof *seen);
  if (seen == NULL)
    return GNMR_OK; /* the decoder's own check runs */
  int rv = GNMR_OK;
  for (p = hb; rv == GNMR_OK && next_unit(&p, he, &u, &ul) == 1;) {
    uint64_t hv = hmap_hash_keyed(u, ul);
    size_t k = hv & (cap - 1);
    for (; seen[k].name != NULL; k = (k + 1) & (cap - 1))
      if (seen[k].hash == hv && seen[k].len == ul &&
          memcmp(seen[k].name, u, ul) == 0)
        break;
    if (seen[k].name == NULL) {
      seen[k] = (slot){hv, u, ul};
      continue;
    }
    char name[GNMR_MAX_UNIT_NAME + 1], why[96];
    if (ul > GNMR_MAX_UNIT_NAME)
      break; /* not a valid name: the decoder's check says so */
    memcpy(name, u, ul);
    name[ul] = '\0';
    if (!gnmr__name_check(name, GNMR_MAX_UNIT_NAME, why, sizeof why))
      break;
    *ref = "units";
    snprintf(msg, msglen, "unit name '%.64s' listed twice", name);
    rv = GNMR_E_DUP;
  }
  free(seen);
  return rv;
}

int gnmr__validate_report(const Gnmr__Report *r, uint32_t n_units,
                          const char **ref, char *msg, size_t msglen) {
  if (r->n_sumsq != n_units)
    FAIL(GNMR_E_PROTO, "sumsq", "sumsq has %zu entries, the rank has %u units",
         r->n_sumsq, n_units);
  if (r->n_nonfinite != 0 && r->n_nonfinite != n_units)
    FAIL(GNMR_E_PROTO, "nonfinite",
         "nonfinite has %zu entries: expected 0 or %u", r->n_nonfinite,
         n_units);
  if (r->n_not_reported != 0 && r->n_not_reported != n_units)
    FAIL(GNMR_E_PROTO, "not_reported",
         "not_reported has %zu entries: expected 0 or %u", r->n_not_reported,
         n_units);
  if (r->n_missing != 0 && r->n_missing != n_units)
    FAIL(GNMR_E_PROTO, "missing",
         "missing has %zu entries: expected 0 or %u", r->n_missing,
         n_units);
  if (r->n_shadowed != 0 && r->n_shadowed != n_units)
    FAIL(GNMR_E_PROTO, "shadowed",
         "shadowed has %zu entries: expected 0 or %u", r->n_shadowed,
         n_units);
  if (r->n_measure != 0 && r->n_measure != n_units)
    FAIL(GNMR_E_PROTO, "measure",
         "measure has %zu entries: expected 0 or %u", r->n_measure,
         n_units);
  for (size_t i = 0; i < r->n_measure; i++)
    if (r->measure[i] < 0) /* NaN: not measured; +inf: not finite */
      FAIL(GNMR_E_RANGE, "measure",
           "measure[%zu] is negative (a measure is >= 0, inf, or NaN for "
           "none)", i);
  for (size_t i = 0; i < r->n_sumsq; i++)
    if (!(r->sumsq[i] >= 0))
      FAIL(GNMR_E_RANGE, "sumsq",
           "sumsq[%zu] is negative or NaN (report NaN/Inf elements as "
           "nonfinite counts)", i);
  if (r->step == 0)
    FAIL(GNMR_E_INVAL, "step", "steps start at 1");
  if (r->step > GNMR_MAX_STEP)
    FAIL(GNMR_E_RANGE, "step",
         "step %llu is above the largest step, 2^63 - 1025",
         (unsigned long long)r->step);
  return GNMR_OK;
}
