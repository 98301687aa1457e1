//! Results: the measured runs, their statistics, the ratios between engines, and the
//! table, CSV, JSON and SVG renderings of one results set.
//!
//! Every figure is computed from the runs stored in [`Results`]; nothing is typed in.
//! Throughput is records of input per second, two ways:
//! - **end-to-end**: input records ÷ process wall time (start-up, plugin load, planning,
//!   run, shutdown — what a user waits for);
//! - **steady-state**: input records ÷ time of the processing itself (nop-stream: the job
//!   run as its report's `wall`, excluding process start, plugin load/compile and
//!   planning; floor: its processing loop; Flink: `job_s`, submission to completion).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// Engine names as they appear in the table.
pub const NOP_STREAM: &str = "nop-stream";
/// The native floor.
pub const FLOOR: &str = "floor";
/// The Flink peer.
pub const FLINK: &str = "flink";

/// One measured run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Process wall time, seconds.
    pub e2e_s: f64,
    /// Steady-state time, seconds (see the module docs).
    pub steady_s: f64,
    /// CPU seconds (user + system) of the process and its waited-for children.
    pub cpu_s: f64,
    /// Peak resident set size, MiB.
    pub max_rss_mib: f64,
    /// CPU seconds per thread name, busiest first (nop-stream runs; empty for the others
    /// and in results written before it was measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<crate::measure::ThreadCpu>,
    /// Durable epochs of a checkpointing nop-stream run, the final one included (`None`
    /// for other runs and in results written before it was recorded). A run shorter than
    /// its checkpoint interval takes only the final epoch, so its figures carry no
    /// periodic checkpoint ([`TargetLine::caveat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
}

/// All runs of one workload on one engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Workload name.
    pub workload: String,
    /// Engine name ([`NOP_STREAM`], [`FLOOR`], [`FLINK`]).
    pub engine: String,
    /// Input file name.
    pub input: String,
    /// Input records per run.
    pub records: u64,
    /// Runs, in order.
    pub runs: Vec<Run>,
    /// Free-form note (parallelism, checks passed).
    pub note: String,
}

impl Row {
    /// A caveat when this row's runs recorded their epochs and the median run took fewer
    /// than [`MIN_PERIODIC_CHECKPOINTS`] periodic ones (its durable epochs, the final one
    /// left out): its figures do not carry the exactly-once cost the targets judge.
    pub fn no_periodic_checkpoint(&self) -> Option<String> {
        let epochs: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.epochs.map(|e| e as f64))
            .collect();
        if epochs.is_empty() {
            return None;
        }
        let median = Stat::of(epochs).median;
        (median < MIN_PERIODIC_CHECKPOINTS as f64 + 1.0).then(|| {
            format!(
                "{} on {}: the median run took {} durable epoch(s), the final one included: \
             fewer than {MIN_PERIODIC_CHECKPOINTS} periodic checkpoints, so these figures do \
             not carry the checkpoint cost and its target lines are not measured. \
             `nopstream-bench checkpoint-cost` measures it on an input long enough for \
             several.",
                self.workload, self.input, median
            )
        })
    }
}

/// Periodic checkpoints the median run of a checkpointing row must take for its target
/// lines to be judged.
pub const MIN_PERIODIC_CHECKPOINTS: usize = 5;

/// Median, minimum and maximum.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Stat {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
}

impl Stat {
    /// Statistics of `values`; all zero if empty.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() {
            return Stat {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stat {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// Derived figures of a [`Row`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// End-to-end records/s.
    pub e2e_rps: Stat,
    /// Steady-state records/s.
    pub steady_rps: Stat,
    /// CPU seconds per run.
    pub cpu_s: Stat,
    /// Peak RSS MiB per run.
    pub max_rss_mib: Stat,
}

impl Row {
    /// The row's statistics.
    pub fn summary(&self) -> Summary {
        let r = self.records as f64;
        Summary {
            e2e_rps: Stat::of(self.runs.iter().map(|x| r / x.e2e_s)),
            steady_rps: Stat::of(self.runs.iter().map(|x| r / x.steady_s)),
            cpu_s: Stat::of(self.runs.iter().map(|x| x.cpu_s)),
            max_rss_mib: Stat::of(self.runs.iter().map(|x| x.max_rss_mib)),
        }
    }
}

/// A results set: when, where and how it was measured, and the rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    /// UTC date and time of the run.
    pub date: String,
    /// Machine description (cores, CPU model).
    pub machine: String,
    /// The command line that produced the nop-stream and floor rows.
    pub command: String,
    /// Rows, in table order.
    pub rows: Vec<Row>,
}

/// Ratios of nop-stream to another engine on one workload (median over median).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ratio {
    /// Workload name.
    pub workload: String,
    /// Input file name.
    pub input: String,
    /// The other engine.
    pub versus: String,
    /// nop-stream steady-state ÷ other steady-state.
    pub steady: f64,
    /// nop-stream end-to-end ÷ other end-to-end.
    pub e2e: f64,
    /// nop-stream records per CPU-second ÷ the other's (design §20): the pipeline
    /// runs stages on several threads, so wall-time ratios against a one-thread floor
    /// flatter it.
    pub per_cpu: f64,
    /// For Flink: whether `steady` and `per_cpu` use its marginal rate between the 1M and
    /// 10M inputs ([`Results::flink_marginal`]), so its start-up drops out.
    #[serde(default)]
    pub marginal: bool,
}

/// Flink's marginal rate on a workload between two input sizes run in the same session:
/// `(records_big − records_small) ÷ (time_big − time_small)` on the median process wall
/// times, and the same over CPU seconds. Its ~10 s start-up is in both runs and cancels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Marginal {
    /// Records per second.
    pub rps: f64,
    /// Records per CPU-second.
    pub per_cpu: f64,
}

/// One line of the targets table: a measured ratio against design §20's target.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetLine {
    /// What is measured, e.g. `count-ckpt ÷ floor (steady)`.
    pub what: String,
    /// The input.
    pub input: String,
    /// The measured value.
    pub measured: f64,
    /// The target.
    pub target: f64,
    /// Whether larger is better (ratios) or smaller (overheads).
    pub higher_is_better: bool,
    /// Why the figure does not measure what the target is about, when it does not: a
    /// `count-ckpt` whose runs ended before their first periodic checkpoint (only the
    /// final epoch) measures no checkpoint cost. A ratio keeps its verdict with the
    /// caveat beside it; the checkpoint overhead line is then "not measured".
    pub caveat: Option<String>,
}

impl TargetLine {
    /// Whether the measured value meets the target.
    pub fn meets(&self) -> bool {
        if self.higher_is_better {
            self.measured >= self.target
        } else {
            self.measured <= self.target
        }
    }
}

/// The performance targets (design §20): (workload, versus, measure, target). `measure` is `steady` (wall
/// time) or `per-cpu`; [`CKPT_CPU_OVERHEAD`] is checked separately.
pub const TARGETS: &[(&str, &str, &str, f64)] = &[
    ("count-ckpt", FLOOR, "steady", 0.5),
    ("count-ckpt", FLOOR, "per-cpu", 1.0 / 3.0),
    ("count-ckpt", FLINK, "steady", 5.0),
    ("q5", FLOOR, "steady", 0.25),
    ("q5", FLINK, "steady", 5.0),
    ("cep", FLOOR, "steady", 0.125),
    ("cep", FLINK, "steady", 5.0),
    ("q0", FLOOR, "steady", 0.5),
];

/// The checkpoint-cost target (design §20): CPU seconds of the keyed count with 1 s checkpoints over without, at
/// most this much more.
pub const CKPT_CPU_OVERHEAD: f64 = 0.05;

/// The scaling target (design §20): records per CPU-second of `count-ckpt` at p=N at least this share of
/// p=1's ("within 10 %").
pub const SCALING_EFFICIENCY: f64 = 0.90;

/// The engine name of nop-stream's rows at parallelism `p` beside the p=1 ones
/// (`nopstream-bench run --scaling p`): `nop-stream -p 2`.
pub fn scaled_engine(p: u32) -> String {
    format!("{NOP_STREAM} -p {p}")
}

impl Results {
    fn row(&self, workload: &str, input: &str, engine: &str) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.workload == workload && r.input == input && r.engine == engine)
    }

    /// Replaces the row of the same (workload, input, engine), or appends `row`.
    pub fn upsert(&mut self, row: Row) {
        match self
            .rows
            .iter_mut()
            .find(|r| r.workload == row.workload && r.input == row.input && r.engine == row.engine)
        {
            Some(r) => *r = row,
            None => self.rows.push(row),
        }
    }

    /// Flink's [`Marginal`] rate on `workload` between its smallest and largest bids
    /// inputs, when it ran on two sizes.
    pub fn flink_marginal(&self, workload: &str) -> Option<Marginal> {
        let mut rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.engine == FLINK && r.workload == workload && !r.runs.is_empty())
            .collect();
        rows.sort_by_key(|r| r.records);
        let (small, big) = (rows.first()?, rows.last()?);
        if big.records <= small.records {
            return None;
        }
        let med = |r: &Row, f: fn(&Run) -> f64| Stat::of(r.runs.iter().map(f)).median;
        let dr = (big.records - small.records) as f64;
        let dt = med(big, |x| x.e2e_s) - med(small, |x| x.e2e_s);
        let dc = med(big, |x| x.cpu_s) - med(small, |x| x.cpu_s);
        (dt > 0.0 && dc > 0.0).then(|| Marginal {
            rps: dr / dt,
            per_cpu: dr / dc,
        })
    }

    /// nop-stream ÷ floor and nop-stream ÷ Flink, wherever both rows exist; against
    /// Flink, steady and per-CPU use its marginal rate when it ran on two input sizes.
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut out = Vec::new();
        for n in self.rows.iter().filter(|r| r.engine == NOP_STREAM) {
            let ns = n.summary();
            let n_per_cpu = n.records as f64 / ns.cpu_s.median;
            for other in [FLOOR, FLINK] {
                // count-ckpt is measured against Flink's count with checkpoints under its
                // own name when it ran, else against the plain workload's.
                let marginal = if other == FLINK {
                    self.flink_marginal(&n.workload)
                        .or_else(|| self.flink_marginal(n.workload.trim_end_matches("-ckpt")))
                } else {
                    None
                };
                if let Some(o) = self.row(&n.workload, &n.input, other) {
                    let os = o.summary();
                    let o_per_cpu = o.records as f64 / os.cpu_s.median;
                    out.push(Ratio {
                        workload: n.workload.clone(),
                        input: n.input.clone(),
                        versus: other.into(),
                        steady: ns.steady_rps.median
                            / marginal.map_or(os.steady_rps.median, |m| m.rps),
                        e2e: ns.e2e_rps.median / os.e2e_rps.median,
                        per_cpu: n_per_cpu / marginal.map_or(o_per_cpu, |m| m.per_cpu),
                        marginal: marginal.is_some(),
                    });
                } else if let Some(m) = marginal {
                    // Flink ran on other input sizes only: its marginal rate still stands.
                    out.push(Ratio {
                        workload: n.workload.clone(),
                        input: n.input.clone(),
                        versus: other.into(),
                        steady: ns.steady_rps.median / m.rps,
                        e2e: f64::NAN,
                        per_cpu: n_per_cpu / m.per_cpu,
                        marginal: true,
                    });
                }
            }
        }
        out
    }

    /// Every target of [`TARGETS`] that the rows allow to measure, per input, and the
    /// checkpoint CPU overhead (`count-ckpt` ÷ `count` CPU seconds − 1, same input).
    pub fn targets(&self) -> Vec<TargetLine> {
        let mut out = Vec::new();
        let ratios = self.ratios();
        let caveat = |workload: &str, input: &str| {
            self.row(workload, input, NOP_STREAM)
                .and_then(Row::no_periodic_checkpoint)
        };
        for (workload, versus, measure, target) in TARGETS {
            for r in ratios
                .iter()
                .filter(|r| r.workload == *workload && r.versus == *versus)
            {
                let measured = if *measure == "per-cpu" {
                    r.per_cpu
                } else {
                    r.steady
                };
                out.push(TargetLine {
                    what: format!("{workload} ÷ {versus} ({measure})"),
                    input: r.input.clone(),
                    measured,
                    target: *target,
                    higher_is_better: true,
                    caveat: caveat(workload, &r.input),
                });
            }
        }
        for scaled in self
            .rows
            .iter()
            .filter(|r| r.engine.starts_with(&format!("{NOP_STREAM} -p ")))
        {
            if let Some(base) = self.row(&scaled.workload, &scaled.input, NOP_STREAM) {
                let per_cpu = |r: &Row| r.records as f64 / r.summary().cpu_s.median;
                out.push(TargetLine {
                    what: format!(
                        "{} records per CPU-second, {} ÷ p=1",
                        scaled.workload,
                        scaled.engine.trim_start_matches(NOP_STREAM).trim()
                    ),
                    input: scaled.input.clone(),
                    measured: per_cpu(scaled) / per_cpu(base),
                    target: SCALING_EFFICIENCY,
                    higher_is_better: true,
                    caveat: base.no_periodic_checkpoint(),
                });
            }
        }
        for c in self
            .rows
            .iter()
            .filter(|r| r.engine == NOP_STREAM && r.workload == "count-ckpt")
        {
            if let Some(u) = self.row("count", &c.input, NOP_STREAM) {
                out.push(TargetLine {
                    what: "checkpoint CPU overhead (count-ckpt ÷ count − 1)".into(),
                    input: c.input.clone(),
                    measured: c.summary().cpu_s.median / u.summary().cpu_s.median - 1.0,
                    target: CKPT_CPU_OVERHEAD,
                    higher_is_better: false,
                    caveat: c.no_periodic_checkpoint(),
                });
            }
        }
        out
    }

    /// The targets as a Markdown table: measured, target, and whether it meets it or by
    /// how much it misses.
    pub fn targets_table(&self) -> String {
        let lines = self.targets();
        if lines.is_empty() {
            return String::new();
        }
        let mut t = String::from(
            "| target | input | measured | target | verdict |\n|---|---|---|---|---|\n",
        );
        let mut caveats = Vec::new();
        for l in lines {
            if let Some(c) = &l.caveat
                && !caveats.contains(c)
            {
                caveats.push(c.clone());
            }
            let verdict = if l.caveat.is_some() {
                format!(
                    "not measured: fewer than {MIN_PERIODIC_CHECKPOINTS} periodic checkpoints \
                     (see below)"
                )
            } else if l.meets() {
                "meets".to_owned()
            } else if l.higher_is_better {
                format!(
                    "misses: {:.0} % of the target",
                    100.0 * l.measured / l.target
                )
            } else {
                format!("misses by {:+.1} points", 100.0 * (l.measured - l.target))
            };
            let (m, tg) = if l.higher_is_better {
                (format!("{:.2}", l.measured), format!("≥ {:.2}", l.target))
            } else {
                (
                    format!("{:+.1} %", 100.0 * l.measured),
                    format!("≤ {:.0} %", 100.0 * l.target),
                )
            };
            let _ = writeln!(t, "| {} | {} | {m} | {tg} | {verdict} |", l.what, l.input);
        }
        for c in caveats {
            let _ = write!(t, "\n{c}\n");
        }
        t
    }

    /// For each nop-stream row with per-thread CPU: the threads of the run with the
    /// median CPU seconds, as a Markdown table (empty if no row has them).
    pub fn threads_table(&self) -> String {
        let mut t = String::new();
        for row in self
            .rows
            .iter()
            .filter(|r| r.engine.starts_with(NOP_STREAM))
        {
            let mut runs: Vec<&Run> = row.runs.iter().filter(|r| !r.threads.is_empty()).collect();
            if runs.is_empty() {
                continue;
            }
            runs.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s));
            let median = runs[runs.len() / 2];
            if t.is_empty() {
                t.push_str("| workload | input | CPU s | threads, CPU s |\n|---|---|---|---|\n");
            }
            let _ = writeln!(
                t,
                "| {}{} | {} | {:.2} | {} |",
                row.workload,
                match row.engine.strip_prefix(NOP_STREAM) {
                    Some(p) if !p.is_empty() => format!(" ({})", p.trim()),
                    _ => String::new(),
                },
                row.input,
                median.cpu_s,
                threads_line(&median.threads, 4)
            );
        }
        t
    }

    fn ratio(&self, workload: &str, input: &str, versus: &str) -> Option<Ratio> {
        self.ratios()
            .into_iter()
            .find(|r| r.workload == workload && r.input == input && r.versus == versus)
    }

    /// The table as Markdown (also what the terminal shows).
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "| workload | input | engine | runs | steady rec/s median [min – max] | end-to-end rec/s median [min – max] | CPU s | peak RSS MiB | ÷ floor (steady / e2e / per CPU-s) | ÷ Flink (steady / e2e / per CPU-s) |"
        );
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let s = r.summary();
            let ratio = |versus: &str| {
                if r.engine != NOP_STREAM {
                    return String::new();
                }
                self.ratio(&r.workload, &r.input, versus)
                    .map(|x| {
                        format!(
                            "{:.2}{} / {} / {:.2}",
                            x.steady,
                            if x.marginal { " (marginal)" } else { "" },
                            if x.e2e.is_nan() {
                                "–".to_owned()
                            } else {
                                format!("{:.2}", x.e2e)
                            },
                            x.per_cpu
                        )
                    })
                    .unwrap_or_else(|| "–".into())
            };
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} [{} – {}] | {} [{} – {}] | {:.2} | {:.0} | {} | {} |",
                r.workload,
                r.input,
                r.engine,
                r.runs.len(),
                human(s.steady_rps.median),
                human(s.steady_rps.min),
                human(s.steady_rps.max),
                human(s.e2e_rps.median),
                human(s.e2e_rps.min),
                human(s.e2e_rps.max),
                s.cpu_s.median,
                s.max_rss_mib.max,
                ratio(FLOOR),
                ratio(FLINK),
            );
        }
        // Checkpointed ÷ unchecked: `<w>-ckpt` against `<w>`, same engine and input.
        for r in self.rows.iter().filter(|r| r.workload.ends_with("-ckpt")) {
            let base = r.workload.trim_end_matches("-ckpt");
            if let Some(b) = self.row(base, &r.input, &r.engine) {
                let (c, u) = (r.summary(), b.summary());
                let _ = writeln!(
                    t,
                    "\ncheckpointed ÷ unchecked, {} on {}: {:.2} steady / {:.2} end-to-end / {:.3} CPU seconds ({} ÷ {}){}",
                    r.engine,
                    r.input,
                    c.steady_rps.median / u.steady_rps.median,
                    c.e2e_rps.median / u.e2e_rps.median,
                    c.cpu_s.median / u.cpu_s.median,
                    r.workload,
                    base,
                    if r.no_periodic_checkpoint().is_some() {
                        "; no periodic checkpoint in these runs, so this is noise"
                    } else {
                        ""
                    }
                );
            }
        }
        let threads = self.threads_table();
        if !threads.is_empty() {
            let _ = write!(
                t,
                "\nnop-stream's busiest threads (the run with the median CPU seconds; a task thread is `{{head operator}}#{{subtask}}`):\n\n{threads}"
            );
        }
        let targets = self.targets_table();
        if !targets.is_empty() {
            let _ = write!(
                t,
                "\nTargets (ratios of medians; Flink by its marginal rate where it ran on two sizes):\n\n{targets}"
            );
        }
        t
    }

    /// Writes `results.json`, `results.csv` and `throughput.svg` into `dir`.
    ///
    /// # Errors
    /// I/O failures.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let summaries: Vec<Summary> = self.rows.iter().map(Row::summary).collect();
        let json = serde_json::json!({
            "date": self.date,
            "machine": self.machine,
            "command": self.command,
            "rows": self.rows,
            "summaries": summaries,
            "ratios": self.ratios(),
        });
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
        let mut csv = String::from(
            "workload,input,engine,records,runs,steady_rps_median,steady_rps_min,steady_rps_max,e2e_rps_median,e2e_rps_min,e2e_rps_max,cpu_s_median,max_rss_mib,ratio_floor_steady,ratio_floor_e2e,ratio_flink_steady,ratio_flink_e2e,ratio_floor_per_cpu,ratio_flink_per_cpu\n",
        );
        for r in &self.rows {
            let s = r.summary();
            let ratio = |v: &str| {
                self.ratio(&r.workload, &r.input, v)
                    .filter(|_| r.engine == NOP_STREAM)
                    .map(|x| {
                        (
                            format!("{:.4}", x.steady),
                            format!("{:.4}", x.e2e),
                            format!("{:.4}", x.per_cpu),
                        )
                    })
                    .unwrap_or_default()
            };
            let (fs, fe, fc) = ratio(FLOOR);
            let (ks, ke, kc) = ratio(FLINK);
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.3},{:.1},{fs},{fe},{ks},{ke},{fc},{kc}",
                r.workload,
                r.input,
                r.engine,
                r.records,
                r.runs.len(),
                s.steady_rps.median,
                s.steady_rps.min,
                s.steady_rps.max,
                s.e2e_rps.median,
                s.e2e_rps.min,
                s.e2e_rps.max,
                s.cpu_s.median,
                s.max_rss_mib.max,
            );
        }
        std::fs::write(dir.join("results.csv"), csv)?;
        std::fs::write(dir.join("throughput.svg"), self.svg())?;
        Ok(())
    }

    /// Grouped bars of steady-state (solid) and end-to-end (light) median throughput per
    /// workload and engine, on a log scale.
    pub fn svg(&self) -> String {
        let engines = [
            (NOP_STREAM, "#1f77b4", "#aec7e8"),
            (FLOOR, "#2ca02c", "#98df8a"),
            (FLINK, "#d62728", "#ff9896"),
        ];
        let mut groups: Vec<(String, String)> = Vec::new();
        for r in &self.rows {
            let g = (r.workload.clone(), r.input.clone());
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        let max = self
            .rows
            .iter()
            .map(|r| r.summary().steady_rps.max.max(r.summary().e2e_rps.max))
            .fold(1.0f64, f64::max);
        let (lo, hi) = (4.0f64, max.log10().ceil().max(5.0));
        let (w, h, left, top, bottom) = (980.0, 460.0, 70.0, 50.0, 80.0);
        let plot_h = h - top - bottom;
        let group_w = (w - left - 20.0) / groups.len().max(1) as f64;
        let bar_w = group_w / 8.0;
        let y =
            |v: f64| top + plot_h * (1.0 - ((v.max(1.0).log10() - lo) / (hi - lo)).clamp(0.0, 1.0));
        let mut s = format!(
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{left}" y="22" font-size="15">Throughput per workload, records/s (log scale; solid: steady-state, light: end-to-end; median)</text>
<text x="{left}" y="40" fill="#555">{} — {}</text>
"##,
            esc(&self.date),
            esc(&self.machine)
        );
        let mut decade = lo;
        while decade <= hi {
            let yy = y(10f64.powf(decade));
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                w - 20.0,
                left - 6.0,
                yy + 4.0,
                human(10f64.powf(decade))
            );
            decade += 1.0;
        }
        for (gi, (workload, input)) in groups.iter().enumerate() {
            let gx = left + gi as f64 * group_w + bar_w;
            for (ei, (engine, solid, light)) in engines.iter().enumerate() {
                let Some(r) = self.row(workload, input, engine) else {
                    continue;
                };
                let sm = r.summary();
                let x = gx + ei as f64 * 2.0 * bar_w;
                for (k, (v, color)) in [(sm.steady_rps.median, solid), (sm.e2e_rps.median, light)]
                    .into_iter()
                    .enumerate()
                {
                    let bx = x + k as f64 * bar_w;
                    let by = y(v);
                    let _ = writeln!(
                        s,
                        r#"<rect x="{bx:.1}" y="{by:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{engine} {workload} {}: {} rec/s</title></rect>"#,
                        bar_w - 1.0,
                        top + plot_h - by,
                        if k == 0 { "steady" } else { "end-to-end" },
                        human(v)
                    );
                }
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                    x + bar_w,
                    y(sm.steady_rps.median) - 4.0,
                    human(sm.steady_rps.median)
                );
            }
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555" font-size="10">{}</text>"##,
                gx + 3.0 * bar_w,
                top + plot_h + 18.0,
                esc(workload),
                gx + 3.0 * bar_w,
                top + plot_h + 32.0,
                esc(input)
            );
        }
        for (ei, (engine, solid, _)) in engines.iter().enumerate() {
            let lx = left + ei as f64 * 140.0;
            let ly = h - 22.0;
            let _ = writeln!(
                s,
                r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{solid}"/><text x="{}" y="{ly}">{engine}</text>"#,
                ly - 10.0,
                lx + 16.0
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// The first `n` threads that used at least 5 ms, as `name 0.80 · name 0.78`, then how
/// many more such threads there are (`+ 3 more`).
pub fn threads_line(threads: &[crate::measure::ThreadCpu], n: usize) -> String {
    let busy: Vec<_> = threads.iter().filter(|t| t.cpu_s >= 0.005).collect();
    let mut s = busy
        .iter()
        .take(n)
        .map(|t| format!("{} {:.2}", t.name, t.cpu_s))
        .collect::<Vec<_>>()
        .join(" · ");
    if busy.len() > n {
        let _ = write!(s, " · + {} more", busy.len() - n);
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `1234567.0` → `1.23 M`.
pub fn human(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(engine: &str, secs: &[f64]) -> Row {
        Row {
            workload: "count".into(),
            input: "bids-1m.csv".into(),
            engine: engine.into(),
            records: 1_000_000,
            runs: secs
                .iter()
                .map(|&s| Run {
                    e2e_s: s * 2.0,
                    steady_s: s,
                    cpu_s: s,
                    max_rss_mib: 10.0,
                    threads: Vec::new(),
                    epochs: None,
                })
                .collect(),
            note: String::new(),
        }
    }

    #[test]
    fn a_scaling_row_gets_its_per_cpu_ratio_to_p1_as_a_target() {
        let at = |engine: &str, cpu: [f64; 3], thread: &str| {
            let mut r = row(engine, &cpu);
            r.workload = "count-ckpt".into();
            for run in &mut r.runs {
                run.threads = vec![crate::measure::ThreadCpu {
                    name: thread.into(),
                    cpu_s: run.cpu_s,
                }];
            }
            r
        };
        let res = |p2: [f64; 3]| Results {
            rows: vec![
                at(NOP_STREAM, [1.0, 1.2, 0.9], "count#0"),
                at(&scaled_engine(2), p2, "count#1"),
            ],
            ..Results::default()
        };
        // Medians 1.0 at p=1 and 1.25 at p=2: the same records in 25 % more CPU, 0.80.
        let t = res([1.3, 1.25, 1.1]).targets_table();
        assert!(
            t.contains("| count-ckpt records per CPU-second, -p 2 ÷ p=1 | bids-1m.csv | 0.80 | ≥ 0.90 | misses: 89 % of the target |"),
            "{t}"
        );
        let t = res([1.05, 1.1, 1.0]).targets_table();
        assert!(
            t.contains("÷ p=1 | bids-1m.csv | 0.95 | ≥ 0.90 | meets |"),
            "{t}"
        );
        // Its threads are listed under its own label; no ratio against the floor is made
        // for it, and without a p=1 row there is no target line.
        let r = res([1.0; 3]);
        let threads = r.threads_table();
        assert!(
            threads.contains("| count-ckpt (-p 2) | bids-1m.csv | 1.00 | count#1 1.00 |"),
            "{threads}"
        );
        assert!(
            threads.contains("| count-ckpt | bids-1m.csv | 1.00 | count#0 1.00 |"),
            "{threads}"
        );
        let alone = Results {
            rows: vec![at(&scaled_engine(2), [1.0; 3], "count#1")],
            ..Results::default()
        };
        assert!(alone.targets().is_empty());
    }

    #[test]
    fn stats_ratios_and_renderings() {
        assert_eq!(Stat::of([3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(Stat::of([4.0, 1.0, 2.0, 3.0]).median, 2.5);
        let mut res = Results {
            rows: vec![row(NOP_STREAM, &[1.0, 2.0, 1.0]), row(FLOOR, &[0.25; 3])],
            ..Results::default()
        };
        let ratios = res.ratios();
        assert_eq!(ratios.len(), 1);
        assert!((ratios[0].steady - 0.25).abs() < 1e-9, "{ratios:?}");
        res.upsert(row(FLINK, &[4.0]));
        res.upsert(row(FLINK, &[2.0]));
        assert_eq!(res.rows.len(), 3);
        assert!((res.ratios()[1].steady - 2.0).abs() < 1e-9);
        let t = res.table();
        assert!(
            t.contains("| count | bids-1m.csv | nop-stream | 3 | 1.00 M"),
            "{t}"
        );
        assert!(res.svg().contains("<svg") && res.svg().ends_with("</svg>\n"));
        assert_eq!(human(1_234_567.0), "1.23 M");
    }

    #[test]
    fn a_checkpointing_run_without_a_periodic_checkpoint_is_flagged_in_the_targets() {
        let rows = |epochs: [usize; 3]| {
            let mut ckpt = row(NOP_STREAM, &[1.0, 1.0, 1.0]);
            ckpt.workload = "count-ckpt".into();
            for (r, e) in ckpt.runs.iter_mut().zip(epochs) {
                r.epochs = Some(e);
            }
            let mut floor = row(FLOOR, &[0.25; 3]);
            floor.workload = "count-ckpt".into();
            Results {
                rows: vec![ckpt, floor, row(NOP_STREAM, &[1.0; 3])],
                ..Results::default()
            }
        };
        // The median run took 4 periodic checkpoints and the final epoch: no target line
        // of the row is judged, the ratios included (they said "meets" before).
        let t = rows([5, 6, 4]).targets_table();
        assert!(
            t.contains("| count-ckpt ÷ floor (steady) | bids-1m.csv | 0.25 | ≥ 0.50 | not measured: fewer than 5 periodic checkpoints (see below) |"),
            "{t}"
        );
        assert!(
            t.contains("| checkpoint CPU overhead (count-ckpt ÷ count − 1) | bids-1m.csv | +0.0 % | ≤ 5 % | not measured: fewer than 5 periodic checkpoints (see below) |"),
            "{t}"
        );
        assert!(!t.contains("| meets |"), "{t}");
        assert_eq!(
            t.matches("fewer than 5 periodic checkpoints, so").count(),
            1,
            "{t}"
        );
        assert!(
            rows([1, 2, 1])
                .table()
                .contains("(count-ckpt ÷ count); no periodic checkpoint in these runs")
        );
        // Periodic checkpoints taken, or epochs not recorded: no caveat.
        for res in [rows([6, 7, 9]), {
            let mut r = rows([1, 1, 1]);
            r.rows[0].runs.iter_mut().for_each(|x| x.epochs = None);
            r
        }] {
            let t = res.table();
            assert!(!t.contains("periodic"), "{t}");
            assert!(t.contains("| ≤ 5 % | meets |"), "{t}");
        }
    }

    #[test]
    fn the_threads_table_shows_the_median_run_and_leaves_out_idle_threads() {
        use crate::measure::ThreadCpu;
        let th = |pairs: &[(&str, f64)]| {
            pairs
                .iter()
                .map(|&(name, cpu_s)| ThreadCpu {
                    name: name.into(),
                    cpu_s,
                })
                .collect::<Vec<_>>()
        };
        let mut ns = row(NOP_STREAM, &[1.0, 3.0, 2.0]);
        ns.runs[0].threads = th(&[("bids#0", 0.6), ("count#0", 0.4)]);
        ns.runs[1].threads = th(&[("bids#0", 1.6), ("count#0", 1.4)]);
        ns.runs[2].threads = th(&[("count#0", 1.1), ("bids#0", 0.9), ("wasm-ticker", 0.0)]);
        let res = Results {
            rows: vec![ns, row(FLOOR, &[0.25; 3])],
            ..Results::default()
        };
        let t = res.threads_table();
        assert!(
            t.contains("| count | bids-1m.csv | 2.00 | count#0 1.10 · bids#0 0.90 |\n"),
            "{t}"
        );
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(res.table().contains("busiest threads"));
        let many = th(&[("a", 0.5), ("b", 0.4), ("c", 0.3), ("d", 0.001)]);
        assert_eq!(threads_line(&many, 2), "a 0.50 · b 0.40 · + 1 more");
        // Results written before threads were measured still read.
        let old = r#"{"e2e_s":1.0,"steady_s":1.0,"cpu_s":1.0,"max_rss_mib":1.0}"#;
        let run: Run = serde_json::from_str(old).unwrap();
        assert!(run.threads.is_empty());
    }

    fn runs(e2e: f64, cpu: f64) -> Vec<Run> {
        vec![Run {
            e2e_s: e2e,
            steady_s: e2e,
            cpu_s: cpu,
            max_rss_mib: 10.0,
            threads: Vec::new(),
            epochs: None,
        }]
    }

    #[test]
    fn flink_is_compared_by_its_marginal_rate_and_targets_say_by_how_much_they_miss() {
        let r = |workload: &str, input: &str, engine: &str, records: u64, e2e: f64, cpu: f64| Row {
            workload: workload.into(),
            input: input.into(),
            engine: engine.into(),
            records,
            runs: runs(e2e, cpu),
            note: String::new(),
        };
        let res = Results {
            rows: vec![
                // nop-stream: 10M in 5 s wall, 8 CPU s; without checkpoints 7.6 CPU s.
                r(
                    "count-ckpt",
                    "bids-10m.csv",
                    NOP_STREAM,
                    10_000_000,
                    5.0,
                    8.0,
                ),
                r("count", "bids-10m.csv", NOP_STREAM, 10_000_000, 4.8, 7.6),
                // floor: 10M in 2 s on one thread.
                r("count-ckpt", "bids-10m.csv", FLOOR, 10_000_000, 2.0, 2.0),
                // Flink: 10 s start-up, then 1M/s; CPU 12 s + 3 per M.
                r("count", "bids-1m.csv", FLINK, 1_000_000, 11.0, 15.0),
                r("count", "bids-10m.csv", FLINK, 10_000_000, 20.0, 42.0),
            ],
            ..Results::default()
        };
        let m = res.flink_marginal("count").unwrap();
        assert!((m.rps - 1e6).abs() < 1e-3, "{m:?}");
        assert!((m.per_cpu - 1e6 / 3.0).abs() < 1e-3, "{m:?}");
        let flink = res
            .ratios()
            .into_iter()
            .find(|x| x.workload == "count-ckpt" && x.versus == FLINK)
            .unwrap();
        // 2 M/s against Flink's marginal 1 M/s, not its 10M end-to-end 0.5 M/s.
        assert!(
            flink.marginal && (flink.steady - 2.0).abs() < 1e-9,
            "{flink:?}"
        );
        assert!(
            (flink.per_cpu - 1.25e6 / (1e6 / 3.0)).abs() < 1e-9,
            "{flink:?}"
        );
        let lines = res.targets();
        let get = |what: &str| lines.iter().find(|l| l.what == what).unwrap().clone();
        let wall = get("count-ckpt ÷ floor (steady)");
        assert!((wall.measured - 0.4).abs() < 1e-9 && !wall.meets());
        let cpu = get("count-ckpt ÷ floor (per-cpu)");
        assert!((cpu.measured - 0.25).abs() < 1e-9 && !cpu.meets());
        assert!(!get("count-ckpt ÷ flink (steady)").meets());
        let overhead = get("checkpoint CPU overhead (count-ckpt ÷ count − 1)");
        assert!(
            (overhead.measured - (8.0 / 7.6 - 1.0)).abs() < 1e-9
                && overhead.meets() == (8.0 / 7.6 - 1.0 <= 0.05)
        );
        let t = res.table();
        assert!(t.contains("| count-ckpt ÷ floor (steady) | bids-10m.csv | 0.40 | ≥ 0.50 | misses: 80 % of the target |"), "{t}");
        assert!(t.contains("2.00 (marginal)"), "{t}");
    }
}
