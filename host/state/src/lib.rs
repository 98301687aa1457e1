//! Keyed state of one operator subtask (design §3.4, §8).
//!
//! [`KeyedState`] keeps a working set in memory and writes it to a redb database in one
//! transaction on [`KeyedState::flush`] (at a full snapshot's barrier, or when the working
//! set exceeds its budget), reading through to redb on a miss. With incremental snapshots
//! and no budget nothing flushes: a delta view copies the changed entries, background
//! compactions make the full payloads, and the database stays empty. A redb
//! read-modify-write per record would cap throughput near 1.2 M records/s (design §8), so
//! the hot path never touches redb per record.
//!
//! Every key is routed to its StateShard (`xxh3-64(key) mod stateShardCount`); a key whose
//! shard this subtask does not own is refused with [`StateError::KeyOutsideShards`], which
//! the plugin host turns into a trap.
//!
//! Storage layout: one redb table per declared state, named after it. A table key is
//! `shard (u32 BE) | namespace length (u32 BE) | namespace | key`, so the entries of one
//! shard are contiguous (snapshot and restore move shards, not keys, design §10.5). Value
//! states store the value bytes; list and map states store their whole collection per key
//! in a length-prefixed encoding ([`codec`]).
//!
//! ## State TTL
//!
//! A state may have a time-to-live ([`StateConfig::ttl_ms`], job-file `state_ttl_ms`,
//! issue 14 item 7). Its stored values then start with the processing time of their last
//! write (`u64` big-endian milliseconds since the Unix epoch, 8 bytes) before the bytes the
//! plugin wrote; the prefix never reaches the plugin. The semantics are Flink's defaults
//! (`StateTtlConfig` with `OnCreateAndWrite`, `NeverReturnExpired`, full-snapshot
//! cleanup): a write (put, append, map update) restarts the entry's lifetime, reads do
//! not; an entry whose `write time + ttl <= now` reads as absent; every full snapshot and
//! every compaction leaves expired entries out (a delta, those among its changed keys) and
//! they are then removed from the working set and redb, so neither checkpoints nor the
//! state keep them (see [`KeyedState::remove_expired_later`]). Lists and maps expire
//! as a whole per key and namespace. Time is processing time ([`KeyedState::set_clock`]
//! replaces the system clock in tests).
//!
//! ## Memory budget
//!
//! [`StateConfig::memory_bytes`] bounds the subtask's state memory (job file
//! `state_memory_bytes`, split over the job's stateful subtasks; issue 14 item 4). Three
//! quarters go to the working set, one quarter to redb's page cache (which redb keeps at
//! or below its configured size, read and write buffers together). The working set counts
//! per cached entry its key and value bytes plus [`ENTRY_OVERHEAD_BYTES`] (the hash
//! table's bucket at its worst-case load, see there), and per namespace its bytes plus
//! [`NAMESPACE_OVERHEAD_BYTES`]. Whenever an operation leaves the working set above its
//! share, the state writes every dirty entry to redb (one non-durable transaction) and
//! drops clean entries until the working set is at most half its share; later reads of
//! dropped entries go to redb. The hash tables keep their capacity, so the memory they
//! hold is that of the largest working set, which the budget bounds. Without a budget
//! (`None`) the working set keeps every entry touched since the attempt began, and redb
//! its default 1 GiB cache.

pub mod codec;

use nop_stream_api::{StateDescriptor, StateKind, StateShardId};
use nop_stream_checkpoint::payload;
use nop_stream_core::shard_of;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::HashMap;
use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Errors of the state backend.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A key hashed to a shard this subtask does not own (a routing bug or a plugin
    /// touching another key's state).
    #[error(
        "key {key} belongs to state shard {shard}, outside the shards {owned:?} this subtask owns"
    )]
    KeyOutsideShards {
        /// Printable prefix of the key.
        key: String,
        /// The key's shard.
        shard: StateShardId,
        /// Shards owned by the subtask.
        owned: Range<u32>,
    },
    /// A state handle that `open` never returned.
    #[error("unknown state handle {0}")]
    UnknownHandle(u32),
    /// A state used with an operation of another kind (e.g. `list-append` on a value state).
    #[error("state `{name}` is a {actual:?} state, used as a {expected:?} state")]
    WrongKind {
        /// State name.
        name: String,
        /// Declared kind.
        actual: StateKind,
        /// Kind the operation needs.
        expected: StateKind,
    },
    /// Malformed flat buffers (ends out of range or decreasing).
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// Which buffer.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A stored collection could not be decoded.
    #[error("corrupt stored value in state `{0}`")]
    Corrupt(String),
    /// The consumer of a streamed snapshot ([`KeyedState::snapshot_each`]) failed.
    #[error("snapshot of state `{state}`: {message}")]
    Snapshot {
        /// State whose shard was being handed over.
        state: String,
        /// The consumer's message.
        message: String,
    },
    /// The database failed.
    #[error("state database {path}: {message}")]
    Database {
        /// Database file.
        path: PathBuf,
        /// redb's message.
        message: String,
    },
}

/// The entries of one state in one shard, as a snapshot payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSnapshot {
    /// The shard.
    pub shard: StateShardId,
    /// State handle (index into the declared states).
    pub state: u32,
    /// Number of entries (of a delta: changes, puts and deletes).
    pub entries: u64,
    /// Payload: full (`kv-lp/1`) or, when `delta`, the changes since the subtask's
    /// previous snapshot (`kv-delta/1`); see [`nop_stream_checkpoint::payload`].
    pub payload: Vec<u8>,
    /// Whether `payload` is a delta (`kv-delta/1`) rather than a full payload (`kv-lp/1`).
    pub delta: bool,
}

impl ShardSnapshot {
    /// The codec of its payload: [`payload::KV_DELTA_CODEC`] for a delta, else
    /// [`payload::KV_CODEC`].
    pub fn codec(&self) -> &'static str {
        if self.delta {
            payload::KV_DELTA_CODEC
        } else {
            payload::KV_CODEC
        }
    }
}

/// A frozen, point-in-time view of one subtask's keyed state, made by
/// [`KeyedState::snapshot_view`] for an asynchronous snapshot: an open redb read
/// transaction (an MVCC snapshot) plus what the scan needs to know (state names, TTLs,
/// owned shards, the processing time expiry is judged at). It is `Send`, and holding it
/// blocks neither writes nor flushes of the state it came from; redb keeps the pages of
/// its version until it is dropped (so the database file may grow by up to the state's
/// size while one is held).
pub struct SnapshotView {
    txn: redb::ReadTransaction,
    path: PathBuf,
    names: Vec<String>,
    ttl: Vec<Option<u64>>,
    owned: Range<u32>,
    now: u64,
    /// A delta view ([`KeyedState::delta_view`]): per state, the table keys written or
    /// deleted since the previous view, in no order, each with its value as of the view
    /// or where to read it. `None`: a full view.
    delta: Option<Vec<Vec<(Bytes, Change)>>>,
}

impl std::fmt::Debug for SnapshotView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotView")
            .field("path", &self.path)
            .field("owned", &self.owned)
            .field("now", &self.now)
            .field("delta", &self.delta.is_some())
            .finish_non_exhaustive()
    }
}

/// Table keys of TTL entries a [`SnapshotView::write`] left out because they had expired;
/// hand them to [`KeyedState::remove_expired_later`] so redb drops them too.
#[derive(Debug, Default)]
pub struct ExpiredKeys {
    /// (state index, table key).
    keys: Vec<(usize, Vec<u8>)>,
    /// Processing time (ms since the Unix epoch) they were judged expired at.
    now: u64,
}

impl ExpiredKeys {
    /// Number of expired entries found.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether none were found.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl SnapshotView {
    /// Scans every owned shard of every state of the view and hands one payload per
    /// (shard, state) that holds entries to `consume`, in state then shard order, each a
    /// sequence of length-prefixed (`namespace length | namespace | key`, value) pairs in
    /// key order (codec `kv-lp/1`, see [`codec`]); one shard's payload is in memory at a
    /// time. Values are as stored (a TTL state's with their write-time prefix); entries of
    /// TTL states expired at the view's time are left out and returned, for
    /// [`KeyedState::remove_expired_later`]. Consumes the view (its read transaction ends
    /// here).
    ///
    /// # Errors
    /// A database failure, or [`StateError::Snapshot`] with the message `consume`
    /// returned (the scan stops there).
    pub fn write(
        mut self,
        consume: &mut dyn FnMut(ShardSnapshot) -> std::result::Result<(), String>,
    ) -> Result<ExpiredKeys> {
        let mut expired = ExpiredKeys {
            keys: Vec::new(),
            now: self.now,
        };
        if let Some(mut delta) = self.delta.take() {
            for keys in &mut delta {
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            }
            self.write_delta(&delta, consume)?;
            return Ok(expired);
        }
        for (i, name) in self.names.iter().enumerate() {
            let ttl = self.ttl[i];
            let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
            let table = match self.txn.open_table(def) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(db_err(&self.path, e)),
            };
            for shard in self.owned.clone() {
                let prefix = shard.to_be_bytes();
                let mut payload = Vec::new();
                let mut entries = 0u64;
                let range = table
                    .range::<&[u8]>(prefix.as_slice()..)
                    .map_err(|e| db_err(&self.path, e))?;
                for entry in range {
                    let (k, v) = entry.map_err(|e| db_err(&self.path, e))?;
                    let k = k.value();
                    if !k.starts_with(&prefix) {
                        break;
                    }
                    if live(v.value(), ttl, self.now).is_none() {
                        expired.keys.push((i, k.to_vec()));
                        continue;
                    }
                    codec::push_item(&mut payload, &k[4..]);
                    codec::push_item(&mut payload, v.value());
                    entries += 1;
                }
                if entries > 0 {
                    consume(ShardSnapshot {
                        shard: StateShardId(shard),
                        state: i as u32,
                        entries,
                        payload,
                        delta: false,
                    })
                    .map_err(|message| StateError::Snapshot {
                        state: name.clone(),
                        message,
                    })?;
                }
            }
        }
        Ok(expired)
    }

    /// Whether this is a delta view ([`KeyedState::delta_view`]).
    pub fn is_delta(&self) -> bool {
        self.delta.is_some()
    }

    /// [`Self::write`] of a delta view: per state and shard, one `kv-delta/1` payload of
    /// the changed keys, each a put of its value as of the view or, when the view holds
    /// no live value (deleted, or expired at the view's time), a delete.
    fn write_delta(
        &self,
        delta: &[Vec<(Bytes, Change)>],
        consume: &mut dyn FnMut(ShardSnapshot) -> std::result::Result<(), String>,
    ) -> Result<()> {
        for (i, name) in self.names.iter().enumerate() {
            let keys = &delta[i];
            if keys.is_empty() {
                continue;
            }
            let ttl = self.ttl[i];
            let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
            let table = match self.txn.open_table(def) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(db_err(&self.path, e)),
            };
            // Keys are sorted, so each shard's keys are contiguous.
            let mut rest = &keys[..];
            while let Some((first, _)) = rest.first() {
                let prefix: [u8; 4] = first[..4].try_into().expect("table keys hold a shard");
                let n = rest
                    .iter()
                    .take_while(|(k, _)| k.starts_with(&prefix))
                    .count();
                let (group, tail) = rest.split_at(n);
                rest = tail;
                let mut payload = Vec::new();
                for (k, change) in group {
                    let stored;
                    let value = match change {
                        Change::Cached(v) => v.as_deref(),
                        Change::Stored => {
                            stored = match &table {
                                Some(t) => {
                                    t.get(k.as_slice()).map_err(|e| db_err(&self.path, e))?
                                }
                                None => None,
                            };
                            stored.as_ref().map(|v| v.value())
                        }
                    };
                    let value = value.filter(|v| live(v, ttl, self.now).is_some());
                    payload::push_change(&mut payload, &k[4..], value);
                }
                consume(ShardSnapshot {
                    shard: StateShardId(u32::from_be_bytes(prefix)),
                    state: i as u32,
                    entries: n as u64,
                    payload,
                    delta: true,
                })
                .map_err(|message| StateError::Snapshot {
                    state: name.clone(),
                    message,
                })?;
            }
        }
        Ok(())
    }
}

/// Folds chains of snapshot payloads into full payloads off the task thread: the
/// background compaction of incremental snapshots (issue 14 item 4, "full snapshots
/// compacted in the background"). Made by [`KeyedState::compactor`]; `Send`, and
/// independent of the state it came from (it reads nothing but the payloads it is given).
/// TTL states' entries expired at its time are left out and listed, as a full view's
/// scan leaves them out ([`Self::into_expired`]).
#[derive(Debug)]
pub struct Compactor {
    ttl: Vec<Option<u64>>,
    expired: ExpiredKeys,
}

impl Compactor {
    /// Folds one (state, shard) chain (`chain`: its payloads with their codecs, a full
    /// payload then its deltas, oldest first, as a manifest lists them) into one full
    /// `kv-lp/1` payload: each key's last value, in key order, without deletes and without
    /// entries of a TTL state expired at the compactor's time. `None` when nothing is
    /// left.
    ///
    /// # Errors
    /// [`StateError::Snapshot`] naming `state_name`: an unknown codec or a malformed
    /// payload ([`payload::fold`]).
    pub fn fold(
        &mut self,
        state: u32,
        state_name: &str,
        shard: StateShardId,
        chain: &[(&str, &[u8])],
    ) -> Result<Option<ShardSnapshot>> {
        let folded = payload::fold(chain).map_err(|message| StateError::Snapshot {
            state: state_name.to_owned(),
            message,
        })?;
        let ttl = self.ttl.get(state as usize).copied().flatten();
        let mut out = Vec::new();
        let mut entries = 0u64;
        for (k, v) in folded {
            if live(v, ttl, self.expired.now).is_none() {
                let mut key = Vec::with_capacity(4 + k.len());
                key.extend_from_slice(&shard.0.to_be_bytes());
                key.extend_from_slice(k);
                self.expired.keys.push((state as usize, key));
                continue;
            }
            payload::push_item(&mut out, k);
            payload::push_item(&mut out, v);
            entries += 1;
        }
        Ok((entries > 0).then_some(ShardSnapshot {
            shard,
            state,
            entries,
            payload: out,
            delta: false,
        }))
    }

    /// The expired entries the folds left out, for [`KeyedState::remove_expired_later`].
    pub fn into_expired(self) -> ExpiredKeys {
        self.expired
    }
}

/// Result alias of this crate.
pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// Settings of one subtask's keyed state.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// redb database file (created if missing).
    pub path: PathBuf,
    /// `stateShardCount` of the vertex.
    pub shard_count: u32,
    /// Shards this subtask owns.
    pub owned: Range<u32>,
    /// Declared states; handles are indexes into this list.
    pub states: Vec<StateDescriptor>,
    /// Memory budget of this subtask's state in bytes: three quarters for the working
    /// set, one quarter for redb's page cache (see the [module docs](self#memory-budget)).
    /// `None` (the default): no budget, the working set holds every entry touched since
    /// the attempt began and redb caches up to 1 GiB.
    pub memory_bytes: Option<u64>,
    /// Time-to-live in milliseconds per declared state, by handle (same order as
    /// `states`); `None` or a missing entry: the state never expires. Default: empty (no
    /// TTL). See the [module docs](self#state-ttl).
    pub ttl_ms: Vec<Option<u64>>,
}

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

/// Entry keys dropped from a cache since the last view, inline up to 24 bytes, hashed
/// with foldhash.
type ChangedKeys = HashSet<Bytes, foldhash::fast::RandomState>;

/// Where a delta view finds a changed key's value.
#[derive(Debug, Clone)]
enum Change {
    /// The working set held it at the view: its stored value, or `None` (deleted).
    Cached(Option<Bytes>),
    /// It had left the working set (after a flush): read it from the view's transaction.
    Stored,
}

/// Bytes the change tracking of incremental snapshots counts per changed key on top of
/// its bytes (the hash set's bucket holds the inline key: 32 bytes and a control byte; a
/// longer key's heap allocation header instead of nothing).
const CHANGED_OVERHEAD_BYTES: usize = 40;

/// Smallest redb page cache a budget leaves redb, bytes (256 KiB).
const MIN_REDB_CACHE_BYTES: u64 = 256 << 10;

/// Bytes the working set counts for `key` cached with `value`.
fn entry_cost(key_len: usize, value: Option<&Bytes>) -> usize {
    key_len + value.map_or(0, |v| v.len()) + ENTRY_OVERHEAD_BYTES
}

/// Key or value bytes of the working set, inline up to 24 bytes: a lookup compares the
/// key inside the hash table's bucket and reads a small value from the same slot instead
/// of chasing two heap pointers (cache misses dominated the keyed hot path).
type Bytes = smallvec::SmallVec<[u8; 24]>;

/// Key bytes -> slot, hashed with foldhash (SipHash dominated the keyed hot path).
///
/// Every key in it lies in a shard this subtask owns: keys enter only through a call that
/// checked them ([`KeyedState::check_owned`]) or through a restore that checks each key
/// against its shard. So a key found here needs no second check, which saves the shard
/// hash on every hit at parallelism above 1.
type SlotMap = HashMap<Bytes, Slot, foldhash::fast::RandomState>;

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
struct StateCache {
    plain: SlotMap,
    namespaced: HashMap<Vec<u8>, SlotMap, foldhash::fast::RandomState>,
    in_db: std::collections::HashSet<Vec<u8>, foldhash::fast::RandomState>,
    /// The table held entries when the database was opened: any namespace may be there.
    opened_non_empty: bool,
    /// Bytes this cache counts against the budget (see [`entry_cost`]).
    bytes: usize,
    /// Whether drops are recorded in `dropped` (incremental snapshots are tracking).
    track: bool,
    /// Entry keys (`namespace length (u32 BE) | namespace | key`) whose slot left the
    /// cache since the last view while it may hold a change the next delta must carry:
    /// a delete, or an eviction of a slot written since the view (its value is in redb).
    dropped: ChangedKeys,
    /// Bytes `dropped` counts (key bytes plus [`CHANGED_OVERHEAD_BYTES`] each).
    dropped_bytes: usize,
}

impl StateCache {
    fn map(&self, namespace: &[u8]) -> Option<&SlotMap> {
        if namespace.is_empty() {
            Some(&self.plain)
        } else {
            self.namespaced.get(namespace)
        }
    }

    fn map_mut(&mut self, namespace: &[u8]) -> &mut SlotMap {
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
    fn insert(&mut self, namespace: &[u8], key: Bytes, slot: Slot) {
        let cost = entry_cost(key.len(), slot.value.as_ref());
        self.map_mut(namespace).insert(key, slot);
        self.bytes += cost;
    }

    fn len(&self) -> usize {
        self.plain.len() + self.namespaced.values().map(HashMap::len).sum::<usize>()
    }

    /// Drops every cached entry (the redb namespace knowledge stays) and what was tracked.
    fn clear(&mut self) {
        self.plain.clear();
        self.namespaced.clear();
        self.bytes = 0;
        self.untrack();
    }

    /// Records that the slot of (namespace, key) left the cache, if tracking.
    fn record_drop(
        track: bool,
        dropped: &mut ChangedKeys,
        dropped_bytes: &mut usize,
        namespace: &[u8],
        key: &[u8],
    ) {
        if track {
            let mut k = Bytes::with_capacity(4 + namespace.len() + key.len());
            k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
            k.extend_from_slice(namespace);
            k.extend_from_slice(key);
            let len = k.len();
            if dropped.insert(k) {
                *dropped_bytes += len + CHANGED_OVERHEAD_BYTES;
            }
        }
    }

    /// Starts tracking changes from now: no slot is fresh, nothing dropped.
    fn track_from_now(&mut self) {
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
        self.dropped.clear();
        self.dropped_bytes = 0;
        self.track = true;
    }

    /// Stops tracking changes.
    fn untrack(&mut self) {
        self.track = false;
        self.dropped = ChangedKeys::default();
        self.dropped_bytes = 0;
    }

    /// Drops clean entries until the cache counts at most `target` bytes (or no clean
    /// entry is left). Arbitrary order: hash order, which is random per process.
    fn evict_to(&mut self, target: usize) {
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
                Self::record_drop(*track, dropped, dropped_bytes, ns, k);
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
    fn maybe_in_db(&self, namespace: &[u8]) -> bool {
        self.opened_non_empty || self.in_db.contains(namespace)
    }

    /// Caches `value` for `key` as a restore does: written (dirty: redb does not hold it)
    /// and handed (the restored chain holds it), replacing any slot of the key.
    fn put_restored(&mut self, namespace: &[u8], key: &[u8], value: &[u8]) {
        let slot = Slot {
            value: Some(Bytes::from_slice(value)),
            dirty: true,
            in_db: false,
            fresh: false,
            handed: true,
        };
        let cost = entry_cost(key.len(), slot.value.as_ref());
        if let Some(old) = self.map_mut(namespace).insert(Bytes::from_slice(key), slot) {
            self.bytes -= entry_cost(key.len(), old.value.as_ref());
        }
        self.bytes += cost;
    }

    /// Removes the slot of `key` (a delete of a value redb never held).
    fn remove(&mut self, namespace: &[u8], key: &[u8]) {
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
            );
        }
    }

    fn any_dirty(&self) -> bool {
        self.plain.values().any(|s| s.dirty)
            || self
                .namespaced
                .values()
                .any(|m| m.values().any(|s| s.dirty))
    }
}

/// [`composite`], inline up to 24 bytes.
fn composite_inline(shard: u32, namespace: &[u8], key: &[u8]) -> Bytes {
    let mut k = Bytes::with_capacity(8 + namespace.len() + key.len());
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
    k.extend_from_slice(namespace);
    k.extend_from_slice(key);
    k
}

/// The table key of (namespace, key) in shard `shard`.
fn composite(shard: u32, namespace: &[u8], key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + namespace.len() + key.len());
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
    k.extend_from_slice(namespace);
    k.extend_from_slice(key);
    k
}

/// The entries one (state, shard) chain of snapshot payloads restores to
/// ([`payload::fold`]); `None` if a payload is malformed.
fn fold_chain<'a>(chain: &[&'a ShardSnapshot]) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let payloads: Vec<(&str, &[u8])> = chain
        .iter()
        .map(|s| (s.codec(), s.payload.as_slice()))
        .collect();
    payload::fold(&payloads).ok()
}

/// An entry key of a payload (`namespace length (u32 BE) | namespace | key`) split into
/// namespace and key; `None` if it is malformed.
fn split_entry_key(k: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
    Some((k.get(4..4 + n)?, k.get(4 + n..)?))
}

/// Processing time in ms since the Unix epoch.
pub type Clock = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

fn system_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Bytes of the write-time prefix of a TTL state's stored values.
const TTL_PREFIX: usize = 8;

/// The value bytes of a TTL state's stored `stored` if it has not expired at `now`;
/// `None` if it has; the whole of `stored` when `ttl` is `None`. A stored value shorter
/// than the prefix (never written so) reads as expired.
fn live(stored: &[u8], ttl: Option<u64>, now: u64) -> Option<&[u8]> {
    let Some(ttl) = ttl else {
        return Some(stored);
    };
    let written = u64::from_be_bytes(stored.get(..TTL_PREFIX)?.try_into().ok()?);
    (written.saturating_add(ttl) > now).then(|| &stored[TTL_PREFIX..])
}

struct Slot {
    value: Option<Bytes>,
    dirty: bool,
    /// redb may hold a value for this key (so a delete must reach it).
    in_db: bool,
    /// Written since the last snapshot view (incremental snapshots: the next delta view
    /// hands it over, see [`KeyedState::delta_view`]).
    fresh: bool,
    /// A snapshot may hold this key as present: a view handed it over, or it came from
    /// redb, or a blind write created it in a namespace redb may hold (so the key may be
    /// in the chain). A delete of a slot that is not is not recorded: no view ever saw the
    /// key (a window's state written and cleared between two barriers).
    handed: bool,
}

/// Keyed state of one operator subtask. Not thread-safe by design: a subtask owns it on
/// its own thread (redb allows one writer per database, design §8).
pub struct KeyedState {
    db: Database,
    path: PathBuf,
    shard_count: u32,
    owned: Range<u32>,
    states: Vec<StateDescriptor>,
    cache: Vec<StateCache>,
    /// Working-set share of the budget, bytes (`None`: no budget).
    working_set_bytes: Option<usize>,
    /// Times the working set went over its share and was flushed and trimmed.
    evictions: u64,
    /// TTL per handle (`None`: never expires).
    ttl: Vec<Option<u64>>,
    clock: Clock,
    /// Entries dropped because they expired (reads that found them expired are not
    /// counted; snapshots' cleanup is).
    expired_removed: u64,
    /// Table keys a snapshot found expired, deleted by the next flush if still expired
    /// ([`KeyedState::remove_expired_later`]).
    pending_expired: Vec<ExpiredKeys>,
    /// Whether [`KeyedState::snapshot_view`] starts tracking changes for delta views.
    incremental: bool,
    /// Whether changes since the last view are known (fresh slots and the caches'
    /// `dropped` sets): the state was empty when incremental snapshots were turned on, or
    /// a full view was taken or a restore done since, and tracking was not dropped past
    /// the budget. Otherwise the next view must be full.
    tracking: bool,
}

impl std::fmt::Debug for KeyedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedState")
            .field("path", &self.path)
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

fn db_err(path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError::Database {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn printable(key: &[u8]) -> String {
    let shown = &key[..key.len().min(32)];
    match std::str::from_utf8(shown) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!(
            "0x{}",
            shown.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

fn check_ends(what: &'static str, ends: &[u32], len: usize) -> Result<()> {
    let mut prev = 0u32;
    for &e in ends {
        if e < prev || e as usize > len {
            return Err(StateError::Malformed {
                what,
                detail: format!("end offset {e} after {prev}, buffer length {len}"),
            });
        }
        prev = e;
    }
    Ok(())
}

/// Iterates the slices of a flat buffer with exclusive end offsets (checked beforehand).
fn slices<'a>(data: &'a [u8], ends: &'a [u32]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut start = 0usize;
    ends.iter().map(move |&e| {
        let s = &data[start..e as usize];
        start = e as usize;
        s
    })
}

/// The shard of `key` among `shard_count`, if it is one of `owned`.
///
/// # Errors
/// [`StateError::KeyOutsideShards`] otherwise.
fn shard_in(key: &[u8], shard_count: u32, owned: &Range<u32>) -> Result<StateShardId> {
    let shard = shard_of(key, shard_count);
    if !owned.contains(&shard.0) {
        return Err(StateError::KeyOutsideShards {
            key: printable(key),
            shard,
            owned: owned.clone(),
        });
    }
    Ok(shard)
}

/// The redb file behind a subtask's working set, without its syncs.
///
/// The file is scratch space. Every deployment deletes the state directory before it
/// opens one (`nop_stream_task::TaskHost`), and state comes back from checkpoint
/// segments, which are synced, never from this file. So a sync here buys nothing: it
/// skips redb's `fdatasync`s (three when the file is created, more at close), a few ms per
/// subtask and job. Everything else goes to redb's own file backend.
#[derive(Debug)]
struct ScratchFile(redb::backends::FileBackend);

impl redb::StorageBackend for ScratchFile {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.0.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.0.query_lock_range(start, end)
    }
}

impl KeyedState {
    /// Opens (or creates) the database of `config.path`.
    ///
    /// # Errors
    /// [`StateError::Database`] if redb cannot open or create the file.
    pub fn open(config: StateConfig) -> Result<Self> {
        if let Some(dir) = config.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| db_err(&config.path, e))?;
        }
        let mut builder = Database::builder();
        if let Some(budget) = config.memory_bytes {
            builder.set_cache_size((budget / 4).max(MIN_REDB_CACHE_BYTES) as usize);
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&config.path)
            .map_err(|e| db_err(&config.path, e))?;
        let backend =
            redb::backends::FileBackend::new(file).map_err(|e| db_err(&config.path, e))?;
        let db = builder
            .create_with_backend(ScratchFile(backend))
            .map_err(|e| db_err(&config.path, e))?;
        // A reopened database may hold entries of any namespace.
        let mut cache = Vec::with_capacity(config.states.len());
        {
            let txn = db.begin_read().map_err(|e| db_err(&config.path, e))?;
            for desc in &config.states {
                let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&desc.name);
                let opened_non_empty = match txn.open_table(def) {
                    Ok(t) => !t.is_empty().map_err(|e| db_err(&config.path, e))?,
                    Err(redb::TableError::TableDoesNotExist(_)) => false,
                    Err(e) => return Err(db_err(&config.path, e)),
                };
                cache.push(StateCache {
                    opened_non_empty,
                    ..StateCache::default()
                });
            }
        }
        let ttl = (0..config.states.len())
            .map(|i| config.ttl_ms.get(i).copied().flatten())
            .collect();
        Ok(KeyedState {
            ttl,
            db,
            path: config.path,
            shard_count: config.shard_count,
            owned: config.owned,
            states: config.states,
            cache,
            working_set_bytes: config
                .memory_bytes
                .map(|b| usize::try_from(b - b / 4).unwrap_or(usize::MAX)),
            evictions: 0,
            clock: std::sync::Arc::new(system_ms),
            expired_removed: 0,
            pending_expired: Vec::new(),
            incremental: false,
            tracking: false,
        })
    }

    /// Replaces the processing-time clock TTL uses (tests; default: the system clock).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The TTL of state `state` in ms, if it has one.
    pub fn ttl_ms(&self, state: u32) -> Option<u64> {
        self.ttl.get(state as usize).copied().flatten()
    }

    /// The TTL of state `state` in ms, if it has one, for the guest (WIT `state-ttl`).
    ///
    /// # Errors
    /// [`StateError::UnknownHandle`] for a handle no state has.
    pub fn declared_ttl_ms(&self, state: u32) -> Result<Option<u64>, StateError> {
        self.ttl
            .get(state as usize)
            .copied()
            .ok_or(StateError::UnknownHandle(state))
    }

    /// Entries the snapshots' TTL cleanup removed so far.
    pub fn expired_removed(&self) -> u64 {
        self.expired_removed
    }

    /// `value` as stored for `state`: behind the write-time prefix when it has a TTL.
    fn stamp(&self, state: u32, value: &[u8], now: u64, out: &mut Bytes) {
        out.clear();
        if self.ttl_ms(state).is_some() {
            out.extend_from_slice(&now.to_be_bytes());
        }
        out.extend_from_slice(value);
    }

    /// The handle of the declared state `name`, if it was declared with kind `kind`.
    pub fn handle(&self, name: &str) -> Option<u32> {
        self.states
            .iter()
            .position(|s| s.name == name)
            .map(|i| i as u32)
    }

    /// `stateShardCount` of the vertex.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// Declared states, indexed by handle.
    pub fn descriptors(&self) -> &[StateDescriptor] {
        &self.states
    }

    fn descriptor(&self, state: u32, expected: StateKind) -> Result<&StateDescriptor> {
        let d = self
            .states
            .get(state as usize)
            .ok_or(StateError::UnknownHandle(state))?;
        if d.kind != expected {
            return Err(StateError::WrongKind {
                name: d.name.clone(),
                actual: d.kind,
                expected,
            });
        }
        Ok(d)
    }

    /// Checks that `key` belongs to a shard this subtask owns, like [`Self::check_key`],
    /// without hashing it when the subtask owns every shard (parallelism 1): a state call
    /// checks each of its keys, and the hash was a visible share of a windowed job's host
    /// time.
    ///
    /// # Errors
    /// [`StateError::KeyOutsideShards`] for a key outside the owned shards.
    #[inline]
    pub fn check_owned(&self, key: &[u8]) -> Result<()> {
        if self.owns_all() {
            return Ok(());
        }
        self.check_key(key).map(drop)
    }

    /// Whether this subtask owns every shard (parallelism 1): no key needs checking.
    #[inline]
    fn owns_all(&self) -> bool {
        self.owned.start == 0 && self.owned.end >= self.shard_count
    }

    /// Checks that `key` belongs to a shard this subtask owns; returns its shard.
    ///
    /// # Errors
    /// [`StateError::KeyOutsideShards`] otherwise.
    pub fn check_key(&self, key: &[u8]) -> Result<StateShardId> {
        shard_in(key, self.shard_count, &self.owned)
    }

    fn read_db(&self, state: u32, composite: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        let name = &self.states[state as usize].name;
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
        let txn = self.db.begin_read().map_err(|e| db_err(&self.path, e))?;
        let table = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![None; composite.len()]),
            Err(e) => return Err(db_err(&self.path, e)),
        };
        composite
            .iter()
            .map(|k| {
                table
                    .get(*k)
                    .map(|v| v.map(|g| g.value().to_vec()))
                    .map_err(|e| db_err(&self.path, e))
            })
            .collect()
    }

    /// Looks up one value per key. Results are appended to `data`/`ends`/`present`
    /// (cleared first). One database read transaction serves all misses of the call.
    ///
    /// # Errors
    /// Unknown handle, wrong kind, malformed offsets, a key outside the owned shards, or a
    /// database failure.
    #[allow(clippy::too_many_arguments)]
    pub fn value_get_many(
        &mut self,
        state: u32,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        data: &mut Vec<u8>,
        ends: &mut Vec<u32>,
        present: &mut Vec<bool>,
    ) -> Result<()> {
        self.descriptor(state, StateKind::Value)?;
        check_ends("keys", key_ends, keys.len())?;
        data.clear();
        ends.clear();
        present.clear();
        let ttl = self.ttl_ms(state);
        let now = if ttl.is_some() { (self.clock)() } else { 0 };
        // First pass: serve hits, remember misses with their table keys.
        let mut misses: Vec<(usize, Vec<u8>, Vec<u8>)> = Vec::new();
        let may_miss = self.cache[state as usize].maybe_in_db(namespace);
        let map = self.cache[state as usize].map(namespace);
        for (i, key) in slices(keys, key_ends).enumerate() {
            // A cached key is owned (see `SlotMap`); only a miss is checked.
            match map.and_then(|m| m.get(key)) {
                Some(slot) => {
                    if let Some(v) = slot.value.as_deref().and_then(|v| live(v, ttl, now)) {
                        data.extend_from_slice(v);
                        present.push(true);
                    } else {
                        present.push(false);
                    }
                }
                None => {
                    if may_miss {
                        let shard = self.check_key(key)?;
                        misses.push((i, key.to_vec(), composite(shard.0, namespace, key)));
                    } else {
                        self.check_owned(key)?;
                    }
                    present.push(false);
                }
            }
            ends.push(data.len() as u32);
        }
        if misses.is_empty() {
            // Every key was cached, or nothing of this namespace was ever written to
            // redb (so the misses are absent).
            return Ok(());
        }
        // Misses: one read transaction, then rebuild the output in order.
        let refs: Vec<&[u8]> = misses.iter().map(|m| m.2.as_slice()).collect();
        let loaded = self.read_db(state, &refs)?;
        let mut rebuilt = Vec::with_capacity(data.len());
        let mut rebuilt_ends = Vec::with_capacity(ends.len());
        let mut miss = 0usize;
        let mut start = 0usize;
        for (i, end) in ends.iter().enumerate() {
            if miss < misses.len() && misses[miss].0 == i {
                if let Some(v) = loaded[miss].as_deref().and_then(|v| live(v, ttl, now)) {
                    rebuilt.extend_from_slice(v);
                    present[i] = true;
                }
                miss += 1;
            } else {
                rebuilt.extend_from_slice(&data[start..*end as usize]);
            }
            start = *end as usize;
            rebuilt_ends.push(rebuilt.len() as u32);
        }
        *data = rebuilt;
        *ends = rebuilt_ends;
        let cache = &mut self.cache[state as usize];
        for ((_, key, _), value) in misses.into_iter().zip(loaded) {
            cache.insert(
                namespace,
                Bytes::from_vec(key),
                Slot {
                    in_db: value.is_some(),
                    value: value.map(Bytes::from_vec),
                    dirty: false,
                    fresh: false,
                    handed: true,
                },
            );
        }
        self.maybe_evict()
    }

    /// Stores one value per key.
    ///
    /// # Errors
    /// As [`Self::value_get_many`]; also if key and value counts differ. A key outside the
    /// owned shards stops the call there: the keys before it are stored. (The runtime traps
    /// the plugin on it, which fails the task; recovery restores the last checkpoint, so
    /// the partial write is never seen.)
    pub fn value_put_many(
        &mut self,
        state: u32,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
        values: &[u8],
        value_ends: &[u32],
    ) -> Result<()> {
        self.descriptor(state, StateKind::Value)?;
        check_ends("keys", key_ends, keys.len())?;
        check_ends("values", value_ends, values.len())?;
        if key_ends.len() != value_ends.len() {
            return Err(StateError::Malformed {
                what: "values",
                detail: format!("{} keys but {} values", key_ends.len(), value_ends.len()),
            });
        }
        if self.ttl_ms(state).is_some() {
            let now = (self.clock)();
            for (key, value) in slices(keys, key_ends).zip(slices(values, value_ends)) {
                let mut stored = Bytes::new();
                self.stamp(state, value, now, &mut stored);
                self.put_one(state, namespace, key, Some(stored.into_vec()), false)?;
            }
            return Ok(());
        }
        // A cached key is owned (see `SlotMap`): only a new key is checked, in the loop.
        let check = !self.owns_all();
        let cache = &mut self.cache[state as usize];
        let in_db = cache.maybe_in_db(namespace);
        // Counted apart and added once: `map` borrows the cache.
        let (mut added, mut removed) = (0usize, 0usize);
        let map = cache.map_mut(namespace);
        for (key, value) in slices(keys, key_ends).zip(slices(values, value_ends)) {
            match map.get_mut(key) {
                Some(slot) => {
                    let v = slot.value.get_or_insert_with(Bytes::new);
                    removed += v.len();
                    added += value.len();
                    v.clear();
                    v.extend_from_slice(value);
                    slot.dirty = true;
                    slot.fresh = true;
                }
                None => {
                    if check && let Err(e) = shard_in(key, self.shard_count, &self.owned) {
                        cache.bytes = cache.bytes + added - removed;
                        return Err(e);
                    }
                    added += key.len() + value.len() + ENTRY_OVERHEAD_BYTES;
                    map.insert(
                        Bytes::from_slice(key),
                        Slot {
                            value: Some(Bytes::from_slice(value)),
                            dirty: true,
                            in_db,
                            fresh: true,
                            handed: in_db,
                        },
                    );
                }
            }
        }
        cache.bytes = cache.bytes + added - removed;
        self.maybe_evict()
    }

    /// Reads the value bytes of one (state, namespace, key) through the cache (without
    /// the TTL prefix; an expired entry reads as absent).
    fn get_one(&mut self, state: u32, namespace: &[u8], key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_owned(key)?;
        let ttl = self.ttl_ms(state);
        let now = if ttl.is_some() { (self.clock)() } else { 0 };
        if let Some(slot) = self.cache[state as usize]
            .map(namespace)
            .and_then(|m| m.get(key))
        {
            return Ok(slot
                .value
                .as_deref()
                .and_then(|v| live(v, ttl, now))
                .map(<[u8]>::to_vec));
        }
        if !self.cache[state as usize].maybe_in_db(namespace) {
            return Ok(None);
        }
        let loaded = self
            .read_db(
                state,
                &[composite(shard_of(key, self.shard_count).0, namespace, key).as_slice()],
            )?
            .pop()
            .flatten();
        let value = loaded
            .as_deref()
            .and_then(|v| live(v, ttl, now))
            .map(<[u8]>::to_vec);
        self.cache[state as usize].insert(
            namespace,
            Bytes::from_slice(key),
            Slot {
                value: loaded.as_deref().map(Bytes::from_slice),
                dirty: false,
                in_db: loaded.is_some(),
                fresh: false,
                handed: true,
            },
        );
        self.maybe_evict()?;
        Ok(value)
    }

    /// Stores `value` (plain value bytes unless `stored`: then already as stored, with
    /// any TTL prefix), or deletes on `None`.
    fn put_one(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        value: Option<Vec<u8>>,
        plain: bool,
    ) -> Result<()> {
        self.check_owned(key)?;
        let value = match value {
            Some(v) if plain && self.ttl_ms(state).is_some() => {
                let mut stored = Bytes::new();
                self.stamp(state, &v, (self.clock)(), &mut stored);
                Some(stored.into_vec())
            }
            v => v,
        };
        let cache = &mut self.cache[state as usize];
        let in_db = cache.maybe_in_db(namespace);
        let existing = cache
            .map(namespace)
            .and_then(|m| m.get(key))
            .map(|s| s.in_db);
        match (existing, value) {
            // Deleting what redb never held: forget it, no tombstone.
            (Some(false), None) => cache.remove(namespace, key),
            (None, None) if !in_db => {}
            (Some(_), value) => {
                let slot = cache
                    .map_mut(namespace)
                    .get_mut(key)
                    .expect("checked above");
                let old = slot.value.as_ref().map_or(0, |v| v.len());
                slot.value = value.map(Bytes::from_vec);
                slot.dirty = true;
                slot.fresh = true;
                let new = slot.value.as_ref().map_or(0, |v| v.len());
                cache.bytes = cache.bytes + new - old;
            }
            (None, value) => {
                cache.insert(
                    namespace,
                    Bytes::from_slice(key),
                    Slot {
                        value: value.map(Bytes::from_vec),
                        dirty: true,
                        in_db,
                        fresh: true,
                        handed: in_db,
                    },
                );
            }
        }
        self.maybe_evict()
    }

    /// Removes the value of `key`.
    ///
    /// # Errors
    /// Unknown handle, wrong kind or a key outside the owned shards.
    pub fn value_delete(&mut self, state: u32, namespace: &[u8], key: &[u8]) -> Result<()> {
        self.descriptor(state, StateKind::Value)?;
        self.put_one(state, namespace, key, None, true)
    }

    /// Removes the values of many keys (laid out flat: `keys` + exclusive `key_ends`).
    ///
    /// # Errors
    /// As [`Self::value_get_many`]; a refused key leaves the state unchanged.
    pub fn value_delete_many(
        &mut self,
        state: u32,
        namespace: &[u8],
        keys: &[u8],
        key_ends: &[u32],
    ) -> Result<()> {
        self.descriptor(state, StateKind::Value)?;
        check_ends("keys", key_ends, keys.len())?;
        for key in slices(keys, key_ends) {
            self.check_owned(key)?;
        }
        for key in slices(keys, key_ends) {
            self.put_one(state, namespace, key, None, true)?;
        }
        Ok(())
    }

    /// Keys of `state` in `namespace` held by this subtask, ascending, strictly after
    /// `after`, at most `limit`; returns (keys, key_ends, more). Flushes first.
    ///
    /// # Errors
    /// Unknown handle or a database failure.
    pub fn value_keys(
        &mut self,
        state: u32,
        namespace: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> Result<(Vec<u8>, Vec<u32>, bool)> {
        self.descriptor(state, StateKind::Value)?;
        self.flush(false)?;
        let ttl = self.ttl_ms(state);
        let now = (self.clock)();
        let name = self.states[state as usize].name.clone();
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        let txn = self.db.begin_read().map_err(|e| db_err(&self.path, e))?;
        let mut found: Vec<Vec<u8>> = Vec::new();
        match txn.open_table(def) {
            Ok(table) => {
                for shard in self.owned.clone() {
                    let mut prefix = shard.to_be_bytes().to_vec();
                    prefix.extend_from_slice(&(namespace.len() as u32).to_be_bytes());
                    prefix.extend_from_slice(namespace);
                    let range = table
                        .range::<&[u8]>(prefix.as_slice()..)
                        .map_err(|e| db_err(&self.path, e))?;
                    for entry in range {
                        let (k, v) = entry.map_err(|e| db_err(&self.path, e))?;
                        let k = k.value();
                        if !k.starts_with(&prefix) {
                            break;
                        }
                        let key = &k[prefix.len()..];
                        if after.is_none_or(|a| key > a) && live(v.value(), ttl, now).is_some() {
                            found.push(key.to_vec());
                        }
                    }
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(db_err(&self.path, e)),
        }
        found.sort_unstable();
        let more = found.len() > limit as usize;
        found.truncate(limit as usize);
        let mut keys = Vec::new();
        let mut ends = Vec::with_capacity(found.len());
        for k in found {
            keys.extend_from_slice(&k);
            ends.push(keys.len() as u32);
        }
        Ok((keys, ends, more))
    }

    /// Appends `value` to the list of `key`.
    ///
    /// # Errors
    /// Unknown handle, wrong kind, a key outside the owned shards, a corrupt stored list.
    pub fn list_append(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        value: &[u8],
    ) -> Result<()> {
        self.descriptor(state, StateKind::List)?;
        let mut stored = self.get_one(state, namespace, key)?.unwrap_or_default();
        codec::push_item(&mut stored, value);
        self.put_one(state, namespace, key, Some(stored), true)
    }

    /// The list of `key` (empty if none).
    ///
    /// # Errors
    /// As [`Self::list_append`].
    pub fn list_get(&mut self, state: u32, namespace: &[u8], key: &[u8]) -> Result<Vec<Vec<u8>>> {
        let name = self.descriptor(state, StateKind::List)?.name.clone();
        match self.get_one(state, namespace, key)? {
            Some(stored) => codec::items(&stored).ok_or(StateError::Corrupt(name)),
            None => Ok(Vec::new()),
        }
    }

    /// Removes the list of `key`.
    ///
    /// # Errors
    /// As [`Self::list_append`].
    pub fn list_clear(&mut self, state: u32, namespace: &[u8], key: &[u8]) -> Result<()> {
        self.descriptor(state, StateKind::List)?;
        self.put_one(state, namespace, key, None, true)
    }

    fn map_load(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let name = self.descriptor(state, StateKind::Map)?.name.clone();
        match self.get_one(state, namespace, key)? {
            Some(stored) => codec::pairs(&stored).ok_or(StateError::Corrupt(name)),
            None => Ok(Vec::new()),
        }
    }

    fn map_store(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        entries: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<()> {
        let value = if entries.is_empty() {
            None
        } else {
            let mut out = Vec::new();
            for (k, v) in entries {
                codec::push_item(&mut out, k);
                codec::push_item(&mut out, v);
            }
            Some(out)
        };
        self.put_one(state, namespace, key, value, true)
    }

    /// Sets `user_key` to `value` in the map of `key`.
    ///
    /// # Errors
    /// Unknown handle, wrong kind, a key outside the owned shards, a corrupt stored map.
    pub fn map_put(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let mut entries = self.map_load(state, namespace, key)?;
        match entries.binary_search_by(|(k, _)| k.as_slice().cmp(user_key)) {
            Ok(i) => entries[i].1 = value.to_vec(),
            Err(i) => entries.insert(i, (user_key.to_vec(), value.to_vec())),
        }
        self.map_store(state, namespace, key, &entries)
    }

    /// Reads `user_key` from the map of `key`.
    ///
    /// # Errors
    /// As [`Self::map_put`].
    pub fn map_get(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let entries = self.map_load(state, namespace, key)?;
        Ok(entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(user_key))
            .ok()
            .map(|i| entries[i].1.clone()))
    }

    /// Removes `user_key` from the map of `key`.
    ///
    /// # Errors
    /// As [`Self::map_put`].
    pub fn map_remove(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
        user_key: &[u8],
    ) -> Result<()> {
        let mut entries = self.map_load(state, namespace, key)?;
        if let Ok(i) = entries.binary_search_by(|(k, _)| k.as_slice().cmp(user_key)) {
            entries.remove(i);
            self.map_store(state, namespace, key, &entries)?;
        }
        Ok(())
    }

    /// Every entry of the map of `key`, ascending by user key.
    ///
    /// # Errors
    /// As [`Self::map_put`].
    pub fn map_entries(
        &mut self,
        state: u32,
        namespace: &[u8],
        key: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.map_load(state, namespace, key)
    }

    /// Removes whatever `state` holds for `key` in `namespace`, whatever its kind.
    ///
    /// # Errors
    /// Unknown handle or a key outside the owned shards.
    pub fn clear(&mut self, state: u32, namespace: &[u8], key: &[u8]) -> Result<()> {
        if state as usize >= self.states.len() {
            return Err(StateError::UnknownHandle(state));
        }
        self.put_one(state, namespace, key, None, true)
    }

    /// Number of entries cached in memory.
    pub fn cached_entries(&self) -> usize {
        self.cache.iter().map(StateCache::len).sum()
    }

    /// Bytes the working set counts against the budget (key and value bytes plus
    /// [`ENTRY_OVERHEAD_BYTES`] per entry and [`NAMESPACE_OVERHEAD_BYTES`] per namespace).
    pub fn cached_bytes(&self) -> usize {
        self.cache.iter().map(|c| c.bytes).sum()
    }

    /// Times the working set went over its share of the budget and was flushed and
    /// trimmed.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// If the working set counts more than its share of the budget: writes every dirty
    /// entry to redb (non-durable) and drops clean entries until it counts at most half
    /// its share. Every operation that adds to the working set calls it; without a budget
    /// it does nothing.
    ///
    /// # Errors
    /// A database failure.
    pub fn maybe_evict(&mut self) -> Result<()> {
        let Some(share) = self.working_set_bytes else {
            return Ok(());
        };
        // Deletes record keys without growing the working set: check their bound here,
        // after every write, not only at flushes.
        self.check_tracking();
        if self.cached_bytes() <= share {
            return Ok(());
        }
        self.flush(false)?;
        self.evictions += 1;
        // Every state keeps at most half of its part of the working set.
        let total = self.cached_bytes().max(1);
        let target = share / 2;
        for c in &mut self.cache {
            let part = (c.bytes as u128 * target as u128 / total as u128) as usize;
            c.evict_to(part);
        }
        self.check_tracking();
        Ok(())
    }

    /// Writes every dirty entry to redb in one write transaction (`durable`: fsync on
    /// commit; otherwise redb's non-durable commit, made durable by the next durable one).
    ///
    /// # Errors
    /// A database failure.
    pub fn flush(&mut self, durable: bool) -> Result<()> {
        if !durable
            && self.pending_expired.is_empty()
            && !self.cache.iter().any(StateCache::any_dirty)
        {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(|e| db_err(&self.path, e))?;
        txn.set_durability(if durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        })
        .map_err(|e| db_err(&self.path, e))?;
        for (i, desc) in self.states.iter().enumerate() {
            let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&desc.name);
            let mut table = txn.open_table(def).map_err(|e| db_err(&self.path, e))?;
            let cache = &mut self.cache[i];
            let StateCache {
                plain,
                namespaced,
                in_db,
                bytes,
                track,
                dropped,
                dropped_bytes,
                ..
            } = cache;
            // Dirty entries in table-key order: sequential B-tree inserts touch each leaf
            // page once instead of once per entry (the hash maps' order is random).
            let mut dirty: Vec<(Bytes, &mut Slot)> = Vec::new();
            let mut new_namespaces: Vec<Vec<u8>> = Vec::new();
            let maps = std::iter::once((&[][..], &mut *plain))
                .chain(namespaced.iter_mut().map(|(ns, m)| (ns.as_slice(), m)));
            for (ns, map) in maps {
                let mut wrote = false;
                for (k, slot) in map.iter_mut().filter(|(_, s)| s.dirty) {
                    wrote |= slot.value.is_some();
                    dirty.push((
                        composite_inline(shard_of(k, self.shard_count).0, ns, k),
                        slot,
                    ));
                }
                if wrote && !in_db.contains(ns) {
                    new_namespaces.push(ns.to_vec());
                }
            }
            dirty.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (table_key, slot) in dirty {
                match &slot.value {
                    Some(v) => {
                        table
                            .insert(table_key.as_slice(), v.as_slice())
                            .map_err(|e| db_err(&self.path, e))?;
                        slot.in_db = true;
                    }
                    None => {
                        table
                            .remove(table_key.as_slice())
                            .map_err(|e| db_err(&self.path, e))?;
                        slot.in_db = false;
                    }
                }
                slot.dirty = false;
            }
            for ns in new_namespaces {
                in_db.insert(ns);
            }
            let maps = std::iter::once((&[][..], plain))
                .chain(namespaced.iter_mut().map(|(ns, m)| (ns.as_slice(), m)));
            for (ns, map) in maps {
                // Flushed deletes need no slot any more.
                map.retain(|k, s| {
                    let keep = s.value.is_some() || s.dirty;
                    if !keep {
                        *bytes -= entry_cost(k.len(), None);
                        StateCache::record_drop(*track && s.handed, dropped, dropped_bytes, ns, k);
                    }
                    keep
                });
            }
            namespaced.retain(|ns, m| {
                if m.is_empty() {
                    *bytes -= ns.len() + NAMESPACE_OVERHEAD_BYTES;
                }
                !m.is_empty()
            });
        }
        let removed = self.delete_still_expired(&txn)?;
        txn.commit().map_err(|e| db_err(&self.path, e))?;
        for (i, k) in &removed {
            // Table key: shard (4) | entry key.
            if let Some((ns, key)) = k.get(4..).and_then(split_entry_key) {
                self.cache[*i].remove(ns, key);
            }
        }
        self.expired_removed += removed.len() as u64;
        self.check_tracking();
        Ok(())
    }

    /// Deletes, inside `txn` (after the dirty entries were written there), every pending
    /// expired table key whose stored value is still expired at the time its snapshot
    /// judged it (a key written since then is live and stays); returns the deleted
    /// (state index, table key) pairs.
    fn delete_still_expired(
        &mut self,
        txn: &redb::WriteTransaction,
    ) -> Result<Vec<(usize, Vec<u8>)>> {
        let mut removed = Vec::new();
        for batch in std::mem::take(&mut self.pending_expired) {
            for (i, desc) in self.states.iter().enumerate() {
                let Some(ttl) = self.ttl[i] else { continue };
                if !batch.keys.iter().any(|(s, _)| *s == i) {
                    continue;
                }
                let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&desc.name);
                let mut table = txn.open_table(def).map_err(|e| db_err(&self.path, e))?;
                for (_, k) in batch.keys.iter().filter(|(s, _)| *s == i) {
                    let expired = table
                        .get(k.as_slice())
                        .map_err(|e| db_err(&self.path, e))?
                        .is_some_and(|v| live(v.value(), Some(ttl), batch.now).is_none());
                    if expired {
                        table
                            .remove(k.as_slice())
                            .map_err(|e| db_err(&self.path, e))?;
                        removed.push((i, k.clone()));
                    }
                }
            }
        }
        Ok(removed)
    }

    /// Snapshot of every owned shard (design §8.1, §8.2): flushes the working set,
    /// then returns one payload per (shard, state) that holds entries, each a sequence of
    /// length-prefixed (`namespace length | namespace | key`, value) pairs in key order
    /// (codec `kv-lp/1`, see [`codec`]). Values are as stored (a TTL state's with their
    /// write-time prefix); expired entries of TTL states are left out and deleted from
    /// the database (full-snapshot cleanup).
    ///
    /// # Errors
    /// A database failure.
    pub fn snapshot(&mut self) -> Result<Vec<ShardSnapshot>> {
        let mut out = Vec::new();
        self.snapshot_each(&mut |s| {
            out.push(s);
            Ok(())
        })?;
        Ok(out)
    }

    /// [`Self::snapshot`], handing each (shard, state) payload to `consume` as soon as it
    /// is built instead of collecting them, so a snapshot holds one shard's payload in
    /// memory at a time (the budget of [`StateConfig::memory_bytes`] does not cover a
    /// whole snapshot). Payloads come in state, then shard order. Synchronous: it is
    /// [`Self::snapshot_view`], [`SnapshotView::write`] on this thread, then the expired
    /// entries' deletion at once.
    ///
    /// # Errors
    /// A database failure, or [`StateError::Snapshot`] with the message `consume`
    /// returned (the snapshot stops there).
    pub fn snapshot_each(
        &mut self,
        consume: &mut dyn FnMut(ShardSnapshot) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let view = self.snapshot_view()?;
        let expired = view.write(consume)?;
        self.remove_expired_later(expired);
        self.flush(false)
    }

    /// The synchronous half of an asynchronous snapshot (design §7, "Asynchronous
    /// snapshots"): flushes the working set (and any expired keys pending from the last
    /// snapshot) to redb in one non-durable transaction, then opens a redb read
    /// transaction on the result. The returned view sees exactly the state as of this
    /// call: redb is MVCC, so writes and flushes made afterwards (including the budget's
    /// evictions) go on without changing it, and the pages of the old version are freed
    /// only once the view is dropped. The view is `Send`: [`SnapshotView::write`] may run
    /// on another thread while this state keeps serving the task.
    ///
    /// Expired entries of TTL states are judged at this call's processing time.
    ///
    /// # Errors
    /// A database failure.
    pub fn snapshot_view(&mut self) -> Result<SnapshotView> {
        self.flush(false)?;
        if self.incremental {
            for c in &mut self.cache {
                c.track_from_now();
            }
            self.tracking = true;
        }
        self.view(None)
    }

    /// The synchronous half of an incremental snapshot (issue 14 item 4): like
    /// [`Self::snapshot_view`], but the view covers only the table keys written or deleted
    /// since the previous view, and [`SnapshotView::write`] hands over `kv-delta/1`
    /// payloads of them (a put of the value as of this call, or a delete). Applied in
    /// order on top of the previous view's payloads (and its own predecessors'), they give
    /// this view's state. `None` when the changes are not known: incremental snapshots are
    /// off ([`Self::set_incremental`]), no view was taken since the state was opened or
    /// restored, or more changed keys accumulated than the memory budget allows tracking;
    /// take a full [`Self::snapshot_view`] then.
    ///
    /// Expired entries are not looked for, except among the changed keys (which become
    /// deletes): a full snapshot drops the rest.
    ///
    /// # Errors
    /// A database failure.
    pub fn delta_view(&mut self) -> Result<Option<SnapshotView>> {
        self.check_tracking();
        if !self.tracking {
            return Ok(None);
        }
        let shard_count = self.shard_count;
        let mut delta = Vec::with_capacity(self.cache.len());
        for c in &mut self.cache {
            let StateCache {
                plain,
                namespaced,
                dropped,
                dropped_bytes,
                ..
            } = c;
            let mut changes: Vec<(Bytes, Change)> = Vec::new();
            // Slots that left the cache since the view: the cached value if the key came
            // back (unless it is fresh: the loop below takes it), else redb's.
            // Taken, not drained: the set's capacity would stay uncounted.
            for entry in std::mem::take(dropped) {
                let n = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes")) as usize;
                let (ns, key) = (&entry[4..4 + n], &entry[4 + n..]);
                let map = if ns.is_empty() {
                    Some(&*plain)
                } else {
                    namespaced.get(ns)
                };
                let table_key = composite_inline(shard_of(key, shard_count).0, ns, key);
                match map.and_then(|m| m.get(key)) {
                    Some(slot) if slot.fresh => {}
                    Some(slot) => changes.push((table_key, Change::Cached(slot.value.clone()))),
                    None => changes.push((table_key, Change::Stored)),
                }
            }
            *dropped_bytes = 0;
            let maps = std::iter::once((&[][..], plain))
                .chain(namespaced.iter_mut().map(|(ns, m)| (ns.as_slice(), m)));
            for (ns, map) in maps {
                for (k, slot) in map.iter_mut().filter(|(_, s)| s.fresh) {
                    slot.fresh = false;
                    slot.handed = true;
                    changes.push((
                        composite_inline(shard_of(k, shard_count).0, ns, k),
                        Change::Cached(slot.value.clone()),
                    ));
                }
            }
            delta.push(changes);
        }
        self.view(Some(delta)).map(Some)
    }

    /// Drops change tracking if the caches' `dropped` sets count more than half the
    /// working set's share of the budget (tracking must not break the budget's bound);
    /// the next snapshot is then full.
    fn check_tracking(&mut self) {
        let Some(share) = self.working_set_bytes else {
            return;
        };
        if self.tracking && self.cache.iter().map(|c| c.dropped_bytes).sum::<usize>() > share / 2 {
            self.tracking = false;
            for c in &mut self.cache {
                c.untrack();
            }
        }
    }

    /// Turns change tracking for [`Self::delta_view`] on or off (default off). On an
    /// empty state (a database opened empty, nothing written yet) tracking starts at once:
    /// its first delta holds every key written since, the whole state on top of nothing,
    /// so even a subtask's first snapshot need not flush. Otherwise it starts at the next
    /// [`Self::snapshot_view`] or [`Self::restore`]. Turning it off drops what was
    /// tracked.
    pub fn set_incremental(&mut self, on: bool) {
        self.incremental = on;
        if !on {
            self.tracking = false;
            for c in &mut self.cache {
                c.untrack();
            }
        } else if !self.tracking
            && self.cache.iter().all(|c| {
                !c.opened_non_empty
                    && c.in_db.is_empty()
                    && c.plain.is_empty()
                    && c.namespaced.is_empty()
            })
        {
            self.tracking = true;
            for c in &mut self.cache {
                c.track_from_now();
            }
        }
    }

    /// A read transaction on the database as it is, with what a scan needs.
    fn view(&self, delta: Option<Vec<Vec<(Bytes, Change)>>>) -> Result<SnapshotView> {
        let txn = self.db.begin_read().map_err(|e| db_err(&self.path, e))?;
        Ok(SnapshotView {
            txn,
            path: self.path.clone(),
            names: self.states.iter().map(|d| d.name.clone()).collect(),
            ttl: self.ttl.clone(),
            owned: self.owned.clone(),
            now: (self.clock)(),
            delta,
        })
    }

    /// A [`Compactor`] judging TTL expiry at the current processing time.
    pub fn compactor(&self) -> Compactor {
        Compactor {
            ttl: self.ttl.clone(),
            expired: ExpiredKeys {
                keys: Vec::new(),
                now: (self.clock)(),
            },
        }
    }

    /// Removes the expired keys a [`SnapshotView::write`] or a [`Compactor`] found. A key
    /// is removed only if its value is still expired at the time they were judged at, so
    /// a key written since stays. A key only the working set holds (redb never did) leaves
    /// it at once: without a memory budget, incremental snapshots never flush, so this is
    /// what keeps a TTL state's working set bounded. A key redb may hold is queued for
    /// deletion by the next [`Self::flush`] (a full snapshot's, an eviction's, or any
    /// other), in that flush's transaction; until then it reads as absent, as every
    /// expired entry does.
    pub fn remove_expired_later(&mut self, expired: ExpiredKeys) {
        let now = expired.now;
        let mut later = Vec::new();
        for (i, k) in expired.keys {
            let Some(ttl) = self.ttl.get(i).copied().flatten() else {
                continue;
            };
            let Some((ns, key)) = k.get(4..).and_then(split_entry_key) else {
                continue;
            };
            let cache = &mut self.cache[i];
            match cache.map(ns).and_then(|m| m.get(key)) {
                Some(slot) if !slot.in_db && !cache.maybe_in_db(ns) => {
                    let still = slot
                        .value
                        .as_deref()
                        .is_some_and(|v| live(v, Some(ttl), now).is_none());
                    if still {
                        cache.remove(ns, key);
                        self.expired_removed += 1;
                    }
                }
                _ => later.push((i, k)),
            }
        }
        if !later.is_empty() {
            self.pending_expired.push(ExpiredKeys { keys: later, now });
        }
    }

    /// Loads shard payloads produced by [`Self::snapshot`] or [`SnapshotView::write`]
    /// (possibly by another subtask when shards moved, design §10.5), replacing the
    /// working set. The payloads of one (shard, state) must come in chain order: the full
    /// one (if any), then its deltas ([`ShardSnapshot::delta`]), oldest first. Entries of
    /// shards this subtask does not own are refused.
    ///
    /// Each chain is folded in memory first (its payloads are in key order: a linear
    /// merge). With incremental snapshots on ([`Self::set_incremental`], set before
    /// restoring) and no memory budget, every key it leaves goes into the working set
    /// itself (nothing flushes it afterwards: compactions make the full payloads), as a
    /// written entry redb does not hold. Otherwise every key is inserted into redb once,
    /// in key order, in one non-durable write transaction (a crash restores again from the
    /// checkpoint). With incremental snapshots on, tracking starts at the restored state,
    /// so the next snapshot may be a delta on top of the restored chain.
    ///
    /// # Errors
    /// Unknown state, a foreign shard, a corrupt payload or a database failure.
    pub fn restore(&mut self, shards: &[ShardSnapshot]) -> Result<()> {
        self.tracking = false;
        for c in &mut self.cache {
            c.clear();
        }
        // The payloads of each (state, shard) in the order given: its chain.
        let mut chains: std::collections::BTreeMap<(u32, u32), Vec<&ShardSnapshot>> =
            std::collections::BTreeMap::new();
        for s in shards {
            let desc = self
                .states
                .get(s.state as usize)
                .ok_or(StateError::UnknownHandle(s.state))?;
            if !self.owned.contains(&s.shard.0) {
                return Err(StateError::KeyOutsideShards {
                    key: format!("<shard {} of state `{}`>", s.shard, desc.name),
                    shard: s.shard,
                    owned: self.owned.clone(),
                });
            }
            chains.entry((s.state, s.shard.0)).or_default().push(s);
        }
        // Without a memory budget, incremental snapshots never flush the working set (a
        // compaction makes the full payloads off the task thread), so each folded chain
        // goes straight to the working set: as written (dirty, redb does not hold them) and
        // handed (the chain holds them, so a delete must reach the next delta). With a
        // budget, or with a full snapshot each epoch (which would write them all to redb at
        // the first barrier), into redb.
        if self.incremental && self.working_set_bytes.is_none() {
            // The full payloads of a state's shards hold disjoint keys, so their entry
            // count is a lower bound of its restored keys: the plain map is sized for them
            // at its first key instead of growing (each growth rehashes every slot into a
            // fresh table). The count comes from the manifest, so it is capped by what the
            // payloads can hold (an entry takes at least 8 bytes: two length prefixes).
            let mut reserve = vec![0usize; self.cache.len()];
            for s in shards.iter().filter(|s| !s.delta) {
                let n = usize::try_from(s.entries).unwrap_or(usize::MAX);
                reserve[s.state as usize] += n.min(s.payload.len() / 8);
            }
            for ((state, shard), chain) in chains {
                let corrupt = || StateError::Corrupt(self.states[state as usize].name.clone());
                let cache = &mut self.cache[state as usize];
                let reserve = &mut reserve[state as usize];
                // Folded first (a linear merge of payloads written in key order), so each
                // key the chain leaves is inserted once rather than once per change, and a
                // deleted one not at all (nothing is tracked yet: no tombstone).
                for (k, v) in fold_chain(&chain).ok_or_else(corrupt)? {
                    let (ns, key) = split_entry_key(k).ok_or_else(corrupt)?;
                    if ns.is_empty() && *reserve > 0 {
                        cache.plain.reserve(std::mem::take(reserve));
                    }
                    if shard_of(key, self.shard_count).0 != shard {
                        return Err(corrupt());
                    }
                    cache.put_restored(ns, key, v);
                }
            }
            for c in &mut self.cache {
                c.track_from_now();
            }
            self.tracking = true;
            return Ok(());
        }
        // One non-durable write transaction: a crash restores again from the checkpoint.
        let mut txn = self.db.begin_write().map_err(|e| db_err(&self.path, e))?;
        txn.set_durability(redb::Durability::None)
            .map_err(|e| db_err(&self.path, e))?;
        for ((state, shard), chain) in chains {
            let corrupt = || StateError::Corrupt(self.states[state as usize].name.clone());
            let entries = fold_chain(&chain).ok_or_else(corrupt)?;
            let def: TableDefinition<&[u8], &[u8]> =
                TableDefinition::new(&self.states[state as usize].name);
            let mut table = txn.open_table(def).map_err(|e| db_err(&self.path, e))?;
            let known = &mut self.cache[state as usize].in_db;
            let mut table_key = Vec::new();
            // In key order: sequential B-tree inserts.
            for (k, v) in entries {
                let (ns, _) = split_entry_key(k).ok_or_else(corrupt)?;
                if !known.contains(ns) {
                    known.insert(ns.to_vec());
                }
                table_key.clear();
                table_key.extend_from_slice(&shard.to_be_bytes());
                table_key.extend_from_slice(k);
                table
                    .insert(table_key.as_slice(), v)
                    .map_err(|e| db_err(&self.path, e))?;
            }
        }
        txn.commit().map_err(|e| db_err(&self.path, e))?;
        if self.incremental {
            // The restored state is exactly the chain's: deltas may follow it.
            for c in &mut self.cache {
                c.track_from_now();
            }
            self.tracking = true;
        }
        Ok(())
    }

    /// Every (namespace, key) `state` holds in the owned shards (redb's entries with the
    /// working set's over them; no flush, so a restored working set stays out of redb), in
    /// table order (shard, namespace, key). Used to rebuild the timer index after a
    /// restore.
    ///
    /// # Errors
    /// Unknown handle, a corrupt table key, or a database failure.
    pub fn scan(&mut self, state: u32) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let name = self
            .states
            .get(state as usize)
            .ok_or(StateError::UnknownHandle(state))?
            .name
            .clone();
        // Table key -> whether it holds a value.
        let mut keys: std::collections::BTreeMap<Vec<u8>, bool> = std::collections::BTreeMap::new();
        let txn = self.db.begin_read().map_err(|e| db_err(&self.path, e))?;
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        match txn.open_table(def) {
            Ok(table) => {
                for entry in table.iter().map_err(|e| db_err(&self.path, e))? {
                    let (k, _) = entry.map_err(|e| db_err(&self.path, e))?;
                    keys.insert(k.value().to_vec(), true);
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(db_err(&self.path, e)),
        }
        let cache = &self.cache[state as usize];
        let maps = std::iter::once((&[][..], &cache.plain))
            .chain(cache.namespaced.iter().map(|(ns, m)| (ns.as_slice(), m)));
        for (ns, map) in maps {
            for (k, slot) in map {
                keys.insert(
                    composite(shard_of(k, self.shard_count).0, ns, k),
                    slot.value.is_some(),
                );
            }
        }
        let mut out = Vec::new();
        for (k, _) in keys.into_iter().filter(|(_, present)| *present) {
            let (ns, key) = k
                .get(4..)
                .and_then(split_entry_key)
                .ok_or_else(|| StateError::Corrupt(name.clone()))?;
            out.push((ns.to_vec(), key.to_vec()));
        }
        Ok(out)
    }

    /// Number of stored entries of every state (after a flush), for tests and metrics.
    ///
    /// # Errors
    /// A database failure.
    pub fn stored_entries(&mut self) -> Result<u64> {
        self.flush(false)?;
        let txn = self.db.begin_read().map_err(|e| db_err(&self.path, e))?;
        let mut n = 0;
        for desc in &self.states {
            let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&desc.name);
            match txn.open_table(def) {
                Ok(t) => n += t.len().map_err(|e| db_err(&self.path, e))?,
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(db_err(&self.path, e)),
            }
        }
        Ok(n)
    }
}
