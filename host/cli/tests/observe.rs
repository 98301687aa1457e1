//! Observability end to end (design §15), on loopback against a real running job
//! (`nopstream run --http`): `/metrics` read by a Prometheus text parser and checked
//! against the job's own counts and its durable epoch log; the JSON API's checkpoint
//! history read from that log, so it survives a SIGKILL and a restart; one vertex per
//! plan vertex; `nopstream status`; and the API's shapes against a committed snapshot,
//! which fails on a change that does not bump the API version.

mod common;

use common::kit::{BIN, repo, text};

use nop_stream_checkpoint::{EpochState, Location, Namespace};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const JOB: &str = "flights-per-carrier";
const SOURCE_VERTEX: &str = "sources/flights";
/// Generous: the machine may be loaded; nothing here asserts on time.
const PATIENCE: Duration = Duration::from_secs(180);

/// The flights job (a source chained to a parser, a HASH edge, a keyed aggregate chained
/// to a sink), rate-limited so that it runs while the test looks at it, next to its
/// data.
/// A job file in a temporary directory (removed on drop).
struct JobFile(PathBuf, #[allow(dead_code)] tempfile::TempDir);

fn job_file() -> JobFile {
    let dir = repo().join("examples/flights");
    let text = std::fs::read_to_string(dir.join("flights.toml")).unwrap();
    let text = text
        .replace(
            "config = { path = \"/input/",
            "config = { max_records_per_second = 2000, path = \"/input/",
        )
        .replace("[job]\n", "[job]\ncheckpoint_interval_ms = 200\n");
    let tmp = tempfile::tempdir().unwrap();
    let path = common::kit::job_in(tmp.path(), "flights.toml", "examples/flights", &text);
    JobFile(path, tmp)
}

/// A running `nopstream run --http 127.0.0.1:0`, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the job and returns it with the address its HTTP server listens on.
fn start(job: &Path, out: &Path, work: &Path) -> (Running, String) {
    let addr_file = work.join("http.addr");
    let _ = std::fs::remove_file(&addr_file);
    let child = Command::new(BIN)
        .args(["run", "--no-progress", "--no-echo", "-p", "2"])
        .args(["--http", "127.0.0.1:0", "--output"])
        .arg(out)
        .arg("--work-dir")
        .arg(work)
        .arg(job)
        .env_remove("NOPSTREAM_FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = Running(child);
    let addr = wait_for("the HTTP address file", || {
        std::fs::read_to_string(&addr_file)
            .ok()
            .filter(|a| a.parse::<std::net::SocketAddr>().is_ok())
    });
    (running, addr)
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(started.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `GET path` over plain HTTP/1.1.
fn get(addr: &str, path: &str) -> common::kit::HttpResponse {
    common::kit::http_get(addr, path)
}

fn json(addr: &str, path: &str) -> Value {
    let r = get(addr, path);
    assert_eq!(r.status, 200, "GET {path}: {}", r.body);
    assert!(
        r.header("content-type").starts_with("application/json"),
        "{}",
        r.header("content-type")
    );
    serde_json::from_str(&r.body).unwrap()
}

/// `/metrics`, parsed by a Prometheus text parser.
struct Scrape(Vec<prometheus_parse::Sample>);

fn scrape(addr: &str) -> Scrape {
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .starts_with("application/openmetrics-text"),
        "{}",
        r.header("content-type")
    );
    assert_eq!(
        r.body.lines().last(),
        Some("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    let parsed = prometheus_parse::Scrape::parse(r.body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert!(!parsed.samples.is_empty());
    for s in &parsed.samples {
        assert!(s.metric.starts_with("nopstream_"), "{}", s.metric);
        for l in ["epoch", "attempt", "key", "record"] {
            assert!(s.labels.get(l).is_none(), "{} has label {l}", s.metric);
        }
    }
    Scrape(parsed.samples)
}

impl Scrape {
    /// The sum of `metric`'s samples whose labels include `filter`.
    fn sum(&self, metric: &str, filter: &[(&str, &str)]) -> f64 {
        use prometheus_parse::Value as V;
        let found: Vec<f64> = self
            .0
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| filter.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                V::Counter(x) | V::Gauge(x) | V::Untyped(x) => *x,
                V::Histogram(h) => h.last().map_or(0.0, |b| b.count),
                V::Summary(_) => panic!("{metric}: a summary"),
            })
            .collect();
        assert!(!found.is_empty(), "no {metric} {filter:?}");
        found.iter().sum()
    }
}

/// The job's epoch log, read from its checkpoint namespace: epochs by the states
/// recorded for them.
fn epoch_log(work: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    epoch_log_in(&work.join("checkpoints"))
}

/// The epoch log of the job's namespace under checkpoint root `root`.
fn epoch_log_in(root: &Path) -> BTreeMap<u64, BTreeSet<String>> {
    let ns = Namespace::open(&Location::Local(root.join(format!("{JOB}.main")))).unwrap();
    let mut out: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for r in ns.read_log().unwrap() {
        let s = match r.state {
            EpochState::Durable => "durable",
            EpochState::Committed => "committed",
            EpochState::Aborted => "aborted",
            _ => "created",
        };
        out.entry(r.epoch.0).or_default().insert(s.to_owned());
    }
    out
}

fn durable(log: &BTreeMap<u64, BTreeSet<String>>) -> BTreeSet<u64> {
    log.iter()
        .filter(|(_, s)| s.contains("durable"))
        .map(|(e, _)| *e)
        .collect()
}

/// The durable epochs of the API's checkpoint history.
fn api_durable(c: &Value) -> BTreeSet<u64> {
    c["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| !e["durable_ms"].is_null())
        .map(|e| e["epoch"].as_u64().unwrap())
        .collect()
}

/// The shape of a JSON value: object keys with their shapes, an array's first element's
/// shape, a scalar's type (`null` for a field without a value: the snapshot says which
/// type it has when it has one).
fn shape(v: &Value) -> Value {
    match v {
        Value::Null => Value::String("null".into()),
        Value::Bool(_) => Value::String("bool".into()),
        Value::Number(_) => Value::String("number".into()),
        Value::String(_) => Value::String("string".into()),
        Value::Array(a) => Value::Array(a.first().map(shape).into_iter().collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

/// Where `have` differs from `want`, as paths (an empty array matches any).
/// A snapshot's `"T|null"` is an optional field of shape `T`, an object with `"?": true`
/// an optional object.
fn differences(path: &str, want: &Value, have: &Value, out: &mut Vec<String>) {
    if let Value::Object(w) = want
        && w.get("?") == Some(&Value::Bool(true))
    {
        if have != &Value::String("null".into()) {
            let mut w = w.clone();
            w.remove("?");
            differences(path, &Value::Object(w), have, out);
        }
        return;
    }
    if let Value::String(w) = want
        && let Some(t) = w.strip_suffix("|null")
    {
        if have != &Value::String("null".into()) {
            differences(path, &Value::String(t.into()), have, out);
        }
        return;
    }
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => {
            for k in w.keys().chain(h.keys()).collect::<BTreeSet<_>>() {
                match (w.get(k), h.get(k)) {
                    (Some(a), Some(b)) => differences(&format!("{path}.{k}"), a, b, out),
                    (Some(_), None) => out.push(format!("{path}.{k}: removed")),
                    (None, Some(_)) => out.push(format!("{path}.{k}: added")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(w), Value::Array(h)) => {
            if let (Some(a), Some(b)) = (w.first(), h.first()) {
                differences(&format!("{path}[]"), a, b, out);
            }
        }
        (w, h) if w == h => {}
        (w, h) => out.push(format!("{path}: {w} became {h}")),
    }
}

#[test]
fn a_running_job_over_http_metrics_api_status_and_a_restart() {
    let j = job_file();
    let tmp = tempfile::tempdir().unwrap();
    let (out, work) = (tmp.path().join("out"), tmp.path().join("work"));
    let (running, addr) = start(&j.0, &out, &work);

    // A few durable epochs first.
    wait_for("three durable epochs", || {
        (durable(&epoch_log(&work)).len() >= 3).then_some(())
    });

    // /metrics against the job's own counts and its epoch log: each figure of a scrape
    // lies between what the job reported just before and just after it.
    let log1 = epoch_log(&work);
    let m1 = scrape(&addr);
    let view = json(&addr, &format!("/api/v1/jobs/{JOB}"));
    let m2 = scrape(&addr);
    let log2 = epoch_log(&work);
    let read = view["status"]["records_read"].as_f64().unwrap();
    let job = [("job", JOB)];
    assert!(read > 0.0);
    let metric = "nopstream_source_records_total";
    assert!(
        m1.sum(metric, &job) <= read && read <= m2.sum(metric, &job),
        "{metric}"
    );
    let source = [("job", JOB), ("vertex", SOURCE_VERTEX)];
    let (in1, in2) = (
        m1.sum("nopstream_records_in_total", &source),
        m2.sum("nopstream_records_in_total", &source),
    );
    assert!(
        in1 <= read && read <= in2,
        "records in {in1}..{in2}, read {read}"
    );
    let latest = |l: &BTreeMap<u64, BTreeSet<String>>| *durable(l).last().unwrap() as f64;
    let d = m1.sum("nopstream_epoch_durable", &job);
    assert!(
        latest(&log1) <= d && d <= latest(&log2),
        "durable epoch {d}"
    );
    let n = m1.sum("nopstream_checkpoint_duration_seconds", &job);
    assert!(
        durable(&log1).len() as f64 <= n && n <= durable(&log2).len() as f64,
        "checkpoint durations observed {n}"
    );
    assert_eq!(
        m2.sum("nopstream_job_state", &[("job", JOB), ("state", "running")]),
        1.0
    );
    assert_eq!(
        m2.sum("nopstream_job_state", &job),
        1.0,
        "one state at a time"
    );

    // One vertex element per plan vertex, with its parallelism.
    let plan = Command::new(BIN)
        .args(["plan", "--layer", "partitioned", "-p", "2"])
        .arg(&j.0)
        .output()
        .unwrap();
    assert!(plan.status.success(), "{}", text(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let want: BTreeSet<(String, u64)> = plan["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_owned(),
                v["parallelism"].as_u64().unwrap(),
            )
        })
        .collect();
    let have: BTreeSet<(String, u64)> = view["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_owned(),
                v["parallelism"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(have, want);
    assert_eq!(
        view["edges"].as_array().unwrap().len(),
        plan["edges"].as_array().unwrap().len()
    );

    // The checkpoint history is the epoch log's.
    let log1 = epoch_log(&work);
    let cps = json(&addr, &format!("/api/v1/jobs/{JOB}/checkpoints"));
    let log2 = epoch_log(&work);
    let in_api = api_durable(&cps);
    assert!(durable(&log1).is_subset(&in_api), "{in_api:?}");
    assert!(in_api.is_subset(&durable(&log2)), "{in_api:?}");
    let retained = cps["retained"].as_array().unwrap();
    let e = retained.last().unwrap().as_u64().unwrap();
    let detail = json(&addr, &format!("/api/v1/jobs/{JOB}/checkpoints/{e}"));
    assert_eq!(detail["epoch"]["epoch"].as_u64(), Some(e));
    let manifest = &detail["manifest"];
    assert_eq!(manifest["epoch"].as_u64(), Some(e), "{detail}");
    assert_eq!(
        manifest["tasks"].as_array().unwrap().len(),
        4,
        "one per subtask"
    );
    // Snapshot bytes per vertex fold every durable manifest: at least this one's.
    let mut bytes: BTreeMap<String, f64> = BTreeMap::new();
    for t in manifest["tasks"].as_array().unwrap() {
        *bytes
            .entry(t["task"]["vertex"].as_str().unwrap().to_owned())
            .or_default() += t["snapshot_bytes"].as_f64().unwrap();
    }
    assert!(
        bytes.values().any(|b| *b > 0.0),
        "keyed state was written: {bytes:?}"
    );
    let m = scrape(&addr);
    for (v, b) in &bytes {
        let have = m.sum(
            "nopstream_snapshot_bytes_total",
            &[("job", JOB), ("vertex", v)],
        );
        assert!(
            have >= *b,
            "{v}: {have} snapshot bytes in /metrics, {b} in epoch {e} alone"
        );
    }
    assert!(m.sum("nopstream_checkpoint_alignment_seconds", &[("job", JOB)]) >= 1.0);
    // Every task stamps when it saw the epoch's first barrier: after the epoch's creation
    // and before it became durable (one machine, one clock); the start-delay histogram
    // observes the durable epochs.
    let (created, durable_at) = (
        detail["epoch"]["created_ms"].as_u64().unwrap(),
        detail["epoch"]["durable_ms"].as_u64().unwrap(),
    );
    for t in manifest["tasks"].as_array().unwrap() {
        let seen = t["barrier_unix_ms"].as_u64().unwrap();
        assert!(
            (created..=durable_at).contains(&seen),
            "{}: first barrier at {seen}, epoch {e} created {created}, durable {durable_at}",
            t["task"]
        );
    }
    assert!(m.sum("nopstream_checkpoint_start_delay_seconds", &[("job", JOB)]) >= 1.0);
    let exceptions = json(&addr, &format!("/api/v1/jobs/{JOB}/exceptions"));
    assert_eq!(exceptions, Value::Array(vec![]), "a healthy run");
    for missing in [
        "/api/v1/jobs/no-such-job",
        &format!("/api/v1/jobs/{JOB}/checkpoints/999999"),
    ] {
        let r = get(&addr, missing);
        assert_eq!(r.status, 404, "{missing}: {}", r.body);
        assert!(r.body.contains("\"error\""), "{}", r.body);
    }
    // A malformed epoch and an unknown path get JSON errors too (before: plain text, and
    // an empty 404).
    for (path, status, says) in [
        (
            format!("/api/v1/jobs/{JOB}/checkpoints/latest"),
            400,
            "an epoch is a whole number",
        ),
        ("/api/v1/job".to_owned(), 404, "no such path: /api/v1/job"),
    ] {
        let r = get(&addr, &path);
        assert_eq!(r.status, status, "{path}: {}", r.body);
        let v: Value =
            serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", r.body));
        assert!(
            v["error"].as_str().unwrap().contains(says),
            "{path}: {}",
            r.body
        );
    }

    // The API's shapes, against the committed snapshot of version 1.
    let jobs = json(&addr, "/api/v1/jobs");
    let shapes = serde_json::json!({
        "version": 1,
        "GET /api/v1/jobs": shape(&jobs),
        "GET /api/v1/jobs/{job}": shape(&view),
        "GET /api/v1/jobs/{job}/checkpoints": shape(&cps),
        "GET /api/v1/jobs/{job}/checkpoints/{epoch}": shape(&serde_json::json!({
            "epoch": detail["epoch"],
            "manifest": if detail["manifest"].is_null() { Value::Null } else { Value::String("the epoch manifest (docs/design.md §5.6)".into()) },
        })),
        "GET /api/v1/jobs/{job}/exceptions": Value::Array(vec![]),
        // The flights job carries no event time: no watermarks (the event-time test
        // checks their values).
        "GET /api/v1/jobs/{job}/watermarks": shape(&json(&addr, &format!("/api/v1/jobs/{JOB}/watermarks"))),
    });
    let snapshot = repo().join("host/cli/tests/fixtures/api-v1-shapes.json");
    if std::env::var_os("NOPSTREAM_BLESS").is_some() {
        // For review: optional fields are marked by hand in the snapshot.
        let new = snapshot.with_extension("json.new");
        std::fs::write(&new, serde_json::to_string_pretty(&shapes).unwrap() + "\n").unwrap();
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&snapshot).unwrap()).unwrap();
    let mut diff = Vec::new();
    differences("", &want, &shapes, &mut diff);
    assert!(
        diff.is_empty(),
        "the JSON API changed without a new version (bump API_VERSION and the path, or \
         for a compatible change, update {}; NOPSTREAM_BLESS=1 writes the live shapes beside \
         it):\n{}",
        snapshot.display(),
        diff.join("\n")
    );

    // `nopstream status`, table and JSON.
    let status = |format: &str| {
        let o = Command::new(BIN)
            .arg("status")
            .arg(&j.0)
            .arg("--work-dir")
            .arg(&work)
            .args(["--format", format])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let table = status("table");
    assert!(table.contains(SOURCE_VERTEX), "{table}");
    assert!(table.contains("RUNNING"), "{table}");
    let sv: Value = serde_json::from_str(&status("json")).unwrap();
    assert_eq!(sv["job"]["status"]["job"].as_str(), Some(JOB));
    assert!(
        sv["job"]["vertices"][0]["records_in_per_second"].is_number(),
        "a running job's rates: {sv}"
    );

    // `status --watch --format json`: one StatusView per line, refreshed while it runs.
    let mut watch = Command::new(BIN)
        .args(["status"])
        .arg(&j.0)
        .arg("--work-dir")
        .arg(&work)
        .args(["--format", "json", "--watch", "0.2"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let line = lines.next().expect("a line per refresh").unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["job"]["status"]["job"].as_str(), Some(JOB));
        seen.push(v["job"]["status"]["records_read"].as_u64().unwrap());
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "records read only grow: {seen:?}"
    );

    // SIGKILL and restart: the history before the kill is still there.
    let log_before = epoch_log(&work);
    drop(running);
    let (running, addr) = start(&j.0, &out, &work);
    let cps = json(&addr, &format!("/api/v1/jobs/{JOB}/checkpoints"));
    assert!(
        durable(&log_before).is_subset(&api_durable(&cps)),
        "{:?} not all in {:?}",
        durable(&log_before),
        api_durable(&cps)
    );
    let committed_before = log_before
        .values()
        .filter(|s| s.contains("committed"))
        .count() as f64;
    let m = scrape(&addr);
    assert!(m.sum("nopstream_epochs_committed_total", &job) >= committed_before);
    assert!(m.sum("nopstream_epoch_durable", &job) >= latest(&log_before));
    drop(running);
}

#[test]
fn a_cluster_coordinator_serves_its_nodes_samples_and_the_epoch_log() {
    let _g = common::cluster::serial();
    let c = common::cluster::Cluster::start(3);
    let j = job_file();
    let out = tempfile::tempdir().unwrap();
    let id = c.submit(&j.0, out.path(), &["-p", "2"]);
    assert_eq!(id, JOB);
    let addr = c.http_addr();
    let root = PathBuf::from(c.storage()).join("checkpoints");
    wait_for("three durable epochs", || {
        (durable(&epoch_log_in(&root)).len() >= 3).then_some(())
    });
    // The nodes' samples reach the coordinator in their metrics frames: every subtask of
    // the source, wherever it runs, has read records.
    let source = [("job", JOB), ("vertex", SOURCE_VERTEX)];
    wait_for("every source subtask's records in /metrics", || {
        let m = scrape(&addr);
        (0..2)
            .all(|i| {
                let i = i.to_string();
                m.0.iter().any(|s| {
                    s.metric == "nopstream_records_in_total"
                        && source.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
                        && s.labels.get("subtask") == Some(i.as_str())
                        && matches!(s.value, prometheus_parse::Value::Untyped(x) if x > 0.0)
                })
            })
            .then_some(())
    });
    let log1 = epoch_log_in(&root);
    let m = scrape(&addr);
    let cps = json(&addr, &format!("/api/v1/jobs/{JOB}/checkpoints"));
    let log2 = epoch_log_in(&root);
    let job = [("job", JOB)];
    let d = m.sum("nopstream_epoch_durable", &job);
    let latest = |l: &BTreeMap<u64, BTreeSet<String>>| *durable(l).last().unwrap() as f64;
    assert!(
        latest(&log1) <= d && d <= latest(&log2),
        "durable epoch {d}"
    );
    let in_api = api_durable(&cps);
    assert!(durable(&log1).is_subset(&in_api) && in_api.is_subset(&durable(&log2)));
    let view = json(&addr, &format!("/api/v1/jobs/{JOB}"));
    assert_eq!(view["vertices"].as_array().unwrap().len(), 2, "{view}");
    assert_eq!(view["edges"][0]["partition"], "HASH", "{view}");
    // The nodes and their leases: the API lists the three, /metrics counts their leases.
    let nodes = json(&addr, "/api/v1/nodes");
    let names: BTreeSet<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["live"] == true)
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["node-1", "node-2", "node-3"]),
        "{nodes}"
    );
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["renewals_total"].as_u64() > Some(0)),
        "every node renewed its lease: {nodes}"
    );
    let snapshot = repo().join("host/cli/tests/fixtures/api-v1-nodes-shape.json");
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&snapshot).unwrap()).unwrap();
    let have = serde_json::json!({ "version": 1, "GET /api/v1/nodes": shape(&nodes) });
    let mut diff = Vec::new();
    differences("", &want, &have, &mut diff);
    assert!(
        diff.is_empty(),
        "/api/v1/nodes changed without a new version ({}):\n{}",
        snapshot.display(),
        diff.join("\n")
    );
    let m = scrape(&addr);
    assert_eq!(m.sum("nopstream_node_leases", &[]), 3.0);
    assert!(m.sum("nopstream_node_lease_renewals_total", &[]) > 0.0);
    assert_eq!(m.sum("nopstream_coordinator_leading", &[]), 1.0);

    // The coordinator SIGKILLed and started again on the same storage: its API still
    // shows the checkpoint history from before (read from the epoch log, not from memory)
    // and its recovery count, in the status and in /metrics alike.
    let mut c = c;
    let before = api_durable(&json(&addr, &format!("/api/v1/jobs/{JOB}/checkpoints")));
    let recoveries_before = json(&addr, &format!("/api/v1/jobs/{JOB}"))["status"]["recoveries"]
        .as_u64()
        .unwrap();
    const SAYS: &str = "http: /metrics and /api/v1/ on http://";
    let served = |c: &common::cluster::Cluster| c.log("coordinator.log").matches(SAYS).count();
    let served_before = served(&c);
    c.restart_coordinator(false);
    wait_for("the restarted coordinator's HTTP server", || {
        (served(&c) > served_before).then_some(())
    });
    let addr = c.http_addr();
    let last_before = *before.last().unwrap();
    let path = format!("/api/v1/jobs/{JOB}/checkpoints");
    let after = wait_for("an epoch durable after the restart", || {
        let r = get(&addr, &path);
        let after = api_durable(
            &serde_json::from_str(&r.body)
                .ok()
                .filter(|_| r.status == 200)?,
        );
        (after.last() > Some(&last_before)).then_some(after)
    });
    let kept: BTreeSet<u64> = before
        .range(last_before.saturating_sub(200)..)
        .copied()
        .collect();
    assert!(
        kept.is_subset(&after),
        "the history from before the restart {kept:?} is in the API after it: {after:?}"
    );
    let status = json(&addr, &format!("/api/v1/jobs/{JOB}"))["status"].clone();
    let recoveries = status["recoveries"].as_u64().unwrap();
    assert!(
        recoveries > recoveries_before,
        "the restart's redeployment counts as a recovery: {recoveries_before} -> {status}"
    );
    let m = scrape(&addr);
    assert_eq!(
        m.sum("nopstream_job_recoveries_total", &job),
        recoveries as f64
    );
}

/// Debian's Chromium, if installed; with `CI=true` its absence fails the test.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no chromium on PATH: the browser test must run in CI"
        );
        eprintln!("no chromium on PATH: the browser test is skipped (CI=true fails instead)");
    }
    found
}

#[test]
fn the_job_page_renders_in_headless_chromium() {
    let Some(browser) = chromium() else {
        return;
    };
    let j = job_file();
    let tmp = tempfile::tempdir().unwrap();
    let (out, work) = (tmp.path().join("out"), tmp.path().join("work"));
    let (_running, addr) = start(&j.0, &out, &work);
    wait_for("three durable epochs", || {
        (durable(&epoch_log(&work)).len() >= 3).then_some(())
    });
    // A view now and the page over a second later: the throughput chart has a point.
    json(&addr, &format!("/api/v1/jobs/{JOB}"));
    std::thread::sleep(Duration::from_millis(1200));
    let profile = tmp.path().join("chromium-profile");
    let o = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("http://{addr}/jobs/{JOB}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let dom = String::from_utf8_lossy(&o.stdout);
    // One vertex element per plan vertex, the HASH edge's label, the semantic mode, and
    // the epoch rows of the epoch log.
    let vertices: BTreeSet<&str> = dom
        .split("<g class=\"vertex\" data-id=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert_eq!(
        vertices,
        BTreeSet::from(["operators/per-carrier", SOURCE_VERTEX]),
        "{dom}"
    );
    assert!(dom.contains(">HASH</text>"), "{dom}");
    assert!(
        dom.contains("<b id=\"semantic\">strict-exactly-once</b>"),
        "{dom}"
    );
    // Every vertex box says how busy and backpressured it is; the charts are drawn: a
    // throughput line, and a bar per durable epoch in the history.
    assert_eq!(dom.matches("data-busy=\"").count(), 2, "{dom}");
    assert!(dom.contains("id=\"throughput-chart\""), "{dom}");
    let throughput = dom.split("id=\"throughput-chart\"").nth(1).unwrap();
    let throughput = throughput.split("</svg>").next().unwrap();
    assert!(throughput.contains("class=\"line\""), "{throughput}");
    let bars = dom.split("id=\"checkpoint-chart\"").nth(1).unwrap();
    let bars = bars.split("</svg>").next().unwrap();
    assert!(bars.matches("class=\"point\"").count() >= 3, "{bars}");
    let rows: BTreeSet<u64> = dom
        .split("data-epoch=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next()?.parse().ok())
        .collect();
    let logged = durable(&epoch_log(&work));
    assert!(rows.len() >= 3, "{dom}");
    assert!(
        rows.iter().take(3).all(|e| logged.contains(e)),
        "epoch rows {rows:?}, log {logged:?}"
    );
}

/// The hourly-delay job (event-time windows over the time-sorted flights), rate-limited so
/// that it runs while the test looks at it.
fn event_time_job() -> JobFile {
    let dir = repo().join("examples/flights");
    let text = std::fs::read_to_string(dir.join("hourly-delay.toml")).unwrap();
    let text = text
        .replace(
            "config = { path = \"/input/",
            "config = { max_records_per_second = 2000, path = \"/input/",
        )
        .replace("[job]\n", "[job]\ncheckpoint_interval_ms = 200\n");
    assert!(
        text.contains("max_records_per_second"),
        "the example changed"
    );
    let tmp = tempfile::tempdir().unwrap();
    let path = common::kit::job_in(tmp.path(), "hourly-delay.toml", "examples/flights", &text);
    JobFile(path, tmp)
}

#[test]
fn watermarks_per_subtask_and_the_vertex_low_watermark_follow_event_time() {
    const HOURLY: &str = "flights-hourly-delay";
    let j = event_time_job();
    let tmp = tempfile::tempdir().unwrap();
    let (out, work) = (tmp.path().join("out"), tmp.path().join("work"));
    let (_running, addr) = start(&j.0, &out, &work);
    // 2013 in event time, ms since the Unix epoch: every watermark lies within it.
    let year = 1_356_998_400_000_i64..1_388_534_400_000;
    let path = format!("/api/v1/jobs/{HOURLY}/watermarks");
    // The HTTP server answers before the job is submitted (its plugins compile first):
    // until then the job is not found. A CI run under load asked too early.
    wait_for("the job on the HTTP server", || {
        (get(&addr, &path).status == 200).then_some(())
    });
    let marks = wait_for("input watermarks at both window subtasks", || {
        let w = json(&addr, &path);
        let window: Vec<&Value> = w
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["vertex"] == "operators/hourly" && m["input_ms"].is_i64())
            .collect();
        (window.len() == 2).then(|| w.clone())
    });
    let marks = marks.as_array().unwrap();
    for m in marks {
        for side in ["input_ms", "output_ms"] {
            if let Some(ms) = m[side].as_i64() {
                assert!(year.contains(&ms), "{side} of {m}: not in 2013");
            }
        }
    }
    let subtasks: BTreeSet<(String, u64)> = marks
        .iter()
        .map(|m| {
            (
                m["vertex"].as_str().unwrap().to_owned(),
                m["subtask"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        subtasks.len(),
        marks.len(),
        "one entry per subtask: {marks:?}"
    );
    assert!(
        subtasks.iter().all(|(_, i)| *i < 2),
        "parallelism 2: {subtasks:?}"
    );
    // The sources emit watermarks; the window's input watermark never runs ahead of what
    // the sources emitted (read after, so they can only have moved on).
    let view = json(&addr, &format!("/api/v1/jobs/{HOURLY}"));
    let later = json(&addr, &path);
    let emitted = |w: &Value, v: &str| -> Vec<i64> {
        w.as_array()
            .unwrap()
            .iter()
            .filter(|m| m["vertex"] == v)
            .filter_map(|m| m["output_ms"].as_i64())
            .collect()
    };
    let sources = emitted(&later, "sources/flights");
    assert_eq!(sources.len(), 2, "{later}");
    for m in marks.iter().filter(|m| m["vertex"] == "operators/hourly") {
        let input = m["input_ms"].as_i64().unwrap();
        assert!(
            input <= *sources.iter().max().unwrap(),
            "window input {input} ahead of every source's output {sources:?}"
        );
    }
    // The vertex's low watermark is the smallest of its subtasks' at that view.
    let hourly = view["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == "operators/hourly")
        .unwrap();
    let low = hourly["low_watermark_ms"]
        .as_i64()
        .expect("a low watermark");
    assert!(year.contains(&low), "{hourly}");
    // Watermarks only advance: the view's minimum lies between the minima read before
    // and after it.
    let inputs = |w: &Value| -> i64 {
        w.as_array()
            .unwrap()
            .iter()
            .filter(|m| m["vertex"] == "operators/hourly")
            .filter_map(|m| m["input_ms"].as_i64())
            .min()
            .unwrap()
    };
    let before = inputs(&Value::Array(marks.clone()));
    let after = inputs(&later);
    assert!(
        (before..=after).contains(&low),
        "low watermark {low}, the subtasks' minimum went {before} -> {after}"
    );
    let m = scrape(&addr);
    let scraped = m.sum(
        "nopstream_input_watermark_seconds",
        &[("job", HOURLY), ("vertex", "operators/hourly")],
    );
    assert!(scraped > 0.0, "input watermarks in /metrics");
    for r in ["busy_ratio", "backpressured_ratio"] {
        let x = hourly[r].as_f64().expect(r);
        assert!((0.0..=1.0).contains(&x), "{r} {x}");
    }
}
