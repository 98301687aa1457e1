//! `keyed-count`: the running count of records per record key, held in host keyed state
//! (Nexmark-style `SELECT auction, COUNT(*) … GROUP BY auction` in streaming mode).
//!
//! Config: `{ "emit": "record" | "batch" }` (default `record`):
//! - `record`: one update per input record, carrying the key's count including that
//!   record — the upsert form of Flink's streaming changelog for a non-windowed
//!   `GROUP BY` (Flink additionally emits a retraction `-U` of the previous count, which
//!   an upsert sink ignores);
//! - `batch`: one update per distinct key of each input batch, with its latest count (like
//!   Flink's mini-batch aggregation, batch = one input batch).
//!
//! Output payload: the key bytes followed by the count as `u64` little-endian; the record
//! is keyed by the same key and keeps the input timestamp (`record`) or carries none
//! (`batch`). Input records must be keyed (arrive over a HASH edge).
//!
//! State: one value state `count` (schema 1, codec [`COUNT_CODEC`]: `u64` LE), with a
//! write-back cache in the instance (design §16, "batch at the boundary"): a key's count
//! is read from the host once, with one `value_get_many` for a batch's uncached keys,
//! and kept; at every checkpoint (`prepare_checkpoint`) and at `finish` the counts
//! changed since the last write-back go to the host (one `value_put_many` per
//! [`WRITE_BACK_CHUNK`] keys), so host
//! state is exact at every barrier and a restore, rescale or savepoint needs nothing from
//! the instance. Past [`MAX_CACHED_KEYS`] keys or [`MAX_CACHED_KEY_BYTES`] key bytes the
//! cache is written back and emptied before the next batch; if most lookups since it was
//! last emptied missed (a key space much larger than the cache), the next
//! [`BYPASS_BATCHES`] batches each read and write their keys in the host, as without a
//! cache, before it is tried again. With a TTL on `count`
//! (`state_ttl_ms`) nothing is cached across batches: each batch reads and writes its keys
//! in the host, so lifetimes start at each write, as the host defines them. Nothing is
//! allocated per record.

use hashbrown::HashTable;

use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, Result, StateDescriptor, StateHandle,
    StateKind, TaskInfo, extend_key,
};

/// Name of the count state.
pub const COUNT_STATE: &str = "count";
/// Codec of [`COUNT_STATE`]: a `u64` in 8 little-endian bytes.
pub const COUNT_CODEC: &str = "u64-le";

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"emit":{"enum":["record","batch"],"default":"record","description":"one update per input record, or per distinct key of each batch"}}}"#;

/// The guest SDK's Fx hasher, used for the key index (and, natively, by the bench's
/// floor); re-exported here for the bench.
pub use nop_stream_sdk::hash::{FxBuildHasher, FxHasher, fx_hash, key_eq};

/// When updates are emitted; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// One update per input record.
    Record,
    /// One update per distinct key of each batch.
    Batch,
}

/// An entry of [`Groups`]' index: a key's first 8 bytes (zero-padded) as a word, its
/// length and its group. A key of at most 8 bytes is equal to a probed one iff word and
/// length are, so the common `u64` key is matched without reading the key bytes.
#[derive(Debug, Clone, Copy)]
struct Slot {
    word: u64,
    len: u32,
    group: u32,
}

/// The first 8 bytes of `key`, zero-padded, as a little-endian word.
#[inline(always)]
fn word_of(key: &[u8]) -> u64 {
    match <&[u8; 8]>::try_from(key) {
        Ok(k) => u64::from_le_bytes(*k),
        Err(_) => {
            let mut b = [0u8; 8];
            let n = key.len().min(8);
            b[..n].copy_from_slice(&key[..n]);
            u64::from_le_bytes(b)
        }
    }
}

/// Distinct keys and the group of each record of a batch, with a hash index over the
/// keys. [`KeyedCount`] keeps the keys (its cache) across batches; `of_record` is per batch.
#[derive(Debug, Default)]
pub struct Groups {
    /// The keys' slots, hashed by [`fx_hash`] of the key bytes.
    index: HashTable<Slot>,
    /// Distinct keys, concatenated, first-seen order.
    pub keys: Vec<u8>,
    /// Exclusive end of each distinct key in `keys`.
    pub key_ends: Vec<u32>,
    /// Group of each record of the batch.
    pub of_record: Vec<u32>,
}

/// The capacity [`Groups::clear`] keeps: a default batch's records (1024) and then some.
const SMALL_INDEX: usize = 4096;

/// Distinct key `g` of `keys`/`key_ends`.
#[inline(always)]
fn key_of<'a>(keys: &'a [u8], key_ends: &[u32], g: usize) -> &'a [u8] {
    let start = if g == 0 { 0 } else { key_ends[g - 1] as usize };
    &keys[start..key_ends[g] as usize]
}

impl Groups {
    fn key(&self, g: usize) -> &[u8] {
        key_of(&self.keys, &self.key_ends, g)
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.key_ends.len()
    }

    /// Whether no key was added.
    pub fn is_empty(&self) -> bool {
        self.key_ends.is_empty()
    }

    /// Empties the groups, keeping the capacity of a batch or so: an index grown to a full
    /// cache is freed, because probing a large, nearly empty table misses the CPU cache on
    /// every record (batches of a key space larger than the cache run through an emptied
    /// one).
    pub fn clear(&mut self) {
        // `with_capacity(SMALL_INDEX)` gives up to twice that (a power of two of buckets).
        if self.index.capacity() > 2 * SMALL_INDEX {
            self.index = HashTable::with_capacity(SMALL_INDEX);
        } else {
            self.index.clear();
        }
        self.keys.clear();
        self.key_ends.clear();
        self.of_record.clear();
    }

    /// Forgets the keys from group `len` on (a load that failed).
    pub fn truncate(&mut self, len: usize) {
        self.index.retain(|s| (s.group as usize) < len);
        let end = if len == 0 {
            0
        } else {
            self.key_ends[len - 1] as usize
        };
        self.keys.truncate(end);
        self.key_ends.truncate(len);
    }

    /// Adds one record with `key`, returning its group. One probe of the index per record;
    /// a key of at most 8 bytes is compared as a word and a length.
    #[inline]
    pub fn add(&mut self, key: &[u8]) -> u32 {
        let Groups {
            index,
            keys,
            key_ends,
            of_record,
        } = self;
        let word = word_of(key);
        let len = key.len() as u32;
        let hash = fx_hash(key);
        let eq = |s: &Slot| {
            s.word == word
                && s.len == len
                && (len <= 8 || key_of(keys, key_ends, s.group as usize) == key)
        };
        let g = match index.find(hash, eq) {
            Some(s) => s.group,
            None => {
                extend_key(keys, key);
                key_ends.push(keys.len() as u32);
                let group = (key_ends.len() - 1) as u32;
                index.insert_unique(hash, Slot { word, len, group }, |s| {
                    fx_hash(key_of(keys, key_ends, s.group as usize))
                });
                group
            }
        };
        of_record.push(g);
        g
    }
}

/// Most keys [`KeyedCount`] keeps cached between batches; past it (or past
/// [`MAX_CACHED_KEY_BYTES`]) the cache is written back and emptied before the next batch.
pub const MAX_CACHED_KEYS: usize = 1 << 16;
/// Most key bytes [`KeyedCount`] keeps cached between batches (4 MiB).
pub const MAX_CACHED_KEY_BYTES: usize = 4 << 20;
/// Batches [`KeyedCount`] runs without its cache (each batch written back and the cache
/// emptied after it) once the cache filled up with more than half of its lookups missing:
/// a key space much larger than the cache (a million auctions) is faster without it.
/// Then it tries the cache again.
pub const BYPASS_BATCHES: u32 = 1024;
/// Most keys one `value_put_many` of a write-back carries. The host applies a memory
/// budget (`state_memory_bytes`) after each call, so a write-back of a full cache in one
/// call would grow its working set by up to [`MAX_CACHED_KEYS`] entries past the budget
/// (and its hash tables keep that capacity); in chunks it grows by at most this many. The
/// SDK's [`STATE_WRITE_CHUNK`](nop_stream_sdk::STATE_WRITE_CHUNK), which its CEP operator
/// and window cache use too.
pub const WRITE_BACK_CHUNK: usize = nop_stream_sdk::STATE_WRITE_CHUNK;

/// The operator.
#[derive(Debug)]
pub struct KeyedCount {
    emit: Emit,
    state: StateHandle,
    /// Whether the count state has a TTL (`state_ttl_ms`): then nothing is cached across
    /// batches, so every write reaches the host within its batch and starts the entry's
    /// lifetime there (docs/operations.md, "State TTL").
    ttl: bool,
    /// The cached keys (the index persists across batches; `of_record` is per batch).
    groups: Groups,
    /// Count of each cached key, including every record processed so far.
    counts: Vec<u64>,
    /// Whether each cached key changed since the last write-back.
    dirty: Vec<bool>,
    /// The dirty keys, in the order they were first changed.
    dirty_list: Vec<u32>,
    /// Batch number in which each cached key was last seen (`Emit::Batch`).
    seen: Vec<u64>,
    /// Number of the current batch.
    batch_no: u64,
    /// Records looked up, and keys read from the host, since the cache was last emptied.
    cycle_lookups: u64,
    cycle_misses: u64,
    /// Batches left that write back and empty the cache after themselves, as with a TTL
    /// (set when the cache filled up with most lookups missing).
    bypass: u32,
    /// Scratch: keys of a batch in first-seen order (`Emit::Batch`), relative key ends
    /// of a load, values of a write-back.
    scratch: Vec<u32>,
    keys: Vec<u8>,
    key_ends: Vec<u32>,
    values: Vec<u8>,
    value_ends: Vec<u32>,
}

impl KeyedCount {
    /// Writes every count changed since the last write-back to host state, with one
    /// `value_put_many` per [`WRITE_BACK_CHUNK`] keys.
    fn write_back(&mut self, ctx: &mut dyn Context) {
        for chunk in self.dirty_list.chunks(WRITE_BACK_CHUNK) {
            self.keys.clear();
            self.key_ends.clear();
            self.values.clear();
            self.value_ends.clear();
            for &g in chunk {
                let g = g as usize;
                self.dirty[g] = false;
                extend_key(&mut self.keys, self.groups.key(g));
                self.key_ends.push(self.keys.len() as u32);
                self.values.extend_from_slice(&self.counts[g].to_le_bytes());
                self.value_ends.push(self.values.len() as u32);
            }
            ctx.value_put_many(
                self.state,
                &[],
                &self.keys,
                &self.key_ends,
                &self.values,
                &self.value_ends,
            );
        }
        self.dirty_list.clear();
    }

    /// Writes back and forgets every cached key.
    fn drop_cache(&mut self, ctx: &mut dyn Context) {
        self.cycle_lookups = 0;
        self.cycle_misses = 0;
        self.write_back(ctx);
        self.groups.clear();
        self.counts.clear();
        self.dirty.clear();
        self.seen.clear();
    }

    /// Reads the counts of the keys cached since group `known` (this batch's misses)
    /// with one `value_get_many`. On a malformed stored count those keys leave the cache
    /// again and nothing changed.
    fn load(&mut self, ctx: &mut dyn Context, known: usize) -> Result<()> {
        let g = &mut self.groups;
        let start = if known == 0 { 0 } else { g.key_ends[known - 1] };
        self.scratch.clear();
        self.scratch
            .extend(g.key_ends[known..].iter().map(|&e| e - start));
        let stored = ctx.value_get_many(self.state, &[], &g.keys[start as usize..], &self.scratch);
        for i in 0..g.len() - known {
            let c = match stored.get(i) {
                None => 0,
                Some(v) => match <[u8; 8]>::try_from(v) {
                    Ok(b) => u64::from_le_bytes(b),
                    Err(_) => {
                        g.truncate(known);
                        self.counts.truncate(known);
                        return Err(PluginError::state(format!(
                            "stored count of {} bytes, expected 8 ({COUNT_CODEC})",
                            v.len()
                        )));
                    }
                },
            };
            self.counts.push(c);
        }
        self.dirty.resize(g.len(), false);
        self.seen.resize(g.len(), 0);
        Ok(())
    }
}

/// Marks cached key `g` changed since the last write-back.
#[inline(always)]
fn mark_dirty(dirty: &mut [bool], dirty_list: &mut Vec<u32>, g: u32) {
    let d = &mut dirty[g as usize];
    if !*d {
        *d = true;
        dirty_list.push(g);
    }
}

fn parse_emit(config: &str) -> std::result::Result<Emit, String> {
    let trimmed: String = config.chars().filter(|c| !c.is_whitespace()).collect();
    match trimmed.as_str() {
        "" | "{}" | r#"{"emit":"record"}"# => Ok(Emit::Record),
        r#"{"emit":"batch"}"# => Ok(Emit::Batch),
        other => Err(format!(
            "keyed-count config {other}: expected {{}} or {{\"emit\": \"record\"|\"batch\"}}"
        )),
    }
}

impl Operator for KeyedCount {
    fn describe() -> PluginInfo {
        PluginInfo::operator("keyed-count", "0.1.0")
            .description("Running count per record key in keyed state; emits (key, count) updates")
            .state(StateDescriptor::new(
                COUNT_STATE,
                StateKind::Value,
                1,
                COUNT_CODEC,
            ))
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let emit = parse_emit(config).map_err(PluginError::invalid_config)?;
        let state = ctx.open_state(COUNT_STATE)?;
        Ok(Self {
            emit,
            state,
            ttl: ctx.state_ttl_ms(state).is_some(),
            groups: Groups::default(),
            counts: Vec::new(),
            dirty: Vec::new(),
            dirty_list: Vec::new(),
            seen: Vec::new(),
            batch_no: 0,
            cycle_lookups: 0,
            cycle_misses: 0,
            bypass: 0,
            scratch: Vec::new(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            values: Vec::new(),
            value_ends: Vec::new(),
        })
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if !batch.is_keyed() {
            return Err(PluginError::invalid_record(
                "keyed-count needs keyed records (a HASH input edge)",
            ));
        }
        if self.groups.len() >= MAX_CACHED_KEYS || self.groups.keys.len() >= MAX_CACHED_KEY_BYTES {
            // The cache filled up: the key space is larger than it. If most lookups since
            // it was last emptied missed, caching costs more than it saves (each key is
            // read and written in the host anyway, and written back long after, when its
            // entry is cold there): bypass it for a while.
            if self.cycle_misses * 2 > self.cycle_lookups {
                self.bypass = BYPASS_BATCHES;
            }
            self.drop_cache(ctx);
        }
        let known = self.groups.len();
        let g = &mut self.groups;
        g.of_record.clear();
        for i in 0..batch.len() {
            g.add(batch.key(i).unwrap_or_default());
        }
        self.cycle_lookups += batch.len() as u64;
        self.cycle_misses += (g.len() - known) as u64;
        if g.len() > known {
            self.load(ctx, known)?;
        }
        // Nothing below fails: a batch either changes every count it touches or none.
        let g = &self.groups;
        match self.emit {
            Emit::Record => {
                out.data
                    .reserve(batch.len() * (8 + g.keys.len() / g.len().max(1)));
                for (i, &grp) in g.of_record.iter().enumerate() {
                    mark_dirty(&mut self.dirty, &mut self.dirty_list, grp);
                    let c = &mut self.counts[grp as usize];
                    *c += 1;
                    let key = g.key(grp as usize);
                    let count = *c;
                    out.push_with(Some(key), batch.timestamp(i), |buf| {
                        extend_key(buf, key);
                        buf.extend_from_slice(&count.to_le_bytes());
                    });
                }
            }
            Emit::Batch => {
                self.batch_no += 1;
                self.scratch.clear();
                for &grp in &g.of_record {
                    self.counts[grp as usize] += 1;
                    let seen = &mut self.seen[grp as usize];
                    if *seen != self.batch_no {
                        *seen = self.batch_no;
                        self.scratch.push(grp);
                        mark_dirty(&mut self.dirty, &mut self.dirty_list, grp);
                    }
                }
                for &grp in &self.scratch {
                    let key = g.key(grp as usize);
                    let count = self.counts[grp as usize];
                    out.push_with(Some(key), None, |buf| {
                        buf.extend_from_slice(key);
                        buf.extend_from_slice(&count.to_le_bytes());
                    });
                }
            }
        }
        if self.ttl {
            self.drop_cache(ctx);
        } else if self.bypass > 0 {
            self.bypass -= 1;
            self.drop_cache(ctx);
        }
        Ok(())
    }

    fn prepare_checkpoint(
        &mut self,
        ctx: &mut dyn Context,
        _epoch: u64,
        _out: &mut Batch,
    ) -> Result<()> {
        self.write_back(ctx);
        Ok(())
    }

    fn finish(&mut self, ctx: &mut dyn Context, _out: &mut Batch) -> Result<()> {
        self.write_back(ctx);
        Ok(())
    }
}

nop_stream_sdk::export_operator!(KeyedCount);

#[cfg(test)]
mod diff_random_tests;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nop_stream_sdk::MockContext;

    use super::*;

    fn batch_of(keys: &[u64]) -> Batch {
        let mut input = Batch::default();
        for k in keys {
            input.push_keyed(&k.to_le_bytes(), b"x");
        }
        input
    }

    fn decode(out: &Batch) -> Vec<(u64, u64)> {
        out.iter()
            .map(|r| {
                assert_eq!(r.key.unwrap(), &r.data[..8]);
                let k = u64::from_le_bytes(r.data[..8].try_into().unwrap());
                let c = u64::from_le_bytes(r.data[8..].try_into().unwrap());
                (k, c)
            })
            .collect()
    }

    /// The count of `key` in host state (the mock), if any.
    fn stored(ctx: &mut MockContext, key: u64) -> Option<u64> {
        let h = ctx.open_state(COUNT_STATE).unwrap();
        let v = ctx.value_get_many(h, &[], &key.to_le_bytes(), &[8]);
        v.get(0).map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }

    /// Runs `keys` in batches of `batch`, taking a checkpoint every `every` batches and,
    /// when `crash` is set, dropping the instance right after each checkpoint's next
    /// batch and restoring from that checkpoint (state and input position), so every
    /// batch after a checkpoint runs twice. Returns the updates the surviving runs
    /// emitted, in order, and the stored counts after `finish`.
    fn run(
        keys: &[u64],
        batch: usize,
        every: usize,
        crash: bool,
        config: &str,
    ) -> (Vec<(u64, u64)>, BTreeMap<u64, u64>) {
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), config).unwrap();
        let chunks: Vec<&[u64]> = keys.chunks(batch).collect();
        let mut updates = Vec::new();
        // (input position, state, updates emitted) at the last checkpoint.
        let mut checkpoint = (0, ctx.clone(), 0);
        let mut crashed_at = None;
        let mut i = 0;
        while i < chunks.len() {
            let mut out = Batch::default();
            op.process(&mut ctx, 0, &batch_of(chunks[i]), &mut out)
                .unwrap();
            updates.extend(decode(&out));
            i += 1;
            if crash && checkpoint.0 + 1 == i && crashed_at != Some(i) {
                // Crash after the first batch past the checkpoint: state and output go
                // back to the checkpoint, and the instance is new.
                crashed_at = Some(i);
                i = checkpoint.0;
                ctx = checkpoint.1.clone();
                updates.truncate(checkpoint.2);
                op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), config).unwrap();
                continue;
            }
            if i % every == 0 {
                let mut out = Batch::default();
                op.prepare_checkpoint(&mut ctx, i as u64, &mut out).unwrap();
                assert!(out.is_empty());
                checkpoint = (i, ctx.clone(), updates.len());
            }
        }
        op.finish(&mut ctx, &mut Batch::default()).unwrap();
        let mut last = BTreeMap::new();
        for &(k, _) in &updates {
            last.insert(k, stored(&mut ctx, k).unwrap());
        }
        (updates, last)
    }

    #[test]
    fn counts_match_a_direct_computation_across_checkpoints_and_restores() {
        let keys: Vec<u64> = (0..5000u64).map(|i| (i * 7919) % 97).collect();
        let mut want_updates = Vec::new();
        let mut want: BTreeMap<u64, u64> = BTreeMap::new();
        for &k in &keys {
            let c = want.entry(k).or_default();
            *c += 1;
            want_updates.push((k, *c));
        }
        for batch in [1, 7, 1000, 10_000] {
            for (every, crash) in [(1, false), (3, false), (1, true), (4, true)] {
                let what = format!("batch {batch}, checkpoint every {every}, crash {crash}");
                let (updates, last) = run(&keys, batch, every, crash, "{}");
                assert_eq!(updates, want_updates, "{what}");
                assert_eq!(last, want, "{what}");
                let (updates, last) = run(&keys, batch, every, crash, r#"{"emit": "batch"}"#);
                // One update per distinct key of each batch, first-seen order, with the
                // key's count at the end of the batch.
                let mut want_batch = Vec::new();
                let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
                for chunk in keys.chunks(batch) {
                    let mut order = Vec::new();
                    for &k in chunk {
                        *counts.entry(k).or_default() += 1;
                        if !order.contains(&k) {
                            order.push(k);
                        }
                    }
                    want_batch.extend(order.iter().map(|k| (*k, counts[k])));
                }
                assert_eq!(updates, want_batch, "{what}");
                assert_eq!(last, want, "{what}");
            }
        }
    }

    /// Without a TTL counts stay in the instance until a checkpoint (or a full cache);
    /// with one (`state_ttl_ms`), every batch writes its counts back and reads them again,
    /// so each write reaches the host when it happens.
    #[test]
    fn a_ttl_writes_every_batch_back_and_a_full_cache_writes_back_early() {
        let cached = |ctx: &mut MockContext| {
            let mut op = KeyedCount::open(ctx, &TaskInfo::for_tests(), "{}").unwrap();
            for _ in 0..2 {
                op.process(ctx, 0, &batch_of(&[1, 2, 1]), &mut Batch::default())
                    .unwrap();
            }
            op
        };
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = cached(&mut ctx);
        assert_eq!(stored(&mut ctx, 1), None, "cached until the checkpoint");
        op.prepare_checkpoint(&mut ctx, 1, &mut Batch::default())
            .unwrap();
        assert_eq!(
            (stored(&mut ctx, 1), stored(&mut ctx, 2)),
            (Some(4), Some(2))
        );

        let mut ctx = MockContext::for_operator::<KeyedCount>().with_state_ttl(COUNT_STATE, 1000);
        let mut op = cached(&mut ctx);
        assert_eq!(
            (stored(&mut ctx, 1), stored(&mut ctx, 2)),
            (Some(4), Some(2))
        );
        // A value changed in the host (expired and rewritten) is read again.
        let h = ctx.open_state(COUNT_STATE).unwrap();
        ctx.value_put_many(
            h,
            &[],
            &1u64.to_le_bytes(),
            &[8],
            &10u64.to_le_bytes(),
            &[8],
        );
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &batch_of(&[1]), &mut out).unwrap();
        assert_eq!(decode(&out), [(1, 11)]);

        // Past MAX_CACHED_KEYS distinct keys the cache is written back before a batch.
        // Half of these lookups hit (each key twice in a row), so caching goes on.
        let fill = |ctx: &mut MockContext, op: &mut KeyedCount, keys: &[u64], twice: bool| {
            for chunk in keys.chunks(500) {
                let mut batch: Vec<u64> = chunk.to_vec();
                if twice {
                    batch.extend_from_slice(chunk);
                }
                op.process(ctx, 0, &batch_of(&batch), &mut Batch::default())
                    .unwrap();
            }
        };
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let keys: Vec<u64> = (0..MAX_CACHED_KEYS as u64 + 1000).collect();
        fill(&mut ctx, &mut op, &keys, true);
        assert_eq!(stored(&mut ctx, 0), Some(2), "written back when full");
        assert_eq!(stored(&mut ctx, keys[keys.len() - 1]), None, "cached");
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &batch_of(&[0, 0]), &mut out)
            .unwrap();
        assert_eq!(decode(&out), [(0, 3), (0, 4)]);

        // With every lookup a miss, a full cache is bypassed for BYPASS_BATCHES batches:
        // each batch writes back at once.
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        fill(&mut ctx, &mut op, &keys, false);
        assert_eq!(stored(&mut ctx, keys[keys.len() - 1]), Some(1), "bypassed");
        assert_eq!(op.bypass, BYPASS_BATCHES - 2);
        // Then the cache is tried again.
        for i in 0..u64::from(BYPASS_BATCHES - 2) {
            op.process(
                &mut ctx,
                0,
                &batch_of(&[1 << 40 | i]),
                &mut Batch::default(),
            )
            .unwrap();
            assert_eq!(stored(&mut ctx, 1 << 40 | i), Some(1), "bypassed");
        }
        assert_eq!(op.bypass, 0);
        for _ in 0..2 {
            op.process(&mut ctx, 0, &batch_of(&[1 << 41]), &mut Batch::default())
                .unwrap();
        }
        assert_eq!(
            stored(&mut ctx, 1 << 41),
            None,
            "cached again, not yet written"
        );
        op.prepare_checkpoint(&mut ctx, 9, &mut Batch::default())
            .unwrap();
        assert_eq!(stored(&mut ctx, 1 << 41), Some(2));
    }

    /// A malformed stored count fails the batch before any count changes, and leaves no
    /// trace of the batch's keys in the cache.
    #[test]
    fn a_malformed_stored_count_fails_the_batch_and_changes_nothing() {
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        op.process(&mut ctx, 0, &batch_of(&[1]), &mut Batch::default())
            .unwrap();
        let h = ctx.open_state(COUNT_STATE).unwrap();
        ctx.value_put_many(h, &[], &2u64.to_le_bytes(), &[8], b"bad", &[3]);
        let err = op
            .process(&mut ctx, 0, &batch_of(&[1, 3, 2]), &mut Batch::default())
            .unwrap_err();
        assert!(err.to_string().contains("stored count of 3 bytes"), "{err}");
        ctx.value_put_many(h, &[], &2u64.to_le_bytes(), &[8], &5u64.to_le_bytes(), &[8]);
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &batch_of(&[1, 3, 2]), &mut out)
            .unwrap();
        assert_eq!(decode(&out), [(1, 2), (3, 1), (2, 6)]);
    }

    #[test]
    fn look_alike_keys_stay_apart_and_config_is_checked() {
        // Keys that share a word or a prefix: an 8-byte key, the same bytes without the
        // last (zero-padded alike), with a zero appended, two 12-byte keys with one first
        // word, the empty key and a zero byte.
        let a = 7u64.to_le_bytes();
        let long1 = b"\x07\0\0\0\0\0\0\0abcd";
        let long2 = b"\x07\0\0\0\0\0\0\0abce";
        let keys: [&[u8]; 7] = [
            &a,
            &a[..7],
            b"\x07\0\0\0\0\0\0\0\0",
            long1,
            long2,
            b"",
            b"\0",
        ];
        let mut g = Groups::default();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(g.add(k), i as u32, "{k:?}");
        }
        for (i, k) in keys.iter().enumerate().rev() {
            assert_eq!(g.add(k), i as u32, "{k:?} again");
            assert_eq!(g.key(i), *k);
        }
        assert_eq!(g.len(), keys.len());
        // Emptied, an index grown past a batch's size is freed; a small one is kept.
        let mut big = Groups::default();
        for k in 0..20_000u64 {
            big.add(&k.to_le_bytes());
        }
        big.clear();
        assert!(big.index.capacity() <= 2 * SMALL_INDEX && big.is_empty());
        let small = big.index.capacity();
        big.add(b"x");
        big.clear();
        assert_eq!(big.index.capacity(), small, "kept");
        // A truncated index forgets exactly the keys past the cut.
        g.truncate(3);
        assert_eq!(g.len(), 3);
        assert_eq!(g.add(long2), 3);
        assert_eq!(g.add(&a[..7]), 1);
        assert_eq!(g.key(3), long2);
        assert!(key_eq(&a, &a) && !key_eq(&a, &a[..7]));
        assert!(parse_emit(r#"{"emit":"never"}"#).is_err());
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let mut unkeyed = Batch::default();
        unkeyed.push(b"x");
        assert!(
            op.process(&mut ctx, 0, &unkeyed, &mut Batch::default())
                .is_err()
        );
    }
}
