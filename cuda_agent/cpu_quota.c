/* SPDX-License-Identifier: MIT */
/* cpu_quota.c — how many CPUs the process's cgroup lets it use, for
 * gnmr_agent_wait's spinning (agent.c): a container limited to 2 CPUs of a
 * 64-CPU host sees 64 in its affinity mask, and a spinning wait there
 * would take CPU time from its own quota that the round trip needs.
 *
 * cgroup v2: the "0::PATH" line of /proc/self/cgroup, ROOT/PATH/cpu.max
 * ("QUOTA PERIOD" or "max PERIOD"). v1: the line whose controllers
 * include "cpu", ROOT/cpu/PATH/cpu.cfs_quota_us (-1: none) and
 * cpu.cfs_period_us. Each directory from PATH up to the mount is read and
 * the tightest limit wins: a parent's quota binds its children, and in a
 * container the mount itself is the container's cgroup while PATH may be
 * the host's name for it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_priv.h"
#include "num.h"

/* The first line of a file into buf (NUL-terminated, newline dropped);
 * 0 on success. */
static int read_line(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return -1;
  int ok = fgets(buf, (int)cap, f) != NULL;
  fclose(f);
  if (!ok)
    return -1;
  buf[strcspn(buf, "\n")] = '\0';
  return 0;
}

/* CPUs of a quota over a period, rounded down, at least 1; 0 for none. */
static unsigned cpus_of(uint64_t quota, uint64_t period) {
  if (period == 0)
    return 0;
  uint64_t n = quota / period;
  return n < 1 ? 1 : n > 65536 ? 65536 : (unsigned)n;
}

/* The limit set in one cgroup directory (v2 or v1), 0 for none. */
static unsigned dir_cpus(const char *dir, int v2) {
  char path[4200], line[128];
  uint64_t q, p;
  if (v2) {
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    if (read_line(path, line, sizeof line) != 0)
      return 0;
    char *sp = strchr(line, ' ');
    if (sp == NULL || strncmp(line, "max", 3) == 0)
      return 0;
    *sp = '\0';
    if (gnmr__parse_u64(line, UINT64_MAX, &q) != 0 ||
        gnmr__parse_u64(sp + 1, UINT64_MAX, &p) != 0)
      return 0;
    return cpus_of(q, p);
  }
  snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  if (read_line(path, line, sizeof line) != 0 || line[0] == '-' ||
      gnmr__parse_u64(line, UINT64_MAX, &q) != 0)
    return 0; /* -1: no quota */
  snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (read_line(path, line, sizeof line) != 0 ||
      gnmr__parse_u64(line, UINT64_MAX, &p) != 0)
    return 0;
  return cpus_of(q, p);
}

/* The tightest limit from base/rel up to base. */
static unsigned walk(const char *base, const char *rel, int v2) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s%s", base, rel) >= (int)sizeof dir)
    return 0;
  size_t floor_len = strlen(base);
  unsigned best = 0;
  for (;;) {
    unsigned n = dir_cpus(dir, v2);
    if (n != 0 && (best == 0 || n < best))
      best = n;
    char *slash = strrchr(dir, '/');
    if (slash == NULL || (size_t)(slash - dir) < floor_len)
      break;
    *slash = '\0';
  }
  return best;
}

/* Whether the comma-separated list has "cpu" as an element. */
static int has_cpu(const char *list, size_t n) {
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && list[j] != ',')
      j++;
    if (j - i == 3 && memcmp(list + i, "cpu", 3) == 0)
      return 1;
    i = j + 1;
  }
  return 0;
}

unsigned gnmr__cgroup_cpus(const char *root, const char *cgroup_text) {
  if (root == NULL || cgroup_text == NULL)
    return 0;
  unsigned best = 0;
  for (const char *l = cgroup_text; *l != '\0';) {
    const char *end = strchr(l, '\n');
    size_t len = end ? (size_t)(end - l) : strlen(l);
    /* HIERARCHY:CONTROLLERS:PATH */
    const char *c1 = memchr(l, ':', len);
    const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - l))
                        : NULL;
    if (c2 != NULL && c2[1] == '/') {
      char rel[2048], base[2200];
      size_t rl = len - (size_t)(c2 + 1 - l);
      if (rl < sizeof rel) {
        memcpy(rel, c2 + 1, rl);
        rel[rl] = '\0';
        if (rl > 1 && rel[rl - 1] == '/')
          rel[rl - 1] = '\0';
        if (strcmp(rel, "/") == 0)
          rel[0] = '\0';
        unsigned n = 0;
        if (c1 - l == 1 && l[0] == '0' && c2 == c1 + 1) { /* v2 */
          n = walk(root, rel, 1);
        } else if (has_cpu(c1 + 1, (size_t)(c2 - c1 - 1))) { /* v1 */
          snprintf(base, sizeof base, "%s/cpu", root);
          n = walk(base, rel, 0);
        }
        if (n != 0 && (best == 0 || n < best))
          best = n;
      }
    }
    if (end == NULL)
      break;
    l = end + 1;
  }
  return best;
}

unsigned gnmr__process_cgroup_cpus(void) {
  char text[8192];
  FILE *f = fopen("/proc/self/cgroup", "re");
  if (f == NULL)
    return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return gnmr__cgroup_cpus("/sys/fs/cgroup", text);
}
