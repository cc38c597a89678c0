/* SPDX-License-Identifier: MIT */
/* testutil.h — helpers shared by the test programs: run a GNMR binary with
 * arguments and optional stdin file, capturing exit code, stdout, stderr;
 * read files; find the binaries ($GNMR_BIN_DIR) and ../shared
 * ($GNMR_SHARED). Header-only so that each test stays one program. */
#ifndef GNMR_TESTUTIL_H
#define GNMR_TESTUTIL_H

#include <check.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct run_result {
  int code;  /* exit status, or 128 + signal */
  char *out; /* NUL-terminated, free() */
  char *err;
  size_t out_len;
} run_result;

static inline const char *tu_bin_dir(void) {
  const char *d = getenv("GNMR_BIN_DIR");
  return d ? d : "build/bin";
}

static inline const char *tu_shared(void) {
  const char *d = getenv("GNMR_SHARED");
  return d ? d : "../shared";
}

static inline char *tu_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  size_t cap = 4096, n = 0, r;
  char *b = malloc(cap + 1);
  while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
    n += r;
    if (n == cap) {
      char *nb = realloc(b, 2 * cap + 1);
      if (nb == NULL) {
        free(b);
        b = NULL;
        break;
      }
      b = nb;
      cap *= 2;
    }
  }
  fclose(f);
  if (b) {
    b[n] = '\0';
    if (len)
      *len = n;
  }
  return b;
}

static inline void tu_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  ck_assert_int_eq(fclose(f), 0);
}

/* Makes a fresh temporary directory; returns a static path. */
static inline const char *tu_tmpdir(void) {
  static char dir[64];
  strcpy(dir, "/tmp/gnmr-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  return dir;
}

/* Runs bin_dir/prog with argv (argv[0] = prog), stdin from in_path (NULL =
 * /dev/null). Output goes through temporary files (no pipe deadlocks). */
static inline run_result tu_run(const char *prog, char *const argv[],
                                const char *in_path) {
  run_result r = {0};
  char path[512], out_p[] = "/tmp/gnmr-out-XXXXXX",
                  err_p[] = "/tmp/gnmr-err-XXXXXX";
  int ofd = mkstemp(out_p), efd = mkstemp(err_p);
  ck_assert(ofd >= 0 && efd >= 0);
  int ifd = open(in_path ? in_path : "/dev/null", O_RDONLY);
  ck_assert_msg(ifd >= 0, "open %s", in_path);
  snprintf(path, sizeof path, "%s/%s", tu_bin_dir(), prog);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ifd, 0);
  posix_spawn_file_actions_adddup2(&fa, ofd, 1);
  posix_spawn_file_actions_adddup2(&fa, efd, 2);
  /* Under `make test-valgrind` (GNMR_VALGRIND set) the child runs under
   * valgrind too; its errors and leaks make it exit 99. */
  char *vargv[72];
  char *const *av = argv;
  const char *exe = path;
  if (getenv("GNMR_VALGRIND") != NULL) {
    int n = 0;
    vargv[n++] = "valgrind";
    vargv[n++] = "-q";
    vargv[n++] = "--error-exitcode=99";
    vargv[n++] = "--leak-check=full";
    vargv[n++] = "--errors-for-leak-kinds=definite,indirect";
    vargv[n++] = path;
    for (int i = 1; argv[i] != NULL && n < 71; i++)
      vargv[n++] = argv[i];
    vargv[n] = NULL;
    av = vargv;
    exe = "/usr/bin/valgrind";
  }
  pid_t pid;
  int rv = posix_spawn(&pid, exe, &fa, NULL, av, environ);
  ck_assert_msg(rv == 0, "spawn %s: %s", path, strerror(rv));
  posix_spawn_file_actions_destroy(&fa);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  close(ifd);
  close(ofd);
  close(efd);
  r.out = tu_read_file(out_p, &r.out_len);
  r.err = tu_read_file(err_p, NULL);
  unlink(out_p);
  unlink(err_p);
  ck_assert(r.out && r.err);
  return r;
}

static inline void tu_run_free(run_result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

#endif /* GNMR_TESTUTIL_H */
