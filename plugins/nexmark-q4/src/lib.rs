//! `nexmark-q4`: Nexmark q4, the average winning price per category, append-only.
//!
//! ```sql
//! SELECT Q.category, AVG(Q.final)
//! FROM (SELECT MAX(B.price) AS final, A.category
//!       FROM auction A, bid B
//!       WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
//!       GROUP BY A.id, A.category) Q
//! GROUP BY Q.category;
//! ```
//!
//! Flink runs this as a regular join whose `MAX` updates, averaged with retractions. The
//! append-only form here (the same final result): an auction's final price is known when
//! the watermark passes its `expires`, and each category emits its running average once
//! per event time at which auctions of it closed ([`nexmark_model`]'s `queries::q4` is
//! the reference). Two stages, chosen by config `{ "stage": "close" | "average" }`:
//!
//! - `close`: an SDK interval join ([`nop_stream_sdk::join::IntervalJoin`]) of auctions
//!   (input 0: payload `id,category,date_time,expires`, keyed by `id`) and bids (input 1:
//!   payload `price`, keyed by `auction`): a bid joins when `date_time <= bid <= expires`
//!   (the row's own upper bound); the join keeps the highest price in the auction's
//!   accumulator and, when the auction expires with at least one bid, emits
//!   `category,final` keyed by the category (8 bytes, `i64` LE) and stamped `expires`.
//! - `average`: keyed by category (HASH edge), folds every closing price into the
//!   category's (sum, count) when the watermark passes its time, all closings of one
//!   time together, and emits `category,average` (integer, truncated, as `AVG` of a
//!   `BIGINT`), stamped with that time.

use nop_stream_sdk::join::{
    IntervalJoin, IntervalJoinFunction, IntervalJoinSpec, JoinOutput, JoinType, LATE_OUTPUT, Row,
};
use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo, TimeDomain, TimerGroup,
    ValueState,
};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["stage"],"properties":{"stage":{"enum":["close","average"],"x-state-layout":true,"x-inputs":{"close":2,"average":1}}}}"#;
/// Schema version of the close stage's accumulator (`Option<i64>`).
pub const ACC_SCHEMA: u32 = 1;
/// Value state of the averages: `(sum, count)` per category.
pub const TOTALS_STATE: &str = "q4-totals";
/// Value state of the closing prices not yet folded: per category and time (namespace:
/// the time, 8 bytes big-endian), the prices.
pub const PENDING_STATE: &str = "q4-pending";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    stage: String,
}

fn field(data: &[u8], i: usize) -> Result<&str> {
    std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.split(',').nth(i))
        .ok_or_else(|| PluginError::invalid_record(format!("expected a column {}", i + 1)))
}

fn int(data: &[u8], i: usize) -> Result<i64> {
    let f = field(data, i)?;
    f.parse().map_err(|_| {
        PluginError::invalid_record(format!("column {}: {f:?} is not an integer", i + 1))
    })
}

/// The close stage's join: the highest bid within `date_time..=expires`.
#[derive(Debug, Default)]
pub struct Close;

impl IntervalJoinFunction for Close {
    type Acc = Option<i64>;
    const EMITS_ON_LEFT_EXPIRY: bool = true;

    fn upper_bound(&self, _key: &[u8], auction: Row<'_>, default: i64) -> i64 {
        int(auction.data, 3).unwrap_or(default)
    }

    fn join(
        &mut self,
        _key: &[u8],
        _auction: Row<'_>,
        max: &mut Option<i64>,
        bid: Row<'_>,
        _out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        let price = int(bid.data, 0)?;
        *max = Some(max.map_or(price, |m| m.max(price)));
        Ok(())
    }

    fn left_expired(
        &mut self,
        _key: &[u8],
        auction: Row<'_>,
        max: Option<i64>,
        _matched: bool,
        _join_type: JoinType,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        if let Some(m) = max {
            let category = int(auction.data, 1)?;
            out.emit_keyed(
                &category.to_le_bytes(),
                format!("{category},{m}").as_bytes(),
            );
        }
        Ok(())
    }
}

/// The average stage.
#[derive(Debug)]
pub struct Average {
    totals: ValueState<(i64, i64)>,
    pending: ValueState<Vec<i64>>,
}

impl Average {
    fn process(&mut self, ctx: &mut dyn Context, batch: &Batch) -> Result<()> {
        // (time, key, final) of the batch, grouped by time then key.
        let mut rows: Vec<(i64, &[u8], i64)> = Vec::with_capacity(batch.len());
        for (i, r) in batch.iter().enumerate() {
            let ts = r.timestamp.ok_or_else(|| {
                PluginError::invalid_record(format!("record {i} has no timestamp"))
            })?;
            let key = r
                .key
                .ok_or_else(|| PluginError::invalid_record(format!("record {i} has no key")))?;
            rows.push((ts, key, int(r.data, 1)?));
        }
        rows.sort_unstable();
        let mut j = 0;
        while j < rows.len() {
            let t = rows[j].0;
            let ns = t.to_be_bytes();
            let mut keys: Vec<&[u8]> = Vec::new();
            let start = j;
            while j < rows.len() && rows[j].0 == t {
                if keys.last() != Some(&rows[j].1) {
                    keys.push(rows[j].1);
                }
                j += 1;
            }
            let stored = self.pending.in_namespace(&ns).get_many(ctx, &keys);
            let mut a = start;
            let mut puts = Vec::with_capacity(keys.len());
            for (key, prices) in keys.iter().zip(stored) {
                let mut prices = prices.unwrap_or_default();
                while a < j && rows[a].1 == *key {
                    prices.push(rows[a].2);
                    a += 1;
                }
                puts.push((*key, prices));
            }
            self.pending.in_namespace(&ns).put_many(ctx, &puts);
            ctx.register_timers_for_keys(TimeDomain::EventTime, &ns, t, &keys);
        }
        Ok(())
    }

    fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        for g in timers {
            if g.domain != TimeDomain::EventTime || g.namespace.len() != 8 {
                continue;
            }
            let ns = &g.namespace;
            let pending = self
                .pending
                .in_namespace(ns)
                .get_many_flat(ctx, &g.keys, &g.key_ends);
            let totals = self
                .totals
                .in_namespace(&[])
                .get_many_flat(ctx, &g.keys, &g.key_ends);
            self.pending
                .in_namespace(ns)
                .delete_many_flat(ctx, &g.keys, &g.key_ends);
            let mut puts = Vec::with_capacity(g.len());
            for (i, (prices, total)) in pending.into_iter().zip(totals).enumerate() {
                let Some(prices) = prices else { continue };
                let key = g.key(i);
                let (mut sum, mut count) = total.unwrap_or_default();
                for p in prices {
                    sum += p;
                    count += 1;
                }
                let category = i64::from_le_bytes(key.try_into().map_err(|_| {
                    PluginError::invalid_record("a q4 average key is an 8-byte category")
                })?);
                out.push_record(
                    Some(key),
                    Some(g.timestamp),
                    format!("{category},{}", sum / count).as_bytes(),
                );
                puts.push((key, (sum, count)));
            }
            self.totals.put_many(ctx, &puts);
        }
        Ok(())
    }
}

/// The operator: one of the two stages.
#[derive(Debug)]
pub enum Q4 {
    /// The auctions' closing prices.
    Close(IntervalJoin<Close>),
    /// The running averages.
    Average(Average),
}

impl Operator for Q4 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q4", "0.1.0")
            .description("Nexmark q4: auctions' closing prices (interval join), then the average per category")
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"nexmark-q4"}"#)
            .config_schema(CONFIG_SCHEMA)
            .state(ValueState::<(i64, i64)>::descriptor(TOTALS_STATE, 1))
            .state(ValueState::<Vec<i64>>::descriptor(PENDING_STATE, 1));
        for d in IntervalJoinSpec::state_descriptors::<Option<i64>>(ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q4 config: {e}")))?;
        match c.stage.as_str() {
            "close" => Ok(Q4::Close(
                IntervalJoin::open(
                    ctx,
                    IntervalJoinSpec::between(0, 0).with_unique_left(),
                    Close,
                )?
                .cached(),
            )),
            "average" => Ok(Q4::Average(Average {
                totals: ValueState::open(ctx, TOTALS_STATE)?,
                pending: ValueState::open(ctx, PENDING_STATE)?,
            })),
            s => Err(PluginError::invalid_config(format!(
                "nexmark-q4 config: `stage` must be close or average, got {s:?}"
            ))),
        }
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q4::Close(j) => j.process(ctx, input, batch, out),
            Q4::Average(a) => a.process(ctx, batch),
        }
    }

    fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q4::Close(j) => j.on_timers(ctx, timers, out),
            Q4::Average(a) => a.on_timers(ctx, timers, out),
        }
    }

    fn prepare_checkpoint(
        &mut self,
        ctx: &mut dyn Context,
        _epoch: u64,
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q4::Close(j) => j.flush(ctx, out),
            Q4::Average(_) => Ok(()),
        }
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        match self {
            Q4::Close(j) => j.finish(ctx, out),
            Q4::Average(_) => Ok(()),
        }
    }
}

nop_stream_sdk::export_operator!(Q4);
