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
    /// A broken invariant of the coordinator or its workers.
    #[error("internal error: {0}")]
    Internal(String),
}
