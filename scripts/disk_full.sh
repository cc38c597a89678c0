#!/bin/sh
# SPDX-License-Identifier: MIT
# A real full file system under gnmrd's history (issue 32: "disk full loses
# a job's history"): a tmpfs of FS_MB MiB (default 3) holds the data
# directory, a file fills it but for 64 KiB, a job of UNITS units (default
# 256) runs 1000 steps, the file goes, and the history is read back.
# Needs root (mount). Usage, from the root of the tree after make:
#   sudo sh scripts/disk_full.sh
#   sudo env UNITS=4096 FS_MB=64 sh scripts/disk_full.sh
set -eu
B=${GNMR_BIN_DIR:-build/bin}
T=$(mktemp -d /tmp/gnmr-diskfull-XXXXXX)
mkdir "$T/fs"
mount -t tmpfs -o size="${FS_MB:-3}M" tmpfs "$T/fs"
cleanup() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  umount "$T/fs" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
"$B/gnmrd" --data-dir "$T/fs/data" --agents "ipc://$T/a.sock" \
  --admin "ipc://$T/adm.sock" --log-level error >"$T/out" 2>"$T/err" &
PID=$!
sleep 1.5
avail=$(df --output=avail -B1 "$T/fs" | tail -1)
fallocate -l $((avail - 65536)) "$T/fs/filler"
ctl() { "$B/gnmrctl" --admin "ipc://$T/adm.sock" "$@"; }
"$B/gnmr-sim" --agents "ipc://$T/a.sock" --job full --ranks 1 --units "${UNITS:-256}" \
  --steps 1000 >"$T/sim.csv" 2>/dev/null
echo "disk_full: decisions the job got: $(($(wc -l <"$T/sim.csv") - 1))"
echo "disk_full: while full: $(ctl stats | grep -E '^store_(errors|queued|dropped) ' | tr -s ' ' | tr '\n' ';')"
rm "$T/fs/filler"
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  [ "$(ctl stats | awk '$1 == "store_queued" {print $2}')" = 0 ] && break
  sleep 0.5
done
echo "disk_full: space freed: $(ctl stats | grep -E '^store_(errors|queued|dropped) ' | tr -s ' ' | tr '\n' ';')"
stored=$(($(ctl decisions full --csv | wc -l) - 1))
echo "disk_full: decisions in the history: $stored"
echo "disk_full: the data directory holds $(du -sk "$T/fs/data" | cut -f1) KiB"
ctl decisions full --csv | tail -n +2 | cut -d, -f1 | sort >"$T/stored"
tail -n +2 "$T/sim.csv" | cut -d, -f1 | sort >"$T/got"
if cmp -s "$T/stored" "$T/got"; then
  echo "disk_full: every step the job got is in the history"
else
  echo "disk_full: steps missing from the history: $(comm -13 "$T/stored" "$T/got" | wc -l)"
fi
