#!/bin/sh
# SPDX-License-Identifier: MIT
# wheel.sh BUILD PYTHON OUTDIR — the gnmr wheel: python/ staged with
# BUILD's libgnmr-agent.so, gnmrd and gnmrctl, built by setuptools (no
# network: the venv's setuptools), then repaired by auditwheel, which
# copies into gnmr.libs/ every shared library they link that is not part
# of the manylinux baseline (ZeroMQ, protobuf-c, libsodium, libuv, SQLite,
# libpq, ...) and points their RPATH there. Prints the wheel's path last.
set -eu
B=$1
PY=$2
OUT=$3
stage=$B/wheel/src
rm -rf "$B/wheel"
mkdir -p "$stage/gnmr/bin" "$B/wheel/raw" "$OUT"
cp python/pyproject.toml python/setup.py "$stage/"
cp python/gnmr/*.py "$stage/gnmr/"
mkdir -p "$stage/gnmr/integrations/te_features"
cp python/gnmr/integrations/*.py python/gnmr/integrations/*.yaml \
  "$stage/gnmr/integrations/"
cp python/gnmr/integrations/te_features/*.py \
  "$stage/gnmr/integrations/te_features/"
# the man pages, where `man` finds them beside the venv's bin/
mkdir -p "$stage/man/man1" "$stage/man/man8"
cp man/man1/*.1 "$stage/man/man1/"
cp man/man8/*.8 "$stage/man/man8/"
{
  echo
  echo '[tool.setuptools.data-files]'
  printf '"share/man/man1" = [%s]\n' "$(cd "$stage" && ls man/man1/*.1 |
    sed 's/.*/"&"/' | paste -sd, -)"
  printf '"share/man/man8" = [%s]\n' "$(cd "$stage" && ls man/man8/*.8 |
    sed 's/.*/"&"/' | paste -sd, -)"
} >>"$stage/pyproject.toml"
cp "$B/lib/libgnmr-agent.so" "$stage/gnmr/"
cp "$B/bin/gnmrd" "$B/bin/gnmrctl" "$stage/gnmr/bin/"
strip --strip-debug "$stage/gnmr/libgnmr-agent.so" "$stage/gnmr/bin/"*
"$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index \
  -w "$B/wheel/raw" "$stage"
raw=$(ls "$B/wheel/raw"/gnmr-*.whl)
# the newest manylinux policy this machine's glibc meets
plat=$("$PY" -m auditwheel show "$raw" 2>/dev/null |
  sed -n 's/.*platform tag: *"\{0,1\}\([a-z0-9_]*\).*/\1/p' | head -n 1)
case "$plat" in
  manylinux*) ;;
  *) glibc=$(ldd --version | sed -n '1s/.* \([0-9]*\)\.\([0-9]*\)$/\1_\2/p')
     plat=manylinux_${glibc}_x86_64 ;;
esac
rm -f "$OUT"/gnmr-*.whl
PATH=$(cd "$(dirname "$PY")" && pwd):$PATH "$PY" -m auditwheel repair --plat "$plat" -w "$OUT" "$raw"
ls "$OUT"/gnmr-*.whl
