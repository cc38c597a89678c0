#!/bin/sh
# SPDX-License-Identifier: MIT
# venv.sh DIR LOCK [PIN] — the virtual environment the Python tests run in:
# DIR is made with $VENV_PYTHON (default: python3 on PATH) and filled
# with pip from LOCK (python/requirements.lock); PIN (say torch==2.15.0)
# replaces the lock's line for the same package. pip's cache is reused,
# so a second install downloads nothing. DIR/.stamp records what was
# installed: the same LOCK and PIN again do nothing.
set -eu
dir=$1
lock=$2
pin=${3:-}
py=${VENV_PYTHON:-python3}
want="$(cat "$lock") pin=$pin py=$("$py" -c 'import sys; print(sys.version)' 2>/dev/null || echo none)"
if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; then
  exit 0
fi
if ! command -v "$py" >/dev/null 2>&1; then
  echo "venv: no $py on PATH (set VENV_PYTHON to a CPython 3.10 or newer)" >&2
  exit 1
fi
start=$(date +%s)
rm -rf "$dir"
# torch's wheels with their CUDA libraries unpack to 5-6 GiB: say so
# before pip fails half-way with ENOSPC (GNMR_VENV_MIN_FREE_MB overrides)
need=${GNMR_VENV_MIN_FREE_MB:-7000}
parent=$(dirname "$dir")
mkdir -p "$parent"
free=$(df -Pm "$parent" | awk 'NR==2 {print $4}')
if [ "$free" -lt "$need" ]; then
  echo "venv: $free MB free on $(df -P "$parent" | awk 'NR==2 {print $6}') for $dir; torch with its CUDA libraries needs about $need MB (free some space, or set GNMR_VENV_MIN_FREE_MB)" >&2
  exit 1
fi
if ! "$py" -m venv "$dir"; then
  echo "venv: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
reqs=$dir/requirements.txt
if [ -n "$pin" ]; then
  name=${pin%%[=<>!~]*}
  # the lock less PIN's package, then PIN
  grep -v -i "^$name==" "$lock" >"$reqs"
  echo "$pin" >>"$reqs"
else
  cp "$lock" "$reqs"
fi
echo "venv: installing $(grep -c '^[A-Za-z]' "$reqs") pinned packages into $dir${pin:+ ($pin)}"
# no byte-compiling of every module at install (a third of its time):
# the modules the tests import are compiled once, below
"$dir/bin/python" -m pip install -q --disable-pip-version-check \
  --no-input --no-compile -r "$reqs"
if grep -q -i '^torch==' "$reqs"; then
  "$dir/bin/python" -c 'import torch, torch.distributed.run, torch._dynamo, torch._inductor.compile_fx, torch.distributed.fsdp, torch.distributed.tensor.parallel'
  what=$("$dir/bin/python" -c 'import torch; print("torch", torch.__version__)')
else # a venv without torch (make wheel's)
  what="no torch"
fi
printf '%s' "$want" >"$dir/.stamp"
echo "venv: $dir ready in $(( $(date +%s) - start )) s ($what)"
