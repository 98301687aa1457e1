//! The node session (design §2.5, "Control plane"): the first stream a node opens to the
//! coordinator carries a [`Hello`], answered by a [`Welcome`] granting a lease; after that
//! the node renews the lease with [`Heartbeat`]s on the same stream and the coordinator
//! answers each with a [`HeartbeatAck`] or ends the session with a [`SessionEnd`].

use serde::{Deserialize, Serialize};

/// Version of the node protocol this build speaks. A hello carrying another version is
/// refused with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;

/// A node's first frame on its session stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the node.
    pub protocol_version: u32,
    /// The identity the node claims (`node-<id>`); checked against its certificate.
    pub node: String,
    /// Address the node's endpoint listens on for data connections from other nodes.
    pub data_addr: String,
    /// Task slots the node offers (subtasks it runs at once).
    pub slots: u32,
}

/// The coordinator's answer to an accepted [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// [`PROTOCOL_VERSION`] of the coordinator.
    pub protocol_version: u32,
    /// The lease granted; every renewal names it.
    pub lease: u64,
    /// Lease time to live, ms: without a renewal acknowledged within it the coordinator
    /// considers the node gone.
    pub ttl_ms: u64,
    /// Interval between the node's heartbeats, ms.
    pub heartbeat_ms: u64,
}

/// A lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The lease renewed.
    pub lease: u64,
    /// Sequence number of this renewal, increasing per session.
    pub seq: u64,
}

/// The coordinator renewed the lease up to the renewal `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The lease.
    pub lease: u64,
    /// The renewal acknowledged.
    pub seq: u64,
}

/// Why the coordinator ends a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEnd {
    /// The reason, naming the node and what it did (for its log).
    pub reason: String,
}

/// What the coordinator sends on a session stream after the welcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinatorFrame {
    /// A renewal was accepted.
    Ack(HeartbeatAck),
    /// The session is over (lease expired or refused); the node stops its tasks.
    End(SessionEnd),
}
