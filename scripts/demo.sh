#!/bin/sh
# SPDX-License-Identifier: MIT
# demo.sh BUILD — the main job, live: starts gnmrd in a temporary
# directory, runs a synthetic 4-rank job (each unit sharded over 2 ranks,
# transient gradient spikes injected) through real agents, shows at a
# glance which units were sent to the recovery path and when, checks that
# the live decisions equal an offline `gnmrctl replay` of the same trace,
# and stops the daemon.
set -eu
B=${1:-build}
UNITS=${GNMR_DEMO_UNITS:-48}
STEPS=${GNMR_DEMO_STEPS:-240}
tmp=$(mktemp -d /tmp/gnmr-demo-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

"$B/bin/gnmrd" --data-dir "$tmp/data" --agents "ipc://$tmp/agents.sock" \
  --admin "ipc://$tmp/admin.sock" >"$tmp/gnmrd.out" 2>"$tmp/gnmrd.log" &
pid=$!
i=0
until grep -q 'gnmrd: admin' "$tmp/gnmrd.out" 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 250 ]; then echo "demo: gnmrd did not start:"; cat "$tmp/gnmrd.log"; exit 1; fi
  sleep 0.02
done
echo "== gnmrd is up (pid $pid)"
sed 's/^/   /' "$tmp/gnmrd.out"

echo "== a synthetic job: 4 ranks, $UNITS units sharded over 2 ranks, $STEPS steps, max-active 4"
"$B/bin/gnmr-sim" --agents "ipc://$tmp/agents.sock" --job demo --ranks 4 \
  --shards 2 --units "$UNITS" --steps "$STEPS" --seed 42 \
  --write-trace "$tmp/trace.csv" >"$tmp/live.csv" 2>"$tmp/sim.err"
sed 's/^gnmr-sim: /   /' "$tmp/sim.err"

echo "== units on the recovery path (# = active in that stretch of steps)"
awk -F, -v steps="$STEPS" '
  NR > 1 && $2 != "" {
    n = split($2, a, " ")
    for (i = 1; i <= n; i++) { act[a[i], int(($1 - 1) / 4)] = 1; ever[a[i]]++ }
    busy++; total += n
  }
  END {
    cols = int((steps + 3) / 4)
    printf "   %-8s step 1%*s%d\n", "", cols - 2 - length(steps), "", steps
    for (u = 0; u < 100000; u++) {
      if (!(u in ever)) continue
      line = ""
      for (c = 0; c < cols; c++) line = line (((u, c) in act) ? "#" : ".")
      printf "   unit %-3d %s %3d steps\n", u, line, ever[u]
    }
    printf "   %d of %d steps had units on the recovery path; %d unit-steps in all\n", busy, steps, total
  }' "$tmp/live.csv"

echo "== the same trace replayed offline"
"$B/bin/gnmrctl" replay --scores="$tmp/scores.csv" "$tmp/trace.csv" >"$tmp/replay.csv"
if cmp -s "$tmp/live.csv" "$tmp/replay.csv"; then
  echo "   live decisions == gnmrctl replay: identical ($STEPS steps)"
else
  echo "   live decisions differ from gnmrctl replay!"; exit 1
fi
awk -F, 'NR > 1 { c[$7]++ } END { printf "   risky unit-steps: %d selected, %d dropped by the budget, %d in warm-up; %d held by locks\n", c["selected"], c["dropped"], c["warmup"], c["held"] }' "$tmp/scores.csv"

echo "== gnmrd counters"
"$B/bin/gnmrctl" --admin "ipc://$tmp/admin.sock" stats |
  grep -E '^(reports|steps_decided|decisions_sent|deadline_decisions|missing_units|late_reports) ' | sed 's/^/   /'
PLOT=${GNMR_DEMO_PLOT:-docs/results/demo.png}
echo "== the picture: gnmrctl plot demo -o $PLOT"
"$B/bin/gnmrctl" --admin "ipc://$tmp/admin.sock" plot demo -o "$PLOT" | sed 's/^/   /'
kill "$pid"
wait "$pid" && echo "== gnmrd stopped cleanly" || { echo "gnmrd exit status $?"; exit 1; }
pid=

# A short version of the stress experiment (experiments/stress.py; the
# full one, 5 seeds x 300 steps of every variant, is `make experiment`).
if [ "${GNMR_DEMO_STRESS:-1}" = 1 ]; then
  echo
  echo "== a real training run: FP8 activation storage with delayed scaling, growth"
  echo "   episodes that overflow it, steps with non-finite gradients skipped;"
  echo "   static low vs GNMR vs random at GNMR's share vs the NaN-only rule"
  echo "   vs the lagged oracle"
  echo "   (1 seed, 100 steps, about a minute)"
  GNMR_AGENT_LIB="$(cd "$B/lib" && pwd)/libgnmr-agent.so" \
    "${GNMR_PYTHON:-build/venv/bin/python}" "$(dirname "$0")/../experiments/stress.py" --seeds 1 \
    --steps 100 --variants low,gnmr,random,nanonly,oracle --jobs 2 \
    --gnmrd-bin "$B/bin" | sed 's/^/   /'
  echo "   (one short seed shows the mechanism, skipped steps; the loss"
  echo "    differences need the full run: docs/experiments.md quotes"
  echo "    docs/results/)"
fi
