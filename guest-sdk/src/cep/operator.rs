//! [`CepOperator`]: runs a [`Pattern`] per record key on host keyed state and event-time
//! timers (design §9.2, §8.4).

use std::collections::{BTreeMap, HashMap};

use serde::{Serialize, de::DeserializeOwned};

use super::nfa::{BufEntry, KeyNfa, NfaState, Output};
use super::{Match, Pattern};
use crate::{
    Batch, Context, PluginError, PluginInfo, RecordRef, Result, TimeDomain, TimerGroup, ValueState,
    counter_add,
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

/// A key's queued events: event time → events in arrival order.
type Queue<E> = BTreeMap<i64, Vec<E>>;
/// A key's shared buffer: event id → entry.
type Buffer<E> = BTreeMap<u64, BufEntry<E>>;
/// One key's events of a batch, with their event times, in arrival order.
type KeyEvents<'a, E> = (&'a [u8], Vec<(i64, E)>);

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
/// Cost: host calls are batched per call, not per record: `process` reads and writes
/// the queues and NFA values of all keys of the batch with one `value-get-many` /
/// `value-put-many` each, and `on_timers` does the same for the keys with a due timer
/// (queue, NFA value, shared buffer). Each key holds exactly one CEP timer, at its
/// earliest queued event or partial-match deadline. Memory per key is bounded by its
/// queued events plus the events referenced by its partial matches. Without `within`,
/// partial matches of a pattern that cannot complete are kept forever (as in Flink).
pub struct CepOperator<E> {
    pattern: Pattern<E>,
    decode: DecodeFn<E>,
    emit: EmitFn<E>,
    emit_timed_out: Option<EmitFn<E>>,
    /// Timed-out partial matches are dropped instead of built and emitted.
    discard_timed_out: bool,
    late: LateEvents,
    late_events: u64,
    nfa: ValueState<NfaState>,
    buffer: ValueState<Buffer<E>>,
    queue: ValueState<Queue<E>>,
    /// Keys advanced by `on_timers` that `on_watermark` brings up to the watermark.
    /// Keys `on_timers` advanced, with the event time they were advanced to.
    touched: Vec<(Vec<u8>, i64)>,
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
        Ok(CepOperator {
            pattern,
            decode: Box::new(decode),
            emit: Box::new(emit),
            emit_timed_out: None,
            discard_timed_out: false,
            late: LateEvents::Drop,
            late_events: 0,
            nfa: ValueState::open(ctx, NFA_STATE)?,
            buffer: ValueState::open(ctx, BUFFER_STATE)?,
            queue: ValueState::open(ctx, QUEUE_STATE)?,
            touched: Vec::new(),
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
    pub fn discard_timed_out(mut self) -> Self {
        self.discard_timed_out = true;
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
        let wm = ctx.current_watermark();
        // Events per key in arrival order; keys in order of first appearance.
        let mut index: HashMap<&[u8], usize, foldhash::fast::FixedState> = HashMap::default();
        let mut groups: Vec<KeyEvents<'_, E>> = Vec::new();
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
            let g = *index.entry(key).or_insert_with(|| {
                groups.push((key, Vec::new()));
                groups.len() - 1
            });
            groups[g].1.push((ts, event));
        }
        if !groups.is_empty() {
            let keys: Vec<&[u8]> = groups.iter().map(|(k, _)| *k).collect();
            let queues = self.queue.in_namespace(CEP_NAMESPACE).get_many(ctx, &keys);
            let nfas = self.nfa.in_namespace(CEP_NAMESPACE).get_many(ctx, &keys);
            let mut puts: Vec<(&[u8], Queue<E>)> = Vec::with_capacity(groups.len());
            let mut retimes = Retimes::default();
            for (((key, events), queue), nfa) in groups.into_iter().zip(queues).zip(nfas) {
                let mut queue = queue.unwrap_or_default();
                let before = self.next_timer(queue.keys().next().copied(), nfa.as_ref());
                for (ts, e) in events {
                    queue.entry(ts).or_default().push(e);
                }
                let after = self.next_timer(queue.keys().next().copied(), nfa.as_ref());
                retimes.push(key, before, after);
                puts.push((key, queue));
            }
            retimes.apply(ctx);
            self.queue.in_namespace(CEP_NAMESPACE).put_many(ctx, &puts);
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
    fn next_timer(&self, first_queued: Option<i64>, nfa: Option<&NfaState>) -> Option<i64> {
        let deadline = nfa.and_then(|n| {
            n.runs
                .iter()
                .filter_map(|r| KeyNfa::deadline(&self.pattern, r))
                .min()
        });
        match (first_queued, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Feeds the keys of due CEP timers through the NFA up to the timer time (or the
    /// context's watermark if later); non-CEP timers are ignored.
    ///
    /// # Errors
    /// Whatever the emit fns report; nothing is written then.
    pub fn on_timers(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let wm = ctx.current_watermark();
        // Keys in order of their first due timer, each with its latest due time.
        let mut index: HashMap<&[u8], usize, foldhash::fast::FixedState> = HashMap::default();
        let mut keys: Vec<(&[u8], i64)> = Vec::new();
        for g in timers.iter().filter(|g| Self::is_cep_timer(g)) {
            for key in g.iter_keys() {
                match index.get(key) {
                    Some(&i) => keys[i].1 = keys[i].1.max(g.timestamp),
                    None => {
                        index.insert(key, keys.len());
                        keys.push((key, g.timestamp));
                    }
                }
            }
        }
        let due: Vec<(&[u8], i64)> = keys.into_iter().map(|(k, ts)| (k, ts.max(wm))).collect();
        self.advance_keys(ctx, &due, true, out)?;
        self.touched
            .extend(due.iter().map(|(k, upto)| (k.to_vec(), *upto)));
        Ok(())
    }

    /// Brings the keys touched by the preceding `on_timers` up to `watermark` when they
    /// were advanced to less (the host shows the new watermark while timers fire, so
    /// normally none are).
    ///
    /// # Errors
    /// Whatever the emit fns report.
    pub fn on_watermark(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        let touched = std::mem::take(&mut self.touched);
        let behind: Vec<(&[u8], i64)> = touched
            .iter()
            .filter(|(_, upto)| *upto < watermark)
            .map(|(k, _)| (k.as_slice(), watermark))
            .collect();
        if !behind.is_empty() {
            // Their one timer is still registered (it is not due), so it stays.
            self.advance_keys(ctx, &behind, false, out)?;
        }
        Ok(())
    }

    /// Flushes keys still cached from `on_timers` (normally none) up to the context's
    /// watermark; call from `prepare_checkpoint` and `finish`.
    ///
    /// # Errors
    /// Whatever the emit fns report.
    pub fn flush(&mut self, ctx: &mut (impl Context + ?Sized), out: &mut Batch) -> Result<()> {
        let wm = ctx.current_watermark();
        self.on_watermark(ctx, wm, out)
    }

    /// Processes each `(key, t)`: the key's queued events and timeouts up to event time
    /// `t` in time order (timeouts first on equal times), then writes every key's state
    /// back with one batched put per state. `fired`: the key's timer just fired (so it
    /// is no longer registered).
    fn advance_keys(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        due: &[(&[u8], i64)],
        fired: bool,
        out: &mut Batch,
    ) -> Result<()> {
        if due.is_empty() {
            return Ok(());
        }
        let keys: Vec<&[u8]> = due.iter().map(|(k, _)| *k).collect();
        let nfa_state = self.nfa.in_namespace(CEP_NAMESPACE);
        let queue_state = self.queue.in_namespace(CEP_NAMESPACE);
        let buffer_state = self.buffer.in_namespace(CEP_NAMESPACE);
        let nfas = nfa_state.get_many(ctx, &keys);
        let queues = queue_state.get_many(ctx, &keys);
        let buffers = buffer_state.get_many(ctx, &keys);

        // Everything is computed before state is touched, so an emit error changes
        // nothing (the task then fails and recovers from the last epoch).
        let mark = out.len();
        let mut timed_out = Batch::new();
        let mut nfa_puts: Vec<(&[u8], NfaState)> = Vec::new();
        let mut queue_puts: Vec<(&[u8], Queue<E>)> = Vec::new();
        let mut buffer_puts: Vec<(&[u8], Buffer<E>)> = Vec::new();
        let mut deletes: Vec<u8> = Vec::new();
        let mut delete_ends: Vec<u32> = Vec::new();
        let mut retimes = Retimes::default();
        for ((((key, t), nfa), queue), buffer) in due.iter().zip(nfas).zip(queues).zip(buffers) {
            let (key, t) = (*key, *t);
            let mut queue = queue.unwrap_or_default();
            let had_state = nfa.is_some() || !queue.is_empty();
            let before = if fired {
                None
            } else {
                self.next_timer(queue.keys().next().copied(), nfa.as_ref())
            };
            let mut k = KeyNfa {
                state: nfa.unwrap_or_default(),
                buffer: buffer.unwrap_or_default(),
                report_timeouts: !self.discard_timed_out,
            };
            let mut outputs = Vec::new();
            let later = queue.split_off(&t.saturating_add(1));
            for (ts, events) in std::mem::take(&mut queue) {
                k.advance_time(&self.pattern, key, ts, &mut outputs);
                for e in events {
                    k.process_event(&self.pattern, key, ts, e, &mut outputs);
                }
            }
            let queue = later;
            k.advance_time(&self.pattern, key, t, &mut outputs);
            k.collect_garbage();
            for o in &outputs {
                let (m, target, f) = match o {
                    Output::Matched(m) => (m, &mut *out, &self.emit),
                    Output::TimedOut(m) => (
                        m,
                        &mut timed_out,
                        self.emit_timed_out.as_ref().unwrap_or(&self.emit),
                    ),
                };
                if let Err(e) = target.push_with(Some(key), Some(m.end_ts), |buf| f(m, buf)) {
                    out.truncate(mark);
                    return Err(e);
                }
            }
            let after = self.next_timer(queue.keys().next().copied(), Some(&k.state));
            retimes.push(key, before, after);
            if k.state.runs.is_empty() && queue.is_empty() {
                debug_assert!(k.buffer.is_empty(), "no run but buffered events");
                if had_state {
                    deletes.extend_from_slice(key);
                    delete_ends.push(deletes.len() as u32);
                }
            } else {
                nfa_puts.push((key, k.state));
                queue_puts.push((key, queue));
                buffer_puts.push((key, k.buffer));
            }
        }
        if !timed_out.is_empty() {
            ctx.side_output(TIMED_OUT, &timed_out);
        }
        nfa_state.delete_many_flat(ctx, &deletes, &delete_ends);
        queue_state.delete_many_flat(ctx, &deletes, &delete_ends);
        buffer_state.delete_many_flat(ctx, &deletes, &delete_ends);
        if !nfa_puts.is_empty() {
            nfa_state.put_many(ctx, &nfa_puts);
            queue_state.put_many(ctx, &queue_puts);
            buffer_state.put_many(ctx, &buffer_puts);
        }
        retimes.apply(ctx);
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
