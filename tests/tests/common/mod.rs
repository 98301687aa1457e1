//! Shared harness of the integration suites: one plugin host for the whole test process
//! (so every test after a fault runs on the host that saw it), tiny job files written
//! into temp dirs, and a watchdog so no fault can hang the suite.

#![allow(dead_code)] // each test binary uses a different subset

use nop_stream_core::{job_graph, parse_job_file, partitioned_plan, stream_graph};
use nop_stream_embedded::{JobReport, run_job};
use nop_stream_plugin_host::{Limits, PluginHost, PluginRegistry, RuntimeError};
use nop_stream_task::{JobProgress, RunOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Longest a single job may take before the test fails instead of hanging.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// The process-wide plugin host (compiled components cached under the target dir).
pub fn host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nopstream-component-cache");
        nop_stream_task::plugin_host(Some(cache)).expect("plugin host")
    })
}

/// Absolute path (as a string) of a built plugin component.
pub fn wasm(package: &str) -> String {
    nop_stream_artifacts::plugin_path(package)
        .display()
        .to_string()
}

/// Runs `f` on its own thread and fails the test if it does not finish within
/// [`WATCHDOG`]: a fault must fail its task, never hang the host.
pub fn with_watchdog<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watchdog:{what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn test thread");
    match rx.recv_timeout(WATCHDOG) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {WATCHDOG:?}: the runtime hangs")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the thread sent nothing but did not panic"),
        },
    }
}

/// One operator between the source and the sink.
#[derive(Debug, Clone)]
pub struct Op {
    /// Node name.
    pub name: &'static str,
    /// `plugin = ...` value (`name@version` or an absolute `.wasm` path).
    pub plugin: String,
    /// Inline TOML table of the config, e.g. `{ after = 0 }`.
    pub config: String,
    /// Partition of the edge into this operator (`None`: default).
    pub partition: Option<&'static str>,
}

impl Op {
    /// An operator with the default edge into it.
    pub fn new(name: &'static str, plugin: impl Into<String>, config: impl Into<String>) -> Self {
        Op {
            name,
            plugin: plugin.into(),
            config: config.into(),
            partition: None,
        }
    }

    /// The edge into this operator uses `partition`.
    pub fn partition(mut self, partition: &'static str) -> Self {
        self.partition = Some(partition);
        self
    }
}

/// A job directory: `data/input.jsonl`, `job.toml`, `out/` (output), `work/`.
pub struct JobDir {
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    pub output: PathBuf,
    pub work: PathBuf,
}

impl JobDir {
    /// Writes `lines` as the input file and the job file `text`.
    pub fn new(lines: &[String], text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        let mut input = lines.join("\n");
        input.push('\n');
        std::fs::write(dir.path().join("data/input.jsonl"), input).expect("input");
        let file = dir.path().join("job.toml");
        std::fs::write(&file, text).expect("job file");
        JobDir {
            output: dir.path().join("out"),
            work: dir.path().join("work"),
            file,
            dir,
        }
    }

    /// A job `input (file-source) -> ops... -> out (jsonl-sink)` over `lines`.
    pub fn pipeline(name: &str, parallelism: u32, lines: &[String], ops: &[Op]) -> Self {
        Self::new(lines, &pipeline_toml(name, parallelism, ops))
    }

    /// Committed output: every line of every visible (non-dot) file of the output dir,
    /// sorted.
    pub fn committed_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for f in self.committed_files() {
            let text = std::fs::read_to_string(&f).expect("read output");
            lines.extend(text.lines().map(str::to_owned));
        }
        lines.sort();
        lines
    }

    /// Visible (committed) files of the output dir; `.staging` and other dot entries are
    /// the sink's private leftovers and not output.
    pub fn committed_files(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.output) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.expect("dir entry").path())
            .filter(|p| {
                !p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'))
            })
            .collect();
        files.sort();
        files
    }
}

/// The job file of [`JobDir::pipeline`]: small batches so several calls happen.
pub fn pipeline_toml(name: &str, parallelism: u32, ops: &[Op]) -> String {
    let mut t = format!(
        r#"[job]
name = "{name}"
parallelism = {parallelism}
state_shards = 16
batch_records = 4

[[source]]
name = "input"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "data" }}]
config = {{ path = "/input/input.jsonl", format = "jsonl" }}
"#
    );
    let mut prev = "input";
    for op in ops {
        let input = match op.partition {
            Some(p) => format!(r#"{{ from = "{prev}", partition = "{p}" }}"#),
            None => format!(r#""{prev}""#),
        };
        t.push_str(&format!(
            r#"
[[operator]]
name = "{}"
plugin = "{}"
inputs = [{input}]
config = {}
"#,
            op.name, op.plugin, op.config
        ));
        prev = op.name;
    }
    t.push_str(&format!(
        r#"
[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["{prev}"]
grants = [{{ guest = "/output", host = "$OUTPUT", writable = true }}]
config = {{ dir = "/output", prefix = "part" }}
"#
    ));
    t
}

/// Parses and plans `job` exactly as `nopstream run` does, and runs it on the shared host
/// under the watchdog.
///
/// # Panics
/// If the job file or plan is refused (these tests need valid jobs), or on the watchdog.
pub fn run(job: &JobDir, limits: Limits) -> Result<JobReport, RuntimeError> {
    let file = job.file.clone();
    let output = job.output.clone();
    let work = job.work.clone();
    let what = format!("job {}", file.display());
    with_watchdog(&what, move || run_now(&file, &output, &work, limits))
}

/// [`run`] without the watchdog, on the calling thread.
pub fn run_now(
    file: &Path,
    output: &Path,
    work: &Path,
    limits: Limits,
) -> Result<JobReport, RuntimeError> {
    let text = std::fs::read_to_string(file).expect("job file");
    let name = file.display().to_string();
    let model = parse_job_file(&name, &text).unwrap_or_else(|d| panic!("job file refused:\n{d}"));
    let dir = file.parent().expect("job dir").to_owned();
    let registry = PluginRegistry::new(
        host(),
        vec![PathBuf::from(nop_stream_artifacts::PLUGIN_DIR)],
        dir.clone(),
    );
    let stream = stream_graph(&model, &registry)
        .unwrap_or_else(|d| panic!("plan refused:\n{}", d.with_file(&name)));
    let plan = partitioned_plan(&job_graph(&stream));
    let plugins = registry.plugin_set(&plan)?;
    let mut opts = RunOptions::new(dir, output.to_owned(), work.to_owned());
    opts.limits = limits;
    opts.resume = false;
    opts.max_restarts = Some(0); // a fault must fail the job, not be retried
    run_job(&plan, &plugins, &opts, Arc::new(JobProgress::default()))
}

/// Runs `job` and returns the error it must fail with, and how long it took.
pub fn run_expecting_failure(job: &JobDir, limits: Limits) -> (RuntimeError, Duration) {
    let started = Instant::now();
    match run(job, limits) {
        Ok(report) => panic!("the job should have failed but reported {report:#?}"),
        Err(e) => (e, started.elapsed()),
    }
}

/// `n` JSON-lines records `{"k":"<key>","v":<i>}` over keys `a`..`e`.
pub fn records(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!(r#"{{"k":"{}","v":{i}}}"#, (b'a' + (i % 5) as u8) as char))
        .collect()
}

/// Asserts that nothing of a failed run is visible in its output directory.
pub fn assert_nothing_committed(job: &JobDir) {
    let files = job.committed_files();
    assert!(
        files.is_empty(),
        "a failed job must not publish output, found {files:?}"
    );
}

/// The host survived: right after a fault, in the same process and on the same host, a
/// healthy job (source -> keyed aggregate -> sink) commits exactly the expected lines.
pub fn assert_host_survives() {
    let lines = records(23);
    let job = JobDir::pipeline(
        "healthy-after-fault",
        1,
        &lines,
        &[Op::new(
            "sum",
            "keyed-aggregate@0.1.0",
            r#"{ key_field = "k", aggregates = [{ name = "n", fn = "count" }, { name = "total", fn = "sum", field = "v" }] }"#,
        )],
    );
    let report = run(&job, Limits::default()).expect("a healthy job runs after a fault");
    assert_eq!(report.records_read, 23);
    let mut expected = Vec::new();
    for (j, key) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let vs: Vec<usize> = (0..23).filter(|i| i % 5 == j).collect();
        expected.push(format!(
            r#"{{"k":"{key}","n":{},"total":{}}}"#,
            vs.len(),
            vs.iter().sum::<usize>()
        ));
    }
    assert_eq!(job.committed_lines(), expected);
}
