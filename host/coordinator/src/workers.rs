//! The seam between the coordinator and the tasks it drives (design §2.5).

use crate::CoordinatorError;
use nop_stream_api::{AttemptId, Split, TaskId};
use nop_stream_proto::{Deployment, SinkSettlement, TaskCommand, TaskError, TaskEvent};
use std::time::Duration;

/// What [`Workers::next_event`] found.
#[derive(Debug)]
pub enum Next<E> {
    /// An event of a task.
    Event(TaskEvent<E>),
    /// Nothing arrived within the timeout.
    Timeout,
    /// No task of the deployed generation can send any more event.
    Closed,
}

/// How the coordinator reaches tasks: in-process threads in the embedded mode, node
/// processes over QUIC in the cluster mode. One deployment (one generation) is live at a
/// time; the coordinator always ends it with [`Workers::fence`] (on failure) and
/// [`Workers::join`] before it deploys the next.
///
/// Plugin calls the coordinator needs outside a task (split discovery, settling sinks
/// before a rescale) run on the workers too, since only they host components.
pub trait Workers {
    /// The workers' failure type: task failures arrive in it, and the coordinator's own
    /// failures are converted into it, so the caller sees one error type.
    type Error: TaskError + From<CoordinatorError> + std::fmt::Debug;

    /// Discovers the splits of the source heading vertex `vertex` (index in the plan's
    /// `vertices`) for its parallelism, with a one-off instance of the source plugin
    /// opened as subtask 0 of `attempt` (design §6.3).
    ///
    /// # Errors
    /// The plugin's failure.
    fn discover_splits(
        &mut self,
        vertex: usize,
        attempt: AttemptId,
    ) -> Result<Vec<Split>, Self::Error>;

    /// Before a rescale restore: each settlement's old sink subtask commits its durable
    /// transactions and aborts every other pending one (design §10.5).
    ///
    /// # Errors
    /// The sink's failure; an unknown commit outcome is fatal (design §5.7).
    fn settle_sinks(
        &mut self,
        settlements: &[SinkSettlement],
        attempt: AttemptId,
    ) -> Result<(), Self::Error>;

    /// Starts every task of `deployment`. On error, whatever was started is the caller's
    /// to fence and join.
    ///
    /// # Errors
    /// A task could not be set up (grants, channels, threads, nodes).
    fn deploy(&mut self, deployment: Deployment) -> Result<(), Self::Error>;

    /// Sends `command` to `task` of the live deployment. Delivery to a task that already
    /// ended is silently dropped: its end reaches the coordinator as an event.
    fn send(&mut self, task: &TaskId, command: TaskCommand);

    /// Waits up to `timeout` for the next event of the live deployment.
    fn next_event(&mut self, timeout: Duration) -> Next<Self::Error>;

    /// Fences generation `generation`: its channels refuse every further frame on both
    /// ends and its tasks are cancelled (design §2.5, "fencing"). Idempotent.
    fn fence(&mut self, generation: u64);

    /// Waits until every task of the live deployment has ended and releases them.
    fn join(&mut self);

    /// Records read by sources and written by sinks so far, over every deployment.
    fn records(&self) -> (u64, u64);
}
