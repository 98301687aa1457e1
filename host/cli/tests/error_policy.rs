//! The operator error policy (`on_error`, docs/operations.md, "Error policy") through the real
//! `nopstream` binary: a flights CSV with a few corrupted lines, parsed by
//! `flights-mapper`, which reports `invalid-record` for exactly those lines. `fail` stops
//! at once naming the record and the error; `skip` commits every good record and counts
//! the bad ones; `dead-letter` commits the good records to one sink and the bad ones, with
//! their errors, to another, exactly once even under SIGKILLs.

mod common;

use common::kit::repo;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Data lines of the flights CSV (all of them: a run lasts long enough for several
/// durable epochs and commits before it ends, so kills land between them).
const LINES: usize = 336_776;
/// 1-based data lines that get a non-numeric `dep_delay` (column 6): `bad<line>`.
const BAD: [usize; 5] = [3, 50_000, 120_000, 250_000, 336_770];

/// The inputs every test shares: a corrupted CSV, the same CSV without the corrupted
/// lines, and what an uninterrupted run commits for the clean one.
struct Fixture {
    /// Directory holding `data/flights.csv` (corrupted) and `clean/flights.csv`.
    dir: PathBuf,
    /// The corrupted lines, in file order.
    bad_lines: Vec<String>,
    /// Committed output of the clean file (sorted): what the good records must produce.
    good: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(format!("error-policy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // The fixture lives as long as the test process and a static is never dropped, so
        // each run left ~1 GB behind: remove those of processes that have exited.
        for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("error-policy-")
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let file = std::fs::File::open(repo().join("examples/flights/data/flights.csv.zip"))
            .expect("the flights archive");
        let mut zip = zip::ZipArchive::new(file).unwrap();
        let mut csv = String::new();
        zip.by_name("flights.csv")
            .unwrap()
            .read_to_string(&mut csv)
            .unwrap();
        let mut lines = csv.lines();
        let header = lines.next().unwrap().to_owned();
        let (mut corrupted, mut clean) = (vec![header.clone()], vec![header]);
        let mut bad_lines = Vec::new();
        for (i, line) in lines.take(LINES).enumerate() {
            let n = i + 1;
            if BAD.contains(&n) {
                let mut fields: Vec<&str> = line.split(',').collect();
                assert_eq!(fields.len(), 19, "{line}");
                let bad = format!("bad{n}");
                fields[5] = &bad;
                let line = fields.join(",");
                corrupted.push(line.clone());
                bad_lines.push(line);
            } else {
                corrupted.push(line.to_owned());
                clean.push(line.to_owned());
            }
        }
        for (sub, content) in [("data", &corrupted), ("clean", &clean)] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            let mut text = content.join("\n");
            text.push('\n');
            std::fs::write(dir.join(sub).join("flights.csv"), text).unwrap();
        }
        let fixture = Fixture {
            dir: dir.clone(),
            bad_lines,
            good: Vec::new(),
        };
        let reference = Job::new(&fixture, "clean", Policy::Fail, 2, "reference");
        let (ok, out, err) = reference.run();
        assert!(ok, "{out}\n{err}");
        let good = reference.committed("good");
        assert_eq!(good.len(), LINES - BAD.len(), "one record per clean line");
        Fixture { good, ..fixture }
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Fail,
    Skip,
    DeadLetter,
}

/// A job over `input` (`data` or `clean`) of the fixture: file-source -> flights-mapper
/// (`parse`, with the policy) -> jsonl-sink `good` (prefix `good`), plus, for
/// dead-letter, jsonl-sink `dead` (prefix `dead`) reading `parse`'s output `errors`.
struct Job {
    /// The run's own directory (job file, output, work dir); removed when the `Job` is
    /// dropped unless the test is panicking, so a passing suite leaves ~60 MB, not ~1 GB.
    dir: PathBuf,
    file: PathBuf,
    out: PathBuf,
    work: PathBuf,
}

impl Drop for Job {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Job {
    fn new(f: &Fixture, input: &str, policy: Policy, parallelism: u32, name: &str) -> Job {
        let run = f.dir.join("runs").join(name);
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run).unwrap();
        let on_error = match policy {
            Policy::Fail => "",
            Policy::Skip => "on_error = \"skip\"\n",
            Policy::DeadLetter => "on_error = \"dead-letter\"\n",
        };
        let dead_sink = if policy == Policy::DeadLetter {
            r#"
[[sink]]
name = "dead"
plugin = "jsonl-sink@0.1.0"
inputs = [{ from = "parse", output = "errors" }]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output", prefix = "dead" }
"#
        } else {
            ""
        };
        let text = format!(
            r#"[job]
name = "error-policy-{name}"
parallelism = {parallelism}
checkpoint_interval_ms = 50
batch_records = 512

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "../../{input}" }}]
config = {{ path = "/input/flights.csv", format = "csv", header = true }}

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {{ key = "carrier" }}
{on_error}
[[sink]]
name = "good"
plugin = "jsonl-sink@0.1.0"
inputs = ["parse"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "good" }}
{dead_sink}"#
        );
        let file = run.join("job.toml");
        std::fs::write(&file, text).unwrap();
        Job {
            dir: run.clone(),
            file,
            out: run.join("out"),
            work: run.join("work"),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
        c.args(["run", "--no-progress", "--no-echo", "--output"])
            .arg(&self.out)
            .arg("--work-dir")
            .arg(&self.work)
            .arg(&self.file)
            .env_remove("NOPSTREAM_FAILPOINTS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs to completion: (success, stdout, stderr).
    fn run(&self) -> (bool, String, String) {
        let o = self.command().output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    /// Starts the job and SIGKILLs it after `after`; `true` if it had already ended.
    fn kill_after(&self, after: Duration) -> bool {
        let mut child = self.command().spawn().unwrap();
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

    /// Committed lines (sorted) of the files with `prefix`; staging files are not output.
    fn committed(&self, prefix: &str) -> Vec<String> {
        let mut lines = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.out) else {
            return lines;
        };
        for e in dir {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with(&format!("{prefix}-")) && name.ends_with(".jsonl") {
                let text = std::fs::read_to_string(&p).unwrap();
                lines.extend(text.lines().map(str::to_owned));
            }
        }
        lines.sort();
        lines
    }
}

/// The message flights-mapper gives a corrupted line when it is processed alone.
fn mapper_message(bad_line: &str) -> String {
    let value = bad_line.split(',').nth(5).unwrap();
    format!("record 0: column dep_delay: value \"{value}\" is not a number")
}

/// Checks the dead letters: exactly one per corrupted line, with the record, the
/// mapper's error, the operator, plugin and input, and a subtask of the two readers.
fn check_dead_letters(f: &Fixture, letters: &[String]) {
    let mut got: Vec<Value> = letters
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    got.sort_by_key(|v| v["record"].as_str().unwrap_or_default().to_owned());
    let mut expected: Vec<Value> = f
        .bad_lines
        .iter()
        .map(|line| {
            serde_json::json!({
                "operator": "parse",
                "plugin": "flights-mapper@0.1.0",
                "input": 0,
                "code": "invalid-record",
                "message": mapper_message(line),
                "record": line,
            })
        })
        .collect();
    expected.sort_by_key(|v| v["record"].as_str().unwrap().to_owned());
    for v in &mut got {
        let subtask = v
            .as_object_mut()
            .unwrap()
            .remove("subtask")
            .and_then(|s| s.as_u64());
        assert!(matches!(subtask, Some(0 | 1)), "{v}");
    }
    assert_eq!(got, expected, "one dead letter per corrupted line, exactly");
}

#[test]
fn fail_stops_at_once_naming_plugin_operator_subtask_error_and_record() {
    let f = fixture();
    let job = Job::new(f, "data", Policy::Fail, 1, "fail");
    let started = Instant::now();
    let (ok, out, err) = job.run();
    assert!(!ok, "must fail:\n{out}\n{err}");
    let first = &f.bad_lines[0];
    let expected = format!(
        "error: job `error-policy-fail` failed: plugin `flights-mapper@0.1.0` (operator \
         `parse`, subtask 0) failed in `process` (invalid-record): record 2: column \
         dep_delay: value \"bad3\" is not a number; record: `{first}` (on_error = \"fail\"; \
         \"skip\" or \"dead-letter\" on the operator would go on without it)"
    );
    assert!(
        err.lines().any(|l| l == expected),
        "expected the line\n{expected}\nin:\n{err}"
    );
    // A deterministic guest error is not retried: no recovery, no backoff.
    assert!(
        !err.contains("recovering from the latest durable epoch"),
        "a guest error must not burn the restart budget:\n{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(
        job.committed("good").len() < LINES - BAD.len(),
        "it stopped"
    );
}

#[test]
fn skip_commits_every_good_record_and_counts_the_bad_ones() {
    let f = fixture();
    let job = Job::new(f, "data", Policy::Skip, 2, "skip");
    let (ok, out, err) = job.run();
    assert!(ok, "{out}\n{err}");
    let good = job.committed("good");
    assert_eq!(good.len(), LINES - BAD.len());
    assert_eq!(good, f.good, "exactly the clean file's output");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("records skipped"))
        .unwrap_or_else(|| panic!("no `records skipped` line in:\n{out}"));
    assert_eq!(
        line,
        format!(
            "  records skipped  {} by `parse` (on_error = \"skip\": dropped, a declared loss)",
            BAD.len()
        )
    );
    assert!(!out.contains("dead-lettered"), "{out}");
}

#[test]
fn dead_letter_commits_good_records_to_one_sink_and_bad_ones_with_errors_to_another() {
    let f = fixture();
    let job = Job::new(f, "data", Policy::DeadLetter, 2, "dead-letter");
    let (ok, out, err) = job.run();
    assert!(ok, "{out}\n{err}");
    assert_eq!(
        job.committed("good"),
        f.good,
        "exactly the clean file's output"
    );
    check_dead_letters(f, &job.committed("dead"));
    assert!(
        out.lines().any(|l| l
            == format!(
                "  dead-lettered    {} by `parse` (on_error = \"dead-letter\": to its output `errors`)",
                BAD.len()
            )),
        "{out}"
    );
}

#[test]
fn dead_letters_are_exact_under_random_kills() {
    let f = fixture();
    // One uninterrupted run for the time scale of the kills.
    let timing = Job::new(f, "data", Policy::DeadLetter, 2, "dead-letter-timing");
    let t = Instant::now();
    let (ok, out, err) = timing.run();
    assert!(ok, "{out}\n{err}");
    let mut span = (t.elapsed().as_millis() as u64).max(100);
    // SIGKILL at random moments, restarting each time, until 5 kills landed while the job
    // ran; a round whose job finishes first is checked and a fresh round starts.
    let (mut x, mut landed, mut round) = (3u64, 0, 0);
    while landed < 5 {
        round += 1;
        assert!(round <= 20, "kills keep missing the run ({landed} landed)");
        let job = Job::new(f, "data", Policy::DeadLetter, 2, &format!("kills-{round}"));
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 20 + (x >> 33) % span;
            if job.kill_after(Duration::from_millis(at)) {
                if first {
                    span = (span * 2 / 3).max(60);
                }
                break; // the job finished before the kill
            }
            first = false;
            landed += 1;
            if landed == 5 {
                let (ok, out, err) = job.run();
                assert!(ok, "{out}\n{err}");
                break;
            }
        }
        assert_eq!(
            job.committed("good"),
            f.good,
            "good records exactly once (round {round})"
        );
        check_dead_letters(f, &job.committed("dead"));
    }
}
