//! Configuration, accumulators and the per-batch grouping of `keyed-aggregate`.
//!
//! Processing a batch is two pure phases around the state access the plugin does:
//! [`Aggregator::group`] parses the records and groups them by key (one scratch entry per
//! distinct key), the plugin fetches the accumulators of those keys with one
//! `get_many`, [`Aggregator::apply`] folds the records in, and the plugin stores them with
//! one `put_many`. Nothing survives a batch in guest memory.
//!
//! # Keys
//!
//! The key of a record is derived from its `key_field`: a string's UTF-8 bytes, a number
//! as printed in JSON, `true`/`false`, and the empty key for null or a missing field (so
//! null and `""` share a group). When the record carries a key (it arrived over a HASH
//! edge) it must equal the derived key, otherwise the record is invalid: state is stored
//! under the key the host routed on. The output repeats the key field's JSON value as first
//! seen.
//!
//! # Aggregate functions
//!
//! | fn | counts / computes | null, missing |
//! |---|---|---|
//! | `count` | records | counted |
//! | `count_null` | records whose field is null or missing | — |
//! | `count_not_null` | records whose field is present and not null | — |
//! | `count_gt`, `count_lt` | records whose number is `>` / `<` `value` | ignored |
//! | `sum` | sum; null when no value | ignored |
//! | `min`, `max` | extreme value; null when no value | ignored |
//! | `avg` | `sum / count` as `f64`; null when no value | ignored |
//!
//! A string, boolean, array or object in a numeric function's field is an invalid record.
//!
//! **Exactness.** Integers are summed exactly (`i128`); other numbers are summed exactly
//! too, as non-overlapping partial sums (Shewchuk), and rounded once when emitted. `sum`
//! of integers is an integer; `avg` is the exact sum rounded to `f64` divided by the count.
//! So results are deterministic and independent of batching, arrival order and
//! parallelism. `min`/`max` prefer the integer form when an integer and a float are equal.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use nop_stream_sdk::num::{
    FieldName, Num, ScalarSeed, exact_add, exact_total, i128_parts, write_f64,
};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["key_field","aggregates"],"properties":{"key_field":{"type":"string","x-state-layout":true},"aggregates":{"type":"array","items":{"type":"object","additionalProperties":false,"required":["name","fn"],"properties":{"name":{"type":"string"},"fn":{"enum":["count","count_null","count_not_null","count_gt","count_lt","sum","min","max","avg"]},"field":{"type":"string"},"value":{"type":"number"}}},"x-state-layout":true}}}"#;

/// An aggregate function.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fn {
    /// Number of records.
    Count,
    /// Records whose field is null or missing.
    CountNull,
    /// Records whose field is present and not null.
    CountNotNull,
    /// Records whose field is a number greater than `value`.
    CountGt,
    /// Records whose field is a number less than `value`.
    CountLt,
    /// Sum of the field's numbers.
    Sum,
    /// Smallest number.
    Min,
    /// Largest number.
    Max,
    /// Mean of the field's numbers.
    Avg,
}

impl Fn {
    fn numeric(self) -> bool {
        matches!(
            self,
            Self::CountGt | Self::CountLt | Self::Sum | Self::Min | Self::Max | Self::Avg
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAggregate {
    name: String,
    #[serde(rename = "fn")]
    func: Fn,
    field: Option<String>,
    value: Option<serde_json::Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    key_field: String,
    aggregates: Vec<RawAggregate>,
}

/// One configured aggregate.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregate {
    /// Output field name.
    pub name: String,
    /// Function.
    pub func: Fn,
    /// Index of the input field in [`Aggregator::fields`] (0 for `count`, unused).
    pub field: usize,
    /// Threshold of `count_gt` / `count_lt`.
    pub value: Option<Num>,
}

fn to_num(n: &serde_json::Number) -> Option<Num> {
    if let Some(i) = n.as_i64() {
        Some(Num::Int(i))
    } else {
        n.as_f64().filter(|f| f.is_finite()).map(Num::Float)
    }
}

/// A field value of one record, as far as aggregation cares.
pub use nop_stream_sdk::num::JsonScalar as Val;

/// Running value of one aggregate for one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Slot {
    /// `count*`.
    Count(u64),
    /// `sum` / `avg`: `n` values, `ints` their integer part summed exactly, `partials` the
    /// exact partial sums of the non-integer values.
    Sum {
        /// Values added.
        n: u64,
        /// Exact sum of the integer values.
        ints: i128,
        /// Non-overlapping partial sums of the float values (empty if none).
        partials: Vec<f64>,
    },
    /// `min` / `max`.
    Extreme(Option<Num>),
}

/// The accumulator of one key: the state value (`acc`, schema 1, postcard).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Acc {
    /// JSON text of the key field's value, as first seen.
    pub key_json: String,
    /// One slot per configured aggregate, in config order.
    pub slots: Vec<Slot>,
}

/// Per-batch scratch space: records grouped by key. Cleared by every
/// [`Aggregator::group`]; holds nothing across batches.
#[derive(Debug, Default)]
pub struct Scratch {
    index: HashMap<Vec<u8>, usize>,
    /// Distinct keys of the batch, in first-seen order.
    pub keys: Vec<Vec<u8>>,
    key_json: Vec<String>,
    /// Group of each record.
    rec_group: Vec<usize>,
    /// `fields.len()` values per record.
    rec_vals: Vec<Val>,
    key_bytes: Vec<u8>,
    key_text: String,
}

/// A configured keyed aggregate.
#[derive(Clone, Debug, PartialEq)]
pub struct Aggregator {
    /// Name of the key field (`fields[0]`).
    pub key_field: String,
    /// Input fields read from each record; `fields[0]` is the key field.
    pub fields: Vec<String>,
    /// Aggregates in output order.
    pub aggregates: Vec<Aggregate>,
    /// Whether `fields[i]` must be a number (or null / missing).
    numeric: Vec<bool>,
}

impl Aggregator {
    /// Parses the config JSON.
    ///
    /// # Errors
    /// Malformed JSON; an unknown function; a missing `field` (all but `count`) or `value`
    /// (`count_gt`, `count_lt`); an output name used twice or equal to `key_field`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let raw: RawConfig =
            serde_json::from_str(json).map_err(|e| format!("keyed-aggregate config: {e}"))?;
        let mut fields = vec![raw.key_field.clone()];
        let mut numeric = vec![false];
        let mut aggregates: Vec<Aggregate> = Vec::with_capacity(raw.aggregates.len());
        for a in raw.aggregates {
            let ctx = |msg: &str| format!("keyed-aggregate config, aggregate {:?}: {msg}", a.name);
            if a.name == raw.key_field || aggregates.iter().any(|b| b.name == a.name) {
                return Err(ctx("output name used twice (or equal to key_field)"));
            }
            let field = match (&a.field, a.func) {
                (None, Fn::Count) => 0,
                (None, _) => return Err(ctx("\"field\" is required")),
                (Some(f), func) => {
                    let i = fields.iter().position(|x| x == f).unwrap_or_else(|| {
                        fields.push(f.clone());
                        numeric.push(false);
                        fields.len() - 1
                    });
                    numeric[i] |= func.numeric();
                    i
                }
            };
            let value = match (a.func, &a.value) {
                (Fn::CountGt | Fn::CountLt, None) => return Err(ctx("\"value\" is required")),
                (Fn::CountGt | Fn::CountLt, Some(v)) => {
                    Some(to_num(v).ok_or_else(|| ctx("\"value\" must be a finite number"))?)
                }
                (_, Some(_)) => return Err(ctx("\"value\" applies only to count_gt / count_lt")),
                (_, None) => None,
            };
            aggregates.push(Aggregate {
                name: a.name,
                func: a.func,
                field,
                value,
            });
        }
        Ok(Self {
            key_field: raw.key_field,
            fields,
            aggregates,
            numeric,
        })
    }

    fn new_acc(&self, key_json: &str) -> Acc {
        Acc {
            key_json: key_json.to_owned(),
            slots: self
                .aggregates
                .iter()
                .map(|a| match a.func {
                    Fn::Sum | Fn::Avg => Slot::Sum {
                        n: 0,
                        ints: 0,
                        partials: Vec::new(),
                    },
                    Fn::Min | Fn::Max => Slot::Extreme(None),
                    _ => Slot::Count(0),
                })
                .collect(),
        }
    }

    /// Phase 1: parses `records` (`(routing key, JSON payload)`) and groups them by key
    /// into `s`; afterwards `s.keys` are the batch's distinct keys.
    ///
    /// # Errors
    /// A record that is not a JSON object, whose key field is an array or object, whose
    /// key differs from its routing key, or with a non-number in a numeric function's
    /// field; the message names the record index and field.
    pub fn group<'r>(
        &self,
        records: impl IntoIterator<Item = (Option<&'r [u8]>, &'r [u8])>,
        s: &mut Scratch,
    ) -> Result<(), String> {
        s.index.clear();
        s.keys.clear();
        s.key_json.clear();
        s.rec_group.clear();
        s.rec_vals.clear();
        let width = self.fields.len();
        for (r, (routing_key, payload)) in records.into_iter().enumerate() {
            let base = s.rec_vals.len();
            s.rec_vals.resize(base + width, Val::Missing);
            s.key_bytes.clear();
            s.key_text.clear();
            let mut de = serde_json::Deserializer::from_slice(payload);
            Extract {
                fields: &self.fields,
                vals: &mut s.rec_vals[base..],
                key_bytes: &mut s.key_bytes,
                key_json: &mut s.key_text,
            }
            .deserialize(&mut de)
            .and_then(|()| de.end())
            .map_err(|e| format!("record {r}: not a JSON object of scalars: {e}"))?;
            let vals = &s.rec_vals[base..];
            if vals[0] == Val::Nested {
                return Err(format!(
                    "record {r}: key field {:?} is an array or object",
                    self.key_field
                ));
            }
            for (i, v) in vals.iter().enumerate() {
                if self.numeric[i] && matches!(v, Val::Str | Val::Bool | Val::Nested) {
                    return Err(format!(
                        "record {r}: field {:?} must be a number or null, found {}",
                        self.fields[i],
                        v.describe()
                    ));
                }
            }
            if s.key_text.is_empty() {
                s.key_text.push_str("null");
            }
            if let Some(k) = routing_key
                && k != s.key_bytes.as_slice()
            {
                return Err(format!(
                    "record {r}: routing key {:?} differs from key field {:?} = {}",
                    String::from_utf8_lossy(k),
                    self.key_field,
                    s.key_text
                ));
            }
            let g = match s.index.entry(s.key_bytes.clone()) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    s.keys.push(e.key().clone());
                    s.key_json.push(s.key_text.clone());
                    *e.insert(s.keys.len() - 1)
                }
            };
            s.rec_group.push(g);
        }
        Ok(())
    }

    /// Phase 2: folds the grouped records into `accs` (one per `s.keys`, `None` for a key
    /// without state) and returns the updated accumulators in the same order.
    ///
    /// # Errors
    /// A stored accumulator does not match the configured aggregates (the config changed
    /// under existing state).
    pub fn apply(&self, s: &Scratch, accs: Vec<Option<Acc>>) -> Result<Vec<Acc>, String> {
        if accs.len() != s.keys.len() {
            return Err(format!(
                "expected {} accumulators, got {}",
                s.keys.len(),
                accs.len()
            ));
        }
        let mut accs: Vec<Acc> = accs
            .into_iter()
            .zip(&s.key_json)
            .map(|(a, k)| a.unwrap_or_else(|| self.new_acc(k)))
            .collect();
        for a in &accs {
            let fits = a.slots.len() == self.aggregates.len()
                && a.slots.iter().zip(&self.aggregates).all(|(s, g)| {
                    matches!(
                        (s, g.func),
                        (Slot::Sum { .. }, Fn::Sum | Fn::Avg)
                            | (Slot::Extreme(_), Fn::Min | Fn::Max)
                            | (
                                Slot::Count(_),
                                Fn::Count
                                    | Fn::CountNull
                                    | Fn::CountNotNull
                                    | Fn::CountGt
                                    | Fn::CountLt
                            )
                    )
                });
            if !fits {
                return Err(format!(
                    "stored accumulator of key {} has {} slots, which do not match the {} \
                     configured aggregates: `aggregates` changed since this state was written \
                     (`nopstream savepoint check` reports it as STATE_LAYOUT_CHANGED); run \
                     with the old `aggregates`, or drop this operator's state (`drop-state`)",
                    a.key_json,
                    a.slots.len(),
                    self.aggregates.len()
                ));
            }
        }
        let width = self.fields.len();
        for (r, &g) in s.rec_group.iter().enumerate() {
            let vals = &s.rec_vals[r * width..(r + 1) * width];
            for (slot, agg) in accs[g].slots.iter_mut().zip(&self.aggregates) {
                fold(slot, agg, vals[agg.field]);
            }
        }
        Ok(accs)
    }

    /// Appends the output line of `acc` (no newline): the key field, then the aggregates
    /// in config order.
    pub fn render(&self, acc: &Acc, out: &mut Vec<u8>) {
        out.push(b'{');
        let _ = serde_json::to_writer(&mut *out, &self.key_field);
        out.push(b':');
        out.extend_from_slice(acc.key_json.as_bytes());
        for (slot, agg) in acc.slots.iter().zip(&self.aggregates) {
            out.push(b',');
            let _ = serde_json::to_writer(&mut *out, &agg.name);
            out.push(b':');
            match (slot, agg.func) {
                (Slot::Count(c), _) => out.extend_from_slice(c.to_string().as_bytes()),
                (Slot::Sum { n: 0, .. }, _) | (Slot::Extreme(None), _) => {
                    out.extend_from_slice(b"null");
                }
                (Slot::Sum { ints, partials, .. }, Fn::Sum) if partials.is_empty() => {
                    out.extend_from_slice(ints.to_string().as_bytes());
                }
                (Slot::Sum { n, ints, partials }, func) => {
                    let total = exact_sum(*ints, partials);
                    #[allow(clippy::cast_precision_loss)]
                    let v = if func == Fn::Avg {
                        total / *n as f64
                    } else {
                        total
                    };
                    write_f64(v, out);
                }
                (Slot::Extreme(Some(v)), _) => v.write_json(out),
            }
        }
        out.push(b'}');
    }
}

fn exact_sum(ints: i128, partials: &[f64]) -> f64 {
    let mut p = partials.to_vec();
    let (hi, lo) = i128_parts(ints);
    exact_add(&mut p, hi);
    exact_add(&mut p, lo);
    exact_total(&p)
}

fn fold(slot: &mut Slot, agg: &Aggregate, v: Val) {
    match slot {
        Slot::Count(c) => {
            let hit = match agg.func {
                Fn::Count => true,
                Fn::CountNull => matches!(v, Val::Null | Val::Missing),
                Fn::CountNotNull => !matches!(v, Val::Null | Val::Missing),
                Fn::CountGt | Fn::CountLt => match (v, agg.value) {
                    (Val::Num(x), Some(t)) => {
                        let want = if agg.func == Fn::CountGt {
                            Ordering::Greater
                        } else {
                            Ordering::Less
                        };
                        x.compare(t) == want
                    }
                    _ => false,
                },
                _ => false,
            };
            *c += u64::from(hit);
        }
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
                let want = if agg.func == Fn::Min {
                    Ordering::Less
                } else {
                    Ordering::Greater
                };
                *cur = Some(match *cur {
                    None => x,
                    Some(c) => match x.compare(c) {
                        o if o == want => x,
                        Ordering::Equal if matches!(x, Num::Int(_)) => x,
                        _ => c,
                    },
                });
            }
        }
    }
}

/// Pulls the configured fields out of one JSON object without building a tree.
struct Extract<'a> {
    fields: &'a [String],
    vals: &'a mut [Val],
    key_bytes: &'a mut Vec<u8>,
    key_json: &'a mut String,
}

impl<'de> DeserializeSeed<'de> for Extract<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Extract<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<FieldName<'de>>()? {
            match self.fields.iter().position(|f| f.as_str() == name.as_str()) {
                Some(0) => {
                    self.key_bytes.clear();
                    self.key_json.clear();
                    self.vals[0] = map.next_value_seed(KeySeed {
                        bytes: self.key_bytes,
                        json: self.key_json,
                    })?;
                }
                Some(i) => self.vals[i] = map.next_value_seed(ScalarSeed)?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// Reads the key field: its key bytes and JSON text.
struct KeySeed<'a> {
    bytes: &'a mut Vec<u8>,
    json: &'a mut String,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Val;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Val, D::Error> {
        d.deserialize_any(self)
    }
}

impl KeySeed<'_> {
    fn printed(self, json: &str, v: Val) -> Val {
        self.bytes.extend_from_slice(json.as_bytes());
        self.json.push_str(json);
        v
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Val;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON scalar")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Val, E> {
        Ok(self.printed(if v { "true" } else { "false" }, Val::Bool))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Val, E> {
        Ok(self.printed(&v.to_string(), Val::Num(Num::Int(v))))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Val, E> {
        let val = ScalarSeed.visit_u64::<E>(v)?;
        Ok(self.printed(&v.to_string(), val))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Val, E> {
        let mut buf = Vec::new();
        write_f64(v, &mut buf);
        Ok(self.printed(&String::from_utf8_lossy(&buf), Val::Num(Num::Float(v))))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Val, E> {
        self.bytes.extend_from_slice(v.as_bytes());
        serde_json::to_string(v).map_err(E::custom).map(|j| {
            self.json.push_str(&j);
            Val::Str
        })
    }
    fn visit_unit<E: de::Error>(self) -> Result<Val, E> {
        Ok(Val::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Val, A::Error> {
        ScalarSeed.visit_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Val, A::Error> {
        ScalarSeed.visit_map(map)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const CONFIG: &str = r#"{ "key_field": "carrier", "aggregates": [
        {"name":"flights","fn":"count"},
        {"name":"cancelled","fn":"count_null","field":"dep_delay"},
        {"name":"flown","fn":"count_not_null","field":"dep_delay"},
        {"name":"delayed_15","fn":"count_gt","field":"dep_delay","value":15},
        {"name":"early","fn":"count_lt","field":"dep_delay","value":0},
        {"name":"total_delay","fn":"sum","field":"dep_delay"},
        {"name":"min_delay","fn":"min","field":"dep_delay"},
        {"name":"max_delay","fn":"max","field":"dep_delay"},
        {"name":"avg_dep_delay_min","fn":"avg","field":"dep_delay"},
        {"name":"avg_distance","fn":"avg","field":"distance"}
    ] }"#;

    /// Runs the two phases against a map store, in batches of `batch`.
    fn run(agg: &Aggregator, records: &[(Option<&[u8]>, &[u8])], batch: usize) -> Vec<String> {
        let mut store: BTreeMap<Vec<u8>, Acc> = BTreeMap::new();
        let mut s = Scratch::default();
        for chunk in records.chunks(batch.max(1)) {
            agg.group(chunk.iter().copied(), &mut s).unwrap();
            let got = s.keys.iter().map(|k| store.get(k).cloned()).collect();
            let accs = agg.apply(&s, got).unwrap();
            for (k, a) in s.keys.iter().zip(accs) {
                store.insert(k.clone(), a);
            }
        }
        store
            .values()
            .map(|a| {
                let mut out = Vec::new();
                agg.render(a, &mut out);
                String::from_utf8(out).unwrap()
            })
            .collect()
    }

    fn records() -> Vec<String> {
        let mut v = Vec::new();
        for i in 0..500_i64 {
            let carrier = ["AA", "UA", "B6", "9E"][(i % 4) as usize];
            let delay = if i % 9 == 0 {
                "null".to_string()
            } else {
                ((i * 37) % 71 - 20).to_string()
            };
            let distance = if i % 5 == 0 {
                format!("{}.25", i * 3)
            } else {
                (i * 3).to_string()
            };
            v.push(format!(
                r#"{{"year":2013,"carrier":"{carrier}","dep_delay":{delay},"distance":{distance}}}"#
            ));
        }
        v
    }

    #[test]
    fn results_match_a_direct_computation_for_any_batching_and_order() {
        let agg = Aggregator::parse(CONFIG).unwrap();
        let lines = records();
        let recs: Vec<(Option<&[u8]>, &[u8])> = lines
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let carrier = v["carrier"].as_str().unwrap();
                let start = l.find(carrier).unwrap();
                (
                    Some(&l.as_bytes()[start..start + carrier.len()]),
                    l.as_bytes(),
                )
            })
            .collect();

        // Direct computation.
        let mut want = Vec::new();
        for carrier in ["9E", "AA", "B6", "UA"] {
            let rows: Vec<serde_json::Value> = lines
                .iter()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|v| v["carrier"] == carrier)
                .collect();
            let delays: Vec<i64> = rows
                .iter()
                .filter_map(|v| v["dep_delay"].as_i64())
                .collect();
            let dist: Vec<f64> = rows
                .iter()
                .map(|v| v["distance"].as_f64().unwrap())
                .collect();
            let dist_sum: f64 = dist.iter().map(|d| d * 4.0).sum::<f64>() / 4.0; // exact: quarters
            want.push(serde_json::json!({
                "carrier": carrier,
                "flights": rows.len(),
                "cancelled": rows.len() - delays.len(),
                "flown": delays.len(),
                "delayed_15": delays.iter().filter(|d| **d > 15).count(),
                "early": delays.iter().filter(|d| **d < 0).count(),
                "total_delay": delays.iter().sum::<i64>(),
                "min_delay": delays.iter().min(),
                "max_delay": delays.iter().max(),
                "avg_dep_delay_min": delays.iter().sum::<i64>() as f64 / delays.len() as f64,
                "avg_distance": dist_sum / dist.len() as f64,
            }));
        }
        let want: Vec<String> = want.iter().map(|v| v.to_string()).collect();
        // serde_json::json! sorts keys; compare as values, and check field order separately.
        let parse = |v: &[String]| -> Vec<serde_json::Value> {
            v.iter().map(|s| serde_json::from_str(s).unwrap()).collect()
        };
        for batch in [1, 7, 64, 1000] {
            let got = run(&agg, &recs, batch);
            assert_eq!(parse(&got), parse(&want), "batch {batch}");
            let mut rev = recs.clone();
            rev.reverse();
            assert_eq!(run(&agg, &rev, batch), got, "reversed, batch {batch}");
            let mut shuffled = recs.clone();
            for i in 0..shuffled.len() {
                shuffled.swap(i, (i * 7919) % recs.len());
            }
            assert_eq!(run(&agg, &shuffled, batch), got, "shuffled, batch {batch}");
        }
        let first = &run(&agg, &recs, 10)[0];
        assert!(
            first.starts_with(r#"{"carrier":"9E","flights":125,"cancelled":"#),
            "{first}"
        );
    }

    #[test]
    fn empty_groups_render_null_and_keys_derive_from_values() {
        let agg = Aggregator::parse(
            r#"{"key_field":"k","aggregates":[{"name":"s","fn":"sum","field":"x"},{"name":"a","fn":"avg","field":"x"},{"name":"m","fn":"max","field":"x"},{"name":"c","fn":"count"}]}"#,
        )
        .unwrap();
        let recs: Vec<(Option<&[u8]>, &[u8])> = vec![
            (None, br#"{"k":null,"x":null}"#),
            (None, br#"{"x":null}"#),
            (Some(b"7"), br#"{"k":7,"x":2}"#),
            (None, br#"{"k":7,"x":2.0,"nested":{"a":[1,2]}}"#),
            (None, br#"{"k":"\u0041","x":1.5}"#),
            (None, br#"{"k":"A","x":1}"#),
        ];
        let got = run(&agg, &recs, 2);
        assert_eq!(
            got,
            vec![
                r#"{"k":null,"s":null,"a":null,"m":null,"c":2}"#,
                r#"{"k":7,"s":4.0,"a":2.0,"m":2,"c":2}"#,
                r#"{"k":"A","s":2.5,"a":1.25,"m":1.5,"c":2}"#,
            ]
        );
    }

    #[test]
    fn bad_records_are_reported() {
        let agg = Aggregator::parse(CONFIG).unwrap();
        let mut s = Scratch::default();
        for (rec, needle) in [
            (&br#"{"carrier":"AA","dep_delay":"x"}"#[..], "dep_delay"),
            (br#"[1]"#, "record 0"),
            (br#"{"carrier":{"a":1}}"#, "carrier"),
            (br#"{"carrier":"AA"} x"#, "record 0"),
        ] {
            let err = agg.group([(None, rec)], &mut s).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        let err = agg
            .group([(Some(&b"UA"[..]), &br#"{"carrier":"AA"}"#[..])], &mut s)
            .unwrap_err();
        assert!(err.contains("routing key"), "{err}");
    }

    #[test]
    fn bad_configs_and_mismatched_state_are_rejected() {
        for bad in [
            r#"{"key_field":"k","aggregates":[{"name":"a","fn":"sum"}]}"#,
            r#"{"key_field":"k","aggregates":[{"name":"a","fn":"count_gt","field":"x"}]}"#,
            r#"{"key_field":"k","aggregates":[{"name":"a","fn":"avg","field":"x","value":1}]}"#,
            r#"{"key_field":"k","aggregates":[{"name":"k","fn":"count"}]}"#,
            r#"{"key_field":"k","aggregates":[{"name":"a","fn":"count"},{"name":"a","fn":"count"}]}"#,
            r#"{"key_field":"k","aggregates":[{"name":"a","fn":"median","field":"x"}]}"#,
            r#"{"aggregates":[]}"#,
        ] {
            assert!(Aggregator::parse(bad).is_err(), "{bad}");
        }
        serde_json::from_str::<serde_json::Value>(CONFIG_SCHEMA).unwrap();
        let agg = Aggregator::parse(CONFIG).unwrap();
        let mut s = Scratch::default();
        agg.group([(None, &br#"{"carrier":"AA"}"#[..])], &mut s)
            .unwrap();
        let stale = Acc {
            key_json: "\"AA\"".into(),
            slots: vec![Slot::Count(1)],
        };
        assert!(agg.apply(&s, vec![Some(stale)]).is_err());
    }
}
