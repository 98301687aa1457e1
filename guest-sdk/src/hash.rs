//! A small, fast, non-cryptographic hasher for guest hash maps ([`FxHasher`], the rustc
//! `FxHasher` scheme on 64-bit words).
//!
//! Why not the std `RandomState` or foldhash: SipHash is slow, a wasm guest has no cheap
//! source of random seeds, and foldhash's folded multiply (a 64 × 64 → 128-bit product)
//! is a libcall on `wasm32` (`__multi3`), which showed as a visible share of guest time in
//! the window and CEP profiles (bench/RESULTS.md, "CEP write-back and the timer index").
//! Fx needs only 64-bit rotates, xors and multiplies, native instructions in wasm.
//!
//! Keys reach an operator routed by the host and from trusted upstream operators, so hash
//! flooding is not a concern; do not use it for keys an outside party chooses freely to
//! degrade the map.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The rustc `FxHasher` scheme over 64-bit little-endian words; see the
/// [module docs](self). Deterministic: the same bytes hash the same in every instance,
/// native or wasm.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    /// Hashes `bytes` in 8-byte little-endian words; a shorter tail is zero-padded and
    /// tagged with its length, so `[0]` and `[0, 0]` differ.
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    /// The state through murmur3's 64-bit finaliser (one multiply between two
    /// xor-shifts; invertible, so no two states collide): a product's low bits depend
    /// only on its inputs' low bits, yet a map takes its bucket from the low bits (the
    /// low 32 on `wasm32`), and a key that varies only in its last bytes (a big-endian
    /// integer) must still spread over them.
    #[inline]
    fn finish(&self) -> u64 {
        let h = (self.hash ^ (self.hash >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

/// `BuildHasher` of [`FxHasher`].
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;

/// A `HashMap` hashed with [`FxHasher`] (create it with `FxHashMap::default()`).
pub type FxHashMap<K, V> = HashMap<K, V, FxBuildHasher>;

/// The [`FxHasher`] hash of `bytes`, without a length prefix: all-zero inputs whose
/// lengths are multiples of 8 hash alike (a map's `Hash` of a slice adds its length).
#[inline]
pub fn fx_hash(bytes: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(bytes);
    h.finish()
}

/// `a == b`, comparing 8-byte keys (the common `u64` id) as one word: slice equality is
/// a `memcmp` call in a wasm guest.
#[inline(always)]
pub fn key_eq(a: &[u8], b: &[u8]) -> bool {
    match (<&[u8; 8]>::try_from(a), <&[u8; 8]>::try_from(b)) {
        (Ok(a), Ok(b)) => u64::from_ne_bytes(*a) == u64::from_ne_bytes(*b),
        _ => a == b,
    }
}

/// The first 8 bytes of `key`, zero-padded, as a big-endian integer. Keys whose prefixes
/// differ compare (as byte strings) like their prefixes, so a sort or a heap can order
/// most keys without a `memcmp` call (a function call in a wasm guest); equal prefixes
/// still need the full comparison.
#[inline]
pub(crate) fn be_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_tail_is_tagged_with_its_length() {
        assert_ne!(fx_hash(&[0]), fx_hash(&[0, 0]));
        assert_ne!(fx_hash(&[]), fx_hash(&[0]));
    }

    #[test]
    fn keys_that_differ_only_in_high_bytes_spread_over_the_low_bits() {
        // Keys varying only in their last byte: a wasm32 map's bucket is taken from the
        // low 32 bits of the hash, which must not all be equal.
        let low: std::collections::BTreeSet<u32> = (0u8..=255)
            .map(|b| {
                let mut k = [0u8; 8];
                k[7] = b;
                fx_hash(&k) as u32 & 0xfff
            })
            .collect();
        assert!(low.len() > 200, "{} distinct low-bit patterns", low.len());
    }
}
