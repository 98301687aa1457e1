//! nop-stream's cluster processes (design §2.5): the coordinator and the node, built on the
//! coordinator role of `nop-stream-coordinator` (written once for both modes), the task
//! host of `nop-stream-task`, and the QUIC foundation of `nop-stream-cluster`.
//!
//! - [`coordinator`]: [`ClusterCoordinator`], the coordinator process: plugin registry
//!   ([`store::PluginStore`]), job store ([`store::JobStore`]), node hub ([`hub::NodeHub`])
//!   and one thread per job running the epoch and recovery loops over
//!   [`workers::ClusterWorkers`].
//! - [`node`]: [`NodeHost`], the node process: prepares, starts, commands and fences task
//!   attempts; fetches components by hash; forwards task events.
//! - [`transport`]: the node's runtime `Transport`: in-process queues between its own
//!   subtasks, one QUIC stream per channel to other nodes.
//!
//! # Deployment in two phases
//!
//! A generation is placed by slot sharing ([`nop_stream_core::deployment_plan`]), then
//! every node of the placement *prepares* its share (fences older generations, loads the
//! components, connects to its peers, registers every receiving channel, builds the
//! tasks), and only then does every node *start* its tasks. So no producer opens a stream
//! before its receiver is registered.
//!
//! # What a cluster assumes of its storage
//!
//! Checkpoint storage is a location every process reaches (`nop-stream-storage`): a
//! directory on one machine or a shared file system, or an S3-compatible object store
//! across machines. The job's directory (its input grants) and its output directory are
//! paths where the tasks that use them run.

pub mod coordinator;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod ha;
pub mod hub;
pub mod node;
pub mod platform;
pub mod store;
pub mod transport;
pub mod workers;

pub use coordinator::{ClusterCoordinator, ClusterOptions};
pub use node::{NodeHost, NodeOptions};
pub use workers::{ClusterWorkers, WorkerTimeouts};

use nop_stream_cluster::Identity;
use nop_stream_core::{DeploymentOptions, NodeSlots, PartitionedPlan};

/// Task slots a node offers unless told otherwise (`nopstream node --slots`): slot groups
/// it holds, one subtask of each vertex per group.
pub const DEFAULT_SLOTS: u32 = 4;

/// Placement options for `plan` on cluster nodes given as `(node-<id>, slots)`, in node id
/// order whatever the order given; state bindings name the node's data directory
/// (`$NODE_DATA/jobs/<job>/state`), checkpoint storage the namespace `checkpoints` in the
/// cluster's checkpoint root.
pub fn placement_options(
    plan: &PartitionedPlan,
    nodes: impl IntoIterator<Item = (String, u32)>,
    checkpoints: &str,
) -> DeploymentOptions {
    let mut nodes: Vec<(String, u32)> = nodes.into_iter().collect();
    nodes.sort_by_key(|(n, _)| match n.parse::<Identity>() {
        Ok(Identity::Node(id)) => (id.0, n.clone()),
        _ => (u32::MAX, n.clone()),
    });
    DeploymentOptions {
        backend: "cluster".into(),
        nodes: nodes
            .into_iter()
            .map(|(node, slots)| NodeSlots { node, slots })
            .collect(),
        state_dir: format!(
            "$NODE_DATA/jobs/{}/state",
            nop_stream_coordinator::restore::path_component(plan.job.job_id.as_str())
        ),
        checkpoint_storage: checkpoints.to_owned(),
    }
}
