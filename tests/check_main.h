/* SPDX-License-Identifier: MIT */
/* check_main.h — the one main() of every Check suite: runs it with the
 * summary line on standard output and turns failures into the exit code. */
#ifndef GNMR_CHECK_MAIN_H
#define GNMR_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

static inline int tu_check_main(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif /* GNMR_CHECK_MAIN_H */
