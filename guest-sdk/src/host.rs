//! Host services reached through the WIT imports: logging, metrics, and [`HostContext`]
//! (the [`Context`] inside a component). Natively, logging goes to stderr, metrics are
//! dropped, and `HostContext` is never constructed (plugin unit tests use
//! [`crate::MockContext`]).

#[cfg(target_arch = "wasm32")]
use crate::wit::operator::nop::stream::{log as wlog, metrics as wmetrics};
use crate::wit::operator::nop::stream::{
    operator_state as wopstate, output as woutput, state as wstate, timers as wtimers,
    types as wtypes,
};
use crate::{Context, KeyPage, LogLevel, PluginError, Result, StateHandle, TimeDomain, ValueBatch};

/// Emits one log line through the host's tracing, tagged with the plugin and subtask.
/// Lines over 4 KiB are truncated by the host. Natively (unit tests) the line goes to
/// stderr.
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    wlog::log(level_to_wit(level), message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

/// Adds `delta` to the plugin counter `name` (reported with the operator and subtask).
/// A no-op natively.
pub fn counter_add(name: &str, delta: u64) {
    #[cfg(target_arch = "wasm32")]
    wmetrics::counter_add(name, delta);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (name, delta);
}

/// Sets the plugin gauge `name` to `value`. A no-op natively.
pub fn gauge_set(name: &str, value: i64) {
    #[cfg(target_arch = "wasm32")]
    wmetrics::gauge_set(name, value);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (name, value);
}

#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn level_to_wit(level: LogLevel) -> wtypes::LogLevel {
    match level {
        LogLevel::Trace => wtypes::LogLevel::Trace,
        LogLevel::Debug => wtypes::LogLevel::Debug,
        LogLevel::Info => wtypes::LogLevel::Info,
        LogLevel::Warn => wtypes::LogLevel::Warn,
        LogLevel::Error => wtypes::LogLevel::Error,
    }
}

fn domain_to_wit(domain: TimeDomain) -> wtimers::TimeDomain {
    match domain {
        TimeDomain::EventTime => wtimers::TimeDomain::EventTime,
        TimeDomain::ProcessingTime => wtimers::TimeDomain::ProcessingTime,
    }
}

/// The [`Context`] of an operator running in a component: every method is one call of
/// the WIT `state` / `timers` imports. Only meaningful on `wasm32`; natively every
/// method would hit `unreachable!()`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostContext;

impl Context for HostContext {
    fn open_state(&mut self, name: &str) -> Result<StateHandle> {
        wstate::open_state(name)
            .map(StateHandle::from_raw)
            .map_err(PluginError::state)
    }

    fn open_operator_state(&mut self, name: &str) -> Result<StateHandle> {
        wopstate::open_operator_state(name)
            .map(StateHandle::from_raw)
            .map_err(PluginError::state)
    }

    fn operator_state_get(&mut self, state: StateHandle, id: &str) -> Option<Vec<u8>> {
        wopstate::get(state.raw(), id)
    }

    fn operator_state_put(&mut self, state: StateHandle, id: &str, value: &[u8]) {
        wopstate::put(state.raw(), id, value);
    }

    fn operator_state_remove(&mut self, state: StateHandle, id: &str) {
        wopstate::remove(state.raw(), id);
    }

    fn operator_state_entries(&mut self, state: StateHandle) -> Vec<(String, Vec<u8>)> {
        wopstate::entries(state.raw())
    }

    fn state_ttl_ms(&mut self, state: StateHandle) -> Option<u64> {
        wstate::state_ttl(state.raw())
    }

    fn value_get_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) -> ValueBatch {
        let v = wstate::value_get_many(state.raw(), namespace, keys, key_ends);
        ValueBatch {
            data: v.data,
            ends: v.ends,
            present: v.present,
        }
    }

    fn value_put_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        values: &[u8],
        value_ends: &[u32],
    ) {
        wstate::value_put_many(state.raw(), namespace, keys, key_ends, values, value_ends);
    }

    fn value_delete(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        wstate::value_delete(state.raw(), namespace, key);
    }

    fn value_delete_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) {
        wstate::value_delete_many(state.raw(), namespace, keys, key_ends);
    }

    fn value_keys(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> KeyPage {
        let p = wstate::value_keys(state.raw(), namespace, after, limit);
        KeyPage {
            keys: p.keys,
            key_ends: p.key_ends,
            more: p.more,
        }
    }

    fn list_append(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], value: &[u8]) {
        wstate::list_append(state.raw(), namespace, key, value);
    }

    fn list_get(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) -> Vec<Vec<u8>> {
        wstate::list_get(state.raw(), namespace, key)
    }

    fn list_clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        wstate::list_clear(state.raw(), namespace, key);
    }

    fn map_put(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
    ) {
        wstate::map_put(state.raw(), namespace, key, user_key, value);
    }

    fn map_get(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
    ) -> Option<Vec<u8>> {
        wstate::map_get(state.raw(), namespace, key, user_key)
    }

    fn map_remove(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], user_key: &[u8]) {
        wstate::map_remove(state.raw(), namespace, key, user_key);
    }

    fn map_entries(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        wstate::map_entries(state.raw(), namespace, key)
    }

    fn clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        wstate::clear(state.raw(), namespace, key);
    }

    fn register_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64) {
        wtimers::register(domain_to_wit(domain), key, namespace, timestamp);
    }

    fn register_timers_for_keys(
        &mut self,
        domain: TimeDomain,
        namespace: &[u8],
        timestamp: i64,
        keys: &[&[u8]],
    ) {
        let mut flat = Vec::with_capacity(keys.iter().map(|k| k.len()).sum());
        let mut ends = Vec::with_capacity(keys.len());
        for k in keys {
            flat.extend_from_slice(k);
            ends.push(flat.len() as u32);
        }
        wtimers::register_keys(domain_to_wit(domain), namespace, timestamp, &flat, &ends);
    }

    fn retime_timers(
        &mut self,
        domain: TimeDomain,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        old: &[Option<i64>],
        new: &[Option<i64>],
    ) {
        wtimers::retime_keys(domain_to_wit(domain), namespace, keys, key_ends, old, new);
    }

    fn delete_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64) {
        wtimers::delete(domain_to_wit(domain), key, namespace, timestamp);
    }

    fn current_watermark(&self) -> i64 {
        wtimers::current_watermark()
    }

    fn current_processing_time(&self) -> i64 {
        wtimers::current_processing_time()
    }

    fn side_output(&mut self, tag: &str, records: &crate::Batch) {
        woutput::side_output(tag, &crate::__private::batch_to_wit(records.clone()));
    }
}
