//! The bids generator: a Rust port of `gen.py` (the peers' reference generator), byte for
//! byte — Python's Mersenne Twister (`random.Random(seed)`) and `randrange` are reproduced
//! exactly, so `gen N 10000 OUT` writes the same file as `python3 gen.py N 10000 OUT`.
//!
//! Format: a header line `auction,bidder,price,channel,date_time`, then one line per bid:
//! `auction` uniform over `1000 .. 1000 + keys`, `bidder` uniform over `0 .. 100_000`,
//! `price` (cents) uniform over `100 .. 1_000_000`, `channel` cycling Google, Facebook,
//! Baidu, Apple, and `date_time` = 1,700,000,000,000 + i (one event per ms of event time).

use std::io::{self, Write};

/// First event time, ms since the Unix epoch.
pub const T0_MS: i64 = 1_700_000_000_000;
/// Seed `gen.py` uses.
pub const SEED: u32 = 42;
/// Header line (without newline).
pub const HEADER: &str = "auction,bidder,price,channel,date_time";
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

const N: usize = 624;
const M: usize = 397;

/// MT19937 seeded like CPython's `random.Random(seed)` for a seed below 2^32.
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyRandom")
            .field("index", &self.index)
            .finish()
    }
}

impl PyRandom {
    /// `random.Random(seed)`: `init_by_array([seed])`.
    pub fn new(seed: u32) -> Self {
        let mut mt = [0u32; N];
        mt[0] = 19_650_218;
        for i in 1..N {
            mt[i] = 1_812_433_253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        let key = [seed];
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        PyRandom { mt, index: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.mt[i] & 0x8000_0000) | (self.mt[(i + 1) % N] & 0x7fff_ffff);
            let mut v = self.mt[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.mt[i] = v;
        }
        self.index = 0;
    }

    /// `genrand_uint32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `randrange(n)` for `1 <= n < 2^32`: `getrandbits(n.bit_length())` with rejection.
    pub fn below(&mut self, n: u32) -> u32 {
        assert!(n > 0, "randrange of an empty range");
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.next_u32() >> (32 - k);
            if r < n {
                return r;
            }
        }
    }
}

/// Writes `n` bids over `keys` auctions (with the header line if `header`) to `out`.
///
/// # Errors
/// Write failures.
pub fn write_bids(out: &mut impl Write, n: u64, keys: u32, header: bool) -> io::Result<()> {
    let mut rng = PyRandom::new(SEED);
    if header {
        writeln!(out, "{HEADER}")?;
    }
    let mut line = Vec::with_capacity(64);
    for i in 0..n {
        let a = 1000 + u64::from(rng.below(keys));
        let b = rng.below(100_000);
        let p = 100 + rng.below(1_000_000 - 100);
        let c = CHANNELS[(i & 3) as usize];
        let ts = T0_MS + i as i64;
        line.clear();
        writeln!(line, "{a},{b},{p},{c},{ts}")?;
        out.write_all(&line)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_cpython_random_42() {
        // python3 -c "import random; r=random.Random(42); print([r.randrange(10000) for _ in range(3)], r.getrandbits(32))"
        let mut r = PyRandom::new(42);
        let got: Vec<u32> = (0..3).map(|_| r.below(10_000)).collect();
        assert_eq!(got, vec![1824, 409, 4506]);
        assert_eq!(r.next_u32(), 1_051_802_512);
    }

    #[test]
    fn writes_the_reference_lines() {
        let mut out = Vec::new();
        write_bids(&mut out, 3, 10_000, true).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], HEADER);
        assert_eq!(lines.len(), 4);
        assert!(lines[3].ends_with(",Baidu,1700000000002"), "{}", lines[3]);
    }
}
