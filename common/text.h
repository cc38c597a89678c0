/* SPDX-License-Identifier: MIT */
/* text.h — checks on names that cross the wire (job and unit names). */
#ifndef GNMR_TEXT_H
#define GNMR_TEXT_H

#include <stddef.h>

/* 1 when s is 1..max bytes with no control character, else 0. NULL is 0. */
int gnmr__printable(const char *s, size_t max);

#endif /* GNMR_TEXT_H */
