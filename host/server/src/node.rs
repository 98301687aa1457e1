//! The node process (design §2.5, "RuntimeNode"): registers with the coordinator, keeps its
//! lease, and hosts task attempts on the coordinator's orders.
//!
//! Frames the coordinator pushes are handled where they arrive when they cannot block
//! (commands, fences); requests (prepare, start, split discovery, settling sinks) run one at
//! a time on the node's control thread, since they load components and may wait for other
//! nodes' connections. One forwarder thread per running generation sends its tasks' events
//! to the coordinator; a ticker sends the node's counters every 500 ms, another the
//! watermarks of its subtasks of aligned sources (`max_drift_ms`, design §8.5) when they
//! changed, at most every [`WATERMARK_TICK`] (and unchanged every [`WATERMARK_REPEAT`]),
//! and the coordinator relays the other nodes' ones back ([`CoordinatorFrame::Watermarks`]).
//!
//! Components are fetched from the coordinator by sha256, verified against it, kept under
//! `<data>/components/<sha256>.wasm`, and compiled once (`<data>/cache`). Task state lives
//! under `<data>/jobs/<job>/state`; keyed state is restored from checkpoint storage, never
//! from a previous generation's databases.

use crate::store::{sha256_hex, write_atomically};
use crate::transport::ClusterTransport;
use crossbeam_channel::{Receiver, Sender};
use nop_stream_api::{JobId, OperatorId, PluginKind};
use nop_stream_checkpoint::namespace::cluster_identity;
use nop_stream_checkpoint::{Location, Namespace};
use nop_stream_cluster::endpoint::PeerConnection;
use nop_stream_cluster::session::{CoordinatorLink, NodeService, SessionOutcome, TermWatch};
use nop_stream_cluster::{ClusterEndpoint, DataPlane, DataPlaneConfig, Identity, NodeId, Protocol};
use nop_stream_core::PartitionedPlan;
use nop_stream_plugin_host::{Limits, LoadedPlugin, PluginHost, PluginSet, RuntimeError};
use nop_stream_proto::session::{
    CoordinatorFrame, JobEvent, JobSpec, NodeCounters, NodeDeployment, NodeFrame, NodeRequest,
    Reply, ReplyBody, SourceWatermarks,
};
use nop_stream_proto::{FailureClass, TaskError, TaskEvent, TaskFailure};
use nop_stream_task::{
    AlignmentTables, JobProgress, LiveTasks, LocalTaskEvent, PreparedTasks, RunOptions, TaskHost,
    plugin_host,
};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a node waits for another node's data connection while preparing.
const PEER_WAIT: Duration = Duration::from_secs(15);
/// How long the tasks of a fenced generation may take to stop before the node says which
/// still run (they are joined on the control thread, ahead of every later request).
const REAP_WARN_AFTER: Duration = Duration::from_secs(5);

/// How often a node looks for changed watermarks of its aligned source subtasks to report
/// (design §8.5): a subtask held back waits at most about this long, plus the relay's
/// round trip, after the slowest subtask elsewhere caught up.
pub const WATERMARK_TICK: Duration = Duration::from_millis(100);

/// A node repeats an unchanged watermark report this often, so that a peer that missed a
/// relay (its tasks were not prepared yet) learns the value without waiting for a change.
pub const WATERMARK_REPEAT: Duration = Duration::from_secs(1);

/// Settings of a node's task host.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// This node.
    pub id: NodeId,
    /// Its data directory (components, compiled cache, task state).
    pub data: PathBuf,
    /// The cluster's storage location (the coordinator's): its `cluster.json` must be the
    /// coordinator's.
    pub storage: Location,
    /// The checkpoint root. Default `<storage>/checkpoints`.
    pub checkpoints: Location,
    /// Capacity of each receiving channel queue, in messages (batches). Default 16.
    pub channel_capacity: usize,
    /// How the kernel schedules this node's task threads.
    pub task_scheduling: nop_stream_task::TaskScheduling,
    /// The coordinator terms this node has seen and what it refused for being older,
    /// shared with its session ([`nop_stream_cluster::session::NodeConfig::terms`]); the
    /// node reports the refusals as `node_stale_term_refusals`.
    pub terms: Arc<TermWatch>,
}

/// One aligned source of one generation of a job: (job, generation, vertex index).
type AlignedSource = (JobId, u64, u32);

/// A watermark report sent, `(subtask, watermark)` ascending, and when.
type SentWatermarks = (Vec<(u32, i64)>, Instant);

enum Control {
    Request(u64, Box<NodeRequest>),
    Reap(LiveTasks),
}

struct NodeJob {
    /// Generation of the tasks held (prepared or live).
    generation: u64,
    prepared: Option<PreparedTasks>,
    live: Option<LiveTasks>,
    progress: Arc<JobProgress>,
    refused_commands: u64,
    /// The watermark alignment tables of the tasks held (prepared or live), `None` once
    /// they are fenced.
    alignment: Option<AlignmentTables>,
    /// Relayed watermark frames of another generation than the one held, ignored.
    refused_watermarks: u64,
}

/// The node's task host: a [`NodeService`] for [`nop_stream_cluster::session::serve_node`].
pub struct NodeHost {
    opts: NodeOptions,
    me: String,
    rt: tokio::runtime::Handle,
    plane: DataPlane,
    endpoint: OnceLock<ClusterEndpoint>,
    link: Mutex<Option<CoordinatorLink>>,
    control: Sender<Control>,
    jobs: Mutex<HashMap<JobId, NodeJob>>,
    peers: Mutex<HashMap<String, quinn::Connection>>,
    peers_changed: Condvar,
    /// The identity of this node's storage's cluster, once read.
    cluster: OnceLock<String>,
    /// The last watermark report sent per (job, generation, vertex), and when.
    watermarks_sent: Mutex<HashMap<AlignedSource, SentWatermarks>>,
}

impl std::fmt::Debug for NodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHost")
            .field("node", &self.me)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime_failure(e: &RuntimeError) -> TaskFailure {
    TaskFailure {
        class: e.class(),
        message: e.to_string(),
    }
}

fn to_wire(e: LocalTaskEvent) -> TaskEvent<TaskFailure> {
    match e {
        TaskEvent::Ack { attempt, snapshot } => TaskEvent::Ack { attempt, snapshot },
        TaskEvent::EndOfData { attempt, task } => TaskEvent::EndOfData { attempt, task },
        TaskEvent::Committed {
            attempt,
            task,
            epoch,
        } => TaskEvent::Committed {
            attempt,
            task,
            epoch,
        },
        TaskEvent::Finished { attempt, report } => TaskEvent::Finished { attempt, report },
        TaskEvent::Failed {
            attempt,
            task,
            error,
        } => TaskEvent::Failed {
            attempt,
            task,
            error: runtime_failure(&error),
        },
    }
}

impl NodeHost {
    /// A node host running on `rt` (the process's tokio runtime). Starts its control
    /// thread and its counters ticker.
    ///
    /// # Errors
    /// The data directory cannot be created, the wasmtime engine cannot start, or a thread
    /// cannot be spawned.
    pub fn start(opts: NodeOptions, rt: tokio::runtime::Handle) -> Result<Arc<Self>, String> {
        std::fs::create_dir_all(opts.data.join("components"))
            .map_err(|e| format!("{}: {e}", opts.data.display()))?;
        let plugins = plugin_host(Some(opts.data.join("cache"))).map_err(|e| e.to_string())?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let host = Arc::new(NodeHost {
            me: Identity::Node(opts.id).label(),
            plane: DataPlane::new(rt.clone(), DataPlaneConfig::default()),
            rt,
            opts,
            endpoint: OnceLock::new(),
            link: Mutex::new(None),
            control: tx,
            jobs: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
            peers_changed: Condvar::new(),
            cluster: OnceLock::new(),
            watermarks_sent: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&host);
        std::thread::Builder::new()
            .name("node-control".into())
            .spawn(move || control_loop(weak, rx, plugins))
            .map_err(|e| e.to_string())?;
        let weak = Arc::downgrade(&host);
        std::thread::Builder::new()
            .name("node-counters".into())
            .spawn(move || {
                while let Some(h) = weak.upgrade() {
                    h.send_counters();
                    drop(h);
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
            .map_err(|e| e.to_string())?;
        let weak = Arc::downgrade(&host);
        std::thread::Builder::new()
            .name("node-watermarks".into())
            .spawn(move || {
                while let Some(h) = weak.upgrade() {
                    h.send_watermarks();
                    drop(h);
                    std::thread::sleep(WATERMARK_TICK);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(host)
    }

    fn link(&self) -> Option<CoordinatorLink> {
        lock(&self.link).clone()
    }

    fn send_counters(&self) {
        let Some(link) = self.link() else {
            return;
        };
        link.send(NodeFrame::NodeMetrics(node_samples(
            &self.me,
            &self.opts.terms,
        )));
        let jobs = lock(&self.jobs);
        for (job, j) in jobs.iter() {
            link.send(NodeFrame::Counters(NodeCounters {
                job: job.clone(),
                records_read: j.progress.records_read(),
                records_written: j.progress.records_written(),
                refused_streams: self.plane.fences().refused(job),
                refused_commands: j.refused_commands,
            }));
            link.send(NodeFrame::Metrics(metrics_frame(job.as_str(), &j.progress)));
        }
    }

    /// Reports the watermarks of this node's running subtasks of aligned sources: per (job,
    /// generation, vertex), when they changed since the last report or that one is
    /// [`WATERMARK_REPEAT`] old.
    fn send_watermarks(&self) {
        let Some(link) = self.link() else {
            return;
        };
        let reports: Vec<SourceWatermarks> = lock(&self.jobs)
            .iter()
            .filter(|(_, j)| j.live.as_ref().is_some_and(|l| !l.is_fenced()))
            .filter_map(|(job, j)| Some((job, j.generation, j.alignment.as_ref()?)))
            .flat_map(|(job, generation, tables)| {
                tables
                    .local()
                    .into_iter()
                    .map(move |(vertex, watermarks)| SourceWatermarks {
                        job: job.clone(),
                        generation,
                        vertex,
                        watermarks,
                    })
            })
            .collect();
        let mut sent = lock(&self.watermarks_sent);
        let now = Instant::now();
        let mut kept = HashMap::with_capacity(reports.len());
        for r in reports {
            let key = (r.job.clone(), r.generation, r.vertex);
            let due = sent.get(&key).is_none_or(|(last, at)| {
                *last != r.watermarks || now.duration_since(*at) >= WATERMARK_REPEAT
            });
            if due {
                kept.insert(key, (r.watermarks.clone(), now));
                link.send(NodeFrame::Watermarks(r));
            } else if let Some(v) = sent.remove(&key) {
                kept.insert(key, v);
            }
        }
        *sent = kept;
    }

    /// Writes relayed watermarks of subtasks on other nodes into the alignment table of
    /// the generation held; a frame of another generation is ignored and counted.
    fn on_watermarks(&self, w: &SourceWatermarks) {
        let mut jobs = lock(&self.jobs);
        let Some(j) = jobs.get_mut(&w.job) else {
            tracing::debug!(node = %self.me, job = %w.job, generation = w.generation, "watermarks of a job with no tasks here ignored");
            return;
        };
        match &j.alignment {
            Some(tables) if j.generation == w.generation => {
                tables.set_remote(w.vertex, &w.watermarks);
            }
            _ => {
                j.refused_watermarks += 1;
                tracing::info!(
                    node = %self.me, job = %w.job, generation = w.generation,
                    held = j.generation, refused = j.refused_watermarks,
                    "watermarks of a generation not held here ignored"
                );
            }
        }
    }

    /// Fences every generation of `job` below `generation`: the data plane refuses their
    /// streams, their tasks are cancelled and joined on the control thread.
    fn fence(&self, job: &JobId, generation: u64) {
        self.plane.fences().fence(job, generation);
        // A prepare waiting for a peer of a fenced generation stops waiting.
        self.peers_changed.notify_all();
        let mut jobs = lock(&self.jobs);
        if let Some(j) = jobs.get_mut(job)
            && j.generation < generation
        {
            j.prepared = None;
            j.alignment = None;
            if let Some(mut live) = j.live.take() {
                live.fence();
                let _ = self.control.send(Control::Reap(live));
            }
        }
    }

    /// Stops every task of every job: the lease is lost or about to be.
    fn stop_all(&self, why: &str) {
        let jobs: Vec<(JobId, u64)> = lock(&self.jobs)
            .iter()
            .filter(|(_, j)| j.live.is_some() || j.prepared.is_some())
            .map(|(k, j)| (k.clone(), j.generation))
            .collect();
        for (job, generation) in jobs {
            tracing::warn!(node = %self.me, %job, generation, "stopping tasks: {why}");
            self.fence(&job, generation + 1);
        }
    }

    fn on_command(
        &self,
        job: &JobId,
        generation: u64,
        task: &nop_stream_api::TaskId,
        cmd: nop_stream_proto::TaskCommand,
    ) {
        let mut jobs = lock(&self.jobs);
        let Some(j) = jobs.get_mut(job) else {
            tracing::warn!(node = %self.me, %job, generation, "command for a job with no tasks here refused");
            return;
        };
        let delivered = j.generation == generation
            && j.live
                .as_ref()
                .is_some_and(|l| !l.is_fenced() && l.send(task, cmd));
        if !delivered {
            // A command (a barrier or a commit) of a generation this node does not run:
            // refused and counted (design §2.5).
            j.refused_commands += 1;
            tracing::warn!(node = %self.me, %job, generation, held = j.generation, %task, ?cmd, "command refused");
        }
    }

    fn reply(&self, id: u64, result: Result<ReplyBody, TaskFailure>) {
        if let Some(link) = self.link() {
            link.send(NodeFrame::Reply(Reply { id, result }));
        }
    }

    /// The path of the component `sha256`, fetched from the coordinator and verified if
    /// it is not here yet.
    fn component(&self, sha256: &str, label: &str) -> Result<PathBuf, TaskFailure> {
        let fail = |class, m: String| TaskFailure {
            class,
            message: format!("component {label} ({sha256}): {m}"),
        };
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail(FailureClass::Fatal, "not a sha256".into()));
        }
        let path = self
            .opts
            .data
            .join("components")
            .join(format!("{sha256}.wasm"));
        if let Ok(bytes) = std::fs::read(&path)
            && sha256_hex(&bytes) == sha256
        {
            return Ok(path);
        }
        let link = self.link().ok_or_else(|| {
            fail(
                FailureClass::Recoverable,
                "not registered with a coordinator".into(),
            )
        })?;
        let bytes = self
            .rt
            .block_on(link.fetch_component(sha256))
            .map_err(|e| fail(FailureClass::Recoverable, e.to_string()))?;
        let got = sha256_hex(&bytes);
        if got != sha256 {
            return Err(fail(
                FailureClass::Recoverable,
                format!("the bytes fetched hash to {got}; refused"),
            ));
        }
        write_atomically(&path, &bytes)
            .map_err(|e| fail(FailureClass::Recoverable, e.to_string()))?;
        Ok(path)
    }

    /// Loads the component of every operator of `plan` (compiled once per hash).
    fn plugin_set(
        &self,
        plugins: &PluginHost,
        loaded: &mut HashMap<(String, PluginKind), Arc<LoadedPlugin>>,
        spec: &JobSpec,
        plan: &PartitionedPlan,
    ) -> Result<PluginSet, TaskFailure> {
        let mut set = PluginSet::new();
        for v in &plan.vertices {
            for op in &v.operators {
                let c = spec
                    .components
                    .get(op.operator_id.as_str())
                    .ok_or_else(|| TaskFailure {
                        class: FailureClass::Fatal,
                        message: format!("no component named for operator `{}`", op.name),
                    })?;
                let key = (c.sha256.clone(), op.kind);
                let p = match loaded.get(&key) {
                    Some(p) => Arc::clone(p),
                    None => {
                        let path = self.component(&c.sha256, &c.label)?;
                        let p = Arc::new(
                            plugins
                                .load(&c.label, &path, op.kind)
                                .map_err(|e| runtime_failure(&e))?,
                        );
                        loaded.insert(key, Arc::clone(&p));
                        p
                    }
                };
                set.insert(OperatorId::new(op.operator_id.as_str()), p);
            }
        }
        Ok(set)
    }

    /// Whether generation `generation` of `job` is fenced here (a newer one is in force).
    fn fenced(&self, job: &JobId, generation: u64) -> bool {
        self.plane
            .fences()
            .generation(job)
            .is_some_and(|g| g > generation)
    }

    /// A connection to every other node in `peers` (name → address) for generation
    /// `generation` of `job`: the node with the lower id dials, the other waits for it, so
    /// two nodes share one connection. Either stops, failing the prepare, as soon as the
    /// generation is fenced (the coordinator gave up on the deployment: a node of it was
    /// lost), instead of waiting out [`PEER_WAIT`] or the handshake.
    fn connect_peers(
        &self,
        job: &JobId,
        generation: u64,
        peers: &BTreeMap<String, String>,
    ) -> Result<HashMap<String, quinn::Connection>, TaskFailure> {
        let fail = |m: String| TaskFailure {
            class: FailureClass::Recoverable,
            message: m,
        };
        let fenced = |name: &str| {
            fail(format!(
                "stopped waiting for {name}: generation {generation} of job {job} was fenced"
            ))
        };
        let mut out = HashMap::new();
        for (name, addr) in peers {
            if *name == self.me {
                continue;
            }
            let addr: SocketAddr = addr
                .parse()
                .map_err(|e| fail(format!("{name} has a bad address `{addr}`: {e}")))?;
            let id = match name.parse::<Identity>() {
                Ok(Identity::Node(id)) => id,
                _ => return Err(fail(format!("`{name}` is not a node name"))),
            };
            let usable =
                |c: &quinn::Connection| c.close_reason().is_none() && c.remote_address() == addr;
            if let Some(c) = lock(&self.peers).get(name).filter(|c| usable(c)) {
                out.insert(name.clone(), c.clone());
                continue;
            }
            let conn = if self.opts.id < id {
                let ep = self
                    .endpoint
                    .get()
                    .ok_or_else(|| fail("the endpoint is not bound yet".into()))?;
                let pc = self
                    .rt
                    .block_on(async {
                        let peer = Identity::Node(id);
                        let dial = ep.connect(addr, &peer, Protocol::Node);
                        tokio::pin!(dial);
                        loop {
                            tokio::select! {
                                r = &mut dial => return Some(r),
                                () = tokio::time::sleep(Duration::from_millis(50)) => {
                                    if self.fenced(job, generation) {
                                        return None;
                                    }
                                }
                            }
                        }
                    })
                    .ok_or_else(|| fenced(name))?
                    .map_err(|e| fail(format!("cannot connect to {name} at {addr}: {e}")))?;
                self.plane.serve(pc.connection.clone());
                lock(&self.peers).insert(name.clone(), pc.connection.clone());
                pc.connection
            } else {
                let deadline = Instant::now() + PEER_WAIT;
                let mut g = lock(&self.peers);
                loop {
                    if let Some(c) = g.get(name).filter(|c| usable(c)) {
                        break c.clone();
                    }
                    if self.fenced(job, generation) {
                        return Err(fenced(name));
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(fail(format!("{name} did not connect within {PEER_WAIT:?}")));
                    }
                    g = self
                        .peers_changed
                        .wait_timeout(g, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            };
            out.insert(name.clone(), conn);
        }
        Ok(out)
    }

    fn run_options(&self, spec: &JobSpec) -> RunOptions {
        let mut opts = RunOptions::new(
            PathBuf::from(&spec.job_dir),
            PathBuf::from(&spec.output_dir),
            self.opts
                .data
                .join("jobs")
                .join(nop_stream_coordinator::restore::path_component(
                    spec.job.as_str(),
                )),
        );
        opts.limits = Limits {
            memory_bytes: spec.limits.memory_bytes,
            cpu_ms_per_call: spec.limits.cpu_ms_per_call,
            ..Limits::default()
        };
        opts.channel_capacity = self.opts.channel_capacity;
        opts.task_scheduling = self.opts.task_scheduling;
        opts
    }

    /// The job's checkpoint namespace, in this node's checkpoint root; refused when this
    /// node's storage is not the coordinator's cluster's.
    fn storage(&self, spec: &JobSpec) -> Result<Arc<Namespace>, TaskFailure> {
        let mine = match self.cluster.get() {
            Some(c) => c.clone(),
            None => {
                let root = self.opts.storage.open().map_err(|e| TaskFailure {
                    class: FailureClass::Recoverable,
                    message: format!("{}: its storage is not reachable: {e}", self.me),
                })?;
                let id = cluster_identity(&root, false).map_err(|e| TaskFailure {
                    class: FailureClass::Fatal,
                    message: format!("{}: {e}", self.me),
                })?;
                self.cluster.get_or_init(|| id).clone()
            }
        };
        if mine != spec.cluster {
            return Err(TaskFailure {
                class: FailureClass::Fatal,
                message: format!(
                    "{}: its storage {} belongs to cluster {mine}, the coordinator's to cluster \
                     {}; give every process the same --storage",
                    self.me, self.opts.storage, spec.cluster
                ),
            });
        }
        Namespace::open(&self.opts.checkpoints.join(&spec.namespace))
            .map(Arc::new)
            .map_err(|e| TaskFailure {
                class: FailureClass::Recoverable,
                message: format!("checkpoint storage is not reachable from this node: {e}"),
            })
    }

    fn progress(&self, job: &JobId) -> Arc<JobProgress> {
        let mut jobs = lock(&self.jobs);
        let j = jobs.entry(job.clone()).or_insert_with(|| NodeJob {
            generation: 0,
            prepared: None,
            live: None,
            progress: Arc::new(JobProgress::default()),
            refused_commands: 0,
            alignment: None,
            refused_watermarks: 0,
        });
        Arc::clone(&j.progress)
    }

    fn prepare(
        &self,
        plugins: &PluginHost,
        loaded: &mut HashMap<(String, PluginKind), Arc<LoadedPlugin>>,
        nd: NodeDeployment,
    ) -> Result<ReplyBody, TaskFailure> {
        let job = nd.deployment.job.clone();
        let generation = nd.deployment.generation;
        // Older generations of the job end here, before this one opens anything.
        let old = {
            self.plane.fences().fence(&job, generation);
            let mut jobs = lock(&self.jobs);
            jobs.get_mut(&job).and_then(|j| {
                j.prepared = None;
                j.alignment = None;
                j.live.take()
            })
        };
        if let Some(mut live) = old {
            live.fence();
            live.join();
        }
        let plan: PartitionedPlan =
            serde_json::from_str(&nd.spec.plan_json).map_err(|e| TaskFailure {
                class: FailureClass::Fatal,
                message: format!("the deployment's plan does not parse: {e}"),
            })?;
        let set = self.plugin_set(plugins, loaded, &nd.spec, &plan)?;
        let peers = self.connect_peers(&job, generation, &nd.peers)?;
        let opts = self.run_options(&nd.spec);
        let storage = self.storage(&nd.spec)?;
        let progress = self.progress(&job);
        let cancel = Arc::new(AtomicBool::new(false));
        let transport = Arc::new(ClusterTransport::new(
            job.clone(),
            generation,
            nd.deployment.token,
            self.me.clone(),
            &plan,
            &nd.placement,
            self.plane.clone(),
            peers,
            if self.opts.channel_capacity == 0 {
                16
            } else {
                self.opts.channel_capacity
            },
            Arc::clone(&cancel),
        ));
        let host = TaskHost::new(&plan, &set, &opts, storage, progress);
        let prepared = host
            .prepare(
                &nd.deployment,
                nd.deployment.tasks.clone(),
                transport,
                cancel,
            )
            .map_err(|e| runtime_failure(&e))?;
        tracing::info!(node = %self.me, %job, generation, tasks = prepared.tasks().len(), "prepared");
        let mut jobs = lock(&self.jobs);
        let j = jobs.get_mut(&job).expect("created by progress()");
        j.generation = generation;
        j.alignment = Some(prepared.alignment()).filter(|a| !a.is_empty());
        j.prepared = Some(prepared);
        Ok(ReplyBody::Done)
    }

    fn start_tasks(
        self: &Arc<Self>,
        job: &JobId,
        generation: u64,
    ) -> Result<ReplyBody, TaskFailure> {
        let mut jobs = lock(&self.jobs);
        let j = jobs.get_mut(job).filter(|j| j.generation == generation);
        let Some(prepared) = j.and_then(|j| j.prepared.take()) else {
            return Err(TaskFailure {
                class: FailureClass::Recoverable,
                message: format!(
                    "{}: no tasks of generation {generation} of job {job} are prepared here (fenced?)",
                    self.me
                ),
            });
        };
        let (live, spawn_error) = prepared.start();
        let events = live.events().clone();
        jobs.get_mut(job).expect("checked").live = Some(live);
        drop(jobs);
        let weak = Arc::downgrade(self);
        let job2 = job.clone();
        let _ = std::thread::Builder::new()
            .name(format!("events-{job}-{generation}"))
            .spawn(move || forward_events(weak, job2, generation, events));
        tracing::info!(node = %self.me, %job, generation, "started");
        match spawn_error {
            Some(e) => Err(runtime_failure(&e)),
            None => Ok(ReplyBody::Done),
        }
    }

    /// Runs `f` on a one-off task host of `spec`'s job (split discovery, settling sinks):
    /// the plan parsed, its components loaded, no tasks.
    fn with_one_off_host<T>(
        &self,
        plugins: &PluginHost,
        loaded: &mut HashMap<(String, PluginKind), Arc<LoadedPlugin>>,
        spec: &JobSpec,
        f: impl FnOnce(&TaskHost<'_>) -> nop_stream_plugin_host::Result<T>,
    ) -> Result<T, TaskFailure> {
        let plan: PartitionedPlan =
            serde_json::from_str(&spec.plan_json).map_err(|e| TaskFailure {
                class: FailureClass::Fatal,
                message: format!("the job's plan does not parse: {e}"),
            })?;
        let set = self.plugin_set(plugins, loaded, spec, &plan)?;
        let opts = self.run_options(spec);
        let host = TaskHost::new(
            &plan,
            &set,
            &opts,
            self.storage(spec)?,
            Arc::new(JobProgress::default()),
        );
        f(&host).map_err(|e| runtime_failure(&e))
    }

    fn handle(
        self: &Arc<Self>,
        plugins: &PluginHost,
        loaded: &mut HashMap<(String, PluginKind), Arc<LoadedPlugin>>,
        request: NodeRequest,
    ) -> Result<ReplyBody, TaskFailure> {
        match request {
            NodeRequest::Prepare(nd) => self.prepare(plugins, loaded, nd),
            NodeRequest::Start { job, generation } => self.start_tasks(&job, generation),
            NodeRequest::Warm(spec) => {
                let started = std::time::Instant::now();
                let plan: PartitionedPlan =
                    serde_json::from_str(&spec.plan_json).map_err(|e| TaskFailure {
                        class: FailureClass::Fatal,
                        message: format!("the job's plan does not parse: {e}"),
                    })?;
                self.plugin_set(plugins, loaded, &spec, &plan)?;
                tracing::info!(
                    node = %self.me, job = %spec.job, components = spec.components.len(),
                    ms = started.elapsed().as_millis() as u64, "components warmed"
                );
                Ok(ReplyBody::Done)
            }
            NodeRequest::DiscoverSplits {
                job,
                vertex,
                attempt,
            } => self
                .with_one_off_host(plugins, loaded, &job, |h| {
                    h.discover_splits(vertex as usize, attempt)
                })
                .map(ReplyBody::Splits),
            NodeRequest::SettleSinks {
                job,
                settlements,
                attempt,
            } => self
                .with_one_off_host(plugins, loaded, &job, |h| {
                    h.settle_sinks(&settlements, attempt)
                })
                .map(|()| ReplyBody::Done),
        }
    }
}

fn control_loop(host: std::sync::Weak<NodeHost>, rx: Receiver<Control>, plugins: PluginHost) {
    let mut loaded = HashMap::new();
    while let Ok(c) = rx.recv() {
        match c {
            Control::Reap(live) => {
                let me = host.upgrade().map(|h| h.me.clone()).unwrap_or_default();
                live.join_reporting(REAP_WARN_AFTER, |running| {
                    tracing::warn!(
                        node = %me, ?running,
                        "tasks of a fenced generation still run {REAP_WARN_AFTER:?} after their fence; \
                         this node's requests wait until they stop"
                    );
                });
            }
            Control::Request(id, request) => {
                let Some(h) = host.upgrade() else {
                    return;
                };
                let result = h.handle(&plugins, &mut loaded, *request);
                if let Err(e) = &result {
                    tracing::warn!(node = %h.me, "request {id} failed: {}", e.message);
                }
                h.reply(id, result);
            }
        }
    }
}

fn forward_events(
    host: std::sync::Weak<NodeHost>,
    job: JobId,
    generation: u64,
    events: Receiver<LocalTaskEvent>,
) {
    while let Ok(e) = events.recv() {
        let Some(h) = host.upgrade() else {
            return;
        };
        let event = to_wire(e);
        match h.link() {
            Some(link) => {
                link.send(NodeFrame::Event(JobEvent {
                    job: job.clone(),
                    generation,
                    event,
                }));
            }
            None => tracing::debug!(%job, generation, "event dropped: no session"),
        }
    }
}

impl NodeService for NodeHost {
    fn endpoint_ready(&self, endpoint: ClusterEndpoint) {
        let _ = self.endpoint.set(endpoint);
    }

    fn session_up(&self, link: CoordinatorLink) {
        // Tasks of an earlier registration were stopped when it ended.
        lock(&self.watermarks_sent).clear();
        *lock(&self.link) = Some(link);
    }

    fn coordinator_frame(&self, frame: CoordinatorFrame) {
        match frame {
            CoordinatorFrame::Request { id, request } => {
                let _ = self.control.send(Control::Request(id, request));
            }
            CoordinatorFrame::Command {
                job,
                generation,
                task,
                command,
            } => self.on_command(&job, generation, &task, command),
            CoordinatorFrame::Fence { job, generation } => self.fence(&job, generation),
            CoordinatorFrame::Watermarks(w) => self.on_watermarks(&w),
            CoordinatorFrame::Ack(_) | CoordinatorFrame::End(_) => {}
        }
    }

    fn session_down(&self, outcome: &SessionOutcome) {
        *lock(&self.link) = None;
        self.stop_all(&format!("{outcome:?}"));
    }

    fn peer_connection(&self, pc: PeerConnection) {
        self.plane.serve(pc.connection.clone());
        let name = pc.certified.label();
        tracing::debug!(node = %self.me, peer = %name, "data connection from a peer");
        if let Some(old) = lock(&self.peers).insert(name, pc.connection) {
            old.close(0u32.into(), b"replaced");
        }
        self.peers_changed.notify_all();
    }
}

/// The node's own samples (of no job): its stale-term refusals, labelled `node` = `me`.
fn node_samples(me: &str, terms: &TermWatch) -> Vec<nop_stream_metrics::Sample> {
    use nop_stream_metrics::{Sample, inventory::NODE_STALE_TERM_REFUSALS};
    [
        ("welcome", terms.refused_welcomes()),
        ("command", terms.refused_frames()),
    ]
    .into_iter()
    .map(|(what, n)| {
        Sample::counter(
            &NODE_STALE_TERM_REFUSALS,
            vec![me.to_owned(), what.to_owned()],
            n as f64,
        )
    })
    .collect()
}

/// The node's samples of `job` in one frame, cut at
/// [`nop_stream_metrics::MAX_FRAME_SAMPLES`].
fn metrics_frame(
    job: &str,
    progress: &nop_stream_task::JobProgress,
) -> nop_stream_metrics::MetricsFrame {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let mut samples = progress.metrics().samples(job, now_ms);
    if samples.len() > nop_stream_metrics::MAX_FRAME_SAMPLES {
        tracing::warn!(
            %job,
            "metrics: {} samples, sending the first {}",
            samples.len(),
            nop_stream_metrics::MAX_FRAME_SAMPLES
        );
        samples.truncate(nop_stream_metrics::MAX_FRAME_SAMPLES);
    }
    nop_stream_metrics::MetricsFrame {
        job: job.to_owned(),
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_metrics::inventory::NODE_STALE_TERM_REFUSALS;

    #[test]
    fn a_node_reports_its_stale_term_refusals_by_what() {
        let terms = TermWatch::default();
        assert!(terms.accept(9, true));
        assert!(!terms.accept(4, true), "a deposed leader's welcome");
        assert!(!terms.accept(4, false), "its frames");
        assert!(!terms.accept(8, false));
        let samples = node_samples("node-2", &terms);
        let count = |what: &str| {
            nop_stream_metrics::sum(
                &samples,
                &NODE_STALE_TERM_REFUSALS,
                &[("node", "node-2"), ("what", what)],
            )
        };
        assert_eq!((count("welcome"), count("command")), (1.0, 2.0));
        let text = nop_stream_metrics::encode(samples).unwrap();
        assert!(
            text.contains(
                "nopstream_node_stale_term_refusals_total{node=\"node-2\",what=\"command\"} 2"
            ),
            "{text}"
        );
    }
}
