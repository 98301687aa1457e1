//! `nexmark-q11`: Nexmark q11, user sessions: the bids of every bidder session, on the
//! SDK's session windows ([`nop_stream_sdk::window`]).
//!
//! ```sql
//! SELECT B.bidder, count(*) AS bid_count,
//!        SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime,
//!        SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime
//! FROM bid B GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND);
//! ```
//!
//! Input: bids keyed by `bidder` (8 bytes, `i64` LE; HASH edge), any payload. Output per
//! session: `bidder,bids,start,end` (`end` = last bid + gap), keyed by the bidder.
//! Sessions merge only when they overlap: two bids of a bidder exactly 10 s apart are
//! two sessions, where Flink's would be one ([`nop_stream_sdk::window`], "Sessions merge
//! only when they overlap").
//!
//! Config: `{ "gap_ms": 10000 }` (default q11's 10 s).

use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, LATE_OUTPUT, ProcessWindowFunction, Window,
    WindowOperator, WindowOutput, WindowSpec, state_descriptors,
};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"gap_ms":{"type":"integer","minimum":1,"default":10000}}}"#;
/// Schema version of the `u64` accumulator.
pub const ACC_SCHEMA: u32 = 1;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_gap")]
    gap_ms: i64,
}

fn default_gap() -> i64 {
    10_000
}

/// Counts bids.
#[derive(Debug, Default, Clone, Copy)]
pub struct Count;

impl AggregateFunction for Count {
    type In = ();
    type Acc = u64;
    type Out = u64;

    fn decode(&self, _record: RecordRef<'_>) -> Result<()> {
        Ok(())
    }
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _v: &()) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
    fn get_result(&self, acc: u64) -> u64 {
        acc
    }
}

/// Writes `bidder,bids,start,end`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Render;

impl ProcessWindowFunction<u64> for Render {
    fn process(
        &self,
        key: &[u8],
        w: Window,
        elements: &[u64],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        let bidder = i64::from_le_bytes(
            key.try_into()
                .map_err(|_| PluginError::invalid_record("a q11 key is an 8-byte bidder id"))?,
        );
        for n in elements {
            out.emit(format!("{bidder},{n},{},{}", w.start, w.end).as_bytes());
        }
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct Q11 {
    op: WindowOperator<Aggregating<Count, Render>>,
}

impl Operator for Q11 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q11", "0.1.0")
            .description("Nexmark q11: bids per bidder session (session windows)")
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"window","plugin":"nexmark-q11"}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q11 config: {e}")))?;
        Ok(Q11 {
            op: WindowOperator::open(
                ctx,
                WindowSpec::session(c.gap_ms),
                Aggregating::with_process(Count, Render),
            )?,
        })
    }

    nop_stream_sdk::window_operator_hooks!(op);
}

nop_stream_sdk::export_operator!(Q11);
