//! What [`KeyedState::restore`] costs on the keyed count's state: `keys` 8-byte
//! big-endian keys with 8-byte counts over 128 shards, snapshotted as a chain (a full
//! payload per shard, then `deltas` deltas each changing a tenth of the keys), restored
//! `rounds` times into a fresh state with incremental snapshots on and no memory budget
//! (as a task restores). Prints each round's time and MB/s of payload read.
//!
//! `cargo run --release -p nop-stream-state --example restore -- KEYS [DELTAS] [ROUNDS]`

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{KeyedState, ShardSnapshot, StateConfig};
use std::time::Instant;

fn open(dir: &std::path::Path, name: &str) -> KeyedState {
    let mut s = KeyedState::open(StateConfig {
        path: dir.join(name),
        shard_count: 128,
        owned: 0..128,
        states: vec![StateDescriptor {
            name: "count".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "raw".into(),
            schema_sha256: None,
        }],
        memory_bytes: None,
        ttl_ms: Vec::new(),
    })
    .expect("open");
    s.set_incremental(true);
    s
}

fn put(s: &mut KeyedState, keys: impl Iterator<Item = u64>, value: u64) {
    let (mut kbuf, mut kends, mut vbuf, mut vends) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for k in keys {
        kbuf.extend_from_slice(&k.to_be_bytes());
        kends.push(kbuf.len() as u32);
        vbuf.extend_from_slice(&value.to_be_bytes());
        vends.push(vbuf.len() as u32);
        if kends.len() == 1024 {
            s.value_put_many(0, b"", &kbuf, &kends, &vbuf, &vends)
                .expect("put");
            kbuf.clear();
            kends.clear();
            vbuf.clear();
            vends.clear();
        }
    }
    if !kends.is_empty() {
        s.value_put_many(0, b"", &kbuf, &kends, &vbuf, &vends)
            .expect("put");
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let keys = args[0];
    let deltas = args.get(1).copied().unwrap_or(2);
    let rounds = args.get(2).copied().unwrap_or(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = open(dir.path(), "source.redb");
    put(&mut s, 0..keys, 1);
    let mut chain: Vec<ShardSnapshot> = Vec::new();
    let collect = |chain: &mut Vec<ShardSnapshot>, s: &mut KeyedState| {
        let view = match s.delta_view().expect("delta view") {
            Some(v) => v,
            None => s.snapshot_view().expect("full view"),
        };
        view.write(&mut |p| {
            chain.push(p);
            Ok(())
        })
        .expect("write");
    };
    collect(&mut chain, &mut s);
    for d in 0..deltas {
        put(&mut s, (d..keys).step_by(10), d + 2);
        collect(&mut chain, &mut s);
    }
    drop(s);
    // Chain order per (state, shard): the full payload, then its deltas.
    chain.sort_by_key(|p| (p.state, p.shard.0, p.delta));
    let bytes: usize = chain.iter().map(|p| p.payload.len()).sum();
    for round in 0..rounds {
        let mut r = open(dir.path(), &format!("restored-{round}.redb"));
        let t = Instant::now();
        r.restore(&chain).expect("restore");
        let took = t.elapsed().as_secs_f64();
        println!(
            "round {round}: {keys} keys, {} payloads, {:.1} MiB in {:.0} ms: {:.0} MB/s",
            chain.len(),
            bytes as f64 / (1 << 20) as f64,
            took * 1000.0,
            bytes as f64 / 1e6 / took
        );
    }
}
