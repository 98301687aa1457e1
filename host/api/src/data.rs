//! Plain data that crosses the host's internal boundaries: record batches, source splits
//! and the task identity a plugin is opened with. They mirror the WIT records of the same
//! names (`wit/types.wit`, `wit/worlds.wit`) field for field, so the runtime converts them
//! at the component boundary by moving the vectors, without copying; everything else in
//! the host (transports, the coordinator, wire frames) uses these types and never the
//! wasmtime-generated ones (design §8: identifiers cross boundaries as data).

use serde::{Deserialize, Serialize};

/// A batch of records in the flat boundary layout (design §3, "batch at the boundary").
///
/// Invariants (checked by the runtime where a guest produced the batch): `ends` is
/// non-decreasing and its last value is `data.len()`; `key_ends` is empty or has one entry
/// per record, likewise `timestamps`.
///
/// `data` and `keys` serialize as serde bytes (in postcard a varint length, then the
/// bytes), written and read with one copy instead of one serde call per byte; `ends`,
/// `key_ends` and `timestamps` serialize as one byte string each, of varint differences
/// ([`crate::delta`]), about a byte per record (the data plane's wire frames, design §4.3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Concatenated record payloads, no separators.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Exclusive end offset in `data` of each record; its length is the record count.
    #[serde(with = "crate::delta::u32s")]
    pub ends: Vec<u32>,
    /// Concatenated record keys (the bytes a HASH edge routes on); empty if unkeyed.
    #[serde(with = "serde_bytes")]
    pub keys: Vec<u8>,
    /// Exclusive end offset in `keys` of each record's key; empty if unkeyed.
    #[serde(with = "crate::delta::u32s")]
    pub key_ends: Vec<u32>,
    /// Event time of each record in milliseconds since the Unix epoch; empty if none.
    #[serde(with = "crate::delta::i64s")]
    pub timestamps: Vec<i64>,
}

impl Batch {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Payload bytes plus key bytes: what the batch weighs on a channel.
    pub fn byte_len(&self) -> usize {
        self.data.len() + self.keys.len()
    }
}

/// One split of a source (design §6.2): a unit of input one reader owns at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// Stable split id, unique within the source (part of the state path, design §3.5).
    pub id: String,
    /// Opaque description the source needs to read the split.
    pub descriptor: Vec<u8>,
}

/// What a plugin instance is told about the subtask it runs in (`open(task-info, ..)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Logical job id, stable across restarts (design §3.1).
    pub job_id: String,
    /// Stable pipeline lineage id.
    pub pipeline_id: String,
    /// Stable operator id (design §3.2).
    pub operator_id: String,
    /// Operator name from the job file, for logs and errors.
    pub operator_name: String,
    /// Index of this subtask, `0 <= subtask_index < parallelism`.
    pub subtask_index: u32,
    /// Number of subtasks of this operator.
    pub parallelism: u32,
    /// Attempt number of this subtask, increasing on every restart.
    pub attempt: u32,
}

impl TaskInfo {
    /// A task info for unit tests: job `test-job`, pipeline `main`, operator `op`,
    /// subtask 0 of 1, attempt 1.
    pub fn for_tests() -> Self {
        TaskInfo {
            job_id: "test-job".into(),
            pipeline_id: "main".into(),
            operator_id: "op".into(),
            operator_name: "op".into(),
            subtask_index: 0,
            parallelism: 1,
            attempt: 1,
        }
    }
}
