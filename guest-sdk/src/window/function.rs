//! What a window computes: the functions a component author supplies
//! ([`AggregateFunction`], [`ReduceFunction`], [`ProcessWindowFunction`]) and the
//! [`WindowFunction`] wrappers ([`Aggregating`], [`Processing`]) that store their
//! per-window contents in host state.

use serde::{Serialize, de::DeserializeOwned};

use super::cache::AccCache;
use super::{ACC_STATE, CONTENTS_STATE, FunctionKind, Window};
use crate::{
    Batch, Context, RecordRef, Result, STATE_WRITE_CHUNK, StateHandle, TimeDomain, ValueState,
};

/// An incremental aggregate (Flink's `AggregateFunction<IN, ACC, OUT>`): records are
/// decoded once, folded into an accumulator stored per (key, window) in value state
/// [`ACC_STATE`], and the result is taken when the window fires.
///
/// `add` and `merge` should be order-insensitive (commutative and associative) if results
/// must not depend on batching or arrival order; the operator adds records in arrival
/// order within a window, but merges session accumulators in merge order.
pub trait AggregateFunction {
    /// A decoded record, produced once per record even if it belongs to several windows.
    type In;
    /// The accumulator, serialized with postcard into [`ACC_STATE`].
    type Acc: Serialize + DeserializeOwned;
    /// The result handed to the [`ProcessWindowFunction`] on firing.
    type Out;

    /// Decodes a record (payload, key, timestamp).
    ///
    /// # Errors
    /// A record the function cannot use; the operator reports it as
    /// [`crate::ErrorCode::InvalidRecord`] prefixed with the record index.
    fn decode(&self, record: RecordRef<'_>) -> Result<Self::In>;

    /// A new, empty accumulator.
    fn create_accumulator(&self) -> Self::Acc;

    /// Folds one record into `acc`.
    fn add(&self, acc: &mut Self::Acc, value: &Self::In);

    /// Folds `other` into `acc` (session windows merging).
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc);

    /// The result of a window; `acc` holds at least one record.
    fn get_result(&self, acc: Self::Acc) -> Self::Out;
}

/// A reduce (Flink's `ReduceFunction<T>`): combines two values of the same type into one.
/// The running value of a window is kept like an accumulator; see [`ReduceAggregate`].
pub trait ReduceFunction {
    /// The value type, serialized with postcard into [`ACC_STATE`].
    type Value: Serialize + DeserializeOwned + Clone;

    /// Decodes a record into a value.
    ///
    /// # Errors
    /// A record the function cannot use (reported as
    /// [`crate::ErrorCode::InvalidRecord`]).
    fn decode(&self, record: RecordRef<'_>) -> Result<Self::Value>;

    /// Combines two values; `a` came first.
    fn reduce(&self, a: Self::Value, b: Self::Value) -> Self::Value;
}

/// A function over a fired window (Flink's `ProcessWindowFunction`): gets the key, the
/// window and its elements — every record payload for [`Processing`], the single
/// aggregate / reduce result for [`Aggregating`] — and emits any number of records.
pub trait ProcessWindowFunction<In> {
    /// Processes one firing of `window` for `key`.
    ///
    /// # Errors
    /// Whatever the function reports; the host applies the job's error policy.
    fn process(
        &self,
        key: &[u8],
        window: Window,
        elements: &[In],
        out: &mut WindowOutput<'_>,
    ) -> Result<()>;
}

/// Where a [`ProcessWindowFunction`] emits: records keyed by the window's key, with the
/// window's max timestamp as event time.
#[derive(Debug)]
pub struct WindowOutput<'a> {
    batch: &'a mut Batch,
    key: &'a [u8],
    timestamp: i64,
}

impl<'a> WindowOutput<'a> {
    /// Output to `batch` for `key`, stamping records with `timestamp`.
    pub fn new(batch: &'a mut Batch, key: &'a [u8], timestamp: i64) -> Self {
        WindowOutput {
            batch,
            key,
            timestamp,
        }
    }

    /// The key records are emitted with.
    pub fn key(&self) -> &[u8] {
        self.key
    }

    /// The event time records are emitted with (the window's max timestamp).
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// Emits one record with payload `data`.
    pub fn emit(&mut self, data: &[u8]) {
        self.batch
            .push_record(Some(self.key), Some(self.timestamp), data);
    }

    /// Emits one record whose payload `write` appends in place (see [`Batch::push_with`]).
    pub fn emit_with<R>(&mut self, write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        self.batch
            .push_with(Some(self.key), Some(self.timestamp), write)
    }
}

/// The pass-through [`ProcessWindowFunction`]: emits every element as a record payload
/// (Flink's `PassThroughWindowFunction`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EmitResult;

impl<T: AsRef<[u8]>> ProcessWindowFunction<T> for EmitResult {
    fn process(
        &self,
        _key: &[u8],
        _window: Window,
        elements: &[T],
        out: &mut WindowOutput<'_>,
    ) -> Result<()> {
        for e in elements {
            out.emit(e.as_ref());
        }
        Ok(())
    }
}

/// Records of one key within one window of a batch, as indices into the batch.
#[derive(Debug, Clone, Copy)]
pub struct KeyGroup<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Indices of the records, in arrival order.
    pub records: &'a [u32],
}

/// How a window operator stores and fires per-window contents. Implemented by
/// [`Aggregating`] and [`Processing`]; supply an [`AggregateFunction`],
/// [`ReduceFunction`] or [`ProcessWindowFunction`] to those rather than implementing this.
///
/// `ns` arguments are state namespaces ([`Window::namespace`] of the state window).
pub trait WindowFunction {
    /// A decoded record.
    type Input;

    /// What is computed, for the model and the state descriptors.
    fn kind(&self) -> FunctionKind;

    /// Opens the states this function uses.
    ///
    /// # Errors
    /// A state not declared in `describe()` (see [`super::state_descriptors`]).
    fn open(&mut self, ctx: &mut dyn Context) -> Result<()>;

    /// Decodes one record.
    ///
    /// # Errors
    /// A record the function cannot use.
    fn decode(&self, record: RecordRef<'_>) -> Result<Self::Input>;

    /// Adds each group's records to window `ns` of its key (batched per namespace).
    /// `inputs[r]` is `Some` for every record index `r` of the groups.
    fn add(
        &mut self,
        ctx: &mut dyn Context,
        ns: &[u8],
        groups: &[KeyGroup<'_>],
        inputs: &[Option<Self::Input>],
        batch: &Batch,
    );

    /// Moves the contents of `source` into `target` for `key` and clears `source`.
    fn merge(&mut self, ctx: &mut dyn Context, key: &[u8], target: &[u8], source: &[u8]);

    /// Emits the result of `window` of `key`, whose contents are in `ns`; emits nothing if
    /// the window holds nothing.
    ///
    /// # Errors
    /// Whatever the [`ProcessWindowFunction`] reports.
    fn fire(
        &mut self,
        ctx: &mut dyn Context,
        key: &[u8],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()>;

    /// Removes the contents of `ns` for `key`.
    fn clear(&mut self, ctx: &mut dyn Context, key: &[u8], ns: &[u8]);

    /// Fires `window` for every key laid out flat in `keys` / `key_ends` (a timer
    /// group). Default: [`Self::fire`] per key.
    ///
    /// # Errors
    /// Errors of the process function.
    fn fire_many(
        &mut self,
        ctx: &mut dyn Context,
        keys: &[u8],
        key_ends: &[u32],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        let mut start = 0usize;
        for &end in key_ends {
            self.fire(ctx, &keys[start..end as usize], window, ns, out)?;
            start = end as usize;
        }
        Ok(())
    }

    /// Clears the window state in `ns` of every key laid out flat in `keys` /
    /// `key_ends`. Default: [`Self::clear`] per key.
    fn clear_many(&mut self, ctx: &mut dyn Context, keys: &[u8], key_ends: &[u32], ns: &[u8]) {
        let mut start = 0usize;
        for &end in key_ends {
            self.clear(ctx, &keys[start..end as usize], ns);
            start = end as usize;
        }
    }

    /// Whether the function can keep per-(key, window) contents in the instance between
    /// checkpoints (the accumulator cache, see the [module docs](super)): then the
    /// operator calls [`Self::cache_add`] instead of [`Self::add`], fires with
    /// [`Self::fire_cached`] and writes the cache back with [`Self::flush_cache`].
    /// Default: `false` ([`Aggregating`] says `true`).
    fn caches(&self) -> bool {
        false
    }

    /// Folds `input` into the cached contents of `key` in each of `windows`. Only called
    /// when [`Self::caches`]. Default: unreachable.
    fn cache_add(&mut self, windows: &[Window], key: &[u8], input: &Self::Input) {
        let _ = (windows, key, input);
        unreachable!("cache_add on a window function that does not cache");
    }

    /// Whether the cache is past its bound ([`MAX_CACHED_ENTRIES`](super::MAX_CACHED_ENTRIES)
    /// (key, window) entries or [`MAX_CACHED_KEY_BYTES`](super::MAX_CACHED_KEY_BYTES) of
    /// keys). Default: `false`.
    fn cache_full(&self) -> bool {
        false
    }

    /// The lowest window with cached contents. Default: `None`.
    fn first_cached(&self) -> Option<Window> {
        None
    }

    /// Fires `window` for the union of the keys of a timer group (flat in `keys` /
    /// `key_ends`, ascending, contents in state `ns`) and the keys cached for `window`, in
    /// ascending key order, each key's stored and cached contents combined; then drops the
    /// window from the cache. Does not clear state. Default: [`Self::fire_many`].
    ///
    /// # Errors
    /// Errors of the process function (the window's cached contents are dropped).
    fn fire_cached(
        &mut self,
        ctx: &mut dyn Context,
        keys: &[u8],
        key_ends: &[u32],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        self.fire_many(ctx, keys, key_ends, window, ns, out)
    }

    /// Writes every cached (key, window) back to state (combined with what state holds)
    /// and registers the key's event-time timer at the window's max timestamp, so that
    /// state and timers are exact; empties the cache. Default: nothing.
    fn flush_cache(&mut self, ctx: &mut dyn Context) {
        let _ = ctx;
    }
}

/// Incremental window function: an [`AggregateFunction`] (or a [`ReduceFunction`] through
/// [`ReduceAggregate`]) with an optional [`ProcessWindowFunction`] over its result
/// (default [`EmitResult`], which needs `Out: AsRef<[u8]>`). Uses value state
/// [`ACC_STATE`].
pub struct Aggregating<A: AggregateFunction, P = EmitResult> {
    agg: A,
    process: P,
    kind: FunctionKind,
    acc: Option<ValueState<A::Acc>>,
    cache: AccCache<A::Acc>,
}

impl<A: AggregateFunction + std::fmt::Debug, P: std::fmt::Debug> std::fmt::Debug
    for Aggregating<A, P>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregating")
            .field("agg", &self.agg)
            .field("process", &self.process)
            .field("kind", &self.kind)
            .finish()
    }
}

impl<A: AggregateFunction> Aggregating<A, EmitResult> {
    /// Emits `agg`'s result as the record payload.
    pub fn new(agg: A) -> Self {
        Self::with_process(agg, EmitResult)
    }
}

impl<A: AggregateFunction, P> Aggregating<A, P> {
    /// `later` folded into `earlier` ([`AggregateFunction::merge`]), or `later` alone.
    fn merged(&self, earlier: Option<A::Acc>, later: A::Acc) -> A::Acc {
        match earlier {
            Some(mut acc) => {
                self.agg.merge(&mut acc, later);
                acc
            }
            None => later,
        }
    }

    /// Hands `agg`'s result to `process` together with key and window.
    pub fn with_process(agg: A, process: P) -> Self {
        Aggregating {
            agg,
            process,
            kind: FunctionKind::Aggregate,
            acc: None,
            cache: AccCache::default(),
        }
    }

    /// The aggregate function.
    pub fn function(&self) -> &A {
        &self.agg
    }
}

impl<R: ReduceFunction> Aggregating<ReduceAggregate<R>, EmitResult> {
    /// A reduce whose result is emitted as the record payload.
    pub fn reduce(reduce: R) -> Self {
        Self::reduce_with_process(reduce, EmitResult)
    }
}

impl<R: ReduceFunction, P> Aggregating<ReduceAggregate<R>, P> {
    /// A reduce whose result goes to `process` together with key and window.
    pub fn reduce_with_process(reduce: R, process: P) -> Self {
        Aggregating {
            agg: ReduceAggregate(reduce),
            process,
            kind: FunctionKind::Reduce,
            acc: None,
            cache: AccCache::default(),
        }
    }
}

/// A [`ReduceFunction`] as an [`AggregateFunction`]: the accumulator is the running value
/// (`None` before the first record).
#[derive(Debug, Clone)]
pub struct ReduceAggregate<R>(pub R);

impl<R: ReduceFunction> AggregateFunction for ReduceAggregate<R> {
    type In = R::Value;
    type Acc = Option<R::Value>;
    type Out = R::Value;

    fn decode(&self, record: RecordRef<'_>) -> Result<R::Value> {
        self.0.decode(record)
    }

    fn create_accumulator(&self) -> Option<R::Value> {
        None
    }

    fn add(&self, acc: &mut Option<R::Value>, value: &R::Value) {
        *acc = Some(match acc.take() {
            None => value.clone(),
            Some(a) => self.0.reduce(a, value.clone()),
        });
    }

    fn merge(&self, acc: &mut Option<R::Value>, other: Option<R::Value>) {
        *acc = match (acc.take(), other) {
            (Some(a), Some(b)) => Some(self.0.reduce(a, b)),
            (a, b) => a.or(b),
        };
    }

    /// # Panics
    /// On an empty accumulator; the operator stores accumulators only after adding a
    /// record, so a fired window always holds a value.
    fn get_result(&self, acc: Option<R::Value>) -> R::Value {
        acc.expect("a reduce window fires only after a record was added")
    }
}

impl<A: AggregateFunction, P: ProcessWindowFunction<A::Out>> WindowFunction for Aggregating<A, P> {
    type Input = A::In;

    fn kind(&self) -> FunctionKind {
        self.kind
    }

    fn open(&mut self, ctx: &mut dyn Context) -> Result<()> {
        self.acc = Some(ValueState::open(ctx, ACC_STATE)?);
        Ok(())
    }

    fn decode(&self, record: RecordRef<'_>) -> Result<A::In> {
        self.agg.decode(record)
    }

    fn add(
        &mut self,
        ctx: &mut dyn Context,
        ns: &[u8],
        groups: &[KeyGroup<'_>],
        inputs: &[Option<A::In>],
        _batch: &Batch,
    ) {
        let state = self.acc.as_ref().expect("window function used before open");
        let state = state.in_namespace(ns);
        let keys: Vec<&[u8]> = groups.iter().map(|g| g.key).collect();
        let stored = state.get_many(ctx, &keys);
        let entries: Vec<(&[u8], A::Acc)> = groups
            .iter()
            .zip(stored)
            .map(|(g, acc)| {
                let mut acc = acc.unwrap_or_else(|| self.agg.create_accumulator());
                for &r in g.records {
                    let input = inputs[r as usize]
                        .as_ref()
                        .expect("operator decodes every grouped record");
                    self.agg.add(&mut acc, input);
                }
                (g.key, acc)
            })
            .collect();
        state.put_many(ctx, &entries);
    }

    fn merge(&mut self, ctx: &mut dyn Context, key: &[u8], target: &[u8], source: &[u8]) {
        let state = self.acc.as_ref().expect("window function used before open");
        let Some(src) = state.in_namespace(source).get(ctx, key) else {
            return;
        };
        let merged = self.merged(state.in_namespace(target).get(ctx, key), src);
        state.in_namespace(target).put(ctx, key, &merged);
        state.in_namespace(source).delete(ctx, key);
    }

    fn fire(
        &mut self,
        ctx: &mut dyn Context,
        key: &[u8],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        let state = self.acc.as_ref().expect("window function used before open");
        let Some(acc) = state.in_namespace(ns).get(ctx, key) else {
            return Ok(());
        };
        let result = self.agg.get_result(acc);
        let mut output = WindowOutput::new(out, key, window.max_timestamp());
        self.process
            .process(key, window, std::slice::from_ref(&result), &mut output)
    }

    fn clear(&mut self, ctx: &mut dyn Context, key: &[u8], ns: &[u8]) {
        let state = self.acc.as_ref().expect("window function used before open");
        state.in_namespace(ns).delete(ctx, key);
    }

    /// One batched read of the accumulators, then the process function per present key.
    fn fire_many(
        &mut self,
        ctx: &mut dyn Context,
        keys: &[u8],
        key_ends: &[u32],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        let state = self.acc.as_ref().expect("window function used before open");
        let accs = state.in_namespace(ns).get_many_flat(ctx, keys, key_ends);
        let mut start = 0usize;
        for (acc, &end) in accs.into_iter().zip(key_ends) {
            let key = &keys[start..end as usize];
            start = end as usize;
            let Some(acc) = acc else {
                continue;
            };
            let result = self.agg.get_result(acc);
            let mut output = WindowOutput::new(out, key, window.max_timestamp());
            self.process
                .process(key, window, std::slice::from_ref(&result), &mut output)?;
        }
        Ok(())
    }

    /// One batched delete.
    fn clear_many(&mut self, ctx: &mut dyn Context, keys: &[u8], key_ends: &[u32], ns: &[u8]) {
        let state = self.acc.as_ref().expect("window function used before open");
        state.in_namespace(ns).delete_many_flat(ctx, keys, key_ends);
    }

    fn caches(&self) -> bool {
        true
    }

    #[inline]
    fn cache_add(&mut self, windows: &[Window], key: &[u8], input: &A::In) {
        let agg = &self.agg;
        self.cache.add(
            windows,
            key,
            || agg.create_accumulator(),
            |acc| agg.add(acc, input),
        );
    }

    fn cache_full(&self) -> bool {
        self.cache.is_full()
    }

    fn first_cached(&self) -> Option<Window> {
        self.cache.first()
    }

    /// One batched read of the group's accumulators, merged by key order with the cached
    /// ones ([`AggregateFunction::merge`], stored into cached).
    fn fire_cached(
        &mut self,
        ctx: &mut dyn Context,
        keys: &[u8],
        key_ends: &[u32],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        let Some(mut slot) = self.cache.take(window) else {
            return self.fire_many(ctx, keys, key_ends, window, ns, out);
        };
        let state = self.acc.as_ref().expect("window function used before open");
        let mut stored = if key_ends.is_empty() {
            Vec::new()
        } else {
            state.in_namespace(ns).get_many_flat(ctx, keys, key_ends)
        }
        .into_iter();
        let order = slot.sorted();
        let mut cached: Vec<Option<A::Acc>> = slot.take_accs().into_iter().map(Some).collect();
        let mut order = order.into_iter().peekable();
        let (mut start, mut ends) = (0usize, key_ends.iter().peekable());
        let ts = window.max_timestamp();
        loop {
            let group_key = ends.peek().map(|&&end| &keys[start..end as usize]);
            let cached_key = order.peek().map(|&i| slot.key(i as usize));
            let from_group = match (group_key, cached_key) {
                (None, None) => break,
                (Some(g), Some(c)) => g <= c,
                (g, _) => g.is_some(),
            };
            let (key, acc) = if from_group {
                let g = group_key.expect("from the group");
                start = *ends.next().expect("peeked") as usize;
                let stored = stored.next().flatten();
                if cached_key == Some(g) {
                    let i = order.next().expect("peeked") as usize;
                    let delta = cached[i].take().expect("each cached entry fires once");
                    (g, Some(self.merged(stored, delta)))
                } else {
                    (g, stored)
                }
            } else {
                let i = order.next().expect("peeked") as usize;
                (slot.key(i), cached[i].take())
            };
            let Some(acc) = acc else {
                continue;
            };
            let result = self.agg.get_result(acc);
            let mut output = WindowOutput::new(out, key, ts);
            self.process
                .process(key, window, std::slice::from_ref(&result), &mut output)?;
        }
        Ok(())
    }

    /// Per cached window, per [`STATE_WRITE_CHUNK`] of its keys (so that a state memory
    /// budget applies between the calls): one batched read of the stored accumulators,
    /// one batched write of the merged ones, one timer registration.
    fn flush_cache(&mut self, ctx: &mut dyn Context) {
        let state = self.acc.as_ref().expect("window function used before open");
        for (window, mut slot) in self.cache.drain() {
            let ns = window.namespace();
            let state = state.in_namespace(&ns);
            let mut deltas = slot.take_accs().into_iter();
            let keys: Vec<&[u8]> = (0..slot.len()).map(|i| slot.key(i)).collect();
            for keys in keys.chunks(STATE_WRITE_CHUNK) {
                let stored = state.get_many(ctx, keys);
                let entries: Vec<(&[u8], A::Acc)> = keys
                    .iter()
                    .zip(deltas.by_ref())
                    .zip(stored)
                    .map(|((&k, delta), stored)| (k, self.merged(stored, delta)))
                    .collect();
                state.put_many(ctx, &entries);
                ctx.register_timers_for_keys(
                    TimeDomain::EventTime,
                    &ns,
                    window.max_timestamp(),
                    keys,
                );
            }
        }
    }
}

/// Buffering window function: every record payload of a window is appended to list state
/// [`CONTENTS_STATE`] and the [`ProcessWindowFunction`] gets them all, in arrival order
/// (sessions: merged windows' lists concatenated), when the window fires.
#[derive(Debug)]
pub struct Processing<P> {
    process: P,
    contents: Option<StateHandle>,
}

impl<P: ProcessWindowFunction<Vec<u8>>> Processing<P> {
    /// Buffers records for `process`.
    pub fn new(process: P) -> Self {
        Processing {
            process,
            contents: None,
        }
    }

    fn handle(&self) -> StateHandle {
        self.contents.expect("window function used before open")
    }
}

impl<P: ProcessWindowFunction<Vec<u8>>> WindowFunction for Processing<P> {
    type Input = ();

    fn kind(&self) -> FunctionKind {
        FunctionKind::Process
    }

    fn open(&mut self, ctx: &mut dyn Context) -> Result<()> {
        self.contents = Some(ctx.open_state(CONTENTS_STATE)?);
        Ok(())
    }

    fn decode(&self, _record: RecordRef<'_>) -> Result<()> {
        Ok(())
    }

    fn add(
        &mut self,
        ctx: &mut dyn Context,
        ns: &[u8],
        groups: &[KeyGroup<'_>],
        _inputs: &[Option<()>],
        batch: &Batch,
    ) {
        let h = self.handle();
        for g in groups {
            for &r in g.records {
                ctx.list_append(h, ns, g.key, batch.record(r as usize));
            }
        }
    }

    fn merge(&mut self, ctx: &mut dyn Context, key: &[u8], target: &[u8], source: &[u8]) {
        let h = self.handle();
        for v in ctx.list_get(h, source, key) {
            ctx.list_append(h, target, key, &v);
        }
        ctx.list_clear(h, source, key);
    }

    fn fire(
        &mut self,
        ctx: &mut dyn Context,
        key: &[u8],
        window: Window,
        ns: &[u8],
        out: &mut Batch,
    ) -> Result<()> {
        let elements = ctx.list_get(self.handle(), ns, key);
        if elements.is_empty() {
            return Ok(());
        }
        let mut output = WindowOutput::new(out, key, window.max_timestamp());
        self.process.process(key, window, &elements, &mut output)
    }

    fn clear(&mut self, ctx: &mut dyn Context, key: &[u8], ns: &[u8]) {
        ctx.list_clear(self.handle(), ns, key);
    }
}
