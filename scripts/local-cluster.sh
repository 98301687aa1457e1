#!/usr/bin/env bash
# A local cluster on loopback, start to finish: writes certificates, starts a coordinator
# and three nodes, uploads the flights plugins to the registry, submits the flights job at
# parallelism 3 (its HASH edge crosses the nodes), waits, prints its output, and stops
# every process it started.
#
#   scripts/local-cluster.sh [DIR]      # state in DIR (default nopstream-out/local-cluster)
#   just cluster-demo
set -euo pipefail
dir=$(realpath -m "${1:-$(dirname "$0")/../nopstream-out/local-cluster}")
cd "$(dirname "$0")/.."

port=${NOPSTREAM_DEMO_PORT:-7400}
addr=127.0.0.1:$port

cargo build -q -p nop-stream-cli
bin=${CARGO_TARGET_DIR:-target}/debug/nopstream
plugins=${CARGO_TARGET_DIR:-target}/wasm32/wasm32-wasip2/release

rm -rf "$dir"
mkdir -p "$dir"
"$bin" cluster init "$dir/certs" --nodes 3 >/dev/null

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$bin" coordinator --listen "$addr" --data "$dir/coord" --certs "$dir/certs" \
  >"$dir/coordinator.out" 2>"$dir/coordinator.log" &
pids+=($!)
for i in 1 2 3; do
  "$bin" node --join "$addr" --id "$i" --data "$dir/node-$i" --certs "$dir/certs" --storage "$dir/coord" \
    >/dev/null 2>"$dir/node-$i.log" &
  pids+=($!)
done

export NOPSTREAM_CLUSTER=$addr NOPSTREAM_CERTS=$dir/certs
for _ in $(seq 1 100); do
  live=$("$bin" cluster status --json 2>/dev/null | grep -c '"live": true' || true)
  [ "$live" = 3 ] && break
  sleep 0.2
done
"$bin" cluster status

"$bin" plugin upload "$plugins/file_source.wasm" "$plugins/flights_mapper.wasm" \
  "$plugins/keyed_aggregate.wasm" "$plugins/jsonl_sink.wasm"
"$bin" job submit examples/flights/flights.toml -p 3 --fresh --output "$dir/output" --wait
