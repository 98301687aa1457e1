//! Event time, windows and CEP end to end (design §9) through the real `nopstream` binary:
//! the flights examples checked against independent computations over the CSV, run three
//! ways (straight; parallelism 2 with checkpoints; restored from a mid-run epoch at
//! parallelism 3 with an explicit rescale) with identical output, killed at random
//! moments with identical committed output, and late data routed to a side output.

mod common;

use common::kit::{repo, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One flight as the independent computations see it.
struct Flight {
    /// Scheduled departure in ms since the Unix epoch: `time_hour` + `minute` minutes.
    ts: i64,
    origin: String,
    tailnum: String,
    carrier: String,
    flight: i64,
    dep_delay: Option<i64>,
}

/// Every flight of the zipped CSV, in file order, parsed with the `csv` crate and a
/// date computation independent of the file source's.
fn flights() -> Vec<Flight> {
    let file = std::fs::File::open(repo().join("examples/flights/data/flights.csv.zip")).unwrap();
    let mut zip = zip::ZipArchive::new(file).unwrap();
    let mut rdr = csv::Reader::from_reader(zip.by_name("flights.csv").unwrap());
    let h = rdr.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|x| x == n).unwrap();
    let (th, mi, or, tn, ca, fl, dd) = (
        col("time_hour"),
        col("minute"),
        col("origin"),
        col("tailnum"),
        col("carrier"),
        col("flight"),
        col("dep_delay"),
    );
    rdr.records()
        .map(|r| {
            let r = r.unwrap();
            // "2013-01-01T10:00:00Z"
            let s = &r[th];
            let (y, m, d): (i64, i64, i64) = (
                s[0..4].parse().unwrap(),
                s[5..7].parse().unwrap(),
                s[8..10].parse().unwrap(),
            );
            let hour: i64 = s[11..13].parse().unwrap();
            let days = days_from_civil(y, m, d);
            let minute: i64 = r[mi].parse().unwrap();
            Flight {
                ts: ((days * 24 + hour) * 60 + minute) * 60_000,
                origin: r[or].to_owned(),
                tailnum: r[tn].to_owned(),
                carrier: r[ca].to_owned(),
                flight: r[fl].parse().unwrap(),
                dep_delay: match &r[dd] {
                    "NA" => None,
                    x => Some(x.parse().unwrap()),
                },
            }
        })
        .collect()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const HOUR: i64 = 3_600_000;

/// (origin, window start) -> (flights, sum of delays, delays counted).
type Hourly = BTreeMap<(String, i64), (u64, i64, u64)>;

fn hourly<'a>(flights: impl Iterator<Item = &'a Flight>) -> Hourly {
    let mut out = Hourly::new();
    for f in flights {
        let e = out
            .entry((f.origin.clone(), f.ts.div_euclid(HOUR) * HOUR))
            .or_default();
        e.0 += 1;
        if let Some(d) = f.dep_delay {
            e.1 += d;
            e.2 += 1;
        }
    }
    out
}

/// Checks the window lines against the independent hourly figures.
fn check_hourly(lines: &[String], expected: &Hourly) {
    assert_eq!(lines.len(), expected.len(), "one line per origin and hour");
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let key = (
            v["key"].as_str().unwrap().to_owned(),
            v["window_start"].as_i64().unwrap(),
        );
        let (n, sum, cnt) = expected
            .get(&key)
            .unwrap_or_else(|| panic!("unexpected window {l}"));
        assert_eq!(v["window_end"].as_i64(), Some(key.1 + HOUR), "{l}");
        assert_eq!(v["flights"].as_u64(), Some(*n), "{l}");
        if *cnt == 0 {
            assert!(v["avg_dep_delay_min"].is_null(), "{l}");
        } else {
            assert_eq!(
                v["avg_dep_delay_min"].as_f64(),
                Some(*sum as f64 / *cnt as f64),
                "{l}"
            );
        }
    }
}

/// The delay-cascade alerts by an independent scan: per aircraft, departures in time
/// order (file order for equal times, which the sorted input and the operator keep),
/// every run of three consecutive ones each delayed more than 60 minutes with the third
/// scheduled less than 24 h after the first; after an alert the scan continues past its
/// last departure (skip past last event). Cancelled flights (no delay) break a run.
/// Returns (tailnum, first ts, last ts) of each alert.
fn cascades(flights: &[Flight]) -> Vec<(String, i64, i64)> {
    let mut by_tail: BTreeMap<&str, Vec<&Flight>> = BTreeMap::new();
    for f in flights
        .iter()
        .filter(|f| f.tailnum != "NA" && !f.tailnum.is_empty())
    {
        by_tail.entry(&f.tailnum).or_default().push(f);
    }
    let mut out = Vec::new();
    for (tail, mut fs) in by_tail {
        fs.sort_by_key(|f| f.ts); // stable: file order for ties
        let delayed = |f: &Flight| f.dep_delay.is_some_and(|d| d > 60);
        let mut i = 0;
        while i + 2 < fs.len() {
            if delayed(fs[i])
                && delayed(fs[i + 1])
                && delayed(fs[i + 2])
                && fs[i + 2].ts - fs[i].ts < 24 * HOUR
            {
                out.push((tail.to_owned(), fs[i].ts, fs[i + 2].ts));
                i += 3;
            } else {
                i += 1;
            }
        }
    }
    out.sort();
    out
}

fn check_cascades(lines: &[String], flights: &[Flight], expected: &[(String, i64, i64)]) {
    let mut got: Vec<(String, i64, i64)> = lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let fs = v["flights"].as_array().unwrap();
            assert_eq!(fs.len(), 3, "{l}");
            for f in fs {
                assert!(f["dep_delay"].as_i64().unwrap() > 60, "{l}");
                // Each alerted departure exists in the data with those figures.
                let ts = f["ts"].as_i64().unwrap();
                assert!(
                    flights.iter().any(|x| x.ts == ts
                        && x.tailnum == v["tailnum"].as_str().unwrap()
                        && Some(x.carrier.as_str()) == f["carrier"].as_str()
                        && Some(x.flight) == f["flight"].as_i64()),
                    "{l}"
                );
            }
            (
                v["tailnum"].as_str().unwrap().to_owned(),
                v["first_ts"].as_i64().unwrap(),
                v["last_ts"].as_i64().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(got.len(), expected.len(), "alert count");
    assert_eq!(got, expected);
}

/// A job run in its own directories.
struct Run {
    _tmp: tempfile::TempDir,
    out: PathBuf,
    work: PathBuf,
}

impl Run {
    fn new() -> Run {
        let tmp = tempfile::tempdir().unwrap();
        Run {
            out: tmp.path().join("out"),
            work: tmp.path().join("work"),
            _tmp: tmp,
        }
    }

    fn command(&self, job: &Path, args: &[&str], failpoints: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
        c.args(["run", "--no-progress", "--no-echo", "--output"])
            .arg(&self.out)
            .arg("--work-dir")
            .arg(&self.work)
            .args(args)
            .arg(job)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoints {
            Some(f) => c.env("NOPSTREAM_FAILPOINTS", f),
            None => c.env_remove("NOPSTREAM_FAILPOINTS"),
        };
        c
    }

    fn run(&self, job: &Path, args: &[&str], failpoints: Option<&str>) -> Output {
        self.command(job, args, failpoints).output().unwrap()
    }

    fn run_ok(&self, job: &Path, args: &[&str]) -> String {
        let o = self.run(job, args, None);
        let text = text(&o);
        assert!(o.status.success(), "nopstream run {args:?} failed:\n{text}");
        text
    }

    /// Committed lines of the output files starting with `prefix`, sorted.
    fn committed(&self, prefix: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.out) else {
            return lines;
        };
        for e in dir {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with(prefix) && name.ends_with(".jsonl") {
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
}

fn example(name: &str) -> PathBuf {
    repo().join("examples/flights").join(name)
}

/// A job file in a temporary directory of its own (relative paths made absolute against
/// the flights example), removed when dropped.
struct TempJob(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl TempJob {
    fn new(tag: &str, text: &str) -> TempJob {
        let tmp = tempfile::tempdir().unwrap();
        let path =
            common::kit::job_in(tmp.path(), &format!("{tag}.toml"), "examples/flights", text);
        TempJob(path, tmp)
    }
}

/// Runs an example three ways and returns the (identical) committed output:
/// 1. straight, parallelism 1, no checkpoints;
/// 2. parallelism 2 with an epoch every 50 ms;
/// 3. parallelism 2 with an epoch every 50 ms, killed right after the second manifest is
///    published (a mid-run epoch), then restored explicitly at parallelism 3 with
///    `--rescale` (keyed state, timers and watermarks move with their shards).
fn three_ways(job: &Path, prefix: &str) -> Vec<String> {
    let straight = Run::new();
    straight.run_ok(job, &["-p", "1"]);
    let straight = straight.committed(prefix);

    let p2 = Run::new();
    let report = p2.run_ok(job, &["-p", "2", "--checkpoint-interval-ms", "50"]);
    assert!(report.contains("durable"), "{report}");
    assert_eq!(
        p2.committed(prefix),
        straight,
        "parallelism 2 with checkpoints"
    );

    let rescaled = Run::new();
    let crash = rescaled.run(
        job,
        &["-p", "2", "--checkpoint-interval-ms", "50"],
        Some("after-manifest-publish=2"),
    );
    assert!(!crash.status.success(), "the failpoint fired");
    let partial = rescaled.committed(prefix).len();
    assert!(
        partial < straight.len(),
        "the crash came mid-run ({partial} of {} lines committed)",
        straight.len()
    );
    // Automatic recovery keeps refusing a changed plan (design §10.4)...
    let refused = rescaled.run(job, &["-p", "3", "--checkpoint-interval-ms", "50"], None);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("--rescale"), "{}", text(&refused));
    // ...and the explicit rescale action restores epoch 2 at parallelism 3.
    let log = rescaled.run_ok(
        job,
        &["-p", "3", "--checkpoint-interval-ms", "50", "--rescale"],
    );
    assert!(log.contains("rescale: restoring epoch 2"), "{log}");
    assert_eq!(
        rescaled.committed(prefix),
        straight,
        "restored from epoch 2 at parallelism 3"
    );
    straight
}

#[test]
fn hourly_delay_windows_match_the_csv_three_ways() {
    let flights = flights();
    assert_eq!(flights.len(), 336_776);
    let expected = hourly(flights.iter());
    let lines = three_ways(&example("hourly-delay.toml"), "hours");
    check_hourly(&lines, &expected);
    let counted: u64 = expected.values().map(|e| e.0).sum();
    assert_eq!(counted, 336_776, "every flight lands in a window");
}

#[test]
fn delay_cascade_alerts_match_the_csv_three_ways() {
    let flights = flights();
    let expected = cascades(&flights);
    assert!(expected.len() > 100, "the data has cascades");
    let lines = three_ways(&example("delay-cascade.toml"), "alerts");
    check_cascades(&lines, &flights, &expected);
}

/// SIGKILLs a run at random moments (restarting it each time) until `kills` kills landed
/// mid-run, then lets it finish; the committed output must equal `expected`.
fn random_kills(job: &Path, prefix: &str, expected: &[String], kills: usize, seed: u64) {
    let args = ["-p", "2", "--checkpoint-interval-ms", "50"];
    // Kill moments spread over one warm uninterrupted run.
    let warm = Run::new();
    let t = Instant::now();
    warm.run_ok(job, &args);
    let mut span = (t.elapsed().as_millis() as u64).max(100);
    let mut x = seed;
    let mut landed = 0;
    let mut rounds = 0;
    while landed < kills {
        rounds += 1;
        assert!(rounds <= 40, "kills keep missing ({landed}/{kills})");
        let run = Run::new();
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = Duration::from_millis(20 + (x >> 33) % span);
            let mut child = run.command(job, &args, None).spawn().unwrap();
            let started = Instant::now();
            let mut ended = false;
            while started.elapsed() < at {
                if child.try_wait().unwrap().is_some() {
                    ended = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if ended {
                if first {
                    span = (span * 2 / 3).max(60);
                }
                break;
            }
            child.kill().unwrap();
            child.wait().unwrap();
            first = false;
            landed += 1;
            if landed == kills {
                break;
            }
        }
        for _ in 0..5 {
            if run.run(job, &args, None).status.success() {
                break;
            }
        }
        assert_eq!(
            run.committed(prefix),
            expected,
            "output after random kills (round {rounds})"
        );
    }
}

#[test]
fn hourly_windows_and_cascades_survive_random_kills() {
    let flights = flights();
    let hourly_job = example("hourly-delay.toml");
    let reference = Run::new();
    reference.run_ok(&hourly_job, &["-p", "2"]);
    let expected = reference.committed("hours");
    check_hourly(&expected, &hourly(flights.iter()));
    random_kills(&hourly_job, "hours", &expected, 8, 7);

    let cep_job = example("delay-cascade.toml");
    let reference = Run::new();
    reference.run_ok(&cep_job, &["-p", "2"]);
    let expected = reference.committed("alerts");
    check_cascades(&expected, &flights, &cascades(&flights));
    random_kills(&cep_job, "alerts", &expected, 8, 11);
}

/// The raw, unsorted file with a one-hour out-of-orderness bound: months arrive out of
/// order, so many flights are late. Late flights go to the window's `late` side output,
/// read by a second sink; every flight is either in exactly one window or late, and the
/// windows hold exactly the flights that were not late.
#[test]
fn late_flights_go_to_the_side_output_and_nothing_else_is_lost() {
    let job_file = TempJob::new(
        "late",
        r#"
[job]
name = "flights-late"
parallelism = 1

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", format = "csv", header = true, event_time = { column = "time_hour", format = "rfc3339", add_minutes_column = "minute" } }
watermarks = { max_out_of_orderness_ms = 3600000 }

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = { key = "origin", fields = ["origin", "dep_delay", "time_hour", "minute"] }

[[operator]]
name = "hourly"
plugin = "window-aggregate@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]
config = { window = { kind = "tumbling", size_ms = 3600000 }, aggregates = [
    { name = "flights", fn = "count" },
    { name = "avg_dep_delay_min", fn = "avg", field = "dep_delay" },
] }

[[sink]]
name = "hours"
plugin = "jsonl-sink@0.1.0"
inputs = ["hourly"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "hours" }

[[sink]]
name = "late"
plugin = "jsonl-sink@0.1.0"
inputs = [{ from = "hourly", output = "late" }]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "late" }
"#,
    );
    let job = job_file.0.clone();
    let run = Run::new();
    run.run_ok(&job, &["--checkpoint-interval-ms", "100"]);
    let windows = run.committed("hours");
    let late = run.committed("late");
    assert!(
        late.len() > 10_000,
        "months out of order make many flights late: {}",
        late.len()
    );
    // Expected windows: all flights minus the late ones (as a multiset).
    let flights = flights();
    let mut all = hourly(flights.iter());
    for l in &late {
        let v: Value = serde_json::from_str(l).unwrap();
        let s = v["time_hour"].as_str().unwrap();
        let days = days_from_civil(
            s[0..4].parse().unwrap(),
            s[5..7].parse().unwrap(),
            s[8..10].parse().unwrap(),
        );
        let start = (days * 24 + s[11..13].parse::<i64>().unwrap()) * HOUR;
        let key = (v["origin"].as_str().unwrap().to_owned(), start);
        let e = all.get_mut(&key).expect("a late flight exists in the data");
        e.0 -= 1;
        if let Some(d) = v["dep_delay"].as_i64() {
            e.1 -= d;
            e.2 -= 1;
        }
    }
    all.retain(|_, e| e.0 > 0);
    check_hourly(&windows, &all);
    let counted: u64 = all.values().map(|e| e.0).sum();
    assert_eq!(counted + late.len() as u64, 336_776);

    // A job reading a side output the operator does not declare is refused at plan time.
    let bad = std::fs::read_to_string(&job)
        .unwrap()
        .replace(r#"output = "late""#, r#"output = "tardy""#);
    std::fs::write(&job, bad).unwrap();
    let o = Run::new().run(&job, &[], None);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("no side output `tardy`") && text(&o).contains("late"),
        "{}",
        text(&o)
    );
}

/// Processing-time windows (wall clock, 200 ms): which flights share a window depends on
/// timing, but every flight is counted exactly once, also when the run crashes after an
/// epoch and resumes: the restored processing-time timers are overdue by then and fire
/// once (design §8.4), and at the end of the bounded input the pending ones fire too.
#[test]
fn processing_time_windows_count_every_flight_once_across_a_crash() {
    let job_file = TempJob::new(
        "proctime",
        r#"
[job]
name = "flights-proctime"
parallelism = 2

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", format = "csv", header = true }

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = { key = "carrier", fields = ["carrier"] }

[[operator]]
name = "windows"
plugin = "window-aggregate@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]
config = { window = { kind = "tumbling", size_ms = 200, time = "processing" }, aggregates = [
    { name = "flights", fn = "count" },
] }

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["windows"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "windows" }
"#,
    );
    let job = job_file.0.clone();
    let total = |lines: &[String]| -> u64 {
        lines
            .iter()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["flights"]
                    .as_u64()
                    .unwrap()
            })
            .sum()
    };
    let straight = Run::new();
    straight.run_ok(&job, &[]);
    assert_eq!(total(&straight.committed("windows")), 336_776);

    let crashed = Run::new();
    let args = ["--checkpoint-interval-ms", "50"];
    let o = crashed.run(&job, &args, Some("after-manifest-publish=3"));
    assert!(!o.status.success(), "{}", text(&o));
    crashed.run_ok(&job, &args);
    assert_eq!(total(&crashed.committed("windows")), 336_776);
}

/// Sliding event-time windows (2 h every 30 min, per origin, over the time-sorted file)
/// restored at every epoch: for each epoch N of a checkpointed run, a run killed right
/// after manifest N and resumed commits exactly what the uninterrupted run commits.
#[test]
fn sliding_windows_restored_at_every_epoch_emit_what_an_uninterrupted_run_emits() {
    let hourly = std::fs::read_to_string(example("hourly-delay.toml")).unwrap();
    let sliding = hourly
        .replace(
            r#"name = "flights-hourly-delay""#,
            r#"name = "flights-sliding-delay""#,
        )
        .replace(
            r#"window = { kind = "tumbling", size_ms = 3600000, time = "event" }"#,
            r#"window = { kind = "sliding", size_ms = 7200000, slide_ms = 1800000 }"#,
        );
    assert_ne!(sliding, hourly);
    let job_file = TempJob::new("sliding", &sliding);
    let job = job_file.0.clone();
    let args = ["-p", "2", "--checkpoint-interval-ms", "40"];
    let straight = Run::new();
    let report = straight.run_ok(&job, &args);
    let expected = straight.committed("hours");
    // Independent check: every flight is in exactly four 2 h windows sliding by 30 min.
    let flights = flights();
    let mut windows: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for f in &flights {
        let last = f.ts.div_euclid(1_800_000) * 1_800_000;
        for k in 0..4 {
            *windows
                .entry((f.origin.clone(), last - k * 1_800_000))
                .or_default() += 1;
        }
    }
    assert_eq!(expected.len(), windows.len());
    for l in &expected {
        let v: Value = serde_json::from_str(l).unwrap();
        let key = (
            v["key"].as_str().unwrap().to_owned(),
            v["window_start"].as_i64().unwrap(),
        );
        assert_eq!(v["flights"].as_u64(), windows.get(&key).copied(), "{l}");
    }
    let epochs: u64 = report
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("epochs")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no epoch count in {report}"));
    assert!(epochs >= 3, "the run took {epochs} epochs");
    for n in 1..epochs {
        let run = Run::new();
        let o = run.run(&job, &args, Some(&format!("after-manifest-publish={n}")));
        if o.status.success() {
            continue; // this run took fewer epochs
        }
        run.run_ok(&job, &args);
        assert_eq!(run.committed("hours"), expected, "restored at epoch {n}");
    }
}

/// Session gap of the carrier-session test: 30 minutes.
const SESSION_GAP: i64 = 1_800_000;

/// (carrier, session start) -> (session end, flights, sum of delays, delays counted).
type Sessions = BTreeMap<(String, i64), (i64, u64, i64, u64)>;

/// Sessions per carrier by a plain scan, independent of the window operator: each
/// carrier's departures in time order; a departure before the current session's end
/// (`last departure + gap`, exclusive) joins it, one at or after the end starts a new
/// session. Also returns how many departures came exactly at the end of the session
/// before them (the cases Flink's touching rule would have merged).
fn carrier_sessions(flights: &[Flight]) -> (Sessions, usize) {
    let mut by_carrier: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for f in flights {
        by_carrier
            .entry(&f.carrier)
            .or_default()
            .push((f.ts, f.dep_delay));
    }
    let mut out = Sessions::new();
    let mut exactly_at_end = 0;
    for (carrier, mut deps) in by_carrier {
        deps.sort_by_key(|d| d.0);
        let mut start = deps[0].0;
        let mut cur = (start + SESSION_GAP, 0, 0, 0);
        for (ts, delay) in deps {
            if ts >= cur.0 {
                if ts == cur.0 {
                    exactly_at_end += 1;
                }
                out.insert((carrier.to_owned(), start), cur);
                start = ts;
                cur = (ts + SESSION_GAP, 0, 0, 0);
            }
            cur.0 = cur.0.max(ts + SESSION_GAP);
            cur.1 += 1;
            if let Some(d) = delay {
                cur.2 += d;
                cur.3 += 1;
            }
        }
        out.insert((carrier.to_owned(), start), cur);
    }
    (out, exactly_at_end)
}

/// Checks session lines against the independent sessions: the same set, field by field.
fn check_sessions(lines: &[String], expected: &Sessions, what: &str) {
    let mut got = Sessions::new();
    let mut avgs = BTreeMap::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let key = (
            v["key"].as_str().unwrap().to_owned(),
            v["window_start"].as_i64().unwrap(),
        );
        let (end, n) = (
            v["window_end"].as_i64().unwrap(),
            v["flights"].as_u64().unwrap(),
        );
        avgs.insert(key.clone(), v["avg_dep_delay_min"].as_f64());
        assert!(
            got.insert(key, (end, n, 0, 0)).is_none(),
            "{what}: twice: {l}"
        );
    }
    let strip = |s: &Sessions| -> BTreeMap<(String, i64), (i64, u64)> {
        s.iter().map(|(k, v)| (k.clone(), (v.0, v.1))).collect()
    };
    // Compare the windows and counts as whole maps first: a mismatch names the sessions.
    let (want, have) = (strip(expected), strip(&got));
    if want != have {
        let missing: Vec<_> = want
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(v))
            .take(5)
            .collect();
        let extra: Vec<_> = have
            .iter()
            .filter(|(k, v)| want.get(*k) != Some(v))
            .take(5)
            .collect();
        panic!(
            "{what}: {} sessions, expected {}; expected but not emitted (first 5): {missing:?}; \
             emitted but not expected (first 5): {extra:?}",
            have.len(),
            want.len()
        );
    }
    for (k, (_, _, sum, cnt)) in expected {
        let want = (*cnt > 0).then(|| *sum as f64 / *cnt as f64);
        assert_eq!(avgs[k], want, "{what}: average delay of session {k:?}");
    }
}

/// Session windows (per carrier, 30 min gap) over the time-sorted flights, whose
/// departures fall on whole minutes: thousands of them come exactly one gap after the
/// previous departure of their carrier, where Flink's touching rule made the result race
/// the watermark. Under the overlap rule every run — parallelism 1, 2 and 3, restored
/// from a mid-run epoch at another parallelism, restored at every epoch, SIGKILLed at
/// random moments — commits exactly the sessions of an independent scan of the CSV.
#[test]
fn carrier_sessions_with_exactly_adjacent_flights_are_the_same_in_every_run() {
    let hourly = std::fs::read_to_string(example("hourly-delay.toml")).unwrap();
    let replacements = [
        (
            r#"name = "flights-hourly-delay""#,
            r#"name = "flights-carrier-sessions""#,
        ),
        (
            r#"config = { key = "origin", fields = ["origin", "dep_delay"] }"#,
            r#"config = { key = "carrier", fields = ["carrier", "dep_delay"] }"#,
        ),
        (
            r#"window = { kind = "tumbling", size_ms = 3600000, time = "event" }"#,
            r#"window = { kind = "session", gap_ms = 1800000, time = "event" }"#,
        ),
    ];
    let mut text = hourly;
    for (from, to) in replacements {
        assert!(text.contains(from), "the example still has {from}");
        text = text.replace(from, to);
    }
    let job_file = TempJob::new("sessions", &text);
    let job = job_file.0.clone();

    let flights = flights();
    let (expected, exactly_at_end) = carrier_sessions(&flights);
    assert!(
        exactly_at_end > 5_000,
        "the input has many exactly-adjacent departures ({exactly_at_end})"
    );
    let merged: u64 = expected.values().filter(|s| s.1 > 1).map(|s| s.1).sum();
    assert!(merged > 100_000, "and many overlapping ones ({merged})");
    let counted: u64 = expected.values().map(|s| s.1).sum();
    assert_eq!(counted, 336_776, "every flight is in one session");

    // Parallelism 1; 2 with checkpoints; 2 crashed mid-run and rescaled to 3.
    let lines = three_ways(&job, "hours");
    check_sessions(&lines, &expected, "three ways");

    let args = ["-p", "3", "--checkpoint-interval-ms", "100"];
    let p3 = Run::new();
    p3.run_ok(&job, &args);
    check_sessions(&p3.committed("hours"), &expected, "parallelism 3");

    // Restored at every epoch of a parallelism-2 run.
    let args = ["-p", "2", "--checkpoint-interval-ms", "100"];
    let straight = Run::new();
    let report = straight.run_ok(&job, &args);
    check_sessions(&straight.committed("hours"), &expected, "parallelism 2");
    let epochs: u64 = report
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_prefix("epochs")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no epoch count in {report}"));
    assert!(epochs >= 3, "the run took {epochs} epochs");
    let mut restored = 0;
    for n in 1..epochs {
        let run = Run::new();
        let o = run.run(&job, &args, Some(&format!("after-manifest-publish={n}")));
        if o.status.success() {
            continue; // this run took fewer epochs
        }
        run.run_ok(&job, &args);
        check_sessions(
            &run.committed("hours"),
            &expected,
            &format!("restored at epoch {n}"),
        );
        restored += 1;
    }
    assert!(restored >= 2, "{restored} runs restored of {epochs} epochs");

    // SIGKILLed at random moments and restarted until done.
    let committed = straight.committed("hours");
    random_kills(&job, "hours", &committed, 4, 23);
}
