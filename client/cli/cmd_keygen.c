/* SPDX-License-Identifier: MIT */
/* cmd_keygen.c — `gnmrctl keygen PREFIX`: writes a CURVE key pair to
 * PREFIX.key (mode 0600: the secret) and PREFIX.pub, never overwriting,
 * and prints the public key (to list in gnmrd's curve_allow_file). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gnmr/error.h"
#include "keys.h"

int cmd_keygen(const cli_globals *g, int argc, char **argv) {
  char pub[41], err[512];
  (void)g;
  if (argc != 2 || argv[1][0] == '-') {
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    fputs("usage: gnmrctl keygen PREFIX\n"
          "\n"
          "Makes a CURVE key pair: PREFIX.key (the secret, mode 0600) and\n"
          "PREFIX.pub, never over existing files, and prints the public key\n"
          "to list in gnmrd's curve_allow_file (docs/operations.md).\n",
          help ? stdout : stderr);
    return help ? CLI_OK : CLI_USAGE;
  }
  int rv = gnmr__keygen(argv[1], pub, err, sizeof err);
  if (rv != GNMR_OK) {
    fprintf(stderr, "gnmrctl keygen: %s%s\n", err,
            rv == GNMR_E_DUP ? " (not overwritten)" : "");
    return CLI_FAIL;
  }
  printf("%s\n", pub);
  return CLI_OK;
}
