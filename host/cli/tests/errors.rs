//! What a user sees when a job or plugin is wrong, through the real `nopstream` binary:
//! every problem of a malformed job file with file:line and field; a wrong-world plugin
//! and sandbox faults refused with a message naming plugin, operator, subtask and limit
//! (and a clean exit code, not a crash); plans that round-trip; the plugin listing.

#![cfg(feature = "bundled-plugins")] // needs the plugin components the feature builds

use nop_stream_core::PartitionedPlan;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn wasm(package: &str) -> String {
    nop_stream_artifacts::plugin_path(package)
        .display()
        .to_string()
}

/// Runs `nopstream args...` in `dir` with a compiled-component cache under the target dir.
fn nopstream(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .current_dir(dir)
        .env(
            "NOPSTREAM_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("nopstream-cli-cache"),
        )
        .args(args)
        .output()
        .expect("run nopstream")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A temp dir with `data/input.jsonl` (`lines` JSON records) and `job.toml` = `job`.
fn job_dir(job: &str, lines: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let input: String = (0..lines).map(|i| format!("{{\"v\":{i}}}\n")).collect();
    std::fs::write(dir.path().join("data/input.jsonl"), input).unwrap();
    let file = dir.path().join("job.toml");
    std::fs::write(&file, job).unwrap();
    (dir, file)
}

/// source -> `op` (plugin reference and inline config) -> sink.
fn pipeline(op_plugin: &str, op_config: &str) -> String {
    format!(
        r#"[job]
name = "cli-faults"
batch_records = 4

[[source]]
name = "input"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/input.jsonl" }}

[[operator]]
name = "mid"
plugin = "{op_plugin}"
inputs = ["input"]
config = {op_config}

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["mid"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output" }}
"#
    )
}

/// Runs the job file and returns (exit success, stdout, stderr); output into `dir/out`.
fn run(dir: &Path, file: &Path, extra: &[&str]) -> (bool, String, String) {
    let file = file.display().to_string();
    let mut args = vec![
        "run",
        "--no-progress",
        "--output",
        "out",
        "--work-dir",
        "work",
    ];
    args.extend_from_slice(extra);
    args.push(&file);
    let o = nopstream(dir, &args);
    let (out, err) = text(&o);
    (o.status.success(), out, err)
}

fn visible_outputs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir.join("out"))
        .map(|d| {
            d.map(|e| e.unwrap().path())
                .filter(|p| !p.file_name().unwrap().to_str().unwrap().starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn validate_reports_every_problem_of_a_malformed_job_with_line_and_field() {
    let job = r#"[job]
name = "malformed"
colour = "blue"

[[source]]
name = "input"
plugin = "file-source@0.1.0"
config = { path = "/input/input.jsonl" }

[[operator]]
name = "mid"
plugin = "fault-trap@0.1.0"
inputs = [{ from = "input", partition = "sideways" }]

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["nowhere"]
"#;
    let (dir, _) = job_dir(job, 1);
    let o = nopstream(dir.path(), &["validate", "job.toml"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "validate must fail:\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(1), "a refusal, not a crash:\n{err}");
    for (position, field, what) in [
        ("3:1", "job.colour", "unknown key `colour`"),
        (
            "13:41",
            "operator[0].inputs[0].partition",
            "unknown partition `sideways`",
        ),
        ("18:11", "sink[0].inputs[0].from", "unknown node `nowhere`"),
    ] {
        let prefix = format!("job.toml:{position}: {field}: ");
        let hit = err
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no `{prefix}...` line in:\n{err}"));
        assert!(hit.contains(what), "{hit}");
    }
    assert!(err.contains("job.toml: 3 problem(s)"), "{err}");
}

#[test]
fn run_refuses_a_wrong_world_plugin_naming_it_and_the_operator() {
    let (dir, file) = job_dir(&pipeline(&wasm("fault-wrong-world"), "{}"), 3);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "must fail:\n{out}\n{err}");
    assert!(err.contains("operator[0].plugin"), "{err}");
    assert!(
        err.contains(&format!(
            "plugin `{}` does not implement the `nop:stream/operator` world",
            wasm("fault-wrong-world")
        )),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(visible_outputs(dir.path()).is_empty());
}

#[test]
fn run_reports_a_guest_panic_naming_plugin_operator_subtask_and_message() {
    let (dir, file) = job_dir(&pipeline("fault-trap@0.1.0", "{ after = 2 }"), 10);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "must fail:\n{out}\n{err}");
    assert!(
        err.contains(
            "error: job `cli-faults` failed: plugin `fault-trap@0.1.0` (operator `mid`, subtask 0) trapped in `process`"
        ),
        "{err}"
    );
    assert!(err.contains("deliberate panic after 2 records"), "{err}");
    assert!(
        !err.contains("wasm backtrace"),
        "no wasm backtrace for users:\n{err}"
    );
    assert!(visible_outputs(dir.path()).is_empty());
}

#[test]
fn run_cpu_limit_flag_stops_an_infinite_loop() {
    let (dir, file) = job_dir(&pipeline("fault-loop@0.1.0", "{}"), 3);
    let started = std::time::Instant::now();
    let (ok, out, err) = run(dir.path(), &file, &["--cpu-ms-per-call", "200"]);
    assert!(!ok, "must fail:\n{out}\n{err}");
    assert!(
        err.contains("exceeded limit `cpu_ms_per_call` (200 ms per call)"),
        "{err}"
    );
    assert!(err.contains("(operator `mid`, subtask 0)"), "{err}");
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}

#[test]
fn run_memory_limit_flag_stops_a_memory_hog() {
    let (dir, file) = job_dir(&pipeline("fault-memory@0.1.0", "{}"), 3);
    let (ok, out, err) = run(dir.path(), &file, &["--memory-mib", "32"]);
    assert!(!ok, "must fail:\n{out}\n{err}");
    assert!(
        err.contains("exceeded limit `memory_bytes` (33554432 bytes per instance)"),
        "{err}"
    );
    assert!(err.contains("plugin `fault-memory@0.1.0`"), "{err}");
}

#[test]
fn plan_partitioned_prints_json_that_round_trips() {
    let (dir, _) = job_dir(&pipeline("fault-trap@0.1.0", "{ after = 2 }"), 1);
    let o = nopstream(
        dir.path(),
        &["plan", "--layer", "partitioned", "-p", "2", "job.toml"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let value: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let plan: PartitionedPlan = serde_json::from_value(value.clone()).expect("a plan");
    assert_eq!(serde_json::to_value(&plan).unwrap(), value);
    let tasks: usize = plan.vertices.iter().map(|v| v.subtasks.len()).sum();
    assert_eq!(tasks, 2, "one chained vertex at parallelism 2");
    assert!(
        plan.vertices[0]
            .operators
            .iter()
            .any(|o| o.name == "mid" && o.plugin_info.name == "fault-trap")
    );
}

#[test]
fn plugins_lists_the_bundled_plugins_with_their_kind() {
    let o = nopstream(Path::new(env!("CARGO_TARGET_TMPDIR")), &["plugins"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("file-source@0.1.0"))
        .unwrap_or_else(|| panic!("file-source not listed:\n{out}"));
    assert!(line.contains(" source "), "{line}");
    assert!(
        out.lines().any(|l| l.starts_with("jsonl-sink@0.1.0")),
        "{out}"
    );
}
