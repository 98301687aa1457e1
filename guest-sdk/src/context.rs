//! [`Context`]: the host services an operator uses — keyed state and timers — as one
//! object-safe trait, implemented over the WIT imports inside a component and by
//! [`crate::MockContext`] in native unit tests.

use crate::{FiredTimer, Result, TimeDomain};

/// Handle of an opened state, valid for the lifetime of the instance (WIT `state-id`).
///
/// Obtain one with [`Context::open_state`]; typed wrappers such as
/// [`crate::ValueState`] hold it for you.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateHandle(u32);

impl StateHandle {
    /// Wraps a raw host handle. Only [`Context`] implementations need this.
    pub const fn from_raw(raw: u32) -> Self {
        StateHandle(raw)
    }

    /// The raw host handle.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

/// Values returned by [`Context::value_get_many`], one slot per key asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValueBatch {
    /// Concatenated values; absent keys contribute no bytes.
    pub data: Vec<u8>,
    /// Exclusive end offset in `data` of each value, one per key asked for.
    pub ends: Vec<u32>,
    /// Whether a value exists for each key asked for.
    pub present: Vec<bool>,
}

impl ValueBatch {
    /// Number of slots (keys asked for).
    pub fn len(&self) -> usize {
        self.present.len()
    }

    /// Whether no key was asked for.
    pub fn is_empty(&self) -> bool {
        self.present.is_empty()
    }

    /// The value of the `i`-th key asked for, or `None` if it has none.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        if !self.present[i] {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        Some(&self.data[start..self.ends[i] as usize])
    }
}

/// A page of keys returned by [`Context::value_keys`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPage {
    /// Concatenated keys in ascending byte order.
    pub keys: Vec<u8>,
    /// Exclusive end offset in `keys` of each key.
    pub key_ends: Vec<u32>,
    /// Whether more keys follow the last one returned.
    pub more: bool,
}

/// Item `i` of a flat layout (`data` + exclusive `ends`, as WIT batches lay out keys).
///
/// # Panics
/// If `i >= ends.len()` or the offsets are malformed.
pub(crate) fn nth_flat<'a>(data: &'a [u8], ends: &[u32], i: usize) -> &'a [u8] {
    let start = if i == 0 { 0 } else { ends[i - 1] as usize };
    &data[start..ends[i] as usize]
}

impl KeyPage {
    /// Number of keys in the page.
    pub fn len(&self) -> usize {
        self.key_ends.len()
    }

    /// Whether the page holds no key.
    pub fn is_empty(&self) -> bool {
        self.key_ends.is_empty()
    }

    /// The `i`-th key.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn key(&self, i: usize) -> &[u8] {
        nth_flat(&self.keys, &self.key_ends, i)
    }

    /// Iterates over the keys in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.key(i))
    }
}

/// Host services of an operator: keyed state and timers (WIT `state` and `timers`).
///
/// Every state operation names a state (by [`StateHandle`]), a `namespace` (empty for
/// plain keyed state; a window or pattern id otherwise) and keys. Keys, values and
/// namespaces are opaque bytes. Keys are laid out flat where several are passed at once:
/// `keys` holds them concatenated and `key_ends` their exclusive end offsets.
///
/// Reads see every write the same instance made before, including writes not yet
/// checkpointed. A key whose StateShard this subtask does not own is a trap in the host
/// (a panic in [`crate::MockContext`] with shards configured), never silent corruption.
///
/// Batched calls (`value_get_many`, `value_put_many`) cost one host call for the whole
/// batch; prefer them on the per-record path (design §16).
pub trait Context {
    /// Opens a state declared in `describe()`.
    ///
    /// # Errors
    /// [`crate::ErrorCode::State`] if no state of that name was declared.
    fn open_state(&mut self, name: &str) -> Result<StateHandle>;

    /// Opens a non-keyed operator state declared with [`crate::PluginInfo::operator_state`]
    /// (WIT `operator-state`, `0.2.1`). Its entries are restored before `open`, so `open`
    /// may read them.
    ///
    /// The provided methods serve contexts without operator state (implementations
    /// outside the SDK written before it existed): opening fails, so no handle reaches
    /// the other methods.
    ///
    /// # Errors
    /// [`crate::ErrorCode::State`] if no operator state of that name was declared.
    fn open_operator_state(&mut self, name: &str) -> Result<StateHandle> {
        Err(crate::PluginError::state(format!(
            "operator state `{name}`: this context has no operator state"
        )))
    }

    /// The value of entry `id` of an operator state, if any.
    fn operator_state_get(&mut self, state: StateHandle, id: &str) -> Option<Vec<u8>> {
        unreachable!("operator state {state:?} (`{id}`) was never opened in this context")
    }

    /// Sets entry `id` of an operator state. The host traps past 64 MiB of operator state
    /// per instance.
    fn operator_state_put(&mut self, state: StateHandle, id: &str, value: &[u8]) {
        let _ = value;
        unreachable!("operator state {state:?} (`{id}`) was never opened in this context")
    }

    /// Removes entry `id` of an operator state, if any.
    fn operator_state_remove(&mut self, state: StateHandle, id: &str) {
        unreachable!("operator state {state:?} (`{id}`) was never opened in this context")
    }

    /// Every entry of an operator state this subtask holds, ascending by id.
    fn operator_state_entries(&mut self, state: StateHandle) -> Vec<(String, Vec<u8>)> {
        unreachable!("operator state {state:?} was never opened in this context")
    }

    /// The time-to-live of state `state` in ms of processing time (job-file
    /// `state_ttl_ms`), or `None` if its entries never expire; fixed for the instance's
    /// lifetime (WIT `state-ttl`, `0.2.2`).
    ///
    /// The host restarts an entry's lifetime when a write reaches it, so an operator that
    /// caches values in the instance across calls must, when this is `Some`, write every
    /// change back within the call that made it and read the value from the host again in
    /// the next (docs/operations.md, "State TTL").
    fn state_ttl_ms(&mut self, state: StateHandle) -> Option<u64>;

    /// Looks up one value per key, in key order, in one host call.
    fn value_get_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) -> ValueBatch;

    /// Stores one value per key in one host call; `values` / `value_ends` are laid out
    /// like the keys and must hold as many entries.
    fn value_put_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        values: &[u8],
        value_ends: &[u32],
    );

    /// Removes the value of one key, if any.
    fn value_delete(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]);

    /// Removes the values of many keys (laid out flat: `keys` + exclusive `key_ends`).
    /// Default: one [`Self::value_delete`] per key; the host does it in one call.
    fn value_delete_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) {
        let mut start = 0usize;
        for &end in key_ends {
            self.value_delete(state, namespace, &keys[start..end as usize]);
            start = end as usize;
        }
    }

    /// Lists keys of a value state held by this subtask in `namespace`, ascending,
    /// starting strictly after `after` (or at the first key), at most `limit` keys.
    fn value_keys(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> KeyPage;

    /// Appends one value to the list of `key`.
    fn list_append(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], value: &[u8]);

    /// Returns the whole list of `key` (empty if none).
    fn list_get(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) -> Vec<Vec<u8>>;

    /// Removes the list of `key`.
    fn list_clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]);

    /// Sets `user_key` to `value` in the map of `key`.
    fn map_put(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
    );

    /// Reads `user_key` from the map of `key`.
    fn map_get(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
    ) -> Option<Vec<u8>>;

    /// Removes `user_key` from the map of `key`.
    fn map_remove(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], user_key: &[u8]);

    /// Returns every entry of the map of `key`, ascending by user key bytes.
    fn map_entries(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
    ) -> Vec<(Vec<u8>, Vec<u8>)>;

    /// Removes everything stored under `key` in `namespace` for this state.
    fn clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]);

    /// Registers a timer at `timestamp` (ms since the Unix epoch). Registering the same
    /// (domain, key, namespace, timestamp) twice keeps one timer; it fires at most once,
    /// through [`crate::Operator::on_timers`].
    fn register_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64);

    /// Registers the timer (domain, key, namespace, timestamp) for each of `keys`; one
    /// host call inside a component (use it for all keys of a window). Default: one
    /// [`Context::register_timer`] per key.
    fn register_timers_for_keys(
        &mut self,
        domain: TimeDomain,
        namespace: &[u8],
        timestamp: i64,
        keys: &[&[u8]],
    ) {
        for key in keys {
            self.register_timer(domain, key, namespace, timestamp);
        }
    }

    /// Deletes a timer if it is registered.
    fn delete_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64);

    /// Moves one timer per key (laid out flat: `keys` + exclusive `key_ends`): for key
    /// `i`, deletes the timer at `old[i]` if set and registers one at `new[i]` if set.
    /// Default: one [`Self::delete_timer`] / [`Self::register_timer`] per change; the host
    /// does it in one call.
    ///
    /// # Panics
    /// If `old` or `new` is not as long as `key_ends` (the host traps).
    fn retime_timers(
        &mut self,
        domain: TimeDomain,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        old: &[Option<i64>],
        new: &[Option<i64>],
    ) {
        assert!(
            old.len() == key_ends.len() && new.len() == key_ends.len(),
            "retime_timers: {} keys but {} old and {} new timestamps",
            key_ends.len(),
            old.len(),
            new.len()
        );
        let mut start = 0usize;
        for (i, &end) in key_ends.iter().enumerate() {
            let key = &keys[start..end as usize];
            start = end as usize;
            if old[i] == new[i] {
                continue;
            }
            if let Some(ts) = old[i] {
                self.delete_timer(domain, key, namespace, ts);
            }
            if let Some(ts) = new[i] {
                self.register_timer(domain, key, namespace, ts);
            }
        }
    }

    /// Current event-time watermark of this subtask in ms since the Unix epoch
    /// (`i64::MIN` before the first watermark).
    fn current_watermark(&self) -> i64;

    /// Current processing time in ms since the Unix epoch.
    fn current_processing_time(&self) -> i64;

    /// Emits `records` to the side output `tag` (declared with
    /// [`crate::PluginInfo::side_output`]); the host routes them to the edges reading
    /// `{ from = "<operator>", output = "<tag>" }` after the current call returns. An
    /// undeclared tag traps in the host (panics in [`crate::MockContext`]).
    fn side_output(&mut self, tag: &str, records: &crate::Batch);
}

/// Convenience for building a [`FiredTimer`] list in tests and helpers.
impl FiredTimer {
    /// An event-time timer.
    pub fn event_time(key: &[u8], namespace: &[u8], timestamp: i64) -> Self {
        FiredTimer {
            domain: TimeDomain::EventTime,
            key: key.to_vec(),
            namespace: namespace.to_vec(),
            timestamp,
        }
    }
}
