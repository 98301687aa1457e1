//! The foundation of nop-stream's cluster mode (design §2.5, §19): who a peer is, how it
//! proves it, how bytes move, and when a node must stop.
//!
//! - [`identity`]: roles ([`Role`]), [`NodeId`], [`CliName`], [`Identity`] and the
//!   identity scheme (one DNS SAN per certificate: `coordinator.nopstream`,
//!   `node-<id>.nopstream`, `cli-<name>.nopstream`).
//! - [`pki`]: [`init_cluster`] writes a cluster CA and the certificates of the
//!   coordinator, the nodes and the CLI clients; [`load_credentials`] reads one identity's
//!   files back; [`CertificateAuthority`] issues in memory (also expired and foreign-CA
//!   certificates for negative tests).
//! - [`tls`]: rustls configs (ring provider, TLS 1.3 only, client certificates required,
//!   no 0-RTT, no resumption), ALPNs [`NODE_ALPN`] and [`CLI_ALPN`], and [`authorize`], the
//!   post-handshake check of role and claimed identity.
//! - [`endpoint`]: [`ClusterEndpoint`], one quinn endpoint (one UDP socket) per process,
//!   [`TransportSettings`] with documented units and worst-case memory, [`handshake`] for
//!   incoming connections.
//! - [`frame`]: the proto crate's `u32`-length-prefixed frames, with a size cap, over quinn
//!   streams.
//! - [`data`]: the data plane between nodes: one QUIC stream per channel behind a fenced
//!   header ([`DataPlane`], [`QuicSender`], [`QuicReceiver`], [`FenceTable`]), with QUIC
//!   flow control as backpressure for synchronous task threads.
//! - [`lease`]: the pure lease table ([`LeaseTable`]) and the node-side stop rule
//!   ([`NodeLease`]).
//! - [`refusal`]: certificate refusals named on both sides ([`CertRefusal`]: unknown CA,
//!   expired, not yet valid, wrong role, wrong name).
//!
//! This crate links neither wasmtime nor the runtime crate; the coordinator and node
//! processes built on it are `nop-stream-server`.
//!
//! # Usage
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use nop_stream_cluster::{
//!     init_cluster, load_credentials, ClusterEndpoint, Identity, InitOptions, NodeId,
//!     Protocol, TransportSettings,
//! };
//! use std::path::Path;
//!
//! // Once, by the operator (`nopstream cluster init certs`):
//! init_cluster(Path::new("certs"), &InitOptions::with_nodes(3))?;
//!
//! // On node 1:
//! let me = Identity::Node(NodeId(1));
//! let creds = load_credentials(Path::new("certs"), &me)?;
//! let endpoint = ClusterEndpoint::bind(
//!     "0.0.0.0:0".parse()?,
//!     &creds,
//!     &[Protocol::Node],
//!     &TransportSettings::default(),
//! )?;
//! let coordinator = endpoint
//!     .connect("10.0.0.1:7000".parse()?, &Identity::Coordinator, Protocol::Node)
//!     .await?;
//! let (mut send, mut recv) = coordinator.connection.open_bi().await?;
//! // Hello first: the coordinator checks the claimed identity against the certificate
//! // (`PeerConnection::check_claim`); registered only once its reply arrives.
//! nop_stream_cluster::frame::write_frame(&mut send, me.label().as_bytes(), 1024).await?;
//! let _welcome = nop_stream_cluster::frame::read_frame(&mut recv, 1024).await?;
//! # Ok(()) }
//! ```

pub mod data;
pub mod endpoint;
pub mod frame;
pub mod identity;
pub mod lease;
pub mod pki;
pub mod refusal;
pub mod session;
pub mod tls;

pub use data::{
    DataError, DataPlane, DataPlaneConfig, FenceTable, QuicReceiver, QuicSender, ReceiverGuard,
    Refusal, RefusalReason,
};
pub use endpoint::{
    ClusterEndpoint, ConnectError, EndpointError, PeerConnection, TransportSettings, handshake,
};
pub use frame::{DEFAULT_MAX_FRAME_LEN, FrameError};
pub use identity::{CliName, Identity, IdentityParseError, NodeId, Role};
pub use lease::{Claim, LeaseConfig, LeaseId, LeaseTable, NodeLease, NodeLeaseStatus};
pub use pki::{
    CertificateAuthority, Credentials, InitOptions, PkiError, init_cluster, load_credentials,
};
pub use refusal::{CertProblem, CertRefusal, Whose};
pub use tls::{CLI_ALPN, IdentityError, NODE_ALPN, PeerSide, Protocol, TlsError, authorize};
