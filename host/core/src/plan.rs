//! The plan layers after the StreamModel (design §2.1):
//! `StreamGraph -> JobGraph -> PartitionedPlan -> DeploymentPlan`. Every layer is plain
//! serde data that round-trips through JSON.

use crate::model::{ConnectionSpec, ErrorPolicy, Grant, PluginRef, WatermarkSpec};
use crate::shard::HashPolicy;
use nop_stream_api::{
    ChannelId, EdgeId, JobId, OperatorId, PartitionPolicy, PipelineId, PluginInfo, PluginKind,
    SemanticMode, StateShardId, SubtaskIndex, TaskId, VertexId,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Job-level settings carried by every plan layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobMeta {
    /// Logical job id.
    pub job_id: JobId,
    /// Pipeline lineage id.
    pub pipeline_id: PipelineId,
    /// Human name of the job.
    pub name: String,
    /// Declared semantic mode (validated against capabilities, design §13).
    pub semantic: SemanticMode,
    /// Checkpoint interval in milliseconds; `None` disables periodic checkpoints.
    pub checkpoint_interval_ms: Option<u64>,
    /// Checkpoint after every this many records read by the sources, all subtasks
    /// together; `None` disables record-count checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_records: Option<u64>,
    /// Epochs older than this many ms are aborted (job file `checkpoint_timeout_ms`);
    /// `None`: the runner's default (`CoordinatorOptions::checkpoint_timeout_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_timeout_ms: Option<u64>,
    /// Memory budget of the job's keyed state in bytes, split evenly over its stateful
    /// operator subtasks; `None`: the default budget per subtask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_memory_bytes: Option<u64>,
    /// Whether keyed-state snapshots run asynchronously (job file `async_snapshots`,
    /// default `true`; see `StreamModel`'s `JobSpec::async_snapshots`). Left out of the
    /// serialised plan when `true`.
    #[serde(
        default = "crate::model::yes",
        skip_serializing_if = "crate::model::is_true"
    )]
    pub async_snapshots: bool,
    /// Whether keyed-state snapshots are incremental (job file `incremental_snapshots`,
    /// default `true`; see `StreamModel`'s `JobSpec::incremental_snapshots`). Left out of
    /// the serialised plan when `true`.
    #[serde(
        default = "crate::model::yes",
        skip_serializing_if = "crate::model::is_true"
    )]
    pub incremental_snapshots: bool,
    /// Number of state shards of every keyed vertex (design §3.4); stable for the job's life.
    pub state_shard_count: u32,
    /// Maximum records per batch a source reads or a task forwards.
    pub batch_records: u32,
}

/// One operator (source, transform or sink) as planned: identity, plugin and settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedOperator {
    /// Stable operator id (design §3.2).
    pub operator_id: OperatorId,
    /// Name from the job file.
    pub name: String,
    /// Canonical model path, e.g. `operators/per-carrier`.
    pub model_path: String,
    /// World of the plugin.
    pub kind: PluginKind,
    /// Plugin reference as written in the job file.
    pub plugin: PluginRef,
    /// What the plugin's `describe()` returned; enters the fingerprint.
    pub plugin_info: PluginInfo,
    /// Config object handed to `open` (JSON).
    pub config: serde_json::Value,
    /// Directories granted to the plugin.
    pub grants: Vec<Grant>,
    /// Connections granted to the plugin (job-file `connections`), by name, with what the
    /// host needs to open them (an address and the name of a password variable, never a
    /// credential).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub connections: BTreeMap<String, ConnectionSpec>,
    /// Parallelism of the operator.
    pub parallelism: u32,
    /// Sources: how watermarks derive from record timestamps (none: only the final one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<WatermarkSpec>,
    /// Never fused into its upstream chain (job-file `start_new_chain`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_new_chain: bool,
    /// What a guest error in `process` does to the record (job-file `on_error`); enters
    /// the fingerprint unless it is the default `fail`.
    #[serde(default, skip_serializing_if = "ErrorPolicy::is_fail")]
    pub on_error: ErrorPolicy,
    /// Time-to-live in ms of declared keyed states, by name (job-file `state_ttl_ms`;
    /// checked against the plugin's declared states). Enters the fingerprint when set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state_ttl_ms: BTreeMap<String, u64>,
}

/// Logical DAG: one node per operator, edges with their partition policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamGraph {
    /// Job settings.
    pub job: JobMeta,
    /// Operators in job-file order.
    pub nodes: Vec<PlannedOperator>,
    /// Data edges.
    pub edges: Vec<StreamEdge>,
}

/// A data edge between two operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamEdge {
    /// Upstream operator.
    pub from: OperatorId,
    /// Downstream operator.
    pub to: OperatorId,
    /// Index of this input on the downstream operator (job-file order).
    pub input_index: u32,
    /// Partition policy (explicit, or FORWARD/REBALANCE by parallelism).
    pub partition: PartitionPolicy,
    /// Side output of the upstream operator this edge carries; none for the main output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// Operator chains: FORWARD edges between single-input/single-output operators of equal
/// parallelism are fused into one vertex that runs on one thread per subtask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobGraph {
    /// Job settings.
    pub job: JobMeta,
    /// Vertices in topological order (sources first).
    pub vertices: Vec<JobVertex>,
    /// Edges between vertices.
    pub edges: Vec<JobEdge>,
}

/// An operator chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobVertex {
    /// Vertex id: the head operator's id.
    pub id: VertexId,
    /// Operators in chain order; the head may be a source.
    pub operators: Vec<PlannedOperator>,
    /// Parallelism shared by the chain.
    pub parallelism: u32,
    /// Whether the head has a HASH input, so the vertex owns state shards.
    pub keyed: bool,
}

/// A data edge between two vertices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEdge {
    /// `{from}->{to}#{input_index}`.
    pub id: EdgeId,
    /// Upstream vertex (its tail operator emits).
    pub from: VertexId,
    /// Downstream vertex (its head operator receives).
    pub to: VertexId,
    /// Input index on the head operator of `to`.
    pub input_index: u32,
    /// Partition policy.
    pub partition: PartitionPolicy,
    /// Side output of the upstream operator this edge carries; none for the main output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// The single source of parallelism, partitioning, shard ownership, channel identities
/// and the checkpoint ACK set (design §2.2). The runtime executes it and never invents
/// topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionedPlan {
    /// Job settings.
    pub job: JobMeta,
    /// Key → shard hash, named and versioned (design §3.4).
    pub hash_policy: HashPolicy,
    /// Vertices with their subtasks.
    pub vertices: Vec<PartitionedVertex>,
    /// Edges with their channels.
    pub edges: Vec<PartitionedEdge>,
    /// Every task that must ACK an epoch (design §2.2).
    pub ack_set: Vec<TaskId>,
    /// sha256 (hex) of this plan's canonical JSON with `fingerprint` set to "".
    pub fingerprint: String,
}

/// A vertex expanded to its subtasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionedVertex {
    /// Vertex id.
    pub id: VertexId,
    /// Operators in chain order.
    pub operators: Vec<PlannedOperator>,
    /// Parallelism.
    pub parallelism: u32,
    /// Whether the vertex owns state shards.
    pub keyed: bool,
    /// One entry per subtask, by index.
    pub subtasks: Vec<PlannedSubtask>,
}

/// One subtask of a vertex.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedSubtask {
    /// Subtask index.
    pub index: SubtaskIndex,
    /// Stable task identity.
    pub task: TaskId,
    /// State shards this subtask owns (keyed vertices; empty otherwise). A contiguous,
    /// ascending range.
    pub shards: Vec<StateShardId>,
    /// Input channels, grouped by input index in ascending order.
    pub inputs: Vec<ChannelId>,
    /// Output channels.
    pub outputs: Vec<ChannelId>,
}

/// An edge expanded to channels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionedEdge {
    /// Edge id.
    pub id: EdgeId,
    /// Upstream vertex.
    pub from: VertexId,
    /// Downstream vertex.
    pub to: VertexId,
    /// Input index on the downstream head operator.
    pub input_index: u32,
    /// Partition policy.
    pub partition: PartitionPolicy,
    /// Side output of the upstream operator this edge carries; none for the main output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Every channel of the edge.
    pub channels: Vec<ChannelId>,
    /// For HASH edges: owner subtask of each shard, indexed by shard id
    /// (`len == state_shard_count`). Empty for other policies.
    pub shard_owners: Vec<SubtaskIndex>,
}

/// Where each task runs (design §2.3), as [`crate::deployment_plan`] places it: the
/// embedded backend places everything on `local`, a cluster on its live nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentPlan {
    /// Fingerprint of the PartitionedPlan deployed.
    pub plan_fingerprint: String,
    /// Deployment backend name, e.g. `embedded`.
    pub backend: String,
    /// One entry per task.
    pub tasks: Vec<TaskDeployment>,
    /// Where checkpoints (manifests and segments) are stored.
    pub checkpoint_storage: String,
}

/// Placement of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDeployment {
    /// The task.
    pub task: TaskId,
    /// Runtime node id.
    pub node: String,
    /// Resource group.
    pub resource_group: String,
    /// Transport backend for the task's channels, e.g. `local-queue` or `quic`.
    pub transport: String,
    /// State backend binding, e.g. `redb:<dir>/<operator>/<subtask>.redb`.
    pub state_backend: String,
}

impl PartitionedVertex {
    /// The state shards subtask `st` of this vertex owns, as the range its state and
    /// restore cover (design §7): its planned shards on a keyed vertex; every shard of
    /// `0..shard_count` at parallelism 1 (one subtask sees every key); none otherwise.
    pub fn owned_shards(&self, st: &PlannedSubtask, shard_count: u32) -> std::ops::Range<u32> {
        if self.keyed {
            st.shards
                .first()
                .map(|f| f.0..st.shards.last().map_or(f.0, |l| l.0 + 1))
                .unwrap_or(0..0)
        } else if self.parallelism == 1 {
            0..shard_count
        } else {
            0..0
        }
    }
}

impl PartitionedPlan {
    /// The vertex with id `id`.
    pub fn vertex(&self, id: &VertexId) -> Option<&PartitionedVertex> {
        self.vertices.iter().find(|v| &v.id == id)
    }

    /// The edge with id `id`.
    pub fn edge(&self, id: &EdgeId) -> Option<&PartitionedEdge> {
        self.edges.iter().find(|e| &e.id == id)
    }
}
