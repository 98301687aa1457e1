//! `hot-items`: the second stage of the Nexmark q5-style benchmark — the top auction of
//! every sliding window, from the per-auction window counts of `window-count`
//! (Flink: `ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY num DESC)
//! … WHERE rn <= 1`).
//!
//! Config: `{ "slide_ms": 2000 }` — the slide of the upstream sliding windows.
//!
//! # Input
//! `window-count` results (see its docs: window start, end, count as LE integers, then
//! the key), whose key is an auction id (8 bytes, `i64` LE, as `bids-parser` keys bids),
//! timestamped with `window_end - 1`. The edge should be `singleton` (the plugin then
//! runs at parallelism 1 and sees every auction's result).
//!
//! # Semantics
//! Every record is re-keyed to one constant key and put into a tumbling event-time window
//! of `slide_ms` (the SDK window operator, [`nop_stream_sdk::window`]). A result of the
//! sliding window `[s, e)` is stamped `e - 1`, so with window ends on multiples of the
//! slide, the tumbling window `[e - slide, e)` holds exactly the results of `[s, e)`.
//! The accumulator keeps the best candidate: the largest count; among equal counts the
//! **smallest auction id** (Flink leaves ties unspecified); then the earliest window.
//! The tumbling window fires when the watermark passes `e - 1` — the upstream results
//! were emitted before that watermark was forwarded, so none is late.
//!
//! # Output
//! One record per window, text `window_start,window_end,auction,bids` (ms, ms, id,
//! count; see [`format_top`]), keyed by [`KEY`], timestamped `window_end - 1`.

use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, LATE_OUTPUT, ProcessWindowFunction, Window,
    WindowOperator, WindowOutput, WindowSpec, state_descriptors,
};
use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo, TimerGroup,
};
use serde::{Deserialize, Serialize};

/// Schema version of the accumulator ([`Candidate`], postcard).
pub const ACC_SCHEMA: u32 = 1;
/// The constant key every record is re-keyed to.
pub const KEY: &[u8] = b"hot-items";

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["slide_ms"],"properties":{"slide_ms":{"type":"integer","minimum":1,"description":"slide of the upstream sliding windows (ms)","x-state-layout":true}}}"#;

/// The static model reported by `describe()`.
pub const MODEL: &str =
    r#"{"operator":"window","plugin":"hot-items","function":"aggregate","functions":["argmax"]}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    slide_ms: i64,
}

/// One auction's count in one sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// Bids of the auction in the window.
    pub count: u64,
    /// Auction id.
    pub auction: i64,
    /// Sliding window start (ms).
    pub start: i64,
    /// Sliding window end (ms, exclusive).
    pub end: i64,
}

impl Candidate {
    /// Whether `self` ranks before `other`: larger count, then smaller auction id, then
    /// earlier window.
    #[inline]
    pub fn beats(&self, other: &Candidate) -> bool {
        use std::cmp::Reverse;
        (self.count, Reverse(self.auction), Reverse(self.start))
            > (other.count, Reverse(other.auction), Reverse(other.start))
    }
}

/// Keeps the better of `acc` and `c` in `acc`.
#[inline]
pub fn offer(acc: &mut Option<Candidate>, c: Candidate) {
    match acc {
        Some(best) if !c.beats(best) => {}
        _ => *acc = Some(c),
    }
}

/// Decodes one `window-count` result record into a candidate.
///
/// # Errors
/// `invalid-record` for a short payload or a key that is not 8 bytes.
pub fn decode_candidate(data: &[u8]) -> Result<Candidate> {
    let bad = |m: &str| PluginError::invalid_record(format!("hot-items: {m}"));
    if data.len() != 32 {
        return Err(bad(
            "expected a window-count result with an 8-byte auction key (32 bytes)",
        ));
    }
    let at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&data[i..i + 8]);
        b
    };
    Ok(Candidate {
        start: i64::from_le_bytes(at(0)),
        end: i64::from_le_bytes(at(8)),
        count: u64::from_le_bytes(at(16)),
        auction: i64::from_le_bytes(at(24)),
    })
}

/// Appends the output text of a window's top auction:
/// `window_start,window_end,auction,bids`.
pub fn format_top(c: &Candidate, buf: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(buf, "{},{},{},{}", c.start, c.end, c.auction, c.count);
}

/// The argmax aggregate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Top;

impl AggregateFunction for Top {
    type In = Candidate;
    type Acc = Option<Candidate>;
    type Out = Option<Candidate>;

    #[inline]
    fn decode(&self, record: RecordRef<'_>) -> Result<Candidate> {
        decode_candidate(record.data)
    }
    fn create_accumulator(&self) -> Option<Candidate> {
        None
    }
    #[inline]
    fn add(&self, acc: &mut Option<Candidate>, value: &Candidate) {
        offer(acc, *value);
    }
    fn merge(&self, acc: &mut Option<Candidate>, other: Option<Candidate>) {
        if let Some(c) = other {
            offer(acc, c);
        }
    }
    fn get_result(&self, acc: Option<Candidate>) -> Option<Candidate> {
        acc
    }
}

/// Writes the winner of a firing as text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Render;

impl ProcessWindowFunction<Option<Candidate>> for Render {
    fn process(
        &self,
        _key: &[u8],
        _window: Window,
        elements: &[Option<Candidate>],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for c in elements.iter().flatten() {
            out.emit_with(|buf| format_top(c, buf));
        }
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct HotItems {
    op: WindowOperator<Aggregating<Top, Render>>,
    rekeyed: Batch,
}

impl Operator for HotItems {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("hot-items", "0.1.0")
            .description("Top auction (largest count, ties: smallest id) per sliding window of window-count results")
            .side_output(LATE_OUTPUT)
            .model(MODEL)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> {
        task.require_parallelism_1("hot-items", "the hottest item of every window")?;
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("hot-items config: {e}")))?;
        if c.slide_ms < 1 {
            return Err(PluginError::invalid_config(
                "hot-items config: slide_ms must be >= 1",
            ));
        }
        Ok(Self {
            op: WindowOperator::open(
                ctx,
                WindowSpec::tumbling(c.slide_ms),
                Aggregating::with_process(Top, Render),
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
        for rec in batch.iter() {
            self.rekeyed.push_record(Some(KEY), rec.timestamp, rec.data);
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

nop_stream_sdk::export_operator!(HotItems);

#[cfg(test)]
mod tests;
