//! StateShard routing (design §3.4): `stateShardId = stableHash(normalizedKey) mod
//! stateShardCount`, and contiguous shard ownership per subtask.

use nop_stream_api::{StateShardId, SubtaskIndex};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The hash from normalized key bytes to a shard, named and versioned in the plan so a
/// restore can refuse a different one (design §10.6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashPolicy {
    /// Hash function name.
    pub name: String,
    /// Version of the normalization + hash rule.
    pub version: u32,
}

impl Default for HashPolicy {
    /// `xxh3-64` with seed 0 over the raw key bytes (keys are normalized by the emitting
    /// operator), version 1.
    fn default() -> Self {
        HashPolicy {
            name: "xxh3-64".into(),
            version: 1,
        }
    }
}

/// Stable 64-bit hash of a normalized key (xxh3-64, seed 0). Never changes for a given
/// [`HashPolicy`] version.
#[inline]
pub fn stable_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The shard of `key` among `shard_count` shards: `stable_hash(key) mod shard_count`
/// (design §3.4). For a power of two (the default 128) the remainder is taken with a mask,
/// the same value without a 64-bit division on the per-record path of a HASH edge.
///
/// # Panics
/// If `shard_count` is 0 (the planner never produces that).
#[inline]
pub fn shard_of(key: &[u8], shard_count: u32) -> StateShardId {
    let h = stable_hash(key);
    let shard = if shard_count.is_power_of_two() {
        h & u64::from(shard_count - 1)
    } else {
        h % u64::from(shard_count)
    };
    StateShardId(shard as u32)
}

/// Shards owned by `subtask` of `parallelism`: the contiguous range
/// `[ceil(i*count/p), ceil((i+1)*count/p))`, so every shard has exactly one owner.
pub fn shards_of(subtask: SubtaskIndex, shard_count: u32, parallelism: u32) -> Range<u32> {
    let c = u64::from(shard_count);
    let p = u64::from(parallelism);
    let i = u64::from(subtask.0);
    let start = (i * c).div_ceil(p);
    let end = ((i + 1) * c).div_ceil(p);
    start as u32..end as u32
}

/// The subtask owning `shard` (inverse of [`shards_of`]).
pub fn owner_of(shard: StateShardId, shard_count: u32, parallelism: u32) -> SubtaskIndex {
    // Largest i with ceil(i*c/p) <= s, i.e. i = floor(s*p/c) adjusted for the ceiling.
    let s = u64::from(shard.0);
    let c = u64::from(shard_count);
    let p = u64::from(parallelism);
    let mut i = (s * p) / c;
    while i + 1 < p && ((i + 1) * c).div_ceil(p) <= s {
        i += 1;
    }
    while i > 0 && (i * c).div_ceil(p) > s {
        i -= 1;
    }
    SubtaskIndex(i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask taken for a power of two gives exactly the remainder of design §3.4.
    #[test]
    fn shard_of_is_the_hash_modulo_the_count() {
        for count in [1u32, 2, 3, 7, 64, 100, 128, 1000, 1 << 20] {
            for i in 0u64..2000 {
                let key = i.to_le_bytes();
                let want = (stable_hash(&key) % u64::from(count)) as u32;
                assert_eq!(shard_of(&key, count).0, want, "count {count}, key {i}");
            }
        }
    }
}
