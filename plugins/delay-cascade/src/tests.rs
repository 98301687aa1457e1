//! delay-cascade against hand-made cases and an independent naive scan over generated data.

use std::collections::BTreeMap;

use nop_stream_sdk::cep::{LATE, TIMED_OUT};
use nop_stream_sdk::{Batch, ErrorCode, MockContext};

use super::*;

const H: i64 = 60 * 60 * 1000;

/// Late records go to a side output so that the tests can assert there are none.
const CONFIG: &str = r#"{"late":"side_output"}"#;

/// (tailnum, scheduled departure ms, dep_delay minutes or None = cancelled)
type Flight = (String, i64, Option<i64>);

fn record(f: &Flight, n: usize) -> Vec<u8> {
    let delay = f.2.map_or("null".to_string(), |d| d.to_string());
    format!(r#"{{"carrier":"UA","flight":{n},"origin":"EWR","dep_delay":{delay}}}"#).into_bytes()
}

/// Alerts as (tailnum, flight timestamps) sorted, raw output in emission order, number of
/// timed-out partial matches, and the final context.
type Run = (Vec<(String, Vec<i64>)>, Vec<String>, usize, MockContext);

/// Runs the plugin over `flights` (arrival order) in batches of `batch`; the watermark
/// after each batch trails the largest timestamp seen by `lag` ms, then goes to
/// `i64::MAX`. With `restore`, the operator is re-opened on a clone of the context at
/// every call boundary. Returns the alerts (tailnum, flight timestamps), the raw output,
/// the timed-out count and the final context.
fn run(flights: &[Flight], batch: usize, lag: i64, restore: bool) -> Run {
    let mut ctx = MockContext::for_operator::<DelayCascade>();
    let task = TaskInfo::for_tests();
    let mut op = DelayCascade::open(&mut ctx, &task, CONFIG).unwrap();
    let mut raw = Vec::new();
    let mut max_ts = i64::MIN;
    let mut n = 0;
    let collect = |out: &Batch, raw: &mut Vec<String>| {
        for r in out.iter() {
            let v: serde_json::Value = serde_json::from_slice(r.data).unwrap();
            assert_eq!(r.key.unwrap(), v["tailnum"].as_str().unwrap().as_bytes());
            assert_eq!(r.timestamp, v["last_ts"].as_i64());
            raw.push(String::from_utf8(r.data.to_vec()).unwrap());
        }
    };
    // A restore starts from a checkpoint, and a checkpoint first runs
    // `prepare_checkpoint`, which writes the CEP runtime's cached keys back.
    let reopen = |ctx: &mut MockContext, op: &mut DelayCascade, raw: &mut Vec<String>| {
        if restore {
            let mut out = Batch::new();
            op.prepare_checkpoint(ctx, 0, &mut out).unwrap();
            collect(&out, raw);
            let mut fresh = ctx.clone();
            *op = DelayCascade::open(&mut fresh, &task, CONFIG).unwrap();
            *ctx = fresh;
        }
    };
    let wm_step = |ctx: &mut MockContext, op: &mut DelayCascade, wm: i64, raw: &mut Vec<String>| {
        let mut out = Batch::new();
        let timers = ctx.fire_due_event_timers(wm);
        op.on_timers(ctx, &timers, &mut out).unwrap();
        op.on_watermark(ctx, wm, &mut out).unwrap();
        collect(&out, raw);
    };
    for chunk in flights.chunks(batch) {
        let mut input = Batch::new();
        for f in chunk {
            n += 1;
            input.push_record(Some(f.0.as_bytes()), Some(f.1), &record(f, n));
            max_ts = max_ts.max(f.1);
        }
        let mut out = Batch::new();
        op.process(&mut ctx, 0, &input, &mut out).unwrap();
        reopen(&mut ctx, &mut op, &mut raw);
        wm_step(&mut ctx, &mut op, max_ts - lag, &mut raw);
        reopen(&mut ctx, &mut op, &mut raw);
    }
    wm_step(&mut ctx, &mut op, i64::MAX, &mut raw);
    let mut out = Batch::new();
    op.finish(&mut ctx, &mut out).unwrap();
    assert!(out.is_empty());
    assert!(ctx.take_side_output(LATE).is_empty());
    let timed_out = ctx.take_side_output(TIMED_OUT).len();
    let mut alerts: Vec<(String, Vec<i64>)> = raw
        .iter()
        .map(|s| {
            let v: serde_json::Value = serde_json::from_str(s).unwrap();
            let ts = v["flights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["ts"].as_i64().unwrap())
                .collect();
            (v["tailnum"].as_str().unwrap().to_string(), ts)
        })
        .collect();
    alerts.sort();
    (alerts, raw, timed_out, ctx)
}

/// The independent reference: per tailnum, departures in time order (ties in arrival
/// order), scan left to right for three consecutive delayed (> 60 min, not cancelled)
/// departures with last − first < 24 h; after an alert continue after its third flight.
fn naive(flights: &[Flight]) -> Vec<(String, Vec<i64>)> {
    let mut per: BTreeMap<&str, Vec<&Flight>> = BTreeMap::new();
    for f in flights {
        per.entry(f.0.as_str()).or_default().push(f);
    }
    let mut alerts = Vec::new();
    for (tail, mut fs) in per {
        fs.sort_by_key(|f| f.1); // stable: ties keep arrival order
        let late = |f: &Flight| matches!(f.2, Some(d) if d > 60);
        let mut i = 0;
        while i + 2 < fs.len() {
            let (a, b, c) = (fs[i], fs[i + 1], fs[i + 2]);
            if late(a) && late(b) && late(c) && c.1 - a.1 < 24 * H {
                alerts.push((tail.to_string(), vec![a.1, b.1, c.1]));
                i += 3;
            } else {
                i += 1;
            }
        }
    }
    alerts.sort();
    alerts
}

fn f(tail: &str, ts: i64, delay: Option<i64>) -> Flight {
    (tail.to_string(), ts, delay)
}

#[test]
fn one_alert_with_fields_in_order() {
    let flights = vec![
        f("N1", 0, Some(61)),
        f("N1", 2 * H, Some(90)),
        f("N1", 5 * H, Some(120)),
    ];
    let (_, raw, timed_out, ctx) = run(&flights, 10, 0, false);
    assert_eq!(
        raw,
        vec![format!(
            concat!(
                r#"{{"tailnum":"N1","first_ts":0,"last_ts":{},"flights":["#,
                r#"{{"ts":0,"carrier":"UA","flight":1,"origin":"EWR","dep_delay":61}},"#,
                r#"{{"ts":{},"carrier":"UA","flight":2,"origin":"EWR","dep_delay":90}},"#,
                r#"{{"ts":{},"carrier":"UA","flight":3,"origin":"EWR","dep_delay":120}}]}}"#
            ),
            5 * H,
            2 * H,
            5 * H
        )]
    );
    assert_eq!(timed_out, 0);
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

#[test]
fn sixty_minutes_cancellations_and_the_24h_boundary() {
    // Exactly 60 is not "more than 60".
    let (a, ..) = run(
        &[
            f("N", 0, Some(61)),
            f("N", H, Some(60)),
            f("N", 2 * H, Some(61)),
            f("N", 3 * H, Some(61)),
        ],
        1,
        0,
        false,
    );
    assert!(a.is_empty());
    // A cancelled flight between delayed ones breaks the chain.
    let (a, ..) = run(
        &[
            f("N", 0, Some(99)),
            f("N", H, None),
            f("N", 2 * H, Some(99)),
            f("N", 3 * H, Some(99)),
        ],
        1,
        0,
        false,
    );
    assert!(a.is_empty());
    // Third departure exactly 24 h after the first: outside; 1 ms earlier: inside.
    let (a, _, timed_out, _) = run(
        &[
            f("N", 0, Some(99)),
            f("N", H, Some(99)),
            f("N", 24 * H, Some(99)),
        ],
        1,
        0,
        false,
    );
    assert!(a.is_empty());
    assert!(timed_out > 0);
    let (a, ..) = run(
        &[
            f("N", 0, Some(99)),
            f("N", H, Some(99)),
            f("N", 24 * H - 1, Some(99)),
        ],
        1,
        0,
        false,
    );
    assert_eq!(a, vec![("N".to_string(), vec![0, H, 24 * H - 1])]);
    // Four in a row: one alert (skip past last event), not two overlapping ones.
    let four: Vec<Flight> = (0..4).map(|i| f("N", i * H, Some(70))).collect();
    let (a, ..) = run(&four, 1, 0, false);
    assert_eq!(a, vec![("N".to_string(), vec![0, H, 2 * H])]);
    // Other aircraft do not interleave into a chain.
    let mixed = vec![
        f("A", 0, Some(99)),
        f("B", H, Some(5)),
        f("A", 2 * H, Some(99)),
        f("A", 3 * H, Some(99)),
    ];
    let (a, ..) = run(&mixed, 2, 0, false);
    assert_eq!(a, vec![("A".to_string(), vec![0, 2 * H, 3 * H])]);
}

#[test]
fn empty_tailnum_is_ignored_and_bad_records_are_errors() {
    let mut ctx = MockContext::for_operator::<DelayCascade>();
    let mut op = DelayCascade::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap();
    let mut b = Batch::new();
    b.push_record(Some(b""), Some(1), br#"{"dep_delay":99}"#);
    op.process(&mut ctx, 0, &b, &mut Batch::new()).unwrap();
    assert_eq!(ctx.state_entry_count(), 0);
    for payload in [&br#"{"carrier":"UA"}"#[..], br#"{"dep_delay":1.5}"#, b"[1]"] {
        let mut b = Batch::new();
        b.push_record(Some(b"N1"), Some(1), payload);
        let e = op.process(&mut ctx, 0, &b, &mut Batch::new()).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRecord, "{e}");
    }
    let e = DelayCascade::open(&mut ctx, &TaskInfo::for_tests(), r#"{"late":"keep"}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    let info = DelayCascade::describe();
    let model = info.model.unwrap();
    assert!(model.contains(r#""within_ms":86400000"#), "{model}");
    assert!(model.contains("skip_past_last_event"), "{model}");
    assert!(info.side_outputs.contains(&"timed-out".to_string()));
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Departures of 25 aircraft: gaps of 0–14 h (sometimes 20–40 h, sometimes 0: equal
/// times), delays mostly late (> 60) with some exactly 60 and some cancellations.
fn generate(seed: u64) -> Vec<Flight> {
    let mut rng = Rng(seed);
    let mut t = [1_356_998_400_000i64; 25]; // 2013-01-01T00:00Z
    let mut out = Vec::new();
    for _ in 0..3000 {
        let a = rng.below(25) as usize;
        t[a] += match rng.below(10) {
            0 => 0,
            1 => (20 + rng.below(21) as i64) * H,
            _ => rng.below(14 * 60) as i64 * 60_000,
        };
        let delay = match rng.below(10) {
            0 => None,
            1 => Some(60),
            2..=6 => Some(61 + rng.below(200) as i64),
            _ => Some(rng.below(61) as i64 - 10),
        };
        out.push(f(&format!("N{a:03}"), t[a], delay));
    }
    out
}

#[test]
fn matches_a_naive_scan_over_generated_departures() {
    for seed in [1u64, 77, 2013] {
        let flights = generate(seed);
        let want = naive(&flights);
        assert!(want.len() > 20, "seed {seed}: only {} alerts", want.len());
        // Sorted arrival and small batches; lag 1 keeps equal timestamps split across
        // batches on time.
        let mut sorted = flights.clone();
        sorted.sort_by_key(|f| f.1);
        let (got, _, _, ctx) = run(&sorted, 17, 1, false);
        assert_eq!(got, want, "seed {seed}");
        assert_eq!(ctx.state_entry_count(), 0);
        assert!(ctx.registered_timers().is_empty());
        // Generation order is out of order across aircraft: watermark lag covers it.
        let mut seen = i64::MIN;
        let mut lag = 0;
        for f in &flights {
            seen = seen.max(f.1);
            lag = lag.max(seen - f.1 + 1);
        }
        let (got, _, _, ctx) = run(&flights, 64, lag, false);
        assert_eq!(got, want, "seed {seed} out of order");
        assert_eq!(ctx.state_entry_count(), 0);
    }
}

#[test]
fn restore_at_every_boundary_gives_the_same_alerts() {
    let flights = generate(5);
    let mut seen = i64::MIN;
    let mut lag = 0;
    for f in &flights {
        seen = seen.max(f.1);
        lag = lag.max(seen - f.1 + 1);
    }
    let (want, want_raw, want_to, _) = run(&flights[..1200], 40, lag, false);
    let (got, got_raw, got_to, ctx) = run(&flights[..1200], 40, lag, true);
    assert_eq!(got_raw, want_raw);
    assert_eq!(got, want);
    assert_eq!(got_to, want_to);
    assert_eq!(want, naive(&flights[..1200]));
    assert_eq!(ctx.state_entry_count(), 0);
}
