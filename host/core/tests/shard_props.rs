//! Property tests of StateShard routing (design §3.4): ownership ranges partition the
//! shard space exactly, `owner_of` inverts `shards_of`, and keys land in range.

use nop_stream_api::{StateShardId, SubtaskIndex};
use nop_stream_core::{owner_of, shard_of, shards_of};
use proptest::prelude::*;

fn count_and_parallelism() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![
        (1u32..=4096).prop_flat_map(|c| (Just(c), 1..=c)),
        // Near the top of the range, to catch overflow in the arithmetic.
        (u32::MAX - 16..=u32::MAX).prop_flat_map(|c| (
            Just(c),
            prop_oneof![Just(1), Just(2), Just(3), Just(c), 1..=c]
        )),
    ]
}

proptest! {
    #[test]
    fn ranges_partition_all_shards((count, p) in count_and_parallelism()) {
        let mut next = 0u32;
        for i in 0..p.min(4096) {
            let r = shards_of(SubtaskIndex(i), count, p);
            prop_assert_eq!(r.start, next, "subtask {} starts where {} ended", i, i.saturating_sub(1));
            prop_assert!(r.end > r.start, "subtask {} of {} owns no shard of {}", i, p, count);
            next = r.end;
        }
        if p <= 4096 {
            prop_assert_eq!(next, count);
        }
        // The last subtask always ends at `count`.
        prop_assert_eq!(shards_of(SubtaskIndex(p - 1), count, p).end, count);
    }

    #[test]
    fn owner_of_inverts_shards_of((count, p) in count_and_parallelism(), pick in any::<u32>()) {
        let shard = pick % count;
        let owner = owner_of(StateShardId(shard), count, p);
        prop_assert!(owner.0 < p);
        prop_assert!(shards_of(owner, count, p).contains(&shard),
            "shard {} of {} at parallelism {} assigned to {} owning {:?}",
            shard, count, p, owner, shards_of(owner, count, p));
    }

    #[test]
    fn every_shard_of_small_spaces_has_its_owner(count in 1u32..=300, p_pick in any::<u32>()) {
        let p = p_pick % count + 1;
        for s in 0..count {
            let o = owner_of(StateShardId(s), count, p);
            prop_assert!(shards_of(o, count, p).contains(&s));
        }
    }

    #[test]
    fn shard_of_is_in_range_and_deterministic(key in proptest::collection::vec(any::<u8>(), 0..64), count in 1u32..=u32::MAX) {
        let s = shard_of(&key, count);
        prop_assert!(s.0 < count);
        prop_assert_eq!(s, shard_of(&key, count));
    }
}

#[test]
fn shard_of_is_pinned_for_hash_policy_v1() {
    // Restores depend on this mapping never changing for HashPolicy version 1.
    assert_eq!(nop_stream_core::stable_hash(b""), 0x2d06800538d394c2);
    assert_eq!(
        shard_of(b"", 128),
        StateShardId((0x2d06800538d394c2u64 % 128) as u32)
    );
}
