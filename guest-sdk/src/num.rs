//! Numbers as they appear in JSON records, and an exactly rounded float sum: the
//! arithmetic of aggregate functions whose results must equal an independent computation
//! whatever the batch boundaries and record order (used by `keyed-aggregate` and
//! `window-aggregate`); and [`parse_i64`], integers of text columns parsed from bytes.

use std::cmp::Ordering;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// A JSON number: integers that fit `i64` stay exact, everything else is `f64`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Num {
    /// An integer in `i64` range.
    Int(i64),
    /// Any other (finite) number.
    Float(f64),
}

impl Num {
    /// The value as `f64` (rounded for integers beyond 2^53).
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn as_f64(self) -> f64 {
        match self {
            Self::Int(i) => i as f64,
            Self::Float(f) => f,
        }
    }

    /// Orders two numbers: integers exactly, otherwise as `f64`.
    #[must_use]
    pub fn compare(self, other: Self) -> Ordering {
        match (self, other) {
            (Self::Int(a), Self::Int(b)) => a.cmp(&b),
            (a, b) => a.as_f64().total_cmp(&b.as_f64()),
        }
    }

    /// Appends the number as JSON (integers as digits, floats in serde_json's shortest
    /// round-trip form).
    pub fn write_json(self, out: &mut Vec<u8>) {
        match self {
            Self::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
            Self::Float(f) => write_f64(f, out),
        }
    }
}

/// Appends `f` as a JSON number (serde_json's shortest round-trip form).
pub fn write_f64(f: f64, out: &mut Vec<u8>) {
    // serde_json writes non-finite floats as `null`, which is what a JSON line needs.
    let _ = serde_json::to_writer(&mut *out, &f);
}

/// Adds `x` to the non-overlapping partial sums `partials` without rounding error
/// (Shewchuk's algorithm, as in Python's `math.fsum`): the partials always sum exactly to
/// the sum of every value added, so the result of [`exact_total`] does not depend on the
/// order of the additions.
pub fn exact_add(partials: &mut Vec<f64>, mut x: f64) {
    let mut kept = 0;
    for j in 0..partials.len() {
        let mut y = partials[j];
        if x.abs() < y.abs() {
            std::mem::swap(&mut x, &mut y);
        }
        let hi = x + y;
        let lo = y - (hi - x);
        if lo != 0.0 {
            partials[kept] = lo;
            kept += 1;
        }
        x = hi;
    }
    partials.truncate(kept);
    partials.push(x);
}

/// The exact sum of `partials` rounded once to the nearest `f64` (ties to even).
#[must_use]
pub fn exact_total(partials: &[f64]) -> f64 {
    let Some((&last, rest)) = partials.split_last() else {
        return 0.0;
    };
    let mut hi = last;
    let mut lo = 0.0;
    let mut n = rest.len();
    while n > 0 {
        n -= 1;
        let x = hi;
        let y = partials[n];
        hi = x + y;
        lo = y - (hi - x);
        if lo != 0.0 {
            break;
        }
    }
    // Round half-even correctly when the remaining partials push `lo` over a tie.
    if n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0)) {
        let y = lo * 2.0;
        let x = hi + y;
        if y == x - hi {
            hi = x;
        }
    }
    hi
}

/// Splits an `i128` into two `f64` whose exact sum is the integer for |v| < 2^106 (and a
/// deterministic approximation beyond).
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
pub fn i128_parts(v: i128) -> (f64, f64) {
    let hi = v as f64;
    // `hi` is within 2^75 of `v` for |v| < 2^127, so the residual fits i128.
    let residual = v.saturating_sub(hi as i128);
    (hi, residual as f64)
}

/// A field value of a JSON record, as far as numeric aggregation cares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum JsonScalar {
    /// The field is absent.
    Missing,
    /// `null`.
    Null,
    /// A number.
    Num(Num),
    /// A string.
    Str,
    /// `true` / `false`.
    Bool,
    /// An array or object.
    Nested,
}

impl JsonScalar {
    /// Absent or `null`.
    #[must_use]
    pub fn is_null(self) -> bool {
        matches!(self, Self::Missing | Self::Null)
    }

    /// A string, boolean, array or object: present, but not a number.
    #[must_use]
    pub fn is_non_numeric(self) -> bool {
        matches!(self, Self::Str | Self::Bool | Self::Nested)
    }

    /// What the value is, for error messages (`"a string"`, `"null"`, ...).
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Null => "null",
            Self::Num(_) => "a number",
            Self::Str => "a string",
            Self::Bool => "a boolean",
            Self::Nested => "an array or object",
        }
    }
}

/// Reads one JSON value into a [`JsonScalar`], skipping nested values without building
/// them.
#[derive(Debug, Clone, Copy)]
pub struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = JsonScalar;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<JsonScalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ScalarSeed {
    type Value = JsonScalar;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Bool)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Num(Num::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<JsonScalar, E> {
        #[allow(clippy::cast_precision_loss)]
        Ok(JsonScalar::Num(
            i64::try_from(v).map_or(Num::Float(v as f64), Num::Int),
        ))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Num(Num::Float(v)))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Str)
    }
    fn visit_unit<E: de::Error>(self) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<JsonScalar, E> {
        Ok(JsonScalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonScalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(JsonScalar::Nested)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonScalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(JsonScalar::Nested)
    }
}

/// An object key, borrowed from the input when it has no escapes.
#[derive(Debug)]
pub enum FieldName<'de> {
    /// Borrowed from the input.
    Borrowed(&'de str),
    /// Unescaped into a new string.
    Owned(String),
}

impl FieldName<'_> {
    /// The key.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::Borrowed(s) => s,
            Self::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for FieldName<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FieldName<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(FieldName::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FieldName::Owned(v.to_owned()))
            }
        }
        d.deserialize_str(V)
    }
}

/// Pulls the named fields out of one JSON object without building a tree:
/// `vals[i]` becomes the value of `fields[i]` (left as it was if the field is absent).
#[derive(Debug)]
pub struct FieldsSeed<'a> {
    /// Field names.
    pub fields: &'a [String],
    /// One slot per field.
    pub vals: &'a mut [JsonScalar],
}

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<FieldName<'de>>()? {
            match self.fields.iter().position(|f| f.as_str() == name.as_str()) {
                Some(i) => self.vals[i] = map.next_value_seed(ScalarSeed)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// `str::parse::<i64>` on bytes: an optional `+` or `-`, then one or more ASCII digits;
/// `None` for anything else or a value outside `i64`. No UTF-8 check first, and no 128-bit
/// multiply (a libcall on wasm32) for up to 19 digits: for parsers of text columns.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    if digits.len() > 19 {
        // More digits than a u64 holds without overflow checks (leading zeros, or out
        // of range): the rare case, left to the standard parser.
        return std::str::from_utf8(b).ok()?.parse().ok();
    }
    // Up to 19 digits fit a u64 (10^19 - 1 < 2^64), so no step can overflow; a checked
    // i64 multiply would be a 128-bit libcall on wasm32.
    let mut v: u64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + u64::from(d);
    }
    if negative {
        0i64.checked_sub_unsigned(v)
    } else {
        i64::try_from(v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fsum(values: &[f64]) -> f64 {
        let mut p = Vec::new();
        for &v in values {
            exact_add(&mut p, v);
        }
        exact_total(&p)
    }

    #[test]
    fn exact_sum_is_order_independent() {
        let values = [1e100, 1.0, -1e100, 0.1, 0.2, 0.3, 1e-20, -0.6];
        let want = fsum(&values);
        assert_eq!(fsum(&[0.1, 0.2, 0.3, -0.6]), {
            // 0.1 + 0.2 + 0.3 - 0.6 in exact arithmetic of the binary values.
            let mut p = Vec::new();
            for v in [0.3, -0.6, 0.2, 0.1] {
                exact_add(&mut p, v);
            }
            exact_total(&p)
        });
        let mut v = values.to_vec();
        for _ in 0..20 {
            v.rotate_left(3);
            v.swap(1, 5);
            assert_eq!(fsum(&v).to_bits(), want.to_bits());
        }
        assert_eq!(fsum(&[]), 0.0);
        assert_eq!(fsum(&[0.1; 10]), 1.0);
    }

    #[test]
    fn numbers_compare_and_print() {
        assert_eq!(Num::Int(2).compare(Num::Float(2.5)), Ordering::Less);
        assert_eq!(
            Num::Int(i64::MAX).compare(Num::Int(i64::MAX - 1)),
            Ordering::Greater
        );
        let mut out = Vec::new();
        Num::Int(-7).write_json(&mut out);
        out.push(b' ');
        Num::Float(-3.5).write_json(&mut out);
        assert_eq!(out, b"-7 -3.5");
        let (hi, lo) = i128_parts(i128::from(i64::MAX) * 3 + 1);
        let mut p = Vec::new();
        exact_add(&mut p, hi);
        exact_add(&mut p, lo);
        assert_eq!(exact_total(&p), hi + lo);
    }

    #[test]
    fn fields_are_pulled_out_of_json_objects() {
        let fields = [
            "a".to_string(),
            "b".into(),
            "c".into(),
            "d".into(),
            "e".into(),
        ];
        let mut vals = [JsonScalar::Missing; 5];
        let mut de = serde_json::Deserializer::from_str(
            r#"{"b":null,"a":7,"x":{"a":1},"c":"s","d":[1],"e":1.5}"#,
        );
        FieldsSeed {
            fields: &fields,
            vals: &mut vals,
        }
        .deserialize(&mut de)
        .unwrap();
        assert_eq!(
            vals,
            [
                JsonScalar::Num(Num::Int(7)),
                JsonScalar::Null,
                JsonScalar::Str,
                JsonScalar::Nested,
                JsonScalar::Num(Num::Float(1.5)),
            ]
        );
        assert!(vals[1].is_null() && !vals[0].is_null() && vals[2].is_non_numeric());
    }

    #[test]
    fn parse_i64_agrees_with_str_parse() {
        let mut cases: Vec<String> = [
            "0",
            "7",
            "-7",
            "+7",
            "",
            "-",
            "+",
            "12a",
            "a12",
            " 1",
            "1 ",
            "--1",
            "+-1",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "00012",
            "1.5",
            "١",
            "99999999999999999999",
            "0000000000000000000012",
            "-0000000000000000000012",
            "18446744073709551615",
            "18446744073709551616",
            "-9999999999999999999",
            "9999999999999999999",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 22) as usize;
            let alphabet = b"0123456789-+a ";
            let s: String = (0..len)
                .map(|k| alphabet[((x >> (k % 8 * 8)) as usize + k) % alphabet.len()] as char)
                .collect();
            cases.push(s);
            cases.push((x as i64).to_string());
        }
        for c in &cases {
            assert_eq!(parse_i64(c.as_bytes()), c.parse::<i64>().ok(), "{c:?}");
        }
    }
}
