//! The plugin registry (design §8, "Plugins"; §14 "Storage by location"): components
//! content-addressed by sha256 at the storage location, with an index entry per
//! `name@version` created conditionally, so versions are immutable and a coordinator started
//! anywhere with the same location finds every plugin:
//!
//! ```text
//! blobs/<sha256>.wasm                       the component's bytes (created once)
//! index/<name>@<version>.json               what describe() said, and the sha256 (created once)
//! ```
//!
//! A second upload of a name@version with other bytes is refused; one with the same bytes
//! is accepted and changes nothing. Components are loaded from a local copy in the
//! coordinator's data directory (`<data>/blobs/`), fetched from the store and verified.

use nop_stream_api::{PluginInfo, PluginKind};
use nop_stream_checkpoint::names::component;
use nop_stream_checkpoint::{ObjectStore, Scoped};
use nop_stream_plugin_host::{PluginHost, RuntimeError};
use nop_stream_proto::cli::PluginEntry;
use nop_stream_storage::{Created, StoreError as StoreError2};
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
    store: Scoped,
    /// Local copies of blobs, for loading (the coordinator's data directory).
    local: PathBuf,
    max_bytes: usize,
    index: Mutex<BTreeMap<String, StoredPlugin>>,
}

fn store_err(e: StoreError2) -> StoreError {
    StoreError::Io {
        path: e.object.clone().unwrap_or_default(),
        message: e.to_string(),
    }
}

impl PluginStore {
    /// Default cap on a component's size: 64 MiB less the frame's overhead.
    pub const DEFAULT_MAX_BYTES: usize = nop_stream_proto::cli::MAX_UPLOAD_FRAME - 1024;

    /// The registry at `store`'s prefix, with local copies of components under `local`;
    /// reads the index.
    ///
    /// # Errors
    /// The store cannot be read; an index entry does not decode.
    pub fn open(store: Scoped, local: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let local = local.into();
        std::fs::create_dir_all(&local).map_err(|e| io_err(&local, e))?;
        let me = PluginStore {
            store,
            local,
            max_bytes: Self::DEFAULT_MAX_BYTES,
            index: Mutex::new(BTreeMap::new()),
        };
        me.reload()?;
        Ok(me)
    }

    /// Reads the index again (entries another coordinator created).
    fn reload(&self) -> Result<(), StoreError> {
        let mut index = BTreeMap::new();
        for m in self.store.list("index/").map_err(store_err)? {
            let bytes = self.store.get(&m.name).map_err(store_err)?;
            let p: StoredPlugin = serde_json::from_slice(&bytes).map_err(|e| StoreError::Io {
                path: m.name.clone(),
                message: format!("not a registry entry: {e}"),
            })?;
            index.insert(p.entry.reference(), p);
        }
        *self.lock() = index;
        Ok(())
    }

    /// Caps uploads at `max` bytes.
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, StoredPlugin>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn blob_name(sha256: &str) -> String {
        format!("blobs/{sha256}.wasm")
    }

    fn index_name(name: &str, version: &str) -> String {
        format!("index/{}@{}.json", component(name), component(version))
    }

    /// A local file holding the component `sha256` (fetched from the store and verified
    /// the first time), for loading.
    ///
    /// # Errors
    /// No such component, a damaged one, or local I/O.
    pub fn blob_file(&self, sha256: &str) -> Result<PathBuf, StoreError> {
        let path = self.local.join(format!("{sha256}.wasm"));
        if !path.is_file() {
            let bytes = self.blob(sha256)?;
            write_atomically(&path, &bytes)?;
        }
        Ok(path)
    }

    /// Validates and stores a component (`claimed_sha256`: what the client computed).
    ///
    /// # Errors
    /// Damaged, too large, not a loadable component of a served world, or a name@version
    /// already registered with other bytes.
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
        let staging = self.local.join(format!("upload-{sha}.wasm"));
        write_atomically(&staging, bytes)?;
        let described = describe_component(host, &staging, &sha[..12]);
        let _ = std::fs::remove_file(&staging);
        let info = described?;
        // Blobs are content-addressed: one already there holds these bytes.
        self.store
            .put_if_absent(&Self::blob_name(&sha), bytes)
            .map_err(store_err)?;
        let stored = StoredPlugin {
            entry: PluginEntry {
                name: info.name.clone(),
                version: info.version.clone(),
                kind: info.kind,
                sha256: sha.clone(),
                size: bytes.len() as u64,
                description: info.description.clone(),
                wit: nop_stream_plugin_host::WIT_PACKAGE.to_owned(),
                stored_ms: now_ms(),
            },
            info,
        };
        let reference = stored.entry.reference();
        let json = serde_json::to_vec_pretty(&stored).map_err(|e| io_err(&self.local, e))?;
        let existing = match self
            .store
            .put_if_absent(
                &Self::index_name(&stored.entry.name, &stored.entry.version),
                &json,
            )
            .map_err(store_err)?
        {
            Created::Created => stored,
            Created::Exists(b) => {
                serde_json::from_slice::<StoredPlugin>(&b).map_err(|e| StoreError::Io {
                    path: reference.clone(),
                    message: format!("not a registry entry: {e}"),
                })?
            }
        };
        if existing.entry.sha256 != sha {
            return Err(StoreError::VersionTaken {
                reference,
                existing: existing.entry.sha256,
                new: sha,
            });
        }
        self.lock().insert(reference, existing.clone());
        Ok(existing)
    }

    /// Every registered plugin.
    pub fn list(&self) -> Vec<StoredPlugin> {
        self.lock().values().cloned().collect()
    }

    /// The plugin `name@version`.
    ///
    /// # Errors
    /// Not registered (naming the versions that are).
    pub fn get(&self, name: &str, version: &str) -> Result<StoredPlugin, StoreError> {
        let key = format!("{name}@{version}");
        if !self.lock().contains_key(&key) {
            // Another coordinator may have registered it since the index was read.
            let _ = self.reload();
        }
        let index = self.lock();
        if let Some(p) = index.get(&key) {
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

    /// The bytes of component `sha256`, verified.
    ///
    /// # Errors
    /// Not a sha256, no such component, or damaged.
    pub fn blob(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::NotFound(format!(
                "`{sha256}` is not a sha256 in hex"
            )));
        }
        let bytes = match self.store.get(&Self::blob_name(sha256)) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => {
                return Err(StoreError::NotFound(format!(
                    "no component with sha256 {sha256} in the registry"
                )));
            }
            Err(e) => return Err(store_err(e)),
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
        nop_stream_plugin_host::WIT_PACKAGE,
        reasons.join("; ")
    )))
}
