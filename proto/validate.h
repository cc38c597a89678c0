/* SPDX-License-Identifier: MIT */
/* validate.h — the checks of incoming messages that need no daemon state
 * (docs/protocol.md): pure functions, so that they are fuzzed and tested on
 * their own. gnmrd adds the checks against its jobs. */
#ifndef GNMR_VALIDATE_H
#define GNMR_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "params.h"
#include "proto/gnmr.pb-c.h"

#define GNMR_MAX_REPORTERS 4096u
#define GNMR_MAX_AGENT_UNITS (1u << 20)
#define GNMR_DEFAULT_BARRIER_MS 1000u
#define GNMR_MAX_JOB_NAME 128u  /* bytes; see text.h for the characters */
#define GNMR_MAX_UNIT_NAME 256u
/* The largest step a report, a filter or a Decision may carry: the store
 * keeps steps as SQL integers (signed 64-bit), and a job's last step
 * leaves room for CORE_MAX_AHEAD (1024) more. */
#define GNMR_MAX_STEP ((uint64_t)INT64_MAX - 1024u)
/* The most decisions an agent holds for gnmrd (Hello.held): those it
 * received that gnmrd had not yet said were committed. */
#define GNMR_MAX_HELD 1024u
/* The most active ids (and scores, which agents drop) all held decisions
 * of one Hello may carry: 1024 decisions of 1024 active units each. A
 * Hello is decoded before it is checked, so the message size cap bounds
 * what a peer makes gnmrd decode; this bounds what it makes gnmrd keep,
 * store and send on. */
#define GNMR_MAX_HELD_IDS (1u << 20)

/* Checks a Hello on its own: protocol, job name, rank/reporters, unit
 * names (printable, unique), unit_ids, parameters, barrier, the held
 * decisions (at most GNMR_MAX_HELD, of the Hello's job, each with a run,
 * a pass and a step in range, in ascending (pass, step) order, active ids
 * ascending). A Hello
 * without parameters takes *defaults (NULL: refused); barrier_ms 0 takes
 * default_barrier. On success fills *prm and *barrier_ms. On error returns
 * a GNMR_E_* code, points *ref at the field and writes msg. */
int gnmr__validate_hello(const Gnmr__Hello *h, const policy_params *defaults,
                         uint32_t default_barrier, policy_params *prm,
                         uint32_t *barrier_ms, const char **ref, char *msg,
                         size_t msglen);

/* Checks a Report against the n_units of its rank: array lengths, sums of
 * squares >= 0 (NaN refused), step >= 1. Same error convention. */
/* A large Hello's duplicate unit names found in its bytes, before it is
 * decoded (issue 62: a flood of 2^20-unit Hellos refused only after
 * decoding held the places that take them in for seconds each): one
 * pass over the names with the keyed hash and no copy of any, where the
 * decoder allocates each. GNMR_E_DUP with the decoder's own message when
 * a name is certainly listed twice (and valid, so that the message
 * carries no byte a name may not have); GNMR_OK otherwise: no duplicate,
 * or bytes this scan does not read as a plain Hello, which the decoder
 * then judges. A Hello with a duplicate and another fault is refused for
 * the duplicate. */
int gnmr__hello_bytes_dup(const void *buf, size_t len, const char **ref,
                          char *msg, size_t msglen);

int gnmr__validate_report(const Gnmr__Report *r, uint32_t n_units,
                          const char **ref, char *msg, size_t msglen);

#endif /* GNMR_VALIDATE_H */
