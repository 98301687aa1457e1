//! Sandbox limits of a plugin instance (design §16: "sandbox limits are part of the
//! contract"). A plugin that exceeds one fails its task with
//! [`crate::RuntimeError::LimitExceeded`] or a trap naming the limit; the host survives.

use serde::{Deserialize, Serialize};

/// Length of one interruption tick of the engine's ticker thread, in milliseconds.
/// CPU-per-call budgets are rounded up to whole ticks.
pub const TICK_MS: u64 = 10;

/// Per-instance sandbox limits. Every field has a unit and a default; a job may lower or
/// raise them per job with the `[limits]` table of the job file... or the embedding API.
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
    /// `nop:postgres/client`: open sessions per instance. Default 4.
    pub pg_sessions: u32,
    /// `nop:postgres/client`: the server-side `statement_timeout` of every session, in
    /// milliseconds. Default 30,000 ms.
    pub pg_statement_timeout_ms: u64,
    /// `nop:postgres/client`: maximum bytes of values in one `query` result. Default
    /// 16 MiB.
    pub pg_result_bytes: u64,
    /// `nop:postgres/client`: how long opening a session may take, in milliseconds.
    /// Default 5,000 ms.
    pub pg_connect_timeout_ms: u64,
    /// `nop:redis/streams`: maximum bytes of entry ids, field names and values in one
    /// reply. Default 16 MiB.
    pub redis_reply_bytes: u64,
    /// `nop:redis/streams`: how long connecting may take, in milliseconds. Default
    /// 5,000 ms.
    pub redis_connect_timeout_ms: u64,
    /// `nop:redis/streams`: how long one command may wait for its reply (socket read and
    /// write timeouts), in milliseconds. Default 30,000 ms.
    pub redis_command_timeout_ms: u64,
    /// `nop:nats/jetstream`: maximum payload bytes one `fetch` returns (the server stops
    /// a pull there; a single larger message is a `limit` error). Default 8 MiB.
    pub nats_fetch_bytes: u64,
    /// `nop:nats/jetstream`: longest a `fetch` waits for messages when none is stored, in
    /// milliseconds; a larger `max-wait-ms` is lowered to it. Default 5,000 ms.
    pub nats_max_wait_ms: u64,
    /// `nop:nats/jetstream`: how long connecting, and each JetStream API request, may
    /// take, in milliseconds. Default 5,000 ms.
    pub nats_connect_timeout_ms: u64,
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
            pg_sessions: 4,
            pg_statement_timeout_ms: 30_000,
            pg_result_bytes: 16 << 20,
            pg_connect_timeout_ms: 5_000,
            redis_reply_bytes: 16 << 20,
            redis_connect_timeout_ms: 5_000,
            redis_command_timeout_ms: 30_000,
            nats_fetch_bytes: 8 << 20,
            nats_max_wait_ms: 5_000,
            nats_connect_timeout_ms: 5_000,
        }
    }
}

impl Limits {
    /// CPU budget per call in engine ticks (at least 1).
    pub fn cpu_ticks(&self) -> u64 {
        self.cpu_ms_per_call.div_ceil(TICK_MS).max(1)
    }
}
