//! State TTL (design §8.1): processing time since the last write, entries read as
//! absent once expired, writes restart the lifetime, snapshots leave expired entries out
//! and delete them from redb, and write times survive a snapshot/restore.

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{KeyedState, StateConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: u32 = 4;

fn descriptors() -> Vec<StateDescriptor> {
    ["v", "l", "m", "forever"]
        .iter()
        .zip([
            StateKind::Value,
            StateKind::List,
            StateKind::Map,
            StateKind::Value,
        ])
        .map(|(name, kind)| StateDescriptor {
            name: (*name).into(),
            kind,
            schema_version: 1,
            codec: "raw".into(),
            schema_sha256: None,
        })
        .collect()
}

/// State with a 100 ms TTL on `v`, `l` and `m`, none on `forever`, on a clock the test
/// moves.
fn open(path: &std::path::Path, clock: &Arc<AtomicU64>) -> KeyedState {
    let mut s = KeyedState::open(StateConfig {
        path: path.into(),
        shard_count: SHARDS,
        owned: 0..SHARDS,
        states: descriptors(),
        memory_bytes: None,
        ttl_ms: vec![Some(100), Some(100), Some(100), None],
    })
    .unwrap();
    let c = Arc::clone(clock);
    s.set_clock(Arc::new(move || c.load(Ordering::SeqCst)));
    s
}

fn get(s: &mut KeyedState, state: u32, key: &[u8]) -> Option<Vec<u8>> {
    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
    s.value_get_many(state, b"", key, &[key.len() as u32], &mut d, &mut e, &mut p)
        .unwrap();
    p[0].then_some(d)
}

fn put(s: &mut KeyedState, state: u32, key: &[u8], value: &[u8]) {
    s.value_put_many(
        state,
        b"",
        key,
        &[key.len() as u32],
        value,
        &[value.len() as u32],
    )
    .unwrap();
}

#[test]
fn entries_expire_after_their_last_write_and_writes_restart_the_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(1_000));
    let mut s = open(&dir.path().join("s.redb"), &clock);
    put(&mut s, 0, b"a", b"1");
    put(&mut s, 0, b"b", b"2");
    put(&mut s, 3, b"a", b"kept");
    s.list_append(1, b"", b"a", b"x").unwrap();
    s.map_put(2, b"", b"a", b"k", b"v").unwrap();
    clock.store(1_050, Ordering::SeqCst);
    // Reads do not refresh; the plugin never sees the write-time prefix.
    assert_eq!(get(&mut s, 0, b"a").as_deref(), Some(&b"1"[..]));
    put(&mut s, 0, b"b", b"22");
    s.list_append(1, b"", b"a", b"y").unwrap();
    clock.store(1_099, Ordering::SeqCst);
    assert_eq!(get(&mut s, 0, b"a").as_deref(), Some(&b"1"[..]));
    // Exactly the TTL after the write: expired (write + ttl <= now).
    clock.store(1_100, Ordering::SeqCst);
    assert_eq!(get(&mut s, 0, b"a"), None);
    assert_eq!(get(&mut s, 0, b"b").as_deref(), Some(&b"22"[..]));
    assert_eq!(
        s.list_get(1, b"", b"a").unwrap(),
        [b"x".to_vec(), b"y".to_vec()]
    );
    assert_eq!(
        s.map_get(2, b"", b"a", b"k").unwrap(),
        None,
        "the map expired"
    );
    assert_eq!(get(&mut s, 3, b"a").as_deref(), Some(&b"kept"[..]));
    clock.store(1_150, Ordering::SeqCst);
    assert_eq!(get(&mut s, 0, b"b"), None);
    assert!(s.list_get(1, b"", b"a").unwrap().is_empty());
    // Appending to an expired list starts a new one.
    s.list_append(1, b"", b"a", b"z").unwrap();
    assert_eq!(s.list_get(1, b"", b"a").unwrap(), [b"z".to_vec()]);
    // A value written again after it expired is live again.
    put(&mut s, 0, b"a", b"3");
    assert_eq!(get(&mut s, 0, b"a").as_deref(), Some(&b"3"[..]));
    // Listing keys skips the expired ones.
    put(&mut s, 0, b"c", b"4");
    clock.store(1_250, Ordering::SeqCst);
    put(&mut s, 0, b"d", b"5");
    let (keys, ends, more) = s.value_keys(0, b"", None, 10).unwrap();
    assert!(!more);
    assert_eq!(ends.len(), 1, "only `d` is live: {keys:?}");
    assert_eq!(keys, b"d");
}

#[test]
fn snapshots_leave_expired_entries_out_and_delete_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(5_000));
    let mut s = open(&dir.path().join("s.redb"), &clock);
    for i in 0..50u32 {
        put(&mut s, 0, &i.to_be_bytes(), b"old");
        put(&mut s, 3, &i.to_be_bytes(), b"forever");
    }
    s.flush(false).unwrap();
    clock.store(5_080, Ordering::SeqCst);
    for i in 0..10u32 {
        put(&mut s, 0, &i.to_be_bytes(), b"new");
    }
    clock.store(5_120, Ordering::SeqCst);
    assert_eq!(s.stored_entries().unwrap(), 100);
    let snap = s.snapshot().unwrap();
    let entries = |state: u32| {
        snap.iter()
            .filter(|p| p.state == state)
            .map(|p| p.entries)
            .sum::<u64>()
    };
    assert_eq!(entries(0), 10, "40 entries of `v` expired at 5,100");
    assert_eq!(entries(3), 50, "`forever` has no TTL");
    assert_eq!(s.expired_removed(), 40);
    assert_eq!(s.stored_entries().unwrap(), 60, "expired entries left redb");
    for i in 0..50u32 {
        let want = (i < 10).then(|| b"new".to_vec());
        assert_eq!(get(&mut s, 0, &i.to_be_bytes()), want, "key {i}");
    }

    // A restore elsewhere keeps the write times: the 10 live entries expire at 5,180.
    let other = tempfile::tempdir().unwrap();
    let mut r = open(&other.path().join("r.redb"), &clock);
    r.restore(&snap).unwrap();
    assert_eq!(
        get(&mut r, 0, &3u32.to_be_bytes()).as_deref(),
        Some(&b"new"[..])
    );
    clock.store(5_180, Ordering::SeqCst);
    assert_eq!(get(&mut r, 0, &3u32.to_be_bytes()), None);
    assert_eq!(
        get(&mut r, 3, &3u32.to_be_bytes()).as_deref(),
        Some(&b"forever"[..])
    );
    let snap = r.snapshot().unwrap();
    assert!(snap.iter().all(|p| p.state == 3), "only `forever` is left");
    assert_eq!(r.stored_entries().unwrap(), 50);
}

#[test]
fn values_evicted_from_the_working_set_expire_from_redb_too() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let mut s = open(&dir.path().join("s.redb"), &clock);
    put(&mut s, 0, b"k", b"v");
    s.flush(true).unwrap();
    drop(s);
    // Reopened: the value comes from redb with its write time.
    let mut s = open(&dir.path().join("s.redb"), &clock);
    clock.store(99, Ordering::SeqCst);
    assert_eq!(get(&mut s, 0, b"k").as_deref(), Some(&b"v"[..]));
    drop(s);
    let mut s = open(&dir.path().join("s.redb"), &clock);
    clock.store(100, Ordering::SeqCst);
    assert_eq!(get(&mut s, 0, b"k"), None);
}
