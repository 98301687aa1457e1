//! Node sessions (design §2.5, "Control plane" and "Leases"): the coordinator's registry of
//! nodes with their leases, the coordinator's accept loop, and the node's side of the
//! session that keeps its lease renewed and stops its tasks when it cannot.
//!
//! A node opens one bidirectional session stream to the coordinator on the node protocol
//! and sends a [`Hello`]; the coordinator checks the protocol version and that the claimed
//! identity is the one its certificate names, grants a lease and answers with a
//! [`Welcome`]. The node then sends a [`Heartbeat`] every `heartbeat_ms`; each accepted
//! renewal is acknowledged. A node stops its tasks once no renewal was acknowledged for
//! `ttl − margin` counted from the renewal's send time ([`NodeLease`]), which is before the
//! coordinator's own view of the lease can expire; it then registers again as new
//! capacity. CLI clients send one request per stream on the CLI protocol.

use crate::endpoint::{ClusterEndpoint, PeerConnection, TransportSettings, handshake};
use crate::identity::{Identity, NodeId};
use crate::lease::{LeaseConfig, LeaseId, LeaseTable, NodeLease, NodeLeaseStatus, RenewalSeq};
use crate::pki::load_credentials;
use crate::tls::Protocol;
use nop_stream_proto::codec::MAX_CONTROL_FRAME;
use nop_stream_proto::session::{
    CoordinatorFrame, Heartbeat, HeartbeatAck, Hello, PROTOCOL_VERSION, SessionEnd, Welcome,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a peer may take to send its first frame after the handshake.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

const MAX_FRAME: u32 = MAX_CONTROL_FRAME as u32;

/// Why a session or a request failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Certificates could not be loaded.
    #[error(transparent)]
    Pki(#[from] crate::pki::PkiError),
    /// The endpoint could not be set up.
    #[error(transparent)]
    Endpoint(#[from] crate::endpoint::EndpointError),
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] crate::endpoint::ConnectError),
    /// The peer broke the protocol or went away.
    #[error("{peer}: {message}")]
    Protocol {
        /// Who.
        peer: String,
        /// What happened.
        message: String,
    },
}

fn protocol_err(peer: impl std::fmt::Display, message: impl Into<String>) -> SessionError {
    SessionError::Protocol {
        peer: peer.to_string(),
        message: message.into(),
    }
}

/// A request of the CLI protocol, one per stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CliRequest {
    /// The registered nodes and their leases.
    ClusterStatus,
}

/// The answer to a [`CliRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CliResponse {
    /// Every node that ever registered with this coordinator process.
    Status(Vec<NodeStatus>),
    /// The request was refused.
    Error(String),
}

/// One node as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `node-<id>`.
    pub node: String,
    /// Its current (or last) lease.
    pub lease: u64,
    /// Whether the lease is live now.
    pub live: bool,
    /// Address it serves data connections on.
    pub data_addr: String,
    /// Task slots it offers.
    pub slots: u32,
    /// Registrations so far (1 + re-registrations).
    pub registrations: u32,
    /// Renewals accepted under the current lease.
    pub renewals: u64,
    /// Renewals refused (stale or expired lease) over all sessions.
    pub refused_renewals: u64,
    /// Leases of this node that expired.
    pub expirations: u32,
}

#[derive(Debug)]
struct NodeEntry {
    status: NodeStatus,
}

/// The coordinator's registry of nodes: the lease table plus what each node said.
#[derive(Debug, Clone)]
pub struct NodeRegistry {
    inner: Arc<Mutex<RegistryInner>>,
}

#[derive(Debug)]
struct RegistryInner {
    started: Instant,
    leases: LeaseTable,
    nodes: BTreeMap<NodeId, NodeEntry>,
}

impl NodeRegistry {
    /// An empty registry whose leases last `ttl`.
    pub fn new(ttl: Duration) -> Self {
        NodeRegistry {
            inner: Arc::new(Mutex::new(RegistryInner {
                started: Instant::now(),
                leases: LeaseTable::new(ttl),
                nodes: BTreeMap::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `node` (a hello was accepted) and grants it a fresh lease; a lease it held
    /// before is replaced and no longer renewable.
    pub fn register(&self, node: NodeId, hello: &Hello) -> LeaseId {
        let mut g = self.lock();
        let now = g.started.elapsed();
        let grant = g.leases.grant(node, now);
        let e = g.nodes.entry(node).or_insert_with(|| NodeEntry {
            status: NodeStatus {
                node: Identity::Node(node).label(),
                lease: 0,
                live: true,
                data_addr: String::new(),
                slots: 0,
                registrations: 0,
                renewals: 0,
                refused_renewals: 0,
                expirations: 0,
            },
        });
        e.status.lease = grant.lease.id.0;
        e.status.data_addr = hello.data_addr.clone();
        e.status.slots = hello.slots;
        e.status.registrations += 1;
        e.status.renewals = 0;
        if let Some(old) = grant.replaced {
            tracing::info!(%node, old = %old.id, new = %grant.lease.id, "node registered again; its old lease is void");
        } else {
            tracing::info!(%node, lease = %grant.lease.id, "node registered");
        }
        grant.lease.id
    }

    /// Renews `node`'s lease `lease`.
    ///
    /// # Errors
    /// The lease is unknown, replaced or already expired; the refusal is counted.
    pub fn renew(&self, node: NodeId, lease: LeaseId) -> Result<(), crate::lease::RenewError> {
        let mut g = self.lock();
        let now = g.started.elapsed();
        let r = g.leases.renew(node, lease, now);
        if let Some(e) = g.nodes.get_mut(&node) {
            match &r {
                Ok(_) => e.status.renewals += 1,
                Err(_) => e.status.refused_renewals += 1,
            }
        }
        r.map(|_| ())
    }

    /// Expires every lease past its TTL; returns the nodes whose lease expired now.
    pub fn expire(&self) -> Vec<NodeId> {
        let mut g = self.lock();
        let now = g.started.elapsed();
        let gone = g.leases.expire(now);
        let mut out = Vec::new();
        for l in gone {
            if let Some(e) = g.nodes.get_mut(&l.node) {
                e.status.expirations += 1;
            }
            tracing::warn!(node = %l.node, lease = %l.id, "lease expired: the node is considered gone");
            out.push(l.node);
        }
        out
    }

    /// Every node, with its lease's liveness now.
    pub fn status(&self) -> Vec<NodeStatus> {
        let g = self.lock();
        let now = g.started.elapsed();
        g.nodes
            .iter()
            .map(|(id, e)| {
                let mut s = e.status.clone();
                s.live = g.leases.get(*id).is_some_and(|l| l.id.0 == s.lease)
                    && g.leases.is_live(*id, now);
                s
            })
            .collect()
    }
}

/// Settings of a coordinator process.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// UDP address to serve on.
    pub listen: SocketAddr,
    /// Certificates directory (`nopstream cluster init`).
    pub certs: PathBuf,
    /// Data directory (jobs, plugin registry, epoch logs).
    pub data: PathBuf,
    /// Lease timing given to nodes.
    pub lease: LeaseConfig,
}

async fn read_value<T: serde::de::DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    peer: &str,
) -> Result<Option<T>, SessionError> {
    crate::frame::read_value(recv, MAX_FRAME)
        .await
        .map_err(|e| protocol_err(peer, e.to_string()))
}

async fn write_value<T: Serialize>(
    send: &mut quinn::SendStream,
    value: &T,
    peer: &str,
) -> Result<(), SessionError> {
    crate::frame::write_value(send, value, MAX_FRAME)
        .await
        .map_err(|e| protocol_err(peer, e.to_string()))
}

/// A running coordinator: its endpoint's address and its node registry.
#[derive(Debug)]
pub struct Coordinator {
    /// The address the endpoint is bound to.
    pub addr: SocketAddr,
    /// The node registry.
    pub registry: NodeRegistry,
}

/// Binds the coordinator's endpoint and serves node sessions and CLI requests until the
/// endpoint is closed. Leases are swept every 100 ms.
///
/// # Errors
/// Certificates or the endpoint cannot be set up.
pub async fn serve_coordinator(
    cfg: CoordinatorConfig,
    ready: impl FnOnce(&Coordinator),
) -> Result<(), SessionError> {
    cfg.lease
        .validate()
        .map_err(|e| protocol_err("coordinator", format!("lease settings: {e}")))?;
    std::fs::create_dir_all(&cfg.data)
        .map_err(|e| protocol_err(cfg.data.display(), e.to_string()))?;
    let creds = load_credentials(&cfg.certs, &Identity::Coordinator)?;
    let ep = ClusterEndpoint::bind(
        cfg.listen,
        &creds,
        &[Protocol::Node, Protocol::Cli],
        &TransportSettings::default(),
    )?;
    let registry = NodeRegistry::new(cfg.lease.ttl);
    let addr = ep
        .local_addr()
        .map_err(|e| protocol_err("coordinator", e.to_string()))?;
    ready(&Coordinator {
        addr,
        registry: registry.clone(),
    });
    let sweeper = registry.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            sweeper.expire();
        }
    });
    while let Some(incoming) = ep.accept().await {
        let registry = registry.clone();
        let lease = cfg.lease;
        tokio::spawn(async move {
            let peer = incoming.remote_address();
            let pc = match handshake(incoming).await {
                Ok(pc) => pc,
                Err(e) => {
                    tracing::warn!(%peer, "connection refused: {e}");
                    return;
                }
            };
            let result = match pc.protocol {
                Protocol::Node => node_session(&pc, &registry, &lease).await,
                Protocol::Cli => cli_requests(&pc, &registry).await,
            };
            if let Err(e) = result {
                tracing::info!(peer = %pc.certified.label(), "session ended: {e}");
            }
        });
    }
    Ok(())
}

/// The coordinator's side of one node's session stream.
async fn node_session(
    pc: &PeerConnection,
    registry: &NodeRegistry,
    lease: &LeaseConfig,
) -> Result<(), SessionError> {
    let peer = pc.certified.label();
    let (mut send, mut recv) = tokio::time::timeout(HELLO_TIMEOUT, pc.connection.accept_bi())
        .await
        .map_err(|_| protocol_err(&peer, "sent no session stream in time"))?
        .map_err(|e| protocol_err(&peer, e.to_string()))?;
    let hello: Hello = tokio::time::timeout(HELLO_TIMEOUT, read_value(&mut recv, &peer))
        .await
        .map_err(|_| protocol_err(&peer, "sent no hello in time"))??
        .ok_or_else(|| protocol_err(&peer, "closed its session stream before the hello"))?;
    if hello.protocol_version != PROTOCOL_VERSION {
        let reason = format!(
            "{peer} speaks node protocol version {}, this coordinator speaks {PROTOCOL_VERSION}",
            hello.protocol_version
        );
        write_value(
            &mut send,
            &CoordinatorFrame::End(SessionEnd {
                reason: reason.clone(),
            }),
            &peer,
        )
        .await?;
        return Err(protocol_err(&peer, reason));
    }
    let claimed: Identity = hello.node.parse().map_err(|e| {
        protocol_err(
            &peer,
            format!("claims an invalid identity `{}`: {e}", hello.node),
        )
    })?;
    if let Err(e) = pc.check_claim(&claimed) {
        pc.refuse(&e);
        return Err(protocol_err(&peer, e.to_string()));
    }
    let Identity::Node(node) = claimed else {
        return Err(protocol_err(&peer, "only nodes open node sessions"));
    };
    let id = registry.register(node, &hello);
    write_value(
        &mut send,
        &Welcome {
            protocol_version: PROTOCOL_VERSION,
            lease: id.0,
            ttl_ms: lease.ttl.as_millis() as u64,
            heartbeat_ms: lease.heartbeat_interval.as_millis() as u64,
        },
        &peer,
    )
    .await?;
    loop {
        let Some(hb) = read_value::<Heartbeat>(&mut recv, &peer).await? else {
            return Err(protocol_err(&peer, "closed its session"));
        };
        match registry.renew(node, LeaseId(hb.lease)) {
            Ok(()) => {
                write_value(
                    &mut send,
                    &CoordinatorFrame::Ack(HeartbeatAck {
                        lease: hb.lease,
                        seq: hb.seq,
                    }),
                    &peer,
                )
                .await?;
            }
            Err(e) => {
                let reason = format!("renewal of lease-{} refused: {e}", hb.lease);
                tracing::warn!(node = %peer, "{reason}");
                write_value(
                    &mut send,
                    &CoordinatorFrame::End(SessionEnd {
                        reason: reason.clone(),
                    }),
                    &peer,
                )
                .await?;
                let _ = send.finish();
                return Err(protocol_err(&peer, reason));
            }
        }
    }
}

async fn cli_requests(pc: &PeerConnection, registry: &NodeRegistry) -> Result<(), SessionError> {
    let peer = pc.certified.label();
    loop {
        let (mut send, mut recv) = match pc.connection.accept_bi().await {
            Ok(s) => s,
            Err(_) => return Ok(()),
        };
        let Some(req) = read_value::<CliRequest>(&mut recv, &peer).await? else {
            continue;
        };
        let resp = match req {
            CliRequest::ClusterStatus => CliResponse::Status(registry.status()),
        };
        write_value(&mut send, &resp, &peer).await?;
        let _ = send.finish();
    }
}

/// Sends one CLI request to the coordinator at `addr` as `client` and returns the answer.
///
/// # Errors
/// Certificates, the connection or the exchange failed.
pub async fn cli_request(
    addr: SocketAddr,
    certs: &std::path::Path,
    client: &Identity,
    request: &CliRequest,
) -> Result<CliResponse, SessionError> {
    let creds = load_credentials(certs, client)?;
    let local: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal address");
    let ep = ClusterEndpoint::bind(local, &creds, &[], &TransportSettings::default())?;
    let pc = ep
        .connect(addr, &Identity::Coordinator, Protocol::Cli)
        .await?;
    let peer = "coordinator".to_owned();
    let (mut send, mut recv) = pc
        .connection
        .open_bi()
        .await
        .map_err(|e| protocol_err(&peer, e.to_string()))?;
    write_value(&mut send, request, &peer).await?;
    let _ = send.finish();
    let resp = read_value::<CliResponse>(&mut recv, &peer)
        .await?
        .ok_or_else(|| protocol_err(&peer, "closed the stream without an answer"))?;
    pc.connection.close(0u32.into(), b"done");
    ep.shutdown(Duration::from_millis(200)).await;
    Ok(resp)
}

/// Settings of a node process.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The coordinator's address.
    pub join: SocketAddr,
    /// This node's id (its certificate must name `node-<id>`).
    pub id: NodeId,
    /// Certificates directory.
    pub certs: PathBuf,
    /// Data directory (component cache, task state).
    pub data: PathBuf,
    /// UDP address to serve data connections on.
    pub listen: SocketAddr,
    /// Task slots offered.
    pub slots: u32,
}

/// What ended one registration of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOutcome {
    /// No renewal was acknowledged before the node-side deadline: the node stopped its tasks.
    LeaseLost {
        /// The lease lost.
        lease: u64,
    },
    /// The coordinator ended the session.
    Ended {
        /// Its reason.
        reason: String,
    },
}

/// Runs a node: registers with the coordinator, keeps its lease renewed, and on losing it
/// calls `stop_tasks` and registers again as new capacity. Returns only on a setup error.
///
/// # Errors
/// Certificates or the endpoint cannot be set up.
pub async fn serve_node(
    cfg: NodeConfig,
    mut stop_tasks: impl FnMut(&SessionOutcome),
) -> Result<(), SessionError> {
    std::fs::create_dir_all(&cfg.data)
        .map_err(|e| protocol_err(cfg.data.display(), e.to_string()))?;
    let me = Identity::Node(cfg.id);
    let creds = load_credentials(&cfg.certs, &me)?;
    let ep = ClusterEndpoint::bind(
        cfg.listen,
        &creds,
        &[Protocol::Node],
        &TransportSettings::default(),
    )?;
    let data_addr = ep
        .local_addr()
        .map_err(|e| protocol_err(me.label(), e.to_string()))?;
    loop {
        match node_session_once(&ep, &cfg, &me, data_addr).await {
            Ok(outcome) => {
                tracing::warn!(node = %me.label(), ?outcome, "stopping this node's tasks");
                stop_tasks(&outcome);
            }
            Err(e) => {
                tracing::warn!(node = %me.label(), "cannot register with the coordinator: {e}")
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn node_session_once(
    ep: &ClusterEndpoint,
    cfg: &NodeConfig,
    me: &Identity,
    data_addr: SocketAddr,
) -> Result<SessionOutcome, SessionError> {
    let peer = "coordinator".to_owned();
    let started = Instant::now();
    let pc = ep
        .connect(cfg.join, &Identity::Coordinator, Protocol::Node)
        .await?;
    let (mut send, mut recv) = pc
        .connection
        .open_bi()
        .await
        .map_err(|e| protocol_err(&peer, e.to_string()))?;
    let sent_at = started.elapsed();
    write_value(
        &mut send,
        &Hello {
            protocol_version: PROTOCOL_VERSION,
            node: me.label(),
            data_addr: data_addr.to_string(),
            slots: cfg.slots,
        },
        &peer,
    )
    .await?;
    let welcome: Welcome = tokio::time::timeout(HELLO_TIMEOUT, read_value(&mut recv, &peer))
        .await
        .map_err(|_| protocol_err(&peer, "sent no welcome in time"))??
        .ok_or_else(|| protocol_err(&peer, "closed the session before the welcome"))?;
    let ttl = Duration::from_millis(welcome.ttl_ms);
    let heartbeat = Duration::from_millis(welcome.heartbeat_ms);
    let lease_cfg = LeaseConfig {
        ttl,
        heartbeat_interval: heartbeat,
        safety_margin: (ttl / 4).max(Duration::from_millis(1)),
    };
    let lease = Arc::new(Mutex::new(
        NodeLease::new(LeaseId(welcome.lease), &lease_cfg, sent_at)
            .map_err(|e| protocol_err(&peer, format!("unusable lease settings: {e}")))?,
    ));
    tracing::info!(node = %me.label(), lease = welcome.lease, ttl_ms = welcome.ttl_ms, "registered");
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::channel::<String>(1);
    let acks = Arc::clone(&lease);
    let reader_peer = peer.clone();
    let reader = tokio::spawn(async move {
        loop {
            match read_value::<CoordinatorFrame>(&mut recv, &reader_peer).await {
                Ok(Some(CoordinatorFrame::Ack(a))) => {
                    let mut l = acks.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = l.renewal_acked(LeaseId(a.lease), RenewalSeq(a.seq));
                }
                Ok(Some(CoordinatorFrame::End(e))) => {
                    let _ = ended_tx.send(e.reason).await;
                    return;
                }
                Ok(None) => {
                    let _ = ended_tx
                        .send("the coordinator closed the session".into())
                        .await;
                    return;
                }
                Err(e) => {
                    let _ = ended_tx.send(e.to_string()).await;
                    return;
                }
            }
        }
    });
    let check = (heartbeat / 4).clamp(Duration::from_millis(10), Duration::from_millis(100));
    let mut next_beat = Duration::ZERO;
    let outcome = loop {
        let now = started.elapsed();
        if let NodeLeaseStatus::MustStop { .. } =
            lease.lock().unwrap_or_else(|p| p.into_inner()).status(now)
        {
            break SessionOutcome::LeaseLost {
                lease: welcome.lease,
            };
        }
        if now >= next_beat {
            next_beat = now + heartbeat;
            let seq = lease
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .renewal_sent(now);
            // A stalled write (partition) must not stop the deadline check: bound it.
            let hb = Heartbeat {
                lease: welcome.lease,
                seq: seq.0,
            };
            if let Ok(Err(e)) =
                tokio::time::timeout(check, write_value(&mut send, &hb, &peer)).await
            {
                tracing::debug!("heartbeat not sent: {e}");
            }
        }
        tokio::select! {
            reason = ended_rx.recv() => {
                break SessionOutcome::Ended { reason: reason.unwrap_or_default() };
            }
            _ = tokio::time::sleep(check) => {}
        }
    };
    reader.abort();
    pc.connection.close(0u32.into(), b"session over");
    Ok(outcome)
}
