//! The control plane: deployments, commands to tasks, events from tasks.

use nop_stream_api::{AttemptId, EpochId, FencingToken, JobId, Split, TaskId};
use nop_stream_checkpoint::{PendingTransaction, SegmentDescriptor, TaskSnapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One attempt of a job, as the coordinator deploys it: every task of the plan with what
/// it restores. The plan itself travels beside it (the PartitionedPlan is plain data too);
/// a worker resolves plugins, grants and channels from the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// The job.
    pub job: JobId,
    /// Generation of this deployment: grows with every deployment or recovery (design §2.5,
    /// "Leases, generations, fencing"). Streams, ACKs and commits of another generation
    /// are refused.
    pub generation: u64,
    /// The attempt (design §3.3); today equal to the generation.
    pub attempt: AttemptId,
    /// The fencing token every channel and commit of this attempt carries.
    pub token: FencingToken,
    /// Checkpoint namespace the tasks write their segments into (design §3.1).
    pub namespace: String,
    /// First epoch this attempt can create (names each sink's first transaction).
    pub first_epoch: EpochId,
    /// Every task of the plan, in plan order.
    pub tasks: Vec<TaskAssignment>,
}

/// One subtask as deployed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskAssignment {
    /// Stable task identity.
    pub task: TaskId,
    /// Index of the task's vertex in the plan's `vertices`.
    pub vertex: u32,
    /// Subtask index within the vertex.
    pub subtask: u32,
    /// Splits this subtask reads (source heads), in registry order.
    pub splits: Vec<Split>,
    /// Transaction id prefix of the sink at the tail, `{job}:{pipeline}:{operator}:{subtask}:`.
    pub sink_txn_prefix: Option<String>,
    /// What the task restores before it processes anything.
    pub restore: TaskRestorePlan,
}

/// What one task restores, decided by the coordinator's restore planning from the
/// latest durable manifest. The task reads the named segments itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskRestorePlan {
    /// Epoch of the manifest restored from; `None` for a fresh start.
    pub epoch: Option<EpochId>,
    /// Keyed-state and timer segments to read, by operator id: exactly those of the shards
    /// the task owns now.
    pub segments: BTreeMap<String, Vec<SegmentDescriptor>>,
    /// Non-keyed operator state to read, by operator id: the segments of every old subtask
    /// of the operator, from which the task takes its entries by each state's
    /// redistribution policy (design §10.5).
    pub operator_state: BTreeMap<String, OperatorStateRestore>,
    /// Cursor of every split the manifest knows, by split id.
    pub splits: BTreeMap<String, SplitCursor>,
    /// Watermark by input channel id, or by input edge id for every channel of the edge
    /// without an entry of its own (ms; the task applies them with
    /// `nop_stream_checkpoint::restored_channel`).
    pub watermarks: BTreeMap<String, i64>,
    /// Input channels that had delivered their end of data: channel ids, or an edge id for
    /// every channel of that edge.
    pub ended_inputs: BTreeSet<String>,
    /// Whether the task had processed the end of all its input.
    pub end_of_data: bool,
    /// Durable pre-committed transactions the sink at the tail commits before anything
    /// else (design §7.3, "on recovery").
    pub pending: Vec<PendingTransaction>,
    /// Records in and out of the task's chain up to the restored epoch, over the attempts
    /// before (the snapshot's totals; after a rescale, subtask 0 takes its vertex's
    /// totals, so their sum stays exact).
    #[serde(default)]
    pub records_in_total: u64,
    /// See `records_in_total`.
    #[serde(default)]
    pub records_out_total: u64,
}

/// The non-keyed operator state of one operator in a manifest (design §10.5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorStateRestore {
    /// Parallelism of the operator when the manifest was taken.
    pub old_parallelism: u32,
    /// Every old subtask's segments of the operator's states; each descriptor's `shard`
    /// is the old subtask index.
    pub segments: Vec<SegmentDescriptor>,
}

/// A restored split position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitCursor {
    /// Exclusive next cursor (design §6.4).
    pub cursor: Vec<u8>,
    /// The split was read to its end.
    pub finished: bool,
    /// Largest event timestamp read (ms), if any.
    pub max_timestamp: Option<i64>,
}

/// Before a rescale restore, one sink subtask of the checkpointed plan, opened under its
/// old index and parallelism, commits `commit` and aborts every other pending transaction
/// (design §10.5: sink transactions never migrate silently between subtasks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkSettlement {
    /// Index of the sink's vertex in the plan's `vertices`.
    pub vertex: u32,
    /// The old subtask index.
    pub subtask: u32,
    /// The old parallelism.
    pub parallelism: u32,
    /// The durable transactions of that subtask to commit.
    pub commit: Vec<PendingTransaction>,
}

/// What the coordinator tells a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskCommand {
    /// Sources: inject barrier `epoch` at the next safe point.
    InjectBarrier(EpochId),
    /// Sinks: every epoch `<= epoch` is durable; commit.
    Commit(EpochId),
    /// The final epoch is committed: close and exit.
    Finish,
}

/// What a task reports to the coordinator. `E` is the failure payload: the runtime's own
/// error type in the embedded mode, [`TaskFailure`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TaskEvent<E = TaskFailure> {
    /// The task snapshotted an epoch and forwarded its barrier.
    Ack {
        /// Attempt the task runs in.
        attempt: AttemptId,
        /// The snapshot (names task and epoch; segment descriptors, no payload).
        snapshot: Box<TaskSnapshot>,
    },
    /// The task processed the end of all its input (and emitted its final output).
    EndOfData {
        /// Attempt.
        attempt: AttemptId,
        /// Task.
        task: TaskId,
    },
    /// The sink of the task committed everything `<= epoch`.
    Committed {
        /// Attempt.
        attempt: AttemptId,
        /// Task.
        task: TaskId,
        /// Epoch.
        epoch: EpochId,
    },
    /// The task ended normally.
    Finished {
        /// Attempt.
        attempt: AttemptId,
        /// Its figures.
        report: TaskReport,
    },
    /// The task failed.
    Failed {
        /// Attempt.
        attempt: AttemptId,
        /// Task.
        task: TaskId,
        /// Why.
        error: E,
    },
}

impl<E> TaskEvent<E> {
    /// The attempt that sent the event.
    pub fn attempt(&self) -> AttemptId {
        match self {
            TaskEvent::Ack { attempt, .. }
            | TaskEvent::EndOfData { attempt, .. }
            | TaskEvent::Committed { attempt, .. }
            | TaskEvent::Finished { attempt, .. }
            | TaskEvent::Failed { attempt, .. } => *attempt,
        }
    }
}

/// How a task failure bears on recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureClass {
    /// A consequence of another failure (cancelled, a closed channel, fenced): never the
    /// root cause when a primary failure is known.
    Secondary,
    /// Recovery from the latest durable epoch may succeed (a trap, an I/O fault).
    Recoverable,
    /// Restarting cannot help: a setup error, a refused restore, an unknown commit outcome
    /// (design §5.7: it fails loudly).
    Fatal,
}

/// A failure the coordinator can classify.
pub trait TaskError: fmt::Display {
    /// How the failure bears on recovery.
    fn class(&self) -> FailureClass;
}

/// A task failure as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFailure {
    /// How it bears on recovery.
    pub class: FailureClass,
    /// The failure's message, naming plugin, operator and subtask where known.
    pub message: String,
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TaskFailure {}

impl TaskError for TaskFailure {
    fn class(&self) -> FailureClass {
        self.class
    }
}

/// Per-task figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReport {
    /// `job/pipeline/vertex/subtask`.
    pub task: String,
    /// Records that entered the chain (read by a source head or received).
    pub records_in: u64,
    /// Records emitted on output edges or written by a sink.
    pub records_out: u64,
    /// Epochs this task snapshotted.
    pub epochs: u64,
    /// Plugin-defined counters, by operator name.
    pub counters: BTreeMap<String, BTreeMap<String, u64>>,
}
