/* SPDX-License-Identifier: MIT */
/* keys.c — see keys.h. Keys are checked by decoding them (zmq_z85_decode),
 * so a truncated or mistyped key is found when the file is read, not when
 * a handshake fails. */
#include "keys.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "gnmr/error.h"

int gnmr__key_valid(const char *s) {
  uint8_t raw[32];
  return s != NULL && strlen(s) == GNMR_Z85_KEY_LEN &&
         zmq_z85_decode(raw, s) != NULL;
}

/* Trims blanks and a newline in place; returns the trimmed start. */
static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' ||
                   s[n - 1] == '\t'))
    s[--n] = '\0';
  return s;
}

/* A key file others could read (a secret) or change (any key, an allow
 * list) is refused, as ssh refuses such identity files. */
static int file_private(FILE *f, const char *path, int secret, char *err,
                        size_t errlen) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  mode_t bad = secret ? (S_IRWXG | S_IRWXO) : (S_IWGRP | S_IWOTH);
  if (st.st_mode & bad) {
    snprintf(err, errlen, "%s: mode %04o: %s (chmod %s)", path,
             (unsigned)(st.st_mode & 07777),
             secret ? "a secret key must not be readable or writable by "
                      "others"
                    : "others could change it",
             secret ? "600" : "go-w");
    return GNMR_E_INVAL;
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    snprintf(err, errlen, "%s belongs to uid %u, not to this user or root",
             path, (unsigned)st.st_uid);
    return GNMR_E_INVAL;
  }
  return GNMR_OK;
}

/* Reads one line of at most cap-1 bytes into line. Returns 1 for a line,
 * 0 at the end, -1 for a longer line or one with a NUL byte (fgets would
 * split the first and cut the second, and the rest would be read as
 * something else). */
static int read_line(FILE *f, char *line, size_t cap) {
  size_t n = 0;
  int ch;
  while ((ch = getc(f)) != EOF) {
    if (ch == '\0' || n + 1 >= cap)
      return -1;
    line[n++] = (char)ch;
    if (ch == '\n')
      break;
  }
  line[n] = '\0';
  return n > 0 ? 1 : 0;
}

int gnmr__key_file_read(const char *path, char *pub, char *sec, char *err,
                        size_t errlen) {
  FILE *f = fopen(path, "r");
  char line[256];
  int have_pub = 0, have_sec = 0, n = 0, rv;
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  if ((rv = file_private(f, path, 0, err, errlen)) != GNMR_OK) {
    fclose(f);
    return rv;
  }
  while ((rv = read_line(f, line, sizeof line)) != 0) {
    n++;
    if (rv < 0) {
      snprintf(err, errlen, "%s:%d: a NUL byte or a line longer than %zu "
                            "bytes", path, n, sizeof line - 1);
      fclose(f);
      return GNMR_E_PARSE;
    }
    char *s = trim(line), *eq;
    if (*s == '\0' || *s == '#')
      continue;
    if ((eq = strchr(s, '=')) == NULL) {
      snprintf(err, errlen, "%s:%d: expected 'public = KEY' or "
                            "'secret = KEY'", path, n);
      fclose(f);
      return GNMR_E_PARSE;
    }
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    int is_pub = strcmp(key, "public") == 0, is_sec = strcmp(key, "secret") == 0;
    if ((!is_pub && !is_sec) || !gnmr__key_valid(val)) {
      snprintf(err, errlen, "%s:%d: %s", path, n,
               !is_pub && !is_sec ? "unknown key name (public or secret)"
                                  : "not a 40-character Z85 CURVE key");
      fclose(f);
      return GNMR_E_PARSE;
    }
    if (is_pub && pub) {
      memcpy(pub, val, GNMR_Z85_KEY_LEN + 1);
      have_pub = 1;
    }
    if (is_sec && sec) {
      memcpy(sec, val, GNMR_Z85_KEY_LEN + 1);
      have_sec = 1;
    }
  }
  if (have_sec && (rv = file_private(f, path, 1, err, errlen)) != GNMR_OK) {
    fclose(f);
    return rv;
  }
  fclose(f);
  if ((pub && !have_pub) || (sec && !have_sec)) {
    snprintf(err, errlen, "%s: no '%s = KEY' line", path,
             pub && !have_pub ? "public" : "secret");
    return GNMR_E_PARSE;
  }
  return GNMR_OK;
}

void gnmr__allow_clear(gnmr_allow *a) {
  for (size_t i = 0; i < a->n; i++) {
    free(a->grants[i].jobs);
    free(a->grants[i].owns);
    free(a->grants[i].name);
  }
  free(a->grants);
  hmap_clear(&a->keys);
  memset(a, 0, sizeof *a);
}

/* Parses the words after a key: role=, jobs= and the name's words. A
 * second role= or jobs= is an error, never a widening (the last one winning
 * would let an appended word raise a key's rights). */
static int parse_grant(char *rest, gnmr_grant *g, int *has_role,
                       const char **bad) {
  char name[256] = "";
  size_t nl = 0;
  int roles = 0;
  for (char *w = strtok(rest, " \t"); w != NULL; w = strtok(NULL, " \t")) {
    if (strncmp(w, "role=", 5) == 0) {
      *has_role = 1;
      if (roles++ > 0) {
        *bad = "two role= words: a key has one role";
        return -1;
      }
      if (strcmp(w + 5, "operator") == 0)
        g->operator = 1;
      else if (strcmp(w + 5, "agent") != 0) {
        *bad = "role is operator or agent";
        return -1;
      }
    } else if (strncmp(w, "jobs=", 5) == 0) {
      if (w[5] == '\0' || g->jobs != NULL) {
        *bad = "jobs= takes one non-empty pattern";
        return -1;
      }
      if ((g->jobs = strdup(w + 5)) == NULL)
        return -2;
    } else if (strncmp(w, "owns=", 5) == 0) {
      if (w[5] == '\0' || g->owns != NULL) {
        *bad = "owns= takes one non-empty pattern";
        return -1;
      }
      if ((g->owns = strdup(w + 5)) == NULL)
        return -2;
    } else if (strchr(w, '=') != NULL) {
      *bad = "unknown word with '=' (role=operator|agent, jobs=GLOB, "
             "owns=GLOB)";
      return -1;
    } else {
      nl += (size_t)snprintf(name + nl, nl < sizeof name ? sizeof name - nl
                                                         : 0,
                             "%s%s", nl ? " " : "", w);
    }
  }
  if (nl > 0 && (g->name = strdup(name)) == NULL)
    return -2;
  return 0;
}

int gnmr__allow_load(const char *path, gnmr_allow *a, char *err,
                     size_t errlen) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0, rv;
  memset(a, 0, sizeof *a);
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  if ((rv = file_private(f, path, 0, err, errlen)) != GNMR_OK) {
    fclose(f);
    return rv;
  }
  while ((rv = read_line(f, line, sizeof line)) != 0) {
    n++;
    if (rv < 0) {
      snprintf(err, errlen, "%s:%d: a NUL byte or a line longer than %zu "
                            "bytes", path, n, sizeof line - 1);
      rv = GNMR_E_PARSE;
      goto fail;
    }
    char *s = trim(line);
    if (*s == '\0' || *s == '#')
      continue;
    char key[GNMR_Z85_KEY_LEN + 1];
    size_t k = strcspn(s, " \t");
    if (k != GNMR_Z85_KEY_LEN) {
      snprintf(err, errlen, "%s:%d: not a 40-character Z85 CURVE key", path,
               n);
      rv = GNMR_E_PARSE;
      goto fail;
    }
    memcpy(key, s, k);
    key[k] = '\0';
    if (!gnmr__key_valid(key)) {
      snprintf(err, errlen, "%s:%d: not a valid Z85 key", path, n);
      rv = GNMR_E_PARSE;
      goto fail;
    }
    uint64_t first;
    if (hmap_get(&a->keys, key, GNMR_Z85_KEY_LEN, &first)) {
      snprintf(err, errlen, "%s:%d: this key is listed already (line %d): "
                            "one line per key", path, n,
               a->grants[first].line);
      rv = GNMR_E_PARSE;
      goto fail;
    }
    gnmr_grant *g = realloc(a->grants, (a->n + 1) * sizeof *g);
    if (g == NULL)
      goto nomem;
    a->grants = g;
    g = &a->grants[a->n];
    memset(g, 0, sizeof *g);
    g->line = n;
    a->n++;
    const char *bad = NULL;
    int pr = parse_grant(s + k, g, &a->tenancy, &bad);
    if (pr == -1) {
      snprintf(err, errlen, "%s:%d: %s", path, n, bad);
      rv = GNMR_E_PARSE;
      goto fail;
    }
    if (pr != 0 || hmap_put(&a->keys, key, GNMR_Z85_KEY_LEN, a->n - 1) !=
                       GNMR_OK)
      goto nomem;
  }
  fclose(f);
  if (a->n == 0) {
    snprintf(err, errlen, "%s: no key listed: nobody could connect", path);
    gnmr__allow_clear(a);
    return GNMR_E_PARSE;
  }
  return GNMR_OK;
nomem:
  snprintf(err, errlen, "out of memory");
  rv = GNMR_E_NOMEM;
fail:
  fclose(f);
  gnmr__allow_clear(a);
  return rv;
}

const gnmr_grant *gnmr__allow_find(const gnmr_allow *a, const char *key) {
  uint64_t i;
  if (a == NULL || key == NULL ||
      !hmap_get(&a->keys, key, strlen(key), &i))
    return NULL;
  return &a->grants[i];
}

int gnmr__allow_operator(const gnmr_allow *a, const char *key) {
  const gnmr_grant *g;
  if (a == NULL || !a->tenancy)
    return 1;
  return (g = gnmr__allow_find(a, key)) != NULL && g->operator;
}

int gnmr__allow_may(const gnmr_allow *a, const char *key, const char *owner,
                    const char *job) {
  const gnmr_grant *g;
  if (gnmr__allow_operator(a, key) || owner == NULL)
    return 1;
  if (key != NULL && strcmp(key, owner) == 0)
    return 1;
  return (g = gnmr__allow_find(a, key)) != NULL && g->jobs != NULL &&
         fnmatch(g->jobs, job, 0) == 0;
}

const gnmr_grant *gnmr__allow_reserved(const gnmr_allow *a, const char *key,
                                       const char *job) {
  uint64_t own = UINT64_MAX;
  if (a == NULL || job == NULL || gnmr__allow_operator(a, key))
    return NULL;
  if (key != NULL)
    hmap_get(&a->keys, key, strlen(key), &own);
  for (size_t i = 0; i < a->n; i++)
    if (i != own && a->grants[i].owns != NULL &&
        fnmatch(a->grants[i].owns, job, 0) == 0)
      return &a->grants[i];
  return NULL;
}

/* Creates path exclusively with mode and writes text. */
static int write_new(const char *path, int mode, const char *text, char *err,
                     size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return errno == EEXIST ? GNMR_E_DUP : GNMR_E_IO;
  }
  size_t len = strlen(text);
  int ok = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
  if (close(fd) != 0 || !ok) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  return GNMR_OK;
}

int gnmr__keygen(const char *prefix, char *pub, char *err, size_t errlen) {
  char sec[GNMR_Z85_KEY_LEN + 1], path[4096], text[256];
  int rv;
  if (zmq_curve_keypair(pub, sec) != 0) {
    snprintf(err, errlen, "cannot make a key pair: %s",
             zmq_strerror(zmq_errno()));
    return GNMR_E_UNSUPPORTED;
  }
  snprintf(path, sizeof path, "%s.key", prefix);
  snprintf(text, sizeof text,
           "# GNMR CURVE key pair: keep this file secret\npublic = %s\n"
           "secret = %s\n", pub, sec);
  if ((rv = write_new(path, 0600, text, err, errlen)) != GNMR_OK)
    return rv;
  snprintf(path, sizeof path, "%s.pub", prefix);
  snprintf(text, sizeof text, "# GNMR CURVE public key\npublic = %s\n", pub);
  return write_new(path, 0644, text, err, errlen);
}
