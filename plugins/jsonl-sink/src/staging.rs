//! The file lifecycle of one sink subtask: staged files, atomic publish (design §7.3, §7.5).
//!
//! # Files
//!
//! For a transaction id `txn` (`{jobId}:{pipelineId}:{operatorId}:{subtask}:{epoch}`,
//! design §7.2) in the output directory `dir`:
//!
//! | file | meaning |
//! |---|---|
//! | `{dir}/.staging/{prefix}-{subtask:02}/{enc(txn)}.jsonl.tmp` | begun, being written |
//! | `{dir}/.staging/{prefix}-{subtask:02}/{enc(txn)}.jsonl` | pre-committed: flushed, fsynced, sealed |
//! | `{dir}/{prefix}-{subtask:02}-{epoch:06}.jsonl` | committed, visible |
//!
//! `enc` percent-encodes every byte outside `[A-Za-z0-9._-]` as `%XX` (so `:` → `%3A`,
//! `/` → `%2F`); it is reversible, which lets [`Staging::pending`] report the original ids.
//! Subtask and epoch of the final name are the txn id's last two `:` fields.
//!
//! Each subtask stages in a directory of its own, so no subtask ever lists a directory a
//! sibling writes to or removes from: under WASI a listed entry that vanishes before the
//! host reads its type fails the whole listing, and a sibling aborting its transactions
//! during a recovery did exactly that. Files staged directly in `{dir}/.staging/` (the
//! layout before per-subtask directories) are still listed, aborted and committed; a
//! listing of that shared directory that meets a vanished entry starts over.
//! A staging directory that does not exist holds nothing pending.
//!
//! # Lifecycle
//!
//! - `begin` creates (truncates) the `.tmp` file; it refuses a txn that is already sealed
//!   or whose final file exists.
//! - `write` appends each record and a `\n`; a record containing `\n` is invalid (it would
//!   split into two lines). The whole batch is checked before anything is written.
//! - `pre_commit` flushes, `fsync`s and renames `.tmp` → sealed, then fsyncs the staging
//!   directory. A txn without records leaves no file at all (its `.tmp` is removed): empty
//!   final files are never created. Repeating `pre_commit` on a sealed txn returns the same
//!   committable.
//! - `commit` renames sealed → final (one atomic rename, then a directory fsync). It is
//!   idempotent: final present and sealed absent means already committed. A committable
//!   with no bytes commits trivially.
//! - `abort` removes `.tmp` and sealed files of the txn; absent files are fine. It never
//!   touches a final file.
//! - `recover` answers "is it committed?": no bytes or final present → committed; only the
//!   sealed file present → aborted, meaning *not committed yet but still committable*
//!   (the host commits it, since its epoch is durable); neither → unknown (the staged data
//!   is gone; the host fails the job loudly).
//!
//! Directory fsyncs are best effort: a platform that cannot open a directory as a file
//! (some WASI hosts) skips them.
//!
//! The open writer of a txn is cached in the instance; a dropped instance loses nothing
//! that was acknowledged, because `write` of an uncached txn reopens its `.tmp` for
//! appending. Two sinks sharing a `dir` need distinct prefixes.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

use nop_stream_sdk::{CommitOutcome, PluginError, Result};
use serde::{Deserialize, Serialize};

/// Name of the staging directory inside `dir`.
pub const STAGING_DIR: &str = ".staging";
/// Suffix of a sealed staged file.
pub const SEALED_SUFFIX: &str = ".jsonl";
/// Suffix of a file still being written.
pub const TMP_SUFFIX: &str = ".jsonl.tmp";
/// Write buffer per open transaction: 64 KiB.
pub const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// What `pre_commit` returns and `commit` / `recover` get back (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committable {
    /// Transaction id.
    pub txn: String,
    /// Sealed staged file.
    pub staged: String,
    /// File the commit publishes.
    #[serde(rename = "final")]
    pub final_path: String,
    /// Bytes in the staged file; 0 means the transaction wrote nothing and commits
    /// without creating a file.
    pub bytes: u64,
}

impl Committable {
    /// Encodes as JSON.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes what [`Committable::encode`] produced.
    ///
    /// # Errors
    /// [`nop_stream_sdk::ErrorCode::Transaction`] for bytes that are not a committable.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| PluginError::transaction(format!("malformed committable: {e}")))
    }
}

/// Percent-encodes a transaction id into a file name (see the module docs).
#[must_use]
pub fn encode_txn(txn: &str) -> String {
    let mut s = String::with_capacity(txn.len());
    for b in txn.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            s.push(char::from(b));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// Reverses [`encode_txn`]; `None` for a name it cannot have produced.
#[must_use]
pub fn decode_txn(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Subtask index and epoch of a txn id: its last two `:`-separated fields.
///
/// # Errors
/// [`nop_stream_sdk::ErrorCode::Transaction`] if the id does not have that shape.
pub fn parse_txn(txn: &str) -> Result<(u32, u64)> {
    let bad = || {
        PluginError::transaction(format!(
            "transaction id {txn:?} is not {{jobId}}:{{pipelineId}}:{{operatorId}}:{{subtask}}:{{epoch}}"
        ))
    };
    let mut parts = txn.rsplitn(3, ':');
    let epoch = parts.next().and_then(|e| e.parse().ok()).ok_or_else(bad)?;
    let subtask = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    parts
        .next()
        .filter(|rest| !rest.is_empty())
        .ok_or_else(bad)?;
    Ok((subtask, epoch))
}

fn remove_if_present(p: &Path) -> io::Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

fn io_err(what: &str, p: &Path, e: &io::Error) -> PluginError {
    PluginError::io(format!("{what} {}: {e}", p.display()))
}

/// How often a listing that meets a vanished entry starts over before it fails.
const LIST_ATTEMPTS: usize = 16;

/// The transaction ids of the `.tmp` and sealed files directly in `dir`; a missing `dir`
/// holds none. An entry that vanishes while the directory is listed (another writer's
/// abort or commit) starts the listing over, up to [`LIST_ATTEMPTS`] times.
fn list_txns(dir: &Path) -> Result<Vec<String>> {
    let mut last = None;
    for _ in 0..LIST_ATTEMPTS {
        match try_list_txns(dir) {
            Ok(txns) => return Ok(txns),
            Err(e) if e.kind() == ErrorKind::NotFound => last = Some(e),
            Err(e) => return Err(io_err("cannot list", dir, &e)),
        }
    }
    Err(io_err(
        "cannot list",
        dir,
        &last.unwrap_or_else(|| io::Error::from(ErrorKind::NotFound)),
    ))
}

fn try_list_txns(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound && !dir.exists() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut txns = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = name
            .strip_suffix(TMP_SUFFIX)
            .or_else(|| name.strip_suffix(SEALED_SUFFIX));
        if let Some(txn) = stem.and_then(decode_txn) {
            txns.push(txn);
        }
    }
    Ok(txns)
}

/// The staging area and published files of one sink subtask.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    prefix: String,
    subtask: u32,
    /// `{jobId}:{pipelineId}:{operatorId}:`: transactions of other sinks sharing the
    /// directory are never listed as this subtask's.
    owner: Option<String>,
    open: HashMap<String, BufWriter<File>>,
}

impl Staging {
    /// The files of subtask `subtask` under `dir`, published as `{prefix}-…`.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>, prefix: impl Into<String>, subtask: u32) -> Self {
        Self {
            dir: dir.into(),
            prefix: prefix.into(),
            subtask,
            owner: None,
            open: HashMap::new(),
        }
    }

    /// Restricts [`Staging::pending`] to transactions whose id starts with `owner`
    /// (`{jobId}:{pipelineId}:{operatorId}:`), so several sinks can share a directory
    /// without aborting each other's transactions.
    #[must_use]
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The staging directory of subtask `subtask`: `{dir}/.staging/{prefix}-{subtask:02}`.
    fn staging_dir_of(&self, subtask: u32) -> PathBuf {
        self.dir
            .join(STAGING_DIR)
            .join(format!("{}-{subtask:02}", self.prefix))
    }

    /// The staging directory of `txn`'s subtask (this instance's when the id has none).
    fn staging_dir(&self, txn: &str) -> PathBuf {
        self.staging_dir_of(parse_txn(txn).map_or(self.subtask, |(subtask, _)| subtask))
    }

    /// The directory every subtask staged in before per-subtask directories.
    fn shared_dir(&self) -> PathBuf {
        self.dir.join(STAGING_DIR)
    }

    /// Path of the `.tmp` file of `txn`.
    #[must_use]
    pub fn tmp_path(&self, txn: &str) -> PathBuf {
        self.staging_dir(txn)
            .join(format!("{}{TMP_SUFFIX}", encode_txn(txn)))
    }

    /// Path of the sealed file of `txn`.
    #[must_use]
    pub fn sealed_path(&self, txn: &str) -> PathBuf {
        self.staging_dir(txn)
            .join(format!("{}{SEALED_SUFFIX}", encode_txn(txn)))
    }

    /// Where `txn`'s `.tmp` and sealed files were staged before per-subtask directories.
    fn shared_paths(&self, txn: &str) -> [PathBuf; 2] {
        let name = encode_txn(txn);
        [
            self.shared_dir().join(format!("{name}{TMP_SUFFIX}")),
            self.shared_dir().join(format!("{name}{SEALED_SUFFIX}")),
        ]
    }

    /// Path `txn` is published at.
    ///
    /// # Errors
    /// The txn id lacks numeric subtask and epoch fields.
    pub fn final_path(&self, txn: &str) -> Result<PathBuf> {
        let (subtask, epoch) = parse_txn(txn)?;
        Ok(self
            .dir
            .join(format!("{}-{subtask:02}-{epoch:06}.jsonl", self.prefix)))
    }

    /// Starts `txn`: creates (truncates) its `.tmp` file.
    ///
    /// # Errors
    /// A malformed txn id; a txn already sealed or published; I/O failures.
    pub fn begin(&mut self, txn: &str) -> Result<()> {
        let final_path = self.final_path(txn)?;
        if final_path.exists() {
            return Err(PluginError::transaction(format!(
                "transaction {txn}: {} already exists (committed before?)",
                final_path.display()
            )));
        }
        let [_, shared_sealed] = self.shared_paths(txn);
        for sealed in [self.sealed_path(txn), shared_sealed] {
            if sealed.exists() {
                return Err(PluginError::transaction(format!(
                    "transaction {txn} is already pre-committed ({})",
                    sealed.display()
                )));
            }
        }
        let staging = self.staging_dir(txn);
        fs::create_dir_all(&staging).map_err(|e| io_err("cannot create", &staging, &e))?;
        let tmp = self.tmp_path(txn);
        let f = File::create(&tmp).map_err(|e| io_err("cannot create", &tmp, &e))?;
        self.open.insert(
            txn.to_owned(),
            BufWriter::with_capacity(WRITE_BUFFER_BYTES, f),
        );
        Ok(())
    }

    fn writer(&mut self, txn: &str) -> Result<&mut BufWriter<File>> {
        if !self.open.contains_key(txn) {
            // The instance was re-created since `begin`: append to the begun file.
            let tmp = self.tmp_path(txn);
            let f = OpenOptions::new()
                .append(true)
                .open(&tmp)
                .map_err(|e| match e.kind() {
                    ErrorKind::NotFound => PluginError::transaction(format!(
                        "transaction {txn} was not begun (no {})",
                        tmp.display()
                    )),
                    _ => io_err("cannot open", &tmp, &e),
                })?;
            self.open.insert(
                txn.to_owned(),
                BufWriter::with_capacity(WRITE_BUFFER_BYTES, f),
            );
        }
        self.open
            .get_mut(txn)
            .ok_or_else(|| PluginError::internal("writer vanished"))
    }

    /// Appends `records` to `txn`, one line each.
    ///
    /// # Errors
    /// A record containing `\n` (nothing of the batch is written then); a txn not begun;
    /// I/O failures.
    pub fn write<'a>(
        &mut self,
        txn: &str,
        records: impl Iterator<Item = &'a [u8]> + Clone,
    ) -> Result<()> {
        if let Some((i, _)) = records
            .clone()
            .enumerate()
            .find(|(_, r)| r.contains(&b'\n'))
        {
            return Err(PluginError::invalid_record(format!(
                "record {i} contains a newline; a JSON-lines record must be one line"
            )));
        }
        let tmp = self.tmp_path(txn);
        let w = self.writer(txn)?;
        for r in records {
            w.write_all(r)
                .and_then(|()| w.write_all(b"\n"))
                .map_err(|e| io_err("cannot write", &tmp, &e))?;
        }
        Ok(())
    }

    /// Seals `txn` and returns its committable.
    ///
    /// # Errors
    /// A txn neither begun nor sealed; I/O failures.
    pub fn pre_commit(&mut self, txn: &str) -> Result<Committable> {
        let tmp = self.tmp_path(txn);
        let sealed = self.sealed_path(txn);
        let final_path = self.final_path(txn)?;
        let committable = |bytes| -> Result<Committable> {
            Ok(Committable {
                txn: txn.to_owned(),
                staged: sealed.display().to_string(),
                final_path: final_path.display().to_string(),
                bytes,
            })
        };
        let file = match self.open.remove(txn) {
            Some(w) => w
                .into_inner()
                .map_err(|e| io_err("cannot flush", &tmp, e.error()))?,
            None => match File::open(&tmp) {
                Ok(f) => f,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    // Sealed by an earlier attempt of this call.
                    let len = fs::metadata(&sealed).map(|m| m.len()).map_err(|_| {
                        PluginError::transaction(format!("transaction {txn} was not begun"))
                    })?;
                    return committable(len);
                }
                Err(e) => return Err(io_err("cannot open", &tmp, &e)),
            },
        };
        file.sync_all()
            .map_err(|e| io_err("cannot fsync", &tmp, &e))?;
        let bytes = file
            .metadata()
            .map_err(|e| io_err("cannot stat", &tmp, &e))?
            .len();
        drop(file);
        if bytes == 0 {
            remove_if_present(&tmp).map_err(|e| io_err("cannot remove", &tmp, &e))?;
        } else {
            fs::rename(&tmp, &sealed).map_err(|e| io_err("cannot seal", &tmp, &e))?;
        }
        sync_dir(&self.staging_dir(txn));
        committable(bytes)
    }

    /// Publishes a pre-committed transaction; idempotent.
    ///
    /// # Errors
    /// Neither the sealed nor the final file exists (the staged data is lost); I/O failures.
    pub fn commit(&mut self, c: &Committable) -> Result<()> {
        let staged = Path::new(&c.staged);
        let final_path = Path::new(&c.final_path);
        if c.bytes == 0 {
            return Ok(());
        }
        match fs::rename(staged, final_path) {
            Ok(()) => {
                if let Some(parent) = final_path.parent() {
                    sync_dir(parent);
                }
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if final_path.exists() {
                    Ok(())
                } else {
                    Err(PluginError::transaction(format!(
                        "transaction {}: neither {} nor {} exists; the staged data is lost",
                        c.txn, c.staged, c.final_path
                    )))
                }
            }
            Err(e) => Err(io_err("cannot publish", staged, &e)),
        }
    }

    /// Discards `txn` (begun or sealed); idempotent.
    ///
    /// # Errors
    /// I/O failures other than absent files.
    pub fn abort(&mut self, txn: &str) -> Result<()> {
        self.open.remove(txn);
        let [shared_tmp, shared_sealed] = self.shared_paths(txn);
        for p in [
            self.tmp_path(txn),
            self.sealed_path(txn),
            shared_tmp,
            shared_sealed,
        ] {
            remove_if_present(&p).map_err(|e| io_err("cannot remove", &p, &e))?;
        }
        Ok(())
    }

    /// Whether a committable's transaction is committed (see the module docs).
    #[must_use]
    pub fn recover(&self, c: &Committable) -> CommitOutcome {
        if c.bytes == 0 || Path::new(&c.final_path).exists() {
            CommitOutcome::Committed
        } else if Path::new(&c.staged).exists() {
            CommitOutcome::Aborted
        } else {
            CommitOutcome::Unknown
        }
    }

    /// Ids of this subtask's begun or sealed transactions, sorted: those in its own
    /// staging directory and, of the files staged before per-subtask directories, those
    /// of its subtask (and owner).
    ///
    /// # Errors
    /// A staging directory that exists but cannot be listed (a missing one holds nothing).
    pub fn pending(&self) -> Result<Vec<String>> {
        let mut txns = list_txns(&self.staging_dir_of(self.subtask))?;
        txns.extend(list_txns(&self.shared_dir())?);
        txns.retain(|txn| {
            let mine = self.owner.as_deref().is_none_or(|o| txn.starts_with(o));
            mine && parse_txn(txn).is_ok_and(|(subtask, _)| subtask == self.subtask)
        });
        txns.sort();
        txns.dedup();
        Ok(txns)
    }

    /// Drops the cached writers (unflushed data of open transactions is flushed, not
    /// sealed).
    pub fn close(&mut self) {
        for (_, mut w) in self.open.drain() {
            let _ = w.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T3: &str = "job:main:sinks/out:0:3";
    const T4: &str = "job:main:sinks/out:0:4";

    fn recs<'a>(v: &'a [&'static str]) -> impl Iterator<Item = &'static [u8]> + Clone + 'a {
        v.iter().copied().map(str::as_bytes)
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = walk(dir)
            .into_iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect();
        v.sort();
        v
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    #[test]
    fn txn_ids_encode_reversibly_and_parse() {
        assert_eq!(encode_txn(T3), "job%3Amain%3Asinks%2Fout%3A0%3A3");
        for t in [T3, "a%b:c d:é:1:2", ""] {
            assert_eq!(decode_txn(&encode_txn(t)).as_deref(), Some(t));
        }
        assert_eq!(decode_txn("bad%zz"), None);
        assert_eq!(parse_txn(T3).unwrap(), (0, 3));
        assert_eq!(parse_txn("j:p:o:12:345").unwrap(), (12, 345));
        for bad in ["0:3", "j:p:o:x:3", "j:p:o:1:", "j:p:o:1:-3"] {
            assert!(parse_txn(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn full_lifecycle_publishes_one_file_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::new(dir.path(), "part", 0);
        s.begin(T3).unwrap();
        s.write(T3, recs(&[r#"{"a":1}"#, r#"{"a":2}"#])).unwrap();
        assert_eq!(s.pending().unwrap(), vec![T3]);
        let c = s.pre_commit(T3).unwrap();
        // The host begins N+1 right after pre-committing N.
        s.begin(T4).unwrap();
        s.write(T4, recs(&[r#"{"a":3}"#])).unwrap();
        assert_eq!(s.pending().unwrap(), vec![T3, T4]);
        assert_eq!(
            listing(dir.path()),
            vec![
                ".staging/part-00/job%3Amain%3Asinks%2Fout%3A0%3A3.jsonl",
                ".staging/part-00/job%3Amain%3Asinks%2Fout%3A0%3A4.jsonl.tmp"
            ]
        );
        let c = Committable::decode(&c.encode()).unwrap();
        assert_eq!(c.bytes, 16);
        assert_eq!(s.recover(&c), CommitOutcome::Aborted);
        s.commit(&c).unwrap();
        assert_eq!(s.recover(&c), CommitOutcome::Committed);
        let published = dir.path().join("part-00-000003.jsonl");
        assert_eq!(c.final_path, published.display().to_string());
        assert_eq!(
            fs::read_to_string(&published).unwrap(),
            "{\"a\":1}\n{\"a\":2}\n"
        );
        assert_eq!(s.pending().unwrap(), vec![T4]);
        // Committing again changes nothing.
        s.commit(&c).unwrap();
        assert_eq!(
            fs::read_to_string(&published).unwrap(),
            "{\"a\":1}\n{\"a\":2}\n"
        );
        // A committed epoch cannot be begun again.
        assert!(s.begin(T3).is_err());
    }

    #[test]
    fn instance_drop_between_calls_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::new(dir.path(), "out", 1);
        let t = "j:p:o:1:7";
        s.begin(t).unwrap();
        s.write(t, recs(&["a"])).unwrap();
        s.close();
        let mut s = Staging::new(dir.path(), "out", 1);
        s.write(t, recs(&["b"])).unwrap();
        drop(s);
        let mut s = Staging::new(dir.path(), "out", 1);
        let c = s.pre_commit(t).unwrap();
        // pre_commit repeated after the rename returns the same committable.
        let mut s = Staging::new(dir.path(), "out", 1);
        assert_eq!(s.pre_commit(t).unwrap(), c);
        let mut s = Staging::new(dir.path(), "out", 1);
        s.commit(&c).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("out-01-000007.jsonl")).unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn commit_after_a_crash_between_publish_and_acknowledgement() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::new(dir.path(), "part", 0);
        s.begin(T3).unwrap();
        s.write(T3, recs(&["x"])).unwrap();
        let c = s.pre_commit(T3).unwrap();
        // Crash right after the rename, before the host learned the commit succeeded:
        // a fresh instance retries.
        fs::rename(&c.staged, &c.final_path).unwrap();
        let mut fresh = Staging::new(dir.path(), "part", 0);
        assert_eq!(fresh.recover(&c), CommitOutcome::Committed);
        fresh.commit(&c).unwrap();
        assert_eq!(fs::read_to_string(&c.final_path).unwrap(), "x\n");
        assert!(fresh.pending().unwrap().is_empty());
        // Data lost: neither file → commit fails loudly, recover says unknown.
        fs::remove_file(&c.final_path).unwrap();
        assert_eq!(fresh.recover(&c), CommitOutcome::Unknown);
        assert!(fresh.commit(&c).is_err());
    }

    #[test]
    fn sinks_sharing_a_directory_list_only_their_own_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let mut hours = Staging::new(dir.path(), "hours", 0).with_owner("j:main:sinks/hours:");
        let mut late = Staging::new(dir.path(), "late", 0).with_owner("j:main:sinks/late:");
        hours.begin("j:main:sinks/hours:0:1").unwrap();
        late.begin("j:main:sinks/late:0:1").unwrap();
        assert_eq!(hours.pending().unwrap(), vec!["j:main:sinks/hours:0:1"]);
        assert_eq!(late.pending().unwrap(), vec!["j:main:sinks/late:0:1"]);
    }

    #[test]
    fn abort_is_idempotent_and_recovery_lists_only_this_subtask() {
        let dir = tempfile::tempdir().unwrap();
        let mut s0 = Staging::new(dir.path(), "part", 0);
        let mut s1 = Staging::new(dir.path(), "part", 1);
        let other = "job:main:sinks/out:1:3";
        s0.begin(T3).unwrap();
        s0.write(T3, recs(&["x"])).unwrap();
        s0.pre_commit(T3).unwrap();
        s0.begin(T4).unwrap();
        s1.begin(other).unwrap();
        // A restarted subtask 0 sees its own txns only, and aborts them.
        let mut s0 = Staging::new(dir.path(), "part", 0);
        let pending = s0.pending().unwrap();
        assert_eq!(pending, vec![T3, T4]);
        for t in &pending {
            s0.abort(t).unwrap();
            s0.abort(t).unwrap();
        }
        assert!(s0.pending().unwrap().is_empty());
        assert_eq!(s1.pending().unwrap(), vec![other]);
        s0.abort("never:begun:op:0:9").unwrap();
        // After an abort the epoch can be begun again (replay after recovery).
        s0.begin(T3).unwrap();
        s0.write(T3, recs(&["y"])).unwrap();
        let c = s0.pre_commit(T3).unwrap();
        s0.commit(&c).unwrap();
        assert_eq!(fs::read_to_string(&c.final_path).unwrap(), "y\n");
        // Writing to an unknown txn is a transaction error.
        let err = s0.write("j:p:o:0:99", recs(&["z"])).unwrap_err();
        assert_eq!(err.code, nop_stream_sdk::ErrorCode::Transaction);
    }

    #[test]
    fn each_subtask_stages_in_its_own_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut s0 = Staging::new(dir.path(), "part", 0);
        let mut s1 = Staging::new(dir.path(), "part", 1);
        s0.begin(T3).unwrap();
        s1.begin("job:main:sinks/out:1:3").unwrap();
        assert_eq!(
            listing(dir.path()),
            vec![
                ".staging/part-00/job%3Amain%3Asinks%2Fout%3A0%3A3.jsonl.tmp",
                ".staging/part-01/job%3Amain%3Asinks%2Fout%3A1%3A3.jsonl.tmp"
            ]
        );
        // A sibling's whole staging directory may go: this subtask's listing is unmoved,
        // and a subtask whose directory is missing has nothing pending.
        fs::remove_dir_all(dir.path().join(".staging/part-01")).unwrap();
        assert_eq!(s0.pending().unwrap(), vec![T3]);
        assert!(s1.pending().unwrap().is_empty());
    }

    #[test]
    fn files_staged_in_the_shared_directory_are_still_listed_aborted_and_committed() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join(STAGING_DIR);
        fs::create_dir_all(&shared).unwrap();
        // As an instance staging in `.staging/` itself left them: a sealed T3 and an open
        // T4 of subtask 0, and a transaction of subtask 1.
        let sealed = shared.join(format!("{}{SEALED_SUFFIX}", encode_txn(T3)));
        fs::write(&sealed, "x\n").unwrap();
        fs::write(
            shared.join(format!("{}{TMP_SUFFIX}", encode_txn(T4))),
            "y\n",
        )
        .unwrap();
        let other = "job:main:sinks/out:1:4";
        fs::write(
            shared.join(format!("{}{TMP_SUFFIX}", encode_txn(other))),
            "",
        )
        .unwrap();
        let mut s = Staging::new(dir.path(), "part", 0);
        assert_eq!(s.pending().unwrap(), vec![T3, T4]);
        assert!(
            s.begin(T3).is_err(),
            "a sealed transaction is not begun again"
        );
        s.abort(T4).unwrap();
        assert_eq!(s.pending().unwrap(), vec![T3]);
        // A committable of the old layout names its staged file and commits from there.
        let c = Committable {
            txn: T3.into(),
            staged: sealed.display().to_string(),
            final_path: s.final_path(T3).unwrap().display().to_string(),
            bytes: 2,
        };
        s.commit(&c).unwrap();
        assert_eq!(fs::read_to_string(&c.final_path).unwrap(), "x\n");
        assert!(s.pending().unwrap().is_empty());
        assert_eq!(
            Staging::new(dir.path(), "part", 1).pending().unwrap(),
            vec![other]
        );
    }

    #[test]
    fn empty_transactions_publish_nothing_and_count_as_committed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::new(dir.path(), "part", 0);
        s.begin(T3).unwrap();
        let c = s.pre_commit(T3).unwrap();
        assert_eq!(c.bytes, 0);
        assert!(s.pending().unwrap().is_empty());
        s.commit(&c).unwrap();
        s.commit(&c).unwrap();
        assert_eq!(s.recover(&c), CommitOutcome::Committed);
        assert_eq!(listing(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn records_with_newlines_are_rejected_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::new(dir.path(), "part", 0);
        s.begin(T3).unwrap();
        let err = s.write(T3, recs(&["ok", "bad\nline"])).unwrap_err();
        assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidRecord);
        assert!(err.message.contains("record 1"));
        let c = s.pre_commit(T3).unwrap();
        assert_eq!(c.bytes, 0);
    }
}
