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
//! Parsing allocates nothing per record: fields are split in place and the record is written
//! straight into the output batch. The common line (four commas, unsigned integers of at most
//! 16 digits) is read eight bytes at a time ([`fast`]); anything else (the header, a sign, a
//! malformed line) takes the byte-by-byte path, which gives the same result and the errors.

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

/// Size of the fixed part of an encoded bid, in bytes.
pub const BID_FIXED_BYTES: usize = 32;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"keyed":{"type":"boolean","default":true,"x-key-spec":true,"description":"key each record by its auction (8 bytes LE)"},"timestamps":{"type":"boolean","default":true,"description":"use date_time as the record's event time"}}}"#;

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
    match fast::parse(line) {
        Some(bid) => Ok(Line::Bid(bid)),
        None => parse_bytewise(line),
    }
}

/// [`parse_line`] one byte at a time, for a line without its `\r`: the reference the fast
/// path must agree with, and the path of every line it declines.
fn parse_bytewise(line: &[u8]) -> std::result::Result<Line<'_>, String> {
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

pub mod fast {
    //! The word-at-a-time path of [`parse_line`](super::parse_line): SWAR ("SIMD within a
    //! register") on `u64` words, the same code natively and in WebAssembly.
    //!
    //! Why: in the sandbox every loop iteration pays wasmtime's epoch-interruption check, so
    //! a byte loop over a 35-byte line costs some 70 checks; this path takes about ten (one
    //! per 8-byte word and per comma). The comma test is the exact zero-byte test of
    //! Hacker's Delight §6-1; the digit conversion is the eight-digit multiply of
    //! simdjson/fast_float (`parse_eight_digits_unrolled`).

    use super::Bid;

    /// `b` in every byte.
    const fn splat(b: u8) -> u64 {
        0x0101_0101_0101_0101 * b as u64
    }
    const HIGH_BITS: u64 = splat(0x80);
    const LOW_7: u64 = splat(0x7f);
    const ASCII_ZEROS: u64 = splat(b'0');

    /// `line[at..at + 8]` as a little-endian word (byte `at` lowest).
    #[inline(always)]
    fn load8(line: &[u8], at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&line[at..at + 8]);
        u64::from_le_bytes(b)
    }

    /// The high bit of every byte of `w` that is `,`, and no other bit.
    #[inline(always)]
    fn comma_bits(w: u64) -> u64 {
        let x = w ^ splat(b',');
        // A byte of `x` is zero iff neither its low seven bits carry into bit 7 nor bit 7 is
        // set; the sum cannot carry between bytes (0x7f + 0x7f < 0x100).
        !(((x & LOW_7) + LOW_7) | x) & HIGH_BITS
    }

    /// The offsets of the line's four commas, or `None` if it has another number of them or
    /// is shorter than 8 bytes.
    #[inline(always)]
    fn commas(line: &[u8]) -> Option<[usize; 4]> {
        let len = line.len();
        if len < 8 {
            return None;
        }
        let mut at = [0usize; 4];
        let mut n = 0;
        let mut i = 0;
        while i < len {
            let w = if i + 8 <= len {
                load8(line, i)
            } else {
                // The last word, shifted so that byte `i` is lowest; zeros above the end.
                load8(line, len - 8) >> ((i + 8 - len) * 8)
            };
            let mut bits = comma_bits(w);
            while bits != 0 {
                if n == 4 {
                    return None;
                }
                at[n] = i + (bits.trailing_zeros() / 8) as usize;
                n += 1;
                bits &= bits - 1;
            }
            i += 8;
        }
        (n == 4).then_some(at)
    }

    /// The value of eight ASCII digits, the most significant in the lowest byte, or `None`
    /// if a byte is not a digit.
    #[inline(always)]
    fn eight_digits(w: u64) -> Option<u64> {
        let d = w.wrapping_sub(ASCII_ZEROS);
        // The lowest non-digit byte sets its high bit in `d` (below `0`: the subtraction
        // wraps) or in `d + 0x76` (above `9`); digit bytes set neither and carry nothing.
        if (d | d.wrapping_add(splat(0x76))) & HIGH_BITS != 0 {
            return None;
        }
        let pairs = d.wrapping_mul(10).wrapping_add(d >> 8);
        const MASK: u64 = 0x0000_00ff_0000_00ff;
        let v = (pairs & MASK)
            .wrapping_mul(100 + (1_000_000 << 32))
            .wrapping_add(((pairs >> 16) & MASK).wrapping_mul(1 + (10_000 << 32)))
            >> 32;
        Some(v)
    }

    /// The value of `line[start..end]`, 1 to 8 ASCII digits; `None` otherwise, or if the
    /// line is too short to load a word around them (a field that ends before byte 8 of a
    /// line shorter than `start + 8`: only lines under 15 bytes).
    #[inline(always)]
    fn up_to_8(line: &[u8], start: usize, end: usize) -> Option<u64> {
        let len = end - start;
        // Bits of leading `0` digits that pad the field to eight.
        let pad = (8 - len) * 8;
        let w = if end >= 8 {
            // The word ending at `end`: the field is in its high bytes; pad the rest.
            let low = (1u64 << pad) - 1;
            (load8(line, end - 8) & !low) | (ASCII_ZEROS & low)
        } else if start + 8 <= line.len() {
            // The word starting at `start`: move the field up into the high bytes.
            let w = load8(line, start);
            if pad == 0 {
                w
            } else {
                (w << pad) | (ASCII_ZEROS >> (64 - pad))
            }
        } else {
            return None;
        };
        eight_digits(w)
    }

    /// The value of `line[start..end]`, 1 to 16 ASCII digits, or `None`.
    #[inline(always)]
    fn digits(line: &[u8], start: usize, end: usize) -> Option<i64> {
        let len = end.checked_sub(start)?;
        let v = match len {
            1..=8 => up_to_8(line, start, end)?,
            9..=16 => up_to_8(line, start, end - 8)? * 100_000_000 + up_to_8(line, end - 8, end)?,
            _ => return None,
        };
        // At most 16 digits: below 10^16 < 2^63.
        Some(v as i64)
    }

    /// A bid line without its line ending: five fields, the four numbers unsigned with 1 to
    /// 16 digits. `None` for anything else (the header, a sign, 17 or 18 digits, a malformed
    /// line): the caller then takes the byte-by-byte path, which decides.
    #[inline]
    pub fn parse(line: &[u8]) -> Option<Bid<'_>> {
        let [c0, c1, c2, c3] = commas(line)?;
        Some(Bid {
            auction: digits(line, 0, c0)?,
            bidder: digits(line, c0 + 1, c1)?,
            price: digits(line, c1 + 1, c2)?,
            channel: &line[c2 + 1..c3],
            date_time: digits(line, c3 + 1, line.len())?,
        })
    }
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
    use proptest::prelude::*;

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

    /// A line for the property test: a valid bid or one near it.
    fn line_strategy() -> impl Strategy<Value = Vec<u8>> {
        let number = prop_oneof![
            0i64..10,
            0i64..100_000_000,
            0i64..10_000_000_000_000_000,
            -1_000i64..0,
            Just(999_999_999_999_999_999),
        ]
        .prop_map(|v| v.to_string().into_bytes());
        let channel = prop_oneof![
            Just(b"Google".to_vec()),
            Just(Vec::new()),
            proptest::collection::vec(any::<u8>(), 0..12),
        ];
        let bid = (
            number.clone(),
            number.clone(),
            number.clone(),
            channel,
            number,
        )
            .prop_map(|(a, b, p, c, d)| [a, b, p, c, d].join(&b","[..]));
        (
            bid,
            proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..3),
            any::<bool>(),
        )
            .prop_map(|(mut line, edits, cr)| {
                // Edits: overwrite, insert or delete a byte (0 and 1 insert/overwrite digits
                // and commas, the bytes the fast path decides on), or none.
                for (at, byte, kind) in edits {
                    let i = at.index(line.len() + 1);
                    let byte = [b',', b'0' + byte % 10, byte, b'-'][usize::from(byte % 4)];
                    match kind {
                        0 if i < line.len() => line[i] = byte,
                        1 => line.insert(i, byte),
                        2 if i < line.len() => {
                            line.remove(i);
                        }
                        _ => {}
                    }
                }
                if cr {
                    line.push(b'\r');
                }
                line
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// The word-at-a-time path agrees with the byte-by-byte one on every line it takes,
        /// so `parse_line` is the byte-by-byte parser, results and errors alike.
        #[test]
        fn fast_path_agrees_with_the_bytewise_parser(line in line_strategy()) {
            let trimmed = line.strip_suffix(b"\r").unwrap_or(&line);
            let reference = parse_bytewise(trimmed);
            prop_assert_eq!(parse_line(&line), reference.clone());
            if let Some(bid) = fast::parse(trimmed) {
                prop_assert_eq!(Ok(Line::Bid(bid)), reference);
            }
        }
    }

    #[test]
    fn fast_path_takes_the_common_lines_and_declines_the_rest() {
        for (line, fast) in [
            (&b"1042,77,12345,Baidu,1700000000003"[..], true),
            (b"1,2,3,,45678901", true),
            // Too short to load a word around every field: the byte-by-byte path.
            (b"1,2,3,,4567", false),
            (b"12345678,87654321,1,c,1234567812345678", true),
            (b"123456789,1,2,c,3", true),
            (b"1,2,3,c,4", false),
            (b"auction,bidder,price,channel,date_time", false),
            (b"-1,2,3,c,4567890", false),
            (b"1,2,3,c,12345678901234567", false),
            (b"1,2,3,c,4,5678901", false),
            (b"1,2,3,c;4567890", false),
            (b"1,2,3,c,45 7890", false),
            (b"1,2,3,c,4567890/", false),
            (b"1,2,3,c,4567890:", false),
        ] {
            assert_eq!(
                fast::parse(line).is_some(),
                fast,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(
            fast::parse(b"12345678,87654321,1,c,1234567812345678").map(|b| (
                b.auction,
                b.bidder,
                b.price,
                b.date_time
            )),
            Some((12_345_678, 87_654_321, 1, 1_234_567_812_345_678))
        );
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
