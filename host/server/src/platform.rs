//! The cluster [`Platform`] (design §2, §8): jobs compile against the plugin registry and
//! run on [`ClusterWorkers`], node processes reached over QUIC through the [`NodeHub`].
//! With it, a [`JobManager`](nop_stream_coordinator::manager::JobManager) is the
//! coordinator process's job manager.

use crate::hub::NodeHub;
use crate::store::PluginStore;
use crate::workers::{ClusterWorkers, WorkerTimeouts};
use nop_stream_api::{JobId, PluginInfo};
use nop_stream_checkpoint::Location;
use nop_stream_coordinator::JobReport;
use nop_stream_coordinator::compat::Actions;
use nop_stream_coordinator::from_savepoint::Savepoint;
use nop_stream_coordinator::manager::{
    Compiled, Component, JobRun, LiveCounts, ManagerError, Platform, compile_error,
};
use nop_stream_coordinator::migrate::StateEntry;
use nop_stream_core::{
    NodeSpec, PluginCatalog, PluginRef, StreamModel, job_graph, partitioned_plan, stream_graph,
};
use nop_stream_plugin_host::{Limits, PluginHost};
use nop_stream_proto::cli::JobSubmission;
use nop_stream_proto::session::{ComponentRef, JobSpec, SandboxLimits};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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

/// Jobs of a coordinator process.
pub struct ClusterPlatform {
    hub: Arc<NodeHub>,
    plugins: Arc<PluginStore>,
    /// Loads components to validate uploads and run migrations (its lock is held only
    /// while it loads).
    validator: Arc<Mutex<PluginHost>>,
    checkpoints: Location,
    cluster: String,
    timeouts: WorkerTimeouts,
}

impl std::fmt::Debug for ClusterPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPlatform")
            .field("checkpoints", &self.checkpoints)
            .finish_non_exhaustive()
    }
}

impl ClusterPlatform {
    /// Jobs over `hub`'s nodes, compiled against `plugins`, checkpointing into
    /// `checkpoints` of the cluster `cluster` (its storage's identity).
    pub fn new(
        hub: Arc<NodeHub>,
        plugins: Arc<PluginStore>,
        validator: Arc<Mutex<PluginHost>>,
        checkpoints: Location,
        cluster: String,
        timeouts: WorkerTimeouts,
    ) -> Self {
        ClusterPlatform {
            hub,
            plugins,
            validator,
            checkpoints,
            cluster,
            timeouts,
        }
    }

    /// What nodes need of a job besides its deployments.
    fn spec(&self, sub: &JobSubmission, compiled: &Compiled) -> Result<JobSpec, ManagerError> {
        let plan = &compiled.plan;
        let defaults = Limits::default();
        Ok(JobSpec {
            job: plan.job.job_id.clone(),
            plan_json: serde_json::to_string(plan.as_ref())
                .map_err(|e| ManagerError::Platform(e.to_string()))?,
            components: compiled
                .components
                .iter()
                .map(|(id, c)| {
                    (
                        id.clone(),
                        ComponentRef {
                            sha256: c.sha256.clone(),
                            label: c.label.clone(),
                            kind: c.kind,
                            size: c.size,
                        },
                    )
                })
                .collect(),
            job_dir: sub.job_dir.clone(),
            output_dir: sub.output_dir.clone(),
            namespace: nop_stream_coordinator::checkpoint_namespace(plan),
            cluster: self.cluster.clone(),
            limits: SandboxLimits {
                memory_bytes: sub.memory_bytes.unwrap_or(defaults.memory_bytes),
                cpu_ms_per_call: sub.cpu_ms_per_call.unwrap_or(defaults.cpu_ms_per_call),
            },
        })
    }
}

impl Platform for ClusterPlatform {
    fn compile(&self, model: &StreamModel, sub: &JobSubmission) -> Result<Compiled, ManagerError> {
        let stream = stream_graph(model, &RegistryCatalog(&self.plugins))
            .map_err(|d| compile_error(d, model, sub))?;
        let plan = partitioned_plan(&job_graph(&stream));
        let mut components = BTreeMap::new();
        for v in &plan.vertices {
            for op in &v.operators {
                let PluginRef::Named { name, version } = &op.plugin else {
                    return Err(ManagerError::Compile(format!(
                        "operator `{}` names its plugin by path",
                        op.name
                    )));
                };
                let p = self
                    .plugins
                    .get(name, version)
                    .map_err(|e| ManagerError::Compile(e.to_string()))?;
                components.insert(
                    op.operator_id.to_string(),
                    Component {
                        label: p.entry.reference(),
                        sha256: p.entry.sha256,
                        kind: p.entry.kind,
                        size: p.entry.size,
                    },
                );
            }
        }
        Ok(Compiled {
            plan: Arc::new(plan),
            components,
        })
    }

    fn migrate_state(
        &self,
        compiled: &Compiled,
        op: &str,
        state: &str,
        from: u32,
        entries: &[StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>, String> {
        let c = compiled
            .components
            .get(op)
            .ok_or_else(|| format!("the job has no operator `{op}`"))?;
        let file = self
            .plugins
            .blob_file(&c.sha256)
            .map_err(|e| e.to_string())?;
        let p = self
            .validator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .load(&c.label, &file, c.kind)
            .map_err(|e| e.to_string())?;
        let entries = entries
            .iter()
            .map(|e| (e.namespace.clone(), e.key.clone(), e.value.clone()))
            .collect();
        p.migrate_state(op, state, from, entries)
            .map_err(|e| e.to_string())
    }

    /// A `finalize-sink` is carried out by the submitter (`job submit` runs the old sink
    /// plugin between a check-only request and the restore); the seeding then drops the
    /// sink's pending committables.
    fn finalize_sinks(
        &self,
        _sp: &Savepoint,
        _actions: &Actions,
        _sub: &JobSubmission,
    ) -> Result<Vec<String>, ManagerError> {
        Ok(Vec::new())
    }

    fn claim_output(&self, sub: &JobSubmission) -> Result<(), ManagerError> {
        nop_stream_task::claim_output_dir(std::path::Path::new(&sub.output_dir))
            .map_err(ManagerError::Platform)
    }

    fn run(&self, run: JobRun) -> Result<JobReport, ManagerError> {
        let spec = self.spec(&run.submission, &run.compiled)?;
        self.hub.start_run(&spec.job);
        let plan = Arc::clone(&run.compiled.plan);
        let mut workers = ClusterWorkers::new(
            Arc::clone(&self.hub),
            Arc::clone(&plan),
            spec,
            run.live,
            run.cancel,
            self.timeouts,
        );
        let result =
            nop_stream_coordinator::run_job(&plan, &mut workers, run.namespace, &run.options);
        drop(workers);
        result.map_err(|e| ManagerError::Job {
            class: e.class,
            message: e.message,
        })
    }

    fn samples(&self, job: &str) -> Vec<nop_stream_metrics::Sample> {
        self.hub.job_samples(&JobId::new(job))
    }

    fn live_counts(&self, job: &str) -> LiveCounts {
        let c = self.hub.job_counters(&JobId::new(job));
        LiveCounts {
            records_read: c.records_read,
            records_written: c.records_written,
            refused_streams: c.refused_streams,
            refused_commands: c.refused_commands,
        }
    }
}
