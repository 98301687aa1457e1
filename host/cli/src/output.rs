//! Output directory handling, the run directories, the run summary and the echo of
//! committed output.

use anyhow::{Result, bail};
use nop_stream_coordinator::JobReport;
use std::path::{Path, PathBuf};

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Prints the end-of-run summary.
/// Where a run keeps its files: printed when it starts and in its summary.
#[derive(Debug, Clone)]
pub struct RunDirs {
    /// Output directory granted to sinks as `$OUTPUT`.
    pub output: PathBuf,
    /// Work directory: `state/` (redb, per subtask) and `checkpoints/<namespace>/`.
    pub work_dir: PathBuf,
    /// Checkpoint namespace (`<job id>.<pipeline id>`), the prefix of the checkpoint root
    /// holding this job's epoch records, manifests, segments and epoch log.
    pub namespace: String,
    /// The namespace's location (`<work dir>/checkpoints/<namespace>` by default).
    pub checkpoints: nop_stream_checkpoint::Location,
}

impl RunDirs {
    /// Prints the directories on stderr as the run starts (stdout stays for the summary
    /// and `--json`).
    pub fn print_start(&self, job_id: &str) {
        eprintln!("job `{job_id}`");
        self.print(&mut std::io::stderr());
    }

    fn print(&self, w: &mut dyn std::io::Write) {
        let _ = writeln!(w, "  work directory   {}", self.work_dir.display());
        let _ = writeln!(
            w,
            "  checkpoints      namespace `{}` in {}",
            self.namespace, self.checkpoints
        );
        let _ = writeln!(w, "  output           {}", self.output.display());
    }
}

/// Prints the human-readable summary of a finished run, ending with its directories.
pub fn print_summary(report: &JobReport, dirs: &RunDirs) {
    let secs = report.wall.as_secs_f64().max(1e-9);
    if report.already_finished {
        println!(
            "job `{}` already finished at epoch {}: nothing to do (semantic mode {})",
            report.job_id,
            report.final_epoch.unwrap_or(0),
            report.semantic
        );
        dirs.print(&mut std::io::stdout());
        return;
    }
    println!(
        "job `{}` {}: semantic mode {}, attempt {}",
        report.job_id,
        if report.stopped {
            "stopped with a savepoint"
        } else {
            "finished"
        },
        report.semantic,
        report.attempt
    );
    if let Some(e) = report.resumed_from {
        println!("  resumed from     epoch {e}");
    }
    if report.recoveries > 0 {
        println!("  recoveries       {}", report.recoveries);
    }
    println!(
        "  epochs           {} durable, {} epoch {}",
        report.epochs,
        if report.stopped { "savepoint" } else { "final" },
        report.final_epoch.map_or("-".to_owned(), |e| e.to_string())
    );
    println!(
        "  records read     {} in {:.2} s ({} records/s)",
        thousands(report.records_read),
        secs,
        thousands((report.records_read as f64 / secs) as u64)
    );
    println!("  records written  {}", thousands(report.records_written));
    for line in error_policy_lines(report) {
        println!("{line}");
    }
    println!("  transactions     {} committed", report.committed_total);
    dirs.print(&mut std::io::stdout());
}

/// Summary lines of the operators' error policies (`on_error`): per operator, records
/// skipped (a declared loss) and records sent to the dead-letter output `errors`, summed
/// over subtasks. Counts cover this run's finishing attempt: a recovery or a resumed run
/// replays from a durable epoch, so records handled before it are not counted again.
fn error_policy_lines(report: &JobReport) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut per_op: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for t in &report.tasks {
        for (op, counters) in &t.counters {
            for name in ["records_skipped", "records_dead_lettered"] {
                if let Some(n) = counters.get(name).filter(|n| **n > 0) {
                    *per_op.entry((name, op.as_str())).or_default() += n;
                }
            }
        }
    }
    per_op
        .into_iter()
        .map(|((name, op), n)| match name {
            "records_skipped" => format!(
                "  records skipped  {} by `{op}` (on_error = \"skip\": dropped, a declared loss)",
                thousands(n)
            ),
            _ => format!(
                "  dead-lettered    {} by `{op}` (on_error = \"dead-letter\": to its output `errors`)",
                thousands(n)
            ),
        })
        .collect()
}

/// Prints the committed output files' lines (sorted) when there are at most 200 lines,
/// otherwise their count.
///
/// # Errors
/// An unreadable output file.
pub fn echo_output(dir: &Path) -> Result<()> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    let mut lines = Vec::new();
    for f in &files {
        for l in std::fs::read_to_string(f)?.lines() {
            lines.push(l.to_owned());
        }
    }
    if lines.len() <= 200 {
        lines.sort();
        for l in &lines {
            println!("{l}");
        }
    } else {
        println!(
            "  ({} lines in {} files)",
            thousands(lines.len() as u64),
            files.len()
        );
    }
    Ok(())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') {
            continue;
        }
        if p.is_dir() {
            collect(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// Prints the checkpoints of a namespace directory (design §15).
///
/// # Errors
/// An unreadable namespace.
pub fn print_checkpoints(location: &nop_stream_checkpoint::Location, verbose: bool) -> Result<()> {
    let storage = nop_stream_checkpoint::Namespace::open(location)?;
    let log = storage.read_log()?;
    let mut manifests = Vec::new();
    for e in storage.manifest_epochs()? {
        manifests.push(storage.read_manifest(e)?);
    }
    if manifests.is_empty() && log.is_empty() {
        bail!("{location} holds no checkpoints");
    }
    print_checkpoint_table(
        &format!("checkpoints in {location}"),
        &log,
        &manifests,
        verbose,
    )
}

/// Prints an epoch log and the manifests still retained as the `checkpoints` table.
///
/// # Errors
/// A log record whose state does not serialise (never, in practice).
pub fn print_checkpoint_table(
    title: &str,
    log: &[nop_stream_checkpoint::EpochLogRecord],
    manifests: &[nop_stream_checkpoint::EpochManifest],
    verbose: bool,
) -> Result<()> {
    use std::collections::BTreeMap;
    let mut states: BTreeMap<u64, (String, u32)> = BTreeMap::new();
    for r in log {
        let s = serde_json::to_value(r.state)?
            .as_str()
            .unwrap_or("?")
            .to_owned();
        states.insert(r.epoch.0, (s, r.attempt.0));
    }
    println!("{title}");
    println!(
        "{:>6}  {:<10} {:>7} {:>10} {:>10} {:>12}  contents",
        "epoch", "state", "attempt", "duration", "alignment", "snapshot"
    );
    for (epoch, (state, attempt)) in &states {
        let m = manifests.iter().find(|m| m.epoch.0 == *epoch);
        let (duration, alignment, bytes, contents) = match m {
            Some(m) => {
                let splits: usize = m.tasks.iter().map(|t| t.splits.len()).sum();
                let txns: usize = m.tasks.iter().map(|t| t.pending_transactions.len()).sum();
                (
                    format!("{} ms", m.durable_ms.saturating_sub(m.created_ms)),
                    format!(
                        "{} ms",
                        m.tasks.iter().map(|t| t.alignment_ms).max().unwrap_or(0)
                    ),
                    format!("{} B", thousands(m.snapshot_bytes())),
                    format!(
                        "{splits} split cursors, {txns} sink transactions{}",
                        if m.final_epoch { ", final" } else { "" }
                    ),
                )
            }
            None => (
                "-".into(),
                "-".into(),
                "-".into(),
                if state == "durable" || state == "committed" {
                    "(manifest expired by retention)".into()
                } else {
                    String::new()
                },
            ),
        };
        println!(
            "{epoch:>6}  {state:<10} {attempt:>7} {duration:>10} {alignment:>10} {bytes:>12}  {contents}"
        );
        if verbose && let Some(m) = m {
            for t in &m.tasks {
                for s in &t.splits {
                    let cursor = hex::decode(&s.cursor).unwrap_or_default();
                    let pos = match <[u8; 8]>::try_from(cursor.as_slice()) {
                        Ok(b) => u64::from_le_bytes(b).to_string(),
                        Err(_) if cursor.is_empty() => "start".into(),
                        Err(_) => s.cursor.clone(),
                    };
                    println!(
                        "          source {} split {} offset {}{}",
                        t.task,
                        s.split_id,
                        pos,
                        if s.finished { " (finished)" } else { "" }
                    );
                }
                for p in &t.pending_transactions {
                    println!(
                        "          sink {} txn {} (epoch {})",
                        t.task, p.txn, p.epoch
                    );
                }
            }
        }
    }
    Ok(())
}
