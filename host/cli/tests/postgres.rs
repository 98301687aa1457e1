//! The exactly-once Postgres sink against a real PostgreSQL server (design §7.5, §16.1).
//!
//! Every test here needs a server: `.ci/run` starts one with `scripts/pg-test-server.sh`
//! and runs them with `--ignored` (so a plain `cargo test --workspace` on a machine without
//! PostgreSQL stays green). Run by hand:
//!
//! ```sh
//! eval "$(scripts/pg-test-server.sh start)"
//! cargo test -p nop-stream-cli --test postgres -- --ignored --test-threads 1
//! scripts/pg-test-server.sh stop "$NOP_TEST_PG_DIR"
//! ```
//!
//! Without `NOP_TEST_PG_URL` and `PGPASSWORD` they fail, naming what is missing.
//!
//! Each test works in its own database; the flights per-record job (336,776 departures,
//! primary key = the natural key) is checked against a digest of an uninterrupted run.

mod common;

use common::kit::{repo, text};

use common::pg::{Db, connect, server};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

impl Db {
    fn departures_table(&mut self) {
        self.client
            .batch_execute(
                "CREATE TABLE departures (year int NOT NULL, month int NOT NULL, day int NOT NULL, \
                 carrier text NOT NULL, flight int NOT NULL, origin text NOT NULL, \
                 sched_dep_time int NOT NULL, dep_delay int, \
                 PRIMARY KEY (year, month, day, carrier, flight, origin, sched_dep_time))",
            )
            .unwrap();
    }

    /// Row count and an md5 over every row in key order.
    fn departures_digest(&mut self) -> (i64, String) {
        let r = self
            .client
            .query_one(
                "SELECT count(*), md5(coalesce(string_agg(concat_ws(',', year, month, day, carrier, \
                 flight, origin, sched_dep_time, dep_delay), ';' ORDER BY year, month, day, carrier, \
                 flight, origin, sched_dep_time), ''))::text FROM departures",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    }
}

const FIELDS: &str =
    r#"["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"]"#;

/// The flights per-record job writing into `departures` through connection `pg`.
fn per_record_job(url: &str, parallelism: u32, interval_ms: u64) -> String {
    common::pg::per_record_departures_job("pg-per-record", url, parallelism, interval_ms, None)
}

/// A job file next to the flights example (relative grants resolve against it), removed
/// on drop, with its own work directory.
struct Job {
    file: PathBuf,
    /// Holds the job file (apart from `work`, which the credential test scans).
    _dir: tempfile::TempDir,
    work: tempfile::TempDir,
}

impl Job {
    fn new(tag: &str, text: &str) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let file = common::kit::job_in(
            dir.path(),
            &format!("pg-{tag}.toml"),
            "examples/flights",
            text,
        );
        Job {
            file,
            _dir: dir,
            work: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, failpoints: Option<&str>, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
        c.args(["run", "--no-progress", "--no-echo", "--output"])
            .arg(self.work.path().join("out"))
            .arg("--work-dir")
            .arg(self.work.path().join("work"))
            .arg(&self.file)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoints {
            Some(f) => c.env("NOPSTREAM_FAILPOINTS", f),
            None => c.env_remove("NOPSTREAM_FAILPOINTS"),
        };
        c
    }

    fn run_with(&self, failpoints: Option<&str>, extra: &[&str]) -> (bool, String) {
        let o = self.command(failpoints, extra).output().unwrap();
        (o.status.success(), text(&o))
    }

    fn run(&self, failpoints: Option<&str>) -> (bool, String) {
        self.run_with(failpoints, &[])
    }

    fn kill_after(&self, after: Duration) -> bool {
        let mut child = self.command(None, &[]).spawn().unwrap();
        let t = Instant::now();
        while t.elapsed() < after {
            if child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        false
    }

    fn finish(&self) -> String {
        for _ in 0..5 {
            let (ok, text) = self.run(None);
            if ok {
                return text;
            }
            eprintln!("restart failed, retrying: {text}");
        }
        panic!("the job never finished");
    }
}

/// Digest of an uninterrupted run of the per-record job (p = 2).
fn reference() -> (i64, String) {
    let mut db = Db::new("ref");
    db.departures_table();
    let job = Job::new("ref", &per_record_job(&db.url, 2, 200));
    let t = Instant::now();
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    eprintln!("reference run: {:?}", t.elapsed());
    let digest = db.departures_digest();
    assert_eq!(digest.0, 336_776, "every departure once");
    assert!(db.prepared().is_empty());
    digest
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
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn per_record_insert_survives_failpoints_and_random_kills() {
    let expected = reference();
    for (i, fp) in FAILPOINTS.iter().enumerate() {
        let mut db = Db::new(&format!("fp{i}"));
        db.departures_table();
        let job = Job::new(&format!("fp{i}"), &per_record_job(&db.url, 2, 100));
        if fp.starts_with("during-restore") {
            let (ok, _) = job.run(Some("after-manifest-publish=2"));
            assert!(!ok);
        }
        let (ok, out) = job.run(Some(fp));
        assert!(!ok && out.contains("failpoint"), "{fp} did not fire: {out}");
        job.finish();
        assert_eq!(
            db.departures_digest(),
            expected,
            "table after a crash at {fp}"
        );
        assert_eq!(
            db.prepared(),
            Vec::<String>::new(),
            "left prepared after {fp}"
        );
    }
    // SIGKILL at pseudo-random moments, restarting each time, 20 kills in all.
    let mut x = 0x5eed_u64;
    let mut landed = 0;
    let mut round = 0;
    let mut span = 4000u64;
    while landed < 20 {
        round += 1;
        assert!(
            round <= 20,
            "kills keep missing the run ({landed}/20 landed)"
        );
        let mut db = Db::new(&format!("kill{round}"));
        db.departures_table();
        let job = Job::new(&format!("kill{round}"), &per_record_job(&db.url, 2, 100));
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 50 + (x >> 33) % span;
            if job.kill_after(Duration::from_millis(at)) {
                if first {
                    span = (span * 2 / 3).max(200);
                }
                break;
            }
            first = false;
            landed += 1;
            if landed == 20 {
                break;
            }
        }
        job.finish();
        assert_eq!(
            db.departures_digest(),
            expected,
            "table after kills (round {round})"
        );
        assert_eq!(
            db.prepared(),
            Vec::<String>::new(),
            "left prepared (round {round})"
        );
    }
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn commit_faults_commit_once_or_fail_loudly() {
    // A lost reply of COMMIT PREPARED: recover finds it committed; nothing repeats.
    let mut db = Db::new("lost");
    db.departures_table();
    let job = Job::new("lost", &per_record_job(&db.url, 2, 100));
    let (ok, out) = job.run(Some("commit-reply-lost=2:error"));
    assert!(ok, "{out}");
    assert_eq!(db.count("departures"), 336_776);
    assert!(db.prepared().is_empty());

    // The transaction disappears before COMMIT PREPARED (42704) and has no marker: an
    // error, and recover says unknown: the job fails and never reports it committed.
    let mut db = Db::new("expire");
    db.departures_table();
    let job = Job::new("expire", &per_record_job(&db.url, 2, 100));
    let (ok, out) = job.run(Some("expire-transaction=1:error"));
    assert!(!ok, "an unknown commit outcome must fail the job: {out}");
    assert!(
        out.contains("no such prepared transaction (42704) and no marker row")
            && out.contains("outcome is unknown")
            && out.contains("refusing to report it as committed"),
        "{out}"
    );

    // A prepared transaction of a durable epoch rolled back by hand behind the engine's
    // back: recovery must fail loudly (unknown), not report it committed.
    let mut db = Db::new("byhand");
    db.departures_table();
    let job = Job::new("byhand", &per_record_job(&db.url, 2, 100));
    let (ok, out) = job.run(Some("after-manifest-publish=2"));
    assert!(!ok && out.contains("failpoint"), "{out}");
    let prepared = db.prepared();
    assert!(
        !prepared.is_empty(),
        "the durable epoch's transactions are prepared"
    );
    for gid in &prepared {
        db.client
            .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .unwrap();
    }
    let (ok, out) = job.run(None);
    assert!(
        !ok,
        "a transaction rolled back by hand must fail recovery: {out}"
    );
    assert!(
        out.contains("outcome is unknown") && out.contains("refusing to report it as committed"),
        "{out}"
    );
    assert!(db.count("departures") < 336_776);
}

/// Pins a transaction committed behind the engine's back duplicating silently: epoch 2
/// was prepared on both subtasks but never durable (a crash after the pre-commits), a
/// DBA ran COMMIT PREPARED on one subtask's GID by hand, and the restart rolled back the
/// other GID, resumed from epoch 1 with exit 0 and numbered its epochs past 2, so it never
/// met the marker the hand commit left: the hand-committed rows were written twice. The
/// restart must fail loudly, naming the GID and the epoch, and write nothing.
#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn a_non_durable_epoch_committed_by_hand_fails_recovery_loudly() {
    let mut db = Db::new("handcommit");
    db.departures_table();
    // No key, as in the report: nothing in the table itself stops a duplicate.
    db.client
        .batch_execute("ALTER TABLE departures DROP CONSTRAINT departures_pkey")
        .unwrap();
    let job = Job::new("handcommit", &per_record_job(&db.url, 2, 100));
    // Crash at the fourth pre-commit: epoch 1 durable, both subtasks' epoch 2 prepared.
    let (ok, out) = job.run(Some("after-pre-commit=4"));
    assert!(!ok && out.contains("failpoint"), "{out}");
    let epoch_of = |gid: &str| -> u64 { gid.rsplit('_').next().unwrap().parse().unwrap() };
    let prepared = db.prepared();
    let last = prepared
        .iter()
        .map(|g| epoch_of(g))
        .max()
        .expect("prepared GIDs");
    let of_last: Vec<&String> = prepared.iter().filter(|g| epoch_of(g) == last).collect();
    assert_eq!(
        of_last.len(),
        2,
        "both subtasks prepared epoch {last}: {prepared:?}"
    );
    let gid = of_last[0].clone();
    db.client
        .batch_execute(&format!("COMMIT PREPARED '{gid}'"))
        .unwrap();
    let rows = db.count("departures");

    let (ok, out) = job.run(None);
    assert!(
        !ok,
        "a non-durable epoch committed by hand must fail recovery: {out}"
    );
    assert!(
        out.contains(&gid)
            && out.contains(&format!("epoch {last}"))
            && out.contains("outside the protocol"),
        "{out}"
    );
    assert_eq!(
        db.count("departures"),
        rows,
        "nothing written after the refusal"
    );
    // It stays refused: a second restart does not slip past it either.
    let (ok, out) = job.run(None);
    assert!(!ok && out.contains(&gid), "{out}");
    assert_eq!(db.count("departures"), rows);
}

/// A TCP proxy in front of the test server that can go down as a restarting database
/// does: every open connection is cut and new ones are closed at once.
struct Proxy {
    port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn start(target: std::net::SocketAddr) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (d, o) = (down.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if d.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                let mut open = o.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, down, open }
    }

    /// Cuts every connection and refuses new ones for `d`.
    fn outage(&self, d: Duration) {
        use std::sync::atomic::Ordering;
        self.down.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        std::thread::sleep(d);
        self.down.store(false, Ordering::SeqCst);
    }
}

/// Pins the default restart budget (3 recoveries per run, 100 ms doubling) ending a run
/// after any database outage longer than about a second. The database goes away for 3 s
/// in the middle of a run (every connection cut, new ones refused): with the failure-rate
/// budget (10 recoveries within 60 s) the run recovers, finishes, and its rows are exact.
#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn a_database_outage_of_a_few_seconds_does_not_end_a_run() {
    let expected = reference();
    let mut db = Db::new("outage");
    db.departures_table();
    let (before, rest) = db.url.split_once("@127.0.0.1:").expect("a loopback URL");
    let (port, path) = rest.split_once('/').unwrap();
    let proxy = Proxy::start(format!("127.0.0.1:{port}").parse().unwrap());
    let url = format!("{before}@127.0.0.1:{}/{path}", proxy.port);
    // About 5 s of input at two readers.
    let job_text = per_record_job(&url, 2, 100).replace(
        "config = { path = \"/input/flights.csv\"",
        "config = { max_records_per_second = 35000, path = \"/input/flights.csv\"",
    );
    let job = Job::new("outage", &job_text);
    let child = job.command(None, &[]).spawn().unwrap();
    let t = Instant::now();
    while db.count("departures") == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "nothing committed");
        std::thread::sleep(Duration::from_millis(50));
    }
    proxy.outage(Duration::from_secs(3));
    let o = child.wait_with_output().unwrap();
    let out = text(&o);
    assert!(o.status.success(), "the run outlived the outage: {out}");
    let recoveries: u32 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("recoveries"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(recoveries >= 2, "the outage cost recoveries: {out}");
    assert_eq!(db.departures_digest(), expected);
    assert!(db.prepared().is_empty());
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn downscale_from_4_to_2_leaves_nothing_prepared_and_exact_output() {
    let expected = reference();
    let mut db = Db::new("down");
    db.departures_table();
    let job = Job::new("down", &per_record_job(&db.url, 4, 100));
    // Crash after six pre-commits at p = 4: epoch 1 durable, epoch 2 partly prepared.
    let (ok, out) = job.run(Some("after-pre-commit=6"));
    assert!(!ok && out.contains("failpoint"), "{out}");
    let before = db.prepared();
    assert!(!before.is_empty(), "prepared transactions at the crash");
    eprintln!("prepared at the crash: {before:?}");
    let (ok, out) = job.run_with(None, &["-p", "2", "--rescale"]);
    assert!(ok, "{out}");
    assert_eq!(db.prepared(), Vec::<String>::new(), "nothing left prepared");
    assert_eq!(db.departures_digest(), expected);
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn upsert_with_consecutive_epochs_on_the_same_keys_finishes() {
    let mut db = Db::new("upsert");
    db.client
        .batch_execute(
            "CREATE TABLE last_departure (carrier text PRIMARY KEY, year int, month int, \
             day int, flight int, origin text, sched_dep_time int, dep_delay int, seen jsonb)",
        )
        .unwrap();
    // Every epoch upserts all 16 carriers: epoch N+1 writes keys N holds while prepared.
    let text = format!(
        r#"
[job]
name = "pg-upsert"
parallelism = 1
semantic = "strict-exactly-once"
checkpoint_interval_ms = 1000

[connections.pg]
kind = "postgres"
url = "{url}"
password_env = "PGPASSWORD"

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
config = {{ key = "carrier", fields = {FIELDS} }}

[[sink]]
name = "last"
plugin = "postgres-sink@0.1.0"
inputs = ["parse"]
connections = ["pg"]
config = {{ connection = "pg", table = "last_departure", mode = "upsert", key = ["carrier"],
    rows_per_statement = 64, columns = [
    {{ name = "carrier" }}, {{ name = "year" }}, {{ name = "month" }}, {{ name = "day" }},
    {{ name = "flight" }}, {{ name = "origin" }}, {{ name = "sched_dep_time" }},
    {{ name = "dep_delay" }}, {{ name = "seen", field = "flight", type = "jsonb" }},
] }}
"#,
        url = db.url
    );
    let job = Job::new("upsert", &text);
    let t = Instant::now();
    let (ok, out) = job.run(None);
    let took = t.elapsed();
    assert!(ok, "{out}");
    eprintln!("upsert job: {took:?}");
    assert!(
        took < Duration::from_secs(120),
        "took {took:?}: something waited on a lock"
    );
    // Independent computation: the last departure per carrier in file order.
    let csv = repo().join("examples/flights/data/flights.csv");
    let mut rdr = csv::Reader::from_path(&csv).unwrap();
    let headers = rdr.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let (c_carrier, c_flight, c_origin, c_day, c_month) = (
        col("carrier"),
        col("flight"),
        col("origin"),
        col("day"),
        col("month"),
    );
    let mut last = std::collections::BTreeMap::new();
    for r in rdr.records() {
        let r = r.unwrap();
        last.insert(
            r[c_carrier].to_owned(),
            (
                r[c_month].parse::<i32>().unwrap(),
                r[c_day].parse::<i32>().unwrap(),
                r[c_flight].parse::<i32>().unwrap(),
                r[c_origin].to_owned(),
            ),
        );
    }
    let rows = db
        .client
        .query(
            "SELECT carrier, month, day, flight, origin, seen::text FROM last_departure ORDER BY carrier",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), last.len());
    for r in rows {
        let carrier: String = r.get(0);
        let got = (r.get(1), r.get(2), r.get(3), r.get::<_, String>(4));
        assert_eq!(Some(&got), last.get(&carrier), "carrier {carrier}");
        assert_eq!(r.get::<_, String>(5), got.2.to_string(), "jsonb column");
    }
    assert!(db.prepared().is_empty());
    let epochs: i64 = db
        .client
        .query_one("SELECT count(*) FROM nop_sink_epochs", &[])
        .unwrap()
        .get(0);
    assert!(epochs >= 2, "several epochs committed ({epochs})");
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn bad_connections_fail_clearly_and_no_credential_leaks() {
    let mut db = Db::new("bad");
    db.departures_table();
    let password = db.server.password.clone();
    let good = per_record_job(&db.url, 1, 200);
    let mut seen = String::new();
    let mut check = |what: &str, text: &str, expect: &[&str]| {
        for e in expect {
            assert!(text.contains(e), "{what}: expected {e:?} in:\n{text}");
        }
        seen.push_str(text);
    };

    // An undeclared connection name.
    let job = Job::new(
        "undeclared",
        &good.replace(r#"connections = ["pg"]"#, r#"connections = ["pgx"]"#),
    );
    let (ok, out) = job.run(None);
    assert!(!ok);
    check(
        "undeclared",
        &out,
        &[
            "sink[0].connections[0]",
            "connection `pgx` is not declared",
            "`pg`",
        ],
    );

    // A sink without the grant.
    let job = Job::new("nogrant", &good.replace("connections = [\"pg\"]\n", ""));
    let (ok, out) = job.run_with(None, &["--max-restarts", "0"]);
    assert!(!ok);
    check(
        "no grant",
        &out,
        &["connection `pg` is not granted to sink `departures`"],
    );

    // A password in the URL is refused at parse time, without echoing it.
    let with_pw = good.replace("postgres://nop@", "postgres://nop:hunter2-in-url@");
    let job = Job::new("pwurl", &with_pw);
    let (ok, out) = job.run(None);
    assert!(!ok);
    check(
        "password in url",
        &out,
        &["connections.pg.url", "holds a password"],
    );
    assert!(!out.contains("hunter2-in-url"), "{out}");
    // The two forms the driver authenticated with while the check let them through: a
    // percent-encoded parameter name, and a `/` in the password.
    let (user, rest) = db.url["postgres://".len()..]
        .split_once('@')
        .expect("a user@ URL");
    for (name, url, needle) in [
        (
            "pwparam",
            format!("postgres://{user}@{rest}?pass%77ord=hunter2-in-url"),
            "a credential",
        ),
        (
            "pwslash",
            format!("postgres://{user}:hunter2/in-url@{rest}"),
            "holds a password",
        ),
    ] {
        let job = Job::new(name, &good.replace(&db.url, &url));
        let (ok, out) = job.run(None);
        assert!(!ok, "{name}: {out}");
        check(name, &out, &["connections.pg.url", needle]);
        assert!(!out.contains("hunter2"), "{out}");
    }

    // A wrong password.
    let job = Job::new("wrongpw", &good);
    let o = job
        .command(None, &["--max-restarts", "0"])
        .env("PGPASSWORD", "not-the-password")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let out = text(&o);
    check("wrong password", &out, &["connection `pg`", "28P01"]);
    assert!(!out.contains("not-the-password"), "{out}");

    // The server down at start (nothing listens on the port).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let down_url = format!("postgres://nop@127.0.0.1:{port}/{}", db.name);
    let job = Job::new("down", &good.replace(&db.url, &down_url));
    let (ok, out) = job.run_with(None, &["--max-restarts", "0"]);
    assert!(!ok);
    check("server down", &out, &["connection `pg`", "cannot connect"]);
    assert!(
        !out.contains(&port.to_string()),
        "the address leaked: {out}"
    );

    // A good run with debug logs, its plan and its manifests: no password anywhere.
    let job = Job::new("good", &good);
    let o = job
        .command(None, &[])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    seen.push_str(&out);
    for layer in ["model", "stream", "partitioned", "deployment"] {
        let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
            .args(["plan", "--layer", layer])
            .arg(&job.file)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let plan = text(&o);
        if layer != "deployment" {
            assert!(
                plan.contains("password_env"),
                "the plan names the variable: {plan}"
            );
        }
        seen.push_str(&plan);
    }
    let mut files = 0;
    for entry in walk(job.work.path()) {
        let bytes = std::fs::read(&entry).unwrap();
        files += 1;
        assert!(
            !bytes
                .windows(password.len())
                .any(|w| w == password.as_bytes()),
            "the password is in {}",
            entry.display()
        );
    }
    assert!(files > 0);
    assert!(
        !seen.contains(&password),
        "the password leaked into output or logs"
    );
    assert_eq!(db.count("departures"), 336_776);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn prepared_transactions_disabled_is_a_clear_error() {
    server(); // fail clearly without a configured server, like the other tests
    // A second, throwaway server with max_prepared_transactions = 0.
    let script = repo().join("scripts/pg-test-server.sh");
    let o = Command::new(&script)
        .arg("start")
        .env("NOP_PG_MAX_PREPARED", "0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let exports = String::from_utf8_lossy(&o.stdout).into_owned();
    let var = |name: &str| -> String {
        exports
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}='")))
            .and_then(|v| v.strip_suffix('\''))
            .unwrap_or_else(|| panic!("{name} in {exports}"))
            .to_owned()
    };
    let (url, password, dir) = (
        var("NOP_TEST_PG_URL"),
        var("PGPASSWORD"),
        var("NOP_TEST_PG_DIR"),
    );
    struct Stop(PathBuf, String);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = Command::new(&self.0).args(["stop", &self.1]).output();
        }
    }
    let _stop = Stop(script, dir);
    let mut c = connect(&url, &password).unwrap();
    c.batch_execute(
        "CREATE TABLE departures (year int, month int, day int, carrier text, flight int, \
         origin text, sched_dep_time int, dep_delay int)",
    )
    .unwrap();
    let job = Job::new("noprep", &per_record_job(&url, 1, 200));
    let o = job
        .command(None, &["--max-restarts", "0"])
        .env("PGPASSWORD", &password)
        .output()
        .unwrap();
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("prepared transactions disabled (max_prepared_transactions = 0)")
            && out.contains("55000"),
        "{out}"
    );
    let n: i64 = c
        .query_one("SELECT count(*) FROM departures", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing written without two-phase commit");
}

/// The last departure per (carrier, flight) in file order, upserted without two-phase
/// commit (`transactions = "none"`) at parallelism 2, records hashed by carrier.
fn upsert_none_job(url: &str, semantic: &str, interval_ms: u64) -> String {
    format!(
        r#"
[job]
name = "pg-upsert-none"
parallelism = 2
semantic = "{semantic}"
checkpoint_interval_ms = {interval_ms}

[connections.pg]
kind = "postgres"
url = "{url}"
password_env = "PGPASSWORD"

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
parallelism = 1
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
parallelism = 1
inputs = ["flights"]
config = {{ key = "carrier", fields = {FIELDS} }}

[[sink]]
name = "last-per-flight"
plugin = "postgres-sink@0.1.0"
inputs = [{{ from = "parse", partition = "hash" }}]
connections = ["pg"]
config = {{ connection = "pg", table = "last_flight", mode = "upsert", transactions = "none",
    key = ["carrier", "flight"], rows_per_statement = 256, columns = [
    {{ name = "carrier" }}, {{ name = "flight" }}, {{ name = "month" }}, {{ name = "day" }},
    {{ name = "origin" }}, {{ name = "sched_dep_time" }}, {{ name = "dep_delay" }},
] }}
"#
    )
}

type LastFlight = std::collections::BTreeMap<(String, i32), (i32, i32, String, i32, Option<i32>)>;

/// Independent computation: the last departure per (carrier, flight) in file order.
fn last_flight_expected() -> LastFlight {
    let csv = repo().join("examples/flights/data/flights.csv");
    let mut rdr = csv::Reader::from_path(&csv).unwrap();
    let headers = rdr.headers().unwrap().clone();
    let col = |n: &str| headers.iter().position(|h| h == n).unwrap();
    let c: Vec<usize> = [
        "carrier",
        "flight",
        "month",
        "day",
        "origin",
        "sched_dep_time",
        "dep_delay",
    ]
    .iter()
    .map(|n| col(n))
    .collect();
    let mut last = LastFlight::new();
    for r in rdr.records() {
        let r = r.unwrap();
        last.insert(
            (r[c[0]].to_owned(), r[c[1]].parse().unwrap()),
            (
                r[c[2]].parse().unwrap(),
                r[c[3]].parse().unwrap(),
                r[c[4]].to_owned(),
                r[c[5]].parse().unwrap(),
                r[c[6]].parse().ok(),
            ),
        );
    }
    last
}

fn last_flight_table(db: &mut Db) -> LastFlight {
    db.client
        .query(
            "SELECT carrier, flight, month, day, origin, sched_dep_time, dep_delay FROM last_flight",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| {
            (
                (r.get(0), r.get(1)),
                (r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn upsert_without_two_phase_commit_survives_random_kills_effectively_once() {
    let expected = last_flight_expected();
    assert!(expected.len() > 3000, "{} keys", expected.len());
    let mut db = Db::new("none");
    // Prepared transactions disabled would not matter: none are used. The table only.
    db.client
        .batch_execute(
            "CREATE TABLE last_flight (carrier text NOT NULL, flight int NOT NULL, month int, \
             day int, origin text, sched_dep_time int, dep_delay int, PRIMARY KEY (carrier, flight))",
        )
        .unwrap();
    let job = Job::new("none", &upsert_none_job(&db.url, "effectively-once", 100));
    // SIGKILL at pseudo-random moments, restarting each time; 20 kills that land.
    let mut x = 0xfeed_u64;
    let mut landed = 0;
    let mut misses = 0;
    while landed < 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = 100 + (x >> 33) % 2500;
        if job.kill_after(Duration::from_millis(at)) {
            // The job finished before the kill: the table must already be exact.
            assert_eq!(last_flight_table(&mut db), expected, "after a finished run");
            misses += 1;
            assert!(
                misses <= 10,
                "kills keep missing the run ({landed}/20 landed)"
            );
            db.client.batch_execute("TRUNCATE last_flight").unwrap();
            for d in ["work", "out"] {
                let _ = std::fs::remove_dir_all(job.work.path().join(d));
            }
            continue;
        }
        landed += 1;
    }
    let rows_before_finish = db.count("last_flight");
    eprintln!("rows after 20 kills: {rows_before_finish}");
    job.finish();
    assert_eq!(last_flight_table(&mut db), expected);
    assert!(db.prepared().is_empty(), "nothing prepared");
    let markers: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'nop_sink_epochs'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(markers, 0, "no marker table without two-phase commit");
}

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn transactions_none_is_refused_in_a_strict_job_and_for_insert() {
    let db = Db::new("nonestrict");
    // Plan time: a strict job with an idempotent sink is refused, naming sink and setting.
    let job = Job::new(
        "nonestrict",
        &upsert_none_job(&db.url, "strict-exactly-once", 100),
    );
    for cmd in ["plan", "run"] {
        let o = if cmd == "plan" {
            Command::new(env!("CARGO_BIN_EXE_nopstream"))
                .args(["plan"])
                .arg(&job.file)
                .output()
                .unwrap()
        } else {
            job.command(None, &[]).output().unwrap()
        };
        let out = text(&o);
        assert!(!o.status.success(), "{cmd}: {out}");
        for needle in [
            "sink `last-per-flight`",
            "postgres-sink@0.1.0",
            "idempotent (config `transactions = \"none\"`)",
            "strict-exactly-once",
            "semantic = \"effectively-once\"",
        ] {
            assert!(
                out.contains(needle),
                "{cmd}: `{needle}` missing from: {out}"
            );
        }
    }
    // The same sink with two-phase transactions plans as strict.
    let strict = upsert_none_job(&db.url, "strict-exactly-once", 100)
        .replace("transactions = \"none\"", "transactions = \"two-phase\"");
    let job = Job::new("twophase", &strict);
    let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(["plan"])
        .arg(&job.file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // Config time: insert without two-phase commit would duplicate on replay.
    let insert = per_record_job(&db.url, 1, 100)
        .replace(
            "semantic = \"strict-exactly-once\"",
            "semantic = \"effectively-once\"",
        )
        .replace(
            "config = { connection = \"pg\", table = \"departures\",",
            "config = { connection = \"pg\", table = \"departures\", transactions = \"none\",",
        );
    assert!(insert.contains("transactions = \"none\""));
    let job = Job::new("noneinsert", &insert);
    let (ok, out) = job.run(None);
    assert!(!ok, "{out}");
    assert!(
        out.contains("\"transactions\" = \"none\" needs \"mode\" = \"upsert\""),
        "{out}"
    );
}

/// A job writing `/input/typed.jsonl` (in `dir`) into table `typed` with one column of
/// each sink `type`.
fn typed_job(url: &str, dir: &Path) -> String {
    format!(
        r#"
[job]
name = "pg-typed"
parallelism = 1
semantic = "strict-exactly-once"
checkpoint_interval_ms = 100

[connections.pg]
kind = "postgres"
url = "{url}"
password_env = "PGPASSWORD"

[[source]]
name = "lines"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "{dir}" }}]
config = {{ path = "/input/typed.jsonl", format = "jsonl" }}

[[sink]]
name = "typed"
plugin = "postgres-sink@0.1.0"
inputs = ["lines"]
connections = ["pg"]
config = {{ connection = "pg", table = "typed", columns = [
    {{ name = "id", type = "int4" }}, {{ name = "b", type = "bool" }},
    {{ name = "i2", type = "int2" }}, {{ name = "i4", type = "int4" }},
    {{ name = "i8", type = "int8" }}, {{ name = "f4", type = "float4" }},
    {{ name = "f8", type = "float8" }}, {{ name = "n", type = "numeric" }},
    {{ name = "t", type = "text" }}, {{ name = "j", type = "jsonb" }},
    {{ name = "by", type = "bytea" }}, {{ name = "u", type = "uuid" }},
    {{ name = "ts", type = "timestamptz" }}, {{ name = "tsms", type = "timestamptz-ms" }},
    {{ name = "a" }},
] }}
"#,
        dir = dir.display()
    )
}

const TYPED_DDL: &str = "CREATE TABLE typed (id int PRIMARY KEY, b bool, i2 int2, i4 int4, \
    i8 int8, f4 float4, f8 float8, n numeric, t text, j jsonb, by bytea, u uuid, \
    ts timestamptz, tsms timestamptz, a text)";

#[test]
#[ignore = "needs PostgreSQL: .ci/run starts one (scripts/pg-test-server.sh)"]
fn every_column_type_round_trips_and_a_misfit_names_its_column() {
    let big = "-123456789012345678901234567890.123456789012345678901234567890";
    let lines = [
        format!(
            r#"{{"id":1,"b":true,"i2":-32768,"i4":2147483647,"i8":-9223372036854775808,"f4":3.4028235e38,"f8":"NaN","n":"{big}","t":"héllo \"q\"","j":{{"a":[1,2,{{"b":null}}]}},"by":"","u":"67E55044-10b1-426f-9247-bb680e5fe0c8","ts":"2026-12-02T18:34:07.123456+01:00","tsms":1796232847123,"a":"x"}}"#
        ),
        r#"{"id":2,"b":false,"i2":32767,"i4":-2147483648,"i8":9223372036854775807,"f4":"-Infinity","f8":"Infinity","n":1.5e-3,"t":"","j":"s","by":"\\xDEADbeef","u":"00000000000000000000000000000000","ts":"1969-12-31T23:59:59.5Z","tsms":-1,"a":7}"#.to_owned(),
        r#"{"id":3,"f4":-0.25,"f8":"-Infinity","n":"NaN","by":"3q2+7w==","j":null,"tsms":0,"a":"2.5"}"#.to_owned(),
        r#"{"id":4,"b":null,"i2":null,"i4":null,"i8":null,"f4":null,"f8":1e308,"n":null,"t":null,"by":null,"u":null,"ts":null,"tsms":null,"a":null}"#.to_owned(),
    ];
    let mut db = Db::new("typed");
    db.client.batch_execute(TYPED_DDL).unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("typed.jsonl"), lines.join("\n") + "\n").unwrap();
    let job = Job::new("typed", &typed_job(&db.url, data.path()));
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    let rows = db
        .client
        .query(
            "SELECT id, b, i2, i4, i8, f4, f8, n::text, t, j::text, by, u::text, \
             (extract(epoch FROM ts) * 1000000)::int8, (extract(epoch FROM tsms) * 1000000)::int8, a \
             FROM typed ORDER BY id",
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 4);
    type Row = (
        i32,
        Option<bool>,
        Option<i16>,
        Option<i32>,
        Option<i64>,
        Option<f32>,
        Option<f64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<Vec<u8>>,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<String>,
    );
    let got: Vec<Row> = rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
                r.get(7),
                r.get(8),
                r.get(9),
                r.get(10),
                r.get(11),
                r.get(12),
                r.get(13),
                r.get(14),
            )
        })
        .collect();
    // Row 1: extremes, many digits, text with quotes, nested jsonb, empty bytea.
    let r = &got[0];
    assert_eq!(
        (r.1, r.2, r.3, r.4),
        (Some(true), Some(i16::MIN), Some(i32::MAX), Some(i64::MIN))
    );
    assert_eq!(r.5, Some(f32::MAX));
    assert!(r.6.unwrap().is_nan());
    assert_eq!(r.7.as_deref(), Some(big));
    assert_eq!(r.8.as_deref(), Some("héllo \"q\""));
    assert_eq!(r.9.as_deref(), Some(r#"{"a": [1, 2, {"b": null}]}"#));
    assert_eq!(r.10.as_deref(), Some(&[][..]));
    assert_eq!(
        r.11.as_deref(),
        Some("67e55044-10b1-426f-9247-bb680e5fe0c8")
    );
    // 2026-12-02T17:34:07.123456Z is 1796232847 s after 1970 (`date -d ... +%s`).
    assert_eq!(r.12, Some(1_796_232_847_123_456));
    assert_eq!(r.13, Some(1_796_232_847_123_000));
    assert_eq!(r.14.as_deref(), Some("x"));
    // Row 2: the other ends, infinities, a numeric from a JSON number with an exponent,
    // hex bytea, a jsonb string, an integer into an auto (text) column.
    let r = &got[1];
    assert_eq!(
        (r.1, r.2, r.3, r.4),
        (Some(false), Some(i16::MAX), Some(i32::MIN), Some(i64::MAX))
    );
    assert_eq!(r.5, Some(f32::NEG_INFINITY));
    assert_eq!(r.6, Some(f64::INFINITY));
    assert_eq!(r.7.as_deref(), Some("0.0015"));
    assert_eq!(r.8.as_deref(), Some(""));
    assert_eq!(r.9.as_deref(), Some("\"s\""));
    assert_eq!(r.10.as_deref(), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
    assert_eq!(
        r.11.as_deref(),
        Some("00000000-0000-0000-0000-000000000000")
    );
    assert_eq!(r.12, Some(-500_000));
    assert_eq!(r.13, Some(-1000));
    assert_eq!(r.14.as_deref(), Some("7"));
    // Row 3: base64 bytea, numeric NaN, -inf, missing fields are NULL.
    let r = &got[2];
    assert_eq!((r.1, r.2, r.3, r.4), (None, None, None, None));
    assert_eq!(r.5, Some(-0.25));
    assert_eq!(r.6, Some(f64::NEG_INFINITY));
    assert_eq!(r.7.as_deref(), Some("NaN"));
    assert_eq!(r.9, None);
    assert_eq!(r.10.as_deref(), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
    assert_eq!(r.13, Some(0));
    assert_eq!(r.14.as_deref(), Some("2.5"));
    // Row 4: explicit nulls everywhere, the largest float8.
    let r = &got[3];
    assert_eq!(r.6, Some(1e308));
    assert_eq!(
        (
            r.1,
            r.2,
            r.3,
            r.4,
            r.5,
            r.7.as_ref(),
            r.10.as_ref(),
            r.12,
            r.14.as_ref()
        ),
        (None, None, None, None, None, None, None, None, None)
    );

    // A value that does not fit fails the job with an error naming the column.
    for (i, (line, needle)) in [
        (
            r#"{"id":9,"i2":70000}"#,
            r#"column "i2" (int2, field "i2"): 70000 is out of range for int2 (-32768..=32767)"#,
        ),
        (
            r#"{"id":9,"by":"not base64!"}"#,
            r#"column "by" (bytea, field "by"): "not base64!" is not base64"#,
        ),
        (
            r#"{"id":9,"u":"nope"}"#,
            r#"column "u" (uuid, field "u"): "nope" is not a UUID"#,
        ),
        (
            r#"{"id":9,"ts":"2026-02-30T00:00:00Z"}"#,
            r#"column "ts" (timestamptz, field "ts"): "2026-02-30T00:00:00Z" is not an RFC 3339 timestamp (no such date)"#,
        ),
        (
            r#"{"id":9,"n":"12abc"}"#,
            r#"column "n" (numeric, field "n"): "12abc" is not a decimal number"#,
        ),
        (
            r#"{"id":9,"a":2.5}"#,
            r#"writing into typed (column "a", type auto: the value does not bind to the table's column type)"#,
        ),
        (
            r#"{"id":9,"f4":1e300}"#,
            r#"column "f4" (float4, field "f4"): 1e+300 is out of range for float4"#,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(data.path().join("typed.jsonl"), format!("{line}\n")).unwrap();
        // Each misfit run is a fresh run of the same job: an empty epoch may commit before
        // the bad record is read, and must not meet the markers of the run before.
        db.client
            .batch_execute("DELETE FROM nop_sink_epochs")
            .unwrap();
        let job = Job::new(&format!("misfit{i}"), &typed_job(&db.url, data.path()));
        let (ok, out) = job.run(None);
        assert!(!ok, "{line}: {out}");
        assert!(out.contains(needle), "{line}: `{needle}` missing from: {out}");
    }
    assert_eq!(db.count("typed"), 4, "no misfit row was written");
}
