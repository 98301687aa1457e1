//! Test plugin `tally-v2` (`tally@0.2.0`): `tally@0.1.0` with its state `count` in a new
//! schema (2: the count as a decimal string) and a state migration from schema 1, so a
//! savepoint of v1 can be migrated (`nopstream savepoint migrate` with `migrate-state`)
//! and restored with v2. Emits `KEY COUNT v0.2.0` per key when the input ends.

use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, Result, StateEntry, StateMigration,
    TaskInfo, ValueState, decode_value, encode_value,
};

/// The operator.
pub struct Tally {
    count: ValueState<String>,
}

impl Operator for Tally {
    fn describe() -> PluginInfo {
        PluginInfo::operator("tally", "0.2.0")
            .description("counts records per key (schema 2: decimal string)")
            .state(ValueState::<String>::descriptor("count", 2))
    }

    fn open(ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(Tally {
            count: ValueState::open(ctx, "count")?,
        })
    }

    fn process(
        &mut self,
        ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        _out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            let key = r
                .key
                .ok_or_else(|| PluginError::invalid_record("unkeyed record"))?;
            let n: u64 = match self.count.get(ctx, key) {
                Some(s) => s
                    .parse()
                    .map_err(|_| PluginError::state(format!("count `{s}` is no number")))?,
                None => 0,
            };
            self.count.put(ctx, key, &(n + 1).to_string());
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let mut keys = self.count.keys(ctx);
        keys.sort();
        for key in keys {
            let n = self.count.get(ctx, &key).unwrap_or_default();
            let line = format!("{} {n} v0.2.0", String::from_utf8_lossy(&key));
            out.push_keyed(&key, line.as_bytes());
        }
        Ok(())
    }
}

impl StateMigration for Tally {
    fn migrate(
        state: &str,
        from_version: u32,
        entries: &[StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>> {
        if state != "count" || from_version != 1 {
            return Err(PluginError::state(format!(
                "tally@0.2.0 migrates only state `count` from schema 1, not `{state}` from {from_version}"
            )));
        }
        entries
            .iter()
            .map(|e| {
                let n: u64 = decode_value(&e.value)?;
                encode_value(&n.to_string()).map(Some)
            })
            .collect()
    }
}

nop_stream_sdk::export_operator!(Tally);
nop_stream_sdk::export_state_migration!(Tally);
