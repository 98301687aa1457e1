//! One quinn endpoint per process: one UDP socket that serves and dials (design §2.5,
//! "Transport").
//!
//! [`ClusterEndpoint::bind`] serves the given protocols (the coordinator: node + CLI; a
//! node: node; a CLI: none, dial only). [`ClusterEndpoint::connect`] dials a peer by its
//! identity and checks the server's certificate against it. On the accepting side
//! [`handshake`] completes an [`quinn::Incoming`] and checks the client's role against the
//! negotiated protocol; once the peer's hello arrives, [`PeerConnection::check_claim`]
//! checks the identity it claims, and [`PeerConnection::refuse`] closes with
//! [`ERR_IDENTITY`] and the reason.
//!
//! TLS 1.3 mTLS pitfall (notes P8): a client whose certificate the server rejects sees its
//! handshake *succeed* and only fails at its first read. A session counts as registered
//! only once the server's reply arrives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{
    HandshakeData, NoInitialCipherSuite, QuicClientConfig, QuicServerConfig,
};
use quinn::{IdleTimeout, VarInt};
use rustls::pki_types::CertificateDer;

use crate::identity::Identity;
use crate::pki::Credentials;
use crate::tls::{self, IdentityError, PeerSide, Protocol, TlsError};

/// QUIC application close code: the peer's identity was refused. The close reason is the
/// [`IdentityError`] message.
pub const ERR_IDENTITY: u32 = 0x10;

/// Longest close reason sent, in bytes (a QUIC close frame must fit one packet).
const MAX_CLOSE_REASON: usize = 512;

/// QUIC transport settings, identical on every process of a cluster (quinn takes the
/// *minimum* of both sides' idle timeouts, notes P2).
///
/// Worst-case receive memory per connection is `receive_window` (all streams together);
/// per stream `stream_receive_window`. Worst-case send buffering per connection is
/// `send_window`. So a process with `C` connections may buffer up to
/// `C × (receive_window + send_window)` bytes: 48 MiB per connection with the defaults.
///
/// # Window rule for data channels (design §2.5, notes §1.5 and P9)
///
/// A stalled data channel (its consumer not reading) holds up to `stream_receive_window`
/// bytes of the connection's credit until it is read. So that stalled channels never
/// starve the others on the same connection, keep
/// `receive_window ≥ channels × stream_receive_window`, where `channels` is the number of
/// data channels open between the two nodes at once, and
/// `max_concurrent_uni_streams ≥ channels` (else `open_uni` waits, P6).
/// [`TransportSettings::for_data_channels`] sizes both; [`TransportSettings::data_channels`]
/// says how many channels a setting covers. The defaults cover 32 channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportSettings {
    /// PING interval when idle, keeping the connection and NAT bindings alive. Default 1 s.
    pub keep_alive_interval: Duration,
    /// A connection with no packet for this long is dead (`ConnectionError::TimedOut`).
    /// Default 5 s; must exceed `keep_alive_interval`.
    pub idle_timeout: Duration,
    /// Bytes a peer may send on one stream ahead of our reads: the per-channel credit that
    /// makes a slow consumer stall its producer. Default 1 MiB; kept ≤ 2 MiB so a lagging
    /// reader never trips quinn's "too many gaps" connection error (notes P9).
    pub stream_receive_window: u32,
    /// Bytes a peer may send on all streams of a connection ahead of our reads. Default
    /// 32 MiB (room for 32 channels' full stream windows).
    pub receive_window: u64,
    /// Bytes we buffer for sending per connection before writes wait. Default 16 MiB.
    pub send_window: u64,
    /// Concurrent bidirectional streams the peer may open (control session + one per
    /// request). Default 64. `open_bi` waits when the limit is reached (notes P6).
    pub max_concurrent_bidi_streams: u32,
    /// Concurrent unidirectional streams the peer may open (one per data channel). Default
    /// 1024; must exceed the channels open between two nodes, or `open_uni` waits.
    pub max_concurrent_uni_streams: u32,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            keep_alive_interval: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
            stream_receive_window: 1024 * 1024,
            receive_window: 32 * 1024 * 1024,
            send_window: 16 * 1024 * 1024,
            max_concurrent_bidi_streams: 64,
            max_concurrent_uni_streams: 1024,
        }
    }
}

impl TransportSettings {
    /// The defaults, with `receive_window` and `max_concurrent_uni_streams` raised so that
    /// `channels` data channels between two nodes can all stall at once without starving
    /// each other (the window rule above). Never lowers a default.
    pub fn for_data_channels(channels: u32) -> Self {
        let base = Self::default();
        Self {
            receive_window: base
                .receive_window
                .max(u64::from(channels) * u64::from(base.stream_receive_window)),
            max_concurrent_uni_streams: base
                .max_concurrent_uni_streams
                .max(channels.saturating_add(channels / 4)),
            ..base
        }
    }

    /// The coordinator's settings for `lease`: the defaults with the idle timeout raised to
    /// 1.5 × the lease TTL (at least the default), so a silent node is always lost by its
    /// lease, never first by the transport: failure detection has one setting, the TTL
    /// (design §2.5). Nodes dial the coordinator with no idle timeout of their own
    /// ([`ClusterEndpoint::connect_control`]), so this one applies to the session.
    pub fn for_lease(lease: &crate::lease::LeaseConfig) -> Self {
        let base = Self::default();
        Self {
            idle_timeout: base.idle_timeout.max(lease.ttl + lease.ttl / 2),
            ..base
        }
    }

    /// How many data channels may stall at once on one connection without starving the
    /// others: `receive_window / stream_receive_window`, capped by
    /// `max_concurrent_uni_streams`.
    pub fn data_channels(&self) -> u64 {
        (self.receive_window / u64::from(self.stream_receive_window.max(1)))
            .min(u64::from(self.max_concurrent_uni_streams))
    }

    /// The quinn transport config for these settings.
    ///
    /// # Errors
    ///
    /// [`EndpointError::BadSetting`] if the idle timeout does not exceed the keep-alive
    /// interval or a value is out of QUIC's range.
    pub fn to_quinn(&self) -> Result<quinn::TransportConfig, EndpointError> {
        let bad = |name: &'static str, value: String| EndpointError::BadSetting { name, value };
        if self.idle_timeout <= self.keep_alive_interval {
            return Err(bad(
                "idle_timeout",
                format!(
                    "{:?} (must exceed keep_alive_interval {:?})",
                    self.idle_timeout, self.keep_alive_interval
                ),
            ));
        }
        let idle = IdleTimeout::try_from(self.idle_timeout)
            .map_err(|_| bad("idle_timeout", format!("{:?}", self.idle_timeout)))?;
        let receive_window = VarInt::from_u64(self.receive_window)
            .map_err(|_| bad("receive_window", self.receive_window.to_string()))?;
        let mut config = quinn::TransportConfig::default();
        config
            .keep_alive_interval(Some(self.keep_alive_interval))
            .max_idle_timeout(Some(idle))
            .stream_receive_window(VarInt::from_u32(self.stream_receive_window))
            .receive_window(receive_window)
            .send_window(self.send_window)
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_concurrent_bidi_streams))
            .max_concurrent_uni_streams(VarInt::from_u32(self.max_concurrent_uni_streams));
        Ok(config)
    }
}

/// Why an endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The TLS config could not be built.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The TLS config lacks the TLS 1.3 suite QUIC needs for its initial packets.
    #[error("TLS config unusable for QUIC: {0}")]
    Quic(#[from] NoInitialCipherSuite),
    /// A transport setting is out of range.
    #[error("transport setting {name} = {value} is invalid")]
    BadSetting {
        /// The setting.
        name: &'static str,
        /// Its value, and why it is refused.
        value: String,
    },
    /// The UDP socket could not be bound.
    #[error("cannot bind QUIC endpoint on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why a connection was not established.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// quinn refused to start the connection (bad server name, endpoint closing).
    #[error("cannot dial {peer}: {source}")]
    Dial {
        /// The address dialled.
        peer: SocketAddr,
        /// quinn's reason.
        source: quinn::ConnectError,
    },
    /// The QUIC/TLS handshake failed (certificate refused by the verifier, ALPN mismatch,
    /// timeout).
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// The remote address.
        peer: SocketAddr,
        /// quinn's reason, including the TLS alert or verifier error.
        source: quinn::ConnectionError,
    },
    /// The handshake succeeded but the peer's identity was refused.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

impl ConnectError {
    /// The certificate refusal this failure is, if it is one: a handshake failed by a
    /// verifier (either side's), or a peer identity refused after it.
    pub fn refusal(&self) -> Option<crate::refusal::CertRefusal> {
        match self {
            ConnectError::Handshake { source, .. } => crate::refusal::classify(source),
            ConnectError::Identity(e) => Some(crate::refusal::CertRefusal {
                problem: e.problem(),
                whose: crate::refusal::Whose::Theirs,
                detail: e.to_string(),
            }),
            ConnectError::Dial { .. } => None,
        }
    }
}

/// A connection whose peer certificate has been checked against the negotiated protocol.
#[derive(Debug, Clone)]
pub struct PeerConnection {
    /// The QUIC connection.
    pub connection: quinn::Connection,
    /// The negotiated protocol.
    pub protocol: Protocol,
    /// Who the peer's certificate names.
    pub certified: Identity,
}

impl PeerConnection {
    fn authorize(
        connection: quinn::Connection,
        side: PeerSide,
        claimed: Option<&Identity>,
    ) -> Result<Self, IdentityError> {
        let peer = connection.remote_address();
        let alpn = connection
            .handshake_data()
            .and_then(|d| d.downcast::<HandshakeData>().ok())
            .and_then(|d| d.protocol);
        let chain = connection
            .peer_identity()
            .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
            .map(|b| *b)
            .unwrap_or_default();
        let certified = tls::authorize(peer, side, alpn.as_deref(), &chain, claimed)?;
        let protocol = alpn
            .as_deref()
            .and_then(Protocol::from_alpn)
            .expect("authorize checked the ALPN");
        Ok(Self {
            connection,
            protocol,
            certified,
        })
    }

    /// The remote address.
    pub fn remote_address(&self) -> SocketAddr {
        self.connection.remote_address()
    }

    /// Checks the identity the peer claims in its hello against its certificate.
    ///
    /// # Errors
    ///
    /// [`IdentityError::ClaimMismatch`] naming both; refuse the peer with
    /// [`PeerConnection::refuse`].
    pub fn check_claim(&self, claimed: &Identity) -> Result<&Identity, IdentityError> {
        if *claimed == self.certified {
            Ok(&self.certified)
        } else {
            Err(IdentityError::ClaimMismatch {
                peer: self.remote_address(),
                certified: self.certified.clone(),
                claimed: claimed.clone(),
            })
        }
    }

    /// Closes the connection with [`ERR_IDENTITY`] and `reason`'s message.
    pub fn refuse(&self, reason: &IdentityError) {
        refuse(&self.connection, reason);
    }
}

fn refuse(connection: &quinn::Connection, reason: &IdentityError) {
    tracing::warn!(
        peer = %connection.remote_address(),
        problem = reason.problem().name(),
        %reason,
        "peer refused"
    );
    let msg = reason.to_string();
    let mut end = msg.len().min(MAX_CLOSE_REASON);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    connection.close(VarInt::from_u32(ERR_IDENTITY), &msg.as_bytes()[..end]);
}

/// Completes an incoming connection and checks the client certificate's role against the
/// negotiated protocol. A refused role closes the connection with [`ERR_IDENTITY`].
/// The handshake itself is bounded by the idle timeout; the wait for the peer's hello is
/// not (keep-alives hold the connection open), so bound it in the session layer.
///
/// # Errors
///
/// [`ConnectError::Handshake`] (e.g. no client certificate, a foreign CA, an expired
/// certificate — rustls' verifier error is in the message), [`ConnectError::Identity`].
pub async fn handshake(incoming: quinn::Incoming) -> Result<PeerConnection, ConnectError> {
    let peer = incoming.remote_address();
    let connection = incoming
        .await
        .map_err(|source| ConnectError::Handshake { peer, source })?;
    PeerConnection::authorize(connection.clone(), PeerSide::Client, None).map_err(|e| {
        refuse(&connection, &e);
        ConnectError::Identity(e)
    })
}

/// The process's QUIC endpoint. Cheap to clone (handles to one socket).
#[derive(Debug, Clone)]
pub struct ClusterEndpoint {
    endpoint: quinn::Endpoint,
    identity: Identity,
    node_client: quinn::ClientConfig,
    control_client: quinn::ClientConfig,
    cli_client: quinn::ClientConfig,
}

impl ClusterEndpoint {
    /// Binds one UDP socket on `addr` (port 0 = any) presenting `creds`, serving
    /// `serve` (empty = dial only). Must run inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`EndpointError`] if a TLS config, a transport setting, or the bind fails.
    pub fn bind(
        addr: SocketAddr,
        creds: &Credentials,
        serve: &[Protocol],
        settings: &TransportSettings,
    ) -> Result<Self, EndpointError> {
        let transport = Arc::new(settings.to_quinn()?);
        let client = |protocol| -> Result<quinn::ClientConfig, EndpointError> {
            let crypto = QuicClientConfig::try_from(tls::client_config(creds, protocol)?)?;
            let mut config = quinn::ClientConfig::new(Arc::new(crypto));
            config.transport_config(transport.clone());
            Ok(config)
        };
        let node_client = client(Protocol::Node)?;
        let cli_client = client(Protocol::Cli)?;
        let mut control_client = client(Protocol::Node)?;
        let mut control = settings.to_quinn()?;
        control.max_idle_timeout(None);
        control_client.transport_config(Arc::new(control));
        let bind_err = |source| EndpointError::Bind { addr, source };
        let endpoint = if serve.is_empty() {
            quinn::Endpoint::client(addr).map_err(bind_err)?
        } else {
            let crypto = QuicServerConfig::try_from(tls::server_config(creds, serve)?)?;
            let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
            config.transport_config(transport);
            // Cluster peers keep their addresses; a migrating peer is suspicious.
            config.migration(false);
            quinn::Endpoint::server(config, addr).map_err(bind_err)?
        };
        Ok(Self {
            endpoint,
            identity: creds.identity().clone(),
            node_client,
            control_client,
            cli_client,
        })
    }

    /// This process's identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The bound address (with the real port when bound to port 0).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The next incoming connection, or `None` once the endpoint is closed. Complete it
    /// with [`handshake`] (in its own task, so one slow peer does not block the loop).
    pub async fn accept(&self) -> Option<quinn::Incoming> {
        self.endpoint.accept().await
    }

    /// Dials `server` at `addr` on `protocol`. The TLS server name is
    /// `server.dns_name()`, so the verifier refuses a certificate of anyone else; the
    /// role is then checked against `protocol`.
    ///
    /// # Errors
    ///
    /// [`ConnectError::Dial`], [`ConnectError::Handshake`], [`ConnectError::Identity`].
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server: &Identity,
        protocol: Protocol,
    ) -> Result<PeerConnection, ConnectError> {
        let config = match protocol {
            Protocol::Node => self.node_client.clone(),
            Protocol::Cli => self.cli_client.clone(),
        };
        let connection = self
            .endpoint
            .connect_with(config, addr, &server.dns_name())
            .map_err(|source| ConnectError::Dial { peer: addr, source })?
            .await
            .map_err(|source| ConnectError::Handshake { peer: addr, source })?;
        PeerConnection::authorize(connection.clone(), PeerSide::Server, Some(server)).map_err(|e| {
            refuse(&connection, &e);
            ConnectError::Identity(e)
        })
    }

    /// Dials the coordinator at `addr` on the node protocol for a node's control session,
    /// with no idle timeout of this side: the coordinator's
    /// ([`TransportSettings::for_lease`]) applies, and the node watches its lease itself.
    ///
    /// # Errors
    ///
    /// As [`Self::connect`].
    pub async fn connect_control(&self, addr: SocketAddr) -> Result<PeerConnection, ConnectError> {
        let server = Identity::Coordinator;
        let connection = self
            .endpoint
            .connect_with(self.control_client.clone(), addr, &server.dns_name())
            .map_err(|source| ConnectError::Dial { peer: addr, source })?
            .await
            .map_err(|source| ConnectError::Handshake { peer: addr, source })?;
        PeerConnection::authorize(connection.clone(), PeerSide::Server, Some(&server)).map_err(
            |e| {
                refuse(&connection, &e);
                ConnectError::Identity(e)
            },
        )
    }

    /// The underlying quinn endpoint.
    pub fn quinn(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// Closes every connection with code 0 and waits up to `grace` for peers to
    /// acknowledge (bounded: `wait_idle` can take seconds after unclean closes, notes P4).
    /// Needs a tokio runtime with the time driver.
    pub async fn shutdown(self, grace: Duration) {
        self.endpoint.close(VarInt::from_u32(0), b"shutdown");
        let _ = tokio::time::timeout(grace, self.endpoint.wait_idle()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_build_and_bad_ones_are_named() {
        TransportSettings::default().to_quinn().unwrap();
        assert_eq!(TransportSettings::default().data_channels(), 32);
        let many = TransportSettings::for_data_channels(100);
        assert_eq!(many.data_channels(), 100);
        assert_eq!(many.receive_window, 100 * 1024 * 1024);
        assert_eq!(
            TransportSettings::for_data_channels(2),
            TransportSettings::default()
        );
        let bad = TransportSettings {
            idle_timeout: Duration::from_secs(1),
            ..TransportSettings::default()
        };
        let err = bad.to_quinn().unwrap_err();
        assert!(err.to_string().contains("idle_timeout"), "{err}");
    }
}
