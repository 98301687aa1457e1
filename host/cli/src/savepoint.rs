//! Savepoints (design §10.4–§10.6): a savepoint is a self-contained, relocatable directory
//! holding one epoch's manifest and exactly the segments it references, laid out as a
//! checkpoint namespace (`manifests/`, `segments/`) plus `savepoint.json`. Retention of
//! the job's checkpoints never touches it.
//!
//! - `promote` copies a durable checkpoint of a job (its latest, or `--epoch N`) into one.
//! - `check` compares a savepoint with a job (and named actions) and prints the report.
//! - `run --from-savepoint` runs the same check, refuses anything but compatible, seeds
//!   the job's checkpoint namespace from the savepoint (applying the actions to the
//!   manifest) and restores it, at any parallelism.

use anyhow::{Context, Result, bail};
use nop_stream_checkpoint::{CheckpointStorage, LocalStorage, SavepointInfo};
use nop_stream_coordinator::compat::{Action, Actions, Report};
use nop_stream_coordinator::migrate::StateEntry;
use nop_stream_core::PartitionedPlan;
use nop_stream_runtime::PluginSet;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Copies the manifest of `epoch` (default: the latest durable one) of the namespace in
/// `from` and every segment it references into the new savepoint directory `out`
/// ([`nop_stream_checkpoint::savepoint::export`]).
///
/// # Errors
/// No durable epoch, an unreadable manifest or segment, or `out` exists.
pub fn promote(from: &Path, epoch: Option<u64>, out: &Path) -> Result<SavepointInfo> {
    let src =
        LocalStorage::open(from).with_context(|| format!("checkpoints in {}", from.display()))?;
    let epoch = match epoch {
        Some(e) => nop_stream_api::EpochId(e),
        None => *src
            .manifest_epochs()?
            .last()
            .with_context(|| format!("{} holds no durable epoch", from.display()))?,
    };
    Ok(nop_stream_checkpoint::savepoint::export(
        &src,
        &from.display().to_string(),
        epoch,
        out,
    )?)
}

/// A savepoint directory, opened ([`nop_stream_coordinator::from_savepoint::Savepoint`]).
pub use nop_stream_coordinator::from_savepoint::Savepoint;

/// Opens and verifies the savepoint in `dir`.
///
/// # Errors
/// Not a savepoint, an unknown format, or a manifest that fails its checksum.
pub fn open(dir: &Path) -> Result<Savepoint> {
    nop_stream_coordinator::from_savepoint::open(dir).map_err(anyhow::Error::msg)
}

/// Prints why a restore from the savepoint `sp` was refused: the report, then what to do
/// (`run --from-savepoint` and `job submit --from-savepoint` alike).
pub fn print_refusal(report: &Report, sp: &str, job: &Path) {
    let text = report.to_text();
    eprint!("{text}");
    eprintln!(
        "error: savepoint {sp} is not compatible with {} as it stands; `nopstream savepoint \
         check` explains each finding and the actions that clear it{}",
        job.display(),
        if text.contains("NAMESPACE_ADVANCED") {
            "; to go back to the savepoint anyway, add --fresh (it discards the job's \
             checkpoints; the output directory keeps what was committed after the savepoint)"
        } else {
            ""
        }
    );
}

/// Reads an actions file (`[[action]]` tables, e.g. `kind = "drop-state"`).
///
/// # Errors
/// Unreadable or malformed, naming the file.
pub fn read_actions(path: Option<&Path>) -> Result<Actions> {
    let Some(path) = path else {
        return Ok(Actions::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read actions file {}", path.display()))?;
    let mut actions: Actions =
        toml::from_str(&text).with_context(|| format!("actions file {}", path.display()))?;
    // A finalize-sink's old job file is relative to the actions file.
    let base = crate::job_dir(path);
    for a in &mut actions.actions {
        if let Action::FinalizeSink { job, .. } = a
            && Path::new(job.as_str()).is_relative()
        {
            *job = base.join(job.as_str()).display().to_string();
        }
    }
    Ok(actions)
}

/// Carries out the `finalize-sink` actions among `actions` (design §10.6): for each, the
/// old job file's sink `operator` is opened with its plugin `with` (which must be the
/// component the savepoint records, same sha256) under each old subtask's index and
/// parallelism, commits (or recovers) the pending committables the savepoint holds for
/// it, and aborts that subtask's other pending transactions, exactly as a rescale settles
/// sinks. Grants resolve as for `run` (`$OUTPUT` is `output`). Running it twice is safe:
/// a committable already committed is reported committed by the sink's `recover`. The
/// restore then drops those committables ([`nop_stream_coordinator::migrate::apply`]).
///
/// # Errors
/// The old job file cannot be read or planned; it has no sink `operator`, or its plugin is
/// not `with`; the component differs from the savepoint's; the sink fails or a commit
/// outcome is unknown. Nothing is restored then.
pub fn finalize_sinks(
    sp: &Savepoint,
    actions: &Actions,
    registry: &nop_stream_runtime::registry::PluginRegistry<'_>,
    output: &Path,
    work_dir: &Path,
) -> Result<()> {
    use nop_stream_core::{job_graph, partitioned_plan, stream_graph};
    for a in &actions.actions {
        let Action::FinalizeSink {
            operator,
            with,
            job,
        } = a
        else {
            continue;
        };
        let what = format!("finalize-sink {operator} with {with}");
        let job = Path::new(job);
        let model = crate::read_model(job, None).with_context(|| format!("{what}: the old job"))?;
        let old_registry = registry.with_job_dir(crate::job_dir(job));
        let stream = stream_graph(&model, &old_registry)
            .map_err(|d| anyhow::anyhow!("{what}: the old job {}: {d}", job.display()))?;
        let plan = partitioned_plan(&job_graph(&stream));
        let Some((vertex, op)) = plan.vertices.iter().enumerate().find_map(|(i, v)| {
            v.operators
                .last()
                .filter(|o| {
                    o.kind == nop_stream_api::PluginKind::Sink && o.operator_id.as_str() == operator
                })
                .map(|o| (i, o))
        }) else {
            bail!(
                "{what}: the old job {} has no sink `{operator}`",
                job.display()
            );
        };
        anyhow::ensure!(
            op.plugin.to_string() == *with,
            "{what}: sink `{operator}` of the old job {} uses plugin {}, not {with}",
            job.display(),
            op.plugin
        );
        let plugin = old_registry
            .load(&op.plugin, op.kind)
            .with_context(|| format!("{what}: loading the old plugin"))?;
        let recorded = sp.manifest.meta.as_ref().and_then(|m| {
            m.operators
                .iter()
                .find(|o| o.operator_id == *operator)
                .map(|o| (o.component_sha256.clone(), o.parallelism))
        });
        let Some((sha, parallelism)) = recorded else {
            bail!(
                "{what}: savepoint {} records no operator `{operator}`",
                sp.dir.display()
            );
        };
        anyhow::ensure!(
            sha.is_empty() || sha == plugin.sha256,
            "{what}: the component found for {with} has sha256 {}, but the savepoint's sink \
             was written by {sha}; give the plugin directory (--plugins) that holds the old \
             component",
            plugin.sha256
        );
        let settlements: Vec<nop_stream_proto::SinkSettlement> = sp
            .manifest
            .tasks
            .iter()
            .filter(|t| t.sink_operator.as_deref() == Some(operator.as_str()))
            .map(|t| nop_stream_proto::SinkSettlement {
                vertex: vertex as u32,
                subtask: t.task.subtask.0,
                parallelism,
                commit: t.pending_transactions.clone(),
            })
            .collect();
        let pending: usize = settlements.iter().map(|s| s.commit.len()).sum();
        let plugins: PluginSet = [(op.operator_id.clone(), plugin)].into_iter().collect();
        let opts = nop_stream_runtime::RunOptions::new(
            crate::job_dir(job),
            output.to_owned(),
            work_dir.to_owned(),
        );
        let storage: std::sync::Arc<dyn CheckpointStorage> =
            std::sync::Arc::new(LocalStorage::open(&sp.dir)?);
        let host = nop_stream_runtime::TaskHost::new(
            &plan,
            &plugins,
            &opts,
            storage,
            std::sync::Arc::new(nop_stream_runtime::JobProgress::default()),
        );
        host.settle_sinks(&settlements, sp.manifest.attempt)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        eprintln!(
            "{what}: committed {pending} pending transaction(s) of {} subtask(s)",
            settlements.len()
        );
    }
    Ok(())
}

/// The report of checking `sp` against a job (`model`, its plugins found by `registry`)
/// some of whose components were built for a `nop:stream` WIT version this host does not
/// serve ([`nop_stream_coordinator::compat::unserved_components_report`]: one
/// `WIT_NOT_SERVED` finding each, verdict incompatible); `None` when there is none, or
/// the savepoint records no compatibility metadata (the full check reports that).
pub fn unserved_report(
    sp: &Savepoint,
    model: &nop_stream_core::StreamModel,
    registry: &nop_stream_runtime::registry::PluginRegistry<'_>,
) -> Option<Report> {
    let old = sp.manifest.meta.as_ref()?;
    let unserved: Vec<_> = model
        .nodes
        .iter()
        .filter_map(|node| match registry.load(&node.plugin, node.kind) {
            Err(nop_stream_runtime::RuntimeError::UnservedWit {
                built_for, served, ..
            }) => Some(nop_stream_coordinator::compat::UnservedComponent {
                operator_id: nop_stream_core::operator_id(node).to_string(),
                plugin: node.plugin.to_string(),
                built_for,
                served: served.to_owned(),
            }),
            _ => None,
        })
        .collect();
    (!unserved.is_empty())
        .then(|| nop_stream_coordinator::compat::unserved_components_report(old, &unserved))
}

/// Checks `sp` against `plan` (with its components) and `actions`; `namespace` is the
/// job's own checkpoint namespace, to see whether it has advanced past the savepoint
/// ([`nop_stream_coordinator::from_savepoint::check_against`], which the cluster's
/// coordinator runs too).
///
/// # Errors
/// A savepoint without compatibility metadata, or actions that clear nothing or are not
/// supported.
pub fn check_against(
    sp: &Savepoint,
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    namespace: &Path,
    actions: &Actions,
) -> Result<Report> {
    nop_stream_coordinator::from_savepoint::check_against(
        sp,
        plan,
        &components(plugins),
        Some(namespace),
        actions,
    )
    .map_err(anyhow::Error::msg)
}

/// Seeds the checkpoint namespace `namespace` (emptied first) with the savepoint's epoch,
/// the actions applied for `plan` ([`nop_stream_coordinator::from_savepoint::seed_namespace`];
/// `migrate-state` runs the new components' `state-migration` exports). Returns the plan
/// fingerprint the manifest carries, which the restore accepts as an explicit action.
///
/// # Errors
/// A segment that cannot be read or fails its checksum; a failed migration; I/O failures.
pub fn seed_namespace(
    sp: &Savepoint,
    namespace: &Path,
    actions: &Actions,
    plan: &PartitionedPlan,
    plugins: &PluginSet,
) -> Result<String> {
    nop_stream_coordinator::from_savepoint::seed_namespace(
        sp,
        namespace,
        actions,
        plan,
        &components(plugins),
        &mut |op: &str, state: &str, from: u32, entries: &[StateEntry]| {
            migrate_state(plugins, op, state, from, entries)
        },
    )
    .map_err(anyhow::Error::msg)
}

/// A `migrate-state` call for `plugins`: the operator's component's `migrate` export.
fn migrate_state(
    plugins: &PluginSet,
    op: &str,
    state: &str,
    from: u32,
    entries: &[StateEntry],
) -> Result<Vec<Option<Vec<u8>>>, String> {
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

/// The savepoint's manifest with `actions` applied for `plan`, and the segment files that
/// wrote; `migrate-state` runs the new components' `state-migration` exports.
fn apply_actions(
    sp: &Savepoint,
    actions: &Actions,
    plan: &PartitionedPlan,
    plugins: &PluginSet,
) -> Result<nop_stream_coordinator::migrate::Migrated> {
    nop_stream_coordinator::from_savepoint::apply_actions(
        sp,
        actions,
        plan,
        &components(plugins),
        &mut |op: &str, state: &str, from: u32, entries: &[StateEntry]| {
            migrate_state(plugins, op, state, from, entries)
        },
    )
    .map_err(anyhow::Error::msg)
}

fn components(plugins: &PluginSet) -> BTreeMap<String, String> {
    plugins
        .iter()
        .map(|(id, p)| (id.to_string(), p.sha256.clone()))
        .collect()
}

/// Writes the savepoint `out`: `sp` migrated for `plan` by `actions` (design §10.6). The
/// caller has checked that the report is compatible with the actions. The new savepoint
/// records `sp` as its parent, the actions, and the new job's compatibility metadata, so
/// checking `plan` against it needs no action; `sp` is never written to.
///
/// # Errors
/// `out` exists; a segment cannot be read or fails its checksum; a failed migration; I/O
/// failures.
pub fn migrate(
    sp: &Savepoint,
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    actions: &Actions,
    out: &Path,
) -> Result<SavepointInfo> {
    let migrated = apply_actions(sp, actions, plan, plugins)?;
    let src = LocalStorage::open(&sp.dir)?;
    Ok(nop_stream_checkpoint::savepoint::write_migrated(
        &src,
        &migrated.manifest,
        &migrated.new_files,
        &sp.dir,
        actions.actions.iter().map(Action::describe).collect(),
        out,
    )?)
}

/// The savepoints under `dir` (each a directory with `savepoint.json`), by epoch.
pub fn list(dir: &Path) -> Vec<(PathBuf, SavepointInfo)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(bytes) = std::fs::read(p.join("savepoint.json"))
                && let Ok(info) = serde_json::from_slice::<SavepointInfo>(&bytes)
            {
                out.push((p, info));
            }
        }
    }
    out.sort_by_key(|(p, i)| (i.epoch, p.clone()));
    out
}

/// The control socket of a running embedded job: `<work_dir>/control.sock`.
pub fn control_socket(work_dir: &Path) -> PathBuf {
    work_dir.join("control.sock")
}

/// A request on the control socket (one JSON line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ControlRequest {
    /// Take a savepoint into this directory (`None`: `<work_dir>/savepoints/epoch-N`).
    pub savepoint: Option<PathBuf>,
    /// Stop the job once the savepoint is taken and committed; the answer comes when it
    /// has stopped.
    #[serde(default)]
    pub stop: bool,
}

/// The answer (one JSON line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum ControlResponse {
    /// The savepoint taken.
    Savepoint(SavepointInfo),
    /// Why none was.
    Error(String),
}

/// The control socket's server thread, and the requests it is answering.
pub struct ControlServer {
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ControlServer {
    /// Waits (up to `timeout`) until every request taken so far has its answer written:
    /// a stop's answer is sent as the job ends, and must reach the client before the
    /// process exits.
    pub fn drain(&self, timeout: std::time::Duration) {
        let started = std::time::Instant::now();
        while self.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0
            && started.elapsed() < timeout
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Serves the control socket of a running job until the process ends: each connection
/// sends one [`ControlRequest`] and gets one [`ControlResponse`]. Requests go to the
/// coordinator through `requests`.
///
/// # Errors
/// The socket cannot be bound.
#[cfg(unix)]
pub fn serve_control(
    path: &Path,
    requests: std::sync::mpsc::Sender<nop_stream_coordinator::SavepointRequest>,
) -> Result<ControlServer> {
    use std::io::{BufRead, BufReader, Write};
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("cannot bind the control socket {}", path.display()))?;
    let in_flight = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&in_flight);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            use std::sync::atomic::Ordering::SeqCst;
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut line = String::new();
                if BufReader::new(&conn).read_line(&mut line).is_err() {
                    continue;
                }
                counter.fetch_add(1, SeqCst);
                let resp = match serde_json::from_str::<ControlRequest>(&line) {
                    Ok(req) => {
                        let (tx, rx) = std::sync::mpsc::channel();
                        let sent = requests.send(nop_stream_coordinator::SavepointRequest {
                            out: req.savepoint,
                            stop: req.stop,
                            reply: tx,
                        });
                        match sent.map(|()| rx.recv()) {
                            Ok(Ok(Ok(info))) => ControlResponse::Savepoint(info),
                            Ok(Ok(Err(e))) => ControlResponse::Error(e),
                            _ => ControlResponse::Error("the job is ending".into()),
                        }
                    }
                    Err(e) => ControlResponse::Error(format!("bad request: {e}")),
                };
                let _ = serde_json::to_writer(&mut conn, &resp);
                let _ = conn.write_all(b"\n");
                let _ = conn.flush();
                counter.fetch_sub(1, SeqCst);
            }
        })?;
    Ok(ControlServer { in_flight })
}

/// Asks the job running with `work_dir` for a savepoint; with `stop`, the job then stops
/// (design §10.4) and the call returns once it has.
///
/// # Errors
/// No job runs there, or it could not take one (or, with `stop`, did not stop).
#[cfg(unix)]
pub fn take(work_dir: &Path, out: Option<PathBuf>, stop: bool) -> Result<SavepointInfo> {
    use std::io::{BufRead, BufReader, Write};
    let path = control_socket(work_dir);
    let mut conn = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "no job is running with work directory {} (no control socket at {})",
            work_dir.display(),
            path.display()
        )
    })?;
    serde_json::to_writer(
        &mut conn,
        &ControlRequest {
            savepoint: out,
            stop,
        },
    )?;
    conn.write_all(b"\n")?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    match serde_json::from_str::<ControlResponse>(&line)
        .with_context(|| format!("bad answer from the job: {line:?}"))?
    {
        ControlResponse::Savepoint(i) => Ok(i),
        ControlResponse::Error(e) => bail!("the job took no savepoint: {e}"),
    }
}
