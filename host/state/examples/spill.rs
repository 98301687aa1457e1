//! The keyed count's access pattern on [`KeyedState`] alone, with and without a memory
//! budget: `records` uniform keys out of `keys` (8-byte big-endian ids, 8-byte counts),
//! in batches of 1,024 (one `value_get_many`, then one `value_put_many` of the batch, as
//! the `keyed-count` plugin does once its cache is bypassed), a snapshot every `epoch`
//! records (a delta view when the state can give one, else a full view), written on this
//! thread. Prints the time spent reading, writing and snapshotting, the evictions, the
//! full and delta snapshots, and the bytes they wrote.
//!
//! `cargo run --release -p nop-stream-state --example spill -- KEYS RECORDS EPOCH [BUDGET]`
//! (BUDGET in bytes; absent: no budget).

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{KeyedState, StateConfig};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let (keys, records, epoch) = (args[0], args[1], args[2]);
    let budget = args.get(3).copied();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut s = KeyedState::open(StateConfig {
        path: dir.path().join("s.redb"),
        shard_count: 128,
        owned: 0..128,
        states: vec![StateDescriptor {
            name: "count".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "raw".into(),
            schema_sha256: None,
        }],
        memory_bytes: budget,
        ttl_ms: Vec::new(),
    })
    .expect("open");
    s.set_incremental(true);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut get, mut put, mut snap) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut fulls, mut deltas, mut snap_bytes) = (0u64, 0u64, 0u64);
    let (mut kbuf, mut kends, mut vbuf, mut vends) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut data, mut ends, mut present) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    let mut done = 0u64;
    let mut next_epoch = epoch;
    while done < records {
        let n = 1024.min(records - done);
        kbuf.clear();
        kends.clear();
        for _ in 0..n {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            kbuf.extend_from_slice(&(rng % keys).to_be_bytes());
            kends.push(kbuf.len() as u32);
        }
        let t = Instant::now();
        s.value_get_many(0, b"", &kbuf, &kends, &mut data, &mut ends, &mut present)
            .expect("get");
        get += t.elapsed();
        vbuf.clear();
        vends.clear();
        let mut start = 0usize;
        for (i, &e) in ends.iter().enumerate() {
            let old = if present[i] {
                u64::from_be_bytes(data[start..e as usize].try_into().expect("8 bytes"))
            } else {
                0
            };
            start = e as usize;
            vbuf.extend_from_slice(&(old + 1).to_be_bytes());
            vends.push(vbuf.len() as u32);
        }
        // A key twice in a batch: the count plugin sums them first; here the last
        // write wins, which is as costly.
        let t = Instant::now();
        s.value_put_many(0, b"", &kbuf, &kends, &vbuf, &vends)
            .expect("put");
        put += t.elapsed();
        done += n;
        if done >= next_epoch || done == records {
            next_epoch += epoch;
            let t = Instant::now();
            let view = match s.delta_view().expect("delta view") {
                Some(v) => {
                    deltas += 1;
                    v
                }
                None => {
                    fulls += 1;
                    s.snapshot_view().expect("full view")
                }
            };
            view.write(&mut |p| {
                snap_bytes += p.payload.len() as u64;
                Ok(())
            })
            .expect("write");
            snap += t.elapsed();
        }
    }
    let wall = started.elapsed();
    println!(
        "keys {keys} records {records} budget {budget:?}: {:.0} rec/s, wall {:.2} s \
         (get {:.2} s, put+evict {:.2} s, snapshots {:.2} s), evictions {}, \
         snapshots {fulls} full / {deltas} delta, {:.1} MiB written, cached {} bytes, \
         database file {:.1} MiB",
        records as f64 / wall.as_secs_f64(),
        wall.as_secs_f64(),
        get.as_secs_f64(),
        put.as_secs_f64(),
        snap.as_secs_f64(),
        s.evictions(),
        snap_bytes as f64 / (1 << 20) as f64,
        s.cached_bytes(),
        std::fs::metadata(dir.path().join("s.redb")).map_or(0, |m| m.len()) as f64
            / (1 << 20) as f64,
    );
}
