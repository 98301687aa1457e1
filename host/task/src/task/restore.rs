//! What a task reads back from checkpoint storage before it runs (design §10.1, §10.5):
//! each stateful operator's keyed state and timers from the segments the restore plan
//! names, and its non-keyed operator state redistributed to the new subtasks.

use super::{Stage, StageSpec};
use crate::segment::read_segment;
use nop_stream_api::{AttemptId, TaskId};
use nop_stream_checkpoint::{Namespace, SegmentDescriptor, payload};
use nop_stream_plugin_host::{OperatorInstance, Result, RuntimeError, Site, op_state};
use nop_stream_proto::TaskRestorePlan;
use nop_stream_state::ShardSnapshot;

/// Restores the keyed state and timers (the `__timers` state) of every stateful operator
/// of `stages` from the segments `restore` names; the task reads them itself (design
/// §2.5). Returns each stage's chain to go on from: with incremental snapshots, the
/// restored segments (the restored state equals them exactly, so the next snapshot may be
/// a delta on top of them); otherwise, or for a stage with nothing restored, `None`.
///
/// # Errors
/// As [`read_shards`]; [`RuntimeError::Io`] if a state cannot take the payloads.
pub(super) fn restore_keyed_state(
    stages: &mut [Stage],
    specs: &[StageSpec],
    sites: &[Site],
    restore: &TaskRestorePlan,
    storage: &Namespace,
    incremental: bool,
    (task, attempt): (&TaskId, AttemptId),
) -> Result<Vec<Option<Vec<SegmentDescriptor>>>> {
    let started = std::time::Instant::now();
    let (mut restored_segments, mut restored_deltas) = (0usize, 0usize);
    // Of the time, reading and checking the segments.
    let mut read = std::time::Duration::ZERO;
    let mut chains = vec![None; stages.len()];
    for (i, stage) in stages.iter_mut().enumerate() {
        let Stage::Operator(op) = stage else {
            continue;
        };
        let Some(segments) = restore.segments.get(&specs[i].operator_id) else {
            continue;
        };
        let mut states = specs[i].plugin.info.states.clone();
        states.push(nop_stream_plugin_host::timer_descriptor());
        let read_started = std::time::Instant::now();
        let state = read_shards(
            storage,
            restore.epoch.map_or(0, |e| e.0),
            &specs[i].operator_id,
            segments,
            &states,
        )?;
        read += read_started.elapsed();
        if let Some(ks) = op.state_mut() {
            ks.restore(&state).map_err(|e| RuntimeError::Io {
                path: format!("checkpoint of operator `{}`", sites[i].operator),
                message: format!("cannot restore keyed state: {e}"),
            })?;
        }
        op.reload_timers()?;
        restored_segments += segments.len();
        restored_deltas += segments
            .iter()
            .filter(|s| s.codec == payload::KV_DELTA_CODEC)
            .count();
        if incremental {
            chains[i] = Some(segments.clone());
        }
    }
    if let Some(epoch) = restore.epoch {
        // Read by `nopstream-bench cluster-recovery` (target `nopstream::restore`).
        tracing::debug!(
            target: "nopstream::restore",
            %task, %attempt, epoch = epoch.0, segments = restored_segments,
            deltas = restored_deltas,
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            read_ms = read.as_secs_f64() * 1000.0,
            "task state restored"
        );
    }
    Ok(chains)
}

/// Reads every old subtask's segments of `operator_id`'s non-keyed operator states and
/// gives the instance its entries by each state's redistribution policy (design §16,
/// "Operator state"; [`nop_stream_plugin_host::op_state::redistribute`]).
///
/// # Errors
/// [`RuntimeError::Restore`] for a failed read or checksum, a malformed payload, a state
/// the plugin no longer declares or whose schema version differs, or a refused
/// redistribution (duplicate ids, differing broadcast copies, a `none` state rescaled).
pub(super) fn restore_operator_state(
    op: &mut OperatorInstance,
    storage: &Namespace,
    epoch: u64,
    operator_id: &str,
    r: &nop_stream_proto::OperatorStateRestore,
    task: &nop_stream_api::TaskInfo,
) -> Result<()> {
    let refuse = |message: String| RuntimeError::Restore { epoch, message };
    let states = op.operator_state_mut();
    let descriptors = states.descriptors().to_vec();
    // Per declared state, per old subtask: its entries.
    let mut old: Vec<Vec<op_state::Entries>> =
        vec![vec![Vec::new(); r.old_parallelism as usize]; descriptors.len()];
    // States without a segment (new, or dropped by an action) start empty.
    let mut stored = vec![false; descriptors.len()];
    for seg in &r.segments {
        let Some(h) = descriptors.iter().position(|d| d.name == seg.state) else {
            return Err(refuse(format!(
                "operator `{operator_id}` no longer declares operator state `{}`",
                seg.state
            )));
        };
        // At the same parallelism only `union` hands a subtask other subtasks' entries:
        // the rest is not read.
        if r.old_parallelism == task.parallelism
            && descriptors[h].redistribution != nop_stream_api::Redistribution::Union
            && seg.shard != task.subtask_index
        {
            stored[h] = true;
            continue;
        }
        if descriptors[h].schema_version != seg.schema_version {
            return Err(refuse(format!(
                "operator state `{}` of operator `{operator_id}` has schema version {} in the checkpoint but {} in the plugin; drop it with a drop-state action",
                seg.state, seg.schema_version, descriptors[h].schema_version
            )));
        }
        let bytes = read_segment(storage, seg).map_err(refuse)?;
        let entries = op_state::decode(&bytes)
            .map_err(|e| refuse(format!("segment {}: {e}", seg.state_path)))?;
        let Some(slot) = old[h].get_mut(seg.shard as usize) else {
            return Err(refuse(format!(
                "segment {} names subtask {} of parallelism {}",
                seg.state_path, seg.shard, r.old_parallelism
            )));
        };
        *slot = entries;
        stored[h] = true;
    }
    for (h, d) in descriptors.iter().enumerate() {
        if !stored[h] {
            continue;
        }
        let entries = op_state::redistribute(
            &d.name,
            d.redistribution,
            &old[h],
            task.subtask_index,
            task.parallelism,
        )
        .map_err(|e| refuse(format!("operator `{operator_id}`: {e}")))?;
        states
            .set_entries(h as u32, entries)
            .map_err(|e| refuse(format!("operator `{operator_id}`: {e}")))?;
    }
    Ok(())
}

/// Reads and verifies the segments `segments` of `operator_id` from checkpoint storage and
/// maps each to the plugin's state index; `epoch` names the manifest in errors.
///
/// # Errors
/// [`RuntimeError::Restore`] for a failed read or checksum, a state the plugin no longer
/// declares, or a schema version that differs (an explicit migration is needed).
fn read_shards(
    storage: &Namespace,
    epoch: u64,
    operator_id: &str,
    segments: &[SegmentDescriptor],
    states: &[nop_stream_api::StateDescriptor],
) -> Result<Vec<ShardSnapshot>> {
    let refuse = |message: String| RuntimeError::Restore { epoch, message };
    let mut out = Vec::with_capacity(segments.len());
    for seg in segments {
        let Some(i) = states.iter().position(|d| d.name == seg.state) else {
            return Err(refuse(format!(
                "operator `{operator_id}` no longer declares state `{}`",
                seg.state
            )));
        };
        if states[i].schema_version != seg.schema_version {
            return Err(refuse(format!(
                "state `{}` of operator `{operator_id}` has schema version {} in the checkpoint but {} in the plugin; an explicit migration is needed",
                seg.state, seg.schema_version, states[i].schema_version
            )));
        }
        let delta = match seg.codec.as_str() {
            payload::KV_CODEC => false,
            payload::KV_DELTA_CODEC => true,
            other => {
                return Err(refuse(format!(
                    "segment {} has payload codec `{other}`; this host reads {} and {}",
                    seg.state_path,
                    payload::KV_CODEC,
                    payload::KV_DELTA_CODEC
                )));
            }
        };
        out.push(ShardSnapshot {
            shard: nop_stream_api::StateShardId(seg.shard),
            state: i as u32,
            entries: seg.entries,
            payload: Vec::new(),
            delta,
        });
    }
    for (snapshot, bytes) in out.iter_mut().zip(read_segments(storage, segments)) {
        snapshot.payload = bytes.map_err(refuse)?;
    }
    Ok(out)
}

/// Restores reading fewer segment bytes than this read them on the calling thread (4 MiB).
const PARALLEL_READ_BYTES: u64 = 4 << 20;

/// Most threads a restore reads segments on: an object store's latency, not this
/// machine's cores, bounds a read, so more threads than cores help there.
const MAX_READ_THREADS: usize = 8;

/// Each of `segments` read and its checksum verified ([`read_segment`]), in order; on
/// several threads when there are several segments of at least [`PARALLEL_READ_BYTES`]
/// in all (design §10.5 leaves the order of reads free: the chain order is kept in the
/// result).
fn read_segments(
    storage: &Namespace,
    segments: &[SegmentDescriptor],
) -> Vec<std::result::Result<Vec<u8>, String>> {
    let bytes: u64 = segments.iter().map(|s| s.len).sum();
    let threads = MAX_READ_THREADS.min(segments.len());
    if threads <= 1 || bytes < PARALLEL_READ_BYTES {
        return segments.iter().map(|s| read_segment(storage, s)).collect();
    }
    // Segments handed out one at a time, so a slow read does not hold up a thread's share.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut read: Vec<(usize, std::result::Result<Vec<u8>, String>)> =
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(seg) = segments.get(i) else {
                                return mine;
                            };
                            mine.push((i, read_segment(storage, seg)));
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        });
    read.sort_unstable_by_key(|(i, _)| *i);
    read.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_checkpoint::payload_checksum;

    /// Six segments of 1 MiB in two files (more than the parallel threshold): read back on
    /// several threads, each equals what was written, in the order asked; a corrupt one
    /// fails alone, named, and its neighbours still read.
    #[test]
    fn segments_read_on_several_threads_come_back_in_order_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let storage =
            Namespace::open(&nop_stream_checkpoint::Location::Local(dir.path().into())).unwrap();
        let mut segments = Vec::new();
        let mut written = Vec::new();
        for file in ["a/seg", "b/seg"] {
            let mut bytes = Vec::new();
            for i in 0..3u8 {
                let payload: Vec<u8> = (0..1u32 << 20)
                    .map(|j| (j as u8) ^ i ^ file.as_bytes()[0])
                    .collect();
                segments.push(SegmentDescriptor {
                    state_path: format!("{file}/{i}"),
                    operator_id: "op".into(),
                    shard: u32::from(i),
                    state: "s".into(),
                    file: file.into(),
                    offset: bytes.len() as u64,
                    len: payload.len() as u64,
                    checksum: payload_checksum(&payload),
                    codec: payload::KV_CODEC.into(),
                    schema_version: 1,
                    entries: 0,
                });
                bytes.extend_from_slice(&payload);
                written.push(payload);
            }
            storage.write_segment(file, &bytes).unwrap();
        }
        let read = read_segments(&storage, &segments);
        assert_eq!(read.len(), written.len());
        for (r, w) in read.iter().zip(&written) {
            assert_eq!(r.as_ref().unwrap(), w);
        }
        segments[4].checksum = payload_checksum(b"something else");
        let read = read_segments(&storage, &segments);
        for (i, r) in read.iter().enumerate() {
            match i {
                4 => assert_eq!(
                    r.as_ref().unwrap_err(),
                    "segment b/seg/1 failed its checksum"
                ),
                _ => assert_eq!(r.as_ref().unwrap(), &written[i]),
            }
        }
    }
}
