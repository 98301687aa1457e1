//! The accumulator cache of [`super::Aggregating`]: per window, the accumulators of the
//! keys that records reached since the last flush, held in the instance instead of host
//! state (see "Accumulator cache" in the [module docs](super)).

use hashbrown::HashTable;

use super::Window;
use crate::hash::{be_prefix as prefix, fx_hash};

/// Flush the cache between checkpoints once it holds this many (key, window) entries, so
/// that a job with many keys and long windows stays within the guest's memory limit.
pub const MAX_CACHED_ENTRIES: usize = 1 << 17;
/// Flush the cache between checkpoints once its keys take this many bytes.
pub const MAX_CACHED_KEY_BYTES: usize = 8 << 20;

/// The cached accumulators of one window: keys in one arena, in first-arrival order, and
/// a hash table of their indices. Per entry the slot also keeps the key's hash (for the
/// table's growth) and its [`be_prefix`](crate::hash::be_prefix) (so that comparing and sorting short keys touches
/// neither the arena nor `memcmp`, a call in a wasm guest).
#[derive(Debug)]
pub(crate) struct Slot<Acc> {
    keys: Vec<u8>,
    ends: Vec<u32>,
    meta: Vec<Meta>,
    accs: Vec<Acc>,
    index: HashTable<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    hash: u64,
    prefix: u64,
    /// The key's length: a probe compares it without reading `ends`.
    len: u32,
}

#[inline]
fn key_at<'a>(keys: &'a [u8], ends: &[u32], i: usize) -> &'a [u8] {
    let start = if i == 0 { 0 } else { ends[i - 1] as usize };
    &keys[start..ends[i] as usize]
}

impl<Acc> Slot<Acc> {
    /// An empty slot with room for `entries` keys of `key_bytes` bytes in all, so that a
    /// window as large as the last one fills it without regrowing the table.
    fn with_capacity(entries: usize, key_bytes: usize) -> Self {
        Slot {
            keys: Vec::with_capacity(key_bytes),
            ends: Vec::with_capacity(entries),
            meta: Vec::with_capacity(entries),
            accs: Vec::with_capacity(entries),
            index: HashTable::with_capacity(entries),
        }
    }

    /// Entries (keys) in the slot.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The `i`-th key, in first-arrival order.
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        key_at(&self.keys, &self.ends, i)
    }

    /// The accumulator of `key` (whose [`fx_hash`] is `hash`), created with `create` if the
    /// key is new; and whether it was.
    fn entry(
        &mut self,
        key: &[u8],
        hash: u64,
        pre: u64,
        create: impl FnOnce() -> Acc,
    ) -> (&mut Acc, bool) {
        let (keys, ends, meta) = (&self.keys, &self.ends, &self.meta);
        if let Some(&i) = self.index.find(hash, |&i| {
            let m = &meta[i as usize];
            // A key of at most 8 bytes is its prefix and length.
            m.prefix == pre
                && m.len as usize == key.len()
                && (key.len() <= 8 || key_at(keys, ends, i as usize) == key)
        }) {
            return (&mut self.accs[i as usize], false);
        }
        let i = self.ends.len();
        self.keys.extend_from_slice(key);
        self.ends.push(self.keys.len() as u32);
        self.meta.push(Meta {
            hash,
            prefix: pre,
            len: key.len() as u32,
        });
        self.accs.push(create());
        let meta = &self.meta;
        self.index
            .insert_unique(hash, i as u32, |&j| meta[j as usize].hash);
        (&mut self.accs[i], true)
    }

    /// Entry indices in ascending key byte order (the order of a host timer group).
    pub(crate) fn sorted(&self) -> Vec<u32> {
        let mut order: Vec<(u64, u32)> = self
            .meta
            .iter()
            .zip(0..)
            .map(|(m, i)| (m.prefix, i))
            .collect();
        sort_by_prefix(&mut order);
        // Keys with equal prefixes (longer than 8 bytes, or ending in zero bytes): order each
        // such run by the key bytes.
        let mut start = 0;
        while start < order.len() {
            let p = order[start].0;
            let end = start + order[start..].iter().take_while(|e| e.0 == p).count();
            if end - start > 1 {
                order[start..end]
                    .sort_unstable_by(|a, b| self.key(a.1 as usize).cmp(self.key(b.1 as usize)));
            }
            start = end;
        }
        order.into_iter().map(|(_, i)| i).collect()
    }

    /// Moves the accumulators out, leaving the keys.
    pub(crate) fn take_accs(&mut self) -> Vec<Acc> {
        std::mem::take(&mut self.accs)
    }
}

/// Sorts `v` by its first field: an LSD radix sort on its bytes for more than 64 entries,
/// skipping the bytes that are equal in every entry (the zero padding of short keys' prefixes,
/// the high bytes of small ids). Stable, so entries with equal first fields keep their order.
///
/// Why not `sort_unstable`: sorting a fired window's keys was 20 % of the q5 window thread;
/// a comparison sort compiled to wasm pays a call and a bounds check per comparison.
fn sort_by_prefix(v: &mut Vec<(u64, u32)>) {
    if v.len() <= 64 {
        v.sort_by_key(|e| e.0);
        return;
    }
    // One pass counts all eight bytes.
    let mut counts = [[0u32; 256]; 8];
    for e in v.iter() {
        for (b, c) in counts.iter_mut().enumerate() {
            c[((e.0 >> (8 * b)) & 0xff) as usize] += 1;
        }
    }
    let mut buf = vec![(0u64, 0u32); v.len()];
    for (b, c) in counts.iter_mut().enumerate() {
        if c.iter().any(|&n| n as usize == v.len()) {
            continue; // every entry has the same byte here
        }
        let mut sum = 0u32;
        for n in c.iter_mut() {
            let here = *n;
            *n = sum;
            sum += here;
        }
        for e in v.iter() {
            let d = ((e.0 >> (8 * b)) & 0xff) as usize;
            buf[c[d] as usize] = *e;
            c[d] += 1;
        }
        std::mem::swap(v, &mut buf);
    }
}

/// Cached accumulators per window, windows in ascending order (few are open at a time).
#[derive(Debug)]
pub(crate) struct AccCache<Acc> {
    windows: Vec<(Window, Slot<Acc>)>,
    entries: usize,
    key_bytes: usize,
    /// Entries and key bytes of the last slot taken: a new slot reserves as much.
    last_entries: usize,
    last_key_bytes: usize,
}

impl<Acc> Default for AccCache<Acc> {
    fn default() -> Self {
        AccCache {
            windows: Vec::new(),
            entries: 0,
            key_bytes: 0,
            last_entries: 0,
            last_key_bytes: 0,
        }
    }
}

impl<Acc> AccCache<Acc> {
    /// Whether the cache is past [`MAX_CACHED_ENTRIES`] or [`MAX_CACHED_KEY_BYTES`].
    pub(crate) fn is_full(&self) -> bool {
        self.entries >= MAX_CACHED_ENTRIES || self.key_bytes >= MAX_CACHED_KEY_BYTES
    }

    /// (key, window) entries held.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    fn slot(&mut self, w: Window) -> &mut Slot<Acc> {
        // Records mostly reach the newest windows: search from the back.
        let pos = match self.windows.iter().rposition(|(x, _)| *x <= w) {
            Some(p) if self.windows[p].0 == w => p,
            found => {
                let at = found.map_or(0, |p| p + 1);
                let slot = Slot::with_capacity(self.last_entries, self.last_key_bytes);
                self.windows.insert(at, (w, slot));
                at
            }
        };
        &mut self.windows[pos].1
    }

    /// Folds into the accumulator of `key` in each of `windows` (created by `create` where
    /// new) with `add`.
    pub(crate) fn add(
        &mut self,
        windows: &[Window],
        key: &[u8],
        mut create: impl FnMut() -> Acc,
        mut add: impl FnMut(&mut Acc),
    ) {
        let (hash, pre) = (fx_hash(key), prefix(key));
        for &w in windows {
            let (acc, new) = self.slot(w).entry(key, hash, pre, &mut create);
            add(acc);
            if new {
                self.entries += 1;
                self.key_bytes += key.len();
            }
        }
    }

    /// The lowest cached window.
    pub(crate) fn first(&self) -> Option<Window> {
        self.windows.first().map(|(w, _)| *w)
    }

    /// Removes and returns the slot of `w`.
    pub(crate) fn take(&mut self, w: Window) -> Option<Slot<Acc>> {
        let pos = self.windows.iter().position(|(x, _)| *x == w)?;
        let (_, slot) = self.windows.remove(pos);
        self.entries -= slot.len();
        self.key_bytes -= slot.keys.len();
        self.last_entries = slot.len();
        self.last_key_bytes = slot.keys.len();
        Some(slot)
    }

    /// Removes and returns every slot, windows ascending.
    pub(crate) fn drain(&mut self) -> Vec<(Window, Slot<Acc>)> {
        self.entries = 0;
        self.key_bytes = 0;
        std::mem::take(&mut self.windows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_again_across_growth_and_sorted_by_key_bytes() {
        let mut c: AccCache<u64> = AccCache::default();
        let (a, b) = (Window::new(0, 10), Window::new(5, 15));
        for round in 0..3u64 {
            for k in (0..1000u32).rev() {
                c.add(
                    &[b, a],
                    &k.to_be_bytes(),
                    || 0,
                    |acc| *acc += u64::from(k) + round,
                );
            }
        }
        assert_eq!(c.entries(), 2000);
        assert_eq!(c.first(), Some(a));
        let mut slot = c.take(a).unwrap();
        assert_eq!(c.entries(), 1000);
        let order = slot.sorted();
        let keys: Vec<u32> = order
            .iter()
            .map(|&i| u32::from_be_bytes(slot.key(i as usize).try_into().unwrap()))
            .collect();
        assert_eq!(keys, (0..1000).collect::<Vec<_>>());
        let accs = slot.take_accs();
        for &i in &order {
            let k = u64::from(u32::from_be_bytes(slot.key(i as usize).try_into().unwrap()));
            assert_eq!(accs[i as usize], 3 * k + 3);
        }
        assert_eq!(c.drain().len(), 1);
        assert_eq!(c.entries(), 0);
        assert!(c.first().is_none());
    }

    #[test]
    fn prefixes_sort_like_the_bytes() {
        let keys: [&[u8]; 12] = [
            b"",
            b"\0",
            b"a",
            b"a\0",
            b"a\0\x01",
            b"ab",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefghi",
            b"abcdefgi",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\0",
        ];
        let mut c: AccCache<u8> = AccCache::default();
        let w = Window::new(0, 1);
        for k in keys.iter().rev() {
            c.add(&[w], k, || 0, |_| {});
        }
        for k in keys {
            c.add(&[w], k, || 0, |a| *a += 1);
        }
        assert_eq!(c.entries(), keys.len());
        let mut slot = c.take(w).unwrap();
        let got: Vec<&[u8]> = slot
            .sorted()
            .iter()
            .map(|&i| slot.key(i as usize))
            .collect();
        assert_eq!(got, keys);
        assert!(slot.take_accs().iter().all(|&a| a == 1));
    }

    #[test]
    fn the_radix_sort_equals_a_stable_comparison_sort() {
        let mut rng = crate::test_lcg(7);
        for n in [0usize, 1, 63, 64, 65, 300, 5000] {
            for spread in [0u32, 3, 8, 24, 64] {
                let mut v: Vec<(u64, u32)> = (0..n as u32)
                    .map(|i| {
                        let r = (rng() << 33) ^ rng();
                        let p = if spread == 64 {
                            r
                        } else {
                            r & ((1u64 << spread) - 1)
                        };
                        (p.rotate_left(40), i)
                    })
                    .collect();
                let mut want = v.clone();
                want.sort_by_key(|e| e.0);
                sort_by_prefix(&mut v);
                assert_eq!(v, want, "n {n}, spread {spread}");
            }
        }
    }

    #[test]
    fn windows_stay_in_ascending_order_whatever_the_arrival() {
        let mut c: AccCache<u8> = AccCache::default();
        for s in [20, 0, 40, 10, 30, 0, 40] {
            c.add(&[Window::new(s, s + 10)], b"k", || 0, |_| {});
        }
        let starts: Vec<i64> = c.drain().iter().map(|(w, _)| w.start).collect();
        assert_eq!(starts, [0, 10, 20, 30, 40]);
    }
}
