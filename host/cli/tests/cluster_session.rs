//! A coordinator and three node processes over real QUIC on loopback with the
//! certificates `nopstream cluster init` wrote: the nodes register and keep their leases
//! live; a node SIGSTOPped past its lease is seen expired by the coordinator, and after
//! SIGCONT it notices it lost its lease, stops its tasks and registers again as new
//! capacity under a new lease. Lease TTL 2 s, heartbeats every 300 ms; this binary holds
//! one test so nothing else competes for the cores while leases run.

mod common;

use common::kit::BIN;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills every child on drop, so a failed assertion leaves no process behind.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn status(addr: &str, certs: &Path) -> Vec<Value> {
    let out = Command::new(BIN)
        .args([
            "cluster",
            "status",
            "--cluster",
            addr,
            "--certs",
            certs.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn node<'a>(nodes: &'a [Value], name: &str) -> Option<&'a Value> {
    nodes.iter().find(|n| n["node"] == name)
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nodes_hold_leases_and_a_stopped_node_loses_its_lease_and_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let init = Command::new(BIN)
        .args(["cluster", "init", certs.to_str().unwrap(), "--nodes", "3"])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let addr = format!("127.0.0.1:{}", free_udp_port());
    let mut procs = Procs(Vec::new());
    let mut coord = Command::new(BIN)
        .args([
            "coordinator",
            "--listen",
            &addr,
            "--lease-ttl-ms",
            "2000",
            "--heartbeat-ms",
            "300",
        ])
        .arg("--data")
        .arg(dir.path().join("coord"))
        .arg("--certs")
        .arg(&certs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(coord.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("coordinator listening on"), "{line}");
    procs.0.push(coord);
    let node_log = dir.path().join("node-2.log");
    for id in 1..=3 {
        let mut cmd = Command::new(BIN);
        cmd.args(["node", "--join", &addr, "--id", &id.to_string()])
            .arg("--storage")
            .arg(dir.path().join("coord"))
            .arg("--data")
            .arg(dir.path().join(format!("node-{id}")))
            .arg("--certs")
            .arg(&certs)
            .stdout(Stdio::null());
        if id == 2 {
            cmd.stderr(std::fs::File::create(&node_log).unwrap());
        } else {
            cmd.stderr(Stdio::null());
        }
        procs.0.push(cmd.spawn().unwrap());
    }
    wait_for("three live nodes", Duration::from_secs(30), || {
        let s = status(&addr, &certs);
        s.len() == 3 && s.iter().all(|n| n["live"] == true)
    });
    // Leases stay live across several TTLs: the heartbeats renew them.
    std::thread::sleep(Duration::from_secs(3));
    let s = status(&addr, &certs);
    assert!(
        s.iter().all(|n| n["live"] == true && n["expirations"] == 0),
        "{s:#?}"
    );
    let first_lease = node(&s, "node-2").unwrap()["lease"].as_u64().unwrap();
    assert!(
        node(&s, "node-2").unwrap()["renewals"].as_u64().unwrap() >= 5,
        "{s:#?}"
    );

    let pid = procs.0[2].id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for("node-2's lease to expire", Duration::from_secs(10), || {
        let s = status(&addr, &certs);
        let n = node(&s, "node-2").unwrap();
        n["live"] == false && n["expirations"].as_u64().unwrap() >= 1
    });
    let s = status(&addr, &certs);
    assert!(
        node(&s, "node-1").unwrap()["live"] == true && node(&s, "node-3").unwrap()["live"] == true,
        "{s:#?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for(
        "node-2 to rejoin under a new lease",
        Duration::from_secs(15),
        || {
            let s = status(&addr, &certs);
            let n = node(&s, "node-2").unwrap();
            n["live"] == true
                && n["registrations"] == 2
                && n["lease"].as_u64().unwrap() > first_lease
        },
    );
    let log = std::fs::read_to_string(&node_log).unwrap();
    // Resumed, it finds its own deadline passed (LeaseLost) or first reads the
    // coordinator's end of the session naming the expired lease; either way it stops its
    // tasks itself.
    assert!(
        log.contains("stopping this node's tasks")
            && (log.contains("LeaseLost") || log.contains("expired")),
        "node-2 must stop its tasks itself:\n{log}"
    );
}
