//! [`RegularJoin`]: every pair of rows with equal keys, with per-side TTL.

use serde::{Deserialize, Serialize};

use super::{JOIN_STATE_SCHEMA, JoinOutput, JoinType, Row, Side, group_by_key, max_ts};
use crate::{
    Batch, Context, PluginError, Result, StateDescriptor, TimeDomain, TimerGroup, ValueState,
};

/// Value state of the left rows: a postcard `Vec<RegularRow>` per key.
pub const REGULAR_LEFT_STATE: &str = "join-left";
/// Value state of the right rows: a postcard `Vec<RegularRow>` per key.
pub const REGULAR_RIGHT_STATE: &str = "join-right";

/// One stored row of a [`RegularJoin`] side, in arrival order per key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegularRow {
    /// The record timestamp, if it had one.
    pub timestamp: Option<i64>,
    /// Processing time (ms) the row arrived at; its TTL counts from here.
    pub arrived: i64,
    /// Whether it joined at least one row of the other side (kept up to date only on
    /// the outer sides of the join type).
    pub matched: bool,
    /// The record payload.
    pub data: Vec<u8>,
}

impl RegularRow {
    fn row(&self) -> Row<'_> {
        Row {
            data: &self.data,
            timestamp: self.timestamp,
        }
    }
}

/// What a [`RegularJoin`] computes.
///
/// # Semantics
///
/// - Rows of both sides are kept per key (their payloads as received). A row arriving on
///   one side is paired, in arrival order, with every stored row of the other side whose
///   key is equal and for which [`Self::matches`] holds; [`Self::join`] emits each pair.
///   Then the row is stored. So every matching pair is joined exactly once, when the
///   later of its two rows arrives, whatever the order.
/// - **Outer joins** ([`JoinType::Left`], [`JoinType::Right`], [`JoinType::Full`]): a row
///   of an outer side that never matched is emitted padded, through
///   [`Self::left_only`] or [`Self::right_only`], exactly once, when its row leaves the
///   state: when its TTL runs out (see [`RegularJoinSpec`]), or at the end of bounded
///   input (`finish`). A row that matched is never emitted padded; a padded row is never
///   followed by a pair of the same row (it is gone). Without a TTL an unbounded outer
///   join therefore emits padded rows never: give the outer side a TTL.
pub trait JoinFunction {
    /// An extra join condition on a pair of equal keys (Flink's non-equi conditions);
    /// default: every pair matches. Must be a pure function of its arguments.
    fn matches(&self, key: &[u8], left: Row<'_>, right: Row<'_>) -> bool {
        let _ = (key, left, right);
        true
    }

    /// Emits the result of a matching pair.
    ///
    /// # Errors
    /// A pair it cannot join (an undecodable payload): the batch fails (the operator's
    /// `on_error` policy applies to keyed operators as `fail`).
    fn join(
        &mut self,
        key: &[u8],
        left: Row<'_>,
        right: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()>;

    /// Emits a left row that never matched (left and full joins). Default: nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn left_only(&mut self, key: &[u8], left: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        let _ = (key, left, out);
        Ok(())
    }

    /// Emits a right row that never matched (right and full joins). Default: nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn right_only(&mut self, key: &[u8], right: Row<'_>, out: &mut JoinOutput<'_>) -> Result<()> {
        let _ = (key, right, out);
        Ok(())
    }
}

/// The definition of a [`RegularJoin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RegularJoinSpec {
    /// Inner or outer.
    pub join_type: JoinType,
    /// Time to live of a left row (ms of processing time since it arrived, > 0), or
    /// `None` (default): kept for ever.
    pub left_ttl_ms: Option<i64>,
    /// Time to live of a right row, as `left_ttl_ms`.
    pub right_ttl_ms: Option<i64>,
}

impl RegularJoinSpec {
    /// An inner join without TTL.
    pub const fn inner() -> Self {
        Self::of(JoinType::Inner)
    }

    /// A join of `join_type` without TTL.
    pub const fn of(join_type: JoinType) -> Self {
        RegularJoinSpec {
            join_type,
            left_ttl_ms: None,
            right_ttl_ms: None,
        }
    }

    /// The same spec with per-side TTLs (ms of processing time, `None`: none).
    pub const fn with_ttl(mut self, left_ms: Option<i64>, right_ms: Option<i64>) -> Self {
        self.left_ttl_ms = left_ms;
        self.right_ttl_ms = right_ms;
        self
    }

    fn ttl(&self, side: Side) -> Option<i64> {
        match side {
            Side::Left => self.left_ttl_ms,
            Side::Right => self.right_ttl_ms,
        }
    }

    fn keeps(&self, side: Side) -> bool {
        match side {
            Side::Left => self.join_type.keeps_left(),
            Side::Right => self.join_type.keeps_right(),
        }
    }

    /// Checks the TTLs.
    ///
    /// # Errors
    /// A message naming `left_ttl_ms` or `right_ttl_ms` and its value.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("left_ttl_ms", self.left_ttl_ms),
            ("right_ttl_ms", self.right_ttl_ms),
        ] {
            if let Some(v) = v
                && v <= 0
            {
                return Err(format!(
                    "join.{name} must be a positive number of ms, got {v}"
                ));
            }
        }
        Ok(())
    }

    /// The model JSON, fixed field order:
    /// `{"operator":"regular-join","type":…,"left_ttl_ms":…|null,"right_ttl_ms":…|null}`.
    pub fn to_model_json(&self) -> String {
        let ttl = |v: Option<i64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
        format!(
            r#"{{"operator":"regular-join","type":"{}","left_ttl_ms":{},"right_ttl_ms":{}}}"#,
            self.join_type.as_str(),
            ttl(self.left_ttl_ms),
            ttl(self.right_ttl_ms)
        )
    }

    /// The states a [`RegularJoin`] opens, to declare in `describe()`:
    /// [`REGULAR_LEFT_STATE`] and [`REGULAR_RIGHT_STATE`].
    pub fn state_descriptors() -> Vec<StateDescriptor> {
        vec![
            ValueState::<Vec<RegularRow>>::descriptor(REGULAR_LEFT_STATE, JOIN_STATE_SCHEMA),
            ValueState::<Vec<RegularRow>>::descriptor(REGULAR_RIGHT_STATE, JOIN_STATE_SCHEMA),
        ]
    }
}

/// A regular (unwindowed) keyed join of two inputs: see [`JoinFunction`] for what it
/// emits and when, and the [module docs](super) for determinism.
///
/// # State and timers
///
/// Per key and side one value, a postcard `Vec<RegularRow>` in arrival order
/// ([`REGULAR_LEFT_STATE`], [`REGULAR_RIGHT_STATE`]): one batched read of both sides and
/// one batched write per batch. A side with a TTL registers a processing-time timer per
/// (key, batch) at `arrival + ttl` in the side's namespace ([`Side::namespace`]); when it
/// fires, the key's rows of that side that arrived `ttl` or more ago are removed, padded
/// first if they are of an outer side and never matched. The TTL is the join's own, not
/// the host's `state_ttl_ms` (which would drop a row without letting an outer join emit
/// it): declaring `state_ttl_ms` on the join's states is refused at `open`.
///
/// The cost of a batch grows with the rows stored per key (each touched key's list is
/// read and written whole), so it suits keys with few rows per side, as in Nexmark q3
/// (auctions joined to their seller).
pub struct RegularJoin<F: JoinFunction> {
    spec: RegularJoinSpec,
    function: F,
    left: ValueState<Vec<RegularRow>>,
    right: ValueState<Vec<RegularRow>>,
}

impl<F: JoinFunction> std::fmt::Debug for RegularJoin<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegularJoin")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl<F: JoinFunction> RegularJoin<F> {
    /// Opens the join: validates `spec` and opens its states
    /// ([`RegularJoinSpec::state_descriptors`]).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an invalid spec, or a host `state_ttl_ms`
    /// on one of the join's states; [`crate::ErrorCode::State`] for an undeclared state.
    pub fn open(ctx: &mut dyn Context, spec: RegularJoinSpec, function: F) -> Result<Self> {
        spec.validate().map_err(PluginError::invalid_config)?;
        let left = ValueState::open(ctx, REGULAR_LEFT_STATE)?;
        let right = ValueState::open(ctx, REGULAR_RIGHT_STATE)?;
        for s in [&left, &right] {
            if ctx.state_ttl_ms(s.handle()).is_some() {
                return Err(PluginError::invalid_config(format!(
                    "state `{}` has a state_ttl_ms in the job file: a join's rows expire \
                     through its own per-side TTL (left_ttl_ms, right_ttl_ms), which lets \
                     an outer join emit the rows that never matched",
                    s.name()
                )));
            }
        }
        Ok(RegularJoin {
            spec,
            function,
            left,
            right,
        })
    }

    /// The spec.
    pub fn spec(&self) -> &RegularJoinSpec {
        &self.spec
    }

    /// The join function.
    pub fn function(&self) -> &F {
        &self.function
    }

    fn state(&self, side: Side) -> &ValueState<Vec<RegularRow>> {
        match side {
            Side::Left => &self.left,
            Side::Right => &self.right,
        }
    }

    /// Joins a batch of input `input` (0 left, 1 right) against the other side's rows,
    /// emitting the pairs into `out`, and stores its rows.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for another input ([`super::Side::of_input`]);
    /// errors of the join function
    /// (then the batch's state changes are not written).
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
        let now = ctx.current_processing_time();
        let (keys, recs) = group_by_key(batch);
        let mine = self.state(side).get_many(ctx, &keys);
        let theirs = self.state(side.other()).get_many(ctx, &keys);
        let track_theirs = self.spec.keeps(side.other());
        let track_mine = self.spec.keeps(side);
        let mut put_mine: Vec<(&[u8], Vec<RegularRow>)> = Vec::with_capacity(keys.len());
        let mut put_theirs: Vec<(&[u8], Vec<RegularRow>)> = Vec::new();
        for ((key, idx), (mine, theirs)) in keys.iter().zip(&recs).zip(mine.into_iter().zip(theirs))
        {
            let mut mine = mine.unwrap_or_default();
            let mut theirs = theirs.unwrap_or_default();
            let mut theirs_changed = false;
            for &i in idx {
                let i = i as usize;
                let row = Row {
                    data: batch.record(i),
                    timestamp: batch.timestamp(i),
                };
                let mut matched = false;
                for other in &mut theirs {
                    let (l, r) = match side {
                        Side::Left => (row, other.row()),
                        Side::Right => (other.row(), row),
                    };
                    if !self.function.matches(key, l, r) {
                        continue;
                    }
                    let mut o = JoinOutput::new(out, key, max_ts(l.timestamp, r.timestamp));
                    self.function.join(key, l, r, &mut o)?;
                    matched = true;
                    if track_theirs && !other.matched {
                        other.matched = true;
                        theirs_changed = true;
                    }
                }
                mine.push(RegularRow {
                    timestamp: row.timestamp,
                    arrived: now,
                    matched: matched && track_mine,
                    data: row.data.to_vec(),
                });
            }
            put_mine.push((key, mine));
            if theirs_changed {
                put_theirs.push((key, theirs));
            }
        }
        self.state(side).put_many(ctx, &put_mine);
        self.state(side.other()).put_many(ctx, &put_theirs);
        if let Some(ttl) = self.spec.ttl(side) {
            ctx.register_timers_for_keys(
                TimeDomain::ProcessingTime,
                side.namespace(),
                now.saturating_add(ttl),
                &keys,
            );
        }
        Ok(())
    }

    fn emit_unmatched(
        &mut self,
        side: Side,
        key: &[u8],
        row: &RegularRow,
        out: &mut Batch,
    ) -> Result<()> {
        let mut o = JoinOutput::new(out, key, row.timestamp);
        match side {
            Side::Left => self.function.left_only(key, row.row(), &mut o),
            Side::Right => self.function.right_only(key, row.row(), &mut o),
        }
    }

    /// Handles due TTL timers: removes each key's rows of the timer's side that arrived
    /// `ttl` or more before the timer's time, emitting those of an outer side that never
    /// matched. Other timers are ignored.
    ///
    /// # Errors
    /// Errors of the join function.
    pub fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        for g in timers {
            if g.domain != TimeDomain::ProcessingTime {
                continue;
            }
            let side = match g.namespace.as_slice() {
                b"L" => Side::Left,
                b"R" => Side::Right,
                _ => continue,
            };
            let Some(ttl) = self.spec.ttl(side) else {
                continue;
            };
            let keep = self.spec.keeps(side);
            let rows = self
                .state(side)
                .in_namespace(&[])
                .get_many_flat(ctx, &g.keys, &g.key_ends);
            let mut puts: Vec<(&[u8], Vec<RegularRow>)> = Vec::new();
            for (i, rows) in rows.into_iter().enumerate() {
                let key = g.key(i);
                let Some(rows) = rows else { continue };
                let (gone, kept): (Vec<RegularRow>, Vec<RegularRow>) = rows
                    .into_iter()
                    .partition(|r| r.arrived.saturating_add(ttl) <= g.timestamp);
                if gone.is_empty() {
                    continue;
                }
                if keep {
                    for r in gone.iter().filter(|r| !r.matched) {
                        self.emit_unmatched(side, key, r, out)?;
                    }
                }
                if kept.is_empty() {
                    self.state(side).delete(ctx, key);
                } else {
                    puts.push((key, kept));
                }
            }
            self.state(side).put_many(ctx, &puts);
        }
        Ok(())
    }

    /// Called from `prepare_checkpoint` ([`crate::join_operator_hooks!`]): nothing to
    /// write, this operator keeps no copy of its state between calls. Exists so the hooks
    /// of the join operators are alike ([`super::IntervalJoin::flush`]).
    ///
    /// # Errors
    /// None.
    pub fn flush(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = (ctx, out);
        Ok(())
    }

    /// End of bounded input: emits every stored row of an outer side that never matched
    /// (keys ascending, rows in arrival order), and removes it.
    ///
    /// # Errors
    /// Errors of the join function.
    pub fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        for side in [Side::Left, Side::Right] {
            if !self.spec.keeps(side) {
                continue;
            }
            let keys = self.state(side).keys(ctx);
            for key in keys {
                let rows = self.state(side).get(ctx, &key).unwrap_or_default();
                for r in rows.iter().filter(|r| !r.matched) {
                    self.emit_unmatched(side, &key, r, out)?;
                }
                self.state(side).delete(ctx, &key);
            }
        }
        Ok(())
    }
}
