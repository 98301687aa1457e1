//! Generated host bindings of the `nop:stream@0.2.2` worlds, private to the plugin host:
//! its public API speaks host types. One module per world; the source and sink worlds
//! reuse the operator world's shared interfaces so one linker and one set of host
//! implementations serve all three. Host capabilities (design §16.1) generate their own
//! interfaces in their own crates.

#![allow(missing_docs, clippy::all)]

pub(crate) mod op {
    wasmtime::component::bindgen!({
        world: "operator",
        path: "../../wit",
        imports: { default: trappable },
    });
}

pub(crate) mod src {
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

pub(crate) mod sink {
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

/// The `state-migrator` world: the optional `state-migration` export of an operator
/// component (design §10.6), looked up on the operator's pre-instantiated component.
pub(crate) mod mig {
    wasmtime::component::bindgen!({
        world: "state-migrator",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
        },
    });
}

/// The `state-declarer` world: the optional `state-declarations` export of an operator
/// component (`0.2.1`), looked up on the operator's pre-instantiated component when it is
/// loaded.
pub(crate) mod decl {
    wasmtime::component::bindgen!({
        world: "state-declarer",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/operator-state": crate::bindings::op::nop::stream::operator_state,
        },
    });
}

pub(crate) use op::nop::stream::operator_state::Redistribution as WitRedistribution;
pub(crate) use op::nop::stream::state::{KeyPage, ValueBatch};
pub(crate) use op::nop::stream::timers::{TimeDomain, TimerGroup};
pub(crate) use op::nop::stream::types::{
    Batch as WitBatch, Error as GuestError, ErrorCode, LogLevel, PluginInfo as WitPluginInfo,
    PluginKind as WitPluginKind, SinkCapability as WitSinkCapability,
    SourceCapability as WitSourceCapability, StateKind as WitStateKind, TaskInfo as WitTaskInfo,
};
pub(crate) use sink::exports::nop::stream::sink_plugin::CommitOutcome;
pub(crate) use src::exports::nop::stream::source_plugin::Split as WitSplit;

use nop_stream_api::{Batch, Split, TaskInfo};

/// Moves a host batch into the generated WIT record (no copy).
pub(crate) fn wit_batch(b: Batch) -> WitBatch {
    WitBatch {
        data: b.data,
        ends: b.ends,
        keys: b.keys,
        key_ends: b.key_ends,
        timestamps: b.timestamps,
    }
}

/// Moves a generated WIT batch into the host type (no copy).
pub(crate) fn host_batch(b: WitBatch) -> Batch {
    Batch {
        data: b.data,
        ends: b.ends,
        keys: b.keys,
        key_ends: b.key_ends,
        timestamps: b.timestamps,
    }
}

/// The WIT record of a task info.
pub(crate) fn wit_task_info(t: &TaskInfo) -> WitTaskInfo {
    WitTaskInfo {
        job_id: t.job_id.clone(),
        pipeline_id: t.pipeline_id.clone(),
        operator_id: t.operator_id.clone(),
        operator_name: t.operator_name.clone(),
        subtask_index: t.subtask_index,
        parallelism: t.parallelism,
        attempt: t.attempt,
    }
}

/// The WIT record of a split.
pub(crate) fn wit_split(s: &Split) -> WitSplit {
    WitSplit {
        id: s.id.clone(),
        descriptor: s.descriptor.clone(),
    }
}
