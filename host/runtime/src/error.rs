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
    /// The component imports or exports `nop:stream` interfaces of a WIT version this
    /// host does not serve (design §16): built by another SDK than this host's.
    #[error(
        "cannot load plugin `{plugin}` from {path}: it was built against {built_for}, a WIT \
         version this host does not serve: it serves {served} (see wit/CHANGELOG.md); \
         rebuild the plugin with the nop-stream-sdk of this host"
    )]
    UnservedWit {
        /// Plugin reference.
        plugin: String,
        /// Component file.
        path: String,
        /// The package version it was built against, e.g. `nop:stream@0.1.0`.
        built_for: String,
        /// What this host serves ([`crate::WIT_PACKAGE`]).
        served: &'static str,
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
    /// The guest reported an error (data, not a trap). From `process`, the operator's
    /// error policy (`on_error`) decides; with `fail`, or from any other call, the task
    /// fails, and only the code `io` is retried by recovery (the rest is deterministic).
    #[error("{site} failed in `{call}` ({code}): {message}{}", on_record(.record))]
    Guest {
        /// Where.
        site: Site,
        /// Export being called.
        call: &'static str,
        /// Error code reported by the guest, as WIT spells it (`invalid-record`).
        code: &'static str,
        /// Guest message (boxed, like `record`: errors travel in every `Result` of the
        /// runtime).
        message: Box<str>,
        /// The record that failed, printable and truncated to [`MAX_RECORD_IN_ERROR`]
        /// bytes (see [`printable_record`]), when the call was `process` and the host
        /// isolated it.
        record: Option<Box<str>>,
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

/// Longest prefix of a failed record quoted in an error, in bytes.
pub const MAX_RECORD_IN_ERROR: usize = 200;

/// A record for an error message: UTF-8 (lossy) with control characters escaped, at most
/// [`MAX_RECORD_IN_ERROR`] bytes of it, and when cut, how long it was.
pub fn printable_record(bytes: &[u8]) -> String {
    let mut cut = bytes.len().min(MAX_RECORD_IN_ERROR);
    // Cut on a character boundary when the bytes are UTF-8.
    while cut < bytes.len() && cut > 0 && (bytes[cut] & 0xC0) == 0x80 {
        cut -= 1;
    }
    let text = String::from_utf8_lossy(&bytes[..cut]);
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if cut < bytes.len() {
        out.push_str(&format!("… ({} bytes)", bytes.len()));
    }
    out
}

fn on_record(record: &Option<Box<str>>) -> String {
    match record {
        Some(r) => format!(
            "; record: `{r}` (on_error = \"fail\"; \"skip\" or \"dead-letter\" on the operator would go on without it)"
        ),
        None => String::new(),
    }
}

/// Result alias of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl nop_stream_proto::TaskError for RuntimeError {
    /// Setup errors, a refused restore, commit uncertainty (design §5.7: an unknown
    /// outcome fails loudly) and guest-reported errors other than `io` are final: a
    /// plugin's error is data about a record or a config, and replaying the same input
    /// reports it again, so it must not burn the restart budget. Cancellation, closed
    /// channels and fencing follow from another failure; everything else (traps, limits,
    /// guest `io` errors) may be recovered from the latest durable epoch.
    fn class(&self) -> nop_stream_proto::FailureClass {
        use nop_stream_proto::FailureClass;
        match self {
            RuntimeError::Cancelled
            | RuntimeError::ChannelClosed { .. }
            | RuntimeError::Fenced { .. } => FailureClass::Secondary,
            RuntimeError::CommitUncertain { .. }
            | RuntimeError::PluginLoad { .. }
            | RuntimeError::UnservedWit { .. }
            | RuntimeError::PluginNotFound { .. }
            | RuntimeError::WrongWorld { .. }
            | RuntimeError::DescribeMismatch { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Restore { .. } => FailureClass::Fatal,
            RuntimeError::Guest { code, .. } if *code != "io" => FailureClass::Fatal,
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
            CoordinatorError::EpochTaken { epoch, message } => RuntimeError::Io {
                path: format!("epoch {epoch} of the checkpoint namespace"),
                message,
            },
            CoordinatorError::Internal(m) => RuntimeError::Internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_proto::{FailureClass, TaskError};

    fn guest(code: &'static str, record: Option<Box<str>>) -> RuntimeError {
        RuntimeError::Guest {
            site: Site {
                plugin: "flights-mapper@0.1.0".into(),
                operator: "parse".into(),
                subtask: Some(1),
            },
            call: "process",
            code,
            message: "column dep_delay: value \"x\" is not a number".into(),
            record,
        }
    }

    #[test]
    fn guest_errors_are_final_except_io() {
        // Regression: a poison record's error was retried until the restart budget ran out.
        assert_eq!(guest("invalid-record", None).class(), FailureClass::Fatal);
        assert_eq!(guest("internal", None).class(), FailureClass::Fatal);
        assert_eq!(guest("io", None).class(), FailureClass::Recoverable);
    }

    #[test]
    fn a_guest_error_names_its_record() {
        let e = guest("invalid-record", Some(printable_record(b"2013,1,x").into()));
        assert_eq!(
            e.to_string(),
            "plugin `flights-mapper@0.1.0` (operator `parse`, subtask 1) failed in `process` \
             (invalid-record): column dep_delay: value \"x\" is not a number; record: \
             `2013,1,x` (on_error = \"fail\"; \"skip\" or \"dead-letter\" on the operator would \
             go on without it)"
        );
        assert!(
            !guest("invalid-record", None)
                .to_string()
                .contains("record:")
        );
    }

    #[test]
    fn printable_records_are_cut_escaped_and_say_their_length() {
        assert_eq!(printable_record(b"a\tb\n"), "a\\tb\\n");
        let long = "é".repeat(150); // 300 bytes
        let p = printable_record(long.as_bytes());
        assert_eq!(p, format!("{}… (300 bytes)", "é".repeat(100)));
        // Not UTF-8: replacement characters, never a panic.
        assert_eq!(printable_record(&[0xff, b'a']), "\u{fffd}a");
    }
}
