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

mod checkpoint;
mod records;
mod restore;

use crate::compaction::Compaction;
use crate::partition::OutputEdge;
use crate::progress::JobProgress;
use crate::transport::{ChannelReceiver, Message};
use checkpoint::InFlightSnapshot;
use crossbeam_channel::{Receiver, Select, Sender};
use nop_stream_api::{AttemptId, ChannelId, EpochId, TaskId};
use nop_stream_api::{Split, TaskInfo};
use nop_stream_checkpoint::alignment::{Aligner, Alignment as AlignOutcome};
use nop_stream_checkpoint::failpoint;
use nop_stream_checkpoint::{Namespace, PendingTransaction, SegmentDescriptor};
use nop_stream_core::{ErrorPolicy, WatermarkSpec};
use nop_stream_plugin_host::{
    CommitOutcome, Instance, InstanceOptions, LoadedPlugin, OperatorInstance, Result, RuntimeError,
    SinkInstance, Site, SourceInstance,
};
use nop_stream_proto::TaskRestorePlan;
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
/// sleeping task is not registered with the channel, so the send needs no wake
/// (`bench/RESULTS.md` has the measurement and the lengths tried). It delays a message
/// that arrives during the sleep by at most this, plus the kernel's timer slack (50 µs by
/// default), per hop.
const LINGER: Duration = Duration::from_micros(100);

pub(crate) type TaskEvent = nop_stream_proto::TaskEvent<RuntimeError>;
pub use crate::snapshot_policy::MAX_DELTAS;
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

enum Stage {
    Source(SourceInstance),
    Operator(OperatorInstance),
    Sink(SinkInstance),
}

/// Watermarks of every subtask of one source, for watermark alignment
/// ([`WatermarkSpec::max_drift_ms`], design §8.5). Finished or idle subtasks publish
/// `i64::MAX`. The subtasks that run in this process publish their own slots; the slots of
/// subtasks elsewhere are written from the coordinator's relay ([`Self::set_remote`]).
#[derive(Debug)]
pub(crate) struct WatermarkAlignment {
    watermarks: std::sync::Mutex<Vec<i64>>,
    /// Per slot, whether its subtask runs in this process.
    local: Vec<bool>,
}

impl WatermarkAlignment {
    /// A table for a source of `subtasks` subtasks of which `local` run here. Every slot
    /// starts at `i64::MIN`: a local subtask has not read yet, a remote one has not been
    /// reported yet; either holds the others back until it is (see
    /// [`crate::launch::TaskHost::prepare`]).
    pub(crate) fn new(subtasks: usize, local: &std::collections::BTreeSet<usize>) -> Self {
        WatermarkAlignment {
            watermarks: std::sync::Mutex::new(vec![i64::MIN; subtasks]),
            local: (0..subtasks).map(|i| local.contains(&i)).collect(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.watermarks.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn publish(&self, slot: usize, watermark: i64) {
        self.lock()[slot] = watermark;
    }

    /// The slowest watermark among the other subtasks.
    pub(crate) fn slowest_other(&self, slot: usize) -> i64 {
        self.lock()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != slot)
            .map(|(_, w)| *w)
            .min()
            .unwrap_or(i64::MAX)
    }

    /// The watermarks of the subtasks that run here: `(subtask, watermark)`, ascending.
    pub(crate) fn local_watermarks(&self) -> Vec<(u32, i64)> {
        let w = self.lock();
        self.local
            .iter()
            .enumerate()
            .filter(|(_, l)| **l)
            .map(|(i, _)| (i as u32, w[i]))
            .collect()
    }

    /// Writes the watermarks of subtasks that run elsewhere; entries naming a local
    /// subtask or no subtask of the source are ignored. Returns how many were written.
    pub(crate) fn set_remote(&self, entries: &[(u32, i64)]) -> usize {
        let mut w = self.lock();
        let mut written = 0;
        for &(sub, wm) in entries {
            let i = sub as usize;
            if self.local.get(i).is_some_and(|l| !*l) {
                w[i] = wm;
                written += 1;
            }
        }
        written
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
    /// [`crate::snapshot_policy::plan`]; empty: nothing snapshotted yet; `None`: not
    /// incremental, or the next snapshot must be full after a failed compaction).
    chains: Vec<Option<Vec<SegmentDescriptor>>>,
    /// Per stage, its background compaction, if one runs or awaits adoption
    /// ([`Compaction`]).
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
pub(super) fn payload_bytes(b: &nop_stream_api::Batch) -> u64 {
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
    if let Ok(Err(RuntimeError::Trap { .. } | RuntimeError::LimitExceeded { .. })) = &outcome {
        metrics.trapped();
    }
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
    let mut t = Task::open(spec)?;
    t.run()?;
    // The last epoch's segments are durable and acknowledged before the task finishes.
    t.join_snapshot()?;
    t.close()
}

/// The instances of a chain, opened in chain order, with their sites and operator ids.
struct OpenedStages {
    stages: Vec<Stage>,
    sites: Vec<Site>,
    operator_ids: Vec<String>,
}

/// Instantiates and opens every member of the chain. Non-keyed operator state is in
/// place before `open`, so the plugin can read it there (as Flink's initializeState
/// precedes open).
fn open_stages(
    specs: &[StageSpec],
    restore: &TaskRestorePlan,
    storage: &Namespace,
) -> Result<OpenedStages> {
    let mut opened = OpenedStages {
        stages: Vec::with_capacity(specs.len()),
        sites: Vec::with_capacity(specs.len()),
        operator_ids: Vec::with_capacity(specs.len()),
    };
    for s in specs {
        let mut inst = s.plugin.instantiate(&s.options)?;
        if let Instance::Operator(op) = &mut inst
            && let Some(r) = restore.operator_state.get(&s.operator_id)
        {
            restore::restore_operator_state(
                op,
                storage,
                restore.epoch.map_or(0, |e| e.0),
                &s.operator_id,
                r,
                &s.task_info,
            )?;
        }
        opened.stages.push(match inst {
            Instance::Source(mut i) => {
                i.open(&s.task_info, &s.config)?;
                Stage::Source(i)
            }
            Instance::Operator(mut i) => {
                i.open(&s.task_info, &s.config)?;
                Stage::Operator(i)
            }
            Instance::Sink(mut i) => {
                i.open(&s.task_info, &s.config)?;
                Stage::Sink(i)
            }
        });
        opened.sites.push(s.options.site.clone());
        opened.operator_ids.push(s.operator_id.clone());
    }
    Ok(opened)
}

/// The source splits of a task, at the cursors the restore plan holds for them.
fn restored_splits(splits: Vec<Split>, restore: &TaskRestorePlan) -> Vec<SplitCursor> {
    splits
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
        .collect()
}

impl Task {
    /// Opens the chain and puts back what the restore plan holds: keyed and operator
    /// state, timers, channel watermarks and ended inputs, split cursors; then recovers
    /// the sink ([`Self::recover_sink`]).
    fn open(spec: TaskSpec) -> Result<Task> {
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
        let OpenedStages {
            mut stages,
            sites,
            operator_ids,
        } = open_stages(&stage_specs, &restore, &storage)?;
        // Before the restore: a restored state tracks its changes from the restored chain.
        for stage in &mut stages {
            if let Stage::Operator(op) = stage
                && let Some(ks) = op.state_mut()
            {
                ks.set_incremental(incremental_snapshots);
            }
        }
        let restored_chains = restore::restore_keyed_state(
            &mut stages,
            &stage_specs,
            &sites,
            &restore,
            &storage,
            incremental_snapshots,
            (&task, attempt),
        )?;
        failpoint::hit("during-restore");
        for c in &mut inputs {
            // By the channel's own entry, else by its edge's (design §8.5).
            let (watermark, ended) = nop_stream_checkpoint::restored_channel(
                &c.id,
                |k| restore.watermarks.get(k).copied(),
                |k| restore.ended_inputs.contains(k),
            );
            if let Some(w) = watermark {
                c.watermark = w;
            }
            c.ended = ended;
        }
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
            policies: stage_specs.iter().map(|s| s.on_error).collect(),
            outputs,
            aligner: Aligner::new(inputs.len()),
            inputs,
            splits: restored_splits(splits, &restore),
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
        if let Some(prefix) = sink_txn_prefix {
            let restored = restore.epoch.map_or(0, |e| e.0);
            t.recover_sink(prefix, &restore.pending, restored, first_epoch)?;
        }
        if t.data_ended {
            t.send(TaskEvent::EndOfData {
                attempt: t.attempt,
                task: t.id.clone(),
            });
        }
        Ok(t)
    }

    /// Sink recovery (design §7.3 "on recovery", §7.4): commits the durable pre-committed
    /// transactions, then aborts every pending one of this subtask and, listed or not, its
    /// transaction of every epoch after the `restored` one that an earlier generation may
    /// have begun (up to `first_epoch`): a sink that finds one of those committed fails
    /// there, loudly, instead of letting the replay repeat it. Then begins the transaction
    /// of `first_epoch`.
    fn recover_sink(
        &mut self,
        prefix: String,
        pending: &[PendingTransaction],
        restored: u64,
        first_epoch: EpochId,
    ) -> Result<()> {
        let Some(Stage::Sink(sink)) = self.stages.last_mut() else {
            return Ok(());
        };
        for p in pending {
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
        for epoch in restored + 1..first_epoch.0 {
            let txn = format!("{prefix}{epoch}");
            if !listed.contains(&txn) {
                tracing::debug!(%txn, "aborting the transaction of a non-durable epoch, if any");
                sink.abort(&txn)?;
            }
        }
        let txn = format!("{prefix}{first_epoch}");
        sink.begin(&txn)?;
        self.sink = Some(SinkState {
            prefix,
            txn,
            pending: Vec::new(),
        });
        Ok(())
    }

    /// Closes every instance; the report, with each operator's own counters merged into
    /// the host's (skipped, dropped).
    fn close(mut self) -> Result<TaskReport> {
        for (stage, site) in self.stages.iter_mut().zip(&self.sites) {
            match stage {
                Stage::Source(i) => i.close()?,
                Stage::Operator(i) => {
                    if !i.counters().is_empty() {
                        let mine = self
                            .report
                            .counters
                            .entry(site.operator.clone())
                            .or_default();
                        for (name, n) in i.counters() {
                            *mine.entry(name.clone()).or_default() += n;
                        }
                    }
                    i.close()?
                }
                Stage::Sink(i) => i.close()?,
            }
        }
        Ok(std::mem::take(&mut self.report))
    }

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
            self.pause(Duration::from_millis(1));
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
                self.pause(Duration::from_millis(1));
            }
        } else {
            self.empty_reads = 0;
        }
        Ok(())
    }

    /// A source's pause (caught up, or ahead of the watermark alignment): idle time.
    fn pause(&self, d: Duration) {
        let started = Instant::now();
        std::thread::sleep(d);
        self.metrics.idle(started.elapsed());
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
                self.metrics.timers_fired(due.timers() as u64);
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
        // Idle time: from here until a message or command is taken (design §15); the
        // flush of buffered output counts as backpressure instead (its sender times it).
        let mut waited = std::time::Instant::now();
        if nothing_ready {
            if self.outputs.iter().any(OutputEdge::has_buffered) {
                // About to wait: records buffered on HASH edges go out first, so that a
                // quiet input never holds back output already produced.
                self.flush_outputs()?;
                waited = std::time::Instant::now();
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
            Err(_) => {
                self.metrics.idle(waited.elapsed());
                return Ok(false);
            }
        };
        self.metrics.idle(waited.elapsed());
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
        self.metrics.sink_pending(sink_state.pending.len());
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
        if !self.is_source() {
            self.metrics.input_watermark(wm);
        }
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let due = op.take_due_event_timers(wm)?;
                let fired = if due.is_empty() {
                    None
                } else {
                    self.metrics.timers_fired(due.timers() as u64);
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
        self.metrics.output_watermark(wm);
        Ok(())
    }
}

/// Commits; if the commit call fails, asks `recover` whether it happened anyway (a lost
/// reply), and never reports an unknown outcome as committed (design §5.7).
pub(crate) fn commit_with_recovery(
    sink: &mut SinkInstance,
    txn: &str,
    committable: &[u8],
) -> Result<()> {
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
