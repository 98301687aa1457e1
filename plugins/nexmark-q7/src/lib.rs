//! `nexmark-q7`: Nexmark q7, the highest bid, in two stages (config `{ "stage": "max" |
//! "join" }`).
//!
//! ```sql
//! SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra
//! FROM bid B
//! JOIN (SELECT MAX(price) AS maxprice, window_end AS dateTime
//!       FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!       GROUP BY window_start, window_end) B1
//! ON B.price = B1.maxprice
//! WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime;
//! ```
//!
//! - `max`: the highest price of every 10 s tumbling event-time window over all bids
//!   (input: bids whose comma-separated payload field `price_field`, default 0, is the
//!   price; the example job feeds it the join's own bid rows, `price_field = 1`, so the
//!   bids are parsed once; run it at parallelism 1 behind a SINGLETON edge): the
//!   SDK window operator with the accumulator cache, every record under one key. Emits
//!   the price as text, keyed by it (8 bytes, `i64` LE) and stamped `window_end - 1`.
//! - `join`: an SDK interval join ([`nop_stream_sdk::join::IntervalJoin`]) of those
//!   maxima (input 0, keyed by price) with the bids (input 1: payload
//!   `auction,price,bidder,date_time,extra`, keyed by `price`), with its row cache
//!   (each price's 10 s of bids stay decoded between checkpoints): a bid joins a maximum at
//!   `m = window_end - 1` when `m - 9999 <= bid <= m + 1`, i.e. `window_end - 10 s <=
//!   date_time <= window_end`, both ends inclusive as `BETWEEN`. Emits the bid's payload.

use nop_stream_sdk::join::{
    IntervalJoin, IntervalJoinFunction, IntervalJoinSpec, JoinOutput, LATE_OUTPUT, Row,
};
use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, ProcessWindowFunction, Window, WindowOperator,
    WindowOutput, WindowSpec, state_descriptors,
};
use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo, TimerGroup,
};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["stage"],"properties":{"stage":{"enum":["max","join"],"x-state-layout":true,"x-inputs":{"max":1,"join":2}},"price_field":{"type":"integer","minimum":0}}}"#;
/// The tumbling window (ms).
pub const WINDOW_MS: i64 = 10_000;
/// Schema version of the max stage's accumulator (`Option<i64>`).
pub const ACC_SCHEMA: u32 = 1;
/// The one key of the max stage.
pub const KEY: &[u8] = b"q7";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    stage: String,
    /// The max stage: the comma-separated field of the payload that holds the price
    /// (default 0: a payload of the price alone).
    #[serde(default)]
    price_field: usize,
}

/// The integer in comma-separated field `field` of `data`.
fn price_at(data: &[u8], field: usize) -> Result<i64> {
    data.split(|&b| b == b',')
        .nth(field)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            PluginError::invalid_record(format!("expected a price in field {field} (from 0)"))
        })
}

/// The price in the first field.
fn price(data: &[u8]) -> Result<i64> {
    price_at(data, 0)
}

/// The highest price, read from comma-separated field `.0` of each payload.
#[derive(Debug, Default, Clone, Copy)]
pub struct Max(pub usize);

impl AggregateFunction for Max {
    type In = i64;
    type Acc = Option<i64>;
    type Out = Option<i64>;

    fn decode(&self, record: RecordRef<'_>) -> Result<i64> {
        price_at(record.data, self.0)
    }
    fn create_accumulator(&self) -> Option<i64> {
        None
    }
    fn add(&self, acc: &mut Option<i64>, v: &i64) {
        *acc = Some(acc.map_or(*v, |a| a.max(*v)));
    }
    fn merge(&self, acc: &mut Option<i64>, other: Option<i64>) {
        if let Some(o) = other {
            self.add(acc, &o);
        }
    }
    fn get_result(&self, acc: Option<i64>) -> Option<i64> {
        acc
    }
}

/// Emits the maximum as text (re-keyed by the operator).
#[derive(Debug, Default, Clone, Copy)]
pub struct EmitMax;

impl ProcessWindowFunction<Option<i64>> for EmitMax {
    fn process(
        &self,
        _key: &[u8],
        _w: Window,
        elements: &[Option<i64>],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for m in elements.iter().flatten() {
            out.emit(m.to_string().as_bytes());
        }
        Ok(())
    }
}

/// The join stage's function: emits the bid.
#[derive(Debug, Default)]
pub struct HighestBids;

impl IntervalJoinFunction for HighestBids {
    type Acc = ();

    fn join(
        &mut self,
        _key: &[u8],
        _max: Row<'_>,
        _acc: &mut (),
        bid: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        out.emit(bid.data);
        Ok(())
    }
}

/// The max stage: the window operator and a buffer for re-keying its output.
#[derive(Debug)]
pub struct MaxStage {
    op: WindowOperator<Aggregating<Max, EmitMax>>,
    rekeyed: Batch,
    fired: Batch,
}

impl MaxStage {
    /// Moves `fired` into `out`, each record keyed by its price.
    fn rekey(fired: &mut Batch, out: &mut Batch) -> Result<()> {
        for r in fired.iter() {
            out.push_record(Some(&price(r.data)?.to_le_bytes()), r.timestamp, r.data);
        }
        fired.clear();
        Ok(())
    }
}

/// The operator: one of the two stages.
#[derive(Debug)]
pub enum Q7 {
    /// Window maxima.
    Max(Box<MaxStage>),
    /// Bids at the maxima.
    Join(Box<IntervalJoin<HighestBids>>),
}

impl Operator for Q7 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q7", "0.1.0")
            .description("Nexmark q7: the highest price per 10 s window, then the bids at it (interval join)")
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"nexmark-q7"}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        for d in IntervalJoinSpec::state_descriptors::<()>(1) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q7 config: {e}")))?;
        match c.stage.as_str() {
            "max" => {
                task.require_parallelism_1("nexmark-q7", "the highest bid of every window")?;
                Ok(Q7::Max(Box::new(MaxStage {
                    op: WindowOperator::open(
                        ctx,
                        WindowSpec::tumbling(WINDOW_MS),
                        Aggregating::with_process(Max(c.price_field), EmitMax),
                    )?
                    .cached(),
                    rekeyed: Batch::new(),
                    fired: Batch::new(),
                })))
            }
            "join" => Ok(Q7::Join(Box::new(
                IntervalJoin::open(
                    ctx,
                    IntervalJoinSpec::between(-(WINDOW_MS - 1), 1),
                    HighestBids,
                )?
                .cached(),
            ))),
            s => Err(PluginError::invalid_config(format!(
                "nexmark-q7 config: `stage` must be max or join, got {s:?}"
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
            Q7::Max(m) => {
                m.rekeyed.clear();
                for r in batch.iter() {
                    m.rekeyed.push_record(Some(KEY), r.timestamp, r.data);
                }
                m.op.process(ctx, &m.rekeyed, &mut m.fired)?;
                MaxStage::rekey(&mut m.fired, out)
            }
            Q7::Join(j) => j.process(ctx, input, batch, out),
        }
    }

    fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q7::Max(m) => {
                m.op.on_timers(ctx, timers, &mut m.fired)?;
                MaxStage::rekey(&mut m.fired, out)
            }
            Q7::Join(j) => j.on_timers(ctx, timers, out),
        }
    }

    fn on_watermark(
        &mut self,
        ctx: &mut dyn Context,
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q7::Max(m) => {
                m.op.on_watermark(ctx, watermark, &mut m.fired)?;
                MaxStage::rekey(&mut m.fired, out)
            }
            Q7::Join(_) => Ok(()),
        }
    }

    fn prepare_checkpoint(
        &mut self,
        ctx: &mut dyn Context,
        _epoch: u64,
        out: &mut Batch,
    ) -> Result<()> {
        match self {
            Q7::Max(m) => m.op.flush(ctx, out),
            Q7::Join(j) => j.flush(ctx, out),
        }
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        match self {
            Q7::Max(m) => m.op.flush(ctx, out),
            Q7::Join(j) => j.finish(ctx, out),
        }
    }
}

nop_stream_sdk::export_operator!(Q7);
