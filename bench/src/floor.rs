//! The native floor: each workload's logic as plain Rust in one thread — the same line
//! reader (`file-source`'s [`LineReader`]), the same parsing, mapping and hashing code as
//! the plugins (their crates, built natively), a `HashMap` for keyed state; no wasm, no
//! channels, no batches, no state backend. It is the bound nop-stream is measured against.
//!
//! Output records are encoded exactly as the plugins encode them and summarised with
//! `blackhole-sink`'s [`Summary`], so a nop-stream run can be checked against the floor
//! record for record (count and order-independent checksum).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use bids_parser::{Line, encode_bid, parse_line};
use blackhole_sink::Summary;
use file_source::reader::LineReader;
use file_source::split::SplitDescriptor;
use keyed_count::FxBuildHasher;
use serde::{Deserialize, Serialize};

/// What a floor run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorReport {
    /// Input records processed (data lines; the header is not counted).
    pub records: u64,
    /// Summary of the output records, as the blackhole sink computes it.
    pub output: OutputSummary,
    /// Seconds spent processing (after the process started, before it printed).
    pub seconds: f64,
}

/// Serializable mirror of [`Summary`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSummary {
    /// Output records.
    pub records: u64,
    /// Output payload bytes.
    pub bytes: u64,
    /// Wrapping sum of record hashes.
    pub checksum: u64,
}

impl From<Summary> for OutputSummary {
    fn from(s: Summary) -> Self {
        OutputSummary {
            records: s.records,
            bytes: s.bytes,
            checksum: s.checksum,
        }
    }
}

/// Records per reader call, matching the jobs' `batch_records`.
const READ_CHUNK: u32 = 1024;

/// Calls `f` on every data line of the CSV file at `path` (header skipped), through the
/// file source's own reader. Returns the number of lines.
fn for_each_line(path: &Path, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let len = file.metadata()?.len();
    let d = SplitDescriptor {
        path: path.display().to_string(),
        start: 0,
        end: len,
        file_len: len,
        header: true,
    };
    let mut reader = LineReader::new(file);
    let mut cursor = None;
    let mut lines = 0u64;
    let mut failed: Option<anyhow::Error> = None;
    loop {
        let step = reader.read(&d, cursor, READ_CHUNK, |line| {
            if failed.is_none() {
                if let Err(e) = f(line) {
                    failed = Some(e);
                }
                lines += 1;
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        cursor = Some(step.next);
        if step.finished {
            return Ok(lines);
        }
    }
}

fn bid_of(line: &[u8]) -> Result<bids_parser::Bid<'_>> {
    match parse_line(line) {
        Ok(Line::Bid(b)) => Ok(b),
        Ok(Line::Header) => bail!("unexpected header line"),
        Err(e) => bail!("bad bid line: {e}"),
    }
}

/// q0: parse and encode every bid.
fn q0(path: &Path, out: &mut Summary) -> Result<u64> {
    let mut buf = Vec::with_capacity(64);
    for_each_line(path, |line| {
        let bid = bid_of(line)?;
        buf.clear();
        encode_bid(&bid, &mut buf);
        out.add(&buf);
        Ok(())
    })
}

/// q1: parse, encode, map the price.
fn q1(path: &Path, out: &mut Summary) -> Result<u64> {
    let mut buf = Vec::with_capacity(64);
    let mut mapped = Vec::with_capacity(32);
    for_each_line(path, |line| {
        let bid = bid_of(line)?;
        buf.clear();
        encode_bid(&bid, &mut buf);
        mapped.clear();
        bid_map::map_bid(&buf, &mut mapped);
        out.add(&mapped);
        Ok(())
    })
}

/// Keyed running count per auction, one (auction, count) update per bid.
fn count(path: &Path, out: &mut Summary) -> Result<u64> {
    let mut counts: HashMap<i64, u64, FxBuildHasher> = HashMap::default();
    let mut buf = [0u8; 16];
    for_each_line(path, |line| {
        let bid = bid_of(line)?;
        let c = counts.entry(bid.auction).or_default();
        *c += 1;
        buf[..8].copy_from_slice(&bid.auction.to_le_bytes());
        buf[8..].copy_from_slice(&c.to_le_bytes());
        out.add(&buf);
        Ok(())
    })
}

/// Each auction's final bid count over `path` (a headered bids file): what the running
/// count's last update per key must be, and what a changelog of it replays to.
///
/// # Errors
/// An unreadable file or a malformed line.
pub fn final_counts(path: &Path) -> Result<HashMap<i64, u64>> {
    let mut counts = HashMap::new();
    for_each_line(path, |line| {
        *counts.entry(bid_of(line)?.auction).or_default() += 1;
        Ok(())
    })?;
    Ok(counts)
}

/// q5 window size and slide (ms), as in the job's `window-count` config.
const Q5_SIZE_MS: i64 = 10_000;
const Q5_SLIDE_MS: i64 = 2_000;

/// Emits the top auction of one window (largest count, ties: smallest auction id), in
/// `hot-items`' text format.
fn q5_emit(
    start: i64,
    counts: &HashMap<i64, u64, FxBuildHasher>,
    out: &mut Summary,
    buf: &mut Vec<u8>,
) {
    let mut best: Option<hot_items::Candidate> = None;
    for (&auction, &count) in counts {
        hot_items::offer(
            &mut best,
            hot_items::Candidate {
                count,
                auction,
                start,
                end: start + Q5_SIZE_MS,
            },
        );
    }
    if let Some(c) = best {
        buf.clear();
        hot_items::format_top(&c, buf);
        out.add(buf);
    }
}

/// Nexmark q5-style hot items: bids per (window start, auction) over 10 s windows
/// sliding every 2 s, then one `window_start,window_end,auction,bids` line per window.
/// Windows fire as the job's do: when the watermark (largest timestamp so far − 1, the
/// source's `max_out_of_orderness_ms = 0`) reaches `window_end − 1`; a bid only for
/// windows that already fired is late and skipped (none in the time-ordered generated
/// input, where this equals nop-stream's per-batch watermark).
fn q5(path: &Path, out: &mut Summary) -> Result<u64> {
    let mut windows: BTreeMap<i64, HashMap<i64, u64, FxBuildHasher>> = BTreeMap::new();
    let mut wm = i64::MIN;
    let mut buf = Vec::with_capacity(64);
    let n = for_each_line(path, |line| {
        let bid = bid_of(line)?;
        let ts = bid.date_time;
        let mut start = ts - ts.rem_euclid(Q5_SLIDE_MS);
        while start > ts - Q5_SIZE_MS {
            if start + Q5_SIZE_MS - 1 > wm {
                *windows
                    .entry(start)
                    .or_default()
                    .entry(bid.auction)
                    .or_default() += 1;
            }
            start -= Q5_SLIDE_MS;
        }
        let w = ts.saturating_sub(1);
        if w > wm {
            wm = w;
            while let Some(entry) = windows.first_entry() {
                if *entry.key() + Q5_SIZE_MS - 1 > wm {
                    break;
                }
                let (start, counts) = entry.remove_entry();
                q5_emit(start, &counts, out, &mut buf);
            }
        }
        Ok(())
    })?;
    for (start, counts) in windows {
        q5_emit(start, &counts, out, &mut buf);
    }
    Ok(n)
}

/// CEP: three strictly rising bids in a row on one auction within 10 s, skip past last
/// event — `rising-bids`' direct form ([`rising_bids::Direct`]: per auction the bids
/// since its last match, at most two), one `auction,p1,p2,p3` line per match. Assumes
/// time-ordered input per auction (as generated; the job sorts by event time itself).
fn cep(path: &Path, out: &mut Summary) -> Result<u64> {
    let mut state: HashMap<i64, rising_bids::Direct, FxBuildHasher> = HashMap::default();
    let mut buf = Vec::with_capacity(64);
    for_each_line(path, |line| {
        let bid = bid_of(line)?;
        if let Some(m) = state
            .entry(bid.auction)
            .or_default()
            .push(bid.date_time, bid.price)
        {
            buf.clear();
            rising_bids::format_match(bid.auction, m, &mut buf);
            out.add(&buf);
        }
        Ok(())
    })
}

#[derive(Default)]
struct CarrierAcc {
    flights: u64,
    cancelled: u64,
    delayed_15: u64,
    delay_sum: i64,
    delay_n: u64,
}

/// Flights per carrier: flights, cancelled (no dep_delay), delayed over 15 min, mean
/// dep_delay; the output is one JSON line per carrier (like the job's), summarised.
fn flights(path: &Path, out: &mut Summary) -> Result<u64> {
    const DEP_DELAY: usize = 5;
    const CARRIER: usize = 9;
    let mut fields = Vec::with_capacity(19);
    let mut accs: HashMap<Vec<u8>, CarrierAcc, FxBuildHasher> = HashMap::default();
    let n = for_each_line(path, |line| {
        flights_mapper::csv::split_line(line, &mut fields).map_err(anyhow::Error::msg)?;
        if fields.len() != 19 {
            bail!("expected 19 fields, found {}", fields.len());
        }
        let carrier = fields[CARRIER].raw(line);
        let delay = fields[DEP_DELAY].raw(line);
        let acc = match accs.get_mut(carrier) {
            Some(a) => a,
            None => accs.entry(carrier.to_vec()).or_default(),
        };
        acc.flights += 1;
        if delay == b"NA" || delay.is_empty() {
            acc.cancelled += 1;
        } else {
            let d: i64 = std::str::from_utf8(delay)?
                .parse()
                .with_context(|| format!("dep_delay {:?}", String::from_utf8_lossy(delay)))?;
            acc.delay_sum += d;
            acc.delay_n += 1;
            if d > 15 {
                acc.delayed_15 += 1;
            }
        }
        Ok(())
    })?;
    let mut carriers: Vec<_> = accs.into_iter().collect();
    carriers.sort_by(|a, b| a.0.cmp(&b.0));
    for (c, a) in carriers {
        let avg = if a.delay_n == 0 {
            "null".to_string()
        } else {
            (a.delay_sum as f64 / a.delay_n as f64).to_string()
        };
        let line = format!(
            r#"{{"carrier":"{}","flights":{},"cancelled":{},"delayed_15":{},"avg_dep_delay_min":{avg}}}"#,
            String::from_utf8_lossy(&c),
            a.flights,
            a.cancelled,
            a.delayed_15
        );
        out.add(line.as_bytes());
    }
    Ok(n)
}

/// Runs the floor of `workload` (a [`crate::workload::Workload`] name) over `input`.
///
/// # Errors
/// An unknown workload, an unreadable file or a malformed line.
pub fn run(workload: &str, input: &Path) -> Result<FloorReport> {
    let started = Instant::now();
    let mut out = Summary::default();
    let records = match workload {
        "q0" => q0(input, &mut out)?,
        "q1" => q1(input, &mut out)?,
        "count" => count(input, &mut out)?,
        "q5" => q5(input, &mut out)?,
        "cep" => cep(input, &mut out)?,
        "flights" => flights(input, &mut out)?,
        other => bail!("no floor for workload `{other}`"),
    };
    Ok(FloorReport {
        records,
        output: out.into(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_process_a_small_file() {
        let dir = std::env::temp_dir().join(format!("nopstream-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bids.csv");
        let mut f = File::create(&path).unwrap();
        crate::bids::write_bids(&mut f, 5000, 100, true).unwrap();
        drop(f);
        for w in ["q0", "q1", "count"] {
            let r = run(w, &path).unwrap();
            assert_eq!(r.records, 5000, "{w}");
            assert_eq!(r.output.records, 5000, "{w}");
        }
        // 5000 bids, 1 per ms from a multiple of 2 s: windows start every 2 s from
        // t0 - 8 s to t0 + 4 s, seven windows.
        let r = run("q5", &path).unwrap();
        assert_eq!((r.records, r.output.records), (5000, 7));
        let r = run("cep", &path).unwrap();
        assert_eq!(r.records, 5000);
        assert_ne!(
            run("q0", &path).unwrap().output,
            run("q1", &path).unwrap().output
        );
        assert!(run("nope", &path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
