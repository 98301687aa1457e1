//! rising-bids on the CEP runtime against the direct form ([`Direct`], the floor's logic)
//! over generated bids.

use std::collections::HashMap;

use nop_stream_sdk::cep::LATE;
use nop_stream_sdk::{Batch, MockContext};

use super::*;

/// Deterministic bids (auction, ts, price), one per `step` ms, `keys` auctions.
fn bids(n: usize, keys: u64, step: i64, prices: u64) -> Vec<(i64, i64, i64)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x >> 33
    };
    (0..n)
        .map(|i| {
            let a = 1000 + (next() % keys) as i64;
            let p = 100 + (next() % prices) as i64;
            (a, 1_700_000_000_000 + i as i64 * step, p)
        })
        .collect()
}

fn record(a: i64, ts: i64, p: i64) -> Vec<u8> {
    let mut v = Vec::with_capacity(38);
    for x in [a, 7, p, ts] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(b"Google");
    v
}

fn direct(bids: &[(i64, i64, i64)]) -> Vec<String> {
    let mut per: HashMap<i64, Direct> = HashMap::new();
    let mut out = Vec::new();
    for &(a, ts, p) in bids {
        if let Some(m) = per.entry(a).or_default().push(ts, p) {
            let mut buf = Vec::new();
            format_match(a, m, &mut buf);
            out.push(String::from_utf8(buf).unwrap());
        }
    }
    out.sort();
    out
}

fn cep(bids: &[(i64, i64, i64)], batch: usize, lag: i64, reopen: bool) -> Vec<String> {
    let task = TaskInfo::for_tests();
    let mut ctx = MockContext::for_operator::<RisingBids>();
    let mut op = RisingBids::open(&mut ctx, &task, "{}").unwrap();
    let mut lines = Vec::new();
    let mut collect = |out: &Batch| {
        for r in out.iter() {
            let s = String::from_utf8(r.data.to_vec()).unwrap();
            let a: i64 = s.split(',').next().unwrap().parse().unwrap();
            assert_eq!(r.key, Some(&a.to_le_bytes()[..]));
            lines.push(s);
        }
    };
    let step = |ctx: &mut MockContext, op: &mut RisingBids, wm: i64| {
        let mut out = Batch::new();
        let timers = ctx.fire_due_event_timers(wm);
        op.on_timers(ctx, &timers, &mut out).unwrap();
        op.on_watermark(ctx, wm, &mut out).unwrap();
        out
    };
    let mut max_ts = i64::MIN;
    for chunk in bids.chunks(batch) {
        let mut b = Batch::new();
        for &(a, ts, p) in chunk {
            b.push_record(Some(&a.to_le_bytes()), Some(ts), &record(a, ts, p));
            max_ts = max_ts.max(ts);
        }
        let mut out = Batch::new();
        op.process(&mut ctx, 0, &b, &mut out).unwrap();
        collect(&out);
        if reopen {
            // Re-open as a restore from a checkpoint would: after prepare_checkpoint.
            let mut out = Batch::new();
            op.prepare_checkpoint(&mut ctx, 0, &mut out).unwrap();
            collect(&out);
            op = RisingBids::open(&mut ctx, &task, "{}").unwrap();
        }
        collect(&step(&mut ctx, &mut op, max_ts - 1 - lag));
    }
    collect(&step(&mut ctx, &mut op, i64::MAX));
    let mut out = Batch::new();
    op.finish(&mut ctx, &mut out).unwrap();
    collect(&out);
    assert!(ctx.take_side_output(LATE).is_empty());
    lines.sort();
    lines
}

#[test]
fn cep_equals_the_direct_scan() {
    // (bids, auctions, ms between bids, price range, batch, watermark lag, reopen)
    for (n, keys, step, prices, batch, lag, reopen) in [
        (20_000, 20, 100, 1_000_000, 256, 0, false),
        (20_000, 200, 7, 5, 1000, 500, true),
        (5_000, 3, 1_500, 3, 17, 0, false),
        (3_000, 1, 2_000, 1_000, 1, 0, true),
    ] {
        let b = bids(n, keys, step, prices);
        let want = direct(&b);
        assert!(want.len() > 10, "too few matches: {}", want.len());
        assert_eq!(
            cep(&b, batch, lag, reopen),
            want,
            "n={n} keys={keys} step={step}"
        );
    }
}

#[test]
fn direct_form_cases() {
    let mut d = Direct::default();
    assert_eq!(d.push(0, 1), None);
    assert_eq!(d.push(1, 2), None);
    assert_eq!(d.push(2, 3), Some([1, 2, 3]));
    // cleared: needs three new bids
    assert_eq!(d.push(3, 4), None);
    assert_eq!(d.push(4, 5), None);
    // too late: 4 -> 5 -> 6 spans 10 000 ms
    assert_eq!(d.push(10_003, 6), None);
    // 5 -> 6 -> 7 spans 4 .. 10_004 = 10 000 ms: no; then 6 -> 7 -> 8 yes
    assert_eq!(d.push(10_004, 7), None);
    assert_eq!(d.push(10_005, 8), Some([6, 7, 8]));
    // equal prices do not rise
    let mut d = Direct::default();
    for (t, p) in [(0, 5), (1, 5), (2, 6)] {
        assert_eq!(d.push(t, p), None);
    }
    assert_eq!(d.push(3, 7), Some([5, 6, 7]));
    let mut buf = Vec::new();
    format_match(1001, [1, 2, 3], &mut buf);
    assert_eq!(buf, b"1001,1,2,3");
    let mut ctx = MockContext::for_operator::<RisingBids>();
    assert!(RisingBids::open(&mut ctx, &TaskInfo::for_tests(), r#"{"x":1}"#).is_err());
}
