//! The coordinator role of nop-stream, written once (design §2.5, "One coordinator, two ways
//! to reach tasks"): the recovery loop, attempt and generation allocation, restore
//! planning, split assignment, the epoch loop, manifest assembly, the epoch log and
//! retention.
//!
//! It reaches tasks only through the [`Workers`] seam: deploy an attempt's assignments,
//! send commands, receive events, fence a generation, join. The embedded mode implements
//! the seam with threads and in-process queues (`nop-stream-embedded`), the cluster mode
//! with QUIC streams to node processes. This crate links neither wasmtime nor a
//! transport; the decisions that can be pure are pure ([`restore`], and the epoch state
//! machine of `nop-stream-checkpoint`).

pub mod compat;
pub mod election;
mod error;
pub mod from_savepoint;
pub mod jobs;
pub mod manager;
pub mod migrate;
mod report;
pub mod restore;
mod run;
pub mod watermark_relay;
mod workers;

pub use error::CoordinatorError;
pub use report::{CommittedTransaction, JobReport, MAX_REPORTED_COMMITS};
pub use restore::{
    check_restore, check_restore_compatible, checkpoint_location, checkpoint_namespace,
};
pub use run::{
    CoordinatorOptions, DEFAULT_MAX_RESTARTS, RestartBudget, SavepointRequest, open_namespace,
    restart_backoff, run_job,
};
pub use workers::{Next, Workers};
