//! The NFA core: partial matches ("runs") over one key's events, with no I/O. The operator
//! loads a key's [`KeyNfa`] from keyed state, feeds it events in event-time order and
//! time advances, and writes it back (design §9.2).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Index;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::pattern::{AfterMatchSkip, Contiguity, Pattern, StageKind};
use super::{Match, MatchSoFar, MatchedStage, Timed};

/// A partial match. Stored in the `cep-nfa` value state.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Run {
    /// Creation order within the key; orders runs and same-step matches.
    pub id: u64,
    /// Stage the run waits in; `stages.len()` for a completed run waiting for its
    /// `not_followed_by` window to run out (absence).
    pub stage: u16,
    /// Events taken in `stage` so far.
    pub count: u32,
    /// `(stage, event id)` of every taken event, in take order.
    pub events: TakenEvents,
    /// Event time of the first event (ms).
    pub start_ts: i64,
    /// Negative stages guarding the run until its next take (`not_next` guards expire
    /// after one event).
    pub guards: Vec<u16>,
    /// Whether `events` already formed an emitted match (then a timeout is not reported).
    pub emitted: bool,
}

impl Clone for Run {
    /// Copies the taken events as one slice (a derived clone extends them one by one).
    fn clone(&self) -> Self {
        Run {
            id: self.id,
            stage: self.stage,
            count: self.count,
            events: TakenEvents::from_slice(&self.events),
            start_ts: self.start_ts,
            guards: self.guards.clone(),
            emitted: self.emitted,
        }
    }
}

impl Run {
    /// A placeholder left where a run was moved out (allocates nothing).
    const EMPTY: Run = Run {
        id: 0,
        stage: 0,
        count: 0,
        events: TakenEvents::new_const(),
        start_ts: 0,
        guards: Vec::new(),
        emitted: false,
    };

    fn start_id(&self) -> u64 {
        self.events[0].1
    }
}

/// A run's taken events: inline up to [`INLINE_TAKES`] (no allocation when a run is
/// created, copied into a new stage or extended), stored as a sequence like a `Vec`.
pub(crate) type TakenEvents = SmallVec<[(u16, u64); INLINE_TAKES]>;

/// Taken events a run holds without an allocation.
pub(crate) const INLINE_TAKES: usize = 4;

/// Per-key NFA bookkeeping, the value of the `cep-nfa` state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NfaState {
    /// Next event id (event ids number this key's events in processing order).
    pub next_event_id: u64,
    /// Next run id.
    pub next_run_id: u64,
    /// Live partial matches, ascending by id.
    pub runs: Vec<Run>,
}

/// One event in the shared buffer (`cep-buffer` map state, user key = event id): stored
/// once however many runs reference it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct BufEntry<E> {
    /// Event time (ms).
    pub ts: i64,
    /// The decoded event.
    pub event: E,
    /// Number of runs referencing the event.
    pub refs: u32,
}

/// One key's shared buffer: event id → [`BufEntry`], ascending by id. Event ids are
/// handed out in increasing order, so an insert appends; a lookup is a binary search over
/// the few events a key's partial matches hold. Stored as the map event id → entry (the
/// [`super::BUFFER_STATE`] layout and schema, postcard): serialized entry by entry,
/// deserialized through `BTreeMap<u64, BufEntry<E>>`. (Until December 2026 it was that
/// `BTreeMap`, which allocated a node for a key's first event and freed it when the
/// key's last partial match ended: about every event of the CEP benchmark.)
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SharedBuffer<E> {
    items: Vec<(u64, BufEntry<E>)>,
}

impl<E> Default for SharedBuffer<E> {
    fn default() -> Self {
        SharedBuffer { items: Vec::new() }
    }
}

impl<E> SharedBuffer<E> {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn position(&self, id: u64) -> std::result::Result<usize, usize> {
        self.items.binary_search_by_key(&id, |(i, _)| *i)
    }

    /// Stores `entry` as event `id`, replacing an entry of that id.
    pub fn insert(&mut self, id: u64, entry: BufEntry<E>) {
        if self.items.last().is_none_or(|(last, _)| *last < id) {
            self.items.push((id, entry));
            return;
        }
        match self.position(id) {
            Ok(at) => self.items[at].1 = entry,
            Err(at) => self.items.insert(at, (id, entry)),
        }
    }

    pub fn get(&self, id: &u64) -> Option<&BufEntry<E>> {
        self.position(*id).ok().map(|at| &self.items[at].1)
    }

    pub fn get_mut(&mut self, id: &u64) -> Option<&mut BufEntry<E>> {
        self.position(*id).ok().map(|at| &mut self.items[at].1)
    }

    /// Entries in ascending id order.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &BufEntry<E>)> {
        self.items.iter().map(|(id, e)| (id, e))
    }

    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &u64> {
        self.items.iter().map(|(id, _)| id)
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }
}

impl<E> Index<&u64> for SharedBuffer<E> {
    type Output = BufEntry<E>;

    /// # Panics
    /// If no event of that id is buffered (a run references only buffered events).
    fn index(&self, id: &u64) -> &BufEntry<E> {
        self.get(id)
            .expect("a referenced event is in the shared buffer")
    }
}

impl<E> FromIterator<(u64, BufEntry<E>)> for SharedBuffer<E> {
    fn from_iter<I: IntoIterator<Item = (u64, BufEntry<E>)>>(iter: I) -> Self {
        let mut b = SharedBuffer::default();
        for (id, e) in iter {
            b.insert(id, e);
        }
        b
    }
}

impl<E: Serialize> Serialize for SharedBuffer<E> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.items.len()))?;
        for (id, e) in &self.items {
            map.serialize_entry(id, e)?;
        }
        map.end()
    }
}

impl<'de, E: Deserialize<'de>> Deserialize<'de> for SharedBuffer<E> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = BTreeMap::<u64, BufEntry<E>>::deserialize(d)?;
        Ok(SharedBuffer {
            items: map.into_iter().collect(),
        })
    }
}

/// What processing produced, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Output<E> {
    /// A complete match (main output).
    Matched(Match<E>),
    /// A partial match pruned by `within` (side output `timed-out`).
    TimedOut(Match<E>),
}

/// One key's NFA: state plus the in-memory shared buffer.
pub(crate) struct KeyNfa<E> {
    pub state: NfaState,
    pub buffer: SharedBuffer<E>,
    /// Build [`Output::TimedOut`] for partial matches pruned by `within` (false: prune
    /// them silently, as `MATCH_RECOGNIZE` does).
    pub report_timeouts: bool,
    /// An empty `Vec` whose capacity the next event's runs reuse (the runs of an event
    /// and of the one before swap buffers, so a step allocates no `Vec` of runs); the
    /// operator hands it from key to key.
    pub spare: Vec<Run>,
}

impl<E: Clone> KeyNfa<E> {
    /// Deadline (`start + within`) of `run`, if the pattern has `within`.
    pub fn deadline(p: &Pattern<E>, run: &Run) -> Option<i64> {
        p.within.map(|w| run.start_ts.saturating_add(w))
    }

    fn so_far<'a>(&'a self, p: &'a Pattern<E>, events: &'a [(u16, u64)]) -> MatchSoFar<'a, E> {
        MatchSoFar {
            stages: &p.stages,
            events,
            buffer: &self.buffer,
        }
    }

    fn new_id(&mut self) -> u64 {
        let id = self.state.next_run_id;
        self.state.next_run_id += 1;
        id
    }

    /// Builds the [`Match`] of `events` for `key`.
    pub fn to_match(
        &self,
        p: &Pattern<E>,
        key: &[u8],
        events: &[(u16, u64)],
        timeout_ts: Option<i64>,
    ) -> Match<E> {
        let mut stages: Vec<MatchedStage<E>> = Vec::new();
        for &(s, id) in events {
            let b = &self.buffer[&id];
            let name = &p.stages[usize::from(s)].name;
            let ev = Timed {
                timestamp: b.ts,
                event: b.event.clone(),
            };
            match stages.iter_mut().find(|m| &m.name == name) {
                Some(m) => m.events.push(ev),
                None => stages.push(MatchedStage {
                    name: name.clone(),
                    events: vec![ev],
                }),
            }
        }
        // Pattern order (takes are already in stage order; this keeps it explicit).
        stages.sort_by_key(|m| p.stages.iter().position(|s| s.name == m.name));
        let start_ts = self.buffer[&events[0].1].ts;
        let end_ts = self.buffer[&events[events.len() - 1].1].ts;
        Match {
            key: key.to_vec(),
            stages,
            start_ts,
            end_ts,
            timeout_ts,
        }
    }

    /// Spawns the runs that follow `t` having just taken an event into its stage:
    /// the loop run (if the stage may take more) and the runs entering later stages (if
    /// the stage has enough events). Completed matches go to `done`. `t` itself becomes
    /// the loop run (its id is taken first, so ids are as if it were pushed first; the
    /// caller sorts `runs` by id).
    fn expand(&mut self, p: &Pattern<E>, t: Run, runs: &mut Vec<Run>, done: &mut Vec<Run>) {
        let st = &p.stages[usize::from(t.stage)];
        let first_new = runs.len();
        let done_before = done.len();
        let loop_id = st.max.is_none_or(|m| t.count < m).then(|| self.new_id());
        if t.count >= st.min {
            self.enter(p, usize::from(t.stage) + 1, &t, Vec::new(), runs, done);
        }
        if let Some(id) = loop_id {
            runs.push(Run { id, ..t });
        }
        if done.len() > done_before {
            for r in &mut runs[first_new..] {
                r.emitted = true;
            }
        }
    }

    fn enter(
        &mut self,
        p: &Pattern<E>,
        j: usize,
        base: &Run,
        guards: Vec<u16>,
        runs: &mut Vec<Run>,
        done: &mut Vec<Run>,
    ) {
        let id = self.new_id();
        let mk = |stage: usize, guards: Vec<u16>| Run {
            id,
            stage: stage as u16,
            count: 0,
            events: TakenEvents::from_slice(&base.events),
            start_ts: base.start_ts,
            guards,
            emitted: false,
        };
        if j == p.stages.len() {
            if guards
                .iter()
                .any(|&g| p.stages[usize::from(g)].kind == StageKind::NotFollowedBy)
            {
                runs.push(mk(j, guards));
            } else {
                done.push(mk(j, Vec::new()));
            }
            return;
        }
        let st = &p.stages[j];
        if st.kind != StageKind::Positive {
            let mut g = guards;
            g.push(j as u16);
            return self.enter(p, j + 1, base, g, runs, done);
        }
        runs.push(mk(j, guards.clone()));
        if st.optional {
            self.enter(p, j + 1, base, guards, runs, done);
        }
    }

    /// Feeds one event (the next in event-time order, `ts` ms) through every run and the
    /// pattern's start; completed matches are emitted according to the skip strategy.
    pub fn process_event(
        &mut self,
        p: &Pattern<E>,
        key: &[u8],
        ts: i64,
        event: E,
        out: &mut Vec<Output<E>>,
    ) {
        let eid = self.state.next_event_id;
        self.state.next_event_id += 1;
        self.buffer.insert(eid, BufEntry { ts, event, refs: 0 });
        let mut old = std::mem::take(&mut self.state.runs);
        let mut runs: Vec<Run> = std::mem::take(&mut self.spare);
        debug_assert!(runs.is_empty());
        let mut done: Vec<Run> = Vec::new();
        for mut r in old.drain(..) {
            let (take, keep) = {
                let ev = &self.buffer[&eid].event;
                let m = self.so_far(p, &r.events);
                if r.guards
                    .iter()
                    .any(|&g| p.eval(&p.stages[usize::from(g)].cond, ev, &m))
                {
                    continue;
                }
                if usize::from(r.stage) == p.stages.len() {
                    (false, true)
                } else {
                    let st = &p.stages[usize::from(r.stage)];
                    if r.count > 0 && st.until.as_ref().is_some_and(|u| p.eval(u, ev, &m)) {
                        continue;
                    }
                    let take = st.max.is_none_or(|mx| r.count < mx) && p.eval(&st.cond, ev, &m);
                    let contiguity = if r.count == 0 {
                        st.contiguity
                    } else {
                        st.inner
                    };
                    let keep = match contiguity {
                        Contiguity::Strict => false,
                        Contiguity::Relaxed => !take,
                        Contiguity::NonDeterministic => true,
                    };
                    (take, keep)
                }
            };
            if take {
                // The taken run is the kept one's copy, or the run itself if not kept.
                let mut t = if keep {
                    r.clone()
                } else {
                    std::mem::replace(&mut r, Run::EMPTY)
                };
                t.events.push((t.stage, eid));
                t.count += 1;
                t.guards.clear();
                t.emitted = false;
                self.expand(p, t, &mut runs, &mut done);
            }
            if keep {
                r.guards
                    .retain(|&g| p.stages[usize::from(g)].kind == StageKind::NotFollowedBy);
                runs.push(r);
            }
        }
        let starts = {
            let ev = &self.buffer[&eid].event;
            p.eval(&p.stages[0].cond, ev, &self.so_far(p, &[]))
        };
        if starts {
            let t = Run {
                id: 0,
                stage: 0,
                count: 1,
                events: smallvec::smallvec![(0, eid)],
                start_ts: ts,
                guards: Vec::new(),
                emitted: false,
            };
            self.expand(p, t, &mut runs, &mut done);
        }
        runs.sort_by_key(|r| r.id);
        self.state.runs = runs;
        self.spare = old;
        done.sort_by_key(|r| (r.start_id(), r.id));
        self.emit_all(p, key, done, None, out);
    }

    /// Emits `done` in order, pruning after each emitted match per the skip strategy.
    fn emit_all(
        &mut self,
        p: &Pattern<E>,
        key: &[u8],
        mut done: Vec<Run>,
        timeout_ts: Option<i64>,
        out: &mut Vec<Output<E>>,
    ) {
        let mut i = 0;
        while i < done.len() {
            let events = done[i].events.clone();
            out.push(Output::Matched(self.to_match(p, key, &events, timeout_ts)));
            if let Some((point, inclusive)) = pruning_point(p, &events) {
                let prune = |r: &Run| {
                    let s = r.start_id();
                    if inclusive { s <= point } else { s < point }
                };
                self.state.runs.retain(|r| !prune(r));
                let rest: Vec<Run> = done.drain(i + 1..).filter(|r| !prune(r)).collect();
                done.extend(rest);
            }
            i += 1;
        }
    }

    /// Event time reached `t` (ms): runs with `start + within <= t` are pruned — reported
    /// as timed out unless already emitted, or emitted as a match if they only waited for
    /// a trailing `not_followed_by` window to run out.
    pub fn advance_time(&mut self, p: &Pattern<E>, key: &[u8], t: i64, out: &mut Vec<Output<E>>) {
        if p.within.is_none()
            || !self
                .state
                .runs
                .iter()
                .any(|r| Self::deadline(p, r).is_some_and(|d| d <= t))
        {
            return;
        }
        // Runs that only time out, unreported: pruned in place (this is where a
        // `MATCH_RECOGNIZE`-like pattern spends most calls).
        if !self.report_timeouts
            && !self
                .state
                .runs
                .iter()
                .any(|r| usize::from(r.stage) == p.stages.len())
        {
            self.state
                .runs
                .retain(|r| Self::deadline(p, r).is_none_or(|d| d > t));
            return;
        }
        // The live runs stay where they are, in order.
        let mut expired: Vec<Run> = self
            .state
            .runs
            .extract_if(.., |r| Self::deadline(p, r).is_some_and(|d| d <= t))
            .collect();
        if expired.is_empty() {
            return;
        }
        expired.sort_by_key(|r| (Self::deadline(p, r), r.start_id(), r.id));
        let mut reported: BTreeSet<TakenEvents> = BTreeSet::new();
        let mut pruned: BTreeSet<u64> = BTreeSet::new();
        for r in &expired {
            if pruned.contains(&r.id) {
                continue;
            }
            let deadline = Self::deadline(p, r);
            if usize::from(r.stage) == p.stages.len() {
                out.push(Output::Matched(self.to_match(p, key, &r.events, deadline)));
                if let Some((point, inclusive)) = pruning_point(p, &r.events) {
                    let prune = |x: &Run| {
                        let s = x.start_id();
                        if inclusive { s <= point } else { s < point }
                    };
                    self.state.runs.retain(|x| !prune(x));
                    pruned.extend(expired.iter().filter(|x| prune(x)).map(|x| x.id));
                }
            } else if self.report_timeouts && !r.emitted && reported.insert(r.events.clone()) {
                out.push(Output::TimedOut(self.to_match(p, key, &r.events, deadline)));
            }
        }
    }

    /// Recomputes reference counts and drops buffered events no run references.
    pub fn collect_garbage(&mut self) {
        if self.state.runs.is_empty() {
            self.buffer.clear();
            return;
        }
        for (_, b) in &mut self.buffer.items {
            b.refs = 0;
        }
        for r in &self.state.runs {
            for (_, id) in &r.events {
                if let Some(b) = self.buffer.get_mut(id) {
                    b.refs += 1;
                }
            }
        }
        self.buffer.items.retain(|(_, b)| b.refs > 0);
    }
}

/// `(event id, inclusive)`: partial matches starting at (inclusive) or before that event
/// are discarded after emitting a match of `events`; `None` for no pruning.
fn pruning_point<E>(p: &Pattern<E>, events: &[(u16, u64)]) -> Option<(u64, bool)> {
    let stage_of = |name: &str| p.stages.iter().position(|s| s.name == name);
    match &p.skip {
        AfterMatchSkip::NoSkip => None,
        AfterMatchSkip::SkipToNext => Some((events[0].1, true)),
        AfterMatchSkip::SkipPastLastEvent => Some((events[events.len() - 1].1, true)),
        AfterMatchSkip::SkipToFirst(n) => {
            let s = stage_of(n)? as u16;
            events.iter().find(|e| e.0 == s).map(|e| (e.1, false))
        }
        AfterMatchSkip::SkipToLast(n) => {
            let s = stage_of(n)? as u16;
            events.iter().rev().find(|e| e.0 == s).map(|e| (e.1, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Run`] and [`NfaState`] as stored before the taken events were held inline.
    #[derive(Debug, Serialize, Deserialize)]
    struct VecRun {
        id: u64,
        stage: u16,
        count: u32,
        events: Vec<(u16, u64)>,
        start_ts: i64,
        guards: Vec<u16>,
        emitted: bool,
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct VecNfaState {
        next_event_id: u64,
        next_run_id: u64,
        runs: Vec<VecRun>,
    }

    #[test]
    fn garbage_collection_keeps_exactly_the_referenced_events_with_their_counts() {
        let mut next = crate::test_lcg(0x9e37_79b9_7f4a_7c15);
        for round in 0..300 {
            let events = next() % 40;
            let mut k: KeyNfa<u32> = KeyNfa {
                state: NfaState::default(),
                buffer: (0..events)
                    .filter(|_| !next().is_multiple_of(4))
                    .map(|id| {
                        (
                            id * 3,
                            BufEntry {
                                ts: id as i64,
                                event: id as u32,
                                refs: 9,
                            },
                        )
                    })
                    .collect(),
                report_timeouts: true,
                spare: Vec::new(),
            };
            let ids: Vec<u64> = k.buffer.keys().copied().collect();
            for r in 0..next() % 6 {
                let mut taken: Vec<(u16, u64)> = ids
                    .iter()
                    .filter(|_| next().is_multiple_of(3))
                    .map(|&id| (0, id))
                    .collect();
                if taken.is_empty() && !ids.is_empty() && round % 2 == 0 {
                    taken.push((0, ids[next() as usize % ids.len()]));
                }
                k.state.runs.push(Run {
                    id: r,
                    stage: 0,
                    count: taken.len() as u32,
                    events: taken.into_iter().collect(),
                    start_ts: 0,
                    guards: Vec::new(),
                    emitted: false,
                });
            }
            // The reference: count every run's references, keep the referenced.
            let mut want: BTreeMap<u64, u32> = BTreeMap::new();
            for r in &k.state.runs {
                for (_, id) in &r.events {
                    *want.entry(*id).or_default() += 1;
                }
            }
            k.collect_garbage();
            let got: BTreeMap<u64, u32> = k.buffer.iter().map(|(id, b)| (*id, b.refs)).collect();
            assert_eq!(got, want, "round {round}");
        }
    }

    #[test]
    fn a_shared_buffer_is_stored_as_the_map_of_event_id_to_entry() {
        let entry = |ts: i64, refs: u32| BufEntry {
            ts,
            event: ts as u32 * 7,
            refs,
        };
        // Ids in order (the operator's case), then out of order and one replaced.
        let ids = [3u64, 4, 9, 20, 1, 15, 9];
        let mut b: SharedBuffer<u32> = SharedBuffer::default();
        let mut map: BTreeMap<u64, BufEntry<u32>> = BTreeMap::new();
        for (i, id) in ids.into_iter().enumerate() {
            b.insert(id, entry(i as i64, i as u32 + 1));
            map.insert(id, entry(i as i64, i as u32 + 1));
        }
        let flat: Vec<(u64, BufEntry<u32>)> = map.clone().into_iter().collect();
        assert_eq!(b.items, flat);
        assert_eq!(b[&9], map[&9]);
        assert!(b.get(&2).is_none() && b.get(&21).is_none());
        let bytes = postcard::to_allocvec(&b).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&map).unwrap());
        assert_eq!(
            postcard::from_bytes::<SharedBuffer<u32>>(&bytes).unwrap(),
            b
        );
        assert_eq!(
            postcard::to_allocvec(&SharedBuffer::<u32>::default()).unwrap(),
            postcard::to_allocvec(&BTreeMap::<u64, BufEntry<u32>>::new()).unwrap()
        );
        let schema = crate::state::schema_of::<SharedBuffer<u32>>();
        assert!(schema.is_some());
        assert_eq!(
            schema,
            crate::state::schema_of::<BTreeMap<u64, BufEntry<u32>>>()
        );
    }

    #[test]
    fn runs_are_stored_as_before_their_events_were_inline() {
        // Runs with fewer, as many and more taken events than fit inline, as stored
        // before: read back, then written again, byte for byte.
        let old = VecNfaState {
            next_event_id: 120,
            next_run_id: 3,
            runs: [
                (vec![(0, 7)], vec![]),
                (vec![(0, 1), (1, 4), (1, 5), (2, 9)], vec![3]),
                (
                    (0..9).map(|i| (i as u16 % 3, 100 + i)).collect(),
                    vec![1, 2],
                ),
            ]
            .into_iter()
            .enumerate()
            .map(|(i, (events, guards))| VecRun {
                id: i as u64,
                stage: 1,
                count: events.len() as u32,
                events,
                start_ts: -5 + i as i64,
                guards,
                emitted: i == 1,
            })
            .collect(),
        };
        let bytes = postcard::to_allocvec(&old).unwrap();
        let state: NfaState = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            (state.next_event_id, state.next_run_id, state.runs.len()),
            (120, 3, 3)
        );
        for (new, old) in state.runs.iter().zip(&old.runs) {
            assert_eq!(&new.events[..], &old.events[..]);
            assert_eq!(
                (
                    new.id,
                    new.stage,
                    new.count,
                    new.start_ts,
                    &new.guards,
                    new.emitted
                ),
                (
                    old.id,
                    old.stage,
                    old.count,
                    old.start_ts,
                    &old.guards,
                    old.emitted
                )
            );
        }
        assert_eq!(postcard::to_allocvec(&state).unwrap(), bytes);
        let schema = crate::state::schema_of::<NfaState>();
        assert!(schema.is_some());
        assert_eq!(
            schema.map(|s| s
                .replace("VecNfaState", "NfaState")
                .replace("VecRun", "Run")),
            crate::state::schema_of::<VecNfaState>().map(|s| s
                .replace("VecNfaState", "NfaState")
                .replace("VecRun", "Run"))
        );
    }
}
