/* SPDX-License-Identifier: MIT */
/* cmd_plot.c — gnmrctl plot: a picture of what the controller did, drawn
 * by the gnmr Python package (python -m gnmr.plot) with matplotlib, which
 * reads the history back through this gnmrctl (export). gnmrctl finds the
 * Python: $GNMR_PYTHON, else the build's venv beside this binary
 * (BUILD/bin/gnmrctl -> BUILD/venv/bin/python), else python3; and, in a
 * checkout, the package beside the build (python/). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Imports gnmr.plot and runs it, or says what to install (exit 2). Run
 * with -I (isolated: neither the current directory, nor PYTHON*
 * variables, nor the user's site directory on sys.path, so that a
 * gnmr/__init__.py where gnmrctl is run never runs); the first argument
 * is the checkout's package directory to put first ("" for none). */
static const char bootstrap[] =
    "import sys\n"
    "p = sys.argv.pop(1)\n"
    "if p:\n"
    "    sys.path.insert(0, p)\n"
    "try:\n"
    "    import gnmr.plot\n"
    "except ImportError as e:\n"
    "    sys.exit('gnmrctl plot: it draws with matplotlib through the gnmr '\n"
    "             'Python package, which this Python (' + sys.executable +\n"
    "             ') cannot import (' + str(e) + '): pip install gnmr '\n"
    "             'matplotlib, or set GNMR_PYTHON to a Python that has '\n"
    "             'them')\n"
    "sys.exit(gnmr.plot.main(sys.argv[1:]))\n";

static int exists(const char *p) { return access(p, F_OK) == 0; }

int cmd_plot(const cli_globals *g, int argc, char **argv) {
  char self[PATH_MAX], dir[PATH_MAX], py[PATH_MAX + 32], pkg[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    fprintf(stderr, "gnmrctl plot: cannot find this program: %s\n",
            strerror(errno));
    return CLI_FAIL;
  }
  self[n] = '\0';
  snprintf(dir, sizeof dir, "%s", self);
  char *slash = strrchr(dir, '/');
  if (slash != NULL)
    *slash = '\0'; /* BUILD/bin */
  const char *python = getenv("GNMR_PYTHON");
  if (python == NULL || python[0] == '\0') {
    snprintf(py, sizeof py, "%s/../venv/bin/python", dir);
    python = exists(py) ? py : "python3";
  }
  snprintf(pkg, sizeof pkg, "%s/../../python/gnmr/plot.py", dir);
  if (exists(pkg)) /* a checkout: its package first */
    snprintf(pkg, sizeof pkg, "%s/../../python", dir);
  else
    pkg[0] = '\0';
  setenv("GNMR_PLOT_PROG", "gnmrctl plot", 1);
  enum { FIXED = 18 };
  char **args = calloc((size_t)argc + FIXED, sizeof *args);
  const struct {
    const char *flag, *value;
  } globals[] = {{"--admin", g->admin},
                 {"--store", g->store},
                 {"--curve-server-key", g->server_key},
                 {"--key-file", g->key_file}};
  enum { NG = sizeof globals / sizeof globals[0] };
  char given[NG][1100], a_ctl[PATH_MAX + 16];
  if (args == NULL)
    return CLI_FAIL;
  int k = 0;
  args[k++] = (char *)python;
  args[k++] = "-I";
  args[k++] = "-c";
  args[k++] = (char *)bootstrap;
  args[k++] = pkg;
  snprintf(a_ctl, sizeof a_ctl, "--gnmrctl=%s", self);
  args[k++] = a_ctl;
  for (int i = 0; i < NG; i++) /* gnmrctl's own options, passed on */
    if (globals[i].value != NULL) {
      snprintf(given[i], sizeof given[i], "%s=%s", globals[i].flag,
               globals[i].value);
      args[k++] = given[i];
    }
  for (int i = 1; i < argc; i++)
    args[k++] = argv[i];
  args[k] = NULL;
  fflush(stdout);
  execvp(python, args);
  fprintf(stderr, "gnmrctl plot: cannot run %s: %s (set GNMR_PYTHON to a "
          "Python with the gnmr package and matplotlib)\n", python,
          strerror(errno));
  free(args);
  return CLI_FAIL;
}
