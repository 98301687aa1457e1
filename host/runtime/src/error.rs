//! Errors of the runtime. Messages always name the plugin, the operator and the subtask
//! at fault, and for limits the limit's name and value.

use nop_stream_api::{ChannelId, FencingToken, PluginKind};
use std::fmt;

/// Where something happened: plugin, operator and subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// `name@version` or the component path.
    pub plugin: String,
    /// Operator name from the job file.
    pub operator: String,
    /// Subtask index, if the call served one (`None` for planning-time calls).
    pub subtask: Option<u32>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin `{}` (operator `{}`", self.plugin, self.operator)?;
        if let Some(s) = self.subtask {
            write!(f, ", subtask {s}")?;
        }
        f.write_str(")")
    }
}

/// Errors of loading, instantiating and running plugins and jobs.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The component file could not be read or compiled.
    #[error("cannot load plugin `{plugin}` from {path}: {message}")]
    PluginLoad {
        /// Plugin reference.
        plugin: String,
        /// Component file.
        path: String,
        /// Why.
        message: String,
    },
    /// No component file matches the reference.
    #[error("plugin `{plugin}` {message}")]
    PluginNotFound {
        /// Plugin reference.
        plugin: String,
        /// Where it looked.
        message: String,
    },
    /// The component does not export the world its role needs.
    #[error("plugin `{plugin}` does not implement the `nop:stream/{expected}` world: {message}")]
    WrongWorld {
        /// Plugin reference.
        plugin: String,
        /// World the job needs.
        expected: PluginKind,
        /// wasmtime's explanation.
        message: String,
    },
    /// The component's `describe()` disagrees with how it is used.
    #[error("plugin `{plugin}`: {message}")]
    DescribeMismatch {
        /// Plugin reference.
        plugin: String,
        /// What differs.
        message: String,
    },
    /// The guest trapped (panic, CPU or memory limit, bad call); its task fails.
    #[error("{site} trapped in `{call}`: {reason}")]
    Trap {
        /// Where.
        site: Site,
        /// Export being called.
        call: &'static str,
        /// Trap reason; names the limit when one fired.
        reason: String,
    },
    /// The guest returned more than a limit allows; its task fails.
    #[error("{site} exceeded limit `{limit}` in `{call}`: {value} > {max}")]
    LimitExceeded {
        /// Where.
        site: Site,
        /// Export being called.
        call: &'static str,
        /// Limit name as in [`crate::Limits`].
        limit: &'static str,
        /// Observed value.
        value: u64,
        /// Allowed maximum.
        max: u64,
    },
    /// The guest reported an error (data, not a trap); the job's error policy fails the task.
    #[error("{site} failed in `{call}` ({code}): {message}")]
    Guest {
        /// Where.
        site: Site,
        /// Export being called.
        call: &'static str,
        /// Error code reported by the guest.
        code: String,
        /// Guest message.
        message: String,
    },
    /// The guest returned a batch whose offsets are inconsistent.
    #[error("{site} returned a malformed batch from `{call}`: {detail}")]
    MalformedBatch {
        /// Where.
        site: Site,
        /// Export being called.
        call: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A record crossing a HASH edge has no key.
    #[error(
        "{site} emitted a record without a key onto HASH edge `{edge}`; keyed inputs need keyed records"
    )]
    MissingKey {
        /// Emitting operator.
        site: Site,
        /// Edge id.
        edge: String,
    },
    /// A channel write or open was refused because its fencing token is stale (design §10.2).
    #[error("channel {channel}: fencing token {token} refused, current token is {current}")]
    Fenced {
        /// Channel.
        channel: ChannelId,
        /// Token presented.
        token: FencingToken,
        /// Token in force.
        current: FencingToken,
    },
    /// A channel peer went away (its task ended or failed).
    #[error("channel {channel} closed: {message}")]
    ChannelClosed {
        /// Channel.
        channel: ChannelId,
        /// Why.
        message: String,
    },
    /// A sink commit could not be established (design §5.7, §7.4): never reported as committed.
    #[error("{site}: commit of transaction `{txn}` {message}")]
    CommitUncertain {
        /// Sink.
        site: Site,
        /// Transaction id.
        txn: String,
        /// What happened.
        message: String,
    },
    /// A filesystem operation of the host failed.
    #[error("{path}: {message}")]
    Io {
        /// Path involved.
        path: String,
        /// OS message.
        message: String,
    },
    /// A checkpoint cannot restore this job (design §10.4); the message says what differs.
    #[error("cannot restore from epoch {epoch}: {message}")]
    Restore {
        /// Epoch of the manifest.
        epoch: u64,
        /// What differs or is broken.
        message: String,
    },
    /// The task was cancelled because another task failed.
    #[error("cancelled")]
    Cancelled,
    /// Anything the host itself got wrong (a bug).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result alias of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl nop_stream_proto::TaskError for RuntimeError {
    /// Setup errors, a refused restore and commit uncertainty are final (design §5.7: an
    /// unknown outcome fails loudly); cancellation, closed channels and fencing follow
    /// from another failure; everything else may be recovered from the latest durable
    /// epoch.
    fn class(&self) -> nop_stream_proto::FailureClass {
        use nop_stream_proto::FailureClass;
        match self {
            RuntimeError::Cancelled
            | RuntimeError::ChannelClosed { .. }
            | RuntimeError::Fenced { .. } => FailureClass::Secondary,
            RuntimeError::CommitUncertain { .. }
            | RuntimeError::PluginLoad { .. }
            | RuntimeError::PluginNotFound { .. }
            | RuntimeError::WrongWorld { .. }
            | RuntimeError::DescribeMismatch { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Restore { .. } => FailureClass::Fatal,
            _ => FailureClass::Recoverable,
        }
    }
}

impl From<nop_stream_coordinator::CoordinatorError> for RuntimeError {
    fn from(e: nop_stream_coordinator::CoordinatorError) -> Self {
        use nop_stream_coordinator::CoordinatorError;
        match e {
            CoordinatorError::Restore { epoch, message } => {
                RuntimeError::Restore { epoch, message }
            }
            CoordinatorError::Storage { path, message } => RuntimeError::Io { path, message },
            CoordinatorError::Internal(m) => RuntimeError::Internal(m),
        }
    }
}
