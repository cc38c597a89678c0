#!/bin/bash
# SPDX-License-Identifier: MIT
# The GPU checks of the CUDA backend as one script, for a machine with a
# GPU: builds, runs `make test-gpu`, then bench/norm_cuda (and the CUDA
# part of the Python tests when torch sees the GPU). Logs go to $OUT (or
# build/gpu-check). Exit status: that of the first failing step.
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
step norm_cuda build/bench/norm_cuda
if /usr/bin/python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step python-cuda env GNMR_AGENT_LIB="$PWD/build/lib/libgnmr-agent.so" \
    GNMR_BIN_DIR="$PWD/build/bin" /usr/bin/python3 -m unittest \
    discover -s python/tests -k Cuda -v
fi
exit $rc
