//! `nexmark-q8`: Nexmark q8, monitor new users, on the SDK's window join
//! ([`nop_stream_sdk::join::WindowJoin`]): persons who opened an auction in the window
//! they registered in.
//!
//! ```sql
//! SELECT P.id, P.name, P.starttime
//! FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
//!       FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!       GROUP BY id, name, window_start, window_end) P
//! JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
//!       FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!       GROUP BY seller, window_start, window_end) A
//! ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime;
//! ```
//!
//! Inputs (HASH edges): 0, left: persons, payload `id,name`, keyed by `id`; 1, right:
//! auctions, any payload, keyed by `seller`. When a window fires, a key with rows on both
//! sides emits one line `id,name,window_start` per distinct person row (the `GROUP BY`s
//! make both sides distinct, so a person with three auctions in the window is one line).
//!
//! Config: `{ "window": { "kind": "tumbling"|"sliding"|"session", "size_ms", "slide_ms",
//! "gap_ms" } }`, default tumbling 10 s (q8's). Sessions form over both inputs' rows and
//! merge only when they overlap ([`nop_stream_sdk::join`]).

use nop_stream_sdk::join::{
    JoinOutput, JoinType, LATE_OUTPUT, Row, WindowJoin, WindowJoinFunction, WindowJoinSpec,
};
use nop_stream_sdk::window::{FunctionKind, TimeMode, Window, WindowConfig};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"window":{"type":"object","additionalProperties":false,"required":["kind"],"properties":{"kind":{"enum":["tumbling","sliding","session"]},"size_ms":{"type":"integer","minimum":1},"slide_ms":{"type":"integer","minimum":1},"gap_ms":{"type":"integer","minimum":1},"offset_ms":{"type":"integer"}},"x-state-layout":["kind","size_ms","slide_ms","offset_ms"]}}}"#;
/// q8's window (ms).
pub const WINDOW_MS: i64 = 10_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    window: Option<WindowConfig>,
}

/// The join function: one line per distinct person of a window with auctions.
#[derive(Debug, Default)]
pub struct NewUsers;

impl WindowJoinFunction for NewUsers {
    fn join_window(
        &mut self,
        _key: &[u8],
        window: Window,
        persons: &[Row<'_>],
        auctions: &[Row<'_>],
        _join_type: JoinType,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        if auctions.is_empty() {
            return Ok(());
        }
        // Distinct payloads (a key's persons in one window are few).
        let mut seen: Vec<&[u8]> = Vec::new();
        for p in persons {
            if seen.contains(&p.data) {
                continue;
            }
            seen.push(p.data);
            out.emit_with(|buf| {
                buf.extend_from_slice(p.data);
                buf.extend_from_slice(format!(",{}", window.start).as_bytes());
            });
        }
        Ok(())
    }

    fn join(
        &mut self,
        _k: &[u8],
        _w: Window,
        _l: Row<'_>,
        _r: Row<'_>,
        _o: &mut JoinOutput<'_>,
    ) -> Result<()> {
        Ok(())
    }
}

/// The operator.
#[derive(Debug)]
pub struct Q8 {
    join: WindowJoin<NewUsers>,
}

impl Operator for Q8 {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("nexmark-q8", "0.1.0")
            .description("Nexmark q8: persons who opened an auction in the window they registered in (window join)")
            .side_output(LATE_OUTPUT)
            .model(r#"{"operator":"window-join","plugin":"nexmark-q8"}"#)
            .config_schema(CONFIG_SCHEMA);
        for d in WindowJoinSpec::state_descriptors() {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("nexmark-q8 config: {e}")))?;
        let spec = match c.window {
            None => WindowJoinSpec::tumbling(WINDOW_MS),
            Some(w) => {
                if w.allowed_lateness_ms != 0 || w.time != TimeMode::Event {
                    return Err(PluginError::invalid_config(
                        "nexmark-q8 config: a window join runs on event time without allowed lateness",
                    ));
                }
                let s = w
                    .to_spec(FunctionKind::Process)
                    .map_err(|e| PluginError::invalid_config(format!("nexmark-q8 config: {e}")))?;
                WindowJoinSpec {
                    assigner: s.assigner,
                    join_type: JoinType::Inner,
                }
            }
        };
        Ok(Q8 {
            join: WindowJoin::open(ctx, spec, NewUsers)?,
        })
    }

    nop_stream_sdk::join_operator_hooks!(join);
}

nop_stream_sdk::export_operator!(Q8);
