//! Generated host bindings of the `nop:stream@0.2.2` worlds. One module per world; the
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

/// The `postgres-sink` world: only its `nop:postgres/client` import is linked from here
/// (the shared interfaces come from the operator world, the exports from `sink`).
pub mod pg {
    wasmtime::component::bindgen!({
        world: "postgres-sink",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/log": crate::bindings::op::nop::stream::log,
            "nop:stream/metrics": crate::bindings::op::nop::stream::metrics,
            "nop:postgres/client.session": crate::pg::Session,
        },
    });
}

/// The `state-migrator` world: the optional `state-migration` export of an operator
/// component (issue 11), looked up on the operator's pre-instantiated component.
pub mod mig {
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
pub mod decl {
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

/// The `redis-source` and `redis-sink` worlds share their only extra import,
/// `nop:redis/streams`; it is linked from here (the rest as for `pg`).
pub mod redis {
    wasmtime::component::bindgen!({
        world: "redis-sink",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/log": crate::bindings::op::nop::stream::log,
            "nop:stream/metrics": crate::bindings::op::nop::stream::metrics,
        },
    });
}

/// The `nats-source` world: only its `nop:nats/jetstream` import is linked from here (the
/// shared interfaces come from the operator world, the exports from `source`).
pub mod nats {
    wasmtime::component::bindgen!({
        world: "nats-source",
        path: "../../wit",
        imports: { default: trappable },
        with: {
            "nop:stream/types": crate::bindings::op::nop::stream::types,
            "nop:stream/log": crate::bindings::op::nop::stream::log,
            "nop:stream/metrics": crate::bindings::op::nop::stream::metrics,
        },
    });
}

pub use op::nop::stream::operator_state::Redistribution as WitRedistribution;
pub use op::nop::stream::state::{KeyPage, ValueBatch};
pub use op::nop::stream::timers::{TimeDomain, TimerGroup};
pub use op::nop::stream::types::{
    Batch as WitBatch, Error as GuestError, ErrorCode, LogLevel, PluginInfo as WitPluginInfo,
    PluginKind as WitPluginKind, SinkCapability as WitSinkCapability,
    SourceCapability as WitSourceCapability, StateKind as WitStateKind, TaskInfo as WitTaskInfo,
};
pub use sink::exports::nop::stream::sink_plugin::CommitOutcome;
pub use src::exports::nop::stream::source_plugin::{
    Progress, ReadResult as WitReadResult, Split as WitSplit,
};

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

/// What one `read` returned, in host types.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Records read, in split order.
    pub records: Batch,
    /// Exclusive cursor: the position of the first record not yet returned (design §6.4).
    pub next_cursor: Vec<u8>,
    /// The split holds no record after `next_cursor`.
    pub finished: bool,
    /// Progress within the split.
    pub progress: Progress,
}
