//! The embedded implementation of the coordinator's [`Workers`] seam (design §2.5): every
//! task of a deployment runs on its own thread in this process, channels are in-process
//! queues of a [`LocalTransport`], commands and events are crossbeam queues.

use crate::error::{Result, RuntimeError, Site};
use crate::job::{JobProgress, PluginSet, RunOptions, grants_of};
use crate::partition::OutputEdge;
use crate::plugin::{Instance, InstanceOptions, LoadedPlugin};
use crate::task::{self, InputChannel, StageSpec, TaskEvent, TaskSpec, WatermarkAlignment};
use crate::transport::{LocalTransport, Transport};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use nop_stream_api::{AttemptId, FencingToken, PluginKind, Split, TaskId, TaskInfo};
use nop_stream_checkpoint::CheckpointStorage;
use nop_stream_coordinator::{Next, Workers};
use nop_stream_core::{PartitionedPlan, PartitionedVertex, PlannedOperator};
use nop_stream_proto::{Deployment, SinkSettlement, TaskAssignment, TaskCommand};
use nop_stream_state::StateConfig;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The tasks of the live deployment.
struct Live {
    generation: u64,
    cancel: Arc<AtomicBool>,
    transport: Arc<LocalTransport>,
    commands: BTreeMap<TaskId, Sender<TaskCommand>>,
    events: Receiver<TaskEvent>,
    threads: Vec<JoinHandle<()>>,
}

/// In-process workers: one thread per subtask.
pub struct InProcessWorkers<'a> {
    plan: &'a PartitionedPlan,
    plugins: &'a PluginSet,
    opts: &'a RunOptions,
    storage: Arc<dyn CheckpointStorage>,
    progress: Arc<JobProgress>,
    live: Option<Live>,
}

impl<'a> InProcessWorkers<'a> {
    /// Workers running `plan` with `plugins`, writing segments into `storage`.
    pub fn new(
        plan: &'a PartitionedPlan,
        plugins: &'a PluginSet,
        opts: &'a RunOptions,
        storage: Arc<dyn CheckpointStorage>,
        progress: Arc<JobProgress>,
    ) -> Self {
        InProcessWorkers {
            plan,
            plugins,
            opts,
            storage,
            progress,
            live: None,
        }
    }

    fn plugin_of(&self, op: &PlannedOperator) -> Result<Arc<LoadedPlugin>> {
        self.plugins.get(&op.operator_id).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("no plugin loaded for operator `{}`", op.name))
        })
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
        })
    }

    fn state_root(&self) -> PathBuf {
        self.opts.work_dir.join("state")
    }

    /// The task spec of one assignment: its chain's instances, channels and restore plan.
    #[allow(clippy::too_many_arguments)]
    fn task_spec(
        &self,
        d: &Deployment,
        a: TaskAssignment,
        transport: &LocalTransport,
        alignments: &HashMap<usize, Arc<WatermarkAlignment>>,
        events: &Sender<TaskEvent>,
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
                        path: self
                            .state_root()
                            .join(nop_stream_coordinator::restore::path_component(
                                op.operator_id.as_str(),
                            ))
                            .join(format!("{sub}.redb")),
                        shard_count: job.state_shard_count,
                        owned: owned.clone(),
                        states: plugin.info.states.clone(),
                        max_cached_entries: StateConfig::DEFAULT_MAX_CACHED_ENTRIES,
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
            let senders = chans
                .iter()
                .map(|c| transport.open_sender(c, d.token))
                .collect::<Result<Vec<_>>>()?;
            outputs.push(
                OutputEdge::new(
                    edge.id.clone(),
                    edge.partition,
                    senders,
                    chans.iter().map(|c| c.downstream.0).collect(),
                    edge.shard_owners.iter().map(|s| s.0).collect(),
                )
                .with_output(edge.output.clone()),
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
        })
    }
}

impl Workers for InProcessWorkers<'_> {
    type Error = RuntimeError;

    fn discover_splits(&mut self, vertex: usize, attempt: AttemptId) -> Result<Vec<Split>> {
        let v = &self.plan.vertices[vertex];
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

    fn settle_sinks(&mut self, settlements: &[SinkSettlement], attempt: AttemptId) -> Result<()> {
        for s in settlements {
            let v = &self.plan.vertices[s.vertex as usize];
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

    fn deploy(&mut self, mut d: Deployment) -> Result<()> {
        if self.live.is_some() {
            return Err(RuntimeError::Internal("a deployment is still live".into()));
        }
        let state_root = self.state_root();
        if state_root.exists() {
            std::fs::remove_dir_all(&state_root).map_err(|e| RuntimeError::Io {
                path: state_root.display().to_string(),
                message: e.to_string(),
            })?;
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let transport = Arc::new(LocalTransport::new(
            if self.opts.channel_capacity == 0 {
                LocalTransport::DEFAULT_CAPACITY
            } else {
                self.opts.channel_capacity
            },
            d.token,
            Arc::clone(&cancel),
        ));
        let (events_tx, events_rx) = crossbeam_channel::unbounded::<TaskEvent>();
        // Watermark alignment tables, one per source with `max_drift_ms`.
        let alignments: HashMap<usize, Arc<WatermarkAlignment>> = self
            .plan
            .vertices
            .iter()
            .enumerate()
            .filter(|(_, v)| {
                v.operators[0].kind == PluginKind::Source
                    && v.operators[0]
                        .watermarks
                        .is_some_and(|w| w.max_drift_ms.is_some())
            })
            .map(|(vi, v)| {
                (
                    vi,
                    Arc::new(WatermarkAlignment::new(v.parallelism as usize)),
                )
            })
            .collect();
        let mut commands = BTreeMap::new();
        let mut specs = Vec::with_capacity(d.tasks.len());
        for a in std::mem::take(&mut d.tasks) {
            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            commands.insert(a.task.clone(), cmd_tx);
            specs.push(self.task_spec(
                &d,
                a,
                &transport,
                &alignments,
                &events_tx,
                cmd_rx,
                &cancel,
            )?);
        }
        drop(events_tx);
        let mut live = Live {
            generation: d.generation,
            cancel,
            transport,
            commands,
            events: events_rx,
            threads: Vec::with_capacity(specs.len()),
        };
        let mut spawn_error = None;
        for spec in specs {
            let name = format!("task-{}", spec.task);
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || task::run(spec))
            {
                Ok(h) => live.threads.push(h),
                Err(e) => {
                    spawn_error = Some(RuntimeError::Internal(format!(
                        "cannot spawn task thread: {e}"
                    )));
                    break;
                }
            }
        }
        self.live = Some(live);
        spawn_error.map_or(Ok(()), Err)
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        if let Some(tx) = self.live.as_ref().and_then(|l| l.commands.get(task)) {
            let _ = tx.send(command);
        }
    }

    fn next_event(&mut self, timeout: Duration) -> Next<RuntimeError> {
        let Some(live) = &self.live else {
            return Next::Closed;
        };
        match live.events.recv_timeout(timeout) {
            Ok(e) => Next::Event(e),
            Err(RecvTimeoutError::Timeout) => Next::Timeout,
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
        }
    }

    fn fence(&mut self, generation: u64) {
        if let Some(live) = &self.live
            && live.generation == generation
        {
            live.cancel.store(true, Ordering::SeqCst);
            // No token is valid any more, so both ends of every channel of the generation
            // refuse further frames (design §10.2); the next deployment gets a new transport.
            live.transport.fence(FencingToken(u64::MAX));
        }
    }

    fn join(&mut self) {
        if let Some(live) = self.live.take() {
            // Dropping the command senders lets a task waiting only for commands see the end.
            drop(live.commands);
            for h in live.threads {
                let _ = h.join();
            }
        }
    }

    fn records(&self) -> (u64, u64) {
        (
            self.progress.records_read(),
            self.progress.records_written(),
        )
    }
}

impl Drop for InProcessWorkers<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.live.as_ref().map(|l| l.generation) {
            self.fence(g);
            self.join();
        }
    }
}
