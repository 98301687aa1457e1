//! Savepoint migrations (design §10.6): the actions a compatibility
//! check accepted ([`crate::compat::check`]), applied to a savepoint's manifest and
//! segments. Pure: the caller reads the payloads it is asked for and writes what comes out.
//! `nopstream savepoint migrate` writes the result as a new savepoint (the old one is never
//! touched); `nopstream run --from-savepoint` seeds the job's checkpoint namespace with it.
//!
//! What each action does to the data:
//! - `rename-operator from->to`: segments, split registries, sink ids and task vertices of
//!   `from` carry `to`;
//! - `drop-state op[/state]`: the segments of that state (or of every state of `op`) go;
//! - `rename-state op/from->to`: the segments of `from` are `to`'s (the payload is
//!   unchanged: a state's values do not name it);
//! - `reshard S'`: every keyed state and timer entry moves to shard `shard_of(key, S')`.
//!   Keys are never rewritten.
//! - `migrate-state op/state`: the values of that state go through the new plugin's
//!   `nop:stream/state-migration` export ([`MigrateFn`]) in batches of
//!   [`MIGRATE_BATCH`] entries, in (shard, key) order, and its segments carry the new
//!   schema version. The first batch of each state is converted twice and must come out
//!   the same (a migration must be deterministic).
//! - `init-empty`, `accept-semantic-change`, `fork`: nothing in the data.
//!
//! An operator touched by a reshard or a migration is written again, per (state, shard) in
//! key byte order (the order a snapshot of the state backend has), into one packed file
//! ([`names::migrated_segment_file`]), so the same input gives byte-identical segments.
//! A rewritten segment belongs to the old subtask that would own its shard ([`owner_of`]),
//! which only matters for display: a restore takes segments by shard, from whichever task
//! holds them.

use crate::CoordinatorError;
use crate::compat::{Action, Actions};
use nop_stream_api::StateShardId;
use nop_stream_checkpoint::{EpochManifest, SegmentDescriptor, SnapshotMeta, names, payload};
use nop_stream_core::{owner_of, shard_of};
use std::collections::{BTreeMap, BTreeSet};

/// Entries per call of a plugin's `migrate` export.
pub const MIGRATE_BATCH: usize = 1024;

/// One stored entry of a state, as a plugin's `migrate` export sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// The entry's namespace (window, timer slot, ...; empty for plain keyed state).
    pub namespace: Vec<u8>,
    /// The record key.
    pub key: Vec<u8>,
    /// The value, as the old schema version wrote it.
    pub value: Vec<u8>,
}

/// Calls the new plugin's `migrate` export of operator `op` for `state` from schema
/// `from_version` on a batch: one new value per entry, in order, `None` deleting it. The
/// error names what failed (the plugin trapped, lacks the export, ...).
pub type MigrateFn<'a> =
    dyn FnMut(&str, &str, u32, &[StateEntry]) -> Result<Vec<Option<Vec<u8>>>, String> + 'a;

/// A [`MigrateFn`] for callers whose actions hold no `migrate-state`.
pub fn no_migration(
    op: &str,
    state: &str,
    _from: u32,
    _entries: &[StateEntry],
) -> Result<Vec<Option<Vec<u8>>>, String> {
    Err(format!(
        "no plugin is loaded to migrate state `{state}` of `{op}`"
    ))
}

/// The payload codec [`apply`] understands (length-prefixed `key, value` items, the key
/// being `namespace length (u32 BE) | namespace | record key`).
pub const KV_CODEC: &str = payload::KV_CODEC;

/// What [`apply`] produced.
#[derive(Debug, Clone)]
pub struct Migrated {
    /// The manifest with the actions applied, sealed.
    pub manifest: EpochManifest,
    /// Segment files written by the migration: (path relative to the namespace, bytes).
    pub new_files: Vec<(String, Vec<u8>)>,
}

impl Migrated {
    /// Segment files of the source that the migrated manifest still references (to copy
    /// as they are), in path order.
    pub fn kept_files(&self) -> Vec<String> {
        let new: BTreeSet<&str> = self.new_files.iter().map(|(f, _)| f.as_str()).collect();
        let kept: BTreeSet<String> = self
            .manifest
            .tasks
            .iter()
            .flat_map(|t| t.segments.iter().chain(&t.operator_state))
            .filter(|s| !new.contains(s.file.as_str()))
            .map(|s| s.file.clone())
            .collect();
        kept.into_iter().collect()
    }
}

/// Applies `actions` to the manifest `m` (see the module docs) for the job described by
/// `new`, which the result records as its compatibility metadata (a migrated savepoint
/// describes the job it was migrated for, so checking that job against it needs no
/// action). `read` returns the payload a descriptor points at (only operators that are
/// rewritten are read); `migrate` converts values for `migrate-state`.
///
/// # Errors
/// [`CoordinatorError::Restore`] naming the segment, state or plugin: a payload that cannot
/// be read, fails its checksum, has another codec or is truncated; a state whose segments
/// disagree on the schema version; a key stored twice; a reshard to 0 shards; a migrated
/// state the new job does not declare; a migration that fails, returns the wrong number of
/// values, or is not deterministic.
pub fn apply(
    m: &EpochManifest,
    actions: &Actions,
    new: &SnapshotMeta,
    read: &mut dyn FnMut(&SegmentDescriptor) -> Result<Vec<u8>, String>,
    migrate: &mut MigrateFn<'_>,
) -> Result<Migrated, CoordinatorError> {
    let refuse = |message: String| CoordinatorError::Restore {
        epoch: m.epoch.0,
        message,
    };
    let mut m = m.clone();
    let rename = |id: &str| -> String {
        actions
            .actions
            .iter()
            .find_map(|a| match a {
                Action::RenameOperator { from, to } if from == id => Some(to.clone()),
                _ => None,
            })
            .unwrap_or_else(|| id.to_owned())
    };
    let dropped = |s: &SegmentDescriptor| {
        actions.actions.iter().any(|a| match a {
            Action::DropState { operator, state } => {
                *operator == s.operator_id && state.as_ref().is_none_or(|st| *st == s.state)
            }
            _ => false,
        })
    };
    for t in &mut m.tasks {
        t.task.vertex = nop_stream_api::VertexId::new(rename(t.task.vertex.as_str()));
        t.segments.retain(|s| !dropped(s));
        t.operator_state.retain(|s| !dropped(s));
        for s in t.segments.iter_mut().chain(&mut t.operator_state) {
            s.operator_id = rename(&s.operator_id);
            let renamed_state = actions.actions.iter().find_map(|a| match a {
                Action::RenameState { operator, from, to }
                    if *operator == s.operator_id && *from == s.state =>
                {
                    Some(to.clone())
                }
                _ => None,
            });
            if let Some(to) = renamed_state {
                s.state_path = rename_last(&s.state_path, &to);
                s.state = to;
            }
        }
        if let Some(op) = &mut t.sink_operator {
            *op = rename(op);
        }
        // finalize-sink: the caller has committed these with the old plugin already.
        let finalized = t.sink_operator.as_ref().is_some_and(|op| {
            actions.actions.iter().any(
                |a| matches!(a, Action::FinalizeSink { operator, .. } if rename(operator) == *op),
            )
        });
        if finalized {
            t.pending_transactions.clear();
        }
    }
    for e in &mut m.enumerators {
        e.operator_id = rename(&e.operator_id);
    }

    let mut new_files = Vec::new();
    let reshard = actions.actions.iter().find_map(|a| match a {
        Action::Reshard { shards } => Some(*shards),
        _ => None,
    });
    if reshard == Some(0) {
        return Err(refuse(
            "reshard to 0 shards: a job needs at least one".into(),
        ));
    }
    // (operator, state) -> the new schema version.
    let mut migrations: BTreeMap<(String, String), u32> = BTreeMap::new();
    for a in &actions.actions {
        if let Action::MigrateState { operator, state } = a {
            let version = new
                .operators
                .iter()
                .find(|o| o.operator_id == *operator)
                .and_then(|o| o.states.iter().find(|s| s.name == *state))
                .map(|s| s.schema_version)
                .ok_or_else(|| {
                    refuse(format!(
                        "migrate-state {operator}/{state}: the new job declares no such state"
                    ))
                })?;
            migrations.insert((operator.clone(), state.clone()), version);
        }
    }
    let shards = reshard.unwrap_or(m.state_shard_count);
    let operators: Vec<String> = {
        let mut seen = BTreeSet::new();
        m.tasks
            .iter()
            .flat_map(|t| &t.segments)
            .filter(|s| seen.insert(s.operator_id.clone()))
            .map(|s| s.operator_id.clone())
            .collect()
    };
    for op in operators {
        let migrated: BTreeMap<String, u32> = migrations
            .iter()
            .filter(|((o, _), _)| *o == op)
            .map(|((_, s), v)| (s.clone(), *v))
            .collect();
        if reshard.is_none() && migrated.is_empty() {
            continue;
        }
        let (file, bytes, placed) =
            rewrite_operator(&m, &op, shards, &migrated, read, migrate).map_err(refuse)?;
        for t in &mut m.tasks {
            t.segments.retain(|s| s.operator_id != op);
        }
        for (task_index, seg) in placed {
            m.tasks[task_index].segments.push(seg);
        }
        new_files.push((file, bytes));
    }
    if let Some(shards) = reshard {
        m.state_shard_count = shards;
    }
    if !new_files.is_empty() {
        for t in &mut m.tasks {
            t.snapshot_bytes = t.segments.iter().map(|s| s.len).sum();
        }
    }
    m.meta = Some(new.clone());
    m.seal();
    Ok(Migrated {
        manifest: m,
        new_files,
    })
}

/// Replaces the last `/`-separated part of a StatePath (its state name).
fn rename_last(state_path: &str, to: &str) -> String {
    match state_path.rsplit_once('/') {
        Some((head, _)) => format!("{head}/{to}"),
        None => to.to_owned(),
    }
}

/// One operator's segments, rewritten at `shards` shards with the states of `migrated`
/// (name -> new schema version) converted: the packed file, its bytes, and each new
/// descriptor with the index of the task it belongs to.
#[allow(clippy::type_complexity)]
fn rewrite_operator(
    m: &EpochManifest,
    op: &str,
    shards: u32,
    migrated: &BTreeMap<String, u32>,
    read: &mut dyn FnMut(&SegmentDescriptor) -> Result<Vec<u8>, String>,
    migrate: &mut MigrateFn<'_>,
) -> Result<(String, Vec<u8>, Vec<(usize, SegmentDescriptor)>), String> {
    // state -> (schema version, shard -> entries by key)
    let mut states: BTreeMap<String, (u32, BTreeMap<u32, BTreeMap<Vec<u8>, Vec<u8>>>)> =
        BTreeMap::new();
    let mut vertex = None;
    for t in &m.tasks {
        for s in t.segments.iter().filter(|s| s.operator_id == op) {
            vertex.get_or_insert_with(|| t.task.vertex.clone());
            let bytes = read(s).map_err(|e| format!("segment {}: {e}", s.state_path))?;
            if nop_stream_checkpoint::payload_checksum(&bytes) != s.checksum {
                return Err(format!("segment {} failed its checksum", s.state_path));
            }
            let (schema, by_shard) = states
                .entry(s.state.clone())
                .or_insert_with(|| (s.schema_version, BTreeMap::new()));
            if *schema != s.schema_version {
                return Err(format!(
                    "state `{}` of operator `{op}` has segments of schema versions {} and {}",
                    s.state, schema, s.schema_version
                ));
            }
            // A full payload, or a delta on top of what the payloads before it in the
            // operator's chain left (manifest order is chain order, oldest first).
            let delta = s.codec == payload::KV_DELTA_CODEC;
            for (k, v) in payload::decode(&s.codec, &bytes)
                .map_err(|e| format!("segment {}: {e}", s.state_path))?
            {
                let key = record_key(k)
                    .ok_or_else(|| format!("segment {}: malformed entry key", s.state_path))?;
                let shard = by_shard.entry(shard_of(key, shards).0).or_default();
                let Some(v) = v else {
                    shard.remove(k);
                    continue;
                };
                if shard.insert(k.to_vec(), v.to_vec()).is_some() && !delta {
                    return Err(format!(
                        "state `{}` of operator `{op}` holds a key twice (segment {})",
                        s.state, s.state_path
                    ));
                }
            }
        }
    }
    // A delta may have emptied a shard (or deleted keys no payload before it held).
    for (_, by_shard) in states.values_mut() {
        by_shard.retain(|_, entries| !entries.is_empty());
    }
    for (state, to) in migrated {
        let Some((schema, by_shard)) = states.get_mut(state) else {
            // Nothing stored: nothing to convert.
            continue;
        };
        // A TTL state's stored values start with their write time: the plugin converts
        // what follows it, and the write time stays.
        let ttl = m
            .meta
            .as_ref()
            .and_then(|meta| meta.operators.iter().find(|o| o.operator_id == op))
            .is_some_and(|o| o.state_ttl_ms.contains_key(state));
        migrate_state(op, state, *schema, ttl, by_shard, migrate)?;
        *schema = *to;
    }
    let vertex = vertex.ok_or_else(|| format!("operator `{op}` has no segments"))?;
    let tasks: Vec<usize> = (0..m.tasks.len())
        .filter(|&i| m.tasks[i].task.vertex == vertex)
        .collect();
    let old_parallelism = tasks.len() as u32;
    let file = names::migrated_segment_file(m.epoch.0, op, shards);
    let mut packed = Vec::new();
    let mut placed = Vec::new();
    for (state, (schema, by_shard)) in states {
        for (shard, entries) in by_shard {
            let offset = packed.len() as u64;
            let start = packed.len();
            for (k, v) in &entries {
                payload::push_item(&mut packed, k);
                payload::push_item(&mut packed, v);
            }
            let payload = &packed[start..];
            let owner = owner_of(StateShardId(shard), shards, old_parallelism).0;
            let task_index = tasks
                .iter()
                .copied()
                .find(|&i| m.tasks[i].task.subtask.0 == owner)
                .unwrap_or(tasks[0]);
            placed.push((
                task_index,
                SegmentDescriptor {
                    state_path: names::state_path(
                        &m.namespace,
                        m.epoch.0,
                        op,
                        m.tasks[task_index].task.subtask.0,
                        shard,
                        &state,
                    ),
                    operator_id: op.to_owned(),
                    shard,
                    state: state.clone(),
                    file: file.clone(),
                    offset,
                    len: payload.len() as u64,
                    checksum: nop_stream_checkpoint::payload_checksum(payload),
                    codec: KV_CODEC.into(),
                    schema_version: schema,
                    entries: entries.len() as u64,
                },
            ));
        }
    }
    Ok((file, packed, placed))
}

/// Converts every value of one state through `migrate`, batch by batch in (shard, key)
/// order; the first batch twice, to catch a migration that is not deterministic.
fn migrate_state(
    op: &str,
    state: &str,
    from: u32,
    ttl: bool,
    by_shard: &mut BTreeMap<u32, BTreeMap<Vec<u8>, Vec<u8>>>,
    migrate: &mut MigrateFn<'_>,
) -> Result<(), String> {
    // Bytes of the write-time prefix of a TTL state's values (nop_stream_state).
    let prefix = if ttl { 8 } else { 0 };
    let all: Vec<(u32, Vec<u8>)> = by_shard
        .iter()
        .flat_map(|(shard, entries)| entries.keys().map(|k| (*shard, k.clone())))
        .collect();
    for (i, chunk) in all.chunks(MIGRATE_BATCH).enumerate() {
        let batch: Vec<StateEntry> = chunk
            .iter()
            .map(|(shard, k)| {
                let n = u32::from_be_bytes(k[..4].try_into().expect("checked key")) as usize;
                StateEntry {
                    namespace: k[4..4 + n].to_vec(),
                    key: k[4 + n..].to_vec(),
                    value: by_shard[shard][k]
                        .get(prefix..)
                        .unwrap_or_default()
                        .to_vec(),
                }
            })
            .collect();
        let out = migrate(op, state, from, &batch)
            .map_err(|e| format!("migrate-state {op}/{state}: {e}"))?;
        if out.len() != batch.len() {
            return Err(format!(
                "migrate-state {op}/{state}: the plugin returned {} values for {} entries",
                out.len(),
                batch.len()
            ));
        }
        if i == 0 {
            let again = migrate(op, state, from, &batch)
                .map_err(|e| format!("migrate-state {op}/{state}: {e}"))?;
            if again != out {
                return Err(format!(
                    "migrate-state {op}/{state}: the plugin's migration is not deterministic (the same entries gave other values)"
                ));
            }
        }
        for ((shard, k), v) in chunk.iter().zip(out) {
            let entries = by_shard.get_mut(shard).expect("read above");
            match v {
                Some(v) => {
                    let mut stored = entries[k].get(..prefix).unwrap_or_default().to_vec();
                    stored.extend_from_slice(&v);
                    entries.insert(k.clone(), stored);
                }
                None => {
                    entries.remove(k);
                }
            }
        }
    }
    by_shard.retain(|_, e| !e.is_empty());
    Ok(())
}

/// The record key of an entry key `namespace length (u32 BE) | namespace | key`.
fn record_key(k: &[u8]) -> Option<&[u8]> {
    let n = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
    k.get(4 + n..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{AttemptId, EpochId, FencingToken, JobId, PipelineId, SubtaskIndex};
    use nop_stream_api::{TaskId, VertexId};
    use nop_stream_checkpoint::{STATE_FORMAT_VERSION, TaskSnapshot, payload_checksum};
    use proptest::prelude::*;

    /// An entry key: namespace then record key.
    fn entry_key(ns: &[u8], key: &[u8]) -> Vec<u8> {
        let mut k = (ns.len() as u32).to_be_bytes().to_vec();
        k.extend_from_slice(ns);
        k.extend_from_slice(key);
        k
    }

    type Entries = BTreeMap<(String, Vec<u8>), Vec<u8>>;

    /// A manifest of one keyed operator `count` at `p` subtasks over `shards` shards
    /// holding `entries` ((state, entry key) -> value), laid out as tasks write it, and the
    /// segment files' bytes.
    fn manifest(
        entries: &Entries,
        shards: u32,
        p: u32,
    ) -> (EpochManifest, BTreeMap<String, Vec<u8>>) {
        let mut files = BTreeMap::new();
        let mut tasks = Vec::new();
        for i in 0..p {
            let owned = nop_stream_core::shards_of(SubtaskIndex(i), shards, p);
            let file = names::segment_file(7, "count", i, 1);
            let mut packed = Vec::new();
            let mut segments = Vec::new();
            for state in ["counts", "__timers"] {
                for shard in owned.clone() {
                    let start = packed.len();
                    let mut n = 0;
                    for ((st, k), v) in entries {
                        let key = record_key(k).unwrap();
                        if st == state && shard_of(key, shards).0 == shard {
                            payload::push_item(&mut packed, k);
                            payload::push_item(&mut packed, v);
                            n += 1;
                        }
                    }
                    if n == 0 {
                        continue;
                    }
                    let payload = &packed[start..];
                    segments.push(SegmentDescriptor {
                        state_path: names::state_path("ns", 7, "count", i, shard, state),
                        operator_id: "count".into(),
                        shard,
                        state: state.into(),
                        file: file.clone(),
                        offset: start as u64,
                        len: payload.len() as u64,
                        checksum: payload_checksum(payload),
                        codec: KV_CODEC.into(),
                        schema_version: 1,
                        entries: n,
                    });
                }
            }
            files.insert(file, packed);
            tasks.push(TaskSnapshot {
                task: TaskId {
                    job: JobId::new("j"),
                    pipeline: PipelineId::new("main"),
                    vertex: VertexId::new("count"),
                    subtask: SubtaskIndex(i),
                },
                epoch: EpochId(7),
                end_of_data: false,
                segments,
                operator_state: Vec::new(),
                splits: Vec::new(),
                watermarks: Vec::new(),
                ended_inputs: Vec::new(),
                pending_transactions: Vec::new(),
                sink_operator: None,
                snapshot_bytes: 0,
                alignment_ms: 0,
                duration_ms: 0,
                async_ms: 0,
                barrier_unix_ms: 0,
                compacted_bytes: 0,
                records_in_total: 0,
                records_out_total: 0,
            });
        }
        let mut m = EpochManifest {
            epoch: EpochId(7),
            job_id: "j".into(),
            pipeline_id: "main".into(),
            namespace: "ns".into(),
            plan_fingerprint: "fp".into(),
            state_shard_count: shards,
            attempt: AttemptId(1),
            fencing_token: FencingToken(1),
            final_epoch: false,
            tasks,
            enumerators: Vec::new(),
            state_format_version: STATE_FORMAT_VERSION,
            created_ms: 0,
            durable_ms: 0,
            meta: None,
            checksum: String::new(),
        };
        m.seal();
        (m, files)
    }

    fn reader(
        files: &BTreeMap<String, Vec<u8>>,
    ) -> impl FnMut(&SegmentDescriptor) -> Result<Vec<u8>, String> + '_ {
        move |s| {
            let f = files.get(&s.file).ok_or("no such file")?;
            Ok(f[s.offset as usize..(s.offset + s.len) as usize].to_vec())
        }
    }

    /// Every entry a migrated manifest holds, checking that each sits in the shard its
    /// key maps to.
    fn contents(
        m: &EpochManifest,
        files: &BTreeMap<String, Vec<u8>>,
        new: &[(String, Vec<u8>)],
    ) -> Entries {
        let mut all: BTreeMap<String, Vec<u8>> = files.clone();
        all.extend(new.iter().cloned());
        let mut out = Entries::new();
        for s in m.tasks.iter().flat_map(|t| &t.segments) {
            let bytes = reader(&all)(s).unwrap();
            assert_eq!(payload_checksum(&bytes), s.checksum);
            let ps = payload::entries(&bytes).unwrap();
            assert_eq!(ps.len() as u64, s.entries);
            for (k, v) in ps {
                let key = record_key(k).unwrap();
                assert_eq!(shard_of(key, m.state_shard_count).0, s.shard);
                assert!(
                    out.insert((s.state.clone(), k.to_vec()), v.to_vec())
                        .is_none()
                );
            }
        }
        out
    }

    /// The new job's metadata: operator `count` whose state `counts` has schema `version`.
    fn meta(version: u32) -> SnapshotMeta {
        SnapshotMeta {
            format: nop_stream_checkpoint::META_FORMAT,
            host_version: "test".into(),
            wit_packages: Vec::new(),
            plan_fingerprint: "fp2".into(),
            state_topology_fingerprint: String::new(),
            state_shard_count: 0,
            hash_policy: "xxh3-64/v1".into(),
            semantic: "strict-exactly-once".into(),
            operators: vec![nop_stream_checkpoint::OperatorMeta {
                operator_id: "count".into(),
                origin: "uid".into(),
                name: "count".into(),
                kind: nop_stream_api::PluginKind::Operator,
                parallelism: 1,
                plugin: "count@2".into(),
                component_sha256: String::new(),
                world: String::new(),
                states: vec![nop_stream_api::StateDescriptor {
                    name: "counts".into(),
                    kind: nop_stream_api::StateKind::Value,
                    schema_version: version,
                    codec: "le".into(),
                    schema_sha256: None,
                }],
                keyed: true,
                inputs: Vec::new(),
                sink_protocol: None,
                state_ttl_ms: Default::default(),
                operator_states: Vec::new(),
                state_layout: None,
            }],
        }
    }

    fn reshard(shards: u32) -> Actions {
        Actions {
            actions: vec![Action::Reshard { shards }],
        }
    }

    fn entries_strategy() -> impl Strategy<Value = Entries> {
        proptest::collection::btree_map(
            (
                prop_oneof![Just("counts".to_owned()), Just("__timers".to_owned())],
                (
                    proptest::collection::vec(any::<u8>(), 0..3),
                    proptest::collection::vec(any::<u8>(), 0..6),
                ),
            )
                .prop_map(|(s, (ns, k))| (s, entry_key(&ns, &k))),
            proptest::collection::vec(any::<u8>(), 0..5),
            0..60,
        )
    }

    proptest! {
        /// Reshard S -> S' keeps the exact key-value and timer sets, puts every entry in
        /// the shard its key maps to, and is deterministic (byte-identical files and
        /// descriptors); S -> S' -> S gives back payloads equal to a snapshot taken at S.
        #[test]
        fn reshard_keeps_every_entry_and_is_deterministic(
            entries in entries_strategy(),
            s in 1u32..40,
            s2 in 1u32..40,
            p in 1u32..5,
        ) {
            let p = p.min(s);
            let (m, files) = manifest(&entries, s, p);
            let a = apply(&m, &reshard(s2), &meta(1), &mut reader(&files), &mut no_migration).unwrap();
            let b = apply(&m, &reshard(s2), &meta(1), &mut reader(&files), &mut no_migration).unwrap();
            prop_assert_eq!(&a.new_files, &b.new_files);
            prop_assert_eq!(&a.manifest, &b.manifest);
            prop_assert_eq!(a.manifest.state_shard_count, s2);
            prop_assert!(a.kept_files().is_empty());
            prop_assert_eq!(&contents(&a.manifest, &files, &a.new_files), &entries);

            // And back: same entries, same per-(state, shard) payloads as the original.
            let mut files2 = files.clone();
            files2.extend(a.new_files.iter().cloned());
            let back = apply(&a.manifest, &reshard(s), &meta(1), &mut reader(&files2), &mut no_migration).unwrap();
            prop_assert_eq!(&contents(&back.manifest, &files, &back.new_files), &entries);
            let payloads = |mm: &EpochManifest, fs: &BTreeMap<String, Vec<u8>>| {
                let mut out = BTreeMap::new();
                for seg in mm.tasks.iter().flat_map(|t| &t.segments) {
                    out.insert((seg.state.clone(), seg.shard), reader(fs)(seg).unwrap());
                }
                out
            };
            let mut files3 = files2.clone();
            files3.extend(back.new_files.iter().cloned());
            prop_assert_eq!(payloads(&back.manifest, &files3), payloads(&m, &files));
        }
    }

    /// Appends to every task of `m` a `kv-delta/1` segment per (state, owned shard) with
    /// the changes of `changes` ((state, entry key) -> new value, or `None`: deleted), as
    /// an incremental snapshot extends its chain.
    fn add_delta(
        m: &mut EpochManifest,
        files: &mut BTreeMap<String, Vec<u8>>,
        changes: &BTreeMap<(String, Vec<u8>), Option<Vec<u8>>>,
    ) {
        let shards = m.state_shard_count;
        let p = m.tasks.len() as u32;
        for (i, t) in m.tasks.iter_mut().enumerate() {
            let i = i as u32;
            let owned = nop_stream_core::shards_of(SubtaskIndex(i), shards, p);
            let file = names::segment_file(8, "count", i, 1);
            let mut packed = Vec::new();
            for state in ["counts", "__timers"] {
                for shard in owned.clone() {
                    let start = packed.len();
                    let mut n = 0;
                    for ((st, k), v) in changes {
                        if st == state && shard_of(record_key(k).unwrap(), shards).0 == shard {
                            payload::push_change(&mut packed, k, v.as_deref());
                            n += 1;
                        }
                    }
                    if n == 0 {
                        continue;
                    }
                    let bytes = &packed[start..];
                    t.segments.push(SegmentDescriptor {
                        state_path: names::state_path("ns", 8, "count", i, shard, state),
                        operator_id: "count".into(),
                        shard,
                        state: state.into(),
                        file: file.clone(),
                        offset: start as u64,
                        len: bytes.len() as u64,
                        checksum: payload_checksum(bytes),
                        codec: payload::KV_DELTA_CODEC.into(),
                        schema_version: 1,
                        entries: n,
                    });
                }
            }
            files.insert(file, packed);
        }
        m.seal();
    }

    proptest! {
        /// A reshard of a chain (full payloads, then a delta of puts and deletes, some of
        /// keys the full payloads lack) writes full payloads of exactly the folded state.
        #[test]
        fn reshard_folds_an_incremental_chain(
            entries in entries_strategy(),
            changed in entries_strategy(),
            deletes in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
            s in 1u32..20,
            s2 in 1u32..20,
            p in 1u32..4,
        ) {
            let p = p.min(s);
            let (mut m, mut files) = manifest(&entries, s, p);
            let mut changes: BTreeMap<_, _> =
                changed.into_iter().map(|(k, v)| (k, Some(v))).collect();
            let keys: Vec<_> = entries.keys().cloned().collect();
            if !keys.is_empty() {
                for d in deletes {
                    changes.insert(d.get(&keys).clone(), None);
                }
            }
            add_delta(&mut m, &mut files, &changes);
            let mut expected = entries.clone();
            for (k, v) in &changes {
                match v {
                    Some(v) => expected.insert(k.clone(), v.clone()),
                    None => expected.remove(k),
                };
            }
            let a = apply(&m, &reshard(s2), &meta(1), &mut reader(&files), &mut no_migration).unwrap();
            // Full payloads only, and none empty (a delta may have emptied a shard).
            prop_assert!(a.manifest.tasks.iter().flat_map(|t| &t.segments).all(|d| d.codec == KV_CODEC && d.entries > 0));
            prop_assert_eq!(&contents(&a.manifest, &files, &a.new_files), &expected);
        }
    }

    #[test]
    fn renames_and_drops_touch_only_the_manifest() {
        let mut entries = Entries::new();
        for i in 0..50u32 {
            entries.insert(("counts".into(), entry_key(b"", &i.to_be_bytes())), vec![1]);
            entries.insert(
                ("__timers".into(), entry_key(b"t", &i.to_be_bytes())),
                vec![],
            );
        }
        let (m, files) = manifest(&entries, 8, 2);
        let actions = Actions {
            actions: vec![
                Action::RenameOperator {
                    from: "count".into(),
                    to: "tally".into(),
                },
                Action::RenameState {
                    operator: "tally".into(),
                    from: "counts".into(),
                    to: "totals".into(),
                },
            ],
        };
        let out = apply(
            &m,
            &actions,
            &meta(1),
            &mut |_| panic!("no payload is read"),
            &mut no_migration,
        )
        .unwrap();
        assert!(out.new_files.is_empty());
        assert_eq!(out.kept_files(), files.keys().cloned().collect::<Vec<_>>());
        assert!(out.manifest.verify());
        let segs: Vec<_> = out
            .manifest
            .tasks
            .iter()
            .flat_map(|t| &t.segments)
            .collect();
        assert!(segs.iter().all(|s| s.operator_id == "tally"));
        assert!(segs.iter().any(|s| s.state == "totals"));
        assert!(!segs.iter().any(|s| s.state == "counts"));
        assert!(
            segs.iter()
                .filter(|s| s.state == "totals")
                .all(|s| s.state_path.ends_with("/totals"))
        );
        assert!(
            out.manifest
                .tasks
                .iter()
                .all(|t| t.task.vertex.as_str() == "tally")
        );

        let drop = Actions {
            actions: vec![Action::DropState {
                operator: "count".into(),
                state: Some("__timers".into()),
            }],
        };
        let out = apply(
            &m,
            &drop,
            &meta(1),
            &mut |_| panic!("no payload is read"),
            &mut no_migration,
        )
        .unwrap();
        let segs: Vec<_> = out
            .manifest
            .tasks
            .iter()
            .flat_map(|t| &t.segments)
            .collect();
        assert!(!segs.is_empty() && segs.iter().all(|s| s.state == "counts"));
    }

    #[test]
    fn finalize_sink_drops_only_that_sinks_pending_committables() {
        let (mut m, _) = manifest(&Entries::new(), 4, 2);
        for (i, t) in m.tasks.iter_mut().enumerate() {
            t.sink_operator = Some(if i == 0 { "sinks/a" } else { "sinks/b" }.into());
            t.pending_transactions = vec![nop_stream_checkpoint::PendingTransaction {
                epoch: EpochId(7),
                txn: format!("j:main:sink:{i}:7"),
                committable: "00".into(),
            }];
        }
        let finalize = Actions {
            actions: vec![Action::FinalizeSink {
                operator: "sinks/a".into(),
                with: "old-sink@0.1.0".into(),
                job: "old.toml".into(),
            }],
        };
        let out = apply(
            &m,
            &finalize,
            &meta(1),
            &mut |_| panic!("no payload is read"),
            &mut no_migration,
        )
        .unwrap();
        let pending: Vec<usize> = out
            .manifest
            .tasks
            .iter()
            .map(|t| t.pending_transactions.len())
            .collect();
        assert_eq!(pending, [0, 1], "sinks/a finalized, sinks/b untouched");
    }

    #[test]
    fn a_corrupt_segment_fails_the_reshard_naming_it() {
        let mut entries = Entries::new();
        entries.insert(("counts".into(), entry_key(b"", b"k")), vec![1]);
        let (m, mut files) = manifest(&entries, 4, 1);
        for f in files.values_mut() {
            f[0] ^= 1;
        }
        let e = apply(
            &m,
            &reshard(2),
            &meta(1),
            &mut reader(&files),
            &mut no_migration,
        )
        .unwrap_err();
        assert!(e.to_string().contains("failed its checksum"), "{e}");
        assert!(e.to_string().contains("checkpoint/ns/7/count/0/"), "{e}");
        let e = apply(
            &m,
            &reshard(0),
            &meta(1),
            &mut reader(&files),
            &mut no_migration,
        )
        .unwrap_err();
        assert!(e.to_string().contains("0 shards"), "{e}");
    }

    /// A migration: u8 counts become u32 LE; zero counts are deleted.
    fn widen(
        op: &str,
        state: &str,
        from: u32,
        entries: &[StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>, String> {
        assert_eq!((op, state, from), ("count", "counts", 1));
        Ok(entries
            .iter()
            .map(|e| match e.value.first() {
                Some(0) | None => None,
                Some(&n) => Some(u32::from(n).to_le_bytes().to_vec()),
            })
            .collect())
    }

    #[test]
    fn migrate_state_converts_every_value_once_deletes_nones_and_bumps_the_schema() {
        let mut entries = Entries::new();
        for i in 0..3000u32 {
            entries.insert(
                ("counts".into(), entry_key(b"", &i.to_be_bytes())),
                vec![(i % 7) as u8],
            );
            entries.insert(
                ("__timers".into(), entry_key(b"t", &i.to_be_bytes())),
                vec![],
            );
        }
        let (m, files) = manifest(&entries, 16, 3);
        let actions = Actions {
            actions: vec![Action::MigrateState {
                operator: "count".into(),
                state: "counts".into(),
            }],
        };
        let mut calls = 0;
        let mut counted = |op: &str, st: &str, from: u32, e: &[StateEntry]| {
            calls += 1;
            assert!(e.len() <= MIGRATE_BATCH);
            widen(op, st, from, e)
        };
        let out = apply(&m, &actions, &meta(2), &mut reader(&files), &mut counted).unwrap();
        // 3000 entries in batches of 1024, the first one twice.
        assert_eq!(calls, 3 + 1);
        assert_eq!(out.manifest.state_shard_count, 16);
        assert!(out.manifest.verify());
        assert_eq!(out.manifest.meta.as_ref().unwrap().plan_fingerprint, "fp2");
        let got = contents(&out.manifest, &files, &out.new_files);
        let mut want = Entries::new();
        for ((st, k), v) in &entries {
            if st == "counts" {
                if v[0] != 0 {
                    want.insert(
                        (st.clone(), k.clone()),
                        u32::from(v[0]).to_le_bytes().to_vec(),
                    );
                }
            } else {
                want.insert((st.clone(), k.clone()), v.clone());
            }
        }
        assert_eq!(got, want);
        for s in out.manifest.tasks.iter().flat_map(|t| &t.segments) {
            assert_eq!(s.schema_version, if s.state == "counts" { 2 } else { 1 });
        }

        // A migration that is not deterministic, or miscounts, is refused.
        let mut n = 0u8;
        let mut flaky = |_: &str, _: &str, _: u32, e: &[StateEntry]| {
            n = n.wrapping_add(1);
            Ok(e.iter().map(|_| Some(vec![n])).collect())
        };
        let err = apply(&m, &actions, &meta(2), &mut reader(&files), &mut flaky).unwrap_err();
        assert!(err.to_string().contains("not deterministic"), "{err}");
        let mut short = |_: &str, _: &str, _: u32, _: &[StateEntry]| Ok(vec![]);
        let err = apply(&m, &actions, &meta(2), &mut reader(&files), &mut short).unwrap_err();
        assert!(err.to_string().contains("returned 0 values"), "{err}");
        // A state the new job does not declare.
        let bad = Actions {
            actions: vec![Action::MigrateState {
                operator: "count".into(),
                state: "nope".into(),
            }],
        };
        let err = apply(&m, &bad, &meta(2), &mut reader(&files), &mut no_migration).unwrap_err();
        assert!(err.to_string().contains("declares no such state"), "{err}");
    }
}
