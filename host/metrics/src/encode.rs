//! OpenMetrics text encoding of samples, done only when scraped (prometheus-client's
//! encoder over one collector holding the samples of the moment).

use crate::inventory::{INVENTORY, Kind, PREFIX, Unit};
use crate::sample::{Sample, Value};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Samples could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// A sample names a family the inventory does not list, or carries another number of
    /// labels than its family.
    #[error("sample of `{family}` with labels {labels:?} does not match the metrics inventory")]
    NotInInventory {
        /// The family named.
        family: String,
        /// Its label values.
        labels: Vec<String>,
    },
    /// The text encoder failed (a formatting error).
    #[error("cannot encode metrics: {0}")]
    Format(#[from] std::fmt::Error),
}

/// `v` as an integer when it is one (counts read better as `42` than `42.0`), within the
/// range an `f64` holds exactly.
fn whole(v: f64) -> Option<i64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    (v.fract() == 0.0 && v.abs() <= EXACT).then_some(v as i64)
}

#[derive(Debug)]
struct Snapshot(Vec<Sample>);

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in INVENTORY {
            let unit = match f.unit {
                Unit::None => None,
                Unit::Seconds => Some(prometheus_client::registry::Unit::Seconds),
                Unit::Bytes => Some(prometheus_client::registry::Unit::Bytes),
                Unit::Ratios => Some(prometheus_client::registry::Unit::Ratios),
            };
            let kind = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
                Kind::Info => MetricType::Info,
            };
            let mut metric = encoder.encode_descriptor(f.name, f.help, unit.as_ref(), kind)?;
            for s in self.0.iter().filter(|s| s.family == f.name) {
                let labels: Vec<(&str, &str)> = f
                    .labels
                    .iter()
                    .copied()
                    .zip(s.labels.iter().map(String::as_str))
                    .collect();
                match &s.value {
                    Value::Info => metric.encode_info(&labels)?,
                    Value::Counter(v) => {
                        let mut m = metric.encode_family(&labels)?;
                        match whole(*v) {
                            Some(n) if n >= 0 => {
                                m.encode_counter::<NoLabelSet, _, f64>(&n.unsigned_abs(), None)?
                            }
                            _ => m.encode_counter::<NoLabelSet, _, f64>(v, None)?,
                        }
                    }
                    Value::Gauge(v) => {
                        let mut m = metric.encode_family(&labels)?;
                        match whole(*v) {
                            Some(n) => m.encode_gauge(&n)?,
                            None => m.encode_gauge(v)?,
                        }
                    }
                    Value::Histogram(h) => {
                        // The encoder accumulates; ours are cumulative already.
                        let mut below = 0;
                        let per_bucket: Vec<(f64, u64)> = h
                            .buckets
                            .iter()
                            .map(|&(bound, n)| {
                                let own = n.saturating_sub(below);
                                below = n;
                                (bound, own)
                            })
                            .collect();
                        metric
                            .encode_family(&labels)?
                            .encode_histogram::<NoLabelSet>(h.sum, h.count, &per_bucket, None)?
                    }
                }
            }
        }
        Ok(())
    }
}

/// Checks every sample against the inventory: a known family, its number of labels, a
/// value of its kind.
///
/// # Errors
/// [`EncodeError::NotInInventory`] for the first sample that does not fit.
pub fn check(samples: &[Sample]) -> Result<(), EncodeError> {
    for s in samples {
        let fits = crate::inventory::family(&s.family).is_some_and(|f| {
            f.labels.len() == s.labels.len()
                && matches!(
                    (f.kind, &s.value),
                    (Kind::Counter, Value::Counter(_))
                        | (Kind::Gauge, Value::Gauge(_))
                        | (Kind::Histogram, Value::Histogram(_))
                        | (Kind::Info, Value::Info)
                )
        });
        if !fits {
            return Err(EncodeError::NotInInventory {
                family: s.family.clone(),
                labels: s.labels.clone(),
            });
        }
    }
    Ok(())
}

/// `samples` as an OpenMetrics text exposition (`application/openmetrics-text;
/// version=1.0.0`): every family of the inventory with its metadata, and the samples of
/// it in the order given, ending with `# EOF`.
///
/// # Errors
/// A sample that does not match the inventory ([`check`]).
pub fn encode(samples: Vec<Sample>) -> Result<String, EncodeError> {
    check(&samples)?;
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(Snapshot(samples)));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Histogram;
    use crate::inventory::{BUILD, BUSY_TIME, CHECKPOINT_DURATION, JOB_STATE, RECORDS_IN};

    fn l(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn names_carry_prefix_unit_and_type_suffix() {
        let h = Histogram::new(&[1.0]);
        h.observe(0.5);
        let text = encode(vec![
            Sample::new(&BUILD, l(&["0.1.0", "0.2.2"]), Value::Info),
            Sample::counter(&RECORDS_IN, l(&["j", "v", "0"]), 42.0),
            Sample::counter(&BUSY_TIME, l(&["j", "v", "0"]), 1.5),
            Sample::gauge(&JOB_STATE, l(&["j", "running"]), 1.0),
            Sample::new(&CHECKPOINT_DURATION, l(&["j"]), Value::Histogram(h.value())),
        ])
        .unwrap();
        for line in [
            "nopstream_build_info{version=\"0.1.0\",wit=\"0.2.2\"} 1",
            "nopstream_records_in_total{job=\"j\",vertex=\"v\",subtask=\"0\"} 42",
            "# TYPE nopstream_busy_time_seconds counter",
            "nopstream_busy_time_seconds_total{job=\"j\",vertex=\"v\",subtask=\"0\"} 1.5",
            "nopstream_job_state{job=\"j\",state=\"running\"} 1",
            "nopstream_checkpoint_duration_seconds_bucket{le=\"1.0\",job=\"j\"} 1",
            "nopstream_checkpoint_duration_seconds_bucket{le=\"+Inf\",job=\"j\"} 1",
            "nopstream_checkpoint_duration_seconds_count{job=\"j\"} 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|x| x == line), "no `{line}` in\n{text}");
        }
    }

    #[test]
    fn a_sample_outside_the_inventory_is_refused() {
        let bad = Sample {
            family: "records_in".into(),
            labels: l(&["j"]),
            value: Value::Counter(1.0),
        };
        assert!(matches!(
            encode(vec![bad]),
            Err(EncodeError::NotInInventory { .. })
        ));
        let unknown = Sample {
            family: "made_up".into(),
            labels: vec![],
            value: Value::Gauge(1.0),
        };
        assert!(encode(vec![unknown]).is_err());
    }
}
