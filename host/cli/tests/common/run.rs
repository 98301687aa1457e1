//! A job run as `nopstream run` processes: run to completion, crash at failpoints, SIGKILL
//! at a moment, restart until finished, read the committed JSONL output; and the check of
//! the flights per-record output (crash and JetStream suites).

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A job file with its output and work directories; the file is removed on drop.
pub struct Job {
    /// The job file.
    pub file: PathBuf,
    /// `--output`.
    pub out: PathBuf,
    /// `--work-dir`.
    pub work: PathBuf,
    /// Extra environment of every run.
    pub env: Vec<(String, String)>,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

impl Job {
    /// The job file `file` (already written), with output and work directories in `tmp`.
    pub fn at(file: PathBuf, tmp: &Path) -> Job {
        Job {
            file,
            out: tmp.join("out"),
            work: tmp.join("work"),
            env: Vec::new(),
        }
    }

    /// The `nopstream run` command, with `NOPSTREAM_FAILPOINTS` set to `failpoints`.
    pub fn command(&self, failpoints: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
        c.args(["run", "--no-progress", "--no-echo", "--output"])
            .arg(&self.out)
            .arg("--work-dir")
            .arg(&self.work)
            .arg(&self.file)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match failpoints {
            Some(f) => c.env("NOPSTREAM_FAILPOINTS", f),
            None => c.env_remove("NOPSTREAM_FAILPOINTS"),
        };
        c
    }

    /// Runs to completion (restarting after crashes is the caller's business); whether it
    /// succeeded, and stdout then stderr.
    pub fn run(&self, failpoints: Option<&str>) -> (bool, String) {
        let o = self.command(failpoints).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), text)
    }

    /// Starts the job and SIGKILLs it after `after`; returns whether it had already ended.
    pub fn kill_after(&self, after: Duration) -> bool {
        let mut child = self.command(None).spawn().unwrap();
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

    /// Runs until one run succeeds (at most 5 tries); its output.
    pub fn finish(&self) -> String {
        for _ in 0..5 {
            let (ok, text) = self.run(None);
            if ok {
                return text;
            }
            eprintln!("restart failed, retrying: {text}");
        }
        panic!("the job never finished");
    }

    /// Committed output lines (sorted); staging files are not output.
    pub fn committed(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for e in std::fs::read_dir(&self.out).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jsonl") {
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

/// The natural key of a flight, `year/month/day/carrier/flight/origin/sched_dep_time`.
pub const NATURAL_KEY: [&str; 7] = [
    "year",
    "month",
    "day",
    "carrier",
    "flight",
    "origin",
    "sched_dep_time",
];

/// The natural keys of a per-record output (each field as JSON text), checking each
/// appears once.
pub fn natural_keys(lines: &[String]) -> BTreeSet<Vec<String>> {
    let mut keys = BTreeSet::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        let key: Vec<String> = NATURAL_KEY.iter().map(|f| v[f].to_string()).collect();
        assert!(keys.insert(key), "duplicate natural key in {l}");
    }
    keys
}

/// Checks a per-record output: 336,776 lines with unique natural keys.
pub fn check_per_record(lines: &[String]) {
    assert_eq!(lines.len(), 336_776, "every departure exactly once");
    natural_keys(lines);
}
