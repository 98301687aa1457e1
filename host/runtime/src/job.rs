//! The embedded mode (design §2.5): the coordinator role of `nop-stream-coordinator` driving
//! [`InProcessWorkers`], one thread per subtask in this process with in-process channels.
//! The recovery loop, restore planning and the epoch loop live in the coordinator crate
//! and exist once for both modes.

use crate::error::{Result, RuntimeError};
use crate::limits::Limits;
use crate::plugin::{DirGrant, LoadedPlugin};
use crate::workers::InProcessWorkers;
use nop_stream_api::OperatorId;
use nop_stream_checkpoint::Location;
use nop_stream_coordinator::CoordinatorOptions;
pub use nop_stream_coordinator::{
    CommittedTransaction, JobReport, check_restore, check_restore_compatible, checkpoint_location,
    checkpoint_namespace,
};
use nop_stream_core::{PartitionedPlan, PlannedOperator};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Loaded plugins by operator id.
pub type PluginSet = HashMap<OperatorId, Arc<LoadedPlugin>>;

/// How to run a job.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Directory of the job file; relative grant paths resolve against it.
    pub job_dir: PathBuf,
    /// The run's output directory; grants starting with `$OUTPUT` resolve against it.
    pub output_dir: PathBuf,
    /// Working directory: `<work_dir>/state` (redb), and by default the checkpoints and
    /// savepoints.
    pub work_dir: PathBuf,
    /// The checkpoint root: the job's namespace is in it
    /// ([`checkpoint_location`]). Default `<work_dir>/checkpoints`.
    pub checkpoints: Location,
    /// Sandbox limits of every instance.
    pub limits: Limits,
    /// Capacity of each channel in batches (0: [`crate::transport::LocalTransport::DEFAULT_CAPACITY`]).
    pub channel_capacity: usize,
    /// Resume from the latest durable manifest of the job's checkpoint namespace if there
    /// is one (otherwise its checkpoints are deleted and the job starts fresh).
    pub resume: bool,
    /// Global recoveries allowed after task failures within any 60 s (see
    /// `CoordinatorOptions::max_restarts`). `None`: 10 when the job checkpoints
    /// periodically, 0 otherwise.
    pub max_restarts: Option<u32>,
    /// Epochs older than this are aborted, in ms. Default 60,000.
    pub checkpoint_timeout_ms: u64,
    /// Durable epochs kept per namespace. Default 3.
    pub retain_epochs: usize,
    /// An explicit rescale action (design §10.5): the fingerprint of this same job compiled
    /// at the parallelism the checkpoint was taken with. When the latest manifest carries
    /// exactly that fingerprint, it is restored into the plan at the new parallelism:
    /// keyed state, timers and watermarks move with their StateShard (the shard count
    /// stays), split cursors go to their new owners, and every sink subtask of the old
    /// plan first commits its durable transactions and aborts the rest. `None` (default):
    /// a changed plan is refused (design §10.4).
    pub rescale_from: Option<String>,
    /// Savepoint requests of the running job (the CLI's control socket); `None`: none.
    pub savepoints:
        Option<Arc<Mutex<std::sync::mpsc::Receiver<nop_stream_coordinator::SavepointRequest>>>>,
    /// Where savepoints go: `epoch-N` in it unless a request names another location.
    /// Default `<work_dir>/savepoints`.
    pub savepoint_root: Location,
    /// How the kernel schedules the task threads. Default
    /// [`TaskScheduling::Batch`](crate::launch::TaskScheduling::Batch).
    pub task_scheduling: crate::launch::TaskScheduling,
}

impl RunOptions {
    /// The coordinator's share of these options.
    pub fn coordinator_options(&self) -> CoordinatorOptions {
        CoordinatorOptions {
            max_restarts: self.max_restarts,
            checkpoint_timeout_ms: self.checkpoint_timeout_ms,
            retain_epochs: self.retain_epochs,
            rescale_from: self.rescale_from.clone(),
            savepoints: self.savepoints.clone(),
            savepoint_root: self.savepoint_root.clone(),
            ..CoordinatorOptions::default()
        }
    }

    /// Options with defaults for everything but the directories.
    pub fn new(job_dir: PathBuf, output_dir: PathBuf, work_dir: PathBuf) -> Self {
        let savepoint_root = Location::Local(work_dir.join("savepoints"));
        let checkpoints = Location::Local(work_dir.join("checkpoints"));
        RunOptions {
            job_dir,
            output_dir,
            work_dir,
            limits: Limits::default(),
            channel_capacity: 0,
            resume: true,
            max_restarts: None,
            checkpoint_timeout_ms: 60_000,
            retain_epochs: 3,
            rescale_from: None,
            savepoints: None,
            savepoint_root,
            checkpoints,
            task_scheduling: crate::launch::TaskScheduling::default(),
        }
    }
}

/// Live counters of a running job, for progress displays.
#[derive(Debug)]
pub struct JobProgress {
    records_read: AtomicU64,
    records_written: AtomicU64,
    /// Input position per split, keyed by (source operator, split id): two sources may
    /// name their splits alike.
    splits: Mutex<BTreeMap<SourceSplit, (u64, Option<u64>)>>,
    started: Instant,
    metrics: nop_stream_metrics::JobMetrics,
}

/// A split as (source operator, split id).
type SourceSplit = (String, String);

impl Default for JobProgress {
    fn default() -> Self {
        JobProgress {
            records_read: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            splits: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            metrics: nop_stream_metrics::JobMetrics::default(),
        }
    }
}

impl JobProgress {
    /// Counts `n` records read from split `split` of source operator `source`, now at
    /// `consumed` of `total` units.
    pub(crate) fn record_read(
        &self,
        source: &str,
        split: &str,
        n: u64,
        consumed: u64,
        total: Option<u64>,
    ) {
        self.records_read.fetch_add(n, Ordering::Relaxed);
        self.metrics.split_read(
            source,
            split,
            n,
            nop_stream_metrics::SplitProgress {
                consumed,
                total,
                max_timestamp: None,
            },
        );
        self.splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((source.to_owned(), split.to_owned()), (consumed, total));
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.records_written.fetch_add(n, Ordering::Relaxed);
        self.metrics.written(n);
    }

    /// The metrics of the job's subtasks in this process (design §15).
    pub fn metrics(&self) -> &nop_stream_metrics::JobMetrics {
        &self.metrics
    }

    /// Records read by all sources so far (in every attempt).
    pub fn records_read(&self) -> u64 {
        self.records_read.load(Ordering::Relaxed)
    }

    /// Records written by all sinks so far (staged, not necessarily committed).
    pub fn records_written(&self) -> u64 {
        self.records_written.load(Ordering::Relaxed)
    }

    /// Input position over all splits started so far: (units consumed, total units),
    /// bytes for file sources.
    pub fn position(&self) -> (u64, u64) {
        let splits = self.splits.lock().unwrap_or_else(|p| p.into_inner());
        splits
            .values()
            .fold((0, 0), |(c, t), (sc, st)| (c + sc, t + st.unwrap_or(*sc)))
    }

    /// Time since the job started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Resolves a grant's host path: `$OUTPUT[/rest]` against the output directory, other
/// relative paths against the job directory.
pub fn resolve_grant_path(host: &str, opts: &RunOptions) -> PathBuf {
    if let Some(rest) = host.strip_prefix("$OUTPUT") {
        let rest = rest.trim_start_matches('/');
        if rest.is_empty() {
            opts.output_dir.clone()
        } else {
            opts.output_dir.join(rest)
        }
    } else {
        let p = Path::new(host);
        if p.is_absolute() {
            p.to_owned()
        } else {
            opts.job_dir.join(p)
        }
    }
}

pub(crate) fn grants_of(op: &PlannedOperator, opts: &RunOptions) -> Result<Vec<DirGrant>> {
    op.grants
        .iter()
        .map(|g| {
            let host = resolve_grant_path(&g.host, opts);
            if g.writable {
                std::fs::create_dir_all(&host).map_err(|e| RuntimeError::Io {
                    path: host.display().to_string(),
                    message: format!(
                        "cannot create directory granted to operator `{}`: {e}",
                        op.name
                    ),
                })?;
            } else if !host.is_dir() {
                return Err(RuntimeError::Io {
                    path: host.display().to_string(),
                    message: format!(
                        "directory granted to operator `{}` as `{}` does not exist",
                        op.name, g.guest
                    ),
                });
            }
            Ok(DirGrant {
                host,
                guest: g.guest.clone(),
                writable: g.writable,
            })
        })
        .collect()
}

/// Runs `plan` to completion with the embedded backend, taking epoch checkpoints,
/// resuming from the latest durable manifest when `opts.resume`, and recovering globally
/// from task failures up to the restart budget (design §10.1).
///
/// # Errors
/// The root-cause failure once the restart budget is spent or when it is not
/// recoverable; a restore incompatibility; a setup error.
pub fn run_job(
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    opts: &RunOptions,
    progress: Arc<JobProgress>,
) -> Result<JobReport> {
    let storage = nop_stream_coordinator::open_namespace(&opts.checkpoints, plan, opts.resume)?;
    let mut workers = InProcessWorkers::new(plan, plugins, opts, Arc::clone(&storage), progress);
    let mut copts = opts.coordinator_options();
    copts.components = plugins
        .iter()
        .map(|(id, p)| (id.to_string(), p.sha256.clone()))
        .collect();
    nop_stream_coordinator::run_job(plan, &mut workers, storage, &copts)
}

/// Marker file that makes a directory a nopstream output directory.
const OUTPUT_MARKER: &str = ".nopstream-output";

/// Prepares `dir` for a fresh run: creates it, or empties it if it holds a previous run's
/// output (it has the marker file `.nopstream-output`). A non-empty directory without the
/// marker is refused, so a typo never wipes user files.
///
/// # Errors
/// A message naming the directory: a foreign non-empty directory, or an I/O failure.
pub fn claim_output_dir(dir: &Path) -> std::result::Result<(), String> {
    let err = |e: std::io::Error| format!("output directory {}: {e}", dir.display());
    if dir.exists() {
        let entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        if !entries.is_empty() {
            if !dir.join(OUTPUT_MARKER).exists() {
                return Err(format!(
                    "output directory {} is not empty and was not created by nopstream; \
                     choose another with --output",
                    dir.display()
                ));
            }
            for e in entries {
                if e.is_dir() {
                    std::fs::remove_dir_all(&e).map_err(err)?;
                } else {
                    std::fs::remove_file(&e).map_err(err)?;
                }
            }
        }
    }
    std::fs::create_dir_all(dir).map_err(err)?;
    std::fs::write(dir.join(OUTPUT_MARKER), b"nopstream output directory\n").map_err(err)?;
    Ok(())
}
