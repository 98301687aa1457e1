//! `datagen-source`: generated bids, deterministic from a seed, bounded or unbounded
//! (Flink's DataGen and Arroyo's impulse source; capability replayable).
//!
//! Records are CSV lines `auction,bidder,price,channel,date_time` (no header), the format
//! of the benchmarks' bids file, so `bids-parser` reads them. Record `g` (global index,
//! from 0) is a pure function of `seed` and `g`:
//! - `auction` = `1000 + g / rotate_every + h(g) mod keys` with `rotate_every`, else
//!   `1000 + h(g) mod keys`: with a rotation the key range slides forward by one key
//!   every `rotate_every` records, so a key stops receiving records after about
//!   `keys × rotate_every` records and the number of distinct keys grows without bound
//!   (what state TTL is for);
//! - `bidder` = `h'(g) mod 100000`, `price` = `100 + h''(g) mod 999900` (cents), `channel`
//!   cycling Google, Facebook, Baidu, Apple;
//! - `date_time` = `1,700,000,000,000 + g` (one event per ms of event time); every record
//!   carries it as its event-time timestamp, so jobs may declare `watermarks`.
//!
//! Split `s` of `S` generates the global indexes `g = s, s + S, s + 2S, ...`; its cursor
//! is the number of records it returned (`u64` little-endian, exclusive). With `records`
//! the splits together return exactly that many records and finish; without it they never
//! finish. `records_per_second` throttles each instance (counted from its first read), in
//! whole batches ([`nop_stream_sdk::throttle`]: a due record waits at most about 5 ms).
//!
//! Config: `{ "records": u64, "keys": u32 (default 10000), "rotate_every": u64,
//! "seed": u64 (default 42), "splits": u32 (default: the parallelism),
//! "records_per_second": u64 }`.

use nop_stream_sdk::{
    Batch, PluginError, PluginInfo, Progress, ReadOutcome, Result, Source, SourceCapability, Split,
    TaskInfo,
};
use serde::Deserialize;

/// First event time, ms since the Unix epoch (the bids file's).
pub const T0_MS: i64 = 1_700_000_000_000;
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"records":{"type":"integer","minimum":0,"description":"records in total over every split; absent: unbounded"},"keys":{"type":"integer","minimum":1,"description":"auctions live at a time; default 10000"},"rotate_every":{"type":"integer","minimum":1,"description":"the auction range moves forward by one every this many records; absent: a fixed range"},"seed":{"type":"integer","minimum":0,"description":"default 42"},"splits":{"type":"integer","minimum":1,"description":"default: the source parallelism"},"records_per_second":{"type":"integer","minimum":1,"description":"throttle per source instance; absent: as fast as read"}}}"#;

/// The validated config.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Records over every split; `None`: unbounded.
    pub records: Option<u64>,
    /// Auctions live at a time (default 10,000).
    #[serde(default = "default_keys")]
    pub keys: u32,
    /// Move the auction range forward by one every this many records.
    pub rotate_every: Option<u64>,
    /// Seed (default 42).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Splits (default: the parallelism).
    pub splits: Option<u32>,
    /// Throttle per instance, records per second.
    pub records_per_second: Option<u64>,
}

fn default_keys() -> u32 {
    10_000
}

fn default_seed() -> u64 {
    42
}

impl Config {
    /// Parses and validates the JSON config.
    ///
    /// # Errors
    /// Malformed JSON, unknown fields, or a zero `keys`, `rotate_every`, `splits` or
    /// `records_per_second`.
    pub fn parse(json: &str) -> std::result::Result<Self, String> {
        let c: Config =
            serde_json::from_str(json).map_err(|e| format!("datagen-source config: {e}"))?;
        for (name, zero) in [
            ("keys", c.keys == 0),
            ("rotate_every", c.rotate_every == Some(0)),
            ("splits", c.splits == Some(0)),
            ("records_per_second", c.records_per_second == Some(0)),
        ] {
            if zero {
                return Err(format!(
                    "datagen-source config: `{name}` must be at least 1"
                ));
            }
        }
        Ok(c)
    }
}

/// splitmix64: a well-mixed 64-bit hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Record `g` as a CSV line (appended to `line`, cleared first) and its event time.
pub fn record(config: &Config, g: u64, line: &mut String) -> i64 {
    use std::fmt::Write;
    let h = mix(config.seed ^ mix(g));
    let base = config.rotate_every.map_or(0, |r| g / r);
    let auction = 1000 + base + h % u64::from(config.keys);
    let h2 = mix(h);
    let bidder = h2 % 100_000;
    let price = 100 + mix(h2) % 999_900;
    let ts = T0_MS + g as i64;
    line.clear();
    let _ = write!(
        line,
        "{auction},{bidder},{price},{},{ts}",
        CHANNELS[(g % 4) as usize]
    );
    ts
}

/// Split `index` of `count`, encoded as its descriptor (two `u32` little-endian).
fn descriptor(index: u32, count: u32) -> Vec<u8> {
    let mut d = index.to_le_bytes().to_vec();
    d.extend_from_slice(&count.to_le_bytes());
    d
}

fn decode(d: &[u8]) -> Result<(u32, u32)> {
    match (d.get(..4), d.get(4..8)) {
        (Some(a), Some(b)) if d.len() == 8 => Ok((
            u32::from_le_bytes(a.try_into().expect("4 bytes")),
            u32::from_le_bytes(b.try_into().expect("4 bytes")),
        )),
        _ => Err(PluginError::internal(format!(
            "split descriptor of {} bytes; datagen-source descriptors are 8",
            d.len()
        ))),
    }
}

/// Records split `index` of `count` holds when `total` are generated: the indexes
/// `g < total` with `g mod count == index`.
fn split_len(total: u64, index: u32, count: u32) -> u64 {
    let (i, c) = (u64::from(index), u64::from(count));
    if total <= i {
        0
    } else {
        (total - i).div_ceil(c)
    }
}

/// The source instance.
#[derive(Debug)]
pub struct DatagenSource {
    config: Config,
    throttle: Option<nop_stream_sdk::throttle::RateLimit>,
    line: String,
}

impl Source for DatagenSource {
    fn describe() -> PluginInfo {
        PluginInfo::source("datagen-source", "0.1.0")
            .description(
                "Generated bids (CSV lines), deterministic from a seed; bounded or unbounded",
            )
            .source_capability(SourceCapability::Replayable)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(Self {
            config: Config::parse(config).map_err(PluginError::invalid_config)?,
            throttle: None,
            line: String::new(),
        })
    }

    fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>> {
        let count = self.config.splits.unwrap_or(parallelism).max(1);
        Ok((0..count)
            .map(|i| Split {
                id: format!("datagen-{i}-of-{count}"),
                descriptor: descriptor(i, count),
            })
            .collect())
    }

    fn read(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome> {
        let (index, count) = decode(&split.descriptor)?;
        let done = match cursor.len() {
            0 => 0,
            8 => u64::from_le_bytes(cursor.try_into().expect("8 bytes")),
            n => {
                return Err(PluginError::internal(format!(
                    "cursor of {n} bytes; datagen-source cursors are 8 bytes"
                )));
            }
        };
        let len = self.config.records.map(|t| split_len(t, index, count));
        let mut budget = u64::from(max_records);
        if let Some(rate) = self.config.records_per_second {
            let limit = self
                .throttle
                .get_or_insert_with(|| nop_stream_sdk::throttle::RateLimit::new(rate));
            budget = u64::from(limit.grant(max_records));
        }
        let end = len.map_or(done + budget, |l| l.min(done + budget));
        for n in done..end {
            let g = n * u64::from(count) + u64::from(index);
            let ts = record(&self.config, g, &mut self.line);
            out.push_record(None, Some(ts), self.line.as_bytes());
        }
        if let Some(limit) = &mut self.throttle {
            limit.took(end - done);
        }
        Ok(ReadOutcome {
            next_cursor: end.to_le_bytes().to_vec(),
            finished: len.is_some_and(|l| end >= l),
            progress: Progress {
                consumed: end,
                total: len,
            },
        })
    }
}

nop_stream_sdk::export_source!(DatagenSource);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        Config::parse(json).unwrap()
    }

    #[test]
    fn splits_partition_the_records_exactly() {
        for total in [0u64, 1, 7, 100, 1001] {
            for count in 1..5u32 {
                let sum: u64 = (0..count).map(|i| split_len(total, i, count)).sum();
                assert_eq!(sum, total, "{total} over {count}");
            }
        }
    }

    #[test]
    fn records_are_a_function_of_seed_and_index() {
        let c = config("{}");
        let (mut a, mut b) = (String::new(), String::new());
        assert_eq!(record(&c, 5, &mut a), T0_MS + 5);
        record(&c, 5, &mut b);
        assert_eq!(a, b);
        let fields: Vec<&str> = a.split(',').collect();
        assert_eq!(fields.len(), 5);
        let auction: u64 = fields[0].parse().unwrap();
        assert!((1000..11_000).contains(&auction));
        assert_eq!(fields[3], "Facebook");
        record(&config(r#"{"seed":7}"#), 5, &mut b);
        assert_ne!(a, b);
        // With a rotation the auction range slides forward.
        let r = config(r#"{"keys":10,"rotate_every":100}"#);
        let auction = |g| {
            let mut l = String::new();
            record(&r, g, &mut l);
            l.split(',').next().unwrap().parse::<u64>().unwrap()
        };
        assert!((1000..1010).contains(&auction(0)));
        assert!((1050..1060).contains(&auction(5_000)));
    }

    #[test]
    fn bad_configs_are_refused_naming_the_field() {
        for (json, field) in [
            (r#"{"keys":0}"#, "keys"),
            (r#"{"rotate_every":0}"#, "rotate_every"),
            (r#"{"splits":0}"#, "splits"),
            (r#"{"records_per_second":0}"#, "records_per_second"),
            (r#"{"nope":1}"#, "nope"),
        ] {
            let e = Config::parse(json).unwrap_err();
            assert!(e.contains(field), "{json}: {e}");
        }
    }
}
