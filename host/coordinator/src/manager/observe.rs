//! What the job manager shows of its jobs (design §15), shared by `nopstream run --http`,
//! the coordinator's HTTP server and `nopstream status`: one view of a job (its status,
//! vertices and edges with their counts and rates), its checkpoint history read from the
//! durable epoch log (so it survives restarts and a change of coordinator), one epoch's
//! trace (its manifest: per task bytes, alignment and duration, split offsets, segments,
//! sink transactions), its exceptions, and the samples `/metrics` encodes.
//!
//! The shapes here are the JSON API's (`/api/v1/`, [`API_VERSION`]); a snapshot test fails
//! when one changes without the version.

use super::{JobManager, ManagerError, Platform, lock};
use nop_stream_checkpoint::{EpochLogRecord, EpochState, Namespace};
use nop_stream_core::PartitionedPlan;
use nop_stream_metrics::inventory as inv;
use nop_stream_metrics::{Histogram, Sample, Value};
use nop_stream_proto::cli::{JobState, JobStatus};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The content type of [`JobManager::metrics_text`].
pub const METRICS_CONTENT_TYPE: &str = nop_stream_metrics::CONTENT_TYPE;

/// The version of the JSON API's shapes: part of every path (`/api/v1/`).
pub const API_VERSION: u32 = 1;

/// What the manager keeps of its jobs for the views: the plan each ran last (so an ended
/// job still shows its graph) and the counts of the previous view (for rates).
#[derive(Debug, Default)]
pub struct Observed {
    plans: Mutex<HashMap<String, Arc<PartitionedPlan>>>,
    /// Per job: when its vertices' counts were last seen, and those counts.
    last: Mutex<HashMap<String, (Instant, VertexCounts)>>,
    /// Per job: the source vertices' read rate at each view at least 1 s after the
    /// previous one, oldest first, at most [`THROUGHPUT_POINTS`].
    throughput: Mutex<HashMap<String, std::collections::VecDeque<RatePoint>>>,
    /// Per job (namespace): what its durable manifests hold, folded once each.
    manifests: Mutex<HashMap<String, Arc<Mutex<Folded>>>>,
    /// Per job: the checkpoint namespace handle of its current run (keyed by the run's
    /// submission time), kept so that polling reads only what is new in the epoch log
    /// ([`Namespace::read_log`]) and the job file is not compiled again per scrape.
    namespaces: Mutex<HashMap<String, (u64, Arc<Namespace>)>>,
    /// Per job (namespace): the snapshot bytes of each retained durable manifest
    /// (manifests never change once published), so the checkpoint summary does not read
    /// every retained manifest again.
    sizes: Mutex<HashMap<String, BTreeMap<u64, u64>>>,
}

/// The figures of a job's durable manifests, each manifest folded once (at the first
/// scrape that finds it retained), so `/metrics` never reads a manifest twice.
#[derive(Debug)]
struct Folded {
    /// The newest epoch folded.
    upto: u64,
    /// Snapshot bytes by vertex.
    snapshot: BTreeMap<String, u64>,
    /// Compaction bytes by vertex.
    compaction: BTreeMap<String, u64>,
    /// The longest task alignment of each epoch, seconds.
    alignment: Histogram,
    /// The longest start delay of each epoch whose creation time the log records:
    /// from its creation to the latest first barrier of any task, seconds.
    start_delay: Histogram,
}

impl Default for Folded {
    fn default() -> Self {
        Folded {
            upto: 0,
            snapshot: BTreeMap::new(),
            compaction: BTreeMap::new(),
            alignment: Histogram::seconds(),
            start_delay: Histogram::seconds(),
        }
    }
}

impl Folded {
    /// Folds one durable manifest; `created_ms` is the epoch's creation time from the
    /// epoch log (ms since the Unix epoch), if known.
    fn fold(&mut self, m: &nop_stream_checkpoint::EpochManifest, created_ms: Option<u64>) {
        for t in &m.tasks {
            let v = t.task.vertex.as_str();
            *self.snapshot.entry(v.to_owned()).or_default() += t.snapshot_bytes;
            *self.compaction.entry(v.to_owned()).or_default() += t.compacted_bytes;
        }
        let longest = m.tasks.iter().map(|t| t.alignment_ms).max().unwrap_or(0);
        self.alignment.observe(longest as f64 / 1000.0);
        let latest_barrier = m.tasks.iter().map(|t| t.barrier_unix_ms).max();
        if let (Some(created), Some(seen)) = (created_ms, latest_barrier.filter(|b| *b > 0)) {
            // Clocks of two machines: a barrier "before" the trigger counts as no delay.
            self.start_delay
                .observe(seen.saturating_sub(created) as f64 / 1000.0);
        }
        self.upto = self.upto.max(m.epoch.0);
    }

    fn samples(&self, job: &str) -> Vec<Sample> {
        let l = |v: &str| vec![job.to_owned(), v.to_owned()];
        let mut out = vec![
            Sample::new(
                &inv::CHECKPOINT_ALIGNMENT,
                vec![job.to_owned()],
                Value::Histogram(self.alignment.value()),
            ),
            Sample::new(
                &inv::CHECKPOINT_START_DELAY,
                vec![job.to_owned()],
                Value::Histogram(self.start_delay.value()),
            ),
        ];
        out.extend(
            self.snapshot
                .iter()
                .map(|(v, b)| Sample::counter(&inv::SNAPSHOT, l(v), *b as f64)),
        );
        out.extend(
            self.compaction
                .iter()
                .map(|(v, b)| Sample::counter(&inv::COMPACTION, l(v), *b as f64)),
        );
        out
    }
}

/// What a view saw of one vertex, cumulative over its subtasks.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    records_in: u64,
    records_out: u64,
    /// Busy, backpressured and idle time, seconds.
    busy: f64,
    backpressured: f64,
    idle: f64,
}

/// [`Counts`] by vertex.
type VertexCounts = BTreeMap<String, Counts>;

/// How many throughput points a job keeps for its chart.
pub const THROUGHPUT_POINTS: usize = 120;

/// One point of a job's throughput chart.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Records its source vertices read per second since the previous view.
    pub records_per_second: f64,
}

/// One subtask's watermarks (`GET /api/v1/jobs/{job}/watermarks`), from the samples of
/// the process or nodes that run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkView {
    /// Vertex id.
    pub vertex: String,
    /// Subtask index.
    pub subtask: u32,
    /// The smallest watermark over its active input channels, event time in ms since the
    /// Unix epoch; `None` before the first (and for sources, which have no input).
    pub input_ms: Option<i64>,
    /// The watermark it last emitted, ms; `None` before the first.
    pub output_ms: Option<i64>,
}

/// The subtasks' watermarks in `samples`, by vertex and subtask.
fn watermarks(samples: &[Sample]) -> Vec<WatermarkView> {
    let mut by: BTreeMap<(String, u32), WatermarkView> = BTreeMap::new();
    for s in samples {
        let input = s.family == inv::INPUT_WATERMARK.name;
        if !input && s.family != inv::OUTPUT_WATERMARK.name {
            continue;
        }
        let (Some(v), Some(Ok(i))) = (s.label("vertex"), s.label("subtask").map(str::parse::<u32>))
        else {
            continue;
        };
        let w = by
            .entry((v.to_owned(), i))
            .or_insert_with(|| WatermarkView {
                vertex: v.to_owned(),
                subtask: i,
                input_ms: None,
                output_ms: None,
            });
        let ms = Some((s.number() * 1000.0).round() as i64);
        if input {
            w.input_ms = ms;
        } else {
            w.output_ms = ms;
        }
    }
    by.into_values().collect()
}

/// `part / (busy + backpressured + idle)` of the time between two views (or since the
/// start, on the first), `None` when no time was measured.
fn time_ratio(now: &Counts, before: Option<&Counts>, part: fn(&Counts) -> f64) -> Option<f64> {
    let zero = Counts::default();
    let b = before.unwrap_or(&zero);
    let total = (now.busy - b.busy) + (now.backpressured - b.backpressured) + (now.idle - b.idle);
    (total > 0.0).then(|| ((part(now) - part(b)) / total).clamp(0.0, 1.0))
}

impl Observed {
    /// `job` starts a run of `plan`.
    pub fn started(&self, job: &str, plan: &Arc<PartitionedPlan>) {
        lock(&self.plans).insert(job.to_owned(), Arc::clone(plan));
    }

    fn plan(&self, job: &str) -> Option<Arc<PartitionedPlan>> {
        lock(&self.plans).get(job).cloned()
    }
}

/// One vertex (an operator chain) of a job's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VertexView {
    /// Vertex id (its head operator's id).
    pub id: String,
    /// Its operators' names, head first.
    pub operators: Vec<String>,
    /// Subtasks.
    pub parallelism: u32,
    /// Whether it holds keyed state.
    pub keyed: bool,
    /// Records that entered its subtasks in this process, over every attempt.
    pub records_in: u64,
    /// Records its subtasks emitted or wrote.
    pub records_out: u64,
    /// Records in per second since the previous view (at least 1 s before); `None` on the
    /// first view.
    pub records_in_per_second: Option<f64>,
    /// Records out per second, likewise.
    pub records_out_per_second: Option<f64>,
    /// Share of its subtasks' time spent working since the previous view (on the first,
    /// since they started), 0–1 (Flink's `busyTimeMsPerSecond` ÷ 1000); `None` before
    /// any time is measured.
    pub busy_ratio: Option<f64>,
    /// Share of its subtasks' time blocked on full output channels, likewise.
    pub backpressured_ratio: Option<f64>,
    /// Its low watermark: the smallest over its subtasks of the input watermark (for a
    /// source, the emitted one), event time in ms since the Unix epoch; `None` before
    /// any subtask has one.
    pub low_watermark_ms: Option<i64>,
}

/// One edge of a job's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeView {
    /// Upstream vertex.
    pub from: String,
    /// Downstream vertex.
    pub to: String,
    /// Partition policy (`FORWARD`, `HASH`, ...).
    pub partition: String,
    /// The upstream side output it reads, if any.
    pub output: Option<String>,
}

/// One job: its status and graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The status (as `nopstream job status` shows it).
    pub status: JobStatus,
    /// The plan fingerprint of its last run in this process, if it ran here.
    pub fingerprint: Option<String>,
    /// Vertices of that plan.
    pub vertices: Vec<VertexView>,
    /// Edges of that plan.
    pub edges: Vec<EdgeView>,
    /// Its source vertices' read rate at the recent views, oldest first (the page's
    /// chart; filled only while someone looks).
    pub throughput: Vec<RatePoint>,
}

/// One epoch, as the epoch log tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochView {
    /// The epoch.
    pub epoch: u64,
    /// Its last state: `created`, `durable`, `committed` or `aborted`.
    pub state: String,
    /// The attempt that recorded that state.
    pub attempt: u32,
    /// When it was created, ms since the Unix epoch.
    pub created_ms: Option<u64>,
    /// When it became durable.
    pub durable_ms: Option<u64>,
    /// When its sinks committed.
    pub committed_ms: Option<u64>,
    /// Created to durable, in ms.
    pub duration_ms: Option<u64>,
    /// Why it was aborted.
    pub detail: Option<String>,
}

/// min/avg/max of one figure over the epochs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MinAvgMax {
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub avg: f64,
    /// Largest.
    pub max: u64,
}

/// A job's checkpoints, from its durable epoch log and manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointsView {
    /// Epochs the log records created.
    pub triggered: u64,
    /// Epochs the log records durable (committed ones included).
    pub durable: u64,
    /// Epochs the log records committed.
    pub committed: u64,
    /// Epochs the log records aborted.
    pub aborted: u64,
    /// Created and neither committed nor aborted.
    pub pending: u64,
    /// Duration (created to durable, ms) over the durable epochs of the log.
    pub duration_ms: Option<MinAvgMax>,
    /// Snapshot bytes over the epochs whose manifests are retained.
    pub snapshot_bytes: Option<MinAvgMax>,
    /// The latest durable epoch.
    pub latest_durable: Option<EpochView>,
    /// The latest aborted epoch.
    pub latest_aborted: Option<EpochView>,
    /// Epochs whose manifests are retained (restorable), ascending.
    pub retained: Vec<u64>,
    /// Every epoch of the log, newest first.
    pub history: Vec<EpochView>,
}

/// What `nopstream status` shows: the job's view and its checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    /// The job.
    pub job: JobView,
    /// Its checkpoints; `None` when its epoch log cannot be read (`error` says why).
    pub checkpoints: Option<CheckpointsView>,
    /// Why the checkpoints are missing.
    pub error: Option<String>,
}

/// One epoch in detail: the log's view and, while retained, its manifest (per task its
/// bytes, alignment and duration; split offsets; segments; sink transactions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochDetail {
    /// The log's view.
    pub epoch: EpochView,
    /// The manifest, as stored; `None` once retention dropped it.
    pub manifest: Option<serde_json::Value>,
}

/// Something that went wrong in a job: a run's failure, or what a recovery recovered
/// from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExceptionView {
    /// The run (1 for the first submission of the job id).
    pub run: u32,
    /// How the run stands or ended.
    pub state: JobState,
    /// Global recoveries of that run.
    pub recoveries: u32,
    /// The error, naming the plugin, operator and subtask where the runtime knows them.
    pub error: String,
}

fn state_name(s: EpochState) -> &'static str {
    match s {
        EpochState::Created | EpochState::Injecting | EpochState::Snapshotting => "created",
        EpochState::Precommitted => "precommitted",
        EpochState::Durable => "durable",
        EpochState::Committed => "committed",
        EpochState::Aborted => "aborted",
    }
}

/// Every epoch of `log`, ascending.
fn epochs(log: &[EpochLogRecord]) -> Vec<EpochView> {
    let mut by: BTreeMap<u64, EpochView> = BTreeMap::new();
    for r in log {
        let v = by.entry(r.epoch.0).or_insert_with(|| EpochView {
            epoch: r.epoch.0,
            state: String::new(),
            attempt: r.attempt.0,
            created_ms: None,
            durable_ms: None,
            committed_ms: None,
            duration_ms: None,
            detail: None,
        });
        // The log is ordered by epoch, attempt, then state: the last record is the latest.
        v.state = state_name(r.state).to_owned();
        v.attempt = r.attempt.0;
        match r.state {
            EpochState::Created => v.created_ms = Some(r.at_ms),
            EpochState::Durable => v.durable_ms = Some(r.at_ms),
            EpochState::Committed => v.committed_ms = Some(r.at_ms),
            EpochState::Aborted => v.detail.clone_from(&r.detail),
            _ => {}
        }
    }
    for v in by.values_mut() {
        if let (Some(c), Some(d)) = (v.created_ms, v.durable_ms) {
            v.duration_ms = Some(d.saturating_sub(c));
        }
    }
    by.into_values().collect()
}

fn min_avg_max(v: &[u64]) -> Option<MinAvgMax> {
    Some(MinAvgMax {
        min: *v.iter().min()?,
        avg: v.iter().sum::<u64>() as f64 / v.len() as f64,
        max: *v.iter().max()?,
    })
}

impl<P: Platform> JobManager<P> {
    /// The checkpoint namespace of `job`'s current run, one handle per run (see
    /// [`Observed`]'s `namespaces`).
    fn namespace_of_job(&self, job: &str) -> Result<Arc<Namespace>, ManagerError> {
        let r = self.record(job)?;
        if let Some((at, ns)) = lock(&self.observed.namespaces).get(job)
            && *at == r.submitted_ms
        {
            return Ok(Arc::clone(ns));
        }
        let ns = Arc::new(Namespace::open(&self.namespace_of(&r)?)?);
        lock(&self.observed.namespaces).insert(job.to_owned(), (r.submitted_ms, Arc::clone(&ns)));
        Ok(ns)
    }

    /// `job`'s status and graph.
    ///
    /// # Errors
    /// No such job.
    pub fn view(&self, job: &str) -> Result<JobView, ManagerError> {
        let status = self.status(job)?;
        let plan = self.observed.plan(job);
        let samples = self.platform.samples(job);
        let marks = watermarks(&samples);
        let now = Instant::now();
        let mut counts = BTreeMap::new();
        let mut vertices = Vec::new();
        let mut last = lock(&self.observed.last);
        let before = last
            .get(job)
            .filter(|(t, _)| t.elapsed().as_secs_f64() >= 1.0);
        let dt = before.map(|(t, _)| now.duration_since(*t).as_secs_f64());
        for v in plan.iter().flat_map(|p| &p.vertices) {
            let id = v.id.to_string();
            let c = vertex_counts(&samples, &id);
            let prev = before.and_then(|(_, c)| c.get(&id));
            let rate = |now_n: u64, pick: fn(&Counts) -> u64| {
                Some(now_n.saturating_sub(pick(prev?)) as f64 / dt?)
            };
            let low = marks
                .iter()
                .filter(|w| w.vertex == id)
                .filter_map(|w| w.input_ms.or(w.output_ms))
                .min();
            vertices.push(VertexView {
                operators: v.operators.iter().map(|o| o.name.clone()).collect(),
                parallelism: v.parallelism,
                keyed: v.keyed,
                records_in: c.records_in,
                records_out: c.records_out,
                records_in_per_second: rate(c.records_in, |c| c.records_in),
                records_out_per_second: rate(c.records_out, |c| c.records_out),
                busy_ratio: time_ratio(&c, prev, |c| c.busy),
                backpressured_ratio: time_ratio(&c, prev, |c| c.backpressured),
                low_watermark_ms: low,
                id: id.clone(),
            });
            counts.insert(id, c);
        }
        let edges: Vec<EdgeView> = plan
            .iter()
            .flat_map(|p| &p.edges)
            .map(|e| EdgeView {
                from: e.from.to_string(),
                to: e.to.to_string(),
                partition: e.partition.to_string(),
                output: e.output.clone(),
            })
            .collect();
        let mut ring = lock(&self.observed.throughput);
        let points = ring.entry(job.to_owned()).or_default();
        if let Some(dt) = dt {
            // The source vertices' reads: those no edge enters.
            let read = |c: &VertexCounts| -> u64 {
                c.iter()
                    .filter(|(v, _)| !edges.iter().any(|e| &e.to == *v))
                    .map(|(_, c)| c.records_in)
                    .sum()
            };
            let (was, is) = (before.map_or(0, |(_, c)| read(c)), read(&counts));
            points.push_back(RatePoint {
                at_ms: super::now_ms(),
                records_per_second: is.saturating_sub(was) as f64 / dt,
            });
            while points.len() > THROUGHPUT_POINTS {
                points.pop_front();
            }
        }
        let throughput = points.iter().copied().collect();
        drop(ring);
        if last
            .get(job)
            .is_none_or(|(t, _)| t.elapsed().as_secs_f64() >= 1.0)
        {
            last.insert(job.to_owned(), (now, counts));
        }
        drop(last);
        Ok(JobView {
            status,
            fingerprint: plan.map(|p| p.fingerprint.clone()),
            vertices,
            edges,
            throughput,
        })
    }

    /// `job`'s subtasks' watermarks, by vertex and subtask (empty while it does not run
    /// in this process or on this coordinator's nodes).
    ///
    /// # Errors
    /// No such job.
    pub fn watermarks(&self, job: &str) -> Result<Vec<WatermarkView>, ManagerError> {
        self.record(job)?;
        Ok(watermarks(&self.platform.samples(job)))
    }

    /// `job`'s view and checkpoints, for `nopstream status`.
    ///
    /// # Errors
    /// No such job.
    pub fn status_view(&self, job: &str) -> Result<StatusView, ManagerError> {
        let view = self.view(job)?;
        let (checkpoints, error) = match self.checkpoints(job) {
            Ok(c) => (Some(c), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Ok(StatusView {
            job: view,
            checkpoints,
            error,
        })
    }

    /// `job`'s checkpoints, read from its durable epoch log and retained manifests.
    ///
    /// # Errors
    /// No such job; storage failures, naming the object.
    pub fn checkpoints(&self, job: &str) -> Result<CheckpointsView, ManagerError> {
        let ns = self.namespace_of_job(job)?;
        let all = epochs(&ns.read_log()?);
        let retained: Vec<u64> = ns.manifest_epochs()?.into_iter().map(|e| e.0).collect();
        let key = format!("{job}\u{0}{}", ns.describe());
        let known = lock(&self.observed.sizes).remove(&key).unwrap_or_default();
        let mut by_epoch = BTreeMap::new();
        for e in &retained {
            let bytes = match known.get(e) {
                Some(b) => *b,
                None => ns
                    .read_manifest(nop_stream_api::EpochId(*e))?
                    .snapshot_bytes(),
            };
            by_epoch.insert(*e, bytes);
        }
        let sizes: Vec<u64> = by_epoch.values().copied().collect();
        lock(&self.observed.sizes).insert(key, by_epoch);
        let is = |v: &EpochView, s: &str| v.state == s;
        let durations: Vec<u64> = all.iter().filter_map(|v| v.duration_ms).collect();
        Ok(CheckpointsView {
            triggered: all.iter().filter(|v| v.created_ms.is_some()).count() as u64,
            durable: all.iter().filter(|v| v.durable_ms.is_some()).count() as u64,
            committed: all.iter().filter(|v| is(v, "committed")).count() as u64,
            aborted: all.iter().filter(|v| is(v, "aborted")).count() as u64,
            pending: all
                .iter()
                .filter(|v| !is(v, "committed") && !is(v, "aborted"))
                .count() as u64,
            duration_ms: min_avg_max(&durations),
            snapshot_bytes: min_avg_max(&sizes),
            latest_durable: all.iter().rfind(|v| v.durable_ms.is_some()).cloned(),
            latest_aborted: all.iter().rfind(|v| is(v, "aborted")).cloned(),
            retained,
            history: all.into_iter().rev().collect(),
        })
    }

    /// Epoch `epoch` of `job` in detail.
    ///
    /// # Errors
    /// No such job; [`ManagerError::NoEpoch`] when the log does not know the epoch;
    /// storage failures.
    pub fn epoch(&self, job: &str, epoch: u64) -> Result<EpochDetail, ManagerError> {
        let ns = self.namespace_of_job(job)?;
        let view = epochs(&ns.read_log()?)
            .into_iter()
            .find(|v| v.epoch == epoch)
            .ok_or_else(|| ManagerError::NoEpoch {
                job: job.to_owned(),
                epoch,
            })?;
        let retained = ns
            .manifest_epochs()?
            .contains(&nop_stream_api::EpochId(epoch));
        let manifest = if retained {
            let m = ns.read_manifest(nop_stream_api::EpochId(epoch))?;
            serde_json::to_value(&m).ok()
        } else {
            None
        };
        Ok(EpochDetail {
            epoch: view,
            manifest,
        })
    }

    /// `job`'s exceptions: the current run's error (a failure, or what its last recovery
    /// recovered from) and those of earlier runs, newest first.
    ///
    /// # Errors
    /// No such job.
    pub fn exceptions(&self, job: &str) -> Result<Vec<ExceptionView>, ManagerError> {
        let r = self.record(job)?;
        let mut out: Vec<ExceptionView> = r
            .error
            .iter()
            .map(|e| ExceptionView {
                run: r.run,
                state: r.state,
                recoveries: r.recoveries,
                error: e.clone(),
            })
            .collect();
        for p in r.history.iter().rev() {
            if let Some(e) = &p.error {
                out.push(ExceptionView {
                    run: p.run,
                    state: p.state,
                    recoveries: p.recoveries,
                    error: e.clone(),
                });
            }
        }
        Ok(out)
    }

    /// The samples of every job the manager knows (design §15): its status and epoch
    /// figures from the manager and the epoch log, its subtasks' counters from the
    /// platform.
    ///
    /// # Errors
    /// The job store cannot be read.
    pub fn samples(&self) -> Result<Vec<Sample>, ManagerError> {
        let mut out = vec![Sample::new(
            &inv::BUILD,
            vec![
                env!("CARGO_PKG_VERSION").to_owned(),
                crate::compat::SERVED_WIT
                    .last()
                    .copied()
                    .unwrap_or("")
                    .to_owned(),
            ],
            Value::Info,
        )];
        out.push(Sample::counter(
            &inv::EPOCH_CLAIMS_REFUSED,
            Vec::new(),
            nop_stream_checkpoint::namespace::refused_epoch_claims() as f64,
        ));
        for s in self.list()? {
            let job = s.job.clone();
            let l = || vec![job.clone()];
            let fingerprint = self
                .observed
                .plan(&job)
                .map(|p| p.fingerprint.clone())
                .unwrap_or_default();
            out.push(Sample::new(
                &inv::JOB_INFO,
                vec![job.clone(), s.name.clone(), s.semantic.clone(), fingerprint],
                Value::Info,
            ));
            for st in [
                JobState::Submitted,
                JobState::Running,
                JobState::Finished,
                JobState::Failed,
                JobState::Cancelled,
                JobState::Stopped,
            ] {
                out.push(Sample::gauge(
                    &inv::JOB_STATE,
                    vec![job.clone(), st.to_string().to_lowercase()],
                    if st == s.state { 1.0 } else { 0.0 },
                ));
            }
            out.extend([
                Sample::gauge(&inv::JOB_GENERATION, l(), s.generation as f64),
                Sample::counter(&inv::JOB_RECOVERIES, l(), f64::from(s.recoveries)),
                Sample::counter(&inv::FENCED_EVENTS, l(), s.refused.events as f64),
                Sample::counter(&inv::FENCED_STREAMS, l(), s.refused.streams as f64),
                Sample::counter(&inv::FENCED_COMMANDS, l(), s.refused.commands as f64),
            ]);
            let mut created = BTreeMap::new();
            match self.checkpoints(&job) {
                Ok(c) => {
                    created.extend(
                        c.history
                            .iter()
                            .filter_map(|v| Some((v.epoch, v.created_ms?))),
                    );
                    out.extend(epoch_samples(&c, l));
                }
                Err(e) => tracing::warn!(%job, "metrics: cannot read the epoch log: {e}"),
            }
            match self.manifest_samples(&job, &created) {
                Ok(s) => out.extend(s),
                Err(e) => tracing::warn!(%job, "metrics: cannot read the manifests: {e}"),
            }
            out.extend(self.platform.samples(&job));
        }
        Ok(out)
    }

    /// The per-vertex snapshot and compaction bytes and the alignment and start-delay
    /// histograms of `job`, folding the durable manifests not folded yet (those of the
    /// current namespace; a manifest no longer retained when first seen is not counted).
    /// `created` maps epochs to their creation time in the epoch log.
    fn manifest_samples(
        &self,
        job: &str,
        created: &BTreeMap<u64, u64>,
    ) -> Result<Vec<Sample>, ManagerError> {
        let ns = self.namespace_of_job(job)?;
        let key = format!("{job}\u{0}{}", ns.describe());
        let folded = Arc::clone(lock(&self.observed.manifests).entry(key).or_default());
        let mut f = lock(&folded);
        // A published manifest is a durable epoch (design §5.6).
        for e in ns.manifest_epochs()? {
            if e.0 > f.upto {
                match ns.read_manifest(e) {
                    Ok(m) => f.fold(&m, created.get(&e.0).copied()),
                    // Retention may delete it meanwhile: the next one still counts.
                    Err(err) => tracing::debug!(%job, epoch = e.0, "metrics: manifest gone: {err}"),
                }
            }
        }
        Ok(f.samples(job))
    }

    /// The OpenMetrics text of [`Self::samples`].
    ///
    /// # Errors
    /// The job store cannot be read; a sample outside the metrics inventory.
    pub fn metrics_text(&self) -> Result<String, ManagerError> {
        nop_stream_metrics::encode(self.samples()?)
            .map_err(|e| ManagerError::Platform(format!("metrics: {e}")))
    }
}

/// `v`'s cumulative counts over its subtasks' samples.
fn vertex_counts(samples: &[Sample], v: &str) -> Counts {
    let sum = |f: &inv::Family| nop_stream_metrics::sum(samples, f, &[("vertex", v)]);
    Counts {
        records_in: sum(&inv::RECORDS_IN) as u64,
        records_out: sum(&inv::RECORDS_OUT) as u64,
        busy: sum(&inv::BUSY_TIME),
        backpressured: sum(&inv::BACKPRESSURED_TIME),
        idle: sum(&inv::IDLE_TIME),
    }
}

/// The epoch families of a job from its checkpoints view.
fn epoch_samples(c: &CheckpointsView, l: impl Fn() -> Vec<String>) -> Vec<Sample> {
    let latest = |s: &str| {
        c.history
            .iter()
            .filter(|v| match s {
                "created" => v.created_ms.is_some(),
                "durable" => v.durable_ms.is_some(),
                _ => v.committed_ms.is_some(),
            })
            .map(|v| v.epoch)
            .max()
            .unwrap_or(0) as f64
    };
    let durations = Histogram::seconds();
    for d in c.history.iter().filter_map(|v| v.duration_ms) {
        durations.observe(d as f64 / 1000.0);
    }
    let mut out = vec![
        Sample::gauge(&inv::EPOCH_TRIGGERED, l(), latest("created")),
        Sample::gauge(&inv::EPOCH_DURABLE, l(), latest("durable")),
        Sample::gauge(&inv::EPOCH_COMMITTED, l(), latest("committed")),
        Sample::gauge(&inv::EPOCHS_PENDING, l(), c.pending as f64),
        Sample::counter(&inv::EPOCHS_COMMITTED, l(), c.committed as f64),
        Sample::counter(&inv::EPOCHS_ABORTED, l(), c.aborted as f64),
        Sample::new(
            &inv::CHECKPOINT_DURATION,
            l(),
            Value::Histogram(durations.value()),
        ),
    ];
    if let Some(at) = c.latest_durable.as_ref().and_then(|v| v.durable_ms) {
        out.push(Sample::gauge(&inv::LAST_DURABLE, l(), at as f64 / 1000.0));
    }
    out
}
