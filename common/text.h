/* SPDX-License-Identifier: MIT */
/* text.h — checks on names that cross the wire or reach a terminal (job
 * and unit names). A valid name is 1..max bytes of well-formed UTF-8 (no
 * overlong forms, surrogates or code points above U+10FFFF) with no
 * control character (C0, DEL, C1), no format character (Unicode category
 * Cf: bidi embeddings, overrides and isolates, zero-width characters, the
 * BOM, soft hyphen, tags), no line or paragraph separator and no
 * noncharacter. An embedded NUL ends a C string, so a name never has one. */
#ifndef GNMR_TEXT_H
#define GNMR_TEXT_H

#include <stddef.h>

/* 1 when s is a valid name of 1..max bytes, else 0 with a reason in why
 * (why may be NULL): "empty", "longer than 128 bytes", "not UTF-8 at byte
 * 7", "control character U+009B at byte 3", ... NULL is "missing". */
int gnmr__name_check(const char *s, size_t max, char *why, size_t whylen);

/* gnmr__name_check() without the reason. */
int gnmr__printable(const char *s, size_t max);

/* Writes s into out (cap bytes) with every byte that would not pass as a
 * name character, and every backslash, as \xHH: safe for a terminal, a
 * table or a log whatever an old database holds. Returns out. */
char *gnmr__escape(const char *s, char *out, size_t cap);

#endif /* GNMR_TEXT_H */
