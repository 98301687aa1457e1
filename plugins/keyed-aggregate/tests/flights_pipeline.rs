//! Native end-to-end run of the flights example: file-source (4 splits) → flights-mapper →
//! keyed-aggregate (3 subtasks, hash-routed) → jsonl-sink, over the real data when
//! `/tmp/flights.csv` exists (`unzip -p examples/flights/data/flights.csv.zip flights.csv`).

use file_source::FileSource;
use flights_mapper::FlightsMapper;
use jsonl_sink::JsonlSink;
use keyed_aggregate::KeyedAggregate;
use nop_stream_sdk::{Batch, MockContext, Operator, Sink, Source, TaskInfo};

const AGGREGATE: &str = r#"{ "key_field": "carrier", "aggregates": [
    {"name":"flights","fn":"count"},
    {"name":"cancelled","fn":"count_null","field":"dep_delay"},
    {"name":"delayed_15","fn":"count_gt","field":"dep_delay","value":15},
    {"name":"avg_dep_delay_min","fn":"avg","field":"dep_delay"} ] }"#;

fn route(key: &[u8], parallelism: usize) -> usize {
    key.iter().map(|b| usize::from(*b)).sum::<usize>() % parallelism
}

#[test]
fn flights_per_carrier_end_to_end() {
    let path = "/tmp/flights.csv";
    if !std::path::Path::new(path).exists() {
        return;
    }
    let task = TaskInfo::for_tests();
    let mut source =
        FileSource::open(&task, &format!(r#"{{"path":"{path}","splits":4}}"#)).unwrap();
    let mut ctx = MockContext::for_operator::<FlightsMapper>();
    let mut mapper =
        FlightsMapper::open(&mut ctx, &task, r#"{"fields":["carrier","dep_delay"]}"#).unwrap();
    let parallelism = 3;
    let mut aggs: Vec<(MockContext, KeyedAggregate)> = (0..parallelism)
        .map(|_| {
            let mut c = MockContext::for_operator::<KeyedAggregate>();
            let a = KeyedAggregate::open(&mut c, &task, AGGREGATE).unwrap();
            (c, a)
        })
        .collect();
    let mut lines = 0;
    for split in source.discover_splits(2).unwrap() {
        let mut cursor = Vec::new();
        loop {
            let mut raw = Batch::default();
            let r = source.read(&split, &cursor, 1000, &mut raw).unwrap();
            lines += raw.len();
            let mut mapped = Batch::default();
            mapper.process(&mut ctx, 0, &raw, &mut mapped).unwrap();
            let mut parts: Vec<Batch> = (0..parallelism).map(|_| Batch::default()).collect();
            for rec in mapped.iter() {
                parts[route(rec.key.unwrap(), parallelism)].push_keyed(rec.key.unwrap(), rec.data);
            }
            for ((c, a), part) in aggs.iter_mut().zip(&parts) {
                a.process(c, 0, part, &mut Batch::default()).unwrap();
            }
            cursor = r.next_cursor;
            if r.finished {
                break;
            }
        }
    }
    assert_eq!(lines, 336_776);

    let dir = tempfile::tempdir().unwrap();
    let mut sink =
        JsonlSink::open(&task, &serde_json::json!({ "dir": dir.path() }).to_string()).unwrap();
    let txn = "flights:main:sinks/out:0:1";
    sink.begin(txn).unwrap();
    let mut results: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for (c, a) in &mut aggs {
        let mut out = Batch::default();
        a.finish(c, &mut out).unwrap();
        results.extend(
            out.iter()
                .map(|r| (r.key.unwrap().to_vec(), r.data.to_vec())),
        );
    }
    results.sort();
    let mut all = Batch::default();
    for (k, d) in &results {
        all.push_keyed(k, d);
    }
    sink.write(txn, &all).unwrap();
    let committable = sink.pre_commit(txn).unwrap();
    sink.commit(&committable).unwrap();
    let text = std::fs::read_to_string(dir.path().join("part-00-000001.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 16);
    let aa = text
        .lines()
        .find(|l| l.starts_with(r#"{"carrier":"AA""#))
        .unwrap();
    assert!(
        aa.starts_with(r#"{"carrier":"AA","flights":32729,"cancelled":636,"#),
        "{aa}"
    );
    let total: u64 = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["flights"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 336_776);
}
