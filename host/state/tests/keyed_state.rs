//! Keyed state against a BTreeMap model, shard refusal, and persistence across reopen.

use nop_stream_api::{StateDescriptor, StateKind};
use nop_stream_core::shard_of;
use nop_stream_state::{ENTRY_OVERHEAD_BYTES, KeyedState, StateConfig, StateError};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A state of three kinds; `max_cached`: working-set budget in entries of a one-byte key
/// and value (`None`: no budget).
fn config(
    dir: &std::path::Path,
    owned: std::ops::Range<u32>,
    max_cached: Option<usize>,
) -> StateConfig {
    StateConfig {
        path: dir.join("s.redb"),
        shard_count: 16,
        owned,
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
            StateDescriptor {
                name: "m".into(),
                kind: StateKind::Map,
                schema_version: 1,
                codec: "raw".into(),
                schema_sha256: None,
            },
        ],
        // Three quarters of the budget go to the working set.
        memory_bytes: max_cached.map(|n| (n * (2 + ENTRY_OVERHEAD_BYTES) * 4 / 3) as u64),
        ttl_ms: Vec::new(),
    }
}

fn flat(keys: &[Vec<u8>]) -> (Vec<u8>, Vec<u32>) {
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for k in keys {
        data.extend_from_slice(k);
        ends.push(data.len() as u32);
    }
    (data, ends)
}

fn get(s: &mut KeyedState, ns: &[u8], keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let (k, ke) = flat(keys);
    let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
    s.value_get_many(0, ns, &k, &ke, &mut d, &mut e, &mut p)
        .unwrap();
    let mut start = 0usize;
    e.iter()
        .zip(&p)
        .map(|(&end, &present)| {
            let v = d[start..end as usize].to_vec();
            start = end as usize;
            present.then_some(v)
        })
        .collect()
}

#[test]
fn key_outside_owned_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(dir.path(), 0..8, None)).unwrap();
    let outside = (0u32..1000)
        .map(|i| i.to_string().into_bytes())
        .find(|k| shard_of(k, 16).0 >= 8)
        .unwrap();
    let (k, ke) = flat(std::slice::from_ref(&outside));
    let err = s.value_put_many(0, b"", &k, &ke, b"x", &[1]).unwrap_err();
    assert!(matches!(err, StateError::KeyOutsideShards { .. }), "{err}");
    assert!(err.to_string().contains("outside the shards 0..8"), "{err}");
    let err = s.list_append(1, b"", &outside, b"x").unwrap_err();
    assert!(matches!(err, StateError::KeyOutsideShards { .. }));
}

#[test]
fn wrong_kind_and_unknown_handle_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = KeyedState::open(config(dir.path(), 0..16, None)).unwrap();
    assert!(matches!(
        s.list_append(0, b"", b"k", b"x"),
        Err(StateError::WrongKind { .. })
    ));
    assert!(matches!(
        s.value_delete(7, b"", b"k"),
        Err(StateError::UnknownHandle(7))
    ));
    assert_eq!(s.handle("m"), Some(2));
    assert_eq!(s.handle("nope"), None);
}

#[test]
fn state_survives_flush_and_reopen_and_keys_list_in_order() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut s = KeyedState::open(config(dir.path(), 0..16, None)).unwrap();
        let keys: Vec<Vec<u8>> = ["b", "a", "c"]
            .iter()
            .map(|k| k.as_bytes().to_vec())
            .collect();
        let (k, ke) = flat(&keys);
        s.value_put_many(0, b"ns", &k, &ke, b"223311", &[2, 4, 6])
            .unwrap();
        s.list_append(1, b"", b"a", b"x").unwrap();
        s.list_append(1, b"", b"a", b"y").unwrap();
        s.map_put(2, b"", b"a", b"z", b"1").unwrap();
        s.map_put(2, b"", b"a", b"b", b"2").unwrap();
        s.flush(true).unwrap();
    }
    let mut s = KeyedState::open(config(dir.path(), 0..16, None)).unwrap();
    assert_eq!(
        get(
            &mut s,
            b"ns",
            &[b"a".to_vec(), b"b".to_vec(), b"q".to_vec()]
        ),
        vec![Some(b"33".to_vec()), Some(b"22".to_vec()), None]
    );
    let (keys, ends, more) = s.value_keys(0, b"ns", None, 2).unwrap();
    assert_eq!(
        (keys.as_slice(), ends.as_slice(), more),
        (&b"ab"[..], &[1u32, 2][..], true)
    );
    let (keys, _, more) = s.value_keys(0, b"ns", Some(b"b"), 10).unwrap();
    assert_eq!((keys.as_slice(), more), (&b"c"[..], false));
    assert_eq!(
        s.list_get(1, b"", b"a").unwrap(),
        vec![b"x".to_vec(), b"y".to_vec()]
    );
    assert_eq!(
        s.map_entries(2, b"", b"a").unwrap(),
        vec![
            (b"b".to_vec(), b"2".to_vec()),
            (b"z".to_vec(), b"1".to_vec())
        ]
    );
    s.clear(2, b"", b"a").unwrap();
    assert!(s.map_entries(2, b"", b"a").unwrap().is_empty());
    assert_eq!(s.stored_entries().unwrap(), 4);
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8, u8),
    /// A value longer than the working set's inline bytes.
    PutLong(u8, u8, u8),
    Delete(u8, u8),
    DeleteMany(u8, Vec<u8>),
    Get(Vec<(u8, u8)>),
    Flush,
    Evict,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..4, 0u8..20, any::<u8>()).prop_map(|(n, k, v)| Op::Put(n, k, v)),
        (0u8..4, 0u8..20, any::<u8>()).prop_map(|(n, k, v)| Op::PutLong(n, k, v)),
        (0u8..4, 0u8..20).prop_map(|(n, k)| Op::Delete(n, k)),
        (0u8..4, proptest::collection::vec(0u8..20, 0..6)).prop_map(|(n, k)| Op::DeleteMany(n, k)),
        proptest::collection::vec((0u8..4, 0u8..20), 1..8).prop_map(Op::Get),
        Just(Op::Flush),
        Just(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// The write-back cache over redb behaves exactly like a BTreeMap, whatever the
    /// interleaving of writes, reads, flushes and evictions (budget of 4 entries).
    #[test]
    fn value_state_matches_btreemap_model(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = KeyedState::open(config(dir.path(), 0..16, Some(4))).unwrap();
        let mut model: BTreeMap<(u8, u8), Vec<u8>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Put(n, k, v) => {
                    s.value_put_many(0, &[n], &[k], &[1], &[v], &[1]).unwrap();
                    model.insert((n, k), vec![v]);
                }
                Op::PutLong(n, k, v) => {
                    let long = vec![v; 40];
                    s.value_put_many(0, &[n], &[k], &[1], &long, &[40]).unwrap();
                    model.insert((n, k), long);
                }
                Op::Delete(n, k) => {
                    s.value_delete(0, &[n], &[k]).unwrap();
                    model.remove(&(n, k));
                }
                Op::DeleteMany(n, keys) => {
                    let ends: Vec<u32> = (1..=keys.len() as u32).collect();
                    s.value_delete_many(0, &[n], &keys, &ends).unwrap();
                    for k in keys {
                        model.remove(&(n, k));
                    }
                }
                Op::Get(keys) => {
                    for (n, k) in keys {
                        let got = get(&mut s, &[n], &[vec![k]]);
                        prop_assert_eq!(got, vec![model.get(&(n, k)).cloned()]);
                    }
                }
                Op::Flush => s.flush(false).unwrap(),
                Op::Evict => s.maybe_evict().unwrap(),
            }
        }
        for n in 0u8..4 {
            let (keys, _, _) = s.value_keys(0, &[n], None, 1000).unwrap();
            let expected: Vec<u8> = model.keys().filter(|(mn, _)| *mn == n).map(|(_, k)| *k).collect();
            prop_assert_eq!(keys, expected);
        }
    }
}

#[test]
fn snapshot_moves_shards_between_subtasks() {
    // Subtask A owns shards 0..8 and B 8..16 of a 16-shard state; a restore at
    // parallelism 1 must see every entry exactly once.
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<Vec<u8>> = (0u32..200).map(|i| format!("k{i}").into_bytes()).collect();
    let mut snaps = Vec::new();
    for (name, owned) in [("a", 0..8), ("b", 8..16)] {
        let mut cfg = config(&dir.path().join(name), owned.clone(), None);
        cfg.path = dir.path().join(name).join("s.redb");
        let mut s = KeyedState::open(cfg).unwrap();
        for k in keys.iter().filter(|k| owned.contains(&shard_of(k, 16).0)) {
            s.value_put_many(0, b"", k, &[k.len() as u32], k, &[k.len() as u32])
                .unwrap();
            s.list_append(1, b"n", k, b"x").unwrap();
        }
        snaps.extend(s.snapshot().unwrap());
    }
    assert!(snaps.iter().all(|s| s.entries > 0));
    let mut all = KeyedState::open(config(&dir.path().join("c"), 0..16, None)).unwrap();
    all.restore(&snaps).unwrap();
    assert_eq!(
        get(&mut all, b"", &keys),
        keys.iter().map(|k| Some(k.clone())).collect::<Vec<_>>()
    );
    assert_eq!(all.list_get(1, b"n", b"k7").unwrap(), vec![b"x".to_vec()]);
    assert_eq!(all.stored_entries().unwrap(), 400);
    // A subtask refuses shards it does not own.
    let mut half = KeyedState::open(config(&dir.path().join("d"), 0..8, None)).unwrap();
    assert!(matches!(
        half.restore(&snaps),
        Err(StateError::KeyOutsideShards { .. })
    ));
}

/// Keys found in the working set skip the shard hash (they were checked on the way in);
/// every other key is still checked, by reads and by writes, with the working set holding
/// all keys (no budget) or spilling most of them to redb (a budget of 4 entries).
#[test]
fn only_cached_keys_skip_the_shard_check() {
    for max_cached in [None, Some(4)] {
        let dir = tempfile::tempdir().unwrap();
        let mut s = KeyedState::open(config(dir.path(), 0..8, max_cached)).unwrap();
        let owned: Vec<Vec<u8>> = (0u32..1000)
            .map(|i| i.to_string().into_bytes())
            .filter(|k| shard_of(k, 16).0 < 8)
            .take(20)
            .collect();
        let outside = (0u32..1000)
            .map(|i| i.to_string().into_bytes())
            .find(|k| shard_of(k, 16).0 >= 8)
            .unwrap();
        let (k, ke) = flat(&owned);
        s.value_put_many(0, b"", &k, &ke, &k, &ke).unwrap();
        assert_eq!(
            get(&mut s, b"", &owned),
            owned.iter().cloned().map(Some).collect::<Vec<_>>()
        );
        s.value_put_many(0, b"", &k, &ke, &k, &ke).unwrap();
        let mut mixed = owned.clone();
        mixed.push(outside.clone());
        let (mk, mke) = flat(&mixed);
        let (mut d, mut e, mut p) = (Vec::new(), Vec::new(), Vec::new());
        let err = s
            .value_get_many(0, b"", &mk, &mke, &mut d, &mut e, &mut p)
            .unwrap_err();
        assert!(
            matches!(err, StateError::KeyOutsideShards { .. }),
            "{max_cached:?}: {err}"
        );
        let err = s.value_put_many(0, b"", &mk, &mke, &mk, &mke).unwrap_err();
        assert!(
            matches!(err, StateError::KeyOutsideShards { .. }),
            "{max_cached:?}: {err}"
        );
        // Refused keys never entered the working set: asking again is refused again.
        let (ok, oke) = flat(std::slice::from_ref(&outside));
        let err = s
            .value_get_many(0, b"", &ok, &oke, &mut d, &mut e, &mut p)
            .unwrap_err();
        assert!(
            matches!(err, StateError::KeyOutsideShards { .. }),
            "{max_cached:?}: {err}"
        );
    }
}
