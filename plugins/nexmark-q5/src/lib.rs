//! `nexmark-q5`: the second stage of Nexmark q5, hot items: every auction with the most
//! bids in each sliding window, from the per-auction counts of `window-count` (sliding
//! 10 s every 2 s). Nexmark's SQL joins the counts with their per-window maximum on
//! `num >= maxn`, so **every** tied auction is a row (`hot-items` keeps only the
//! smallest id, for the benchmark comparison with `ROW_NUMBER() ... rn <= 1`).
//!
//! Input: `window-count` results (window start, end, count as `i64`/`u64` LE, then the
//! 8-byte auction key), stamped `window_end - 1`, through a SINGLETON edge (parallelism
//! 1). Every record goes under one key into a tumbling window of `slide_ms` (the SDK
//! window operator with the accumulator cache): the tumbling window `[e - slide, e)`
//! holds exactly the results of the sliding window ending at `e`. Output per window and
//! tied auction: `window_start,window_end,auction,bids`, stamped `window_end - 1`.
//!
//! Config: `{ "slide_ms": 2000 }`.

use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, LATE_OUTPUT, ProcessWindowFunction, Window,
    WindowOperator, WindowOutput, WindowSpec, state_descriptors,
};
use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo, TimerGroup,
};
use serde::{Deserialize, Serialize};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["slide_ms"],"properties":{"slide_ms":{"type":"integer","minimum":1,"x-state-layout":true}}}"#;
/// Schema version of the accumulator ([`Tied`]).
pub const ACC_SCHEMA: u32 = 1;
/// The one key every record goes under.
pub const KEY: &[u8] = b"nexmark-q5";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    slide_ms: i64,
}

/// One auction's count in one sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Count {
    /// Window start.
    pub start: i64,
    /// Window end.
    pub end: i64,
    /// Bids.
    pub count: u64,
    /// Auction.
    pub auction: i64,
}

/// The auctions tied at the highest count so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tied {
    /// The highest count.
    pub count: u64,
    /// Every result with it.
    pub rows: Vec<Count>,
}

impl Tied {
    fn offer(&mut self, c: Count) {
        if c.count > self.count {
            self.count = c.count;
            self.rows.clear();
        }
        if c.count == self.count {
            self.rows.push(c);
        }
    }
}

fn decode(data: &[u8]) -> Result<Count> {
    if data.len() != 32 {
        return Err(PluginError::invalid_record(
            "nexmark-q5: expected a window-count result with an 8-byte auction key (32 bytes)",
        ));
    }
    let at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[i..i + 8]);
        b
    };
    Ok(Count {
        start: i64::from_le_bytes(at(0)),
        end: i64::from_le_bytes(at(8)),
        count: u64::from_le_bytes(at(16)),
        auction: i64::from_le_bytes(at(24)),
    })
}

/// The all-ties argmax.
#[derive(Debug, Default, Clone, Copy)]
pub struct TopAll;

impl AggregateFunction for TopAll {
    type In = Count;
    type Acc = Tied;
    type Out = Tied;

    fn decode(&self, record: RecordRef<'_>) -> Result<Count> {
        decode(record.data)
    }
    fn create_accumulator(&self) -> Tied {
        Tied::default()
    }
    fn add(&self, acc: &mut Tied, v: &Count) {
        acc.offer(*v);
    }
    fn merge(&self, acc: &mut Tied, other: Tied) {
        for c in other.rows {
            acc.offer(c);
        }
    }
    fn get_result(&self, acc: Tied) -> Tied {
        acc
    }
}

/// Writes every tied auction, ascending.
#[derive(Debug, Default, Clone, Copy)]
pub struct Render;

impl ProcessWindowFunction<Tied> for Render {
    fn process(
        &self,
        _key: &[u8],
        _w: Window,
        elements: &[Tied],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for t in elements {
            let mut rows = t.rows.clone();
            rows.sort_unstable();
            for c in rows {
                out.emit(format!("{},{},{},{}", c.start, c.end, c.auction, c.count).as_bytes());
            }
        }
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct Q5 {
    op: WindowOperator<Aggregating<TopAll, Render>>,
    rekeyed: Batch,
}

impl Operator for Q5 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q5", "0.1.0")
            .description(
                "Nexmark q5: every auction with the most bids per sliding window (all ties)",
            )
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"window","plugin":"nexmark-q5","functions":["argmax-all"]}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> {
        task.require_parallelism_1("nexmark-q5", "the hot items of every window")?;
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q5 config: {e}")))?;
        Ok(Q5 {
            op: WindowOperator::open(
                ctx,
                WindowSpec::tumbling(c.slide_ms),
                Aggregating::with_process(TopAll, Render),
            )?
            .cached(),
            rekeyed: Batch::new(),
        })
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        self.rekeyed.clear();
        for r in batch.iter() {
            self.rekeyed.push_record(Some(KEY), r.timestamp, r.data);
        }
        self.op.process(ctx, &self.rekeyed, out)
    }

    fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        self.op.on_timers(ctx, timers, out)
    }

    fn on_watermark(
        &mut self,
        ctx: &mut dyn Context,
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        self.op.on_watermark(ctx, watermark, out)
    }

    fn prepare_checkpoint(
        &mut self,
        ctx: &mut dyn Context,
        _epoch: u64,
        out: &mut Batch,
    ) -> Result<()> {
        self.op.flush(ctx, out)
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        self.op.flush(ctx, out)
    }
}

nop_stream_sdk::export_operator!(Q5);
