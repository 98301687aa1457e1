//! Fault plugin `fault-memory`: an operator whose `process` allocates (and touches)
//! memory until allocation fails, so the host's memory limit must stop it.
//!
//! Config: `{"chunk_bytes": N}` — size of each allocation (default 1 MiB).

use nop_stream_sdk::{Batch, Context, Operator, PluginError, PluginInfo, Result, TaskInfo};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_chunk")]
    chunk_bytes: usize,
}

fn default_chunk() -> usize {
    1 << 20
}

/// The operator; keeps everything it allocates.
pub struct FaultMemory {
    chunk_bytes: usize,
    hoard: Vec<Vec<u8>>,
}

impl Operator for FaultMemory {
    fn describe() -> PluginInfo {
        PluginInfo::operator("fault-memory", "0.1.0")
            .description("allocates memory in process until it runs out")
            .config_schema(
                r#"{"type":"object","properties":{"chunk_bytes":{"type":"integer","minimum":1}},"additionalProperties":false}"#,
            )
    }

    fn open(_ctx: &mut dyn Context, _task: &TaskInfo, config: &str) -> Result<Self> {
        let config: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("fault-memory config: {e}")))?;
        if config.chunk_bytes == 0 {
            return Err(PluginError::invalid_config("chunk_bytes must be positive"));
        }
        Ok(FaultMemory {
            chunk_bytes: config.chunk_bytes,
            hoard: Vec::new(),
        })
    }

    fn process(
        &mut self,
        _ctx: &mut dyn Context,
        _input: u32,
        _batch: &Batch,
        _out: &mut Batch,
    ) -> Result<()> {
        // Never returns: the allocator aborts (a trap) when memory.grow fails.
        loop {
            let mut chunk = vec![0u8; self.chunk_bytes];
            // Touch every page so the memory is really committed.
            for b in chunk.iter_mut().step_by(4096) {
                *b = 1;
            }
            self.hoard.push(std::hint::black_box(chunk));
        }
    }
}

nop_stream_sdk::export_operator!(FaultMemory);
