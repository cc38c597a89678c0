/* SPDX-License-Identifier: MIT */
/* keys.c — see keys.h. Keys are checked by decoding them (zmq_z85_decode),
 * so a truncated or mistyped key is found when the file is read, not when
 * a handshake fails. */
#include "keys.h"

#include <errno.h>
#include <fcntl.h>
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
  while (fgets(line, sizeof line, f) != NULL) {
    char *s = trim(line), *eq;
    n++;
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

int gnmr__allow_file_read(const char *path, hmap *allowed, char *err,
                          size_t errlen) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0, keys = 0, rv;
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return GNMR_E_IO;
  }
  if ((rv = file_private(f, path, 0, err, errlen)) != GNMR_OK) {
    fclose(f);
    return rv;
  }
  while (fgets(line, sizeof line, f) != NULL) {
    char *s = trim(line);
    n++;
    if (*s == '\0' || *s == '#')
      continue;
    char key[GNMR_Z85_KEY_LEN + 1];
    size_t k = strcspn(s, " \t");
    if (k != GNMR_Z85_KEY_LEN) {
      snprintf(err, errlen, "%s:%d: not a 40-character Z85 CURVE key", path,
               n);
      fclose(f);
      return GNMR_E_PARSE;
    }
    memcpy(key, s, k);
    key[k] = '\0';
    if (!gnmr__key_valid(key)) {
      snprintf(err, errlen, "%s:%d: not a valid Z85 key", path, n);
      fclose(f);
      return GNMR_E_PARSE;
    }
    if (hmap_put(allowed, key, GNMR_Z85_KEY_LEN, (uint64_t)n) != GNMR_OK) {
      fclose(f);
      snprintf(err, errlen, "out of memory");
      return GNMR_E_NOMEM;
    }
    keys++;
  }
  fclose(f);
  if (keys == 0) {
    snprintf(err, errlen, "%s: no key listed: nobody could connect", path);
    return GNMR_E_PARSE;
  }
  return GNMR_OK;
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
