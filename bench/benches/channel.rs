//! Channel hop: a 1000-record batch through `LocalTransport` (bounded crossbeam queue with
//! the fencing-token check on send), on one thread (send then receive: the queue and check
//! cost) and between two threads (a ring of two channels, so every batch makes two hops
//! and is recycled; includes thread hand-off).

#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nop_stream_api::Batch;
use nop_stream_api::{ChannelId, EdgeId, FencingToken, SubtaskIndex};
use nop_stream_task::transport::{LocalTransport, Message, Transport};

const RECORDS: usize = 1000;

fn batch() -> Batch {
    let mut b = Batch {
        data: Vec::new(),
        ends: Vec::new(),
        keys: Vec::new(),
        key_ends: Vec::new(),
        timestamps: Vec::new(),
    };
    for i in 0..RECORDS {
        b.data.extend_from_slice(&[i as u8; 38]);
        b.ends.push(b.data.len() as u32);
        b.keys.extend_from_slice(&(i as u64).to_le_bytes());
        b.key_ends.push(b.keys.len() as u32);
        b.timestamps.push(i as i64);
    }
    b
}

fn channel(edge: &str) -> ChannelId {
    ChannelId {
        edge: EdgeId::new(edge),
        upstream: SubtaskIndex(0),
        downstream: SubtaskIndex(0),
        index: 0,
    }
}

fn hop(c: &mut Criterion) {
    let token = FencingToken(1);
    let t = LocalTransport::new(16, token, Arc::new(AtomicBool::new(false)));
    let id = channel("a");
    let rx = t.open_receiver(&id, token).expect("receiver");
    let mut tx = t.open_sender(&id, token).expect("sender");
    let mut g = c.benchmark_group("channel");
    g.throughput(Throughput::Elements(RECORDS as u64));
    let mut held = Some(batch());
    let mut one = || {
        tx.send(Message::Records(held.take().expect("batch")))
            .expect("send");
        match rx.recv().expect("recv") {
            Message::Records(b) => held = Some(b),
            _ => unreachable!(),
        }
    };
    g.bench_function("same-thread-hop-1000", |b| b.iter(&mut one));
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        one();
        n += 1;
    }
    let ns = started.elapsed().as_nanos() as f64 / (n as f64 * RECORDS as f64);
    println!("per-record channel hop, same thread: {ns:.2} ns/record");

    // Two threads, two channels forming a ring; 4 batches in flight.
    let fwd = channel("fwd");
    let back = channel("back");
    let rx_fwd = t.open_receiver(&fwd, token).expect("receiver");
    let mut tx_back = t.open_sender(&back, token).expect("sender");
    let echo = std::thread::spawn(move || {
        while let Ok(m) = rx_fwd.recv() {
            match m {
                Message::End => return,
                m => tx_back.send(m).expect("send back"),
            }
        }
    });
    let rx_back = t.open_receiver(&back, token).expect("receiver");
    let mut tx_fwd = t.open_sender(&fwd, token).expect("sender");
    for _ in 0..4 {
        tx_fwd.send(Message::Records(batch())).expect("prime");
    }
    let mut ring = || {
        let m = rx_back.recv().expect("recv");
        tx_fwd.send(black_box(m)).expect("send");
    };
    g.bench_function("two-thread-ring-1000 (2 hops)", |b| b.iter(&mut ring));
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        ring();
        n += 1;
    }
    let ns = started.elapsed().as_nanos() as f64 / (n as f64 * RECORDS as f64 * 2.0);
    println!("per-record channel hop, across threads: {ns:.2} ns/record");
    tx_fwd.send(Message::End).expect("end");
    g.finish();
    drop(tx_fwd);
    let _ = echo.join();
}

criterion_group!(benches, hop);
criterion_main!(benches);
