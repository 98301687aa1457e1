//! Host↔guest batch call: one operator `process` call on a 1000-record batch through
//! wasmtime (the release plugin components), reported per record.
//!
//! - `bid-map`: the cheapest useful operator (a 32-byte copy per record), so the figure is
//!   mostly the boundary: lowering the batch into guest memory, the call, lifting the
//!   output batch;
//! - `bids-parser`: CSV parsing of bid lines, the head of every bids workload;
//! - `keyed-count`: grouping plus one batched `value_get_many` and `value_put_many` host
//!   call per batch against warm keyed state.

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use nop_stream_api::PluginKind;
use nop_stream_api::{Batch, TaskInfo};
use nop_stream_plugin_host::{
    Instance, InstanceOptions, Limits, OperatorInstance, PluginHost, Site,
};
use nop_stream_state::StateConfig;

const RECORDS: usize = 1000;

fn task() -> TaskInfo {
    TaskInfo {
        job_id: "bench".into(),
        ..TaskInfo::for_tests()
    }
}

fn operator(
    host: &PluginHost,
    package: &str,
    state_dir: Option<&std::path::Path>,
) -> OperatorInstance {
    let path = nop_stream_artifacts::plugin_path(package);
    let plugin = host
        .load(package, &path, PluginKind::Operator)
        .expect("load plugin");
    let state = state_dir.map(|d| StateConfig {
        path: d.join("state.redb"),
        shard_count: 128,
        owned: 0..128,
        states: plugin.info.states.clone(),
        memory_bytes: None,
        ttl_ms: Vec::new(),
    });
    let opts = InstanceOptions {
        site: Site {
            plugin: package.into(),
            operator: "bench".into(),
            subtask: Some(0),
        },
        limits: Limits::default(),
        grants: Vec::new(),
        state,
        capabilities: None,
    };
    let Instance::Operator(mut op) = plugin.instantiate(&opts).expect("instantiate") else {
        panic!("{package} is not an operator")
    };
    op.open(&task(), "{}").expect("open");
    op
}

fn batch(lines: impl Iterator<Item = (Vec<u8>, Option<(Vec<u8>, i64)>)>) -> Batch {
    let mut b = Batch {
        data: Vec::new(),
        ends: Vec::new(),
        keys: Vec::new(),
        key_ends: Vec::new(),
        timestamps: Vec::new(),
    };
    for (data, kt) in lines {
        b.data.extend_from_slice(&data);
        b.ends.push(b.data.len() as u32);
        if let Some((k, t)) = kt {
            b.keys.extend_from_slice(&k);
            b.key_ends.push(b.keys.len() as u32);
            b.timestamps.push(t);
        }
    }
    b
}

fn csv_line(i: usize) -> Vec<u8> {
    format!(
        "{},{},{},Google,{}",
        1000 + (i * 7919) % 10_000,
        i * 31 % 100_000,
        100 + i * 997 % 999_900,
        1_700_000_000_000u64 + i as u64
    )
    .into_bytes()
}

fn encoded_bid(i: usize) -> (Vec<u8>, Option<(Vec<u8>, i64)>) {
    let auction = (1000 + (i * 7919) % 10_000) as i64;
    let mut v = Vec::new();
    for x in [auction, 7, 12_345, 1_700_000_000_000 + i as i64] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(b"Google");
    (
        v,
        Some((auction.to_le_bytes().to_vec(), 1_700_000_000_000 + i as i64)),
    )
}

/// Prints ns per record of `f` (one call = one batch of `RECORDS`) over about a second.
fn print_per_record(name: &str, mut f: impl FnMut()) {
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        f();
        calls += 1;
    }
    let ns = started.elapsed().as_nanos() as f64 / (calls as f64 * RECORDS as f64);
    println!(
        "per-record {name}: {ns:.1} ns/record ({:.1} M records/s)",
        1e3 / ns
    );
}

fn boundary(c: &mut Criterion) {
    let host = nop_stream_task::plugin_host(None).expect("plugin host");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut g = c.benchmark_group("boundary");
    g.throughput(Throughput::Elements(RECORDS as u64));

    let mut map = operator(&host, "bid-map", None);
    let bids = batch((0..RECORDS).map(encoded_bid));
    g.bench_function("bid-map/process-1000", |b| {
        // `process` takes its batch by value (it moves into the WIT call); the clone is
        // set-up, outside the measured time.
        b.iter_batched(
            || bids.clone(),
            |batch| black_box(map.process(0, batch).expect("process")),
            BatchSize::LargeInput,
        )
    });
    print_per_record("bid-map process (incl. cloning its input)", || {
        black_box(map.process(0, bids.clone()).expect("process"));
    });

    let mut parser = operator(&host, "bids-parser", None);
    let lines = batch((0..RECORDS).map(|i| (csv_line(i), None)));
    g.bench_function("bids-parser/process-1000", |b| {
        // `process` takes its batch by value (it moves into the WIT call); the clone is
        // set-up, outside the measured time.
        b.iter_batched(
            || lines.clone(),
            |batch| black_box(parser.process(0, batch).expect("process")),
            BatchSize::LargeInput,
        )
    });
    print_per_record("bids-parser process (incl. cloning its input)", || {
        black_box(parser.process(0, lines.clone()).expect("process"));
    });

    let mut count = operator(&host, "keyed-count", Some(dir.path()));
    g.bench_function("keyed-count/process-1000", |b| {
        // `process` takes its batch by value (it moves into the WIT call); the clone is
        // set-up, outside the measured time.
        b.iter_batched(
            || bids.clone(),
            |batch| black_box(count.process(0, batch).expect("process")),
            BatchSize::LargeInput,
        )
    });
    print_per_record(
        "keyed-count process (state get_many + put_many, incl. cloning its input)",
        || {
            black_box(count.process(0, bids.clone()).expect("process"));
        },
    );
    g.finish();
}

criterion_group!(benches, boundary);
criterion_main!(benches);
