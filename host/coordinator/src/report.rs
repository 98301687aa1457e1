//! What a finished job reports.

use nop_stream_api::SemanticMode;
use nop_stream_proto::TaskReport;
use serde::Serialize;
use std::time::Duration;

/// Most transactions [`JobReport::committed`] lists: the latest ones, so a report of an
/// unbounded job stays bounded ([`JobReport::committed_total`] counts them all).
pub const MAX_REPORTED_COMMITS: usize = 10_000;

/// A transaction the job committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CommittedTransaction {
    /// Epoch.
    pub epoch: u64,
    /// Transaction id (design §7.2).
    pub txn: String,
}

/// What a finished job reports.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct JobReport {
    /// Job id.
    pub job_id: String,
    /// Semantic mode the job ran with.
    pub semantic: SemanticMode,
    /// Attempt that finished.
    pub attempt: u32,
    /// Global recoveries in this run.
    pub recoveries: u32,
    /// Epoch the run resumed from, if any.
    pub resumed_from: Option<u64>,
    /// Whether the job had already finished in an earlier run (nothing was done).
    pub already_finished: bool,
    /// Wall time of the run.
    pub wall: Duration,
    /// Records read by sources in this run.
    pub records_read: u64,
    /// Records written by sinks in this run (staged; committed ones are in `committed`).
    pub records_written: u64,
    /// Epochs made durable in this run.
    pub epochs: u64,
    /// Records the job's sources read up to its latest durable epoch, each once whatever
    /// the recoveries (the manifest's totals): at the end of a bounded job, every record
    /// of its input.
    #[serde(default)]
    pub durable_records_read: u64,
    /// Records its sinks wrote into transactions up to its latest durable epoch, each
    /// once: at the end, every record committed.
    #[serde(default)]
    pub durable_records_written: u64,
    /// Final epoch.
    pub final_epoch: Option<u64>,
    /// Transactions committed in this run's durable epochs, the latest
    /// [`MAX_REPORTED_COMMITS`] of them, in commit order.
    pub committed: Vec<CommittedTransaction>,
    /// Every transaction committed in this run's durable epochs.
    pub committed_total: u64,
    /// Events of an attempt other than the current one that the coordinator refused
    /// (ACKs, ends of data, commits; design §2.5 "fencing").
    pub refused_stale_events: u64,
    /// Per-task figures of the finishing attempt.
    pub tasks: Vec<TaskReport>,
    /// The job was stopped with a savepoint (`nopstream stop --savepoint`) at
    /// `final_epoch` rather than run to its end; a later run resumes from there.
    pub stopped: bool,
}
