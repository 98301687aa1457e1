//! The control plane's failures, typed, each carrying its cause.

use crate::CoordinatorError;
use crate::jobs::JobStoreError;
use nop_stream_checkpoint::{LocationError, StorageError};
use nop_stream_proto::FailureClass;

/// Why a request to the job manager failed. Messages name the job, file, location or
/// savepoint at fault, and never a credential.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The job file (or its Delta overlay) does not parse or validate.
    #[error("{0}")]
    JobFile(String),
    /// The job does not compile against the plugins (unknown plugin, wrong world, ...).
    #[error("{0}")]
    Compile(String),
    /// The job is running.
    #[error("job `{job}` is running; {hint}")]
    Running {
        /// The job.
        job: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// Another request is submitting or restoring the job.
    #[error(
        "job `{job}` is being restored from a savepoint or submitted by another request; \
         submit again once it runs"
    )]
    Busy {
        /// The job.
        job: String,
    },
    /// The epoch log of a job does not know an epoch.
    #[error("job `{job}` has no epoch {epoch} in its epoch log")]
    NoEpoch {
        /// The job.
        job: String,
        /// The epoch asked for.
        epoch: u64,
    },
    /// No such job.
    #[error("no job `{job}` {where_}")]
    NoJob {
        /// The job.
        job: String,
        /// Where it was looked for, e.g. "on this coordinator (`nopstream job list` shows them)".
        where_: String,
    },
    /// The job is not running.
    #[error("job `{job}` is not running (it is {state})")]
    NotRunning {
        /// The job.
        job: String,
        /// What it is.
        state: String,
    },
    /// A savepoint cannot be opened, is damaged, or cannot be taken or restored.
    #[error("{0}")]
    Savepoint(String),
    /// A fork into a namespace that holds checkpoints.
    #[error(
        "fork {lineage}: namespace {namespace} already holds checkpoints; fork into another \
         one, or add --fresh to discard them"
    )]
    ForkNamespaceUsed {
        /// The lineage.
        lineage: String,
        /// Its namespace's location.
        namespace: String,
    },
    /// A rescale that cannot be done.
    #[error("{0}")]
    Rescale(String),
    /// A location that does not parse.
    #[error(transparent)]
    Location(#[from] LocationError),
    /// Checkpoint storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The job store failed (a failed write is always this, never a log line).
    #[error(transparent)]
    JobStore(#[from] JobStoreError),
    /// The coordinator role refused or failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The platform failed to prepare something (an output directory, a sink to
    /// finalize), in words.
    #[error("{0}")]
    Platform(String),
    /// The job's run failed.
    #[error("{message}")]
    Job {
        /// How it bears on recovery.
        class: FailureClass,
        /// The root-cause failure, naming plugin, operator and subtask where known.
        message: String,
    },
    /// The job ended before the request could be answered.
    #[error("job `{job}` is ending")]
    Ending {
        /// The job.
        job: String,
    },
}

impl ManagerError {
    /// Whether the same request, repeated a little later, may succeed: checkpoint storage
    /// or the job store unavailable, unreachable, failing with a local I/O error, or
    /// answering "not found" for an object listed a moment before (a retention that ran
    /// between the listing and the read). A job file, compile, savepoint, rescale or
    /// platform error, a corrupt object, refused credentials, a missing bucket, a write
    /// conflict and a lost leadership are not: repeating them gives the same answer, or
    /// they are not this process's to repeat.
    pub fn is_transient(&self) -> bool {
        use nop_stream_storage::ErrorKind as K;
        let store = |e: &nop_stream_storage::StoreError| {
            matches!(
                e.kind,
                K::NotFound | K::Unavailable | K::OutcomeUnknown | K::Unreachable | K::Other
            )
        };
        match self {
            ManagerError::Storage(StorageError::Store(e))
            | ManagerError::JobStore(JobStoreError::Store(e)) => store(e),
            _ => false,
        }
    }
}
