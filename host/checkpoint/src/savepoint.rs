//! Savepoints as directories (design §10.4): one epoch's manifest and exactly the segments
//! it references, laid out as a checkpoint namespace (`manifests/`, `segments/`), plus
//! `savepoint.json`. Self-contained and relocatable; retention of the job's checkpoints
//! never touches it.

use crate::manifest::EpochManifest;
use crate::storage::{CheckpointStorage, LocalStorage, StorageError};
use nop_stream_api::EpochId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// `format` of `savepoint.json`.
pub const SAVEPOINT_FORMAT: &str = "nopstream.savepoint/v1";

/// `savepoint.json`: what a savepoint directory is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointInfo {
    /// [`SAVEPOINT_FORMAT`].
    pub format: String,
    /// Job id.
    pub job: String,
    /// Checkpoint namespace it was taken from.
    pub namespace: String,
    /// Its epoch.
    pub epoch: u64,
    /// When it was made, ms since the Unix epoch.
    pub created_ms: u64,
    /// Where it was copied from.
    pub source: String,
    /// Whether the epoch was the job's final one (a finished job).
    pub final_epoch: bool,
    /// Where it now is.
    #[serde(default)]
    pub dir: String,
    /// The savepoint it was migrated from (`nopstream savepoint migrate`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The actions the migration applied, as written (empty: not migrated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> StorageError {
    StorageError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// The default directory of a savepoint of `epoch` under `root`: `epoch-N`, or
/// `epoch-N-2`, `epoch-N-3`, ... when taken (a fresh run numbers its epochs from 1 again,
/// and savepoints are never overwritten).
pub fn default_dir(root: &Path, epoch: u64) -> std::path::PathBuf {
    let first = root.join(format!("epoch-{epoch}"));
    if !first.exists() {
        return first;
    }
    (2u32..)
        .map(|n| root.join(format!("epoch-{epoch}-{n}")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

/// Copies the manifest of `epoch` of `from` (described as `source`) and every byte range of
/// segment file it references into a new savepoint directory `out`, which must not exist.
/// The copy is written under a temporary name next to `out` and renamed into place, so an
/// interrupted export leaves no directory that could be taken for a savepoint.
///
/// # Errors
/// `out` exists; the manifest or a segment cannot be read; I/O failures.
pub fn export(
    from: &dyn CheckpointStorage,
    source: &str,
    epoch: EpochId,
    out: &Path,
) -> Result<SavepointInfo, StorageError> {
    if out.exists() {
        return Err(exists(out));
    }
    let m = from.read_manifest(epoch)?;
    let info = SavepointInfo {
        format: SAVEPOINT_FORMAT.into(),
        job: m.job_id.clone(),
        namespace: m.namespace.clone(),
        epoch: m.epoch.0,
        created_ms: now_ms(),
        source: source.to_owned(),
        final_epoch: m.final_epoch,
        dir: out.display().to_string(),
        parent: None,
        actions: Vec::new(),
    };
    write(from, &m, &[], info, out)
}

fn exists(out: &Path) -> StorageError {
    io(
        out,
        "exists; savepoints are never overwritten, name another directory (--out DIR)",
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes a migrated savepoint to `out` (which must not exist): the manifest `m`, the
/// segment files `new_files` (path relative to the savepoint, bytes), and every other
/// segment file `m` references, copied from `from` (the parent savepoint) up to the end of
/// its last referenced range. Like [`export`], it writes under a temporary name and renames
/// into place, so an interrupted migration leaves the parent untouched and no directory
/// that could be taken for a savepoint.
///
/// # Errors
/// `out` exists; a segment cannot be read; I/O failures.
pub fn write_migrated(
    from: &dyn CheckpointStorage,
    m: &EpochManifest,
    new_files: &[(String, Vec<u8>)],
    parent: &Path,
    actions: Vec<String>,
    out: &Path,
) -> Result<SavepointInfo, StorageError> {
    if out.exists() {
        return Err(exists(out));
    }
    let info = SavepointInfo {
        format: SAVEPOINT_FORMAT.into(),
        job: m.job_id.clone(),
        namespace: m.namespace.clone(),
        epoch: m.epoch.0,
        created_ms: now_ms(),
        source: parent.display().to_string(),
        final_epoch: m.final_epoch,
        dir: out.display().to_string(),
        parent: Some(parent.display().to_string()),
        actions,
    };
    write(from, m, new_files, info, out)
}

fn write(
    from: &dyn CheckpointStorage,
    m: &EpochManifest,
    new_files: &[(String, Vec<u8>)],
    info: SavepointInfo,
    out: &Path,
) -> Result<SavepointInfo, StorageError> {
    let parent = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let tmp = parent.join(format!(
        ".{}.partial-{}",
        out.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("savepoint"),
        std::process::id()
    ));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    let dst = LocalStorage::open(&tmp)?;
    // Each packed segment file, up to the end of its last referenced range.
    let mut files: BTreeMap<&str, u64> = BTreeMap::new();
    for s in m
        .tasks
        .iter()
        .flat_map(|t| t.segments.iter().chain(&t.operator_state))
    {
        let end = files.entry(s.file.as_str()).or_default();
        *end = (*end).max(s.offset + s.len);
    }
    // Crash tests abort at each step (`savepoint-write=N`, failpoint module).
    let step = || {
        if crate::failpoint::hit("savepoint-write") {
            return Err(io(&tmp, "failpoint savepoint-write"));
        }
        Ok(())
    };
    for (file, bytes) in new_files {
        files.remove(file.as_str());
        step()?;
        dst.write_segment(file, bytes)?;
    }
    for (file, len) in files {
        step()?;
        dst.write_segment(file, &from.read_range(file, 0, len)?)?;
    }
    step()?;
    dst.publish_manifest(m)?;
    let json = serde_json::to_vec_pretty(&info).map_err(|e| io(&tmp, e))?;
    step()?;
    std::fs::write(tmp.join("savepoint.json"), json).map_err(|e| io(&tmp, e))?;
    step()?;
    std::fs::rename(&tmp, out).map_err(|e| io(out, e))?;
    Ok(info)
}
