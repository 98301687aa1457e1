//! `keyed-aggregate`: keyed count / sum / min / max / avg over JSON-object records, with
//! accumulators in host keyed state.
//!
//! Config: `{ "key_field": "carrier", "aggregates": [ {"name": "flights", "fn": "count"},
//! {"name": "cancelled", "fn": "count_null", "field": "dep_delay"}, {"name": "delayed_15",
//! "fn": "count_gt", "field": "dep_delay", "value": 15}, {"name": "avg_dep_delay_min",
//! "fn": "avg", "field": "dep_delay"} ] }` — functions `count`, `count_null`,
//! `count_not_null`, `count_gt`, `count_lt`, `sum`, `min`, `max`, `avg`; see [`aggregate`]
//! for their rules, key derivation and exactness.
//!
//! State: one value state `acc` (schema 1, postcard) holding an [`aggregate::Acc`] per key.
//! Each batch costs one `get_many` and one `put_many` over its distinct keys; nothing is
//! kept in the instance between calls. `process` emits nothing; `finish` emits one JSON
//! line per key in ascending key order, `{"<key_field>": …, "<name>": …, …}` in config
//! order, keyed by the key.

pub mod aggregate;

use nop_stream_sdk::{
    Batch, Context, KEYS_PAGE_LIMIT, Operator, PluginError, PluginInfo, Result, TaskInfo,
    ValueState,
};

use crate::aggregate::{Acc, Aggregator, CONFIG_SCHEMA, Scratch};

/// Name of the accumulator state.
pub const ACC_STATE: &str = "acc";
/// Schema version of [`Acc`] in [`ACC_STATE`].
pub const ACC_SCHEMA: u32 = 1;

/// The operator.
#[derive(Debug)]
pub struct KeyedAggregate {
    agg: Aggregator,
    acc: ValueState<Acc>,
    scratch: Scratch,
}

impl Operator for KeyedAggregate {
    fn describe() -> PluginInfo {
        PluginInfo::operator("keyed-aggregate", "0.1.0")
            .description(
                "Keyed count/sum/min/max/avg over JSON records; emits one line per key at the end",
            )
            .state(ValueState::<Acc>::descriptor(ACC_STATE, ACC_SCHEMA))
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(Self {
            agg: Aggregator::parse(config).map_err(PluginError::invalid_config)?,
            acc: ValueState::open(ctx, ACC_STATE)?,
            scratch: Scratch::default(),
        })
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        _out: &mut Batch,
    ) -> Result<()> {
        self.agg
            .group(batch.iter().map(|r| (r.key, r.data)), &mut self.scratch)
            .map_err(PluginError::invalid_record)?;
        if self.scratch.keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<&[u8]> = self.scratch.keys.iter().map(Vec::as_slice).collect();
        let stored = self.acc.get_many(ctx, &keys);
        let accs = self
            .agg
            .apply(&self.scratch, stored)
            .map_err(PluginError::state)?;
        let entries: Vec<(&[u8], Acc)> = keys.into_iter().zip(accs).collect();
        self.acc.put_many(ctx, &entries);
        Ok(())
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let keys = self.acc.keys(ctx);
        for chunk in keys.chunks(KEYS_PAGE_LIMIT as usize) {
            let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            for (key, acc) in refs.iter().zip(self.acc.get_many(ctx, &refs)) {
                if let Some(acc) = acc {
                    out.push_with(Some(key), None, |buf| self.agg.render(&acc, buf));
                }
            }
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(KeyedAggregate);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nop_stream_sdk::{ErrorCode, MockContext};

    use super::*;

    const CONFIG: &str = r#"{ "key_field": "carrier", "aggregates": [
        {"name":"flights","fn":"count"},
        {"name":"cancelled","fn":"count_null","field":"dep_delay"},
        {"name":"delayed_15","fn":"count_gt","field":"dep_delay","value":15},
        {"name":"avg_dep_delay_min","fn":"avg","field":"dep_delay"} ] }"#;

    /// Feeds `records` (carrier, dep_delay) in batches of `batch` and returns the output.
    fn run(records: &[(String, Option<i64>)], batch: usize) -> Vec<(Vec<u8>, String)> {
        let mut ctx = MockContext::for_operator::<KeyedAggregate>();
        let mut op = KeyedAggregate::open(&mut ctx, &TaskInfo::for_tests(), CONFIG).unwrap();
        for chunk in records.chunks(batch) {
            let mut input = Batch::default();
            for (carrier, delay) in chunk {
                let json = serde_json::json!({ "carrier": carrier, "dep_delay": delay, "x": [1] });
                input.push_keyed(carrier.as_bytes(), json.to_string().as_bytes());
            }
            let mut out = Batch::default();
            op.process(&mut ctx, 0, &input, &mut out).unwrap();
            assert!(out.is_empty());
        }
        // A fresh instance finishes: nothing lives in the guest.
        let mut op = KeyedAggregate::open(&mut ctx, &TaskInfo::for_tests(), CONFIG).unwrap();
        let mut out = Batch::default();
        op.finish(&mut ctx, &mut out).unwrap();
        out.iter()
            .map(|r| {
                (
                    r.key.unwrap().to_vec(),
                    String::from_utf8(r.data.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn direct(records: &[(String, Option<i64>)]) -> Vec<(Vec<u8>, String)> {
        let mut groups: BTreeMap<&str, Vec<Option<i64>>> = BTreeMap::new();
        for (c, d) in records {
            groups.entry(c).or_default().push(*d);
        }
        groups
            .into_iter()
            .map(|(c, ds)| {
                let vals: Vec<i64> = ds.iter().flatten().copied().collect();
                let avg = if vals.is_empty() {
                    "null".to_string()
                } else {
                    serde_json::to_string(&(vals.iter().sum::<i64>() as f64 / vals.len() as f64)).unwrap()
                };
                let line = format!(
                    r#"{{"carrier":"{c}","flights":{},"cancelled":{},"delayed_15":{},"avg_dep_delay_min":{avg}}}"#,
                    ds.len(),
                    ds.len() - vals.len(),
                    vals.iter().filter(|d| **d > 15).count()
                );
                (c.as_bytes().to_vec(), line)
            })
            .collect()
    }

    #[test]
    fn matches_a_direct_computation_for_batchings_and_orders() {
        let mut records = Vec::new();
        for i in 0..1000_i64 {
            let carrier = ["UA", "AA", "B6", "9E", "ZZ"][(i % 5) as usize].to_string();
            let delay = if carrier == "ZZ" || i % 11 == 0 {
                None
            } else {
                Some((i * 53) % 97 - 30)
            };
            records.push((carrier, delay));
        }
        let want = direct(&records);
        assert_eq!(want.len(), 5);
        for batch in [1, 10, 333, 5000] {
            assert_eq!(run(&records, batch), want, "batch {batch}");
            let mut rev = records.clone();
            rev.reverse();
            assert_eq!(run(&rev, batch), want, "reversed, batch {batch}");
        }
        assert!(
            want[4].1.ends_with(r#""avg_dep_delay_min":null}"#),
            "{}",
            want[4].1
        );
    }

    #[test]
    fn bad_records_and_configs_are_errors() {
        let mut ctx = MockContext::for_operator::<KeyedAggregate>();
        let task = TaskInfo::for_tests();
        assert_eq!(
            KeyedAggregate::open(&mut ctx, &task, "{}")
                .unwrap_err()
                .code,
            ErrorCode::InvalidConfig
        );
        let mut op = KeyedAggregate::open(&mut ctx, &task, CONFIG).unwrap();
        let mut input = Batch::default();
        input.push(br#"{"carrier":"AA","dep_delay":"late"}"#);
        let err = op
            .process(&mut ctx, 0, &input, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRecord);
        assert!(err.message.contains("dep_delay"), "{}", err.message);
        assert_eq!(ctx.state_entry_count(), 0);
    }

    /// Aggregates the real file (`unzip -p examples/flights/data/flights.csv.zip >
    /// /tmp/flights.csv` first).
    #[test]
    #[ignore = "needs /tmp/flights.csv: unzip -p examples/flights/data/flights.csv.zip > /tmp/flights.csv"]
    fn aggregates_the_real_file() {
        let text = std::fs::read_to_string("/tmp/flights.csv").expect(
            "/tmp/flights.csv: unzip -p examples/flights/data/flights.csv.zip > /tmp/flights.csv",
        );
        let records: Vec<(String, Option<i64>)> = text
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[9].to_string(), f[5].parse().ok())
            })
            .collect();
        assert_eq!(records.len(), 336_776);
        let got = run(&records, 1000);
        assert_eq!(got, direct(&records));
        let aa = &got.iter().find(|(k, _)| k == b"AA").unwrap().1;
        assert!(
            aa.starts_with(r#"{"carrier":"AA","flights":32729,"cancelled":636,"#),
            "{aa}"
        );
    }
}
