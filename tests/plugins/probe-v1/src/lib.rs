//! Test plugin `probe-v1`: an operator describing itself as `probe@0.1.0`, one of two
//! versions of one plugin name. Resolution tests put both on a plugin path side by side;
//! each output record is the input record followed by ` v0.1.0`, so a run shows which
//! version served it.

use nop_stream_sdk::{Batch, Context, Operator, PluginInfo, Result, TaskInfo};

/// The version this build reports.
pub const VERSION: &str = "0.1.0";

/// The operator; holds nothing.
pub struct Probe;

impl Operator for Probe {
    fn describe() -> PluginInfo {
        PluginInfo::operator("probe", VERSION)
            .description("appends its own version to each record (resolution tests)")
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(Probe)
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        for r in batch.iter() {
            let mut data = r.data.to_vec();
            data.extend_from_slice(format!(" v{VERSION}").as_bytes());
            out.push_record(r.key, r.timestamp, &data);
        }
        Ok(())
    }
}

nop_stream_sdk::export_operator!(Probe);
