//! Certificate refusals between real processes of the `nopstream` binary, with real
//! certificates: those `nopstream cluster init` writes, a second cluster's (a foreign CA),
//! and certificates the cluster's own CA issues expired or not yet valid. Both sides name
//! the reason; a refused node backs off and, when the reason cannot heal, exits with it.
//! (Wrong role and wrong name cannot be presented through the binary, which checks its own
//! certificate's identity before dialling; the cluster crate's `mtls` suite covers them
//! over real QUIC.)

mod common;

use common::cluster::{BIN, free_udp_port, serial, strip_ansi, wait_for};
use nop_stream_cluster::pki::{CA_CERT_FILE, CertificateAuthority, cert_path, key_path};
use nop_stream_cluster::{CliName, Identity, NodeId};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

struct Coordinator {
    dir: tempfile::TempDir,
    addr: String,
    child: Child,
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Coordinator {
    /// `cluster init` of the cluster (`a`) and of a foreign one (`b`), and the cluster's
    /// coordinator.
    fn start() -> Coordinator {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a", "b"] {
            let init = Command::new(BIN)
                .args(["cluster", "init"])
                .arg(dir.path().join(name))
                .args(["--nodes", "1"])
                .output()
                .unwrap();
            assert!(init.status.success(), "{}", text(&init));
        }
        let addr = format!("127.0.0.1:{}", free_udp_port("127.0.0.1".parse().unwrap()));
        let mut child = Command::new(BIN)
            .args(["coordinator", "--listen", &addr])
            .args(["--lease-ttl-ms", "2000", "--heartbeat-ms", "300"])
            .arg("--data")
            .arg(dir.path().join("coord"))
            .arg("--certs")
            .arg(dir.path().join("a"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("coordinator.log")).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("coordinator listening on"), "{line}");
        Coordinator { dir, addr, child }
    }

    fn log(&self) -> String {
        strip_ansi(&std::fs::read_to_string(self.dir.path().join("coordinator.log")).unwrap())
    }

    /// A certs directory `name` trusting the cluster's CA, holding `identity`'s
    /// certificate and key as `cert_pem` / `key_pem`.
    fn certs(&self, name: &str, identity: &Identity, cert_pem: &str, key_pem: &str) -> PathBuf {
        let d = self.dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(
            self.dir.path().join("a").join(CA_CERT_FILE),
            d.join(CA_CERT_FILE),
        )
        .unwrap();
        std::fs::write(cert_path(&d, identity), cert_pem).unwrap();
        std::fs::write(key_path(&d, identity), key_pem).unwrap();
        d
    }

    /// `identity`'s files as the foreign cluster's `init` wrote them.
    fn foreign(&self, name: &str, identity: &Identity) -> PathBuf {
        let b = self.dir.path().join("b");
        let cert = std::fs::read_to_string(cert_path(&b, identity)).unwrap();
        let key = std::fs::read_to_string(key_path(&b, identity)).unwrap();
        self.certs(name, identity, &cert, &key)
    }

    /// `identity`'s certificate from the cluster's own CA, valid from `from` to `to`
    /// days from now.
    fn issued(&self, name: &str, identity: &Identity, from: i64, to: i64) -> PathBuf {
        let ca = CertificateAuthority::load(&self.dir.path().join("a")).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let c = ca
            .issue_between(
                identity,
                now + time::Duration::days(from),
                now + time::Duration::days(to),
            )
            .unwrap();
        self.certs(name, identity, &c.cert_pem, &c.key_pem)
    }

    fn status_with(&self, certs: &Path) -> Output {
        Command::new(BIN)
            .args(["cluster", "status", "--cluster", &self.addr, "--certs"])
            .arg(certs)
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn admin() -> Identity {
    Identity::Cli(CliName::new("admin").unwrap())
}

/// Pins the CLI learning nothing of a refused certificate: a certificate of a foreign CA
/// or one not yet valid got only "cannot read frame: connection lost", the reason being
/// in the coordinator's log alone. Every refusal is named on both sides now.
#[test]
fn the_cli_and_the_coordinator_both_name_why_a_certificate_is_refused() {
    let _g = serial();
    let c = Coordinator::start();
    // The cluster's own certificates work.
    let ok = c.status_with(&c.dir.path().join("a"));
    assert!(ok.status.success(), "{}", text(&ok));
    for (certs, problem) in [
        (c.foreign("cli-foreign", &admin()), "unknown CA"),
        (c.issued("cli-future", &admin(), 1, 30), "not yet valid"),
        (c.issued("cli-expired", &admin(), -30, -1), "expired"),
    ] {
        let o = c.status_with(&certs);
        let out = text(&o);
        assert!(!o.status.success(), "{out}");
        assert!(
            out.contains(&format!("refused this side's certificate: {problem}")),
            "the CLI names `{problem}`: {out}"
        );
        assert!(!out.contains("connection lost"), "{out}");
        let log = c.log();
        assert!(
            log.contains(&format!("refused a connection, {problem}")),
            "the coordinator names `{problem}`:\n{log}"
        );
    }
}

/// Pins a refused node retrying for ever, about five times a second, with "connection
/// lost" on its side and a WARN per attempt on the coordinator's. Now it backs off
/// exponentially and, refused for a reason that cannot heal, exits after a bounded number
/// of attempts naming the reason.
#[test]
fn a_node_refused_for_a_reason_that_cannot_heal_backs_off_and_exits_naming_it() {
    let _g = serial();
    let c = Coordinator::start();
    let node = Identity::Node(NodeId(1));
    for (certs, problem) in [
        (c.foreign("node-foreign", &node), "unknown CA"),
        (c.issued("node-expired", &node, -30, -1), "expired"),
    ] {
        let log_path = c.dir.path().join(format!("{problem}.log"));
        let mut child = Command::new(BIN)
            .args(["node", "--join", &c.addr, "--id", "1"])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data")
            .arg(c.dir.path().join(format!("node-{problem}")))
            .arg("--storage")
            .arg(c.dir.path().join("coord"))
            .arg("--certs")
            .arg(&certs)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let before = c
            .log()
            .matches(&format!("refused a connection, {problem}"))
            .count();
        let mut status = None;
        wait_for("the refused node to exit", Duration::from_secs(120), || {
            status = child.try_wait().unwrap();
            status.is_some()
        });
        let log = strip_ansi(&std::fs::read_to_string(&log_path).unwrap());
        assert!(!status.unwrap().success(), "{log}");
        assert!(
            log.contains(&format!("refused this side's certificate: {problem}"))
                && log.contains("cannot heal"),
            "the node exits naming `{problem}`:\n{log}"
        );
        let attempts = c
            .log()
            .matches(&format!("refused a connection, {problem}"))
            .count()
            - before;
        assert_eq!(
            attempts,
            nop_stream_cluster::session::MAX_LASTING_REFUSALS as usize,
            "one refusal per attempt, a bounded number:\n{}",
            c.log()
        );
        // The pauses between attempts grew: 200 ms doubling (no timing asserted, only the
        // node's own account of each attempt).
        assert_eq!(
            log.matches("cannot register with the coordinator").count(),
            nop_stream_cluster::session::MAX_LASTING_REFUSALS as usize - 1,
            "{log}"
        );
    }
}
