//! Watermark alignment (`max_drift_ms`, design §8.5) end to end, through the real
//! `nopstream` binary: in one process (`nopstream run`), and across the two node processes
//! of a real cluster over QUIC, where the nodes exchange their subtasks' watermarks
//! through the coordinator.
//!
//! The input is one CSV file read by two byte-range splits at parallelism 2, each subtask
//! throttled to the same record rate. The first half of the file (the *slow* split) holds
//! [`SLOW_LINES`] short lines with event times from 1e12 ms on, one second apart; the
//! second half (the *fast* split) a quarter as many lines, four times as long, starting
//! 1e12 ms later, far more than `max_drift_ms` ahead. With alignment the fast subtask reads
//! at most one batch (its watermark starts unknown), then pauses until the slow subtask has read
//! everything (a finished subtask holds nobody back). The sink, at parallelism 1, writes
//! records in the order they reach it, so the committed output shows the pause: hardly any
//! fast record comes before the last slow one. Without alignment the fast subtask is done
//! in a quarter of the slow one's time, so all of its records do. The committed output
//! must also be exact: every input line once.

mod common;

use common::cluster::{Cluster, Timed, serial};
use common::job::Job;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Data lines of the slow split, 24 bytes each.
const SLOW_LINES: usize = 40_000;

/// Data lines of the fast split, 96 bytes each: the same bytes as the slow split.
const FAST_LINES: usize = SLOW_LINES / 4;

/// Records per second each source subtask reads at most: the slow split takes 2 s.
const RATE: usize = 20_000;

/// `job.batch_records` of the test jobs.
const BATCH: usize = 100;

/// `max_drift_ms` of the source: a minute, against a gap of 1e12 ms between the splits.
const DRIFT_MS: u64 = 60_000;

/// The most fast records allowed before the last slow one with alignment. The fast
/// subtask reads at most one batch before its first pause; once the slow one finished, the batches
/// the slow subtask had queued towards the sink (one channel, at most 16 batches, plus one
/// being flushed) still reach the sink while the fast one's first batches arrive beside
/// them, about as many as the sink takes from the slow channel meanwhile. Twice the queued
/// batches bounds that with a margin; without alignment all [`FAST_LINES`] (10,000) come
/// first.
const MOST_FAST_FIRST: usize = BATCH * (1 + 2 * 17);

/// Writes the input file `dir/events.csv`: header `ts,side,seq,pad`, then [`SLOW_LINES`]
/// slow lines of 24 bytes and [`FAST_LINES`] fast lines of 96 bytes (padded), so that the
/// two byte-range splits divide the file between the two kinds. Returns every data line,
/// slow first.
fn write_input(dir: &Path) -> Vec<String> {
    let mut lines = Vec::with_capacity(SLOW_LINES + FAST_LINES);
    for i in 0..SLOW_LINES {
        lines.push(format!(
            "{},s,{i:06},",
            1_000_000_000_000i64 + i as i64 * 1000
        ));
    }
    let pad = "x".repeat(72);
    for i in 0..FAST_LINES {
        lines.push(format!(
            "{},f,{i:06},{pad}",
            2_000_000_000_000i64 + i as i64 * 1000
        ));
    }
    assert!(
        lines[0].len() == 23 && lines[SLOW_LINES].len() == 95,
        "line lengths"
    );
    let mut file = String::from("ts,side,seq,pad\n");
    for l in &lines {
        file.push_str(l);
        file.push('\n');
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("events.csv"), file).unwrap();
    lines
}

/// The job text: the file source at parallelism 2 over `input`, aligned with
/// [`DRIFT_MS`] when `aligned`, into a JSONL sink at parallelism 1.
fn job_text(input: &Path, aligned: bool) -> String {
    let drift = if aligned {
        format!(", max_drift_ms = {DRIFT_MS}")
    } else {
        String::new()
    };
    format!(
        r#"[job]
name = "aligned"
parallelism = 2
semantic = "strict-exactly-once"
batch_records = {BATCH}
checkpoint_interval_ms = 300

[[source]]
name = "events"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "{input}" }}]
config = {{ path = "/input/events.csv", format = "csv", header = true, max_records_per_second = {RATE}, event_time = {{ column = "ts", format = "epoch-ms" }} }}
watermarks = {{ max_out_of_orderness_ms = 0{drift} }}

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["events"]
parallelism = 1
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "part" }}
"#,
        input = input.display()
    )
}

/// The committed lines of the one sink subtask under `out`, in the order it wrote them:
/// its files in epoch order (`part-00-EEEEEE.jsonl`), each in line order.
fn committed_in_order(out: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Checks that `got` holds every line of `input` exactly once, and returns how many fast
/// lines come before the last slow one.
fn fast_before_last_slow(got: &[String], input: &[String]) -> usize {
    assert_eq!(got.len(), input.len(), "every input line once");
    let unique: BTreeSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), got.len(), "no line twice");
    assert_eq!(
        unique,
        input.iter().collect::<BTreeSet<_>>(),
        "the input's lines"
    );
    let last_slow = got
        .iter()
        .rposition(|l| l.contains(",s,"))
        .expect("slow lines in the output");
    got[..last_slow]
        .iter()
        .filter(|l| l.contains(",f,"))
        .count()
}

/// Runs the job embedded (one at a time with the cluster test: leases on two cores must
/// not expire by starvation) and returns how many fast lines came before the last slow one.
fn run_embedded(aligned: bool) -> usize {
    let _serial = serial();
    let input_dir = tempfile::tempdir().unwrap();
    let input = write_input(input_dir.path());
    let job = Job::new(
        "watermark-alignment",
        if aligned { "aligned" } else { "unaligned" },
        &job_text(input_dir.path(), aligned),
    );
    let (ok, out) = job.run(None);
    assert!(ok, "{out}");
    fast_before_last_slow(&committed_in_order(&job.out), &input)
}

/// Regression: no test showed that `max_drift_ms` holds a subtask back at all. In one
/// process, the fast subtask must wait for the slow one, and the output stays exact.
#[test]
fn alignment_holds_the_fast_subtask_back_in_one_process() {
    let early = run_embedded(true);
    eprintln!("aligned, one process: {early} fast lines before the last slow one");
    assert!(
        early <= MOST_FAST_FIRST,
        "{early} fast lines before the last slow one (at most {MOST_FAST_FIRST} with alignment)"
    );
}

/// The observable above depends on alignment: without `max_drift_ms` the fast subtask
/// does not wait (else the test above would pass for another reason).
#[test]
fn without_alignment_the_fast_subtask_runs_ahead() {
    let early = run_embedded(false);
    eprintln!("unaligned, one process: {early} fast lines before the last slow one");
    assert!(
        early > MOST_FAST_FIRST,
        "only {early} fast lines before the last slow one without alignment"
    );
}

/// The node each subtask of the source runs on, from a job status's deployment.
fn source_nodes(status: &Value) -> Vec<(u64, String)> {
    let d: Value = serde_json::from_str(status["deployment_json"].as_str().unwrap()).unwrap();
    let mut out: Vec<(u64, String)> = d["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            t["task"]["vertex"]
                .as_str()
                .is_some_and(|v| v.ends_with("events"))
        })
        .map(|t| {
            (
                t["task"]["subtask"].as_u64().unwrap(),
                t["node"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Regression: alignment spanned only the subtasks of one node, so a fast subtask on one
/// node never waited for a slow one on another. With the subtasks of the source on two
/// node processes, the fast one must wait for the slow one across the nodes, and the
/// committed output stays exact.
#[test]
fn alignment_holds_the_fast_subtask_back_across_nodes() {
    let _serial = serial();
    let _t = Timed(
        "alignment_holds_the_fast_subtask_back_across_nodes",
        Instant::now(),
    );
    let c = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let input = write_input(&dir.path().join("input"));
    let file = dir.path().join("aligned.toml");
    std::fs::write(&file, job_text(&dir.path().join("input"), true)).unwrap();
    let out = dir.path().join("out");
    let job = c.submit(&file, &out, &[]);
    let status = c.wait_finished(&job, Duration::from_secs(180));
    let placed = source_nodes(&status);
    assert_eq!(placed.len(), 2, "two source subtasks: {placed:?}");
    assert_ne!(
        placed[0].1, placed[1].1,
        "the source's subtasks run on different nodes: {placed:?}"
    );
    let early = fast_before_last_slow(&committed_in_order(&out), &input);
    eprintln!("aligned, two nodes: {early} fast lines before the last slow one");
    let relayed = (1..=2)
        .map(|n| c.log(&format!("node-{n}.log")))
        .collect::<Vec<_>>();
    assert!(
        early <= MOST_FAST_FIRST,
        "{early} fast lines before the last slow one (at most {MOST_FAST_FIRST} with alignment)\n{}",
        text_tail(&relayed)
    );
}

/// The last lines of the node logs, for a failure message.
fn text_tail(logs: &[String]) -> String {
    logs.iter()
        .enumerate()
        .map(|(i, l)| {
            let lines: Vec<&str> = l.lines().collect();
            format!(
                "--- node-{}.log:\n{}",
                i + 1,
                lines[lines.len().saturating_sub(20)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
