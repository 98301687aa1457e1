//! Large keyed state (design §5.5, §8.1): the keyed count over generated bids with 1M and 5M
//! distinct auctions, 1 s exactly-once checkpoints, p=1.
//!
//! The job: `datagen-source` (bounded, `bids_per_key × keys` records, `keys` auctions drawn
//! uniformly, seed 42) → `bids-parser` → HASH → `keyed-count` (`emit = "record"`) →
//! `blackhole-sink`. With 3 bids per key about 95 % of the auctions are hit
//! (`1 - e^-3`); the exact distinct count comes from the expectation below.
//!
//! Per size it runs:
//!
//! 1. **Unbounded working set** (the default budget), timed: records per second (input
//!    records ÷ the job's wall time), peak RSS of the `nopstream` process (`wait4`
//!    `ru_maxrss`), and per epoch, read from the manifests while the job runs (retention
//!    keeps only the last three, so a thread polls them every 50 ms): bytes written
//!    (every task's `snapshot_bytes`), the stall (the largest `duration_ms` of a task:
//!    the time its thread spent taking the snapshot, when it processes nothing) and the
//!    keyed state's entries and bytes. With incremental snapshots (the default) a
//!    manifest lists a chain per shard (a full payload, then the deltas since), so the
//!    per-epoch entries and bytes are those of the chain (an upper bound of the state),
//!    and the full state (entries, and bytes as a full `kv-lp/1` snapshot would write
//!    them) is the last manifest's chain folded here ([`folded_state`]). Bytes per epoch
//!    are printed against that full size.
//! 2. **Budgeted working set** (`[job] state_memory_bytes` at `budget_fraction` of the
//!    full state size measured in 1), timed the same way; the throughput cost is its
//!    records per second against 1's, and its peak RSS is checked against
//!    `2 × budget + 64 MiB`.
//! 3. **Recovery**: the job again from scratch, SIGKILLed once a durable manifest's chain
//!    holds at least `kill_fraction` of the final keys in entries (full payloads' entries
//!    plus delta changes: an upper bound read without folding; the restored keys are
//!    folded and reported); then restarted on the same work directory
//!    (the CLI resumes from the latest durable epoch) with
//!    `RUST_LOG=nopstream::restore=debug`. It reports the state bytes the restore read
//!    (the keyed segments of the latest manifest at the kill), the task's restore time
//!    (its `task state restored` log line) and the implied MB/s, and the time from the
//!    restart to the first epoch the new attempt committed (epoch log; it includes the
//!    checkpoint interval, 1 s, before the first barrier).
//!
//! Every run's committed output (the blackhole sink's record count, bytes and
//! order-independent checksum) must equal an independent expectation computed here
//! natively (the same generator function, parser and payload encoding, a `HashMap` of
//! counts), or the bench fails; the recovered run included.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use blackhole_sink::Summary;
use serde::{Deserialize, Serialize};

use crate::epochs::{self, Spread};
use crate::floor::OutputSummary;
use crate::measure;
use nop_stream_checkpoint::Namespace;

/// Name of the keyed-count state in the manifests.
const COUNT_STATE: &str = "count";
const MIB: f64 = 1024.0 * 1024.0;

/// What to run.
pub struct Setup {
    /// The release `nopstream` binary.
    pub nopstream: PathBuf,
    /// Output directory (jobs, runs, `large-state.json`).
    pub out: PathBuf,
    /// Distinct auctions per size.
    pub keys: Vec<u32>,
    /// Bids per auction (records = keys × this).
    pub bids_per_key: u64,
    /// The budgeted run's `state_memory_bytes` as a fraction of the full state size;
    /// `None` skips the budgeted run.
    pub budget_fraction: Option<f64>,
    /// Kill the recovery run once a durable epoch holds this fraction of the final keys;
    /// `None` skips the recovery run.
    pub kill_fraction: Option<f64>,
    /// Records per batch.
    pub batch_records: u32,
    /// Run the jobs with `async_snapshots = false` (the task thread writes the segments).
    pub sync_snapshots: bool,
    /// Run the jobs with `incremental_snapshots = false` (every epoch a full snapshot).
    pub full_snapshots: bool,
}

/// One epoch as its manifest tells it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EpochRow {
    /// Epoch id.
    pub epoch: u64,
    /// Bytes every task wrote for it.
    pub snapshot_bytes: u64,
    /// Bytes of background compactions its tasks adopted (written off the task thread
    /// since the previous epoch; not in `snapshot_bytes`).
    pub compacted_bytes: u64,
    /// Largest task `duration_ms` (the task thread's stall).
    pub stall_ms: u64,
    /// Largest task `async_ms` (the background write of an asynchronous snapshot; 0 for
    /// synchronous ones).
    pub async_ms: u64,
    /// Entries of the keyed count state's segments (full payloads' entries plus deltas'
    /// changes: with deltas, an upper bound of the state's entries).
    pub state_entries: u64,
    /// Bytes of the keyed count state's segments (its chain).
    pub state_bytes: u64,
    /// Whether the keyed state's chain holds deltas.
    pub has_deltas: bool,
}

/// One timed run.
#[derive(Debug, Clone, Serialize)]
pub struct TimedRun {
    /// `state_memory_bytes`, if set.
    pub budget_bytes: Option<u64>,
    /// Input records.
    pub records: u64,
    /// Job wall seconds (the CLI's report).
    pub job_s: f64,
    /// Records per second over the job's wall time.
    pub records_per_s: f64,
    /// CPU seconds of the process.
    pub cpu_s: f64,
    /// Peak RSS of the process, MiB.
    pub peak_rss_mib: f64,
    /// Durable epochs in the epoch log.
    pub durable_epochs: usize,
    /// The epochs read from manifests while the job ran.
    pub epochs: Vec<EpochRow>,
    /// Bytes per epoch (median, max) over [`Self::epochs`].
    pub bytes_per_epoch: Spread,
    /// Stall per epoch in ms (median, max).
    pub stall_ms: Spread,
    /// Background write per epoch in ms (median, max); 0 with synchronous snapshots.
    pub async_ms: Spread,
    /// Epochs that adopted a background compaction.
    pub compactions: usize,
    /// Mean bytes written per epoch, compactions included (snapshot and compacted bytes
    /// of the epochs read, over their number).
    pub written_per_epoch: f64,
    /// Keyed state bytes in the last epoch as a full snapshot writes them (its chain
    /// folded, see [`folded_state`]).
    pub full_state_bytes: u64,
    /// Keyed state entries in the last epoch (its chain folded).
    pub full_state_entries: u64,
    /// Epochs whose keyed state chain held deltas.
    pub delta_epochs: usize,
}

/// The recovery run.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryRun {
    /// Epoch the restart resumed from (the latest durable one at the kill).
    pub from_epoch: u64,
    /// Keyed entries in it.
    pub state_entries: u64,
    /// Bytes of every state segment the keyed task read (the whole chain).
    pub state_bytes: u64,
    /// The keyed task's restore (read, verify, load into the working set or redb), ms,
    /// from its log line.
    pub restore_ms: f64,
    /// Of it, reading and verifying the segments, ms (the log line's `read_ms`; `None`
    /// from a host that does not log it).
    pub restore_read_ms: Option<f64>,
    /// `state_bytes / restore_ms`, MB/s (10^6 bytes).
    pub restore_mb_per_s: f64,
    /// Restart → first epoch committed by the new attempt, ms.
    pub restart_to_commit_ms: f64,
    /// Restart → the process ended, ms.
    pub restart_to_end_ms: f64,
}

/// All figures of one size.
#[derive(Debug, Clone, Serialize)]
pub struct SizeReport {
    /// Distinct auctions the generator draws from.
    pub keys: u32,
    /// Distinct auctions actually hit (the expectation's).
    pub distinct_keys: u64,
    /// Input records.
    pub records: u64,
    /// Default working-set budget.
    pub unbounded: TimedRun,
    /// With `state_memory_bytes`.
    pub budgeted: Option<TimedRun>,
    /// SIGKILL and restart.
    pub recovery: Option<RecoveryRun>,
}

/// The whole report (`large-state.json`).
#[derive(Debug, Clone, Serialize)]
pub struct LargeStateReport {
    /// UTC time of the start.
    pub date: String,
    /// Machine description.
    pub machine: String,
    /// Per size.
    pub sizes: Vec<SizeReport>,
}

/// The job text for `keys` auctions, `records` bids, optionally a working-set budget;
/// `sync` turns asynchronous snapshots off, `full` incremental ones; `rate` throttles the
/// source (records per second).
pub fn job_text(
    keys: u32,
    records: u64,
    batch_records: u32,
    budget: Option<u64>,
    sync: bool,
    full: bool,
    rate: Option<u64>,
) -> String {
    let rate = rate
        .map(|r| format!(", records_per_second = {r}"))
        .unwrap_or_default();
    let mut budget = budget
        .map(|b| format!("state_memory_bytes = {b}\n"))
        .unwrap_or_default();
    if sync {
        budget.push_str("async_snapshots = false\n");
    }
    if full {
        budget.push_str("incremental_snapshots = false\n");
    }
    format!(
        r#"# Generated by nopstream-bench large-state.
[job]
name = "bench-large-state"
semantic = "strict-exactly-once"
checkpoint_interval_ms = 1000
batch_records = {batch_records}
{budget}
[[source]]
name = "bids"
plugin = "datagen-source@0.1.0"
config = {{ records = {records}, keys = {keys}, seed = 42{rate} }}

[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "count"
plugin = "keyed-count@0.1.0"
inputs = [{{ from = "parse", partition = "hash" }}]
config = {{ emit = "record" }}

[[sink]]
name = "out"
plugin = "blackhole-sink@0.1.0"
inputs = ["count"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ summary_dir = "/output" }}
"#
    )
}

/// The committed output the job must produce, computed natively: the generator's records
/// (`datagen_source::record`), parsed by `bids-parser`, counted per auction, each update
/// encoded as `keyed-count` does (auction `i64` LE, count `u64` LE) and summarised as
/// the blackhole sink does. Returns it with the number of distinct auctions.
///
/// # Errors
/// A generated line the parser refuses.
pub fn expected(keys: u32, records: u64) -> Result<(OutputSummary, u64)> {
    let config = datagen_source::Config {
        records: Some(records),
        keys,
        rotate_every: None,
        seed: 42,
        splits: None,
        records_per_second: None,
    };
    let mut counts: HashMap<i64, u64, keyed_count::FxBuildHasher> = HashMap::default();
    counts.reserve(keys as usize);
    let mut sum = Summary::default();
    let mut line = String::with_capacity(64);
    let mut buf = [0u8; 16];
    for g in 0..records {
        datagen_source::record(&config, g, &mut line);
        let auction = match bids_parser::parse_line(line.as_bytes()) {
            Ok(bids_parser::Line::Bid(b)) => b.auction,
            Ok(bids_parser::Line::Header) => bail!("generated a header line: {line}"),
            Err(e) => bail!("generated line {line:?}: {e}"),
        };
        let c = counts.entry(auction).or_default();
        *c += 1;
        buf[..8].copy_from_slice(&auction.to_le_bytes());
        buf[8..].copy_from_slice(&c.to_le_bytes());
        sum.add(&buf);
    }
    Ok((sum.into(), counts.len() as u64))
}

#[derive(Deserialize)]
struct Manifest {
    epoch: u64,
    tasks: Vec<ManifestTask>,
}

#[derive(Deserialize)]
struct ManifestTask {
    snapshot_bytes: u64,
    duration_ms: u64,
    #[serde(default)]
    async_ms: u64,
    #[serde(default)]
    compacted_bytes: u64,
    segments: Vec<ManifestSegment>,
}

#[derive(Deserialize)]
struct ManifestSegment {
    state: String,
    len: u64,
    entries: u64,
    file: String,
    offset: u64,
    codec: String,
}

impl Manifest {
    fn row(&self) -> EpochRow {
        let count = || {
            self.tasks
                .iter()
                .flat_map(|t| &t.segments)
                .filter(|s| s.state == COUNT_STATE)
        };
        EpochRow {
            epoch: self.epoch,
            snapshot_bytes: self.tasks.iter().map(|t| t.snapshot_bytes).sum(),
            compacted_bytes: self.tasks.iter().map(|t| t.compacted_bytes).sum(),
            stall_ms: self.tasks.iter().map(|t| t.duration_ms).max().unwrap_or(0),
            async_ms: self.tasks.iter().map(|t| t.async_ms).max().unwrap_or(0),
            state_entries: count().map(|s| s.entries).sum(),
            state_bytes: count().map(|s| s.len).sum(),
            has_deltas: count().any(|s| s.codec != nop_stream_checkpoint::payload::KV_CODEC),
        }
    }

    /// Bytes of every state segment (the keyed task reads them all on restore).
    fn all_state_bytes(&self) -> u64 {
        self.tasks
            .iter()
            .flat_map(|t| &t.segments)
            .map(|s| s.len)
            .sum()
    }
}

/// The keyed count state the chain of `m` restores to: (entries, bytes of a full
/// `kv-lp/1` snapshot of it), reading the segments of the namespace `root`.
fn folded_state(root: &Namespace, m: &Manifest) -> Result<(u64, u64)> {
    use nop_stream_checkpoint::payload;
    let segments: Vec<&ManifestSegment> = m
        .tasks
        .iter()
        .flat_map(|t| &t.segments)
        .filter(|s| s.state == COUNT_STATE)
        .collect();
    let mut bufs = Vec::with_capacity(segments.len());
    for s in &segments {
        bufs.push(root.read_range(&s.file, s.offset, s.len)?);
    }
    // Manifest order is chain order per shard, and keys of different shards never
    // collide (a key maps to one shard), so the whole list folds as one chain.
    let chain: Vec<(&str, &[u8])> = segments
        .iter()
        .zip(&bufs)
        .map(|(s, b)| (s.codec.as_str(), b.as_slice()))
        .collect();
    let state = payload::fold(&chain).map_err(|e| anyhow::anyhow!("{e}"))?;
    let bytes = state
        .iter()
        .map(|(k, v)| 8 + k.len() as u64 + v.len() as u64)
        .sum();
    Ok((state.len() as u64, bytes))
}

/// The checkpoint namespace under `work` and its latest manifest.
fn latest_manifest(work: &Path) -> Result<(Namespace, Manifest)> {
    let (_, ns) = epochs::namespaces(work)?
        .into_iter()
        .next()
        .context("no checkpoint namespace")?;
    let m = ns.latest_manifest()?.context("no manifest")?;
    let m = serde_json::from_value(serde_json::to_value(&m)?)?;
    Ok((ns, m))
}

/// Every durable manifest now under `<work>/checkpoints/` not in `seen`, parsed.
fn new_manifests(work: &Path, seen: &BTreeMap<u64, EpochRow>) -> Vec<Manifest> {
    let mut out = Vec::new();
    for (_, ns) in epochs::namespaces(work).unwrap_or_default() {
        for e in ns.manifest_epochs().unwrap_or_default() {
            if seen.contains_key(&e.0) {
                continue;
            }
            // Retention may delete it between the listing and the read.
            if let Ok(m) = ns.read_manifest(e)
                && let Ok(v) = serde_json::to_value(&m)
                && let Ok(m) = serde_json::from_value::<Manifest>(v)
            {
                out.push(m);
            }
        }
    }
    out
}

/// Polls the manifests of `work` every 50 ms on a thread until stopped.
struct Watcher {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<BTreeMap<u64, EpochRow>>,
}

impl Watcher {
    fn start(work: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = BTreeMap::new();
            loop {
                let last = flag.load(Ordering::Relaxed);
                for m in new_manifests(&work, &seen) {
                    seen.insert(m.epoch, m.row());
                }
                if last {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watcher { stop, handle }
    }

    fn finish(self) -> BTreeMap<u64, EpochRow> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

fn fresh(dirs: &[PathBuf]) -> Result<()> {
    for d in dirs {
        if d.exists() {
            std::fs::remove_dir_all(d).with_context(|| format!("remove {}", d.display()))?;
        }
    }
    Ok(())
}

fn nopstream_cmd(s: &Setup, job: &Path, run_dir: &Path) -> Command {
    let mut cmd = Command::new(&s.nopstream);
    cmd.arg("run")
        .arg(job)
        .args(["-p", "1", "--no-progress", "--no-echo"])
        .arg("--output")
        .arg(run_dir.join("output"))
        .arg("--work-dir")
        .arg(run_dir.join("work"));
    cmd
}

fn check_output(run_dir: &Path, expected: &OutputSummary, what: &str) -> Result<()> {
    let got = crate::committed_output(&run_dir.join("output"))?
        .with_context(|| format!("{what}: the blackhole sink committed no summary"))?;
    ensure!(
        got == *expected,
        "{what}: committed output {got:?} differs from the expectation {expected:?}"
    );
    Ok(())
}

/// One timed run from scratch.
fn timed(
    s: &Setup,
    name: &str,
    keys: u32,
    records: u64,
    budget: Option<u64>,
    expected: &OutputSummary,
) -> Result<TimedRun> {
    let job = s.out.join("jobs").join(format!("{name}.toml"));
    std::fs::write(
        &job,
        job_text(
            keys,
            records,
            s.batch_records,
            budget,
            s.sync_snapshots,
            s.full_snapshots,
            None,
        ),
    )?;
    let run_dir = s.out.join("runs").join(name);
    fresh(&[run_dir.join("work"), run_dir.join("output")])?;
    let watcher = Watcher::start(run_dir.join("work"));
    let mut cmd = nopstream_cmd(s, &job, &run_dir);
    cmd.arg("--json");
    let child = measure::run(cmd);
    let rows = watcher.finish();
    let child = child?;
    let report: crate::JobReport = serde_json::from_str(&child.stdout)
        .with_context(|| format!("nopstream --json printed {:?}", child.stdout))?;
    ensure!(
        report.records_read == records,
        "{name}: read {} of {records} records",
        report.records_read
    );
    check_output(&run_dir, expected, name)?;
    let durable_epochs = epochs::stats(&run_dir.join("work"))?.durable_epochs;
    let epochs: Vec<EpochRow> = rows.into_values().collect();
    let (root, last) = latest_manifest(&run_dir.join("work"))?;
    let (full_state_entries, full_state_bytes) = folded_state(&root, &last)?;
    let job_s = report.wall.secs as f64 + f64::from(report.wall.nanos) / 1e9;
    let spread = |f: fn(&EpochRow) -> u64| {
        Spread::of(&epochs.iter().map(|r| f(r) as f64).collect::<Vec<_>>())
    };
    Ok(TimedRun {
        budget_bytes: budget,
        records,
        job_s,
        records_per_s: records as f64 / job_s,
        cpu_s: child.cpu_s,
        peak_rss_mib: child.max_rss_mib,
        durable_epochs,
        bytes_per_epoch: spread(|r| r.snapshot_bytes),
        stall_ms: spread(|r| r.stall_ms),
        async_ms: spread(|r| r.async_ms),
        compactions: epochs.iter().filter(|r| r.compacted_bytes > 0).count(),
        written_per_epoch: epochs
            .iter()
            .map(|r| (r.snapshot_bytes + r.compacted_bytes) as f64)
            .sum::<f64>()
            / epochs.len().max(1) as f64,
        full_state_bytes,
        full_state_entries,
        delta_epochs: epochs.iter().filter(|r| r.has_deltas).count(),
        epochs,
    })
}

/// The `elapsed_ms` of the slowest `task state restored` line of a CLI log, with that
/// line's `read_ms` if it has one.
fn restore_times(stderr: &str) -> Option<(f64, Option<f64>)> {
    let field = |l: &str, name: &str| -> Option<f64> {
        let at = l.find(name)? + name.len();
        l[at..].split_whitespace().next()?.parse::<f64>().ok()
    };
    crate::cluster::strip_ansi(stderr)
        .lines()
        .filter(|l| l.contains("task state restored"))
        .filter_map(|l| Some((field(l, " elapsed_ms=")?, field(l, " read_ms="))))
        .reduce(|a, b| if b.0 > a.0 { b } else { a })
}

/// Least duration of the recovery job, s (its source is throttled to it).
const RECOVERY_RUN_SECS: u64 = 4;

/// Kill once the state is built, restart, time the recovery.
fn recovery(
    s: &Setup,
    name: &str,
    keys: u32,
    records: u64,
    kill_entries: u64,
    expected: &OutputSummary,
) -> Result<RecoveryRun> {
    let job = s.out.join("jobs").join(format!("{name}.toml"));
    // The source is throttled so that the run lasts at least RECOVERY_RUN_SECS: a small
    // state built at full speed is done within its first epoch, before any epoch but the
    // final one could hold it (the restart would then find the job finished).
    let rate = (records / RECOVERY_RUN_SECS).max(1);
    std::fs::write(
        &job,
        job_text(
            keys,
            records,
            s.batch_records,
            None,
            s.sync_snapshots,
            s.full_snapshots,
            Some(rate),
        ),
    )?;
    let run_dir = s.out.join("runs").join(name);
    let work = run_dir.join("work");
    fresh(&[work.clone(), run_dir.join("output")])?;
    let mut first = nopstream_cmd(s, &job, &run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", s.nopstream.display()))?;
    let mut seen = BTreeMap::new();
    loop {
        if let Some(status) = first.try_wait()? {
            bail!(
                "{name}: the job ended ({status}) before a durable epoch held {kill_entries} keys \
                 (largest: {}); lower --kill-fraction",
                seen.values()
                    .map(|r: &EpochRow| r.state_entries)
                    .max()
                    .unwrap_or(0)
            );
        }
        for m in new_manifests(&work, &seen) {
            seen.insert(m.epoch, m.row());
        }
        // The chain's entries (full payloads' entries plus delta changes): an upper bound
        // of its keys that needs no segment read (folding a chain here took long enough
        // for the job to end first; the full payloads alone lag by up to a compaction, and
        // a short job ends before its first). The keys actually restored are folded below.
        if seen.values().any(|r| r.state_entries >= kill_entries) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill()?; // SIGKILL
    first.wait()?;
    // The restart resumes from the latest durable manifest, which may be newer than the
    // one that triggered the kill.
    let (storage_root, manifest) = latest_manifest(&work).context("at the kill")?;
    let row = manifest.row();
    let (state_entries, _) = folded_state(&storage_root, &manifest)?;
    let state_bytes = manifest.all_state_bytes();
    let restart_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let started = Instant::now();
    let mut cmd = nopstream_cmd(s, &job, &run_dir);
    cmd.env("RUST_LOG", "warn,nopstream::restore=debug");
    let child = measure::run(cmd)?;
    let restart_to_end_ms = started.elapsed().as_secs_f64() * 1000.0;
    check_output(
        &run_dir,
        expected,
        &format!("{name} (killed and restarted)"),
    )?;
    let restart_to_commit_ms = epochs::first_commit_after(&work, restart_ms)?;
    let (restore_ms, restore_read_ms) = restore_times(&child.stderr)
        .with_context(|| format!("{name}: no task logged its restore"))?;
    Ok(RecoveryRun {
        from_epoch: row.epoch,
        state_entries,
        state_bytes,
        restore_ms,
        restore_read_ms,
        restore_mb_per_s: state_bytes as f64 / 1e6 / (restore_ms.max(1e-3) / 1000.0),
        restart_to_commit_ms,
        restart_to_end_ms,
    })
}

fn print_timed(label: &str, t: &TimedRun) {
    eprintln!(
        "   {label}: {:.0} rec/s ({:.2} s), peak RSS {:.0} MiB, {} epochs ({} with deltas), bytes/epoch median {:.1} MiB max {:.1} MiB = {:.2} / {:.2} of the full state {:.1} MiB ({} keys), stall median {:.0} ms max {:.0} ms, background write median {:.0} ms max {:.0} ms, {} compactions adopted, written per epoch with them {:.1} MiB = {:.2} of the full state",
        t.records_per_s,
        t.job_s,
        t.peak_rss_mib,
        t.durable_epochs,
        t.delta_epochs,
        t.bytes_per_epoch.median / MIB,
        t.bytes_per_epoch.max / MIB,
        t.bytes_per_epoch.median / (t.full_state_bytes.max(1) as f64),
        t.bytes_per_epoch.max / (t.full_state_bytes.max(1) as f64),
        t.full_state_bytes as f64 / MIB,
        t.full_state_entries,
        t.stall_ms.median,
        t.stall_ms.max,
        t.async_ms.median,
        t.async_ms.max,
        t.compactions,
        t.written_per_epoch / MIB,
        t.written_per_epoch / (t.full_state_bytes.max(1) as f64),
    );
}

/// Runs every size; prints as it goes.
///
/// # Errors
/// A failed run, wrong output, or a budgeted run over its RSS bound.
pub fn run(s: &Setup) -> Result<LargeStateReport> {
    std::fs::create_dir_all(s.out.join("jobs"))?;
    let mut sizes = Vec::new();
    for &keys in &s.keys {
        let records = u64::from(keys) * s.bids_per_key;
        let label = format!("{}k", keys / 1000);
        eprintln!("== large state: {keys} keys, {records} bids");
        let (expected, distinct) = expected(keys, records)?;
        eprintln!("   expectation: {distinct} distinct keys, {expected:?}");
        let unbounded = timed(s, &format!("large-{label}"), keys, records, None, &expected)?;
        print_timed("unbounded", &unbounded);
        ensure!(
            unbounded.full_state_entries == distinct,
            "the last epoch holds {} keys, the expectation {distinct}",
            unbounded.full_state_entries
        );
        let budgeted = match s.budget_fraction {
            Some(f) => {
                let budget = (unbounded.full_state_bytes as f64 * f) as u64;
                let t = timed(
                    s,
                    &format!("large-{label}-budget"),
                    keys,
                    records,
                    Some(budget),
                    &expected,
                )?;
                print_timed(&format!("budget {:.1} MiB", budget as f64 / MIB), &t);
                let bound = 2.0 * budget as f64 / MIB + 64.0;
                eprintln!(
                    "   budgeted: peak RSS {:.0} MiB against 2 × budget + 64 MiB = {bound:.0} MiB; throughput ×{:.2} of unbounded",
                    t.peak_rss_mib,
                    t.records_per_s / unbounded.records_per_s
                );
                Some(t)
            }
            None => None,
        };
        let recovery = match s.kill_fraction {
            Some(f) => {
                let r = recovery(
                    s,
                    &format!("large-{label}-recovery"),
                    keys,
                    records,
                    (distinct as f64 * f) as u64,
                    &expected,
                )?;
                eprintln!(
                    "   recovery from epoch {} ({} keys, {:.1} MiB of state): restore {:.0} ms ({:.0} MB/s; reading {}), restart -> first commit {:.0} ms, -> end {:.0} ms",
                    r.from_epoch,
                    r.state_entries,
                    r.state_bytes as f64 / MIB,
                    r.restore_ms,
                    r.restore_mb_per_s,
                    r.restore_read_ms
                        .map_or("not logged".into(), |ms| format!("{ms:.0} ms")),
                    r.restart_to_commit_ms,
                    r.restart_to_end_ms
                );
                Some(r)
            }
            None => None,
        };
        sizes.push(SizeReport {
            keys,
            distinct_keys: distinct,
            records,
            unbounded,
            budgeted,
            recovery,
        });
    }
    Ok(LargeStateReport {
        date: crate::utc_now(),
        machine: crate::machine(),
        sizes,
    })
}

impl LargeStateReport {
    /// The summary table.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| keys | run | rec/s | × unbounded | peak RSS MiB | RSS bound MiB | full state MiB | bytes/epoch median (max) MiB | stall median (max) ms |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for s in &self.sizes {
            let runs = std::iter::once(("unbounded".to_owned(), &s.unbounded)).chain(
                s.budgeted.iter().map(|b| {
                    (
                        format!("budget {:.1} MiB", b.budget_bytes.unwrap_or(0) as f64 / MIB),
                        b,
                    )
                }),
            );
            for (label, r) in runs {
                let bound = r.budget_bytes.map_or("–".to_owned(), |b| {
                    format!("{:.0}", 2.0 * b as f64 / MIB + 64.0)
                });
                t.push_str(&format!(
                    "| {} | {label} | {:.0} | {:.2} | {:.0} | {bound} | {:.1} | {:.1} ({:.1}) | {:.0} ({:.0}) |\n",
                    s.distinct_keys,
                    r.records_per_s,
                    r.records_per_s / s.unbounded.records_per_s,
                    r.peak_rss_mib,
                    r.full_state_bytes as f64 / MIB,
                    r.bytes_per_epoch.median / MIB,
                    r.bytes_per_epoch.max / MIB,
                    r.stall_ms.median,
                    r.stall_ms.max,
                ));
            }
        }
        let recoveries: Vec<_> = self
            .sizes
            .iter()
            .filter_map(|s| s.recovery.as_ref().map(|r| (s.distinct_keys, r)))
            .collect();
        if !recoveries.is_empty() {
            t.push_str(
                "\n| keys | restored epoch keys | state read MiB | restore ms | of it reading ms | MB/s | restart → first commit ms |\n\
                 |---|---|---|---|---|---|---|\n",
            );
            for (keys, r) in recoveries {
                t.push_str(&format!(
                    "| {keys} | {} | {:.1} | {:.0} | {} | {:.0} | {:.0} |\n",
                    r.state_entries,
                    r.state_bytes as f64 / MIB,
                    r.restore_ms,
                    r.restore_read_ms
                        .map_or("–".into(), |ms| format!("{ms:.0}")),
                    r.restore_mb_per_s,
                    r.restart_to_commit_ms
                ));
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_parses_with_and_without_a_budget() {
        for budget in [None, Some(64 << 20)] {
            let text = job_text(1000, 3000, 1024, budget, false, false, Some(500));
            let m = nop_stream_core::parse_job_file("large.toml", &text)
                .unwrap_or_else(|e| panic!("{text}\n{e:?}"));
            assert_eq!(m.job.checkpoint_interval_ms, Some(1000));
            assert_eq!(m.job.state_memory_bytes, budget);
            assert!(text.contains("records_per_second = 500"), "{text}");
        }
    }

    #[test]
    fn the_expectation_counts_every_bid() {
        let (sum, distinct) = expected(100, 300).unwrap();
        assert_eq!(sum.records, 300);
        assert_eq!(sum.bytes, 300 * 16);
        assert!(distinct > 80 && distinct <= 100, "{distinct}");
    }

    #[test]
    fn the_restore_time_comes_from_the_log_line() {
        let log = "2026-01-01T00:00:00Z DEBUG nopstream::restore: task state restored task=a epoch=3 segments=2 elapsed_ms=812.5 read_ms=101.25\n\
                   x DEBUG nopstream::restore: task state restored task=b epoch=3 segments=0 elapsed_ms=0.25 read_ms=0\n";
        assert_eq!(restore_times(log), Some((812.5, Some(101.25))));
        let old = "x DEBUG nopstream::restore: task state restored task=a epoch=3 segments=2 elapsed_ms=9.5\n";
        assert_eq!(restore_times(old), Some((9.5, None)));
        assert_eq!(restore_times("nothing"), None);
    }
}
