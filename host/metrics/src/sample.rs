//! Samples: the values of the inventory's families at one moment, as plain data. Node
//! processes ship them to the coordinator in one generic frame ([`MetricsFrame`]), so a new
//! metric is one line where it is counted, and nothing else changes on the wire.

use crate::inventory::{Family, Kind, family};
use serde::{Deserialize, Serialize};

/// Most samples one [`MetricsFrame`] carries; a node with more sends the first this many
/// (in family, then label order) and logs that it cut the rest.
pub const MAX_FRAME_SAMPLES: usize = 16_384;

/// A histogram's value: observations per cumulative bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistogramValue {
    /// Sum of the observations (in the family's unit).
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
    /// `(upper bound, observations <= it)`, ascending; the last bound is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

/// One sample's value; its kind matches its family's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Value {
    /// A counter's total.
    Counter(f64),
    /// A gauge's value.
    Gauge(f64),
    /// A histogram.
    Histogram(HistogramValue),
    /// An info family's sample (its value is always 1).
    Info,
}

/// One sample of an inventory family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The family's [`Family::name`].
    pub family: String,
    /// Label values, in the order of the family's [`Family::labels`].
    pub labels: Vec<String>,
    /// The value.
    pub value: Value,
}

impl Sample {
    /// A sample of `family` with `labels` (one value per label name, in order).
    ///
    /// Panics in debug builds when the label count or the value's kind does not match the
    /// family: a programming error the inventory test catches.
    pub fn new(family: &Family, labels: Vec<String>, value: Value) -> Self {
        debug_assert_eq!(
            labels.len(),
            family.labels.len(),
            "labels of {}: {:?}",
            family.name,
            family.labels
        );
        debug_assert!(
            matches!(
                (family.kind, &value),
                (Kind::Counter, Value::Counter(_))
                    | (Kind::Gauge, Value::Gauge(_))
                    | (Kind::Histogram, Value::Histogram(_))
                    | (Kind::Info, Value::Info)
            ),
            "value of {} is not a {}",
            family.name,
            family.kind.as_str()
        );
        Sample {
            family: family.name.to_owned(),
            labels,
            value,
        }
    }

    /// A counter sample.
    pub fn counter(family: &Family, labels: Vec<String>, total: f64) -> Self {
        Self::new(family, labels, Value::Counter(total))
    }

    /// A gauge sample.
    pub fn gauge(family: &Family, labels: Vec<String>, value: f64) -> Self {
        Self::new(family, labels, Value::Gauge(value))
    }

    /// The value as a number: a counter's total, a gauge's value, a histogram's count,
    /// 1 for info.
    pub fn number(&self) -> f64 {
        match &self.value {
            Value::Counter(v) | Value::Gauge(v) => *v,
            Value::Histogram(h) => h.count as f64,
            Value::Info => 1.0,
        }
    }

    /// The value of label `name`, if the family has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        let f = family(&self.family)?;
        let i = f.labels.iter().position(|l| *l == name)?;
        self.labels.get(i).map(String::as_str)
    }
}

/// A node's samples of one job, cumulative since the node process started: what a node
/// sends the coordinator on its session stream (design §2.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsFrame {
    /// The job.
    pub job: String,
    /// Its samples (at most [`MAX_FRAME_SAMPLES`]).
    pub samples: Vec<Sample>,
}

/// Adds `from` into `into`: counters and histograms with the same family and labels are
/// summed, a gauge or info sample replaces the one there (the latest reporter wins).
pub fn merge(into: &mut Vec<Sample>, from: &[Sample]) {
    for s in from {
        match into
            .iter_mut()
            .find(|t| t.family == s.family && t.labels == s.labels)
        {
            None => into.push(s.clone()),
            Some(t) => match (&mut t.value, &s.value) {
                (Value::Counter(a), Value::Counter(b)) => *a += b,
                (Value::Histogram(a), Value::Histogram(b))
                    if a.buckets.len() == b.buckets.len() =>
                {
                    a.sum += b.sum;
                    a.count += b.count;
                    for (x, y) in a.buckets.iter_mut().zip(&b.buckets) {
                        x.1 += y.1;
                    }
                }
                _ => t.value = s.value.clone(),
            },
        }
    }
}

/// The sum of the samples of `family` whose labels match every `(name, value)` of `filter`.
pub fn sum(samples: &[Sample], family: &Family, filter: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.family == family.name)
        .filter(|s| filter.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(Sample::number)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{JOB_STATE, RECORDS_IN};

    fn labels(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn merge_sums_counters_and_replaces_gauges() {
        let mut all = vec![Sample::counter(&RECORDS_IN, labels(&["j", "v", "0"]), 5.0)];
        merge(
            &mut all,
            &[
                Sample::counter(&RECORDS_IN, labels(&["j", "v", "0"]), 7.0),
                Sample::counter(&RECORDS_IN, labels(&["j", "v", "1"]), 1.0),
                Sample::gauge(&JOB_STATE, labels(&["j", "running"]), 1.0),
            ],
        );
        merge(
            &mut all,
            &[Sample::gauge(&JOB_STATE, labels(&["j", "running"]), 0.0)],
        );
        assert_eq!(sum(&all, &RECORDS_IN, &[("job", "j")]), 13.0);
        assert_eq!(sum(&all, &RECORDS_IN, &[("subtask", "0")]), 12.0);
        assert_eq!(sum(&all, &JOB_STATE, &[]), 0.0);
        assert_eq!(all.len(), 3);
    }
}
