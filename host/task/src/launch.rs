//! Building and running the tasks of one deployment on this process, whatever carries their
//! channels (design §2.5): the embedded mode runs every task of a deployment here over a
//! [`LocalTransport`](crate::transport::LocalTransport); a cluster node runs its share of
//! the tasks over a transport that keeps channels between its own subtasks in-process and
//! sends the others over QUIC.
//!
//! The steps are explicit so that a cluster can register every receiving channel on every
//! node before any producer opens a stream: [`TaskHost::prepare`] builds the tasks and
//! opens their channels (no thread runs yet), [`PreparedTasks::start`] spawns one thread
//! per task, and [`LiveTasks`] is the handle the coordinator's seam drives: commands in,
//! events out, fence, join. Dropping a [`LiveTasks`] fences and joins it, so no exit path
//! leaves task threads running.

use crate::options::{RunOptions, grants_of};
use crate::partition::OutputEdge;
use crate::progress::JobProgress;
use crate::scheduling::TaskScheduling;
use crate::task::{self, InputChannel, StageSpec, TaskSpec, WatermarkAlignment};
use crate::transport::{TimedSender, Transport};
use crossbeam_channel::{Receiver, Sender};
use nop_stream_api::{AttemptId, FencingToken, PluginKind, Split, TaskId, TaskInfo};
use nop_stream_capability::{CapabilityGrants, ConnectionGrant};
use nop_stream_checkpoint::Namespace;
use nop_stream_core::{PartitionedPlan, PartitionedVertex, PlannedOperator};
use nop_stream_plugin_host::{
    Instance, InstanceOptions, LoadedPlugin, PluginSet, Result, RuntimeError, Site,
};
use nop_stream_proto::{Deployment, SinkSettlement, TaskAssignment, TaskCommand};
use nop_stream_state::StateConfig;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// An event of a task of this process, with the runtime's own failure type.
pub type LocalTaskEvent = nop_stream_proto::TaskEvent<RuntimeError>;

/// What the tasks of one job need on this process: the plan, the loaded plugins, the
/// run options (directories, limits), checkpoint storage and the progress counters.
pub struct TaskHost<'a> {
    plan: &'a PartitionedPlan,
    plugins: &'a PluginSet,
    opts: &'a RunOptions,
    storage: Arc<Namespace>,
    progress: Arc<JobProgress>,
}

impl std::fmt::Debug for TaskHost<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHost")
            .field("job", &self.plan.job.job_id)
            .field("work_dir", &self.opts.work_dir)
            .finish_non_exhaustive()
    }
}

impl<'a> TaskHost<'a> {
    /// A host for the tasks of `plan`, with `plugins` loaded for every operator, writing
    /// keyed state under `opts.work_dir/state` and segments into `storage`.
    pub fn new(
        plan: &'a PartitionedPlan,
        plugins: &'a PluginSet,
        opts: &'a RunOptions,
        storage: Arc<Namespace>,
        progress: Arc<JobProgress>,
    ) -> Self {
        TaskHost {
            plan,
            plugins,
            opts,
            storage,
            progress,
        }
    }

    /// The live counters of this process's tasks.
    pub fn progress(&self) -> &Arc<JobProgress> {
        &self.progress
    }

    fn plugin_of(&self, op: &PlannedOperator) -> Result<Arc<LoadedPlugin>> {
        self.plugins.get(&op.operator_id).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("no plugin loaded for operator `{}`", op.name))
        })
    }

    /// `job.state_memory_bytes` split evenly over the job's stateful operator subtasks
    /// (operators whose plugin declares state, times their parallelism); `None` without
    /// a budget.
    fn state_memory_per_subtask(&self) -> Option<u64> {
        let budget = self.plan.job.state_memory_bytes?;
        let stateful: u64 = self
            .plan
            .vertices
            .iter()
            .map(|v| {
                let ops = v
                    .operators
                    .iter()
                    .filter(|op| {
                        op.kind == PluginKind::Operator
                            && self
                                .plugins
                                .get(&op.operator_id)
                                .is_some_and(|p| !p.info.states.is_empty())
                    })
                    .count() as u64;
                ops * u64::from(v.parallelism)
            })
            .sum();
        Some(budget / stateful.max(1))
    }

    fn task_info(
        &self,
        op: &PlannedOperator,
        subtask: u32,
        parallelism: u32,
        attempt: AttemptId,
    ) -> TaskInfo {
        TaskInfo {
            job_id: self.plan.job.job_id.to_string(),
            pipeline_id: self.plan.job.pipeline_id.to_string(),
            operator_id: op.operator_id.to_string(),
            operator_name: op.name.clone(),
            subtask_index: subtask,
            parallelism,
            attempt: attempt.0,
        }
    }

    fn instance_options(
        &self,
        plugin: &LoadedPlugin,
        op: &PlannedOperator,
        subtask: Option<u32>,
        state: Option<StateConfig>,
    ) -> Result<InstanceOptions> {
        Ok(InstanceOptions {
            site: Site {
                plugin: plugin.label.clone(),
                operator: op.name.clone(),
                subtask,
            },
            limits: self.opts.limits.clone(),
            grants: grants_of(op, self.opts)?,
            state,
            capabilities: Some(CapabilityGrants {
                kind: op.kind,
                job: self.plan.job.job_id.to_string(),
                pipeline: self.plan.job.pipeline_id.to_string(),
                operator_id: op.operator_id.to_string(),
                operator: op.name.clone(),
                subtask,
                connections: granted(op, &self.opts.job_dir),
            }),
        })
    }

    /// Directory of the redb state databases of this process's subtasks.
    pub fn state_root(&self) -> PathBuf {
        self.opts.work_dir.join("state")
    }

    /// Discovers the splits of the source heading vertex `vertex` for its parallelism, with
    /// a one-off instance of the source plugin opened as subtask 0 of `attempt`
    /// (design §6.3).
    ///
    /// # Errors
    /// The plugin's failure; [`RuntimeError::Internal`] if the vertex is not a source.
    pub fn discover_splits(&self, vertex: usize, attempt: AttemptId) -> Result<Vec<Split>> {
        let v =
            self.plan.vertices.get(vertex).ok_or_else(|| {
                RuntimeError::Internal(format!("the plan has no vertex {vertex}"))
            })?;
        let head = &v.operators[0];
        let plugin = self.plugin_of(head)?;
        let opts = self.instance_options(&plugin, head, None, None)?;
        let Instance::Source(mut src) = plugin.instantiate(&opts)? else {
            return Err(RuntimeError::Internal(
                "source plugin is not a source".into(),
            ));
        };
        src.open(
            &self.task_info(head, 0, v.parallelism, attempt),
            &head.config.to_string(),
        )?;
        let splits = src.discover_splits(v.parallelism)?;
        src.close()?;
        Ok(splits)
    }

    /// Before a rescale restore: each settlement's old sink subtask, opened under its old
    /// index and parallelism, commits its durable transactions and aborts every other
    /// pending one (design §10.5).
    ///
    /// # Errors
    /// The sink's failure; an unknown commit outcome (design §5.7).
    pub fn settle_sinks(&self, settlements: &[SinkSettlement], attempt: AttemptId) -> Result<()> {
        for s in settlements {
            let v = self.plan.vertices.get(s.vertex as usize).ok_or_else(|| {
                RuntimeError::Internal(format!("the plan has no vertex {}", s.vertex))
            })?;
            let Some(op) = v.operators.last().filter(|o| o.kind == PluginKind::Sink) else {
                return Err(RuntimeError::Internal(format!(
                    "vertex {} has no sink at its tail",
                    v.id
                )));
            };
            let plugin = self.plugin_of(op)?;
            let opts = self.instance_options(&plugin, op, Some(s.subtask), None)?;
            let Instance::Sink(mut sink) = plugin.instantiate(&opts)? else {
                return Err(RuntimeError::Internal("sink plugin is not a sink".into()));
            };
            sink.open(
                &self.task_info(op, s.subtask, s.parallelism, attempt),
                &op.config.to_string(),
            )?;
            for p in &s.commit {
                let committable = hex::decode(&p.committable)
                    .map_err(|e| RuntimeError::Internal(e.to_string()))?;
                task::commit_with_recovery(&mut sink, &p.txn, &committable)?;
            }
            for stale in sink.pending_transactions()? {
                tracing::info!(txn = %stale, "rescale: aborting a transaction of a non-durable epoch");
                sink.abort(&stale)?;
            }
            sink.close()?;
        }
        Ok(())
    }

    /// Builds the tasks `tasks` of deployment `d` (all of them in the embedded mode, this
    /// node's share in a cluster) and opens their channels on `transport`: every input
    /// channel is opened for receiving now; output channels are opened for sending as the
    /// transport does it (a QUIC transport opens a stream at the first send). No task runs
    /// until [`PreparedTasks::start`]. The state directory of this process is cleared
    /// first: keyed state is restored from checkpoint segments, never from a previous
    /// attempt's databases. `cancel` is the tasks' cancel flag (set on fence and when a
    /// task fails); pass the one the transport's senders watch, if any.
    ///
    /// Watermark alignment (`max_drift_ms`, design §8.5) spans every subtask of the source:
    /// the subtasks here share one table per source ([`PreparedTasks::alignment`]); the
    /// slots of subtasks that run on other nodes start at `i64::MIN` ("not reported") and
    /// hold these back until the caller writes their watermarks in
    /// ([`AlignmentTables::set_remote`]). A cluster node reports
    /// [`AlignmentTables::local`] to the coordinator and writes what the coordinator relays;
    /// between two relays a slot keeps the last value written. This cannot deadlock while
    /// the relay runs: on current values the slowest subtask is never held back, and a
    /// finished or idle subtask publishes `i64::MAX`. Without a coordinator (its session
    /// lost) the node stops its tasks anyway.
    ///
    /// # Errors
    /// A task could not be set up: its vertex or subtask is not in the plan, a grant
    /// directory is missing, a channel cannot be opened, the state directory cannot be
    /// cleared.
    pub fn prepare(
        &self,
        d: &Deployment,
        tasks: Vec<TaskAssignment>,
        transport: Arc<dyn Transport>,
        cancel: Arc<AtomicBool>,
    ) -> Result<PreparedTasks> {
        let state_root = self.state_root();
        if state_root.exists() {
            std::fs::remove_dir_all(&state_root).map_err(|e| RuntimeError::Io {
                path: state_root.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let (events_tx, events_rx) = crossbeam_channel::unbounded::<LocalTaskEvent>();
        // Watermark alignment tables, one per source with `max_drift_ms` that has a subtask
        // here; the slots of its subtasks elsewhere are written by the caller.
        let mut local: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
        for a in &tasks {
            local
                .entry(a.vertex as usize)
                .or_default()
                .insert(a.subtask as usize);
        }
        let alignments: HashMap<usize, Arc<WatermarkAlignment>> = self
            .plan
            .vertices
            .iter()
            .enumerate()
            .filter(|(vi, v)| {
                local.contains_key(vi)
                    && v.operators[0].kind == PluginKind::Source
                    && v.operators[0]
                        .watermarks
                        .is_some_and(|w| w.max_drift_ms.is_some())
            })
            .map(|(vi, v)| {
                (
                    vi,
                    Arc::new(WatermarkAlignment::new(v.parallelism as usize, &local[&vi])),
                )
            })
            .collect();
        let mut commands = BTreeMap::new();
        let mut specs = Vec::with_capacity(tasks.len());
        for a in tasks {
            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            commands.insert(a.task.clone(), cmd_tx);
            specs.push(self.task_spec(
                d,
                a,
                transport.as_ref(),
                &alignments,
                &events_tx,
                cmd_rx,
                &cancel,
            )?);
        }
        let alignment = AlignmentTables {
            by_vertex: alignments
                .iter()
                .map(|(vi, a)| (*vi as u32, Arc::clone(a)))
                .collect(),
        };
        Ok(PreparedTasks {
            generation: d.generation,
            alignment,
            cancel,
            transport,
            commands,
            events: events_rx,
            specs,
            scheduling: self.opts.task_scheduling,
        })
    }

    /// The task spec of one assignment: its chain's instances, channels and restore plan.
    #[allow(clippy::too_many_arguments)]
    fn task_spec(
        &self,
        d: &Deployment,
        a: TaskAssignment,
        transport: &dyn Transport,
        alignments: &HashMap<usize, Arc<WatermarkAlignment>>,
        events: &Sender<LocalTaskEvent>,
        commands: Receiver<TaskCommand>,
        cancel: &Arc<AtomicBool>,
    ) -> Result<TaskSpec> {
        let plan = self.plan;
        let job = &plan.job;
        let vi = a.vertex as usize;
        let v: &PartitionedVertex = plan.vertices.get(vi).ok_or_else(|| {
            RuntimeError::Internal(format!("assignment of {} names vertex {vi}", a.task))
        })?;
        let st = v.subtasks.get(a.subtask as usize).ok_or_else(|| {
            RuntimeError::Internal(format!(
                "assignment of {} names subtask {}",
                a.task, a.subtask
            ))
        })?;
        let sub = st.index.0;
        let owned = v.owned_shards(st, job.state_shard_count);
        let mut stages = Vec::new();
        for op in &v.operators {
            let plugin = self.plugin_of(op)?;
            let state =
                (op.kind == PluginKind::Operator && !plugin.info.states.is_empty()).then(|| {
                    StateConfig {
                        path: nop_stream_checkpoint::names::state_db(
                            &self.state_root(),
                            op.operator_id.as_str(),
                            sub,
                        ),
                        shard_count: job.state_shard_count,
                        owned: owned.clone(),
                        ttl_ms: plugin
                            .info
                            .states
                            .iter()
                            .map(|s| op.state_ttl_ms.get(&s.name).copied())
                            .collect(),
                        states: plugin.info.states.clone(),
                        memory_bytes: self.state_memory_per_subtask(),
                    }
                });
            stages.push(StageSpec {
                options: self.instance_options(&plugin, op, Some(sub), state)?,
                task_info: self.task_info(op, sub, v.parallelism, d.attempt),
                plugin,
                config: op.config.to_string(),
                operator_id: op.operator_id.to_string(),
                on_error: op.on_error,
            });
        }
        let mut inputs = Vec::new();
        for ch in &st.inputs {
            let edge = plan
                .edge(&ch.edge)
                .ok_or_else(|| RuntimeError::Internal(format!("unknown edge {}", ch.edge)))?;
            inputs.push(InputChannel {
                id: ch.clone(),
                rx: transport.open_receiver(ch, d.token)?,
                input_index: edge.input_index,
                watermark: i64::MIN,
                idle: false,
                ended: false,
                closed: false,
            });
        }
        let mut outputs = Vec::new();
        for edge in plan.edges.iter().filter(|e| e.from == v.id) {
            let mut chans: Vec<_> = edge
                .channels
                .iter()
                .filter(|c| c.upstream == st.index)
                .collect();
            chans.sort_by_key(|c| c.downstream);
            let timed = self.progress.metrics().task(v.id.as_str(), sub);
            let senders = chans
                .iter()
                .map(|c| {
                    let s = transport.open_sender(c, d.token)?;
                    Ok(TimedSender::wrap(s, Arc::clone(&timed)))
                })
                .collect::<Result<Vec<_>>>()?;
            outputs.push(
                OutputEdge::new(
                    edge.id.clone(),
                    edge.partition,
                    senders,
                    chans.iter().map(|c| c.downstream.0).collect(),
                    edge.shard_owners.iter().map(|s| s.0).collect(),
                )
                .with_output(edge.output.clone())
                .with_target(
                    plan.vertex(&edge.to)
                        .and_then(|t| t.operators.first())
                        .map_or(edge.to.as_str(), |op| op.name.as_str()),
                    edge.input_index,
                ),
            );
        }
        Ok(TaskSpec {
            task: a.task,
            attempt: d.attempt,
            stages,
            inputs,
            outputs,
            splits: a.splits,
            watermarks: v.operators[0].watermarks,
            alignment: alignments.get(&vi).map(|al| (Arc::clone(al), sub as usize)),
            batch_records: job.batch_records.min(self.opts.limits.max_batch_records),
            sink_txn_prefix: a.sink_txn_prefix,
            first_epoch: d.first_epoch,
            restore: a.restore,
            storage: Arc::clone(&self.storage),
            namespace: d.namespace.clone(),
            events: events.clone(),
            commands,
            progress: Arc::clone(&self.progress),
            cancel: Arc::clone(cancel),
            async_snapshots: job.async_snapshots,
            incremental_snapshots: job.incremental_snapshots,
        })
    }
}

/// The watermark alignment tables of one generation's tasks in this process, one per
/// source with `max_drift_ms` that has a subtask here (design §8.5). Cheap to clone: the
/// clones share the tables the task threads read.
#[derive(Debug, Clone, Default)]
pub struct AlignmentTables {
    /// By the source's vertex index in the plan.
    by_vertex: BTreeMap<u32, Arc<WatermarkAlignment>>,
}

impl AlignmentTables {
    /// Whether no source here aligns its watermarks.
    pub fn is_empty(&self) -> bool {
        self.by_vertex.is_empty()
    }

    /// Per aligned source (vertex index), the watermarks of its subtasks that run here:
    /// `(subtask, watermark ms)`, ascending by subtask; `i64::MIN` before a subtask read a
    /// timestamped record, `i64::MAX` once it finished or while it is idle.
    pub fn local(&self) -> Vec<(u32, Vec<(u32, i64)>)> {
        self.by_vertex
            .iter()
            .map(|(v, a)| (*v, a.local_watermarks()))
            .collect()
    }

    /// Writes the watermarks of subtasks of source `vertex` that run elsewhere (as the
    /// coordinator relays them). Returns how many entries were written: 0 when `vertex`
    /// aligns nothing here; entries naming a local subtask or no subtask are ignored.
    pub fn set_remote(&self, vertex: u32, entries: &[(u32, i64)]) -> usize {
        self.by_vertex
            .get(&vertex)
            .map_or(0, |a| a.set_remote(entries))
    }
}

/// Tasks built and wired but not running: see [`TaskHost::prepare`].
pub struct PreparedTasks {
    generation: u64,
    alignment: AlignmentTables,
    cancel: Arc<AtomicBool>,
    transport: Arc<dyn Transport>,
    commands: BTreeMap<TaskId, Sender<TaskCommand>>,
    events: Receiver<LocalTaskEvent>,
    specs: Vec<TaskSpec>,
    scheduling: TaskScheduling,
}

impl std::fmt::Debug for PreparedTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTasks")
            .field("generation", &self.generation)
            .field("tasks", &self.commands.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PreparedTasks {
    /// The tasks, in deployment order.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.specs.iter().map(|s| s.task.clone()).collect()
    }

    /// The watermark alignment tables these tasks share (they stay valid once started).
    pub fn alignment(&self) -> AlignmentTables {
        self.alignment.clone()
    }

    /// Spawns one thread per task. The handle is returned even when a spawn failed (with
    /// that error), so the tasks already running can be fenced and joined.
    pub fn start(self) -> (LiveTasks, Option<RuntimeError>) {
        let mut live = LiveTasks {
            generation: self.generation,
            cancel: self.cancel,
            transport: self.transport,
            commands: self.commands,
            events: self.events,
            threads: Vec::with_capacity(self.specs.len()),
            fenced: false,
        };
        let mut spawn_error = None;
        let scheduling = self.scheduling;
        for spec in self.specs {
            let name = task_thread_name(&spec.task);
            match std::thread::Builder::new().name(name).spawn(move || {
                scheduling.apply_to_this_thread();
                task::run(spec)
            }) {
                Ok(h) => live.threads.push(h),
                Err(e) => {
                    spawn_error = Some(RuntimeError::Internal(format!(
                        "cannot spawn task thread: {e}"
                    )));
                    break;
                }
            }
        }
        (live, spawn_error)
    }
}

/// Running tasks of one generation on this process.
pub struct LiveTasks {
    generation: u64,
    cancel: Arc<AtomicBool>,
    transport: Arc<dyn Transport>,
    commands: BTreeMap<TaskId, Sender<TaskCommand>>,
    events: Receiver<LocalTaskEvent>,
    threads: Vec<JoinHandle<()>>,
    fenced: bool,
}

impl std::fmt::Debug for LiveTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTasks")
            .field("generation", &self.generation)
            .field("tasks", &self.commands.keys().collect::<Vec<_>>())
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

impl LiveTasks {
    /// The generation these tasks belong to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `task` is one of these tasks.
    pub fn has_task(&self, task: &TaskId) -> bool {
        self.commands.contains_key(task)
    }

    /// Sends `command` to `task`; `false` if the task is not one of these (a task that
    /// already ended drops it silently: its end arrives as an event).
    pub fn send(&self, task: &TaskId, command: TaskCommand) -> bool {
        match self.commands.get(task) {
            Some(tx) => {
                let _ = tx.send(command);
                true
            }
            None => false,
        }
    }

    /// The events of these tasks, in the order they happened on each task. The queue
    /// disconnects once every task has ended and sent its last event.
    pub fn events(&self) -> &Receiver<LocalTaskEvent> {
        &self.events
    }

    /// Cancels every task and fences their channels: no token is valid any more, so both
    /// ends of every channel of the generation refuse further frames (design §10.2).
    /// Idempotent.
    pub fn fence(&mut self) {
        if !self.fenced {
            self.fenced = true;
            self.cancel.store(true, Ordering::SeqCst);
            self.transport.fence(FencingToken(u64::MAX));
        }
    }

    /// Whether [`Self::fence`] was called.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Waits until every task thread has ended. Tasks waiting only for commands see the end
    /// of their command queue and finish; call [`Self::fence`] first to stop running ones.
    pub fn join(mut self) {
        self.join_threads();
    }

    /// As [`Self::join`], but if some task thread still runs after `warn_after`, calls
    /// `slow` once with the names of those threads (then keeps waiting): a node reaps a
    /// fenced generation on its control thread, and a task that does not stop holds up
    /// every request after it, so this says which.
    pub fn join_reporting(
        mut self,
        warn_after: std::time::Duration,
        slow: impl FnOnce(Vec<String>),
    ) {
        self.commands.clear();
        let deadline = std::time::Instant::now() + warn_after;
        while std::time::Instant::now() < deadline && self.threads.iter().any(|h| !h.is_finished())
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let running: Vec<String> = self
            .threads
            .iter()
            .filter(|h| !h.is_finished())
            .map(|h| h.thread().name().unwrap_or("unnamed").to_owned())
            .collect();
        if !running.is_empty() {
            slow(running);
        }
        self.join_threads();
    }

    fn join_threads(&mut self) {
        // Dropping the command senders lets a task waiting only for commands see the end.
        self.commands.clear();
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for LiveTasks {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.fence();
            self.join_threads();
        }
    }
}

/// The connections the job file grants to `op`, in grant order; a relative `ca_file`
/// resolves against `job_dir`.
fn granted(op: &PlannedOperator, job_dir: &std::path::Path) -> Vec<ConnectionGrant> {
    op.connections
        .iter()
        .map(|(name, c)| ConnectionGrant {
            name: name.clone(),
            kind: c.kind.clone(),
            url: c.url.clone(),
            password_env: c.password_env.clone(),
            ca_file: c.ca_file.as_ref().map(|f| job_dir.join(f)),
        })
        .collect()
}

/// The name of a task's thread: `{head operator}#{subtask}`, the head operator's id
/// without its `sources/`, `operators/` or `sinks/` prefix (`count#0`). Linux keeps the
/// first 15 bytes, which is what `top -H`, `perf` and `/proc/PID/task/*/stat` show, so
/// the job name is left out (the full task id is in every error and panic message).
pub(crate) fn task_thread_name(task: &TaskId) -> String {
    let head = task.vertex.0.rsplit('/').next().unwrap_or(&task.vertex.0);
    format!("{head}#{}", task.subtask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{JobId, PipelineId, SubtaskIndex, VertexId};

    #[test]
    fn task_threads_are_named_by_head_operator_and_subtask() {
        let task = |vertex: &str, subtask| TaskId {
            job: JobId::new("a-job-with-a-long-name"),
            pipeline: PipelineId::new("main"),
            vertex: VertexId::new(vertex),
            subtask: SubtaskIndex(subtask),
        };
        assert_eq!(task_thread_name(&task("operators/count", 1)), "count#1");
        assert_eq!(task_thread_name(&task("sources/bids", 0)), "bids#0");
        assert_eq!(task_thread_name(&task("custom-uid", 12)), "custom-uid#12");
    }

    #[test]
    fn alignment_tables_write_only_the_remote_slots() {
        // Subtasks 0 and 2 of a source of 4 run here.
        let local: BTreeSet<usize> = [0, 2].into_iter().collect();
        let table = Arc::new(WatermarkAlignment::new(4, &local));
        let tables = AlignmentTables {
            by_vertex: [(3u32, Arc::clone(&table))].into_iter().collect(),
        };
        assert_eq!(
            tables.local(),
            vec![(3, vec![(0, i64::MIN), (2, i64::MIN)])]
        );
        // Entries naming a local subtask, or no subtask, are not written.
        assert_eq!(
            tables.set_remote(3, &[(0, 9), (1, 10), (3, 30), (7, 70)]),
            2
        );
        assert_eq!(
            tables.set_remote(4, &[(1, 10)]),
            0,
            "no such aligned source"
        );
        assert_eq!(
            tables.local(),
            vec![(3, vec![(0, i64::MIN), (2, i64::MIN)])]
        );
        // The local subtasks publish their own slots; the remote ones count for them.
        table.publish(2, 20);
        assert_eq!(table.slowest_other(0), 10);
        assert_eq!(
            table.slowest_other(2),
            i64::MIN,
            "subtask 0 has not read yet"
        );
        table.publish(0, 5);
        assert_eq!(table.slowest_other(2), 5);
        assert_eq!(tables.local(), vec![(3, vec![(0, 5), (2, 20)])]);
    }
}
