//! Epoch checkpoints (design §5–§7, §14).
//!
//! - [`coordinator`]: the epoch protocol as a pure state machine — events in, commands
//!   out, time passed in — so the same decisions serve the embedded runner and a cluster.
//! - [`manifest`]: task snapshots, segment descriptors and the epoch manifest, the only
//!   entry point of recovery (design §5.6).
//! - [`namespace`]: a checkpoint namespace over an object store of any backend
//!   (`nop-stream-storage`): epoch records, manifests, segments, the epoch log, attempt
//!   claims and retention (design §6, "Storage by location").
//! - [`savepoint`]: savepoints as prefixes of objects.
//!
//! This crate never depends on a transport (design §11.2).

pub mod alignment;
pub mod coordinator;
pub mod failpoint;
pub mod manifest;
pub mod meta;
pub mod names;
pub mod namespace;
pub mod payload;
pub mod savepoint;

pub use coordinator::{Command, EpochCoordinator, EpochState, Event};
pub use manifest::*;
pub use meta::{InputMeta, META_FORMAT, OperatorMeta, SnapshotMeta};
pub use namespace::{EpochLogRecord, EpochRecord, Namespace, StorageError};
pub use nop_stream_storage::{Location, LocationError, ObjectStore, ObjectWriter, Scoped};
pub use savepoint::{SAVEPOINT_FORMAT, SavepointInfo};
