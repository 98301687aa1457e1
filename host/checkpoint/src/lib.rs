//! Epoch checkpoints (design §5–§7, §14).
//!
//! - [`coordinator`]: the epoch protocol as a pure state machine — events in, commands
//!   out, time passed in — so the same decisions serve the embedded runner and a cluster.
//! - [`manifest`]: task snapshots, segment descriptors and the epoch manifest, the only
//!   entry point of recovery (design §5.6).
//! - [`storage`]: the checkpoint storage SPI (read-after-write plus atomic publish) and
//!   its local-file backend, the epoch log and retention (design §14).
//!
//! This crate never depends on a transport (design §11.2).

pub mod alignment;
pub mod coordinator;
pub mod failpoint;
pub mod manifest;
pub mod meta;
pub mod names;
pub mod payload;
pub mod savepoint;
pub mod storage;

pub use coordinator::{Command, EpochCoordinator, EpochState, Event};
pub use manifest::*;
pub use meta::{InputMeta, META_FORMAT, OperatorMeta, SnapshotMeta};
pub use savepoint::{SAVEPOINT_FORMAT, SavepointInfo};
pub use storage::{
    CheckpointStorage, EpochLogRecord, LOG_COMPACT_BYTES, LocalStorage, SegmentWriter, StorageError,
};
