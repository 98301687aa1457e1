//! What the job manager needs of where jobs run (design §2, §8): compiling a job against
//! the plugins it can load, running migrations and `finalize-sink` with those plugins,
//! preparing a fresh run's output, and running the coordinator role over its workers.
//! The embedded runner implements it with in-process workers, the coordinator process with
//! cluster workers; the lifecycle above it ([`super::JobManager`]) exists once.

use super::ManagerError;
use crate::from_savepoint::Savepoint;
use crate::migrate::StateEntry;
use crate::{CoordinatorOptions, JobReport};
use nop_stream_api::PluginKind;
use nop_stream_checkpoint::Namespace;
use nop_stream_core::{DeploymentPlan, PartitionedPlan, StreamModel};
use nop_stream_proto::cli::JobSubmission;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The component running an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// sha256 of its bytes, hex.
    pub sha256: String,
    /// `name@version`.
    pub label: String,
    /// The world it exports.
    pub kind: PluginKind,
    /// Size in bytes.
    pub size: u64,
}

/// A job compiled against a platform's plugins.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The plan.
    pub plan: Arc<PartitionedPlan>,
    /// The component of every operator, by operator id.
    pub components: BTreeMap<String, Component>,
}

impl Compiled {
    /// sha256 of every operator's component, by operator id (what manifests record).
    pub fn component_hashes(&self) -> BTreeMap<String, String> {
        self.components
            .iter()
            .map(|(id, c)| (id.clone(), c.sha256.clone()))
            .collect()
    }
}

/// What a running job shows of its deployments, shared by the manager (status) and the
/// platform's workers (which update it).
#[derive(Default)]
pub struct LiveJob {
    /// The generation deployed last.
    pub generation: AtomicU64,
    /// Deployments made by this manager process.
    pub deployments: AtomicU64,
    /// Task events of another generation refused here.
    pub refused_events: AtomicU64,
    /// The DeploymentPlan of the last generation.
    pub placement: Mutex<Option<DeploymentPlan>>,
    /// Nodes to wait for before the first deployment (a restarted manager waits for the
    /// nodes of the job's last placement), with the deadline of that wait.
    pub expect: Mutex<Option<(Vec<String>, Instant)>>,
    /// Called with each generation and its placement as it is deployed (the manager
    /// records them durably).
    pub on_deploy: Mutex<Option<DeployHook>>,
}

/// See [`LiveJob::on_deploy`].
pub type DeployHook = Box<dyn FnMut(u64, &DeploymentPlan) + Send>;

impl std::fmt::Debug for LiveJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveJob")
            .field("generation", &self.generation)
            .field("deployments", &self.deployments)
            .field("refused_events", &self.refused_events)
            .finish_non_exhaustive()
    }
}

/// One run of a job, as the manager hands it to its platform.
pub struct JobRun {
    /// The submission.
    pub submission: JobSubmission,
    /// The compiled job.
    pub compiled: Compiled,
    /// Its checkpoint namespace.
    pub namespace: Arc<Namespace>,
    /// The coordinator's options (restarts, savepoint requests, components, rescale).
    pub options: CoordinatorOptions,
    /// Live figures the workers update.
    pub live: Arc<LiveJob>,
    /// Set when a user cancels the job; the workers fail its tasks.
    pub cancel: Arc<AtomicBool>,
}

/// The [`ManagerError::Compile`] of a submission whose model `model` did not compile:
/// `diags` with the job file named, and those in fields the submission's Delta changed
/// naming the Delta's file and field instead ([`nop_stream_core::delta::blame_delta`]).
pub fn compile_error(
    diags: nop_stream_core::Diagnostics,
    model: &StreamModel,
    sub: &JobSubmission,
) -> ManagerError {
    let diags = match &sub.delta {
        Some((file, text)) => {
            nop_stream_core::delta::blame_delta(diags, model, (&sub.file, &sub.text), (file, text))
        }
        None => diags,
    };
    ManagerError::Compile(diags.with_file(&sub.file).to_string())
}

/// Records read by a job's sources and committed by its sinks, and stale work refused,
/// as a platform counts them for a running job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Records its sources read.
    pub records_read: u64,
    /// Records its sinks wrote.
    pub records_written: u64,
    /// Data streams of older generations refused at nodes.
    pub refused_streams: u64,
    /// Commands of older generations refused at nodes.
    pub refused_commands: u64,
}

/// Where jobs run.
pub trait Platform: Send + Sync + 'static {
    /// Compiles `model` (the submission's job file, its Delta, parallelism and lineage
    /// applied) against the plugins this platform loads.
    ///
    /// # Errors
    /// [`ManagerError::Compile`] naming the job file, node and plugin at fault.
    fn compile(&self, model: &StreamModel, sub: &JobSubmission) -> Result<Compiled, ManagerError>;

    /// Runs operator `op`'s new component's `migrate` export on `entries` of `state`
    /// (schema version `from`), for `migrate-state` (design §10.6).
    ///
    /// # Errors
    /// The migration's failure, in words.
    fn migrate_state(
        &self,
        compiled: &Compiled,
        op: &str,
        state: &str,
        from: u32,
        entries: &[StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>, String>;

    /// Carries out the `finalize-sink` actions of a restore (the old sink plugin commits
    /// the savepoint's pending committables), or takes them as done by the submitter.
    /// Returns a line per action carried out, for the submitter.
    ///
    /// # Errors
    /// The sink's failure; an unknown commit outcome. Nothing is restored then.
    fn finalize_sinks(
        &self,
        sp: &Savepoint,
        actions: &crate::compat::Actions,
        sub: &JobSubmission,
    ) -> Result<Vec<String>, ManagerError>;

    /// Prepares the output of a run that starts fresh (no checkpoint to resume).
    ///
    /// # Errors
    /// The output cannot be claimed (a foreign directory), naming it.
    fn claim_output(&self, sub: &JobSubmission) -> Result<(), ManagerError>;

    /// Runs a job to its end: the coordinator role ([`crate::run_job`]) over this
    /// platform's workers.
    ///
    /// # Errors
    /// The job's failure ([`ManagerError::Job`]).
    fn run(&self, run: JobRun) -> Result<JobReport, ManagerError>;

    /// Live counts of running job `job`.
    fn live_counts(&self, job: &str) -> LiveCounts;

    /// The metrics samples of `job`'s subtasks this platform holds (design §15), over
    /// every attempt since its process started. Default: none.
    fn samples(&self, _job: &str) -> Vec<nop_stream_metrics::Sample> {
        Vec::new()
    }
}
