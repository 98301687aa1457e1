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
        }
    }
    Ok(())
}
