/* SPDX-License-Identifier: MIT */
/* bench/failover.c — how long a job goes without decisions when its
 * active gnmrd dies: SIGKILL, then the standby (same PostgreSQL store,
 * --standby) takes the lock, restores the job from its latest snapshot,
 * binds, and the agent (GNMR_ENDPOINT=active,standby) re-joins and gets
 * its next decision. Against the limit measured in the same run: SIGKILL
 * and a fresh gnmrd started at once on the same store (a supervisor's
 * restart, with no process start-up hidden by a standby). ROUNDS kills of
 * each; the PostgreSQL cluster is scripts/pg_tmp.sh's. */
#include <sys/stat.h>

#include "benchutil.h"
#include "gnmr/agent.h"
#include "gnmr/error.h"

#define ROUNDS 7
#define UNITS 64

typedef struct node {
  pid_t pid;
  char dir[64], ep[128], out[128];
} node;

static const char *store_url;

/* Starts gnmrd on the store (standby or not) at endpoint ep, without
 * waiting. */
static int spawn(node *n, const char *ep, int standby) {
  char path[512], data[128], adm[128];
  const char *bin = getenv("GNMR_BIN_DIR");
  strcpy(n->dir, "/tmp/gnmr-bench-XXXXXX");
  if (mkdtemp(n->dir) == NULL)
    return -1;
  snprintf(path, sizeof path, "%s/gnmrd", bin ? bin : "build/bin");
  snprintf(data, sizeof data, "%s/data", n->dir);
  snprintf(n->out, sizeof n->out, "%s/out", n->dir);
  snprintf(adm, sizeof adm, "ipc://%s/admin.sock", n->dir);
  snprintf(n->ep, sizeof n->ep, "%s", ep);
  char *argv[] = {path, "--data-dir", data, "--agents", n->ep, "--admin",
                  adm, "--log-level", "warn", "--store", (char *)store_url,
                  "--snapshot-every", "10", standby ? "--standby" : NULL,
                  NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, n->out,
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  int rv = posix_spawn(&n->pid, path, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  return rv == 0 ? 0 : -1;
}

/* Whether it printed its endpoints (it serves). */
static int serving(const node *n) {
  FILE *f = fopen(n->out, "r");
  char line[512];
  int yes = 0;
  while (f && fgets(line, sizeof line, f))
    yes |= strncmp(line, "gnmrd: agents ", 14) == 0;
  if (f)
    fclose(f);
  return yes;
}

static void finish(node *n, int sig) {
  char cmd[128];
  if (n->pid > 0) {
    kill(n->pid, sig);
    waitpid(n->pid, NULL, 0);
    n->pid = 0;
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", n->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "warning: could not remove %s\n", n->dir);
}

static uint64_t step;

/* One step of the agent; 1 when decided within ms. */
static int one_step(gnmr_agent *a, int ms) {
  double sums[UNITS];
  step++;
  for (int u = 0; u < UNITS; u++)
    sums[u] = 1.0 + (double)((step * 7 + (uint64_t)u) % 5) * 0.1;
  gnmr_agent_report_sums(a, step, sums, NULL, NULL);
  return gnmr_agent_wait(a, step, ms) == GNMR_OK;
}

/* Kills *act and measures until the next decision: served (the new one
 * printed its endpoints) and decided, in seconds. With standby set the
 * new one is already standing by; otherwise it starts after the kill. */
static int measure(node *act, node *next, int standby, gnmr_agent *a,
                   double *served, double *decided) {
  double t0 = bu_now();
  finish(act, SIGKILL);
  char ep[128];
  snprintf(ep, sizeof ep, "%s", next->ep); /* next may be act itself */
  if (!standby && spawn(next, ep, 0) != 0)
    return -1;
  while (!serving(next) && bu_now() - t0 < 10)
    usleep(1000);
  *served = bu_now() - t0;
  /* the next report once it serves, as a trainer's would go on; one
   * sent in the instant the old one died is lost with it */
  while (!one_step(a, 2000) && bu_now() - t0 < 20)
    ;
  *decided = bu_now() - t0;
  return *decided < 20 ? 0 : -1;
}

static void report(const char *what, double *v, int n) {
  printf("failover %-30s median %6.0f ms  max %6.0f ms  (%d kills)\n", what,
         bu_quantile(v, (size_t)n, 0.5) * 1e3,
         bu_quantile(v, (size_t)n, 1.0) * 1e3, n);
}

int main(void) {
  char dir[] = "/tmp/gnmr-bench-pg-XXXXXX", cmd[320], url[256], eps[300];
  if (mkdtemp(dir) == NULL || rmdir(dir) != 0)
    return 1;
  snprintf(cmd, sizeof cmd, "scripts/pg_tmp.sh start '%s' >/dev/null", dir);
  if (system(cmd) != 0) {
    printf("failover: no PostgreSQL server to start (scripts/deps.sh "
           "check installs postgresql): not measured\n");
    return 0;
  }
  snprintf(url, sizeof url, "postgresql://gnmr@/gnmr?host=%s", dir);
  store_url = url;
  double s_served[ROUNDS], s_decided[ROUNDS], r_served[ROUNDS],
      r_decided[ROUNDS];
  int rc = 0;
  /* two slots, each an endpoint the agent lists; a node dies in one and a
   * new one starts in it, at the same endpoint */
  char base[] = "/tmp/gnmr-bench-ep-XXXXXX", ep[2][128];
  if (mkdtemp(base) == NULL)
    return 1;
  for (int i = 0; i < 2; i++)
    snprintf(ep[i], sizeof ep[i], "ipc://%s/slot%d.sock", base, i);
  snprintf(eps, sizeof eps, "%s,%s", ep[0], ep[1]);
  node n[2] = {{0}};
  if (spawn(&n[0], ep[0], 0) != 0)
    return 1;
  while (!serving(&n[0]))
    usleep(1000);
  if (spawn(&n[1], ep[1], 1) != 0)
    return 1;
  const char *names[UNITS];
  char name_buf[UNITS][16];
  for (int u = 0; u < UNITS; u++) {
    snprintf(name_buf[u], sizeof name_buf[u], "layer.%d", u);
    names[u] = name_buf[u];
  }
  gnmr_agent_config c = {0};
  c.endpoint = eps;
  c.job = "failover";
  c.reporters = 1;
  c.unit_names = names;
  c.n_units = UNITS;
  gnmr_params_default(&c.params);
  c.barrier_ms = 5000;
  gnmr_agent *a;
  if (gnmr_agent_open(&c, &a) != GNMR_OK)
    return 1;
  int act = 0;
  double served, decided;
  for (int k = 0; k < ROUNDS && rc == 0; k++) { /* to the standby */
    for (int i = 0; i < 25; i++) /* past a snapshot */
      rc |= !one_step(a, 5000);
    rc |= measure(&n[act], &n[1 - act], 1, a, &served, &decided) != 0;
    s_served[k] = served;
    s_decided[k] = decided;
    rc |= spawn(&n[act], ep[act], 1) != 0; /* a new standby in its slot */
    act = 1 - act;
  }
  finish(&n[1 - act], SIGTERM); /* restarts: no standby */
  for (int k = 0; k < ROUNDS && rc == 0; k++) {
    for (int i = 0; i < 25; i++)
      rc |= !one_step(a, 5000);
    rc |= measure(&n[act], &n[act], 0, a, &served, &decided) != 0;
    r_served[k] = served;
    r_decided[k] = decided;
  }
  gnmr_agent_close(&a);
  finish(&n[0], SIGTERM);
  finish(&n[1], SIGTERM);
  if (rc == 0) {
    report("SIGKILL -> standby serving", s_served, ROUNDS);
    report("SIGKILL -> first decision", s_decided, ROUNDS);
    report("(restart) -> serving", r_served, ROUNDS);
    report("(restart) -> first decision", r_decided, ROUNDS);
    printf("failover first decision: standby %.2fx the restart's "
           "(median)\n",
           bu_quantile(s_decided, ROUNDS, 0.5) /
               bu_quantile(r_decided, ROUNDS, 0.5));
  } else {
    printf("failover: a round did not complete\n");
  }
  snprintf(cmd, sizeof cmd,
           "scripts/pg_tmp.sh stop '%s' >/dev/null; rm -rf '%s' '%s'", dir,
           dir, base);
  if (system(cmd) != 0)
    return 1;
  return rc;
}
