//! Output side of a task: one [`OutputEdge`] per JobGraph edge leaving the task's vertex,
//! routing each batch by the edge's partition policy (design §4.1) from the
//! PartitionedPlan — the runtime never invents topology.
//!
//! A HASH edge with several downstream subtasks splits each batch record by record, so each
//! subtask would receive batches of `1/n` the size. Instead, each subtask's records are
//! buffered across input batches and sent once [`OutputEdge::set_flush_records`] records
//! are buffered, when a control message goes out (so records never cross a barrier or a
//! watermark), when the task is about to wait for input or its source read came back short
//! of a full batch ([`OutputEdge::flush`]), or once the oldest buffered record has waited
//! [`BUFFER_TIMEOUT`] (Flink's buffer timeout).

use crate::transport::{ChannelSender, Message};
use nop_stream_api::Batch;
use nop_stream_api::{EdgeId, PartitionPolicy};
use nop_stream_core::shard_of;
use nop_stream_plugin_host::{Result, RuntimeError, Site};
use std::time::{Duration, Instant};

/// Routes batches of one task onto the channels of one edge.
pub struct OutputEdge {
    edge: EdgeId,
    policy: PartitionPolicy,
    /// Side output of the tail operator the edge carries; `None`: the main output.
    output: Option<String>,
    /// The receiving end in job-file terms, for errors: ``input 1 of `q7` ``.
    to: String,
    /// Senders indexed by downstream subtask (all-to-all policies) or a single sender.
    senders: Vec<Box<dyn ChannelSender>>,
    /// Downstream subtask of each sender.
    targets: Vec<u32>,
    /// HASH: owner subtask of each shard.
    shard_owners: Vec<u32>,
    next: usize,
    /// HASH with several senders: the records buffered for each downstream subtask.
    scratch: Vec<Batch>,
    /// A subtask's buffer is sent once it holds this many records.
    flush_records: usize,
    /// When the oldest record still buffered was buffered; `None`: nothing is buffered.
    buffered_since: Option<Instant>,
}

/// The longest a record waits in a HASH edge's buffer while its task stays busy (a task
/// about to wait for input flushes at once). Flink's default buffer timeout, 100 ms.
pub const BUFFER_TIMEOUT: Duration = Duration::from_millis(100);

/// Default of [`OutputEdge::set_flush_records`]: the default `batch_records` of a job.
const DEFAULT_FLUSH_RECORDS: usize = 1024;

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

    /// Names the receiving end for errors: input `input` of the job-file node `operator`
    /// (the head operator of the downstream vertex). Without it, errors name the edge id
    /// only.
    pub fn with_target(mut self, operator: &str, input: u32) -> Self {
        self.to = format!("input {input} of `{operator}`");
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
            to: String::new(),
            senders,
            targets,
            shard_owners,
            next: 0,
            scratch: (0..n).map(|_| empty_batch()).collect(),
            flush_records: DEFAULT_FLUSH_RECORDS,
            buffered_since: None,
        }
    }

    /// Sets how many records a HASH edge buffers for one downstream subtask before sending
    /// them as one batch (at least 1; default 1024). The task sets its job's
    /// `batch_records`, so downstream subtasks receive batches of about the size the
    /// source reads, whatever the parallelism.
    pub fn set_flush_records(&mut self, records: usize) {
        self.flush_records = records.max(1);
    }

    /// Whether records are buffered and not yet sent.
    pub fn has_buffered(&self) -> bool {
        self.buffered_since.is_some()
    }

    /// Sends every buffered record. Called before the task waits for input and before
    /// every control message.
    ///
    /// # Errors
    /// A channel error.
    pub fn flush(&mut self) -> Result<()> {
        if self.buffered_since.take().is_none() {
            return Ok(());
        }
        for i in 0..self.scratch.len() {
            self.send_scratch(i)?;
        }
        Ok(())
    }

    /// Sends the records buffered for the subtask behind sender `i`, if any, leaving an
    /// empty buffer sized like the batch sent.
    fn send_scratch(&mut self, i: usize) -> Result<()> {
        let out = &mut self.scratch[i];
        if out.ends.is_empty() {
            return Ok(());
        }
        let next = empty_batch_like(out);
        let b = std::mem::replace(out, next);
        self.senders[i].send(Message::Records(b))
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
                to: if self.to.is_empty() {
                    "the next operator".to_owned()
                } else {
                    self.to.clone()
                },
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
        let mut left = false;
        for i in 0..self.scratch.len() {
            if self.scratch[i].ends.len() >= self.flush_records {
                self.send_scratch(i)?;
            } else if !self.scratch[i].ends.is_empty() {
                left = true;
            }
        }
        match self.buffered_since {
            _ if !left => self.buffered_since = None,
            None => self.buffered_since = Some(Instant::now()),
            Some(t) if t.elapsed() >= BUFFER_TIMEOUT => self.flush()?,
            Some(_) => {}
        }
        Ok(())
    }

    /// Sends a control message (watermark, barrier, end) on every channel of the edge,
    /// after the records buffered before it.
    ///
    /// # Errors
    /// A channel error.
    pub fn broadcast(&mut self, msg: &Message) -> Result<()> {
        self.flush()?;
        for s in &mut self.senders {
            s.send(msg.clone())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{ChannelId, EpochId, SubtaskIndex};
    use nop_stream_core::shards_of;
    use std::sync::{Arc, Mutex};

    /// A sender that records what it was given.
    struct Capture {
        id: ChannelId,
        sent: Arc<Mutex<Vec<Message>>>,
    }

    impl ChannelSender for Capture {
        fn channel(&self) -> &ChannelId {
            &self.id
        }
        fn send(&mut self, msg: Message) -> Result<()> {
            self.sent.lock().unwrap().push(msg);
            Ok(())
        }
    }

    const SHARDS: u32 = 16;

    /// A HASH edge into `p` subtasks; returns it with what each subtask received.
    fn hash_edge(p: u32) -> (OutputEdge, Vec<Arc<Mutex<Vec<Message>>>>) {
        let logs: Vec<_> = (0..p).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let senders = logs
            .iter()
            .enumerate()
            .map(|(i, log)| {
                Box::new(Capture {
                    id: ChannelId {
                        edge: EdgeId::new("a->b#0"),
                        upstream: SubtaskIndex(0),
                        downstream: SubtaskIndex(i as u32),
                        index: 0,
                    },
                    sent: Arc::clone(log),
                }) as Box<dyn ChannelSender>
            })
            .collect();
        let mut owners = vec![0u32; SHARDS as usize];
        for s in 0..p {
            for shard in shards_of(SubtaskIndex(s), SHARDS, p) {
                owners[shard as usize] = s;
            }
        }
        let edge = OutputEdge::new(
            EdgeId::new("a->b#0"),
            PartitionPolicy::Hash,
            senders,
            (0..p).collect(),
            owners,
        );
        (edge, logs)
    }

    /// Records `from..to`, keyed by their number, each with its number as data and
    /// timestamp.
    fn records(from: u64, to: u64) -> Batch {
        let mut b = empty_batch();
        for i in from..to {
            b.data.extend_from_slice(&i.to_le_bytes());
            b.ends.push(b.data.len() as u32);
            b.keys.extend_from_slice(&i.to_le_bytes());
            b.key_ends.push(b.keys.len() as u32);
            b.timestamps.push(i as i64);
        }
        b
    }

    fn site() -> Site {
        Site {
            plugin: "p@1".into(),
            operator: "a".into(),
            subtask: Some(0),
        }
    }

    /// What one subtask received: each record's number, and `None` for each control
    /// message, in order.
    fn received(log: &Mutex<Vec<Message>>) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for m in log.lock().unwrap().iter() {
            match m {
                Message::Records(b) => {
                    let mut start = 0usize;
                    for (i, &end) in b.ends.iter().enumerate() {
                        let n = u64::from_le_bytes(b.data[start..end as usize].try_into().unwrap());
                        assert_eq!(b.timestamps[i], n as i64, "timestamp follows its record");
                        let key = &b.keys[8 * i..b.key_ends[i] as usize];
                        assert_eq!(key, n.to_le_bytes(), "key follows its record");
                        out.push(Some(n));
                        start = end as usize;
                    }
                }
                _ => out.push(None),
            }
        }
        out
    }

    fn batches(log: &Mutex<Vec<Message>>) -> Vec<usize> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|m| match m {
                Message::Records(b) => Some(b.ends.len()),
                _ => None,
            })
            .collect()
    }

    /// The subtask each record of `0..n` belongs to, computed apart from the edge.
    fn expected_owner(n: u64, p: u32) -> Vec<u32> {
        (0..n)
            .map(|i| {
                let shard = shard_of(&i.to_le_bytes(), SHARDS).0;
                (0..p)
                    .find(|s| shards_of(SubtaskIndex(*s), SHARDS, p).contains(&shard))
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn hash_edge_buffers_across_batches_until_flush_records() {
        let (mut edge, logs) = hash_edge(2);
        edge.set_flush_records(100);
        // Ten batches of 30: each subtask gets about 15 per batch, so it is sent only
        // once it holds 100 or more.
        for b in 0..10 {
            edge.emit(records(b * 30, b * 30 + 30), &site()).unwrap();
        }
        for log in &logs {
            let sizes = batches(log);
            assert!(!sizes.is_empty(), "a subtask got nothing in 300 records");
            assert!(
                sizes.iter().all(|&n| n >= 100),
                "sent before 100: {sizes:?}"
            );
        }
        assert!(edge.has_buffered());
        edge.flush().unwrap();
        assert!(!edge.has_buffered());
        let owners = expected_owner(300, 2);
        for (s, log) in logs.iter().enumerate() {
            let want: Vec<_> = (0..300u64)
                .filter(|&i| owners[i as usize] == s as u32)
                .map(Some)
                .collect();
            assert_eq!(
                received(log),
                want,
                "subtask {s}: every record once, in order"
            );
        }
    }

    /// Payloads and keys of varying lengths (empty ones too) reach their owners intact, in
    /// order, at parallelism 2 and 3.
    #[test]
    fn records_of_varying_lengths_are_split_intact() {
        for p in [2u32, 3] {
            let (mut edge, logs) = hash_edge(p);
            edge.set_flush_records(7);
            let rec = |i: u64| {
                let key = format!("k{}", i % 23).repeat((i % 4) as usize);
                let data = "x".repeat((i % 11) as usize) + &i.to_string();
                (key, data)
            };
            let mut want: Vec<Vec<(String, String, i64)>> = vec![Vec::new(); p as usize];
            for b in 0..20u64 {
                let mut batch = empty_batch();
                for i in b * 13..b * 13 + 13 {
                    let (key, data) = rec(i);
                    batch.data.extend_from_slice(data.as_bytes());
                    batch.ends.push(batch.data.len() as u32);
                    batch.keys.extend_from_slice(key.as_bytes());
                    batch.key_ends.push(batch.keys.len() as u32);
                    batch.timestamps.push(i as i64);
                    let shard = shard_of(key.as_bytes(), SHARDS).0;
                    let owner = (0..p)
                        .find(|s| shards_of(SubtaskIndex(*s), SHARDS, p).contains(&shard))
                        .unwrap();
                    want[owner as usize].push((key, data, i as i64));
                }
                edge.emit(batch, &site()).unwrap();
            }
            edge.flush().unwrap();
            for (s, log) in logs.iter().enumerate() {
                let mut got = Vec::new();
                for m in log.lock().unwrap().iter() {
                    let Message::Records(b) = m else { continue };
                    let (mut start, mut kstart) = (0usize, 0usize);
                    for i in 0..b.ends.len() {
                        let (end, kend) = (b.ends[i] as usize, b.key_ends[i] as usize);
                        let key = String::from_utf8(b.keys[kstart..kend].to_vec()).unwrap();
                        let data = String::from_utf8(b.data[start..end].to_vec()).unwrap();
                        got.push((key, data, b.timestamps[i]));
                        (start, kstart) = (end, kend);
                    }
                    assert_eq!(b.data.len(), start, "no stray bytes");
                    assert_eq!(b.keys.len(), kstart, "no stray key bytes");
                }
                assert!(!want[s].is_empty());
                assert_eq!(got, want[s], "p {p}, subtask {s}");
            }
        }
    }

    #[test]
    fn control_messages_follow_the_records_buffered_before_them() {
        let (mut edge, logs) = hash_edge(3);
        edge.set_flush_records(1000);
        edge.emit(records(0, 40), &site()).unwrap();
        edge.broadcast(&Message::Watermark(7)).unwrap();
        edge.emit(records(40, 80), &site()).unwrap();
        edge.broadcast(&Message::Barrier(EpochId(1))).unwrap();
        edge.emit(records(80, 90), &site()).unwrap();
        edge.broadcast(&Message::End).unwrap();
        assert!(!edge.has_buffered());
        let owners = expected_owner(90, 3);
        for (s, log) in logs.iter().enumerate() {
            let mine = |r: std::ops::Range<u64>| {
                r.filter(|&i| owners[i as usize] == s as u32)
                    .map(Some)
                    .collect::<Vec<_>>()
            };
            let mut want = mine(0..40);
            want.push(None);
            want.extend(mine(40..80));
            want.push(None);
            want.extend(mine(80..90));
            want.push(None);
            assert_eq!(received(log), want, "subtask {s}");
            let kinds: Vec<_> = log
                .lock()
                .unwrap()
                .iter()
                .filter(|m| !matches!(m, Message::Records(_)))
                .cloned()
                .collect();
            assert_eq!(
                kinds,
                [
                    Message::Watermark(7),
                    Message::Barrier(EpochId(1)),
                    Message::End
                ]
            );
        }
    }

    #[test]
    fn a_buffer_older_than_the_timeout_is_sent_by_the_next_batch() {
        let (mut edge, logs) = hash_edge(2);
        edge.set_flush_records(1_000_000);
        edge.emit(records(0, 10), &site()).unwrap();
        assert!(logs.iter().all(|l| l.lock().unwrap().is_empty()));
        std::thread::sleep(BUFFER_TIMEOUT + Duration::from_millis(20));
        edge.emit(records(10, 20), &site()).unwrap();
        assert!(!edge.has_buffered());
        let total: usize = logs.iter().map(|l| received(l).len()).sum();
        assert_eq!(total, 20);
    }

    #[test]
    fn one_subtask_takes_the_batch_whole_and_buffers_nothing() {
        let (mut edge, logs) = hash_edge(1);
        edge.emit(records(0, 5), &site()).unwrap();
        assert!(!edge.has_buffered());
        assert_eq!(batches(&logs[0]), [5]);
    }
}
