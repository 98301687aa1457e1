# nop-stream tasks; `.ci/run` runs the same commands with cargo directly. `cargo install just` to get `just`.

# List the recipes.
default:
    @just --list

# Run the flights job end to end (examples/flights).
demo:
    cargo run -p nop-stream-cli -- run examples/flights/flights.toml

# A coordinator and 3 nodes on loopback: upload the plugins, run the flights job, print its output.
cluster-demo:
    scripts/local-cluster.sh

# Run every test of the workspace.
test:
    cargo test --workspace

# Build the plugin components (target/wasm32/wasm32-wasip2/release/*.wasm; $CARGO_TARGET_DIR/wasm32/... when set).
plugins:
    cargo build -p nop-stream-artifacts

# Benchmark nop-stream against the native floor (release build; extra args go to `nopstream-bench run`, e.g. `--large`, `--runs 5`, `--workloads count`).
bench *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    cargo run --release -q -p nop-stream-bench -- run {{ARGS}}

# Postgres benchmarks (release build): the postgres-sink alone, the INSERT/COPY floors, JetStream -> Postgres. Needs NOP_TEST_PG_URL and PGPASSWORD (scripts/pg-test-server.sh), JetStream also NOP_TEST_NATS_URL and NOP_TEST_NATS_TOKEN (scripts/nats-test-server.sh); skipped otherwise.
bench-postgres *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench postgres {{ARGS}}

# Checkpoint cost: none / 1 s / 100 ms interleaved, then callgrind.
bench-checkpoints *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench checkpoint-cost {{ARGS}}

# Soak: 30 minutes of an unbounded keyed count with 1 s checkpoints and a
# state TTL; prints RSS, checkpoint and state bytes over time. Not part of any test run.
soak *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench soak {{ARGS}}

# Task scheduling latency: SCHED_BATCH vs the default policy for task threads, at p=2 with
# 100 ms checkpoints, below and at saturation: checkpoint duration and commit latency p50/p99.
bench-latency *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench latency {{ARGS}}

# Large keyed state: the keyed count with 1M and 5M distinct keys and 1 s
# checkpoints: rec/s, bytes and stall per epoch, peak RSS, a run with the state memory budget
# at a quarter of the state, recovery after SIGKILL; output checked against an expectation.
bench-large-state *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench large-state --budget-fraction 0.25 {{ARGS}}

# Checkpoints on an S3-compatible object store vs local ones (keyed count, 1 s checkpoints;
# CPU overhead, epoch duration p50/p99, restore MB/s). Needs NOP_TEST_S3_URL and the AWS_*
# credentials (`eval "$(scripts/s3-test-server.sh start)"`).
bench-object-store *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench object-store {{ARGS}}

# Cluster benchmarks (release build): keyed count on a coordinator + 2 node processes vs embedded, the QUIC channel hop vs in-process, recovery after a node SIGKILL.
bench-cluster:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    target/release/nopstream-bench cluster --runs 5
    target/release/nopstream-bench channel
    target/release/nopstream-bench cluster-recovery --trials 3

# Criterion microbenchmarks: boundary call, state get/put and flush, channel hop, HASH split, shard snapshot/restore.
bench-micro:
    cargo bench -p nop-stream-bench

# Add Apache Flink (apache-flink 1.20.1 from PyPI in .venv, Java 17; the version of the
# ÷ Flink ratios in bench/RESULTS.md and of `just bench-nexmark`) to the results of the
# last `just bench`.
bench-peers *ARGS:
    test -x .venv/bin/python || python3 -m venv .venv
    .venv/bin/python -c "import pyflink.version as v; assert v.__version__ == '1.20.1'" 2>/dev/null || .venv/bin/pip install apache-flink==1.20.1
    cargo run --release -q -p nop-stream-bench -- flink --python .venv/bin/python --script bench/peers/flink_job.py {{ARGS}}

# Nexmark q0-q5, q7-q9, q11: nop-stream vs the native floor vs Flink SQL over the
# same generated files; Flink is apache-flink 1.20.1 from PyPI in .venv (Java 17). Extra args
# go to `nopstream-bench nexmark`, e.g. `--events 1000000,10000000` for Flink's marginal rate.
bench-nexmark *ARGS:
    cargo build --release -p nop-stream-cli -p nop-stream-bench
    test -x .venv/bin/python || python3 -m venv .venv
    .venv/bin/python -c "import pyflink.version as v; assert v.__version__ == '1.20.1'" 2>/dev/null || .venv/bin/pip install apache-flink==1.20.1
    target/release/nopstream-bench nexmark --flink-python .venv/bin/python {{ARGS}}

# Format every crate.
fmt:
    cargo fmt --all

# Lint every crate and target, warnings as errors.
clippy:
    cargo clippy --workspace --all-targets -- -D warnings
