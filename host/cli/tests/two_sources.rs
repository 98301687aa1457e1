//! Two sources whose splits have the same ids (design §4: a split is identified by
//! (source operator, split id)). Regression: the restore path collected split cursors and
//! descriptors by split id alone, so after a kill the fast source resumed from the slow
//! source's position and its sink committed duplicates; with two different files behind
//! the same guest path the resume failed for ever on the size check of the other file's
//! split descriptor.
//!
//! The job: `fast` reads the whole flights CSV, `slow` a shorter CSV behind the same guest
//! path, at a tenth of the rate; each goes through its own parser into its own JSONL sink.
//! Both sources split by byte ranges, so both name their splits `0`, `1`, ... Each test
//! crashes the job after its third durable epoch (the sources then stand at different
//! positions of different files) and restores it three ways: a plain resume, a rescale to
//! parallelism 3, and a savepoint restore at parallelism 1. Each sink's committed output
//! must equal an uninterrupted run's, every line once.

mod common;

use common::flights::{check_per_record, csv_lines, natural_keys};
use common::job::{Job, text};
use std::collections::BTreeMap;
use std::path::Path;

/// Data lines of the shorter file the slow source reads.
const SLOW_LINES: usize = 20_000;

/// Writes the slow source's file (the CSV's header and its first `slow_lines` lines) into
/// `dir/flights.csv` and returns the job text: both sources read `/input/flights.csv`,
/// `fast` from the example's data directory, `slow` from `dir`.
fn job_text(dir: &Path, slow_lines: usize) -> String {
    let (header, lines) = csv_lines();
    let mut short = header;
    short.push('\n');
    for l in &lines[..slow_lines] {
        short.push_str(l);
        short.push('\n');
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("flights.csv"), short).unwrap();
    let fields =
        r#"["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time", "dep_delay"]"#;
    format!(
        r#"[job]
name = "two-sources"
parallelism = 2
semantic = "strict-exactly-once"
checkpoint_interval_ms = 150

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "fast"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true, max_records_per_second = 60000 }}

[[source]]
name = "slow"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "{slow}" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true, max_records_per_second = 6000 }}

[[operator]]
name = "parse-fast"
plugin = "flights-mapper@0.1.0"
inputs = ["fast"]
config = {{ key = "carrier", fields = {fields} }}

[[operator]]
name = "parse-slow"
plugin = "flights-mapper@0.1.0"
inputs = ["slow"]
config = {{ key = "carrier", fields = {fields} }}

[[sink]]
name = "fast-out"
plugin = "jsonl-sink@0.1.0"
inputs = ["parse-fast"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "fast" }}

[[sink]]
name = "slow-out"
plugin = "jsonl-sink@0.1.0"
inputs = ["parse-slow"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "slow" }}
"#,
        slow = dir.display()
    )
}

/// The job, with its slow input ([`SLOW_LINES`] lines) in the job's own temporary
/// directory.
fn job(tag: &str) -> Job {
    job_with(tag, SLOW_LINES)
}

/// The job, the slow source reading the first `slow_lines` lines of the CSV.
fn job_with(tag: &str, slow_lines: usize) -> Job {
    let job = Job::new("two-sources", tag, "");
    let text = job_text(&job.dir.join("slow-input"), slow_lines);
    let name = job.file.file_name().unwrap().to_str().unwrap();
    common::kit::job_in(&job.dir, name, "examples/flights", &text);
    job
}

/// Committed lines per sink (by file prefix), each sorted.
fn committed_by_sink(out: &Path) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "jsonl") {
            continue;
        }
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let prefix = name.split('-').next().unwrap().to_owned();
        by.entry(prefix).or_default().extend(
            std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .map(str::to_owned),
        );
    }
    for lines in by.values_mut() {
        lines.sort();
    }
    by
}

/// Checks both sinks against the uninterrupted run and the input: the fast sink holds
/// every departure once, the slow one the first [`SLOW_LINES`] once.
fn check(out: &Path, reference: &BTreeMap<String, Vec<String>>, what: &str) {
    let got = committed_by_sink(out);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        ["fast", "slow"],
        "{what}: both sinks committed"
    );
    for (sink, lines) in &got {
        let want = &reference[sink];
        assert_eq!(
            lines.len(),
            want.len(),
            "{what}: {sink} committed {} lines, the uninterrupted run {}",
            lines.len(),
            want.len()
        );
        assert_eq!(lines, want, "{what}: {sink}'s output");
    }
    check_per_record(&got["fast"]);
    assert_eq!(natural_keys(&got["slow"]).len(), SLOW_LINES, "{what}");
}

/// The uninterrupted run's output per sink.
fn reference() -> BTreeMap<String, Vec<String>> {
    let job = job("reference");
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    let r = committed_by_sink(&job.out);
    check_per_record(&r["fast"]);
    assert_eq!(natural_keys(&r["slow"]).len(), SLOW_LINES);
    r
}

/// Runs `job` until the failpoint after its third durable epoch fires.
fn crash_after_third_epoch(job: &Job) {
    let (ok, out) = job.run(Some("after-manifest-publish=3"));
    assert!(
        !ok && out.contains("failpoint"),
        "the failpoint fired: {out}"
    );
}

/// `nopstream run` of `job` with `extra` arguments, to completion.
fn run_with(job: &Job, extra: &[&str]) -> String {
    let mut c = job.command(None);
    c.args(extra);
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    text(&o)
}

/// The issue's own shape: both sources read the same file. Before the fix the fast
/// source resumed from the slow one's cursors and its sink committed duplicates.
#[test]
fn two_sources_over_one_file_resume_without_duplicates() {
    let all = csv_lines().1.len();
    let job = job_with("same-file", all);
    crash_after_third_epoch(&job);
    job.finish();
    let got = committed_by_sink(&job.out);
    check_per_record(&got["fast"]);
    check_per_record(&got["slow"]);
}

#[test]
fn equal_split_ids_of_two_sources_keep_their_cursors_on_resume_rescale_and_savepoint() {
    let reference = reference();

    // A kill and a plain resume.
    let resumed = job("resume");
    crash_after_third_epoch(&resumed);
    resumed.finish();
    check(&resumed.out, &reference, "kill and resume");

    // A kill, then a restore at parallelism 3 (the splits of both sources move readers).
    let rescaled = job("rescale");
    crash_after_third_epoch(&rescaled);
    run_with(&rescaled, &["-p", "3", "--rescale"]);
    check(&rescaled.out, &reference, "kill and rescale 2 -> 3");

    // A kill, the durable epoch promoted to a savepoint, restored at parallelism 1.
    let restored = job("savepoint");
    crash_after_third_epoch(&restored);
    let sp = restored.dir.join("sp");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(["savepoint", "promote"])
        .arg(&restored.file)
        .arg("--work-dir")
        .arg(&restored.work)
        .arg("--out")
        .arg(&sp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    run_with(
        &restored,
        &["-p", "1", "--from-savepoint", &sp.display().to_string()],
    );
    check(&restored.out, &reference, "savepoint restore 2 -> 1");
}
