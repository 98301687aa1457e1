//! The canonical StreamModel (design §12.1): the user's intent as read from a job file.
//! Everything later (identities, fingerprints, plans) derives from it.

use nop_stream_api::{OperatorId, PartitionPolicy, PluginKind, SemanticMode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    /// Named connections to external systems (`[connections.<name>]`), by name. A node
    /// reaches one only if its `connections` grant names it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub connections: BTreeMap<String, ConnectionSpec>,
}

/// A named connection to an external system (job file `[connections.<name>]`). It holds
/// an address and the *name* of an environment variable, never a credential: a URL with
/// a password is refused, and the host reads the password from `password_env` when it
/// opens a session. Plugins never see either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionSpec {
    /// The protocol: `postgres`, `nats` (JetStream) or `redis`.
    pub kind: String,
    /// Where to connect, e.g. `postgres://user@127.0.0.1:5432/db`, `nats://127.0.0.1:4222`
    /// or `redis://127.0.0.1:6379/0` (never a password).
    pub url: String,
    /// Environment variable of the host holding the password; none: connect without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// PEM file of the certificate authorities to trust for a TLS URL (`rediss://`,
    /// `tls://`), on the host that connects; relative to the job file's directory. None:
    /// the system's roots. Refused with a plain-text URL and for `postgres` (no TLS yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
}

/// Connection kinds the host implements.
pub const CONNECTION_KINDS: &[&str] = &["postgres", "nats", "redis"];

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
    /// Checkpoint after every this many records read by the sources (all subtasks
    /// together); default none. An alternative or an addition to the interval: a run
    /// takes the same number of epochs however fast it goes, which the benchmarks need
    /// to compare instruction counts under valgrind (design §20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every_records: Option<u64>,
    /// How long an epoch may take from its barrier injection until its manifest is
    /// durable, in ms (job file `checkpoint_timeout_ms`, Flink's
    /// `execution.checkpointing.timeout`); an older epoch is aborted and the job goes on
    /// with the next one. Default none: the runner's default (60,000 ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_timeout_ms: Option<u64>,
    /// Memory budget of the job's keyed state in bytes (job file `state_memory_bytes`, an
    /// integer or a string such as `"256MiB"`); default none: every stateful subtask
    /// keeps the default budget. Split evenly over the job's stateful operator subtasks;
    /// see `nop_stream_state::StateConfig::memory_bytes` for what it counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_memory_bytes: Option<u64>,
    /// Whether keyed-state snapshots run asynchronously (job file `async_snapshots`,
    /// default `true`): the task thread flushes the working set and takes a frozen view
    /// at the barrier, and a background thread writes the segments and acknowledges the
    /// epoch once they are durable. `false`: the task thread writes them itself, as
    /// before. Left out of the serialised model when `true`, so fingerprints of jobs that
    /// do not set it are unchanged.
    #[serde(
        default = "crate::model::yes",
        skip_serializing_if = "crate::model::is_true"
    )]
    pub async_snapshots: bool,
    /// Whether keyed-state snapshots are incremental (job file `incremental_snapshots`,
    /// default `true`; design §5.5, §8.1): an epoch writes, per state and shard, only the
    /// keys written or deleted since the subtask's previous snapshot (`kv-delta/1`), and the
    /// manifest lists the full snapshot they build on and every delta since. A full
    /// snapshot is taken again once the deltas together outweigh it, after a restore, and
    /// when more keys changed than the memory budget lets the state track. `false`: every
    /// epoch is a full snapshot. Left out of the serialised model when `true`, so
    /// fingerprints of jobs that do not set it are unchanged.
    #[serde(
        default = "crate::model::yes",
        skip_serializing_if = "crate::model::is_true"
    )]
    pub incremental_snapshots: bool,
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
    /// Sort the CSV file `file` (with a header line) by the columns `by` (numerically
    /// when both values parse as numbers, else bytewise; stable, so equal keys keep file
    /// order) into `into`, unless `into` already exists and is newer than `file`. Used to
    /// feed event-time jobs from a file that is far from time order (design §9).
    Sort {
        /// Input CSV, relative to the job file's directory.
        file: String,
        /// Column names, most significant first.
        by: Vec<String>,
        /// Output file, relative to the job file's directory.
        into: String,
    },
}

/// How a source derives watermarks from the event time its records carry (design §8.5;
/// Flink's bounded-out-of-orderness `WatermarkStrategy` with idleness).
///
/// Per split the reader tracks the largest timestamp seen, `max_ts`; the split's
/// watermark is `max_ts - max_out_of_orderness_ms - 1`. The source subtask's watermark is
/// the minimum over its unfinished splits that are not idle (a split not yet started
/// holds it back), never decreasing. A started, unfinished split that returned no record
/// for `idle_timeout_ms` is idle; when every unfinished split of a subtask is idle the
/// subtask marks its output channels idle and downstream tasks leave them out of their
/// minimum until records flow again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkSpec {
    /// Bound on how far behind the largest timestamp seen a record may arrive, in ms;
    /// default 0.
    pub max_out_of_orderness_ms: u64,
    /// Processing time without records after which a split counts as idle, in ms;
    /// default none (never idle).
    pub idle_timeout_ms: Option<u64>,
    /// Watermark alignment (Flink's `withWatermarkAlignment`): a source subtask whose
    /// watermark is more than this many ms ahead of the slowest subtask of the same
    /// source pauses reading until the others catch up, so downstream operators do not
    /// buffer the fast readers' future events. In a cluster the subtasks on other nodes
    /// count too: nodes exchange their watermarks through the coordinator, and a subtask
    /// waits for one elsewhere that has not reported yet (design §8.5). Default none (no
    /// alignment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_drift_ms: Option<u64>,
}

/// A source, operator or sink of the job file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Name, unique in the job (required).
    pub name: String,
    /// Source, operator or sink: the table it was declared in.
    pub kind: PluginKind,
    /// Explicit stable id (design §3.2 priority 1).
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
    /// Names of the `[connections.<name>]` the plugin may open (sources and sinks only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<String>,
    /// Sources only: watermark generation from record timestamps; none by default (the
    /// only watermark is the final one at the end of bounded input).
    #[serde(default)]
    pub watermarks: Option<WatermarkSpec>,
    /// Operators and sinks: never fused into the upstream chain (Flink's
    /// `startNewChain()`), so the node runs on its own thread after a channel hop.
    /// Default `false`: a FORWARD input at equal parallelism chains.
    #[serde(default)]
    pub start_new_chain: bool,
    /// Operators: what a guest-reported error in `process` does to the record
    /// (job-file `on_error`); default [`ErrorPolicy::Fail`].
    #[serde(default, skip_serializing_if = "ErrorPolicy::is_fail")]
    pub on_error: ErrorPolicy,
    /// Operators: time-to-live in milliseconds of declared keyed states, by state name
    /// (job-file `state_ttl_ms = { counts = 86400000 }`); processing time since the
    /// entry's last write, Flink's `StateTtlConfig` defaults (see `nop_stream_state`).
    /// Empty by default: nothing expires.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state_ttl_ms: BTreeMap<String, u64>,
}

/// What the host does with a record whose `process` call reports a guest error (a WIT
/// `error`, not a trap): job-file `on_error` on an `[[operator]]`.
///
/// Errors of other calls (`on-watermark`, `on-timers`, `prepare-checkpoint`, `finish`)
/// belong to no record and always fail the job. `Skip` and `DeadLetter` isolate the
/// failing records by calling `process` again one record at a time, which is sound only
/// when a failed call leaves nothing behind: so they are accepted only for operators that
/// declare no keyed state (the planner refuses them otherwise; see docs/operations.md, "Error policy").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorPolicy {
    /// The job fails at once, naming the record; deterministic errors are not retried.
    #[default]
    Fail,
    /// The record is dropped and counted (`records_skipped`): a declared loss.
    Skip,
    /// The record goes, with its error, to the operator's side output `errors`
    /// (see [`DEAD_LETTER_OUTPUT`]) and is counted (`records_dead_lettered`).
    DeadLetter,
}

/// Side output tag of dead-lettered records (`on_error = "dead-letter"`).
pub const DEAD_LETTER_OUTPUT: &str = "errors";

impl ErrorPolicy {
    /// The job-file spelling: `fail`, `skip`, `dead-letter`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorPolicy::Fail => "fail",
            ErrorPolicy::Skip => "skip",
            ErrorPolicy::DeadLetter => "dead-letter",
        }
    }

    /// Parses the job-file spelling (case-insensitive, `_` = `-`, like partition and
    /// semantic names).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "fail" => Some(ErrorPolicy::Fail),
            "skip" => Some(ErrorPolicy::Skip),
            "dead-letter" => Some(ErrorPolicy::DeadLetter),
            _ => None,
        }
    }

    /// Whether this is the default, [`ErrorPolicy::Fail`].
    pub fn is_fail(&self) -> bool {
        *self == ErrorPolicy::Fail
    }
}

impl fmt::Display for ErrorPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One input of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    /// Name of the upstream node.
    pub from: String,
    /// Explicit partition policy; default FORWARD for equal parallelism, else REBALANCE.
    pub partition: Option<PartitionPolicy>,
    /// Side output of the upstream operator to read (e.g. `late`), which its plugin must
    /// declare; none reads the main output.
    #[serde(default)]
    pub output: Option<String>,
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

/// A directory granted to a plugin through a WASI preopen (design §16: no ambient
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

impl StreamModel {
    /// A Delta on the model (design §12.2): the job's parallelism becomes `p` (`-p`).
    /// Sets `job.parallelism`; a node whose job-file entry sets its own `parallelism`
    /// keeps it, as an operator's own parallelism wins over Flink's `-p` (a global stage
    /// written at `parallelism = 1` stays there). The result must be compiled again,
    /// which re-validates it (e.g. a SINGLETON consumer at `p > 1` is refused).
    pub fn with_parallelism(mut self, p: u32) -> Self {
        self.job.parallelism = p;
        self
    }

    /// Dotted field prefix of node `index` in job-file terms: `source[0]`,
    /// `operator[2]`, `sink[0]` (indexed within the node's kind, in model order).
    ///
    /// # Panics
    /// If `index` is out of bounds.
    pub fn node_field(&self, index: usize) -> String {
        let kind = self.nodes[index].kind;
        let ordinal = self.nodes[..index]
            .iter()
            .filter(|n| n.kind == kind)
            .count();
        format!("{}[{ordinal}]", kind.world())
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Effective parallelism of `node`: its override, else the job's.
    pub fn parallelism_of(&self, node: &NodeSpec) -> u32 {
        node.parallelism.unwrap_or(self.job.parallelism)
    }
}

/// The stable operator id of a node (design §3.2): the explicit `uid` (priority 1), else
/// the canonical model path such as `operators/per-carrier` (priority 2). Nodes of a job
/// file always have a name, so priority 3 ([`structural_operator_id`]) is only for
/// models built by other front ends with anonymous nodes. Never an index or address.
pub fn operator_id(node: &NodeSpec) -> OperatorId {
    match &node.uid {
        Some(uid) => OperatorId::new(uid.clone()),
        None => OperatorId::new(node.path.clone()),
    }
}

/// Structural operator id (design §3.2 priority 3) for a node with neither `uid` nor a
/// name: `struct-` + the first 20 hex digits of sha256 over the normalized topology:
/// the node's kind, its plugin *name* (a `.wasm` path contributes its file stem), and
/// for each input in order the upstream's operator id (`upstream[j]`, itself stable)
/// and partition policy (`default` when implicit), plus `ordinal`, which tells apart
/// structurally identical siblings (0 for the first in model order).
///
/// Config, plugin version and parallelism are deliberately left out, so changing them
/// keeps the operator's state; renaming the plugin or rewiring its inputs does not.
pub fn structural_operator_id(
    node: &NodeSpec,
    upstream: &[OperatorId],
    ordinal: u32,
) -> OperatorId {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"nop-stream/structural-operator-id/v1\0");
    h.update(node.kind.world().as_bytes());
    h.update(b"\0");
    let plugin = match &node.plugin {
        PluginRef::Named { name, .. } => name.as_str(),
        PluginRef::Path { path } => {
            let file = path.rsplit(['/', '\\']).next().unwrap_or(path);
            file.strip_suffix(".wasm").unwrap_or(file)
        }
    };
    h.update(plugin.as_bytes());
    h.update(b"\0");
    for (j, input) in node.inputs.iter().enumerate() {
        let up = upstream.get(j).map_or("", |u| u.as_str());
        h.update(up.as_bytes());
        h.update(b"\0");
        let part = input
            .partition
            .map_or_else(|| "default".to_owned(), |p| p.to_string());
        h.update(part.as_bytes());
        h.update(b"\0");
    }
    h.update(ordinal.to_le_bytes());
    let digest = hex::encode(h.finalize());
    OperatorId::new(format!("struct-{}", &digest[..20]))
}

/// `true` (a serde default).
pub(crate) fn yes() -> bool {
    true
}

/// Whether `b` is `true` (serde: leave a default-true flag out).
#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_true(b: &bool) -> bool {
    *b
}
