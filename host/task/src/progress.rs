//! Live counters of a running job, for progress displays.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Live counters of a running job, for progress displays.
#[derive(Debug)]
pub struct JobProgress {
    records_read: AtomicU64,
    records_written: AtomicU64,
    /// Input position per split, keyed by (source operator, split id): two sources may
    /// name their splits alike.
    splits: Mutex<BTreeMap<SourceSplit, (u64, Option<u64>)>>,
    started: Instant,
    metrics: nop_stream_metrics::JobMetrics,
}

/// A split as (source operator, split id).
type SourceSplit = (String, String);

impl Default for JobProgress {
    fn default() -> Self {
        JobProgress {
            records_read: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            splits: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            metrics: nop_stream_metrics::JobMetrics::default(),
        }
    }
}

impl JobProgress {
    /// Counts `n` records read from split `split` of source operator `source`, now at
    /// `consumed` of `total` units.
    pub(crate) fn record_read(
        &self,
        source: &str,
        split: &str,
        n: u64,
        consumed: u64,
        total: Option<u64>,
    ) {
        self.records_read.fetch_add(n, Ordering::Relaxed);
        self.metrics.split_read(
            source,
            split,
            n,
            nop_stream_metrics::SplitProgress {
                consumed,
                total,
                max_timestamp: None,
            },
        );
        self.splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((source.to_owned(), split.to_owned()), (consumed, total));
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.records_written.fetch_add(n, Ordering::Relaxed);
        self.metrics.written(n);
    }

    /// The metrics of the job's subtasks in this process (design §15).
    pub fn metrics(&self) -> &nop_stream_metrics::JobMetrics {
        &self.metrics
    }

    /// Records read by all sources so far (in every attempt).
    pub fn records_read(&self) -> u64 {
        self.records_read.load(Ordering::Relaxed)
    }

    /// Records written by all sinks so far (staged, not necessarily committed).
    pub fn records_written(&self) -> u64 {
        self.records_written.load(Ordering::Relaxed)
    }

    /// Input position over all splits started so far: (units consumed, total units),
    /// bytes for file sources.
    pub fn position(&self) -> (u64, u64) {
        let splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
        splits
            .values()
            .fold((0, 0), |(c, t), (sc, st)| (c + sc, t + st.unwrap_or(*sc)))
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}
