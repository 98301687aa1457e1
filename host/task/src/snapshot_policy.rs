//! What each stateful operator's snapshot at a barrier is (design §5.5): a delta on its
//! chain, a delta while the chain is compacted in the background, or a full snapshot. A
//! pure decision over the operator's chain (its keyed-state descriptors as of its last
//! joined snapshot: a full snapshot's payloads, then every delta's, oldest first) and
//! whether a compaction of it runs; the task driver does the I/O it decides on.

use nop_stream_checkpoint::{SegmentDescriptor, payload};

/// Longest chain of deltas after a full snapshot before a compaction of it starts: bounds
/// the segment files a restore opens even when the deltas are tiny (design §5.5).
pub const MAX_DELTAS: u32 = 16;

/// Longest chain, in delta files, that a task extends while a compaction of it runs;
/// past it the task takes a full snapshot and abandons the compaction (one that cannot
/// keep up). Twice [`MAX_DELTAS`].
pub(crate) const MAX_DELTAS_COMPACTING: usize = 2 * MAX_DELTAS as usize;

/// What the next snapshot of one operator's keyed state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyedSnapshot {
    /// A delta on the chain; a compaction that runs goes on.
    Delta,
    /// A delta on the chain while the chain is compacted in the background: a compaction
    /// starts now unless one runs (`start`).
    DeltaWhileCompacting {
        /// No compaction runs: start one.
        start: bool,
    },
    /// A full snapshot, which starts a new chain; a compaction of the old chain is of no
    /// use and is dropped.
    Full,
}

impl KeyedSnapshot {
    /// Whether the plan asks the state for a delta (which a state that does not track its
    /// changes cannot give: then the snapshot is full after all, see [`Self::fallback`]).
    pub(crate) fn is_delta(self) -> bool {
        !matches!(self, KeyedSnapshot::Full)
    }

    /// The plan when the state could not hand over a delta: full.
    pub(crate) fn fallback(self) -> KeyedSnapshot {
        KeyedSnapshot::Full
    }
}

/// The next snapshot of an operator whose chain is `chain` (`None`: snapshots are not
/// incremental, or the next one must be full after a failed compaction), with a
/// compaction of the chain running or not:
///
/// - an extendable chain ([`extendable`]) takes a delta;
/// - a chain that is not, but still shorter than [`MAX_DELTAS_COMPACTING`] delta files,
///   takes a delta while a compaction runs (started now if none runs and the chain can
///   be compacted, [`compactable`]);
/// - anything else is full.
pub(crate) fn plan(chain: Option<&[SegmentDescriptor]>, compacting: bool) -> KeyedSnapshot {
    match chain {
        Some(c) if extendable(c) => KeyedSnapshot::Delta,
        Some(c) if delta_files(c) < MAX_DELTAS_COMPACTING && (compacting || compactable(c)) => {
            KeyedSnapshot::DeltaWhileCompacting { start: !compacting }
        }
        _ => KeyedSnapshot::Full,
    }
}

/// Whether the task thread writes the segment files itself before it forwards the
/// barrier: when asked to (`async_snapshots = false`), or when no operator has a keyed
/// view to scan (operator state alone is small and already in memory).
pub(crate) fn write_on_task_thread(async_snapshots: bool, any_keyed_view: bool) -> bool {
    !async_snapshots || !any_keyed_view
}

/// Number of delta files in `chain`.
pub(crate) fn delta_files(chain: &[SegmentDescriptor]) -> usize {
    chain
        .iter()
        .filter(|d| d.codec == payload::KV_DELTA_CODEC)
        .map(|d| d.file.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Whether the next snapshot of an operator may be a delta on top of `chain`: it is empty
/// (nothing snapshotted yet, or an empty full snapshot, so a delta holds the whole state
/// on top of nothing), or it holds fewer than [`MAX_DELTAS`] delta files and fewer delta
/// bytes than full ones (so a restore reads at most about twice the state).
pub(crate) fn extendable(chain: &[SegmentDescriptor]) -> bool {
    let (mut full_bytes, mut delta_bytes) = (0, 0);
    for d in chain {
        if d.codec == payload::KV_DELTA_CODEC {
            delta_bytes += d.len;
        } else {
            full_bytes += d.len;
        }
    }
    chain.is_empty() || (delta_files(chain) < MAX_DELTAS as usize && delta_bytes < full_bytes)
}

/// Whether `base` (a chain that is no longer extendable) can be compacted: it holds at
/// least one delta, and its newest file lies in an epoch directory (where the compacted
/// file goes, design §5.5).
pub(crate) fn compactable(base: &[SegmentDescriptor]) -> bool {
    base.iter().any(|d| d.codec == payload::KV_DELTA_CODEC)
        && base
            .last()
            .and_then(|d| nop_stream_checkpoint::names::segment_dir_epoch(&d.file))
            .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload of `len` bytes in file `file` of epoch `epoch`'s directory.
    fn seg(epoch: u64, file: &str, codec: &str, len: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            state_path: format!("checkpoint/j.main/{epoch}/op/0/0/s"),
            operator_id: "op".into(),
            shard: 0,
            state: "s".into(),
            file: format!("segments/{epoch}/op/0.a1{file}.seg"),
            offset: 0,
            len,
            checksum: String::new(),
            codec: codec.into(),
            schema_version: 1,
            entries: 1,
        }
    }

    fn full(epoch: u64, len: u64) -> SegmentDescriptor {
        seg(epoch, "", payload::KV_CODEC, len)
    }

    fn delta(epoch: u64, len: u64) -> SegmentDescriptor {
        seg(epoch, "", payload::KV_DELTA_CODEC, len)
    }

    /// A full snapshot of `full_len` bytes and `n` deltas of `len` bytes each.
    fn chain(full_len: u64, n: u64, len: u64) -> Vec<SegmentDescriptor> {
        let mut c = vec![full(1, full_len)];
        c.extend((0..n).map(|i| delta(2 + i, len)));
        c
    }

    #[test]
    fn without_a_chain_the_snapshot_is_full() {
        assert_eq!(plan(None, false), KeyedSnapshot::Full);
        assert_eq!(plan(None, true), KeyedSnapshot::Full);
    }

    #[test]
    fn an_empty_chain_takes_a_delta_on_nothing() {
        assert_eq!(plan(Some(&[]), false), KeyedSnapshot::Delta);
    }

    #[test]
    fn a_chain_with_fewer_delta_bytes_than_full_ones_takes_a_delta() {
        let c = chain(1000, 3, 100);
        assert!(extendable(&c));
        assert_eq!(plan(Some(&c), false), KeyedSnapshot::Delta);
        // A running compaction goes on; the delta does not start another.
        assert_eq!(plan(Some(&c), true), KeyedSnapshot::Delta);
    }

    #[test]
    fn deltas_as_large_as_the_full_payloads_start_a_compaction() {
        let c = chain(1000, 2, 500);
        assert!(!extendable(&c) && compactable(&c));
        assert_eq!(
            plan(Some(&c), false),
            KeyedSnapshot::DeltaWhileCompacting { start: true }
        );
        assert_eq!(
            plan(Some(&c), true),
            KeyedSnapshot::DeltaWhileCompacting { start: false }
        );
    }

    #[test]
    fn max_deltas_tiny_deltas_start_a_compaction() {
        let c = chain(1 << 30, u64::from(MAX_DELTAS), 1);
        assert_eq!(delta_files(&c), MAX_DELTAS as usize);
        assert!(!extendable(&c));
        assert_eq!(
            plan(Some(&c), false),
            KeyedSnapshot::DeltaWhileCompacting { start: true }
        );
        let shorter = chain(1 << 30, u64::from(MAX_DELTAS) - 1, 1);
        assert_eq!(plan(Some(&shorter), false), KeyedSnapshot::Delta);
    }

    #[test]
    fn a_compaction_that_cannot_keep_up_is_abandoned_for_a_full_snapshot() {
        let c = chain(1 << 30, MAX_DELTAS_COMPACTING as u64, 1);
        assert_eq!(plan(Some(&c), true), KeyedSnapshot::Full);
        let below = chain(1 << 30, MAX_DELTAS_COMPACTING as u64 - 1, 1);
        assert_eq!(
            plan(Some(&below), true),
            KeyedSnapshot::DeltaWhileCompacting { start: false }
        );
    }

    #[test]
    fn a_chain_that_cannot_be_compacted_is_replaced_by_a_full_snapshot() {
        // No delta in it: nothing to fold (a full snapshot that is all deleted keys).
        let no_delta = vec![full(1, 0)];
        assert!(!extendable(&no_delta) && !compactable(&no_delta));
        assert_eq!(plan(Some(&no_delta), false), KeyedSnapshot::Full);
        // Its newest file is in no epoch directory: nowhere to put the compacted file.
        let mut outside = chain(10, 1, 10);
        outside.last_mut().unwrap().file = "restored.seg".into();
        assert!(!compactable(&outside));
        assert_eq!(plan(Some(&outside), false), KeyedSnapshot::Full);
    }

    #[test]
    fn deltas_count_by_file_not_by_payload() {
        // One delta file holding payloads of two shards is one delta.
        let mut c = vec![full(1, 1000), delta(2, 1), delta(2, 1)];
        c[2].shard = 1;
        assert_eq!(delta_files(&c), 1);
    }

    #[test]
    fn a_delta_the_state_cannot_give_falls_back_to_full() {
        for p in [
            KeyedSnapshot::Delta,
            KeyedSnapshot::DeltaWhileCompacting { start: true },
        ] {
            assert!(p.is_delta());
            assert_eq!(p.fallback(), KeyedSnapshot::Full);
        }
        assert!(!KeyedSnapshot::Full.is_delta());
    }

    #[test]
    fn the_task_thread_writes_when_asked_or_when_nothing_needs_a_scan() {
        assert!(write_on_task_thread(false, true));
        assert!(write_on_task_thread(true, false));
        assert!(!write_on_task_thread(true, true));
    }
}
