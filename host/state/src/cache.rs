//! The working set of keyed state and what it counts against the memory budget (see the
//! [crate docs](crate#memory-budget)).

use super::*;

/// Bytes the working set counts per cached entry on top of its key and value bytes: two
/// hash-table buckets (key, slot and control byte; 162 bytes on x86-64). A table grows by
/// doubling once it is 7/8 full, so it holds between 8/7 and 16/7 buckets per entry: two
/// cover it except just after a growth, when it may hold up to 14 % more than counted
/// (less whatever of the counted key and value bytes sits inline in the bucket, up to 24
/// bytes each).
pub const ENTRY_OVERHEAD_BYTES: usize =
    2 * (std::mem::size_of::<Bytes>() + std::mem::size_of::<Slot>() + 1);

/// Bytes the working set counts per namespace with cached entries, on top of the
/// namespace bytes: its own hash table header, its key in the table of namespaces, and
/// the table's first allocation.
pub const NAMESPACE_OVERHEAD_BYTES: usize = 256;

/// Entry keys dropped from a cache since the last view or spill (inline up to 24 bytes,
/// hashed with foldhash), each with its stored value as of its drop (`None`: absent).
pub(crate) type ChangedKeys = HashMap<Bytes, Option<Bytes>, foldhash::fast::RandomState>;

/// Bytes the change tracking of incremental snapshots counts per changed key on top of
/// its key and value bytes: two hash-table buckets (key, value and control byte), as
/// [`ENTRY_OVERHEAD_BYTES`] counts them.
pub(crate) const CHANGED_OVERHEAD_BYTES: usize =
    2 * (std::mem::size_of::<Bytes>() + std::mem::size_of::<Option<Bytes>>() + 1);

/// One sorted run of changed keys spilled to a file next to the database (design §8.1):
/// `kv-delta/1` changes ([`payload::push_change`]) of table keys in ascending order, each
/// with its stored value as of its drop. The file is removed when the run is dropped.
#[derive(Debug)]
pub(crate) struct SpillRun {
    pub(crate) path: PathBuf,
}

impl Drop for SpillRun {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads a [`SpillRun`] one change at a time.
pub(crate) struct RunReader {
    file: std::io::BufReader<std::fs::File>,
    /// The change at the head: table key and tagged value (`kv-delta/1`'s second item).
    pub(crate) head: Option<(Vec<u8>, Vec<u8>)>,
}

impl RunReader {
    /// Opens `run` and reads its first change.
    pub(crate) fn open(run: &SpillRun) -> std::io::Result<Self> {
        let file = std::fs::File::open(&run.path)?;
        let mut r = RunReader {
            file: std::io::BufReader::with_capacity(16 << 10, file),
            head: None,
        };
        r.advance()?;
        Ok(r)
    }

    /// Reads the next change into `head` (`None` at the end).
    pub(crate) fn advance(&mut self) -> std::io::Result<()> {
        use std::io::Read;
        let mut len = [0u8; 4];
        match self.file.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.head = None;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let mut key = vec![0u8; u32::from_le_bytes(len) as usize];
        self.file.read_exact(&mut key)?;
        self.file.read_exact(&mut len)?;
        let mut value = vec![0u8; u32::from_le_bytes(len) as usize];
        self.file.read_exact(&mut value)?;
        self.head = Some((key, value));
        Ok(())
    }
}

/// Smallest redb page cache a budget leaves redb, bytes (256 KiB).
pub(crate) const MIN_REDB_CACHE_BYTES: u64 = 256 << 10;

/// Bytes the working set counts for `key` cached with `value`.
pub(crate) fn entry_cost(key_len: usize, value: Option<&Bytes>) -> usize {
    key_len + value.map_or(0, |v| v.len()) + ENTRY_OVERHEAD_BYTES
}

/// Key or value bytes of the working set, inline up to 24 bytes: a lookup compares the
/// key inside the hash table's bucket and reads a small value from the same slot instead
/// of chasing two heap pointers (cache misses dominated the keyed hot path).
pub(crate) type Bytes = smallvec::SmallVec<[u8; 24]>;

/// Key bytes -> slot, hashed with foldhash (SipHash dominated the keyed hot path).
///
/// Every key in it lies in a shard this subtask owns: keys enter only through a call that
/// checked them ([`KeyedState::check_owned`]) or through a restore that checks each key
/// against its shard. So a key found here needs no second check, which saves the shard
/// hash on every hit at parallelism above 1.
///
/// hashbrown's map (std's is the same one) with the
/// [`crate::table_alloc::TableAlloc`] allocator, which maps a large table's pages ahead.
pub(crate) type SlotMap =
    hashbrown::HashMap<Bytes, Slot, foldhash::fast::RandomState, crate::table_alloc::TableAlloc>;

/// The working set of one state: a map per namespace, keyed by the raw key bytes, so a
/// hit costs one hash lookup with no composite key built (those are made only for
/// misses and flushes).
///
/// It also knows which namespaces may hold entries in redb (`in_db`): the database starts
/// empty with every attempt and fills only by flushes and restores, so a key of any other
/// namespace (a new window, a new timer time) is absent without a database read, and
/// deleting it leaves no tombstone. This keeps the working set at the live entries plus
/// the tombstones of one checkpoint interval.
#[derive(Default)]
pub(crate) struct StateCache {
    pub(crate) plain: SlotMap,
    pub(crate) namespaced: HashMap<Vec<u8>, SlotMap, foldhash::fast::RandomState>,
    pub(crate) in_db: std::collections::HashSet<Vec<u8>, foldhash::fast::RandomState>,
    /// The table held entries when the database was opened: any namespace may be there.
    pub(crate) opened_non_empty: bool,
    /// Bytes this cache counts against the budget (see [`entry_cost`]).
    pub(crate) bytes: usize,
    /// Whether drops are recorded in `dropped` (incremental snapshots are tracking).
    pub(crate) track: bool,
    /// Entry keys (`namespace length (u32 BE) | namespace | key`) whose slot left the
    /// cache since the last view or spill while it may hold a change the next delta must
    /// carry (a delete, or an eviction of a slot written since the view, whose value is in
    /// redb), with the stored value as of the drop.
    pub(crate) dropped: ChangedKeys,
    /// Bytes `dropped` counts (key and value bytes plus [`CHANGED_OVERHEAD_BYTES`] each).
    pub(crate) dropped_bytes: usize,
    /// Changes spilled since the last view, oldest first (a later run's change of a key
    /// supersedes an earlier one's): the next delta view takes them.
    pub(crate) runs: Vec<SpillRun>,
}

impl StateCache {
    pub(crate) fn map(&self, namespace: &[u8]) -> Option<&SlotMap> {
        if namespace.is_empty() {
            Some(&self.plain)
        } else {
            self.namespaced.get(namespace)
        }
    }

    pub(crate) fn map_mut(&mut self, namespace: &[u8]) -> &mut SlotMap {
        if namespace.is_empty() {
            return &mut self.plain;
        }
        if !self.namespaced.contains_key(namespace) {
            self.namespaced
                .insert(namespace.to_vec(), SlotMap::default());
            self.bytes += namespace.len() + NAMESPACE_OVERHEAD_BYTES;
        }
        self.namespaced.get_mut(namespace).expect("just inserted")
    }

    /// Inserts a new slot (the key must not be cached), counting it.
    pub(crate) fn insert(&mut self, namespace: &[u8], key: Bytes, slot: Slot) {
        let cost = entry_cost(key.len(), slot.value.as_ref());
        self.map_mut(namespace).insert(key, slot);
        self.bytes += cost;
    }

    pub(crate) fn len(&self) -> usize {
        self.plain.len() + self.namespaced.values().map(SlotMap::len).sum::<usize>()
    }

    /// Drops every cached entry (the redb namespace knowledge stays) and what was tracked.
    pub(crate) fn clear(&mut self) {
        self.plain.clear();
        self.namespaced.clear();
        self.bytes = 0;
        self.untrack();
    }

    /// Records that the slot of (namespace, key) left the cache, if tracking.
    pub(crate) fn record_drop(
        track: bool,
        dropped: &mut ChangedKeys,
        dropped_bytes: &mut usize,
        namespace: &[u8],
        key: &[u8],
        value: Option<&Bytes>,
    ) {
        if track {
            let mut k = Bytes::with_capacity(4 + namespace.len() + key.len());
            k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
            k.extend_from_slice(namespace);
            k.extend_from_slice(key);
            let len = k.len() + value.map_or(0, |v| v.len());
            match dropped.insert(k, value.cloned()) {
                Some(old) => {
                    *dropped_bytes =
                        *dropped_bytes + value.map_or(0, |v| v.len()) - old.map_or(0, |v| v.len());
                }
                None => *dropped_bytes += len + CHANGED_OVERHEAD_BYTES,
            }
        }
    }

    /// Forgets the spilled changes (tracking restarts or stops), removing their files.
    pub(crate) fn forget_spill(&mut self) {
        self.runs.clear();
    }

    /// Starts tracking changes from now: no slot is fresh, nothing dropped.
    pub(crate) fn track_from_now(&mut self) {
        // A full snapshot holds every cached key that has a value.
        for s in self.plain.values_mut() {
            s.fresh = false;
            s.handed = true;
        }
        for m in self.namespaced.values_mut() {
            for s in m.values_mut() {
                s.fresh = false;
                s.handed = true;
            }
        }
        self.track_restored();
    }

    /// Starts tracking changes from now, for a cache that holds only entries
    /// [`Self::put_restored`] put after a [`Self::clear`] (each already not fresh and
    /// handed): [`Self::track_from_now`] without its pass over every slot, which costs
    /// about a twentieth of a large restore.
    pub(crate) fn track_restored(&mut self) {
        self.dropped = ChangedKeys::default();
        self.dropped_bytes = 0;
        self.forget_spill();
        self.track = true;
    }

    /// Stops tracking changes.
    pub(crate) fn untrack(&mut self) {
        self.track = false;
        self.dropped = ChangedKeys::default();
        self.dropped_bytes = 0;
        self.forget_spill();
    }

    /// Drops clean entries until the cache counts at most `target` bytes (or no clean
    /// entry is left). Arbitrary order: hash order, which is random per process.
    pub(crate) fn evict_to(&mut self, target: usize) {
        let mut bytes = self.bytes;
        let Self {
            plain,
            namespaced,
            track,
            dropped,
            dropped_bytes,
            ..
        } = self;
        let mut keep = |bytes: &mut usize, ns: &[u8], k: &Bytes, s: &mut Slot| {
            if *bytes <= target || s.dirty {
                return true;
            }
            *bytes -= entry_cost(k.len(), s.value.as_ref());
            if s.fresh {
                Self::record_drop(*track, dropped, dropped_bytes, ns, k, s.value.as_ref());
            }
            false
        };
        plain.retain(|k, s| keep(&mut bytes, &[], k, s));
        namespaced.retain(|ns, m| {
            m.retain(|k, s| keep(&mut bytes, ns, k, s));
            if m.is_empty() {
                bytes -= ns.len() + NAMESPACE_OVERHEAD_BYTES;
                false
            } else {
                true
            }
        });
        self.bytes = bytes;
    }

    /// Whether redb may hold entries of `namespace`.
    pub(crate) fn maybe_in_db(&self, namespace: &[u8]) -> bool {
        self.opened_non_empty || self.in_db.contains(namespace)
    }

    /// Caches `value` for `key` as a restore does: written (dirty: redb does not hold it)
    /// and handed (the restored chain holds it), replacing any slot of the key.
    pub(crate) fn put_restored(&mut self, namespace: &[u8], key: &[u8], value: &[u8]) {
        self.put_restored_owned(namespace, Bytes::from_slice(key), Bytes::from_slice(value));
    }

    /// [`Self::put_restored`] with the key and value already copied out of the payload.
    pub(crate) fn put_restored_owned(&mut self, namespace: &[u8], key: Bytes, value: Bytes) {
        let slot = Slot {
            value: Some(value),
            dirty: true,
            in_db: false,
            fresh: false,
            handed: true,
        };
        let cost = entry_cost(key.len(), slot.value.as_ref());
        let key_len = key.len();
        if let Some(old) = self.map_mut(namespace).insert(key, slot) {
            self.bytes -= entry_cost(key_len, old.value.as_ref());
        }
        self.bytes += cost;
    }

    /// Removes the slot of `key` (a delete of a value redb never held).
    pub(crate) fn remove(&mut self, namespace: &[u8], key: &[u8]) {
        let removed = if namespace.is_empty() {
            self.plain.remove(key)
        } else if let Some(m) = self.namespaced.get_mut(namespace) {
            let removed = m.remove(key);
            if m.is_empty() {
                self.namespaced.remove(namespace);
                self.bytes -= namespace.len() + NAMESPACE_OVERHEAD_BYTES;
            }
            removed
        } else {
            None
        };
        if let Some(slot) = removed {
            self.bytes -= entry_cost(key.len(), slot.value.as_ref());
            Self::record_drop(
                self.track && slot.handed,
                &mut self.dropped,
                &mut self.dropped_bytes,
                namespace,
                key,
                None,
            );
        }
    }

    pub(crate) fn any_dirty(&self) -> bool {
        self.plain.values().any(|s| s.dirty)
            || self
                .namespaced
                .values()
                .any(|m| m.values().any(|s| s.dirty))
    }
}

/// [`composite`], inline up to 24 bytes.
pub(crate) fn composite_inline(shard: u32, namespace: &[u8], key: &[u8]) -> Bytes {
    let mut k = Bytes::with_capacity(8 + namespace.len() + key.len());
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
    k.extend_from_slice(namespace);
    k.extend_from_slice(key);
    k
}

/// The table key of (namespace, key) in shard `shard`.
pub(crate) fn composite(shard: u32, namespace: &[u8], key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + namespace.len() + key.len());
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
    k.extend_from_slice(namespace);
    k.extend_from_slice(key);
    k
}

pub(crate) struct Slot {
    pub(crate) value: Option<Bytes>,
    pub(crate) dirty: bool,
    /// redb may hold a value for this key (so a delete must reach it).
    pub(crate) in_db: bool,
    /// Written since the last snapshot view (incremental snapshots: the next delta view
    /// hands it over, see [`KeyedState::delta_view`]).
    pub(crate) fresh: bool,
    /// A snapshot may hold this key as present: a view handed it over, or it came from
    /// redb, or a blind write created it in a namespace redb may hold (so the key may be
    /// in the chain). A delete of a slot that is not is not recorded: no view ever saw the
    /// key (a window's state written and cleared between two barriers).
    pub(crate) handed: bool,
}
