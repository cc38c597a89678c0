#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/gpu/false_green.sh TEST_GPU — no false green: where the CUDA runtime
# sees no device, test_gpu must fail (not skip) when nvidia-smi lists a GPU.
# A stand-in nvidia-smi that lists one is put first in PATH. On a machine
# whose runtime does see a GPU there is nothing to check, and it says so.
set -u
bin=$1
dir=$(mktemp -d /tmp/gnmr-smi-XXXXXX)
trap 'rm -rf "$dir"' EXIT
out=$("$bin" 2>&1 </dev/null | head -n 3)
case "$out" in
*SKIPPED*) ;;
*) echo "false_green: the runtime sees a GPU here; nothing to check"; exit 0 ;;
esac
printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n' >"$dir/nvidia-smi"
chmod +x "$dir/nvidia-smi"
out=$(PATH="$dir:$PATH" "$bin" 2>&1 </dev/null)
rc=$?
if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -q "FAILED: nvidia-smi lists a GPU"; then
  echo "false_green: FAILED: test_gpu exited $rc with a GPU listed:"
  printf '%s\n' "$out"
  exit 1
fi
printf '%s\n' "$out" | grep FAILED
echo "false_green: passed (a listed GPU the runtime cannot see fails the run)"
