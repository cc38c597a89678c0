/* SPDX-License-Identifier: MIT */
/* config.h — gnmrd's settings: built-in defaults, then an INI file
 * (--config FILE, read with libinih), then command-line flags. One table in
 * config.c lists every key with its section, kind and limits. */
#ifndef GNMRD_CONFIG_H
#define GNMRD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "policy.h"

typedef struct gnmrd_config {
  char data_dir[1024];
  char store[1024];      /* a postgresql:// URL, or "": SQLite in data_dir */
  uint64_t standby;      /* wait for the store's leadership (PostgreSQL) */
  char agents[1024];
  char admin[1024];
  char metrics[256];     /* HOST:PORT of the Prometheus endpoint, or "" */
  int log_level;
  uint64_t max_msg;
  uint64_t snapshot_every;
  uint64_t retain_steps;
  uint64_t barrier_ms;   /* for Hellos that give none */
  uint64_t workers;      /* threads deciding large steps (0: derived from
                            the CPUs gnmrd may run on, main.c) */
  policy_params policy;  /* for Hellos that carry no parameters */
  char curve_key_file[1024];   /* the server's key pair: CURVE on */
  char curve_allow_file[1024]; /* the public keys allowed in */
  uint64_t insecure;           /* allow non-loopback TCP without CURVE */
  /* [limits]: what one peer can make gnmrd hold (each refusal counted) */
  uint64_t max_jobs;     /* live jobs */
  uint64_t max_units;    /* units of one job, the largest unit id + 1 */
  uint64_t max_total_units; /* the same summed over every job */
  uint64_t max_jobs_per_key;  /* with tenancy: live jobs one agent key owns
                                 (0: no limit but max_jobs) */
  uint64_t max_units_per_key; /* the units of those jobs, summed (0: no
                                 limit but max_total_units) */
  uint64_t max_held_mb;  /* reports held for undecided steps, all jobs */
  uint64_t job_idle_s;   /* a job with no report for this long is retired
                            (0: never) */
  uint64_t store_queue_mb; /* records waiting for the store (a database
                              away), beyond which new ones are dropped */
  uint64_t first_message_ms; /* a connection's first message within this
                                (0: no deadline; default 10000) */
  uint64_t max_connections; /* agent connections at once (0: derived from
                               the descriptor limit, main.c) */
} gnmrd_config;

/* The built-in defaults, from the key table (paths empty: main.c
 * derives them). */
void config_defaults(gnmrd_config *c);

/* Every key, one a line: "section.key<TAB>default<TAB>help" (default
 * empty: none, or derived at start); the policy's parameters under
 * [policy] by their names. gnmrd --config-keys. */
void config_print_keys(FILE *f);

/* Reads path into c (keys present override). On error returns
 * GNMR_E_PARSE (or GNMR_E_IO) with "PATH:LINE: ..." in err and leaves c
 * partly updated: callers stop. */
int config_load(const char *path, gnmrd_config *c, char *err, size_t errlen);

/* The same from a NUL-terminated buffer (name is used in messages). */
int config_load_string(const char *text, const char *name, gnmrd_config *c,
                       char *err, size_t errlen);

/* Applies one setting as if read from the file: used for flags. */
int config_set(gnmrd_config *c, const char *section, const char *key,
               const char *value, char *err, size_t errlen);

#endif /* GNMRD_CONFIG_H */
