/* SPDX-License-Identifier: MIT */
/* soak.c — a bounded soak of gnmrd (SOAK_SECONDS, default 60): one job
 * stepping continuously under history retention, and a short job created
 * and finished every 2 s. After a warm-up quarter, the daemon's RSS, open
 * file descriptors and database size must stay flat (within small
 * margins), and every step must be decided. Run by `make soak`; `make
 * check` runs 20 s of it. */
#include <dirent.h>
#include <sys/stat.h>

#include "gnmr/agent.h"
#include "testutil.h"

typedef struct sample {
  long rss_kb, fds, db_kb;
} sample;

static sample measure(const tu_daemon *d) {
  sample s = {0, 0, 0};
  char path[160], buf[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
  FILE *f = fopen(path, "r");
  while (f && fgets(buf, sizeof buf, f))
    if (sscanf(buf, "VmRSS: %ld kB", &s.rss_kb) == 1)
      break;
  if (f)
    fclose(f);
  snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
  DIR *dir = opendir(path);
  for (struct dirent *e; dir && (e = readdir(dir)) != NULL;)
    s.fds += e->d_name[0] != '.';
  if (dir)
    closedir(dir);
  static const char *const files[] = {"gnmr.db", "gnmr.db-wal"};
  for (int i = 0; i < 2; i++) {
    struct stat st;
    snprintf(path, sizeof path, "%s/data/%s", d->dir, files[i]);
    if (stat(path, &st) == 0)
      s.db_kb += (long)(st.st_size / 1024);
  }
  return s;
}

static gnmr_agent *open_job(const char *ep, const char *job, uint32_t n) {
  static char *names[64];
  if (names[0] == NULL)
    for (int u = 0; u < 64; u++) {
      names[u] = malloc(16);
      snprintf(names[u], 16, "unit%d", u);
    }
  gnmr_agent_config c = {0};
  c.endpoint = ep;
  c.job = job;
  c.reporters = 1;
  c.unit_names = (const char *const *)names;
  c.n_units = n;
  gnmr_params_default(&c.params);
  c.params.warmup_steps = 5;
  gnmr_agent *a;
  ck_assert_int_eq(gnmr_agent_open(&c, &a), GNMR_OK);
  return a;
}

static void step(gnmr_agent *a, uint64_t t, uint32_t n) {
  double s[64];
  for (uint32_t u = 0; u < n; u++)
    s[u] = (1 + u % 7) * (1 + ((t * 31 + u) % 97 == 0 ? 50.0 : 0.0));
  ck_assert_int_eq(gnmr_agent_report_sums(a, t, s, NULL, NULL), GNMR_OK);
  ck_assert_msg(gnmr_agent_wait(a, t, 10000 * tu_slow()) == GNMR_OK,
                "no decision for step %llu", (unsigned long long)t);
}

START_TEST(memory_fds_and_database_stay_flat) {
  const char *env = getenv("SOAK_SECONDS");
  double seconds = env ? atof(env) : 60;
  tu_daemon d = {0};
  char *extra[] = {"--retain-steps", "300", "--snapshot-every", "50", NULL};
  snprintf(d.dir, sizeof d.dir, "%s", tu_tmpdir());
  tu_daemon_start_in(&d, NULL, NULL, d.dir, extra);
  gnmr_agent *main_job = open_job(d.agents, "soak-main", 64);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint64_t t = 0, short_jobs = 0;
  sample warm = {0, 0, 0}, peak = {0, 0, 0};
  double next_sample = 1, next_job = 2;
  int warmed = 0;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    double el = (double)(now.tv_sec - t0.tv_sec) +
                (double)(now.tv_nsec - t0.tv_nsec) * 1e-9;
    if (el >= seconds)
      break;
    step(main_job, ++t, 64);
    if (el >= next_job) { /* a job comes and goes */
      char name[32];
      snprintf(name, sizeof name, "soak-short-%llu",
               (unsigned long long)short_jobs++);
      gnmr_agent *a = open_job(d.agents, name, 4);
      for (uint64_t k = 1; k <= 10; k++)
        step(a, k, 4);
      gnmr_agent_close(&a);
      next_job = el + 2;
    }
    if (el >= next_sample) {
      sample s = measure(&d);
      if (!warmed && el >= seconds / 4) {
        warm = s;
        warmed = 1;
      }
      if (warmed) {
        peak.rss_kb = s.rss_kb > peak.rss_kb ? s.rss_kb : peak.rss_kb;
        peak.fds = s.fds > peak.fds ? s.fds : peak.fds;
        peak.db_kb = s.db_kb > peak.db_kb ? s.db_kb : peak.db_kb;
      }
      next_sample = el + 1;
    }
  }
  sample end = measure(&d);
  printf("soak %.0f s: %llu steps of a 64-unit job, %llu short jobs; after "
         "warm-up RSS %ld -> peak %ld kB, fds %ld -> %ld, db %ld -> %ld kB\n",
         seconds, (unsigned long long)t, (unsigned long long)short_jobs,
         warm.rss_kb, peak.rss_kb, warm.fds, peak.fds, warm.db_kb,
         peak.db_kb);
  ck_assert(warmed);
  ck_assert_int_gt(t, 100);
  /* flat: RSS within 25% + 8 MB, no fd leak, db bounded by retention */
  ck_assert_msg(peak.rss_kb <= warm.rss_kb * 5 / 4 + 8192,
                "RSS grew from %ld to %ld kB", warm.rss_kb, peak.rss_kb);
  ck_assert_msg(peak.fds <= warm.fds + 2, "fds grew from %ld to %ld",
                warm.fds, peak.fds);
  ck_assert_msg(end.db_kb <= warm.db_kb * 2 + 2048,
                "database grew from %ld to %ld kB", warm.db_kb, end.db_kb);
  gnmr_agent_close(&main_job);
  ck_assert_int_eq(tu_daemon_stop(&d, SIGTERM), 0);
  tu_rmrf(d.dir);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("soak");
  TCase *tc = tcase_create("soak");
  tcase_set_timeout(tc, 3600);
  tcase_add_test(tc, memory_fds_and_database_stay_flat);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
