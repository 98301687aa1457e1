//! The CLI protocol (design §2.5, "Control plane"): one [`CliRequest`] per bidirectional
//! stream, answered by one [`CliResponse`]. Values that carry JSON documents (plans,
//! manifests, reports) travel as JSON text, since postcard does not encode free-form JSON.

use nop_stream_api::PluginKind;
use serde::{Deserialize, Serialize};

/// Cap on a plugin upload's frame, in bytes: 64 MiB. A larger component is refused from its
/// length prefix, before anything of it is read.
pub const MAX_UPLOAD_FRAME: usize = 64 << 20;

/// A request of the CLI protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CliRequest {
    /// The registered nodes and their leases.
    ClusterStatus,
    /// Who leads, its term and the standbys.
    Leadership,
    /// Store a component in the plugin registry.
    UploadPlugin {
        /// The component's bytes.
        bytes: Vec<u8>,
        /// sha256 (hex) the client computed: a mismatch means the upload was damaged.
        sha256: String,
    },
    /// The plugins of the registry.
    ListPlugins,
    /// Submit a job.
    SubmitJob(Box<JobSubmission>),
    /// A request about a job, answered the same by an embedded run (over its control
    /// socket) and by a coordinator.
    Control(JobControl),
}

/// A control request about a job, in both modes (design §8): an embedded run answers it
/// over its Unix control socket (one JSON line each way), a coordinator over QUIC. The
/// answer is a [`CliResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobControl {
    /// Every job known ([`CliResponse::Jobs`]).
    ListJobs,
    /// One job ([`CliResponse::Job`]).
    Status {
        /// Job id.
        job: String,
    },
    /// Cancel a running job ([`CliResponse::Job`]).
    Cancel {
        /// Job id.
        job: String,
    },
    /// The checkpoints of a job ([`CliResponse::Checkpoints`]).
    Checkpoints {
        /// Job id.
        job: String,
    },
    /// A job's status with its graph and checkpoints, as `nopstream status` shows it
    /// ([`CliResponse::View`]).
    View {
        /// Job id.
        job: String,
    },
    /// Take a savepoint of a running job ([`CliResponse::Savepoint`]).
    TakeSavepoint {
        /// Job id.
        job: String,
        /// Where to create it: a location URL or absolute path, or a name in the job's
        /// savepoint root; `None`: `epoch-N` there.
        out: Option<String>,
        /// Stop the job once the savepoint is committed (`nopstream stop --savepoint`);
        /// the answer comes when it has stopped.
        stop: bool,
    },
}

/// A job as the CLI submits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSubmission {
    /// Path of the job file, for messages.
    pub file: String,
    /// The job file's text (TOML).
    pub text: String,
    /// Absolute directory of the job file: relative grants resolve against it on every
    /// node.
    pub job_dir: String,
    /// Absolute output directory (`$OUTPUT`), reachable by every node.
    pub output_dir: String,
    /// Override of every operator's parallelism.
    pub parallelism: Option<u32>,
    /// Global recoveries allowed; `None`: the cluster's default.
    pub max_restarts: Option<u32>,
    /// Discard the job's checkpoints and start over.
    pub fresh: bool,
    /// Memory per plugin instance, bytes; `None`: the runtime's default.
    pub memory_bytes: Option<u64>,
    /// CPU time per call into a plugin, ms; `None`: the runtime's default.
    pub cpu_ms_per_call: Option<u64>,
    /// Restore from this savepoint (`job submit --from-savepoint`): a savepoint directory
    /// the coordinator reaches at this absolute path, or a relative name under the
    /// coordinator's `savepoints/<job>/`. The coordinator checks it first and refuses
    /// anything but compatible ([`CliResponse::SavepointRefused`]). A coordinator that
    /// restarts resumes the job from its checkpoints, never from this again.
    #[serde(default)]
    pub from_savepoint: Option<String>,
    /// With `from_savepoint`: the actions that clear the check's findings, as the JSON of
    /// the coordinator's `compat::Actions` (postcard does not encode its tagged enum).
    #[serde(default)]
    pub actions_json: Option<String>,
    /// With `from_savepoint`: only run the check, touching nothing; a compatible one is
    /// answered [`CliResponse::SavepointChecked`]. The CLI asks this first when the
    /// actions hold a `finalize-sink`, which it carries out itself (with the old sink
    /// plugin) before it submits for real: the coordinator takes a submitted
    /// `finalize-sink` as done and drops the sink's pending committables.
    #[serde(default)]
    pub check_only: bool,
    /// The pipeline lineage to run the job as, in place of the job file's `[job]
    /// pipeline`: set by the coordinator itself when a restore carries a `fork` action
    /// (design §3.1: a new checkpoint namespace and new transaction ids), and kept in the
    /// job's record so a restarted coordinator resumes the fork. `None` from the CLI.
    #[serde(default)]
    pub pipeline: Option<String>,
    /// A Delta overlay patching the job file's model (its file name and text): each
    /// changed field has a change class, and a job with a durable checkpoint restores
    /// from it through the compatibility check (design §12.2).
    #[serde(default)]
    pub delta: Option<(String, String)>,
    /// An explicit rescale action (design §10.5): restore the latest durable epoch, taken
    /// by this same job at another parallelism, into the plan at this one.
    #[serde(default)]
    pub rescale: bool,
    /// Override of the job file's `job.checkpoint_interval_ms`.
    #[serde(default)]
    pub checkpoint_interval_ms: Option<u64>,
}

impl JobSubmission {
    /// A plain submission of the job file `file` (its text `text`) whose relative grants
    /// resolve against `job_dir` and whose `$OUTPUT` is `output_dir`; nothing else set.
    pub fn new(file: String, text: String, job_dir: String, output_dir: String) -> Self {
        JobSubmission {
            file,
            text,
            job_dir,
            output_dir,
            parallelism: None,
            max_restarts: None,
            fresh: false,
            memory_bytes: None,
            cpu_ms_per_call: None,
            from_savepoint: None,
            actions_json: None,
            check_only: false,
            pipeline: None,
            delta: None,
            rescale: false,
            checkpoint_interval_ms: None,
        }
    }
}

/// The answer to a [`CliRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CliResponse {
    /// Every node that registered with this coordinator process.
    Status(Vec<NodeStatus>),
    /// The plugin stored (or already stored with the same bytes).
    Plugin(PluginEntry),
    /// The registry's plugins, by name and version.
    Plugins(Vec<PluginEntry>),
    /// One job.
    Job(Box<JobStatus>),
    /// Every job.
    Jobs(Vec<JobStatus>),
    /// A job's checkpoints: its epoch log and its retained manifests, as JSON arrays.
    Checkpoints {
        /// `Vec<EpochLogRecord>` as JSON.
        log_json: String,
        /// `Vec<EpochManifest>` as JSON, oldest first.
        manifests_json: String,
    },
    /// A job's view (the job manager's `StatusView`, the JSON API's shapes), as JSON.
    View {
        /// `StatusView` as JSON.
        view_json: String,
    },
    /// The savepoint taken.
    Savepoint {
        /// `SavepointInfo` as JSON.
        info_json: String,
    },
    /// The request was refused; the message says why.
    Error(String),
    /// A submission from a savepoint was refused by the compatibility check: nothing was
    /// touched (`job submit --from-savepoint` exits with `exit_code`).
    SavepointRefused {
        /// The savepoint, as the coordinator resolved it.
        savepoint: String,
        /// The check's exit code: 2 needs action, 3 incompatible.
        exit_code: u8,
        /// The coordinator's `compat::Report` as JSON.
        report_json: String,
    },
    /// A `check_only` submission's savepoint check is compatible; nothing was touched.
    SavepointChecked {
        /// The coordinator's `compat::Report` as JSON.
        report_json: String,
    },
    /// This coordinator is a standby (design §14.5, "Coordinator HA"): ask the leader.
    NotLeader {
        /// The leader's advertised address, if one is known.
        leader: Option<String>,
        /// Its term, 0 if unknown.
        term: u64,
    },
    /// Who leads the cluster (the answer to [`CliRequest::Leadership`]).
    Leadership(Leadership),
}

/// The coordinators of a cluster, as the leader sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leadership {
    /// The leader's advertised address.
    pub leader: String,
    /// Its term: the fencing token every command carries.
    pub term: u64,
    /// The election backend, e.g. `etcd http://127.0.0.1:2379` or `local` (one
    /// coordinator); never credentials.
    pub election: String,
    /// The standbys' advertised addresses.
    pub standbys: Vec<String>,
}

/// One node as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `node-<id>`.
    pub node: String,
    /// Its current (or last) lease.
    pub lease: u64,
    /// Whether the lease is live now.
    pub live: bool,
    /// Address it serves data connections on.
    pub data_addr: String,
    /// Task slots it offers.
    pub slots: u32,
    /// Registrations so far (1 + re-registrations).
    pub registrations: u32,
    /// Renewals accepted under the current lease.
    pub renewals: u64,
    /// Renewals accepted over every lease of the node (a counter).
    #[serde(default)]
    pub renewals_total: u64,
    /// Renewals refused (stale or expired lease) over all sessions.
    pub refused_renewals: u64,
    /// Leases of this node that expired (no renewal within the TTL).
    pub expirations: u32,
    /// Leases of this node that ended, whatever the cause: expired, its session ended
    /// (connection closed, renewal refused), or a restarted process registered again. Every
    /// loss of the node is counted here (design §2.5).
    #[serde(default)]
    pub lost: u32,
    /// Registrations refused because another process held the node's live lease.
    #[serde(default)]
    pub refused_registrations: u32,
}

/// A plugin of the registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginEntry {
    /// Name from `describe()`.
    pub name: String,
    /// Version from `describe()`.
    pub version: String,
    /// The world it exports.
    pub kind: PluginKind,
    /// sha256 of the component (hex).
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Description from `describe()`.
    pub description: String,
    /// WIT package it was validated against, e.g. `nop:stream@0.2.1`.
    pub wit: String,
    /// When it was stored, ms since the Unix epoch.
    pub stored_ms: u64,
}

impl PluginEntry {
    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// Where a cluster job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Accepted, not yet deployed (waiting for nodes).
    Submitted,
    /// Deployed; epochs run.
    Running,
    /// Ran to completion: the final epoch committed.
    Finished,
    /// Failed for good (restart budget spent, or not recoverable).
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// Stopped with a savepoint by a user (`nopstream stop --savepoint`); a new
    /// submission resumes from its checkpoints.
    Stopped,
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobState::Submitted => "SUBMITTED",
            JobState::Running => "RUNNING",
            JobState::Finished => "FINISHED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Stopped => "STOPPED",
        })
    }
}

/// Refusals of stale work of a job, by where they were refused (design §2.5: streams,
/// ACKs and commits of older generations are refused and counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedCounts {
    /// Task events (ACKs, ends of data, commit confirmations) of another generation, refused
    /// at the coordinator.
    pub events: u64,
    /// Data streams refused at a receiving node.
    pub streams: u64,
    /// Commands (barrier injections, commits) of another generation refused at a node.
    pub commands: u64,
}

/// A cluster job as `nopstream job status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    /// Job id.
    pub job: String,
    /// Job name.
    pub name: String,
    /// Where it is.
    pub state: JobState,
    /// Semantic mode.
    pub semantic: String,
    /// When it was submitted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// The generation deployed last (0: never deployed).
    pub generation: u64,
    /// Global recoveries so far (over coordinator restarts).
    pub recoveries: u32,
    /// Latest durable epoch.
    pub durable_epoch: Option<u64>,
    /// Records read by its sources and written by its sinks, as the nodes report them.
    pub records_read: u64,
    /// See `records_read`.
    pub records_written: u64,
    /// Stale work refused.
    pub refused: RefusedCounts,
    /// The output directory.
    pub output_dir: String,
    /// Why it failed, or what the last recovery recovered from.
    pub error: Option<String>,
    /// The DeploymentPlan of the live (or last) generation, as JSON.
    pub deployment_json: Option<String>,
    /// The run report once finished, as JSON.
    pub report_json: Option<String>,
    /// The current run's number (1 for the first submission of the job id); its counts
    /// are this run's alone.
    #[serde(default)]
    pub run: u32,
    /// Earlier runs of the job id (the job manager's `PastRun`s), as JSON, newest last.
    #[serde(default)]
    pub history_json: Option<String>,
}
