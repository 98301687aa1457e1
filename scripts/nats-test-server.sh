#!/usr/bin/env bash
# A throwaway NATS server with JetStream on loopback for the JetStream source tests.
#
#   eval "$(scripts/nats-test-server.sh start)"   # prints the exports the tests read
#   scripts/nats-test-server.sh restart "$NOP_TEST_NATS_DIR"   # same port, same store
#   scripts/nats-test-server.sh stop "$NOP_TEST_NATS_DIR"
#
# `start` writes a config into a fresh temp dir: listen on 127.0.0.1 only, at a free port
# ($NOP_TEST_NATS_PORT overrides it),
# JetStream with its file store in that dir, token authentication (token from
# $NOP_TEST_NATS_TOKEN, default a random one). It prints NOP_TEST_NATS_URL (no token in
# it), NOP_TEST_NATS_TOKEN and NOP_TEST_NATS_DIR. `restart` kills the server (SIGKILL)
# and starts it again on the same config and store, as a crash would. nats-server: PATH,
# else installed with apt (Debian's `nats-server`, 2.9) when running as root.
set -euo pipefail

ensure_installed() {
  if command -v nats-server >/dev/null; then return 0; fi
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "nats-test-server: installing nats-server with apt" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >&2
  fi
  command -v nats-server >/dev/null || { echo "nats-test-server: nats-server not found (install nats-server)" >&2; exit 1; }
}

free_port() {
  python3 - <<'PY' 2>/dev/null || echo $((20000 + RANDOM % 20000))
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

# Starts the server of $1 in the background and waits until it accepts connections.
launch() {
  local dir="$1"
  local port; port=$(cat "$dir/port")
  setsid nats-server -c "$dir/nats.conf" </dev/null >>"$dir/server.out" 2>&1 &
  echo $! > "$dir/nats.pid"
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  cat "$dir/server.out" "$dir/server.log" >&2 2>/dev/null || true
  echo "nats-test-server: the server did not come up on 127.0.0.1:$port" >&2
  exit 1
}

kill_server() {
  local dir="$1"
  if [ -f "$dir/nats.pid" ]; then
    local pid; pid=$(cat "$dir/nats.pid")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$dir/nats.pid"
  fi
}

start() {
  ensure_installed
  local dir; dir=$(mktemp -d /tmp/nop-nats.XXXXXX)
  local token="${NOP_TEST_NATS_TOKEN:-nop-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}"
  local port="${NOP_TEST_NATS_PORT:-$(free_port)}"
  echo "$port" > "$dir/port"
  cat > "$dir/nats.conf" <<CONF
listen: 127.0.0.1:$port
jetstream {
  store_dir: "$dir/js"
}
authorization {
  token: "$token"
}
log_file: "$dir/server.log"
CONF
  chmod 600 "$dir/nats.conf"
  launch "$dir"
  echo "export NOP_TEST_NATS_URL='nats://127.0.0.1:$port'"
  echo "export NOP_TEST_NATS_TOKEN='$token'"
  echo "export NOP_TEST_NATS_DIR='$dir'"
  echo "nats-test-server: nats-server on 127.0.0.1:$port, store in $dir/js" >&2
}

dir_arg() {
  local dir="${1:-${NOP_TEST_NATS_DIR:-}}"
  [ -n "$dir" ] && [ -f "$dir/nats.conf" ] || { echo "nats-test-server: no server dir given" >&2; exit 1; }
  echo "$dir"
}

case "${1:-}" in
  start) start ;;
  restart) shift; dir=$(dir_arg "$@"); kill_server "$dir"; launch "$dir" ;;
  stop) shift; dir=$(dir_arg "$@"); kill_server "$dir"; rm -rf "$dir" ;;
  *) echo "usage: $0 start | restart [dir] | stop [dir]" >&2; exit 2 ;;
esac
