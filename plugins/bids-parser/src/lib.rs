//! `bids-parser`: parses Nexmark-style bid CSV lines (`auction,bidder,price,channel,date_time`,
//! the format of the benchmark generator) into compact binary bid records.
//!
//! Config: `{ "keyed": true, "timestamps": true }` (both default `true`): whether each
//! output record carries the auction as its key (8 bytes, little-endian) and `date_time` as
//! its event time. A header line (`auction,...`) produces nothing.
//!
//! Output payload, [`BID_FIXED_BYTES`] + channel length bytes (see [`encode_bid`]):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | auction, `i64` LE |
//! | 8..16 | bidder, `i64` LE |
//! | 16..24 | price in cents, `i64` LE |
//! | 24..32 | date_time, ms since the Unix epoch, `i64` LE |
//! | 32.. | channel, UTF-8 as in the input |
//!
//! Parsing allocates nothing per record: fields are split in place and integers are read
//! digit by digit; the record is written straight into the output batch.

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

/// Size of the fixed part of an encoded bid, in bytes.
pub const BID_FIXED_BYTES: usize = 32;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"keyed":{"type":"boolean","default":true,"description":"key each record by its auction (8 bytes LE)"},"timestamps":{"type":"boolean","default":true,"description":"use date_time as the record's event time"}}}"#;

/// One parsed bid, borrowing the channel from the input line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bid<'a> {
    /// Auction id.
    pub auction: i64,
    /// Bidder id.
    pub bidder: i64,
    /// Price in cents.
    pub price: i64,
    /// Channel name.
    pub channel: &'a [u8],
    /// Event time in ms since the Unix epoch.
    pub date_time: i64,
}

/// Parses a decimal `i64` (optional leading `-`), or `None`.
#[inline]
fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &b in digits {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + i64::from(d);
    }
    Some(if neg { -v } else { v })
}

/// What [`parse_line`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A bid.
    Bid(Bid<'a>),
    /// The header line.
    Header,
}

/// Parses one CSV line (without its line ending; a trailing `\r` is ignored).
///
/// # Errors
/// A message naming the offending field: not five fields, or a non-integer number.
#[inline]
pub fn parse_line(line: &[u8]) -> std::result::Result<Line<'_>, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.starts_with(b"auction,") {
        return Ok(Line::Header);
    }
    let mut fields = line.split(|&b| b == b',');
    let mut next = |name: &str| fields.next().ok_or_else(|| format!("missing field {name}"));
    let num = |name: &str, s: &[u8]| {
        parse_i64(s).ok_or_else(|| {
            format!(
                "field {name}: {:?} is not an integer",
                String::from_utf8_lossy(s)
            )
        })
    };
    let auction = num("auction", next("auction")?)?;
    let bidder = num("bidder", next("bidder")?)?;
    let price = num("price", next("price")?)?;
    let channel = next("channel")?;
    let date_time = num("date_time", next("date_time")?)?;
    if fields.next().is_some() {
        return Err("more than five fields".into());
    }
    Ok(Line::Bid(Bid {
        auction,
        bidder,
        price,
        channel,
        date_time,
    }))
}

/// Appends the binary encoding of `bid` (layout in the [module docs](self)).
#[inline]
pub fn encode_bid(bid: &Bid<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&bid.auction.to_le_bytes());
    out.extend_from_slice(&bid.bidder.to_le_bytes());
    out.extend_from_slice(&bid.price.to_le_bytes());
    out.extend_from_slice(&bid.date_time.to_le_bytes());
    out.extend_from_slice(bid.channel);
}

/// Decodes a record written by [`encode_bid`], or `None` if it is shorter than
/// [`BID_FIXED_BYTES`].
#[inline]
pub fn decode_bid(rec: &[u8]) -> Option<Bid<'_>> {
    if rec.len() < BID_FIXED_BYTES {
        return None;
    }
    let at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rec[i..i + 8]);
        i64::from_le_bytes(b)
    };
    Some(Bid {
        auction: at(0),
        bidder: at(8),
        price: at(16),
        date_time: at(24),
        channel: &rec[BID_FIXED_BYTES..],
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "yes")]
    keyed: bool,
    #[serde(default = "yes")]
    timestamps: bool,
}

fn yes() -> bool {
    true
}

/// The operator: its config; no state.
#[derive(Debug)]
pub struct BidsParser {
    keyed: bool,
    timestamps: bool,
}

impl Operator for BidsParser {
    fn describe() -> PluginInfo {
        PluginInfo::operator("bids-parser", "0.1.0")
            .description("Parses bid CSV lines into compact binary bid records keyed by auction")
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("bids-parser config: {e}")))?;
        Ok(Self {
            keyed: c.keyed,
            timestamps: c.timestamps,
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        out.data.reserve(batch.len() * (BID_FIXED_BYTES + 8));
        for (i, rec) in batch.iter().enumerate() {
            let bid = match parse_line(rec.data) {
                Ok(Line::Bid(b)) => b,
                Ok(Line::Header) => continue,
                Err(e) => return Err(PluginError::invalid_record(format!("record {i}: {e}"))),
            };
            let key = bid.auction.to_le_bytes();
            out.push_with(
                self.keyed.then_some(&key[..]),
                self.timestamps.then_some(bid.date_time),
                |buf| encode_bid(&bid, buf),
            );
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(BidsParser);

#[cfg(test)]
mod tests {
    use nop_stream_sdk::{ErrorCode, MockContext};

    use super::*;

    #[test]
    fn parses_encodes_and_decodes() {
        let line = b"1042,77,12345,Baidu,1700000000003\r";
        let Line::Bid(b) = parse_line(line).unwrap() else {
            panic!("not a bid")
        };
        assert_eq!(
            (b.auction, b.bidder, b.price, b.channel, b.date_time),
            (1042, 77, 12345, &b"Baidu"[..], 1_700_000_000_003)
        );
        let mut buf = Vec::new();
        encode_bid(&b, &mut buf);
        assert_eq!(buf.len(), BID_FIXED_BYTES + 5);
        assert_eq!(decode_bid(&buf), Some(b));
        assert_eq!(decode_bid(&buf[..31]), None);
        assert_eq!(
            parse_line(b"auction,bidder,price,channel,date_time").unwrap(),
            Line::Header
        );
        for bad in [
            &b"1,2,3,x"[..],
            b"1,2,x,c,4",
            b"1,2,3,c,4,5",
            b"",
            b"1,,3,c,4",
        ] {
            assert!(
                parse_line(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn operator_keys_and_timestamps_records() {
        let mut ctx = MockContext::for_operator::<BidsParser>();
        let mut op = BidsParser::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let mut input = Batch::default();
        input.push(b"auction,bidder,price,channel,date_time");
        input.push(b"1000,1,100,Google,1700000000000");
        input.push(b"1001,2,200,Apple,1700000000001");
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out.key(1), Some(&1001i64.to_le_bytes()[..]));
        assert_eq!(out.timestamp(0), Some(1_700_000_000_000));
        assert_eq!(decode_bid(out.record(1)).unwrap().channel, b"Apple");

        let mut op = BidsParser::open(
            &mut ctx,
            &TaskInfo::for_tests(),
            r#"{"keyed":false,"timestamps":false}"#,
        )
        .unwrap();
        let mut out = Batch::default();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        assert!(!out.is_keyed() && !out.has_timestamps());

        let mut bad = Batch::default();
        bad.push(b"1,2,three,c,4");
        let err = op
            .process(&mut ctx, 0, &bad, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRecord);
        assert!(err.message.contains("price"), "{}", err.message);
        assert!(BidsParser::open(&mut ctx, &TaskInfo::for_tests(), r#"{"x":1}"#).is_err());
    }
}
