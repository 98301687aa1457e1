//! Newtyped identities (design §3). Persistent ones (job, pipeline, operator, vertex, edge,
//! subtask, shard, epoch) may appear in state paths; run-scoped ones (attempt, fencing
//! token) never do (design §3.1).

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// Wraps a string id.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
    };
}

macro_rules! int_id {
    ($(#[$doc:meta])* $name:ident($ty:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub $ty);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

string_id!(
    /// Logical job id, stable across restarts (design §3.1).
    JobId
);
string_id!(
    /// Stable pipeline lineage id (design §3.1).
    PipelineId
);
string_id!(
    /// Stable operator id: explicit `uid`, else canonical model path, else structural hash
    /// (design §3.2). The routing key of all persistent state.
    OperatorId
);
string_id!(
    /// Id of a JobGraph vertex (an operator chain); the id of its head operator.
    VertexId
);
string_id!(
    /// Id of a JobGraph edge: `{upstream vertex}->{downstream vertex}#{input index}`.
    EdgeId
);

int_id!(
    /// Index of a subtask within its vertex, `0 <= index < parallelism`.
    SubtaskIndex(u32)
);
int_id!(
    /// Logical state shard, `0 <= id < stateShardCount` (design §3.4).
    StateShardId(u32)
);
int_id!(
    /// Checkpoint epoch (design §5.1). Epoch 0 means "before the first checkpoint".
    EpochId(u64)
);
int_id!(
    /// Execution attempt of a job run; grows on every global recovery (design §3.3).
    AttemptId(u32)
);
int_id!(
    /// Write token issued by the coordinator per attempt; channels and commits of any
    /// other token are refused (design §10.2).
    FencingToken(u64)
);

/// Stable task identity `jobId/pipelineId/vertexId/subtaskIndex` (design §3.3); used by
/// checkpoint ACKs. It never contains an attempt.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    /// Job of the task.
    pub job: JobId,
    /// Pipeline of the task.
    pub pipeline: PipelineId,
    /// Vertex (operator chain) the task runs.
    pub vertex: VertexId,
    /// Subtask index within the vertex.
    pub subtask: SubtaskIndex,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.job, self.pipeline, self.vertex, self.subtask
        )
    }
}

/// A task attempt: the stable task plus the attempt and its fencing token (design §3.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskAttemptId {
    /// The stable task.
    pub task: TaskId,
    /// The attempt number.
    pub attempt: AttemptId,
    /// The token this attempt writes with.
    pub token: FencingToken,
}

impl fmt::Display for TaskAttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.task, self.attempt)
    }
}

/// Channel identity `edgeId/upstreamSubtask/downstreamSubtask/channelIndex` (design §4.2).
/// Order is guaranteed within a channel, never across channels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChannelId {
    /// The JobGraph edge the channel belongs to.
    pub edge: EdgeId,
    /// Sending subtask of the upstream vertex.
    pub upstream: SubtaskIndex,
    /// Receiving subtask of the downstream vertex.
    pub downstream: SubtaskIndex,
    /// Index among parallel channels between the same pair (0 for now).
    pub index: u32,
}

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.edge, self.upstream, self.downstream, self.index
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_display_in_seed_shape() {
        let task = TaskId {
            job: "j".into(),
            pipeline: "p".into(),
            vertex: "v".into(),
            subtask: SubtaskIndex(3),
        };
        assert_eq!(task.to_string(), "j/p/v/3");
        let ch = ChannelId {
            edge: "a->b#0".into(),
            upstream: SubtaskIndex(1),
            downstream: SubtaskIndex(0),
            index: 0,
        };
        assert_eq!(ch.to_string(), "a->b#0/1/0/0");
        assert_eq!(serde_json::to_string(&EpochId(7)).unwrap(), "7");
    }
}
