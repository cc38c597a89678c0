#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu_check.sh [--dry-run] [--rebuild] [PACK] — the GPU checks in
# one command, on the GPU machine, from the pack that `make gpu-pack` made
# here (default build/gpu-pack; carry it). That machine has CUDA, gcc and
# Python with torch, and none of Debian's libraries: nothing is built or
# installed there, unless --rebuild (after a fix made during the session)
# rebuilds libgnmr-agent.so, test_gpu and norm_cuda with its nvcc and the
# pack's rebuild/ folder.
#
# In this order, each under a timeout, all within GNMR_GPU_BUDGET_S
# (default 450 s: a 10-minute call leaves time to rerun once); a step that
# would start past the budget is not run, and summary.txt says so:
#   env         nvidia-smi, the driver and runtime versions, the kernel's
#               registers and whether real sm_90 code runs (test_gpu's
#               first lines), Python and torch, the pack's MANIFEST head
#   test_gpu    the C GPU tests: the bitwise table against the host model
#               per dtype x start alignment x grid, every bf16/fp16 pattern
#               and FP8 byte, graph replays, streams, LLM-like lists
#   norm_cuda   bench/norm_cuda: GB/s per dtype against the same run's
#               device copy bandwidth (goal: >= 85% for fp32 and bf16)
#   train       scripts/gpu_train.py: a small Llama, 200 bf16 steps with an
#               FP8 GEMM low path, the CUDA backend, a gnmrd from the pack;
#               train.json: GNMR's time per step against the step without
#               it, the CUDA pass against copy bandwidth, decisions equal
#               to `gnmrctl replay` of the recorded trace
#   python      the wheel installed into a temporary folder and imported
#               on that Python (its own libraries, the GPU seen), then the
#               package's CUDA tests (unittest -k Cuda) against the pack's
#               libgnmr-agent; Transformer Engine's feature where TE is;
#               bench/compile_routes.py on CUDA (graph breaks, recompiles
#               and step times of the switchable linears under compile);
#               bench/callbacks.py (the HF and Lightning callbacks' time
#               per step on the 103M Llama, where lightning is installed)
#   sanitizer   compute-sanitizer memcheck, racecheck, synccheck over
#               test_gpu, each 0 errors
# Files in $OUT (or build/gpu-check), 8 at most: env.txt, test_gpu.log,
# norm_cuda.log, train.log, train.json, python.log, sanitizer.log,
# summary.txt. Exit status: that of the first failing step.
#
# --dry-run does everything up to the first CUDA call and stops there,
# saying so: the pack is complete and its libraries resolve, gnmrd starts
# from it and answers gnmrctl, the Python there imports the package. It
# runs in `make check` (tests/gpu_pack_test.sh).
set -u
cd "$(dirname "$0")/.." || exit 2
dry=0 rebuild=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --rebuild) rebuild=1 ;;
    -h|--help) sed -n '3,44p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (--dry-run, --rebuild, PACK)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
pack=${1:-build/gpu-pack}
if [ ! -f "$pack/MANIFEST" ] || [ ! -x "$pack/bin/gnmrd" ]; then
  echo "gpu_check: no pack in $pack: run 'make gpu-pack' here and carry it" >&2
  exit 2
fi
pack=$(cd "$pack" && pwd)
out=${OUT:-build/gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
PY=${GNMR_PYTHON:-python3}
budget=${GNMR_GPU_BUDGET_S:-450}
start=$(date +%s)
rc=0
: >"$out/summary.txt"
note() { echo "$*" | tee -a "$out/summary.txt"; }
left() { echo $((budget - ($(date +%s) - start))); }

# step NAME LOGFILE LIMIT_S COMMAND...: runs it under a timeout (at most
# what the budget has left), appends to LOGFILE, notes its exit status
step() {
  local name=$1 log=$2 limit=$3; shift 3
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then
    note "$name: not run (the ${budget}s budget is spent)"
    [ $rc -eq 0 ] && rc=124
    return 0
  fi
  [ "$limit" -gt "$l" ] && limit=$l
  echo "== $name (at most ${limit}s)" >>"$out/$log"
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >>"$out/$log" 2>&1
  local r=$?
  note "$name: exit $r in $(( $(date +%s) - t0 ))s$([ $r -eq 124 ] && echo " (timed out at ${limit}s)")"
  tail -n 25 "$out/$log"
  [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
  return 0
}

bin=$pack/bin gpu=$pack/gpu agentlib=$pack/lib/libgnmr-agent.so
if [ $rebuild = 1 ]; then
  # make with the tree's sources, the pack's generated code, headers and
  # link names; run with the pack's libraries
  mkdir -p build/gen && cp -r "$pack/rebuild/gen/proto" build/gen/ &&
    touch build/gen/proto/*
  step rebuild env.txt 240 env CPATH="$pack/rebuild/include" \
    LIBRARY_PATH="$pack/rebuild/lib" LD_LIBRARY_PATH="$pack/lib" make -j"$(nproc)" CUDA=1 \
    build/lib/libgnmr-agent.so build/tests/gpu/test_gpu build/bench/norm_cuda
  export LD_LIBRARY_PATH=$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  gpu=$PWD/build/rebuilt-gpu agentlib=$PWD/build/lib/libgnmr-agent.so
  mkdir -p "$gpu"
  cp build/tests/gpu/test_gpu build/bench/norm_cuda "$gpu/" 2>/dev/null
fi

# ---- env (no CUDA call yet) ------------------------------------------------
missing=0
{
  echo "== date: $(date -u +%FT%TZ); host $(uname -srm)"
  echo "== nvidia-smi"
  nvidia-smi 2>&1 || echo "(nvidia-smi not found)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  echo "== nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
  (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -n 2
  echo "== compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"
  echo "== python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
  echo "== glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "== pack"
  sed -n '1,5p' "$pack/MANIFEST"
  grep '^size:' "$pack/MANIFEST"
  echo "== the pack's libraries (ldd, glibc's are the machine's)"
  for f in "$bin"/* "$gpu"/* "$agentlib"; do
    [ -e "$f" ] || continue
    miss=$(ldd "$f" 2>&1 | grep "not found" | tr -s ' \t\n' ' ')
    [ -n "$miss" ] && missing=1
    echo "$(basename "$f"): ${miss:-every library found}"
  done
} >>"$out/env.txt" 2>&1
if [ $missing = 1 ]; then
  note "env: a library of the pack is not found (env.txt)"
  [ $rc -eq 0 ] && rc=1
fi

# gnmrd from the pack, on this machine, for the training run
data=$(mktemp -d /tmp/gnmr-gpu-XXXXXX)
"$bin/gnmrd" --data-dir "$data/data" --agents tcp://127.0.0.1:* \
  --admin "ipc://$data/admin.sock" >"$data/stdout" 2>"$data/gnmrd.log" &
gpid=$!
trap 'kill $gpid 2>/dev/null; wait $gpid 2>/dev/null; rm -rf "$data"' EXIT
agents=""
for _ in $(seq 100); do
  agents=$(sed -n 's/^gnmrd: agents \([^ ]*\).*/\1/p' "$data/stdout" | head -n 1)
  grep -q "^gnmrd: admin" "$data/stdout" 2>/dev/null && break
  sleep 0.1
done
if [ -z "$agents" ] || ! "$bin/gnmrctl" --admin "ipc://$data/admin.sock" stats >>"$out/env.txt" 2>&1; then
  note "gnmrd: did not start from the pack (env.txt)"
  cat "$data/gnmrd.log" >>"$out/env.txt"
  [ $rc -eq 0 ] && rc=1
else
  note "gnmrd: started from the pack, agents $agents"
fi

if [ $dry = 1 ]; then
  step python-import python.log 120 env GNMR_AGENT_LIB="$agentlib" \
    GNMR_BIN_DIR="$bin" PYTHONPATH="$PWD/python" "$PY" -c \
    'import gnmr, gnmr.pytorch, gnmr.recovery; from gnmr.agent import lib; lib(); print("gnmr imported from", gnmr.__file__)'
  note "dry run: stopped before the first CUDA call (test_gpu, norm_cuda, the training run, the CUDA tests and compute-sanitizer were not run)"
  note "gpu_check: exit $rc"
  exit $rc
fi

# ---- test_gpu: the first CUDA call -----------------------------------------
test_env=(env GNMR_BIN_DIR="$bin" GNMR_SOURCE_DIR="$PWD" GNMR_TRACES="$PWD/tests/traces")
step test_gpu test_gpu.log 90 "${test_env[@]}" "$gpu/test_gpu"
# no false green: a GPU that nvidia-smi lists must be tested, not skipped
if grep -q "SKIPPED" "$out/test_gpu.log" && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  note "test_gpu: skipped although nvidia-smi lists a GPU: FAILED"
  [ $rc -eq 0 ] && rc=1
fi
head -n 12 "$out/test_gpu.log" >>"$out/env.txt"

step norm_cuda norm_cuda.log 60 env GNMR_PYTHON="$PY" "$gpu/norm_cuda"

# ---- a real training run on CUDA -------------------------------------------
if [ -n "$agents" ]; then
  step train train.log 180 env GNMR_AGENT_LIB="$agentlib" GNMR_BIN_DIR="$bin" \
    PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$PY" scripts/gpu_train.py --agents "$agents" \
    --admin "ipc://$data/admin.sock" --out "$out" --device cuda
  rm -f "$out/train_trace.csv"  # the 8-file limit: its figures are in train.json
else
  note "train: not run (no gnmrd)"
fi

# ---- the package on that Python --------------------------------------------
whl=$(ls "$pack"/wheel/gnmr-*.whl 2>/dev/null | head -n 1)
if [ -n "$whl" ]; then
  site=$(mktemp -d /tmp/gnmr-site-XXXXXX)
  step wheel python.log 120 sh -c "'$PY' -m pip install -q --no-index --no-deps --no-compile --target '$site' '$whl' && cd / && PYTHONPATH='$site' '$PY' -c 'import gnmr, gnmr.pytorch; from gnmr.agent import cuda_device_count; n = cuda_device_count(); print(\"wheel:\", gnmr.__file__, \"CUDA devices:\", n); assert n > 0, \"the wheel'\"'\"'s agent sees no GPU\"'"
  rm -rf "$site"
fi
step python-cuda python.log 120 env GNMR_AGENT_LIB="$agentlib" GNMR_BIN_DIR="$bin" \
  PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  "$PY" -m unittest discover -s python/tests -p test_gnmr.py -k Cuda -v
if "$PY" -c 'import transformer_engine.pytorch, nvdlfw_inspect' 2>/dev/null; then
  step te-feature python.log 120 env GNMR_AGENT_LIB="$agentlib" \
    PYTHONPATH="$PWD/python" "$PY" python/tests/gpu_te_check.py "$agents"
else
  note "te-feature: Transformer Engine or nvdlfw-inspect not installed; not run"
fi

step compile python.log 150 env PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 "$PY" bench/compile_routes.py --device cuda --steps 50
if [ -n "$agents" ]; then
  step callbacks python.log 150 env GNMR_AGENT_LIB="$agentlib" GNMR_BIN_DIR="$bin" \
    PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$PY" bench/callbacks.py --device cuda --size gpu --steps 30 --rounds 1
fi

# ---- compute-sanitizer ------------------------------------------------------
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$san" ]; then
  for tool in memcheck racecheck synccheck; do
    step "sanitizer-$tool" sanitizer.log 90 "${test_env[@]}" "$san" --tool "$tool" \
      --error-exitcode 1 "$gpu/test_gpu"
  done
else
  note "compute-sanitizer: not found; not run"
fi
note "gpu_check: exit $rc after $(( $(date +%s) - start ))s"
exit $rc
