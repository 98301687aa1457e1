#![doc = include_str!("../README.md")]

extern crate self as nop_stream_sdk;

mod batch;
pub mod cep;
mod context;
mod error;
mod export;
pub mod hash;
mod host;
mod info;
pub mod join;
mod mock;
pub mod num;
mod plugin;
#[cfg(feature = "postgres")]
pub mod postgres;
mod state;
pub mod throttle;
pub mod window;
#[doc(hidden)]
pub mod wit;

/// The WIT package this SDK binds to and every component built with it imports and
/// exports: `nop:stream@0.2.2` (the files in the crate's `wit/`, a copy of the
/// repository's `wit/`; `wit/CHANGELOG.md` says what each version changed). Hosts that
/// serve `nop:stream@0.2.x` load it.
pub const WIT_PACKAGE: &str = "nop:stream@0.2.2";

pub use batch::{Batch, RecordRef, extend_key};
pub use context::{Context, KeyPage, StateHandle, ValueBatch};
pub use error::{ErrorCode, PluginError, Result};
pub use host::{HostContext, counter_add, gauge_set, log};

pub use info::{
    FiredTimer, LogLevel, OperatorStateDescriptor, PluginInfo, PluginKind, Redistribution,
    SinkCapability, SourceCapability, StateDescriptor, StateKind, TaskInfo, TimeDomain, TimerGroup,
};
pub use mock::MockContext;
pub use plugin::{
    CommitOutcome, Operator, Progress, ReadOutcome, Sink, Source, Split, StateEntry, StateMigration,
};
pub use state::{
    KEYS_PAGE_LIMIT, ListState, ListStateIn, MapState, MapStateIn, OperatorState, POSTCARD,
    STATE_WRITE_CHUNK, ValueState, ValueStateIn, decode_value, encode_value, schema_of,
};

/// A deterministic pseudo-random sequence for tests: an LCG (Knuth's MMIX constants)
/// from `seed`, yielding the upper 31 bits of each state.
#[cfg(test)]
pub(crate) fn test_lcg(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    }
}

/// Items the export macros expand to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::*;
    pub use wit_bindgen;
}
