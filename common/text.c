/* SPDX-License-Identifier: MIT */
/* text.c — names: UTF-8 validation and the characters refused (text.h). */
#include "text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Decodes one UTF-8 sequence at s (n bytes left); returns its length and
 * the code point in *cp, or 0 when it is malformed. */
static size_t utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
  unsigned char c = s[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2, v = c & 0x1f, min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3, v = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0; /* continuation byte, 0xc0/0xc1 (overlong), above 0xf4 */
  }
  if (n < len)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    v = (v << 6) | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

/* Control, format (Cf), separator (Zl, Zp) and noncharacter code points. */
static const char *refused(uint32_t c) {
  static const struct {
    uint32_t lo, hi;
  } format[] = {
      {0x00ad, 0x00ad},   {0x0600, 0x0605},   {0x061c, 0x061c},
      {0x06dd, 0x06dd},   {0x070f, 0x070f},   {0x0890, 0x0891},
      {0x08e2, 0x08e2},   {0x180e, 0x180e},   {0x200b, 0x200f},
      {0x202a, 0x202e},   {0x2060, 0x2064},   {0x2066, 0x206f},
      {0xfeff, 0xfeff},   {0xfff9, 0xfffb},   {0x110bd, 0x110bd},
      {0x110cd, 0x110cd}, {0x13430, 0x1343f}, {0x1bca0, 0x1bca3},
      {0x1d173, 0x1d17a}, {0xe0001, 0xe0001}, {0xe0020, 0xe007f},
  };
  if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f))
    return "control character";
  if (c < 0xad) /* below every range that follows: most names are ASCII */
    return NULL;
  if (c == 0x2028 || c == 0x2029)
    return "line or paragraph separator";
  if ((c >= 0xfdd0 && c <= 0xfdef) || (c & 0xfffe) == 0xfffe)
    return "noncharacter";
  for (size_t i = 0; i < sizeof format / sizeof format[0]; i++)
    if (c >= format[i].lo && c <= format[i].hi)
      return "format character";
  return NULL;
}

int gnmr__name_check(const char *s, size_t max, char *why, size_t whylen) {
  char dummy[1];
  if (why == NULL) {
    why = dummy;
    whylen = sizeof dummy;
  }
  if (s == NULL) {
    snprintf(why, whylen, "missing");
    return 0;
  }
  size_t n = strlen(s);
  if (n == 0) {
    snprintf(why, whylen, "empty");
    return 0;
  }
  if (n > max) {
    snprintf(why, whylen, "longer than %zu bytes", max);
    return 0;
  }
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    if (p[i] >= 0x20 && p[i] < 0x7f) { /* printable ASCII: most names */
      i++;
      continue;
    }
    uint32_t cp;
    size_t len = utf8_next(p + i, n - i, &cp);
    if (len == 0) {
      snprintf(why, whylen, "not UTF-8 at byte %zu", i);
      return 0;
    }
    const char *bad = refused(cp);
    if (bad != NULL) {
      snprintf(why, whylen, "%s U+%04X at byte %zu", bad, (unsigned)cp, i);
      return 0;
    }
    i += len;
  }
  why[0] = '\0';
  return 1;
}

int gnmr__printable(const char *s, size_t max) {
  return gnmr__name_check(s, max, NULL, 0);
}

char *gnmr__escape(const char *s, char *out, size_t cap) {
  size_t o = 0;
  if (cap == 0)
    return out;
  if (s == NULL)
    s = "";
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t len = utf8_next(p + i, n - i, &cp);
    if (len == 0 || refused(cp) != NULL || cp == '\\') {
      if (len == 0)
        len = 1;
      for (size_t k = 0; k < len; k++) {
        if (o + 5 > cap)
          goto done;
        o += (size_t)snprintf(out + o, cap - o, "\\x%02x", p[i + k]);
      }
    } else {
      if (o + len + 1 > cap)
        goto done;
      memcpy(out + o, p + i, len);
      o += len;
    }
    i += len;
  }
done:
  out[o] = '\0';
  return out;
}
