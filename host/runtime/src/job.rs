//! The embedded job runner: the coordinator role of one process (design §2.5 "the embedded
//! mode keeps all roles in one process"). It enumerates (or restores) source splits,
//! wires every subtask's channels from the PartitionedPlan through a [`Transport`], runs
//! one thread per subtask, drives the epoch protocol through the pure
//! [`EpochCoordinator`] (manifests, DURABLE / COMMITTED in the epoch log, sink commits),
//! and on a task failure fences the attempt, stops every task and recovers globally from
//! the latest durable epoch with a new attempt and fencing token (seed §10.1).

use crate::bindings::{Split, TaskInfo};
use crate::error::{Result, RuntimeError, Site};
use crate::limits::Limits;
use crate::partition::OutputEdge;
use crate::plugin::{DirGrant, Instance, InstanceOptions, LoadedPlugin};
use crate::task::{
    self, InputChannel, StageSpec, TaskCommand, TaskEvent, TaskReport, TaskRestore, TaskSpec,
};
use crate::transport::{LocalTransport, Transport};
use nop_stream_api::{
    AttemptId, EpochId, FencingToken, OperatorId, PluginKind, SemanticMode, StateShardId, TaskId,
};
use nop_stream_checkpoint::coordinator::{Command, EpochCoordinator, EpochState, Event};
use nop_stream_checkpoint::{
    CheckpointStorage, EnumeratorState, EpochLogRecord, EpochManifest, LocalStorage,
    STATE_FORMAT_VERSION, failpoint, payload_checksum,
};
use nop_stream_core::{PartitionedPlan, PlannedOperator};
use nop_stream_state::{ShardSnapshot, StateConfig};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Working directory: `<work_dir>/state` (redb) and `<work_dir>/checkpoints`.
    pub work_dir: PathBuf,
    /// Sandbox limits of every instance.
    pub limits: Limits,
    /// Capacity of each channel in batches (0: [`LocalTransport::DEFAULT_CAPACITY`]).
    pub channel_capacity: usize,
    /// Resume from the latest durable manifest of the job's checkpoint namespace if there
    /// is one (otherwise its checkpoints are deleted and the job starts fresh).
    pub resume: bool,
    /// Global recoveries allowed after task failures. `None`: 3 when the job checkpoints
    /// periodically, 0 otherwise.
    pub max_restarts: Option<u32>,
    /// Epochs older than this are aborted, in ms. Default 60,000.
    pub checkpoint_timeout_ms: u64,
    /// Durable epochs kept per namespace. Default 3.
    pub retain_epochs: usize,
    /// An explicit rescale action (seed §10.5): the fingerprint of this same job compiled
    /// at the parallelism the checkpoint was taken with. When the latest manifest carries
    /// exactly that fingerprint, it is restored into the plan at the new parallelism:
    /// keyed state, timers and watermarks move with their StateShard (the shard count
    /// stays), split cursors go to their new owners, and every sink subtask of the old
    /// plan first commits its durable transactions and aborts the rest. `None` (default):
    /// a changed plan is refused (seed §10.4).
    pub rescale_from: Option<String>,
}

impl RunOptions {
    /// Options with defaults for everything but the directories.
    pub fn new(job_dir: PathBuf, output_dir: PathBuf, work_dir: PathBuf) -> Self {
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
        }
    }
}

/// Live counters of a running job, for progress displays.
#[derive(Debug)]
pub struct JobProgress {
    records_read: AtomicU64,
    records_written: AtomicU64,
    splits: Mutex<BTreeMap<String, (u64, Option<u64>)>>,
    started: Instant,
}

impl Default for JobProgress {
    fn default() -> Self {
        JobProgress {
            records_read: AtomicU64::new(0),
            records_written: AtomicU64::new(0),
            splits: Mutex::new(BTreeMap::new()),
            started: Instant::now(),
        }
    }
}

impl JobProgress {
    pub(crate) fn record_read(&self, split: &str, n: u64, consumed: u64, total: Option<u64>) {
        self.records_read.fetch_add(n, Ordering::Relaxed);
        self.splits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(split.to_owned(), (consumed, total));
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.records_written.fetch_add(n, Ordering::Relaxed);
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

/// A transaction the job committed.
#[derive(Debug, Clone, Serialize)]
pub struct CommittedTransaction {
    /// Epoch.
    pub epoch: u64,
    /// Transaction id (seed §7.2).
    pub txn: String,
}

/// What a finished job reports.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// Job id.
    pub job_id: String,
    /// Semantic mode the job ran with.
    pub semantic: SemanticMode,
    /// Attempt that finished.
    pub attempt: u32,
    /// Global recoveries in this run.
    pub recoveries: u32,
    /// Epoch the run resumed from, if any.
    pub resumed_from: Option<u64>,
    /// Whether the job had already finished in an earlier run (nothing was done).
    pub already_finished: bool,
    /// Wall time of the run.
    pub wall: Duration,
    /// Records read by sources in this run.
    pub records_read: u64,
    /// Records written by sinks in this run (staged; committed ones are in `committed`).
    pub records_written: u64,
    /// Epochs made durable in this run.
    pub epochs: u64,
    /// Final epoch.
    pub final_epoch: Option<u64>,
    /// Transactions committed in this run's durable epochs.
    pub committed: Vec<CommittedTransaction>,
    /// Per-task figures of the finishing attempt.
    pub tasks: Vec<TaskReport>,
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

fn grants_of(op: &PlannedOperator, opts: &RunOptions) -> Result<Vec<DirGrant>> {
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

fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The checkpoint namespace of a plan (seed §3.1: jobId + pipelineId).
pub fn checkpoint_namespace(plan: &PartitionedPlan) -> String {
    sanitize(&format!("{}.{}", plan.job.job_id, plan.job.pipeline_id))
}

/// The directory of a plan's checkpoint namespace under `work_dir`.
pub fn checkpoint_dir(work_dir: &Path, plan: &PartitionedPlan) -> PathBuf {
    work_dir
        .join("checkpoints")
        .join(checkpoint_namespace(plan))
}

fn is_secondary(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::Cancelled | RuntimeError::ChannelClosed { .. } | RuntimeError::Fenced { .. }
    )
}

/// Whether a failure may be recovered by restarting from the latest durable epoch. Setup
/// errors and commit uncertainty are final (seed §5.7: an unknown outcome fails loudly).
fn recoverable(e: &RuntimeError) -> bool {
    !matches!(
        e,
        RuntimeError::CommitUncertain { .. }
            | RuntimeError::PluginLoad { .. }
            | RuntimeError::PluginNotFound { .. }
            | RuntimeError::WrongWorld { .. }
            | RuntimeError::DescribeMismatch { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Restore { .. }
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Checks that a manifest can restore `plan` (seed §10.4); the message says what differs.
///
/// # Errors
/// [`RuntimeError::Restore`] naming the first difference.
pub fn check_restore_compatible(m: &EpochManifest, plan: &PartitionedPlan) -> Result<()> {
    check_restore(m, plan, None).map(|_| ())
}

/// Like [`check_restore_compatible`], but accepts a manifest whose fingerprint equals
/// `rescale_from` (an explicit rescale action); returns whether the restore rescales.
///
/// # Errors
/// [`RuntimeError::Restore`] naming the first difference.
pub fn check_restore(
    m: &EpochManifest,
    plan: &PartitionedPlan,
    rescale_from: Option<&str>,
) -> Result<bool> {
    let refuse = |message: String| {
        Err(RuntimeError::Restore {
            epoch: m.epoch.0,
            message,
        })
    };
    if m.state_format_version != STATE_FORMAT_VERSION {
        return refuse(format!(
            "state format version {} differs from this host's {STATE_FORMAT_VERSION}",
            m.state_format_version
        ));
    }
    if m.state_shard_count != plan.job.state_shard_count {
        return refuse(format!(
            "state shard count differs: checkpoint {} vs job {} (changing it needs an explicit reshard migration)",
            m.state_shard_count, plan.job.state_shard_count
        ));
    }
    let planned: BTreeSet<String> = plan
        .vertices
        .iter()
        .flat_map(|v| v.operators.iter().map(|o| o.operator_id.to_string()))
        .collect();
    let stored: BTreeSet<String> = m
        .tasks
        .iter()
        .flat_map(|t| t.segments.iter().map(|s| s.operator_id.clone()))
        .collect();
    if let Some(missing) = stored.difference(&planned).next() {
        return refuse(format!(
            "the checkpoint holds state of operator `{missing}`, which the job no longer has"
        ));
    }
    if m.plan_fingerprint != plan.fingerprint {
        if rescale_from == Some(m.plan_fingerprint.as_str()) {
            return Ok(true);
        }
        return refuse(format!(
            "plan fingerprint differs: checkpoint {} vs job {} (the job file, a plugin version, its state schema or the parallelism changed; start fresh with --fresh, restore at another parallelism with --rescale, or restore explicitly with a migration)",
            &m.plan_fingerprint[..m.plan_fingerprint.len().min(16)],
            &plan.fingerprint[..plan.fingerprint.len().min(16)]
        ));
    }
    Ok(false)
}

/// Runs `plan` to completion with the embedded backend, taking epoch checkpoints,
/// resuming from the latest durable manifest when `opts.resume`, and recovering globally
/// from task failures up to the restart budget.
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
    let started = Instant::now();
    let ns_dir = checkpoint_dir(&opts.work_dir, plan);
    if !opts.resume && ns_dir.exists() {
        std::fs::remove_dir_all(&ns_dir).map_err(|e| RuntimeError::Io {
            path: ns_dir.display().to_string(),
            message: e.to_string(),
        })?;
    }
    let storage: Arc<dyn CheckpointStorage> =
        Arc::new(LocalStorage::open(&ns_dir).map_err(|e| RuntimeError::Io {
            path: ns_dir.display().to_string(),
            message: e.to_string(),
        })?);
    let storage_err = |e: nop_stream_checkpoint::StorageError| RuntimeError::Io {
        path: ns_dir.display().to_string(),
        message: e.to_string(),
    };
    let mut restarts_left =
        opts.max_restarts
            .unwrap_or(if plan.job.checkpoint_interval_ms.is_some() {
                3
            } else {
                0
            });
    let mut recoveries = 0;
    let mut resumed_from = None;
    let mut tally = RunTally::default();
    loop {
        let restore = storage.latest_manifest().map_err(storage_err)?;
        let mut rescale = false;
        if let Some(m) = &restore {
            rescale = check_restore(m, plan, opts.rescale_from.as_deref())?;
            if resumed_from.is_none() && recoveries == 0 {
                resumed_from = Some(m.epoch.0);
            }
        }
        let log = storage.read_log().map_err(storage_err)?;
        if let Some(m) = &restore
            && m.final_epoch
            && log
                .iter()
                .any(|r| r.epoch == m.epoch && r.state == EpochState::Committed)
        {
            return Ok(JobReport {
                job_id: plan.job.job_id.to_string(),
                semantic: plan.job.semantic,
                attempt: m.attempt.0,
                recoveries,
                resumed_from: Some(m.epoch.0),
                already_finished: true,
                wall: started.elapsed(),
                records_read: progress.records_read(),
                records_written: progress.records_written(),
                epochs: tally.durable_epochs,
                final_epoch: Some(m.epoch.0),
                committed: tally.committed,
                tasks: Vec::new(),
            });
        }
        let max_epoch = log
            .iter()
            .map(|r| r.epoch.0)
            .chain(restore.as_ref().map(|m| m.epoch.0))
            .max()
            .unwrap_or(0);
        let attempt = next_attempt(&ns_dir, log.iter().map(|r| r.attempt.0).max().unwrap_or(0))?;
        let result = run_attempt(
            plan,
            plugins,
            opts,
            &storage,
            restore.as_ref(),
            rescale,
            attempt,
            EpochId(max_epoch + 1),
            &progress,
            &mut tally,
        );
        match result {
            Ok((reports, final_epoch)) => {
                return Ok(JobReport {
                    job_id: plan.job.job_id.to_string(),
                    semantic: plan.job.semantic,
                    attempt: attempt.0,
                    recoveries,
                    resumed_from,
                    already_finished: false,
                    wall: started.elapsed(),
                    records_read: progress.records_read(),
                    records_written: progress.records_written(),
                    epochs: tally.durable_epochs,
                    final_epoch: Some(final_epoch.0),
                    committed: tally.committed,
                    tasks: reports,
                });
            }
            Err(e) if restarts_left > 0 && recoverable(&e) => {
                restarts_left -= 1;
                recoveries += 1;
                tracing::warn!(
                    "attempt {attempt} failed, recovering from the latest durable epoch: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Allocates the next attempt number of a namespace: one more than any attempt seen in
/// the epoch log or recorded in `<ns>/attempt` (written durably before the attempt
/// starts), so attempts grow across in-process recoveries and process restarts alike,
/// even when an attempt failed before creating any epoch.
fn next_attempt(ns_dir: &Path, log_max: u32) -> Result<AttemptId> {
    let path = ns_dir.join("attempt");
    let recorded = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let next = recorded.max(log_max) + 1;
    let io = |e: std::io::Error| RuntimeError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{next}\n")).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(AttemptId(next))
}

/// What the attempts of one run achieved, kept across in-process recoveries.
#[derive(Default)]
struct RunTally {
    durable_epochs: u64,
    committed: Vec<CommittedTransaction>,
}

/// Before a rescale restore (seed §10.5: sink transactions never migrate silently between
/// subtasks): each sink subtask of the checkpointed plan, opened under its old index and
/// parallelism, commits the manifest's durable transactions and aborts every other
/// pending one, so the new subtasks start with nothing pending.
fn settle_sinks_for_rescale(
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    opts: &RunOptions,
    m: &EpochManifest,
    attempt: AttemptId,
) -> Result<()> {
    for v in &plan.vertices {
        let Some(op) = v.operators.last().filter(|o| o.kind == PluginKind::Sink) else {
            continue;
        };
        let old: Vec<_> = m.tasks.iter().filter(|t| t.task.vertex == v.id).collect();
        let old_parallelism = old.len() as u32;
        let plugin = plugins.get(&op.operator_id).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("no plugin loaded for operator `{}`", op.name))
        })?;
        for t in old {
            let sub = t.task.subtask.0;
            let opts_i = InstanceOptions {
                site: Site {
                    plugin: plugin.label.clone(),
                    operator: op.name.clone(),
                    subtask: Some(sub),
                },
                limits: opts.limits.clone(),
                grants: grants_of(op, opts)?,
                state: None,
            };
            let Instance::Sink(mut sink) = plugin.instantiate(&opts_i)? else {
                return Err(RuntimeError::Internal("sink plugin is not a sink".into()));
            };
            sink.open(
                &TaskInfo {
                    job_id: plan.job.job_id.to_string(),
                    pipeline_id: plan.job.pipeline_id.to_string(),
                    operator_id: op.operator_id.to_string(),
                    operator_name: op.name.clone(),
                    subtask_index: sub,
                    parallelism: old_parallelism,
                    attempt: attempt.0,
                },
                &op.config.to_string(),
            )?;
            for p in &t.pending_transactions {
                let committable = hex::decode(&p.committable)
                    .map_err(|e| RuntimeError::Internal(e.to_string()))?;
                task::commit_with_recovery(&mut sink, &p.txn, &committable)?;
            }
            for stale in sink.pending_transactions()? {
                tracing::info!(txn = %stale, "rescale: aborting a transaction of a non-durable epoch");
                sink.abort(&stale)?;
            }
            sink.close()?;
        }
    }
    Ok(())
}

/// Reads the segments a manifest names for `operator_id` and the shards in `owned`.
fn read_shards(
    storage: &dyn CheckpointStorage,
    m: &EpochManifest,
    operator_id: &str,
    owned: &std::ops::Range<u32>,
    states: &[nop_stream_api::StateDescriptor],
) -> Result<Vec<(String, ShardSnapshot)>> {
    let mut out = Vec::new();
    for seg in m.tasks.iter().flat_map(|t| &t.segments) {
        if seg.operator_id != operator_id || !owned.contains(&seg.shard) {
            continue;
        }
        let bytes = storage
            .read_range(&seg.file, seg.offset, seg.len)
            .map_err(|e| RuntimeError::Restore {
                epoch: m.epoch.0,
                message: e.to_string(),
            })?;
        if payload_checksum(&bytes) != seg.checksum {
            return Err(RuntimeError::Restore {
                epoch: m.epoch.0,
                message: format!("segment {} failed its checksum", seg.state_path),
            });
        }
        let state = {
            let Some(i) = states.iter().position(|d| d.name == seg.state) else {
                return Err(RuntimeError::Restore {
                    epoch: m.epoch.0,
                    message: format!(
                        "operator `{operator_id}` no longer declares state `{}`",
                        seg.state
                    ),
                });
            };
            if states[i].schema_version != seg.schema_version {
                return Err(RuntimeError::Restore {
                    epoch: m.epoch.0,
                    message: format!(
                        "state `{}` of operator `{operator_id}` has schema version {} in the checkpoint but {} in the plugin; an explicit migration is needed",
                        seg.state, seg.schema_version, states[i].schema_version
                    ),
                });
            }
            i as u32
        };
        out.push((
            seg.state.clone(),
            ShardSnapshot {
                shard: StateShardId(seg.shard),
                state,
                entries: seg.entries,
                payload: bytes,
            },
        ));
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn run_attempt(
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    opts: &RunOptions,
    storage: &Arc<dyn CheckpointStorage>,
    restore: Option<&EpochManifest>,
    rescale: bool,
    attempt: AttemptId,
    first_epoch: EpochId,
    progress: &Arc<JobProgress>,
    tally: &mut RunTally,
) -> Result<(Vec<TaskReport>, EpochId)> {
    let job = &plan.job;
    let namespace = checkpoint_namespace(plan);
    let token = FencingToken(u64::from(attempt.0));
    let plugin_of = |op: &PlannedOperator| -> Result<Arc<LoadedPlugin>> {
        plugins.get(&op.operator_id).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("no plugin loaded for operator `{}`", op.name))
        })
    };
    let state_root = opts.work_dir.join("state");
    if state_root.exists() {
        std::fs::remove_dir_all(&state_root).map_err(|e| RuntimeError::Io {
            path: state_root.display().to_string(),
            message: e.to_string(),
        })?;
    }
    let log = |epoch: EpochId, state: EpochState, detail: Option<String>| -> Result<()> {
        storage
            .append_log(&EpochLogRecord {
                epoch,
                state,
                attempt,
                at_ms: now_ms(),
                detail,
            })
            .map_err(|e| RuntimeError::Io {
                path: "epoch log".into(),
                message: e.to_string(),
            })
    };
    let task_info = |op: &PlannedOperator, subtask: u32, parallelism: u32| TaskInfo {
        job_id: job.job_id.to_string(),
        pipeline_id: job.pipeline_id.to_string(),
        operator_id: op.operator_id.to_string(),
        operator_name: op.name.clone(),
        subtask_index: subtask,
        parallelism,
        attempt: attempt.0,
    };

    // Source enumerators (seed §6.3): restore the split registry from the manifest, or
    // discover splits once; split j belongs to reader j mod p.
    let mut splits_of: HashMap<(usize, u32), Vec<Split>> = HashMap::new();
    let mut enumerators: Vec<EnumeratorState> = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let head = &v.operators[0];
        if head.kind != PluginKind::Source {
            continue;
        }
        let restored = restore.and_then(|m| {
            m.enumerators
                .iter()
                .find(|e| e.operator_id == head.operator_id.as_str())
        });
        let splits: Vec<Split> = match (restored, restore) {
            (Some(e), Some(m)) => {
                let descriptors: HashMap<&str, &str> = m
                    .tasks
                    .iter()
                    .flat_map(|t| {
                        t.splits
                            .iter()
                            .map(|s| (s.split_id.as_str(), s.descriptor.as_str()))
                    })
                    .collect();
                e.splits
                    .iter()
                    .map(|(id, _)| {
                        let d =
                            descriptors
                                .get(id.as_str())
                                .ok_or_else(|| RuntimeError::Restore {
                                    epoch: m.epoch.0,
                                    message: format!(
                                        "split `{id}` has no descriptor in the manifest"
                                    ),
                                })?;
                        Ok(Split {
                            id: id.clone(),
                            descriptor: hex::decode(d).map_err(|e| RuntimeError::Restore {
                                epoch: m.epoch.0,
                                message: e.to_string(),
                            })?,
                        })
                    })
                    .collect::<Result<_>>()?
            }
            _ => {
                let plugin = plugin_of(head)?;
                let opts_i = InstanceOptions {
                    site: Site {
                        plugin: plugin.label.clone(),
                        operator: head.name.clone(),
                        subtask: None,
                    },
                    limits: opts.limits.clone(),
                    grants: grants_of(head, opts)?,
                    state: None,
                };
                let Instance::Source(mut src) = plugin.instantiate(&opts_i)? else {
                    return Err(RuntimeError::Internal(
                        "source plugin is not a source".into(),
                    ));
                };
                src.open(&task_info(head, 0, v.parallelism), &head.config.to_string())?;
                let splits = src.discover_splits(v.parallelism)?;
                src.close()?;
                splits
            }
        };
        let mut registry = Vec::new();
        for (j, s) in splits.into_iter().enumerate() {
            let owner = j as u32 % v.parallelism;
            registry.push((s.id.clone(), owner));
            splits_of.entry((vi, owner)).or_default().push(s);
        }
        enumerators.push(EnumeratorState {
            operator_id: head.operator_id.to_string(),
            splits: registry,
            finished: Vec::new(),
        });
    }

    if let (true, Some(m)) = (rescale, restore) {
        settle_sinks_for_rescale(plan, plugins, opts, m, attempt)?;
    }

    let cancel = Arc::new(AtomicBool::new(false));
    let transport = LocalTransport::new(
        if opts.channel_capacity == 0 {
            LocalTransport::DEFAULT_CAPACITY
        } else {
            opts.channel_capacity
        },
        token,
        Arc::clone(&cancel),
    );
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<TaskEvent>();
    let mut commands: BTreeMap<TaskId, crossbeam_channel::Sender<TaskCommand>> = BTreeMap::new();
    let mut source_tasks = Vec::new();
    let mut sink_tasks = BTreeSet::new();
    let mut specs = Vec::new();

    // Watermark alignment tables, one per source with `max_drift_ms`.
    let alignments: HashMap<usize, Arc<task::WatermarkAlignment>> = plan
        .vertices
        .iter()
        .enumerate()
        .filter(|(_, v)| {
            v.operators[0].kind == PluginKind::Source
                && v.operators[0]
                    .watermarks
                    .is_some_and(|w| w.max_drift_ms.is_some())
        })
        .map(|(vi, v)| {
            (
                vi,
                Arc::new(task::WatermarkAlignment::new(v.parallelism as usize)),
            )
        })
        .collect();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let tail_is_sink = v.operators.last().map(|o| o.kind) == Some(PluginKind::Sink);
        for st in &v.subtasks {
            let sub = st.index.0;
            let snap = restore.and_then(|m| m.task(&st.task));
            let mut task_restore = TaskRestore::default();
            if let (true, Some(m)) = (rescale, restore) {
                // Channels changed: restore conservatively from every old subtask of the
                // vertex (seed §8.5): per edge the minimum watermark, ended only if every
                // old channel of the edge had ended. Sink transactions were settled above.
                let old: Vec<_> = m.tasks.iter().filter(|t| t.task.vertex == v.id).collect();
                task_restore.end_of_data = !old.is_empty() && old.iter().all(|t| t.end_of_data);
                for ch in &st.inputs {
                    let edge = format!("{}/", ch.edge);
                    let old_channels: Vec<(i64, bool)> = old
                        .iter()
                        .flat_map(|t| {
                            t.watermarks
                                .iter()
                                .filter(|(c, _)| c.starts_with(&edge))
                                .map(|(c, w)| (*w, t.ended_inputs.contains(c)))
                        })
                        .collect();
                    if old_channels.is_empty() {
                        continue;
                    }
                    let w = old_channels
                        .iter()
                        .filter(|(_, ended)| !ended)
                        .map(|(w, _)| *w)
                        .min()
                        .unwrap_or(i64::MAX);
                    task_restore.watermarks.insert(ch.to_string(), w);
                    if old_channels.iter().all(|(_, ended)| *ended) {
                        task_restore.ended_inputs.insert(ch.to_string());
                    }
                }
            } else if let Some(s) = snap {
                task_restore.end_of_data = s.end_of_data;
                task_restore.watermarks = s.watermarks.iter().cloned().collect();
                task_restore.ended_inputs = s.ended_inputs.iter().cloned().collect();
                task_restore.pending = s.pending_transactions.clone();
            }
            if let Some(m) = restore {
                // Cursors of every split this subtask now owns, wherever they were.
                for t in &m.tasks {
                    for sp in &t.splits {
                        let cursor =
                            hex::decode(&sp.cursor).map_err(|e| RuntimeError::Restore {
                                epoch: m.epoch.0,
                                message: e.to_string(),
                            })?;
                        task_restore
                            .splits
                            .insert(sp.split_id.clone(), (cursor, sp.finished, sp.max_timestamp));
                    }
                }
            }
            let mut stages = Vec::new();
            for op in &v.operators {
                let plugin = plugin_of(op)?;
                let owned = if v.keyed {
                    st.shards
                        .first()
                        .map(|f| f.0..st.shards.last().map_or(f.0, |l| l.0 + 1))
                        .unwrap_or(0..0)
                } else if v.parallelism == 1 {
                    0..job.state_shard_count
                } else {
                    0..0
                };
                let state = if op.kind == PluginKind::Operator && !plugin.info.states.is_empty() {
                    Some(StateConfig {
                        path: state_root
                            .join(sanitize(op.operator_id.as_str()))
                            .join(format!("{sub}.redb")),
                        shard_count: job.state_shard_count,
                        owned: owned.clone(),
                        states: plugin.info.states.clone(),
                        max_cached_entries: StateConfig::DEFAULT_MAX_CACHED_ENTRIES,
                    })
                } else {
                    None
                };
                if let Some(m) = restore
                    && op.kind == PluginKind::Operator
                {
                    let mut states = plugin.info.states.clone();
                    states.push(crate::plugin::timer_descriptor());
                    let shards = read_shards(
                        storage.as_ref(),
                        m,
                        op.operator_id.as_str(),
                        &owned,
                        &states,
                    )?;
                    if !shards.is_empty() {
                        task_restore
                            .shards
                            .insert(op.operator_id.to_string(), shards);
                    }
                }
                stages.push(StageSpec {
                    options: InstanceOptions {
                        site: Site {
                            plugin: plugin.label.clone(),
                            operator: op.name.clone(),
                            subtask: Some(sub),
                        },
                        limits: opts.limits.clone(),
                        grants: grants_of(op, opts)?,
                        state,
                    },
                    plugin,
                    task_info: task_info(op, sub, v.parallelism),
                    config: op.config.to_string(),
                    operator_id: op.operator_id.to_string(),
                });
            }
            let mut inputs = Vec::new();
            for ch in &st.inputs {
                let edge = plan
                    .edge(&ch.edge)
                    .ok_or_else(|| RuntimeError::Internal(format!("unknown edge {}", ch.edge)))?;
                inputs.push(InputChannel {
                    id: ch.clone(),
                    rx: transport.open_receiver(ch, token)?,
                    input_index: edge.input_index,
                    watermark: i64::MIN,
                    idle: false,
                    ended: false,
                    closed: false,
                });
            }
            let mut outputs = Vec::new();
            for edge in plan.edges.iter().filter(|e| e.from == v.id) {
                let mut chans: Vec<_> = edge
                    .channels
                    .iter()
                    .filter(|c| c.upstream == st.index)
                    .collect();
                chans.sort_by_key(|c| c.downstream);
                let senders = chans
                    .iter()
                    .map(|c| transport.open_sender(c, token))
                    .collect::<Result<Vec<_>>>()?;
                outputs.push(
                    OutputEdge::new(
                        edge.id.clone(),
                        edge.partition,
                        senders,
                        chans.iter().map(|c| c.downstream.0).collect(),
                        edge.shard_owners.iter().map(|s| s.0).collect(),
                    )
                    .with_output(edge.output.clone()),
                );
            }
            let sink_txn_prefix = tail_is_sink.then(|| {
                let op = v.operators.last().expect("non-empty chain");
                format!(
                    "{}:{}:{}:{}:",
                    job.job_id, job.pipeline_id, op.operator_id, sub
                )
            });
            if tail_is_sink {
                sink_tasks.insert(st.task.clone());
            }
            if v.operators[0].kind == PluginKind::Source {
                source_tasks.push(st.task.clone());
            }
            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            commands.insert(st.task.clone(), cmd_tx);
            specs.push(TaskSpec {
                task: st.task.clone(),
                attempt,
                stages,
                inputs,
                outputs,
                splits: splits_of.remove(&(vi, sub)).unwrap_or_default(),
                watermarks: v.operators[0].watermarks,
                alignment: alignments.get(&vi).map(|a| (Arc::clone(a), sub as usize)),
                batch_records: job.batch_records.min(opts.limits.max_batch_records),
                sink_txn_prefix,
                first_epoch,
                restore: Some(task_restore),
                storage: Arc::clone(storage),
                namespace: namespace.clone(),
                events: events_tx.clone(),
                commands: cmd_rx,
                progress: Arc::clone(progress),
                cancel: Arc::clone(&cancel),
            });
        }
    }
    drop(events_tx);
    let total = specs.len();
    let mut handles = Vec::new();
    for spec in specs {
        let name = format!("task-{}", spec.task);
        handles.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || task::run(spec))
                .map_err(|e| RuntimeError::Internal(format!("cannot spawn task thread: {e}")))?,
        );
    }

    // The coordinator loop.
    let mut coord = EpochCoordinator::new(
        plan.ack_set.iter().cloned(),
        attempt,
        first_epoch,
        job.checkpoint_interval_ms,
        opts.checkpoint_timeout_ms,
        restore.map(|m| m.epoch),
    );
    let clock = Instant::now();
    let mut failure: Option<RuntimeError> = None;
    let mut ended = 0usize;
    let mut reports = Vec::new();
    let mut created_ms: BTreeMap<EpochId, u64> = BTreeMap::new();
    let mut commit_acks: BTreeMap<EpochId, BTreeSet<TaskId>> = BTreeMap::new();
    let mut pending_txns: BTreeMap<EpochId, Vec<CommittedTransaction>> = BTreeMap::new();
    let mut final_epoch = None;
    let mut queue: Vec<Command> = Vec::new();
    let fail = |failure: &mut Option<RuntimeError>, error: RuntimeError| {
        let replace = match failure {
            None => true,
            Some(f) => is_secondary(f) && !is_secondary(&error),
        };
        if replace {
            *failure = Some(error);
        }
        if !cancel.swap(true, Ordering::SeqCst) {
            // Fence the attempt: no token is valid any more, so its channels refuse every
            // further write (seed §10.2); the next attempt gets a new transport and token.
            transport.fence(FencingToken(u64::MAX));
        }
    };
    while ended < total {
        let event = match events_rx.recv_timeout(Duration::from_millis(10)) {
            Ok(e) => Some(e),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        };
        let now = clock.elapsed().as_millis() as u64;
        if failure.is_none() {
            queue.extend(coord.handle(Event::Tick { now_ms: now }));
        }
        match event {
            None => {}
            Some(TaskEvent::Ack {
                attempt: a,
                snapshot,
            }) if failure.is_none() => {
                queue.extend(coord.handle(Event::Ack {
                    attempt: a,
                    snapshot,
                }));
            }
            Some(TaskEvent::EndOfData { attempt: a, task }) if failure.is_none() => {
                queue.extend(coord.handle(Event::EndOfData { attempt: a, task }));
            }
            // A failing attempt's snapshots and ends of data no longer count.
            Some(TaskEvent::Ack { .. } | TaskEvent::EndOfData { .. }) => {}
            Some(TaskEvent::Committed { task, epoch }) => {
                let acks = commit_acks.entry(epoch).or_default();
                acks.insert(task);
                if acks.len() == sink_tasks.len() && failure.is_none() {
                    queue.extend(coord.handle(Event::SinksCommitted { epoch }));
                }
            }
            Some(TaskEvent::Finished { report }) => {
                ended += 1;
                reports.push(report);
            }
            Some(TaskEvent::Failed { task, error }) => {
                ended += 1;
                tracing::debug!(%task, "task failed: {error}");
                fail(&mut failure, error);
            }
        }
        while !queue.is_empty() && failure.is_none() {
            let cmd = queue.remove(0);
            match cmd {
                Command::InjectBarrier {
                    epoch,
                    final_epoch: f,
                } => {
                    log(epoch, EpochState::Created, f.then(|| "final".to_owned()))?;
                    created_ms.insert(epoch, now_ms());
                    for t in &source_tasks {
                        let _ = commands[t].send(TaskCommand::InjectBarrier(epoch));
                    }
                }
                Command::PublishManifest {
                    epoch,
                    final_epoch: f,
                    snapshots,
                    ..
                } => {
                    let finished: BTreeSet<&str> = snapshots
                        .iter()
                        .flat_map(|s| {
                            s.splits
                                .iter()
                                .filter(|sp| sp.finished)
                                .map(|sp| sp.split_id.as_str())
                        })
                        .collect();
                    let mut manifest = EpochManifest {
                        epoch,
                        job_id: job.job_id.to_string(),
                        pipeline_id: job.pipeline_id.to_string(),
                        namespace: namespace.clone(),
                        plan_fingerprint: plan.fingerprint.clone(),
                        state_shard_count: job.state_shard_count,
                        attempt,
                        fencing_token: token,
                        final_epoch: f,
                        enumerators: enumerators
                            .iter()
                            .map(|e| EnumeratorState {
                                operator_id: e.operator_id.clone(),
                                splits: e.splits.clone(),
                                finished: e
                                    .splits
                                    .iter()
                                    .filter(|(id, _)| finished.contains(id.as_str()))
                                    .map(|(id, _)| id.clone())
                                    .collect(),
                            })
                            .collect(),
                        tasks: snapshots,
                        state_format_version: STATE_FORMAT_VERSION,
                        created_ms: created_ms.get(&epoch).copied().unwrap_or(0),
                        durable_ms: now_ms(),
                        checksum: String::new(),
                    };
                    manifest.seal();
                    storage
                        .publish_manifest(&manifest)
                        .map_err(|e| RuntimeError::Io {
                            path: format!("manifest of epoch {epoch}"),
                            message: e.to_string(),
                        })?;
                    log(epoch, EpochState::Durable, None)?;
                    failpoint::hit("after-manifest-publish");
                    tally.durable_epochs += 1;
                    pending_txns.insert(
                        epoch,
                        manifest
                            .tasks
                            .iter()
                            .flat_map(|t| {
                                t.pending_transactions.iter().filter(|p| p.epoch == epoch)
                            })
                            .map(|p| CommittedTransaction {
                                epoch: p.epoch.0,
                                txn: p.txn.clone(),
                            })
                            .collect(),
                    );
                    if let Err(e) = storage.retain(opts.retain_epochs) {
                        tracing::warn!("checkpoint retention failed: {e}");
                    }
                    if f {
                        final_epoch = Some(epoch);
                    }
                    queue.extend(coord.handle(Event::ManifestDurable { epoch }));
                }
                Command::Commit { epoch } => {
                    if sink_tasks.is_empty() {
                        queue.extend(coord.handle(Event::SinksCommitted { epoch }));
                    } else {
                        for t in &sink_tasks {
                            let _ = commands[t].send(TaskCommand::Commit(epoch));
                        }
                    }
                }
                Command::Abort { epoch, reason } => {
                    tracing::warn!("epoch {epoch} aborted: {reason}");
                    log(epoch, EpochState::Aborted, Some(reason))?;
                }
                Command::Finish => {
                    for c in commands.values() {
                        let _ = c.send(TaskCommand::Finish);
                    }
                }
            }
            // COMMITTED is recorded as soon as the coordinator accepted it.
            if let Some(c) = coord.latest_committed()
                && let Some(txns) = pending_txns.remove(&c)
            {
                log(c, EpochState::Committed, None)?;
                tally.committed.extend(txns);
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    if let Some(e) = failure {
        return Err(e);
    }
    reports.sort_by(|a, b| a.task.cmp(&b.task));
    match final_epoch {
        Some(f) if coord.is_finished() => Ok((reports, f)),
        _ => Err(RuntimeError::Internal(
            "every task ended before the final epoch committed".into(),
        )),
    }
}
