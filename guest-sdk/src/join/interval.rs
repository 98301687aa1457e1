//! [`IntervalJoin`]: pairs whose timestamps lie within bounds of each other, state freed
//! by the watermark.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::{JOIN_STATE_SCHEMA, JoinOutput, JoinType, Row, Side, emit_late, group_by_key, max_ts};
use smallvec::SmallVec;

use crate::hash::FxHashMap;
use crate::{
    Batch, Context, PluginError, Result, StateDescriptor, TimeDomain, TimerGroup, ValueState,
};

/// Value state of the left rows: a postcard `Vec<IntervalLeftRow<Acc>>` per key.
pub const INTERVAL_LEFT_STATE: &str = "interval-left";
/// Value state of the right rows: a postcard `Vec<IntervalRightRow>` per key.
pub const INTERVAL_RIGHT_STATE: &str = "interval-right";

/// The time of the timer that frees a row expiring at `expiry`: exactly then if its
/// expiry may emit, else the next multiple of [`CLEANUP_GRANULARITY_MS`].
fn timer_at(expiry: i64, exact: bool) -> i64 {
    if exact {
        expiry
    } else {
        expiry
            .div_euclid(CLEANUP_GRANULARITY_MS)
            .saturating_add(1)
            .saturating_mul(CLEANUP_GRANULARITY_MS)
            .saturating_sub(1)
            .max(expiry)
    }
}

/// A key's rows to write back.
type KeyRows<'k, R> = (&'k [u8], R);

/// One key's right rows in memory: the first held inline, since a key often has one (q7
/// keys bids by price), saving an allocation, a free and a cache miss per such key.
/// Encoded exactly as `Vec<IntervalRightRow>` (a postcard sequence), the declared state
/// type.
type RightRows = SmallVec<[IntervalRightRow; 1]>;

/// One stored left row of an [`IntervalJoin`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalLeftRow<A> {
    /// The record timestamp.
    pub timestamp: i64,
    /// The last right timestamp it joins (inclusive): when the watermark reaches it, the
    /// row expires.
    pub upper: i64,
    /// Whether it joined at least one right row.
    pub matched: bool,
    /// The function's accumulator for this row ([`IntervalJoinFunction::Acc`]).
    pub acc: A,
    /// The record payload.
    pub data: Vec<u8>,
}

/// One stored right row of an [`IntervalJoin`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalRightRow {
    /// The record timestamp.
    pub timestamp: i64,
    /// Whether it joined at least one left row.
    pub matched: bool,
    /// The record payload.
    pub data: Vec<u8>,
}

/// What an [`IntervalJoin`] computes.
///
/// # Semantics
///
/// A left row at `l` joins a right row at `r` of the same key when
/// `l + lower <= r <= upper(l)` (both ends inclusive), where `upper(l)` is
/// [`Self::upper_bound`] (default `l + upper`) and [`Self::matches`] holds. Each such pair
/// is joined once, through [`Self::join`], when the later of the two rows arrives.
///
/// A left row expires when the watermark reaches `upper(l)`: no right row that can
/// still arrive without being late can join it any more. [`Self::left_expired`] then sees
/// it with its accumulator and whether it matched: by default it emits the row padded
/// ([`Self::left_only`]) in a left or full join if it never matched. A right row expires
/// when the watermark reaches `r - lower`, and is emitted padded ([`Self::right_only`]) in
/// a right or full join if it never matched. A row whose expiry time is already behind
/// the watermark when it arrives expires at once (after joining what is stored).
///
/// Records with `timestamp <= watermark` when they arrive are late: they go unchanged to
/// the side output [`super::LATE_OUTPUT`], join nothing and are never emitted padded.
pub trait IntervalJoinFunction {
    /// A value kept with every left row, updated by [`Self::join`] and handed to
    /// [`Self::left_expired`] (e.g. the best right row so far, for a top-1 per left row);
    /// `()` when unused. It must be folded order-insensitively (max, count, sum, a
    /// tie-broken best), since pairs join in arrival order. Bump the plugin's
    /// accumulator schema version when its type changes.
    type Acc: Serialize + DeserializeOwned + Default;

    /// Whether [`Self::left_expired`] may emit for an inner or right join (it always
    /// may for a left or full join): then every left row gets a timer at its exact
    /// expiry, so what it emits is stamped and sent before the watermark passes it.
    /// Otherwise rows are freed by coarser cleanup timers
    /// ([`CLEANUP_GRANULARITY_MS`]). Default `false`.
    const EMITS_ON_LEFT_EXPIRY: bool = false;

    /// The last right timestamp (inclusive) a left row at `left.timestamp` joins; must be
    /// a pure function of the row. `default` is `timestamp + upper` of the spec. Use it
    /// for bounds carried by the row (Nexmark's `expires`).
    fn upper_bound(&self, key: &[u8], left: Row<'_>, default: i64) -> i64 {
        let _ = (key, left);
        default
    }

    /// An extra join condition on a pair within the bounds; default: every pair.
    fn matches(&self, key: &[u8], left: Row<'_>, right: Row<'_>) -> bool {
        let _ = (key, left, right);
        true
    }

    /// Joins a matching pair: emits into `out` and/or folds into the left row's `acc`.
    ///
    /// # Errors
    /// A pair it cannot join (an undecodable payload): the batch fails.
    fn join(
        &mut self,
        key: &[u8],
        left: Row<'_>,
        acc: &mut Self::Acc,
        right: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()>;

    /// A left row expired (module docs of [`IntervalJoinFunction`]). Default: in a left
    /// or full join, [`Self::left_only`] if it never matched.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn left_expired(
        &mut self,
        key: &[u8],
        left: Row<'_>,
        acc: Self::Acc,
        matched: bool,
        join_type: JoinType,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        let _ = acc;
        if join_type.keeps_left() && !matched {
            self.left_only(key, left, out)?;
        }
        Ok(())
    }

    /// Emits a left row that never matched. Default: nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn left_only(&mut self, key: &[u8], left: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        let _ = (key, left, out);
        Ok(())
    }

    /// Emits a right row that never matched. Default: nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn right_only(&mut self, key: &[u8], right: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        let _ = (key, right, out);
        Ok(())
    }
}

/// The definition of an [`IntervalJoin`]: right rows join left rows at `l` when within
/// `[l + lower_ms, l + upper_ms]` (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IntervalJoinSpec {
    /// Offset of the earliest right timestamp from the left one (ms; may be negative).
    /// Also the bound right rows are kept for: a right row expires when the watermark
    /// reaches `r - lower_ms`.
    pub lower_ms: i64,
    /// Offset of the latest right timestamp (ms, >= `lower_ms`), unless the function's
    /// [`IntervalJoinFunction::upper_bound`] says otherwise.
    pub upper_ms: i64,
    /// Inner or outer.
    pub join_type: JoinType,
    /// The plugin's promise that the left side has at most one row per key (a primary
    /// key, as an auction id): then a right row that found its key's left row is not
    /// stored (no other left row can come for it), unless the join type keeps
    /// unmatched right rows. Default `false`.
    pub left_unique: bool,
}

/// Granularity (ms of event time) of the timers that only free rows: a row whose expiry
/// emits nothing is removed by the first cleanup timer at a multiple of this at or after
/// its expiry. Keeping an expired row a little longer changes no result (its bound
/// excludes every record that can still arrive without being late), and one timer per
/// key and second replaces one per key and millisecond.
pub const CLEANUP_GRANULARITY_MS: i64 = 1000;

/// Default bound of an [`IntervalJoin::cached`] row cache, in bytes of guest memory
/// (payloads, keys and a fixed per-row and per-key overhead, estimated): past it, after a
/// batch or a timer firing, the cache is written back to state and emptied. 64 MiB, a
/// quarter of an instance's default linear-memory limit (256 MiB).
pub const MAX_CACHED_ROW_BYTES: usize = 64 << 20;

/// Estimated guest bytes of a cached row besides its payload (the row struct, the
/// payload's allocation header, the vector slot).
const ROW_OVERHEAD: usize = 64;
/// Estimated guest bytes of a cached key besides its bytes (the map slot, two vectors).
const KEY_OVERHEAD: usize = 96;
/// Key bytes a cache entry holds inline (an `i64` or a UUID key fits).
const INLINE_KEY: usize = 16;

impl IntervalJoinSpec {
    /// An inner interval join within `[l + lower_ms, l + upper_ms]`.
    pub const fn between(lower_ms: i64, upper_ms: i64) -> Self {
        IntervalJoinSpec {
            lower_ms,
            upper_ms,
            join_type: JoinType::Inner,
            left_unique: false,
        }
    }

    /// The same spec with the left side promised unique per key (see
    /// [`Self::left_unique`]).
    pub const fn with_unique_left(mut self) -> Self {
        self.left_unique = true;
        self
    }

    /// The same bounds with another join type.
    pub const fn with_type(mut self, join_type: JoinType) -> Self {
        self.join_type = join_type;
        self
    }

    /// Checks the bounds.
    ///
    /// # Errors
    /// A message naming `lower_ms` and `upper_ms` when `lower_ms > upper_ms`.
    pub fn validate(&self) -> Result<(), String> {
        if self.lower_ms > self.upper_ms {
            return Err(format!(
                "join.lower_ms ({}) must not exceed join.upper_ms ({})",
                self.lower_ms, self.upper_ms
            ));
        }
        Ok(())
    }

    /// The model JSON, fixed field order:
    /// `{"operator":"interval-join","type":…,"lower_ms":…,"upper_ms":…,"left_unique":…}`.
    pub fn to_model_json(&self) -> String {
        format!(
            r#"{{"operator":"interval-join","type":"{}","lower_ms":{},"upper_ms":{},"left_unique":{}}}"#,
            self.join_type.as_str(),
            self.lower_ms,
            self.upper_ms,
            self.left_unique
        )
    }

    /// The states an [`IntervalJoin`] with accumulator `A` opens, to declare in
    /// `describe()`: [`INTERVAL_LEFT_STATE`] at `acc_schema_version` (bump it when `A`
    /// changes) and [`INTERVAL_RIGHT_STATE`].
    pub fn state_descriptors<A: Serialize + DeserializeOwned>(
        acc_schema_version: u32,
    ) -> Vec<StateDescriptor> {
        vec![
            ValueState::<Vec<IntervalLeftRow<A>>>::descriptor(
                INTERVAL_LEFT_STATE,
                acc_schema_version,
            ),
            ValueState::<Vec<IntervalRightRow>>::descriptor(
                INTERVAL_RIGHT_STATE,
                JOIN_STATE_SCHEMA,
            ),
        ]
    }
}

/// An event-time interval join of two keyed inputs: see [`IntervalJoinFunction`] for
/// what it emits and when, and the [module docs](super) for determinism.
///
/// # State and timers
///
/// Per key and side one value, a postcard `Vec` of rows ([`INTERVAL_LEFT_STATE`],
/// [`INTERVAL_RIGHT_STATE`]): one batched read of both sides and one batched write per
/// batch. Event-time timers per (key, side) at each row's expiry time, in the side's
/// namespace ([`Side::namespace`]); a firing removes the key's rows of that side that
/// expired. So state holds the rows of roughly `upper - lower` plus the watermark's lag
/// of event time.
///
/// # Row cache
///
/// Without it (the default) every batch reads the rows of each key it touches, decodes
/// them, and encodes and writes back the whole list of each key it changed, and so does
/// every expiry timer: a key with many live rows costs that many rows per touch (Nexmark
/// q7 keeps 10 s of bids per price). With [`Self::cached`] the instance keeps the rows of
/// the keys it has read decoded in memory between checkpoints, works on that copy, and
/// writes each changed key back once, in [`Self::flush`], which the plugin must call from
/// `prepare_checkpoint` and `finish` (so host state is exact at every barrier; the
/// runtime restores only from checkpoints and drops the instance when a task fails, so a
/// copy half-changed by a failing batch is never written). Timers stay host timers,
/// registered as without the cache. A key whose rows are all gone leaves the cache at once
/// when state holds nothing of it (its rows came and went between two write-backs, which
/// then never write or delete it), else at the next flush, which deletes it. The cache is
/// bounded by [`MAX_CACHED_ROW_BYTES`] (or [`Self::cached_with_limit`]): past it, it is written back
/// and emptied between checkpoints too. The state layout is the same with and without
/// it, so savepoints restore across the switch. As with the CEP operator's cache, a
/// job-level state TTL (`state_ttl_ms`) on these states expires a key only after the
/// instance has dropped it from its cache; the watermark frees rows either way.
pub struct IntervalJoin<F: IntervalJoinFunction> {
    spec: IntervalJoinSpec,
    function: F,
    left: ValueState<Vec<IntervalLeftRow<F::Acc>>>,
    right: ValueState<RightRows>,
    cache: Option<RowCache<F::Acc>>,
}

/// One key's rows of both sides, decoded, whether each side changed since it was last
/// written to state, and whether state holds a value of the side for the key.
struct CachedRows<A> {
    left: Vec<IntervalLeftRow<A>>,
    right: RightRows,
    left_dirty: bool,
    right_dirty: bool,
    /// State holds a left value for the key (read from it, or written at a write-back):
    /// emptying the side must delete it.
    left_stored: bool,
    /// As `left_stored`, for the right side.
    right_stored: bool,
}

impl<A> CachedRows<A> {
    /// No rows, and nothing in state to delete: the entry can leave the cache at once
    /// (a later touch of the key reads state and finds nothing, as it should). A key
    /// whose rows came and went between two write-backs never reaches state.
    fn removable(&self) -> bool {
        self.left.is_empty() && self.right.is_empty() && !self.left_stored && !self.right_stored
    }
}

/// The row cache of an [`IntervalJoin::cached`] join.
struct RowCache<A> {
    /// Keys of up to [`INLINE_KEY`] bytes are stored inline: a lookup compares them
    /// without following a pointer.
    rows: FxHashMap<SmallVec<[u8; INLINE_KEY]>, CachedRows<A>>,
    /// Estimated guest bytes held ([`ROW_OVERHEAD`], [`KEY_OVERHEAD`]).
    bytes: usize,
    max_bytes: usize,
}

/// Estimated guest bytes of a cached row with payload `data`.
fn row_bytes(data: &[u8]) -> usize {
    data.len() + ROW_OVERHEAD
}

/// Writes one side's changed keys: non-empty row lists are stored, emptied ones
/// deleted (one host call each).
fn write_back_side<'a, T, C>(
    ctx: &mut dyn Context,
    state: &ValueState<C>,
    changed: impl Iterator<Item = (&'a [u8], &'a C)> + Clone,
) where
    C: Serialize + DeserializeOwned + std::ops::Deref<Target = [T]> + 'a,
{
    let state = state.in_namespace(&[]);
    state.put_many_refs(ctx, changed.clone().filter(|(_, rows)| !rows.is_empty()));
    let (mut keys, mut ends) = (Vec::new(), Vec::new());
    for (k, _) in changed.filter(|(_, rows)| rows.is_empty()) {
        keys.extend_from_slice(k);
        ends.push(keys.len() as u32);
    }
    state.delete_many_flat(ctx, &keys, &ends);
}

impl<A> RowCache<A> {
    /// Runs `f` on the rows of each key of `keys`, in place for the cached ones (one map
    /// lookup each); the others are read from state (one batched read per side), run,
    /// and cached. `f` gets the key's index in `keys` and returns the estimated bytes it
    /// added and freed.
    fn for_each<'k>(
        &mut self,
        ctx: &mut dyn Context,
        left: &ValueState<Vec<IntervalLeftRow<A>>>,
        right: &ValueState<RightRows>,
        keys: &[&'k [u8]],
        mut f: impl FnMut(usize, &'k [u8], &mut CachedRows<A>) -> Result<(usize, usize)>,
    ) -> Result<()>
    where
        A: Serialize + DeserializeOwned,
    {
        let mut misses: Vec<usize> = Vec::new();
        for (n, key) in keys.iter().enumerate() {
            match self.rows.get_mut(*key) {
                Some(e) => {
                    let (added, freed) = f(n, key, e)?;
                    self.bytes = (self.bytes + added).saturating_sub(freed);
                    if e.removable() {
                        self.rows.remove(*key);
                        self.bytes = self.bytes.saturating_sub(key.len() + KEY_OVERHEAD);
                    }
                }
                None => misses.push(n),
            }
        }
        if misses.is_empty() {
            return Ok(());
        }
        let missing: Vec<&[u8]> = misses.iter().map(|&n| keys[n]).collect();
        let lefts = left.get_many(ctx, &missing);
        let rights = right.get_many(ctx, &missing);
        for ((n, l), r) in misses.into_iter().zip(lefts).zip(rights) {
            let key = keys[n];
            let mut e = CachedRows {
                left_stored: l.is_some(),
                right_stored: r.is_some(),
                left: l.unwrap_or_default(),
                right: r.unwrap_or_default(),
                left_dirty: false,
                right_dirty: false,
            };
            let rows_bytes = e.left.iter().map(|r| row_bytes(&r.data)).sum::<usize>()
                + e.right.iter().map(|r| row_bytes(&r.data)).sum::<usize>();
            let (added, freed) = f(n, key, &mut e)?;
            if !e.removable() {
                self.bytes = (self.bytes + key.len() + KEY_OVERHEAD + rows_bytes + added)
                    .saturating_sub(freed);
                self.rows.insert(SmallVec::from_slice(key), e);
            }
        }
        Ok(())
    }

    /// Writes every changed key back: non-empty lists are stored, emptied ones deleted
    /// (only where state holds them).
    fn write_back(
        &mut self,
        ctx: &mut dyn Context,
        left: &ValueState<Vec<IntervalLeftRow<A>>>,
        right: &ValueState<RightRows>,
    ) where
        A: Serialize + DeserializeOwned,
    {
        write_back_side(
            ctx,
            left,
            self.rows
                .iter()
                .filter(|(_, e)| e.left_dirty && (e.left_stored || !e.left.is_empty()))
                .map(|(k, e)| (k.as_slice(), &e.left)),
        );
        write_back_side(
            ctx,
            right,
            self.rows
                .iter()
                .filter(|(_, e)| e.right_dirty && (e.right_stored || !e.right.is_empty()))
                .map(|(k, e)| (k.as_slice(), &e.right)),
        );
        for e in self.rows.values_mut() {
            if e.left_dirty {
                e.left_stored = !e.left.is_empty();
                e.left_dirty = false;
            }
            if e.right_dirty {
                e.right_stored = !e.right.is_empty();
                e.right_dirty = false;
            }
        }
    }

    /// Past the bound: writes back and empties the cache.
    fn bound(
        &mut self,
        ctx: &mut dyn Context,
        left: &ValueState<Vec<IntervalLeftRow<A>>>,
        right: &ValueState<RightRows>,
    ) where
        A: Serialize + DeserializeOwned,
    {
        if self.bytes > self.max_bytes {
            self.write_back(ctx, left, right);
            self.rows.clear();
            self.bytes = 0;
        }
    }
}

impl<F: IntervalJoinFunction> std::fmt::Debug for IntervalJoin<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntervalJoin")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl<F: IntervalJoinFunction> IntervalJoin<F> {
    /// Opens the join: validates `spec` and opens its states
    /// ([`IntervalJoinSpec::state_descriptors`]).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an invalid spec;
    /// [`crate::ErrorCode::State`] for an undeclared state.
    pub fn open(ctx: &mut dyn Context, spec: IntervalJoinSpec, function: F) -> Result<Self> {
        spec.validate().map_err(PluginError::invalid_config)?;
        Ok(IntervalJoin {
            spec,
            function,
            left: ValueState::open(ctx, INTERVAL_LEFT_STATE)?,
            right: ValueState::open(ctx, INTERVAL_RIGHT_STATE)?,
            cache: None,
        })
    }

    /// Turns on the row cache (see "Row cache" above), bounded by
    /// [`MAX_CACHED_ROW_BYTES`]. The plugin must then call [`Self::flush`] from
    /// `prepare_checkpoint` and `finish`, as [`crate::join_operator_hooks!`] does:
    /// without the flush a checkpoint would miss the cached changes.
    #[must_use]
    pub fn cached(self) -> Self {
        self.cached_with_limit(MAX_CACHED_ROW_BYTES)
    }

    /// [`Self::cached`] with another bound, in estimated guest bytes (0 writes the
    /// cache back after every batch and timer firing, which only tests want).
    #[must_use]
    pub fn cached_with_limit(mut self, max_bytes: usize) -> Self {
        self.cache = Some(RowCache {
            rows: FxHashMap::default(),
            bytes: 0,
            max_bytes,
        });
        self
    }

    /// Writes the row cache's changes to state, so that state is exact: call it from
    /// `prepare_checkpoint` and `finish`. Emits nothing into `out` (the shape of the
    /// window and CEP operators' `flush`). Without the cache, nothing.
    ///
    /// # Errors
    /// None today; the `Result` keeps the hooks of the operator families alike.
    pub fn flush(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = out;
        if let Some(cache) = &mut self.cache {
            cache.write_back(ctx, &self.left, &self.right);
            // Keys left with no rows (their deletes now written) are dropped here, not
            // kept for a next touch that may never come.
            cache.rows.retain(|k, e| {
                let keep = !e.removable();
                if !keep {
                    cache.bytes = cache.bytes.saturating_sub(k.len() + KEY_OVERHEAD);
                }
                keep
            });
            cache.bound(ctx, &self.left, &self.right);
        }
        Ok(())
    }

    /// The spec.
    pub fn spec(&self) -> &IntervalJoinSpec {
        &self.spec
    }

    /// The join function.
    pub fn function(&self) -> &F {
        &self.function
    }

    /// Joins a batch of input `input` (0 left, 1 right) against the other side's stored
    /// rows, emitting pairs into `out`; stores its rows until they expire; sends late
    /// records to [`super::LATE_OUTPUT`].
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for another input
    /// ([`super::Side::of_input`]); [`crate::ErrorCode::InvalidRecord`] for a record
    /// without timestamp; errors of the join function (then no state was written; with the row
    /// cache, the cached copy may be half-changed, and the instance must be dropped, as
    /// the runtime does when a task fails).
    pub fn process(
        &mut self,
        ctx: &mut dyn Context,
        input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let side = Side::of_input(input)?;
        if batch.is_empty() {
            return Ok(());
        }
        if !batch.has_timestamps() {
            return Err(PluginError::invalid_record(
                "record 0 has no timestamp: an interval join needs records timestamped by \
                 the source",
            ));
        }
        let watermark = ctx.current_watermark();
        let (keys, recs) = group_by_key(batch);
        let mut step = Step {
            spec: &self.spec,
            side,
            batch,
            watermark,
            out,
            late: Vec::new(),
            timers: Vec::new(),
        };
        if let Some(cache) = &mut self.cache {
            let function = &mut self.function;
            cache.for_each(ctx, &self.left, &self.right, &keys, |n, key, e| {
                let (lchanged, rchanged, added) =
                    step.join_key(function, key, &recs[n], &mut e.left, &mut e.right)?;
                e.left_dirty |= lchanged;
                e.right_dirty |= rchanged;
                Ok((added, 0))
            })?;
        } else {
            let lefts = self.left.get_many(ctx, &keys);
            let rights = self.right.get_many(ctx, &keys);
            let mut put_left: Vec<KeyRows<'_, Vec<IntervalLeftRow<F::Acc>>>> = Vec::new();
            let mut put_right: Vec<KeyRows<'_, RightRows>> = Vec::new();
            for ((key, idx), (lrows, rrows)) in
                keys.iter().zip(&recs).zip(lefts.into_iter().zip(rights))
            {
                let mut lrows = lrows.unwrap_or_default();
                let mut rrows = rrows.unwrap_or_default();
                let (lchanged, rchanged, _) =
                    step.join_key(&mut self.function, key, idx, &mut lrows, &mut rrows)?;
                if lchanged {
                    put_left.push((key, lrows));
                }
                if rchanged {
                    put_right.push((key, rrows));
                }
            }
            self.left.put_many(ctx, &put_left);
            self.right.put_many(ctx, &put_right);
        }
        let Step {
            mut timers, late, ..
        } = step;
        timers.sort_unstable();
        timers.dedup();
        let ns = side.namespace();
        let mut j = 0;
        while j < timers.len() {
            let t = timers[j].0;
            let mut group: Vec<&[u8]> = Vec::new();
            while j < timers.len() && timers[j].0 == t {
                group.push(timers[j].1);
                j += 1;
            }
            ctx.register_timers_for_keys(TimeDomain::EventTime, ns, t, &group);
        }
        emit_late(ctx, batch, &late);
        if let Some(cache) = &mut self.cache {
            cache.bound(ctx, &self.left, &self.right);
        }
        Ok(())
    }

    /// Handles due expiry timers: per key, removes the rows of the timer's side whose
    /// expiry time is at or before the timer's, calling
    /// [`IntervalJoinFunction::left_expired`] or emitting unmatched right rows of a right
    /// or full join. Other timers are ignored.
    ///
    /// # Errors
    /// Errors of the join function.
    pub fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let lower = self.spec.lower_ms;
        let join_type = self.spec.join_type;
        for g in timers {
            if g.domain != TimeDomain::EventTime {
                continue;
            }
            let t = g.timestamp;
            let left_side = match g.namespace.as_slice() {
                b"L" => true,
                b"R" => false,
                _ => continue,
            };
            let n = g.key_ends.len();
            if let Some(cache) = &mut self.cache {
                let keys: Vec<&[u8]> = (0..n).map(|i| g.key(i)).collect();
                let function = &mut self.function;
                cache.for_each(ctx, &self.left, &self.right, &keys, |_, key, e| {
                    let freed = if left_side {
                        expire_left(function, key, &mut e.left, t, join_type, out)?
                    } else {
                        expire_right(function, key, &mut e.right, t, lower, join_type, out)?
                    };
                    match freed {
                        Some(freed) => {
                            if left_side {
                                e.left_dirty = true;
                            } else {
                                e.right_dirty = true;
                            }
                            Ok((0, freed))
                        }
                        None => Ok((0, 0)),
                    }
                })?;
                cache.bound(ctx, &self.left, &self.right);
            } else if left_side {
                let function = &mut self.function;
                expire_uncached(ctx, &self.left, g, |key, rows| {
                    expire_left(function, key, rows, t, join_type, out)
                })?;
            } else {
                let function = &mut self.function;
                expire_uncached(ctx, &self.right, g, |key, rows| {
                    expire_right(function, key, rows, t, lower, join_type, out)
                })?;
            }
        }
        Ok(())
    }

    /// End of input: the host's final watermark expired every row; with the row cache,
    /// writes it back ([`Self::flush`]).
    ///
    /// # Errors
    /// None; the `Result` keeps the hooks of the join operators alike.
    pub fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        self.flush(ctx, out)
    }
}

/// Without the row cache: reads the rows of the timer group's keys from `state`, runs
/// `expire` on each key's rows, and writes back the keys it changed.
fn expire_uncached<T, C>(
    ctx: &mut dyn Context,
    state: &ValueState<C>,
    g: &TimerGroup,
    mut expire: impl FnMut(&[u8], &mut C) -> Result<Option<usize>>,
) -> Result<()>
where
    C: Serialize + DeserializeOwned + std::ops::Deref<Target = [T]>,
{
    let rows = state
        .in_namespace(&[])
        .get_many_flat(ctx, &g.keys, &g.key_ends);
    let mut changed = Vec::new();
    for (i, rows) in rows.into_iter().enumerate() {
        let key = g.key(i);
        let Some(mut rows) = rows else { continue };
        if expire(key, &mut rows)?.is_some() {
            changed.push((key, rows));
        }
    }
    write_back_side(ctx, state, changed.iter().map(|(k, rows)| (*k, rows)));
    Ok(())
}

/// Removes the left rows of one key whose expiry (`upper`) is at or before `t`, calling
/// [`IntervalJoinFunction::left_expired`] for each in stored order. `None` if none
/// expired (nothing changed), else the estimated bytes freed.
fn expire_left<F: IntervalJoinFunction>(
    function: &mut F,
    key: &[u8],
    rows: &mut Vec<IntervalLeftRow<F::Acc>>,
    t: i64,
    join_type: JoinType,
    out: &mut Batch,
) -> Result<Option<usize>> {
    if !rows.iter().any(|r| r.upper <= t) {
        return Ok(None);
    }
    let mut freed = 0;
    for r in rows.extract_if(.., |r| r.upper <= t) {
        freed += row_bytes(&r.data);
        let row = Row {
            data: &r.data,
            timestamp: Some(r.timestamp),
        };
        let mut o = JoinOutput::new(out, key, Some(r.upper));
        function.left_expired(key, row, r.acc, r.matched, join_type, &mut o)?;
    }
    Ok(Some(freed))
}

/// Removes the right rows of one key whose expiry (`r - lower`) is at or before `t`,
/// emitting the unmatched ones padded in a right or full join. `None` if none expired,
/// else the estimated bytes freed.
fn expire_right<F: IntervalJoinFunction>(
    function: &mut F,
    key: &[u8],
    rows: &mut RightRows,
    t: i64,
    lower: i64,
    join_type: JoinType,
    out: &mut Batch,
) -> Result<Option<usize>> {
    let expired = |r: &IntervalRightRow| r.timestamp.saturating_sub(lower) <= t;
    if !rows.iter().any(expired) {
        return Ok(None);
    }
    let mut freed = 0;
    if !join_type.keeps_right() {
        rows.retain(|r| {
            let gone = expired(r);
            if gone {
                freed += row_bytes(&r.data);
            }
            !gone
        });
        return Ok(Some(freed));
    }
    // In stored order, as `extract_if` would (which `SmallVec` lacks); after an error the
    // rest is kept untouched (the instance is dropped with the failed task anyway).
    let mut failed = None;
    rows.retain(|r| {
        if failed.is_some() || !expired(r) {
            return true;
        }
        freed += row_bytes(&r.data);
        if !r.matched {
            let row = Row {
                data: &r.data,
                timestamp: Some(r.timestamp),
            };
            let expiry = r.timestamp.saturating_sub(lower);
            let mut o = JoinOutput::new(out, key, Some(expiry));
            if let Err(e) = function.right_only(key, row, &mut o) {
                failed = Some(e);
                return true;
            }
        }
        false
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(Some(freed)),
    }
}

/// One batch's inputs and collected side effects, shared by the keys of the batch.
struct Step<'a, 'b> {
    spec: &'a IntervalJoinSpec,
    side: Side,
    batch: &'b Batch,
    watermark: i64,
    out: &'a mut Batch,
    /// Indices of late records.
    late: Vec<u32>,
    /// (expiry time, key) of the rows stored: one timer registration per time.
    timers: Vec<(i64, &'b [u8])>,
}

impl<'b> Step<'_, 'b> {
    /// Joins the records `idx` of one key against its rows and stores those that stay.
    /// Returns whether the left and the right rows changed, and the estimated bytes
    /// added.
    fn join_key<F: IntervalJoinFunction>(
        &mut self,
        function: &mut F,
        key: &'b [u8],
        idx: &[u32],
        lrows: &mut Vec<IntervalLeftRow<F::Acc>>,
        rrows: &mut RightRows,
    ) -> Result<(bool, bool, usize)> {
        let spec = self.spec;
        let (batch, watermark) = (self.batch, self.watermark);
        let lower = spec.lower_ms;
        let track_right = spec.join_type.keeps_right();
        let exact_left = spec.join_type.keeps_left() || F::EMITS_ON_LEFT_EXPIRY;
        let exact_right = track_right;
        let (mut lchanged, mut rchanged, mut added) = (false, false, 0);
        for &i in idx {
            let i = i as usize;
            let ts = batch.timestamps[i];
            if ts <= watermark {
                self.late.push(i as u32);
                continue;
            }
            let data = batch.record(i);
            let row = Row {
                data,
                timestamp: Some(ts),
            };
            match self.side {
                Side::Left => {
                    let default = ts.saturating_add(spec.upper_ms);
                    let upper = function.upper_bound(key, row, default);
                    let lo = ts.saturating_add(lower);
                    let mut acc = F::Acc::default();
                    let mut matched = false;
                    for r in rrows.iter_mut() {
                        if r.timestamp < lo || r.timestamp > upper {
                            continue;
                        }
                        let rr = Row {
                            data: &r.data,
                            timestamp: Some(r.timestamp),
                        };
                        if !function.matches(key, row, rr) {
                            continue;
                        }
                        let mut o = JoinOutput::new(self.out, key, Some(ts.max(r.timestamp)));
                        function.join(key, row, &mut acc, rr, &mut o)?;
                        matched = true;
                        if track_right && !r.matched {
                            r.matched = true;
                            rchanged = true;
                        }
                    }
                    if upper <= watermark {
                        let mut o = JoinOutput::new(self.out, key, Some(upper));
                        function.left_expired(key, row, acc, matched, spec.join_type, &mut o)?;
                    } else {
                        lrows.push(IntervalLeftRow {
                            timestamp: ts,
                            upper,
                            matched,
                            acc,
                            data: data.to_vec(),
                        });
                        added += row_bytes(data);
                        lchanged = true;
                        self.timers.push((timer_at(upper, exact_left), key));
                    }
                }
                Side::Right => {
                    let mut matched = false;
                    for l in lrows.iter_mut() {
                        if ts < l.timestamp.saturating_add(lower) || ts > l.upper {
                            continue;
                        }
                        let lr = Row {
                            data: &l.data,
                            timestamp: Some(l.timestamp),
                        };
                        if !function.matches(key, lr, row) {
                            continue;
                        }
                        let mut o = JoinOutput::new(self.out, key, max_ts(Some(ts), lr.timestamp));
                        function.join(key, lr, &mut l.acc, row, &mut o)?;
                        matched = true;
                        l.matched = true;
                        lchanged = true;
                    }
                    let expiry = ts.saturating_sub(lower);
                    if spec.left_unique && !track_right && !lrows.is_empty() {
                        // The key's one left row is here: no other can come.
                    } else if expiry <= watermark {
                        if track_right && !matched {
                            let mut o = JoinOutput::new(self.out, key, Some(expiry));
                            function.right_only(key, row, &mut o)?;
                        }
                    } else {
                        rrows.push(IntervalRightRow {
                            timestamp: ts,
                            matched,
                            data: data.to_vec(),
                        });
                        added += row_bytes(data);
                        rchanged = true;
                        self.timers.push((timer_at(expiry, exact_right), key));
                    }
                }
            }
        }
        Ok((lchanged, rchanged, added))
    }
}

#[cfg(test)]
mod encoding_tests {
    use super::*;

    /// The right rows held as [`RightRows`] are stored exactly as the declared
    /// `Vec<IntervalRightRow>`: savepoints of either shape restore into the other.
    #[test]
    fn right_rows_encode_as_the_declared_vec() {
        let row = |t: i64, m: bool, d: &[u8]| IntervalRightRow {
            timestamp: t,
            matched: m,
            data: d.to_vec(),
        };
        for rows in [
            vec![],
            vec![row(-5, true, b"")],
            vec![row(1, false, b"a,b"), row(i64::MAX, true, &[0xff; 300])],
        ] {
            let small: RightRows = rows.iter().cloned().collect();
            let bytes = postcard::to_allocvec(&rows).unwrap();
            assert_eq!(postcard::to_allocvec(&small).unwrap(), bytes);
            let back: RightRows = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back.into_vec(), rows);
        }
    }
}
