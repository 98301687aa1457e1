//! Plugin metadata as reported by a component's `describe()` (design §16), mirrored as
//! plain serde data so the pure planner can validate jobs against it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which world a component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginKind {
    /// `nop:stream/operator`.
    Operator,
    /// `nop:stream/source`.
    Source,
    /// `nop:stream/sink`.
    Sink,
}

impl PluginKind {
    /// The WIT world name (without package) a component of this kind must export.
    pub fn world(self) -> &'static str {
        match self {
            PluginKind::Operator => "operator",
            PluginKind::Source => "source",
            PluginKind::Sink => "sink",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.world())
    }
}

/// Shape of a declared keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateKind {
    /// One value per key and namespace.
    Value,
    /// A list of values per key and namespace.
    List,
    /// A map per key and namespace.
    Map,
}

/// A keyed state a plugin declares (design §13: name, kind and schema version required).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StateDescriptor {
    /// Unique within the plugin; part of the state path.
    pub name: String,
    /// Value, list or map.
    pub kind: StateKind,
    /// Version of the value encoding.
    pub schema_version: u32,
    /// Value codec name, e.g. `postcard`.
    pub codec: String,
    /// sha256 (hex) of the plugin's description of the values' structure (WIT
    /// `state-declarations`, `0.2.1`), when it gives one; the savepoint check refuses a
    /// changed structure under the same schema version (`STATE_SCHEMA_CHANGED`). Absent
    /// for plugins built before `0.2.1`, and then not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_sha256: Option<String>,
}

/// How a restore at another parallelism hands out the entries of a non-keyed operator
/// state (design §10.5; WIT `operator-state.redistribution`). At the same parallelism every
/// policy but [`Redistribution::Union`] gives each subtask back its own entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Redistribution {
    /// Entries of all old subtasks pooled, dealt in ascending id order round robin over
    /// the new subtasks (one owner each, balanced; Flink's even-split).
    SplitRegistry,
    /// Every new subtask gets every entry of every old subtask.
    Union,
    /// Every subtask holds the same entries; a new subtask gets one copy (old copies
    /// must agree).
    Broadcast,
    /// Not redistributable: a restore at another parallelism needs `drop-state`.
    None,
}

impl fmt::Display for Redistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Redistribution::SplitRegistry => "split-registry",
            Redistribution::Union => "union",
            Redistribution::Broadcast => "broadcast",
            Redistribution::None => "none",
        })
    }
}

/// A non-keyed operator state a plugin declares (WIT `state-declarations`, `0.2.1`;
/// design §3.5, §10.5): entries by string id per operator subtask.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OperatorStateDescriptor {
    /// Unique among the plugin's keyed and operator states; part of the state path.
    pub name: String,
    /// Version of the value encoding.
    pub schema_version: u32,
    /// Value codec name, e.g. `postcard`.
    pub codec: String,
    /// How a restore at another parallelism hands out the entries.
    pub redistribution: Redistribution,
    /// sha256 (hex) of the plugin's description of the values' structure, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_sha256: Option<String>,
}

/// Source consistency level (design §6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceCapability {
    /// Replayable from a checkpointed cursor.
    Replayable,
    /// Transactional or snapshot reads.
    TransactionalRead,
    /// Recoverable but may repeat.
    AtLeastOnce,
    /// No reliable cursor.
    BestEffort,
}

impl SourceCapability {
    /// Whether the source can take part in exactly-once (design §6.1).
    pub fn supports_exactly_once(self) -> bool {
        matches!(self, Self::Replayable | Self::TransactionalRead)
    }
}

/// Sink consistency level (design §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkCapability {
    /// begin / pre-commit / commit / abort / recover.
    TwoPhaseCommit,
    /// Staging plus atomic publish after the epoch is durable.
    StagedAtomicCommit,
    /// Visibility controlled by an epoch log.
    OutboxEpochLog,
    /// Deterministic de-duplication key.
    Idempotent,
    /// Overwrite per key.
    UpsertByKey,
    /// May duplicate.
    AtLeastOnce,
    /// No guarantee.
    BestEffort,
}

impl SinkCapability {
    /// Whether the sink commits strictly (design §7.1: 2PC, staged atomic, outbox).
    pub fn is_strict(self) -> bool {
        matches!(
            self,
            Self::TwoPhaseCommit | Self::StagedAtomicCommit | Self::OutboxEpochLog
        )
    }

    /// Whether retries cannot duplicate visible output (strict, idempotent or upsert).
    pub fn is_effectively_once(self) -> bool {
        self.is_strict() || matches!(self, Self::Idempotent | Self::UpsertByKey)
    }
}

/// What a component says about itself through `describe()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// Name referenced by jobs as `name@version`.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// Must match the exported world.
    pub kind: PluginKind,
    /// One-line description.
    pub description: String,
    /// Declared keyed states.
    pub states: Vec<StateDescriptor>,
    /// Set by sources.
    pub source_capability: Option<SourceCapability>,
    /// Set by sinks.
    pub sink_capability: Option<SinkCapability>,
    /// JSON Schema of the config object, as text.
    pub config_schema: String,
    /// Side outputs the operator may emit to (WIT `output.side-output`); jobs read them
    /// as `{ from = "<operator>", output = "<name>" }`.
    #[serde(default)]
    pub side_outputs: Vec<String>,
    /// Semantic model (window spec, CEP pattern) as JSON; part of the plan fingerprint
    /// (design §9.2).
    #[serde(default)]
    pub model: Option<String>,
    /// Declared non-keyed operator states (WIT `state-declarations`, `0.2.1`; none for
    /// components without that export).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operator_states: Vec<OperatorStateDescriptor>,
}

impl PluginInfo {
    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}
