//! `rising-bids`: a CEP benchmark pattern over `bids-parser` records — three strictly
//! rising bids in a row on the same auction within 10 s (the Flink peer's
//! `MATCH_RECOGNIZE (PARTITION BY auction ORDER BY ts … PATTERN (A B C) WITHIN INTERVAL
//! '10' SECOND DEFINE B AS B.price > A.price, C AS C.price > B.price)` with `AFTER MATCH
//! SKIP PAST LAST ROW`), on [`nop_stream_sdk::cep`].
//!
//! # Input
//! Binary bid records of `bids-parser` (auction, bidder, price, date_time as `i64` LE,
//! then the channel), keyed by auction (8 bytes LE) over a HASH edge, with event time =
//! `date_time`. Only the price (bytes 16..24) is kept per event.
//!
//! # Pattern and semantics
//! `begin("a").next("b").where_(price > a.price).next("c").where_(price > b.price)
//! .within(10 000 ms)`, skip past last event:
//! - strict contiguity on the auction's bids in event-time order (equal times: arrival
//!   order);
//! - within: `c.ts - a.ts < 10 000` (a partial match is pruned once event time reaches
//!   `a.ts + 10 000`);
//! - after a match, every partial match that started at or before its last bid is
//!   dropped: the next match needs three new bids.
//!
//! Late records (at or behind the watermark on arrival) are dropped and counted.
//! Timed-out partial matches are discarded ([`CepOperator::discard_timed_out`]), as
//! Flink's `MATCH_RECOGNIZE` discards them.
//!
//! # Output
//! One record per match, text `auction,p1,p2,p3` (the Flink peer's columns; see
//! [`format_match`]), keyed by the auction, timestamped with the third bid.

use nop_stream_sdk::cep::{AfterMatchSkip, CepOperator, Match, MatchSoFar, Pattern};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo};

/// The `within` window in ms.
pub const WITHIN_MS: i64 = 10_000;

/// JSON Schema of the config (no settings).
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false}"#;

fn above(stage: &'static str) -> impl Fn(&i64, &MatchSoFar<'_, i64>) -> bool {
    move |price, m| m.last(stage).is_some_and(|prev| price > prev)
}

/// The pattern over bid prices (cents).
pub fn pattern() -> Pattern<i64> {
    Pattern::begin("a")
        .next("b")
        .where_("price_gt_a", above("a"))
        .next("c")
        .where_("price_gt_b", above("b"))
        .within(WITHIN_MS)
        .after_match(AfterMatchSkip::SkipPastLastEvent)
}

/// The price of a `bids-parser` record.
///
/// # Errors
/// `invalid-record` for a payload shorter than the fixed 32 bytes of a bid.
#[inline]
pub fn decode(rec: RecordRef<'_>) -> Result<Option<i64>> {
    if rec.data.len() < 32 {
        return Err(PluginError::invalid_record(
            "rising-bids: not a bids-parser record (< 32 bytes)",
        ));
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&rec.data[16..24]);
    Ok(Some(i64::from_le_bytes(b)))
}

/// Appends the output text of a match: `auction,p1,p2,p3`.
pub fn format_match(auction: i64, prices: [i64; 3], buf: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(buf, "{auction},{},{},{}", prices[0], prices[1], prices[2]);
}

/// The auction of a record key (8 bytes LE).
///
/// # Errors
/// `internal` for a key that is not 8 bytes.
pub fn auction_of(key: &[u8]) -> Result<i64> {
    let k: [u8; 8] = key.try_into().map_err(|_| {
        PluginError::internal(format!(
            "rising-bids: key of {} bytes, expected an 8-byte auction id",
            key.len()
        ))
    })?;
    Ok(i64::from_le_bytes(k))
}

fn encode(m: &Match<i64>, buf: &mut Vec<u8>) -> Result<()> {
    let auction = auction_of(&m.key)?;
    let p = |s: &str| m.get(s).first().map_or(0, |e| e.event);
    format_match(auction, [p("a"), p("b"), p("c")], buf);
    Ok(())
}

/// The operator: a [`CepOperator`] over bid prices.
#[derive(Debug)]
pub struct RisingBids {
    cep: CepOperator<i64>,
}

impl Operator for RisingBids {
    fn describe() -> PluginInfo {
        CepOperator::declare(
            PluginInfo::operator("rising-bids", "0.1.0")
                .description("Three strictly rising bids in a row on one auction within 10 s")
                .config_schema(CONFIG_SCHEMA),
            &pattern(),
        )
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c = config.trim();
        if !(c.is_empty() || c == "{}") {
            let v: serde_json::Value = serde_json::from_str(c)
                .map_err(|e| PluginError::invalid_config(format!("rising-bids config: {e}")))?;
            if v.as_object().is_none_or(|o| !o.is_empty()) {
                return Err(PluginError::invalid_config(
                    "rising-bids config: takes no settings ({})",
                ));
            }
        }
        Ok(RisingBids {
            cep: CepOperator::open(ctx, pattern(), decode, encode)?.discard_timed_out(),
        })
    }

    nop_stream_sdk::cep_operator_hooks!(cep);
}

nop_stream_sdk::export_operator!(RisingBids);

/// The direct (non-NFA) form of the pattern, as the benchmark floor runs it: per auction
/// the bids since its last match, at most two; on a new bid `c` with buffer `[a, b]`,
/// a match if `a.price < b.price < c.price` and `c.ts - a.ts < 10 000` (then the buffer
/// is cleared), else `c` is pushed keeping the last two. Input must be in event-time
/// order per auction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direct {
    buf: [(i64, i64); 2],
    len: u8,
}

impl Direct {
    /// Feeds the bid `(ts, price)`; returns the prices of a completed match.
    #[inline]
    pub fn push(&mut self, ts: i64, price: i64) -> Option<[i64; 3]> {
        if self.len == 2 {
            let [(ta, pa), (_, pb)] = self.buf;
            if pa < pb && pb < price && ts - ta < WITHIN_MS {
                self.len = 0;
                return Some([pa, pb, price]);
            }
            self.buf[0] = self.buf[1];
            self.buf[1] = (ts, price);
        } else {
            self.buf[usize::from(self.len)] = (ts, price);
            self.len += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests;
