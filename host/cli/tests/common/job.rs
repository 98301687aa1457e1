//! A job run as `nopstream run` processes (the harness of the crash, JetStream, Redis and
//! queue-to-postgres suites): run to completion, crash at a failpoint, SIGKILL at a moment
//! or after a time limit, restart until it finishes, SIGKILL at pseudo-random moments over
//! rounds ([`kill_rounds`]), and read the committed JSONL output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use super::kit::{repo, text};

/// A job file with its output and work directories; the file is removed on drop.
pub struct Job {
    /// The job file.
    pub file: PathBuf,
    /// Holds `out` and `work` (and whatever else a test puts beside them).
    pub dir: PathBuf,
    /// `--output`: `dir/out`.
    pub out: PathBuf,
    /// `--work-dir`: `dir/work`.
    pub work: PathBuf,
    /// Environment variables set for every run.
    pub env: Vec<(String, String)>,
    /// Arguments added to every `run` (e.g. `--checkpoints s3://...`).
    pub args: Vec<String>,
    /// The temporary `dir` of [`Job::new`], removed on drop.
    _tmp: Option<tempfile::TempDir>,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

impl Job {
    /// The job file `file` (already written), with output and work directories in `dir`
    /// (which the caller owns).
    pub fn at(file: PathBuf, dir: &Path) -> Job {
        Job {
            file,
            dir: dir.to_path_buf(),
            out: dir.join("out"),
            work: dir.join("work"),
            env: Vec::new(),
            args: Vec::new(),
            _tmp: None,
        }
    }

    /// Writes `text` as `<suite>-<tag>.toml` in a temporary directory of its own (relative
    /// grants and prepare steps made absolute against the flights example, see
    /// [`super::kit::job_in`]), with the output and work directories beside it.
    pub fn new(suite: &str, tag: &str, text: &str) -> Job {
        let tmp = tempfile::tempdir().unwrap();
        let file = super::kit::job_in(
            tmp.path(),
            &format!("{suite}-{tag}.toml"),
            "examples/flights",
            text,
        );
        let mut job = Job::at(file, tmp.path());
        job._tmp = Some(tmp);
        job
    }

    /// `nopstream run` of this job, output captured, with `NOPSTREAM_FAILPOINTS` set to
    /// `failpoints` (and removed for `None`).
    pub fn command(&self, failpoints: Option<&str>) -> Command {
        let mut c = self.verb("run");
        c.args(["--no-progress", "--no-echo", "--output"])
            .arg(&self.out)
            .arg("--work-dir")
            .arg(&self.work)
            .args(&self.args);
        match failpoints {
            Some(f) => c.env("NOPSTREAM_FAILPOINTS", f),
            None => c.env_remove("NOPSTREAM_FAILPOINTS"),
        };
        c
    }

    /// `nopstream <verb> <file>` (`plan`, `validate`, ...), output captured.
    pub fn verb(&self, verb: &str) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nopstream"));
        c.arg(verb)
            .arg(&self.file)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs to completion (restarting after crashes is the caller's business): whether it
    /// succeeded, and stdout then stderr.
    pub fn run(&self, failpoints: Option<&str>) -> (bool, String) {
        let o = self.command(failpoints).output().unwrap();
        (o.status.success(), text(&o))
    }

    /// Runs, SIGKILLing the process if it has not ended after `limit`: (ended by itself,
    /// success, output).
    pub fn run_for(&self, limit: Duration) -> (bool, bool, String) {
        let child = self.command(None).spawn().unwrap();
        let pid = child.id();
        let t = Instant::now();
        let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
        while t.elapsed() < limit && !waiter.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let ended = waiter.is_finished();
        if !ended {
            // SIGKILL by pid: the child is ours and still running (not yet reaped).
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        let o = waiter.join().unwrap();
        (ended, o.status.success(), text(&o))
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

    /// Runs until a run succeeds (at most 5 tries); returns its output.
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

    /// Committed JSONL output lines (sorted); staging files are not output.
    pub fn committed(&self) -> Vec<String> {
        super::kit::committed(&self.out)
    }
}

/// SIGKILLs jobs made by `make(round)` at pseudo-random moments within `span_ms`,
/// restarting each until it finishes, until `kills` kills landed while a job ran; `check`
/// runs on each finished round's job. A resumed run only has the remaining work, so a
/// round can end before enough kills landed; then a fresh round starts (at most 40).
pub fn kill_rounds(
    kills: usize,
    mut span_ms: u64,
    seed: u64,
    mut make: impl FnMut(usize) -> Job,
    mut check: impl FnMut(&Job, usize),
) {
    let mut x = seed;
    let mut landed = 0;
    let mut round = 0;
    while landed < kills {
        round += 1;
        assert!(
            round <= 40,
            "kills keep missing the run ({landed}/{kills} landed)"
        );
        let job = make(round);
        let mut first = true;
        loop {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 50 + (x >> 33) % span_ms;
            if job.kill_after(Duration::from_millis(at)) {
                if first {
                    span_ms = (span_ms * 2 / 3).max(100);
                }
                break;
            }
            first = false;
            landed += 1;
            if landed == kills {
                break;
            }
        }
        job.finish();
        check(&job, round);
    }
    eprintln!("{landed} kills landed in {round} rounds");
}
