//! Generated host bindings of the `nop:stream@0.1.0` worlds. One module per world; the
//! source and sink worlds reuse the operator world's shared interfaces so one linker and
//! one set of host implementations serve all three.

#![allow(missing_docs, clippy::all)]

pub mod op {
    wasmtime::component::bindgen!({
        world: "operator",
        path: "../../wit",
        imports: { default: trappable },
    });
}

pub mod src {
    wasmtime::component::bindgen!({
        world: "source",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/log": crate::bindings::op::nop::stream::log,
            "nop:stream/metrics": crate::bindings::op::nop::stream::metrics,
        },
    });
}

pub mod sink {
    wasmtime::component::bindgen!({
        world: "sink",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/log": crate::bindings::op::nop::stream::log,
            "nop:stream/metrics": crate::bindings::op::nop::stream::metrics,
        },
    });
}

pub use op::nop::stream::state::{KeyPage, ValueBatch};
pub use op::nop::stream::timers::{TimeDomain, TimerGroup};
pub use op::nop::stream::types::{
    Batch, Error as GuestError, ErrorCode, LogLevel, PluginInfo as WitPluginInfo,
    PluginKind as WitPluginKind, SinkCapability as WitSinkCapability,
    SourceCapability as WitSourceCapability, StateKind as WitStateKind, TaskInfo,
};
pub use sink::exports::nop::stream::sink_plugin::CommitOutcome;
pub use src::exports::nop::stream::source_plugin::{Progress, ReadResult, Split};
