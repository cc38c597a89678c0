/* SPDX-License-Identifier: MIT */
/* replay.c — feeds a sorted trace to the policy one step at a time, from
 * the first to the last step of the trace; a (step, unit) absent from the
 * trace is POLICY_NOT_REPORTED, exactly as docs/policy.md reads. */
#include "replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gnmr/error.h"

void gnmr__write_decision_row(FILE *f, uint64_t step, const uint32_t *ids,
                              uint32_t n) {
  fprintf(f, "%llu,", (unsigned long long)step);
  for (uint32_t i = 0; i < n; i++)
    fprintf(f, i ? " %u" : "%u", ids[i]);
  fputc('\n', f);
}

/* %.9g, with "nan" (never "-nan") and an empty field for "not computed". */
static void put_num(FILE *f, double v, int empty_if_nan) {
  if (isnan(v)) {
    if (!empty_if_nan)
      fputs("nan", f);
  } else {
    fprintf(f, "%.9g", v);
  }
}

/* norm is printed only for units reported at this step (a lock-held unit
 * may have no report; its norm field is then empty). */
static void write_scores(FILE *f, const policy_result *r, const double *norm,
                         const uint8_t *input, const double *measure) {
  /* Risky units come from the EXCEED events (ascending unit order);
   * lock-held units are active ones with s <= 1. Merge both by unit. */
  const policy_event *ev = r->events;
  uint32_t ne = r->n_events, ei = 0, ai = 0;
  for (;;) {
    while (ei < ne && ev[ei].kind != POLICY_EV_EXCEED)
      ei++;
    while (ai < r->n_active && r->s[r->active[ai]] > 1)
      ai++;
    uint32_t eu = ei < ne ? ev[ei].unit : UINT32_MAX;
    uint32_t au = ai < r->n_active ? r->active[ai] : UINT32_MAX;
    if (eu == UINT32_MAX && au == UINT32_MAX)
      break;
    uint32_t u = eu < au ? eu : au;
    const char *outcome =
        eu < au ? policy_outcome_name(ev[ei].outcome) : "held";
    fprintf(f, "%llu,%u,", (unsigned long long)r->step, u);
    if (input[u] == POLICY_REPORTED)
      put_num(f, norm[u], 0);
    fputc(',', f);
    put_num(f, r->g[u], 1);
    fputc(',', f);
    put_num(f, r->d[u], 1);
    fputc(',', f);
    put_num(f, r->s[u], 0);
    fprintf(f, ",%s", outcome);
    if (measure != NULL) { /* a measured trace: the measure's part */
      fputc(',', f);
      if (!isnan(measure[u]))
        put_num(f, measure[u], 0);
      fputc(',', f);
      put_num(f, r->gm ? r->gm[u] : NAN, 1);
      fputc(',', f);
      put_num(f, r->dm ? r->dm[u] : NAN, 1);
      fprintf(f, ",%s", eu < au ? policy_signal_name(ev[ei].signal) : "");
    }
    fputc('\n', f);
    if (eu < au)
      ei++;
    else
      ai++;
  }
}

int gnmr__replay(const trace *t, const policy_params *prm,
                 const gnmr_schedule *sched, FILE *decisions, FILE *scores) {
  size_t next = 0;
  int rv;
  policy *p = NULL;
  double *norm = NULL, *measure = NULL;
  uint8_t *input = NULL;
  uint32_t n = t->n_units;

  if ((rv = policy_create(prm, n, &p)) != 0)
    return rv;
  norm = calloc(n ? n : 1, sizeof *norm);
  input = malloc(n ? n : 1);
  if (t->measured)
    measure = calloc(n ? n : 1, sizeof *measure);
  if (norm == NULL || input == NULL || (t->measured && measure == NULL)) {
    rv = GNMR_E_NOMEM;
    goto out;
  }
  fputs("step,active\n", decisions);
  if (scores != NULL)
    fputs(t->measured ? GNMR_SCORES_HEADER GNMR_SCORES_MEASURED "\n"
                      : GNMR_SCORES_HEADER "\n",
          scores);
  size_t row = 0;
  for (uint64_t step = t->first_step; t->n_rows > 0 && step <= t->last_step;
       step++) {
    policy_result res;
    memset(input, POLICY_NOT_REPORTED, n);
    for (uint32_t u = 0; measure != NULL && u < n; u++)
      measure[u] = NAN;
    for (; row < t->n_rows && t->rows[row].step == step; row++) {
      norm[t->rows[row].unit] = t->rows[row].norm;
      input[t->rows[row].unit] = POLICY_REPORTED;
      if (measure != NULL)
        measure[t->rows[row].unit] = t->rows[row].measure;
    }
    while (sched != NULL && next < sched->n && sched->e[next].step <= step)
      if ((rv = policy_set_params(p, &sched->e[next++].prm)) != 0)
        goto out;
    if ((rv = policy_step_measured(p, step, norm, input, measure, &res)) != 0)
      goto out;
    gnmr__write_decision_row(decisions, step, res.active, res.n_active);
    if (scores != NULL)
      write_scores(scores, &res, norm, input, measure);
  }
  if (fflush(decisions) != 0 || ferror(decisions) ||
      (scores != NULL && (fflush(scores) != 0 || ferror(scores))))
    rv = GNMR_E_IO;
out:
  free(norm);
  free(measure);
  free(input);
  policy_destroy(&p);
  return rv;
}
