//! Keyed state through `nop_stream_state::KeyedState`: batched `value_get_many` /
//! `value_put_many` on 1000 keys against the in-memory working set, and the redb flush of
//! the dirty entries of one shard (and of a whole subtask's 10,000 keys), per entry.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_core::shard_of;
use nop_stream_state::{KeyedState, StateConfig};

const SHARDS: u32 = 128;

fn open(dir: &std::path::Path, name: &str) -> KeyedState {
    KeyedState::open(StateConfig {
        path: dir.join(name),
        shard_count: SHARDS,
        owned: 0..SHARDS,
        states: vec![StateDescriptor {
            name: "count".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "u64-le".into(),
            schema_sha256: None,
        }],
        memory_bytes: None,
        ttl_ms: Vec::new(),
    })
    .expect("open state")
}

/// Flat keys and 8-byte values of `keys`.
fn flat(keys: &[u64]) -> (Vec<u8>, Vec<u32>, Vec<u8>, Vec<u32>) {
    let (mut k, mut ke, mut v, mut ve) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, key) in keys.iter().enumerate() {
        k.extend_from_slice(&key.to_le_bytes());
        ke.push(k.len() as u32);
        v.extend_from_slice(&(i as u64).to_le_bytes());
        ve.push(v.len() as u32);
    }
    (k, ke, v, ve)
}

fn per_entry(name: &str, entries: usize, mut f: impl FnMut()) {
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        f();
        calls += 1;
    }
    let ns = started.elapsed().as_nanos() as f64 / (calls as f64 * entries as f64);
    println!("per-record {name}: {ns:.1} ns/entry");
}

fn state(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut st = open(dir.path(), "kv.redb");
    let keys: Vec<u64> = (0..1000u64).map(|i| 1000 + i * 10).collect();
    let (k, ke, v, ve) = flat(&keys);
    st.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put");
    let (mut data, mut ends, mut present) = (Vec::new(), Vec::new(), Vec::new());

    let mut g = c.benchmark_group("state");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("value_get_many-1000", |b| {
        b.iter(|| {
            st.value_get_many(0, &[], &k, &ke, &mut data, &mut ends, &mut present)
                .expect("get");
            black_box(data.len())
        })
    });
    per_entry("state value_get_many (1000 keys, cached)", 1000, || {
        st.value_get_many(0, &[], &k, &ke, &mut data, &mut ends, &mut present)
            .expect("get");
    });
    g.bench_function("value_put_many-1000", |b| {
        b.iter(|| st.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put"))
    });
    per_entry("state value_put_many (1000 keys, cached)", 1000, || {
        st.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put");
    });
    g.finish();

    // Flush: one shard's worth (the keys of shard 0 among 10,000 auctions, ~78) and a
    // whole subtask's 10,000 keys, non-durable (redb Durability::None) and durable.
    let all: Vec<u64> = (1000..11_000u64).collect();
    let shard0: Vec<u64> = all
        .iter()
        .copied()
        .filter(|a| shard_of(&a.to_le_bytes(), SHARDS).0 == 0)
        .collect();
    let mut g = c.benchmark_group("flush");
    for (label, set) in [("one-shard", &shard0), ("10k-keys", &all)] {
        let (k, ke, v, ve) = flat(set);
        let mut st = open(dir.path(), &format!("flush-{label}.redb"));
        g.throughput(Throughput::Elements(set.len() as u64));
        for durable in [false, true] {
            let name = format!(
                "{label}-{}-{}",
                set.len(),
                if durable { "durable" } else { "nondurable" }
            );
            // Measures the flush only; the put re-dirtying the entries is outside the timer.
            g.bench_function(&name, |b| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        st.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put");
                        let started = Instant::now();
                        st.flush(durable).expect("flush");
                        spent += started.elapsed();
                    }
                    spent
                })
            });
            per_entry(
                &format!("flush {name} (incl. re-dirtying put)"),
                set.len(),
                || {
                    st.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put");
                    st.flush(durable).expect("flush");
                },
            );
        }
    }
    g.finish();

    // Snapshot and restore of one StateShard (the ~78 keys of shard 0): what a
    // checkpoint writes per shard, and what a restore (or a rescale moving the shard)
    // reads back into an empty subtask state.
    let (k, ke, v, ve) = flat(&shard0);
    let mut src = open(dir.path(), "snapshot-src.redb");
    src.value_put_many(0, &[], &k, &ke, &v, &ve).expect("put");
    let mut g = c.benchmark_group("shard");
    g.throughput(Throughput::Elements(shard0.len() as u64));
    g.bench_function(format!("snapshot-one-shard-{}", shard0.len()), |b| {
        b.iter(|| src.snapshot().expect("snapshot"))
    });
    let snaps = src.snapshot().expect("snapshot");
    let mut n = 0u32;
    g.bench_function(format!("restore-one-shard-{}", shard0.len()), |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let mut dst = open(dir.path(), &format!("restore-{n}.redb"));
                let started = Instant::now();
                dst.restore(&snaps).expect("restore");
                spent += started.elapsed();
                drop(dst);
                let _ = std::fs::remove_file(dir.path().join(format!("restore-{n}.redb")));
            }
            spent
        })
    });
    g.finish();
}

criterion_group!(benches, state);
criterion_main!(benches);
