//! `nopstream status JOB`: a running or recorded job as the job manager sees it (design
//! §15) — its state, vertices with their counts and rates, edges and the last epochs —
//! read from an embedded run's control socket or from a cluster's coordinator, as a table
//! or (`--format json`) the JSON API's `StatusView`.

use crate::cluster::{self, ClusterArgs};
use anyhow::{Context, Result, bail};
use nop_stream_coordinator::manager::StatusView;
use nop_stream_proto::cli::{CliRequest, CliResponse, JobControl, JobState};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How `nopstream status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people.
    Table,
    /// The job manager's `StatusView` as JSON.
    Json,
}

/// Epochs the table lists, newest first.
const EPOCH_ROWS: usize = 5;

fn ask(target: &Target, job: &str) -> Result<StatusView> {
    let request = JobControl::View {
        job: job.to_owned(),
    };
    let resp = match target {
        Target::Cluster(c) => cluster::request(c, CliRequest::Control(request))?,
        Target::Embedded(work_dir) => crate::savepoint::control(work_dir, &request)?,
    };
    match resp {
        CliResponse::View { view_json } => {
            serde_json::from_str(&view_json).context("the job manager's status view")
        }
        CliResponse::Error(e) => bail!("{e}"),
        other => bail!("unexpected answer: {other:?}"),
    }
}

/// Where to ask.
pub enum Target {
    /// A cluster's coordinator.
    Cluster(ClusterArgs),
    /// The embedded run with this work directory.
    Embedded(PathBuf),
}

/// `nopstream status`: asks once (twice, a second apart, for a running job's rates).
///
/// # Errors
/// Nothing runs there; no such job.
pub fn status(target: &Target, job: &str, format: Format) -> Result<()> {
    let mut v = ask(target, job)?;
    let running = matches!(v.job.status.state, JobState::Running | JobState::Submitted);
    if running
        && v.job
            .vertices
            .iter()
            .any(|x| x.records_in_per_second.is_none())
    {
        std::thread::sleep(Duration::from_millis(1100));
        v = ask(target, job)?;
    }
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&v)?),
        Format::Table => print!("{}", table(&v)),
    }
    Ok(())
}

/// `nopstream status --watch`: asks every `every` and prints each answer (the table redrawn
/// in place on a terminal, one JSON object per line with `--format json`) until the job
/// ends (its last answer printed) or the run can no longer be asked (an embedded run
/// that exited; said on stderr).
///
/// # Errors
/// The first ask fails: nothing runs there, or no such job.
pub fn watch(target: &Target, job: &str, format: Format, every: Duration) -> Result<()> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        let v = match ask(target, job) {
            Ok(v) => v,
            Err(e) if !first => {
                eprintln!("status: {e:#}; stopped watching");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        first = false;
        let ended = !matches!(v.job.status.state, JobState::Running | JobState::Submitted);
        let mut out = std::io::stdout().lock();
        match format {
            Format::Json => writeln!(out, "{}", serde_json::to_string(&v)?)?,
            Format::Table if tty => write!(
                out,
                "\x1b[H\x1b[2J{}\n(every {:.1} s; Ctrl-C to stop)\n",
                table(&v),
                every.as_secs_f64()
            )?,
            Format::Table => writeln!(out, "{}", table(&v))?,
        }
        out.flush()?;
        if ended {
            return Ok(());
        }
        std::thread::sleep(every);
    }
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.0}"))
}

/// The table of `v`.
pub fn table(v: &StatusView) -> String {
    use std::fmt::Write;
    let s = &v.job.status;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "job {} ({}): {}, run {}, {}",
        s.job, s.name, s.state, s.run, s.semantic
    );
    let _ = writeln!(
        out,
        "  generation {}, recoveries {}, records read {}, written {}",
        s.generation, s.recoveries, s.records_read, s.records_written
    );
    if let Some(e) = &s.error {
        let _ = writeln!(out, "  error: {e}");
    }
    if !v.job.vertices.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<28} {:>4} {:>12} {:>12} {:>9} {:>9}",
            "VERTEX", "P", "RECORDS IN", "RECORDS OUT", "IN/S", "OUT/S"
        );
        for x in &v.job.vertices {
            let _ = writeln!(
                out,
                "{:<28} {:>4} {:>12} {:>12} {:>9} {:>9}",
                x.id,
                x.parallelism,
                x.records_in,
                x.records_out,
                rate(x.records_in_per_second),
                rate(x.records_out_per_second)
            );
        }
    }
    for e in &v.job.edges {
        let _ = writeln!(
            out,
            "  {} -> {} ({}{})",
            e.from,
            e.to,
            e.partition,
            e.output
                .as_deref()
                .map(|o| format!(", output {o}"))
                .unwrap_or_default()
        );
    }
    match &v.checkpoints {
        Some(c) => {
            let _ = writeln!(
                out,
                "\nepochs: {} created, {} durable, {} committed, {} aborted, {} pending",
                c.triggered, c.durable, c.committed, c.aborted, c.pending
            );
            let _ = writeln!(out, "{:>8} {:<10} {:>12}", "EPOCH", "STATE", "DURATION");
            for e in c.history.iter().take(EPOCH_ROWS) {
                let _ = writeln!(
                    out,
                    "{:>8} {:<10} {:>12}",
                    e.epoch,
                    e.state,
                    e.duration_ms
                        .map_or_else(|| "-".to_owned(), |d| format!("{d} ms"))
                );
            }
        }
        None => {
            let _ = writeln!(
                out,
                "\ncheckpoints: {}",
                v.error.as_deref().unwrap_or("unknown")
            );
        }
    }
    out
}

/// The target and job id of `nopstream status JOB`: with a cluster, JOB is the job id
/// (or a job file, whose id is read); otherwise JOB is the job file of an embedded run.
///
/// # Errors
/// The job file cannot be read.
pub fn target(
    job: &Path,
    work_dir: Option<PathBuf>,
    on: cluster::MaybeCluster,
) -> Result<(Target, String)> {
    match on.get() {
        Some(c) => {
            let id = if job.is_file() {
                crate::read_model(job, None)?.job.id
            } else {
                job.display().to_string()
            };
            Ok((Target::Cluster(c), id))
        }
        None => {
            let model = crate::read_model(job, None)?;
            let work_dir = work_dir.unwrap_or_else(|| {
                PathBuf::from("nopstream-out")
                    .join(&model.job.id)
                    .join("work")
            });
            Ok((Target::Embedded(work_dir), model.job.id))
        }
    }
}
