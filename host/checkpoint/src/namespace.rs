//! The checkpoint namespace over an object store (design §6, "Storage by location"),
//! written once for every backend: segments, manifests, the epoch log, attempt claims and
//! retention, with no rename and no append (names in [`crate::names`]).
//!
//! - **The epoch record is the single point of linearisation.** A manifest is written as
//!   an attempt-scoped candidate (`manifests/<epoch>.a<attempt>.json`), then the epoch
//!   record (`epochs/<epoch>.json`) pointing at it is *created* conditionally: the epoch is
//!   durable exactly when that create succeeds. A zombie attempt that reaches the same
//!   epoch finds the record there and loses ([`StorageError::EpochTaken`]); a new attempt
//!   fences the epochs its predecessors created but never made durable by creating
//!   *aborted* records for them ([`Namespace::abort_epoch`]), so a write stalled in a
//!   fenced attempt can never make one durable later.
//! - **A retry that finds identical bytes is a success** (a lost acknowledgement,
//!   FLINK-28265): every create is retried with the same bytes on a transient failure.
//! - **An unknown write outcome keeps its files out of retention until it is resolved**
//!   (FLINK-22494): an epoch record whose create failed with an unknown outcome is held in
//!   memory with its bytes; retention keeps its files, and resolves it first by creating
//!   it again.
//! - **The epoch log is one object per record**, created once; attempts are claimed by
//!   creating `attempts/<n>`, never by read-modify-write.
//! - **Retention is a pure plan** ([`plan_retention`]) over what a listing found, then
//!   deletes: it never deletes what a kept manifest references, an epoch at or after the
//!   newest kept one (in flight), nor anything of an unresolved epoch.
//! - Namespaces written by older hosts (`manifests/<epoch>.json`, `epochs.log`, `attempt`)
//!   are read as they are: a manifest of that layout is durable by its presence.

use crate::coordinator::EpochState;
use crate::manifest::EpochManifest;
use crate::names;
use nop_stream_api::{AttemptId, EpochId};
use nop_stream_storage::{Created, ErrorKind, ObjectStore, ObjectWriter, Scoped, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Epoch claims of this process that found the epoch's record created by another attempt
/// ([`StorageError::EpochTaken`]): a zombie or deposed attempt stopped by the store's
/// conditional create (design §6). Counted per process, over every namespace.
static REFUSED_EPOCH_CLAIMS: AtomicU64 = AtomicU64::new(0);

/// How many epoch claims of this process the store refused because another attempt held
/// the epoch (the `nopstream_epoch_claims_refused_total` counter). Monotonic.
pub fn refused_epoch_claims() -> u64 {
    REFUSED_EPOCH_CLAIMS.load(Ordering::Relaxed)
}

/// Storage failures of a namespace.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The object store failed (its message names the location and the object).
    #[error("checkpoint storage {0}")]
    Store(StoreError),
    /// A manifest, record or segment failed its checksum or could not be decoded.
    #[error("checkpoint storage {location}: object {object}: corrupt: {message}")]
    Corrupt {
        /// The namespace's location.
        location: String,
        /// The object.
        object: String,
        /// What is wrong.
        message: String,
    },
    /// Another attempt's record of this epoch exists: this attempt lost the epoch (it is a
    /// zombie, or a newer attempt fenced the epoch) and must retire.
    #[error(
        "checkpoint storage {location}: epoch {epoch} is already {taken}; attempt {attempt} \
         lost it and must retire"
    )]
    EpochTaken {
        /// The namespace's location.
        location: String,
        /// The epoch.
        epoch: u64,
        /// This attempt.
        attempt: u32,
        /// What holds it, in words.
        taken: String,
    },
}

impl From<StoreError> for StorageError {
    fn from(e: StoreError) -> Self {
        StorageError::Store(e)
    }
}

impl StorageError {
    fn corrupt(ns: &Namespace, object: &str, message: impl Into<String>) -> Self {
        StorageError::Corrupt {
            location: ns.describe(),
            object: object.to_owned(),
            message: message.into(),
        }
    }

    /// Whether the failure left a write's outcome unknown.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, StorageError::Store(e) if e.kind == ErrorKind::OutcomeUnknown)
    }
}

/// Result alias.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// One record of the epoch log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochLogRecord {
    /// Epoch.
    pub epoch: EpochId,
    /// New state.
    pub state: EpochState,
    /// Attempt that recorded it.
    pub attempt: AttemptId,
    /// Wall-clock time, ms since the Unix epoch.
    pub at_ms: u64,
    /// Reason (aborts) or remark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What an epoch record says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum EpochRecord {
    /// The epoch is durable; its manifest is `manifest`.
    Durable {
        /// The epoch.
        epoch: u64,
        /// The attempt that made it durable.
        attempt: u32,
        /// The manifest's object name, relative to the namespace.
        manifest: String,
        /// The manifest's checksum ([`EpochManifest::checksum`]).
        checksum: String,
    },
    /// The epoch never becomes durable: a newer attempt fenced it, or it was aborted.
    Aborted {
        /// The epoch.
        epoch: u64,
        /// The attempt that aborted it.
        attempt: u32,
        /// Why.
        reason: String,
    },
}

impl EpochRecord {
    fn describe(&self) -> String {
        match self {
            EpochRecord::Durable { attempt, .. } => format!("durable by attempt {attempt}"),
            EpochRecord::Aborted {
                attempt, reason, ..
            } => format!("aborted by attempt {attempt} ({reason})"),
        }
    }
}

/// How many of the newest epochs keep their epoch log records through retention (the
/// checkpoint history `nopstream checkpoints` and the status API show); older records go
/// with their epochs, apart from the newest epoch's.
pub const LOG_HISTORY_EPOCHS: u64 = 256;

/// How many times a transient failure (unavailable, or an unknown outcome of an
/// idempotent write) is retried, with a pause of 50 ms doubling each time.
pub const RETRIES: u32 = 4;

/// A checkpoint namespace (design §3.1): one job pipeline's checkpoints, at a prefix of
/// an object store.
#[derive(Debug)]
pub struct Namespace {
    store: Scoped,
    /// Epoch records whose create had an unknown outcome, with their bytes.
    unresolved: Mutex<BTreeMap<u64, Vec<u8>>>,
    /// The segment directories (epochs) each durable manifest this handle published or
    /// read for retention references, by manifest object name. A manifest object is
    /// written once under a name of its own epoch and attempt and never changed, so
    /// [`Self::retain`] reads each kept manifest once per handle, not once per epoch.
    referenced: Mutex<BTreeMap<String, BTreeSet<u64>>>,
    /// The epoch log records this handle has read, by object name. A record is created
    /// once and never changed (retention may delete it), so [`Self::read_log`] gets only
    /// the names it has not seen: a handle kept by a reader that polls (the metrics
    /// scrape, the status API) lists the log and reads only what is new.
    log_cache: Mutex<BTreeMap<String, EpochLogRecord>>,
}

/// What a namespace listing found: the durable epochs and their manifests' names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Durable {
    /// Durable epoch -> manifest object name.
    pub manifests: BTreeMap<u64, String>,
    /// Epochs with an aborted record.
    pub aborted: BTreeSet<u64>,
}

impl Namespace {
    /// The namespace at `store`'s prefix.
    pub fn new(store: Scoped) -> Self {
        Namespace {
            store,
            unresolved: Mutex::default(),
            referenced: Mutex::default(),
            log_cache: Mutex::default(),
        }
    }

    /// Opens the namespace at `location`.
    ///
    /// # Errors
    /// The store cannot be opened or reached (naming the location).
    pub fn open(location: &nop_stream_storage::Location) -> Result<Self> {
        Ok(Namespace::new(location.open()?))
    }

    /// Where it is, for messages (no credentials).
    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// The store under the namespace's prefix.
    pub fn store(&self) -> &Scoped {
        &self.store
    }

    fn retry<T>(&self, mut f: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut pause = Duration::from_millis(50);
        for _ in 0..RETRIES {
            match f() {
                Err(e) if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::OutcomeUnknown) => {
                    tracing::debug!("checkpoint storage: retrying after {e}");
                    std::thread::sleep(pause);
                    pause *= 2;
                }
                r => return r,
            }
        }
        f()
    }

    /// Reads an epoch or log record that was just listed; `None` if it is gone. Records
    /// are created once and deleted only by retention, which may run in another process
    /// (a deposed leader's last retention): a record listed but gone when read was
    /// retained away, not lost.
    fn get_unless_retained(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.retry(|| self.store.get(name)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `name` with `bytes` unless it exists, retrying transient failures with the
    /// same bytes (a retry that finds them is a success).
    fn create(&self, name: &str, bytes: &[u8]) -> Result<Created, StoreError> {
        self.retry(|| self.store.put_if_absent(name, bytes))
    }

    // --- segments ---

    /// Writes a segment file durably (relative name inside the namespace). Segment names
    /// are scoped by attempt ([`names::segment_file`]), so no other attempt writes it.
    ///
    /// # Errors
    /// Storage failures.
    pub fn write_segment(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        Ok(self.retry(|| self.store.put(rel, bytes))?)
    }

    /// Opens segment file `rel` to be written in parts; it is durable and visible whole
    /// once [`ObjectWriter::finish`] returns, and absent if the writer is dropped
    /// unfinished.
    ///
    /// # Errors
    /// Storage failures.
    pub fn segment_writer(&self, rel: &str) -> Result<Box<dyn ObjectWriter + '_>> {
        Ok(self.store.writer(rel)?)
    }

    /// Reads `len` bytes at `offset` of segment file `rel`.
    ///
    /// # Errors
    /// Storage failures; [`StorageError::Corrupt`] if the file is shorter than the range
    /// (cut short after the epoch was published).
    pub fn read_range(&self, rel: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.retry(|| self.store.get_range(rel, offset, len))
            .map_err(|e| {
                if e.kind == ErrorKind::ShortRead {
                    StorageError::corrupt(
                        self,
                        rel,
                        format!(
                            "segment truncated: {}; it was cut short (a full disk, an \
                             interrupted copy) after the epoch was published",
                            e.message
                        ),
                    )
                } else {
                    e.into()
                }
            })
    }

    /// Size of segment file `rel`, if it exists.
    ///
    /// # Errors
    /// Storage failures.
    pub fn segment_size(&self, rel: &str) -> Result<Option<u64>> {
        Ok(self
            .retry(|| self.store.list(rel))?
            .into_iter()
            .find(|m| m.name == rel)
            .map(|m| m.size))
    }

    /// Verifies every segment `m` references before anything relies on it (design §8a: a
    /// restore never destroys what it would replace): each file exists, is long enough,
    /// and each payload matches its checksum.
    ///
    /// # Errors
    /// [`StorageError::Corrupt`] naming the file and the state; storage failures.
    pub fn verify_segments(&self, m: &EpochManifest) -> Result<()> {
        for t in &m.tasks {
            for s in t.segments.iter().chain(&t.operator_state) {
                let bytes = self
                    .read_range(&s.file, s.offset, s.len)
                    .map_err(|e| match e {
                        StorageError::Store(e) if e.is_not_found() => StorageError::corrupt(
                            self,
                            &s.file,
                            format!(
                                "missing: the manifest of epoch {} references it for state `{}` of \
                             operator `{}` (shard {})",
                                m.epoch, s.state, s.operator_id, s.shard
                            ),
                        ),
                        e => e,
                    })?;
                let got = crate::manifest::payload_checksum(&bytes);
                if got != s.checksum {
                    return Err(StorageError::corrupt(
                        self,
                        &s.file,
                        format!(
                            "checksum mismatch at bytes {}..{} (state `{}` of operator `{}`, \
                             shard {}): {got}, the manifest of epoch {} says {}",
                            s.offset,
                            s.offset + s.len,
                            s.state,
                            s.operator_id,
                            s.shard,
                            m.epoch,
                            s.checksum
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    // --- manifests and epoch records ---

    /// Publishes `manifest`: its candidate object, then the epoch record that makes it
    /// durable (design §6: the record is the point of linearisation).
    ///
    /// # Errors
    /// - [`StorageError::EpochTaken`]: another attempt holds the epoch (this one retires);
    /// - an unknown outcome ([`StorageError::outcome_unknown`]): the epoch is held as
    ///   unresolved, and its files stay until a later call resolves it;
    /// - other storage failures: the epoch is not durable.
    pub fn publish_manifest(&self, manifest: &EpochManifest) -> Result<()> {
        let name = self.write_candidate(manifest)?;
        self.finish_publish(manifest, name)
    }

    /// Seals `manifest` and publishes it (as [`Self::publish_manifest`]) from a single
    /// encoding, made in `buf` ([`EpochManifest::seal_encoded_into`]). The epoch loop uses
    /// it, keeping `buf` across epochs: at 10,000 subtasks a manifest is 6 MB of JSON.
    ///
    /// # Errors
    /// As [`Self::publish_manifest`].
    pub fn seal_and_publish(&self, manifest: &mut EpochManifest, buf: &mut Vec<u8>) -> Result<()> {
        manifest.seal_encoded_into(buf);
        let name = self.put_candidate(manifest, buf)?;
        self.finish_publish(manifest, name)
    }

    fn finish_publish(&self, manifest: &EpochManifest, name: String) -> Result<()> {
        self.make_durable(manifest, &name)?;
        self.referenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, segment_dirs(manifest));
        Ok(())
    }

    /// The first half of [`Self::publish_manifest`]: writes `manifest` as its attempt's
    /// candidate and returns the candidate's name. Nothing is durable yet.
    ///
    /// # Errors
    /// Storage failures.
    pub fn write_candidate(&self, manifest: &EpochManifest) -> Result<String> {
        let bytes = serde_json::to_vec(manifest).map_err(|e| {
            let name = names::manifest_candidate(manifest.epoch.0, manifest.attempt.0);
            StorageError::corrupt(self, &name, e.to_string())
        })?;
        self.put_candidate(manifest, &bytes)
    }

    /// Writes `bytes`, the JSON of `manifest`, as its attempt's candidate.
    fn put_candidate(&self, manifest: &EpochManifest, bytes: &[u8]) -> Result<String> {
        let name = names::manifest_candidate(manifest.epoch.0, manifest.attempt.0);
        // A candidate written again may reference other segments: forget what it did.
        self.referenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&name);
        self.retry(|| self.store.put(&name, bytes))?;
        Ok(name)
    }

    /// The second half of [`Self::publish_manifest`]: creates the epoch record pointing at
    /// candidate `name` of `manifest`, which makes the epoch durable.
    ///
    /// # Errors
    /// As [`Self::publish_manifest`].
    pub fn make_durable(&self, manifest: &EpochManifest, name: &str) -> Result<()> {
        let record = EpochRecord::Durable {
            epoch: manifest.epoch.0,
            attempt: manifest.attempt.0,
            manifest: name.to_owned(),
            checksum: manifest.checksum.clone(),
        };
        self.claim_epoch(manifest.epoch.0, manifest.attempt.0, &record)
    }

    /// Creates the record of `epoch`; it must end up holding exactly `record`.
    fn claim_epoch(&self, epoch: u64, attempt: u32, record: &EpochRecord) -> Result<()> {
        let rname = names::epoch_record(epoch);
        let rbytes = serde_json::to_vec(record)
            .map_err(|e| StorageError::corrupt(self, &rname, e.to_string()))?;
        match self.create(&rname, &rbytes) {
            Ok(c) if c.holds(&rbytes) => Ok(()),
            Ok(Created::Exists(other)) => {
                REFUSED_EPOCH_CLAIMS.fetch_add(1, Ordering::Relaxed);
                Err(StorageError::EpochTaken {
                    location: self.describe(),
                    epoch,
                    attempt,
                    taken: serde_json::from_slice::<EpochRecord>(&other)
                        .map(|r| r.describe())
                        .unwrap_or_else(|_| "held by an unreadable record".into()),
                })
            }
            Ok(Created::Created) => unreachable!("holds() covers a create"),
            Err(e) if e.kind == ErrorKind::OutcomeUnknown => {
                self.unresolved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(epoch, rbytes);
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Fences `epoch` for `attempt`: creates its aborted record unless it has a record.
    /// Returns the durable record if the epoch turned out durable (an earlier attempt's
    /// publish landed although its acknowledgement was lost).
    ///
    /// # Errors
    /// Storage failures.
    pub fn abort_epoch(
        &self,
        epoch: EpochId,
        attempt: AttemptId,
        reason: &str,
    ) -> Result<Option<EpochRecord>> {
        let rname = names::epoch_record(epoch.0);
        let record = EpochRecord::Aborted {
            epoch: epoch.0,
            attempt: attempt.0,
            reason: reason.to_owned(),
        };
        let rbytes = serde_json::to_vec(&record)
            .map_err(|e| StorageError::corrupt(self, &rname, e.to_string()))?;
        match self.create(&rname, &rbytes)? {
            Created::Created => Ok(None),
            Created::Exists(other) => {
                let r: EpochRecord = serde_json::from_slice(&other)
                    .map_err(|e| StorageError::corrupt(self, &rname, e.to_string()))?;
                Ok(match r {
                    EpochRecord::Durable { .. } => Some(r),
                    EpochRecord::Aborted { .. } => None,
                })
            }
        }
    }

    /// Resolves the epochs whose record create had an unknown outcome by creating the
    /// same record again; those still unknown stay held.
    fn resolve_unresolved(&self) {
        let held: Vec<(u64, Vec<u8>)> = self
            .unresolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(e, b)| (*e, b.clone()))
            .collect();
        for (epoch, bytes) in held {
            if let Ok(c) = self.create(&names::epoch_record(epoch), &bytes) {
                tracing::info!(
                    epoch,
                    durable = c.holds(&bytes),
                    "checkpoint storage: an epoch record of unknown outcome is resolved"
                );
                self.unresolved
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&epoch);
            }
        }
    }

    /// Epochs whose record create has an unknown outcome, not yet resolved.
    pub fn unresolved_epochs(&self) -> BTreeSet<u64> {
        self.unresolved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// The durable epochs and their manifests: every durable epoch record, and every
    /// manifest of the older layout without a record.
    ///
    /// # Errors
    /// Storage failures; a record that does not decode.
    pub fn durable(&self) -> Result<Durable> {
        let mut out = Durable::default();
        for m in self.retry(|| self.store.list(names::EPOCHS))? {
            let Some(epoch) = names::epoch_of_record(&m.name) else {
                continue;
            };
            let Some(bytes) = self.get_unless_retained(&m.name)? else {
                continue;
            };
            let r: EpochRecord = serde_json::from_slice(&bytes)
                .map_err(|e| StorageError::corrupt(self, &m.name, e.to_string()))?;
            match r {
                EpochRecord::Durable { manifest, .. } => {
                    out.manifests.insert(epoch, manifest);
                }
                EpochRecord::Aborted { .. } => {
                    out.aborted.insert(epoch);
                }
            }
        }
        for m in self.retry(|| self.store.list(names::MANIFESTS))? {
            if let Some((epoch, None)) = names::parse_manifest(&m.name)
                && !out.aborted.contains(&epoch)
            {
                out.manifests.entry(epoch).or_insert(m.name);
            }
        }
        Ok(out)
    }

    /// Durable epochs, ascending.
    ///
    /// # Errors
    /// As [`Self::durable`].
    pub fn manifest_epochs(&self) -> Result<Vec<EpochId>> {
        Ok(self.durable()?.manifests.into_keys().map(EpochId).collect())
    }

    /// Whether the namespace has a durable epoch.
    ///
    /// # Errors
    /// As [`Self::durable`].
    pub fn has_durable(&self) -> Result<bool> {
        Ok(!self.durable()?.manifests.is_empty())
    }

    /// Reads and verifies the manifest of durable `epoch`.
    ///
    /// # Errors
    /// No such durable epoch; storage failures; a checksum mismatch.
    pub fn read_manifest(&self, epoch: EpochId) -> Result<EpochManifest> {
        let d = self.durable()?;
        let name = d.manifests.get(&epoch.0).cloned().ok_or_else(|| {
            StorageError::Store(StoreError::new(
                self.describe(),
                Some(&names::epoch_record(epoch.0)),
                ErrorKind::NotFound,
                format!("epoch {epoch} is not durable here"),
            ))
        })?;
        self.read_manifest_object(&name)
    }

    fn read_manifest_object(&self, name: &str) -> Result<EpochManifest> {
        let bytes = self.retry(|| self.store.get(name))?;
        let m: EpochManifest = serde_json::from_slice(&bytes)
            .map_err(|e| StorageError::corrupt(self, name, e.to_string()))?;
        if !m.verify() {
            return Err(StorageError::corrupt(
                self,
                name,
                "manifest checksum mismatch",
            ));
        }
        Ok(m)
    }

    /// The newest durable manifest, if any.
    ///
    /// # Errors
    /// As [`Self::read_manifest`].
    pub fn latest_manifest(&self) -> Result<Option<EpochManifest>> {
        match self.durable()?.manifests.into_iter().next_back() {
            Some((_, name)) => self.read_manifest_object(&name).map(Some),
            None => Ok(None),
        }
    }

    // --- the epoch log ---

    /// Records `record` in the epoch log: one object, created once (a retry finds it).
    ///
    /// # Errors
    /// Storage failures.
    pub fn append_log(&self, record: &EpochLogRecord) -> Result<()> {
        let (rank, state) = log_rank(record.state);
        let name = names::log_record(record.epoch.0, rank, state, record.attempt.0);
        let bytes = serde_json::to_vec(record)
            .map_err(|e| StorageError::corrupt(self, &name, e.to_string()))?;
        self.create(&name, &bytes)?;
        Ok(())
    }

    /// Every epoch log record, by epoch, then attempt, then state (the older layout's
    /// `epochs.log` merged in; a torn last line of it is ignored).
    ///
    /// Lists the log and reads only the records this handle has not read before (records
    /// are immutable; names no longer listed are forgotten), so polling one handle costs a
    /// listing plus the new records, not the whole history.
    ///
    /// # Errors
    /// Storage failures; a record that does not parse (naming it).
    pub fn read_log(&self) -> Result<Vec<EpochLogRecord>> {
        let mut out: Vec<EpochLogRecord> = match self.store.get(names::LEGACY_LOG) {
            Ok(text) => String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let listed = self.retry(|| self.store.list(names::LOG))?;
        let mut cache = self.log_cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = BTreeMap::new();
        for m in listed {
            let record = match cache.remove(&m.name) {
                Some(r) => r,
                None => {
                    let Some(bytes) = self.get_unless_retained(&m.name)? else {
                        continue;
                    };
                    serde_json::from_slice(&bytes)
                        .map_err(|e| StorageError::corrupt(self, &m.name, e.to_string()))?
                }
            };
            out.push(record.clone());
            seen.insert(m.name, record);
        }
        *cache = seen;
        drop(cache);
        out.sort_by_key(|r| (r.epoch, r.attempt, log_rank(r.state).0));
        out.dedup();
        Ok(out)
    }

    // --- attempts ---

    /// Claims the namespace's next attempt number: one more than both `at_least_after`
    /// and every attempt claimed before (the older layout's counter included), by creating
    /// its claim, so two claimants never get the same number and attempts (and the
    /// generations and fencing tokens derived from them) grow across recoveries and
    /// restarts alike (design §3.3).
    ///
    /// # Errors
    /// Storage failures; no attempt may start then.
    pub fn next_attempt(&self, at_least_after: u32) -> Result<u32> {
        let listed = self
            .retry(|| self.store.list(names::ATTEMPTS))?
            .iter()
            .filter_map(|m| names::attempt_of_claim(&m.name))
            .max()
            .unwrap_or(0);
        let legacy = match self.store.get(names::LEGACY_ATTEMPT) {
            Ok(b) => String::from_utf8_lossy(&b)
                .trim()
                .parse::<u32>()
                .unwrap_or(0),
            Err(e) if e.is_not_found() => 0,
            Err(e) => return Err(e.into()),
        };
        let token = claim_token();
        let mut n = listed.max(legacy).max(at_least_after) + 1;
        loop {
            match self.create(&names::attempt_claim(n), token.as_bytes())? {
                c if c.holds(token.as_bytes()) => return Ok(n),
                _ => n += 1,
            }
        }
    }

    // --- whole namespace ---

    /// Deletes every object of the namespace (`--fresh`).
    ///
    /// # Errors
    /// Storage failures.
    pub fn delete_all(&self) -> Result<()> {
        self.referenced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        for m in self.retry(|| self.store.list(""))? {
            self.retry(|| self.store.delete(&m.name))?;
        }
        Ok(())
    }

    /// Keeps the latest `keep` durable epochs and what they reference; deletes the rest
    /// below the newest kept epoch ([`plan_retention`]). Returns the deleted epochs.
    ///
    /// # Errors
    /// Storage failures.
    pub fn retain(&self, keep: usize) -> Result<Vec<EpochId>> {
        self.resolve_unresolved();
        let durable = self.durable()?;
        let kept: Vec<u64> = durable
            .manifests
            .keys()
            .rev()
            .take(keep.max(1))
            .copied()
            .collect();
        let mut referenced = BTreeSet::new();
        {
            let mut cache = self.referenced.lock().unwrap_or_else(|p| p.into_inner());
            let names: BTreeSet<&String> = kept.iter().map(|e| &durable.manifests[e]).collect();
            cache.retain(|n, _| names.contains(n));
            for name in names {
                if !cache.contains_key(name) {
                    let m = self.read_manifest_object(name)?;
                    cache.insert(name.clone(), segment_dirs(&m));
                }
                referenced.extend(cache[name].iter().copied());
            }
        }
        let objects: Vec<String> = self
            .retry(|| self.store.list(""))?
            .into_iter()
            .map(|m| m.name)
            .collect();
        let plan = plan_retention(&RetentionInput {
            durable: &durable,
            keep,
            referenced: &referenced,
            unresolved: &self.unresolved_epochs(),
            objects: &objects,
        });
        for name in &plan.delete {
            self.retry(|| self.store.delete(name))?;
        }
        Ok(plan.deleted_epochs.into_iter().map(EpochId).collect())
    }
}

/// The identity of the cluster whose storage location is `root`: its `cluster.json`,
/// created with a new identity if `create` and it has none.
///
/// # Errors
/// Storage failures; no `cluster.json` (without `create`): not a cluster's storage.
pub fn cluster_identity(root: &Scoped, create: bool) -> Result<String> {
    #[derive(Serialize, Deserialize)]
    struct Identity {
        cluster: String,
    }
    let bytes = if create {
        let fresh = serde_json::to_vec(&Identity {
            cluster: format!("c-{}", claim_token().replace([' ', '#'], "-")),
        })
        .map_err(|e| StorageError::Corrupt {
            location: root.describe(),
            object: names::CLUSTER.into(),
            message: e.to_string(),
        })?;
        match root.put_if_absent(names::CLUSTER, &fresh)? {
            Created::Created => fresh,
            Created::Exists(b) => b,
        }
    } else {
        root.get(names::CLUSTER).map_err(|e| {
            if e.is_not_found() {
                StorageError::Store(StoreError::new(
                    root.describe(),
                    Some(names::CLUSTER),
                    ErrorKind::NotFound,
                    "is no cluster's storage: start the coordinator with this location first",
                ))
            } else {
                e.into()
            }
        })?
    };
    let id: Identity = serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt {
        location: root.describe(),
        object: names::CLUSTER.into(),
        message: e.to_string(),
    })?;
    Ok(id.cluster)
}

/// The names of the namespaces in a checkpoint root (the first component of every object
/// name in it), sorted.
///
/// # Errors
/// Storage failures.
pub fn list_namespaces(root: &Scoped) -> Result<Vec<String>> {
    let mut out: Vec<String> = root
        .list("")?
        .into_iter()
        .filter_map(|m| m.name.split_once('/').map(|(ns, _)| ns.to_owned()))
        .collect();
    out.dedup();
    Ok(out)
}

/// The epochs of the segment directories `m` references.
fn segment_dirs(m: &EpochManifest) -> BTreeSet<u64> {
    m.tasks
        .iter()
        .flat_map(|t| t.segments.iter().chain(&t.operator_state))
        .filter_map(|s| names::segment_dir_epoch(&s.file))
        .collect()
}

/// The order of an epoch's states in the log, and their names in log object names.
fn log_rank(state: EpochState) -> (u8, &'static str) {
    match state {
        EpochState::Created => (0, "created"),
        EpochState::Injecting => (1, "injecting"),
        EpochState::Snapshotting => (2, "snapshotting"),
        EpochState::Precommitted => (3, "precommitted"),
        EpochState::Durable => (4, "durable"),
        EpochState::Committed => (5, "committed"),
        EpochState::Aborted => (6, "aborted"),
    }
}

/// A token that tells this claimant's create apart from any other's.
fn claim_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "pid {} at {now} #{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// What retention decides from.
#[derive(Debug, Clone, Copy)]
pub struct RetentionInput<'a> {
    /// The durable epochs and their manifests.
    pub durable: &'a Durable,
    /// How many of the newest durable epochs to keep (at least 1).
    pub keep: usize,
    /// Segment directory epochs the kept manifests reference.
    pub referenced: &'a BTreeSet<u64>,
    /// Epochs whose record create has an unknown outcome.
    pub unresolved: &'a BTreeSet<u64>,
    /// Every object of the namespace.
    pub objects: &'a [String],
}

/// What retention deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    /// Objects to delete.
    pub delete: Vec<String>,
    /// Durable epochs no longer kept.
    pub deleted_epochs: Vec<u64>,
}

/// Retention as a pure decision (design §6). With `kept` the newest `keep` durable epochs,
/// `oldest` and `newest` the first and last of them, it deletes:
/// - durable epoch records and manifests (candidates and the older layout's) of epochs
///   before `oldest`; never an *aborted* record: it fences its epoch against an attempt
///   that may still run (a coordinator stopped for any time, then resumed), and without it
///   that attempt's publish would succeed (design §14.5);
/// - log records of epochs before `oldest` that are also more than
///   [`LOG_HISTORY_EPOCHS`] before the highest epoch logged (whose own records always
///   stay: recovery numbers new epochs past it);
/// - manifest candidates of epochs between `oldest` and `newest` that no kept record
///   points at (losers, aborted attempts);
/// - segment files of epoch directories before `newest` that are not kept and that no kept
///   manifest references (orphans of aborted epochs included);
/// - every attempt claim but the highest.
///
/// It never deletes anything of an unresolved epoch, nor of an epoch after `newest` (in
/// flight), nor the older layout's log and counter, nor `savepoint.json`.
pub fn plan_retention(input: &RetentionInput<'_>) -> RetentionPlan {
    let mut plan = RetentionPlan::default();
    let durable = &input.durable.manifests;
    let kept: BTreeSet<u64> = durable
        .keys()
        .rev()
        .take(input.keep.max(1))
        .copied()
        .collect();
    let (Some(&oldest), Some(&newest)) = (kept.first(), kept.last()) else {
        return plan;
    };
    let kept_manifests: BTreeSet<&str> = kept.iter().map(|e| durable[e].as_str()).collect();
    plan.deleted_epochs = durable.keys().filter(|e| **e < oldest).copied().collect();
    let max_logged = input
        .objects
        .iter()
        .filter_map(|n| names::epoch_of_log_record(n))
        .max();
    let max_attempt = input
        .objects
        .iter()
        .filter_map(|n| names::attempt_of_claim(n))
        .max();
    let safe = |e: u64| !input.unresolved.contains(&e);
    for name in input.objects {
        let delete = if let Some(e) = names::epoch_of_record(name) {
            e < oldest && safe(e) && !input.durable.aborted.contains(&e)
        } else if let Some((e, _)) = names::parse_manifest(name) {
            safe(e) && e < newest && !kept_manifests.contains(name.as_str())
        } else if let Some(e) = names::epoch_of_log_record(name) {
            e < oldest && max_logged.is_some_and(|m| e + LOG_HISTORY_EPOCHS <= m)
        } else if let Some(a) = names::attempt_of_claim(name) {
            Some(a) != max_attempt
        } else if let Some(e) = names::segment_dir_epoch(name) {
            e < newest && !kept.contains(&e) && !input.referenced.contains(&e) && safe(e)
        } else {
            false
        };
        if delete {
            plan.delete.push(name.clone());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keeps_the_log_history_and_the_newest_records() {
        let durable = Durable {
            manifests: (995..=1000u64)
                .map(|e| (e, names::manifest_candidate(e, 1)))
                .collect(),
            aborted: BTreeSet::new(),
        };
        let mut objects: Vec<String> = (1..=1000u64)
            .map(|e| names::log_record(e, 0, "created", 1))
            .collect();
        objects.push(names::log_record(1003, 0, "created", 2));
        objects.extend((1..=3).map(names::attempt_claim));
        let plan = plan_retention(&RetentionInput {
            durable: &durable,
            keep: 3,
            referenced: &BTreeSet::new(),
            unresolved: &BTreeSet::new(),
            objects: &objects,
        });
        let deleted_logs: Vec<u64> = plan
            .delete
            .iter()
            .filter_map(|n| names::epoch_of_log_record(n))
            .collect();
        assert_eq!(
            deleted_logs,
            (1..=1003 - LOG_HISTORY_EPOCHS).collect::<Vec<_>>()
        );
        let claims: Vec<u32> = plan
            .delete
            .iter()
            .filter_map(|n| names::attempt_of_claim(n))
            .collect();
        assert_eq!(claims, [1, 2], "every claim but the highest");
        assert_eq!(plan.deleted_epochs, [995, 996, 997]);
    }
}
