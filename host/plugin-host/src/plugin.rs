//! The plugin host (design §16): one wasmtime [`Engine`] with epoch interruption, one
//! [`Linker`] serving the three worlds, WASI p2 and every registered host capability
//! (design §16.1), compiled components cached on disk by content hash, pre-linking once
//! per component and one `Store` per instance.

use crate::bindings::op::{Operator, OperatorPre};
use crate::bindings::sink::SinkPre;
use crate::bindings::src::SourcePre;
use crate::error::{Result, RuntimeError, Site};
use crate::instance::{
    CallCtx, Instance, OperatorInstance, SinkInstance, SourceInstance, classify, guest_error,
};
use crate::limits::TICK_MS;
use crate::options::InstanceOptions;
use crate::store::StoreData;
use crate::store::timers::TimerIndex;
use nop_stream_api::{PluginInfo, PluginKind, StateDescriptor, StateKind};
use nop_stream_capability::{Capability, CapabilityContexts};
use nop_stream_state::KeyedState;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{FsPerms, ResourceTable, WasiCtxBuilder};

/// Bytes of guest stderr kept to explain a trap (the tail of a panic message).
const STDERR_CAPTURE: usize = 64 * 1024;

/// A host capability registered with a [`PluginHost`] (design §16.1).
pub type HostCapability = Arc<dyn Capability<StoreData>>;

/// The engine, linker and compilation cache shared by every plugin of a process.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<StoreData>,
    cache_dir: Option<PathBuf>,
    capabilities: Arc<[HostCapability]>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("cache_dir", &self.cache_dir)
            .field(
                "capabilities",
                &self
                    .capabilities
                    .iter()
                    .map(|c| c.interface())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

enum Pre {
    Operator(OperatorPre<StoreData>),
    Source(SourcePre<StoreData>),
    Sink(SinkPre<StoreData>),
}

/// A compiled, pre-linked component whose world and `describe()` were checked.
pub struct LoadedPlugin {
    /// How the job referenced it (`name@version` or a path).
    pub label: String,
    /// Component file.
    pub path: PathBuf,
    /// sha256 of the component bytes (hex).
    pub sha256: String,
    /// What `describe()` returned.
    pub info: PluginInfo,
    /// Whether the compiled code came from the on-disk cache.
    pub cache_hit: bool,
    engine: Engine,
    capabilities: Arc<[HostCapability]>,
    pre: Pre,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("label", &self.label)
            .field("path", &self.path)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Environment variable that makes the engine tell a sampling profiler where each plugin
/// function's compiled code lies: `perfmap` writes `/tmp/perf-PID.map` (read by
/// `perf report`), `none` or unset turns it off. Any other value is refused at start-up,
/// naming the variable. Profiling costs nothing while the run is not sampled, but leaves
/// one map file per process behind.
pub const PROFILE_ENV: &str = "NOPSTREAM_WASM_PROFILE";

/// The profiler set by [`PROFILE_ENV`].
fn profiling_strategy() -> Result<Option<wasmtime::ProfilingStrategy>> {
    match std::env::var(PROFILE_ENV).ok().as_deref() {
        None | Some("") | Some("none") => Ok(None),
        Some("perfmap") => Ok(Some(wasmtime::ProfilingStrategy::PerfMap)),
        Some(other) => Err(RuntimeError::Internal(format!(
            "{PROFILE_ENV}={other:?}: expected `perfmap` or `none`"
        ))),
    }
}

impl PluginHost {
    /// Creates the engine (epoch interruption on, one ticker thread incrementing the epoch
    /// every [`TICK_MS`] ms) and the linker, with every capability of `capabilities` added
    /// to it. `cache_dir`: where compiled components are kept by content hash (`None`: no
    /// disk cache).
    ///
    /// # Errors
    /// If wasmtime rejects the configuration (a host bug), or two capabilities define the
    /// same interface.
    pub fn new(cache_dir: Option<PathBuf>, capabilities: Vec<HostCapability>) -> Result<Self> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        if let Some(strategy) = profiling_strategy()? {
            config.profiler(strategy);
        }
        let engine = Engine::new(&config).map_err(|e| RuntimeError::Internal(e.to_string()))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("wasm-ticker".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_millis(TICK_MS));
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        // Served to every component; only an instance whose context grants it can use one.
        for c in &capabilities {
            c.add_to_linker(&mut linker).map_err(|e| {
                RuntimeError::Internal(format!("host capability {}: {e:#}", c.interface()))
            })?;
        }
        Ok(PluginHost {
            engine,
            linker,
            cache_dir,
            capabilities: capabilities.into(),
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn compile(
        &self,
        label: &str,
        path: &Path,
        bytes: &[u8],
        sha: &str,
    ) -> Result<(Component, bool)> {
        let load_err = |message: String| RuntimeError::PluginLoad {
            plugin: label.to_owned(),
            path: path.display().to_string(),
            message,
        };
        if bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0] {
            return Err(load_err(
                "this is a core wasm module, not a component; build it with `--target wasm32-wasip2`".into(),
            ));
        }
        let cached = self.cache_dir.as_ref().map(|dir| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            self.engine.precompile_compatibility_hash().hash(&mut h);
            dir.join(format!("{sha}-{:016x}.cwasm", h.finish()))
        });
        if let Some(file) = cached.as_ref().filter(|f| f.exists()) {
            if let Ok(c) = deserialize_cached(&self.engine, file) {
                return Ok((c, true));
            }
            tracing::warn!(file = %file.display(), "stale compiled-component cache entry; recompiling");
        }
        let component =
            Component::new(&self.engine, bytes).map_err(|e| load_err(format!("{e:#}")))?;
        if let Some(file) = cached {
            // Best effort: a cache that cannot be written only costs a recompile next time.
            let write = || -> std::io::Result<()> {
                std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")))?;
                let bytes = component
                    .serialize()
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let tmp = file.with_extension(format!("tmp{}", std::process::id()));
                std::fs::write(&tmp, bytes)?;
                std::fs::rename(&tmp, &file)
            };
            if let Err(e) = write() {
                tracing::warn!(file = %file.display(), "cannot cache compiled component: {e}");
            }
        }
        Ok((component, false))
    }

    /// Refuses a component that imports or exports `nop:stream` interfaces of a version
    /// this host does not serve (design §10.6): the host serves
    /// [`crate::WIT_PACKAGE`] and, by the linker's semver matching, older versions of the
    /// same `0.minor` track; anything else (an older track, or a newer patch) is refused
    /// naming both versions, before linking can fail with a less useful type error.
    fn check_wit_version(&self, label: &str, path: &Path, component: &Component) -> Result<()> {
        let (served_pkg, served) = crate::WIT_PACKAGE
            .split_once('@')
            .expect("WIT_PACKAGE is name@version");
        let parse = |v: &str| -> Option<(u64, u64, u64)> {
            let mut it = v.split(['.', '-', '+']).map(|x| x.parse::<u64>().ok());
            Some((it.next()??, it.next()??, it.next()??))
        };
        let served_v = parse(served).expect("WIT_PACKAGE has a semver version");
        let ty = component.component_type();
        let names: Vec<String> = ty
            .imports(&self.engine)
            .map(|(n, _)| n.to_owned())
            .chain(ty.exports(&self.engine).map(|(n, _)| n.to_owned()))
            .collect();
        for name in names {
            let Some((iface, version)) = name.split_once('@') else {
                continue;
            };
            if !iface.starts_with(&format!("{served_pkg}/")) {
                continue;
            }
            let ok = parse(version).is_some_and(|v| {
                let same_track = if served_v.0 == 0 {
                    v.0 == 0 && v.1 == served_v.1
                } else {
                    v.0 == served_v.0
                };
                same_track && v <= served_v
            });
            if !ok {
                return Err(RuntimeError::UnservedWit {
                    plugin: label.to_owned(),
                    path: path.display().to_string(),
                    built_for: format!("{served_pkg}@{version}"),
                    served: crate::WIT_PACKAGE,
                });
            }
        }
        Ok(())
    }

    /// Loads the component at `path` for the role `expected`: compiles it (or takes it from
    /// the cache), checks that it exports the `expected` world, pre-links it, and calls
    /// `describe()` to check its kind.
    ///
    /// # Errors
    /// [`RuntimeError::PluginLoad`] (unreadable, not a component, does not compile),
    /// [`RuntimeError::UnservedWit`] (built against a `nop:stream` version this host does
    /// not serve), [`RuntimeError::WrongWorld`] (missing exports or unsatisfiable imports),
    /// [`RuntimeError::DescribeMismatch`] (describes another kind), or a trap in `describe`.
    pub fn load(&self, label: &str, path: &Path, expected: PluginKind) -> Result<LoadedPlugin> {
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::PluginLoad {
            plugin: label.to_owned(),
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let sha = hex::encode(Sha256::digest(&bytes));
        let (component, cache_hit) = self.compile(label, path, &bytes, &sha)?;
        self.check_wit_version(label, path, &component)?;
        let wrong_world = |e: wasmtime::Error| RuntimeError::WrongWorld {
            plugin: label.to_owned(),
            expected,
            message: format!("{e:#}"),
        };
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let pre = match expected {
            PluginKind::Operator => {
                Pre::Operator(OperatorPre::new(instance_pre).map_err(wrong_world)?)
            }
            PluginKind::Source => Pre::Source(SourcePre::new(instance_pre).map_err(wrong_world)?),
            PluginKind::Sink => Pre::Sink(SinkPre::new(instance_pre).map_err(wrong_world)?),
        };
        let mut loaded = LoadedPlugin {
            label: label.to_owned(),
            path: path.to_owned(),
            sha256: sha,
            info: PluginInfo {
                name: String::new(),
                version: String::new(),
                kind: expected,
                description: String::new(),
                states: Vec::new(),
                source_capability: None,
                sink_capability: None,
                config_schema: String::new(),
                side_outputs: Vec::new(),
                model: None,
                operator_states: Vec::new(),
            },
            cache_hit,
            engine: self.engine.clone(),
            capabilities: Arc::clone(&self.capabilities),
            pre,
        };
        let site = Site {
            plugin: label.to_owned(),
            operator: "describe".into(),
            subtask: None,
        };
        let opts = InstanceOptions::unserving(site);
        let mut info = match loaded.instantiate(&opts)? {
            Instance::Operator(mut i) => i.describe()?,
            Instance::Source(mut i) => i.describe()?,
            Instance::Sink(mut i) => i.describe()?,
        };
        if expected == PluginKind::Operator {
            loaded.declare(&mut info)?;
        }
        if info.kind != expected {
            return Err(RuntimeError::DescribeMismatch {
                plugin: label.to_owned(),
                message: format!(
                    "exports the `{expected}` world but describe() says it is a {}",
                    info.kind
                ),
            });
        }
        loaded.info = info;
        Ok(loaded)
    }
}

/// The descriptor of the internal timer state (`__timers`).
pub fn timer_descriptor() -> StateDescriptor {
    StateDescriptor {
        name: crate::store::TIMER_STATE.into(),
        kind: StateKind::Value,
        schema_version: 1,
        codec: "timer/1".into(),
        schema_sha256: None,
    }
}

#[allow(unsafe_code)]
fn deserialize_cached(engine: &Engine, file: &Path) -> wasmtime::Result<Component> {
    // SAFETY: cache files are written only by `Component::serialize` of this host (temp
    // file + rename, named by content hash and engine compatibility hash) and never
    // modified in place; wasmtime checks version and configuration on load.
    unsafe { Component::deserialize_file(engine, file) }
}

impl LoadedPlugin {
    /// Adds what the component's optional `nop:stream/state-declarations` export (`0.2.1`)
    /// declares to `info`: its operator states, and the sha256 of each keyed state's
    /// schema description. A component without the export (built before `0.2.1`) declares
    /// neither.
    ///
    /// # Errors
    /// [`RuntimeError::DescribeMismatch`] for a declaration that names an undeclared keyed
    /// state, reuses a state name, or takes a name reserved for the host (`__`); a trap in
    /// `declare`.
    fn declare(&self, info: &mut PluginInfo) -> Result<()> {
        use crate::bindings::WitRedistribution as W;
        use nop_stream_api::{OperatorStateDescriptor, Redistribution};
        let Pre::Operator(p) = &self.pre else {
            return Ok(());
        };
        let Ok(pre) = crate::bindings::decl::StateDeclarerPre::new(p.instance_pre().clone()) else {
            return Ok(());
        };
        let site = Site {
            plugin: self.label.clone(),
            operator: "declare".into(),
            subtask: None,
        };
        let opts = InstanceOptions::unserving(site.clone());
        let mut store = self.store(&opts)?;
        let ctx = CallCtx {
            site,
            limits: opts.limits.clone(),
            grants: Vec::new(),
        };
        let inst = pre
            .instantiate(&mut store)
            .map_err(|e| classify(&ctx, "instantiate", e, &store))?;
        let d = inst
            .nop_stream_state_declarations()
            .call_declare(&mut store)
            .map_err(|e| classify(&ctx, "declare", e, &store))?;
        let bad = |message: String| RuntimeError::DescribeMismatch {
            plugin: self.label.clone(),
            message,
        };
        let sha = |text: &str| hex::encode(Sha256::digest(text.as_bytes()));
        for s in d.keyed_schemas {
            let Some(st) = info.states.iter_mut().find(|st| st.name == s.state) else {
                return Err(bad(format!(
                    "its state declarations describe the schema of keyed state `{}`, which describe() does not declare",
                    s.state
                )));
            };
            st.schema_sha256 = Some(sha(&s.schema));
        }
        for o in d.operator_states {
            if o.name.starts_with("__")
                || info.states.iter().any(|s| s.name == o.name)
                || info.operator_states.iter().any(|s| s.name == o.name)
            {
                return Err(bad(format!(
                    "operator state `{}`: the name is reserved (`__`) or already declared",
                    o.name
                )));
            }
            info.operator_states.push(OperatorStateDescriptor {
                name: o.name,
                schema_version: o.schema_version,
                codec: o.codec,
                redistribution: match o.redistribution {
                    W::SplitRegistry => Redistribution::SplitRegistry,
                    W::Union => Redistribution::Union,
                    W::Broadcast => Redistribution::Broadcast,
                    W::None => Redistribution::None,
                },
                schema_sha256: o.schema.as_deref().map(sha),
            });
        }
        Ok(())
    }

    /// The plugin's kind.
    pub fn kind(&self) -> PluginKind {
        match self.pre {
            Pre::Operator(_) => PluginKind::Operator,
            Pre::Source(_) => PluginKind::Source,
            Pre::Sink(_) => PluginKind::Sink,
        }
    }

    fn store(&self, opts: &InstanceOptions) -> Result<Store<StoreData>> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_blocking_current_thread(true);
        let stderr = wasmtime_wasi::p2::pipe::MemoryOutputPipe::new(STDERR_CAPTURE);
        wasi.stderr(stderr.clone());
        for g in &opts.grants {
            let perms = if g.writable {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            wasi.preopened_dir(&g.host, &g.guest, perms)
                .map_err(|e| RuntimeError::Io {
                    path: g.host.display().to_string(),
                    message: format!("cannot grant directory to {}: {e:#}", opts.site),
                })?;
        }
        // Timers are keyed state too (design §8.4): an internal `__timers` state after the
        // declared ones, so they are routed, flushed to redb and snapshotted per shard.
        let mut timer_state = None;
        let state = match &opts.state {
            Some(cfg) => {
                let mut cfg = cfg.clone();
                timer_state = Some(cfg.states.len() as u32);
                cfg.states.push(timer_descriptor());
                Some(KeyedState::open(cfg.clone()).map_err(|e| RuntimeError::Io {
                    path: cfg.path.display().to_string(),
                    message: e.to_string(),
                })?)
            }
            None => None,
        };
        let mut capabilities = CapabilityContexts::default();
        for c in self.capabilities.iter() {
            capabilities.insert(c.context(opts.capabilities.as_ref()));
        }
        let limits = StoreLimitsBuilder::new()
            .memory_size(usize::try_from(opts.limits.memory_bytes).unwrap_or(usize::MAX))
            .trap_on_grow_failure(true)
            .build();
        let data = StoreData {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits,
            label: opts.site.to_string(),
            state,
            timers: TimerIndex::default(),
            timers_removed: Vec::new(),
            watermark: i64::MIN,
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            stderr: Some(stderr),
            timer_state,
            side_tags: self.info.side_outputs.clone(),
            side: Vec::new(),
            op_state: crate::op_state::OperatorStates::new(self.info.operator_states.clone()),
            capabilities,
            host_wait: Duration::ZERO,
        };
        let mut store = Store::new(&self.engine, data);
        store.limiter(|s| &mut s.limits);
        store.set_epoch_deadline(opts.limits.cpu_ticks());
        // Time blocked on a database in a host call is not guest CPU: when the deadline
        // passes, grant back the ticks spent waiting (if any) instead of trapping.
        store.epoch_deadline_callback(|mut ctx| {
            let waited = std::mem::take(&mut ctx.data_mut().host_wait);
            let ticks = (waited.as_millis() as u64).div_ceil(TICK_MS);
            if ticks > 0 {
                Ok(wasmtime::UpdateDeadline::Continue(ticks))
            } else {
                Err(wasmtime::Error::new(Trap::Interrupt))
            }
        });
        Ok(store)
    }

    /// Converts `entries` (namespace, key, value) of state `state` from schema
    /// `from_version` through the component's optional `nop:stream/state-migration`
    /// export (design §10.6, `migrate-state`), on a fresh instance that is never opened, under
    /// the default limits: one value per entry, `None` deleting it.
    ///
    /// # Errors
    /// [`RuntimeError::PluginLoad`] if the component is no operator or lacks the export;
    /// a trap, an exceeded limit or the guest's own error, naming the plugin and `migrate`.
    pub fn migrate_state(
        &self,
        operator: &str,
        state: &str,
        from_version: u32,
        entries: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let Pre::Operator(p) = &self.pre else {
            return Err(RuntimeError::PluginLoad {
                plugin: self.label.clone(),
                path: self.path.display().to_string(),
                message: "only operators migrate state".into(),
            });
        };
        let pre = crate::bindings::mig::StateMigratorPre::new(p.instance_pre().clone())
            .map_err(|e| RuntimeError::PluginLoad {
                plugin: self.label.clone(),
                path: self.path.display().to_string(),
                message: format!(
                    "the component exports no `nop:stream/state-migration` ({e:#}); build it with nop_stream_sdk::export_state_migration!"
                ),
            })?;
        let opts = InstanceOptions::unserving(Site {
            plugin: self.label.clone(),
            operator: operator.to_owned(),
            subtask: None,
        });
        let mut store = self.store(&opts)?;
        let ctx = CallCtx {
            site: opts.site.clone(),
            limits: opts.limits.clone(),
            grants: Vec::new(),
        };
        let inst = pre
            .instantiate(&mut store)
            .map_err(|e| classify(&ctx, "instantiate", e, &store))?;
        let entries: Vec<_> = entries
            .into_iter()
            .map(|(namespace, key, value)| {
                crate::bindings::mig::exports::nop::stream::state_migration::StateEntry {
                    namespace,
                    key,
                    value,
                }
            })
            .collect();
        match inst.nop_stream_state_migration().call_migrate(
            &mut store,
            state,
            from_version,
            &entries,
        ) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(guest_error(&ctx, "migrate", e)),
            Err(e) => Err(classify(&ctx, "migrate", e, &store)),
        }
    }

    /// Creates a fresh instance with its own store.
    ///
    /// # Errors
    /// A grant that cannot be opened, a state database that cannot be opened, or a trap
    /// during instantiation (e.g. initial memory over `memory_bytes`).
    pub fn instantiate(&self, opts: &InstanceOptions) -> Result<Instance> {
        let mut store = self.store(opts)?;
        let ctx = CallCtx {
            site: opts.site.clone(),
            limits: opts.limits.clone(),
            grants: opts.grants.clone(),
        };
        let fail =
            |e: wasmtime::Error, store: &Store<StoreData>| classify(&ctx, "instantiate", e, store);
        Ok(match &self.pre {
            Pre::Operator(p) => {
                let inst = p.instantiate(&mut store).map_err(|e| fail(e, &store))?;
                Instance::Operator(OperatorInstance {
                    store,
                    inst: Arc::new(inst),
                    ctx: ctx.clone(),
                })
            }
            Pre::Source(p) => {
                let inst = p.instantiate(&mut store).map_err(|e| fail(e, &store))?;
                Instance::Source(SourceInstance {
                    store,
                    inst: Arc::new(inst),
                    ctx: ctx.clone(),
                })
            }
            Pre::Sink(p) => {
                let inst = p.instantiate(&mut store).map_err(|e| fail(e, &store))?;
                Instance::Sink(SinkInstance {
                    store,
                    inst: Arc::new(inst),
                    ctx: ctx.clone(),
                })
            }
        })
    }

    /// The engine the plugin was compiled for.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}
