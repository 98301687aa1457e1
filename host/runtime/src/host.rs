//! Store data of one plugin instance and the host side of the WIT imports: `state`
//! (backed by [`KeyedState`]), `timers`, `log`, `metrics` (design §16; one capability, one
//! `impl`).

use crate::bindings::op::nop::stream::{
    log, metrics, operator_state, output, state, timers, types,
};
use crate::bindings::{KeyPage, LogLevel, TimeDomain, ValueBatch, WitBatch};
use nop_stream_state::{KeyedState, StateError};
use std::collections::{BTreeMap, HashMap};
use wasmtime::StoreLimits;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};

/// A host-side refusal that traps the guest: a key outside the subtask's shards, an
/// unknown state handle, a malformed buffer. Carried inside the trap so the runtime can
/// name it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HostTrap(pub String);

fn trap(e: StateError) -> wasmtime::Error {
    wasmtime::Error::new(HostTrap(format!("state access refused: {e}")))
}

/// Longest log line kept, in bytes; longer ones are truncated.
pub const MAX_LOG_LINE: usize = 4096;

/// One registered timer: (domain, timestamp, key, namespace).
pub type TimerEntry = (u8, i64, Vec<u8>, Vec<u8>);

type FastHash = foldhash::fast::RandomState;

/// The keys of one (domain, timestamp, namespace), each with whether it is written to
/// the `__timers` state yet.
type KeySet = HashMap<Box<[u8]>, bool, FastHash>;

/// The timers of one (domain, timestamp): per namespace, its keys.
type TimerBucket = HashMap<Box<[u8]>, KeySet, FastHash>;

/// The in-memory index of registered timers: per (domain, timestamp), per namespace, the
/// set of keys, each with whether it is written to the `__timers` state yet.
/// Registration is an integer-keyed B-tree step plus two hash lookups and allocates only
/// for a new timer (a repeated registration is a lookup). Due timers come out grouped
/// per (timestamp, namespace), namespaces and keys in ascending byte order, so firing
/// order is deterministic.
#[derive(Default)]
pub(crate) struct TimerIndex {
    buckets: BTreeMap<(u8, i64), TimerBucket>,
    len: usize,
}

/// The due timers of one (domain, timestamp, namespace), from [`TimerIndex::pop_due`]:
/// keys ascending, each with its persisted flag.
pub(crate) struct DueGroup {
    pub(crate) domain: u8,
    pub(crate) timestamp: i64,
    pub(crate) namespace: Box<[u8]>,
    pub(crate) keys: Vec<(Box<[u8]>, bool)>,
}

impl TimerIndex {
    /// The key set of (domain, timestamp, namespace), created if absent.
    fn key_set(&mut self, domain: u8, timestamp: i64, namespace: &[u8]) -> &mut KeySet {
        let bucket = self.buckets.entry((domain, timestamp)).or_default();
        if !bucket.contains_key(namespace) {
            bucket.insert(namespace.into(), KeySet::default());
        }
        bucket.get_mut(namespace).expect("just inserted")
    }

    /// Adds a timer (`persisted`: already in the `__timers` state); a duplicate keeps
    /// the existing entry.
    pub(crate) fn insert(
        &mut self,
        domain: u8,
        timestamp: i64,
        key: &[u8],
        namespace: &[u8],
        persisted: bool,
    ) {
        let set = self.key_set(domain, timestamp, namespace);
        if !set.contains_key(key) {
            set.insert(key.into(), persisted);
            self.len += 1;
        }
    }

    /// Adds the (not yet persisted) timers of `keys` for one (domain, timestamp,
    /// namespace); duplicates keep the existing entries.
    pub(crate) fn insert_keys<'k>(
        &mut self,
        domain: u8,
        timestamp: i64,
        namespace: &[u8],
        keys: impl Iterator<Item = &'k [u8]>,
    ) {
        let set = self.key_set(domain, timestamp, namespace);
        let mut added = 0;
        for key in keys {
            if !set.contains_key(key) {
                set.insert(key.into(), false);
                added += 1;
            }
        }
        self.len += added;
    }

    /// Removes a timer; `Some(persisted)` if it was registered.
    pub(crate) fn remove(
        &mut self,
        domain: u8,
        timestamp: i64,
        key: &[u8],
        namespace: &[u8],
    ) -> Option<bool> {
        let bucket = self.buckets.get_mut(&(domain, timestamp))?;
        let set = bucket.get_mut(namespace)?;
        let persisted = set.remove(key)?;
        if set.is_empty() {
            bucket.remove(namespace);
            if bucket.is_empty() {
                self.buckets.remove(&(domain, timestamp));
            }
        }
        self.len -= 1;
        Some(persisted)
    }

    /// Removes and returns the timers of `domain` with `timestamp <= up_to`, grouped per
    /// (timestamp, namespace): groups in timestamp then namespace order, keys ascending.
    pub(crate) fn pop_due(&mut self, domain: u8, up_to: i64) -> Vec<DueGroup> {
        let mut due = Vec::new();
        while let Some((&(d, ts), _)) = self.buckets.range((domain, i64::MIN)..).next() {
            if d != domain || ts > up_to {
                break;
            }
            let bucket = self.buckets.remove(&(d, ts)).expect("just seen");
            let mut groups: Vec<(Box<[u8]>, KeySet)> = bucket.into_iter().collect();
            groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (namespace, set) in groups {
                let mut keys: Vec<(Box<[u8]>, bool)> = set.into_iter().collect();
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                self.len -= keys.len();
                due.push(DueGroup {
                    domain: d,
                    timestamp: ts,
                    namespace,
                    keys,
                });
            }
        }
        due
    }

    /// Whether any timer of `domain` is registered.
    pub(crate) fn has_domain(&self, domain: u8) -> bool {
        self.buckets
            .range((domain, i64::MIN)..)
            .next()
            .is_some_and(|((d, _), _)| *d == domain)
    }

    /// Number of registered timers.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every (domain, timestamp, namespace) with its keys, in (domain, timestamp) order.
    pub(crate) fn groups_mut(
        &mut self,
    ) -> impl Iterator<Item = ((u8, i64), &[u8], &mut KeySet)> + '_ {
        self.buckets
            .iter_mut()
            .flat_map(|(dt, b)| b.iter_mut().map(move |(ns, set)| (*dt, ns.as_ref(), set)))
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
    /// The `nop:postgres/client` capability: granted connections, GID scope, limits.
    pub(crate) pg: crate::pg::PgState,
    /// The `nop:redis/streams` capability: granted connections, open connections, limits.
    pub(crate) redis: crate::redis::RedisState,
    /// The `nop:nats/jetstream` capability: granted connections, clients, consumers.
    pub(crate) nats: crate::nats::NatsState,
    /// Wall-clock time spent blocked in host calls that wait on the outside world (a
    /// database) during the current guest call; it does not count against
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

/// Name of the internal state holding timers (design §8.4: timer state is keyed state,
/// routed by StateShard and snapshotted with the epoch). Plugins may not declare or open
/// names starting with `__`.
pub const TIMER_STATE: &str = "__timers";

/// Timers live in the `__timers` state under namespace `domain | timestamp | namespace`
/// (timestamp big-endian with the sign bit flipped, so the byte order is time order) and
/// the timer's key, with an empty value.
pub(crate) fn timer_namespace(domain: u8, timestamp: i64, namespace: &[u8]) -> Vec<u8> {
    let mut ns = Vec::with_capacity(9 + namespace.len());
    ns.push(domain);
    ns.extend_from_slice(&((timestamp as u64) ^ (1 << 63)).to_be_bytes());
    ns.extend_from_slice(namespace);
    ns
}

/// Inverse of [`timer_namespace`] plus the key: the timer entry, if well formed.
pub(crate) fn timer_entry(ns: &[u8], key: Vec<u8>) -> Option<TimerEntry> {
    let domain = *ns.first()?;
    let ts = u64::from_be_bytes(ns.get(1..9)?.try_into().ok()?) ^ (1 << 63);
    Some((domain, ts as i64, key, ns[9..].to_vec()))
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

    /// Writes the timers registered since the last sync to the `__timers` state and
    /// removes the ones fired or deleted since (call before a snapshot).
    ///
    /// # Errors
    /// A refused state access (never expected: keys were checked on registration).
    pub(crate) fn sync_timers(&mut self) -> Result<(), StateError> {
        let (Some(h), Some(ks)) = (self.timer_state, self.state.as_mut()) else {
            return Ok(());
        };
        for t in self.timers_removed.drain(..) {
            ks.value_delete(h, &timer_namespace(t.0, t.1, &t.3), &t.2)?;
        }
        // One batched put per (domain, timestamp, namespace) of the keys not yet written.
        let mut keys: Vec<u8> = Vec::new();
        let mut key_ends: Vec<u32> = Vec::new();
        let mut value_ends: Vec<u32> = Vec::new();
        for ((d, ts), namespace, set) in self.timers.groups_mut() {
            keys.clear();
            key_ends.clear();
            for (key, persisted) in set.iter_mut().filter(|(_, p)| !**p) {
                keys.extend_from_slice(key);
                key_ends.push(keys.len() as u32);
                *persisted = true;
            }
            if key_ends.is_empty() {
                continue;
            }
            value_ends.clear();
            value_ends.resize(key_ends.len(), 0);
            let ns = timer_namespace(d, ts, namespace);
            ks.value_put_many(h, &ns, &keys, &key_ends, &[], &value_ends)?;
        }
        Ok(())
    }

    /// Removes a timer from the index, remembering to delete it from the `__timers`
    /// state at the next sync if it was written there.
    pub(crate) fn remove_timer(&mut self, t: &TimerEntry) -> bool {
        match self.timers.remove(t.0, t.1, &t.2, &t.3) {
            Some(true) => {
                self.timers_removed.push(t.clone());
                true
            }
            Some(false) => true,
            None => false,
        }
    }

    /// Checks a flat key list of a timer call (offsets in bounds and ascending, every key
    /// in this subtask's shards); traps naming `what` otherwise.
    fn check_timer_keys(
        &mut self,
        what: &str,
        keys: &[u8],
        key_ends: &[u32],
    ) -> wasmtime::Result<()> {
        let mut start = 0usize;
        for &end in key_ends {
            let end = end as usize;
            if end < start || end > keys.len() {
                return Err(wasmtime::Error::new(HostTrap(format!(
                    "{what} refused: key end offset {end} after {start}, buffer length {}",
                    keys.len()
                ))));
            }
            self.keyed()?.check_key(&keys[start..end]).map_err(trap)?;
            start = end;
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

impl types::Host for StoreData {}

impl state::Host for StoreData {
    fn open_state(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        if name.starts_with("__") {
            return Ok(Err(format!(
                "state `{name}`: names starting with `__` are reserved for the host"
            )));
        }
        Ok(match self.state.as_ref().and_then(|s| s.handle(&name)) {
            Some(h) => Ok(h),
            None => Err(format!(
                "state `{name}` is not declared in the plugin's describe()"
            )),
        })
    }

    fn value_get_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
    ) -> wasmtime::Result<ValueBatch> {
        self.user_handle(state)?;
        let mut out = ValueBatch {
            data: Vec::new(),
            ends: Vec::with_capacity(key_ends.len()),
            present: Vec::with_capacity(key_ends.len()),
        };
        self.keyed()?
            .value_get_many(
                state,
                &namespace,
                &keys,
                &key_ends,
                &mut out.data,
                &mut out.ends,
                &mut out.present,
            )
            .map_err(trap)?;
        Ok(out)
    }

    fn value_put_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
        values: Vec<u8>,
        value_ends: Vec<u32>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_put_many(state, &namespace, &keys, &key_ends, &values, &value_ends)
            .map_err(trap)
    }

    fn value_delete(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_delete(state, &namespace, &key)
            .map_err(trap)
    }

    fn value_delete_many(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .value_delete_many(state, &namespace, &keys, &key_ends)
            .map_err(trap)
    }

    fn value_keys(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: u32,
    ) -> wasmtime::Result<KeyPage> {
        self.user_handle(state)?;
        let (keys, key_ends, more) = self
            .keyed()?
            .value_keys(state, &namespace, after.as_deref(), limit)
            .map_err(trap)?;
        Ok(KeyPage {
            keys,
            key_ends,
            more,
        })
    }

    fn list_append(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .list_append(state, &namespace, &key, &value)
            .map_err(trap)
    }

    fn list_get(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Vec<Vec<u8>>> {
        self.user_handle(state)?;
        self.keyed()?
            .list_get(state, &namespace, &key)
            .map_err(trap)
    }

    fn list_clear(&mut self, state: u32, namespace: Vec<u8>, key: Vec<u8>) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .list_clear(state, &namespace, &key)
            .map_err(trap)
    }

    fn map_put(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
        value: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .map_put(state, &namespace, &key, &user_key, &value)
            .map_err(trap)
    }

    fn map_get(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        self.user_handle(state)?;
        self.keyed()?
            .map_get(state, &namespace, &key, &user_key)
            .map_err(trap)
    }

    fn map_remove(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?
            .map_remove(state, &namespace, &key, &user_key)
            .map_err(trap)
    }

    fn map_entries(
        &mut self,
        state: u32,
        namespace: Vec<u8>,
        key: Vec<u8>,
    ) -> wasmtime::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.user_handle(state)?;
        self.keyed()?
            .map_entries(state, &namespace, &key)
            .map_err(trap)
    }

    fn clear(&mut self, state: u32, namespace: Vec<u8>, key: Vec<u8>) -> wasmtime::Result<()> {
        self.user_handle(state)?;
        self.keyed()?.clear(state, &namespace, &key).map_err(trap)
    }
}

impl operator_state::Host for StoreData {
    fn open_operator_state(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.op_state.handle(&name).ok_or_else(|| {
            format!("operator state `{name}` is not declared in the plugin's state declarations")
        }))
    }

    fn get(&mut self, state: u32, id: String) -> wasmtime::Result<Option<Vec<u8>>> {
        self.op_state
            .get(state, &id)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn put(&mut self, state: u32, id: String, value: Vec<u8>) -> wasmtime::Result<()> {
        self.op_state
            .put(state, id, value)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn remove(&mut self, state: u32, id: String) -> wasmtime::Result<()> {
        self.op_state
            .remove(state, &id)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }

    fn entries(&mut self, state: u32) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        self.op_state
            .entries(state)
            .map_err(|e| wasmtime::Error::new(HostTrap(e)))
    }
}

fn domain_code(d: TimeDomain) -> u8 {
    match d {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

impl timers::Host for StoreData {
    fn register(
        &mut self,
        domain: TimeDomain,
        key: Vec<u8>,
        namespace: Vec<u8>,
        timestamp: i64,
    ) -> wasmtime::Result<()> {
        // Timers are keyed like state: refuse keys outside the subtask's shards.
        self.keyed()?.check_key(&key).map_err(trap)?;
        self.timers
            .insert(domain_code(domain), timestamp, &key, &namespace, false);
        Ok(())
    }

    fn register_keys(
        &mut self,
        domain: TimeDomain,
        namespace: Vec<u8>,
        timestamp: i64,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
    ) -> wasmtime::Result<()> {
        // Check every offset and key first: a refusal registers nothing.
        self.check_timer_keys("timer registration", &keys, &key_ends)?;
        let mut start = 0usize;
        let slices = key_ends.iter().map(|&end| {
            let key = &keys[start..end as usize];
            start = end as usize;
            key
        });
        self.timers
            .insert_keys(domain_code(domain), timestamp, &namespace, slices);
        Ok(())
    }

    fn retime_keys(
        &mut self,
        domain: TimeDomain,
        namespace: Vec<u8>,
        keys: Vec<u8>,
        key_ends: Vec<u32>,
        old: Vec<Option<i64>>,
        new: Vec<Option<i64>>,
    ) -> wasmtime::Result<()> {
        if old.len() != key_ends.len() || new.len() != key_ends.len() {
            return Err(wasmtime::Error::new(HostTrap(format!(
                "timer retime refused: {} keys but {} old and {} new timestamps",
                key_ends.len(),
                old.len(),
                new.len()
            ))));
        }
        // Check every offset and key first: a refusal changes nothing.
        self.check_timer_keys("timer retime", &keys, &key_ends)?;
        let d = domain_code(domain);
        let mut start = 0usize;
        for (i, &end) in key_ends.iter().enumerate() {
            let key = &keys[start..end as usize];
            start = end as usize;
            if old[i] == new[i] {
                continue;
            }
            if let Some(ts) = old[i]
                && self.timers.remove(d, ts, key, &namespace) == Some(true)
            {
                self.timers_removed
                    .push((d, ts, key.to_vec(), namespace.clone()));
            }
            if let Some(ts) = new[i] {
                self.timers.insert(d, ts, key, &namespace, false);
            }
        }
        Ok(())
    }

    fn delete(
        &mut self,
        domain: TimeDomain,
        key: Vec<u8>,
        namespace: Vec<u8>,
        timestamp: i64,
    ) -> wasmtime::Result<()> {
        let t = (domain_code(domain), timestamp, key, namespace);
        self.remove_timer(&t);
        Ok(())
    }

    fn current_watermark(&mut self) -> wasmtime::Result<i64> {
        Ok(self.watermark)
    }

    fn current_processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0))
    }
}

impl output::Host for StoreData {
    fn side_output(&mut self, tag: String, records: WitBatch) -> wasmtime::Result<()> {
        if !self.side_tags.contains(&tag) {
            return Err(wasmtime::Error::new(HostTrap(format!(
                "side output {tag:?} is not declared in describe() (declared: {:?})",
                self.side_tags
            ))));
        }
        if !records.ends.is_empty() {
            self.side.push((tag, crate::bindings::host_batch(records)));
        }
        Ok(())
    }
}

impl log::Host for StoreData {
    fn log(&mut self, level: LogLevel, mut message: String) -> wasmtime::Result<()> {
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let plugin = self.label.as_str();
        match level {
            LogLevel::Trace => tracing::trace!(target: "plugin", plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(target: "plugin", plugin, "{message}"),
            LogLevel::Info => tracing::info!(target: "plugin", plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(target: "plugin", plugin, "{message}"),
            LogLevel::Error => tracing::error!(target: "plugin", plugin, "{message}"),
        }
        Ok(())
    }
}

impl metrics::Host for StoreData {
    fn counter_add(&mut self, name: String, delta: u64) -> wasmtime::Result<()> {
        *self.counters.entry(name).or_default() += delta;
        Ok(())
    }

    fn gauge_set(&mut self, name: String, value: i64) -> wasmtime::Result<()> {
        self.gauges.insert(name, value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_namespaces_round_trip_and_sort_by_time() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        let encoded: Vec<Vec<u8>> = times.iter().map(|&t| timer_namespace(0, t, b"w")).collect();
        let mut sorted = encoded.clone();
        sorted.sort();
        assert_eq!(sorted, encoded, "byte order must be time order");
        for (&t, ns) in times.iter().zip(&encoded) {
            assert_eq!(
                timer_entry(ns, b"k".to_vec()),
                Some((0, t, b"k".to_vec(), b"w".to_vec()))
            );
        }
        assert_eq!(timer_entry(&[1, 2], Vec::new()), None);
    }

    /// (domain, timestamp, namespace, key, persisted).
    type FlatTimer = (u8, i64, Vec<u8>, Vec<u8>, bool);

    /// Every timer of `due`, flattened.
    fn flat(due: &[DueGroup]) -> Vec<FlatTimer> {
        due.iter()
            .flat_map(|g| {
                g.keys.iter().map(move |(k, p)| {
                    (g.domain, g.timestamp, g.namespace.to_vec(), k.to_vec(), *p)
                })
            })
            .collect()
    }

    #[test]
    fn timer_index_groups_due_timers_and_keeps_one_per_identity() {
        let mut ix = TimerIndex::default();
        // Registered out of order, with duplicates (a repeat keeps the first flag).
        ix.insert_keys(0, 20, b"w2", [&b"b"[..], b"a", b"b"].into_iter());
        ix.insert(0, 10, b"k", b"w1", true);
        ix.insert(0, 10, b"k", b"w1", false);
        ix.insert(0, 20, b"c", b"w1", false);
        ix.insert(1, 5, b"p", b"", false);
        ix.insert(0, 30, b"z", b"w1", false);
        assert_eq!(ix.len(), 6);
        assert_eq!(ix.remove(0, 20, b"a", b"w2"), Some(false));
        assert_eq!(ix.remove(0, 20, b"a", b"w2"), None);
        assert_eq!(ix.len(), 5);
        // Event time up to 20: timestamp order, then namespace, then key, one group per
        // (timestamp, namespace); processing time and later timers stay.
        let due = ix.pop_due(0, 20);
        assert_eq!(due.len(), 3);
        assert_eq!(
            flat(&due),
            [
                (0, 10, b"w1".to_vec(), b"k".to_vec(), true),
                (0, 20, b"w1".to_vec(), b"c".to_vec(), false),
                (0, 20, b"w2".to_vec(), b"b".to_vec(), false),
            ]
        );
        assert_eq!(ix.len(), 2);
        assert!(ix.has_domain(1));
        assert!(ix.pop_due(0, 20).is_empty());
        assert_eq!(flat(&ix.pop_due(0, i64::MAX)).len(), 1);
        assert_eq!(
            flat(&ix.pop_due(1, 5)),
            [(1, 5, Vec::new(), b"p".to_vec(), false)]
        );
        assert_eq!(ix.len(), 0);
        assert!(!ix.has_domain(0) && !ix.has_domain(1));
    }
}
