//! The nop-stream task driver (design §5, §19): the tasks of one deployment on this
//! process. One thread per subtask runs its operator chain over plugin instances; channels
//! and transports carry records, watermarks and barriers between subtasks; each task takes
//! part in the epoch protocol (barrier injection and alignment, snapshots written in the
//! background, incremental snapshots and their compaction, sink pre-commit and commit).
//!
//! The embedded runner (`nop-stream-embedded`) runs every task of a job here; a cluster
//! node (`nop-stream-server`) runs its share. [`capabilities`] is the one list of host
//! capabilities a plugin host of this build serves (design §16.1).

mod compaction;
mod error_policy;
mod launch;
pub mod options;
pub mod partition;
mod progress;
mod scheduling;
mod segment;
mod snapshot_policy;
mod task;
pub mod transport;

pub use launch::{AlignmentTables, LiveTasks, LocalTaskEvent, PreparedTasks, TaskHost};
pub use options::{RunOptions, claim_output_dir, resolve_grant_path};
pub use progress::JobProgress;
pub use scheduling::TaskScheduling;
pub use task::{MAX_DELTAS, TaskReport};

use nop_stream_plugin_host::{HostCapability, PluginHost};
use std::path::PathBuf;
use std::sync::Arc;

/// The host capabilities every plugin host of this build serves, with their default
/// limits. Adding a connector's capability is one line here.
pub fn capabilities() -> Vec<HostCapability> {
    vec![
        Arc::new(nop_stream_postgres_client::Postgres::default()),
        Arc::new(nop_stream_redis_streams::RedisStreams::default()),
        Arc::new(nop_stream_nats_jetstream::NatsJetStream::default()),
    ]
}

/// A plugin host serving [`capabilities`], caching compiled components in `cache_dir`
/// (`None`: no disk cache).
///
/// # Errors
/// As [`PluginHost::new`].
pub fn plugin_host(cache_dir: Option<PathBuf>) -> nop_stream_plugin_host::Result<PluginHost> {
    PluginHost::new(cache_dir, capabilities())
}
