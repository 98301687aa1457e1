//! `nopstream run`: the embedded shell (design §2). It turns its arguments into a job
//! submission and runs it through the job manager of `nop-stream-coordinator` on the
//! embedded platform (in-process workers, plugins from the search path), with a local job
//! store in the work directory; it serves the job's control socket and prints progress,
//! what the submission did, and the summary. No job lifecycle lives here.

use anyhow::{Context, Result};
use nop_stream_checkpoint::Location;
use nop_stream_coordinator::jobs::ObjectJobStore;
use nop_stream_coordinator::manager::{JobManager, ManagerOptions, Note, RunIn, Submitted};
use nop_stream_embedded::EmbeddedPlatform;
use nop_stream_plugin_host::Limits;
use nop_stream_proto::cli::JobSubmission;
use nop_stream_task::{JobProgress, RunOptions, plugin_host};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The arguments of `nopstream run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Job file (TOML).
    pub job: PathBuf,
    /// The job's parallelism (`job.parallelism`): every node runs at N except one whose
    /// job-file entry sets its own `parallelism`, which keeps it (as Flink's `-p`).
    #[arg(long, short = 'p', value_parser = crate::parallelism_arg)]
    pub parallelism: Option<u32>,
    /// Output directory granted to sinks as `$OUTPUT` [default: nopstream-out/JOB_ID/output].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Working directory for state [default: nopstream-out/JOB_ID/work].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Where checkpoints live: a directory, `file:///dir`, or an S3-compatible object
    /// store `s3://bucket/prefix[?endpoint=URL&region=R]` (credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY only) [default: WORK_DIR/checkpoints].
    #[arg(long, value_name = "LOCATION")]
    pub checkpoints: Option<String>,
    /// Memory limit per plugin instance, in MiB [default: 256].
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// CPU time limit per call into a plugin, in milliseconds [default: 10000].
    #[arg(long)]
    pub cpu_ms_per_call: Option<u64>,
    /// Print the run report as JSON instead of the summary; a failed run prints
    /// `{"status": "failed", "error": "…"}` (and the error on stderr, exit 1).
    #[arg(long)]
    pub json: bool,
    /// Do not show the progress display.
    #[arg(long)]
    pub no_progress: bool,
    /// Do not echo the committed output at the end.
    #[arg(long)]
    pub no_echo: bool,
    /// Start from scratch: delete the job's checkpoints and output instead of resuming
    /// from the latest durable epoch.
    #[arg(long)]
    pub fresh: bool,
    /// Global recoveries allowed after task failures within any 60 s (a failure-rate
    /// budget; the pause before each doubles from 100 ms to 5 s) [default: 10 with
    /// periodic checkpoints, else 0].
    #[arg(long)]
    pub max_restarts: Option<u32>,
    /// Explicit rescale action (design §10.5): restore the latest durable epoch, taken
    /// by this same job at another parallelism, into the plan at the parallelism
    /// given with -p (or the job file's). Keyed state, timers and watermarks move
    /// with their state shards; the shard count stays. Without it a changed plan is
    /// refused.
    #[arg(long)]
    pub rescale: bool,
    /// Take an epoch checkpoint every this many ms, overriding the job file's
    /// `job.checkpoint_interval_ms` (part of the plan fingerprint).
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Restore from a savepoint (`nopstream savepoint promote`; a directory or a location
    /// URL): every segment it references is verified and the savepoint check runs first,
    /// and anything but compatible is refused with nothing touched; then the savepoint's
    /// epoch is published into the job's checkpoint namespace beside its own epochs, and
    /// the job resumes from it, at any parallelism.
    /// With --fresh, the job's checkpoints are discarded first, so a namespace that
    /// went on past the savepoint can go back to it.
    #[arg(long, value_name = "SP", conflicts_with_all = ["rescale"])]
    pub from_savepoint: Option<PathBuf>,
    /// A Delta overlay patching the job file's model (docs/jobs.md, "Delta overlays"): each
    /// changed field is printed with its class (replan, rescale, state-affecting;
    /// forbidden ones are refused). When the job has a durable checkpoint, its latest
    /// epoch is promoted to a savepoint (`WORK_DIR/savepoints/epoch-N`) and the patched
    /// job restores from it through the compatibility check, which needs the actions
    /// (--actions) that clear its findings.
    #[arg(long, value_name = "D.toml", conflicts_with_all = ["rescale", "from_savepoint"])]
    pub delta: Option<PathBuf>,
    /// With --from-savepoint or --delta: the actions file that clears the check's
    /// findings.
    #[arg(long, value_name = "A.toml")]
    pub actions: Option<PathBuf>,
    /// How the kernel schedules task threads: `batch` (SCHED_BATCH on Linux: a woken
    /// task does not preempt a running one, fewer context switches when task threads
    /// outnumber cores) or `normal` (the default policy, lowest hand-over latency).
    #[arg(long, default_value = "batch", value_name = "batch|normal")]
    pub task_scheduling: nop_stream_task::TaskScheduling,
    /// Serve /metrics and the JSON API (/api/v1/) over HTTP on this address while the job
    /// runs (a bare port binds 127.0.0.1; port 0 picks one; there is no authentication).
    /// The address is printed and written to WORK_DIR/http.addr.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
}

/// The directories of a run, as the start note names them.
fn dirs_of(
    note: &Note,
    output: &std::path::Path,
    work_dir: &std::path::Path,
) -> Option<crate::output::RunDirs> {
    match note {
        Note::Starting {
            namespace,
            checkpoints,
            ..
        } => Some(crate::output::RunDirs {
            output: output.to_owned(),
            work_dir: work_dir.to_owned(),
            namespace: namespace.clone(),
            checkpoints: checkpoints.clone(),
        }),
        _ => None,
    }
}

/// Prints what a submission did, as the embedded run always has (stderr).
fn print_note(note: &Note) {
    match note {
        Note::DeltaChange { file, change } => eprintln!("delta {file}: {change}"),
        Note::DeltaUnchanged { file } => eprintln!("delta {file}: no change"),
        Note::DeltaSavepoint { epoch, savepoint } => eprintln!(
            "delta: the job's latest durable epoch {epoch} is now savepoint {savepoint}; the \
             patched job restores from it"
        ),
        Note::Forking { lineage } => eprintln!("forking into pipeline lineage `{lineage}`"),
        Note::Finalized(line) => eprintln!("{line}"),
        Note::RestoringSavepoint {
            savepoint,
            epoch,
            into,
        } => eprintln!("restoring savepoint {savepoint} (epoch {epoch}) into {into}"),
        Note::Rescaling { epoch, parallelism } => {
            eprintln!("rescale: restoring epoch {epoch} into parallelism {parallelism}")
        }
        Note::Resuming { checkpoints } => {
            eprintln!("checkpoints found in {checkpoints}: resuming (use --fresh to start over)")
        }
        Note::Starting { .. } => {}
    }
}

/// `nopstream run`.
///
/// # Errors
/// Bad arguments, job file, plugins or savepoint; the job's failure.
/// The lock file in a work directory, held by the `nopstream run` using it.
pub const WORK_DIR_LOCK: &str = "run.lock";

/// How long a run waits for the lock of its work directory before it is refused.
const WORK_DIR_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Takes the exclusive lock of `work_dir` (an OS file lock on [`WORK_DIR_LOCK`], released
/// when the returned file is dropped or the process dies) and writes this process's id
/// into it. Two runs on one work directory would fence each other's attempts and race
/// for its checkpoints, so the second is refused, after waiting up to
/// [`WORK_DIR_LOCK_WAIT`] for the first to end.
///
/// # Errors
/// The directory cannot be created or the lock file opened, or another process holds the
/// lock (the message names the directory and that process's id).
fn lock_work_dir(work_dir: &Path, job: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("cannot create work directory {}", work_dir.display()))?;
    let path = work_dir.join(WORK_DIR_LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match try_lock_waiting(&file) {
        Ok(true) => {}
        Ok(false) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            anyhow::bail!(
                "work directory {} is in use by another `nopstream run`{holder}: wait for \
                 it to end, stop it (`nopstream stop {} --savepoint --work-dir {}`), or give \
                 this run another --work-dir",
                work_dir.display(),
                job.display(),
                work_dir.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

/// Takes `file`'s exclusive OS lock, waiting up to [`WORK_DIR_LOCK_WAIT`] while another
/// process holds it (a run that was just stopped releases its locks as its job ends, a
/// moment after `nopstream stop` returns). `Ok(false)`: it is still held.
fn try_lock_waiting(file: &std::fs::File) -> std::io::Result<bool> {
    let deadline = std::time::Instant::now() + WORK_DIR_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Takes the exclusive lock of output directory `output` (an OS lock on the directory
/// itself, so nothing is written into it; released when the returned handle is dropped or
/// the process dies), creating it if missing. Two runs writing into one output directory
/// through different work directories would each commit their transactions there, and
/// the directory would hold their records twice; the second is refused, after waiting as
/// [`lock_work_dir`] does.
///
/// # Errors
/// The directory cannot be created or opened, or another process holds its lock (the
/// message names the directory).
fn lock_output_dir(output: &Path, job: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(output)
        .with_context(|| format!("cannot create output directory {}", output.display()))?;
    let dir = std::fs::File::open(output)
        .with_context(|| format!("cannot open output directory {}", output.display()))?;
    match try_lock_waiting(&dir) {
        Ok(true) => Ok(dir),
        Ok(false) => anyhow::bail!(
            "output directory {} is in use by another `nopstream run` of a work directory \
             of its own: wait for it to end, stop it (`nopstream stop {} --savepoint \
             --work-dir ITS_WORK_DIR`), or give this run another --output",
            output.display(),
            job.display()
        ),
        Err(e) => {
            Err(e).with_context(|| format!("cannot lock output directory {}", output.display()))
        }
    }
}

pub fn run(a: RunArgs, search: Vec<PathBuf>) -> Result<std::process::ExitCode> {
    anyhow::ensure!(
        a.actions.is_none() || a.from_savepoint.is_some() || a.delta.is_some(),
        "--actions goes with --from-savepoint or --delta"
    );
    if let Some(ms) = a.checkpoint_interval_ms {
        anyhow::ensure!(ms >= 1, "--checkpoint-interval-ms must be >= 1");
    }
    let model = crate::read_model(&a.job, None)?;
    let dir = crate::job_dir(&a.job);
    let base = PathBuf::from("nopstream-out").join(&model.job.id);
    let output = a.output.clone().unwrap_or_else(|| base.join("output"));
    let work_dir = a.work_dir.clone().unwrap_or_else(|| base.join("work"));
    let lock = lock_work_dir(&work_dir, &a.job)?;
    let _output_lock = lock_output_dir(&output, &a.job)?;
    let checkpoints = match &a.checkpoints {
        Some(c) => crate::location(c).context("--checkpoints")?,
        None => Location::Local(work_dir.join("checkpoints")),
    };
    let savepoints = Location::Local(work_dir.join("savepoints"));
    let sub = submission(&a, &output)?;
    crate::prepare::run_steps(&model, &dir)?;

    let mut limits = Limits::default();
    if let Some(m) = a.memory_mib {
        limits.memory_bytes = m << 20;
    }
    if let Some(c) = a.cpu_ms_per_call {
        limits.cpu_ms_per_call = c;
    }
    let mut template = RunOptions::new(dir, output.clone(), work_dir.clone());
    template.limits = limits;
    template.task_scheduling = a.task_scheduling;
    template.checkpoints = checkpoints.clone();
    template.savepoint_root = savepoints.clone();
    let progress = Arc::new(JobProgress::default());
    let platform = EmbeddedPlatform::new(
        plugin_host(crate::cache_dir())?,
        search,
        template,
        Arc::clone(&progress),
    );
    let jobs = ObjectJobStore::new(Location::Local(work_dir.join("jobs")).open()?);
    let mut mopts = ManagerOptions::new(checkpoints, savepoints);
    mopts.where_ = format!("in {}", work_dir.display());
    let started: Arc<Mutex<Option<crate::output::RunDirs>>> = Arc::default();
    let (start_dirs, out_dir, work) = (Arc::clone(&started), output.clone(), work_dir.clone());
    let manager = JobManager::new(Arc::new(platform), Arc::new(jobs), mopts, move |note| {
        print_note(note);
        if let (Some(d), Note::Starting { job, .. }) = (dirs_of(note, &out_dir, &work), note) {
            d.print_start(job);
            *start_dirs.lock().unwrap_or_else(|p| p.into_inner()) = Some(d);
        }
    });

    let control = crate::savepoint::control_socket(&work_dir);
    let control_server = crate::savepoint::serve_control(&control, Arc::clone(&manager))?;
    let http_addr = work_dir.join(crate::HTTP_ADDR_FILE);
    let _http = crate::serve_http(a.http.as_deref(), &manager, Some(&http_addr))?;
    let done = Arc::new(AtomicBool::new(false));
    let display = (!a.no_progress && !a.json)
        .then(|| crate::spawn_progress(Arc::clone(&progress), Arc::clone(&done)));
    let result = manager.submit(sub, RunIn::Foreground);
    // The job has ended: the next run on this work directory may start. The output
    // directory's lock is held until its summary has been read (the end of this function):
    // a next run into it would clear it first.
    drop(lock);
    let _ = std::fs::remove_file(&control);
    let _ = std::fs::remove_file(&http_addr);
    // A stop's answer is written as the job ends: let it reach the client.
    control_server.drain(std::time::Duration::from_secs(5));
    done.store(true, Ordering::SeqCst);
    if let Some(h) = display {
        let _ = h.join();
    }
    let report = match result? {
        Submitted::Refused { savepoint, report } => {
            crate::savepoint::print_refusal(&report, &savepoint, &a.job);
            return Ok(std::process::ExitCode::from(report.verdict.exit_code()));
        }
        Submitted::Checked { .. } => return Ok(std::process::ExitCode::SUCCESS),
        Submitted::Started { report, .. } => report.context("the run did not report")?,
    };
    let report = match *report {
        Ok(report) => report,
        Err(e) => {
            let at = open_failure_node(&e.to_string(), &model)
                .map(|node| format!(" ({}: {node})", a.job.display()))
                .unwrap_or_default();
            return Err(anyhow::Error::new(e).context(format!("job `{}` failed{at}", model.job.id)));
        }
    };
    let dirs = started
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .context("the run did not start")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        crate::output::print_summary(&report, &dirs);
        if !a.no_echo {
            crate::output::echo_output(&output)?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The job-file entry of the node whose plugin refused its set-up: for a failure `message`
/// of a plugin's `open` with `invalid-config` (its config, or its parallelism, is one the
/// plugin cannot run with), `operator[1] `max``; `None` for any other failure.
fn open_failure_node(message: &str, model: &nop_stream_core::StreamModel) -> Option<String> {
    if !message.contains(" failed in `open` (invalid-config): ") {
        return None;
    }
    let name = message.split("(operator `").nth(1)?.split('`').next()?;
    let index = model.nodes.iter().position(|n| n.name == name)?;
    Some(format!("{} `{name}`", model.node_field(index)))
}

/// What `--from-savepoint SP` names for the job manager: a relative path that is a
/// directory here (as `nopstream savepoints` prints them: `nopstream-out/JOB/work/
/// savepoints/epoch-N`) made absolute; anything else as given (a URL, an absolute path,
/// or a savepoint's name under the work directory's `savepoints/`, e.g. `epoch-46`).
fn savepoint_arg(sp: &Path) -> String {
    if sp.is_relative()
        && sp.is_dir()
        && let Ok(abs) = std::path::absolute(sp)
    {
        return abs.display().to_string();
    }
    sp.display().to_string()
}

/// The submission `a` makes.
fn submission(a: &RunArgs, output: &std::path::Path) -> Result<JobSubmission> {
    let text = std::fs::read_to_string(&a.job)
        .with_context(|| format!("cannot read job file {}", a.job.display()))?;
    let delta = match &a.delta {
        Some(d) => Some((
            d.display().to_string(),
            std::fs::read_to_string(d)
                .with_context(|| format!("cannot read delta file {}", d.display()))?,
        )),
        None => None,
    };
    let actions = crate::savepoint::read_actions(a.actions.as_deref())?;
    Ok(JobSubmission {
        file: a.job.display().to_string(),
        text,
        job_dir: crate::job_dir(&a.job).display().to_string(),
        output_dir: output.display().to_string(),
        parallelism: a.parallelism,
        max_restarts: a.max_restarts,
        fresh: a.fresh,
        memory_bytes: a.memory_mib.map(|m| m << 20),
        cpu_ms_per_call: a.cpu_ms_per_call,
        from_savepoint: a.from_savepoint.as_deref().map(savepoint_arg),
        actions_json: match &a.actions {
            Some(_) => Some(serde_json::to_string(&actions)?),
            None => None,
        },
        check_only: false,
        pipeline: None,
        delta,
        rescale: a.rescale,
        checkpoint_interval_ms: a.checkpoint_interval_ms,
    })
}
