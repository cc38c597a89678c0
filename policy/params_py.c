/* SPDX-License-Identifier: MIT */
/* params_py.c — prints python/gnmr/_params.py from the parameter table
 * (gnmr/params.h); `make python-params` writes it, and test_params checks
 * that the committed file is what this prints. */
#include <stdio.h>
#include <stdlib.h>

#include "params.h"

int main(void) {
  int n = policy_params_python(NULL, 0);
  char *buf = n > 0 ? malloc((size_t)n + 1) : NULL;
  if (buf == NULL || policy_params_python(buf, (size_t)n + 1) != n) {
    fputs("params_py: cannot render the table\n", stderr);
    return 1;
  }
  fputs(buf, stdout);
  free(buf);
  return ferror(stdout) ? 1 : 0;
}
