#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu_experiment.sh [--dry-run] [--experiment act4|fp4] [PACK] —
# the paper's setting 1 on the lent GPU (issue 50), or issue 61's 4-bit
# pre-training (--experiment fp4: NVFP4 against BF16 first, then NVIDIA's
# static choice, random and GNMR on the measure at its budget, seeds 1-3),
# one command for the device tool, from the pack that `make gpu-pack` made
# here (default build/gpu-pack; carry it).
#
# experiments/gpu_plan.py runs it: 4-bit activation storage (int4-g32,
# int8-g32 on the recovery path) of a 25.7M-parameter Llama (d 512, 8
# layers, context 256, batch 64, byte vocabulary) trained on the Python
# standard library's sources of that machine (experiments/corpus.py: its
# size and hash recorded), natural outliers only; first static low and
# static high on seeds 1-3, then GNMR at every default in force, random
# at its share and nanonly on the same seeds, each run started only when
# it fits the time left, every partial result kept. A real gnmrd from the
# pack for each GNMR run.
#
# Budget: GNMR_GPU_EXPERIMENT_S seconds for the runs (default 360), the
# whole within 7 minutes with Python's start-up. Files in $OUT (or
# build/gpu-experiment), 6: env.txt, plan.jsonl, results.jsonl,
# corpus.json, log.txt, summary.md. Exit status: gpu_plan.py's.
#
# --dry-run plans, checks that paper.py takes every run's arguments, and
# stops before the first CUDA call, saying so (`make check` runs it from
# the pack: tests/gpu_pack_test.sh).
set -u
cd "$(dirname "$0")/.." || exit 2
dry=0
experiment=act4
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --experiment)
      case "${2:-}" in act4|fp4) experiment=$2; shift ;;
        *) echo "gpu_experiment: --experiment takes act4 or fp4, not '${2:-}'" >&2; exit 2 ;; esac ;;
    -h|--help) sed -n '3,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_experiment: unknown option $1 (--dry-run, --experiment act4|fp4, PACK)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
pack=${1:-build/gpu-pack}
if [ ! -f "$pack/MANIFEST" ] || [ ! -x "$pack/bin/gnmrd" ]; then
  echo "gpu_experiment: no pack in $pack: run 'make gpu-pack' here and carry it" >&2
  exit 2
fi
pack=$(cd "$pack" && pwd)
out=${OUT:-build/gpu-experiment}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${GNMR_PYTHON:-python3}
budget=${GNMR_GPU_EXPERIMENT_S:-360}
case "$budget" in ''|*[!0-9]*) echo "gpu_experiment: GNMR_GPU_EXPERIMENT_S: whole seconds, not '$budget'" >&2; exit 2 ;; esac
{
  echo "== date: $(date -u +%FT%TZ); host $(uname -srm)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "(nvidia-smi not found)"
  echo "== python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
  echo "== pack"
  sed -n '1,5p' "$pack/MANIFEST"
  echo "== experiment $experiment, budget ${budget}s, dry run $dry"
} >"$out/env.txt" 2>&1
export GNMR_AGENT_LIB=$pack/lib/libgnmr-agent.so GNMR_BIN_DIR=$pack/bin
export PYTHONPATH=$PWD/python HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ $dry = 1 ]; then
  "$PY" experiments/gpu_plan.py --out "$out" --budget-s "$budget" \
    --experiment "$experiment" --gnmrd-bin "$pack/bin" --dry-run >>"$out/env.txt" 2>&1
  rc=$?
  echo "gpu_experiment: dry run: stopped before the first CUDA call (exit $rc)" | tee -a "$out/env.txt"
  exit $rc
fi
timeout -k 10 $((budget + 60)) "$PY" experiments/gpu_plan.py --out "$out" \
  --budget-s "$budget" --experiment "$experiment" --device cuda \
  --gnmrd-bin "$pack/bin" >>"$out/env.txt" 2>&1
rc=$?
echo "gpu_experiment: exit $rc" | tee -a "$out/env.txt"
cat "$out/summary.md" 2>/dev/null
exit $rc
