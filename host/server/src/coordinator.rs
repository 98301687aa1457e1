//! The coordinator process (design §2.5, "JobCoordinator"): a shell around the job manager
//! of `nop-stream-coordinator` over the [`ClusterPlatform`], with the plugin registry and
//! the node hub. It translates: CLI requests to the manager or the registry, node frames to
//! the hub. No job lifecycle lives here.
//!
//! Jobs are recorded in a job store and checkpoints at the checkpoint location: a
//! restarted coordinator reloads every job that was submitted or running, waits for the
//! nodes of its last placement to register again (at most the lease TTL plus a second),
//! and resumes it from its latest durable epoch; sinks re-commit the durable epochs'
//! transactions, which they do idempotently.

use crate::hub::NodeHub;
use crate::platform::ClusterPlatform;
use crate::store::{PluginStore, StoreError};
use crate::workers::WorkerTimeouts;
use nop_stream_checkpoint::namespace::cluster_identity;
use nop_stream_checkpoint::{Location, names};
use nop_stream_cluster::session::{CoordinatorService, NodeRegistry, SessionPush};
use nop_stream_cluster::{Identity, LeaseId, NodeId};
use nop_stream_coordinator::election::Leadership;
use nop_stream_coordinator::jobs::{JobStore, ObjectJobStore};
use nop_stream_coordinator::manager::{
    JobManager, ManagerError, ManagerOptions, Note, RunIn, Submitted,
};
use nop_stream_plugin_host::PluginHost;
use nop_stream_proto::cli::{CliRequest, CliResponse};
use nop_stream_proto::session::{ComponentFrame, Hello, NodeFrame, NodeRequestFrame};
use nop_stream_task::plugin_host;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Settings of a coordinator process.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Data directory: nothing that matters, only caches (`cache/`: compiled components,
    /// `blobs/`: local copies of registry components). A coordinator started elsewhere with
    /// an empty one and the same [`Self::storage`] resumes every job.
    pub data: PathBuf,
    /// The storage location (design §14): `cluster.json`, `checkpoints/`, `jobs/` (job
    /// records), `registry/` (plugins), `savepoints/`. Every node is configured with the
    /// same one. Default `<data>`.
    pub storage: Location,
    /// The checkpoint root (a location every node reaches). Default
    /// `<storage>/checkpoints`.
    pub checkpoints: Location,
    /// The nodes' lease TTL: how long a restarted coordinator waits for the nodes of a
    /// job's last placement before redeploying without them (TTL + 1 s).
    pub lease_ttl: Duration,
    /// Global recoveries a job gets unless its submission says otherwise. Default 10.
    pub max_restarts: u32,
    /// Pause before each recovery attempt. Default 500 ms.
    pub restart_delay: Duration,
    /// Timing of the jobs' coordinator threads.
    pub timeouts: WorkerTimeouts,
    /// The leadership the coordinator acts under ([`crate::ha::HaCoordinator`]); `None`:
    /// the only coordinator.
    pub leadership: Option<Arc<Leadership>>,
    /// The job records' store; `None`: `jobs/` at [`Self::storage`]. With an election,
    /// a store whose writes are guarded on the leadership (etcd).
    pub jobs: Option<Arc<dyn JobStore>>,
}

impl ClusterOptions {
    /// Defaults for a data directory.
    pub fn new(data: PathBuf, lease_ttl: Duration) -> Self {
        let storage = Location::Local(data.clone());
        ClusterOptions {
            checkpoints: storage.join(names::CHECKPOINTS),
            storage,
            data,
            lease_ttl,
            max_restarts: 10,
            restart_delay: Duration::from_millis(500),
            timeouts: WorkerTimeouts::default(),
            leadership: None,
            jobs: None,
        }
    }
}

/// The coordinator: a [`CoordinatorService`] for
/// [`nop_stream_cluster::session::serve_coordinator`].
pub struct ClusterCoordinator {
    opts: ClusterOptions,
    hub: Arc<NodeHub>,
    plugins: Arc<PluginStore>,
    validator: Arc<Mutex<PluginHost>>,
    manager: Arc<JobManager<ClusterPlatform>>,
    registry: OnceLock<NodeRegistry>,
}

impl std::fmt::Debug for ClusterCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCoordinator")
            .field("data", &self.opts.data)
            .finish_non_exhaustive()
    }
}

/// Logs what a submission did.
fn log_note(note: &Note) {
    tracing::info!("{note:?}");
}

impl ClusterCoordinator {
    /// Opens the stores under `opts.data` and at the checkpoint location, and resumes every
    /// job that was submitted or running when the coordinator last stopped.
    ///
    /// # Errors
    /// A store cannot be opened, or the wasmtime engine cannot start.
    pub fn start(opts: ClusterOptions) -> Result<Arc<Self>, String> {
        let root = opts.storage.open().map_err(|e| e.to_string())?;
        let cluster = cluster_identity(&root, true).map_err(|e| e.to_string())?;
        tracing::info!(%cluster, storage = %opts.storage, "coordinator storage");
        let plugins = Arc::new(
            PluginStore::open(root.scope(names::REGISTRY), opts.data.join("blobs"))
                .map_err(|e| e.to_string())?,
        );
        let validator = Arc::new(Mutex::new(
            plugin_host(Some(opts.data.join("cache"))).map_err(|e| e.to_string())?,
        ));
        opts.checkpoints.open().map_err(|e| e.to_string())?;
        let jobs: Arc<dyn JobStore> = match &opts.jobs {
            Some(j) => Arc::clone(j),
            None => Arc::new(ObjectJobStore::new(root.scope(names::JOBS))),
        };
        let hub = Arc::new(NodeHub::default());
        let platform = ClusterPlatform::new(
            Arc::clone(&hub),
            Arc::clone(&plugins),
            Arc::clone(&validator),
            opts.checkpoints.clone(),
            cluster,
            opts.timeouts,
        );
        let mut mopts = ManagerOptions::new(
            opts.checkpoints.clone(),
            opts.storage.join(names::SAVEPOINTS),
        );
        mopts.savepoints_per_job = true;
        mopts.max_restarts = Some(opts.max_restarts);
        mopts.restart_delay = opts.restart_delay;
        mopts.where_ = "on this coordinator (`nopstream job list` shows them)".into();
        mopts.leadership = opts.leadership.clone();
        let manager = JobManager::new(Arc::new(platform), jobs, mopts, log_note);
        manager
            .resume_all(opts.lease_ttl + Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(ClusterCoordinator {
            opts,
            hub,
            plugins,
            validator,
            manager,
            registry: OnceLock::new(),
        }))
    }

    /// Hands the session layer's node registry to the coordinator (for `cluster status`).
    pub fn set_registry(&self, registry: NodeRegistry) {
        let _ = self.registry.set(registry);
    }

    /// The node hub.
    pub fn hub(&self) -> &Arc<NodeHub> {
        &self.hub
    }

    /// The job manager.
    pub fn manager(&self) -> &Arc<JobManager<ClusterPlatform>> {
        &self.manager
    }

    fn submitted(&self, s: Submitted) -> Result<CliResponse, ManagerError> {
        Ok(match s {
            Submitted::Started { record, .. } => {
                CliResponse::Job(Box::new(self.manager.status(&record.job)?))
            }
            Submitted::Refused { savepoint, report } => CliResponse::SavepointRefused {
                savepoint,
                exit_code: report.verdict.exit_code(),
                report_json: serde_json::to_string(&report)
                    .map_err(|e| ManagerError::Platform(e.to_string()))?,
            },
            Submitted::Checked { report } => CliResponse::SavepointChecked {
                report_json: serde_json::to_string(&report)
                    .map_err(|e| ManagerError::Platform(e.to_string()))?,
            },
        })
    }

    fn handle_cli(&self, request: CliRequest) -> Result<CliResponse, String> {
        Ok(match request {
            CliRequest::ClusterStatus => {
                CliResponse::Status(self.registry.get().map(|r| r.status()).unwrap_or_default())
            }
            CliRequest::Leadership => {
                return Err("leadership is answered by the coordinator process's election".into());
            }
            CliRequest::UploadPlugin { bytes, sha256 } => {
                let host = self.validator.lock().unwrap_or_else(|p| p.into_inner());
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
            CliRequest::SubmitJob(sub) => self
                .manager
                .submit(*sub, RunIn::Background)
                .and_then(|s| self.submitted(s))
                .map_err(|e| e.to_string())?,
            CliRequest::Control(c) => self.manager.control(c).map_err(|e| e.to_string())?,
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
            NodeFrame::Metrics(m) => self.hub.metrics(node, m),
            NodeFrame::NodeMetrics(m) => self.hub.node_metrics(node, m),
            NodeFrame::Watermarks(w) => self.hub.watermarks(node, w),
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
        match self.handle_cli(request) {
            Ok(r) => r,
            Err(e) => CliResponse::Error(e),
        }
    }
}
