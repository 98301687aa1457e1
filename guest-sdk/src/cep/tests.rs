//! CEP tests: each pattern construct on hand-traced inputs, ordering, timeouts, skip
//! strategies, state cleanup and restore-at-every-boundary against an uninterrupted run.

use std::collections::BTreeMap;

use super::*;
use crate::{Batch, ErrorCode, MockContext, PluginInfo};

type Ev = String;

fn kind(e: &Ev) -> char {
    e.chars().next().unwrap_or(' ')
}

fn num(e: &Ev) -> i64 {
    e[1..].parse().unwrap_or(0)
}

fn is(c: char) -> impl Fn(&Ev, &MatchSoFar<'_, Ev>) -> bool {
    move |e, _| kind(e) == c
}

fn labels(m: &Match<Ev>) -> String {
    m.iter()
        .map(|(_, e)| e.event.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

fn open(ctx: &mut MockContext, p: Pattern<Ev>, late: LateEvents) -> CepOperator<Ev> {
    CepOperator::open(
        ctx,
        p,
        |r| Ok(Some(String::from_utf8(r.data.to_vec()).unwrap())),
        |m, buf| {
            buf.extend_from_slice(labels(m).as_bytes());
            Ok(())
        },
    )
    .unwrap()
    .late_policy(late)
}

/// `a` then strictly `b`, within 50: the pattern of the timeout tests.
fn a_next_b_within_50() -> Pattern<Ev> {
    Pattern::begin("a")
        .where_("is_a", is('a'))
        .next("b")
        .where_("is_b", is('b'))
        .within(50)
}

/// A mock context and an operator over [`a_next_b_within_50`], dropping late events,
/// with timeouts reported or (`discard`) discarded.
fn open_a_next_b(discard: bool) -> (MockContext, CepOperator<Ev>) {
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &a_next_b_within_50());
    let mut ctx = MockContext::new(&info);
    let op = open(&mut ctx, a_next_b_within_50(), LateEvents::Drop);
    let op = if discard { op.discard_timed_out() } else { op };
    (ctx, op)
}

/// Outputs of one run, per key, in emission order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Outs {
    matches: BTreeMap<String, Vec<String>>,
    timed_out: BTreeMap<String, Vec<String>>,
    late: Vec<String>,
}

fn collect(into: &mut BTreeMap<String, Vec<String>>, b: &Batch) {
    for r in b.iter() {
        let k = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
        into.entry(k)
            .or_default()
            .push(String::from_utf8(r.data.to_vec()).unwrap());
    }
}

/// One input record: (key, timestamp ms, label).
type Rec = (&'static str, i64, String);

/// Feeds `batches`; after each, advances the watermark to `max_ts_seen - lag`; finally to
/// `i64::MAX`. With `restore`, the operator is dropped and re-opened on a clone of the
/// context after every call.
fn run_batches(
    pattern: &dyn Fn() -> Pattern<Ev>,
    batches: &[Vec<Rec>],
    lag: i64,
    restore: bool,
) -> (Outs, MockContext) {
    run_batches_ttl(pattern, batches, lag, restore, false)
}

/// [`run_batches`], with `ttl`: the NFA state has a TTL (which the mock reports but never
/// expires), and a restore re-opens the operator without flushing it first, as a task
/// that crashed right after the call would, reading only what the call left in the host.
fn run_batches_ttl(
    pattern: &dyn Fn() -> Pattern<Ev>,
    batches: &[Vec<Rec>],
    lag: i64,
    restore: bool,
    ttl: bool,
) -> (Outs, MockContext) {
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &pattern());
    let mut ctx = MockContext::new(&info);
    if ttl {
        ctx = ctx.with_state_ttl(NFA_STATE, 60_000);
    }
    let mut op = open(&mut ctx, pattern(), LateEvents::SideOutput);
    let mut outs = Outs::default();
    let mut max_ts = i64::MIN;
    let step = |ctx: &mut MockContext, op: &mut CepOperator<Ev>, wm: i64, outs: &mut Outs| {
        let mut out = Batch::new();
        let timers = ctx.fire_due_event_timers(wm);
        op.on_timers(ctx, &timers, &mut out).unwrap();
        op.on_watermark(ctx, wm, &mut out).unwrap();
        for r in out.iter() {
            // Output timestamp is the last event's timestamp: never beyond the watermark.
            assert!(r.timestamp.unwrap() <= wm);
        }
        collect(&mut outs.matches, &out);
    };
    // A restore starts from a checkpoint, and a checkpoint first runs
    // `prepare_checkpoint` (here `flush`), which writes the cached keys back.
    let reopen = |ctx: &mut MockContext, op: &mut CepOperator<Ev>, outs: &mut Outs| {
        if restore {
            if !ttl {
                let mut out = Batch::new();
                op.flush(ctx, &mut out).unwrap();
                collect(&mut outs.matches, &out);
            }
            let mut fresh = ctx.clone();
            *op = open(&mut fresh, pattern(), LateEvents::SideOutput);
            *ctx = fresh;
        }
    };
    for b in batches {
        let mut input = Batch::new();
        for (k, ts, l) in b {
            input.push_record(Some(k.as_bytes()), Some(*ts), l.as_bytes());
            max_ts = max_ts.max(*ts);
        }
        let mut out = Batch::new();
        op.process(&mut ctx, &input, &mut out).unwrap();
        assert!(out.is_empty());
        reopen(&mut ctx, &mut op, &mut outs);
        step(&mut ctx, &mut op, max_ts.saturating_sub(lag), &mut outs);
        reopen(&mut ctx, &mut op, &mut outs);
    }
    step(&mut ctx, &mut op, i64::MAX, &mut outs);
    let mut out = Batch::new();
    op.flush(&mut ctx, &mut out).unwrap();
    assert!(out.is_empty());
    collect(&mut outs.timed_out, &ctx.take_side_output(TIMED_OUT));
    outs.late = ctx
        .take_side_output(LATE)
        .iter()
        .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
        .collect();
    (outs, ctx)
}

/// One key, events at 10 ms spacing, one record per batch, watermark right behind.
fn run_one(pattern: &dyn Fn() -> Pattern<Ev>, events: &str) -> Vec<String> {
    let batches: Vec<Vec<Rec>> = events
        .split_whitespace()
        .enumerate()
        .map(|(i, l)| vec![("k", i as i64 * 10, l.to_string())])
        .collect();
    let (outs, _) = run_batches(pattern, &batches, 0, false);
    outs.matches.get("k").cloned().unwrap_or_default()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn next_followed_by_and_followed_by_any_differ() {
    let input = "a1 c a2 b1 b2";
    let strict = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .next("b")
            .where_("is_b", is('b'))
    };
    assert_eq!(run_one(&strict, input), s(&["a2 b1"]));
    let relaxed = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .followed_by("b")
            .where_("is_b", is('b'))
    };
    assert_eq!(run_one(&relaxed, input), s(&["a1 b1", "a2 b1"]));
    let any = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .followed_by_any("b")
            .where_("is_b", is('b'))
    };
    assert_eq!(
        sorted(run_one(&any, input)),
        s(&["a1 b1", "a1 b2", "a2 b1", "a2 b2"])
    );
}

#[test]
fn times_relaxed_and_consecutive() {
    let input = "a1 a2 x a3 a4";
    let relaxed = || Pattern::begin("a").where_("is_a", is('a')).times(3);
    assert_eq!(run_one(&relaxed, input), s(&["a1 a2 a3", "a2 a3 a4"]));
    let consecutive = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .times(3)
            .consecutive()
    };
    assert!(run_one(&consecutive, input).is_empty());
    assert_eq!(
        run_one(&consecutive, "a1 a2 a3 a4"),
        s(&["a1 a2 a3", "a2 a3 a4"])
    );
    let range = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .times_range(2, 3)
            .consecutive()
    };
    assert_eq!(
        run_one(&range, "a1 a2 a3 x"),
        s(&["a1 a2", "a1 a2 a3", "a2 a3"])
    );
}

/// Flink's documented example: `c` followed by `a+` followed by `b` over C D A1 A2 A3 D A4 B.
#[test]
fn one_or_more_relaxed_consecutive_and_combinations() {
    let input = "c d a1 a2 a3 d a4 b";
    let base = || {
        Pattern::begin("c")
            .where_("is_c", is('c'))
            .followed_by("a")
            .where_("is_a", is('a'))
            .one_or_more()
    };
    let end = |p: Pattern<Ev>| p.followed_by("b").where_("is_b", is('b'));
    assert_eq!(
        run_one(&|| end(base()), input),
        s(&["c a1 b", "c a1 a2 b", "c a1 a2 a3 b", "c a1 a2 a3 a4 b"])
    );
    assert_eq!(
        run_one(&|| end(base().consecutive()), input),
        s(&["c a1 b", "c a1 a2 b", "c a1 a2 a3 b"])
    );
    assert_eq!(
        sorted(run_one(&|| end(base().allow_combinations()), input)),
        sorted(s(&[
            "c a1 b",
            "c a1 a2 b",
            "c a1 a3 b",
            "c a1 a4 b",
            "c a1 a2 a3 b",
            "c a1 a2 a4 b",
            "c a1 a3 a4 b",
            "c a1 a2 a3 a4 b",
        ]))
    );
}

#[test]
fn optional_stage_matches_with_and_without() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .followed_by("b")
            .where_("is_b", is('b'))
            .optional()
            .followed_by("c")
            .where_("is_c", is('c'))
    };
    assert_eq!(sorted(run_one(&p, "a1 b1 c1")), s(&["a1 b1 c1", "a1 c1"]));
    assert_eq!(run_one(&p, "a1 x c1"), s(&["a1 c1"]));
}

#[test]
fn or_conditions_and_until() {
    let p = |with_or: bool| {
        let first = Pattern::begin("first").where_("is_a", is('a'));
        let first = if with_or {
            first.or("is_b", is('b'))
        } else {
            first
        };
        first.followed_by("c").where_("is_c", is('c'))
    };
    assert_eq!(run_one(&|| p(true), "a1 b1 d c1"), s(&["a1 c1", "b1 c1"]));
    assert_eq!(run_one(&|| p(false), "a1 b1 d c1"), s(&["a1 c1"]));
    // (a || b) && value > 1: `where_` after `or` ANDs with the disjunction.
    let q = || {
        Pattern::begin("x")
            .where_("is_a", is('a'))
            .or("is_b", is('b'))
            .where_("gt1", |e: &Ev, _| num(e) > 1)
    };
    assert_eq!(run_one(&q, "a1 b2 c3 a4"), s(&["b2", "a4"]));

    let looped = |until: bool| {
        let p = Pattern::begin("a").where_("is_a", is('a')).one_or_more();
        let p = if until { p.until("is_x", is('x')) } else { p };
        p.followed_by("b").where_("is_b", is('b'))
    };
    assert_eq!(
        sorted(run_one(&|| looped(true), "a1 a2 x a3 b")),
        s(&["a1 a2 b", "a1 b", "a2 b", "a3 b"])
    );
    assert_eq!(
        sorted(run_one(&|| looped(false), "a1 a2 x a3 b")),
        s(&[
            "a1 a2 a3 b",
            "a1 a2 b",
            "a1 a3 b",
            "a1 b",
            "a2 a3 b",
            "a2 b",
            "a3 b"
        ])
        .into_iter()
        // relaxed inner contiguity takes the first matching event only: no a1 a3
        .filter(|m| m != "a1 a3 b")
        .collect::<Vec<_>>()
    );
}

/// Iterative condition: a strictly rising run of two values right after a value below 10.
#[test]
fn iterative_condition_sees_previous_events() {
    let p = || {
        Pattern::begin("low")
            .where_("below_10", |e: &Ev, _| num(e) < 10)
            .next("up")
            .where_("above_previous", |e: &Ev, m: &MatchSoFar<'_, Ev>| {
                m.last_event().is_some_and(|prev| num(e) > num(prev))
            })
            .times(2)
            .consecutive()
    };
    assert_eq!(run_one(&p, "v5 v7 v6 v8 v9"), s(&["v6 v8 v9"]));
    // MatchSoFar by stage name: above the *first* value of the match.
    let q = || {
        Pattern::begin("low")
            .where_("any", |_: &Ev, _| true)
            .next("up")
            .where_("above_low", |e: &Ev, m: &MatchSoFar<'_, Ev>| {
                m.first("low").is_some_and(|l| num(e) > num(l)) && m.count("low") == 1
            })
    };
    assert_eq!(run_one(&q, "v5 v7 v6 v8"), s(&["v5 v7", "v6 v8"]));
}

#[test]
fn within_prunes_at_start_plus_within_and_reports_timeouts() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .followed_by("b")
            .where_("is_b", is('b'))
            .within(10)
    };
    let recs: Vec<Rec> = vec![
        ("k", 0, "a0".into()),
        ("k", 5, "a5".into()),
        ("k", 12, "b12".into()), // 12 - 0 >= 10: a0 timed out; 12 - 5 < 10: match
        ("k", 20, "a20".into()),
        ("k", 30, "b30".into()), // exactly start + within: outside the window
        ("k", 40, "a40".into()),
        ("k", 49, "b49".into()), // 9 ms after: inside
    ];
    let batches: Vec<Vec<Rec>> = recs.into_iter().map(|r| vec![r]).collect();
    let (outs, ctx) = run_batches(&p, &batches, 0, false);
    assert_eq!(outs.matches["k"], s(&["a5 b12", "a40 b49"]));
    assert_eq!(outs.timed_out["k"], s(&["a0", "a20"]));
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

#[test]
fn timed_out_side_output_carries_key_and_last_timestamp() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .followed_by("b")
            .where_("is_b", is('b'))
            .times(2)
            .within(100)
    };
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p());
    let mut ctx = MockContext::new(&info);
    let mut op = open(&mut ctx, p(), LateEvents::Drop);
    let mut input = Batch::new();
    input.push_record(Some(b"k1"), Some(1_000), b"a1");
    input.push_record(Some(b"k1"), Some(1_050), b"b1");
    op.process(&mut ctx, &input, &mut Batch::new()).unwrap();
    // Checkpoints (flush) write each key's timer to the host: first at its earliest
    // queued event, then at its partial match's deadline.
    let mut out = Batch::new();
    op.flush(&mut ctx, &mut out).unwrap();
    assert_eq!(
        ctx.registered_timers(),
        vec![FiredTimer::event_time(b"k1", CEP_NAMESPACE, 1_000)]
    );
    let t = ctx.fire_due_event_timers(1_099);
    op.on_timers(&mut ctx, &t, &mut out).unwrap();
    op.on_watermark(&mut ctx, 1_099, &mut out).unwrap();
    assert!(ctx.take_side_output(TIMED_OUT).is_empty());
    op.flush(&mut ctx, &mut out).unwrap();
    let t = ctx.fire_due_event_timers(1_100);
    assert_eq!(
        crate::TimerGroup::flatten(&t),
        vec![FiredTimer::event_time(b"k1", CEP_NAMESPACE, 1_100)]
    );
    op.on_timers(&mut ctx, &t, &mut out).unwrap();
    op.on_watermark(&mut ctx, 1_100, &mut out).unwrap();
    assert!(out.is_empty());
    let to = ctx.take_side_output(TIMED_OUT);
    assert_eq!(to.len(), 1);
    assert_eq!(to.key(0), Some(&b"k1"[..]));
    assert_eq!(to.timestamp(0), Some(1_050));
    assert_eq!(to.record(0), b"a1 b1");
    // The next checkpoint deletes the finished key's state and leaves no timer.
    op.flush(&mut ctx, &mut out).unwrap();
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

use crate::FiredTimer;

#[test]
fn discarded_timeouts_leave_matches_and_cleanup_unchanged() {
    // Every `a` starts a run; most time out. Same matches, no side output, state empty.
    let input: Vec<(&str, i64, &str)> = vec![
        ("k", 0, "a0"),
        ("k", 100, "a100"),
        ("k", 120, "b120"),
        ("j", 10, "a10"),
        ("k", 200, "a200"),
        ("j", 300, "a300"),
        ("j", 320, "b320"),
    ];
    let run = |discard: bool| {
        let (mut ctx, mut op) = open_a_next_b(discard);
        let mut b = Batch::new();
        for (k, ts, l) in &input {
            b.push_record(Some(k.as_bytes()), Some(*ts), l.as_bytes());
        }
        op.process(&mut ctx, &b, &mut Batch::new()).unwrap();
        let mut out = Batch::new();
        let t = ctx.fire_due_event_timers(i64::MAX);
        op.on_timers(&mut ctx, &t, &mut out).unwrap();
        op.on_watermark(&mut ctx, i64::MAX, &mut out).unwrap();
        let mut matches: Vec<String> = out
            .iter()
            .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
            .collect();
        matches.sort();
        let timed_out = ctx.take_side_output(TIMED_OUT).len();
        assert_eq!(ctx.state_entry_count(), 0);
        assert!(ctx.registered_timers().is_empty());
        (matches, timed_out)
    };
    let (kept, timed_out) = run(false);
    assert_eq!(kept, ["a100 b120", "a300 b320"]);
    assert_eq!(timed_out, 3);
    assert_eq!(run(true), (kept, 0));
}

#[test]
fn not_next_and_not_followed_by() {
    let nn = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .not_next("x")
            .where_("is_x", is('x'))
            .followed_by("b")
            .where_("is_b", is('b'))
    };
    assert_eq!(run_one(&nn, "a1 x b1 a2 y b2"), s(&["a2 b2"]));
    // not_next only looks at the very next event.
    assert_eq!(run_one(&nn, "a1 y x b1"), s(&["a1 b1"]));
    let nfb = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .not_followed_by("x")
            .where_("is_x", is('x'))
            .followed_by("b")
            .where_("is_b", is('b'))
    };
    assert_eq!(run_one(&nfb, "a1 c x b1 a2 c b2"), s(&["a2 b2"]));
    assert_eq!(run_one(&nfb, "a1 y x b1"), Vec::<String>::new());
}

/// Absence: `a` not followed by `x` within 10 ms completes by timeout, exactly once.
#[test]
fn absence_pattern_fires_once_on_timeout() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .not_followed_by("x")
            .where_("is_x", is('x'))
            .within(10)
    };
    let batches: Vec<Vec<Rec>> = vec![
        vec![
            ("k1", 0, "a0".into()),
            ("k2", 0, "a0".into()),
            ("k3", 0, "a0".into()),
        ],
        vec![("k1", 3, "y3".into()), ("k2", 5, "x5".into())],
        vec![("k3", 10, "x10".into())], // at start + within: outside, does not prevent
        vec![("k1", 11, "y11".into())],
        vec![("k1", 30, "y30".into())],
    ];
    // Watermark steps 0, 5, 10, 11, 30 then MAX: several chances to fire twice.
    let (outs, ctx) = run_batches(&p, &batches, 0, false);
    assert_eq!(outs.matches.get("k1"), Some(&s(&["a0"])));
    assert_eq!(outs.matches.get("k2"), None);
    assert_eq!(outs.matches.get("k3"), Some(&s(&["a0"])));
    assert!(outs.timed_out.is_empty());
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

/// Same input, five strategies, five different outputs (hand-traced; `b`'s digit must equal
/// the first `a`'s digit).
#[test]
fn skip_strategies_give_their_distinct_outputs() {
    let p = |skip: AfterMatchSkip| {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .one_or_more()
            .followed_by("b")
            .where_("is_b_of_first_a", |e: &Ev, m: &MatchSoFar<'_, Ev>| {
                kind(e) == 'b' && m.first("a").is_some_and(|a| num(a) == num(e))
            })
            .after_match(skip)
    };
    let run = |skip: AfterMatchSkip| {
        let mut batches: Vec<Vec<Rec>> = Vec::new();
        for (i, (l1, l2)) in ["a1", "a2", "a3", "b1", "b2", "b3"]
            .iter()
            .zip(["a1", "a2", "a3", "b2", "b1", "b3"])
            .enumerate()
        {
            batches.push(vec![
                ("k1", i as i64 * 10, l1.to_string()),
                ("k2", i as i64 * 10, l2.to_string()),
            ]);
        }
        let (outs, _) = run_batches(&|| p(skip.clone()), &batches, 0, false);
        (
            outs.matches.get("k1").cloned().unwrap_or_default(),
            outs.matches.get("k2").cloned().unwrap_or_default(),
        )
    };
    assert_eq!(
        run(AfterMatchSkip::NoSkip),
        (
            s(&[
                "a1 b1",
                "a1 a2 b1",
                "a1 a2 a3 b1",
                "a2 b2",
                "a2 a3 b2",
                "a3 b3"
            ]),
            s(&[
                "a2 b2",
                "a2 a3 b2",
                "a1 b1",
                "a1 a2 b1",
                "a1 a2 a3 b1",
                "a3 b3"
            ])
        )
    );
    assert_eq!(
        run(AfterMatchSkip::SkipToNext),
        (s(&["a1 b1", "a2 b2", "a3 b3"]), s(&["a2 b2", "a3 b3"]))
    );
    assert_eq!(
        run(AfterMatchSkip::SkipPastLastEvent),
        (s(&["a1 b1"]), s(&["a2 b2"]))
    );
    assert_eq!(
        run(AfterMatchSkip::SkipToFirst("a".into())),
        (
            s(&[
                "a1 b1",
                "a1 a2 b1",
                "a1 a2 a3 b1",
                "a2 b2",
                "a2 a3 b2",
                "a3 b3"
            ]),
            s(&["a2 b2", "a2 a3 b2", "a3 b3"])
        )
    );
    assert_eq!(
        run(AfterMatchSkip::SkipToLast("a".into())),
        (
            s(&["a1 b1", "a1 a2 b1", "a2 b2", "a2 a3 b2", "a3 b3"]),
            s(&["a2 b2", "a2 a3 b2", "a3 b3"])
        )
    );
}

/// A small deterministic generator (xorshift) for the randomized tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// Random events per key with unique timestamps; returned in timestamp order.
fn random_events(seed: u64, n: usize) -> Vec<Rec> {
    let mut rng = Rng(seed);
    let mut ts = [0i64; 4];
    let mut v: Vec<Rec> = (0..n)
        .map(|_| {
            let k = rng.below(4) as usize;
            ts[k] += 1 + rng.below(6) as i64;
            let l = format!(
                "{}{}",
                ['a', 'b', 'c', 'x'][rng.below(4) as usize],
                rng.below(10)
            );
            (KEYS[k], ts[k] * 4 + k as i64, l)
        })
        .collect();
    v.sort_by_key(|r| r.1);
    v
}

fn rich_pattern() -> Pattern<Ev> {
    Pattern::begin("a")
        .where_("is_a", is('a'))
        .followed_by("b")
        .where_("is_b_ge_a", |e: &Ev, m: &MatchSoFar<'_, Ev>| {
            kind(e) == 'b' && m.last("a").is_some_and(|a| num(e) >= num(a))
        })
        .one_or_more()
        .not_followed_by("x")
        .where_("is_x", is('x'))
        .followed_by("c")
        .where_("is_c", is('c'))
        .within(60)
        .after_match(AfterMatchSkip::SkipToNext)
}

/// Out-of-order arrival within the watermark's lag gives the same matches as sorted input.
#[test]
fn out_of_order_within_lag_equals_sorted_input() {
    for seed in [7u64, 99, 12345] {
        let sorted_events = random_events(seed, 400);
        let in_order: Vec<Vec<Rec>> = sorted_events.chunks(7).map(<[Rec]>::to_vec).collect();
        let (want, ctx) = run_batches(&rich_pattern, &in_order, 0, false);
        assert!(want.late.is_empty());
        assert!(
            want.matches.values().map(Vec::len).sum::<usize>() > 5,
            "the input should produce matches: {want:?}"
        );
        assert!(ctx.registered_timers().is_empty());
        assert_eq!(ctx.state_entry_count(), 0);
        // Shuffle inside windows of 16 records (max displacement < lag in time).
        let mut rng = Rng(seed ^ 0xfeed);
        let mut shuffled = sorted_events.clone();
        for chunk in shuffled.chunks_mut(16) {
            for i in (1..chunk.len()).rev() {
                chunk.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        // The watermark lag that makes no record late: the largest distance by which a
        // record trails the maximum timestamp seen before it.
        let mut seen = i64::MIN;
        let mut lag = 0;
        for r in &shuffled {
            seen = seen.max(r.1);
            lag = lag.max(seen - r.1 + 1);
        }
        assert!(lag > 0, "the shuffle must reorder");
        let batches: Vec<Vec<Rec>> = shuffled.chunks(5).map(<[Rec]>::to_vec).collect();
        let (got, ctx) = run_batches(&rich_pattern, &batches, lag, false);
        assert!(got.late.is_empty());
        assert_eq!(got, want, "seed {seed}");
        assert_eq!(ctx.state_entry_count(), 0);
    }
}

/// Restore at every call boundary (clone the durable context, drop the operator, open a
/// fresh one) gives exactly the uninterrupted output. With a TTL on its state the operator
/// keeps nothing between calls, so the restore needs no flush first (what a crash right
/// after the call would leave), and its uninterrupted output is the same too.
#[test]
fn restore_at_every_boundary_equals_uninterrupted_run() {
    for seed in [3u64, 4242] {
        let events = random_events(seed, 300);
        let batches: Vec<Vec<Rec>> = events.chunks(3).map(<[Rec]>::to_vec).collect();
        let (want, _) = run_batches(&rich_pattern, &batches, 13, false);
        for (restore, ttl) in [(true, false), (true, true), (false, true)] {
            let (got, ctx) = run_batches_ttl(&rich_pattern, &batches, 13, restore, ttl);
            assert_eq!(got, want, "seed {seed}, restore {restore}, ttl {ttl}");
            assert_eq!(ctx.state_entry_count(), 0);
            assert!(ctx.registered_timers().is_empty());
        }
    }
}

/// Without a TTL the operator keeps a key's state in the instance until a checkpoint;
/// with one, every call writes it to the host.
#[test]
fn a_ttl_leaves_nothing_cached_between_calls() {
    // Without a TTL, state lives in the instance between checkpoints.
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &rich_pattern());
    let mut ctx = MockContext::new(&info);
    let mut op = open(&mut ctx, rich_pattern(), LateEvents::Drop);
    let mut input = Batch::new();
    input.push_record(Some(b"k0"), Some(10), b"a1");
    op.process(&mut ctx, &input, &mut Batch::new()).unwrap();
    assert_eq!(ctx.state_entry_count(), 0, "cached, not yet written");
    let mut ctx = ctx.with_state_ttl(BUFFER_STATE, 1);
    let mut op = open(&mut ctx, rich_pattern(), LateEvents::Drop);
    op.process(&mut ctx, &input, &mut Batch::new()).unwrap();
    assert!(ctx.state_entry_count() > 0, "written within the call");
}

#[test]
fn late_records_go_to_the_late_side_output() {
    let p = || Pattern::begin("a").where_("is_a", is('a'));
    let batches: Vec<Vec<Rec>> = vec![
        vec![("k", 100, "a1".into())],
        vec![
            ("k", 100, "a2".into()),
            ("k", 50, "a3".into()),
            ("k", 101, "a4".into()),
        ],
    ];
    let (outs, _) = run_batches(&p, &batches, 0, false);
    assert_eq!(outs.matches["k"], s(&["a1", "a4"]));
    assert_eq!(outs.late, s(&["a2", "a3"]));
}

#[test]
fn equal_timestamps_keep_arrival_order() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .next("b")
            .where_("is_b", is('b'))
    };
    let batches: Vec<Vec<Rec>> = vec![
        vec![("k", 5, "a1".into()), ("k", 9, "b2".into())],
        vec![("k", 5, "b1".into()), ("k", 9, "a2".into())],
    ];
    let (outs, _) = run_batches(&p, &batches, 100, false);
    assert_eq!(outs.matches["k"], s(&["a1 b1"]));
}

#[test]
fn records_without_key_or_timestamp_are_invalid() {
    let p = || Pattern::<Ev>::begin("a");
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p());
    let mut ctx = MockContext::new(&info);
    let mut op = open(&mut ctx, p(), LateEvents::Drop);
    let mut b = Batch::new();
    b.push_record(Some(b"k"), None, b"a");
    let e = op.process(&mut ctx, &b, &mut Batch::new()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRecord);
    let mut b = Batch::new();
    b.push_record(None, Some(1), b"a");
    let e = op.process(&mut ctx, &b, &mut Batch::new()).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRecord);
    assert_eq!(ctx.state_entry_count(), 0);
}

#[test]
fn invalid_patterns_are_config_errors() {
    let bad: Vec<Pattern<Ev>> = vec![
        Pattern::begin("a").next("a"),
        Pattern::begin("a").optional(),
        Pattern::begin("a").times(0),
        Pattern::begin("a").times_range(3, 2),
        Pattern::begin("a").not_next("x"),
        Pattern::begin("a").not_followed_by("x"),
        Pattern::begin("a")
            .not_followed_by("x")
            .times(2)
            .followed_by("b"),
        Pattern::begin("a").within(0),
        Pattern::begin("a").after_match(AfterMatchSkip::SkipToLast("z".into())),
    ];
    for p in bad {
        let e = p.validate().unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{p:?}");
    }
    assert!(
        Pattern::<Ev>::begin("a")
            .not_followed_by("x")
            .within(5)
            .validate()
            .is_ok()
    );
}

#[test]
fn model_json_names_everything_that_defines_the_pattern() {
    let p = Pattern::<Ev>::begin("first")
        .where_("late", |_, _| true)
        .or("cancel\"led", |_, _| true)
        .next("second")
        .where_("late", |_, _| true)
        .times_range(1, 2)
        .consecutive()
        .not_followed_by("x")
        .within(1000)
        .after_match(AfterMatchSkip::SkipToFirst("second".into()));
    assert_eq!(
        p.to_model_json(),
        concat!(
            r#"{"type":"cep","version":1,"stages":["#,
            r#"{"name":"first","kind":"positive","contiguity":"relaxed","min":1,"max":1,"optional":false,"inner":"relaxed","condition":{"or":["late","cancel\"led"]},"until":null},"#,
            r#"{"name":"second","kind":"positive","contiguity":"strict","min":1,"max":2,"optional":false,"inner":"strict","condition":"late","until":null},"#,
            r#"{"name":"x","kind":"not_followed_by","contiguity":"relaxed","min":1,"max":1,"optional":false,"inner":"relaxed","condition":true,"until":null}],"#,
            r#""within_ms":1000,"skip":{"strategy":"skip_to_first","stage":"second"}}"#
        )
    );
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p);
    assert_eq!(info.model.as_deref(), Some(p.to_model_json().as_str()));
    assert_eq!(
        info.side_outputs,
        vec![TIMED_OUT.to_string(), LATE.to_string()]
    );
    assert_eq!(info.states.len(), 3);
}

/// More keys than [`MAX_CACHED_KEYS`] in one call: the decoded copy is written back and
/// dropped (state and one host timer per key), the next call reads the keys back from
/// host state, and the host timers fire them: every key still matches exactly once,
/// and a checkpoint leaves no state and no timer behind.
#[test]
fn keys_past_the_cache_limit_are_written_back_and_read_again() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .next("b")
            .where_("is_b", is('b'))
            .within(100)
    };
    let n = MAX_CACHED_KEYS + 10;
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p());
    let mut ctx = MockContext::new(&info);
    let mut op = open(&mut ctx, p(), LateEvents::Drop);
    let batch = |label: &str, ts: i64| {
        let mut b = Batch::new();
        for k in &keys {
            b.push_record(Some(k.as_bytes()), Some(ts), label.as_bytes());
        }
        b
    };
    op.process(&mut ctx, &batch("a", 10), &mut Batch::new())
        .unwrap();
    // Written back past the limit: one queue entry and one timer per key at the host, in
    // calls of STATE_WRITE_CHUNK keys (a state memory budget applies between them).
    assert_eq!(ctx.registered_timers().len(), n);
    assert_eq!(ctx.largest_put_many(), crate::STATE_WRITE_CHUNK);
    op.process(&mut ctx, &batch("b", 20), &mut Batch::new())
        .unwrap();
    let mut out = Batch::new();
    let timers = ctx.fire_due_event_timers(30);
    op.on_timers(&mut ctx, &timers, &mut out).unwrap();
    op.on_watermark(&mut ctx, 30, &mut out).unwrap();
    let mut matched: Vec<String> = out
        .iter()
        .map(|r| {
            assert_eq!(r.data, b"a b");
            String::from_utf8(r.key.unwrap().to_vec()).unwrap()
        })
        .collect();
    matched.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(matched, want);
    op.flush(&mut ctx, &mut out).unwrap();
    assert_eq!(out.len(), n);
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

#[test]
fn idle_keys_are_dropped_before_a_full_cache_writes_anything_back() {
    let p = || {
        Pattern::begin("a")
            .where_("is_a", is('a'))
            .next("b")
            .where_("is_b", is('b'))
            .within(100)
    };
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p());
    let mut ctx = MockContext::new(&info);
    let mut op = open(&mut ctx, p(), LateEvents::Drop);
    let mut out = Batch::new();
    // As many keys as the cache holds, each with one event that starts no partial
    // match: run at the watermark, they are empty and stay cached, idle.
    let mut b = Batch::new();
    for i in 0..MAX_CACHED_KEYS {
        b.push_record(Some(format!("x{i}").as_bytes()), Some(10), b"x");
    }
    op.process(&mut ctx, &b, &mut out).unwrap();
    op.on_watermark(&mut ctx, 20, &mut out).unwrap();
    assert!(out.is_empty());
    // Ten keys more go past the limit: the idle keys are dropped, nothing is written
    // back (the new keys' queues stay in the instance), and the new keys still match.
    let mut b = Batch::new();
    for i in 0..10 {
        b.push_record(Some(format!("n{i}").as_bytes()), Some(30), b"a");
    }
    op.process(&mut ctx, &b, &mut out).unwrap();
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
    let mut b = Batch::new();
    for i in 0..10 {
        b.push_record(Some(format!("n{i}").as_bytes()), Some(40), b"b");
    }
    // One dropped key comes back: loaded as absent, it starts afresh.
    b.push_record(Some(b"x0"), Some(40), b"a");
    b.push_record(Some(b"x0"), Some(41), b"b");
    op.process(&mut ctx, &b, &mut out).unwrap();
    op.on_watermark(&mut ctx, 50, &mut out).unwrap();
    let mut matched = BTreeMap::new();
    collect(&mut matched, &out);
    let mut want: BTreeMap<String, Vec<String>> = (0..10)
        .map(|i| (format!("n{i}"), vec!["a b".to_string()]))
        .collect();
    want.insert("x0".into(), vec!["a b".into()]);
    assert_eq!(matched, want);
    op.flush(&mut ctx, &mut out).unwrap();
    assert_eq!(ctx.state_entry_count(), 0);
    assert!(ctx.registered_timers().is_empty());
}

#[test]
fn keys_due_at_one_time_run_in_key_order_whatever_their_arrival() {
    // One-stage pattern: every `a` is a match when its key runs, so the output order is
    // the order the keys ran in: by time, then key bytes.
    let p = || Pattern::begin("a").where_("is_a", is('a')).within(100);
    let info = CepOperator::declare(PluginInfo::operator("t", "0.1.0"), &p());
    for arrival in [
        &["k9", "k3", "k5", "k1", "k10"][..],
        &["k1", "k10", "k3", "k5", "k9"],
        &["k5", "k9", "k10", "k1", "k3"],
    ] {
        let mut ctx = MockContext::new(&info);
        let mut op = open(&mut ctx, p(), LateEvents::Drop);
        let mut b = Batch::new();
        // `k7` one millisecond earlier; `k3` first queued at 12, then at 10 (its
        // timer moves, leaving a stale entry at 12).
        b.push_record(Some(b"k7"), Some(9), b"a");
        for k in arrival {
            if *k == "k3" {
                b.push_record(Some(b"k3"), Some(12), b"a");
            }
            b.push_record(Some(k.as_bytes()), Some(10), b"a");
        }
        let mut out = Batch::new();
        op.process(&mut ctx, &b, &mut out).unwrap();
        op.on_watermark(&mut ctx, 20, &mut out).unwrap();
        let got: Vec<(String, i64)> = out
            .iter()
            .map(|r| {
                (
                    String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                    r.timestamp.unwrap(),
                )
            })
            .collect();
        let want: Vec<(String, i64)> = [
            ("k7", 9),
            ("k1", 10),
            ("k10", 10),
            ("k3", 10),
            ("k3", 12),
            ("k5", 10),
            ("k9", 10),
        ]
        .iter()
        .map(|(k, t)| (k.to_string(), *t))
        .collect();
        assert_eq!(got, want, "arrival {arrival:?}");
    }
}

#[test]
fn a_silently_expired_partial_match_leaves_host_state_at_the_next_write_back() {
    // With timeouts discarded, deadlines take no timer in the instance: `k`'s partial
    // match expires with no event after it and is pruned by the sweep before the
    // write-back, not by a run of its own. Outputs equal the reporting operator's matches.
    let timers = |ctx: &MockContext| -> Vec<(i64, Vec<u8>)> {
        ctx.registered_timers()
            .into_iter()
            .map(|t| (t.timestamp, t.key))
            .collect()
    };
    let run = |discard: bool| {
        let (mut ctx, mut op) = open_a_next_b(discard);
        let mut out = Batch::new();
        let mut b = Batch::new();
        b.push_record(Some(b"k"), Some(0), b"a0");
        b.push_record(Some(b"j"), Some(10), b"a10");
        op.process(&mut ctx, &b, &mut out).unwrap();
        ctx.set_watermark(20);
        op.on_watermark(&mut ctx, 20, &mut out).unwrap();
        // A checkpoint: both partial matches are live, their host timers at their
        // deadlines (for a restore).
        op.flush(&mut ctx, &mut out).unwrap();
        assert_eq!(timers(&ctx), [(50, b"k".to_vec()), (60, b"j".to_vec())]);
        assert!(ctx.state_entry_count() > 0);
        let mut b = Batch::new();
        b.push_record(Some(b"j"), Some(55), b"b55");
        op.process(&mut ctx, &b, &mut out).unwrap();
        ctx.set_watermark(100);
        let fired = ctx.fire_due_event_timers(100);
        op.on_timers(&mut ctx, &fired, &mut out).unwrap();
        op.on_watermark(&mut ctx, 100, &mut out).unwrap();
        op.flush(&mut ctx, &mut out).unwrap();
        assert_eq!(ctx.state_entry_count(), 0, "discard {discard}");
        assert!(timers(&ctx).is_empty(), "discard {discard}");
        let matches: Vec<String> = out
            .iter()
            .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
            .collect();
        (matches, ctx.take_side_output(TIMED_OUT).len())
    };
    assert_eq!(run(false), (vec!["a10 b55".to_string()], 1));
    assert_eq!(run(true), (vec!["a10 b55".to_string()], 0));
}

#[test]
fn with_silent_expiry_keys_run_in_the_order_of_their_earliest_queued_event() {
    // `k` holds a partial match (deadline 50) when the watermark jumps to 200 over both
    // keys' events. Reporting timeouts, `k` runs first (its timer is the deadline, 50);
    // with silent expiry its timer is its first queued event (100), after `j`'s (60). Each
    // key's matches are the same either way. (Found by a review of the change.)
    let run = |discard: bool| {
        let (mut ctx, mut op) = open_a_next_b(discard);
        let mut out = Batch::new();
        let mut b = Batch::new();
        b.push_record(Some(b"k"), Some(0), b"a0");
        op.process(&mut ctx, &b, &mut out).unwrap();
        op.on_watermark(&mut ctx, 10, &mut out).unwrap();
        let mut b = Batch::new();
        for (k, t, l) in [
            ("k", 100, "a100"),
            ("k", 110, "b110"),
            ("j", 60, "a60"),
            ("j", 70, "b70"),
        ] {
            b.push_record(Some(k.as_bytes()), Some(t), l.as_bytes());
        }
        op.process(&mut ctx, &b, &mut out).unwrap();
        op.on_watermark(&mut ctx, 200, &mut out).unwrap();
        out.iter()
            .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(false), ["a100 b110", "a60 b70"]);
    assert_eq!(run(true), ["a60 b70", "a100 b110"]);
}
