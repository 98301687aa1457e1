//! Complex event processing: a Flink-CEP-style [`Pattern`] API and [`CepOperator`], an NFA
//! running on the host's unified keyed state and event-time timers (design §9.2, §8.4).
//!
//! # Model
//! A [`Pattern`] is a sequence of named stages with contiguity (`next` strict,
//! `followed_by` relaxed, `followed_by_any` non-deterministic), quantifiers (`times`,
//! `times_range`, `one_or_more`, `optional`), named *iterative* conditions that see the
//! events matched so far ([`MatchSoFar`]), negative stages (`not_next`,
//! `not_followed_by`), a `within` window (ms of event time from a match's first event) and
//! an [`AfterMatchSkip`] strategy. Its model ([`Pattern::to_model_json`]) goes into
//! `describe()` via [`crate::PluginInfo::model`] and so into the plan fingerprint.
//!
//! # Runtime (design §9.2)
//! [`CepOperator`] is embedded in a plugin's [`crate::Operator`]. Per record key (the
//! runtime routes by it) it keeps, in namespace [`CEP_NAMESPACE`]:
//!
//! | state | kind | user key → value |
//! |---|---|---|
//! | [`QUEUE_STATE`] `cep-queue` | map | event time (8 bytes, order-preserving) → events at that time, arrival order |
//! | [`NFA_STATE`] `cep-nfa` | value | partial matches (stage, count, event ids, start time, guards) and id counters |
//! | [`BUFFER_STATE`] `cep-buffer` | map | event id (8 bytes BE) → event, its time and reference count (shared buffer) |
//!
//! Records are buffered in the queue and an event-time timer (namespace
//! [`CEP_NAMESPACE`]) is registered at their timestamp; only when the watermark passes
//! them are they fed to the NFA, in timestamp order (arrival order for equal
//! timestamps), so out-of-order arrival within the watermark gives the same matches as
//! sorted input. A further timer at `start + within` prunes partial matches (design §8.4:
//! timers are state; in the instance, with silent expiry below, the sweep and the key's
//! next run do). When a key has no partial match and no queued event, all its CEP
//! state and timers are deleted.
//!
//! Between checkpoints the instance keeps the keys it has read decoded, with their timers
//! in an in-memory queue, and works on that copy; `prepare_checkpoint` (and `finish`)
//! write every changed key back to the three states and move each key's one host timer
//! to its current time, so at every barrier host state and timers are exact, and an
//! instance may be dropped after `prepare_checkpoint` and re-opened on the restored state
//! (the runtime only restores from checkpoints). A key left with nothing stays cached
//! (its next event then needs no read); past [`MAX_CACHED_KEYS`] keys those are dropped
//! first, and if that is not enough the copy is written back and dropped between
//! checkpoints too. With timeouts discarded ([`CepOperator::discard_timed_out`]) and no
//! `not_followed_by`, an expired partial match produces nothing, so the instance runs a
//! key for its queued events only (silent expiry): expired partial matches are pruned
//! when the key next runs, or by a sweep before every write-back, so host state at a
//! barrier holds no expired partial match and each key's host timer is still at its
//! earliest deadline. Keys due at one watermark then run in the order of their earliest
//! queued event, which can order different keys' matches differently from reporting
//! timeouts (see [`CepOperator::discard_timed_out`]). (Until December
//! 2026, every call read and wrote the states and moved the timers; the state layout is
//! unchanged, so savepoints restore across the change.)
//!
//! Because a cached key is read from the host only once, a job-level state TTL
//! (`state_ttl_ms`) on these states expires a key only after the instance has dropped it
//! from its cache (a full cache, a restart); the guest cannot see the TTL. The pattern's
//! `within` bounds partial matches either way.
//!
//! # Semantics in brief
//! - `within(w)`: a partial match is pruned when event time reaches `start + w`
//!   (`ts - start >= w`, as in Flink), before events of that timestamp are processed.
//! - Timed-out partial matches go to side output [`TIMED_OUT`] (`"timed-out"`), unless
//!   their events already formed an emitted match (e.g. a loop that matched and could
//!   have taken more). Identical partial matches timing out together are reported once.
//! - A pattern ending in `not_followed_by(x).within(w)` completes by timeout: when event
//!   time reaches `start + w` with no `x` since the last positive event, the match is
//!   emitted once (then `Match::timeout_ts` is `Some(start + w)`).
//! - Late records (timestamp ≤ current watermark on arrival) are dropped and counted
//!   (metric `cep_late_events`, [`CepOperator::late_events`]) or, with
//!   [`LateEvents::SideOutput`], sent unchanged to side output [`LATE`] (`"late"`).
//! - Each match is emitted with the input key and the timestamp of its last event.
//! - Not implemented: `greedy()` loops; processing-time patterns.

mod nfa;
mod operator;
mod pattern;
#[cfg(test)]
mod tests;

pub use operator::{
    BUFFER_STATE, CEP_NAMESPACE, CepOperator, DecodeFn, EmitFn, LATE, LateEvents, MAX_CACHED_KEYS,
    NFA_STATE, QUEUE_STATE, STATE_SCHEMA, TIMED_OUT,
};
pub use pattern::{AfterMatchSkip, Contiguity, Pattern, StageKind};

use nfa::SharedBuffer;
use pattern::Stage;

/// The events a partial match has taken so far, as seen by a condition (iterative
/// conditions, Flink's `IterativeCondition.Context`).
pub struct MatchSoFar<'a, E> {
    stages: &'a [Stage],
    events: &'a [(u16, u64)],
    buffer: &'a SharedBuffer<E>,
}

impl<'a, E> MatchSoFar<'a, E> {
    fn stage_index(&self, stage: &str) -> Option<u16> {
        self.stages
            .iter()
            .position(|s| s.name == stage)
            .map(|i| i as u16)
    }

    /// The events taken for `stage` so far, in order (with their timestamps, ms); empty
    /// for an unknown stage or one not reached yet.
    pub fn events(&self, stage: &str) -> impl Iterator<Item = (i64, &'a E)> + 'a {
        let s = self.stage_index(stage);
        let buffer = self.buffer;
        self.events
            .iter()
            .filter(move |e| Some(e.0) == s)
            .map(move |e| {
                let b = &buffer[&e.1];
                (b.ts, &b.event)
            })
    }

    /// The last event taken for `stage`, if any.
    pub fn last(&self, stage: &str) -> Option<&'a E> {
        self.events(stage).last().map(|e| e.1)
    }

    /// The first event taken for `stage`, if any.
    pub fn first(&self, stage: &str) -> Option<&'a E> {
        self.events(stage).next().map(|e| e.1)
    }

    /// Number of events taken for `stage`.
    pub fn count(&self, stage: &str) -> usize {
        self.events(stage).count()
    }

    /// The most recently taken event of the partial match (any stage), if any.
    pub fn last_event(&self) -> Option<&'a E> {
        self.events.last().map(|e| &self.buffer[&e.1].event)
    }

    /// Timestamp (ms) of the partial match's first event; `None` before the first event.
    pub fn start_timestamp(&self) -> Option<i64> {
        self.events.first().map(|e| self.buffer[&e.1].ts)
    }
}

/// An event with its event time (ms since the Unix epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed<E> {
    /// Event time in ms.
    pub timestamp: i64,
    /// The event.
    pub event: E,
}

/// The events one stage contributed to a match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedStage<E> {
    /// Stage name.
    pub name: String,
    /// Events in event-time order (at least one).
    pub events: Vec<Timed<E>>,
}

/// A complete (or, on side output `timed-out`, timed-out partial) match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match<E> {
    /// The record key the match belongs to.
    pub key: Vec<u8>,
    /// Stages that took events, in pattern order (stage name → events).
    pub stages: Vec<MatchedStage<E>>,
    /// Timestamp of the first event (ms).
    pub start_ts: i64,
    /// Timestamp of the last event (ms); the output record's timestamp.
    pub end_ts: i64,
    /// `Some(start + within)` for a timed-out partial match and for a match completed by
    /// a trailing `not_followed_by` window running out; `None` otherwise.
    pub timeout_ts: Option<i64>,
}

impl<E> Match<E> {
    /// Events of `stage` (empty if it took none or does not exist).
    pub fn get(&self, stage: &str) -> &[Timed<E>] {
        self.stages
            .iter()
            .find(|s| s.name == stage)
            .map_or(&[], |s| s.events.as_slice())
    }

    /// Every event of the match in order, with its stage name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Timed<E>)> + '_ {
        self.stages
            .iter()
            .flat_map(|s| s.events.iter().map(move |e| (s.name.as_str(), e)))
    }
}
