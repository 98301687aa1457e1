//! The Redis Streams source and sink against a real Redis 7 server (design §7.5, §16.1).
//!
//! Every test here needs a server: `.ci/run` starts one with `scripts/redis-test-server.sh`
//! and runs them with `--ignored` (so a plain `cargo test --workspace` on a machine without
//! Redis stays green). Run by hand:
//!
//! ```sh
//! eval "$(scripts/redis-test-server.sh start)"
//! cargo test --workspace --test redis -- --ignored --nocapture --test-threads 1
//! scripts/redis-test-server.sh stop "$NOP_TEST_REDIS_DIR"
//! ```
//!
//! Without `NOP_TEST_REDIS_URL` and `NOP_TEST_REDIS_PASSWORD` they fail, naming what is
//! missing. Each test uses its own keys (`t<pid>:<tag>:...`) and deletes them at the end.

mod common;

use common::flights::{check_per_carrier, check_per_record, csv_lines, expected_per_carrier};
use common::job::{Job, kill_rounds};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The test server: URL (no password) and password.
struct Server {
    url: String,
    password: String,
}

fn server() -> Server {
    let (Ok(url), Ok(password)) = (
        std::env::var("NOP_TEST_REDIS_URL"),
        std::env::var("NOP_TEST_REDIS_PASSWORD"),
    ) else {
        panic!(
            "the Redis tests need a Redis 7 server: set NOP_TEST_REDIS_URL (redis://host:port/db) \
             and NOP_TEST_REDIS_PASSWORD, e.g. with `eval \"$(scripts/redis-test-server.sh start)\"` \
             (see docs/exactly-once.md, \"Redis Streams\")"
        );
    };
    Server { url, password }
}

/// A client of the test server and the key prefix of one test; deletes its keys on drop.
struct Redis {
    server: Server,
    con: redis::Connection,
    prefix: String,
}

impl Redis {
    fn new(tag: &str) -> Redis {
        use redis::IntoConnectionInfo;
        let server = server();
        let info = server.url.as_str().into_connection_info().unwrap();
        let settings = info
            .redis_settings()
            .clone()
            .set_password(&server.password)
            .set_skip_set_lib_name();
        let client = redis::Client::open(info.set_redis_settings(settings)).unwrap();
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
        let mut r = Redis {
            server,
            con,
            prefix: format!("t{}:{tag}", std::process::id()),
        };
        r.clear();
        r
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    fn clear(&mut self) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut self.con)
            .unwrap();
        if !keys.is_empty() {
            redis::cmd("DEL").arg(&keys).exec(&mut self.con).unwrap();
        }
    }

    /// Appends `lines` to `key` as entries `{line: ...}` with ids `*`.
    fn fill(&mut self, key: &str, lines: &[String]) {
        for chunk in lines.chunks(10_000) {
            let mut p = redis::pipe();
            for l in chunk {
                p.cmd("XADD").arg(key).arg("*").arg("line").arg(l).ignore();
            }
            p.exec(&mut self.con).unwrap();
        }
    }

    /// Every entry of `key`: (id, value of `line`).
    fn entries(&mut self, key: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut after = "-".to_owned();
        loop {
            let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
                .arg(key)
                .arg(&after)
                .arg("+")
                .arg("COUNT")
                .arg(10_000)
                .query(&mut self.con)
                .unwrap();
            let Some(last) = v.last() else { break };
            after = format!("({}", last.0);
            for (id, fields) in v {
                let line = fields
                    .into_iter()
                    .find(|(f, _)| f == "line")
                    .map(|(_, v)| v)
                    .unwrap_or_default();
                out.push((id, line));
            }
        }
        out
    }

    fn hget(&mut self, key: &str, field: &str) -> Option<String> {
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query(&mut self.con)
            .unwrap()
    }

    /// `max-deleted-entry-id` of the stream `key`.
    fn max_deleted(&mut self, key: &str) -> String {
        match self.cmd(&["XINFO", "STREAM", key]) {
            redis::Value::Array(kv) => kv
                .chunks(2)
                .find(|c| c[0] == redis::Value::BulkString(b"max-deleted-entry-id".to_vec()))
                .and_then(|c| match &c[1] {
                    redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
                .unwrap_or_default(),
            other => format!("{other:?}"),
        }
    }

    fn cmd(&mut self, args: &[&str]) -> redis::Value {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.con).unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `[connections.r]` on the test server, password from `NOP_TEST_REDIS_PASSWORD`.
fn connection(url: &str) -> String {
    format!(
        "[connections.r]\nkind = \"redis\"\nurl = \"{url}\"\npassword_env = \"NOP_TEST_REDIS_PASSWORD\"\n"
    )
}

/// Stream of flights CSV lines -> flights-mapper -> per-carrier aggregate -> JSONL sink.
fn per_carrier_job(url: &str, key: &str, extra_source: &str, interval_ms: u64) -> String {
    format!(
        r#"
[job]
name = "redis-per-carrier"
parallelism = 2
state_shards = 128
semantic = "strict-exactly-once"
checkpoint_interval_ms = {interval_ms}
batch_records = 1024

{conn}
[[source]]
name = "flights"
plugin = "redis-source@0.1.0"
parallelism = 1
connections = ["r"]
config = {{ connection = "r", streams = ["{key}"], field = "line"{extra_source} }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
parallelism = 1
config = {{ key = "carrier", fields = ["carrier", "dep_delay"] }}

[[operator]]
name = "per-carrier"
plugin = "keyed-aggregate@0.1.0"
inputs = [{{ from = "parse", partition = "hash" }}]
config = {{ key_field = "carrier", aggregates = [
    {{ name = "flights", fn = "count" }},
    {{ name = "cancelled", fn = "count_null", field = "dep_delay" }},
    {{ name = "delayed_15", fn = "count_gt", field = "dep_delay", value = 15 }},
    {{ name = "avg_dep_delay_min", fn = "avg", field = "dep_delay" }},
] }}

[[sink]]
name = "carriers"
plugin = "jsonl-sink@0.1.0"
inputs = ["per-carrier"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "carriers" }}
"#,
        conn = connection(url)
    )
}

fn redis_job(r: &Redis, tag: &str, text: String) -> Job {
    let mut job = Job::new("redis", tag, &text);
    job.env
        .push(("NOP_TEST_REDIS_PASSWORD".into(), r.server.password.clone()));
    job
}

#[test]
#[ignore = "needs Redis: .ci/run starts one (scripts/redis-test-server.sh)"]
fn stream_to_jsonl_matches_the_independent_computation_and_survives_kills() {
    let mut r = Redis::new("src");
    let (_, lines) = csv_lines();
    assert_eq!(lines.len(), 336_776);
    let key = r.key("flights");
    let t = Instant::now();
    r.fill(&key, &lines);
    eprintln!("filled {} entries in {:?}", lines.len(), t.elapsed());
    let expected = expected_per_carrier();

    let job = redis_job(
        &r,
        "straight",
        per_carrier_job(&r.server.url, &key, "", 100),
    );
    let t = Instant::now();
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    let took = t.elapsed();
    eprintln!("uninterrupted run: {took:?}");
    check_per_carrier(&job.committed(), &expected);
    assert!(
        !out.contains(&r.server.password),
        "the password appears in the output"
    );

    // SIGKILL at pseudo-random moments within a straight run's duration, restarting until
    // the job finishes; the output is the same each round.
    let span = (took.as_millis() as u64).max(500);
    kill_rounds(
        20,
        span,
        0x5eed_0001,
        |round| {
            redis_job(
                &r,
                &format!("kill{round}"),
                per_carrier_job(&r.server.url, &key, "", 100),
            )
        },
        |job, round| {
            let got = job.committed();
            eprintln!("round {round}: {} carriers", got.len());
            check_per_carrier(&got, &expected);
        },
    );
}

#[test]
#[ignore = "needs Redis: .ci/run starts one (scripts/redis-test-server.sh)"]
fn a_stream_trimmed_past_the_cursor_fails_loudly() {
    let mut r = Redis::new("trim");
    let (_, lines) = csv_lines();
    for (case, trim) in [("xtrim", true), ("xdel", false)] {
        let key = r.key(case);
        r.fill(&key, &lines[..50_000]);
        // Unbounded: the job keeps its split open, so a restart must read past the cursor.
        let job = redis_job(
            &r,
            case,
            per_carrier_job(&r.server.url, &key, ", bounded = false", 100),
        );
        let (ok, out) = job.run(Some("after-manifest-publish=2"));
        assert!(!ok && out.contains("failpoint"), "{out}");
        // New entries after the crash, none read yet; then some of them disappear.
        r.fill(&key, &lines[50_000..50_003]);
        let entries = r.entries(&key);
        let second_new = entries[entries.len() - 2].0.clone();
        if trim {
            // Everything up to the second new entry goes (XTRIM from the front).
            r.cmd(&["XTRIM", &key, "MINID", &entries[entries.len() - 1].0]);
        } else {
            r.cmd(&["XDEL", &key, &second_new]);
        }
        let (ended, ok, out) = job.run_for(Duration::from_secs(120));
        assert!(ended && !ok, "the restart must fail, not read on: {out}");
        // At once: a restart cannot bring the entries back (it took ten recoveries, about
        // 25 s a case, while the refusal was an `io` error).
        assert!(
            !out.contains("recovering from the latest durable epoch"),
            "{case}: a trimmed stream is not retried: {out}"
        );
        assert!(
            out.contains(&format!(
                "stream `{key}` was trimmed past the read position"
            )) && out.contains("refusing to skip them"),
            "{case}: {out}"
        );
        eprintln!(
            "{case}: {}",
            out.lines()
                .find(|l| l.contains("trimmed past"))
                .unwrap_or_default()
        );
    }
}

/// The flights CSV (file-source) -> flights-mapper -> redis-sink, one stream per subtask.
fn sink_job(url: &str, stream: &str, semantic: &str, interval_ms: u64) -> String {
    sink_job_p(url, stream, semantic, interval_ms, 2)
}

/// [`sink_job`] at parallelism `parallelism`.
fn sink_job_p(
    url: &str,
    stream: &str,
    semantic: &str,
    interval_ms: u64,
    parallelism: u32,
) -> String {
    format!(
        r#"
[job]
name = "redis-sink-per-record"
parallelism = {parallelism}
semantic = "{semantic}"
checkpoint_interval_ms = {interval_ms}

{conn}
[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier", fields = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"] }}

[[sink]]
name = "departures"
plugin = "redis-sink@0.1.0"
inputs = ["parse"]
connections = ["r"]
config = {{ connection = "r", stream = "{stream}" }}
"#,
        conn = connection(url)
    )
}

/// Per subtask stream: the records in stream order; checks that no entry lies above the
/// marker's committed epoch and that the marker names an owner.
fn sink_contents(r: &mut Redis, stream: &str) -> BTreeMap<u32, Vec<String>> {
    sink_contents_n(r, stream, 2)
}

/// [`sink_contents`] of `subtasks` subtask streams.
fn sink_contents_n(r: &mut Redis, stream: &str, subtasks: u32) -> BTreeMap<u32, Vec<String>> {
    let mut out = BTreeMap::new();
    for subtask in 0..subtasks {
        let key = format!("{stream}:{subtask}");
        let entries = r.entries(&key);
        let marker = format!("{key}:nop-sink");
        let committed: u64 = r
            .hget(&marker, "committed")
            .expect("a committed epoch")
            .parse()
            .unwrap();
        assert!(r.hget(&marker, "owner").is_some(), "marker owner of {key}");
        let mut last = (0u64, 0u64);
        for (id, _) in &entries {
            let (e, n) = id.split_once('-').unwrap();
            let id = (e.parse::<u64>().unwrap(), n.parse::<u64>().unwrap());
            assert!(
                id.0 <= committed,
                "{key}: entry {id:?} of an epoch above the committed {committed} remains"
            );
            assert!(id > last);
            last = id;
        }
        out.insert(subtask, entries.into_iter().map(|e| e.1).collect());
    }
    out
}

#[test]
#[ignore = "needs Redis: .ci/run starts one (scripts/redis-test-server.sh)"]
fn redis_sink_is_effectively_once_under_kills_and_refused_in_a_strict_job() {
    let mut r = Redis::new("sink");
    // A STRICT job with the idempotent sink is refused at plan time.
    let strict = redis_job(
        &r,
        "strict",
        sink_job(&r.server.url, &r.key("strict"), "strict-exactly-once", 100),
    );
    let o = strict.verb("plan").output().unwrap();
    let text = common::job::text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("redis-sink")
            && text.contains("idempotent")
            && text.contains("effectively-once"),
        "{text}"
    );
    let (ok, text) = strict.run(None);
    assert!(!ok && text.contains("idempotent"), "{text}");

    // The reference: an uninterrupted effectively-once run.
    let reference_stream = r.key("ref");
    let job = redis_job(
        &r,
        "ref",
        sink_job(&r.server.url, &reference_stream, "effectively-once", 100),
    );
    let t = Instant::now();
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    let took = t.elapsed();
    eprintln!("uninterrupted run: {took:?}");
    let reference = sink_contents(&mut r, &reference_stream);
    let all: Vec<String> = reference.values().flatten().cloned().collect();
    check_per_record(&all);

    // A crash at each failpoint, then a restart to the end. After a crash between
    // pre-commit and the epoch becoming durable, recovery must delete the written entries
    // of the non-durable epoch (it restores max-deleted-entry-id to 0-1, which a stream that
    // never lost an entry does not have) and the output still equals the reference.
    for fp in [
        "after-pre-commit=2",
        "before-barrier-injection=2",
        "after-manifest-publish=2",
        "mid-commit=3",
    ] {
        let tag = fp.split('=').next().unwrap();
        let stream = r.key(tag);
        let job = redis_job(
            &r,
            tag,
            sink_job(&r.server.url, &stream, "effectively-once", 100),
        );
        let (ok, out) = job.run(Some(fp));
        assert!(!ok && out.contains("failpoint"), "{fp} did not fire: {out}");
        let written: usize = (0..2)
            .map(|i| r.entries(&format!("{stream}:{i}")).len())
            .sum();
        job.finish();
        assert_eq!(
            sink_contents(&mut r, &stream),
            reference,
            "streams after a crash at {fp}"
        );
        let deleted: Vec<String> = (0..2)
            .map(|i| r.max_deleted(&format!("{stream}:{i}")))
            .collect();
        eprintln!(
            "{fp}: {written} entries at the crash; max-deleted-entry-id after recovery {deleted:?}"
        );
        if fp.starts_with("after-pre-commit") {
            assert!(
                deleted.iter().any(|d| d == "0-1"),
                "recovery deleted no entry of the pre-committed, non-durable epoch: {deleted:?}"
            );
        }
    }

    let span = (took.as_millis() as u64).max(500);
    let mut streams = Vec::new();
    kill_rounds(
        20,
        span,
        0x5eed_0002,
        |round| {
            let stream = r.key(&format!("kill{round}"));
            streams.push(stream.clone());
            redis_job(
                &r,
                &format!("kill{round}"),
                sink_job(&r.server.url, &stream, "effectively-once", 100),
            )
        },
        |_, _| {},
    );
    let mut recovered = 0;
    for stream in streams {
        if (0..2).any(|i| r.max_deleted(&format!("{stream}:{i}")) == "0-1") {
            recovered += 1;
        }
        let got = sink_contents(&mut r, &stream);
        assert_eq!(
            got, reference,
            "stream {stream}: the records of each subtask, in order, as in an uninterrupted run"
        );
    }
    eprintln!(
        "random kills: in {recovered} rounds recovery deleted entries of a non-durable epoch"
    );
}

#[test]
#[ignore = "needs Redis: .ci/run starts one (scripts/redis-test-server.sh)"]
fn redis_sink_downscale_from_4_to_2_settles_the_removed_subtasks() {
    let mut r = Redis::new("down");
    let stream = r.key("out");
    let job = redis_job(
        &r,
        "down",
        sink_job_p(&r.server.url, &stream, "effectively-once", 100, 4),
    );
    // Crash after six pre-commits at p = 4: epoch 1 durable, epoch 2 partly written.
    let (ok, out) = job.run(Some("after-pre-commit=6"));
    assert!(!ok && out.contains("failpoint"), "{out}");
    let at_crash: Vec<usize> = (0..4)
        .map(|i| r.entries(&format!("{stream}:{i}")).len())
        .collect();
    eprintln!("entries per subtask stream at the crash: {at_crash:?}");
    let o = job
        .command(None)
        .args(["-p", "2", "--rescale"])
        .output()
        .unwrap();
    let out = common::job::text(&o);
    assert!(o.status.success(), "{out}");
    // Subtasks 2 and 3 no longer exist; their streams keep what they committed, and
    // nothing of a non-durable epoch remains in any of the four.
    let got = sink_contents_n(&mut r, &stream, 4);
    let all: Vec<String> = got.values().flatten().cloned().collect();
    check_per_record(&all);
    eprintln!(
        "records per subtask stream after the rescaled restart: {:?}",
        got.values().map(Vec::len).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs Redis: .ci/run starts one (scripts/redis-test-server.sh)"]
fn bad_connections_fail_clearly_without_the_password() {
    let mut r = Redis::new("bad");
    let key = r.key("flights");
    let (_, lines) = csv_lines();
    r.fill(&key, &lines[..100]);
    let password = r.server.password.clone();
    let check = |job: &Job, want: &[&str]| {
        let (ok, out) = job.run(None);
        assert!(!ok, "{out}");
        for w in want {
            assert!(out.contains(w), "missing {w:?} in: {out}");
        }
        assert!(!out.contains(&password), "the password appears: {out}");
        assert!(!out.contains("wrong-pw-xyz"), "a password appears: {out}");
        // Nor in anything the run left on disk (plan, manifests, logs).
        for entry in walk(&job.dir) {
            let bytes = std::fs::read(&entry).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains(&password),
                "the password is in {}",
                entry.display()
            );
        }
        out
    };

    // The connection is declared but not granted to the source.
    let text = per_carrier_job(&r.server.url, &key, "", 100).replace("connections = [\"r\"]\n", "");
    let job = redis_job(&r, "notgranted", text);
    let out = check(&job, &["connection `r` is not granted to source `flights`"]);
    eprintln!(
        "not granted: {}",
        out.lines()
            .find(|l| l.contains("not granted"))
            .unwrap_or_default()
    );

    // A wrong password.
    let mut job = redis_job(&r, "wrongpw", per_carrier_job(&r.server.url, &key, "", 100));
    job.env = vec![("NOP_TEST_REDIS_PASSWORD".into(), "wrong-pw-xyz".into())];
    let out = check(&job, &["connection `r`", "cannot connect"]);
    eprintln!(
        "wrong password: {}",
        out.lines()
            .find(|l| l.contains("connection `r`"))
            .unwrap_or_default()
    );

    // The password variable is not set.
    let mut job = redis_job(&r, "nopw", per_carrier_job(&r.server.url, &key, "", 100));
    job.env.clear();
    let o = job
        .command(None)
        .env_remove("NOP_TEST_REDIS_PASSWORD")
        .output()
        .unwrap();
    let out = common::job::text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("connection `r`")
            && out.contains("`NOP_TEST_REDIS_PASSWORD` (password_env) is not set"),
        "{out}"
    );

    // The server is down: a port where nothing listens.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{down}/0");
    let job = redis_job(&r, "down", per_carrier_job(&url, &key, "", 100));
    let out = check(&job, &["connection `r`", "cannot connect"]);
    assert!(
        !out.contains(&format!("127.0.0.1:{down}")),
        "the address appears: {out}"
    );
    // The sink side too.
    let job = redis_job(
        &r,
        "sinkdown",
        sink_job(&url, &r.key("out"), "effectively-once", 100),
    );
    check(&job, &["connection `r`", "cannot connect"]);
}

fn walk(dir: &std::path::PathBuf) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A redis-server of this test listening with TLS only on a free port, requiring
/// `password` (in its config file, not on a command line); the binary is the one the
/// test server runs (`REDIS_SERVER` or the usual paths).
fn tls_redis(
    dir: &std::path::Path,
    certs: &common::tls::Certs,
    password: &str,
) -> (common::tls::Child, u16) {
    let bin = std::env::var("REDIS_SERVER")
        .ok()
        .into_iter()
        .chain([
            "/usr/bin/redis-server".into(),
            "/usr/local/bin/redis-server".into(),
        ])
        .find(|p| std::path::Path::new(p).is_file())
        .expect("redis-server not found (set REDIS_SERVER)");
    let port = common::tls::free_port();
    let conf = dir.join("tls.conf");
    std::fs::write(
        &conf,
        format!(
            "bind 127.0.0.1\nport 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
             tls-ca-cert-file {}\ntls-auth-clients no\nrequirepass {password}\nsave \"\"\n\
             appendonly no\ndir {}\n",
            certs.cert.display(),
            certs.key.display(),
            certs.ca.display(),
            dir.display()
        ),
    )
    .unwrap();
    let child = std::process::Command::new(bin)
        .arg(&conf)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = common::tls::Child(child);
    common::tls::wait_for_port(port);
    (child, port)
}

#[test]
#[ignore = "needs redis-server: .ci/run installs it (scripts/redis-test-server.sh)"]
fn a_rediss_connection_verifies_the_server_against_its_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = common::tls::server_certs(tmp.path(), "redis");
    let other = common::tls::server_certs(tmp.path(), "other");
    let password = format!("tls-{}", std::process::id());
    let (_server, port) = tls_redis(tmp.path(), &certs, &password);
    let url = format!("rediss://127.0.0.1:{port}/0");
    // Fill the stream over TLS with the driver itself.
    let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).unwrap();
    let settings = info
        .redis_settings()
        .clone()
        .set_password(&password)
        .set_skip_set_lib_name();
    let client = redis::Client::build_with_tls(
        info.set_redis_settings(settings),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&certs.ca).unwrap()),
        },
    )
    .unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    let (_, lines) = csv_lines();
    for chunk in lines.chunks(10_000) {
        let mut p = redis::pipe();
        for l in chunk {
            p.cmd("XADD")
                .arg("flights")
                .arg("*")
                .arg("line")
                .arg(l)
                .ignore();
        }
        p.exec(&mut con).unwrap();
    }
    let text = |ca: &std::path::Path| {
        per_carrier_job(&url, "flights", "", 200).replace(
            "password_env = \"NOP_TEST_REDIS_PASSWORD\"\n",
            &format!(
                "password_env = \"NOP_TEST_REDIS_PASSWORD\"\nca_file = \"{}\"\n",
                ca.display()
            ),
        )
    };
    let tls_job = |tag: &str, ca: &std::path::Path| {
        let mut job = Job::new("redis", tag, &text(ca));
        job.env
            .push(("NOP_TEST_REDIS_PASSWORD".into(), password.clone()));
        job
    };
    // Trusting the server's CA: the output equals the independent computation.
    let job = tls_job("tls", &certs.ca);
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    check_per_carrier(&job.committed(), &expected_per_carrier());
    // Trusting another CA: the handshake fails, naming the connection, never the password.
    let job = tls_job("tls-wrong-ca", &other.ca);
    let (ok, out) = job.run(None);
    assert!(!ok, "{out}");
    assert!(out.contains("connection `r`"), "{out}");
    assert!(
        out.to_ascii_lowercase().contains("certificate"),
        "the error says why: {out}"
    );
    assert!(!out.contains(&password), "the password leaked: {out}");
}
