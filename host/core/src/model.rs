//! The canonical StreamModel (seed §12.1): the user's intent as read from a job file.
//! Everything later (identities, fingerprints, plans) derives from it.

use nop_stream_api::{PartitionPolicy, PluginKind, SemanticMode};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The canonical model of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamModel {
    /// Job-level settings.
    pub job: JobSpec,
    /// Host-side preparation steps run before the job (e.g. unpacking an input archive).
    pub prepare: Vec<PrepareStep>,
    /// Sources, operators and sinks in job-file order.
    pub nodes: Vec<NodeSpec>,
}

/// Job-level settings of the `[job]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job name (required).
    pub name: String,
    /// Logical job id; defaults to the name.
    pub id: String,
    /// Pipeline lineage id; defaults to `main`.
    pub pipeline: String,
    /// Default parallelism of every node; default 1.
    pub parallelism: u32,
    /// State shards per keyed vertex; default 128.
    pub state_shards: u32,
    /// Declared semantic mode; default strict-exactly-once.
    pub semantic: SemanticMode,
    /// Checkpoint interval in ms; default none.
    pub checkpoint_interval_ms: Option<u64>,
    /// Records per batch; default 1024.
    pub batch_records: u32,
}

/// A host-side preparation step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum PrepareStep {
    /// Extract `member` of the zip archive `archive` into directory `into` unless the
    /// target file already exists. Paths are relative to the job file's directory.
    Unzip {
        /// Zip archive path.
        archive: String,
        /// Member to extract.
        member: String,
        /// Destination directory.
        into: String,
    },
}

/// A source, operator or sink of the job file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Name, unique in the job (required).
    pub name: String,
    /// Source, operator or sink: the table it was declared in.
    pub kind: PluginKind,
    /// Explicit stable id (seed §3.2 priority 1).
    pub uid: Option<String>,
    /// Canonical model path: `sources/<name>`, `operators/<name>` or `sinks/<name>`.
    pub path: String,
    /// The plugin implementing the node.
    pub plugin: PluginRef,
    /// Parallelism override.
    pub parallelism: Option<u32>,
    /// Inputs in declaration order (empty for sources).
    pub inputs: Vec<InputSpec>,
    /// Config object handed to the plugin's `open` (JSON; `{}` if absent).
    pub config: serde_json::Value,
    /// Directories granted to the plugin.
    pub grants: Vec<Grant>,
}

/// One input of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    /// Name of the upstream node.
    pub from: String,
    /// Explicit partition policy; default FORWARD for equal parallelism, else REBALANCE.
    pub partition: Option<PartitionPolicy>,
}

/// A plugin reference: `name@version` resolved in the plugin path, or a `.wasm` file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "by")]
pub enum PluginRef {
    /// `name@version`.
    Named {
        /// Plugin name.
        name: String,
        /// Exact version.
        version: String,
    },
    /// A component file, relative to the job file's directory.
    Path {
        /// File path.
        path: String,
    },
}

impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginRef::Named { name, version } => write!(f, "{name}@{version}"),
            PluginRef::Path { path } => f.write_str(path),
        }
    }
}

/// A directory granted to a plugin through a WASI preopen (design §3: no ambient
/// authority).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Path the plugin sees, e.g. `/input`.
    pub guest: String,
    /// Host directory as written: relative to the job file's directory, or starting with
    /// `$OUTPUT` (the run's output directory).
    pub host: String,
    /// Whether the plugin may create and modify files there.
    pub writable: bool,
}
