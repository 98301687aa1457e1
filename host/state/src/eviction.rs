//! Flushing the working set to redb, eviction under the memory budget, and the cleanup of
//! expired entries.

use super::*;

impl KeyedState {
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
        self.check_tracking()?;
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
        self.check_tracking()
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
                        StateCache::record_drop(
                            *track && s.handed,
                            dropped,
                            dropped_bytes,
                            ns,
                            k,
                            None,
                        );
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
        self.spill_changes()
    }

    /// Moves every cache's `dropped` changes to a new sorted run file ([`SpillRun`]),
    /// written sequentially next to the database. This keeps change tracking within the
    /// budget however many keys change between two views, at the cost of one sequential
    /// write per change: the next delta view merges the runs (design §8.1).
    ///
    /// # Errors
    /// [`StateError::Database`] naming the run file if it cannot be written.
    pub(crate) fn spill_changes(&mut self) -> Result<()> {
        use std::io::Write;
        for i in 0..self.cache.len() {
            if self.cache[i].dropped.is_empty() {
                continue;
            }
            let cache = &mut self.cache[i];
            let mut changes: Vec<(Bytes, Option<Bytes>)> = std::mem::take(&mut cache.dropped)
                .into_iter()
                .map(|(entry, value)| {
                    let n = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes")) as usize;
                    let (ns, key) = (&entry[4..4 + n], &entry[4 + n..]);
                    (
                        composite_inline(shard_of(key, self.shard_count).0, ns, key),
                        value,
                    )
                })
                .collect();
            cache.dropped_bytes = 0;
            changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            self.spill_seq += 1;
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".changed-{i}-{}", self.spill_seq));
            // Owned by the run from here: a failed write removes the file.
            let run = SpillRun {
                path: PathBuf::from(name),
            };
            let io = |e: std::io::Error| db_err(&run.path, e);
            let mut out = std::io::BufWriter::with_capacity(
                64 << 10,
                std::fs::File::create(&run.path).map_err(io)?,
            );
            let mut buf = Vec::new();
            for (table_key, value) in changes {
                buf.clear();
                payload::push_change(&mut buf, &table_key, value.as_deref());
                out.write_all(&buf).map_err(io)?;
            }
            out.flush().map_err(io)?;
            cache.runs.push(run);
        }
        Ok(())
    }

    /// Deletes, inside `txn` (after the dirty entries were written there), every pending
    /// expired table key whose stored value is still expired at the time its snapshot
    /// judged it (a key written since then is live and stays); returns the deleted
    /// (state index, table key) pairs.
    pub(crate) fn delete_still_expired(
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
}
