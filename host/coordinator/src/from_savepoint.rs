//! Restoring a job from a savepoint (design §10.4–§10.6), written once for the embedded
//! mode (`nopstream run --from-savepoint`) and the cluster (`nopstream job submit
//! --from-savepoint`): open and verify the savepoint directory, run the compatibility
//! check ([`crate::compat::check`]) against the job's plan, and seed the job's checkpoint
//! namespace with the savepoint's epoch, the actions applied ([`crate::migrate::apply`]).
//!
//! Plugins stay outside: the caller passes each operator's component sha256 and, for
//! `migrate-state`, a [`MigrateFn`] that runs the new component's `migrate` export.
//! `finalize-sink` (committing the old sink's pending committables with the old plugin)
//! and `fork` (another pipeline lineage) are the caller's steps before seeding.

use crate::compat::{CheckContext, Report, check, snapshot_meta};
use crate::migrate::{MigrateFn, Migrated};
use nop_stream_api::EpochId;
use nop_stream_checkpoint::{
    CheckpointStorage, EpochManifest, LocalStorage, SAVEPOINT_FORMAT, SavepointInfo,
};
use nop_stream_core::PartitionedPlan;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::compat::{Action, Actions};

/// A savepoint directory, opened.
#[derive(Debug, Clone)]
pub struct Savepoint {
    /// Where it is.
    pub dir: PathBuf,
    /// `savepoint.json`.
    pub info: SavepointInfo,
    /// Its manifest.
    pub manifest: EpochManifest,
}

/// Opens and verifies the savepoint in `dir`.
///
/// # Errors
/// Not a savepoint, an unknown format, or a manifest that fails its checksum; the message
/// names the directory.
pub fn open(dir: &Path) -> Result<Savepoint, String> {
    let info_path = dir.join("savepoint.json");
    let bytes = std::fs::read(&info_path).map_err(|e| {
        format!(
            "{} is not a savepoint (no savepoint.json): {e}",
            dir.display()
        )
    })?;
    let info: SavepointInfo =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", info_path.display()))?;
    if info.format != SAVEPOINT_FORMAT {
        return Err(format!(
            "{}: savepoint format `{}` is not `{SAVEPOINT_FORMAT}`, the one this host reads",
            info_path.display(),
            info.format
        ));
    }
    let storage = LocalStorage::open(dir).map_err(|e| e.to_string())?;
    let manifest = storage
        .read_manifest(EpochId(info.epoch))
        .map_err(|e| format!("savepoint {}: {e}", dir.display()))?;
    Ok(Savepoint {
        dir: dir.to_owned(),
        info,
        manifest,
    })
}

/// The latest durable epoch of the checkpoint namespace in `namespace`, if it has one.
///
/// # Errors
/// The namespace cannot be read.
pub fn latest_epoch(namespace: &Path) -> Result<Option<u64>, String> {
    if !namespace.join("manifests").is_dir() {
        return Ok(None);
    }
    let storage = LocalStorage::open(namespace).map_err(|e| e.to_string())?;
    Ok(storage
        .manifest_epochs()
        .map_err(|e| e.to_string())?
        .last()
        .map(|e| e.0))
}

/// Checks `sp` against `plan`, whose operators run the components `components` (sha256 by
/// operator id), and `actions`; `namespace` is the directory of the job's own checkpoint
/// namespace, to see whether it has advanced past the savepoint (`NAMESPACE_ADVANCED`),
/// or `None` when the restore empties it whatever it holds (`--fresh`).
///
/// # Errors
/// A savepoint without compatibility metadata; actions that clear nothing or are not
/// supported; an unreadable namespace.
pub fn check_against(
    sp: &Savepoint,
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
    namespace: Option<&Path>,
    actions: &Actions,
) -> Result<Report, String> {
    let Some(old) = &sp.manifest.meta else {
        return Err(format!(
            "savepoint {} (epoch {}) records no compatibility metadata: it was written by an \
             older host and can only be resumed by the same job",
            sp.dir.display(),
            sp.info.epoch
        ));
    };
    let new = snapshot_meta(plan, components);
    let mut pending: BTreeMap<String, usize> = BTreeMap::new();
    for t in &sp.manifest.tasks {
        if let Some(s) = &t.sink_operator {
            *pending.entry(s.clone()).or_default() += t.pending_transactions.len();
        }
    }
    let ctx = CheckContext {
        pending_committables: pending,
        namespace_epochs: match namespace {
            Some(ns) => latest_epoch(ns)?.map(|l| (l, sp.info.epoch)),
            None => None,
        },
    };
    check(old, &new, &ctx, actions).map_err(|e| e.to_string())
}

/// The savepoint's manifest with `actions` applied for `plan` (whose operators run
/// `components`), and the segment files that wrote; `migrate` runs the new components'
/// `state-migration` exports for `migrate-state`.
///
/// # Errors
/// A segment that cannot be read or fails its checksum; a failed migration.
pub fn apply_actions(
    sp: &Savepoint,
    actions: &Actions,
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
    migrate: &mut MigrateFn<'_>,
) -> Result<Migrated, String> {
    let meta = snapshot_meta(plan, components);
    let src = LocalStorage::open(&sp.dir).map_err(|e| e.to_string())?;
    let mut read = |s: &nop_stream_checkpoint::SegmentDescriptor| {
        src.read_range(&s.file, s.offset, s.len)
            .map_err(|e| e.to_string())
    };
    crate::migrate::apply(&sp.manifest, actions, &meta, &mut read, migrate)
        .map_err(|e| format!("savepoint {}: {e}", sp.dir.display()))
}

/// Seeds the checkpoint namespace `namespace` (emptied first) with the savepoint's epoch:
/// its manifest and segments with the actions applied for `plan` ([`apply_actions`]:
/// renamed operators and states carry their new names, dropped states lose their
/// segments, a reshard or a migrate-state rewrites the segments). Returns the plan
/// fingerprint the manifest carries, which the restore accepts as an explicit action
/// ([`crate::CoordinatorOptions::rescale_from`]). The savepoint is never written to.
///
/// # Errors
/// A segment that cannot be read or fails its checksum; a failed migration; I/O failures.
pub fn seed_namespace(
    sp: &Savepoint,
    namespace: &Path,
    actions: &Actions,
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
    migrate: &mut MigrateFn<'_>,
) -> Result<String, String> {
    let migrated = apply_actions(sp, actions, plan, components, migrate)?;
    if namespace.exists() {
        std::fs::remove_dir_all(namespace).map_err(|e| format!("{}: {e}", namespace.display()))?;
    }
    let dst = LocalStorage::open(namespace).map_err(|e| e.to_string())?;
    for f in migrated.kept_files() {
        let from = sp.dir.join(&f);
        let bytes =
            std::fs::read(&from).map_err(|e| format!("copying segment {}: {e}", from.display()))?;
        dst.write_segment(&f, &bytes).map_err(|e| e.to_string())?;
    }
    for (f, bytes) in &migrated.new_files {
        dst.write_segment(f, bytes).map_err(|e| e.to_string())?;
    }
    dst.publish_manifest(&migrated.manifest)
        .map_err(|e| e.to_string())?;
    Ok(migrated.manifest.plan_fingerprint)
}
