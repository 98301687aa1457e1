//! [`MockContext`]: an in-memory [`Context`] for native unit tests of operators.

use crate::{
    Batch, Context, FiredTimer, KeyPage, Operator, PluginError, PluginInfo, Result,
    StateDescriptor, StateHandle, TimeDomain, TimerGroup, ValueBatch,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

type Slot = (u32, Vec<u8>, Vec<u8>); // (state, namespace, key)

/// An in-memory [`Context`] with the host's rules, for native unit tests.
///
/// - Only states declared in the [`PluginInfo`] given at construction can be opened;
///   opening another name fails with [`crate::ErrorCode::State`], like the host.
/// - With [`MockContext::with_shards`], touching a key whose StateShard
///   (`xxh3_64(key) % count`, as the host computes it) lies outside the owned range panics,
///   as the host traps.
/// - Timers are kept in an ordered set; [`MockContext::fire_due_event_timers`] and
///   [`MockContext::fire_due_processing_timers`] pop the due ones the way the host would
///   before calling [`Operator::on_timers`].
///
/// The watermark starts at `i64::MIN` and processing time at 0.
#[derive(Debug, Clone)]
pub struct MockContext {
    declared: Vec<StateDescriptor>,
    shards: Option<(u32, Range<u32>)>,
    values: BTreeMap<Slot, Vec<u8>>,
    lists: BTreeMap<Slot, Vec<Vec<u8>>>,
    maps: BTreeMap<Slot, BTreeMap<Vec<u8>, Vec<u8>>>,
    // (timestamp, domain, key, namespace): ordered by timestamp first.
    timers: BTreeSet<(i64, TimeDomain, Vec<u8>, Vec<u8>)>,
    watermark: i64,
    processing_time: i64,
    // Declared side outputs; `None` accepts any tag (contexts built from bare states).
    side_tags: Option<Vec<String>>,
    side: BTreeMap<String, Batch>,
    operator_declared: Vec<crate::OperatorStateDescriptor>,
    operator_values: Vec<BTreeMap<String, Vec<u8>>>,
    // TTLs reported by `state_ttl_ms`, by state handle.
    ttl_ms: BTreeMap<u32, u64>,
    // The most keys one `value_put_many` call carried.
    largest_put_many: usize,
}

impl MockContext {
    /// A context accepting the states `info` declares; owns every shard.
    pub fn new(info: &PluginInfo) -> Self {
        let mut ctx = Self::with_states(info.states.clone());
        ctx.side_tags = Some(info.side_outputs.clone());
        ctx.operator_values = vec![BTreeMap::new(); info.operator_states.len()];
        ctx.operator_declared = info.operator_states.clone();
        ctx
    }

    /// A context for operator `T`, declaring the states of `T::describe()`.
    pub fn for_operator<T: Operator>() -> Self {
        Self::new(&T::describe())
    }

    /// A context accepting exactly the given states; owns every shard.
    pub fn with_states(states: impl IntoIterator<Item = StateDescriptor>) -> Self {
        MockContext {
            declared: states.into_iter().collect(),
            shards: None,
            values: BTreeMap::new(),
            lists: BTreeMap::new(),
            maps: BTreeMap::new(),
            timers: BTreeSet::new(),
            watermark: i64::MIN,
            processing_time: 0,
            side_tags: None,
            side: BTreeMap::new(),
            operator_declared: Vec::new(),
            operator_values: Vec::new(),
            ttl_ms: BTreeMap::new(),
            largest_put_many: 0,
        }
    }

    /// Every entry of operator state `name`, ascending by id (what a snapshot would hold),
    /// or `None` if no such operator state is declared.
    pub fn operator_state(&self, name: &str) -> Option<Vec<(String, Vec<u8>)>> {
        let i = self.operator_declared.iter().position(|d| d.name == name)?;
        Some(
            self.operator_values[i]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// Replaces the entries of operator state `name` (as a restore would before `open`).
    ///
    /// # Panics
    /// If no such operator state is declared.
    pub fn set_operator_state(&mut self, name: &str, entries: Vec<(String, Vec<u8>)>) {
        let i = self
            .operator_declared
            .iter()
            .position(|d| d.name == name)
            .unwrap_or_else(|| panic!("operator state `{name}` is not declared"));
        self.operator_values[i] = entries.into_iter().collect();
    }

    /// Restricts this context to owning shards `owned` of `count`: any keyed access or
    /// timer for a key outside panics like the host's trap.
    ///
    /// # Panics
    /// If `count` is 0 or `owned` is not within `0..count`.
    pub fn with_shards(mut self, count: u32, owned: Range<u32>) -> Self {
        assert!(count > 0, "shard count must be positive");
        assert!(
            owned.end <= count,
            "owned shards {owned:?} exceed count {count}"
        );
        self.shards = Some((count, owned));
        self
    }

    /// Gives declared state `name` a TTL of `ttl_ms`, as a job file's `state_ttl_ms` does:
    /// [`Context::state_ttl_ms`] reports it. The mock does not expire entries.
    ///
    /// # Panics
    /// If no state `name` is declared.
    pub fn with_state_ttl(mut self, name: &str, ttl_ms: u64) -> Self {
        let i = self
            .declared
            .iter()
            .position(|d| d.name == name)
            .unwrap_or_else(|| panic!("state `{name}` is not declared"));
        self.ttl_ms.insert(i as u32, ttl_ms);
        self
    }

    /// Sets the watermark [`Context::current_watermark`] reports (ms).
    pub fn set_watermark(&mut self, watermark: i64) {
        self.watermark = watermark;
    }

    /// Sets the time [`Context::current_processing_time`] reports (ms).
    pub fn set_processing_time(&mut self, now: i64) {
        self.processing_time = now;
    }

    /// Advances the watermark to `watermark` and removes and returns every event-time
    /// timer with `timestamp <= watermark`, grouped as the host groups them (see
    /// [`TimerGroup`]).
    pub fn fire_due_event_timers(&mut self, watermark: i64) -> Vec<TimerGroup> {
        self.watermark = self.watermark.max(watermark);
        self.fire_due(TimeDomain::EventTime, watermark)
    }

    /// Sets processing time to `now` and removes and returns every processing-time timer
    /// with `timestamp <= now`, grouped as [`Self::fire_due_event_timers`].
    pub fn fire_due_processing_timers(&mut self, now: i64) -> Vec<TimerGroup> {
        self.processing_time = now;
        self.fire_due(TimeDomain::ProcessingTime, now)
    }

    fn fire_due(&mut self, domain: TimeDomain, up_to: i64) -> Vec<TimerGroup> {
        let mut due: Vec<_> = self
            .timers
            .iter()
            .take_while(|t| t.0 <= up_to)
            .filter(|t| t.1 == domain)
            .cloned()
            .collect();
        for t in &due {
            self.timers.remove(t);
        }
        // The host's order: timestamp, then namespace, then key.
        due.sort_by(|a, b| (a.0, &a.3, &a.2).cmp(&(b.0, &b.3, &b.2)));
        let fired: Vec<FiredTimer> = due
            .into_iter()
            .map(|t| FiredTimer {
                domain: t.1,
                key: t.2,
                namespace: t.3,
                timestamp: t.0,
            })
            .collect();
        TimerGroup::group(&fired)
    }

    /// Every registered timer, in timestamp order.
    pub fn registered_timers(&self) -> Vec<FiredTimer> {
        self.timers
            .iter()
            .map(|t| FiredTimer {
                domain: t.1,
                key: t.2.clone(),
                namespace: t.3.clone(),
                timestamp: t.0,
            })
            .collect()
    }

    /// Removes and returns everything emitted to side output `tag` so far (one batch,
    /// in emission order; empty if nothing was emitted).
    pub fn take_side_output(&mut self, tag: &str) -> Batch {
        self.side.remove(tag).unwrap_or_default()
    }

    /// The most keys one `value_put_many` call has carried so far (0: none yet): what a
    /// host state memory budget, applied after each call, could be passed by.
    pub fn largest_put_many(&self) -> usize {
        self.largest_put_many
    }

    /// Number of stored items: one per value, one per list element, one per map entry.
    pub fn state_entry_count(&self) -> usize {
        self.values.len()
            + self.lists.values().map(Vec::len).sum::<usize>()
            + self.maps.values().map(BTreeMap::len).sum::<usize>()
    }

    /// The raw value bytes of `key` in `namespace` of the state named `state`, if any.
    pub fn raw_value(&self, state: &str, namespace: &[u8], key: &[u8]) -> Option<&[u8]> {
        let id = self.declared.iter().position(|d| d.name == state)? as u32;
        self.values
            .get(&(id, namespace.to_vec(), key.to_vec()))
            .map(Vec::as_slice)
    }

    fn check_handle(&self, state: StateHandle) -> u32 {
        let id = state.raw();
        assert!(
            (id as usize) < self.declared.len(),
            "trap: unknown state handle {id}"
        );
        id
    }

    fn check_key(&self, key: &[u8]) {
        if let Some((count, owned)) = &self.shards {
            let shard = (xxhash_rust::xxh3::xxh3_64(key) % u64::from(*count)) as u32;
            assert!(
                owned.contains(&shard),
                "trap: key {key:?} is in StateShard {shard} of {count}, outside this subtask's shards {owned:?}"
            );
        }
    }

    fn slot(&self, state: StateHandle, namespace: &[u8], key: &[u8]) -> Slot {
        let id = self.check_handle(state);
        self.check_key(key);
        (id, namespace.to_vec(), key.to_vec())
    }
}

fn split<'a>(buf: &'a [u8], ends: &'a [u32]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut start = 0usize;
    ends.iter().map(move |&e| {
        let s = &buf[start..e as usize];
        start = e as usize;
        s
    })
}

impl Context for MockContext {
    fn open_operator_state(&mut self, name: &str) -> Result<StateHandle> {
        match self.operator_declared.iter().position(|d| d.name == name) {
            Some(i) => Ok(StateHandle::from_raw(i as u32)),
            None => Err(PluginError::state(format!(
                "operator state `{name}` was not declared (declared: {:?})",
                self.operator_declared
                    .iter()
                    .map(|d| &d.name)
                    .collect::<Vec<_>>()
            ))),
        }
    }

    fn operator_state_get(&mut self, state: StateHandle, id: &str) -> Option<Vec<u8>> {
        self.operator_values[state.raw() as usize].get(id).cloned()
    }

    fn operator_state_put(&mut self, state: StateHandle, id: &str, value: &[u8]) {
        self.operator_values[state.raw() as usize].insert(id.to_owned(), value.to_vec());
    }

    fn operator_state_remove(&mut self, state: StateHandle, id: &str) {
        self.operator_values[state.raw() as usize].remove(id);
    }

    fn operator_state_entries(&mut self, state: StateHandle) -> Vec<(String, Vec<u8>)> {
        self.operator_values[state.raw() as usize]
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn open_state(&mut self, name: &str) -> Result<StateHandle> {
        match self.declared.iter().position(|d| d.name == name) {
            Some(i) => Ok(StateHandle::from_raw(i as u32)),
            None => Err(PluginError::state(format!(
                "state `{name}` was not declared in describe() (declared: {:?})",
                self.declared.iter().map(|d| &d.name).collect::<Vec<_>>()
            ))),
        }
    }

    fn state_ttl_ms(&mut self, state: StateHandle) -> Option<u64> {
        assert!(
            (state.raw() as usize) < self.declared.len(),
            "unknown state handle {state:?}"
        );
        self.ttl_ms.get(&state.raw()).copied()
    }

    fn value_get_many(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) -> ValueBatch {
        let mut out = ValueBatch::default();
        for key in split(keys, key_ends) {
            let slot = self.slot(state, namespace, key);
            match self.values.get(&slot) {
                Some(v) => {
                    out.data.extend_from_slice(v);
                    out.present.push(true);
                }
                None => out.present.push(false),
            }
            out.ends.push(out.data.len() as u32);
        }
        out
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
        assert_eq!(
            key_ends.len(),
            value_ends.len(),
            "trap: value_put_many got {} keys and {} values",
            key_ends.len(),
            value_ends.len()
        );
        self.largest_put_many = self.largest_put_many.max(key_ends.len());
        for (key, value) in split(keys, key_ends).zip(split(values, value_ends)) {
            let slot = self.slot(state, namespace, key);
            self.values.insert(slot, value.to_vec());
        }
    }

    fn value_delete(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        let slot = self.slot(state, namespace, key);
        self.values.remove(&slot);
    }

    fn value_keys(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> KeyPage {
        let id = self.check_handle(state);
        let mut page = KeyPage::default();
        let mut iter = self
            .values
            .keys()
            .filter(|(s, ns, k)| {
                *s == id && ns.as_slice() == namespace && after.is_none_or(|a| k.as_slice() > a)
            })
            .map(|(_, _, k)| k);
        for k in iter.by_ref().take(limit as usize) {
            page.keys.extend_from_slice(k);
            page.key_ends.push(page.keys.len() as u32);
        }
        page.more = iter.next().is_some();
        page
    }

    fn list_append(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], value: &[u8]) {
        let slot = self.slot(state, namespace, key);
        self.lists.entry(slot).or_default().push(value.to_vec());
    }

    fn list_get(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) -> Vec<Vec<u8>> {
        let slot = self.slot(state, namespace, key);
        self.lists.get(&slot).cloned().unwrap_or_default()
    }

    fn list_clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        let slot = self.slot(state, namespace, key);
        self.lists.remove(&slot);
    }

    fn map_put(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
    ) {
        let slot = self.slot(state, namespace, key);
        self.maps
            .entry(slot)
            .or_default()
            .insert(user_key.to_vec(), value.to_vec());
    }

    fn map_get(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
    ) -> Option<Vec<u8>> {
        let slot = self.slot(state, namespace, key);
        self.maps.get(&slot)?.get(user_key).cloned()
    }

    fn map_remove(&mut self, state: StateHandle, namespace: &[u8], key: &[u8], user_key: &[u8]) {
        let slot = self.slot(state, namespace, key);
        if let Some(m) = self.maps.get_mut(&slot) {
            m.remove(user_key);
            if m.is_empty() {
                self.maps.remove(&slot);
            }
        }
    }

    fn map_entries(
        &mut self,
        state: StateHandle,
        namespace: &[u8],
        key: &[u8],
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let slot = self.slot(state, namespace, key);
        self.maps
            .get(&slot)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    fn clear(&mut self, state: StateHandle, namespace: &[u8], key: &[u8]) {
        let slot = self.slot(state, namespace, key);
        self.values.remove(&slot);
        self.lists.remove(&slot);
        self.maps.remove(&slot);
    }

    fn register_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64) {
        self.check_key(key);
        self.timers
            .insert((timestamp, domain, key.to_vec(), namespace.to_vec()));
    }

    fn delete_timer(&mut self, domain: TimeDomain, key: &[u8], namespace: &[u8], timestamp: i64) {
        self.check_key(key);
        self.timers
            .remove(&(timestamp, domain, key.to_vec(), namespace.to_vec()));
    }

    fn current_watermark(&self) -> i64 {
        self.watermark
    }

    fn current_processing_time(&self) -> i64 {
        self.processing_time
    }

    fn side_output(&mut self, tag: &str, records: &Batch) {
        if let Some(tags) = &self.side_tags {
            assert!(
                tags.iter().any(|t| t == tag),
                "trap: side output {tag:?} is not declared in describe() (declared: {tags:?})"
            );
        }
        let out = self.side.entry(tag.to_string()).or_default();
        for r in records.iter() {
            out.push_record(r.key, r.timestamp, r.data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ListState, MapState, ValueState};

    fn info() -> PluginInfo {
        PluginInfo::operator("t", "0.1.0")
            .state(ValueState::<u64>::descriptor("count", 1))
            .state(ListState::<String>::descriptor("seen", 1))
            .state(MapState::<u32, i64>::descriptor("sums", 1))
    }

    #[test]
    fn value_state_round_trips_and_batches() {
        let mut ctx = MockContext::new(&info());
        let count = ValueState::<u64>::open(&mut ctx, "count").unwrap();
        assert_eq!(count.get(&mut ctx, b"a"), None);
        count.put(&mut ctx, b"a", &7);
        assert_eq!(count.get(&mut ctx, b"a"), Some(7));
        count.put_many(&mut ctx, &[(b"b", 1), (b"c", 2), (b"a", 8)]);
        assert_eq!(
            count.get_many(&mut ctx, &[b"a", b"x", b"c", b"b"]),
            vec![Some(8), None, Some(2), Some(1)]
        );
        assert_eq!(
            count.keys(&mut ctx),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        count.delete(&mut ctx, b"b");
        assert_eq!(count.get(&mut ctx, b"b"), None);
        assert_eq!(ctx.state_entry_count(), 2);
        assert_eq!(ctx.raw_value("count", b"", b"a"), Some(&[8u8][..]));
    }

    #[test]
    fn namespaces_are_separate() {
        let mut ctx = MockContext::new(&info());
        let count = ValueState::<u64>::open(&mut ctx, "count").unwrap();
        count.put(&mut ctx, b"k", &1);
        count.in_namespace(b"w1").put(&mut ctx, b"k", &2);
        assert_eq!(count.get(&mut ctx, b"k"), Some(1));
        assert_eq!(count.in_namespace(b"w1").get(&mut ctx, b"k"), Some(2));
        assert_eq!(count.in_namespace(b"w2").get(&mut ctx, b"k"), None);
        assert_eq!(
            count.in_namespace(b"w1").keys(&mut ctx),
            vec![b"k".to_vec()]
        );
    }

    #[test]
    fn keys_pages_through_many_keys() {
        let mut ctx = MockContext::new(&info());
        let count = ValueState::<u64>::open(&mut ctx, "count").unwrap();
        let keys: Vec<[u8; 4]> = (0..2500u32).map(u32::to_be_bytes).collect();
        let entries: Vec<(&[u8], u64)> = keys.iter().map(|k| (&k[..], 1)).collect();
        count.put_many(&mut ctx, &entries);
        let got = count.keys(&mut ctx);
        assert_eq!(got.len(), 2500);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn list_and_map_states() {
        let mut ctx = MockContext::new(&info());
        let seen = ListState::<String>::open(&mut ctx, "seen").unwrap();
        seen.append(&mut ctx, b"k", &"a".to_string());
        seen.append(&mut ctx, b"k", &"b".to_string());
        assert_eq!(seen.get(&mut ctx, b"k"), vec!["a", "b"]);
        seen.clear(&mut ctx, b"k");
        assert!(seen.get(&mut ctx, b"k").is_empty());

        let sums = MapState::<u32, i64>::open(&mut ctx, "sums").unwrap();
        sums.put(&mut ctx, b"k", &1, &10);
        sums.put(&mut ctx, b"k", &2, &-3);
        assert_eq!(sums.get(&mut ctx, b"k", &2), Some(-3));
        assert_eq!(sums.entries(&mut ctx, b"k"), vec![(1, 10), (2, -3)]);
        sums.remove(&mut ctx, b"k", &1);
        assert_eq!(sums.entries(&mut ctx, b"k"), vec![(2, -3)]);
        sums.clear(&mut ctx, b"k");
        assert_eq!(ctx.state_entry_count(), 0);
    }

    #[test]
    fn undeclared_state_is_refused() {
        let mut ctx = MockContext::new(&info());
        let err = ValueState::<u64>::open(&mut ctx, "nope").unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::State);
        assert!(err.message.contains("nope"));
    }

    #[test]
    fn owned_shards_are_enforced() {
        let key_in_shard = |shard: u32| -> Vec<u8> {
            (0u32..)
                .map(|i| i.to_le_bytes().to_vec())
                .find(|k| xxhash_rust::xxh3::xxh3_64(k) % 4 == u64::from(shard))
                .unwrap()
        };
        let mut ctx = MockContext::new(&info()).with_shards(4, 0..2);
        let count = ValueState::<u64>::open(&mut ctx, "count").unwrap();
        count.put(&mut ctx, &key_in_shard(1), &1);
        let foreign = key_in_shard(3);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            count.put(&mut ctx, &foreign, &1);
        }));
        let msg = *result.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("StateShard 3 of 4"), "{msg}");
    }

    #[test]
    fn timers_fire_in_order_once() {
        let mut ctx = MockContext::new(&info());
        ctx.register_timer(TimeDomain::EventTime, b"b", b"", 20);
        ctx.register_timer(TimeDomain::EventTime, b"a", b"", 10);
        ctx.register_timer(TimeDomain::EventTime, b"a", b"", 10);
        ctx.register_timer(TimeDomain::ProcessingTime, b"a", b"", 5);
        ctx.register_timer(TimeDomain::EventTime, b"c", b"", 30);
        ctx.delete_timer(TimeDomain::EventTime, b"c", b"", 30);
        assert_eq!(ctx.registered_timers().len(), 3);
        let fired = TimerGroup::flatten(&ctx.fire_due_event_timers(20));
        assert_eq!(
            fired,
            vec![
                FiredTimer::event_time(b"a", b"", 10),
                FiredTimer::event_time(b"b", b"", 20)
            ]
        );
        assert_eq!(ctx.current_watermark(), 20);
        assert!(ctx.fire_due_event_timers(100).is_empty());
        assert_eq!(ctx.fire_due_processing_timers(5).len(), 1);
    }
}
