//! Guest SDK for nop-stream plugins (WebAssembly components for `wasm32-wasip2`).
//!
//! Implement [`Operator`], [`Source`] or [`Sink`] and export the type with
//! [`export_operator!`], [`export_source!`] or [`export_sink!`]. Records cross the
//! boundary as a [`Batch`] (flat buffers + end offsets, no per-record allocation);
//! operators reach keyed state and timers through a [`Context`], preferably via the typed
//! [`ValueState`], [`ListState`] and [`MapState`]. Unit-test plugin logic natively with
//! [`MockContext`].
//!
//! See design §3 for the contract these types mirror (`wit/` in the repository).

extern crate self as nop_stream_sdk;

mod batch;
pub mod cep;
mod context;
mod error;
mod export;
mod host;
mod info;
mod mock;
pub mod num;
mod plugin;
mod state;
pub mod window;
#[doc(hidden)]
pub mod wit;

pub use batch::{Batch, RecordRef};
pub use context::{Context, KeyPage, StateHandle, ValueBatch};
pub use error::{ErrorCode, PluginError, Result};
pub use host::{HostContext, counter_add, gauge_set, log};

pub use info::{
    FiredTimer, LogLevel, PluginInfo, PluginKind, SinkCapability, SourceCapability,
    StateDescriptor, StateKind, TaskInfo, TimeDomain, TimerGroup,
};
pub use mock::MockContext;
pub use plugin::{CommitOutcome, Operator, Progress, ReadOutcome, Sink, Source, Split};
pub use state::{
    KEYS_PAGE_LIMIT, ListState, ListStateIn, MapState, MapStateIn, POSTCARD, ValueState,
    ValueStateIn,
};

/// Items the export macros expand to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::*;
    pub use wit_bindgen;
}
