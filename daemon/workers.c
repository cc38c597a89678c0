/* SPDX-License-Identifier: MIT */
/* workers.c — the loop's thread pool (workers.h). One mutex guards the
 * queue, the finished list and every task's state; a worker signals `fin`
 * when a task finishes, for workers_wait(). The loop learns of finished
 * tasks through one uv_async and runs their dones one at a time, taking
 * each off the list under the mutex: a done may wait for, or queue, any
 * task, this one included. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "workers.h"

enum { T_IDLE = 0, T_QUEUED, T_RUNNING, T_FINISHED };

struct workers {
  uv_async_t async;
  pthread_mutex_t mu;
  pthread_cond_t work; /* a task was queued, or stop */
  pthread_cond_t fin;  /* a task finished */
  workers_task *head, *tail; /* queued, in order */
  workers_task *finished;    /* finished, done not run (any order) */
  int stop;
  unsigned n;
  pthread_t th[];
};

static void *worker_main(void *arg) {
  workers *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->head == NULL && !w->stop)
      pthread_cond_wait(&w->work, &w->mu);
    if (w->head == NULL)
      break; /* stop, and nothing queued */
    workers_task *t = w->head;
    w->head = t->next;
    if (w->head == NULL)
      w->tail = NULL;
    t->state = T_RUNNING;
    pthread_mutex_unlock(&w->mu);
    t->run(t);
    pthread_mutex_lock(&w->mu);
    t->state = T_FINISHED;
    t->next = w->finished;
    w->finished = t;
    pthread_cond_broadcast(&w->fin);
    uv_async_send(&w->async);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Takes t off the finished list (w->mu held). */
static void unlink_finished(workers *w, workers_task *t) {
  for (workers_task **pp = &w->finished; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      break;
    }
  t->next = NULL;
  t->state = T_IDLE;
}

static void async_cb(uv_async_t *h) {
  workers *w = h->data;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    workers_task *t = w->finished;
    if (t != NULL)
      unlink_finished(w, t);
    pthread_mutex_unlock(&w->mu);
    if (t == NULL)
      break;
    t->busy = 0;
    t->done(t);
  }
}

workers *workers_new(uv_loop_t *loop, unsigned n) {
  if (n == 0 || n > WORKERS_MAX)
    return NULL;
  workers *w = calloc(1, sizeof *w + n * sizeof w->th[0]);
  if (w == NULL)
    return NULL;
  if (uv_async_init(loop, &w->async, async_cb) != 0) {
    free(w);
    return NULL;
  }
  w->async.data = w;
  uv_unref((uv_handle_t *)&w->async); /* the pool keeps no loop alive */
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->work, NULL);
  pthread_cond_init(&w->fin, NULL);
  for (; w->n < n; w->n++) {
    if (pthread_create(&w->th[w->n], NULL, worker_main, w) != 0)
      break;
    char name[16];
    snprintf(name, sizeof name, "gnmrd-work/%u", w->n);
    pthread_setname_np(w->th[w->n], name);
  }
  if (w->n == 0) {
    workers_close(&w);
    return NULL;
  }
  return w;
}

unsigned workers_count(const workers *w) { return w ? w->n : 0; }

void workers_submit(workers *w, workers_task *t) {
  pthread_mutex_lock(&w->mu);
  assert(t->state == T_IDLE && !t->busy);
  t->busy = 1;
  t->state = T_QUEUED;
  t->next = NULL;
  if (w->tail)
    w->tail->next = t;
  else
    w->head = t;
  w->tail = t;
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->mu);
}

int workers_busy(const workers_task *t) { return t->busy; }

void workers_wait(workers *w, workers_task *t) {
  if (!t->busy)
    return;
  pthread_mutex_lock(&w->mu);
  while (t->state != T_FINISHED)
    pthread_cond_wait(&w->fin, &w->mu);
  unlink_finished(w, t);
  pthread_mutex_unlock(&w->mu);
  t->busy = 0;
  t->done(t);
}

static void closed_cb(uv_handle_t *h) {
  workers *w = h->data;
  pthread_cond_destroy(&w->work);
  pthread_cond_destroy(&w->fin);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

void workers_close(workers **wp) {
  workers *w = *wp;
  if (w == NULL)
    return;
  *wp = NULL;
  pthread_mutex_lock(&w->mu);
  assert(w->head == NULL && w->finished == NULL);
  w->stop = 1;
  pthread_cond_broadcast(&w->work);
  pthread_mutex_unlock(&w->mu);
  for (unsigned i = 0; i < w->n; i++)
    pthread_join(w->th[i], NULL);
  uv_close((uv_handle_t *)&w->async, closed_cb);
}
