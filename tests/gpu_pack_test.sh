#!/bin/bash
# SPDX-License-Identifier: MIT
# tests/gpu_pack_test.sh PACK — the GPU machine's pack, checked here on the
# CPU (`make test-gpu-pack`, part of `make check`):
#  1. every shared library each binary of the pack needs resolves into the
#     pack except the machine's own (glibc's, libstdc++, libgcc_s: ldd,
#     with no LD_LIBRARY_PATH), and a running gnmrd maps only the pack's
#     libraries and those (/proc/PID/maps); the pack needs glibc 2.34 at
#     most (Ubuntu 22.04 has 2.35);
#  2. the pack and the working tree fit the 64 MiB that travel;
#  3. gnmrd and gnmr-sim from the pack: gnmr-sim's live decisions equal
#     the pack's `gnmrctl replay` of the trace it reported;
#  4. scripts/gpu_check.sh --dry-run from the pack stops before the first
#     CUDA call, says so, and writes at most 8 files; its mistakes (an
#     unknown option, no pack) are refused with exit 2;
#  4b. scripts/gpu_experiment.sh --dry-run likewise (at most 6 files, its
#     9 runs planned, the corpus recorded), its mistakes refused;
#  5. scripts/gpu_train.py on the CPU backend against the pack's gnmrd and
#     libgnmr-agent: it trains, and gnmrd's decisions equal the replay of
#     its trace; its wrong arguments are refused with exit 2.
set -u
P=${1:?usage: tests/gpu_pack_test.sh PACK}
P=$(cd "$P" && pwd -P)
PY=${GNMR_PYTHON:-build/venv/bin/python}
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAILED: $*"; fails=$((fails + 1)); }
work=$(mktemp -d /tmp/gnmr-packtest-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

declare -A glibc
while read -r f; do
  [ -e "$f" ] && glibc[$(readlink -f "$f")]=1
done < <(dpkg -L libc6 libstdc++6 libgcc-s1 | grep '\.so')
in_pack_or_glibc() {
  local r; r=$(readlink -f "$1")
  case "$r" in "$P"/*) return 0 ;; esac
  [ -n "${glibc[$r]:-}" ]
}

# 1. libraries
n=0 outside=""
for f in "$P"/bin/* "$P"/lib/*.so* "$P"/gpu/*; do
  [ -f "$f" ] || continue
  n=$((n + 1))
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then outside+=" $(basename "$f"):$name(not found)"
    elif ! in_pack_or_glibc "$path"; then outside+=" $(basename "$f"):$path"; fi
  done < <(env -u LD_LIBRARY_PATH ldd "$f")
done
[ -z "$outside" ] && [ $n -ge 4 ] && ok "$n binaries and libraries resolve into the pack or the machine's own libraries" ||
  bad "libraries outside the pack:$outside (of $n files)"
grep -q '^packages:' "$P/MANIFEST" && [ "$(grep -c '^  lib.* \(deb\|installed\)$' "$P/MANIFEST")" -ge 10 ] &&
  ok "MANIFEST lists $(grep -c '^  lib.* \(deb\|installed\)$' "$P/MANIFEST") packages" || bad "MANIFEST lists no packages"

glibc_need=$(sed -n 's/^needs: GLIBC_\([0-9.]*\) .*/\1/p' "$P/MANIFEST")
if [ -z "$glibc_need" ]; then bad "MANIFEST has no needs: line"
elif [ "$(printf '%s\n' "$glibc_need" 2.34 | sort -V | tail -n 1)" = 2.34 ]; then
  ok "the pack needs glibc $glibc_need ($(grep '^needs:' "$P/MANIFEST"))"
else bad "the pack needs glibc $glibc_need, above 2.34"; fi

# 2. size
pack_kb=$(du -sk "$P" | cut -f1)
tree_kb=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
total=$(( (pack_kb + tree_kb) / 1024 ))
[ "$total" -lt 64 ] && ok "pack + tree: $total MiB (< 64)" || bad "pack + tree: $total MiB, over 64"

# 3. gnmrd and gnmr-sim from the pack, nothing from the environment
env -i PATH=/usr/bin:/bin HOME="$work" "$P/bin/gnmrd" --data-dir "$work/data" \
  --agents tcp://127.0.0.1:* --admin "ipc://$work/admin.sock" \
  >"$work/gnmrd.out" 2>"$work/gnmrd.err" &
pids+=($!)
gpid=$!
agents=""
for _ in $(seq 100); do
  grep -q '^gnmrd: admin' "$work/gnmrd.out" 2>/dev/null && break
  sleep 0.1
done
agents=$(sed -n 's/^gnmrd: agents \([^ ]*\).*/\1/p' "$work/gnmrd.out" | head -n 1)
if [ -z "$agents" ]; then
  bad "gnmrd did not start from the pack: $(tail -n 5 "$work/gnmrd.err")"
else
  ok "gnmrd started from the pack (agents $agents)"
  foreign=$(awk '$6 ~ /\.so/ {print $6}' "/proc/$gpid/maps" | sort -u |
    while read -r m; do in_pack_or_glibc "$m" || echo "$m"; done)
  mapped=$(awk '$6 ~ /\.so/ {print $6}' "/proc/$gpid/maps" | sort -u | grep -c "^$P/lib/")
  [ -z "$foreign" ] && [ "$mapped" -ge 5 ] && ok "running gnmrd maps $mapped of the pack's libraries and the machine's own, nothing else" ||
    bad "running gnmrd maps libraries from outside the pack: $foreign (pack's: $mapped)"
  if env -i PATH=/usr/bin:/bin "$P/bin/gnmr-sim" --agents "$agents" --job pack-sim \
      --ranks 2 --units 16 --steps 60 --seed 7 --write-trace "$work/sim.csv" \
      >"$work/sim.dec" 2>"$work/sim.err" &&
     env -i PATH=/usr/bin:/bin "$P/bin/gnmrctl" replay "$work/sim.csv" >"$work/replay.dec" 2>"$work/replay.err" &&
     cmp -s "$work/sim.dec" "$work/replay.dec" && [ "$(wc -l <"$work/sim.dec")" -eq 61 ]; then
    ok "gnmr-sim from the pack: 60 live decisions equal the pack's gnmrctl replay"
  else
    bad "gnmr-sim from the pack: $(tail -n 3 "$work/sim.err" "$work/replay.err"; diff "$work/sim.dec" "$work/replay.dec" | head -n 5)"
  fi
fi

# 4. the check script's dry run, and its mistakes
out=$work/check-out
mkdir -p "$out"
if OUT=$out GNMR_PYTHON=$PY scripts/gpu_check.sh --dry-run "$P" >"$work/dry.log" 2>&1 &&
   grep -q "dry run: stopped before the first CUDA call" "$out/summary.txt" &&
   grep -q "gnmrd: started from the pack" "$out/summary.txt" &&
   grep -q "libgnmr-agent.so: every library found" "$out/env.txt"; then
  ok "gpu_check.sh --dry-run: stopped before the first CUDA call, $(ls "$out" | wc -l) files"
else
  bad "gpu_check.sh --dry-run: $(tail -n 8 "$work/dry.log")"
fi
[ "$(find "$out" -type f | wc -l)" -le 8 ] || bad "gpu_check.sh wrote more than 8 files: $(ls "$out")"
scripts/gpu_check.sh --bogus >"$work/e1" 2>&1; r1=$?
scripts/gpu_check.sh "$work/nowhere" >"$work/e2" 2>&1; r2=$?
[ $r1 = 2 ] && grep -q "unknown option --bogus" "$work/e1" && [ $r2 = 2 ] &&
  grep -q "no pack in $work/nowhere" "$work/e2" && ok "gpu_check.sh refuses an unknown option and a missing pack (exit 2)" ||
  bad "gpu_check.sh mistakes: $r1 $(cat "$work/e1") / $r2 $(cat "$work/e2")"

# 4b. the experiment script's dry run (issue 50), and its mistakes
out=$work/exp-out
mkdir -p "$out"
if OUT=$out GNMR_PYTHON=$PY scripts/gpu_experiment.sh --dry-run "$P" >"$work/exp.log" 2>&1 &&
   grep -q "dry run: stopped before the first CUDA call (exit 0)" "$out/env.txt" &&
   [ "$(grep -c '"event": "planned"' "$out/plan.jsonl")" = 9 ] &&
   grep -q '"sha256"' "$out/corpus.json"; then
  ok "gpu_experiment.sh --dry-run: 9 runs planned, stopped before the first CUDA call, $(ls "$out" | wc -l) files"
else
  bad "gpu_experiment.sh --dry-run: $(tail -n 8 "$work/exp.log" "$out/env.txt" 2>/dev/null)"
fi
[ "$(find "$out" -type f | wc -l)" -le 6 ] || bad "gpu_experiment.sh wrote more than 6 files: $(ls "$out")"
# issue 61's fp4 on the GPU: its nine runs' arguments taken by paper.py
out=$work/exp-fp4
mkdir -p "$out"
if OUT=$out GNMR_PYTHON=$PY scripts/gpu_experiment.sh --dry-run --experiment fp4 "$P" >"$work/exp4.log" 2>&1 &&
   grep -q "experiment fp4" "$out/env.txt" &&
   [ "$(grep -c '"event": "planned"' "$out/plan.jsonl")" = 9 ] &&
   grep -q '"gnmr_measure"' "$out/plan.jsonl"; then
  ok "gpu_experiment.sh --dry-run --experiment fp4: 9 runs planned"
else
  bad "gpu_experiment.sh --dry-run --experiment fp4: $(tail -n 8 "$work/exp4.log" "$out/env.txt" 2>/dev/null)"
fi
scripts/gpu_experiment.sh --experiment fp8 "$P" >"$work/e6" 2>&1; r4=$?
[ $r4 = 2 ] && grep -q "takes act4 or fp4, not 'fp8'" "$work/e6" &&
  ok "gpu_experiment.sh refuses an unknown experiment (exit 2)" ||
  bad "gpu_experiment.sh --experiment fp8: $r4 $(cat "$work/e6")"
scripts/gpu_experiment.sh --bogus >"$work/e3" 2>&1; r1=$?
scripts/gpu_experiment.sh "$work/nowhere" >"$work/e4" 2>&1; r2=$?
GNMR_GPU_EXPERIMENT_S=6m scripts/gpu_experiment.sh "$P" >"$work/e5" 2>&1; r3=$?
[ $r1 = 2 ] && grep -q "unknown option --bogus" "$work/e3" && [ $r2 = 2 ] &&
  grep -q "no pack in $work/nowhere" "$work/e4" && [ $r3 = 2 ] &&
  grep -q "whole seconds, not '6m'" "$work/e5" &&
  ok "gpu_experiment.sh refuses an unknown option, a missing pack and a bad budget (exit 2)" ||
  bad "gpu_experiment.sh mistakes: $r1 $(cat "$work/e3") / $r2 $(cat "$work/e4") / $r3 $(cat "$work/e5")"

# 5. the training run, on the CPU backend
if [ -n "$agents" ]; then
  if GNMR_AGENT_LIB="$P/lib/libgnmr-agent.so" GNMR_BIN_DIR="$P/bin" \
     OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
     "$PY" scripts/gpu_train.py --agents "$agents" --admin "ipc://$work/admin.sock" \
       --out "$work/train" --device cpu --steps 30 --overlap-steps 10 --profile-steps 3 \
       --base-steps 5 --warm-steps 2 \
       >"$work/train.log" 2>&1 &&
     "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["decisions_equal_replay"] and r["decisions"] == 43 and r["overlap_inside_ms"] > 0 and r["loss_last"] < r["loss_first"] and r["model"]["units"] == 14, r' "$work/train/train.json"; then
    ok "gpu_train.py on the CPU: $(grep -o '"steps_with_recovery": [0-9]*' "$work/train/train.json"), decisions equal the replay of its trace"
  else
    bad "gpu_train.py on the CPU: $(tail -n 15 "$work/train.log")"
  fi
  "$PY" scripts/gpu_train.py --agents "$agents" --admin x --out "$work/t2" --steps 0 >"$work/e3" 2>&1; r3=$?
  [ $r3 = 2 ] && grep -q "steps and --base-steps are 1 or more" "$work/e3" &&
    ok "gpu_train.py refuses --steps 0 (exit 2)" || bad "gpu_train.py --steps 0: exit $r3 $(tail -n 2 "$work/e3")"
fi

if [ $fails = 0 ]; then echo "gpu-pack tests: all passed"; else echo "gpu-pack tests: $fails FAILED"; exit 1; fi
