//! Restoring a job from a savepoint (design §10.4–§10.6, §8a), written once for the
//! embedded mode and the cluster: open the savepoint at its location, verify every segment
//! its manifest references, run the compatibility check ([`crate::compat::check`]) against
//! the job's plan, and publish the savepoint's epoch into the job's checkpoint namespace
//! with the actions applied ([`crate::migrate::apply`]).
//!
//! A restore never destroys what it would replace: the savepoint is verified before the
//! namespace is touched, and the restored epoch is published beside the namespace's own
//! epochs (its segments under a prefix of their own, its epoch record created last), so a
//! failure at any step leaves the namespace as it was. Only `--fresh` discards the
//! namespace's checkpoints, and only once the savepoint has passed its verification.
//!
//! Plugins stay outside: the caller passes each operator's component sha256 and, for
//! `migrate-state`, a [`MigrateFn`] that runs the new component's `migrate` export.
//! `finalize-sink` (committing the old sink's pending committables with the old plugin)
//! and `fork` (another pipeline lineage) are the caller's steps before seeding.

use crate::compat::{CheckContext, Code, Finding, Report, Status, check, snapshot_meta};
use crate::migrate::{MigrateFn, Migrated};
use nop_stream_checkpoint::{
    EpochManifest, Location, Namespace, ObjectStore, SAVEPOINT_FORMAT, SavepointInfo, names,
    savepoint,
};
use nop_stream_core::PartitionedPlan;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::compat::{Action, Actions};

/// A savepoint, opened.
#[derive(Debug, Clone)]
pub struct Savepoint {
    /// Where it is.
    pub location: Location,
    /// Its objects.
    pub ns: Arc<Namespace>,
    /// `savepoint.json`.
    pub info: SavepointInfo,
    /// Its manifest.
    pub manifest: EpochManifest,
}

/// Opens the savepoint at `location` and reads its manifest.
///
/// # Errors
/// Not a savepoint, an unknown format, or a manifest that fails its checksum; the message
/// names the location.
pub fn open(location: &Location) -> Result<Savepoint, String> {
    // Opening a local location creates its directory: a mistyped path must not leave one.
    if let Location::Local(dir) = location
        && !dir.exists()
    {
        return Err(format!("savepoint {}: no such directory", dir.display()));
    }
    let store = location.open().map_err(|e| e.to_string())?;
    let info = savepoint::read_info(&store).map_err(|e| e.to_string())?;
    if info.format != SAVEPOINT_FORMAT {
        return Err(format!(
            "{location}: savepoint format `{}` is not `{SAVEPOINT_FORMAT}`, the one this host \
             reads",
            info.format
        ));
    }
    let ns = Namespace::new(store);
    let manifest = ns
        .latest_manifest()
        .map_err(|e| format!("savepoint {location}: {e}"))?
        .ok_or_else(|| format!("savepoint {location}: no durable epoch in it"))?;
    if manifest.epoch.0 != info.epoch {
        return Err(format!(
            "savepoint {location}: savepoint.json names epoch {}, its manifest is of epoch {}",
            info.epoch, manifest.epoch
        ));
    }
    Ok(Savepoint {
        location: location.clone(),
        ns: Arc::new(ns),
        info,
        manifest,
    })
}

/// Verifies every segment the savepoint's manifest references: existence, size and
/// checksum.
///
/// # Errors
/// The first damage, naming the savepoint and the file.
pub fn verify(sp: &Savepoint) -> Result<(), String> {
    sp.ns
        .verify_segments(&sp.manifest)
        .map_err(|e| format!("savepoint {} is damaged: {e}", sp.location))
}

/// The latest epoch of the checkpoint namespace `ns` (durable, or created by an attempt
/// and logged), if it has one.
///
/// # Errors
/// The namespace cannot be read.
pub fn latest_epoch(ns: &Namespace) -> Result<Option<u64>, String> {
    Ok(ns
        .manifest_epochs()
        .map_err(|e| e.to_string())?
        .last()
        .map(|e| e.0))
}

/// Checks `sp` against `plan`, whose operators run the components `components` (sha256 by
/// operator id), and `actions`; `namespace` is the job's own checkpoint namespace, to see
/// whether it has advanced past the savepoint (`NAMESPACE_ADVANCED`), or `None` when the
/// restore discards it whatever it holds (`--fresh`). A damaged savepoint (a segment
/// missing, short or failing its checksum) is a `SAVEPOINT_DAMAGED` finding, incompatible.
///
/// # Errors
/// A savepoint without compatibility metadata; actions that clear nothing or are not
/// supported; an unreadable namespace.
pub fn check_against(
    sp: &Savepoint,
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
    namespace: Option<&Namespace>,
    actions: &Actions,
) -> Result<Report, String> {
    let Some(old) = &sp.manifest.meta else {
        return Err(format!(
            "savepoint {} (epoch {}) records no compatibility metadata: it was written by an \
             older host and can only be resumed by the same job",
            sp.location, sp.info.epoch
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
    let mut report = check(old, &new, &ctx, actions).map_err(|e| e.to_string())?;
    if let Err(damage) = verify(sp) {
        report.job.push(Finding {
            code: Code::SavepointDamaged,
            status: Status::Incompatible,
            state: None,
            old: damage,
            new: "a savepoint whose every segment is whole".into(),
            remedies: Vec::new(),
            cleared_by: None,
        });
        report.verdict = Status::Incompatible;
    }
    Ok(report)
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
    let mut read = |s: &nop_stream_checkpoint::SegmentDescriptor| {
        sp.ns
            .read_range(&s.file, s.offset, s.len)
            .map_err(|e| e.to_string())
    };
    crate::migrate::apply(&sp.manifest, actions, &meta, &mut read, migrate)
        .map_err(|e| format!("savepoint {}: {e}", sp.location))
}

/// Whether two manifests restore the same state: equal but for their compatibility
/// metadata (which the actions' application rewrites for the new job) and checksums.
fn same_state(a: &EpochManifest, b: &EpochManifest) -> bool {
    let strip = |m: &EpochManifest| {
        let mut m = m.clone();
        m.meta = None;
        m.checksum = String::new();
        m.durable_ms = 0;
        m
    };
    strip(a) == strip(b)
}

/// Publishes the savepoint's epoch into the checkpoint namespace `ns` with the actions
/// applied for `plan` ([`apply_actions`]: renamed operators and states carry their new
/// names, dropped states lose their segments, a reshard or a migrate-state rewrites the
/// segments). With `fresh` the namespace's checkpoints are discarded first (after the
/// savepoint verified). Returns the plan fingerprint the manifest carries, which the
/// restore accepts as an explicit action ([`crate::CoordinatorOptions::rescale_from`]).
/// The savepoint is never written to.
///
/// The restored epoch keeps the savepoint's number when the namespace has nothing at or
/// after it; otherwise it goes after everything the namespace holds, so no epoch number
/// (and no sink transaction id) repeats. Its segment files are copied under a prefix of
/// their own ([`names::restored_segment_file`]); its epoch record is created last, so a
/// failure before leaves the namespace's latest epoch as it was.
///
/// # Errors
/// A damaged savepoint; a failed migration; storage failures.
pub fn seed_namespace(
    sp: &Savepoint,
    ns: &Namespace,
    fresh: bool,
    actions: &Actions,
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
    migrate: &mut MigrateFn<'_>,
) -> Result<String, String> {
    verify(sp)?;
    let migrated = apply_actions(sp, actions, plan, components, migrate)?;
    let err = |e: nop_stream_checkpoint::StorageError| e.to_string();
    if fresh {
        ns.delete_all().map_err(err)?;
    }
    let mut m = migrated.manifest.clone();
    let durable = ns.durable().map_err(err)?;
    if let Some(name) = durable.manifests.get(&m.epoch.0)
        && let Ok(have) = ns.store().get(name)
        && let Ok(have) = serde_json::from_slice::<EpochManifest>(&have)
        && same_state(&have, &m)
    {
        // The namespace holds this very epoch already (a savepoint of its own, no action
        // changing its state; the compatibility metadata aside): nothing to publish.
        return Ok(have.plan_fingerprint);
    }
    let highest = ns
        .read_log()
        .map_err(err)?
        .iter()
        .map(|r| r.epoch.0)
        .chain(durable.manifests.keys().copied())
        .chain(durable.aborted.iter().copied())
        .max();
    let epoch = match highest {
        Some(h) if h >= m.epoch.0 => h + 1,
        _ => m.epoch.0,
    };
    let restore = format!("sp{}-{}", sp.info.epoch, sp.info.created_ms);
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    for f in migrated.kept_files() {
        let to = names::restored_segment_file(epoch, &restore, &f);
        let bytes = sp
            .ns
            .store()
            .get(&f)
            .map_err(|e| format!("savepoint {}: copying segment {f}: {e}", sp.location))?;
        ns.write_segment(&to, &bytes).map_err(err)?;
        renamed.insert(f, to);
    }
    for (f, bytes) in &migrated.new_files {
        let to = names::restored_segment_file(epoch, &restore, f);
        ns.write_segment(&to, bytes).map_err(err)?;
        renamed.insert(f.clone(), to);
    }
    for t in &mut m.tasks {
        for s in t.segments.iter_mut().chain(t.operator_state.iter_mut()) {
            if let Some(to) = renamed.get(&s.file) {
                s.file.clone_from(to);
            }
        }
    }
    m.epoch = nop_stream_api::EpochId(epoch);
    for t in &mut m.tasks {
        t.epoch = m.epoch;
    }
    m.seal();
    ns.publish_manifest(&m).map_err(err)?;
    Ok(m.plan_fingerprint)
}
