//! Task snapshots, segment descriptors and epoch manifests (design §5.5, §5.6, §8.2). All
//! metadata is JSON; payloads live in segment files named by the descriptors.

use nop_stream_api::{AttemptId, EpochId, FencingToken, TaskId};
use serde::{Deserialize, Serialize};

/// Version of the manifest and segment formats; restore refuses another.
pub const STATE_FORMAT_VERSION: u32 = 2;

/// Where one keyed-state shard of one state lives (design §8.2: operatorId + subtask +
/// shard + state name). Several descriptors may point into one packed segment file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentDescriptor {
    /// Logical StatePath (design §3.5):
    /// `checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/{shard}/{stateName}`.
    pub state_path: String,
    /// Operator id.
    pub operator_id: String,
    /// State shard.
    pub shard: u32,
    /// State name (`__timers` for the timer service).
    pub state: String,
    /// Segment file, relative to the checkpoint namespace directory.
    pub file: String,
    /// Byte offset of the payload in the file.
    pub offset: u64,
    /// Payload length in bytes.
    pub len: u64,
    /// xxh3-64 of the payload, hex.
    pub checksum: String,
    /// Payload codec: `kv-lp/1` (a full payload: length-prefixed key/value pairs) or
    /// `kv-delta/1` (the changes since the previous snapshot of the same subtask); see
    /// [`crate::payload`].
    pub codec: String,
    /// Schema version of the state's values, from the plugin's state descriptor.
    pub schema_version: u32,
    /// Number of entries.
    pub entries: u64,
}

/// Cursor state of one source split (design §6.2–§6.4).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SplitState {
    /// Split id.
    pub split_id: String,
    /// Split descriptor, hex.
    pub descriptor: String,
    /// Exclusive next cursor, hex (empty: the split's start).
    pub cursor: String,
    /// Whether the split was read to its end.
    pub finished: bool,
    /// Largest event timestamp read from the split so far (ms), when the source derives
    /// watermarks (design §8.5); restores the split's watermark.
    #[serde(default)]
    pub max_timestamp: Option<i64>,
}

/// JSON (manifests) leaves out an absent `max_timestamp`, so manifests written before the
/// field existed keep their checksums; compact binary encodings (the control plane's
/// postcard) always carry every field, since they cannot skip one.
impl Serialize for SplitState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let skip = s.is_human_readable() && self.max_timestamp.is_none();
        let mut st = s.serialize_struct("SplitState", if skip { 4 } else { 5 })?;
        st.serialize_field("split_id", &self.split_id)?;
        st.serialize_field("descriptor", &self.descriptor)?;
        st.serialize_field("cursor", &self.cursor)?;
        st.serialize_field("finished", &self.finished)?;
        if skip {
            st.skip_field("max_timestamp")?;
        } else {
            st.serialize_field("max_timestamp", &self.max_timestamp)?;
        }
        st.end()
    }
}

/// A pre-committed sink transaction waiting for its epoch to become durable (design §7.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingTransaction {
    /// Epoch whose barrier sealed the transaction; it commits once an epoch `>=` this one
    /// is durable.
    pub epoch: EpochId,
    /// Transaction id `{jobId}:{pipelineId}:{operatorId}:{subtask}:{epoch}` (design §7.2).
    pub txn: String,
    /// Committable bytes, hex.
    pub committable: String,
}

/// What one task reports for an epoch (design §5.5).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TaskSnapshot {
    /// Stable task identity (no attempt).
    pub task: TaskId,
    /// Epoch.
    pub epoch: EpochId,
    /// Whether the task had processed the end of all its input before the barrier.
    pub end_of_data: bool,
    /// Keyed state and timer segments of every stateful operator of the chain. With
    /// incremental snapshots, per operator its whole chain: the last full snapshot's
    /// descriptors, then every delta's since, oldest first (so descriptors of earlier
    /// epochs' files appear here too, and one (shard, state) may appear several times;
    /// restore applies them in this order).
    pub segments: Vec<SegmentDescriptor>,
    /// Non-keyed operator state of the chain's operators (WIT `operator-state`, design §10.6):
    /// one descriptor per operator and declared operator state, its `shard` holding this
    /// task's subtask index and its StatePath
    /// `checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/operator/{stateName}` (design §3.5);
    /// payload codec `kv-lp/1` with the entry ids as keys. Absent from manifests of jobs
    /// without operator state (and of hosts before it), so their checksums are unchanged.
    #[serde(default)]
    pub operator_state: Vec<SegmentDescriptor>,
    /// Source split cursors (source tasks).
    pub splits: Vec<SplitState>,
    /// Last watermark of the task's input channels, ms: since this host one entry per input
    /// edge (`edge id -> ms`, the minimum over the edge's channels that had not ended,
    /// `i64::MAX` when all had; [`input_watermarks`]), before it one per channel
    /// (`channel id -> ms`). A restore looks a channel up by its own id first, then by its
    /// edge's ([`restored_channel`]).
    pub watermarks: Vec<(String, i64)>,
    /// Input channels that had delivered their end of data before the barrier: channel
    /// ids, or an edge id when every channel of that edge had (since this host).
    #[serde(default)]
    pub ended_inputs: Vec<String>,
    /// Pre-committed transactions of the sink at the chain's tail, all epochs `<=` this.
    pub pending_transactions: Vec<PendingTransaction>,
    /// Operator id of the sink at the tail, if any.
    pub sink_operator: Option<String>,
    /// Bytes of state written for this epoch.
    pub snapshot_bytes: u64,
    /// Time from the first barrier to the last one of the task (alignment), ms.
    pub alignment_ms: u64,
    /// Time the task thread spent on the snapshot, ms: the stall in which it processed
    /// nothing (operators' prepare, sink pre-commit, the keyed state's flush and frozen
    /// view, operator state; with synchronous snapshots also the scan and segment writes).
    pub duration_ms: u64,
    /// Time of the background part of an asynchronous snapshot, ms: from the frozen view
    /// to the segment files being durable (scan, writes, fsync), including any wait for
    /// the background thread to start. `0` for synchronous snapshots; absent from
    /// manifests when `0`, so manifests written before it keep their checksums.
    #[serde(default)]
    pub async_ms: u64,
    /// Bytes of full payloads a background compaction of incremental snapshots wrote
    /// since the task's previous snapshot (design §5.5, §8.1): the compacted chains this
    /// snapshot adopted. Not part of `snapshot_bytes`. Absent from manifests when `0`.
    #[serde(default)]
    pub compacted_bytes: u64,
    /// Records that entered the task's chain (read by a source head, or received) over
    /// every attempt up to this epoch's barrier: restored with the checkpoint, so at the
    /// final epoch a source's total is every record it read exactly once. Absent from
    /// manifests when `0` (and in those of hosts before it).
    #[serde(default)]
    pub records_in_total: u64,
    /// Records the task emitted (written by a sink at the tail) up to this epoch's
    /// barrier, over every attempt, restored likewise: a sink's total at an epoch counts
    /// exactly the records of its transactions up to that epoch. Absent when `0`.
    #[serde(default)]
    pub records_out_total: u64,
    /// Wall-clock time the task saw the epoch's first barrier, ms since the Unix epoch:
    /// for a source the moment it injected the barrier, for any other task the arrival of
    /// the first input's barrier (the start of its alignment). Against the epoch's
    /// creation time in the epoch log it gives the checkpoint start delay (design §15).
    /// Clocks of different machines are compared, as Flink's start delay does. `0`:
    /// unknown; absent from manifests when `0`.
    #[serde(default)]
    pub barrier_unix_ms: u64,
}

/// JSON (manifests) leaves out an empty `operator_state` and zero `async_ms`,
/// `compacted_bytes`, record totals and `barrier_unix_ms`, so manifests of jobs without them (and written
/// before they existed) keep their checksums; compact binary encodings (the control plane's postcard) always carry every
/// field, since they cannot skip one.
impl Serialize for TaskSnapshot {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let readable = s.is_human_readable();
        let skip = readable && self.operator_state.is_empty();
        let skip_async = readable && self.async_ms == 0;
        let skip_compacted = readable && self.compacted_bytes == 0;
        let skip_in = readable && self.records_in_total == 0;
        let skip_out = readable && self.records_out_total == 0;
        let skip_barrier = readable && self.barrier_unix_ms == 0;
        let fields = 18
            - usize::from(skip_barrier)
            - usize::from(skip)
            - usize::from(skip_async)
            - usize::from(skip_compacted)
            - usize::from(skip_in)
            - usize::from(skip_out);
        let mut st = s.serialize_struct("TaskSnapshot", fields)?;
        st.serialize_field("task", &self.task)?;
        st.serialize_field("epoch", &self.epoch)?;
        st.serialize_field("end_of_data", &self.end_of_data)?;
        st.serialize_field("segments", &self.segments)?;
        if skip {
            st.skip_field("operator_state")?;
        } else {
            st.serialize_field("operator_state", &self.operator_state)?;
        }
        st.serialize_field("splits", &self.splits)?;
        st.serialize_field("watermarks", &self.watermarks)?;
        st.serialize_field("ended_inputs", &self.ended_inputs)?;
        st.serialize_field("pending_transactions", &self.pending_transactions)?;
        st.serialize_field("sink_operator", &self.sink_operator)?;
        st.serialize_field("snapshot_bytes", &self.snapshot_bytes)?;
        st.serialize_field("alignment_ms", &self.alignment_ms)?;
        st.serialize_field("duration_ms", &self.duration_ms)?;
        if skip_async {
            st.skip_field("async_ms")?;
        } else {
            st.serialize_field("async_ms", &self.async_ms)?;
        }
        if skip_compacted {
            st.skip_field("compacted_bytes")?;
        } else {
            st.serialize_field("compacted_bytes", &self.compacted_bytes)?;
        }
        if skip_in {
            st.skip_field("records_in_total")?;
        } else {
            st.serialize_field("records_in_total", &self.records_in_total)?;
        }
        if skip_out {
            st.skip_field("records_out_total")?;
        } else {
            st.serialize_field("records_out_total", &self.records_out_total)?;
        }
        if skip_barrier {
            st.skip_field("barrier_unix_ms")?;
        } else {
            st.serialize_field("barrier_unix_ms", &self.barrier_unix_ms)?;
        }
        st.end()
    }
}

/// What a task records of its input channels at a barrier (design §8.5, §10.5): per input
/// edge one watermark, the minimum over the edge's channels that had not ended (`i64::MAX`
/// when all had), and the ended channels: the edge id alone when every channel of the edge
/// had ended, else each ended channel's id. `channels` yields `(channel, watermark ms,
/// ended)` in the task's input order; edges come out in order of first appearance.
///
/// One entry per edge rather than per channel keeps a snapshot O(edges) and a manifest
/// O(tasks): a hash edge of parallelism p has p² channels, and a watermark per channel made
/// an event-time job's manifest 233 MB at 10,000 subtasks (bench/RESULTS.md, "The
/// coordinator at scale"). A restore puts each channel at its edge's minimum: the task's
/// watermark (the minimum over its open channels) is exactly what it was, and a channel
/// whose sender was ahead is behind only until that sender's next watermark, which a
/// watermark can never overtake (it is conservative; the rescale path of restore planning
/// has always restored this way).
pub fn input_watermarks<'a>(
    channels: impl IntoIterator<Item = (&'a nop_stream_api::ChannelId, i64, bool)>,
) -> (Vec<(String, i64)>, Vec<String>) {
    // (edge, minimum over open channels, channels, ended channels)
    let mut edges: Vec<(
        &nop_stream_api::EdgeId,
        i64,
        usize,
        Vec<&nop_stream_api::ChannelId>,
    )> = Vec::new();
    for (channel, watermark, ended) in channels {
        let at = match edges.iter().position(|e| *e.0 == channel.edge) {
            Some(at) => at,
            None => {
                edges.push((&channel.edge, i64::MAX, 0, Vec::new()));
                edges.len() - 1
            }
        };
        let e = &mut edges[at];
        e.2 += 1;
        if ended {
            e.3.push(channel);
        } else {
            e.1 = e.1.min(watermark);
        }
    }
    let mut watermarks = Vec::with_capacity(edges.len());
    let mut ended = Vec::new();
    for (edge, min, channels, ended_channels) in edges {
        watermarks.push((edge.to_string(), min));
        if ended_channels.len() == channels {
            ended.push(edge.to_string());
        } else {
            ended.extend(ended_channels.iter().map(|c| c.to_string()));
        }
    }
    (watermarks, ended)
}

/// A channel's restored watermark and whether it had ended, from what a snapshot recorded
/// ([`TaskSnapshot::watermarks`], [`TaskSnapshot::ended_inputs`]) or a restore plan carries:
/// the channel's own entry if there is one (snapshots of hosts before
/// [`input_watermarks`]), else its edge's. `None` for the watermark: neither is recorded
/// (the channel starts at `i64::MIN`).
pub fn restored_channel(
    channel: &nop_stream_api::ChannelId,
    watermark: impl Fn(&str) -> Option<i64>,
    ended: impl Fn(&str) -> bool,
) -> (Option<i64>, bool) {
    let id = channel.to_string();
    let edge = channel.edge.to_string();
    (
        watermark(&id).or_else(|| watermark(&edge)),
        ended(&id) || ended(&edge),
    )
}

/// Global source enumerator state (design §6.3): every discovered split and its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnumeratorState {
    /// Source operator id.
    pub operator_id: String,
    /// Discovered splits in discovery order with their owning subtask.
    pub splits: Vec<(String, u32)>,
    /// Splits finished in this epoch.
    pub finished: Vec<String>,
}

/// The epoch manifest: published atomically once every task of the ACK set reported; the
/// only entry point of recovery (design §5.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochManifest {
    /// Epoch.
    pub epoch: EpochId,
    /// Job id.
    pub job_id: String,
    /// Pipeline id.
    pub pipeline_id: String,
    /// Checkpoint namespace.
    pub namespace: String,
    /// Fingerprint of the PartitionedPlan the epoch was taken with.
    pub plan_fingerprint: String,
    /// `stateShardCount` of the plan.
    pub state_shard_count: u32,
    /// Attempt that produced the epoch.
    pub attempt: AttemptId,
    /// Fencing token of that attempt.
    pub fencing_token: FencingToken,
    /// Whether this is the final epoch of a bounded job (design §5.9).
    pub final_epoch: bool,
    /// Every task's snapshot.
    pub tasks: Vec<TaskSnapshot>,
    /// Source enumerators.
    pub enumerators: Vec<EnumeratorState>,
    /// Format version of manifest and segments.
    pub state_format_version: u32,
    /// When the epoch was created, ms since the Unix epoch.
    pub created_ms: u64,
    /// When the manifest was written, ms since the Unix epoch.
    pub durable_ms: u64,
    /// What a compatibility check needs of the job (design §10.4); absent in manifests
    /// written before it was recorded (those keep their checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<crate::meta::SnapshotMeta>,
    /// xxh3-64 (hex) of the manifest JSON with this field empty.
    pub checksum: String,
}

impl EpochManifest {
    /// Computes the checksum over the manifest with `checksum` empty.
    pub fn compute_checksum(&self) -> String {
        let mut m = self.clone();
        m.checksum = String::new();
        let bytes = serde_json::to_vec(&m).unwrap_or_default();
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
    }

    /// Sets the checksum (as [`Self::compute_checksum`], without copying the manifest).
    pub fn seal(&mut self) {
        self.seal_encoded_into(&mut Vec::new());
    }

    /// Seals the manifest (as [`Self::seal`]) and leaves in `out` (cleared first) the JSON a
    /// checkpoint store keeps of it, compact, from a single encoding: the checksum is taken
    /// over the encoding with `checksum` empty, then spliced into those bytes, since it is
    /// the last field. `out` ends up equal to `serde_json::to_vec` of the sealed manifest.
    ///
    /// This is the epoch loop's per-epoch cost at scale (a 10,000-subtask manifest is about
    /// 6 MB of JSON; bench/RESULTS.md, "The coordinator at 10,000 subtasks"), so a caller
    /// that seals one manifest per epoch keeps `out` for its capacity: a fresh vector of
    /// that size per epoch is mapped, page-faulted in and unmapped again each time.
    pub fn seal_encoded_into(&mut self, out: &mut Vec<u8>) {
        self.checksum.clear();
        out.clear();
        // Writing into a vector cannot fail, and nothing in a manifest fails to encode.
        let _ = serde_json::to_writer(&mut *out, &*self);
        let checksum = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(out));
        const EMPTY_LAST: &[u8] = br#""checksum":""}"#;
        if out.ends_with(EMPTY_LAST) {
            out.truncate(out.len() - 2);
            out.extend_from_slice(checksum.as_bytes());
            out.extend_from_slice(b"\"}");
            self.checksum = checksum;
        } else {
            // Not reached while `checksum` is the struct's last field; stay correct anyway.
            self.checksum = checksum;
            out.clear();
            let _ = serde_json::to_writer(&mut *out, &*self);
        }
    }

    /// Whether the stored checksum matches.
    pub fn verify(&self) -> bool {
        self.checksum == self.compute_checksum()
    }

    /// Total snapshot bytes of the epoch.
    pub fn snapshot_bytes(&self) -> u64 {
        self.tasks.iter().map(|t| t.snapshot_bytes).sum()
    }

    /// Snapshot of `task`, if present.
    pub fn task(&self, task: &TaskId) -> Option<&TaskSnapshot> {
        self.tasks.iter().find(|t| &t.task == task)
    }

    /// The split states of source operator `source`, over all its subtasks.
    ///
    /// A split is identified by (source operator, split id), never by its id alone: two
    /// sources may name their splits alike (two file sources both call theirs `0`, `1`,
    /// ...), and a cursor of one must never restore the other (design §4). A source heads
    /// its vertex, so its tasks are the ones whose vertex id is the source's operator id.
    pub fn source_splits<'a>(&'a self, source: &'a str) -> impl Iterator<Item = &'a SplitState> {
        self.tasks
            .iter()
            .filter(move |t| t.task.vertex.as_str() == source)
            .flat_map(|t| &t.splits)
    }
}

/// Checksum of a segment payload (xxh3-64, hex).
pub fn payload_checksum(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{ChannelId, EdgeId, SubtaskIndex};

    fn ch(edge: &str, upstream: u32) -> ChannelId {
        ChannelId {
            edge: EdgeId::new(edge),
            upstream: SubtaskIndex(upstream),
            downstream: SubtaskIndex(0),
            index: 0,
        }
    }

    #[test]
    fn input_watermarks_are_one_per_edge_and_restore_every_channel() {
        // Edge a: three channels, one ended; edge b: both ended; edge c: one, open.
        let chans = [
            (ch("a", 0), 50, false),
            (ch("b", 0), 7, true),
            (ch("a", 1), 30, true),
            (ch("a", 2), 40, false),
            (ch("c", 0), i64::MIN, false),
            (ch("b", 1), 9, true),
        ];
        let (w, ended) = input_watermarks(chans.iter().map(|(c, w, e)| (c, *w, *e)));
        let edges = |v: &[(&str, i64)]| -> Vec<(String, i64)> {
            v.iter().map(|(e, w)| (e.to_string(), *w)).collect()
        };
        // In order of first appearance; the ended channel of `a` does not lower its minimum.
        assert_eq!(w, edges(&[("a", 40), ("b", i64::MAX), ("c", i64::MIN)]));
        assert_eq!(ended, vec![ch("a", 1).to_string(), "b".to_string()]);
        let restore = |c: &ChannelId| {
            restored_channel(
                c,
                |k| w.iter().find(|(e, _)| e == k).map(|(_, w)| *w),
                |k| ended.iter().any(|e| e == k),
            )
        };
        assert_eq!(restore(&ch("a", 0)), (Some(40), false));
        assert!(restore(&ch("a", 1)).1);
        assert_eq!(restore(&ch("a", 2)), (Some(40), false));
        assert_eq!(restore(&ch("b", 1)), (Some(i64::MAX), true));
        assert_eq!(restore(&ch("c", 0)), (Some(i64::MIN), false));
        assert_eq!(
            restore(&ch("z", 0)),
            (None, false),
            "an edge never recorded"
        );
    }

    #[test]
    fn a_channels_own_entry_wins_over_its_edges() {
        // Snapshots of hosts before per-edge watermarks name channels.
        let c = ch("a", 3);
        let own = c.to_string();
        let got = restored_channel(
            &c,
            |k| match k {
                k if k == own => Some(5),
                "a" => Some(1),
                _ => None,
            },
            |k| k == own,
        );
        assert_eq!(got, (Some(5), true));
    }
}
