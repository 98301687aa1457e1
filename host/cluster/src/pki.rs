//! The cluster PKI: one CA per cluster, one certificate per coordinator, node and CLI client.
//!
//! [`init_cluster`] writes a certs directory; [`load_credentials`] reads one identity's
//! files back; [`CertificateAuthority`] issues certificates in memory, including the bad
//! ones negative tests need ([`CertificateAuthority::issue_expired`], or a second CA as a
//! foreign one).
//!
//! # Directory layout
//!
//! ```text
//! DIR/ca.crt                 cluster CA certificate (PEM), mode 0644
//! DIR/ca.key                 cluster CA private key (PKCS#8 PEM), mode 0600
//! DIR/coordinator.crt|.key   the coordinator
//! DIR/node-<id>.crt|.key     each runtime node
//! DIR/cli-<name>.crt|.key    each CLI client
//! ```
//!
//! File stems are [`Identity::label`]; the names inside the certificates follow the
//! scheme of [`crate::identity`]. Keys are ECDSA P-256 (rcgen's default), certificates
//! carry the authority key identifier and the EKUs of their role. The CA is constrained to
//! names under `nopstream` and may sign only leaves (path length 0).
//!
//! A process needs `ca.crt` and its own `.crt`/`.key`; only the operator keeps `ca.key`.
//! No error or log of this module contains private key bytes.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use time::OffsetDateTime;

use crate::identity::{CliName, Identity, NodeId};
use crate::tls::certificate_identity;

/// File name of the cluster CA certificate in a certs directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the cluster CA private key in a certs directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Default validity of the CA certificate: 10 years.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default validity of leaf certificates: 1 year. There is no rotation yet; re-run
/// [`init_cluster`] with `overwrite` to renew everything.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far `not_before` is set back from now, to tolerate clock skew between machines.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

/// Mode of private key files.
const KEY_MODE: u32 = 0o600;
/// Mode of certificate files.
const CERT_MODE: u32 = 0o644;

/// Errors of certificate generation, writing and loading. Messages name the file and the
/// problem, never key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to build or sign a certificate.
    #[error("cannot generate the certificate of {subject}: {source}")]
    Generate {
        /// `ca` or the identity label.
        subject: String,
        /// rcgen's reason.
        source: rcgen::Error,
    },
    /// A validity period does not fit the certificate time range.
    #[error("validity of {validity:?} from now is out of range")]
    BadValidity {
        /// The requested validity.
        validity: Duration,
    },
    /// The same identity was requested twice.
    #[error("identity {0} is listed more than once")]
    DuplicateIdentity(Identity),
    /// `init_cluster` would overwrite an existing file and `overwrite` is off.
    #[error("{} already exists; refusing to overwrite cluster keys (pass overwrite to replace them)", path.display())]
    AlreadyInitialized {
        /// The first existing file found.
        path: PathBuf,
    },
    /// A file or directory operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted: `read`, `write`, `create directory`, `set permissions of`.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A file the identity needs does not exist.
    #[error("missing {what} {} (run `cluster init` or copy it from the operator)", path.display())]
    MissingFile {
        /// `CA certificate`, `certificate` or `private key`.
        what: &'static str,
        /// The expected path.
        path: PathBuf,
    },
    /// A file exists but holds no usable PEM item of the expected kind.
    #[error("bad {what} {}: {reason}", path.display())]
    BadPem {
        /// `CA certificate`, `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// A fixed description (never file content).
        reason: &'static str,
    },
    /// A certificate file does not carry the identity its name promises.
    #[error("certificate {} does not belong to {expected}: {reason}", path.display())]
    WrongIdentity {
        /// The file.
        path: PathBuf,
        /// The identity asked for.
        expected: Identity,
        /// What was found instead.
        reason: String,
    },
}

/// Cryptographic material one process presents and trusts: its certificate chain and key,
/// and the cluster CA. `Debug` prints the identity only.
pub struct Credentials {
    identity: Identity,
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    ca: CertificateDer<'static>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("identity", &self.identity)
            .field("cert_chain_len", &self.cert_chain.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

impl Clone for Credentials {
    fn clone(&self) -> Self {
        Self {
            identity: self.identity.clone(),
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
            ca: self.ca.clone(),
        }
    }
}

impl Credentials {
    /// Builds credentials from PEM text and checks that the certificate carries `identity`.
    /// `origin` names the source in errors (a path, or `memory`).
    ///
    /// # Errors
    ///
    /// [`PkiError::BadPem`] if a PEM item is missing or malformed, [`PkiError::WrongIdentity`]
    /// if the leaf certificate does not name `identity`.
    pub fn from_pem(
        identity: &Identity,
        cert_pem: &str,
        key_pem: &str,
        ca_pem: &str,
        origin: &Path,
    ) -> Result<Self, PkiError> {
        let cert_chain = parse_certs(cert_pem.as_bytes(), "certificate", origin)?;
        let key = parse_key(key_pem.as_bytes(), origin)?;
        let ca = parse_certs(ca_pem.as_bytes(), "CA certificate", origin)?
            .into_iter()
            .next()
            .ok_or_else(|| bad_pem("CA certificate", origin, "no certificate"))?;
        check_identity(identity, &cert_chain[0], origin)?;
        Ok(Self {
            identity: identity.clone(),
            cert_chain,
            key,
            ca,
        })
    }

    /// The identity the certificate carries.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The certificate chain, leaf first.
    pub fn cert_chain(&self) -> &[CertificateDer<'static>] {
        &self.cert_chain
    }

    /// The cluster CA certificate peers are verified against.
    pub fn ca(&self) -> &CertificateDer<'static> {
        &self.ca
    }

    /// A copy of the private key, for building a TLS config. Never log it.
    pub(crate) fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }

    /// The same credentials trusting another CA (tests: a peer that trusts a foreign CA).
    pub fn with_ca(mut self, ca: CertificateDer<'static>) -> Self {
        self.ca = ca;
        self
    }
}

/// A certificate and key just issued, as PEM text. `Debug` hides the key.
pub struct IssuedCert {
    /// Whom the certificate names.
    pub identity: Identity,
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM. Write it with mode 0600 and never log it.
    pub key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("identity", &self.identity)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A cluster certificate authority held in memory: its certificate and signing key.
pub struct CertificateAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("key", &"<redacted>")
            .finish()
    }
}

impl CertificateAuthority {
    /// Generates a new CA named `nop-stream cluster CA <cluster_name>`, valid from now
    /// (less [`CLOCK_SKEW_ALLOWANCE`]) for `validity`.
    ///
    /// # Errors
    ///
    /// [`PkiError::Generate`] or [`PkiError::BadValidity`].
    pub fn generate(cluster_name: &str, validity: Duration) -> Result<Self, PkiError> {
        let gen_err = |source| PkiError::Generate {
            subject: "ca".to_owned(),
            source,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
        params.distinguished_name.push(
            DnType::CommonName,
            format!("nop-stream cluster CA {cluster_name}"),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, "nop-stream");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DnsName("nopstream".to_owned())],
            excluded_subtrees: vec![],
        });
        (params.not_before, params.not_after) = window_from_now(validity)?;
        let key = KeyPair::generate().map_err(gen_err)?;
        let cert = params.self_signed(&key).map_err(gen_err)?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA [`init_cluster`] wrote into `dir` (`ca.crt`, `ca.key`), to issue more
    /// certificates under it (a new node, a replacement; tests: an expired or not yet
    /// valid certificate of the real cluster). Only the operator holds `ca.key`.
    ///
    /// # Errors
    ///
    /// [`PkiError::MissingFile`], [`PkiError::BadPem`] for a file that is not a
    /// certificate or a key, [`PkiError::Generate`] if rcgen refuses the key.
    pub fn load(dir: &Path) -> Result<Self, PkiError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = String::from_utf8(read_file(&cert_path, "CA certificate")?)
            .map_err(|_| bad_pem("CA certificate", &cert_path, "not UTF-8"))?;
        let key_pem = String::from_utf8(read_file(&key_path, "CA private key")?)
            .map_err(|_| bad_pem("CA private key", &key_path, "not UTF-8"))?;
        let cert_der = parse_certs(cert_pem.as_bytes(), "CA certificate", &cert_path)?
            .into_iter()
            .next()
            .ok_or_else(|| bad_pem("CA certificate", &cert_path, "no certificate"))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|_| bad_pem("CA certificate", &cert_path, "not X.509"))?;
        let gen_err = |source| PkiError::Generate {
            subject: "ca".to_owned(),
            source,
        };
        let key = KeyPair::from_pem(&key_pem).map_err(gen_err)?;
        // The issuer's name and key are what a leaf's issuer and authority key identifier
        // are made of; the rest of the CA's parameters is not needed to sign.
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
        for cn in cert.subject().iter_common_name() {
            if let Ok(v) = cn.as_str() {
                params.distinguished_name.push(DnType::CommonName, v);
            }
        }
        for o in cert.subject().iter_organization() {
            if let Ok(v) = o.as_str() {
                params.distinguished_name.push(DnType::OrganizationName, v);
            }
        }
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Self {
            cert_pem,
            cert_der,
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Issues a certificate for `identity` valid from now (less
    /// [`CLOCK_SKEW_ALLOWANCE`]) for `validity`.
    ///
    /// # Errors
    ///
    /// [`PkiError::Generate`] or [`PkiError::BadValidity`].
    pub fn issue(&self, identity: &Identity, validity: Duration) -> Result<IssuedCert, PkiError> {
        let (not_before, not_after) = window_from_now(validity)?;
        self.issue_between(identity, not_before, not_after)
    }

    /// Issues a certificate for `identity` that expired a day ago (valid from 2 days ago
    /// to 1 day ago). For negative tests.
    ///
    /// # Errors
    ///
    /// [`PkiError::Generate`].
    pub fn issue_expired(&self, identity: &Identity) -> Result<IssuedCert, PkiError> {
        let now = OffsetDateTime::now_utc();
        self.issue_between(
            identity,
            now - time::Duration::days(2),
            now - time::Duration::days(1),
        )
    }

    /// Issues a certificate for `identity` valid between two instants (UTC).
    ///
    /// # Errors
    ///
    /// [`PkiError::Generate`].
    pub fn issue_between(
        &self,
        identity: &Identity,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<IssuedCert, PkiError> {
        let gen_err = |source| PkiError::Generate {
            subject: identity.label(),
            source,
        };
        let dns = identity.dns_name();
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::DnsName(dns.clone().try_into().map_err(gen_err)?)];
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, dns);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "nop-stream");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match identity {
            // Coordinator and nodes both accept and dial.
            Identity::Coordinator | Identity::Node(_) => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Identity::Cli(_) => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate().map_err(gen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(gen_err)?;
        Ok(IssuedCert {
            identity: identity.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Credentials for a freshly issued certificate, trusting this CA.
    ///
    /// # Errors
    ///
    /// As [`Credentials::from_pem`] (only on an rcgen/rustls disagreement).
    pub fn credentials(&self, issued: &IssuedCert) -> Result<Credentials, PkiError> {
        Credentials::from_pem(
            &issued.identity,
            &issued.cert_pem,
            &issued.key_pem,
            &self.cert_pem,
            Path::new("memory"),
        )
    }

    /// Issues a certificate valid for [`DEFAULT_LEAF_VALIDITY`] and returns its credentials.
    ///
    /// # Errors
    ///
    /// As [`CertificateAuthority::issue`].
    pub fn issue_credentials(&self, identity: &Identity) -> Result<Credentials, PkiError> {
        self.credentials(&self.issue(identity, DEFAULT_LEAF_VALIDITY)?)
    }
}

/// What [`init_cluster`] writes.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Free-form cluster name put in the CA's common name. Default `local`.
    pub cluster_name: String,
    /// The runtime nodes to issue certificates for.
    pub nodes: Vec<NodeId>,
    /// The CLI clients to issue certificates for. Default: one, `admin`.
    pub cli_clients: Vec<CliName>,
    /// CA validity. Default [`DEFAULT_CA_VALIDITY`].
    pub ca_validity: Duration,
    /// Leaf validity. Default [`DEFAULT_LEAF_VALIDITY`].
    pub leaf_validity: Duration,
    /// Replace existing files. Default `false`: any existing target file is refused.
    /// With `true`, every file is rewritten under a new CA; files of identities no longer
    /// listed stay behind, signed by the old CA, and are refused by the new cluster.
    pub overwrite: bool,
}

impl InitOptions {
    /// Defaults for a cluster with `nodes` nodes numbered `1..=nodes`.
    pub fn with_nodes(nodes: u32) -> Self {
        Self {
            cluster_name: "local".to_owned(),
            nodes: (1..=nodes).map(NodeId).collect(),
            cli_clients: vec![CliName::new("admin").expect("valid literal name")],
            ca_validity: DEFAULT_CA_VALIDITY,
            leaf_validity: DEFAULT_LEAF_VALIDITY,
            overwrite: false,
        }
    }

    /// Every identity to issue: the coordinator, the nodes, the CLI clients.
    pub fn identities(&self) -> Vec<Identity> {
        std::iter::once(Identity::Coordinator)
            .chain(self.nodes.iter().copied().map(Identity::Node))
            .chain(self.cli_clients.iter().cloned().map(Identity::Cli))
            .collect()
    }
}

/// The files [`init_cluster`] wrote.
#[derive(Clone, Debug)]
pub struct InitReport {
    /// The CA certificate path.
    pub ca_cert: PathBuf,
    /// Every identity issued, in order: coordinator, nodes, CLI clients.
    pub identities: Vec<Identity>,
    /// Every file written.
    pub files: Vec<PathBuf>,
}

/// Path of `identity`'s certificate in a certs directory: `DIR/<label>.crt`.
pub fn cert_path(dir: &Path, identity: &Identity) -> PathBuf {
    dir.join(format!("{}.crt", identity.label()))
}

/// Path of `identity`'s private key in a certs directory: `DIR/<label>.key`.
pub fn key_path(dir: &Path, identity: &Identity) -> PathBuf {
    dir.join(format!("{}.key", identity.label()))
}

/// Writes a new cluster CA and certificates for the coordinator, the nodes and the CLI
/// clients into `dir` (created if absent). Keys get mode 0600, certificates 0644.
///
/// This is the library side of `nopstream cluster init DIR`:
///
/// ```no_run
/// use nop_stream_cluster::pki::{init_cluster, InitOptions};
/// let report = init_cluster("certs".as_ref(), &InitOptions::with_nodes(3))?;
/// for path in &report.files {
///     println!("wrote {}", path.display());
/// }
/// # Ok::<(), nop_stream_cluster::pki::PkiError>(())
/// ```
///
/// # Errors
///
/// [`PkiError::AlreadyInitialized`] if any target file exists and `overwrite` is off
/// (checked before anything is written), [`PkiError::DuplicateIdentity`],
/// [`PkiError::Io`], [`PkiError::Generate`], [`PkiError::BadValidity`].
pub fn init_cluster(dir: &Path, options: &InitOptions) -> Result<InitReport, PkiError> {
    let identities = options.identities();
    for (i, id) in identities.iter().enumerate() {
        if identities[..i].contains(id) {
            return Err(PkiError::DuplicateIdentity(id.clone()));
        }
    }
    let mut targets = vec![dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE)];
    for id in &identities {
        targets.push(cert_path(dir, id));
        targets.push(key_path(dir, id));
    }
    if !options.overwrite
        && let Some(existing) = targets.iter().find(|p| p.exists())
    {
        return Err(PkiError::AlreadyInitialized {
            path: existing.clone(),
        });
    }
    fs::create_dir_all(dir).map_err(|source| PkiError::Io {
        op: "create directory",
        path: dir.to_owned(),
        source,
    })?;

    let ca = CertificateAuthority::generate(&options.cluster_name, options.ca_validity)?;
    let mut files = Vec::new();
    write_file(
        &dir.join(CA_KEY_FILE),
        ca.key_pem.as_bytes(),
        KEY_MODE,
        &mut files,
    )?;
    write_file(
        &dir.join(CA_CERT_FILE),
        ca.cert_pem.as_bytes(),
        CERT_MODE,
        &mut files,
    )?;
    for id in &identities {
        let issued = ca.issue(id, options.leaf_validity)?;
        write_file(
            &key_path(dir, id),
            issued.key_pem.as_bytes(),
            KEY_MODE,
            &mut files,
        )?;
        write_file(
            &cert_path(dir, id),
            issued.cert_pem.as_bytes(),
            CERT_MODE,
            &mut files,
        )?;
    }
    tracing::info!(dir = %dir.display(), identities = identities.len(), "cluster certificates written");
    Ok(InitReport {
        ca_cert: dir.join(CA_CERT_FILE),
        identities,
        files,
    })
}

/// Reads `identity`'s certificate and key and the cluster CA from a certs directory laid
/// out by [`init_cluster`], and checks the certificate names `identity`.
///
/// # Errors
///
/// [`PkiError::MissingFile`] naming the absent file, [`PkiError::BadPem`] naming the
/// malformed one, [`PkiError::WrongIdentity`] if the certificate names someone else,
/// [`PkiError::Io`] on other read errors.
pub fn load_credentials(dir: &Path, identity: &Identity) -> Result<Credentials, PkiError> {
    let ca_path = dir.join(CA_CERT_FILE);
    let cert_file = cert_path(dir, identity);
    let key_file = key_path(dir, identity);
    let ca_pem = read_file(&ca_path, "CA certificate")?;
    let cert_pem = read_file(&cert_file, "certificate")?;
    let key_pem = read_file(&key_file, "private key")?;
    let ca = parse_certs(&ca_pem, "CA certificate", &ca_path)?
        .into_iter()
        .next()
        .ok_or_else(|| bad_pem("CA certificate", &ca_path, "no certificate"))?;
    let cert_chain = parse_certs(&cert_pem, "certificate", &cert_file)?;
    let key = parse_key(&key_pem, &key_file)?;
    check_identity(identity, &cert_chain[0], &cert_file)?;
    Ok(Credentials {
        identity: identity.clone(),
        cert_chain,
        key,
        ca,
    })
}

fn window_from_now(validity: Duration) -> Result<(OffsetDateTime, OffsetDateTime), PkiError> {
    let now = OffsetDateTime::now_utc();
    let skew = time::Duration::try_from(CLOCK_SKEW_ALLOWANCE).expect("small constant");
    let not_after = time::Duration::try_from(validity)
        .ok()
        .and_then(|v| now.checked_add(v))
        .filter(|t| t.year() <= 9999)
        .ok_or(PkiError::BadValidity { validity })?;
    Ok((now - skew, not_after))
}

fn check_identity(
    expected: &Identity,
    leaf: &CertificateDer<'_>,
    path: &Path,
) -> Result<(), PkiError> {
    match certificate_identity(leaf) {
        Ok(found) if &found == expected => Ok(()),
        Ok(found) => Err(PkiError::WrongIdentity {
            path: path.to_owned(),
            expected: expected.clone(),
            reason: format!("it names {found}"),
        }),
        Err(e) => Err(PkiError::WrongIdentity {
            path: path.to_owned(),
            expected: expected.clone(),
            reason: e.to_string(),
        }),
    }
}

fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, PkiError> {
    fs::read(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            PkiError::MissingFile {
                what,
                path: path.to_owned(),
            }
        } else {
            PkiError::Io {
                op: "read",
                path: path.to_owned(),
                source,
            }
        }
    })
}

fn bad_pem(what: &'static str, path: &Path, reason: &'static str) -> PkiError {
    PkiError::BadPem {
        what,
        path: path.to_owned(),
        reason,
    }
}

/// Describes a PEM error without echoing file content (a malformed line may be key data).
fn pem_reason(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        Error::IllegalSectionStart { .. } => "malformed PEM BEGIN line",
        Error::Base64Decode(_) => "invalid base64 in a PEM section",
        Error::NoItemsFound => "no PEM item of the expected kind",
        Error::SectionTooLarge => "PEM section too large",
        _ => "unreadable PEM",
    }
}

fn parse_certs(
    pem: &[u8],
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(what, path, pem_reason(&e)))?;
    if certs.is_empty() {
        return Err(bad_pem(what, path, "no CERTIFICATE PEM item"));
    }
    Ok(certs)
}

fn parse_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| bad_pem("private key", path, pem_reason(&e)))
}

fn write_file(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    written: &mut Vec<PathBuf>,
) -> Result<(), PkiError> {
    let io_err = |op, source| PkiError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    let mut open = fs::OpenOptions::new();
    open.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.mode(mode);
    }
    let mut file = open.open(path).map_err(|e| io_err("write", e))?;
    // `mode` applies only on creation; an overwritten file keeps its old bits otherwise.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| io_err("set permissions of", e))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    file.write_all(bytes).map_err(|e| io_err("write", e))?;
    file.sync_all().map_err(|e| io_err("write", e))?;
    written.push(path.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_loaded_ca_issues_certificates_the_cluster_trusts() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(dir.path(), &InitOptions::with_nodes(1)).unwrap();
        let ca = CertificateAuthority::load(dir.path()).unwrap();
        let issued = ca
            .issue(&Identity::Node(NodeId(7)), DEFAULT_LEAF_VALIDITY)
            .unwrap();
        let creds = load_credentials(dir.path(), &Identity::Node(NodeId(1))).unwrap();
        // The leaf chains to the CA on disk, as a peer's verifier would check it.
        let mut roots = rustls::RootCertStore::empty();
        roots.add(creds.ca().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            crate::tls::crypto_provider(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        verifier
            .verify_client_cert(&leaf, &[], rustls::pki_types::UnixTime::now())
            .unwrap();
        assert!(CertificateAuthority::load(&dir.path().join("nowhere")).is_err());
    }

    use super::*;

    fn opts(nodes: u32) -> InitOptions {
        InitOptions::with_nodes(nodes)
    }

    #[test]
    fn init_writes_every_identity_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let report = init_cluster(dir.path(), &opts(2)).unwrap();
        assert_eq!(report.files.len(), 2 + 2 * 4);
        for id in &report.identities {
            let creds = load_credentials(dir.path(), id).unwrap();
            assert_eq!(creds.identity(), id);
            assert_eq!(certificate_identity(&creds.cert_chain()[0]).unwrap(), *id);
        }
        let dbg = format!(
            "{:?}",
            load_credentials(dir.path(), &Identity::Coordinator).unwrap()
        );
        assert!(
            dbg.contains("redacted") && !dbg.contains("PRIVATE"),
            "{dbg}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn keys_are_0600_and_certs_0644() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let report = init_cluster(dir.path(), &opts(1)).unwrap();
        for path in &report.files {
            let mode = fs::metadata(path).unwrap().permissions().mode() & 0o777;
            let want = if path.extension().unwrap() == "key" {
                0o600
            } else {
                0o644
            };
            assert_eq!(mode, want, "{}", path.display());
        }
    }

    #[test]
    fn init_refuses_to_overwrite_unless_told() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(dir.path(), &opts(1)).unwrap();
        let before = fs::read(dir.path().join(CA_KEY_FILE)).unwrap();
        let err = init_cluster(dir.path(), &opts(1)).unwrap_err();
        assert!(matches!(err, PkiError::AlreadyInitialized { .. }), "{err}");
        assert!(err.to_string().contains("ca.crt"), "{err}");
        assert_eq!(fs::read(dir.path().join(CA_KEY_FILE)).unwrap(), before);

        let mut again = opts(1);
        again.overwrite = true;
        init_cluster(dir.path(), &again).unwrap();
        assert_ne!(fs::read(dir.path().join(CA_KEY_FILE)).unwrap(), before);
    }

    #[test]
    fn duplicate_identities_are_refused() {
        let mut o = opts(1);
        o.nodes.push(NodeId(1));
        let dir = tempfile::tempdir().unwrap();
        let err = init_cluster(dir.path(), &o).unwrap_err();
        assert!(matches!(
            err,
            PkiError::DuplicateIdentity(Identity::Node(NodeId(1)))
        ));
    }

    #[test]
    fn loader_names_the_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(dir.path(), &opts(1)).unwrap();
        fs::remove_file(key_path(dir.path(), &Identity::Node(NodeId(1)))).unwrap();
        let err = load_credentials(dir.path(), &Identity::Node(NodeId(1))).unwrap_err();
        assert!(
            matches!(
                err,
                PkiError::MissingFile {
                    what: "private key",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("node-1.key"), "{err}");

        let err = load_credentials(dir.path(), &Identity::Node(NodeId(9))).unwrap_err();
        assert!(err.to_string().contains("node-9.crt"), "{err}");
    }

    #[test]
    fn loader_names_a_bad_file_without_echoing_it() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(dir.path(), &opts(1)).unwrap();
        let key = key_path(dir.path(), &Identity::Coordinator);
        fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nSECRETSECRET!!\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = load_credentials(dir.path(), &Identity::Coordinator).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                PkiError::BadPem {
                    what: "private key",
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("coordinator.key") && !msg.contains("SECRET"),
            "{msg}"
        );
    }

    #[test]
    fn loader_refuses_a_certificate_of_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(dir.path(), &opts(2)).unwrap();
        let id1 = Identity::Node(NodeId(1));
        let id2 = Identity::Node(NodeId(2));
        fs::copy(cert_path(dir.path(), &id2), cert_path(dir.path(), &id1)).unwrap();
        let err = load_credentials(dir.path(), &id1).unwrap_err();
        assert!(matches!(err, PkiError::WrongIdentity { .. }), "{err}");
        assert!(err.to_string().contains("names node-2"), "{err}");
    }

    #[test]
    fn expired_certificates_are_in_the_past() {
        let ca = CertificateAuthority::generate("t", DEFAULT_CA_VALIDITY).unwrap();
        let issued = ca.issue_expired(&Identity::Node(NodeId(1))).unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(cert.validity().not_after.timestamp() < OffsetDateTime::now_utc().unix_timestamp());
        assert!(format!("{issued:?}").contains("redacted"));
    }

    #[test]
    fn absurd_validity_is_refused() {
        let err = CertificateAuthority::generate("t", Duration::from_secs(u64::MAX)).unwrap_err();
        assert!(matches!(err, PkiError::BadValidity { .. }));
    }
}
