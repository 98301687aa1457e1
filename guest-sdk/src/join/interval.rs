//! [`IntervalJoin`]: pairs whose timestamps lie within bounds of each other, state freed
//! by the watermark.

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::{JOIN_STATE_SCHEMA, JoinOutput, JoinType, Row, Side, emit_late, group_by_key, max_ts};
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
type KeyRows<'k, R> = (&'k [u8], Vec<R>);

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
pub struct IntervalJoin<F: IntervalJoinFunction> {
    spec: IntervalJoinSpec,
    function: F,
    left: ValueState<Vec<IntervalLeftRow<F::Acc>>>,
    right: ValueState<Vec<IntervalRightRow>>,
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
        })
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
    /// [`crate::ErrorCode::InvalidRecord`] for another input or a record without
    /// timestamp; errors of the join function (then no state was written).
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
        let lefts = self.left.get_many(ctx, &keys);
        let rights = self.right.get_many(ctx, &keys);
        let mut late: Vec<u32> = Vec::new();
        let mut put_left: Vec<KeyRows<'_, IntervalLeftRow<F::Acc>>> = Vec::new();
        let mut put_right: Vec<KeyRows<'_, IntervalRightRow>> = Vec::new();
        // (key, expiry time) of the rows stored: one timer registration per time.
        let mut timers: Vec<(i64, &[u8])> = Vec::new();
        let lower = self.spec.lower_ms;
        let track_right = self.spec.join_type.keeps_right();
        let exact_left = self.spec.join_type.keeps_left() || F::EMITS_ON_LEFT_EXPIRY;
        let exact_right = track_right;
        for ((key, idx), (lrows, rrows)) in
            keys.iter().zip(&recs).zip(lefts.into_iter().zip(rights))
        {
            let mut lrows = lrows.unwrap_or_default();
            let mut rrows = rrows.unwrap_or_default();
            let (mut lchanged, mut rchanged) = (false, false);
            for &i in idx {
                let i = i as usize;
                let ts = batch.timestamps[i];
                if ts <= watermark {
                    late.push(i as u32);
                    continue;
                }
                let data = batch.record(i);
                let row = Row {
                    data,
                    timestamp: Some(ts),
                };
                match side {
                    Side::Left => {
                        let default = ts.saturating_add(self.spec.upper_ms);
                        let upper = self.function.upper_bound(key, row, default);
                        let lo = ts.saturating_add(lower);
                        let mut acc = F::Acc::default();
                        let mut matched = false;
                        for r in &mut rrows {
                            if r.timestamp < lo || r.timestamp > upper {
                                continue;
                            }
                            let rr = Row {
                                data: &r.data,
                                timestamp: Some(r.timestamp),
                            };
                            if !self.function.matches(key, row, rr) {
                                continue;
                            }
                            let mut o = JoinOutput::new(out, key, Some(ts.max(r.timestamp)));
                            self.function.join(key, row, &mut acc, rr, &mut o)?;
                            matched = true;
                            if track_right && !r.matched {
                                r.matched = true;
                                rchanged = true;
                            }
                        }
                        if upper <= watermark {
                            let mut o = JoinOutput::new(out, key, Some(upper));
                            self.function.left_expired(
                                key,
                                row,
                                acc,
                                matched,
                                self.spec.join_type,
                                &mut o,
                            )?;
                        } else {
                            lrows.push(IntervalLeftRow {
                                timestamp: ts,
                                upper,
                                matched,
                                acc,
                                data: data.to_vec(),
                            });
                            lchanged = true;
                            timers.push((timer_at(upper, exact_left), key));
                        }
                    }
                    Side::Right => {
                        let mut matched = false;
                        for l in &mut lrows {
                            if ts < l.timestamp.saturating_add(lower) || ts > l.upper {
                                continue;
                            }
                            let lr = Row {
                                data: &l.data,
                                timestamp: Some(l.timestamp),
                            };
                            if !self.function.matches(key, lr, row) {
                                continue;
                            }
                            let mut o = JoinOutput::new(out, key, max_ts(Some(ts), lr.timestamp));
                            self.function.join(key, lr, &mut l.acc, row, &mut o)?;
                            matched = true;
                            l.matched = true;
                            lchanged = true;
                        }
                        let expiry = ts.saturating_sub(lower);
                        if self.spec.left_unique && !track_right && !lrows.is_empty() {
                            // The key's one left row is here: no other can come.
                        } else if expiry <= watermark {
                            if track_right && !matched {
                                let mut o = JoinOutput::new(out, key, Some(expiry));
                                self.function.right_only(key, row, &mut o)?;
                            }
                        } else {
                            rrows.push(IntervalRightRow {
                                timestamp: ts,
                                matched,
                                data: data.to_vec(),
                            });
                            rchanged = true;
                            timers.push((timer_at(expiry, exact_right), key));
                        }
                    }
                }
            }
            if lchanged {
                put_left.push((key, lrows));
            }
            if rchanged {
                put_right.push((key, rrows));
            }
        }
        self.left.put_many(ctx, &put_left);
        self.right.put_many(ctx, &put_right);
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
            match g.namespace.as_slice() {
                b"L" => {
                    let rows = self
                        .left
                        .in_namespace(&[])
                        .get_many_flat(ctx, &g.keys, &g.key_ends);
                    let mut puts = Vec::new();
                    for (i, rows) in rows.into_iter().enumerate() {
                        let key = g.key(i);
                        let Some(rows) = rows else { continue };
                        let (gone, kept): (Vec<_>, Vec<_>) =
                            rows.into_iter().partition(|r| r.upper <= t);
                        if gone.is_empty() {
                            continue;
                        }
                        for r in gone {
                            let row = Row {
                                data: &r.data,
                                timestamp: Some(r.timestamp),
                            };
                            let mut o = JoinOutput::new(out, key, Some(r.upper));
                            self.function
                                .left_expired(key, row, r.acc, r.matched, join_type, &mut o)?;
                        }
                        if kept.is_empty() {
                            self.left.delete(ctx, key);
                        } else {
                            puts.push((key, kept));
                        }
                    }
                    self.left.put_many(ctx, &puts);
                }
                b"R" => {
                    let rows =
                        self.right
                            .in_namespace(&[])
                            .get_many_flat(ctx, &g.keys, &g.key_ends);
                    let mut puts = Vec::new();
                    for (i, rows) in rows.into_iter().enumerate() {
                        let key = g.key(i);
                        let Some(rows) = rows else { continue };
                        let (gone, kept): (Vec<_>, Vec<_>) = rows
                            .into_iter()
                            .partition(|r| r.timestamp.saturating_sub(lower) <= t);
                        if gone.is_empty() {
                            continue;
                        }
                        if join_type.keeps_right() {
                            for r in gone.iter().filter(|r| !r.matched) {
                                let row = Row {
                                    data: &r.data,
                                    timestamp: Some(r.timestamp),
                                };
                                let expiry = r.timestamp.saturating_sub(lower);
                                let mut o = JoinOutput::new(out, key, Some(expiry));
                                self.function.right_only(key, row, &mut o)?;
                            }
                        }
                        if kept.is_empty() {
                            self.right.delete(ctx, key);
                        } else {
                            puts.push((key, kept));
                        }
                    }
                    self.right.put_many(ctx, &puts);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// End of input: nothing to do (the host's final watermark expired every row).
    ///
    /// # Errors
    /// None; the `Result` keeps the hooks of the join operators alike.
    pub fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = (ctx, out);
        Ok(())
    }
}
