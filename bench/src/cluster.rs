//! A local cluster of real processes for the cluster benchmarks: certificates written by
//! `nopstream cluster init`, one `nopstream coordinator` and N `nopstream node` processes
//! on loopback (real QUIC, real mTLS), the bench plugins uploaded to its registry. Every
//! process it starts is killed (by its pid) when it is dropped.
//!
//! CPU time of the long-lived processes is read from `/proc/<pid>/stat` (`utime + stime`
//! of the whole process, every thread), so a job's cost is the difference between two
//! readings; CLI commands run to completion and are measured with `wait4`
//! ([`crate::measure`]).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::measure;

/// How to start a local cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `nopstream` binary.
    pub nopstream: PathBuf,
    /// Directory of the cluster's certificates, data and logs (emptied first).
    pub dir: PathBuf,
    /// Node processes.
    pub nodes: u32,
    /// `--lease-ttl-ms` of the coordinator.
    pub lease_ttl_ms: u64,
    /// `--heartbeat-ms` of the coordinator.
    pub heartbeat_ms: u64,
    /// `RUST_LOG` of the coordinator and the nodes.
    pub log_filter: String,
    /// Component files to upload to the registry.
    pub plugins: Vec<PathBuf>,
}

/// A running coordinator and its nodes.
#[derive(Debug)]
pub struct LocalCluster {
    opts: ClusterOptions,
    addr: String,
    coordinator: Option<Child>,
    nodes: Vec<Option<Child>>,
    /// CPU seconds of every CLI command run against the cluster so far.
    cli_cpu_s: f64,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for c in self
            .coordinator
            .iter_mut()
            .chain(self.nodes.iter_mut().flatten())
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A UDP port free on loopback now.
fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// User + system CPU seconds of process `pid` so far (all its threads), from
/// `/proc/<pid>/stat`.
///
/// # Errors
/// The process is gone or the file is not what Linux writes.
pub fn proc_cpu_s(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let (_, ticks) =
        crate::measure::parse_stat(&text).with_context(|| format!("unexpected {path}"))?;
    Ok(ticks as f64 / crate::measure::clock_ticks())
}

impl LocalCluster {
    /// Writes certificates, starts the coordinator and the nodes, waits until every node
    /// holds a live lease, and uploads the plugins.
    ///
    /// # Errors
    /// A process that does not start, nodes that do not register within 60 s, a refused
    /// upload.
    pub fn start(opts: &ClusterOptions) -> Result<Self> {
        if opts.dir.exists() {
            std::fs::remove_dir_all(&opts.dir)
                .with_context(|| format!("remove {}", opts.dir.display()))?;
        }
        std::fs::create_dir_all(&opts.dir)?;
        let mut init = Command::new(&opts.nopstream);
        init.args(["cluster", "init"])
            .arg(opts.dir.join("certs"))
            .args(["--nodes", &opts.nodes.to_string()]);
        measure::run(init).context("nopstream cluster init")?;
        let mut c = LocalCluster {
            opts: opts.clone(),
            addr: format!("127.0.0.1:{}", free_udp_port()?),
            coordinator: None,
            nodes: Vec::new(),
            cli_cpu_s: 0.0,
        };
        c.start_coordinator()?;
        for id in 1..=opts.nodes {
            c.nodes.push(None);
            c.start_node(id)?;
        }
        c.wait_live(opts.nodes)?;
        let mut args = vec!["plugin".to_owned(), "upload".to_owned()];
        args.extend(opts.plugins.iter().map(|p| p.display().to_string()));
        c.cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .context("plugin upload")?;
        Ok(c)
    }

    fn start_coordinator(&mut self) -> Result<()> {
        let mut child = Command::new(&self.opts.nopstream)
            .args(["coordinator", "--listen", &self.addr])
            .args(["--lease-ttl-ms", &self.opts.lease_ttl_ms.to_string()])
            .args(["--heartbeat-ms", &self.opts.heartbeat_ms.to_string()])
            .arg("--data")
            .arg(self.opts.dir.join("coord"))
            .arg("--certs")
            .arg(self.opts.dir.join("certs"))
            .env("RUST_LOG", &self.opts.log_filter)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.log_path("coordinator"))?)
            .spawn()
            .context("start the coordinator")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let ok = line.contains("coordinator listening on");
        self.coordinator = Some(child);
        ensure!(
            ok,
            "the coordinator did not start: {line:?}; see {}",
            self.log_path("coordinator").display()
        );
        Ok(())
    }

    /// Starts (or restarts) node `id` (1-based).
    ///
    /// # Errors
    /// The process cannot be spawned.
    pub fn start_node(&mut self, id: u32) -> Result<()> {
        let child = Command::new(&self.opts.nopstream)
            .args(["node", "--join", &self.addr, "--id", &id.to_string()])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--storage")
            .arg(self.opts.dir.join("coord"))
            .arg("--data")
            .arg(self.opts.dir.join(format!("node-{id}")))
            .arg("--certs")
            .arg(self.opts.dir.join("certs"))
            .env("RUST_LOG", &self.opts.log_filter)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log_path(&format!("node-{id}")))?)
            .spawn()
            .with_context(|| format!("start node {id}"))?;
        self.nodes[id as usize - 1] = Some(child);
        Ok(())
    }

    /// The log file of `process` (`coordinator`, `node-1`, ...).
    pub fn log_path(&self, process: &str) -> PathBuf {
        self.opts.dir.join(format!("{process}.log"))
    }

    /// The coordinator's data directory (its checkpoint storage is `checkpoints/` in it).
    pub fn coordinator_data(&self) -> PathBuf {
        self.opts.dir.join("coord")
    }

    fn wait_live(&mut self, n: u32) -> Result<()> {
        let started = Instant::now();
        loop {
            let s = self.json(&["cluster", "status"])?;
            let live = s
                .as_array()
                .map_or(0, |a| a.iter().filter(|x| x["live"] == true).count());
            if live == n as usize {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "only {live} of {n} nodes hold a live lease after 60 s: {s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs the CLI against this cluster (`args`, then `--cluster` and `--certs`); returns
    /// its stdout. Its CPU time is added to [`Self::cli_cpu_s`].
    ///
    /// # Errors
    /// A non-zero exit (with its stderr).
    pub fn cli(&mut self, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(&self.opts.nopstream);
        cmd.args(args)
            .args(["--cluster", &self.addr])
            .arg("--certs")
            .arg(self.opts.dir.join("certs"));
        let r = measure::run(cmd)?;
        self.cli_cpu_s += r.cpu_s;
        Ok(r.stdout)
    }

    /// As [`Self::cli`] with `--json`, parsed.
    ///
    /// # Errors
    /// As [`Self::cli`], or output that is not JSON.
    pub fn json(&mut self, args: &[&str]) -> Result<Value> {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.cli(&a)?;
        serde_json::from_str(&out).with_context(|| format!("{args:?} printed {out:?}"))
    }

    /// CPU seconds of every CLI command run so far.
    pub fn cli_cpu_s(&self) -> f64 {
        self.cli_cpu_s
    }

    /// CPU seconds used so far by the coordinator and every running node.
    ///
    /// # Errors
    /// A process's `/proc` entry cannot be read.
    pub fn processes_cpu_s(&self) -> Result<f64> {
        let mut total = 0.0;
        for c in self.coordinator.iter().chain(self.nodes.iter().flatten()) {
            total += proc_cpu_s(c.id())?;
        }
        Ok(total)
    }

    /// Submits `job` at `parallelism` with its output in `output` (emptied first),
    /// `--fresh`; returns the job id.
    ///
    /// # Errors
    /// A refused submission.
    pub fn submit(&mut self, job: &Path, parallelism: u32, output: &Path) -> Result<String> {
        if output.exists() {
            std::fs::remove_dir_all(output)?;
        }
        let job = job.display().to_string();
        let output = output.display().to_string();
        let p = parallelism.to_string();
        let s = self.json(&[
            "job", "submit", &job, "-p", &p, "--fresh", "--output", &output,
        ])?;
        Ok(s["job"].as_str().context("no job id")?.to_owned())
    }

    /// `nopstream job status JOB --json`.
    ///
    /// # Errors
    /// As [`Self::json`].
    pub fn status(&mut self, job: &str) -> Result<Value> {
        self.json(&["job", "status", job])
    }

    /// Polls `job` every `every` until it is neither submitted nor running; its last
    /// status, and when that was first seen.
    ///
    /// # Errors
    /// A failed status request, `limit` exceeded, or a job that did not finish.
    pub fn wait_finished(
        &mut self,
        job: &str,
        every: Duration,
        limit: Duration,
    ) -> Result<(Value, Instant)> {
        let started = Instant::now();
        loop {
            let s = self.status(job)?;
            let at = Instant::now();
            if s["state"] != "Running" && s["state"] != "Submitted" {
                ensure!(
                    s["state"] == "Finished",
                    "job {job} ended {}: {}; see {}",
                    s["state"],
                    s["error"],
                    self.log_path("coordinator").display()
                );
                return Ok((s, at));
            }
            ensure!(
                started.elapsed() < limit,
                "job {job} still {} after {limit:?}",
                s["state"]
            );
            std::thread::sleep(every);
        }
    }

    /// SIGKILLs node `id` and reaps it.
    ///
    /// # Errors
    /// The node is not running.
    pub fn kill_node(&mut self, id: u32) -> Result<()> {
        let Some(mut c) = self.nodes.get_mut(id as usize - 1).and_then(Option::take) else {
            bail!("node {id} is not running");
        };
        c.kill()?; // SIGKILL
        c.wait()?;
        Ok(())
    }
}

/// One task's placement in a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Task id.
    pub task: String,
    /// Node name (`node-1`, ...).
    pub node: String,
    /// Transport of its channels.
    pub transport: String,
}

/// The placement in a job status's `deployment_json`.
///
/// # Errors
/// No deployment in the status, or one that does not parse.
pub fn placement(status: &Value) -> Result<Vec<Placed>> {
    let d = status["deployment_json"]
        .as_str()
        .context("the job status holds no deployment")?;
    let d: Value = serde_json::from_str(d)?;
    d["tasks"]
        .as_array()
        .context("no tasks in the deployment")?
        .iter()
        .map(|t| {
            Ok(Placed {
                task: format!(
                    "{}#{}",
                    t["task"]["vertex"].as_str().context("task vertex")?,
                    t["task"]["subtask"]
                ),
                node: t["node"].as_str().context("node")?.to_owned(),
                transport: t["transport"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// `task@node` for every task, sorted.
pub fn describe_placement(placed: &[Placed]) -> String {
    let mut v: Vec<String> = placed
        .iter()
        .map(|p| format!("{} on {} ({})", p.task, p.node, p.transport))
        .collect();
    v.sort();
    v.join("; ")
}

/// Nodes holding at least one task.
pub fn nodes_used(placed: &[Placed]) -> Vec<String> {
    let mut v: Vec<String> = placed.iter().map(|p| p.node.clone()).collect();
    v.sort();
    v.dedup();
    v
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Days from 1970-01-01 to a civil date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix milliseconds (fractional) of the RFC 3339 UTC timestamp a tracing line starts with
/// (`2026-12-02T06:54:35.123456Z ...`), if it does.
pub fn line_time_ms(line: &str) -> Option<f64> {
    let ts = line.split_whitespace().next()?;
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let s: f64 = t.next()?.parse().ok()?;
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60;
    Some(secs as f64 * 1000.0 + s * 1000.0)
}

/// Lines of a log (colours stripped) with their time, in file order.
///
/// # Errors
/// The log cannot be read.
pub fn timed_lines(path: &Path) -> Result<Vec<(f64, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(strip_ansi(&text)
        .lines()
        .filter_map(|l| line_time_ms(l).map(|t| (t, l.to_owned())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tracing_times_and_proc_stat() {
        let t = line_time_ms("2026-12-02T06:54:35.250000Z  INFO x: y").unwrap();
        // 2026-12-02 is day 20789 since the epoch.
        assert_eq!(days_from_civil(2026, 12, 2), 20_789);
        assert!(
            (t - (20_789.0 * 86_400_000.0 + (6.0 * 3600.0 + 54.0 * 60.0 + 35.25) * 1000.0)).abs()
                < 0.01
        );
        assert_eq!(line_time_ms("no time here"), None);
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m"),
            "2026  INFO"
        );
        assert!(proc_cpu_s(std::process::id()).unwrap() >= 0.0);
        let placed = vec![
            Placed {
                task: "b#1".into(),
                node: "node-2".into(),
                transport: "quic".into(),
            },
            Placed {
                task: "b#0".into(),
                node: "node-1".into(),
                transport: "quic".into(),
            },
        ];
        assert_eq!(nodes_used(&placed), vec!["node-1", "node-2"]);
        assert_eq!(
            describe_placement(&placed),
            "b#0 on node-1 (quic); b#1 on node-2 (quic)"
        );
    }
}
