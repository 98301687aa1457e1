//! The errors of keyed state.

use super::*;

/// Errors of the state backend.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A key hashed to a shard this subtask does not own (a routing bug or a plugin
    /// touching another key's state).
    #[error(
        "key {key} belongs to state shard {shard}, outside the shards {owned:?} this subtask owns"
    )]
    KeyOutsideShards {
        /// Printable prefix of the key.
        key: String,
        /// The key's shard.
        shard: StateShardId,
        /// Shards owned by the subtask.
        owned: Range<u32>,
    },
    /// A state handle that `open` never returned.
    #[error("unknown state handle {0}")]
    UnknownHandle(u32),
    /// A state used with an operation of another kind (e.g. `list-append` on a value state).
    #[error("state `{name}` is a {actual:?} state, used as a {expected:?} state")]
    WrongKind {
        /// State name.
        name: String,
        /// Declared kind.
        actual: StateKind,
        /// Kind the operation needs.
        expected: StateKind,
    },
    /// Malformed flat buffers (ends out of range or decreasing).
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// Which buffer.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A stored collection could not be decoded.
    #[error("corrupt stored value in state `{0}`")]
    Corrupt(String),
    /// The consumer of a streamed snapshot ([`KeyedState::snapshot_each`]) failed.
    #[error("snapshot of state `{state}`: {message}")]
    Snapshot {
        /// State whose shard was being handed over.
        state: String,
        /// The consumer's message.
        message: String,
    },
    /// The database failed.
    #[error("state database {path}: {message}")]
    Database {
        /// Database file.
        path: PathBuf,
        /// redb's message.
        message: String,
    },
}
