/* SPDX-License-Identifier: MIT */
/* agent_ctx.c — one ZeroMQ context per process, shared by its agents
 * (several ranks in one process would otherwise start one ZeroMQ I/O
 * thread each); terminated with its last agent. */
#include <pthread.h>
#include <zmq.h>

#include "agent_priv.h"

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static void *shared_ctx;
static unsigned shared_refs;

void *gnmr__ctx_acquire(void) {
  pthread_mutex_lock(&ctx_mu);
  if (shared_ctx == NULL && (shared_ctx = zmq_ctx_new()) != NULL) {
    /* 5 sockets per agent: the default of 1023 would cap a process at
     * about 200 agents (ranks simulated in one process, say) */
    int limit = zmq_ctx_get(shared_ctx, ZMQ_SOCKET_LIMIT);
    if (limit > 0)
      zmq_ctx_set(shared_ctx, ZMQ_MAX_SOCKETS, limit);
  }
  void *c = shared_ctx;
  if (c != NULL)
    shared_refs++;
  pthread_mutex_unlock(&ctx_mu);
  return c;
}

void gnmr__ctx_after_fork(void) {
  pthread_mutex_init(&ctx_mu, NULL);
  shared_ctx = NULL; /* the parent's: left alone */
  shared_refs = 0;
}

/* Terminates the context with its last agent (all sockets closed). */
void gnmr__ctx_release(void) {
  pthread_mutex_lock(&ctx_mu);
  if (--shared_refs == 0) {
    zmq_ctx_term(shared_ctx);
    shared_ctx = NULL;
  }
  pthread_mutex_unlock(&ctx_mu);
}

