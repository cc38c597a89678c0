#!/bin/bash
# SPDX-License-Identifier: MIT
# The GPU checks of the CUDA backend as one script, for a machine with a
# GPU, in this order: the environment (nvidia-smi; then test_gpu's first
# lines: driver and runtime versions, the kernel's registers, local memory
# and whether real sm_90 code runs), `make test-gpu` (its first test
# prints the bitwise table against the host model per dtype x start
# alignment x grid, every bf16/fp16 pattern and FP8 byte included; the
# unit counters all 0 after 1000 graph replays and alternating streams;
# LLM-like lists, the report path), compute-sanitizer's memcheck, racecheck and synccheck over
# it, bench/norm_cuda (GB/s per dtype against the same run's device copy
# bandwidth), and the CUDA part of the Python tests when torch sees the
# GPU. A GPU that nvidia-smi lists but the runtime cannot see fails it.
# Logs go to $OUT (or build/gpu-check). Exit status: that of the first
# failing step.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-check}
mkdir -p "$out"
rc=0
step() { # name, command...
  local name=$1; shift
  echo "== $name"
  "$@" >"$out/$name.log" 2>&1
  local r=$?
  tail -n 40 "$out/$name.log"
  echo "== $name: exit $r"
  [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
  return 0
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
step build make -j"$(nproc)" all build/tests/gpu/test_gpu build/bench/norm_cuda
step test-gpu make test-gpu
# no false green: a GPU that nvidia-smi lists must be tested, not skipped
if grep -q "SKIPPED" "$out/test-gpu.log" && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  echo "== test-gpu skipped although nvidia-smi lists a GPU: FAILED"
  [ $rc -eq 0 ] && rc=1
fi
# compute-sanitizer over the GPU tests: memcheck, racecheck, synccheck,
# each must report 0 errors (CUDA's toolkit has it; skipped, saying so,
# where it is missing)
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$san" ]; then
  for tool in memcheck racecheck synccheck; do
    step "sanitizer-$tool" env GNMR_BIN_DIR="$PWD/build/bin" "$san" --tool "$tool" \
      --error-exitcode 1 build/tests/gpu/test_gpu
  done
else
  echo "== compute-sanitizer: not found; not run"
fi
step norm_cuda build/bench/norm_cuda
if "${GNMR_PYTHON:-python3}" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step python-cuda env GNMR_AGENT_LIB="$PWD/build/lib/libgnmr-agent.so" \
    GNMR_BIN_DIR="$PWD/build/bin" "${GNMR_PYTHON:-python3}" -m unittest \
    discover -s python/tests -k Cuda -v
fi
# GNMR's Transformer Engine debug feature end to end, where TE is installed
if "${GNMR_PYTHON:-python3}" -c 'import torch, transformer_engine.pytorch, nvdlfw_inspect; assert torch.cuda.is_available()' 2>/dev/null; then
  build/bin/gnmrd --data-dir "$out/te-data" --agents tcp://127.0.0.1:47311 \
    --admin "ipc://$out/te-admin.sock" >"$out/te-gnmrd.log" 2>&1 &
  tepid=$!
  sleep 1
  step te-feature env GNMR_AGENT_LIB="$PWD/build/lib/libgnmr-agent.so" \
    "${GNMR_PYTHON:-python3}" python/tests/gpu_te_check.py tcp://127.0.0.1:47311
  kill $tepid 2>/dev/null; wait $tepid 2>/dev/null
else
  echo "== te-feature: Transformer Engine (or a GPU) not found; not run"
fi
exit $rc
