//! Plugin resolution: a job's `name@version` or `path.wasm` reference becomes a loaded,
//! checked component. Also the planner's [`PluginCatalog`], so planning validates a job
//! against what each component's `describe()` really says.

use crate::error::{Result, RuntimeError};
use crate::job::PluginSet;
use crate::plugin::{LoadedPlugin, PluginHost};
use nop_stream_api::{PluginInfo, PluginKind};
use nop_stream_core::{NodeSpec, PartitionedPlan, PluginCatalog, PluginRef};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

    /// The component file a reference names.
    ///
    /// # Errors
    /// A message listing where it looked.
    pub fn resolve(&self, plugin: &PluginRef) -> std::result::Result<PathBuf, String> {
        match plugin {
            PluginRef::Path { path } => {
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
            PluginRef::Named { name, version } => {
                let candidates = [
                    format!("{name}@{version}.wasm"),
                    format!("{name}-{version}.wasm"),
                    format!("{name}.wasm"),
                    format!("{}.wasm", name.replace('-', "_")),
                ];
                for dir in &self.search_path {
                    for c in &candidates {
                        let p = dir.join(c);
                        if p.is_file() {
                            return Ok(p);
                        }
                    }
                }
                Err(format!(
                    "not found in the plugin path [{}] (looked for {}); build the plugins or pass --plugins DIR",
                    self.search_path
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    candidates.join(", ")
                ))
            }
        }
    }

    /// Loads (once per file and role) the plugin `plugin` for role `kind`.
    ///
    /// # Errors
    /// Resolution failure, or any [`PluginHost::load`] error.
    pub fn load(&self, plugin: &PluginRef, kind: PluginKind) -> Result<Arc<LoadedPlugin>> {
        let path = self
            .resolve(plugin)
            .map_err(|message| RuntimeError::PluginNotFound {
                plugin: plugin.to_string(),
                message,
            })?;
        let key = (path.clone(), kind);
        if let Some(p) = self
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(Arc::clone(p));
        }
        let loaded = Arc::new(self.host.load(&plugin.to_string(), &path, kind)?);
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
