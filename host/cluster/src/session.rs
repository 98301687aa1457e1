//! Node sessions and CLI requests (design §2.5, "Control plane" and "Leases"): the
//! machinery both processes share, with the decisions left to a service.
//!
//! A node opens one bidirectional session stream to the coordinator and sends a
//! [`Hello`]; the coordinator checks the protocol version and that the claimed identity is
//! the one its certificate names, grants a lease and answers with a [`Welcome`]. From then
//! on the node sends [`NodeFrame`]s (a [`Heartbeat`] every `heartbeat_ms`, its tasks'
//! events, replies, counters) and the coordinator pushes [`CoordinatorFrame`]s (renewal
//! acks, requests, task commands, fences). A node stops its tasks once no renewal was
//! acknowledged for `ttl − margin` counted from the renewal's send time ([`NodeLease`]),
//! which is before the coordinator's own view of the lease can expire; it then registers
//! again as new capacity. Requests a node makes (a component by hash) and CLI requests
//! travel one per bidirectional stream.
//!
//! [`serve_coordinator`] runs the coordinator's endpoint for a [`CoordinatorService`];
//! [`serve_node`] runs a node's for a [`NodeService`]. Services are called from async
//! tasks: methods that may block (`node_request`, `cli_request`) run on tokio's blocking
//! pool; the others must return at once.

use crate::endpoint::{ClusterEndpoint, PeerConnection, TransportSettings, handshake};
use crate::identity::{Identity, NodeId};
use crate::lease::{
    Claim, LeaseConfig, LeaseId, LeaseTable, NodeLease, NodeLeaseStatus, RenewalSeq,
};
use crate::pki::load_credentials;
use crate::tls::Protocol;
use nop_stream_proto::cli::{CliRequest, CliResponse, MAX_UPLOAD_FRAME, NodeStatus};
use nop_stream_proto::codec::MAX_CONTROL_FRAME;
use nop_stream_proto::session::{
    ComponentFrame, CoordinatorFrame, Heartbeat, HeartbeatAck, Hello, HelloReply, LeaderHint,
    NodeFrame, NodeRequestFrame, PROTOCOL_VERSION, SessionEnd, Stamped, Welcome,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long a peer may take to send its first frame after the handshake.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a node waits for the coordinator's answer to its hello. The coordinator may
/// hold a registration for 1.5 heartbeat intervals while it finds out whether another
/// process holds the node's lease.
pub const WELCOME_TIMEOUT: Duration = Duration::from_secs(30);

const MAX_FRAME: u32 = MAX_CONTROL_FRAME as u32;
/// Cap on a component frame a node fetches: the upload cap plus the encoding's overhead.
const MAX_COMPONENT_FRAME: u32 = (MAX_UPLOAD_FRAME + 1024) as u32;

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
    Connect(crate::endpoint::ConnectError),
    /// A certificate was refused, ours by `peer` or `peer`'s by us (see
    /// [`crate::refusal`]): unknown CA, expired, not yet valid, wrong role, wrong name.
    #[error("{peer}: {refusal}")]
    Refused {
        /// Who (an address or an identity).
        peer: String,
        /// What was refused, and why.
        refusal: crate::refusal::CertRefusal,
    },
    /// The coordinator refused the node's hello (another process holds the node id, an
    /// incompatible protocol version).
    #[error("{peer} refused the hello: {reason}")]
    HelloRefused {
        /// Who.
        peer: String,
        /// The coordinator's reason.
        reason: String,
    },
    /// The coordinator is a standby; `hint` names the leader it knows of.
    #[error("coordinator at {peer} is a standby (leader: {})", hint.leader.as_deref().unwrap_or("none yet"))]
    NotLeader {
        /// The standby's address.
        peer: String,
        /// Who leads.
        hint: LeaderHint,
    },
    /// The peer broke the protocol or went away.
    #[error("{peer}: {message}")]
    Protocol {
        /// Who.
        peer: String,
        /// What happened.
        message: String,
    },
}

impl From<crate::endpoint::ConnectError> for SessionError {
    fn from(e: crate::endpoint::ConnectError) -> Self {
        let peer = match &e {
            crate::endpoint::ConnectError::Dial { peer, .. }
            | crate::endpoint::ConnectError::Handshake { peer, .. } => peer.to_string(),
            crate::endpoint::ConnectError::Identity(_) => "the peer".to_owned(),
        };
        match e.refusal() {
            Some(refusal) => SessionError::Refused { peer, refusal },
            None => SessionError::Connect(e),
        }
    }
}

impl SessionError {
    /// The certificate refusal this error is, if it is one.
    pub fn refusal(&self) -> Option<&crate::refusal::CertRefusal> {
        match self {
            SessionError::Refused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }
}

/// A frame error as a session error: a connection lost to a certificate refusal is
/// [`SessionError::Refused`], so the reason reaches the side refused (quinn reports it only
/// as "connection lost").
fn frame_err(peer: &str, e: crate::frame::FrameError) -> SessionError {
    use crate::frame::FrameError;
    let lost = match &e {
        FrameError::Read(quinn::ReadError::ConnectionLost(c))
        | FrameError::Write(quinn::WriteError::ConnectionLost(c)) => Some(c),
        _ => None,
    };
    match lost.and_then(crate::refusal::classify) {
        Some(refusal) => SessionError::Refused {
            peer: peer.to_owned(),
            refusal,
        },
        None => match lost {
            Some(c) => protocol_err(peer, format!("{e}: {c}")),
            None => protocol_err(peer, e.to_string()),
        },
    }
}

/// A lost connection as a session error, [`SessionError::Refused`] for a certificate
/// refusal.
fn connection_err(peer: &str, e: &quinn::ConnectionError) -> SessionError {
    match crate::refusal::classify(e) {
        Some(refusal) => SessionError::Refused {
            peer: peer.to_owned(),
            refusal,
        },
        None => protocol_err(peer, e.to_string()),
    }
}

fn protocol_err(peer: impl std::fmt::Display, message: impl Into<String>) -> SessionError {
    SessionError::Protocol {
        peer: peer.to_string(),
        message: message.into(),
    }
}

async fn read_value<T: serde::de::DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    peer: &str,
    max: u32,
) -> Result<Option<T>, SessionError> {
    crate::frame::read_value(recv, max)
        .await
        .map_err(|e| frame_err(peer, e))
}

async fn write_value<T: Serialize>(
    send: &mut quinn::SendStream,
    value: &T,
    peer: &str,
    max: u32,
) -> Result<(), SessionError> {
    crate::frame::write_value(send, value, max)
        .await
        .map_err(|e| frame_err(peer, e))
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

    /// What a registration of `node` would find now (see [`LeaseTable::claim`]).
    pub fn claim(&self, node: NodeId, silence: Duration) -> Claim {
        let g = self.lock();
        g.leases.claim(node, g.started.elapsed(), silence)
    }

    /// Counts a registration of `node` refused because another process holds its lease.
    pub fn refused_registration(&self, node: NodeId) {
        if let Some(e) = self.lock().nodes.get_mut(&node) {
            e.status.refused_registrations += 1;
        }
    }

    /// Counts the end of one of `node`'s leases, whatever the cause.
    fn lost(&self, node: NodeId) {
        if let Some(e) = self.lock().nodes.get_mut(&node) {
            e.status.lost += 1;
        }
    }

    /// Registers `node` (a hello was accepted) and grants it a fresh lease; a lease it held
    /// before is replaced, no longer renewable, and returned so the caller ends it.
    pub fn register(&self, node: NodeId, hello: &Hello) -> (LeaseId, Option<LeaseId>) {
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
                renewals_total: 0,
                refused_renewals: 0,
                expirations: 0,
                lost: 0,
                refused_registrations: 0,
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
        (grant.lease.id, grant.replaced.map(|l| l.id))
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
                Ok(_) => {
                    e.status.renewals += 1;
                    e.status.renewals_total += 1;
                }
                Err(_) => e.status.refused_renewals += 1,
            }
        }
        r.map(|_| ())
    }

    /// Ends `node`'s lease `lease` at once (its session closed): it can no longer be
    /// renewed. `false` if it was not the node's current lease.
    pub fn release(&self, node: NodeId, lease: LeaseId) -> bool {
        self.lock().leases.release(node, lease).is_ok()
    }

    /// Expires every lease past its TTL; returns the nodes and leases that expired now.
    pub fn expire(&self) -> Vec<(NodeId, LeaseId)> {
        let mut g = self.lock();
        let now = g.started.elapsed();
        let gone = g.leases.expire(now);
        let mut out = Vec::new();
        for l in gone {
            if let Some(e) = g.nodes.get_mut(&l.node) {
                e.status.expirations += 1;
            }
            tracing::warn!(node = %l.node, lease = %l.id, "lease expired: the node is considered gone");
            out.push((l.node, l.id));
        }
        out
    }

    /// Whether `lease` is `node`'s current lease and live now.
    pub fn is_live(&self, node: NodeId, lease: LeaseId) -> bool {
        let g = self.lock();
        let now = g.started.elapsed();
        g.leases.get(node).is_some_and(|l| l.id == lease) && g.leases.is_live(node, now)
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

/// Sends frames on one node's session stream, in order. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SessionPush {
    tx: mpsc::UnboundedSender<CoordinatorFrame>,
}

impl SessionPush {
    /// Queues `frame`; `false` once the session has ended.
    pub fn send(&self, frame: CoordinatorFrame) -> bool {
        self.tx.send(frame).is_ok()
    }
}

/// Whether a coordinator process leads its cluster (design §14.5, "Coordinator HA").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordinatorRole {
    /// It leads under `term`: it registers nodes and stamps every frame with the term.
    Leader {
        /// The fencing token.
        term: u64,
    },
    /// It stands by: it answers every hello with the leader it knows of.
    Standby(LeaderHint),
}

/// What a coordinator does with its node sessions and CLI requests.
pub trait CoordinatorService: Send + Sync + 'static {
    /// Whether this process leads now, asked at every hello. Default: the only
    /// coordinator of its cluster, leading under term 0.
    fn role(&self) -> CoordinatorRole {
        CoordinatorRole::Leader { term: 0 }
    }

    /// `node` registered under `lease` (each registration gets a new lease); `push` sends
    /// frames on its session stream. Must return at once.
    fn node_up(&self, node: NodeId, lease: LeaseId, hello: &Hello, push: SessionPush);

    /// A frame of `node`'s session under `lease` other than a heartbeat (events, replies,
    /// counters). Must return at once.
    fn node_frame(&self, node: NodeId, lease: LeaseId, frame: NodeFrame);

    /// `node`'s lease `lease` is over: it expired, or its session ended. Called once per
    /// lease. Must return at once.
    fn node_down(&self, node: NodeId, lease: LeaseId, reason: &str);

    /// A request `node` made on a stream of its own (may block).
    fn node_request(&self, node: NodeId, request: NodeRequestFrame) -> ComponentFrame;

    /// A CLI request of `client` (may block).
    fn cli_request(&self, client: &Identity, request: CliRequest) -> CliResponse;
}

/// Settings of a coordinator process.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// UDP address to serve on.
    pub listen: SocketAddr,
    /// Certificates directory (`nopstream cluster init`).
    pub certs: PathBuf,
    /// Lease timing given to nodes.
    pub lease: LeaseConfig,
}

/// A running coordinator: its endpoint's address and its node registry.
#[derive(Debug, Clone)]
pub struct Coordinator {
    /// The address the endpoint is bound to.
    pub addr: SocketAddr,
    /// The node registry.
    pub registry: NodeRegistry,
}

/// Live sessions by node (lease, push, the node's address as the coordinator sees it),
/// so that an ended lease ends its session.
type Sessions = Arc<Mutex<BTreeMap<NodeId, (LeaseId, SessionPush, SocketAddr)>>>;

/// Tells the service that a lease is over, once per lease.
struct Downs<S> {
    service: Arc<S>,
    registry: NodeRegistry,
    sessions: Sessions,
    reported: Arc<Mutex<std::collections::BTreeSet<LeaseId>>>,
}

impl<S> Clone for Downs<S> {
    fn clone(&self) -> Self {
        Downs {
            service: Arc::clone(&self.service),
            registry: self.registry.clone(),
            sessions: Arc::clone(&self.sessions),
            reported: Arc::clone(&self.reported),
        }
    }
}

impl<S: CoordinatorService> Downs<S> {
    fn down(&self, node: NodeId, lease: LeaseId, reason: &str) {
        if !self
            .reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease)
        {
            return;
        }
        self.registry.release(node, lease);
        self.registry.lost(node);
        tracing::warn!(node = %Identity::Node(node).label(), %lease, "node lost: {reason}");
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((l, push, _)) = sessions.get(&node)
            && *l == lease
        {
            push.send(CoordinatorFrame::End(SessionEnd {
                reason: reason.to_owned(),
            }));
            sessions.remove(&node);
        }
        drop(sessions);
        self.service.node_down(node, lease, reason);
    }
}

/// Binds the coordinator's endpoint and serves node sessions, node requests and CLI
/// requests for `service` until the endpoint is closed. Leases are swept every 50 ms;
/// `ready` is called once the endpoint is bound.
///
/// # Errors
/// Lease settings, certificates or the endpoint cannot be set up.
pub async fn serve_coordinator<S: CoordinatorService>(
    cfg: CoordinatorConfig,
    service: Arc<S>,
    ready: impl FnOnce(&Coordinator),
) -> Result<(), SessionError> {
    cfg.lease
        .validate()
        .map_err(|e| protocol_err("coordinator", format!("lease settings: {e}")))?;
    let creds = load_credentials(&cfg.certs, &Identity::Coordinator)?;
    let ep = ClusterEndpoint::bind(
        cfg.listen,
        &creds,
        &[Protocol::Node, Protocol::Cli],
        &TransportSettings::for_lease(&cfg.lease),
    )?;
    let registry = NodeRegistry::new(cfg.lease.ttl);
    let addr = ep
        .local_addr()
        .map_err(|e| protocol_err("coordinator", e.to_string()))?;
    ready(&Coordinator {
        addr,
        registry: registry.clone(),
    });
    let downs = Downs {
        service: Arc::clone(&service),
        registry: registry.clone(),
        sessions: Arc::default(),
        reported: Arc::default(),
    };
    let sweeper = downs.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            for (node, lease) in sweeper.registry.expire() {
                sweeper.down(
                    node,
                    lease,
                    &format!("{lease} of {} expired", Identity::Node(node).label()),
                );
            }
        }
    });
    while let Some(incoming) = ep.accept().await {
        let downs = downs.clone();
        let lease = cfg.lease;
        tokio::spawn(async move {
            let peer = incoming.remote_address();
            let pc = match handshake(incoming).await {
                Ok(pc) => pc,
                Err(e) => {
                    match e.refusal() {
                        Some(r) => tracing::warn!(
                            %peer,
                            problem = r.problem.name(),
                            "refused a connection, {}: {}",
                            r.problem,
                            r.detail
                        ),
                        None => tracing::warn!(%peer, "connection refused: {e}"),
                    }
                    return;
                }
            };
            let result = match pc.protocol {
                Protocol::Node => node_session(&pc, &downs, &lease).await,
                Protocol::Cli => cli_requests(&pc, &downs.service).await,
            };
            if let Err(e) = result {
                tracing::info!(peer = %pc.certified.label(), "session ended: {e}");
            }
        });
    }
    Ok(())
}

/// The coordinator's side of one node's connection: its session stream, and one stream
/// per request it makes.
async fn node_session<S: CoordinatorService>(
    pc: &PeerConnection,
    downs: &Downs<S>,
    lease: &LeaseConfig,
) -> Result<(), SessionError> {
    let peer = pc.certified.label();
    let (mut send, mut recv) = tokio::time::timeout(HELLO_TIMEOUT, pc.connection.accept_bi())
        .await
        .map_err(|_| protocol_err(&peer, "sent no session stream in time"))?
        .map_err(|e| protocol_err(&peer, e.to_string()))?;
    let hello: Hello = tokio::time::timeout(HELLO_TIMEOUT, read_value(&mut recv, &peer, MAX_FRAME))
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
            &HelloReply::Refused(SessionEnd {
                reason: reason.clone(),
            }),
            &peer,
            MAX_FRAME,
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
    let term = match downs.service.role() {
        CoordinatorRole::Leader { term } => term,
        CoordinatorRole::Standby(hint) => {
            tracing::info!(node = %peer, leader = ?hint.leader, "standing by: node sent to the leader");
            write_value(&mut send, &HelloReply::NotLeader(hint), &peer, MAX_FRAME).await?;
            let _ = send.finish();
            let _ = tokio::time::timeout(HELLO_TIMEOUT, pc.connection.closed()).await;
            return Ok(());
        }
    };
    let addr = pc.remote_address();
    if let Some(reason) = held_elsewhere(downs, node, addr, lease).await {
        tracing::warn!(node = %peer, "{reason}");
        downs.registry.refused_registration(node);
        write_value(
            &mut send,
            &HelloReply::Refused(SessionEnd {
                reason: reason.clone(),
            }),
            &peer,
            MAX_FRAME,
        )
        .await?;
        let _ = send.finish();
        // The node closes once it has read the refusal; bounded in case it does not.
        let _ = tokio::time::timeout(HELLO_TIMEOUT, pc.connection.closed()).await;
        return Err(protocol_err(&peer, reason));
    }
    let (id, replaced) = downs.registry.register(node, &hello);
    if let Some(old) = replaced {
        // A restarted process: whatever ran under the old lease is lost now, not when the
        // old session's connection times out.
        downs.down(
            node,
            old,
            &format!("{peer} registered again from {addr}: its {old} is void"),
        );
    }
    write_value(
        &mut send,
        &HelloReply::Welcome(Welcome {
            protocol_version: PROTOCOL_VERSION,
            lease: id.0,
            ttl_ms: lease.ttl.as_millis() as u64,
            heartbeat_ms: lease.heartbeat_interval.as_millis() as u64,
            term,
        }),
        &peer,
        MAX_FRAME,
    )
    .await?;
    // One writer per session stream: acks, requests, commands and fences stay in order.
    let (tx, mut rx) = mpsc::unbounded_channel::<CoordinatorFrame>();
    let push = SessionPush { tx };
    let writer_peer = peer.clone();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            let end = matches!(frame, CoordinatorFrame::End(_));
            let stamped = Stamped { term, frame };
            if let Err(e) = write_value(&mut send, &stamped, &writer_peer, MAX_FRAME).await {
                tracing::debug!("session write failed: {e}");
                return;
            }
            if end {
                let _ = send.finish();
                return;
            }
        }
    });
    // Requests the node makes on streams of their own.
    let requests = {
        let conn = pc.connection.clone();
        let service = Arc::clone(&downs.service);
        let peer = peer.clone();
        tokio::spawn(async move {
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                let service = Arc::clone(&service);
                let peer = peer.clone();
                tokio::spawn(async move {
                    let Ok(Some(req)) =
                        read_value::<NodeRequestFrame>(&mut recv, &peer, MAX_FRAME).await
                    else {
                        return;
                    };
                    let answer =
                        tokio::task::spawn_blocking(move || service.node_request(node, req))
                            .await
                            .unwrap_or_else(|e| ComponentFrame::NotFound(e.to_string()));
                    if write_value(&mut send, &answer, &peer, MAX_COMPONENT_FRAME)
                        .await
                        .is_ok()
                    {
                        let _ = send.finish();
                    }
                });
            }
        })
    };
    downs
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(node, (id, push.clone(), addr));
    downs.service.node_up(node, id, &hello, push.clone());
    let ended = loop {
        let frame = match read_value::<NodeFrame>(&mut recv, &peer, MAX_FRAME).await {
            Ok(Some(f)) => f,
            Ok(None) => break "closed its session".to_owned(),
            Err(e) => break e.to_string(),
        };
        match frame {
            NodeFrame::Heartbeat(hb) => match downs.registry.renew(node, LeaseId(hb.lease)) {
                Ok(()) => {
                    push.send(CoordinatorFrame::Ack(HeartbeatAck {
                        lease: hb.lease,
                        seq: hb.seq,
                    }));
                }
                Err(e) => {
                    let reason = format!("renewal of lease-{} refused: {e}", hb.lease);
                    tracing::warn!(node = %peer, "{reason}");
                    push.send(CoordinatorFrame::End(SessionEnd {
                        reason: reason.clone(),
                    }));
                    break reason;
                }
            },
            other => downs.service.node_frame(node, id, other),
        }
    };
    downs.down(node, id, &format!("{peer}: {ended}"));
    drop(push);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    requests.abort();
    Err(protocol_err(&peer, ended))
}

/// Why a registration of `node` from `addr` must be refused: another process holds the
/// node's live lease and renews it (design §2.5, one process per node id). A lease whose
/// holder has been silent for 1.5 heartbeat intervals is a restarted node's old one, and
/// the registration may replace it; a lease heard from more recently is watched until
/// that much silence: renewed meanwhile, its holder is alive and the newcomer is refused,
/// naming both addresses. `None`: register.
async fn held_elsewhere<S: CoordinatorService>(
    downs: &Downs<S>,
    node: NodeId,
    addr: SocketAddr,
    lease: &LeaseConfig,
) -> Option<String> {
    let silence = lease.heartbeat_interval + lease.heartbeat_interval / 2;
    let Claim::Held {
        lease: held,
        heard_ago,
    } = downs.registry.claim(node, silence)
    else {
        return None;
    };
    tokio::time::sleep(silence.saturating_sub(heard_ago) + Duration::from_millis(20)).await;
    let Claim::Held {
        lease: now,
        heard_ago,
    } = downs.registry.claim(node, silence)
    else {
        return None;
    };
    let holder = downs
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&node)
        .filter(|(l, _, _)| *l == now.id)
        .map_or_else(
            || "an unknown address".to_owned(),
            |(_, _, a)| a.to_string(),
        );
    let what = if now.id == held.id {
        "renews it"
    } else {
        "registered meanwhile"
    };
    Some(format!(
        "{} is already registered from {holder} ({}, heard from {} ms ago), and that process \
         {what}: refusing a second registration of {} from {addr}; two processes claim \
         the same node id, stop one of them",
        Identity::Node(node).label(),
        now.id,
        heard_ago.as_millis(),
        Identity::Node(node).label(),
    ))
}

async fn cli_requests<S: CoordinatorService>(
    pc: &PeerConnection,
    service: &Arc<S>,
) -> Result<(), SessionError> {
    let peer = pc.certified.label();
    loop {
        let (mut send, mut recv) = match pc.connection.accept_bi().await {
            Ok(s) => s,
            Err(_) => return Ok(()),
        };
        let service = Arc::clone(service);
        let client = pc.certified.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            let resp =
                match read_value::<CliRequest>(&mut recv, &peer, MAX_UPLOAD_FRAME as u32).await {
                    Ok(Some(req)) => {
                        tokio::task::spawn_blocking(move || service.cli_request(&client, req))
                            .await
                            .unwrap_or_else(|e| CliResponse::Error(format!("request failed: {e}")))
                    }
                    Ok(None) => return,
                    Err(e) => CliResponse::Error(format!("bad request: {e}")),
                };
            if write_value(&mut send, &resp, &peer, MAX_FRAME)
                .await
                .is_ok()
            {
                let _ = send.finish();
            }
        });
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
        .map_err(|e| connection_err(&peer, &e))?;
    write_value(&mut send, request, &peer, MAX_UPLOAD_FRAME as u32).await?;
    let _ = send.finish();
    let resp = read_value::<CliResponse>(&mut recv, &peer, MAX_FRAME)
        .await?
        .ok_or_else(|| protocol_err(&peer, "closed the stream without an answer"))?;
    pc.connection.close(0u32.into(), b"done");
    ep.shutdown(Duration::from_millis(200)).await;
    Ok(resp)
}

/// Settings of a node process.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The coordinators' addresses (`HOST:PORT`, resolved at each attempt): the node
    /// registers with the first that answers, and follows a standby's answer to the
    /// leader.
    pub join: Vec<String>,
    /// The terms this node has seen, shared with its host (for its counters).
    pub terms: Arc<TermWatch>,
    /// This node's id (its certificate must name `node-<id>`).
    pub id: NodeId,
    /// Certificates directory.
    pub certs: PathBuf,
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
    /// The coordinator ended the session, or the connection to it broke.
    Ended {
        /// The reason.
        reason: String,
    },
}

/// The highest coordinator term a node has seen, and what it refused for being older
/// (design §14.5, "Coordinator HA": nodes refuse a term lower than the highest they saw).
#[derive(Debug, Default)]
pub struct TermWatch {
    highest: std::sync::atomic::AtomicU64,
    refused_welcomes: std::sync::atomic::AtomicU64,
    refused_frames: std::sync::atomic::AtomicU64,
}

impl TermWatch {
    /// Accepts `term` if it is at least the highest seen (raising it), else counts a
    /// refusal of a welcome (`welcome`) or a frame and returns `false`.
    pub fn accept(&self, term: u64, welcome: bool) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let prev = self.highest.fetch_max(term, SeqCst);
        if term >= prev {
            return true;
        }
        if welcome {
            self.refused_welcomes.fetch_add(1, SeqCst);
        } else {
            self.refused_frames.fetch_add(1, SeqCst);
        }
        false
    }

    /// The highest term seen.
    pub fn highest(&self) -> u64 {
        self.highest.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Welcomes refused for a stale term.
    pub fn refused_welcomes(&self) -> u64 {
        self.refused_welcomes
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Frames (requests, commands, fences) refused for a stale term.
    pub fn refused_frames(&self) -> u64 {
        self.refused_frames
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A node's line to the coordinator during one registration. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CoordinatorLink {
    /// The lease of this registration.
    pub lease: LeaseId,
    connection: quinn::Connection,
    out: mpsc::UnboundedSender<NodeFrame>,
}

impl CoordinatorLink {
    /// Queues `frame` on the session stream, after the frames queued before it; `false`
    /// once the session has ended.
    pub fn send(&self, frame: NodeFrame) -> bool {
        self.out.send(frame).is_ok()
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.out.is_closed()
    }

    /// Fetches the component with `sha256` from the coordinator's registry, on a stream
    /// of its own. The caller verifies the bytes against the hash.
    ///
    /// # Errors
    /// The exchange failed, or the registry has no such component.
    pub async fn fetch_component(&self, sha256: &str) -> Result<Vec<u8>, SessionError> {
        let peer = "coordinator";
        let (mut send, mut recv) = self
            .connection
            .open_bi()
            .await
            .map_err(|e| protocol_err(peer, e.to_string()))?;
        write_value(
            &mut send,
            &NodeRequestFrame::Component {
                sha256: sha256.to_owned(),
            },
            peer,
            MAX_FRAME,
        )
        .await?;
        let _ = send.finish();
        match read_value::<ComponentFrame>(&mut recv, peer, MAX_COMPONENT_FRAME).await? {
            Some(ComponentFrame::Bytes(b)) => Ok(b),
            Some(ComponentFrame::NotFound(m)) => Err(protocol_err(peer, m)),
            None => Err(protocol_err(peer, "closed the stream without an answer")),
        }
    }
}

/// What a node does with its sessions.
pub trait NodeService: Send + Sync + 'static {
    /// The endpoint is bound (called once, before any session).
    fn endpoint_ready(&self, endpoint: ClusterEndpoint);

    /// Registered under a new lease. Must return at once.
    fn session_up(&self, link: CoordinatorLink);

    /// A frame the coordinator pushed (requests, commands, fences). Must return at once.
    fn coordinator_frame(&self, frame: CoordinatorFrame);

    /// The registration is over (lease lost, or the session ended): stop every task. Must
    /// return at once.
    fn session_down(&self, outcome: &SessionOutcome);

    /// Another node connected (data channels). Must return at once.
    fn peer_connection(&self, pc: PeerConnection);
}

/// Runs a node for `service`: binds the endpoint, accepts data connections from other
/// nodes, registers with the coordinator and keeps the lease renewed; on losing it, tells
/// the service to stop its tasks and registers again as new capacity. Returns only on a
/// setup error.
///
/// # Errors
/// Certificates or the endpoint cannot be set up.
pub async fn serve_node<S: NodeService>(
    cfg: NodeConfig,
    service: Arc<S>,
) -> Result<(), SessionError> {
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
    service.endpoint_ready(ep.clone());
    {
        let ep = ep.clone();
        let service = Arc::clone(&service);
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let service = Arc::clone(&service);
                tokio::spawn(async move {
                    let peer = incoming.remote_address();
                    match handshake(incoming).await {
                        Ok(pc) if matches!(pc.certified, Identity::Node(_)) => {
                            service.peer_connection(pc)
                        }
                        Ok(pc) => {
                            tracing::warn!(%peer, who = %pc.certified.label(), "only nodes connect to a node");
                            pc.connection
                                .close(0u32.into(), b"only nodes connect to a node");
                        }
                        Err(e) => tracing::warn!(%peer, "connection refused: {e}"),
                    }
                });
            }
        });
    }
    let mut refusals = Refusals::default();
    let mut joins = JoinOrder::new(cfg.join.clone());
    loop {
        let (target, result) = match connect_first(&ep, &joins.targets()).await {
            Ok((target, pc)) => {
                joins.connected(&target);
                let result = node_session_once(pc, &cfg, &target, &me, data_addr, &service).await;
                (target, result)
            }
            Err((target, e)) => (target, Err(e)),
        };
        let pause = match result {
            Err(SessionError::NotLeader { hint, .. }) => {
                tracing::info!(node = %me.label(), coordinator = %target, leader = ?hint.leader, "a standby answered: following the leader");
                joins.redirected(hint.leader)
            }
            Ok(outcome) => {
                tracing::warn!(node = %me.label(), ?outcome, "registration over: stopping this node's tasks");
                service.session_down(&outcome);
                joins.session_ended(&target);
                refusals = Refusals::default();
                REGISTER_RETRY
            }
            Err(e) => match refusals.after(&e) {
                Retry::After(pause) => {
                    tracing::warn!(node = %me.label(), coordinator = %target, "cannot register with the coordinator: {e}");
                    joins.failed();
                    pause
                }
                Retry::GiveUp => {
                    tracing::error!(
                        node = %me.label(),
                        "certificate refused {} times in a row for a reason that cannot heal: {e}",
                        refusals.lasting
                    );
                    return Err(e);
                }
            },
        };
        tokio::time::sleep(pause).await;
    }
}

/// Dials every address of `targets` at once (each within [`JOIN_CONNECT_TIMEOUT`]) and
/// keeps the first connection whose handshake completes; the others are closed. A
/// coordinator that is down (its UDP port silent) so costs nothing while another answers.
///
/// # Errors
/// No handshake completed: the address and error of a refusal of this node's certificate
/// if there was one (so [`Refusals`] can back off or give up), else of the first target.
async fn connect_first(
    ep: &ClusterEndpoint,
    targets: &[String],
) -> Result<(String, PeerConnection), (String, SessionError)> {
    let mut dials = tokio::task::JoinSet::new();
    for (i, target) in targets.iter().enumerate() {
        let (ep, target) = (ep.clone(), target.clone());
        dials.spawn(async move {
            let dialled = async {
                let addr = tokio::net::lookup_host(&target)
                    .await
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| {
                        protocol_err(&target, "cannot resolve the coordinator's address")
                    })?;
                tokio::time::timeout(JOIN_CONNECT_TIMEOUT, ep.connect_control(addr))
                    .await
                    .map_err(|_| protocol_err(&target, "no handshake in time"))?
                    .map_err(SessionError::from)
            }
            .await;
            (i, target, dialled)
        });
    }
    let mut failures: Vec<(usize, String, SessionError)> = Vec::new();
    while let Some(done) = dials.join_next().await {
        let Ok((i, target, dialled)) = done else {
            continue;
        };
        match dialled {
            Ok(pc) => {
                dials.abort_all();
                // Handshakes that completed meanwhile end with their tasks' connections
                // (dropped, so closed); the coordinators see a client that went away.
                return Ok((target, pc));
            }
            Err(e) => failures.push((i, target, e)),
        }
    }
    failures.sort_by_key(|(i, _, e)| (!matches!(e, SessionError::Refused { .. }), *i));
    Err(failures
        .into_iter()
        .next()
        .map(|(_, t, e)| (t, e))
        .unwrap_or_else(|| {
            (
                String::new(),
                protocol_err("coordinator", "no coordinator address to join"),
            )
        }))
}

/// Which coordinators a node dials next: a standby's redirect alone, else every address
/// of the join list at once ([`connect_first`]), the next in turn first. Pure.
#[derive(Debug, Clone)]
pub struct JoinOrder {
    join: Vec<String>,
    next: usize,
    redirect: Option<String>,
    /// The coordinator whose session ended last, and how many standby answers naming it
    /// as the leader were set aside since.
    lost: Option<(String, u32)>,
}

/// Standby answers naming the coordinator a node just lost as the leader that the node
/// sets aside (dialling the whole list again instead, [`REGISTER_RETRY`] apart) before it
/// follows them: while the election lease of a leader that died runs out, the standbys
/// still name it, and dialling it alone would cost [`JOIN_CONNECT_TIMEOUT`]. Bounded, so
/// that a node whose session ended with a leader that still leads returns to it.
pub const LOST_LEADER_HINTS_SET_ASIDE: u32 = 10;

impl JoinOrder {
    /// Tries `join` in order (at least one address).
    pub fn new(join: Vec<String>) -> Self {
        JoinOrder {
            join,
            next: 0,
            redirect: None,
            lost: None,
        }
    }

    /// The addresses to dial now: the redirect alone, else the whole join list starting at
    /// the next in turn.
    pub fn targets(&self) -> Vec<String> {
        if let Some(r) = &self.redirect {
            return vec![r.clone()];
        }
        let n = self.join.len();
        (0..n)
            .map(|k| self.join[(self.next + k) % n].clone())
            .collect()
    }

    /// A handshake with `target` completed: it is the address in turn (unless it is the
    /// redirect), so that a failure after it moves on to the next.
    pub fn connected(&mut self, target: &str) {
        if self.redirect.as_deref() != Some(target)
            && let Some(i) = self.join.iter().position(|a| a == target)
        {
            self.next = i;
        }
    }

    /// The registration with `target` ended: that coordinator may be gone (its loss ended
    /// the lease), so the next dial is to the whole list again, not to it alone, and
    /// standbys naming it are set aside for a while ([`LOST_LEADER_HINTS_SET_ASIDE`]).
    pub fn session_ended(&mut self, target: &str) {
        self.redirect = None;
        self.lost = Some((target.to_owned(), 0));
    }

    /// The target failed: the next address of the list.
    pub fn failed(&mut self) {
        if self.redirect.take().is_none() {
            self.next = (self.next + 1) % self.join.len().max(1);
        }
    }

    /// A standby named the leader (or none yet): returns the pause before the next try.
    pub fn redirected(&mut self, leader: Option<String>) -> Duration {
        if let (Some(l), Some((lost, set_aside))) = (&leader, &mut self.lost)
            && l == lost
            && *set_aside < LOST_LEADER_HINTS_SET_ASIDE
        {
            *set_aside += 1;
            self.failed();
            return REGISTER_RETRY;
        }
        match leader {
            Some(l) if Some(&l) != self.redirect.as_ref() => {
                self.redirect = Some(l);
                Duration::from_millis(20)
            }
            _ => {
                self.failed();
                REGISTER_RETRY
            }
        }
    }
}

/// Longest a node waits for a coordinator's handshake before trying the next address.
pub const JOIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause before a node registers again after a session or a failure that was no refusal.
pub const REGISTER_RETRY: Duration = Duration::from_millis(200);
/// Longest pause between registrations the coordinator refuses.
pub const REFUSED_RETRY_MAX: Duration = Duration::from_secs(10);
/// Refusals in a row, for a reason that cannot heal (a certificate of another CA, expired,
/// of the wrong role or name), after which a node gives up and exits with the reason.
pub const MAX_LASTING_REFUSALS: u32 = 5;

/// What a node does after a failed registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Try again after this pause.
    After(Duration),
    /// Stop: the refusal cannot heal.
    GiveUp,
}

/// A node's count of refused registrations. Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Refusals in a row (certificate or hello).
    pub refused: u32,
    /// Certificate refusals in a row whose reason cannot heal.
    pub lasting: u32,
}

impl Refusals {
    /// Counts `e` and says what to do: a refused certificate or hello backs off
    /// exponentially ([`REGISTER_RETRY`] doubling to [`REFUSED_RETRY_MAX`]); the
    /// [`MAX_LASTING_REFUSALS`]th certificate refusal in a row for a reason that cannot
    /// heal gives up; any other failure (the coordinator unreachable) retries after
    /// [`REGISTER_RETRY`] and resets the counts.
    pub fn after(&mut self, e: &SessionError) -> Retry {
        let lasting = match e {
            SessionError::Refused { refusal, .. } => !refusal.problem.heals(),
            SessionError::HelloRefused { .. } => false,
            _ => {
                *self = Refusals::default();
                return Retry::After(REGISTER_RETRY);
            }
        };
        self.refused += 1;
        self.lasting = if lasting { self.lasting + 1 } else { 0 };
        if self.lasting >= MAX_LASTING_REFUSALS {
            return Retry::GiveUp;
        }
        let pause = REGISTER_RETRY
            .checked_mul(1u32.checked_shl(self.refused - 1).unwrap_or(u32::MAX))
            .unwrap_or(REFUSED_RETRY_MAX);
        Retry::After(pause.min(REFUSED_RETRY_MAX))
    }
}

/// The outcome of a registration whose session ended (the coordinator's `End`, or a broken
/// stream) at `now`: [`SessionOutcome::LeaseLost`] if the node's own deadline has passed
/// too. A node that was not scheduled past its deadline (stopped, starved) finds both at
/// once when it runs again, and which of its tasks ran first must not decide what it
/// reports.
fn ended(lease: &mut NodeLease, reason: String, now: Duration) -> SessionOutcome {
    match lease.status(now) {
        NodeLeaseStatus::MustStop { .. } => SessionOutcome::LeaseLost {
            lease: lease.id().0,
        },
        NodeLeaseStatus::Valid { .. } => SessionOutcome::Ended { reason },
    }
}

async fn node_session_once<S: NodeService>(
    pc: PeerConnection,
    cfg: &NodeConfig,
    target: &str,
    me: &Identity,
    data_addr: SocketAddr,
    service: &Arc<S>,
) -> Result<SessionOutcome, SessionError> {
    let peer = "coordinator".to_owned();
    let started = Instant::now();
    // No idle timeout of the node's own on this connection: the coordinator's, derived
    // from the lease TTL, applies, so a silent node is lost by its lease, never first by
    // the transport (design §2.5).
    let (mut send, mut recv) = pc
        .connection
        .open_bi()
        .await
        .map_err(|e| connection_err(&peer, &e))?;
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
        MAX_FRAME,
    )
    .await?;
    let reply: HelloReply =
        tokio::time::timeout(WELCOME_TIMEOUT, read_value(&mut recv, &peer, MAX_FRAME))
            .await
            .map_err(|_| protocol_err(&peer, "sent no welcome in time"))??
            .ok_or_else(|| protocol_err(&peer, "closed the session before the welcome"))?;
    let welcome = match reply {
        HelloReply::Welcome(w) => w,
        HelloReply::Refused(end) => {
            pc.connection.close(0u32.into(), b"refused");
            return Err(SessionError::HelloRefused {
                peer,
                reason: end.reason,
            });
        }
        HelloReply::NotLeader(hint) => {
            pc.connection.close(0u32.into(), b"standby");
            return Err(SessionError::NotLeader {
                peer: target.to_owned(),
                hint,
            });
        }
    };
    if !cfg.terms.accept(welcome.term, true) {
        pc.connection.close(0u32.into(), b"stale term");
        let reason = format!(
            "coordinator at {target} leads under term {}, but this node has seen term {}: \
             refusing a deposed leader",
            welcome.term,
            cfg.terms.highest()
        );
        tracing::warn!(node = %me.label(), "{reason}");
        return Err(SessionError::HelloRefused { peer, reason });
    }
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
    // One writer for the session stream: heartbeats, events, replies, counters.
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<NodeFrame>();
    let writer_peer = peer.clone();
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if let Err(e) = write_value(&mut send, &frame, &writer_peer, MAX_FRAME).await {
                tracing::debug!("session write failed: {e}");
                return;
            }
        }
    });
    let (ended_tx, mut ended_rx) = mpsc::channel::<String>(1);
    let acks = Arc::clone(&lease);
    let reader_peer = peer.clone();
    let reader_service = Arc::clone(service);
    let terms = Arc::clone(&cfg.terms);
    let reader = tokio::spawn(async move {
        loop {
            let frame = match read_value::<Stamped>(&mut recv, &reader_peer, MAX_FRAME).await {
                Ok(Some(s)) if !terms.accept(s.term, false) => {
                    let reason = format!(
                        "a frame of term {} arrived after term {}: the coordinator was \
                         deposed; refusing its frames",
                        s.term,
                        terms.highest()
                    );
                    tracing::warn!("{reason}");
                    let _ = ended_tx.send(reason).await;
                    return;
                }
                Ok(s) => Ok(s.map(|s| s.frame)),
                Err(e) => Err(e),
            };
            match frame {
                Ok(Some(CoordinatorFrame::Ack(a))) => {
                    let mut l = acks.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = l.renewal_acked(LeaseId(a.lease), RenewalSeq(a.seq));
                }
                Ok(Some(CoordinatorFrame::End(e))) => {
                    let _ = ended_tx.send(e.reason).await;
                    return;
                }
                Ok(Some(other)) => reader_service.coordinator_frame(other),
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
    service.session_up(CoordinatorLink {
        lease: LeaseId(welcome.lease),
        connection: pc.connection.clone(),
        out: out_tx.clone(),
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
            // Queued, never awaited: a stalled write (partition) cannot stop the deadline
            // check.
            let _ = out_tx.send(NodeFrame::Heartbeat(Heartbeat {
                lease: welcome.lease,
                seq: seq.0,
            }));
        }
        tokio::select! {
            reason = ended_rx.recv() => {
                let mut lease = lease.lock().unwrap_or_else(|p| p.into_inner());
                break ended(&mut lease, reason.unwrap_or_default(), started.elapsed());
            }
            _ = tokio::time::sleep(check) => {}
        }
    };
    reader.abort();
    writer.abort();
    pc.connection.close(0u32.into(), b"session over");
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_refuses_every_term_below_the_highest_it_has_seen() {
        // A deposed leader (SIGSTOPped past its lease, then resumed) must not command a
        // node that registered with its successor (design §14.5, "Coordinator HA").
        let t = TermWatch::default();
        assert!(t.accept(4, true), "a first leader");
        assert!(t.accept(4, false), "its frames");
        assert!(t.accept(9, true), "a successor");
        assert!(!t.accept(4, false), "a frame of the deposed leader");
        assert!(!t.accept(4, true), "a welcome of the deposed leader");
        assert!(t.accept(9, false));
        assert_eq!(
            (t.highest(), t.refused_welcomes(), t.refused_frames()),
            (9, 1, 1)
        );
    }

    #[test]
    fn a_node_follows_a_standby_to_the_leader_and_moves_on_after_failures() {
        let mut j = JoinOrder::new(vec!["a:1".into(), "b:1".into(), "c:1".into()]);
        assert_eq!(j.targets()[0], "a:1");
        // a is a standby naming c.
        assert!(j.redirected(Some("c:1".into())) < REGISTER_RETRY);
        assert_eq!(j.targets()[0], "c:1");
        // c died: back to the list where it was.
        j.failed();
        assert_eq!(j.targets()[0], "a:1");
        // a knows no leader yet (an election in progress): the next address, after a pause.
        assert_eq!(j.redirected(None), REGISTER_RETRY);
        assert_eq!(j.targets()[0], "b:1");
        // b names itself while it starts leading: b again, after a pause.
        assert!(j.redirected(Some("b:1".into())) < REGISTER_RETRY);
        assert_eq!(j.redirected(Some("b:1".into())), REGISTER_RETRY);
        assert_eq!(j.targets()[0], "b:1");
        j.failed();
        assert_eq!(j.targets()[0], "c:1");
    }

    #[test]
    fn a_node_dials_the_whole_list_unless_a_standby_named_the_leader() {
        let mut j = JoinOrder::new(vec!["a:1".into(), "b:1".into(), "c:1".into()]);
        assert_eq!(j.targets(), ["a:1", "b:1", "c:1"]);
        // b answered first and named c: c alone.
        j.connected("b:1");
        assert!(j.redirected(Some("c:1".into())) < REGISTER_RETRY);
        assert_eq!(j.targets(), ["c:1"]);
        j.connected("c:1");
        // The session with c ended (c may be dead): the whole list again, b (the last in
        // turn) first, and c with the others rather than alone.
        j.session_ended("c:1");
        assert_eq!(j.targets(), ["b:1", "c:1", "a:1"]);
        // A failure moves on from the address in turn.
        j.failed();
        assert_eq!(j.targets(), ["c:1", "a:1", "b:1"]);
        // Standbys still naming c (its election lease not yet run out) are set aside: the
        // whole list again after a pause, a bounded number of times.
        for _ in 0..LOST_LEADER_HINTS_SET_ASIDE {
            assert_eq!(j.redirected(Some("c:1".into())), REGISTER_RETRY);
            assert_eq!(j.targets().len(), 3);
        }
        // Then c is followed (it may lead still: the session ended for another reason).
        assert!(j.redirected(Some("c:1".into())) < REGISTER_RETRY);
        assert_eq!(j.targets(), ["c:1"]);
        // Another leader named is followed at once.
        j.session_ended("c:1");
        assert!(j.redirected(Some("a:1".into())) < REGISTER_RETRY);
        assert_eq!(j.targets(), ["a:1"]);
    }

    #[test]
    fn refusals_back_off_and_give_up_only_when_they_cannot_heal() {
        use crate::refusal::{CertProblem, CertRefusal, Whose};
        let refused = |problem| SessionError::Refused {
            peer: "coordinator".into(),
            refusal: CertRefusal {
                problem,
                whose: Whose::Ours,
                detail: String::new(),
            },
        };
        let mut r = Refusals::default();
        let pauses: Vec<Retry> = (0..4)
            .map(|_| r.after(&refused(CertProblem::UnknownCa)))
            .collect();
        assert_eq!(
            pauses,
            [200, 400, 800, 1600].map(|ms| Retry::After(Duration::from_millis(ms)))
        );
        assert_eq!(r.after(&refused(CertProblem::Expired)), Retry::GiveUp);
        // Not yet valid heals with time: it backs off to the cap but never gives up.
        let mut r = Refusals::default();
        let last = (0..20)
            .map(|_| r.after(&refused(CertProblem::NotYetValid)))
            .last();
        assert_eq!(last, Some(Retry::After(REFUSED_RETRY_MAX)));
        // Another process holding the node id: back off, never give up.
        let mut r = Refusals::default();
        let hello = SessionError::HelloRefused {
            peer: "coordinator".into(),
            reason: "two processes".into(),
        };
        assert!((0..20).all(|_| matches!(r.after(&hello), Retry::After(_))));
        // The coordinator unreachable: the counts start over.
        let mut r = Refusals::default();
        for _ in 0..4 {
            r.after(&refused(CertProblem::UnknownCa));
        }
        assert_eq!(
            r.after(&protocol_err("coordinator", "timed out")),
            Retry::After(REGISTER_RETRY)
        );
        assert_eq!(r, Refusals::default());
    }

    #[test]
    fn a_session_ended_past_the_node_deadline_is_a_lost_lease() {
        let cfg = LeaseConfig {
            ttl: Duration::from_millis(2000),
            heartbeat_interval: Duration::from_millis(300),
            safety_margin: Duration::from_millis(500),
        };
        // Granted for a hello sent at 0: the node-side deadline is 1.5 s.
        let mut lease = NodeLease::new(LeaseId(7), &cfg, Duration::ZERO).unwrap();
        assert_eq!(
            ended(&mut lease, "closed".into(), Duration::from_millis(1000)),
            SessionOutcome::Ended {
                reason: "closed".into()
            }
        );
        // Resumed after a SIGSTOP past the deadline, with the coordinator's `End` already
        // read: the node lost its lease whichever it noticed first.
        assert_eq!(
            ended(
                &mut lease,
                "lease-7 of node-2 expired".into(),
                Duration::from_millis(2500)
            ),
            SessionOutcome::LeaseLost { lease: 7 }
        );
    }
}
