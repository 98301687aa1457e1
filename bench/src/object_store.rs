//! Checkpoints on an object store against local ones (design §14): the keyed count with
//! 1 s checkpoints, its checkpoints in the work directory or at an S3 location, run
//! interleaved; then a restore of a large keyed state from each.
//!
//! Reported, per store:
//! - **CPU overhead**: the median over the rounds of `cpu(s3) / cpu(local) - 1`, CPU being
//!   the `nopstream` process's user + system seconds (the S3 server's own CPU is not
//!   counted; it is a separate process, and on real S3 it is not ours);
//! - **epoch duration** p50 and p99 over every durable epoch of every round, from the
//!   epoch log (`created` → `durable`);
//! - **restore MB/s**: a job with a million keys is crashed after its second durable
//!   epoch and restarted; the bytes of state segments its manifest references over the
//!   slowest task's restore time (`nopstream::restore` log line).
//!
//! Every run's committed output (blackhole-sink summaries: count and checksum) must equal
//! the first local run's, or the bench fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use nop_stream_checkpoint::{Location, Namespace};
use serde::Serialize;

use crate::floor::OutputSummary;
use crate::measure;

/// What to measure.
pub struct Setup {
    /// The release `nopstream` binary.
    pub nopstream: PathBuf,
    /// Output directory (jobs, runs, `object-store.json`).
    pub out: PathBuf,
    /// The S3 location runs put their checkpoints under (one prefix per run).
    pub s3: Location,
    /// Generated bids of the timed runs.
    pub records: u64,
    /// Distinct keys of the timed runs.
    pub keys: u32,
    /// Interleaved rounds.
    pub runs: usize,
    /// Keys of the restore job.
    pub restore_keys: u32,
}

/// The figures of one store.
#[derive(Debug, Clone, Serialize)]
pub struct StoreFigures {
    /// `local` or `s3`.
    pub store: String,
    /// CPU seconds per round.
    pub cpu_s: Vec<f64>,
    /// Wall seconds per round.
    pub wall_s: Vec<f64>,
    /// Durable epochs per round.
    pub epochs: Vec<usize>,
    /// Epoch duration, ms, median over every epoch of every round.
    pub epoch_p50_ms: f64,
    /// Epoch duration, ms, 99th percentile.
    pub epoch_p99_ms: f64,
    /// Median over the rounds of `cpu / cpu(local) - 1`.
    pub cpu_overhead: f64,
    /// State bytes restored.
    pub restore_bytes: u64,
    /// Slowest task's restore, ms.
    pub restore_ms: f64,
    /// `restore_bytes / restore_ms`, MB/s.
    pub restore_mb_per_s: f64,
}

/// The report (`object-store.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// UTC time of the run.
    pub date: String,
    /// Machine description and load.
    pub machine: String,
    /// The S3 location (no credentials).
    pub s3: String,
    /// Bids and keys of the timed runs.
    pub records: u64,
    /// See `records`.
    pub keys: u32,
    /// Rounds.
    pub runs: usize,
    /// Local, then S3.
    pub stores: Vec<StoreFigures>,
}

fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// Epoch durations (created → durable, ms) of the namespace at `ns`.
fn epoch_durations(ns: &Location) -> Result<Vec<f64>> {
    use nop_stream_checkpoint::coordinator::EpochState;
    let log = Namespace::open(ns)?.read_log()?;
    Ok(log
        .iter()
        .filter(|r| r.state == EpochState::Durable)
        .filter_map(|d| {
            log.iter()
                .find(|c| {
                    c.state == EpochState::Created && c.epoch == d.epoch && c.attempt == d.attempt
                })
                .map(|c| d.at_ms.saturating_sub(c.at_ms) as f64)
        })
        .collect())
}

/// A run of `job` in `run_dir` with its checkpoints at `checkpoints` (`None`: the work
/// directory), from scratch.
fn run_once(
    s: &Setup,
    job: &Path,
    run_dir: &Path,
    checkpoints: Option<&Location>,
    env: &[(&str, &str)],
    failpoint: Option<&str>,
) -> Result<measure::ChildRun> {
    let mut cmd = Command::new(&s.nopstream);
    cmd.arg("run")
        .arg(job)
        .args(["-p", "1", "--json", "--no-progress", "--no-echo"])
        .arg("--output")
        .arg(run_dir.join("output"))
        .arg("--work-dir")
        .arg(run_dir.join("work"));
    if let Some(c) = checkpoints {
        cmd.args(["--checkpoints", &c.to_string()]);
    }
    match failpoint {
        Some(f) => cmd.env("NOPSTREAM_FAILPOINTS", f),
        None => cmd.env_remove("NOPSTREAM_FAILPOINTS"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    measure::run(cmd)
}

fn fresh(run_dir: &Path) -> Result<()> {
    for sub in ["work", "output"] {
        let p = run_dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("remove {}", p.display()))?;
        }
    }
    Ok(())
}

const NAMESPACE: &str = "bench-large-state.main";

/// Runs the timed rounds and the restores; prints as it goes.
///
/// # Errors
/// A failed run, or output that differs between stores.
pub fn run(s: &Setup) -> Result<Report> {
    let jobs = s.out.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    let job = jobs.join("object-store-count.toml");
    std::fs::write(
        &job,
        crate::large_state::job_text(s.keys, s.records, 1024, None, false, false, None),
    )?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let mut expected: Option<OutputSummary> = None;
    let mut cpu = [Vec::new(), Vec::new()];
    let mut wall = [Vec::new(), Vec::new()];
    let mut epochs = [Vec::new(), Vec::new()];
    let mut durations = [Vec::new(), Vec::new()];
    for round in 0..=s.runs {
        for (i, store) in ["local", "s3"].iter().enumerate() {
            let run_dir = s.out.join("runs").join(format!("object-store-{store}"));
            fresh(&run_dir)?;
            let root = match i {
                0 => Location::Local(run_dir.join("work").join("checkpoints")),
                _ => s.s3.join(&format!("bench-{stamp}-{round}")),
            };
            let child = run_once(s, &job, &run_dir, (i == 1).then_some(&root), &[], None)?;
            let out = crate::committed_output(&run_dir.join("output"))?
                .context("the blackhole sink committed no summary")?;
            match &expected {
                None => expected = Some(out),
                Some(e) => ensure!(
                    *e == out,
                    "{store} round {round}: output {out:?} differs from {e:?}"
                ),
            }
            let d = epoch_durations(&root.join(NAMESPACE))?;
            eprintln!(
                "   round {round}{}: {store:<5} {:.3} CPU s, {:.3} s, {} epochs, epoch p50 {:.0} ms",
                if round == 0 { " (warm-up)" } else { "" },
                child.cpu_s,
                child.wall_s,
                d.len(),
                percentile(&d, 0.5)
            );
            if round == 0 {
                continue;
            }
            cpu[i].push(child.cpu_s);
            wall[i].push(child.wall_s);
            epochs[i].push(d.len());
            durations[i].extend(d);
        }
    }
    let mut stores = Vec::new();
    for (i, store) in ["local", "s3"].iter().enumerate() {
        let (bytes, restore_ms) = restore(s, store, stamp)?;
        let overhead: Vec<f64> = cpu[i]
            .iter()
            .zip(&cpu[0])
            .map(|(v, l)| v / l - 1.0)
            .collect();
        stores.push(StoreFigures {
            store: (*store).into(),
            cpu_s: cpu[i].clone(),
            wall_s: wall[i].clone(),
            epochs: epochs[i].clone(),
            epoch_p50_ms: percentile(&durations[i], 0.5),
            epoch_p99_ms: percentile(&durations[i], 0.99),
            cpu_overhead: percentile(&overhead, 0.5),
            restore_bytes: bytes,
            restore_ms,
            restore_mb_per_s: bytes as f64 / 1e6 / (restore_ms.max(1e-3) / 1000.0),
        });
    }
    let report = Report {
        date: crate::utc_now(),
        machine: crate::machine(),
        s3: s.s3.to_string(),
        records: s.records,
        keys: s.keys,
        runs: s.runs,
        stores,
    };
    print(&report);
    std::fs::write(
        s.out.join("object-store.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    Ok(report)
}

/// Crashes the restore job after its second durable epoch with its checkpoints in
/// `store`, restarts it, and returns (state bytes restored, slowest task restore ms).
fn restore(s: &Setup, store: &str, stamp: u128) -> Result<(u64, f64)> {
    let job = s.out.join("jobs").join("object-store-restore.toml");
    // Throttled so that the second durable epoch holds most of the keys.
    let records = u64::from(s.restore_keys) * 3;
    std::fs::write(
        &job,
        crate::large_state::job_text(
            s.restore_keys,
            records,
            1024,
            None,
            false,
            true,
            Some(records / 4),
        ),
    )?;
    let run_dir = s
        .out
        .join("runs")
        .join(format!("object-store-restore-{store}"));
    fresh(&run_dir)?;
    let root = match store {
        "local" => Location::Local(run_dir.join("work").join("checkpoints")),
        _ => s.s3.join(&format!("bench-restore-{stamp}")),
    };
    let checkpoints = (store != "local").then_some(&root);
    // The failpoint aborts the process: the run fails.
    let crashed = run_once(
        s,
        &job,
        &run_dir,
        checkpoints,
        &[],
        Some("after-manifest-publish=2"),
    );
    ensure!(crashed.is_err(), "{store}: the failpoint did not fire");
    let ns = Namespace::open(&root.join(NAMESPACE))?;
    let m = ns
        .latest_manifest()?
        .context("no durable epoch before the crash")?;
    let bytes: u64 = m
        .tasks
        .iter()
        .flat_map(|t| &t.segments)
        .map(|seg| seg.len)
        .sum();
    let child = run_once(
        s,
        &job,
        &run_dir,
        checkpoints,
        &[("RUST_LOG", "warn,nopstream::restore=debug")],
        None,
    )?;
    let ms = crate::cluster::strip_ansi(&child.stderr)
        .lines()
        .filter(|l| l.contains("task state restored"))
        .filter_map(|l| {
            let at = l.find("elapsed_ms=")? + "elapsed_ms=".len();
            l[at..].split_whitespace().next()?.parse::<f64>().ok()
        })
        .reduce(f64::max)
        .context("no task logged its restore")?;
    eprintln!(
        "   restore {store}: {:.1} MB in {ms:.0} ms",
        bytes as f64 / 1e6
    );
    Ok((bytes, ms))
}

fn print(r: &Report) {
    println!(
        "\ncheckpoints on an object store ({}): the keyed count, {} bids over {} keys, 1 s checkpoints, {} interleaved rounds",
        r.s3, r.records, r.keys, r.runs
    );
    println!(
        "{:<6} {:>10} {:>12} {:>8} {:>13} {:>13} {:>14}",
        "store", "CPU s", "CPU overhead", "epochs", "epoch p50 ms", "epoch p99 ms", "restore MB/s"
    );
    for s in &r.stores {
        println!(
            "{:<6} {:>10.3} {:>11.1}% {:>8.1} {:>13.0} {:>13.0} {:>14.1}",
            s.store,
            percentile(&s.cpu_s, 0.5),
            s.cpu_overhead * 100.0,
            s.epochs.iter().sum::<usize>() as f64 / s.epochs.len().max(1) as f64,
            s.epoch_p50_ms,
            s.epoch_p99_ms,
            s.restore_mb_per_s
        );
    }
}
