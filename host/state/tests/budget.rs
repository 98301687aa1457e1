//! The working set's memory budget in bytes (design §5.5, §8.1): what it counts, and that
//! past its share it flushes and drops clean entries without losing a write.

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_state::{ENTRY_OVERHEAD_BYTES, KeyedState, NAMESPACE_OVERHEAD_BYTES, StateConfig};

fn config(dir: &std::path::Path, memory_bytes: Option<u64>) -> StateConfig {
    StateConfig {
        path: dir.join("s.redb"),
        shard_count: 8,
        owned: 0..8,
        states: vec![
            StateDescriptor {
                name: "v".into(),
                kind: StateKind::Value,
                schema_version: 1,
                codec: "raw".into(),
                schema_sha256: None,
            },
            StateDescriptor {
                name: "l".into(),
                kind: StateKind::List,
                schema_version: 1,
                codec: "raw".into(),
                schema_sha256: None,
            },
        ],
        memory_bytes,
        ttl_ms: Vec::new(),
    }
}

fn put(s: &mut KeyedState, ns: &[u8], key: &[u8], value: &[u8]) {
    s.value_put_many(
        0,
        ns,
        key,
        &[key.len() as u32],
        value,
        &[value.len() as u32],
    )
    .unwrap();
}

fn get(s: &mut KeyedState, ns: &[u8], key: &[u8]) -> Option<Vec<u8>> {
    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
    s.value_get_many(0, ns, key, &[key.len() as u32], &mut d, &mut e, &mut p)
        .unwrap();
    p[0].then_some(d)
}

#[test]
fn the_working_set_counts_key_and_value_bytes_plus_a_fixed_overhead() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(dir.path(), None)).unwrap();
    assert_eq!(s.cached_bytes(), 0);
    put(&mut s, b"", b"k1", b"abc");
    assert_eq!(s.cached_bytes(), 2 + 3 + ENTRY_OVERHEAD_BYTES);
    // Overwriting counts the change in value length only.
    put(&mut s, b"", b"k1", b"abcdefgh");
    assert_eq!(s.cached_bytes(), 2 + 8 + ENTRY_OVERHEAD_BYTES);
    // A value longer than the inline bytes counts its length too.
    let long = vec![7u8; 100];
    put(&mut s, b"", b"k2", &long);
    let two = 2 + 8 + 2 + 100 + 2 * ENTRY_OVERHEAD_BYTES;
    assert_eq!(s.cached_bytes(), two);
    // A namespace counts its bytes and its own overhead on top of its entries.
    put(&mut s, b"window-1", b"k1", b"x");
    let ns = 8 + NAMESPACE_OVERHEAD_BYTES + 2 + 1 + ENTRY_OVERHEAD_BYTES;
    assert_eq!(s.cached_bytes(), two + ns);
    // Deleting what redb never held forgets the slot, and the empty namespace.
    s.value_delete(0, b"window-1", b"k1").unwrap();
    assert_eq!(s.cached_bytes(), two);
    // A miss read from an empty database caches nothing (no namespace was ever flushed).
    assert_eq!(get(&mut s, b"", b"k3"), None);
    assert_eq!(s.cached_bytes(), two);
    // After a flush, a delete leaves a tombstone until the next flush, then nothing.
    s.flush(false).unwrap();
    s.value_delete(0, b"", b"k2").unwrap();
    assert_eq!(s.cached_bytes(), 2 + 8 + 2 + 2 * ENTRY_OVERHEAD_BYTES);
    s.flush(false).unwrap();
    assert_eq!(s.cached_bytes(), 2 + 8 + ENTRY_OVERHEAD_BYTES);
    // A miss read from redb is cached and counted (present or absent).
    assert_eq!(get(&mut s, b"", b"k2"), None);
    assert_eq!(s.cached_bytes(), 2 + 8 + 2 + 2 * ENTRY_OVERHEAD_BYTES);
    // List and map values count their stored encoding.
    s.list_append(1, b"", b"k9", b"item").unwrap();
    assert!(s.cached_bytes() > 2 + 8 + 2 + 2 + 3 * ENTRY_OVERHEAD_BYTES);
    assert_eq!(s.evictions(), 0);
}

#[test]
fn past_its_share_the_working_set_flushes_and_drops_clean_entries_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // 64 KiB: a working set of 48 KiB, a few hundred entries; 5,000 keys do not fit.
    let budget = 64 << 10;
    let share = (budget - budget / 4) as usize;
    let mut s = KeyedState::open(config(dir.path(), Some(budget))).unwrap();
    let key = |i: u32| format!("key-{i}").into_bytes();
    for round in 0u32..3 {
        for i in 0u32..5_000 {
            let k = key(i);
            let old = get(&mut s, b"", &k);
            let expected_old = round.checked_sub(1).map(|r| (r * 5_000 + i).to_le_bytes());
            assert_eq!(old.as_deref(), expected_old.as_ref().map(|v| &v[..]), "{i}");
            put(&mut s, b"", &k, &(round * 5_000 + i).to_le_bytes());
            assert!(
                s.cached_bytes() <= share,
                "{} bytes over the share {share}",
                s.cached_bytes()
            );
        }
    }
    assert!(s.evictions() > 10, "{} evictions", s.evictions());
    assert_eq!(s.stored_entries().unwrap(), 5_000);
    // A snapshot holds every key with its last value.
    let snap = s.snapshot().unwrap();
    let entries: u64 = snap.iter().map(|s| s.entries).sum();
    assert_eq!(entries, 5_000);
    for i in (0u32..5_000).step_by(97) {
        assert_eq!(
            get(&mut s, b"", &key(i)).unwrap(),
            (2 * 5_000 + i).to_le_bytes()
        );
    }
}

#[test]
fn without_a_budget_nothing_is_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(dir.path(), None)).unwrap();
    for i in 0u32..5_000 {
        put(&mut s, b"", &i.to_be_bytes(), b"v");
    }
    assert_eq!(s.evictions(), 0);
    assert_eq!(s.cached_entries(), 5_000);
    assert_eq!(s.cached_bytes(), 5_000 * (4 + 1 + ENTRY_OVERHEAD_BYTES));
}

#[test]
fn a_snapshot_streams_shard_by_shard_and_stops_at_a_failing_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(dir.path(), None)).unwrap();
    for i in 0u32..1_000 {
        put(&mut s, b"", &i.to_be_bytes(), b"v");
    }
    let whole = s.snapshot().unwrap();
    let mut streamed = Vec::new();
    s.snapshot_each(&mut |p| {
        streamed.push(p);
        Ok(())
    })
    .unwrap();
    assert_eq!(streamed, whole);
    assert!(whole.len() > 1);
    let mut seen = 0;
    let err = s
        .snapshot_each(&mut |_| {
            seen += 1;
            Err("disk full".into())
        })
        .unwrap_err();
    assert_eq!(seen, 1);
    assert!(err.to_string().contains("disk full"), "{err}");
}
