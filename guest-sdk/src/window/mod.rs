//! The window operator family: the one window implementation of nop-stream (design §9.1,
//! "only one set of window semantics"), following Apache Flink's `WindowOperator`.
//!
//! A [`WindowOperator`] assigns each record to windows ([`Assigner`]: tumbling, sliding or
//! session), keeps per-(key, window) contents in host keyed state, and fires each window
//! through a timer. What it computes comes from a [`WindowFunction`]:
//!
//! - [`Aggregating`]: an [`AggregateFunction`] folds records into an accumulator kept in
//!   value state; [`Aggregating::reduce`] does the same for a [`ReduceFunction`];
//! - [`Processing`]: a [`ProcessWindowFunction`] gets every record payload of the window
//!   (kept in list state) when it fires;
//! - an aggregate or reduce may be combined with a [`ProcessWindowFunction`] that receives
//!   the single result together with key and window (Flink's
//!   `aggregate(aggFn, windowFn)`); [`EmitResult`] is the pass-through default.
//!
//! # Time, windows, timestamps
//!
//! All times are milliseconds since the Unix epoch. A [`Window`] is `[start, end)`; its
//! max timestamp is `end - 1`. In [`TimeMode::Event`] a record's time is its batch
//! timestamp ([`crate::Batch::timestamp`], set by the source); a record without one is an
//! [`crate::ErrorCode::InvalidRecord`] error. In [`TimeMode::Processing`] every record of a
//! batch gets [`crate::Context::current_processing_time`] and windows fire on
//! processing-time timers. Every emitted record carries key = the window's key and
//! timestamp = the window's max timestamp. Unkeyed input is treated as one key, the empty
//! key.
//!
//! # Firing, lateness, cleanup (Flink semantics)
//!
//! Session merging differs from Flink on purpose: see "Sessions merge only when they
//! overlap" below.
//!
//! - Event time: a window fires when the watermark reaches its max timestamp, through an
//!   event-time timer at that time per (key, window). At the end of bounded input the host
//!   advances the watermark to `i64::MAX`, so every window fires.
//! - A window is *expired* once `max_ts + allowed_lateness <= watermark`. Records assigned
//!   only to expired windows are *late*: they go unchanged (payload, key, timestamp) to the
//!   side output [`LATE_OUTPUT`], which the plugin must declare with
//!   [`crate::PluginInfo::side_output`]. A record's expired windows are skipped, its other
//!   windows updated.
//! - A record for a window that already fired but has not expired updates the window and
//!   fires it again at once (a late firing: an updated result for the same window).
//! - A cleanup timer at `max_ts + allowed_lateness` clears the window's accumulator,
//!   contents and merge-set entry, so state does not grow without bound. With zero allowed
//!   lateness (the default) firing and cleanup are the same timer.
//! - Processing time: no record is late; a window fires and is cleared at its max
//!   timestamp. Processing-time windows still open when bounded input ends are not fired
//!   (as in Flink); use event time for deterministic results (design §8.4).
//!
//! # State layout
//!
//! Everything durable is in host state and timers (design §8.4, §9.1). Without the
//! accumulator cache the instance keeps nothing between calls, so it may be dropped after
//! any call and a fresh one opened on the restored state; with it, after any
//! `prepare_checkpoint` (see below). See [`state_descriptors`]:
//!
//! | state | kind | namespace | key | value |
//! |---|---|---|---|---|
//! | [`ACC_STATE`] `window-acc` | value (postcard) | state window | record key | accumulator |
//! | [`CONTENTS_STATE`] `window-contents` | list (raw bytes) | state window | record key | record payloads |
//! | [`MERGE_STATE`] `window-merge` | value (postcard) | empty | record key | merge set (sessions) |
//!
//! Namespaces are [`Window::namespace`]: 16 bytes, start then end, each an order-preserving
//! big-endian `i64` (sign bit flipped). Timers use the window's own namespace.
//!
//! # Accumulator cache
//!
//! [`WindowOperator::cached`] turns on a write-back cache for an [`Aggregating`] function
//! over tumbling or sliding event-time windows with zero allowed lateness (the shape of
//! Nexmark q5 and of most dashboards). A record is then folded into an accumulator per
//! (key, window) held in the instance: no state access and no timer per record, where
//! without it each batch reads and writes every (key, window) it touches and registers
//! its timers. When the watermark reaches a window's max timestamp
//! ([`WindowOperator::on_watermark`]) the window fires from the cache, keys ascending,
//! and is dropped.
//!
//! [`WindowOperator::flush`], called from `prepare_checkpoint` (and `finish`), merges
//! every cached accumulator into [`ACC_STATE`] ([`AggregateFunction::merge`]) and
//! registers the (key, window) timer at the window's max timestamp, the layout and
//! timers of the uncached operator. So at every barrier state and timers are exact: a
//! restore, a savepoint, a rescale or a plugin swap sees what the uncached operator would
//! have written, and the cache needs no state of its own. The cache is also flushed
//! between checkpoints once it holds [`MAX_CACHED_ENTRIES`] entries or
//! [`MAX_CACHED_KEY_BYTES`] of keys, which bounds the guest memory it takes.
//!
//! A window whose keys were partly flushed fires once, when its host timers come due:
//! each flushed key's stored accumulator is merged with what the cache added since, in
//! one ascending key order with the keys only in the cache. Cached windows due earlier
//! fire before it, so output order is the uncached operator's: windows by max timestamp,
//! keys ascending. The result equals the uncached one when `merge(acc, other)` of an
//! accumulator and a newer one agrees with adding the newer records to `acc`, as Flink
//! asks of its `AggregateFunction`.
//!
//! # Merging (session) windows
//!
//! The merge set of a key is a list of [`MergeEntry`] (window → state window: the
//! namespace holding that window's contents), as Flink's `MergingWindowSet`. A new record's
//! window `[ts, ts + gap)` merges with every window it *overlaps* ([`Window::overlaps`]);
//! the merged window keeps the state window of one of the merged windows, the other
//! windows' accumulators are merged into it with [`AggregateFunction::merge`] (or their
//! contents lists concatenated) and cleared, their timers deleted and the merged window's
//! timers registered.
//!
//! ## Sessions merge only when they overlap (a deliberate difference from Flink)
//!
//! Windows are half-open, `[start, end)`, and two sessions merge only when they share a
//! millisecond. Windows that merely *touch* (`a.end == b.start`) stay apart: with gap `g`,
//! records of one key at `t` and `t + g` are two sessions, `[t, t + g)` and
//! `[t + g, t + 2g)`. A session holds records less than `g` apart; a pause of `g` or more
//! ends it.
//!
//! Flink merges touching windows (`TimeWindow.intersects`), so there `t` and `t + g` are
//! one session `[t, t + 2g)`. That rule cannot be kept deterministic: the first session
//! fires when the watermark reaches its max timestamp `t + g - 1`, which allows a record
//! at `t + g` to arrive afterwards, so whether the two merge depends on whether the
//! watermark passed `t + g - 1` before that record was processed — on batch boundaries,
//! on which keys share a subtask, on the parallelism and on where a recovery resumed.
//!
//! With the overlap rule, a record that may still arrive, `ts > watermark`, cannot overlap
//! a session that has fired (its end is at most `watermark + 1 <= ts`), and every session
//! it does overlap is still open. So as long as no record arrives behind the watermark,
//! the sessions of a key are exactly the connected components of the overlap graph of its
//! records' windows `[ts, ts + gap)`: the same for every order of arrival, batch split,
//! parallelism and restore. Records behind the watermark (`ts <= watermark`, out-of-order
//! input beyond the source's bound, or within allowed lateness) merge into what is still in
//! state when they arrive, as in Flink, and so depend on watermark progress.

mod cache;
mod function;
mod operator;
#[cfg(test)]
mod tests;

pub use cache::{MAX_CACHED_ENTRIES, MAX_CACHED_KEY_BYTES};
pub use function::{
    AggregateFunction, Aggregating, EmitResult, KeyGroup, ProcessWindowFunction, Processing,
    ReduceAggregate, ReduceFunction, WindowFunction, WindowOutput,
};
pub use operator::{MergeEntry, WindowOperator};

use serde::{Deserialize, Serialize};

use crate::{StateDescriptor, StateKind};

/// Name of the side output late records go to.
pub const LATE_OUTPUT: &str = "late";
/// Value state of the accumulators ([`Aggregating`]), per (key, state window).
pub const ACC_STATE: &str = "window-acc";
/// List state of the record payloads ([`Processing`]), per (key, state window).
pub const CONTENTS_STATE: &str = "window-contents";
/// Value state of the merge sets (session windows), per key, empty namespace.
pub const MERGE_STATE: &str = "window-merge";
/// Schema version of [`CONTENTS_STATE`] and [`MERGE_STATE`].
pub const WINDOW_STATE_SCHEMA: u32 = 1;
/// Codec name of [`CONTENTS_STATE`]: each list element is a record payload as is.
pub const RAW_BYTES: &str = "bytes";

/// A time window `[start, end)` in ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    /// First millisecond in the window.
    pub start: i64,
    /// First millisecond after the window.
    pub end: i64,
}

#[inline]
fn ordered(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

impl Window {
    /// The window `[start, end)`.
    pub const fn new(start: i64, end: i64) -> Self {
        Window { start, end }
    }

    /// The last millisecond in the window, `end - 1`; timestamp of its results.
    #[inline]
    pub const fn max_timestamp(&self) -> i64 {
        self.end.saturating_sub(1)
    }

    /// The state / timer namespace of the window: 16 bytes, start then end, each as
    /// big-endian `i64` with the sign bit flipped (so bytes sort like the numbers).
    #[inline]
    pub fn namespace(&self) -> [u8; 16] {
        let mut ns = [0u8; 16];
        ns[..8].copy_from_slice(&ordered(self.start));
        ns[8..].copy_from_slice(&ordered(self.end));
        ns
    }

    /// Decodes a [`Window::namespace`]; `None` unless `ns` is 16 bytes.
    pub fn from_namespace(ns: &[u8]) -> Option<Window> {
        let ns: &[u8; 16] = ns.try_into().ok()?;
        let read = |b: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            (u64::from_be_bytes(a) ^ (1 << 63)) as i64
        };
        Some(Window::new(read(&ns[..8]), read(&ns[8..])))
    }

    /// Whether the half-open windows share at least one millisecond. Windows that only
    /// touch (`self.end == other.start`) do not overlap; this is the session merge rule,
    /// unlike Flink's `TimeWindow.intersects` (see the [module docs](self), "Sessions
    /// merge only when they overlap").
    pub const fn overlaps(&self, other: &Window) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// The smallest window covering both.
    pub fn cover(&self, other: &Window) -> Window {
        Window::new(self.start.min(other.start), self.end.max(other.end))
    }
}

/// How records are assigned to windows. Sizes are ms and must be positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Assigner {
    /// Back-to-back windows of `size`: `ts` goes to the one window with
    /// `start = ts - (ts - offset) mod size`.
    Tumbling {
        /// Window length (ms, > 0).
        size: i64,
        /// Shift of the window grid (ms, `|offset| < size`, default 0).
        offset: i64,
    },
    /// Windows of `size` starting every `slide`: `ts` goes to `ceil(size / slide)` windows
    /// (fewer when `size` is not a multiple of `slide`).
    Sliding {
        /// Window length (ms, > 0).
        size: i64,
        /// Distance between window starts (ms, > 0).
        slide: i64,
        /// Shift of the window grid (ms, `|offset| < slide`, default 0).
        offset: i64,
    },
    /// Merging windows: `ts` goes to `[ts, ts + gap)`, merged with every overlapping
    /// window of the same key (touching windows stay apart, unlike Flink: see the
    /// [module docs](self)).
    Session {
        /// Inactivity gap (ms, > 0).
        gap: i64,
    },
}

impl Assigner {
    /// Whether windows merge (sessions).
    pub const fn is_merging(&self) -> bool {
        matches!(self, Assigner::Session { .. })
    }

    /// Appends the windows of a record at `ts` to `out` (latest start first for sliding
    /// windows, like Flink).
    pub fn assign(&self, ts: i64, out: &mut Vec<Window>) {
        match *self {
            Assigner::Tumbling { size, offset } => {
                let start = ts - (ts - offset).rem_euclid(size);
                out.push(Window::new(start, start.saturating_add(size)));
            }
            Assigner::Sliding {
                size,
                slide,
                offset,
            } => {
                let last = ts - (ts - offset).rem_euclid(slide);
                let mut start = last;
                while start > ts.saturating_sub(size) {
                    out.push(Window::new(start, start.saturating_add(size)));
                    start -= slide;
                }
            }
            Assigner::Session { gap } => out.push(Window::new(ts, ts.saturating_add(gap))),
        }
    }
}

/// Which clock drives the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeMode {
    /// Record timestamps and the watermark (default).
    #[default]
    Event,
    /// The host's wall clock at processing.
    Processing,
}

/// What the window computes, as far as state and the plan model care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionKind {
    /// Incremental [`AggregateFunction`] (accumulator per window).
    Aggregate,
    /// Incremental [`ReduceFunction`] (one value per window).
    Reduce,
    /// [`ProcessWindowFunction`] over all records of the window.
    Process,
}

impl FunctionKind {
    /// The model name: `aggregate`, `reduce` or `process`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FunctionKind::Aggregate => "aggregate",
            FunctionKind::Reduce => "reduce",
            FunctionKind::Process => "process",
        }
    }
}

/// A complete, validated window definition. It is the semantic model of the operator:
/// [`WindowSpec::to_model_json`] goes into [`crate::PluginInfo::model`] and so into the
/// plan fingerprint (design §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowSpec {
    /// Window assignment.
    pub assigner: Assigner,
    /// Clock.
    pub time: TimeMode,
    /// How long (ms, >= 0) after a window's max timestamp late records still update it
    /// (event time only; default 0).
    pub allowed_lateness_ms: i64,
    /// What is computed per window.
    pub function: FunctionKind,
}

impl WindowSpec {
    /// Event-time tumbling windows of `size_ms`, zero lateness, aggregate function.
    pub const fn tumbling(size_ms: i64) -> Self {
        Self::with(Assigner::Tumbling {
            size: size_ms,
            offset: 0,
        })
    }

    /// Event-time sliding windows of `size_ms` every `slide_ms`, zero lateness,
    /// aggregate function.
    pub const fn sliding(size_ms: i64, slide_ms: i64) -> Self {
        Self::with(Assigner::Sliding {
            size: size_ms,
            slide: slide_ms,
            offset: 0,
        })
    }

    /// Event-time session windows with `gap_ms`, zero lateness, aggregate function. Records
    /// of a key less than `gap_ms` apart share a session; records exactly `gap_ms` apart do
    /// not (sessions merge only when they overlap, see the [module docs](self)).
    pub const fn session(gap_ms: i64) -> Self {
        Self::with(Assigner::Session { gap: gap_ms })
    }

    const fn with(assigner: Assigner) -> Self {
        WindowSpec {
            assigner,
            time: TimeMode::Event,
            allowed_lateness_ms: 0,
            function: FunctionKind::Aggregate,
        }
    }

    /// The same spec in processing time.
    pub const fn processing_time(mut self) -> Self {
        self.time = TimeMode::Processing;
        self
    }

    /// The same spec with `ms` of allowed lateness.
    pub const fn allowed_lateness(mut self, ms: i64) -> Self {
        self.allowed_lateness_ms = ms;
        self
    }

    /// Checks sizes and offsets.
    ///
    /// # Errors
    /// A message naming the bad config field (`size_ms`, `slide_ms`, `gap_ms`,
    /// `offset_ms`, `allowed_lateness_ms`) and its value.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: i64| {
            if v > 0 {
                Ok(())
            } else {
                Err(format!(
                    "window.{name} must be a positive number of ms, got {v}"
                ))
            }
        };
        match self.assigner {
            Assigner::Tumbling { size, offset } => {
                positive("size_ms", size)?;
                if offset.unsigned_abs() >= size.unsigned_abs() {
                    return Err(format!(
                        "window.offset_ms must be smaller than size_ms in magnitude, got {offset}"
                    ));
                }
            }
            Assigner::Sliding {
                size,
                slide,
                offset,
            } => {
                positive("size_ms", size)?;
                positive("slide_ms", slide)?;
                if offset.unsigned_abs() >= slide.unsigned_abs() {
                    return Err(format!(
                        "window.offset_ms must be smaller than slide_ms in magnitude, got {offset}"
                    ));
                }
            }
            Assigner::Session { gap } => positive("gap_ms", gap)?,
        }
        if self.allowed_lateness_ms < 0 {
            return Err(format!(
                "window.allowed_lateness_ms must be >= 0, got {}",
                self.allowed_lateness_ms
            ));
        }
        Ok(())
    }

    /// Whether event time drives the windows.
    pub const fn is_event_time(&self) -> bool {
        matches!(self.time, TimeMode::Event)
    }

    /// The time at which a window's state is cleared: `max_ts + allowed_lateness` in event
    /// time, `max_ts` in processing time (saturating).
    pub const fn cleanup_time(&self, w: &Window) -> i64 {
        match self.time {
            TimeMode::Event => w.max_timestamp().saturating_add(self.allowed_lateness_ms),
            TimeMode::Processing => w.max_timestamp(),
        }
    }

    /// The model JSON, with a fixed field order: `{"operator":"window","assigner":
    /// "tumbling"|"sliding"|"session","size_ms":…,"slide_ms":…,"offset_ms":…,"gap_ms":…,
    /// "time":"event"|"processing","allowed_lateness_ms":…,"function":…}` (only the fields
    /// of the assigner).
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
        let time = match self.time {
            TimeMode::Event => "event",
            TimeMode::Processing => "processing",
        };
        format!(
            r#"{{"operator":"window",{assigner},"time":"{time}","allowed_lateness_ms":{},"function":"{}"}}"#,
            self.allowed_lateness_ms,
            self.function.as_str()
        )
    }
}

/// Kind of assigner in a [`WindowConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignerKind {
    /// [`Assigner::Tumbling`].
    Tumbling,
    /// [`Assigner::Sliding`].
    Sliding,
    /// [`Assigner::Session`].
    Session,
}

/// The job-file form of a window: `{ "kind": "tumbling"|"sliding"|"session", "size_ms",
/// "slide_ms", "gap_ms", "offset_ms", "time": "event"|"processing",
/// "allowed_lateness_ms" }`. Deserialize it with serde (unknown fields are refused), then
/// call [`WindowConfig::to_spec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowConfig {
    /// Assigner kind.
    pub kind: AssignerKind,
    /// Window length in ms (tumbling, sliding).
    #[serde(default)]
    pub size_ms: Option<i64>,
    /// Slide in ms (sliding).
    #[serde(default)]
    pub slide_ms: Option<i64>,
    /// Gap in ms (session).
    #[serde(default)]
    pub gap_ms: Option<i64>,
    /// Grid offset in ms (tumbling, sliding); default 0.
    #[serde(default)]
    pub offset_ms: Option<i64>,
    /// Clock; default `event`.
    #[serde(default)]
    pub time: TimeMode,
    /// Allowed lateness in ms; default 0.
    #[serde(default)]
    pub allowed_lateness_ms: i64,
}

impl WindowConfig {
    /// The validated spec for a window computing `function`.
    ///
    /// # Errors
    /// A message naming the missing, superfluous or invalid field (e.g.
    /// `window.slide_ms is required for sliding windows`).
    pub fn to_spec(&self, function: FunctionKind) -> Result<WindowSpec, String> {
        let need = |name: &str, v: Option<i64>| {
            v.ok_or_else(|| format!("window.{name} is required for {:?} windows", self.kind))
        };
        let refuse = |name: &str, v: Option<i64>| match v {
            Some(_) => Err(format!(
                "window.{name} does not apply to {:?} windows",
                self.kind
            )),
            None => Ok(()),
        };
        let offset = self.offset_ms.unwrap_or(0);
        let assigner = match self.kind {
            AssignerKind::Tumbling => {
                refuse("slide_ms", self.slide_ms)?;
                refuse("gap_ms", self.gap_ms)?;
                Assigner::Tumbling {
                    size: need("size_ms", self.size_ms)?,
                    offset,
                }
            }
            AssignerKind::Sliding => {
                refuse("gap_ms", self.gap_ms)?;
                Assigner::Sliding {
                    size: need("size_ms", self.size_ms)?,
                    slide: need("slide_ms", self.slide_ms)?,
                    offset,
                }
            }
            AssignerKind::Session => {
                refuse("size_ms", self.size_ms)?;
                refuse("slide_ms", self.slide_ms)?;
                refuse("offset_ms", self.offset_ms)?;
                Assigner::Session {
                    gap: need("gap_ms", self.gap_ms)?,
                }
            }
        };
        let spec = WindowSpec {
            assigner,
            time: self.time,
            allowed_lateness_ms: self.allowed_lateness_ms,
            function,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// The states a window operator computing `function` may open, to declare in
/// `describe()`: [`ACC_STATE`] (postcard, `acc_schema_version`: bump it when the
/// accumulator type changes) for aggregate / reduce, or [`CONTENTS_STATE`] (raw bytes) for
/// process; plus [`MERGE_STATE`] (postcard) used by session windows.
pub fn state_descriptors(function: FunctionKind, acc_schema_version: u32) -> Vec<StateDescriptor> {
    let contents = match function {
        FunctionKind::Aggregate | FunctionKind::Reduce => StateDescriptor::new(
            ACC_STATE,
            StateKind::Value,
            acc_schema_version,
            crate::POSTCARD,
        ),
        FunctionKind::Process => StateDescriptor::new(
            CONTENTS_STATE,
            StateKind::List,
            WINDOW_STATE_SCHEMA,
            RAW_BYTES,
        ),
    };
    vec![
        contents,
        StateDescriptor::new(
            MERGE_STATE,
            StateKind::Value,
            WINDOW_STATE_SCHEMA,
            crate::POSTCARD,
        ),
    ]
}
