//! What exactly-once checkpoints cost the keyed count (design §20).
//!
//! Wall time cannot tell a few per cent from noise on a shared machine, so this measures
//! two quantities that can:
//!
//! 1. **CPU seconds** (user + system, `wait4`) of the keyed count with no periodic
//!    checkpoint (only the final epoch), with checkpoints every 1 s and every 100 ms:
//!    the three variants run interleaved, `runs` rounds, and the overhead of a variant is
//!    the median over the rounds of `cpu(variant) / cpu(none) - 1`.
//! 2. **Instruction counts** under `valgrind --tool=callgrind` on a smaller input. Under
//!    valgrind a run is ~50× slower, so wall-time epochs would come ~50× too often per
//!    record; the job triggers its epochs by record count instead
//!    (`job.checkpoint_every_records`), at the records per epoch the 1 s and 100 ms
//!    variants reached in the timed runs. Both runs of a pair then take the same epochs.
//!    The report gives the measured instruction ratio and the instructions per epoch,
//!    and from them the overhead implied at the timed runs' records per epoch.
//!
//! Every run's committed output (blackhole-sink summaries: count and checksum) must equal
//! the no-checkpoint run's, or the bench fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;

use crate::epochs;
use crate::measure;
use crate::workload;

/// Periodic checkpoints (beyond the final epoch) the median run of a periodic variant must
/// take for its overhead to count as a measure of its interval. A run shorter than its
/// interval takes none, and its "overhead" is noise: the 10M-bid default of earlier
/// sessions ran 0.8 s by 12-05, so its 1 s variant took only the final epoch.
pub const MIN_PERIODIC_EPOCHS: usize = 3;

/// What to measure.
pub struct Setup {
    /// The release `nopstream` binary.
    pub nopstream: PathBuf,
    /// Output directory (data, jobs, runs, `checkpoint-cost.json`).
    pub out: PathBuf,
    /// Bids of the timed runs.
    pub records: u64,
    /// Interleaved rounds of the timed runs (after one unmeasured warm-up of each variant).
    pub runs: usize,
    /// Bids of the callgrind runs; `None` skips them.
    pub valgrind_records: Option<u64>,
    /// Records per batch.
    pub batch_records: u32,
}

/// How a variant checkpoints.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// Only the final epoch.
    None,
    /// `checkpoint_interval_ms`.
    IntervalMs(u64),
    /// `checkpoint_every_records`.
    EveryRecords(u64),
}

impl Trigger {
    fn job_line(self) -> String {
        match self {
            Trigger::None => String::new(),
            Trigger::IntervalMs(ms) => format!("checkpoint_interval_ms = {ms}\n"),
            Trigger::EveryRecords(n) => format!("checkpoint_every_records = {n}\n"),
        }
    }

    fn label(self) -> String {
        match self {
            Trigger::None => "none".into(),
            Trigger::IntervalMs(ms) => format!("every {ms} ms"),
            Trigger::EveryRecords(n) => format!("every {n} records"),
        }
    }
}

/// The timed figures of one variant.
#[derive(Debug, Clone, Serialize)]
pub struct TimedVariant {
    /// How it checkpoints.
    pub trigger: Trigger,
    /// CPU seconds per round.
    pub cpu_s: Vec<f64>,
    /// Of which system (kernel) CPU seconds, per round: fsyncs and file writes, which
    /// callgrind does not count.
    pub sys_s: Vec<f64>,
    /// Wall seconds (process) per round.
    pub wall_s: Vec<f64>,
    /// Durable epochs per round (the final one included).
    pub epochs: Vec<usize>,
    /// Median over the rounds of `cpu / cpu(none) - 1` (0 for `none` itself).
    pub cpu_overhead: f64,
    /// Median over the rounds of `wall / wall(none) - 1`.
    pub wall_overhead: f64,
    /// Records per durable epoch, median.
    pub records_per_epoch: f64,
    /// Whether the median run took at least [`MIN_PERIODIC_EPOCHS`] periodic checkpoints
    /// (always true for `none`); when false the overhead measures nothing and the table
    /// says so.
    pub enough_epochs: bool,
}

/// One callgrind run.
#[derive(Debug, Clone, Serialize)]
pub struct CountedRun {
    /// How it checkpointed.
    pub trigger: Trigger,
    /// Instructions executed (callgrind `Ir`, every thread).
    pub instructions: u64,
    /// Durable epochs (the final one included).
    pub epochs: usize,
    /// `(instructions - instructions(none)) / (instructions(none) - startup)`: the
    /// overhead on the processing, the process's fixed start-up (loading the components,
    /// measured on a 1,000-bid run) left out.
    pub overhead: f64,
    /// `(instructions - instructions(none)) / (epochs - epochs(none))`: what one extra
    /// epoch costs; 0 when it took no extra epoch.
    pub instructions_per_epoch: f64,
    /// The overhead implied at each timed periodic variant's records per epoch (1 s,
    /// 100 ms), by its label: `instructions_per_epoch / (processing instructions per
    /// record × records_per_epoch)`. Empty for `none`.
    pub implied_overhead: Vec<(String, f64)>,
}

/// The whole report (`checkpoint-cost.json`).
#[derive(Debug, Clone, Serialize)]
pub struct CostReport {
    /// UTC time of the run.
    pub date: String,
    /// Machine description.
    pub machine: String,
    /// Bids of the timed runs.
    pub records: u64,
    /// Interleaved rounds.
    pub runs: usize,
    /// `none`, 1 s, 100 ms.
    pub timed: Vec<TimedVariant>,
    /// Bids of the callgrind runs.
    pub valgrind_records: Option<u64>,
    /// Instructions of a 1,000-bid run without checkpoints: the fixed start-up.
    pub startup_instructions: u64,
    /// `none`, then the record-count equivalents of 1 s and 100 ms (those with at least
    /// one epoch within the input).
    pub counted: Vec<CountedRun>,
    /// Why the instruction counts are missing, if they are.
    pub counted_error: Option<String>,
}

fn median(v: &[f64]) -> f64 {
    epochs::Spread::of(v).median
}

fn label_of(records: u64) -> String {
    if records.is_multiple_of(1_000_000) {
        format!("{}m", records / 1_000_000)
    } else if records.is_multiple_of(1_000) {
        format!("{}k", records / 1_000)
    } else {
        records.to_string()
    }
}

/// The keyed-count job reading `/input/<file>` with checkpoints as `trigger` says.
fn job_text(file: &str, batch_records: u32, trigger: Trigger) -> Result<String> {
    let count = workload::find("count").context("the count workload")?;
    let text = workload::job_text(count, "../data", file, batch_records);
    ensure!(
        count.checkpoint_ms.is_none() && text.contains("\n[[source]]"),
        "the count workload's job text changed shape"
    );
    Ok(text.replacen(
        "\n[[source]]",
        &format!("{}\n[[source]]", trigger.job_line()),
        1,
    ))
}

/// Whether a variant whose median run took `median_epochs` durable epochs (the final one
/// included) took at least [`MIN_PERIODIC_EPOCHS`] periodic checkpoints; `none` takes
/// none by design and always counts.
fn enough_epochs(trigger: Trigger, median_epochs: f64) -> bool {
    trigger == Trigger::None || median_epochs >= (MIN_PERIODIC_EPOCHS + 1) as f64
}

struct Variant {
    trigger: Trigger,
    job: PathBuf,
    run_dir: PathBuf,
}

fn prepare(s: &Setup, records: u64, triggers: &[Trigger]) -> Result<Vec<Variant>> {
    let data = s.out.join("data");
    let jobs = s.out.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    let label = label_of(records);
    let input = crate::bids_file(&data, &label, records, true)?;
    let file = input.file_name().context("file name")?.to_string_lossy();
    triggers
        .iter()
        .enumerate()
        .map(|(i, &trigger)| {
            let name = format!("ckpt-cost-{label}-{i}");
            let job = jobs.join(format!("{name}.toml"));
            std::fs::write(&job, job_text(&file, s.batch_records, trigger)?)?;
            Ok(Variant {
                trigger,
                job,
                run_dir: s.out.join("runs").join(name),
            })
        })
        .collect()
}

/// `nopstream run` of `v` from scratch, optionally under `wrapper` (valgrind).
fn run_once(
    s: &Setup,
    v: &Variant,
    wrapper: Option<&[String]>,
) -> Result<(
    measure::ChildRun,
    crate::JobReport,
    usize,
    crate::OutputSummary,
)> {
    for sub in ["work", "output"] {
        let p = v.run_dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("remove {}", p.display()))?;
        }
    }
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = Command::new(&w[0]);
            c.args(&w[1..]).arg(&s.nopstream);
            c
        }
        None => Command::new(&s.nopstream),
    };
    cmd.arg("run")
        .arg(&v.job)
        .args(["-p", "1", "--json", "--no-progress", "--no-echo"])
        .arg("--output")
        .arg(v.run_dir.join("output"))
        .arg("--work-dir")
        .arg(v.run_dir.join("work"));
    let child = measure::run(cmd)?;
    let report: crate::JobReport = serde_json::from_str(&child.stdout)
        .with_context(|| format!("nopstream --json printed {:?}", child.stdout))?;
    let epochs = epochs::stats(&v.run_dir.join("work"))?.durable_epochs;
    let output = crate::committed_output(&v.run_dir.join("output"))?
        .context("the blackhole sink committed no summary")?;
    Ok((child, report, epochs, output))
}

/// Runs the timed variants, then the callgrind ones; prints as it goes.
///
/// # Errors
/// A failed run, or output that differs between variants.
pub fn run(s: &Setup) -> Result<CostReport> {
    let triggers = [
        Trigger::None,
        Trigger::IntervalMs(1000),
        Trigger::IntervalMs(100),
    ];
    let variants = prepare(s, s.records, &triggers)?;
    let mut expected = None;
    for v in &variants {
        let (_, report, _, out) = run_once(s, v, None)?;
        ensure!(
            report.records_read == s.records,
            "{}: read {} of {} bids",
            v.trigger.label(),
            report.records_read,
            s.records
        );
        match &expected {
            None => expected = Some(out),
            Some(e) => ensure!(
                *e == out,
                "{}: output {out:?} differs from the no-checkpoint run's {e:?}",
                v.trigger.label()
            ),
        }
    }
    let expected = expected.context("no variant")?;
    let mut cpu = vec![Vec::new(); variants.len()];
    let mut sys = vec![Vec::new(); variants.len()];
    let mut wall = vec![Vec::new(); variants.len()];
    let mut taken = vec![Vec::new(); variants.len()];
    for round in 0..s.runs {
        for (i, v) in variants.iter().enumerate() {
            let (child, _, epochs, out) = run_once(s, v, None)?;
            ensure!(out == expected, "{}: output changed", v.trigger.label());
            eprintln!(
                "   round {}: {:<16} {:.3} CPU s, {:.3} s, {epochs} epochs",
                round + 1,
                v.trigger.label(),
                child.cpu_s,
                child.wall_s
            );
            cpu[i].push(child.cpu_s);
            sys[i].push(child.sys_s);
            wall[i].push(child.wall_s);
            taken[i].push(epochs);
        }
    }
    let ratio = |xs: &[Vec<f64>], i: usize| {
        median(
            &xs[i]
                .iter()
                .zip(&xs[0])
                .map(|(v, n)| v / n - 1.0)
                .collect::<Vec<_>>(),
        )
    };
    let timed: Vec<TimedVariant> = variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let epochs: Vec<f64> = taken[i].iter().map(|&e| e as f64).collect();
            TimedVariant {
                trigger: v.trigger,
                cpu_s: cpu[i].clone(),
                sys_s: sys[i].clone(),
                wall_s: wall[i].clone(),
                epochs: taken[i].clone(),
                cpu_overhead: ratio(&cpu, i),
                wall_overhead: ratio(&wall, i),
                records_per_epoch: s.records as f64 / median(&epochs).max(1.0),
                enough_epochs: enough_epochs(v.trigger, median(&epochs)),
            }
        })
        .collect();
    let (startup_instructions, counted, counted_error) = match s.valgrind_records {
        None => (0, Vec::new(), None),
        Some(n) => match counted_runs(s, n, &timed) {
            Ok((startup, c)) => (startup, c, None),
            Err(e) => {
                eprintln!("instruction counts not measured: {e:#}");
                (0, Vec::new(), Some(format!("{e:#}")))
            }
        },
    };
    Ok(CostReport {
        date: crate::utc_now(),
        machine: crate::machine(),
        records: s.records,
        runs: s.runs,
        timed,
        valgrind_records: s.valgrind_records,
        startup_instructions,
        counted,
        counted_error,
    })
}

/// The total `Ir` of a callgrind output file (`summary:` or `totals:` line).
fn callgrind_total(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l
            .strip_prefix("summary:")
            .or_else(|| l.strip_prefix("totals:"))?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn callgrind(s: &Setup, v: &Variant, records: u64) -> Result<(u64, usize, crate::OutputSummary)> {
    let out_file = v.run_dir.with_extension("callgrind.out");
    let wrapper = vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        format!("--callgrind-out-file={}", out_file.display()),
        // Components are compiled code mapped at run time.
        "--smc-check=all-non-file".to_owned(),
    ];
    let (_, report, epochs, out) = run_once(s, v, Some(&wrapper))
        .with_context(|| format!("valgrind run of {}", v.trigger.label()))?;
    ensure!(
        report.records_read == records,
        "callgrind run read {} of {records}",
        report.records_read
    );
    let text = std::fs::read_to_string(&out_file)
        .with_context(|| format!("read {}", out_file.display()))?;
    let Some(ir) = callgrind_total(&text) else {
        bail!("no total in {}", out_file.display());
    };
    Ok((ir, epochs, out))
}

fn counted_runs(s: &Setup, records: u64, timed: &[TimedVariant]) -> Result<(u64, Vec<CountedRun>)> {
    // Valgrind's CPU model differs from the host's, so the engine compiles the components
    // once more under it (a cache entry of its own): the first run is a warm-up; the
    // second measures the fixed start-up of a small run.
    let small = prepare(s, 1_000, &[Trigger::None])?;
    callgrind(s, &small[0], 1_000)?;
    let (startup, _, _) = callgrind(s, &small[0], 1_000)?;
    eprintln!("   callgrind: start-up (1,000 bids)  {startup} instructions");
    let mut triggers = vec![Trigger::None];
    for t in timed.iter().skip(1).filter(|t| t.enough_epochs) {
        let every = t.records_per_epoch.round() as u64;
        if every == 0 || every >= records {
            eprintln!(
                "   callgrind: {} is {every} records per epoch, not within {records} bids; skipped",
                t.trigger.label()
            );
            continue;
        }
        triggers.push(Trigger::EveryRecords(every));
    }
    let variants = prepare(s, records, &triggers)?;
    let mut runs: Vec<(Trigger, u64, usize)> = Vec::new();
    let mut expected = None;
    for v in &variants {
        let (ir, epochs, out) = callgrind(s, v, records)?;
        match &expected {
            None => expected = Some(out),
            Some(e) => ensure!(*e == out, "{}: output differs", v.trigger.label()),
        }
        eprintln!(
            "   callgrind: {:<24} {ir} instructions, {epochs} epochs",
            v.trigger.label()
        );
        runs.push((v.trigger, ir, epochs));
    }
    let (_, base_ir, base_epochs) = runs[0];
    let processing = base_ir.saturating_sub(startup).max(1) as f64;
    let per_record = processing / records as f64;
    Ok((
        startup,
        runs.iter()
            .map(|&(trigger, ir, epochs)| {
                let extra = epochs.saturating_sub(base_epochs) as f64;
                let per_epoch = if extra > 0.0 {
                    (ir as f64 - base_ir as f64) / extra
                } else {
                    0.0
                };
                let implied = if per_epoch > 0.0 {
                    timed
                        .iter()
                        .skip(1)
                        .filter(|t| t.enough_epochs)
                        .map(|t| {
                            (
                                t.trigger.label(),
                                per_epoch / (per_record * t.records_per_epoch),
                            )
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                CountedRun {
                    trigger,
                    instructions: ir,
                    epochs,
                    overhead: (ir as f64 - base_ir as f64) / processing,
                    instructions_per_epoch: per_epoch,
                    implied_overhead: implied,
                }
            })
            .collect(),
    ))
}

impl CostReport {
    /// The printed table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "checkpoint cost, keyed count, {} bids, p=1, median of {} interleaved rounds\n\n\
             | checkpoints | CPU s (median) | of which system | wall s (median) | epochs | records/epoch | CPU overhead | wall overhead |\n\
             |---|---|---|---|---|---|---|---|\n",
            self.records, self.runs
        );
        for t in &self.timed {
            let epochs: Vec<f64> = t.epochs.iter().map(|&e| e as f64).collect();
            let flag = if t.enough_epochs {
                ""
            } else {
                " (too few periodic checkpoints to measure; raise --records)"
            };
            s += &format!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} | {:+.1} %{flag} | {:+.1} %{flag} |\n",
                t.trigger.label(),
                median(&t.cpu_s),
                median(&t.sys_s),
                median(&t.wall_s),
                median(&epochs),
                t.records_per_epoch,
                t.cpu_overhead * 100.0,
                t.wall_overhead * 100.0
            );
        }
        if let Some(n) = self.valgrind_records {
            s += &format!(
                "\ninstruction counts (callgrind), {n} bids, epochs by record count; start-up \
                 (1,000 bids) {} instructions, left out of the overhead\n\n\
                 | checkpoints | instructions | epochs | overhead | per extra epoch | implied at the timed runs' records per epoch |\n\
                 |---|---|---|---|---|---|\n",
                self.startup_instructions
            );
            for c in &self.counted {
                s += &format!(
                    "| {} | {} | {} | {:+.2} % | {:.0} | {} |\n",
                    c.trigger.label(),
                    c.instructions,
                    c.epochs,
                    c.overhead * 100.0,
                    c.instructions_per_epoch,
                    c.implied_overhead
                        .iter()
                        .map(|(l, o)| format!("{l}: {:+.2} %", o * 100.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if let Some(e) = &self.counted_error {
                s += &format!("not measured: {e}\n");
            }
        }
        s
    }

    /// Writes `<out>/checkpoint-cost.json`.
    ///
    /// # Errors
    /// I/O.
    pub fn write(&self, out: &Path) -> Result<()> {
        std::fs::write(
            out.join("checkpoint-cost.json"),
            serde_json::to_string_pretty(self)?,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_texts_carry_their_trigger_in_the_job_table() {
        for (t, line) in [
            (Trigger::None, None),
            (
                Trigger::IntervalMs(100),
                Some("checkpoint_interval_ms = 100"),
            ),
            (
                Trigger::EveryRecords(5000),
                Some("checkpoint_every_records = 5000"),
            ),
        ] {
            let text = job_text("bids-1m.csv", 1024, t).unwrap();
            let m = nop_stream_core::parse_job_file("job.toml", &text)
                .unwrap_or_else(|e| panic!("{text}\n{e:?}"));
            match t {
                Trigger::None => {
                    assert_eq!(m.job.checkpoint_interval_ms, None);
                    assert_eq!(m.job.checkpoint_every_records, None);
                }
                Trigger::IntervalMs(ms) => assert_eq!(m.job.checkpoint_interval_ms, Some(ms)),
                Trigger::EveryRecords(n) => {
                    assert_eq!(m.job.checkpoint_every_records, Some(n));
                }
            }
            if let Some(l) = line {
                assert!(text.contains(l), "{text}");
            }
        }
    }

    #[test]
    fn a_variant_with_too_few_periodic_checkpoints_is_not_reported_as_a_measure() {
        let v = |trigger, epochs: Vec<usize>, enough| TimedVariant {
            trigger,
            cpu_s: vec![1.0; epochs.len()],
            sys_s: vec![0.0; epochs.len()],
            wall_s: vec![1.0; epochs.len()],
            epochs,
            cpu_overhead: 0.02,
            wall_overhead: 0.0,
            records_per_epoch: 1.0,
            enough_epochs: enough,
        };
        let report = CostReport {
            date: String::new(),
            machine: String::new(),
            records: 10,
            runs: 3,
            timed: vec![
                v(Trigger::None, vec![1, 1, 1], true),
                v(Trigger::IntervalMs(1000), vec![1, 2, 1], false),
                v(Trigger::IntervalMs(100), vec![9, 9, 8], true),
            ],
            valgrind_records: None,
            startup_instructions: 0,
            counted: Vec::new(),
            counted_error: None,
        };
        assert!(enough_epochs(Trigger::None, 1.0));
        assert!(!enough_epochs(Trigger::IntervalMs(1000), 1.0));
        assert!(!enough_epochs(Trigger::IntervalMs(1000), 3.5));
        assert!(enough_epochs(Trigger::IntervalMs(1000), 4.0));
        let t = report.table();
        let line = |label: &str| t.lines().find(|l| l.starts_with(label)).unwrap().to_owned();
        assert!(line("| every 1000 ms").contains("too few periodic"), "{t}");
        assert!(!line("| every 100 ms").contains("too few"), "{t}");
        assert!(!line("| none").contains("too few"), "{t}");
    }

    #[test]
    fn callgrind_totals_are_read() {
        let text =
            "version: 1\ncmd: x\nevents: Ir\nsummary: 123456\n\nfn=main\n1 5\ntotals: 123456\n";
        assert_eq!(callgrind_total(text), Some(123_456));
        assert_eq!(callgrind_total("events: Ir\n"), None);
        assert_eq!(label_of(1_000_000), "1m");
        assert_eq!(label_of(200_000), "200k");
        assert_eq!(label_of(1234), "1234");
    }
}
