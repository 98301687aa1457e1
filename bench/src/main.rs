//! `nopstream-bench`: the benchmark harness (design §20).
//!
//! - `gen`: the deterministic Nexmark-style bids CSV ([`bids`]).
//! - `run`: every workload ([`workload::WORKLOADS`]) on nop-stream (the release
//!   `nopstream` binary, one process per run) and on the native floor ([`floor`], also one
//!   process per run), interleaved, N times each; checks that nop-stream's output equals the
//!   floor's; prints the table and writes `results.{json,csv}` and `throughput.svg`.
//! - `flink`: the Flink peer (`peers/flink_job.py` in a virtualenv) on the same input,
//!   merged into the results of the last `run`.
//! - `report`: re-renders the table from `results.json`.
//! - `floor`: one floor run, printing its report as JSON (what `run` spawns).
//! - `cluster`: the keyed count on a coordinator and node processes (QUIC on loopback,
//!   mTLS) against embedded `nopstream run` at the same parallelism, interleaved
//!   ([`cluster_bench::throughput`]).
//! - `cluster-recovery`: node SIGKILL mid-run, the phases of the recovery
//!   ([`cluster_bench::recovery`]).
//! - `channel`: one channel hop over the QUIC data plane beside the in-process channel
//!   ([`channel`]).
//! - `checkpoint-cost`: what exactly-once checkpoints cost the keyed count, in CPU
//!   seconds over interleaved runs and in instructions under callgrind ([`ckpt_cost`]).
//! - `soak`: an unbounded generated keyed count with 1 s checkpoints and a state TTL for
//!   N minutes, sampling RSS and checkpoint and state bytes over time ([`soak`]).
//! - `large-state`: the keyed count with 1M and 5M distinct keys and 1 s checkpoints:
//!   throughput, bytes and stall per epoch, peak RSS, a byte-budgeted working set, and
//!   recovery after SIGKILL with the state built ([`large_state`]).
//! - `nexmark`: the Nexmark suite q0–q5, q7–q9, q11 against the floor and Flink SQL over
//!   the same generated files ([`nexmark`]); `nexmark-gen` writes the files,
//!   `nexmark-floor` is one floor run.
//! - `postgres`: the Postgres workloads of design §7.5 ([`pg`]): the postgres-sink alone,
//!   the multi-row INSERT and COPY floors, JetStream -> Postgres; skipped with a message
//!   when no server is configured.

mod bids;
mod channel;
mod ckpt_cost;
mod cluster;
mod cluster_bench;
mod epochs;
mod flink_check;
mod floor;
mod large_state;
mod latency;
mod measure;
mod nexmark;
mod object_store;
mod observe_overhead;
mod pg;
mod report;
mod soak;
mod workload;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use clap::{Parser, Subcommand};
use serde::Deserialize;

use crate::floor::{FloorReport, OutputSummary};
use crate::report::{FLINK, FLOOR, NOP_STREAM, Results, Row, Run};
use crate::workload::{Input, WORKLOADS, Workload};

/// Benchmark harness: nop-stream vs a native floor vs Apache Flink on the same input.
#[derive(Debug, Parser)]
#[command(name = "nopstream-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write a deterministic bids CSV (the same bytes as peers/gen.py).
    Gen {
        /// Number of bids.
        #[arg(long, default_value_t = 1_000_000)]
        records: u64,
        /// Number of auctions (keys), starting at 1000.
        #[arg(long, default_value_t = 10_000)]
        keys: u32,
        /// Omit the header line (Flink's CSV source expects none).
        #[arg(long)]
        no_header: bool,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Run the workloads on nop-stream and the floor; print and write the results.
    Run {
        /// Measured runs per workload and engine (after one unmeasured warm-up run).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also run on 10M bids.
        #[arg(long)]
        large: bool,
        /// Only these workloads (comma-separated names).
        #[arg(long, value_delimiter = ',')]
        workloads: Vec<String>,
        /// Parallelism of every nop-stream job (`nopstream run -p`).
        #[arg(long, short = 'p', default_value_t = 1)]
        parallelism: u32,
        /// Also run `count-ckpt` at this parallelism, each run right after its p=1 run and
        /// the floor's, as the row `nop-stream -p N`; the targets table then has design §20
        /// item 5's "records per CPU-second at p=N within 10 % of p=1". 0: not. Only with
        /// `-p 1` and `count-ckpt` selected.
        #[arg(long, default_value_t = 2)]
        scaling: u32,
        /// Records per batch of the generated jobs.
        #[arg(long, default_value_t = 1024)]
        batch_records: u32,
        /// The `nopstream` binary [default: next to this binary].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory (data, jobs, run directories, results).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Run the Flink peer on the same input and merge it into `<out>/results.json`.
    Flink {
        /// Python of a virtualenv with `apache-flink` installed.
        #[arg(long, default_value = ".venv/bin/python")]
        python: PathBuf,
        /// The Flink job script.
        #[arg(long, default_value = "bench/peers/flink_job.py")]
        script: PathBuf,
        /// Measured runs per workload and size, after one unmeasured warm-up run; the
        /// tables take their median.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also run on 10M bids.
        #[arg(long)]
        large: bool,
        /// Flink parallelism (`PAR`).
        #[arg(long, default_value_t = 1)]
        parallelism: u32,
        /// Flink state backend (`BACKEND`): `hashmap` (rows `flink`) or `rocksdb` (rows
        /// `flink-rocksdb`, not used for the ÷ Flink ratios).
        #[arg(long, default_value = "hashmap", value_parser = ["hashmap", "rocksdb"])]
        backend: String,
        /// Only these workloads (comma-separated names) [default: every one with a
        /// Flink query].
        #[arg(long, value_delimiter = ',')]
        workloads: Vec<String>,
        /// Output directory of the `run` whose results to extend.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// What checkpoints cost the keyed count (design §20): no periodic checkpoint,
    /// every 1 s and every 100 ms, interleaved, median CPU-second overhead; then
    /// instruction counts under `valgrind --tool=callgrind` with epochs triggered by
    /// record count; writes `<out>/checkpoint-cost.json`.
    CheckpointCost {
        /// Interleaved rounds (after one unmeasured warm-up of each variant).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Bids of the timed runs: enough for several 1 s epochs (a periodic variant
        /// whose median run takes fewer than 3 periodic checkpoints is reported as not
        /// measured). 80M bids are a 3.1 GB file and about 6.4 s of the keyed count (at
        /// 40M its 1 s variant took only 2 periodic checkpoints by 12-05).
        #[arg(long, default_value_t = 80_000_000)]
        records: u64,
        /// Bids of the callgrind runs.
        #[arg(long, default_value_t = 2_000_000)]
        valgrind_records: u64,
        /// Skip the callgrind runs.
        #[arg(long)]
        no_valgrind: bool,
        /// Records per batch.
        #[arg(long, default_value_t = 1024)]
        batch_records: u32,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Checkpoints on an S3-compatible object store against local ones: the keyed count
    /// with 1 s checkpoints, interleaved rounds (CPU overhead, epoch duration p50/p99),
    /// then a million-key state crashed and restored from each (restore MB/s); writes
    /// `<out>/object-store.json`. Needs the store's credentials in AWS_ACCESS_KEY_ID /
    /// AWS_SECRET_ACCESS_KEY (`scripts/s3-test-server.sh start` prints them for moto).
    ObjectStore {
        /// Where the runs put their checkpoints, e.g. `s3://nop/bench?endpoint=http://127.0.0.1:9000`.
        #[arg(long, env = "NOP_TEST_S3_URL")]
        s3: String,
        /// Generated bids of the timed runs.
        #[arg(long, default_value_t = 20_000_000)]
        records: u64,
        /// Distinct keys of the timed runs.
        #[arg(long, default_value_t = 100_000)]
        keys: u32,
        /// Interleaved rounds (after one unmeasured warm-up of each store).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Keys of the restore job.
        #[arg(long, default_value_t = 1_000_000)]
        restore_keys: u32,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Soak (design §8.1): an unbounded generated keyed count with 1 s checkpoints
    /// and a TTL on its state, sampling RSS, checkpoint and state bytes and durable epochs
    /// over time; writes `<out>/soak.json`. Not run by any test.
    Soak {
        /// Minutes to run.
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Seconds between samples.
        #[arg(long, default_value_t = 30)]
        sample_secs: u64,
        /// Generated records per second.
        #[arg(long, default_value_t = 200_000)]
        rate: u64,
        /// Live auctions at a time.
        #[arg(long, default_value_t = 10_000)]
        keys: u32,
        /// A new auction every this many records (the key space grows without bound).
        #[arg(long, default_value_t = 100)]
        rotate_every: u64,
        /// TTL of the count state, ms.
        #[arg(long, default_value_t = 60_000)]
        ttl_ms: u64,
        /// Run without a TTL (state grows with the key space).
        #[arg(long)]
        no_ttl: bool,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// What `SCHED_BATCH` task threads cost in latency: the keyed count over generated
    /// bids at parallelism 2 with 100 ms checkpoints, at loads below and at saturation,
    /// both `--task-scheduling` policies interleaved; per load and policy p50/p99/max of
    /// barrier injection → snapshot durable and → sinks committed, CPU seconds, and
    /// `batch ÷ normal`; writes `<out>/latency.json`. Not run by any test.
    Latency {
        /// Parallelism.
        #[arg(long, default_value_t = 2)]
        parallelism: u32,
        /// Checkpoint interval, ms.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// Seconds of input per run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Loads as fractions of the saturated rate (1 = unthrottled), comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.9, 1.0])]
        loads: Vec<f64>,
        /// Rounds per load, each running both policies.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Large keyed state (design §5.5, §8.1): the keyed count over generated bids with
    /// many distinct keys and 1 s checkpoints; per size records/s, bytes and stall per
    /// epoch, peak RSS, a run with a working-set budget, and recovery after a SIGKILL
    /// with the state built; every run's output checked against a native expectation;
    /// writes `<out>/large-state.json`.
    LargeState {
        /// Distinct auctions per size, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1_000_000u32, 5_000_000])]
        keys: Vec<u32>,
        /// Bids per auction.
        #[arg(long, default_value_t = 3)]
        bids_per_key: u64,
        /// Also run with `state_memory_bytes` at this fraction of the full state size.
        #[arg(long)]
        budget_fraction: Option<f64>,
        /// Kill the recovery run once a durable epoch's chain holds this fraction of the
        /// keys in entries (full payloads' entries plus delta changes, an upper bound).
        #[arg(long, default_value_t = 0.8)]
        kill_fraction: f64,
        /// Skip the recovery run.
        #[arg(long)]
        no_recovery: bool,
        /// Records per batch.
        #[arg(long, default_value_t = 1024)]
        batch_records: u32,
        /// Run with `async_snapshots = false` (segments written on the task thread).
        #[arg(long)]
        sync_snapshots: bool,
        /// Run with `incremental_snapshots = false` (every epoch a full snapshot).
        #[arg(long)]
        full_snapshots: bool,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// The Nexmark suite (q0-q5, q7-q9, q11): nop-stream, the native floor and (with
    /// `--flink-python`) Flink SQL over the same generated files, interleaved; prints
    /// events/s, events per CPU-second, ÷ floor, ÷ Flink and Flink's published per-core
    /// figure per query, and writes `<out>/nexmark.json`.
    Nexmark {
        /// Events of the stream (all kinds); a second size (`--events 1000000,10000000`)
        /// gives Flink's marginal rate.
        #[arg(long, value_delimiter = ',', default_value = "1000000")]
        events: Vec<u64>,
        /// Measured runs per engine, query and size, after one unmeasured warm-up.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Only these queries (comma-separated: q0,q3,...).
        #[arg(long, value_delimiter = ',')]
        queries: Vec<String>,
        /// Python of a virtualenv with the pinned `apache-flink` (`just bench-nexmark`
        /// creates it); without it Flink is not run.
        #[arg(long)]
        flink_python: Option<PathBuf>,
        /// The Flink job script.
        #[arg(long, default_value = "bench/peers/nexmark_flink.py")]
        flink_script: PathBuf,
        /// The `nopstream` binary [default: next to this binary].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory (data, jobs, runs, nexmark.json).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Write the Nexmark files (persons.csv, auctions.csv, bids.csv) of the first N events.
    NexmarkGen {
        /// Events of the stream.
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// One Nexmark floor run, printing its report as JSON (what `nexmark` spawns).
    NexmarkFloor {
        /// The query.
        #[arg(long)]
        query: String,
        /// The data directory of `nexmark-gen`.
        #[arg(long)]
        data: PathBuf,
    },
    /// Print the table of `<out>/results.json` and re-render the files.
    Report {
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// What watching a job costs: `count-ckpt` embedded in interleaved pairs, plain and
    /// with `--http` and a scraper reading /metrics every interval; prints the median CPU
    /// ratio and checks both runs' output; writes `<out>/observe-overhead.json`.
    ObserveOverhead {
        /// Measured pairs (after one unmeasured warm-up of each).
        #[arg(long, default_value_t = 5)]
        pairs: usize,
        /// Bids per run (long enough for several scrapes).
        #[arg(long, default_value_t = 40_000_000)]
        records: u64,
        /// Scrape interval, ms.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Parallelism.
        #[arg(short, long, default_value_t = 1)]
        parallelism: u32,
        /// Checkpoint interval, ms [default: the workload's, 1000]. A short one builds in
        /// seconds the epoch-log history a job that ran for hours has.
        #[arg(long)]
        checkpoint_ms: Option<u64>,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// Recovery time after SIGKILL: runs a checkpointing workload, kills it mid-run,
    /// restarts it, and reports the time from the restart to the first epoch the new
    /// attempt committed (read from the epoch log); writes `<out>/recovery.json`.
    Recovery {
        /// Workload (one with checkpoints).
        #[arg(long, default_value = "count-ckpt")]
        workload: String,
        /// Trials.
        #[arg(long, default_value_t = 5)]
        trials: usize,
        /// Kill this many ms after the start [default: half of an uninterrupted run].
        #[arg(long)]
        kill_after_ms: Option<u64>,
        /// 10M bids instead of 1M.
        #[arg(long)]
        large: bool,
        /// The `nopstream` binary [default: next to this one].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory.
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// The keyed count at parallelism P on a coordinator and P node processes (release
    /// binaries, QUIC on loopback, mTLS) against embedded `nopstream run -p P`,
    /// interleaved: records per CPU second and wall time, cluster ÷ embedded; writes
    /// `<out>/cluster.json`.
    Cluster {
        /// Measured pairs (embedded, cluster), after one unmeasured warm-up of each.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Input size: `1m` or `10m` bids.
        #[arg(long, default_value = "10m", value_parser = ["1m", "10m"])]
        size: String,
        /// Parallelism of both runs, and node processes of the cluster.
        #[arg(long, short = 'p', default_value_t = 2)]
        parallelism: u32,
        /// Lease TTL of the cluster (`nopstream coordinator --lease-ttl-ms`).
        #[arg(long, default_value_t = 10_000)]
        lease_ttl_ms: u64,
        /// Heartbeat interval of the cluster (`--heartbeat-ms`).
        #[arg(long, default_value_t = 2_000)]
        heartbeat_ms: u64,
        #[command(flatten)]
        bins: Bins,
    },
    /// Recovery after SIGKILL of a node holding tasks of the checkpointed keyed count:
    /// detection, redeploy, restore and the first committed epoch, from the processes'
    /// logs and the epoch log; writes `<out>/cluster-recovery.json`.
    ClusterRecovery {
        /// Trials (a fresh cluster each).
        #[arg(long, default_value_t = 3)]
        trials: usize,
        /// Node processes (the job runs on P of them; the survivors take over).
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// Input size: `1m` or `10m` bids.
        #[arg(long, default_value = "10m", value_parser = ["1m", "10m"])]
        size: String,
        /// Parallelism of the job.
        #[arg(long, short = 'p', default_value_t = 2)]
        parallelism: u32,
        /// Kill this long after the first durable epoch was seen.
        #[arg(long, default_value_t = 300)]
        kill_delay_ms: u64,
        /// Lease TTL (the cluster tests' 2 s).
        #[arg(long, default_value_t = 2_000)]
        lease_ttl_ms: u64,
        /// Heartbeat interval.
        #[arg(long, default_value_t = 300)]
        heartbeat_ms: u64,
        #[command(flatten)]
        bins: Bins,
    },
    /// The Postgres workloads (design §7.5): the postgres-sink alone (2PC, 1 s
    /// checkpoints), the multi-row INSERT and COPY floors from this process, and
    /// JetStream -> Postgres; rows/s, commit latency per epoch (p50/p99) and ratios to the
    /// floors. Skipped with a message without `NOP_TEST_PG_URL`/`PGPASSWORD` (JetStream:
    /// without `NOP_TEST_NATS_URL`/`NOP_TEST_NATS_TOKEN`).
    Postgres {
        /// Measured runs of each workload (after one unmeasured warm-up of each job).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The `nopstream` binary [default: next to this binary].
        #[arg(long)]
        nopstream: Option<PathBuf>,
        /// Output directory (the jobs' work directories).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// One channel hop over the QUIC data plane on loopback beside the in-process channel,
    /// with the count job's parsed-bid batches: records/s, MB/s, records per CPU second.
    Channel {
        /// Records per batch (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [128usize, 1024, 8192])]
        batch_records: Vec<usize>,
        /// Records per transfer.
        #[arg(long, default_value_t = 2_000_000)]
        records: usize,
        /// Transfers of each kind per batch size (interleaved).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Output directory (`channel.json`).
        #[arg(long, default_value = "bench-out")]
        out: PathBuf,
    },
    /// One floor run of a workload, printed as JSON (spawned by `run`).
    Floor {
        /// Workload name.
        #[arg(long)]
        workload: String,
        /// Input CSV.
        #[arg(long)]
        input: PathBuf,
    },
}

/// The binaries and plugins the cluster benchmarks run, and their output directory.
#[derive(Debug, clap::Args)]
struct Bins {
    /// The `nopstream` binary [default: next to this binary].
    #[arg(long)]
    nopstream: Option<PathBuf>,
    /// Directory of the plugin components [default: `target/wasm32/wasm32-wasip2/release`
    /// beside the binary's `target/release`].
    #[arg(long)]
    plugins: Option<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
}

impl Bins {
    fn setup(
        &self,
        size: &str,
        parallelism: u32,
        lease_ttl_ms: u64,
        heartbeat_ms: u64,
    ) -> Result<cluster_bench::Setup> {
        let nopstream = nopstream_binary(self.nopstream.clone())?;
        let plugins = match &self.plugins {
            Some(p) => absolute(p)?,
            None => nopstream
                .parent()
                .and_then(Path::parent)
                .context("target directory")?
                .join("wasm32/wasm32-wasip2/release"),
        };
        ensure!(
            plugins.join("keyed_count.wasm").is_file(),
            "no plugin components in {}: pass --plugins",
            plugins.display()
        );
        let size = SIZES
            .iter()
            .copied()
            .find(|(l, _)| *l == size)
            .with_context(|| format!("unknown size {size}"))?;
        Ok(cluster_bench::Setup {
            nopstream,
            out: absolute(&self.out)?,
            plugins,
            size,
            parallelism,
            lease_ttl_ms,
            heartbeat_ms,
        })
    }
}

/// The input sizes: label and records.
const SIZES: [(&str, u64); 2] = [("1m", 1_000_000), ("10m", 10_000_000)];
/// Auctions in the generated bids.
const KEYS: u32 = 10_000;

fn main() -> std::process::ExitCode {
    match dispatch(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `given`, or the `nopstream` next to this binary; it must exist.
fn nopstream_binary(given: Option<PathBuf>) -> Result<PathBuf> {
    let nopstream = match given {
        Some(p) => absolute(&p)?,
        None => std::env::current_exe()?
            .parent()
            .context("binary directory")?
            .join("nopstream"),
    };
    ensure!(
        nopstream.is_file(),
        "{} not found: build it with `cargo build --release -p nop-stream-cli` or pass --nopstream",
        nopstream.display()
    );
    Ok(nopstream)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir()?.join(p)
    })
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Cmd::Gen {
            records,
            keys,
            no_header,
            out,
        } => generate(&out, records, keys, !no_header),
        Cmd::Floor { workload, input } => {
            let r = floor::run(&workload, &input)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
        Cmd::Run {
            runs,
            large,
            workloads,
            parallelism,
            scaling,
            batch_records,
            nopstream,
            out,
        } => {
            let nopstream = nopstream_binary(nopstream)?;
            for n in &workloads {
                ensure!(
                    workload::find(n).is_some(),
                    "unknown workload `{n}`; known: {:?}",
                    WORKLOADS.iter().map(|w| w.name).collect::<Vec<_>>()
                );
            }
            let selected: Vec<&Workload> = WORKLOADS
                .iter()
                .filter(|w| workloads.is_empty() || workloads.iter().any(|n| n == w.name))
                .collect();
            ensure!(!selected.is_empty(), "no workload matches {workloads:?}");
            let cfg = RunConfig {
                runs: runs.max(1),
                parallelism,
                batch_records,
                nopstream,
                out: absolute(&out)?,
            };
            let scaling = (parallelism == 1 && scaling > 1).then_some(scaling);
            let results = run_all(&cfg, &selected, large, scaling)?;
            println!("\n{}", results.table());
            results.write(&cfg.out)?;
            println!(
                "wrote {}/results.json, results.csv, throughput.svg",
                cfg.out.display()
            );
            Ok(())
        }
        Cmd::Flink {
            python,
            script,
            runs,
            large,
            parallelism,
            backend,
            workloads,
            out,
        } => {
            for n in &workloads {
                ensure!(
                    workload::find(n).is_some_and(|w| w.flink_query.is_some()),
                    "unknown workload `{n}` or one without a Flink query"
                );
            }
            let out = absolute(&out)?;
            let mut results = load(&out).unwrap_or_default();
            let peer = FlinkConfig {
                python: absolute(&python)?,
                script: absolute(&script)?,
                runs: runs.max(1),
                large,
                parallelism,
                backend,
                only: workloads,
            };
            run_flink(&mut results, &peer, &out)?;
            println!("\n{}", results.table());
            results.write(&out)?;
            Ok(())
        }
        Cmd::ObserveOverhead {
            pairs,
            records,
            interval_ms,
            parallelism,
            checkpoint_ms,
            nopstream,
            out,
        } => {
            let nopstream = nopstream_binary(nopstream)?;
            let out = absolute(&out)?;
            observe_overhead::run(
                &nopstream,
                &out,
                records,
                pairs.max(1),
                std::time::Duration::from_millis(interval_ms.max(10)),
                parallelism.max(1),
                checkpoint_ms,
            )?;
            Ok(())
        }
        Cmd::Recovery {
            workload,
            trials,
            kill_after_ms,
            large,
            nopstream,
            out,
        } => {
            let w = workload::find(&workload)
                .filter(|w| w.checkpoint_ms.is_some() && w.input == Input::Bids)
                .with_context(|| format!("`{workload}` is not a bids workload with checkpoints"))?;
            let nopstream = nopstream_binary(nopstream)?;
            let cfg = RunConfig {
                runs: 1,
                parallelism: 1,
                batch_records: 1024,
                nopstream,
                out: absolute(&out)?,
            };
            recovery(&cfg, w, trials.max(1), kill_after_ms, large)
        }
        Cmd::Cluster {
            runs,
            size,
            parallelism,
            lease_ttl_ms,
            heartbeat_ms,
            bins,
        } => {
            ensure!(
                parallelism >= 2,
                "the HASH edge crosses nodes only at -p 2 or more"
            );
            let setup = bins.setup(&size, parallelism, lease_ttl_ms, heartbeat_ms)?;
            let r = cluster_bench::throughput(&setup, runs.max(1))?;
            println!("\n{}\nplacement: {}", r.table(), r.placement);
            println!("wrote {}", setup.out.join("cluster.json").display());
            Ok(())
        }
        Cmd::ClusterRecovery {
            trials,
            nodes,
            size,
            parallelism,
            kill_delay_ms,
            lease_ttl_ms,
            heartbeat_ms,
            bins,
        } => {
            ensure!(
                nodes >= 2 && parallelism >= 1,
                "a node must survive the kill: --nodes 2 or more"
            );
            let setup = bins.setup(&size, parallelism, lease_ttl_ms, heartbeat_ms)?;
            let r = cluster_bench::recovery(&setup, nodes, trials.max(1), kill_delay_ms)?;
            println!("\n{}", r.table());
            println!(
                "wrote {}",
                setup.out.join("cluster-recovery.json").display()
            );
            Ok(())
        }
        Cmd::Postgres {
            runs,
            nopstream,
            out,
        } => {
            let nopstream = nopstream_binary(nopstream)?;
            pg::run(&nopstream, runs.max(1), &out)
        }
        Cmd::Channel {
            batch_records,
            records,
            runs,
            out,
        } => {
            ensure!(
                !batch_records.is_empty() && batch_records.iter().all(|&b| b > 0),
                "--batch-records needs positive sizes"
            );
            let transfers = channel::run(&batch_records, records, runs.max(1))?;
            let out = absolute(&out)?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(
                out.join("channel.json"),
                serde_json::to_string_pretty(&serde_json::json!({
                    "date": utc_now(),
                    "machine": machine(),
                    "transfers": transfers,
                }))?,
            )?;
            println!("wrote {}", out.join("channel.json").display());
            Ok(())
        }
        Cmd::CheckpointCost {
            runs,
            records,
            valgrind_records,
            no_valgrind,
            batch_records,
            nopstream,
            out,
        } => {
            let setup = ckpt_cost::Setup {
                nopstream: nopstream_binary(nopstream)?,
                out: absolute(&out)?,
                records,
                runs: runs.max(1),
                valgrind_records: (!no_valgrind).then_some(valgrind_records),
                batch_records,
            };
            let report = ckpt_cost::run(&setup)?;
            println!("\n{}", report.table());
            report.write(&setup.out)?;
            println!("wrote {}/checkpoint-cost.json", setup.out.display());
            Ok(())
        }
        Cmd::ObjectStore {
            s3,
            records,
            keys,
            runs,
            restore_keys,
            nopstream,
            out,
        } => {
            let setup = object_store::Setup {
                nopstream: nopstream_binary(nopstream)?,
                out: absolute(&out)?,
                s3: nop_stream_checkpoint::Location::parse(&s3)?,
                records,
                keys,
                runs: runs.max(1),
                restore_keys,
            };
            object_store::run(&setup)?;
            println!("wrote {}/object-store.json", setup.out.display());
            Ok(())
        }
        Cmd::Soak {
            minutes,
            sample_secs,
            rate,
            keys,
            rotate_every,
            ttl_ms,
            no_ttl,
            nopstream,
            out,
        } => {
            let setup = soak::Setup {
                nopstream: nopstream_binary(nopstream)?,
                out: absolute(&out)?,
                minutes,
                sample_secs: sample_secs.max(1),
                rate: rate.max(1),
                keys: keys.max(1),
                rotate_every: rotate_every.max(1),
                ttl_ms: (!no_ttl).then_some(ttl_ms),
            };
            let report = soak::run(&setup)?;
            print!("{}", report.summary());
            std::fs::write(
                setup.out.join("soak.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            println!("wrote {}/soak.json", setup.out.display());
            Ok(())
        }
        Cmd::Latency {
            parallelism,
            interval_ms,
            seconds,
            loads,
            rounds,
            nopstream,
            out,
        } => {
            let setup = latency::Setup {
                nopstream: nopstream_binary(nopstream)?,
                out: absolute(&out)?,
                parallelism: parallelism.max(1),
                interval_ms: interval_ms.max(1),
                seconds,
                loads,
                rounds,
            };
            let report = latency::run(&setup)?;
            print!("{}", report.table());
            std::fs::write(
                setup.out.join("latency.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            println!("wrote {}/latency.json", setup.out.display());
            Ok(())
        }
        Cmd::LargeState {
            keys,
            bids_per_key,
            budget_fraction,
            kill_fraction,
            no_recovery,
            batch_records,
            sync_snapshots,
            full_snapshots,
            nopstream,
            out,
        } => {
            ensure!(
                !keys.is_empty() && keys.iter().all(|&k| k > 0),
                "--keys: give at least one size, each at least 1"
            );
            ensure!(
                budget_fraction.is_none_or(|f| f > 0.0),
                "--budget-fraction must be positive"
            );
            ensure!(
                kill_fraction > 0.0 && kill_fraction <= 1.0,
                "--kill-fraction must be in (0, 1]"
            );
            let setup = large_state::Setup {
                nopstream: nopstream_binary(nopstream)?,
                out: absolute(&out)?,
                keys,
                bids_per_key: bids_per_key.max(1),
                budget_fraction,
                kill_fraction: (!no_recovery).then_some(kill_fraction),
                batch_records,
                sync_snapshots,
                full_snapshots,
            };
            let report = large_state::run(&setup)?;
            println!("\n{}", report.table());
            std::fs::write(
                setup.out.join("large-state.json"),
                serde_json::to_string_pretty(&report)?,
            )?;
            println!("wrote {}/large-state.json", setup.out.display());
            Ok(())
        }
        Cmd::Nexmark {
            events,
            runs,
            queries,
            flink_python,
            flink_script,
            nopstream,
            out,
        } => {
            let mut sizes = events;
            sizes.sort_unstable();
            sizes.dedup();
            ensure!(
                !sizes.is_empty() && sizes.len() <= 2,
                "--events takes one or two sizes"
            );
            std::fs::create_dir_all(&out)?;
            let flink_python = flink_python.map(|p| absolute(&p)).transpose()?;
            nexmark::run(&nexmark::Options {
                sizes,
                runs,
                queries: nexmark::parse_queries(&queries)?,
                nopstream: nopstream_binary(nopstream)?,
                flink_python,
                flink_script: absolute(&flink_script)?,
                out: absolute(&out)?,
                repo: absolute(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").as_path())?,
            })
        }
        Cmd::NexmarkGen { events, out } => nexmark::generate(events, &out),
        Cmd::NexmarkFloor { query, data } => {
            let q = nexmark::parse_queries(std::slice::from_ref(&query))?[0];
            println!("{}", serde_json::to_string(&nexmark::floor(q, &data)?)?);
            Ok(())
        }
        Cmd::Report { out } => {
            let results = load(&out)?;
            println!("{}", results.table());
            results.write(&out)
        }
    }
}

fn load(out: &Path) -> Result<Results> {
    let path = out.join("results.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

fn generate(out: &Path, records: u64, keys: u32, header: bool) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = out.with_extension("csv.tmp");
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
    bids::write_bids(&mut w, records, keys, header)?;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// The bids file of a size, generated if missing.
fn bids_file(data: &Path, label: &str, records: u64, header: bool) -> Result<PathBuf> {
    let name = if header {
        format!("bids-{label}.csv")
    } else {
        format!("bids-{label}-nohdr.csv")
    };
    let path = data.join(name);
    if !path.is_file() {
        eprintln!("generating {} ({records} bids)", path.display());
        generate(&path, records, KEYS, header)?;
    }
    Ok(path)
}

#[derive(Clone)]
struct RunConfig {
    runs: usize,
    parallelism: u32,
    batch_records: u32,
    nopstream: PathBuf,
    out: PathBuf,
}

#[derive(Deserialize)]
struct WallTime {
    secs: u64,
    nanos: u32,
}

/// The fields of the CLI's `--json` run report the bench reads.
#[derive(Deserialize)]
struct JobReport {
    wall: WallTime,
    records_read: u64,
}

/// The merged summaries the blackhole sink committed into `output` (one
/// `summary-*.json` per subtask and epoch), or `None` if there are none (another sink).
fn committed_output(output: &Path) -> Result<Option<OutputSummary>> {
    let mut total = OutputSummary::default();
    let mut found = false;
    for e in std::fs::read_dir(output)? {
        let path = e?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !(name.starts_with("summary-") && name.ends_with(".json")) {
            continue;
        }
        let s: OutputSummary = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("read {}", path.display()))?;
        total.records += s.records;
        total.bytes += s.bytes;
        total.checksum = total.checksum.wrapping_add(s.checksum);
        found = true;
    }
    Ok(found.then_some(total))
}

struct Case<'a> {
    workload: &'a Workload,
    input: PathBuf,
    job: PathBuf,
    run_dir: PathBuf,
}

/// Record-count epochs a checkpointing workload's timed runs take besides their interval:
/// one per this share of the input, so every run takes at least
/// [`report::MIN_PERIODIC_CHECKPOINTS`] periodic checkpoints however fast it reads (a 10M
/// input read in under a second took only its final epoch at a 1 s interval). More epochs
/// than the interval alone would take: the checkpoint cost is counted high, never left out.
const EPOCHS_PER_INPUT: u64 = 8;

/// `text`, the job of `w` over `records` input records, with record-count epochs added
/// when `w` checkpoints (see [`EPOCHS_PER_INPUT`]).
fn with_checkpoints(w: &Workload, text: String, records: u64) -> String {
    match w.checkpoint_ms {
        Some(ms) => {
            let interval = format!("checkpoint_interval_ms = {ms}\n");
            text.replacen(
                &interval,
                &format!(
                    "{interval}checkpoint_every_records = {}\n",
                    (records / EPOCHS_PER_INPUT).max(1)
                ),
                1,
            )
        }
        None => text,
    }
}

/// The workload `run --scaling N` runs again at parallelism N (design §20 measures
/// the keyed count with checkpoints), in the run directory `<case>-pN`.
const SCALING_WORKLOAD: &str = "count-ckpt";

fn run_all(
    cfg: &RunConfig,
    selected: &[&Workload],
    large: bool,
    scaling: Option<u32>,
) -> Result<Results> {
    let data = cfg.out.join("data");
    let jobs = cfg.out.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    let mut cases = Vec::new();
    let sizes = if large { &SIZES[..] } else { &SIZES[..1] };
    for w in selected {
        match w.input {
            Input::Bids => {
                for &(label, records) in sizes {
                    let input = bids_file(&data, label, records, true)?;
                    let file_name = input.file_name().context("file name")?.to_string_lossy();
                    let job = jobs.join(format!("{}-{label}.toml", w.name));
                    std::fs::write(
                        &job,
                        with_checkpoints(
                            w,
                            workload::job_text(w, "../data", &file_name, cfg.batch_records),
                            records,
                        ),
                    )?;
                    cases.push(Case {
                        workload: w,
                        input,
                        job,
                        run_dir: cfg.out.join("runs").join(format!("{}-{label}", w.name)),
                    });
                }
            }
            Input::Flights => cases.push(Case {
                workload: w,
                input: workload::flights_csv(),
                job: workload::flights_job(),
                run_dir: cfg.out.join("runs").join(w.name),
            }),
        }
    }
    let mut results = Results {
        date: utc_now(),
        machine: machine(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        rows: Vec::new(),
    };
    let mut checkpoint_stats = Vec::new();
    for case in &cases {
        let name = case.workload.name;
        eprintln!("== {name} on {}", case.input.display());
        // Warm-up: fills the component compile cache, unpacks the flights file, warms the
        // page cache. Not measured.
        let (_, warm) = nopstream_run(cfg, case)?;
        let (_, warm_floor) = floor_run(case)?;
        ensure!(
            warm.records_read == warm_floor.records,
            "{name}: nop-stream read {} records, the floor {}",
            warm.records_read,
            warm_floor.records
        );
        // The bids workloads end in the blackhole sink, whose committed summaries every
        // run (warm-up, timed, p=2) must report and match the floor's with; the flights
        // example's jsonl sink reports none, so its runs are checked by records read.
        let expected = matches!(case.workload.input, Input::Bids).then_some(warm_floor.output);
        check_committed(&case.run_dir, expected.as_ref(), name, "warm-up")?;
        let checked = if expected.is_some() {
            "output of every run = floor (count, checksum)"
        } else {
            "records read = floor"
        };
        // Scaling runs beside the p=1 ones: the same job at parallelism `p`, its output
        // checked against the floor's too.
        let scaled = match scaling {
            Some(p) if name == SCALING_WORKLOAD => {
                let cfg = RunConfig {
                    parallelism: p,
                    ..cfg.clone()
                };
                let mut run_dir = case.run_dir.clone().into_os_string();
                run_dir.push(format!("-p{p}"));
                let case = Case {
                    workload: case.workload,
                    input: case.input.clone(),
                    job: case.job.clone(),
                    run_dir: run_dir.into(),
                };
                let (_, warm) = nopstream_run(&cfg, &case)?;
                ensure!(
                    warm.records_read == warm_floor.records,
                    "{name} -p {p}: nop-stream read {} records, the floor {}",
                    warm.records_read,
                    warm_floor.records
                );
                check_committed(
                    &case.run_dir,
                    expected.as_ref(),
                    name,
                    &format!("-p {p} warm-up"),
                )?;
                Some((cfg, case))
            }
            _ => None,
        };
        let mut scaled_runs = Vec::new();
        let mut ns_runs = Vec::new();
        let mut floor_runs = Vec::new();
        for i in 0..cfg.runs {
            let mut run = measured_run(
                cfg,
                case,
                i,
                "nop-stream",
                warm_floor.records,
                expected.as_ref(),
            )?;
            if case.workload.checkpoint_ms.is_some() {
                let s = epochs::stats(&case.run_dir.join("work"))?;
                run.epochs = Some(s.durable_epochs);
                eprintln!(
                    "   run {}: {} epochs durable, epoch duration median {:.0} ms (max {:.0}), snapshot median {:.0} B (max {:.0}, retained manifests)",
                    i + 1,
                    s.durable_epochs,
                    s.duration_ms.median,
                    s.duration_ms.max,
                    s.snapshot_bytes.median,
                    s.snapshot_bytes.max
                );
                checkpoint_stats.push(serde_json::json!({
                    "workload": name,
                    "input": case.input.file_name().map(|n| n.to_string_lossy().into_owned()),
                    "run": i + 1,
                    "stats": s,
                }));
            }
            if !run.threads.is_empty() {
                eprintln!(
                    "   run {}: nop-stream threads, CPU s: {}",
                    i + 1,
                    report::threads_line(&run.threads, 6)
                );
            }
            ns_runs.push(run);
            let (child, f) = floor_run(case)?;
            eprintln!(
                "   run {}: floor      {:.3} s loop, {:.3} s process, {:.2} CPU s, {:.0} MiB",
                i + 1,
                f.seconds,
                child.wall_s,
                child.cpu_s,
                child.max_rss_mib
            );
            floor_runs.push(Run {
                e2e_s: child.wall_s,
                steady_s: f.seconds,
                cpu_s: child.cpu_s,
                max_rss_mib: child.max_rss_mib,
                threads: Vec::new(),
                epochs: None,
            });
            if let Some((scfg, scase)) = &scaled {
                let label = format!("-p {}", scfg.parallelism);
                let mut run = measured_run(
                    scfg,
                    scase,
                    i,
                    &label,
                    warm_floor.records,
                    expected.as_ref(),
                )?;
                run.epochs = Some(epochs::stats(&scase.run_dir.join("work"))?.durable_epochs);
                scaled_runs.push(run);
            }
        }
        let input = case
            .input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        results.rows.push(Row {
            workload: name.into(),
            engine: NOP_STREAM.into(),
            input: input.clone(),
            records: warm.records_read,
            runs: ns_runs,
            note: format!("-p {}, {checked}", cfg.parallelism),
        });
        results.rows.push(Row {
            workload: name.into(),
            engine: FLOOR.into(),
            input: input.clone(),
            records: warm_floor.records,
            runs: floor_runs,
            note: "one thread, same parsing code, HashMap".into(),
        });
        if let Some((scfg, _)) = &scaled {
            results.rows.push(Row {
                workload: name.into(),
                engine: report::scaled_engine(scfg.parallelism),
                input,
                records: warm.records_read,
                runs: scaled_runs,
                note: format!("-p {}, run after each p=1 run, {checked}", scfg.parallelism),
            });
        }
    }
    if !checkpoint_stats.is_empty() {
        std::fs::write(
            cfg.out.join("checkpoints.json"),
            serde_json::to_string_pretty(&checkpoint_stats)?,
        )?;
    }
    Ok(results)
}

/// Checks the output `run_dir` committed against `expected` (the floor's), when given: a
/// run whose sink committed no summary fails, as one whose count or checksum differs.
fn check_committed(
    run_dir: &Path,
    expected: Option<&OutputSummary>,
    name: &str,
    what: &str,
) -> Result<()> {
    let Some(expected) = expected else {
        return Ok(());
    };
    match committed_output(&run_dir.join("output"))? {
        Some(o) => ensure!(
            o == *expected,
            "{name} ({what}): nop-stream committed {o:?}, the floor {expected:?}"
        ),
        None => anyhow::bail!(
            "{name} ({what}): the sink committed no summary in {}",
            run_dir.join("output").display()
        ),
    }
    Ok(())
}

/// Measured run `i` (from 0) of `case`, printed as `label`; its records read must be
/// `records` (the floor's), and its committed output `expected` when given (see
/// [`check_committed`]). The [`Run`]'s epochs are left for the caller.
fn measured_run(
    cfg: &RunConfig,
    case: &Case<'_>,
    i: usize,
    label: &str,
    records: u64,
    expected: Option<&OutputSummary>,
) -> Result<Run> {
    let (child, report) = nopstream_run(cfg, case)?;
    let steady = report.wall.secs as f64 + f64::from(report.wall.nanos) / 1e9;
    eprintln!(
        "   run {}: {label:<10} {:.3} s job, {:.3} s process, {:.2} CPU s, {:.0} MiB",
        i + 1,
        steady,
        child.wall_s,
        child.cpu_s,
        child.max_rss_mib
    );
    ensure!(
        report.records_read == records,
        "{} ({label}): record count changed: {} read, the floor {records}",
        case.workload.name,
        report.records_read
    );
    check_committed(
        &case.run_dir,
        expected,
        case.workload.name,
        &format!("{label} run {}", i + 1),
    )?;
    Ok(Run {
        e2e_s: child.wall_s,
        steady_s: steady,
        cpu_s: child.cpu_s,
        max_rss_mib: child.max_rss_mib,
        threads: child.threads,
        epochs: None,
    })
}

fn nopstream_run(cfg: &RunConfig, case: &Case<'_>) -> Result<(measure::ChildRun, JobReport)> {
    // Every run starts fresh: no state or checkpoints of an earlier run to resume from,
    // and no output of one, so the summaries checked are this run's.
    for dir in [case.run_dir.join("work"), case.run_dir.join("output")] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
        }
    }
    let mut cmd = Command::new(&cfg.nopstream);
    cmd.arg("run")
        .arg(&case.job)
        .arg("-p")
        .arg(cfg.parallelism.to_string())
        .args(["--json", "--no-progress", "--no-echo"])
        .arg("--output")
        .arg(case.run_dir.join("output"))
        .arg("--work-dir")
        .arg(case.run_dir.join("work"));
    let child = measure::run(cmd)?;
    let report: JobReport = serde_json::from_str(&child.stdout)
        .with_context(|| format!("nopstream --json printed {:?}", child.stdout))?;
    Ok((child, report))
}

/// Kill-and-restart trials of `w` (see [`Cmd::Recovery`]).
fn recovery(
    cfg: &RunConfig,
    w: &Workload,
    trials: usize,
    kill_after_ms: Option<u64>,
    large: bool,
) -> Result<()> {
    let (label, records) = if large { SIZES[1] } else { SIZES[0] };
    let data = cfg.out.join("data");
    let jobs = cfg.out.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    let input = bids_file(&data, label, records, true)?;
    let file_name = input.file_name().context("file name")?.to_string_lossy();
    let job = jobs.join(format!("{}-{label}.toml", w.name));
    std::fs::write(
        &job,
        workload::job_text(w, "../data", &file_name, cfg.batch_records),
    )?;
    let case = Case {
        workload: w,
        input,
        job,
        run_dir: cfg
            .out
            .join("runs")
            .join(format!("recovery-{}-{label}", w.name)),
    };
    // An uninterrupted run: compiles components into the cache and times the job.
    let (child, _) = nopstream_run(cfg, &case)?;
    let kill_after = kill_after_ms.unwrap_or((child.wall_s * 500.0) as u64);
    eprintln!(
        "uninterrupted run {:.2} s; killing each trial after {kill_after} ms",
        child.wall_s
    );
    let work = case.run_dir.join("work");
    let mut to_commit = Vec::new();
    let mut to_finish = Vec::new();
    for t in 0..trials {
        if work.exists() {
            std::fs::remove_dir_all(&work)?;
        }
        let _ = std::fs::remove_dir_all(case.run_dir.join("output"));
        let mut cmd = Command::new(&cfg.nopstream);
        cmd.arg("run")
            .arg(&case.job)
            .args(["--no-progress", "--no-echo", "--output"])
            .arg(case.run_dir.join("output"))
            .arg("--work-dir")
            .arg(&work)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut first = cmd.spawn()?;
        std::thread::sleep(std::time::Duration::from_millis(kill_after));
        if first.try_wait()?.is_some() {
            eprintln!("   trial {}: the run ended before the kill; skipped", t + 1);
            continue;
        }
        first.kill()?; // SIGKILL
        first.wait()?;
        let restart_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as u64;
        let started = std::time::Instant::now();
        let status = cmd.status()?;
        ensure!(status.success(), "the restarted run failed");
        let finish = started.elapsed().as_secs_f64() * 1000.0;
        let commit = epochs::first_commit_after(&work, restart_ms)?;
        eprintln!(
            "   trial {}: restart -> first committed epoch {commit:.0} ms, -> finished {finish:.0} ms",
            t + 1
        );
        to_commit.push(commit);
        to_finish.push(finish);
    }
    ensure!(
        !to_commit.is_empty(),
        "no trial killed the run mid-way; pass --kill-after-ms"
    );
    let commit = epochs::Spread::of(&to_commit);
    let finish = epochs::Spread::of(&to_finish);
    println!(
        "recovery ({} {label}, killed after {kill_after} ms, {} trials): restart -> first committed epoch median {:.0} ms (max {:.0}); restart -> finished median {:.0} ms (max {:.0})",
        w.name,
        to_commit.len(),
        commit.median,
        commit.max,
        finish.median,
        finish.max
    );
    std::fs::write(
        cfg.out.join("recovery.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "workload": w.name,
            "input": label,
            "kill_after_ms": kill_after,
            "restart_to_first_commit_ms": to_commit,
            "restart_to_finished_ms": to_finish,
            "median_restart_to_first_commit_ms": commit.median,
            "median_restart_to_finished_ms": finish.median,
        }))?,
    )?;
    Ok(())
}

fn floor_run(case: &Case<'_>) -> Result<(measure::ChildRun, FloorReport)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["floor", "--workload", case.workload.floor, "--input"])
        .arg(&case.input);
    let child = measure::run(cmd)?;
    let report: FloorReport = serde_json::from_str(&child.stdout)
        .with_context(|| format!("floor printed {:?}", child.stdout))?;
    Ok((child, report))
}

/// `key=value` of a `RESULT ...` / `JVMCPU ...` line of flink_job.py.
fn field(stdout: &str, prefix: &str, key: &str) -> Option<f64> {
    stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// What `flink` runs: the peer's interpreter and script, runs, sizes, parallelism and
/// the workloads (empty: every one with a Flink query).
struct FlinkConfig {
    python: PathBuf,
    script: PathBuf,
    runs: usize,
    large: bool,
    parallelism: u32,
    backend: String,
    only: Vec<String>,
}

fn run_flink(results: &mut Results, peer: &FlinkConfig, out: &Path) -> Result<()> {
    let FlinkConfig {
        python,
        script,
        runs,
        large,
        parallelism,
        backend,
        only,
    } = peer;
    let engine = if backend == "hashmap" {
        FLINK.to_string()
    } else {
        format!("{FLINK}-{backend}")
    };
    let (runs, large, parallelism) = (*runs, *large, *parallelism);
    ensure!(
        runs >= 1,
        "--runs 0 measures nothing: the first run of each size is an unmeasured warm-up"
    );
    ensure!(
        python.is_file(),
        "{} not found: create the virtualenv first (`just bench-peers` does)",
        python.display()
    );
    let data = out.join("data");
    let work = out.join("flink");
    std::fs::create_dir_all(&work)?;
    let sizes = if large { &SIZES[..] } else { &SIZES[..1] };
    for w in WORKLOADS
        .iter()
        .filter(|w| w.input == Input::Bids && (only.is_empty() || only.iter().any(|n| n == w.name)))
    {
        let Some(q) = w.flink_query else { continue };
        for &(label, records) in sizes {
            let input = bids_file(&data, label, records, false)?;
            // Mini-batch where it helps: a non-windowed GROUP BY otherwise emits an update
            // pair per record (window aggregations and MATCH_RECOGNIZE do not use it).
            let minibatch = q == "count";
            // The warm-up run writes its output to files, checked against what the input
            // must give (computed without Flink); the timed runs write into a blackhole.
            let headered = bids_file(&data, label, records, true)?;
            let expected = if q == "count" {
                flink_check::Expected::FinalCounts(floor::final_counts(&headered)?)
            } else {
                flink_check::Expected::Rows(floor::run(w.floor, &headered)?.output.records)
            };
            let out_dir = work.join(format!("out-{}-{label}", w.name));
            let mut checked = String::new();
            let mut flink_runs = Vec::new();
            // Run 0 is the warm-up (page cache, JIT-free JVM start, the jars), not measured.
            for i in 0..=runs {
                let mut cmd = Command::new(python);
                cmd.arg(script)
                    .current_dir(&work)
                    .env("Q", q)
                    .env("MODE", "streaming")
                    .env("PAR", parallelism.to_string())
                    .env("CKPT_MS", w.checkpoint_ms.unwrap_or(0).to_string())
                    .env("BACKEND", backend)
                    .env("MINIBATCH", if minibatch { "1" } else { "0" })
                    .env("INPUT", &input);
                if i == 0 {
                    let _ = std::fs::remove_dir_all(&out_dir);
                    cmd.env("OUT", &out_dir);
                }
                let child = measure::run(cmd)?;
                let job_s = field(&child.stdout, "RESULT", "job_s")
                    .with_context(|| format!("no RESULT job_s in {:?}", child.stdout))?;
                let jvm_cpu = field(&child.stdout, "JVMCPU", "jvm_cpu_s").unwrap_or(0.0);
                // wait4 covers the JVM only if Python reaped it; otherwise add its CPU.
                let cpu_s = if child.cpu_s >= jvm_cpu {
                    child.cpu_s
                } else {
                    child.cpu_s + jvm_cpu
                };
                eprintln!(
                    "   flink {} {label} {}: job {job_s:.2} s, process {:.2} s, {cpu_s:.1} CPU s",
                    w.name,
                    if i == 0 {
                        "warm-up".to_owned()
                    } else {
                        format!("run {i}")
                    },
                    child.wall_s
                );
                if i == 0 {
                    checked = flink_check::check(&out_dir, &expected)
                        .with_context(|| format!("flink {} {label}: output", w.name))?;
                    eprintln!("   flink {} {label} output: {checked}", w.name);
                    let _ = std::fs::remove_dir_all(&out_dir);
                    continue;
                }
                flink_runs.push(Run {
                    e2e_s: child.wall_s,
                    steady_s: job_s,
                    cpu_s,
                    max_rss_mib: child.max_rss_mib,
                    threads: Vec::new(),
                    epochs: None,
                });
            }
            results.upsert(Row {
                workload: w.name.into(),
                engine: engine.clone(),
                input: format!("bids-{label}.csv"),
                records,
                runs: flink_runs,
                note: format!(
                    "flink_job.py Q={q} MODE=streaming PAR={parallelism} CKPT_MS={} BACKEND={backend} MINIBATCH={}, headerless copy, after a warm-up run whose output was written to files and checked ({checked}; the timed runs write into a blackhole); measured {}",
                    w.checkpoint_ms.unwrap_or(0),
                    u8::from(minibatch),
                    utc_now()
                ),
            });
        }
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM UTC` of now.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Cores and CPU model of this machine.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpointing_job_takes_record_count_epochs_for_at_least_five_periodic_checkpoints() {
        // Pins count-ckpt finishing 10M bids within its first 1 s interval, so its timed
        // runs took the final epoch only.
        let w = workload::find("count-ckpt").unwrap();
        let text = with_checkpoints(w, workload::job_text(w, "d", "bids.csv", 1024), 10_000_000);
        assert_eq!(
            text.matches("checkpoint_every_records = 1250000\n").count(),
            1,
            "{text}"
        );
        assert!(EPOCHS_PER_INPUT > report::MIN_PERIODIC_CHECKPOINTS as u64);
        let plain = workload::find("count").unwrap();
        let t = workload::job_text(plain, "d", "bids.csv", 1024);
        assert_eq!(with_checkpoints(plain, t.clone(), 10_000_000), t);
    }

    #[test]
    fn parses_flink_result_lines() {
        let out = "noise\nJVMCPU jvm_cpu_s=12.50\nRESULT q=count mode=streaming setup_s=3.1 job_s=9.87 total_s=13.0\n";
        assert_eq!(field(out, "RESULT", "job_s"), Some(9.87));
        assert_eq!(field(out, "JVMCPU", "jvm_cpu_s"), Some(12.5));
        assert_eq!(field(out, "RESULT", "nope"), None);
        let date = utc_now();
        assert!(date.len() == 20 && date.ends_with(" UTC"), "{date}");
        assert!(date.starts_with("20"), "{date}");
    }
}
