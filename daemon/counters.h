/* SPDX-License-Identifier: MIT */
/* counters.h — gnmrd's counters: one table for the struct, the names that
 * the admin service reports (gnmrctl stats) and the /metrics families,
 * with their help. Loop thread only. */
#ifndef GNMRD_COUNTERS_H
#define GNMRD_COUNTERS_H

#include <stdint.h>

/* XX(field, metric, labels, help): the struct's field (and the name
 * `gnmrctl stats` shows), its Prometheus family on /metrics
 * (gnmr_METRIC_total, a counter), the labels that tell it apart in that
 * family ("" for a family of its own) and its help. A family's first row
 * gives the family's HELP line: see metrics.c's FAMILY_HELP for those of
 * more than one row. */
#define GNMRD_COUNTERS(XX)                                                     \
  XX(messages_in, "messages_in", "",                                           \
     "Frame sets received on the agents socket.")                              \
  XX(bad_frames, "rejected", "reason=\"bad_frames\"",                          \
     "Frame sets that are not [identity][payload].")                           \
  XX(decode_errors, "rejected", "reason=\"decode\"",                           \
     "Payloads that are not an envelope.")                                     \
  XX(version_errors, "rejected", "reason=\"version\"",                         \
     "Envelopes of another protocol version.")                                 \
  XX(unsupported, "rejected", "reason=\"unsupported\"",                        \
     "Envelopes with an empty body or one gnmrd does not handle.")             \
  XX(hellos, "hellos", "", "Hellos received.")                                 \
  XX(hellos_refused, "rejected", "reason=\"hello\"",                           \
     "Hellos answered with an Error.")                                         \
  XX(hellos_away, "hellos_away", "",                                           \
     "Hellos over 1 MiB, decoded and checked off the loop.")                   \
  XX(hellos_away_busy, "hellos_away_busy", "",                                 \
     "Hellos over 1 MiB answered BUSY: 4 away at once, one a connection, "    \
     "two a key under tenancy.")                                              \
  XX(jobs_created, "jobs_created", "", "Jobs created by a first Hello.")       \
  XX(jobs_finished, "jobs_finished", "", "Jobs whose every rank said Bye.")    \
  XX(reports, "reports", "", "Reports accepted.")                              \
  XX(reports_refused, "rejected", "reason=\"report\"",                         \
     "Reports answered with an Error.")                                        \
  XX(unknown_agent, "rejected", "reason=\"unknown_agent\"",                    \
     "Reports from a connection that sent no Hello.")                          \
  XX(reports_oversized, "rejected", "reason=\"oversized\"",                   \
     "Reports longer than their rank's units can need, refused undecoded.")   \
  XX(duplicate_reports, "rejected", "reason=\"duplicate\"",                    \
     "Second reports of a rank for one step.")                                 \
  XX(late_reports, "late_reports", "",                                         \
     "Reports for steps already decided (dropped).")                           \
  XX(future_reports, "rejected", "reason=\"future\"",                          \
     "Reports too far ahead of the last decided step.")                        \
  XX(steps_decided, "steps_decided", "", "Steps decided.")                     \
  XX(republish_refused, "republish_refused", "",                               \
     "Second decisions refused for a step of the same pass.")                  \
  XX(decisions_restored, "decisions_restored", "",                             \
     "Decisions agents held across a restart, stored after it.")               \
  XX(held_conflicts, "held_conflicts", "",                                     \
     "Held decisions for steps decided again before their agent came back.")   \
  XX(held_refused, "held_refused", "",                                         \
     "Held decisions refused: not sealed by this store's gnmrd, from an "      \
     "observer, or naming units the job does not have.")                       \
  XX(lease_pauses, "lease_pauses", "",                                         \
     "Times deciding paused: the store's leadership lease ran out.")          \
  XX(lease_unsent, "lease_unsent", "",                                         \
     "Decisions not sent: finished after the leadership lease ran out.")       \
  XX(admin_queries_refused, "admin_queries_refused", "",                       \
     "History queries refused: their connection had 8 in progress.")          \
  XX(resumes_busy, "resumes_busy", "",                                         \
     "Resume Hellos answered BUSY for want of a read place: 8 reads at "      \
     "once, one a connection, two a key under tenancy.")                      \
  XX(durable_waits, "durable_waits", "",                                       \
     "Times a job's next step waited because as many of its decisions as "    \
     "its agents hold were sent and not yet committed.")                       \
  XX(deadline_decisions, "deadline_decisions", "",                             \
     "Steps decided by the barrier deadline.")                                 \
  XX(missing_units, "missing_unit_steps", "",                                  \
     "Unit-steps decided with a shard missing.")                               \
  XX(decisions_sent, "decisions_sent", "", "Decisions sent to ranks.")         \
  XX(send_failures, "send_failures", "",                                       \
     "Messages not sent (peer gone or its queue full).")                       \
  XX(byes, "byes", "", "Byes received.")                                       \
  XX(admin_requests, "admin_requests", "", "Requests on the admin socket.")    \
  XX(admin_replies_dropped, "admin_replies_dropped", "",                       \
     "Admin replies dropped: their client left 8 unread.")                     \
  XX(admin_unread_refused, "admin_unread_refused", "",                         \
     "Admin requests and replies answered BUSY: 16 MB of their client's "     \
     "replies unread, or 64 MB of every client's.")                          \
  XX(admin_deferred_refused, "admin_deferred_refused", "",                     \
     "`units` and `top` requests answered BUSY: 256 were waiting.")           \
  XX(queries_abandoned, "queries_abandoned", "",                               \
     "History queries stopped because their client had gone.")                \
  XX(auth_denied, "auth_failures", "kind=\"denied\"",                          \
     "CURVE keys the ZAP handler refused.")                                    \
  XX(handshake_failures, "auth_failures", "kind=\"handshake\"",                \
     "Failed handshakes: the refused_* kinds plaintext, server_key, "          \
     "client_key and junk added up.")                                          \
  XX(refused_plaintext, "refused", "reason=\"plaintext\"",                     \
     "Peers without CURVE on a CURVE socket.")                                 \
  XX(refused_server_key, "refused", "reason=\"server_key\"",                   \
     "CURVE peers expecting another server key.")                              \
  XX(refused_client_key, "refused", "reason=\"client_key\"",                   \
     "CURVE keys the allow list does not hold.")                               \
  XX(refused_junk, "refused", "reason=\"junk\"",                               \
     "Other failed handshakes: not ZMTP, or cut short.")                       \
  XX(refused_max_jobs, "refused", "reason=\"max_jobs\"",                       \
     "Hellos for a new job beyond [limits] max_jobs.")                         \
  XX(refused_max_units, "refused", "reason=\"max_units\"",                     \
     "Hellos with units beyond [limits] max_units.")                           \
  XX(refused_max_total_units, "refused", "reason=\"max_total_units\"",         \
     "Hellos with units beyond [limits] max_total_units.")                     \
  XX(refused_key_jobs, "refused", "reason=\"key_jobs\"",                       \
     "New jobs beyond [limits] max_jobs_per_key.")                             \
  XX(refused_key_units, "refused", "reason=\"key_units\"",                     \
     "Units beyond [limits] max_units_per_key.")                               \
  XX(refused_max_held, "refused", "reason=\"max_held\"",                       \
     "Reports beyond [limits] max_held_mb.")                                   \
  XX(refused_connections, "connections_refused", "",                           \
     "Connections past [limits] max_connections, or shed with no descriptor "  \
     "left.")                                                                  \
  XX(refused_idle, "connections_refused", "reason=\"idle\"",                  \
     "Connections closed for sending no message within [limits] "             \
     "first_message_ms.")                                                      \
  XX(refused_key_places, "connections_refused", "reason=\"key_places\"",      \
     "Admin connections of an agent key past its places, or into those "      \
     "kept for operators.")                                                    \
  XX(metrics_cut, "metrics_connections_cut", "",                               \
     "Connections to /metrics closed without a whole request in 3 s, or as "  \
     "the oldest of 32 waiting for theirs.")                                 \
  XX(jobs_retired, "jobs_retired", "",                                         \
     "Jobs retired after [limits] job_idle_s without a report.")               \
  XX(worker_steps, "worker_steps", "",                                         \
     "Steps decided on a worker thread ([gnmrd] workers).")                    \
  XX(snapshots_early, "snapshots_early", "",                                   \
     "Large snapshots serialized on a worker at once.")                        \
  XX(snapshots_deferred, "snapshots_deferred", "",                             \
     "Steps whose due snapshot waited for the store to finish the job's last " \
     "one.")

typedef struct gnmrd_counters {
#define GNMRD__COUNTER_FIELD(name, metric, labels, help) uint64_t name;
  GNMRD_COUNTERS(GNMRD__COUNTER_FIELD)
#undef GNMRD__COUNTER_FIELD
} gnmrd_counters;

#endif /* GNMRD_COUNTERS_H */
