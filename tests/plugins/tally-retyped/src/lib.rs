//! Test plugin `tally-retyped` (`tally@0.1.1`): `tally-v1` with the value of state `count`
//! retyped from `u64` to `i64` (another postcard encoding) but its schema version left at
//! 1: the mistake the savepoint check's `STATE_SCHEMA_CHANGED` catches.

use nop_stream_sdk::{
    Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo, ValueState,
};

/// The operator.
pub struct Tally {
    count: ValueState<i64>,
}

impl Operator for Tally {
    fn describe() -> PluginInfo {
        PluginInfo::operator("tally", "0.1.1")
            .description("counts records per key (schema 1, retyped to i64 without a bump)")
            .state(ValueState::<i64>::descriptor("count", 1))
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
            let n = self.count.get(ctx, key).unwrap_or(0);
            self.count.put(ctx, key, &(n + 1));
        }
        Ok(())
    }

    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let mut keys = self.count.keys(ctx);
        keys.sort();
        for key in keys {
            let n = self.count.get(ctx, &key).unwrap_or(0);
            let line = format!("{} {n} v0.1.1", String::from_utf8_lossy(&key));
            out.push_keyed(&key, line.as_bytes());
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(Tally);
