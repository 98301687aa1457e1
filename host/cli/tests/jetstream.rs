//! The JetStream source against a real nats-server (design §7.5, §16.1): the flights CSV published
//! into a stream, parsed and written exactly once, uninterrupted, under SIGKILLs and
//! failpoints, and across a server restart; bad connections and streams; bounded splits.
//!
//! Every test needs a server: `.ci/run` starts one with `scripts/nats-test-server.sh` and
//! runs them with `--ignored` (a plain `cargo test --workspace` stays green without one).
//! By hand:
//!
//! ```sh
//! eval "$(scripts/nats-test-server.sh start)"
//! cargo test --workspace --test jetstream -- --ignored --nocapture --test-threads 1
//! scripts/nats-test-server.sh stop "$NOP_TEST_NATS_DIR"
//! ```
//!
//! Without `NOP_TEST_NATS_URL`, `NOP_TEST_NATS_TOKEN` and `NOP_TEST_NATS_DIR` they fail,
//! naming what is missing.

mod common;

use common::flights::{NATURAL_KEY, check_per_record, natural_keys};
use common::job::{Job, repo};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Flights in the CSV (lines after the header).
const FLIGHTS: u64 = 336_776;

/// The test server: URL (no token), token, directory (for `restart`).
struct Server {
    url: String,
    token: String,
    dir: String,
}

fn server() -> Server {
    let (Ok(url), Ok(token), Ok(dir)) = (
        std::env::var("NOP_TEST_NATS_URL"),
        std::env::var("NOP_TEST_NATS_TOKEN"),
        std::env::var("NOP_TEST_NATS_DIR"),
    ) else {
        panic!(
            "the JetStream tests need a nats-server with JetStream: set NOP_TEST_NATS_URL \
             (nats://host:port), NOP_TEST_NATS_TOKEN and NOP_TEST_NATS_DIR, e.g. with \
             `eval \"$(scripts/nats-test-server.sh start)\"` (see docs/exactly-once.md, \"JetStream source\")"
        );
    };
    Server { url, token, dir }
}

/// `nopstream nats publish` of the flights CSV (from the example's zip) into `stream`.
fn publish(s: &Server, stream: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(["nats", "publish", "--url", &s.url])
        .args(["--password-env", "NOP_TEST_NATS_TOKEN"])
        .args([
            "--stream",
            stream,
            "--subject",
            &format!("{stream}.flights"),
        ])
        .arg(repo().join("examples/flights/data/flights.csv.zip"))
        .args(["--member", "flights.csv"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "publish failed: {text}");
    assert!(
        text.contains(&format!("published {FLIGHTS} messages"))
            && text.contains(&format!("1..={FLIGHTS}")),
        "{text}"
    );
    assert!(!text.contains(&s.token), "the token leaked: {text}");
    text
}

/// The flights stream of this test process, published once.
fn flights_stream() -> &'static str {
    static STREAM: OnceLock<String> = OnceLock::new();
    STREAM.get_or_init(|| {
        let name = format!("FLIGHTS_{}", std::process::id());
        let t = Instant::now();
        eprintln!("{}", publish(&server(), &name).trim());
        eprintln!("publish: {:?}", t.elapsed());
        name
    })
}

/// The natural keys of every flight, straight from the CSV (independent of the engine).
fn csv_keys() -> BTreeSet<Vec<String>> {
    let mut text = String::new();
    let f = std::fs::File::open(repo().join("examples/flights/data/flights.csv.zip")).unwrap();
    zip::ZipArchive::new(f)
        .unwrap()
        .by_name("flights.csv")
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let mut r = csv::Reader::from_reader(text.as_bytes());
    let headers = r.headers().unwrap().clone();
    let idx: Vec<usize> = NATURAL_KEY
        .iter()
        .map(|k| headers.iter().position(|h| h == *k).unwrap())
        .collect();
    let mut keys = BTreeSet::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let key = NATURAL_KEY
            .iter()
            .zip(&idx)
            .map(|(name, &i)| match *name {
                "carrier" | "origin" => format!("\"{}\"", &rec[i]),
                _ => rec[i].to_owned(),
            })
            .collect();
        assert!(keys.insert(key));
    }
    assert_eq!(keys.len() as u64, FLIGHTS);
    keys
}

/// The per-record job reading `stream` through connection `q`: `granted` puts
/// `connections = ["q"]` on the source.
fn job_text(url: &str, stream: &str, interval_ms: u64, granted: bool, extra: &str) -> String {
    let grant = if granted { "connections = [\"q\"]" } else { "" };
    format!(
        r#"
[job]
name = "jetstream-per-record"
parallelism = 2
semantic = "strict-exactly-once"
checkpoint_interval_ms = {interval_ms}

[connections.q]
kind = "nats"
url = "{url}"
password_env = "NOP_TEST_NATS_TOKEN"

[[source]]
name = "flights"
plugin = "jetstream-source@0.1.0"
{grant}
config = {{ connection = "q", streams = ["{stream}"], max_wait_ms = 50{extra} }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier", fields = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"] }}

[[sink]]
name = "departures"
plugin = "jsonl-sink@0.1.0"
inputs = ["parse"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "departures" }}
"#
    )
}

/// A job in `tmp` over `text`, with the token in its environment.
fn job(text: &str, tmp: &Path) -> Job {
    let file = tmp.join("job.toml");
    std::fs::write(&file, text).unwrap();
    let mut j = Job::at(file, tmp);
    j.env.push(("NOP_TEST_NATS_TOKEN".into(), server().token));
    j
}

/// Every file under `dir` holding `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            found.extend(files_containing(&p, needle));
        } else if let Ok(bytes) = std::fs::read(&p)
            && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            found.push(p.display().to_string());
        }
    }
    found
}

/// The JetStream split descriptors in the job's manifests (hex-decoded JSON), by split id.
fn manifest_descriptors(work: &Path) -> Vec<(String, Value)> {
    fn walk(v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                if let (Some(Value::String(id)), Some(Value::String(hex))) =
                    (m.get("split_id"), m.get("descriptor"))
                {
                    let bytes: Vec<u8> = (0..hex.len() / 2)
                        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                        .collect();
                    if let Ok(d) = serde_json::from_slice::<Value>(&bytes) {
                        out.push((id.clone(), d));
                    }
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries {
                let p = e.unwrap().path();
                if p.is_dir() {
                    files(&p, out);
                } else if p.to_string_lossy().contains("manifests") {
                    out.push(p);
                }
            }
        }
    }
    let mut paths = Vec::new();
    files(work, &mut paths);
    let mut out = Vec::new();
    for p in paths {
        if let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(&p).unwrap()) {
            walk(&v, &mut out);
        }
    }
    out
}

/// Asserts `got == expected` (both sorted), reporting duplicates and missing lines first.
fn same_output(got: &[String], expected: &[String], what: &str) {
    if got == expected {
        return;
    }
    let mut dups = 0;
    for w in got.windows(2) {
        if w[0] == w[1] {
            dups += 1;
        }
    }
    let set: BTreeSet<&String> = got.iter().collect();
    let missing: Vec<&String> = expected.iter().filter(|l| !set.contains(l)).collect();
    panic!(
        "{what}: {} lines, {dups} duplicated, {} of {} expected missing (first: {:?})",
        got.len(),
        missing.len(),
        expected.len(),
        missing.first()
    );
}

/// An uninterrupted run: its sorted output (checked against the CSV) and how long it took.
fn reference() -> (Vec<String>, Duration) {
    static REF: OnceLock<(Vec<String>, Duration)> = OnceLock::new();
    REF.get_or_init(|| {
        let s = server();
        let stream = flights_stream();
        let tmp = tempfile::tempdir().unwrap();
        let j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
        let t = Instant::now();
        let (ok, text) = j.run(None);
        let took = t.elapsed();
        assert!(ok, "{text}");
        eprintln!("uninterrupted run: {took:?}");
        let lines = j.committed();
        check_per_record(&lines);
        assert_eq!(natural_keys(&lines), csv_keys(), "the flights of the CSV");
        assert!(
            files_containing(tmp.path(), &s.token).is_empty() && !text.contains(&s.token),
            "the token leaked"
        );
        // Bounded: the split descriptor in the manifests holds the end sequence.
        let ds = manifest_descriptors(&j.work);
        assert!(!ds.is_empty(), "no split descriptor in the manifests");
        for (id, d) in &ds {
            assert_eq!(id, stream);
            assert_eq!(d["stream"], Value::from(stream.to_owned()));
            assert_eq!(d["start_seq"], Value::from(1));
            assert_eq!(d["end_seq"], Value::from(FLIGHTS));
        }
        (lines, took)
    })
    .clone()
}

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn flights_from_jetstream_exactly_once_uninterrupted() {
    let (lines, _) = reference();
    assert_eq!(lines.len() as u64, FLIGHTS);
}

const FAILPOINTS: &[&str] = &[
    "before-barrier-injection=2",
    "after-barrier-injection=3",
    "after-pre-commit=2",
    "after-manifest-publish=2",
    "mid-commit=3",
    "during-restore=1",
];

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn flights_from_jetstream_survive_failpoints_and_random_kills() {
    let s = server();
    let stream = flights_stream();
    let (expected, span) = reference();
    for fp in FAILPOINTS {
        let tmp = tempfile::tempdir().unwrap();
        let j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
        if fp.starts_with("during-restore") {
            let (ok, _) = j.run(Some("after-manifest-publish=2"));
            assert!(!ok);
        }
        let (ok, text) = j.run(Some(fp));
        assert!(
            !ok && text.contains("failpoint"),
            "{fp} did not fire: {text}"
        );
        j.finish();
        same_output(
            &j.committed(),
            &expected,
            &format!("output after a crash at {fp}"),
        );
    }
    // SIGKILL at pseudo-random moments over one run's duration, restarting each time,
    // until 20 kills landed while the job ran.
    let mut span = (span.as_millis() as u64).max(100);
    let mut x = 0x6a65_7473_u64;
    let mut landed = 0;
    let mut rounds = 0;
    while landed < 20 {
        rounds += 1;
        assert!(
            rounds <= 40,
            "kills keep missing the run ({landed}/20 landed)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 20 + (x >> 33) % span;
            if j.kill_after(Duration::from_millis(at)) {
                if first {
                    span = (span * 2 / 3).max(60);
                }
                break;
            }
            first = false;
            landed += 1;
            if landed == 20 {
                break;
            }
        }
        j.finish();
        same_output(
            &j.committed(),
            &expected,
            &format!("output after random kills (round {rounds})"),
        );
    }
    eprintln!("20 kills landed in {rounds} rounds");
}

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn a_nats_server_restart_mid_run_resumes_exactly() {
    let s = server();
    let stream = flights_stream();
    let (expected, span) = reference();
    let tmp = tempfile::tempdir().unwrap();
    let j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
    let mut child = j.command(None).spawn().unwrap();
    std::thread::sleep(span / 3);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the job ended before the restart"
    );
    let restart = Command::new(repo().join("scripts/nats-test-server.sh"))
        .args(["restart", &s.dir])
        .output()
        .unwrap();
    assert!(
        restart.status.success(),
        "{}",
        String::from_utf8_lossy(&restart.stderr)
    );
    eprintln!("nats-server restarted at {:?}", span / 3);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tail: Vec<&str> = text.lines().rev().take(30).collect();
    eprintln!(
        "the run across the restart ended with:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    if !out.status.success() {
        // The restart may outlast the source's patience; a restart of the job resumes.
        eprintln!("the run failed across the server restart; resuming: {text}");
        j.finish();
    }
    same_output(&j.committed(), &expected, "output across a server restart");
}

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn bad_connections_and_streams_fail_clearly_without_credentials() {
    let s = server();
    let stream = flights_stream();
    let check = |name: &str, text: &str, wants: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let j = job(text, tmp.path());
        let (ok, out) = j.run(None);
        assert!(!ok, "{name}: the job must fail: {out}");
        for w in wants {
            assert!(out.contains(w), "{name}: wanted {w:?} in: {out}");
        }
        assert!(!out.contains(&s.token), "{name}: the token leaked: {out}");
        assert!(
            files_containing(tmp.path(), &s.token).is_empty(),
            "{name}: the token is in a file"
        );
        eprintln!("{name}: {}", out.lines().last().unwrap_or_default());
    };
    // A connection the job declares but does not grant to the source.
    check(
        "not granted",
        &job_text(&s.url, stream, 100, false, ""),
        &["connection `q` is not granted to source `flights`"],
    );
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    check(
        "unreachable",
        &job_text(&format!("nats://127.0.0.1:{port}"), stream, 100, true, ""),
        &["connection `q`", "cannot connect"],
    );
    // A stream that does not exist.
    check(
        "no stream",
        &job_text(&s.url, "NO_SUCH_STREAM", 100, true, ""),
        &["connection `q`", "stream `NO_SUCH_STREAM`", "not found"],
    );
    // A wrong token: refused, and neither token is printed.
    let tmp = tempfile::tempdir().unwrap();
    let mut j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
    j.env = vec![("NOP_TEST_NATS_TOKEN".into(), "wrong-token-xyzzy".into())];
    let (ok, out) = j.run(None);
    assert!(!ok, "a wrong token must fail: {out}");
    assert!(
        out.contains("connection `q`") && out.contains("authorization"),
        "{out}"
    );
    assert!(
        !out.contains("wrong-token-xyzzy") && !out.contains(&s.token),
        "{out}"
    );
    // A password_env that is not set.
    let tmp = tempfile::tempdir().unwrap();
    let mut j = job(&job_text(&s.url, stream, 100, true, ""), tmp.path());
    j.env.clear();
    let mut c = j.command(None);
    c.env_remove("NOP_TEST_NATS_TOKEN");
    let o = c.output().unwrap();
    let out = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        out.contains("environment variable `NOP_TEST_NATS_TOKEN`"),
        "{out}"
    );
}

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn bounded_reads_stop_at_the_end_sequence_seen_at_discovery() {
    // A stream that keeps growing while the job reads: a bounded job reads exactly what
    // was there at discovery and ends; its restart reads nothing new.
    let s = server();
    let stream = format!("GROWING_{}", std::process::id());
    publish(&s, &stream);
    let tmp = tempfile::tempdir().unwrap();
    let j = job(&job_text(&s.url, &stream, 100, true, ""), tmp.path());
    let mut child = j.command(None).spawn().unwrap();
    // Splits are discovered before the first checkpoint: publish more once it exists.
    let t = Instant::now();
    while manifest_descriptors(&j.work).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the job ended early");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no checkpoint in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    publish_more(&s, &stream, 1000);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = j.committed();
    check_per_record(&lines);
    let ds = manifest_descriptors(&j.work);
    assert!(ds.iter().all(|(_, d)| d["end_seq"] == FLIGHTS));
    let (ok, text) = j.run(None);
    assert!(ok, "{text}");
    assert_eq!(
        j.committed(),
        lines,
        "a finished bounded job reads nothing more"
    );
}

/// Publishes `n` more copies of the first flight into `stream`.
fn publish_more(s: &Server, stream: &str, n: usize) {
    let line =
        "2013,1,1,517,515,2,830,819,11,UA,1545,N14228,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z\n";
    publish_lines(s, stream, &line.repeat(n));
}

/// Publishes the CSV lines `body` (no header) into `stream`, one message each.
fn publish_lines(s: &Server, stream: &str, body: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("more.csv");
    std::fs::write(&file, format!("header\n{body}")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(["nats", "publish", "--url", &s.url])
        .args(["--password-env", "NOP_TEST_NATS_TOKEN"])
        .args([
            "--stream",
            stream,
            "--subject",
            &format!("{stream}.flights"),
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
#[ignore = "needs nats-server: .ci/run starts one (scripts/nats-test-server.sh)"]
fn unbounded_streams_of_one_subtask_are_all_read() {
    // Two unbounded streams in one subtask (p=1): the big flights stream and a small one of
    // 1,000 flights of carrier ZZ. Reads go round-robin over the splits, so the small
    // stream is read too; a task that always read its first unfinished split would wait on
    // the caught-up first stream forever and never commit a ZZ flight.
    let s = server();
    let small = format!("SMALL_{}", std::process::id());
    let body: String = (0..1000)
        .map(|i| {
            format!(
                "2013,1,1,517,515,2,830,819,11,ZZ,{i},N1,EWR,IAH,227,1400,5,15,2013-01-01T10:00:00Z\n"
            )
        })
        .collect();
    publish_lines(&s, &small, &body);
    let tmp = tempfile::tempdir().unwrap();
    let text = job_text(&s.url, flights_stream(), 100, true, ", bounded = false")
        .replace(
            &format!("streams = [\"{}\"]", flights_stream()),
            &format!("streams = [\"{}\", \"{small}\"]", flights_stream()),
        )
        .replace("parallelism = 2", "parallelism = 1");
    let j = job(&text, tmp.path());
    let mut child = j.command(None).spawn().unwrap();
    const LIMIT: Duration = Duration::from_secs(180);
    let want = FLIGHTS as usize + 1000;
    let t = Instant::now();
    let lines = loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "an unbounded job ended on its own"
        );
        let lines = if j.out.exists() {
            j.committed()
        } else {
            Vec::new()
        };
        if lines.len() >= want {
            break lines;
        }
        if t.elapsed() > LIMIT {
            let zz = lines.iter().filter(|l| l.contains("\"ZZ\"")).count();
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "after {LIMIT:?} only {} of {want} records committed ({zz} of 1000 from {small})",
                lines.len()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(lines.len(), want, "no record twice");
    let keys = natural_keys(&lines);
    let mut expected = csv_keys();
    for i in 0..1000 {
        expected.insert(
            ["2013", "1", "1", "\"ZZ\"", &i.to_string(), "\"EWR\"", "515"]
                .map(str::to_owned)
                .to_vec(),
        );
    }
    assert_eq!(keys, expected, "every flight of both streams once");
}

#[test]
#[ignore = "needs nats-server: .ci/run installs it (scripts/nats-test-server.sh)"]
fn a_tls_connection_verifies_the_server_against_its_ca_file() {
    // A nats-server of this test, TLS only, token auth, its own JetStream store.
    let tmp = tempfile::tempdir().unwrap();
    let certs = common::tls::server_certs(tmp.path(), "nats");
    let other = common::tls::server_certs(tmp.path(), "other");
    let token = format!("tls-{}", std::process::id());
    let port = common::tls::free_port();
    let conf = tmp.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{}\" }}\n\
             tls {{ cert_file: \"{}\", key_file: \"{}\" }}\n\
             authorization {{ token: \"{token}\" }}\n",
            tmp.path().join("js").display(),
            certs.cert.display(),
            certs.key.display()
        ),
    )
    .unwrap();
    let _server = common::tls::Child(
        Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server not found"),
    );
    common::tls::wait_for_port(port);
    let url = format!("tls://127.0.0.1:{port}");
    let publish = |ca: &Path| {
        Command::new(env!("CARGO_BIN_EXE_nopstream"))
            .args(["nats", "publish", "--url", &url, "--ca-file"])
            .arg(ca)
            .args(["--password-env", "NOP_TEST_NATS_TLS_TOKEN"])
            .args(["--stream", "TLSFLIGHTS", "--subject", "tls.flights"])
            .arg(repo().join("examples/flights/data/flights.csv.zip"))
            .args(["--member", "flights.csv"])
            .env("NOP_TEST_NATS_TLS_TOKEN", &token)
            .output()
            .unwrap()
    };
    let o = publish(&certs.ca);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains(&format!("published {FLIGHTS} messages")),
        "{text}"
    );
    let run = |tag: &str, ca: &Path| {
        let dir = tmp.path().join(tag);
        std::fs::create_dir_all(&dir).unwrap();
        let text = job_text(&url, "TLSFLIGHTS", 200, true, "").replace(
            "password_env = \"NOP_TEST_NATS_TOKEN\"",
            &format!(
                "password_env = \"NOP_TEST_NATS_TOKEN\"\nca_file = \"{}\"",
                ca.display()
            ),
        );
        let file = dir.join("job.toml");
        std::fs::write(&file, text).unwrap();
        let mut j = Job::at(file, &dir);
        j.env.push(("NOP_TEST_NATS_TOKEN".into(), token.clone()));
        let (ok, out) = j.run(None);
        (j, ok, out)
    };
    // Trusting the server's CA: every departure exactly once.
    let (j, ok, out) = run("good", &certs.ca);
    assert!(ok, "{out}");
    let lines = j.committed();
    check_per_record(&lines);
    assert_eq!(natural_keys(&lines), csv_keys(), "the flights of the CSV");
    // Trusting another CA: refused, naming the connection, never the token.
    let (_, ok, out) = run("wrong-ca", &other.ca);
    assert!(!ok, "{out}");
    assert!(out.contains("connection `q`"), "{out}");
    assert!(!out.contains(&token), "the token leaked: {out}");
    let o = publish(&other.ca);
    assert!(!o.status.success(), "publish trusting another CA must fail");
}
