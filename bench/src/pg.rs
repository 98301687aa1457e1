//! Postgres workloads (design §20): the flights per-record rows (336,776, eight
//! columns, primary key = natural key) written
//!
//! - `pg-sink`: by nop-stream, file-source -> flights-mapper -> postgres-sink `insert`,
//!   two-phase commit, 1 s checkpoints, parallelism 1;
//! - `floor-insert`: by this process, multi-row `INSERT`s of 500 rows with bind
//!   parameters in one transaction (the sink's own statement shape), `postgres` crate;
//! - `floor-copy`: by this process, one `COPY ... FROM STDIN` (text format);
//! - `jetstream-pg`: by nop-stream, jetstream-source -> flights-mapper -> postgres-sink,
//!   1 s checkpoints, parallelism 1, from a stream `nopstream nats publish` filled once.
//!
//! Throughput is rows ÷ seconds: for nop-stream the job's own wall time (`--json`,
//! plugin loading included, process start-up not), for the floors the time from the first
//! statement to the commit. Commit latency per epoch is measured inside the sink, which
//! logs at debug level how long each `pre-commit` (the epoch's buffered rows, the marker,
//! `PREPARE TRANSACTION`) and `commit` (`COMMIT PREPARED`) took (`RUST_LOG=plugin=debug`):
//! p50 and p99 of pre-commit + commit per epoch, over every epoch of every measured run.
//! The engine's epoch log gives `created -> durable` (barrier, pre-commit, manifest) for
//! comparison; its `committed` record is written lazily, at the next epoch, so it is not
//! used.
//!
//! Needs `NOP_TEST_PG_URL` and `PGPASSWORD` (`eval "$(scripts/pg-test-server.sh start)"`);
//! without them every Postgres workload is skipped with a message. `jetstream-pg` also
//! needs `NOP_TEST_NATS_URL` and `NOP_TEST_NATS_TOKEN` (`scripts/nats-test-server.sh`).
//! Works in a database of its own, `nop_bench_<pid>`, dropped at the end.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::{JobReport, measure};

const ROWS: i64 = 336_776;
const DDL: &str = "CREATE TABLE departures (year int NOT NULL, month int NOT NULL, \
    day int NOT NULL, carrier text NOT NULL, flight int NOT NULL, origin text NOT NULL, \
    sched_dep_time int NOT NULL, dep_delay int, \
    PRIMARY KEY (year, month, day, carrier, flight, origin, sched_dep_time))";
const COLUMNS: &str = "year, month, day, carrier, flight, origin, sched_dep_time, dep_delay";

/// One flights row as the table holds it.
struct Row {
    year: i32,
    month: i32,
    day: i32,
    carrier: String,
    flight: i32,
    origin: String,
    sched: i32,
    delay: Option<i32>,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_rows(csv: &Path) -> Result<Vec<Row>> {
    let text = std::fs::read_to_string(csv).with_context(|| format!("read {}", csv.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().context("empty CSV")?.split(',').collect();
    let col = |n: &str| header.iter().position(|h| *h == n).context(n.to_owned());
    let c = [
        col("year")?,
        col("month")?,
        col("day")?,
        col("carrier")?,
        col("flight")?,
        col("origin")?,
        col("sched_dep_time")?,
        col("dep_delay")?,
    ];
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let int = |i: usize| -> Result<i32> { Ok(f[c[i]].parse()?) };
            Ok(Row {
                year: int(0)?,
                month: int(1)?,
                day: int(2)?,
                carrier: f[c[3]].to_owned(),
                flight: int(4)?,
                origin: f[c[5]].to_owned(),
                sched: int(6)?,
                delay: f[c[7]].parse().ok(),
            })
        })
        .collect()
}

fn connect(url: &str, password: &str) -> Result<postgres::Client> {
    let mut c: postgres::Config = url.parse().context("NOP_TEST_PG_URL")?;
    c.password(password);
    // The error names neither the URL's password (there is none) nor PGPASSWORD.
    c.connect(postgres::NoTls)
        .map_err(|e| anyhow::anyhow!("cannot connect to the bench server: {e}"))
}

/// p50 and p99 (nearest rank) of `v`, or zeros.
pub(crate) fn percentiles(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (rank(0.50), rank(0.99))
}

/// Per-epoch `pre-commit + commit` in ms, from the sink's debug lines
/// `postgres-sink: epoch <n> <step> took <us> us` (epochs with both steps only).
fn sink_latencies(stderr: &str) -> Vec<f64> {
    let mut steps: std::collections::BTreeMap<(u64, bool), f64> = Default::default();
    for line in stderr.lines() {
        let Some(rest) = line.split("postgres-sink: epoch ").nth(1) else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(epoch), Some(step), Some("took"), Some(us)) =
            (w.next(), w.next(), w.next(), w.next())
        else {
            continue;
        };
        let (Ok(epoch), Ok(us)) = (epoch.parse::<u64>(), us.parse::<f64>()) else {
            continue;
        };
        *steps.entry((epoch, step == "commit")).or_default() += us / 1e3;
    }
    steps
        .iter()
        .filter(|((_, commit), _)| !commit)
        .filter_map(|((e, _), pre)| Some(pre + steps.get(&(*e, true))?))
        .collect()
}

/// `created -> durable` in ms for every durable epoch in `work/checkpoints/*/epochs.log`.
fn durable_latencies(work: &Path) -> Result<Vec<f64>> {
    #[derive(serde::Deserialize)]
    struct Rec {
        epoch: u64,
        state: String,
        attempt: u32,
        at_ms: u64,
    }
    let mut out = Vec::new();
    for ns in std::fs::read_dir(work.join("checkpoints"))? {
        let log = ns?.path().join("epochs.log");
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        let recs: Vec<Rec> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        for r in recs.iter().filter(|r| r.state == "durable") {
            if let Some(c) = recs
                .iter()
                .find(|c| c.epoch == r.epoch && c.attempt == r.attempt && c.state == "created")
            {
                out.push(r.at_ms as f64 - c.at_ms as f64);
            }
        }
    }
    Ok(out)
}

/// p50 and p99 in ms.
type P50P99 = (f64, f64);

struct Measured {
    name: &'static str,
    secs: Vec<f64>,
    /// (sink pre-commit + commit, epoch created -> durable, epochs timed).
    latency: Option<(P50P99, P50P99, usize)>,
}

fn sink_job(pg_url: &str, source: &str, connections: &str) -> String {
    format!(
        r#"
[job]
name = "bench-pg"
parallelism = 1
semantic = "strict-exactly-once"
checkpoint_interval_ms = 1000
{connections}
[connections.pg]
kind = "postgres"
url = "{pg_url}"
password_env = "PGPASSWORD"
{source}
[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier", fields = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"] }}

[[sink]]
name = "departures"
plugin = "postgres-sink@0.1.0"
inputs = ["parse"]
connections = ["pg"]
config = {{ connection = "pg", table = "departures", mode = "insert", columns = [
    {{ name = "year" }}, {{ name = "month" }}, {{ name = "day" }}, {{ name = "carrier" }},
    {{ name = "flight" }}, {{ name = "origin" }}, {{ name = "sched_dep_time" }},
    {{ name = "dep_delay" }},
] }}
"#
    )
}

const FILE_SOURCE: &str = r#"
[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", format = "csv", header = true }
"#;

/// Runs the Postgres workloads `runs` times each (after one unmeasured warm-up of the
/// sink job) and prints a table; `nopstream` is the release binary.
///
/// # Errors
/// A server that refuses the connection, a job that fails, or a table that does not hold
/// exactly the 336,776 rows after a run.
pub fn run(nopstream: &Path, runs: usize, out: &Path) -> Result<()> {
    let (Ok(url), Ok(password)) = (
        std::env::var("NOP_TEST_PG_URL"),
        std::env::var("PGPASSWORD"),
    ) else {
        println!(
            "postgres workloads skipped: NOP_TEST_PG_URL and PGPASSWORD are not set \
             (start a server with `eval \"$(scripts/pg-test-server.sh start)\"`)"
        );
        return Ok(());
    };
    let db_name = format!("nop_bench_{}", std::process::id());
    let mut admin = connect(&url, &password)?;
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))?;
    admin.batch_execute(&format!("CREATE DATABASE {db_name}"))?;
    let base = url
        .rsplit_once('/')
        .context("NOP_TEST_PG_URL without a database")?
        .0;
    let db_url = format!("{base}/{db_name}");
    let result = (|| -> Result<Vec<Measured>> {
        let mut db = connect(&db_url, &password)?;
        db.batch_execute(DDL)?;
        let flights_dir = repo().join("examples/flights");
        std::fs::create_dir_all(out)?;
        let out = crate::absolute(out)?;
        let job_file = flights_dir.join(format!(".bench-pg-{}.toml", std::process::id()));
        let reset = |db: &mut postgres::Client| -> Result<()> {
            db.batch_execute("TRUNCATE departures")?;
            // A fresh run of the same job restarts its epochs at 1: forget the markers.
            db.batch_execute(
                "CREATE TABLE IF NOT EXISTS nop_sink_epochs (sink text NOT NULL, \
                 subtask integer NOT NULL, epoch bigint NOT NULL, gid text NOT NULL, \
                 written_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, subtask, epoch)); \
                 TRUNCATE nop_sink_epochs",
            )?;
            Ok(())
        };
        let run_job =
            |db: &mut postgres::Client, text: &str| -> Result<(f64, Vec<f64>, Vec<f64>)> {
                reset(db)?;
                std::fs::write(&job_file, text)?;
                let work = out.join("pg-work");
                if work.exists() {
                    std::fs::remove_dir_all(&work)?;
                }
                let mut cmd = Command::new(nopstream);
                cmd.env("RUST_LOG", "warn,plugin=debug")
                    .arg("run")
                    .arg(&job_file)
                    .args(["--json", "--no-progress", "--no-echo"])
                    .arg("--output")
                    .arg(out.join("pg-output"))
                    .arg("--work-dir")
                    .arg(&work);
                let child = measure::run(cmd);
                let _ = std::fs::remove_file(&job_file);
                let child = child?;
                let report: JobReport = serde_json::from_str(&child.stdout)
                    .with_context(|| format!("nopstream --json printed {:?}", child.stdout))?;
                let n: i64 = db.query_one("SELECT count(*) FROM departures", &[])?.get(0);
                ensure!(
                    n == ROWS,
                    "the table holds {n} rows after the job, not {ROWS}"
                );
                let total = sink_latencies(&child.stderr);
                let commit = durable_latencies(&work)?;
                let secs = report.wall.secs as f64 + f64::from(report.wall.nanos) / 1e9;
                Ok((secs, total, commit))
            };

        let mut results = Vec::new();
        // (a) the sink alone (the warm-up also unpacks the CSV and fills the compile cache).
        let text = sink_job(&db_url, FILE_SOURCE, "");
        run_job(&mut db, &text)?;
        let rows = read_rows(&flights_dir.join("data/flights.csv"))?;
        ensure!(rows.len() as i64 == ROWS, "{} rows in the CSV", rows.len());
        let mut m = Measured {
            name: "pg-sink (2PC, 1 s ckpt)",
            secs: Vec::new(),
            latency: None,
        };
        let (mut lt, mut lc) = (Vec::new(), Vec::new());
        for i in 0..runs {
            let (s, t, c) = run_job(&mut db, &text)?;
            eprintln!(
                "   pg-sink run {}: {s:.3} s, {} epochs timed",
                i + 1,
                t.len()
            );
            m.secs.push(s);
            lt.extend(t);
            lc.extend(c);
        }
        let n = lt.len();
        m.latency = Some((percentiles(&mut lt), percentiles(&mut lc), n));
        results.push(m);

        // (b) the floors.
        let mut ins = Measured {
            name: "floor: multi-row INSERT",
            secs: Vec::new(),
            latency: None,
        };
        let mut copy = Measured {
            name: "floor: COPY",
            secs: Vec::new(),
            latency: None,
        };
        for i in 0..runs {
            reset(&mut db)?;
            let t = Instant::now();
            let mut tx = db.transaction()?;
            for chunk in rows.chunks(500) {
                let mut sql = format!("INSERT INTO departures ({COLUMNS}) VALUES ");
                let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = Vec::new();
                for (k, r) in chunk.iter().enumerate() {
                    if k > 0 {
                        sql.push_str(", ");
                    }
                    let b = k * 8;
                    sql.push_str(&format!(
                        "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                        b + 1,
                        b + 2,
                        b + 3,
                        b + 4,
                        b + 5,
                        b + 6,
                        b + 7,
                        b + 8
                    ));
                    params.extend([
                        &r.year as &(dyn postgres::types::ToSql + Sync),
                        &r.month,
                        &r.day,
                        &r.carrier,
                        &r.flight,
                        &r.origin,
                        &r.sched,
                        &r.delay,
                    ]);
                }
                tx.execute(sql.as_str(), &params)?;
            }
            tx.commit()?;
            let s = t.elapsed().as_secs_f64();
            let n: i64 = db.query_one("SELECT count(*) FROM departures", &[])?.get(0);
            ensure!(n == ROWS, "INSERT floor wrote {n} rows");
            ins.secs.push(s);

            reset(&mut db)?;
            let t = Instant::now();
            let mut w = db.copy_in(&format!("COPY departures ({COLUMNS}) FROM STDIN"))?;
            let mut buf = String::with_capacity(64 * 1024);
            for r in &rows {
                use std::fmt::Write as _;
                let delay = r.delay.map_or_else(|| "\\N".to_owned(), |d| d.to_string());
                writeln!(
                    buf,
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{delay}",
                    r.year, r.month, r.day, r.carrier, r.flight, r.origin, r.sched
                )?;
                if buf.len() > 60 * 1024 {
                    std::io::Write::write_all(&mut w, buf.as_bytes())?;
                    buf.clear();
                }
            }
            std::io::Write::write_all(&mut w, buf.as_bytes())?;
            w.finish()?;
            let c = t.elapsed().as_secs_f64();
            let n: i64 = db.query_one("SELECT count(*) FROM departures", &[])?.get(0);
            ensure!(n == ROWS, "COPY floor wrote {n} rows");
            copy.secs.push(c);
            eprintln!("   floor run {}: INSERT {s:.3} s, COPY {c:.3} s", i + 1);
        }
        results.push(ins);
        results.push(copy);

        // (c) JetStream -> Postgres.
        match (
            std::env::var("NOP_TEST_NATS_URL"),
            std::env::var("NOP_TEST_NATS_TOKEN"),
        ) {
            (Ok(nats), Ok(_)) => {
                let stream = format!("BENCH{}", std::process::id());
                let o = Command::new(nopstream)
                    .args(["nats", "publish", "--url", &nats])
                    .args(["--password-env", "NOP_TEST_NATS_TOKEN"])
                    .args([
                        "--stream",
                        &stream,
                        "--subject",
                        &format!("{stream}.flights"),
                    ])
                    .arg(flights_dir.join("data/flights.csv.zip"))
                    .args(["--member", "flights.csv"])
                    .output()?;
                if !o.status.success() {
                    bail!(
                        "nopstream nats publish failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
                let source = format!(
                    r#"
[[source]]
name = "flights"
plugin = "jetstream-source@0.1.0"
connections = ["q"]
config = {{ connection = "q", streams = ["{stream}"], max_wait_ms = 50 }}
"#
                );
                let conn = format!(
                    "\n[connections.q]\nkind = \"nats\"\nurl = \"{nats}\"\npassword_env = \"NOP_TEST_NATS_TOKEN\"\n"
                );
                let text = sink_job(&db_url, &source, &conn);
                run_job(&mut db, &text)?;
                let mut m = Measured {
                    name: "jetstream-pg (2PC, 1 s ckpt)",
                    secs: Vec::new(),
                    latency: None,
                };
                let (mut lt, mut lc) = (Vec::new(), Vec::new());
                for i in 0..runs {
                    let (s, t, c) = run_job(&mut db, &text)?;
                    eprintln!("   jetstream-pg run {}: {s:.3} s", i + 1);
                    m.secs.push(s);
                    lt.extend(t);
                    lc.extend(c);
                }
                let n = lt.len();
                m.latency = Some((percentiles(&mut lt), percentiles(&mut lc), n));
                results.push(m);
            }
            _ => println!(
                "jetstream-pg skipped: NOP_TEST_NATS_URL and NOP_TEST_NATS_TOKEN are not set \
                 (start a server with `eval \"$(scripts/nats-test-server.sh start)\"`)"
            ),
        }
        Ok(results)
    })();
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"));
    let results = result?;
    print_table(&results);
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }
}

fn print_table(results: &[Measured]) {
    let rate = |m: &Measured| ROWS as f64 / median(&m.secs);
    let floor = |name: &str| results.iter().find(|m| m.name == name).map(rate);
    let (ins, copy) = (floor("floor: multi-row INSERT"), floor("floor: COPY"));
    println!(
        "\n| workload | runs | rows/s median [min – max] | sink pre-commit + commit per epoch, p50 / p99 ms | epoch created→durable p50 / p99 ms | ÷ INSERT floor | ÷ COPY floor |"
    );
    println!("|---|---|---|---|---|---|---|");
    for m in results {
        let lo = ROWS as f64 / m.secs.iter().cloned().fold(f64::MIN, f64::max);
        let hi = ROWS as f64 / m.secs.iter().cloned().fold(f64::MAX, f64::min);
        let lat = |i: usize| match m.latency {
            Some((t, c, n)) => {
                let (a, b) = if i == 0 { t } else { c };
                format!("{a:.0} / {b:.0} ({n} epochs)")
            }
            None => String::new(),
        };
        let ratio = |f: Option<f64>| f.map_or(String::new(), |f| format!("{:.2}", rate(m) / f));
        println!(
            "| {} | {} | {:.1} K [{:.1} K – {:.1} K] | {} | {} | {} | {} |",
            m.name,
            m.secs.len(),
            rate(m) / 1e3,
            lo / 1e3,
            hi / 1e3,
            lat(0),
            lat(1),
            ratio(ins),
            ratio(copy)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_timings_pair_pre_commit_and_commit() {
        let err = "DEBUG plugin: postgres-sink: epoch 1 pre-commit took 1500 us plugin=x\n\
                   DEBUG plugin: postgres-sink: epoch 1 commit took 500 us\n\
                   DEBUG plugin: postgres-sink: epoch 2 pre-commit took 900 us\n";
        assert_eq!(sink_latencies(err), vec![2.0]);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentiles(&mut v), (50.0, 99.0));
        assert_eq!(percentiles(&mut [7.0]), (7.0, 7.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0));
    }
}
