//! `nopstream-bench nexmark`: the Nexmark suite (q0–q5, q7–q9, q11) on nop-stream, on
//! the native floor and on Flink SQL, over the same generated files.
//!
//! - [`generate`] writes `persons.csv`, `auctions.csv` and `bids.csv` of the first N
//!   events of the stream ([`nexmark_model`], seed 42), each with a `#`-prefixed header
//!   line (file-source reads the `date_time` column by name; Flink skips it as a
//!   comment).
//! - nop-stream runs `examples/nexmark/<q>.toml` with its generated sources swapped for
//!   file-sources over those files and its JSONL sink for blackhole-sink, at parallelism 1
//!   with exactly-once checkpoints every second ([`job_text`]); its committed record
//!   count and checksum must equal the floor's.
//! - The floor ([`floor`], one process) reads and parses the files and computes the
//!   query with `nexmark_model::queries`, single-threaded, no checkpoints.
//! - Flink runs `bench/peers/nexmark_flink.py` (the nexmark repository's SQL on the same
//!   files; a pinned PyPI `apache-flink` in a virtualenv), parallelism 1, hashmap state,
//!   checkpoints every second; with two sizes its marginal rate, (N₂ − N₁) ÷ (CPU₂ −
//!   CPU₁), takes its start-up out.
//!
//! Events are counted as Nexmark counts them: every event of the stream (persons,
//! auctions and bids), whichever kinds the query reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use nexmark_model::queries::Query;
use nexmark_model::{Config, Event, Kind, csv, event};
use serde::{Deserialize, Serialize};

use crate::floor::OutputSummary;
use crate::measure;

/// Flink 1.13's published throughput per core for each query (nexmark repository,
/// GUIDE_V1.md: 8 TaskManagers of one slot, RocksDB, exactly-once checkpoints every
/// 3 minutes, 100M events at 10M events/s), events per second.
pub fn flink_published_per_core(q: Query) -> f64 {
    match q {
        Query::Q0 => 155_020.0,
        Query::Q1 => 157_940.0,
        Query::Q2 => 175_210.0,
        Query::Q3 => 152_120.0,
        Query::Q4 => 34_330.0,
        Query::Q5 => 22_140.0,
        Query::Q7 => 12_330.0,
        Query::Q8 => 146_140.0,
        Query::Q9 => 14_240.0,
        Query::Q11 => 39_700.0,
    }
}

/// The file of `kind` in a data directory.
pub fn file_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Person => "persons.csv",
        Kind::Auction => "auctions.csv",
        Kind::Bid => "bids.csv",
    }
}

/// Writes the three files of the first `events` events into `dir` (skipped when a
/// `done-<events>` marker says they are there).
///
/// # Errors
/// I/O errors, naming the file.
pub fn generate(events: u64, dir: &Path) -> Result<()> {
    use std::io::Write;
    let marker = dir.join(format!("done-{events}"));
    if marker.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut files = Vec::new();
    for kind in [Kind::Person, Kind::Auction, Kind::Bid] {
        let path = dir.join(file_name(kind));
        let mut f = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?,
        );
        writeln!(f, "#{}", csv::fields(kind).join(","))?;
        files.push((path, f));
    }
    let c = Config::default();
    let mut line = String::new();
    for i in 0..events {
        let e = event(&c, i);
        line.clear();
        csv::write(&e, &mut line);
        line.push('\n');
        let slot = match e {
            Event::Person(_) => 0,
            Event::Auction(_) => 1,
            Event::Bid(_) => 2,
        };
        files[slot].1.write_all(line.as_bytes())?;
    }
    for (path, mut f) in files {
        f.flush()
            .with_context(|| format!("write {}", path.display()))?;
    }
    std::fs::write(&marker, b"")?;
    Ok(())
}

/// The bench job of `q`: the example with file-sources over `data`, a blackhole sink
/// whose summaries go to the output directory, parallelism 1, checkpoints every second.
///
/// # Errors
/// The example file is missing or not of the expected shape.
pub fn job_text(repo: &Path, q: Query, data: &Path) -> Result<String> {
    let path = repo.join(format!("examples/nexmark/{}.toml", q.name()));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut out = String::new();
    let mut sources = 0;
    let mut in_source = false;
    for line in text.lines() {
        if line.starts_with("[[") {
            in_source = line == "[[source]]";
        }
        if line == "plugin = \"nexmark-source@0.1.0\"" {
            out.push_str("plugin = \"file-source@0.1.0\"\n");
            out.push_str(&format!(
                "grants = [{{ guest = \"/input\", host = \"{}\" }}]\n",
                data.display()
            ));
            sources += 1;
        } else if let Some(rest) = line
            .strip_prefix("config = { kind = \"")
            .filter(|_| in_source)
        {
            let kind = rest.split('"').next().unwrap_or_default();
            let kind = Kind::parse(kind).with_context(|| format!("{}: {line}", path.display()))?;
            out.push_str(&format!(
                "config = {{ path = \"/input/{}\", format = \"csv\", header = true, event_time = {{ column = \"date_time\", format = \"epoch-ms\" }} }}\n",
                file_name(kind)
            ));
        } else if line == "plugin = \"jsonl-sink@0.1.0\"" {
            out.push_str("plugin = \"blackhole-sink@0.1.0\"\n");
        } else if line.starts_with("config = { dir = \"/output\"") {
            out.push_str("config = { summary_dir = \"/output\" }\n");
        } else if line == "parallelism = 2" {
            out.push_str("parallelism = 1\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    ensure!(
        sources > 0,
        "{}: no nexmark-source to replace",
        path.display()
    );
    Ok(out)
}

/// What one floor run computed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FloorOut {
    /// Events of the files read (all kinds the query reads).
    pub lines: u64,
    /// The output's count and checksum.
    pub output: OutputSummary,
    /// Seconds from the first read to the last output line.
    pub seconds: f64,
}

/// One floor run: reads the files `q` needs from `data`, parses them, runs the plain-Rust
/// query, summarises the output. q0–q2 stream the bids file line by line without
/// building events; the others parse every line into an event (owned strings) first, then
/// run `nexmark_model::queries` over them.
///
/// # Errors
/// I/O or a line that does not parse, naming the file.
pub fn floor(q: Query, data: &Path) -> Result<FloorOut> {
    let t = std::time::Instant::now();
    if matches!(q, Query::Q0 | Query::Q1 | Query::Q2) {
        return stateless_floor(q, data, t);
    }
    let (wp, wa, wb) = q.inputs();
    let mut lines = 0;
    let mut read = |kind: Kind, want: bool| -> Result<Vec<Event>> {
        if !want {
            return Ok(Vec::new());
        }
        let path = data.join(file_name(kind));
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let mut v = Vec::new();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            v.push(csv::parse(kind, l).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?);
            lines += 1;
        }
        Ok(v)
    };
    let persons: Vec<_> = read(Kind::Person, wp)?
        .into_iter()
        .filter_map(|e| {
            if let Event::Person(p) = e {
                Some(p)
            } else {
                None
            }
        })
        .collect();
    let auctions: Vec<_> = read(Kind::Auction, wa)?
        .into_iter()
        .filter_map(|e| {
            if let Event::Auction(a) = e {
                Some(a)
            } else {
                None
            }
        })
        .collect();
    let bids: Vec<_> = read(Kind::Bid, wb)?
        .into_iter()
        .filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None })
        .collect();
    let mut s = blackhole_sink::Summary::default();
    for l in q.run(&persons, &auctions, &bids) {
        s.add(l.as_bytes());
    }
    Ok(FloorOut {
        lines,
        output: OutputSummary {
            records: s.records,
            bytes: s.bytes,
            checksum: s.checksum,
        },
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// The stateless queries' floor without building events: each bid line is split in
/// place and its output line written into one reused buffer (what a hand-written native
/// q0, q1 or q2 does).
fn stateless_floor(q: Query, data: &Path, t: std::time::Instant) -> Result<FloorOut> {
    use std::io::BufRead;
    let path = data.join(file_name(Kind::Bid));
    let f = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
    let mut r = std::io::BufReader::with_capacity(1 << 20, f);
    let mut line = String::new();
    let mut out = String::new();
    let mut s = blackhole_sink::Summary::default();
    let mut lines = 0;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end_matches('\n');
        if l.starts_with('#') {
            continue;
        }
        lines += 1;
        let mut c = [""; 7];
        for (slot, f) in c.iter_mut().zip(l.split(',')) {
            *slot = f;
        }
        out.clear();
        match q {
            Query::Q0 => {
                for (i, f) in [c[0], c[1], c[2], c[5], c[6]].iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(f);
                }
            }
            Query::Q1 => {
                let price: i64 = c[2]
                    .parse()
                    .with_context(|| format!("{}: {l}", path.display()))?;
                out.push_str(c[0]);
                out.push(',');
                out.push_str(c[1]);
                out.push(',');
                csv::write_euro(price, &mut out);
                out.push(',');
                out.push_str(c[5]);
                out.push(',');
                out.push_str(c[6]);
            }
            _ => {
                let auction: i64 = c[0]
                    .parse()
                    .with_context(|| format!("{}: {l}", path.display()))?;
                if auction % 123 != 0 {
                    continue;
                }
                out.push_str(c[0]);
                out.push(',');
                out.push_str(c[2]);
            }
        }
        s.add(out.as_bytes());
    }
    Ok(FloorOut {
        lines,
        output: OutputSummary {
            records: s.records,
            bytes: s.bytes,
            checksum: s.checksum,
        },
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// What the `nexmark` command runs.
#[derive(Debug)]
pub struct Options {
    /// Sizes (events), ascending: the first is the reported one; a second gives Flink's
    /// marginal rate.
    pub sizes: Vec<u64>,
    /// Measured runs per engine, query and size (median reported).
    pub runs: usize,
    /// Queries.
    pub queries: Vec<Query>,
    /// The `nopstream` binary.
    pub nopstream: PathBuf,
    /// Python of a virtualenv with `apache-flink`, or `None`: no Flink.
    pub flink_python: Option<PathBuf>,
    /// The Flink script.
    pub flink_script: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// The repository root (examples).
    pub repo: PathBuf,
}

/// Per size: its events, and nop-stream's, the floor's and Flink's samples.
type SizeSamples = (u64, Vec<Sample>, Vec<Sample>, Vec<Sample>);

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Sample {
    wall_s: f64,
    cpu_s: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

#[derive(Deserialize)]
struct WallTime {
    secs: u64,
    nanos: u32,
}

#[derive(Deserialize)]
struct JobReport {
    wall: WallTime,
}

fn nopstream_once(o: &Options, job: &Path, run_dir: &Path) -> Result<(Sample, OutputSummary)> {
    if run_dir.exists() {
        std::fs::remove_dir_all(run_dir)?;
    }
    let mut cmd = Command::new(&o.nopstream);
    cmd.arg("run")
        .arg(job)
        .args(["--json", "--no-progress", "--no-echo", "--output"])
        .arg(run_dir.join("output"))
        .arg("--work-dir")
        .arg(run_dir.join("work"));
    let child = measure::run(cmd)?;
    let report: JobReport = serde_json::from_str(&child.stdout).with_context(|| {
        format!(
            "nopstream --json printed {:?} {}",
            child.stdout, child.stderr
        )
    })?;
    let out = crate::committed_output(&run_dir.join("output"))?
        .context("the blackhole sink committed no summary")?;
    Ok((
        Sample {
            wall_s: report.wall.secs as f64 + f64::from(report.wall.nanos) / 1e9,
            cpu_s: child.cpu_s,
        },
        out,
    ))
}

fn floor_once(q: Query, data: &Path) -> Result<(Sample, FloorOut)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["nexmark-floor", "--query", q.name(), "--data"])
        .arg(data);
    let child = measure::run(cmd)?;
    let r: FloorOut = serde_json::from_str(&child.stdout)
        .with_context(|| format!("nexmark-floor printed {:?}", child.stdout))?;
    Ok((
        Sample {
            wall_s: r.seconds,
            cpu_s: child.cpu_s,
        },
        r,
    ))
}

fn flink_once(
    o: &Options,
    python: &Path,
    q: Query,
    data: &Path,
    count_dir: Option<&Path>,
) -> Result<(Sample, Option<u64>)> {
    let mut cmd = Command::new(python);
    cmd.arg(&o.flink_script)
        .env("Q", q.name())
        .env("DATA", data)
        .env("PAR", "1")
        .env("CKPT_MS", "1000")
        .current_dir(&o.out);
    if let Some(d) = count_dir {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        cmd.env("OUT", d);
    }
    let child = measure::run(cmd)?;
    let f = |p: &str, k: &str| crate::field(&child.stdout, p, k);
    let job_s = f("RESULT", "job_s")
        .with_context(|| format!("flink printed {}{}", child.stdout, child.stderr))?;
    let cpu = f("JVMCPU", "jvm_cpu_s").unwrap_or(0.0) + child.cpu_s;
    let rows = count_dir.map(crate::flink_check::rows).transpose()?;
    Ok((
        Sample {
            wall_s: job_s,
            cpu_s: cpu,
        },
        rows,
    ))
}

/// One line of the table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    /// Query.
    pub query: String,
    /// Events.
    pub events: u64,
    /// nop-stream events per second (median of the runs; job wall time).
    pub events_per_s: f64,
    /// nop-stream events per CPU-second (process, median).
    pub events_per_cpu_s: f64,
    /// The floor's events per CPU-second.
    pub floor_per_cpu_s: f64,
    /// Flink's events per CPU-second measured here (marginal over the sizes if two).
    pub flink_per_cpu_s: Option<f64>,
    /// Whether `flink_per_cpu_s` is marginal.
    pub flink_marginal: bool,
    /// Output records at the first size (nop-stream = floor).
    pub output_records: u64,
    /// Flink's output rows at the first size, when counted.
    pub flink_rows: Option<u64>,
}

/// Runs the suite and prints the table; writes `nexmark.json` into the output directory.
///
/// # Errors
/// `--runs 0`, a failed run, nop-stream's output differing from the floor's, or Flink's
/// row count differing from it.
pub fn run(o: &Options) -> Result<()> {
    ensure!(
        o.runs >= 1,
        "--runs 0 measures nothing: the first round of each size is an unmeasured warm-up"
    );
    let mut lines = Vec::new();
    for &q in &o.queries {
        // Per size: nop-stream, floor and Flink samples, interleaved per round.
        let mut per_size: Vec<SizeSamples> = Vec::new();
        let mut output_records = 0;
        let mut flink_rows = None;
        for &events in &o.sizes {
            let data = o.out.join(format!("nexmark/data-{events}"));
            generate(events, &data)?;
            let jobs = o.out.join("nexmark/jobs");
            std::fs::create_dir_all(&jobs)?;
            let job = jobs.join(format!("{}-{events}.toml", q.name()));
            std::fs::write(&job, job_text(&o.repo, q, &data)?)?;
            let run_dir = o.out.join(format!("nexmark/runs/{}-{events}", q.name()));
            let (mut nop, mut fl, mut fk) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..=o.runs {
                let (s, got) = nopstream_once(o, &job, &run_dir)?;
                let (f, want) = floor_once(q, &data)?;
                ensure!(
                    got == want.output,
                    "{} at {events} events: nop-stream committed {got:?}, the floor computed {:?}",
                    q.name(),
                    want.output
                );
                if events == o.sizes[0] {
                    // The table's row is the first size's, as is Flink's counted output.
                    output_records = want.output.records;
                }
                let k = match &o.flink_python {
                    Some(py) => {
                        let count = (round == 0
                            && events == o.sizes[0]
                            && !matches!(q, Query::Q4 | Query::Q9))
                        .then(|| o.out.join(format!("nexmark/flink-out/{}", q.name())));
                        let (k, rows) = flink_once(o, py, q, &data, count.as_deref())?;
                        if count.is_some() {
                            // An append-only query's rows: Flink must write as many as the
                            // floor computes (q4 and q9 emit updates and are not counted).
                            ensure!(
                                rows == Some(want.output.records),
                                "{} at {events} events: Flink wrote {rows:?} rows, the floor computed {}",
                                q.name(),
                                want.output.records
                            );
                            flink_rows = rows;
                        }
                        Some(k)
                    }
                    None => None,
                };
                eprintln!(
                    "   {} {events} round {round}: nop-stream {:.3} s / {:.2} CPU s, floor {:.3} s / {:.2} CPU s{}",
                    q.name(),
                    s.wall_s,
                    s.cpu_s,
                    f.wall_s,
                    f.cpu_s,
                    k.map_or(String::new(), |k| format!(
                        ", flink {:.2} s / {:.2} CPU s",
                        k.wall_s, k.cpu_s
                    ))
                );
                if round > 0 {
                    nop.push(s);
                    fl.push(f);
                    if let Some(k) = k {
                        fk.push(k);
                    }
                }
            }
            per_size.push((events, nop, fl, fk));
        }
        let (events, nop, fl, fk) = &per_size[0];
        let ev = *events as f64;
        let mut walls: Vec<f64> = nop.iter().map(|s| s.wall_s).collect();
        let mut cpus: Vec<f64> = nop.iter().map(|s| s.cpu_s).collect();
        let mut fcpus: Vec<f64> = fl.iter().map(|s| s.cpu_s).collect();
        let (flink_per_cpu_s, flink_marginal) = if fk.is_empty() {
            (None, false)
        } else if per_size.len() > 1 {
            let (e2, _, _, fk2) = &per_size[1];
            let c1 = median(&mut fk.iter().map(|s| s.cpu_s).collect::<Vec<_>>());
            let c2 = median(&mut fk2.iter().map(|s| s.cpu_s).collect::<Vec<_>>());
            ((c2 > c1).then(|| (*e2 - *events) as f64 / (c2 - c1)), true)
        } else {
            (
                Some(ev / median(&mut fk.iter().map(|s| s.cpu_s).collect::<Vec<_>>())),
                false,
            )
        };
        lines.push(Line {
            query: q.name().into(),
            events: *events,
            events_per_s: ev / median(&mut walls),
            events_per_cpu_s: ev / median(&mut cpus),
            floor_per_cpu_s: ev / median(&mut fcpus),
            flink_per_cpu_s,
            flink_marginal,
            output_records,
            flink_rows,
        });
    }
    print_table(&lines);
    std::fs::write(
        o.out.join("nexmark.json"),
        serde_json::to_vec_pretty(&lines)?,
    )?;
    Ok(())
}

fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn print_table(lines: &[Line]) {
    println!(
        "| query | events | events/s | events per CPU-s | floor per CPU-s | ÷ floor | target ÷ floor | Flink per CPU-s (here) | ÷ Flink | Flink 1.13 per core (published) | output records (Flink) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for l in lines {
        let q = Query::parse(&l.query).expect("a query name");
        let target = if matches!(q, Query::Q0 | Query::Q1 | Query::Q2) {
            0.5
        } else {
            0.2
        };
        let ratio = l.events_per_cpu_s / l.floor_per_cpu_s;
        let (flink, vs) = match l.flink_per_cpu_s {
            Some(f) => (
                format!(
                    "{}{}",
                    si(f),
                    if l.flink_marginal { " (marginal)" } else { "" }
                ),
                format!("{:.1}×", l.events_per_cpu_s / f),
            ),
            None => ("–".into(), "–".into()),
        };
        println!(
            "| {} | {} | {} | {} | {} | {ratio:.2} | ≥ {target} ({}) | {flink} | {vs} | {} | {}{} |",
            l.query,
            si(l.events as f64),
            si(l.events_per_s),
            si(l.events_per_cpu_s),
            si(l.floor_per_cpu_s),
            if ratio >= target { "meets" } else { "misses" },
            si(flink_published_per_core(q)),
            l.output_records,
            l.flink_rows.map_or(String::new(), |r| format!(" ({r})")),
        );
    }
}

/// Parses a comma-separated query list (`q0,q3`; empty: all).
///
/// # Errors
/// An unknown query name.
pub fn parse_queries(names: &[String]) -> Result<Vec<Query>> {
    if names.is_empty() {
        return Ok(Query::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| match Query::parse(n) {
            Some(q) => Ok(q),
            None => bail!("unknown query `{n}`; known: q0 q1 q2 q3 q4 q5 q7 q8 q9 q11"),
        })
        .collect()
}
