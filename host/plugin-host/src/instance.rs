//! Live plugin instances (design §16): one `Store` per instance, every call into the guest
//! under its CPU deadline, and what comes back checked against the batch layout and the
//! output limits. A guest-reported error is data ([`RuntimeError::Guest`]); a trap is a
//! failure of the task ([`RuntimeError::Trap`], naming the limit that fired).

use crate::bindings::op::Operator;
use crate::bindings::sink::Sink;
use crate::bindings::src::Source;
use crate::bindings::{
    ErrorCode, GuestError, TimerGroup, WitBatch, WitPluginInfo, WitPluginKind, WitSinkCapability,
    WitSourceCapability, WitStateKind, host_batch, wit_batch, wit_split, wit_task_info,
};
use crate::error::{Result, RuntimeError, Site};
use crate::limits::Limits;
use crate::options::DirGrant;
use crate::store::{HostFault, HostTrap, StoreData};
use nop_stream_api::{
    Batch, PluginInfo, PluginKind, SinkCapability, SourceCapability, Split, StateDescriptor,
    StateKind, TaskInfo,
};
use nop_stream_state::KeyedState;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::{Store, Trap};

/// A live instance of any world.
pub enum Instance {
    /// An operator.
    Operator(OperatorInstance),
    /// A source.
    Source(SourceInstance),
    /// A sink.
    Sink(SinkInstance),
}

/// What one `read` returned, in host types.
#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Records read, in split order.
    pub records: Batch,
    /// Exclusive cursor: the position of the first record not yet returned (design §6.4).
    pub next_cursor: Vec<u8>,
    /// The split holds no record after `next_cursor`.
    pub finished: bool,
    /// Progress within the split.
    pub progress: Progress,
}

/// A source's progress within a split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Units consumed so far (bytes for file sources).
    pub consumed: u64,
    /// Total units in the split, when known.
    pub total: Option<u64>,
}

/// What a sink's `recover` says of a transaction whose commit failed (design §5.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Its effects are visible.
    Committed,
    /// It is not committed (rolled back, or sealed and still committable).
    Aborted,
    /// The outcome cannot be established (e.g. it expired); the job fails.
    Unknown,
}

/// Timers due at one watermark or instant, grouped per (timestamp, namespace) in
/// timestamp order, as [`OperatorInstance::on_timers`] takes them.
#[derive(Debug, Default)]
pub struct DueTimers(Vec<TimerGroup>);

impl DueTimers {
    /// Whether no timer is due.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of (timestamp, namespace) groups.
    pub fn groups(&self) -> usize {
        self.0.len()
    }

    /// Number of timers (one per key of each group).
    pub fn timers(&self) -> usize {
        self.0.iter().map(|g| g.key_ends.len()).sum()
    }
}

/// What `describe()` returned, in host types.
pub(crate) fn convert_info(w: WitPluginInfo) -> PluginInfo {
    PluginInfo {
        name: w.name,
        version: w.version,
        kind: match w.kind {
            WitPluginKind::Operator => PluginKind::Operator,
            WitPluginKind::Source => PluginKind::Source,
            WitPluginKind::Sink => PluginKind::Sink,
        },
        description: w.description,
        states: w
            .states
            .into_iter()
            .map(|s| StateDescriptor {
                name: s.name,
                kind: match s.kind {
                    WitStateKind::Value => StateKind::Value,
                    WitStateKind::List => StateKind::List,
                    WitStateKind::Map => StateKind::Map,
                },
                schema_version: s.schema_version,
                codec: s.codec,
                schema_sha256: None,
            })
            .collect(),
        source_capability: w.source_capability.map(|c| match c {
            WitSourceCapability::Replayable => SourceCapability::Replayable,
            WitSourceCapability::TransactionalRead => SourceCapability::TransactionalRead,
            WitSourceCapability::AtLeastOnce => SourceCapability::AtLeastOnce,
            WitSourceCapability::BestEffort => SourceCapability::BestEffort,
        }),
        sink_capability: w.sink_capability.map(|c| match c {
            WitSinkCapability::TwoPhaseCommit => SinkCapability::TwoPhaseCommit,
            WitSinkCapability::StagedAtomicCommit => SinkCapability::StagedAtomicCommit,
            WitSinkCapability::OutboxEpochLog => SinkCapability::OutboxEpochLog,
            WitSinkCapability::Idempotent => SinkCapability::Idempotent,
            WitSinkCapability::UpsertByKey => SinkCapability::UpsertByKey,
            WitSinkCapability::AtLeastOnce => SinkCapability::AtLeastOnce,
            WitSinkCapability::BestEffort => SinkCapability::BestEffort,
        }),
        config_schema: w.config_schema,
        side_outputs: w.side_outputs,
        model: w.model,
        operator_states: Vec::new(),
    }
}

/// Who an instance is and what bounds its calls, for errors.
#[derive(Debug, Clone)]
pub(crate) struct CallCtx {
    pub(crate) site: Site,
    pub(crate) limits: Limits,
    /// The instance's grants: to name a full file system behind an I/O error (the
    /// writable ones), and the host path of a guest path in an error.
    pub(crate) grants: Vec<DirGrant>,
}

/// A writable grant with fewer free bytes than this is taken as the cause of a guest's I/O
/// error: one buffered write of a sink (64 KiB) no longer fits.
const FULL_BELOW_BYTES: u64 = 64 * 1024;

/// Bytes an unprivileged writer can still allocate on the file system of `dir`.
#[cfg(unix)]
fn available_bytes(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(not(unix))]
fn available_bytes(_dir: &Path) -> Option<u64> {
    None
}

/// Why an I/O error of a guest happened, when the host can tell: a writable grant whose
/// file system has no space left. The guest itself often cannot say so: WASI streams
/// report a failed write as a generic I/O error (`os error 29`, EIO in WASI numbering),
/// whatever the host's errno was.
fn io_cause(ctx: &CallCtx, message: &str) -> Option<String> {
    if !["os error", "I/O error", "space"]
        .iter()
        .any(|w| message.contains(w))
    {
        return None;
    }
    ctx.grants.iter().filter(|g| g.writable).find_map(|g| {
        let free = available_bytes(&g.host)?;
        (free < FULL_BELOW_BYTES).then(|| {
            format!(
                "no space left on device: the file system of the directory granted as `{}` \
                 ({}) is full ({free} bytes free)",
                g.guest,
                g.host.display()
            )
        })
    })
}

/// The errno of the first `(os error N)` in a guest's message. Inside the sandbox that
/// number is a WASI errno, whose values differ from the host's (44 is `ENOENT` in WASI).
fn wasi_errno(message: &str) -> Option<u16> {
    let rest = &message[message.find("(os error ")? + "(os error ".len()..];
    rest[..rest.find(')')?].parse().ok()
}

/// The name of the WASI errno `n` (`wasi_snapshot_preview1`'s `errno`), for the ones a
/// file or socket error commonly carries.
fn wasi_errno_name(n: u16) -> Option<&'static str> {
    Some(match n {
        2 => "EACCES",
        8 => "EBADF",
        14 => "ECONNREFUSED",
        15 => "ECONNRESET",
        20 => "EEXIST",
        28 => "EINVAL",
        29 => "EIO",
        31 => "EISDIR",
        44 => "ENOENT",
        51 => "ENOSPC",
        54 => "ENOTDIR",
        55 => "ENOTEMPTY",
        58 => "ENOTSUP",
        63 => "EPERM",
        73 => "ETIMEDOUT",
        76 => "ENOTCAPABLE",
        _ => return None,
    })
}

/// `" (host path of `/input/a.csv`: /data/in/a.csv)"` for each guest path in `message` that
/// lies in a grant (the guest sees a granted directory under its guest path only; the
/// user wrote the host one), or `""`.
fn host_paths(grants: &[DirGrant], message: &str) -> String {
    let mut out = String::new();
    let mut seen = Vec::new();
    for (at, _) in message.match_indices('/') {
        // A path starts at a `/` that begins a word.
        if at > 0
            && !matches!(
                message.as_bytes()[at - 1],
                b' ' | b'`' | b'"' | b'\'' | b'('
            )
        {
            continue;
        }
        let end = message[at..]
            .find([' ', '`', '"', '\'', ')', ',', ';'])
            .map_or(message.len(), |e| at + e);
        let path = message[..end].get(at..).unwrap_or_default();
        let path = path.strip_suffix(':').unwrap_or(path);
        if seen.contains(&path) {
            continue;
        }
        let Some((g, rest)) = grants.iter().find_map(|g| {
            let guest = g.guest.trim_end_matches('/');
            let rest = path.strip_prefix(guest)?;
            (rest.is_empty() || rest.starts_with('/')).then_some((g, rest))
        }) else {
            continue;
        };
        seen.push(path);
        let rest = rest.trim_start_matches('/');
        let host = if rest.is_empty() {
            g.host.clone()
        } else {
            g.host.join(rest)
        };
        out.push_str(&format!(" (host path of `{path}`: {})", host.display()));
    }
    out
}

/// Turns a wasmtime error from a call into a [`RuntimeError`] naming the limit that fired.
pub(crate) fn classify(
    ctx: &CallCtx,
    call: &'static str,
    e: wasmtime::Error,
    store: &Store<StoreData>,
) -> RuntimeError {
    let msg = format!("{e:#}");
    // The full chain carries the wasm backtrace: for developers, not for the one-line
    // reason a user reads.
    tracing::debug!(site = %ctx.site, call, "guest trap: {msg}");
    let root = e.root_cause().to_string();
    let mut refused = false;
    let reason = if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        format!(
            "exceeded limit `cpu_ms_per_call` ({} ms per call)",
            ctx.limits.cpu_ms_per_call
        )
    } else if msg.contains("forcing trap when growing memory") {
        format!(
            "exceeded limit `memory_bytes` ({} bytes per instance): {root}",
            ctx.limits.memory_bytes
        )
    } else if let Some(h) = e.downcast_ref::<HostTrap>() {
        refused = true;
        h.0.clone()
    } else if let Some(h) = e.downcast_ref::<HostFault>() {
        h.0.clone()
    } else {
        let mut reason = root;
        if let Some(pipe) = &store.data().stderr {
            let captured = pipe.contents();
            let text = String::from_utf8_lossy(&captured);
            let tail: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
                .rev()
                .take(8)
                .collect();
            if !tail.is_empty() {
                reason.push_str("; guest stderr: ");
                reason.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
            }
        }
        reason
    };
    let reason = match io_cause(ctx, &reason) {
        Some(cause) => format!("{cause} ({reason})"),
        None => reason,
    };
    RuntimeError::Trap {
        site: ctx.site.clone(),
        call,
        reason,
        refused,
    }
}

/// The WIT name of an error code (`invalid-record`), as the guest SDK spells it.
fn error_code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidConfig => "invalid-config",
        ErrorCode::InvalidRecord => "invalid-record",
        ErrorCode::Io => "io",
        ErrorCode::State => "state",
        ErrorCode::Transaction => "transaction",
        ErrorCode::Internal => "internal",
    }
}

/// A guest-reported error of `call` as [`RuntimeError::Guest`], naming a full file system
/// behind an I/O error when the host can tell.
pub(crate) fn guest_error(ctx: &CallCtx, call: &'static str, e: GuestError) -> RuntimeError {
    let mut message = match io_cause(ctx, &e.message) {
        Some(cause) => format!("{cause} ({})", e.message),
        None => e.message,
    };
    if let Some(n) = wasi_errno(&message)
        && let Some(name) = wasi_errno_name(n)
    {
        message = message.replace(
            &format!("(os error {n})"),
            &format!("(WASI errno {n}, {name})"),
        );
    }
    message.push_str(&host_paths(&ctx.grants, &message));
    RuntimeError::Guest {
        site: ctx.site.clone(),
        call,
        code: error_code_name(e.code),
        message: message.into(),
        record: None,
    }
}

/// Checks a batch returned by a guest against the layout rules and output limits.
///
/// # Errors
/// [`RuntimeError::MalformedBatch`] or [`RuntimeError::LimitExceeded`].
fn check_output(ctx: &CallCtx, call: &'static str, b: &WitBatch) -> Result<()> {
    let malformed = |detail: String| RuntimeError::MalformedBatch {
        site: ctx.site.clone(),
        call,
        detail,
    };
    let limit = |limit: &'static str, value: u64, max: u64| RuntimeError::LimitExceeded {
        site: ctx.site.clone(),
        call,
        limit,
        value,
        max,
    };
    let n = b.ends.len();
    let l = &ctx.limits;
    if n as u64 > u64::from(l.max_output_records) {
        return Err(limit(
            "max_output_records",
            n as u64,
            u64::from(l.max_output_records),
        ));
    }
    let bytes = (b.data.len() + b.keys.len()) as u64;
    if bytes > l.max_output_bytes {
        return Err(limit("max_output_bytes", bytes, l.max_output_bytes));
    }
    check_layout(&b.data, &b.ends, "records", l.max_record_bytes).map_err(|e| match e {
        LayoutError::Malformed(d) => malformed(d),
        LayoutError::TooLarge(v) => limit("max_record_bytes", v, u64::from(l.max_record_bytes)),
    })?;
    if !b.key_ends.is_empty() {
        if b.key_ends.len() != n {
            return Err(malformed(format!(
                "{} keys for {n} records",
                b.key_ends.len()
            )));
        }
        check_layout(&b.keys, &b.key_ends, "keys", l.max_record_bytes).map_err(|e| match e {
            LayoutError::Malformed(d) => malformed(d),
            LayoutError::TooLarge(v) => limit("max_record_bytes", v, u64::from(l.max_record_bytes)),
        })?;
    } else if !b.keys.is_empty() {
        return Err(malformed("key bytes without key offsets".into()));
    }
    if !b.timestamps.is_empty() && b.timestamps.len() != n {
        return Err(malformed(format!(
            "{} timestamps for {n} records",
            b.timestamps.len()
        )));
    }
    Ok(())
}

enum LayoutError {
    Malformed(String),
    TooLarge(u64),
}

fn check_layout(data: &[u8], ends: &[u32], what: &str, max_item: u32) -> Result<(), LayoutError> {
    let mut prev = 0u32;
    for &e in ends {
        if e < prev {
            return Err(LayoutError::Malformed(format!(
                "{what} end offsets decrease ({prev} then {e})"
            )));
        }
        if e - prev > max_item {
            return Err(LayoutError::TooLarge(u64::from(e - prev)));
        }
        prev = e;
    }
    if prev as usize != data.len() {
        return Err(LayoutError::Malformed(format!(
            "{what} end offsets cover {prev} bytes but the buffer holds {}",
            data.len()
        )));
    }
    Ok(())
}

macro_rules! guest_call {
    ($self:ident, $name:literal, |$inst:ident, $store:ident| $body:expr) => {{
        let ticks = $self.ctx.limits.cpu_ticks();
        $self.store.set_epoch_deadline(ticks);
        $self.store.data_mut().host_wait = Duration::ZERO;
        let $inst = Arc::clone(&$self.inst);
        let $store = &mut $self.store;
        match $body {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(guest_error(&$self.ctx, $name, e)),
            Err(e) => Err(classify(&$self.ctx, $name, e, &$self.store)),
        }
    }};
}

/// [`guest_call!`] for exports without a WIT `result`: only traps can fail them.
macro_rules! guest_call_infallible {
    ($self:ident, $name:literal, |$inst:ident, $store:ident| $body:expr) => {
        guest_call!($self, $name, |$inst, $store| ($body)
            .map(Ok::<_, GuestError>))
    };
}

/// A `process` call the guest answered with an error (WIT `error`, not a trap).
#[derive(Debug)]
pub struct Rejected {
    /// The [`RuntimeError::Guest`] naming site, code and message.
    pub error: RuntimeError,
    /// The batch the call was given, unchanged.
    pub input: Batch,
}

/// An operator instance serving one subtask.
pub struct OperatorInstance {
    pub(crate) store: Store<StoreData>,
    pub(crate) inst: Arc<Operator>,
    pub(crate) ctx: CallCtx,
}

impl OperatorInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<PluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_operator_plugin()
            .call_describe(s))
        .map(convert_info)
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i
            .nop_stream_operator_plugin()
            .call_open(s, &wit_task_info(task), config))
    }

    /// Calls `process` and checks the output.
    ///
    /// # Errors
    /// A trap, a guest error, a malformed batch or an output limit.
    pub fn process(&mut self, input: u32, batch: Batch) -> Result<Batch> {
        self.try_process(input, batch)?.map_err(|r| r.error)
    }

    /// Calls `process` like [`Self::process`], but a guest-reported error comes back as
    /// [`Rejected`] together with the input batch, so the caller can apply the operator's
    /// error policy to its records. Side outputs of a rejected call are still queued
    /// ([`Self::take_side_outputs`]); the caller decides what becomes of them.
    ///
    /// # Errors
    /// A trap, a malformed batch or an output limit.
    pub fn try_process(&mut self, input: u32, batch: Batch) -> Result<Result<Batch, Rejected>> {
        let batch = wit_batch(batch);
        let out = guest_call!(self, "process", |i, s| i
            .nop_stream_operator_plugin()
            .call_process(s, input, &batch));
        match out {
            Ok(out) => {
                check_output(&self.ctx, "process", &out)?;
                Ok(Ok(host_batch(out)))
            }
            Err(error @ RuntimeError::Guest { .. }) => Ok(Err(Rejected {
                error,
                input: host_batch(batch),
            })),
            Err(e) => Err(e),
        }
    }

    /// Calls `on-watermark` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn on_watermark(&mut self, watermark: i64) -> Result<Batch> {
        self.store.data_mut().watermark = watermark;
        let out = guest_call!(self, "on-watermark", |i, s| i
            .nop_stream_operator_plugin()
            .call_on_watermark(s, watermark))?;
        check_output(&self.ctx, "on-watermark", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `on-timers` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn on_timers(&mut self, timers: &DueTimers) -> Result<Batch> {
        let timers = timers.0.as_slice();
        let out = guest_call!(self, "on-timers", |i, s| i
            .nop_stream_operator_plugin()
            .call_on_timers(s, timers))?;
        check_output(&self.ctx, "on-timers", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `prepare-checkpoint` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn prepare_checkpoint(&mut self, epoch: u64) -> Result<Batch> {
        let out = guest_call!(self, "prepare-checkpoint", |i, s| i
            .nop_stream_operator_plugin()
            .call_prepare_checkpoint(s, epoch))?;
        check_output(&self.ctx, "prepare-checkpoint", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `finish` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn finish(&mut self) -> Result<Batch> {
        let out = guest_call!(self, "finish", |i, s| i
            .nop_stream_operator_plugin()
            .call_finish(s))?;
        check_output(&self.ctx, "finish", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_operator_plugin()
            .call_close(s))
    }

    /// Removes and returns the side-output records emitted by the calls since the last
    /// take, as (tag, batch) in emission order. Undeclared tags already trapped.
    pub fn take_side_outputs(&mut self) -> Vec<(String, Batch)> {
        std::mem::take(&mut self.store.data_mut().side)
    }

    /// The keyed state of this instance, if the operator declared any.
    pub fn state_mut(&mut self) -> Option<&mut KeyedState> {
        self.store.data_mut().state.as_mut()
    }

    /// The non-keyed operator state of this instance (empty if none is declared).
    pub fn operator_state_mut(&mut self) -> &mut crate::op_state::OperatorStates {
        &mut self.store.data_mut().op_state
    }

    /// Advances the watermark the guest sees to `watermark`, then removes and returns the
    /// event-time timers due at it, grouped per (timestamp, namespace) in timestamp order.
    pub fn take_due_event_timers(&mut self, watermark: i64) -> Result<DueTimers> {
        let data = self.store.data_mut();
        // The guest sees the new watermark while its timers fire (as in Flink's timer
        // service: the watermark advances, then the due timers fire).
        data.watermark = data.watermark.max(watermark);
        Ok(take_due(data, 0, watermark))
    }

    /// Removes and returns processing-time timers due at `now` (ms since the Unix epoch),
    /// grouped as [`Self::take_due_event_timers`]. Timers restored overdue fire on the
    /// first call (design §8.4).
    pub fn take_due_processing_timers(&mut self, now: i64) -> Result<DueTimers> {
        Ok(take_due(self.store.data_mut(), 1, now))
    }

    /// Whether a processing-time timer is registered.
    pub fn has_processing_timers(&self) -> bool {
        self.store.data().timers.has_domain(1)
    }

    /// Plugin-defined counters.
    pub fn counters(&self) -> &BTreeMap<String, u64> {
        &self.store.data().counters
    }

    /// Every registered timer as (domain code, timestamp, key, namespace).
    pub fn timers(&mut self) -> Vec<crate::store::timers::TimerEntry> {
        let mut out = Vec::with_capacity(self.store.data().timers.len());
        for (d, ts, ns, k, _) in self.store.data_mut().timers.entries_mut() {
            out.push((d, ts, k.to_vec(), ns.to_vec()));
        }
        out.sort();
        out
    }

    /// Writes pending timer changes to the `__timers` state; call before snapshotting
    /// the keyed state.
    ///
    /// # Errors
    /// A refused state access.
    pub fn sync_timers(&mut self) -> Result<()> {
        let site = self.ctx.site.to_string();
        self.store
            .data_mut()
            .sync_timers()
            .map_err(|e| RuntimeError::Internal(format!("{site}: timer state: {e}")))
    }

    /// Rebuilds the in-memory timer index from the `__timers` state (after a restore).
    ///
    /// # Errors
    /// A database failure or a corrupt timer entry.
    pub fn reload_timers(&mut self) -> Result<()> {
        let data = self.store.data_mut();
        let (Some(h), Some(ks)) = (data.timer_state, data.state.as_mut()) else {
            return Ok(());
        };
        let entries = ks
            .scan(h)
            .map_err(|e| RuntimeError::Internal(format!("timer state: {e}")))?;
        for (ns, key) in entries {
            let t = crate::store::timers::timer_entry(&ns, key)
                .ok_or_else(|| RuntimeError::Internal("corrupt timer entry".into()))?;
            data.timers.insert(t.0, t.1, &t.2, &t.3, true);
        }
        Ok(())
    }

    /// Sets the watermark the guest sees through `current-watermark`.
    pub fn set_watermark(&mut self, watermark: i64) {
        self.store.data_mut().watermark = watermark;
    }
}

/// A source instance.
pub struct SourceInstance {
    pub(crate) store: Store<StoreData>,
    pub(crate) inst: Arc<Source>,
    pub(crate) ctx: CallCtx,
}

impl SourceInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<PluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_source_plugin()
            .call_describe(s))
        .map(convert_info)
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i.nop_stream_source_plugin().call_open(
            s,
            &wit_task_info(task),
            config
        ))
    }

    /// Calls `discover-splits`; split ids must be unique.
    ///
    /// # Errors
    /// A trap, a guest error, or duplicate split ids.
    pub fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>> {
        let splits = guest_call!(self, "discover-splits", |i, s| i
            .nop_stream_source_plugin()
            .call_discover_splits(s, parallelism))?;
        let splits: Vec<Split> = splits
            .into_iter()
            .map(|s| Split {
                id: s.id,
                descriptor: s.descriptor,
            })
            .collect();
        let mut seen = BTreeSet::new();
        for sp in &splits {
            if !seen.insert(sp.id.as_str()) {
                return Err(RuntimeError::MalformedBatch {
                    site: self.ctx.site.clone(),
                    call: "discover-splits",
                    detail: format!("split id `{}` appears twice", sp.id),
                });
            }
        }
        Ok(splits)
    }

    /// Calls `read` and checks the output.
    ///
    /// # Errors
    /// A trap, a guest error, a malformed batch or an output limit.
    pub fn read(&mut self, split: &Split, cursor: &[u8], max_records: u32) -> Result<ReadResult> {
        let split = wit_split(split);
        let out = guest_call!(self, "read", |i, s| i.nop_stream_source_plugin().call_read(
            s,
            &split,
            cursor,
            max_records
        ))?;
        check_output(&self.ctx, "read", &out.records)?;
        if out.records.ends.len() > max_records as usize {
            return Err(RuntimeError::LimitExceeded {
                site: self.ctx.site.clone(),
                call: "read",
                limit: "max_batch_records",
                value: out.records.ends.len() as u64,
                max: u64::from(max_records),
            });
        }
        Ok(ReadResult {
            records: host_batch(out.records),
            next_cursor: out.next_cursor,
            finished: out.finished,
            progress: Progress {
                consumed: out.progress.consumed,
                total: out.progress.total,
            },
        })
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_source_plugin()
            .call_close(s))
    }
}

/// A sink instance.
pub struct SinkInstance {
    pub(crate) store: Store<StoreData>,
    pub(crate) inst: Arc<Sink>,
    pub(crate) ctx: CallCtx,
}

impl SinkInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<PluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_sink_plugin()
            .call_describe(s))
        .map(convert_info)
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i.nop_stream_sink_plugin().call_open(
            s,
            &wit_task_info(task),
            config
        ))
    }

    /// Calls `begin`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn begin(&mut self, txn: &str) -> Result<()> {
        guest_call!(self, "begin", |i, s| i
            .nop_stream_sink_plugin()
            .call_begin(s, txn))
    }

    /// Calls `write`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn write(&mut self, txn: &str, batch: Batch) -> Result<()> {
        let batch = wit_batch(batch);
        guest_call!(self, "write", |i, s| i
            .nop_stream_sink_plugin()
            .call_write(s, txn, &batch))
    }

    /// Calls `pre-commit`, returning the committable.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        guest_call!(self, "pre-commit", |i, s| i
            .nop_stream_sink_plugin()
            .call_pre_commit(s, txn))
    }

    /// Calls `commit`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn commit(&mut self, committable: &[u8]) -> Result<()> {
        guest_call!(self, "commit", |i, s| i
            .nop_stream_sink_plugin()
            .call_commit(s, committable))
    }

    /// Calls `abort`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn abort(&mut self, txn: &str) -> Result<()> {
        guest_call!(self, "abort", |i, s| i
            .nop_stream_sink_plugin()
            .call_abort(s, txn))
    }

    /// Calls `recover`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        use crate::bindings::CommitOutcome as Wit;
        let outcome = guest_call!(self, "recover", |i, s| i
            .nop_stream_sink_plugin()
            .call_recover(s, committable))?;
        Ok(match outcome {
            Wit::Committed => CommitOutcome::Committed,
            Wit::Aborted => CommitOutcome::Aborted,
            Wit::Unknown => CommitOutcome::Unknown,
        })
    }

    /// Calls `pending-transactions`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn pending_transactions(&mut self) -> Result<Vec<String>> {
        guest_call!(self, "pending-transactions", |i, s| i
            .nop_stream_sink_plugin()
            .call_pending_transactions(s))
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_sink_plugin()
            .call_close(s))
    }

    /// The sink's site.
    pub fn site(&self) -> &Site {
        &self.ctx.site
    }
}

/// Pops the due timers of `domain` up to `up_to` as WIT timer groups, remembering the
/// persisted ones for deletion from the `__timers` state at the next sync.
fn take_due(data: &mut StoreData, domain: u8, up_to: i64) -> DueTimers {
    let wit_domain = if domain == 0 {
        crate::bindings::TimeDomain::EventTime
    } else {
        crate::bindings::TimeDomain::ProcessingTime
    };
    let groups = data.timers.pop_due(domain, up_to);
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        let mut keys = Vec::with_capacity(g.keys.iter().map(|k| k.0.len()).sum());
        let mut key_ends = Vec::with_capacity(g.keys.len());
        for (key, persisted) in &g.keys {
            if *persisted {
                data.timers_removed.push((
                    g.domain,
                    g.timestamp,
                    key.to_vec(),
                    g.namespace.to_vec(),
                ));
            }
            keys.extend_from_slice(key);
            key_ends.push(keys.len() as u32);
        }
        out.push(TimerGroup {
            domain: wit_domain,
            timestamp: g.timestamp,
            namespace: g.namespace.into_vec(),
            keys,
            key_ends,
        });
    }
    DueTimers(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn grant(guest: &str, host: &str) -> DirGrant {
        DirGrant {
            host: PathBuf::from(host),
            guest: guest.into(),
            writable: false,
        }
    }

    #[test]
    fn guest_paths_are_given_their_host_paths_and_errnos_their_wasi_names() {
        // Before: "/input/nope.csv: No such file or directory (os error 44)", a sandbox
        // path and a number that means something else on the host (EXFULL on Linux).
        let grants = [grant("/input", "/data/in"), grant("/output/", "/srv/out")];
        let m = "/input/nope.csv: No such file or directory (os error 44)";
        assert_eq!(wasi_errno(m), Some(44));
        assert_eq!(wasi_errno_name(44), Some("ENOENT"));
        assert_eq!(
            host_paths(&grants, m),
            " (host path of `/input/nope.csv`: /data/in/nope.csv)"
        );
        // Backticked, a grant's root, twice, and a path outside every grant.
        assert_eq!(
            host_paths(
                &grants,
                "cannot rename `/output/.staging/a` to `/output`; `/output` and /etc/x"
            ),
            " (host path of `/output/.staging/a`: /srv/out/.staging/a) (host path of \
             `/output`: /srv/out)"
        );
        // A prefix that is not a path component is not a grant.
        assert_eq!(host_paths(&grants, "/inputs/a: gone"), "");
        assert_eq!(host_paths(&grants, "no path at all"), "");
        assert_eq!(wasi_errno("os error 44"), None);
        assert_eq!(wasi_errno_name(1000), None);
    }
}
