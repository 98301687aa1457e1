//! Background compaction of incremental snapshots (design §5.5).
//!
//! An operator's chain (its keyed-state descriptors: a full snapshot's payloads, then
//! every delta's since, oldest first) grows by one delta per barrier. Once it is no longer
//! extendable (as many delta bytes as full ones, or [`MAX_DELTAS`] deltas; the decision
//! is [`crate::snapshot_policy::plan`]), the task does not take a full snapshot on its own
//! thread (a flush of all it wrote since the last one, then a scan). It keeps taking deltas and starts a
//! [`Compaction`]: a thread that reads the chain as of the last joined snapshot (every
//! file durable) from checkpoint storage, folds it per (state, shard) into full payloads
//! ([`nop_stream_state::Compactor`], which also leaves out expired TTL entries) and writes
//! them to one new segment file. A later barrier adopts the result: the chain becomes the
//! compacted payloads followed by the deltas taken since the compaction started. The
//! state itself is never touched, so the task thread's stall stays a delta's.
//!
//! A subtask that starts empty takes a delta at its first barrier too (the whole state
//! on top of nothing); its first compaction makes the first full payloads.
//!
//! The compacted file goes into the directory of the base chain's newest file, which
//! every manifest references until one adopts the compacted chain (and that one
//! references the compacted file): retention, which keeps whole epoch directories that a
//! kept manifest references, never deletes it under a running compaction or an adopted
//! chain. A restore of a manifest taken before the adoption never sees the file.
//!
//! A compaction that fails is logged and dropped, and the next snapshot is full. One that
//! cannot keep up (the chain reaches `MAX_DELTAS_COMPACTING` deltas) is abandoned for a
//! full snapshot too.

use crate::segment::{SegmentAppender, read_segment};
#[cfg(doc)]
use crate::snapshot_policy::MAX_DELTAS;
use nop_stream_api::{EpochId, StateShardId};
use nop_stream_checkpoint::{Namespace, SegmentDescriptor, payload, payload_checksum};
use nop_stream_plugin_host::{Result, RuntimeError};
use nop_stream_state::{Compactor, ExpiredKeys};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What a compaction needs besides the chain.
pub(crate) struct CompactionSpec {
    pub storage: Arc<Namespace>,
    pub namespace: String,
    pub operator: String,
    pub operator_id: String,
    pub subtask: u32,
    pub attempt: u32,
    /// Epoch of the barrier that starts it (names the file).
    pub epoch: EpochId,
    /// The operator's keyed-state descriptors, by handle (timers included).
    pub states: Vec<nop_stream_api::StateDescriptor>,
}

/// A finished compaction's result.
pub(crate) struct Compacted {
    /// The full payloads' descriptors, in (state, shard) order: they replace the base.
    pub full: Vec<SegmentDescriptor>,
    /// Expired TTL entries the fold left out.
    pub expired: ExpiredKeys,
    /// Bytes written.
    pub bytes: u64,
}

/// A running (or finished, not yet adopted) compaction of one operator's chain.
pub(crate) struct Compaction {
    /// The chain it folds.
    pub base: Vec<SegmentDescriptor>,
    /// Epoch of the barrier that started it.
    pub epoch: EpochId,
    pub started: Instant,
    handle: Option<std::thread::JoinHandle<Result<Compacted>>>,
    abort: Arc<AtomicBool>,
}

impl Compaction {
    /// Starts a thread compacting `base` (see [`crate::snapshot_policy::compactable`]).
    ///
    /// # Errors
    /// [`RuntimeError::Internal`] if the thread cannot start.
    pub fn start(
        spec: CompactionSpec,
        base: Vec<SegmentDescriptor>,
        compactor: Compactor,
    ) -> Result<Self> {
        let abort = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&abort);
        let chain = base.clone();
        let epoch = spec.epoch;
        let handle = std::thread::Builder::new()
            .name(format!("compact {}/{}", spec.operator_id, spec.subtask))
            .spawn(move || compact(&spec, &chain, compactor, &stop))
            .map_err(|e| {
                RuntimeError::Internal(format!("cannot start a compaction thread: {e}"))
            })?;
        Ok(Self {
            base,
            epoch,
            started: Instant::now(),
            handle: Some(handle),
            abort,
        })
    }

    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.handle
            .as_ref()
            .is_none_or(std::thread::JoinHandle::is_finished)
    }

    /// Waits for the thread: its result, or its error (a panic included).
    pub fn join(mut self) -> Result<Compacted> {
        let handle = self.handle.take().expect("joined once");
        handle.join().unwrap_or_else(|_| {
            Err(RuntimeError::Internal(
                "the compaction thread panicked".into(),
            ))
        })
    }
}

impl Drop for Compaction {
    /// Abandons a running compaction: tells it to stop and waits for it (it stops before
    /// its next segment read; an unfinished file is never made visible).
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.abort.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
    }
}

/// Folds `base` per (state, shard) and writes the full payloads to one segment file
/// (named by [`nop_stream_checkpoint::names::compacted_segment_file`]), made durable
/// before it returns.
fn compact(
    spec: &CompactionSpec,
    base: &[SegmentDescriptor],
    mut compactor: Compactor,
    abort: &AtomicBool,
) -> Result<Compacted> {
    let dir_epoch = base
        .last()
        .and_then(|d| nop_stream_checkpoint::names::segment_dir_epoch(&d.file))
        .ok_or_else(|| RuntimeError::Internal("compaction of an empty chain".into()))?;
    let file = nop_stream_checkpoint::names::compacted_segment_file(
        dir_epoch,
        &spec.operator_id,
        spec.subtask,
        spec.attempt,
        spec.epoch.0,
    );
    let io = |message: String| RuntimeError::Io {
        path: format!("compaction of operator `{}` ({file})", spec.operator),
        message,
    };
    // Each (state, shard)'s payloads in chain order, groups in (state, shard) order.
    let mut groups: BTreeMap<(u32, u32), Vec<&SegmentDescriptor>> = BTreeMap::new();
    for d in base {
        let state = spec
            .states
            .iter()
            .position(|s| s.name == d.state)
            .ok_or_else(|| io(format!("the chain names state `{}`, not declared", d.state)))?;
        groups.entry((state as u32, d.shard)).or_default().push(d);
    }
    let mut out = SegmentAppender::new(&spec.storage, &file);
    let mut full = Vec::new();
    for ((state, shard), chain) in groups {
        let mut payloads = Vec::with_capacity(chain.len());
        for d in &chain {
            // Checked per read too, so an abandoning task waits for one read at most.
            if abort.load(Ordering::Relaxed) {
                return Err(io("compaction abandoned".into()));
            }
            payloads.push((
                d.codec.as_str(),
                read_segment(&spec.storage, d).map_err(io)?,
            ));
        }
        let borrowed: Vec<(&str, &[u8])> =
            payloads.iter().map(|(c, b)| (*c, b.as_slice())).collect();
        let desc = &spec.states[state as usize];
        let Some(s) = compactor
            .fold(state, &desc.name, StateShardId(shard), &borrowed)
            .map_err(|e| io(e.to_string()))?
        else {
            continue;
        };
        let at = out.append(&s.payload).map_err(io)?;
        full.push(SegmentDescriptor {
            state_path: nop_stream_checkpoint::names::state_path(
                &spec.namespace,
                dir_epoch,
                &spec.operator_id,
                spec.subtask,
                shard,
                &desc.name,
            ),
            operator_id: spec.operator_id.clone(),
            shard,
            state: desc.name.clone(),
            file: file.clone(),
            offset: at,
            len: s.payload.len() as u64,
            checksum: payload_checksum(&s.payload),
            codec: payload::KV_CODEC.into(),
            schema_version: chain
                .last()
                .map_or(desc.schema_version, |d| d.schema_version),
            entries: s.entries,
        });
    }
    let bytes = out.offset;
    if let Some(w) = out.writer {
        if nop_stream_checkpoint::failpoint::hit("compaction-write") {
            return Err(io("failpoint `compaction-write` fired".into()));
        }
        w.finish().map_err(|e| io(e.to_string()))?;
    }
    Ok(Compacted {
        full,
        expired: compactor.into_expired(),
        bytes,
    })
}
