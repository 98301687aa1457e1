//! The glue the export macros expand to: generic `Guest` implementations per world that
//! keep the plugin instance in a per-component cell and convert between the generated
//! WIT types and the SDK's types (moving buffers, never copying records).

use crate::host::HostContext;
use crate::wit::operator::exports::nop::stream::operator_plugin as wop;
use crate::wit::operator::nop::stream::operator_state as wopstate;
use crate::wit::operator::nop::stream::{timers as wtimers, types as wt};
use crate::wit::sink::exports::nop::stream::sink_plugin as wsink;
use crate::wit::source::exports::nop::stream::source_plugin as wsrc;
use crate::wit::state_declarer::exports::nop::stream::state_declarations as wdecl;
use crate::wit::state_migrator::exports::nop::stream::state_migration as wmig;
use crate::{
    Batch, CommitOutcome, ErrorCode, Operator, PluginError, PluginInfo, PluginKind, Result, Sink,
    SinkCapability, Source, SourceCapability, Split, StateDescriptor, StateEntry, StateKind,
    StateMigration, TaskInfo, TimeDomain, TimerGroup,
};
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

thread_local! {
    /// The one plugin instance of this component, created by `open`, dropped by `close`.
    static INSTANCE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

fn with_instance<T: 'static, R>(f: impl FnOnce(&mut T) -> Result<R>) -> Result<R> {
    INSTANCE.with_borrow_mut(
        |slot| match slot.as_mut().and_then(|b| b.downcast_mut::<T>()) {
            Some(instance) => f(instance),
            None => Err(PluginError::internal(
                "plugin called before a successful open",
            )),
        },
    )
}

fn take_instance<T: 'static>() -> Option<T> {
    INSTANCE
        .take()
        .and_then(|b| b.downcast::<T>().ok())
        .map(|b| *b)
}

fn set_instance<T: 'static>(instance: T) {
    INSTANCE.set(Some(Box::new(instance)));
}

// ---- conversions ----------------------------------------------------------------------

/// Moves the buffers of a WIT batch into a [`Batch`].
pub fn batch_from_wit(b: wt::Batch) -> Batch {
    Batch {
        data: b.data,
        ends: b.ends,
        keys: b.keys,
        key_ends: b.key_ends,
        timestamps: b.timestamps,
    }
}

/// Moves the buffers of a [`Batch`] into a WIT batch.
pub fn batch_to_wit(b: Batch) -> wt::Batch {
    wt::Batch {
        data: b.data,
        ends: b.ends,
        keys: b.keys,
        key_ends: b.key_ends,
        timestamps: b.timestamps,
    }
}

/// A [`PluginError`] as the WIT `error` record.
pub fn error_to_wit(e: PluginError) -> wt::Error {
    wt::Error {
        code: match e.code {
            ErrorCode::InvalidConfig => wt::ErrorCode::InvalidConfig,
            ErrorCode::InvalidRecord => wt::ErrorCode::InvalidRecord,
            ErrorCode::Io => wt::ErrorCode::Io,
            ErrorCode::State => wt::ErrorCode::State,
            ErrorCode::Transaction => wt::ErrorCode::Transaction,
            ErrorCode::Internal => wt::ErrorCode::Internal,
        },
        message: e.message,
    }
}

fn state_to_wit(s: StateDescriptor) -> wt::StateDescriptor {
    wt::StateDescriptor {
        name: s.name,
        kind: match s.kind {
            StateKind::Value => wt::StateKind::Value,
            StateKind::List => wt::StateKind::List,
            StateKind::Map => wt::StateKind::Map,
        },
        schema_version: s.schema_version,
        codec: s.codec,
    }
}

/// A [`PluginInfo`] as the WIT `plugin-info` record.
pub fn info_to_wit(i: PluginInfo) -> wt::PluginInfo {
    wt::PluginInfo {
        name: i.name,
        version: i.version,
        kind: match i.kind {
            PluginKind::Operator => wt::PluginKind::Operator,
            PluginKind::Source => wt::PluginKind::Source,
            PluginKind::Sink => wt::PluginKind::Sink,
        },
        description: i.description,
        states: i.states.into_iter().map(state_to_wit).collect(),
        source_capability: i.source_capability.map(|c| match c {
            SourceCapability::Replayable => wt::SourceCapability::Replayable,
            SourceCapability::TransactionalRead => wt::SourceCapability::TransactionalRead,
            SourceCapability::AtLeastOnce => wt::SourceCapability::AtLeastOnce,
            SourceCapability::BestEffort => wt::SourceCapability::BestEffort,
        }),
        sink_capability: i.sink_capability.map(|c| match c {
            SinkCapability::TwoPhaseCommit => wt::SinkCapability::TwoPhaseCommit,
            SinkCapability::StagedAtomicCommit => wt::SinkCapability::StagedAtomicCommit,
            SinkCapability::OutboxEpochLog => wt::SinkCapability::OutboxEpochLog,
            SinkCapability::Idempotent => wt::SinkCapability::Idempotent,
            SinkCapability::UpsertByKey => wt::SinkCapability::UpsertByKey,
            SinkCapability::AtLeastOnce => wt::SinkCapability::AtLeastOnce,
            SinkCapability::BestEffort => wt::SinkCapability::BestEffort,
        }),
        config_schema: i.config_schema,
        side_outputs: i.side_outputs,
        model: i.model,
    }
}

/// The WIT `task-info` record as a [`TaskInfo`].
pub fn task_from_wit(t: wt::TaskInfo) -> TaskInfo {
    TaskInfo {
        job_id: t.job_id,
        pipeline_id: t.pipeline_id,
        operator_id: t.operator_id,
        operator_name: t.operator_name,
        subtask_index: t.subtask_index,
        parallelism: t.parallelism,
        attempt: t.attempt,
    }
}

fn timers_from_wit(g: wtimers::TimerGroup) -> TimerGroup {
    TimerGroup {
        domain: match g.domain {
            wtimers::TimeDomain::EventTime => TimeDomain::EventTime,
            wtimers::TimeDomain::ProcessingTime => TimeDomain::ProcessingTime,
        },
        timestamp: g.timestamp,
        namespace: g.namespace,
        keys: g.keys,
        key_ends: g.key_ends,
    }
}

// ---- operator -------------------------------------------------------------------------

/// `Guest` of the `operator` world for operator type `T`; see [`crate::export_operator!`].
pub struct OperatorExport<T>(PhantomData<T>);

/// Compile-time check used by [`crate::export_operator!`] on native targets.
pub fn assert_operator<T: Operator>() {}

/// Compile-time check behind [`crate::export_state_migration!`] off wasm32.
pub fn assert_state_migration<T: StateMigration>() {}

/// The `state-declarations` export of operator `T` (`0.2.1`): the operator states and
/// keyed-state schemas of `T::describe()`.
pub struct DeclarationsExport<T>(PhantomData<T>);

impl<T: Operator> wdecl::Guest for DeclarationsExport<T> {
    fn declare() -> wdecl::Declarations {
        let info = T::describe();
        wdecl::Declarations {
            operator_states: info
                .operator_states
                .into_iter()
                .map(|d| wopstate::OperatorStateDescriptor {
                    name: d.name,
                    schema_version: d.schema_version,
                    codec: d.codec,
                    redistribution: match d.redistribution {
                        crate::Redistribution::SplitRegistry => {
                            wopstate::Redistribution::SplitRegistry
                        }
                        crate::Redistribution::Union => wopstate::Redistribution::Union,
                        crate::Redistribution::Broadcast => wopstate::Redistribution::Broadcast,
                        crate::Redistribution::None => wopstate::Redistribution::None,
                    },
                    schema: d.schema,
                })
                .collect(),
            keyed_schemas: info
                .states
                .into_iter()
                .filter_map(|s| {
                    Some(wdecl::StateSchema {
                        schema: s.schema?,
                        state: s.name,
                    })
                })
                .collect(),
        }
    }
}

/// The `state-migration` export of a [`StateMigration`] type.
pub struct MigrationExport<T>(PhantomData<T>);

impl<T: StateMigration> wmig::Guest for MigrationExport<T> {
    fn migrate(
        state: String,
        from_version: u32,
        entries: Vec<wmig::StateEntry>,
    ) -> core::result::Result<Vec<Option<Vec<u8>>>, wt::Error> {
        let entries: Vec<StateEntry> = entries
            .into_iter()
            .map(|e| StateEntry {
                namespace: e.namespace,
                key: e.key,
                value: e.value,
            })
            .collect();
        T::migrate(&state, from_version, &entries).map_err(error_to_wit)
    }
}

fn emit<T: Operator>(
    out: Batch,
    f: impl FnOnce(&mut T, &mut Batch) -> Result<()>,
) -> core::result::Result<wt::Batch, wt::Error> {
    let mut out = out;
    with_instance::<T, ()>(|op| f(op, &mut out)).map_err(error_to_wit)?;
    Ok(batch_to_wit(out))
}

impl<T: Operator> wop::Guest for OperatorExport<T> {
    fn describe() -> wt::PluginInfo {
        info_to_wit(T::describe())
    }

    fn open(task: wt::TaskInfo, config: String) -> core::result::Result<(), wt::Error> {
        let task = task_from_wit(task);
        let instance = T::open(&mut HostContext, &task, &config).map_err(error_to_wit)?;
        set_instance(instance);
        Ok(())
    }

    fn process(input: u32, records: wt::Batch) -> core::result::Result<wt::Batch, wt::Error> {
        let batch = batch_from_wit(records);
        let out = Batch::with_capacity(batch.len(), batch.data.len());
        emit::<T>(out, |op, out| {
            op.process(&mut HostContext, input, &batch, out)
        })
    }

    fn on_watermark(watermark: i64) -> core::result::Result<wt::Batch, wt::Error> {
        emit::<T>(Batch::new(), |op, out| {
            op.on_watermark(&mut HostContext, watermark, out)
        })
    }

    fn on_timers(timers: Vec<wtimers::TimerGroup>) -> core::result::Result<wt::Batch, wt::Error> {
        let timers: Vec<TimerGroup> = timers.into_iter().map(timers_from_wit).collect();
        emit::<T>(Batch::new(), |op, out| {
            op.on_timers(&mut HostContext, &timers, out)
        })
    }

    fn prepare_checkpoint(epoch: u64) -> core::result::Result<wt::Batch, wt::Error> {
        emit::<T>(Batch::new(), |op, out| {
            op.prepare_checkpoint(&mut HostContext, epoch, out)
        })
    }

    fn finish() -> core::result::Result<wt::Batch, wt::Error> {
        emit::<T>(Batch::new(), |op, out| op.finish(&mut HostContext, out))
    }

    fn close() {
        if let Some(mut op) = take_instance::<T>() {
            op.close(&mut HostContext);
        }
    }
}

// ---- source ---------------------------------------------------------------------------

/// `Guest` of the `source` world for source type `T`; see [`crate::export_source!`].
pub struct SourceExport<T>(PhantomData<T>);

/// Compile-time check used by [`crate::export_source!`] on native targets.
pub fn assert_source<T: Source>() {}

/// Upper bound of the record capacity reserved for one `read`'s output.
const READ_RESERVE_RECORDS: u32 = 4096;

impl<T: Source> wsrc::Guest for SourceExport<T> {
    fn describe() -> wt::PluginInfo {
        info_to_wit(T::describe())
    }

    fn open(task: wt::TaskInfo, config: String) -> core::result::Result<(), wt::Error> {
        let task = task_from_wit(task);
        let instance = T::open(&task, &config).map_err(error_to_wit)?;
        set_instance(instance);
        Ok(())
    }

    fn discover_splits(parallelism: u32) -> core::result::Result<Vec<wsrc::Split>, wt::Error> {
        let splits =
            with_instance::<T, _>(|s| s.discover_splits(parallelism)).map_err(error_to_wit)?;
        Ok(splits
            .into_iter()
            .map(|s| wsrc::Split {
                id: s.id,
                descriptor: s.descriptor,
            })
            .collect())
    }

    fn read(
        split: wsrc::Split,
        cursor: Vec<u8>,
        max_records: u32,
    ) -> core::result::Result<wsrc::ReadResult, wt::Error> {
        let split = Split {
            id: split.id,
            descriptor: split.descriptor,
        };
        let mut out = Batch::with_capacity(max_records.min(READ_RESERVE_RECORDS) as usize, 0);
        let outcome = with_instance::<T, _>(|s| s.read(&split, &cursor, max_records, &mut out))
            .map_err(error_to_wit)?;
        Ok(wsrc::ReadResult {
            records: batch_to_wit(out),
            next_cursor: outcome.next_cursor,
            finished: outcome.finished,
            progress: wsrc::Progress {
                consumed: outcome.progress.consumed,
                total: outcome.progress.total,
            },
        })
    }

    fn close() {
        if let Some(mut s) = take_instance::<T>() {
            s.close();
        }
    }
}

// ---- sink -----------------------------------------------------------------------------

/// `Guest` of the `sink` world for sink type `T`; see [`crate::export_sink!`].
pub struct SinkExport<T>(PhantomData<T>);

/// Compile-time check used by [`crate::export_sink!`] on native targets.
pub fn assert_sink<T: Sink>() {}

impl<T: Sink> wsink::Guest for SinkExport<T> {
    fn describe() -> wt::PluginInfo {
        info_to_wit(T::describe())
    }

    fn open(task: wt::TaskInfo, config: String) -> core::result::Result<(), wt::Error> {
        let task = task_from_wit(task);
        let instance = T::open(&task, &config).map_err(error_to_wit)?;
        set_instance(instance);
        Ok(())
    }

    fn begin(txn: String) -> core::result::Result<(), wt::Error> {
        with_instance::<T, _>(|s| s.begin(&txn)).map_err(error_to_wit)
    }

    fn write(txn: String, records: wt::Batch) -> core::result::Result<(), wt::Error> {
        let batch = batch_from_wit(records);
        with_instance::<T, _>(|s| s.write(&txn, &batch)).map_err(error_to_wit)
    }

    fn pre_commit(txn: String) -> core::result::Result<Vec<u8>, wt::Error> {
        with_instance::<T, _>(|s| s.pre_commit(&txn)).map_err(error_to_wit)
    }

    fn commit(committable: Vec<u8>) -> core::result::Result<(), wt::Error> {
        with_instance::<T, _>(|s| s.commit(&committable)).map_err(error_to_wit)
    }

    fn abort(txn: String) -> core::result::Result<(), wt::Error> {
        with_instance::<T, _>(|s| s.abort(&txn)).map_err(error_to_wit)
    }

    fn recover(committable: Vec<u8>) -> core::result::Result<wsink::CommitOutcome, wt::Error> {
        let outcome = with_instance::<T, _>(|s| s.recover(&committable)).map_err(error_to_wit)?;
        Ok(match outcome {
            CommitOutcome::Committed => wsink::CommitOutcome::Committed,
            CommitOutcome::Aborted => wsink::CommitOutcome::Aborted,
            CommitOutcome::Unknown => wsink::CommitOutcome::Unknown,
        })
    }

    fn pending_transactions() -> core::result::Result<Vec<String>, wt::Error> {
        with_instance::<T, _>(|s| s.pending_transactions()).map_err(error_to_wit)
    }

    fn close() {
        if let Some(mut s) = take_instance::<T>() {
            s.close();
        }
    }
}

// ---- macros ---------------------------------------------------------------------------

/// Exports an [`Operator`] type as the component's `operator` world.
///
/// Use once per plugin crate (a `cdylib` built for `wasm32-wasip2`):
/// `nop_stream_sdk::export_operator!(MyOperator);`. The instance is created by `open` and
/// kept until `close`; calls before a successful `open` return an `internal` error.
/// On other targets the macro only checks that the type implements [`Operator`], so the
/// crate still builds and unit-tests natively.
#[macro_export]
macro_rules! export_operator {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __NopStreamOperatorExport = $crate::__private::OperatorExport<$ty>;
            $crate::wit::operator::export!(
                __NopStreamOperatorExport with_types_in $crate::wit::operator
            );
            type __NopStreamDeclarationsExport = $crate::__private::DeclarationsExport<$ty>;
            $crate::wit::state_declarer::export!(
                __NopStreamDeclarationsExport with_types_in $crate::wit::state_declarer
            );
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: fn() = $crate::__private::assert_operator::<$ty>;
    };
}

/// Exports a [`crate::StateMigration`] type as the component's `state-migration`
/// interface, beside its `operator` world:
///
/// ```ignore
/// nop_stream_sdk::export_operator!(MyAggregate);
/// nop_stream_sdk::export_state_migration!(MyAggregate);
/// ```
#[macro_export]
macro_rules! export_state_migration {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __NopStreamMigrationExport = $crate::__private::MigrationExport<$ty>;
            $crate::wit::state_migrator::export!(
                __NopStreamMigrationExport with_types_in $crate::wit::state_migrator
            );
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: fn() = $crate::__private::assert_state_migration::<$ty>;
    };
}

/// Exports a [`Source`] type as the component's `source` world; see
/// [`export_operator!`] for the instance lifecycle.
#[macro_export]
macro_rules! export_source {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __NopStreamSourceExport = $crate::__private::SourceExport<$ty>;
    $crate::wit::source::export!(__NopStreamSourceExport with_types_in $crate::wit::source);
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: fn() = $crate::__private::assert_source::<$ty>;
    };
}

/// Exports a [`Sink`] type as the component's `sink` world; see [`export_operator!`] for
/// the instance lifecycle.
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __NopStreamSinkExport = $crate::__private::SinkExport<$ty>;
    $crate::wit::sink::export!(__NopStreamSinkExport with_types_in $crate::wit::sink);
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: fn() = $crate::__private::assert_sink::<$ty>;
    };
}

/// Inside `impl Operator for T { … }`: forwards `process`, `on_timers` and
/// `on_watermark` to the [`crate::window::WindowOperator`] in field `$field`, and calls its
/// `flush` from `prepare_checkpoint` and `finish`: all a window plugin needs besides
/// `describe` and `open`, also with the accumulator cache
/// ([`crate::window::WindowOperator::cached`]).
///
/// ```ignore
/// impl Operator for MyWindow {
///     fn describe() -> PluginInfo { unimplemented!() }
///     fn open(ctx: &mut dyn Context, task: &TaskInfo, config: &str) -> Result<Self> { unimplemented!() }
///     nop_stream_sdk::window_operator_hooks!(op);
/// }
/// ```
#[macro_export]
macro_rules! window_operator_hooks {
    ($field:ident) => {
        $crate::__process_and_timer_hooks!($field);
        $crate::__watermark_and_flush_hooks!($field);
    };
}

/// The `on_watermark` forwarding and the `flush(ctx, out)` call from
/// `prepare_checkpoint` and `finish` shared by [`window_operator_hooks!`] and
/// [`cep_operator_hooks!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __watermark_and_flush_hooks {
    ($field:ident) => {
        fn on_watermark(
            &mut self,
            ctx: &mut dyn $crate::Context,
            watermark: i64,
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.on_watermark(ctx, watermark, out)
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
            self.$field.flush(ctx, out)
        }
    };
}

/// The `process` and `on_timers` forwarding shared by [`window_operator_hooks!`] and
/// [`cep_operator_hooks!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __process_and_timer_hooks {
    ($field:ident) => {
        fn process(
            &mut self,
            ctx: &mut dyn $crate::Context,
            _input: u32,
            batch: &$crate::Batch,
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.process(ctx, batch, out)
        }

        fn on_timers(
            &mut self,
            ctx: &mut dyn $crate::Context,
            timers: &[$crate::TimerGroup],
            out: &mut $crate::Batch,
        ) -> $crate::Result<()> {
            self.$field.on_timers(ctx, timers, out)
        }
    };
}

/// Inside `impl Operator for T { … }`: forwards `process`, `on_timers` and
/// `on_watermark` to the [`crate::cep::CepOperator`] in field `$field`, and calls its
/// `flush` from `prepare_checkpoint` and `finish`.
#[macro_export]
macro_rules! cep_operator_hooks {
    ($field:ident) => {
        $crate::__process_and_timer_hooks!($field);
        $crate::__watermark_and_flush_hooks!($field);
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, MockContext, ValueState};

    /// Counts records per key; the shape most keyed operators have.
    struct Counter {
        counts: ValueState<u64>,
        seen: ValueState<u64>,
    }

    impl Operator for Counter {
        fn describe() -> PluginInfo {
            PluginInfo::operator("counter", "0.1.0")
                .state(ValueState::<u64>::descriptor("counts", 1))
                .state(ValueState::<u64>::descriptor("seen", 1))
        }

        fn open(ctx: &mut dyn Context, _task: &TaskInfo, _config: &str) -> Result<Self> {
            // `ctx` is reborrowed by each call, so it can be used repeatedly.
            let counts = ValueState::open(ctx, "counts")?;
            let seen = ValueState::open(ctx, "seen")?;
            Ok(Counter { counts, seen })
        }

        fn process(
            &mut self,
            ctx: &mut dyn Context,
            _input: u32,
            batch: &Batch,
            out: &mut Batch,
        ) -> Result<()> {
            let keys: Vec<&[u8]> = batch.iter().filter_map(|r| r.key).collect();
            let current = self.counts.get_many(ctx, &keys);
            let updated: Vec<(&[u8], u64)> = keys
                .iter()
                .zip(current)
                .map(|(k, c)| (*k, c.unwrap_or(0) + 1))
                .collect();
            self.counts.put_many(ctx, &updated);
            let seen = self.seen.get(ctx, b"all").unwrap_or(0);
            self.seen.put(ctx, b"all", &(seen + 1));
            for (k, c) in &updated {
                out.push_keyed(k, &c.to_le_bytes());
            }
            Ok(())
        }
    }

    #[test]
    fn calls_before_open_are_errors_not_panics() {
        let err = with_instance::<Counter, ()>(|_| Ok(())).unwrap_err();
        assert_eq!(err.code, ErrorCode::Internal);
        assert!(take_instance::<Counter>().is_none());
    }

    #[test]
    fn instance_cell_round_trip() {
        let mut ctx = MockContext::for_operator::<Counter>();
        set_instance(Counter::open(&mut ctx, &TaskInfo::for_tests(), "{}").unwrap());
        let mut input = Batch::new();
        input.push_keyed(b"a", b"1");
        input.push_keyed(b"b", b"2");
        let mut out = Batch::new();
        with_instance::<Counter, ()>(|op| op.process(&mut ctx, 0, &input, &mut out)).unwrap();
        assert_eq!(out.len(), 2);
        // A different type in the cell is "not opened", never a bad downcast.
        assert!(with_instance::<u32, ()>(|_| Ok(())).is_err());
        assert!(take_instance::<Counter>().is_some());
        assert_eq!(ctx.state_entry_count(), 3);
    }

    #[test]
    fn wit_conversions_move_buffers() {
        let mut b = Batch::new();
        b.push_record(Some(b"k"), Some(7), b"payload");
        let ptr = b.data.as_ptr();
        let w = batch_to_wit(b.clone());
        let back = batch_from_wit(w);
        assert_eq!(back, b);
        let moved = batch_to_wit(b);
        assert_eq!(moved.data.as_ptr(), ptr, "data buffer was copied");

        let info = info_to_wit(
            PluginInfo::sink("s", "1.2.3")
                .sink_capability(SinkCapability::TwoPhaseCommit)
                .state(StateDescriptor::map("m", 2, "json")),
        );
        assert_eq!(info.name, "s");
        assert!(matches!(info.kind, wt::PluginKind::Sink));
        assert!(matches!(
            info.sink_capability,
            Some(wt::SinkCapability::TwoPhaseCommit)
        ));
        assert!(matches!(info.states[0].kind, wt::StateKind::Map));
        let e = error_to_wit(PluginError::invalid_record("bad"));
        assert!(matches!(e.code, wt::ErrorCode::InvalidRecord));
        assert_eq!(e.message, "bad");
    }
}
