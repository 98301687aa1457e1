//! Randomized differential test of `KeyedCount`'s write-back cache against a direct
//! HashMap counter, with checkpoints and crash-restores (the instance dropped without a
//! write-back, a fresh one restored from the host state of the last checkpoint and the
//! records after it replayed in other batch sizes). Every batch's output, the host state at
//! every checkpoint, after every batch with a TTL and after `finish` must equal the
//! counter's. A divergence is shrunk to a minimal sequence of operations and printed.
//!
//! The suite runs a few scenarios (about 10 s); a review runs thousands:
//! `KC_SEED=7 KC_SMALL=4000 KC_LARGE=40 cargo test -p keyed-count --release differential
//! -- --nocapture`. Env: `KC_SEED` (first seed, default 1), `KC_SMALL` (small and medium
//! scenarios, default 100), `KC_LARGE` (scenarios that fill the 65,536-key or 4 MiB cache
//! and run through its bypass, default 3), `KC_SHRINK=0` skips shrinking. Child module of
//! the crate so it can read private fields (`bypass`, `groups`) for coverage counts.

use std::collections::{HashMap, HashSet};

use nop_stream_sdk::MockContext;

use super::*;

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn range(&mut self, lo: u64, hi_incl: u64) -> u64 {
        lo + self.below(hi_incl - lo + 1)
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Process one batch of these keys.
    Process(Vec<Vec<u8>>),
    /// prepare_checkpoint; the checkpoint completes.
    Checkpoint,
    /// Drop the instance without write-back; restore a fresh one from the host state of
    /// the last completed checkpoint (the initial state if none).
    Crash,
}

#[derive(Debug, Clone)]
struct Scenario {
    emit_batch: bool,
    ttl: bool,
    timestamps: bool,
    /// Host state before the run: valid 8-byte counts or malformed values.
    initial: Vec<(Vec<u8>, Vec<u8>)>,
    ops: Vec<Op>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    batches: u64,
    records: u64,
    checkpoints: u64,
    crashes: u64,
    errors: u64,
    full_drops: u64,
    byte_full_drops: u64,
    bypass_starts: u64,
    bypass_ends: u64,
    max_cached: usize,
}

fn fmt_key(k: &[u8]) -> String {
    format!("{k:?}")
}

/// Host value of `key` as stored (raw).
fn host(ctx: &MockContext, key: &[u8]) -> Option<Vec<u8>> {
    ctx.raw_value(COUNT_STATE, b"", key).map(<[u8]>::to_vec)
}

/// Host state equals `model` (valid counts) plus the untouched malformed entries.
fn check_host_exact(
    ctx: &MockContext,
    model: &HashMap<Vec<u8>, u64>,
    malformed: &HashMap<Vec<u8>, Vec<u8>>,
    what: &str,
) -> Result<(), String> {
    for (k, &v) in model {
        let got = host(ctx, k);
        if got.as_deref() != Some(&v.to_le_bytes()[..]) {
            return Err(format!(
                "{what}: host count of key {} is {:?}, want {v}",
                fmt_key(k),
                got.map(|b| if b.len() == 8 {
                    format!("{}", u64::from_le_bytes(b.try_into().unwrap()))
                } else {
                    format!("raw {b:?}")
                })
            ));
        }
    }
    for (k, v) in malformed {
        if host(ctx, k).as_deref() != Some(&v[..]) {
            return Err(format!(
                "{what}: malformed entry {} was changed",
                fmt_key(k)
            ));
        }
    }
    let n = ctx.state_entry_count();
    if n != model.len() + malformed.len() {
        return Err(format!(
            "{what}: host holds {n} entries, want {}",
            model.len() + malformed.len()
        ));
    }
    Ok(())
}

fn config(s: &Scenario) -> &'static str {
    if s.emit_batch {
        r#"{"emit": "batch"}"#
    } else {
        "{}"
    }
}

/// Runs a scenario; Err describes the first divergence, with the op index.
fn run(s: &Scenario, stats: &mut Stats) -> Result<(), String> {
    let mut ctx = MockContext::for_operator::<KeyedCount>();
    if s.ttl {
        ctx = ctx.with_state_ttl(COUNT_STATE, 60_000);
    }
    let h = ctx.open_state(COUNT_STATE).unwrap();
    let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut malformed: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for (k, v) in &s.initial {
        ctx.value_put_many(h, &[], k, &[k.len() as u32], v, &[v.len() as u32]);
        model.remove(k);
        malformed.remove(k);
        if v.len() == 8 {
            model.insert(k.clone(), u64::from_le_bytes(v[..].try_into().unwrap()));
        } else {
            malformed.insert(k.clone(), v.clone());
        }
    }
    let mut op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), config(s))
        .map_err(|e| format!("open: {e}"))?;
    let mut last_ckpt = (ctx.clone(), model.clone());
    let mut ts: i64 = 1_000;
    // Keys counted since the last full host check (large runs check these at a
    // checkpoint, and everything at some checkpoints and after finish).
    let mut touched: HashSet<Vec<u8>> = HashSet::new();
    let mut ck_rng = Rng::new(s.ops.len() as u64 + 17);
    for (oi, o) in s.ops.iter().enumerate() {
        match o {
            Op::Process(keys) => {
                let mut input = Batch::default();
                let mut want_ts = Vec::new();
                for k in keys {
                    let t = if s.timestamps {
                        ts += 1;
                        Some(ts)
                    } else {
                        None
                    };
                    want_ts.push(t);
                    input.push_record(Some(k), t, b"payload");
                }
                let before_len = op.groups.len();
                let before_bytes = op.groups.keys.len();
                let before_bypass = op.bypass;
                let mut out = Batch::default();
                let res = op.process(&mut ctx, 0, &input, &mut out);
                let bad = keys.iter().any(|k| malformed.contains_key(k));
                if bad {
                    stats.errors += 1;
                    match res {
                        Ok(()) => {
                            return Err(format!(
                                "op {oi}: batch with a malformed stored count succeeded"
                            ));
                        }
                        Err(_) => {
                            if !out.is_empty() {
                                return Err(format!(
                                    "op {oi}: failed batch emitted {} records",
                                    out.len()
                                ));
                            }
                        }
                    }
                    // A failed batch commits nothing. With a TTL the host holds the
                    // last counts; without one it may lag them (cached), which the
                    // next checkpoint's check covers.
                    if s.ttl {
                        check_host_exact(
                            &ctx,
                            &model,
                            &malformed,
                            &format!("op {oi} (after error)"),
                        )?;
                    }
                    continue;
                }
                res.map_err(|e| format!("op {oi}: process failed: {e}"))?;
                if !keys.is_empty() {
                    stats.batches += 1;
                    stats.records += keys.len() as u64;
                    if before_len >= MAX_CACHED_KEYS {
                        stats.full_drops += 1;
                    } else if before_bytes >= MAX_CACHED_KEY_BYTES {
                        stats.byte_full_drops += 1;
                    }
                    if before_bypass == 0 && op.bypass > 0 {
                        stats.bypass_starts += 1;
                    }
                    if before_bypass == 1 && op.bypass == 0 {
                        stats.bypass_ends += 1;
                    }
                    stats.max_cached = stats.max_cached.max(before_len);
                }
                // Expected output from the model.
                let mut want: Vec<(Vec<u8>, u64, Option<i64>)> = Vec::new();
                if s.emit_batch {
                    let mut order: Vec<&Vec<u8>> = Vec::new();
                    let mut seen: HashSet<&Vec<u8>> = HashSet::new();
                    for k in keys {
                        *model.entry(k.clone()).or_default() += 1;
                        if seen.insert(k) {
                            order.push(k);
                        }
                    }
                    for k in order {
                        want.push((k.clone(), model[k], None));
                    }
                } else {
                    for (k, t) in keys.iter().zip(&want_ts) {
                        let c = model.entry(k.clone()).or_default();
                        *c += 1;
                        want.push((k.clone(), *c, *t));
                    }
                }
                let mut got = Vec::new();
                for r in out.iter() {
                    let key = r.key.ok_or_else(|| format!("op {oi}: unkeyed output"))?;
                    if r.data.len() < 8 || &r.data[..r.data.len() - 8] != key {
                        return Err(format!(
                            "op {oi}: output payload {:?} does not start with its key {:?}",
                            r.data, key
                        ));
                    }
                    let c = u64::from_le_bytes(r.data[r.data.len() - 8..].try_into().unwrap());
                    got.push((key.to_vec(), c, r.timestamp));
                }
                if got != want {
                    let i = got
                        .iter()
                        .zip(&want)
                        .position(|(a, b)| a != b)
                        .unwrap_or(got.len().min(want.len()));
                    return Err(format!(
                        "op {oi}: output differs at record {i} of {} (got {} records): got {:?}, want {:?}",
                        want.len(),
                        got.len(),
                        got.get(i).map(|(k, c, t)| (fmt_key(k), c, t)),
                        want.get(i).map(|(k, c, t)| (fmt_key(k), c, t)),
                    ));
                }
                if model.len() > 20_000 {
                    touched.extend(keys.iter().cloned());
                }
                if s.ttl {
                    // Every change written back within the same call.
                    for k in keys {
                        let g = host(&ctx, k);
                        if g.as_deref() != Some(&model[k].to_le_bytes()[..]) {
                            return Err(format!(
                                "op {oi}: TTL on, host count of {} after the batch is {:?}, want {}",
                                fmt_key(k),
                                g,
                                model[k]
                            ));
                        }
                    }
                    if ctx.state_entry_count() != model.len() + malformed.len() {
                        return Err(format!("op {oi}: TTL on, host entry count differs"));
                    }
                }
            }
            Op::Checkpoint => {
                stats.checkpoints += 1;
                let mut out = Batch::default();
                op.prepare_checkpoint(&mut ctx, oi as u64, &mut out)
                    .map_err(|e| format!("op {oi}: prepare_checkpoint failed: {e}"))?;
                if !out.is_empty() {
                    return Err(format!("op {oi}: prepare_checkpoint emitted"));
                }
                if model.len() <= 20_000 || ck_rng.chance(0.1) {
                    check_host_exact(&ctx, &model, &malformed, &format!("op {oi} (checkpoint)"))?;
                } else {
                    let sub: HashMap<Vec<u8>, u64> =
                        touched.iter().map(|k| (k.clone(), model[k])).collect();
                    for (k, v) in &sub {
                        if host(&ctx, k).as_deref() != Some(&v.to_le_bytes()[..]) {
                            return Err(format!(
                                "op {oi} (checkpoint): host count of {} is {:?}, want {v}",
                                fmt_key(k),
                                host(&ctx, k)
                            ));
                        }
                    }
                    if ctx.state_entry_count() != model.len() + malformed.len() {
                        return Err(format!("op {oi} (checkpoint): host entry count differs"));
                    }
                }
                touched.clear();
                last_ckpt = (ctx.clone(), model.clone());
            }
            Op::Crash => {
                stats.crashes += 1;
                ctx = last_ckpt.0.clone();
                model = last_ckpt.1.clone();
                touched.clear();
                op = KeyedCount::open(&mut ctx, &TaskInfo::for_tests(), config(s))
                    .map_err(|e| format!("op {oi}: reopen: {e}"))?;
            }
        }
    }
    let mut out = Batch::default();
    op.finish(&mut ctx, &mut out)
        .map_err(|e| format!("finish failed: {e}"))?;
    if !out.is_empty() {
        return Err("finish emitted".into());
    }
    check_host_exact(&ctx, &model, &malformed, "after finish")
}

// ---------------------------------------------------------------------------------
// Generation.

/// A tricky key: lengths 0..=20, bytes biased to 0 / 1 / 'a' / 0xff, shared 8-byte
/// prefixes, trailing zeros (padding look-alikes).
fn tricky_key(rng: &mut Rng) -> Vec<u8> {
    const PREFIXES: [&[u8; 8]; 3] = [b"\0\0\0\0\0\0\0\0", b"prefix88", b"a\0\0\0\0\0\0\0"];
    match rng.below(6) {
        0 => {
            // shared 8-byte prefix + 0..=12 suffix bytes
            let mut k = PREFIXES[rng.below(3) as usize].to_vec();
            let n = rng.range(0, 12);
            for _ in 0..n {
                k.push(small_byte(rng));
            }
            k
        }
        1 => {
            // padding look-alikes: a short word followed by zeros
            let mut k = vec![small_byte(rng); rng.range(0, 3) as usize];
            let z = rng.range(0, 10);
            k.extend(std::iter::repeat_n(0u8, z as usize));
            k
        }
        2 => rng.below(16).to_le_bytes().to_vec(),
        _ => {
            let n = rng.range(0, 20);
            (0..n).map(|_| small_byte(rng)).collect()
        }
    }
}

fn small_byte(rng: &mut Rng) -> u8 {
    match rng.below(6) {
        0 | 1 => 0,
        2 => 1,
        3 => b'a',
        4 => 0xff,
        _ => rng.next() as u8,
    }
}

/// Distinct key number `i` in one of several encodings (all distinct for distinct i
/// within an encoding; encodings overlap in words, not in keys, except by chance).
fn numbered_key(i: u64, enc: u64, long: bool) -> Vec<u8> {
    if long {
        // > 64 bytes: fills MAX_CACHED_KEY_BYTES before MAX_CACHED_KEYS.
        let mut k = b"long-key-prefix-".to_vec();
        k.extend(std::iter::repeat_n(b'x', 60));
        k.extend_from_slice(&i.to_le_bytes());
        return k;
    }
    match enc % 4 {
        0 => i.to_le_bytes().to_vec(),
        1 => {
            // shared 8-byte prefix, counter after it: len 9..=16
            let mut k = b"sharedpf".to_vec();
            let b = i.to_le_bytes();
            let n = (8 - b.iter().rev().take_while(|&&x| x == 0).count()).max(1);
            k.extend_from_slice(&b[..n]);
            k
        }
        2 => {
            // minimal LE bytes + (i % 3) trailing zeros: words collide, lengths differ
            let b = (i / 3).to_le_bytes();
            let n = 8 - b.iter().rev().take_while(|&&x| x == 0).count();
            let mut k = b[..n].to_vec();
            k.extend(std::iter::repeat_n(0u8, (i % 3) as usize));
            k.truncate(20);
            k
        }
        _ => {
            // 20-byte keys differing only in the last bytes
            let mut k = vec![0u8; 12];
            k.extend_from_slice(&i.to_be_bytes());
            k
        }
    }
}

/// Builds ops from a record stream: batches of random size, checkpoints and crashes at
/// random points; after a crash, the records since the last checkpoint are replayed
/// (re-split into possibly different batches).
fn ops_from_stream(
    rng: &mut Rng,
    stream: &[Vec<u8>],
    max_batch: u64,
    p_ckpt: f64,
    p_crash: f64,
    max_crashes: u32,
    p_empty: f64,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut pos = 0usize;
    let mut ckpt_pos = 0usize;
    let mut crashes = 0;
    while pos < stream.len() {
        if rng.chance(p_empty) {
            ops.push(Op::Process(Vec::new()));
        }
        let n = rng.range(1, max_batch) as usize;
        let end = (pos + n).min(stream.len());
        ops.push(Op::Process(stream[pos..end].to_vec()));
        pos = end;
        if rng.chance(p_ckpt) {
            ops.push(Op::Checkpoint);
            ckpt_pos = pos;
            if rng.chance(0.1) && crashes < max_crashes {
                // crash right after a checkpoint
                crashes += 1;
                ops.push(Op::Crash);
            }
        }
        if crashes < max_crashes && rng.chance(p_crash) {
            crashes += 1;
            ops.push(Op::Crash);
            pos = ckpt_pos;
        }
    }
    if rng.chance(0.5) {
        ops.push(Op::Checkpoint);
    }
    ops
}

fn gen_small(rng: &mut Rng) -> Scenario {
    let emit_batch = rng.chance(0.5);
    let ttl = rng.chance(0.3);
    let timestamps = rng.chance(0.3);
    // key pool
    let pool_size = match rng.below(4) {
        0 => rng.range(1, 5),
        1 => rng.range(5, 40),
        2 => rng.range(40, 400),
        _ => rng.range(400, 4000),
    } as usize;
    let mut pool: Vec<Vec<u8>> = Vec::with_capacity(pool_size);
    let enc = rng.next();
    for i in 0..pool_size {
        if rng.chance(0.6) {
            pool.push(tricky_key(rng));
        } else {
            pool.push(numbered_key(
                i as u64,
                enc.wrapping_add(i as u64 / 7),
                false,
            ));
        }
    }
    // initial state: some valid counts, maybe malformed ones
    let mut initial = Vec::new();
    if rng.chance(0.4) {
        for _ in 0..rng.range(1, 10) {
            let k = pool[rng.below(pool.len() as u64) as usize].clone();
            initial.push((k, rng.below(1 << 40).to_le_bytes().to_vec()));
        }
    }
    if rng.chance(0.25) {
        for _ in 0..rng.range(1, 3) {
            let k = pool[rng.below(pool.len() as u64) as usize].clone();
            let bad: Vec<u8> = match rng.below(4) {
                0 => Vec::new(),
                1 => vec![1, 2, 3],
                2 => vec![0; 9],
                _ => vec![7; 16],
            };
            initial.push((k, bad));
        }
    }
    let malformed: HashSet<Vec<u8>> = {
        // the last write of each key decides
        let mut m = HashMap::new();
        for (k, v) in &initial {
            m.insert(k.clone(), v.len() != 8);
        }
        m.into_iter().filter(|(_, b)| *b).map(|(k, _)| k).collect()
    };
    // stream: skewed sampling from the pool
    let n = rng.range(1, 6000) as usize;
    let hot = rng.range(1, pool.len() as u64) as usize;
    let stream: Vec<Vec<u8>> = (0..n)
        .map(|_| {
            let i = if rng.chance(0.5) {
                rng.below(hot as u64)
            } else {
                rng.below(pool.len() as u64)
            } as usize;
            pool[i].clone()
        })
        .collect();
    let max_batch = match rng.below(3) {
        0 => 4,
        1 => 64,
        _ => 2000,
    };
    let mut ops = ops_from_stream(rng, &stream, max_batch, 0.2, 0.1, 6, 0.02);
    // Malformed keys: their records fail the batch; then the batch is retried without
    // them (the records are dropped from the stream).
    if !malformed.is_empty() {
        let mut out = Vec::new();
        for o in ops {
            if let Op::Process(keys) = &o
                && keys.iter().any(|k| malformed.contains(k))
            {
                let retry = keys.iter().filter(|k| !malformed.contains(*k)).cloned();
                let retry = Op::Process(retry.collect());
                out.push(o);
                out.push(retry);
            } else {
                out.push(o);
            }
        }
        ops = out;
    }
    Scenario {
        emit_batch,
        ttl,
        timestamps,
        initial,
        ops,
    }
}

/// A scenario that fills the cache (by key count or key bytes), possibly triggering the
/// bypass, then runs past the bypass's end with small batches.
fn gen_large(rng: &mut Rng) -> Scenario {
    let emit_batch = rng.chance(0.5);
    let ttl = rng.chance(0.15);
    let long = rng.chance(0.2);
    let enc = rng.next();
    let hit_heavy = rng.chance(0.35);
    // distinct keys to fill: past 65,536 keys (or 4 MiB of ~84-byte keys: ~50k keys)
    let fill = if long {
        rng.range(52_000, 62_000)
    } else {
        rng.range(70_000, 100_000)
    };
    let mut stream: Vec<Vec<u8>> = Vec::new();
    let mut next_key = 0u64;
    let mk = |i: u64| numbered_key(i, enc.wrapping_add(i / 1000), long);
    // phase A: fill (each key once, or three times in a row when hit-heavy)
    while next_key < fill {
        let k = mk(next_key);
        next_key += 1;
        let times = if hit_heavy { 3 } else { 1 };
        stream.extend(std::iter::repeat_n(k, times));
    }
    let mut ops = ops_from_stream(rng, &stream, 6000, 0.1, 0.0, 0, 0.0);
    // A2: a few more fill batches with a possible crash (restores an empty cache).
    let mut recs_a2 = Vec::new();
    for _ in 0..rng.range(1000, 20_000) {
        recs_a2.push(mk(next_key));
        next_key += 1;
    }
    ops.extend(ops_from_stream(rng, &recs_a2, 6000, 0.3, 0.1, 1, 0.0));
    // phase B: many small batches (through and past a bypass), mixed old and new keys
    let nb = rng.range(1030, 1600) as usize;
    let mut recs_b = Vec::new();
    for _ in 0..nb * 3 {
        let k = if rng.chance(0.5) {
            mk(rng.below(next_key))
        } else {
            let k = mk(next_key);
            next_key += 1;
            k
        };
        recs_b.push(k);
    }
    let crash_b = if rng.chance(0.5) { 0.003 } else { 0.0 };
    let b_ops = ops_from_stream(rng, &recs_b, 5, 0.01, crash_b, 2, 0.0);
    ops.extend(b_ops);
    // phase C: a second fill with fresh keys + hot keys, bigger batches
    if rng.chance(0.5) {
        let mut recs_c = Vec::new();
        for _ in 0..rng.range(66_000, 80_000) {
            let k = if rng.chance(0.2) {
                mk(rng.below(100))
            } else {
                let k = mk(next_key);
                next_key += 1;
                k
            };
            recs_c.push(k);
        }
        ops.extend(ops_from_stream(rng, &recs_c, 4000, 0.1, 0.05, 2, 0.0));
    }
    let mut initial = Vec::new();
    if rng.chance(0.5) {
        for _ in 0..rng.range(1, 1000) {
            initial.push((
                mk(rng.below(next_key)),
                rng.below(1000).to_le_bytes().to_vec(),
            ));
        }
    }
    Scenario {
        emit_batch,
        ttl,
        timestamps: rng.chance(0.2),
        initial,
        ops,
    }
}

// ---------------------------------------------------------------------------------
// Shrinking: greedy removal of ops, then of records within batches, then of initial
// entries, then of the flags.

fn fails(s: &Scenario) -> bool {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(s, &mut Stats::default()).is_err()
    }));
    r.unwrap_or(true)
}

/// Greedily removes chunks of a list in `s` (halving the chunk size down to 1) while the
/// scenario still fails. `len` reads the list's length, `drop` removes a range of it.
fn remove_chunks(
    mut s: Scenario,
    len: impl Fn(&Scenario) -> usize,
    drop: impl Fn(&mut Scenario, std::ops::Range<usize>),
) -> Scenario {
    let mut chunk = len(&s).max(1);
    loop {
        let mut i = 0;
        while i < len(&s) {
            let mut t = s.clone();
            let end = (i + chunk).min(len(&t));
            drop(&mut t, i..end);
            if fails(&t) {
                s = t;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 {
            return s;
        }
        chunk /= 2;
    }
}

fn shrink(s: Scenario) -> Scenario {
    let mut s = remove_chunks(
        s,
        |s| s.ops.len(),
        |s, r| {
            s.ops.drain(r);
        },
    );
    for oi in 0..s.ops.len() {
        s = remove_chunks(
            s,
            |s| match &s.ops[oi] {
                Op::Process(k) => k.len(),
                _ => 0,
            },
            |s, r| {
                if let Op::Process(k) = &mut s.ops[oi] {
                    k.drain(r);
                }
            },
        );
    }
    s = remove_chunks(
        s,
        |s| s.initial.len(),
        |s, r| {
            s.initial.drain(r);
        },
    );
    for flag in 0..3 {
        let mut t = s.clone();
        match flag {
            0 => t.timestamps = false,
            1 => t.ttl = false,
            _ => t.emit_batch = false,
        }
        if fails(&t) {
            s = t;
        }
    }
    s
}

fn describe(s: &Scenario) -> String {
    let mut out = format!(
        "emit_batch={} ttl={} timestamps={} initial={:?}\n",
        s.emit_batch,
        s.ttl,
        s.timestamps,
        s.initial
            .iter()
            .map(|(k, v)| (fmt_key(k), v.clone()))
            .collect::<Vec<_>>()
    );
    for (i, o) in s.ops.iter().enumerate() {
        match o {
            Op::Process(keys) if keys.len() <= 20 => {
                out += &format!(
                    "  {i}: process {:?}\n",
                    keys.iter().map(|k| fmt_key(k)).collect::<Vec<_>>()
                );
            }
            Op::Process(keys) => {
                out += &format!("  {i}: process <{} records>\n", keys.len());
            }
            Op::Checkpoint => out += &format!("  {i}: checkpoint\n"),
            Op::Crash => out += &format!("  {i}: crash+restore\n"),
        }
    }
    out
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn drive(kind: &str, count: u64, gen_fn: fn(&mut Rng) -> Scenario) {
    let seed0 = env("KC_SEED", 1);
    let do_shrink = env("KC_SHRINK", 1) == 1;
    let mut total = Stats::default();
    let mut failures = Vec::new();
    let mut by_param: HashMap<(bool, bool), u64> = HashMap::new();
    let started = std::time::Instant::now();
    for i in 0..count {
        let seed = seed0.wrapping_mul(1_000_003).wrapping_add(i);
        let mut rng = Rng::new(seed ^ if kind == "large" { 0xABCD } else { 0 });
        let s = gen_fn(&mut rng);
        *by_param.entry((s.emit_batch, s.ttl)).or_default() += 1;
        let mut st = Stats::default();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&s, &mut st)));
        let r = match r {
            Ok(r) => r,
            Err(p) => Err(format!(
                "panic: {:?}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            )),
        };
        total.batches += st.batches;
        total.records += st.records;
        total.checkpoints += st.checkpoints;
        total.crashes += st.crashes;
        total.errors += st.errors;
        total.full_drops += st.full_drops;
        total.byte_full_drops += st.byte_full_drops;
        total.bypass_starts += st.bypass_starts;
        total.bypass_ends += st.bypass_ends;
        total.max_cached = total.max_cached.max(st.max_cached);
        if let Err(e) = r {
            eprintln!("[{kind}] seed {seed}: DIVERGENCE: {e}");
            if do_shrink && failures.len() < 3 {
                let m = shrink(s.clone());
                let e2 = run(&m, &mut Stats::default()).err();
                eprintln!("minimal:\n{}=> {:?}", describe(&m), e2);
            }
            failures.push((seed, e));
        }
    }
    eprintln!(
        "[{kind}] {count} scenarios in {:?} (by (emit_batch, ttl): {:?}); {:?}; {} divergences",
        started.elapsed(),
        by_param,
        total,
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} divergences: {:?}",
        failures.len(),
        failures
    );
    if kind == "large" {
        // These scenarios exist to fill the cache and run through the bypass: a change
        // that no longer reaches either would leave them testing nothing they are for.
        assert!(
            total.full_drops + total.byte_full_drops > 0 && total.bypass_starts > 0,
            "the large scenarios never filled the cache or started a bypass: {total:?}"
        );
    }
}

#[test]
fn differential_small() {
    drive("small", env("KC_SMALL", 100), gen_small);
}

#[test]
fn differential_large() {
    drive("large", env("KC_LARGE", 3), gen_large);
}
