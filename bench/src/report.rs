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

    /// nop-stream ÷ floor and nop-stream ÷ Flink, wherever both rows exist.
    pub fn ratios(&self) -> Vec<Ratio> {
        let mut out = Vec::new();
        for n in self.rows.iter().filter(|r| r.engine == NOP_STREAM) {
            let ns = n.summary();
            for other in [FLOOR, FLINK] {
                if let Some(o) = self.row(&n.workload, &n.input, other) {
                    let os = o.summary();
                    out.push(Ratio {
                        workload: n.workload.clone(),
                        input: n.input.clone(),
                        versus: other.into(),
                        steady: ns.steady_rps.median / os.steady_rps.median,
                        e2e: ns.e2e_rps.median / os.e2e_rps.median,
                    });
                }
            }
        }
        out
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
            "| workload | input | engine | runs | steady rec/s median [min – max] | end-to-end rec/s median [min – max] | CPU s | peak RSS MiB | ÷ floor (steady / e2e) | ÷ Flink (steady / e2e) |"
        );
        let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let s = r.summary();
            let ratio = |versus: &str| {
                if r.engine != NOP_STREAM {
                    return String::new();
                }
                self.ratio(&r.workload, &r.input, versus)
                    .map(|x| format!("{:.2} / {:.2}", x.steady, x.e2e))
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
                    "\ncheckpointed ÷ unchecked, {} on {}: {:.2} steady / {:.2} end-to-end ({} ÷ {})",
                    r.engine,
                    r.input,
                    c.steady_rps.median / u.steady_rps.median,
                    c.e2e_rps.median / u.e2e_rps.median,
                    r.workload,
                    base
                );
            }
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
            "workload,input,engine,records,runs,steady_rps_median,steady_rps_min,steady_rps_max,e2e_rps_median,e2e_rps_min,e2e_rps_max,cpu_s_median,max_rss_mib,ratio_floor_steady,ratio_floor_e2e,ratio_flink_steady,ratio_flink_e2e\n",
        );
        for r in &self.rows {
            let s = r.summary();
            let ratio = |v: &str| {
                self.ratio(&r.workload, &r.input, v)
                    .filter(|_| r.engine == NOP_STREAM)
                    .map(|x| (format!("{:.4}", x.steady), format!("{:.4}", x.e2e)))
                    .unwrap_or_default()
            };
            let (fs, fe) = ratio(FLOOR);
            let (ks, ke) = ratio(FLINK);
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.3},{:.1},{fs},{fe},{ks},{ke}",
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
                })
                .collect(),
            note: String::new(),
        }
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
}
