/* SPDX-License-Identifier: MIT */
/* accept_guard.c — gnmrd's accept4(2), so that running out of descriptors
 * sheds one connection instead of ending the process (see accept_guard.h).
 *
 * libzmq 4.3's ipc listener asserts on any accept4 error but EAGAIN,
 * EINTR, ECONNABORTED, EPROTO and ENFILE: EMFILE aborts gnmrd
 * ("Too many open files (ipc_listener.cpp:327)"). The connection cap
 * (server.c) keeps gnmrd below its descriptor limit, but it is applied on
 * the loop thread, after ZeroMQ's I/O thread has accepted: a flood that
 * arrives while the loop is busy (a store commit, a slow disk) can take
 * the last descriptors first. So gnmrd defines accept4 itself; the
 * dynamic linker binds libzmq's (and libuv's) calls to this definition,
 * as the executable comes first in symbol lookup.
 *
 * On EMFILE or ENFILE it does what libuv does for its own listeners: it
 * closes a descriptor kept in reserve, accepts the waiting connection
 * into it, closes that at once (the peer sees the connection end and
 * retries later), takes the reserve again, and answers ECONNABORTED,
 * which every caller treats as "this one went away, go on". ZeroMQ then
 * reports ZMQ_EVENT_ACCEPT_FAILED, which gnmrd counts as a refused
 * connection. */
#include "accept_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t reserve_lock = PTHREAD_MUTEX_INITIALIZER;
static int reserve = -1;         /* a descriptor kept for the shedding */
static atomic_ulong shed_count;  /* connections shed so far */

static int open_reserve(void) {
  return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int accept_guard_init(void) {
  pthread_mutex_lock(&reserve_lock);
  if (reserve < 0)
    reserve = open_reserve();
  int ok = reserve >= 0;
  pthread_mutex_unlock(&reserve_lock);
  return ok ? 0 : -1;
}

unsigned long accept_guard_shed(void) { return atomic_load(&shed_count); }

/* The connection waiting on fd, accepted into the reserve's place and
 * closed; the reserve taken back. Without a reserve (never taken, or the
 * system itself out of descriptors) nothing is shed: the caller is told
 * ECONNABORTED all the same and tries again when it is woken. */
static void shed_one(int fd) {
  pthread_mutex_lock(&reserve_lock);
  if (reserve >= 0) {
    close(reserve);
    long c = syscall(SYS_accept4, fd, NULL, NULL, SOCK_CLOEXEC);
    if (c >= 0) {
      close((int)c);
      atomic_fetch_add(&shed_count, 1);
    }
    reserve = open_reserve();
  }
  pthread_mutex_unlock(&reserve_lock);
}

__attribute__((visibility("default"))) int
accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
  long r = syscall(SYS_accept4, fd, addr, len, flags);
  if (r >= 0)
    return (int)r;
  if (errno != EMFILE && errno != ENFILE)
    return -1;
  shed_one(fd);
  errno = ECONNABORTED;
  return -1;
}

__attribute__((visibility("default"))) int
accept(int fd, struct sockaddr *addr, socklen_t *len) {
  return accept4(fd, addr, len, 0);
}
