//! Savepoints as prefixes of objects (design §8a, §6): one epoch's manifest and exactly
//! the segments it references, laid out as a checkpoint namespace (`epochs/`,
//! `manifests/`, `segments/`), plus `savepoint.json`, written last. Self-contained and
//! relocatable: relocating one is a copy of its prefix
//! ([`nop_stream_storage::copy_prefix`]); retention of the job's checkpoints never touches
//! it. A prefix without `savepoint.json` is no savepoint (an interrupted export).

use crate::manifest::EpochManifest;
use crate::names;
use crate::namespace::{Namespace, StorageError};
use nop_stream_api::EpochId;
use nop_stream_storage::{ErrorKind, Location, LocationError, ObjectStore, Scoped, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `format` of `savepoint.json`.
pub const SAVEPOINT_FORMAT: &str = "nopstream.savepoint/v1";

/// `savepoint.json`: what a savepoint is.
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
    /// Where it now is (its location as written; a relocated copy still names the place
    /// it was written to).
    #[serde(default)]
    pub dir: String,
    /// The savepoint it was migrated from (`nopstream savepoint migrate`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The actions the migration applied, as written (empty: not migrated).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
}

/// The location a savepoint named `given` has: `given` itself if it is a URL
/// (`scheme://...`) or an absolute path, else `given` inside `root` (the job's savepoint
/// root).
///
/// # Errors
/// A URL that does not parse.
pub fn resolve(root: &Location, given: &str) -> Result<Location, LocationError> {
    if given.contains("://") || std::path::Path::new(given).is_absolute() {
        Location::parse(given)
    } else {
        Ok(root.join(given))
    }
}

/// Whether `at` holds a savepoint (its `savepoint.json`).
///
/// # Errors
/// Storage failures.
pub fn exists(at: &Scoped) -> Result<bool, StorageError> {
    match at.get(names::SAVEPOINT_INFO) {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Reads `savepoint.json` at `at`.
///
/// # Errors
/// Not a savepoint (the message says so and names the location); storage failures; a
/// `savepoint.json` that does not decode.
pub fn read_info(at: &Scoped) -> Result<SavepointInfo, StorageError> {
    let bytes = at.get(names::SAVEPOINT_INFO).map_err(|e| {
        if e.is_not_found() {
            StorageError::Store(StoreError::new(
                at.describe(),
                None,
                ErrorKind::NotFound,
                "is not a savepoint (no savepoint.json)",
            ))
        } else {
            e.into()
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt {
        location: at.describe(),
        object: names::SAVEPOINT_INFO.into(),
        message: e.to_string(),
    })
}

/// The first free savepoint name for `epoch` under `root`: `epoch-N`, or `epoch-N-2`,
/// `epoch-N-3`, ... when taken (a fresh run numbers its epochs from 1 again, and savepoints
/// are never overwritten).
///
/// # Errors
/// Storage failures.
pub fn default_name(root: &Scoped, epoch: u64) -> Result<String, StorageError> {
    let taken = |name: &str| -> Result<bool, StorageError> {
        Ok(!root.list(&format!("{name}/"))?.is_empty())
    };
    let first = format!("epoch-{epoch}");
    if !taken(&first)? {
        return Ok(first);
    }
    for n in 2u32.. {
        let name = format!("epoch-{epoch}-{n}");
        if !taken(&name)? {
            return Ok(name);
        }
    }
    unreachable!("some name is free")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Copies the manifest of `epoch` of `from` (described as `source`) and every byte range
/// of segment file it references into a new savepoint at `out`, which must hold no
/// savepoint. `savepoint.json` is written last, so an interrupted export leaves nothing
/// that could be taken for a savepoint (and the next export to `out` replaces its remains).
///
/// # Errors
/// `out` holds a savepoint or foreign objects; the manifest or a segment cannot be read;
/// storage failures.
pub fn export(
    from: &Namespace,
    source: &str,
    epoch: EpochId,
    out: &Scoped,
) -> Result<SavepointInfo, StorageError> {
    let m = from.read_manifest(epoch)?;
    let info = SavepointInfo {
        format: SAVEPOINT_FORMAT.into(),
        job: m.job_id.clone(),
        namespace: m.namespace.clone(),
        epoch: m.epoch.0,
        created_ms: now_ms(),
        source: source.to_owned(),
        final_epoch: m.final_epoch,
        dir: out.describe(),
        parent: None,
        actions: Vec::new(),
    };
    write(from, &m, &[], info, out)
}

/// Writes a migrated savepoint to `out` (which must hold no savepoint): the manifest `m`,
/// the segment files `new_files` (name relative to the savepoint, bytes), and every other
/// segment file `m` references, copied from `from` (the parent savepoint) up to the end of
/// its last referenced range. Like [`export`], `savepoint.json` comes last: an interrupted
/// migration leaves the parent untouched and no savepoint at `out`.
///
/// # Errors
/// `out` holds a savepoint or foreign objects; a segment cannot be read; storage failures.
pub fn write_migrated(
    from: &Namespace,
    m: &EpochManifest,
    new_files: &[(String, Vec<u8>)],
    parent: &str,
    actions: Vec<String>,
    out: &Scoped,
) -> Result<SavepointInfo, StorageError> {
    let info = SavepointInfo {
        format: SAVEPOINT_FORMAT.into(),
        job: m.job_id.clone(),
        namespace: m.namespace.clone(),
        epoch: m.epoch.0,
        created_ms: now_ms(),
        source: parent.to_owned(),
        final_epoch: m.final_epoch,
        dir: out.describe(),
        parent: Some(parent.to_owned()),
        actions,
    };
    write(from, m, new_files, info, out)
}

/// Makes `out` ready for a new savepoint: refuses a savepoint or foreign objects there, and
/// deletes the remains of an interrupted export (objects of the namespace layout without
/// `savepoint.json`).
fn claim(out: &Scoped) -> Result<(), StorageError> {
    if exists(out)? {
        return Err(StorageError::Store(StoreError::new(
            out.describe(),
            None,
            ErrorKind::Invalid,
            "holds a savepoint already; savepoints are never overwritten, name another \
             (--out)",
        )));
    }
    let objects = out.list("")?;
    let ours = |n: &str| {
        [names::EPOCHS, names::MANIFESTS, names::SEGMENTS]
            .iter()
            .any(|p| n.starts_with(p))
    };
    if let Some(foreign) = objects.iter().find(|o| !ours(&o.name)) {
        return Err(StorageError::Store(StoreError::new(
            out.describe(),
            Some(&foreign.name),
            ErrorKind::Invalid,
            "is not empty and holds no savepoint; name another location (--out)",
        )));
    }
    for o in objects {
        out.delete(&o.name)?;
    }
    Ok(())
}

fn write(
    from: &Namespace,
    m: &EpochManifest,
    new_files: &[(String, Vec<u8>)],
    info: SavepointInfo,
    out: &Scoped,
) -> Result<SavepointInfo, StorageError> {
    claim(out)?;
    let dst = Namespace::new(out.clone());
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
            return Err(StorageError::Store(StoreError::new(
                out.describe(),
                None,
                ErrorKind::Other,
                "failpoint savepoint-write",
            )));
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
    let candidate = dst.write_candidate(m)?;
    step()?;
    dst.make_durable(m, &candidate)?;
    let json = serde_json::to_vec_pretty(&info).map_err(|e| StorageError::Corrupt {
        location: out.describe(),
        object: names::SAVEPOINT_INFO.into(),
        message: e.to_string(),
    })?;
    step()?;
    out.put(names::SAVEPOINT_INFO, &json)?;
    Ok(info)
}
