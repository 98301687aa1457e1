//! Asynchronous snapshots (design §5.5, §8.1): a [`SnapshotView`] holds exactly the state as
//! of the moment it was taken, on another thread, while the state goes on taking writes,
//! flushes and budget evictions; expired TTL entries are left out and deleted later only
//! if they are still expired.

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{KeyedState, ShardSnapshot, SnapshotView, StateConfig, codec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const SHARDS: u32 = 4;

fn config(path: &std::path::Path, memory_bytes: Option<u64>, ttl: Option<u64>) -> StateConfig {
    StateConfig {
        path: path.into(),
        shard_count: SHARDS,
        owned: 0..SHARDS,
        states: vec![StateDescriptor {
            name: "v".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "raw".into(),
            schema_sha256: None,
        }],
        memory_bytes,
        ttl_ms: vec![ttl],
    }
}

fn put(s: &mut KeyedState, key: &[u8], value: &[u8]) {
    s.value_put_many(
        0,
        b"",
        key,
        &[key.len() as u32],
        value,
        &[value.len() as u32],
    )
    .unwrap();
}

fn get(s: &mut KeyedState, key: &[u8]) -> Option<Vec<u8>> {
    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
    s.value_get_many(0, b"", key, &[key.len() as u32], &mut d, &mut e, &mut p)
        .unwrap();
    p[0].then_some(d)
}

/// Every (key, stored value) of the payloads (namespace is empty here).
fn entries(payloads: &[ShardSnapshot]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    for p in payloads {
        for (k, v) in codec::pairs(&p.payload).unwrap() {
            // `namespace length (4) | namespace | key`, namespace empty.
            assert_eq!(&k[..4], &[0, 0, 0, 0]);
            out.insert(k[4..].to_vec(), v);
        }
    }
    out
}

/// Runs the view's scan on another thread, as the task runtime does.
fn write_elsewhere(view: SnapshotView) -> (Vec<ShardSnapshot>, nop_stream_state::ExpiredKeys) {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let expired = view
            .write(&mut |s| {
                out.push(s);
                Ok(())
            })
            .unwrap();
        (out, expired)
    })
    .join()
    .unwrap()
}

#[test]
fn a_view_holds_the_writes_before_it_and_none_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), None, None)).unwrap();
    for i in 0..100u32 {
        put(&mut s, &i.to_be_bytes(), format!("before-{i}").as_bytes());
    }
    // Some flushed earlier, some only in the working set: the view flushes them.
    s.flush(false).unwrap();
    for i in 100..150u32 {
        put(&mut s, &i.to_be_bytes(), format!("before-{i}").as_bytes());
    }
    let view = s.snapshot_view().unwrap();
    // After the view: overwrites, deletes and new keys, flushed (so redb holds them)
    // before the scan even starts.
    for i in 0..10u32 {
        put(&mut s, &i.to_be_bytes(), b"after");
    }
    for i in 10..20u32 {
        s.value_delete(0, b"", &i.to_be_bytes()).unwrap();
    }
    for i in 150..200u32 {
        put(&mut s, &i.to_be_bytes(), b"after");
    }
    s.flush(false).unwrap();
    let (payloads, expired) = write_elsewhere(view);
    assert!(expired.is_empty());
    let want: BTreeMap<Vec<u8>, Vec<u8>> = (0..150u32)
        .map(|i| (i.to_be_bytes().to_vec(), format!("before-{i}").into_bytes()))
        .collect();
    assert_eq!(entries(&payloads), want);
    assert_eq!(payloads.iter().map(|p| p.entries).sum::<u64>(), 150);
    // The live state has the later writes.
    assert_eq!(
        get(&mut s, &3u32.to_be_bytes()).as_deref(),
        Some(&b"after"[..])
    );
    assert_eq!(get(&mut s, &13u32.to_be_bytes()), None);
    assert_eq!(s.stored_entries().unwrap(), 190);
    // A second view sees them.
    let (payloads, _) = write_elsewhere(s.snapshot_view().unwrap());
    let second = entries(&payloads);
    assert_eq!(second.len(), 190);
    assert_eq!(
        second.get(&3u32.to_be_bytes()[..]).map(Vec::as_slice),
        Some(&b"after"[..])
    );
    assert!(!second.contains_key(&13u32.to_be_bytes()[..]));
}

#[test]
fn budget_evictions_go_on_while_a_view_is_held() {
    // 64 KiB budget: a 48 KiB working set, flushed and trimmed every few hundred keys.
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), Some(64 << 10), None)).unwrap();
    for i in 0..2_000u32 {
        put(&mut s, &i.to_be_bytes(), b"v1");
    }
    let view = s.snapshot_view().unwrap();
    let before = s.evictions();
    for i in 0..6_000u32 {
        put(&mut s, &i.to_be_bytes(), b"v2");
    }
    assert!(s.evictions() > before, "the budget kept evicting");
    assert!(s.cached_bytes() <= 48 << 10);
    let (payloads, _) = write_elsewhere(view);
    let got = entries(&payloads);
    assert_eq!(got.len(), 2_000);
    assert!(got.values().all(|v| v == b"v1"));
    for i in [0u32, 1_999, 5_999] {
        assert_eq!(get(&mut s, &i.to_be_bytes()).as_deref(), Some(&b"v2"[..]));
    }
}

#[test]
fn expired_keys_are_deleted_at_the_next_flush_unless_written_since() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(1_000));
    let mut s = KeyedState::open(config(&dir.path().join("s.redb"), None, Some(100))).unwrap();
    let c = Arc::clone(&clock);
    s.set_clock(Arc::new(move || c.load(Ordering::SeqCst)));
    for i in 0..20u32 {
        put(&mut s, &i.to_be_bytes(), b"old");
    }
    clock.store(1_050, Ordering::SeqCst);
    for i in 0..5u32 {
        put(&mut s, &i.to_be_bytes(), b"young");
    }
    clock.store(1_120, Ordering::SeqCst);
    let view = s.snapshot_view().unwrap();
    // Written after the view: key 5 is live again; the view still judged it expired.
    put(&mut s, &5u32.to_be_bytes(), b"reborn");
    let (payloads, expired) = write_elsewhere(view);
    let got = entries(&payloads);
    assert_eq!(got.len(), 5, "15 entries expired at 1,100");
    assert!(got.values().all(|v| &v[8..] == b"young"), "{got:?}");
    assert_eq!(expired.len(), 15);
    s.remove_expired_later(expired);
    assert_eq!(s.expired_removed(), 0, "nothing deleted before the flush");
    s.flush(false).unwrap();
    assert_eq!(s.expired_removed(), 14, "key 5 was written since and stays");
    assert_eq!(s.stored_entries().unwrap(), 6);
    assert_eq!(
        get(&mut s, &5u32.to_be_bytes()).as_deref(),
        Some(&b"reborn"[..])
    );
    assert_eq!(get(&mut s, &6u32.to_be_bytes()), None);
}
