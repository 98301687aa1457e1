//! The coordinator's recovery and epoch loops against scripted workers: a job runs to
//! its final epoch, a failed attempt is fenced and joined before the next deployment,
//! events of a stale attempt are refused and counted, and an early storage failure still
//! fences and joins.

mod common;

use common::FakeError;

use nop_stream_api::{AttemptId, EpochId, Split, TaskId};
use nop_stream_checkpoint::coordinator::EpochState;
use nop_stream_checkpoint::{Location, Namespace, PendingTransaction, Scoped, TaskSnapshot};
use nop_stream_coordinator::{CoordinatorOptions, Next, Workers, run_job};
use nop_stream_core::PartitionedPlan;
use nop_stream_proto::{
    Deployment, FailureClass, SinkSettlement, TaskCommand, TaskError, TaskEvent, TaskReport,
};
use nop_stream_storage::faults::{Fault, Faulty, Op};
use nop_stream_storage::memory::MemStore;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// What the fake did, in order.
#[derive(Debug, Clone, PartialEq)]
enum Did {
    Discover,
    Deploy(u64),
    Fence(u64),
    Join,
}

/// Workers that answer commands at once: every task reports its end of data on deploy,
/// acknowledges every barrier, sinks commit when told, tasks finish on Finish.
struct Scripted {
    plan: PartitionedPlan,
    log: Vec<Did>,
    events: VecDeque<TaskEvent<FakeError>>,
    attempt: AttemptId,
    /// Fail this many deployments with a task failure of this class.
    fail_deploys: u32,
    /// Fail this many split discoveries with a failure of `fail_class`.
    fail_discoveries: u32,
    fail_class: FailureClass,
    /// Emit an Ack of an older attempt right after deploying.
    stale_ack: bool,
    live: bool,
    /// `(step, total)`: the sources read `step` records per event polled and reach their
    /// end of data at `total`; `None`: end of data at once.
    feed: Option<(u64, u64)>,
    read: u64,
    /// How many polls found no event (each one a `poll` interval of a real run).
    timeouts: u32,
}

impl Scripted {
    fn new(plan: PartitionedPlan) -> Self {
        Scripted {
            plan,
            log: Vec::new(),
            events: VecDeque::new(),
            attempt: AttemptId(0),
            fail_deploys: 0,
            fail_discoveries: 0,
            fail_class: FailureClass::Recoverable,
            stale_ack: false,
            live: false,
            feed: None,
            read: 0,
            timeouts: 0,
        }
    }

    fn tasks(&self) -> Vec<TaskId> {
        self.plan
            .vertices
            .iter()
            .flat_map(|v| v.subtasks.iter().map(|s| s.task.clone()))
            .collect()
    }

    fn is_sink(&self, t: &TaskId) -> bool {
        self.plan.vertices.iter().any(|v| {
            v.id == t.vertex
                && v.operators.last().map(|o| o.kind) == Some(nop_stream_api::PluginKind::Sink)
        })
    }

    fn snapshot(&self, task: &TaskId, epoch: EpochId) -> TaskSnapshot {
        TaskSnapshot {
            task: task.clone(),
            epoch,
            end_of_data: true,
            segments: Vec::new(),
            operator_state: Vec::new(),
            splits: Vec::new(),
            watermarks: Vec::new(),
            ended_inputs: Vec::new(),
            pending_transactions: if self.is_sink(task) {
                vec![PendingTransaction {
                    epoch,
                    txn: format!("{task}@{epoch}"),
                    committable: String::new(),
                }]
            } else {
                Vec::new()
            },
            sink_operator: None,
            snapshot_bytes: 0,
            alignment_ms: 0,
            duration_ms: 0,
            async_ms: 0,
            barrier_unix_ms: 0,
            compacted_bytes: 0,
            records_in_total: 0,
            records_out_total: 0,
        }
    }
}

impl Workers for Scripted {
    type Error = FakeError;

    fn discover_splits(
        &mut self,
        _vertex: usize,
        _attempt: AttemptId,
    ) -> Result<Vec<Split>, FakeError> {
        self.log.push(Did::Discover);
        if self.fail_discoveries > 0 {
            self.fail_discoveries -= 1;
            return Err(FakeError::Task(
                self.fail_class,
                "node-1: split discovery: no answer within 120s".into(),
            ));
        }
        Ok(vec![Split {
            id: "only".into(),
            descriptor: Vec::new(),
        }])
    }

    fn settle_sinks(&mut self, _s: &[SinkSettlement], _a: AttemptId) -> Result<(), FakeError> {
        Ok(())
    }

    fn deploy(&mut self, d: Deployment) -> Result<(), FakeError> {
        assert!(
            !self.live,
            "deployed while the previous generation was live"
        );
        self.live = true;
        self.log.push(Did::Deploy(d.generation));
        self.attempt = d.attempt;
        let tasks = self.tasks();
        if self.stale_ack {
            self.stale_ack = false;
            let old = AttemptId(d.attempt.0 - 1);
            self.events.push_back(TaskEvent::Ack {
                attempt: old,
                snapshot: Box::new(self.snapshot(&tasks[0], EpochId(1))),
            });
        }
        if self.fail_deploys > 0 {
            self.fail_deploys -= 1;
            for (i, t) in tasks.iter().enumerate() {
                let error = if i == 0 {
                    FakeError::Task(self.fail_class, "trap in task 0".into())
                } else {
                    FakeError::Task(FailureClass::Secondary, "cancelled".into())
                };
                self.events.push_back(TaskEvent::Failed {
                    attempt: d.attempt,
                    task: t.clone(),
                    error,
                });
            }
            return Ok(());
        }
        if self.feed.is_none() {
            self.end_of_data();
        }
        Ok(())
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        let attempt = self.attempt;
        match command {
            TaskCommand::InjectBarrier(epoch) => {
                // One injection per source fans out to every task's ACK.
                if self.plan.vertices[0].subtasks[0].task == *task {
                    for t in self.tasks() {
                        let snapshot = Box::new(self.snapshot(&t, epoch));
                        self.events.push_back(TaskEvent::Ack { attempt, snapshot });
                    }
                }
            }
            TaskCommand::Commit(epoch) => {
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
        if let Some((step, total)) = self.feed
            && self.live
            && self.read < total
        {
            self.read += step;
            if self.read >= total {
                self.end_of_data();
            }
        }
        match self.events.pop_front() {
            Some(e) => Next::Event(e),
            None => {
                self.timeouts += 1;
                Next::Timeout
            }
        }
    }

    fn fence(&mut self, generation: u64) {
        self.log.push(Did::Fence(generation));
    }

    fn join(&mut self) {
        self.live = false;
        self.events.clear();
        self.log.push(Did::Join);
    }

    fn records(&self) -> (u64, u64) {
        (self.read, 0)
    }
}

impl Scripted {
    fn end_of_data(&mut self) {
        for t in self.tasks() {
            self.events.push_back(TaskEvent::EndOfData {
                attempt: self.attempt,
                task: t,
            });
        }
    }
}

/// A namespace in `dir`.
fn local(dir: &std::path::Path) -> Arc<Namespace> {
    Arc::new(Namespace::open(&Location::Local(dir.to_owned())).unwrap())
}

/// A namespace in memory whose epoch-record creates all fail (503s).
fn failing_publish() -> Arc<Namespace> {
    let faulty = Faulty::new(Arc::new(MemStore::new()));
    faulty.inject(Op::PutIfAbsent, "epochs/", u32::MAX, Fault::Unavailable);
    Arc::new(Namespace::new(Scoped::new(Arc::new(faulty), "")))
}

fn opts() -> CoordinatorOptions {
    CoordinatorOptions {
        restart_delay: Duration::ZERO,
        poll: Duration::from_millis(1),
        ..CoordinatorOptions::default()
    }
}

#[test]
fn a_job_runs_to_its_final_epoch_and_commits_it() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(2, 8);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    let report = run_job(&plan, &mut w, Arc::clone(&storage), &opts()).unwrap();
    assert_eq!(w.log, [Did::Discover, Did::Deploy(1), Did::Join]);
    let final_epoch = report.final_epoch.expect("a final epoch");
    let m = storage.latest_manifest().unwrap().unwrap();
    assert!(m.final_epoch);
    assert_eq!(m.epoch.0, final_epoch);
    assert_eq!(m.tasks.len(), plan.ack_set.len());
    let log = storage.read_log().unwrap();
    assert!(
        log.iter()
            .any(|r| r.epoch.0 == final_epoch && r.state == EpochState::Durable)
    );
    assert!(
        log.iter()
            .any(|r| r.epoch.0 == final_epoch && r.state == EpochState::Committed)
    );
    // Both sink subtasks' transactions of the final epoch are reported committed, once.
    assert_eq!(report.committed.len(), 2);
    assert_eq!(report.committed_total, 2);
    assert_eq!(report.tasks.len(), plan.ack_set.len());
    // A second run finds the job finished and deploys nothing.
    let mut again = Scripted::new(plan.clone());
    let r2 = run_job(&plan, &mut again, storage, &opts()).unwrap();
    assert!(r2.already_finished);
    assert!(again.log.is_empty(), "{:?}", again.log);
}

/// Every step of a bounded job's end follows from an event: the final epoch starts on the
/// last end of data, not at the next tick one `poll` later (10 ms a job, before).
#[test]
fn a_bounded_job_ends_without_waiting_for_a_poll_interval() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(2, 8);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    let report = run_job(&plan, &mut w, storage, &opts()).unwrap();
    assert!(report.final_epoch.is_some());
    assert_eq!(w.timeouts, 0, "polls that found no event");
}

#[test]
fn a_failed_attempt_is_fenced_and_joined_before_the_next_deployment() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(2, 8);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 1;
    let report = run_job(&plan, &mut w, storage, &opts()).unwrap();
    assert_eq!(report.recoveries, 1);
    assert_eq!(report.attempt, 2);
    assert_eq!(
        w.log,
        [
            Did::Discover,
            Did::Deploy(1),
            Did::Fence(1),
            Did::Join,
            Did::Discover,
            Did::Deploy(2),
            Did::Join
        ]
    );
}

#[test]
fn the_root_cause_is_reported_not_the_cancellations_and_fatal_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(2, 8);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 5;
    w.fail_class = FailureClass::Fatal;
    let err = run_job(&plan, &mut w, storage, &opts()).unwrap_err();
    assert_eq!(err.to_string(), "trap in task 0");
    assert_eq!(
        w.log.iter().filter(|d| matches!(d, Did::Deploy(_))).count(),
        1,
        "{:?}",
        w.log
    );
}

#[test]
fn the_restart_budget_bounds_recoveries() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(1, 4);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 10;
    let o = CoordinatorOptions {
        max_restarts: Some(2),
        ..opts()
    };
    let err = run_job(&plan, &mut w, storage, &o).unwrap_err();
    assert_eq!(err.class(), FailureClass::Recoverable);
    let deploys: Vec<_> = w
        .log
        .iter()
        .filter_map(|d| {
            if let Did::Deploy(g) = d {
                Some(*g)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(deploys, [1, 2, 3], "generations grow with every recovery");
}

/// Pins the default budget (3 recoveries per run) ending a run after any outage of an
/// external system longer than about a second: here five failed attempts in a row, a
/// database restarting. With the failure-rate budget (10 within 60 s) the run recovers
/// and finishes.
#[test]
fn an_outage_of_a_few_failed_attempts_does_not_end_a_run_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(1, 4);
    assert!(plan.job.checkpoint_interval_ms.is_some());
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 5;
    let report = run_job(&plan, &mut w, storage, &opts()).unwrap();
    assert_eq!(report.recoveries, 5);
    assert!(report.final_epoch.is_some());
    // Failures spread wider than the window never exhaust it.
    let dir = tempfile::tempdir().unwrap();
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 4;
    let o = CoordinatorOptions {
        max_restarts: Some(1),
        restart_window: Duration::ZERO,
        ..opts()
    };
    assert_eq!(run_job(&plan, &mut w, storage, &o).unwrap().recoveries, 4);
}

/// Pins a job failed at once by a node that did not answer its split discovery (a
/// recoverable failure before any deployment, seen after a coordinator restart): it is a
/// recovery within the budget, and a fatal one still ends the run.
#[test]
fn a_recoverable_failure_before_the_deployment_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(1, 4);
    let mut w = Scripted::new(plan.clone());
    w.fail_discoveries = 2;
    let report = run_job(&plan, &mut w, local(dir.path()), &opts()).unwrap();
    assert_eq!(report.recoveries, 2);
    assert!(report.final_epoch.is_some());
    let discoveries = w.log.iter().filter(|d| matches!(d, Did::Discover)).count();
    let deploys = w.log.iter().filter(|d| matches!(d, Did::Deploy(_))).count();
    assert_eq!((discoveries, deploys), (3, 1));
    let dir = tempfile::tempdir().unwrap();
    let mut w = Scripted::new(plan.clone());
    w.fail_discoveries = 1;
    w.fail_class = FailureClass::Fatal;
    let e = run_job(&plan, &mut w, local(dir.path()), &opts()).unwrap_err();
    assert!(e.to_string().contains("split discovery"), "{e}");
    assert!(!w.log.iter().any(|d| matches!(d, Did::Deploy(_))));
}

#[test]
fn events_of_a_stale_attempt_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(1, 4);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    // The first attempt fails; the second one receives an ACK of attempt 1 first.
    w.fail_deploys = 1;
    let report = run_job(
        &plan,
        &mut StaleOnSecond(&mut w),
        Arc::clone(&storage),
        &opts(),
    )
    .unwrap();
    assert_eq!(report.refused_stale_events, 1);
    assert_eq!(report.recoveries, 1);
    let m = storage.latest_manifest().unwrap().unwrap();
    assert!(
        m.tasks.iter().all(|t| t.epoch == m.epoch),
        "the stale ACK never entered a manifest"
    );
}

/// Arms the stale ACK for the second deployment.
struct StaleOnSecond<'a>(&'a mut Scripted);

impl Workers for StaleOnSecond<'_> {
    type Error = FakeError;
    fn discover_splits(&mut self, v: usize, a: AttemptId) -> Result<Vec<Split>, FakeError> {
        self.0.discover_splits(v, a)
    }
    fn settle_sinks(&mut self, s: &[SinkSettlement], a: AttemptId) -> Result<(), FakeError> {
        self.0.settle_sinks(s, a)
    }
    fn deploy(&mut self, d: Deployment) -> Result<(), FakeError> {
        if d.generation == 2 {
            self.0.stale_ack = true;
        }
        self.0.deploy(d)
    }
    fn send(&mut self, t: &TaskId, c: TaskCommand) {
        self.0.send(t, c)
    }
    fn next_event(&mut self, timeout: Duration) -> Next<FakeError> {
        self.0.next_event(timeout)
    }
    fn fence(&mut self, g: u64) {
        self.0.fence(g)
    }
    fn join(&mut self) {
        self.0.join()
    }
    fn records(&self) -> (u64, u64) {
        self.0.records()
    }
}

#[test]
fn a_storage_failure_mid_attempt_still_fences_and_joins() {
    let plan = common::plan(2, 8);
    let storage = failing_publish();
    let mut w = Scripted::new(plan.clone());
    let err = run_job(&plan, &mut w, storage, &opts()).unwrap_err();
    assert!(err.to_string().contains("503 Service Unavailable"), "{err}");
    assert_eq!(
        w.log,
        [Did::Discover, Did::Deploy(1), Did::Fence(1), Did::Join]
    );
}

#[test]
fn record_count_checkpoints_take_one_epoch_per_that_many_records_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut plan = common::plan(1, 4);
    plan.job.checkpoint_interval_ms = None;
    plan.job.checkpoint_every_records = Some(1_000);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    // 100 records per event, end of data after 10,050 records read: one epoch at each
    // thousand read (10), then the final epoch.
    w.feed = Some((100, 10_050));
    let report = run_job(&plan, &mut w, Arc::clone(&storage), &opts()).unwrap();
    let durable: Vec<u64> = storage
        .read_log()
        .unwrap()
        .iter()
        .filter(|r| r.state == EpochState::Durable)
        .map(|r| r.epoch.0)
        .collect();
    assert_eq!(durable.len(), 11, "{durable:?}");
    assert_eq!(report.final_epoch, durable.last().copied());

    // Without the setting, the same run takes only the final epoch.
    let dir = tempfile::tempdir().unwrap();
    plan.job.checkpoint_every_records = None;
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.feed = Some((100, 10_050));
    run_job(&plan, &mut w, Arc::clone(&storage), &opts()).unwrap();
    let durable = storage
        .read_log()
        .unwrap()
        .iter()
        .filter(|r| r.state == EpochState::Durable)
        .count();
    assert_eq!(durable, 1);
}

#[test]
fn committed_is_recorded_when_the_sinks_commit_not_with_the_next_epoch() {
    // A commit arrives as an event and queues no command; COMMITTED used to be written
    // only with the next command, the next epoch's start (up to an interval late).
    let dir = tempfile::tempdir().unwrap();
    let mut plan = common::plan(1, 4);
    plan.job.checkpoint_interval_ms = None;
    plan.job.checkpoint_every_records = Some(1_000);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    // An epoch at each thousand records read, 100 per event: each is committed a few
    // events after its start, long before the next one starts.
    w.feed = Some((100, 10_050));
    run_job(&plan, &mut w, Arc::clone(&storage), &opts()).unwrap();
    let log = storage.read_log().unwrap();
    let at = |epoch: u64, state: EpochState| {
        log.iter()
            .position(|r| r.epoch.0 == epoch && r.state == state)
    };
    let committed: Vec<u64> = log
        .iter()
        .filter(|r| r.state == EpochState::Committed)
        .map(|r| r.epoch.0)
        .collect();
    assert_eq!(committed.len(), 11, "{log:?}");
    // The final epoch (11) starts as soon as the data ends, which may be before epoch 10's
    // commit arrives.
    for &e in &committed[..committed.len() - 2] {
        let next = at(e + 1, EpochState::Created).expect("the next epoch started");
        assert!(
            at(e, EpochState::Committed).unwrap() < next,
            "epoch {e} was recorded committed only after epoch {} started: {log:?}",
            e + 1
        );
    }
}

/// A deposed coordinator's attempt that still runs after its successor started (a leader
/// SIGSTOPped past its lease, then resumed) makes the epoch after the last one it logged
/// durable next. Failure pinned: the successor fenced only the epochs up to the last one
/// logged, so that next epoch stayed open and the zombie's publish of it succeeded
/// (and its sinks would then commit records the successor replays). Now every new
/// attempt also fences `max_epoch + 1`, and the zombie's publish is refused by the store.
#[test]
fn a_new_attempt_fences_the_epoch_a_running_predecessor_would_publish_next() {
    let dir = tempfile::tempdir().unwrap();
    let plan = common::plan(2, 8);
    let storage = local(dir.path());
    let mut w = Scripted::new(plan.clone());
    w.fail_deploys = 1;
    let report = run_job(&plan, &mut w, Arc::clone(&storage), &opts()).unwrap();
    assert_eq!(report.attempt, 2);
    // Attempt 1 failed at its deployment and logged no epoch: the next one it would make
    // durable is epoch 1, which attempt 2 fenced before starting at epoch 2.
    let durable = storage.durable().unwrap();
    assert!(
        durable.aborted.contains(&1),
        "epoch 1 is fenced: {durable:?}"
    );
    let mut zombie = storage
        .latest_manifest()
        .unwrap()
        .expect("attempt 2's final epoch");
    assert!(zombie.epoch.0 >= 2);
    zombie.epoch = EpochId(1);
    zombie.attempt = AttemptId(1);
    let err = storage
        .publish_manifest(&zombie)
        .expect_err("a fenced epoch cannot be made durable by the attempt before");
    assert!(
        matches!(
            err,
            nop_stream_checkpoint::namespace::StorageError::EpochTaken { epoch: 1, .. }
        ),
        "{err:?}"
    );
}

/// A store that takes the leadership away once the record of epoch `at` is written, as an
/// etcd lease revoked while a leader publishes would.
#[derive(Debug)]
struct LeaseLostAt {
    inner: Arc<dyn nop_stream_storage::ObjectStore>,
    leadership: Arc<nop_stream_coordinator::election::Leadership>,
    at: String,
}

impl nop_stream_storage::ObjectStore for LeaseLostAt {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn get(&self, name: &str) -> nop_stream_storage::Result<Vec<u8>> {
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> nop_stream_storage::Result<Vec<u8>> {
        self.inner.get_range(name, offset, len)
    }
    fn put(&self, name: &str, bytes: &[u8]) -> nop_stream_storage::Result<()> {
        self.inner.put(name, bytes)
    }
    fn put_if_absent(
        &self,
        name: &str,
        bytes: &[u8],
    ) -> nop_stream_storage::Result<nop_stream_storage::Created> {
        let created = self.inner.put_if_absent(name, bytes);
        if name == self.at {
            self.leadership.lose();
        }
        created
    }
    fn list(
        &self,
        prefix: &str,
    ) -> nop_stream_storage::Result<Vec<nop_stream_storage::ObjectMeta>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> nop_stream_storage::Result<()> {
        self.inner.delete(name)
    }
}

/// A leader whose lease is lost while it publishes an epoch deletes nothing after it: the
/// new leader's resume may be reading the epochs retention would take (a CI run once failed
/// a resume on a record deleted under it). Pinned: retention ran after the publish, so with
/// one epoch kept the epoch before the last was gone.
#[test]
fn a_leader_that_lost_its_lease_while_publishing_leaves_retention_to_the_next() {
    let mut plan = common::plan(1, 4);
    plan.job.checkpoint_interval_ms = None;
    plan.job.checkpoint_every_records = Some(1_000);
    let leadership = nop_stream_coordinator::election::Leadership::until(
        7,
        std::time::Instant::now() + Duration::from_secs(3600),
    );
    let store = Arc::new(LeaseLostAt {
        inner: Arc::new(MemStore::new()),
        leadership: Arc::clone(&leadership),
        at: nop_stream_checkpoint::names::epoch_record(3),
    });
    let storage = Arc::new(Namespace::new(Scoped::new(store, "")));
    let mut w = Scripted::new(plan.clone());
    w.feed = Some((100, 10_050));
    let o = CoordinatorOptions {
        retain_epochs: 1,
        leadership: Some(leadership),
        ..opts()
    };
    let err = run_job(&plan, &mut w, Arc::clone(&storage), &o).expect_err("leadership lost");
    assert!(format!("{err}").contains("leadership"), "{err}");
    // Epoch 2's retention took epoch 1; epoch 3's, after the lease was lost, took nothing.
    assert_eq!(storage.manifest_epochs().unwrap(), [EpochId(2), EpochId(3)]);
}
