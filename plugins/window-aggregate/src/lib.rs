//! `window-aggregate`: keyed window aggregates (count / sum / avg / min / max) over JSON
//! object records, on the SDK's one window operator ([`nop_stream_sdk::window`], seed
//! §9.1).
//!
//! Config:
//! `{ "window": { "kind": "tumbling"|"sliding"|"session", "size_ms", "slide_ms", "gap_ms",
//! "offset_ms", "time": "event"|"processing", "allowed_lateness_ms" },
//! "aggregates": [ { "name": "flights", "fn": "count" },
//! { "name": "avg_delay", "fn": "avg", "field": "dep_delay" } ] }` — see
//! [`nop_stream_sdk::window::WindowConfig`] for the window fields (ms; `time` defaults to
//! `event`, lateness and offset to 0). Session windows are half-open and merge only when
//! they overlap: records of a key less than `gap_ms` apart share a session, records exactly
//! `gap_ms` apart do not — unlike Flink, which merges touching sessions (see
//! [`nop_stream_sdk::window`], "Sessions merge only when they overlap"). Functions:
//!
//! | fn | result | null / missing field |
//! |---|---|---|
//! | `count` | records (with `field`: records whose field is present and not null) | counted / skipped |
//! | `sum` | exact sum (integer if all values are integers); null if no value | skipped |
//! | `avg` | exact sum rounded to `f64` / count; null if no value | skipped |
//! | `min`, `max` | extreme value; null if no value | skipped |
//!
//! A string, boolean, array or object in a `sum`/`avg`/`min`/`max` field is an
//! `invalid-record` error naming the field. Sums are exact (`i128` for integers, exact
//! partial sums for floats, as in `keyed-aggregate`), so results do not depend on
//! batching, arrival order or merging.
//!
//! Input: records keyed by the upstream operator (HASH edge) with event-time timestamps in
//! event time. Output, per window firing: `{"key":"<record key as UTF-8>","window_start":
//! <ms>,"window_end":<ms>,"<name>":<value>,...}` (aggregates in config order), keyed by the
//! key, timestamped with `window_end - 1`. Late records go unchanged to side output `late`.
//!
//! State: [`nop_stream_sdk::window::ACC_STATE`] (accumulator per key and window,
//! [`ACC_SCHEMA`]) and [`nop_stream_sdk::window::MERGE_STATE`] (session merge sets).
//!
//! `describe()` is static, so its model only names the operator kind
//! ([`MODEL`]); the window itself (kind, sizes, time, lateness) is part of the config,
//! which the plan fingerprint already covers.

use std::fmt;

use nop_stream_sdk::window::{
    AggregateFunction, Aggregating, FunctionKind, LATE_OUTPUT, ProcessWindowFunction, Window,
    WindowConfig, WindowOperator, WindowOutput, state_descriptors,
};
use nop_stream_sdk::{Context, Operator, PluginError, PluginInfo, RecordRef, Result, TaskInfo};
use serde::de::DeserializeSeed;
use serde::{Deserialize, Serialize};

use nop_stream_sdk::num::{FieldsSeed, Num, exact_add, exact_total, i128_parts, write_f64};

/// Schema version of [`Slot`] vectors in the accumulator state.
pub const ACC_SCHEMA: u32 = 1;

/// The static model reported by `describe()`.
pub const MODEL: &str = r#"{"operator":"window","plugin":"window-aggregate","function":"aggregate","functions":["count","sum","avg","min","max"]}"#;

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["window","aggregates"],"properties":{"window":{"type":"object","additionalProperties":false,"required":["kind"],"properties":{"kind":{"enum":["tumbling","sliding","session"]},"size_ms":{"type":"integer","minimum":1},"slide_ms":{"type":"integer","minimum":1},"gap_ms":{"type":"integer","minimum":1},"offset_ms":{"type":"integer"},"time":{"enum":["event","processing"],"default":"event"},"allowed_lateness_ms":{"type":"integer","minimum":0,"default":0}},"x-state-layout":["kind","size_ms","slide_ms","offset_ms","time"]},"aggregates":{"type":"array","items":{"type":"object","additionalProperties":false,"required":["name","fn"],"properties":{"name":{"type":"string"},"fn":{"enum":["count","sum","avg","min","max"]},"field":{"type":"string"}}},"x-state-layout":true}}}"#;

/// An aggregate function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fn {
    /// Records (or records with a non-null field).
    Count,
    /// Sum of the field's numbers.
    Sum,
    /// Mean of the field's numbers.
    Avg,
    /// Smallest number.
    Min,
    /// Largest number.
    Max,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregate {
    name: String,
    #[serde(rename = "fn")]
    func: Fn,
    field: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    window: WindowConfig,
    aggregates: Vec<RawAggregate>,
}

/// One configured aggregate.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregate {
    /// Output field name.
    pub name: String,
    /// Function.
    pub func: Fn,
    /// Index of the input field in [`Aggregates::fields`], if any.
    pub field: Option<usize>,
}

/// A field value of one record, as far as aggregation cares.
pub use nop_stream_sdk::num::JsonScalar as Val;

/// Running value of one aggregate in one window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Slot {
    /// `count`.
    Count(u64),
    /// `sum` / `avg`: `n` values, integers summed exactly in `ints`, floats as exact
    /// partial sums.
    Sum {
        /// Values added.
        n: u64,
        /// Exact sum of the integer values.
        ints: i128,
        /// Non-overlapping partial sums of the float values.
        partials: Vec<f64>,
    },
    /// `min` / `max`.
    Extreme(Option<Num>),
}

/// The configured aggregates: an [`AggregateFunction`] over JSON records whose
/// accumulator is one [`Slot`] per aggregate.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregates {
    /// Input fields read from each record.
    pub fields: Vec<String>,
    /// Whether `fields[i]` must be a number (or null / missing).
    pub numeric: Vec<bool>,
    /// Aggregates in output order.
    pub aggregates: Vec<Aggregate>,
}

/// Parses the config JSON into the window config and the aggregates.
///
/// # Errors
/// Malformed JSON or a bad field, named in the message (`window.size_ms`,
/// `aggregates[1].field`, …).
pub fn parse_config(json: &str) -> Result<(WindowConfig, Aggregates), String> {
    let raw: RawConfig =
        serde_json::from_str(json).map_err(|e| format!("window-aggregate config: {e}"))?;
    let mut fields: Vec<String> = Vec::new();
    let mut numeric: Vec<bool> = Vec::new();
    let mut aggregates: Vec<Aggregate> = Vec::new();
    for (i, a) in raw.aggregates.into_iter().enumerate() {
        let err = |msg: &str| {
            format!(
                "window-aggregate config: aggregates[{i}] ({:?}): {msg}",
                a.name
            )
        };
        if ["key", "window_start", "window_end"].contains(&a.name.as_str())
            || aggregates.iter().any(|b| b.name == a.name)
        {
            return Err(err(
                "name is used twice or reserved (key, window_start, window_end)",
            ));
        }
        let field = match (&a.field, a.func) {
            (None, Fn::Count) => None,
            (None, _) => return Err(err("\"field\" is required")),
            (Some(f), func) => {
                let j = fields.iter().position(|x| x == f).unwrap_or_else(|| {
                    fields.push(f.clone());
                    numeric.push(false);
                    fields.len() - 1
                });
                numeric[j] |= func != Fn::Count;
                Some(j)
            }
        };
        aggregates.push(Aggregate {
            name: a.name,
            func: a.func,
            field,
        });
    }
    if aggregates.is_empty() {
        return Err("window-aggregate config: aggregates must not be empty".into());
    }
    Ok((
        raw.window,
        Aggregates {
            fields,
            numeric,
            aggregates,
        },
    ))
}

impl AggregateFunction for Aggregates {
    type In = Vec<Val>;
    type Acc = Vec<Slot>;
    type Out = Vec<Slot>;

    fn decode(&self, record: RecordRef<'_>) -> Result<Vec<Val>> {
        let mut vals = vec![Val::Missing; self.fields.len()];
        let mut de = serde_json::Deserializer::from_slice(record.data);
        FieldsSeed {
            fields: &self.fields,
            vals: &mut vals,
        }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| PluginError::invalid_record(format!("not a JSON object: {e}")))?;
        for (i, v) in vals.iter().enumerate() {
            if self.numeric[i] && v.is_non_numeric() {
                return Err(PluginError::invalid_record(format!(
                    "field {:?} must be a number or null",
                    self.fields[i]
                )));
            }
        }
        Ok(vals)
    }

    fn create_accumulator(&self) -> Vec<Slot> {
        self.aggregates
            .iter()
            .map(|a| match a.func {
                Fn::Count => Slot::Count(0),
                Fn::Sum | Fn::Avg => Slot::Sum {
                    n: 0,
                    ints: 0,
                    partials: Vec::new(),
                },
                Fn::Min | Fn::Max => Slot::Extreme(None),
            })
            .collect()
    }

    fn add(&self, acc: &mut Vec<Slot>, vals: &Vec<Val>) {
        for (slot, agg) in acc.iter_mut().zip(&self.aggregates) {
            let v = agg.field.map_or(Val::Missing, |f| vals[f]);
            match slot {
                Slot::Count(c) => *c += u64::from(agg.field.is_none() || !v.is_null()),
                Slot::Sum { n, ints, partials } => {
                    if let Val::Num(x) = v {
                        *n += 1;
                        match x {
                            Num::Int(i) => *ints += i128::from(i),
                            Num::Float(f) => exact_add(partials, f),
                        }
                    }
                }
                Slot::Extreme(cur) => {
                    if let Val::Num(x) = v {
                        *cur = Some(extreme(agg.func, *cur, x));
                    }
                }
            }
        }
    }

    fn merge(&self, acc: &mut Vec<Slot>, other: Vec<Slot>) {
        for ((slot, o), agg) in acc.iter_mut().zip(other).zip(&self.aggregates) {
            match (slot, o) {
                (Slot::Count(a), Slot::Count(b)) => *a += b,
                (
                    Slot::Sum { n, ints, partials },
                    Slot::Sum {
                        n: n2,
                        ints: i2,
                        partials: p2,
                    },
                ) => {
                    *n += n2;
                    *ints += i2;
                    for f in p2 {
                        exact_add(partials, f);
                    }
                }
                (Slot::Extreme(cur), Slot::Extreme(Some(x))) => {
                    *cur = Some(extreme(agg.func, *cur, x));
                }
                _ => {}
            }
        }
    }

    fn get_result(&self, acc: Vec<Slot>) -> Vec<Slot> {
        acc
    }
}

/// The extreme of `cur` and `x`; the integer form wins ties.
fn extreme(func: Fn, cur: Option<Num>, x: Num) -> Num {
    let want = if func == Fn::Min {
        std::cmp::Ordering::Less
    } else {
        std::cmp::Ordering::Greater
    };
    match cur {
        None => x,
        Some(c) => match x.compare(c) {
            o if o == want => x,
            std::cmp::Ordering::Equal if matches!(x, Num::Int(_)) => x,
            _ => c,
        },
    }
}

/// Renders the output object of one firing.
#[derive(Clone, Debug)]
pub struct Render {
    names: Vec<(String, Fn)>,
}

impl ProcessWindowFunction<Vec<Slot>> for Render {
    fn process(
        &self,
        key: &[u8],
        window: Window,
        elements: &[Vec<Slot>],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for slots in elements {
            out.emit_with(|buf| {
                buf.extend_from_slice(b"{\"key\":");
                let _ = serde_json::to_writer(&mut *buf, &String::from_utf8_lossy(key));
                buf.extend_from_slice(
                    format!(
                        ",\"window_start\":{},\"window_end\":{}",
                        window.start, window.end
                    )
                    .as_bytes(),
                );
                for (slot, (name, func)) in slots.iter().zip(&self.names) {
                    buf.push(b',');
                    let _ = serde_json::to_writer(&mut *buf, name);
                    buf.push(b':');
                    render_slot(slot, *func, buf);
                }
                buf.push(b'}');
            });
        }
        Ok(())
    }
}

fn render_slot(slot: &Slot, func: Fn, out: &mut Vec<u8>) {
    match slot {
        Slot::Count(c) => out.extend_from_slice(c.to_string().as_bytes()),
        Slot::Sum { n: 0, .. } | Slot::Extreme(None) => out.extend_from_slice(b"null"),
        Slot::Sum { ints, partials, .. } if func == Fn::Sum && partials.is_empty() => {
            out.extend_from_slice(ints.to_string().as_bytes());
        }
        Slot::Sum { n, ints, partials } => {
            let mut p = partials.clone();
            let (hi, lo) = i128_parts(*ints);
            exact_add(&mut p, hi);
            exact_add(&mut p, lo);
            let total = exact_total(&p);
            #[allow(clippy::cast_precision_loss)]
            let v = if func == Fn::Avg {
                total / *n as f64
            } else {
                total
            };
            write_f64(v, out);
        }
        Slot::Extreme(Some(v)) => v.write_json(out),
    }
}

/// The operator.
pub struct WindowAggregate {
    op: WindowOperator<Aggregating<Aggregates, Render>>,
}

impl fmt::Debug for WindowAggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowAggregate")
            .field("spec", self.op.spec())
            .finish()
    }
}

impl WindowAggregate {
    /// The operator's window spec model (the config's window, for logs and tests).
    pub fn model_json(&self) -> String {
        self.op.spec().to_model_json()
    }
}

impl Operator for WindowAggregate {
    fn describe() -> PluginInfo {
        let mut info = PluginInfo::operator("window-aggregate", "0.1.0")
            .description(
                "Keyed tumbling/sliding/session window count/sum/avg/min/max over JSON records",
            )
            .side_output(LATE_OUTPUT)
            .model(MODEL)
            .config_schema(CONFIG_SCHEMA);
        for d in state_descriptors(FunctionKind::Aggregate, ACC_SCHEMA) {
            info = info.state(d);
        }
        info
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let (window, aggs) = parse_config(config).map_err(PluginError::invalid_config)?;
        let spec = window
            .to_spec(FunctionKind::Aggregate)
            .map_err(|e| PluginError::invalid_config(format!("window-aggregate config: {e}")))?;
        let render = Render {
            names: aggs
                .aggregates
                .iter()
                .map(|a| (a.name.clone(), a.func))
                .collect(),
        };
        Ok(Self {
            op: WindowOperator::open(ctx, spec, Aggregating::with_process(aggs, render))?.cached(),
        })
    }

    nop_stream_sdk::window_operator_hooks!(op);
}

nop_stream_sdk::export_operator!(WindowAggregate);

#[cfg(test)]
mod tests;
