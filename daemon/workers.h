/* SPDX-License-Identifier: MIT */
/* workers.h — a fixed pool of threads that run tasks for the loop: a task
 * runs on a worker, then its done callback runs on the loop thread (woken
 * by a uv_async). gnmrd hands it the arithmetic of a large job's step
 * (jobs.c), so jobs decide on several cores while the loop keeps reading
 * reports. The loop may also wait for one task (workers_wait) when it
 * must touch what the task touches; its done callback then runs at once,
 * so a task's done runs exactly once, always on the loop. */
#ifndef GNMRD_WORKERS_H
#define GNMRD_WORKERS_H

#include <uv.h>

typedef struct workers workers;

typedef struct workers_task {
  void (*run)(struct workers_task *);  /* on a worker thread */
  void (*done)(struct workers_task *); /* then on the loop thread */
  /* the pool's */
  struct workers_task *next;
  int state; /* under the pool's mutex */
  int busy;  /* the loop's: submitted, done not yet run */
} workers_task;

/* Starts n threads (1..WORKERS_MAX). Returns NULL on failure (no memory,
 * no thread): callers then run tasks on the loop. */
#define WORKERS_MAX 256u
workers *workers_new(uv_loop_t *loop, unsigned n);
unsigned workers_count(const workers *w);
/* Queues t (its run and done set; not already queued). Loop thread. */
void workers_submit(workers *w, workers_task *t);
/* Whether t is queued, running, or finished with its done not yet run. */
int workers_busy(const workers_task *t);
/* Waits until t has run and runs its done now, if t is busy. Loop
 * thread; done may queue t again (callers loop on workers_busy). */
void workers_wait(workers *w, workers_task *t);
/* Stops the threads and closes the async handle through the loop (the
 * pool is freed in its close callback). Call it with no task busy. */
void workers_close(workers **wp);

#endif /* GNMRD_WORKERS_H */
