//! Placement: `PartitionedPlan -> DeploymentPlan` (design §2.3, §2.5). Pure and
//! deterministic: the same plan and the same nodes always give the same placement.
//!
//! The rule is Flink's slot sharing: subtask `i` of every vertex belongs to slot group
//! `i`, and one task slot holds one slot group (one subtask of each vertex). A job needs as
//! many slots as its largest parallelism. Slot groups go to the nodes round-robin in the
//! order given (callers sort nodes by id), skipping nodes whose slots are used up. So
//! subtasks with the same index share a node, and a FORWARD edge between two vertices of
//! equal parallelism stays inside one node; HASH, REBALANCE and BROADCAST edges cross
//! nodes whenever more than one node holds a slot group.
//!
//! A task's transport is `local-queue` when every channel it sends or receives on connects
//! it to a task on the same node, `quic` when any channel crosses nodes.

use crate::plan::{DeploymentPlan, PartitionedPlan, TaskDeployment};
use nop_stream_api::TaskId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One node as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSlots {
    /// Node name (`local` in the embedded mode, `node-<id>` in a cluster).
    pub node: String,
    /// Task slots it offers: slot groups it can hold.
    pub slots: u32,
}

/// What [`deployment_plan`] places tasks on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentOptions {
    /// Backend name recorded in the plan: `embedded` or `cluster`.
    pub backend: String,
    /// Nodes in placement order (at least one).
    pub nodes: Vec<NodeSlots>,
    /// Directory holding state databases, as the state binding names it (relative to a
    /// node's data directory in a cluster).
    pub state_dir: String,
    /// Checkpoint storage location.
    pub checkpoint_storage: String,
}

impl DeploymentOptions {
    /// The embedded mode: every task on one node `local` with unbounded slots.
    pub fn embedded(state_dir: impl Into<String>, checkpoint_storage: impl Into<String>) -> Self {
        DeploymentOptions {
            backend: "embedded".into(),
            nodes: vec![NodeSlots {
                node: "local".into(),
                slots: u32::MAX,
            }],
            state_dir: state_dir.into(),
            checkpoint_storage: checkpoint_storage.into(),
        }
    }
}

/// Why tasks cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No node to place on.
    #[error("no node is available to run the job")]
    NoNodes,
    /// The nodes offer fewer slots than the job's largest parallelism.
    #[error(
        "the job needs {needed} task slots (its largest parallelism) and the nodes offer \
         {offered} ({nodes}); add nodes, give them more --slots, or lower the parallelism"
    )]
    NotEnoughSlots {
        /// Slots needed.
        needed: u64,
        /// Slots offered.
        offered: u64,
        /// `node-1: 2, node-2: 4`.
        nodes: String,
    },
}

/// Places every task of `p` on `opts.nodes` by slot sharing (see the module docs): one
/// entry per task in ACK-set order, resource group `slot-<i>` (the slot group), transport
/// `local-queue` or `quic`, state binding `redb:<state_dir>/<vertex>/<subtask>.redb`.
///
/// # Errors
/// [`PlacementError::NoNodes`]; [`PlacementError::NotEnoughSlots`] when the nodes offer
/// fewer slots than the largest parallelism of the plan.
pub fn deployment_plan(
    p: &PartitionedPlan,
    opts: &DeploymentOptions,
) -> Result<DeploymentPlan, PlacementError> {
    if opts.nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    let groups = p.vertices.iter().map(|v| v.parallelism).max().unwrap_or(0);
    let offered: u64 = opts.nodes.iter().map(|n| u64::from(n.slots)).sum();
    if u64::from(groups) > offered {
        return Err(PlacementError::NotEnoughSlots {
            needed: u64::from(groups),
            offered,
            nodes: opts
                .nodes
                .iter()
                .map(|n| format!("{}: {}", n.node, n.slots))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // Slot group i -> node: round-robin over the nodes with slots left.
    let mut left: Vec<u32> = opts.nodes.iter().map(|n| n.slots).collect();
    let mut group_node = Vec::with_capacity(groups as usize);
    let mut next = 0usize;
    for _ in 0..groups {
        while left[next % left.len()] == 0 {
            next += 1;
        }
        let n = next % left.len();
        left[n] -= 1;
        group_node.push(n);
        next += 1;
    }
    let node_of = |t: &TaskId| group_node[t.subtask.0 as usize];
    // Tasks with a channel to another node.
    let mut remote: BTreeMap<&TaskId, bool> = p.ack_set.iter().map(|t| (t, false)).collect();
    for e in &p.edges {
        let (Some(from), Some(to)) = (p.vertex(&e.from), p.vertex(&e.to)) else {
            continue;
        };
        for c in &e.channels {
            let (Some(up), Some(down)) = (
                from.subtasks.get(c.upstream.0 as usize),
                to.subtasks.get(c.downstream.0 as usize),
            ) else {
                continue;
            };
            if node_of(&up.task) != node_of(&down.task) {
                remote.insert(&up.task, true);
                remote.insert(&down.task, true);
            }
        }
    }
    let dir = opts.state_dir.trim_end_matches('/');
    Ok(DeploymentPlan {
        plan_fingerprint: p.fingerprint.clone(),
        backend: opts.backend.clone(),
        tasks: p
            .ack_set
            .iter()
            .map(|t| TaskDeployment {
                task: t.clone(),
                node: opts.nodes[node_of(t)].node.clone(),
                resource_group: format!("slot-{}", t.subtask.0),
                transport: if remote.get(t).copied().unwrap_or(false) {
                    "quic".into()
                } else {
                    "local-queue".into()
                },
                state_backend: format!("redb:{dir}/{}/{}.redb", t.vertex, t.subtask),
            })
            .collect(),
        checkpoint_storage: opts.checkpoint_storage.clone(),
    })
}

impl DeploymentPlan {
    /// The node `task` is placed on.
    pub fn node_of(&self, task: &TaskId) -> Option<&str> {
        self.tasks
            .iter()
            .find(|t| &t.task == task)
            .map(|t| t.node.as_str())
    }

    /// The nodes that hold at least one task, in placement order of their first task.
    pub fn nodes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for t in &self.tasks {
            if !out.contains(&t.node.as_str()) {
                out.push(&t.node);
            }
        }
        out
    }
}
