//! Semantic modes (design §13) and edge partition policies (design §4.1).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The delivery guarantee a job declares and the planner validates (design §5.1, §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SemanticMode {
    /// Effects after recovery to epoch N equal "all epochs <= N committed, none after";
    /// needs replayable sources and strictly committing sinks.
    #[default]
    StrictExactlyOnce,
    /// No duplicate effect, but output may become visible before its epoch is durable
    /// (idempotent or upsert sinks).
    EffectivelyOnce,
    /// Nothing lost; duplicates possible.
    AtLeastOnce,
    /// No guarantee.
    BestEffort,
}

impl fmt::Display for SemanticMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::StrictExactlyOnce => "strict-exactly-once",
            Self::EffectivelyOnce => "effectively-once",
            Self::AtLeastOnce => "at-least-once",
            Self::BestEffort => "best-effort",
        })
    }
}

/// How records move across a JobGraph edge (design §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PartitionPolicy {
    /// Upstream subtask i feeds downstream subtask i (equal parallelism).
    Forward,
    /// By key: `stableHash(key) mod stateShardCount`, then the shard's owner subtask.
    Hash,
    /// Round-robin over downstream subtasks.
    Rebalance,
    /// Every record to every downstream subtask.
    Broadcast,
    /// Several upstreams merged into one input (each upstream subtask feeds its peer index
    /// modulo the downstream parallelism). When the upstream is narrower than the
    /// downstream, upstream subtask `i` also feeds every downstream subtask `d` with
    /// `d mod up == i` and round-robins over them, so no subtask is left without a
    /// channel (pointwise; see `nop_stream_core::channel_pairs`).
    Union,
    /// Everything to downstream subtask 0 (which must have parallelism 1).
    Singleton,
}

impl fmt::Display for PartitionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Forward => "FORWARD",
            Self::Hash => "HASH",
            Self::Rebalance => "REBALANCE",
            Self::Broadcast => "BROADCAST",
            Self::Union => "UNION",
            Self::Singleton => "SINGLETON",
        })
    }
}
