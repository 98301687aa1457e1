//! Output side of a task: one [`OutputEdge`] per JobGraph edge leaving the task's vertex,
//! routing each batch by the edge's partition policy (design §4.1) from the
//! PartitionedPlan — the runtime never invents topology.

use crate::error::{Result, RuntimeError, Site};
use crate::transport::{ChannelSender, Message};
use nop_stream_api::Batch;
use nop_stream_api::{EdgeId, PartitionPolicy};
use nop_stream_core::shard_of;

/// Routes batches of one task onto the channels of one edge.
pub struct OutputEdge {
    edge: EdgeId,
    policy: PartitionPolicy,
    /// Side output of the tail operator the edge carries; `None`: the main output.
    output: Option<String>,
    /// Senders indexed by downstream subtask (all-to-all policies) or a single sender.
    senders: Vec<Box<dyn ChannelSender>>,
    /// Downstream subtask of each sender.
    targets: Vec<u32>,
    /// HASH: owner subtask of each shard.
    shard_owners: Vec<u32>,
    next: usize,
    scratch: Vec<Batch>,
}

impl std::fmt::Debug for OutputEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputEdge")
            .field("edge", &self.edge)
            .field("policy", &self.policy)
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

fn empty_batch() -> Batch {
    Batch {
        data: Vec::new(),
        ends: Vec::new(),
        keys: Vec::new(),
        key_ends: Vec::new(),
        timestamps: Vec::new(),
    }
}

/// An empty batch with room for as much as `like` holds, so that the next batch split off
/// for the same subtask fills without regrowing its buffers.
fn empty_batch_like(like: &Batch) -> Batch {
    Batch {
        data: Vec::with_capacity(like.data.len()),
        ends: Vec::with_capacity(like.ends.len()),
        keys: Vec::with_capacity(like.keys.len()),
        key_ends: Vec::with_capacity(like.key_ends.len()),
        timestamps: Vec::with_capacity(like.timestamps.len()),
    }
}

impl OutputEdge {
    /// Makes this edge carry the side output `tag` instead of the main output.
    pub fn with_output(mut self, tag: Option<String>) -> Self {
        self.output = tag;
        self
    }

    /// The side output this edge carries (`None`: the main output).
    pub fn output(&self) -> Option<&str> {
        self.output.as_deref()
    }

    /// An edge with its senders; `targets[i]` is the downstream subtask `senders[i]` feeds.
    /// For HASH, `shard_owners[s]` is the owner of shard `s`.
    pub fn new(
        edge: EdgeId,
        policy: PartitionPolicy,
        senders: Vec<Box<dyn ChannelSender>>,
        targets: Vec<u32>,
        shard_owners: Vec<u32>,
    ) -> Self {
        let n = senders.len();
        OutputEdge {
            edge,
            policy,
            output: None,
            senders,
            targets,
            shard_owners,
            next: 0,
            scratch: (0..n).map(|_| empty_batch()).collect(),
        }
    }

    /// Sends `batch` by the edge's policy, moving it onto the channel where one channel
    /// receives it (copies only for BROADCAST). `site` names the emitting operator in errors.
    ///
    /// # Errors
    /// A record without a key on a HASH edge, or a channel error.
    pub fn emit(&mut self, batch: Batch, site: &Site) -> Result<()> {
        if batch.ends.is_empty() {
            return Ok(());
        }
        match self.policy {
            PartitionPolicy::Forward | PartitionPolicy::Union | PartitionPolicy::Singleton => {
                self.senders[0].send(Message::Records(batch))
            }
            PartitionPolicy::Rebalance => {
                // Whole batches round-robin: cheaper than per record, same balance over time.
                let i = self.next % self.senders.len();
                self.next = self.next.wrapping_add(1);
                self.senders[i].send(Message::Records(batch))
            }
            PartitionPolicy::Broadcast => {
                let (last, rest) = self.senders.split_last_mut().expect("an edge has channels");
                for s in rest {
                    s.send(Message::Records(batch.clone()))?;
                }
                last.send(Message::Records(batch))
            }
            PartitionPolicy::Hash => self.emit_hashed(batch, site),
        }
    }

    fn emit_hashed(&mut self, mut batch: Batch, site: &Site) -> Result<()> {
        let n = batch.ends.len();
        if batch.key_ends.len() != n {
            return Err(RuntimeError::MissingKey {
                site: site.clone(),
                edge: self.edge.to_string(),
            });
        }
        let has_ts = batch.timestamps.len() == n;
        if self.senders.len() == 1 {
            // One downstream subtask owns every shard: the batch moves whole, trimmed to
            // exactly what the per-record copy below would have built.
            batch.data.truncate(batch.ends[n - 1] as usize);
            batch.keys.truncate(batch.key_ends[n - 1] as usize);
            if !has_ts {
                batch.timestamps.clear();
            }
            return self.senders[0].send(Message::Records(batch));
        }
        let shard_count = self.shard_owners.len() as u32;
        let (mut start, mut kstart) = (0usize, 0usize);
        for i in 0..n {
            let end = batch.ends[i] as usize;
            let kend = batch.key_ends[i] as usize;
            let key = &batch.keys[kstart..kend];
            let owner = self.shard_owners[shard_of(key, shard_count).0 as usize];
            // Senders of a HASH edge are ordered by downstream subtask.
            let out = &mut self.scratch[owner as usize];
            out.data.extend_from_slice(&batch.data[start..end]);
            out.ends.push(out.data.len() as u32);
            out.keys.extend_from_slice(key);
            out.key_ends.push(out.keys.len() as u32);
            if has_ts {
                out.timestamps.push(batch.timestamps[i]);
            }
            start = end;
            kstart = kend;
        }
        for (i, out) in self.scratch.iter_mut().enumerate() {
            if !out.ends.is_empty() {
                let next = empty_batch_like(out);
                let b = std::mem::replace(out, next);
                self.senders[i].send(Message::Records(b))?;
            }
        }
        Ok(())
    }

    /// Sends a control message (watermark, barrier, end) on every channel of the edge.
    ///
    /// # Errors
    /// A channel error.
    pub fn broadcast(&mut self, msg: &Message) -> Result<()> {
        for s in &mut self.senders {
            s.send(msg.clone())?;
        }
        Ok(())
    }
}
