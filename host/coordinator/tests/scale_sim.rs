//! The coordinator at scale, by simulation: scripted workers stand in for thousands of
//! subtasks placed on hundreds of fake nodes, so the coordinator's own cost (the epoch
//! loop, manifest assembly and publication, the epoch log, retention, restore planning)
//! is what is measured.
//!
//! The jobs are `k` copies of the keyed count's shape, `source (p) -> hash -> count+sink
//! (p)`, so a run of `2 k p` subtasks has `k p²` hash channels. Epochs are record-count
//! epochs (one as soon as the previous one is done), so no test waits for a clock.
//!
//! The small size runs with the normal tests and asserts correctness: every epoch is
//! durable and committed, in order, and after one node is lost the next attempt restores
//! every subtask from the latest durable epoch and places the lost node's subtasks on
//! surviving nodes. `coordinator_at_scale_prints_the_table` (ignored) prints the table of
//! `bench/RESULTS.md`:
//!
//! ```text
//! cargo test --release -p nop-stream-coordinator --test scale_sim -- --ignored --nocapture
//! ```

mod common;

use common::FakeError;

use nop_stream_api::{AttemptId, EpochId, PluginKind, Split, TaskId};
use nop_stream_checkpoint::coordinator::EpochState;
use nop_stream_checkpoint::{
    Location, Namespace, PendingTransaction, SegmentDescriptor, SplitState, TaskSnapshot, names,
};
use nop_stream_coordinator::{CoordinatorOptions, Next, Workers, run_job};
use nop_stream_core::{
    NodeSpec, PartitionedPlan, PluginCatalog, job_graph, parse_job_file, partitioned_plan,
    stream_graph,
};
use nop_stream_proto::{
    Deployment, FailureClass, SinkSettlement, TaskCommand, TaskEvent, TaskReport,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time this thread has run, in ns (`/proc/thread-self/schedstat`, user and system).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `pipelines` copies of `source (p) -> hash -> count (p) -> sink (p)`, the count and the
/// sink chained; `state_shards` = max(128, p).
fn job(pipelines: u32, p: u32) -> String {
    let mut s = format!(
        "[job]\nname = \"coord-sim\"\nparallelism = {p}\nstate_shards = {}\n\
         checkpoint_every_records = 1\n",
        p.max(128)
    );
    for i in 0..pipelines {
        s.push_str(&format!(
            "\n[[source]]\nname = \"src{i}\"\nplugin = \"src@1.0.0\"\n\n\
             [[operator]]\nname = \"agg{i}\"\nplugin = \"agg@1.0.0\"\n\
             inputs = [{{ from = \"src{i}\", partition = \"hash\" }}]\n\n\
             [[sink]]\nname = \"out{i}\"\nplugin = \"out@1.0.0\"\ninputs = [\"agg{i}\"]\n"
        ));
    }
    s
}

struct Catalog;

impl PluginCatalog for Catalog {
    fn describe(&self, node: &NodeSpec) -> Result<nop_stream_api::PluginInfo, String> {
        common::Fake.describe(node)
    }
}

fn plan(pipelines: u32, p: u32) -> PartitionedPlan {
    let m = parse_job_file("job.toml", &job(pipelines, p)).unwrap_or_else(|d| panic!("{d}"));
    let g = stream_graph(&m, &Catalog).unwrap_or_else(|d| panic!("{d}"));
    partitioned_plan(&job_graph(&g))
}

/// What a task of the plan is, for the snapshots the fake builds.
#[derive(Clone)]
struct TaskShape {
    task: TaskId,
    source: bool,
    sink: Option<String>,
    /// `(operator id, owned shards)` of a keyed vertex.
    keyed: Option<(String, std::ops::Range<u32>)>,
    /// Input edges, as the task records their watermarks (one per edge,
    /// [`nop_stream_checkpoint::input_watermarks`]).
    inputs: Vec<String>,
}

/// One deployment as the fake saw it.
struct Deployed {
    generation: u64,
    /// Node of each task.
    placement: BTreeMap<TaskId, usize>,
    /// The epoch each task restores from.
    restore: BTreeMap<TaskId, Option<EpochId>>,
}

/// Scripted workers over `nodes` fake nodes: tasks are placed round-robin over the live
/// nodes on every deployment; every task acknowledges every barrier at once with a
/// snapshot shaped like a real one (split cursors, one segment per owned shard, the sink's
/// pending transaction, one watermark per input edge); sinks commit when told. After
/// `epochs` committed epochs of a deployment the sources end their data. Optionally one
/// node is lost after `lose_after` committed epochs of the first deployment: its tasks
/// fail, the others are cancelled.
struct Sim {
    /// Vertex ids, by index in the plan.
    vertices: Vec<nop_stream_api::VertexId>,
    shapes: Vec<TaskShape>,
    nodes: usize,
    dead: BTreeSet<usize>,
    lose_after: Option<u64>,
    epochs: u64,
    events: VecDeque<TaskEvent<FakeError>>,
    attempt: AttemptId,
    live: bool,
    reads: u64,
    committed_in_attempt: BTreeSet<EpochId>,
    sinks: usize,
    ended: bool,
    deployments: Vec<Deployed>,
    /// The node lost, and when (wall, this thread's CPU).
    lost: Option<(usize, Instant)>,
    /// When the last join returned.
    joined_at: Option<(Instant, u64)>,
    /// Restore planning: from the join of the failed attempt to the next deployment.
    planning: Option<(Duration, u64)>,
    /// From the node's loss to the first epoch made durable after it.
    recovery: Option<Duration>,
    /// This thread's CPU time at each barrier injection of the live attempt, and the CPU
    /// the fake itself spent building snapshots since the previous one.
    inject_cpu: Vec<(u64, u64)>,
    fake_cpu: u64,
    /// This thread's CPU when the sources' ends of data were queued.
    end_cpu: Option<u64>,
    /// Whether tasks record their input watermarks, as tasks do (design §8.5): one per
    /// input edge (hosts before recorded one per input channel, O(p²) per hash edge).
    channel_watermarks: bool,
}

impl Sim {
    fn new(plan: &PartitionedPlan, nodes: usize, epochs: u64) -> Self {
        let mut shapes = Vec::new();
        for v in &plan.vertices {
            let head = &v.operators[0];
            let tail = v.operators.last().expect("operators");
            let keyed = v
                .operators
                .iter()
                .find(|o| o.kind == PluginKind::Operator && v.keyed)
                .map(|o| o.operator_id.to_string());
            for st in &v.subtasks {
                shapes.push(TaskShape {
                    task: st.task.clone(),
                    source: head.kind == PluginKind::Source,
                    sink: (tail.kind == PluginKind::Sink).then(|| tail.operator_id.to_string()),
                    keyed: keyed
                        .clone()
                        .map(|op| (op, v.owned_shards(st, plan.job.state_shard_count))),
                    inputs: nop_stream_checkpoint::input_watermarks(
                        st.inputs.iter().map(|c| (c, 0, false)),
                    )
                    .0
                    .into_iter()
                    .map(|(edge, _)| edge)
                    .collect(),
                });
            }
        }
        let sinks = shapes.iter().filter(|s| s.sink.is_some()).count();
        Sim {
            vertices: plan.vertices.iter().map(|v| v.id.clone()).collect(),
            shapes,
            nodes,
            dead: BTreeSet::new(),
            lose_after: None,
            epochs,
            events: VecDeque::new(),
            attempt: AttemptId(0),
            live: false,
            reads: 0,
            committed_in_attempt: BTreeSet::new(),
            sinks,
            ended: false,
            deployments: Vec::new(),
            lost: None,
            joined_at: None,
            planning: None,
            recovery: None,
            inject_cpu: Vec::new(),
            fake_cpu: 0,
            end_cpu: None,
            channel_watermarks: true,
        }
    }

    fn snapshot(&self, s: &TaskShape, epoch: EpochId) -> TaskSnapshot {
        let sub = s.task.subtask.0;
        TaskSnapshot {
            task: s.task.clone(),
            epoch,
            end_of_data: false,
            segments: match &s.keyed {
                Some((op, shards)) => shards
                    .clone()
                    .map(|shard| SegmentDescriptor {
                        state_path: names::state_path("ns", epoch.0, op, sub, shard, "acc"),
                        operator_id: op.clone(),
                        shard,
                        state: "acc".into(),
                        file: names::segment_file(epoch.0, op, sub, self.attempt.0),
                        offset: u64::from(shard) * 4096,
                        len: 4096,
                        checksum: format!("{:016x}", u64::from(shard) ^ epoch.0),
                        codec: "kv-delta/1".into(),
                        schema_version: 1,
                        entries: 100,
                    })
                    .collect(),
                None => Vec::new(),
            },
            operator_state: Vec::new(),
            splits: if s.source {
                vec![SplitState {
                    split_id: format!("{}-{sub}", s.task.vertex),
                    descriptor: hex::encode(format!("partition {sub}")),
                    cursor: hex::encode((epoch.0 * 1_000_000).to_be_bytes()),
                    finished: false,
                    max_timestamp: None,
                }]
            } else {
                Vec::new()
            },
            watermarks: if self.channel_watermarks {
                s.inputs
                    .iter()
                    .map(|c| (c.clone(), epoch.0 as i64 * 1000))
                    .collect()
            } else {
                Vec::new()
            },
            ended_inputs: Vec::new(),
            pending_transactions: if s.sink.is_some() {
                vec![PendingTransaction {
                    epoch,
                    txn: format!("{}@{epoch}", s.task),
                    committable: String::new(),
                }]
            } else {
                Vec::new()
            },
            sink_operator: s.sink.clone(),
            snapshot_bytes: 4096,
            alignment_ms: 0,
            duration_ms: 1,
            async_ms: 0,
            barrier_unix_ms: 0,
            compacted_bytes: 0,
            records_in_total: epoch.0 * 1000,
            records_out_total: epoch.0 * 1000,
        }
    }

    fn current(&self) -> &Deployed {
        self.deployments.last().expect("deployed")
    }
}

impl Workers for Sim {
    type Error = FakeError;

    fn discover_splits(&mut self, vertex: usize, _a: AttemptId) -> Result<Vec<Split>, FakeError> {
        // One split per source subtask, named as its snapshots name it.
        let vertex_id = &self.vertices[vertex];
        Ok(self
            .shapes
            .iter()
            .filter(|s| s.source && &s.task.vertex == vertex_id)
            .map(|s| Split {
                id: format!("{}-{}", s.task.vertex, s.task.subtask.0),
                descriptor: format!("partition {}", s.task.subtask.0).into_bytes(),
            })
            .collect())
    }

    fn settle_sinks(&mut self, _s: &[SinkSettlement], _a: AttemptId) -> Result<(), FakeError> {
        Ok(())
    }

    fn deploy(&mut self, d: Deployment) -> Result<(), FakeError> {
        assert!(
            !self.live,
            "deployed while the previous generation was live"
        );
        if let Some((at, cpu)) = self.joined_at.take() {
            self.planning = Some((at.elapsed(), thread_cpu_ns() - cpu));
        }
        self.live = true;
        self.ended = false;
        self.attempt = d.attempt;
        self.committed_in_attempt.clear();
        self.inject_cpu.clear();
        self.fake_cpu = 0;
        let alive: Vec<usize> = (0..self.nodes).filter(|n| !self.dead.contains(n)).collect();
        let placement = d
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.task.clone(), alive[i % alive.len()]))
            .collect();
        let restore = d
            .tasks
            .iter()
            .map(|t| (t.task.clone(), t.restore.epoch))
            .collect();
        self.deployments.push(Deployed {
            generation: d.generation,
            placement,
            restore,
        });
        Ok(())
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        let attempt = self.attempt;
        match command {
            TaskCommand::InjectBarrier(epoch) => {
                // One injection (the first source's) fans out to every task's ACK.
                if self.shapes[0].task == *task {
                    let before = thread_cpu_ns();
                    self.inject_cpu.push((before, self.fake_cpu));
                    for s in &self.shapes {
                        let snapshot = Box::new(self.snapshot(s, epoch));
                        self.events.push_back(TaskEvent::Ack { attempt, snapshot });
                    }
                    self.fake_cpu += thread_cpu_ns() - before;
                }
            }
            TaskCommand::Commit(epoch) => {
                if self.committed_in_attempt.is_empty()
                    && let (Some((_, at)), None) = (self.lost, self.recovery)
                {
                    // The first epoch made durable after the node was lost.
                    self.recovery = Some(at.elapsed());
                }
                // Each epoch counted once, on its first sink's commit.
                self.committed_in_attempt.insert(epoch);
                self.events.push_back(TaskEvent::Committed {
                    attempt,
                    task: task.clone(),
                    epoch,
                });
            }
            TaskCommand::Finish => {
                self.events.push_back(TaskEvent::Finished {
                    attempt,
                    report: TaskReport {
                        task: task.to_string(),
                        ..TaskReport::default()
                    },
                });
            }
        }
    }

    fn next_event(&mut self, _timeout: Duration) -> Next<FakeError> {
        if let Some(e) = self.events.pop_front() {
            return Next::Event(e);
        }
        if !self.live {
            return Next::Closed;
        }
        let done = self.committed_in_attempt.len() as u64;
        if self.deployments.len() == 1
            && self.lost.is_none()
            && self.lose_after.is_some_and(|n| done >= n)
        {
            // One node dies: its tasks fail; the rest are cancelled once fenced.
            let node = self.nodes / 2;
            self.dead.insert(node);
            self.lost = Some((node, Instant::now()));
            let attempt = self.attempt;
            let on_node: Vec<TaskId> = self
                .current()
                .placement
                .iter()
                .filter(|(_, n)| **n == node)
                .map(|(t, _)| t.clone())
                .collect();
            for t in on_node {
                self.events.push_back(TaskEvent::Failed {
                    attempt,
                    task: t,
                    error: FakeError::Task(
                        FailureClass::Recoverable,
                        format!("node n{node} lost (lease expired)"),
                    ),
                });
            }
        } else if done >= self.epochs && !self.ended {
            self.ended = true;
            self.end_cpu = Some(thread_cpu_ns());
            let attempt = self.attempt;
            for s in &self.shapes {
                self.events.push_back(TaskEvent::EndOfData {
                    attempt,
                    task: s.task.clone(),
                });
            }
        } else {
            // The sources read on: a record-count epoch starts when none is in flight.
            self.reads += 1;
        }
        match self.events.pop_front() {
            Some(e) => Next::Event(e),
            None => Next::Timeout,
        }
    }

    fn fence(&mut self, _generation: u64) {
        // Every task not on the lost node reports its cancellation, after the events
        // already queued.
        let attempt = self.attempt;
        if let Some((node, _)) = self.lost
            && self.deployments.len() == 1
        {
            let others: Vec<TaskId> = self
                .current()
                .placement
                .iter()
                .filter(|(_, n)| **n != node)
                .map(|(t, _)| t.clone())
                .collect();
            for t in others {
                self.events.push_back(TaskEvent::Failed {
                    attempt,
                    task: t,
                    error: FakeError::Task(FailureClass::Secondary, "cancelled".into()),
                });
            }
        }
    }

    fn join(&mut self) {
        self.live = false;
        self.events.clear();
        self.joined_at = Some((Instant::now(), thread_cpu_ns()));
    }

    fn records(&self) -> (u64, u64) {
        (self.reads, 0)
    }
}

fn opts() -> CoordinatorOptions {
    CoordinatorOptions {
        restart_delay: Duration::ZERO,
        poll: Duration::from_millis(1),
        ..CoordinatorOptions::default()
    }
}

/// What one simulated size measured.
struct Row {
    subtasks: usize,
    nodes: usize,
    channels: usize,
    plan_ms: f64,
    epochs: usize,
    cpu_per_epoch_ms: f64,
    wall_per_epoch_ms: f64,
    manifest_bytes: u64,
    log_bytes_per_epoch: f64,
    planning_ms: f64,
    planning_cpu_ms: f64,
    recovery_ms: f64,
    end_cpu_ms: f64,
}

/// Bytes of the files under `dir` whose relative path starts with `prefix`.
fn bytes_under(dir: &std::path::Path, prefix: &str) -> (u64, usize) {
    fn walk(d: &std::path::Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if let Ok(m) = e.metadata() {
                out.push((p, m.len()));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
        .iter()
        .filter(|(p, _)| {
            p.strip_prefix(dir)
                .is_ok_and(|r| r.to_string_lossy().starts_with(prefix))
        })
        .fold((0, 0), |(b, n), (_, l)| (b + l, n + 1))
}

/// Runs `pipelines × (source p -> count+sink p)` over `nodes` nodes for `epochs` epochs
/// after losing one node at `lose_after`, checks the outcome and returns its figures.
fn simulate(pipelines: u32, p: u32, nodes: usize, epochs: u64, lose_after: u64) -> Row {
    let t = Instant::now();
    let plan = plan(pipelines, p);
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    let channels = plan.edges.iter().map(|e| e.channels.len()).sum();
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(Namespace::open(&Location::Local(dir.path().to_owned())).unwrap());
    let mut sim = Sim::new(&plan, nodes, epochs);
    sim.lose_after = Some(lose_after);
    // SIM_WATERMARKS=0: tasks record no input watermark (a job without event time whose
    // tasks leave out channels at the initial watermark would record none).
    sim.channel_watermarks = std::env::var("SIM_WATERMARKS").map_or(true, |v| v != "0");
    let started = Instant::now();
    let report = run_job(&plan, &mut sim, Arc::clone(&storage), &opts()).unwrap();
    let wall = started.elapsed();

    // Correctness: one recovery; the second deployment restores every task from the
    // latest epoch durable before the loss and places no task on the lost node; the lost
    // node's tasks are re-placed; every epoch logged CREATED after the recovery is durable
    // and committed, in order, and so is every epoch of the first attempt up to the loss.
    assert_eq!(report.recoveries, 1);
    let lost = sim.lost.expect("a node was lost").0;
    assert_eq!(sim.deployments.len(), 2);
    let (first, second) = (&sim.deployments[0], &sim.deployments[1]);
    assert!(second.generation > first.generation);
    let log = storage.read_log().unwrap();
    let durable_before: Vec<u64> = log
        .iter()
        .filter(|r| r.attempt.0 == 1 && r.state == EpochState::Durable)
        .map(|r| r.epoch.0)
        .collect();
    assert_eq!(durable_before.len() as u64, lose_after);
    let restored_from = EpochId(*durable_before.last().unwrap());
    assert!(
        second.restore.values().all(|e| *e == Some(restored_from)),
        "every task restores from epoch {restored_from}"
    );
    let moved: Vec<&TaskId> = first
        .placement
        .iter()
        .filter(|(_, n)| **n == lost)
        .map(|(t, _)| t)
        .collect();
    assert!(!moved.is_empty());
    assert!(second.placement.values().all(|n| *n != lost));
    assert!(moved.iter().all(|t| second.placement.contains_key(*t)));
    assert_eq!(second.placement.len(), first.placement.len());
    let attempt2 = report.attempt;
    let created: Vec<u64> = log
        .iter()
        .filter(|r| r.attempt.0 == attempt2 && r.state == EpochState::Created)
        .map(|r| r.epoch.0)
        .collect();
    for state in [EpochState::Durable, EpochState::Committed] {
        let got: Vec<u64> = log
            .iter()
            .filter(|r| r.attempt.0 == attempt2 && r.state == state)
            .map(|r| r.epoch.0)
            .collect();
        assert_eq!(
            got, created,
            "every epoch of the recovered attempt is {state:?}"
        );
    }
    // `epochs` periodic epochs, then the final one.
    assert_eq!(created.len() as u64, epochs + 1);
    assert!(created.windows(2).all(|w| w[0] < w[1]));
    assert!(created[0] > restored_from.0);
    assert_eq!(report.final_epoch, created.last().copied());
    let m = storage.latest_manifest().unwrap().unwrap();
    assert_eq!(m.tasks.len(), plan.ack_set.len());
    assert!(m.final_epoch);
    assert_eq!(
        report.committed_total,
        (lose_after + epochs + 1) * sim.sinks as u64
    );

    // Figures of the recovered attempt's periodic epochs, from the second barrier to the
    // last periodic one: the first is a warm-up, and the final epoch's barrier comes after
    // every task's end of data.
    let marks = &sim.inject_cpu[..sim.inject_cpu.len() - 1];
    assert!(marks.len() >= 3, "at least 3 periodic epochs are timed");
    let (first_mark, last_mark) = (marks[1], marks[marks.len() - 1]);
    let n = marks.len() - 2;
    let cpu = (last_mark.0 - first_mark.0) - (last_mark.1 - first_mark.1);
    let manifest_bytes = serde_json::to_vec(&m).unwrap().len() as u64;
    let (log_bytes, _) = bytes_under(dir.path(), names::LOG);
    let logged_epochs = log
        .iter()
        .map(|r| r.epoch.0)
        .collect::<BTreeSet<_>>()
        .len()
        .max(1);
    let (planning, planning_cpu) = sim.planning.expect("a recovery was planned");
    Row {
        subtasks: plan.ack_set.len(),
        nodes,
        channels,
        plan_ms,
        epochs: n,
        cpu_per_epoch_ms: cpu as f64 / n as f64 / 1e6,
        wall_per_epoch_ms: wall.as_secs_f64() * 1e3 / (lose_after + epochs + 1) as f64,
        manifest_bytes,
        log_bytes_per_epoch: log_bytes as f64 / logged_epochs as f64,
        planning_ms: planning.as_secs_f64() * 1e3,
        planning_cpu_ms: planning_cpu as f64 / 1e6,
        recovery_ms: sim.recovery.expect("recovered").as_secs_f64() * 1e3,
        end_cpu_ms: (sim.inject_cpu[sim.inject_cpu.len() - 1].0 - sim.end_cpu.expect("ended"))
            as f64
            / 1e6,
    }
}

fn print(rows: &[Row]) {
    println!(
        "| subtasks | nodes | hash channels | plan build ms | epochs timed | coordinator CPU \
         ms/epoch | wall ms/epoch (fake incl.) | manifest bytes | epoch log bytes/epoch | \
         restore planning ms (CPU) | node loss → first durable epoch ms | every end of data → \
         final barrier, CPU ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {} | {:.2} | {:.1} | {} | {:.0} | {:.1} ({:.1}) | {:.0} | {:.1} |",
            r.subtasks,
            r.nodes,
            r.channels,
            r.plan_ms,
            r.epochs,
            r.cpu_per_epoch_ms,
            r.wall_per_epoch_ms,
            r.manifest_bytes,
            r.log_bytes_per_epoch,
            r.planning_ms,
            r.planning_cpu_ms,
            r.recovery_ms,
            r.end_cpu_ms
        );
    }
}

#[test]
fn a_small_cluster_checkpoints_every_epoch_and_replans_a_lost_nodes_subtasks() {
    // 2 pipelines at p = 10: 40 subtasks over 10 nodes; node 5 is lost after 3 epochs.
    let row = simulate(2, 10, 10, 6, 3);
    assert_eq!(row.subtasks, 40);
    assert_eq!(row.channels, 200);
    assert!(row.manifest_bytes > 0);
}

#[test]
#[ignore = "measures the coordinator at 100, 1,000 and 10,000 subtasks; run with --release"]
fn coordinator_at_scale_prints_the_table() {
    let sizes: &[(u32, u32, usize, u64)] = &[
        // (pipelines, parallelism, nodes, epochs after the recovery)
        (1, 50, 10, 20),
        (1, 500, 100, 10),
        (10, 500, 500, 6),
    ];
    let only: Option<usize> = std::env::var("SIM_ONLY").ok().and_then(|v| v.parse().ok());
    let mut rows = Vec::new();
    for (i, &(k, p, nodes, epochs)) in sizes.iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let epochs = std::env::var("SIM_EPOCHS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(epochs);
        rows.push(simulate(k, p, nodes, epochs, 2));
        print(&rows[rows.len() - 1..]);
    }
    print(&rows);
}
