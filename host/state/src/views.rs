//! Snapshots of keyed state: full and delta views, compaction, restore and scans.

use super::*;

impl KeyedState {
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

    /// The synchronous half of an incremental snapshot (design §5.5, §8.1): like
    /// [`Self::snapshot_view`], but the view covers only the table keys written or deleted
    /// since the previous view, and [`SnapshotView::write`] hands over `kv-delta/1`
    /// payloads of them (a put of the value as of this call, or a delete). Applied in
    /// order on top of the previous view's payloads (and its own predecessors'), they give
    /// this view's state. `None` when the changes are not known: incremental snapshots are
    /// off ([`Self::set_incremental`]), or no view was taken since the state was opened
    /// (on a database that held entries); take a full [`Self::snapshot_view`] then. Under
    /// a memory budget the changed keys that do not fit its tracking share are spilled to
    /// sorted run files and merged back by the view's scan, so a budget never turns a
    /// delta into a full snapshot.
    ///
    /// Expired entries are not looked for, except among the changed keys (which become
    /// deletes): a full snapshot drops the rest.
    ///
    /// # Errors
    /// A database failure.
    pub fn delta_view(&mut self) -> Result<Option<SnapshotView>> {
        self.check_tracking()?;
        if !self.tracking {
            return Ok(None);
        }
        let shard_count = self.shard_count;
        let mut delta = Vec::with_capacity(self.cache.len());
        let mut spilled = Vec::with_capacity(self.cache.len());
        for c in &mut self.cache {
            let StateCache {
                plain,
                namespaced,
                dropped,
                dropped_bytes,
                ..
            } = c;
            let mut changes: Vec<(Bytes, Option<Bytes>)> = Vec::new();
            // Slots that left the cache since the view or the last spill: their value as
            // of the drop, unless the key came back fresh (the loop below takes it). A key
            // that came back clean holds that same value.
            // Taken, not drained: the map's capacity would stay uncounted.
            for (entry, value) in std::mem::take(dropped) {
                let n = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes")) as usize;
                let (ns, key) = (&entry[4..4 + n], &entry[4 + n..]);
                let map = if ns.is_empty() {
                    Some(&*plain)
                } else {
                    namespaced.get(ns)
                };
                if !map.and_then(|m| m.get(key)).is_some_and(|s| s.fresh) {
                    let table_key = composite_inline(shard_of(key, shard_count).0, ns, key);
                    changes.push((table_key, value));
                }
            }
            *dropped_bytes = 0;
            let maps = std::iter::once((&[][..], &mut *plain))
                .chain(namespaced.iter_mut().map(|(ns, m)| (ns.as_slice(), m)));
            for (ns, map) in maps {
                for (k, slot) in map.iter_mut().filter(|(_, s)| s.fresh) {
                    slot.fresh = false;
                    slot.handed = true;
                    changes.push((
                        composite_inline(shard_of(k, shard_count).0, ns, k),
                        slot.value.clone(),
                    ));
                }
            }
            delta.push(changes);
            // The view merges the spilled runs (and removes them when done).
            spilled.push(std::mem::take(&mut c.runs));
        }
        self.view(Some(Delta {
            changes: delta,
            spilled,
        }))
        .map(Some)
    }

    /// Spills the tracked changes to a run file ([`Self::spill_changes`]) if the caches' `dropped` sets count more than half the working set's
    /// share of the budget: tracking must not break the budget's bound, and it is never
    /// dropped for it (design §8.1).
    ///
    /// # Errors
    /// A database failure.
    pub(crate) fn check_tracking(&mut self) -> Result<()> {
        let Some(share) = self.working_set_bytes else {
            return Ok(());
        };
        if !self.tracking || self.cache.iter().map(|c| c.dropped_bytes).sum::<usize>() <= share / 2
        {
            return Ok(());
        }
        self.spill_changes()
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
    pub(crate) fn view(&self, delta: Option<Delta>) -> Result<SnapshotView> {
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
    /// written entry redb does not hold: chains are folded and hashed on up to 8 threads,
    /// and a large map is filled in the order of its buckets while a second thread copies
    /// the keys and values out of the payloads ahead of the inserts. Otherwise every key
    /// is inserted into redb once, in key order, in one non-durable write transaction (a
    /// crash restores again from the checkpoint). With incremental snapshots on, tracking
    /// starts at the restored state, so the next snapshot may be a delta on top of the
    /// restored chain.
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
            // Each chain folded first (a linear merge of payloads written in key order), so
            // each key the chain leaves is inserted once rather than once per change, and a
            // deleted one not at all (nothing is tracked yet: no tombstone). The chains are
            // folded, checked and hashed on several threads (they are independent); the
            // working set is then filled on this one.
            let chains: Vec<_> = chains.into_iter().collect();
            let bytes: usize = shards.iter().map(|s| s.payload.len()).sum();
            let threads = if bytes < PARALLEL_RESTORE_BYTES {
                1
            } else {
                std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .min(MAX_RESTORE_THREADS)
                    .min(chains.len())
            };
            let hashers: Vec<_> = self
                .cache
                .iter()
                .map(|c| c.plain.hasher().clone())
                .collect();
            let (states, shard_count) = (&self.states, self.shard_count);
            let scan = |part: usize| -> Result<RestoredPart<'_>> {
                let mut out = RestoredPart {
                    plain: vec![Vec::new(); hashers.len()],
                    namespaced: Vec::new(),
                };
                for ((state, shard), chain) in chains.iter().skip(part).step_by(threads) {
                    let corrupt = || StateError::Corrupt(states[*state as usize].name.clone());
                    let entries = fold_chain(chain).ok_or_else(corrupt)?;
                    let hasher = &hashers[*state as usize];
                    let plain = &mut out.plain[*state as usize];
                    plain.reserve(entries.len());
                    for (k, v) in entries {
                        let (ns, key) = split_entry_key(k).ok_or_else(corrupt)?;
                        if shard_of(key, shard_count).0 != *shard {
                            return Err(corrupt());
                        }
                        if ns.is_empty() {
                            plain.push((std::hash::BuildHasher::hash_one(hasher, key), key, v));
                        } else {
                            out.namespaced.push((*state, ns, key, v));
                        }
                    }
                }
                Ok(out)
            };
            let parts: Vec<RestoredPart<'_>> = if threads <= 1 {
                vec![scan(0)?]
            } else {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (1..threads)
                        .map(|part| scope.spawn(move || scan(part)))
                        .collect();
                    let mut parts = vec![scan(0)];
                    for h in handles {
                        parts.push(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
                    }
                    parts
                })
                .into_iter()
                .collect::<Result<_>>()?
            };
            for part in &parts {
                for &(state, ns, key, value) in &part.namespaced {
                    self.cache[state as usize].put_restored(ns, key, value);
                }
            }
            // Each plain map sized for its keys at once (each growth rehashes every slot
            // into a fresh table), then filled in the order of the buckets the keys hash
            // to: a table of millions of entries is far larger than the CPU caches, and
            // inserting in key order touches a random bucket per key (a cache and TLB miss
            // each), where bucket order writes the table front to back.
            for (state, cache) in self.cache.iter_mut().enumerate() {
                let runs: Vec<&[HashedEntry<'_>]> =
                    parts.iter().map(|p| p.plain[state].as_slice()).collect();
                let total = runs.iter().map(|r| r.len()).sum();
                if total == 0 {
                    continue;
                }
                let capacity = reserved_capacity(cache.plain.capacity(), total);
                let ordered = if threads > 1 && total >= ORDERED_FILL_ENTRIES {
                    // The table reserved (its pages faulted in, see `table_alloc`) on one
                    // more thread while the entries are ordered.
                    let plain = &mut cache.plain;
                    std::thread::scope(|scope| {
                        scope.spawn(move || plain.reserve(total));
                        order_by_bucket(&runs, capacity, threads)
                    })
                } else {
                    cache.plain.reserve(total);
                    order_by_bucket(&runs, capacity, 1)
                };
                if threads <= 1 || total < 2 * FILL_CHUNK {
                    for entries in &ordered {
                        insert_from_payloads(cache, entries);
                    }
                } else {
                    fill_pipelined(cache, &ordered);
                }
            }
            // The caches were cleared above and hold only what `put_restored` put.
            for c in &mut self.cache {
                c.track_restored();
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

/// Restores of fewer payload bytes than this fold their chains on the calling thread
/// (1 MiB: below it a thread's start costs more than it saves).
const PARALLEL_RESTORE_BYTES: usize = 1 << 20;

/// Most threads a restore folds chains on.
const MAX_RESTORE_THREADS: usize = 8;

/// Fewest entries of a plain map a restore fills in the order of its buckets (65,536): a
/// smaller table fits the CPU caches, and is filled in the order read.
const ORDERED_FILL_ENTRIES: usize = 1 << 16;

/// The capacity (as `HashMap::capacity` reports it) of a table of `current` capacity and
/// no entries once `total` more are reserved: unchanged if they fit, else hashbrown's
/// smallest table for them, a power of two buckets of which 7/8 are usable. Exact for
/// tables of at least 16 buckets (a test checks it against the map); only the speed of a
/// restore depends on it.
fn reserved_capacity(current: usize, total: usize) -> usize {
    if current >= total {
        current
    } else {
        (total * 8 / 7).next_power_of_two() / 8 * 7
    }
}

/// How many entries ahead of the insert a restore prefetches a key (see `restore`).
const READ_AHEAD: usize = 16;

/// Entries a restore's gathering thread copies out of the payloads per chunk
/// ([`fill_pipelined`]): 32,768 entries, 2.5 MiB of keys and values, small enough to stay
/// in the CPU caches between the two threads.
const FILL_CHUNK: usize = 1 << 15;

/// Inserts `entries` into `cache`'s plain map in their order, copying each key and value
/// out of the payloads.
fn insert_from_payloads(cache: &mut StateCache, entries: &[HashedEntry<'_>]) {
    for (i, &(_, key, value)) in entries.iter().enumerate() {
        // The key of an entry a few places ahead, prefetched now: its bytes lie at a random
        // place in the payloads, so its cache miss overlaps the inserts in between instead
        // of stalling its own.
        if let Some((_, ahead, _)) = entries.get(i + READ_AHEAD) {
            prefetch(ahead);
        }
        cache.put_restored(b"", key, value);
    }
}

/// Fills `cache`'s plain map with `ordered`'s entries (in bucket order, see
/// [`order_by_bucket`]) on two threads, chunk by chunk: a gathering thread copies a
/// chunk's keys and values out of the payloads, where they lie at random places (a cache
/// and TLB miss each), into an owned buffer, and this thread inserts the buffers it is
/// handed, reading them in order. When none is ready (gathering costs more than inserting
/// into a table whose pages are already mapped), this thread takes the next chunk itself
/// and inserts it straight from the payloads, so both threads stay busy to the end. Three
/// buffers circulate, so neither thread allocates after the first chunks. Each chunk is
/// inserted in `ordered`'s order, the chunks in about that order: a chunk covers a run of
/// buckets, so the table is still written run by run.
fn fill_pipelined(cache: &mut StateCache, ordered: &[Vec<HashedEntry<'_>>]) {
    let chunks: Vec<&[HashedEntry<'_>]> =
        ordered.iter().flat_map(|e| e.chunks(FILL_CHUNK)).collect();
    // The next chunk nobody has taken yet.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let take = || {
        chunks
            .get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
            .copied()
    };
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Vec<(Bytes, Bytes)>>(2);
    let (empty_tx, empty_rx) = std::sync::mpsc::sync_channel::<Vec<(Bytes, Bytes)>>(3);
    for _ in 0..3 {
        // The receiver lives below: sending into a fresh channel with room cannot fail.
        let _ = empty_tx.send(Vec::with_capacity(FILL_CHUNK));
    }
    std::thread::scope(|scope| {
        scope.spawn(move || {
            // The insert thread stopped (it only stops early by panicking): stop too.
            while let Ok(mut buf) = empty_rx.recv() {
                let Some(chunk) = take() else { return };
                buf.clear();
                for (i, &(_, key, value)) in chunk.iter().enumerate() {
                    if let Some((_, ahead, _)) = chunk.get(i + READ_AHEAD) {
                        prefetch(ahead);
                    }
                    buf.push((Bytes::from_slice(key), Bytes::from_slice(value)));
                }
                if full_tx.send(buf).is_err() {
                    return;
                }
            }
        });
        // Owned here, so that if an insert panics, unwinding drops the receiver and the
        // gathering thread's next send fails instead of blocking the scope's join.
        let (full_rx, empty_tx) = (full_rx, empty_tx);
        let insert = |cache: &mut StateCache, mut buf: Vec<(Bytes, Bytes)>| {
            for (key, value) in buf.drain(..) {
                cache.put_restored_owned(b"", key, value);
            }
            // The gathering thread may have finished: then nobody needs the buffer back.
            let _ = empty_tx.send(buf);
        };
        loop {
            match full_rx.try_recv() {
                Ok(buf) => insert(cache, buf),
                Err(std::sync::mpsc::TryRecvError::Empty) => match take() {
                    Some(chunk) => insert_from_payloads(cache, chunk),
                    // Every chunk is taken: insert what the gathering thread still hands
                    // over, until it has finished (it drops its sender).
                    None => {
                        for buf in full_rx.iter() {
                            insert(cache, buf);
                        }
                        break;
                    }
                },
                Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
            }
        }
    });
}

/// Asks the CPU to bring the first cache line of `bytes` into its caches ahead of use. A
/// hint only: it reads nothing the program sees and cannot fault; a no-op on targets
/// other than x86-64.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: `_mm_prefetch` is a hint that never faults and has no architectural effect,
    // whatever the address; SSE, which it needs, is in the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// What one restore thread read from its chains: per state, the entries of the plain map
/// (key hash, key, value); and the namespaced entries (state, namespace, key, value).
struct RestoredPart<'a> {
    plain: Vec<Vec<HashedEntry<'a>>>,
    namespaced: Vec<NamespacedEntry<'a>>,
}

/// Turns per-bin counts into each bin's first place (an exclusive prefix sum), in place;
/// returns the total.
fn counts_to_offsets(counts: &mut [usize]) -> usize {
    let mut at = 0;
    for c in counts {
        let n = *c;
        *c = at;
        at += n;
    }
    at
}

/// An entry of a plain map as a restore reads it: (hash of the key, key, value).
type HashedEntry<'a> = (u64, &'a [u8], &'a [u8]);

/// A namespaced entry as a restore reads it: (state, namespace, key, value).
type NamespacedEntry<'a> = (u32, &'a [u8], &'a [u8], &'a [u8]);

/// The entries of `runs` (hash, key, value) in the order of the bucket a hash table of
/// `capacity` (as `HashMap::capacity` reports it) probes first for each hash, in up to
/// `threads` consecutive pieces (one per thread, each ordered on its own). hashbrown
/// starts a probe at `hash & (buckets - 1)`, with `buckets` a power of two and `capacity`
/// 7/8 of it.
///
/// A counting sort on the top 16 bits of that position (a histogram pass, then each thread
/// scatters the entries of its range of bins), then within each bin a counting sort on the
/// rest. The order must be exact: with the table's pages mapped ahead (see `table_alloc`),
/// inserting bins of 128 buckets in any order took 3 times as long as inserting in bucket
/// order, since each slot's write missed the caches. The order does not change what the
/// table holds, only how fast it fills. Tables of under [`ORDERED_FILL_ENTRIES`] entries
/// fit the CPU caches: their entries come back in `runs`' order.
fn order_by_bucket<T: Copy + Send + Sync>(
    runs: &[&[(u64, T, T)]],
    capacity: usize,
    threads: usize,
) -> Vec<Vec<(u64, T, T)>> {
    let total: usize = runs.iter().map(|r| r.len()).sum();
    let Some(&first) = runs.iter().find_map(|r| r.first()) else {
        return Vec::new();
    };
    if total < ORDERED_FILL_ENTRIES {
        return vec![runs.concat()];
    }
    let buckets = (capacity / 7 * 8).max(1).next_power_of_two();
    let bits = buckets.trailing_zeros();
    let shift = bits.saturating_sub(16);
    let radix = |h: u64| ((h & (buckets as u64 - 1)) >> shift) as usize;
    let mut counts = vec![0usize; 1 << bits.min(16)];
    for e in runs.iter().flat_map(|r| r.iter()) {
        counts[radix(e.0)] += 1;
    }
    // Bin ranges of about equal entries, at most one per thread, none without entries.
    let threads = threads.clamp(1, counts.len());
    let mut ranges = Vec::with_capacity(threads);
    let (mut lo, mut seen) = (0, 0);
    for (bin, &n) in counts.iter().enumerate() {
        if ranges.len() + 1 == threads {
            break;
        }
        seen += n;
        if seen * threads >= total * (ranges.len() + 1) {
            ranges.push(lo..bin + 1);
            lo = bin + 1;
        }
    }
    ranges.push(lo..counts.len());
    ranges.retain(|r| counts[r.clone()].iter().any(|&n| n > 0));
    let order = |bins: std::ops::Range<usize>| -> Vec<(u64, T, T)> {
        // Each bin's next free place within this piece.
        let mut next = counts[bins.clone()].to_vec();
        let len = counts_to_offsets(&mut next);
        let mut piece = vec![first; len];
        for e in runs.iter().flat_map(|r| r.iter()) {
            let r = radix(e.0);
            if bins.contains(&r) {
                let n = &mut next[r - bins.start];
                piece[*n] = *e;
                *n += 1;
            }
        }
        // Each bin (now ending at `next[bin]`) ordered by the low bits of the position:
        // a counting sort through a scratch copy for bins of up to 1,024 buckets, a
        // comparison sort for wider ones (tables of more than 2^26 buckets).
        if shift > 0 {
            let low = (1u64 << shift) - 1;
            let mut start = 0;
            if shift <= 10 {
                let mut sub = vec![0usize; 1 << shift];
                let mut scratch = Vec::new();
                for &end in &next {
                    let bin = &mut piece[start..end];
                    start = end;
                    if bin.len() < 2 {
                        continue;
                    }
                    sub.fill(0);
                    for e in bin.iter() {
                        sub[(e.0 & low) as usize] += 1;
                    }
                    counts_to_offsets(&mut sub);
                    scratch.clear();
                    scratch.extend_from_slice(bin);
                    for e in &scratch {
                        let i = (e.0 & low) as usize;
                        bin[sub[i]] = *e;
                        sub[i] += 1;
                    }
                }
            } else {
                for &end in &next {
                    piece[start..end].sort_unstable_by_key(|e| e.0 & low);
                    start = end;
                }
            }
        }
        piece
    };
    // The first range on this thread, each other on a thread of its own.
    std::thread::scope(|scope| {
        let mut ranges = ranges.into_iter();
        let mine = ranges.next().unwrap_or(0..0);
        let handles: Vec<_> = ranges.map(|r| scope.spawn(|| order(r))).collect();
        let mut pieces = vec![order(mine)];
        for h in handles {
            pieces.push(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        pieces
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reserved_capacity` predicts the capacity hashbrown gives an empty map (fresh, or
    /// cleared with a table kept) once `total` more are reserved.
    #[test]
    fn reserved_capacity_is_the_maps() {
        for total in [16, 100, 65_536, 150_000, 1 << 20, 3_000_000, 5_000_000] {
            let mut fresh = SlotMap::default();
            let predicted = reserved_capacity(fresh.capacity(), total);
            fresh.reserve(total);
            assert_eq!(fresh.capacity(), predicted, "{total} into a fresh map");
            let mut kept = SlotMap::default();
            kept.reserve(total / 2);
            let predicted = reserved_capacity(kept.capacity(), total);
            kept.reserve(total);
            assert_eq!(
                kept.capacity(),
                predicted,
                "{total} into a map of {}",
                total / 2
            );
            let predicted = reserved_capacity(kept.capacity(), total / 3);
            kept.reserve(total / 3);
            assert_eq!(
                kept.capacity(),
                predicted,
                "{} into a larger map",
                total / 3
            );
        }
    }

    /// Every entry comes back once, in the exact order of the bucket each hash starts its
    /// probe at, whatever the number of threads, the split of the input into runs, and
    /// whether the bins are ordered by counting (up to 1,024 buckets a bin) or by
    /// comparison (wider); a small input comes back as given.
    #[test]
    fn entries_come_back_once_in_exact_bucket_order() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // xorshift64: hashes spread over all 64 bits, reproducibly.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let entries: Vec<(u64, u32, u32)> = (0..200_000u32).map(|i| (next(), i, !i)).collect();
        // 2^18 buckets (bins of 4, counted) and 2^27 (bins of 2,048, compared).
        for capacity in [(1usize << 18) / 8 * 7, (1usize << 27) / 8 * 7] {
            let mask = ((capacity / 7 * 8).next_power_of_two() - 1) as u64;
            for threads in [1, 2, 3] {
                for split in [entries.len(), 70_001, 1] {
                    let runs: Vec<&[(u64, u32, u32)]> =
                        [&entries[..split], &entries[split..]].into_iter().collect();
                    let pieces = order_by_bucket(&runs, capacity, threads);
                    assert!(pieces.len() <= threads, "{threads} threads");
                    let got: Vec<_> = pieces.concat();
                    assert!(
                        got.windows(2).all(|w| w[0].0 & mask <= w[1].0 & mask),
                        "not in bucket order: capacity {capacity}, {threads} threads"
                    );
                    let mut seen: Vec<u32> = got.iter().map(|e| e.1).collect();
                    seen.sort_unstable();
                    assert!(
                        seen.iter().copied().eq(0..200_000),
                        "an entry lost or doubled"
                    );
                    assert!(got.iter().all(|e| e.2 == !e.1), "an entry torn apart");
                }
            }
        }
        // Every hash in the first bin: one piece, nothing lost.
        let skewed: Vec<(u64, u32, u32)> =
            (0..70_000u32).map(|i| (u64::from(i % 4), i, !i)).collect();
        let pieces = order_by_bucket(&[&skewed[..]], (1 << 18) / 8 * 7, 3);
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].len(), skewed.len());
        assert!(pieces[0].windows(2).all(|w| w[0].0 <= w[1].0));
        let small: Vec<&[(u64, u32, u32)]> = vec![&entries[..500], &entries[500..1000]];
        assert_eq!(
            order_by_bucket(&small, 1 << 20, 2),
            vec![entries[..1000].to_vec()]
        );
    }
}
