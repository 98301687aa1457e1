//! The cluster, end to end (design §2.5): a coordinator and three node processes of the
//! `nopstream` binary over real QUIC on loopback, with the certificates `nopstream cluster
//! init` writes, plugins uploaded to the registry, jobs submitted with `nopstream job
//! submit`. Lease TTL 2 s, heartbeats every 300 ms.
//!
//! - The four flights examples produce exactly the embedded run's output.
//! - Nodes SIGKILLed at random moments (at least 10 kills over the suite): the jobs recover
//!   on the surviving nodes; the per-record job commits every departure once, the
//!   aggregate job equals the uninterrupted run.
//! - A node SIGSTOPped past its lease, then SIGCONTed: the job recovers without it, its late
//!   work is refused and counted, the output is exact.
//! - The coordinator SIGKILLed mid-run and restarted: the job finishes with exact output.
//!
//! The tests of this binary run one at a time (leases on two cores must not expire by
//! starvation), and it prints its duration.

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nopstream");
const TTL_MS: &str = "2000";
const HEARTBEAT_MS: &str = "300";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Prints how long a test took when it ends (also on failure).
struct Timed(&'static str, Instant);

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
struct Rng(u64);

impl Rng {
    fn new(test: &str) -> Rng {
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

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// A coordinator and its nodes; every process is killed on drop.
struct Cluster {
    dir: tempfile::TempDir,
    addr: String,
    coordinator: Option<Child>,
    nodes: Vec<Option<Child>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
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
    /// Starts a coordinator and `n` nodes, waits until every node holds a live lease, and
    /// uploads the bundled plugins.
    fn start(n: u32) -> Cluster {
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
        let mut c = Cluster {
            addr: format!("127.0.0.1:{}", free_udp_port()),
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

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    fn start_coordinator(&mut self) {
        let mut child = Command::new(BIN)
            .args([
                "coordinator",
                "--listen",
                &self.addr,
                "--lease-ttl-ms",
                TTL_MS,
                "--heartbeat-ms",
                HEARTBEAT_MS,
            ])
            .arg("--data")
            .arg(self.dir.path().join("coord"))
            .arg("--certs")
            .arg(self.certs())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log_file(&self.dir.path().join("coordinator.log")))
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("coordinator listening on"), "{line}");
        self.coordinator = Some(child);
    }

    fn start_node(&mut self, id: u32) {
        let child = Command::new(BIN)
            .args(["node", "--join", &self.addr, "--id", &id.to_string()])
            .arg("--data")
            .arg(self.dir.path().join(format!("node-{id}")))
            .arg("--certs")
            .arg(self.certs())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.path().join(format!("node-{id}.log"))))
            .spawn()
            .unwrap();
        self.nodes[id as usize - 1] = Some(child);
    }

    fn node_pid(&self, id: u32) -> u32 {
        self.nodes[id as usize - 1].as_ref().unwrap().id()
    }

    fn kill_node(&mut self, id: u32) {
        let mut c = self.nodes[id as usize - 1].take().unwrap();
        c.kill().unwrap(); // SIGKILL
        c.wait().unwrap();
    }

    fn kill_coordinator(&mut self) {
        let mut c = self.coordinator.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Runs the CLI against this cluster: `args`, then `files`, then the cluster flags.
    /// Returns success, stdout and stderr.
    fn cli_out(&self, args: &[&str], files: &[PathBuf]) -> (bool, String, String) {
        let out = Command::new(BIN)
            .args(args)
            .args(files)
            .args(["--cluster", &self.addr])
            .arg("--certs")
            .arg(self.certs())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// As [`Self::cli_out`], stdout and stderr together.
    fn cli(&self, args: &[&str], files: &[PathBuf]) -> (bool, String) {
        let (ok, out, err) = self.cli_out(args, files);
        (ok, format!("{out}{err}"))
    }

    fn json_of(&self, args: &[&str], files: &[PathBuf]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let (ok, out, err) = self.cli_out(&a, files);
        assert!(ok, "{args:?}: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"))
    }

    fn json(&self, args: &[&str]) -> Value {
        self.json_of(args, &[])
    }

    fn wait_live(&self, n: u32) {
        wait_for(
            "every node to hold a live lease",
            Duration::from_secs(60),
            || {
                let s = self.json(&["cluster", "status"]);
                let s = s.as_array().unwrap();
                s.iter().filter(|x| x["live"] == true).count() == n as usize
            },
        );
    }

    fn status(&self, job: &str) -> Value {
        self.json(&["job", "status", job])
    }

    /// Submits `job` (a job file) with its output in `out`; returns the job id.
    fn submit(&self, job: &Path, out: &Path, extra: &[&str]) -> String {
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
    fn wait_finished(&self, job: &str, limit: Duration) -> Value {
        let mut last = Value::Null;
        wait_for(&format!("job {job} to end"), limit, || {
            last = self.status(job);
            last["state"] != "Running" && last["state"] != "Submitted"
        });
        assert_eq!(
            last["state"],
            "Finished",
            "{last:#}\n--- coordinator log tail:\n{}",
            self.log_tail("coordinator.log")
        );
        last
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Nodes (ids) holding tasks of `job`'s live generation.
    fn nodes_of(&self, job: &str) -> Vec<u32> {
        let s = self.status(job);
        let Some(d) = s["deployment_json"].as_str() else {
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
}

fn log_file(p: &Path) -> std::fs::File {
    std::fs::File::create(p).unwrap()
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
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
struct JobCopy(PathBuf);

impl Drop for JobCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A copy of `example` with epochs every `interval_ms` and each source subtask throttled
/// to `rate` records per second, so that a run lasts long enough to be interrupted.
fn job_copy(example: &str, interval_ms: u64, rate: u64) -> JobCopy {
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
    let path = repo().join("examples/flights").join(format!(
        ".cluster-{}-{}-{example}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&path, out).unwrap();
    JobCopy(path)
}

/// Committed output lines (sorted); staging files are not output.
fn committed(out: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            lines.extend(
                std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    lines.sort();
    lines
}

/// Checks a per-record output: 336,776 lines with unique natural keys.
fn check_per_record(lines: &[String]) {
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
fn embedded(job: &Path, tmp: &Path) -> Vec<String> {
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

#[test]
fn the_four_flights_examples_on_three_nodes_equal_the_embedded_run() {
    let _g = serial();
    let _t = Timed("examples", Instant::now());
    let cluster = Cluster::start(3);
    for example in [
        "flights.toml",
        "flights-per-record.toml",
        "hourly-delay.toml",
        "delay-cascade.toml",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let job = repo().join("examples/flights").join(example);
        let expected = embedded(&job, tmp.path());
        assert!(
            !expected.is_empty(),
            "{example}: the embedded run wrote nothing"
        );
        let out = tmp.path().join("cluster-out");
        // Parallelism 3: every node holds a slot group, so HASH edges cross nodes.
        let id = cluster.submit(&job, &out, &["-p", "3"]);
        let status = cluster.wait_finished(&id, Duration::from_secs(300));
        assert_eq!(cluster.nodes_of(&id), [1, 2, 3], "{status:#}");
        assert_eq!(
            committed(&out),
            expected,
            "{example}: the cluster's output differs from the embedded run"
        );
        if example == "flights-per-record.toml" {
            check_per_record(&expected);
        }
    }
}

/// One run of `example` with a node SIGKILLed at a random moment, restarted once the job
/// has recovered without it; returns the committed output.
fn run_with_node_kill(
    cluster: &mut Cluster,
    rng: &mut Rng,
    example: &str,
    interval_ms: u64,
) -> Vec<String> {
    // About 3 s per run at parallelism 3.
    let job = job_copy(example, interval_ms, 40_000);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
    wait_for("a deployment", Duration::from_secs(60), || {
        !cluster.nodes_of(&id).is_empty()
    });
    let generation = cluster.status(&id)["generation"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(200 + rng.below(2000)));
    let nodes = cluster.nodes_of(&id);
    let victim = nodes[rng.below(nodes.len() as u64) as usize];
    let ended = cluster.status(&id)["state"] != "Running";
    cluster.kill_node(victim);
    eprintln!("[cluster suite] {example}: killed node-{victim} (job ended before: {ended})");
    if !ended {
        wait_for("the job to recover or end", Duration::from_secs(60), || {
            let s = cluster.status(&id);
            s["generation"].as_u64().unwrap() > generation || s["state"] != "Running"
        });
    }
    cluster.start_node(victim);
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    if !ended {
        assert!(
            status["recoveries"].as_u64().unwrap() >= 1,
            "a node holding tasks was killed, so the job recovered: {status:#}"
        );
    }
    cluster.wait_live(3);
    committed(&out)
}

#[test]
fn nodes_killed_at_random_moments_leave_exact_output() {
    let _g = serial();
    let _t = Timed("node kills", Instant::now());
    let mut rng = Rng::new("node kills");
    let mut cluster = Cluster::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let aggregate = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    for _ in 0..6 {
        let lines = run_with_node_kill(&mut cluster, &mut rng, "flights-per-record.toml", 200);
        check_per_record(&lines);
    }
    for _ in 0..4 {
        let lines = run_with_node_kill(&mut cluster, &mut rng, "flights.toml", 200);
        assert_eq!(lines, aggregate, "the aggregate after a node kill");
    }
}

#[test]
fn a_node_stopped_past_its_lease_is_fenced_and_its_late_work_refused() {
    let _g = serial();
    let _t = Timed("sigstop", Instant::now());
    let cluster = Cluster::start(3);
    let tmp = tempfile::tempdir().unwrap();
    let expected = embedded(&repo().join("examples/flights/flights.toml"), tmp.path());
    // The aggregate job: its HASH edge crosses nodes, so the stopped node's channels are
    // streams the other nodes must refuse.
    // About 6 s at parallelism 3: running when node-2's lease expires.
    let job = job_copy("flights.toml", 100, 20_000);
    let out = tmp.path().join("out");
    let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
    wait_for(
        "the job running on three nodes",
        Duration::from_secs(60),
        || cluster.nodes_of(&id) == [1, 2, 3] && !cluster.status(&id)["durable_epoch"].is_null(),
    );
    let generation = cluster.status(&id)["generation"].as_u64().unwrap();
    let pid = cluster.node_pid(2);
    signal(pid, "-STOP");
    // Past its lease (2 s): the coordinator recovers without node-2.
    wait_for("recovery without node-2", Duration::from_secs(30), || {
        let s = cluster.status(&id);
        s["generation"].as_u64().unwrap() > generation && !cluster.nodes_of(&id).contains(&2)
    });
    std::thread::sleep(Duration::from_millis(500));
    signal(pid, "-CONT");
    let status = cluster.wait_finished(&id, Duration::from_secs(300));
    assert_eq!(committed(&out), expected, "the output after a stopped node");
    let refused = &status["refused"];
    let total = refused["events"].as_u64().unwrap()
        + refused["streams"].as_u64().unwrap()
        + refused["commands"].as_u64().unwrap();
    assert!(
        total > 0,
        "the stale generation's work was refused and counted: {status:#}"
    );
    // node-2 stopped its own tasks when it found its lease lost, and joined again.
    let log = std::fs::read_to_string(cluster.dir.path().join("node-2.log")).unwrap();
    // Resumed, it finds its own deadline passed (LeaseLost) or first reads the
    // coordinator's end of the session naming the expired lease; either way it stops its
    // tasks itself.
    assert!(
        log.contains("stopping this node's tasks")
            && (log.contains("LeaseLost") || log.contains("expired")),
        "node-2 must stop its tasks itself:\n{}",
        cluster.log_tail("node-2.log")
    );
    cluster.wait_live(3);
}

#[test]
fn a_coordinator_killed_mid_run_and_restarted_finishes_the_job_exactly() {
    let _g = serial();
    let _t = Timed("coordinator restart", Instant::now());
    let mut rng = Rng::new("coordinator restart");
    let mut cluster = Cluster::start(3);
    for _ in 0..2 {
        let job = job_copy("flights-per-record.toml", 200, 40_000);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let id = cluster.submit(&job.0, &out, &["-p", "3", "--fresh"]);
        wait_for("a deployment", Duration::from_secs(60), || {
            !cluster.nodes_of(&id).is_empty()
        });
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        cluster.kill_coordinator();
        std::thread::sleep(Duration::from_millis(500));
        cluster.start_coordinator();
        let status = cluster.wait_finished(&id, Duration::from_secs(300));
        check_per_record(&committed(&out));
        eprintln!(
            "[cluster suite] after a coordinator restart: generation {}, recoveries {}",
            status["generation"], status["recoveries"]
        );
    }
}
