//! `nopstream`: run, plan and validate nop-stream jobs, and inspect plugins.

mod cluster;
#[cfg(test)]
mod doc_commands;
mod nats;
mod output;
mod prepare;
mod run;
mod savepoint;
mod scaffold;
mod status;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use nop_stream_api::PluginKind;
use nop_stream_checkpoint::{Location, Namespace};
use nop_stream_core::{
    DeploymentOptions, Layer, StreamModel, deployment_plan, job_graph, parse_job_file,
    partitioned_plan, stream_graph,
};
use nop_stream_plugin_host::PluginRegistry;
use nop_stream_task::{JobProgress, plugin_host};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// nop-stream: an exactly-once stream processor whose operators, connectors and patterns
/// are sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "nopstream", version, about)]
struct Cli {
    /// Directory to search for `name@version` plugins (repeatable; searched before
    /// $NOPSTREAM_PLUGIN_PATH and the bundled plugins).
    #[arg(long = "plugins", global = true, value_name = "DIR")]
    plugins: Vec<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job file to completion (embedded mode: one process, local files, redb).
    Run(run::RunArgs),
    /// Savepoints: promote a checkpoint to one, check a job against one.
    Savepoint {
        #[command(subcommand)]
        command: SavepointCommand,
    },
    /// Stop a running job with a savepoint: an epoch is triggered at once, the first one
    /// made durable is copied into a savepoint, the sinks commit it, and then the job
    /// stops (no epoch after it starts). Returns once the job has stopped. Resume with
    /// `run --from-savepoint`, or by running the job again.
    Stop {
        /// Job file (TOML), or with --cluster the job id.
        job: PathBuf,
        /// Required: a stop always takes a savepoint (to drop a job without one, use
        /// `job cancel` in a cluster, or interrupt an embedded run).
        #[arg(long)]
        savepoint: bool,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The savepoint directory to create [default: WORK_DIR/savepoints/epoch-N, or epoch-N-2, ... if taken].
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        on: cluster::MaybeCluster,
    },
    /// List a job's savepoints (under WORK_DIR/savepoints).
    Savepoints {
        /// Job file (TOML).
        job: PathBuf,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },
    /// List the checkpoints of a job (job file) or of a checkpoint namespace directory:
    /// epochs with state, duration, alignment, snapshot size, source offsets and sink
    /// transactions.
    Checkpoints {
        /// Job file (TOML) or checkpoint namespace directory.
        target: PathBuf,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The checkpoint root, if not WORK_DIR/checkpoints (as given to `run
        /// --checkpoints`: a directory or a location URL).
        #[arg(long, value_name = "LOCATION")]
        checkpoints: Option<String>,
        /// Show source offsets and sink transactions of every epoch.
        #[arg(long, short = 'v')]
        verbose: bool,
        /// With --cluster, TARGET is a job id or a job file.
        #[command(flatten)]
        on: cluster::MaybeCluster,
    },
    /// Print a plan layer of a job as JSON.
    Plan {
        /// Job file (TOML).
        job: PathBuf,
        /// Layer: model, stream, job, partitioned or deployment.
        #[arg(long, default_value = "partitioned")]
        layer: Layer,
        /// The job's parallelism (`job.parallelism`): every node runs at N except one whose
        /// job-file entry sets its own `parallelism`, which keeps it (as Flink's `-p`).
        #[arg(long, short = 'p', value_parser = parallelism_arg)]
        parallelism: Option<u32>,
        /// With `--layer deployment`: place the tasks on a cluster of this many nodes
        /// (`node-1..N`) as the coordinator would, instead of the embedded mode's one node.
        #[arg(long)]
        nodes: Option<u32>,
        /// With `--nodes`: task slots per node.
        #[arg(long, default_value_t = nop_stream_server::DEFAULT_SLOTS)]
        slots: u32,
        /// A Delta overlay to apply to the job file first (its changes go to stderr).
        #[arg(long, value_name = "D.toml")]
        delta: Option<PathBuf>,
    },
    /// Show a job as the job manager sees it: state, vertices with counts and rates,
    /// edges, the last epochs. Asks a running embedded job (by its job file and work
    /// directory) or, with --cluster, the coordinator (JOB is then the job id).
    Status {
        /// Job file (TOML), or with --cluster the job id.
        job: PathBuf,
        /// Working directory of the embedded run [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// `table`, or `json` (the JSON API's StatusView).
        #[arg(long, value_enum, default_value = "table")]
        format: status::Format,
        /// Refresh every SECONDS (default 2) until the job ends: the table is redrawn in
        /// place; with `--format json`, one object per line.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
        watch: Option<f64>,
        #[command(flatten)]
        on: cluster::MaybeCluster,
    },
    /// Check a job file and its plugins; report every problem with its location.
    Validate {
        /// Job file (TOML).
        job: PathBuf,
    },
    /// List the plugins on the plugin path (an alias of `nopstream plugin list`).
    Plugins,
    /// Cluster jobs: submit, list, status, cancel.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Cluster administration.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Run a cluster coordinator: serves node sessions (leases renewed by heartbeats) and
    /// CLI requests over QUIC with mutual TLS, until killed.
    Coordinator(cluster::CoordinatorArgs),
    /// Run a cluster node: registers with the coordinator and keeps its lease; stops its
    /// tasks when it cannot renew it, then registers again as new capacity.
    Node(cluster::NodeArgs),
    /// Write plugins: `nopstream plugin new NAME --kind operator|source|sink`.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// NATS JetStream tools: `nopstream nats publish` a file into a stream.
    Nats {
        #[command(subcommand)]
        command: nats::NatsCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Write a cluster CA and mutual-TLS certificates into DIR: one for the coordinator,
    /// one per node (`node-1` .. `node-N`) and one for a CLI client (`cli-admin`). Keys
    /// are written with mode 0600. Refuses to overwrite an existing set unless --force.
    Init {
        /// Directory to write `ca.crt`, `ca.key` and `<identity>.crt/.key` into.
        dir: PathBuf,
        /// Number of node certificates.
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// Replace existing files under a new CA.
        #[arg(long)]
        force: bool,
    },
    /// Show the leader, its term and the standbys, then the nodes registered with the
    /// leader and their leases.
    Status {
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Print JSON (the nodes).
        #[arg(long)]
        json: bool,
        /// Ask the first address only, and fail (exit 1) unless it leads: a readiness
        /// check that is ready only on the leader.
        #[arg(long, conflicts_with_all = ["json", "answers"])]
        leader_only: bool,
        /// Ask the first address only, and succeed if it answers at all (leader or
        /// standby): a liveness check.
        #[arg(long, conflicts_with = "json")]
        answers: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SavepointCommand {
    /// Take a savepoint of a running job: an epoch is triggered at once and the first one
    /// made durable is copied into a savepoint directory. Embedded runs are reached through
    /// their control socket (WORK_DIR/control.sock), cluster jobs through the coordinator.
    Take {
        /// Job file (TOML), or with --cluster the job id.
        job: PathBuf,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The savepoint directory to create [default: WORK_DIR/savepoints/epoch-N, or epoch-N-2, ... if taken].
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        on: cluster::MaybeCluster,
    },
    /// Copy a durable checkpoint of a job (its latest, or --epoch N) into a self-contained,
    /// relocatable savepoint directory that retention never deletes.
    Promote {
        /// Job file (TOML), or a checkpoint namespace directory.
        target: PathBuf,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The checkpoint root, if not WORK_DIR/checkpoints (as given to `run
        /// --checkpoints`: a directory or a location URL).
        #[arg(long, value_name = "LOCATION")]
        checkpoints: Option<String>,
        /// The epoch to promote [default: the latest durable one].
        #[arg(long)]
        epoch: Option<u64>,
        /// Where to write the savepoint: a directory or a location URL (s3://...)
        /// [default: WORK_DIR/savepoints/epoch-N, or epoch-N-2, ... if taken].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Check a job against a savepoint: per operator compatible, needs-action or
    /// incompatible with stable finding codes and the actions that clear them. Exit 0
    /// compatible, 2 needs action, 3 incompatible, 1 usage error.
    Check {
        /// The savepoint directory.
        savepoint: PathBuf,
        /// The job file to restore it into.
        #[arg(long)]
        job: PathBuf,
        /// The job's parallelism (`job.parallelism`): every node runs at N except one whose
        /// job-file entry sets its own `parallelism`, which keeps it (as Flink's `-p`).
        #[arg(long, short = 'p', value_parser = parallelism_arg)]
        parallelism: Option<u32>,
        /// Actions file (`[[action]]` tables) clearing findings.
        #[arg(long, value_name = "A.toml")]
        actions: Option<PathBuf>,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// The checkpoint root, if not WORK_DIR/checkpoints (as given to `run
        /// --checkpoints`: a directory or a location URL).
        #[arg(long, value_name = "LOCATION")]
        checkpoints: Option<String>,
        /// `text` (a table) or `json` (`nopstream.compat-report/v1`).
        #[arg(long, default_value = "text")]
        format: ReportFormat,
    },
    /// Write a new savepoint: SAVEPOINT migrated for a job by the actions that clear its
    /// findings (rename-operator, rename-state, drop-state, init-empty, reshard,
    /// accept-semantic-change). SAVEPOINT is never written to; the new one records it as
    /// its parent with the actions, and checks compatible against the job with no action.
    /// The check runs first: exit 0 written, 2 needs action, 3 incompatible (nothing
    /// written then), 1 usage error.
    Migrate {
        /// The savepoint directory.
        savepoint: PathBuf,
        /// The job file the new savepoint is for.
        #[arg(long)]
        job: PathBuf,
        /// The job's parallelism (`job.parallelism`): every node runs at N except one whose
        /// job-file entry sets its own `parallelism`, which keeps it (as Flink's `-p`).
        #[arg(long, short = 'p', value_parser = parallelism_arg)]
        parallelism: Option<u32>,
        /// Actions file (`[[action]]` tables) clearing findings.
        #[arg(long, value_name = "A.toml")]
        actions: Option<PathBuf>,
        /// Where to write the new savepoint (must not exist).
        #[arg(long, value_name = "SP2")]
        out: PathBuf,
        /// Working directory of the job [default: nopstream-out/JOB_ID/work].
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },
}

/// How `savepoint check` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
    /// A table.
    Text,
    /// Versioned JSON.
    Json,
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Submit a job file to a cluster: runs its prepare steps here, then the coordinator
    /// resolves its plugins from the registry, places it on the live nodes and runs it.
    /// The job file's directory and the output directory must be reachable by every node
    /// at the same path.
    Submit {
        /// Job file (TOML).
        job: PathBuf,
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// The job's parallelism (`job.parallelism`): every node runs at N except one whose
        /// job-file entry sets its own `parallelism`, which keeps it (as Flink's `-p`).
        #[arg(long, short = 'p', value_parser = parallelism_arg)]
        parallelism: Option<u32>,
        /// Output directory granted to sinks as `$OUTPUT` [default:
        /// nopstream-out/JOB_ID/output, made absolute].
        #[arg(long)]
        output: Option<PathBuf>,
        /// Discard the job's checkpoints and start over. With --from-savepoint: restore
        /// even if the job's checkpoints went on past the savepoint (they are discarded).
        #[arg(long)]
        fresh: bool,
        /// Restore from a savepoint, like `flink run -s`: a savepoint directory path (as
        /// for `run --from-savepoint`), which the coordinator must reach at the same path
        /// (like the job's directory), or the name of one the coordinator holds under its
        /// `savepoints/JOB_ID/` (e.g. `epoch-12`, as `stop --savepoint` made it). The
        /// coordinator runs the savepoint check first and refuses anything but compatible,
        /// printing the findings (exit 2 needs action, 3 incompatible; nothing is
        /// touched); then it replaces the job's checkpoints with the savepoint's epoch and
        /// the job resumes from it (state, source positions, pending sink transactions),
        /// at any parallelism up to the shard count.
        #[arg(long, value_name = "SP")]
        from_savepoint: Option<String>,
        /// With --from-savepoint: the actions file that clears the check's findings
        /// (rename-operator, drop-state, rename-state, init-empty, reshard, migrate-state,
        /// accept-semantic-change, finalize-sink, fork: the job then runs as the new
        /// pipeline lineage, restored into its own namespace); an action
        /// that clears nothing is an error. A finalize-sink runs the old sink plugin here,
        /// from the plugin path (--plugins), after the coordinator's check and before the
        /// restore, so SP must then be a path this machine reads.
        #[arg(long, value_name = "A.toml", requires = "from_savepoint")]
        actions: Option<PathBuf>,
        /// Global recoveries allowed [default: the coordinator's --max-restarts].
        #[arg(long)]
        max_restarts: Option<u32>,
        /// Memory limit per plugin instance, in MiB [default: 256].
        #[arg(long)]
        memory_mib: Option<u64>,
        /// CPU time limit per call into a plugin, in milliseconds [default: 10000].
        #[arg(long)]
        cpu_ms_per_call: Option<u64>,
        /// Wait until the job ends; print its summary and echo its output.
        #[arg(long)]
        wait: bool,
        /// With --wait: do not echo the committed output.
        #[arg(long)]
        no_echo: bool,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the cluster's jobs.
    List {
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a job: state, generation, recoveries, durable epoch, records, stale work
    /// refused (events, data streams, commands) and its placement.
    Status {
        /// Job id.
        job: String,
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running job and wait until it has stopped.
    Cancel {
        /// Job id.
        job: String,
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Upload components to a cluster's plugin registry: each is validated (a component
    /// exporting a `nop:stream` world this host serves, whose describe() answers) and
    /// stored by sha256. A name@version is immutable: other bytes under it are refused.
    Upload {
        /// Component files (`.wasm`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
    },
    /// List plugins: name@version, kind, sha256, size. The plugin path by default; the
    /// cluster's registry with --cluster.
    List {
        #[command(flatten)]
        on: cluster::MaybeCluster,
        /// Print JSON (with --cluster).
        #[arg(long)]
        json: bool,
    },
    /// Describe a plugin on the plugin path: its kind, description, file, sha256, keyed
    /// and operator states, side outputs, capabilities and the JSON Schema its `config`
    /// must follow (what `nopstream validate` checks). `--json` prints its describe()
    /// answer as JSON.
    Describe {
        /// The plugin, as `name@version` (e.g. `flights-mapper@0.1.0`), or its name alone
        /// when the plugin path holds one version of it.
        plugin: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a ready-to-build plugin crate: Cargo.toml with the SDK dependency, src/lib.rs
    /// with the plugin and its native tests, and job.toml, a job that runs it.
    New {
        /// Plugin name (lowercase letters, digits, `-`): the crate name and the `name` of
        /// `name@0.1.0`.
        name: String,
        /// Which plugin to write.
        #[arg(long, value_enum)]
        kind: scaffold::Kind,
        /// Directory to create the crate in [default: ./NAME]; must be new or empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Depend on the SDK at this path (the `guest-sdk` directory of a nop-stream
        /// checkout, or a copy of that directory alone) [default: the checkout this
        /// nopstream was built from].
        #[arg(long, value_name = "DIR", conflicts_with = "sdk_git")]
        sdk_path: Option<PathBuf>,
        /// Depend on the SDK through git: the URL of a nop-stream repository (there is no
        /// public one; any clone you can reach, e.g. `file:///src/nop-stream`).
        #[arg(long, value_name = "URL")]
        sdk_git: Option<String>,
        /// With --sdk-git: the commit, tag or branch to use.
        #[arg(long, value_name = "REV", requires = "sdk_git")]
        sdk_rev: Option<String>,
        /// The zipped flights CSV the operator and sink job stubs read [default: the
        /// checkout's examples/flights/data/flights.csv.zip].
        #[arg(long, value_name = "ZIP")]
        flights: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log redirected to a file gets no escape codes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Usage errors exit 1, like every other error: exit codes 2 and 3 belong to
    // `savepoint check` (needs action, incompatible).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(u8::from(e.use_stderr()));
        }
    };
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn plugin_path(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut path: Vec<PathBuf> = extra.to_vec();
    if let Ok(env) = std::env::var("NOPSTREAM_PLUGIN_PATH") {
        path.extend(std::env::split_paths(&env));
    }
    #[cfg(feature = "bundled-plugins")]
    path.push(PathBuf::from(nop_stream_artifacts::PLUGIN_DIR));
    path
}

/// Where `nopstream run --http` writes the address it serves on, in its work directory.
const HTTP_ADDR_FILE: &str = "http.addr";

/// Starts the HTTP server (`--http ADDR`) over `manager` when asked, prints where it
/// listens and, with `addr_file`, writes the address there.
fn serve_http<P: nop_stream_coordinator::manager::Platform>(
    given: Option<&str>,
    manager: &Arc<nop_stream_coordinator::manager::JobManager<P>>,
    addr_file: Option<&Path>,
) -> Result<Option<nop_stream_http::Server>> {
    let Some(given) = given else {
        return Ok(None);
    };
    let server = nop_stream_http::spawn(nop_stream_http::parse_addr(given)?, Arc::clone(manager))?;
    eprintln!("http: /metrics and /api/v1/ on http://{}", server.addr);
    if let Some(f) = addr_file {
        std::fs::write(f, server.addr.to_string())
            .with_context(|| format!("cannot write {}", f.display()))?;
    }
    Ok(Some(server))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("NOPSTREAM_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("nopstream"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("nopstream"))
}

/// The job file's model with the Delta overlay `delta` applied (its changes printed to
/// stderr, one line each), then `parallelism` if given; the changes.
///
/// # Errors
/// Unreadable files; the job file's or the Delta's diagnostics (naming file and field).
pub(crate) fn read_model_with_delta(
    job: &Path,
    delta: Option<&Path>,
    parallelism: Option<u32>,
) -> Result<(StreamModel, Vec<nop_stream_core::delta::Change>)> {
    let Some(delta) = delta else {
        return Ok((read_model(job, parallelism)?, Vec::new()));
    };
    let text = std::fs::read_to_string(job)
        .with_context(|| format!("cannot read job file {}", job.display()))?;
    let dtext = std::fs::read_to_string(delta)
        .with_context(|| format!("cannot read delta file {}", delta.display()))?;
    let (model, changes) = nop_stream_core::delta::apply_delta(
        &job.display().to_string(),
        &text,
        &delta.display().to_string(),
        &dtext,
    )
    .map_err(|d| anyhow::anyhow!("{d}"))?;
    if changes.is_empty() {
        eprintln!("delta {}: no change", delta.display());
    }
    for c in &changes {
        eprintln!("delta {}: {c}", delta.display());
    }
    let model = match parallelism {
        Some(p) => model.with_parallelism(p),
        None => model,
    };
    Ok((model, changes))
}

pub(crate) fn read_model(job: &Path, parallelism: Option<u32>) -> Result<StreamModel> {
    let text = std::fs::read_to_string(job)
        .with_context(|| format!("cannot read job file {}", job.display()))?;
    let model =
        parse_job_file(&job.display().to_string(), &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    Ok(match parallelism {
        Some(p) => model.with_parallelism(p),
        None => model,
    })
}

/// What `savepoint check` and `savepoint migrate` compare a savepoint with: the job's
/// partitioned plan, its components, and its checkpoint namespace under `work_dir`
/// (default `nopstream-out/JOB_ID/work`), opened.
fn savepoint_target(
    job: &Path,
    parallelism: Option<u32>,
    work_dir: Option<PathBuf>,
    checkpoints: Option<&str>,
    search: Vec<PathBuf>,
) -> Result<(
    nop_stream_core::PartitionedPlan,
    nop_stream_plugin_host::PluginSet,
    Namespace,
)> {
    let model = read_model(job, parallelism)?;
    let work_dir = work_dir.unwrap_or_else(|| {
        PathBuf::from("nopstream-out")
            .join(&model.job.id)
            .join("work")
    });
    let host = plugin_host(cache_dir())?;
    let registry = PluginRegistry::new(&host, search, job_dir(job));
    let stream = stream_graph(&model, &registry).map_err(|d| anyhow::anyhow!("{d}"))?;
    let plan = partitioned_plan(&job_graph(&stream));
    let plugins = registry.plugin_set(&plan)?;
    let ckpt = Namespace::open(&nop_stream_coordinator::checkpoint_location(
        &checkpoint_root(&work_dir, checkpoints)?,
        &plan,
    ))?;
    Ok((plan, plugins, ckpt))
}

/// The checkpoint root: `--checkpoints` if given, else `<work_dir>/checkpoints`.
///
/// # Errors
/// A location that does not parse.
fn checkpoint_root(work_dir: &Path, checkpoints: Option<&str>) -> Result<Location> {
    Ok(match checkpoints {
        Some(c) => location(c).context("--checkpoints")?,
        None => Location::Local(work_dir.join("checkpoints")),
    })
}

/// A location argument: a URL, or a path (made absolute, so that a process started
/// elsewhere finds it).
///
/// # Errors
/// A URL that does not parse (its message never repeats a credential).
pub(crate) fn location(arg: &str) -> Result<Location> {
    Ok(match Location::parse(arg)? {
        Location::Local(p) => Location::Local(std::path::absolute(p)?),
        l => l,
    })
}

pub(crate) fn job_dir(job: &Path) -> PathBuf {
    job.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn dispatch(cli: Cli) -> Result<std::process::ExitCode> {
    let search = plugin_path(&cli.plugins);
    match cli.command {
        Command::Savepoint { command } => savepoint_command(command, search),
        Command::Job { command } => job_command(command, search),
        Command::Plugin { command } => plugin_command(command, search),
        Command::Cluster { command } => cluster_command(command),
        Command::Nats { command } => {
            nats::run(command)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Coordinator(args) => {
            cluster::run_coordinator(args)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Node(args) => {
            cluster::run_node(args)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Plugins => list_local_plugins(&search),
        Command::Run(args) => {
            let json = args.json;
            let result = run::run(args, search);
            if json && let Err(e) = &result {
                // A JSON reader gets a document on failure too (the error also goes to
                // stderr, as without --json).
                println!(
                    "{}",
                    serde_json::json!({"status": "failed", "error": format!("{e:#}")})
                );
            }
            result
        }
        Command::Savepoints { job, work_dir } => {
            let model = read_model(&job, None)?;
            let work_dir = work_dir.unwrap_or_else(|| {
                PathBuf::from("nopstream-out")
                    .join(&model.job.id)
                    .join("work")
            });
            let dir = work_dir.join("savepoints");
            let found = savepoint::list(&dir);
            if found.is_empty() {
                println!("no savepoints in {}", dir.display());
            }
            for (p, i) in found {
                println!(
                    "epoch {:>6}  {}  namespace {}{}",
                    i.epoch,
                    p.display(),
                    i.namespace,
                    if i.final_epoch { "  (final epoch)" } else { "" }
                );
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Stop {
            job,
            savepoint,
            work_dir,
            out,
            on,
        } => {
            if !savepoint {
                bail!(
                    "`nopstream stop` always takes a savepoint: pass --savepoint (to drop a job \
                     without one, use `nopstream job cancel` in a cluster, or interrupt an \
                     embedded run)"
                );
            }
            let info = take_savepoint(&job, work_dir, out, on, true)?;
            println!(
                "job {} stopped with a savepoint at epoch {}: {}",
                info.job, info.epoch, info.dir
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Plan {
            job,
            layer,
            parallelism,
            nodes,
            slots,
            delta,
        } => plan(job, layer, parallelism, nodes, slots, delta, search),
        Command::Validate { job } => validate(job, search),
        Command::Status {
            job,
            work_dir,
            format,
            watch,
            on,
        } => {
            let (target, id) = status::target(&job, work_dir, on)?;
            match watch {
                Some(s) if !(s.is_finite() && s >= 0.1) => {
                    bail!("--watch {s}: the interval is in seconds, at least 0.1")
                }
                Some(s) => status::watch(&target, &id, format, Duration::from_secs_f64(s))?,
                None => status::status(&target, &id, format)?,
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Checkpoints {
            target,
            work_dir,
            checkpoints,
            verbose,
            on,
        } => {
            if let Some(c) = on.get() {
                cluster::checkpoints(&c, &target, verbose)?;
                return Ok(std::process::ExitCode::SUCCESS);
            }
            let dir = if target.is_dir() {
                Location::Local(target)
            } else {
                let model = read_model(&target, None)?;
                let work_dir = work_dir.unwrap_or_else(|| {
                    PathBuf::from("nopstream-out")
                        .join(&model.job.id)
                        .join("work")
                });
                let ns =
                    nop_stream_checkpoint::names::namespace(&model.job.id, &model.job.pipeline);
                checkpoint_root(&work_dir, checkpoints.as_deref())?.join(&ns)
            };
            output::print_checkpoints(&dir, verbose)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `nopstream plan`: a plan layer of a job as JSON.
fn plan(
    job: PathBuf,
    layer: Layer,
    parallelism: Option<u32>,
    nodes: Option<u32>,
    slots: u32,
    delta: Option<PathBuf>,
    search: Vec<PathBuf>,
) -> Result<std::process::ExitCode> {
    let (model, _) = read_model_with_delta(&job, delta.as_deref(), parallelism)?;
    let value = if layer == Layer::Model {
        serde_json::to_value(&model)?
    } else {
        let host = plugin_host(cache_dir())?;
        let registry = PluginRegistry::new(&host, search, job_dir(&job));
        let stream = stream_graph(&model, &registry).map_err(|d| {
            let name = job.display().to_string();
            let d = match &delta {
                Some(delta) => nop_stream_core::delta::blame_delta(
                    d,
                    &model,
                    (&name, &std::fs::read_to_string(&job).unwrap_or_default()),
                    (
                        &delta.display().to_string(),
                        &std::fs::read_to_string(delta).unwrap_or_default(),
                    ),
                ),
                None => d,
            };
            anyhow::anyhow!("{}", d.with_file(&name))
        })?;
        match layer {
            Layer::Model => unreachable!("handled above"),
            Layer::Stream => serde_json::to_value(&stream)?,
            Layer::Job => serde_json::to_value(job_graph(&stream))?,
            Layer::Partitioned => serde_json::to_value(partitioned_plan(&job_graph(&stream)))?,
            Layer::Deployment => {
                let plan = partitioned_plan(&job_graph(&stream));
                let opts = match nodes {
                    None => {
                        let work = PathBuf::from("nopstream-out")
                            .join(&model.job.id)
                            .join("work");
                        DeploymentOptions::embedded(
                            work.join("state").display().to_string(),
                            work.join("checkpoints").display().to_string(),
                        )
                    }
                    Some(n) => nop_stream_server::placement_options(
                        &plan,
                        (1..=n).map(|i| (format!("node-{i}"), slots)),
                        "CHECKPOINTS",
                    ),
                };
                serde_json::to_value(deployment_plan(&plan, &opts)?)?
            }
        }
    };
    let mut value = value;
    nop_stream_core::redact_urls_in_json(&mut value);
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(std::process::ExitCode::SUCCESS)
}

/// Parses `-p N`: a parallelism in `1..=MAX_PARALLELISM` (the job file's own bounds),
/// refused as the flag's error rather than as the job file's.
///
/// # Errors
/// Not a number, or out of bounds, in words.
pub(crate) fn parallelism_arg(s: &str) -> std::result::Result<u32, String> {
    let max = nop_stream_core::MAX_PARALLELISM;
    match s.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number in 1..={max}, found `{s}`")),
    }
}

/// `nopstream validate`: the job file, its host-side resources and its plugins; every
/// problem with its location.
fn validate(job: PathBuf, search: Vec<PathBuf>) -> Result<std::process::ExitCode> {
    let text = std::fs::read_to_string(&job)
        .with_context(|| format!("cannot read job file {}", job.display()))?;
    let name = job.display().to_string();
    let model = match parse_job_file(&name, &text) {
        Ok(m) => m,
        Err(d) => {
            eprintln!("{d}");
            eprintln!("{}: {} problem(s)", name, d.len());
            return Ok(std::process::ExitCode::FAILURE);
        }
    };
    // Host-side resources the job needs: prepare archives and read-only grants.
    let dir = job_dir(&job);
    let mut missing = Vec::new();
    // Files earlier prepare steps will produce.
    let mut produced: Vec<std::path::PathBuf> = Vec::new();
    for (i, step) in model.prepare.iter().enumerate() {
        match step {
            nop_stream_core::PrepareStep::Unzip {
                archive,
                into,
                member,
            } => {
                if !dir.join(into).join(member).exists() && !dir.join(archive).is_file() {
                    missing.push(format!(
                        "{name}: prepare[{i}].unzip: archive {} does not exist",
                        dir.join(archive).display()
                    ));
                }
                produced.push(dir.join(into).join(member));
            }
            nop_stream_core::PrepareStep::Sort { file, into, .. } => {
                let input = dir.join(file);
                if !input.is_file() && !produced.contains(&input) {
                    missing.push(format!(
                        "{name}: prepare[{i}].sort: file {} does not exist and no \
                         earlier prepare step produces it",
                        input.display()
                    ));
                }
                produced.push(dir.join(into));
            }
        }
    }
    for (i, node) in model.nodes.iter().enumerate() {
        for (g, grant) in node.grants.iter().enumerate() {
            if grant.writable || grant.host.starts_with("$OUTPUT") {
                continue;
            }
            let host_dir = dir.join(&grant.host);
            let prepared = model.prepare.iter().any(|p| match p {
                nop_stream_core::PrepareStep::Unzip { into, .. } => dir.join(into) == host_dir,
                nop_stream_core::PrepareStep::Sort { into, .. } => {
                    dir.join(into).parent() == Some(host_dir.as_path())
                }
            });
            if !host_dir.is_dir() && !prepared {
                missing.push(format!(
                    "{name}: {}.grants[{g}].host: directory {} granted to `{}` as \
                     `{}` does not exist; create it, point `host` at an existing \
                     directory (relative paths start at the job file's directory), \
                     or set `writable = true` to have the run create it",
                    model.node_field(i),
                    host_dir.display(),
                    node.name,
                    grant.guest
                ));
            }
        }
    }
    let host = plugin_host(cache_dir())?;
    let registry = PluginRegistry::new(&host, search, dir.clone());
    let graph = stream_graph(&model, &registry);
    if !missing.is_empty() {
        for m in &missing {
            eprintln!("{m}");
        }
        if let Err(d) = &graph {
            eprintln!("{}", d.clone().with_file(&name));
        }
        let n = missing.len() + graph.as_ref().err().map_or(0, |d| d.len());
        eprintln!("{name}: {n} problem(s)");
        return Ok(std::process::ExitCode::FAILURE);
    }
    match graph {
        Ok(g) => {
            let plan = partitioned_plan(&job_graph(&g));
            println!(
                "{name}: ok ({} operators, {} tasks, semantic mode {}, fingerprint {})",
                g.nodes.len(),
                plan.ack_set.len(),
                g.job.semantic,
                &plan.fingerprint[..16]
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
        Err(d) => {
            let d = d.with_file(&name);
            eprintln!("{d}");
            eprintln!("{}: {} problem(s)", name, d.len());
            Ok(std::process::ExitCode::FAILURE)
        }
    }
}

/// `nopstream savepoint ...`.
fn savepoint_command(
    command: SavepointCommand,
    search: Vec<PathBuf>,
) -> Result<std::process::ExitCode> {
    match command {
        SavepointCommand::Take {
            job,
            work_dir,
            out,
            on,
        } => {
            let info = take_savepoint(&job, work_dir, out, on, false)?;
            println!(
                "savepoint of job {} epoch {} at {}",
                info.job, info.epoch, info.dir
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
        SavepointCommand::Promote {
            target,
            work_dir,
            checkpoints,
            epoch,
            out,
        } => {
            let (ns, work_dir) = if target.is_dir() {
                (Location::Local(target.clone()), target.clone())
            } else {
                let model = read_model(&target, None)?;
                let work_dir = work_dir.unwrap_or_else(|| {
                    PathBuf::from("nopstream-out")
                        .join(&model.job.id)
                        .join("work")
                });
                let ns =
                    nop_stream_checkpoint::names::namespace(&model.job.id, &model.job.pipeline);
                (
                    checkpoint_root(&work_dir, checkpoints.as_deref())?.join(&ns),
                    work_dir,
                )
            };
            let src = Namespace::open(&ns)?;
            let out = match out {
                Some(o) => savepoint::location_arg(&o)?,
                None => {
                    let e = match epoch {
                        Some(e) => e,
                        None => src
                            .manifest_epochs()?
                            .last()
                            .map(|e| e.0)
                            .with_context(|| format!("{ns} holds no durable epoch"))?,
                    };
                    let root = Location::Local(work_dir.join("savepoints"));
                    root.join(&nop_stream_checkpoint::savepoint::default_name(
                        &root.open()?,
                        e,
                    )?)
                }
            };
            let info = savepoint::promote(&src, epoch, &out)?;
            println!(
                "savepoint of job {} epoch {} at {out}",
                info.job, info.epoch
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
        SavepointCommand::Check {
            savepoint: sp_dir,
            job,
            parallelism,
            actions,
            work_dir,
            checkpoints,
            format,
        } => {
            let sp = savepoint::open(&savepoint::location_arg(&sp_dir)?)?;
            // A component built for a WIT version this host does not serve cannot be
            // planned: it is a finding of the report, not an error.
            let host = plugin_host(cache_dir())?;
            let unserved = savepoint::unserved_report(
                &sp,
                &read_model(&job, parallelism)?,
                &PluginRegistry::new(&host, search.clone(), job_dir(&job)),
            );
            let report = match unserved {
                Some(report) => report,
                None => {
                    let (plan, plugins, ckpt) = savepoint_target(
                        &job,
                        parallelism,
                        work_dir,
                        checkpoints.as_deref(),
                        search,
                    )?;
                    let actions = savepoint::read_actions(actions.as_deref())?;
                    savepoint::check_against(&sp, &plan, &plugins, &ckpt, &actions)?
                }
            };
            match format {
                ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
                ReportFormat::Text => {
                    println!(
                        "savepoint {}  job {}  epoch {}  namespace {}",
                        sp_dir.display(),
                        sp.info.job,
                        sp.info.epoch,
                        sp.info.namespace
                    );
                    print!("{}", report.to_text());
                }
            }
            Ok(std::process::ExitCode::from(report.verdict.exit_code()))
        }
        SavepointCommand::Migrate {
            savepoint: sp_dir,
            job,
            parallelism,
            actions,
            out,
            work_dir,
        } => {
            let (plan, plugins, ckpt) =
                savepoint_target(&job, parallelism, work_dir, None, search)?;
            let sp = savepoint::open(&savepoint::location_arg(&sp_dir)?)?;
            let actions = savepoint::read_actions(actions.as_deref())?;
            let report = savepoint::check_against(&sp, &plan, &plugins, &ckpt, &actions)?;
            print!("{}", report.to_text());
            if report.verdict != nop_stream_coordinator::compat::Status::Compatible {
                eprintln!(
                    "nothing written: the job is not compatible with {} under these actions",
                    sp_dir.display()
                );
                return Ok(std::process::ExitCode::from(report.verdict.exit_code()));
            }
            if let Some(a) = actions.actions.iter().find(|a| {
                matches!(
                    a,
                    nop_stream_coordinator::compat::Action::FinalizeSink { .. }
                )
            }) {
                bail!(
                    "nothing written: `{}` commits to the sink's external system, so it runs \
                     on `nopstream run --from-savepoint` (which knows the output directory), \
                     not in an offline migration",
                    a.describe()
                );
            }
            let info = savepoint::migrate(
                &sp,
                &plan,
                &plugins,
                &actions,
                &savepoint::location_arg(&out)?,
            )?;
            println!(
                "savepoint {} (epoch {}) migrated from {}{}",
                out.display(),
                info.epoch,
                sp_dir.display(),
                if info.actions.is_empty() {
                    String::new()
                } else {
                    format!(" by: {}", info.actions.join(", "))
                }
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `nopstream job ...` (cluster jobs).
fn job_command(command: JobCommand, search: Vec<PathBuf>) -> Result<std::process::ExitCode> {
    match command {
        JobCommand::Submit {
            job,
            cluster,
            parallelism,
            output,
            fresh,
            from_savepoint,
            actions,
            max_restarts,
            memory_mib,
            cpu_ms_per_call,
            wait,
            no_echo,
            json,
        } => cluster::submit(
            &cluster::Submit {
                job,
                parallelism,
                output,
                fresh,
                from_savepoint,
                actions,
                plugins: search,
                max_restarts,
                memory_mib,
                cpu_ms_per_call,
                wait,
                no_echo,
                json,
            },
            &cluster,
        ),
        JobCommand::List { cluster, json } => {
            cluster::list_jobs(&cluster, json)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        JobCommand::Status { job, cluster, json } => {
            let s = cluster::job_status(&cluster, &job)?;
            cluster::print_status(&s, json)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        JobCommand::Cancel { job, cluster } => {
            cluster::cancel(&cluster, &job)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `nopstream plugin ...`.
fn plugin_command(command: PluginCommand, search: Vec<PathBuf>) -> Result<std::process::ExitCode> {
    match command {
        PluginCommand::Upload { files, cluster } => {
            cluster::upload(&files, &cluster)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        PluginCommand::List { on, json } => match on.get() {
            Some(c) => {
                cluster::list_plugins(&c, json)?;
                Ok(std::process::ExitCode::SUCCESS)
            }
            None => list_local_plugins(&search),
        },
        PluginCommand::Describe { plugin, json } => describe_plugin(&search, &plugin, json),
        PluginCommand::New {
            name,
            kind,
            dir,
            sdk_path,
            sdk_git,
            sdk_rev,
            flights,
        } => {
            let sdk = match (sdk_path, sdk_git) {
                (Some(p), _) => {
                    anyhow::ensure!(
                        p.join("Cargo.toml").is_file(),
                        "--sdk-path {}: no Cargo.toml there; pass the `guest-sdk` directory of \
                         a nop-stream checkout",
                        p.display()
                    );
                    scaffold::SdkDep::Path(std::path::absolute(&p)?)
                }
                (None, Some(url)) => scaffold::SdkDep::Git { url, rev: sdk_rev },
                (None, None) => scaffold::SdkDep::Path(scaffold::checkout_sdk().context(
                    "this nopstream was not built from a checkout that still has guest-sdk/; \
                     pass --sdk-path DIR or --sdk-git URL",
                )?),
            };
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let files = scaffold::new_plugin(&name, kind, &dir, &sdk, flights)?;
            println!(
                "created {} plugin `{name}` in {}:",
                format!("{kind:?}").to_lowercase(),
                dir.display()
            );
            for f in &files {
                println!("  {}", f.display());
            }
            println!(
                "next:\n  cd {}\n  cargo test\n  cargo build --target wasm32-wasip2 --release\n  \
                 nopstream run job.toml --plugins target/wasm32-wasip2/release",
                dir.display()
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `nopstream cluster ...`.
fn cluster_command(command: ClusterCommand) -> Result<std::process::ExitCode> {
    match command {
        ClusterCommand::Init { dir, nodes, force } => {
            anyhow::ensure!(nodes >= 1, "--nodes must be at least 1");
            let mut opts = nop_stream_cluster::InitOptions::with_nodes(nodes);
            opts.overwrite = force;
            let report = nop_stream_cluster::init_cluster(&dir, &opts)
                .with_context(|| format!("cluster init {}", dir.display()))?;
            println!("cluster CA: {}", report.ca_cert.display());
            for id in &report.identities {
                println!("  {}", id.label());
            }
            println!("{} files written to {}", report.files.len(), dir.display());
            Ok(std::process::ExitCode::SUCCESS)
        }
        ClusterCommand::Status {
            cluster,
            json,
            leader_only,
            answers,
        } => {
            if leader_only || answers {
                cluster::probe(&cluster, leader_only)?;
            } else {
                cluster::cluster_status(&cluster, json)?;
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// `nopstream plugin list` (and `nopstream plugins`): the plugin path, with sha256 and size.
/// The `.wasm` files of the plugin path: directory by directory in search order, each
/// directory's files sorted; a directory that cannot be read is skipped.
fn wasm_files(search: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in search {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
            .collect();
        files.sort();
        out.extend(files);
    }
    out
}

/// Loads `f` as whichever plugin kind it is. `Err(Some((built_for, served)))`: built for a
/// WIT version this host does not serve; `Err(None)`: not a plugin this host loads.
fn load_any_kind(
    host: &nop_stream_plugin_host::PluginHost,
    f: &Path,
) -> std::result::Result<nop_stream_plugin_host::LoadedPlugin, Unloadable> {
    let label = f.display().to_string();
    let mut why = Unloadable::NoWorld;
    [PluginKind::Operator, PluginKind::Source, PluginKind::Sink]
        .into_iter()
        .find_map(|k| match host.load(&label, f, k) {
            Ok(p) => Some(p),
            Err(nop_stream_plugin_host::RuntimeError::UnservedWit {
                built_for, served, ..
            }) => {
                why = Unloadable::Unserved(built_for, served);
                None
            }
            Err(nop_stream_plugin_host::RuntimeError::PluginLoad { message, .. }) => {
                if matches!(why, Unloadable::NoWorld) {
                    why = Unloadable::Broken(message);
                }
                None
            }
            Err(_) => None,
        })
        .ok_or(why)
}

/// Why a `.wasm` file on the plugin path is not a plugin this host can run.
enum Unloadable {
    /// Built against a WIT version this host does not serve: that version, and what the
    /// host serves.
    Unserved(String, &'static str),
    /// It cannot be read or compiled (truncated, corrupt, not WebAssembly): why.
    Broken(String),
    /// A component, but of none of the operator, source and sink worlds.
    NoWorld,
}

/// `nopstream plugin describe NAME@VERSION` (or `NAME` when the path holds one version of
/// it): the first component on the plugin path whose describe() reports that reference.
///
/// # Errors
/// No such plugin on the path (naming the directories searched); a component host failure.
fn describe_plugin(
    search: &[PathBuf],
    reference: &str,
    json: bool,
) -> Result<std::process::ExitCode> {
    let host = plugin_host(cache_dir())?;
    let loaded: Vec<_> = wasm_files(search)
        .into_iter()
        .filter_map(|f| Some((load_any_kind(&host, &f).ok()?, f)))
        .collect();
    // `NAME` alone names the only version of NAME on the path.
    let name = reference.split('@').next().unwrap_or(reference);
    let mut versions: Vec<String> = loaded
        .iter()
        .filter(|(p, _)| p.info.name == name)
        .map(|(p, _)| p.info.reference())
        .collect();
    versions.sort();
    versions.dedup();
    let wanted = match (reference.contains('@'), versions.as_slice()) {
        (false, [only]) => only.clone(),
        (false, [_, _, ..]) => anyhow::bail!(
            "plugin `{reference}` has several versions on the plugin path ({}): name one",
            versions.join(", ")
        ),
        _ => reference.to_owned(),
    };
    for (p, f) in &loaded {
        if p.info.reference() != wanted {
            continue;
        }
        let i = &p.info;
        if json {
            println!("{}", serde_json::to_string_pretty(i)?);
            return Ok(std::process::ExitCode::SUCCESS);
        }
        println!("{} ({}): {}", i.reference(), i.kind, i.description);
        println!("  file          {}", f.display());
        println!("  sha256        {}", p.sha256);
        if let Some(c) = i.source_capability {
            println!("  capability    {c:?}");
        }
        if let Some(c) = i.sink_capability {
            println!("  capability    {c:?}");
        }
        for st in &i.states {
            println!(
                "  keyed state   {} ({:?}, schema version {})",
                st.name, st.kind, st.schema_version
            );
        }
        for st in &i.operator_states {
            println!("  operator state {}", st.name);
        }
        if !i.side_outputs.is_empty() {
            println!("  side outputs  {}", i.side_outputs.join(", "));
        }
        let schema = serde_json::from_str::<serde_json::Value>(&i.config_schema).map_or_else(
            |_| i.config_schema.clone(),
            |v| serde_json::to_string_pretty(&v).unwrap_or_default(),
        );
        println!("  config schema (JSON Schema; `nopstream validate` checks it):");
        for line in schema.lines() {
            println!("    {line}");
        }
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let searched: Vec<String> = search.iter().map(|d| d.display().to_string()).collect();
    let others = if versions.is_empty() {
        String::new()
    } else {
        format!("; the path has {}", versions.join(", "))
    };
    anyhow::bail!(
        "plugin `{reference}` is not on the plugin path [{}]{others} (`nopstream plugins` \
         lists what is)",
        searched.join(", ")
    )
}

fn list_local_plugins(search: &[PathBuf]) -> Result<std::process::ExitCode> {
    let host = plugin_host(cache_dir())?;
    let mut seen = 0;
    for f in wasm_files(search) {
        match load_any_kind(&host, &f) {
            Ok(p) => println!(
                "{:<28} {:<9} {}  {:>12} B  {}  ({})",
                p.info.reference(),
                p.info.kind.to_string(),
                p.sha256,
                output::thousands(std::fs::metadata(&f).map_or(0, |m| m.len())),
                p.info.description,
                f.display()
            ),
            Err(why) => {
                let why = match why {
                    Unloadable::Unserved(built_for, served) => format!(
                        "built for {built_for}, which this host does not serve (it serves \
                         {served}); rebuild it with this host's nop-stream-sdk"
                    ),
                    // One line: wasmtime's parse errors span several.
                    Unloadable::Broken(message) => format!(
                        "cannot be loaded: {}",
                        message.split_whitespace().collect::<Vec<_>>().join(" ")
                    ),
                    Unloadable::NoWorld => "not a nop:stream component".to_owned(),
                };
                println!("{:<28} {:<9} {why}  ({})", "?", "-", f.display());
            }
        }
        seen += 1;
    }
    if seen == 0 {
        bail!("no plugins found on the plugin path");
    }
    Ok(std::process::ExitCode::SUCCESS)
}

pub(crate) fn spawn_progress(
    progress: Arc<JobProgress>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes}  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        while !done.load(Ordering::SeqCst) {
            let (pos, total) = progress.position();
            let secs = progress.elapsed().as_secs_f64().max(1e-3);
            let read = progress.records_read();
            bar.set_length(total);
            bar.set_position(pos);
            bar.set_message(format!(
                "{} records read, {:.0} records/s",
                output::thousands(read),
                read as f64 / secs
            ));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
    })
}

/// `savepoint take` and `stop --savepoint`: through the coordinator with --cluster, else
/// through the control socket of the embedded run in the job's work directory.
fn take_savepoint(
    job: &Path,
    work_dir: Option<PathBuf>,
    out: Option<PathBuf>,
    on: cluster::MaybeCluster,
    stop: bool,
) -> Result<nop_stream_checkpoint::SavepointInfo> {
    match on.get() {
        Some(c) => cluster::take_savepoint(&c, job, out.as_deref(), stop),
        None => {
            let model = read_model(job, None)?;
            let work_dir = work_dir.unwrap_or_else(|| {
                PathBuf::from("nopstream-out")
                    .join(&model.job.id)
                    .join("work")
            });
            savepoint::take(&work_dir, &model.job.id, out, stop)
        }
    }
}
