//! nop-stream runtime (design §16, §5): the wasmtime plugin host with sandbox limits, the
//! host side of the WIT imports, channels and transports, the task driver and the
//! embedded job runner.

pub mod bindings;
mod compaction;
pub mod connection;
pub mod embedded;
mod error;
mod error_policy;
mod host;
pub mod job;
pub mod launch;
mod limits;
pub mod nats;
pub mod op_state;
pub mod partition;
pub mod pg;
pub mod plugin;
pub mod redis;
pub mod registry;
mod task;
pub mod transport;
mod workers;

pub use error::{MAX_RECORD_IN_ERROR, Result, RuntimeError, Site, printable_record};

/// The WIT package (and version) this host serves to components: `nop:stream@0.2.2`
/// (`wit/`; `wit/CHANGELOG.md` lists the versions). Components built against an older
/// `0.2.x` link too (the linker matches semver-compatible versions); others are refused
/// at load naming both versions.
pub const WIT_PACKAGE: &str = "nop:stream@0.2.2";
pub use host::HostTrap;
pub use job::{JobProgress, JobReport, PluginSet, RunOptions, run_job};
pub use launch::{LiveTasks, LocalTaskEvent, PreparedTasks, TaskHost, TaskScheduling};
pub use limits::{Limits, TICK_MS};
pub use plugin::{DirGrant, Instance, InstanceOptions, LoadedPlugin, PluginHost, Rejected};
pub use task::TaskReport;
pub use workers::InProcessWorkers;
