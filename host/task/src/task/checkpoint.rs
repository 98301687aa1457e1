//! A task's part of an epoch checkpoint (design §5.3–§5.5): at the barrier the task
//! thread lets operators prepare, pre-commits the sink, and per stateful operator syncs
//! timers, copies its operator state and takes a view of its keyed state, a delta or a
//! full one as [`snapshot_policy::plan`] decides; then the segment files are written (in
//! the background by default), made durable, and only then acknowledged.

use super::{Stage, Task, TaskEvent};
use crate::compaction::{Compaction, CompactionSpec};
use crate::segment::SegmentAppender;
use crate::snapshot_policy::{self, KeyedSnapshot};
use crate::transport::Message;
use nop_stream_api::{EpochId, TaskId};
use nop_stream_checkpoint::{
    Namespace, PendingTransaction, SegmentDescriptor, SplitState, TaskSnapshot, failpoint, payload,
    payload_checksum,
};
use nop_stream_plugin_host::{Result, RuntimeError};
use nop_stream_state::{ExpiredKeys, KeyedState, ShardSnapshot, SnapshotView};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

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
        let mut out = SegmentAppender::new(&target.storage, &file);
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

/// The background part of one epoch's snapshot ([`write_segments`] on its own thread,
/// then the Ack). Dropping it without [`InFlightSnapshot::join`] (a task failing or
/// cancelled) asks the thread to stop at the next shard and waits for it, so no write
/// outlives the task; an abandoned snapshot sends no Ack.
pub(super) struct InFlightSnapshot {
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
    /// Takes the snapshot of `epoch` and forwards its barrier (design §5.3–§5.5).
    ///
    /// The task thread does the synchronous part: waits for the previous epoch's
    /// background part if it is still running (at most one in flight), adopts finished
    /// compactions, lets operators prepare, pre-commits the sink, then per stateful
    /// operator syncs timers, copies its operator state and takes a view of its keyed
    /// state ([`Self::operator_snapshots`]). It then forwards the barrier and goes on
    /// processing, while a background thread ([`write_segments`]) writes one segment file
    /// per operator, makes it durable, and only then sends the Ack. With
    /// `async_snapshots = false` (or nothing to scan) the task thread does that last part
    /// itself before forwarding the barrier.
    pub(super) fn checkpoint(&mut self, epoch: EpochId, alignment_ms: u64) -> Result<()> {
        let started = Instant::now();
        self.wait_for_previous_snapshot(epoch)?;
        self.adopt_compactions(epoch);
        self.prepare_operators(epoch)?;
        let sink_operator = self.pre_commit_sink(epoch)?;
        let parts = self.operator_snapshots(epoch)?;
        let snapshot = self.task_snapshot(epoch, sink_operator, alignment_ms);
        let any_keyed = parts.iter().any(|p| p.keyed.is_some());
        if snapshot_policy::write_on_task_thread(self.async_snapshots, any_keyed) {
            self.write_snapshot_now(parts, snapshot, started)
        } else {
            self.write_snapshot_in_background(parts, snapshot, started)
        }
    }

    /// Waits for the previous epoch's background part, if it still runs (at most one
    /// epoch's snapshot is in flight per task).
    fn wait_for_previous_snapshot(&mut self, epoch: EpochId) -> Result<()> {
        if self.in_flight.is_none() {
            return Ok(());
        }
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
        Ok(())
    }

    /// Operators flush what they cache and emit what must precede the barrier.
    fn prepare_operators(&mut self, epoch: EpochId) -> Result<()> {
        for i in 0..self.stages.len() {
            if let Stage::Operator(op) = &mut self.stages[i] {
                let out = op.prepare_checkpoint(epoch.0)?;
                self.route_side_outputs(i)?;
                self.push(i + 1, 0, out)?;
            }
        }
        Ok(())
    }

    /// A sink at the tail pre-commits this epoch's transaction and begins the next one at
    /// once (design §7.3); the sink's operator id, if there is one.
    fn pre_commit_sink(&mut self, epoch: EpochId) -> Result<Option<String>> {
        let (Some(sink_state), Some(Stage::Sink(sink))) =
            (self.sink.as_mut(), self.stages.last_mut())
        else {
            return Ok(None);
        };
        let committable = sink.pre_commit(&sink_state.txn)?;
        failpoint::hit("after-pre-commit");
        sink_state.pending.push(PendingTransaction {
            epoch,
            txn: sink_state.txn.clone(),
            committable: hex::encode(committable),
        });
        self.metrics.sink_pending(sink_state.pending.len());
        sink_state.txn = format!("{}{}", sink_state.prefix, epoch.0 + 1);
        sink.begin(&sink_state.txn)?;
        Ok(self.operator_ids.last().cloned())
    }

    /// Per stateful operator: timers into keyed state, the operator state's payloads
    /// (small, in memory) and a view of the keyed state ([`keyed_view`]).
    fn operator_snapshots(&mut self, epoch: EpochId) -> Result<Vec<OperatorSnapshot>> {
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
            // generation references (design §2.5, "Leases").
            let file = nop_stream_checkpoint::names::segment_file(
                epoch.0,
                &op_id,
                subtask,
                self.attempt.0,
            );
            let keyed = match op.state_mut() {
                Some(ks) => {
                    let at = ViewSite {
                        task: &self.id,
                        epoch,
                        operator: &self.sites[i].operator,
                        operator_id: &op_id,
                        file: &file,
                    };
                    let compaction = CompactionSpec {
                        storage: Arc::clone(&self.storage),
                        namespace: self.namespace.clone(),
                        operator: self.sites[i].operator.clone(),
                        operator_id: op_id.clone(),
                        subtask,
                        attempt: self.attempt.0,
                        epoch,
                        states: ks.descriptors().to_vec(),
                    };
                    let view = keyed_view(
                        ks,
                        &at,
                        self.chains[i].as_deref(),
                        &mut self.compactions[i],
                        compaction,
                    )?;
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
        Ok(parts)
    }

    /// The task's snapshot of `epoch` before its segments are written: split cursors,
    /// input watermarks per edge, ended inputs, the sink's pending transactions.
    fn task_snapshot(
        &mut self,
        epoch: EpochId,
        sink_operator: Option<String>,
        alignment_ms: u64,
    ) -> TaskSnapshot {
        // One watermark per input edge, not per channel: O(edges), not O(p²).
        let (watermarks, ended_inputs) = nop_stream_checkpoint::input_watermarks(
            self.inputs.iter().map(|c| (&c.id, c.watermark, c.ended)),
        );
        TaskSnapshot {
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
            watermarks,
            ended_inputs,
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
            // The first barrier arrived `alignment_ms` ago (a source: now, at injection).
            barrier_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
                .saturating_sub(alignment_ms),
            compacted_bytes: std::mem::take(&mut self.compacted_bytes),
            records_in_total: self.restored_totals.0 + self.report.records_in,
            records_out_total: self.restored_totals.1 + self.report.records_out,
        }
    }

    fn segment_target(&self) -> SegmentTarget {
        SegmentTarget {
            storage: Arc::clone(&self.storage),
            namespace: self.namespace.clone(),
            subtask: self.id.subtask.0,
        }
    }

    /// Writes the segments on the task thread, then forwards the barrier and acknowledges.
    fn write_snapshot_now(
        &mut self,
        parts: Vec<OperatorSnapshot>,
        mut snapshot: TaskSnapshot,
        started: Instant,
    ) -> Result<()> {
        let never = AtomicBool::new(false);
        let expired = write_segments(&self.segment_target(), parts, &mut snapshot, &never)?;
        self.remove_expired(expired)?;
        snapshot.duration_ms = started.elapsed().as_millis() as u64;
        for out in &mut self.outputs {
            out.broadcast(&Message::Barrier(snapshot.epoch))?;
        }
        self.report.epochs += 1;
        self.send(TaskEvent::Ack {
            attempt: self.attempt,
            snapshot: Box::new(snapshot),
        });
        Ok(())
    }

    /// Forwards the barrier, then hands the segments to a snapshot thread, which writes
    /// them, makes them durable and only then acknowledges.
    fn write_snapshot_in_background(
        &mut self,
        parts: Vec<OperatorSnapshot>,
        mut snapshot: TaskSnapshot,
        started: Instant,
    ) -> Result<()> {
        let epoch = snapshot.epoch;
        snapshot.duration_ms = started.elapsed().as_millis() as u64;
        for out in &mut self.outputs {
            out.broadcast(&Message::Barrier(epoch))?;
        }
        self.report.epochs += 1;
        let target = self.segment_target();
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
    pub(super) fn poll_snapshot(&mut self) -> Result<()> {
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
    pub(super) fn join_snapshot(&mut self) -> Result<()> {
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
}

/// Where a keyed view is taken, for logs and errors.
struct ViewSite<'a> {
    task: &'a TaskId,
    epoch: EpochId,
    operator: &'a str,
    operator_id: &'a str,
    file: &'a str,
}

/// The view of an operator's keyed state for this barrier, as [`snapshot_policy::plan`]
/// decides from its chain (`None`: the next snapshot is full) and its running compaction:
/// a delta, possibly starting a compaction of the chain (with `compaction`), or a full
/// view, which drops a running compaction of the old chain. A state that cannot hand over
/// a delta (it does not track its changes) gives a full view.
///
/// # Errors
/// [`RuntimeError::Io`] naming the operator and the segment file: the state database;
/// [`RuntimeError::Internal`] if the compaction thread cannot start.
fn keyed_view(
    ks: &mut KeyedState,
    at: &ViewSite<'_>,
    chain: Option<&[SegmentDescriptor]>,
    running: &mut Option<Compaction>,
    compaction: CompactionSpec,
) -> Result<SnapshotView> {
    // Read by the state budget test (target `nopstream::state`).
    tracing::debug!(
        target: "nopstream::state",
        task = %at.task, epoch = at.epoch.0, operator = %at.operator_id,
        evictions = ks.evictions(), cached_bytes = ks.cached_bytes(),
        "keyed state at the barrier"
    );
    let io = |e: nop_stream_state::StateError| RuntimeError::Io {
        path: format!("state of operator `{}` ({})", at.operator, at.file),
        message: e.to_string(),
    };
    let mut plan = snapshot_policy::plan(chain, running.is_some());
    let delta = if plan.is_delta() {
        ks.delta_view().map_err(io)?
    } else {
        None
    };
    if delta.is_none() {
        plan = plan.fallback();
    }
    match (plan, delta) {
        (KeyedSnapshot::DeltaWhileCompacting { start: true }, Some(view)) => {
            let base = chain.map(<[_]>::to_vec).unwrap_or_default();
            *running = Some(Compaction::start(compaction, base, ks.compactor())?);
            Ok(view)
        }
        (KeyedSnapshot::Delta | KeyedSnapshot::DeltaWhileCompacting { .. }, Some(view)) => Ok(view),
        _ => {
            // A full snapshot starts a new chain: a compaction of the old one is of no use.
            *running = None;
            ks.snapshot_view().map_err(io)
        }
    }
}
