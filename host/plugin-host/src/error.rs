//! Errors of plugins and of the tasks that run them. Messages always name the plugin, the
//! operator and the subtask at fault, and for limits the limit's name and value.

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
        /// The host refused a call the guest made ([`crate::HostTrap`]: a key outside the
        /// subtask's state shards, an undeclared side output, a malformed buffer). The
        /// same input makes the same call again, so the failure is final
        /// ([`nop_stream_proto::FailureClass::Fatal`]); any other trap may be recovered
        /// from.
        refused: bool,
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
        /// The record that failed, when the call was `process` and the host isolated
        /// it (boxed: errors travel in every `Result` of the runtime).
        record: Option<Box<FailedRecord>>,
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
        "{site} emitted a record without a key, but its output goes to {to} over a HASH \
         edge (`{edge}`), which routes each record by its key: have `{}` key its records, \
         or give that input another partition", .site.operator
    )]
    MissingKey {
        /// Emitting operator (the tail of its chain).
        site: Site,
        /// Edge id (`{from vertex}->{to vertex}#{input}`; a vertex is named after the
        /// head of its chain).
        edge: String,
        /// The receiving end in job-file terms: ``input 1 of `q7` ``.
        to: String,
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

/// The record a [`RuntimeError::Guest`] error names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRecord {
    /// The record, printable and truncated to [`MAX_RECORD_IN_ERROR`] bytes (see
    /// [`printable_record`]).
    pub printable: String,
    /// What the user can do about it, printed after it.
    pub hint: RecordHint,
}

/// What a [`RuntimeError::Guest`] error tells the user to do about its failed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordHint {
    /// Nothing: an `io` error (recovery retries it) or an `invalid-config` one (the job
    /// file is at fault, not the record).
    #[default]
    None,
    /// The operator has no keyed state and `on_error = "fail"`: `skip` or `dead-letter`
    /// would go on without the record.
    SkipOrDeadLetter,
    /// The operator has keyed state, where `skip` and `dead-letter` are refused (the host
    /// cannot take back a failed call's state writes): check records before it.
    KeyedState,
}

impl RecordHint {
    /// The text printed after the record, or `None`.
    pub fn text(self) -> Option<&'static str> {
        match self {
            RecordHint::None => None,
            RecordHint::SkipOrDeadLetter => Some(
                "(on_error = \"fail\"; \"skip\" or \"dead-letter\" on the operator would go on \
                 without it)",
            ),
            RecordHint::KeyedState => Some(
                "(on_error = \"fail\"; the operator has keyed state, where \"skip\" and \
                 \"dead-letter\" are not allowed: check records in a stateless operator \
                 before it, with on_error = \"skip\" or \"dead-letter\" there)",
            ),
        }
    }
}

fn on_record(record: &Option<Box<FailedRecord>>) -> String {
    let Some(r) = record else {
        return String::new();
    };
    match r.hint.text() {
        Some(h) => format!("; record: `{}` {h}", r.printable),
        None => format!("; record: `{}`", r.printable),
    }
}

/// Result alias of the runtime.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl nop_stream_proto::TaskError for RuntimeError {
    /// Setup errors, a refused restore, commit uncertainty (design §5.7: an unknown
    /// outcome fails loudly) and guest-reported errors other than `io` are final: a
    /// plugin's error is data about a record or a config, and replaying the same input
    /// reports it again, so it must not burn the restart budget. So are the mistakes of a
    /// job's set-up that replay repeats: a record without a key on a HASH edge, a
    /// malformed batch, and a call the host refused (a key outside the subtask's state
    /// shards, e.g. an operator that rekeys its records behind a HASH edge at parallelism
    /// 2). Cancellation, closed channels and fencing follow from another failure;
    /// everything else (other traps, limits, guest `io` errors, a failing state database)
    /// may be recovered from the latest durable epoch.
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
            | RuntimeError::Restore { .. }
            | RuntimeError::MissingKey { .. }
            | RuntimeError::MalformedBatch { .. }
            | RuntimeError::Trap { refused: true, .. } => FailureClass::Fatal,
            RuntimeError::Guest { code, .. } if *code != "io" => FailureClass::Fatal,
            _ => FailureClass::Recoverable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_proto::{FailureClass, TaskError};

    fn guest(code: &'static str, record: Option<String>) -> RuntimeError {
        RuntimeError::Guest {
            site: Site {
                plugin: "flights-mapper@0.1.0".into(),
                operator: "parse".into(),
                subtask: Some(1),
            },
            call: "process",
            code,
            message: "column dep_delay: value \"x\" is not a number".into(),
            record: record.map(|printable| {
                Box::new(FailedRecord {
                    printable,
                    hint: RecordHint::SkipOrDeadLetter,
                })
            }),
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
    fn set_up_mistakes_are_final_and_other_traps_recoverable() {
        // Regression: a record without a key on a HASH edge, and an operator touching a
        // key outside its state shards, were recovered 10 times over ~27 s before failing.
        let site = || Site {
            plugin: "nexmark-q7@0.1.0".into(),
            operator: "max".into(),
            subtask: Some(0),
        };
        let trap = |refused| RuntimeError::Trap {
            site: site(),
            call: "prepare-checkpoint",
            reason: "state access refused: key \"q7\" belongs to state shard 102".into(),
            refused,
        };
        assert_eq!(trap(true).class(), FailureClass::Fatal);
        assert_eq!(trap(false).class(), FailureClass::Recoverable);
        let missing = RuntimeError::MissingKey {
            site: site(),
            edge: "operators/max->operators/q7#0".into(),
            to: "input 0 of `q7`".into(),
        };
        assert_eq!(missing.class(), FailureClass::Fatal);
    }

    #[test]
    fn a_guest_error_names_its_record() {
        let e = guest("invalid-record", Some(printable_record(b"2013,1,x")));
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
        let mut keyed = guest("invalid-record", Some("2013,1,x".into()));
        if let RuntimeError::Guest {
            record: Some(r), ..
        } = &mut keyed
        {
            r.hint = RecordHint::KeyedState;
        }
        assert!(
            keyed.to_string().ends_with(
                "record: `2013,1,x` (on_error = \"fail\"; the operator has keyed state, where \
                 \"skip\" and \"dead-letter\" are not allowed: check records in a stateless \
                 operator before it, with on_error = \"skip\" or \"dead-letter\" there)"
            ),
            "{keyed}"
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
