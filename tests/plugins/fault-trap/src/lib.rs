//! Fault plugin `fault-trap`: an operator that passes records through and panics (a trap
//! in the component) once it has seen more than `after` records in total.
//!
//! Config: `{"after": N, "attempts": K}` — records passed through before the panic
//! (default 0, so the first record traps); with `attempts`, only subtask attempts
//! `<= K` panic, so a job recovering with a later attempt gets past the fault (a
//! transient failure).

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    attempts: Option<u32>,
}

/// The operator: counts records seen by this instance.
pub struct FaultTrap {
    after: u64,
    seen: u64,
}

impl Operator for FaultTrap {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-trap", "0.1.0")
            .description("passes records through, then panics after `after` records")
            .config_schema(
                r#"{"type":"object","properties":{"after":{"type":"integer","minimum":0},"attempts":{"type":"integer","minimum":1}},"additionalProperties":false}"#,
            )
    }

    fn open(_ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("fault-trap config: {e}")))?;
        let armed = config.attempts.is_none_or(|k| task.attempt <= k);
        Ok(FaultTrap {
            after: if armed { config.after } else { u64::MAX },
            seen: 0,
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            if self.seen >= self.after {
                panic!("fault-trap: deliberate panic after {} records", self.after);
            }
            self.seen += 1;
            out.push_record(r.key, r.timestamp, r.data);
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(FaultTrap);

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_sdk::MockContext;

    #[test]
    #[should_panic(expected = "deliberate panic after 2 records")]
    fn panics_after_n_records() {
        let mut ctx = MockContext::for_operator::<FaultTrap>();
        let mut op = FaultTrap::open(&mut ctx, &TaskInfo::for_tests(), r#"{"after":2}"#).unwrap();
        let mut input = Batch::new();
        input.push(b"a");
        input.push(b"b");
        op.process(&mut ctx, 0, &input, &mut Batch::new()).unwrap();
        op.process(&mut ctx, 0, &input, &mut Batch::new()).unwrap();
    }
}
