//! [`CepOperator`]: runs a [`Pattern`] per record key on host keyed state and event-time
//! timers (design §9.2, §8.4).

use std::collections::BTreeMap;

use hashbrown::HashTable;

use crate::hash::{be_prefix, fx_hash, key_eq};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use smallvec::SmallVec;

use super::nfa::{KeyNfa, NfaState, Output, SharedBuffer};
use super::{Match, Pattern, StageKind};
use crate::{
    Batch, Context, PluginError, PluginInfo, RecordRef, Result, STATE_WRITE_CHUNK, TimeDomain,
    TimerGroup, ValueState, counter_add,
};

/// Per-key NFA state (partial matches, id counters): value state.
pub const NFA_STATE: &str = "cep-nfa";
/// Shared buffer per key (event id → event, timestamp, reference count; each event
/// stored once however many partial matches reference it): value state.
pub const BUFFER_STATE: &str = "cep-buffer";
/// Event queue per key (event time → events awaiting the watermark, arrival order):
/// value state.
pub const QUEUE_STATE: &str = "cep-queue";
/// Namespace of the CEP states and of its event-time timers.
pub const CEP_NAMESPACE: &[u8] = b"cep";
/// Schema version of the three CEP states (postcard codec); 2 since they are value
/// states read and written in batches.
pub const STATE_SCHEMA: u32 = 2;
/// Side output of timed-out partial matches.
pub const TIMED_OUT: &str = "timed-out";
/// Side output of late records (with [`LateEvents::SideOutput`]).
pub const LATE: &str = "late";

/// Decodes one input record into an event; `Ok(None)` skips the record.
pub type DecodeFn<E> = Box<dyn Fn(RecordRef<'_>) -> Result<Option<E>>>;
/// Appends the payload of one output record for a match to the buffer.
pub type EmitFn<E> = Box<dyn Fn(&Match<E>, &mut Vec<u8>) -> Result<()>>;

/// What happens to a record whose timestamp is at or behind the watermark on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LateEvents {
    /// Drop it and count it (metric `cep_late_events`). The default.
    #[default]
    Drop,
    /// Send it unchanged to side output [`LATE`] (and count it).
    SideOutput,
}

/// A key's queued events: (event time, event) in time order, arrival order within a
/// time; one `Vec` whose capacity a key keeps, where a map of event time → `Vec` allocated
/// a node and a `Vec` per queued event time. Stored as that map (postcard, the
/// [`QUEUE_STATE`] layout and schema): serialized group by group, deserialized through
/// `BTreeMap<i64, Vec<E>>`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Queue<E> {
    items: Vec<(i64, E)>,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue { items: Vec::new() }
    }
}

impl<E> Queue<E> {
    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The earliest queued event time.
    fn first_time(&self) -> Option<i64> {
        self.items.first().map(|(t, _)| *t)
    }

    /// Queues `event` at `ts`, after the events already queued at `ts`.
    fn push(&mut self, ts: i64, event: E) {
        if self.items.last().is_none_or(|(t, _)| *t <= ts) {
            self.items.push((ts, event));
        } else {
            let at = self.items.partition_point(|(t, _)| *t <= ts);
            self.items.insert(at, (ts, event));
        }
    }

    /// Events queued at or before `upto`.
    fn due(&self, upto: i64) -> usize {
        self.items.partition_point(|(t, _)| *t <= upto)
    }
}

impl<E: Serialize> Serialize for Queue<E> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        /// The events of one event time, as the map value `Vec<E>`.
        struct Group<'a, E>(&'a [(i64, E)]);
        impl<E: Serialize> Serialize for Group<'_, E> {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for (_, e) in self.0 {
                    seq.serialize_element(e)?;
                }
                seq.end()
            }
        }
        let groups = self.items.chunk_by(|a, b| a.0 == b.0);
        let mut map = s.serialize_map(Some(groups.clone().count()))?;
        for g in groups {
            map.serialize_entry(&g[0].0, &Group(g))?;
        }
        map.end()
    }
}

impl<'de, E: Deserialize<'de>> Deserialize<'de> for Queue<E> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let map = BTreeMap::<i64, Vec<E>>::deserialize(d)?;
        let mut items = Vec::with_capacity(map.values().map(Vec::len).sum());
        for (t, events) in map {
            items.extend(events.into_iter().map(|e| (t, e)));
        }
        Ok(Queue { items })
    }
}
/// A key's shared buffer: event id → entry.
type Buffer<E> = SharedBuffer<E>;
/// The cached keys' timers (see [`CepOperator::due`]): (event time, slot) entries in
/// buckets of 2^[`DueQueue::SLOT_BITS`] ms of event time. Every timer pushed lies after
/// the last time taken (a queued event is after the watermark, a deadline after the
/// time the key was advanced to), so the due entries are a prefix of the buckets: they
/// are taken in one go and sorted by time, instead of popped from a heap one by one.
///
/// An entry names a [`KeyCache`] slot, not a key: it is live while that slot holds a
/// key whose timer is at the entry's time ([`KeyCache::live`]), whichever key that is.
/// A key due at that time is due whichever entry brings it up, so an entry left by a
/// moved timer or a key that left the cache is skipped or, at worst, brings up the
/// slot's key exactly when its own entry would. (Entries held the key itself, with a
/// reference count touched on every push and take, until December 2026.)
#[derive(Default)]
struct DueQueue {
    slots: BTreeMap<i64, Vec<Due>>,
}

/// A timer of the [`DueQueue`]: (event time, a slot of the [`KeyCache`]).
type Due = (i64, u32);

impl DueQueue {
    /// A bucket spans 256 ms of event time.
    const SLOT_BITS: u32 = 8;

    fn push(&mut self, t: i64, slot: u32) {
        self.slots
            .entry(t >> Self::SLOT_BITS)
            .or_default()
            .push((t, slot));
    }

    /// Removes and returns every entry at or before `upto`, in time order (equal times
    /// in no particular order).
    fn take_due(&mut self, upto: i64) -> Vec<Due> {
        let mut due = Vec::new();
        let last = upto >> Self::SLOT_BITS;
        while let Some(mut slot) = self.slots.first_entry() {
            let s = *slot.key();
            if s > last {
                break;
            }
            // The slot's last millisecond (`|` cannot overflow near `i64::MAX`).
            let whole = (s << Self::SLOT_BITS) | ((1 << Self::SLOT_BITS) - 1) <= upto;
            let mut v = if whole {
                slot.remove()
            } else {
                let v = slot.get_mut();
                let mut taken = Vec::new();
                let mut i = 0;
                while i < v.len() {
                    if v[i].0 <= upto {
                        taken.push(v.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                if v.is_empty() {
                    slot.remove();
                }
                taken
            };
            // Slots are taken in time order: sorting each is sorting all.
            Self::sort_slot(&mut v);
            if due.is_empty() {
                due = v;
            } else {
                due.append(&mut v);
            }
            if !whole {
                break;
            }
        }
        due
    }

    /// Sorts the entries of one slot by time: by the time's low [`Self::SLOT_BITS`] bits
    /// (the slot fixes the rest) with a counting sort and an in-place permutation. (A
    /// comparison sort was 5 % of the samples of the CEP benchmark.)
    fn sort_slot(v: &mut [Due]) {
        const SMALL: usize = 32;
        let n = v.len();
        if n <= SMALL {
            v.sort_unstable_by_key(|d| d.0);
            return;
        }
        let low = |d: &Due| (d.0 & ((1 << Self::SLOT_BITS) - 1)) as usize;
        let mut next = [0u32; 1 << Self::SLOT_BITS];
        for d in v.iter() {
            next[low(d)] += 1;
        }
        let mut sum = 0;
        for c in &mut next {
            (*c, sum) = (sum, sum + *c);
        }
        // Where each entry goes; then follow the cycles of that permutation.
        let mut dest: Vec<u32> = v
            .iter()
            .map(|d| {
                let c = &mut next[low(d)];
                *c += 1;
                *c - 1
            })
            .collect();
        for i in 0..n {
            while dest[i] as usize != i {
                let j = dest[i] as usize;
                v.swap(i, j);
                dest.swap(i, j);
            }
        }
    }

    /// The earliest time held, if any.
    fn first_time(&self) -> Option<i64> {
        let (_, v) = self.slots.first_key_value()?;
        v.iter().map(|(t, _)| *t).min()
    }

    fn clear(&mut self) {
        self.slots.clear();
    }
}

/// The keys a [`CepOperator`] holds decoded: an index from key to slot, and the entries
/// in slots that keep their place while the key is cached, so a timer entry reaches its
/// key's entry without a hash lookup (a probe of the index per timer, with its key
/// comparison, was 13 % of the samples of the CEP benchmark). The index is a
/// [`HashTable`] of slots probed with [`key_eq`]: a `HashMap` keyed by the key bytes
/// compared them with a `memcmp` call, 5 % of the samples.
struct KeyCache<E> {
    index: HashTable<u32>,
    slots: Vec<Option<KeyEntry<E>>>,
    /// Empty slots, reused first.
    free: Vec<u32>,
}

impl<E> Default for KeyCache<E> {
    fn default() -> Self {
        KeyCache {
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<E> KeyCache<E> {
    fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `key`, if cached.
    fn find(&self, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(fx_hash(key), |&s| {
                slots[s as usize]
                    .as_ref()
                    .is_some_and(|e| key_eq(&e.key, key))
            })
            .copied()
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.find(key).is_some()
    }

    fn get_mut(&mut self, key: &[u8]) -> Option<&mut KeyEntry<E>> {
        let slot = self.find(key)?;
        self.slots[slot as usize].as_mut()
    }

    /// The key in `slot`, if any.
    fn slot_mut(&mut self, slot: u32) -> Option<&mut KeyEntry<E>> {
        self.slots.get_mut(slot as usize)?.as_mut()
    }

    /// The key that timer entry `due` brings up: the one in its slot, if that key's timer
    /// is at the entry's time (see [`DueQueue`]).
    fn live(&self, (t, slot): Due) -> Option<&KeyEntry<E>> {
        self.slots
            .get(slot as usize)?
            .as_ref()
            .filter(|e| e.timer == Some(t))
    }

    /// Orders live timer entries (sorted by time) by key within each time, and keeps
    /// one entry per key and time. Distinct slots hold distinct keys, so this is the
    /// (time, key) order whatever slots the keys took. Keys are compared by their first 8
    /// bytes first: equal times are common (an event and another key's deadline), and a
    /// key comparison is a `memcmp` call in a wasm guest.
    fn order_ties(&self, due: &mut Vec<Due>) {
        let key =
            |d: &Due| -> &[u8] { &self.slots[d.1 as usize].as_ref().expect("a live entry").key };
        let mut i = 0;
        while i < due.len() {
            let t = due[i].0;
            let j = i + due[i..].iter().take_while(|d| d.0 == t).count();
            if j - i > 1 {
                due[i..j].sort_unstable_by(|a, b| {
                    be_prefix(key(a))
                        .cmp(&be_prefix(key(b)))
                        .then_with(|| key(a).cmp(key(b)))
                });
            }
            i = j;
        }
        due.dedup();
    }

    /// Caches `entry` (its key must not be cached) and returns it, its slot set.
    fn insert(&mut self, mut entry: KeyEntry<E>) -> &mut KeyEntry<E> {
        debug_assert!(!self.contains(&entry.key), "a cached key inserted again");
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            (self.slots.len() - 1) as u32
        });
        entry.slot = slot;
        let hash = fx_hash(&entry.key);
        self.slots[slot as usize] = Some(entry);
        let slots = &self.slots;
        self.index.insert_unique(hash, slot, |&s| {
            fx_hash(
                &slots[s as usize]
                    .as_ref()
                    .expect("indexed slots are full")
                    .key,
            )
        });
        self.slots[slot as usize].as_mut().expect("just filled")
    }

    /// Empties `slot` (which must hold an entry) and unindexes it.
    fn vacate(&mut self, slot: u32) {
        let entry = self.slots[slot as usize].take().expect("a full slot");
        if let Ok(found) = self.index.find_entry(fx_hash(&entry.key), |&s| s == slot) {
            found.remove();
        }
        self.free.push(slot);
    }

    #[cfg(test)]
    fn remove(&mut self, key: &[u8]) {
        if let Some(slot) = self.find(key) {
            self.vacate(slot);
        }
    }

    fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
    }

    /// Drops every entry `keep` refuses.
    fn retain(&mut self, mut keep: impl FnMut(&KeyEntry<E>) -> bool) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|e| !keep(e)) {
                self.vacate(slot as u32);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &KeyEntry<E>> {
        self.slots.iter().flatten()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut KeyEntry<E>> {
        self.slots.iter_mut().flatten()
    }
}

/// Runs a CEP [`Pattern`] over keyed, timestamped records; embed it in an
/// [`crate::Operator`] and forward `process`, `on_timers`, `on_watermark`,
/// `prepare_checkpoint` and `finish` to it.
///
/// - Input records must be keyed ([`Batch::key`], routed by the runtime) and carry event
///   time ([`Batch::timestamp`], ms); otherwise `process` fails with
///   [`crate::ErrorCode::InvalidRecord`] before changing anything.
/// - Output: one record per match, payload from the emit fn, key = the input key,
///   timestamp = the match's last event time. Timed-out partial matches go to side
///   output [`TIMED_OUT`], encoded by [`CepOperator::on_timed_out`]'s fn (default: the
///   emit fn).
/// - Declare the states, side outputs and model with [`CepOperator::declare`].
///
/// Cost: a key's queue, partial matches and shared buffer are read from host state
/// once (one batched `value-get-many` per state for the keys of a call) and then kept
/// decoded in the instance, with the key's timer in an in-memory queue; records, the
/// watermark and host timers work on that copy. At every checkpoint
/// (`prepare_checkpoint`, [`CepOperator::flush`]) the changed keys are written back with
/// one batched put (and delete) per state, and each key's one host timer is moved to its
/// current time with one `retime-keys` call, so the host state and timers are exact at
/// every barrier and a restore needs nothing else. Past [`MAX_CACHED_KEYS`] keys the
/// keys left with nothing are dropped, then if need be the copy is written back and
/// dropped (also between checkpoints). Each key holds exactly one CEP host timer, at its
/// earliest queued event or partial-match deadline; in the instance, with silent expiry
/// ([`CepOperator::discard_timed_out`]), only at its earliest queued event. Memory per
/// key is bounded by its queued events plus the events referenced by its partial
/// matches (with silent expiry, expired ones until the next write-back). Without
/// `within`, partial matches of a pattern that cannot complete are kept forever (as in
/// Flink).
pub struct CepOperator<E> {
    pattern: Pattern<E>,
    decode: DecodeFn<E>,
    emit: EmitFn<E>,
    emit_timed_out: Option<EmitFn<E>>,
    /// Timed-out partial matches are dropped instead of built and emitted.
    discard_timed_out: bool,
    /// An expired partial match leaves no trace (timeouts discarded, no
    /// `not_followed_by` that completes by a timeout): deadlines then take no timer in the
    /// instance ([`CepOperator::discard_timed_out`]).
    silent_expiry: bool,
    late: LateEvents,
    late_events: u64,
    nfa: ValueState<NfaState>,
    buffer: ValueState<Buffer<E>>,
    queue: ValueState<Queue<E>>,
    /// The keys read from host state since they were last dropped, decoded, with the
    /// idle ones ([`KeyEntry::is_idle`]) kept for their next event.
    cache: KeyCache<E>,
    /// The cached keys' timers: (event time, slot). A moved timer's old entry is not
    /// removed but skipped when it comes due (its slot's key no longer has a timer at
    /// that time: the timer moved, or the key left the cache), so entries are only pushed
    /// and taken; stale ones are bounded by the timer moves since the watermark last
    /// passed them.
    due: DueQueue,
    /// One of the three states has a TTL (`state_ttl_ms`): nothing stays cached between
    /// calls ([`CepOperator::end_call`]), so the host sees every write when it happens and
    /// expires what it should.
    ttl: bool,
}

/// Keys a [`CepOperator`] keeps decoded in memory (at most this many keys, plus one
/// call's new keys). Past it, the idle ones are dropped, and if more than three quarters
/// of it remain, every key is written back and dropped, between checkpoints too.
pub const MAX_CACHED_KEYS: usize = 65_536;

/// Key bytes a [`KeyEntry`] holds inline.
const INLINE_KEY: usize = 16;

/// One key's CEP state, decoded, with its write-back bookkeeping.
struct KeyEntry<E> {
    /// The key: inline up to [`INLINE_KEY`] bytes, so a probe of the index compares it
    /// in the entry it reads anyway, not in an allocation of its own.
    key: SmallVec<[u8; INLINE_KEY]>,
    /// Its slot in the [`KeyCache`].
    slot: u32,
    queue: Queue<E>,
    nfa: NfaState,
    buffer: Buffer<E>,
    /// Changed since it was last read or written back.
    dirty: bool,
    /// Host state holds the key (so an emptied key must be deleted there).
    stored: bool,
    /// The key's CEP timer as registered at the host.
    host_timer: Option<i64>,
    /// The key's timer now: its earliest queued event or partial-match deadline.
    timer: Option<i64>,
}

impl<E> KeyEntry<E> {
    fn is_empty(&self) -> bool {
        self.nfa.runs.is_empty() && self.queue.is_empty()
    }

    /// Holds nothing a load of the key would not give: empty, absent from host state,
    /// no host timer. Such an entry may stay cached (its next event then needs no load)
    /// or be dropped at no cost.
    fn is_idle(&self) -> bool {
        self.is_empty() && !self.stored && self.host_timer.is_none()
    }

    /// An emptied key's id counters restart, as a load of the key gives them once its
    /// host state is deleted; the key stays cached, so its next event needs no load.
    fn reset_if_empty(&mut self) {
        if self.is_empty() {
            self.nfa.next_event_id = 0;
            self.nfa.next_run_id = 0;
        }
    }
}

impl<E> std::fmt::Debug for CepOperator<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CepOperator")
            .field("pattern", &self.pattern)
            .field("late", &self.late)
            .finish_non_exhaustive()
    }
}

impl<E> CepOperator<E>
where
    E: Serialize + DeserializeOwned + Clone + 'static,
{
    /// Adds what the CEP runtime needs to `info`: the states [`QUEUE_STATE`],
    /// [`NFA_STATE`], [`BUFFER_STATE`] (schema [`STATE_SCHEMA`], postcard), the side
    /// outputs [`TIMED_OUT`] and [`LATE`], and the pattern model (plan fingerprint).
    pub fn declare(info: PluginInfo, pattern: &Pattern<E>) -> PluginInfo {
        info.state(ValueState::<Queue<E>>::descriptor(
            QUEUE_STATE,
            STATE_SCHEMA,
        ))
        .state(ValueState::<NfaState>::descriptor(NFA_STATE, STATE_SCHEMA))
        .state(ValueState::<Buffer<E>>::descriptor(
            BUFFER_STATE,
            STATE_SCHEMA,
        ))
        .side_output(TIMED_OUT)
        .side_output(LATE)
        .model(pattern.to_model_json())
    }

    /// Opens the operator on `ctx`'s states.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] if the pattern is invalid
    /// ([`Pattern::validate`]); [`crate::ErrorCode::State`] if the states were not
    /// declared (see [`CepOperator::declare`]).
    pub fn open(
        ctx: &mut (impl Context + ?Sized),
        pattern: Pattern<E>,
        decode: impl Fn(RecordRef<'_>) -> Result<Option<E>> + 'static,
        emit: impl Fn(&Match<E>, &mut Vec<u8>) -> Result<()> + 'static,
    ) -> Result<Self> {
        pattern.validate()?;
        let nfa = ValueState::open(ctx, NFA_STATE)?;
        let buffer = ValueState::open(ctx, BUFFER_STATE)?;
        let queue = ValueState::open(ctx, QUEUE_STATE)?;
        let ttl = [nfa.handle(), buffer.handle(), queue.handle()]
            .into_iter()
            .any(|h| ctx.state_ttl_ms(h).is_some());
        Ok(CepOperator {
            pattern,
            decode: Box::new(decode),
            emit: Box::new(emit),
            emit_timed_out: None,
            discard_timed_out: false,
            silent_expiry: false,
            late: LateEvents::Drop,
            late_events: 0,
            nfa,
            buffer,
            queue,
            cache: KeyCache::default(),
            due: DueQueue::default(),
            ttl,
        })
    }

    /// Encodes timed-out partial matches with `f` instead of the emit fn.
    pub fn on_timed_out(
        mut self,
        f: impl Fn(&Match<E>, &mut Vec<u8>) -> Result<()> + 'static,
    ) -> Self {
        self.emit_timed_out = Some(Box::new(f));
        self
    }

    /// Drops partial matches pruned by `within` instead of sending them to
    /// [`TIMED_OUT`] (Flink's `MATCH_RECOGNIZE` behaviour): no [`Match`] is built for
    /// them, which saves most of the work when nearly every partial match times out.
    ///
    /// Unless the pattern has a `not_followed_by` stage (whose window running out
    /// completes a match), an expired partial match then produces nothing, and its
    /// deadline takes no timer in the instance: it is pruned when its key next runs
    /// (before that key's next event, as `within` requires) or, for a key with no further
    /// event, by the sweep before every write-back (each checkpoint, and a full cache). So
    /// host state never holds an expired partial match, and the host timer of a key is
    /// still at its earliest deadline, for a restore. In the CEP benchmark a third of the
    /// keys ran only to prune a partial match.
    ///
    /// What differs from reporting timeouts, besides the side output: the keys that run
    /// at one watermark run in the order of their earliest queued event (then key), not
    /// of their earliest event or deadline, so matches of different keys emitted at one
    /// watermark can come out in another order (each key's own matches keep theirs, and
    /// a restored run emits the same order as an uninterrupted one); and a key's event
    /// and partial-match id counters in host state can differ (they only order one key's
    /// partial matches).
    pub fn discard_timed_out(mut self) -> Self {
        self.discard_timed_out = true;
        self.silent_expiry = !self
            .pattern
            .stages
            .iter()
            .any(|s| s.kind == StageKind::NotFollowedBy);
        self
    }

    /// Sets the late-record policy (default [`LateEvents::Drop`]).
    pub fn late_policy(mut self, late: LateEvents) -> Self {
        self.late = late;
        self
    }

    /// The pattern.
    pub fn pattern(&self) -> &Pattern<E> {
        &self.pattern
    }

    /// Late records seen by this instance (not durable; the metric `cep_late_events` is
    /// the durable-by-host count).
    pub fn late_events(&self) -> u64 {
        self.late_events
    }

    /// Whether the timers of `group` belong to the CEP runtime (event time, namespace
    /// [`CEP_NAMESPACE`]); other timers are ignored by [`CepOperator::on_timers`].
    pub fn is_cep_timer(group: &TimerGroup) -> bool {
        group.domain == TimeDomain::EventTime && group.namespace == CEP_NAMESPACE
    }

    /// Buffers the records of `batch` per key and event time until the watermark passes
    /// them. Emits nothing to `out` (matches are found on watermark progress).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidRecord`] for an unkeyed record, a record without
    /// timestamp, or whatever the decode fn reports; nothing is stored then.
    pub fn process(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let _ = out;
        let r = self.process_cached(ctx, batch);
        self.end_call(ctx, &r);
        r
    }

    fn process_cached(&mut self, ctx: &mut (impl Context + ?Sized), batch: &Batch) -> Result<()> {
        let wm = ctx.current_watermark();
        // Every record is checked and decoded before anything is stored.
        let mut events: Vec<(&[u8], i64, E)> = Vec::with_capacity(batch.len());
        let mut late = Batch::new();
        for (i, rec) in batch.iter().enumerate() {
            let key = rec.key.ok_or_else(|| {
                PluginError::invalid_record(format!(
                    "CEP record {i} has no key (needs a keyed input)"
                ))
            })?;
            let ts = rec.timestamp.ok_or_else(|| {
                PluginError::invalid_record(format!("CEP record {i} has no event-time timestamp"))
            })?;
            let Some(event) = (self.decode)(rec)? else {
                continue;
            };
            if ts <= wm {
                late.push_record(rec.key, rec.timestamp, rec.data);
                continue;
            }
            events.push((key, ts, event));
        }
        if !events.is_empty() {
            // A cached key's events go to its queue at once; the others wait for one
            // batched load of their keys (a key stays uncached until then, so all its
            // events wait, in arrival order).
            let mut waiting: Vec<(&[u8], i64, E)> = Vec::new();
            // The waiting keys, each once, in order of first appearance.
            let mut keys: Vec<&[u8]> = Vec::new();
            let mut seen: std::collections::HashSet<&[u8], crate::hash::FxBuildHasher> =
                Default::default();
            let (pattern, silent) = (&self.pattern, self.silent_expiry);
            for (key, ts, event) in events {
                match self.cache.get_mut(key) {
                    Some(entry) => Self::enqueue(pattern, silent, &mut self.due, entry, ts, event),
                    None => {
                        if seen.insert(key) {
                            keys.push(key);
                        }
                        waiting.push((key, ts, event));
                    }
                }
            }
            if !waiting.is_empty() {
                self.load(ctx, &keys, false);
                let (pattern, silent) = (&self.pattern, self.silent_expiry);
                for (key, ts, event) in waiting {
                    let entry = self.cache.get_mut(key).expect("loaded");
                    Self::enqueue(pattern, silent, &mut self.due, entry, ts, event);
                }
            }
            self.shrink(ctx);
        }
        if !late.is_empty() {
            self.late_events += late.len() as u64;
            counter_add("cep_late_events", late.len() as u64);
            if self.late == LateEvents::SideOutput {
                ctx.side_output(LATE, &late);
            }
        }
        Ok(())
    }

    /// The event time of a key's one CEP timer: its earliest queued event or partial
    /// match deadline, whichever comes first.
    fn next_timer(
        pattern: &Pattern<E>,
        first_queued: Option<i64>,
        nfa: Option<&NfaState>,
    ) -> Option<i64> {
        let deadline = nfa.and_then(|n| {
            n.runs
                .iter()
                .filter_map(|r| KeyNfa::deadline(pattern, r))
                .min()
        });
        match (first_queued, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Queues one event of a cached key and moves the key's timer if it came earlier.
    fn enqueue(
        pattern: &Pattern<E>,
        silent_expiry: bool,
        due: &mut DueQueue,
        entry: &mut KeyEntry<E>,
        ts: i64,
        event: E,
    ) {
        entry.queue.push(ts, event);
        entry.dirty = true;
        Self::retime(pattern, silent_expiry, due, entry);
    }

    /// The time a cached key must run at in the instance: its host timer's
    /// ([`Self::next_timer`]), or with silent expiry its earliest queued event only.
    fn run_time(pattern: &Pattern<E>, silent_expiry: bool, entry: &KeyEntry<E>) -> Option<i64> {
        if silent_expiry {
            entry.queue.first_time()
        } else {
            Self::next_timer(pattern, entry.queue.first_time(), Some(&entry.nfa))
        }
    }

    /// Recomputes a cached key's timer and moves it in the in-memory timer queue (the
    /// old entry stays behind, stale).
    fn retime(
        pattern: &Pattern<E>,
        silent_expiry: bool,
        due: &mut DueQueue,
        entry: &mut KeyEntry<E>,
    ) {
        let next = Self::run_time(pattern, silent_expiry, entry);
        if next == entry.timer {
            return;
        }
        if let Some(new) = next {
            due.push(new, entry.slot);
        }
        entry.timer = next;
    }

    /// Reads the keys of `keys` that are not cached from host state (one batched get
    /// per state) into the cache. Their host timer is at their earliest queued event or
    /// deadline ([`Self::next_timer`]; the state and the timer are written back
    /// together), or gone if `fired`; their timer in the instance is their
    /// [`Self::run_time`].
    fn load(&mut self, ctx: &mut (impl Context + ?Sized), keys: &[&[u8]], fired: bool) {
        let missing: Vec<&[u8]> = keys
            .iter()
            .copied()
            .filter(|k| !self.cache.contains(k))
            .collect();
        if missing.is_empty() {
            return;
        }
        let nfas = self.nfa.in_namespace(CEP_NAMESPACE).get_many(ctx, &missing);
        let queues = self
            .queue
            .in_namespace(CEP_NAMESPACE)
            .get_many(ctx, &missing);
        let buffers = self
            .buffer
            .in_namespace(CEP_NAMESPACE)
            .get_many(ctx, &missing);
        for (((key, nfa), queue), buffer) in missing.into_iter().zip(nfas).zip(queues).zip(buffers)
        {
            let stored = nfa.is_some() || queue.is_some() || buffer.is_some();
            let queue = queue.unwrap_or_default();
            let nfa = nfa.unwrap_or_default();
            let host_timer = Self::next_timer(&self.pattern, queue.first_time(), Some(&nfa));
            let entry = self.cache.insert(KeyEntry {
                key: SmallVec::from_slice(key),
                slot: 0,
                queue,
                nfa,
                buffer: buffer.unwrap_or_default(),
                dirty: false,
                stored,
                host_timer: if fired { None } else { host_timer },
                timer: None,
            });
            entry.timer = Self::run_time(&self.pattern, self.silent_expiry, entry);
            if let Some(t) = entry.timer {
                self.due.push(t, entry.slot);
            }
        }
    }

    /// Runs the keys of due CEP timers up to the watermark (or the latest due timer, if
    /// later); non-CEP timers are ignored.
    ///
    /// # Errors
    /// Whatever the emit fns report (the task then fails and recovers from the last
    /// checkpoint).
    pub fn on_timers(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let r = self.on_timers_cached(ctx, timers, out);
        self.end_call(ctx, &r);
        r
    }

    fn on_timers_cached(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let mut upto = ctx.current_watermark();
        let mut fired: Vec<&[u8]> = Vec::new();
        for g in timers.iter().filter(|g| Self::is_cep_timer(g)) {
            upto = upto.max(g.timestamp);
            fired.extend(g.iter_keys());
        }
        if fired.is_empty() {
            return Ok(());
        }
        self.load(ctx, &fired, true);
        for key in fired {
            if let Some(entry) = self.cache.get_mut(key) {
                // The host fired (and so dropped) the key's one timer.
                entry.host_timer = None;
            }
        }
        self.advance_due(ctx, upto, out)
    }

    /// Runs every cached key whose timer is at or before `watermark`.
    ///
    /// # Errors
    /// Whatever the emit fns report.
    pub fn on_watermark(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        let r = self.advance_due(ctx, watermark, out);
        self.end_call(ctx, &r);
        r
    }

    /// With a TTL ([`CepOperator`]'s `ttl`), the end of every call: writes the changed
    /// keys back and drops the cache, so a key is read from the host again (and may have
    /// expired there) at its next event or timer. A failed call drops the cache without
    /// writing: every earlier call ended written back, so the host state and timers are
    /// exactly as before the call.
    fn end_call(&mut self, ctx: &mut (impl Context + ?Sized), result: &Result<()>) {
        if !self.ttl {
            return;
        }
        if result.is_ok() {
            self.write_back(ctx);
        }
        self.cache.clear();
        self.due.clear();
    }

    /// Brings the cached keys up to the context's watermark, then writes every changed
    /// key back to host state and moves each key's host timer to its current time; call
    /// from `prepare_checkpoint` and `finish`.
    ///
    /// # Errors
    /// Whatever the emit fns report; nothing is written then.
    pub fn flush(&mut self, ctx: &mut (impl Context + ?Sized), out: &mut Batch) -> Result<()> {
        let wm = ctx.current_watermark();
        self.advance_due(ctx, wm, out)?;
        self.write_back(ctx);
        self.shrink(ctx);
        Ok(())
    }

    /// Past [`MAX_CACHED_KEYS`] keys: drops the idle keys ([`KeyEntry::is_idle`]) and, if
    /// more than three quarters of the limit remain, writes every key back and drops them
    /// all (the host state and timers are then exact, as at a checkpoint). The margin
    /// keeps a cache of busy keys from being scanned on every call.
    fn shrink(&mut self, ctx: &mut (impl Context + ?Sized)) {
        if self.cache.len() <= MAX_CACHED_KEYS {
            return;
        }
        self.sweep(ctx.current_watermark());
        self.cache.retain(|e| !e.is_idle());
        if self.cache.len() > MAX_CACHED_KEYS / 4 * 3 {
            self.write_back(ctx);
            self.cache.clear();
            self.due.clear();
        }
    }

    /// With silent expiry, prunes the partial matches of every cached key whose
    /// deadline is at or before `wm`, as the deadline timers the instance skips would
    /// have ([`CepOperator::discard_timed_out`]). Emits nothing. Every queued event is
    /// after `wm` (later ones are late, earlier ones ran at the watermark), so this is
    /// exactly the key running at `wm`.
    fn sweep(&mut self, wm: i64) {
        if !self.silent_expiry {
            return;
        }
        let mut outputs = Vec::new();
        for entry in self.cache.iter_mut() {
            let expired = |r| KeyNfa::deadline(&self.pattern, r).is_some_and(|d| d <= wm);
            if !entry.nfa.runs.iter().any(expired) {
                continue;
            }
            debug_assert!(entry.queue.first_time().is_none_or(|t| t > wm));
            let mut k = KeyNfa {
                state: std::mem::take(&mut entry.nfa),
                buffer: std::mem::take(&mut entry.buffer),
                report_timeouts: false,
                spare: Vec::new(),
            };
            k.advance_time(&self.pattern, &entry.key, wm, &mut outputs);
            k.collect_garbage();
            debug_assert!(outputs.is_empty(), "a silent expiry emitted");
            entry.nfa = k.state;
            entry.buffer = k.buffer;
            entry.dirty = true;
            entry.reset_if_empty();
        }
    }

    /// Writes every dirty key back (batched puts per state of [`STATE_WRITE_CHUNK`] keys,
    /// one batched delete per state for emptied keys) and moves every host timer that differs from its key's
    /// next one (earliest queued event or deadline; one `retime-keys` call), after a
    /// [`Self::sweep`]. Emptied keys stay cached, idle.
    fn write_back(&mut self, ctx: &mut (impl Context + ?Sized)) {
        self.sweep(ctx.current_watermark());
        let mut deletes: Vec<u8> = Vec::new();
        let mut delete_ends: Vec<u32> = Vec::new();
        let mut retimes = Retimes::default();
        for entry in self.cache.iter_mut() {
            let key = &entry.key;
            let next = Self::next_timer(&self.pattern, entry.queue.first_time(), Some(&entry.nfa));
            retimes.push(key, entry.host_timer, next);
            entry.host_timer = next;
            if !entry.dirty {
                continue;
            }
            if entry.is_empty() {
                debug_assert!(entry.buffer.is_empty(), "no run but buffered events");
                if entry.stored {
                    deletes.extend_from_slice(key);
                    delete_ends.push(deletes.len() as u32);
                }
            }
        }
        let nfa_state = self.nfa.in_namespace(CEP_NAMESPACE);
        let queue_state = self.queue.in_namespace(CEP_NAMESPACE);
        let buffer_state = self.buffer.in_namespace(CEP_NAMESPACE);
        {
            // In calls of STATE_WRITE_CHUNK keys, so that a state memory budget applies
            // between them.
            let mut puts = self
                .cache
                .iter()
                .filter(|e| e.dirty && !e.is_empty())
                .peekable();
            let mut chunk = Vec::new();
            while puts.peek().is_some() {
                chunk.clear();
                chunk.extend(puts.by_ref().take(STATE_WRITE_CHUNK));
                nfa_state.put_many_refs(ctx, chunk.iter().map(|e| (&*e.key, &e.nfa)));
                queue_state.put_many_refs(ctx, chunk.iter().map(|e| (&*e.key, &e.queue)));
                buffer_state.put_many_refs(ctx, chunk.iter().map(|e| (&*e.key, &e.buffer)));
            }
        }
        nfa_state.delete_many_flat(ctx, &deletes, &delete_ends);
        queue_state.delete_many_flat(ctx, &deletes, &delete_ends);
        buffer_state.delete_many_flat(ctx, &deletes, &delete_ends);
        retimes.apply(ctx);
        for entry in self.cache.iter_mut() {
            if entry.dirty {
                entry.dirty = false;
                entry.stored = !entry.is_empty();
            }
        }
    }

    /// Runs each cached key whose timer is at or before `upto`, in timer then key
    /// order: its queued events and timeouts up to event time `upto` in time order
    /// (timeouts first on equal times). Outputs go to `out` (matches) and the
    /// [`TIMED_OUT`] side output.
    fn advance_due(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        upto: i64,
        out: &mut Batch,
    ) -> Result<()> {
        let mut timed_out = Batch::new();
        let mut outputs = Vec::new();
        // The NFA's spare `Vec` of runs, handed from key to key.
        let mut spare = Vec::new();
        let mut due = self.due.take_due(upto);
        due.retain(|&d| self.cache.live(d).is_some());
        self.cache.order_ties(&mut due);
        for (t, slot) in due {
            // Running a key changes no other key's entry or timer: every entry left is
            // live until its key runs.
            let Some(entry) = self.cache.slot_mut(slot) else {
                continue;
            };
            if entry.timer != Some(t) {
                continue;
            }
            entry.timer = None;
            let mut k = KeyNfa {
                state: std::mem::take(&mut entry.nfa),
                buffer: std::mem::take(&mut entry.buffer),
                report_timeouts: !self.discard_timed_out,
                spare: std::mem::take(&mut spare),
            };
            // Time advances to each queued event time once, before its events; the
            // queue keeps its capacity.
            let due = entry.queue.due(upto);
            let mut at = None;
            for (ts, e) in entry.queue.items.drain(..due) {
                if at != Some(ts) {
                    k.advance_time(&self.pattern, &entry.key, ts, &mut outputs);
                    at = Some(ts);
                }
                k.process_event(&self.pattern, &entry.key, ts, e, &mut outputs);
            }
            k.advance_time(&self.pattern, &entry.key, upto, &mut outputs);
            k.collect_garbage();
            entry.nfa = k.state;
            entry.buffer = k.buffer;
            spare = k.spare;
            entry.dirty = true;
            Self::retime(&self.pattern, self.silent_expiry, &mut self.due, entry);
            entry.reset_if_empty();
            for o in outputs.drain(..) {
                let (m, target, f) = match &o {
                    Output::Matched(m) => (m, &mut *out, &self.emit),
                    Output::TimedOut(m) => (
                        m,
                        &mut timed_out,
                        self.emit_timed_out.as_ref().unwrap_or(&self.emit),
                    ),
                };
                target.push_with(Some(&entry.key), Some(m.end_ts), |buf| f(m, buf))?;
            }
        }
        debug_assert!(
            self.due.first_time().is_none_or(|t| t > upto),
            "a timer at or before the time just advanced to was pushed"
        );
        if !timed_out.is_empty() {
            ctx.side_output(TIMED_OUT, &timed_out);
        }
        Ok(())
    }
}

/// Moves a key's one CEP timer from `before` to `after` (either may be absent).
/// The per-key timer moves of one call (each key keeps one event-time timer in
/// [`CEP_NAMESPACE`], at its earliest queued event or partial-match deadline), sent to
/// the host in one `retime_timers` call.
#[derive(Default)]
struct Retimes {
    keys: Vec<u8>,
    key_ends: Vec<u32>,
    old: Vec<Option<i64>>,
    new: Vec<Option<i64>>,
}

impl Retimes {
    /// Moves the timer of `key` from `before` to `after` (nothing if equal).
    fn push(&mut self, key: &[u8], before: Option<i64>, after: Option<i64>) {
        if before == after {
            return;
        }
        self.keys.extend_from_slice(key);
        self.key_ends.push(self.keys.len() as u32);
        self.old.push(before);
        self.new.push(after);
    }

    fn apply(self, ctx: &mut (impl Context + ?Sized)) {
        if !self.key_ends.is_empty() {
            ctx.retime_timers(
                TimeDomain::EventTime,
                CEP_NAMESPACE,
                &self.keys,
                &self.key_ends,
                &self.old,
                &self.new,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_is_stored_as_the_map_of_event_time_to_events() {
        let mut q: Queue<u32> = Queue::default();
        let pushed = [(5, 1), (3, 2), (5, 3), (9, 4), (3, 5), (-1, 6), (9, 7)];
        for (t, e) in pushed {
            q.push(t, e);
        }
        let mut map: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
        for (t, e) in pushed {
            map.entry(t).or_default().push(e);
        }
        // Time order, arrival order within a time.
        let flat: Vec<(i64, u32)> = map
            .iter()
            .flat_map(|(t, es)| es.iter().map(move |e| (*t, *e)))
            .collect();
        assert_eq!(q.items, flat);
        assert_eq!((q.first_time(), q.due(4), q.due(5)), (Some(-1), 3, 5));
        let bytes = postcard::to_allocvec(&q).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&map).unwrap());
        assert_eq!(postcard::from_bytes::<Queue<u32>>(&bytes).unwrap(), q);
        let empty: Queue<u32> = Queue::default();
        assert_eq!(
            postcard::to_allocvec(&empty).unwrap(),
            postcard::to_allocvec(&BTreeMap::<i64, Vec<u32>>::new()).unwrap()
        );
        let schema = crate::state::schema_of::<Queue<u32>>();
        assert!(schema.is_some());
        assert_eq!(schema, crate::state::schema_of::<BTreeMap<i64, Vec<u32>>>());
    }

    fn entry(k: &[u8], timer: Option<i64>) -> KeyEntry<u32> {
        KeyEntry {
            key: SmallVec::from_slice(k),
            slot: u32::MAX,
            queue: Queue::default(),
            nfa: NfaState::default(),
            buffer: Buffer::default(),
            dirty: false,
            stored: false,
            host_timer: None,
            timer,
        }
    }

    #[test]
    fn a_timer_entry_is_live_while_its_slot_holds_a_key_due_at_its_time() {
        let mut c = KeyCache::default();
        c.insert(entry(b"a", Some(5)));
        c.insert(entry(b"b", Some(7)));
        assert_eq!(
            (c.get_mut(b"a").unwrap().slot, c.get_mut(b"b").unwrap().slot),
            (0, 1)
        );
        let live = |c: &KeyCache<u32>, d: Due| c.live(d).map(|e| e.key.to_vec());
        assert_eq!(live(&c, (5, 0)), Some(b"a".to_vec()));
        assert_eq!(live(&c, (7, 1)), Some(b"b".to_vec()));
        // Another time, another slot, no slot.
        assert_eq!(live(&c, (7, 0)), None);
        assert_eq!(live(&c, (5, 1)), None);
        assert_eq!(live(&c, (5, 9)), None);
        // `a` leaves; `c` takes its slot: `a`'s entry is stale, `c`'s live.
        c.remove(b"a");
        assert_eq!(live(&c, (5, 0)), None);
        c.insert(entry(b"c", Some(9)));
        assert_eq!(c.get_mut(b"c").unwrap().slot, 0);
        assert_eq!(live(&c, (5, 0)), None);
        assert_eq!(live(&c, (9, 0)), Some(b"c".to_vec()));
        // A moved timer leaves its old entry stale.
        c.get_mut(b"b").unwrap().timer = Some(8);
        assert_eq!(live(&c, (7, 1)), None);
        assert_eq!(c.len(), 2);
        assert_eq!(c.iter().count(), 2);
        c.clear();
        assert_eq!(live(&c, (9, 0)), None);
    }

    #[test]
    fn live_entries_of_equal_times_run_in_key_order_once_per_key() {
        // Keys in slots in an order unlike their byte order: long keys sharing their
        // first 8 bytes, short ones, a zero-padded look-alike.
        let keys: [&[u8]; 6] = [b"zeta", b"auction-2", b"a", b"auction-10", b"a\0", b"b"];
        let mut c = KeyCache::default();
        for k in keys {
            c.insert(entry(k, Some(4)));
        }
        // Sorted by time, each time in slot order, one key twice (a timer moved away
        // and back leaves two entries).
        let mut due: Vec<Due> = vec![(4, 5), (4, 0), (4, 3), (4, 1), (4, 0), (4, 2), (4, 4)];
        c.order_ties(&mut due);
        let got: Vec<&[u8]> = due.iter().map(|d| &*c.live(*d).unwrap().key).collect();
        let mut want = keys.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn the_key_index_finds_keys_that_share_their_first_eight_bytes() {
        let entry = |k: &[u8]| entry(k, None);
        // Keys equal in their first 8 bytes (and zero-padded look-alikes), longer and
        // shorter than 8 bytes, longer than an entry holds inline, and the empty key.
        let keys: [&[u8]; 10] = [
            b"auction-1",
            b"auction-2",
            b"auction-",
            b"auction",
            b"auction\0",
            b"auction-12",
            b"",
            b"\0",
            b"auction-1-longer-than-16",
            b"auction-1-longer-than-17",
        ];
        let mut c = KeyCache::default();
        for k in keys {
            assert!(!c.contains(k));
            c.insert(entry(k));
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(c.find(k), Some(i as u32), "{k:?}");
            assert_eq!(&*c.get_mut(k).unwrap().key, *k);
        }
        assert!(!c.contains(b"auction-3") && !c.contains(b"\0\0"));
        c.remove(b"auction-1");
        c.retain(|e| &*e.key != b"auction-12");
        assert!(!c.contains(b"auction-1") && !c.contains(b"auction-12"));
        for k in &keys[1..5] {
            assert!(c.contains(k), "{k:?}");
        }
        assert_eq!(c.len(), 8);
    }

    #[test]
    fn a_slot_sorts_by_time() {
        // Deterministic LCG: entries of one slot (times sharing their high bits, negative
        // ones too), many on the same millisecond.
        let mut next = crate::test_lcg(0x2545_f491_4f6c_dd1d);
        for (base, n) in [
            (0i64, 33usize),
            (-256, 200),
            (7 << 8, 1000),
            (1 << 40, 5000),
        ] {
            let mut v: Vec<Due> = (0..n)
                .map(|_| (base + (next() % 256) as i64, (next() % 50) as u32))
                .collect();
            let mut want = v.clone();
            want.sort_unstable();
            DueQueue::sort_slot(&mut v);
            assert!(v.is_sorted_by_key(|d| d.0), "slot at {base}, {n} entries");
            v.sort_unstable();
            assert_eq!(v, want, "slot at {base}, {n} entries: the same entries");
        }
    }

    #[test]
    fn the_due_queue_yields_what_is_due_in_time_order() {
        let mut q = DueQueue::default();
        // Times across slots, negative ones and the same time for several slots, pushed
        // out of order; (700, 2) twice, as a timer moved away and back leaves it.
        let pushed = [
            (700, 2),
            (-300, 26),
            (700, 1),
            (5, 11),
            (256, 11),
            (255, 1),
            (700, 2),
            (10_000, 24),
            (701, 1),
        ];
        for (t, s) in pushed {
            q.push(t, s);
        }
        // Sorted by time; equal times compared as sets.
        let take = |q: &mut DueQueue, upto| -> Vec<Due> {
            let v = q.take_due(upto);
            assert!(v.is_sorted_by_key(|d| d.0));
            let mut v = v;
            v.sort_unstable();
            v
        };
        assert_eq!(take(&mut q, 255), [(-300, 26), (5, 11), (255, 1)]);
        assert!(take(&mut q, 255).is_empty());
        // Mid-slot: 700 is due, 701 (same slot) is not.
        assert_eq!(take(&mut q, 700), [(256, 11), (700, 1), (700, 2), (700, 2)]);
        assert_eq!(q.first_time(), Some(701));
        assert_eq!(take(&mut q, i64::MAX), [(701, 1), (10_000, 24)]);
        assert_eq!(q.first_time(), None);
        q.push(i64::MAX, 3);
        assert_eq!(take(&mut q, i64::MAX - 1), []);
        assert_eq!(take(&mut q, i64::MAX), [(i64::MAX, 3)]);
    }
}
