//! [`CepOperator`]: runs a [`Pattern`] per record key on host keyed state and event-time
//! timers (seed §9.2, §8.4).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Serialize, de::DeserializeOwned};

use super::nfa::{BufEntry, KeyNfa, NfaState, Output};
use super::{Match, Pattern};
use crate::{
    Batch, Context, FiredTimer, MapState, PluginError, PluginInfo, RecordRef, Result, TimeDomain,
    ValueState, counter_add,
};

/// Per-key NFA state (partial matches, id counters): value state.
pub const NFA_STATE: &str = "cep-nfa";
/// Shared buffer (event id → event, timestamp, reference count): map state.
pub const BUFFER_STATE: &str = "cep-buffer";
/// Event queue (event time → events awaiting the watermark, arrival order): map state.
pub const QUEUE_STATE: &str = "cep-queue";
/// Namespace of the CEP states and of its event-time timers.
pub const CEP_NAMESPACE: &[u8] = b"cep";
/// Schema version of the three CEP states (postcard codec).
pub const STATE_SCHEMA: u32 = 1;
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

/// Order-preserving 8-byte encoding of an event time (sign bit flipped, big-endian).
fn ts_key(ts: i64) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

fn ts_of(key: &[u8; 8]) -> i64 {
    (u64::from_be_bytes(*key) ^ (1 << 63)) as i64
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
/// Cost: each watermark step loads, per key with due timers, the key's queue, NFA value
/// and shared buffer; memory per key is bounded by its queued events plus the events
/// referenced by its partial matches. Without `within`, partial matches of a pattern
/// that cannot complete are kept forever (as in Flink).
pub struct CepOperator<E> {
    pattern: Pattern<E>,
    decode: DecodeFn<E>,
    emit: EmitFn<E>,
    emit_timed_out: Option<EmitFn<E>>,
    late: LateEvents,
    late_events: u64,
    nfa: ValueState<NfaState>,
    buffer: MapState<[u8; 8], BufEntry<E>>,
    queue: MapState<[u8; 8], Vec<E>>,
    /// Keys advanced by `on_timers` that `on_watermark` brings up to the watermark.
    touched: Vec<Vec<u8>>,
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
        info.state(MapState::<[u8; 8], Vec<E>>::descriptor(
            QUEUE_STATE,
            STATE_SCHEMA,
        ))
        .state(ValueState::<NfaState>::descriptor(NFA_STATE, STATE_SCHEMA))
        .state(MapState::<[u8; 8], BufEntry<E>>::descriptor(
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
            late: LateEvents::Drop,
            late_events: 0,
            nfa: ValueState::open(ctx, NFA_STATE)?,
            buffer: MapState::open(ctx, BUFFER_STATE)?,
            queue: MapState::open(ctx, QUEUE_STATE)?,
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

    /// Whether `timer` belongs to the CEP runtime (event time, namespace
    /// [`CEP_NAMESPACE`]); other timers are ignored by [`CepOperator::on_timers`].
    pub fn is_cep_timer(timer: &FiredTimer) -> bool {
        timer.domain == TimeDomain::EventTime && timer.namespace == CEP_NAMESPACE
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
        let mut groups: BTreeMap<(&[u8], i64), Vec<E>> = BTreeMap::new();
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
            groups.entry((key, ts)).or_default().push(event);
        }
        let queue = self.queue.in_namespace(CEP_NAMESPACE);
        for ((key, ts), events) in groups {
            let mut queued = queue.get(ctx, key, &ts_key(ts)).unwrap_or_default();
            queued.extend(events);
            queue.put(ctx, key, &ts_key(ts), &queued);
            ctx.register_timer(TimeDomain::EventTime, key, CEP_NAMESPACE, ts);
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

    /// Feeds the keys of due CEP timers through the NFA up to the timer time (or the
    /// context's watermark if later); non-CEP timers are ignored.
    ///
    /// # Errors
    /// Whatever the emit fns report; state is unchanged for the failing key.
    pub fn on_timers(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        timers: &[FiredTimer],
        out: &mut Batch,
    ) -> Result<()> {
        let wm = ctx.current_watermark();
        let mut keys: Vec<(Vec<u8>, i64)> = Vec::new();
        for t in timers.iter().filter(|t| Self::is_cep_timer(t)) {
            match keys.iter_mut().find(|(k, _)| *k == t.key) {
                Some(e) => e.1 = e.1.max(t.timestamp),
                None => keys.push((t.key.clone(), t.timestamp)),
            }
        }
        for (key, ts) in keys {
            self.advance(ctx, &key, ts.max(wm), out)?;
            if !self.touched.contains(&key) {
                self.touched.push(key);
            }
        }
        Ok(())
    }

    /// Brings the keys touched by the preceding `on_timers` up to `watermark`, so that
    /// timeouts falling between their timers and the watermark are handled now.
    ///
    /// # Errors
    /// Whatever the emit fns report.
    pub fn on_watermark(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        for key in std::mem::take(&mut self.touched) {
            self.advance(ctx, &key, watermark, out)?;
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

    /// Processes key `key` up to event time `t`: queued events and timeouts in time
    /// order (timeouts first on equal times), then writes the key's state back.
    fn advance(
        &mut self,
        ctx: &mut (impl Context + ?Sized),
        key: &[u8],
        t: i64,
        out: &mut Batch,
    ) -> Result<()> {
        let p = &self.pattern;
        let nfa_state = self.nfa.in_namespace(CEP_NAMESPACE);
        let queue_state = self.queue.in_namespace(CEP_NAMESPACE);
        let buffer_state = self.buffer.in_namespace(CEP_NAMESPACE);
        let state = nfa_state.get(ctx, key).unwrap_or_default();
        let queue = queue_state.entries(ctx, key);
        let deadline_due = state
            .runs
            .iter()
            .any(|r| KeyNfa::deadline(p, r).is_some_and(|d| d <= t));
        if !deadline_due && queue.first().is_none_or(|(k, _)| ts_of(k) > t) {
            return Ok(());
        }
        let timers_of = |k: &KeyNfa<E>, queue: &[([u8; 8], Vec<E>)]| -> BTreeSet<i64> {
            let mut s: BTreeSet<i64> = queue.iter().map(|(k, _)| ts_of(k)).collect();
            s.extend(k.state.runs.iter().filter_map(|r| KeyNfa::deadline(p, r)));
            s
        };
        let loaded: BTreeMap<u64, BufEntry<E>> = buffer_state
            .entries(ctx, key)
            .into_iter()
            .map(|(k, v)| (u64::from_be_bytes(k), v))
            .collect();
        let mut k = KeyNfa {
            state,
            buffer: loaded.clone(),
        };
        let timers_before = timers_of(&k, &queue);
        let mut outputs = Vec::new();
        let mut done = 0;
        for (qk, events) in &queue {
            let ts = ts_of(qk);
            if ts > t {
                break;
            }
            k.advance_time(p, key, ts, &mut outputs);
            for e in events {
                k.process_event(p, key, ts, e.clone(), &mut outputs);
            }
            done += 1;
        }
        k.advance_time(p, key, t, &mut outputs);
        k.collect_garbage();

        // Encode every output before touching state, so an emit error changes nothing.
        let mark = out.len();
        let mut timed_out = Batch::new();
        for o in &outputs {
            let (m, target, f) = match o {
                Output::Matched(m) => (m, &mut *out, &self.emit),
                Output::TimedOut(m) => (
                    m,
                    &mut timed_out,
                    self.emit_timed_out.as_ref().unwrap_or(&self.emit),
                ),
            };
            let r = target.push_with(Some(key), Some(m.end_ts), |buf| f(m, buf));
            if let Err(e) = r {
                out.truncate(mark);
                return Err(e);
            }
        }
        if !timed_out.is_empty() {
            ctx.side_output(TIMED_OUT, &timed_out);
        }

        let rest = &queue[done..];
        for (qk, _) in &queue[..done] {
            queue_state.remove(ctx, key, qk);
        }
        for id in loaded.keys().filter(|id| !k.buffer.contains_key(id)) {
            buffer_state.remove(ctx, key, &id.to_be_bytes());
        }
        for (id, b) in &k.buffer {
            if loaded.get(id).is_none_or(|old| old.refs != b.refs) {
                buffer_state.put(ctx, key, &id.to_be_bytes(), b);
            }
        }
        let timers_after = timers_of(&k, rest);
        for ts in timers_before.difference(&timers_after) {
            ctx.delete_timer(TimeDomain::EventTime, key, CEP_NAMESPACE, *ts);
        }
        for ts in timers_after.difference(&timers_before) {
            ctx.register_timer(TimeDomain::EventTime, key, CEP_NAMESPACE, *ts);
        }
        if k.state.runs.is_empty() && rest.is_empty() {
            debug_assert!(k.buffer.is_empty(), "no run but buffered events");
            nfa_state.delete(ctx, key);
        } else {
            nfa_state.put(ctx, key, &k.state);
        }
        Ok(())
    }
}
