//! HASH split: a task's output batch of 1,024 keyed records (38-byte payloads, 8-byte
//! auction keys over 10,000 auctions, as `bids-parser` emits for the keyed count) through
//! an [`OutputEdge`] into two downstream subtasks, against the same batch moved whole to one
//! subtask (what p=1 does). The difference is what the split costs per record: the cost
//! p=2 pays that p=1 does not (design §20). Sent batches are dropped by the sender.
//! For scale it also prints two floors of any record-by-record split: hashing the keys
//! alone, and a bare scatter into two reused buffers.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nop_stream_api::{Batch, ChannelId, EdgeId, PartitionPolicy, SubtaskIndex};
use nop_stream_core::shards_of;
use nop_stream_plugin_host::Site;
use nop_stream_task::partition::OutputEdge;
use nop_stream_task::transport::{ChannelSender, Message};

const RECORDS: usize = 1024;
const SHARDS: u32 = 128;

/// Drops what it is sent (after a look, so the batch is not optimised away).
struct Drop0(ChannelId);

impl ChannelSender for Drop0 {
    fn channel(&self) -> &ChannelId {
        &self.0
    }
    fn send(&mut self, msg: Message) -> nop_stream_plugin_host::Result<()> {
        black_box(&msg);
        Ok(())
    }
}

fn batch() -> Batch {
    let mut b = Batch::default();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..RECORDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let auction = 1000 + x % 10_000;
        b.data.extend_from_slice(&[i as u8; 38]);
        b.ends.push(b.data.len() as u32);
        b.keys.extend_from_slice(&auction.to_le_bytes());
        b.key_ends.push(b.keys.len() as u32);
    }
    b
}

fn edge(p: u32) -> OutputEdge {
    let senders = (0..p)
        .map(|i| {
            Box::new(Drop0(ChannelId {
                edge: EdgeId::new("parse->count#0"),
                upstream: SubtaskIndex(0),
                downstream: SubtaskIndex(i),
                index: 0,
            })) as Box<dyn ChannelSender>
        })
        .collect();
    let mut owners = vec![0u32; SHARDS as usize];
    for s in 0..p {
        for shard in shards_of(SubtaskIndex(s), SHARDS, p) {
            owners[shard as usize] = s;
        }
    }
    let mut e = OutputEdge::new(
        EdgeId::new("parse->count#0"),
        PartitionPolicy::Hash,
        senders,
        (0..p).collect(),
        owners,
    );
    e.set_flush_records(RECORDS);
    e
}

/// Nanoseconds per record of cloning the batch and emitting it on `e`, over about 1 s.
fn ns_per_record(e: &mut OutputEdge, template: &Batch, site: &Site) -> f64 {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        for _ in 0..64 {
            e.emit(template.clone(), site).expect("emit");
        }
        n += 64;
    }
    started.elapsed().as_nanos() as f64 / (n as f64 * RECORDS as f64)
}

fn split(c: &mut Criterion) {
    let template = batch();
    let site = Site {
        plugin: "bids-parser@0.1.0".into(),
        operator: "parse".into(),
        subtask: Some(0),
    };
    let mut g = c.benchmark_group("hash-edge");
    g.throughput(Throughput::Elements(RECORDS as u64));
    for p in [1u32, 2] {
        let mut e = edge(p);
        g.bench_function(format!("emit-1024-to-{p}"), |b| {
            b.iter(|| e.emit(template.clone(), &site).expect("emit"))
        });
    }
    g.finish();
    let whole = ns_per_record(&mut edge(1), &template, &site);
    let split = ns_per_record(&mut edge(2), &template, &site);
    let hash = hash_ns_per_record(&template);
    let floor = scatter_floor_ns_per_record(&template);
    println!(
        "HASH edge, clone + emit per record: one subtask {whole:.2} ns, two subtasks {split:.2} ns; \
         the split costs {:.2} ns/record ({:.2}x the whole move)",
        split - whole,
        split / whole
    );
    println!(
        "its floor: the key hash alone {hash:.2} ns/record, a bare record-by-record scatter \
         into two warm buffers {floor:.2} ns/record; split ÷ (hash + scatter) = {:.2}",
        (split - whole) / (hash + floor)
    );
}

/// Nanoseconds per record of hashing each key to its shard, the part of a split no layout
/// avoids, over about 1 s.
fn hash_ns_per_record(b: &Batch) -> f64 {
    let started = Instant::now();
    let (mut n, mut acc) = (0u64, 0u32);
    while started.elapsed() < Duration::from_secs(1) {
        for _ in 0..64 {
            let b = black_box(b);
            let mut kstart = 0usize;
            for &kend in &b.key_ends {
                let key = &b.keys[kstart..kend as usize];
                acc = acc.wrapping_add(nop_stream_core::shard_of(key, SHARDS).0);
                kstart = kend as usize;
            }
        }
        n += 64;
    }
    black_box(acc);
    started.elapsed().as_nanos() as f64 / (n as f64 * RECORDS as f64)
}

/// Nanoseconds per record of the least a record-by-record split does: each record's
/// payload and key appended to one of two buffers that are reused (warm, never regrown),
/// the buffer picked by a key bit instead of a hash, nothing sent, over about 1 s.
fn scatter_floor_ns_per_record(b: &Batch) -> f64 {
    let mut outs: Vec<Batch> = (0..2)
        .map(|_| Batch {
            data: Vec::with_capacity(b.data.len()),
            ends: Vec::with_capacity(RECORDS),
            keys: Vec::with_capacity(b.keys.len()),
            key_ends: Vec::with_capacity(RECORDS),
            timestamps: Vec::new(),
        })
        .collect();
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        for _ in 0..64 {
            let b = black_box(b);
            for o in &mut outs {
                o.data.clear();
                o.ends.clear();
                o.keys.clear();
                o.key_ends.clear();
            }
            let (mut start, mut kstart) = (0usize, 0usize);
            for i in 0..b.ends.len() {
                let (end, kend) = (b.ends[i] as usize, b.key_ends[i] as usize);
                let o = &mut outs[usize::from(b.keys[kstart] & 1)];
                o.data.extend_from_slice(&b.data[start..end]);
                o.ends.push(o.data.len() as u32);
                o.keys.extend_from_slice(&b.keys[kstart..kend]);
                o.key_ends.push(o.keys.len() as u32);
                (start, kstart) = (end, kend);
            }
        }
        n += 64;
    }
    black_box(&outs);
    started.elapsed().as_nanos() as f64 / (n as f64 * RECORDS as f64)
}

criterion_group!(benches, split);
criterion_main!(benches);
