//! The coordinator process (design §2.5, "JobCoordinator"): the plugin registry, the job
//! store, the node hub, and one thread per running job driving the coordinator role of
//! `nop-stream-coordinator` over [`ClusterWorkers`].
//!
//! Jobs, the plugin registry and the epoch logs are durable in the data directory and in
//! checkpoint storage: a restarted coordinator reloads every job that was submitted or
//! running, waits for the nodes of its last placement to register again (at most the lease
//! TTL plus a second), and resumes it from its latest durable epoch; sinks re-commit the
//! durable epochs' transactions, which they do idempotently.

use crate::hub::NodeHub;
use crate::store::{JobRecord, JobStore, PluginStore, StoreError, StoredPlugin};
use crate::workers::{ClusterWorkers, LiveStatus, WorkerTimeouts};
use nop_stream_api::{JobId, PluginInfo};
use nop_stream_checkpoint::{CheckpointStorage, LocalStorage};
use nop_stream_cluster::session::{CoordinatorService, NodeRegistry, SessionPush};
use nop_stream_cluster::{Identity, LeaseId, NodeId};
use nop_stream_core::{
    NodeSpec, PartitionedPlan, PluginCatalog, PluginRef, job_graph, parse_job_file,
    partitioned_plan, stream_graph,
};
use nop_stream_proto::cli::{
    CliRequest, CliResponse, JobState, JobStatus, JobSubmission, RefusedCounts,
};
use nop_stream_proto::session::{
    ComponentFrame, ComponentRef, Hello, JobSpec, NodeFrame, NodeRequestFrame, SandboxLimits,
};
use nop_stream_runtime::{Limits, PluginHost};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Settings of a coordinator process.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Data directory: `plugins/` (the registry), `jobs/` (job records), `cache/`.
    pub data: PathBuf,
    /// Root of checkpoint storage; every node must reach it at this path (a shared
    /// directory: design §2.5). Default `<data>/checkpoints`.
    pub checkpoints: PathBuf,
    /// The nodes' lease TTL: how long a restarted coordinator waits for the nodes of a
    /// job's last placement before redeploying without them (TTL + 1 s).
    pub lease_ttl: Duration,
    /// Global recoveries a job gets unless its submission says otherwise. Default 10.
    pub max_restarts: u32,
    /// Pause before each recovery attempt. Default 500 ms.
    pub restart_delay: Duration,
    /// Timing of the jobs' coordinator threads.
    pub timeouts: WorkerTimeouts,
}

impl ClusterOptions {
    /// Defaults for a data directory.
    pub fn new(data: PathBuf, lease_ttl: Duration) -> Self {
        ClusterOptions {
            checkpoints: data.join("checkpoints"),
            data,
            lease_ttl,
            max_restarts: 10,
            restart_delay: Duration::from_millis(500),
            timeouts: WorkerTimeouts::default(),
        }
    }
}

struct Running {
    live: Arc<LiveStatus>,
    cancel: Arc<AtomicBool>,
    savepoints: std::sync::mpsc::Sender<nop_stream_coordinator::SavepointRequest>,
}

/// The coordinator: a [`CoordinatorService`] for
/// [`nop_stream_cluster::session::serve_coordinator`].
pub struct ClusterCoordinator {
    opts: ClusterOptions,
    hub: Arc<NodeHub>,
    plugins: PluginStore,
    validator: Mutex<PluginHost>,
    jobs: JobStore,
    records: Mutex<BTreeMap<String, JobRecord>>,
    running: Mutex<HashMap<String, Running>>,
    /// Jobs whose checkpoint namespace a `--from-savepoint` submission is replacing (from
    /// its check until its job runs), or that a plain submission is starting (until its
    /// run is in `running`): any other submission of them is refused meanwhile, so no run
    /// starts on, and no second restore rewrites, a namespace being seeded.
    restoring: Mutex<BTreeSet<String>>,
    registry: OnceLock<NodeRegistry>,
    started: Instant,
    me: std::sync::Weak<ClusterCoordinator>,
}

/// Removes a job from [`ClusterCoordinator::restoring`] when its restore ends, however.
struct RestoreGuard<'a>(&'a Mutex<BTreeSet<String>>, String);

impl Drop for RestoreGuard<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

impl std::fmt::Debug for ClusterCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCoordinator")
            .field("data", &self.opts.data)
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

/// Plans name plugins by name@version; the registry describes them.
struct RegistryCatalog<'a>(&'a PluginStore);

impl PluginCatalog for RegistryCatalog<'_> {
    fn describe(&self, node: &NodeSpec) -> Result<PluginInfo, String> {
        match &node.plugin {
            PluginRef::Named { name, version } => self
                .0
                .get(name, version)
                .map(|p| p.info)
                .map_err(|e| e.to_string()),
            PluginRef::Path { path } => Err(format!(
                "`{path}`: a cluster job names its plugins as name@version from the \
                 cluster's registry; upload the file with `nopstream plugin upload {path} \
                 --cluster ADDR` and refer to it by the name@version its describe() reports"
            )),
        }
    }
}

/// How a launch relates to a savepoint restore.
#[derive(Debug, Clone, Default)]
struct Restore {
    /// The namespace was just seeded from a savepoint.
    seeded: bool,
    /// The seeded manifest's plan fingerprint, when it differs from the job's.
    rescale_from: Option<String>,
}

/// A job compiled for the cluster.
struct Compiled {
    plan: Arc<PartitionedPlan>,
    spec: JobSpec,
    /// The plan fingerprint of a seeded savepoint's manifest that the restore accepts
    /// ([`nop_stream_coordinator::CoordinatorOptions::rescale_from`]).
    rescale_from: Option<String>,
}

impl ClusterCoordinator {
    /// Opens the stores under `opts.data` and resumes every job that was submitted or
    /// running when the coordinator last stopped.
    ///
    /// # Errors
    /// A store cannot be opened, or the wasmtime engine cannot start.
    pub fn start(opts: ClusterOptions) -> Result<Arc<Self>, String> {
        let plugins = PluginStore::open(opts.data.join("plugins")).map_err(|e| e.to_string())?;
        let jobs = JobStore::open(opts.data.join("jobs")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&opts.checkpoints)
            .map_err(|e| format!("{}: {e}", opts.checkpoints.display()))?;
        let validator =
            PluginHost::new(Some(opts.data.join("cache"))).map_err(|e| e.to_string())?;
        let records = jobs.load_all().map_err(|e| e.to_string())?;
        let me = Arc::new_cyclic(|me| ClusterCoordinator {
            me: me.clone(),
            hub: Arc::new(NodeHub::default()),
            plugins,
            validator: Mutex::new(validator),
            jobs,
            records: Mutex::new(records.iter().map(|r| (r.job.clone(), r.clone())).collect()),
            running: Mutex::new(HashMap::new()),
            restoring: Mutex::new(BTreeSet::new()),
            registry: OnceLock::new(),
            started: Instant::now(),
            opts,
        });
        for r in records {
            if matches!(r.state, JobState::Submitted | JobState::Running) {
                tracing::info!(job = %r.job, "resuming a job after a coordinator restart");
                let expect = (
                    r.last_nodes.clone(),
                    me.started + me.opts.lease_ttl + Duration::from_secs(1),
                );
                let restore = Restore {
                    seeded: false,
                    rescale_from: r.rescale_from.clone(),
                };
                if let Err(e) = me.launch(&r.submission, false, Some(expect), restore) {
                    me.update(&r.job, |rec| {
                        rec.state = JobState::Failed;
                        rec.error = Some(format!("cannot resume after a coordinator restart: {e}"));
                    });
                }
            }
        }
        Ok(me)
    }

    /// Hands the session layer's node registry to the coordinator (for `cluster status`).
    pub fn set_registry(&self, registry: NodeRegistry) {
        let _ = self.registry.set(registry);
    }

    /// The node hub.
    pub fn hub(&self) -> &Arc<NodeHub> {
        &self.hub
    }

    fn checkpoint_dir(&self, plan: &PartitionedPlan) -> PathBuf {
        self.opts
            .checkpoints
            .join(nop_stream_coordinator::checkpoint_namespace(plan))
    }

    fn compile(&self, sub: &JobSubmission) -> Result<Compiled, String> {
        let model = parse_job_file(&sub.file, &sub.text).map_err(|d| d.to_string())?;
        let mut model = match sub.parallelism {
            Some(p) => model.with_parallelism(p),
            None => model,
        };
        if let Some(lineage) = &sub.pipeline {
            // A fork (design §3.1): another lineage, namespace and transaction ids.
            model.job.pipeline = lineage.clone();
            nop_stream_core::validate_model(&model)
                .map_err(|d| format!("fork {lineage}: not a valid pipeline id: {d}"))?;
        }
        let stream = stream_graph(&model, &RegistryCatalog(&self.plugins))
            .map_err(|d| d.with_file(&sub.file).to_string())?;
        let plan = partitioned_plan(&job_graph(&stream));
        let mut components = BTreeMap::new();
        for v in &plan.vertices {
            for op in &v.operators {
                let PluginRef::Named { name, version } = &op.plugin else {
                    return Err(format!("operator `{}` names its plugin by path", op.name));
                };
                let p: StoredPlugin = self.plugins.get(name, version).map_err(|e| e.to_string())?;
                components.insert(
                    op.operator_id.to_string(),
                    ComponentRef {
                        label: p.entry.reference(),
                        sha256: p.entry.sha256,
                        kind: p.entry.kind,
                        size: p.entry.size,
                    },
                );
            }
        }
        let defaults = Limits::default();
        let spec = JobSpec {
            job: plan.job.job_id.clone(),
            plan_json: serde_json::to_string(&plan).map_err(|e| e.to_string())?,
            components,
            job_dir: sub.job_dir.clone(),
            output_dir: sub.output_dir.clone(),
            checkpoint_dir: self.checkpoint_dir(&plan).display().to_string(),
            limits: SandboxLimits {
                memory_bytes: sub.memory_bytes.unwrap_or(defaults.memory_bytes),
                cpu_ms_per_call: sub.cpu_ms_per_call.unwrap_or(defaults.cpu_ms_per_call),
            },
        };
        Ok(Compiled {
            plan: Arc::new(plan),
            spec,
            rescale_from: None,
        })
    }

    fn update(&self, job: &str, f: impl FnOnce(&mut JobRecord)) {
        let mut records = lock(&self.records);
        if let Some(r) = records.get_mut(job) {
            f(r);
            if let Err(e) = self.jobs.save(r) {
                tracing::error!(job, "cannot save the job record: {e}");
            }
        }
    }

    /// Compiles and starts a job's coordinator thread. `fresh` discards its checkpoints;
    /// `expect` is the nodes to wait for first (after a coordinator restart); `restore`
    /// says whether its namespace was just seeded from a savepoint.
    fn launch(
        self: &Arc<Self>,
        sub: &JobSubmission,
        fresh: bool,
        expect: Option<(Vec<String>, Instant)>,
        restore: Restore,
    ) -> Result<JobRecord, String> {
        let mut compiled = self.compile(sub)?;
        compiled.rescale_from = restore.rescale_from.clone();
        let job = compiled.plan.job.job_id.to_string();
        // A plain submission holds the job in `restoring` too until its run is registered
        // in `running`: checking the set and inserting into `running` later would let a
        // restore that starts in between pass its running check and seed the namespace
        // this run is starting on. (A seeded launch is the restore holding it already.)
        let _launching = if restore.seeded {
            None
        } else {
            if !lock(&self.restoring).insert(job.clone()) {
                return Err(format!(
                    "job `{job}` is being restored from a savepoint or submitted by another \
                     request; submit again once it runs"
                ));
            }
            Some(RestoreGuard(&self.restoring, job.clone()))
        };
        if lock(&self.running).contains_key(&job) {
            return Err(format!(
                "job `{job}` is running; cancel it first (`nopstream job cancel {job}`)"
            ));
        }
        let dir = PathBuf::from(&compiled.spec.checkpoint_dir);
        if fresh && dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let resuming = dir
            .join("manifests")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some());
        if !resuming {
            nop_stream_runtime::job::claim_output_dir(Path::new(&sub.output_dir))?;
        }
        let storage: Arc<dyn CheckpointStorage> =
            Arc::new(LocalStorage::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?);
        let previous = lock(&self.records).get(&job).cloned();
        // A job's generations never repeat: its nodes keep the fence of its last run (up to
        // the last generation + 1) and refuse the channels of older generations, so a run in
        // a new checkpoint namespace (`--fresh`, or its checkpoints gone), whose attempts
        // would count from 1 again, goes on above the last generation deployed. So does a
        // namespace just seeded from a savepoint.
        if (!resuming || restore.seeded)
            && let Some(last) = previous.as_ref().map(|p| p.generation).filter(|g| *g > 0)
        {
            let last = u32::try_from(last).unwrap_or(u32::MAX);
            storage
                .next_attempt(last - 1)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let record = JobRecord {
            job: job.clone(),
            name: compiled.plan.job.name.clone(),
            submission: sub.clone(),
            state: JobState::Running,
            semantic: compiled.plan.job.semantic.to_string(),
            submitted_ms: previous
                .as_ref()
                .filter(|_| expect.is_some())
                .map_or_else(now_ms, |p| p.submitted_ms),
            generation: previous.as_ref().map_or(0, |p| p.generation),
            recoveries: previous
                .as_ref()
                .filter(|_| expect.is_some())
                .map_or(0, |p| p.recoveries),
            error: None,
            deployment_json: previous.as_ref().and_then(|p| p.deployment_json.clone()),
            report_json: None,
            refused: previous
                .as_ref()
                .filter(|_| expect.is_some())
                .map_or_else(RefusedCounts::default, |p| p.refused),
            last_nodes: previous.map(|p| p.last_nodes).unwrap_or_default(),
            rescale_from: restore.rescale_from,
        };
        self.jobs.save(&record).map_err(|e| e.to_string())?;
        lock(&self.records).insert(job.clone(), record.clone());
        let live = Arc::new(LiveStatus::default());
        *lock(&live.expect) = expect;
        let weak = self.me.clone();
        let hook_job = job.clone();
        *lock(&live.on_deploy) = Some(Box::new(move |generation, placement| {
            if let Some(me) = weak.upgrade() {
                me.update(&hook_job, |r| {
                    r.generation = generation;
                    r.deployment_json = serde_json::to_string(placement).ok();
                    r.last_nodes = placement.nodes().into_iter().map(str::to_owned).collect();
                });
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
        let savepoints = Arc::new(Mutex::new(sp_rx));
        let me = Arc::clone(self);
        let max_restarts = sub.max_restarts.unwrap_or(self.opts.max_restarts);
        std::thread::Builder::new()
            .name(format!("job-{job}"))
            .spawn(move || me.run(compiled, storage, live, cancel, max_restarts, savepoints))
            .map_err(|e| e.to_string())?;
        Ok(record)
    }

    fn run(
        self: Arc<Self>,
        compiled: Compiled,
        storage: Arc<dyn CheckpointStorage>,
        live: Arc<LiveStatus>,
        cancel: Arc<AtomicBool>,
        max_restarts: u32,
        savepoints: Arc<Mutex<std::sync::mpsc::Receiver<nop_stream_coordinator::SavepointRequest>>>,
    ) {
        let job = compiled.plan.job.job_id.to_string();
        let copts = nop_stream_coordinator::CoordinatorOptions {
            max_restarts: Some(max_restarts),
            restart_delay: self.opts.restart_delay,
            components: compiled
                .spec
                .components
                .iter()
                .map(|(id, c)| (id.clone(), c.sha256.clone()))
                .collect(),
            savepoints: Some(savepoints),
            savepoint_dir: self.savepoint_dir(&job),
            rescale_from: compiled.rescale_from.clone(),
            ..Default::default()
        };
        let mut workers = ClusterWorkers::new(
            Arc::clone(&self.hub),
            Arc::clone(&compiled.plan),
            compiled.spec,
            Arc::clone(&live),
            Arc::clone(&cancel),
            self.opts.timeouts,
        );
        let result = nop_stream_coordinator::run_job(&compiled.plan, &mut workers, storage, &copts);
        drop(workers);
        let counters = self.hub.job_counters(&JobId::new(&job));
        let placement = lock(&live.placement).clone();
        let deployments = live.deployments.load(Ordering::SeqCst) as u32;
        self.update(&job, |r| {
            r.generation = live.generation.load(Ordering::SeqCst).max(r.generation);
            r.recoveries += deployments.saturating_sub(1);
            r.refused = RefusedCounts {
                events: r.refused.events + live.refused_events.load(Ordering::Relaxed),
                streams: counters.refused_streams,
                commands: counters.refused_commands,
            };
            if let Some(p) = &placement {
                r.deployment_json = serde_json::to_string(p).ok();
                r.last_nodes = p.nodes().into_iter().map(str::to_owned).collect();
            }
            match &result {
                Ok(report) => {
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
                    r.error = Some(e.message.clone());
                }
            }
        });
        match &result {
            Ok(_) => tracing::info!(%job, "job finished"),
            Err(e) => tracing::warn!(%job, "job ended: {}", e.message),
        }
        lock(&self.running).remove(&job);
    }

    fn status(&self, r: &JobRecord) -> JobStatus {
        let running = lock(&self.running);
        let live = running.get(&r.job).map(|x| Arc::clone(&x.live));
        drop(running);
        let counters = self.hub.job_counters(&JobId::new(&r.job));
        let mut refused = r.refused;
        let mut generation = r.generation;
        let mut deployment_json = r.deployment_json.clone();
        let mut recoveries = r.recoveries;
        if let Some(l) = &live {
            refused.events += l.refused_events.load(Ordering::Relaxed);
            refused.streams = counters.refused_streams;
            refused.commands = counters.refused_commands;
            generation = generation.max(l.generation.load(Ordering::SeqCst));
            recoveries += (l.deployments.load(Ordering::SeqCst) as u32).saturating_sub(1);
            if let Some(p) = lock(&l.placement).as_ref() {
                deployment_json = serde_json::to_string(p).ok();
            }
        }
        let durable_epoch = self.durable_epoch(r);
        JobStatus {
            job: r.job.clone(),
            name: r.name.clone(),
            state: r.state,
            semantic: r.semantic.clone(),
            submitted_ms: r.submitted_ms,
            generation,
            recoveries,
            durable_epoch,
            records_read: counters.records_read,
            records_written: counters.records_written,
            refused,
            output_dir: r.submission.output_dir.clone(),
            error: r.error.clone(),
            deployment_json,
            report_json: r.report_json.clone(),
        }
    }

    fn job_storage(&self, r: &JobRecord) -> Option<LocalStorage> {
        let c = self.compile(&r.submission).ok()?;
        LocalStorage::open(Path::new(&c.spec.checkpoint_dir)).ok()
    }

    fn durable_epoch(&self, r: &JobRecord) -> Option<u64> {
        let s = self.job_storage(r)?;
        s.manifest_epochs().ok()?.last().map(|e| e.0)
    }

    fn record(&self, job: &str) -> Result<JobRecord, String> {
        lock(&self.records).get(job).cloned().ok_or_else(|| {
            format!("no job `{job}` on this coordinator (`nopstream job list` shows them)")
        })
    }

    /// Where the job's savepoints go unless a directory is named:
    /// `<data>/savepoints/<job>`.
    fn savepoint_dir(&self, job: &str) -> PathBuf {
        self.opts
            .data
            .join("savepoints")
            .join(nop_stream_coordinator::restore::path_component(job))
    }

    /// `job submit --from-savepoint` (design §10.4–§10.6), as `nopstream run
    /// --from-savepoint` does it embedded, with the same code
    /// ([`nop_stream_coordinator::from_savepoint`]): the savepoint is checked against the
    /// job compiled from the registry's components; anything but compatible is refused
    /// with the report, touching nothing. Then the job's checkpoint namespace is replaced
    /// by the savepoint's epoch with the actions applied (`migrate-state` runs the
    /// registry's component), and the job starts from it: its state, split cursors and
    /// pending sink committables. `--fresh` lets it go back past epochs the namespace made
    /// after the savepoint (`NAMESPACE_ADVANCED`). A check-only submission stops after a
    /// compatible check.
    fn submit_from_savepoint(self: &Arc<Self>, sub: &JobSubmission) -> Result<CliResponse, String> {
        use nop_stream_coordinator::compat::{Action, Actions, Status};
        use nop_stream_coordinator::from_savepoint;
        let given = sub.from_savepoint.as_deref().unwrap_or_default();
        let compiled = self.compile(sub)?;
        let job = compiled.plan.job.job_id.to_string();
        // Held until the restored job runs (or this fails): first the guard, then the
        // running check, so a concurrent restore is refused by one or the other.
        if !lock(&self.restoring).insert(job.clone()) {
            return Err(format!(
                "job `{job}` is being restored from a savepoint by another submission; \
                 submit again once it runs"
            ));
        }
        let _restoring = RestoreGuard(&self.restoring, job.clone());
        if lock(&self.running).contains_key(&job) {
            return Err(format!(
                "job `{job}` is running; stop it first (`nopstream stop {job} --savepoint`) \
                 or cancel it (`nopstream job cancel {job}`)"
            ));
        }
        let dir = if Path::new(given).is_absolute() {
            PathBuf::from(given)
        } else {
            self.savepoint_dir(&job).join(given)
        };
        let sp = from_savepoint::open(&dir)?;
        let actions: Actions = match &sub.actions_json {
            Some(j) => serde_json::from_str(j).map_err(|e| format!("the actions: {e}"))?,
            None => Actions::default(),
        };
        let namespace = PathBuf::from(&compiled.spec.checkpoint_dir);
        let components: BTreeMap<String, String> = compiled
            .spec
            .components
            .iter()
            .map(|(id, c)| (id.clone(), c.sha256.clone()))
            .collect();
        // With --fresh the namespace is replaced whatever epochs it holds.
        let report = from_savepoint::check_against(
            &sp,
            &compiled.plan,
            &components,
            (!sub.fresh).then_some(namespace.as_path()),
            &actions,
        )?;
        if report.verdict != Status::Compatible {
            tracing::info!(%job, savepoint = %dir.display(), verdict = %report.verdict, "restore refused");
            return Ok(CliResponse::SavepointRefused {
                savepoint: dir.display().to_string(),
                exit_code: report.verdict.exit_code(),
                report_json: serde_json::to_string(&report).map_err(|e| e.to_string())?,
            });
        }
        // `fork`: the job runs as another pipeline lineage from here on (its record keeps
        // the lineage), restored into that lineage's namespace, which must be empty
        // unless --fresh.
        let forked: Option<JobSubmission> = actions.actions.iter().find_map(|a| match a {
            Action::Fork { namespace } => Some(JobSubmission {
                pipeline: Some(namespace.clone()),
                ..sub.clone()
            }),
            _ => None,
        });
        let (sub, compiled, namespace) = match &forked {
            Some(f) => {
                let c = self.compile(f)?;
                let ns = PathBuf::from(&c.spec.checkpoint_dir);
                let lineage = f.pipeline.as_deref().unwrap_or_default();
                if !f.fresh
                    && ns
                        .join("manifests")
                        .read_dir()
                        .is_ok_and(|mut d| d.next().is_some())
                {
                    return Err(format!(
                        "fork {lineage}: namespace {} already holds checkpoints; fork into \
                         another one, or add --fresh to discard them",
                        ns.display()
                    ));
                }
                if f.fresh && ns.exists() && !f.check_only {
                    std::fs::remove_dir_all(&ns).map_err(|e| format!("{}: {e}", ns.display()))?;
                }
                tracing::info!(%job, %lineage, "forking into another pipeline lineage");
                (f, c, ns)
            }
            None => (sub, compiled, namespace),
        };
        if sub.check_only {
            return Ok(CliResponse::SavepointChecked {
                report_json: serde_json::to_string(&report).map_err(|e| e.to_string())?,
            });
        }
        // A `finalize-sink` was carried out by the submitter (`job submit` runs the old
        // sink plugin between a check-only request and this one); the seeding drops the
        // sink's pending committables.
        let fp = {
            let mut loaded: HashMap<String, nop_stream_runtime::LoadedPlugin> = HashMap::new();
            let mut migrate = |op: &str,
                               state: &str,
                               from: u32,
                               entries: &[nop_stream_coordinator::migrate::StateEntry]|
             -> Result<Vec<Option<Vec<u8>>>, String> {
                if !loaded.contains_key(op) {
                    let c = compiled
                        .spec
                        .components
                        .get(op)
                        .ok_or_else(|| format!("the job has no operator `{op}`"))?;
                    // The registry's component, compiled by the validator's engine (its
                    // lock is held only while it loads).
                    let p = lock(&self.validator)
                        .load(&c.label, &self.plugins.blob_file(&c.sha256), c.kind)
                        .map_err(|e| e.to_string())?;
                    loaded.insert(op.to_owned(), p);
                }
                let entries = entries
                    .iter()
                    .map(|e| (e.namespace.clone(), e.key.clone(), e.value.clone()))
                    .collect();
                loaded[op]
                    .migrate_state(op, state, from, entries)
                    .map_err(|e| e.to_string())
            };
            from_savepoint::seed_namespace(
                &sp,
                &namespace,
                &actions,
                &compiled.plan,
                &components,
                &mut migrate,
            )?
        };
        tracing::info!(%job, savepoint = %dir.display(), epoch = sp.info.epoch, actions = actions.actions.len(), "restoring a savepoint");
        let restore = Restore {
            seeded: true,
            rescale_from: Some(fp).filter(|fp| *fp != compiled.plan.fingerprint),
        };
        let r = self.launch(sub, false, None, restore)?;
        Ok(CliResponse::Job(Box::new(self.status(&r))))
    }

    fn handle_cli(self: &Arc<Self>, request: CliRequest) -> Result<CliResponse, String> {
        Ok(match request {
            CliRequest::ClusterStatus => {
                CliResponse::Status(self.registry.get().map(|r| r.status()).unwrap_or_default())
            }
            CliRequest::UploadPlugin { bytes, sha256 } => {
                let host = lock(&self.validator);
                let stored = self
                    .plugins
                    .upload(&host, &bytes, &sha256)
                    .map_err(|e: StoreError| e.to_string())?;
                tracing::info!(plugin = %stored.entry.reference(), sha256 = %stored.entry.sha256, "plugin stored");
                CliResponse::Plugin(stored.entry)
            }
            CliRequest::ListPlugins => {
                CliResponse::Plugins(self.plugins.list().into_iter().map(|p| p.entry).collect())
            }
            CliRequest::SubmitJob(sub) if sub.from_savepoint.is_some() => {
                self.submit_from_savepoint(&sub)?
            }
            CliRequest::SubmitJob(sub) => {
                let r = self.launch(&sub, sub.fresh, None, Restore::default())?;
                CliResponse::Job(Box::new(self.status(&r)))
            }
            CliRequest::ListJobs => {
                let records: Vec<JobRecord> = lock(&self.records).values().cloned().collect();
                CliResponse::Jobs(records.iter().map(|r| self.status(r)).collect())
            }
            CliRequest::JobStatus { job } => {
                CliResponse::Job(Box::new(self.status(&self.record(&job)?)))
            }
            CliRequest::CancelJob { job } => {
                let r = self.record(&job)?;
                match lock(&self.running).get(&job) {
                    Some(run) => run.cancel.store(true, Ordering::SeqCst),
                    None => {
                        return Err(format!("job `{job}` is not running (it is {})", r.state));
                    }
                }
                CliResponse::Job(Box::new(self.status(&r)))
            }
            CliRequest::TakeSavepoint { job, out, stop } => {
                let tx = match lock(&self.running).get(&job) {
                    Some(r) => r.savepoints.clone(),
                    None => return Err(format!("job `{job}` is not running")),
                };
                let (reply, rx) = std::sync::mpsc::channel();
                tx.send(nop_stream_coordinator::SavepointRequest {
                    out: out.map(PathBuf::from),
                    stop,
                    reply,
                })
                .map_err(|_| format!("job `{job}` is ending"))?;
                let info = rx.recv_timeout(Duration::from_secs(600)).map_err(|_| {
                    format!("job `{job}` made no epoch durable within 10 minutes")
                })??;
                CliResponse::Savepoint {
                    info_json: serde_json::to_string(&info).map_err(|e| e.to_string())?,
                }
            }
            CliRequest::Checkpoints { job } => {
                let r = self.record(&job)?;
                let s = self
                    .job_storage(&r)
                    .ok_or_else(|| format!("job `{job}` has no checkpoint storage"))?;
                let log = s.read_log().map_err(|e| e.to_string())?;
                let mut manifests = Vec::new();
                for e in s.manifest_epochs().map_err(|e| e.to_string())? {
                    manifests.push(s.read_manifest(e).map_err(|e| e.to_string())?);
                }
                CliResponse::Checkpoints {
                    log_json: serde_json::to_string(&log).map_err(|e| e.to_string())?,
                    manifests_json: serde_json::to_string(&manifests).map_err(|e| e.to_string())?,
                }
            }
        })
    }
}

impl CoordinatorService for ClusterCoordinator {
    fn node_up(&self, node: NodeId, lease: LeaseId, hello: &Hello, push: SessionPush) {
        self.hub.node_up(node, lease, hello, push);
    }

    fn node_frame(&self, node: NodeId, _lease: LeaseId, frame: NodeFrame) {
        match frame {
            NodeFrame::Event(e) => self.hub.event(node, e),
            NodeFrame::Reply(r) => self.hub.reply(r),
            NodeFrame::Counters(c) => self.hub.counters(node, c),
            NodeFrame::Heartbeat(_) => {}
        }
    }

    fn node_down(&self, node: NodeId, lease: LeaseId, reason: &str) {
        self.hub.node_down(node, lease, reason);
    }

    fn node_request(&self, node: NodeId, request: NodeRequestFrame) -> ComponentFrame {
        match request {
            NodeRequestFrame::Component { sha256 } => match self.plugins.blob(&sha256) {
                Ok(b) => ComponentFrame::Bytes(b),
                Err(e) => {
                    tracing::warn!(node = %Identity::Node(node).label(), "component request refused: {e}");
                    ComponentFrame::NotFound(e.to_string())
                }
            },
        }
    }

    fn cli_request(&self, client: &Identity, request: CliRequest) -> CliResponse {
        tracing::debug!(client = %client.label(), ?request, "cli request");
        // Requests that start jobs need the Arc the session layer holds.
        let Some(me) = self.me.upgrade() else {
            return CliResponse::Error("the coordinator is shutting down".into());
        };
        match me.handle_cli(request) {
            Ok(r) => r,
            Err(e) => CliResponse::Error(e),
        }
    }
}
