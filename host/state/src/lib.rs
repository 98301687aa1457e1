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
//! design §8.1). Its stored values then start with the processing time of their last
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
//! `state_memory_bytes`, split over the job's stateful subtasks; design §5.5, §8.1). Three
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
//! its default 1 GiB cache. With incremental snapshots, the keys that left the working set
//! since the last view are tracked in memory up to half the working set's share and
//! spilled beyond it (and at every flush) to sorted run files next to the database, which
//! the next delta view merges and removes, so a budget keeps snapshots incremental however
//! many keys change between two views.

mod cache;
pub mod codec;
mod error;
mod eviction;
mod scratch;
mod snapshot;
mod table_alloc;
mod ttl;
mod views;

pub use cache::{ENTRY_OVERHEAD_BYTES, NAMESPACE_OVERHEAD_BYTES};
pub use error::StateError;
pub use snapshot::{Compactor, ExpiredKeys, ShardSnapshot, SnapshotView};
pub use ttl::Clock;

use cache::*;
use scratch::*;
use snapshot::*;
use ttl::*;

use nop_stream_api::{StateDescriptor, StateKind, StateShardId};
use nop_stream_checkpoint::payload;
use nop_stream_core::shard_of;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

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
    /// Spill runs written so far (names each run file uniquely).
    spill_seq: u64,
    /// Whether changes since the last view are known (fresh slots and the caches'
    /// `dropped` sets and spilled runs): the state was empty when incremental snapshots
    /// were turned on, or a full view was taken or a restore done since. Otherwise the
    /// next view must be full.
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
            spill_seq: 0,
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
}
