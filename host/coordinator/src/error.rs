//! Failures the coordinator itself detects (the tasks' own failures come through the
//! [`crate::Workers`] seam in the workers' error type).

/// A failure of the coordinator role.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// The latest durable checkpoint cannot restore this plan (design §10.4).
    #[error("cannot restore from epoch {epoch}: {message}")]
    Restore {
        /// Epoch of the manifest.
        epoch: u64,
        /// What differs.
        message: String,
    },
    /// Checkpoint storage failed (publish, epoch log, attempt allocation).
    #[error("{path}: {message}")]
    Storage {
        /// What was being read or written.
        path: String,
        /// Why.
        message: String,
    },
    /// Another attempt holds an epoch this one tried to make durable: this coordinator
    /// lost the job's namespace (a zombie, or a second coordinator on one job) and retires
    /// (design §6).
    #[error("{message}")]
    EpochTaken {
        /// The epoch.
        epoch: u64,
        /// What holds it.
        message: String,
    },
    /// This coordinator's leadership of its cluster is gone (its lease expired, was
    /// revoked, or another coordinator leads): it stops acting at once, writes nothing
    /// more, and leaves the job to the new leader (design §14.5, "Coordinator HA").
    #[error("leadership of term {term} lost: a deposed coordinator acts on nothing")]
    LeadershipLost {
        /// The term that was lost.
        term: u64,
    },
    /// A broken invariant of the coordinator or its workers.
    #[error("internal error: {0}")]
    Internal(String),
}

/// On the wire (the cluster mode), a coordinator failure is a [`nop_stream_proto::TaskFailure`]:
/// a refused restore and broken invariants are fatal; storage failures may pass (shared
/// checkpoint storage can come back), so recovery may retry them.
impl From<CoordinatorError> for nop_stream_proto::TaskFailure {
    fn from(e: CoordinatorError) -> Self {
        use nop_stream_proto::FailureClass;
        let class = match &e {
            CoordinatorError::Restore { .. }
            | CoordinatorError::Internal(_)
            | CoordinatorError::EpochTaken { .. }
            | CoordinatorError::LeadershipLost { .. } => FailureClass::Fatal,
            CoordinatorError::Storage { .. } => FailureClass::Recoverable,
        };
        nop_stream_proto::TaskFailure {
            class,
            message: e.to_string(),
        }
    }
}
