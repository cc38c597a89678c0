#!/bin/sh
# SPDX-License-Identifier: MIT
# experiments/measure_tuning.sh OUT [--tables] — the measured signal's tuning traces
# on the tuning seeds 1-3 (low-cost path runs: the recipe measures either
# path, so a low run's measures are what any variant's gnmrd would see)
# and the table experiments/measure_defaults.py makes of them. Clean runs
# (no stress) of every recipe; the latent stresses with their damage as
# the low recipe's output error (--damage-measure out: a figure the
# measure does not read). Writes OUT/traces/*, OUT/measure_tuning.txt and
# OUT/tuned_*.json; --tables remakes the last two from OUT's traces.
set -eu
out=${1:?usage: measure_tuning.sh OUT}
py=${PYTHON:-build/venv/bin/python}
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
run() { # NAME ARGS...: low runs of seeds 1-3, traces in OUT/traces/NAME
  name=$1; shift
  mkdir -p "$out/traces/$name"
  "$py" experiments/paper.py "$@" --variants low --seed-list 1,2,3 --jobs 2 \
    --trace-dir "$out/traces/$name" > "$out/traces/$name/log.txt"
}
# The table of experiments/measure_defaults.py over OUT's traces (the
# latent stresses' damage bound: the low recipe's output error above 0.05,
# above every value outside their episodes on tuning seed 1, below most in
# them: docs/experiments.md)
table() {
  {
    echo "Command: experiments/measure_tuning.sh (commit $(git rev-parse --short HEAD))"
    echo
    "$py" experiments/measure_defaults.py \
      "$1"/traces/*_clean/*.csv \
      $(for f in "$1"/traces/lora_latent/*.csv; do echo --damaged "$f" --damage-error 0.05; done) \
      $(for f in "$1"/traces/fp8_mixed/*.csv; do echo --damaged "$f" --damage-error 0.05; done)
  } > "$1/measure_tuning.txt"
}
# What the baselines fix on the tuning seeds (experiments/tuned.py): each
# setting's measure_alone bounds (the 99.9% quantile of its clean runs'
# measure) and fp4's best static set (its 7 units of highest mean damage)
tuned() {
  "$py" experiments/tuned.py --bounds-quantile 0.999 "$1"/traces/lora_clean/*.csv > "$1/tuned_lora_latent.json"
  "$py" experiments/tuned.py --bounds-quantile 0.999 "$1"/traces/fp8_mixed_clean/*.csv > "$1/tuned_fp8_latent_mixed.json"
  "$py" experiments/tuned.py --bounds-quantile 0.999 --top 7 "$1"/traces/fp4_clean/*.csv > "$1/tuned_fp4.json"
}
case "${2:-}" in
  --tables) table "$out"; tuned "$out"; exit 0 ;;
esac
LORA_LATENT="--setting lora --episode-mode latent --episode-scales 128,256,512,512,256"
FP8_MIXED="--setting fp8 --model llama --episode-mode latent --episode-scales 16,64,256,256,64 --keep-high down_proj"
run lora_latent $LORA_LATENT --damage-measure out
run lora_clean --setting lora --episode-rate 0
run fp8_mixed $FP8_MIXED --damage-measure out
run fp8_mixed_clean $FP8_MIXED --episode-rate 0
run act4_clean --setting act4 --episode-rate 0
run fp8_clean --setting fp8 --episode-rate 0
run fp4_clean --setting fp4
table "$out"
tuned "$out"
