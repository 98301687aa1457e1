//! Serde encodings of [`crate::Batch`]'s per-record columns as one byte string each:
//! `ends` and `key_ends` as varints of the difference to the previous value, `timestamps`
//! as zigzag varints of the same. A record's length or key length is usually below 128 and
//! neighbouring timestamps are close, so a column costs about a byte per record on the
//! wire, and it is written and read by one tight loop over a byte slice instead of one
//! serde call per element (the data plane's cost, bench/RESULTS.md, "The data plane as
//! bytes").
//!
//! Every `Vec<u32>` and `Vec<i64>` round-trips exactly, decreasing ones included
//! (differences wrap). Varints are LEB128: seven bits per byte, least significant group
//! first, the high bit set on every byte but the last; at most 5 bytes for a `u32` and 10
//! for a `u64`.
//!
//! In a self-describing format (JSON) a column is an array of byte values, as
//! `serde_bytes` writes it.

use serde::de::{Error, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one varint of at most `max_bytes` bytes at `*at`, advancing it.
fn get_varint(bytes: &[u8], at: &mut usize, max_bytes: usize) -> Result<u64, &'static str> {
    let mut v: u64 = 0;
    for i in 0..max_bytes {
        let Some(&b) = bytes.get(*at) else {
            return Err("a varint is cut short");
        };
        *at += 1;
        let bits = u64::from(b & 0x7f);
        let shift = 7 * i as u32;
        if (shift == 63 && bits > 1) || (max_bytes == 5 && shift == 28 && bits > 0x0f) {
            return Err("a varint overflows its type");
        }
        v |= bits << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("a varint is longer than its type allows")
}

/// Encodes a `u32` column as varint differences (see the module docs).
pub fn encode_u32s(values: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() + values.len() / 2 + 1);
    let mut prev = 0u32;
    for &v in values {
        put_varint(&mut out, u64::from(v.wrapping_sub(prev)));
        prev = v;
    }
    out
}

/// Decodes what [`encode_u32s`] wrote.
///
/// # Errors
/// A cut short, overlong or overflowing varint.
pub fn decode_u32s(bytes: &[u8]) -> Result<Vec<u32>, &'static str> {
    let mut out = Vec::with_capacity(bytes.len());
    let (mut at, mut prev) = (0usize, 0u32);
    while at < bytes.len() {
        // Most differences fit one byte.
        let b = bytes[at];
        let d = if b < 0x80 {
            at += 1;
            u32::from(b)
        } else {
            get_varint(bytes, &mut at, 5)? as u32
        };
        prev = prev.wrapping_add(d);
        out.push(prev);
    }
    Ok(out)
}

/// Encodes an `i64` column as zigzag varint differences (see the module docs).
pub fn encode_i64s(values: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 2 + 1);
    let mut prev = 0i64;
    for &v in values {
        let d = v.wrapping_sub(prev);
        put_varint(&mut out, ((d << 1) ^ (d >> 63)) as u64);
        prev = v;
    }
    out
}

/// Decodes what [`encode_i64s`] wrote.
///
/// # Errors
/// A cut short, overlong or overflowing varint.
pub fn decode_i64s(bytes: &[u8]) -> Result<Vec<i64>, &'static str> {
    let mut out = Vec::with_capacity(bytes.len() / 2 + 1);
    let (mut at, mut prev) = (0usize, 0i64);
    while at < bytes.len() {
        let z = get_varint(bytes, &mut at, 10)?;
        let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
        prev = prev.wrapping_add(d);
        out.push(prev);
    }
    Ok(out)
}

/// A visitor of one byte string, borrowed, owned or (self-describing formats) a sequence.
struct Bytes<F>(F, &'static str);

impl<'de, T, F: FnOnce(&[u8]) -> Result<T, &'static str>> Visitor<'de> for Bytes<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} as a byte string", self.1)
    }
    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<T, E> {
        let what = self.1;
        (self.0)(v).map_err(|e| E::custom(format_args!("{what}: {e}")))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        self.visit_bytes(&v)
    }
}

/// `#[serde(with = "delta::u32s")]`: a `Vec<u32>` column.
pub mod u32s {
    use super::*;

    /// Serializes `v` as one byte string.
    pub fn serialize<S: Serializer>(v: &[u32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&encode_u32s(v))
    }

    /// Deserializes a byte string written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
        d.deserialize_bytes(Bytes(decode_u32s, "an offset column"))
    }
}

/// `#[serde(with = "delta::i64s")]`: a `Vec<i64>` column.
pub mod i64s {
    use super::*;

    /// Serializes `v` as one byte string.
    pub fn serialize<S: Serializer>(v: &[i64], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&encode_i64s(v))
    }

    /// Deserializes a byte string written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
        d.deserialize_bytes(Bytes(decode_i64s, "a timestamp column"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_column_round_trips(u in proptest::collection::vec(any::<u32>(), 0..300),
                                  i in proptest::collection::vec(any::<i64>(), 0..300)) {
            prop_assert_eq!(decode_u32s(&encode_u32s(&u)).unwrap(), u);
            prop_assert_eq!(decode_i64s(&encode_i64s(&i)).unwrap(), i);
        }

        #[test]
        fn garbage_decodes_or_errs_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_u32s(&b);
            let _ = decode_i64s(&b);
        }
    }

    #[test]
    fn short_records_and_close_timestamps_cost_a_byte_each() {
        let ends: Vec<u32> = (1..=1024).map(|i| i * 60).collect();
        assert_eq!(encode_u32s(&ends).len(), 1024);
        let ts: Vec<i64> = (0..1024).map(|i| 1_700_000_000_000 + i * 3).collect();
        // The first is the full value (6 bytes as a zigzag varint), the rest one byte.
        assert_eq!(encode_i64s(&ts).len(), 6 + 1023);
        // A decrease wraps: 0 after u32::MAX is a difference of 1.
        assert_eq!(encode_u32s(&[u32::MAX, 0]).len(), 5 + 1);
    }

    #[test]
    fn malformed_columns_are_named() {
        assert_eq!(decode_u32s(&[0x80]), Err("a varint is cut short"));
        assert_eq!(
            decode_u32s(&[0xff, 0xff, 0xff, 0xff, 0x1f]),
            Err("a varint overflows its type")
        );
        assert_eq!(
            decode_u32s(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00]),
            Err("a varint is longer than its type allows")
        );
        assert_eq!(decode_i64s(&[0xff; 11]), Err("a varint overflows its type"));
    }
}
