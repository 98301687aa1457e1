//! The embedded implementation of the coordinator's [`Workers`] seam (design §2.5): every
//! task of a deployment runs on its own thread in this process ([`TaskHost`]), channels are
//! in-process queues of a [`LocalTransport`], commands and events are crossbeam queues.

use crossbeam_channel::RecvTimeoutError;
use nop_stream_api::{AttemptId, Split, TaskId};
use nop_stream_checkpoint::Namespace;
use nop_stream_coordinator::{CoordinatorError, Next, Workers};
use nop_stream_core::PartitionedPlan;
use nop_stream_plugin_host::{PluginSet, Result, RuntimeError};
use nop_stream_proto::{
    Deployment, FailureClass, SinkSettlement, TaskCommand, TaskError, TaskEvent,
};
use nop_stream_task::transport::LocalTransport;
use nop_stream_task::{JobProgress, LiveTasks, RunOptions, TaskHost};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// A failure of an embedded run as the coordinator role sees it: a task's error, or a
/// coordinator failure (a refused restore, checkpoint storage) in the same type.
#[derive(Debug)]
pub struct WorkerError(pub RuntimeError);

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for WorkerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

impl TaskError for WorkerError {
    fn class(&self) -> FailureClass {
        self.0.class()
    }
}

impl From<RuntimeError> for WorkerError {
    fn from(e: RuntimeError) -> Self {
        WorkerError(e)
    }
}

impl From<CoordinatorError> for WorkerError {
    fn from(e: CoordinatorError) -> Self {
        WorkerError(crate::runtime_error(e))
    }
}

/// A task's event with its failure as a [`WorkerError`].
fn worker_event(e: TaskEvent<RuntimeError>) -> TaskEvent<WorkerError> {
    match e {
        TaskEvent::Ack { attempt, snapshot } => TaskEvent::Ack { attempt, snapshot },
        TaskEvent::EndOfData { attempt, task } => TaskEvent::EndOfData { attempt, task },
        TaskEvent::Committed {
            attempt,
            task,
            epoch,
        } => TaskEvent::Committed {
            attempt,
            task,
            epoch,
        },
        TaskEvent::Finished { attempt, report } => TaskEvent::Finished { attempt, report },
        TaskEvent::Failed {
            attempt,
            task,
            error,
        } => TaskEvent::Failed {
            attempt,
            task,
            error: WorkerError(error),
        },
    }
}

/// In-process workers: one thread per subtask.
pub struct InProcessWorkers<'a> {
    host: TaskHost<'a>,
    opts: &'a RunOptions,
    live: Option<LiveTasks>,
}

impl<'a> InProcessWorkers<'a> {
    /// Workers running `plan` with `plugins`, writing segments into `storage`.
    pub fn new(
        plan: &'a PartitionedPlan,
        plugins: &'a PluginSet,
        opts: &'a RunOptions,
        storage: Arc<Namespace>,
        progress: Arc<JobProgress>,
    ) -> Self {
        InProcessWorkers {
            host: TaskHost::new(plan, plugins, opts, storage, progress),
            opts,
            live: None,
        }
    }
}

impl Workers for InProcessWorkers<'_> {
    type Error = WorkerError;

    fn discover_splits(
        &mut self,
        vertex: usize,
        attempt: AttemptId,
    ) -> Result<Vec<Split>, WorkerError> {
        Ok(self.host.discover_splits(vertex, attempt)?)
    }

    fn settle_sinks(
        &mut self,
        settlements: &[SinkSettlement],
        attempt: AttemptId,
    ) -> Result<(), WorkerError> {
        Ok(self.host.settle_sinks(settlements, attempt)?)
    }

    fn deploy(&mut self, mut d: Deployment) -> Result<(), WorkerError> {
        if self.live.is_some() {
            return Err(RuntimeError::Internal("a deployment is still live".into()).into());
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
        let tasks = std::mem::take(&mut d.tasks);
        let prepared = self.host.prepare(&d, tasks, transport, cancel)?;
        let (live, spawn_error) = prepared.start();
        self.live = Some(live);
        spawn_error.map_or(Ok(()), |e| Err(e.into()))
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        if let Some(live) = &self.live {
            live.send(task, command);
        }
    }

    fn next_event(&mut self, timeout: Duration) -> Next<WorkerError> {
        let Some(live) = &self.live else {
            return Next::Closed;
        };
        match live.events().recv_timeout(timeout) {
            Ok(e) => Next::Event(worker_event(e)),
            Err(RecvTimeoutError::Timeout) => Next::Timeout,
            Err(RecvTimeoutError::Disconnected) => Next::Closed,
        }
    }

    fn fence(&mut self, generation: u64) {
        if let Some(live) = &mut self.live
            && live.generation() == generation
        {
            live.fence();
        }
    }

    fn join(&mut self) {
        if let Some(live) = self.live.take() {
            live.join();
        }
    }

    fn records(&self) -> (u64, u64) {
        let p = self.host.progress();
        (p.records_read(), p.records_written())
    }
}
