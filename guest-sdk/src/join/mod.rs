//! The join family: operators over two keyed inputs, on the same host state, timers and
//! watermarks as the [window family](crate::window) (design §9.1).
//!
//! | operator | joins | state freed | Flink's counterpart |
//! |---|---|---|---|
//! | [`RegularJoin`] | every pair of rows with equal keys, whenever they arrive | per-side TTL (processing time), or never | SQL regular join, `STATE_TTL` hint |
//! | [`IntervalJoin`] | pairs with `left.ts + lower <= right.ts <= left.ts + upper` | by watermark | `IntervalJoinOperator`, SQL interval join |
//! | [`WindowJoin`] | pairs in the same tumbling, sliding or session window | when the window fires | DataStream window join, SQL window join |
//!
//! An operator takes its **left** input on input 0 and its **right** input on input 1
//! (job-file order: `inputs = [{ from = "left", partition = "hash" }, { from = "right",
//! partition = "hash" }]`); a batch on another input index is an
//! [`crate::ErrorCode::InvalidConfig`] error. A plugin that declares one of these
//! operators' models ([`RegularJoinSpec::to_model_json`] and its siblings, in
//! [`crate::PluginInfo::model`]) is refused by `nopstream validate` and at submission
//! unless its node has exactly two inputs. Both inputs must be keyed by the join key
//! (the upstream plugins set record keys; HASH edges route equal keys to one subtask):
//! rows join only when their keys are equal bytes, and a [`JoinFunction::matches`]-style
//! predicate may narrow that further. Unkeyed records count as the empty key.
//!
//! All of them are *append-only*: nothing is retracted. What an outer join emits, and
//! when, differs per operator and is written down on each (see [`JoinType`]).
//!
//! # Determinism
//!
//! Each operator's output is the same multiset of records for every order in which the
//! two inputs' records interleave, every batch split, every parallelism (keys spread
//! over subtasks by the HASH edges) and every restore from a checkpoint, under the
//! conditions stated per operator:
//!
//! - [`RegularJoin`] without a TTL: always (a pair is emitted when the later of its two
//!   rows arrives, whichever that is). With a TTL the result depends on when rows arrive
//!   in processing time, as in Flink.
//! - [`IntervalJoin`] and [`WindowJoin`]: as long as no record arrives behind the
//!   watermark (`timestamp <= watermark` when it is processed). No record does when each
//!   input stays within its source's out-of-orderness bound: the join's watermark is the
//!   minimum of its inputs', so a record not late on its own input is not late here.
//!   Records that do arrive late go to the side output [`LATE_OUTPUT`] and join nothing.
//!
//! Output order is not part of the contract (records of different keys, and of one key
//! across batches, come out in arrival order); compare outputs as multisets.
//!
//! # Ties, equal timestamps and bounds
//!
//! - Interval bounds are **inclusive** on both ends, as SQL's `BETWEEN`: a right row at
//!   exactly `left.ts + lower` or `left.ts + upper` joins.
//! - Windows are half-open `[start, end)`; a row at `end` belongs to the next window.
//!   Session windows of a key are formed over the rows of **both** inputs and merge only
//!   when they overlap, never when they merely touch (rows exactly `gap` apart are two
//!   sessions; the window family's rule, [`crate::window`]).
//! - Equal timestamps and equal payloads are not deduplicated: two equal rows are two
//!   rows, and each pairs with every matching row of the other side.
//! - A window join hands each window's rows to the function sorted by (timestamp,
//!   payload bytes), so what it emits for one window is deterministic in content *and*
//!   order.
//!
//! # Timestamps of the output
//!
//! - A joined pair carries the larger of its two rows' timestamps (absent if neither row
//!   has one).
//! - A window join's results carry the window's max timestamp (`end - 1`).
//! - A padded row of an outer interval join, and whatever
//!   [`IntervalJoinFunction::left_expired`] emits, carries the time its row expired
//!   (`upper(l)` for a left row, `r - lower` for a right one): the timer that freed it,
//!   so never behind the watermark downstream.
//! - A padded row of an outer regular join carries its row's own timestamp.
//!
//! Every output record is keyed with the join key, unless the function chooses another
//! ([`JoinOutput::emit_keyed`]).

mod interval;
mod regular;
#[cfg(test)]
mod tests;
mod window;

use serde::{Deserialize, Serialize};

use crate::{Batch, PluginError, Result};

pub use interval::{
    CLEANUP_GRANULARITY_MS, INTERVAL_LEFT_STATE, INTERVAL_RIGHT_STATE, IntervalJoin,
    IntervalJoinFunction, IntervalJoinSpec, IntervalLeftRow, IntervalRightRow,
};
pub use regular::{
    JoinFunction, REGULAR_LEFT_STATE, REGULAR_RIGHT_STATE, RegularJoin, RegularJoinSpec, RegularRow,
};
pub use window::{
    WINDOW_LEFT_STATE, WINDOW_MERGE_STATE, WINDOW_RIGHT_STATE, WindowJoin, WindowJoinFunction,
    WindowJoinSpec, WindowRow,
};

/// Name of the side output late records go to (interval and window joins).
pub const LATE_OUTPUT: &str = "late";
/// Input index of the left side.
pub const LEFT_INPUT: u32 = 0;
/// Input index of the right side.
pub const RIGHT_INPUT: u32 = 1;
/// Schema version of the join operators' own row layouts ([`RegularRow`],
/// [`IntervalRightRow`], [`WindowRow`], the session merge sets). [`IntervalLeftRow`]
/// carries the function's accumulator and takes the plugin's version instead.
pub const JOIN_STATE_SCHEMA: u32 = 1;

/// Which rows an outer join keeps when they find no partner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinType {
    /// Only pairs.
    #[default]
    Inner,
    /// Pairs, and every left row that never found a partner, padded.
    Left,
    /// Pairs, and every right row that never found a partner, padded.
    Right,
    /// Pairs, and every row of either side that never found a partner, padded.
    Full,
}

impl JoinType {
    /// Whether unmatched left rows are emitted.
    pub const fn keeps_left(self) -> bool {
        matches!(self, JoinType::Left | JoinType::Full)
    }

    /// Whether unmatched right rows are emitted.
    pub const fn keeps_right(self) -> bool {
        matches!(self, JoinType::Right | JoinType::Full)
    }

    /// The model name: `inner`, `left`, `right` or `full`.
    pub const fn as_str(self) -> &'static str {
        match self {
            JoinType::Inner => "inner",
            JoinType::Left => "left",
            JoinType::Right => "right",
            JoinType::Full => "full",
        }
    }
}

/// One side of a join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Input 0.
    Left,
    /// Input 1.
    Right,
}

impl Side {
    /// The side of input `input`.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an input other than 0 and 1: the job wires
    /// a third input to the join, a mistake of the job file, not of a record.
    pub fn of_input(input: u32) -> Result<Side> {
        match input {
            LEFT_INPUT => Ok(Side::Left),
            RIGHT_INPUT => Ok(Side::Right),
            other => Err(PluginError::invalid_config(format!(
                "a join has two inputs (0: left, 1: right), got a batch on input {other}: \
                 give the operator exactly two `inputs` in the job file"
            ))),
        }
    }

    /// The other side.
    pub const fn other(self) -> Side {
        match self {
            Side::Left => Side::Right,
            Side::Right => Side::Left,
        }
    }

    /// The one-byte timer namespace of the side's timers: `L` or `R`.
    pub const fn namespace(self) -> &'static [u8] {
        match self {
            Side::Left => b"L",
            Side::Right => b"R",
        }
    }
}

/// A row handed to a join function: its payload as the upstream emitted it, and its
/// timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row<'a> {
    /// The record payload.
    pub data: &'a [u8],
    /// The record timestamp (ms), if it had one.
    pub timestamp: Option<i64>,
}

/// Where a join function emits: appends records keyed with the join key and stamped
/// with the timestamp the operator chose (module docs, "Timestamps of the output").
#[derive(Debug)]
pub struct JoinOutput<'a> {
    batch: &'a mut Batch,
    key: &'a [u8],
    timestamp: Option<i64>,
}

impl<'a> JoinOutput<'a> {
    /// Output to `batch` for `key`, stamping records with `timestamp`.
    pub fn new(batch: &'a mut Batch, key: &'a [u8], timestamp: Option<i64>) -> Self {
        JoinOutput {
            batch,
            key,
            timestamp,
        }
    }

    /// The key records are emitted with.
    pub fn key(&self) -> &[u8] {
        self.key
    }

    /// The timestamp records are emitted with.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// Emits one record with payload `data`.
    pub fn emit(&mut self, data: &[u8]) {
        self.batch.push_record(Some(self.key), self.timestamp, data);
    }

    /// Emits one record whose payload `write` appends in place (see [`Batch::push_with`]).
    pub fn emit_with<R>(&mut self, write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        self.batch.push_with(Some(self.key), self.timestamp, write)
    }

    /// Emits one record keyed with `key` instead of the join key: for a result that a
    /// HASH edge routes by another field (Nexmark q4's category after a join on the
    /// auction).
    pub fn emit_keyed(&mut self, key: &[u8], data: &[u8]) {
        self.batch.push_record(Some(key), self.timestamp, data);
    }
}

/// The larger of two optional timestamps (`None` only if both are).
pub(crate) fn max_ts(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Groups a batch's records by key: the distinct keys in first-appearance order, and per
/// key its record indices in batch order.
pub(crate) fn group_by_key(batch: &Batch) -> (Vec<&[u8]>, Vec<Vec<u32>>) {
    let mut ids: crate::hash::FxHashMap<&[u8], u32> = crate::hash::FxHashMap::default();
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut recs: Vec<Vec<u32>> = Vec::new();
    for i in 0..batch.len() {
        let key = batch.key(i).unwrap_or(&[]);
        let id = *ids.entry(key).or_insert_with(|| {
            keys.push(key);
            recs.push(Vec::new());
            (keys.len() - 1) as u32
        });
        recs[id as usize].push(i as u32);
    }
    (keys, recs)
}

/// Sends records `late` of `batch` unchanged to [`LATE_OUTPUT`].
pub(crate) fn emit_late(ctx: &mut dyn crate::Context, batch: &Batch, late: &[u32]) {
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

/// Inside `impl Operator for T { … }`: forwards `process`, `on_timers`,
/// `prepare_checkpoint` (to the operator's `flush`) and `finish` to the join operator ([`RegularJoin`], [`IntervalJoin`] or [`WindowJoin`]) in field `$field`:
/// all a join plugin needs besides `describe` and `open`.
///
/// ```ignore
/// impl Operator for MyJoin {
///     fn describe() -> PluginInfo { unimplemented!() }
///     fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> { unimplemented!() }
///     nop_stream_sdk::join_operator_hooks!(join);
/// }
/// ```
#[macro_export]
macro_rules! join_operator_hooks {
    ($field:ident) => {
        fn process(
            &mut self,
            ctx: &mut dyn $crate::Context,
            input: u32,
            batch: &$crate::Batch,
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.process(ctx, input, batch, out)
        }

        fn on_timers(
            &mut self,
            ctx: &mut dyn $crate::Context,
            timers: &[$crate::TimerGroup],
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.on_timers(ctx, timers, out)
        }

        fn prepare_checkpoint(
            &mut self,
            ctx: &mut dyn $crate::Context,
            _epoch: u64,
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.flush(ctx, out)
        }

        fn finish(
            &mut self,
            ctx: &mut dyn $crate::Context,
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.finish(ctx, out)
        }
    };
}
