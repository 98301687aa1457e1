//! The recovery loop and the epoch loop of one attempt (design §5, §10.1).
//!
//! [`run_job`] is a short sequence of named steps per attempt: read the latest durable
//! manifest and check it ([`crate::check_restore`]), allocate the attempt, assign splits,
//! settle sinks before a rescale, plan the restore, deploy, then drive the epochs until
//! the final epoch is committed or a task fails. A failed attempt is always fenced and
//! joined before the next one starts: the [`Attempt`] guard does it on every exit path,
//! early `?` returns included.

use crate::restore::{
    assign_splits, check_restore, checkpoint_namespace, plan_restore, restored_splits,
    sink_settlements,
};
use crate::{CommittedTransaction, CoordinatorError, JobReport, Next, Workers};
use nop_stream_api::{AttemptId, EpochId, FencingToken, PluginKind, Split, TaskId};
use nop_stream_checkpoint::coordinator::{Command, EpochCoordinator, EpochState, Event};
use nop_stream_checkpoint::{
    EnumeratorState, EpochLogRecord, EpochManifest, Location, Namespace, STATE_FORMAT_VERSION,
    SavepointInfo, StorageError, TaskSnapshot, failpoint,
};
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::{
    Deployment, FailureClass, TaskAssignment, TaskCommand, TaskError, TaskEvent, TaskReport,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the coordinator runs a job.
#[derive(Debug, Clone)]
pub struct CoordinatorOptions {
    /// Global recoveries allowed after task failures within any [`Self::restart_window`]
    /// (Flink's failure-rate restart strategy): a failure that finds this many recoveries
    /// in the window before it ends the run. `None`: [`DEFAULT_MAX_RESTARTS`] when the job
    /// checkpoints periodically, 0 otherwise.
    pub max_restarts: Option<u32>,
    /// The window of [`Self::max_restarts`]. Default 60 s. With the default budget and
    /// backoff, an outage of an external system shorter than about 25 s (the pauses of ten
    /// recoveries: 100 ms doubling to 5 s) does not end a run; a failure that repeats
    /// ends it after those ten.
    pub restart_window: Duration,
    /// Epochs older than this are aborted, in ms. Default 60,000.
    pub checkpoint_timeout_ms: u64,
    /// Durable epochs kept per namespace. Default 3.
    pub retain_epochs: usize,
    /// An explicit rescale action (design §10.5): the fingerprint of this same job compiled
    /// at the parallelism the checkpoint was taken with. `None` (default): a changed plan
    /// is refused (design §10.4).
    pub rescale_from: Option<String>,
    /// Pause before a recovery when no other recovery is in the restart window; it doubles
    /// with every further recovery in the window, up to [`Self::restart_delay_max`] (see
    /// [`restart_backoff`]). Default 100 ms.
    pub restart_delay: Duration,
    /// Longest pause before a recovery attempt. Default 5 s.
    pub restart_delay_max: Duration,
    /// How long the epoch loop waits for an event before it ticks the epoch clock.
    /// Default 10 ms.
    pub poll: Duration,
    /// sha256 of the component running each operator, by operator id, recorded in every
    /// manifest for savepoint checks (design §10.4). Missing entries are recorded empty.
    pub components: BTreeMap<String, String>,
    /// Savepoint requests for the running job (`nopstream savepoint take`); `None`: none
    /// can be made.
    pub savepoints: Option<Arc<Mutex<Receiver<SavepointRequest>>>>,
    /// Where savepoints go: a savepoint requested without a location is `epoch-N` in
    /// it, one requested with a relative name is that name in it. Default `savepoints`
    /// (a directory relative to the working directory of the process).
    pub savepoint_root: Location,
    /// The leadership this coordinator acts under (design §14.5, "Coordinator HA"): checked
    /// before every barrier, manifest, commit and abort, so a deposed leader acts on
    /// nothing. `None`: the only coordinator.
    pub leadership: Option<Arc<crate::election::Leadership>>,
}

/// A request to take a savepoint of the running job (design §10.4): the coordinator
/// triggers an epoch at once, and exports the first epoch made durable after the request
/// into a self-contained savepoint directory, before retention can touch it.
#[derive(Debug)]
pub struct SavepointRequest {
    /// Where to create the savepoint (it must hold none): a location URL or absolute
    /// path, or a name inside [`CoordinatorOptions::savepoint_root`]; `None`: `epoch-N` in
    /// the root.
    pub out: Option<String>,
    /// Stop the job once the savepoint is taken (`nopstream stop --savepoint`, design
    /// §10.4): no epoch is triggered after the savepoint's, the sinks commit it, then every
    /// task is cancelled and the run ends with [`JobReport::stopped`] set. Records read
    /// after the savepoint's barrier are never committed; a run from the savepoint (or a
    /// plain restart, which resumes from the same epoch) reads them again. The reply comes
    /// once the job has stopped.
    pub stop: bool,
    /// Where the answer goes: the savepoint made, or why none was.
    pub reply: Sender<Result<SavepointInfo, String>>,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        CoordinatorOptions {
            max_restarts: None,
            restart_window: Duration::from_secs(60),
            checkpoint_timeout_ms: 60_000,
            retain_epochs: 3,
            rescale_from: None,
            restart_delay: Duration::from_millis(100),
            restart_delay_max: Duration::from_secs(5),
            poll: Duration::from_millis(10),
            components: BTreeMap::new(),
            savepoints: None,
            savepoint_root: Location::Local("savepoints".into()),
            leadership: None,
        }
    }
}

/// Opens the checkpoint namespace of `plan` in the checkpoint root `root` (see
/// [`crate::checkpoint_location`]). Without `resume`, its checkpoints are deleted first and
/// the job starts fresh.
///
/// # Errors
/// [`CoordinatorError::Storage`] if the store cannot be opened or emptied.
pub fn open_namespace(
    root: &Location,
    plan: &PartitionedPlan,
    resume: bool,
) -> Result<Arc<Namespace>, CoordinatorError> {
    let location = crate::checkpoint_location(root, plan);
    let err = |e: StorageError| CoordinatorError::Storage {
        path: location.to_string(),
        message: e.to_string(),
    };
    let ns = Namespace::open(&location).map_err(err)?;
    if !resume {
        ns.delete_all().map_err(err)?;
    }
    Ok(Arc::new(ns))
}

fn storage_err(what: &str) -> impl Fn(StorageError) -> CoordinatorError + '_ {
    move |e| match e {
        StorageError::EpochTaken { epoch, .. } => CoordinatorError::EpochTaken {
            epoch,
            message: e.to_string(),
        },
        e => CoordinatorError::Storage {
            path: what.to_owned(),
            message: e.to_string(),
        },
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the attempts of one run achieved, kept across recoveries.
#[derive(Default)]
struct RunTally {
    recoveries: u32,
    resumed_from: Option<u64>,
    durable_epochs: u64,
    committed: Vec<CommittedTransaction>,
    committed_total: u64,
    refused_stale: u64,
    /// Records read by sources and written by sinks up to the latest durable epoch.
    durable_records: (u64, u64),
}

/// Runs `plan` to completion on `workers`: epoch checkpoints, resuming from the latest
/// durable manifest in `storage`, and global recovery from task failures up to the
/// restart budget (design §10.1).
///
/// # Errors
/// The root-cause failure once the restart budget is spent or when it is not
/// recoverable; a restore incompatibility; a storage failure.
pub fn run_job<W: Workers>(
    plan: &PartitionedPlan,
    workers: &mut W,
    storage: Arc<Namespace>,
    opts: &CoordinatorOptions,
) -> Result<JobReport, W::Error> {
    let started = Instant::now();
    let mut budget = RestartBudget::new(
        opts.max_restarts.unwrap_or(
            if plan.job.checkpoint_interval_ms.is_some()
                || plan.job.checkpoint_every_records.is_some()
            {
                DEFAULT_MAX_RESTARTS
            } else {
                0
            },
        ),
        opts.restart_window,
    );
    let mut tally = RunTally::default();
    loop {
        // A recoverable failure before the deployment (split discovery or settling sinks
        // on a node that does not answer, storage that is briefly unreachable) is a
        // recovery like a failed attempt's, within the same budget.
        let prepared = match prepare_attempt(plan, workers, storage.as_ref(), opts, &mut tally) {
            Ok(p) => p,
            Err(e) if e.class() != FailureClass::Fatal => {
                recover_or_end(&mut budget, &mut tally, opts, "preparing an attempt", e)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let prepared = match prepared {
            Prepared::AlreadyFinished { attempt, epoch } => {
                if let Ok(Some(m)) = storage.latest_manifest() {
                    tally.durable_records = durable_records(plan, &m.tasks);
                }
                let (read, written) = workers.records();
                return Ok(report(
                    plan,
                    &tally,
                    started,
                    attempt,
                    Some(epoch),
                    true,
                    (read, written),
                    Vec::new(),
                ));
            }
            Prepared::Attempt(p) => p,
        };
        let attempt = prepared.deployment.attempt;
        let result = drive_attempt(plan, workers, &storage, opts, *prepared, &mut tally);
        match result {
            Ok(end) => {
                let records = workers.records();
                let mut r = report(
                    plan,
                    &tally,
                    started,
                    attempt,
                    Some(end.epoch.0),
                    false,
                    records,
                    end.tasks,
                );
                r.stopped = end.stopped;
                return Ok(r);
            }
            Err(e) if e.class() != FailureClass::Fatal => {
                recover_or_end(
                    &mut budget,
                    &mut tally,
                    opts,
                    &format!("attempt {attempt}"),
                    e,
                )?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// After a recoverable failure of `what`: `Ok` (counted, after the backoff) if the restart
/// budget admits one more recovery, else `Err(e)`, which ends the run.
fn recover_or_end<E: std::fmt::Display>(
    budget: &mut RestartBudget,
    tally: &mut RunTally,
    opts: &CoordinatorOptions,
    what: &str,
    e: E,
) -> Result<(), E> {
    let Some(in_window) = budget.admit(Instant::now()) else {
        tracing::warn!(
            "{what} failed with {} recoveries within the last {} s (--max-restarts): the run \
             ends",
            budget.max,
            budget.window.as_secs_f64()
        );
        return Err(e);
    };
    tally.recoveries += 1;
    tracing::warn!(
        "{what} failed, recovering from the latest durable epoch (recovery {in_window} of {} \
         allowed within {} s): {e}",
        budget.max,
        budget.window.as_secs_f64()
    );
    std::thread::sleep(restart_backoff(
        opts.restart_delay,
        opts.restart_delay_max,
        in_window - 1,
    ));
    Ok(())
}

/// Recoveries allowed after task failures when a job checkpoints periodically and sets no
/// budget: within any [`CoordinatorOptions::restart_window`].
pub const DEFAULT_MAX_RESTARTS: u32 = 10;

/// The failure-rate restart budget (Flink's `failure-rate` strategy): at most `max`
/// recoveries within any `window`. Pure: the caller passes the time.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    /// Recoveries allowed within a window.
    pub max: u32,
    /// The window.
    pub window: Duration,
    /// When each recovery still in the window was admitted, oldest first.
    recent: VecDeque<Instant>,
}

impl RestartBudget {
    /// A budget of `max` recoveries within any `window`.
    pub fn new(max: u32, window: Duration) -> Self {
        RestartBudget {
            max,
            window,
            recent: VecDeque::new(),
        }
    }

    /// A failure at `now`: `Some(n)` when it may recover, `n` being how many recoveries
    /// (this one included, so at least 1) the window ending at `now` holds, which sets the
    /// backoff; `None` when `max` recoveries already happened less than `window` before
    /// `now`, and the run must end.
    pub fn admit(&mut self, now: Instant) -> Option<u32> {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max as usize {
            return None;
        }
        self.recent.push_back(now);
        Some(self.recent.len() as u32)
    }
}

/// How long after its tasks are deployed an attempt that restored from a durable epoch
/// starts its first periodic epoch (at most one checkpoint interval): 100 ms. The tasks
/// have started when the deployment returns (a cluster's nodes confirmed it), so the
/// barrier waits at most for their restore; what the sinks wrote since the restore is
/// then committed about one checkpoint duration later rather than a whole interval later
/// ([`EpochCoordinator::with_first_interval_ms`]).
pub const FIRST_EPOCH_AFTER_RESTORE_MS: u64 = 100;

/// The pause before recovery `n` of a run (0 for the first): `first × 2^n`, capped at
/// `max` (exponential backoff; with the defaults 100 ms, 200 ms, 400 ms, … 5 s).
pub fn restart_backoff(first: Duration, max: Duration, n: u32) -> Duration {
    first
        .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max)
}

#[allow(clippy::too_many_arguments)]
fn report(
    plan: &PartitionedPlan,
    tally: &RunTally,
    started: Instant,
    attempt: AttemptId,
    final_epoch: Option<u64>,
    already_finished: bool,
    (records_read, records_written): (u64, u64),
    tasks: Vec<TaskReport>,
) -> JobReport {
    JobReport {
        job_id: plan.job.job_id.to_string(),
        semantic: plan.job.semantic,
        attempt: attempt.0,
        recoveries: tally.recoveries,
        resumed_from: if already_finished {
            final_epoch
        } else {
            tally.resumed_from
        },
        already_finished,
        wall: started.elapsed(),
        records_read,
        records_written,
        epochs: tally.durable_epochs,
        durable_records_read: tally.durable_records.0,
        durable_records_written: tally.durable_records.1,
        final_epoch,
        committed: tally.committed.clone(),
        committed_total: tally.committed_total,
        refused_stale_events: tally.refused_stale,
        tasks,
        stopped: false,
    }
}

/// An attempt ready to deploy.
struct PreparedAttempt {
    deployment: Deployment,
    restore_epoch: Option<EpochId>,
    enumerators: Vec<EnumeratorState>,
    sources: Vec<TaskId>,
    sinks: BTreeSet<TaskId>,
}

enum Prepared {
    /// The latest manifest is the final epoch and it committed: nothing to do.
    AlreadyFinished {
        attempt: AttemptId,
        epoch: u64,
    },
    Attempt(Box<PreparedAttempt>),
}

/// The latest durable manifest and the epoch log.
fn settle_epochs(
    storage: &Namespace,
) -> Result<(Option<EpochManifest>, Vec<EpochLogRecord>), CoordinatorError> {
    let restore = storage
        .latest_manifest()
        .map_err(storage_err("latest manifest"))?;
    let log = storage.read_log().map_err(storage_err("epoch log"))?;
    Ok((restore, log))
}

/// Steps before a deployment: check the restore, allocate the attempt, fence the epochs of
/// earlier attempts, assign splits, settle sinks before a rescale, plan the restore.
fn prepare_attempt<W: Workers>(
    plan: &PartitionedPlan,
    workers: &mut W,
    storage: &Namespace,
    opts: &CoordinatorOptions,
    tally: &mut RunTally,
) -> Result<Prepared, W::Error> {
    let (restore, log) = settle_epochs(storage)?;
    let mut rescale = false;
    if let Some(m) = &restore {
        rescale = check_restore(m, plan, opts.rescale_from.as_deref()).map_err(|e| match e {
            CoordinatorError::Restore { epoch, message } => CoordinatorError::Restore {
                epoch,
                message: format!("{message} (checkpoints in {})", storage.describe()),
            },
            e => e,
        })?;
        if tally.resumed_from.is_none() && tally.recoveries == 0 {
            tally.resumed_from = Some(m.epoch.0);
        }
    }
    if let Some(m) = &restore
        && m.final_epoch
        && log
            .iter()
            .any(|r| r.epoch == m.epoch && r.state == EpochState::Committed)
    {
        return Ok(Prepared::AlreadyFinished {
            attempt: m.attempt,
            epoch: m.epoch.0,
        });
    }
    let max_epoch = log
        .iter()
        .map(|r| r.epoch.0)
        .chain(restore.as_ref().map(|m| m.epoch.0))
        .max()
        .unwrap_or(0);
    let attempt = AttemptId(
        storage
            .next_attempt(log.iter().map(|r| r.attempt.0).max().unwrap_or(0))
            .map_err(storage_err("attempt"))?,
    );
    // Fence the epochs earlier attempts created but never made durable: their aborted
    // records stop a write of a fenced attempt from making one durable later (design §6).
    // One that turned durable meanwhile (a publish whose acknowledgement was lost) is the
    // latest: start over from it.
    let durable_from = restore.as_ref().map_or(0, |m| m.epoch.0);
    let aborted = storage
        .durable()
        .map_err(storage_err("epoch records"))?
        .aborted;
    // A fresh namespace's first attempt has no predecessor and starts at 1 (a namespace
    // seeded from a savepoint goes on after the savepoint's epoch); every other attempt
    // also fences `max_epoch + 1`, the epoch a predecessor still running (a deposed
    // coordinator, a stopped process resumed) would make durable next, and starts after
    // it. So every epoch this attempt claims is greater than every epoch claimed before,
    // and a predecessor that publishes in epoch order is stopped at its next publish.
    let fresh = attempt.0 == 1 && restore.is_none();
    let fence_to = if fresh { max_epoch } else { max_epoch + 1 };
    for e in (durable_from + 1..=fence_to).filter(|e| !aborted.contains(e)) {
        let found = storage
            .abort_epoch(EpochId(e), attempt, &format!("fenced by attempt {attempt}"))
            .map_err(storage_err("epoch records"))?;
        if found.is_some() {
            tracing::info!(
                epoch = e,
                "an epoch of an earlier attempt turned out durable; restoring from it"
            );
            return prepare_attempt(plan, workers, storage, opts, tally);
        }
    }
    // After an earlier attempt, one epoch number is skipped (fenced above): a sink of a
    // fenced generation that still runs (a stopped node resumed, a partition) has at most
    // the epoch after its last barrier open, and that epoch was logged CREATED or is
    // `max_epoch + 1`; so no transaction of this generation shares its id (design §2.5,
    // fencing).
    let first_epoch = if fresh {
        EpochId(1)
    } else {
        EpochId(max_epoch + 2)
    };

    // Source enumerators (design §6.3): the split registry of the manifest, or discovery.
    let mut splits: BTreeMap<(usize, u32), Vec<Split>> = BTreeMap::new();
    let mut enumerators = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let head = &v.operators[0];
        if head.kind != PluginKind::Source {
            continue;
        }
        let found = match &restore {
            Some(m) => restored_splits(plan, vi, m)?,
            None => None,
        };
        let found = match found {
            Some(s) => s,
            None => workers.discover_splits(vi, attempt)?,
        };
        let (per_reader, registry) = assign_splits(head.operator_id.as_str(), found, v.parallelism);
        for (sub, s) in per_reader.into_iter().enumerate() {
            splits.insert((vi, sub as u32), s);
        }
        enumerators.push(registry);
    }
    if let (true, Some(m)) = (rescale, &restore) {
        workers.settle_sinks(&sink_settlements(plan, m), attempt)?;
    }
    let mut restores = plan_restore(plan, restore.as_ref(), rescale, &splits)?;

    let job = &plan.job;
    let mut tasks = Vec::new();
    let mut sources = Vec::new();
    let mut sinks = BTreeSet::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let tail = v.operators.last().expect("a vertex has operators");
        for st in &v.subtasks {
            let sub = st.index.0;
            if v.operators[0].kind == PluginKind::Source {
                sources.push(st.task.clone());
            }
            let sink_txn_prefix = (tail.kind == PluginKind::Sink).then(|| {
                sinks.insert(st.task.clone());
                format!(
                    "{}:{}:{}:{}:",
                    job.job_id, job.pipeline_id, tail.operator_id, sub
                )
            });
            tasks.push(TaskAssignment {
                task: st.task.clone(),
                vertex: vi as u32,
                subtask: sub,
                splits: splits.remove(&(vi, sub)).unwrap_or_default(),
                sink_txn_prefix,
                restore: restores.remove(&st.task).unwrap_or_default(),
            });
        }
    }
    Ok(Prepared::Attempt(Box::new(PreparedAttempt {
        deployment: Deployment {
            job: job.job_id.clone(),
            generation: u64::from(attempt.0),
            attempt,
            token: FencingToken(u64::from(attempt.0)),
            namespace: checkpoint_namespace(plan),
            first_epoch,
            tasks,
        },
        restore_epoch: restore.as_ref().map(|m| m.epoch),
        enumerators,
        sources,
        sinks,
    })))
}

/// The live deployment of one attempt. Dropping it fences the generation (unless it ended
/// cleanly) and joins its tasks, so no exit path leaves tasks running or sources reading.
struct Attempt<'w, W: Workers> {
    workers: &'w mut W,
    generation: u64,
    fenced: bool,
    joined: bool,
}

impl<'w, W: Workers> Attempt<'w, W> {
    fn fence(&mut self) {
        if !self.fenced {
            self.fenced = true;
            self.workers.fence(self.generation);
        }
    }

    fn join(&mut self) {
        if !self.joined {
            self.joined = true;
            self.workers.join();
        }
    }
}

impl<W: Workers> Drop for Attempt<'_, W> {
    fn drop(&mut self) {
        if !self.joined {
            self.fence();
            self.join();
        }
    }
}

/// The state of the epoch loop of one attempt.
struct Driver<'p, E> {
    plan: &'p PartitionedPlan,
    meta: nop_stream_checkpoint::SnapshotMeta,
    storage: &'p Arc<Namespace>,
    opts: &'p CoordinatorOptions,
    attempt: AttemptId,
    token: FencingToken,
    namespace: String,
    enumerators: Vec<EnumeratorState>,
    sources: Vec<TaskId>,
    sinks: BTreeSet<TaskId>,
    tasks: Vec<TaskId>,
    coord: EpochCoordinator,
    queue: VecDeque<Command>,
    failure: Option<E>,
    created_ms: BTreeMap<EpochId, u64>,
    commit_acks: BTreeMap<EpochId, BTreeSet<TaskId>>,
    pending_txns: BTreeMap<EpochId, Vec<CommittedTransaction>>,
    final_epoch: Option<EpochId>,
    reports: Vec<TaskReport>,
    ended: usize,
    /// Savepoint requests waiting for an epoch to become durable.
    savepoints: Vec<SavepointRequest>,
    /// Records read by the sources when the last record-count epoch started (or when the
    /// attempt began), for `job.checkpoint_every_records`.
    records_mark: Option<u64>,
    /// A stop with savepoint: the savepoint's epoch, once exported, and the replies that
    /// wait for the job to stop.
    stop_at: Option<(EpochId, Vec<StopReply>)>,
    /// The stop's epoch committed and the tasks were cancelled.
    stopped: bool,
    /// The last manifest's encoding, kept for its capacity (one buffer per attempt, not a
    /// fresh one per epoch).
    manifest_buf: Vec<u8>,
}

/// A stop's answer, sent once the job has stopped: where it goes, and the savepoint.
type StopReply = (Sender<Result<SavepointInfo, String>>, SavepointInfo);

/// How an attempt ended well.
struct AttemptEnd {
    /// Reports of the tasks that finished (none when stopped: they were cancelled).
    tasks: Vec<TaskReport>,
    /// The final epoch, or the stop's savepoint epoch.
    epoch: EpochId,
    /// Stopped with a savepoint rather than finished.
    stopped: bool,
}

/// Deploys a prepared attempt and drives it: ticks and task events go into the pure
/// [`EpochCoordinator`], whose commands are carried out here (barriers, manifests, the
/// epoch log, commits). Returns the task reports and the final epoch.
fn drive_attempt<W: Workers>(
    plan: &PartitionedPlan,
    workers: &mut W,
    storage: &Arc<Namespace>,
    opts: &CoordinatorOptions,
    prepared: PreparedAttempt,
    tally: &mut RunTally,
) -> Result<AttemptEnd, W::Error> {
    let PreparedAttempt {
        deployment,
        restore_epoch,
        enumerators,
        sources,
        sinks,
    } = prepared;
    let total = deployment.tasks.len();
    let mut coord = EpochCoordinator::new(
        plan.ack_set.iter().cloned(),
        deployment.attempt,
        deployment.first_epoch,
        plan.job.checkpoint_interval_ms,
        plan.job
            .checkpoint_timeout_ms
            .unwrap_or(opts.checkpoint_timeout_ms),
        restore_epoch,
    );
    if restore_epoch.is_some() {
        coord = coord.with_first_interval_ms(FIRST_EPOCH_AFTER_RESTORE_MS);
    }
    let mut d = Driver::<W::Error> {
        plan,
        meta: crate::compat::snapshot_meta(plan, &opts.components),
        storage,
        opts,
        attempt: deployment.attempt,
        token: deployment.token,
        namespace: deployment.namespace.clone(),
        enumerators,
        sources,
        sinks,
        tasks: deployment.tasks.iter().map(|t| t.task.clone()).collect(),
        coord,
        queue: VecDeque::new(),
        failure: None,
        created_ms: BTreeMap::new(),
        commit_acks: BTreeMap::new(),
        pending_txns: BTreeMap::new(),
        final_epoch: None,
        reports: Vec::new(),
        ended: 0,
        savepoints: Vec::new(),
        records_mark: None,
        stop_at: None,
        stopped: false,
        manifest_buf: Vec::new(),
    };
    let mut live = Attempt {
        generation: deployment.generation,
        workers,
        fenced: false,
        joined: false,
    };
    live.workers.deploy(deployment)?;
    let clock = Instant::now();
    while d.ended < total {
        let next = live.workers.next_event(opts.poll);
        // The event first, then the tick: a tick that sees the event at once starts the
        // final epoch as soon as the last source ends, not one poll interval later.
        match next {
            Next::Event(e) => d.on_event(e, tally, &mut live),
            Next::Timeout => {}
            Next::Closed => break,
        }
        if d.failure.is_none() && d.stop_at.is_none() {
            // Once a stop's savepoint is taken no further epoch starts.
            let now = clock.elapsed().as_millis() as u64;
            d.queue.extend(d.coord.handle(Event::Tick { now_ms: now }));
            if let Some(every) = plan.job.checkpoint_every_records {
                // Record-count epochs: the counter covers every deployment, so count
                // from what it read when this attempt began.
                let read = live.workers.records().0;
                let mark = *d.records_mark.get_or_insert(read);
                if read.saturating_sub(mark) >= every {
                    let started = d.coord.handle(Event::Trigger { now_ms: now });
                    if started
                        .iter()
                        .any(|c| matches!(c, Command::InjectBarrier { .. }))
                    {
                        d.records_mark = Some(read);
                    }
                    d.queue.extend(started);
                }
            }
            if let Some(rx) = &opts.savepoints {
                let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
                d.savepoints.extend(rx.try_iter());
            }
            if !d.savepoints.is_empty() && d.final_epoch.is_none() {
                // An epoch now (none starts while one is in flight; this repeats until one
                // does).
                d.queue
                    .extend(d.coord.handle(Event::Trigger { now_ms: now }));
            }
        }
        d.carry_out(&mut live, tally)?;
        if let Some((epoch, _)) = &d.stop_at
            && !d.stopped
            && d.failure.is_none()
            && d.coord.latest_committed().is_some_and(|c| c >= *epoch)
        {
            // The savepoint's epoch is committed by every sink: stop. Fencing cancels the
            // tasks; their open transactions (after the savepoint's barrier) are never
            // committed, and the next run aborts them (design §7.4).
            tracing::info!(epoch = %epoch, "savepoint committed; stopping the job");
            d.stopped = true;
            live.fence();
        }
    }
    live.join();
    if let Some((epoch, replies)) = d.stop_at.take() {
        for (reply, info) in replies {
            let _ = reply.send(if d.stopped {
                Ok(info)
            } else {
                Err(format!(
                    "savepoint {} (epoch {epoch}) was taken, but the job did not stop: {}",
                    info.dir,
                    match &d.failure {
                        Some(e) => format!("it failed first: {e}"),
                        None => "it finished first".to_owned(),
                    }
                ))
            });
        }
    }
    if d.stopped {
        let epoch = d.coord.latest_committed().unwrap_or(EpochId(0));
        d.reports.sort_by(|a, b| a.task.cmp(&b.task));
        return Ok(AttemptEnd {
            tasks: d.reports,
            epoch,
            stopped: true,
        });
    }
    for r in d.savepoints.drain(..) {
        let _ = r.reply.send(Err(match &d.failure {
            Some(e) => format!("the attempt failed before an epoch was durable: {e}"),
            None => "the job finished before a savepoint was taken; promote its final epoch \
                     with `nopstream savepoint promote`"
                .to_owned(),
        }));
    }
    if let Some(e) = d.failure {
        return Err(e);
    }
    d.reports.sort_by(|a, b| a.task.cmp(&b.task));
    match d.final_epoch {
        Some(f) if d.coord.is_finished() => Ok(AttemptEnd {
            tasks: d.reports,
            epoch: f,
            stopped: false,
        }),
        _ => Err(CoordinatorError::Internal(
            "every task ended before the final epoch committed".into(),
        )
        .into()),
    }
}

impl<E: TaskError> Driver<'_, E> {
    fn fail<W: Workers<Error = E>>(&mut self, error: E, live: &mut Attempt<'_, W>) {
        let replace = match &self.failure {
            None => true,
            Some(f) => {
                f.class() == FailureClass::Secondary && error.class() != FailureClass::Secondary
            }
        };
        if replace {
            self.failure = Some(error);
        }
        // Fence the generation: its channels refuse every further frame (design §10.2); the
        // next attempt gets a new generation and token.
        live.fence();
    }

    fn on_event<W: Workers<Error = E>>(
        &mut self,
        event: TaskEvent<E>,
        tally: &mut RunTally,
        live: &mut Attempt<'_, W>,
    ) {
        if event.attempt() != self.attempt {
            // An event of another generation: refused and counted (design §2.5).
            tally.refused_stale += 1;
            tracing::warn!(attempt = %event.attempt(), current = %self.attempt, "refused an event of a stale attempt");
            return;
        }
        let healthy = self.failure.is_none();
        match event {
            TaskEvent::Ack { attempt, snapshot } if healthy => {
                self.queue
                    .extend(self.coord.handle(Event::Ack { attempt, snapshot }));
            }
            TaskEvent::EndOfData { attempt, task } if healthy => {
                self.queue
                    .extend(self.coord.handle(Event::EndOfData { attempt, task }));
            }
            // A failing attempt's snapshots and ends of data no longer count.
            TaskEvent::Ack { .. } | TaskEvent::EndOfData { .. } => {}
            TaskEvent::Committed { task, epoch, .. } => {
                let acks = self.commit_acks.entry(epoch).or_default();
                acks.insert(task);
                if acks.len() == self.sinks.len() && healthy {
                    self.queue
                        .extend(self.coord.handle(Event::SinksCommitted { epoch }));
                }
            }
            TaskEvent::Finished { report, .. } => {
                self.ended += 1;
                self.reports.push(report);
            }
            TaskEvent::Failed { .. } if self.stopped => {
                // The stop cancelled it.
                self.ended += 1;
            }
            TaskEvent::Failed { task, error, .. } => {
                self.ended += 1;
                tracing::debug!(%task, "task failed: {error}");
                self.fail(error, live);
            }
        }
    }

    fn log(
        &self,
        epoch: EpochId,
        state: EpochState,
        detail: Option<String>,
    ) -> Result<(), CoordinatorError> {
        self.storage
            .append_log(&EpochLogRecord {
                epoch,
                state,
                attempt: self.attempt,
                at_ms: now_ms(),
                detail,
            })
            .map_err(storage_err("epoch log"))
    }

    /// Carries out the queued commands of the epoch state machine, in order.
    fn carry_out<W: Workers<Error = E>>(
        &mut self,
        live: &mut Attempt<'_, W>,
        tally: &mut RunTally,
    ) -> Result<(), E>
    where
        E: From<CoordinatorError>,
    {
        while self.failure.is_none() {
            let Some(cmd) = self.queue.pop_front() else {
                break;
            };
            if let Some(l) = &self.opts.leadership
                && !l.is_valid()
            {
                tracing::error!(
                    term = l.term,
                    "leadership lost: this coordinator triggers, publishes and commits nothing more"
                );
                return Err(CoordinatorError::LeadershipLost { term: l.term }.into());
            }
            match cmd {
                Command::InjectBarrier { epoch, final_epoch } => {
                    self.log(
                        epoch,
                        EpochState::Created,
                        final_epoch.then(|| "final".to_owned()),
                    )?;
                    self.created_ms.insert(epoch, now_ms());
                    for t in &self.sources {
                        live.workers.send(t, TaskCommand::InjectBarrier(epoch));
                    }
                }
                Command::PublishManifest {
                    epoch,
                    final_epoch,
                    snapshots,
                    ..
                } => {
                    self.publish(epoch, final_epoch, snapshots, tally)?;
                    self.queue
                        .extend(self.coord.handle(Event::ManifestDurable { epoch }));
                }
                Command::Commit { epoch } => {
                    if self.sinks.is_empty() {
                        self.queue
                            .extend(self.coord.handle(Event::SinksCommitted { epoch }));
                    } else {
                        for t in &self.sinks {
                            live.workers.send(t, TaskCommand::Commit(epoch));
                        }
                    }
                }
                Command::Abort { epoch, reason } => {
                    tracing::warn!("epoch {epoch} aborted: {reason}");
                    // Its record fences it: no late write makes it durable (design §6).
                    self.storage
                        .abort_epoch(epoch, self.attempt, &reason)
                        .map_err(storage_err("epoch records"))?;
                    self.log(epoch, EpochState::Aborted, Some(reason))?;
                }
                Command::Finish => {
                    for t in &self.tasks {
                        live.workers.send(t, TaskCommand::Finish);
                    }
                }
            }
            self.record_committed(tally)?;
        }
        // A commit that arrived as an event queues no command: record it now, not with the
        // next command (the next epoch's start, up to an interval later).
        self.record_committed(tally)?;
        Ok(())
    }

    /// Records COMMITTED for the coordinator's latest committed epoch once, as soon as the
    /// coordinator accepted it, and moves its transactions into the tally.
    fn record_committed(&mut self, tally: &mut RunTally) -> Result<(), CoordinatorError> {
        if let Some(c) = self.coord.latest_committed()
            && let Some(txns) = self.pending_txns.remove(&c)
        {
            self.log(c, EpochState::Committed, None)?;
            tally.committed_total += txns.len() as u64;
            tally.committed.extend(txns);
            // An unbounded job reports its latest commits only.
            let over = tally
                .committed
                .len()
                .saturating_sub(crate::report::MAX_REPORTED_COMMITS);
            if over > 0 {
                tally.committed.drain(..over);
            }
        }
        if let Some(c) = self.coord.latest_committed() {
            // Bookkeeping of epochs up to the latest committed one is done with; an
            // unbounded job would otherwise keep an entry per epoch for ever.
            self.created_ms.retain(|e, _| *e > c);
            self.commit_acks.retain(|e, _| *e > c);
        }
        Ok(())
    }

    /// Assembles the manifest of `epoch`, publishes it atomically, records DURABLE and
    /// applies retention (design §5.6: the manifest is published before any commit).
    fn publish(
        &mut self,
        epoch: EpochId,
        final_epoch: bool,
        snapshots: Vec<TaskSnapshot>,
        tally: &mut RunTally,
    ) -> Result<(), CoordinatorError> {
        let job = &self.plan.job;
        // Finished splits by (source operator, split id): a source heads its vertex, so
        // its tasks' vertex id is its operator id.
        let finished: BTreeSet<(&str, &str)> = snapshots
            .iter()
            .flat_map(|s| {
                s.splits
                    .iter()
                    .filter(|sp| sp.finished)
                    .map(|sp| (s.task.vertex.as_str(), sp.split_id.as_str()))
            })
            .collect();
        let enumerators = self
            .enumerators
            .iter()
            .map(|e| EnumeratorState {
                operator_id: e.operator_id.clone(),
                splits: e.splits.clone(),
                finished: e
                    .splits
                    .iter()
                    .filter(|(id, _)| finished.contains(&(e.operator_id.as_str(), id.as_str())))
                    .map(|(id, _)| id.clone())
                    .collect(),
            })
            .collect();
        let mut manifest = EpochManifest {
            epoch,
            job_id: job.job_id.to_string(),
            pipeline_id: job.pipeline_id.to_string(),
            namespace: self.namespace.clone(),
            plan_fingerprint: self.plan.fingerprint.clone(),
            state_shard_count: job.state_shard_count,
            attempt: self.attempt,
            fencing_token: self.token,
            final_epoch,
            enumerators,
            tasks: snapshots,
            state_format_version: STATE_FORMAT_VERSION,
            created_ms: self.created_ms.get(&epoch).copied().unwrap_or(0),
            durable_ms: now_ms(),
            meta: Some(self.meta.clone()),
            checksum: String::new(),
        };
        let what = format!("manifest of epoch {epoch}");
        self.storage
            .seal_and_publish(&mut manifest, &mut self.manifest_buf)
            .map_err(storage_err(&what))?;
        self.log(epoch, EpochState::Durable, None)?;
        failpoint::hit("after-manifest-publish");
        // Savepoints requested before this epoch became durable, exported before
        // retention can touch it.
        for r in self.savepoints.drain(..) {
            let made = export_savepoint(
                self.storage,
                &self.namespace,
                epoch,
                &self.opts.savepoint_root,
                r.out.as_deref(),
            );
            match &made {
                Ok(i) => tracing::info!(epoch = %epoch, dir = %i.dir, "savepoint taken"),
                Err(e) => tracing::warn!(epoch = %epoch, "savepoint failed: {e}"),
            }
            match made {
                Ok(info) if r.stop && !final_epoch => {
                    // Answered once the job has stopped.
                    self.stop_at
                        .get_or_insert_with(|| (epoch, Vec::new()))
                        .1
                        .push((r.reply, info));
                }
                made => {
                    let _ = r.reply.send(made);
                }
            }
        }
        tally.durable_epochs += 1;
        tally.durable_records = durable_records(self.plan, &manifest.tasks);
        self.pending_txns.insert(
            epoch,
            manifest
                .tasks
                .iter()
                .flat_map(|t| t.pending_transactions.iter().filter(|p| p.epoch == epoch))
                .map(|p| CommittedTransaction {
                    epoch: p.epoch.0,
                    txn: p.txn.clone(),
                })
                .collect(),
        );
        // Retention deletes: a leadership lost while this epoch was published (its writes
        // to storage take time) leaves the old epochs to the new leader, whose resume may
        // be reading them.
        if let Some(l) = self.opts.leadership.as_ref().filter(|l| !l.is_valid()) {
            tracing::warn!(
                term = l.term,
                "leadership lost: checkpoint retention left to the new leader"
            );
        } else if let Err(e) = self.storage.retain(self.opts.retain_epochs) {
            tracing::warn!("checkpoint retention failed: {e}");
        }
        if final_epoch {
            self.final_epoch = Some(epoch);
        }
        Ok(())
    }
}

/// Records read by the sources and written by the sinks of `plan` up to the epoch of
/// `tasks` (their snapshots' totals, which survive recoveries).
fn durable_records(plan: &PartitionedPlan, tasks: &[TaskSnapshot]) -> (u64, u64) {
    let kind = |t: &TaskSnapshot, last: bool| {
        plan.vertices
            .iter()
            .find(|v| v.id == t.task.vertex)
            .and_then(|v| {
                if last {
                    v.operators.last()
                } else {
                    v.operators.first()
                }
            })
            .map(|o| o.kind)
    };
    let read = tasks
        .iter()
        .filter(|t| kind(t, false) == Some(PluginKind::Source))
        .map(|t| t.records_in_total)
        .sum();
    let written = tasks
        .iter()
        .filter(|t| kind(t, true) == Some(PluginKind::Sink))
        .map(|t| t.records_out_total)
        .sum();
    (read, written)
}

/// Exports durable `epoch` of `storage` (namespace `namespace`) as a savepoint at `out`
/// (a location, or a name in `root`), or at `epoch-N` in `root`.
fn export_savepoint(
    storage: &Namespace,
    namespace: &str,
    epoch: EpochId,
    root: &Location,
    out: Option<&str>,
) -> Result<SavepointInfo, String> {
    let at = match out {
        Some(o) => nop_stream_checkpoint::savepoint::resolve(root, o).map_err(|e| e.to_string())?,
        None => {
            let root_store = root.open().map_err(|e| e.to_string())?;
            let name = nop_stream_checkpoint::savepoint::default_name(&root_store, epoch.0)
                .map_err(|e| e.to_string())?;
            root.join(&name)
        }
    };
    let store = at.open().map_err(|e| e.to_string())?;
    nop_stream_checkpoint::savepoint::export(storage, namespace, epoch, &store)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{RestartBudget, restart_backoff};
    use std::time::{Duration, Instant};

    #[test]
    fn the_restart_budget_counts_recoveries_within_a_sliding_window() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = RestartBudget::new(3, Duration::from_secs(60));
        // Three quick failures recover, with growing backoff; the fourth in the window ends.
        assert_eq!(b.admit(at(0)), Some(1));
        assert_eq!(b.admit(at(100)), Some(2));
        assert_eq!(b.admit(at(300)), Some(3));
        assert_eq!(b.admit(at(700)), None);
        // Once the first left the window, one more fits, and the count is of the window.
        assert_eq!(b.admit(at(60_000)), Some(3));
        assert_eq!(b.admit(at(60_050)), None);
        // After a quiet window the budget, and the backoff, start over.
        assert_eq!(b.admit(at(200_000)), Some(1));
        // No budget: the first failure ends the run.
        assert_eq!(
            RestartBudget::new(0, Duration::from_secs(60)).admit(at(0)),
            None
        );
        // A zero window holds nothing: every failure recovers.
        let mut z = RestartBudget::new(1, Duration::ZERO);
        assert!((0..20).all(|i| z.admit(at(i)) == Some(1)));
    }

    #[test]
    fn restart_backoff_doubles_from_the_first_delay_up_to_the_cap() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let delays: Vec<u128> = (0..8)
            .map(|n| restart_backoff(first, max, n).as_millis())
            .collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // Far past the cap, and past any shift or multiplication overflow.
        assert_eq!(restart_backoff(first, max, 31), max);
        assert_eq!(restart_backoff(first, max, u32::MAX), max);
        assert_eq!(restart_backoff(Duration::ZERO, max, 40), Duration::ZERO);
    }
}
