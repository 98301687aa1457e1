//! The cluster benchmarks (design §20):
//!
//! - [`throughput`] (`nopstream-bench cluster`): the keyed count at parallelism `p` on a
//!   coordinator and `p` node processes (release binaries, QUIC on loopback, mTLS
//!   certificates from `nopstream cluster init`), interleaved with embedded
//!   `nopstream run -p p`; records per CPU second and wall time, cluster ÷ embedded.
//! - [`recovery`] (`nopstream-bench cluster-recovery`): SIGKILL of a node holding tasks of
//!   the checkpointed keyed count, and the phases of the recovery read from the
//!   coordinator's and nodes' logs and the epoch log.
//!
//! Every run's committed output (the blackhole sink's record count, payload bytes and
//! order-independent checksum of the `(auction, running count)` updates) must equal the
//! native floor's, so a broken run fails the benchmark instead of being measured.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde::Serialize;
use serde_json::Value;

use crate::cluster::{self, ClusterOptions, LocalCluster};
use crate::epochs::Spread;
use crate::floor::OutputSummary;
use crate::workload::{self, Workload};
use crate::{Case, JobReport, RunConfig};

/// The plugins the bids workloads use, as component file names.
const PLUGINS: [&str; 4] = [
    "file_source.wasm",
    "bids_parser.wasm",
    "keyed_count.wasm",
    "blackhole_sink.wasm",
];

/// What both cluster benchmarks share.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The `nopstream` binary.
    pub nopstream: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Directory of the plugin components.
    pub plugins: PathBuf,
    /// Input size label and records.
    pub size: (&'static str, u64),
    /// Parallelism of the job.
    pub parallelism: u32,
    /// Lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
}

impl Setup {
    fn cluster_options(&self, dir: PathBuf, nodes: u32, log_filter: &str) -> ClusterOptions {
        ClusterOptions {
            nopstream: self.nopstream.clone(),
            dir,
            nodes,
            lease_ttl_ms: self.lease_ttl_ms,
            heartbeat_ms: self.heartbeat_ms,
            log_filter: log_filter.into(),
            plugins: PLUGINS.iter().map(|p| self.plugins.join(p)).collect(),
        }
    }

    /// Writes the job file of `w` for this input; the input file (generated if missing)
    /// and the job file.
    fn job(&self, w: &Workload) -> Result<(PathBuf, PathBuf)> {
        let (label, records) = self.size;
        let input = crate::bids_file(&self.out.join("data"), label, records, true)?;
        let jobs = self.out.join("jobs");
        std::fs::create_dir_all(&jobs)?;
        let file_name = input.file_name().context("file name")?.to_string_lossy();
        let job = jobs.join(format!("{}-{label}.toml", w.name));
        std::fs::write(&job, workload::job_text(w, "../data", &file_name, 1024))?;
        Ok((input, job))
    }
}

/// The floor's output of the count workload on `input`.
fn floor_output(w: &Workload, input: &Path, run_dir: &Path) -> Result<OutputSummary> {
    let case = Case {
        workload: w,
        input: input.to_owned(),
        job: PathBuf::new(),
        run_dir: run_dir.to_owned(),
    };
    let (_, f) = crate::floor_run(&case)?;
    Ok(f.output)
}

/// The committed output in `dir`, which must equal `expected`.
fn check_output(dir: &Path, expected: &OutputSummary, what: &str) -> Result<()> {
    let got = crate::committed_output(dir)?
        .with_context(|| format!("{what}: no committed summary in {}", dir.display()))?;
    ensure!(
        got == *expected,
        "{what}: committed output {got:?} differs from the floor's {expected:?}"
    );
    Ok(())
}

fn job_report(status: &Value) -> Result<JobReport> {
    let text = status["report_json"]
        .as_str()
        .context("a finished job's status has no report")?;
    Ok(serde_json::from_str(text)?)
}

fn wall_s(r: &JobReport) -> f64 {
    r.wall.secs as f64 + f64::from(r.wall.nanos) / 1e9
}

/// One measured run of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRun {
    /// `embedded` or `cluster`.
    pub mode: &'static str,
    /// Pair index (1-based).
    pub run: usize,
    /// Records read by the sources.
    pub records: u64,
    /// The coordinator role's job wall time (`wall` of the run report; both modes).
    pub job_wall_s: f64,
    /// Embedded: process spawn to exit. Cluster: `job submit` start to the status poll
    /// that saw it finished (quantised by the poll interval).
    pub e2e_wall_s: f64,
    /// Embedded: the run process (`wait4`). Cluster: coordinator + every node
    /// (`/proc/<pid>/stat` after − before).
    pub cpu_s: f64,
    /// Cluster only: the CLI processes (submit and status polls), not in `cpu_s`.
    pub cli_cpu_s: f64,
}

impl ModeRun {
    fn records_per_cpu_s(&self) -> f64 {
        self.records as f64 / self.cpu_s
    }
}

/// Result of [`throughput`].
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputResult {
    /// When.
    pub date: String,
    /// Cores and CPU.
    pub machine: String,
    /// Command line.
    pub command: String,
    /// Input file.
    pub input: String,
    /// Parallelism.
    pub parallelism: u32,
    /// Node processes.
    pub nodes: u32,
    /// Placement of the cluster job's tasks.
    pub placement: String,
    /// Every measured run, interleaved.
    pub runs: Vec<ModeRun>,
    /// Median over pairs of (cluster rec/CPU-s ÷ embedded rec/CPU-s).
    pub ratio_records_per_cpu_s: f64,
    /// Median over pairs of (embedded job wall ÷ cluster job wall), i.e. throughput.
    pub ratio_job_wall_throughput: f64,
    /// Median over pairs of (embedded e2e wall ÷ cluster e2e wall).
    pub ratio_e2e_throughput: f64,
}

fn median(v: impl IntoIterator<Item = f64>) -> f64 {
    Spread::of(&v.into_iter().collect::<Vec<_>>()).median
}

/// One cluster run of `job`; checks its output and that it ran without recovery.
fn cluster_run(
    c: &mut LocalCluster,
    job: &Path,
    parallelism: u32,
    output: &Path,
    expected: &OutputSummary,
    run: usize,
) -> Result<(ModeRun, Value)> {
    let cpu0 = c.processes_cpu_s()?;
    let cli0 = c.cli_cpu_s();
    let started = Instant::now();
    let id = c.submit(job, parallelism, output)?;
    let (status, seen) =
        c.wait_finished(&id, Duration::from_millis(100), Duration::from_secs(600))?;
    let cpu_s = c.processes_cpu_s()? - cpu0;
    let e2e_wall_s = seen.duration_since(started).as_secs_f64();
    ensure!(
        status["recoveries"].as_u64() == Some(0),
        "the cluster run recovered: {}",
        status["error"]
    );
    check_output(output, expected, "cluster")?;
    let report = job_report(&status)?;
    Ok((
        ModeRun {
            mode: "cluster",
            run,
            // Every bid was read: the committed output (one update per bid) equals the
            // floor's. (The job status's counters are the nodes' reports, cumulative over
            // resubmissions of one job id.)
            records: expected.records,
            job_wall_s: wall_s(&report),
            e2e_wall_s,
            cpu_s,
            cli_cpu_s: c.cli_cpu_s() - cli0,
        },
        status,
    ))
}

/// `nopstream-bench cluster`: see the [module docs](self).
///
/// # Errors
/// A failed run, an output that differs from the floor's, or a placement whose HASH edge
/// does not cross nodes.
pub fn throughput(s: &Setup, runs: usize) -> Result<ThroughputResult> {
    let w = workload::find("count").context("count workload")?;
    let (input, job) = s.job(w)?;
    let base = s.out.join("runs").join(format!("cluster-{}", s.size.0));
    let expected = floor_output(w, &input, &base)?;
    let cfg = RunConfig {
        runs,
        parallelism: s.parallelism,
        batch_records: 1024,
        nopstream: s.nopstream.clone(),
        out: s.out.clone(),
    };
    let case = Case {
        workload: w,
        input: input.clone(),
        job: job.clone(),
        run_dir: base.join("embedded"),
    };
    let nodes = s.parallelism;
    eprintln!(
        "starting a coordinator and {nodes} nodes (lease TTL {} ms, heartbeat {} ms)",
        s.lease_ttl_ms, s.heartbeat_ms
    );
    let mut c = LocalCluster::start(&s.cluster_options(base.join("cluster"), nodes, "warn"))?;
    let cluster_out = base.join("cluster-output");
    // Warm-up (not measured): the compile caches of the run process and of the nodes, the
    // page cache.
    let (_, _) = crate::nopstream_run(&cfg, &case)?;
    check_output(&case.run_dir.join("output"), &expected, "embedded warm-up")?;
    let (_, status) = cluster_run(&mut c, &job, s.parallelism, &cluster_out, &expected, 0)?;
    let placed = cluster::placement(&status)?;
    let placement = cluster::describe_placement(&placed);
    eprintln!("placement: {placement}");
    let used = cluster::nodes_used(&placed);
    ensure!(
        used.len() >= 2,
        "every task is on {used:?}: the HASH edge does not cross nodes"
    );
    // Subtask i of every vertex is in slot group i; groups go round-robin over the nodes,
    // so the producers of each keyed subtask are split across the nodes.
    let mut all = Vec::new();
    for i in 1..=runs {
        let embedded_out = case.run_dir.join("output");
        if embedded_out.exists() {
            std::fs::remove_dir_all(&embedded_out)?;
        }
        let (child, report) = crate::nopstream_run(&cfg, &case)?;
        check_output(&case.run_dir.join("output"), &expected, "embedded")?;
        let e = ModeRun {
            mode: "embedded",
            run: i,
            records: report.records_read,
            job_wall_s: wall_s(&report),
            e2e_wall_s: child.wall_s,
            cpu_s: child.cpu_s,
            cli_cpu_s: 0.0,
        };
        let (k, status) = cluster_run(&mut c, &job, s.parallelism, &cluster_out, &expected, i)?;
        ensure!(
            cluster::placement(&status)? == placed,
            "the placement changed between runs"
        );
        ensure!(
            e.records == k.records,
            "records read differ: embedded {}, cluster {}",
            e.records,
            k.records
        );
        for r in [&e, &k] {
            eprintln!(
                "   run {i} {:<8}: job {:.2} s, e2e {:.2} s, {:.2} CPU s ({} rec/CPU-s){}",
                r.mode,
                r.job_wall_s,
                r.e2e_wall_s,
                r.cpu_s,
                crate::report::human(r.records_per_cpu_s()),
                if r.mode == "cluster" {
                    format!(", CLI {:.2} CPU s", r.cli_cpu_s)
                } else {
                    String::new()
                }
            );
        }
        all.push(e);
        all.push(k);
    }
    let pairs: Vec<(&ModeRun, &ModeRun)> = all.chunks(2).map(|p| (&p[0], &p[1])).collect();
    let result = ThroughputResult {
        date: crate::utc_now(),
        machine: crate::machine(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        input: input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        parallelism: s.parallelism,
        nodes,
        placement,
        ratio_records_per_cpu_s: median(
            pairs
                .iter()
                .map(|(e, k)| k.records_per_cpu_s() / e.records_per_cpu_s()),
        ),
        ratio_job_wall_throughput: median(pairs.iter().map(|(e, k)| e.job_wall_s / k.job_wall_s)),
        ratio_e2e_throughput: median(pairs.iter().map(|(e, k)| e.e2e_wall_s / k.e2e_wall_s)),
        runs: all,
    };
    std::fs::write(
        s.out.join("cluster.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

impl ThroughputResult {
    /// The Markdown table of the runs and the ratios.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| mode | runs | job wall s median [min – max] | end-to-end wall s median | CPU s median | records / CPU-s median | CLI CPU s median |\n|---|---|---|---|---|---|---|\n",
        );
        for mode in ["embedded", "cluster"] {
            let rs: Vec<&ModeRun> = self.runs.iter().filter(|r| r.mode == mode).collect();
            let col = |f: fn(&ModeRun) -> f64| rs.iter().map(|r| f(r)).collect::<Vec<_>>();
            let job = col(|r| r.job_wall_s);
            let min = job.iter().copied().fold(f64::INFINITY, f64::min);
            let max = job.iter().copied().fold(0.0, f64::max);
            t.push_str(&format!(
                "| {mode} | {} | {:.2} [{min:.2} – {max:.2}] | {:.2} | {:.2} | {} | {} |\n",
                rs.len(),
                median(job.clone()),
                median(col(|r| r.e2e_wall_s)),
                median(col(|r| r.cpu_s)),
                crate::report::human(median(col(ModeRun::records_per_cpu_s))),
                if mode == "cluster" {
                    format!("{:.2}", median(col(|r| r.cli_cpu_s)))
                } else {
                    "–".into()
                },
            ));
        }
        t.push_str(&format!(
            "\ncluster ÷ embedded (median of per-pair ratios): records per CPU-second {:.2}; throughput by job wall {:.2}; by end-to-end wall {:.2}\n",
            self.ratio_records_per_cpu_s, self.ratio_job_wall_throughput, self.ratio_e2e_throughput
        ));
        t
    }
}

/// One recovery trial's phases, ms.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// The node killed.
    pub killed: String,
    /// What the coordinator said the failed attempt failed of.
    pub cause: String,
    /// Kill → the coordinator declares the attempt failed ("attempt N failed,
    /// recovering"), from its log.
    pub detect_ms: f64,
    /// Kill → "lease expired" for the killed node in the coordinator's log, if it logged
    /// one.
    pub lease_expired_ms: Option<f64>,
    /// Declared failed → "deploying" the new generation (fence, join, restart pause).
    pub to_deploy_ms: f64,
    /// "deploying" → the last surviving node logged "started" for the new generation
    /// (prepare: fetch/compile components, connect, register channels; then start).
    pub deploy_ms: f64,
    /// Started → the last task logged "task state restored" (keyed state read from
    /// checkpoint segments).
    pub restore_ms: f64,
    /// Restored → the first epoch committed by the new attempt (epoch log).
    pub to_first_commit_ms: f64,
    /// Kill → first epoch committed by the new attempt.
    pub total_ms: f64,
    /// Placement before and after.
    pub placement_before: String,
    /// See `placement_before`.
    pub placement_after: String,
}

/// Result of [`recovery`].
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryResult {
    /// When.
    pub date: String,
    /// Cores and CPU.
    pub machine: String,
    /// Command line.
    pub command: String,
    /// Lease TTL, ms.
    pub lease_ttl_ms: u64,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Nodes at the start.
    pub nodes: u32,
    /// Trials.
    pub trials: Vec<Trial>,
}

fn first_after(
    lines: &[(f64, String)],
    after: f64,
    pred: impl Fn(&str) -> bool,
) -> Option<&(f64, String)> {
    lines.iter().find(|(t, l)| *t >= after && pred(l))
}

/// The value of `key=` in a tracing line (up to the next space).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..].split_whitespace().next()
}

fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// `nopstream-bench cluster-recovery`: see the [module docs](self).
///
/// # Errors
/// A failed trial: no durable epoch before the kill, a job that does not finish, an
/// output that differs from the floor's, a phase missing from the logs.
pub fn recovery(
    s: &Setup,
    nodes: u32,
    trials: usize,
    kill_delay_ms: u64,
) -> Result<RecoveryResult> {
    let w = workload::find("count-ckpt").context("count-ckpt workload")?;
    let (input, job) = s.job(w)?;
    let base = s
        .out
        .join("runs")
        .join(format!("cluster-recovery-{}", s.size.0));
    let expected = floor_output(w, &input, &base)?;
    let mut out = Vec::new();
    for t in 1..=trials {
        let mut c = LocalCluster::start(&s.cluster_options(
            base.join(format!("trial-{t}")),
            nodes,
            "info,nopstream::restore=debug",
        ))?;
        let output = base.join(format!("trial-{t}-output"));
        let id = c.submit(&job, s.parallelism, &output)?;
        // Kill once an epoch is durable, so that the recovery restores state.
        let status = loop {
            let st = c.status(&id)?;
            ensure!(
                st["state"] == "Running" || st["state"] == "Submitted",
                "trial {t}: the job ended before the kill ({}); use a larger input",
                st["state"]
            );
            if st["durable_epoch"].as_u64().is_some_and(|e| e >= 1)
                && st["deployment_json"].is_string()
            {
                break st;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        std::thread::sleep(Duration::from_millis(kill_delay_ms));
        let before = cluster::placement(&status)?;
        let generation = status["generation"].as_u64().unwrap_or(0);
        let victim = cluster::nodes_used(&before)
            .last()
            .cloned()
            .context("no node holds tasks")?;
        let victim_id: u32 = victim
            .strip_prefix("node-")
            .and_then(|n| n.parse().ok())
            .context("node name")?;
        let kill_ms = unix_ms();
        c.kill_node(victim_id)?;
        eprintln!("   trial {t}: killed {victim} (generation {generation})");
        let (end, _) =
            c.wait_finished(&id, Duration::from_millis(250), Duration::from_secs(600))?;
        ensure!(
            end["recoveries"].as_u64().unwrap_or(0) >= 1,
            "trial {t}: the job finished without a recovery"
        );
        check_output(&output, &expected, &format!("trial {t}"))?;
        let after = cluster::placement(&end)?;

        let coord = cluster::timed_lines(&c.log_path("coordinator"))?;
        let (detect_at, failed_line) = first_after(&coord, kill_ms - 1.0, |l| {
            l.contains("failed, recovering from the latest durable epoch")
        })
        .map(|(t, l)| (*t, l.clone()))
        .with_context(|| format!("trial {t}: no recovery in the coordinator log"))?;
        let cause = failed_line
            .split_once("latest durable epoch: ")
            .map(|(_, c)| c.trim().to_owned())
            .unwrap_or_default();
        let lease_expired_at = first_after(&coord, kill_ms - 1.0, |l| {
            l.contains("lease expired") && l.contains(&victim)
        })
        .map(|(t, _)| *t);
        let deploy_at = first_after(&coord, detect_at, |l| {
            l.contains("deploying")
                && field(l, "generation")
                    .and_then(|g| g.parse::<u64>().ok())
                    .is_some_and(|g| g > generation)
        })
        .map(|(t, _)| *t)
        .with_context(|| format!("trial {t}: no new deployment in the coordinator log"))?;
        let new_generation = |l: &str| {
            field(l, "generation")
                .and_then(|g| g.parse::<u64>().ok())
                .is_some_and(|g| g > generation)
        };
        let mut started_at: f64 = 0.0;
        let mut restored_at: f64 = 0.0;
        for n in cluster::nodes_used(&after) {
            let lines = cluster::timed_lines(&c.log_path(&n))?;
            let st = first_after(&lines, deploy_at, |l| {
                l.contains(" started") && new_generation(l)
            })
            .map(|(t, _)| *t)
            .with_context(|| format!("trial {t}: {n} logged no start of the new generation"))?;
            started_at = started_at.max(st);
            for (rt, _) in lines
                .iter()
                .filter(|(rt, l)| *rt >= deploy_at && l.contains("task state restored"))
            {
                restored_at = restored_at.max(*rt);
            }
        }
        ensure!(
            restored_at > 0.0,
            "trial {t}: no task logged its restore (RUST_LOG nopstream::restore=debug)"
        );
        let commit_ms = crate::epochs::first_commit_after(&c.coordinator_data(), kill_ms as u64)?;
        let commit_at = kill_ms.floor() + commit_ms;
        let trial = Trial {
            killed: victim,
            cause,
            detect_ms: detect_at - kill_ms,
            lease_expired_ms: lease_expired_at.map(|x| x - kill_ms),
            to_deploy_ms: deploy_at - detect_at,
            deploy_ms: started_at - deploy_at,
            restore_ms: restored_at - started_at,
            to_first_commit_ms: commit_at - restored_at,
            total_ms: commit_ms,
            placement_before: cluster::describe_placement(&before),
            placement_after: cluster::describe_placement(&after),
        };
        eprintln!(
            "   trial {t}: detect {:.0} ms (lease expired at {}), → deploying {:.0} ms, deploy {:.0} ms, restore {:.0} ms, → first commit {:.0} ms; kill → first commit {:.0} ms\n      cause: {}",
            trial.detect_ms,
            trial
                .lease_expired_ms
                .map_or_else(|| "–".into(), |x| format!("{x:.0} ms")),
            trial.to_deploy_ms,
            trial.deploy_ms,
            trial.restore_ms,
            trial.to_first_commit_ms,
            trial.total_ms,
            trial.cause
        );
        out.push(trial);
        drop(c);
    }
    let result = RecoveryResult {
        date: crate::utc_now(),
        machine: crate::machine(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        lease_ttl_ms: s.lease_ttl_ms,
        heartbeat_ms: s.heartbeat_ms,
        nodes,
        trials: out,
    };
    std::fs::write(
        s.out.join("cluster-recovery.json"),
        serde_json::to_string_pretty(&result)?,
    )?;
    Ok(result)
}

impl RecoveryResult {
    /// The Markdown table of the phases (median and max over the trials).
    pub fn table(&self) -> String {
        let col = |f: fn(&Trial) -> f64| -> Spread {
            Spread::of(&self.trials.iter().map(f).collect::<Vec<_>>())
        };
        let expired: Vec<&Trial> = self
            .trials
            .iter()
            .filter(|t| t.lease_expired_ms.is_some())
            .collect();
        let of = |f: &dyn Fn(&Trial) -> f64, ts: &[&Trial]| {
            Spread::of(&ts.iter().map(|t| f(t)).collect::<Vec<_>>())
        };
        let all: Vec<&Trial> = self.trials.iter().collect();
        let rows: [(&str, Spread); 7] = [
            (
                "kill → lease expired (detection: the coordinator declares the node lost)",
                of(&|t| t.lease_expired_ms.unwrap_or(0.0), &expired),
            ),
            (
                "lease expired → attempt declared failed (fence, cancel, join the surviving tasks)",
                of(
                    &|t| t.detect_ms - t.lease_expired_ms.unwrap_or(0.0),
                    &expired,
                ),
            ),
            (
                "declared failed → deploying the new generation (restart pause)",
                col(|t| t.to_deploy_ms),
            ),
            (
                "deploying → every node started (redeploy: prepare, then start)",
                col(|t| t.deploy_ms),
            ),
            (
                "started → last task restored its keyed state (restore)",
                col(|t| t.restore_ms),
            ),
            (
                "restored → first epoch committed by the new attempt",
                col(|t| t.to_first_commit_ms),
            ),
            (
                "kill → first epoch committed (total)",
                of(&|t| t.total_ms, &all),
            ),
        ];
        let mut t = format!(
            "lease TTL {} ms, heartbeat {} ms, {} nodes, {} trials\n\n| phase | median ms | max ms |\n|---|---|---|\n",
            self.lease_ttl_ms,
            self.heartbeat_ms,
            self.nodes,
            self.trials.len()
        );
        for (name, s) in rows {
            t.push_str(&format!("| {name} | {:.0} | {:.0} |\n", s.median, s.max));
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_of_tracing_lines() {
        let l = "2026-12-02T06:54:35.250000Z  INFO nop_stream_server::workers: deploying job=bench-count generation=3 nodes=node-1,node-3";
        assert_eq!(field(l, "generation"), Some("3"));
        assert_eq!(field(l, "nodes"), Some("node-1,node-3"));
        assert_eq!(field(l, "nope"), None);
        let lines = vec![
            (1.0, "a".to_owned()),
            (2.0, "b".to_owned()),
            (3.0, "b".to_owned()),
        ];
        assert_eq!(
            first_after(&lines, 2.5, |l| l == "b").map(|x| x.0),
            Some(3.0)
        );
        assert!(first_after(&lines, 4.0, |_| true).is_none());
    }
}
