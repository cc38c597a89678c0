/* SPDX-License-Identifier: MIT */
/* test_cli_replay.c — `gnmrctl replay` as a user runs it: every sample in
 * tests/traces (and ../shared/traces, where present) gives exactly its decisions file (options read from the
 * file's name, so new samples are tested without code changes), from a
 * path and from standard input; --scores; malformed traces and options get
 * a clear message and a non-zero exit. */
#include <dirent.h>

#include "testutil.h"

/* Option of each PARAMS key in NAME.PARAMS.decisions.csv. */
static const struct {
  const char *key;
  const char *opt;
} keys[] = {
    {"a", "--alpha"},        {"b", "--beta"},
    {"w", "--window"},       {"k", "--max-active"},
    {"l", "--lock-steps"},   {"wu", "--warmup-steps"},
    {"ea", "--early-alpha"}, {"eb", "--early-beta"},
    {"es", "--early-steps"},
};

/* Builds argv for `gnmrctl replay OPTIONS TRACE` from a PARAMS string. */
static int params_to_argv(const char *params, char **argv, int max,
                          char *store, size_t cap) {
  int n = 0;
  static const char *const first[] = {TU_FIRST_DEFAULTS};
  argv[n++] = "gnmrctl";
  argv[n++] = "replay";
  for (int k = 0; k < TU_FIRST_DEFAULTS_N; k++)
    argv[n++] = (char *)first[k];
  if (strcmp(params, "defaults") == 0)
    return n;
  char *s = store;
  snprintf(s, cap, "%s", params);
  for (char *tok = strtok(s, "_"); tok; tok = strtok(NULL, "_")) {
    size_t kl = 0;
    while (tok[kl] >= 'a' && tok[kl] <= 'z')
      kl++;
    int found = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
      if (strlen(keys[i].key) == kl && strncmp(tok, keys[i].key, kl) == 0) {
        ck_assert_int_lt(n + 2, max);
        argv[n++] = (char *)keys[i].opt;
        argv[n++] = tok + kl;
        found = 1;
      }
    }
    ck_assert_msg(found, "unknown key in '%s'", params);
  }
  return n;
}

/* Replays every NAME.PARAMS.decisions.csv of dir against NAME.csv; returns
 * how many were checked (-1: no such directory). */
static int check_trace_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return -1;
  int checked = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *suffix = ".decisions.csv";
    size_t l = strlen(de->d_name), sl = strlen(suffix);
    if (l <= sl || strcmp(de->d_name + l - sl, suffix) != 0)
      continue;
    char name[256], params[256], store[256], trace_p[1024], expect_p[1024];
    const char *dot = strchr(de->d_name, '.');
    snprintf(name, sizeof name, "%.*s", (int)(dot - de->d_name), de->d_name);
    snprintf(params, sizeof params, "%.*s",
             (int)(l - sl - (size_t)(dot - de->d_name) - 1), dot + 1);
    snprintf(trace_p, sizeof trace_p, "%s/%s.csv", dir, name);
    snprintf(expect_p, sizeof expect_p, "%s/%s", dir, de->d_name);
    char *argv[48];
    int n = params_to_argv(params, argv, 46, store, sizeof store);
    char *expect = tu_read_file(expect_p, NULL);
    ck_assert_ptr_nonnull(expect);

    argv[n] = trace_p;
    argv[n + 1] = NULL;
    run_result r = tu_run("gnmrctl", argv, NULL);
    ck_assert_msg(r.code == 0, "%s: exit %d: %s", de->d_name, r.code, r.err);
    ck_assert_msg(strcmp(r.out, expect) == 0, "%s: decisions differ",
                  de->d_name);
    tu_run_free(&r);

    argv[n] = "-"; /* the same through standard input */
    r = tu_run("gnmrctl", argv, trace_p);
    ck_assert_int_eq(r.code, 0);
    ck_assert_msg(strcmp(r.out, expect) == 0, "%s via stdin differs",
                  de->d_name);
    tu_run_free(&r);
    free(expect);
    checked++;
  }
  closedir(d);
  return checked;
}

START_TEST(every_sample_trace_gives_its_expected_decisions) {
  /* the project's own traces; ../shared's too, as extra cases, where a
   * checkout has one beside it */
  int own = check_trace_dir(tu_traces());
  ck_assert_msg(own >= 4, "%s: %d traces checked", tu_traces(), own);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/traces", tu_shared());
  int extra = check_trace_dir(dir);
  if (extra < 0)
    printf("(no %s: the project's %d sample traces only)\n", dir, own);
}
END_TEST

START_TEST(scores_list_risky_and_held_units_with_outcomes) {
  char trace_p[512];
  snprintf(trace_p, sizeof trace_p, "%s/worked_example.csv",
           tu_traces());
  const char *dir = tu_tmpdir();
  char scores_p[256], opt[300];
  snprintf(scores_p, sizeof scores_p, "%s/scores.csv", dir);
  snprintf(opt, sizeof opt, "--scores=%s", scores_p);
  /* the worked example's parameters (docs/policy.md) */
  char *argv[] = {"gnmrctl", "replay", "--alpha", "2", "--beta", "2",
                  "--window", "2", "--max-active", "1", "--lock-steps", "1",
                  "--warmup-steps", "0", "--confirm-steps", "0", opt,
                  trace_p, NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.out, "step,active\n1,\n2,\n3,\n4,0\n5,0\n6,\n");
  char *sc = tu_read_file(scores_p, NULL);
  ck_assert_ptr_nonnull(sc);
  ck_assert_str_eq(sc, "step,unit,norm,g,d,s,outcome\n"
                       "4,0,5,5,5,2.5,selected\n"
                       "5,0,2,1,0.333333333,0.5,held\n");
  free(sc);
  tu_run_free(&r);
  /* --scores without a file writes to standard error */
  char *argv2[] = {"gnmrctl", "replay", "--alpha", "2", "--beta", "2",
                   "--max-active", "0", "--warmup-steps", "0",
                   "--confirm-steps", "0", "--scores", trace_p, NULL};
  r = tu_run("gnmrctl", argv2, NULL);
  ck_assert_int_eq(r.code, 0);
  ck_assert_ptr_nonnull(strstr(r.err, "4,0,5,5,5,2.5,dropped\n"));
  tu_run_free(&r);
  unlink(scores_p);
  rmdir(dir);
}
END_TEST

/* Runs replay on `text` (via stdin) and expects exit `code` and a stderr
 * containing `part`. */
static void expect_trace_fails(const char *text, const char *part) {
  const char *dir = tu_tmpdir();
  char p[256];
  snprintf(p, sizeof p, "%s/bad.csv", dir);
  tu_write_file(p, text);
  char *argv[] = {"gnmrctl", "replay", p, NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_msg(r.code == 1, "exit %d for %s", r.code, text);
  ck_assert_msg(strstr(r.err, part) != NULL, "stderr '%s' lacks '%s'", r.err,
                part);
  ck_assert_str_eq(r.out, ""); /* no partial decisions */
  tu_run_free(&r);
  unlink(p);
  rmdir(dir);
}

START_TEST(malformed_traces_exit_1_naming_the_line) {
  expect_trace_fails("step,unit,norm\n1,0,1\n1,0,2\n",
                     "bad.csv:3: duplicate (step 1, unit 0)");
  expect_trace_fails("step,unit,norm\n1,0,x\n", "bad.csv:2: norm 'x'");
  expect_trace_fails("step,unit,norm\n1,0,-2\n", "bad.csv:2: norm -2 is "
                                                 "negative");
  expect_trace_fails("step,unit,norm\n1,0\n", "bad.csv:2: expected 3 columns");
  expect_trace_fails("time,unit,norm\n1,0,1\n",
                     "bad.csv:1: expected the header");
  expect_trace_fails("", "empty trace");
}
END_TEST

START_TEST(missing_trace_file_is_a_clear_error) {
  char *argv[] = {"gnmrctl", "replay", "/nonexistent/t.csv", NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_int_eq(r.code, 1);
  ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/t.csv: No such file"));
  tu_run_free(&r);
}
END_TEST

/* Runs replay with a schedule and returns its result. */
static run_result replay_with(const char *dir, const char *trace,
                              const char *schedule) {
  char tp[256], sp[256];
  snprintf(tp, sizeof tp, "%s/t.csv", dir);
  snprintf(sp, sizeof sp, "%s/s.txt", dir);
  tu_write_file(tp, trace);
  tu_write_file(sp, schedule);
  /* one-step spikes: the plain rule (confirm_steps 0) takes them */
  char *argv[] = {"gnmrctl", "replay", "--warmup-steps", "0",
                  "--confirm-steps", "0", "--schedule", sp, tp, NULL};
  return tu_run("gnmrctl", argv, NULL);
}

START_TEST(a_schedule_changes_parameters_from_its_step) {
  const char *dir = tu_tmpdir();
  static const char trace[] = "step,unit,norm\n1,0,1\n1,1,1\n2,0,1\n"
                              "2,1,1\n3,0,9\n3,1,1\n4,0,1\n4,1,8\n";
  run_result r = replay_with(dir, trace, "");
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.out, "step,active\n1,\n2,\n3,0\n4,0 1\n");
  tu_run_free(&r);
  /* thresholds of 50 from step 3: nothing is risky any more */
  r = replay_with(dir, trace, "# retuned live\n3 alpha=50 beta=50\n");
  ck_assert_int_eq(r.code, 0);
  ck_assert_str_eq(r.out, "step,active\n1,\n2,\n3,\n4,\n");
  tu_run_free(&r);
  /* from step 4 only: step 3 still selects unit 0 */
  r = replay_with(dir, trace, "4 alpha=50 beta=50\n");
  ck_assert_str_eq(r.out, "step,active\n1,\n2,\n3,0\n4,0\n");
  tu_run_free(&r);
  static const struct {
    const char *text, *part;
  } bad[] = {
      {"3 gamma=1\n", "s.txt:1: unknown parameter 'gamma'"},
      {"3 alpha=2\n2 alpha=3\n", "s.txt:2: '2' is not a step above"},
      {"0 alpha=2\n", "s.txt:1: '0' is not a step"},
      {"x alpha=2\n", "s.txt:1: 'x' is not a step"},
      {"3\n", "s.txt:1: give key=value after the step"},
      {"3 window=0\n", "s.txt:1: window must be from 1"},
      {"{\"params\": []}", "no \"params\" rows"},
      {"{\"params\": [{\"from_step\": 1}]}", "bad or missing alpha"},
      {"{not json", "s.txt:1: not JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    r = replay_with(dir, trace, bad[i].text);
    ck_assert_msg(r.code == 1, "exit %d for %s", r.code, bad[i].text);
    ck_assert_msg(strstr(r.err, bad[i].part) != NULL, "'%s' lacks '%s'",
                  r.err, bad[i].part);
    ck_assert_str_eq(r.out, "");
    tu_run_free(&r);
  }
  tu_rmrf(dir);
}
END_TEST

START_TEST(invalid_options_exit_2_with_a_message) {
  static const struct {
    const char *a, *b, *part;
  } cases[] = {
      {"--alpha", "0", "--alpha '0': expected a finite number > 0"},
      {"--alpha", "-1", "--alpha"},
      {"--beta", "nan", "--beta 'nan'"},
      {"--beta", "inf", "--beta 'inf'"},
      {"--window", "0", "--window must be from 1"},
      {"--window", "99999999", "--window must be from 1"},
      {"--window", "1.5", "--window '1.5': expected an integer"},
      {"--max-active", "-1", "--max-active '-1'"},
      {"--lock-steps", "x", "--lock-steps 'x'"},
      {"--warmup-steps", "", "--warmup-steps ''"},
      {"--early-alpha", "0", "--early-alpha"},
      {"--early-beta", "abc", "--early-beta"},
      {"--early-steps", "1e3", "--early-steps"},
      {"--bogus", "1", "usage: gnmrctl replay"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[] = {"gnmrctl", "replay", (char *)cases[i].a,
                    (char *)cases[i].b, "-", NULL};
    run_result r = tu_run("gnmrctl", argv, NULL);
    ck_assert_msg(r.code == 2, "%s %s: exit %d", cases[i].a, cases[i].b,
                  r.code);
    ck_assert_msg(strstr(r.err, cases[i].part) != NULL,
                  "%s %s: stderr '%s'", cases[i].a, cases[i].b, r.err);
    tu_run_free(&r);
  }
  char *none[] = {"gnmrctl", "replay", NULL};
  run_result r = tu_run("gnmrctl", none, NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "missing TRACE"));
  tu_run_free(&r);
  char *two[] = {"gnmrctl", "replay", "a.csv", "b.csv", NULL};
  r = tu_run("gnmrctl", two, NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "more than one TRACE"));
  tu_run_free(&r);
  char *cmd[] = {"gnmrctl", "frobnicate", NULL};
  r = tu_run("gnmrctl", cmd, NULL);
  ck_assert_int_eq(r.code, 2);
  ck_assert_ptr_nonnull(strstr(r.err, "unknown command 'frobnicate'"));
  tu_run_free(&r);
}
END_TEST

START_TEST(options_change_the_decisions) {
  /* the same trace with a budget of 0 selects nobody */
  char trace_p[512];
  snprintf(trace_p, sizeof trace_p, "%s/small.csv", tu_traces());
  char *argv[] = {"gnmrctl", "replay", "--max-active", "0", trace_p, NULL};
  run_result r = tu_run("gnmrctl", argv, NULL);
  ck_assert_int_eq(r.code, 0);
  const char *line = strchr(r.out, '\n');
  for (line = line + 1; *line; line = strchr(line, '\n') + 1) {
    const char *comma = strchr(line, ',');
    ck_assert(comma && comma[1] == '\n');
  }
  tu_run_free(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("cli_replay");
  TCase *tc = tcase_create("replay");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, every_sample_trace_gives_its_expected_decisions);
  tcase_add_test(tc, scores_list_risky_and_held_units_with_outcomes);
  tcase_add_test(tc, malformed_traces_exit_1_naming_the_line);
  tcase_add_test(tc, missing_trace_file_is_a_clear_error);
  tcase_add_test(tc, a_schedule_changes_parameters_from_its_step);
  tcase_add_test(tc, invalid_options_exit_2_with_a_message);
  tcase_add_test(tc, options_change_the_decisions);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
