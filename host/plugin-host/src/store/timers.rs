//! The in-memory timer index of an instance, its `__timers` state (design §8.4), and the
//! host side of `nop:stream/timers`.

use super::{HostTrap, StoreData, trap};
use crate::bindings::TimeDomain;
use crate::bindings::op::nop::stream::timers;
use nop_stream_state::StateError;
use std::collections::{BTreeMap, HashMap};

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
