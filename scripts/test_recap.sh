#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_recap.sh — what failed, repeated at the end of a long test log.
#   test_recap.sh add DIR SUITE LOG   notes SUITE's failed checks (from LOG)
#   test_recap.sh show DIR            prints every note made in DIR
# A failed check is Check's "FILE:LINE:F:..." or "FILE:LINE:E:..." line;
# a suite that failed without one (a crash, valgrind's exit 99, a leak)
# is named with its log's last lines.
set -u
cmd=${1:-}; dir=${2:-}
case "$cmd" in
add)
  suite=$3 log=$4
  {
    echo "-- $suite (whole output: $log)"
    if grep -qE '^[^ ]+:[0-9]+:[FE]:' "$log"; then
      grep -E '^[^ ]+:[0-9]+:[FE]:' "$log" | cut -c1-2000
    else
      grep -vE '^==[0-9]+==' "$log" | tail -n 5
      grep -E '^==[0-9]+== +(definitely|indirectly) lost|ERROR SUMMARY: [1-9]' \
        "$log" | head -n 5
    fi
  } >> "$dir/FAILED"
  ;;
show)
  if [ -s "$dir/FAILED" ]; then
    echo "== what failed"
    cat "$dir/FAILED"
  fi
  ;;
*)
  echo "usage: test_recap.sh add DIR SUITE LOG | show DIR" >&2
  exit 2
  ;;
esac
