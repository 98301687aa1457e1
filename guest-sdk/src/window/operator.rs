//! [`WindowOperator`]: assignment, lateness, merging, timers and firing over a
//! [`WindowFunction`].

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::function::{KeyGroup, WindowFunction};
use super::{ACC_STATE, LATE_OUTPUT, MERGE_STATE, Window, WindowSpec};
use crate::{Batch, Context, PluginError, Result, TimeDomain, TimerGroup, ValueState};

/// One window of a key's merge set (session windows), stored in [`MERGE_STATE`] as a
/// postcard `Vec<MergeEntry>` per key: the window, and the state window whose namespace
/// holds its contents (Flink's `MergingWindowSet` mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeEntry {
    /// The (merged) window; its timers use its namespace.
    pub window: Window,
    /// The window whose namespace holds the contents.
    pub state: Window,
}

/// A keyed window operator (design §9.1): see the [module docs](super) for semantics and
/// state layout. Plugins hold one and forward `process` and `on_timers` to it; it keeps
/// nothing but scratch buffers between calls.
pub struct WindowOperator<F: WindowFunction> {
    spec: WindowSpec,
    function: F,
    merge: Option<ValueState<Vec<MergeEntry>>>,
    windows: Vec<Window>,
    /// Whether the accumulator cache is on ([`Self::cached`]).
    cache: bool,
    /// Whether [`ACC_STATE`] has a TTL (`state_ttl_ms`), which keeps the cache off.
    acc_ttl: bool,
}

impl<F: WindowFunction + std::fmt::Debug> std::fmt::Debug for WindowOperator<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowOperator")
            .field("spec", &self.spec)
            .field("function", &self.function)
            .field("cache", &self.cache)
            .finish()
    }
}

/// A hash map with the guest's Fx hasher ([`crate::hash`]: no random state in a wasm
/// guest, SipHash was a visible cost of per-batch grouping, foldhash's 128-bit multiply
/// a libcall on wasm32).
type FastMap<K, V> = crate::hash::FxHashMap<K, V>;

/// Dense ids of the windows one batch touches: a linear scan while they are few (the
/// common case: a batch spans a few slides), a hash map beyond.
#[derive(Default)]
struct WindowIds {
    list: Vec<Window>,
    map: FastMap<Window, usize>,
}

impl WindowIds {
    const LINEAR: usize = 16;

    /// The id of `w`, assigning the next one if new.
    fn id(&mut self, w: Window) -> usize {
        if self.list.len() <= Self::LINEAR {
            if let Some(i) = self.list.iter().position(|x| *x == w) {
                return i;
            }
        } else if let Some(&i) = self.map.get(&w) {
            return i;
        }
        let id = self.list.len();
        self.list.push(w);
        if self.list.len() > Self::LINEAR {
            if self.map.is_empty() {
                self.map
                    .extend(self.list.iter().enumerate().map(|(i, w)| (*w, i)));
            } else {
                self.map.insert(w, id);
            }
        }
        id
    }

    /// (window, id) in ascending window order.
    fn sorted(&self) -> Vec<(Window, usize)> {
        let mut v: Vec<(Window, usize)> = self.list.iter().copied().zip(0..).collect();
        v.sort_unstable();
        v
    }
}

/// A deferred timer change of the session path.
enum TimerOp {
    Register(u32, Window, i64),
    Delete(u32, Window, i64),
}

/// A session window of one key while a batch is processed.
struct Live {
    entry: MergeEntry,
    touched: bool,
}

impl<F: WindowFunction> WindowOperator<F> {
    /// Opens the operator: validates `spec` (its `function` is set from `function`) and
    /// opens the states (see [`super::state_descriptors`]).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an invalid spec; [`crate::ErrorCode::State`]
    /// for an undeclared state.
    pub fn open(ctx: &mut dyn Context, mut spec: WindowSpec, mut function: F) -> Result<Self> {
        spec.function = function.kind();
        spec.validate().map_err(PluginError::invalid_config)?;
        function.open(ctx)?;
        let merge = if spec.assigner.is_merging() {
            Some(ValueState::open(ctx, MERGE_STATE)?)
        } else {
            None
        };
        let acc_ttl = ctx
            .open_state(ACC_STATE)
            .is_ok_and(|h| ctx.state_ttl_ms(h).is_some());
        Ok(WindowOperator {
            spec,
            function,
            merge,
            windows: Vec::new(),
            cache: false,
            acc_ttl,
        })
    }

    /// Turns on the accumulator cache where it applies (see "Accumulator cache" in the
    /// [module docs](super)): for an [`super::Aggregating`] function over tumbling or
    /// sliding event-time windows with zero allowed lateness, whose [`ACC_STATE`] has no
    /// TTL (a cached accumulator would reach the host, and start its lifetime, only at the
    /// next checkpoint or firing; docs/operations.md, "State TTL"); elsewhere it changes nothing. The
    /// plugin must then forward `on_watermark` to [`Self::on_watermark`]
    /// and call [`Self::flush`] from `prepare_checkpoint` and `finish`, as
    /// [`crate::window_operator_hooks!`] does: without the flush a checkpoint would miss
    /// the cached contents.
    ///
    /// The cache bounds its entries and key bytes
    /// ([`MAX_CACHED_ENTRIES`](super::MAX_CACHED_ENTRIES),
    /// [`MAX_CACHED_KEY_BYTES`](super::MAX_CACHED_KEY_BYTES)), not the size of each
    /// accumulator: use it for accumulators of bounded size (counts, sums, extrema, a
    /// top-k), not for one that collects its records, which would then live in the
    /// instance's linear memory (limited, 256 MiB by default) instead of host state.
    #[must_use]
    pub fn cached(mut self) -> Self {
        self.cache = self.function.caches()
            && self.spec.is_event_time()
            && !self.spec.assigner.is_merging()
            && self.spec.allowed_lateness_ms == 0
            && !self.acc_ttl;
        self
    }

    /// Whether the accumulator cache is on.
    pub fn is_cached(&self) -> bool {
        self.cache
    }

    /// The spec, with `function` set.
    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }

    /// The window function.
    pub fn function(&self) -> &F {
        &self.function
    }

    fn domain(&self) -> TimeDomain {
        if self.spec.is_event_time() {
            TimeDomain::EventTime
        } else {
            TimeDomain::ProcessingTime
        }
    }

    /// Assigns the records of `batch` to windows, updates their state, registers timers,
    /// fires windows updated after they fired (late firings, into `out`) and sends late
    /// records to the side output [`LATE_OUTPUT`].
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidRecord`] for a record without timestamp in event time or
    /// one the function cannot decode (message prefixed with the record index); then no
    /// state or timer was changed. Errors of the process function on a late firing.
    pub fn process(&mut self, ctx: &mut dyn Context, batch: &Batch, out: &mut Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.spec.is_event_time() && !batch.has_timestamps() {
            return Err(PluginError::invalid_record(
                "record 0 has no timestamp: event-time windows need records timestamped by \
                 the source (or set \"time\": \"processing\")",
            ));
        }
        if self.spec.assigner.is_merging() {
            self.process_sessions(ctx, batch, out)
        } else if self.cache {
            self.process_cached(ctx, batch)
        } else {
            self.process_fixed(ctx, batch, out)
        }
    }

    fn decode(&self, batch: &Batch, i: usize) -> Result<F::Input> {
        let rec = crate::RecordRef {
            data: batch.record(i),
            key: batch.key(i),
            timestamp: batch.timestamp(i),
        };
        self.function
            .decode(rec)
            .map_err(|e| PluginError::new(e.code, format!("record {i}: {}", e.message)))
    }

    fn record_time(&self, batch: &Batch, i: usize, now: i64) -> i64 {
        if self.spec.is_event_time() {
            batch.timestamps[i]
        } else {
            now
        }
    }

    /// Whether `w` has expired: no record may update it any more.
    fn is_expired(&self, w: &Window, watermark: i64) -> bool {
        self.spec.is_event_time() && self.spec.cleanup_time(w) <= watermark
    }

    /// Whether `w` has already fired, so an update fires it again at once.
    fn has_fired(&self, w: &Window, watermark: i64) -> bool {
        self.spec.is_event_time() && w.max_timestamp() <= watermark
    }

    fn emit_late(ctx: &mut dyn Context, batch: &Batch, late: &[u32]) {
        if late.is_empty() {
            return;
        }
        let mut side = Batch::with_capacity(late.len(), 0);
        for &i in late {
            let i = i as usize;
            side.push_record(batch.key(i), batch.timestamp(i), batch.record(i));
        }
        ctx.side_output(LATE_OUTPUT, &side);
    }

    /// Tumbling and sliding windows: records grouped by (window, key); one batched state
    /// access per window namespace and one timer registration per (key, window).
    fn process_fixed(
        &mut self,
        ctx: &mut dyn Context,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let n = batch.len();
        let watermark = ctx.current_watermark();
        let now = ctx.current_processing_time();
        let mut key_ids: FastMap<&[u8], u32> = FastMap::default();
        key_ids.reserve(n);
        let mut keys: Vec<&[u8]> = Vec::new();
        // Per window of the batch, its (key id << 32 | record index) entries: a batch
        // touches few windows, and sorting plain u64s groups records by key cheaply.
        let mut win_ids = WindowIds::default();
        let mut per_window: Vec<Vec<u64>> = Vec::new();
        let mut inputs: Vec<Option<F::Input>> = Vec::with_capacity(n);
        let mut late: Vec<u32> = Vec::new();
        let mut windows = std::mem::take(&mut self.windows);
        for i in 0..n {
            let ts = self.record_time(batch, i, now);
            windows.clear();
            self.spec.assigner.assign(ts, &mut windows);
            let key = batch.key(i).unwrap_or(&[]);
            let kid = *key_ids.entry(key).or_insert_with(|| {
                keys.push(key);
                (keys.len() - 1) as u32
            });
            let mut assigned = false;
            for w in &windows {
                if !self.is_expired(w, watermark) {
                    let wid = win_ids.id(*w);
                    if wid == per_window.len() {
                        per_window.push(Vec::new());
                    }
                    per_window[wid].push((u64::from(kid) << 32) | i as u64);
                    assigned = true;
                }
            }
            if !assigned {
                late.push(i as u32);
                inputs.push(None);
            } else {
                match self.decode(batch, i) {
                    Ok(v) => inputs.push(Some(v)),
                    Err(e) => {
                        self.windows = windows;
                        return Err(e);
                    }
                }
            }
        }
        self.windows = windows;
        let domain = self.domain();
        let mut ranges: Vec<(u32, Range<usize>)> = Vec::new();
        let mut recs: Vec<u32> = Vec::new();
        // Windows in ascending order, keys by first appearance, records in batch order.
        for (w, wid) in win_ids.sorted() {
            let entries = &mut per_window[wid];
            entries.sort_unstable();
            recs.clear();
            recs.extend(entries.iter().map(|&e| e as u32));
            ranges.clear();
            let mut j = 0;
            while j < entries.len() {
                let (k, s) = ((entries[j] >> 32) as u32, j);
                while j < entries.len() && (entries[j] >> 32) as u32 == k {
                    j += 1;
                }
                ranges.push((k, s..j));
            }
            let groups: Vec<KeyGroup<'_>> = ranges
                .iter()
                .map(|(k, r)| KeyGroup {
                    key: keys[*k as usize],
                    records: &recs[r.clone()],
                })
                .collect();
            let ns = w.namespace();
            self.function.add(ctx, &ns, &groups, &inputs, batch);
            let max = w.max_timestamp();
            let cleanup = self.spec.cleanup_time(&w);
            let fired = self.has_fired(&w, watermark);
            if fired {
                for g in &groups {
                    self.function.fire(ctx, g.key, w, &ns, out)?;
                }
            }
            // One host call per timer time for all keys of the window.
            let group_keys: Vec<&[u8]> = groups.iter().map(|g| g.key).collect();
            if !fired {
                ctx.register_timers_for_keys(domain, &ns, max, &group_keys);
            }
            if cleanup != max {
                ctx.register_timers_for_keys(domain, &ns, cleanup, &group_keys);
            }
        }
        Self::emit_late(ctx, batch, &late);
        Ok(())
    }

    /// Tumbling and sliding windows with the accumulator cache: every record is assigned
    /// and decoded first (an undecodable one changes nothing), then folded into the
    /// cached contents of its unexpired windows; no state access or timer. The cache is
    /// flushed when full.
    fn process_cached(&mut self, ctx: &mut dyn Context, batch: &Batch) -> Result<()> {
        let n = batch.len();
        let watermark = ctx.current_watermark();
        // Per record: its decoded input (`None`: late) and its unexpired windows, the
        // latter flat in `windows` with `window_ends`.
        let mut inputs: Vec<Option<F::Input>> = Vec::with_capacity(n);
        let mut windows = std::mem::take(&mut self.windows);
        windows.clear();
        let mut window_ends: Vec<u32> = Vec::with_capacity(n);
        let mut late: Vec<u32> = Vec::new();
        for i in 0..n {
            let start = windows.len();
            self.spec.assigner.assign(batch.timestamps[i], &mut windows);
            let mut kept = start;
            for j in start..windows.len() {
                if !self.is_expired(&windows[j], watermark) {
                    windows[kept] = windows[j];
                    kept += 1;
                }
            }
            windows.truncate(kept);
            window_ends.push(kept as u32);
            if kept == start {
                late.push(i as u32);
                inputs.push(None);
                continue;
            }
            match self.decode(batch, i) {
                Ok(v) => inputs.push(Some(v)),
                Err(e) => {
                    self.windows = windows;
                    return Err(e);
                }
            }
        }
        let mut start = 0;
        for (i, (input, &end)) in inputs.iter().zip(&window_ends).enumerate() {
            let end = end as usize;
            if let Some(input) = input {
                let key = batch.key(i).unwrap_or(&[]);
                self.function.cache_add(&windows[start..end], key, input);
            }
            start = end;
        }
        self.windows = windows;
        Self::emit_late(ctx, batch, &late);
        if self.function.cache_full() {
            self.function.flush_cache(ctx);
        }
        Ok(())
    }

    /// Fires, in window order, every cached window whose max timestamp is below `below`
    /// (none of their keys has a due host timer: a flushed key's timer would have come
    /// in an earlier group).
    fn fire_cached_below(
        &mut self,
        ctx: &mut dyn Context,
        below: i64,
        out: &mut Batch,
    ) -> Result<()> {
        while let Some(w) = self.function.first_cached() {
            if w.max_timestamp() >= below {
                break;
            }
            self.function
                .fire_cached(ctx, &[], &[], w, &w.namespace(), out)?;
        }
        Ok(())
    }

    /// The watermark advanced to `watermark` (after [`Self::on_timers`] got the due
    /// timers): with the accumulator cache, fires every cached window whose max timestamp
    /// it reached, in window order, keys ascending. Without it, nothing.
    ///
    /// # Errors
    /// Errors of the process function.
    pub fn on_watermark(
        &mut self,
        ctx: &mut dyn Context,
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        if self.cache {
            self.fire_cached_below(ctx, watermark.saturating_add(1), out)?;
        }
        Ok(())
    }

    /// Writes the accumulator cache to state and registers its timers, so that state and
    /// timers are exact: call it from `prepare_checkpoint` and `finish`. Emits nothing
    /// into `out` (the shape of [`crate::cep::CepOperator::flush`]). Without the cache,
    /// nothing.
    ///
    /// # Errors
    /// None today; the `Result` keeps the hooks of window and CEP plugins alike.
    pub fn flush(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = out;
        if self.cache {
            self.function.flush_cache(ctx);
        }
        Ok(())
    }

    /// Session windows: per key, the merge set is loaded (one batched get for the batch),
    /// updated in memory record by record, and written back (one batched put); state
    /// merges, adds and timer changes are applied after every record decoded.
    fn process_sessions(
        &mut self,
        ctx: &mut dyn Context,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let n = batch.len();
        let watermark = ctx.current_watermark();
        let now = ctx.current_processing_time();
        let merge_state = self
            .merge
            .as_ref()
            .expect("session operator opens its merge state");
        let mut key_ids: FastMap<&[u8], u32> = FastMap::default();
        let mut keys: Vec<&[u8]> = Vec::new();
        let mut by_key: Vec<Vec<u32>> = Vec::new();
        for i in 0..n {
            let key = batch.key(i).unwrap_or(&[]);
            let kid = *key_ids.entry(key).or_insert_with(|| {
                keys.push(key);
                by_key.push(Vec::new());
                (keys.len() - 1) as u32
            });
            by_key[kid as usize].push(i as u32);
        }
        let stored = merge_state.get_many(ctx, &keys);
        let mut sets: Vec<Vec<Live>> = stored
            .into_iter()
            .map(|s| {
                s.unwrap_or_default()
                    .into_iter()
                    .map(|entry| Live {
                        entry,
                        touched: false,
                    })
                    .collect()
            })
            .collect();

        let mut inputs: Vec<Option<F::Input>> = (0..n).map(|_| None).collect();
        let mut late: Vec<u32> = Vec::new();
        let mut merges: Vec<(u32, Window, Window)> = Vec::new(); // (key, target, source)
        let mut adds: Vec<(u32, Window, u32)> = Vec::new(); // (key, state window, record)
        let mut timers: Vec<TimerOp> = Vec::new();
        let mut windows = Vec::with_capacity(1);
        for (kid, recs) in by_key.iter().enumerate() {
            let kid32 = kid as u32;
            let set = &mut sets[kid];
            for &r in recs {
                let ts = self.record_time(batch, r as usize, now);
                windows.clear();
                self.spec.assigner.assign(ts, &mut windows);
                let w = windows[0];
                let overlapping: Vec<usize> = (0..set.len())
                    .filter(|&e| set[e].entry.window.overlaps(&w))
                    .collect();
                let state = if overlapping.is_empty() {
                    if self.is_expired(&w, watermark) {
                        late.push(r);
                        continue;
                    }
                    set.push(Live {
                        entry: MergeEntry {
                            window: w,
                            state: w,
                        },
                        touched: true,
                    });
                    self.schedule(&mut timers, kid32, w, watermark);
                    w
                } else {
                    let merged = overlapping
                        .iter()
                        .fold(w, |acc, &e| acc.cover(&set[e].entry.window));
                    let first = set[overlapping[0]].entry;
                    if overlapping.len() == 1 && first.window == merged {
                        set[overlapping[0]].touched = true;
                    } else {
                        for &e in &overlapping {
                            let old = set[e].entry;
                            if e != overlapping[0] {
                                merges.push((kid32, first.state, old.state));
                            }
                            self.unschedule(&mut timers, kid32, old.window);
                        }
                        for &e in overlapping.iter().rev() {
                            set.swap_remove(e);
                        }
                        set.push(Live {
                            entry: MergeEntry {
                                window: merged,
                                state: first.state,
                            },
                            touched: true,
                        });
                        self.schedule(&mut timers, kid32, merged, watermark);
                    }
                    first.state
                };
                adds.push((kid32, state, r));
                inputs[r as usize] = Some(self.decode(batch, r as usize)?);
            }
        }

        // Apply: timers, merges (in order), adds (resolved through the merges), firings.
        let domain = self.domain();
        for op in timers {
            match op {
                TimerOp::Register(k, w, ts) => {
                    ctx.register_timer(domain, keys[k as usize], &w.namespace(), ts);
                }
                TimerOp::Delete(k, w, ts) => {
                    ctx.delete_timer(domain, keys[k as usize], &w.namespace(), ts);
                }
            }
        }
        let mut redirect: FastMap<(u32, Window), Window> = FastMap::default();
        for &(k, target, source) in &merges {
            self.function.merge(
                ctx,
                keys[k as usize],
                &target.namespace(),
                &source.namespace(),
            );
            redirect.insert((k, source), target);
        }
        for add in &mut adds {
            while let Some(&t) = redirect.get(&(add.0, add.1)) {
                add.1 = t;
            }
        }
        adds.sort_by_key(|&(k, w, r)| (w, k, r));
        let recs: Vec<u32> = adds.iter().map(|a| a.2).collect();
        let mut i = 0;
        while i < adds.len() {
            let w = adds[i].1;
            let mut groups: Vec<KeyGroup<'_>> = Vec::new();
            let mut j = i;
            while j < adds.len() && adds[j].1 == w {
                let (k, s) = (adds[j].0, j);
                while j < adds.len() && adds[j].1 == w && adds[j].0 == k {
                    j += 1;
                }
                groups.push(KeyGroup {
                    key: keys[k as usize],
                    records: &recs[s..j],
                });
            }
            self.function
                .add(ctx, &w.namespace(), &groups, &inputs, batch);
            i = j;
        }
        let mut puts: Vec<(&[u8], Vec<MergeEntry>)> = Vec::new();
        for (kid, set) in sets.into_iter().enumerate() {
            let key = keys[kid];
            if set.iter().all(|l| !l.touched) {
                continue;
            }
            for l in &set {
                if l.touched && self.has_fired(&l.entry.window, watermark) {
                    let ns = l.entry.state.namespace();
                    self.function.fire(ctx, key, l.entry.window, &ns, out)?;
                }
            }
            puts.push((key, set.into_iter().map(|l| l.entry).collect()));
        }
        merge_state.put_many(ctx, &puts);
        Self::emit_late(ctx, batch, &late);
        Ok(())
    }

    /// Timers for a new or grown window: fire at max timestamp unless already fired (then
    /// the caller's late firing covers it), cleanup at `max + allowed lateness`.
    fn schedule(&self, timers: &mut Vec<TimerOp>, key: u32, w: Window, watermark: i64) {
        let max = w.max_timestamp();
        if !self.has_fired(&w, watermark) {
            timers.push(TimerOp::Register(key, w, max));
        }
        let cleanup = self.spec.cleanup_time(&w);
        if cleanup != max {
            timers.push(TimerOp::Register(key, w, cleanup));
        }
    }

    fn unschedule(&self, timers: &mut Vec<TimerOp>, key: u32, w: Window) {
        let max = w.max_timestamp();
        timers.push(TimerOp::Delete(key, w, max));
        let cleanup = self.spec.cleanup_time(&w);
        if cleanup != max {
            timers.push(TimerOp::Delete(key, w, cleanup));
        }
    }

    /// Handles due timers (in the order given): a timer at a window's max timestamp fires
    /// it; one at its cleanup time clears its contents and merge-set entry. Timers of the
    /// other time domain, with a foreign namespace or of a window no longer in the merge
    /// set are ignored. A group of tumbling or sliding windows is fired with one batched
    /// state read and cleared with one batched delete.
    ///
    /// # Errors
    /// Errors of the process function.
    pub fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let domain = self.domain();
        for g in timers {
            if g.domain != domain {
                continue;
            }
            let Some(w) = Window::from_namespace(&g.namespace) else {
                continue;
            };
            let max = w.max_timestamp();
            let cleanup = self.spec.cleanup_time(&w);
            if let Some(merge_state) = &self.merge {
                for key in g.iter_keys() {
                    let mut set = merge_state.get(ctx, key).unwrap_or_default();
                    let Some(pos) = set.iter().position(|e| e.window == w) else {
                        continue;
                    };
                    let ns = set[pos].state.namespace();
                    if g.timestamp == max {
                        self.function.fire(ctx, key, w, &ns, out)?;
                    }
                    if g.timestamp == cleanup {
                        self.function.clear(ctx, key, &ns);
                        set.swap_remove(pos);
                        if set.is_empty() {
                            merge_state.delete(ctx, key);
                        } else {
                            merge_state.put(ctx, key, &set);
                        }
                    }
                }
            } else {
                let ns = w.namespace();
                if self.cache {
                    // Cached windows due before this group fire first, as their host
                    // timers would have.
                    self.fire_cached_below(ctx, g.timestamp, out)?;
                }
                if g.timestamp == max && self.cache {
                    self.function
                        .fire_cached(ctx, &g.keys, &g.key_ends, w, &ns, out)?;
                } else if g.timestamp == max {
                    self.function
                        .fire_many(ctx, &g.keys, &g.key_ends, w, &ns, out)?;
                }
                if g.timestamp == cleanup {
                    self.function.clear_many(ctx, &g.keys, &g.key_ends, &ns);
                }
            }
        }
        Ok(())
    }
}
