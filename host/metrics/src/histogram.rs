//! Fixed-bucket histograms, observed a few times per epoch (never per record).

use crate::sample::HistogramValue;
use std::sync::Mutex;

/// Upper bounds (seconds) of the checkpoint histograms' buckets, `+Inf` implied: from
/// 5 ms (an epoch of an idle job on a fast disk) to 10 minutes (the longest checkpoint
/// timeout anyone sets).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0,
];

/// A histogram over fixed upper bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramValue>,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending; `+Inf` is added).
    pub fn new(bounds: &'static [f64]) -> Self {
        let buckets = bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .map(|b| (b, 0))
            .collect();
        Histogram {
            bounds,
            inner: Mutex::new(HistogramValue {
                sum: 0.0,
                count: 0,
                buckets,
            }),
        }
    }

    /// An empty histogram over [`SECONDS_BUCKETS`].
    pub fn seconds() -> Self {
        Self::new(SECONDS_BUCKETS)
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        h.sum += v;
        h.count += 1;
        for (bound, n) in h.buckets.iter_mut() {
            if v <= *bound {
                *n += 1;
            }
        }
    }

    /// The current value.
    pub fn value(&self) -> HistogramValue {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The bounds, without `+Inf`.
    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 3.0, 50.0] {
            h.observe(v);
        }
        let v = h.value();
        assert_eq!(v.count, 4);
        assert_eq!(v.sum, 54.5);
        assert_eq!(v.buckets, vec![(1.0, 2), (10.0, 3), (f64::INFINITY, 4)]);
    }
}
