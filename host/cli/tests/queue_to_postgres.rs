//! From a queue into a database, exactly once, under crashes (design §7.5): the
//! flights CSV published into JetStream and written by the two-phase-commit Postgres sink,
//! killed at every failpoint of the engine and by SIGKILL at ≥ 20 pseudo-random moments,
//! restarted until it finishes, each time into a fresh database:
//!
//! - per record, insert mode, into a table whose primary key is the flights' natural key
//!   (year, month, day, carrier, flight, origin, sched_dep_time; unique in the data): the
//!   table holds exactly the CSV's 336,776 keys, each with the CSV's `dep_delay`;
//! - the `examples/queue-to-postgres` job (per carrier and day, upsert mode): the table
//!   equals the figures computed here from the CSV, and a kill while its upserts are
//!   prepared but not committed recovers exactly.
//!
//! Both end with nothing in `pg_prepared_xacts` and no token or password in any output.
//! The expectations come from the CSV read here with the `csv` crate, never from the
//! engine.
//!
//! Every test needs both servers: `.ci/run` starts them with `scripts/pg-test-server.sh`
//! and `scripts/nats-test-server.sh` and runs the suite with `--ignored` (a plain
//! `cargo test --workspace` stays green without them). By hand:
//!
//! ```sh
//! eval "$(scripts/pg-test-server.sh start)"
//! eval "$(scripts/nats-test-server.sh start)"
//! cargo test --workspace --test queue_to_postgres -- --ignored --nocapture --test-threads 2
//! scripts/nats-test-server.sh stop "$NOP_TEST_NATS_DIR"
//! scripts/pg-test-server.sh stop "$NOP_TEST_PG_DIR"
//! ```
//!
//! Without `NOP_TEST_PG_URL`, `PGPASSWORD`, `NOP_TEST_NATS_URL` or `NOP_TEST_NATS_TOKEN`
//! they fail, naming what is missing.

mod common;

use common::job::{Job, kill_rounds, repo, text};
use common::pg::Db;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Flights in the CSV (lines after the header).
const FLIGHTS: usize = 336_776;

/// The engine's failpoints that end a run (`host/checkpoint/src/failpoint.rs`), each with
/// the hit it fires on. `during-restore` needs a checkpoint to restore: the test crashes
/// at `after-manifest-publish=2` first.
const FAILPOINTS: &[&str] = &[
    "before-barrier-injection=2",
    "after-barrier-injection=3",
    "after-pre-commit=2",
    "after-manifest-publish=2",
    "mid-commit=3",
    "during-restore=1",
];

/// SIGKILLs per test at pseudo-random moments (at least 20, design §7.5).
const RANDOM_KILLS: usize = 20;

/// The two test servers, from the environment `scripts/*-test-server.sh start` prints.
struct Servers {
    /// `PGPASSWORD`.
    pg_password: String,
    /// `nats://host:port`, no token.
    nats_url: String,
    /// `NOP_TEST_NATS_TOKEN`.
    nats_token: String,
}

fn servers() -> Servers {
    let var = |name: &str| std::env::var(name).ok();
    let vars = [
        "NOP_TEST_PG_URL",
        "PGPASSWORD",
        "NOP_TEST_NATS_URL",
        "NOP_TEST_NATS_TOKEN",
    ];
    let missing: Vec<&str> = vars.iter().copied().filter(|v| var(v).is_none()).collect();
    assert!(
        missing.is_empty(),
        "the queue-to-postgres tests need PostgreSQL and nats-server with JetStream; {} not \
         set: start both with `eval \"$(scripts/pg-test-server.sh start)\"` and \
         `eval \"$(scripts/nats-test-server.sh start)\"` (see examples/queue-to-postgres/README.md)",
        missing.join(", ")
    );
    Servers {
        pg_password: var("PGPASSWORD").unwrap(),
        nats_url: var("NOP_TEST_NATS_URL").unwrap(),
        nats_token: var("NOP_TEST_NATS_TOKEN").unwrap(),
    }
}

/// Fails if `out` holds the Postgres password or the NATS token.
fn no_secret(out: &str, what: &str) {
    let s = servers();
    assert!(
        !out.contains(&s.pg_password) && !out.contains(&s.nats_token),
        "{what}: a credential leaked into the output"
    );
}

/// Fails if a file under `dir` holds the Postgres password or the NATS token.
fn no_secret_in_files(dir: &std::path::Path) -> usize {
    let s = servers();
    let mut files = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files += no_secret_in_files(&p);
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        for secret in [&s.pg_password, &s.nats_token] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "a credential is in {}",
                p.display()
            );
        }
        files += 1;
    }
    files
}

/// The flights stream of this test process, published once with `nopstream nats publish`
/// (the example's generator step).
fn flights_stream() -> &'static str {
    static STREAM: OnceLock<String> = OnceLock::new();
    STREAM.get_or_init(|| {
        let s = servers();
        let name = format!("QTP_{}", std::process::id());
        let t = Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
            .args(["nats", "publish", "--url", &s.nats_url])
            .args(["--password-env", "NOP_TEST_NATS_TOKEN"])
            .args(["--stream", &name, "--subject", &format!("{name}.flights")])
            .arg(repo().join("examples/flights/data/flights.csv.zip"))
            .args(["--member", "flights.csv"])
            .output()
            .unwrap();
        let out = text(&o);
        assert!(o.status.success(), "publish failed: {out}");
        assert!(
            out.contains(&format!("published {FLIGHTS} messages")),
            "{out}"
        );
        no_secret(&out, "publish");
        eprintln!("{} ({:?})", out.trim(), t.elapsed());
        name
    })
}

impl Db {
    /// GIDs of the prepared transactions that hold a lock on `table` (a prepared
    /// transaction keeps the locks of its writes: it wrote rows into `table` and is neither
    /// committed nor rolled back).
    fn prepared_writing_into(&mut self, table: &str) -> BTreeSet<String> {
        self.client
            .query(
                "SELECT p.gid FROM pg_prepared_xacts p \
                 JOIN pg_locks x ON x.locktype = 'transactionid' AND x.pid IS NULL \
                 AND x.transactionid = p.transaction \
                 JOIN pg_locks r ON r.locktype = 'relation' AND r.pid IS NULL \
                 AND r.virtualtransaction = x.virtualtransaction AND r.relation = to_regclass($1) \
                 WHERE p.database = current_database()",
                &[&table],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// The flights CSV from the repository's zip, parsed with the `csv` crate: the header's
/// column index by name, and the records.
fn csv_records() -> &'static (BTreeMap<String, usize>, Vec<csv::StringRecord>) {
    static CSV: OnceLock<(BTreeMap<String, usize>, Vec<csv::StringRecord>)> = OnceLock::new();
    CSV.get_or_init(|| {
        let f = std::fs::File::open(repo().join("examples/flights/data/flights.csv.zip"))
            .expect("flights zip in the repository");
        let mut text = String::new();
        zip::ZipArchive::new(f)
            .unwrap()
            .by_name("flights.csv")
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let mut r = csv::Reader::from_reader(text.as_bytes());
        let cols = r
            .headers()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, h)| (h.to_owned(), i))
            .collect();
        let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), FLIGHTS);
        (cols, rows)
    })
}

/// A flight's natural key: year, month, day, carrier, flight, origin, sched_dep_time.
type NaturalKey = (i32, i32, i32, String, i32, String, i32);

/// The CSV's flights: natural key (checked unique, so it can be a primary key) to
/// `dep_delay` (`None` for `NA`).
fn csv_departures() -> BTreeMap<NaturalKey, Option<i32>> {
    let (cols, rows) = csv_records();
    let c = |n: &str| cols[n];
    let int = |r: &csv::StringRecord, n: &str| -> i32 { r[c(n)].parse().unwrap() };
    let mut keys = BTreeMap::new();
    for r in rows {
        let k = (
            int(r, "year"),
            int(r, "month"),
            int(r, "day"),
            r[c("carrier")].to_owned(),
            int(r, "flight"),
            r[c("origin")].to_owned(),
            int(r, "sched_dep_time"),
        );
        let delay = match &r[c("dep_delay")] {
            "NA" => None,
            d => Some(d.parse().unwrap()),
        };
        assert!(
            keys.insert(k.clone(), delay).is_none(),
            "natural key {k:?} twice in the CSV"
        );
    }
    keys
}

/// The per-record insert job: the stream through `flights-mapper` into `departures`.
fn per_record_job(db_url: &str) -> String {
    let s = servers();
    format!(
        r#"
[job]
name = "queue-to-postgres-per-record"
parallelism = 2
semantic = "strict-exactly-once"
checkpoint_interval_ms = 200

[connections.queue]
kind = "nats"
url = "{nats}"
password_env = "NOP_TEST_NATS_TOKEN"

[connections.db]
kind = "postgres"
url = "{db_url}"
password_env = "PGPASSWORD"

[[source]]
name = "flights"
plugin = "jetstream-source@0.1.0"
connections = ["queue"]
config = {{ connection = "queue", streams = ["{stream}"], max_wait_ms = 50 }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier", fields = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"] }}

[[sink]]
name = "departures"
plugin = "postgres-sink@0.1.0"
inputs = ["parse"]
connections = ["db"]
config = {{ connection = "db", table = "departures", mode = "insert", columns = [
    {{ name = "year" }}, {{ name = "month" }}, {{ name = "day" }}, {{ name = "carrier" }},
    {{ name = "flight" }}, {{ name = "origin" }}, {{ name = "sched_dep_time" }},
    {{ name = "dep_delay" }},
] }}
"#,
        nats = s.nats_url,
        stream = flights_stream(),
    )
}

/// A fresh database with the `departures` table, keyed by the natural key.
fn departures_db(tag: &str) -> Db {
    let mut db = Db::new(tag);
    db.client
        .batch_execute(
            "CREATE TABLE departures (year int NOT NULL, month int NOT NULL, day int NOT NULL, \
             carrier text NOT NULL, flight int NOT NULL, origin text NOT NULL, \
             sched_dep_time int NOT NULL, dep_delay int, \
             PRIMARY KEY (year, month, day, carrier, flight, origin, sched_dep_time))",
        )
        .unwrap();
    db
}

/// Checks the per-record table: exactly the CSV's keys (the primary key makes each one
/// once), each with its `dep_delay`, and nothing left prepared.
fn check_departures(db: &mut Db, expected: &BTreeMap<NaturalKey, Option<i32>>, what: &str) {
    let rows = db
        .client
        .query(
            "SELECT year, month, day, carrier, flight, origin, sched_dep_time, dep_delay \
             FROM departures",
            &[],
        )
        .unwrap();
    let n = rows.len();
    let got: BTreeMap<NaturalKey, Option<i32>> = rows
        .iter()
        .map(|r| {
            let k = (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            );
            (k, r.get(7))
        })
        .collect();
    if got != *expected {
        let missing: Vec<_> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra = got.keys().filter(|k| !expected.contains_key(*k)).count();
        let wrong = expected
            .iter()
            .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
            .count();
        panic!(
            "{what}: {n} rows; {} of the CSV's {} keys missing (first {:?}), {extra} not in \
             the CSV, {wrong} with another dep_delay",
            missing.len(),
            expected.len(),
            missing.first()
        );
    }
    assert_eq!(n, FLIGHTS, "{what}: row count");
    assert_eq!(db.prepared(), Vec::<String>::new(), "{what}: left prepared");
}

/// Runs `job` with `fp` armed (after a crash at `after-manifest-publish=2` for
/// `during-restore`), checks it fired, then restarts it until it finishes.
fn crash_at(job: &Job, fp: &str) {
    if fp.starts_with("during-restore") {
        let (ok, out) = job.run(Some("after-manifest-publish=2"));
        assert!(!ok && out.contains("failpoint"), "no checkpoint: {out}");
    }
    let (ok, out) = job.run(Some(fp));
    assert!(!ok && out.contains("failpoint"), "{fp} did not fire: {out}");
    no_secret(&out, fp);
    let out = job.finish();
    no_secret(&out, fp);
}

#[test]
#[ignore = "needs PostgreSQL and nats-server: .ci/run starts both (scripts/*-test-server.sh)"]
fn per_record_insert_from_jetstream_survives_failpoints_and_random_kills() {
    let expected = csv_departures();
    assert_eq!(expected.len(), FLIGHTS, "the natural key is unique");
    let started = Instant::now();
    let mut span = Duration::ZERO;
    for (i, fp) in FAILPOINTS.iter().enumerate() {
        let mut db = departures_db(&format!("rfp{i}"));
        let job = Job::new("qtp", &format!("rfp{i}"), &per_record_job(&db.url));
        let t = Instant::now();
        crash_at(&job, fp);
        // A crash and a resumed run do one run's work: the span for the random kills.
        span = span.max(t.elapsed());
        check_departures(&mut db, &expected, &format!("after a crash at {fp}"));
        eprintln!("{fp}: exact ({:?})", t.elapsed());
    }
    let db = RefCell::new(None::<Db>);
    kill_rounds(
        RANDOM_KILLS,
        span.as_millis() as u64,
        0x7175_6575,
        |round| {
            let d = departures_db(&format!("rkill{round}"));
            let job = Job::new("qtp", &format!("rkill{round}"), &per_record_job(&d.url));
            *db.borrow_mut() = Some(d);
            job
        },
        |_, round| {
            let mut d = db.borrow_mut().take().unwrap();
            check_departures(&mut d, &expected, &format!("after kills (round {round})"));
        },
    );
    eprintln!("per-record test: {:?}", started.elapsed());
}

/// The example's job file, with the servers of the test and this process's stream.
fn example_job(db_url: &str) -> String {
    let s = servers();
    let file = repo().join("examples/queue-to-postgres/queue-to-postgres.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let mut out = text.clone();
    for (from, to) in [
        ("nats://127.0.0.1:4222", s.nats_url.as_str()),
        ("postgres://nop@127.0.0.1:5432/nop", db_url),
        (
            "streams = [\"FLIGHTS\"]",
            &format!("streams = [\"{}\"]", flights_stream()),
        ),
    ] {
        assert_eq!(
            out.matches(from).count(),
            1,
            "{from} once in {}",
            file.display()
        );
        out = out.replace(from, to);
    }
    out
}

/// A fresh database with the example's table (its `carrier_days.sql`).
fn carrier_days_db(tag: &str) -> Db {
    let mut db = Db::new(tag);
    let ddl = std::fs::read_to_string(repo().join("examples/queue-to-postgres/carrier_days.sql"))
        .unwrap();
    db.client.batch_execute(&ddl).unwrap();
    db
}

/// One row of `carrier_days`: flights, departed, sum and average of `dep_delay`.
type DayFigures = (i64, i64, Option<i64>, Option<f64>);

/// Per carrier and local day (`YYYY-MM-DD` of the CSV's year, month and day), the figures
/// the example's table must hold, computed from the CSV.
fn expected_carrier_days() -> BTreeMap<(String, String), DayFigures> {
    let (cols, rows) = csv_records();
    let c = |n: &str| cols[n];
    let mut acc: BTreeMap<(String, String), (i64, i64, i64)> = BTreeMap::new();
    for r in rows {
        let day = format!(
            "{:04}-{:02}-{:02}",
            r[c("year")].parse::<u32>().unwrap(),
            r[c("month")].parse::<u32>().unwrap(),
            r[c("day")].parse::<u32>().unwrap()
        );
        let e = acc.entry((r[c("carrier")].to_owned(), day)).or_default();
        e.0 += 1;
        if r[c("dep_delay")] != *"NA" {
            e.1 += 1;
            e.2 += r[c("dep_delay")].parse::<i64>().unwrap();
        }
    }
    acc.into_iter()
        .map(|(k, (flights, departed, sum))| {
            let (sum, avg) = if departed == 0 {
                (None, None)
            } else {
                (Some(sum), Some(sum as f64 / departed as f64))
            };
            (k, (flights, departed, sum, avg))
        })
        .collect()
}

/// Checks the example's table against `expected`, and nothing left prepared.
fn check_carrier_days(db: &mut Db, expected: &BTreeMap<(String, String), DayFigures>, what: &str) {
    // day_start is local midnight on New York standard time (UTC-5) all year.
    let rows = db
        .client
        .query(
            "SELECT carrier, to_char((day_start - interval '5 hours') AT TIME ZONE 'UTC', \
             'YYYY-MM-DD HH24:MI:SS'), flights, departed, sum_dep_delay, avg_dep_delay \
             FROM carrier_days",
            &[],
        )
        .unwrap();
    let mut got = BTreeMap::new();
    for r in &rows {
        let start: String = r.get(1);
        let day = start
            .strip_suffix(" 00:00:00")
            .unwrap_or_else(|| panic!("{what}: day_start {start} is not a local midnight"));
        got.insert(
            (r.get::<_, String>(0), day.to_owned()),
            (r.get(2), r.get(3), r.get(4), r.get(5)),
        );
    }
    assert_eq!(got.len(), rows.len());
    if got != *expected {
        let wrong: Vec<_> = expected
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(*v))
            .take(3)
            .map(|(k, v)| format!("{k:?}: expected {v:?}, got {:?}", got.get(k)))
            .collect();
        panic!(
            "{what}: {} rows, {} expected; {} not in the CSV; first differences: {wrong:#?}",
            got.len(),
            expected.len(),
            got.keys().filter(|k| !expected.contains_key(*k)).count()
        );
    }
    assert_eq!(db.prepared(), Vec::<String>::new(), "{what}: left prepared");
}

/// Starts `job` and SIGKILLs it `delay` after a prepared transaction that was not there
/// at the start holds rows of `carrier_days`; false if the run ended first (then it must
/// have succeeded).
fn kill_while_upserts_prepared(job: &Job, db: &mut Db, delay: Duration) -> bool {
    let before = db.prepared_writing_into("carrier_days");
    let mut child = job.command(None).spawn().unwrap();
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", text(&out));
            return false;
        }
        if !db.prepared_writing_into("carrier_days").is_subset(&before) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "no end in 300 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    true
}

#[test]
#[ignore = "needs PostgreSQL and nats-server: .ci/run starts both (scripts/*-test-server.sh)"]
fn queue_to_postgres_example_upserts_exactly_under_failpoints_and_kills() {
    let expected = expected_carrier_days();
    let started = Instant::now();

    // The example as its README runs it, uninterrupted.
    let mut db = carrier_days_db("agg");
    let job = Job::new("qtp", "agg", &example_job(&db.url));
    let t = Instant::now();
    let (ok, out) = job.run(None);
    let took = t.elapsed();
    assert!(ok, "{out}");
    no_secret(&out, "uninterrupted run");
    assert!(no_secret_in_files(&job.dir) > 0, "no manifest, no state?");
    check_carrier_days(&mut db, &expected, "uninterrupted");
    eprintln!("uninterrupted: {} carrier-days ({took:?})", expected.len());
    drop(db);

    for (i, fp) in FAILPOINTS.iter().enumerate() {
        let mut db = carrier_days_db(&format!("afp{i}"));
        let job = Job::new("qtp", &format!("afp{i}"), &example_job(&db.url));
        crash_at(&job, fp);
        check_carrier_days(&mut db, &expected, &format!("after a crash at {fp}"));
        eprintln!("{fp}: exact");
    }

    // The aggregates all leave in the last epoch: SIGKILL while they are prepared, at
    // once and a little later (into the commit), twice in a row.
    for (i, delays) in [[0, 0], [20, 60], [5, 150]].iter().enumerate() {
        let mut db = carrier_days_db(&format!("aprep{i}"));
        let job = Job::new("qtp", &format!("aprep{i}"), &example_job(&db.url));
        let mut kills = 0;
        for ms in delays {
            if kill_while_upserts_prepared(&job, &mut db, Duration::from_millis(*ms)) {
                kills += 1;
            }
        }
        assert!(kills >= 1, "no kill landed while the upserts were prepared");
        let out = job.finish();
        no_secret(&out, "kill while prepared");
        check_carrier_days(
            &mut db,
            &expected,
            &format!("after {kills} kills while prepared ({delays:?} ms)"),
        );
        eprintln!("{kills} kills while the upserts were prepared ({delays:?} ms): exact");
    }

    let db = RefCell::new(None::<Db>);
    kill_rounds(
        RANDOM_KILLS,
        took.as_millis() as u64,
        0x7570_7365,
        |round| {
            let d = carrier_days_db(&format!("akill{round}"));
            let job = Job::new("qtp", &format!("akill{round}"), &example_job(&d.url));
            *db.borrow_mut() = Some(d);
            job
        },
        |_, round| {
            let mut d = db.borrow_mut().take().unwrap();
            check_carrier_days(&mut d, &expected, &format!("after kills (round {round})"));
        },
    );
    eprintln!("aggregate test: {:?}", started.elapsed());
}
