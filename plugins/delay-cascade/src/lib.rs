//! `delay-cascade`: a CEP alert over the NYC flights 2013 data — the same aircraft
//! (`tailnum`) has three consecutive departures, each delayed more than 60 minutes, within
//! 24 hours (design §9.2; the pattern runs on [`nop_stream_sdk::cep`]).
//!
//! # Input
//! Records of `flights-mapper` keyed by tailnum, with event time = scheduled departure
//! (set by the source, e.g. file-source `event_time = { column = "time_hour",
//! format = "datetime", add_minutes_column = "minute" }`):
//!
//! ```toml
//! config = { key = "tailnum", skip_null_key = true,
//!            fields = ["carrier", "flight", "origin", "dep_delay"] }
//! ```
//!
//! The record payload is a JSON object; `dep_delay` (integer minutes or `null`) must be
//! present, `carrier`, `flight`, `origin` are optional (`null` if absent); other fields
//! are ignored. The tailnum is the record key. Records with an empty key (tailnum `NA`)
//! are ignored (`skip_null_key` drops them upstream already). A record without
//! timestamp, unkeyed, not a JSON object, without `dep_delay` or with a non-integer delay
//! fails with `invalid-record`.
//!
//! # Pattern and semantics
//! `begin("first").where(dep_delay > 60).next("second").where(..).next("third").where(..)
//! .within(24 h)` with skip strategy `skip_past_last_event`:
//! - *Consecutive* is strict contiguity on the aircraft's departures in event-time order
//!   (equal times: arrival order): any departure in between that is not delayed more
//!   than 60 minutes breaks the chain.
//! - A cancelled flight (`dep_delay` null) is a departure that is not delayed > 60: it
//!   breaks the chain (it did not depart late; it did not depart at all).
//! - *Within 24 hours*: third departure time − first departure time < 86 400 000 ms
//!   (strictly; the CEP runtime prunes a partial match once event time reaches
//!   `first + 24 h`, as Flink does).
//! - `skip_past_last_event`: four delayed departures in a row give one alert (flights
//!   1–3), not two overlapping ones; flights 4–6 would give the next.
//! - Late records (behind the watermark on arrival) are dropped and counted
//!   (`cep_late_events`), or sent to side output `late` with config
//!   `{ "late": "side_output" }`.
//!
//! # Output
//! One JSON object per alert, keyed by tailnum, timestamped with the third departure:
//! `{"tailnum":..,"first_ts":ms,"last_ts":ms,"flights":[{"ts":ms,"carrier":..,"flight":..,
//! "origin":..,"dep_delay":..} x3]}` (fields in this order). Partial chains that ran out
//! of time (1 or 2 delayed departures and no further departure of that aircraft within
//! 24 h) go to side output `timed-out` in the same shape.
//!
//! State: the CEP runtime's `cep-queue`, `cep-nfa`, `cep-buffer` (see
//! [`nop_stream_sdk::cep`]); nothing lives in the instance.

use nop_stream_sdk::cep::{AfterMatchSkip, CepOperator, LateEvents, Match, MatchSoFar, Pattern};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo};
use serde::{Deserialize, Serialize};

/// Minimum delay, exclusive, in minutes: a departure counts if `dep_delay > 60`.
pub const MIN_DELAY_MIN: i64 = 60;
/// The `within` window: 24 hours in ms.
pub const WITHIN_MS: i64 = 24 * 60 * 60 * 1000;

/// JSON Schema of the config.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"late":{"enum":["drop","side_output"],"default":"drop","description":"records behind the watermark: drop and count, or send to side output late"}}}"#;

/// One departure, as decoded from a flights-mapper record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departure {
    /// Carrier code, if present.
    pub carrier: Option<String>,
    /// Flight number, if present.
    pub flight: Option<i64>,
    /// Origin airport, if present.
    pub origin: Option<String>,
    /// Departure delay in minutes; `None` for a cancelled flight.
    pub dep_delay: Option<i64>,
}

impl Departure {
    /// Whether the departure is delayed more than [`MIN_DELAY_MIN`] minutes (a cancelled
    /// flight is not).
    pub fn delayed(&self) -> bool {
        self.dep_delay.is_some_and(|d| d > MIN_DELAY_MIN)
    }
}

fn delayed(d: &Departure, _: &MatchSoFar<'_, Departure>) -> bool {
    d.delayed()
}

/// The pattern: three strictly consecutive delayed departures within 24 h,
/// `skip_past_last_event`.
pub fn pattern() -> Pattern<Departure> {
    Pattern::begin("first")
        .where_("dep_delay_gt_60", delayed)
        .next("second")
        .where_("dep_delay_gt_60", delayed)
        .next("third")
        .where_("dep_delay_gt_60", delayed)
        .within(WITHIN_MS)
        .after_match(AfterMatchSkip::SkipPastLastEvent)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    late: Option<String>,
}

/// Decodes a flights-mapper record; `None` for an empty key (tailnum `NA`).
///
/// # Errors
/// `invalid-record` for a payload that is not a JSON object, lacks `dep_delay`, or has
/// a field of the wrong type.
pub fn decode(rec: RecordRef<'_>) -> Result<Option<Departure>> {
    if rec.key.is_none_or(<[u8]>::is_empty) {
        return Ok(None);
    }
    let bad = |m: String| PluginError::invalid_record(format!("delay-cascade: {m}"));
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(rec.data).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let text = |f: &str| -> Result<Option<String>> {
        match v.get(f) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(o) => Err(bad(format!("field {f:?} = {o} is not a string"))),
        }
    };
    let int = |f: &str| -> Result<Option<i64>> {
        match v.get(f) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(n) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| bad(format!("field {f:?} = {n} is not an integer"))),
        }
    };
    if !v.contains_key("dep_delay") {
        return Err(bad(
            "record has no \"dep_delay\" field (list it in flights-mapper's fields)".into(),
        ));
    }
    Ok(Some(Departure {
        carrier: text("carrier")?,
        flight: int("flight")?,
        origin: text("origin")?,
        dep_delay: int("dep_delay")?,
    }))
}

#[derive(Serialize)]
struct AlertFlight<'a> {
    ts: i64,
    carrier: Option<&'a str>,
    flight: Option<i64>,
    origin: Option<&'a str>,
    dep_delay: Option<i64>,
}

#[derive(Serialize)]
struct Alert<'a> {
    tailnum: &'a str,
    first_ts: i64,
    last_ts: i64,
    flights: Vec<AlertFlight<'a>>,
}

/// Writes the alert JSON of `m` (see the [module docs](self)).
///
/// # Errors
/// Never in practice (serialization into memory).
pub fn encode(m: &Match<Departure>, buf: &mut Vec<u8>) -> Result<()> {
    let tailnum = String::from_utf8_lossy(&m.key);
    let alert = Alert {
        tailnum: &tailnum,
        first_ts: m.start_ts,
        last_ts: m.end_ts,
        flights: m
            .iter()
            .map(|(_, e)| AlertFlight {
                ts: e.timestamp,
                carrier: e.event.carrier.as_deref(),
                flight: e.event.flight,
                origin: e.event.origin.as_deref(),
                dep_delay: e.event.dep_delay,
            })
            .collect(),
    };
    serde_json::to_writer(buf, &alert)
        .map_err(|e| PluginError::internal(format!("delay-cascade: encoding an alert: {e}")))
}

/// The operator: a [`CepOperator`] over [`Departure`]s.
#[derive(Debug)]
pub struct DelayCascade {
    cep: CepOperator<Departure>,
}

impl Operator for DelayCascade {
    fn describe() -> PluginInfo {
        CepOperator::declare(
            PluginInfo::operator("delay-cascade", "0.1.0")
                .description(
                    "Alert when an aircraft has 3 consecutive departures delayed > 60 min within 24 h",
                )
                .config_schema(CONFIG_SCHEMA),
            &pattern(),
        )
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let cfg: Config = serde_json::from_str(if config.trim().is_empty() {
            "{}"
        } else {
            config
        })
        .map_err(|e| PluginError::invalid_config(format!("delay-cascade config: {e}")))?;
        let late = match cfg.late.as_deref() {
            None | Some("drop") => LateEvents::Drop,
            Some("side_output") => LateEvents::SideOutput,
            Some(o) => {
                return Err(PluginError::invalid_config(format!(
                    "delay-cascade config: late = {o:?}, expected \"drop\" or \"side_output\""
                )));
            }
        };
        Ok(DelayCascade {
            cep: CepOperator::open(ctx, pattern(), decode, encode)?.late_policy(late),
        })
    }

    nop_stream_sdk::cep_operator_hooks!(cep);
}

nop_stream_sdk::export_operator!(DelayCascade);

#[cfg(test)]
mod tests;
