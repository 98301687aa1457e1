//! Fault plugin `fault-loop`: an operator that never returns from `process` once it has
//! seen more than `after` records, so the host's CPU limit (epoch interruption) must stop
//! it.
//!
//! Config: `{"after": N}` — records passed through before looping (default 0).

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    after: u64,
}

/// The operator: counts records seen by this instance.
pub struct FaultLoop {
    after: u64,
    seen: u64,
}

impl Operator for FaultLoop {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-loop", "0.1.0")
            .description("passes records through, then loops forever after `after` records")
            .config_schema(
                r#"{"type":"object","properties":{"after":{"type":"integer","minimum":0}},"additionalProperties":false}"#,
            )
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("fault-loop config: {e}")))?;
        Ok(FaultLoop {
            after: config.after,
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
                spin_forever();
            }
            self.seen += 1;
            out.push_record(r.key, r.timestamp, r.data);
        }
        Ok(())
    }
}

/// Burns CPU forever; `black_box` keeps the optimiser from reasoning about the loop.
fn spin_forever() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

nop_stream_sdk::export_operator!(FaultLoop);
