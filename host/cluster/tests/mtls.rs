//! Mutual TLS over real QUIC on loopback with real certificates: the happy path and every
//! way a peer is refused, each asserted on the accepting side's error and on what the
//! dialler sees. Every test is bounded by [`LIMIT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use nop_stream_cluster::frame::{self, FrameError};
use nop_stream_cluster::pki::DEFAULT_CA_VALIDITY;
use nop_stream_cluster::refusal::classify;
use nop_stream_cluster::{
    CertProblem, CertificateAuthority, CliName, ClusterEndpoint, ConnectError, Credentials,
    Identity, InitOptions, NodeId, Protocol, TransportSettings, handshake, init_cluster,
    load_credentials,
};
use quinn::crypto::rustls::QuicClientConfig;
use tokio::sync::mpsc;

/// Upper bound of every test; nothing here may hang.
const LIMIT: Duration = Duration::from_secs(20);
/// Cap of hello/welcome frames.
const MAX: u32 = 1024;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn node(id: u32) -> Identity {
    Identity::Node(NodeId(id))
}

/// A coordinator that accepts connections, reads a hello frame (the claimed identity label)
/// on the first bi stream, checks it, and answers `welcome <identity>`. Each connection's
/// outcome — the registered identity or the refusal message — goes to `outcomes`.
struct Coordinator {
    addr: SocketAddr,
    outcomes: mpsc::UnboundedReceiver<Result<Identity, String>>,
    _endpoint: Arc<ClusterEndpoint>,
}

impl Coordinator {
    fn start(creds: &Credentials) -> anyhow::Result<Self> {
        let endpoint = Arc::new(ClusterEndpoint::bind(
            loopback(),
            creds,
            &[Protocol::Node, Protocol::Cli],
            &TransportSettings::default(),
        )?);
        let addr = endpoint.local_addr()?;
        let (tx, outcomes) = mpsc::unbounded_channel();
        let ep = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(session(incoming).await);
                });
            }
        });
        Ok(Self {
            addr,
            outcomes,
            _endpoint: endpoint,
        })
    }

    async fn next_outcome(&mut self) -> anyhow::Result<Result<Identity, String>> {
        tokio::time::timeout(LIMIT, self.outcomes.recv())
            .await
            .context("no connection outcome in time")?
            .context("accept loop ended")
    }
}

/// The problem a refusal names, in brackets after the message, as both sides log it.
fn named(message: String, problem: Option<CertProblem>) -> String {
    match problem {
        Some(p) => format!("{message} [{}]", p.name()),
        None => message,
    }
}

/// The certificate problem an error of the dialling side names, if any.
fn client_problem(e: &anyhow::Error) -> Option<CertProblem> {
    e.chain().find_map(|c| {
        let lost = |r: &quinn::ReadError| match r {
            quinn::ReadError::ConnectionLost(c) => classify(c).map(|r| r.problem),
            _ => None,
        };
        if let Some(FrameError::Read(r)) = c.downcast_ref::<FrameError>() {
            return lost(r);
        }
        if let Some(r) = c.downcast_ref::<quinn::ReadError>() {
            return lost(r);
        }
        if let Some(ce) = c.downcast_ref::<quinn::ConnectionError>() {
            return classify(ce).map(|r| r.problem);
        }
        c.downcast_ref::<ConnectError>()
            .and_then(|e| e.refusal())
            .map(|r| r.problem)
    })
}

async fn session(incoming: quinn::Incoming) -> Result<Identity, String> {
    let peer = handshake(incoming).await.map_err(|e| {
        let problem = e.refusal().map(|r| r.problem);
        named(e.to_string(), problem)
    })?;
    let (mut send, mut recv) = peer
        .connection
        .accept_bi()
        .await
        .map_err(|e| e.to_string())?;
    let hello = frame::read_frame(&mut recv, MAX)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("stream ended before the hello")?;
    let claimed: Identity = std::str::from_utf8(&hello)
        .map_err(|e| e.to_string())?
        .parse()
        .map_err(|e: nop_stream_cluster::IdentityParseError| e.to_string())?;
    if let Err(e) = peer.check_claim(&claimed) {
        peer.refuse(&e);
        return Err(named(e.to_string(), Some(e.problem())));
    }
    let welcome = format!("welcome {}", peer.certified);
    frame::write_frame(&mut send, welcome.as_bytes(), MAX)
        .await
        .map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())?;
    // The dialler closes once it has read the welcome; closing first could drop it (P3).
    let _ = tokio::time::timeout(LIMIT, peer.connection.closed()).await;
    Ok(peer.certified.clone())
}

/// Dials the coordinator, sends `claim` as hello and returns the welcome. Registration
/// counts only once the welcome arrives (TLS 1.3 clients learn of a refused certificate at
/// their first read, notes P8).
async fn register(
    endpoint: &ClusterEndpoint,
    addr: SocketAddr,
    protocol: Protocol,
    claim: &Identity,
) -> anyhow::Result<String> {
    let peer = endpoint
        .connect(addr, &Identity::Coordinator, protocol)
        .await?;
    exchange(&peer.connection, claim).await
}

async fn exchange(connection: &quinn::Connection, claim: &Identity) -> anyhow::Result<String> {
    let (mut send, mut recv) = connection.open_bi().await?;
    frame::write_frame(&mut send, claim.label().as_bytes(), MAX).await?;
    let welcome = frame::read_frame(&mut recv, MAX)
        .await?
        .context("coordinator finished the stream without a welcome")?;
    connection.close(0u32.into(), b"done");
    Ok(String::from_utf8(welcome)?)
}

fn client_endpoint(creds: &Credentials) -> anyhow::Result<ClusterEndpoint> {
    Ok(ClusterEndpoint::bind(
        loopback(),
        creds,
        &[],
        &TransportSettings::default(),
    )?)
}

struct Cluster {
    ca: CertificateAuthority,
    coordinator: Coordinator,
}

fn cluster() -> anyhow::Result<Cluster> {
    let ca = CertificateAuthority::generate("test", DEFAULT_CA_VALIDITY)?;
    let coordinator = Coordinator::start(&ca.issue_credentials(&Identity::Coordinator)?)?;
    Ok(Cluster { ca, coordinator })
}

async fn bounded<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(LIMIT, f)
        .await
        .context("test exceeded its time limit")?
}

/// Runs a dial that must fail and returns the dialler's error and the coordinator's
/// refusal; the dialler's error ends with the problem it names in brackets.
async fn refused(
    c: &mut Cluster,
    dial: impl std::future::Future<Output = anyhow::Result<String>>,
) -> anyhow::Result<(String, String)> {
    let client = match dial.await {
        Ok(welcome) => bail!("dial succeeded with {welcome:?}"),
        Err(e) => named(format!("{e:#}"), client_problem(&e)),
    };
    let server = match c.coordinator.next_outcome().await? {
        Ok(id) => bail!("coordinator registered {id}"),
        Err(e) => e,
    };
    eprintln!("coordinator: {server}\ndialler: {client}");
    Ok((client, server))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_registers_and_exchanges_a_frame() -> anyhow::Result<()> {
    bounded(async {
        // Certificates as `cluster init` writes them, read back from disk.
        let dir = tempfile::tempdir()?;
        init_cluster(dir.path(), &InitOptions::with_nodes(2))?;
        let mut coordinator =
            Coordinator::start(&load_credentials(dir.path(), &Identity::Coordinator)?)?;
        for id in [1, 2] {
            let me = node(id);
            let ep = client_endpoint(&load_credentials(dir.path(), &me)?)?;
            let welcome = register(&ep, coordinator.addr, Protocol::Node, &me).await?;
            assert_eq!(welcome, format!("welcome node-{id}"));
            assert_eq!(coordinator.next_outcome().await?, Ok(me));
            ep.shutdown(Duration::from_secs(1)).await;
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_registers_on_the_cli_protocol() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let me = Identity::Cli(CliName::new("ops")?);
        let ep = client_endpoint(&c.ca.issue_credentials(&me)?)?;
        let welcome = register(&ep, c.coordinator.addr, Protocol::Cli, &me).await?;
        assert_eq!(welcome, "welcome cli-ops");
        assert_eq!(c.coordinator.next_outcome().await?, Ok(me));
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_certificate_is_refused() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(c.ca.cert_der().clone())?;
        let mut tls =
            rustls::ClientConfig::builder_with_provider(nop_stream_cluster::tls::crypto_provider())
                .with_protocol_versions(&[&rustls::version::TLS13])?
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![nop_stream_cluster::NODE_ALPN.to_vec()];
        let config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
        let ep = quinn::Endpoint::client(loopback())?;
        let addr = c.coordinator.addr;
        let (client, server) = refused(&mut c, async {
            let conn = ep
                .connect_with(config, addr, "coordinator.nopstream")?
                .await?;
            exchange(&conn, &node(1)).await
        })
        .await?;
        assert!(server.contains("handshake with 127.0.0.1"), "{server}");
        assert!(server.contains("peer sent no certificates"), "{server}");
        assert!(server.ends_with("[no certificate]"), "{server}");
        assert!(
            client.contains("aborted by peer") && client.contains("peer sent no certificates"),
            "{client}"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_a_foreign_ca_is_refused() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let foreign = CertificateAuthority::generate("elsewhere", DEFAULT_CA_VALIDITY)?;
        // It trusts our CA (so it accepts the coordinator) but presents a foreign certificate.
        let creds = foreign
            .issue_credentials(&node(1))?
            .with_ca(c.ca.cert_der().clone());
        let ep = client_endpoint(&creds)?;
        let addr = c.coordinator.addr;
        let (client, server) =
            refused(&mut c, register(&ep, addr, Protocol::Node, &node(1))).await?;
        assert!(
            server.contains("invalid peer certificate: UnknownIssuer"),
            "{server}"
        );
        assert!(client.contains("UnknownIssuer"), "{client}");
        // Both sides name the problem.
        assert!(server.ends_with("[unknown CA]"), "{server}");
        assert!(client.ends_with("[unknown CA]"), "{client}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let creds = c.ca.credentials(&c.ca.issue_expired(&node(1))?)?;
        let ep = client_endpoint(&creds)?;
        let addr = c.coordinator.addr;
        let (client, server) =
            refused(&mut c, register(&ep, addr, Protocol::Node, &node(1))).await?;
        assert!(
            server.contains("invalid peer certificate: certificate expired"),
            "{server}"
        );
        assert!(client.contains("certificate expired"), "{client}");
        assert!(server.ends_with("[expired]"), "{server}");
        assert!(client.ends_with("[expired]"), "{client}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_certificate_on_the_node_protocol_is_refused() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let cli = Identity::Cli(CliName::new("ops")?);
        let ep = client_endpoint(&c.ca.issue_credentials(&cli)?)?;
        let addr = c.coordinator.addr;
        let (client, server) = refused(&mut c, register(&ep, addr, Protocol::Node, &cli)).await?;
        assert!(
            server.contains("presents the certificate of cli-ops (role cli), which protocol nopstream-node/1 does not admit as client"),
            "{server}"
        );
        // The dialler learns why: the close reason carries the message.
        assert!(client.contains("does not admit"), "{client}");
        assert!(server.ends_with("[wrong role]"), "{server}");
        assert!(client.ends_with("[wrong role]"), "{client}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_claiming_another_id_is_refused() -> anyhow::Result<()> {
    bounded(async {
        let mut c = cluster()?;
        let ep = client_endpoint(&c.ca.issue_credentials(&node(1))?)?;
        let addr = c.coordinator.addr;
        let (client, server) =
            refused(&mut c, register(&ep, addr, Protocol::Node, &node(2))).await?;
        assert!(
            server.contains("claims to be node-2 but its certificate names node-1"),
            "{server}"
        );
        assert!(client.contains("claims to be node-2"), "{client}");
        assert!(server.ends_with("[wrong name]"), "{server}");
        assert!(client.ends_with("[wrong name]"), "{client}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dialler_refuses_a_server_with_another_name() -> anyhow::Result<()> {
    bounded(async {
        let c = cluster()?;
        let ep = client_endpoint(&c.ca.issue_credentials(&node(1))?)?;
        // The coordinator's certificate does not name node-2.
        let err = ep
            .connect(c.coordinator.addr, &node(2), Protocol::Node)
            .await
            .expect_err("dialled the wrong identity");
        assert!(matches!(err, ConnectError::Handshake { .. }), "{err}");
        assert_eq!(
            err.refusal().map(|r| (r.problem, r.whose)),
            Some((CertProblem::WrongName, nop_stream_cluster::Whose::Theirs))
        );
        assert!(
            err.to_string()
                .contains(r#"certificate not valid for name "node-2.nopstream""#),
            "{err}"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_refused_without_allocating_it() -> anyhow::Result<()> {
    bounded(async {
        let ca = CertificateAuthority::generate("test", DEFAULT_CA_VALIDITY)?;
        let server = ClusterEndpoint::bind(
            loopback(),
            &ca.issue_credentials(&node(1))?,
            &[Protocol::Node],
            &TransportSettings::default(),
        )?;
        let addr = server.local_addr()?;
        let reader = tokio::spawn(async move {
            let incoming = server.accept().await.context("no incoming")?;
            let peer = handshake(incoming).await?;
            let mut recv = peer.connection.accept_uni().await?;
            let got = frame::read_frame(&mut recv, MAX).await;
            anyhow::Ok(got)
        });
        let ep = client_endpoint(&ca.issue_credentials(&node(2))?)?;
        let peer = ep.connect(addr, &node(1), Protocol::Node).await?;
        let mut send = peer.connection.open_uni().await?;
        // A prefix claiming 3 GiB, and a few bytes. The reader refuses on the prefix alone
        // and may close the connection before the second write: that write's outcome is
        // not part of the assertion (regression: the test failed about 1 run in 5 on it).
        send.write_all(&0xC000_0000u32.to_be_bytes()).await?;
        let _ = send.write_all(b"tiny").await;
        match reader.await?? {
            Err(FrameError::TooLarge { size, max }) => assert_eq!((size, max), (0xC000_0000, MAX)),
            other => bail!("expected TooLarge, got {other:?}"),
        }
        Ok(())
    })
    .await
}
