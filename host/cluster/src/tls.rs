//! Mutual-TLS configs and the identity check run after every handshake (design §2.5,
//! "Transport").
//!
//! Every config: the ring provider chosen explicitly (`builder_with_provider`; never the
//! process default, see notes P7), TLS 1.3 only, client certificates required and chained
//! to the cluster CA ([`WebPkiClientVerifier`]), no 0-RTT (control messages must not be
//! replayable), no session resumption (every connection presents and has its certificate
//! checked afresh), one ALPN per [`Protocol`].
//!
//! The verifiers check chain, validity and EKU, not who the peer is. After the handshake
//! [`authorize`] maps the peer certificate to an [`Identity`], checks that the negotiated
//! protocol admits its role (a CLI certificate on the node protocol is refused), and that it
//! equals the identity the peer claims in its hello.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::identity::{Identity, NAME_SUFFIX, Role};
use crate::pki::Credentials;

/// ALPN of the node protocol: coordinator↔node control and node↔node data.
pub const NODE_ALPN: &[u8] = b"nopstream-node/1";
/// ALPN of the CLI protocol: operator client → coordinator (upload, submit, status).
pub const CLI_ALPN: &[u8] = b"nopstream-cli/1";

/// An application protocol, negotiated by ALPN. A version bump is a new ALPN, so an
/// incompatible peer fails the handshake instead of misreading frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// [`NODE_ALPN`]; admits coordinator and node certificates.
    Node,
    /// [`CLI_ALPN`]; admits CLI certificates only.
    Cli,
}

impl Protocol {
    /// The ALPN identifier.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Protocol::Node => NODE_ALPN,
            Protocol::Cli => CLI_ALPN,
        }
    }

    /// The protocol of an ALPN identifier, if it is one of ours.
    pub fn from_alpn(alpn: &[u8]) -> Option<Self> {
        [Protocol::Node, Protocol::Cli]
            .into_iter()
            .find(|p| p.alpn() == alpn)
    }

    /// The roles a peer on `side` of a connection of this protocol may hold. Node
    /// protocol: coordinator or node on either side. CLI protocol: CLI clients dial, only
    /// the coordinator serves.
    pub fn allowed_roles(self, side: PeerSide) -> &'static [Role] {
        match (self, side) {
            (Protocol::Node, _) => &[Role::Coordinator, Role::Node],
            (Protocol::Cli, PeerSide::Client) => &[Role::Cli],
            (Protocol::Cli, PeerSide::Server) => &[Role::Coordinator],
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.alpn()))
    }
}

/// Which end of the connection the checked peer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerSide {
    /// The peer dialled us (we are the server).
    Client,
    /// We dialled the peer.
    Server,
}

impl fmt::Display for PeerSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeerSide::Client => "client",
            PeerSide::Server => "server",
        })
    }
}

/// Why a TLS config could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA certificate is not a usable trust anchor.
    #[error("cluster CA certificate is not a usable trust anchor: {0}")]
    BadCa(rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("cannot build the client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// rustls refused the configuration (protocol versions, certificate or key).
    #[error("rustls refused the configuration for {identity}: {source}")]
    Config {
        /// The local identity the config was for.
        identity: Identity,
        /// rustls' reason (never key bytes).
        source: rustls::Error,
    },
    /// A server config was asked for no protocol.
    #[error("a server config needs at least one protocol")]
    NoProtocols,
}

/// Why a peer certificate carries no identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertNameError {
    /// The certificate is not parseable X.509.
    #[error("unparseable certificate: {0}")]
    Unparseable(String),
    /// No DNS subject alternative name under `.nopstream` parses as an identity.
    #[error("no identity name under `{NAME_SUFFIX}` (DNS names: {names:?})")]
    NoIdentityName {
        /// The DNS names the certificate does carry.
        names: Vec<String>,
    },
    /// More than one identity name: ambiguous, refused.
    #[error("more than one identity name: {names:?}")]
    Ambiguous {
        /// The identity names found.
        names: Vec<String>,
    },
}

/// A peer refused after the handshake. Messages name the peer and the mismatch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The peer presented no certificate (a server never accepts this; a client sees it
    /// only if the server misbehaves).
    #[error("peer {peer} presented no certificate")]
    NoCertificate {
        /// Remote address.
        peer: SocketAddr,
    },
    /// The peer's certificate carries no usable identity.
    #[error("peer {peer}: {source}")]
    Certificate {
        /// Remote address.
        peer: SocketAddr,
        /// What is wrong with its names.
        source: CertNameError,
    },
    /// No ALPN, or one that is not ours, was negotiated.
    #[error("peer {peer} negotiated no known protocol (ALPN {alpn:?})")]
    UnknownProtocol {
        /// Remote address.
        peer: SocketAddr,
        /// The negotiated ALPN, lossily decoded, if any.
        alpn: Option<String>,
    },
    /// The certificate's role is not admitted on the negotiated protocol.
    #[error(
        "peer {peer} presents the certificate of {certified} (role {role}), which protocol {protocol} does not admit as {side} (allowed: {allowed})"
    )]
    RoleNotAllowed {
        /// Remote address.
        peer: SocketAddr,
        /// Which end the peer is.
        side: PeerSide,
        /// Who the certificate names.
        certified: Identity,
        /// Its role.
        role: Role,
        /// The negotiated protocol.
        protocol: Protocol,
        /// The roles the protocol admits, comma separated.
        allowed: String,
    },
    /// The peer claims an identity its certificate does not name.
    #[error("peer {peer} claims to be {claimed} but its certificate names {certified}")]
    ClaimMismatch {
        /// Remote address.
        peer: SocketAddr,
        /// Who the certificate names.
        certified: Identity,
        /// Who the peer says it is.
        claimed: Identity,
    },
}

impl IdentityError {
    /// What is wrong with the peer's certificate, as [`crate::refusal`] names it.
    pub fn problem(&self) -> crate::refusal::CertProblem {
        use crate::refusal::CertProblem;
        match self {
            IdentityError::NoCertificate { .. } => CertProblem::NoCertificate,
            IdentityError::Certificate { .. } | IdentityError::ClaimMismatch { .. } => {
                CertProblem::WrongName
            }
            IdentityError::UnknownProtocol { .. } | IdentityError::RoleNotAllowed { .. } => {
                CertProblem::WrongRole
            }
        }
    }
}

/// The one crypto provider of the cluster: ring.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(creds: &Credentials) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add(creds.ca().clone()).map_err(TlsError::BadCa)?;
    Ok(Arc::new(roots))
}

/// A rustls server config presenting `creds`, requiring a client certificate signed by
/// the cluster CA, offering `protocols` by ALPN (in preference order).
///
/// # Errors
///
/// [`TlsError`] if the CA, certificate or key is unusable, or `protocols` is empty.
pub fn server_config(
    creds: &Credentials,
    protocols: &[Protocol],
) -> Result<ServerConfig, TlsError> {
    if protocols.is_empty() {
        return Err(TlsError::NoProtocols);
    }
    let provider = crypto_provider();
    let config_err = |source| TlsError::Config {
        identity: creds.identity().clone(),
        source,
    };
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(creds)?, provider.clone()).build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(creds.cert_chain().to_vec(), creds.key())
        .map_err(config_err)?;
    config.alpn_protocols = protocols.iter().map(|p| p.alpn().to_vec()).collect();
    // No 0-RTT (quinn's `TryFrom` keeps this value; QUIC allows only 0 or u32::MAX).
    config.max_early_data_size = 0;
    // No resumption: a resumed session would skip the certificate's validity check.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// A rustls client config presenting `creds` as client certificate, trusting only the
/// cluster CA, speaking `protocol`. The server name passed to `connect` must be the
/// [`Identity::dns_name`] of the peer dialled; the server verifier checks it.
///
/// # Errors
///
/// [`TlsError`] if the CA, certificate or key is unusable.
pub fn client_config(creds: &Credentials, protocol: Protocol) -> Result<ClientConfig, TlsError> {
    let config_err = |source| TlsError::Config {
        identity: creds.identity().clone(),
        source,
    };
    let mut config = ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_err)?
        .with_root_certificates(roots(creds)?)
        .with_client_auth_cert(creds.cert_chain().to_vec(), creds.key())
        .map_err(config_err)?;
    config.alpn_protocols = vec![protocol.alpn().to_vec()];
    config.enable_early_data = false;
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// The identity a certificate carries: its one DNS SAN under `.nopstream` (see
/// [`crate::identity`]).
///
/// # Errors
///
/// [`CertNameError`] if the DER does not parse, or the certificate has zero or several
/// identity names.
pub fn certificate_identity(der: &CertificateDer<'_>) -> Result<Identity, CertNameError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertNameError::Unparseable(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CertNameError::Unparseable(e.to_string()))?;
    let names: Vec<String> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(s) => Some((*s).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let ids: Vec<(Identity, &String)> = names
        .iter()
        .filter_map(|n| Identity::from_dns_name(n).ok().map(|id| (id, n)))
        .collect();
    match ids.as_slice() {
        [(id, _)] => Ok(id.clone()),
        [] => Err(CertNameError::NoIdentityName { names }),
        many => Err(CertNameError::Ambiguous {
            names: many.iter().map(|(_, n)| (*n).clone()).collect(),
        }),
    }
}

/// Checks a peer after the handshake and returns who it is.
///
/// `side` is which end the peer is, `alpn` the negotiated ALPN, `chain` the peer's
/// certificates (leaf first) as the verifier accepted them, `claimed` the identity the
/// peer states in its hello, or the identity we dialled (`None` to check only the role).
/// (a) The certificate's role must be in [`Protocol::allowed_roles`] of the negotiated
/// protocol for `side`; (b) if `claimed` is given it must equal the certificate's identity.
///
/// # Errors
///
/// An [`IdentityError`] naming `peer` and the mismatch.
pub fn authorize(
    peer: SocketAddr,
    side: PeerSide,
    alpn: Option<&[u8]>,
    chain: &[CertificateDer<'_>],
    claimed: Option<&Identity>,
) -> Result<Identity, IdentityError> {
    let protocol =
        alpn.and_then(Protocol::from_alpn)
            .ok_or_else(|| IdentityError::UnknownProtocol {
                peer,
                alpn: alpn.map(|a| String::from_utf8_lossy(a).into_owned()),
            })?;
    let leaf = chain.first().ok_or(IdentityError::NoCertificate { peer })?;
    let certified =
        certificate_identity(leaf).map_err(|source| IdentityError::Certificate { peer, source })?;
    let role = certified.role();
    if !protocol.allowed_roles(side).contains(&role) {
        let allowed = protocol
            .allowed_roles(side)
            .iter()
            .map(Role::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(IdentityError::RoleNotAllowed {
            peer,
            side,
            certified,
            role,
            protocol,
            allowed,
        });
    }
    match claimed {
        Some(claimed) if *claimed != certified => Err(IdentityError::ClaimMismatch {
            peer,
            certified,
            claimed: claimed.clone(),
        }),
        _ => Ok(certified),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{CliName, NodeId};
    use crate::pki::{CertificateAuthority, DEFAULT_CA_VALIDITY};

    fn peer() -> SocketAddr {
        "127.0.0.1:4000".parse().unwrap()
    }

    fn chain(ca: &CertificateAuthority, id: &Identity) -> Vec<CertificateDer<'static>> {
        ca.issue_credentials(id).unwrap().cert_chain().to_vec()
    }

    #[test]
    fn node_protocol_admits_nodes_and_coordinator_only() {
        let ca = CertificateAuthority::generate("t", DEFAULT_CA_VALIDITY).unwrap();
        let node = Identity::Node(NodeId(3));
        assert_eq!(
            authorize(
                peer(),
                PeerSide::Client,
                Some(NODE_ALPN),
                &chain(&ca, &node),
                Some(&node)
            ),
            Ok(node.clone())
        );
        let coord = Identity::Coordinator;
        assert_eq!(
            authorize(
                peer(),
                PeerSide::Client,
                Some(NODE_ALPN),
                &chain(&ca, &coord),
                None
            ),
            Ok(coord)
        );

        let cli = Identity::Cli(CliName::new("ops").unwrap());
        let err = authorize(
            peer(),
            PeerSide::Client,
            Some(NODE_ALPN),
            &chain(&ca, &cli),
            Some(&cli),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                IdentityError::RoleNotAllowed {
                    role: Role::Cli,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("127.0.0.1:4000") && err.to_string().contains("cli-ops"),
            "{err}"
        );
        assert_eq!(
            authorize(
                peer(),
                PeerSide::Client,
                Some(CLI_ALPN),
                &chain(&ca, &cli),
                Some(&cli)
            ),
            Ok(cli)
        );
        let err = authorize(
            peer(),
            PeerSide::Client,
            Some(CLI_ALPN),
            &chain(&ca, &node),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                IdentityError::RoleNotAllowed {
                    role: Role::Node,
                    ..
                }
            ),
            "{err}"
        );
        // The CLI protocol's server must be the coordinator.
        let coord = Identity::Coordinator;
        assert_eq!(
            authorize(
                peer(),
                PeerSide::Server,
                Some(CLI_ALPN),
                &chain(&ca, &coord),
                Some(&coord)
            ),
            Ok(coord)
        );
        let err = authorize(
            peer(),
            PeerSide::Server,
            Some(CLI_ALPN),
            &chain(&ca, &node),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("as server"), "{err}");
    }

    #[test]
    fn a_claim_that_differs_from_the_certificate_is_refused() {
        let ca = CertificateAuthority::generate("t", DEFAULT_CA_VALIDITY).unwrap();
        let node = Identity::Node(NodeId(3));
        let err = authorize(
            peer(),
            PeerSide::Client,
            Some(NODE_ALPN),
            &chain(&ca, &node),
            Some(&Identity::Node(NodeId(4))),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "peer 127.0.0.1:4000 claims to be node-4 but its certificate names node-3"
        );
    }

    #[test]
    fn missing_certificate_or_protocol_is_refused() {
        assert!(matches!(
            authorize(peer(), PeerSide::Client, Some(NODE_ALPN), &[], None),
            Err(IdentityError::NoCertificate { .. })
        ));
        let ca = CertificateAuthority::generate("t", DEFAULT_CA_VALIDITY).unwrap();
        let c = chain(&ca, &Identity::Coordinator);
        assert!(matches!(
            authorize(peer(), PeerSide::Client, None, &c, None),
            Err(IdentityError::UnknownProtocol { alpn: None, .. })
        ));
        assert!(matches!(
            authorize(peer(), PeerSide::Client, Some(b"h3"), &c, None),
            Err(IdentityError::UnknownProtocol { .. })
        ));
    }

    #[test]
    fn certificates_without_exactly_one_identity_name_are_refused() {
        let key = rcgen::KeyPair::generate().unwrap();
        let foreign = rcgen::CertificateParams::new(vec!["example.com".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert!(matches!(
            certificate_identity(foreign.der()),
            Err(CertNameError::NoIdentityName { names }) if names == ["example.com"]
        ));
        let two = rcgen::CertificateParams::new(vec![
            "node-1.nopstream".to_owned(),
            "coordinator.nopstream".to_owned(),
        ])
        .unwrap()
        .self_signed(&key)
        .unwrap();
        assert!(matches!(
            certificate_identity(two.der()),
            Err(CertNameError::Ambiguous { .. })
        ));
        assert!(matches!(
            certificate_identity(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])),
            Err(CertNameError::Unparseable(_))
        ));
    }

    #[test]
    fn configs_are_tls13_only_without_early_data() {
        let ca = CertificateAuthority::generate("t", DEFAULT_CA_VALIDITY).unwrap();
        let creds = ca.issue_credentials(&Identity::Coordinator).unwrap();
        let server = server_config(&creds, &[Protocol::Node, Protocol::Cli]).unwrap();
        assert_eq!(
            server.alpn_protocols,
            vec![NODE_ALPN.to_vec(), CLI_ALPN.to_vec()]
        );
        assert_eq!(server.max_early_data_size, 0);
        let client = client_config(&creds, Protocol::Node).unwrap();
        assert!(!client.enable_early_data);
        assert_eq!(client.alpn_protocols, vec![NODE_ALPN.to_vec()]);
        assert!(matches!(
            server_config(&creds, &[]),
            Err(TlsError::NoProtocols)
        ));
    }
}
