//! What a manifest records for compatibility checks (design §10.4–§10.6): everything a
//! savepoint check compares, stored as values and never re-derived on restore — host and
//! WIT versions, both fingerprints, the shard count and hash policy, and per operator its
//! identity, origin, plugin (name@version, component sha256, world), state descriptors, the
//! partitioning of its inputs, and its sink protocol; plus the semantic mode.

use nop_stream_api::{OperatorStateDescriptor, PluginKind, StateDescriptor};
use serde::{Deserialize, Serialize};

/// Format of [`SnapshotMeta`]. A host refuses to check or restore a manifest whose meta
/// format is newer than this.
pub const META_FORMAT: u32 = 1;

/// What a compatibility check needs of the job an epoch was taken with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// [`META_FORMAT`] of the host that wrote it.
    pub format: u32,
    /// Version of the host (`nopstream`) that wrote it.
    pub host_version: String,
    /// WIT packages the host served, e.g. `nop:stream@0.2.1`.
    pub wit_packages: Vec<String>,
    /// Fingerprint of the whole PartitionedPlan.
    pub plan_fingerprint: String,
    /// Fingerprint of what routes and shapes state: stateful operator ids, their state
    /// descriptors, the partitioning and key source of edges into keyed operators, the
    /// shard count and the hash policy (not parallelism, plugin code or other config).
    pub state_topology_fingerprint: String,
    /// `stateShardCount`, stored.
    pub state_shard_count: u32,
    /// Key → shard hash, `name/vN` (e.g. `xxh3-64/v1`), stored.
    pub hash_policy: String,
    /// Semantic mode of the job.
    pub semantic: String,
    /// Every operator, in plan order.
    pub operators: Vec<OperatorMeta>,
}

/// One operator as a check sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorMeta {
    /// Stable operator id.
    pub operator_id: String,
    /// Where the id comes from: `uid` (explicit) or `model-path`.
    pub origin: String,
    /// Name in the job file.
    pub name: String,
    /// World of its plugin.
    pub kind: PluginKind,
    /// Parallelism.
    pub parallelism: u32,
    /// `name@version` of its plugin.
    pub plugin: String,
    /// sha256 of the component (hex); empty when unknown.
    pub component_sha256: String,
    /// The world it exports, with the WIT package: `nop:stream/operator@0.2.1`.
    pub world: String,
    /// Keyed state it declares.
    pub states: Vec<StateDescriptor>,
    /// Whether it owns state shards (a HASH input heads its chain).
    pub keyed: bool,
    /// Its inputs, in input order.
    pub inputs: Vec<InputMeta>,
    /// For sinks: the capability and plugin name its transactions follow, e.g.
    /// `two-phase-commit:jsonl-sink`.
    pub sink_protocol: Option<String>,
    /// Time-to-live in ms of its keyed states that have one, by state name (job-file
    /// `state_ttl_ms`): their stored values carry a write-time prefix. Absent in metas
    /// written before TTL existed (none had one).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub state_ttl_ms: std::collections::BTreeMap<String, u64>,
    /// Non-keyed operator states it declares, with their redistribution policies (WIT
    /// `0.2.1`; absent in metas written before, and for operators without any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operator_states: Vec<OperatorStateDescriptor>,
    /// For an operator with state whose plugin marks the config properties that shape
    /// its state values (schema keyword `x-state-layout`, `nop_stream_core::state_layout`):
    /// `plugin-name property,… layout-sha256-prefix` over those properties, e.g.
    /// `keyed-aggregate aggregates,key_field 3f2a…`. A check whose two sides both have it
    /// and differ reports `STATE_LAYOUT_CHANGED`. Absent in metas written before it
    /// existed, and for plugins that mark nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_layout: Option<String>,
}

/// One input of an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputMeta {
    /// Upstream operator id.
    pub from: String,
    /// Side output read, if any.
    pub output: Option<String>,
    /// Partition policy, e.g. `HASH`.
    pub partition: String,
    /// For HASH inputs: what decides the keys, `plugin-name config-sha256-prefix` of the
    /// upstream operator (keys are computed by the upstream plugin from its config).
    pub key_source: Option<String>,
    /// For HASH inputs whose upstream plugin marks the config properties that decide its
    /// keys (schema keyword `x-key-spec`, `nop_stream_core::key_spec`): `plugin-name
    /// key-spec-sha256-prefix` over those properties only. When both sides of a
    /// compatibility check have it, it is compared instead of `key_source`, so a config
    /// change that leaves the key alone is not a key change. Absent in metas written
    /// before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_spec: Option<String>,
}
