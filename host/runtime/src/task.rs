//! The task driver: one thread per subtask runs its operator chain (design §5): a source
//! reader or an input gate at the head, operators in chain order, and either a sink or
//! the output edges at the tail.

use crate::bindings::{Batch, Split, TaskInfo};
use crate::error::{Result, RuntimeError, Site};
use crate::job::JobProgress;
use crate::partition::OutputEdge;
use crate::plugin::{
    Instance, InstanceOptions, LoadedPlugin, OperatorInstance, SinkInstance, SourceInstance,
};
use crate::transport::Message;
use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender};
use nop_stream_api::{ChannelId, TaskId};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often blocked loops look at the cancel flag.
const POLL: Duration = Duration::from_millis(100);

/// What a task reports to the coordinator.
#[derive(Debug)]
pub(crate) enum TaskEvent {
    /// The sink of the task pre-committed its transaction for the final epoch.
    PreCommitted {
        task: TaskId,
        sink: Site,
        txn: String,
        committable: Vec<u8>,
    },
    /// The task ended normally.
    Finished { report: TaskReport },
    /// The task failed.
    Failed { task: TaskId, error: RuntimeError },
}

/// What the coordinator tells a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskCommand {
    /// The epoch is durable: commit the pre-committed transaction.
    Commit,
    /// The job failed: abort the transaction.
    Abort,
}

/// Per-task figures.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TaskReport {
    /// `job/pipeline/vertex/subtask`.
    pub task: String,
    /// Records that entered the chain (read by a source head or received).
    pub records_in: u64,
    /// Records emitted on output edges or written by a sink.
    pub records_out: u64,
    /// Plugin-defined counters, by operator name.
    pub counters: BTreeMap<String, BTreeMap<String, u64>>,
}

/// One member of the chain, as planned.
pub(crate) struct StageSpec {
    pub plugin: Arc<LoadedPlugin>,
    pub options: InstanceOptions,
    pub task_info: TaskInfo,
    pub config: String,
}

pub(crate) struct InputChannel {
    pub id: ChannelId,
    pub rx: Receiver<Message>,
    pub input_index: u32,
    pub watermark: i64,
    pub ended: bool,
}

/// Everything a task thread needs.
pub(crate) struct TaskSpec {
    pub task: TaskId,
    pub stages: Vec<StageSpec>,
    pub inputs: Vec<InputChannel>,
    pub outputs: Vec<OutputEdge>,
    pub splits: Vec<Split>,
    pub batch_records: u32,
    /// Transaction id of the sink at the tail (final epoch), if any.
    pub sink_txn: Option<String>,
    pub events: Sender<TaskEvent>,
    pub commands: Receiver<TaskCommand>,
    pub progress: Arc<JobProgress>,
    pub cancel: Arc<AtomicBool>,
}

enum Stage {
    Source(SourceInstance),
    Operator(OperatorInstance),
    Sink(SinkInstance),
}

struct Task {
    stages: Vec<Stage>,
    sites: Vec<Site>,
    outputs: Vec<OutputEdge>,
    max_batch: usize,
    sink_txn: Option<String>,
    watermark: i64,
    report: TaskReport,
    progress: Arc<JobProgress>,
}

/// Runs a task to completion on the current thread and reports to the coordinator.
pub(crate) fn run(spec: TaskSpec) {
    let task_id = spec.task.clone();
    let events = spec.events.clone();
    let cancel = Arc::clone(&spec.cancel);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drive(spec)));
    let event = match outcome {
        Ok(Ok(report)) => TaskEvent::Finished { report },
        Ok(Err(error)) => TaskEvent::Failed {
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
        stages: stage_specs,
        mut inputs,
        outputs,
        splits,
        batch_records,
        sink_txn,
        events,
        commands,
        progress,
        cancel,
    } = spec;
    let mut stages = Vec::with_capacity(stage_specs.len());
    let mut sites = Vec::with_capacity(stage_specs.len());
    for s in &stage_specs {
        let mut inst = s.plugin.instantiate(&s.options)?;
        match &mut inst {
            Instance::Source(i) => i.open(&s.task_info, &s.config)?,
            Instance::Operator(i) => i.open(&s.task_info, &s.config)?,
            Instance::Sink(i) => {
                i.open(&s.task_info, &s.config)?;
                if let Some(txn) = &sink_txn {
                    i.begin(txn)?;
                }
            }
        }
        stages.push(match inst {
            Instance::Source(i) => Stage::Source(i),
            Instance::Operator(i) => Stage::Operator(i),
            Instance::Sink(i) => Stage::Sink(i),
        });
        sites.push(s.options.site.clone());
    }
    let mut t = Task {
        stages,
        sites,
        outputs,
        max_batch: batch_records.max(1) as usize,
        sink_txn,
        watermark: i64::MIN,
        report: TaskReport {
            task: task.to_string(),
            ..TaskReport::default()
        },
        progress,
    };

    if matches!(t.stages.first(), Some(Stage::Source(_))) {
        t.read_splits(&splits, batch_records, &cancel)?;
    } else {
        t.consume_inputs(&mut inputs, &cancel)?;
    }
    t.finish()?;
    for out in &mut t.outputs {
        out.broadcast(&Message::End)?;
    }
    // Two-phase commit of the final epoch (seed §5.9, §7.3): pre-commit, then commit only
    // when the coordinator says the epoch is durable.
    if let (Some(txn), Some(Stage::Sink(sink))) = (t.sink_txn.clone(), t.stages.last_mut()) {
        let committable = sink.pre_commit(&txn)?;
        let _ = events.send(TaskEvent::PreCommitted {
            task: task.clone(),
            sink: sink.site().clone(),
            txn: txn.clone(),
            committable: committable.clone(),
        });
        loop {
            match commands.recv_timeout(POLL) {
                Ok(TaskCommand::Commit) => {
                    commit_with_recovery(sink, &txn, &committable)?;
                    break;
                }
                Ok(TaskCommand::Abort) => {
                    sink.abort(&txn)?;
                    return Err(RuntimeError::Cancelled);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if cancel.load(Ordering::Relaxed) {
                        sink.abort(&txn)?;
                        return Err(RuntimeError::Cancelled);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    sink.abort(&txn)?;
                    return Err(RuntimeError::Cancelled);
                }
            }
        }
    }
    for (stage, site) in t.stages.iter_mut().zip(&t.sites) {
        match stage {
            Stage::Source(i) => i.close()?,
            Stage::Operator(i) => {
                if !i.counters().is_empty() {
                    t.report
                        .counters
                        .insert(site.operator.clone(), i.counters().clone());
                }
                i.close()?
            }
            Stage::Sink(i) => i.close()?,
        }
    }
    Ok(t.report)
}

/// Commits; if the commit call fails, asks `recover` whether it happened anyway (a lost
/// reply), and never reports an unknown outcome as committed (seed §5.7, design §6).
fn commit_with_recovery(sink: &mut SinkInstance, txn: &str, committable: &[u8]) -> Result<()> {
    use crate::bindings::CommitOutcome;
    match sink.commit(committable) {
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
                    "failed ({first}) and its outcome is unknown (expired or lost); refusing to report it as committed"
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

impl Task {
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
            for out in &mut self.outputs {
                out.emit(&batch, site)?;
            }
            return Ok(());
        }
        match &mut self.stages[from] {
            Stage::Operator(op) => {
                let out = op.process(input, &batch)?;
                self.push(from + 1, 0, out)
            }
            Stage::Sink(sink) => {
                let txn = self.sink_txn.as_deref().unwrap_or_default();
                sink.write(txn, &batch)?;
                let n = batch.ends.len() as u64;
                self.report.records_out += n;
                self.progress.add_written(n);
                Ok(())
            }
            Stage::Source(_) => Err(RuntimeError::Internal(
                "a source can only head a chain".into(),
            )),
        }
    }

    fn read_splits(
        &mut self,
        splits: &[Split],
        batch_records: u32,
        cancel: &AtomicBool,
    ) -> Result<()> {
        let Some(Stage::Source(_)) = self.stages.first() else {
            return Ok(());
        };
        for split in splits {
            let mut cursor = Vec::new();
            loop {
                if cancel.load(Ordering::Relaxed) {
                    return Err(RuntimeError::Cancelled);
                }
                let Some(Stage::Source(src)) = self.stages.first_mut() else {
                    unreachable!("checked above");
                };
                let r = src.read(split, &cursor, batch_records)?;
                let n = r.records.ends.len() as u64;
                self.report.records_in += n;
                self.progress
                    .record_read(&split.id, n, r.progress.consumed, r.progress.total);
                self.push(1, 0, r.records)?;
                cursor = r.next_cursor;
                if r.finished {
                    break;
                }
                if n == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        Ok(())
    }

    fn consume_inputs(&mut self, inputs: &mut [InputChannel], cancel: &AtomicBool) -> Result<()> {
        loop {
            let active: Vec<usize> = (0..inputs.len()).filter(|&i| !inputs[i].ended).collect();
            if active.is_empty() {
                return Ok(());
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(RuntimeError::Cancelled);
            }
            let (idx, msg) = if active.len() == 1 {
                let i = active[0];
                match inputs[i].rx.recv_timeout(POLL) {
                    Ok(m) => (i, Ok(m)),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => (i, Err(())),
                }
            } else {
                let mut sel = Select::new();
                for &i in &active {
                    sel.recv(&inputs[i].rx);
                }
                match sel.select_timeout(POLL) {
                    Ok(op) => {
                        let i = active[op.index()];
                        (i, op.recv(&inputs[i].rx).map_err(|_| ()))
                    }
                    Err(_) => continue,
                }
            };
            match msg {
                Ok(Message::Records(b)) => {
                    self.report.records_in += b.ends.len() as u64;
                    let input = inputs[idx].input_index;
                    self.push(0, input, b)?;
                }
                Ok(Message::Watermark(w)) => {
                    inputs[idx].watermark = inputs[idx].watermark.max(w);
                    self.maybe_advance(inputs)?;
                }
                Ok(Message::Barrier(epoch)) => {
                    return Err(RuntimeError::Internal(format!(
                        "barrier {epoch} on {}: checkpoint barriers are not handled by this runtime version",
                        inputs[idx].id
                    )));
                }
                Ok(Message::End) => {
                    inputs[idx].ended = true;
                    self.maybe_advance(inputs)?;
                }
                Err(()) => {
                    if cancel.load(Ordering::Relaxed) {
                        return Err(RuntimeError::Cancelled);
                    }
                    return Err(RuntimeError::ChannelClosed {
                        channel: inputs[idx].id.clone(),
                        message: "the sending task ended without an end marker".into(),
                    });
                }
            }
        }
    }

    /// Task watermark = minimum over non-ended inputs (all ended: +inf is left to
    /// `finish`).
    fn maybe_advance(&mut self, inputs: &[InputChannel]) -> Result<()> {
        let wm = inputs
            .iter()
            .filter(|c| !c.ended)
            .map(|c| c.watermark)
            .min();
        match wm {
            Some(w) if w > self.watermark => self.advance_watermark(w),
            _ => Ok(()),
        }
    }

    fn advance_watermark(&mut self, wm: i64) -> Result<()> {
        self.watermark = wm;
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let due = op.take_due_event_timers(wm);
                let fired = if due.is_empty() {
                    None
                } else {
                    Some(op.on_timers(&due)?)
                };
                let out = op.on_watermark(wm)?;
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

    /// End of input: the final watermark (+inf) fires every event-time timer, then each
    /// operator's `finish` output flows down the rest of the chain in order.
    fn finish(&mut self) -> Result<()> {
        if self.watermark < i64::MAX {
            self.advance_watermark(i64::MAX)?;
        }
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let out = op.finish()?;
                self.push(i + 1, 0, out)?;
            }
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
