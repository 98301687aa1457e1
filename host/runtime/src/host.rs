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

/// A timer key kept inline up to 24 bytes (the keys of the SDK's operators are 8).
type InlineKey = smallvec::SmallVec<[u8; 24]>;
/// A timer namespace kept inline up to 16 bytes (a window's is 16, CEP's 3).
type InlineNamespace = smallvec::SmallVec<[u8; 16]>;

/// The keys of one (domain, timestamp, namespace), each with whether it is written to
/// the `__timers` state yet: inline while there is one (CEP holds one timer per key, at
/// its own deadline), a hash set beyond (windows: every key of a window at its end).
enum TimerKeys {
    One(InlineKey, bool),
    Many(HashMap<InlineKey, bool, foldhash::fast::RandomState>),
}

/// The in-memory index of registered timers: one ordered map from (domain, timestamp,
/// namespace) to its keys. A registration is one B-tree step (per call of
/// `register-keys`, not per key) plus one hash lookup per key, and allocates nothing for
/// a known timer, nor for a new one whose (timestamp, namespace) holds no other key (keys
/// up to 24 bytes and namespaces up to 16 are inline; tree nodes are shared). Due timers
/// come out grouped per (timestamp, namespace), namespaces and keys in ascending byte
/// order, so firing order is deterministic and independent of registration order.
#[derive(Default)]
pub(crate) struct TimerIndex {
    groups: BTreeMap<(u8, i64, InlineNamespace), TimerKeys>,
    len: usize,
}

/// The due timers of one (domain, timestamp, namespace), from [`TimerIndex::pop_due`]:
/// keys ascending, each with its persisted flag.
pub(crate) struct DueGroup {
    pub(crate) domain: u8,
    pub(crate) timestamp: i64,
    pub(crate) namespace: Box<[u8]>,
    pub(crate) keys: Vec<(InlineKey, bool)>,
}

impl TimerKeys {
    /// Adds `key` unless present; whether it was added.
    fn add(&mut self, key: &[u8], persisted: bool) -> bool {
        match self {
            TimerKeys::One(k, _) if k.as_slice() == key => false,
            TimerKeys::One(k, p) => {
                let mut set = HashMap::with_capacity_and_hasher(2, Default::default());
                set.insert(std::mem::take(k), *p);
                set.insert(InlineKey::from_slice(key), persisted);
                *self = TimerKeys::Many(set);
                true
            }
            TimerKeys::Many(set) => {
                if set.contains_key(key) {
                    false
                } else {
                    set.insert(InlineKey::from_slice(key), persisted);
                    true
                }
            }
        }
    }
}

impl TimerIndex {
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
        self.insert_many(
            domain,
            timestamp,
            namespace,
            std::iter::once(key),
            persisted,
        );
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
        self.insert_many(domain, timestamp, namespace, keys, false);
    }

    fn insert_many<'k>(
        &mut self,
        domain: u8,
        timestamp: i64,
        namespace: &[u8],
        mut keys: impl Iterator<Item = &'k [u8]>,
        persisted: bool,
    ) {
        use std::collections::btree_map::Entry;
        let group = (domain, timestamp, InlineNamespace::from_slice(namespace));
        let set = match self.groups.entry(group) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let Some(first) = keys.next() else {
                    return;
                };
                self.len += 1;
                e.insert(TimerKeys::One(InlineKey::from_slice(first), persisted))
            }
        };
        for key in keys {
            if set.add(key, persisted) {
                self.len += 1;
            }
        }
    }

    /// Removes a timer; `Some(persisted)` if it was registered.
    pub(crate) fn remove(
        &mut self,
        domain: u8,
        timestamp: i64,
        key: &[u8],
        namespace: &[u8],
    ) -> Option<bool> {
        let group = (domain, timestamp, InlineNamespace::from_slice(namespace));
        let set = self.groups.get_mut(&group)?;
        let (persisted, now_empty) = match set {
            TimerKeys::One(k, p) if k.as_slice() == key => (*p, true),
            TimerKeys::One(..) => return None,
            TimerKeys::Many(keys) => {
                let p = keys.remove(key)?;
                (p, keys.is_empty())
            }
        };
        if now_empty {
            self.groups.remove(&group);
        }
        self.len -= 1;
        Some(persisted)
    }

    /// Removes and returns the timers of `domain` with `timestamp <= up_to`, grouped per
    /// (timestamp, namespace): groups in timestamp then namespace order, keys ascending.
    pub(crate) fn pop_due(&mut self, domain: u8, up_to: i64) -> Vec<DueGroup> {
        let mut due = Vec::new();
        while let Some(entry) = self
            .groups
            .range((domain, i64::MIN, InlineNamespace::new())..)
            .next()
        {
            let (d, ts) = (entry.0.0, entry.0.1);
            if d != domain || ts > up_to {
                break;
            }
            let group = entry.0.clone();
            let set = self.groups.remove(&group).expect("just seen");
            let keys = match set {
                TimerKeys::One(k, p) => vec![(k, p)],
                TimerKeys::Many(set) => {
                    let mut keys: Vec<(InlineKey, bool)> = set.into_iter().collect();
                    keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                    keys
                }
            };
            self.len -= keys.len();
            due.push(DueGroup {
                domain: d,
                timestamp: ts,
                namespace: group.2.as_slice().into(),
                keys,
            });
        }
        due
    }

    /// Whether any timer of `domain` is registered.
    pub(crate) fn has_domain(&self, domain: u8) -> bool {
        self.groups
            .range((domain, i64::MIN, InlineNamespace::new())..)
            .next()
            .is_some_and(|((d, _, _), _)| *d == domain)
    }

    /// Number of registered timers.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every timer as (domain, timestamp, namespace, key, persisted flag), grouped per
    /// (domain, timestamp, namespace) in that order; keys within a group unordered.
    pub(crate) fn entries_mut(
        &mut self,
    ) -> impl Iterator<Item = (u8, i64, &[u8], &[u8], &mut bool)> + '_ {
        self.groups.iter_mut().flat_map(|((d, ts, ns), set)| {
            let keys: Box<dyn Iterator<Item = (&InlineKey, &mut bool)>> = match set {
                TimerKeys::One(k, p) => Box::new(std::iter::once((&*k, p))),
                TimerKeys::Many(keys) => Box::new(keys.iter_mut()),
            };
            keys.map(move |(k, p)| (*d, *ts, ns.as_slice(), k.as_slice(), p))
        })
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
        let mut group: Option<(u8, i64, Vec<u8>)> = None;
        let mut flush = |group: &Option<(u8, i64, Vec<u8>)>,
                         keys: &mut Vec<u8>,
                         key_ends: &mut Vec<u32>|
         -> Result<(), StateError> {
            if let Some((d, ts, namespace)) = group
                && !key_ends.is_empty()
            {
                value_ends.clear();
                value_ends.resize(key_ends.len(), 0);
                let ns = timer_namespace(*d, *ts, namespace);
                ks.value_put_many(h, &ns, keys, key_ends, &[], &value_ends)?;
            }
            keys.clear();
            key_ends.clear();
            Ok(())
        };
        for (d, ts, namespace, key, persisted) in self.timers.entries_mut() {
            if *persisted {
                continue;
            }
            let same = group
                .as_ref()
                .is_some_and(|(gd, gts, gns)| *gd == d && *gts == ts && gns == namespace);
            if !same {
                flush(&group, &mut keys, &mut key_ends)?;
                group = Some((d, ts, namespace.to_vec()));
            }
            keys.extend_from_slice(key);
            key_ends.push(keys.len() as u32);
            *persisted = true;
        }
        flush(&group, &mut keys, &mut key_ends)?;
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
            self.keyed()?.check_owned(&keys[start..end]).map_err(trap)?;
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

    fn state_ttl(&mut self, state: u32) -> wasmtime::Result<Option<u64>> {
        self.user_handle(state)?;
        self.keyed()?.declared_ttl_ms(state).map_err(trap)
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
        self.keyed()?.check_owned(&key).map_err(trap)?;
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

    proptest::proptest! {
        /// The index against a model (an ordered set of (domain, timestamp, namespace,
        /// key) with a flag): any sequence of registrations, removals and pops gives the
        /// same answers, the same due timers in the same order and the same count, with
        /// single-key and many-key groups mixed.
        #[test]
        fn timer_index_matches_an_ordered_model(
            ops in proptest::collection::vec(
                (0u8..4, 0u8..2, 0i64..6, 0u8..3, 0u8..5, proptest::bool::ANY),
                1..300,
            )
        ) {
            use std::collections::BTreeMap as Model;
            let mut ix = TimerIndex::default();
            let mut model: Model<(u8, i64, Vec<u8>, Vec<u8>), bool> = Model::new();
            for (op, d, ts, ns, key, flag) in ops {
                let ns = vec![b'n'; usize::from(ns)];
                let key = vec![key; usize::from(key % 3) + 1];
                match op {
                    0 | 1 => {
                        ix.insert(d, ts, &key, &ns, flag);
                        model.entry((d, ts, ns, key)).or_insert(flag);
                    }
                    2 => {
                        let got = ix.remove(d, ts, &key, &ns);
                        proptest::prop_assert_eq!(got, model.remove(&(d, ts, ns, key)));
                    }
                    _ => {
                        let got = flat(&ix.pop_due(d, ts));
                        let due: Vec<_> = model
                            .keys()
                            .filter(|k| k.0 == d && k.1 <= ts)
                            .cloned()
                            .collect();
                        let want: Vec<FlatTimer> = due
                            .iter()
                            .map(|k| {
                                let p = model.remove(k).expect("listed");
                                (k.0, k.1, k.2.clone(), k.3.clone(), p)
                            })
                            .collect();
                        proptest::prop_assert_eq!(got, want);
                    }
                }
                proptest::prop_assert_eq!(ix.len(), model.len());
                for dd in 0..2u8 {
                    proptest::prop_assert_eq!(
                        ix.has_domain(dd),
                        model.keys().any(|k| k.0 == dd)
                    );
                }
            }
            let mut all: Vec<_> = ix
                .entries_mut()
                .map(|(d, ts, ns, k, p)| (d, ts, ns.to_vec(), k.to_vec(), *p))
                .collect();
            all.sort();
            let want: Vec<_> = model
                .iter()
                .map(|(k, p)| (k.0, k.1, k.2.clone(), k.3.clone(), *p))
                .collect();
            proptest::prop_assert_eq!(all, want);
        }
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
