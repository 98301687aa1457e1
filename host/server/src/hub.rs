//! The coordinator's view of its nodes (design §2.5): which nodes hold a live session, how
//! to push frames to them, requests waiting for replies, and where each job's task events
//! go. Called from the session layer's async tasks (it never blocks them) and from the
//! jobs' coordinator threads.

use crossbeam_channel::{Receiver, Sender};
use nop_stream_api::JobId;
use nop_stream_cluster::session::SessionPush;
use nop_stream_cluster::{Identity, LeaseId, NodeId};
use nop_stream_coordinator::watermark_relay::WatermarkRelay;
use nop_stream_core::NodeSlots;
use nop_stream_proto::session::{
    CoordinatorFrame, Hello, JobEvent, NodeCounters, NodeRequest, Reply, ReplyBody,
    SourceWatermarks,
};
use nop_stream_proto::{FailureClass, TaskEvent, TaskFailure};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A node with a live session.
#[derive(Debug, Clone)]
pub struct LiveNode {
    /// The node.
    pub id: NodeId,
    /// Its lease.
    pub lease: LeaseId,
    /// UDP address it serves data connections on.
    pub data_addr: String,
    /// Task slots it offers.
    pub slots: u32,
    push: SessionPush,
}

impl LiveNode {
    /// `node-<id>`.
    pub fn name(&self) -> String {
        Identity::Node(self.id).label()
    }
}

/// What a job's coordinator thread hears from the hub.
#[derive(Debug)]
pub enum HubEvent {
    /// An event of one of the job's tasks.
    Task {
        /// The node it came from.
        node: NodeId,
        /// The generation of the task that sent it.
        generation: u64,
        /// The event.
        event: TaskEvent<TaskFailure>,
    },
    /// A node's lease is over (expired, or its session ended).
    NodeDown {
        /// The node.
        node: NodeId,
        /// The lease that ended.
        lease: LeaseId,
        /// Why.
        reason: String,
    },
}

#[derive(Default)]
struct Counts {
    /// Latest counters per node, and what earlier node processes counted (a restarted
    /// node counts from zero again).
    per_node: BTreeMap<NodeId, (NodeCounters, NodeCounters)>,
    /// What each node had counted when the job's current run started: a run's counts
    /// start afresh ([`NodeHub::start_run`]).
    at_start: BTreeMap<NodeId, NodeCounters>,
}

#[derive(Default)]
struct Inner {
    nodes: BTreeMap<NodeId, LiveNode>,
    jobs: HashMap<JobId, Sender<HubEvent>>,
    next_request: u64,
    pending: HashMap<u64, (NodeId, Sender<Result<ReplyBody, TaskFailure>>)>,
    counts: HashMap<JobId, Counts>,
    /// The latest metrics samples of each job from each node.
    samples: HashMap<JobId, BTreeMap<NodeId, Vec<nop_stream_metrics::Sample>>>,
    /// The latest samples of each node of no job (labelled with the node); kept after the
    /// node leaves, until it reports again.
    node_samples: BTreeMap<NodeId, Vec<nop_stream_metrics::Sample>>,
    /// Events for jobs with no coordinator thread (a job ended or was never known here).
    orphan_events: u64,
    /// Watermark alignment across nodes: the aligned sources' watermark tables.
    relay: WatermarkRelay<NodeId>,
}

/// The hub. One per coordinator process.
#[derive(Default)]
pub struct NodeHub {
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl std::fmt::Debug for NodeHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHub").finish_non_exhaustive()
    }
}

fn add(a: &NodeCounters, b: &NodeCounters) -> NodeCounters {
    NodeCounters {
        job: a.job.clone(),
        records_read: a.records_read + b.records_read,
        records_written: a.records_written + b.records_written,
        refused_streams: a.refused_streams + b.refused_streams,
        refused_commands: a.refused_commands + b.refused_commands,
    }
}

impl NodeHub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A node registered under `lease`.
    pub fn node_up(&self, node: NodeId, lease: LeaseId, hello: &Hello, push: SessionPush) {
        let mut g = self.lock();
        g.nodes.insert(
            node,
            LiveNode {
                id: node,
                lease,
                data_addr: hello.data_addr.clone(),
                slots: hello.slots,
                push,
            },
        );
        drop(g);
        self.changed.notify_all();
    }

    /// `node`'s lease `lease` is over: the node leaves the live set, its pending requests
    /// fail, and every job hears of it.
    pub fn node_down(&self, node: NodeId, lease: LeaseId, reason: &str) {
        let mut g = self.lock();
        if g.nodes.get(&node).is_some_and(|n| n.lease == lease) {
            g.nodes.remove(&node);
        }
        let failed: Vec<u64> = g
            .pending
            .iter()
            .filter(|(_, (n, _))| *n == node)
            .map(|(id, _)| *id)
            .collect();
        for id in failed {
            if let Some((_, tx)) = g.pending.remove(&id) {
                let _ = tx.send(Err(TaskFailure {
                    class: FailureClass::Recoverable,
                    message: format!(
                        "{} left before answering: {reason}",
                        Identity::Node(node).label()
                    ),
                }));
            }
        }
        for tx in g.jobs.values() {
            let _ = tx.send(HubEvent::NodeDown {
                node,
                lease,
                reason: reason.to_owned(),
            });
        }
        drop(g);
        self.changed.notify_all();
    }

    /// Routes a task event to its job's coordinator thread.
    pub fn event(&self, node: NodeId, e: JobEvent) {
        let mut g = self.lock();
        match g.jobs.get(&e.job) {
            Some(tx) => {
                let _ = tx.send(HubEvent::Task {
                    node,
                    generation: e.generation,
                    event: e.event,
                });
            }
            None => {
                g.orphan_events += 1;
                tracing::debug!(job = %e.job, "event of a job with no coordinator thread dropped");
            }
        }
    }

    /// Delivers a reply to the request waiting for it.
    pub fn reply(&self, r: Reply) {
        if let Some((_, tx)) = self.lock().pending.remove(&r.id) {
            let _ = tx.send(r.result);
        }
    }

    /// Records a node's counters for a job.
    pub fn counters(&self, node: NodeId, c: NodeCounters) {
        let mut g = self.lock();
        let counts = g.counts.entry(c.job.clone()).or_default();
        let zero = NodeCounters {
            job: c.job.clone(),
            records_read: 0,
            records_written: 0,
            refused_streams: 0,
            refused_commands: 0,
        };
        let (base, last) = counts
            .per_node
            .entry(node)
            .or_insert_with(|| (zero.clone(), zero));
        if c.records_read < last.records_read
            || c.refused_streams < last.refused_streams
            || c.refused_commands < last.refused_commands
        {
            // A new node process: bank what the old one counted.
            *base = add(base, last);
        }
        *last = c;
    }

    /// A new run of `job` starts: its counts start afresh (nodes keep counting per job id,
    /// across its runs).
    pub fn start_run(&self, job: &JobId) {
        let mut g = self.lock();
        if let Some(c) = g.counts.get_mut(job) {
            c.at_start = c
                .per_node
                .iter()
                .map(|(n, (base, last))| (*n, add(base, last)))
                .collect();
        }
    }

    /// A node's latest metrics samples of a job (cumulative in its process: they replace
    /// the node's previous ones).
    pub fn metrics(&self, node: NodeId, frame: nop_stream_metrics::MetricsFrame) {
        self.lock()
            .samples
            .entry(JobId::new(frame.job))
            .or_default()
            .insert(node, frame.samples);
    }

    /// A node's latest samples of no job (cumulative in its process: they replace the
    /// node's previous ones; a restarted node's counters start from 0 again). A `node`
    /// label is set to the node's certified identity, whatever the node wrote there.
    pub fn node_metrics(&self, node: NodeId, mut samples: Vec<nop_stream_metrics::Sample>) {
        samples.truncate(nop_stream_metrics::MAX_FRAME_SAMPLES);
        let me = Identity::Node(node).label();
        for s in &mut samples {
            let at = nop_stream_metrics::inventory::family(&s.family)
                .and_then(|f| f.labels.iter().position(|l| *l == "node"));
            if let Some(v) = at.and_then(|i| s.labels.get_mut(i)) {
                v.clone_from(&me);
            }
        }
        self.lock().node_samples.insert(node, samples);
    }

    /// Every node's latest samples of no job, in node order.
    pub fn node_samples(&self) -> Vec<nop_stream_metrics::Sample> {
        self.lock()
            .node_samples
            .values()
            .flatten()
            .cloned()
            .collect()
    }

    /// A node's report of the watermarks of its subtasks of an aligned source (design
    /// §8.5): recorded, and relayed to every other node running subtasks of that source.
    /// A report of a fenced or superseded generation is dropped and counted
    /// ([`Self::refused_watermarks`]).
    pub fn watermarks(&self, node: NodeId, w: SourceWatermarks) {
        let mut g = self.lock();
        let refused = g.relay.refused();
        let out = g.relay.report(node, &w);
        if g.relay.refused() > refused {
            tracing::debug!(
                node = %Identity::Node(node).label(), job = %w.job, generation = w.generation,
                refused = g.relay.refused(), "watermarks of a stale generation dropped"
            );
        }
        for (to, frame) in out {
            if let Some(n) = g.nodes.get(&to) {
                n.push.send(CoordinatorFrame::Watermarks(frame));
            }
        }
    }

    /// Every generation of `job` up to `generation` is over: its watermark tables go and
    /// its reports are refused from now on.
    pub fn fence_watermarks(&self, job: &JobId, generation: u64) {
        self.lock().relay.fence(job, generation);
    }

    /// Watermark reports dropped because their generation was fenced or superseded.
    pub fn refused_watermarks(&self) -> u64 {
        self.lock().relay.refused()
    }

    /// A job's samples, merged over the nodes that sent any (counters summed).
    pub fn job_samples(&self, job: &JobId) -> Vec<nop_stream_metrics::Sample> {
        let mut out = Vec::new();
        if let Some(per_node) = self.lock().samples.get(job) {
            for s in per_node.values() {
                nop_stream_metrics::merge(&mut out, s);
            }
        }
        out
    }

    /// The job's counters of its current run, summed over its nodes.
    pub fn job_counters(&self, job: &JobId) -> NodeCounters {
        let g = self.lock();
        let mut total = NodeCounters {
            job: job.clone(),
            records_read: 0,
            records_written: 0,
            refused_streams: 0,
            refused_commands: 0,
        };
        if let Some(c) = g.counts.get(job) {
            for (node, (base, last)) in &c.per_node {
                let now = add(base, last);
                let now = match c.at_start.get(node) {
                    Some(s) => NodeCounters {
                        job: now.job.clone(),
                        records_read: now.records_read.saturating_sub(s.records_read),
                        records_written: now.records_written.saturating_sub(s.records_written),
                        refused_streams: now.refused_streams.saturating_sub(s.refused_streams),
                        refused_commands: now.refused_commands.saturating_sub(s.refused_commands),
                    },
                    None => now,
                };
                total = add(&total, &now);
            }
        }
        total
    }

    /// Registers a job's coordinator thread; its events arrive on the returned queue until
    /// [`Self::unroute`].
    pub fn route(&self, job: &JobId) -> Receiver<HubEvent> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.lock().jobs.insert(job.clone(), tx);
        rx
    }

    /// Stops routing `job`'s events, and forgets its watermark tables.
    pub fn unroute(&self, job: &JobId) {
        let mut g = self.lock();
        g.jobs.remove(job);
        g.relay.forget(job);
    }

    /// The nodes with a live session, by id.
    pub fn live(&self) -> Vec<LiveNode> {
        self.lock().nodes.values().cloned().collect()
    }

    /// Whether `node` holds lease `lease` in a live session.
    pub fn is_up(&self, node: NodeId, lease: LeaseId) -> bool {
        self.lock()
            .nodes
            .get(&node)
            .is_some_and(|n| n.lease == lease)
    }

    /// Placement's view of the live nodes, by id.
    pub fn slots(&self) -> Vec<NodeSlots> {
        self.live()
            .iter()
            .map(|n| NodeSlots {
                node: n.name(),
                slots: n.slots,
            })
            .collect()
    }

    /// Waits until `ready` holds for the live nodes, or `timeout` passes; returns the live
    /// nodes then.
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&[LiveNode]) -> bool,
    ) -> Vec<LiveNode> {
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            let live: Vec<LiveNode> = g.nodes.values().cloned().collect();
            let now = Instant::now();
            if ready(&live) || now >= deadline {
                return live;
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            g = self
                .changed
                .wait_timeout(g, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Pushes `frame` to `node` if it still holds `lease`; `false` otherwise.
    pub fn push(&self, node: NodeId, lease: LeaseId, frame: CoordinatorFrame) -> bool {
        let g = self.lock();
        match g.nodes.get(&node) {
            Some(n) if n.lease == lease => n.push.send(frame),
            _ => false,
        }
    }

    /// Sends `request` to `node` under `lease` and returns where its reply will arrive.
    /// A node that leaves first answers with a recoverable failure.
    pub fn request(
        &self,
        node: NodeId,
        lease: LeaseId,
        request: NodeRequest,
    ) -> Receiver<Result<ReplyBody, TaskFailure>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut g = self.lock();
        g.next_request += 1;
        let id = g.next_request;
        let sent = match g.nodes.get(&node) {
            Some(n) if n.lease == lease => n.push.send(CoordinatorFrame::Request {
                id,
                request: Box::new(request),
            }),
            _ => false,
        };
        if sent {
            g.pending.insert(id, (node, tx));
        } else {
            let _ = tx.send(Err(TaskFailure {
                class: FailureClass::Recoverable,
                message: format!(
                    "{} is not in the cluster (its lease is over)",
                    Identity::Node(node).label()
                ),
            }));
        }
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_metrics::{Sample, inventory::NODE_STALE_TERM_REFUSALS, sum};

    #[test]
    fn a_node_reports_under_its_certified_identity_and_its_latest_samples_replace_the_last() {
        let hub = NodeHub::default();
        let refusals = |node: &str, n: f64| {
            vec![Sample::counter(
                &NODE_STALE_TERM_REFUSALS,
                vec![node.to_owned(), "welcome".to_owned()],
                n,
            )]
        };
        // node-2 claims to be node-1: its samples count under node-2.
        hub.node_metrics(NodeId(2), refusals("node-1", 3.0));
        hub.node_metrics(NodeId(1), refusals("node-1", 1.0));
        hub.node_metrics(NodeId(1), refusals("node-1", 2.0));
        let all = hub.node_samples();
        let of = |node: &str| sum(&all, &NODE_STALE_TERM_REFUSALS, &[("node", node)]);
        assert_eq!((of("node-1"), of("node-2"), all.len()), (2.0, 3.0, 2));
    }
}
