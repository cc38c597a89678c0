/* SPDX-License-Identifier: MIT */
/* text.c — see text.h. */
#include "text.h"

#include <string.h>

int gnmr__printable(const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > max)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
      return 0;
  return 1;
}
