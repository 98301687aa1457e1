//! Savepoints end to end on the flights data (design §10.4–§10.6): a mid-run checkpoint
//! promoted to a savepoint, checked against jobs, and restored at other parallelisms with
//! output equal to the uninterrupted run; a key-spec change refused without touching
//! anything; a removed stateful operator needing `drop-state`.

mod common;

use common::kit::{BIN, committed, repo, text};

use common::files::{check_split_output, copy_dir, snapshot};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of the flights job next to its data, with `edit` applied to its text.
/// A job file in a temporary directory (removed on drop).
struct JobFile(PathBuf, #[allow(dead_code)] tempfile::TempDir);

fn job(tag: &str, edit: impl Fn(String) -> String) -> JobFile {
    job_from("flights.toml", tag, edit)
}

fn job_from(file: &str, tag: &str, edit: impl Fn(String) -> String) -> JobFile {
    let text = std::fs::read_to_string(repo().join("examples/flights").join(file)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = common::kit::job_in(
        tmp.path(),
        &format!("savepoint-{tag}.toml"),
        "examples/flights",
        &edit(text),
    );
    JobFile(path, tmp)
}

fn nopstream(args: &[&str], env: Option<(&str, &str)>) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("NOPSTREAM_FAILPOINTS");
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    c.output().unwrap()
}

struct Dirs {
    _tmp: tempfile::TempDir,
    out: PathBuf,
    work: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    Dirs {
        out: tmp.path().join("out"),
        work: tmp.path().join("work"),
        _tmp: tmp,
    }
}

fn run(job: &Path, d: &Dirs, extra: &[&str], failpoint: Option<&str>) -> Output {
    let mut args = vec!["run", "--no-progress", "--no-echo"];
    args.extend_from_slice(extra);
    let out = d.out.display().to_string();
    let work = d.work.display().to_string();
    args.extend_from_slice(&["--output", &out, "--work-dir", &work]);
    let j = job.display().to_string();
    args.push(&j);
    nopstream(&args, failpoint.map(|f| ("NOPSTREAM_FAILPOINTS", f)))
}

/// The committed output of an uninterrupted run of `job` at parallelism 2.
fn uninterrupted(job: &Path) -> Vec<String> {
    let d = dirs();
    let o = run(job, &d, &["-p", "2"], None);
    assert!(o.status.success(), "{}", text(&o));
    committed(&d.out)
}

/// `nopstream savepoint promote JOB --work-dir WORK --out OUT`.
fn promote(job: &Path, work: &Path, out: &Path) -> Output {
    nopstream(
        &[
            "savepoint",
            "promote",
            &job.display().to_string(),
            "--work-dir",
            &work.display().to_string(),
            "--out",
            &out.display().to_string(),
        ],
        None,
    )
}

/// Runs the job at `p` with 50 ms epochs, crashes it after the second durable epoch, and
/// promotes that epoch to a savepoint; returns the directories and the savepoint.
fn savepoint_mid_run(job: &Path, p: u32) -> (Dirs, PathBuf) {
    let d = dirs();
    let ps = p.to_string();
    let o = run(
        job,
        &d,
        &["-p", &ps, "--checkpoint-interval-ms", "50"],
        Some("after-manifest-publish=2"),
    );
    assert!(!o.status.success(), "the failpoint fired: {}", text(&o));
    let sp = d.work.join("sp");
    let o = promote(job, &d.work, &sp);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("epoch 2"), "{}", text(&o));
    (d, sp)
}

/// Starts `job` at parallelism 2 with 200 ms epochs (its output piped) and returns once it
/// serves its control socket and has run for a moment.
fn running(job: &Path, d: &Dirs) -> std::process::Child {
    let child = Command::new(BIN)
        .args(["run", "--no-progress", "--no-echo", "-p", "2"])
        .args(["--checkpoint-interval-ms", "200", "--output"])
        .arg(&d.out)
        .arg("--work-dir")
        .arg(&d.work)
        .arg(job)
        .env_remove("NOPSTREAM_FAILPOINTS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let sock = d.work.join("control.sock");
    let started = std::time::Instant::now();
    while !sock.exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no control socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(800));
    child
}

fn check(sp: &Path, job: &Path, d: &Dirs, extra: &[&str]) -> Output {
    let mut args = vec![
        "savepoint".to_owned(),
        "check".to_owned(),
        sp.display().to_string(),
        "--job".to_owned(),
        job.display().to_string(),
        "--work-dir".to_owned(),
        d.work.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    nopstream(&args, None)
}

#[test]
fn a_mid_run_savepoint_restores_at_other_parallelisms_with_the_uninterrupted_output() {
    let j = job("rescale", |t| t);
    let reference = uninterrupted(&j.0);
    assert_eq!(reference.len(), 16, "one line per carrier");
    for (from, to) in [(2, 3), (4, 2), (1, 4)] {
        let (d, sp) = savepoint_mid_run(&j.0, from);
        let tp = to.to_string();
        let o = check(&sp, &j.0, &d, &["-p", &tp]);
        let report = text(&o);
        assert_eq!(o.status.code(), Some(0), "{from}->{to}: {report}");
        assert!(report.contains("PARALLELISM_CHANGED"), "{report}");
        assert!(report.contains("verdict COMPATIBLE (exit 0)"), "{report}");
        let json = check(&sp, &j.0, &d, &["-p", &tp, "--format", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(v["format"], "nopstream.compat-report/v1");
        assert_eq!(v["verdict"], "compatible");
        // The last restore names the savepoint by a path relative to the working
        // directory, as `nopstream savepoints` prints them. Before, a relative path was
        // taken as a name under the work directory's `savepoints/`: "no such directory".
        let sp_dir = if to == 4 {
            relative_to_cwd(&sp).display().to_string()
        } else {
            sp.display().to_string()
        };
        let o = run(&j.0, &d, &["-p", &tp, "--from-savepoint", &sp_dir], None);
        assert!(o.status.success(), "{from}->{to}: {}", text(&o));
        assert!(text(&o).contains("restoring savepoint"), "{}", text(&o));
        assert_eq!(committed(&d.out), reference, "restored {from}->{to}");
    }
}

/// `path` (absolute) as a path relative to this process's working directory.
fn relative_to_cwd(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap();
    let up = cwd.components().count() - 1;
    let rel: PathBuf = std::iter::repeat_n(std::path::Component::ParentDir, up)
        .map(|c| c.as_os_str().to_owned())
        .chain(
            path.strip_prefix("/")
                .unwrap()
                .iter()
                .map(ToOwned::to_owned),
        )
        .collect();
    assert!(rel.is_relative() && rel.is_dir(), "{}", rel.display());
    rel
}

#[test]
fn a_key_spec_change_is_refused_and_nothing_is_touched() {
    let j = job("base", |t| t);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    let by_origin = job("origin", |t| {
        t.replace(
            r#"config = { key = "carrier", fields = ["carrier", "dep_delay"] }"#,
            r#"config = { key = "origin", fields = ["carrier", "dep_delay"] }"#,
        )
    });
    let before_sp = snapshot(&sp);
    let before_out = snapshot(&d.out);
    let o = check(&sp, &by_origin.0, &d, &[]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(3), "{report}");
    assert!(report.contains("KEY_SPEC_CHANGED"), "{report}");
    assert!(report.contains("verdict INCOMPATIBLE (exit 3)"), "{report}");
    let sp_dir = sp.display().to_string();
    let o = run(&by_origin.0, &d, &["--from-savepoint", &sp_dir], None);
    assert_eq!(o.status.code(), Some(3), "run refuses: {}", text(&o));
    assert!(!text(&o).contains("restoring savepoint"), "{}", text(&o));
    assert_eq!(snapshot(&sp), before_sp, "the savepoint is byte-unchanged");
    assert_eq!(snapshot(&d.out), before_out, "no task ran");
}

/// Writes `WORK/actions.toml` dropping all state of `operators/per-carrier`; its path.
fn drop_per_carrier_state(d: &Dirs) -> String {
    let actions = d.work.join("actions.toml");
    std::fs::write(
        &actions,
        "[[action]]\nkind = \"drop-state\"\noperator = \"operators/per-carrier\"\n",
    )
    .unwrap();
    actions.display().to_string()
}

/// Before: a mistyped savepoint path was created as an empty directory, then reported as
/// "not a savepoint".
#[test]
fn a_savepoint_path_that_does_not_exist_is_named_and_not_created() {
    let j = job("typo", |t| t);
    let d = dirs();
    let typo = d._tmp.path().join("no-such/sp");
    let o = check(&typo, &j.0, &d, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("savepoint {}: no such directory", typo.display())),
        "{}",
        text(&o)
    );
    let sp = typo.display().to_string();
    let o = run(&j.0, &d, &["--from-savepoint", &sp], None);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("no such directory"), "{}", text(&o));
    assert!(
        !d._tmp.path().join("no-such").exists(),
        "nothing was created"
    );
}

/// Before the state layout was recorded, adding an aggregate passed the check as
/// COMPATIBLE and the restored run failed at its first key, unable to read the stored
/// accumulators. Now the check refuses it, and dropping the operator's state clears it.
#[test]
fn an_added_aggregate_is_a_state_layout_change_that_only_drop_state_clears() {
    let j = job("layout", |t| t);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    let extra = job("layout-extra", |t| {
        let last = r#"{ name = "avg_dep_delay_min", fn = "avg", field = "dep_delay" },"#;
        assert!(t.contains(last));
        t.replace(
            last,
            &format!(
                "{last}\n    {{ name = \"max_dep_delay\", fn = \"max\", field = \"dep_delay\" }},"
            ),
        )
    });
    let before_sp = snapshot(&sp);
    let o = check(&sp, &extra.0, &d, &[]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(3), "{report}");
    assert!(report.contains("STATE_LAYOUT_CHANGED"), "{report}");
    assert!(
        report.contains("keyed-aggregate aggregates,key_field"),
        "the finding names the properties: {report}"
    );
    assert!(report.contains("-> drop-state"), "{report}");
    let sp_dir = sp.display().to_string();
    let o = run(&extra.0, &d, &["--from-savepoint", &sp_dir], None);
    assert_eq!(o.status.code(), Some(3), "run refuses: {}", text(&o));
    assert_eq!(snapshot(&sp), before_sp, "the savepoint is byte-unchanged");
    // A Delta making the same change is refused the same way (before, it was labelled
    // state-affecting and went ahead).
    let delta = d.work.join("d.toml");
    std::fs::write(
        &delta,
        "[node.per-carrier]\nconfig = { aggregates = [{ name = \"flights\", fn = \"count\" }] }\n",
    )
    .unwrap();
    let o = run(&j.0, &d, &["--delta", &delta.display().to_string()], None);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains("operator.per-carrier.config (state-affecting)"),
        "{t}"
    );
    assert!(t.contains("STATE_LAYOUT_CHANGED"), "{t}");
    // The job it was taken with still passes.
    let o = check(&sp, &j.0, &d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Dropping the operator's state clears it, and the restored job runs with the new
    // aggregate from empty state.
    let a = drop_per_carrier_state(&d);
    let o = check(&sp, &extra.0, &d, &["--actions", &a]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let restored = Dirs {
        out: d._tmp.path().join("restored-out"),
        work: d.work.clone(),
        _tmp: tempfile::tempdir().unwrap(),
    };
    let o = run(
        &extra.0,
        &restored,
        &["--from-savepoint", &sp_dir, "--actions", &a],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let lines = committed(&restored.out);
    let mut carriers = std::collections::BTreeSet::new();
    let mut flights = 0;
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v.get("max_dep_delay").is_some(), "{l}");
        assert!(
            carriers.insert(v["carrier"].to_string()),
            "one line per carrier: {l}"
        );
        flights += v["flights"].as_u64().unwrap();
    }
    // The flights counted before the savepoint were dropped with the state.
    assert!(
        flights > 0 && flights < 336_776,
        "{flights} flights after the savepoint"
    );
}

#[test]
fn a_removed_stateful_operator_needs_drop_state_and_its_state_is_gone_after() {
    let j = job("full", |t| t);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    // The same job without the aggregate: parse feeds the sink directly.
    let without = job("without", |t| {
        let start = t.find("[[operator]]\nname = \"per-carrier\"").unwrap();
        let end = t.find("[[sink]]").unwrap();
        format!("{}{}", &t[..start], &t[end..])
            .replace("inputs = [\"per-carrier\"]", "inputs = [\"parse\"]")
    });
    let o = check(&sp, &without.0, &d, &[]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(2), "{report}");
    assert!(report.contains("STATEFUL_OPERATOR_REMOVED"), "{report}");
    assert!(report.contains("drop-state | rename-operator"), "{report}");
    // An action that clears nothing is an error (exit 1), not a pass.
    let typo = d.work.join("typo.toml");
    std::fs::write(
        &typo,
        "[[action]]\nkind = \"drop-state\"\noperator = \"operators/per-carier\"\n",
    )
    .unwrap();
    let o = check(
        &sp,
        &without.0,
        &d,
        &["--actions", &typo.display().to_string()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("clears no finding"), "{}", text(&o));
    // The right action clears it; the job runs from the savepoint.
    let a = drop_per_carrier_state(&d);
    let o = check(&sp, &without.0, &d, &["--actions", &a]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let fresh_out = dirs();
    let sp_dir = sp.display().to_string();
    let o = Command::new(BIN)
        .args([
            "run",
            "--no-progress",
            "--no-echo",
            "--from-savepoint",
            &sp_dir,
        ])
        .args(["--actions", &a, "--checkpoint-interval-ms", "50"])
        .arg("--output")
        .arg(&fresh_out.out)
        .arg("--work-dir")
        .arg(&d.work)
        .arg(&without.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The next savepoint of the job holds no state of the dropped operator.
    let sp2 = d.work.join("sp2");
    let o = nopstream(
        &[
            "savepoint",
            "promote",
            &without.0.display().to_string(),
            "--work-dir",
            &d.work.display().to_string(),
            "--out",
            &sp2.display().to_string(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let manifests: Vec<_> = std::fs::read_dir(sp2.join("manifests"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(manifests.len(), 1);
    // Every `operator_id` the manifest names, wherever it sits (segments, operator state).
    fn operator_ids(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("operator_id", serde_json::Value::String(s)) => out.push(s.clone()),
                        _ => operator_ids(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| operator_ids(v, out)),
            _ => {}
        }
    }
    let mut ids = Vec::new();
    operator_ids(&serde_json::from_str(&manifests[0]).unwrap(), &mut ids);
    assert!(!ids.is_empty(), "the manifest names operators");
    assert!(
        !ids.iter().any(|id| id == "operators/per-carrier"),
        "the dropped operator's state is gone: {ids:?}"
    );
    assert!(
        manifests[0].contains("\"meta\""),
        "the new savepoint records its job"
    );
}

/// source -> probe (appends its version to each line) -> sink, one line per departure.
/// A fresh plugin directory holding built test plugins: `(artifact stem, name@version)`.
fn plugin_dir(plugins: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (file, reference) in plugins {
        std::fs::copy(
            Path::new(nop_stream_artifacts::PLUGIN_DIR).join(format!("{file}.wasm")),
            dir.path().join(format!("{reference}.wasm")),
        )
        .unwrap();
    }
    dir
}

/// Runs `job` with the plugins in `pdir` (and `extra` run flags) at 50 ms epochs, crashes it
/// right after its second durable epoch, and promotes that epoch to `<work>/sp`.
fn crash_and_promote(pdir: &str, job: &Path, d: &Dirs, extra: &[&str]) -> PathBuf {
    let (out, work, js) = (
        d.out.display().to_string(),
        d.work.display().to_string(),
        job.display().to_string(),
    );
    let mut args = vec!["--plugins", pdir, "run", "--no-progress", "--no-echo"];
    args.extend_from_slice(extra);
    args.extend([
        "--output",
        &out,
        "--work-dir",
        &work,
        "--checkpoint-interval-ms",
        "50",
        &js,
    ]);
    let o = nopstream(
        &args,
        Some(("NOPSTREAM_FAILPOINTS", "after-manifest-publish=2")),
    );
    assert!(!o.status.success(), "the failpoint fired: {}", text(&o));
    let sp = d.work.join("sp");
    let sps = sp.display().to_string();
    let o = nopstream(
        &[
            "--plugins",
            pdir,
            "savepoint",
            "promote",
            &js,
            "--work-dir",
            &work,
            "--out",
            &sps,
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    sp
}

fn probe_job(tag: &str, version: &str) -> JobFile {
    job(tag, |t| {
        let start = t.find("[[operator]]").unwrap();
        let end = t.find("[[sink]]").unwrap();
        format!(
            "{}[[operator]]\nname = \"stamp\"\nplugin = \"probe@{version}\"\ninputs = [\"flights\"]\n\n{}",
            &t[..start],
            &t[end..]
        )
        .replace("inputs = [\"per-carrier\"]", "inputs = [\"stamp\"]")
        .replace("name = \"flights-per-carrier\"", "name = \"flights-stamped\"")
    })
}

#[test]
fn a_logic_only_swap_restores_and_output_after_the_savepoint_follows_the_new_version() {
    // Both versions of `probe` side by side on a plugin path.
    let plugins = plugin_dir(&[("probe_v1", "probe@0.1.0"), ("probe_v2", "probe@0.2.0")]);
    let pdir = plugins.path().display().to_string();
    let v1 = probe_job("probe1", "0.1.0");
    let v2 = probe_job("probe2", "0.2.0");
    let d = dirs();
    let out = d.out.display().to_string();
    let work = d.work.display().to_string();
    let base = [
        "--plugins",
        &pdir,
        "run",
        "--no-progress",
        "--no-echo",
        "--output",
        &out,
    ];
    let sp = crash_and_promote(&pdir, &v1.0, &d, &[]);
    let sps = sp.display().to_string();
    let v2s = v2.0.display().to_string();
    let o = nopstream(
        &[
            "--plugins",
            &pdir,
            "savepoint",
            "check",
            &sps,
            "--job",
            &v2s,
            "--work-dir",
            &work,
        ],
        None,
    );
    let report = text(&o);
    assert_eq!(o.status.code(), Some(0), "{report}");
    assert!(
        report.contains("PLUGIN_LOGIC_CHANGED probe@0.1.0 sha256")
            && report.contains("-> probe@0.2.0 sha256"),
        "{report}"
    );
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["--work-dir", &work, "--from-savepoint", &sps, &v2s]);
    let o = nopstream(&args, None);
    assert!(o.status.success(), "{}", text(&o));
    let lines = committed(&d.out);
    assert_eq!(lines.len(), 336_776, "every departure once");
    let stems: std::collections::BTreeSet<&str> = lines
        .iter()
        .map(|l| l.rsplit_once(' ').unwrap().0)
        .collect();
    assert_eq!(stems.len(), lines.len(), "no line twice");
    let old = lines.iter().filter(|l| l.ends_with(" v0.1.0")).count();
    let new = lines.iter().filter(|l| l.ends_with(" v0.2.0")).count();
    assert_eq!(old + new, lines.len());
    assert!(
        old > 0 && new > 0,
        "before the savepoint v1 ({old} lines), after it v2 ({new} lines)"
    );
}

#[test]
fn a_savepoint_taken_from_a_running_job_restores_with_the_uninterrupted_output() {
    let reference = uninterrupted(&job("take-ref", |t| t).0);
    // Throttled to about 4 s, so it is running when the savepoint is asked for.
    let j = job("take", |t| {
        t.replace(
            "config = { path = \"/input/",
            "config = { max_records_per_second = 40000, path = \"/input/",
        )
    });
    let d = dirs();
    let mut child = running(&j.0, &d);
    let sp = d.work.join("taken");
    let o = nopstream(
        &[
            "savepoint",
            "take",
            &j.0.display().to_string(),
            "--work-dir",
            &d.work.display().to_string(),
            "--out",
            &sp.display().to_string(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(sp.join("savepoint.json").is_file());
    child.kill().unwrap();
    child.wait().unwrap();
    // Restored elsewhere at parallelism 3: the savepoint is self-contained.
    let elsewhere = dirs();
    let o = run(
        &j.0,
        &elsewhere,
        &["-p", "3", "--from-savepoint", &sp.display().to_string()],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(committed(&elsewhere.out), reference);
    // A job that is not running has no control socket: a clear refusal.
    let o = nopstream(
        &[
            "savepoint",
            "take",
            &j.0.display().to_string(),
            "--work-dir",
            &dirs().work.display().to_string(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("no job is running with work directory"),
        "{}",
        text(&o)
    );
}

#[test]
fn stop_with_a_savepoint_commits_it_stops_and_a_restart_completes_the_exact_output() {
    let reference = uninterrupted(&job_from("flights-per-record.toml", "stop-ref", |t| t).0);
    let j = job_from("flights-per-record.toml", "stop", |t| {
        t.replace(
            "config = { path = \"/input/",
            "config = { max_records_per_second = 40000, path = \"/input/",
        )
    });
    let d = dirs();
    let child = running(&j.0, &d);
    // Without --savepoint: refused as a usage error, the job runs on.
    let o = nopstream(
        &[
            "stop",
            &j.0.display().to_string(),
            "--work-dir",
            &d.work.display().to_string(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("pass --savepoint"), "{}", text(&o));
    let sp = d.work.join("stopped");
    let o = nopstream(
        &[
            "stop",
            &j.0.display().to_string(),
            "--savepoint",
            "--work-dir",
            &d.work.display().to_string(),
            "--out",
            &sp.display().to_string(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("stopped with a savepoint at epoch"),
        "{}",
        text(&o)
    );
    // The stop returns once the job stopped: the run ends on its own, successfully,
    // before its input was read through.
    let run_out = child.wait_with_output().unwrap();
    assert!(run_out.status.success(), "{}", text(&run_out));
    assert!(
        text(&run_out).contains("stopped with a savepoint"),
        "{}",
        text(&run_out)
    );
    let partial = committed(&d.out);
    assert!(
        !partial.is_empty() && partial.len() < reference.len(),
        "stopped mid-run: {} of {} lines",
        partial.len(),
        reference.len()
    );
    // Everything committed is in the reference, once: the savepoint's epoch was committed
    // before the stop, nothing after it.
    let mut r = reference.iter().peekable();
    for l in &partial {
        while r.next_if(|x| *x < l).is_some() {}
        assert_eq!(r.next(), Some(l), "committed once and in the reference");
    }
    // Restored from the savepoint at parallelism 3, with a new work directory, into a
    // copy of the output the stopped run committed: the whole output, nothing twice.
    let elsewhere = dirs();
    std::fs::create_dir_all(&elsewhere.out).unwrap();
    for e in std::fs::read_dir(&d.out).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, elsewhere.out.join(p.file_name().unwrap())).unwrap();
        }
    }
    let o = run(
        &j.0,
        &elsewhere,
        &["-p", "3", "--from-savepoint", &sp.display().to_string()],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(committed(&elsewhere.out), reference);
    // A plain restart in place resumes from the savepoint's epoch: the stopped run's
    // output plus the rest equals the uninterrupted run, nothing twice.
    let o = run(&j.0, &d, &["-p", "2"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("resumed from"), "{}", text(&o));
    assert_eq!(committed(&d.out), reference);
}

#[test]
fn a_namespace_that_went_on_goes_back_to_a_savepoint_only_with_fresh() {
    let j = job("advanced", |t| t);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    // The job goes on to its end in place: its namespace is past the savepoint.
    let o = run(
        &j.0,
        &d,
        &["-p", "2", "--checkpoint-interval-ms", "50"],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        &j.0,
        &d,
        &["--from-savepoint", &sp.display().to_string()],
        None,
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("NAMESPACE_ADVANCED"), "{}", text(&o));
    assert!(text(&o).contains("add --fresh"), "{}", text(&o));
    // `fork` restores it as another pipeline lineage: a new namespace and new transaction
    // ids, into another output directory, leaving the job's own checkpoints alone.
    let reference = committed(&d.out);
    let checkpoints = d.work.join("checkpoints");
    let before = snapshot(&checkpoints);
    let fork = d.work.join("fork.toml");
    std::fs::write(
        &fork,
        "[[action]]\nkind = \"fork\"\nnamespace = \"replay\"\n",
    )
    .unwrap();
    let forked_out = dirs();
    let fork_run = || {
        Command::new(BIN)
            .args(["run", "--no-progress", "--no-echo", "--from-savepoint"])
            .arg(&sp)
            .arg("--actions")
            .arg(&fork)
            .arg("--output")
            .arg(&forked_out.out)
            .arg("--work-dir")
            .arg(&d.work)
            .arg(&j.0)
            .env_remove("NOPSTREAM_FAILPOINTS")
            .output()
            .unwrap()
    };
    let o = fork_run();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("forking into pipeline lineage `replay`"),
        "{}",
        text(&o)
    );
    assert_eq!(
        committed(&forked_out.out),
        reference,
        "the forked run's output"
    );
    let after = snapshot(&checkpoints);
    for (path, bytes) in &before {
        assert!(
            after.iter().any(|(p, b)| p == path && b == bytes),
            "{} is untouched by the fork",
            path.display()
        );
    }
    assert!(
        after
            .iter()
            .any(|(p, _)| p.to_string_lossy().contains("flights-per-carrier.replay")),
        "the fork has its own namespace"
    );
    // A second fork into the same, now used, namespace is refused.
    let o = fork_run();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("already holds checkpoints"),
        "{}",
        text(&o)
    );
    // `--fresh` goes back in place (same work directory and namespace). Its output goes
    // to a new directory: the sink's transaction ids repeat the epochs the namespace
    // already committed, and the file sink refuses to overwrite a committed file (which of
    // them collide depends on how many epochs each run took).
    let fresh = Dirs {
        out: d.work.join("fresh-out"),
        work: d.work.clone(),
        _tmp: tempfile::tempdir().unwrap(),
    };
    let o = run(
        &j.0,
        &fresh,
        &["--fresh", "--from-savepoint", &sp.display().to_string()],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("resumed from     epoch 2"),
        "{}",
        text(&o)
    );
    // What it committed after the savepoint's epoch is in the reference, once.
    let after_sp = committed(&fresh.out);
    let mut r = reference.iter().peekable();
    for l in &after_sp {
        while r.next_if(|x| *x < l).is_some() {}
        assert_eq!(r.next(), Some(l), "committed once and in the reference");
    }
    // Default savepoint names never collide: the second promotion of the same epoch
    // number gets its own directory.
    let promote = || {
        let o = nopstream(
            &[
                "savepoint",
                "promote",
                &j.0.display().to_string(),
                "--work-dir",
                &d.work.display().to_string(),
            ],
            None,
        );
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let first = promote();
    let second = promote();
    assert_ne!(first, second);
    assert!(second.contains("-2"), "{second}");
}

fn migrate(sp: &Path, job: &Path, d: &Dirs, actions: Option<&Path>, out: &Path) -> Output {
    migrate_with(sp, job, d, actions, out, None)
}

fn migrate_with(
    sp: &Path,
    job: &Path,
    d: &Dirs,
    actions: Option<&Path>,
    out: &Path,
    failpoint: Option<&str>,
) -> Output {
    let mut args = vec![
        "savepoint".to_owned(),
        "migrate".to_owned(),
        sp.display().to_string(),
        "--job".to_owned(),
        job.display().to_string(),
        "--work-dir".to_owned(),
        d.work.display().to_string(),
        "--out".to_owned(),
        out.display().to_string(),
    ];
    if let Some(a) = actions {
        args.extend(["--actions".to_owned(), a.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    nopstream(&args, failpoint.map(|f| ("NOPSTREAM_FAILPOINTS", f)))
}

/// The segment files of a savepoint, by path relative to it, with their bytes.
fn segments_of(sp: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    snapshot(&sp.join("segments"))
        .into_iter()
        .map(|(p, b)| (p.strip_prefix(sp).unwrap().to_owned(), b))
        .collect()
}

#[test]
fn a_reshard_migration_writes_a_new_savepoint_that_restores_exactly_and_leaves_the_old_one_untouched()
 {
    let j = job("reshard-from", |t| t);
    let reference = uninterrupted(&j.0);
    assert_eq!(reference.len(), 16, "one line per carrier");
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    let before = snapshot(&sp);
    let j4 = job("reshard-to", |t| {
        t.replace("state_shards = 128", "state_shards = 4")
    });

    // 128 -> 4 shards needs an explicit reshard, and migrate writes nothing without it.
    let o = check(&sp, &j4.0, &d, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("SHARD_COUNT_CHANGED"), "{}", text(&o));
    let sp2 = d.work.join("sp-4");
    let o = migrate(&sp, &j4.0, &d, None, &sp2);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("nothing written"), "{}", text(&o));
    assert!(!sp2.exists());
    // A reshard to another count clears nothing: a usage error, nothing written.
    let wrong = d.work.join("wrong.toml");
    std::fs::write(&wrong, "[[action]]\nkind = \"reshard\"\nshards = 8\n").unwrap();
    let o = migrate(&sp, &j4.0, &d, Some(&wrong), &sp2);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("clears no finding"), "{}", text(&o));
    assert!(!sp2.exists());

    let actions = d.work.join("reshard.toml");
    std::fs::write(&actions, "[[action]]\nkind = \"reshard\"\nshards = 4\n").unwrap();
    // Killed at each step of writing SP2 (the resharded segment file, the manifest, the
    // epoch record, savepoint.json): SP is untouched and there is no savepoint at SP2 (a
    // savepoint is a prefix of objects whose savepoint.json is written last).
    for n in 1..=4 {
        let fp = format!("savepoint-write={n}");
        let o = migrate_with(&sp, &j4.0, &d, Some(&actions), &sp2, Some(&fp));
        assert!(!o.status.success(), "{fp}: {}", text(&o));
        assert_eq!(o.status.code(), None, "{fp} aborts: {}", text(&o));
        assert_eq!(
            snapshot(&sp),
            before,
            "{fp}: the parent savepoint is untouched"
        );
        assert!(
            !sp2.join("savepoint.json").exists(),
            "{fp}: no savepoint at SP2"
        );
        let o = check(&sp2, &j4.0, &d, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("is not a savepoint"), "{}", text(&o));
    }
    let o = migrate(&sp, &j4.0, &d, Some(&actions), &sp2);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("migrated from"), "{}", text(&o));
    assert_eq!(snapshot(&sp), before, "the parent savepoint is untouched");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sp2.join("savepoint.json")).unwrap()).unwrap();
    assert_eq!(info["parent"], sp.display().to_string());
    assert_eq!(info["actions"], serde_json::json!(["reshard 4"]));
    // The same migration again gives byte-identical segments.
    let sp2b = d.work.join("sp-4b");
    let o = migrate(&sp, &j4.0, &d, Some(&actions), &sp2b);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(segments_of(&sp2), segments_of(&sp2b));
    // A second migrate into an existing directory is refused.
    let o = migrate(&sp, &j4.0, &d, Some(&actions), &sp2);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));

    // The new savepoint is compatible with the 4-shard job with no action ...
    let o = check(&sp2, &j4.0, &d, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("SHARD_COUNT_CHANGED"), "{}", text(&o));
    // ... and restores at every parallelism up to the shard count with the uninterrupted
    // output.
    let sp2_dir = sp2.display().to_string();
    for p in ["1", "3", "4"] {
        let r = dirs();
        let o = run(&j4.0, &r, &["-p", p, "--from-savepoint", &sp2_dir], None);
        assert!(o.status.success(), "p={p}: {}", text(&o));
        assert!(text(&o).contains("restoring savepoint"), "{}", text(&o));
        assert_eq!(committed(&r.out), reference, "restored at p={p}");
    }
    // Beyond the shard count a keyed operator is refused when the job is read.
    let o = check(&sp2, &j4.0, &d, &["-p", "5"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("state_shards = 4 is less than the parallelism 5"),
        "{}",
        text(&o)
    );
    // The reshard also applies on restore, straight from the old savepoint.
    let r = dirs();
    let sp_dir = sp.display().to_string();
    let a = actions.display().to_string();
    let o = run(
        &j4.0,
        &r,
        &["-p", "3", "--from-savepoint", &sp_dir, "--actions", &a],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(committed(&r.out), reference, "restored with the action");
    assert_eq!(snapshot(&sp), before, "the parent savepoint is untouched");
}

/// Savepoints of every on-disk format so far, committed under `tests/fixtures/savepoints`
/// (written by `scripts/make-savepoint-fixture.sh`, each with the job file it was taken
/// with), restore with this host: the check is compatible (a rebuilt component shows as
/// `PLUGIN_LOGIC_CHANGED` with both sha256s, nothing else may differ) and the restored run
/// at another parallelism (3, or the fixture's `parallelism` file) commits exactly the
/// uninterrupted run's output.
#[test]
fn committed_savepoint_fixtures_restore_with_this_host() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/savepoints");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("savepoint.json").is_file())
        .collect();
    fixtures.sort();
    assert!(!fixtures.is_empty(), "no fixture under {}", root.display());
    for fx in fixtures {
        let name = fx.file_name().unwrap().to_string_lossy().into_owned();
        let job_text = std::fs::read_to_string(fx.join("job.toml")).unwrap();
        let j = job(&format!("fixture-{name}"), |_| job_text.clone());
        let reference = {
            let d = dirs();
            let o = run(&j.0, &d, &["-p", "2"], None);
            assert!(o.status.success(), "{name}: {}", text(&o));
            committed(&d.out)
        };
        assert!(!reference.is_empty(), "{name}: the job commits output");
        let d = dirs();
        let sp = d.work.join("fixture");
        copy_dir(&fx, &sp);
        // The parallelism to restore at: 3, or the fixture's `parallelism` file.
        let p = std::fs::read_to_string(fx.join("parallelism"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "3".into());
        let o = check(&sp, &j.0, &d, &["-p", &p, "--format", "json"]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["verdict"], "compatible", "{name}: {report}");
        for op in report["operators"].as_array().unwrap() {
            for f in op["findings"].as_array().unwrap() {
                let code = f["code"].as_str().unwrap();
                assert!(
                    ["PLUGIN_LOGIC_CHANGED", "PARALLELISM_CHANGED"].contains(&code),
                    "{name}: unexpected finding {f}"
                );
                if code == "PLUGIN_LOGIC_CHANGED" {
                    assert_ne!(f["old"], f["new"], "{name}: the sha256 change is shown");
                }
            }
        }
        let sp_dir = sp.display().to_string();
        let o = run(&j.0, &d, &["-p", &p, "--from-savepoint", &sp_dir], None);
        assert!(o.status.success(), "{name}: {}", text(&o));
        assert!(text(&o).contains("restoring savepoint"), "{}", text(&o));
        assert_eq!(committed(&d.out), reference, "{name}: restored output");
    }
}

/// The flights job with `tally@VERSION` counting departures per carrier.
fn tally_job(tag: &str, version: &str) -> JobFile {
    job(tag, |t| {
        let start = t.find("[[operator]]\nname = \"per-carrier\"").unwrap();
        let end = t.find("[[sink]]").unwrap();
        format!(
            "{}[[operator]]\nname = \"per-carrier\"\nplugin = \"tally@{version}\"\n\
             inputs = [{{ from = \"parse\", partition = \"hash\" }}]\n\n{}",
            &t[..start],
            &t[end..]
        )
    })
}

/// Departures per carrier, counted from the CSV itself (an independent expectation).
fn departures_per_carrier() -> std::collections::BTreeMap<String, u64> {
    let csv = std::fs::read_to_string(repo().join("examples/flights/data/flights.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "carrier").unwrap();
    let mut out = std::collections::BTreeMap::new();
    for l in lines {
        let carrier = l.split(',').nth(col).unwrap().trim_matches('"').to_owned();
        *out.entry(carrier).or_default() += 1;
    }
    out
}

/// A swap with a schema bump (design §10.6): tally v1 -> v2 changes the schema of state `count`.
/// The check needs action (exit 2) and the restore refuses; `savepoint migrate` with
/// `migrate-state` runs v2's migration export into a new savepoint that checks compatible
/// with no action, and the restored run counts every departure exactly once.
#[test]
fn a_schema_bump_needs_migrate_state_and_the_migrated_savepoint_restores_exact_counts() {
    let plugins = plugin_dir(&[("tally_v1", "tally@0.1.0"), ("tally_v2", "tally@0.2.0")]);
    let pdir = plugins.path().display().to_string();
    let with_plugins = |args: &[&str], env: Option<(&str, &str)>| {
        let mut all = vec!["--plugins", pdir.as_str()];
        all.extend_from_slice(args);
        nopstream(&all, env)
    };
    let v1 = tally_job("tally1", "0.1.0");
    let v2 = tally_job("tally2", "0.2.0");
    let v2s = v2.0.display().to_string();
    let d = dirs();
    let (out, work) = (d.out.display().to_string(), d.work.display().to_string());
    let sp = crash_and_promote(&pdir, &v1.0, &d, &["-p", "2"]);
    let sps = sp.display().to_string();
    let before = snapshot(&sp);

    let o = with_plugins(
        &[
            "savepoint",
            "check",
            &sps,
            "--job",
            &v2s,
            "--work-dir",
            &work,
        ],
        None,
    );
    let report = text(&o);
    assert_eq!(o.status.code(), Some(2), "{report}");
    assert!(
        report.contains("STATE_SCHEMA_BUMPED count v1 -> v2  -> migrate-state | drop-state"),
        "{report}"
    );
    let o = with_plugins(
        &[
            "run",
            "--no-progress",
            "--no-echo",
            "--output",
            &out,
            "--work-dir",
            &work,
            "--from-savepoint",
            &sps,
            &v2s,
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "refused: {}", text(&o));

    let actions = d.work.join("migrate.toml");
    std::fs::write(
        &actions,
        "[[action]]\nkind = \"migrate-state\"\noperator = \"operators/per-carrier\"\nstate = \"count\"\n",
    )
    .unwrap();
    let a = actions.display().to_string();
    let sp2 = d.work.join("sp2");
    let sp2s = sp2.display().to_string();
    let o = with_plugins(
        &[
            "savepoint",
            "migrate",
            &sps,
            "--job",
            &v2s,
            "--work-dir",
            &work,
            "--actions",
            &a,
            "--out",
            &sp2s,
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(snapshot(&sp), before, "the parent savepoint is untouched");
    let o = with_plugins(
        &[
            "savepoint",
            "check",
            &sp2s,
            "--job",
            &v2s,
            "--work-dir",
            &work,
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("STATE_SCHEMA_BUMPED"), "{}", text(&o));

    let r = dirs();
    let (rout, rwork) = (r.out.display().to_string(), r.work.display().to_string());
    let o = with_plugins(
        &[
            "run",
            "--no-progress",
            "--no-echo",
            "-p",
            "3",
            "--output",
            &rout,
            "--work-dir",
            &rwork,
            "--from-savepoint",
            &sp2s,
            &v2s,
        ],
        None,
    );
    assert!(o.status.success(), "{}", text(&o));
    let expected: Vec<String> = departures_per_carrier()
        .into_iter()
        .map(|(c, n)| format!("{c} {n} v0.2.0"))
        .collect();
    let got = committed(&r.out);
    assert_eq!(got, expected, "every departure counted once, by v2");
}

#[test]
fn a_sink_swapped_while_transactions_are_pending_is_finalized_with_the_old_plugin() {
    // The per-record job crashes right after its second durable epoch, so epoch 2's
    // JSONL transactions are pending in the savepoint. The new job writes to
    // blackhole-sink instead: another sink protocol, which cannot commit them.
    let old = job_from("flights-per-record.toml", "finalize-old", |t| t);
    let reference = uninterrupted(&old.0);
    assert_eq!(reference.len(), 336_776);
    let (d, sp) = savepoint_mid_run(&old.0, 2);
    let before = committed(&d.out);
    let new = job_from("flights-per-record.toml", "finalize-new", |t| {
        t.replace(
            "plugin = \"jsonl-sink@0.1.0\"",
            "plugin = \"blackhole-sink@0.1.0\"",
        )
        .replace(
            "config = { dir = \"/output\", prefix = \"departures\" }",
            "config = { summary_dir = \"/output\" }",
        )
    });
    let o = check(&sp, &new.0, &d, &[]);
    assert_eq!(o.status.code(), Some(2), "needs action: {}", text(&o));
    assert!(
        text(&o).contains("SINK_PROTOCOL_CHANGED") && text(&o).contains("finalize-sink"),
        "{}",
        text(&o)
    );
    let spath = sp.display().to_string();
    let o = run(&new.0, &d, &["--from-savepoint", &spath], None);
    assert_eq!(o.status.code(), Some(2), "refused: {}", text(&o));
    assert_eq!(
        committed(&d.out),
        before,
        "a refused restore commits nothing"
    );

    let actions = d.work.join("finalize.toml");
    let write = |with: &str, job: &Path| {
        std::fs::write(
            &actions,
            format!(
                "[[action]]\nkind = \"finalize-sink\"\noperator = \"sinks/departures\"\n\
                 with = \"{with}\"\njob = \"{}\"\n",
                job.display()
            ),
        )
        .unwrap();
    };
    let apath = actions.display().to_string();
    let restore = [
        "--from-savepoint",
        spath.as_str(),
        "--actions",
        apath.as_str(),
    ];
    // The old job must use the plugin the action names.
    write("jsonl-sink@0.2.0", &old.0);
    let o = run(&new.0, &d, &restore, None);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("uses plugin jsonl-sink@0.1.0, not jsonl-sink@0.2.0"),
        "{}",
        text(&o)
    );
    assert_eq!(
        committed(&d.out),
        before,
        "nothing committed after a refusal"
    );

    write("jsonl-sink@0.1.0", &old.0);
    // An offline migration does not write to the sink's external system.
    let sp2 = d.work.join("sp2");
    let o = migrate(&sp, &new.0, &d, Some(&actions), &sp2);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("runs on `nopstream run --from-savepoint`") && !sp2.exists(),
        "{}",
        text(&o)
    );
    assert_eq!(committed(&d.out), before, "nothing committed by migrate");
    let o = run(&new.0, &d, &restore, None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("committed 2 pending transaction(s) of 2 subtask(s)"),
        "{}",
        text(&o)
    );
    // The JSONL output now holds epochs 1 and 2 (the finalized ones), each line once and
    // from the reference; blackhole-sink got exactly the rest, by count and checksum.
    let jsonl = committed(&d.out);
    assert!(jsonl.len() > before.len(), "epoch 2 was committed");
    check_split_output(&jsonl, &reference, &d.out);
}

#[test]
fn a_delta_overlay_rescales_a_crashed_job_and_refuses_forbidden_or_unacknowledged_changes() {
    let j = job("delta", |t| t);
    let reference = uninterrupted(&j.0);
    assert_eq!(reference.len(), 16, "one line per carrier");
    // The job crashes right after its second durable epoch.
    let d = dirs();
    let o = run(
        &j.0,
        &d,
        &["-p", "2", "--checkpoint-interval-ms", "50"],
        Some("after-manifest-publish=2"),
    );
    assert!(!o.status.success(), "the failpoint fired: {}", text(&o));
    let checkpoints = d.work.join("checkpoints");
    let before = snapshot(&checkpoints);
    let delta = d.work.join("d.toml");
    let dpath = delta.display().to_string();

    // A forbidden field: refused before anything is touched, naming file and field.
    std::fs::write(&delta, "[job]\nname = \"renamed\"\n").unwrap();
    let o = run(&j.0, &d, &["--delta", &dpath], None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("d.toml") && text(&o).contains("job.name: forbidden in a Delta"),
        "{}",
        text(&o)
    );
    // A weaker semantic mode is state-affecting: the check needs accept-semantic-change.
    std::fs::write(&delta, "[job]\nsemantic = \"at-least-once\"\n").unwrap();
    let o = run(&j.0, &d, &["--delta", &dpath], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(
            "job.semantic (state-affecting): \"strict-exactly-once\" -> \"at-least-once\""
        ) && text(&o).contains("SEMANTIC_WEAKENED"),
        "{}",
        text(&o)
    );
    assert_eq!(
        snapshot(&checkpoints),
        before,
        "a refused delta leaves the checkpoints"
    );

    // A rescale and a new checkpoint interval: the latest epoch becomes a savepoint and the
    // patched job restores from it, with the uninterrupted run's output.
    std::fs::write(
        &delta,
        "[job]\nparallelism = 3\ncheckpoint_interval_ms = 100\n",
    )
    .unwrap();
    let o = run(&j.0, &d, &["--delta", &dpath], None);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("job.parallelism (rescale): 2 -> 3"), "{t}");
    assert!(
        t.contains("job.checkpoint_interval_ms (replan): (unset) -> 100"),
        "{t}"
    );
    assert!(t.contains("restoring savepoint"), "{t}");
    assert_eq!(committed(&d.out), reference, "restored 2->3 by a delta");
}

/// Pins a Delta that changes only the parser's `fields` (same `key`) being refused as
/// KEY_SPEC_CHANGED (exit 3, clearable only by dropping state): the check compared the
/// parser's whole config, not its key spec. It restores, with the uninterrupted output.
#[test]
fn a_delta_changing_only_the_parsers_fields_restores() {
    let j = job("fields", |t| t);
    let reference = uninterrupted(&j.0);
    let d = dirs();
    let o = run(
        &j.0,
        &d,
        &["-p", "2", "--checkpoint-interval-ms", "50"],
        Some("after-manifest-publish=2"),
    );
    assert!(!o.status.success(), "the failpoint fired: {}", text(&o));
    let delta = d.work.join("d.toml");
    std::fs::write(
        &delta,
        "[node.parse]\nconfig = { fields = [\"carrier\", \"dep_delay\", \"arr_delay\"] }\n",
    )
    .unwrap();
    let o = run(&j.0, &d, &["--delta", &delta.display().to_string()], None);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(!t.contains("KEY_SPEC_CHANGED"), "{t}");
    assert!(t.contains("operator.parse.config (state-affecting)"), "{t}");
    assert!(t.contains("restoring savepoint"), "{t}");
    assert_eq!(committed(&d.out), reference, "restored with the new fields");
}

/// Pins `savepoint check` failing with an error (exit 1) instead of a report when the job
/// names a component built for a WIT version the host does not serve, and `nopstream
/// plugins` listing such a component as "not a nop:stream component" without the version
/// it was built for.
#[test]
fn a_component_built_for_an_unserved_wit_version_is_a_finding_and_listed_with_its_version() {
    let j = job("wit", |t| t);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    let dir = d.work.join("old-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let built = Path::new(nop_stream_artifacts::PLUGIN_DIR).join("keyed_aggregate.wasm");
    let served = "0.2.2";
    let (bytes, n) =
        common::files::with_wit_version(&std::fs::read(built).unwrap(), served, "0.1.0");
    assert!(n >= 2, "the component names nop:stream interfaces ({n})");
    let old = dir.join("keyed-aggregate@0.1.0.wasm");
    std::fs::write(&old, bytes).unwrap();
    let plugins = dir.display().to_string();
    // By path: a named reference would pass over it to the bundled component.
    let by_path = job("wit-path", |t| {
        t.replace(
            "plugin = \"keyed-aggregate@0.1.0\"",
            &format!("plugin = \"{}\"", old.display()),
        )
    });

    let o = check(&sp, &by_path.0, &d, &[]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(3), "{report}");
    assert!(report.contains("operators/per-carrier"), "{report}");
    assert!(report.contains("WIT_NOT_SERVED"), "{report}");
    assert!(
        report.contains("built for nop:stream@0.1.0; this host serves nop:stream@0.2.2"),
        "{report}"
    );
    assert!(report.contains("verdict INCOMPATIBLE (exit 3)"), "{report}");
    let o = check(&sp, &by_path.0, &d, &["--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "incompatible");
    assert_eq!(v["operators"][0]["findings"][0]["code"], "WIT_NOT_SERVED");

    // Beside it, a truncated copy of a served component: listed with why it cannot load.
    let whole = std::fs::read(Path::new(nop_stream_artifacts::PLUGIN_DIR).join("keyed_count.wasm"))
        .unwrap();
    std::fs::write(dir.join("truncated.wasm"), &whole[..whole.len() / 2]).unwrap();
    let o = nopstream(&["plugins", "--plugins", &plugins], None);
    let listing = text(&o);
    let line_of = |file: &str| {
        listing
            .lines()
            .find(|l| l.contains(file))
            .unwrap_or_else(|| panic!("{file} not listed:\n{listing}"))
            .to_owned()
    };
    let line = line_of("keyed-aggregate@0.1.0.wasm");
    assert!(
        line.contains("built for nop:stream@0.1.0, which this host does not serve"),
        "{line}"
    );
    // It named no reason before ("not a nop:stream component", as for a component of no
    // world of ours); now wasmtime's.
    let line = line_of("truncated.wasm");
    assert!(line.contains("cannot be loaded: "), "{line}");
    assert!(!line.contains("not a nop:stream component"), "{line}");
}

/// The flights job with `opstate-probe` in place of the keyed aggregate.
fn probe_state_job(tag: &str) -> JobFile {
    job(tag, common::flights::probe_state_job_text)
}

/// Non-keyed operator state with a redistribution policy (design §10.5): a
/// savepoint of `opstate-probe` at p=2 restores at p=2 with every state as it was (the
/// per-subtask record counts of the `none` state add up to every record exactly once),
/// and at p=3 only with `drop-state` for the `none` state (the check says
/// `NON_KEYED_STATE_NOT_REDISTRIBUTABLE`, exit 2); there the split-registry and union
/// entries are each held by exactly one new subtask (their output equals the delayed
/// flights from the CSV, nothing lost or doubled) and every new subtask holds the
/// broadcast copy made at p=2.
#[test]
fn operator_state_is_redistributed_by_its_declared_policy_on_a_rescale() {
    let plugins = plugin_dir(&[("opstate_probe", "opstate-probe@0.1.0")]);
    let pdir = plugins.path().display().to_string();
    let with_plugins = |args: &[&str]| {
        let mut all = vec!["--plugins", pdir.as_str()];
        all.extend_from_slice(args);
        nopstream(&all, None)
    };
    let j = probe_state_job("opstate");
    let js = j.0.display().to_string();
    let d = dirs();
    let sp = crash_and_promote(&pdir, &j.0, &d, &["-p", "2"]);
    let sps = sp.display().to_string();
    let (split, union) = (
        common::flights::delayed_flights("S", 120),
        common::flights::delayed_flights("U", 300),
    );
    // The savepoint holds part of the split entries, spread over both subtasks (so the
    // restores below really redistribute stored entries).
    let manifest = std::fs::read_dir(sp.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let stored: Vec<u64> = m["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["operator_state"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["state"] == "split")
        .map(|s| s["entries"].as_u64().unwrap())
        .collect();
    assert_eq!(stored.len(), 2, "one split segment per old subtask");
    assert!(
        stored.iter().all(|n| *n > 0) && stored.iter().sum::<u64>() < split.len() as u64,
        "{stored:?} of {}",
        split.len()
    );
    assert!(
        split.len() > 1000 && union.len() > 100,
        "{} {}",
        split.len(),
        union.len()
    );
    let lines = |out: &Path, prefix: &str| -> Vec<String> {
        committed(out)
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    };
    let restore = |p: &str, actions: Option<&Path>| {
        let r = dirs();
        let (rout, rwork) = (r.out.display().to_string(), r.work.display().to_string());
        let mut args = vec![
            "run",
            "--no-progress",
            "--no-echo",
            "-p",
            p,
            "--output",
            &rout,
            "--work-dir",
            &rwork,
            "--from-savepoint",
            &sps,
        ];
        let a = actions.map(|a| a.display().to_string());
        if let Some(a) = &a {
            args.extend(["--actions", a.as_str()]);
        }
        args.push(&js);
        (with_plugins(&args), r)
    };

    // Same parallelism: every state as it was.
    let (o, r) = restore("2", None);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(lines(&r.out, "S "), split);
    assert_eq!(lines(&r.out, "U "), union);
    assert_eq!(lines(&r.out, "B "), vec!["B p2"; 2]);
    let records: u64 = lines(&r.out, "N ")
        .iter()
        .map(|l| l[2..].parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        records, 336_776,
        "every record counted once across the restore"
    );

    // Another parallelism: the `none` state needs drop-state.
    let o = with_plugins(&[
        "savepoint",
        "check",
        &sps,
        "--job",
        &js,
        "--work-dir",
        &d.work.display().to_string(),
        "-p",
        "3",
    ]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(2), "{report}");
    assert!(
        report.contains("NON_KEYED_STATE_NOT_REDISTRIBUTABLE none")
            && !report.contains("NON_KEYED_STATE_NOT_REDISTRIBUTABLE split"),
        "{report}"
    );
    let (o, _) = restore("3", None);
    assert_eq!(o.status.code(), Some(2), "refused: {}", text(&o));
    let actions = d.work.join("drop-none.toml");
    std::fs::write(
        &actions,
        "[[action]]\nkind = \"drop-state\"\noperator = \"operators/probe\"\nstate = \"none\"\n",
    )
    .unwrap();
    let (o, r) = restore("3", Some(&actions));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        lines(&r.out, "S "),
        split,
        "split entries: each exactly once"
    );
    assert_eq!(
        lines(&r.out, "U "),
        union,
        "union entries: each exactly once"
    );
    assert_eq!(
        lines(&r.out, "B "),
        vec!["B p2"; 3],
        "the p=2 broadcast copy"
    );
    assert_eq!(lines(&r.out, "N ").len(), 3);
}

/// A schema changed without a version bump (design §10.4): `tally@0.1.1` stores its count as
/// `i64` where 0.1.0 stored `u64`, both under schema version 1. The check derives each
/// state's layout from the plugin (`state-declarations`) and refuses the restore
/// (`STATE_SCHEMA_CHANGED`, exit 3) without touching the savepoint; `drop-state` clears it.
#[test]
fn a_state_retyped_without_a_schema_bump_is_refused() {
    let plugins = plugin_dir(&[
        ("tally_v1", "tally@0.1.0"),
        ("tally_retyped", "tally@0.1.1"),
    ]);
    let pdir = plugins.path().display().to_string();
    let v1 = tally_job("retype1", "0.1.0");
    let v11 = tally_job("retype2", "0.1.1");
    let d = dirs();
    let work = d.work.display().to_string();
    let sp = crash_and_promote(&pdir, &v1.0, &d, &["-p", "2"]);
    let sps = sp.display().to_string();
    let before = snapshot(&sp);
    let v11s = v11.0.display().to_string();
    let check = |extra: &[&str]| {
        let mut args = vec![
            "--plugins",
            &pdir,
            "savepoint",
            "check",
            &sps,
            "--job",
            &v11s,
            "--work-dir",
            &work,
        ];
        args.extend_from_slice(extra);
        nopstream(&args, None)
    };
    let o = check(&[]);
    let report = text(&o);
    assert_eq!(o.status.code(), Some(3), "{report}");
    assert!(
        report.contains("STATE_SCHEMA_CHANGED count v1 schema"),
        "{report}"
    );
    assert_eq!(snapshot(&sp), before, "the savepoint is untouched");
    let actions = d.work.join("drop.toml");
    std::fs::write(
        &actions,
        "[[action]]\nkind = \"drop-state\"\noperator = \"operators/per-carrier\"\nstate = \"count\"\n",
    )
    .unwrap();
    let o = check(&["--actions", &actions.display().to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The same plugin rebuilt (same layout) stays compatible.
    let v1s = v1.0.display().to_string();
    let o = nopstream(
        &[
            "--plugins",
            &pdir,
            "savepoint",
            "check",
            &sps,
            "--job",
            &v1s,
            "--work-dir",
            &work,
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_savepoint_of_an_incremental_chain_is_self_contained_and_a_reshard_folds_it() {
    // Incremental snapshots (design §5.5, §8.1): a promoted savepoint whose manifest lists
    // a chain (a full payload, then deltas) copies every file of the chain, so it restores
    // with the job's checkpoints gone; a reshard migration folds the chain into full
    // payloads, and that savepoint restores exactly too.
    let j = job("incr-chain", |t| t);
    let reference = uninterrupted(&j.0);
    assert_eq!(reference.len(), 16, "one line per carrier");
    let mut found = None;
    for n in 2..=10 {
        let d = dirs();
        let o = run(
            &j.0,
            &d,
            &["-p", "2", "--checkpoint-interval-ms", "50"],
            Some(&format!("after-manifest-publish={n}")),
        );
        if o.status.success() {
            break; // the job ended before epoch n
        }
        let sp = d.work.join("sp");
        let o = promote(&j.0, &d.work, &sp);
        assert!(o.status.success(), "{}", text(&o));
        let manifest = snapshot(&sp.join("manifests"))
            .into_iter()
            .map(|(_, b)| String::from_utf8(b).unwrap())
            .next()
            .unwrap();
        if manifest.contains("kv-delta/1") {
            found = Some((d, sp, manifest));
            break;
        }
    }
    let (d, sp, manifest) = found.expect("no savepoint at epochs 2..=10 held a delta");
    // Every file the manifest names is in the savepoint, older epochs' included.
    let v: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    let files: std::collections::BTreeSet<&str> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["segments"].as_array().unwrap())
        .map(|s| s["file"].as_str().unwrap())
        .collect();
    let epochs: std::collections::BTreeSet<&str> =
        files.iter().map(|f| f.split('/').nth(1).unwrap()).collect();
    assert!(epochs.len() > 1, "a chain spans epochs: {files:?}");
    for f in &files {
        assert!(sp.join(f).is_file(), "{f} is not in the savepoint");
    }
    // The job's own checkpoints go: the savepoint alone restores, at another parallelism.
    // The restored tasks go on with the chain they restored (its shards from two old
    // subtasks), so the crash after their second epoch restores chains that mix the old
    // layout's payloads with new deltas.
    std::fs::remove_dir_all(d.work.join("checkpoints")).unwrap();
    let sp_dir = sp.display().to_string();
    let r = dirs();
    let flags = ["-p", "3", "--checkpoint-interval-ms", "50"];
    let mut first = flags.to_vec();
    first.extend(["--from-savepoint", &sp_dir]);
    let o = run(&j.0, &r, &first, Some("after-manifest-publish=2"));
    assert!(!o.status.success(), "the failpoint fired: {}", text(&o));
    let o = run(&j.0, &r, &flags, None);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        committed(&r.out),
        reference,
        "restored from the chain at p=3, crashed, resumed"
    );

    let j4 = job("incr-chain-4", |t| {
        t.replace("state_shards = 128", "state_shards = 4")
    });
    let actions = d.work.join("reshard.toml");
    std::fs::write(&actions, "[[action]]\nkind = \"reshard\"\nshards = 4\n").unwrap();
    let sp2 = d.work.join("sp-4");
    let o = migrate(&sp, &j4.0, &d, Some(&actions), &sp2);
    assert!(o.status.success(), "{}", text(&o));
    let folded = snapshot(&sp2.join("manifests"))
        .into_iter()
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .next()
        .unwrap();
    assert!(
        !folded.contains("kv-delta/1"),
        "the reshard folded the chain"
    );
    let r = dirs();
    let sp2_dir = sp2.display().to_string();
    let o = run(&j4.0, &r, &["-p", "2", "--from-savepoint", &sp2_dir], None);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        committed(&r.out),
        reference,
        "restored from the folded chain"
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A way to damage one file of a savepoint.
type Damage<'a> = &'a dyn Fn(&Path);

/// Failure pinned: a savepoint with one segment byte flipped, or one segment deleted, was
/// reported COMPATIBLE and copied over the job's namespace before its checksum failed, so
/// the job's own healthy epoch was gone (and with a deleted segment the next plain run
/// started from zero). Now `savepoint check` reports SAVEPOINT_DAMAGED naming the file
/// (exit 3), `run --from-savepoint` refuses before touching anything, and a plain run then
/// resumes from the job's own checkpoint with the uninterrupted output.
#[test]
fn a_damaged_savepoint_is_found_before_anything_is_touched() {
    let j = job("damaged", |t| t);
    let reference = uninterrupted(&j.0);
    let (d, sp) = savepoint_mid_run(&j.0, 2);
    let segment = files_under(&sp)
        .into_iter()
        .filter(|p| p.extension().is_none_or(|x| x != "json"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .expect("the savepoint holds segment files");
    let rel = segment.strip_prefix(&sp).unwrap().to_owned();
    let name = segment.file_name().unwrap().to_string_lossy().into_owned();
    let checkpoints = d.work.join("checkpoints");
    let damages: [(&str, Damage); 2] = [
        ("a flipped byte", &|p: &Path| {
            let mut b = std::fs::read(p).unwrap();
            let mid = b.len() / 2;
            b[mid] ^= 0x40;
            std::fs::write(p, b).unwrap();
        }),
        ("a deleted segment", &|p: &Path| {
            std::fs::remove_file(p).unwrap()
        }),
    ];
    for (what, damage) in damages {
        let bad = d.work.join(format!("bad-{}", what.replace(' ', "-")));
        copy_dir(&sp, &bad);
        damage(&bad.join(&rel));
        let before_ns = snapshot(&checkpoints);
        let before_out = snapshot(&d.out);
        let o = check(&bad, &j.0, &d, &[]);
        let report = text(&o);
        assert_eq!(o.status.code(), Some(3), "{what}: {report}");
        assert!(report.contains("SAVEPOINT_DAMAGED"), "{what}: {report}");
        assert!(
            report.contains(&name),
            "{what}: the report names {name}: {report}"
        );
        let o = run(
            &j.0,
            &d,
            &["--from-savepoint", &bad.display().to_string()],
            None,
        );
        assert_eq!(
            o.status.code(),
            Some(3),
            "{what}: run refuses: {}",
            text(&o)
        );
        assert!(!text(&o).contains("restoring savepoint"), "{}", text(&o));
        assert_eq!(
            snapshot(&checkpoints),
            before_ns,
            "{what}: the job's namespace is untouched"
        );
        assert_eq!(snapshot(&d.out), before_out, "{what}: no task ran");
    }
    // The job's own epoch is intact: a plain run resumes from it and ends exact.
    let o = run(
        &j.0,
        &d,
        &["-p", "2", "--checkpoint-interval-ms", "50"],
        None,
    );
    assert!(text(&o).contains("resuming"), "{}", text(&o));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(committed(&d.out), reference);
}
