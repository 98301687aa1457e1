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
    nopstream_with_env(dir, args, &[])
}

/// A `nopstream` command in `dir` with a compiled-component cache under the target dir.
fn nopstream_command(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
    c.current_dir(dir).env(
        "NOPSTREAM_CACHE",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("nopstream-cli-cache"),
    );
    c
}

/// [`nopstream`] with extra environment variables.
fn nopstream_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    nopstream_command(dir)
        .envs(env.iter().copied())
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
    run_with_env(dir, file, extra, &[])
}

/// [`run`] with extra environment variables.
fn run_with_env(
    dir: &Path,
    file: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
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
    let o = nopstream_with_env(dir, &args, env);
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

/// Before: `-p 2` put every node at parallelism 2, overriding a node's own `parallelism =
/// 1` (q7's global `max` stage, which then refused to open). Now `-p` sets the job's
/// parallelism and a node's own setting wins, as an operator's does over Flink's `-p`.
#[test]
fn dash_p_sets_the_job_parallelism_and_a_node_keeps_its_own() {
    let q7 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nexmark/q7.toml");
    let job = std::fs::read_to_string(&q7).unwrap();
    assert!(job.contains("name = \"max\"") && job.contains("parallelism = 1"));
    let o = nopstream(
        q7.parent().unwrap(),
        &["plan", "--layer", "stream", "-p", "3", "q7.toml"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let parallelism: std::collections::BTreeMap<&str, u64> = plan["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap(),
                n["parallelism"].as_u64().unwrap(),
            )
        })
        .collect();
    for (name, p) in &parallelism {
        assert_eq!(
            *p,
            if *name == "max" { 1 } else { 3 },
            "{name}: {parallelism:?}"
        );
    }
    assert!(parallelism.len() >= 4, "{parallelism:?}");
}

/// Pins `nopstream plan` printing a password: a connection URL with a percent-encoded
/// `password` parameter passed the check, and every layer printed the URL whole.
#[test]
fn plan_prints_no_credential_of_any_url() {
    let config = r#"{ after = 2, endpoint = "http://u:s3cret@h/x?api_token=s3cret" }"#;
    let (dir, _) = job_dir(&pipeline("fault-trap@0.1.0", config), 1);
    let o = nopstream(dir.path(), &["plan", "--layer", "model", "job.toml"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.contains("s3cret"), "{out}");
    assert!(out.contains("http://u:***@h/x?api_token=***"), "{out}");

    let job = format!(
        "{}[connections.pg]\nkind = \"postgres\"\nurl = \"postgres://nop@h/db?pass%77ord=s3cret\"\n",
        pipeline("fault-trap@0.1.0", "{ after = 2 }")
    );
    let (dir, _) = job_dir(&job, 1);
    for layer in ["model", "partitioned"] {
        let o = nopstream(dir.path(), &["plan", "--layer", layer, "job.toml"]);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{layer}: {out}");
        assert!(err.contains("connections.pg.url"), "{layer}: {err}");
        assert!(!out.contains("s3cret") && !err.contains("s3cret"), "{err}");
    }
}

/// A plugin config a Delta broke is reported at the Delta's file and field, by `plan` and
/// by `run` (whose compile refuses it before anything starts); the same mistake in the job
/// file itself names the job file. Before, both named the patched job's field, with no
/// file at all from `plan`.
#[test]
fn a_config_error_a_delta_made_names_the_delta_file_and_field() {
    let (dir, file) = job_dir(&pipeline("fault-trap@0.1.0", "{ after = 2 }"), 1);
    std::fs::write(
        dir.path().join("d.toml"),
        "[node.out]\nconfig = { bogus = 1 }\n",
    )
    .unwrap();
    let blamed = "d.toml: node.out.config.bogus: unknown field; known fields: dir, prefix";
    let o = nopstream(dir.path(), &["plan", "job.toml", "--delta", "d.toml"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains(blamed) && err.contains("the field is sink[0].config.bogus of job.toml"),
        "{err}"
    );
    let (ok, out, err) = run(dir.path(), &file, &["--delta", "d.toml"]);
    assert!(!ok, "{out}");
    assert!(err.contains(blamed), "{err}");
    assert!(
        visible_outputs(dir.path()).is_empty(),
        "a refused job wrote output"
    );

    let job = pipeline("fault-trap@0.1.0", "{ after = 2 }").replace(
        "config = { dir = \"/output\" }",
        "config = { dir = \"/output\", bogus = 1 }",
    );
    let (dir, _) = job_dir(&job, 1);
    let o = nopstream(dir.path(), &["plan", "job.toml"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains("job.toml: sink[0].config.bogus: unknown field") && !err.contains("Delta"),
        "{err}"
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

#[test]
fn plugin_describe_prints_a_bundled_plugins_config_schema_and_refuses_an_unknown_one() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let o = nopstream(
        dir,
        &["plugin", "describe", "flights-mapper@0.1.0", "--json"],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["name"], "flights-mapper");
    let schema: serde_json::Value =
        serde_json::from_str(info["config_schema"].as_str().unwrap()).unwrap();
    let columns = schema
        .pointer("/properties/fields/items/enum")
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| panic!("no column enum: {schema}"));
    assert!(columns.iter().any(|c| c == "dep_delay"), "{schema}");
    let o = nopstream(dir, &["plugin", "describe", "window-aggregate@0.1.0"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.starts_with("window-aggregate@0.1.0 (operator)"),
        "{out}"
    );
    assert!(out.contains("config schema"), "{out}");
    let o = nopstream(dir, &["plugin", "describe", "no-such-plugin@1.0.0"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains("`no-such-plugin@1.0.0` is not on the plugin path"),
        "{err}"
    );
    // The name alone names the only version on the path; a missing version names the
    // ones there are.
    let o = nopstream(dir, &["plugin", "describe", "window-aggregate"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.starts_with("window-aggregate@0.1.0 (operator)"),
        "{out}"
    );
    let o = nopstream(dir, &["plugin", "describe", "window-aggregate@9.9.9"]);
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        err.contains("; the path has window-aggregate@0.1.0 "),
        "{err}"
    );
}

/// `nopstream validate job.toml` in `dir`: (exit success, stderr).
fn validate(dir: &Path) -> (bool, String) {
    let o = nopstream(dir, &["validate", "job.toml"]);
    let (out, err) = text(&o);
    assert!(
        o.status.success() || o.status.code() == Some(1),
        "a refusal, not a crash:\n{out}\n{err}"
    );
    (o.status.success(), err)
}

/// The one line of `err` starting with `prefix`.
fn line_starting<'a>(err: &'a str, prefix: &str) -> &'a str {
    err.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}...` line in:\n{err}"))
}

#[test]
fn validate_refuses_keyed_state_behind_a_non_hash_input_at_parallelism_2() {
    // Before: planned fine, then failed at run time with "outside the shards 0..0 this
    // subtask owns".
    let job = pipeline(
        "keyed-aggregate@0.1.0",
        r#"{ key_field = "v", aggregates = [{ name = "n", fn = "count" }] }"#,
    )
    .replace("batch_records = 4", "batch_records = 4\nparallelism = 2");
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: operator[0].inputs[0].partition: "),
        "job.toml: operator[0].inputs[0].partition: `mid` (keyed-aggregate@0.1.0) declares \
         keyed state (`acc`) and runs at parallelism 2, but its input from `input` is \
         FORWARD, so records would reach a subtask that does not own their key's state \
         shard; set `partition = \"hash\"` on this input (records keyed by the upstream), or \
         run `mid` at parallelism 1"
    );
    assert!(err.contains("job.toml: 1 problem(s)"), "{err}");
    // The fix the message names is accepted.
    let fixed = job.replace(
        r#"inputs = ["input"]"#,
        r#"inputs = [{ from = "input", partition = "hash" }]"#,
    );
    std::fs::write(dir.path().join("job.toml"), fixed).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(ok, "{err}");
}

#[test]
fn validate_checks_plugin_config_against_its_config_schema() {
    let job = pipeline("fault-error@0.1.0", "{}").replace(
        r#"config = { path = "/input/input.jsonl" }"#,
        r#"config = { path = "/input/input.jsonl", format = "xml", splits = 0, colour = "blue" }"#,
    );
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    let tail = "(the config schema of `file-source@0.1.0`; `nopstream plugins` lists the plugins)";
    for (field, what) in [
        (
            "source[0].config.colour",
            "unknown field; known fields: event_time, format, header, max_records_per_second, path, splits",
        ),
        (
            "source[0].config.format",
            "must be one of \"csv\", \"jsonl\", found \"xml\"",
        ),
        ("source[0].config.splits", "must be >= 1, found 0"),
    ] {
        assert_eq!(
            line_starting(&err, &format!("job.toml: {field}: ")),
            format!("job.toml: {field}: {what} {tail}")
        );
    }
    assert!(err.contains("job.toml: 3 problem(s)"), "{err}");
    // A missing required field is named too, on the config itself.
    let job = pipeline("fault-error@0.1.0", "{}")
        .replace(r#"config = { path = "/input/input.jsonl" }"#, "config = {}");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: source[0].config: "),
        format!("job.toml: source[0].config: missing required field `path` {tail}")
    );
}

#[test]
fn validate_refuses_a_grant_of_a_directory_that_does_not_exist() {
    let job = pipeline("fault-error@0.1.0", "{}").replace(
        r#"grants = [{ guest = "/input", host = "data" }]"#,
        r#"grants = [{ guest = "/input", host = "no-such-dir" }]"#,
    );
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: source[0].grants[0].host: "),
        "job.toml: source[0].grants[0].host: directory ./no-such-dir granted to `input` as \
         `/input` does not exist; create it, point `host` at an existing directory (relative \
         paths start at the job file's directory), or set `writable = true` to have the run \
         create it"
    );
    std::fs::create_dir(dir.path().join("no-such-dir")).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(ok, "{err}");
}

#[test]
fn validate_refuses_a_sink_that_no_one_feeds() {
    let job = pipeline("fault-error@0.1.0", "{}").replace("inputs = [\"mid\"]\n", "");
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    let hit = line_starting(&err, "job.toml:");
    assert!(
        hit.ends_with(
            "sink[0].inputs: sink `out` has no input, so no one feeds it and it would receive \
             no record; add `inputs = [\"<node>\"]` naming one of `input`, `mid`"
        ),
        "{err}"
    );
}

#[test]
fn run_prints_its_work_directory_and_checkpoint_namespace_at_start_and_in_its_summary() {
    let (dir, _) = job_dir(&pipeline("fault-error@0.1.0", "{}"), 5);
    let o = nopstream(dir.path(), &["run", "--no-progress", "job.toml"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let lines = [
        "  work directory   nopstream-out/cli-faults/work",
        "  checkpoints      namespace `cli-faults.main` in \
         nopstream-out/cli-faults/work/checkpoints/cli-faults.main",
        "  output           nopstream-out/cli-faults/output",
    ];
    let start = err
        .lines()
        .skip_while(|l| *l != "job `cli-faults`")
        .skip(1)
        .take(3)
        .collect::<Vec<_>>();
    assert_eq!(start, lines, "at start, on stderr:\n{err}");
    let summary = out
        .lines()
        .skip_while(|l| !l.starts_with("  transactions"))
        .skip(1)
        .take(3)
        .collect::<Vec<_>>();
    assert_eq!(summary, lines, "in the summary:\n{out}");
    // The directories are real: the namespace holds the epoch manifests.
    assert!(
        dir.path()
            .join("nopstream-out/cli-faults/work/checkpoints/cli-faults.main/manifests")
            .read_dir()
            .unwrap()
            .next()
            .is_some()
    );
    // Running it again resumes from the same namespace and says so in its summary too.
    let o = nopstream(dir.path(), &["run", "--no-progress", "job.toml"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("already finished"), "{out}");
    assert!(out.contains(lines[1]), "{out}");
}

#[test]
fn a_sink_writing_to_a_full_disk_says_no_space_left_on_device() {
    // Before: the sink failed with "I/O error (os error 29)". The output directory is a
    // 64 KiB tmpfs, mounted in a private mount namespace (`unshare`), so the test needs no
    // privileges and leaves no mount behind.
    let (dir, _) = job_dir(&pipeline("fault-error@0.1.0", "{}"), 30_000);
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs '{full}' && exec '{bin}' run --no-progress \
         --output '{full}' --work-dir work job.toml",
        full = full.display(),
        bin = env!("CARGO_BIN_EXE_nopstream"),
    );
    let o = Command::new("unshare")
        .args(["--mount", "--map-root-user", "sh", "-c", &script])
        .current_dir(dir.path())
        .env(
            "NOPSTREAM_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("nopstream-cli-cache"),
        )
        .output()
        .expect("run unshare (util-linux)");
    let (out, err) = text(&o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the job fails, cleanly:\n{out}\n{err}"
    );
    assert!(
        !err.contains("mount:"),
        "could not mount the small tmpfs:\n{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("no space left on device"))
        .unwrap_or_else(|| panic!("the cause is not named:\n{err}"));
    assert!(
        line.contains(&format!(
            "no space left on device: the file system of the directory granted as `/output` \
             ({}) is full",
            full.display()
        )),
        "{line}"
    );
    assert!(line.contains("`out`"), "names the sink: {line}");
}

#[test]
fn validate_names_a_bad_on_error_and_refuses_skip_on_an_operator_with_keyed_state() {
    let job = pipeline("fault-error@0.1.0", "{}").replace(
        "inputs = [\"input\"]\n",
        "inputs = [\"input\"]\non_error = \"ignore\"\n",
    );
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml:15:12: operator[0].on_error: "),
        "job.toml:15:12: operator[0].on_error: unknown error policy `ignore`; expected one of: \
         fail, skip, dead-letter"
    );
    // Skipping records of a stateful operator would need its state writes taken back.
    let job = pipeline(
        "keyed-aggregate@0.1.0",
        r#"{ key_field = "v", aggregates = [{ name = "n", fn = "count" }] }"#,
    )
    .replace(
        "inputs = [\"input\"]\n",
        "inputs = [\"input\"]\non_error = \"skip\"\n",
    );
    std::fs::write(dir.path().join("job.toml"), &job).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    let line = line_starting(&err, "job.toml: operator[0].on_error: ");
    assert!(
        line.contains("declares keyed state (`acc`); on_error = \"skip\" re-runs a failed batch"),
        "{line}"
    );
    assert!(err.contains("job.toml: 1 problem(s)"), "{err}");
    // The stateless fault-error operator may skip.
    let job = pipeline("fault-error@0.1.0", "{}").replace(
        "inputs = [\"input\"]\n",
        "inputs = [\"input\"]\non_error = \"skip\"\n",
    );
    std::fs::write(dir.path().join("job.toml"), &job).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(ok, "{err}");
}

#[test]
fn state_ttl_names_declared_states_of_operators_only() {
    let keyed = pipeline(
        "keyed-aggregate@0.1.0",
        r#"{ key_field = "k", aggregates = [{ name = "n", fn = "count" }, { name = "s", fn = "sum", field = "v" }] }"#,
    )
    .replace(
        r#"inputs = ["input"]"#,
        r#"inputs = [{ from = "input", partition = "hash" }]"#,
    );
    let with_ttl = |ttl: &str| {
        keyed.replace(
            "config = { key_field",
            &format!("state_ttl_ms = {ttl}\nconfig = {{ key_field"),
        )
    };
    // A state the plugin does not declare, a zero TTL, a TTL on a sink: refused, named.
    let (dir, file) = job_dir(&with_ttl("{ nope = 1000 }"), 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: operator[0].state_ttl_ms.nope: "),
        "job.toml: operator[0].state_ttl_ms.nope: plugin `keyed-aggregate@0.1.0` declares no \
         keyed state `nope`; it declares `acc`"
    );
    std::fs::write(&file, with_ttl("{ acc = 0 }")).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok && err.contains("operator[0].state_ttl_ms.acc"), "{err}");
    assert!(err.contains("must be >= 1 ms"), "{err}");
    let on_sink = keyed.replace(
        "config = { dir = \"/output\" }",
        "config = { dir = \"/output\" }\nstate_ttl_ms = { acc = 1000 }",
    );
    std::fs::write(&file, on_sink).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok && err.contains("sink[0].state_ttl_ms"), "{err}");
    assert!(err.contains("only operators hold keyed state"), "{err}");
}

/// A profiler setting the engine does not know is refused before anything runs, naming
/// the variable and the value; `none` runs as usual.
#[test]
fn run_refuses_an_unknown_wasm_profiler_naming_the_variable() {
    let (dir, file) = job_dir(&pipeline("fault-trap@0.1.0", "{ after = 100 }"), 3);
    let with =
        |value: &str| run_with_env(dir.path(), &file, &[], &[("NOPSTREAM_WASM_PROFILE", value)]);
    let (ok, out, err) = with("vtune-please");
    assert!(!ok, "must fail:\n{out}\n{err}");
    assert!(
        err.contains("NOPSTREAM_WASM_PROFILE=\"vtune-please\": expected `perfmap` or `none`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(visible_outputs(dir.path()).is_empty());
    let (ok, out, err) = with("none");
    assert!(ok, "{out}\n{err}");
}

#[test]
fn validate_refuses_a_join_without_exactly_two_inputs() {
    // Before: one input passed validation and ran, joining nothing; a third input failed
    // only at run time with an invalid-record error.
    let job = pipeline("nexmark-q3@0.1.0", "{}");
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: operator[0].inputs: "),
        "job.toml: operator[0].inputs: `mid` (nexmark-q3@0.1.0) is a regular-join, which \
         takes exactly two inputs, the left one first (`inputs = [{ from = \"left\", \
         partition = \"hash\" }, { from = \"right\", partition = \"hash\" }]`), but it has one"
    );
    let three = job.replace(
        r#"inputs = ["input"]"#,
        r#"inputs = ["input", "input", "input"]"#,
    );
    std::fs::write(dir.path().join("job.toml"), &three).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert!(
        line_starting(&err, "job.toml: operator[0].inputs: ").ends_with("but it has 3"),
        "{err}"
    );
    let two = job.replace(r#"inputs = ["input"]"#, r#"inputs = ["input", "input"]"#);
    std::fs::write(dir.path().join("job.toml"), &two).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(ok, "{err}");
}

#[test]
fn validate_refuses_a_join_stage_of_a_multi_stage_plugin_without_two_inputs() {
    // Before: nexmark-q7's `join` stage given one input passed validation (its model is
    // the plugin's, not a join's), and the `max` stage given two ran.
    let job = pipeline("nexmark-q7@0.1.0", r#"{ stage = "join" }"#);
    let (dir, _) = job_dir(&job, 3);
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert_eq!(
        line_starting(&err, "job.toml: operator[0].inputs: "),
        "job.toml: operator[0].inputs: `mid` (nexmark-q7@0.1.0) with `stage = \"join\"` \
         takes exactly two inputs, but it has one"
    );
    let max_of_two = pipeline("nexmark-q7@0.1.0", r#"{ stage = "max" }"#)
        .replace(r#"inputs = ["input"]"#, r#"inputs = ["input", "input"]"#);
    std::fs::write(dir.path().join("job.toml"), &max_of_two).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(!ok, "{err}");
    assert!(
        line_starting(&err, "job.toml: operator[0].inputs: ")
            .ends_with("with `stage = \"max\"` takes exactly one input, but it has two"),
        "{err}"
    );
    let max = pipeline("nexmark-q7@0.1.0", r#"{ stage = "max" }"#);
    std::fs::write(dir.path().join("job.toml"), &max).unwrap();
    let (ok, err) = validate(dir.path());
    assert!(ok, "{err}");
}

#[test]
fn run_names_the_job_file_of_a_plugin_it_cannot_resolve_or_a_config_it_refuses() {
    // Before: `validate` named the file, `run` printed the field alone.
    let (dir, file) = job_dir(&pipeline("no-such-plugin@0.1.0", "{}"), 3);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    let prefix = format!(
        "error: {}: operator[0].plugin: cannot resolve plugin `no-such-plugin@0.1.0`",
        file.display()
    );
    assert!(
        err.lines().any(|l| l.starts_with(&prefix)),
        "{prefix}\n{err}"
    );
    // A config its plugin's schema refuses, the same.
    let job = pipeline("keyed-aggregate@0.1.0", "{ key_field = 3 }");
    std::fs::write(&file, job).unwrap();
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    let line = format!(
        "{}: operator[0].config.key_field: must be string, found integer 3",
        file.display()
    );
    assert!(
        err.lines()
            .any(|l| l.trim_start_matches("error: ").starts_with(&line)),
        "{line}\n{err}"
    );
}

#[test]
fn a_record_without_a_key_on_a_hash_edge_fails_at_once_naming_the_input() {
    // Before: recovered 10 times over ~27 s, naming only the edge id.
    let job = pipeline(
        "keyed-aggregate@0.1.0",
        r#"{ key_field = "v", aggregates = [{ name = "n", fn = "count" }] }"#,
    )
    .replace(
        r#"inputs = ["input"]"#,
        r#"inputs = [{ from = "input", partition = "hash" }]"#,
    );
    let (dir, file) = job_dir(&job, 3);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    let expected = "error: job `cli-faults` failed: plugin `file-source@0.1.0` (operator \
         `input`, subtask 0) emitted a record without a key, but its output goes to input 0 \
         of `mid` over a HASH edge (`sources/input->operators/mid#0`), which routes each \
         record by its key: have `input` key its records, or give that input another \
         partition";
    assert!(
        err.lines().any(|l| l == expected),
        "expected the line\n{expected}\nin:\n{err}"
    );
    assert!(
        !err.contains("recovering"),
        "a set-up mistake is final:\n{err}"
    );
    assert!(visible_outputs(dir.path()).is_empty());
}

#[test]
fn a_failed_record_of_an_operator_with_keyed_state_hints_at_a_check_before_it() {
    // Before: the hint offered "skip" or "dead-letter", which validation refuses here.
    let job = pipeline(
        "keyed-aggregate@0.1.0",
        r#"{ key_field = "v", aggregates = [{ name = "n", fn = "count" }] }"#,
    );
    let (dir, file) = job_dir(&job, 3);
    let input = dir.path().join("data/input.jsonl");
    let mut lines = std::fs::read_to_string(&input).unwrap();
    lines.push_str("oops\n");
    std::fs::write(&input, lines).unwrap();
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    let line = line_starting(&err, "error: job `cli-faults` failed: ");
    assert!(
        line.ends_with(
            "; record: `oops` (on_error = \"fail\"; the operator has keyed state, where \
             \"skip\" and \"dead-letter\" are not allowed: check records in a stateless \
             operator before it, with on_error = \"skip\" or \"dead-letter\" there)"
        ),
        "{line}"
    );
    assert!(!err.contains("recovering"), "{err}");
}

#[test]
fn a_second_run_on_a_work_or_output_directory_in_use_is_refused() {
    // Before: two runs of one job on one work directory fenced each other's attempts
    // until one ran out of restarts or found the job finished by the other.
    let job = r#"[job]
name = "work-dir-lock"
checkpoint_interval_ms = 200

[[source]]
name = "gen"
plugin = "datagen-source@0.1.0"
config = { records_per_second = 100 }

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["gen"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output" }
"#;
    let (dir, file) = job_dir(job, 0);
    let mut first = nopstream_command(dir.path())
        .args([
            "run",
            "--no-progress",
            "--output",
            "out",
            "--work-dir",
            "work",
        ])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the first run");
    let lock = dir.path().join("work/run.lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let pid = loop {
        let text = std::fs::read_to_string(&lock).unwrap_or_default();
        if !text.trim().is_empty() {
            break text.trim().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first run never took the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(pid, first.id().to_string());
    let (ok, out, err) = run(dir.path(), &file, &["--fresh"]);
    // Another work directory, the same output directory: both runs would commit into it
    // (a fresh one after clearing it), and it would hold records twice. Before, the
    // second ran, and a user's test of it found 60,416 records doubled.
    let other = nopstream(
        dir.path(),
        &[
            "run",
            "--no-progress",
            "--output",
            "out",
            "--work-dir",
            "work-2",
            file.to_str().unwrap(),
        ],
    );
    let still_running = first.try_wait().unwrap().is_none();
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(still_running, "the first run ended early");
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains(&format!(
            "work directory work is in use by another `nopstream run` (pid {pid})"
        )),
        "{err}"
    );
    let (out, err) = text(&other);
    assert!(!other.status.success(), "{out}\n{err}");
    assert!(
        err.contains("output directory out is in use by another `nopstream run`"),
        "{err}"
    );
    assert!(
        !dir.path().join("work-2/checkpoints").exists(),
        "the refused run started"
    );
    // Its lock dies with it: the next run on the work directory (a bounded job) starts
    // and ends.
    let bounded = dir.path().join("bounded.toml");
    std::fs::write(
        &bounded,
        job.replace("records_per_second = 100", "records = 10")
            .replace("work-dir-lock", "work-dir-lock-2"),
    )
    .unwrap();
    let (ok, out, err) = run(dir.path(), &bounded, &[]);
    assert!(ok, "{out}\n{err}");
}

#[test]
fn an_operator_that_keys_every_record_alike_refuses_parallelism_2() {
    // Before: q7's `max` stage at parallelism 2 behind a HASH edge committed one maximum
    // per subtask when no checkpoint came before the end of the input, and failed (after
    // ten recoveries) only when one did.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nexmark/q7.toml");
    let job = std::fs::read_to_string(example)
        .unwrap()
        .replace("events = 1000000", "events = 20000")
        .replace(
            "inputs = [{ from = \"bids-by-price\", partition = \"singleton\" }]\nconfig = { stage = \"max\", price_field = 1 }\nparallelism = 1",
            "inputs = [{ from = \"bids-by-price\", partition = \"hash\" }]\nconfig = { stage = \"max\", price_field = 1 }\nparallelism = 2",
        );
    assert!(job.contains("stage = \"max\", price_field = 1 }\nparallelism = 2"));
    let (dir, file) = job_dir(&job, 0);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    assert!(
        err.contains(
            "nexmark-q7: `max` computes the highest bid of every window under one key, so it \
             must run at parallelism 1 (`parallelism = 1` and `partition = \"singleton\"` on \
             its input), not 2"
        ),
        "{err}"
    );
    assert!(!err.contains("recovering"), "{err}");
    assert!(visible_outputs(dir.path()).is_empty());
    // The failure names the job-file entry, is printed once, and carries no colour codes
    // when stderr is not a terminal.
    let line = line_starting(&err, "error: job `nexmark-q7` failed");
    assert!(
        line.starts_with(&format!(
            "error: job `nexmark-q7` failed ({}: operator[1] `max`): plugin `nexmark-q7@0.1.0`",
            file.display()
        )),
        "{line}"
    );
    assert_eq!(err.matches("must run at parallelism 1").count(), 1, "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
    // With --json, stdout is a JSON document on failure too.
    let (ok, out, err) = run(dir.path(), &file, &["--json"]);
    assert!(!ok, "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("a JSON document");
    assert_eq!(doc["status"], "failed", "{out}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("must run at parallelism 1"),
        "{out}"
    );
}

#[test]
fn a_missing_input_file_is_named_by_its_host_path_and_errno() {
    // Before: "/input/nope.jsonl: No such file or directory (os error 44)": the path as the
    // sandbox sees it, and a WASI errno that means something else on the host.
    let job = pipeline("fault-error@0.1.0", "{}").replace("input.jsonl", "nope.jsonl");
    let (dir, file) = job_dir(&job, 3);
    let (ok, out, err) = run(dir.path(), &file, &[]);
    assert!(!ok, "{out}\n{err}");
    let line = line_starting(&err, "error: job `cli-faults` failed: ");
    let host = dir.path().canonicalize().unwrap().join("data/nope.jsonl");
    assert!(
        line.contains("No such file or directory (WASI errno 44, ENOENT)")
            && line.ends_with(&format!(
                " (host path of `/input/nope.jsonl`: {})",
                host.display()
            )),
        "{line}"
    );
}
