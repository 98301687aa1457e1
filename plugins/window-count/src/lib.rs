//! `window-count`: the number of records per key and window, on the SDK window operator
//! ([`nop_stream_sdk::window`]) with a binary `u64` accumulator — the first stage of the
//! Nexmark q5-style `hot items` benchmark (`SELECT auction, COUNT(*) … GROUP BY auction,
//! HOP(…)`), without the JSON decoding of `window-aggregate`.
//!
//! Config: `{ "window": { "kind": "tumbling"|"sliding"|"session", "size_ms", "slide_ms",
//! "gap_ms", "offset_ms", "time", "allowed_lateness_ms" } }` (see
//! [`nop_stream_sdk::window::WindowConfig`]). Sessions merge only when their half-open
//! windows overlap, not when they touch (unlike Flink; see [`nop_stream_sdk::window`]).
//!
//! Input: any keyed records (HASH edge) with event-time timestamps; the payload is not
//! read. Output, per window firing, keyed by the key, timestamped with `window_end - 1`:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | window start, `i64` LE (ms) |
//! | 8..16 | window end, `i64` LE (ms, exclusive) |
//! | 16..24 | count, `u64` LE |
//! | 24.. | the record key |
//!
//! Late records go unchanged to side output `late`. State:
//! [`nop_stream_sdk::window::ACC_STATE`] (a postcard `u64` per key and window) and, for
//! sessions, [`nop_stream_sdk::window::MERGE_STATE`].

use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, LATE_OUTPUT, ProcessWindowFunction, Window,
    WindowConfig, WindowOperator, WindowOutput, state_descriptors,
};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo};
use serde::Deserialize;

/// Schema version of the `u64` accumulator.
pub const ACC_SCHEMA: u32 = 1;
/// Fixed bytes of an output record before the key.
pub const FIXED_BYTES: usize = 24;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["window"],"properties":{"window":{"type":"object","additionalProperties":false,"required":["kind"],"properties":{"kind":{"enum":["tumbling","sliding","session"]},"size_ms":{"type":"integer","minimum":1},"slide_ms":{"type":"integer","minimum":1},"gap_ms":{"type":"integer","minimum":1},"offset_ms":{"type":"integer"},"time":{"enum":["event","processing"],"default":"event"},"allowed_lateness_ms":{"type":"integer","minimum":0,"default":0}},"x-state-layout":["kind","size_ms","slide_ms","offset_ms","time"]}}}"#;

/// The static model reported by `describe()`.
pub const MODEL: &str =
    r#"{"operator":"window","plugin":"window-count","function":"aggregate","functions":["count"]}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    window: WindowConfig,
}

/// Counts records: the accumulator is a `u64`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count;

impl AggregateFunction for Count {
    type In = ();
    type Acc = u64;
    type Out = u64;

    #[inline]
    fn decode(&self, _record: RecordRef<'_>) -> Result<()> {
        Ok(())
    }
    fn create_accumulator(&self) -> u64 {
        0
    }
    #[inline]
    fn add(&self, acc: &mut u64, _value: &()) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn get_result(&self, acc: u64) -> u64 {
        acc
    }
}

/// Appends the output payload of one window result (layout in the [module docs](self)).
#[inline]
pub fn encode_result(window: Window, count: u64, key: &[u8], buf: &mut Vec<u8>) {
    buf.extend_from_slice(&window.start.to_le_bytes());
    buf.extend_from_slice(&window.end.to_le_bytes());
    buf.extend_from_slice(&count.to_le_bytes());
    buf.extend_from_slice(key);
}

/// A decoded output record of [`encode_result`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCount<'a> {
    /// The window.
    pub window: Window,
    /// Records of the key in the window.
    pub count: u64,
    /// The key.
    pub key: &'a [u8],
}

/// Decodes a payload written by [`encode_result`]; `None` if it is too short.
#[inline]
pub fn decode_result(rec: &[u8]) -> Option<WindowCount<'_>> {
    if rec.len() < FIXED_BYTES {
        return None;
    }
    let at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rec[i..i + 8]);
        b
    };
    Some(WindowCount {
        window: Window::new(i64::from_le_bytes(at(0)), i64::from_le_bytes(at(8))),
        count: u64::from_le_bytes(at(16)),
        key: &rec[FIXED_BYTES..],
    })
}

/// Emits the binary result of a firing.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmitBinary;

impl ProcessWindowFunction<u64> for EmitBinary {
    fn process(
        &self,
        key: &[u8],
        window: Window,
        elements: &[u64],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for &c in elements {
            out.emit_with(|buf| encode_result(window, c, key, buf));
        }
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct WindowCountOp {
    op: WindowOperator<Aggregating<Count, EmitBinary>>,
}

impl Operator for WindowCountOp {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("window-count", "0.1.0")
            .description("Keyed window count with a binary accumulator and binary output")
            .side_output(LATE_OUTPUT)
            .model(MODEL)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("window-count config: {e}")))?;
        let spec = c
            .window
            .to_spec(FunctionKind::Aggregate)
            .map_err(|e| PluginError::invalid_config(format!("window-count config: {e}")))?;
        Ok(Self {
            op: WindowOperator::open(ctx, spec, Aggregating::with_process(Count, EmitBinary))?
                .cached(),
        })
    }

    nop_stream_sdk::window_operator_hooks!(op);
}

nop_stream_sdk::export_operator!(WindowCountOp);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nop_stream_sdk::{Batch, MockContext};

    use super::*;

    const CFG: &str = r#"{"window":{"kind":"sliding","size_ms":10,"slide_ms":2}}"#;

    #[test]
    fn counts_sliding_windows_like_a_direct_count() {
        // (key, ts) in time order, a few keys.
        let recs: Vec<(u8, i64)> = (0..200).map(|i| ((i * 7 % 5) as u8, i / 3)).collect();
        let mut ctx = MockContext::for_operator::<WindowCountOp>();
        let mut op = WindowCountOp::open(&mut ctx, &TaskInfo::for_tests(), CFG).unwrap();
        let mut out = Batch::new();
        for chunk in recs.chunks(17) {
            let mut b = Batch::new();
            for (k, ts) in chunk {
                b.push_record(Some(&[*k]), Some(*ts), b"x");
            }
            op.process(&mut ctx, 0, &b, &mut out).unwrap();
            let wm = chunk.last().unwrap().1 - 1;
            let timers = ctx.fire_due_event_timers(wm);
            op.on_timers(&mut ctx, &timers, &mut out).unwrap();
            op.on_watermark(&mut ctx, wm, &mut out).unwrap();
        }
        let timers = ctx.fire_due_event_timers(i64::MAX);
        op.on_timers(&mut ctx, &timers, &mut out).unwrap();
        op.on_watermark(&mut ctx, i64::MAX, &mut out).unwrap();
        assert!(ctx.take_side_output(LATE_OUTPUT).is_empty());

        let mut want: BTreeMap<(i64, u8), u64> = BTreeMap::new();
        for (k, ts) in &recs {
            let last = ts - ts.rem_euclid(2);
            let mut s = last;
            while s > ts - 10 {
                *want.entry((s, *k)).or_default() += 1;
                s -= 2;
            }
        }
        let mut got: BTreeMap<(i64, u8), u64> = BTreeMap::new();
        for r in out.iter() {
            let w = decode_result(r.data).unwrap();
            assert_eq!(w.window.end - w.window.start, 10);
            assert_eq!(r.timestamp, Some(w.window.end - 1));
            assert_eq!(r.key, Some(w.key));
            assert!(got.insert((w.window.start, w.key[0]), w.count).is_none());
        }
        assert_eq!(got, want);
        assert!(decode_result(&[0; 23]).is_none());
        assert!(WindowCountOp::open(&mut ctx, &TaskInfo::for_tests(), "{}").is_err());
    }
}
