//! The task driver: one thread per subtask runs its operator chain (design §19): a source
//! reader or an input gate at the head, operators in chain order, and either a sink or
//! the output edges at the tail. It takes part in the epoch protocol (design §5): sources
//! inject barriers at a safe point between reads after snapshotting their exclusive
//! cursors; multi-input tasks align barriers, holding back channels that already
//! delivered the current barrier; sinks pre-commit at the barrier, begin the next
//! transaction at once, and commit only when told that an epoch is durable.
//!
//! Snapshots are asynchronous by default ([`TaskSpec::async_snapshots`]): at the barrier
//! the task thread takes a frozen view of each operator's keyed state and forwards the
//! barrier; a snapshot thread (one per task and epoch, at most one alive per task) writes
//! the segment files, makes them durable and only then sends the Ack. A later barrier, the
//! end of data and the task's finish wait for it; a failing task stops and joins it.
//!
//! Snapshots are incremental by default ([`TaskSpec::incremental_snapshots`]): an
//! operator's keyed state hands over, per state and shard, only the keys written or
//! deleted since its previous snapshot (`kv-delta/1`), and its descriptors in the manifest
//! are its chain: the last full snapshot's, then every delta since, oldest first. Once
//! the deltas together are as large as the full payloads (so a restore reads at most
//! about twice the state) or [`MAX_DELTAS`] long, a background thread compacts the chain
//! into new full payloads while the task goes on taking deltas, and a later barrier
//! adopts them ([`crate::compaction`]). A task whose state starts empty begins with a
//! delta on nothing; the task thread takes a full snapshot itself only when its state
//! could not track its changes (opened on a non-empty database, or past the memory
//! budget), or when a compaction fails or cannot keep up. After a restore the chain goes
//! on from the one the task restored (the restore plan's segments of each operator, which
//! the restored state equals exactly).

use crate::compaction::{Compaction, CompactionSpec, MAX_DELTAS_COMPACTING};
use crate::error::{Result, RuntimeError, Site, printable_record};
use crate::error_policy;
use crate::job::JobProgress;
use crate::partition::OutputEdge;
use crate::plugin::{
    Instance, InstanceOptions, LoadedPlugin, OperatorInstance, Rejected, SinkInstance,
    SourceInstance,
};
use crate::transport::{ChannelReceiver, Message};
use crossbeam_channel::{Receiver, Select, Sender};
use nop_stream_api::{AttemptId, ChannelId, EpochId, TaskId};
use nop_stream_api::{Batch, Split, TaskInfo};
use nop_stream_checkpoint::alignment::{Aligner, Alignment as AlignOutcome};
use nop_stream_checkpoint::failpoint;
use nop_stream_checkpoint::payload;
use nop_stream_checkpoint::{
    Namespace, PendingTransaction, SegmentDescriptor, SplitState, TaskSnapshot, payload_checksum,
};
use nop_stream_core::{DEAD_LETTER_OUTPUT, ErrorPolicy, WatermarkSpec};
use nop_stream_proto::TaskRestorePlan;
use nop_stream_state::{ExpiredKeys, ShardSnapshot, SnapshotView};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often blocked loops look at the cancel flag.
const POLL: Duration = Duration::from_millis(50);

/// How long a task whose inputs are all empty sleeps, once, before it blocks on them.
///
/// A task that keeps up with its upstream finds its queue empty after every batch. Were
/// it to block at once, every batch would cost the upstream thread a futex wake and this
/// one a futex wait. A short sleep first lets the next batch arrive without either: a
/// sleeping task is not registered with the channel, so the send needs no wake. In
/// `count-ckpt` at 10 M bids (batches of 1024), where the keyed thread keeps up with the
/// parser's, the futex calls went from 19,062 to 1,465, the process's CPU from 1.68 to
/// 1.52 s and its wall time from 1.15 to 1.01 s (bench/RESULTS.md); 20, 50, 100 and 200 µs
/// were tried, 100 and 200 as good. It delays a message that arrives during the sleep by
/// at most this, plus the kernel's timer slack (50 µs by default), per hop.
const LINGER: Duration = Duration::from_micros(100);

pub(crate) type TaskEvent = nop_stream_proto::TaskEvent<RuntimeError>;
pub use nop_stream_proto::{TaskCommand, TaskReport};

/// One member of the chain, as planned.
pub(crate) struct StageSpec {
    pub plugin: Arc<LoadedPlugin>,
    pub options: InstanceOptions,
    pub task_info: TaskInfo,
    pub config: String,
    pub operator_id: String,
    /// What a guest error in `process` does to the record (job-file `on_error`).
    pub on_error: ErrorPolicy,
}

pub(crate) struct InputChannel {
    pub id: ChannelId,
    pub rx: ChannelReceiver,
    pub input_index: u32,
    pub watermark: i64,
    /// The sender said all its inputs are idle (design §8.5); cleared by records or a
    /// watermark.
    pub idle: bool,
    /// End of data received.
    pub ended: bool,
    /// The sender went away (after its end of data).
    pub closed: bool,
}

/// Everything a task thread needs.
pub(crate) struct TaskSpec {
    pub task: TaskId,
    pub attempt: AttemptId,
    pub stages: Vec<StageSpec>,
    pub inputs: Vec<InputChannel>,
    pub outputs: Vec<OutputEdge>,
    pub splits: Vec<Split>,
    /// Source heads: watermark generation from record timestamps.
    pub watermarks: Option<WatermarkSpec>,
    /// Source heads with `max_drift_ms`: the watermark table shared by the subtasks of
    /// the source, and this subtask's slot in it.
    pub alignment: Option<(Arc<WatermarkAlignment>, usize)>,
    pub batch_records: u32,
    /// Transaction id prefix of the sink at the tail (`{job}:{pipeline}:{op}:{subtask}:`).
    pub sink_txn_prefix: Option<String>,
    /// First epoch this attempt can create (names the first transaction).
    pub first_epoch: EpochId,
    pub restore: TaskRestorePlan,
    pub storage: Arc<Namespace>,
    pub namespace: String,
    pub events: Sender<TaskEvent>,
    pub commands: Receiver<TaskCommand>,
    pub progress: Arc<JobProgress>,
    pub cancel: Arc<AtomicBool>,
    /// Keyed-state snapshots are written by a background thread after the barrier (job
    /// file `async_snapshots`, default `true`).
    pub async_snapshots: bool,
    /// Keyed-state snapshots are incremental (job file `incremental_snapshots`, default
    /// `true`; see the [module docs](self)).
    pub incremental_snapshots: bool,
}

/// Longest chain of deltas after a full snapshot before a compaction of it starts (issue
/// 14 item 4): bounds the segments a restore opens even when deltas are tiny.
pub const MAX_DELTAS: u32 = 16;

/// Number of delta files in `chain`.
fn delta_files(chain: &[SegmentDescriptor]) -> usize {
    chain
        .iter()
        .filter(|d| d.codec == payload::KV_DELTA_CODEC)
        .map(|d| d.file.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Whether the next snapshot of an operator may be a delta on top of `chain`, its
/// keyed-state descriptors as of its last snapshot (a full snapshot's payloads, then each
/// delta's, oldest first): it is empty, or it holds fewer than [`MAX_DELTAS`] deltas (one
/// file each) and fewer delta bytes than full ones. Past that, a background compaction
/// folds it ([`crate::compaction`]).
fn extendable(chain: &[SegmentDescriptor]) -> bool {
    let (mut full_bytes, mut delta_bytes) = (0, 0);
    for d in chain {
        if d.codec == payload::KV_DELTA_CODEC {
            delta_bytes += d.len;
        } else {
            full_bytes += d.len;
        }
    }
    // An empty chain: nothing snapshotted yet (or an empty full snapshot), so a delta
    // holds the whole state on top of nothing.
    chain.is_empty() || (delta_files(chain) < MAX_DELTAS as usize && delta_bytes < full_bytes)
}

enum Stage {
    Source(SourceInstance),
    Operator(OperatorInstance),
    Sink(SinkInstance),
}

/// Watermarks of every subtask of one source, for watermark alignment
/// ([`WatermarkSpec::max_drift_ms`]). Finished or idle subtasks publish `i64::MAX`.
#[derive(Debug)]
pub(crate) struct WatermarkAlignment {
    watermarks: std::sync::Mutex<Vec<i64>>,
}

impl WatermarkAlignment {
    /// A table for a source of `subtasks` subtasks of which `local` run here: their slots
    /// start at `i64::MIN` (not read yet); the slots of subtasks elsewhere hold
    /// `i64::MAX` and never hold the local ones back.
    pub(crate) fn new(subtasks: usize, local: &std::collections::BTreeSet<usize>) -> Self {
        WatermarkAlignment {
            watermarks: std::sync::Mutex::new(
                (0..subtasks)
                    .map(|i| {
                        if local.contains(&i) {
                            i64::MIN
                        } else {
                            i64::MAX
                        }
                    })
                    .collect(),
            ),
        }
    }

    fn publish(&self, slot: usize, watermark: i64) {
        let mut w = self.watermarks.lock().unwrap_or_else(|p| p.into_inner());
        w[slot] = watermark;
    }

    /// The slowest watermark among the other subtasks.
    fn slowest_other(&self, slot: usize) -> i64 {
        let w = self.watermarks.lock().unwrap_or_else(|p| p.into_inner());
        w.iter()
            .enumerate()
            .filter(|(i, _)| *i != slot)
            .map(|(_, w)| *w)
            .min()
            .unwrap_or(i64::MAX)
    }
}

struct SplitCursor {
    split: Split,
    cursor: Vec<u8>,
    finished: bool,
    /// Largest event timestamp read (ms); `None` before the first timestamped record.
    max_ts: Option<i64>,
    /// When a read last returned records; `None` until the split is first read.
    last_records: Option<Instant>,
}

struct SinkState {
    prefix: String,
    txn: String,
    pending: Vec<PendingTransaction>,
}

struct Task {
    /// The background part of the last epoch's snapshot, if not joined yet. First field:
    /// dropped (aborted and joined) before the operators and their state databases.
    in_flight: Option<InFlightSnapshot>,
    /// See [`TaskSpec::async_snapshots`].
    async_snapshots: bool,
    /// Per stage, its keyed-state chain as of the last joined snapshot (see
    /// [`extendable`]; empty: nothing snapshotted yet; `None`: not incremental, or the
    /// next snapshot must be full after a failed compaction).
    chains: Vec<Option<Vec<SegmentDescriptor>>>,
    /// Per stage, its background compaction, if one runs or awaits adoption
    /// ([`crate::compaction`]).
    compactions: Vec<Option<Compaction>>,
    /// Bytes the compactions adopted since the last snapshot wrote (its `compacted_bytes`).
    compacted_bytes: u64,
    /// Records in and out of the chain over the attempts before this one, up to the
    /// restored epoch (its snapshot's totals): a snapshot's totals add this attempt's.
    restored_totals: (u64, u64),
    id: TaskId,
    attempt: AttemptId,
    stages: Vec<Stage>,
    sites: Vec<Site>,
    operator_ids: Vec<String>,
    /// Per stage, its error policy ([`Task::on_rejected`]).
    policies: Vec<ErrorPolicy>,
    outputs: Vec<OutputEdge>,
    inputs: Vec<InputChannel>,
    splits: Vec<SplitCursor>,
    /// The split [`Task::read_once`] tries first: reads go round-robin over the unfinished
    /// splits, so one busy unbounded split cannot starve the others of this subtask.
    next_split: usize,
    /// Consecutive reads that returned no records; after a whole round of them the task
    /// sleeps 1 ms instead of spinning.
    empty_reads: usize,
    watermark_spec: Option<WatermarkSpec>,
    alignment: Option<(Arc<WatermarkAlignment>, usize)>,
    /// Whether this task last told its outputs it is idle.
    output_idle: bool,
    max_batch: usize,
    batch_records: u32,
    sink: Option<SinkState>,
    watermark: i64,
    data_ended: bool,
    aligner: Aligner,
    align_started: Option<Instant>,
    report: TaskReport,
    progress: Arc<JobProgress>,
    /// This subtask's metrics (design §15), updated once per batch.
    metrics: Arc<nop_stream_metrics::TaskMetrics>,
    storage: Arc<Namespace>,
    namespace: String,
    events: Sender<TaskEvent>,
    commands: Receiver<TaskCommand>,
    cancel: Arc<AtomicBool>,
}

/// Payload bytes of `b`'s records.
fn payload_bytes(b: &Batch) -> u64 {
    b.ends.last().map_or(0, |e| u64::from(*e))
}

/// Runs a task to completion on the current thread and reports to the coordinator.
pub(crate) fn run(spec: TaskSpec) {
    let task_id = spec.task.clone();
    let attempt = spec.attempt;
    let events = spec.events.clone();
    let cancel = Arc::clone(&spec.cancel);
    let metrics = spec
        .progress
        .metrics()
        .task(task_id.vertex.as_str(), task_id.subtask.0);
    metrics.started();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(spec)));
    metrics.ended();
    let event = match outcome {
        Ok(Ok(report)) => TaskEvent::Finished { attempt, report },
        Ok(Err(error)) => TaskEvent::Failed {
            attempt,
            task: task_id.clone(),
            error,
        },
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".into());
            TaskEvent::Failed {
                attempt,
                task: task_id.clone(),
                error: RuntimeError::Internal(format!("task {task_id} panicked: {msg}")),
            }
        }
    };
    if matches!(event, TaskEvent::Failed { .. }) {
        cancel.store(true, Ordering::SeqCst);
    }
    let _ = events.send(event);
}

fn drive(spec: TaskSpec) -> Result<TaskReport> {
    let TaskSpec {
        task,
        attempt,
        stages: stage_specs,
        mut inputs,
        mut outputs,
        splits,
        watermarks: watermark_spec,
        alignment,
        batch_records,
        sink_txn_prefix,
        first_epoch,
        restore,
        storage,
        namespace,
        events,
        commands,
        progress,
        cancel,
        async_snapshots,
        incremental_snapshots,
    } = spec;
    for out in &mut outputs {
        out.set_flush_records(batch_records as usize);
    }
    let mut stages = Vec::with_capacity(stage_specs.len());
    let mut sites = Vec::with_capacity(stage_specs.len());
    let mut operator_ids = Vec::with_capacity(stage_specs.len());
    let policies = stage_specs.iter().map(|s| s.on_error).collect();
    for s in &stage_specs {
        let mut inst = s.plugin.instantiate(&s.options)?;
        // Non-keyed operator state is in place before `open`, so the plugin can read it
        // there (as Flink's initializeState precedes open).
        if let Instance::Operator(op) = &mut inst
            && let Some(r) = restore.operator_state.get(&s.operator_id)
        {
            restore_operator_state(
                op,
                storage.as_ref(),
                restore.epoch.map_or(0, |e| e.0),
                &s.operator_id,
                r,
                &s.task_info,
            )?;
        }
        match &mut inst {
            Instance::Source(i) => i.open(&s.task_info, &s.config)?,
            Instance::Operator(i) => i.open(&s.task_info, &s.config)?,
            Instance::Sink(i) => i.open(&s.task_info, &s.config)?,
        }
        stages.push(match inst {
            Instance::Source(i) => Stage::Source(i),
            Instance::Operator(i) => Stage::Operator(i),
            Instance::Sink(i) => Stage::Sink(i),
        });
        sites.push(s.options.site.clone());
        operator_ids.push(s.operator_id.clone());
    }
    // Before the restore: a restored state tracks its changes from the restored chain.
    for stage in &mut stages {
        if let Stage::Operator(op) = stage
            && let Some(ks) = op.state_mut()
        {
            ks.set_incremental(incremental_snapshots);
        }
    }
    // Restore keyed state and timers (the `__timers` state) of each stateful operator from
    // the segments the restore plan names; the task reads them itself (design §2.5).
    let restore_started = std::time::Instant::now();
    let (mut restored_segments, mut restored_deltas) = (0usize, 0usize);
    let mut restored_chains = vec![None; stages.len()];
    for (i, stage) in stages.iter_mut().enumerate() {
        if let Stage::Operator(op) = stage
            && let Some(segments) = restore.segments.get(&operator_ids[i])
        {
            let mut states = stage_specs[i].plugin.info.states.clone();
            states.push(crate::plugin::timer_descriptor());
            let state = read_shards(
                storage.as_ref(),
                restore.epoch.map_or(0, |e| e.0),
                &operator_ids[i],
                segments,
                &states,
            )?;
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
            if incremental_snapshots {
                // The state is exactly the restored chain's: the next snapshot may be a
                // delta on top of it.
                restored_chains[i] = Some(segments.clone());
            }
        }
    }
    if let Some(epoch) = restore.epoch {
        // Read by `nopstream-bench cluster-recovery` (target `nopstream::restore`).
        tracing::debug!(
            target: "nopstream::restore",
            %task, %attempt, epoch = epoch.0, segments = restored_segments,
            deltas = restored_deltas,
            elapsed_ms = restore_started.elapsed().as_secs_f64() * 1000.0,
            "task state restored"
        );
    }
    failpoint::hit("during-restore");
    for c in &mut inputs {
        if let Some(w) = restore.watermarks.get(&c.id.to_string()) {
            c.watermark = *w;
        }
        c.ended = restore.ended_inputs.contains(&c.id.to_string());
    }
    let splits = splits
        .into_iter()
        .map(|s| {
            let (cursor, finished, max_ts) = restore
                .splits
                .get(&s.id)
                .map(|c| (c.cursor.clone(), c.finished, c.max_timestamp))
                .unwrap_or_default();
            SplitCursor {
                split: s,
                cursor,
                finished,
                max_ts,
                last_records: None,
            }
        })
        .collect();
    // Without a restored chain, the first snapshot may be a delta on nothing (a state
    // that starts empty tracks its changes from the start; otherwise it is full).
    let chains = restored_chains
        .into_iter()
        .map(|c| c.or_else(|| incremental_snapshots.then(Vec::new)))
        .collect::<Vec<_>>();
    let mut t = Task {
        in_flight: None,
        async_snapshots,
        compactions: (0..chains.len()).map(|_| None).collect(),
        compacted_bytes: 0,
        restored_totals: (restore.records_in_total, restore.records_out_total),
        chains,
        id: task.clone(),
        attempt,
        stages,
        sites,
        operator_ids,
        policies,
        outputs,
        inputs,
        splits,
        next_split: 0,
        empty_reads: 0,
        watermark_spec,
        alignment,
        output_idle: false,
        max_batch: batch_records.max(1) as usize,
        batch_records,
        sink: None,
        watermark: i64::MIN,
        data_ended: restore.end_of_data,
        aligner: Aligner::new(0),
        align_started: None,
        report: TaskReport {
            task: task.to_string(),
            ..TaskReport::default()
        },
        metrics: progress
            .metrics()
            .task(task.vertex.as_str(), task.subtask.0),
        progress,
        storage,
        namespace,
        events,
        commands,
        cancel,
    };
    t.watermark = t.restored_watermark();
    if t.data_ended
        && let Some((a, slot)) = &t.alignment
    {
        // A source that had already read everything must not hold the others back.
        a.publish(*slot, i64::MAX);
    }
    for stage in &mut t.stages {
        if let Stage::Operator(op) = stage {
            op.set_watermark(t.watermark);
        }
    }
    t.aligner = Aligner::new(t.inputs.len());
    // Sink recovery (design §7.3 "on recovery", §7.4): commit the durable pre-committed
    // transactions, then abort every pending one of this subtask and, listed or not, its
    // transaction of every epoch after the restored one that an earlier generation may
    // have begun (up to this attempt's first epoch): a sink that finds one of those
    // committed fails there, loudly, instead of letting the replay repeat it. Then begin
    // anew.
    if let (Some(prefix), Some(Stage::Sink(sink))) = (sink_txn_prefix, t.stages.last_mut()) {
        for p in &restore.pending {
            let committable =
                hex::decode(&p.committable).map_err(|e| RuntimeError::Internal(e.to_string()))?;
            commit_with_recovery(sink, &p.txn, &committable)?;
        }
        let listed: std::collections::BTreeSet<String> =
            sink.pending_transactions()?.into_iter().collect();
        for stale in &listed {
            tracing::info!(txn = %stale, "aborting a transaction of a non-durable epoch");
            sink.abort(stale)?;
        }
        let restored = restore.epoch.map_or(0, |e| e.0);
        for epoch in restored + 1..first_epoch.0 {
            let txn = format!("{prefix}{epoch}");
            if !listed.contains(&txn) {
                tracing::debug!(%txn, "aborting the transaction of a non-durable epoch, if any");
                sink.abort(&txn)?;
            }
        }
        let txn = format!("{prefix}{first_epoch}");
        sink.begin(&txn)?;
        t.sink = Some(SinkState {
            prefix,
            txn,
            pending: Vec::new(),
        });
    }
    if t.data_ended {
        t.send(TaskEvent::EndOfData {
            attempt: t.attempt,
            task: t.id.clone(),
        });
    }
    t.run()?;
    // The last epoch's segments are durable and acknowledged before the task finishes.
    t.join_snapshot()?;
    for (stage, site) in t.stages.iter_mut().zip(&t.sites) {
        match stage {
            Stage::Source(i) => i.close()?,
            Stage::Operator(i) => {
                if !i.counters().is_empty() {
                    // Merged: the host's own counters (skipped, dropped) are there too.
                    let mine = t.report.counters.entry(site.operator.clone()).or_default();
                    for (name, n) in i.counters() {
                        *mine.entry(name.clone()).or_default() += n;
                    }
                }
                i.close()?
            }
            Stage::Sink(i) => i.close()?,
        }
    }
    Ok(t.report)
}

/// The payload `seg` points at, its checksum verified; the message names the segment.
pub(crate) fn read_segment(
    storage: &Namespace,
    seg: &SegmentDescriptor,
) -> std::result::Result<Vec<u8>, String> {
    let bytes = storage
        .read_range(&seg.file, seg.offset, seg.len)
        .map_err(|e| e.to_string())?;
    if payload_checksum(&bytes) != seg.checksum {
        return Err(format!("segment {} failed its checksum", seg.state_path));
    }
    Ok(bytes)
}

/// Reads every old subtask's segments of `operator_id`'s non-keyed operator states and
/// gives the instance its entries by each state's redistribution policy (seed §10.5,
/// [`crate::op_state::redistribute`]).
///
/// # Errors
/// [`RuntimeError::Restore`] for a failed read or checksum, a malformed payload, a state
/// the plugin no longer declares or whose schema version differs, or a refused
/// redistribution (duplicate ids, differing broadcast copies, a `none` state rescaled).
fn restore_operator_state(
    op: &mut crate::plugin::OperatorInstance,
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
    let mut old: Vec<Vec<crate::op_state::Entries>> =
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
        let entries = crate::op_state::decode(&bytes)
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
        let entries = crate::op_state::redistribute(
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
        let bytes = read_segment(storage, seg).map_err(refuse)?;
        out.push(ShardSnapshot {
            shard: nop_stream_api::StateShardId(seg.shard),
            state: i as u32,
            entries: seg.entries,
            payload: bytes,
            delta,
        });
    }
    Ok(out)
}

/// Commits; if the commit call fails, asks `recover` whether it happened anyway (a lost
/// reply), and never reports an unknown outcome as committed (design §5.7).
pub(crate) fn commit_with_recovery(
    sink: &mut SinkInstance,
    txn: &str,
    committable: &[u8],
) -> Result<()> {
    use crate::bindings::CommitOutcome;
    if failpoint::hit("expire-transaction") {
        // Simulates a transaction that expired in the external system before commit.
        sink.abort(txn)?;
    }
    let result = sink.commit(committable);
    let result = match result {
        Ok(()) if failpoint::hit("commit-reply-lost") => Err(RuntimeError::CommitUncertain {
            site: sink.site().clone(),
            txn: txn.to_owned(),
            message: "reply lost (failpoint)".into(),
        }),
        other => other,
    };
    match result {
        Ok(()) => Ok(()),
        Err(first) => match sink.recover(committable)? {
            CommitOutcome::Committed => {
                tracing::warn!(
                    txn,
                    "commit reported an error but the transaction is committed: {first}"
                );
                Ok(())
            }
            CommitOutcome::Aborted => {
                sink.commit(committable)
                    .map_err(|e| RuntimeError::CommitUncertain {
                        site: sink.site().clone(),
                        txn: txn.to_owned(),
                        message: format!("failed twice: {first}; then {e}"),
                    })
            }
            CommitOutcome::Unknown => Err(RuntimeError::CommitUncertain {
                site: sink.site().clone(),
                txn: txn.to_owned(),
                message: format!(
                    "failed ({first}) and its outcome is unknown (the transaction expired or was lost); refusing to report it as committed"
                ),
            }),
        },
    }
}

fn split_batch(b: &Batch, max: usize) -> Vec<Batch> {
    let n = b.ends.len();
    let keyed = b.key_ends.len() == n;
    let timed = b.timestamps.len() == n;
    let mut out = Vec::with_capacity(n.div_ceil(max));
    let mut i = 0;
    while i < n {
        let j = (i + max).min(n);
        let start = if i == 0 { 0 } else { b.ends[i - 1] as usize };
        let end = b.ends[j - 1] as usize;
        let mut piece = Batch {
            data: b.data[start..end].to_vec(),
            ends: b.ends[i..j].iter().map(|e| e - start as u32).collect(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        };
        if keyed {
            let ks = if i == 0 {
                0
            } else {
                b.key_ends[i - 1] as usize
            };
            let ke = b.key_ends[j - 1] as usize;
            piece.keys = b.keys[ks..ke].to_vec();
            piece.key_ends = b.key_ends[i..j].iter().map(|e| e - ks as u32).collect();
        }
        if timed {
            piece.timestamps = b.timestamps[i..j].to_vec();
        }
        out.push(piece);
        i = j;
    }
    out
}

/// Emits `batch` on every edge carrying `output` (`None`: the main output); every such
/// edge but the last gets a copy, the last takes the batch.
fn emit_to(
    outputs: &mut [OutputEdge],
    output: Option<&str>,
    batch: Batch,
    site: &Site,
) -> Result<()> {
    let n = outputs.iter().filter(|o| o.output() == output).count();
    let mut batch = Some(batch);
    let mut seen = 0;
    for out in outputs.iter_mut().filter(|o| o.output() == output) {
        seen += 1;
        let b = if seen == n {
            batch.take().expect("taken only by the last edge")
        } else {
            batch.clone().expect("kept until the last edge")
        };
        out.emit(b, site)?;
    }
    Ok(())
}

/// A guest error with the code `io`: about a capability, not a record.
fn is_io(error: &RuntimeError) -> bool {
    matches!(error, RuntimeError::Guest { code, .. } if *code == "io")
}

/// A guest error naming the record `data` (printable, truncated).
fn with_record(mut error: RuntimeError, data: &[u8]) -> RuntimeError {
    if let RuntimeError::Guest { record, .. } = &mut error {
        *record = Some(printable_record(data).into());
    }
    error
}

/// What one stateful operator of the chain hands to [`write_segments`] at a barrier.
struct OperatorSnapshot {
    /// Index of the operator's stage in the chain.
    stage: usize,
    /// Operator name (job file), for errors.
    operator: String,
    operator_id: String,
    /// Segment file, relative to the storage root.
    file: String,
    /// The keyed state's frozen view and its state descriptors (by handle).
    keyed: Option<(SnapshotView, Vec<nop_stream_api::StateDescriptor>)>,
    /// The chain a delta view extends (its descriptors come first in the manifest);
    /// unused for a full view.
    chain: Vec<SegmentDescriptor>,
    /// Operator state: (state name, schema version, `kv-lp/1` payload, entries).
    operator_state: Vec<(String, u32, Vec<u8>, u64)>,
}

/// What one operator's snapshot leaves for the task thread once written.
struct WrittenStage {
    /// Index of the operator's stage in the chain.
    stage: usize,
    /// The expired TTL keys its scan left out.
    expired: ExpiredKeys,
    /// Its keyed-state chain as this snapshot left it (`None`: no keyed state).
    chain: Option<Vec<SegmentDescriptor>>,
}

/// What [`write_segments`] leaves for the task thread, per operator.
type Written = Vec<WrittenStage>;

/// Where a task's segment files go.
struct SegmentTarget {
    storage: Arc<Namespace>,
    namespace: String,
    subtask: u32,
}

/// Writes one packed segment file per operator of `parts` (keyed state and timers shard
/// by shard as the view hands them over, so a snapshot never sits whole in memory; then
/// the operator state), makes each durable ([`nop_stream_checkpoint::ObjectWriter::finish`])
/// and fills `snapshot`'s segments, operator state and `snapshot_bytes`. Returns the
/// expired TTL keys each operator's scan left out, by stage. Runs on the task thread
/// (synchronous snapshots) or on the snapshot thread; stops early once `abort` is set.
///
/// Failpoint `async-snapshot-write`: hit once per file, after its payloads are written and
/// before it is made durable.
///
/// # Errors
/// [`RuntimeError::Io`] naming the operator and the file: a state database, storage or
/// failpoint failure, or the abort.
fn write_segments(
    target: &SegmentTarget,
    parts: Vec<OperatorSnapshot>,
    snapshot: &mut TaskSnapshot,
    abort: &AtomicBool,
) -> Result<Written> {
    let epoch = snapshot.epoch.0;
    let subtask = target.subtask;
    let namespace = target.namespace.as_str();
    let mut written = Vec::new();
    for part in parts {
        let OperatorSnapshot {
            stage,
            operator,
            operator_id: op_id,
            file,
            keyed,
            chain,
            operator_state,
        } = part;
        let io = |e: String| RuntimeError::Io {
            path: format!("state of operator `{operator}` ({file})"),
            message: e,
        };
        let mut out = SegmentAppender {
            storage: &target.storage,
            file: &file,
            writer: None,
            offset: 0,
        };
        // What every payload's descriptor shares: where it lies in the file.
        let descriptor = |state_path: String,
                          shard: u32,
                          state: String,
                          (offset, payload): (u64, &[u8]),
                          schema_version: u32,
                          entries: u64,
                          codec: &str| SegmentDescriptor {
            state_path,
            operator_id: op_id.clone(),
            shard,
            state,
            file: file.clone(),
            offset,
            len: payload.len() as u64,
            checksum: payload_checksum(payload),
            codec: codec.into(),
            schema_version,
            entries,
        };
        if let Some((view, descs)) = keyed {
            // A delta extends the chain; a full snapshot starts a new one.
            let mut chain = if view.is_delta() { chain } else { Vec::new() };
            let expired = view
                .write(&mut |s: ShardSnapshot| {
                    if abort.load(Ordering::Relaxed) {
                        return Err("snapshot abandoned: the task is stopping".into());
                    }
                    let d = &descs[s.state as usize];
                    let at = out.append(&s.payload)?;
                    chain.push(descriptor(
                        nop_stream_checkpoint::names::state_path(
                            namespace, epoch, &op_id, subtask, s.shard.0, &d.name,
                        ),
                        s.shard.0,
                        d.name.clone(),
                        (at, &s.payload),
                        d.schema_version,
                        s.entries,
                        s.codec(),
                    ));
                    Ok(())
                })
                .map_err(|e| io(e.to_string()))?;
            snapshot.segments.extend(chain.iter().cloned());
            written.push(WrittenStage {
                stage,
                expired,
                chain: Some(chain),
            });
        }
        for (name, schema, payload, n) in operator_state {
            let at = out.append(&payload).map_err(io)?;
            snapshot.operator_state.push(descriptor(
                nop_stream_checkpoint::names::operator_state_path(
                    namespace, epoch, &op_id, subtask, &name,
                ),
                subtask,
                name,
                (at, &payload),
                schema,
                n,
                payload::KV_CODEC,
            ));
        }
        let offset = out.offset;
        if let Some(w) = out.writer {
            if failpoint::hit("async-snapshot-write") {
                return Err(io("failpoint `async-snapshot-write` fired".into()));
            }
            w.finish().map_err(|e| io(e.to_string()))?;
        }
        snapshot.snapshot_bytes += offset;
    }
    Ok(written)
}

/// One operator's segment file, opened at its first payload (an operator with nothing
/// to snapshot writes no file), with the offset of the next payload.
pub(crate) struct SegmentAppender<'a> {
    pub storage: &'a Namespace,
    pub file: &'a str,
    pub writer: Option<Box<dyn nop_stream_checkpoint::ObjectWriter + 'a>>,
    pub offset: u64,
}

impl SegmentAppender<'_> {
    /// Appends `payload`; returns its offset in the file.
    pub fn append(&mut self, payload: &[u8]) -> std::result::Result<u64, String> {
        let w = match &mut self.writer {
            Some(w) => w,
            None => self.writer.insert(
                self.storage
                    .segment_writer(self.file)
                    .map_err(|e| e.to_string())?,
            ),
        };
        w.write(payload).map_err(|e| e.to_string())?;
        let at = self.offset;
        self.offset += payload.len() as u64;
        Ok(at)
    }
}

/// The background part of one epoch's snapshot ([`write_segments`] on its own thread,
/// then the Ack). Dropping it without [`InFlightSnapshot::join`] (a task failing or
/// cancelled) asks the thread to stop at the next shard and waits for it, so no write
/// outlives the task; an abandoned snapshot sends no Ack.
struct InFlightSnapshot {
    epoch: EpochId,
    handle: Option<std::thread::JoinHandle<Result<Written>>>,
    abort: Arc<AtomicBool>,
}

impl InFlightSnapshot {
    fn is_finished(&self) -> bool {
        self.handle
            .as_ref()
            .is_none_or(std::thread::JoinHandle::is_finished)
    }

    /// Waits for the thread; its expired keys by stage, or its error.
    fn join(&mut self, task: &TaskId) -> Result<Written> {
        let Some(handle) = self.handle.take() else {
            return Ok(Vec::new());
        };
        match handle.join() {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "unknown panic".into());
                Err(RuntimeError::Internal(format!(
                    "task {task}: the snapshot thread of epoch {} panicked: {msg}",
                    self.epoch
                )))
            }
        }
    }
}

impl Drop for InFlightSnapshot {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.abort.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
    }
}

impl Task {
    fn send(&self, e: TaskEvent) {
        let _ = self.events.send(e);
    }

    /// The task watermark implied by restored per-channel watermarks: +inf once the data
    /// ended, the minimum over inputs still open, -inf for a source head.
    fn restored_watermark(&self) -> i64 {
        if self.data_ended {
            return i64::MAX;
        }
        if self.inputs.is_empty() {
            // A source head: its split watermarks are recomputed (and re-emitted) after
            // the first read; they never go below what the splits had reached.
            return i64::MIN;
        }
        self.inputs
            .iter()
            .filter(|c| !c.ended)
            .map(|c| c.watermark)
            .min()
            .unwrap_or(i64::MAX)
    }

    /// Sends the records buffered on every output edge (see [`OutputEdge::flush`]).
    fn flush_outputs(&mut self) -> Result<()> {
        for out in &mut self.outputs {
            out.flush()?;
        }
        Ok(())
    }

    fn is_source(&self) -> bool {
        matches!(self.stages.first(), Some(Stage::Source(_)))
    }

    /// The main loop; returns when told to finish.
    fn run(&mut self) -> Result<()> {
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(RuntimeError::Cancelled);
            }
            self.poll_snapshot()?;
            self.fire_processing_timers()?;
            if self.is_source() && !self.data_ended {
                while let Ok(cmd) = self.commands.try_recv() {
                    if self.on_command(cmd)? {
                        return Ok(());
                    }
                }
                self.read_once()?;
                continue;
            }
            if self.wait_once()? {
                return Ok(());
            }
        }
    }

    /// Reads one batch from the next unfinished split in round-robin order (so every
    /// unbounded split of the subtask makes progress, however busy the others are); ends
    /// the data when none is left. With watermark alignment, a subtask too far ahead of the
    /// slowest one pauses.
    fn read_once(&mut self) -> Result<()> {
        let len = self.splits.len();
        let Some(i) = (0..len)
            .map(|k| (self.next_split + k) % len)
            .find(|&i| !self.splits[i].finished)
        else {
            if let Some((a, slot)) = &self.alignment {
                a.publish(*slot, i64::MAX);
            }
            return self.end_of_data();
        };
        if let (Some((a, slot)), Some(drift)) = (
            &self.alignment,
            self.watermark_spec.and_then(|w| w.max_drift_ms),
        ) && self.watermark > i64::MIN
            && self.watermark
                > a.slowest_other(*slot)
                    .saturating_add(i64::try_from(drift).unwrap_or(i64::MAX))
        {
            self.flush_outputs()?;
            std::thread::sleep(Duration::from_millis(1));
            return Ok(());
        }
        let Some(Stage::Source(src)) = self.stages.first_mut() else {
            unreachable!("checked by is_source");
        };
        let sc = &mut self.splits[i];
        let r = src.read(&sc.split, &sc.cursor, self.batch_records)?;
        let n = r.records.ends.len() as u64;
        self.report.records_in += n;
        self.metrics.records_in(n, payload_bytes(&r.records));
        self.progress.record_read(
            self.id.vertex.as_str(),
            &sc.split.id,
            n,
            r.progress.consumed,
            r.progress.total,
        );
        sc.cursor = r.next_cursor;
        sc.finished = r.finished;
        if n > 0 || sc.last_records.is_none() {
            sc.last_records = Some(Instant::now());
        }
        if let Some(m) = r.records.timestamps.iter().max() {
            sc.max_ts = Some(sc.max_ts.map_or(*m, |x| x.max(*m)));
        }
        let finished = sc.finished;
        self.next_split = (i + 1) % len;
        self.push(1, 0, r.records)?;
        self.source_watermark()?;
        if n < u64::from(self.batch_records) {
            // A short read: the split is caught up, and its next read may block (a
            // connector waiting for messages). Records buffered on HASH edges go out now
            // rather than wait for it; full reads keep filling the buffers.
            self.flush_outputs()?;
        }
        if n == 0 && !finished {
            self.empty_reads += 1;
            let unfinished = self.splits.iter().filter(|s| !s.finished).count();
            if self.empty_reads >= unfinished {
                self.empty_reads = 0;
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            self.empty_reads = 0;
        }
        Ok(())
    }

    /// Per-split bounded-out-of-orderness watermarks (design §8.5, [`WatermarkSpec`]): the
    /// subtask's watermark is the minimum over unfinished, non-idle splits; when every
    /// unfinished split is idle the outputs are marked idle.
    fn source_watermark(&mut self) -> Result<()> {
        let Some(spec) = self.watermark_spec else {
            return Ok(());
        };
        let bound = i64::try_from(spec.max_out_of_orderness_ms).unwrap_or(i64::MAX / 2);
        let idle_after = spec.idle_timeout_ms.map(Duration::from_millis);
        let mut wm: Option<i64> = None;
        let mut any_unfinished = false;
        for s in self.splits.iter().filter(|s| !s.finished) {
            any_unfinished = true;
            let idle =
                matches!((idle_after, s.last_records), (Some(d), Some(t)) if t.elapsed() >= d);
            if idle {
                continue;
            }
            let w = s
                .max_ts
                .map_or(i64::MIN, |m| m.saturating_sub(bound).saturating_sub(1));
            wm = Some(wm.map_or(w, |x: i64| x.min(w)));
        }
        if let Some((a, slot)) = &self.alignment {
            // Idle subtasks do not hold the others back.
            a.publish(*slot, wm.map_or(i64::MAX, |w| w.max(self.watermark)));
        }
        match wm {
            Some(w) if w > self.watermark => {
                self.output_idle = false;
                self.advance_watermark(w)
            }
            Some(_) if self.output_idle => {
                // Active again: re-announce the current watermark to clear the idle mark.
                self.output_idle = false;
                let w = self.watermark;
                for out in &mut self.outputs {
                    out.broadcast(&Message::Watermark(w))?;
                }
                Ok(())
            }
            None if any_unfinished && !self.output_idle => {
                self.output_idle = true;
                for out in &mut self.outputs {
                    out.broadcast(&Message::Idle)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Fires every processing-time timer due now, in timestamp order (design §8.4: timers
    /// restored overdue fire once, at the first check).
    fn fire_processing_timers(&mut self) -> Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.fire_processing_timers_until(now)
    }

    /// Fires every processing-time timer with `timestamp <= now`, stage by stage.
    fn fire_processing_timers_until(&mut self, now: i64) -> Result<()> {
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                if !op.has_processing_timers() {
                    continue;
                }
                let due = op.take_due_processing_timers(now)?;
                if due.is_empty() {
                    continue;
                }
                let out = op.on_timers(&due)?;
                self.push(i + 1, 0, out)?;
                self.route_side_outputs(i)?;
            }
        }
        Ok(())
    }

    /// Waits for one input message or command and handles it; `true` when finished.
    fn wait_once(&mut self) -> Result<bool> {
        let active: Vec<usize> = (0..self.inputs.len())
            .filter(|i| !self.inputs[*i].closed && !self.aligner.is_blocked(*i))
            .collect();
        let nothing_ready = self.commands.is_empty()
            && active.iter().all(|&i| self.inputs[i].rx.queue().is_empty());
        if nothing_ready {
            if self.outputs.iter().any(OutputEdge::has_buffered) {
                // About to wait: records buffered on HASH edges go out first, so that a
                // quiet input never holds back output already produced.
                self.flush_outputs()?;
            }
            if !active.is_empty() {
                std::thread::sleep(LINGER);
            }
        }
        let mut sel = Select::new();
        let cmd_index = sel.recv(&self.commands);
        for &i in &active {
            sel.recv(self.inputs[i].rx.queue());
        }
        let op = match sel.select_timeout(POLL) {
            Ok(op) => op,
            Err(_) => return Ok(false),
        };
        if op.index() == cmd_index {
            return match op.recv(&self.commands) {
                Ok(cmd) => self.on_command(cmd),
                Err(_) => Err(RuntimeError::Cancelled),
            };
        }
        let idx = active[op.index() - 1];
        let msg = op.recv(self.inputs[idx].rx.queue());
        if msg.is_ok() {
            self.inputs[idx].rx.admit()?;
        }
        match msg {
            Ok(Message::Records(b)) => {
                self.report.records_in += b.ends.len() as u64;
                self.metrics
                    .records_in(b.ends.len() as u64, payload_bytes(&b));
                let input = self.inputs[idx].input_index;
                if self.inputs[idx].idle {
                    self.inputs[idx].idle = false;
                    self.maybe_advance()?;
                }
                self.push(0, input, b)?;
            }
            Ok(Message::Watermark(w)) => {
                let c = &mut self.inputs[idx];
                c.watermark = c.watermark.max(w);
                c.idle = false;
                self.maybe_advance()?;
            }
            Ok(Message::Idle) => {
                self.inputs[idx].idle = true;
                self.maybe_advance()?;
            }
            Ok(Message::Barrier(epoch)) => self.on_barrier(idx, epoch)?,
            Ok(Message::End) => {
                self.inputs[idx].ended = true;
                self.maybe_advance()?;
                if !self.data_ended && self.inputs.iter().all(|c| c.ended) {
                    self.end_of_data()?;
                }
            }
            Err(_) => {
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(RuntimeError::Cancelled);
                }
                if !self.inputs[idx].ended {
                    return Err(RuntimeError::ChannelClosed {
                        channel: self.inputs[idx].id.clone(),
                        message: self.inputs[idx].rx.close_reason().unwrap_or_else(|| {
                            "the sending task ended without an end marker".into()
                        }),
                    });
                }
                self.inputs[idx].closed = true;
            }
        }
        Ok(false)
    }

    /// Barrier alignment (design §5.4, [`Aligner`]): hold channels that delivered barrier
    /// N, keep reading the others, snapshot once every input delivered it.
    fn on_barrier(&mut self, idx: usize, epoch: EpochId) -> Result<()> {
        if self.aligner.aligning() != Some(epoch) {
            self.align_started = Some(Instant::now());
        }
        match self.aligner.on_barrier(idx, epoch) {
            AlignOutcome::Aligned(e) => {
                let alignment_ms = self
                    .align_started
                    .take()
                    .map_or(0, |t| t.elapsed().as_millis() as u64);
                self.checkpoint(e, alignment_ms)
            }
            AlignOutcome::Holding | AlignOutcome::Ignored => Ok(()),
        }
    }

    /// Handles a coordinator command; `true` when the task must finish.
    fn on_command(&mut self, cmd: TaskCommand) -> Result<bool> {
        match cmd {
            TaskCommand::InjectBarrier(epoch) => {
                if self.is_source() {
                    failpoint::hit("before-barrier-injection");
                    self.checkpoint(epoch, 0)?;
                    failpoint::hit("after-barrier-injection");
                }
                Ok(false)
            }
            TaskCommand::Commit(epoch) => {
                self.commit_up_to(epoch)?;
                self.send(TaskEvent::Committed {
                    attempt: self.attempt,
                    task: self.id.clone(),
                    epoch,
                });
                Ok(false)
            }
            TaskCommand::Finish => Ok(true),
        }
    }

    fn commit_up_to(&mut self, epoch: EpochId) -> Result<()> {
        let (Some(sink_state), Some(Stage::Sink(sink))) =
            (self.sink.as_mut(), self.stages.last_mut())
        else {
            return Ok(());
        };
        let due: Vec<PendingTransaction> = sink_state
            .pending
            .iter()
            .filter(|p| p.epoch <= epoch)
            .cloned()
            .collect();
        for (i, p) in due.iter().enumerate() {
            let committable =
                hex::decode(&p.committable).map_err(|e| RuntimeError::Internal(e.to_string()))?;
            commit_with_recovery(sink, &p.txn, &committable)?;
            if i == 0 && due.len() > 1 {
                failpoint::hit("mid-commit");
            }
        }
        if due.len() == 1 {
            failpoint::hit("mid-commit");
        }
        sink_state.pending.retain(|p| p.epoch > epoch);
        Ok(())
    }

    /// Takes the snapshot of `epoch` and forwards its barrier (design §5.3–§5.5).
    ///
    /// The task thread does the synchronous part: waits for the previous epoch's
    /// background part if it is still running (at most one in flight), lets operators
    /// prepare, pre-commits the sink, then per stateful operator syncs timers, copies its
    /// operator state and takes a frozen view of its keyed state
    /// ([`nop_stream_state::KeyedState::snapshot_view`]: a flush and a redb read
    /// transaction). It then forwards the barrier and goes on processing, while a
    /// background thread ([`write_segments`]) writes one segment file per operator, makes
    /// it durable, and only then sends the Ack. With `async_snapshots = false` the task
    /// thread does that last part itself before forwarding the barrier.
    fn checkpoint(&mut self, epoch: EpochId, alignment_ms: u64) -> Result<()> {
        let started = Instant::now();
        if self.in_flight.is_some() {
            let waited = Instant::now();
            let previous = self.in_flight.as_ref().map(|f| f.epoch);
            self.join_snapshot()?;
            // The wait this barrier spent on the previous epoch's background part (often
            // ~0: it has sent its Ack and is only exiting); part of `duration_ms`.
            tracing::debug!(
                target: "nopstream::snapshot",
                task = %self.id, epoch = epoch.0, previous = previous.map(|e| e.0),
                wait_ms = waited.elapsed().as_secs_f64() * 1000.0,
                "waited for the previous epoch's snapshot"
            );
        }
        self.adopt_compactions(epoch);
        // Operators flush what they cache and emit what must precede the barrier.
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let out = op.prepare_checkpoint(epoch.0)?;
                self.route_side_outputs(i)?;
                self.push(i + 1, 0, out)?;
            }
        }
        // Sink: pre-commit this epoch's transaction and begin the next one at once.
        let mut sink_operator = None;
        if let (Some(sink_state), Some(Stage::Sink(sink))) =
            (self.sink.as_mut(), self.stages.last_mut())
        {
            let committable = sink.pre_commit(&sink_state.txn)?;
            failpoint::hit("after-pre-commit");
            sink_state.pending.push(PendingTransaction {
                epoch,
                txn: sink_state.txn.clone(),
                committable: hex::encode(committable),
            });
            sink_state.txn = format!("{}{}", sink_state.prefix, epoch.0 + 1);
            sink.begin(&sink_state.txn)?;
            sink_operator = self.operator_ids.last().cloned();
        }
        // Per stateful operator: timers into keyed state, the operator state's payloads
        // (small, in memory) and a frozen view of the keyed state.
        let subtask = self.id.subtask.0;
        let mut parts = Vec::new();
        for i in 0..self.stages.len() {
            let Stage::Operator(op) = &mut self.stages[i] else {
                continue;
            };
            let op_id = self.operator_ids[i].clone();
            op.sync_timers()?;
            let operator_state: Vec<(String, u32, Vec<u8>, u64)> = op
                .operator_state_mut()
                .snapshot()
                .into_iter()
                .map(|(d, payload, n)| (d.name.clone(), d.schema_version, payload, n))
                .collect();
            // Scoped by epoch and attempt (= generation): a fenced attempt that still writes
            // (a stopped node resumed) never touches a file a manifest of another
            // generation references (design §2.5, "Leases, generations, fencing").
            let file = nop_stream_checkpoint::names::segment_file(
                epoch.0,
                &op_id,
                subtask,
                self.attempt.0,
            );
            let keyed = match op.state_mut() {
                Some(ks) => {
                    // Read by the state budget test (target `nopstream::state`).
                    tracing::debug!(
                        target: "nopstream::state",
                        task = %self.id, epoch = epoch.0, operator = %op_id,
                        evictions = ks.evictions(), cached_bytes = ks.cached_bytes(),
                        "keyed state at the barrier"
                    );
                    let io = |e: nop_stream_state::StateError| RuntimeError::Io {
                        path: format!("state of operator `{}` ({file})", self.sites[i].operator),
                        message: e.to_string(),
                    };
                    // A delta when the chain may grow and the state knows its changes;
                    // past that, still a delta while a background compaction of the
                    // chain runs (started here if none does), up to a bound.
                    let (delta, compact) = match &self.chains[i] {
                        Some(c) if extendable(c) => (ks.delta_view().map_err(io)?, false),
                        Some(c)
                            if delta_files(c) < MAX_DELTAS_COMPACTING
                                && (self.compactions[i].is_some() || Compaction::wanted(c)) =>
                        {
                            (ks.delta_view().map_err(io)?, true)
                        }
                        _ => (None, false),
                    };
                    let view = match delta {
                        Some(v) => {
                            if compact && self.compactions[i].is_none() {
                                let base = self.chains[i].clone().unwrap_or_default();
                                let spec = CompactionSpec {
                                    storage: Arc::clone(&self.storage),
                                    namespace: self.namespace.clone(),
                                    operator: self.sites[i].operator.clone(),
                                    operator_id: op_id.clone(),
                                    subtask,
                                    attempt: self.attempt.0,
                                    epoch,
                                    states: ks.descriptors().to_vec(),
                                };
                                self.compactions[i] =
                                    Some(Compaction::start(spec, base, ks.compactor())?);
                            }
                            v
                        }
                        None => {
                            // A full snapshot starts a new chain: a compaction of the
                            // old one is of no use.
                            self.compactions[i] = None;
                            ks.snapshot_view().map_err(io)?
                        }
                    };
                    Some((view, ks.descriptors().to_vec()))
                }
                None if operator_state.is_empty() => continue,
                None => None,
            };
            parts.push(OperatorSnapshot {
                stage: i,
                operator: self.sites[i].operator.clone(),
                operator_id: op_id,
                file,
                keyed,
                chain: self.chains[i].take().unwrap_or_default(),
                operator_state,
            });
        }
        let mut snapshot = TaskSnapshot {
            task: self.id.clone(),
            epoch,
            end_of_data: self.data_ended,
            segments: Vec::new(),
            operator_state: Vec::new(),
            splits: self
                .splits
                .iter()
                .map(|s| SplitState {
                    split_id: s.split.id.clone(),
                    descriptor: hex::encode(&s.split.descriptor),
                    cursor: hex::encode(&s.cursor),
                    finished: s.finished,
                    max_timestamp: s.max_ts,
                })
                .collect(),
            watermarks: self
                .inputs
                .iter()
                .map(|c| (c.id.to_string(), c.watermark))
                .collect(),
            ended_inputs: self
                .inputs
                .iter()
                .filter(|c| c.ended)
                .map(|c| c.id.to_string())
                .collect(),
            pending_transactions: self
                .sink
                .as_ref()
                .map(|s| s.pending.clone())
                .unwrap_or_default(),
            sink_operator,
            snapshot_bytes: 0,
            alignment_ms,
            duration_ms: 0,
            async_ms: 0,
            compacted_bytes: std::mem::take(&mut self.compacted_bytes),
            records_in_total: self.restored_totals.0 + self.report.records_in,
            records_out_total: self.restored_totals.1 + self.report.records_out,
        };
        let target = SegmentTarget {
            storage: Arc::clone(&self.storage),
            namespace: self.namespace.clone(),
            subtask,
        };
        if !self.async_snapshots || parts.iter().all(|p| p.keyed.is_none()) {
            // Synchronous: nothing to scan, or asked for.
            let never = AtomicBool::new(false);
            let expired = write_segments(&target, parts, &mut snapshot, &never)?;
            self.remove_expired(expired)?;
            snapshot.duration_ms = started.elapsed().as_millis() as u64;
            for out in &mut self.outputs {
                out.broadcast(&Message::Barrier(epoch))?;
            }
            self.report.epochs += 1;
            self.send(TaskEvent::Ack {
                attempt: self.attempt,
                snapshot: Box::new(snapshot),
            });
            return Ok(());
        }
        snapshot.duration_ms = started.elapsed().as_millis() as u64;
        for out in &mut self.outputs {
            out.broadcast(&Message::Barrier(epoch))?;
        }
        self.report.epochs += 1;
        let abort = Arc::new(AtomicBool::new(false));
        let events = self.events.clone();
        let attempt = self.attempt;
        let stop = Arc::clone(&abort);
        let handed_over = Instant::now();
        let handle = std::thread::Builder::new()
            .name(format!("snapshot {}", self.id))
            .spawn(move || {
                let expired = write_segments(&target, parts, &mut snapshot, &stop)?;
                snapshot.async_ms = handed_over.elapsed().as_millis() as u64;
                // Only now, with every segment file durable, may the coordinator count
                // this task in.
                let _ = events.send(TaskEvent::Ack {
                    attempt,
                    snapshot: Box::new(snapshot),
                });
                Ok(expired)
            })
            .map_err(|e| {
                RuntimeError::Internal(format!(
                    "task {}: cannot start the snapshot thread of epoch {epoch}: {e}",
                    self.id
                ))
            })?;
        self.in_flight = Some(InFlightSnapshot {
            epoch,
            handle: Some(handle),
            abort,
        });
        Ok(())
    }

    /// Adopts every finished background compaction ([`crate::compaction`]) at the barrier
    /// of `epoch`: the operator's chain becomes the compacted full payloads followed by the
    /// deltas taken since the compaction started, and the expired TTL entries the fold
    /// left out are queued for deletion. A failed compaction is logged and dropped, and
    /// the operator's next snapshot is full.
    fn adopt_compactions(&mut self, epoch: EpochId) {
        for i in 0..self.compactions.len() {
            if !self.compactions[i]
                .as_ref()
                .is_some_and(Compaction::is_finished)
            {
                continue;
            }
            let c = self.compactions[i].take().expect("checked above");
            let (base, started) = (c.base.clone(), c.epoch);
            let elapsed = c.started.elapsed();
            let operator = &self.sites[i].operator;
            match c.join() {
                Ok(done) => {
                    let Some(chain) = self.chains[i].as_mut().filter(|c| c.starts_with(&base))
                    else {
                        // A full snapshot started a new chain meanwhile.
                        continue;
                    };
                    let newer = chain.split_off(base.len());
                    *chain = done.full;
                    chain.extend(newer);
                    self.compacted_bytes += done.bytes;
                    tracing::debug!(
                        target: "nopstream::snapshot",
                        task = %self.id, operator = %operator, started = started.0,
                        adopted = epoch.0, base_segments = base.len(),
                        base_bytes = base.iter().map(|d| d.len).sum::<u64>(),
                        bytes = done.bytes, expired = done.expired.len(),
                        elapsed_ms = elapsed.as_secs_f64() * 1000.0,
                        "keyed state chain compacted"
                    );
                    if let Stage::Operator(op) = &mut self.stages[i]
                        && let Some(ks) = op.state_mut()
                    {
                        ks.remove_expired_later(done.expired);
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        task = %self.id, operator = %operator, started = started.0,
                        "background compaction failed; the next snapshot is full: {e}"
                    );
                    self.chains[i] = None;
                }
            }
        }
    }

    /// Joins the background part of the last snapshot if it has finished (the main loop
    /// calls it every round), so a failure there fails the task soon.
    ///
    /// # Errors
    /// The background part's error (naming the operator and the segment file).
    fn poll_snapshot(&mut self) -> Result<()> {
        if self
            .in_flight
            .as_ref()
            .is_some_and(InFlightSnapshot::is_finished)
        {
            self.join_snapshot()?;
        }
        Ok(())
    }

    /// Waits for the background part of the last snapshot, if any, and queues the expired
    /// TTL entries it found for deletion at the operators' next flush.
    ///
    /// # Errors
    /// The background part's error (naming the operator and the segment file), or
    /// [`RuntimeError::Internal`] if it panicked.
    fn join_snapshot(&mut self) -> Result<()> {
        let Some(mut in_flight) = self.in_flight.take() else {
            return Ok(());
        };
        let written = in_flight.join(&self.id)?;
        for w in written {
            self.chains[w.stage] = w.chain;
            if let Stage::Operator(op) = &mut self.stages[w.stage]
                && let Some(ks) = op.state_mut()
            {
                ks.remove_expired_later(w.expired);
            }
        }
        Ok(())
    }

    /// Deletes the expired TTL entries a synchronous snapshot found, at once.
    fn remove_expired(&mut self, written: Written) -> Result<()> {
        for w in written {
            let stage = w.stage;
            self.chains[stage] = w.chain;
            if let Stage::Operator(op) = &mut self.stages[stage]
                && let Some(ks) = op.state_mut()
            {
                ks.remove_expired_later(w.expired);
                ks.flush(false).map_err(|e| RuntimeError::Io {
                    path: format!("state of operator `{}`", self.sites[stage].operator),
                    message: e.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// End of all input: the final watermark (+inf) fires every event-time timer, then
    /// every pending processing-time timer fires (bounded jobs drain them), each
    /// operator's `finish` output flows down the rest of the chain, the end marker goes
    /// downstream, and the coordinator hears of it (design §5.9).
    fn end_of_data(&mut self) -> Result<()> {
        if self.watermark < i64::MAX {
            self.advance_watermark(i64::MAX)?;
        }
        // Bounded input: processing time also runs to the end, so processing-time
        // windows and timeouts still pending fire now rather than never.
        self.fire_processing_timers_until(i64::MAX)?;
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let out = op.finish()?;
                self.route_side_outputs(i)?;
                self.push(i + 1, 0, out)?;
            }
        }
        for out in &mut self.outputs {
            out.broadcast(&Message::End)?;
        }
        // The coordinator hears of the end only once the last snapshot is acknowledged.
        self.join_snapshot()?;
        self.data_ended = true;
        self.send(TaskEvent::EndOfData {
            attempt: self.attempt,
            task: self.id.clone(),
        });
        Ok(())
    }

    /// Pushes `batch` into stage `from` (as input `input`) and on down the chain.
    fn push(&mut self, from: usize, input: u32, batch: Batch) -> Result<()> {
        if batch.ends.is_empty() {
            return Ok(());
        }
        if batch.ends.len() > self.max_batch && from < self.stages.len() {
            for piece in split_batch(&batch, self.max_batch) {
                self.push(from, input, piece)?;
            }
            return Ok(());
        }
        if from == self.stages.len() {
            let site = &self.sites[self.sites.len() - 1];
            self.report.records_out += batch.ends.len() as u64;
            self.metrics
                .records_out(batch.ends.len() as u64, payload_bytes(&batch));
            return emit_to(&mut self.outputs, None, batch, site);
        }
        match &mut self.stages[from] {
            Stage::Operator(op) => {
                let out = match op.try_process(input, batch)? {
                    Ok(out) => out,
                    Err(rejected) => return self.on_rejected(from, input, rejected),
                };
                self.route_side_outputs(from)?;
                self.push(from + 1, 0, out)
            }
            Stage::Sink(sink) => {
                let txn = self
                    .sink
                    .as_ref()
                    .map(|s| s.txn.as_str())
                    .unwrap_or_default();
                let n = batch.ends.len() as u64;
                self.metrics.records_out(n, payload_bytes(&batch));
                sink.write(txn, batch)?;
                self.report.records_out += n;
                self.progress.add_written(n);
                Ok(())
            }
            Stage::Source(_) => Err(RuntimeError::Internal(
                "a source can only head a chain".into(),
            )),
        }
    }

    /// Sends what stage `i` emitted to side outputs during its last call to the edges
    /// reading them. Only a chain's tail can have such edges (the planner never chains
    /// past an operator whose side output is read); anything else is dropped and
    /// counted as `side_output_dropped`.
    fn route_side_outputs(&mut self, i: usize) -> Result<()> {
        let Stage::Operator(op) = &mut self.stages[i] else {
            return Ok(());
        };
        let side = op.take_side_outputs();
        if side.is_empty() {
            return Ok(());
        }
        for (tag, batch) in side {
            self.emit_side(i, &tag, batch)?;
        }
        Ok(())
    }

    /// Sends `batch` from stage `i` to the edges reading its side output `tag`, or
    /// counts it as `side_output_dropped.<tag>` ([`Self::route_side_outputs`]).
    fn emit_side(&mut self, i: usize, tag: &str, batch: Batch) -> Result<()> {
        let read =
            i + 1 == self.stages.len() && self.outputs.iter().any(|o| o.output() == Some(tag));
        if read {
            self.report.records_out += batch.ends.len() as u64;
            self.metrics
                .records_out(batch.ends.len() as u64, payload_bytes(&batch));
            emit_to(&mut self.outputs, Some(tag), batch, &self.sites[i])
        } else {
            self.count(i, &format!("side_output_dropped.{tag}"), batch.len() as u64);
            Ok(())
        }
    }

    /// Adds `n` to the host counter `name` of stage `i`'s operator.
    fn count(&mut self, i: usize, name: &str, n: u64) {
        let per_op = self
            .report
            .counters
            .entry(self.sites[i].operator.clone())
            .or_default();
        *per_op.entry(name.to_owned()).or_default() += n;
    }

    fn operator(&mut self, i: usize) -> &mut OperatorInstance {
        match &mut self.stages[i] {
            Stage::Operator(op) => op,
            _ => unreachable!("stage {i} processed records, so it is an operator"),
        }
    }

    /// Stage `i`'s `process` reported a guest error for a batch (job-file `on_error`; the
    /// isolation rule is in [`error_policy`]). The failed call's output and side outputs
    /// are dropped. With `skip` or `dead-letter` (stateless operators only, so the
    /// failed call left nothing behind) the batch is processed again one record at a
    /// time: each good record's output goes on down the chain, exactly once; each record
    /// that fails alone is counted and dropped (`records_skipped`) or sent with its
    /// error to the side output `errors` (`records_dead_lettered`). With `fail`, and for
    /// an `io` error (about the channel to the outside world, not the record; recovery
    /// retries it), the task fails naming the record.
    fn on_rejected(&mut self, i: usize, input: u32, rejected: Rejected) -> Result<()> {
        let Rejected {
            error,
            input: batch,
        } = rejected;
        drop(self.operator(i).take_side_outputs());
        if is_io(&error) {
            return Err(error);
        }
        let policy = self.policies[i];
        if policy == ErrorPolicy::Fail {
            return Err(self.name_failed_record(i, input, error, &batch));
        }
        let mut out = Batch::default();
        let mut dead = Batch::default();
        let (mut skipped, mut dead_lettered) = (0u64, 0u64);
        for r in 0..batch.len() {
            let one = error_policy::one_record(&batch, r);
            match self.operator(i).try_process(input, one)? {
                Ok(o) => {
                    self.route_side_outputs(i)?;
                    if let Some(full) = error_policy::append(&mut out, o) {
                        self.push(i + 1, 0, full)?;
                    }
                }
                Err(Rejected { error, input: one }) => {
                    drop(self.operator(i).take_side_outputs());
                    let RuntimeError::Guest { code, message, .. } = &error else {
                        unreachable!("try_process rejects with guest errors only");
                    };
                    if *code == "io" {
                        return Err(with_record(error, &one.data));
                    }
                    if policy == ErrorPolicy::Skip {
                        skipped += 1;
                    } else {
                        let letter =
                            error_policy::dead_letter(&self.sites[i], input, &one, code, message);
                        if let Some(full) = error_policy::append(&mut dead, letter) {
                            self.emit_side(i, DEAD_LETTER_OUTPUT, full)?;
                        }
                        dead_lettered += 1;
                    }
                }
            }
        }
        if skipped + dead_lettered == 0 {
            tracing::warn!(
                site = %self.sites[i],
                "a batch of {} records failed ({error}) but none of its records fails alone;                  processed them one by one",
                batch.len()
            );
        }
        if skipped > 0 {
            self.count(i, "records_skipped", skipped);
            self.metrics.skipped(skipped);
        }
        if dead_lettered > 0 {
            self.count(i, "records_dead_lettered", dead_lettered);
            self.metrics.dead_lettered(dead_lettered);
        }
        self.push(i + 1, 0, out)?;
        if !dead.is_empty() {
            self.emit_side(i, DEAD_LETTER_OUTPUT, dead)?;
        }
        Ok(())
    }

    /// `error` (stage `i` rejected `batch`) with the failing record named: the batch's
    /// only record, or the first record that fails alone when the batch is run again one
    /// record at a time (only to find it: outputs are dropped and the task fails anyway,
    /// so state the re-run touches is discarded with the attempt). If none fails alone,
    /// the error names the batch's first record and says so.
    fn name_failed_record(
        &mut self,
        i: usize,
        input: u32,
        error: RuntimeError,
        batch: &Batch,
    ) -> RuntimeError {
        if batch.len() <= 1 {
            return with_record(error, &batch.data);
        }
        for r in 0..batch.len() {
            let one = error_policy::one_record(batch, r);
            let result = self.operator(i).try_process(input, one);
            drop(self.operator(i).take_side_outputs());
            match result {
                Ok(Ok(_)) => {}
                Ok(Err(rejected)) => return with_record(error, &rejected.input.data),
                // The instance broke while looking: report what was asked in the first place.
                Err(_) => return error,
            }
        }
        let first = error_policy::one_record(batch, 0);
        let mut error = with_record(error, &first.data);
        if let RuntimeError::Guest { message, .. } = &mut error {
            *message = format!(
                "{message} (a batch of {} records failed, but none of them fails alone; the \
                 record shown is the batch's first)",
                batch.len()
            )
            .into();
        }
        error
    }

    /// Task watermark = minimum over inputs that have neither ended nor gone idle
    /// (design §8.5); never decreasing. When every open input is idle, the outputs are
    /// marked idle too; the next watermark clears the mark downstream.
    fn maybe_advance(&mut self) -> Result<()> {
        let open = self.inputs.iter().filter(|c| !c.ended);
        let wm = open.clone().filter(|c| !c.idle).map(|c| c.watermark).min();
        let all_idle = wm.is_none() && open.count() > 0;
        if all_idle {
            if !self.output_idle {
                self.output_idle = true;
                for out in &mut self.outputs {
                    out.broadcast(&Message::Idle)?;
                }
            }
            return Ok(());
        }
        match wm {
            Some(w) if w > self.watermark => {
                self.output_idle = false;
                self.advance_watermark(w)
            }
            Some(_) if self.output_idle => {
                self.output_idle = false;
                let w = self.watermark;
                for out in &mut self.outputs {
                    out.broadcast(&Message::Watermark(w))?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn advance_watermark(&mut self, wm: i64) -> Result<()> {
        self.watermark = wm;
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let due = op.take_due_event_timers(wm)?;
                let fired = if due.is_empty() {
                    None
                } else {
                    Some(op.on_timers(&due)?)
                };
                let out = op.on_watermark(wm)?;
                self.route_side_outputs(i)?;
                if let Some(f) = fired {
                    self.push(i + 1, 0, f)?;
                }
                self.push(i + 1, 0, out)?;
            }
        }
        for out in &mut self.outputs {
            out.broadcast(&Message::Watermark(wm))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_batch_keeps_records_keys_and_timestamps() {
        let mut b = Batch {
            data: Vec::new(),
            ends: Vec::new(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        };
        for i in 0..10u32 {
            b.data.extend_from_slice(format!("r{i}").as_bytes());
            b.ends.push(b.data.len() as u32);
            b.keys.extend_from_slice(format!("k{}", i % 3).as_bytes());
            b.key_ends.push(b.keys.len() as u32);
            b.timestamps.push(i64::from(i));
        }
        let pieces = split_batch(&b, 4);
        assert_eq!(
            pieces.iter().map(|p| p.ends.len()).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        let mut i = 0;
        for p in &pieces {
            let mut s = 0;
            let mut ks = 0;
            for (j, &e) in p.ends.iter().enumerate() {
                assert_eq!(&p.data[s..e as usize], format!("r{i}").as_bytes());
                let ke = p.key_ends[j] as usize;
                assert_eq!(&p.keys[ks..ke], format!("k{}", i % 3).as_bytes());
                assert_eq!(p.timestamps[j], i as i64);
                s = e as usize;
                ks = ke;
                i += 1;
            }
        }
        assert_eq!(i, 10);
    }
}
