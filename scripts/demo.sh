#!/bin/sh
# SPDX-License-Identifier: MIT
# demo.sh BUILD — replays the burst sample trace through gnmrctl and shows,
# at a glance, which units the controller moved to the recovery path.
set -eu
B=${1:-build}
T=$(dirname "$0")/../../shared/traces/burst.csv
[ -f "$T" ] || T=$(dirname "$0")/../examples/traces/burst.csv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$B/bin/gnmrctl" replay --max-active 3 --scores="$tmp/scores.csv" "$T" >"$tmp/dec.csv"
echo "GNMR demo: offline replay of $(basename "$T") (max-active 3)"
awk -F, 'NR>1 && $2!="" {n++; split($2,a," "); for(i in a) u[a[i]]++}
  END {printf "steps with units on the recovery path: %d\n", n;
       for (k in u) printf "  unit %-4s %3d steps\n", k, u[k] | "sort -k3nr"}' "$tmp/dec.csv"
echo "risky unit-steps by outcome:"
awk -F, 'NR>1 {c[$7]++} END {for (k in c) printf "  %-9s %d\n", k, c[k]}' "$tmp/scores.csv"
