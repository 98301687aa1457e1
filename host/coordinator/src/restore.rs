//! Restore planning, pure (design §2.5): which segments, cursors, watermarks and pending
//! transactions each task of a new attempt gets from the latest durable manifest, how
//! splits are assigned to readers, and which old sink subtasks settle before a rescale.
//! Nothing here reads storage: a task reads the segments it is given itself.

use crate::CoordinatorError;
use nop_stream_api::{PluginKind, Split, TaskId};
use nop_stream_checkpoint::{
    EnumeratorState, EpochManifest, Location, STATE_FORMAT_VERSION, SegmentDescriptor, SplitState,
    TaskSnapshot,
};
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::{OperatorStateRestore, SinkSettlement, SplitCursor, TaskRestorePlan};
use std::collections::{BTreeMap, BTreeSet};

/// An id as one path component ([`nop_stream_checkpoint::names::component`]).
pub use nop_stream_checkpoint::names::component as path_component;

/// The checkpoint namespace of a plan (design §3.1: jobId + pipelineId).
pub fn checkpoint_namespace(plan: &PartitionedPlan) -> String {
    nop_stream_checkpoint::names::namespace(plan.job.job_id.as_str(), plan.job.pipeline_id.as_str())
}

/// The location of a plan's checkpoint namespace in the checkpoint root `root`:
/// `<root>/<namespace>`.
pub fn checkpoint_location(root: &Location, plan: &PartitionedPlan) -> Location {
    root.join(&checkpoint_namespace(plan))
}

/// Checks that a manifest can restore `plan` (design §10.4); the message says what differs.
///
/// # Errors
/// [`CoordinatorError::Restore`] naming the first difference.
pub fn check_restore_compatible(
    m: &EpochManifest,
    plan: &PartitionedPlan,
) -> Result<(), CoordinatorError> {
    check_restore(m, plan, None).map(|_| ())
}

/// Like [`check_restore_compatible`], but accepts a manifest whose fingerprint equals
/// `rescale_from` (an explicit rescale action, design §10.5); returns whether the restore
/// rescales.
///
/// # Errors
/// [`CoordinatorError::Restore`] naming the first difference.
pub fn check_restore(
    m: &EpochManifest,
    plan: &PartitionedPlan,
    rescale_from: Option<&str>,
) -> Result<bool, CoordinatorError> {
    let refuse = |message: String| {
        Err(CoordinatorError::Restore {
            epoch: m.epoch.0,
            message,
        })
    };
    if m.state_format_version > STATE_FORMAT_VERSION {
        return refuse(format!(
            "it was written by a newer host (state format version {}; this host reads \
             {STATE_FORMAT_VERSION}): run it with that host or a later one",
            m.state_format_version
        ));
    }
    if m.state_format_version != STATE_FORMAT_VERSION {
        return refuse(format!(
            "state format version {} differs from this host's {STATE_FORMAT_VERSION}",
            m.state_format_version
        ));
    }
    if m.state_shard_count != plan.job.state_shard_count {
        return refuse(format!(
            "state shard count differs: checkpoint {} vs job {} (changing it needs an explicit reshard migration)",
            m.state_shard_count, plan.job.state_shard_count
        ));
    }
    let planned: BTreeSet<String> = plan
        .vertices
        .iter()
        .flat_map(|v| v.operators.iter().map(|o| o.operator_id.to_string()))
        .collect();
    let stored: BTreeSet<String> = m
        .tasks
        .iter()
        .flat_map(|t| {
            t.segments
                .iter()
                .chain(&t.operator_state)
                .map(|s| s.operator_id.clone())
        })
        .collect();
    if let Some(missing) = stored.difference(&planned).next() {
        return refuse(format!(
            "the checkpoint holds state of operator `{missing}`, which the job no longer has"
        ));
    }
    if !plan.fingerprint_matches(&m.plan_fingerprint) {
        if rescale_from == Some(m.plan_fingerprint.as_str()) {
            return Ok(true);
        }
        return refuse(format!(
            "plan fingerprint differs: checkpoint {} vs job {} (the job file, a plugin version, its state schema or the parallelism changed; start fresh with --fresh, restore at another parallelism with --rescale, or restore explicitly with a migration)",
            &m.plan_fingerprint[..m.plan_fingerprint.len().min(16)],
            &plan.fingerprint[..plan.fingerprint.len().min(16)]
        ));
    }
    Ok(false)
}

/// The splits of source vertex `vertex` recorded in a manifest's split registry, in
/// registry order, or `None` if the manifest has no registry for it (the splits must be
/// discovered).
///
/// # Errors
/// [`CoordinatorError::Restore`] if a registered split has no descriptor or a malformed one.
pub fn restored_splits(
    plan: &PartitionedPlan,
    vertex: usize,
    m: &EpochManifest,
) -> Result<Option<Vec<Split>>, CoordinatorError> {
    let head = &plan.vertices[vertex].operators[0];
    let Some(e) = m
        .enumerators
        .iter()
        .find(|e| e.operator_id == head.operator_id.as_str())
    else {
        return Ok(None);
    };
    let descriptors: BTreeMap<&str, &str> = m
        .source_splits(head.operator_id.as_str())
        .map(|s| (s.split_id.as_str(), s.descriptor.as_str()))
        .collect();
    let refuse = |message: String| CoordinatorError::Restore {
        epoch: m.epoch.0,
        message,
    };
    e.splits
        .iter()
        .map(|(id, _)| {
            let d = descriptors
                .get(id.as_str())
                .ok_or_else(|| refuse(format!("split `{id}` has no descriptor in the manifest")))?;
            Ok(Split {
                id: id.clone(),
                descriptor: hex::decode(d)
                    .map_err(|e| refuse(format!("split `{id}`: descriptor is not hex: {e}")))?,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Assigns splits to the `parallelism` readers of a source: split `j` (in registry order)
/// belongs to reader `j mod parallelism` (design §6.3). Returns the splits of each reader
/// and the registry `(split id, owner)` the manifest records.
pub fn assign_splits(
    operator_id: &str,
    splits: Vec<Split>,
    parallelism: u32,
) -> (Vec<Vec<Split>>, EnumeratorState) {
    let p = parallelism.max(1);
    let mut per_reader = vec![Vec::new(); p as usize];
    let mut registry = Vec::with_capacity(splits.len());
    for (j, s) in splits.into_iter().enumerate() {
        let owner = j as u32 % p;
        registry.push((s.id.clone(), owner));
        per_reader[owner as usize].push(s);
    }
    (
        per_reader,
        EnumeratorState {
            operator_id: operator_id.to_owned(),
            splits: registry,
            finished: Vec::new(),
        },
    )
}

/// Before a rescale restore: every sink subtask of the checkpointed plan with its old
/// parallelism and the durable transactions it must commit (design §10.5).
pub fn sink_settlements(plan: &PartitionedPlan, m: &EpochManifest) -> Vec<SinkSettlement> {
    let mut out = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        if v.operators.last().map(|o| o.kind) != Some(PluginKind::Sink) {
            continue;
        }
        let old: Vec<_> = m.tasks.iter().filter(|t| t.task.vertex == v.id).collect();
        for t in &old {
            out.push(SinkSettlement {
                vertex: vi as u32,
                subtask: t.task.subtask.0,
                parallelism: old.len() as u32,
                commit: t.pending_transactions.clone(),
            });
        }
    }
    out
}

/// What every task of `plan` restores from `m` (`None`: a fresh start), given the splits
/// each source reader was assigned (`splits[(vertex, subtask)]`).
///
/// # Errors
/// [`CoordinatorError::Restore`] if a split cursor in the manifest is malformed.
///
/// - Without rescale, a task gets its own snapshot: end of data, watermarks, ended
///   inputs and the sink's durable pending transactions.
/// - With rescale, channels changed, so it restores conservatively from every old subtask
///   of its vertex (design §8.5): per input edge the minimum watermark of the channels that
///   had not ended, ended only if every old channel of the edge had ended, end of data
///   only if every old subtask had reached it. Sink transactions were settled before
///   ([`sink_settlements`]), so none is pending.
/// - Either way, a task gets the cursors of the splits it now reads, wherever they were
///   read before, and for each operator of its chain the segments of exactly the shards it
///   now owns (so a rescale moves shards, not keys, design §10.5).
pub fn plan_restore(
    plan: &PartitionedPlan,
    m: Option<&EpochManifest>,
    rescale: bool,
    splits: &BTreeMap<(usize, u32), Vec<Split>>,
) -> Result<BTreeMap<TaskId, TaskRestorePlan>, CoordinatorError> {
    let Some(m) = m else {
        return Ok(plan
            .vertices
            .iter()
            .flat_map(|v| &v.subtasks)
            .map(|st| (st.task.clone(), TaskRestorePlan::default()))
            .collect());
    };
    // The manifest indexed once, so planning is O(n log n) in its tasks, segments and
    // splits rather than a scan of the manifest per subtask.
    let index = ManifestIndex::new(m);
    let mut out = BTreeMap::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let head = v.operators[0].operator_id.as_str();
        let old = index
            .by_vertex
            .get(v.id.as_str())
            .map_or(&[][..], Vec::as_slice);
        // With rescale, per input edge: the minimum watermark of the old channels that had
        // not ended, and whether every old channel had ended; `None`: no old channel.
        let mut edge_restore: BTreeMap<String, Option<(i64, bool)>> = BTreeMap::new();
        // Non-keyed operator state of each operator of the chain: the same for every
        // subtask of the vertex.
        let mut operator_state: BTreeMap<&str, OperatorStateRestore> = BTreeMap::new();
        for op in v
            .operators
            .iter()
            .filter(|o| o.kind == PluginKind::Operator)
        {
            let op_id = op.operator_id.as_str();
            let old_tasks: Vec<&TaskSnapshot> = m
                .tasks
                .iter()
                .filter(|t| t.operator_state.iter().any(|s| s.operator_id == op_id))
                .collect();
            if let Some(first) = old_tasks.first() {
                operator_state.insert(
                    op_id,
                    OperatorStateRestore {
                        old_parallelism: index
                            .by_vertex
                            .get(first.task.vertex.as_str())
                            .map_or(0, Vec::len) as u32,
                        segments: old_tasks
                            .iter()
                            .flat_map(|t| &t.operator_state)
                            .filter(|s| s.operator_id == op_id)
                            .cloned()
                            .collect(),
                    },
                );
            }
        }
        for st in &v.subtasks {
            let mut r = TaskRestorePlan {
                epoch: Some(m.epoch),
                ..TaskRestorePlan::default()
            };
            if rescale {
                r.end_of_data = !old.is_empty() && old.iter().all(|t| t.end_of_data);
                for ch in &st.inputs {
                    let edge = ch.edge.to_string();
                    if r.watermarks.contains_key(&edge) {
                        // Recorded once per edge (below).
                        continue;
                    }
                    let restored = edge_restore
                        .entry(edge.clone())
                        .or_insert_with(|| {
                            let prefix = format!("{edge}/");
                            // Each old task recorded per channel (hosts before per-edge
                            // watermarks) or once for the edge (its open channels'
                            // minimum; ended: every channel of the edge had ended).
                            let old_channels: Vec<(i64, bool)> = old
                                .iter()
                                .flat_map(|t| {
                                    t.watermarks
                                        .iter()
                                        .filter(|(c, _)| *c == edge || c.starts_with(&prefix))
                                        .map(|(c, w)| (*w, t.ended_inputs.contains(c)))
                                })
                                .collect();
                            (!old_channels.is_empty()).then(|| {
                                (
                                    old_channels
                                        .iter()
                                        .filter(|(_, ended)| !ended)
                                        .map(|(w, _)| *w)
                                        .min()
                                        .unwrap_or(i64::MAX),
                                    old_channels.iter().all(|(_, ended)| *ended),
                                )
                            })
                        })
                        .to_owned();
                    let Some((w, ended)) = restored else {
                        continue;
                    };
                    // Once for the edge: the task puts every channel of it there
                    // (`nop_stream_checkpoint::restored_channel`), so the plan is O(edges)
                    // per task, not O(channels).
                    r.watermarks.insert(edge.clone(), w);
                    if ended {
                        r.ended_inputs.insert(edge);
                    }
                }
                if st.index.0 == 0 {
                    r.records_in_total = old.iter().map(|t| t.records_in_total).sum();
                    r.records_out_total = old.iter().map(|t| t.records_out_total).sum();
                }
            } else if let Some(s) = index.by_task.get(&st.task) {
                r.end_of_data = s.end_of_data;
                r.watermarks = s.watermarks.iter().cloned().collect();
                r.ended_inputs = s.ended_inputs.iter().cloned().collect();
                r.pending = s.pending_transactions.clone();
                r.records_in_total = s.records_in_total;
                r.records_out_total = s.records_out_total;
            }
            // This reader's splits and their cursors, by (source operator, split id): a
            // split of another source with the same id is not this one. Manifest order.
            let mut mine: Vec<(usize, &SplitState)> = splits
                .get(&(vi, st.index.0))
                .into_iter()
                .flatten()
                .flat_map(|s| {
                    index
                        .splits
                        .get(&(head, s.id.as_str()))
                        .into_iter()
                        .flatten()
                        .copied()
                })
                .collect();
            mine.sort_by_key(|(at, _)| *at);
            for (_, sp) in mine {
                let cursor = hex::decode(&sp.cursor).map_err(|e| CoordinatorError::Restore {
                    epoch: m.epoch.0,
                    message: format!("split `{}`: cursor is not hex: {e}", sp.split_id),
                })?;
                r.splits.insert(
                    sp.split_id.clone(),
                    SplitCursor {
                        cursor,
                        finished: sp.finished,
                        max_timestamp: sp.max_timestamp,
                    },
                );
            }
            let owned = v.owned_shards(st, plan.job.state_shard_count);
            for op in v
                .operators
                .iter()
                .filter(|o| o.kind == PluginKind::Operator)
            {
                let op_id = op.operator_id.as_str();
                // The segments of the shards this subtask owns, in manifest order.
                let mut segs: Vec<(usize, &SegmentDescriptor)> = index
                    .segments
                    .range((op_id, owned.start)..(op_id, owned.end.max(owned.start)))
                    .flat_map(|(_, s)| s.iter().copied())
                    .collect();
                segs.sort_by_key(|(at, _)| *at);
                if !segs.is_empty() {
                    r.segments.insert(
                        op_id.to_owned(),
                        segs.into_iter().map(|(_, s)| s.clone()).collect(),
                    );
                }
                if let Some(o) = operator_state.get(op_id) {
                    r.operator_state.insert(op_id.to_owned(), o.clone());
                }
            }
            out.insert(st.task.clone(), r);
        }
    }
    Ok(out)
}

/// A manifest's tasks, splits and keyed segments indexed for [`plan_restore`]; splits and
/// segments carry their position in the manifest, so a plan lists them in manifest order.
struct ManifestIndex<'m> {
    by_task: BTreeMap<&'m TaskId, &'m TaskSnapshot>,
    /// Snapshots by vertex id, in manifest order.
    by_vertex: BTreeMap<&'m str, Vec<&'m TaskSnapshot>>,
    /// Split states by (source operator, split id): a source heads its vertex, so its
    /// tasks' vertex id is its operator id.
    splits: BTreeMap<(&'m str, &'m str), Vec<(usize, &'m SplitState)>>,
    /// Keyed segments by (operator id, shard).
    segments: BTreeMap<(&'m str, u32), Vec<(usize, &'m SegmentDescriptor)>>,
}

impl<'m> ManifestIndex<'m> {
    fn new(m: &'m EpochManifest) -> Self {
        let mut ix = ManifestIndex {
            by_task: BTreeMap::new(),
            by_vertex: BTreeMap::new(),
            splits: BTreeMap::new(),
            segments: BTreeMap::new(),
        };
        let mut at = 0usize;
        for t in &m.tasks {
            // The first snapshot of a task wins, as a scan in manifest order finds it.
            ix.by_task.entry(&t.task).or_insert(t);
            ix.by_vertex
                .entry(t.task.vertex.as_str())
                .or_default()
                .push(t);
            for sp in &t.splits {
                at += 1;
                ix.splits
                    .entry((t.task.vertex.as_str(), sp.split_id.as_str()))
                    .or_default()
                    .push((at, sp));
            }
            for s in &t.segments {
                at += 1;
                ix.segments
                    .entry((s.operator_id.as_str(), s.shard))
                    .or_default()
                    .push((at, s));
            }
        }
        ix
    }
}
