//! The cluster implementation of the coordinator's [`Workers`] seam (design §2.5): tasks run
//! on node processes, reached over their QUIC session streams through the [`NodeHub`].
//!
//! A deployment is placed on the live nodes by [`deployment_plan`] (slot sharing), then set
//! up in two phases so that every receiving channel is registered before any producer
//! opens its stream: every node of the placement prepares its tasks, then every node
//! starts them. A node whose lease ends while it holds tasks of the live generation fails
//! those tasks (a recoverable failure naming the node); the coordinator then fences the
//! generation and recovers from the latest durable epoch on the nodes still live.

use crate::hub::{HubEvent, LiveNode, NodeHub};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use nop_stream_api::{AttemptId, JobId, Split, TaskId};
use nop_stream_cluster::{Identity, LeaseId, NodeId};
use nop_stream_coordinator::{Next, Workers};
use nop_stream_core::{DeploymentPlan, PartitionedPlan, deployment_plan};
use nop_stream_proto::session::{
    CoordinatorFrame, JobSpec, NodeDeployment, NodeRequest, ReplyBody,
};
use nop_stream_proto::{
    Deployment, FailureClass, SinkSettlement, TaskCommand, TaskEvent, TaskFailure,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Timing of a cluster job's coordinator thread.
#[derive(Debug, Clone, Copy)]
pub struct WorkerTimeouts {
    /// How long a deployment waits for enough live nodes (slots) before it fails.
    /// Default 60 s.
    pub node_wait: Duration,
    /// How long a node may take to answer a request (prepare includes fetching and
    /// compiling components). Default 120 s.
    pub request: Duration,
    /// How long joining a fenced generation waits for its tasks to report their end before
    /// it gives up on them (the next generation fences them on their nodes anyway).
    /// Default 30 s.
    pub join: Duration,
}

impl Default for WorkerTimeouts {
    fn default() -> Self {
        WorkerTimeouts {
            node_wait: Duration::from_secs(60),
            request: Duration::from_secs(120),
            join: Duration::from_secs(30),
        }
    }
}

/// What a job's status shows of its live deployment, shared with the job manager.
pub use nop_stream_coordinator::manager::{DeployHook, LiveJob as LiveStatus};

struct LiveDeployment {
    generation: u64,
    task_node: BTreeMap<TaskId, NodeId>,
    leases: BTreeMap<NodeId, LeaseId>,
    /// Tasks that have not reported their end yet.
    open: BTreeSet<TaskId>,
}

/// Workers on the cluster's nodes, for one job.
pub struct ClusterWorkers {
    hub: Arc<NodeHub>,
    job: JobId,
    plan: Arc<PartitionedPlan>,
    spec: JobSpec,
    events: Receiver<HubEvent>,
    live: Option<LiveDeployment>,
    synthesized: VecDeque<TaskEvent<TaskFailure>>,
    status: Arc<LiveStatus>,
    cancel: Arc<AtomicBool>,
    cancel_reported: bool,
    timeouts: WorkerTimeouts,
}

impl std::fmt::Debug for ClusterWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWorkers")
            .field("job", &self.job)
            .finish_non_exhaustive()
    }
}

fn failure(class: FailureClass, message: impl Into<String>) -> TaskFailure {
    TaskFailure {
        class,
        message: message.into(),
    }
}

fn name(node: NodeId) -> String {
    Identity::Node(node).label()
}

impl ClusterWorkers {
    /// Workers for the job `spec` describes (`plan` is its plan), reaching nodes through
    /// `hub`. Setting `cancel` fails the live attempt with a fatal "cancelled" failure.
    pub fn new(
        hub: Arc<NodeHub>,
        plan: Arc<PartitionedPlan>,
        spec: JobSpec,
        status: Arc<LiveStatus>,
        cancel: Arc<AtomicBool>,
        timeouts: WorkerTimeouts,
    ) -> Self {
        let events = hub.route(&spec.job);
        ClusterWorkers {
            job: spec.job.clone(),
            hub,
            plan,
            spec,
            events,
            live: None,
            synthesized: VecDeque::new(),
            status,
            cancel,
            cancel_reported: false,
            timeouts,
        }
    }

    fn check_cancel(&self) -> Result<(), TaskFailure> {
        if self.cancel.load(Ordering::SeqCst) {
            return Err(failure(FailureClass::Fatal, "the job was cancelled"));
        }
        Ok(())
    }

    /// Waits for the nodes a restarted coordinator expects, then for at least one node.
    fn wait_for_nodes(&self) -> Result<Vec<LiveNode>, TaskFailure> {
        let expect = self
            .status
            .expect
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((names, deadline)) = expect {
            let wait = deadline.saturating_duration_since(Instant::now());
            self.hub.wait_for(wait, |live| {
                names.iter().all(|n| live.iter().any(|l| &l.name() == n))
            });
        }
        let deadline = Instant::now() + self.timeouts.node_wait;
        loop {
            self.check_cancel()?;
            let live = self
                .hub
                .wait_for(Duration::from_millis(500), |l| !l.is_empty());
            if !live.is_empty() {
                return Ok(live);
            }
            if Instant::now() >= deadline {
                return Err(failure(
                    FailureClass::Recoverable,
                    format!(
                        "no node joined the cluster within {:?}",
                        self.timeouts.node_wait
                    ),
                ));
            }
        }
    }

    /// Runs `request` on one live node (the first by id) and waits for its reply.
    fn on_any_node(&self, request: NodeRequest, what: &str) -> Result<ReplyBody, TaskFailure> {
        let live = self.wait_for_nodes()?;
        let n = &live[0];
        self.await_reply(n.id, self.hub.request(n.id, n.lease, request), what)
    }

    /// Waits for the replies of every request of `waiting` at once, calling `ok` with each
    /// node that answered with success, and returns the first failure as soon as it
    /// arrives (a request no node answers within [`WorkerTimeouts::request`] fails too).
    fn await_all(
        &self,
        waiting: Vec<(NodeId, Receiver<Result<ReplyBody, TaskFailure>>)>,
        what: &str,
        mut ok: impl FnMut(NodeId),
    ) -> Result<(), TaskFailure> {
        let deadline = Instant::now() + self.timeouts.request;
        let mut left: Vec<_> = waiting;
        while !left.is_empty() {
            let mut select = crossbeam_channel::Select::new();
            for (_, rx) in &left {
                select.recv(rx);
            }
            let Ok(op) = select.select_deadline(deadline) else {
                let (node, _) = &left[0];
                return Err(failure(
                    FailureClass::Recoverable,
                    format!(
                        "{}: {what}: no answer within {:?}",
                        name(*node),
                        self.timeouts.request
                    ),
                ));
            };
            let i = op.index();
            let got = op.recv(&left[i].1);
            drop(select);
            let (node, _) = left.swap_remove(i);
            match got {
                Ok(Ok(_)) => ok(node),
                Ok(Err(e)) => {
                    return Err(TaskFailure {
                        class: e.class,
                        message: format!("{}: {what}: {}", name(node), e.message),
                    });
                }
                Err(_) => {
                    return Err(failure(
                        FailureClass::Recoverable,
                        format!("{}: {what}: the request was dropped", name(node)),
                    ));
                }
            }
        }
        Ok(())
    }

    fn await_reply(
        &self,
        node: NodeId,
        rx: Receiver<Result<ReplyBody, TaskFailure>>,
        what: &str,
    ) -> Result<ReplyBody, TaskFailure> {
        match rx.recv_timeout(self.timeouts.request) {
            Ok(r) => r.map_err(|e| TaskFailure {
                class: e.class,
                message: format!("{}: {what}: {}", name(node), e.message),
            }),
            Err(_) => Err(failure(
                FailureClass::Recoverable,
                format!(
                    "{}: {what}: no answer within {:?}",
                    name(node),
                    self.timeouts.request
                ),
            )),
        }
    }

    /// Places `d` on the live nodes: waits for enough slots.
    fn place(&self) -> Result<(DeploymentPlan, Vec<LiveNode>), TaskFailure> {
        let deadline = Instant::now() + self.timeouts.node_wait;
        loop {
            let live = self.wait_for_nodes()?;
            let opts = crate::placement_options(
                &self.plan,
                live.iter().map(|n| (n.name(), n.slots)),
                &self.spec.namespace,
            );
            match deployment_plan(&self.plan, &opts) {
                Ok(p) => return Ok((p, live)),
                Err(e) if Instant::now() >= deadline => {
                    return Err(failure(FailureClass::Recoverable, e.to_string()));
                }
                Err(_) => {
                    let n = live.len();
                    self.hub
                        .wait_for(Duration::from_millis(500), |l| l.len() > n);
                }
            }
        }
    }

    /// A node's lease ended: its open tasks of the live generation fail.
    fn node_down(&mut self, node: NodeId, lease: LeaseId, reason: &str) {
        let Some(live) = &mut self.live else {
            return;
        };
        if live.leases.get(&node) != Some(&lease) {
            return;
        }
        let lost: Vec<TaskId> = live
            .open
            .iter()
            .filter(|t| live.task_node.get(*t) == Some(&node))
            .cloned()
            .collect();
        for t in lost {
            live.open.remove(&t);
            self.synthesized.push_back(TaskEvent::Failed {
                attempt: AttemptId(live.generation as u32),
                task: t,
                error: failure(
                    FailureClass::Recoverable,
                    format!("{} left the cluster: {reason}", name(node)),
                ),
            });
        }
    }

    /// Takes the next event of the live generation, counting and dropping stale ones.
    fn poll(&mut self, timeout: Duration) -> Next<TaskFailure> {
        if let Some(e) = self.synthesized.pop_front() {
            return Next::Event(e);
        }
        if self.live.is_none() {
            return Next::Closed;
        }
        if !self.cancel_reported && self.cancel.load(Ordering::SeqCst) {
            self.cancel_reported = true;
            let live = self.live.as_ref().expect("checked");
            if let Some(t) = live.open.iter().next() {
                return Next::Event(TaskEvent::Failed {
                    attempt: AttemptId(live.generation as u32),
                    task: t.clone(),
                    error: failure(FailureClass::Fatal, "the job was cancelled"),
                });
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = match self.events.recv_timeout(left) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => return Next::Timeout,
                Err(RecvTimeoutError::Disconnected) => return Next::Closed,
            };
            match ev {
                HubEvent::NodeDown {
                    node,
                    lease,
                    reason,
                } => {
                    self.node_down(node, lease, &reason);
                    if let Some(e) = self.synthesized.pop_front() {
                        return Next::Event(e);
                    }
                }
                HubEvent::Task {
                    node,
                    generation,
                    event,
                } => {
                    let Some(live) = &mut self.live else {
                        return Next::Closed;
                    };
                    let task = event_task(live, &event);
                    let from_placed = task
                        .as_ref()
                        .is_some_and(|t| live.task_node.get(t) == Some(&node));
                    if generation != live.generation || !from_placed {
                        // A late ACK, end or commit confirmation of a fenced generation
                        // (design §2.5): refused and counted.
                        self.status.refused_events.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            node = %name(node), generation, live = live.generation,
                            "refused an event of a stale generation"
                        );
                        continue;
                    }
                    if matches!(event, TaskEvent::Finished { .. } | TaskEvent::Failed { .. })
                        && !task.as_ref().is_some_and(|t| live.open.remove(t))
                    {
                        // The task's end was already accounted for (its node was lost).
                        continue;
                    }
                    return Next::Event(event);
                }
            }
        }
    }
}

/// The task an event is about; a `Finished` event names it only as text in its report.
fn event_task(live: &LiveDeployment, e: &TaskEvent<TaskFailure>) -> Option<TaskId> {
    match e {
        TaskEvent::Ack { snapshot, .. } => Some(snapshot.task.clone()),
        TaskEvent::EndOfData { task, .. }
        | TaskEvent::Committed { task, .. }
        | TaskEvent::Failed { task, .. } => Some(task.clone()),
        TaskEvent::Finished { report, .. } => live
            .task_node
            .keys()
            .find(|t| t.to_string() == report.task)
            .cloned(),
    }
}

impl Workers for ClusterWorkers {
    type Error = TaskFailure;

    fn discover_splits(
        &mut self,
        vertex: usize,
        attempt: AttemptId,
    ) -> Result<Vec<Split>, TaskFailure> {
        let body = self.on_any_node(
            NodeRequest::DiscoverSplits {
                job: self.spec.clone(),
                vertex: vertex as u32,
                attempt,
            },
            "split discovery",
        )?;
        match body {
            ReplyBody::Splits(s) => Ok(s),
            ReplyBody::Done => Err(failure(
                FailureClass::Fatal,
                "split discovery answered without splits",
            )),
        }
    }

    fn settle_sinks(
        &mut self,
        settlements: &[SinkSettlement],
        attempt: AttemptId,
    ) -> Result<(), TaskFailure> {
        if settlements.is_empty() {
            return Ok(());
        }
        self.on_any_node(
            NodeRequest::SettleSinks {
                job: self.spec.clone(),
                settlements: settlements.to_vec(),
                attempt,
            },
            "settling sinks before a rescale",
        )
        .map(|_| ())
    }

    fn deploy(&mut self, d: Deployment) -> Result<(), TaskFailure> {
        if self.live.is_some() {
            return Err(failure(FailureClass::Fatal, "a deployment is still live"));
        }
        self.check_cancel()?;
        let (placement, live_nodes) = self.place()?;
        let by_name: BTreeMap<String, &LiveNode> =
            live_nodes.iter().map(|n| (n.name(), n)).collect();
        let mut task_node = BTreeMap::new();
        let mut leases = BTreeMap::new();
        let mut shares: BTreeMap<NodeId, Vec<_>> = BTreeMap::new();
        for a in &d.tasks {
            let node = placement
                .node_of(&a.task)
                .and_then(|n| by_name.get(n))
                .ok_or_else(|| {
                    failure(
                        FailureClass::Fatal,
                        format!("task {} was not placed", a.task),
                    )
                })?;
            task_node.insert(a.task.clone(), node.id);
            leases.insert(node.id, node.lease);
            shares.entry(node.id).or_default().push(a.clone());
        }
        let peers: BTreeMap<String, String> = shares
            .keys()
            .map(|id| (name(*id), by_name[&name(*id)].data_addr.clone()))
            .collect();
        *self
            .status
            .placement
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(placement.clone());
        self.status.generation.store(d.generation, Ordering::SeqCst);
        self.status.deployments.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = self
            .status
            .on_deploy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            hook(d.generation, &placement);
        }
        tracing::info!(
            job = %self.job, generation = d.generation,
            nodes = %peers.keys().cloned().collect::<Vec<_>>().join(","),
            "deploying"
        );
        // Live from here on: whatever fails below is fenced and joined by the caller.
        self.live = Some(LiveDeployment {
            generation: d.generation,
            task_node,
            leases: leases.clone(),
            // Tasks count as open once their node confirmed it started them.
            open: BTreeSet::new(),
        });
        // Phase 1: every node prepares its share and registers its receiving channels.
        let mut waiting = Vec::new();
        for (node, tasks) in shares {
            let mut share = d.clone();
            share.tasks = tasks;
            let req = NodeRequest::Prepare(NodeDeployment {
                spec: self.spec.clone(),
                deployment: share,
                placement: placement.clone(),
                peers: peers.clone(),
            });
            waiting.push((node, self.hub.request(node, leases[&node], req)));
        }
        // Every other live node compiles the job's components meanwhile, so that a redeploy
        // onto it after a node loss finds them compiled (design §10.1). Nobody waits for
        // its answer: a node that fails to warm compiles at its Prepare instead.
        for n in self.hub.live() {
            if !leases.contains_key(&n.id) {
                drop(
                    self.hub
                        .request(n.id, n.lease, NodeRequest::Warm(self.spec.clone())),
                );
            }
        }
        // The first failure fails the deployment at once: a node lost meanwhile answers
        // with a failure the moment its lease ends, and its peers, still waiting for its
        // data connection, stop when the caller fences the generation.
        self.await_all(waiting, "preparing tasks", |_| {})?;
        // Phase 2: start.
        let waiting: Vec<_> = leases
            .iter()
            .map(|(node, lease)| {
                (
                    *node,
                    self.hub.request(
                        *node,
                        *lease,
                        NodeRequest::Start {
                            job: self.job.clone(),
                            generation: d.generation,
                        },
                    ),
                )
            })
            .collect();
        let mut started = Vec::new();
        let result = self.await_all(waiting, "starting tasks", |node| started.push(node));
        if let Some(live) = &mut self.live {
            let tasks: Vec<TaskId> = live
                .task_node
                .iter()
                .filter(|(_, n)| started.contains(n))
                .map(|(t, _)| t.clone())
                .collect();
            live.open.extend(tasks);
        }
        result
    }

    fn send(&mut self, task: &TaskId, command: TaskCommand) {
        let Some(live) = &self.live else {
            return;
        };
        let Some(node) = live.task_node.get(task) else {
            return;
        };
        self.hub.push(
            *node,
            live.leases[node],
            CoordinatorFrame::Command {
                job: self.job.clone(),
                generation: live.generation,
                task: task.clone(),
                command,
            },
        );
    }

    fn next_event(&mut self, timeout: Duration) -> Next<TaskFailure> {
        self.poll(timeout)
    }

    fn fence(&mut self, generation: u64) {
        self.hub.fence_watermarks(&self.job, generation);
        // Every live node: a node that holds no task of this generation ignores it.
        for n in self.hub.live() {
            self.hub.push(
                n.id,
                n.lease,
                CoordinatorFrame::Fence {
                    job: self.job.clone(),
                    generation: generation + 1,
                },
            );
        }
    }

    fn join(&mut self) {
        let deadline = Instant::now() + self.timeouts.join;
        while self.live.as_ref().is_some_and(|l| !l.open.is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let live = self.live.as_ref().expect("checked");
                tracing::warn!(
                    job = %self.job, generation = live.generation,
                    "{} task(s) did not report their end within {:?}; their nodes fence them at the next deployment",
                    live.open.len(),
                    self.timeouts.join
                );
                break;
            }
            match self.poll(left.min(Duration::from_millis(200))) {
                Next::Closed => break,
                Next::Event(_) | Next::Timeout => {}
            }
        }
        self.live = None;
        self.synthesized.clear();
    }

    fn records(&self) -> (u64, u64) {
        let c = self.hub.job_counters(&self.job);
        (c.records_read, c.records_written)
    }
}

impl Drop for ClusterWorkers {
    fn drop(&mut self) {
        self.hub.unroute(&self.job);
    }
}
