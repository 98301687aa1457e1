//! The plugin traits: [`Operator`], [`Source`], [`Sink`], and the shapes they exchange.
//!
//! Implement one of them and export it with [`crate::export_operator!`],
//! [`crate::export_source!`] or [`crate::export_sink!`]. Instances hold no durable state:
//! the host may drop and re-create an instance at any time (design §16); everything that
//! must survive goes to host state through the [`Context`] or, for connectors, to the
//! external system and the cursor / committable returned to the host.

use crate::{Batch, Context, PluginInfo, Result, TaskInfo, TimerGroup};

/// A stream operator: records in, records out, with keyed state and timers in the host.
///
/// Call order per instance: `describe`? → `open` → (`process` | `on_watermark` |
/// `on_timers` | `prepare_checkpoint`)* → `finish`? → `close`.
///
/// Every callback that emits records appends them to `out`, which the SDK hands it empty
/// (pre-sized like the input for `process`). Returning `Err` reports a plugin error: the
/// host applies the job's error policy, and records appended to `out` by that call are
/// discarded. A panic is a trap and fails the task.
pub trait Operator: Sized + 'static {
    /// Describes the plugin; called before `open`, possibly on an unopened instance.
    fn describe() -> PluginInfo;

    /// Creates the instance for one subtask; `config` is the JSON object from the job file
    /// (`{}` if none). Open states here (see [`crate::ValueState::open`]).
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an unusable config.
    fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self>;

    /// Processes one batch that arrived on input `input` (0-based, in job-file order).
    fn process(
        &mut self,
        ctx: &mut dyn Context,
        input: u32,
        batch: &Batch,
        out: &mut Batch,
    ) -> Result<()>;

    /// The subtask's watermark advanced to `watermark` (ms since the Unix epoch); due
    /// event-time timers have already fired through [`Operator::on_timers`]. Default:
    /// emits nothing.
    fn on_watermark(
        &mut self,
        ctx: &mut dyn Context,
        watermark: i64,
        out: &mut Batch,
    ) -> Result<()> {
        let _ = (ctx, watermark, out);
        Ok(())
    }

    /// Timers that came due, grouped per (domain, timestamp, namespace) in timestamp
    /// order ([`TimerGroup`]). Default: emits nothing.
    fn on_timers(
        &mut self,
        ctx: &mut dyn Context,
        timers: &[TimerGroup],
        out: &mut Batch,
    ) -> Result<()> {
        let _ = (ctx, timers, out);
        Ok(())
    }

    /// A checkpoint barrier for `epoch` is about to be taken: write anything cached in the
    /// instance to state and emit records that must precede the barrier. Default: nothing.
    fn prepare_checkpoint(
        &mut self,
        ctx: &mut dyn Context,
        epoch: u64,
        out: &mut Batch,
    ) -> Result<()> {
        let _ = (ctx, epoch, out);
        Ok(())
    }

    /// All inputs ended (bounded job): emit final results. Default: nothing.
    fn finish(&mut self, ctx: &mut dyn Context, out: &mut Batch) -> Result<()> {
        let _ = (ctx, out);
        Ok(())
    }

    /// The instance is being dropped; release resources. Default: nothing.
    fn close(&mut self, ctx: &mut dyn Context) {
        let _ = ctx;
    }
}

/// An independently readable part of a source's input.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Split {
    /// Stable split id, unique within the source (part of the state path).
    pub id: String,
    /// Opaque description the source needs to read the split.
    pub descriptor: Vec<u8>,
}

/// Position reached in a split, for progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Units consumed so far (bytes for file sources).
    pub consumed: u64,
    /// Total units in the split, when known.
    pub total: Option<u64>,
}

/// What one [`Source::read`] reached; the records themselves go to its `out` batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadOutcome {
    /// Exclusive cursor: the position of the first record not yet returned. Reading
    /// again from it never repeats a returned record.
    pub next_cursor: Vec<u8>,
    /// The split holds no record after `next_cursor`.
    pub finished: bool,
    /// Progress within the split.
    pub progress: Progress,
}

/// One stored entry of a state, as [`StateMigration::migrate`] gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    /// The entry's namespace (window, pattern or timer slot; empty for plain keyed state).
    pub namespace: Vec<u8>,
    /// The record key.
    pub key: Vec<u8>,
    /// The value, as the old schema version encoded it.
    pub value: Vec<u8>,
}

/// The optional state migration of an operator (WIT `nop:stream/state-migration`, issue
/// 11): converts the values of one of its states from an older schema version to the one
/// its [`crate::StateDescriptor`] declares now, when a user runs `nopstream savepoint
/// migrate` with a `migrate-state` action. Export it with [`crate::export_state_migration!`]
/// beside [`crate::export_operator!`].
///
/// The host calls it on an instance that was never opened (no state, timers or config),
/// in batches of at most 1024 entries, in (shard, key) order, and converts the first batch
/// twice: a migration must be deterministic.
pub trait StateMigration {
    /// Converts `entries` of `state` from schema `from_version`: one value per entry, in
    /// order; `None` deletes the entry.
    ///
    /// # Errors
    /// A version or value it cannot convert; the migration then fails and writes nothing.
    fn migrate(
        state: &str,
        from_version: u32,
        entries: &[StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>>;
}

/// A source connector: enumerates splits and reads them from exclusive cursors.
pub trait Source: Sized + 'static {
    /// Describes the plugin (kind source, with a source capability).
    fn describe() -> PluginInfo;

    /// Creates the instance; `config` is the JSON object from the job file.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an unusable config.
    fn open(task: &TaskInfo, config: &str) -> Result<Self>;

    /// Enumerates the splits of the input for `parallelism` readers (called once per job
    /// run, on one instance). Split ids must be stable for the same input and config.
    fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>>;

    /// Reads at most `max_records` records of `split` starting at `cursor` (empty: the
    /// split's start), appending them to `out` (handed over empty).
    fn read(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome>;

    /// The instance is being dropped; release resources. Default: nothing.
    fn close(&mut self) {}
}

/// Result of asking the external system about a committable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommitOutcome {
    /// The transaction's effects are visible.
    Committed,
    /// The transaction was rolled back or never existed.
    Aborted,
    /// The outcome cannot be established; the host fails the job.
    Unknown,
}

/// A sink connector with a transactional lifecycle per epoch.
///
/// Transaction ids are `{jobId}:{pipelineId}:{operatorId}:{subtaskIndex}:{epoch}`; the host
/// begins transaction N+1 as soon as N is pre-committed and commits N only after epoch N
/// is durable.
pub trait Sink: Sized + 'static {
    /// Describes the plugin (kind sink, with a sink capability).
    fn describe() -> PluginInfo;

    /// Creates the instance; `config` is the JSON object from the job file.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] for an unusable config.
    fn open(task: &TaskInfo, config: &str) -> Result<Self>;

    /// Starts transaction `txn`.
    fn begin(&mut self, txn: &str) -> Result<()>;

    /// Writes records into transaction `txn`; nothing becomes visible yet.
    fn write(&mut self, txn: &str, batch: &Batch) -> Result<()>;

    /// Flushes and seals `txn` and returns the committable: everything `commit`, `abort`
    /// and `recover` need, stored in the epoch snapshot.
    fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>>;

    /// Makes a pre-committed transaction visible. Must be idempotent.
    fn commit(&mut self, committable: &[u8]) -> Result<()>;

    /// Discards a transaction by id (open or pre-committed); idempotent.
    fn abort(&mut self, txn: &str) -> Result<()>;

    /// Establishes whether a committable's transaction is committed.
    fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome>;

    /// Ids of this subtask's transactions that are begun or pre-committed but neither
    /// committed nor aborted.
    fn pending_transactions(&mut self) -> Result<Vec<String>>;

    /// The instance is being dropped; release resources. Default: nothing.
    fn close(&mut self) {}
}
