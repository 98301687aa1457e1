//! Throwaway TLS material for the connector suites: a CA and a server certificate for
//! `localhost` and 127.0.0.1 (rcgen), and free loopback ports for servers a test starts.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// PEM files written by [`server_certs`].
pub struct Certs {
    /// The CA's certificate (what a client trusts).
    pub ca: PathBuf,
    /// The server's certificate, signed by the CA.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

/// A new CA named `name` and a server certificate it signs for `localhost` and
/// 127.0.0.1, written into `dir` as `<name>-ca.pem`, `<name>-server.pem` and
/// `<name>-server.key`.
pub fn server_certs(dir: &Path, name: &str) -> Certs {
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("nop-stream test CA {name}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf.subject_alt_names = vec![
        SanType::DnsName("localhost".try_into().unwrap()),
        SanType::IpAddress("127.0.0.1".parse().unwrap()),
    ];
    leaf.use_authority_key_identifier_extension = true;
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let out = Certs {
        ca: dir.join(format!("{name}-ca.pem")),
        cert: dir.join(format!("{name}-server.pem")),
        key: dir.join(format!("{name}-server.key")),
    };
    std::fs::write(&out.ca, ca_cert.pem()).unwrap();
    std::fs::write(&out.cert, cert.pem()).unwrap();
    std::fs::write(&out.key, key.serialize_pem()).unwrap();
    out
}

/// A loopback port free right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to 10 s until something accepts TCP connections on 127.0.0.1:`port`.
pub fn wait_for_port(port: u16) {
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "nothing listens on 127.0.0.1:{port} after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A server process killed on drop.
pub struct Child(pub std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
