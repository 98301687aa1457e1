//! Sandbox limits of a plugin instance (design §16: "sandbox limits are part of the
//! contract"). A plugin that exceeds one fails its task with
//! [`crate::RuntimeError::LimitExceeded`] or a trap naming the limit; the host survives.

use serde::{Deserialize, Serialize};

/// Length of one interruption tick of the engine's ticker thread, in milliseconds.
/// CPU-per-call budgets are rounded up to whole ticks.
pub const TICK_MS: u64 = 10;

/// Per-instance sandbox limits. Every field has a unit and a default; `nopstream run
/// --memory-mb / --cpu-ms` and the embedding API change them. Each host capability has
/// limits of its own (design §16.1), set where it is registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Maximum linear memory of one instance, in bytes. Default 256 MiB. Growing past it
    /// traps (`memory_bytes`).
    pub memory_bytes: u64,
    /// Maximum wall-clock CPU time of one call into the guest, in milliseconds (enforced
    /// by epoch interruption with [`TICK_MS`] granularity). Default 10,000 ms.
    pub cpu_ms_per_call: u64,
    /// Maximum records the host hands to one call (input batch size). Default 4,096.
    pub max_batch_records: u32,
    /// Maximum records one call may return. Default 1,048,576.
    pub max_output_records: u32,
    /// Maximum total payload bytes one call may return. Default 64 MiB.
    pub max_output_bytes: u64,
    /// Maximum size of one record or key, in bytes. Default 1 MiB.
    pub max_record_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 256 << 20,
            cpu_ms_per_call: 10_000,
            max_batch_records: 4096,
            max_output_records: 1 << 20,
            max_output_bytes: 64 << 20,
            max_record_bytes: 1 << 20,
        }
    }
}

impl Limits {
    /// CPU budget per call in engine ticks (at least 1).
    pub fn cpu_ticks(&self) -> u64 {
        self.cpu_ms_per_call.div_ceil(TICK_MS).max(1)
    }
}
