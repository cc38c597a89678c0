#!/bin/sh
# SPDX-License-Identifier: MIT
# pg_tmp.sh start|stop|kill|url DIR — a throwaway PostgreSQL cluster for the
# tests and benchmarks: initdb in DIR (as nobody when run as root: the
# server refuses to run as root), listening only on a Unix socket in DIR (no
# port to collide with), fsync off. Roles: gnmr (trusted, owns database
# gnmr) and secret (password "right", scram-sha-256: for the wrong-password
# tests). `start` prints the URL of database gnmr. PostgreSQL's server
# comes from Debian's postgresql package (scripts/deps.sh check).
set -eu
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: pg_tmp.sh start|stop|kill|url DIR" >&2
  exit 2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  echo "pg_tmp: PostgreSQL's server is not installed (scripts/deps.sh check installs postgresql)" >&2
  exit 1
fi
as=""
if [ "$(id -u)" = 0 ]; then
  as="runuser -u nobody --"
fi
url="postgresql://gnmr@/gnmr?host=$dir"
case "$cmd" in
start)
  if [ ! -d "$dir/data" ]; then
    mkdir -p "$dir"
    chmod 700 "$dir"
    [ -n "$as" ] && chown nobody "$dir"
    $as "$bin/initdb" -D "$dir/data" -U gnmr -A trust -E UTF8 --no-sync \
      >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    printf 'local all secret scram-sha-256\nlocal all all trust\n' \
      >"$dir/data/pg_hba.conf"
    fresh=1
  else
    fresh=0
  fi
  $as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-k $dir -c listen_addresses= -c fsync=off -c full_page_writes=off" \
    start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  if [ "$fresh" = 1 ]; then
    $as "$bin/psql" -q -h "$dir" -U gnmr -d postgres -v ON_ERROR_STOP=1 \
      -c "CREATE DATABASE gnmr" \
      -c "CREATE ROLE secret LOGIN PASSWORD 'right'" \
      -c "GRANT ALL ON DATABASE gnmr TO secret" >/dev/null
    $as "$bin/psql" -q -h "$dir" -U gnmr -d gnmr -v ON_ERROR_STOP=1 \
      -c "GRANT ALL ON SCHEMA public TO secret" >/dev/null
  fi
  echo "$url"
  ;;
stop) $as "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null ;;
kill) $as "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null ;;
url) echo "$url" ;;
*) echo "pg_tmp: unknown command '$cmd'" >&2; exit 2 ;;
esac
