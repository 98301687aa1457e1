//! Fault plugin `fault-oversized`: an operator that answers every `process` call with a
//! batch far larger than its input, so the host's output batch limits must stop it.
//!
//! Config: `{"records": n, "bytes_per_record": m}` — each call emits `n` records of `m`
//! bytes (defaults: 1,000,000 records of 1,024 bytes, about 1 GiB).

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_records")]
    records: u32,
    #[serde(default = "default_bytes")]
    bytes_per_record: u32,
}

fn default_records() -> u32 {
    1_000_000
}

fn default_bytes() -> u32 {
    1024
}

/// The operator.
pub struct FaultOversized {
    records: u32,
    bytes_per_record: usize,
}

impl Operator for FaultOversized {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-oversized", "0.1.0")
            .description("emits `records` records of `bytes_per_record` bytes per input batch")
            .config_schema(
                r#"{"type":"object","properties":{"records":{"type":"integer","minimum":0},"bytes_per_record":{"type":"integer","minimum":0}},"additionalProperties":false}"#,
            )
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("fault-oversized config: {e}")))?;
        Ok(FaultOversized {
            records: config.records,
            bytes_per_record: config.bytes_per_record as usize,
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        _batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let n = self.bytes_per_record;
        for i in 0..self.records {
            out.push_with(None, None, |buf| {
                buf.resize(buf.len() + n, b'a' + (i % 26) as u8);
            });
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(FaultOversized);

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_sdk::MockContext;

    #[test]
    fn emits_the_configured_volume() {
        let mut ctx = MockContext::for_operator::<FaultOversized>();
        let mut op = FaultOversized::open(
            &mut ctx,
            &TaskInfo::for_tests(),
            r#"{"records":10,"bytes_per_record":100}"#,
        )
        .unwrap();
        let mut input = Batch::new();
        input.push(b"x");
        let mut out = Batch::new();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        assert_eq!(out.len(), 10);
        assert_eq!(out.data.len(), 1000);
        out.validate().unwrap();
    }
}
