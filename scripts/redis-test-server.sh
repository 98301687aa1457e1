#!/usr/bin/env bash
# A throwaway Redis 7 server on loopback for the Redis Streams source and sink tests.
#
#   eval "$(scripts/redis-test-server.sh start)"   # prints the exports the tests read
#   scripts/redis-test-server.sh stop "$NOP_TEST_REDIS_DIR"
#
# `start` runs redis-server (installed with apt as `redis-server` if absent; Redis >= 7 is
# needed for max-deleted-entry-id) in a fresh temp dir, listening on 127.0.0.1 at a free
# port only (no unix socket), no persistence, with `requirepass` set to
# $NOP_TEST_REDIS_PASSWORD (default a random one) from a config file only its owner can
# read (so the password is on no command line). It prints NOP_TEST_REDIS_URL (no password
# in it), NOP_TEST_REDIS_PASSWORD and NOP_TEST_REDIS_DIR.
set -euo pipefail

find_bin() {
  for b in "${REDIS_SERVER:-}" /usr/bin/redis-server /usr/local/bin/redis-server; do
    if [ -n "$b" ] && [ -x "$b" ]; then echo "$b"; return 0; fi
  done
  command -v redis-server 2>/dev/null
}

ensure_installed() {
  if find_bin >/dev/null; then return 0; fi
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "redis-test-server: installing redis-server with apt" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
  fi
  find_bin >/dev/null || { echo "redis-test-server: redis-server not found (set REDIS_SERVER or install redis-server)" >&2; exit 1; }
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
  local version; version=$("$bin" --version | sed -E 's/.* v=([0-9]+)\..*/\1/')
  if [ "${version:-0}" -lt 7 ] 2>/dev/null; then
    echo "redis-test-server: $("$bin" --version) is too old; Redis >= 7 is needed" >&2; exit 1
  fi
  local dir; dir=$(mktemp -d /tmp/nop-redis.XXXXXX)
  local password="${NOP_TEST_REDIS_PASSWORD:-nop-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}"
  local port; port=$(free_port)
  umask 077
  cat >"$dir/redis.conf" <<CONF
bind 127.0.0.1
port $port
unixsocket ""
protected-mode yes
daemonize yes
pidfile $dir/redis.pid
logfile $dir/server.log
dir $dir
save ""
appendonly no
requirepass "$password"
CONF
  "$bin" "$dir/redis.conf" >&2 || { cat "$dir/server.log" >&2 2>/dev/null; exit 1; }
  # Wait until it answers (at most 10 s).
  for _ in $(seq 1 100); do
    if python3 - "$port" <<'PY' 2>/dev/null; then break; fi
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.2)
s.sendall(b"PING\r\n"); r = s.recv(64)
sys.exit(0 if r.startswith((b"+PONG", b"-NOAUTH")) else 1)
PY
    sleep 0.1
  done
  echo "export NOP_TEST_REDIS_URL='redis://127.0.0.1:$port/0'"
  echo "export NOP_TEST_REDIS_PASSWORD='$password'"
  echo "export NOP_TEST_REDIS_DIR='$dir'"
  echo "redis-test-server: Redis on 127.0.0.1:$port, files in $dir" >&2
}

stop() {
  local dir="${1:-${NOP_TEST_REDIS_DIR:-}}"
  [ -n "$dir" ] && [ -f "$dir/redis.conf" ] || { echo "redis-test-server: no server dir given" >&2; exit 1; }
  if [ -f "$dir/redis.pid" ]; then
    local pid; pid=$(cat "$dir/redis.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start | stop [dir]" >&2; exit 2 ;;
esac
