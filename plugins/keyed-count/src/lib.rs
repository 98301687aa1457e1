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
//! State: one value state `count` (schema 1, codec [`COUNT_CODEC`]: `u64` LE). Each batch
//! costs exactly one `value_get_many` and one `value_put_many` over its distinct keys
//! (design §16, "batch at the boundary"); nothing survives a batch in the instance except
//! reused scratch buffers, and nothing is allocated per record.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

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

/// The guest SDK's Fx hasher, used for the per-batch key index (and, natively, by the
/// bench's floor); re-exported here for the bench.
pub use nop_stream_sdk::hash::{FxBuildHasher, FxHasher, fx_hash, key_eq};

/// When updates are emitted; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// One update per input record.
    Record,
    /// One update per distinct key of each batch.
    Batch,
}

/// Per-batch grouping of records by key, reused across batches (cleared, not freed).
#[derive(Debug, Default)]
pub struct Groups {
    /// Key hash → group index. A second key with the same 64-bit hash is not indexed and
    /// is found by a linear scan instead (correct, merely slow, and practically never hit).
    index: HashMap<u64, u32, FxBuildHasher>,
    /// Distinct keys, concatenated, first-seen order.
    pub keys: Vec<u8>,
    /// Exclusive end of each distinct key in `keys`.
    pub key_ends: Vec<u32>,
    /// Group of each record of the batch.
    pub of_record: Vec<u32>,
}

/// Distinct key `g` of `keys`/`key_ends`.
#[inline(always)]
fn key_of<'a>(keys: &'a [u8], key_ends: &[u32], g: usize) -> &'a [u8] {
    let start = if g == 0 { 0 } else { key_ends[g - 1] as usize };
    &keys[start..key_ends[g] as usize]
}

/// Appends a distinct key, returning its group.
#[inline(always)]
fn push_key(keys: &mut Vec<u8>, key_ends: &mut Vec<u32>, key: &[u8]) -> u32 {
    extend_key(keys, key);
    key_ends.push(keys.len() as u32);
    (key_ends.len() - 1) as u32
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

    /// Empties the groups, keeping capacity.
    pub fn clear(&mut self) {
        self.index.clear();
        self.keys.clear();
        self.key_ends.clear();
        self.of_record.clear();
    }

    /// Adds one record with `key`, returning its group. One probe of the index per record.
    pub fn add(&mut self, key: &[u8]) -> u32 {
        let Groups {
            index,
            keys,
            key_ends,
            of_record,
        } = self;
        let g = match index.entry(fx_hash(key)) {
            Entry::Occupied(e) => {
                let g = *e.get();
                if key_eq(key_of(keys, key_ends, g as usize), key) {
                    g
                } else {
                    // Another key with the same hash: not indexed, found by a scan.
                    match (0..key_ends.len()).find(|&g| key_of(keys, key_ends, g) == key) {
                        Some(g) => g as u32,
                        None => push_key(keys, key_ends, key),
                    }
                }
            }
            Entry::Vacant(e) => *e.insert(push_key(keys, key_ends, key)),
        };
        of_record.push(g);
        g
    }
}

/// The operator.
#[derive(Debug)]
pub struct KeyedCount {
    emit: Emit,
    state: StateHandle,
    groups: Groups,
    counts: Vec<u64>,
    values: Vec<u8>,
    value_ends: Vec<u32>,
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
        Ok(Self {
            emit: parse_emit(config).map_err(PluginError::invalid_config)?,
            state: ctx.open_state(COUNT_STATE)?,
            groups: Groups::default(),
            counts: Vec::new(),
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
        let g = &mut self.groups;
        g.clear();
        for i in 0..batch.len() {
            g.add(batch.key(i).unwrap_or_default());
        }
        let stored = ctx.value_get_many(self.state, &[], &g.keys, &g.key_ends);
        self.counts.clear();
        for i in 0..g.len() {
            let c = match stored.get(i) {
                None => 0,
                Some(v) => {
                    let b: [u8; 8] = v.try_into().map_err(|_| {
                        PluginError::state(format!(
                            "stored count of {} bytes, expected 8 ({COUNT_CODEC})",
                            v.len()
                        ))
                    })?;
                    u64::from_le_bytes(b)
                }
            };
            self.counts.push(c);
        }
        match self.emit {
            Emit::Record => {
                out.data.reserve(batch.len() * (8 + g.keys.len() / g.len()));
                for (i, &grp) in g.of_record.iter().enumerate() {
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
                for &grp in &g.of_record {
                    self.counts[grp as usize] += 1;
                }
                for (i, &count) in self.counts.iter().enumerate() {
                    let key = g.key(i);
                    out.push_with(Some(key), None, |buf| {
                        buf.extend_from_slice(key);
                        buf.extend_from_slice(&count.to_le_bytes());
                    });
                }
            }
        }
        self.values.clear();
        self.value_ends.clear();
        for c in &self.counts {
            self.values.extend_from_slice(&c.to_le_bytes());
            self.value_ends.push(self.values.len() as u32);
        }
        ctx.value_put_many(
            self.state,
            &[],
            &g.keys,
            &g.key_ends,
            &self.values,
            &self.value_ends,
        );
        Ok(())
    }
}

nop_stream_sdk::export_operator!(KeyedCount);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nop_stream_sdk::MockContext;

    use super::*;

    fn run(keys: &[u64], batch: usize, config: &str) -> (Vec<(u64, u64)>, BTreeMap<u64, u64>) {
        let mut ctx = MockContext::for_operator::<KeyedCount>();
        let mut updates = Vec::new();
        for chunk in keys.chunks(batch) {
            // A fresh instance per batch: nothing may live in the guest.
            let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), config).unwrap();
            let mut input = Batch::default();
            for k in chunk {
                input.push_keyed(&k.to_le_bytes(), b"x");
            }
            let mut out = Batch::default();
            op.process(&mut ctx, 0, &input, &mut out).unwrap();
            for r in out.iter() {
                assert_eq!(r.key.unwrap(), &r.data[..8]);
                let k = u64::from_le_bytes(r.data[..8].try_into().unwrap());
                let c = u64::from_le_bytes(r.data[8..].try_into().unwrap());
                updates.push((k, c));
            }
        }
        let mut last = BTreeMap::new();
        for &(k, c) in &updates {
            last.insert(k, c);
        }
        (updates, last)
    }

    #[test]
    fn counts_match_a_direct_computation() {
        let keys: Vec<u64> = (0..5000u64).map(|i| (i * 7919) % 97).collect();
        let mut want_updates = Vec::new();
        let mut want: BTreeMap<u64, u64> = BTreeMap::new();
        for &k in &keys {
            let c = want.entry(k).or_default();
            *c += 1;
            want_updates.push((k, *c));
        }
        for batch in [1, 7, 1000, 10_000] {
            let (updates, last) = run(&keys, batch, "{}");
            assert_eq!(updates, want_updates, "batch {batch}");
            assert_eq!(last, want);
            let (updates, last) = run(&keys, batch, r#"{"emit": "batch"}"#);
            assert!(updates.len() <= keys.len());
            assert_eq!(last, want, "batch {batch}");
        }
    }

    #[test]
    fn colliding_hashes_stay_correct_and_config_is_checked() {
        let mut g = Groups::default();
        assert_eq!(g.add(b"a"), 0);
        // Simulate a collision: b"b"'s hash already names the group of b"a".
        g.index.insert(fx_hash(b"b"), 0);
        assert_eq!(g.add(b"b"), 1);
        assert_eq!(g.add(b"b"), 1);
        assert_eq!(g.add(b"a"), 0);
        assert_eq!(g.of_record, vec![0, 1, 1, 0]);
        assert_eq!(g.len(), 2);
        // The same with 8-byte keys (compared as one word) beside keys of other lengths.
        let mut g = Groups::default();
        let a = 7u64.to_le_bytes();
        let b = 8u64.to_le_bytes();
        assert_eq!(g.add(&a), 0);
        g.index.insert(fx_hash(&b), 0);
        assert_eq!(g.add(&b), 1);
        assert_eq!(g.add(&a[..7]), 2);
        assert_eq!(g.add(b"\x07\0\0\0\0\0\0\0\0"), 3);
        assert_eq!(g.add(&b), 1);
        assert_eq!(g.add(&a), 0);
        assert_eq!(g.of_record, vec![0, 1, 2, 3, 1, 0]);
        assert_eq!(g.key(3), b"\x07\0\0\0\0\0\0\0\0");
        assert!(key_eq(&a, &a) && !key_eq(&a, &b) && !key_eq(&a, &a[..7]));
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
