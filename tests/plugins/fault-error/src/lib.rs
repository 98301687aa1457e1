//! Fault plugin `fault-error`: an operator that passes records through unchanged but
//! reports a plugin error (`invalid-record`) for the first record containing `bad`.
//! Tests use it to check that guest errors are data, routed by the job's error policy,
//! not traps.

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};

/// The operator; holds nothing.
pub struct FaultError;

impl Operator for FaultError {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-error", "0.1.0").description(
            "passes records through; invalid-record error on a record containing `bad`",
        )
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(FaultError)
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for (i, r) in batch.iter().enumerate() {
            if r.data.windows(3).any(|w| w == b"bad") {
                return Err(PluginError::invalid_record(format!(
                    "record {i} contains `bad`: {}",
                    String::from_utf8_lossy(r.data)
                )));
            }
            out.push_record(r.key, r.timestamp, r.data);
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(FaultError);

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_sdk::{ErrorCode, MockContext};

    #[test]
    fn passes_good_records_and_rejects_bad_ones() {
        let mut ctx = MockContext::for_operator::<FaultError>();
        let mut op = FaultError::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
        let mut input = Batch::new();
        input.push(b"good");
        let mut out = Batch::new();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        assert_eq!(out, input);
        input.push(b"a bad one");
        let err = op
            .process(&mut ctx, 0, &input, &mut Batch::new())
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidRecord);
    }
}
