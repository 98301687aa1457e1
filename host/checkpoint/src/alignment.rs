//! Barrier alignment of a multi-input task (design §5.4), pure: the task asks which input
//! channels it may read and reports each barrier; the aligner says when to snapshot.
//!
//! - A barrier N on channel C marks C aligned: records behind it on C are held (the task
//!   stops reading C) while unaligned channels keep flowing.
//! - When every channel delivered N, the task snapshots, forwards N and reads all again.
//! - A barrier of an epoch already completed or older than the one aligning is stale and
//!   ignored; a newer one supersedes an unfinished alignment (its epoch was aborted), and
//!   the channels that delivered only the old barrier are read again.

use nop_stream_api::EpochId;
use std::collections::BTreeSet;

/// What a barrier means for the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alignment {
    /// Stale or duplicate: nothing to do.
    Ignored,
    /// Hold this channel; wait for the others.
    Holding,
    /// Every channel delivered the barrier: snapshot `epoch` now.
    Aligned(EpochId),
}

/// Alignment state of one task with `channels` inputs.
#[derive(Debug, Clone)]
pub struct Aligner {
    channels: usize,
    current: Option<(EpochId, BTreeSet<usize>)>,
    last_completed: Option<EpochId>,
}

impl Aligner {
    /// An aligner for `channels` input channels.
    pub fn new(channels: usize) -> Self {
        Aligner {
            channels,
            current: None,
            last_completed: None,
        }
    }

    /// The epoch being aligned, if any.
    pub fn aligning(&self) -> Option<EpochId> {
        self.current.as_ref().map(|(e, _)| *e)
    }

    /// Whether reading `channel` must wait (it delivered the barrier being aligned).
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.current
            .as_ref()
            .is_some_and(|(_, s)| s.contains(&channel))
    }

    /// Reports barrier `epoch` on `channel`.
    pub fn on_barrier(&mut self, channel: usize, epoch: EpochId) -> Alignment {
        if self.last_completed.is_some_and(|l| epoch <= l) {
            return Alignment::Ignored;
        }
        match &mut self.current {
            Some((e, _)) if *e > epoch => return Alignment::Ignored,
            Some((e, set)) if *e == epoch => {
                if !set.insert(channel) {
                    return Alignment::Ignored;
                }
            }
            _ => self.current = Some((epoch, BTreeSet::from([channel]))),
        }
        let done = self
            .current
            .as_ref()
            .is_some_and(|(_, s)| s.len() >= self.channels);
        if done {
            self.current = None;
            self.last_completed = Some(epoch);
            Alignment::Aligned(epoch)
        } else {
            Alignment::Holding
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, VecDeque};

    #[test]
    fn holds_aligned_channels_until_all_arrive() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(1, EpochId(5)), Alignment::Holding);
        assert!(a.is_blocked(1) && !a.is_blocked(0));
        assert_eq!(a.on_barrier(1, EpochId(5)), Alignment::Ignored, "duplicate");
        assert_eq!(a.on_barrier(0, EpochId(4)), Alignment::Ignored, "stale");
        assert_eq!(a.on_barrier(0, EpochId(5)), Alignment::Holding);
        assert_eq!(a.on_barrier(2, EpochId(5)), Alignment::Aligned(EpochId(5)));
        assert!(!a.is_blocked(1));
        // Regression: a duplicate barrier of a completed epoch must not start a new alignment.
        assert_eq!(a.on_barrier(2, EpochId(5)), Alignment::Ignored);
        assert_eq!(a.aligning(), None);
    }

    #[test]
    fn newer_barrier_supersedes_an_aborted_alignment() {
        let mut a = Aligner::new(2);
        assert_eq!(a.on_barrier(0, EpochId(1)), Alignment::Holding);
        assert_eq!(a.on_barrier(1, EpochId(2)), Alignment::Holding);
        assert!(!a.is_blocked(0), "channel 0 has not delivered epoch 2 yet");
        assert_eq!(a.on_barrier(0, EpochId(1)), Alignment::Ignored);
        assert_eq!(a.on_barrier(0, EpochId(2)), Alignment::Aligned(EpochId(2)));
    }

    #[derive(Debug, Clone)]
    enum Msg {
        Record(u32),
        Barrier(u64),
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Chandy–Lamport consistency: whatever order the task reads its channels in,
        /// the records processed before snapshot N are exactly those that precede
        /// barrier N on their channel, and each epoch snapshots once.
        #[test]
        fn snapshots_cut_every_channel_at_its_barrier(
            layout in proptest::collection::vec(proptest::collection::vec(0u8..4, 0..12), 1..4),
            picks in proptest::collection::vec(any::<u16>(), 200),
            dup in any::<bool>(),
        ) {
            let epochs = 3u64;
            // Channel c: records interleaved with barriers 1..=epochs, in order.
            let mut queues: Vec<VecDeque<Msg>> = Vec::new();
            let mut before: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
            let mut next_id = 0u32;
            for counts in &layout {
                let mut q = VecDeque::new();
                let mut seen = Vec::new();
                for e in 1..=epochs {
                    let n = counts.get(e as usize - 1).copied().unwrap_or(1);
                    for _ in 0..n {
                        q.push_back(Msg::Record(next_id));
                        seen.push(next_id);
                        next_id += 1;
                    }
                    q.push_back(Msg::Barrier(e));
                    if dup && e == 2 {
                        q.push_back(Msg::Barrier(e)); // a duplicate must be harmless
                    }
                    before.entry(e).or_default().extend(seen.iter().copied());
                }
                queues.push(q);
            }
            let mut a = Aligner::new(queues.len());
            let mut processed = BTreeSet::new();
            let mut snapshots = Vec::new();
            let mut pick = picks.into_iter().cycle();
            let mut steps = 0;
            while queues.iter().any(|q| !q.is_empty()) {
                steps += 1;
                prop_assert!(steps < 10_000, "no progress");
                let readable: Vec<usize> = (0..queues.len())
                    .filter(|c| !queues[*c].is_empty() && !a.is_blocked(*c))
                    .collect();
                prop_assert!(!readable.is_empty(), "deadlock: every non-empty channel blocked");
                let c = readable[pick.next().unwrap() as usize % readable.len()];
                match queues[c].pop_front().unwrap() {
                    Msg::Record(r) => { processed.insert(r); }
                    Msg::Barrier(e) => {
                        if let Alignment::Aligned(epoch) = a.on_barrier(c, EpochId(e)) {
                            prop_assert_eq!(&processed, &before[&epoch.0], "cut of epoch {}", epoch.0);
                            snapshots.push(epoch.0);
                        }
                    }
                }
            }
            prop_assert_eq!(snapshots, (1..=epochs).collect::<Vec<_>>());
        }
    }
}
