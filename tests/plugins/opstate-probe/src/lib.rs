//! Test plugin `opstate-probe` (`opstate-probe@0.1.0`): a non-keyed operator over the JSON
//! flights records of `flights-mapper` (fields year, month, day, carrier, flight, origin,
//! sched_dep_time, dep_delay), with one operator state per redistribution policy:
//!
//! - `split` (split-registry): an entry per flight delayed over `split_over` minutes (id
//!   = the flight's natural key, value = its delay);
//! - `union` (union): the same for delays over `union_over`; after a restore `open` keeps
//!   only the entries this subtask owns (FNV-1a of the id mod parallelism), so ids stay
//!   unique across subtasks;
//! - `broadcast` (broadcast): one entry `origin`, set at the first `open` to
//!   `p<parallelism>` and never changed, so a restored subtask shows where its copy came
//!   from;
//! - `none` (none): one entry `records`, the records this subtask processed.
//!
//! At the end of input it emits `S <id> <delay>` per split entry, `U <id> <delay>` per
//! union entry, `B <origin>` and `N <records>` (one each per subtask).

use nop_stream_sdk::{
    Batch, Context, Operator, OperatorState, PluginError, PluginInfo, Redistribution, Result,
    TaskInfo,
};

/// The operator.
pub struct Probe {
    split: OperatorState<i64>,
    union: OperatorState<i64>,
    broadcast: OperatorState<String>,
    none: OperatorState<u64>,
    split_over: i64,
    union_over: i64,
}

fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Operator for Probe {
    fn describe() -> PluginInfo {
        PluginInfo::operator("opstate-probe", "0.1.0")
            .description("operator state under every redistribution policy (tests)")
            .operator_state(OperatorState::<i64>::descriptor(
                "split",
                1,
                Redistribution::SplitRegistry,
            ))
            .operator_state(OperatorState::<i64>::descriptor(
                "union",
                1,
                Redistribution::Union,
            ))
            .operator_state(OperatorState::<String>::descriptor(
                "broadcast",
                1,
                Redistribution::Broadcast,
            ))
            .operator_state(OperatorState::<u64>::descriptor(
                "none",
                1,
                Redistribution::None,
            ))
    }

    fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> {
        let cfg: serde_json::Value =
            serde_json::from_str(config).map_err(|e| PluginError::invalid_config(e.to_string()))?;
        let over = |name: &str| {
            cfg.get(name)
                .and_then(serde_json::Value::as_i64)
                .ok_or_else(|| PluginError::invalid_config(format!("`{name}` must be an integer")))
        };
        let p = Probe {
            split: OperatorState::open(ctx, "split")?,
            union: OperatorState::open(ctx, "union")?,
            broadcast: OperatorState::open(ctx, "broadcast")?,
            none: OperatorState::open(ctx, "none")?,
            split_over: over("split_over")?,
            union_over: over("union_over")?,
        };
        // Union gives every subtask every entry: keep only this subtask's.
        for (id, _) in p.union.entries(ctx) {
            if fnv1a(&id) % task.parallelism != task.subtask_index {
                p.union.remove(ctx, &id);
            }
        }
        if p.broadcast.get(ctx, "origin").is_none() {
            p.broadcast
                .put(ctx, "origin", &format!("p{}", task.parallelism));
        }
        Ok(p)
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        _out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            let v: serde_json::Value = serde_json::from_slice(r.data)
                .map_err(|e| PluginError::invalid_record(e.to_string()))?;
            let field = |n: &str| match v.get(n) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(x) => x.to_string(),
                None => String::new(),
            };
            if let Some(delay) = v.get("dep_delay").and_then(serde_json::Value::as_i64) {
                let id = [
                    "year",
                    "month",
                    "day",
                    "carrier",
                    "flight",
                    "origin",
                    "sched_dep_time",
                ]
                .map(field)
                .join("-");
                if delay > self.split_over {
                    self.split.put(ctx, &id, &delay);
                }
                if delay > self.union_over {
                    self.union.put(ctx, &id, &delay);
                }
            }
        }
        let n = self.none.get(ctx, "records").unwrap_or(0);
        self.none.put(ctx, "records", &(n + batch.len() as u64));
        Ok(())
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        for (id, d) in self.split.entries(ctx) {
            out.push(format!("S {id} {d}").as_bytes());
        }
        for (id, d) in self.union.entries(ctx) {
            out.push(format!("U {id} {d}").as_bytes());
        }
        let origin = self.broadcast.get(ctx, "origin").unwrap_or_default();
        out.push(format!("B {origin}").as_bytes());
        let n = self.none.get(ctx, "records").unwrap_or(0);
        out.push(format!("N {n}").as_bytes());
        Ok(())
    }
}

nop_stream_sdk::export_operator!(Probe);
