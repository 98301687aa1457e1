//! Restore planning and split assignment: pure functions over a compiled plan and a
//! hand-made manifest.

mod common;

use nop_stream_api::{AttemptId, ChannelId, EpochId, FencingToken, Split, TaskId};
use nop_stream_checkpoint::{
    EnumeratorState, EpochManifest, PendingTransaction, STATE_FORMAT_VERSION, SegmentDescriptor,
    SplitState, TaskSnapshot, input_watermarks, restored_channel,
};
use nop_stream_coordinator::restore::{
    assign_splits, plan_restore, restored_splits, sink_settlements,
};
use nop_stream_coordinator::{CoordinatorError, check_restore};
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::TaskRestorePlan;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// What task restore plan `t` restores channel `ch` to: (watermark, ended), as the task
/// applies it.
fn restored(t: &TaskRestorePlan, ch: &ChannelId) -> (Option<i64>, bool) {
    restored_channel(
        ch,
        |k| t.watermarks.get(k).copied(),
        |k| t.ended_inputs.contains(k),
    )
}

fn vertex_of(plan: &PartitionedPlan, name: &str) -> usize {
    plan.vertices
        .iter()
        .position(|v| v.operators.iter().any(|o| o.name == name))
        .unwrap_or_else(|| panic!("no vertex runs `{name}`"))
}

/// A manifest of `plan` at epoch 7: every shard of `agg` has one segment, held by the
/// subtask owning it; sources own splits `s0..s{n}` round robin; sinks hold one pending
/// transaction each.
fn manifest(plan: &PartitionedPlan, splits: u32) -> EpochManifest {
    let agg = vertex_of(plan, "agg");
    let src = vertex_of(plan, "src");
    let out = vertex_of(plan, "out");
    let shards = plan.job.state_shard_count;
    let mut tasks = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        for st in &v.subtasks {
            let mut snap = TaskSnapshot {
                task: st.task.clone(),
                epoch: EpochId(7),
                end_of_data: false,
                segments: Vec::new(),
                operator_state: Vec::new(),
                splits: Vec::new(),
                watermarks: st
                    .inputs
                    .iter()
                    .map(|c| (c.to_string(), 100 + i64::from(st.index.0)))
                    .collect(),
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
            };
            if vi == agg {
                let op = &v.operators[0].operator_id;
                for shard in v.owned_shards(st, shards) {
                    snap.segments.push(SegmentDescriptor {
                        state_path: format!("{op}/{shard}/acc"),
                        operator_id: op.to_string(),
                        shard,
                        state: "acc".into(),
                        file: format!("segments/7/{shard}.seg"),
                        offset: 0,
                        len: 1,
                        checksum: String::new(),
                        codec: "postcard".into(),
                        schema_version: 1,
                        entries: 1,
                    });
                }
            }
            if vi == src {
                for j in (0..splits).filter(|j| j % v.parallelism == st.index.0) {
                    snap.splits.push(SplitState {
                        split_id: format!("s{j}"),
                        descriptor: hex::encode(format!("d{j}")),
                        cursor: hex::encode([j as u8, 1]),
                        finished: j == 0,
                        max_timestamp: Some(i64::from(j)),
                    });
                }
            }
            if vi == out {
                snap.pending_transactions.push(PendingTransaction {
                    epoch: EpochId(7),
                    txn: format!("txn-{}", st.index.0),
                    committable: hex::encode("c"),
                });
            }
            tasks.push(snap);
        }
    }
    let mut m = EpochManifest {
        epoch: EpochId(7),
        job_id: plan.job.job_id.to_string(),
        pipeline_id: plan.job.pipeline_id.to_string(),
        namespace: "ns".into(),
        plan_fingerprint: plan.fingerprint.clone(),
        state_shard_count: shards,
        attempt: AttemptId(1),
        fencing_token: FencingToken(1),
        final_epoch: false,
        enumerators: vec![EnumeratorState {
            operator_id: plan.vertices[src].operators[0].operator_id.to_string(),
            splits: (0..splits)
                .map(|j| (format!("s{j}"), j % plan.vertices[src].parallelism))
                .collect(),
            finished: Vec::new(),
        }],
        tasks,
        state_format_version: STATE_FORMAT_VERSION,
        created_ms: 0,
        durable_ms: 0,
        meta: None,
        checksum: String::new(),
    };
    m.seal();
    m
}

fn split_map(plan: &PartitionedPlan, m: &EpochManifest) -> BTreeMap<(usize, u32), Vec<Split>> {
    let src = vertex_of(plan, "src");
    let splits = restored_splits(plan, src, m)
        .unwrap()
        .expect("the manifest has a registry");
    let (per, _) = assign_splits("src", splits, plan.vertices[src].parallelism);
    per.into_iter()
        .enumerate()
        .map(|(i, s)| ((src, i as u32), s))
        .collect()
}

#[test]
fn a_fresh_start_restores_nothing() {
    let plan = common::plan(2, 8);
    let r = plan_restore(&plan, None, false, &BTreeMap::new()).unwrap();
    assert_eq!(
        r.len(),
        plan.vertices
            .iter()
            .map(|v| v.subtasks.len())
            .sum::<usize>()
    );
    assert!(
        r.values()
            .all(|t| t.epoch.is_none() && t.segments.is_empty() && t.pending.is_empty())
    );
}

#[test]
fn same_plan_gives_each_task_its_own_snapshot_and_owned_segments() {
    let plan = common::plan(2, 8);
    let m = manifest(&plan, 5);
    let r = plan_restore(&plan, Some(&m), false, &split_map(&plan, &m)).unwrap();
    let agg = vertex_of(&plan, "agg");
    let out = vertex_of(&plan, "out");
    for st in &plan.vertices[agg].subtasks {
        let t = &r[&st.task];
        let shards: BTreeSet<u32> = t.segments.values().flatten().map(|s| s.shard).collect();
        let owned: BTreeSet<u32> = plan.vertices[agg].owned_shards(st, 8).collect();
        assert_eq!(shards, owned, "{}", st.task);
        assert_eq!(t.epoch, Some(EpochId(7)));
        // The manifest records a watermark per channel (hosts before per-edge records).
        for ch in &st.inputs {
            assert_eq!(t.watermarks[&ch.to_string()], 100 + i64::from(st.index.0));
            assert_eq!(restored(t, ch), (Some(100 + i64::from(st.index.0)), false));
        }
    }
    for st in &plan.vertices[out].subtasks {
        assert_eq!(r[&st.task].pending.len(), 1);
        assert_eq!(r[&st.task].pending[0].txn, format!("txn-{}", st.index.0));
    }
    // Each reader gets the cursors of exactly its splits, decoded.
    let src = vertex_of(&plan, "src");
    for st in &plan.vertices[src].subtasks {
        let got: BTreeSet<&str> = r[&st.task].splits.keys().map(String::as_str).collect();
        let want: BTreeSet<String> = (0..5u32)
            .filter(|j| j % 2 == st.index.0)
            .map(|j| format!("s{j}"))
            .collect();
        assert_eq!(got, want.iter().map(String::as_str).collect());
        let s0 = r[&st.task].splits.get("s0");
        if let Some(c) = s0 {
            assert!(c.finished);
            assert_eq!(c.cursor, vec![0, 1]);
        }
    }
}

/// `manifest(plan)` with the watermarks of `agg` recorded per input edge, as tasks record
/// them ([`input_watermarks`]): the channel from upstream subtask `u` into `agg` subtask
/// `i` at `100 + 10 u + i`, ended where `ended(i, u)`.
fn edge_manifest(plan: &PartitionedPlan, ended: impl Fn(u32, u32) -> bool) -> EpochManifest {
    let mut m = manifest(plan, 4);
    let agg = vertex_of(plan, "agg");
    for st in &plan.vertices[agg].subtasks {
        let i = st.index.0;
        let channels: Vec<(ChannelId, i64, bool)> = st
            .inputs
            .iter()
            .map(|c| {
                let u = c.upstream.0;
                (
                    c.clone(),
                    100 + 10 * i64::from(u) + i64::from(i),
                    ended(i, u),
                )
            })
            .collect();
        let (watermarks, ended_inputs) =
            input_watermarks(channels.iter().map(|(c, w, e)| (c, *w, *e)));
        let snap = m.tasks.iter_mut().find(|t| t.task == st.task).unwrap();
        snap.watermarks = watermarks;
        snap.ended_inputs = ended_inputs;
    }
    m
}

#[test]
fn watermarks_recorded_per_edge_restore_each_channel_at_its_edges_minimum() {
    let plan = common::plan(2, 8);
    let agg = vertex_of(&plan, "agg");
    // agg 0: the channel from src 1 ended; agg 1: both channels ended.
    let m = edge_manifest(&plan, |i, u| i == 1 || u == 1);
    for st in &plan.vertices[agg].subtasks {
        let snap = m.tasks.iter().find(|t| t.task == st.task).unwrap();
        assert_eq!(snap.watermarks.len(), 1, "one watermark per input edge");
    }
    let r = plan_restore(&plan, Some(&m), false, &split_map(&plan, &m)).unwrap();
    for st in &plan.vertices[agg].subtasks {
        let t = &r[&st.task];
        for ch in &st.inputs {
            let (w, ended) = restored(t, ch);
            match (st.index.0, ch.upstream.0) {
                // The open channel: the edge's minimum over open channels, its own.
                (0, 0) => assert_eq!((w, ended), (Some(100), false), "{ch}"),
                (0, _) => assert!(ended, "{ch}"),
                _ => assert_eq!((w, ended), (Some(i64::MAX), true), "{ch}"),
            }
        }
    }
    // Rescaled: the minimum over the old open channels; not ended, as one was open.
    let new = common::plan(3, 8);
    let r = plan_restore(&new, Some(&m), true, &split_map(&new, &m)).unwrap();
    for st in &new.vertices[vertex_of(&new, "agg")].subtasks {
        let t = &r[&st.task];
        assert_eq!(t.watermarks.len(), 1, "{}", st.task);
        for ch in &st.inputs {
            assert_eq!(restored(t, ch), (Some(100), false), "{ch}");
        }
    }
    // Every old channel ended: every new one is ended.
    let m = edge_manifest(&plan, |_, _| true);
    let r = plan_restore(&new, Some(&m), true, &split_map(&new, &m)).unwrap();
    for st in &new.vertices[vertex_of(&new, "agg")].subtasks {
        for ch in &st.inputs {
            assert!(restored(&r[&st.task], ch).1, "{ch}");
        }
    }
}

#[test]
fn rescale_restores_conservatively_and_settles_sinks() {
    let old = common::plan(2, 8);
    let m = manifest(&old, 4);
    let new = common::plan(3, 8);
    assert_eq!(check_restore(&m, &new, Some(&old.fingerprint)), Ok(true));
    let r = plan_restore(&new, Some(&m), true, &split_map(&new, &m)).unwrap();
    let agg = vertex_of(&new, "agg");
    for st in &new.vertices[agg].subtasks {
        let t = &r[&st.task];
        assert!(t.pending.is_empty());
        // The minimum over both old subtasks' channels of the edge, once for the edge.
        for ch in &st.inputs {
            assert_eq!(restored(t, ch), (Some(100), false), "{ch}");
        }
        assert_eq!(t.watermarks.len(), 1, "one entry per input edge");
    }
    let settle = sink_settlements(&new, &m);
    assert_eq!(settle.len(), 2, "both old sink subtasks settle");
    assert!(
        settle
            .iter()
            .all(|s| s.parallelism == 2 && s.commit.len() == 1)
    );
}

#[test]
fn a_changed_plan_without_a_rescale_action_is_refused() {
    let old = common::plan(2, 8);
    let m = manifest(&old, 1);
    let err = check_restore(&m, &common::plan(3, 8), None).unwrap_err();
    assert!(
        matches!(&err, CoordinatorError::Restore { epoch: 7, message } if message.contains("plan fingerprint differs")),
        "{err}"
    );
    let err = check_restore(&m, &common::plan(2, 16), Some(&old.fingerprint)).unwrap_err();
    assert!(
        err.to_string().contains("state shard count differs"),
        "{err}"
    );
}

/// A manifest recorded before fingerprints hashed canonical forms holds the
/// declaration-order fingerprint of the same plan: it still restores, while another
/// plan's old fingerprint is still refused.
#[test]
fn a_manifest_with_the_old_fingerprint_scheme_still_restores() {
    let plan = common::plan(2, 8);
    let mut m = manifest(&plan, 1);
    m.plan_fingerprint = nop_stream_core::declaration_order_fingerprint_of(&plan);
    assert_ne!(m.plan_fingerprint, plan.fingerprint);
    assert_eq!(check_restore(&m, &plan, None), Ok(false));
    m.plan_fingerprint = nop_stream_core::declaration_order_fingerprint_of(&common::plan(3, 8));
    assert!(check_restore(&m, &plan, None).is_err());
}

#[test]
fn a_malformed_cursor_is_refused_naming_the_split() {
    let plan = common::plan(1, 4);
    let mut m = manifest(&plan, 2);
    for t in &mut m.tasks {
        for s in &mut t.splits {
            s.cursor = "zz".into();
        }
    }
    let err = plan_restore(&plan, Some(&m), false, &split_map(&plan, &m)).unwrap_err();
    assert!(
        err.to_string().contains("split `s0`: cursor is not hex"),
        "{err}"
    );
}

#[test]
fn splits_go_round_robin_in_registry_order() {
    let splits: Vec<Split> = (0..7)
        .map(|j| Split {
            id: format!("s{j}"),
            descriptor: vec![j],
        })
        .collect();
    let (per, reg) = assign_splits("src", splits, 3);
    let ids: Vec<Vec<&str>> = per
        .iter()
        .map(|s| s.iter().map(|s| s.id.as_str()).collect())
        .collect();
    assert_eq!(
        ids,
        [vec!["s0", "s3", "s6"], vec!["s1", "s4"], vec!["s2", "s5"]]
    );
    assert_eq!(reg.splits[4], ("s4".to_owned(), 1));
}

proptest! {
    /// Rescaling N -> M moves whole shards: every segment of the checkpoint is restored by
    /// exactly one new subtask, and each by the subtask that now owns its shard.
    #[test]
    fn rescale_moves_each_shard_to_exactly_one_owner(from in 1u32..6, to in 1u32..6, shard_pow in 2u32..6) {
        let shards = 1 << shard_pow;
        prop_assume!(from <= shards && to <= shards);
        let old = common::plan(from, shards);
        let m = manifest(&old, 3);
        let new = common::plan(to, shards);
        let rescale = check_restore(&m, &new, Some(&old.fingerprint)).unwrap();
        prop_assert_eq!(rescale, from != to);
        let r = plan_restore(&new, Some(&m), rescale, &split_map(&new, &m)).unwrap();
        let agg = vertex_of(&new, "agg");
        let mut seen = BTreeMap::<u32, TaskId>::new();
        for st in &new.vertices[agg].subtasks {
            for seg in r[&st.task].segments.values().flatten() {
                prop_assert!(new.vertices[agg].owned_shards(st, shards).contains(&seg.shard));
                prop_assert!(seen.insert(seg.shard, st.task.clone()).is_none(), "shard {} restored twice", seg.shard);
            }
        }
        prop_assert_eq!(seen.len() as u32, shards);
        // Every split cursor lands with exactly one reader.
        let src = vertex_of(&new, "src");
        let mut cursors = 0;
        for st in &new.vertices[src].subtasks {
            cursors += r[&st.task].splits.len();
        }
        prop_assert_eq!(cursors, 3);
    }
}

/// A manifest of [`common::two_sources_plan`] at epoch 7: both sources own splits
/// `0..n` (the same ids, as two file sources over one file have), round robin over their
/// readers, each cursor naming its source and split.
fn two_sources_manifest(plan: &PartitionedPlan, n: u32) -> EpochManifest {
    let mut m = manifest_with(plan, |vi, st, snap| {
        let v = &plan.vertices[vi];
        let head = v.operators[0].name.clone();
        if v.operators[0].kind != nop_stream_api::PluginKind::Source {
            return;
        }
        for j in (0..n).filter(|j| j % v.parallelism == st) {
            snap.splits.push(SplitState {
                split_id: j.to_string(),
                descriptor: hex::encode(format!("{head}-d{j}")),
                cursor: hex::encode(format!("{head}-c{j}")),
                finished: head == "slow" && j == 0,
                max_timestamp: None,
            });
        }
    });
    m.enumerators = ["fast", "slow"]
        .iter()
        .map(|name| {
            let vi = vertex_of(plan, name);
            EnumeratorState {
                operator_id: plan.vertices[vi].operators[0].operator_id.to_string(),
                splits: (0..n)
                    .map(|j| (j.to_string(), j % plan.vertices[vi].parallelism))
                    .collect(),
                finished: Vec::new(),
            }
        })
        .collect();
    m.seal();
    m
}

/// A bare manifest of `plan` at epoch 7 whose task snapshots `fill` completes.
fn manifest_with(
    plan: &PartitionedPlan,
    mut fill: impl FnMut(usize, u32, &mut TaskSnapshot),
) -> EpochManifest {
    let mut tasks = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        for st in &v.subtasks {
            let mut snap = TaskSnapshot {
                task: st.task.clone(),
                epoch: EpochId(7),
                end_of_data: false,
                segments: Vec::new(),
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
            };
            fill(vi, st.index.0, &mut snap);
            tasks.push(snap);
        }
    }
    EpochManifest {
        epoch: EpochId(7),
        job_id: plan.job.job_id.to_string(),
        pipeline_id: plan.job.pipeline_id.to_string(),
        namespace: "ns".into(),
        plan_fingerprint: plan.fingerprint.clone(),
        state_shard_count: plan.job.state_shard_count,
        attempt: AttemptId(1),
        fencing_token: FencingToken(1),
        final_epoch: false,
        enumerators: Vec::new(),
        tasks,
        state_format_version: STATE_FORMAT_VERSION,
        created_ms: 0,
        durable_ms: 0,
        meta: None,
        checksum: String::new(),
    }
}

/// The split map of a restore of `plan` from `m`: each source's registry, assigned to its
/// readers, as the coordinator does.
fn split_map_all(plan: &PartitionedPlan, m: &EpochManifest) -> BTreeMap<(usize, u32), Vec<Split>> {
    let mut out = BTreeMap::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        if v.operators[0].kind != nop_stream_api::PluginKind::Source {
            continue;
        }
        let splits = restored_splits(plan, vi, m)
            .unwrap()
            .expect("the manifest has a registry for every source");
        let (per, _) = assign_splits(v.operators[0].operator_id.as_str(), splits, v.parallelism);
        for (i, s) in per.into_iter().enumerate() {
            out.insert((vi, i as u32), s);
        }
    }
    out
}

proptest! {
    /// Regression: two sources with equal split ids swapped their cursors on restore (the
    /// cursors were collected by split id alone, so the later source's overwrote the
    /// earlier's) and the fast source resumed from the slow one's position, committing
    /// duplicates. Whatever the parallelisms before and after, every reader restores its
    /// own source's cursor and descriptor for each of its splits, and each split of each
    /// source lands with exactly one reader.
    #[test]
    fn two_sources_with_equal_split_ids_keep_their_own_cursors(
        p in 1u32..4, q in 1u32..4, p2 in 1u32..4, q2 in 1u32..4, n in 1u32..6,
    ) {
        let old = common::two_sources_plan(p, q);
        let m = two_sources_manifest(&old, n);
        let new = common::two_sources_plan(p2, q2);
        let rescale = check_restore(&m, &new, Some(&old.fingerprint)).unwrap();
        let splits = split_map_all(&new, &m);
        let r = plan_restore(&new, Some(&m), rescale, &splits).unwrap();
        for name in ["fast", "slow"] {
            let vi = vertex_of(&new, name);
            let mut seen = BTreeSet::new();
            for st in &new.vertices[vi].subtasks {
                for s in &splits[&(vi, st.index.0)] {
                    prop_assert_eq!(s.descriptor.clone(), format!("{name}-d{}", s.id).into_bytes());
                }
                for (id, c) in &r[&st.task].splits {
                    prop_assert_eq!(c.cursor.clone(), format!("{name}-c{id}").into_bytes(), "{} of {}", id, name);
                    prop_assert_eq!(c.finished, name == "slow" && id == "0");
                    prop_assert!(seen.insert(id.clone()), "split {} of {} restored twice", id, name);
                }
            }
            prop_assert_eq!(seen.len() as u32, n, "every split of {} restored", name);
        }
    }
}
