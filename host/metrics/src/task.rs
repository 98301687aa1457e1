//! Counters of the subtasks of one job in one process: updated by the task threads once per
//! batch (relaxed atomics, never a lock per record), read only when someone asks for
//! samples.

use crate::inventory::{self as inv, Family};
use crate::sample::Sample;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// No watermark yet.
const NO_WATERMARK: i64 = i64::MIN;

/// When a subtask's thread runs, for its busy time.
#[derive(Debug, Default)]
struct Life {
    /// Since when the current attempt's thread runs.
    running_since: Option<Instant>,
    /// Time of the attempts that ended.
    before: Duration,
    /// Attempts of this subtask in this process.
    attempts: u64,
}

/// One subtask's counters in this process, over every attempt of it here.
#[derive(Debug)]
pub struct TaskMetrics {
    records_in: AtomicU64,
    records_out: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    idle_ns: AtomicU64,
    backpressured_ns: AtomicU64,
    input_watermark: AtomicI64,
    output_watermark: AtomicI64,
    late_records: AtomicU64,
    timers_fired: AtomicU64,
    skipped: AtomicU64,
    dead_lettered: AtomicU64,
    traps: AtomicU64,
    /// Pre-committed transactions waiting for commit; `-1`: no sink at the tail.
    sink_pending: AtomicI64,
    committed: AtomicU64,
    recovered: AtomicU64,
    /// Whether the task loop reports its idle and backpressured time: without it, busy
    /// time would be the whole life, so the three are not sampled.
    idle_measured: std::sync::atomic::AtomicBool,
    life: Mutex<Life>,
}

impl Default for TaskMetrics {
    fn default() -> Self {
        TaskMetrics {
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            input_watermark: AtomicI64::new(NO_WATERMARK),
            output_watermark: AtomicI64::new(NO_WATERMARK),
            late_records: AtomicU64::new(0),
            timers_fired: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            traps: AtomicU64::new(0),
            sink_pending: AtomicI64::new(-1),
            committed: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            idle_measured: std::sync::atomic::AtomicBool::new(false),
            life: Mutex::new(Life::default()),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TaskMetrics {
    /// An attempt of the subtask starts running on this thread.
    pub fn started(&self) {
        let mut l = lock(&self.life);
        if let Some(t) = l.running_since.take() {
            l.before += t.elapsed();
        }
        l.running_since = Some(Instant::now());
        l.attempts += 1;
        // Gauges describe the running attempt only.
        self.input_watermark.store(NO_WATERMARK, Relaxed);
        self.output_watermark.store(NO_WATERMARK, Relaxed);
        self.sink_pending.store(-1, Relaxed);
    }

    /// The running attempt ended (finished, failed or cancelled).
    pub fn ended(&self) {
        let mut l = lock(&self.life);
        if let Some(t) = l.running_since.take() {
            l.before += t.elapsed();
        }
        self.sink_pending.store(-1, Relaxed);
    }

    /// Whether an attempt runs now.
    pub fn running(&self) -> bool {
        lock(&self.life).running_since.is_some()
    }

    /// `n` records of `bytes` payload bytes entered the chain.
    pub fn records_in(&self, n: u64, bytes: u64) {
        self.records_in.fetch_add(n, Relaxed);
        self.bytes_in.fetch_add(bytes, Relaxed);
    }

    /// `n` records of `bytes` payload bytes left the chain (emitted, or written by a sink).
    pub fn records_out(&self, n: u64, bytes: u64) {
        self.records_out.fetch_add(n, Relaxed);
        self.bytes_out.fetch_add(bytes, Relaxed);
    }

    /// The thread waited `d` for input.
    pub fn idle(&self, d: Duration) {
        self.idle_measured.store(true, Relaxed);
        self.idle_ns.fetch_add(nanos(d), Relaxed);
    }

    /// The thread spent `d` handing messages to its output channels.
    pub fn backpressured(&self, d: Duration) {
        self.backpressured_ns.fetch_add(nanos(d), Relaxed);
    }

    /// The input watermark (ms of event time) is now `ms`.
    pub fn input_watermark(&self, ms: i64) {
        self.input_watermark.store(ms, Relaxed);
    }

    /// The subtask emitted watermark `ms`.
    pub fn output_watermark(&self, ms: i64) {
        self.output_watermark.store(ms, Relaxed);
    }

    /// `n` records went to a `late` side output.
    pub fn late(&self, n: u64) {
        self.late_records.fetch_add(n, Relaxed);
    }

    /// `n` timers fired.
    pub fn timers_fired(&self, n: u64) {
        self.timers_fired.fetch_add(n, Relaxed);
    }

    /// An error policy skipped `n` records.
    pub fn skipped(&self, n: u64) {
        self.skipped.fetch_add(n, Relaxed);
    }

    /// An error policy dead-lettered `n` records.
    pub fn dead_lettered(&self, n: u64) {
        self.dead_lettered.fetch_add(n, Relaxed);
    }

    /// A plugin of the subtask trapped or exceeded a limit.
    pub fn trapped(&self) {
        self.traps.fetch_add(1, Relaxed);
    }

    /// The sink at the tail holds `n` pre-committed transactions.
    pub fn sink_pending(&self, n: usize) {
        self.sink_pending
            .store(i64::try_from(n).unwrap_or(i64::MAX), Relaxed);
    }

    /// The sink committed a transaction; `recovered`: its outcome was established through
    /// `recover`.
    pub fn committed(&self, recovered: bool) {
        if recovered {
            self.recovered.fetch_add(1, Relaxed);
        } else {
            self.committed.fetch_add(1, Relaxed);
        }
    }

    /// Records that entered the chain so far.
    pub fn records_in_total(&self) -> u64 {
        self.records_in.load(Relaxed)
    }

    /// Records that left the chain so far.
    pub fn records_out_total(&self) -> u64 {
        self.records_out.load(Relaxed)
    }

    /// (busy, backpressured, idle) time so far over every attempt here.
    pub fn times(&self) -> (Duration, Duration, Duration) {
        let life = {
            let l = lock(&self.life);
            l.before + l.running_since.map_or(Duration::ZERO, |t| t.elapsed())
        };
        let idle = Duration::from_nanos(self.idle_ns.load(Relaxed));
        let bp = Duration::from_nanos(self.backpressured_ns.load(Relaxed));
        (life.saturating_sub(idle + bp), bp, idle)
    }
}

/// Where a split of a source is, as its connector last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SplitProgress {
    /// Units consumed (bytes for file sources).
    pub consumed: u64,
    /// Units in the split, when known.
    pub total: Option<u64>,
    /// Largest event timestamp read (ms), if any.
    pub max_timestamp: Option<i64>,
}

/// The counters of one job's subtasks in this process, and its sources' split positions.
#[derive(Debug, Default)]
pub struct JobMetrics {
    tasks: Mutex<BTreeMap<(String, u32), Arc<TaskMetrics>>>,
    /// By (source operator, split id): two sources may name their splits alike.
    splits: Mutex<BTreeMap<(String, String), SplitProgress>>,
    records_read: AtomicU64,
    records_written: AtomicU64,
}

/// Seconds, as an event or wall time in ms becomes one.
fn seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

impl JobMetrics {
    /// The counters of subtask `subtask` of vertex `vertex` (made on first use, kept for
    /// every later attempt in this process).
    pub fn task(&self, vertex: &str, subtask: u32) -> Arc<TaskMetrics> {
        Arc::clone(
            lock(&self.tasks)
                .entry((vertex.to_owned(), subtask))
                .or_default(),
        )
    }

    /// A source read `n` records from split `split` of source `source`, now at `p`.
    pub fn split_read(&self, source: &str, split: &str, n: u64, p: SplitProgress) {
        self.records_read.fetch_add(n, Relaxed);
        let mut splits = lock(&self.splits);
        match splits.get_mut(&(source.to_owned(), split.to_owned())) {
            Some(s) => {
                s.consumed = p.consumed;
                s.total = p.total;
                s.max_timestamp = s.max_timestamp.max(p.max_timestamp);
            }
            None => {
                splits.insert((source.to_owned(), split.to_owned()), p);
            }
        }
    }

    /// Sinks wrote `n` records.
    pub fn written(&self, n: u64) {
        self.records_written.fetch_add(n, Relaxed);
    }

    /// Records read by the job's sources here, over every attempt.
    pub fn records_read(&self) -> u64 {
        self.records_read.load(Relaxed)
    }

    /// Records written by the job's sinks here (staged, not necessarily committed).
    pub fn records_written(&self) -> u64 {
        self.records_written.load(Relaxed)
    }

    /// Every split's position, by (source, split).
    pub fn splits(&self) -> BTreeMap<(String, String), SplitProgress> {
        lock(&self.splits).clone()
    }

    /// The samples of job `job` here, at wall time `now_ms` (ms since the Unix epoch, for
    /// the event-time lag). Gauges of a subtask (watermarks, pending transactions) are
    /// sampled only while an attempt of it runs here, so of the processes that ran a
    /// subtask only the one running it now reports them.
    pub fn samples(&self, job: &str, now_ms: i64) -> Vec<Sample> {
        let mut out = vec![
            Sample::counter(
                &inv::SOURCE_RECORDS,
                vec![job.to_owned()],
                self.records_read() as f64,
            ),
            Sample::counter(
                &inv::SINK_RECORDS,
                vec![job.to_owned()],
                self.records_written() as f64,
            ),
        ];
        let tasks: Vec<((String, u32), Arc<TaskMetrics>)> = lock(&self.tasks)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let mut commits: BTreeMap<(String, &str), u64> = BTreeMap::new();
        for ((vertex, subtask), t) in &tasks {
            let labels = || vec![job.to_owned(), vertex.clone(), subtask.to_string()];
            let c = |f: &Family, v: u64| Sample::counter(f, labels(), v as f64);
            out.extend([
                c(&inv::RECORDS_IN, t.records_in.load(Relaxed)),
                c(&inv::RECORDS_OUT, t.records_out.load(Relaxed)),
                c(&inv::INPUT, t.bytes_in.load(Relaxed)),
                c(&inv::OUTPUT, t.bytes_out.load(Relaxed)),
                c(&inv::SKIPPED_RECORDS, t.skipped.load(Relaxed)),
                c(&inv::DEAD_LETTERED_RECORDS, t.dead_lettered.load(Relaxed)),
            ]);
            let (committed, recovered) = (t.committed.load(Relaxed), t.recovered.load(Relaxed));
            if committed + recovered > 0 {
                *commits.entry((vertex.clone(), "committed")).or_default() += committed;
                *commits.entry((vertex.clone(), "recovered")).or_default() += recovered;
            }
            // Late records, timers and traps are sampled once something counts them: a
            // counter nothing increments would read as a true zero.
            for (f, n) in [
                (&inv::LATE_RECORDS, t.late_records.load(Relaxed)),
                (&inv::TIMERS_FIRED, t.timers_fired.load(Relaxed)),
                (&inv::PLUGIN_TRAPS, t.traps.load(Relaxed)),
            ] {
                if n > 0 {
                    out.push(c(f, n));
                }
            }
            if t.idle_measured.load(Relaxed) {
                let (busy, bp, idle) = t.times();
                out.extend([
                    Sample::counter(&inv::BUSY_TIME, labels(), busy.as_secs_f64()),
                    Sample::counter(&inv::BACKPRESSURED_TIME, labels(), bp.as_secs_f64()),
                    Sample::counter(&inv::IDLE_TIME, labels(), idle.as_secs_f64()),
                ]);
            }
            if !t.running() {
                continue;
            }
            for (f, w) in [
                (&inv::INPUT_WATERMARK, t.input_watermark.load(Relaxed)),
                (&inv::OUTPUT_WATERMARK, t.output_watermark.load(Relaxed)),
            ] {
                if w != NO_WATERMARK && w != i64::MAX {
                    out.push(Sample::gauge(f, labels(), seconds(w)));
                }
            }
            let pending = t.sink_pending.load(Relaxed);
            if pending >= 0 {
                out.push(Sample::gauge(
                    &inv::SINK_PENDING_TRANSACTIONS,
                    labels(),
                    pending as f64,
                ));
            }
        }
        for ((vertex, outcome), n) in commits {
            out.push(Sample::counter(
                &inv::SINK_COMMITS,
                vec![job.to_owned(), vertex, outcome.to_owned()],
                n as f64,
            ));
        }
        for ((source, split), p) in self.splits() {
            let labels = || vec![job.to_owned(), source.clone(), split.clone()];
            if let Some(total) = p.total {
                out.push(Sample::gauge(
                    &inv::SOURCE_PENDING_UNITS,
                    labels(),
                    total.saturating_sub(p.consumed) as f64,
                ));
            }
            if let Some(ts) = p.max_timestamp {
                out.push(Sample::gauge(
                    &inv::SOURCE_EVENT_TIME_LAG,
                    labels(),
                    seconds(now_ms.saturating_sub(ts)).max(0.0),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sum;

    #[test]
    fn samples_count_every_attempt_and_gauges_only_while_running() {
        let m = JobMetrics::default();
        let t = m.task("count", 1);
        t.started();
        t.records_in(10, 100);
        t.input_watermark(5_000);
        t.sink_pending(2);
        t.ended();
        let t2 = m.task("count", 1);
        assert!(Arc::ptr_eq(&t, &t2), "one subtask, one set of counters");
        t2.started();
        t2.records_in(5, 50);
        let s = m.samples("j", 0);
        assert_eq!(sum(&s, &inv::RECORDS_IN, &[("vertex", "count")]), 15.0);
        assert_eq!(sum(&s, &inv::INPUT, &[]), 150.0);
        // Restarted: no watermark and no sink seen by the running attempt yet.
        assert!(s.iter().all(|x| x.family != inv::INPUT_WATERMARK.name));
        assert!(
            s.iter()
                .all(|x| x.family != inv::SINK_PENDING_TRANSACTIONS.name)
        );
        t2.input_watermark(7_000);
        let s = m.samples("j", 0);
        assert_eq!(sum(&s, &inv::INPUT_WATERMARK, &[]), 7.0);
    }

    #[test]
    fn busy_is_life_minus_idle_and_backpressure() {
        let t = TaskMetrics::default();
        t.started();
        std::thread::sleep(Duration::from_millis(20));
        t.idle(Duration::from_millis(5));
        t.backpressured(Duration::from_millis(5));
        t.ended();
        let (busy, bp, idle) = t.times();
        assert_eq!(bp, Duration::from_millis(5));
        assert_eq!(idle, Duration::from_millis(5));
        assert!(busy >= Duration::from_millis(10), "{busy:?}");
        let (busy2, _, _) = t.times();
        assert_eq!(busy, busy2, "an ended attempt's time stands still");
    }

    #[test]
    fn split_lag_needs_a_total_and_timestamps() {
        let m = JobMetrics::default();
        let p = |consumed, total, ts| SplitProgress {
            consumed,
            total,
            max_timestamp: ts,
        };
        m.split_read("src", "0", 3, p(10, Some(100), Some(1_000)));
        m.split_read("src", "1", 2, p(10, None, None));
        m.split_read("other", "0", 1, p(40, Some(100), None));
        let s = m.samples("j", 3_000);
        assert_eq!(
            sum(&s, &inv::SOURCE_PENDING_UNITS, &[("source", "src")]),
            90.0
        );
        assert_eq!(
            sum(&s, &inv::SOURCE_PENDING_UNITS, &[("source", "other")]),
            60.0
        );
        assert_eq!(sum(&s, &inv::SOURCE_EVENT_TIME_LAG, &[]), 2.0);
        assert_eq!(m.records_read(), 6);
    }
}
