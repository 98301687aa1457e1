//! `nexmark-q9`: Nexmark q9, winning bids, on the SDK's interval join
//! ([`nop_stream_sdk::join::IntervalJoin`]) with a per-auction accumulator.
//!
//! ```sql
//! SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller,
//!        category, extra, auction, bidder, price, bid_dateTime, bid_extra
//! FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime,
//!              B.extra AS bid_extra,
//!              ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) AS rownum
//!       FROM auction A, bid B
//!       WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
//! WHERE rownum <= 1;
//! ```
//!
//! Flink keeps a top 1 per auction that it retracts as better bids arrive. Here the
//! append-only form: a bid joins its auction when `date_time <= bid <= expires`
//! (the auction row's own upper bound), the auction's accumulator keeps the best bid
//! (higher price, then earlier time, then lower bidder, then smaller `extra`: the SQL
//! leaves ties after the time open), and when the watermark passes `expires` an auction
//! with at least one bid emits one line: the auction's columns, then the bid's. These
//! are Flink's final rows.
//!
//! Inputs (HASH edges): 0, left: auctions, payload all 10 columns, keyed by `id`; 1,
//! right: bids, payload `auction,bidder,price,date_time,extra`, keyed by `auction`.

use nop_stream_sdk::join::{
    IntervalJoin, IntervalJoinFunction, IntervalJoinSpec, JoinOutput, JoinType, LATE_OUTPUT, Row,
};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::{Deserialize, Serialize};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false}"#;
/// Schema version of the accumulator ([`Best`]).
pub const ACC_SCHEMA: u32 = 1;

/// The best bid of an auction so far: its ranking columns and its payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Best {
    /// Price.
    pub price: i64,
    /// Bid time.
    pub date_time: i64,
    /// Bidder.
    pub bidder: i64,
    /// The bid's payload.
    pub line: String,
}

impl Best {
    fn extra(&self) -> &str {
        self.line.rsplit(',').next().unwrap_or("")
    }

    /// Whether `self` ranks before `other` (module docs).
    pub fn beats(&self, other: &Best) -> bool {
        use std::cmp::Reverse;
        (
            self.price,
            Reverse(self.date_time),
            Reverse(self.bidder),
            Reverse(self.extra()),
        ) > (
            other.price,
            Reverse(other.date_time),
            Reverse(other.bidder),
            Reverse(other.extra()),
        )
    }
}

fn parse_bid(data: &[u8]) -> Result<Best> {
    let bad =
        || PluginError::invalid_record("expected a bid `auction,bidder,price,date_time,extra`");
    let line = std::str::from_utf8(data).map_err(|_| bad())?;
    let mut c = line.split(',');
    let _auction = c.next();
    let mut int = || -> Result<i64> { c.next().and_then(|s| s.parse().ok()).ok_or_else(bad) };
    let (bidder, price, date_time) = (int()?, int()?, int()?);
    Ok(Best {
        price,
        date_time,
        bidder,
        line: line.to_owned(),
    })
}

/// The join function.
#[derive(Debug, Default)]
pub struct WinningBids;

impl IntervalJoinFunction for WinningBids {
    type Acc = Option<Best>;
    const EMITS_ON_LEFT_EXPIRY: bool = true;

    fn upper_bound(&self, _key: &[u8], auction: Row<'_>, default: i64) -> i64 {
        std::str::from_utf8(auction.data)
            .ok()
            .and_then(|s| s.split(',').nth(6))
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    }

    fn join(
        &mut self,
        _key: &[u8],
        _auction: Row<'_>,
        best: &mut Option<Best>,
        bid: Row<'_>,
        _out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        let b = parse_bid(bid.data)?;
        if best.as_ref().is_none_or(|x| b.beats(x)) {
            *best = Some(b);
        }
        Ok(())
    }

    fn left_expired(
        &mut self,
        _key: &[u8],
        auction: Row<'_>,
        best: Option<Best>,
        _matched: bool,
        _join_type: JoinType,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        if let Some(b) = best {
            out.emit_with(|buf| {
                buf.extend_from_slice(auction.data);
                buf.push(b',');
                buf.extend_from_slice(b.line.as_bytes());
            });
        }
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct Q9 {
    join: IntervalJoin<WinningBids>,
}

impl Operator for Q9 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q9", "0.1.0")
            .description("Nexmark q9: every auction's winning bid, when it closes (interval join)")
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"interval-join","plugin":"nexmark-q9"}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in IntervalJoinSpec::state_descriptors::<Option<Best>>(ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let _: serde_json::Map<String, serde_json::Value> = serde_json::from_str(config)
            .ok()
            .filter(|m: &serde_json::Map<String, serde_json::Value>| m.is_empty())
            .ok_or_else(|| PluginError::invalid_config("nexmark-q9 takes no config"))?;
        Ok(Q9 {
            join: IntervalJoin::open(
                ctx,
                IntervalJoinSpec::between(0, 0).with_unique_left(),
                WinningBids,
            )?
            .cached(),
        })
    }

    nop_stream_sdk::join_operator_hooks!(join);
}

nop_stream_sdk::export_operator!(Q9);
