//! Snapshot payloads of keyed state and the views and compactions that make them
//! (design §5.5, §8.2): [`ShardSnapshot`], [`SnapshotView`], [`Compactor`].

use super::*;

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
    pub(crate) txn: redb::ReadTransaction,
    pub(crate) path: PathBuf,
    pub(crate) names: Vec<String>,
    pub(crate) ttl: Vec<Option<u64>>,
    pub(crate) owned: Range<u32>,
    pub(crate) now: u64,
    /// A delta view ([`KeyedState::delta_view`]); `None`: a full view.
    pub(crate) delta: Option<Delta>,
}

/// What a delta view hands over, per state (by handle).
pub(crate) struct Delta {
    /// The table keys written or deleted since the previous view that the working set
    /// knew at the view, in no order, each with its stored value as of the view (`None`:
    /// absent).
    pub(crate) changes: Vec<Vec<(Bytes, Option<Bytes>)>>,
    /// The runs of changes spilled since the previous view, oldest first; `changes` wins
    /// over them where both hold a key, and a later run over an earlier one.
    pub(crate) spilled: Vec<Vec<SpillRun>>,
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
    pub(crate) keys: Vec<(usize, Vec<u8>)>,
    /// Processing time (ms since the Unix epoch) they were judged expired at.
    pub(crate) now: u64,
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
            for keys in &mut delta.changes {
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
    /// the changed keys (the working set's, merged in key order with the spilled ones the
    /// view's transaction reads), each a put of its value as of the view or, when the view
    /// holds no live value (deleted, or expired at the view's time), a delete.
    pub(crate) fn write_delta(
        &self,
        delta: &Delta,
        consume: &mut dyn FnMut(ShardSnapshot) -> std::result::Result<(), String>,
    ) -> Result<()> {
        for (i, name) in self.names.iter().enumerate() {
            let keys = &delta.changes[i];
            let runs = &delta.spilled[i];
            if keys.is_empty() && runs.is_empty() {
                continue;
            }
            let mut readers = Vec::with_capacity(runs.len());
            for run in runs {
                readers.push(RunReader::open(run).map_err(|e| db_err(&run.path, e))?);
            }
            let ttl = self.ttl[i];
            let mut shard: Option<[u8; 4]> = None;
            let mut payload = Vec::new();
            let mut entries = 0u64;
            let mut emit = |shard: [u8; 4], payload: &mut Vec<u8>, entries: &mut u64| {
                consume(ShardSnapshot {
                    shard: StateShardId(u32::from_be_bytes(shard)),
                    state: i as u32,
                    entries: std::mem::take(entries),
                    payload: std::mem::take(payload),
                    delta: true,
                })
                .map_err(|message| StateError::Snapshot {
                    state: name.clone(),
                    message,
                })
            };
            let corrupt = |r: usize| {
                db_err(
                    &runs[r].path,
                    "malformed spilled change (expected a kv-delta/1 change)",
                )
            };
            let mut cached = keys.iter().peekable();
            loop {
                // The smallest next key; where several sources hold it, the working set's
                // change wins, then the latest run's (each is later than the ones before).
                let mut min: Option<&[u8]> = cached.peek().map(|(k, _)| k.as_slice());
                let mut from_run: Option<usize> = None;
                for (r, reader) in readers.iter().enumerate() {
                    if let Some((k, _)) = &reader.head {
                        let better = match min {
                            None => true,
                            Some(m) => {
                                k.as_slice() < m || (k.as_slice() == m && from_run.is_some())
                            }
                        };
                        if better {
                            min = Some(k.as_slice());
                            from_run = Some(r);
                        }
                    }
                }
                let Some(min) = min else { break };
                let key = min.to_vec();
                let winner: (Vec<u8>, Option<Vec<u8>>) = match from_run {
                    None => {
                        let (_, v) = cached.next().expect("peeked");
                        (key, v.as_ref().map(|v| v.to_vec()))
                    }
                    Some(r) => {
                        let (_, tagged) = readers[r].head.as_ref().expect("a head");
                        let value = match tagged.split_first() {
                            Some((&payload::DELTA_PUT, v)) => Some(v.to_vec()),
                            Some((&payload::DELTA_DELETE, [])) => None,
                            _ => return Err(corrupt(r)),
                        };
                        (key, value)
                    }
                };
                // Every run's change of the key is superseded (or taken): skip them.
                for (r, reader) in readers.iter_mut().enumerate() {
                    while reader.head.as_ref().is_some_and(|(k, _)| *k == winner.0) {
                        reader.advance().map_err(|e| db_err(&runs[r].path, e))?;
                    }
                }
                let (key, value) = (&winner.0, winner.1.as_deref());
                let prefix: [u8; 4] = key
                    .get(..4)
                    .and_then(|p| p.try_into().ok())
                    .ok_or_else(|| StateError::Corrupt(name.clone()))?;
                if shard.is_some_and(|s| s != prefix) {
                    emit(shard.expect("checked"), &mut payload, &mut entries)?;
                }
                shard = Some(prefix);
                let value = value.filter(|v| live(v, ttl, self.now).is_some());
                payload::push_change(&mut payload, &key[4..], value);
                entries += 1;
            }
            if let Some(s) = shard {
                emit(s, &mut payload, &mut entries)?;
            }
        }
        Ok(())
    }
}

/// Folds chains of snapshot payloads into full payloads off the task thread: the
/// background compaction of incremental snapshots (design §5.5, §8.1, "full snapshots
/// compacted in the background"). Made by [`KeyedState::compactor`]; `Send`, and
/// independent of the state it came from (it reads nothing but the payloads it is given).
/// TTL states' entries expired at its time are left out and listed, as a full view's
/// scan leaves them out ([`Self::into_expired`]).
#[derive(Debug)]
pub struct Compactor {
    pub(crate) ttl: Vec<Option<u64>>,
    pub(crate) expired: ExpiredKeys,
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

/// The entries one (state, shard) chain of snapshot payloads restores to
/// ([`payload::fold`]); `None` if a payload is malformed.
pub(crate) fn fold_chain<'a>(chain: &[&'a ShardSnapshot]) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let payloads: Vec<(&str, &[u8])> = chain
        .iter()
        .map(|s| (s.codec(), s.payload.as_slice()))
        .collect();
    payload::fold(&payloads).ok()
}

/// An entry key of a payload (`namespace length (u32 BE) | namespace | key`) split into
/// namespace and key; `None` if it is malformed.
pub(crate) fn split_entry_key(k: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
    Some((k.get(4..4 + n)?, k.get(4 + n..)?))
}
