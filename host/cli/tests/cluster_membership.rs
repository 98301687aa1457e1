//! Who is a member of the cluster (design §2.5), with a coordinator and node processes of
//! the `nopstream` binary over real QUIC on loopback and the certificates `nopstream
//! cluster init` writes: failure detection is the lease, every loss of a node is counted,
//! and one node id is held by one process at a time. The tests run one at a time: leases
//! on two cores must not expire by starvation.

mod common;

use common::cluster::{BIN, serial, signal, strip_ansi, wait_for};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A coordinator and node processes, killed on drop.
struct Procs {
    dir: tempfile::TempDir,
    addr: String,
    children: Vec<(String, Child)>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Procs {
    /// Certificates for two nodes and a coordinator with lease `ttl_ms`, heartbeats every
    /// `heartbeat_ms`.
    fn start(ttl_ms: u32, heartbeat_ms: u32) -> Procs {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let init = Command::new(BIN)
            .args(["cluster", "init", certs.to_str().unwrap(), "--nodes", "2"])
            .output()
            .unwrap();
        assert!(
            init.status.success(),
            "{}",
            String::from_utf8_lossy(&init.stderr)
        );
        let addr = format!(
            "127.0.0.1:{}",
            common::cluster::free_udp_port("127.0.0.1".parse().unwrap())
        );
        let mut coord = Command::new(BIN)
            .args(["coordinator", "--listen", &addr])
            .args(["--lease-ttl-ms", &ttl_ms.to_string()])
            .args(["--heartbeat-ms", &heartbeat_ms.to_string()])
            .arg("--data")
            .arg(dir.path().join("coord"))
            .arg("--certs")
            .arg(&certs)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("coordinator.log")).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(coord.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("coordinator listening on"), "{line}");
        Procs {
            dir,
            addr,
            children: vec![("coordinator".into(), coord)],
        }
    }

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// Starts a `nopstream node --id ID` process named `name` (its log is `<name>.log`).
    fn node(&mut self, id: u32, name: &str) {
        let child = Command::new(BIN)
            .args(["node", "--join", &self.addr, "--id", &id.to_string()])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data")
            .arg(self.dir.path().join(name))
            .arg("--certs")
            .arg(self.certs())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log_path(name)).unwrap())
            .spawn()
            .unwrap();
        self.children.push((name.to_owned(), child));
    }

    fn pid(&self, name: &str) -> u32 {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .id()
    }

    fn kill(&mut self, name: &str) {
        let i = self.children.iter().position(|(n, _)| n == name).unwrap();
        let (_, mut c) = self.children.remove(i);
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn log(&self, name: &str) -> String {
        strip_ansi(&std::fs::read_to_string(self.log_path(name)).unwrap_or_default())
    }

    fn status(&self) -> Vec<Value> {
        status(&self.addr, &self.certs())
    }

    fn node_status(&self, node: &str) -> Value {
        self.status()
            .into_iter()
            .find(|n| n["node"] == node)
            .unwrap_or(Value::Null)
    }
}

fn status(addr: &str, certs: &Path) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["cluster", "status", "--cluster", addr, "--certs"])
        .arg(certs)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v:#}"))
}

/// Pins failure detection following QUIC's 5 s idle timeout instead of the lease: with a
/// lease of 7 s, a frozen node's session ended at the idle timeout and its lease was
/// released, never expired, so `cluster status` counted no loss (`expired` stayed 0); and
/// a node restarted before that timeout re-registered while its old lease was left to the
/// transport. Now the lease decides (the session's idle timeout is 1.5 × the TTL), every
/// loss is counted in `lost`, and a re-registration ends the old lease at once.
#[test]
fn a_silent_node_is_lost_by_its_lease_and_every_loss_is_counted() {
    let _g = serial();
    let mut p = Procs::start(7000, 500);
    p.node(1, "node-1");
    p.node(2, "node-2");
    wait_for("two live nodes", Duration::from_secs(30), || {
        let s = p.status();
        s.len() == 2 && s.iter().all(|n| n["live"] == true)
    });

    // Frozen: no renewal, no packet. Its lease expires; nothing else ends it first.
    signal(p.pid("node-2"), "-STOP");
    wait_for("node-2 to be lost", Duration::from_secs(40), || {
        p.node_status("node-2")["live"] == false
    });
    let s = p.node_status("node-2");
    assert_eq!((n(&s, "expirations"), n(&s, "lost")), (1, 1), "{s:#}");
    assert!(
        p.log("coordinator")
            .contains("lease expired: the node is considered gone"),
        "{}",
        p.log("coordinator")
    );

    // Killed and restarted at once: the new process registers while the old lease is
    // live; the old lease ends then, counted as a loss in the same step.
    p.kill("node-1");
    p.node(1, "node-1b");
    wait_for("node-1 registered again", Duration::from_secs(30), || {
        let s = p.node_status("node-1");
        s["live"] == true && n(&s, "registrations") == 2
    });
    let s = p.node_status("node-1");
    assert_eq!((n(&s, "lost"), n(&s, "expirations")), (1, 0), "{s:#}");
    assert!(
        p.log("coordinator").contains("registered again from"),
        "{}",
        p.log("coordinator")
    );

    signal(p.pid("node-2"), "-CONT");
    wait_for("node-2 back", Duration::from_secs(30), || {
        p.node_status("node-2")["live"] == true
    });
    let s = p.node_status("node-2");
    assert_eq!((n(&s, "registrations"), n(&s, "lost")), (2, 1), "{s:#}");
}

/// Pins two processes with one node id fighting silently: a second `nopstream node --id 1`
/// made each void the other's lease about every 2 s, the registrations climbing, with
/// nothing saying that a second process claims node-1. Now the second registration is
/// refused while the first process holds and renews the lease, naming both addresses; when
/// the first process dies, the second takes its place (as a restarted node would).
#[test]
fn a_second_process_with_a_node_id_is_refused_naming_both_addresses() {
    let _g = serial();
    let mut p = Procs::start(2000, 300);
    p.node(1, "first");
    wait_for("node-1 live", Duration::from_secs(30), || {
        p.node_status("node-1")["live"] == true
    });
    let first_addr = p.node_status("node-1")["data_addr"]
        .as_str()
        .unwrap()
        .to_owned();
    let first_lease = n(&p.node_status("node-1"), "lease");

    p.node(1, "second");
    wait_for(
        "the second process refused three times",
        Duration::from_secs(60),
        || n(&p.node_status("node-1"), "refused_registrations") >= 3,
    );
    let s = p.node_status("node-1");
    assert_eq!(
        (n(&s, "registrations"), n(&s, "lost"), n(&s, "lease")),
        (1, 0, first_lease),
        "the first process keeps its lease: {s:#}"
    );
    assert_eq!(s["live"], true);
    let second = p.log("second");
    let refusal = second
        .lines()
        .find(|l| l.contains("refusing a second registration"))
        .unwrap_or_else(|| panic!("the second process is told why:\n{second}"));
    assert!(
        refusal.contains(&format!("registered from {first_addr}"))
            && refusal.matches("127.0.0.1:").count() >= 2,
        "both addresses named: {refusal}"
    );
    assert!(
        p.log("coordinator")
            .contains("refusing a second registration"),
        "{}",
        p.log("coordinator")
    );
    assert!(
        !p.log("first").contains("refused"),
        "the first process is left alone:\n{}",
        p.log("first")
    );

    // The first process dies: the second is accepted once the old lease went silent.
    p.kill("first");
    wait_for(
        "the second process registered",
        Duration::from_secs(60),
        || {
            let s = p.node_status("node-1");
            s["live"] == true && n(&s, "registrations") == 2
        },
    );
    let s = p.node_status("node-1");
    assert!(n(&s, "lease") > first_lease && n(&s, "lost") == 1, "{s:#}");
}

/// The `deploying` lines of the coordinator's log: (generation, nodes).
fn deployments(cluster: &common::cluster::Cluster) -> Vec<(u64, String)> {
    cluster
        .log("coordinator.log")
        .lines()
        .filter(|l| l.contains("deploying"))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_owned)
            };
            Some((field("generation=")?.parse().ok()?, field("nodes=")?))
        })
        .collect()
}

/// Pins a recovery stalling about 18 s when it deployed onto a node that had just frozen:
/// the coordinator waited for each node's prepare in turn, and the frozen node's peers
/// waited for its data connection for the whole `PEER_WAIT` (15 s), long after its lease
/// had ended. Now the deployment fails the moment the lost node's lease ends, and its
/// peers stop waiting when the generation is fenced; the output is still exact.
#[test]
fn a_deployment_onto_a_node_lost_meanwhile_fails_when_its_lease_ends() {
    use common::cluster::{Cluster, committed, embedded, job_copy, repo};
    let _g = serial();
    // A 6 s lease: node-1, frozen, stays in the cluster long enough to be deployed onto.
    let mut cluster = Cluster::start_with_lease(3, 6000, 500);
    let tmp = tempfile::tempdir().unwrap();
    let expected = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    // The job runs on node-2 and node-3 first: node-1 is away.
    cluster.kill_node(1);
    wait_for("node-1 gone", Duration::from_secs(30), || {
        cluster.node_status(1).is_some_and(|s| s["live"] == false)
    });
    let job = job_copy("flights.toml", 100, 8_000);
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "2", "--fresh"]);
    wait_for(
        "the job running on node-2 and node-3",
        Duration::from_secs(60),
        || cluster.nodes_of(&id) == [2, 3] && !cluster.status(&id)["durable_epoch"].is_null(),
    );
    // node-1 joins with no task, and freezes. node-2 restarts at once: the recovery
    // deploys onto node-1 (first in id order) while its lease is live. node-1 has the
    // lowest id, so node-2 waits for it to dial.
    cluster.start_node(1);
    cluster.wait_live(3);
    let generation = cluster.status(&id)["generation"].as_u64().unwrap();
    signal(cluster.node_pid(1), "-STOP");
    cluster.kill_node(2);
    cluster.start_node(2);
    wait_for(
        "a deployment that includes the frozen node-1",
        Duration::from_secs(30),
        || {
            deployments(&cluster)
                .iter()
                .any(|(g, nodes)| *g > generation && nodes.contains("node-1"))
        },
    );
    let onto_frozen = deployments(&cluster)
        .iter()
        .filter(|(g, nodes)| *g > generation && nodes.contains("node-1"))
        .map(|(g, _)| *g)
        .max()
        .unwrap();
    wait_for(
        "a deployment without node-1",
        Duration::from_secs(60),
        || {
            deployments(&cluster)
                .iter()
                .any(|(g, nodes)| *g > onto_frozen && !nodes.contains("node-1"))
        },
    );
    signal(cluster.node_pid(1), "-CONT");
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    assert_eq!(
        committed(&out),
        expected,
        "the output after the lost deployment: {status:#}"
    );
    let peers = cluster.log("node-2.log") + &cluster.log("node-3.log");
    assert!(
        !peers.contains("did not connect within"),
        "a peer waited out PEER_WAIT:\n{peers}"
    );
    assert!(
        peers.contains("stopped waiting for node-1"),
        "node-2 stopped waiting when the generation was fenced:\n{peers}"
    );
    assert!(
        cluster
            .log("coordinator.log")
            .contains("node-1: preparing tasks: node-1 left before answering"),
        "the deployment failed naming the lost node:\n{}",
        cluster.log_tail("coordinator.log")
    );
}
