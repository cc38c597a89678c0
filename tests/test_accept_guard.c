/* SPDX-License-Identifier: MIT */
/* test_accept_guard.c — gnmrd's accept4 out of descriptors: the waiting
 * connection is shed (its peer sees it end), the caller is told
 * ECONNABORTED, never EMFILE, and the next accept with a descriptor free
 * works; gnmrd itself exports the definition, so libzmq binds to it. */
#include <check.h>

#include "check_main.h"
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accept_guard.h"
#include "testutil.h"

static int listener(struct sockaddr_un *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  snprintf(sa->sun_path, sizeof sa->sun_path, "%s/l.sock", tu_tmpdir());
  int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ck_assert_int_ge(l, 0);
  ck_assert_int_eq(bind(l, (struct sockaddr *)sa, sizeof *sa), 0);
  ck_assert_int_eq(listen(l, 8), 0);
  return l;
}

/* A child, forked while descriptors are free, that connects when told
 * (a byte on its pipe) and exits 0 once the connection ends (EOF), 1 if
 * it got a byte, 2 if it could not connect. */
typedef struct {
  pid_t pid;
  int go;
} peer;

static peer peer_start(const struct sockaddr_un *sa) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char b;
    close(p[1]);
    if (read(p[0], &b, 1) != 1)
      _exit(3);
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (const struct sockaddr *)sa, sizeof *sa) != 0)
      _exit(2);
    _exit(read(c, &b, 1) == 0 ? 0 : 1);
  }
  close(p[0]);
  return (peer){pid, p[1]};
}

/* Tells the peer to connect (the pipe stays open: closed, it would free
 * a descriptor). */
static void peer_go(peer *pe) {
  ck_assert_int_eq(write(pe->go, "g", 1), 1);
}

/* The peer's exit status, once it is done. */
static int peer_status(peer *pe) {
  int st;
  ck_assert_int_eq(waitpid(pe->pid, &st, 0), pe->pid);
  close(pe->go);
  ck_assert_msg(WIFEXITED(st), "the peer was killed (status %d)", st);
  return WEXITSTATUS(st);
}

/* Until the child's connection waits on l (or the child is gone). */
static void wait_pending(int l, pid_t child) {
  struct pollfd p = {.fd = l, .events = POLLIN};
  for (int i = 0; i < 200; i++) {
    if (poll(&p, 1, 50) == 1)
      return;
    int st;
    ck_assert_msg(waitpid(child, &st, WNOHANG) == 0,
                  "the peer ended before connecting (status %d)", st);
  }
  ck_abort_msg("no connection came in 10 s");
}

START_TEST(out_of_descriptors_a_connection_is_shed_not_fatal) {
  /* the soft limit only: valgrind refuses a new hard one */
  struct rlimit rl;
  ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = 64;
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  struct sockaddr_un sa;
  int l = listener(&sa); /* non-blocking, as libzmq's and libuv's are */
  ck_assert_int_eq(accept_guard_init(), 0);
  /* under valgrind, which keeps descriptors of its own above the soft
   * limit, valgrind itself closes the one accepted past it and answers
   * EMFILE, so the guard has nothing left to shed: it still must not
   * answer EMFILE */
  unsigned long shed0 = accept_guard_shed(),
                by_guard = getenv("GNMR_VALGRIND") ? 0 : 1;
  peer pe[3] = {peer_start(&sa), peer_start(&sa), peer_start(&sa)};
  int fill[64], n = 0;
#define REFILL() /* every free descriptor taken */                         \
  do {                                                                     \
    while (n < 64 && (fill[n] = dup(0)) >= 0)                              \
      n++;                                                                 \
    ck_assert_int_eq(errno, EMFILE);                                       \
  } while (0)
  REFILL();
  ck_assert_int_gt(n, 0);
  peer_go(&pe[0]);
  wait_pending(l, pe[0].pid);
  errno = 0;
  ck_assert_int_eq(accept4(l, NULL, NULL, SOCK_CLOEXEC), -1);
  ck_assert_int_eq(errno, ECONNABORTED); /* not EMFILE: libzmq would abort */
  ck_assert_uint_eq(accept_guard_shed() - shed0, by_guard);
  ck_assert_msg(peer_status(&pe[0]) == 0,
                "the shed peer did not see its connection end");
  REFILL(); /* its pipe's place */
  /* the reserve was taken back: the next one is shed too (accept(2)) */
  peer_go(&pe[1]);
  wait_pending(l, pe[1].pid);
  ck_assert_int_eq(accept(l, NULL, NULL), -1);
  ck_assert_int_eq(errno, ECONNABORTED);
  ck_assert_uint_eq(accept_guard_shed() - shed0, 2 * by_guard);
  ck_assert_int_eq(peer_status(&pe[1]), 0);
  REFILL();
  /* with a descriptor free, accepted as usual */
  close(fill[--n]);
  peer_go(&pe[2]);
  wait_pending(l, pe[2].pid);
  int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
  ck_assert_int_ge(c, 0);
  ck_assert_uint_eq(accept_guard_shed() - shed0, 2 * by_guard);
  ck_assert_int_eq(write(c, "x", 1), 1);
  ck_assert_int_eq(peer_status(&pe[2]), 1); /* it got the byte */
  close(c);
  while (n > 0)
    close(fill[--n]);
  close(l);
  unlink(sa.sun_path);
  *strrchr(sa.sun_path, '/') = '\0';
  rmdir(sa.sun_path);
#undef REFILL
}
END_TEST

START_TEST(other_errors_pass_through_unchanged) {
  unsigned long shed0 = accept_guard_shed();
  errno = 0;
  ck_assert_int_eq(accept4(0x7ffffff, NULL, NULL, 0), -1);
  ck_assert_int_eq(errno, EBADF);
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  ck_assert_int_eq(accept4(fd[0], NULL, NULL, 0), -1);
  ck_assert_int_eq(errno, ENOTSOCK);
  ck_assert_uint_eq(accept_guard_shed(), shed0);
  close(fd[0]);
  close(fd[1]);
}
END_TEST

/* libzmq (a shared library) binds accept4 to gnmrd's definition only if
 * gnmrd exports it: hidden, the guard would silently not be used. */
START_TEST(gnmrd_exports_the_guard) {
  char cmd[1200], line[256];
  snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s/gnmrd' 2>&1",
           tu_bin_dir());
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  int a4 = 0, a = 0;
  while (fgets(line, sizeof line, f)) {
    a4 |= strstr(line, " T accept4\n") != NULL;
    a |= strstr(line, " T accept\n") != NULL;
  }
  ck_assert_int_eq(pclose(f), 0);
  ck_assert_msg(a4 && a, "gnmrd does not export accept4/accept (%d, %d)",
                a4, a);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("accept-guard");
  TCase *tc = tcase_create("guard");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, out_of_descriptors_a_connection_is_shed_not_fatal);
  tcase_add_test(tc, other_errors_pass_through_unchanged);
  tcase_add_test(tc, gnmrd_exports_the_guard);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_check_main(suite()); }
