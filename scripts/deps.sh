#!/bin/sh
# SPDX-License-Identifier: MIT
# deps.sh GROUP... — makes sure the Debian packages GNMR needs are installed.
# As root it runs `apt-get update` and `apt-get install` for what is missing;
# otherwise it prints the exact apt-get line to run and fails.
# Groups: build (compile everything), check (tests), demo, fuzz, python.
set -eu

pkgs_build="gcc make pkg-config libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libsqlite3-dev libjansson-dev libinih-dev libsystemd-dev libmicrohttpd-dev libpq-dev libsodium-dev"
pkgs_check="check valgrind postgresql clang libclang-rt-14-dev systemd man-db prometheus curl iproute2 util-linux"
pkgs_fuzz="clang libclang-rt-14-dev"
pkgs_checklib="check"
pkgs_demo=""
# the Python stack itself comes from PyPI into build/venv (scripts/venv.sh)
pkgs_python="python3 python3-venv"

want=""
for g in "$@"; do
  case "$g" in
    build) want="$want $pkgs_build" ;;
    check) want="$want $pkgs_check" ;;
    demo) want="$want $pkgs_demo" ;;
    fuzz) want="$want $pkgs_fuzz" ;;
    checklib) want="$want $pkgs_checklib" ;;
    python) want="$want $pkgs_python" ;;
    *) echo "deps.sh: unknown group '$g'" >&2; exit 2 ;;
  esac
done

missing=""
for p in $want; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$st" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
  esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ]; then
  echo "deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
  echo "deps: installed$missing"
else
  echo "deps: missing Debian packages. Run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
  exit 1
fi
