//! Output directory handling, the run summary and the echo of committed output.

use anyhow::{Result, bail};
use nop_stream_runtime::JobReport;
use std::path::{Path, PathBuf};

/// Marker file that makes a directory a nopstream output directory.
const MARKER: &str = ".nopstream-output";

/// Prepares `dir` for a fresh run: creates it, or empties it if it holds a previous run's
/// output (it has the marker). A non-empty directory without the marker is refused, so a
/// typo never wipes user files.
///
/// # Errors
/// A foreign non-empty directory or an I/O failure.
pub fn claim_output_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let entries: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        if !entries.is_empty() {
            if !dir.join(MARKER).exists() {
                bail!(
                    "output directory {} is not empty and was not created by nopstream; choose another with --output",
                    dir.display()
                );
            }
            for e in entries {
                if e.is_dir() {
                    std::fs::remove_dir_all(&e)?;
                } else {
                    std::fs::remove_file(&e)?;
                }
            }
        }
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(MARKER), b"nopstream output directory\n")?;
    Ok(())
}

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Prints the end-of-run summary.
pub fn print_summary(report: &JobReport, output: &Path) {
    let secs = report.wall.as_secs_f64().max(1e-9);
    println!(
        "job `{}` finished: semantic mode {}, attempt {}",
        report.job_id, report.semantic, report.attempt
    );
    println!(
        "  records read     {} in {:.2} s ({} records/s)",
        thousands(report.records_read),
        secs,
        thousands((report.records_read as f64 / secs) as u64)
    );
    println!("  records written  {}", thousands(report.records_written));
    println!("  transactions     {} committed", report.committed.len());
    println!("  output           {}", output.display());
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
