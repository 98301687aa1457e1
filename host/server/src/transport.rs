//! The node's [`Transport`] for one generation of a job (design §2.5, "Transport"): a
//! channel between two subtasks on this node stays an in-process queue
//! ([`LocalTransport`]); a channel to or from another node is one QUIC stream on the one
//! connection between the two nodes ([`DataPlane`]), opened by the producer with
//! `{job, generation, token, channel}`.
//!
//! Receiving ends of remote channels are registered with the data plane when the tasks are
//! prepared, before any producer starts; sending ends open their stream at their first
//! send. Fencing is checked at the receiving end twice: the data plane refuses streams and
//! queued messages of older generations, and every message a task takes is admitted
//! against the attempt's token.

use nop_stream_api::{ChannelId, FencingToken, JobId, TaskId};
use nop_stream_cluster::{DataError, DataPlane, QuicSender, ReceiverGuard};
use nop_stream_core::{DeploymentPlan, PartitionedPlan};
use nop_stream_plugin_host::RuntimeError;
use nop_stream_proto::{Message, StreamHeader};
use nop_stream_task::transport::{
    ChannelGuard, ChannelReceiver, ChannelSender, LocalTransport, Transport, admit,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Ends of every channel of the plan, by channel: the producing and the consuming task.
fn channel_ends(plan: &PartitionedPlan) -> HashMap<ChannelId, (TaskId, TaskId)> {
    let mut out = HashMap::new();
    for e in &plan.edges {
        let (Some(from), Some(to)) = (plan.vertex(&e.from), plan.vertex(&e.to)) else {
            continue;
        };
        for c in &e.channels {
            if let (Some(up), Some(down)) = (
                from.subtasks.get(c.upstream.0 as usize),
                to.subtasks.get(c.downstream.0 as usize),
            ) {
                out.insert(c.clone(), (up.task.clone(), down.task.clone()));
            }
        }
    }
    out
}

/// One generation's channels on one node.
pub struct ClusterTransport {
    job: JobId,
    generation: u64,
    me: String,
    local: LocalTransport,
    plane: DataPlane,
    /// Node of every channel's producer and consumer.
    ends: HashMap<ChannelId, (String, String)>,
    /// The connection to every other node of the placement, by node name.
    peers: HashMap<String, quinn::Connection>,
    capacity: usize,
    current: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
}

impl std::fmt::Debug for ClusterTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTransport")
            .field("job", &self.job)
            .field("generation", &self.generation)
            .field("node", &self.me)
            .finish_non_exhaustive()
    }
}

impl ClusterTransport {
    /// The transport of generation `generation` of `job` on node `me`, accepting `token`,
    /// with `capacity` messages per receiving queue; senders give up once `cancel` is set.
    /// `peers` holds a connection to every node the placement puts a channel's other end
    /// on.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        job: JobId,
        generation: u64,
        token: FencingToken,
        me: String,
        plan: &PartitionedPlan,
        placement: &DeploymentPlan,
        plane: DataPlane,
        peers: HashMap<String, quinn::Connection>,
        capacity: usize,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        let node_of = |t: &TaskId| placement.node_of(t).unwrap_or_default().to_owned();
        let ends = channel_ends(plan)
            .into_iter()
            .map(|(c, (up, down))| (c, (node_of(&up), node_of(&down))))
            .collect();
        ClusterTransport {
            local: LocalTransport::new(capacity, token, Arc::clone(&cancel)),
            job,
            generation,
            me,
            plane,
            ends,
            peers,
            capacity,
            current: Arc::new(AtomicU64::new(token.0)),
            cancel,
        }
    }

    fn ends(&self, channel: &ChannelId) -> Result<&(String, String), RuntimeError> {
        self.ends
            .get(channel)
            .ok_or_else(|| RuntimeError::Internal(format!("channel {channel} is not in the plan")))
    }

    fn admit(&self, channel: &ChannelId, token: FencingToken) -> Result<(), RuntimeError> {
        admit(channel, token, &self.current)
    }
}

struct Guard(ReceiverGuard);

impl ChannelGuard for Guard {
    fn close_reason(&self) -> Option<String> {
        self.0.failure()
    }
}

impl Transport for ClusterTransport {
    fn backend(&self) -> &'static str {
        "quic"
    }

    fn open_receiver(
        &self,
        channel: &ChannelId,
        token: FencingToken,
    ) -> Result<ChannelReceiver, RuntimeError> {
        self.admit(channel, token)?;
        let (producer, _) = self.ends(channel)?;
        if *producer == self.me {
            return self.local.open_receiver(channel, token);
        }
        let rx = self
            .plane
            .register_receiver(
                self.job.clone(),
                self.generation,
                token,
                channel.clone(),
                self.capacity,
            )
            .map_err(|e| RuntimeError::ChannelClosed {
                channel: channel.clone(),
                message: e.to_string(),
            })?;
        let (queue, guard) = rx.into_parts();
        Ok(
            ChannelReceiver::new(channel.clone(), queue, token, Arc::clone(&self.current))
                .with_guard(Box::new(Guard(guard))),
        )
    }

    fn open_sender(
        &self,
        channel: &ChannelId,
        token: FencingToken,
    ) -> Result<Box<dyn ChannelSender>, RuntimeError> {
        self.admit(channel, token)?;
        let (_, consumer) = self.ends(channel)?;
        if *consumer == self.me {
            return self.local.open_sender(channel, token);
        }
        let conn =
            self.peers
                .get(consumer)
                .cloned()
                .ok_or_else(|| RuntimeError::ChannelClosed {
                    channel: channel.clone(),
                    message: format!("no connection to {consumer}, which receives it"),
                })?;
        Ok(Box::new(RemoteSender {
            header: StreamHeader {
                job: self.job.clone(),
                generation: self.generation,
                token,
                channel: channel.clone(),
            },
            peer: consumer.clone(),
            conn,
            plane: self.plane.clone(),
            inner: None,
            current: Arc::clone(&self.current),
            cancel: Arc::clone(&self.cancel),
        }))
    }

    fn fence(&self, token: FencingToken) {
        self.current.store(token.0, Ordering::SeqCst);
        self.local.fence(token);
    }

    fn current_token(&self) -> FencingToken {
        FencingToken(self.current.load(Ordering::SeqCst))
    }
}

/// The sending end of a channel to another node; its stream opens at the first send.
struct RemoteSender {
    header: StreamHeader,
    peer: String,
    conn: quinn::Connection,
    plane: DataPlane,
    inner: Option<QuicSender>,
    current: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
}

impl RemoteSender {
    fn closed(&self, e: &DataError) -> RuntimeError {
        RuntimeError::ChannelClosed {
            channel: self.header.channel.clone(),
            message: format!("to {}: {e}", self.peer),
        }
    }
}

impl ChannelSender for RemoteSender {
    fn channel(&self) -> &ChannelId {
        &self.header.channel
    }

    fn send(&mut self, msg: Message) -> Result<(), RuntimeError> {
        admit(&self.header.channel, self.header.token, &self.current)?;
        if self.cancel.load(Ordering::Relaxed) {
            return Err(RuntimeError::Cancelled);
        }
        if self.inner.is_none() {
            let mut s = self
                .plane
                .open_sender(&self.conn, self.header.clone())
                .map_err(|e| self.closed(&e))?;
            s.cancel_on(Arc::clone(&self.cancel));
            self.inner = Some(s);
        }
        let inner = self.inner.as_mut().expect("opened above");
        match inner.send(msg) {
            Ok(()) => Ok(()),
            Err(DataError::Cancelled { .. }) => Err(RuntimeError::Cancelled),
            Err(e) => {
                let err = self.closed(&e);
                Err(err)
            }
        }
    }
}
