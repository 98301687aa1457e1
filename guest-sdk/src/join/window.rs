//! [`WindowJoin`]: the rows of both inputs in one tumbling, sliding or session window,
//! joined when the window fires.

use serde::{Deserialize, Serialize};

use super::{JOIN_STATE_SCHEMA, JoinOutput, JoinType, Row, Side, emit_late, group_by_key};
use crate::window::{Assigner, MergeEntry, Window};
use crate::{
    Batch, Context, PluginError, Result, StateDescriptor, TimeDomain, TimerGroup, ValueState,
};

/// Value state of the left rows: a postcard `Vec<WindowRow>` per key and state window.
pub const WINDOW_LEFT_STATE: &str = "wjoin-left";
/// Value state of the right rows: a postcard `Vec<WindowRow>` per key and state window.
pub const WINDOW_RIGHT_STATE: &str = "wjoin-right";
/// Value state of the session merge sets: a postcard `Vec<MergeEntry>` per key.
pub const WINDOW_MERGE_STATE: &str = "wjoin-merge";

/// One stored row of a [`WindowJoin`] side.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowRow {
    /// The record timestamp.
    pub timestamp: i64,
    /// The record payload.
    pub data: Vec<u8>,
}

impl WindowRow {
    fn row(&self) -> Row<'_> {
        Row {
            data: &self.data,
            timestamp: Some(self.timestamp),
        }
    }
}

/// What a [`WindowJoin`] computes, once per (key, window) when the window fires.
pub trait WindowJoinFunction {
    /// Joins the rows of one key in one window, each side sorted by (timestamp, payload).
    /// Default: the join type's product: [`Self::join`] for every (left, right) pair in
    /// that order (left major), then, for an outer type, [`Self::left_only`] or
    /// [`Self::right_only`] for every row of a side whose other side is empty in this
    /// window (with a non-empty other side every row has a partner: the window is the
    /// only condition).
    ///
    /// Override it for anything else over the two row sets, such as Nexmark q8's one
    /// row per window with both sides present.
    ///
    /// # Errors
    /// Errors of the function's callbacks.
    fn join_window(
        &mut self,
        key: &[u8],
        window: Window,
        left: &[Row<'_>],
        right: &[Row<'_>],
        join_type: JoinType,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        for l in left {
            for r in right {
                self.join(key, window, *l, *r, out)?;
            }
        }
        if right.is_empty() && join_type.keeps_left() {
            for l in left {
                self.left_only(key, window, *l, out)?;
            }
        }
        if left.is_empty() && join_type.keeps_right() {
            for r in right {
                self.right_only(key, window, *r, out)?;
            }
        }
        Ok(())
    }

    /// Emits a pair of one window.
    ///
    /// # Errors
    /// A pair it cannot join (an undecodable payload): the firing fails.
    fn join(
        &mut self,
        key: &[u8],
        window: Window,
        left: Row<'_>,
        right: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()>;

    /// Emits a left row of a window without right rows (left and full joins). Default:
    /// nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn left_only(
        &mut self,
        key: &[u8],
        window: Window,
        left: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        let _ = (key, window, left, out);
        Ok(())
    }

    /// Emits a right row of a window without left rows (right and full joins). Default:
    /// nothing.
    ///
    /// # Errors
    /// As [`Self::join`].
    fn right_only(
        &mut self,
        key: &[u8],
        window: Window,
        right: Row<'_>,
        out: &mut JoinOutput<'_>,
    ) -> Result<()> {
        let _ = (key, window, right, out);
        Ok(())
    }
}

/// The definition of a [`WindowJoin`]: event-time windows, zero allowed lateness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowJoinSpec {
    /// Window assignment (both inputs share it; sessions form over both).
    pub assigner: Assigner,
    /// Inner or outer.
    pub join_type: JoinType,
}

impl WindowJoinSpec {
    /// An inner join in tumbling windows of `size_ms`.
    pub const fn tumbling(size_ms: i64) -> Self {
        Self::with(Assigner::Tumbling {
            size: size_ms,
            offset: 0,
        })
    }

    /// An inner join in sliding windows of `size_ms` every `slide_ms`.
    pub const fn sliding(size_ms: i64, slide_ms: i64) -> Self {
        Self::with(Assigner::Sliding {
            size: size_ms,
            slide: slide_ms,
            offset: 0,
        })
    }

    /// An inner join in session windows with `gap_ms`, formed over both inputs' rows.
    pub const fn session(gap_ms: i64) -> Self {
        Self::with(Assigner::Session { gap: gap_ms })
    }

    const fn with(assigner: Assigner) -> Self {
        WindowJoinSpec {
            assigner,
            join_type: JoinType::Inner,
        }
    }

    /// The same windows with another join type.
    pub const fn with_type(mut self, join_type: JoinType) -> Self {
        self.join_type = join_type;
        self
    }

    /// Checks sizes and offsets (the window family's rules).
    ///
    /// # Errors
    /// A message naming the bad field and its value.
    pub fn validate(&self) -> Result<(), String> {
        crate::window::WindowSpec {
            assigner: self.assigner,
            time: crate::window::TimeMode::Event,
            allowed_lateness_ms: 0,
            function: crate::window::FunctionKind::Process,
        }
        .validate()
    }

    /// The model JSON, fixed field order: `{"operator":"window-join","type":…,` then the
    /// assigner's fields as in [`crate::window::WindowSpec::to_model_json`] `}`.
    pub fn to_model_json(&self) -> String {
        let assigner = match self.assigner {
            Assigner::Tumbling { size, offset } => {
                format!(r#""assigner":"tumbling","size_ms":{size},"offset_ms":{offset}"#)
            }
            Assigner::Sliding {
                size,
                slide,
                offset,
            } => format!(
                r#""assigner":"sliding","size_ms":{size},"slide_ms":{slide},"offset_ms":{offset}"#
            ),
            Assigner::Session { gap } => format!(r#""assigner":"session","gap_ms":{gap}"#),
        };
        format!(
            r#"{{"operator":"window-join","type":"{}",{assigner}}}"#,
            self.join_type.as_str()
        )
    }

    /// The states a [`WindowJoin`] opens, to declare in `describe()`:
    /// [`WINDOW_LEFT_STATE`], [`WINDOW_RIGHT_STATE`] and (used by sessions)
    /// [`WINDOW_MERGE_STATE`].
    pub fn state_descriptors() -> Vec<StateDescriptor> {
        vec![
            ValueState::<Vec<WindowRow>>::descriptor(WINDOW_LEFT_STATE, JOIN_STATE_SCHEMA),
            ValueState::<Vec<WindowRow>>::descriptor(WINDOW_RIGHT_STATE, JOIN_STATE_SCHEMA),
            ValueState::<Vec<MergeEntry>>::descriptor(WINDOW_MERGE_STATE, JOIN_STATE_SCHEMA),
        ]
    }
}

/// An event-time window join of two keyed inputs (Flink's window join, with outer
/// types): both inputs' rows of a key are assigned to windows by one [`Assigner`], and
/// when the watermark reaches a window's max timestamp the window's rows go to
/// [`WindowJoinFunction::join_window`] and are dropped.
///
/// - A row is late, and goes unchanged to [`super::LATE_OUTPUT`], when every window it
///   belongs to has fired (its max timestamp is at or behind the watermark); otherwise it
///   is added to its windows that have not fired. There is no allowed lateness: a window
///   fires once.
/// - Sessions are formed over the rows of both sides: a row's window `[ts, ts + gap)`
///   merges with every overlapping session of its key, and the merged session's rows of
///   each side are moved into one state window (the window family's merge rule,
///   [`crate::window`], "Sessions merge only when they overlap").
/// - Results carry the window's max timestamp and the key.
///
/// # State and timers
///
/// Per key, side and state window one value, a postcard `Vec<WindowRow>`
/// ([`WINDOW_LEFT_STATE`], [`WINDOW_RIGHT_STATE`]; namespace
/// [`Window::namespace`]), read and written once per batch per (key, window) for
/// tumbling and sliding windows; sessions also keep a merge set per key
/// ([`WINDOW_MERGE_STATE`]). One event-time timer per (key, window) at its max
/// timestamp, in the window's namespace.
pub struct WindowJoin<F: WindowJoinFunction> {
    spec: WindowJoinSpec,
    function: F,
    left: ValueState<Vec<WindowRow>>,
    right: ValueState<Vec<WindowRow>>,
    merge: Option<ValueState<Vec<MergeEntry>>>,
    windows: Vec<Window>,
}

impl<F: WindowJoinFunction> std::fmt::Debug for WindowJoin<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowJoin")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl<F: WindowJoinFunction> WindowJoin<F> {
    /// Opens the join: validates `spec` and opens its states
    /// ([`WindowJoinSpec::state_descriptors`]; the merge state only for sessions).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an invalid spec;
    /// [`crate::ErrorCode::State`] for an undeclared state.
    pub fn open(ctx: &mut dyn Context, spec: WindowJoinSpec, function: F) -> Result<Self> {
        spec.validate().map_err(PluginError::invalid_config)?;
        let merge = if spec.assigner.is_merging() {
            Some(ValueState::open(ctx, WINDOW_MERGE_STATE)?)
        } else {
            None
        };
        Ok(WindowJoin {
            spec,
            function,
            left: ValueState::open(ctx, WINDOW_LEFT_STATE)?,
            right: ValueState::open(ctx, WINDOW_RIGHT_STATE)?,
            merge,
            windows: Vec::new(),
        })
    }

    /// The spec.
    pub fn spec(&self) -> &WindowJoinSpec {
        &self.spec
    }

    /// The join function.
    pub fn function(&self) -> &F {
        &self.function
    }

    fn state(&self, side: Side) -> &ValueState<Vec<WindowRow>> {
        match side {
            Side::Left => &self.left,
            Side::Right => &self.right,
        }
    }

    /// Adds a batch of input `input` (0 left, 1 right) to its windows and registers their
    /// timers; late records go to [`super::LATE_OUTPUT`]. Emits nothing.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for another input ([`super::Side::of_input`]),
    /// [`crate::ErrorCode::InvalidRecord`] for a record without
    /// timestamp.
    pub fn process(
        &mut self,
        ctx: &mut dyn Context,
        input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let _ = out;
        let side = Side::of_input(input)?;
        if batch.is_empty() {
            return Ok(());
        }
        if !batch.has_timestamps() {
            return Err(PluginError::invalid_record(
                "record 0 has no timestamp: a window join needs records timestamped by the \
                 source",
            ));
        }
        if self.merge.is_some() {
            self.process_sessions(ctx, side, batch);
        } else {
            self.process_fixed(ctx, side, batch);
        }
        Ok(())
    }

    /// Tumbling and sliding windows: per window of the batch, one batched read and write
    /// of its keys' rows and one timer registration.
    fn process_fixed(&mut self, ctx: &mut dyn Context, side: Side, batch: &Batch) {
        let watermark = ctx.current_watermark();
        // (window, key index, record) of every row added.
        let mut adds: Vec<(Window, u32, u32)> = Vec::with_capacity(batch.len());
        let mut late: Vec<u32> = Vec::new();
        let (keys, recs) = group_by_key(batch);
        let mut windows = std::mem::take(&mut self.windows);
        for (kid, idx) in recs.iter().enumerate() {
            for &i in idx {
                windows.clear();
                self.spec
                    .assigner
                    .assign(batch.timestamps[i as usize], &mut windows);
                let before = adds.len();
                for w in &windows {
                    if w.max_timestamp() > watermark {
                        adds.push((*w, kid as u32, i));
                    }
                }
                if adds.len() == before {
                    late.push(i);
                }
            }
        }
        self.windows = windows;
        adds.sort_unstable();
        let state = self.state(side);
        let mut j = 0;
        while j < adds.len() {
            let w = adds[j].0;
            let ns = w.namespace();
            let start = j;
            let mut wkeys: Vec<&[u8]> = Vec::new();
            while j < adds.len() && adds[j].0 == w {
                let k = adds[j].1;
                if wkeys.last() != Some(&keys[k as usize]) {
                    wkeys.push(keys[k as usize]);
                }
                j += 1;
            }
            let stored = state.in_namespace(&ns).get_many(ctx, &wkeys);
            let mut puts: Vec<(&[u8], Vec<WindowRow>)> = Vec::with_capacity(wkeys.len());
            let mut a = start;
            for (key, rows) in wkeys.iter().zip(stored) {
                let mut rows = rows.unwrap_or_default();
                while a < j && keys[adds[a].1 as usize] == *key {
                    let i = adds[a].2 as usize;
                    rows.push(WindowRow {
                        timestamp: batch.timestamps[i],
                        data: batch.record(i).to_vec(),
                    });
                    a += 1;
                }
                puts.push((key, rows));
            }
            state.in_namespace(&ns).put_many(ctx, &puts);
            ctx.register_timers_for_keys(TimeDomain::EventTime, &ns, w.max_timestamp(), &wkeys);
        }
        emit_late(ctx, batch, &late);
    }

    /// Session windows, record by record: merge with the key's overlapping sessions
    /// (moving both sides' rows into the surviving state window), then add the row.
    fn process_sessions(&mut self, ctx: &mut dyn Context, side: Side, batch: &Batch) {
        let watermark = ctx.current_watermark();
        let merge = self
            .merge
            .as_ref()
            .expect("a session join opens its merge state");
        let mut late: Vec<u32> = Vec::new();
        let (keys, recs) = group_by_key(batch);
        let sets = merge.get_many(ctx, &keys);
        let mut puts: Vec<(&[u8], Vec<MergeEntry>)> = Vec::with_capacity(keys.len());
        let mut windows = Vec::with_capacity(1);
        for ((key, idx), set) in keys.iter().zip(&recs).zip(sets) {
            let mut set = set.unwrap_or_default();
            let mut touched = false;
            for &i in idx {
                let ts = batch.timestamps[i as usize];
                windows.clear();
                self.spec.assigner.assign(ts, &mut windows);
                let w = windows[0];
                let overlapping: Vec<usize> = (0..set.len())
                    .filter(|&e| set[e].window.overlaps(&w))
                    .collect();
                let target = if overlapping.is_empty() {
                    if w.max_timestamp() <= watermark {
                        late.push(i);
                        continue;
                    }
                    set.push(MergeEntry {
                        window: w,
                        state: w,
                    });
                    ctx.register_timer(
                        TimeDomain::EventTime,
                        key,
                        &w.namespace(),
                        w.max_timestamp(),
                    );
                    w
                } else {
                    let merged = overlapping
                        .iter()
                        .fold(w, |acc, &e| acc.cover(&set[e].window));
                    let first = set[overlapping[0]];
                    if overlapping.len() > 1 || first.window != merged {
                        for &e in &overlapping {
                            let old = set[e];
                            ctx.delete_timer(
                                TimeDomain::EventTime,
                                key,
                                &old.window.namespace(),
                                old.window.max_timestamp(),
                            );
                            if e != overlapping[0] {
                                for s in [Side::Left, Side::Right] {
                                    self.move_rows(ctx, s, key, old.state, first.state);
                                }
                            }
                        }
                        for &e in overlapping.iter().rev() {
                            set.swap_remove(e);
                        }
                        set.push(MergeEntry {
                            window: merged,
                            state: first.state,
                        });
                        ctx.register_timer(
                            TimeDomain::EventTime,
                            key,
                            &merged.namespace(),
                            merged.max_timestamp(),
                        );
                    }
                    first.state
                };
                touched = true;
                let ns = target.namespace();
                let state = self.state(side).in_namespace(&ns);
                let mut rows = state.get(ctx, key).unwrap_or_default();
                rows.push(WindowRow {
                    timestamp: ts,
                    data: batch.record(i as usize).to_vec(),
                });
                state.put(ctx, key, &rows);
            }
            if touched {
                puts.push((key, set));
            }
        }
        merge.put_many(ctx, &puts);
        emit_late(ctx, batch, &late);
    }

    /// Appends the rows of `side` in state window `from` to those in `to`, and clears
    /// `from`.
    fn move_rows(&self, ctx: &mut dyn Context, side: Side, key: &[u8], from: Window, to: Window) {
        let state = self.state(side);
        let from_ns = from.namespace();
        let Some(moved) = state.in_namespace(&from_ns).get(ctx, key) else {
            return;
        };
        let to_ns = to.namespace();
        let mut rows = state.in_namespace(&to_ns).get(ctx, key).unwrap_or_default();
        rows.extend(moved);
        state.in_namespace(&to_ns).put(ctx, key, &rows);
        state.in_namespace(&from_ns).delete(ctx, key);
    }

    fn fire(
        &mut self,
        key: &[u8],
        window: Window,
        mut left: Vec<WindowRow>,
        mut right: Vec<WindowRow>,
        out: &mut Batch,
    ) -> Result<()> {
        left.sort_unstable();
        right.sort_unstable();
        let l: Vec<Row<'_>> = left.iter().map(WindowRow::row).collect();
        let r: Vec<Row<'_>> = right.iter().map(WindowRow::row).collect();
        let mut o = JoinOutput::new(out, key, Some(window.max_timestamp()));
        self.function
            .join_window(key, window, &l, &r, self.spec.join_type, &mut o)
    }

    /// Fires the windows whose timers came due: per key, both sides' rows of the window
    /// go to [`WindowJoinFunction::join_window`], then are dropped (with the session's
    /// merge-set entry). Timers with a foreign namespace or domain are ignored.
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
            if g.domain != TimeDomain::EventTime {
                continue;
            }
            let Some(w) = Window::from_namespace(&g.namespace) else {
                continue;
            };
            if g.timestamp != w.max_timestamp() {
                continue;
            }
            if let Some(merge) = &self.merge {
                let mut fired: Vec<(&[u8], Vec<WindowRow>, Vec<WindowRow>)> = Vec::new();
                for key in g.iter_keys() {
                    let mut set = merge.get(ctx, key).unwrap_or_default();
                    let Some(pos) = set.iter().position(|e| e.window == w) else {
                        continue;
                    };
                    let ns = set[pos].state.namespace();
                    let left = self
                        .left
                        .in_namespace(&ns)
                        .get(ctx, key)
                        .unwrap_or_default();
                    let right = self
                        .right
                        .in_namespace(&ns)
                        .get(ctx, key)
                        .unwrap_or_default();
                    self.left.in_namespace(&ns).delete(ctx, key);
                    self.right.in_namespace(&ns).delete(ctx, key);
                    set.swap_remove(pos);
                    if set.is_empty() {
                        merge.delete(ctx, key);
                    } else {
                        merge.put(ctx, key, &set);
                    }
                    fired.push((key, left, right));
                }
                for (key, left, right) in fired {
                    self.fire(key, w, left, right, out)?;
                }
            } else {
                let ns = w.namespace();
                let lefts = self
                    .left
                    .in_namespace(&ns)
                    .get_many_flat(ctx, &g.keys, &g.key_ends);
                let rights = self
                    .right
                    .in_namespace(&ns)
                    .get_many_flat(ctx, &g.keys, &g.key_ends);
                self.left
                    .in_namespace(&ns)
                    .delete_many_flat(ctx, &g.keys, &g.key_ends);
                self.right
                    .in_namespace(&ns)
                    .delete_many_flat(ctx, &g.keys, &g.key_ends);
                for (i, (l, r)) in lefts.into_iter().zip(rights).enumerate() {
                    let (l, r) = (l.unwrap_or_default(), r.unwrap_or_default());
                    if l.is_empty() && r.is_empty() {
                        continue;
                    }
                    self.fire(g.key(i), w, l, r, out)?;
                }
            }
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

    /// End of input: nothing to do (the host's final watermark fired every window).
    ///
    /// # Errors
    /// None; the `Result` keeps the hooks of the join operators alike.
    pub fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = (ctx, out);
        Ok(())
    }
}
