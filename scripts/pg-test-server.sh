#!/usr/bin/env bash
# A throwaway PostgreSQL 15 server on loopback for the Postgres sink tests.
#
#   eval "$(scripts/pg-test-server.sh start)"   # prints the exports the tests read
#   scripts/pg-test-server.sh stop "$NOP_TEST_PG_DIR"
#
# `start` creates a cluster in a fresh temp dir (initdb refuses root, so as root the server
# runs as the `postgres` user, or `nobody`), with max_prepared_transactions=64
# ($NOP_PG_MAX_PREPARED overrides it), listening on
# 127.0.0.1 at a free port only (no unix socket outside the temp dir). Role `nop` (password
# from $PGPASSWORD, default a random one; CREATEDB) logs in with scram-sha-256 over TCP.
# It prints NOP_TEST_PG_URL (no password in it), PGPASSWORD and NOP_TEST_PG_DIR.
# PostgreSQL 15 binaries: $PG_BIN, else /usr/lib/postgresql/15/bin, else PATH; on a Debian
# machine without them, install `postgresql-15` with apt.
set -euo pipefail

find_bin() {
  for d in "${PG_BIN:-}" /usr/lib/postgresql/15/bin /usr/local/bin; do
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
      echo "$d"; return 0
    fi
  done
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

ensure_installed() {
  if find_bin >/dev/null; then return 0; fi
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "pg-test-server: installing postgresql-15 with apt" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >&2
  fi
  find_bin >/dev/null || { echo "pg-test-server: PostgreSQL 15 binaries not found (set PG_BIN or install postgresql-15)" >&2; exit 1; }
}

# Runs "$@" as the server's user.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u "$OWNER" -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 - <<'PY' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

start() {
  ensure_installed
  local bin; bin=$(find_bin)
  OWNER=$(id -un)
  if [ "$(id -u)" = 0 ]; then
    if id postgres >/dev/null 2>&1; then OWNER=postgres; else OWNER=nobody; fi
  fi
  local dir; dir=$(mktemp -d /tmp/nop-pg.XXXXXX)
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown "$OWNER" "$dir"
  local password="${PGPASSWORD:-nop-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}"
  local pwfile="$dir/pw"
  printf '%s\n' "$password" > "$pwfile"
  [ "$(id -u)" = 0 ] && chown "$OWNER" "$pwfile"
  chmod 600 "$pwfile"
  as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  local port; port=$(free_port)
  cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_prepared_transactions = ${NOP_PG_MAX_PREPARED:-64}
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
CONF
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >&2 \
    || { cat "$dir/server.log" >&2; exit 1; }
  # `postgres` (superuser) over the unix socket in $dir; `nop` with a password over TCP.
  local psql="$bin/psql"
  [ -x "$psql" ] || psql=$(command -v psql || true)
  local sql="CREATE ROLE nop LOGIN CREATEDB PASSWORD '$(sed "s/'/''/g" "$pwfile")'"
  if [ -n "$psql" ]; then
    as_owner "$psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
      -c "$sql" -c "CREATE DATABASE nop OWNER nop" >&2
  else
    # No psql: single-statement bootstrap through the server's own client-less path is not
    # possible, so fail clearly.
    echo "pg-test-server: psql not found" >&2; exit 1
  fi
  rm -f "$pwfile"
  echo "export NOP_TEST_PG_URL='postgres://nop@127.0.0.1:$port/nop'"
  echo "export PGPASSWORD='$password'"
  echo "export NOP_TEST_PG_DIR='$dir'"
  echo "pg-test-server: PostgreSQL on 127.0.0.1:$port, data in $dir" >&2
}

stop() {
  local dir="${1:-${NOP_TEST_PG_DIR:-}}"
  [ -n "$dir" ] && [ -d "$dir/data" ] || { echo "pg-test-server: no server dir given" >&2; exit 1; }
  local bin; bin=$(find_bin)
  OWNER=$(stat -c %U "$dir/data")
  as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start | stop [dir]" >&2; exit 2 ;;
esac
