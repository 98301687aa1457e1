//! Numbers as they appear in JSON records, and an exactly rounded float sum.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

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
