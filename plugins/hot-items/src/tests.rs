//! hot-items (after window-count) against a direct computation over generated bids.

use std::collections::{BTreeMap, HashMap};

use nop_stream_sdk::MockContext;
use window_count::WindowCountOp;

use super::*;

const SIZE: i64 = 10_000;
const SLIDE: i64 = 2_000;

/// Deterministic bids (auction, ts): one per ms from `t0`, `keys` auctions, LCG-drawn.
fn bids(n: usize, keys: u64, t0: i64) -> Vec<(i64, i64)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (1000 + ((x >> 33) % keys) as i64, t0 + i as i64)
        })
        .collect()
}

/// The reference: counts per (window start, auction) over every sliding window a bid
/// falls in; per window the largest count, ties to the smallest auction; text lines.
fn direct(bids: &[(i64, i64)]) -> Vec<String> {
    let mut counts: HashMap<(i64, i64), u64> = HashMap::new();
    for &(a, ts) in bids {
        let mut s = ts - ts.rem_euclid(SLIDE);
        while s > ts - SIZE {
            *counts.entry((s, a)).or_default() += 1;
            s -= SLIDE;
        }
    }
    let mut top: BTreeMap<i64, (u64, i64)> = BTreeMap::new();
    for ((s, a), c) in counts {
        let e = top.entry(s).or_insert((c, a));
        if c > e.0 || (c == e.0 && a < e.1) {
            *e = (c, a);
        }
    }
    let mut lines: Vec<String> = top
        .into_iter()
        .map(|(s, (c, a))| format!("{s},{},{a},{c}", s + SIZE))
        .collect();
    lines.sort();
    lines
}

/// window-count (sliding 10 s / 2 s) then hot-items, each on its own MockContext, in
/// batches of `batch` with the watermark at the largest timestamp seen minus one; the
/// window results reach hot-items before the watermark that fired them (as the runtime
/// forwards them). Fresh instances after every call when `reopen`.
fn pipeline(bids: &[(i64, i64)], batch: usize, reopen: bool) -> Vec<String> {
    let task = TaskInfo::for_tests();
    let wc_cfg =
        format!(r#"{{"window":{{"kind":"sliding","size_ms":{SIZE},"slide_ms":{SLIDE}}}}}"#);
    let hi_cfg = format!(r#"{{"slide_ms":{SLIDE}}}"#);
    let mut c1 = MockContext::for_operator::<WindowCountOp>();
    let mut c2 = MockContext::for_operator::<HotItems>();
    let mut wc = WindowCountOp::open(&mut c1, &task, &wc_cfg).unwrap();
    let mut hi = HotItems::open(&mut c2, &task, &hi_cfg).unwrap();
    let mut lines = Vec::new();
    let mut step = |wc: &mut WindowCountOp,
                    hi: &mut HotItems,
                    c1: &mut MockContext,
                    c2: &mut MockContext,
                    input: Option<Batch>,
                    wm: i64| {
        let mut mid = Batch::new();
        if let Some(b) = input {
            wc.process(c1, 0, &b, &mut mid).unwrap();
        }
        let t = c1.fire_due_event_timers(wm);
        wc.on_timers(c1, &t, &mut mid).unwrap();
        wc.on_watermark(c1, wm, &mut mid).unwrap();
        let mut out = Batch::new();
        hi.process(c2, 0, &mid, &mut out).unwrap();
        let t = c2.fire_due_event_timers(wm);
        hi.on_timers(c2, &t, &mut out).unwrap();
        hi.on_watermark(c2, wm, &mut out).unwrap();
        assert!(c1.take_side_output(LATE_OUTPUT).is_empty());
        assert!(c2.take_side_output(LATE_OUTPUT).is_empty());
        for r in out.iter() {
            let text = String::from_utf8(r.data.to_vec()).unwrap();
            let end: i64 = text.split(',').nth(1).unwrap().parse().unwrap();
            assert_eq!(r.timestamp, Some(end - 1));
            lines.push(text);
        }
    };
    let mut max_ts = i64::MIN;
    for chunk in bids.chunks(batch) {
        let mut b = Batch::new();
        for &(a, ts) in chunk {
            b.push_record(Some(&a.to_le_bytes()), Some(ts), &[0u8; 37]);
            max_ts = max_ts.max(ts);
        }
        step(&mut wc, &mut hi, &mut c1, &mut c2, Some(b), max_ts - 1);
        if reopen {
            // A checkpoint, then fresh instances on its state.
            let mut none = Batch::new();
            wc.prepare_checkpoint(&mut c1, 0, &mut none).unwrap();
            hi.prepare_checkpoint(&mut c2, 0, &mut none).unwrap();
            assert!(none.is_empty());
            wc = WindowCountOp::open(&mut c1, &task, &wc_cfg).unwrap();
            hi = HotItems::open(&mut c2, &task, &hi_cfg).unwrap();
        }
    }
    step(&mut wc, &mut hi, &mut c1, &mut c2, None, i64::MAX);
    lines.sort();
    lines
}

#[test]
fn top_per_window_equals_the_direct_computation() {
    let t0 = 1_700_000_000_000;
    for (n, keys, batch) in [(30_000, 50, 1024), (25_000, 2000, 333), (5_000, 3, 1)] {
        let b = bids(n, keys, t0);
        let want = direct(&b);
        assert!(want.len() > 2, "{n}");
        assert_eq!(pipeline(&b, batch, batch == 333), want, "n={n} keys={keys}");
    }
}

#[test]
fn ties_go_to_the_smallest_auction() {
    let mut acc = None;
    let c = |count, auction| Candidate {
        count,
        auction,
        start: 0,
        end: 10,
    };
    for x in [c(3, 20), c(5, 30), c(5, 10), c(5, 11), c(4, 1)] {
        offer(&mut acc, x);
    }
    assert_eq!(acc, Some(c(5, 10)));
    let mut buf = Vec::new();
    format_top(&c(5, 10), &mut buf);
    assert_eq!(buf, b"0,10,10,5");
    assert!(decode_candidate(&[0; 31]).is_err());
    let mut ctx = MockContext::for_operator::<HotItems>();
    assert!(HotItems::open(&mut ctx, &TaskInfo::for_tests(), "{}").is_err());
    assert!(HotItems::open(&mut ctx, &TaskInfo::for_tests(), r#"{"slide_ms":0}"#).is_err());
}
