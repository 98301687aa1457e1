//! The embedded job runner: the coordinator role of one process (design §8 "the embedded
//! mode keeps all roles in one process"). It enumerates source splits, wires every
//! subtask's channels from the PartitionedPlan through a [`Transport`], runs one thread
//! per subtask, drives the final epoch's two-phase commit (seed §5.9), and on any task
//! failure fences the attempt and stops every task.

use crate::bindings::{Split, TaskInfo};
use crate::error::{Result, RuntimeError, Site};
use crate::limits::Limits;
use crate::partition::OutputEdge;
use crate::plugin::{DirGrant, Instance, InstanceOptions, LoadedPlugin};
use crate::task::{self, InputChannel, StageSpec, TaskCommand, TaskEvent, TaskReport, TaskSpec};
use crate::transport::{LocalTransport, Transport};
use nop_stream_api::{
    AttemptId, EpochId, FencingToken, OperatorId, PluginKind, SemanticMode, TaskId,
};
use nop_stream_core::{PartitionedPlan, PlannedOperator};
use nop_stream_state::StateConfig;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
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
    /// Working directory for state databases (`<work_dir>/state`).
    pub work_dir: PathBuf,
    /// Sandbox limits of every instance.
    pub limits: Limits,
    /// Capacity of each channel in batches (default [`LocalTransport::DEFAULT_CAPACITY`]).
    pub channel_capacity: usize,
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

    /// Records read by all sources so far.
    pub fn records_read(&self) -> u64 {
        self.records_read.load(Ordering::Relaxed)
    }

    /// Records written by all sinks so far (staged, not yet committed).
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
    /// Sink operator name.
    pub operator: String,
    /// Subtask of the sink.
    pub subtask: u32,
    /// Transaction id (seed §7.2).
    pub txn: String,
    /// Committable bytes as text (lossy UTF-8) for display.
    pub committable: String,
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
    /// Wall time of the run.
    pub wall: Duration,
    /// Records read by sources.
    pub records_read: u64,
    /// Records written by sinks.
    pub records_written: u64,
    /// Transactions committed in the final epoch.
    pub committed: Vec<CommittedTransaction>,
    /// Per-task figures.
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
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn is_secondary(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::Cancelled | RuntimeError::ChannelClosed { .. } | RuntimeError::Fenced { .. }
    )
}

/// Runs `plan` to completion with the embedded backend.
///
/// # Errors
/// The root-cause failure of the first failing task (a trap, limit, guest error, commit
/// uncertainty...), after every other task has stopped and the attempt was fenced; or a
/// setup error (missing plugin, grant, state directory).
pub fn run_job(
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    opts: &RunOptions,
    progress: Arc<JobProgress>,
) -> Result<JobReport> {
    let started = Instant::now();
    let job = &plan.job;
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
    let attempt = AttemptId(1);
    let token = FencingToken(1);
    let epoch = EpochId(1); // the final (and, without periodic checkpoints, only) epoch
    let task_info = |op: &PlannedOperator, subtask: u32, parallelism: u32| TaskInfo {
        job_id: job.job_id.to_string(),
        pipeline_id: job.pipeline_id.to_string(),
        operator_id: op.operator_id.to_string(),
        operator_name: op.name.clone(),
        subtask_index: subtask,
        parallelism,
        attempt: attempt.0,
    };

    // Source enumerators: discover splits once, assign split j to reader j mod p.
    let mut splits_of: HashMap<(usize, u32), Vec<Split>> = HashMap::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let head = &v.operators[0];
        if head.kind != PluginKind::Source {
            continue;
        }
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
        for (j, s) in splits.into_iter().enumerate() {
            splits_of
                .entry((vi, j as u32 % v.parallelism))
                .or_default()
                .push(s);
        }
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
    let mut commands: HashMap<TaskId, crossbeam_channel::Sender<TaskCommand>> = HashMap::new();
    let mut sink_tasks = 0usize;
    let mut handles = Vec::new();
    let mut specs = Vec::new();

    for (vi, v) in plan.vertices.iter().enumerate() {
        let tail_is_sink = v.operators.last().map(|o| o.kind) == Some(PluginKind::Sink);
        for st in &v.subtasks {
            let sub = st.index.0;
            let mut stages = Vec::new();
            for op in &v.operators {
                let plugin = plugin_of(op)?;
                let state = if op.kind == PluginKind::Operator && !plugin.info.states.is_empty() {
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
                    Some(StateConfig {
                        path: state_root
                            .join(sanitize(op.operator_id.as_str()))
                            .join(format!("{sub}.redb")),
                        shard_count: job.state_shard_count,
                        owned,
                        states: plugin.info.states.clone(),
                        max_cached_entries: StateConfig::DEFAULT_MAX_CACHED_ENTRIES,
                    })
                } else {
                    None
                };
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
                    ended: false,
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
                outputs.push(OutputEdge::new(
                    edge.id.clone(),
                    edge.partition,
                    senders,
                    chans.iter().map(|c| c.downstream.0).collect(),
                    edge.shard_owners.iter().map(|s| s.0).collect(),
                ));
            }
            let sink_txn = tail_is_sink.then(|| {
                let op = v.operators.last().expect("non-empty chain");
                format!(
                    "{}:{}:{}:{}:{}",
                    job.job_id, job.pipeline_id, op.operator_id, sub, epoch
                )
            });
            if tail_is_sink {
                sink_tasks += 1;
            }
            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            commands.insert(st.task.clone(), cmd_tx);
            specs.push(TaskSpec {
                task: st.task.clone(),
                stages,
                inputs,
                outputs,
                splits: splits_of.remove(&(vi, sub)).unwrap_or_default(),
                batch_records: job.batch_records.min(opts.limits.max_batch_records),
                sink_txn,
                events: events_tx.clone(),
                commands: cmd_rx,
                progress: Arc::clone(&progress),
                cancel: Arc::clone(&cancel),
            });
        }
    }
    drop(events_tx);
    let total = specs.len();
    for spec in specs {
        let name = format!("task-{}", spec.task);
        handles.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || task::run(spec))
                .map_err(|e| RuntimeError::Internal(format!("cannot spawn task thread: {e}")))?,
        );
    }

    // Coordinator loop.
    let mut failure: Option<RuntimeError> = None;
    let mut ended = 0usize;
    let mut precommitted: Vec<(TaskId, Site, String, Vec<u8>)> = Vec::new();
    let mut committing = false;
    let mut reports = Vec::new();
    while ended < total {
        let Ok(event) = events_rx.recv() else { break };
        match event {
            TaskEvent::PreCommitted {
                task,
                sink,
                txn,
                committable,
            } => precommitted.push((task, sink, txn, committable)),
            TaskEvent::Finished { report, .. } => {
                ended += 1;
                reports.push(report);
            }
            TaskEvent::Failed { task, error } => {
                ended += 1;
                tracing::debug!(%task, "task failed: {error}");
                let replace = match &failure {
                    None => true,
                    Some(f) => is_secondary(f) && !is_secondary(&error),
                };
                if replace {
                    failure = Some(error);
                }
                if !cancel.swap(true, Ordering::SeqCst) {
                    transport.fence(FencingToken(token.0 + 1));
                    for (_, c) in commands.iter() {
                        let _ = c.send(TaskCommand::Abort);
                    }
                }
            }
        }
        // Final epoch: every non-sink task ended and every sink pre-committed. Here the
        // checkpoint protocol publishes the manifest before any commit (seed §5.6).
        if failure.is_none()
            && !committing
            && precommitted.len() == sink_tasks
            && ended + sink_tasks == total
        {
            committing = true;
            for (task, ..) in &precommitted {
                if let Some(c) = commands.get(task) {
                    let _ = c.send(TaskCommand::Commit);
                }
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
    Ok(JobReport {
        job_id: job.job_id.to_string(),
        semantic: job.semantic,
        attempt: attempt.0,
        wall: started.elapsed(),
        records_read: progress.records_read(),
        records_written: progress.records_written(),
        committed: precommitted
            .into_iter()
            .map(|(_, site, txn, c)| CommittedTransaction {
                operator: site.operator,
                subtask: site.subtask.unwrap_or(0),
                txn,
                committable: String::from_utf8_lossy(&c).into_owned(),
            })
            .collect(),
        tasks: reports,
    })
}
