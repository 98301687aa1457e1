//! Fault plugin `fault-wrong-world`: a component that exports the **source** world but
//! describes itself with kind `operator`. Tests use it where an operator is expected (the
//! host must refuse it at link time, not trap later) and to check that a kind that does
//! not match the exported world is rejected.
//!
//! As a source it has one empty split that finishes at once.

use nop_stream_sdk::{Batch, PluginInfo, Progress, ReadOutcome, Result, Source, Split, TaskInfo};

/// The source; holds nothing.
pub struct FaultWrongWorld;

impl Source for FaultWrongWorld {
    fn describe() -> PluginInfo {
        // Deliberately wrong: this component exports the source world.
        PluginInfo::operator("fault-wrong-world", "0.1.0")
            .description("exports the source world but claims to be an operator")
    }

    fn open(_task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(FaultWrongWorld)
    }

    fn discover_splits(&mut self, _parallelism: u32) -> Result<Vec<Split>> {
        Ok(vec![Split {
            id: "only".into(),
            descriptor: Vec::new(),
        }])
    }

    fn read(
        &mut self,
        _split: &Split,
        _cursor: &[u8],
        _max_records: u32,
        _out: &mut Batch,
    ) -> Result<ReadOutcome> {
        Ok(ReadOutcome {
            next_cursor: Vec::new(),
            finished: true,
            progress: Progress {
                consumed: 0,
                total: Some(0),
            },
        })
    }
}

nop_stream_sdk::export_source!(FaultWrongWorld);
