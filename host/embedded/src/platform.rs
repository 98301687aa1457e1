//! The embedded [`Platform`] (design §2): jobs compile against the plugins on a search path
//! (and the job's directory), and run on [`InProcessWorkers`] in this process. With it, a
//! [`nop_stream_coordinator::manager::JobManager`] is `nopstream run`.

use crate::workers::InProcessWorkers;
use nop_stream_coordinator::JobReport;
use nop_stream_coordinator::compat::{Action, Actions};
use nop_stream_coordinator::from_savepoint::Savepoint;
use nop_stream_coordinator::manager::{
    Compiled, Component, JobRun, LiveCounts, ManagerError, Platform, compile_error,
};
use nop_stream_coordinator::migrate::StateEntry;
use nop_stream_core::{StreamModel, job_graph, partitioned_plan, stream_graph};
use nop_stream_plugin_host::{PluginHost, PluginRegistry, PluginSet};
use nop_stream_proto::TaskError;
use nop_stream_proto::cli::JobSubmission;
use nop_stream_task::{JobProgress, RunOptions, TaskHost};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Jobs of one embedded run.
pub struct EmbeddedPlatform {
    host: PluginHost,
    search: Vec<PathBuf>,
    /// Directories, limits and scheduling of the run (its checkpoint and savepoint roots
    /// and the restore settings come from the manager).
    template: RunOptions,
    progress: Arc<JobProgress>,
}

impl std::fmt::Debug for EmbeddedPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedPlatform")
            .field("search", &self.search)
            .field("work_dir", &self.template.work_dir)
            .finish_non_exhaustive()
    }
}

/// A failure and its causes, as one line (`a: b: c`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl EmbeddedPlatform {
    /// Jobs compiled against `search` (then the job's directory) with `host`'s engine,
    /// run with the directories and limits of `template`, counted in `progress`.
    pub fn new(
        host: PluginHost,
        search: Vec<PathBuf>,
        template: RunOptions,
        progress: Arc<JobProgress>,
    ) -> Self {
        EmbeddedPlatform {
            host,
            search,
            template,
            progress,
        }
    }

    /// The run's live counters.
    pub fn progress(&self) -> &Arc<JobProgress> {
        &self.progress
    }

    fn registry(&self) -> PluginRegistry<'_> {
        PluginRegistry::new(
            &self.host,
            self.search.clone(),
            self.template.job_dir.clone(),
        )
    }

    fn plugins(&self, compiled: &Compiled) -> Result<PluginSet, ManagerError> {
        self.registry()
            .plugin_set(&compiled.plan)
            .map_err(|e| ManagerError::Compile(error_chain(&e)))
    }

    /// Carries out one `finalize-sink` action (design §10.6): the old job file's sink
    /// `operator` is opened with its plugin `with` (which must be the component the
    /// savepoint records, same sha256) under each old subtask's index and parallelism,
    /// commits (or recovers) the pending committables the savepoint holds for it, and
    /// aborts that subtask's other pending transactions, exactly as a rescale settles
    /// sinks. Grants resolve as for the run (`$OUTPUT` is its output directory). Running it
    /// twice is safe: a committable already committed is reported committed by the sink's
    /// `recover`.
    fn finalize_sink(
        &self,
        sp: &Savepoint,
        operator: &str,
        with: &str,
        job: &Path,
    ) -> Result<String, String> {
        let what = format!("finalize-sink {operator} with {with}");
        let text = std::fs::read_to_string(job).map_err(|e| {
            format!(
                "{what}: cannot read the old job file {}: {e}",
                job.display()
            )
        })?;
        let model = nop_stream_core::parse_job_file(&job.display().to_string(), &text)
            .map_err(|d| format!("{what}: the old job: {d}"))?;
        let job_dir = job
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        let old_registry = self.registry().with_job_dir(job_dir.clone());
        let stream = stream_graph(&model, &old_registry)
            .map_err(|d| format!("{what}: the old job {}: {d}", job.display()))?;
        let plan = partitioned_plan(&job_graph(&stream));
        let Some((vertex, op)) = plan.vertices.iter().enumerate().find_map(|(i, v)| {
            v.operators
                .last()
                .filter(|o| {
                    o.kind == nop_stream_api::PluginKind::Sink && o.operator_id.as_str() == operator
                })
                .map(|o| (i, o))
        }) else {
            return Err(format!(
                "{what}: the old job {} has no sink `{operator}`",
                job.display()
            ));
        };
        if op.plugin.to_string() != with {
            return Err(format!(
                "{what}: sink `{operator}` of the old job {} uses plugin {}, not {with}",
                job.display(),
                op.plugin
            ));
        }
        let plugin = old_registry
            .load(&op.plugin, op.kind)
            .map_err(|e| format!("{what}: loading the old plugin: {e}"))?;
        let recorded = sp.manifest.meta.as_ref().and_then(|m| {
            m.operators
                .iter()
                .find(|o| o.operator_id == operator)
                .map(|o| (o.component_sha256.clone(), o.parallelism))
        });
        let Some((sha, parallelism)) = recorded else {
            return Err(format!(
                "{what}: savepoint {} records no operator `{operator}`",
                sp.location
            ));
        };
        if !sha.is_empty() && sha != plugin.sha256 {
            return Err(format!(
                "{what}: the component found for {with} has sha256 {}, but the savepoint's \
                 sink was written by {sha}; give the plugin directory (--plugins) that holds \
                 the old component",
                plugin.sha256
            ));
        }
        let settlements: Vec<nop_stream_proto::SinkSettlement> = sp
            .manifest
            .tasks
            .iter()
            .filter(|t| t.sink_operator.as_deref() == Some(operator))
            .map(|t| nop_stream_proto::SinkSettlement {
                vertex: vertex as u32,
                subtask: t.task.subtask.0,
                parallelism,
                commit: t.pending_transactions.clone(),
            })
            .collect();
        let pending: usize = settlements.iter().map(|s| s.commit.len()).sum();
        let plugins: PluginSet = [(op.operator_id.clone(), plugin)].into_iter().collect();
        let mut opts = self.template.clone();
        opts.job_dir = job_dir;
        let host = TaskHost::new(
            &plan,
            &plugins,
            &opts,
            Arc::clone(&sp.ns),
            Arc::new(JobProgress::default()),
        );
        host.settle_sinks(&settlements, sp.manifest.attempt)
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(format!(
            "{what}: committed {pending} pending transaction(s) of {} subtask(s)",
            settlements.len()
        ))
    }

    /// Carries out the `finalize-sink` actions among `actions` ([`Self::finalize_sink`]);
    /// a line per action.
    ///
    /// # Errors
    /// The first failure, naming the action.
    pub fn finalize(&self, sp: &Savepoint, actions: &Actions) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        for a in &actions.actions {
            if let Action::FinalizeSink {
                operator,
                with,
                job,
            } = a
            {
                done.push(self.finalize_sink(sp, operator, with, Path::new(job))?);
            }
        }
        Ok(done)
    }
}

impl Platform for EmbeddedPlatform {
    fn compile(&self, model: &StreamModel, sub: &JobSubmission) -> Result<Compiled, ManagerError> {
        let registry = self.registry();
        let stream = stream_graph(model, &registry).map_err(|d| compile_error(d, model, sub))?;
        let plan = partitioned_plan(&job_graph(&stream));
        let plugins = registry
            .plugin_set(&plan)
            .map_err(|e| ManagerError::Compile(error_chain(&e)))?;
        let components = plugins
            .iter()
            .map(|(id, p)| {
                (
                    id.to_string(),
                    Component {
                        sha256: p.sha256.clone(),
                        label: p.info.reference(),
                        kind: p.info.kind,
                        size: std::fs::metadata(&p.path).map_or(0, |m| m.len()),
                    },
                )
            })
            .collect();
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
        let plugins = self.plugins(compiled).map_err(|e| e.to_string())?;
        let plugin = plugins
            .iter()
            .find(|(id, _)| id.as_str() == op)
            .map(|(_, p)| p)
            .ok_or_else(|| format!("the job has no operator `{op}`"))?;
        let entries = entries
            .iter()
            .map(|e| (e.namespace.clone(), e.key.clone(), e.value.clone()))
            .collect();
        plugin
            .migrate_state(op, state, from, entries)
            .map_err(|e| e.to_string())
    }

    fn finalize_sinks(
        &self,
        sp: &Savepoint,
        actions: &Actions,
        _sub: &JobSubmission,
    ) -> Result<Vec<String>, ManagerError> {
        self.finalize(sp, actions).map_err(ManagerError::Platform)
    }

    fn claim_output(&self, _sub: &JobSubmission) -> Result<(), ManagerError> {
        nop_stream_task::claim_output_dir(&self.template.output_dir).map_err(ManagerError::Platform)
    }

    fn run(&self, run: JobRun) -> Result<JobReport, ManagerError> {
        let plugins = self.plugins(&run.compiled)?;
        let opts = self.template.clone();
        let plan = &run.compiled.plan;
        let mut workers = InProcessWorkers::new(
            plan,
            &plugins,
            &opts,
            Arc::clone(&run.namespace),
            Arc::clone(&self.progress),
        );
        nop_stream_coordinator::run_job(plan, &mut workers, run.namespace, &run.options).map_err(
            |e: crate::WorkerError| ManagerError::Job {
                class: e.class(),
                message: error_chain(&e.0),
            },
        )
    }

    fn live_counts(&self, _job: &str) -> LiveCounts {
        LiveCounts {
            records_read: self.progress.records_read(),
            records_written: self.progress.records_written(),
            ..LiveCounts::default()
        }
    }

    fn samples(&self, job: &str) -> Vec<nop_stream_metrics::Sample> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.progress.metrics().samples(job, now_ms)
    }
}
