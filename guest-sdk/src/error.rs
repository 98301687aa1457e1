//! [`PluginError`]: guest-reported errors, the WIT `error` record.
//!
//! Errors are data: the host applies the job's error policy (fail the task, or route the
//! record to a dead-letter output). A panic is different: it is a trap and always fails
//! the task (design §16, "errors vs traps").

use std::fmt;

/// What kind of failure a plugin reports (WIT `error-code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The `config` given to `open` is malformed or names something that does not exist.
    InvalidConfig,
    /// A record could not be decoded or violates the plugin's expectations.
    InvalidRecord,
    /// An I/O operation through a granted capability failed.
    Io,
    /// A state operation was refused by the plugin's own logic.
    State,
    /// A transaction named by the host is unknown or no longer usable.
    Transaction,
    /// Anything else.
    Internal,
}

impl ErrorCode {
    /// The WIT name of the code, e.g. `invalid-config`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidConfig => "invalid-config",
            ErrorCode::InvalidRecord => "invalid-record",
            ErrorCode::Io => "io",
            ErrorCode::State => "state",
            ErrorCode::Transaction => "transaction",
            ErrorCode::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plugin-reported error (WIT `error`): a category and a message that should name the
/// offending field or value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    /// Failure category.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
}

impl PluginError {
    /// An error with the given code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        PluginError {
            code,
            message: message.into(),
        }
    }

    /// [`ErrorCode::InvalidConfig`]: the `config` given to `open` is unusable.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidConfig, message)
    }

    /// [`ErrorCode::InvalidRecord`]: a record could not be decoded or is unacceptable.
    pub fn invalid_record(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRecord, message)
    }

    /// [`ErrorCode::Io`]: an I/O operation through a granted capability failed.
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Io, message)
    }

    /// [`ErrorCode::State`]: a state operation was refused by the plugin's own logic.
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::State, message)
    }

    /// [`ErrorCode::Transaction`]: a transaction is unknown or no longer usable.
    pub fn transaction(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Transaction, message)
    }

    /// [`ErrorCode::Internal`]: anything else.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for PluginError {}

impl From<std::io::Error> for PluginError {
    /// Maps to [`ErrorCode::Io`], keeping the error's text (and kind).
    fn from(e: std::io::Error) -> Self {
        PluginError::io(format!("{e} ({:?})", e.kind()))
    }
}

/// Result type of plugin callbacks; the error defaults to [`PluginError`].
pub type Result<T, E = PluginError> = core::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_set_codes_and_display() {
        let cases = [
            (PluginError::invalid_config("x"), ErrorCode::InvalidConfig),
            (PluginError::invalid_record("x"), ErrorCode::InvalidRecord),
            (PluginError::io("x"), ErrorCode::Io),
            (PluginError::state("x"), ErrorCode::State),
            (PluginError::transaction("x"), ErrorCode::Transaction),
            (PluginError::internal("x"), ErrorCode::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(e.code, code);
            assert_eq!(e.message, "x");
        }
        assert_eq!(
            PluginError::invalid_config("missing field `path`").to_string(),
            "invalid-config: missing field `path`"
        );
    }

    #[test]
    fn io_errors_convert() {
        fn fails() -> Result<()> {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file",
            ))?;
            Ok(())
        }
        let e = fails().unwrap_err();
        assert_eq!(e.code, ErrorCode::Io);
        assert!(e.message.contains("no such file"), "{e}");
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(boxed.to_string().starts_with("io: "));
    }
}
