//! Incremental snapshots (design §5.5, §8.1): a delta view hands over exactly the keys
//! written or deleted since the previous view; a full payload followed by its deltas,
//! restored in order, gives the state as of the last view.

use nop_stream_api::StateShardId;
use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{Compactor, KeyedState, ShardSnapshot, StateConfig, codec};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: u32 = 4;

fn config(path: &std::path::Path, memory_bytes: Option<u64>, ttl: Option<u64>) -> StateConfig {
    let desc = |name: &str| StateDescriptor {
        name: name.into(),
        kind: StateKind::Value,
        schema_version: 1,
        codec: "raw".into(),
        schema_sha256: None,
    };
    StateConfig {
        path: path.into(),
        shard_count: SHARDS,
        owned: 0..SHARDS,
        states: vec![desc("a"), desc("b")],
        memory_bytes,
        ttl_ms: vec![None, ttl],
    }
}

fn put(s: &mut KeyedState, state: u32, ns: &[u8], key: &[u8], value: &[u8]) {
    s.value_put_many(
        state,
        ns,
        key,
        &[key.len() as u32],
        value,
        &[value.len() as u32],
    )
    .unwrap();
}

fn view_payloads(view: nop_stream_state::SnapshotView) -> Vec<ShardSnapshot> {
    let mut out = Vec::new();
    view.write(&mut |s| {
        out.push(s);
        Ok(())
    })
    .unwrap();
    out
}

/// Every ((state, namespace, key) -> value) a full snapshot of `s` holds.
type Model = BTreeMap<(u32, Vec<u8>, Vec<u8>), Vec<u8>>;

fn full_entries(payloads: &[ShardSnapshot]) -> Model {
    let mut out = Model::new();
    for p in payloads {
        assert!(!p.delta);
        for (k, v) in codec::pairs(&p.payload).unwrap() {
            let n = u32::from_be_bytes(k[..4].try_into().unwrap()) as usize;
            out.insert((p.state, k[4..4 + n].to_vec(), k[4 + n..].to_vec()), v);
        }
    }
    out
}

/// Payloads with their codecs, per (state, shard), in chain order.
type Groups<'a> = BTreeMap<(u32, u32), Vec<(&'a str, &'a [u8])>>;

/// `chain` folded per (state, shard) into full payloads by `c`, as a background
/// compaction does.
fn fold_with(c: &mut Compactor, chain: &[ShardSnapshot]) -> Vec<ShardSnapshot> {
    let mut groups = Groups::new();
    for p in chain {
        groups
            .entry((p.state, p.shard.0))
            .or_default()
            .push((p.codec(), &p.payload));
    }
    groups
        .into_iter()
        .filter_map(|((state, shard), ch)| c.fold(state, "s", StateShardId(shard), &ch).unwrap())
        .collect()
}

/// `chain` compacted by `s`'s [`Compactor`].
fn compacted(s: &KeyedState, chain: &[ShardSnapshot]) -> Vec<ShardSnapshot> {
    fold_with(&mut s.compactor(), chain)
}

/// The state `chain` (a full snapshot and the deltas after it) restores to.
fn restored(dir: &std::path::Path, chain: &[ShardSnapshot]) -> Model {
    let path = dir.join(format!("restored-{}.redb", chain.len()));
    let _ = std::fs::remove_file(&path);
    let mut s = KeyedState::open(config(&path, None, None)).unwrap();
    s.restore(chain).unwrap();
    full_entries(&s.snapshot().unwrap())
}

#[derive(Debug, Clone)]
enum Op {
    Put(u32, u8, u8, u8),
    Delete(u32, u8, u8),
    /// Read a key (a miss loads it from redb into the working set, not fresh).
    Get(u32, u8, u8),
    /// Write the working set to redb (as a budget eviction or a full view does).
    Flush,
    /// Crash: a new state restored from the chain goes on in its place.
    Restore,
    /// Take a snapshot: full when `true`, else a delta if one can be taken.
    Snapshot(bool),
    /// A background compaction's result is adopted: the chain becomes its fold.
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2u32, 0..8u8, 0..20u8, any::<u8>()).prop_map(|(s, n, k, v)| Op::Put(s, n, k, v)),
        3 => (0..2u32, 0..8u8, 0..20u8).prop_map(|(s, n, k)| Op::Delete(s, n, k)),
        3 => (0..2u32, 0..8u8, 0..20u8).prop_map(|(s, n, k)| Op::Get(s, n, k)),
        1 => Just(Op::Flush),
        1 => Just(Op::Restore),
        1 => any::<bool>().prop_map(Op::Snapshot),
        1 => Just(Op::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// After every snapshot, the chain since the last full one restores to exactly the
    /// model, with and without a budget small enough to evict (and flush) between views;
    /// so does its compaction, and deltas go on on top of an adopted compaction.
    #[test]
    fn a_full_snapshot_and_its_deltas_restore_to_the_state(
        ops in proptest::collection::vec(op(), 1..160),
        budget in prop_oneof![Just(None), Just(Some(4u64 << 10)), Just(Some(24u64 << 10))],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = KeyedState::open(config(&dir.path().join("s.redb"), budget, None)).unwrap();
        s.set_incremental(true);
        let mut model = Model::new();
        let mut chain: Vec<ShardSnapshot> = Vec::new();
        let mut had_snapshot = false;
        let mut restores = 0;
        let mut at_snapshot = Model::new();
        for op in ops {
            match op {
                Op::Put(st, n, k, v) => {
                    let (ns, key) = (vec![n; n as usize], vec![k; 3]);
                    put(&mut s, st, &ns, &key, &[v, 7]);
                    model.insert((st, ns, key), vec![v, 7]);
                }
                Op::Delete(st, n, k) => {
                    let (ns, key) = (vec![n; n as usize], vec![k; 3]);
                    s.value_delete(st, &ns, &key).unwrap();
                    model.remove(&(st, ns, key));
                }
                Op::Get(st, n, k) => {
                    let (ns, key) = (vec![n; n as usize], vec![k; 3]);
                    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
                    s.value_get_many(st, &ns, &key, &[3], &mut d, &mut e, &mut p).unwrap();
                    let got = p[0].then_some(d);
                    prop_assert_eq!(got.as_ref(), model.get(&(st, ns, key)));
                }
                Op::Flush => s.flush(false).unwrap(),
                Op::Restore if had_snapshot => {
                    restores += 1;
                    let path = dir.path().join(format!("s{restores}.redb"));
                    s = KeyedState::open(config(&path, budget, None)).unwrap();
                    s.set_incremental(true);
                    s.restore(&chain).unwrap();
                    // What was written after the last snapshot is lost with the crash.
                    model = at_snapshot.clone();
                }
                Op::Restore => {}
                Op::Snapshot(full) => {
                    let delta = if full { None } else { s.delta_view().unwrap() };
                    match delta {
                        Some(view) => {
                            // A state that starts empty tracks from the start: its first
                            // delta is the whole state on top of nothing.
                            let payloads = view_payloads(view);
                            prop_assert!(payloads.iter().all(|p| p.delta));
                            chain.extend(payloads);
                            had_snapshot = true;
                        }
                        None => {
                            // Tracking is never dropped, budget or not (changed keys past
                            // the budget spill, a restore goes on tracking): only an
                            // asked-for snapshot is full.
                            prop_assert!(full);
                            chain = view_payloads(s.snapshot_view().unwrap());
                            had_snapshot = true;
                        }
                    }
                    prop_assert_eq!(&restored(dir.path(), &chain), &model);
                    let folded = compacted(&s, &chain);
                    prop_assert!(folded.iter().all(|p| !p.delta && p.entries > 0));
                    prop_assert_eq!(&full_entries(&folded), &model);
                    at_snapshot = model.clone();
                }
                Op::Compact => chain = compacted(&s, &chain),
            }
        }
    }
}

#[test]
fn deltas_hold_only_the_changed_keys_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), None, None)).unwrap();
    // Off: no delta view, ever.
    assert!(s.delta_view().unwrap().is_none());
    s.set_incremental(true);
    for k in 0..100u8 {
        put(&mut s, 0, b"", &[k], &[k]);
    }
    // An empty state tracks from the start: its first delta is every key, as puts.
    let first = view_payloads(s.delta_view().unwrap().unwrap());
    assert_eq!(first.iter().map(|p| p.entries).sum::<u64>(), 100);
    assert!(
        first
            .iter()
            .flat_map(|p| nop_stream_checkpoint::payload::changes(&p.payload).unwrap())
            .all(|(_, v)| v.is_some())
    );
    // A state opened on a database that holds entries does not: nothing is known to be
    // unchanged until a full view.
    {
        let path = dir.path().join("reopened.redb");
        let mut o = KeyedState::open(config(&path, None, None)).unwrap();
        put(&mut o, 0, b"", b"k", b"v");
        o.flush(false).unwrap();
        drop(o);
        let mut o = KeyedState::open(config(&path, None, None)).unwrap();
        o.set_incremental(true);
        assert!(o.delta_view().unwrap().is_none());
        assert!(view_payloads(o.snapshot_view().unwrap()).len() == 1);
        assert!(o.delta_view().unwrap().is_some());
    }
    let full = view_payloads(s.snapshot_view().unwrap());
    assert_eq!(full.iter().map(|p| p.entries).sum::<u64>(), 100);
    put(&mut s, 0, b"", &[5], b"new");
    s.value_delete(0, b"", &[6]).unwrap();
    // Written and deleted again before the view: a delete (it was in the full payload).
    put(&mut s, 0, b"", &[200], b"gone");
    s.flush(false).unwrap();
    s.value_delete(0, b"", &[200]).unwrap();
    let delta = view_payloads(s.delta_view().unwrap().unwrap());
    assert_eq!(delta.iter().map(|p| p.entries).sum::<u64>(), 3);
    let mut changes = BTreeMap::new();
    for p in &delta {
        for (k, v) in nop_stream_checkpoint::payload::changes(&p.payload).unwrap() {
            changes.insert(k[4..].to_vec(), v.map(<[u8]>::to_vec));
        }
    }
    assert_eq!(
        changes,
        BTreeMap::from([
            (vec![5], Some(b"new".to_vec())),
            (vec![6], None),
            (vec![200], None)
        ])
    );
    // Nothing changed since: an empty delta.
    assert!(view_payloads(s.delta_view().unwrap().unwrap()).is_empty());
    // A key of a namespace redb never held, handed over by a delta (no flush since) and
    // then deleted: the next delta deletes it.
    put(&mut s, 0, b"new-ns", b"k", b"v");
    let put_delta = view_payloads(s.delta_view().unwrap().unwrap());
    s.value_delete(0, b"new-ns", b"k").unwrap();
    let delete_delta = view_payloads(s.delta_view().unwrap().unwrap());
    let only = |payloads: &[ShardSnapshot]| {
        let all: Vec<_> = payloads
            .iter()
            .flat_map(|p| nop_stream_checkpoint::payload::changes(&p.payload).unwrap())
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(all.len(), 1, "{all:?}");
        all.into_iter().next().unwrap()
    };
    let mut entry_key = 6u32.to_be_bytes().to_vec();
    entry_key.extend_from_slice(b"new-nsk");
    assert_eq!(only(&put_delta), (entry_key.clone(), Some(b"v".to_vec())));
    assert_eq!(only(&delete_delta), (entry_key, None));
    // Written and deleted between two views in a namespace redb never held (a window's
    // state): no view saw it, so the next delta carries nothing of it.
    put(&mut s, 0, b"window", b"k", b"v");
    s.value_delete(0, b"window", b"k").unwrap();
    assert!(view_payloads(s.delta_view().unwrap().unwrap()).is_empty());
    // A restore starts tracking at the restored chain: nothing changed since it.
    let mut chain = full;
    chain.extend(delta);
    let mut r = KeyedState::open(config(&dir.path().join("r.redb"), None, None)).unwrap();
    r.set_incremental(true);
    r.restore(&chain).unwrap();
    assert!(view_payloads(r.delta_view().unwrap().unwrap()).is_empty());
    // Without incremental snapshots a restored state has no delta to give.
    let mut r = KeyedState::open(config(&dir.path().join("r2.redb"), None, None)).unwrap();
    r.restore(&chain).unwrap();
    assert!(r.delta_view().unwrap().is_none());
}

#[test]
fn a_small_budget_spills_its_changed_keys_and_keeps_snapshots_incremental() {
    // Pins: past the budget's tracking share the state stopped tracking changes, so every
    // snapshot of a state that outgrew its budget was full.
    let dir = tempfile::tempdir().unwrap();
    // 64 KiB: a working-set share of 48 KiB; 5,000 changed keys need more than its half.
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), Some(64 << 10), None)).unwrap();
    s.set_incremental(true);
    let mut chain = view_payloads(s.snapshot_view().unwrap());
    let mut model = Model::new();
    for round in 0..3u8 {
        for k in 0..5_000u32 {
            if (k + u32::from(round)) % 7 == 0 {
                s.value_delete(0, b"", &k.to_be_bytes()).unwrap();
                model.remove(&(0, Vec::new(), k.to_be_bytes().to_vec()));
            } else {
                put(&mut s, 0, b"", &k.to_be_bytes(), &[round, 1]);
                model.insert((0, Vec::new(), k.to_be_bytes().to_vec()), vec![round, 1]);
            }
        }
        assert!(s.evictions() > 0, "the budget evicted");
        assert!(
            s.cached_bytes() <= 48 << 10,
            "{} bytes cached",
            s.cached_bytes()
        );
        let delta = view_payloads(s.delta_view().unwrap().expect("a delta despite the budget"));
        assert!(delta.iter().all(|p| p.delta));
        // Each changed key once, with its last value: every key written this round, and
        // no other key (a delete of a key no snapshot held may leave no change).
        let mut changed = BTreeMap::new();
        for p in &delta {
            for (k, v) in nop_stream_checkpoint::payload::changes(&p.payload).unwrap() {
                let key = k[4..].to_vec();
                assert!(
                    changed.insert(key, v.map(<[u8]>::to_vec)).is_none(),
                    "twice"
                );
            }
        }
        let written: BTreeMap<Vec<u8>, Option<Vec<u8>>> = (0..5_000u32)
            .filter(|k| (k + u32::from(round)) % 7 != 0)
            .map(|k| (k.to_be_bytes().to_vec(), Some(vec![round, 1])))
            .collect();
        assert!(changed.len() <= 5_000);
        assert!(written.iter().all(|(k, v)| changed.get(k) == Some(v)));
        chain.extend(delta);
        assert_eq!(restored(dir.path(), &chain), model);
    }
    // Spilled runs live next to the database only until a view takes them.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".changed-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// An incremental state in `dir` whose state 1 has a 100 ms TTL, with a clock the test
/// moves (it starts at 1,000,000 ms).
fn ttl_state(dir: &std::path::Path) -> (KeyedState, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(1_000_000));
    let mut s = KeyedState::open(config(&dir.join("s.redb"), None, Some(100))).unwrap();
    let clock = Arc::clone(&now);
    s.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    s.set_incremental(true);
    (s, now)
}

#[test]
fn a_changed_key_that_expired_becomes_a_delete() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, now) = ttl_state(dir.path());
    let _ = view_payloads(s.snapshot_view().unwrap());
    put(&mut s, 1, b"", b"old", b"1");
    put(&mut s, 1, b"", b"kept", b"1");
    now.fetch_add(60, Ordering::SeqCst);
    put(&mut s, 1, b"", b"kept", b"2");
    now.fetch_add(60, Ordering::SeqCst);
    // `old` was written 120 ms ago (ttl 100): expired at the view's time.
    let delta = view_payloads(s.delta_view().unwrap().unwrap());
    let mut changes = BTreeMap::new();
    for p in &delta {
        for (k, v) in nop_stream_checkpoint::payload::changes(&p.payload).unwrap() {
            changes.insert(k[4..].to_vec(), v.map(|v| v[8..].to_vec()));
        }
    }
    assert_eq!(
        changes,
        BTreeMap::from([
            (b"kept".to_vec(), Some(b"2".to_vec())),
            (b"old".to_vec(), None)
        ])
    );
}

#[test]
fn a_compaction_folds_a_chain_and_leaves_expired_entries_out() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, now) = ttl_state(dir.path());
    put(&mut s, 1, b"", b"old", b"1");
    put(&mut s, 1, b"", b"kept", b"1");
    put(&mut s, 1, b"", b"gone", b"1");
    put(&mut s, 0, b"", b"plain", b"1");
    let mut chain = view_payloads(s.snapshot_view().unwrap());
    now.fetch_add(60, Ordering::SeqCst);
    put(&mut s, 1, b"", b"kept", b"2");
    s.value_delete(1, b"", b"gone").unwrap();
    put(&mut s, 0, b"", b"plain", b"2");
    chain.extend(view_payloads(s.delta_view().unwrap().unwrap()));
    // 120 ms after `old` was written (ttl 100): the compaction leaves it out and lists it.
    now.fetch_add(60, Ordering::SeqCst);
    let mut c = s.compactor();
    let out = fold_with(&mut c, &chain);
    let mut got = BTreeMap::new();
    for p in &out {
        assert!(!p.delta);
        for (k, v) in codec::pairs(&p.payload).unwrap() {
            let v = if p.state == 1 { v[8..].to_vec() } else { v };
            got.insert((p.state, k[4..].to_vec()), v);
        }
    }
    assert_eq!(
        got,
        BTreeMap::from([
            ((0, b"plain".to_vec()), b"2".to_vec()),
            ((1, b"kept".to_vec()), b"2".to_vec()),
        ])
    );
    assert_eq!(c.into_expired().len(), 1, "`old` expired");
    // A malformed payload names the state.
    let err = s
        .compactor()
        .fold(
            0,
            "counts",
            StateShardId(0),
            &[("kv-lp/1", &[9, 0, 0, 0][..])],
        )
        .unwrap_err();
    assert!(err.to_string().contains("counts"), "{err}");
}

#[test]
fn a_restore_without_a_budget_fills_the_working_set_and_scans_and_deletes_reach_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), None, None)).unwrap();
    s.set_incremental(true);
    for k in 0..50u8 {
        put(&mut s, 0, b"ns", &[k], &[k]);
    }
    let mut chain = view_payloads(s.delta_view().unwrap().unwrap());
    put(&mut s, 0, b"", b"plain", b"p");
    s.value_delete(0, b"ns", &[7]).unwrap();
    chain.extend(view_payloads(s.delta_view().unwrap().unwrap()));

    let mut r = KeyedState::open(config(&dir.path().join("r.redb"), None, None)).unwrap();
    r.set_incremental(true);
    r.restore(&chain).unwrap();
    // The restored entries are in the working set, and redb holds none of them.
    assert!(r.cached_bytes() > 50 * 2, "{}", r.cached_bytes());
    // The scan (timer reload) sees them without a flush, in table order.
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = (0..50u8)
        .filter(|&k| k != 7)
        .map(|k| (b"ns".to_vec(), vec![k]))
        .collect();
    expected.push((Vec::new(), b"plain".to_vec()));
    let shard = |key: &[u8]| nop_stream_core::shard_of(key, SHARDS).0;
    expected.sort_by(|a, b| (shard(&a.1), &a.0, &a.1).cmp(&(shard(&b.1), &b.0, &b.1)));
    let mut got = r.scan(0).unwrap();
    let keyed = |v: &[(Vec<u8>, Vec<u8>)]| {
        v.iter()
            .map(|(ns, k)| (shard(k), ns.clone(), k.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(keyed(&got), keyed(&expected));
    // Nothing changed since the restore: an empty delta. A delete of a restored key is a
    // tombstone in the next one; a put a change.
    assert!(view_payloads(r.delta_view().unwrap().unwrap()).is_empty());
    r.value_delete(0, b"ns", &[3]).unwrap();
    put(&mut r, 0, b"ns", &[4], b"x");
    let delta = view_payloads(r.delta_view().unwrap().unwrap());
    let mut changes = BTreeMap::new();
    for p in &delta {
        for (k, v) in nop_stream_checkpoint::payload::changes(&p.payload).unwrap() {
            changes.insert(k[4 + 2..].to_vec(), v.map(<[u8]>::to_vec));
        }
    }
    assert_eq!(
        changes,
        BTreeMap::from([(vec![3], None), (vec![4], Some(b"x".to_vec()))])
    );
    // And the whole chain, compacted, is the state.
    chain.extend(delta);
    got = full_entries(&compacted(&r, &chain))
        .into_keys()
        .map(|(_, ns, k)| (ns, k))
        .collect();
    got.sort_by(|a, b| (shard(&a.1), &a.0, &a.1).cmp(&(shard(&b.1), &b.0, &b.1)));
    let mut want = r.scan(0).unwrap();
    want.sort_by(|a, b| (shard(&a.1), &a.0, &a.1).cmp(&(shard(&b.1), &b.0, &b.1)));
    assert_eq!(got, want);
}

#[test]
fn without_a_budget_expired_entries_leave_the_working_set_at_each_compaction() {
    // Review regression: without a memory budget nothing flushes the working set, so the
    // expired keys a compaction reports must leave it at once, or a TTL state grows for
    // ever.
    let dir = tempfile::tempdir().unwrap();
    let (mut s, now) = ttl_state(dir.path());
    let mut chain: Vec<ShardSnapshot> = Vec::new();
    // 20 barriers, each after 50 new keys of the TTL state (ttl 100 ms, 60 ms apart).
    for epoch in 0..20u32 {
        for k in 0..50u32 {
            put(&mut s, 1, b"", &(epoch * 1000 + k).to_be_bytes(), b"v");
        }
        now.fetch_add(60, Ordering::SeqCst);
        chain.extend(view_payloads(s.delta_view().unwrap().unwrap()));
        // Every fourth barrier adopts a compaction, which reports the expired keys.
        if epoch % 4 == 3 {
            let mut c = s.compactor();
            chain = fold_with(&mut c, &chain);
            s.remove_expired_later(c.into_expired());
            let live = full_entries(&chain).len();
            assert!(live <= 100, "{live}");
            assert_eq!(s.cached_entries(), live, "epoch {epoch}");
        }
    }
    // A key rewritten after the compaction judged it stays.
    put(&mut s, 1, b"", b"again", b"1");
    now.fetch_add(200, Ordering::SeqCst);
    let mut c = s.compactor();
    let _ = fold_with(&mut c, &view_payloads(s.delta_view().unwrap().unwrap()));
    put(&mut s, 1, b"", b"again", b"2");
    s.remove_expired_later(c.into_expired());
    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
    s.value_get_many(1, b"", b"again", &[5], &mut d, &mut e, &mut p)
        .unwrap();
    assert!(p[0], "a rewritten key was removed");
}

/// A restore of more than 1 MiB of payloads folds its chains on several threads, and one
/// of more than 65,536 plain keys fills the working set in bucket order, with a second
/// thread copying the keys and values ahead of the inserts: what it holds is still
/// exactly the chain's state, plain and namespaced, and the restored state goes on with
/// deltas on top of the chain.
#[test]
fn a_large_restore_folds_on_several_threads_and_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), None, None)).unwrap();
    s.set_incremental(true);
    let mut model = Model::new();
    let mut write = |s: &mut KeyedState, st: u32, ns: &[u8], key: &[u8], value: &[u8]| {
        put(s, st, ns, key, value);
        model.insert((st, ns.to_vec(), key.to_vec()), value.to_vec());
    };
    for k in 0..150_000u32 {
        write(&mut s, 0, b"", &k.to_be_bytes(), &(k * 3).to_le_bytes());
    }
    for k in 0..3_000u32 {
        write(&mut s, 1, &[k as u8 % 5; 2], &k.to_be_bytes(), b"n");
    }
    let mut chain = view_payloads(s.delta_view().unwrap().unwrap());
    for k in (0..150_000u32).step_by(7) {
        write(&mut s, 0, b"", &k.to_be_bytes(), b"updated");
    }
    for k in (150_000..160_000u32).step_by(3) {
        write(&mut s, 0, b"", &k.to_be_bytes(), b"new");
    }
    for k in (0..150_000u32).step_by(11) {
        s.value_delete(0, b"", &k.to_be_bytes()).unwrap();
        model.remove(&(0, Vec::new(), k.to_be_bytes().to_vec()));
    }
    s.value_delete(1, &[2; 2], &7u32.to_be_bytes()).unwrap();
    model.remove(&(1, vec![2; 2], 7u32.to_be_bytes().to_vec()));
    chain.extend(view_payloads(s.delta_view().unwrap().unwrap()));
    let bytes: usize = chain.iter().map(|p| p.payload.len()).sum();
    assert!(
        bytes > 1 << 20,
        "{bytes} bytes: too few for the parallel fold"
    );

    let mut r = KeyedState::open(config(&dir.path().join("r.redb"), None, None)).unwrap();
    r.set_incremental(true);
    r.restore(&chain).unwrap();
    // Every restored key is readable, with its value.
    for ((st, ns, key), value) in model.iter().step_by(97) {
        let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
        r.value_get_many(*st, ns, key, &[key.len() as u32], &mut d, &mut e, &mut p)
            .unwrap();
        assert!(p[0], "{st} {ns:?} {key:?} missing");
        assert_eq!(&d, value);
    }
    // A delta after the restore holds only what changed since; the chain with it, folded,
    // is the model.
    let gone = 12u32.to_be_bytes();
    r.value_delete(0, b"", &gone).unwrap();
    model.remove(&(0, Vec::new(), gone.to_vec()));
    let delta = view_payloads(r.delta_view().unwrap().unwrap());
    assert_eq!(delta.iter().map(|p| p.entries).sum::<u64>(), 1);
    chain.extend(delta);
    assert_eq!(full_entries(&compacted(&r, &chain)), model);
    // And the restored working set itself, written out whole, is the model too.
    assert_eq!(full_entries(&r.snapshot().unwrap()), model);
}
