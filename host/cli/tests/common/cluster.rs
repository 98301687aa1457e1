//! A coordinator and its nodes as real processes of the `nopstream` binary over QUIC, with
//! the certificates `nopstream cluster init` writes and the bundled plugins uploaded; the
//! flights jobs they run; and the checks of their output. Lease TTL 2 s, heartbeats every
//! 300 ms.
//!
//! `NOPSTREAM_TEST_KEEP=1` keeps a cluster's directory (logs, data) after its test;
//! `NOPSTREAM_TEST_LOG` is the processes' `RUST_LOG` (default `info`).
//!
//! By default every process listens on loopback ([`Layout::loopback`]); a [`Layout`] can
//! put the coordinator on another address and start each node under a command prefix
//! (`ip netns exec NS`) listening on an address of its own.

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use super::kit::{BIN, committed, repo};
pub const TTL_MS: &str = "2000";
pub const HEARTBEAT_MS: &str = "300";

static SERIAL: Mutex<()> = Mutex::new(());

/// The tests of a cluster binary run one at a time: leases on two cores must not expire by
/// starvation.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Prints how long a test took when it ends (also on failure).
pub struct Timed(pub &'static str, pub Instant);

impl Drop for Timed {
    fn drop(&mut self) {
        // Written to stderr directly, past the test harness's capture, so the duration
        // shows in every run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "[cluster suite] {} took {:.1} s",
            self.0,
            self.1.elapsed().as_secs_f64()
        );
    }
}

/// A small deterministic generator for kill moments; the seed is printed so a failure
/// can be replayed (`NOPSTREAM_TEST_SEED`).
pub struct Rng(u64);

impl Rng {
    pub fn new(test: &str) -> Rng {
        let seed = std::env::var("NOPSTREAM_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("[cluster suite] {test}: seed {seed}");
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A UDP port free on `ip` now.
pub fn free_udp_port(ip: IpAddr) -> u16 {
    std::net::UdpSocket::bind((ip, 0))
        .unwrap_or_else(|e| panic!("cannot bind a UDP socket on {ip}: {e}"))
        .local_addr()
        .unwrap()
        .port()
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Where a node process runs.
#[derive(Debug, Clone)]
pub struct NodeSite {
    /// Command the node runs under (e.g. `ip netns exec NS`); empty for none.
    pub prefix: Vec<String>,
    /// Its `--listen` address (an IP with port 0: the address other nodes dial).
    pub listen: String,
}

/// Where a cluster's processes run: the coordinator's address (its port is chosen free)
/// and the command it runs under, one site per node, node `i` at index `i − 1`, and the
/// storage location every process is given (default: the coordinator's data directory).
#[derive(Debug, Clone)]
pub struct Layout {
    pub coordinator_ip: IpAddr,
    /// Command the coordinator runs under (e.g. `ip netns exec NS`); empty for none.
    pub coordinator_prefix: Vec<String>,
    pub nodes: Vec<NodeSite>,
    /// `--storage` of every process; `None`: the coordinator's data directory.
    pub storage: Option<String>,
}

impl Layout {
    /// Every process on loopback, with no prefix.
    pub fn loopback(n: u32) -> Layout {
        Layout {
            coordinator_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            coordinator_prefix: Vec::new(),
            storage: None,
            nodes: (0..n)
                .map(|_| NodeSite {
                    prefix: Vec::new(),
                    listen: "127.0.0.1:0".into(),
                })
                .collect(),
        }
    }
}

/// A coordinator and its nodes; every process is killed on drop.
pub struct Cluster {
    dir: tempfile::TempDir,
    addr: String,
    /// `--lease-ttl-ms` and `--heartbeat-ms` of the coordinator.
    lease: (String, String),
    layout: Layout,
    coordinator: Option<Child>,
    nodes: Vec<Option<Child>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::env::var_os("NOPSTREAM_TEST_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!(
                "[cluster suite] logs and data kept in {}",
                self.dir.path().display()
            );
        }
        let all = self
            .coordinator
            .iter_mut()
            .chain(self.nodes.iter_mut().flatten());
        for c in all {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Cluster {
    /// Starts a coordinator and `n` nodes on loopback, waits until every node holds a live
    /// lease, and uploads the bundled plugins.
    pub fn start(n: u32) -> Cluster {
        Cluster::start_in(Layout::loopback(n))
    }

    /// As [`Self::start`], with a lease of `ttl_ms` renewed every `heartbeat_ms`.
    pub fn start_with_lease(n: u32, ttl_ms: u32, heartbeat_ms: u32) -> Cluster {
        Cluster::start_full(
            Layout::loopback(n),
            (ttl_ms.to_string(), heartbeat_ms.to_string()),
        )
    }

    /// As [`Self::start`], with the processes where `layout` puts them.
    pub fn start_in(layout: Layout) -> Cluster {
        Cluster::start_full(layout, (TTL_MS.to_owned(), HEARTBEAT_MS.to_owned()))
    }

    fn start_full(layout: Layout, lease: (String, String)) -> Cluster {
        let n = layout.nodes.len() as u32;
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let init = Command::new(BIN)
            .args(["cluster", "init"])
            .arg(&certs)
            .args(["--nodes", &n.to_string()])
            .output()
            .unwrap();
        assert!(
            init.status.success(),
            "{}",
            String::from_utf8_lossy(&init.stderr)
        );
        let ip = layout.coordinator_ip;
        // A coordinator in a namespace of its own has every port free there.
        let port = if layout.coordinator_prefix.is_empty() {
            free_udp_port(ip)
        } else {
            7400
        };
        let mut c = Cluster {
            addr: std::net::SocketAddr::new(ip, port).to_string(),
            lease,
            layout,
            dir,
            coordinator: None,
            nodes: Vec::new(),
        };
        c.start_coordinator();
        for id in 1..=n {
            c.nodes.push(None);
            c.start_node(id);
        }
        c.wait_live(n);
        let plugins = PathBuf::from(nop_stream_artifacts::PLUGIN_DIR);
        let files: Vec<PathBuf> = [
            "file_source",
            "flights_mapper",
            "keyed_aggregate",
            "jsonl_sink",
            "window_aggregate",
            "delay_cascade",
        ]
        .iter()
        .map(|f| plugins.join(format!("{f}.wasm")))
        .collect();
        let out = c.cli(&["plugin", "upload"], &files);
        assert!(out.0, "upload: {}", out.1);
        c
    }

    pub fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// A file in the cluster's directory (`coordinator.log`, `node-N.log`, ...).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The whole of a log in the cluster's directory, without its colours (so that
    /// `key=value` fields can be matched).
    pub fn log(&self, name: &str) -> String {
        strip_ansi(&std::fs::read_to_string(self.path(name)).unwrap_or_default())
    }

    /// The address the current coordinator serves HTTP on (`--http`, as its log says).
    pub fn http_addr(&self) -> String {
        const SAYS: &str = "http: /metrics and /api/v1/ on http://";
        self.log("coordinator.log")
            .lines()
            .rev()
            .find_map(|l| l.split_once(SAYS).map(|(_, a)| a.trim().to_owned()))
            .expect("the coordinator serves HTTP")
    }

    /// `--storage` of every process.
    pub fn storage(&self) -> String {
        self.layout
            .storage
            .clone()
            .unwrap_or_else(|| self.dir.path().join("coord").display().to_string())
    }

    /// Kills the coordinator and starts it again, with its data directory emptied first if
    /// `empty_data` (a coordinator started elsewhere: it keeps nothing that matters there).
    pub fn restart_coordinator(&mut self, empty_data: bool) {
        self.kill_coordinator();
        if empty_data {
            let _ = std::fs::remove_dir_all(self.dir.path().join("coord"));
        }
        self.start_coordinator();
    }

    pub fn start_coordinator(&mut self) {
        let mut cmd = match self.layout.coordinator_prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let mut child = cmd
            .args([
                "coordinator",
                "--listen",
                &self.addr,
                "--lease-ttl-ms",
                &self.lease.0,
                "--heartbeat-ms",
                &self.lease.1,
            ])
            .arg("--data")
            .arg(self.dir.path().join("coord"))
            .arg("--storage")
            .arg(self.storage())
            .arg("--certs")
            .arg(self.certs())
            .args(["--http", "127.0.0.1:0"])
            .env("RUST_LOG", log_filter())
            .stdout(Stdio::piped())
            .stderr(log_file(&self.dir.path().join("coordinator.log")))
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains("coordinator listening on"),
            "{line}\n--- coordinator log:\n{}",
            self.log_tail("coordinator.log")
        );
        self.coordinator = Some(child);
    }

    pub fn start_node(&mut self, id: u32) {
        let site = &self.layout.nodes[id as usize - 1];
        let mut cmd = match site.prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .args(["node", "--join", &self.addr, "--id", &id.to_string()])
            .args(["--listen", &site.listen])
            .arg("--storage")
            .arg(self.storage())
            .arg("--data")
            .arg(self.dir.path().join(format!("node-{id}")))
            .arg("--certs")
            .arg(self.certs())
            .env("RUST_LOG", log_filter())
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.path().join(format!("node-{id}.log"))))
            .spawn()
            .unwrap();
        self.nodes[id as usize - 1] = Some(child);
    }

    pub fn node_pid(&self, id: u32) -> u32 {
        self.nodes[id as usize - 1].as_ref().unwrap().id()
    }

    pub fn kill_node(&mut self, id: u32) {
        let mut c = self.nodes[id as usize - 1].take().unwrap();
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    pub fn kill_coordinator(&mut self) {
        let mut c = self.coordinator.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Runs the CLI against this cluster: `args`, then `files`, then the cluster flags.
    /// Returns success, stdout and stderr.
    pub fn cli_out(&self, args: &[&str], files: &[PathBuf]) -> (bool, String, String) {
        let (code, out, err) = self.cli_code(args, files);
        (code == Some(0), out, err)
    }

    /// As [`Self::cli_out`], with the exit code.
    pub fn cli_code(&self, args: &[&str], files: &[PathBuf]) -> (Option<i32>, String, String) {
        let out = Command::new(BIN)
            .args(args)
            .args(files)
            .args(["--cluster", &self.addr])
            .arg("--certs")
            .arg(self.certs())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// As [`Self::cli_out`], stdout and stderr together.
    pub fn cli(&self, args: &[&str], files: &[PathBuf]) -> (bool, String) {
        let (ok, out, err) = self.cli_out(args, files);
        (ok, format!("{out}{err}"))
    }

    pub fn json_of(&self, args: &[&str], files: &[PathBuf]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let (ok, out, err) = self.cli_out(&a, files);
        assert!(ok, "{args:?}: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"))
    }

    pub fn json(&self, args: &[&str]) -> Value {
        self.json_of(args, &[])
    }

    /// `nopstream cluster status`: one entry per node that ever registered.
    pub fn nodes_status(&self) -> Vec<Value> {
        self.json(&["cluster", "status"])
            .as_array()
            .unwrap()
            .clone()
    }

    /// The cluster status entry of node `id`.
    pub fn node_status(&self, id: u32) -> Option<Value> {
        let name = format!("node-{id}");
        self.nodes_status().into_iter().find(|s| s["node"] == name)
    }

    pub fn wait_live(&self, n: u32) {
        let started = Instant::now();
        let limit = Duration::from_secs(60);
        loop {
            let s = self.nodes_status();
            if s.iter().filter(|x| x["live"] == true).count() == n as usize {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "timed out after {limit:?} waiting for {n} nodes to hold a live lease: {s:#?}\n{}",
                (1..=n)
                    .map(|id| format!(
                        "--- node-{id}.log:\n{}",
                        self.log_tail(&format!("node-{id}.log"))
                    ))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn status(&self, job: &str) -> Value {
        self.json(&["job", "status", job])
    }

    /// Submits `job` (a job file) with its output in `out`; returns the job id.
    pub fn submit(&self, job: &Path, out: &Path, extra: &[&str]) -> String {
        let mut args = vec!["job", "submit"];
        args.extend_from_slice(extra);
        args.push("--output");
        let out = out.display().to_string();
        args.push(&out);
        self.json_of(&args, &[job.to_owned()])["job"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Waits until `job` ended; panics unless it finished.
    pub fn wait_finished(&self, job: &str, limit: Duration) -> Value {
        let mut last = Value::Null;
        wait_for(&format!("job {job} to end"), limit, || {
            last = self.status(job);
            last["state"] != "Running" && last["state"] != "Submitted"
        });
        assert_eq!(
            last["state"],
            "Finished",
            "{last:#}\n--- coordinator log tail:\n{}{}",
            self.log_tail("coordinator.log"),
            (1..=self.nodes.len())
                .map(|id| format!(
                    "\n--- node-{id}.log tail:\n{}",
                    self.log_tail(&format!("node-{id}.log"))
                ))
                .collect::<String>()
        );
        last
    }

    /// The last 40 lines of a log in the cluster's directory.
    pub fn log_tail(&self, name: &str) -> String {
        let text = self.log(name);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Nodes (ids) holding tasks of the generation `status` (a job status) shows.
    pub fn nodes_in(status: &Value) -> Vec<u32> {
        let Some(d) = status["deployment_json"].as_str() else {
            return Vec::new();
        };
        let d: Value = serde_json::from_str(d).unwrap();
        let mut ids: Vec<u32> = d["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t["node"].as_str().unwrap()["node-".len()..]
                    .parse()
                    .unwrap()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Nodes (ids) holding tasks of `job`'s live generation.
    pub fn nodes_of(&self, job: &str) -> Vec<u32> {
        Self::nodes_in(&self.status(job))
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The processes' `RUST_LOG`: `info`, or `NOPSTREAM_TEST_LOG` if set.
pub fn log_filter() -> String {
    std::env::var("NOPSTREAM_TEST_LOG").unwrap_or_else(|_| "info".into())
}

/// A log file, appended to (a restarted process goes on where the last one ended).
pub fn log_file(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .unwrap()
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A copy of an example job with a given checkpoint interval, next to the example data
/// (relative grants and prepare steps resolve against the job file's directory).
pub struct JobCopy(pub PathBuf, tempfile::TempDir);

/// A copy of `example` (in a temporary directory, removed on drop) with epochs every `interval_ms` and each source subtask throttled
/// to `rate` records per second, so that a run lasts long enough to be interrupted.
pub fn job_copy(example: &str, interval_ms: u64, rate: u64) -> JobCopy {
    let text = std::fs::read_to_string(repo().join("examples/flights").join(example)).unwrap();
    let mut out = String::new();
    let mut throttled = false;
    for line in text.lines() {
        if line.starts_with("checkpoint_interval_ms") {
            continue;
        }
        if !throttled && line.starts_with("config = { path = \"/input/") {
            throttled = true;
            out.push_str(&line.replacen(
                "config = { ",
                &format!("config = {{ max_records_per_second = {rate}, "),
                1,
            ));
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if line == "[job]" {
            out.push_str(&format!("checkpoint_interval_ms = {interval_ms}\n"));
        }
    }
    assert!(
        throttled,
        "{example}: no file-source config line to throttle"
    );
    let tmp = tempfile::tempdir().unwrap();
    let path = super::kit::job_in(tmp.path(), example, "examples/flights", &out);
    JobCopy(path, tmp)
}

/// Checks a per-record output: 336,776 lines with unique natural keys.
pub fn check_per_record(lines: &[String]) {
    assert_eq!(lines.len(), 336_776, "every departure exactly once");
    let mut keys = BTreeSet::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let key: Vec<String> = [
            "year",
            "month",
            "day",
            "carrier",
            "flight",
            "origin",
            "sched_dep_time",
        ]
        .iter()
        .map(|f| v[f].to_string())
        .collect();
        assert!(keys.insert(key), "duplicate natural key in {l}");
    }
}

/// The committed output of an uninterrupted embedded run of `job`.
pub fn embedded(job: &Path, tmp: &Path) -> Vec<String> {
    let out = tmp.join("embedded-out");
    let o = Command::new(BIN)
        .args(["run", "--no-progress", "--no-echo", "--fresh", "--output"])
        .arg(&out)
        .arg("--work-dir")
        .arg(tmp.join("embedded-work"))
        .arg(job)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    committed(&out)
}
