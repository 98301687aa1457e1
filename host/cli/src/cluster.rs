//! The cluster commands: the coordinator and node processes, and the CLI protocol's client
//! side (plugin upload and list, job submit, list, status, cancel, checkpoints, cluster
//! status).

use crate::output;
use anyhow::{Context, Result, bail};
use nop_stream_cluster::Identity;
use nop_stream_proto::cli::{
    CliRequest, CliResponse, JobControl, JobState, JobStatus, JobSubmission, NodeStatus,
    PluginEntry,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A cluster's coordinator addresses (`HOST:PORT[,HOST:PORT...]`, UDP): with several (a
/// leader and its standbys), requests go to the first that answers and follow a
/// standby's answer to the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coordinators(pub Vec<String>);

impl std::str::FromStr for Coordinators {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: Vec<String> = s
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        if v.is_empty() {
            return Err("name at least one coordinator address HOST:PORT".into());
        }
        for a in &v {
            if a.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(format!("`{a}` is not HOST:PORT"));
            }
        }
        Ok(Coordinators(v))
    }
}

impl std::fmt::Display for Coordinators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

/// How to reach a cluster's coordinator.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// The coordinator's address (HOST:PORT, UDP); with HA, every coordinator's, separated
    /// by commas.
    #[arg(long, env = "NOPSTREAM_CLUSTER")]
    pub cluster: Coordinators,
    /// Certificates directory holding `ca.crt` and the CLI client's `cli-admin.crt/.key`
    /// (`nopstream cluster init`).
    #[arg(long, env = "NOPSTREAM_CERTS")]
    pub certs: PathBuf,
}

/// A cluster to ask instead of local files, for commands that work on both.
#[derive(Debug, Clone, clap::Args)]
pub struct MaybeCluster {
    /// Ask this cluster's coordinator (HOST:PORT[,HOST:PORT...], UDP) instead of local
    /// files.
    #[arg(long, env = "NOPSTREAM_CLUSTER", requires = "certs")]
    pub cluster: Option<Coordinators>,
    /// With --cluster: the certificates directory.
    #[arg(long, env = "NOPSTREAM_CERTS")]
    pub certs: Option<PathBuf>,
}

impl MaybeCluster {
    /// The cluster, if one was named.
    pub fn get(self) -> Option<ClusterArgs> {
        match (self.cluster, self.certs) {
            (Some(cluster), Some(certs)) => Some(ClusterArgs { cluster, certs }),
            _ => None,
        }
    }
}

/// The tokio runtime of the cluster commands (QUIC I/O).
pub fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Sends one request as `cli-admin` to the leading coordinator: the addresses in turn, a
/// standby's answer followed to the leader; a refusal becomes an error carrying its
/// message.
pub fn request(args: &ClusterArgs, req: CliRequest) -> Result<CliResponse> {
    let admin: Identity = "cli-admin".parse()?;
    let rt = tokio_runtime()?;
    let mut last: Option<anyhow::Error> = None;
    let mut queue: std::collections::VecDeque<String> = args.cluster.0.iter().cloned().collect();
    if queue.len() > 1 {
        // Asked in turn, each address that does not answer (a coordinator down) would
        // cost the whole timeout before the next: find the leader by asking all at once,
        // then send the request to it alone.
        let leader = rt
            .block_on(find_leader(&args.cluster.0, &args.certs, &admin))
            .map_err(|answers| anyhow::anyhow!("no coordinator leads: {answers}"))?;
        queue = std::iter::once(leader).collect();
    }
    let mut asked = std::collections::BTreeSet::new();
    while let Some(target) = queue.pop_front() {
        if !asked.insert(target.clone()) {
            continue;
        }
        let addr = match std::net::ToSocketAddrs::to_socket_addrs(&target)
            .ok()
            .and_then(|mut a| a.next())
        {
            Some(a) => a,
            None => {
                last = Some(anyhow::anyhow!(
                    "coordinator at {target}: cannot resolve the address"
                ));
                continue;
            }
        };
        let answer = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(if args.cluster.0.len() > 1 { 3 } else { 3600 }),
                nop_stream_cluster::session::cli_request(addr, &args.certs, &admin, &req),
            )
            .await
        });
        match answer {
            Ok(Ok(CliResponse::NotLeader { leader, .. })) => match leader {
                Some(l) => queue.push_front(l),
                None => {
                    last = Some(anyhow::anyhow!(
                        "coordinator at {target} is a standby and no leader is elected yet"
                    ))
                }
            },
            Ok(Ok(CliResponse::Error(e))) => bail!("the coordinator refused: {e}"),
            Ok(Ok(other)) => return Ok(other),
            Ok(Err(e)) => {
                last = Some(anyhow::Error::new(e).context(format!("coordinator at {target}")))
            }
            Err(_) => {
                last = Some(anyhow::anyhow!(
                    "coordinator at {target}: no answer in time"
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no coordinator address given")))
}

/// Asks every address in `cluster` at once who leads ([`CliRequest::Leadership`], each
/// within [`PROBE_TIMEOUT`]) and returns the first that answers it leads.
///
/// # Errors
/// None leads: each address's answer (a standby and the leader it names, a refusal, or
/// no answer in time), e.g. while a new leader is elected after the old one died.
async fn find_leader(
    cluster: &[String],
    certs: &std::path::Path,
    admin: &Identity,
) -> Result<String, String> {
    let mut asks = tokio::task::JoinSet::new();
    for (i, target) in cluster.iter().enumerate() {
        let (target, certs, admin) = (target.clone(), certs.to_owned(), admin.clone());
        asks.spawn(async move {
            let Some(addr) = std::net::ToSocketAddrs::to_socket_addrs(&target)
                .ok()
                .and_then(|mut a| a.next())
            else {
                return (i, target, Err("cannot resolve the address".to_owned()));
            };
            let answer = tokio::time::timeout(
                PROBE_TIMEOUT,
                nop_stream_cluster::session::cli_request(
                    addr,
                    &certs,
                    &admin,
                    &CliRequest::Leadership,
                ),
            )
            .await;
            let answer = match answer {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer in {} s", PROBE_TIMEOUT.as_secs())),
            };
            (i, target, answer)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = asks.join_next().await {
        let Ok((i, target, answer)) = done else {
            continue;
        };
        let said = match answer {
            Ok(CliResponse::Leadership(_)) => {
                asks.abort_all();
                return Ok(target);
            }
            Ok(CliResponse::NotLeader { leader, term }) => format!(
                "stands by (leader {}, term {term})",
                leader.as_deref().unwrap_or("none yet")
            ),
            Ok(CliResponse::Error(e)) => format!("refused: {e}"),
            Ok(other) => format!("{}", unexpected(&other)),
            Err(e) => e,
        };
        answers.push((i, format!("{target} {said}")));
    }
    answers.sort();
    Err(answers
        .into_iter()
        .map(|(_, a)| a)
        .collect::<Vec<_>>()
        .join("; "))
}

/// How long [`find_leader`] waits for each coordinator's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

fn unexpected(r: &CliResponse) -> anyhow::Error {
    anyhow::anyhow!("unexpected answer from the coordinator: {r:?}")
}

/// `nopstream cluster status --leader-only | --answers`: asks the first address alone
/// who leads; `leader_only` fails unless it is the leader.
///
/// # Errors
/// No answer; with `leader_only`, an answer from a standby.
pub fn probe(args: &ClusterArgs, leader_only: bool) -> Result<()> {
    let first = args
        .cluster
        .0
        .first()
        .context("no coordinator address given")?;
    let addr = std::net::ToSocketAddrs::to_socket_addrs(first)
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("coordinator at {first}: cannot resolve the address"))?;
    let admin: Identity = "cli-admin".parse()?;
    let answer = tokio_runtime()?
        .block_on(nop_stream_cluster::session::cli_request(
            addr,
            &args.certs,
            &admin,
            &CliRequest::Leadership,
        ))
        .with_context(|| format!("coordinator at {first}"))?;
    match answer {
        CliResponse::Leadership(l) => {
            println!("{first} leads (term {})", l.term);
            Ok(())
        }
        CliResponse::NotLeader { leader, term } if !leader_only => {
            println!(
                "{first} stands by (leader {} term {term})",
                leader.as_deref().unwrap_or("none yet")
            );
            Ok(())
        }
        CliResponse::NotLeader { leader, .. } => bail!(
            "coordinator at {first} stands by (leader: {})",
            leader.as_deref().unwrap_or("none yet")
        ),
        r => Err(unexpected(&r)),
    }
}

/// `nopstream cluster status`: the leader, its term and the standbys (text only), then
/// the nodes (`--json`: the nodes as a JSON array).
pub fn cluster_status(args: &ClusterArgs, json: bool) -> Result<()> {
    if !json {
        match request(args, CliRequest::Leadership)? {
            CliResponse::Leadership(l) => {
                println!(
                    "leader {}  term {}  election {}  standbys {}",
                    l.leader,
                    l.term,
                    l.election,
                    if l.standbys.is_empty() {
                        "-".to_owned()
                    } else {
                        l.standbys.join(",")
                    }
                );
            }
            r => return Err(unexpected(&r)),
        }
    }
    let nodes: Vec<NodeStatus> = match request(args, CliRequest::ClusterStatus)? {
        CliResponse::Status(n) => n,
        r => return Err(unexpected(&r)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&nodes)?);
        return Ok(());
    }
    println!(
        "{:<10} {:<8} {:<6} {:>6} {:>9} {:>8} {:>8} {:>6} data",
        "node", "lease", "live", "slots", "renewals", "refused", "expired", "lost"
    );
    for n in &nodes {
        println!(
            "{:<10} {:<8} {:<6} {:>6} {:>9} {:>8} {:>8} {:>6} {}",
            n.node,
            n.lease,
            n.live,
            n.slots,
            n.renewals,
            n.refused_renewals,
            n.expirations,
            n.lost,
            n.data_addr
        );
    }
    Ok(())
}

/// `nopstream plugin upload FILE...`.
pub fn upload(files: &[PathBuf], args: &ClusterArgs) -> Result<()> {
    anyhow::ensure!(
        !files.is_empty(),
        "name at least one component file to upload"
    );
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        let sha256 = nop_stream_server::store::sha256_hex(&bytes);
        let entry = match request(args, CliRequest::UploadPlugin { bytes, sha256 })
            .with_context(|| format!("upload of {}", f.display()))?
        {
            CliResponse::Plugin(e) => e,
            r => return Err(unexpected(&r)),
        };
        println!(
            "{:<28} {:<9} sha256 {}  {} bytes  ({})",
            entry.reference(),
            entry.kind.to_string(),
            entry.sha256,
            output::thousands(entry.size),
            f.display()
        );
    }
    Ok(())
}

/// `nopstream plugin list --cluster`.
pub fn list_plugins(args: &ClusterArgs, json: bool) -> Result<()> {
    let plugins: Vec<PluginEntry> = match request(args, CliRequest::ListPlugins)? {
        CliResponse::Plugins(p) => p,
        r => return Err(unexpected(&r)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&plugins)?);
        return Ok(());
    }
    if plugins.is_empty() {
        println!("the cluster's registry holds no plugins (`nopstream plugin upload FILE.wasm`)");
    }
    for p in &plugins {
        println!(
            "{:<28} {:<9} {}  {:>12} B  {}",
            p.reference(),
            p.kind.to_string(),
            p.sha256,
            output::thousands(p.size),
            p.description
        );
    }
    Ok(())
}

/// What `nopstream job submit` was asked.
#[derive(Debug)]
pub struct Submit {
    /// The job file.
    pub job: PathBuf,
    /// `-p`.
    pub parallelism: Option<u32>,
    /// `--output`.
    pub output: Option<PathBuf>,
    /// `--fresh`.
    pub fresh: bool,
    /// `--from-savepoint`.
    pub from_savepoint: Option<String>,
    /// `--actions`.
    pub actions: Option<PathBuf>,
    /// The plugin search path (`--plugins`): where a `finalize-sink` finds the old sink.
    pub plugins: Vec<PathBuf>,
    /// `--max-restarts`.
    pub max_restarts: Option<u32>,
    /// `--memory-mib`.
    pub memory_mib: Option<u64>,
    /// `--cpu-ms-per-call`.
    pub cpu_ms_per_call: Option<u64>,
    /// `--wait`.
    pub wait: bool,
    /// `--no-echo`.
    pub no_echo: bool,
    /// `--json`.
    pub json: bool,
}

/// `nopstream job submit`: runs the job's prepare steps here, then submits it; with
/// `--wait`, waits until it ends and prints its summary (exit 1 unless it finished). With
/// `--from-savepoint`, a refused check prints the report and exits 2 or 3.
pub fn submit(s: &Submit, args: &ClusterArgs) -> Result<std::process::ExitCode> {
    // A savepoint path this machine sees goes as an absolute path (the coordinator
    // reaches it at the same path, like the job's directory); anything else is the name of
    // a savepoint the coordinator holds.
    let from_savepoint = s.from_savepoint.as_ref().map(|sp| {
        let p = Path::new(sp);
        if p.exists() {
            std::path::absolute(p).map_or_else(|_| sp.clone(), |a| a.display().to_string())
        } else {
            sp.clone()
        }
    });
    let actions = crate::savepoint::read_actions(s.actions.as_deref())?;
    let actions_json = match &s.actions {
        Some(_) => Some(serde_json::to_string(&actions)?),
        None => None,
    };
    let model = crate::read_model(&s.job, s.parallelism)?;
    let dir = std::path::absolute(crate::job_dir(&s.job))?;
    let text = std::fs::read_to_string(&s.job)
        .with_context(|| format!("cannot read job file {}", s.job.display()))?;
    let output = std::path::absolute(s.output.clone().unwrap_or_else(|| {
        PathBuf::from("nopstream-out")
            .join(&model.job.id)
            .join("output")
    }))?;
    crate::prepare::run_steps(&model, &dir)?;
    let sub = JobSubmission {
        file: s.job.display().to_string(),
        text,
        job_dir: dir.display().to_string(),
        output_dir: output.display().to_string(),
        parallelism: s.parallelism,
        max_restarts: s.max_restarts,
        fresh: s.fresh,
        memory_bytes: s.memory_mib.map(|m| m << 20),
        cpu_ms_per_call: s.cpu_ms_per_call,
        from_savepoint,
        actions_json,
        check_only: false,
        pipeline: None,
        delta: None,
        rescale: false,
        checkpoint_interval_ms: None,
    };
    let refused = |resp: CliResponse| -> Result<std::process::ExitCode> {
        match resp {
            CliResponse::SavepointRefused {
                savepoint,
                exit_code,
                report_json,
            } => {
                let report: nop_stream_coordinator::compat::Report =
                    serde_json::from_str(&report_json).context("the coordinator's report")?;
                crate::savepoint::print_refusal(&report, &savepoint, &s.job);
                Ok(std::process::ExitCode::from(exit_code))
            }
            r => Err(unexpected(&r)),
        }
    };
    if actions.actions.iter().any(|a| {
        matches!(
            a,
            nop_stream_coordinator::compat::Action::FinalizeSink { .. }
        )
    }) {
        // finalize-sink: the coordinator checks first; then the old sink plugin commits
        // the savepoint's pending committables here (as `run --from-savepoint` does),
        // writing where the cluster's sinks write; then the restore is submitted.
        let sp = s
            .from_savepoint
            .as_deref()
            .map(Path::new)
            .filter(|p| p.join("savepoint.json").is_file())
            .context(
                "finalize-sink: the savepoint must be a directory this machine reads (the \
                 old sink plugin runs here)",
            )?;
        let check = JobSubmission {
            check_only: true,
            ..sub.clone()
        };
        match request(args, CliRequest::SubmitJob(Box::new(check)))? {
            CliResponse::SavepointChecked { .. } => {}
            r => return refused(r),
        }
        let sp = crate::savepoint::open(&crate::savepoint::location_arg(sp)?)?;
        let work = std::env::temp_dir().join(format!("nopstream-finalize-{}", std::process::id()));
        let platform = nop_stream_embedded::EmbeddedPlatform::new(
            nop_stream_task::plugin_host(crate::cache_dir())?,
            s.plugins.clone(),
            nop_stream_task::RunOptions::new(dir, output.clone(), work.clone()),
            std::sync::Arc::new(nop_stream_task::JobProgress::default()),
        );
        let done = platform.finalize(&sp, &actions);
        let _ = std::fs::remove_dir_all(&work);
        for line in done.map_err(anyhow::Error::msg)? {
            eprintln!("{line}");
        }
    }
    let status = match request(args, CliRequest::SubmitJob(Box::new(sub)))? {
        CliResponse::Job(j) => *j,
        r => return refused(r),
    };
    if let Some(sp) = &s.from_savepoint {
        match status.durable_epoch {
            Some(e) => eprintln!("restoring savepoint {sp} (epoch {e})"),
            None => eprintln!("restoring savepoint {sp}"),
        }
    }
    eprintln!(
        "submitted job `{}` to {}; output directory {}",
        status.job, args.cluster, status.output_dir
    );
    if !s.wait {
        print_status(&status, s.json)?;
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let status = wait_for_end(args, &status.job)?;
    print_status(&status, s.json)?;
    if status.state != JobState::Finished {
        return Ok(std::process::ExitCode::FAILURE);
    }
    if !s.no_echo && !s.json {
        output::echo_output(Path::new(&status.output_dir))?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Polls a job's status until it is no longer submitted or running.
pub fn wait_for_end(args: &ClusterArgs, job: &str) -> Result<JobStatus> {
    loop {
        let s = job_status(args, job)?;
        if !matches!(s.state, JobState::Submitted | JobState::Running) {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// One job's status.
pub fn job_status(args: &ClusterArgs, job: &str) -> Result<JobStatus> {
    match request(
        args,
        CliRequest::Control(JobControl::Status {
            job: job.to_owned(),
        }),
    )? {
        CliResponse::Job(j) => Ok(*j),
        r => Err(unexpected(&r)),
    }
}

/// Prints a job's status, as a summary or JSON.
pub fn print_status(s: &JobStatus, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    println!("job {} ({}): {}, run {}", s.job, s.name, s.state, s.run);
    println!(
        "  semantic {}, generation {}, recoveries {}, durable epoch {}",
        s.semantic,
        s.generation,
        s.recoveries,
        s.durable_epoch
            .map_or_else(|| "none".to_owned(), |e| e.to_string())
    );
    println!(
        "  records read {}, written {}",
        output::thousands(s.records_read),
        output::thousands(s.records_written)
    );
    println!(
        "  refused stale work: {} events at the coordinator, {} data streams and {} commands at nodes",
        s.refused.events, s.refused.streams, s.refused.commands
    );
    println!("  output {}", s.output_dir);
    if let Some(h) = &s.history_json
        && let Ok(runs) = serde_json::from_str::<Vec<nop_stream_coordinator::jobs::PastRun>>(h)
    {
        for r in runs {
            println!(
                "  earlier run {}: {}, {} read, {} written, {} recoveries{}",
                r.run,
                r.state,
                output::thousands(r.records_read),
                output::thousands(r.records_written),
                r.recoveries,
                r.error.map(|e| format!(", {e}")).unwrap_or_default()
            );
        }
    }
    if let Some(e) = &s.error {
        println!("  error: {e}");
    }
    if let Some(d) = &s.deployment_json
        && let Ok(plan) = serde_json::from_str::<nop_stream_core::DeploymentPlan>(d)
    {
        println!("  placement:");
        for t in &plan.tasks {
            println!(
                "    {:<48} {:<8} {}",
                t.task.to_string(),
                t.node,
                t.transport
            );
        }
    }
    Ok(())
}

/// `nopstream job list`.
pub fn list_jobs(args: &ClusterArgs, json: bool) -> Result<()> {
    let jobs = match request(args, CliRequest::Control(JobControl::ListJobs))? {
        CliResponse::Jobs(j) => j,
        r => return Err(unexpected(&r)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(());
    }
    println!(
        "{:<28} {:<10} {:>10} {:>10} {:>8}  output",
        "job", "state", "generation", "recoveries", "epoch"
    );
    for j in &jobs {
        println!(
            "{:<28} {:<10} {:>10} {:>10} {:>8}  {}",
            j.job,
            j.state.to_string(),
            j.generation,
            j.recoveries,
            j.durable_epoch
                .map_or_else(|| "-".to_owned(), |e| e.to_string()),
            j.output_dir
        );
    }
    Ok(())
}

/// `nopstream job cancel`.
pub fn cancel(args: &ClusterArgs, job: &str) -> Result<()> {
    match request(
        args,
        CliRequest::Control(JobControl::Cancel {
            job: job.to_owned(),
        }),
    )? {
        CliResponse::Job(_) => {}
        r => return Err(unexpected(&r)),
    }
    let s = wait_for_end(args, job)?;
    println!("job {}: {}", s.job, s.state);
    Ok(())
}

/// `nopstream checkpoints JOB --cluster`: `target` is a job id or a job file.
pub fn checkpoints(args: &ClusterArgs, target: &Path, verbose: bool) -> Result<()> {
    let job = if target.is_file() {
        crate::read_model(target, None)?.job.id
    } else {
        target.display().to_string()
    };
    let (log, manifests) = match request(
        args,
        CliRequest::Control(JobControl::Checkpoints { job: job.clone() }),
    )? {
        CliResponse::Checkpoints {
            log_json,
            manifests_json,
        } => (
            serde_json::from_str::<Vec<nop_stream_checkpoint::EpochLogRecord>>(&log_json)?,
            serde_json::from_str::<Vec<nop_stream_checkpoint::EpochManifest>>(&manifests_json)?,
        ),
        r => return Err(unexpected(&r)),
    };
    output::print_checkpoint_table(
        &format!("checkpoints of job {job} on {}", args.cluster),
        &log,
        &manifests,
        verbose,
    )
}

/// `nopstream coordinator`: run a cluster coordinator. It serves node sessions (leases
/// renewed by heartbeats) and CLI requests over QUIC with mutual TLS, until killed.
#[derive(Debug, clap::Args)]
pub struct CoordinatorArgs {
    /// UDP address to listen on, e.g. 127.0.0.1:7400.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Data directory: caches only (compiled components); with an empty one and the same
    /// --storage, a coordinator started anywhere resumes every job.
    #[arg(long)]
    pub data: PathBuf,
    /// Certificates directory (`nopstream cluster init`).
    #[arg(long)]
    pub certs: PathBuf,
    /// The cluster's storage location: checkpoints, the plugin registry, job records and
    /// savepoints. A directory, `file:///dir`, or `s3://bucket/prefix[?endpoint=URL]`
    /// (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY only). Every node is
    /// given the same one [default: DATA].
    #[arg(long, value_name = "LOCATION")]
    pub storage: Option<String>,
    /// The checkpoint root, if not STORAGE/checkpoints (every node must be given the same).
    #[arg(long, value_name = "LOCATION")]
    pub checkpoints: Option<String>,
    /// Lease time to live, ms.
    #[arg(long, default_value_t = 10_000)]
    pub lease_ttl_ms: u64,
    /// Interval between node heartbeats, ms.
    #[arg(long, default_value_t = 2_000)]
    pub heartbeat_ms: u64,
    /// Global recoveries a job gets unless its submission says otherwise.
    #[arg(long, default_value_t = 10)]
    pub max_restarts: u32,
    /// Elect the leader among several coordinators (design §14.5, "Coordinator HA"):
    /// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (prefix default `/nopstream`). The
    /// others stand by and send nodes and the CLI to the leader. Needs a build with the
    /// `etcd` feature. Default: this coordinator alone leads.
    #[arg(long, value_name = "URL")]
    pub election: Option<String>,
    /// The address nodes and the CLI reach this coordinator at, as standbys tell it
    /// [default: --listen].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// The election lease's TTL, ms (whole seconds, at least 1 s): a leader whose lease
    /// is not renewed this long loses its leadership and a standby takes over
    /// [default: --lease-ttl-ms].
    #[arg(long)]
    pub election_ttl_ms: Option<u64>,
    /// Serve /metrics and the JSON API (/api/v1/) over HTTP on this address (a bare port
    /// binds 127.0.0.1; there is no authentication). Bound at start and announced in the
    /// election: a standby redirects the API to the leader's HTTP address (307) and serves
    /// its own `nopstream_coordinator_*` families on /metrics.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
}

/// The election a coordinator takes part in, and the job store its leadership guards.
type ElectionParts = (
    Arc<dyn nop_stream_coordinator::election::Election>,
    Option<Arc<dyn nop_stream_coordinator::jobs::JobStore>>,
);

#[cfg(feature = "etcd")]
fn election(url: &str, ttl: Duration) -> Result<ElectionParts> {
    let cfg = nop_stream_server::etcd::EtcdConfig::parse(url, ttl).map_err(anyhow::Error::msg)?;
    let e = nop_stream_server::etcd::EtcdElection::connect(cfg)?;
    let jobs: Arc<dyn nop_stream_coordinator::jobs::JobStore> = Arc::new(e.job_store());
    Ok((Arc::new(e), Some(jobs)))
}

#[cfg(not(feature = "etcd"))]
fn election(url: &str, _ttl: Duration) -> Result<ElectionParts> {
    bail!(
        "--election {}: this nopstream was built without etcd support (build with \
         `--features etcd`, which needs protoc)",
        url.split('@').next_back().unwrap_or("")
    )
}

/// The coordinator process's HTTP role: the leader's routes once it leads, a standby's
/// answers before.
#[derive(Default)]
struct CoordinatorHttp {
    service: std::sync::OnceLock<Arc<nop_stream_server::ha::HaCoordinator>>,
    routes: std::sync::OnceLock<nop_stream_http::Router>,
}

impl nop_stream_http::Role for CoordinatorHttp {
    fn leading(&self) -> Option<nop_stream_http::Router> {
        let service = self.service.get()?;
        let c = service.leader()?;
        let routes = self.routes.get_or_init(|| {
            let (s, n) = (Arc::clone(service), Arc::clone(service));
            nop_stream_http::router_with(
                Arc::clone(c.manager()),
                nop_stream_http::Extras {
                    samples: Some(Arc::new(move || s.samples())),
                    nodes: Some(Arc::new(move || n.nodes())),
                },
            )
        });
        Some(routes.clone())
    }

    fn leader(&self) -> nop_stream_http::LeaderHint {
        match self.service.get().and_then(|s| s.leader_info()) {
            Some(l) => nop_stream_http::LeaderHint {
                leader: Some(l.addr),
                leader_http: l.http,
                term: l.term,
            },
            None => nop_stream_http::LeaderHint::default(),
        }
    }

    fn samples(&self) -> Vec<nop_stream_metrics::Sample> {
        self.service.get().map(|s| s.samples()).unwrap_or_default()
    }
}

/// The HTTP address a coordinator announces: where it is bound, or, bound to every
/// interface, the host of its cluster address with the bound port.
fn http_advertised(bound: SocketAddr, advertise: &str) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    match advertise.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// `nopstream coordinator`: serves until killed.
pub fn run_coordinator(a: CoordinatorArgs) -> Result<()> {
    let lease = nop_stream_cluster::LeaseConfig {
        ttl: Duration::from_millis(a.lease_ttl_ms),
        heartbeat_interval: Duration::from_millis(a.heartbeat_ms),
        safety_margin: Duration::from_millis(a.lease_ttl_ms / 4),
    };
    lease.validate().context("lease settings")?;
    let data = std::path::absolute(&a.data)?;
    let mut opts = nop_stream_server::ClusterOptions::new(data.clone(), lease.ttl);
    if let Some(s) = &a.storage {
        opts.storage = crate::location(s).context("--storage")?;
        opts.checkpoints = opts.storage.join(nop_stream_checkpoint::names::CHECKPOINTS);
    }
    if let Some(c) = &a.checkpoints {
        opts.checkpoints = crate::location(c).context("--checkpoints")?;
    }
    opts.max_restarts = a.max_restarts;
    let rt = tokio_runtime()?;
    let advertise = a.advertise.clone().unwrap_or_else(|| a.listen.to_string());
    // The HTTP server is bound before the campaign so that its address can be announced;
    // it answers as a standby until this process leads.
    let http_role = Arc::new(CoordinatorHttp::default());
    let http = match &a.http {
        Some(given) => {
            let server = nop_stream_http::spawn_ha(
                nop_stream_http::parse_addr(given)?,
                Arc::clone(&http_role) as Arc<dyn nop_stream_http::Role>,
            )?;
            eprintln!("http: /metrics and /api/v1/ on http://{}", server.addr);
            let announced = http_advertised(server.addr, &advertise);
            // Kept for the life of the process.
            std::mem::forget(server);
            Some(announced)
        }
        None => None,
    };
    let announcement = nop_stream_coordinator::election::Announcement {
        addr: advertise,
        http,
    };
    let service = match &a.election {
        None => {
            // The only coordinator: it leads at once (term 0), before it serves.
            let local = Arc::new(nop_stream_coordinator::election::LocalElection::new(0));
            let service = nop_stream_server::ha::HaCoordinator::new(local, announcement);
            let _ = http_role.service.set(Arc::clone(&service));
            service
                .lead(opts, None)
                .map_err(|e| anyhow::anyhow!("coordinator (data {}): {e}", data.display()))?;
            service
        }
        Some(url) => {
            let ttl = Duration::from_millis(a.election_ttl_ms.unwrap_or(a.lease_ttl_ms));
            let (election, jobs) = election(url, ttl)?;
            let service = nop_stream_server::ha::HaCoordinator::new(election, announcement);
            let _ = http_role.service.set(Arc::clone(&service));
            let s = Arc::clone(&service);
            std::thread::Builder::new()
                .name("campaign".into())
                .spawn(move || {
                    if let Err(e) = s.lead(opts, jobs) {
                        tracing::error!("cannot lead: {e}");
                        eprintln!("error: cannot lead: {e}");
                        std::process::exit(1);
                    }
                })?;
            service
        }
    };
    let cfg = nop_stream_cluster::session::CoordinatorConfig {
        listen: a.listen,
        certs: a.certs,
        lease,
    };
    let s2 = Arc::clone(&service);
    rt.block_on(nop_stream_cluster::session::serve_coordinator(
        cfg,
        service,
        move |c| {
            s2.set_registry(c.registry.clone());
            println!("coordinator listening on {}", c.addr);
        },
    ))?;
    Ok(())
}

/// `nopstream node`: run a cluster node. It registers with the coordinator and keeps its
/// lease; stops its tasks when it cannot renew it, then registers again as new capacity.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// The coordinator's address (HOST:PORT); with HA, every coordinator's, separated by
    /// commas: the node registers with the leader, following the standbys' answers.
    #[arg(long)]
    pub join: Coordinators,
    /// Node id N (its certificate is `node-N`).
    #[arg(long)]
    pub id: u32,
    /// Data directory (task state, compiled components).
    #[arg(long)]
    pub data: PathBuf,
    /// Certificates directory.
    #[arg(long)]
    pub certs: PathBuf,
    /// The cluster's storage location, the coordinator's --storage (tasks read and write
    /// their checkpoints there).
    #[arg(long, value_name = "LOCATION")]
    pub storage: String,
    /// The checkpoint root, if not STORAGE/checkpoints (the coordinator's --checkpoints).
    #[arg(long, value_name = "LOCATION")]
    pub checkpoints: Option<String>,
    /// UDP address for data connections from other nodes [default: 127.0.0.1:0].
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Task slots offered: slot groups (one subtask of each vertex) it runs at once.
    #[arg(long, default_value_t = nop_stream_server::DEFAULT_SLOTS)]
    pub slots: u32,
    /// How the kernel schedules task threads: `batch` (SCHED_BATCH on Linux: a woken
    /// task does not preempt a running one, fewer context switches when task threads
    /// outnumber cores) or `normal` (the default policy, lowest hand-over latency).
    #[arg(long, default_value = "batch", value_name = "batch|normal")]
    pub task_scheduling: nop_stream_task::TaskScheduling,
}

/// `nopstream node`: serves until killed.
pub fn run_node(a: NodeArgs) -> Result<()> {
    let rt = tokio_runtime()?;
    let data = std::path::absolute(&a.data)?;
    let storage = crate::location(&a.storage).context("--storage")?;
    let checkpoints = match &a.checkpoints {
        Some(c) => crate::location(c).context("--checkpoints")?,
        None => storage.join(nop_stream_checkpoint::names::CHECKPOINTS),
    };
    let terms = Arc::new(nop_stream_cluster::session::TermWatch::default());
    let host = nop_stream_server::NodeHost::start(
        nop_stream_server::NodeOptions {
            id: nop_stream_cluster::NodeId(a.id),
            data: data.clone(),
            storage,
            checkpoints,
            channel_capacity: 0,
            task_scheduling: a.task_scheduling,
            terms: Arc::clone(&terms),
        },
        rt.handle().clone(),
    )
    .map_err(|e| anyhow::anyhow!("node data {}: {e}", data.display()))?;
    let cfg = nop_stream_cluster::session::NodeConfig {
        join: a.join.0,
        terms,
        id: nop_stream_cluster::NodeId(a.id),
        certs: a.certs,
        listen: a.listen,
        slots: a.slots,
    };
    rt.block_on(nop_stream_cluster::session::serve_node(cfg, host))?;
    Ok(())
}

/// `nopstream savepoint take JOB --cluster`: `job` is a job id or a job file.
pub fn take_savepoint(
    args: &ClusterArgs,
    job: &Path,
    out: Option<&Path>,
    stop: bool,
) -> Result<nop_stream_checkpoint::SavepointInfo> {
    let job = if job.is_file() {
        crate::read_model(job, None)?.job.id
    } else {
        job.display().to_string()
    };
    match request(
        args,
        CliRequest::Control(JobControl::TakeSavepoint {
            job,
            out: out.map(|p| p.display().to_string()),
            stop,
        }),
    )? {
        CliResponse::Savepoint { info_json } => Ok(serde_json::from_str(&info_json)?),
        r => Err(unexpected(&r)),
    }
}
