//! The coordinator's durable stores (design §2.5, "Plugins"; issue: jobs, the plugin registry
//! and epoch logs survive a coordinator restart):
//!
//! - [`PluginStore`]: components content-addressed by sha256 under `<data>/plugins/blobs/`,
//!   with an index of `name@version → sha256` and what `describe()` said. A name@version
//!   is immutable: a second upload with other bytes is refused.
//! - [`JobStore`]: one record per job under `<data>/jobs/<job>/record.json`.
//!
//! Every write is a temporary file, fsync, rename: a crash leaves the old or the new
//! version, never a torn one.

use nop_stream_api::{PluginInfo, PluginKind};
use nop_stream_proto::cli::{JobState, JobSubmission, PluginEntry, RefusedCounts};
use nop_stream_runtime::{PluginHost, RuntimeError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Why a store operation failed. Messages name the plugin or job and the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The upload was damaged on the way: its bytes do not hash to what the client sent.
    #[error(
        "upload damaged: {size} bytes received hash to sha256 {got}, the client sent {claimed}; upload again"
    )]
    Damaged {
        /// Bytes received.
        size: usize,
        /// sha256 of what arrived.
        got: String,
        /// sha256 the client computed.
        claimed: String,
    },
    /// Over the size cap.
    #[error("component of {size} bytes exceeds the registry's cap of {cap} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The cap.
        cap: usize,
    },
    /// Not a loadable nop:stream component.
    #[error("{0}")]
    Invalid(String),
    /// A name@version already registered with other bytes.
    #[error(
        "{reference} is already registered with sha256 {existing}; this upload has sha256 \
         {new}. Plugin versions are immutable: bump the version in describe() and upload again"
    )]
    VersionTaken {
        /// `name@version`.
        reference: String,
        /// sha256 registered.
        existing: String,
        /// sha256 of the refused upload.
        new: String,
    },
    /// No such plugin.
    #[error("{0}")]
    NotFound(String),
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the
/// directory).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
    f.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
    f.sync_all().map_err(|e| io_err(&tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// sha256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// One registered plugin: what the CLI shows, and the full `describe()` for planning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredPlugin {
    /// What `nopstream plugin list` shows.
    pub entry: PluginEntry,
    /// What `describe()` returned at upload.
    pub info: PluginInfo,
}

/// The plugin registry: content-addressed components and an index by name@version.
#[derive(Debug)]
pub struct PluginStore {
    dir: PathBuf,
    max_bytes: usize,
    index: Mutex<BTreeMap<String, StoredPlugin>>,
}

impl PluginStore {
    /// Default cap on a component's size: 64 MiB (the CLI protocol's upload frame cap).
    pub const DEFAULT_MAX_BYTES: usize = nop_stream_proto::cli::MAX_UPLOAD_FRAME - 1024;

    /// Opens (creating) the registry in `dir` and reads its index.
    ///
    /// # Errors
    /// The directory or the index cannot be read.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(dir.join("blobs")).map_err(|e| io_err(&dir, e))?;
        let index_path = dir.join("index.json");
        let index = match std::fs::read(&index_path) {
            Ok(b) => serde_json::from_slice::<Vec<StoredPlugin>>(&b)
                .map_err(|e| io_err(&index_path, e))?
                .into_iter()
                .map(|p| (p.entry.reference(), p))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io_err(&index_path, e)),
        };
        Ok(PluginStore {
            dir,
            max_bytes: Self::DEFAULT_MAX_BYTES,
            index: Mutex::new(index),
        })
    }

    /// Sets the size cap, bytes.
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, StoredPlugin>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the component with this sha256 is stored (it may not exist).
    pub fn blob_file(&self, sha256: &str) -> PathBuf {
        self.blob_path(sha256)
    }

    fn blob_path(&self, sha256: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{sha256}.wasm"))
    }

    /// Validates and stores an uploaded component (design §2.5, "Plugins"): the bytes must
    /// hash to `claimed_sha256` (else the upload was damaged, e.g. truncated), fit the cap,
    /// be a component exporting one of the `nop:stream` worlds this host serves, and
    /// `describe()` itself; name@version must be new or carry the same bytes.
    ///
    /// # Errors
    /// [`StoreError::Damaged`], [`StoreError::TooLarge`], [`StoreError::Invalid`] (with
    /// the loader's reason), [`StoreError::VersionTaken`], [`StoreError::Io`].
    pub fn upload(
        &self,
        host: &PluginHost,
        bytes: &[u8],
        claimed_sha256: &str,
    ) -> Result<StoredPlugin, StoreError> {
        let sha = sha256_hex(bytes);
        if sha != claimed_sha256 {
            return Err(StoreError::Damaged {
                size: bytes.len(),
                got: sha,
                claimed: claimed_sha256.to_owned(),
            });
        }
        if bytes.len() > self.max_bytes {
            return Err(StoreError::TooLarge {
                size: bytes.len(),
                cap: self.max_bytes,
            });
        }
        // Validate from a private file; publish the blob only once it loaded.
        let staging = self.dir.join(format!("upload-{sha}.wasm"));
        write_atomically(&staging, bytes)?;
        let described = describe_component(host, &staging, &sha[..12]);
        let _ = std::fs::remove_file(&staging);
        let info = described?;
        let reference = info.reference();
        let mut index = self.lock();
        if let Some(existing) = index.get(&reference) {
            if existing.entry.sha256 == sha {
                return Ok(existing.clone());
            }
            return Err(StoreError::VersionTaken {
                reference,
                existing: existing.entry.sha256.clone(),
                new: sha,
            });
        }
        write_atomically(&self.blob_path(&sha), bytes)?;
        let stored = StoredPlugin {
            entry: PluginEntry {
                name: info.name.clone(),
                version: info.version.clone(),
                kind: info.kind,
                sha256: sha,
                size: bytes.len() as u64,
                description: info.description.clone(),
                wit: nop_stream_runtime::WIT_PACKAGE.to_owned(),
                stored_ms: now_ms(),
            },
            info,
        };
        index.insert(reference, stored.clone());
        let all: Vec<&StoredPlugin> = index.values().collect();
        let json = serde_json::to_vec_pretty(&all).map_err(|e| io_err(&self.dir, e))?;
        write_atomically(&self.dir.join("index.json"), &json)?;
        Ok(stored)
    }

    /// Every registered plugin, by name and version.
    pub fn list(&self) -> Vec<StoredPlugin> {
        self.lock().values().cloned().collect()
    }

    /// The plugin registered as `name@version`.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] naming what is registered under that name.
    pub fn get(&self, name: &str, version: &str) -> Result<StoredPlugin, StoreError> {
        let index = self.lock();
        if let Some(p) = index.get(&format!("{name}@{version}")) {
            return Ok(p.clone());
        }
        let others: Vec<String> = index
            .values()
            .filter(|p| p.entry.name == name)
            .map(|p| p.entry.reference())
            .collect();
        Err(StoreError::NotFound(format!(
            "plugin {name}@{version} is not in the cluster's registry{}; upload it with \
             `nopstream plugin upload FILE.wasm --cluster ADDR`",
            if others.is_empty() {
                String::new()
            } else {
                format!(" (registered: {})", others.join(", "))
            }
        )))
    }

    /// The bytes of the component with `sha256`, verified against the hash.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] if no such component is stored; [`StoreError::Io`], or
    /// [`StoreError::Damaged`] if the stored file no longer hashes to its name.
    pub fn blob(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::NotFound(format!(
                "`{sha256}` is not a sha256 in hex"
            )));
        }
        let path = self.blob_path(sha256);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(format!(
                    "no component with sha256 {sha256} in the registry"
                )));
            }
            Err(e) => return Err(io_err(&path, e)),
        };
        let got = sha256_hex(&bytes);
        if got != sha256 {
            return Err(StoreError::Damaged {
                size: bytes.len(),
                got,
                claimed: sha256.to_owned(),
            });
        }
        Ok(bytes)
    }
}

/// Loads the component at `path` as each world in turn and returns what its `describe()`
/// says, with a clear reason if it is none of them.
///
/// # Errors
/// [`StoreError::Invalid`]: not a component, a core module, or a component exporting none
/// of the `nop:stream` worlds this host serves (the loader's reasons per world).
pub fn describe_component(
    host: &PluginHost,
    path: &Path,
    label: &str,
) -> Result<PluginInfo, StoreError> {
    let mut reasons = Vec::new();
    for kind in [PluginKind::Operator, PluginKind::Source, PluginKind::Sink] {
        match host.load(label, path, kind) {
            Ok(p) => return Ok(p.info),
            // Not a component at all: the same answer for every world.
            Err(RuntimeError::PluginLoad { message, .. }) => {
                return Err(StoreError::Invalid(format!(
                    "not a loadable WebAssembly component: {message}"
                )));
            }
            Err(e) => reasons.push(format!("as {kind}: {e}")),
        }
    }
    Err(StoreError::Invalid(format!(
        "the component exports none of the worlds operator, source, sink of {} that this \
         host serves ({})",
        nop_stream_runtime::WIT_PACKAGE,
        reasons.join("; ")
    )))
}

/// A cluster job's durable record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub job: String,
    /// Job name.
    pub name: String,
    /// What was submitted.
    pub submission: JobSubmission,
    /// Where the job is.
    pub state: JobState,
    /// Semantic mode.
    pub semantic: String,
    /// When it was submitted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// The generation deployed last.
    pub generation: u64,
    /// Global recoveries so far.
    pub recoveries: u32,
    /// Why it failed, or the last failure it recovered from.
    pub error: Option<String>,
    /// The DeploymentPlan of the last generation, JSON.
    pub deployment_json: Option<String>,
    /// The run report once finished, JSON.
    pub report_json: Option<String>,
    /// Stale work refused so far (persisted at state changes).
    pub refused: RefusedCounts,
    /// Nodes of the last placement (`node-<id>`): a restarted coordinator waits for them
    /// before it redeploys.
    #[serde(default)]
    pub last_nodes: Vec<String>,
    /// Set when the job was restored from a savepoint whose plan differs from the job's
    /// (another parallelism, or actions applied): the plan fingerprint of the seeded
    /// manifest, which the restore accepts as an explicit action (design §10.5) — also
    /// after a coordinator restart before the job's first new epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale_from: Option<String>,
}

/// Job records under `<data>/jobs/`.
#[derive(Debug)]
pub struct JobStore {
    dir: PathBuf,
}

impl JobStore {
    /// Opens (creating) the store in `dir`.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        Ok(JobStore { dir })
    }

    fn path(&self, job: &str) -> PathBuf {
        self.dir.join(job).join("record.json")
    }

    /// Writes `record` durably.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn save(&self, record: &JobRecord) -> Result<(), StoreError> {
        let json = serde_json::to_vec_pretty(record).map_err(|e| io_err(&self.dir, e))?;
        write_atomically(&self.path(&record.job), &json)
    }

    /// Every job record.
    ///
    /// # Errors
    /// A record cannot be read or parsed (naming its file).
    pub fn load_all(&self) -> Result<Vec<JobRecord>, StoreError> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))? {
            let e = e.map_err(|e| io_err(&self.dir, e))?;
            let p = e.path().join("record.json");
            if !p.is_file() {
                continue;
            }
            let bytes = std::fs::read(&p).map_err(|e| io_err(&p, e))?;
            out.push(serde_json::from_slice(&bytes).map_err(|e| io_err(&p, e))?);
        }
        out.sort_by_key(|r: &JobRecord| r.submitted_ms);
        Ok(out)
    }
}
