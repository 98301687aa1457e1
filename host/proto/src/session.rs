//! The node session (design §2.5, "Control plane"): the first stream a node opens to the
//! coordinator carries a [`Hello`], answered by a [`Welcome`] granting a lease; after that
//! the node sends [`NodeFrame`]s on the same stream (lease renewals, its tasks' events,
//! replies, counters) and the coordinator pushes [`CoordinatorFrame`]s (renewal acks,
//! requests, task commands, fences, the end of the session). Both directions are ordered.
//!
//! Requests the node makes of the coordinator (a component by hash) travel one per
//! bidirectional stream ([`NodeRequestFrame`], [`ComponentFrame`]).

use crate::{Deployment, SinkSettlement, TaskCommand, TaskEvent, TaskFailure};
use nop_stream_api::{AttemptId, JobId, PluginKind, Split, TaskId};
use nop_stream_core::DeploymentPlan;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the node protocol this build speaks. A hello carrying another version is
/// refused with both versions named. Version 3 added [`NodeFrame::Watermarks`],
/// [`CoordinatorFrame::Watermarks`] and [`NodeFrame::NodeMetrics`]. Version 4 changed the
/// data plane's records frames: a batch's per-record columns travel as varint
/// differences ([`nop_stream_api::delta`]). Version 5: a restore plan's watermarks and
/// ended inputs may name an input edge for all its channels
/// (`nop_stream_checkpoint::restored_channel`), which a node of version 4 would not apply.
/// A cluster's nodes all speak one version, since the coordinator admits only its own.
pub const PROTOCOL_VERSION: u32 = 5;

/// A node's first frame on its session stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the node.
    pub protocol_version: u32,
    /// The identity the node claims (`node-<id>`); checked against its certificate.
    pub node: String,
    /// Address the node's endpoint listens on for data connections from other nodes.
    pub data_addr: String,
    /// Task slots the node offers (subtasks it runs at once).
    pub slots: u32,
}

/// The coordinator's answer to an accepted [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// [`PROTOCOL_VERSION`] of the coordinator.
    pub protocol_version: u32,
    /// The lease granted; every renewal names it.
    pub lease: u64,
    /// Lease time to live, ms: without a renewal acknowledged within it the coordinator
    /// considers the node gone.
    pub ttl_ms: u64,
    /// Interval between the node's heartbeats, ms.
    pub heartbeat_ms: u64,
    /// The coordinator's term (design §14.5, "Coordinator HA"): the fencing token. A node
    /// refuses a welcome, and every frame, of a term lower than the highest it has seen.
    pub term: u64,
}

/// The coordinator's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Registered: the lease granted.
    Welcome(Welcome),
    /// Refused (another protocol version, say); the node should not retry as is.
    Refused(SessionEnd),
    /// This coordinator is a standby: register with the leader instead.
    NotLeader(LeaderHint),
}

/// A standby's answer: who leads, as far as it knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderHint {
    /// The leader's advertised address (`HOST:PORT`); `None` while no leader is known (an
    /// election in progress): try again shortly.
    pub leader: Option<String>,
    /// The leader's term, 0 if unknown.
    pub term: u64,
}

/// A [`CoordinatorFrame`] as it crosses the session stream: stamped with the term of the
/// coordinator that sent it, so that a node refuses every frame of a deposed leader
/// (design §14.5, "Coordinator HA": the term is the fencing token on every command).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    /// The sender's term.
    pub term: u64,
    /// The frame.
    pub frame: CoordinatorFrame,
}

/// A lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The lease renewed.
    pub lease: u64,
    /// Sequence number of this renewal, increasing per session.
    pub seq: u64,
}

/// The coordinator renewed the lease up to the renewal `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The lease.
    pub lease: u64,
    /// The renewal acknowledged.
    pub seq: u64,
}

/// Why the coordinator ends a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    /// The reason, naming the node and what it did (for its log).
    pub reason: String,
}

/// What the coordinator sends on a session stream after the welcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CoordinatorFrame {
    /// A renewal was accepted.
    Ack(HeartbeatAck),
    /// The session is over (lease expired or refused); the node stops its tasks.
    End(SessionEnd),
    /// A request; the node answers with a [`NodeFrame::Reply`] carrying the same `id`.
    Request {
        /// Request id, unique per session.
        id: u64,
        /// What to do.
        request: Box<NodeRequest>,
    },
    /// A command to one task of `generation`. A node refuses (and counts) a command of any
    /// other generation than the one it runs for the job.
    Command {
        /// The job.
        job: JobId,
        /// The generation the command belongs to.
        generation: u64,
        /// The task.
        task: TaskId,
        /// The command.
        command: TaskCommand,
    },
    /// Every generation of `job` below `generation` is fenced: the node cancels their
    /// tasks, and its receiving channels refuse their streams and queued messages.
    Fence {
        /// The job.
        job: JobId,
        /// The generation in force from now on.
        generation: u64,
    },
    /// Watermark alignment across nodes (design §8.5): the latest watermarks of the
    /// subtasks of one aligned source that run on *other* nodes than the receiver. The node
    /// writes them into its alignment table of that source; a node that does not hold
    /// `generation` of the job ignores the frame and counts it.
    Watermarks(SourceWatermarks),
}

/// What a node sends on its session stream after the hello.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NodeFrame {
    /// A lease renewal.
    Heartbeat(Heartbeat),
    /// An event of one of its tasks.
    Event(JobEvent),
    /// The answer to a [`CoordinatorFrame::Request`].
    Reply(Reply),
    /// The node's figures for one job, cumulative since the node process started.
    Counters(NodeCounters),
    /// The node's metrics samples of one job (design §15), cumulative since the node
    /// process started, at most `nop_stream_metrics::MAX_FRAME_SAMPLES`: one frame for
    /// every metric, so a new one is a line where it is counted.
    Metrics(nop_stream_metrics::MetricsFrame),
    /// Watermark alignment across nodes (design §8.5): the current watermarks of the node's
    /// own subtasks of one source with `max_drift_ms`. Sent when one changed, at most every
    /// 100 ms, and repeated unchanged every second; never per record.
    Watermarks(SourceWatermarks),
    /// The node's own samples, of no job (design §15): labelled with the node, cumulative
    /// since the node process started, at most `nop_stream_metrics::MAX_FRAME_SAMPLES`;
    /// each replaces the node's previous ones at the coordinator.
    NodeMetrics(Vec<nop_stream_metrics::Sample>),
}

/// The watermarks of some subtasks of one source with watermark alignment
/// (`max_drift_ms`, design §8.5), qualified by job, generation and vertex. One entry per
/// subtask named, so a frame holds at most the source's parallelism entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceWatermarks {
    /// The job.
    pub job: JobId,
    /// The generation of the tasks whose watermarks these are.
    pub generation: u64,
    /// Index of the source's vertex in the generation's plan.
    pub vertex: u32,
    /// `(subtask index, watermark)`, ascending by subtask. A watermark is in ms of event
    /// time; `i64::MIN`: the subtask has not read a timestamped record yet; `i64::MAX`: it
    /// finished or is idle, and holds nobody back.
    pub watermarks: Vec<(u32, i64)>,
}

/// An event of a task, tagged with its job and generation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEvent {
    /// The job.
    pub job: JobId,
    /// The generation of the task that sent it.
    pub generation: u64,
    /// The event; failures carry a [`TaskFailure`].
    pub event: TaskEvent<TaskFailure>,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Id of the request answered.
    pub id: u64,
    /// Its outcome.
    pub result: Result<ReplyBody, TaskFailure>,
}

/// What a request produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplyBody {
    /// The splits discovered ([`NodeRequest::DiscoverSplits`]).
    Splits(Vec<Split>),
    /// The request was carried out.
    Done,
}

/// A node's figures for one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCounters {
    /// The job.
    pub job: JobId,
    /// Records its sources read.
    pub records_read: u64,
    /// Records its sinks wrote (staged, not necessarily committed).
    pub records_written: u64,
    /// Data streams refused at its receiving end: stale generation or token, unknown
    /// channel, or stopped on fencing.
    pub refused_streams: u64,
    /// Commands of another generation than the one it runs, refused (commits included).
    pub refused_commands: u64,
}

/// What the coordinator asks of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeRequest {
    /// Discover the splits of the source heading vertex `vertex` (design §6.3).
    DiscoverSplits {
        /// The job.
        job: JobSpec,
        /// Vertex index in the plan.
        vertex: u32,
        /// The attempt the discovery belongs to.
        attempt: AttemptId,
    },
    /// Settle old sink subtasks before a rescale restore (design §10.5).
    SettleSinks {
        /// The job.
        job: JobSpec,
        /// What to settle.
        settlements: Vec<SinkSettlement>,
        /// The attempt.
        attempt: AttemptId,
    },
    /// Fence older generations of the job, build this node's tasks of the deployment and
    /// register their receiving channels. Nothing runs until [`NodeRequest::Start`]: every
    /// node registers its receivers before any producer opens a stream.
    Prepare(NodeDeployment),
    /// Start the tasks prepared for `generation`.
    Start {
        /// The job.
        job: JobId,
        /// The generation.
        generation: u64,
    },
    /// Fetch, compile and load every component of the job ahead of need, so that a later
    /// [`NodeRequest::Prepare`] here (a redeploy after another node was lost) finds them
    /// compiled (design §10.1). Sent to the live nodes that hold no task of a deployment;
    /// answered with `Done` once they are loaded. Nothing is started.
    Warm(JobSpec),
}

/// What a node needs to host tasks of a job, besides the deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job.
    pub job: JobId,
    /// The PartitionedPlan as JSON (it carries JSON configs, which postcard cannot
    /// encode).
    pub plan_json: String,
    /// The component of every operator, by operator id.
    pub components: BTreeMap<String, ComponentRef>,
    /// Directory of the job file: relative grants resolve against it. Every node must
    /// reach it at this path.
    pub job_dir: String,
    /// The job's output directory (`$OUTPUT`). Every node must reach it at this path.
    pub output_dir: String,
    /// The job's checkpoint namespace: a name, found in the checkpoint root of the storage
    /// location each node is configured with (no path of the coordinator's travels).
    pub namespace: String,
    /// The cluster's identity (its storage location's `cluster.json`): a node whose
    /// storage holds another refuses the job, naming both.
    pub cluster: String,
    /// Sandbox limits of every instance.
    pub limits: SandboxLimits,
}

/// A component in the coordinator's registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRef {
    /// sha256 of its bytes (hex): the key nodes fetch and verify it by.
    pub sha256: String,
    /// `name@version`.
    pub label: String,
    /// The world it exports.
    pub kind: PluginKind,
    /// Size in bytes.
    pub size: u64,
}

/// The sandbox limits a job sets (the others keep the runtime's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLimits {
    /// Memory per instance, bytes.
    pub memory_bytes: u64,
    /// CPU time per call into a plugin, ms.
    pub cpu_ms_per_call: u64,
}

/// One node's share of a deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeDeployment {
    /// The job.
    pub spec: JobSpec,
    /// The deployment, with only this node's tasks in `tasks`.
    pub deployment: Deployment,
    /// Where every task of the deployment runs.
    pub placement: DeploymentPlan,
    /// UDP address of every node of the placement, by node name (`node-<id>`).
    pub peers: BTreeMap<String, String>,
}

/// A request a node opens a stream for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRequestFrame {
    /// The bytes of the component with this sha256 (hex).
    Component {
        /// Its hash.
        sha256: String,
    },
}

/// The answer to [`NodeRequestFrame::Component`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComponentFrame {
    /// The component's bytes.
    Bytes(Vec<u8>),
    /// The registry has no such component.
    NotFound(String),
}
