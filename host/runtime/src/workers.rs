//! The embedded implementation of the coordinator's [`Workers`] seam (design §2.5): every
//! task of a deployment runs on its own thread in this process ([`TaskHost`]), channels are
//! in-process queues of a [`LocalTransport`], commands and events are crossbeam queues.

use crate::error::{Result, RuntimeError};
use crate::job::{JobProgress, PluginSet, RunOptions};
use crate::launch::{LiveTasks, TaskHost};
use crate::transport::LocalTransport;
use crossbeam_channel::RecvTimeoutError;
use nop_stream_api::{AttemptId, Split, TaskId};
use nop_stream_checkpoint::Namespace;
use nop_stream_coordinator::{Next, Workers};
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::{Deployment, SinkSettlement, TaskCommand};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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
    type Error = RuntimeError;

    fn discover_splits(&mut self, vertex: usize, attempt: AttemptId) -> Result<Vec<Split>> {
        self.host.discover_splits(vertex, attempt)
    }

    fn settle_sinks(&mut self, settlements: &[SinkSettlement], attempt: AttemptId) -> Result<()> {
        self.host.settle_sinks(settlements, attempt)
    }

    fn deploy(&mut self, mut d: Deployment) -> Result<()> {
        if self.live.is_some() {
            return Err(RuntimeError::Internal("a deployment is still live".into()));
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
        spawn_error.map_or(Ok(()), Err)
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        if let Some(live) = &self.live {
            live.send(task, command);
        }
    }

    fn next_event(&mut self, timeout: Duration) -> Next<RuntimeError> {
        let Some(live) = &self.live else {
            return Next::Closed;
        };
        match live.events().recv_timeout(timeout) {
            Ok(e) => Next::Event(e),
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
