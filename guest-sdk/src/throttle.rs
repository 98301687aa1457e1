//! A records-per-second limit for sources that grants records in batches.
//!
//! A source with a rate limit (`datagen-source`'s `records_per_second`, `file-source`'s
//! `max_records_per_second`) asks [`RateLimit::grant`] how many records it may return
//! from this read. Granting whatever is due at each call would hand the host a batch of a
//! few records per read, as fast as the host polls: every task of the job then pays its
//! per-batch costs (a boundary call per stage, a channel hand-over, a wake-up) per handful
//! of records, and a job throttled to half its saturated rate burned more CPU than the
//! same job unthrottled (`nopstream-bench latency`, 2026-12-05: 1.8 cores at 50 % load at
//! p=2). So records are granted once a batch is due: `max_records`, or what the rate
//! gives in [`MAX_BATCH_WAIT`] if that is fewer (slow rates). Until then a read returns
//! no records and the host sleeps about 1 ms before the next one. A due record waits at
//! most about `MAX_BATCH_WAIT` plus that millisecond for its batch; the rate over time is
//! unchanged.
//!
//! The clock starts at the first grant, which is at least one record, so a job's first
//! record is not held back. A reader behind the rate gets full batches back to back until
//! it has caught up.

use std::time::{Duration, Instant};

/// The longest a due record is held back while its batch fills: 5 ms. At rates of
/// `max_records / 5 ms` and more (204,800 records per second for 1,024-record batches)
/// every grant is a full batch.
pub const MAX_BATCH_WAIT: Duration = Duration::from_millis(5);

/// A records-per-second limit for one source instance; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct RateLimit {
    rate: u64,
    since: Option<Instant>,
    /// Records returned so far ([`RateLimit::took`]).
    taken: u64,
}

impl RateLimit {
    /// A limit of `records_per_second` (at least 1; 0 is taken as 1).
    #[must_use]
    pub fn new(records_per_second: u64) -> Self {
        Self {
            rate: records_per_second.max(1),
            since: None,
            taken: 0,
        }
    }

    /// How many records the caller may return now, at most `max_records`: 0 until a
    /// batch is due. The caller reports what it then returned with [`RateLimit::took`].
    #[must_use]
    pub fn grant(&mut self, max_records: u32) -> u32 {
        self.grant_at(Instant::now(), max_records)
    }

    /// Counts `records` returned against the limit (fewer than granted at the end of a
    /// split, say).
    pub fn took(&mut self, records: u64) {
        self.taken += records;
    }

    fn grant_at(&mut self, now: Instant, max_records: u32) -> u32 {
        let since = *self.since.get_or_insert(now);
        let allowed =
            (now.saturating_duration_since(since).as_secs_f64() * self.rate as f64) as u64;
        let due = allowed
            .saturating_sub(self.taken)
            .max(u64::from(self.taken == 0));
        let batch = ((self.rate as f64 * MAX_BATCH_WAIT.as_secs_f64()) as u64)
            .clamp(1, u64::from(max_records.max(1)));
        if due < batch && self.taken > 0 {
            return 0;
        }
        u32::try_from(due.min(u64::from(max_records))).unwrap_or(max_records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_whole_batches_at_high_rates_and_keeps_the_rate() {
        // 1M records per second: 1,024 records are due every 1.024 ms.
        let mut t = RateLimit::new(1_000_000);
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        assert_eq!(
            t.grant_at(at(0), 1024),
            1,
            "the first read is not held back"
        );
        t.took(1);
        let mut total = 1u64;
        let mut sizes = Vec::new();
        // The host polls every 100 µs for 100 ms.
        for step in 1..=1000 {
            let n = t.grant_at(at(step * 100), 1024);
            if n > 0 {
                sizes.push(n);
                t.took(u64::from(n));
                total += u64::from(n);
            }
        }
        assert!(sizes.iter().all(|&n| n == 1024), "{sizes:?}");
        // 100 ms at 1M/s is 100,000 records: all but the last partial batch granted.
        assert!((100_000 - 1024..=100_000).contains(&total), "{total}");
    }

    #[test]
    fn slow_rates_grant_what_five_ms_give_and_the_slowest_one_record() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 20,000 per second: 100 records per 5 ms.
        let mut t = RateLimit::new(20_000);
        assert_eq!(t.grant_at(at(0), 1024), 1);
        t.took(1);
        assert_eq!(t.grant_at(at(4), 1024), 0, "79 due, batch of 100 not yet");
        assert_eq!(t.grant_at(at(6), 1024), 119);
        t.took(119);
        assert_eq!(t.grant_at(at(7), 1024), 0);
        // 2 per second: each record as it becomes due.
        let mut t = RateLimit::new(2);
        assert_eq!(t.grant_at(at(0), 1024), 1);
        t.took(1);
        assert_eq!(t.grant_at(at(400), 1024), 0);
        assert_eq!(t.grant_at(at(1000), 1024), 1);
    }

    #[test]
    fn a_reader_behind_the_rate_gets_full_batches_and_short_reads_are_counted() {
        let t0 = Instant::now();
        let mut t = RateLimit::new(1_000_000);
        assert_eq!(t.grant_at(t0, 512), 1);
        t.took(1);
        let later = t0 + Duration::from_millis(10);
        assert_eq!(t.grant_at(later, 512), 512);
        // Only 100 returned (the split ended): the rest stays due.
        t.took(100);
        assert_eq!(t.grant_at(later, 512), 512);
        assert_eq!(RateLimit::new(0).rate, 1);
    }
}
