//! Native tests of the window operator against independently computed expectations.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::{Batch, Context, ErrorCode, MockContext, PluginInfo, RecordRef, Result};

/// Count and sum of decimal `i64` payloads.
#[derive(Debug, Clone, Copy)]
struct SumCount;

fn parse_i64(r: RecordRef<'_>) -> Result<i64> {
    std::str::from_utf8(r.data)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| crate::PluginError::invalid_record("payload is not a decimal i64"))
}

impl AggregateFunction for SumCount {
    type In = i64;
    type Acc = (u64, i64);
    type Out = (u64, i64);
    fn decode(&self, r: RecordRef<'_>) -> Result<i64> {
        parse_i64(r)
    }
    fn create_accumulator(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), v: &i64) {
        acc.0 += 1;
        acc.1 += v;
    }
    fn merge(&self, acc: &mut (u64, i64), o: (u64, i64)) {
        acc.0 += o.0;
        acc.1 += o.1;
    }
    fn get_result(&self, acc: (u64, i64)) -> (u64, i64) {
        acc
    }
}

/// Emits `start,end,count,sum`.
#[derive(Debug, Clone, Copy)]
struct Describe;

impl ProcessWindowFunction<(u64, i64)> for Describe {
    fn process(
        &self,
        _key: &[u8],
        w: Window,
        elements: &[(u64, i64)],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for (c, s) in elements {
            out.emit(format!("{},{},{c},{s}", w.start, w.end).as_bytes());
        }
        Ok(())
    }
}

/// Emits `start,end,<sorted payloads joined by ';'>`.
#[derive(Debug, Clone, Copy)]
struct ListAll;

impl ProcessWindowFunction<Vec<u8>> for ListAll {
    fn process(
        &self,
        _key: &[u8],
        w: Window,
        elements: &[Vec<u8>],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        let mut v: Vec<i64> = elements
            .iter()
            .map(|e| std::str::from_utf8(e).unwrap().parse().unwrap())
            .collect();
        v.sort_unstable();
        let joined: Vec<String> = v.iter().map(i64::to_string).collect();
        out.emit(format!("{},{},{}", w.start, w.end, joined.join(";")).as_bytes());
        Ok(())
    }
}

/// Max of decimal payloads, emitted as decimal text.
#[derive(Debug, Clone, Copy)]
struct MaxText;

impl ReduceFunction for MaxText {
    type Value = i64;
    fn decode(&self, r: RecordRef<'_>) -> Result<i64> {
        parse_i64(r)
    }
    fn reduce(&self, a: i64, b: i64) -> i64 {
        a.max(b)
    }
}

#[derive(Debug, Clone, Copy)]
struct EmitMax;

impl ProcessWindowFunction<i64> for EmitMax {
    fn process(&self, _: &[u8], w: Window, e: &[i64], out: &mut WindowOutput<'_>) -> Result<()> {
        out.emit(format!("{},{},max={}", w.start, w.end, e[0]).as_bytes());
        Ok(())
    }
}

type Out = (String, i64, String); // (key, timestamp, payload)
type Rec = (String, i64, i64); // (key, timestamp, value)
type Results = BTreeMap<(String, Window), (u64, i64)>;

fn info(kind: FunctionKind) -> PluginInfo {
    let mut info = PluginInfo::operator("w", "0.1.0").side_output(LATE_OUTPUT);
    for d in state_descriptors(kind, 1) {
        info = info.state(d);
    }
    info
}

fn collect(b: &Batch, into: &mut Vec<Out>) {
    for r in b.iter() {
        into.push((
            String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
            r.timestamp.unwrap(),
            String::from_utf8(r.data.to_vec()).unwrap(),
        ));
    }
}

/// Drives an operator like the host: batches, and on watermark advance the due
/// event-time timers first.
struct Harness<F: WindowFunction> {
    ctx: MockContext,
    op: WindowOperator<F>,
    make: fn(&mut MockContext) -> WindowOperator<F>,
    out: Vec<Out>,
}

impl<F: WindowFunction> Harness<F> {
    fn new(kind: FunctionKind, make: fn(&mut MockContext) -> WindowOperator<F>) -> Self {
        let mut ctx = MockContext::new(&info(kind));
        let op = make(&mut ctx);
        Harness {
            ctx,
            op,
            make,
            out: Vec::new(),
        }
    }

    fn batch(recs: &[(&str, i64, i64)]) -> Batch {
        let mut b = Batch::new();
        for (k, ts, v) in recs {
            b.push_record(Some(k.as_bytes()), Some(*ts), v.to_string().as_bytes());
        }
        b
    }

    fn feed(&mut self, recs: &[(&str, i64, i64)]) {
        let mut out = Batch::new();
        self.op
            .process(&mut self.ctx, &Self::batch(recs), &mut out)
            .unwrap();
        collect(&out, &mut self.out);
    }

    fn watermark(&mut self, wm: i64) {
        let timers = self.ctx.fire_due_event_timers(wm);
        let mut out = Batch::new();
        self.op.on_timers(&mut self.ctx, &timers, &mut out).unwrap();
        self.op.on_watermark(&mut self.ctx, wm, &mut out).unwrap();
        collect(&out, &mut self.out);
    }

    /// `prepare_checkpoint`: writes the accumulator cache back.
    fn flush(&mut self) {
        let mut out = Batch::new();
        self.op.flush(&mut self.ctx, &mut out).unwrap();
        assert!(out.is_empty(), "a flush emits nothing");
    }

    /// A checkpoint, then the instance dropped and a fresh one opened on a copy of the
    /// durable state.
    fn restore(&mut self) {
        self.flush();
        self.ctx = self.ctx.clone();
        self.op = (self.make)(&mut self.ctx);
    }

    fn late(&mut self) -> Vec<(String, i64, String)> {
        let mut v = Vec::new();
        collect(&self.ctx.take_side_output(LATE_OUTPUT), &mut v);
        v
    }

    /// The same number of stored state items and the same registered timers as `other`.
    fn assert_same_state_as(&self, other: &Self) {
        assert_eq!(self.ctx.state_entry_count(), other.ctx.state_entry_count());
        assert_eq!(self.ctx.registered_timers(), other.ctx.registered_timers());
    }

    fn assert_clean(&self) {
        assert_eq!(self.ctx.state_entry_count(), 0, "state left behind");
        assert!(
            self.ctx.registered_timers().is_empty(),
            "timers left: {:?}",
            self.ctx.registered_timers()
        );
    }
}

fn agg_op(
    spec: WindowSpec,
) -> impl Fn(&mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    move |ctx| {
        WindowOperator::open(ctx, spec, Aggregating::with_process(SumCount, Describe)).unwrap()
    }
}

const SLIDING: WindowSpec = WindowSpec::sliding(10, 4);
const TUMBLING: WindowSpec = WindowSpec::tumbling(10);
const SESSION: WindowSpec = WindowSpec::session(10);

fn sliding_op(ctx: &mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    agg_op(SLIDING)(ctx)
}
fn tumbling_op(ctx: &mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    agg_op(TUMBLING)(ctx)
}
fn session_op(ctx: &mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    agg_op(SESSION)(ctx)
}
fn cached_sliding_op(ctx: &mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    let op = agg_op(SLIDING)(ctx).cached();
    assert!(op.is_cached());
    op
}
fn cached_tumbling_op(ctx: &mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>> {
    let op = agg_op(TUMBLING)(ctx).cached();
    assert!(op.is_cached());
    op
}

/// A deterministic pseudo-random sequence (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
}

/// Random records (key, ts, value) in arrival order, timestamps up to `jitter` out of
/// order.
fn random_records(seed: u64, n: usize, keys: u64, jitter: u64) -> Vec<(String, i64, i64)> {
    let mut rng = Rng(seed | 1);
    (0..n)
        .map(|i| {
            let ts = i as i64 * 3 + rng.below(jitter) - 50;
            (format!("k{}", rng.below(keys)), ts, rng.below(1000) - 500)
        })
        .collect()
}

/// Expected output of an aggregating window with zero lateness: a record counts in
/// window `w` iff `w` had not fired (max_ts > watermark) when it arrived; a record that
/// counts nowhere is late.
fn reference_fixed(
    spec: &WindowSpec,
    arrivals: &[((String, i64, i64), i64)], // (record, watermark at arrival)
) -> (Results, Vec<Rec>) {
    let mut want = BTreeMap::new();
    let mut late = Vec::new();
    for ((k, ts, v), wm) in arrivals {
        let mut hit = false;
        // Enumerate windows by brute force over candidate starts.
        let (size, slide) = match spec.assigner {
            Assigner::Tumbling { size, .. } => (size, size),
            Assigner::Sliding { size, slide, .. } => (size, slide),
            Assigner::Session { .. } => unreachable!(),
        };
        let mut start = (ts.div_euclid(slide) - size / slide - 1) * slide;
        while start <= *ts {
            let w = Window::new(start, start + size);
            if w.start <= *ts && *ts < w.end && w.max_timestamp() > *wm {
                hit = true;
                let e = want.entry((k.clone(), w)).or_insert((0, 0));
                e.0 += 1;
                e.1 += v;
            }
            start += slide;
        }
        if !hit {
            late.push((k.clone(), *ts, *v));
        }
    }
    (want, late)
}

fn parse_outputs(out: &[Out]) -> BTreeMap<(String, Window), (u64, i64)> {
    let mut got = BTreeMap::new();
    for (k, ts, p) in out {
        let f: Vec<i64> = p.split(',').map(|x| x.parse().unwrap()).collect();
        let w = Window::new(f[0], f[1]);
        assert_eq!(*ts, w.max_timestamp(), "result timestamp is the window max");
        let prev = got.insert((k.clone(), w), (f[2] as u64, f[3]));
        assert!(prev.is_none(), "window {k} {w:?} fired twice");
    }
    got
}

/// What [`run_fixed`] does at every batch boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Boundary {
    /// Nothing.
    Keep,
    /// A checkpoint (the accumulator cache written back) after the watermark, same
    /// instance: the next watermark fires windows whose keys are partly in state.
    Checkpoint,
    /// A checkpoint and a fresh instance on a copy of the state, after the watermark.
    Restore,
    /// The same before and after the watermark: windows then fire from state alone.
    RestoreAround,
}

/// Runs records in batches of `batch`, with the watermark after each batch at
/// `max ts seen - lag`, doing `boundary` at every batch boundary.
fn run_fixed(
    make: fn(&mut MockContext) -> WindowOperator<Aggregating<SumCount, Describe>>,
    recs: &[(String, i64, i64)],
    batch: usize,
    lag: i64,
    boundary: Boundary,
) -> (Vec<Out>, Vec<Out>, Vec<(Rec, i64)>) {
    let mut h = Harness::new(FunctionKind::Aggregate, make);
    let mut arrivals = Vec::new();
    let mut late = Vec::new();
    let mut max_ts = i64::MIN;
    for chunk in recs.chunks(batch) {
        let wm = h.ctx.current_watermark();
        let refs: Vec<(&str, i64, i64)> =
            chunk.iter().map(|(k, t, v)| (k.as_str(), *t, *v)).collect();
        h.feed(&refs);
        late.extend(h.late());
        arrivals.extend(chunk.iter().map(|r| (r.clone(), wm)));
        max_ts = chunk.iter().map(|r| r.1).fold(max_ts, i64::max);
        if boundary == Boundary::RestoreAround {
            h.restore();
        }
        h.watermark(max_ts.saturating_sub(lag));
        match boundary {
            Boundary::Keep => {}
            Boundary::Checkpoint => h.flush(),
            Boundary::Restore | Boundary::RestoreAround => h.restore(),
        }
    }
    h.watermark(i64::MAX);
    h.assert_clean();
    (h.out, late, arrivals)
}

#[test]
fn tumbling_and_sliding_match_a_naive_reference_with_out_of_order_and_late_data() {
    for (make, spec) in [
        (tumbling_op as fn(&mut MockContext) -> _, TUMBLING),
        (sliding_op, SLIDING),
        (cached_tumbling_op, TUMBLING),
        (cached_sliding_op, SLIDING),
    ] {
        for (seed, batch, lag) in [(1, 7, 20), (2, 50, 5), (3, 1, 40), (4, 13, 0)] {
            let recs = random_records(seed, 400, 5, 60);
            let (out, late, arrivals) = run_fixed(make, &recs, batch, lag, Boundary::Keep);
            let (want, want_late) = reference_fixed(&spec, &arrivals);
            let got = parse_outputs(&out);
            let diff: Vec<_> = got
                .iter()
                .filter(|(k, v)| want.get(*k) != Some(*v))
                .chain(want.iter().filter(|(k, _)| !got.contains_key(*k)))
                .take(5)
                .map(|(k, v)| (k.clone(), *v, want.get(k).copied(), got.get(k).copied()))
                .collect();
            assert!(diff.is_empty(), "{spec:?} seed {seed}: {diff:?}");
            let late: Vec<(String, i64, i64)> = late
                .into_iter()
                .map(|(k, ts, p)| (k, ts, p.parse().unwrap()))
                .collect();
            assert_eq!(late, want_late, "{spec:?} seed {seed}");
            if lag < 20 {
                assert!(!late.is_empty(), "the test should produce late data");
            }
        }
    }
}

#[test]
fn sliding_window_restored_at_every_boundary_equals_the_uninterrupted_run() {
    let recs = random_records(42, 600, 7, 80);
    let (straight, late_a, _) = run_fixed(sliding_op, &recs, 17, 30, Boundary::Keep);
    let (restored, late_b, _) = run_fixed(sliding_op, &recs, 17, 30, Boundary::RestoreAround);
    assert!(straight.len() > 100);
    assert_eq!(straight, restored);
    assert_eq!(late_a, late_b);
}

/// The accumulator cache gives the uncached operator's output, in its order, whether it
/// is written back at every boundary (windows then fire from stored and cached
/// accumulators merged), restored from at every boundary (before the watermark too:
/// windows then fire from state alone), or never written back; and after the last
/// firing no state or timer is left.
#[test]
fn cached_windows_equal_the_uncached_operator_across_checkpoints_and_restores() {
    for (plain, cached) in [
        (
            sliding_op as fn(&mut MockContext) -> _,
            cached_sliding_op as fn(&mut MockContext) -> _,
        ),
        (tumbling_op, cached_tumbling_op),
    ] {
        for (seed, batch, lag) in [(42, 17, 30), (7, 3, 0), (9, 64, 100)] {
            let recs = random_records(seed, 600, 7, 80);
            let (want, want_late, _) = run_fixed(plain, &recs, batch, lag, Boundary::Keep);
            assert!(want.len() > 100);
            for boundary in [
                Boundary::Keep,
                Boundary::Checkpoint,
                Boundary::Restore,
                Boundary::RestoreAround,
            ] {
                let (got, late, _) = run_fixed(cached, &recs, batch, lag, boundary);
                assert_eq!(got, want, "seed {seed} batch {batch} {boundary:?}");
                assert_eq!(late, want_late, "seed {seed} batch {batch} {boundary:?}");
            }
        }
    }
}

/// Between checkpoints the cache touches neither state nor timers; a checkpoint leaves
/// exactly the uncached operator's state and timers.
#[test]
fn a_checkpoint_writes_the_cache_as_the_uncached_operator_would_have() {
    let recs = [
        ("a", 3, 1),
        ("b", 12, 5),
        ("a", 9, 2),
        ("a", 10, 4),
        ("c", 7, 1),
    ];
    let mut plain = Harness::new(FunctionKind::Aggregate, sliding_op);
    let mut cached = Harness::new(FunctionKind::Aggregate, cached_sliding_op);
    plain.feed(&recs);
    cached.feed(&recs);
    assert_eq!(cached.ctx.state_entry_count(), 0);
    assert!(cached.ctx.registered_timers().is_empty());
    cached.flush();
    assert!(plain.ctx.state_entry_count() > 5);
    cached.assert_same_state_as(&plain);
    // More records for the same windows, a second checkpoint: accumulators merge.
    cached.feed(&recs);
    plain.feed(&recs);
    cached.flush();
    assert_eq!(
        cached.ctx.registered_timers(),
        plain.ctx.registered_timers()
    );
    // And more, not written back: windows fire from stored and cached accumulators.
    cached.feed(&recs[1..]);
    plain.feed(&recs[1..]);
    for h in [&mut plain, &mut cached] {
        h.watermark(i64::MAX);
        h.assert_clean();
    }
    assert_eq!(cached.out, plain.out);
}

#[test]
fn a_large_cached_window_is_written_back_in_chunks_as_the_uncached_operator_would_have() {
    // More keys in one window than one state call may carry: the write-back goes in calls
    // of STATE_WRITE_CHUNK keys (a state memory budget applies between them), and a second
    // checkpoint merges each key's stored accumulator with its own cached delta, chunk by
    // chunk, so the fired results equal the uncached operator's.
    let n = 3 * crate::STATE_WRITE_CHUNK + 5;
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let recs = |v: i64| -> Vec<(&str, i64, i64)> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| (k.as_str(), 1 + (i % 7) as i64, v + i as i64))
            .collect()
    };
    let mut plain = Harness::new(FunctionKind::Aggregate, tumbling_op);
    let mut cached = Harness::new(FunctionKind::Aggregate, cached_tumbling_op);
    for v in [1, 1000] {
        plain.feed(&recs(v));
        cached.feed(&recs(v));
        cached.flush();
        cached.assert_same_state_as(&plain);
    }
    assert_eq!(cached.ctx.largest_put_many(), crate::STATE_WRITE_CHUNK);
    for h in [&mut plain, &mut cached] {
        h.watermark(i64::MAX);
        h.assert_clean();
    }
    assert_eq!(cached.out.len(), n);
    assert_eq!(cached.out, plain.out);
}

#[test]
fn the_cache_is_off_where_it_does_not_apply() {
    let off = |spec: WindowSpec| {
        let mut ctx = MockContext::new(&info(FunctionKind::Aggregate));
        !agg_op(spec)(&mut ctx).cached().is_cached()
    };
    assert!(off(SESSION));
    assert!(off(TUMBLING.allowed_lateness(5)));
    assert!(off(TUMBLING.processing_time()));
    let mut ctx = MockContext::new(&info(FunctionKind::Process));
    let op = WindowOperator::open(&mut ctx, TUMBLING, Processing::new(EmitResult)).unwrap();
    assert!(!op.cached().is_cached());
    // A TTL on the accumulators keeps it off; on another state it does not.
    let mut ctx =
        MockContext::new(&info(FunctionKind::Aggregate)).with_state_ttl(ACC_STATE, 60_000);
    assert!(!agg_op(TUMBLING)(&mut ctx).cached().is_cached());
    let mut ctx = MockContext::new(&info(FunctionKind::Aggregate));
    assert!(agg_op(TUMBLING)(&mut ctx).cached().is_cached());
}

#[test]
fn tumbling_fires_at_window_end_with_key_and_max_timestamp() {
    let mut h = Harness::new(FunctionKind::Aggregate, tumbling_op);
    h.feed(&[("a", 3, 1), ("b", 12, 5), ("a", 9, 2), ("a", 10, 4)]);
    h.watermark(8);
    assert!(h.out.is_empty());
    h.watermark(9);
    assert_eq!(h.out, vec![("a".into(), 9, "0,10,2,3".into())]);
    h.watermark(i64::MAX);
    assert_eq!(
        h.out[1..],
        [
            ("a".into(), 19, "10,20,1,4".into()),
            ("b".into(), 19, "10,20,1,5".into())
        ]
    );
    h.assert_clean();
}

#[test]
fn late_records_go_unchanged_to_the_side_output() {
    let mut h = Harness::new(FunctionKind::Aggregate, tumbling_op);
    h.feed(&[("a", 5, 1)]);
    h.watermark(9);
    h.feed(&[("a", 7, 2), ("a", 12, 3), ("b", 0, 4)]);
    assert_eq!(
        h.late(),
        vec![("a".into(), 7, "2".into()), ("b".into(), 0, "4".into())]
    );
    h.watermark(i64::MAX);
    assert_eq!(
        h.out,
        vec![
            ("a".into(), 9, "0,10,1,1".into()),
            ("a".into(), 19, "10,20,1,3".into())
        ]
    );
    h.assert_clean();
}

#[test]
fn allowed_lateness_fires_again_and_cleans_up() {
    let make: fn(&mut MockContext) -> _ =
        |ctx| agg_op(WindowSpec::tumbling(10).allowed_lateness(5))(ctx);
    let mut h = Harness::new(FunctionKind::Aggregate, make);
    h.feed(&[("a", 5, 1)]);
    h.watermark(9);
    assert_eq!(h.out, vec![("a".into(), 9, "0,10,1,1".into())]);
    // Still within lateness: updates the window and fires it again at once.
    h.feed(&[("a", 7, 2)]);
    assert_eq!(h.out[1], ("a".into(), 9, "0,10,2,3".into()));
    assert!(h.late().is_empty());
    assert!(h.ctx.state_entry_count() > 0);
    h.watermark(13);
    h.feed(&[("a", 1, 4)]);
    assert_eq!(h.out[2], ("a".into(), 9, "0,10,3,7".into()));
    // The cleanup timer at 9 + 5 clears the window; later records are late.
    h.watermark(14);
    assert_eq!(h.out.len(), 3);
    h.assert_clean();
    h.feed(&[("a", 8, 5)]);
    assert_eq!(h.late(), vec![("a".into(), 8, "5".into())]);
    h.assert_clean();
}

#[test]
fn sessions_merge_when_they_overlap_not_when_they_touch() {
    let mut h = Harness::new(FunctionKind::Aggregate, session_op);
    h.feed(&[
        ("a", 0, 1),
        ("a", 5, 2),
        ("a", 30, 4),
        ("b", 0, 8),
        ("b", 22, 16),
    ]);
    // a: [0,15) and [30,40); b: [0,10) and [22,32).
    assert_eq!(h.ctx.registered_timers().len(), 4);
    let b_timers = |h: &Harness<_>| -> Vec<i64> {
        h.ctx
            .registered_timers()
            .iter()
            .filter(|t| t.key == b"b")
            .map(|t| t.timestamp)
            .collect()
    };
    h.feed(&[("b", 11, 32)]); // [11,21) bridges nothing: 21 < 22, 11 > 10.
    h.feed(&[("b", 12, 64)]); // [12,22) overlaps [11,21), only touches [22,32).
    h.feed(&[("b", 10, 128)]); // [10,20) overlaps [11,22), only touches [0,10).
    assert_eq!(
        b_timers(&h),
        vec![9, 21, 31],
        "touching sessions stay apart"
    );
    h.feed(&[("a", 15, 256)]); // [15,25) touches [0,15): a third session of a.
    h.feed(&[("b", 21, 512)]); // [21,31) overlaps [10,22) and [22,32): [10,32).
    assert_eq!(
        b_timers(&h),
        vec![9, 31],
        "merged-away windows' timers are deleted"
    );
    h.feed(&[("b", 9, 1024)]); // [9,19) overlaps [0,10) and [10,32): [0,32).
    assert_eq!(b_timers(&h), vec![31]);
    h.watermark(i64::MAX);
    let mut out = h.out.clone();
    out.sort();
    assert_eq!(
        out,
        vec![
            ("a".into(), 14, "0,15,2,3".into()),
            ("a".into(), 24, "15,25,1,256".into()),
            ("a".into(), 39, "30,40,1,4".into()),
            ("b".into(), 31, "0,32,7,1784".into()),
        ]
    );
    h.assert_clean();
}

#[test]
fn window_overlap_is_half_open() {
    let w = Window::new(0, 10);
    for (other, want) in [
        (Window::new(10, 20), false), // touches on the right
        (Window::new(-5, 0), false),  // touches on the left
        (Window::new(9, 19), true),
        (Window::new(-5, 1), true),
        (Window::new(3, 4), true),   // inside
        (Window::new(-5, 15), true), // around
        (Window::new(11, 20), false),
    ] {
        assert_eq!(w.overlaps(&other), want, "{w:?} {other:?}");
        assert_eq!(other.overlaps(&w), want, "symmetric: {other:?} {w:?}");
    }
}

#[test]
fn session_with_allowed_lateness_merges_late_records_and_fires_again() {
    let make: fn(&mut MockContext) -> _ =
        |ctx| agg_op(WindowSpec::session(10).allowed_lateness(20))(ctx);
    let mut h = Harness::new(FunctionKind::Aggregate, make);
    h.feed(&[("a", 0, 1)]);
    h.watermark(9);
    assert_eq!(h.out, vec![("a".into(), 9, "0,10,1,1".into())]);
    h.feed(&[("a", 12, 2)]); // [12,22) not yet fired: no immediate firing
    assert_eq!(h.out.len(), 1);
    h.feed(&[("a", 5, 4)]); // bridges: [0,22), max 21 > 9: waits for its timer
    assert_eq!(h.out.len(), 1);
    h.watermark(25);
    assert_eq!(h.out[1], ("a".into(), 21, "0,22,3,7".into()));
    h.feed(&[("a", 3, 8)]); // late firing of the merged window
    assert_eq!(h.out[2], ("a".into(), 21, "0,22,4,15".into()));
    h.watermark(41); // cleanup at 21 + 20
    h.assert_clean();
    h.feed(&[("a", 4, 16)]);
    assert_eq!(h.late().len(), 1);
    h.assert_clean();
}

/// Sessions by a sort: per key, records in time order, a new session whenever a record is
/// at or past the current session's end (half-open windows; touching ones stay apart).
fn reference_sessions(
    recs: &[(String, i64, i64)],
    gap: i64,
) -> BTreeMap<(String, Window), (u64, i64)> {
    let mut by_key: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for (k, ts, v) in recs {
        by_key.entry(k).or_default().push((*ts, *v));
    }
    let mut want = BTreeMap::new();
    for (k, mut rs) in by_key {
        rs.sort_unstable();
        let mut cur: Option<(Window, u64, i64)> = None;
        for (ts, v) in rs {
            cur = Some(match cur {
                Some((w, c, s)) if ts < w.end => {
                    (Window::new(w.start, w.end.max(ts + gap)), c + 1, s + v)
                }
                other => {
                    if let Some((w, c, s)) = other {
                        want.insert((k.to_string(), w), (c, s));
                    }
                    (Window::new(ts, ts + gap), 1, v)
                }
            });
        }
        if let Some((w, c, s)) = cur {
            want.insert((k.to_string(), w), (c, s));
        }
    }
    want
}

#[test]
fn sessions_match_a_naive_reference_and_survive_restores() {
    for (seed, batch) in [(7, 1), (8, 9), (9, 64)] {
        let mut rng = Rng(seed);
        let recs: Vec<(String, i64, i64)> = (0..300)
            .map(|i| {
                (
                    format!("k{}", rng.below(4)),
                    i * 4 + rng.below(40),
                    rng.below(100),
                )
            })
            .collect();
        let want = reference_sessions(&recs, 10);
        for restore in [false, true] {
            let mut h = Harness::new(FunctionKind::Aggregate, session_op);
            for (b, chunk) in recs.chunks(batch).enumerate() {
                let refs: Vec<(&str, i64, i64)> =
                    chunk.iter().map(|(k, t, v)| (k.as_str(), *t, *v)).collect();
                h.feed(&refs);
                if restore {
                    h.restore();
                }
                // The highest watermark the rest of the input allows: below every later
                // record. (With touching sessions merging, this let a later record at a
                // fired session's end start a session of its own.)
                let rest = recs
                    .get((b + 1) * batch..)
                    .and_then(|r| r.iter().map(|r| r.1).min());
                if let Some(min) = rest {
                    h.watermark(min - 1);
                }
            }
            h.watermark(i64::MAX);
            assert!(h.late().is_empty());
            assert_eq!(
                parse_outputs(&h.out),
                want,
                "seed {seed} batch {batch} restore {restore}"
            );
            h.assert_clean();
        }
    }
}

/// Events for the merge-rule properties: three keys, gap 10, timestamps mostly on a grid
/// of 5 ms so that many pairs of one key are exactly one gap apart (touching windows),
/// others overlap by a little or a lot.
fn adjacent_heavy_events() -> impl Strategy<Value = Vec<Rec>> {
    prop::collection::vec(
        (
            prop::sample::select(vec!["a", "b", "c"]),
            prop_oneof![3 => (0i64..60).prop_map(|k| k * 5), 1 => 0i64..300],
            -50i64..50,
        ),
        0..80,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(k, t, x)| (k.to_string(), t, x))
            .collect()
    })
}

/// Feeds `recs` in order, cut into batches of the given sizes (cycled), optionally
/// restoring a fresh instance after a batch; after each batch the watermark is set by
/// `watermark(rest)` from the records still to come (`None`: left as is). Returns the
/// results once the watermark reaches the end.
fn sessions_of(
    recs: &[Rec],
    batches: &[usize],
    restores: &[bool],
    watermark: impl Fn(&[Rec]) -> Option<i64>,
) -> Results {
    let mut h = Harness::new(FunctionKind::Aggregate, session_op);
    let (mut i, mut b) = (0, 0);
    while i < recs.len() {
        let n = batches[b % batches.len()].min(recs.len() - i);
        let refs: Vec<(&str, i64, i64)> = recs[i..i + n]
            .iter()
            .map(|(k, t, v)| (k.as_str(), *t, *v))
            .collect();
        h.feed(&refs);
        i += n;
        if restores[b % restores.len()] {
            h.restore();
        }
        if let Some(wm) = watermark(&recs[i..]) {
            h.watermark(wm);
        }
        b += 1;
    }
    h.watermark(i64::MAX);
    assert!(
        h.late().is_empty(),
        "no record arrives behind the watermark"
    );
    h.assert_clean();
    parse_outputs(&h.out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Before any watermark, every arrival order and batch split of the same events (and
    /// restores in between) gives the same sessions: the overlap components.
    #[test]
    fn sessions_do_not_depend_on_arrival_order_or_batches(
        (recs, shuffled) in adjacent_heavy_events()
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
        batches in prop::collection::vec(1usize..12, 1..6),
        restores in prop::collection::vec(any::<bool>(), 1..6),
    ) {
        let want = reference_sessions(&recs, 10);
        prop_assert_eq!(&sessions_of(&recs, &[usize::MAX], &[false], |_| None), &want);
        prop_assert_eq!(&sessions_of(&shuffled, &batches, &restores, |_| None), &want);
    }

    /// With the watermark as high as the input allows after every batch (just below every
    /// record still to come: nothing is late), firing never races a merge: the sessions
    /// equal the overlap components whatever the batches and the disorder. Under Flink's
    /// touching rule a record at a fired session's end would start a session of its own.
    #[test]
    fn sessions_do_not_race_the_watermark(
        (recs, jitter) in adjacent_heavy_events().prop_flat_map(|v| {
            let n = v.len();
            (Just(v), prop::collection::vec(0i64..30, n))
        }),
        batches in prop::collection::vec(1usize..12, 1..6),
        restores in prop::collection::vec(any::<bool>(), 1..6),
    ) {
        let want = reference_sessions(&recs, 10);
        // Arrival order: by timestamp plus a per-record jitter (bounded disorder).
        let mut order: Vec<usize> = (0..recs.len()).collect();
        order.sort_by_key(|&i| (recs[i].1 + jitter[i], i));
        let arrival: Vec<Rec> = order.iter().map(|&i| recs[i].clone()).collect();
        let highest = |rest: &[Rec]| rest.iter().map(|r| r.1 - 1).min();
        prop_assert_eq!(sessions_of(&arrival, &batches, &restores, highest), want);
    }
}

#[test]
fn process_function_gets_all_records_and_session_lists_concatenate() {
    let make: fn(&mut MockContext) -> _ =
        |ctx| WindowOperator::open(ctx, WindowSpec::session(10), Processing::new(ListAll)).unwrap();
    let mut h = Harness::new(FunctionKind::Process, make);
    h.feed(&[("a", 0, 1), ("a", 15, 2), ("a", 15, 3)]);
    h.feed(&[("a", 8, 4)]); // [8,18) overlaps [0,10) and [15,25)
    assert_eq!(h.op.spec().function, FunctionKind::Process);
    h.watermark(i64::MAX);
    assert_eq!(h.out, vec![("a".into(), 24, "0,25,1;2;3;4".into())]);
    h.assert_clean();
}

#[test]
fn reduce_with_process_function() {
    let make: fn(&mut MockContext) -> _ = |ctx| {
        WindowOperator::open(
            ctx,
            WindowSpec::sliding(10, 5),
            Aggregating::reduce_with_process(MaxText, EmitMax),
        )
        .unwrap()
    };
    let mut h = Harness::new(FunctionKind::Reduce, make);
    h.feed(&[("a", 7, 3), ("a", 2, 9), ("a", 12, -1)]);
    h.watermark(i64::MAX);
    assert_eq!(
        h.out.iter().map(|o| o.2.as_str()).collect::<Vec<_>>(),
        vec!["-5,5,max=9", "0,10,max=9", "5,15,max=3", "10,20,max=-1"]
    );
    assert!(
        h.op.spec()
            .to_model_json()
            .contains(r#""function":"reduce""#)
    );
    h.assert_clean();
}

#[test]
fn processing_time_windows_use_the_clock_and_timers() {
    let make: fn(&mut MockContext) -> _ =
        |ctx| agg_op(WindowSpec::tumbling(10).processing_time())(ctx);
    let mut h = Harness::new(FunctionKind::Aggregate, make);
    let mut b = Batch::new();
    b.push_keyed(b"a", b"1");
    b.push_keyed(b"a", b"2");
    h.ctx.set_processing_time(13);
    let mut out = Batch::new();
    h.op.process(&mut h.ctx, &b, &mut out).unwrap();
    h.ctx.set_processing_time(21);
    h.op.process(&mut h.ctx, &b, &mut out).unwrap();
    assert!(out.is_empty());
    // Event-time progress does nothing.
    h.watermark(i64::MAX);
    assert!(h.out.is_empty());
    let timers = h.ctx.fire_due_processing_timers(25);
    h.op.on_timers(&mut h.ctx, &timers, &mut out).unwrap();
    collect(&out, &mut h.out);
    assert_eq!(h.out, vec![("a".into(), 19, "10,20,2,3".into())]);
    let timers = h.ctx.fire_due_processing_timers(29);
    let mut out = Batch::new();
    h.op.on_timers(&mut h.ctx, &timers, &mut out).unwrap();
    collect(&out, &mut h.out);
    assert_eq!(h.out[1], ("a".into(), 29, "20,30,2,3".into()));
    h.assert_clean();
}

#[test]
fn records_without_timestamp_or_undecodable_are_invalid_and_change_nothing() {
    let mut h = Harness::new(FunctionKind::Aggregate, tumbling_op);
    let mut b = Batch::new();
    b.push_keyed(b"a", b"1");
    let err = h.op.process(&mut h.ctx, &b, &mut Batch::new()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRecord);
    assert!(err.message.contains("timestamp"), "{}", err.message);
    let mut b = Batch::new();
    b.push_record(Some(b"a"), Some(1), b"1");
    b.push_record(Some(b"a"), Some(2), b"x");
    let err = h.op.process(&mut h.ctx, &b, &mut Batch::new()).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRecord);
    assert!(err.message.starts_with("record 1:"), "{}", err.message);
    h.assert_clean();
}

#[test]
fn assigners_namespaces_specs_and_configs() {
    let mut w = Vec::new();
    Assigner::Sliding {
        size: 10,
        slide: 4,
        offset: 0,
    }
    .assign(-3, &mut w);
    assert_eq!(
        w,
        vec![Window::new(-4, 6), Window::new(-8, 2), Window::new(-12, -2)]
    );
    w.clear();
    Assigner::Tumbling {
        size: 10,
        offset: 3,
    }
    .assign(2, &mut w);
    assert_eq!(w, vec![Window::new(-7, 3)]);
    let a = Window::new(-5, 7);
    let b = Window::new(3, i64::MAX);
    assert_eq!(Window::from_namespace(&a.namespace()), Some(a));
    assert!(a.namespace() < b.namespace());
    assert_eq!(Window::from_namespace(b"short"), None);

    let cfg = WindowConfig {
        kind: AssignerKind::Sliding,
        size_ms: Some(10_000),
        slide_ms: Some(2_000),
        gap_ms: None,
        offset_ms: None,
        time: TimeMode::Event,
        allowed_lateness_ms: 0,
    };
    let spec = cfg.to_spec(FunctionKind::Aggregate).unwrap();
    assert_eq!(spec, WindowSpec::sliding(10_000, 2_000));
    assert_eq!(
        spec.to_model_json(),
        r#"{"operator":"window","assigner":"sliding","size_ms":10000,"slide_ms":2000,"offset_ms":0,"time":"event","allowed_lateness_ms":0,"function":"aggregate"}"#
    );
    let bad = WindowConfig {
        kind: AssignerKind::Sliding,
        size_ms: Some(10),
        slide_ms: None,
        gap_ms: None,
        offset_ms: None,
        time: TimeMode::Event,
        allowed_lateness_ms: 0,
    };
    assert!(
        bad.to_spec(FunctionKind::Aggregate)
            .unwrap_err()
            .contains("slide_ms")
    );
    assert!(
        WindowSpec::session(0)
            .validate()
            .unwrap_err()
            .contains("gap_ms")
    );
    assert!(
        WindowSpec::tumbling(5)
            .allowed_lateness(-1)
            .validate()
            .unwrap_err()
            .contains("allowed_lateness_ms")
    );
    let mut ctx = MockContext::new(&info(FunctionKind::Aggregate));
    let err = WindowOperator::open(&mut ctx, WindowSpec::tumbling(-1), Aggregating::new(Bytes))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidConfig);
}

/// Concatenates payloads; result emitted as is through [`EmitResult`].
#[derive(Debug)]
struct Bytes;

impl AggregateFunction for Bytes {
    type In = Vec<u8>;
    type Acc = Vec<u8>;
    type Out = Vec<u8>;
    fn decode(&self, r: RecordRef<'_>) -> Result<Vec<u8>> {
        Ok(r.data.to_vec())
    }
    fn create_accumulator(&self) -> Vec<u8> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<u8>, v: &Vec<u8>) {
        acc.extend_from_slice(v);
    }
    fn merge(&self, acc: &mut Vec<u8>, o: Vec<u8>) {
        acc.extend(o);
    }
    fn get_result(&self, acc: Vec<u8>) -> Vec<u8> {
        acc
    }
}

#[test]
fn unkeyed_input_is_one_key_and_emit_result_passes_through() {
    let mut ctx = MockContext::new(&info(FunctionKind::Aggregate));
    let mut op =
        WindowOperator::open(&mut ctx, WindowSpec::tumbling(10), Aggregating::new(Bytes)).unwrap();
    let mut b = Batch::new();
    b.push_record(None, Some(1), b"x");
    b.push_record(None, Some(2), b"y");
    let mut out = Batch::new();
    op.process(&mut ctx, &b, &mut out).unwrap();
    let timers = ctx.fire_due_event_timers(i64::MAX);
    op.on_timers(&mut ctx, &timers, &mut out).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out.record(0), b"xy");
    assert_eq!(out.key(0), Some(&b""[..]));
    assert_eq!(out.timestamp(0), Some(9));
    assert_eq!(ctx.state_entry_count(), 0);
}
