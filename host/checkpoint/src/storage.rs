//! Checkpoint storage (design §14): the SPI needs only
//! read-after-write and an atomic publish, so an object store or a database can back it;
//! [`LocalStorage`] keeps a namespace in one directory:
//!
//! ```text
//! <root>/manifests/<epoch, 20 digits>.json   published by temp file + fsync + rename + dir fsync
//! <root>/epochs.log                          JSON lines: CREATED / DURABLE / COMMITTED / ABORTED
//!                                            (compacted by retention past LOG_COMPACT_BYTES)
//! <root>/segments/<epoch>/...                segment files written before the manifest
//! ```

use crate::coordinator::EpochState;
use crate::manifest::EpochManifest;
use nop_stream_api::{AttemptId, EpochId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Storage failures.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file operation failed.
    #[error("checkpoint storage {path}: {message}")]
    Io {
        /// Path.
        path: PathBuf,
        /// OS message.
        message: String,
    },
    /// A manifest or segment failed its checksum or could not be decoded.
    #[error("checkpoint storage {path}: corrupt: {message}")]
    Corrupt {
        /// Path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Result alias.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// One line of the epoch log.
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

/// The checkpoint storage SPI.
pub trait CheckpointStorage: Send + Sync {
    /// Writes a segment file durably (relative path inside the namespace).
    ///
    /// # Errors
    /// I/O failure.
    fn write_segment(&self, rel: &str, bytes: &[u8]) -> Result<()>;

    /// Opens the segment file `rel` to be written in parts ([`SegmentWriter`]); it is
    /// durable and visible whole once [`SegmentWriter::finish`] returns, and absent if
    /// the writer is dropped unfinished. The default buffers the parts in memory and
    /// calls [`Self::write_segment`] at the finish; [`LocalStorage`] streams them to a
    /// temporary file, so a large snapshot need not fit in memory.
    ///
    /// # Errors
    /// I/O failure.
    fn segment_writer<'a>(&'a self, rel: &str) -> Result<Box<dyn SegmentWriter + 'a>> {
        Ok(Box::new(BufferedSegment {
            storage: self,
            rel: rel.to_owned(),
            bytes: Vec::new(),
        }))
    }

    /// Reads `len` bytes at `offset` of a segment file.
    ///
    /// # Errors
    /// I/O failure or a short file.
    fn read_range(&self, rel: &str, offset: u64, len: u64) -> Result<Vec<u8>>;

    /// Publishes a manifest atomically: it is either entirely visible or absent.
    ///
    /// # Errors
    /// I/O failure; the epoch is then not durable.
    fn publish_manifest(&self, manifest: &EpochManifest) -> Result<()>;

    /// Epochs with a published manifest, ascending.
    ///
    /// # Errors
    /// I/O failure.
    fn manifest_epochs(&self) -> Result<Vec<EpochId>>;

    /// Reads and verifies the manifest of `epoch`.
    ///
    /// # Errors
    /// I/O failure, or a checksum mismatch.
    fn read_manifest(&self, epoch: EpochId) -> Result<EpochManifest>;

    /// Appends a record to the epoch log durably.
    ///
    /// # Errors
    /// I/O failure.
    fn append_log(&self, record: &EpochLogRecord) -> Result<()>;

    /// Every epoch log record, in append order (a torn last line is ignored).
    ///
    /// # Errors
    /// I/O failure.
    fn read_log(&self) -> Result<Vec<EpochLogRecord>>;

    /// Keeps the latest `keep` durable epochs and whatever they reference; deletes older
    /// manifests and every segment directory no kept manifest references (orphans of
    /// aborted epochs included) below the newest kept epoch. Returns the deleted epochs.
    /// A local namespace also compacts its epoch log once it exceeds
    /// [`LOG_COMPACT_BYTES`], so an unbounded job's log stays bounded.
    ///
    /// # Errors
    /// I/O failure.
    fn retain(&self, keep: usize) -> Result<Vec<EpochId>>;

    /// Allocates the namespace's next attempt number durably: one more than both
    /// `at_least_after` and every attempt allocated before, so attempts (and the
    /// generations and fencing tokens derived from them) grow across in-process
    /// recoveries and process restarts alike, even when an attempt failed before creating
    /// any epoch (design §3.3).
    ///
    /// # Errors
    /// I/O failure; no attempt may start then.
    fn next_attempt(&self, at_least_after: u32) -> Result<u32>;

    /// The newest manifest, if any.
    ///
    /// # Errors
    /// As [`Self::read_manifest`].
    fn latest_manifest(&self) -> Result<Option<EpochManifest>> {
        match self.manifest_epochs()?.last() {
            Some(e) => self.read_manifest(*e).map(Some),
            None => Ok(None),
        }
    }
}

/// Size past which [`LocalStorage`]'s retention compacts `epochs.log` (64 KiB, about 300
/// epochs at ~200 bytes each): it keeps the records of the retained epochs and of later
/// ones, and the last records holding the highest epoch and the highest attempt (what
/// recovery takes from the log: the next epoch and attempt numbers, and whether the final
/// epoch was committed). Older records go; `nopstream checkpoints` then shows no state for
/// epochs whose manifests retention deleted anyway.
pub const LOG_COMPACT_BYTES: u64 = 64 << 10;

/// Local-file checkpoint storage for one namespace.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

/// A segment file being written in parts ([`CheckpointStorage::segment_writer`]).
pub trait SegmentWriter {
    /// Appends `bytes`.
    ///
    /// # Errors
    /// I/O failure.
    fn write(&mut self, bytes: &[u8]) -> Result<()>;

    /// Makes the file durable and visible under its name.
    ///
    /// # Errors
    /// I/O failure.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The default [`SegmentWriter`]: parts collected in memory, written at the finish.
struct BufferedSegment<'a, S: ?Sized> {
    storage: &'a S,
    rel: String,
    bytes: Vec<u8>,
}

impl<S: CheckpointStorage + ?Sized> SegmentWriter for BufferedSegment<'_, S> {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.storage.write_segment(&self.rel, &self.bytes)
    }
}

/// [`LocalStorage`]'s [`SegmentWriter`]: a buffered temporary file beside the target,
/// fsynced and renamed at the finish (as [`LocalStorage::write_segment`] does at once);
/// removed if dropped unfinished.
struct FileSegment {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl SegmentWriter for FileSegment {
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("open until finished");
        f.write_all(bytes).map_err(|e| io(&self.tmp, e))
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        let f = self.file.take().expect("open until finished");
        let f = f.into_inner().map_err(|e| io(&self.tmp, e.error()))?;
        f.sync_all().map_err(|e| io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| io(&self.path, e))?;
        fsync_dir(self.path.parent().unwrap_or(Path::new(".")))
    }
}

impl Drop for FileSegment {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> StorageError {
    StorageError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(dir, e))
}

impl LocalStorage {
    /// Storage rooted at `root` (created if missing).
    ///
    /// # Errors
    /// If the directories cannot be created.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        for d in [root.join("manifests"), root.join("segments")] {
            std::fs::create_dir_all(&d).map_err(|e| io(&d, e))?;
        }
        Ok(LocalStorage { root })
    }

    /// The namespace directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn manifest_path(&self, epoch: EpochId) -> PathBuf {
        self.root
            .join("manifests")
            .join(format!("{:020}.json", epoch.0))
    }

    fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
        fsync_dir(dir)
    }
}

impl CheckpointStorage for LocalStorage {
    fn next_attempt(&self, at_least_after: u32) -> Result<u32> {
        let path = self.root.join("attempt");
        let recorded = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        let next = recorded.max(at_least_after) + 1;
        Self::write_durably(&path, format!("{next}\n").as_bytes())?;
        Ok(next)
    }

    fn write_segment(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        Self::write_durably(&self.root.join(rel), bytes)
    }

    fn segment_writer<'a>(&'a self, rel: &str) -> Result<Box<dyn SegmentWriter + 'a>> {
        let path = self.root.join(rel);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let file = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        Ok(Box::new(FileSegment {
            path,
            tmp,
            file: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
        }))
    }

    fn read_range(&self, rel: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.root.join(rel);
        let mut f = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
        let size = f.metadata().map_err(|e| io(&path, e))?.len();
        let end = offset.saturating_add(len);
        let truncated = |size: u64| StorageError::Corrupt {
            path: path.clone(),
            message: format!(
                "segment truncated: the file has {size} bytes but the manifest needs bytes \
                 {offset}..{end}; it was cut short (a full disk, an interrupted copy) after \
                 the epoch was published"
            ),
        };
        if end > size {
            return Err(truncated(size));
        }
        f.seek(SeekFrom::Start(offset)).map_err(|e| io(&path, e))?;
        let mut buf = vec![0; len as usize];
        f.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                truncated(f.metadata().map_or(0, |m| m.len()))
            } else {
                io(&path, e)
            }
        })?;
        Ok(buf)
    }

    fn publish_manifest(&self, manifest: &EpochManifest) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| io(&self.root, e))?;
        Self::write_durably(&self.manifest_path(manifest.epoch), &bytes)
    }

    fn manifest_epochs(&self) -> Result<Vec<EpochId>> {
        let dir = self.root.join("manifests");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let e = e.map_err(|e| io(&dir, e))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name.strip_suffix(".json")
                && let Ok(epoch) = n.parse::<u64>()
            {
                out.push(EpochId(epoch));
            }
        }
        out.sort();
        Ok(out)
    }

    fn read_manifest(&self, epoch: EpochId) -> Result<EpochManifest> {
        let path = self.manifest_path(epoch);
        let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
        let m: EpochManifest =
            serde_json::from_slice(&bytes).map_err(|e| StorageError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
        if !m.verify() {
            return Err(StorageError::Corrupt {
                path,
                message: "manifest checksum mismatch".into(),
            });
        }
        Ok(m)
    }

    fn append_log(&self, record: &EpochLogRecord) -> Result<()> {
        let path = self.root.join("epochs.log");
        let mut line = serde_json::to_vec(record).map_err(|e| io(&path, e))?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(&line).map_err(|e| io(&path, e))?;
        f.sync_data().map_err(|e| io(&path, e))
    }

    fn read_log(&self) -> Result<Vec<EpochLogRecord>> {
        let path = self.root.join("epochs.log");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        // A crash can tear only the last line; skip lines that do not parse.
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }

    fn retain(&self, keep: usize) -> Result<Vec<EpochId>> {
        let epochs = self.manifest_epochs()?;
        if epochs.is_empty() {
            return Ok(Vec::new());
        }
        let kept: BTreeSet<EpochId> = epochs.iter().rev().take(keep.max(1)).copied().collect();
        let oldest_kept = *kept.iter().next().expect("keep >= 1");
        let mut deleted = Vec::new();
        for e in &epochs {
            if !kept.contains(e) {
                let p = self.manifest_path(*e);
                std::fs::remove_file(&p).map_err(|err| io(&p, err))?;
                deleted.push(*e);
            }
        }
        if std::fs::metadata(self.root.join("epochs.log"))
            .is_ok_and(|m| m.len() > LOG_COMPACT_BYTES)
        {
            self.compact_log(oldest_kept)?;
        }
        // Segment directories are named by epoch. A manifest references its own and, with
        // incremental snapshots, those of the full snapshot and deltas its chains build on:
        // a directory stays while a kept manifest references it.
        let mut referenced = BTreeSet::new();
        for e in &kept {
            for t in self.read_manifest(*e)?.tasks {
                for s in t.segments.iter().chain(&t.operator_state) {
                    if let Some(dir) = crate::names::segment_dir_epoch(&s.file) {
                        referenced.insert(EpochId(dir));
                    }
                }
            }
        }
        let newest_kept = *kept.iter().last().expect("non-empty");
        let seg_root = self.root.join("segments");
        for entry in std::fs::read_dir(&seg_root).map_err(|e| io(&seg_root, e))? {
            let entry = entry.map_err(|e| io(&seg_root, e))?;
            let Ok(epoch) = entry.file_name().to_string_lossy().parse::<u64>() else {
                continue;
            };
            let epoch = EpochId(epoch);
            if epoch < newest_kept && !kept.contains(&epoch) && !referenced.contains(&epoch) {
                std::fs::remove_dir_all(entry.path()).map_err(|e| io(&entry.path(), e))?;
            }
        }
        Ok(deleted)
    }
}

impl LocalStorage {
    /// Rewrites `epochs.log` without the records of epochs before `oldest_kept`, keeping
    /// the last with the highest epoch and the last with the highest attempt (see
    /// [`LOG_COMPACT_BYTES`]).
    /// Atomic: a temporary file, fsynced, renamed over the log, then the directory
    /// fsynced; a crash leaves the old log or the new one. Lines that do not parse (a torn
    /// last line) are dropped, as [`CheckpointStorage::read_log`] skips them anyway.
    fn compact_log(&self, oldest_kept: EpochId) -> Result<()> {
        let path = self.root.join("epochs.log");
        let records = self.read_log()?;
        // The last record holding the highest epoch, and the last holding the highest
        // attempt (one of each is all recovery needs of older records).
        let last_max = |key: fn(&EpochLogRecord) -> u64| {
            let max = records.iter().map(key).max();
            records.iter().rposition(|r| Some(key(r)) == max)
        };
        let keep = [
            last_max(|r| r.epoch.0),
            last_max(|r| u64::from(r.attempt.0)),
        ];
        let mut text = Vec::new();
        for (_, r) in records
            .iter()
            .enumerate()
            .filter(|(i, r)| r.epoch >= oldest_kept || keep.contains(&Some(*i)))
        {
            text.extend(serde_json::to_vec(r).map_err(|e| io(&path, e))?);
            text.push(b'\n');
        }
        let tmp = self.root.join("epochs.log.compact");
        {
            let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
            f.write_all(&text).map_err(|e| io(&tmp, e))?;
            f.sync_all().map_err(|e| io(&tmp, e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        fsync_dir(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::STATE_FORMAT_VERSION;
    use nop_stream_api::FencingToken;

    fn manifest(epoch: u64) -> EpochManifest {
        let mut m = EpochManifest {
            epoch: EpochId(epoch),
            job_id: "j".into(),
            pipeline_id: "main".into(),
            namespace: "j.main".into(),
            plan_fingerprint: "f".into(),
            state_shard_count: 8,
            attempt: AttemptId(1),
            fencing_token: FencingToken(1),
            final_epoch: false,
            tasks: Vec::new(),
            enumerators: Vec::new(),
            state_format_version: STATE_FORMAT_VERSION,
            created_ms: 1,
            durable_ms: 2,
            meta: None,
            checksum: String::new(),
        };
        m.seal();
        m
    }

    #[test]
    fn a_truncated_segment_says_it_is_truncated() {
        // Regression: this used to surface as "failed to fill whole buffer".
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        s.write_segment("segments/1/op/0.seg", &[7; 100]).unwrap();
        assert_eq!(
            s.read_range("segments/1/op/0.seg", 90, 10).unwrap(),
            [7; 10]
        );
        let path = dir.path().join("segments/1/op/0.seg");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(60)
            .unwrap();
        let err = s.read_range("segments/1/op/0.seg", 40, 50).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "checkpoint storage {}: corrupt: segment truncated: the file has 60 bytes but \
                 the manifest needs bytes 40..90; it was cut short (a full disk, an \
                 interrupted copy) after the epoch was published",
                path.display()
            )
        );
        assert_eq!(s.read_range("segments/1/op/0.seg", 0, 60).unwrap(), [7; 60]);
    }

    #[test]
    fn a_segment_written_in_parts_appears_whole_at_the_finish_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        let rel = "segments/3/op/0.a1.seg";
        let mut w = s.segment_writer(rel).unwrap();
        w.write(b"hello ").unwrap();
        w.write(b"world").unwrap();
        assert!(!dir.path().join(rel).exists());
        w.finish().unwrap();
        assert_eq!(s.read_range(rel, 6, 5).unwrap(), b"world");
        // Dropped unfinished: neither the file nor its temporary remains.
        let mut w = s.segment_writer("segments/4/op/0.a1.seg").unwrap();
        w.write(b"partial").unwrap();
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("segments/4/op"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn manifests_publish_atomically_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        assert!(s.latest_manifest().unwrap().is_none());
        s.publish_manifest(&manifest(3)).unwrap();
        s.publish_manifest(&manifest(7)).unwrap();
        assert_eq!(s.manifest_epochs().unwrap(), vec![EpochId(3), EpochId(7)]);
        assert_eq!(s.latest_manifest().unwrap().unwrap().epoch, EpochId(7));
        // No temp files are left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("manifests"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2);
        // Tampering is detected.
        let p = dir.path().join("manifests").join(format!("{:020}.json", 7));
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"plan_fingerprint\": \"f\"", "\"plan_fingerprint\": \"g\"");
        std::fs::write(&p, text).unwrap();
        assert!(matches!(
            s.read_manifest(EpochId(7)),
            Err(StorageError::Corrupt { .. })
        ));
    }

    #[test]
    fn retention_compacts_the_epoch_log_and_keeps_what_recovery_reads() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        let log = |epoch: u64, state: EpochState, attempt: u32| {
            s.append_log(&EpochLogRecord {
                epoch: EpochId(epoch),
                state,
                attempt: AttemptId(attempt),
                at_ms: 1,
                detail: None,
            })
            .unwrap();
        };
        // 2,000 epochs of an unbounded job, three retained at a time.
        for e in 1..=2000u64 {
            let attempt = if e > 1500 { 2 } else { 1 };
            log(e, EpochState::Created, attempt);
            log(e, EpochState::Durable, attempt);
            s.publish_manifest(&manifest(e)).unwrap();
            log(e, EpochState::Committed, attempt);
            s.retain(3).unwrap();
            let size = std::fs::metadata(dir.path().join("epochs.log"))
                .unwrap()
                .len();
            assert!(size <= LOG_COMPACT_BYTES + 1024, "epoch {e}: {size} bytes");
        }
        // An epoch created after the last retention (e.g. before a crash).
        log(2001, EpochState::Created, 3);
        let records = s.read_log().unwrap();
        assert!(records.len() < 2000, "{} records", records.len());
        assert_eq!(records.iter().map(|r| r.epoch.0).max(), Some(2001));
        assert_eq!(records.iter().map(|r| r.attempt.0).max(), Some(3));
        for e in 1998..=2000 {
            let states: Vec<_> = records
                .iter()
                .filter(|r| r.epoch.0 == e)
                .map(|r| r.state)
                .collect();
            assert_eq!(
                states,
                [
                    EpochState::Created,
                    EpochState::Durable,
                    EpochState::Committed
                ],
                "retained epoch {e} keeps its records in order"
            );
        }
        let mut epochs: Vec<u64> = records.iter().map(|r| r.epoch.0).collect();
        epochs.dedup();
        assert!(epochs.windows(2).all(|w| w[0] < w[1]), "append order kept");
    }

    /// The segment directories under `root`, sorted.
    fn segment_dirs(root: &Path) -> Vec<String> {
        let mut segs: Vec<String> = std::fs::read_dir(root.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        segs.sort();
        segs
    }

    #[test]
    fn retention_keeps_latest_n_and_their_segments_and_drops_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        for e in 1..=5u64 {
            s.write_segment(&format!("segments/{e}/op/0.seg"), b"x")
                .unwrap();
            if e != 4 {
                s.publish_manifest(&manifest(e)).unwrap(); // 4 was aborted: an orphan
            }
        }
        s.write_segment("segments/6/op/0.seg", b"in flight")
            .unwrap();
        let deleted = s.retain(2).unwrap();
        assert_eq!(deleted, vec![EpochId(1), EpochId(2)]);
        assert_eq!(s.manifest_epochs().unwrap(), vec![EpochId(3), EpochId(5)]);
        let segs = segment_dirs(dir.path());
        assert_eq!(
            segs,
            vec!["3", "5", "6"],
            "kept epochs and the in-flight one stay; orphan 4 goes"
        );
    }

    #[test]
    fn retention_keeps_the_segments_a_kept_chain_references() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        let descriptor = |epoch: u64| crate::SegmentDescriptor {
            state_path: format!("checkpoint/j.main/{epoch}/op/0/0/v"),
            operator_id: "op".into(),
            shard: 0,
            state: "v".into(),
            file: format!("segments/{epoch}/op/0.a1.seg"),
            offset: 0,
            len: 1,
            checksum: crate::payload_checksum(b"x"),
            codec: if epoch <= 2 {
                crate::payload::KV_CODEC
            } else {
                crate::payload::KV_DELTA_CODEC
            }
            .into(),
            schema_version: 1,
            entries: 1,
        };
        for e in 1..=6u64 {
            s.write_segment(&format!("segments/{e}/op/0.a1.seg"), b"x")
                .unwrap();
            let mut m = manifest(e);
            // Epoch 1 is a full snapshot, epoch 2 a new one (a compaction), 3..=6 deltas on
            // top of it. Epoch 4 was aborted, but the task went on and its delta stays in
            // the chain (a task never learns of an abort).
            let chain: Vec<_> = if e == 1 {
                vec![descriptor(1)]
            } else {
                (2..=e).map(descriptor).collect()
            };
            m.tasks.push(crate::TaskSnapshot {
                task: nop_stream_api::TaskId {
                    job: "j".into(),
                    pipeline: "main".into(),
                    vertex: "v".into(),
                    subtask: nop_stream_api::SubtaskIndex(0),
                },
                epoch: EpochId(e),
                end_of_data: false,
                segments: chain,
                operator_state: Vec::new(),
                splits: Vec::new(),
                watermarks: Vec::new(),
                ended_inputs: Vec::new(),
                pending_transactions: Vec::new(),
                sink_operator: None,
                snapshot_bytes: 1,
                alignment_ms: 0,
                duration_ms: 0,
                async_ms: 0,
                compacted_bytes: 0,
            });
            m.seal();
            if e != 4 {
                s.publish_manifest(&m).unwrap();
            }
        }
        assert_eq!(
            s.retain(1).unwrap(),
            vec![EpochId(1), EpochId(2), EpochId(3), EpochId(5)]
        );
        let segs = segment_dirs(dir.path());
        assert_eq!(
            segs,
            vec!["2", "3", "4", "5", "6"],
            "the chain of epoch 6 (full 2, deltas 3, 4, 5, 6) stays, the aborted 4 included; \
             epoch 1's full snapshot, which no kept chain uses, goes"
        );
    }

    #[test]
    fn epoch_log_survives_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStorage::open(dir.path()).unwrap();
        let rec = EpochLogRecord {
            epoch: EpochId(1),
            state: EpochState::Durable,
            attempt: AttemptId(1),
            at_ms: 5,
            detail: None,
        };
        s.append_log(&rec).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("epochs.log"))
            .unwrap();
        f.write_all(b"{\"epoch\":2,\"sta").unwrap();
        assert_eq!(s.read_log().unwrap(), vec![rec]);
    }
}
