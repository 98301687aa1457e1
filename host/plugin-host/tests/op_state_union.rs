//! Union redistribution over a chain of restores (design §16, "Operator state").

use nop_stream_api::Redistribution;
use nop_stream_plugin_host::op_state::redistribute;

fn e(ids: &[&str]) -> Vec<(String, Vec<u8>)> {
    ids.iter()
        .map(|i| (i.to_string(), i.as_bytes().to_vec()))
        .collect()
}

/// A union state hands every subtask every entry, also at the same parallelism (a crash
/// recovery). A plugin that keeps what it was handed (as the SDK's `dedupe`/`seen` example
/// would) then snapshots the same ids in every subtask; the next recovery must still
/// restore them, not fail the job for good on its own checkpoint.
#[test]
fn a_union_state_kept_whole_survives_the_next_recovery() {
    let first = vec![e(&["a"]), e(&["b"])];
    let after: Vec<_> = (0..2)
        .map(|i| redistribute("seen", Redistribution::Union, &first, i, 2).unwrap())
        .collect();
    assert_eq!(after, vec![e(&["a", "b"]), e(&["a", "b"])]);
    // The next checkpoint holds every id in both subtasks; recover at 2, rescale to 3.
    for p in [2, 3, 1] {
        for i in 0..p {
            let got = redistribute("seen", Redistribution::Union, &after, i, p)
                .unwrap_or_else(|err| panic!("p={p} subtask {i}: {err}"));
            assert_eq!(got, e(&["a", "b"]));
        }
    }
    // Split registry pools them the same way: one owner per id.
    let split: Vec<_> = (0..3)
        .map(|i| redistribute("seen", Redistribution::SplitRegistry, &after, i, 3).unwrap())
        .collect();
    assert_eq!(split, vec![e(&["a"]), e(&["b"]), e(&[])]);
}

/// Copies of one id that differ are still refused, naming the id and the subtasks.
#[test]
fn differing_copies_of_an_id_are_still_refused() {
    let old = vec![
        vec![("a".to_string(), b"1".to_vec())],
        vec![("a".to_string(), b"2".to_vec())],
    ];
    for p in [Redistribution::Union, Redistribution::SplitRegistry] {
        let err = redistribute("seen", p, &old, 0, 3).unwrap_err();
        assert!(err.contains("`a`") && err.contains("0 and 1"), "{err}");
    }
}
