//! What `SCHED_BATCH` task threads cost in latency (`nopstream-bench latency`).
//!
//! Task threads run under `SCHED_BATCH` by default (`TaskScheduling::Batch`,
//! `host/runtime/src/launch.rs`): a woken task does not preempt the thread running on its
//! CPU. That saves CPU when task threads outnumber cores (`bench/RESULTS.md`, 2026-12-05),
//! and its price is hand-over latency on a busy machine. This bench measures that price
//! where a user sees it in an exactly-once job: the time from an epoch's barrier injection
//! to its snapshot being durable (`created` → `durable` in the epoch log, Flink's
//! checkpoint duration: the barrier crosses every queue and task of the pipeline), and to
//! its sinks' commit (`created` → `committed`, when the epoch's output becomes visible).
//!
//! The job is the keyed count over generated bids (`datagen-source` → `bids-parser` →
//! HASH → `keyed-count` → `blackhole-sink`) at parallelism `p`, with a checkpoint every
//! `interval_ms`: at p=2 on two cores that is four busy task threads. One unmeasured
//! warm-up run, unthrottled under the default policy, gives the saturated rate `R`; then
//! for each load `f` (a fraction of `R`; 1.0 runs unthrottled) and each of `rounds` rounds
//! the two policies run back to back, their order alternating between rounds. A run is
//! bounded (`f × R × seconds` records, throttled to `f × R` records per second over the
//! source instances) and ends by itself.
//!
//! Per load and policy the report pools every periodic epoch of every round (the final
//! epoch at end of input is left out) and gives p50, p99 and the maximum of both
//! latencies, the CPU seconds, and the ratios `batch ÷ normal`. Every run's committed
//! output (blackhole summaries) must hold exactly its input's record count, and the
//! two policies' outputs must be equal, or the bench fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::measure;

/// What to run.
pub struct Setup {
    /// The release `nopstream` binary.
    pub nopstream: PathBuf,
    /// Output directory (jobs, runs, `latency.json`).
    pub out: PathBuf,
    /// Parallelism of every stage.
    pub parallelism: u32,
    /// Checkpoint interval, ms.
    pub interval_ms: u64,
    /// Seconds of input per run (at the run's rate).
    pub seconds: f64,
    /// Loads as fractions of the saturated rate; 1.0 (or more) runs unthrottled.
    pub loads: Vec<f64>,
    /// Rounds per load (each runs both policies).
    pub rounds: usize,
}

/// The two policies of `--task-scheduling`.
const POLICIES: [&str; 2] = ["batch", "normal"];

#[derive(Deserialize)]
struct LogRecord {
    epoch: u64,
    state: String,
    attempt: u32,
    at_ms: u64,
}

/// Every epoch-log record seen under `<work>/checkpoints/*/epochs.log`, keyed by
/// (namespace, epoch, attempt, state). The log is compacted past 64 KiB, so a run is polled
/// while it goes and the records are merged.
type Seen = BTreeMap<(String, u64, u32, String), u64>;

fn poll_logs(work: &Path, seen: &mut Seen) {
    let Ok(rd) = std::fs::read_dir(work.join("checkpoints")) else {
        return;
    };
    for ns in rd.filter_map(|e| e.ok()) {
        let name = ns.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read_to_string(ns.path().join("epochs.log")) else {
            continue;
        };
        // A torn last line is skipped; the next poll reads it whole.
        for r in text
            .lines()
            .filter_map(|l| serde_json::from_str::<LogRecord>(l).ok())
        {
            seen.entry((name.clone(), r.epoch, r.attempt, r.state))
                .or_insert(r.at_ms);
        }
    }
}

/// Per epoch of `seen` (all but the highest epoch of each namespace, the final epoch at
/// end of input): `created` → `durable` and `created` → `committed`, ms.
fn latencies(seen: &Seen) -> (Vec<f64>, Vec<f64>) {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (ns, epoch, _, _) in seen.keys() {
        let e = last.entry(ns.as_str()).or_insert(0);
        *e = (*e).max(*epoch);
    }
    let (mut durable, mut committed) = (Vec::new(), Vec::new());
    for ((ns, epoch, attempt, state), created) in seen {
        if state != "created" || last.get(ns.as_str()) == Some(epoch) {
            continue;
        }
        let at = |s: &str| seen.get(&(ns.clone(), *epoch, *attempt, s.to_string()));
        if let Some(d) = at("durable") {
            durable.push(d.saturating_sub(*created) as f64);
        }
        if let Some(c) = at("committed") {
            committed.push(c.saturating_sub(*created) as f64);
        }
    }
    (durable, committed)
}

fn job_text(s: &Setup, records: u64, per_instance_rate: Option<u64>) -> String {
    let rate = per_instance_rate
        .map(|r| format!(", records_per_second = {r}"))
        .unwrap_or_default();
    format!(
        r#"# Generated by nopstream-bench latency.
[job]
name = "bench-latency"
semantic = "strict-exactly-once"
checkpoint_interval_ms = {interval}

[[source]]
name = "bids"
plugin = "datagen-source@0.1.0"
config = {{ records = {records}, keys = 10000{rate} }}

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
"#,
        interval = s.interval_ms,
    )
}

/// One measured run.
struct RunResult {
    wall_s: f64,
    cpu_s: f64,
    durable_ms: Vec<f64>,
    committed_ms: Vec<f64>,
    output: crate::OutputSummary,
}

fn run_once(
    s: &Setup,
    name: &str,
    policy: &str,
    records: u64,
    rate: Option<u64>,
) -> Result<RunResult> {
    let per_instance = rate.map(|r| (r / u64::from(s.parallelism)).max(1));
    let job = s.out.join("jobs").join(format!("{name}.toml"));
    std::fs::create_dir_all(job.parent().context("jobs dir")?)?;
    std::fs::write(&job, job_text(s, records, per_instance))?;
    let run_dir = s.out.join("runs").join(name);
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)?;
    }
    let work = run_dir.join("work");
    let mut cmd = Command::new(&s.nopstream);
    cmd.arg("run")
        .arg(&job)
        .args(["-p", &s.parallelism.to_string()])
        .args(["--task-scheduling", policy, "--no-progress", "--no-echo"])
        .arg("--output")
        .arg(run_dir.join("output"))
        .arg("--work-dir")
        .arg(&work);
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, work) = (Arc::clone(&stop), work.clone());
        std::thread::spawn(move || {
            let mut seen = Seen::new();
            while !stop.load(Ordering::Relaxed) {
                poll_logs(&work, &mut seen);
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        })
    };
    let child = measure::run(cmd);
    stop.store(true, Ordering::Relaxed);
    let mut seen = poller.join().unwrap_or_default();
    let child = child?;
    poll_logs(&work, &mut seen);
    let (durable_ms, committed_ms) = latencies(&seen);
    let output = crate::committed_output(&run_dir.join("output"))?
        .context("the blackhole sink committed no summary")?;
    ensure!(
        output.records == records,
        "{name}: committed {} records for {records} generated (exactly once: equal)",
        output.records
    );
    Ok(RunResult {
        wall_s: child.wall_s,
        cpu_s: child.cpu_s,
        durable_ms,
        committed_ms,
        output,
    })
}

/// p50, p99 (nearest rank) and maximum, ms.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Tail {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Epochs counted.
    pub epochs: usize,
}

impl Tail {
    fn of(v: &[f64]) -> Self {
        let mut v = v.to_vec();
        let (p50, p99) = crate::pg::percentiles(&mut v);
        Tail {
            p50,
            p99,
            max: v.last().copied().unwrap_or(0.0),
            epochs: v.len(),
        }
    }
}

/// One policy at one load, pooled over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// `batch` or `normal`.
    pub policy: String,
    /// Barrier injection → snapshot durable, ms.
    pub durable: Tail,
    /// Barrier injection → sinks committed, ms.
    pub committed: Tail,
    /// Median CPU seconds (user + system) of the rounds.
    pub cpu_s: f64,
    /// Median wall seconds of the rounds.
    pub wall_s: f64,
}

/// One load.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    /// Fraction of the saturated rate (1.0: unthrottled).
    pub load: f64,
    /// Records per second asked for (`None`: unthrottled).
    pub rate: Option<u64>,
    /// Records per run.
    pub records: u64,
    /// `batch`, then `normal`.
    pub policies: Vec<PolicyResult>,
}

/// The run (`latency.json`).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    /// UTC time of the start.
    pub date: String,
    /// Machine description.
    pub machine: String,
    /// Parallelism.
    pub parallelism: u32,
    /// Checkpoint interval, ms.
    pub interval_ms: u64,
    /// Rounds per load.
    pub rounds: usize,
    /// Saturated rate of the warm-up run (default policy), records per second.
    pub saturated_rate: f64,
    /// Per load.
    pub loads: Vec<LoadResult>,
}

fn median(v: &[f64]) -> f64 {
    crate::epochs::Spread::of(v).median
}

/// Runs the bench; prints each run as it goes.
///
/// # Errors
/// A run failed, committed the wrong record count, or the policies' outputs differ.
pub fn run(s: &Setup) -> Result<LatencyReport> {
    ensure!(s.rounds >= 1, "--rounds: at least 1");
    ensure!(
        !s.loads.is_empty() && s.loads.iter().all(|f| *f > 0.0),
        "--loads: give at least one fraction, each above 0"
    );
    std::fs::create_dir_all(&s.out)?;
    let date = crate::utc_now();
    let warm_records = (4_000_000.0 * s.seconds.max(1.0)) as u64;
    let warm = run_once(s, "warm-up", "normal", warm_records, None)?;
    let saturated_rate = warm_records as f64 / warm.wall_s;
    eprintln!(
        "warm-up (unthrottled, normal): {warm_records} records in {:.2} s = {:.0} rec/s",
        warm.wall_s, saturated_rate
    );
    let mut loads = Vec::new();
    for &load in &s.loads {
        let rate = (load < 1.0).then_some((saturated_rate * load) as u64);
        let records = (rate.map_or(saturated_rate, |r| r as f64) * s.seconds) as u64;
        let mut per: BTreeMap<&str, Vec<RunResult>> = BTreeMap::new();
        for round in 0..s.rounds {
            let mut order = POLICIES;
            if round % 2 == 1 {
                order.reverse();
            }
            for policy in order {
                let name = format!("load{:.0}-{policy}-{round}", load * 100.0);
                let r = run_once(s, &name, policy, records, rate)?;
                eprintln!(
                    "  {name}: {:.2} s wall, {:.2} CPU s, {} epochs, durable p50 {:.0} ms max {:.0}",
                    r.wall_s,
                    r.cpu_s,
                    r.durable_ms.len(),
                    median(&r.durable_ms),
                    r.durable_ms.iter().copied().fold(0.0, f64::max)
                );
                per.entry(policy).or_default().push(r);
            }
        }
        let outputs: Vec<_> = per.values().flatten().map(|r| r.output).collect();
        ensure!(
            outputs.windows(2).all(|w| w[0] == w[1]),
            "load {load}: the runs committed different outputs: {outputs:?}"
        );
        let policies = POLICIES
            .iter()
            .map(|p| {
                let runs = &per[p];
                let pool = |f: fn(&RunResult) -> &Vec<f64>| -> Vec<f64> {
                    runs.iter().flat_map(|r| f(r).iter().copied()).collect()
                };
                PolicyResult {
                    policy: (*p).to_string(),
                    durable: Tail::of(&pool(|r| &r.durable_ms)),
                    committed: Tail::of(&pool(|r| &r.committed_ms)),
                    cpu_s: median(&runs.iter().map(|r| r.cpu_s).collect::<Vec<_>>()),
                    wall_s: median(&runs.iter().map(|r| r.wall_s).collect::<Vec<_>>()),
                }
            })
            .collect();
        loads.push(LoadResult {
            load,
            rate,
            records,
            policies,
        });
    }
    Ok(LatencyReport {
        date,
        machine: crate::machine(),
        parallelism: s.parallelism,
        interval_ms: s.interval_ms,
        rounds: s.rounds,
        saturated_rate,
        loads,
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "–".into()
    }
}

impl LatencyReport {
    /// The table: per load and policy, the latencies and CPU, then `batch ÷ normal`.
    #[must_use]
    pub fn table(&self) -> String {
        let mut t = format!(
            "task scheduling latency ({}; p={}, checkpoint every {} ms, {} rounds, saturated rate {:.0} rec/s)\n\n\
             | load | policy | created→durable p50 / p99 / max ms | created→committed p50 / p99 / max ms | epochs | CPU s | wall s |\n\
             |---|---|---|---|---|---|---|\n",
            self.date, self.parallelism, self.interval_ms, self.rounds, self.saturated_rate
        );
        for l in &self.loads {
            let load = match l.rate {
                Some(r) => format!("{:.0} % ({r} rec/s)", l.load * 100.0),
                None => "unthrottled".into(),
            };
            for p in &l.policies {
                t.push_str(&format!(
                    "| {load} | {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {} | {:.2} | {:.2} |\n",
                    p.policy,
                    p.durable.p50,
                    p.durable.p99,
                    p.durable.max,
                    p.committed.p50,
                    p.committed.p99,
                    p.committed.max,
                    p.durable.epochs,
                    p.cpu_s,
                    p.wall_s
                ));
            }
            if let [b, n] = &l.policies[..] {
                t.push_str(&format!(
                    "| {load} | batch ÷ normal | {} / {} / {} | {} / {} / {} | | {} | {} |\n",
                    ratio(b.durable.p50, n.durable.p50),
                    ratio(b.durable.p99, n.durable.p99),
                    ratio(b.durable.max, n.durable.max),
                    ratio(b.committed.p50, n.committed.p50),
                    ratio(b.committed.p99, n.committed.p99),
                    ratio(b.committed.max, n.committed.max),
                    ratio(b.cpu_s, n.cpu_s),
                    ratio(b.wall_s, n.wall_s)
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
    fn latencies_pair_each_epoch_and_leave_out_the_final_one() {
        let mut seen = Seen::new();
        let mut put = |ns: &str, epoch: u64, state: &str, at: u64| {
            seen.insert((ns.into(), epoch, 1, state.into()), at);
        };
        put("j.main", 1, "created", 100);
        put("j.main", 1, "durable", 112);
        put("j.main", 1, "committed", 115);
        put("j.main", 2, "created", 200);
        put("j.main", 2, "durable", 230);
        // Epoch 3 is the final one: left out however long it took.
        put("j.main", 3, "created", 300);
        put("j.main", 3, "durable", 900);
        put("j.main", 3, "committed", 901);
        let (durable, committed) = latencies(&seen);
        assert_eq!(durable, vec![12.0, 30.0]);
        assert_eq!(committed, vec![15.0]);
        let t = Tail::of(&durable);
        assert_eq!((t.p50, t.p99, t.max, t.epochs), (12.0, 30.0, 30.0, 2));
    }

    #[test]
    fn polled_logs_merge_across_compaction_and_skip_a_torn_line() {
        let dir = std::env::temp_dir().join(format!("nopstream-latency-{}", std::process::id()));
        let ns = dir.join("checkpoints").join("j.main");
        std::fs::create_dir_all(&ns).unwrap();
        let log = ns.join("epochs.log");
        std::fs::write(
            &log,
            "{\"epoch\":1,\"state\":\"created\",\"attempt\":1,\"at_ms\":10}\n\
             {\"epoch\":1,\"state\":\"durable\",\"attempt\":1,\"at_ms\":20}\n\
             {\"epoch\":2,\"sta",
        )
        .unwrap();
        let mut seen = Seen::new();
        poll_logs(&dir, &mut seen);
        // Compacted: epoch 1's records are gone, epoch 2's complete.
        std::fs::write(
            &log,
            "{\"epoch\":2,\"state\":\"created\",\"attempt\":1,\"at_ms\":30}\n\
             {\"epoch\":2,\"state\":\"durable\",\"attempt\":1,\"at_ms\":45}\n\
             {\"epoch\":3,\"state\":\"created\",\"attempt\":1,\"at_ms\":50}\n",
        )
        .unwrap();
        poll_logs(&dir, &mut seen);
        assert_eq!(seen.len(), 5);
        assert_eq!(latencies(&seen).0, vec![10.0, 15.0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_job_is_throttled_per_source_instance_only_when_asked() {
        let s = Setup {
            nopstream: PathBuf::from("nopstream"),
            out: PathBuf::from("out"),
            parallelism: 2,
            interval_ms: 100,
            seconds: 1.0,
            loads: vec![0.5],
            rounds: 1,
        };
        let throttled = job_text(&s, 1000, Some(250));
        assert!(throttled.contains("records = 1000, keys = 10000, records_per_second = 250 }"));
        assert!(throttled.contains("checkpoint_interval_ms = 100\n"));
        assert!(!job_text(&s, 1000, None).contains("records_per_second"));
    }
}
