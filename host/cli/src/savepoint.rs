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
use nop_stream_checkpoint::{Location, Namespace, SavepointInfo};
use nop_stream_coordinator::compat::{Action, Actions, Report};
use nop_stream_coordinator::migrate::StateEntry;
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::cli::{CliResponse, JobControl};
use nop_stream_runtime::PluginSet;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Copies the manifest of `epoch` (default: the latest durable one) of the namespace
/// `from` and every segment it references into a new savepoint at `out`
/// ([`nop_stream_checkpoint::savepoint::export`]).
///
/// # Errors
/// No durable epoch, an unreadable manifest or segment, or `out` holds a savepoint.
pub fn promote(from: &Namespace, epoch: Option<u64>, out: &Location) -> Result<SavepointInfo> {
    let epoch = match epoch {
        Some(e) => nop_stream_api::EpochId(e),
        None => *from
            .manifest_epochs()?
            .last()
            .with_context(|| format!("{} holds no durable epoch", from.describe()))?,
    };
    let store = out.open()?;
    Ok(nop_stream_checkpoint::savepoint::export(
        from,
        &from.describe(),
        epoch,
        &store,
    )?)
}

/// The location a savepoint argument names: a URL, or a path.
///
/// # Errors
/// A URL that does not parse (its message never repeats a credential).
pub fn location_arg(arg: &Path) -> Result<Location> {
    Ok(Location::parse(&arg.display().to_string())?)
}

/// A savepoint directory, opened ([`nop_stream_coordinator::from_savepoint::Savepoint`]).
pub use nop_stream_coordinator::from_savepoint::Savepoint;

/// Opens the savepoint at `location`.
///
/// # Errors
/// Not a savepoint, an unknown format, or a manifest that fails its checksum.
pub fn open(location: &Location) -> Result<Savepoint> {
    nop_stream_coordinator::from_savepoint::open(location).map_err(anyhow::Error::msg)
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
/// ([`nop_stream_coordinator::from_savepoint::check_against`], which the job manager runs
/// on every restore too).
///
/// # Errors
/// A savepoint without compatibility metadata, or actions that clear nothing or are not
/// supported.
pub fn check_against(
    sp: &Savepoint,
    plan: &PartitionedPlan,
    plugins: &PluginSet,
    namespace: &Namespace,
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
    out: &Location,
) -> Result<SavepointInfo> {
    let migrated = apply_actions(sp, actions, plan, plugins)?;
    Ok(nop_stream_checkpoint::savepoint::write_migrated(
        &sp.ns,
        &migrated.manifest,
        &migrated.new_files,
        &sp.location.to_string(),
        actions.actions.iter().map(Action::describe).collect(),
        &out.open()?,
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
/// sends one [`JobControl`] as a JSON line and gets one [`CliResponse`] back, answered by
/// the job manager as a coordinator answers the same request over QUIC.
///
/// # Errors
/// The socket cannot be bound.
#[cfg(unix)]
pub fn serve_control<P: nop_stream_coordinator::manager::Platform>(
    path: &Path,
    manager: std::sync::Arc<nop_stream_coordinator::manager::JobManager<P>>,
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
                let resp = match serde_json::from_str::<JobControl>(&line) {
                    Ok(req) => manager
                        .control(req)
                        .unwrap_or_else(|e| CliResponse::Error(e.to_string())),
                    Err(e) => CliResponse::Error(format!("bad request: {e}")),
                };
                let _ = serde_json::to_writer(&mut conn, &resp);
                let _ = conn.write_all(b"\n");
                let _ = conn.flush();
                counter.fetch_sub(1, SeqCst);
            }
        })?;
    Ok(ControlServer { in_flight })
}

/// Sends `request` to the job running with `work_dir`, and returns its answer.
///
/// # Errors
/// No job runs there; the answer does not decode.
#[cfg(unix)]
pub fn control(work_dir: &Path, request: &JobControl) -> Result<CliResponse> {
    use std::io::{BufRead, BufReader, Write};
    let path = control_socket(work_dir);
    let mut conn = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "no job is running with work directory {} (no control socket at {})",
            work_dir.display(),
            path.display()
        )
    })?;
    serde_json::to_writer(&mut conn, request)?;
    conn.write_all(b"\n")?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    serde_json::from_str::<CliResponse>(&line)
        .with_context(|| format!("bad answer from the job: {line:?}"))
}

/// Asks job `job` running with `work_dir` for a savepoint; with `stop`, the job then stops
/// (design §10.4) and the call returns once it has.
///
/// # Errors
/// No job runs there, or it could not take one (or, with `stop`, did not stop).
#[cfg(unix)]
pub fn take(work_dir: &Path, job: &str, out: Option<PathBuf>, stop: bool) -> Result<SavepointInfo> {
    // The job's process resolves a relative name in its savepoint root: a path given here
    // is the caller's, so it goes absolute (a URL stays as it is).
    let out = match out {
        Some(p) if !p.display().to_string().contains("://") => {
            Some(std::path::absolute(&p)?.display().to_string())
        }
        o => o.map(|p| p.display().to_string()),
    };
    let request = JobControl::TakeSavepoint {
        job: job.to_owned(),
        out,
        stop,
    };
    match control(work_dir, &request)? {
        CliResponse::Savepoint { info_json } => {
            Ok(serde_json::from_str(&info_json).context("the job's savepoint")?)
        }
        CliResponse::Error(e) => bail!("the job took no savepoint: {e}"),
        other => bail!("unexpected answer from the job: {other:?}"),
    }
}
