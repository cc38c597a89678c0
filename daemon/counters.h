/* SPDX-License-Identifier: MIT */
/* counters.h — gnmrd's counters, one table for the struct and the names
 * that the admin service reports (gnmrctl stats). Loop thread only. */
#ifndef GNMRD_COUNTERS_H
#define GNMRD_COUNTERS_H

#include <stdint.h>

#define GNMRD_COUNTERS(XX)                                                   \
  XX(messages_in)        /* frames sets received on the agent socket */      \
  XX(bad_frames)         /* not [identity][payload] */                        \
  XX(decode_errors)      /* payload is not an envelope */                     \
  XX(version_errors)     /* wrong protocol version */                         \
  XX(unsupported)        /* empty body, or a body we do not handle */        \
  XX(hellos)                                                                  \
  XX(hellos_refused)                                                          \
  XX(jobs_created)                                                            \
  XX(jobs_finished)                                                           \
  XX(reports)            /* accepted reports */                               \
  XX(reports_refused)    /* answered with an Error */                         \
  XX(unknown_agent)      /* report from a connection that sent no Hello */    \
  XX(duplicate_reports)                                                       \
  XX(late_reports)       /* for a decided step: dropped */                    \
  XX(future_reports)     /* too far ahead of the last decided step */         \
  XX(steps_decided)                                                           \
  XX(republish_refused)  /* a second decision for a step of the same pass */  \
  XX(deadline_decisions) /* decided by the barrier deadline */                \
  XX(missing_units)      /* unit-steps decided with a missing shard */        \
  XX(decisions_sent)                                                          \
  XX(send_failures)      /* peer gone or its queue full */                    \
  XX(byes)                                                                    \
  XX(admin_requests)                                                          \
  XX(auth_denied)        /* CURVE keys the ZAP handler refused */             \
  XX(handshake_failures) /* every refusal below, added up */                \
  XX(refused_plaintext)  /* a peer without CURVE on a CURVE socket */        \
  XX(refused_server_key) /* a CURVE peer expecting another server key */     \
  XX(refused_client_key) /* a CURVE key the allow list does not hold */      \
  XX(refused_junk)       /* other failed handshakes: not ZMTP, cut short */ \
  XX(refused_max_jobs)   /* a Hello for a new job beyond [limits] max_jobs */ \
  XX(refused_max_units)  /* units beyond [limits] max_units */               \
  XX(refused_max_total_units) /* units beyond [limits] max_total_units */   \
  XX(refused_key_jobs)   /* a new job beyond [limits] max_jobs_per_key */    \
  XX(refused_key_units)  /* units beyond [limits] max_units_per_key */       \
  XX(refused_max_held)   /* a report beyond [limits] max_held_mb */          \
  XX(refused_connections) /* a connection past [limits] max_connections,    \
                            or none accepted: no descriptor left */         \
  XX(jobs_retired)       /* no report for [limits] job_idle_s */            \
  XX(worker_steps)       /* steps decided on a worker thread ([gnmrd]       \
                            workers) */                                     \
  XX(snapshots_early)    /* large snapshots serialized on a worker at once */ \
  XX(snapshots_deferred) /* steps whose due snapshot waited for the store  \
                            to finish the job's last one */

typedef struct gnmrd_counters {
#define GNMRD__COUNTER_FIELD(name) uint64_t name;
  GNMRD_COUNTERS(GNMRD__COUNTER_FIELD)
#undef GNMRD__COUNTER_FIELD
} gnmrd_counters;

#endif /* GNMRD_COUNTERS_H */
