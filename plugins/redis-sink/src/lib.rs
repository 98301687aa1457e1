//! `redis-sink`: writes records into Redis Streams, one stream per sink subtask, with
//! entry ids `<epoch>-<n>` (design §7.5, §16.1; capability idempotent, so a job using it is at
//! most EFFECTIVELY_ONCE, design §7.1). It reaches Redis only through the host's
//! `nop:redis/streams` capability, on the connection the job file grants to its node.
//!
//! Config:
//!
//! ```toml
//! config = { connection = "redis", stream = "departures", field = "line" }
//! ```
//!
//! - `connection` (required): a connection name granted to the node (`connections = [..]`).
//! - `stream` (required): key prefix. Subtask `i` writes the stream `<stream>:<i>` and
//!   keeps its marker hash `<stream>:<i>:nop-sink` (fields `owner`: the sink's
//!   `<job>:<pipeline>:<operator>`, `committed`: the last committed epoch).
//! - `field`: the entry field holding the record bytes (default `line`).
//! - `flush_bytes`: records of the open epoch held in memory before they are written
//!   early, in bytes (default 16 MiB; at least 1). Bounds the instance's memory.
//! - `entries_per_transaction`: entries per MULTI/EXEC (default 5,000; at least 1).
//!
//! # Epochs, ids and recovery
//!
//! Records of epoch E are held in memory and written at `pre-commit` (earlier, in order,
//! once `flush_bytes` is reached) with ids `E-1`, `E-2`, ... in record order, in
//! MULTI/EXEC transactions of `entries_per_transaction` entries; the first one also sets
//! the marker's `owner`. Ids increase within the subtask's stream because the engine's
//! epochs do, also across restarts (a restarted run skips past every epoch an earlier
//! attempt logged). `commit` sets the marker's `committed` to E (never lowers it).
//!
//! An XADD rejected as at or below the stream's top is checked against the entry stored
//! under that id: the same field and bytes are a duplicate (a retried write whose first
//! reply was lost: skipped, counted in the `redis_sink_duplicates` counter); a different
//! or missing entry is an error naming the id ("lost or foreign write").
//!
//! Recovery: the host restores the last durable epoch D, commits D's committable (the
//! marker becomes D), then asks `pending-transactions`: every epoch with entries above
//! the marker in this subtask's stream, i.e. written for epochs that never became
//! durable. `abort` of such an epoch deletes its entries (XDEL) and moves the stream's
//! last id back to its last remaining entry (XSETID, restoring `max-deleted-entry-id` to
//! its value before the deletion, or `0-1` if nothing had been deleted), so the replayed
//! records are written again under the new epochs and the final stream holds each record
//! once, in input order. An abort cut short between its XDELs and its XSETID (a crash
//! during recovery) leaves no entry to find but the last id in an uncommitted epoch's id
//! space; the next recovery finds nothing pending and moves the last id back to the last
//! entry all the same (a job with no durable epoch restarts at epoch 1 and would have its
//! ids refused otherwise). Consumers reading the stream before a recovery may see entries
//! of an epoch that is later deleted and rewritten: that is why this sink is idempotent
//! (EFFECTIVELY_ONCE), not strict.
//!
//! Refused: a stream that has entries above the marker but whose marker names another
//! owner (or none) is not this sink's; `pending-transactions` fails rather than delete
//! them. Restoring a savepoint older than the marker's `committed` epoch is not
//! supported (its entries are committed and would be written again).

use nop_stream_sdk::{
    Batch, CommitOutcome, LogLevel, PluginError, PluginInfo, Result, Sink, SinkCapability,
    TaskInfo, counter_add, log,
};
use serde::{Deserialize, Serialize};

#[allow(missing_docs, unsafe_code, clippy::all)]
mod wit {
    wit_bindgen::generate!({
        path: "../../wit/deps/redis",
        world: "imports",
    });
}

pub use wit::nop::redis::streams::{
    AddOutcome, Entry, ErrorKind, HashField, RedisError, StreamInfo,
};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["connection","stream"],"properties":{"connection":{"type":"string","description":"a connection granted to the node"},"stream":{"type":"string","description":"key prefix: subtask i writes <stream>:<i>"},"field":{"type":"string","default":"line"},"flush_bytes":{"type":"integer","minimum":1,"default":16777216},"entries_per_transaction":{"type":"integer","minimum":1,"default":5000}}}"#;

/// The largest sequence number of an entry id.
const MAX_SEQ: u64 = u64::MAX;

/// The calls the sink makes on one connection: `nop:redis/streams` in a component
/// ([`Host`]), an in-memory model in unit tests.
#[allow(missing_docs)]
pub trait Streams {
    fn stream_info(&mut self, key: &str) -> std::result::Result<Option<StreamInfo>, RedisError>;
    fn range(
        &mut self,
        key: &str,
        after: &str,
        until: &str,
        count: u32,
    ) -> std::result::Result<Vec<Entry>, RedisError>;
    fn get(&mut self, key: &str, id: &str) -> std::result::Result<Option<Entry>, RedisError>;
    fn add_batch(
        &mut self,
        key: &str,
        entries: &[Entry],
        marker: Option<&HashField>,
    ) -> std::result::Result<Vec<AddOutcome>, RedisError>;
    fn delete(&mut self, key: &str, ids: &[String]) -> std::result::Result<u64, RedisError>;
    fn set_last_id(
        &mut self,
        key: &str,
        last: &str,
        max_deleted: Option<&str>,
    ) -> std::result::Result<(), RedisError>;
    fn hash_get(
        &mut self,
        key: &str,
        field: &str,
    ) -> std::result::Result<Option<String>, RedisError>;
    fn hash_set(
        &mut self,
        key: &str,
        field: &str,
        value: &str,
    ) -> std::result::Result<(), RedisError>;
}

/// `nop:redis/streams` on the connection named in the config.
#[derive(Debug)]
pub struct Host {
    connection: String,
}

impl Streams for Host {
    fn stream_info(&mut self, key: &str) -> std::result::Result<Option<StreamInfo>, RedisError> {
        wit::nop::redis::streams::info(&self.connection, key)
    }
    fn range(
        &mut self,
        key: &str,
        after: &str,
        until: &str,
        count: u32,
    ) -> std::result::Result<Vec<Entry>, RedisError> {
        wit::nop::redis::streams::range(&self.connection, key, after, until, count)
    }
    fn get(&mut self, key: &str, id: &str) -> std::result::Result<Option<Entry>, RedisError> {
        wit::nop::redis::streams::get(&self.connection, key, id)
    }
    fn add_batch(
        &mut self,
        key: &str,
        entries: &[Entry],
        marker: Option<&HashField>,
    ) -> std::result::Result<Vec<AddOutcome>, RedisError> {
        wit::nop::redis::streams::add_batch(&self.connection, key, entries, marker)
    }
    fn delete(&mut self, key: &str, ids: &[String]) -> std::result::Result<u64, RedisError> {
        wit::nop::redis::streams::delete(&self.connection, key, ids)
    }
    fn set_last_id(
        &mut self,
        key: &str,
        last: &str,
        max_deleted: Option<&str>,
    ) -> std::result::Result<(), RedisError> {
        wit::nop::redis::streams::set_last_id(&self.connection, key, last, max_deleted, None)
    }
    fn hash_get(
        &mut self,
        key: &str,
        field: &str,
    ) -> std::result::Result<Option<String>, RedisError> {
        wit::nop::redis::streams::hash_get(&self.connection, key, field)
    }
    fn hash_set(
        &mut self,
        key: &str,
        field: &str,
        value: &str,
    ) -> std::result::Result<(), RedisError> {
        wit::nop::redis::streams::hash_set(&self.connection, key, field, value)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    connection: String,
    stream: String,
    #[serde(default = "default_field")]
    field: String,
    #[serde(default = "default_flush_bytes")]
    flush_bytes: usize,
    #[serde(default = "default_entries")]
    entries_per_transaction: usize,
}

fn default_field() -> String {
    "line".into()
}

fn default_flush_bytes() -> usize {
    16 << 20
}

fn default_entries() -> usize {
    5000
}

fn parse_config(json: &str) -> Result<Config> {
    let bad = |m: String| PluginError::invalid_config(format!("redis-sink config: {m}"));
    let c: Config = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    if c.stream.is_empty() {
        return Err(bad("\"stream\" must not be empty".into()));
    }
    if c.field.is_empty() {
        return Err(bad("\"field\" must not be empty".into()));
    }
    if c.flush_bytes == 0 || c.entries_per_transaction == 0 {
        return Err(bad(
            "\"flush_bytes\" and \"entries_per_transaction\" must be at least 1".into(),
        ));
    }
    Ok(c)
}

/// What `commit`, `abort` and `recover` need: stored in the epoch snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committable {
    /// The subtask's stream key.
    pub stream: String,
    /// Subtask that wrote it.
    pub subtask: u32,
    /// Epoch; the entries are `<epoch>-1 ..= <epoch>-<entries>`.
    pub epoch: u64,
    /// Entries written for the epoch.
    pub entries: u64,
}

/// The open transaction: epoch, records held back, ids used so far.
#[derive(Debug)]
struct Open {
    txn: String,
    epoch: u64,
    /// Sequence number of the next entry (`<epoch>-<next>`), from 1.
    next: u64,
    buffer: Vec<Vec<u8>>,
    bytes: usize,
}

/// The sink instance of one subtask.
pub struct RedisSink<S: Streams = Host> {
    cfg: Config,
    task: TaskInfo,
    /// `{job}:{pipeline}:{operator}:`: the host's transaction id prefix without subtask.
    txn_base: String,
    /// `<stream>:<subtask>`.
    key: String,
    /// `<stream>:<subtask>:nop-sink`.
    marker: String,
    open: Option<Open>,
    /// The marker's owner was checked (first write of this instance).
    owner_checked: bool,
    io: S,
}

fn redis_err(what: &str, e: RedisError) -> PluginError {
    let msg = format!("redis-sink: {what}: {}", e.message);
    match e.kind {
        ErrorKind::Refused => PluginError::invalid_config(msg),
        ErrorKind::Connection => PluginError::io(msg),
        _ => PluginError::transaction(msg),
    }
}

fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (a, b) = id.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

impl<S: Streams> RedisSink<S> {
    /// A sink of subtask `task` with config `cfg` over `io`.
    fn with_io(task: &TaskInfo, cfg: Config, io: S) -> Self {
        let key = format!("{}:{}", cfg.stream, task.subtask_index);
        RedisSink {
            txn_base: format!("{}:{}:{}:", task.job_id, task.pipeline_id, task.operator_id),
            marker: format!("{key}:nop-sink"),
            key,
            task: task.clone(),
            cfg,
            open: None,
            owner_checked: false,
            io,
        }
    }

    fn owner(&self) -> String {
        self.txn_base.trim_end_matches(':').to_owned()
    }

    /// `(subtask, epoch)` of one of this sink's transaction ids.
    fn parse_txn(&self, txn: &str) -> Result<(u32, u64)> {
        let parsed = txn.strip_prefix(&self.txn_base).and_then(|rest| {
            let (s, e) = rest.split_once(':')?;
            Some((s.parse().ok()?, e.parse().ok()?))
        });
        parsed.ok_or_else(|| {
            PluginError::transaction(format!(
                "redis-sink: transaction id {txn:?} is not one of this sink's ({}<subtask>:<epoch>)",
                self.txn_base
            ))
        })
    }

    fn committed(&mut self) -> Result<u64> {
        let v = self
            .io
            .hash_get(&self.marker, "committed")
            .map_err(|e| redis_err(&format!("reading marker `{}`", self.marker), e))?;
        match v {
            None => Ok(0),
            Some(s) => s.parse().map_err(|_| {
                PluginError::transaction(format!(
                    "redis-sink: marker `{}` field committed is {s:?}, not an epoch",
                    self.marker
                ))
            }),
        }
    }

    /// Before this instance's first write: the stream is this sink's (marker owner), or
    /// new (no owner, no entry). A foreign stream is refused, not written into.
    fn check_owner(&mut self) -> Result<()> {
        if self.owner_checked {
            return Ok(());
        }
        let owner = self
            .io
            .hash_get(&self.marker, "owner")
            .map_err(|e| redis_err(&format!("reading marker `{}`", self.marker), e))?;
        let mine = self.owner();
        match owner {
            Some(o) if o == mine => {}
            Some(o) => {
                return Err(PluginError::transaction(format!(
                    "redis-sink: stream `{}` belongs to another sink (marker owner {o:?}, this sink is {mine:?}); use another \"stream\"",
                    self.key
                )));
            }
            None => {
                let info = self.info()?;
                if info.is_some_and(|i| i.length > 0) {
                    return Err(PluginError::transaction(format!(
                        "redis-sink: stream `{}` holds entries this sink did not write (no marker `{}`); use another \"stream\" or remove it",
                        self.key, self.marker
                    )));
                }
            }
        }
        self.owner_checked = true;
        Ok(())
    }

    /// Writes the open transaction's held-back records under their ids.
    fn flush(&mut self) -> Result<()> {
        if self.open.as_ref().is_none_or(|o| o.buffer.is_empty()) {
            return Ok(());
        }
        self.check_owner()?;
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        let records = std::mem::take(&mut open.buffer);
        open.bytes = 0;
        let epoch = open.epoch;
        let first = open.next;
        open.next += records.len() as u64;
        let field = self.cfg.field.clone();
        let mut seq = first;
        for chunk in records.chunks(self.cfg.entries_per_transaction) {
            let entries: Vec<Entry> = chunk
                .iter()
                .map(|r| {
                    let e = Entry {
                        id: format!("{epoch}-{seq}"),
                        fields: vec![(field.clone(), r.clone())],
                    };
                    seq += 1;
                    e
                })
                .collect();
            let marker = HashField {
                key: self.marker.clone(),
                field: "owner".into(),
                value: self.owner(),
            };
            let outcomes = match self.io.add_batch(&self.key, &entries, Some(&marker)) {
                Ok(o) => o,
                // The transaction may or may not have run: retried once, the ids tell.
                Err(e) if matches!(e.kind, ErrorKind::Connection) => {
                    log(
                        LogLevel::Warn,
                        &format!(
                            "redis-sink: retrying a write to `{}`: {}",
                            self.key, e.message
                        ),
                    );
                    self.io
                        .add_batch(&self.key, &entries, Some(&marker))
                        .map_err(|e| redis_err(&format!("writing to `{}`", self.key), e))?
                }
                Err(e) => return Err(redis_err(&format!("writing to `{}`", self.key), e)),
            };
            let mut duplicates = 0u64;
            for (e, o) in entries.iter().zip(&outcomes) {
                if matches!(o, AddOutcome::Added) {
                    continue;
                }
                let stored = self
                    .io
                    .get(&self.key, &e.id)
                    .map_err(|x| redis_err(&format!("reading `{}` {}", self.key, e.id), x))?;
                match stored {
                    Some(s) if s.fields == e.fields => duplicates += 1,
                    Some(_) => {
                        return Err(PluginError::transaction(format!(
                            "redis-sink: stream `{}` already holds a different entry under id {}: lost or foreign write (another writer on this stream, or a job restarted against a stream it did not write)",
                            self.key, e.id
                        )));
                    }
                    None => {
                        return Err(PluginError::transaction(format!(
                            "redis-sink: stream `{}` refuses id {} (at or below its top) but holds no entry under it: lost or foreign write (entry deleted or the stream's last id moved by someone else)",
                            self.key, e.id
                        )));
                    }
                }
            }
            if duplicates > 0 {
                counter_add("redis_sink_duplicates", duplicates);
            }
        }
        Ok(())
    }

    /// Entry ids of epoch `epoch` in the stream, at most `count` from the first.
    fn epoch_ids(&mut self, epoch: u64, count: u32) -> Result<Vec<String>> {
        Ok(self
            .io
            .range(
                &self.key,
                &format!("{epoch}-0"),
                &format!("{epoch}-{MAX_SEQ}"),
                count,
            )
            .map_err(|e| redis_err(&format!("reading `{}`", self.key), e))?
            .into_iter()
            .map(|e| e.id)
            .collect())
    }

    /// Deletes every entry of `epoch` and moves the stream's last id back (module docs).
    fn delete_epoch(&mut self, epoch: u64) -> Result<u64> {
        let Some(before) = self.info()? else {
            return Ok(0);
        };
        let mut deleted = 0;
        loop {
            let ids = self.epoch_ids(epoch, 1000)?;
            if ids.is_empty() {
                break;
            }
            deleted += self
                .io
                .delete(&self.key, &ids)
                .map_err(|e| redis_err(&format!("XDEL `{}`", self.key), e))?;
        }
        if deleted == 0 {
            return Ok(0);
        }
        let after = self.info()?;
        let last_entry = after.as_ref().map_or("", |i| i.last_id.as_str());
        let last = self.move_last_id_back(last_entry, &before.max_deleted_id)?;
        log(
            LogLevel::Info,
            &format!(
                "redis-sink: deleted {deleted} entries of non-durable epoch {epoch} from `{}`; its last id is {last} again",
                self.key
            ),
        );
        Ok(deleted)
    }

    /// XINFO of this subtask's stream (`None`: no such stream).
    fn info(&mut self) -> Result<Option<StreamInfo>> {
        self.io
            .stream_info(&self.key)
            .map_err(|e| redis_err(&format!("XINFO `{}`", self.key), e))
    }

    /// XSETID: moves the stream's last id back to `last_entry` (its last remaining entry;
    /// `0-1` if it has none) and sets the max deleted id to `max_deleted` (its value before
    /// the deletes; `0-1` if none), but never above the new last id, which Redis refuses
    /// (a `max_deleted` above it is left by an abort cut short after its deletes).
    /// Returns the new last id.
    fn move_last_id_back(&mut self, last_entry: &str, max_deleted: &str) -> Result<String> {
        let floor = |id: &str| parse_id(id).unwrap_or((0, 0)).max((0, 1));
        let top = floor(last_entry);
        let max = floor(max_deleted).min(top);
        let last = format!("{}-{}", top.0, top.1);
        self.io
            .set_last_id(&self.key, &last, Some(&format!("{}-{}", max.0, max.1)))
            .map_err(|e| redis_err(&format!("XSETID `{}` {last}", self.key), e))?;
        Ok(last)
    }

    /// Finishes an abort that was cut short between its deletes and its XSETID (a crash
    /// during recovery): no entry above the `committed` epoch is left, but the stream's
    /// last id is still in the id space of an uncommitted epoch. The next run would write
    /// that epoch's ids again (a job with no durable epoch restarts at epoch 1) and have
    /// them refused as "lost or foreign". Moves the last id back to the last entry, as the
    /// abort would have. A last id within committed epochs (a consumer deleted committed
    /// entries) is left alone.
    fn finish_interrupted_abort(&mut self, committed: u64) -> Result<()> {
        let Some(info) = self.info()? else {
            return Ok(());
        };
        let Some(generated) = parse_id(&info.last_generated_id) else {
            return Ok(());
        };
        if generated <= (committed, MAX_SEQ) {
            return Ok(());
        }
        let last = self.move_last_id_back(&info.last_id, &info.max_deleted_id)?;
        log(
            LogLevel::Info,
            &format!(
                "redis-sink: `{}` had its last id at {} with no entry above committed epoch {committed} (an abort cut short); its last id is {last} again",
                self.key, info.last_generated_id
            ),
        );
        Ok(())
    }

    fn decode(&self, committable: &[u8]) -> Result<Committable> {
        let c: Committable = serde_json::from_slice(committable).map_err(|e| {
            PluginError::transaction(format!("redis-sink: malformed committable: {e}"))
        })?;
        if c.stream != self.key {
            return Err(PluginError::transaction(format!(
                "redis-sink: committable of stream `{}` handed to the subtask writing `{}`",
                c.stream, self.key
            )));
        }
        Ok(c)
    }

    fn begin_impl(&mut self, txn: &str) -> Result<()> {
        let (subtask, epoch) = self.parse_txn(txn)?;
        if subtask != self.task.subtask_index {
            return Err(PluginError::transaction(format!(
                "redis-sink: transaction {txn} is not this subtask's ({})",
                self.task.subtask_index
            )));
        }
        if let Some(o) = &self.open {
            return Err(PluginError::transaction(format!(
                "redis-sink: begin {txn} while {} is open",
                o.txn
            )));
        }
        self.open = Some(Open {
            txn: txn.to_owned(),
            epoch,
            next: 1,
            buffer: Vec::new(),
            bytes: 0,
        });
        Ok(())
    }

    fn write_impl(&mut self, txn: &str, batch: &Batch) -> Result<()> {
        let Some(open) = self.open.as_mut().filter(|o| o.txn == txn) else {
            return Err(PluginError::transaction(format!(
                "redis-sink: write to {txn}, which is not the open transaction"
            )));
        };
        for r in batch.iter() {
            open.bytes += r.data.len();
            open.buffer.push(r.data.to_vec());
        }
        if open.bytes >= self.cfg.flush_bytes {
            self.flush()?;
        }
        Ok(())
    }

    fn pre_commit_impl(&mut self, txn: &str) -> Result<Vec<u8>> {
        if self.open.as_ref().is_none_or(|o| o.txn != txn) {
            return Err(PluginError::transaction(format!(
                "redis-sink: pre-commit of {txn}, which is not the open transaction"
            )));
        }
        self.flush()?;
        let open = self
            .open
            .take()
            .ok_or_else(|| PluginError::internal("redis-sink: open transaction vanished"))?;
        let c = Committable {
            stream: self.key.clone(),
            subtask: self.task.subtask_index,
            epoch: open.epoch,
            entries: open.next - 1,
        };
        serde_json::to_vec(&c)
            .map_err(|e| PluginError::internal(format!("redis-sink: committable: {e}")))
    }

    fn commit_impl(&mut self, committable: &[u8]) -> Result<()> {
        let c = self.decode(committable)?;
        if self.committed()? < c.epoch {
            self.io
                .hash_set(&self.marker, "committed", &c.epoch.to_string())
                .map_err(|e| redis_err(&format!("setting marker `{}`", self.marker), e))?;
        }
        Ok(())
    }

    fn abort_impl(&mut self, txn: &str) -> Result<()> {
        let (subtask, epoch) = self.parse_txn(txn)?;
        if subtask != self.task.subtask_index {
            return Err(PluginError::transaction(format!(
                "redis-sink: abort of {txn}, which is not this subtask's ({})",
                self.task.subtask_index
            )));
        }
        if self.open.as_ref().is_some_and(|o| o.txn == txn) {
            self.open = None;
        }
        if self.committed()? >= epoch {
            if !self.epoch_ids(epoch, 1)?.is_empty() {
                return Err(PluginError::transaction(format!(
                    "redis-sink: abort of {txn}: epoch {epoch} is already committed in `{}`",
                    self.key
                )));
            }
            return Ok(());
        }
        self.delete_epoch(epoch)?;
        Ok(())
    }

    fn recover_impl(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        let c = self.decode(committable)?;
        if self.committed()? >= c.epoch {
            return Ok(CommitOutcome::Committed);
        }
        let n = u32::try_from(c.entries.saturating_add(1)).unwrap_or(u32::MAX);
        let found = self.epoch_ids(c.epoch, n)?.len() as u64;
        if found == c.entries {
            // Written and sealed, not yet marked committed: committable.
            Ok(CommitOutcome::Aborted)
        } else {
            log(
                LogLevel::Error,
                &format!(
                    "redis-sink: epoch {} of `{}` should hold {} entries but holds {found}: they were deleted behind the engine's back",
                    c.epoch, self.key, c.entries
                ),
            );
            Ok(CommitOutcome::Unknown)
        }
    }

    fn pending_impl(&mut self) -> Result<Vec<String>> {
        let committed = self.committed()?;
        let mut epochs = Vec::new();
        let mut after = format!("{committed}-{MAX_SEQ}");
        loop {
            let next = self
                .io
                .range(&self.key, &after, "", 1)
                .map_err(|e| redis_err(&format!("reading `{}`", self.key), e))?;
            let Some(e) = next.first() else { break };
            let Some((epoch, _)) = parse_id(&e.id) else {
                break;
            };
            if epochs.is_empty() {
                let owner = self
                    .io
                    .hash_get(&self.marker, "owner")
                    .map_err(|e| redis_err(&format!("reading marker `{}`", self.marker), e))?;
                if owner.as_deref() != Some(self.owner().as_str()) {
                    return Err(PluginError::transaction(format!(
                        "redis-sink: stream `{}` holds entries above the last committed epoch {committed} (from {}) that this sink did not write (marker owner {}); refusing to delete them — use another \"stream\" or remove the stream",
                        self.key,
                        e.id,
                        owner.map_or("none".to_owned(), |o| format!("{o:?}"))
                    )));
                }
            }
            epochs.push(epoch);
            if epoch == u64::MAX {
                break;
            }
            after = format!("{epoch}-{MAX_SEQ}");
        }
        if epochs.is_empty() {
            self.finish_interrupted_abort(committed)?;
        }
        let mut out: Vec<String> = epochs
            .into_iter()
            .map(|e| format!("{}{}:{e}", self.txn_base, self.task.subtask_index))
            .collect();
        if let Some(o) = &self.open
            && !out.contains(&o.txn)
        {
            out.push(o.txn.clone());
        }
        Ok(out)
    }
}

impl Sink for RedisSink<Host> {
    fn describe() -> PluginInfo {
        PluginInfo::sink("redis-sink", "0.1.0")
            .description("Writes records into Redis Streams, one stream per subtask, entry ids <epoch>-<n>; duplicates detected by id (idempotent: effectively-once)")
            .sink_capability(SinkCapability::Idempotent)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(task: &TaskInfo, config: &str) -> Result<Self> {
        let cfg = parse_config(config)?;
        let io = Host {
            connection: cfg.connection.clone(),
        };
        let mut sink = RedisSink::with_io(task, cfg, io);
        // Fails the job at its start on a connection that is not granted, a wrong
        // password or a server that is down.
        sink.committed()?;
        Ok(sink)
    }

    fn begin(&mut self, txn: &str) -> Result<()> {
        self.begin_impl(txn)
    }

    fn write(&mut self, txn: &str, batch: &Batch) -> Result<()> {
        self.write_impl(txn, batch)
    }

    fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        self.pre_commit_impl(txn)
    }

    fn commit(&mut self, committable: &[u8]) -> Result<()> {
        self.commit_impl(committable)
    }

    fn abort(&mut self, txn: &str) -> Result<()> {
        self.abort_impl(txn)
    }

    fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        self.recover_impl(committable)
    }

    fn pending_transactions(&mut self) -> Result<Vec<String>> {
        self.pending_impl()
    }

    fn close(&mut self) {
        self.open = None;
    }
}

nop_stream_sdk::export_sink!(RedisSink<Host>);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    /// Redis stream semantics that matter here: ids above the last id, XDEL raising
    /// max-deleted, XSETID, hashes; `fail_next_reply` loses the reply of one add-batch
    /// after applying it.
    /// One stream: entries by id, last generated id, max deleted id.
    type ModelStream = (
        BTreeMap<(u64, u64), Vec<(String, Vec<u8>)>>,
        (u64, u64),
        (u64, u64),
    );

    #[derive(Default)]
    struct Model {
        streams: HashMap<String, ModelStream>,
        hashes: HashMap<(String, String), String>,
        fail_next_reply: bool,
    }

    fn id(s: &str) -> (u64, u64) {
        parse_id(s).unwrap()
    }

    fn fmt(i: (u64, u64)) -> String {
        format!("{}-{}", i.0, i.1)
    }

    impl Streams for Model {
        fn stream_info(
            &mut self,
            key: &str,
        ) -> std::result::Result<Option<StreamInfo>, RedisError> {
            Ok(self.streams.get(key).map(|(m, last, del)| StreamInfo {
                length: m.len() as u64,
                first_id: m.keys().next().map(|k| fmt(*k)).unwrap_or_default(),
                last_id: m.keys().next_back().map(|k| fmt(*k)).unwrap_or_default(),
                last_generated_id: fmt(*last),
                max_deleted_id: fmt(*del),
                entries_added: 0,
            }))
        }
        fn range(
            &mut self,
            key: &str,
            after: &str,
            until: &str,
            count: u32,
        ) -> std::result::Result<Vec<Entry>, RedisError> {
            let Some((m, _, _)) = self.streams.get(key) else {
                return Ok(Vec::new());
            };
            let lo = if after.is_empty() {
                None
            } else {
                Some(id(after))
            };
            let hi = if until.is_empty() {
                (u64::MAX, u64::MAX)
            } else {
                id(until)
            };
            Ok(m.iter()
                .filter(|(k, _)| lo.is_none_or(|l| **k > l) && **k <= hi)
                .take(count as usize)
                .map(|(k, v)| Entry {
                    id: fmt(*k),
                    fields: v.clone(),
                })
                .collect())
        }
        fn get(&mut self, key: &str, i: &str) -> std::result::Result<Option<Entry>, RedisError> {
            Ok(self
                .range(key, "", i, u32::MAX)?
                .into_iter()
                .find(|e| e.id == i))
        }
        fn add_batch(
            &mut self,
            key: &str,
            entries: &[Entry],
            marker: Option<&HashField>,
        ) -> std::result::Result<Vec<AddOutcome>, RedisError> {
            let (m, last, _) = self.streams.entry(key.to_owned()).or_default();
            let mut out = Vec::new();
            for e in entries {
                let i = id(&e.id);
                if i <= *last {
                    out.push(AddOutcome::NotAboveTop);
                } else {
                    m.insert(i, e.fields.clone());
                    *last = i;
                    out.push(AddOutcome::Added);
                }
            }
            if let Some(h) = marker {
                self.hashes
                    .insert((h.key.clone(), h.field.clone()), h.value.clone());
            }
            if std::mem::take(&mut self.fail_next_reply) {
                return Err(RedisError {
                    kind: ErrorKind::Connection,
                    message: "reply lost".into(),
                });
            }
            Ok(out)
        }
        fn delete(&mut self, key: &str, ids: &[String]) -> std::result::Result<u64, RedisError> {
            let Some((m, _, del)) = self.streams.get_mut(key) else {
                return Ok(0);
            };
            let mut n = 0;
            for i in ids {
                if m.remove(&id(i)).is_some() {
                    n += 1;
                    *del = (*del).max(id(i));
                }
            }
            Ok(n)
        }
        fn set_last_id(
            &mut self,
            key: &str,
            last: &str,
            max_deleted: Option<&str>,
        ) -> std::result::Result<(), RedisError> {
            let (m, l, del) = self.streams.get_mut(key).unwrap();
            assert!(
                m.keys().next_back().is_none_or(|t| *t <= id(last)),
                "XSETID below the top entry"
            );
            *l = id(last);
            match max_deleted {
                Some(d) => {
                    assert!(id(d) <= id(last), "MAXDELETEDID above the last id");
                    *del = id(d);
                }
                // Redis refuses XSETID below the current max deleted id without one.
                None => assert!(*del <= id(last), "XSETID below the max deleted id"),
            }
            Ok(())
        }
        fn hash_get(
            &mut self,
            key: &str,
            field: &str,
        ) -> std::result::Result<Option<String>, RedisError> {
            Ok(self
                .hashes
                .get(&(key.to_owned(), field.to_owned()))
                .cloned())
        }
        fn hash_set(
            &mut self,
            key: &str,
            field: &str,
            value: &str,
        ) -> std::result::Result<(), RedisError> {
            self.hashes
                .insert((key.to_owned(), field.to_owned()), value.to_owned());
            Ok(())
        }
    }

    fn sink(model: Model) -> RedisSink<Model> {
        let cfg = parse_config(r#"{"connection":"r","stream":"out","entries_per_transaction":2}"#)
            .unwrap();
        RedisSink::with_io(&TaskInfo::for_tests(), cfg, model)
    }

    fn txn(s: &RedisSink<Model>, epoch: u64) -> String {
        format!("{}{}:{epoch}", s.txn_base, s.task.subtask_index)
    }

    fn batch(records: &[&str]) -> Batch {
        let mut b = Batch::default();
        for r in records {
            b.push(r.as_bytes());
        }
        b
    }

    /// Runs one epoch through pre-commit; returns the committable.
    fn epoch(s: &mut RedisSink<Model>, e: u64, records: &[&str]) -> Vec<u8> {
        let t = txn(s, e);
        s.begin_impl(&t).unwrap();
        s.write_impl(&t, &batch(records)).unwrap();
        s.pre_commit_impl(&t).unwrap()
    }

    /// The stream's (last generated id, max deleted id).
    fn last_ids(s: &mut RedisSink<Model>) -> (String, String) {
        let info = s.io.stream_info("out:0").unwrap().unwrap();
        (info.last_generated_id, info.max_deleted_id)
    }

    fn contents(s: &mut RedisSink<Model>) -> Vec<(String, String)> {
        let key = s.key.clone();
        s.io.range(&key, "", "", u32::MAX)
            .unwrap()
            .into_iter()
            .map(|e| (e.id, String::from_utf8(e.fields[0].1.clone()).unwrap()))
            .collect()
    }

    #[test]
    fn a_crash_after_pre_commit_is_rewritten_once_under_new_epochs() {
        let mut s = sink(Model::default());
        let c1 = epoch(&mut s, 1, &["a", "b", "c"]);
        s.commit_impl(&c1).unwrap();
        // Epoch 2 pre-committed (visible), then the process dies before it is durable.
        epoch(&mut s, 2, &["d", "e"]);
        let _ = epoch(&mut s, 3, &["f"]);
        let model = std::mem::take(&mut s.io);
        // Restart from durable epoch 1; the host re-commits 1, then aborts what is pending.
        let mut s = sink(model);
        s.commit_impl(&c1).unwrap();
        let pending = s.pending_impl().unwrap();
        assert_eq!(pending, vec![txn(&s, 2), txn(&s, 3)]);
        for t in pending {
            s.abort_impl(&t).unwrap();
        }
        assert!(s.pending_impl().unwrap().is_empty());
        assert_eq!(last_ids(&mut s), ("1-3".into(), "0-1".into()));
        // The replay cuts epochs differently, under new numbers.
        let c5 = epoch(&mut s, 5, &["d"]);
        s.commit_impl(&c5).unwrap();
        let c6 = epoch(&mut s, 6, &["e", "f"]);
        s.commit_impl(&c6).unwrap();
        let got: Vec<String> = contents(&mut s).into_iter().map(|x| x.1).collect();
        assert_eq!(got, ["a", "b", "c", "d", "e", "f"]);
        assert_eq!(contents(&mut s)[3].0, "5-1");
        // Committing again changes nothing; recover says committed.
        s.commit_impl(&c5).unwrap();
        assert_eq!(s.committed().unwrap(), 6);
        assert_eq!(s.recover_impl(&c5).unwrap(), CommitOutcome::Committed);
    }

    #[test]
    fn an_abort_cut_short_after_its_deletes_is_finished_by_the_next_recovery() {
        let mut s = sink(Model::default());
        let c1 = epoch(&mut s, 1, &["a", "b", "c"]);
        s.commit_impl(&c1).unwrap();
        epoch(&mut s, 2, &["d", "e", "f"]);
        let model = std::mem::take(&mut s.io);
        // A recovery deletes epoch 2's entries and dies before its XSETID.
        let mut s = sink(model);
        s.commit_impl(&c1).unwrap();
        assert_eq!(s.pending_impl().unwrap(), vec![txn(&s, 2)]);
        let ids = s.epoch_ids(2, 1000).unwrap();
        assert_eq!(s.io.delete("out:0", &ids).unwrap(), 3);
        let model = std::mem::take(&mut s.io);
        // The next run finds nothing pending, but the last id is still 2-3: the restart
        // (no durable epoch after 1, so epoch 2 again) would have 2-1 refused.
        let mut s = sink(model);
        s.commit_impl(&c1).unwrap();
        assert!(s.pending_impl().unwrap().is_empty());
        assert_eq!(last_ids(&mut s), ("1-3".into(), "1-3".into()));
        let c2 = epoch(&mut s, 2, &["d", "e", "f"]);
        s.commit_impl(&c2).unwrap();
        let got: Vec<String> = contents(&mut s).into_iter().map(|x| x.1).collect();
        assert_eq!(got, ["a", "b", "c", "d", "e", "f"]);
        // Committed entries deleted by a consumer leave the last id alone.
        let mut s = sink(std::mem::take(&mut s.io));
        let top = contents(&mut s).last().unwrap().0.clone();
        s.io.delete("out:0", &[top]).unwrap();
        s.commit_impl(&c2).unwrap();
        assert!(s.pending_impl().unwrap().is_empty());
        assert_eq!(last_ids(&mut s).0, "2-3");
    }

    #[test]
    fn a_lost_reply_is_retried_and_counted_as_duplicates_and_a_foreign_entry_is_an_error() {
        let mut s = sink(Model {
            fail_next_reply: true,
            ..Model::default()
        });
        let c = epoch(&mut s, 1, &["a", "b", "c"]);
        assert_eq!(contents(&mut s).len(), 3);
        s.commit_impl(&c).unwrap();
        // A sealed, uncommitted epoch is committable (aborted); one with entries missing
        // is unknown.
        let c2 = epoch(&mut s, 2, &["x", "y"]);
        assert_eq!(s.recover_impl(&c2).unwrap(), CommitOutcome::Aborted);
        s.io.delete("out:0", &["2-1".into()]).unwrap();
        assert_eq!(s.recover_impl(&c2).unwrap(), CommitOutcome::Unknown);
        // A stream with entries this sink did not write is neither written nor cleaned.
        let mut s = sink(Model::default());
        let foreign = Entry {
            id: "1-1".into(),
            fields: vec![("line".into(), b"zz".to_vec())],
        };
        s.io.add_batch("out:0", std::slice::from_ref(&foreign), None)
            .unwrap();
        let e = s.pending_impl().unwrap_err();
        assert!(e.message.contains("did not write"), "{}", e.message);
        let t = txn(&s, 1);
        s.begin_impl(&t).unwrap();
        s.write_impl(&t, &batch(&["a"])).unwrap();
        let e = s.pre_commit_impl(&t).unwrap_err();
        assert!(e.message.contains("did not write"), "{}", e.message);
        // Another writer's entry under one of our ids in our own stream.
        let mut s = sink(Model::default());
        let c = epoch(&mut s, 1, &["a"]);
        s.commit_impl(&c).unwrap();
        s.io.add_batch(
            "out:0",
            &[Entry {
                id: "2-1".into(),
                ..foreign
            }],
            None,
        )
        .unwrap();
        let t = txn(&s, 2);
        s.begin_impl(&t).unwrap();
        s.write_impl(&t, &batch(&["b"])).unwrap();
        let e = s.pre_commit_impl(&t).unwrap_err();
        assert!(
            e.message.contains("different entry under id 2-1")
                && e.message.contains("lost or foreign write"),
            "{}",
            e.message
        );
    }

    #[test]
    fn configs_are_checked_and_it_is_idempotent() {
        assert!(parse_config(r#"{"connection":"r","stream":"s"}"#).is_ok());
        for bad in [
            r#"{"connection":"r"}"#,
            r#"{"connection":"r","stream":""}"#,
            r#"{"connection":"r","stream":"s","flush_bytes":0}"#,
            r#"{"connection":"r","stream":"s","x":1}"#,
        ] {
            assert!(parse_config(bad).is_err(), "{bad}");
        }
        let info = RedisSink::describe();
        assert_eq!(info.sink_capability, Some(SinkCapability::Idempotent));
        serde_json::from_str::<serde_json::Value>(&info.config_schema).unwrap();
    }
}
