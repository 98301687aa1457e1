//! Plugin resolution: a job's `name@version` or `path.wasm` reference becomes a loaded,
//! checked component. Also the planner's [`PluginCatalog`], so planning validates a job
//! against what each component's `describe()` really says.
//!
//! Resolution of `name@version` (see [`PluginRegistry::load`]): the search path is walked
//! in order (the `nopstream` CLI builds it from every `--plugins DIR`, then the entries of
//! `$NOPSTREAM_PLUGIN_PATH`, then the bundled plugin directory of the build); in each
//! directory the files of [`PluginRegistry::candidate_files`] are tried, and the first whose
//! `describe()` reports exactly that name and version is taken. A path reference
//! (`plugin = "path/to/x.wasm"`) loads that file, relative to the job file's directory.

use crate::error::{Result, RuntimeError};
use crate::plugin::{LoadedPlugin, PluginHost};
use nop_stream_api::{OperatorId, PluginInfo, PluginKind};
use nop_stream_core::{NodeSpec, PartitionedPlan, PluginCatalog, PluginRef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Loaded plugins by operator id.
pub type PluginSet = HashMap<OperatorId, Arc<LoadedPlugin>>;

/// Finds and loads plugins for one job.
pub struct PluginRegistry<'h> {
    host: &'h PluginHost,
    search_path: Vec<PathBuf>,
    job_dir: PathBuf,
    loaded: Mutex<HashMap<(PathBuf, PluginKind), Arc<LoadedPlugin>>>,
}

impl std::fmt::Debug for PluginRegistry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("search_path", &self.search_path)
            .field("job_dir", &self.job_dir)
            .finish_non_exhaustive()
    }
}

impl<'h> PluginRegistry<'h> {
    /// A registry looking for `name@version` in `search_path` (in order), and resolving
    /// relative `.wasm` paths against `job_dir`.
    pub fn new(host: &'h PluginHost, search_path: Vec<PathBuf>, job_dir: PathBuf) -> Self {
        PluginRegistry {
            host,
            search_path,
            job_dir,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// A registry with the same host and search path, resolving relative `.wasm` paths
    /// against another job's directory (an old job file, for `finalize-sink`).
    pub fn with_job_dir(&self, job_dir: PathBuf) -> PluginRegistry<'h> {
        PluginRegistry::new(self.host, self.search_path.clone(), job_dir)
    }

    /// File names tried for `name@version` in each directory of the search path, in
    /// order: the versioned names `name@version.wasm` and `name-version.wasm`, then the
    /// names `cargo build` gives a component, `name.wasm` and `name_with_underscores.wasm`.
    /// Any of them is taken only if its `describe()` reports exactly `name` and `version`.
    pub fn candidate_files(name: &str, version: &str) -> Vec<String> {
        let mut c = vec![
            format!("{name}@{version}.wasm"),
            format!("{name}-{version}.wasm"),
            format!("{name}.wasm"),
        ];
        let underscored = format!("{}.wasm", name.replace('-', "_"));
        if !c.contains(&underscored) {
            c.push(underscored);
        }
        c
    }

    /// The component file a path reference names (relative paths are resolved against the
    /// job file's directory).
    ///
    /// # Errors
    /// A message naming the file that does not exist.
    pub fn resolve_path(&self, path: &str) -> std::result::Result<PathBuf, String> {
        let p = Path::new(path);
        let p = if p.is_absolute() {
            p.to_owned()
        } else {
            self.job_dir.join(p)
        };
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!("component file {} does not exist", p.display()))
        }
    }

    /// Loads (once per file and role) the plugin `plugin` for role `kind`.
    ///
    /// A path reference loads that file. `name@version` walks the search path directory by
    /// directory and, in each, the [`Self::candidate_files`]; the first file whose
    /// `describe()` reports exactly that name and version wins, so several versions of one
    /// plugin can sit side by side (`keyed-aggregate@0.1.0.wasm`,
    /// `keyed-aggregate@0.2.0.wasm`) and a file of another version is skipped, never
    /// taken.
    ///
    /// # Errors
    /// [`RuntimeError::PluginNotFound`] when no file matches, listing where it looked and
    /// the versions it found instead; if no file matched and a candidate failed to load,
    /// that load error (wrong world, not a component, ...).
    pub fn load(&self, plugin: &PluginRef, kind: PluginKind) -> Result<Arc<LoadedPlugin>> {
        let label = plugin.to_string();
        match plugin {
            PluginRef::Path { path } => {
                let path =
                    self.resolve_path(path)
                        .map_err(|message| RuntimeError::PluginNotFound {
                            plugin: label.clone(),
                            message,
                        })?;
                self.load_file(&label, &path, kind)
            }
            PluginRef::Named { name, version } => self.load_named(&label, name, version, kind),
        }
    }

    fn load_named(
        &self,
        label: &str,
        name: &str,
        version: &str,
        kind: PluginKind,
    ) -> Result<Arc<LoadedPlugin>> {
        let candidates = Self::candidate_files(name, version);
        let mut other_versions = Vec::new();
        let mut first_error = None;
        for dir in &self.search_path {
            for c in &candidates {
                let path = dir.join(c);
                if !path.is_file() {
                    continue;
                }
                match self.load_file(label, &path, kind) {
                    Ok(p) if p.info.name == name && p.info.version == version => return Ok(p),
                    Ok(p) => {
                        other_versions.push(format!("{} ({})", p.info.reference(), path.display()))
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        let found = if other_versions.is_empty() {
            String::new()
        } else {
            format!("; found only {}", other_versions.join(", "))
        };
        Err(RuntimeError::PluginNotFound {
            plugin: label.to_owned(),
            message: format!(
                "not found in the plugin path [{}] (looked for {}){found}; build the plugin \
                 (`cargo build --target wasm32-wasip2 --release`: components are in \
                 target/wasm32-wasip2/release), name the file `{name}@{version}.wasm`, or \
                 pass --plugins DIR",
                self.search_path
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                candidates.join(", "),
            ),
        })
    }

    fn load_file(&self, label: &str, path: &Path, kind: PluginKind) -> Result<Arc<LoadedPlugin>> {
        let key = (path.to_owned(), kind);
        if let Some(p) = self
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Arc::clone(p));
        }
        let loaded = Arc::new(self.host.load(label, path, kind)?);
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, Arc::clone(&loaded));
        Ok(loaded)
    }

    /// Loads the plugin of every operator of `plan`.
    ///
    /// # Errors
    /// As [`Self::load`].
    pub fn plugin_set(&self, plan: &PartitionedPlan) -> Result<PluginSet> {
        let mut set = PluginSet::new();
        for v in &plan.vertices {
            for op in &v.operators {
                set.insert(op.operator_id.clone(), self.load(&op.plugin, op.kind)?);
            }
        }
        Ok(set)
    }
}

impl PluginCatalog for PluginRegistry<'_> {
    fn describe(&self, node: &NodeSpec) -> std::result::Result<PluginInfo, String> {
        self.load(&node.plugin, node.kind)
            .map(|p| p.info.clone())
            .map_err(|e| match e {
                // The diagnostic already names the plugin.
                RuntimeError::PluginNotFound { message, .. } => message,
                e => e.to_string(),
            })
    }
}
