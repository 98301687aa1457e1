//! Store data of one plugin instance (design §16): what each instance's `Store` holds, and
//! the host side of the `nop:stream` imports, one file per interface: `state` and
//! `operator-state` ([`state`](self::state)), `timers` ([`timers`](self::timers)),
//! `output`, `log` and `metrics` ([`output`](self::output)). Host capabilities that reach
//! external systems keep their own contexts in [`CapabilityContexts`] (design §16.1).

mod output;
mod state;
pub(crate) mod timers;

use nop_stream_capability::{CapabilityContexts, CapabilityStore, CapabilityView};
use nop_stream_state::{KeyedState, StateError};
use std::collections::BTreeMap;
use timers::{TimerEntry, TimerIndex};
use wasmtime::StoreLimits;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};

pub use output::MAX_LOG_LINE;
pub use timers::TIMER_STATE;

/// A host-side refusal that traps the guest: a key outside the subtask's shards, an
/// unknown state handle, a malformed buffer, an undeclared side output. Carried inside
/// the trap so the runtime can name it. A refusal is about the call the guest made, so
/// the same input makes the same call again: the task fails without a recovery
/// ([`crate::RuntimeError::Trap`]'s `refused`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HostTrap(pub String);

/// A host-side failure while serving a guest call (the state database failed, a stored
/// value is corrupt): it traps the guest like a [`HostTrap`], but the call was valid, so
/// recovery from the latest durable epoch may succeed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HostFault(pub String);

fn trap(e: StateError) -> wasmtime::Error {
    match e {
        StateError::KeyOutsideShards { .. } => wasmtime::Error::new(HostTrap(format!(
            "state access refused: {e}; a subtask may use the keyed state of the keys its \
             HASH inputs route to it, not of keys it makes up (run an operator that puts \
             its records under keys of its own at parallelism 1)"
        ))),
        StateError::UnknownHandle(_)
        | StateError::WrongKind { .. }
        | StateError::Malformed { .. } => {
            wasmtime::Error::new(HostTrap(format!("state access refused: {e}")))
        }
        StateError::Corrupt(_) | StateError::Snapshot { .. } | StateError::Database { .. } => {
            wasmtime::Error::new(HostFault(format!("state access failed: {e}")))
        }
    }
}

/// Everything a plugin instance's `Store` holds.
pub struct StoreData {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limits: StoreLimits,
    /// `plugin (operator, subtask)` label for logs.
    pub(crate) label: String,
    /// Keyed state of the operator subtask, if it has any.
    pub(crate) state: Option<KeyedState>,
    /// Registered timers in firing order, each with whether it is written to the
    /// `__timers` state yet. Timers are synced to that state before each snapshot
    /// ([`StoreData::sync_timers`]), so one registered and fired within a checkpoint
    /// interval never touches it.
    pub(crate) timers: TimerIndex,
    /// Timers removed since the last sync that the `__timers` state still holds.
    pub(crate) timers_removed: Vec<TimerEntry>,
    /// Current event-time watermark of the subtask (ms).
    pub(crate) watermark: i64,
    /// Plugin-defined counters.
    pub(crate) counters: BTreeMap<String, u64>,
    /// Plugin-defined gauges.
    pub(crate) gauges: BTreeMap<String, i64>,
    /// Guest stderr capture (panic messages), if enabled.
    pub(crate) stderr: Option<wasmtime_wasi::p2::pipe::MemoryOutputPipe>,
    /// Handle of the internal `__timers` state in `state` (after the declared ones).
    pub(crate) timer_state: Option<u32>,
    /// Side outputs `describe()` declared; emitting to another tag traps.
    pub(crate) side_tags: Vec<String>,
    /// Side-output records emitted during the current call, in order.
    pub(crate) side: Vec<(String, nop_stream_api::Batch)>,
    /// Non-keyed operator state (WIT `operator-state`) of the instance.
    pub(crate) op_state: crate::op_state::OperatorStates,
    /// The instance's context of every registered host capability (design §16.1).
    pub(crate) capabilities: CapabilityContexts,
    /// Wall-clock time spent blocked in host calls that wait on the outside world (a
    /// database, through a capability) during the current guest call; it does not count against
    /// `cpu_ms_per_call` (the epoch-deadline callback grants it back).
    pub(crate) host_wait: std::time::Duration,
}

impl WasiView for StoreData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl CapabilityStore for StoreData {
    fn capability<C: Default + Send + 'static>(&mut self) -> CapabilityView<'_, C> {
        CapabilityView {
            ctx: self.capabilities.get_or_default::<C>(),
            table: &mut self.table,
            host_wait: &mut self.host_wait,
            label: &self.label,
        }
    }
}

impl StoreData {
    /// Refuses the internal timer state's handle on the guest-facing state calls.
    fn user_handle(&self, state: u32) -> wasmtime::Result<()> {
        if self.timer_state == Some(state) {
            return Err(wasmtime::Error::new(HostTrap(format!(
                "state access refused: handle {state} is not a state this plugin opened"
            ))));
        }
        Ok(())
    }

    fn keyed(&mut self) -> wasmtime::Result<&mut KeyedState> {
        match self.state.as_mut() {
            Some(s) => Ok(s),
            None => Err(wasmtime::Error::new(HostTrap(
                "state access refused: this operator declared no keyed state in describe()".into(),
            ))),
        }
    }
}
