//! Native tests of `window-aggregate` against an independent computation over the input.

use std::collections::BTreeMap;

use nop_stream_sdk::{Batch, ErrorCode, MockContext};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const AGGS: &str = r#"[{"name":"n","fn":"count"},{"name":"flown","fn":"count","field":"dep_delay"},
    {"name":"total","fn":"sum","field":"dep_delay"},{"name":"avg","fn":"avg","field":"dep_delay"},
    {"name":"lo","fn":"min","field":"dep_delay"},{"name":"hi","fn":"max","field":"dep_delay"}]"#;

fn config(window: &str) -> String {
    format!(r#"{{"window":{window},"aggregates":{AGGS}}}"#)
}

/// (key, ts, dep_delay)
type Rec = (String, i64, Option<i64>);

fn to_batch(recs: &[Rec]) -> Batch {
    let mut b = Batch::new();
    for (k, ts, d) in recs {
        let v = json!({"carrier": k, "dep_delay": d, "origin": "EWR"});
        b.push_record(Some(k.as_bytes()), Some(*ts), v.to_string().as_bytes());
    }
    b
}

/// Runs `recs` in batches with watermark `wm(batch index)` after each, then +inf.
fn run(
    cfg: &str,
    recs: &[Rec],
    batch: usize,
    wm: impl std::ops::Fn(usize) -> i64,
) -> (Vec<Value>, Batch, MockContext) {
    let mut ctx = MockContext::for_operator::<WindowAggregate>();
    let mut op = WindowAggregate::open(&mut ctx, &TaskInfo::for_tests(), cfg).unwrap();
    let mut out = Batch::new();
    let mut late = Batch::new();
    let step = |ctx: &mut MockContext, op: &mut WindowAggregate, w: i64, out: &mut Batch| {
        let timers = ctx.fire_due_event_timers(w);
        op.on_timers(ctx, &timers, out).unwrap();
        op.on_watermark(ctx, w, out).unwrap();
    };
    for (i, chunk) in recs.chunks(batch.max(1)).enumerate() {
        op.process(&mut ctx, 0, &to_batch(chunk), &mut out).unwrap();
        for r in ctx.take_side_output(LATE_OUTPUT).iter() {
            late.push_record(r.key, r.timestamp, r.data);
        }
        // A checkpoint and a fresh instance after every batch: nothing may live in the
        // guest past `prepare_checkpoint`.
        op.prepare_checkpoint(&mut ctx, i as u64, &mut out).unwrap();
        op = WindowAggregate::open(&mut ctx, &TaskInfo::for_tests(), cfg).unwrap();
        step(&mut ctx, &mut op, wm(i), &mut out);
    }
    step(&mut ctx, &mut op, i64::MAX, &mut out);
    for (i, r) in out.iter().enumerate() {
        let v: Value = serde_json::from_slice(r.data).unwrap();
        assert_eq!(r.key.unwrap(), v["key"].as_str().unwrap().as_bytes());
        assert_eq!(
            r.timestamp,
            v["window_end"].as_i64().map(|e| e - 1),
            "record {i}"
        );
    }
    let vals = out
        .iter()
        .map(|r| serde_json::from_slice(r.data).unwrap())
        .collect();
    (vals, late, ctx)
}

/// The expected output object of one window, computed directly.
fn expect(key: &str, w: (i64, i64), delays: &[Option<i64>]) -> Value {
    let vals: Vec<i64> = delays.iter().flatten().copied().collect();
    let sum: i64 = vals.iter().sum();
    json!({
        "key": key, "window_start": w.0, "window_end": w.1,
        "n": delays.len(), "flown": vals.len(),
        "total": if vals.is_empty() { Value::Null } else { json!(sum) },
        "avg": if vals.is_empty() { Value::Null } else { json!(sum as f64 / vals.len() as f64) },
        "lo": vals.iter().min(), "hi": vals.iter().max(),
    })
}

/// Windows per key by brute force: tumbling/sliding by grid, sessions by sorting.
fn reference(recs: &[Rec], kind: &str, size: i64, slide: i64) -> Vec<Value> {
    let mut groups: BTreeMap<(String, i64, i64), Vec<Option<i64>>> = BTreeMap::new();
    if kind == "session" {
        let mut by_key: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
        for (k, ts, d) in recs {
            by_key.entry(k).or_default().push((*ts, *d));
        }
        for (k, mut rs) in by_key {
            rs.sort_by_key(|r| r.0);
            let mut cur: Option<(i64, i64, Vec<Option<i64>>)> = None;
            for (ts, d) in rs {
                match &mut cur {
                    // Half-open windows: a record at the session's end starts a new one.
                    Some((_, end, ds)) if ts < *end => {
                        *end = (*end).max(ts + size);
                        ds.push(d);
                    }
                    _ => {
                        if let Some((s, e, ds)) = cur.take() {
                            groups.insert((k.to_string(), s, e), ds);
                        }
                        cur = Some((ts, ts + size, vec![d]));
                    }
                }
            }
            if let Some((s, e, ds)) = cur {
                groups.insert((k.to_string(), s, e), ds);
            }
        }
    } else {
        for (k, ts, d) in recs {
            let mut start = (ts.div_euclid(slide) - size / slide - 1) * slide;
            while start <= *ts {
                if *ts < start + size {
                    groups
                        .entry((k.clone(), start, start + size))
                        .or_default()
                        .push(*d);
                }
                start += slide;
            }
        }
    }
    groups
        .iter()
        .map(|((k, s, e), ds)| expect(k, (*s, *e), ds))
        .collect()
}

fn sorted(mut v: Vec<Value>) -> Vec<Value> {
    v.sort_by_key(|v| {
        (
            v["key"].to_string(),
            v["window_start"].as_i64(),
            v["window_end"].as_i64(),
        )
    });
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn windows_equal_a_direct_computation(
        recs in prop::collection::vec(
            (prop::sample::select(vec!["AA", "UA", "B6"]), -100i64..400, prop::option::of(-60i64..300)),
            0..120),
        kind in prop::sample::select(vec!["tumbling", "sliding", "session"]),
        size in 1i64..60,
        slide_div in 1i64..5,
        batch in 1usize..40,
    ) {
        let recs: Vec<Rec> = recs.into_iter().map(|(k, t, d)| (k.to_string(), t, d)).collect();
        let slide = (size / slide_div).max(1);
        let window = match kind {
            "tumbling" => format!(r#"{{"kind":"tumbling","size_ms":{size}}}"#),
            "sliding" => format!(r#"{{"kind":"sliding","size_ms":{size},"slide_ms":{slide}}}"#),
            _ => format!(r#"{{"kind":"session","gap_ms":{size}}}"#),
        };
        let (size_eff, slide_eff) = if kind == "tumbling" { (size, size) } else { (size, slide) };
        // Watermarks as high as the input allows: just below every record still to come,
        // so nothing is late and no later record can overlap a fired session.
        let mins: Vec<i64> = (0..recs.len().div_ceil(batch.max(1)))
            .map(|i| recs[((i + 1) * batch).min(recs.len())..].iter().map(|r| r.1).min().unwrap_or(i64::MAX - 1) - 1)
            .collect();
        let (got, late, ctx) = run(&config(&window), &recs, batch, |i| mins[i]);
        prop_assert!(late.is_empty());
        prop_assert_eq!(sorted(got), sorted(reference(&recs, kind, size_eff, slide_eff)));
        prop_assert_eq!(ctx.state_entry_count(), 0);
        prop_assert!(ctx.registered_timers().is_empty());
    }
}

#[test]
fn output_shape_late_records_and_field_order() {
    let cfg = config(r#"{"kind":"tumbling","size_ms":10}"#);
    let recs: Vec<Rec> = vec![
        ("AA".into(), 1, Some(5)),
        ("AA".into(), 4, None),
        ("AA".into(), 12, Some(-3)),
        ("AA".into(), 2, Some(7)), // after watermark 9: late
    ];
    let (got, late, ctx) = run(&cfg, &recs, 3, |_| 9);
    assert_eq!(late.len(), 1);
    assert_eq!(late.key(0), Some(&b"AA"[..]));
    assert_eq!(late.timestamp(0), Some(2));
    assert_eq!(late.record(0), to_batch(&recs[3..]).record(0));
    assert_eq!(got[0], expect("AA", (0, 10), &[Some(5), None]));
    assert_eq!(got[1], expect("AA", (10, 20), &[Some(-3)]));
    assert_eq!(ctx.state_entry_count(), 0);
    // Field order is deterministic: key, window, aggregates in config order.
    let mut ctx = MockContext::for_operator::<WindowAggregate>();
    let mut op = WindowAggregate::open(&mut ctx, &TaskInfo::for_tests(), &cfg).unwrap();
    let mut b = Batch::new();
    b.push_record(Some(b"B6"), Some(3), br#"{"dep_delay":1.5}"#);
    b.push_record(
        Some(b"B6"),
        Some(4),
        br#"{"dep_delay":2,"x":[1,{"y":null}]}"#,
    );
    let mut out = Batch::new();
    op.process(&mut ctx, 0, &b, &mut out).unwrap();
    let timers = ctx.fire_due_event_timers(i64::MAX);
    op.on_timers(&mut ctx, &timers, &mut out).unwrap();
    op.on_watermark(&mut ctx, i64::MAX, &mut out).unwrap();
    assert_eq!(
        std::str::from_utf8(out.record(0)).unwrap(),
        r#"{"key":"B6","window_start":0,"window_end":10,"n":2,"flown":2,"total":3.5,"avg":1.75,"lo":1.5,"hi":2}"#
    );
}

#[test]
fn allowed_lateness_updates_fired_windows() {
    let cfg = config(r#"{"kind":"tumbling","size_ms":10,"allowed_lateness_ms":5}"#);
    let recs: Vec<Rec> = vec![
        ("UA".into(), 1, Some(1)),
        ("UA".into(), 2, Some(2)),
        ("UA".into(), 3, Some(4)),
    ];
    // Watermark 9 fires the window; the second record (watermark 9 < 9 + 5) fires it again;
    // watermark 14 cleans it up, so the third record is late.
    let (got, late, _) = run(&cfg, &recs, 1, |i| [9, 14, 20][i]);
    assert_eq!(
        got,
        vec![
            expect("UA", (0, 10), &[Some(1)]),
            expect("UA", (0, 10), &[Some(1), Some(2)])
        ]
    );
    assert_eq!(late.len(), 1);
}

#[test]
fn bad_configs_name_the_field_and_bad_records_are_invalid() {
    let mut ctx = MockContext::for_operator::<WindowAggregate>();
    let task = TaskInfo::for_tests();
    for (cfg, needle) in [
        (config(r#"{"kind":"sliding","size_ms":10}"#), "slide_ms"),
        (config(r#"{"kind":"tumbling","size_ms":0}"#), "size_ms"),
        (config(r#"{"kind":"session","gap_ms":5,"size_ms":3}"#), "size_ms"),
        (config(r#"{"kind":"hopping","size_ms":5}"#), "hopping"),
        (config(r#"{"kind":"tumbling","size_ms":5,"allowed_lateness_ms":-1}"#), "allowed_lateness_ms"),
        (r#"{"window":{"kind":"tumbling","size_ms":5},"aggregates":[{"name":"a","fn":"avg"}]}"#.into(), "aggregates[0]"),
        (r#"{"window":{"kind":"tumbling","size_ms":5},"aggregates":[{"name":"key","fn":"count"}]}"#.into(), "reserved"),
        (r#"{"window":{"kind":"tumbling","size_ms":5},"aggregates":[]}"#.into(), "empty"),
        (r#"{"window":{"kind":"tumbling","size_ms":5}}"#.into(), "aggregates"),
    ] {
        let err = WindowAggregate::open(&mut ctx, &task, &cfg).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert!(err.message.contains(needle), "{needle}: {}", err.message);
    }
    let mut op = WindowAggregate::open(
        &mut ctx,
        &task,
        &config(r#"{"kind":"tumbling","size_ms":5}"#),
    )
    .unwrap();
    let mut b = Batch::new();
    b.push_record(Some(b"AA"), Some(1), br#"{"dep_delay":"late"}"#);
    let err = op.process(&mut ctx, 0, &b, &mut Batch::new()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRecord);
    assert!(
        err.message.contains("record 0") && err.message.contains("dep_delay"),
        "{}",
        err.message
    );
    let mut b = Batch::new();
    b.push_keyed(b"AA", br#"{"dep_delay":1}"#);
    let err = op.process(&mut ctx, 0, &b, &mut Batch::new()).unwrap_err();
    assert!(err.message.contains("timestamp"), "{}", err.message);
    assert_eq!(ctx.state_entry_count(), 0);
    serde_json::from_str::<Value>(CONFIG_SCHEMA).unwrap();
    serde_json::from_str::<Value>(MODEL).unwrap();
    let info = WindowAggregate::describe();
    assert_eq!(info.side_outputs, vec!["late".to_string()]);
    assert_eq!(info.model.as_deref(), Some(MODEL));
    assert!(
        op.model_json()
            .contains(r#""assigner":"tumbling","size_ms":5"#)
    );
}
