//! The job manager (design §2, §8): a job's whole life, written once for the embedded
//! runner and the coordinator process — submit, resume after a restart, restore from a
//! savepoint (fresh, fork, Delta, actions), take a savepoint, stop with one, cancel,
//! status — over three seams:
//! - a [`Platform`] (where jobs run: it compiles against its plugins and runs the
//!   coordinator role over its [`crate::Workers`]);
//! - checkpoint storage opened by location ([`nop_stream_checkpoint::Location`]);
//! - a [`JobStore`] of records with revisions.
//!
//! The two shells only translate: `nopstream run` is this manager with a local store, a
//! job store in its work directory and in-process workers; the coordinator process is
//! this manager with cluster workers and every store at its storage location. Control
//! requests ([`nop_stream_proto::cli::JobControl`]) reach [`JobManager::control`] the same
//! way in both, over a Unix socket or over QUIC.
//!
//! A submission is a short sequence of named steps ([`JobManager::submit`]): read the
//! model, compile it, claim the job, open its namespace, restore a savepoint or a Delta,
//! decide how it starts, write its record, run it.

mod control;
mod error;
mod observe;
mod platform;
mod restore;

pub use error::ManagerError;
pub use observe::{
    API_VERSION, CheckpointsView, EdgeView, EpochDetail, EpochView, ExceptionView, JobView,
    METRICS_CONTENT_TYPE, MinAvgMax, RatePoint, StatusView, THROUGHPUT_POINTS, VertexView,
    WatermarkView,
};
pub use platform::{
    Compiled, Component, DeployHook, JobRun, LiveCounts, LiveJob, Platform, compile_error,
};

use crate::jobs::{HISTORY_RUNS, JobRecord, JobStore, JobStoreError, PastRun, Versioned};
use crate::{CoordinatorOptions, JobReport, SavepointRequest};
use nop_stream_checkpoint::{Location, Namespace};
use nop_stream_core::{StreamModel, parse_job_file};
use nop_stream_proto::cli::{JobState, JobSubmission, RefusedCounts};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Something a submission did that its submitter may want to see (the embedded shell
/// prints these, the coordinator process logs them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A field a Delta overlay changes, with its class (`delta D: field (class): a -> b`).
    DeltaChange {
        /// The Delta file.
        file: String,
        /// The change, as `Change` displays it.
        change: String,
    },
    /// A Delta that changes nothing.
    DeltaUnchanged {
        /// The Delta file.
        file: String,
    },
    /// A Delta over a job with checkpoints: its latest epoch became a savepoint.
    DeltaSavepoint {
        /// The epoch.
        epoch: u64,
        /// The savepoint's location.
        savepoint: String,
    },
    /// A restore runs as another pipeline lineage (`fork`).
    Forking {
        /// The lineage.
        lineage: String,
    },
    /// A savepoint's epoch was published into the job's namespace.
    RestoringSavepoint {
        /// The savepoint as given.
        savepoint: String,
        /// Its epoch.
        epoch: u64,
        /// The namespace's location.
        into: String,
    },
    /// A rescale restores an epoch into new parallelisms.
    Rescaling {
        /// The epoch.
        epoch: u64,
        /// `vertex=parallelism, ...`.
        parallelism: String,
    },
    /// A `finalize-sink` action was carried out (what it committed, in words).
    Finalized(String),
    /// The run starts: its checkpoint namespace.
    Starting {
        /// The job id.
        job: String,
        /// The namespace's name.
        namespace: String,
        /// Its location.
        checkpoints: Location,
    },
    /// The job resumes from its checkpoints.
    Resuming {
        /// The namespace's location.
        checkpoints: String,
    },
}

/// Default of [`ManagerOptions::resume_attempts`]: with the default restart delay of
/// 100 ms, ten attempts span about 35 s.
pub const DEFAULT_RESUME_ATTEMPTS: u32 = 10;

/// The longest pause between two attempts to resume a job ([`ManagerOptions::resume_attempts`]).
pub const RESUME_DELAY_MAX: Duration = Duration::from_secs(10);

/// How the manager is set up.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// The checkpoint root: each job's namespace is in it.
    pub checkpoints: Location,
    /// The savepoint root: a savepoint named relatively is in it (under the job's id with
    /// [`Self::savepoints_per_job`]).
    pub savepoints: Location,
    /// Whether savepoints go under `<savepoints>/<job>/` (a coordinator holding many jobs)
    /// or straight into the root (an embedded run's work directory).
    pub savepoints_per_job: bool,
    /// Global recoveries a job gets within any 60 s unless its submission says otherwise
    /// (a failure-rate budget, `CoordinatorOptions::max_restarts`); `None`: the
    /// coordinator role's default ([`crate::DEFAULT_MAX_RESTARTS`] with periodic
    /// checkpoints, else 0).
    pub max_restarts: Option<u32>,
    /// Pause before the first recovery attempt (it doubles per recovery).
    pub restart_delay: Duration,
    /// Durable epochs kept per namespace. Default 3.
    pub retain_epochs: usize,
    /// Epochs older than this are aborted, in ms. Default 60,000.
    pub checkpoint_timeout_ms: u64,
    /// Attempts a job gets to resume after the manager's process restarted (or won
    /// leadership) when an attempt fails for a reason a retry may cure
    /// ([`ManagerError::is_transient`]: storage or the job store unavailable, say). The
    /// first is made in [`JobManager::resume_all`], the others on a thread of their own,
    /// the first of them after [`Self::restart_delay`], doubling up to
    /// [`RESUME_DELAY_MAX`]. Default [`DEFAULT_RESUME_ATTEMPTS`]; 1 fails the job at the
    /// first failure.
    pub resume_attempts: u32,
    /// Where an unknown job is reported missing, for messages.
    pub where_: String,
    /// The leadership the manager acts under (design §14.5, "Coordinator HA"); `None`: the
    /// only coordinator. A run that ends because it was lost records nothing: the new
    /// leader owns the job.
    pub leadership: Option<Arc<crate::election::Leadership>>,
}

impl ManagerOptions {
    /// Defaults around a checkpoint and a savepoint root.
    pub fn new(checkpoints: Location, savepoints: Location) -> Self {
        let d = CoordinatorOptions::default();
        ManagerOptions {
            checkpoints,
            savepoints,
            savepoints_per_job: false,
            max_restarts: None,
            restart_delay: d.restart_delay,
            retain_epochs: d.retain_epochs,
            checkpoint_timeout_ms: d.checkpoint_timeout_ms,
            resume_attempts: DEFAULT_RESUME_ATTEMPTS,
            where_: "here".into(),
            leadership: None,
        }
    }
}

/// A job the manager runs now.
struct Running {
    live: Arc<LiveJob>,
    cancel: Arc<AtomicBool>,
    savepoints: std::sync::mpsc::Sender<SavepointRequest>,
}

/// What a submission came to.
#[derive(Debug)]
pub enum Submitted {
    /// The job runs (in the background), or ran (in the foreground, with its report).
    Started {
        /// Its record as written at the start.
        record: Box<JobRecord>,
        /// The run's report, when it ran in the foreground.
        report: Option<Box<Result<JobReport, ManagerError>>>,
    },
    /// A restore's compatibility check refused the savepoint: nothing was touched.
    Refused {
        /// The savepoint, as resolved.
        savepoint: String,
        /// The report.
        report: Box<crate::compat::Report>,
    },
    /// A check-only restore's check is compatible: nothing was touched.
    Checked {
        /// The report.
        report: Box<crate::compat::Report>,
    },
}

/// Whether a run goes on in the background (the coordinator process) or in the caller's
/// thread (an embedded run, which ends with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunIn {
    /// A thread of its own.
    Background,
    /// The calling thread.
    Foreground,
}

/// The job manager.
pub struct JobManager<P: Platform> {
    platform: Arc<P>,
    opts: ManagerOptions,
    jobs: Arc<dyn JobStore>,
    /// Records as last read or written, with their revisions.
    records: Mutex<HashMap<String, Versioned<JobRecord>>>,
    running: Mutex<HashMap<String, Running>>,
    /// Jobs a submission is preparing (from its check until its run is in `running`):
    /// any other submission of them is refused meanwhile.
    busy: Mutex<BTreeSet<String>>,
    notes: Box<dyn Fn(&Note) + Send + Sync>,
    observed: observe::Observed,
    started: Instant,
    me: std::sync::Weak<JobManager<P>>,
}

impl<P: Platform> std::fmt::Debug for JobManager<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobManager")
            .field("checkpoints", &self.opts.checkpoints)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Releases a job claimed by a submission however the submission ends.
struct Claim<'a>(&'a Mutex<BTreeSet<String>>, String);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

/// A submission on its way: the model, the compiled job, its namespace.
struct Prepared {
    sub: JobSubmission,
    model: StreamModel,
    compiled: Compiled,
    location: Location,
    ns: Namespace,
    /// The namespace was just seeded from a savepoint.
    seeded: bool,
    /// The plan fingerprint the restore accepts as an explicit action.
    rescale_from: Option<String>,
}

impl<P: Platform> JobManager<P> {
    /// A manager over `platform`, `jobs` and the stores of `opts`; `notes` receives what
    /// submissions do.
    pub fn new(
        platform: Arc<P>,
        jobs: Arc<dyn JobStore>,
        opts: ManagerOptions,
        notes: impl Fn(&Note) + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| JobManager {
            platform,
            opts,
            jobs,
            records: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            busy: Mutex::new(BTreeSet::new()),
            notes: Box::new(notes),
            observed: observe::Observed::default(),
            started: Instant::now(),
            me: me.clone(),
        })
    }

    /// The platform.
    pub fn platform(&self) -> &Arc<P> {
        &self.platform
    }

    /// Resumes every job whose record says it was submitted or running (the manager's
    /// process restarted): each waits up to `wait_for_nodes` for the nodes of its last
    /// placement, then resumes from its latest durable epoch. Returns the jobs resumed at
    /// once.
    ///
    /// A job whose resume fails for a reason a retry may cure
    /// ([`ManagerError::is_transient`]) is tried again in the background, up to
    /// [`ManagerOptions::resume_attempts`] attempts in all, its record's error saying
    /// which attempt failed and why. A job that cannot resume (a permanent failure, or
    /// the last attempt's) is recorded failed, with why. Retries stop without a word once
    /// the job runs by another request, or the manager's leadership is lost (the new
    /// leader resumes it).
    ///
    /// # Errors
    /// The job store cannot be read, or a failure cannot be recorded.
    pub fn resume_all(&self, wait_for_nodes: Duration) -> Result<Vec<String>, ManagerError> {
        let mut resumed = Vec::new();
        for r in self.jobs.load_all()? {
            let job = r.value.job.clone();
            let state = r.value.state;
            lock(&self.records).insert(job.clone(), r);
            if !matches!(state, JobState::Submitted | JobState::Running) {
                continue;
            }
            tracing::info!(%job, "resuming a job after a restart");
            match self.resume(&job, wait_for_nodes) {
                Ok(()) => resumed.push(job),
                Err(e) if e.is_transient() && self.opts.resume_attempts > 1 => {
                    self.retry_resume(job, e, wait_for_nodes)?;
                }
                Err(e) => self.resume_failed(&job, 1, &e)?,
            }
        }
        Ok(resumed)
    }

    /// Records that `job` could not resume after `attempts` attempts, the last failing
    /// with `e`.
    fn resume_failed(
        &self,
        job: &str,
        attempts: u32,
        e: &ManagerError,
    ) -> Result<(), ManagerError> {
        tracing::warn!(%job, attempts, "cannot resume: {e}");
        let tries = if attempts > 1 {
            format!(" ({attempts} attempts)")
        } else {
            String::new()
        };
        self.update(job, |rec| {
            rec.state = JobState::Failed;
            rec.error = Some(format!("cannot resume after a restart{tries}: {e}"));
        })
    }

    /// Tries to resume `job` again on a thread of its own, after its first attempt failed
    /// with the transient `first` (see [`Self::resume_all`]).
    fn retry_resume(
        &self,
        job: String,
        first: ManagerError,
        wait_for_nodes: Duration,
    ) -> Result<(), ManagerError> {
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| ManagerError::Ending { job: job.clone() })?;
        let mut delay = self.opts.restart_delay;
        self.resume_retrying(&job, 1, &first, delay);
        let thread = format!("resume-{job}");
        let failed = format!("cannot resume job `{job}`");
        std::thread::Builder::new()
            .name(thread)
            .spawn(move || {
                let attempts = me.opts.resume_attempts;
                for k in 2..=attempts {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(RESUME_DELAY_MAX);
                    if me.opts.leadership.as_ref().is_some_and(|l| !l.is_valid()) {
                        tracing::info!(%job, "leadership lost: the new leader resumes the job");
                        return;
                    }
                    // Submitted again and ended meanwhile, or no longer known.
                    let state = lock(&me.records).get(&job).map(|r| r.value.state);
                    if !matches!(state, Some(JobState::Submitted | JobState::Running)) {
                        return;
                    }
                    match me.resume(&job, wait_for_nodes) {
                        Ok(()) => {
                            tracing::info!(%job, "resumed at attempt {k} of {attempts}");
                            return;
                        }
                        // Submitted again meanwhile: it runs, or is being started; or this
                        // manager's leadership is over.
                        Err(
                            ManagerError::Running { .. }
                            | ManagerError::Busy { .. }
                            | ManagerError::JobStore(JobStoreError::Fenced { .. }),
                        ) => return,
                        Err(e) if e.is_transient() && k < attempts => {
                            me.resume_retrying(&job, k, &e, delay);
                        }
                        Err(e) => {
                            if let Err(e) = me.resume_failed(&job, k, &e) {
                                tracing::error!(%job, "cannot record the failed resume: {e}");
                            }
                            return;
                        }
                    }
                }
            })
            .map_err(|e| ManagerError::Platform(format!("{failed}: {e}")))?;
        Ok(())
    }

    /// Logs, and notes in `job`'s record as far as the job store lets it, that attempt `k`
    /// to resume failed with `e` and the next comes after `delay`.
    fn resume_retrying(&self, job: &str, k: u32, e: &ManagerError, delay: Duration) {
        let attempts = self.opts.resume_attempts;
        tracing::warn!(%job, "cannot resume yet (attempt {k} of {attempts}): {e}; trying again in {delay:?}");
        let error = format!(
            "resuming after a restart: attempt {k} of {attempts} failed, trying again: {e}"
        );
        // Best effort: the job store may be what fails.
        let _ = self.update(job, |rec| rec.error = Some(error.clone()));
    }

    fn resume(&self, job: &str, wait_for_nodes: Duration) -> Result<(), ManagerError> {
        let record = self.record(job)?;
        let model = self.model(&record.submission)?;
        let compiled = self.platform.compile(&model, &record.submission)?;
        let claim = self.claim(job)?;
        let location = crate::checkpoint_location(&self.opts.checkpoints, &compiled.plan);
        let ns = Namespace::open(&location)?;
        let p = Prepared {
            sub: record.submission.clone(),
            model,
            compiled,
            location,
            ns,
            seeded: false,
            rescale_from: record.rescale_from.clone(),
        };
        let expect = (record.last_nodes.clone(), self.started + wait_for_nodes);
        self.start(p, claim, RunIn::Background, Some(expect))
            .map(|_| ())
    }

    /// Submits a job (design §10): a plain run (resuming its checkpoints, or fresh), a
    /// rescale, a Delta overlay, or a restore from a savepoint with its actions. Runs it in
    /// the background or in this thread.
    ///
    /// # Errors
    /// A job file, Delta or actions that are wrong; plugins that do not compile; the job
    /// running or being submitted; a savepoint that cannot be opened or restored; storage
    /// failures. In the foreground, the run's own failure is in the report.
    pub fn submit(&self, sub: JobSubmission, run_in: RunIn) -> Result<Submitted, ManagerError> {
        let (model, changes) = self.model_with_changes(&sub)?;
        let compiled = self.platform.compile(&model, &sub)?;
        let job = compiled.plan.job.job_id.to_string();
        let claim = self.claim(&job)?;
        let location = crate::checkpoint_location(&self.opts.checkpoints, &compiled.plan);
        let ns = Namespace::open(&location)?;
        let mut p = Prepared {
            sub,
            model,
            compiled,
            location,
            ns,
            seeded: false,
            rescale_from: None,
        };
        if !changes.is_empty() && !p.sub.fresh {
            self.delta_savepoint(&mut p)?;
        }
        if p.sub.rescale {
            // Refused before anything is touched when it cannot be done.
            if p.sub.fresh {
                return Err(ManagerError::Rescale(format!(
                    "--rescale needs a checkpoint to restore, and {} has none (--fresh \
                     discards it)",
                    p.location
                )));
            }
            self.rescale(&mut p)?;
        }
        if p.sub.from_savepoint.is_some() {
            if let Some(answer) = self.restore_savepoint(&mut p)? {
                return Ok(answer);
            }
        } else if p.sub.fresh {
            p.ns.delete_all()?;
        }
        self.start(p, claim, run_in, None)
    }

    /// The job file's model, with the submission's Delta, lineage, parallelism and
    /// checkpoint interval applied.
    fn model(&self, sub: &JobSubmission) -> Result<StreamModel, ManagerError> {
        Ok(self.model_with_changes(sub)?.0)
    }

    fn model_with_changes(
        &self,
        sub: &JobSubmission,
    ) -> Result<(StreamModel, Vec<nop_stream_core::delta::Change>), ManagerError> {
        let (mut model, changes) = match &sub.delta {
            Some((file, text)) => {
                let (model, changes) =
                    nop_stream_core::delta::apply_delta(&sub.file, &sub.text, file, text)
                        .map_err(|d| ManagerError::JobFile(d.to_string()))?;
                if changes.is_empty() {
                    (self.notes)(&Note::DeltaUnchanged { file: file.clone() });
                }
                for c in &changes {
                    (self.notes)(&Note::DeltaChange {
                        file: file.clone(),
                        change: c.to_string(),
                    });
                }
                (model, changes)
            }
            None => (
                parse_job_file(&sub.file, &sub.text)
                    .map_err(|d| ManagerError::JobFile(d.to_string()))?,
                Vec::new(),
            ),
        };
        if let Some(p) = sub.parallelism {
            model = model.with_parallelism(p);
        }
        if let Some(ms) = sub.checkpoint_interval_ms {
            model.job.checkpoint_interval_ms = Some(ms);
        }
        if let Some(lineage) = &sub.pipeline {
            // A fork (design §3.1): another lineage, namespace and transaction ids.
            model.job.pipeline = lineage.clone();
            nop_stream_core::validate_model(&model).map_err(|d| {
                ManagerError::JobFile(format!("fork {lineage}: not a valid pipeline id: {d}"))
            })?;
        }
        Ok((model, changes))
    }

    /// Claims `job` for a submission: refused while another one prepares it or it runs.
    fn claim(&self, job: &str) -> Result<Claim<'_>, ManagerError> {
        if !lock(&self.busy).insert(job.to_owned()) {
            return Err(ManagerError::Busy { job: job.into() });
        }
        let claim = Claim(&self.busy, job.to_owned());
        if lock(&self.running).contains_key(job) {
            return Err(ManagerError::Running {
                job: job.into(),
                hint: "stop it first (`nopstream stop JOB --savepoint`) or cancel it \
                       (`nopstream job cancel JOB`)",
            });
        }
        Ok(claim)
    }

    /// Decides how a prepared submission starts, writes its record, and runs it.
    fn start(
        &self,
        p: Prepared,
        claim: Claim<'_>,
        run_in: RunIn,
        expect: Option<(Vec<String>, Instant)>,
    ) -> Result<Submitted, ManagerError> {
        let resume = p.ns.has_durable()?;
        (self.notes)(&Note::Starting {
            job: p.compiled.plan.job.job_id.to_string(),
            namespace: crate::checkpoint_namespace(&p.compiled.plan),
            checkpoints: p.location.clone(),
        });
        if resume && !p.seeded && expect.is_none() {
            (self.notes)(&Note::Resuming {
                checkpoints: p.location.to_string(),
            });
        }
        if !resume {
            self.platform.claim_output(&p.sub)?;
        }
        let job = p.compiled.plan.job.job_id.to_string();
        let previous = lock(&self.records).get(&job).cloned();
        let previous = match previous {
            Some(r) => Some(r),
            None => self.jobs.load(&job)?,
        };
        // A job's generations never repeat: nodes keep the fence of its last run, so a run
        // in a new namespace (fresh, or its checkpoints gone) or one just seeded from a
        // savepoint goes on above the last generation deployed.
        if (!resume || p.seeded)
            && let Some(last) = previous
                .as_ref()
                .map(|r| r.value.generation)
                .filter(|g| *g > 0)
        {
            p.ns.next_attempt(u32::try_from(last).unwrap_or(u32::MAX) - 1)?;
        }
        let record = self.new_record(&p, previous.as_ref(), expect.is_some());
        let expected = previous.as_ref().map_or(0, |r| r.revision);
        let revision = self.jobs.save(&record, expected)?;
        lock(&self.records).insert(
            job.clone(),
            Versioned {
                revision,
                value: record.clone(),
            },
        );
        self.observed.started(&job, &p.compiled.plan);
        let live = Arc::new(LiveJob::default());
        *lock(&live.expect) = expect;
        let weak = self.me.clone();
        let hook_job = job.clone();
        *lock(&live.on_deploy) = Some(Box::new(move |generation, placement| {
            if let Some(me) = weak.upgrade() {
                let nodes: Vec<String> = placement.nodes().into_iter().map(str::to_owned).collect();
                let json = serde_json::to_string(placement).ok();
                if let Err(e) = me.update(&hook_job, |r| {
                    r.generation = generation;
                    r.deployments += 1;
                    r.recoveries = r.recoveries.max(r.deployments.saturating_sub(1));
                    r.deployment_json.clone_from(&json);
                    r.last_nodes.clone_from(&nodes);
                }) {
                    tracing::error!(job = %hook_job, "cannot record the deployment: {e}");
                }
            }
        }));
        let cancel = Arc::new(AtomicBool::new(false));
        let (sp_tx, sp_rx) = std::sync::mpsc::channel();
        lock(&self.running).insert(
            job.clone(),
            Running {
                live: Arc::clone(&live),
                cancel: Arc::clone(&cancel),
                savepoints: sp_tx,
            },
        );
        drop(claim);
        let run = JobRun {
            options: self.coordinator_options(&p, &job, sp_rx),
            submission: p.sub,
            compiled: p.compiled,
            namespace: Arc::new(p.ns),
            live,
            cancel,
        };
        match run_in {
            RunIn::Foreground => {
                let report = self.run(run, run_in);
                Ok(Submitted::Started {
                    record: Box::new(record),
                    report: Some(Box::new(report)),
                })
            }
            RunIn::Background => {
                let me = self
                    .me
                    .upgrade()
                    .ok_or_else(|| ManagerError::Ending { job: job.clone() })?;
                std::thread::Builder::new()
                    .name(format!("job-{job}"))
                    .spawn(move || {
                        let _ = me.run(run, run_in);
                    })
                    .map_err(|e| {
                        ManagerError::Platform(format!("cannot start job `{job}`: {e}"))
                    })?;
                Ok(Submitted::Started {
                    record: Box::new(record),
                    report: None,
                })
            }
        }
    }

    /// The record of a run starting now: a new run of the job id (its counts afresh, the
    /// previous run kept in the history), or the same run resumed after a restart.
    fn new_record(
        &self,
        p: &Prepared,
        previous: Option<&Versioned<JobRecord>>,
        restarted: bool,
    ) -> JobRecord {
        let plan = &p.compiled.plan;
        let prev = previous.map(|v| &v.value);
        let same_run = restarted && prev.is_some();
        let mut history = prev.map(|r| r.history.clone()).unwrap_or_default();
        if let Some(r) = prev.filter(|r| !same_run && r.run > 0) {
            history.push(past_run(r));
            let over = history.len().saturating_sub(HISTORY_RUNS);
            history.drain(..over);
        }
        JobRecord {
            job: plan.job.job_id.to_string(),
            name: plan.job.name.clone(),
            submission: p.sub.clone(),
            state: JobState::Running,
            semantic: plan.job.semantic.to_string(),
            submitted_ms: prev
                .filter(|_| same_run)
                .map_or_else(now_ms, |r| r.submitted_ms),
            generation: prev.map_or(0, |r| r.generation),
            recoveries: prev.filter(|_| same_run).map_or(0, |r| r.recoveries),
            deployments: prev.filter(|_| same_run).map_or(0, |r| r.deployments),
            error: None,
            deployment_json: prev.and_then(|r| r.deployment_json.clone()),
            report_json: None,
            refused: prev
                .filter(|_| same_run)
                .map_or_else(RefusedCounts::default, |r| r.refused),
            last_nodes: prev.map(|r| r.last_nodes.clone()).unwrap_or_default(),
            rescale_from: p.rescale_from.clone(),
            run: match prev {
                Some(r) if same_run => r.run.max(1),
                Some(r) => r.run + 1,
                None => 1,
            },
            history,
        }
    }

    fn coordinator_options(
        &self,
        p: &Prepared,
        job: &str,
        savepoints: std::sync::mpsc::Receiver<SavepointRequest>,
    ) -> CoordinatorOptions {
        CoordinatorOptions {
            max_restarts: p.sub.max_restarts.or(self.opts.max_restarts),
            checkpoint_timeout_ms: self.opts.checkpoint_timeout_ms,
            retain_epochs: self.opts.retain_epochs,
            rescale_from: p.rescale_from.clone(),
            restart_delay: self.opts.restart_delay,
            components: p.compiled.component_hashes(),
            savepoints: Some(Arc::new(Mutex::new(savepoints))),
            savepoint_root: self.savepoint_root(job),
            leadership: self.opts.leadership.clone(),
            ..CoordinatorOptions::default()
        }
    }

    /// Where `job`'s savepoints go unless a location is named.
    pub fn savepoint_root(&self, job: &str) -> Location {
        if self.opts.savepoints_per_job {
            self.opts
                .savepoints
                .join(&nop_stream_checkpoint::names::component(job))
        } else {
            self.opts.savepoints.clone()
        }
    }

    /// Runs a job to its end and records how it ended.
    fn run(&self, run: JobRun, run_in: RunIn) -> Result<JobReport, ManagerError> {
        let job = run.compiled.plan.job.job_id.to_string();
        let live = Arc::clone(&run.live);
        let cancel = Arc::clone(&run.cancel);
        let result = self.platform.run(run);
        if let Some(l) = &self.opts.leadership
            && !l.is_valid()
        {
            tracing::warn!(%job, term = l.term, "leadership lost: the job's end is left unrecorded for the new leader");
            lock(&self.running).remove(&job);
            return result;
        }
        let counts = self.platform.live_counts(&job);
        let placement = lock(&live.placement).clone();
        let recorded = self.update(&job, |r| {
            r.generation = live.generation.load(Ordering::SeqCst).max(r.generation);
            r.refused = RefusedCounts {
                events: r.refused.events + live.refused_events.load(Ordering::Relaxed),
                streams: counts.refused_streams,
                commands: counts.refused_commands,
            };
            if let Some(p) = &placement {
                r.deployment_json = serde_json::to_string(p).ok();
                r.last_nodes = p.nodes().into_iter().map(str::to_owned).collect();
            }
            match &result {
                Ok(report) => {
                    r.recoveries = r.recoveries.max(report.recoveries);
                    r.state = if report.stopped {
                        JobState::Stopped
                    } else {
                        JobState::Finished
                    };
                    r.report_json = serde_json::to_string(report).ok();
                    r.error = None;
                }
                Err(_) if cancel.load(Ordering::SeqCst) => {
                    r.state = JobState::Cancelled;
                    r.error = Some("cancelled by a user".into());
                }
                Err(e) => {
                    r.state = JobState::Failed;
                    r.error = Some(e.to_string());
                }
            }
        });
        match &result {
            Ok(_) => tracing::info!(%job, "job finished"),
            // A foreground run's caller reports the error itself: logging it too would
            // print every failure twice.
            Err(e) if run_in == RunIn::Foreground => tracing::debug!(%job, "job ended: {e}"),
            Err(e) => tracing::warn!(%job, "job ended: {e}"),
        }
        lock(&self.running).remove(&job);
        if let Err(e) = recorded {
            tracing::error!(%job, "cannot record how the job ended: {e}");
            return Err(e);
        }
        result
    }

    /// Applies `f` to `job`'s record and saves it (compare-and-set on its revision, read
    /// again and retried once on a conflict).
    ///
    /// # Errors
    /// The write failed: the job store's error, never swallowed.
    fn update(&self, job: &str, f: impl Fn(&mut JobRecord)) -> Result<(), ManagerError> {
        let mut records = lock(&self.records);
        for _ in 0..3 {
            let Some(current) = records.get(job).cloned() else {
                return Err(self.no_job(job));
            };
            let mut value = current.value;
            f(&mut value);
            match self.jobs.save(&value, current.revision) {
                Ok(revision) => {
                    records.insert(job.to_owned(), Versioned { revision, value });
                    return Ok(());
                }
                Err(crate::jobs::JobStoreError::Conflict { .. }) => {
                    match self.jobs.load(job)? {
                        Some(fresh) => records.insert(job.to_owned(), fresh),
                        None => return Err(self.no_job(job)),
                    };
                }
                Err(e) => return Err(e.into()),
            }
        }
        let current = records.get(job).map_or(0, |r| r.revision);
        Err(crate::jobs::JobStoreError::Conflict {
            location: String::new(),
            job: job.to_owned(),
            expected: current,
        }
        .into())
    }

    fn no_job(&self, job: &str) -> ManagerError {
        ManagerError::NoJob {
            job: job.to_owned(),
            where_: self.opts.where_.clone(),
        }
    }

    /// The record of `job`.
    ///
    /// # Errors
    /// [`ManagerError::NoJob`].
    pub fn record(&self, job: &str) -> Result<JobRecord, ManagerError> {
        if let Some(r) = lock(&self.records).get(job) {
            return Ok(r.value.clone());
        }
        match self.jobs.load(job)? {
            Some(r) => {
                let v = r.value.clone();
                lock(&self.records).insert(job.to_owned(), r);
                Ok(v)
            }
            None => Err(self.no_job(job)),
        }
    }
}

/// What the record of an ended run keeps of it in the history.
fn past_run(r: &JobRecord) -> PastRun {
    let report: Option<JobReport> = r
        .report_json
        .as_deref()
        .and_then(|j| serde_json::from_str(j).ok());
    PastRun {
        run: r.run,
        state: r.state,
        submitted_ms: r.submitted_ms,
        ended_ms: now_ms(),
        records_read: report.as_ref().map_or(0, |x| x.durable_records_read),
        records_written: report.as_ref().map_or(0, |x| x.durable_records_written),
        recoveries: r.recoveries,
        error: r.error.clone(),
    }
}
