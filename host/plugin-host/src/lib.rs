//! The nop-stream plugin host (design §16): the wasmtime engine and linker with sandbox
//! limits, loading and checking components, one `Store` per instance, and the host side
//! of the `nop:stream` imports (keyed and operator state, timers, output, log, metrics).
//!
//! Host capabilities that reach external systems (design §16.1) are separate crates,
//! registered when the host is made ([`PluginHost::new`]); this crate never names them.
//! The generated bindings are private: the API speaks host types.

mod bindings;
mod error;
mod instance;
mod limits;
pub mod op_state;
mod options;
mod plugin;
pub mod registry;
mod store;

pub use error::{
    FailedRecord, MAX_RECORD_IN_ERROR, RecordHint, Result, RuntimeError, Site, printable_record,
};
pub use instance::{
    CommitOutcome, DueTimers, Instance, OperatorInstance, Progress, ReadResult, Rejected,
    SinkInstance, SourceInstance,
};
pub use limits::{Limits, TICK_MS};
pub use options::{DirGrant, InstanceOptions};
pub use plugin::{HostCapability, LoadedPlugin, PROFILE_ENV, PluginHost, timer_descriptor};
pub use registry::{PluginRegistry, PluginSet};
pub use store::{HostFault, HostTrap, MAX_LOG_LINE, StoreData, TIMER_STATE};

/// The WIT package (and version) this host serves to components: `nop:stream@0.2.2`
/// (`wit/`; `wit/CHANGELOG.md` lists the versions). Components built against an older
/// `0.2.x` link too (the linker matches semver-compatible versions); others are refused
/// at load naming both versions.
pub const WIT_PACKAGE: &str = "nop:stream@0.2.2";
