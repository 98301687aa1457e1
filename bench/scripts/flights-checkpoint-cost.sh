#!/usr/bin/env bash
# Throughput of both flights jobs with checkpoint_interval_ms none / 1000 / 100, interleaved,
# 5 repetitions, in one run. Needs the release binary: cargo build --release -p nop-stream-cli
# Prints: job interval records seconds epochs records/s
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=target/release/nopstream
EX=examples/flights
OUT=$(mktemp -d)
trap 'rm -rf "$OUT" $EX/.m-*.toml' EXIT
for job in flights-per-record flights; do
  for ival in none 1000 100; do
    f=$EX/.m-$job-$ival.toml
    grep -v '^checkpoint_interval_ms' $EX/$job.toml > "$f"
    if [ "$ival" != none ]; then sed -i "s/^\[job\]$/[job]\ncheckpoint_interval_ms = $ival/" "$f"; fi
  done
done
for rep in 1 2 3 4 5; do
  for job in flights-per-record flights; do
    for ival in none 1000 100; do
      r=$($BIN run --fresh --no-progress --no-echo --json --output "$OUT/o-$job-$ival" --work-dir "$OUT/w-$job-$ival" $EX/.m-$job-$ival.toml 2>/dev/null)
      echo "$job $ival $(echo "$r" | python3 -c 'import json,sys; r=json.load(sys.stdin); w=r["wall"]["secs"]+r["wall"]["nanos"]/1e9; print(r["records_read"], round(w,3), r["epochs"], round(r["records_read"]/w))')"
    done
  done
done
