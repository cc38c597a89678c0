#!/bin/sh
# SPDX-License-Identifier: MIT
# experiments/measure_tuning.sh OUT — the measured signal's tuning traces
# on the tuning seeds 1-3 (low-cost path runs: the recipe measures either
# path, so a low run's measures are what any variant's gnmrd would see)
# and the table experiments/measure_defaults.py makes of them. Clean runs
# (no stress) of every recipe; the latent stresses with their damage as
# the low recipe's output error (--damage-measure out: a figure the
# measure does not read). Writes OUT/traces/* and OUT/measure_tuning.txt.
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
LORA_LATENT="--setting lora --episode-mode latent --episode-scales 128,256,512,512,256"
FP8_MIXED="--setting fp8 --model llama --episode-mode latent --episode-scales 16,64,256,256,64 --keep-high down_proj"
run lora_latent $LORA_LATENT --damage-measure out
run lora_clean --setting lora --episode-rate 0
run fp8_mixed $FP8_MIXED --damage-measure out
run fp8_mixed_clean $FP8_MIXED --episode-rate 0
run act4_clean --setting act4 --episode-rate 0
run fp8_clean --setting fp8 --episode-rate 0
run fp4_clean --setting fp4
{
  echo "Command: experiments/measure_tuning.sh (commit $(git rev-parse --short HEAD))"
  echo
  "$py" experiments/measure_defaults.py \
    "$out"/traces/*_clean/*.csv \
    $(for f in "$out"/traces/lora_latent/*.csv; do echo --damaged "$f" --damage-error 0.05; done) \
    $(for f in "$out"/traces/fp8_mixed/*.csv; do echo --damaged "$f" --damage-error 0.1; done)
} > "$out/measure_tuning.txt"
