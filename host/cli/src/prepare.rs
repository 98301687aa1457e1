//! Host-side preparation steps of a job file (`[[prepare]]`), run before planning.

use anyhow::{Context, Result};
use nop_stream_core::{PrepareStep, StreamModel};
use std::path::Path;

/// Runs every step; a step whose result already exists is skipped.
///
/// # Errors
/// A missing archive or member, or an I/O failure, naming the file.
pub fn run_steps(model: &StreamModel, job_dir: &Path) -> Result<()> {
    for step in &model.prepare {
        match step {
            PrepareStep::Unzip {
                archive,
                member,
                into,
            } => {
                let into = job_dir.join(into);
                let target = into.join(member);
                if target.exists() {
                    continue;
                }
                let archive = job_dir.join(archive);
                let file = std::fs::File::open(&archive).with_context(|| {
                    format!("prepare: cannot open archive {}", archive.display())
                })?;
                let mut zip = zip::ZipArchive::new(file).with_context(|| {
                    format!("prepare: {} is not a zip archive", archive.display())
                })?;
                let mut entry = zip.by_name(member).with_context(|| {
                    format!("prepare: {} has no member `{member}`", archive.display())
                })?;
                std::fs::create_dir_all(&into)
                    .with_context(|| format!("prepare: cannot create {}", into.display()))?;
                let tmp = target.with_extension(format!("partial.{}", std::process::id()));
                let mut out = std::fs::File::create(&tmp)
                    .with_context(|| format!("prepare: cannot create {}", tmp.display()))?;
                std::io::copy(&mut entry, &mut out).with_context(|| {
                    format!(
                        "prepare: cannot extract `{member}` from {}",
                        archive.display()
                    )
                })?;
                out.sync_all()?;
                std::fs::rename(&tmp, &target)?;
                eprintln!("prepared {} from {}", target.display(), archive.display());
            }
            PrepareStep::Sort { file, by, into } => {
                let input = job_dir.join(file);
                let output = job_dir.join(into);
                if is_up_to_date(&output, &input) {
                    continue;
                }
                sort_csv(&input, by, &output)?;
                eprintln!(
                    "prepared {} from {} (sorted by {})",
                    output.display(),
                    input.display(),
                    by.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// Whether `output` exists and is not older than `input`.
fn is_up_to_date(output: &Path, input: &Path) -> bool {
    let (Ok(o), Ok(i)) = (std::fs::metadata(output), std::fs::metadata(input)) else {
        return false;
    };
    matches!((o.modified(), i.modified()), (Ok(o), Ok(i)) if o >= i)
}

/// One sort-key value: numbers order numerically and before text.
#[derive(Debug, Clone, PartialEq, PartialOrd)]
enum SortValue {
    Number(f64),
    Text(Vec<u8>),
}

fn sort_value(raw: &[u8]) -> SortValue {
    match std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
    {
        Some(n) if n.is_finite() => SortValue::Number(n),
        _ => SortValue::Text(raw.to_vec()),
    }
}

/// Sorts the CSV `input` (header line first) by the columns `by`, stably, into `output`
/// (written to a temporary file, fsynced and renamed). Lines are kept byte for byte.
///
/// # Errors
/// An unreadable input, a column not in the header (naming it and the header), or an
/// I/O failure writing the output.
pub fn sort_csv(input: &Path, by: &[String], output: &Path) -> Result<()> {
    use std::io::Write;
    let data = std::fs::read(input)
        .with_context(|| format!("prepare: cannot read {}", input.display()))?;
    let mut lines = data.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    let header = lines
        .next()
        .with_context(|| format!("prepare: {} is empty (no header line)", input.display()))?;
    let names: Vec<&[u8]> = header
        .strip_suffix(b"\r")
        .unwrap_or(header)
        .split(|&b| b == b',')
        .collect();
    let mut cols = Vec::with_capacity(by.len());
    for c in by {
        let Some(i) = names.iter().position(|n| *n == c.as_bytes()) else {
            anyhow::bail!(
                "prepare: sort: column `{c}` is not in the header of {} ({})",
                input.display(),
                String::from_utf8_lossy(header)
            );
        };
        cols.push(i);
    }
    let mut rows: Vec<(Vec<SortValue>, &[u8])> = lines
        .map(|l| {
            let fields: Vec<&[u8]> = l.split(|&b| b == b',').collect();
            let key = cols
                .iter()
                .map(|&i| sort_value(fields.get(i).copied().unwrap_or_default()))
                .collect();
            (key, l)
        })
        .collect();
    rows.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("prepare: cannot create {}", dir.display()))?;
    }
    let tmp = output.with_extension(format!("partial.{}", std::process::id()));
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&tmp)
            .with_context(|| format!("prepare: cannot create {}", tmp.display()))?,
    );
    out.write_all(header)?;
    out.write_all(b"\n")?;
    for (_, l) in &rows {
        out.write_all(l)?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, output)
        .with_context(|| format!("prepare: cannot write {}", output.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_csv_orders_numerically_then_textually_and_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.csv");
        std::fs::write(
            &input,
            "id,t,m\na,2013-01-02,5\nb,2013-01-01,10\nc,2013-01-01,9\nd,2013-01-01,10\n",
        )
        .unwrap();
        let output = dir.path().join("out.csv");
        sort_csv(&input, &["t".into(), "m".into()], &output).unwrap();
        let got = std::fs::read_to_string(&output).unwrap();
        // m sorts numerically (9 < 10); b and d tie and keep file order.
        assert_eq!(
            got,
            "id,t,m\nc,2013-01-01,9\nb,2013-01-01,10\nd,2013-01-01,10\na,2013-01-02,5\n"
        );
        let err = sort_csv(&input, &["nope".into()], &output).unwrap_err();
        assert!(err.to_string().contains("column `nope`"), "{err}");
    }
}
