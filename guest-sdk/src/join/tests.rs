//! The join family against nested-loop references: fixed cases on `MockContext`, and
//! proptests over arrival order, batch splits, restores and parallelism.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::window::{Assigner, Window};
use crate::{Batch, Context, MockContext, PluginInfo, TimerGroup, ValueState};

/// Renders every callback as text: `key|left|right|window_start|timestamp`, `-` for an
/// absent side or window.
#[derive(Debug, Default)]
struct Txt;

fn text(
    key: &[u8],
    l: Option<Row<'_>>,
    r: Option<Row<'_>>,
    w: Option<Window>,
    out: &mut JoinOutput<'_>,
) {
    let s = |r: Option<Row<'_>>| {
        r.map_or("-".to_owned(), |r| {
            String::from_utf8_lossy(r.data).into_owned()
        })
    };
    let line = format!(
        "{}|{}|{}|{}|{}",
        String::from_utf8_lossy(key),
        s(l),
        s(r),
        w.map_or("-".to_owned(), |w| w.start.to_string()),
        out.timestamp().map_or("-".to_owned(), |t| t.to_string())
    );
    out.emit(line.as_bytes());
}

impl JoinFunction for Txt {
    fn join(
        &mut self,
        key: &[u8],
        l: Row<'_>,
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, Some(l), Some(r), None, out);
        Ok(())
    }
    fn left_only(&mut self, key: &[u8], l: Row<'_>, out: &mut JoinOutput<'_>) -> crate::Result<()> {
        text(key, Some(l), None, None, out);
        Ok(())
    }
    fn right_only(
        &mut self,
        key: &[u8],
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, None, Some(r), None, out);
        Ok(())
    }
}

impl IntervalJoinFunction for Txt {
    type Acc = ();
    fn join(
        &mut self,
        key: &[u8],
        l: Row<'_>,
        _acc: &mut (),
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, Some(l), Some(r), None, out);
        Ok(())
    }
    fn left_only(&mut self, key: &[u8], l: Row<'_>, out: &mut JoinOutput<'_>) -> crate::Result<()> {
        text(key, Some(l), None, None, out);
        Ok(())
    }
    fn right_only(
        &mut self,
        key: &[u8],
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, None, Some(r), None, out);
        Ok(())
    }
}

impl WindowJoinFunction for Txt {
    fn join(
        &mut self,
        key: &[u8],
        w: Window,
        l: Row<'_>,
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, Some(l), Some(r), Some(w), out);
        Ok(())
    }
    fn left_only(
        &mut self,
        key: &[u8],
        w: Window,
        l: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, Some(l), None, Some(w), out);
        Ok(())
    }
    fn right_only(
        &mut self,
        key: &[u8],
        w: Window,
        r: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> crate::Result<()> {
        text(key, None, Some(r), Some(w), out);
        Ok(())
    }
}

/// Which join a test runs.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Regular(RegularJoinSpec),
    /// With the row cache's byte bound when cached (0: written back after every call).
    Interval(IntervalJoinSpec, Option<usize>),
    Window(WindowJoinSpec),
}

enum Op {
    Regular(RegularJoin<Txt>),
    Interval(IntervalJoin<Txt>),
    Window(WindowJoin<Txt>),
}

fn info(kind: Kind) -> PluginInfo {
    let mut info = PluginInfo::operator("join-test", "0.1.0").side_output(LATE_OUTPUT);
    let states = match kind {
        Kind::Regular(_) => RegularJoinSpec::state_descriptors(),
        Kind::Interval(..) => IntervalJoinSpec::state_descriptors::<()>(1),
        Kind::Window(_) => WindowJoinSpec::state_descriptors(),
    };
    for d in states {
        info = info.state(d);
    }
    info
}

impl Op {
    fn open(ctx: &mut MockContext, kind: Kind) -> Op {
        match kind {
            Kind::Regular(s) => Op::Regular(RegularJoin::open(ctx, s, Txt).unwrap()),
            Kind::Interval(s, cache) => {
                let j = IntervalJoin::open(ctx, s, Txt).unwrap();
                Op::Interval(match cache {
                    Some(limit) => j.cached_with_limit(limit),
                    None => j,
                })
            }
            Kind::Window(s) => Op::Window(WindowJoin::open(ctx, s, Txt).unwrap()),
        }
    }
    fn process(&mut self, ctx: &mut MockContext, input: u32, b: &Batch, out: &mut Batch) {
        match self {
            Op::Regular(j) => j.process(ctx, input, b, out),
            Op::Interval(j) => j.process(ctx, input, b, out),
            Op::Window(j) => j.process(ctx, input, b, out),
        }
        .unwrap();
    }
    fn timers(&mut self, ctx: &mut MockContext, t: &[TimerGroup], out: &mut Batch) {
        match self {
            Op::Regular(j) => j.on_timers(ctx, t, out),
            Op::Interval(j) => j.on_timers(ctx, t, out),
            Op::Window(j) => j.on_timers(ctx, t, out),
        }
        .unwrap();
    }
    /// What `prepare_checkpoint` does: the join's `flush`.
    fn flush(&mut self, ctx: &mut MockContext, out: &mut Batch) {
        match self {
            Op::Regular(j) => j.flush(ctx, out),
            Op::Interval(j) => j.flush(ctx, out),
            Op::Window(j) => j.flush(ctx, out),
        }
        .unwrap();
    }
    fn finish(&mut self, ctx: &mut MockContext, out: &mut Batch) {
        match self {
            Op::Regular(j) => j.finish(ctx, out),
            Op::Interval(j) => j.finish(ctx, out),
            Op::Window(j) => j.finish(ctx, out),
        }
        .unwrap();
    }
}

/// One input record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    side: u32,
    key: u8,
    ts: i64,
    data: String,
}

fn lines(b: &Batch) -> Vec<String> {
    b.iter()
        .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
        .collect()
}

/// One subtask: its context, instance and committed output.
struct Subtask {
    ctx: MockContext,
    op: Op,
    out: Batch,
}

/// The host's side of a run: per input the largest timestamp seen (a source with
/// out-of-orderness `bound` derives its watermark `max - bound - 1` from it), the
/// subtasks, and the checkpoint to restore.
struct Run {
    kind: Kind,
    bound: i64,
    max_seen: [Option<i64>; 2],
    subtasks: Vec<Subtask>,
    watermark: i64,
    clock: i64,
    checkpoint: Option<Checkpoint>,
}

/// Per subtask its state and committed output length; the inputs' largest timestamps,
/// the watermark and the input position.
type Checkpoint = (Vec<(MockContext, usize)>, [Option<i64>; 2], i64, usize);
/// Rows of one (key, window) cell, per side.
type Cell<'a> = (Vec<&'a Rec>, Vec<&'a Rec>);

const SHARDS: u32 = 8;

fn shard(key: u8) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(&[key]) % u64::from(SHARDS)) as u32
}

impl Run {
    fn new(kind: Kind, bound: i64, parallelism: u32) -> Run {
        let per = SHARDS / parallelism;
        let subtasks = (0..parallelism)
            .map(|i| {
                let mut ctx =
                    MockContext::new(&info(kind)).with_shards(SHARDS, i * per..(i + 1) * per);
                let op = Op::open(&mut ctx, kind);
                Subtask {
                    ctx,
                    op,
                    out: Batch::new(),
                }
            })
            .collect();
        Run {
            kind,
            bound,
            max_seen: [None; 2],
            subtasks,
            watermark: i64::MIN,
            clock: 0,
            checkpoint: None,
        }
    }

    fn owner(&self, key: u8) -> usize {
        (shard(key) / (SHARDS / self.subtasks.len() as u32)) as usize
    }

    fn advance(&mut self, watermark: i64) {
        if watermark <= self.watermark {
            return;
        }
        self.watermark = watermark;
        for s in &mut self.subtasks {
            let due = s.ctx.fire_due_event_timers(watermark);
            if !due.is_empty() {
                s.op.timers(&mut s.ctx, &due, &mut s.out);
            }
        }
    }

    /// Processes one batch of one input, routed by key, then lets the watermark follow.
    fn feed(&mut self, recs: &[Rec]) {
        self.clock += 1;
        let side = recs[0].side;
        let mut per: Vec<Batch> = (0..self.subtasks.len()).map(|_| Batch::new()).collect();
        for r in recs {
            assert_eq!(r.side, side);
            per[self.owner(r.key)].push_record(Some(&[r.key]), Some(r.ts), r.data.as_bytes());
            let m = &mut self.max_seen[side as usize];
            *m = Some(m.map_or(r.ts, |m| m.max(r.ts)));
        }
        let clock = self.clock;
        for (s, b) in self.subtasks.iter_mut().zip(&per) {
            s.ctx.set_processing_time(clock);
            if !b.is_empty() {
                s.op.process(&mut s.ctx, side, b, &mut s.out);
            }
        }
        if let [Some(a), Some(b)] = self.max_seen {
            self.advance(a.min(b) - self.bound - 1);
        }
    }

    fn checkpoint(&mut self, position: usize) {
        // The runtime calls `prepare_checkpoint` before it snapshots state.
        for s in &mut self.subtasks {
            s.op.flush(&mut s.ctx, &mut s.out);
        }
        let snap = self
            .subtasks
            .iter()
            .map(|s| (s.ctx.clone(), s.out.len()))
            .collect();
        self.checkpoint = Some((snap, self.max_seen, self.watermark, position));
    }

    /// Drops every instance, restores the checkpoint (state, timers, watermarks, committed
    /// output) and returns the input position to replay from.
    fn crash(&mut self) -> usize {
        let Some((snap, max_seen, watermark, position)) = &self.checkpoint else {
            // No checkpoint yet: start over.
            let fresh = Run::new(self.kind, self.bound, self.subtasks.len() as u32);
            *self = Run {
                clock: self.clock,
                ..fresh
            };
            return 0;
        };
        self.max_seen = *max_seen;
        self.watermark = *watermark;
        let kind = self.kind;
        for (s, (ctx, len)) in self.subtasks.iter_mut().zip(snap) {
            s.ctx = ctx.clone();
            s.out.truncate(*len);
            s.op = Op::open(&mut s.ctx, kind);
        }
        *position
    }

    fn end(mut self) -> Vec<String> {
        self.advance(i64::MAX);
        let mut all = Vec::new();
        for s in &mut self.subtasks {
            let due = s.ctx.fire_due_processing_timers(i64::MAX);
            if !due.is_empty() {
                s.op.timers(&mut s.ctx, &due, &mut s.out);
            }
            s.op.finish(&mut s.ctx, &mut s.out);
            assert!(
                s.ctx.take_side_output(LATE_OUTPUT).is_empty(),
                "no record is late"
            );
            all.extend(lines(&s.out));
        }
        all.sort();
        all
    }
}

/// Runs `input` (already in arrival order, per input non-late for `bound`) cut into
/// batches by `cuts`, with a checkpoint and a crash at the given batch numbers.
fn run(
    kind: Kind,
    bound: i64,
    parallelism: u32,
    input: &[Rec],
    cuts: &[usize],
    restores: &[(usize, usize)],
) -> Vec<String> {
    let mut r = Run::new(kind, bound, parallelism);
    let mut pos = 0;
    let mut n = 0;
    let mut cut = cuts.iter().cycle();
    let mut restores = restores.to_vec();
    while pos < input.len() {
        n += 1;
        if restores.first().is_some_and(|&(c, _)| c == n) {
            r.checkpoint(pos);
        }
        if restores.first().is_some_and(|&(_, k)| k == n) {
            pos = r.crash();
            restores.remove(0);
            continue;
        }
        // A batch holds records of one input: up to `len` consecutive ones.
        let len = (*cut.next().unwrap()).max(1);
        let side = input[pos].side;
        let mut end = pos;
        while end < input.len() && end - pos < len && input[end].side == side {
            end += 1;
        }
        r.feed(&input[pos..end]);
        pos = end;
    }
    r.end()
}

fn rendered(key: u8, l: Option<&Rec>, r: Option<&Rec>, w: Option<i64>, ts: i64) -> String {
    let s = |x: Option<&Rec>| x.map_or("-".to_owned(), |x| x.data.clone());
    format!(
        "{}|{}|{}|{}|{ts}",
        key as char,
        s(l),
        s(r),
        w.map_or("-".to_owned(), |w| w.to_string())
    )
}

/// The join by nested loops over the whole input.
fn reference(kind: Kind, input: &[Rec]) -> Vec<String> {
    let left: Vec<&Rec> = input.iter().filter(|r| r.side == 0).collect();
    let right: Vec<&Rec> = input.iter().filter(|r| r.side == 1).collect();
    let mut out = Vec::new();
    match kind {
        Kind::Regular(spec) => {
            for l in &left {
                let mut m = false;
                for r in right.iter().filter(|r| r.key == l.key) {
                    m = true;
                    out.push(rendered(l.key, Some(l), Some(r), None, l.ts.max(r.ts)));
                }
                if !m && spec.join_type.keeps_left() {
                    out.push(rendered(l.key, Some(l), None, None, l.ts));
                }
            }
            for r in &right {
                if spec.join_type.keeps_right() && !left.iter().any(|l| l.key == r.key) {
                    out.push(rendered(r.key, None, Some(r), None, r.ts));
                }
            }
        }
        Kind::Interval(spec, _) => {
            let ok = |l: &Rec, r: &Rec| {
                l.key == r.key && l.ts + spec.lower_ms <= r.ts && r.ts <= l.ts + spec.upper_ms
            };
            for l in &left {
                let mut m = false;
                for r in right.iter().filter(|r| ok(l, r)) {
                    m = true;
                    out.push(rendered(l.key, Some(l), Some(r), None, l.ts.max(r.ts)));
                }
                if !m && spec.join_type.keeps_left() {
                    out.push(rendered(l.key, Some(l), None, None, l.ts + spec.upper_ms));
                }
            }
            for r in &right {
                if spec.join_type.keeps_right() && !left.iter().any(|l| ok(l, r)) {
                    out.push(rendered(r.key, None, Some(r), None, r.ts - spec.lower_ms));
                }
            }
        }
        Kind::Window(spec) => {
            // (key, window) -> (left rows, right rows)
            let mut cells: BTreeMap<(u8, Window), Cell<'_>> = BTreeMap::new();
            match spec.assigner {
                Assigner::Session { gap } => {
                    let mut keys: Vec<u8> = input.iter().map(|r| r.key).collect();
                    keys.sort_unstable();
                    keys.dedup();
                    for k in keys {
                        let mut rs: Vec<&Rec> = input.iter().filter(|r| r.key == k).collect();
                        rs.sort_by_key(|r| r.ts);
                        let mut i = 0;
                        while i < rs.len() {
                            let (start, mut end) = (rs[i].ts, rs[i].ts + gap);
                            let mut j = i;
                            while j < rs.len() && rs[j].ts < end {
                                end = end.max(rs[j].ts + gap);
                                j += 1;
                            }
                            let cell = cells.entry((k, Window::new(start, end))).or_default();
                            for r in &rs[i..j] {
                                if r.side == 0 {
                                    cell.0.push(r)
                                } else {
                                    cell.1.push(r)
                                }
                            }
                            i = j;
                        }
                    }
                }
                a => {
                    for r in input {
                        let mut ws = Vec::new();
                        a.assign(r.ts, &mut ws);
                        for w in ws {
                            let cell = cells.entry((r.key, w)).or_default();
                            if r.side == 0 {
                                cell.0.push(r)
                            } else {
                                cell.1.push(r)
                            }
                        }
                    }
                }
            }
            for ((k, w), (l, r)) in cells {
                let ts = w.max_timestamp();
                for a in &l {
                    for b in &r {
                        out.push(rendered(k, Some(a), Some(b), Some(w.start), ts));
                    }
                }
                if r.is_empty() && spec.join_type.keeps_left() {
                    for a in &l {
                        out.push(rendered(k, Some(a), None, Some(w.start), ts));
                    }
                }
                if l.is_empty() && spec.join_type.keeps_right() {
                    for b in &r {
                        out.push(rendered(k, None, Some(b), Some(w.start), ts));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// Arrival order from per-input sequences: input `i`'s records in the order given, the
/// two inputs interleaved by `pick` (true: left next).
fn interleave(left: Vec<Rec>, right: Vec<Rec>, pick: &[bool]) -> Vec<Rec> {
    let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
    let mut out = Vec::new();
    let mut p = pick.iter().cycle();
    while l.peek().is_some() || r.peek().is_some() {
        let take_left = if l.peek().is_none() {
            false
        } else if r.peek().is_none() {
            true
        } else {
            *p.next().unwrap()
        };
        out.push(if take_left { l.next() } else { r.next() }.unwrap());
    }
    out
}

/// One input's records in arrival order: timestamps `base + jitter` with a
/// non-decreasing base and `jitter <= bound`, so none is behind the watermark
/// `max - bound - 1`; payloads unique.
fn side_strategy(side: u32, bound: i64) -> impl Strategy<Value = Vec<Rec>> {
    prop::collection::vec((0i64..4, 0..=bound, 0u8..4), 0..40).prop_map(move |v| {
        let mut base = 100;
        v.into_iter()
            .enumerate()
            .map(|(i, (step, jitter, key))| {
                base += step;
                Rec {
                    side,
                    key: b'a' + key,
                    ts: base + jitter,
                    data: format!("{}{i}", if side == 0 { 'l' } else { 'r' }),
                }
            })
            .collect()
    })
}

fn kind_strategy() -> impl Strategy<Value = Kind> {
    let jt = prop_oneof![
        Just(JoinType::Inner),
        Just(JoinType::Left),
        Just(JoinType::Right),
        Just(JoinType::Full)
    ];
    // The interval join without and with its row cache (a bound of 0 writes it back after
    // every call; 1 KiB after some).
    let cache = prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(1024)),
        Just(Some(1 << 20))
    ];
    (jt, 0u8..7, -6i64..6, 0i64..8, 1i64..8, cache).prop_map(|(t, k, lower, width, size, cache)| {
        match k {
            0 => Kind::Regular(RegularJoinSpec::of(t)),
            1 | 2 => Kind::Interval(
                IntervalJoinSpec::between(lower, lower + width).with_type(t),
                cache,
            ),
            6 => Kind::Interval(
                IntervalJoinSpec::between(lower, lower + width)
                    .with_type(t)
                    .with_unique_left(),
                cache,
            ),
            3 => Kind::Window(WindowJoinSpec::tumbling(size).with_type(t)),
            4 => Kind::Window(WindowJoinSpec::sliding(size * 2, size).with_type(t)),
            _ => Kind::Window(WindowJoinSpec::session(size).with_type(t)),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Every join equals its nested-loop reference for any interleaving of the inputs,
    /// any batch split, with a checkpoint and a crash replaying from it, at parallelism 1
    /// and 2.
    #[test]
    fn joins_equal_the_reference_for_any_order_split_restore_and_parallelism(
        kind in kind_strategy(),
        bound in 0i64..5,
        seed_left in any::<u64>(),
        pick in prop::collection::vec(any::<bool>(), 1..16),
        cuts in prop::collection::vec(1usize..6, 1..8),
        cuts2 in prop::collection::vec(1usize..6, 1..8),
        restore in (1usize..10, 0usize..6),
        parallelism in 1u32..=2,
        (left, right) in (0i64..5).prop_flat_map(|b| (side_strategy(0, b), side_strategy(1, b))),
    ) {
        let _ = (seed_left, bound);
        // The generated inputs respect their own bound; recompute it for the run.
        let bound = {
            let lag = |v: &[Rec]| {
                let mut m = i64::MIN;
                let mut worst = 0;
                for r in v {
                    m = m.max(r.ts);
                    worst = worst.max(m - r.ts);
                }
                worst
            };
            lag(&left).max(lag(&right))
        };
        // A left side promised unique per key gets its first row per key only.
        let left = if let Kind::Interval(IntervalJoinSpec { left_unique: true, .. }, _) = kind {
            let mut seen = Vec::new();
            left.into_iter().filter(|r| { let new = !seen.contains(&r.key); seen.push(r.key); new }).collect()
        } else {
            left
        };
        let input = interleave(left, right, &pick);
        let want = reference(kind, &input);
        let straight = run(kind, bound, 1, &input, &[1_000_000], &[]);
        prop_assert_eq!(&straight, &want, "straight, one batch per input run");
        let split = run(kind, bound, parallelism, &input, &cuts, &[]);
        prop_assert_eq!(&split, &want, "split {:?} at p={}", cuts, parallelism);
        let (c, k) = restore;
        let restored = run(kind, bound, parallelism, &input, &cuts2, &[(c, c + 1 + k)]);
        prop_assert_eq!(&restored, &want, "restore at batch {} after {} more at p={}", c, k, parallelism);
    }
}

fn rec(side: u32, key: u8, ts: i64, data: &str) -> Rec {
    Rec {
        side,
        key,
        ts,
        data: data.to_owned(),
    }
}

#[test]
fn interval_bounds_are_inclusive_on_both_ends() {
    let kind = Kind::Interval(IntervalJoinSpec::between(-2, 3), None);
    let input = vec![
        rec(0, b'a', 10, "l"),
        rec(1, b'a', 7, "r7"),
        rec(1, b'a', 8, "r8"),
        rec(1, b'a', 13, "r13"),
        rec(1, b'a', 14, "r14"),
    ];
    let got = run(kind, 10, 1, &input, &[1], &[]);
    assert_eq!(got, ["a|l|r13|-|13", "a|l|r8|-|10"]);
}

#[test]
fn late_records_go_to_the_side_output_and_join_nothing() {
    let spec = IntervalJoinSpec::between(0, 5).with_type(JoinType::Full);
    let mut ctx = MockContext::new(&info(Kind::Interval(spec, None)));
    let mut j = IntervalJoin::open(&mut ctx, spec, Txt).unwrap();
    let mut out = Batch::new();
    let mut b = Batch::new();
    b.push_record(Some(b"k"), Some(10), b"l");
    j.process(&mut ctx, 0, &b, &mut out).unwrap();
    let due = ctx.fire_due_event_timers(12);
    j.on_timers(&mut ctx, &due, &mut out).unwrap();
    let mut late = Batch::new();
    late.push_record(Some(b"k"), Some(12), b"r-late");
    late.push_record(Some(b"k"), Some(13), b"r-ok");
    j.process(&mut ctx, 1, &late, &mut out).unwrap();
    let side = ctx.take_side_output(LATE_OUTPUT);
    assert_eq!(lines(&side), ["r-late"]);
    assert_eq!(side.timestamp(0), Some(12));
    assert_eq!(lines(&out), ["k|l|r-ok|-|13"]);
    let due = ctx.fire_due_event_timers(i64::MAX);
    j.on_timers(&mut ctx, &due, &mut out).unwrap();
    assert_eq!(
        lines(&out),
        ["k|l|r-ok|-|13"],
        "both rows matched: nothing padded"
    );
    assert_eq!(ctx.state_entry_count(), 0, "expired rows leave state");
    assert!(ctx.registered_timers().is_empty());
}

#[test]
fn interval_join_folds_into_the_left_accumulator_and_emits_it_at_expiry() {
    /// Keeps the largest right payload per left row; emits it when the row expires.
    struct Best;
    impl IntervalJoinFunction for Best {
        type Acc = Option<Vec<u8>>;
        const EMITS_ON_LEFT_EXPIRY: bool = true;
        fn upper_bound(&self, _key: &[u8], left: Row<'_>, _default: i64) -> i64 {
            // The row carries its own end: "<name>:<end>".
            let s = std::str::from_utf8(left.data).unwrap();
            s.split(':').nth(1).unwrap().parse().unwrap()
        }
        fn join(
            &mut self,
            _k: &[u8],
            _l: Row<'_>,
            acc: &mut Self::Acc,
            r: Row<'_>,
            _o: &mut JoinOutput<'_>,
        ) -> crate::Result<()> {
            if acc.as_deref().is_none_or(|a| r.data > a) {
                *acc = Some(r.data.to_vec());
            }
            Ok(())
        }
        fn left_expired(
            &mut self,
            _k: &[u8],
            l: Row<'_>,
            acc: Self::Acc,
            _m: bool,
            _t: JoinType,
            o: &mut JoinOutput<'_>,
        ) -> crate::Result<()> {
            if let Some(a) = acc {
                o.emit(&[l.data, b"=", &a].concat());
            }
            Ok(())
        }
    }
    let spec = IntervalJoinSpec::between(0, 0);
    let info = {
        let mut i = PluginInfo::operator("best", "0.1.0").side_output(LATE_OUTPUT);
        for d in IntervalJoinSpec::state_descriptors::<Option<Vec<u8>>>(1) {
            i = i.state(d);
        }
        i
    };
    let mut ctx = MockContext::new(&info);
    let mut j = IntervalJoin::open(&mut ctx, spec, Best).unwrap();
    let mut out = Batch::new();
    let push = |side: u32,
                ts: i64,
                d: &str,
                j: &mut IntervalJoin<Best>,
                ctx: &mut MockContext,
                out: &mut Batch| {
        let mut b = Batch::new();
        b.push_record(Some(b"k"), Some(ts), d.as_bytes());
        j.process(ctx, side, &b, out).unwrap();
    };
    push(1, 12, "b", &mut j, &mut ctx, &mut out); // before its auction arrives
    push(0, 10, "a:20", &mut j, &mut ctx, &mut out);
    push(1, 15, "d", &mut j, &mut ctx, &mut out);
    push(1, 20, "c", &mut j, &mut ctx, &mut out); // exactly on the bound
    push(1, 21, "z", &mut j, &mut ctx, &mut out); // past it
    let due = ctx.fire_due_event_timers(19);
    j.on_timers(&mut ctx, &due, &mut out).unwrap();
    assert!(
        out.is_empty(),
        "the row expires only when the watermark reaches 20"
    );
    let due = ctx.fire_due_event_timers(20);
    j.on_timers(&mut ctx, &due, &mut out).unwrap();
    assert_eq!(lines(&out), ["a:20=d"]);
    assert_eq!(out.timestamp(0), Some(20), "stamped with its expiry");
}

#[test]
fn regular_outer_rows_are_emitted_when_their_ttl_ends_or_at_the_end() {
    let spec = RegularJoinSpec::of(JoinType::Full).with_ttl(Some(100), None);
    let mut ctx = MockContext::new(&info(Kind::Regular(spec)));
    let mut j = RegularJoin::open(&mut ctx, spec, Txt).unwrap();
    let mut out = Batch::new();
    let batch = |k: &[u8], d: &str| {
        let mut b = Batch::new();
        b.push_record(Some(k), Some(1), d.as_bytes());
        b
    };
    ctx.set_processing_time(1000);
    j.process(&mut ctx, 0, &batch(b"x", "lx"), &mut out)
        .unwrap();
    j.process(&mut ctx, 0, &batch(b"y", "ly"), &mut out)
        .unwrap();
    j.process(&mut ctx, 1, &batch(b"y", "ry"), &mut out)
        .unwrap();
    j.process(&mut ctx, 1, &batch(b"z", "rz"), &mut out)
        .unwrap();
    assert_eq!(lines(&out), ["y|ly|ry|-|1"]);
    let due = ctx.fire_due_processing_timers(1099);
    assert!(due.is_empty());
    let due = ctx.fire_due_processing_timers(1100);
    j.on_timers(&mut ctx, &due, &mut out).unwrap();
    assert_eq!(
        lines(&out)[1..],
        ["x|lx|-|-|1"],
        "lx expired unmatched; ly matched"
    );
    // A right row for x after its left row expired finds nothing.
    j.process(&mut ctx, 1, &batch(b"x", "rx"), &mut out)
        .unwrap();
    j.finish(&mut ctx, &mut out).unwrap();
    let mut got = lines(&out);
    got.sort();
    assert_eq!(
        got,
        ["x|-|rx|-|1", "x|lx|-|-|1", "y|ly|ry|-|1", "z|-|rz|-|1"]
    );
}

#[test]
fn a_host_state_ttl_on_a_join_state_is_refused() {
    let spec = RegularJoinSpec::inner();
    let mut ctx =
        MockContext::new(&info(Kind::Regular(spec))).with_state_ttl(REGULAR_LEFT_STATE, 10);
    let err = RegularJoin::open(&mut ctx, spec, Txt).unwrap_err();
    assert!(
        err.message.contains("join-left") && err.message.contains("left_ttl_ms"),
        "{}",
        err.message
    );
}

#[test]
fn session_windows_form_over_both_inputs_and_touching_ones_stay_apart() {
    let kind = Kind::Window(WindowJoinSpec::session(10).with_type(JoinType::Full));
    let input = vec![
        rec(0, b'a', 0, "l0"),
        rec(1, b'a', 9, "r9"),   // overlaps [0,10): one session [0,19)
        rec(0, b'a', 19, "l19"), // touches [0,19) at 19: a new session
        rec(1, b'a', 40, "r40"),
    ];
    let got = run(kind, 100, 1, &input, &[1], &[]);
    assert_eq!(got, ["a|-|r40|40|49", "a|l0|r9|0|18", "a|l19|-|19|28"]);
    assert_eq!(got, reference(kind, &input));
}

#[test]
fn a_batch_on_a_third_input_is_an_error() {
    let spec = WindowJoinSpec::tumbling(5);
    let mut ctx = MockContext::new(&info(Kind::Window(spec)));
    let mut j = WindowJoin::open(&mut ctx, spec, Txt).unwrap();
    let mut b = Batch::new();
    b.push_record(Some(b"k"), Some(1), b"x");
    let err = j.process(&mut ctx, 2, &b, &mut Batch::new()).unwrap_err();
    assert!(err.message.contains("input 2"), "{}", err.message);
    assert_eq!(
        err.code,
        crate::ErrorCode::InvalidConfig,
        "a wiring mistake"
    );
    let mut untimed = Batch::new();
    untimed.push_keyed(b"k", b"x");
    assert!(j.process(&mut ctx, 0, &untimed, &mut Batch::new()).is_err());
}

#[test]
fn models_name_the_operator_and_its_parameters() {
    assert_eq!(
        RegularJoinSpec::of(JoinType::Left)
            .with_ttl(Some(5), None)
            .to_model_json(),
        r#"{"operator":"regular-join","type":"left","left_ttl_ms":5,"right_ttl_ms":null}"#
    );
    assert_eq!(
        IntervalJoinSpec::between(-1, 2).to_model_json(),
        r#"{"operator":"interval-join","type":"inner","lower_ms":-1,"upper_ms":2,"left_unique":false}"#
    );
    assert_eq!(
        WindowJoinSpec::session(7).to_model_json(),
        r#"{"operator":"window-join","type":"inner","assigner":"session","gap_ms":7}"#
    );
    assert!(IntervalJoinSpec::between(3, 2).validate().is_err());
    assert!(WindowJoinSpec::tumbling(0).validate().is_err());
    assert!(
        RegularJoinSpec::inner()
            .with_ttl(Some(0), None)
            .validate()
            .is_err()
    );
    let _ = Context::current_watermark(&MockContext::with_states([]));
}

/// Both interval-join states: every (key, rows) of the left and of the right state.
type IntervalState = (
    Vec<(Vec<u8>, Vec<IntervalLeftRow<()>>)>,
    Vec<(Vec<u8>, Vec<IntervalRightRow>)>,
);

fn interval_state(ctx: &mut MockContext) -> IntervalState {
    let left: ValueState<Vec<IntervalLeftRow<()>>> =
        ValueState::open(ctx, INTERVAL_LEFT_STATE).unwrap();
    let right: ValueState<Vec<IntervalRightRow>> =
        ValueState::open(ctx, INTERVAL_RIGHT_STATE).unwrap();
    let lefts = left
        .keys(ctx)
        .into_iter()
        .map(|k| (k.clone(), left.get(ctx, &k).unwrap()))
        .collect();
    let rights = right
        .keys(ctx)
        .into_iter()
        .map(|k| (k.clone(), right.get(ctx, &k).unwrap()))
        .collect();
    (lefts, rights)
}

/// With the row cache, state after `flush` is exactly the state without it, batch by
/// batch and timer by timer, and the output is the same; between flushes the cached
/// instance writes nothing.
#[test]
fn the_interval_row_cache_leaves_state_exact_at_every_flush() {
    let spec = IntervalJoinSpec::between(-3, 2).with_type(JoinType::Full);
    let kind = Kind::Interval(spec, None);
    let mut plain_ctx = MockContext::new(&info(kind));
    let mut cached_ctx = MockContext::new(&info(kind));
    let mut plain = IntervalJoin::open(&mut plain_ctx, spec, Txt).unwrap();
    let mut cached = IntervalJoin::open(&mut cached_ctx, spec, Txt)
        .unwrap()
        .cached();
    let (mut plain_out, mut cached_out) = (Batch::new(), Batch::new());
    let mut wm = i64::MIN;
    for step in 0..60i64 {
        let side = (step % 3 == 0) as u32;
        let mut b = Batch::new();
        for j in 0..4 {
            let key = [b'a' + ((step * 7 + j) % 5) as u8];
            b.push_record(
                Some(&key),
                Some(step * 2 + j),
                format!("{side}-{step}-{j}").as_bytes(),
            );
        }
        plain
            .process(&mut plain_ctx, side, &b, &mut plain_out)
            .unwrap();
        let before = interval_state(&mut cached_ctx);
        cached
            .process(&mut cached_ctx, side, &b, &mut cached_out)
            .unwrap();
        assert_eq!(
            interval_state(&mut cached_ctx),
            before,
            "no write between flushes"
        );
        if step % 4 == 3 {
            wm = step * 2 - 4;
            for (ctx, j, out) in [
                (&mut plain_ctx, &mut plain, &mut plain_out),
                (&mut cached_ctx, &mut cached, &mut cached_out),
            ] {
                ctx.set_watermark(wm);
                let due = ctx.fire_due_event_timers(wm);
                j.on_timers(ctx, &due, out).unwrap();
            }
        }
        if step % 5 == 4 {
            cached.flush(&mut cached_ctx, &mut cached_out).unwrap();
            assert_eq!(
                interval_state(&mut cached_ctx),
                interval_state(&mut plain_ctx),
                "state after the flush at step {step} (watermark {wm})"
            );
        }
    }
    assert!(
        {
            let (l, r) = interval_state(&mut plain_ctx);
            !l.is_empty() && !r.is_empty()
        },
        "the run keeps rows of both sides to compare"
    );
    let (mut p, mut c) = (lines(&plain_out), lines(&cached_out));
    p.sort();
    c.sort();
    assert!(!p.is_empty());
    assert_eq!(c, p);
}
