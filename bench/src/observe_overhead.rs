//! `observe-overhead`: what watching a job costs (design §15). The keyed count with
//! exactly-once checkpoints (`count-ckpt`), embedded, in interleaved pairs (the order
//! alternating from pair to pair): one run plain,
//! one with `--http 127.0.0.1:0` and a scraper reading `/metrics` every interval for the
//! whole run. The metrics registry counts in both (it is always on); the difference is the
//! HTTP server, the encoding and the epoch-log and manifest reads a scrape does. Prints
//! each pair's CPU seconds and the median ratio observed ÷ plain, and checks that both
//! runs of every pair committed the same output (count and checksum).
//!
//! The same run's CPU varies by tens of percent from one time to the next on a shared
//! virtual machine, so the pairs resolve a 1 % difference only with many of them. The
//! bench therefore also reports the direct cost: every scrape is served, encoded and
//! read from storage on the server's own thread (`http`), whose CPU time the kernel
//! accounts apart ([`measure::ChildRun::threads`]); its share of the observed run's CPU
//! is what serving the scrapes cost, without the run-to-run noise. `--checkpoint-ms`
//! shortens the checkpoint interval so that a run of seconds builds the epoch-log
//! history a long-running job has (the log keeps the newest
//! `nop_stream_checkpoint::LOG_HISTORY_EPOCHS` epochs), which is what a scrape reads.

use crate::measure;
use crate::workload;
use anyhow::{Context, Result, ensure};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// One measured pair.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pair {
    /// CPU seconds of the plain run.
    pub plain_cpu_s: f64,
    /// CPU seconds of the run with `--http` and a scraper.
    pub observed_cpu_s: f64,
    /// Scrapes answered during the observed run.
    pub scrapes: u64,
    /// CPU seconds of the observed run's HTTP server thread (every scrape's serving,
    /// encoding and storage reads).
    pub http_cpu_s: f64,
    /// Records read (both runs).
    pub records: u64,
}

/// Runs `pairs` interleaved pairs (after one unmeasured warm-up of each) over `records`
/// bids at parallelism `p`, scraping every `interval`, checkpointing every
/// `checkpoint_ms` (the workload's own interval, 1 s, when `None`); writes
/// `<out>/observe-overhead.json`.
///
/// # Errors
/// A run fails, a scrape fails, or the two runs of a pair commit different output.
pub fn run(
    nopstream: &Path,
    out: &Path,
    records: u64,
    pairs: usize,
    interval: Duration,
    p: u32,
    checkpoint_ms: Option<u64>,
) -> Result<Vec<Pair>> {
    let mut w = *workload::find("count-ckpt").context("count-ckpt workload")?;
    if let Some(ms) = checkpoint_ms {
        w.checkpoint_ms = Some(ms);
    }
    let w = &w;
    let data = out.join("data");
    let label = format!("{}", records);
    let input = crate::bids_file(&data, &label, records, true)?;
    let jobs = out.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    let file_name = input.file_name().context("file name")?.to_string_lossy();
    let job = jobs.join(format!("observe-overhead-{label}.toml"));
    std::fs::write(&job, workload::job_text(w, "../data", &file_name, 1024))?;
    let runs = out.join("runs").join("observe-overhead");
    type One = (f64, u64, u64, crate::floor::OutputSummary, f64);
    let one = |observed: bool, tag: &str| -> Result<One> {
        let dir = runs.join(tag);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        let work = dir.join("work");
        let mut cmd = Command::new(nopstream);
        cmd.arg("run")
            .arg(&job)
            .args(["-p", &p.to_string(), "--json", "--no-progress", "--no-echo"])
            .arg("--output")
            .arg(dir.join("output"))
            .arg("--work-dir")
            .arg(&work);
        if observed {
            cmd.args(["--http", "127.0.0.1:0"]);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let scrapes = Arc::new(AtomicU64::new(0));
        let scraper = observed.then(|| {
            let (stop, scrapes) = (Arc::clone(&stop), Arc::clone(&scrapes));
            let addr_file = work.join("http.addr");
            std::thread::spawn(move || -> Result<()> {
                let mut addr = None;
                while !stop.load(Ordering::Relaxed) {
                    if addr.is_none() {
                        addr = std::fs::read_to_string(&addr_file).ok();
                    }
                    if let Some(a) = &addr
                        && scrape(a.trim()).is_ok()
                    {
                        scrapes.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(interval);
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            })
        });
        let child = measure::run(cmd)?;
        stop.store(true, Ordering::Relaxed);
        if let Some(s) = scraper {
            s.join()
                .map_err(|_| anyhow::anyhow!("the scraper panicked"))??;
        }
        let report: serde_json::Value = serde_json::from_str(&child.stdout)
            .with_context(|| format!("nopstream --json printed {:?}", child.stdout))?;
        let read = report["records_read"].as_u64().unwrap_or(0);
        ensure!(read == records, "{tag}: read {read} of {records} records");
        let summary = crate::committed_output(&dir.join("output"))?
            .with_context(|| format!("{tag}: the sink committed no summary"))?;
        let http_cpu_s = child
            .threads
            .iter()
            .filter(|t| t.name == "http")
            .map(|t| t.cpu_s)
            .sum();
        Ok((
            child.cpu_s,
            scrapes.load(Ordering::Relaxed),
            read,
            summary,
            http_cpu_s,
        ))
    };
    one(false, "warm-plain")?;
    one(true, "warm-observed")?;
    let mut out_pairs = Vec::new();
    for i in 1..=pairs {
        // The order alternates (plain first in odd pairs, observed first in even ones):
        // whichever runs second in a pair tends to cost less (warm page cache), which a
        // fixed order would book to one side.
        let ((pc, _, r, ps, _), (oc, n, _, os, hc)) = if i % 2 == 1 {
            let p = one(false, &format!("plain-{i}"))?;
            (p, one(true, &format!("observed-{i}"))?)
        } else {
            let o = one(true, &format!("observed-{i}"))?;
            (one(false, &format!("plain-{i}"))?, o)
        };
        ensure!(
            (ps.records, ps.checksum) == (os.records, os.checksum),
            "pair {i}: the observed run committed other output ({} records, checksum {:x}) \
             than the plain one ({}, {:x})",
            os.records,
            os.checksum,
            ps.records,
            ps.checksum
        );
        ensure!(n > 0, "pair {i}: no scrape was answered during the run");
        println!(
            "pair {i}: plain {pc:.3} CPU-s, observed {oc:.3} CPU-s ({n} scrapes), ratio {:.4}; \
             http thread {hc:.4} CPU-s = {:.3} % of the observed run, {:.2} ms a scrape",
            oc / pc,
            hc / oc * 100.0,
            hc * 1000.0 / n as f64
        );
        out_pairs.push(Pair {
            plain_cpu_s: pc,
            observed_cpu_s: oc,
            scrapes: n,
            http_cpu_s: hc,
            records: r,
        });
    }
    let median_of = |f: fn(&Pair) -> f64| {
        let mut v: Vec<f64> = out_pairs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let median = median_of(|p| p.observed_cpu_s / p.plain_cpu_s);
    let share = median_of(|p| p.http_cpu_s / p.observed_cpu_s);
    let per_scrape_ms = median_of(|p| p.http_cpu_s * 1000.0 / p.scrapes as f64);
    println!(
        "observe-overhead: {records} bids, p={p}, checkpoints every {} ms, a scrape every {} \
         ms: median CPU observed ÷ plain {median:.4} ({:+.2} %) over {pairs} pairs; the \
         scrapes' own thread {:.3} % of the observed run's CPU ({per_scrape_ms:.2} ms a \
         scrape) (target ≤ 1 %)",
        w.checkpoint_ms.unwrap_or(0),
        interval.as_millis(),
        (median - 1.0) * 100.0,
        share * 100.0
    );
    std::fs::write(
        out.join("observe-overhead.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "records": records,
            "parallelism": p,
            "interval_ms": interval.as_millis() as u64,
            "checkpoint_ms": w.checkpoint_ms,
            "median_ratio": median,
            "median_http_share": share,
            "median_http_ms_per_scrape": per_scrape_ms,
            "pairs": out_pairs,
        }))?,
    )?;
    Ok(out_pairs)
}

/// One `GET /metrics`, read to the end.
fn scrape(addr: &str) -> Result<()> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    ensure!(body.starts_with(b"HTTP/1.1 200"), "GET /metrics: not 200");
    Ok(())
}
