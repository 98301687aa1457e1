//! Every edge partition policy of the PartitionedPlan moves records as the design defines
//! it (design §4.1): FORWARD and REBALANCE keep every record once, BROADCAST copies each to
//! every downstream subtask, SINGLETON gathers everything on subtask 0, UNION merges
//! several upstreams, and HASH sends all records of a key to one subtask.

mod common;

use common::{JobDir, records, run};
use nop_stream_plugin_host::Limits;
use std::collections::{BTreeMap, BTreeSet};

const SOURCE: &str = r#"
[[source]]
name = "input"
plugin = "file-source@0.1.0"
parallelism = {src_p}
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/input.jsonl", format = "jsonl" }
"#;

const SINK: &str = r#"
[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
parallelism = {sink_p}
inputs = [{inputs}]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "part" }
"#;

/// An identity operator: fault-trap never reaching its threshold passes records through.
fn identity(name: &str, p: u32, from: &str, partition: &str) -> String {
    format!(
        r#"
[[operator]]
name = "{name}"
plugin = "fault-trap@0.1.0"
parallelism = {p}
inputs = [{{ from = "{from}", partition = "{partition}" }}]
config = {{ after = 1000000000 }}
"#
    )
}

fn job(body: &str) -> String {
    format!("[job]\nname = \"policies\"\nstate_shards = 16\nbatch_records = 4\n{body}")
}

/// Lines per sink subtask (from the `part-<subtask>-<epoch>.jsonl` file names).
fn by_subtask(j: &JobDir) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for f in j.committed_files() {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let sub: u32 = name.split('-').nth(1).unwrap().parse().unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        out.entry(sub)
            .or_default()
            .extend(text.lines().map(str::to_owned));
    }
    out
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn rebalance_keeps_every_record_once_and_uses_every_subtask() {
    let input = records(400);
    let body = SOURCE.replace("{src_p}", "2")
        + &identity("spread", 3, "input", "rebalance")
        + &SINK
            .replace("{sink_p}", "3")
            .replace("{inputs}", r#""spread""#);
    let j = JobDir::new(&input, &job(&body));
    run(&j, Limits::default()).unwrap();
    assert_eq!(j.committed_lines(), sorted(input));
    let subs = by_subtask(&j);
    assert_eq!(
        subs.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2],
        "round robin reaches every subtask"
    );
}

#[test]
fn broadcast_copies_every_record_to_every_subtask() {
    let input = records(50);
    let body = SOURCE.replace("{src_p}", "1")
        + &identity("copy", 2, "input", "broadcast")
        + &SINK
            .replace("{sink_p}", "2")
            .replace("{inputs}", r#""copy""#);
    let j = JobDir::new(&input, &job(&body));
    run(&j, Limits::default()).unwrap();
    let subs = by_subtask(&j);
    assert_eq!(subs.len(), 2);
    for lines in subs.values() {
        assert_eq!(
            sorted(lines.clone()),
            sorted(input.clone()),
            "each subtask gets everything"
        );
    }
}

#[test]
fn singleton_gathers_everything_on_subtask_0() {
    let input = records(120);
    let body = SOURCE.replace("{src_p}", "2")
        + &SINK
            .replace("{sink_p}", "1")
            .replace("{inputs}", r#"{ from = "input", partition = "singleton" }"#);
    let j = JobDir::new(&input, &job(&body));
    run(&j, Limits::default()).unwrap();
    let subs = by_subtask(&j);
    assert_eq!(subs.keys().copied().collect::<Vec<_>>(), vec![0]);
    assert_eq!(sorted(subs[&0].clone()), sorted(input));
}

#[test]
fn union_merges_two_sources() {
    let a = records(30);
    let b: Vec<String> = (0..20).map(|i| format!(r#"{{"b":{i}}}"#)).collect();
    let body = SOURCE.replace("{src_p}", "1")
        + r#"
[[source]]
name = "second"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/second.jsonl", format = "jsonl" }
"# + &SINK.replace("{sink_p}", "1").replace(
        "{inputs}",
        r#"{ from = "input", partition = "union" }, { from = "second", partition = "union" }"#,
    );
    let j = JobDir::new(&a, &job(&body));
    std::fs::write(j.dir.path().join("data/second.jsonl"), b.join("\n") + "\n").unwrap();
    run(&j, Limits::default()).unwrap();
    assert_eq!(j.committed_lines(), sorted([a, b].concat()));
}

#[test]
fn hash_sends_all_records_of_a_key_to_one_subtask() {
    let input = records(300);
    let body = SOURCE.replace("{src_p}", "2")
        + r#"
[[operator]]
name = "keyer"
plugin = "keyer@0.1.0"
inputs = ["input"]
"# + &identity("byk", 2, "keyer", "hash")
        + &SINK
            .replace("{sink_p}", "2")
            .replace("{inputs}", r#""byk""#);
    let j = JobDir::new(
        &input,
        &job(&body).replace("[job]\n", "[job]\nparallelism = 2\n"),
    );
    run(&j, Limits::default()).unwrap();
    assert_eq!(j.committed_lines(), sorted(input));
    // The keyer keys each record by its own bytes; every key lands on exactly one subtask.
    let mut owner: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (sub, lines) in by_subtask(&j) {
        for l in lines {
            owner.entry(l).or_default().insert(sub);
        }
    }
    assert!(owner.values().all(|s| s.len() == 1));
    assert!(
        by_subtask(&j).len() == 2,
        "300 distinct keys spread over both subtasks"
    );
}
