//! The plugin host (design §16): one wasmtime [`Engine`] with epoch interruption, one
//! [`Linker`] serving the three worlds plus WASI p2, compiled components cached on disk
//! by content hash, pre-linking once per component and one `Store` per instance.

use crate::bindings::op::{Operator, OperatorPre};
use crate::bindings::sink::{Sink, SinkPre};
use crate::bindings::src::{Source, SourcePre};
use crate::bindings::{
    CommitOutcome, ErrorCode, GuestError, ReadResult, TimerGroup, WitBatch, WitPluginInfo,
    WitPluginKind, WitSinkCapability, WitSourceCapability, WitStateKind, host_batch, wit_batch,
    wit_split, wit_task_info,
};
use crate::error::{Result, RuntimeError, Site};
use crate::host::{HostTrap, StoreData};
use crate::limits::{Limits, TICK_MS};
use nop_stream_api::{
    Batch, PluginInfo, PluginKind, SinkCapability, SourceCapability, Split, StateDescriptor,
    StateKind, TaskInfo,
};
use nop_stream_state::{KeyedState, StateConfig};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, Store, StoreLimitsBuilder, Trap};
use wasmtime_wasi::{FsPerms, ResourceTable, WasiCtxBuilder};

/// Bytes of guest stderr kept to explain a trap (the tail of a panic message).
const STDERR_CAPTURE: usize = 64 * 1024;

/// A directory granted to an instance (a WASI preopen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// Host directory (must exist).
    pub host: PathBuf,
    /// Path the guest sees.
    pub guest: String,
    /// Whether the guest may write.
    pub writable: bool,
}

/// How to build one instance.
#[derive(Debug, Clone)]
pub struct InstanceOptions {
    /// Who the instance is, for messages.
    pub site: Site,
    /// Sandbox limits.
    pub limits: Limits,
    /// Preopened directories; nothing else of the host filesystem is visible.
    pub grants: Vec<DirGrant>,
    /// Keyed state of the operator subtask, if the operator declares states.
    pub state: Option<StateConfig>,
    /// Sinks: the connections granted to the node and the subtask's GID scope for
    /// `nop:postgres/client`; `None` for every other instance (it can open none).
    pub pg: Option<crate::pg::PgAccess>,
    /// Sources and sinks: the connections granted to the node for `nop:redis/streams`;
    /// `None` for every other instance (it can use none).
    pub redis: Option<crate::redis::RedisAccess>,
    /// Sources: the connections granted to the node for `nop:nats/jetstream`; `None` for
    /// every other instance (it can use none).
    pub nats: Option<crate::nats::NatsAccess>,
}

/// The engine, linker and compilation cache shared by every plugin of a process.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<StoreData>,
    cache_dir: Option<PathBuf>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("cache_dir", &self.cache_dir)
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
    /// every [`TICK_MS`] ms) and the linker. `cache_dir`: where compiled components are
    /// kept by content hash (`None`: no disk cache).
    ///
    /// # Errors
    /// If wasmtime rejects the configuration (a host bug).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self> {
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
        // Served to every component; only a sink instance with granted connections can
        // open a session (crate::pg).
        crate::bindings::pg::nop::postgres::client::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        // Likewise: only a source or sink instance with granted connections can use it
        // (crate::redis).
        crate::bindings::redis::nop::redis::streams::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        // Likewise; only a source instance with granted connections can read (crate::nats).
        crate::bindings::nats::nop::nats::jetstream::add_to_linker::<_, HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        Ok(PluginHost {
            engine,
            linker,
            cache_dir,
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
    /// this host does not serve (issue 11 item 8): the host serves
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
            pre,
        };
        let site = Site {
            plugin: label.to_owned(),
            operator: "describe".into(),
            subtask: None,
        };
        let opts = InstanceOptions {
            site,
            limits: Limits::default(),
            grants: Vec::new(),
            state: None,
            pg: None,
            redis: None,
            nats: None,
        };
        let info = match loaded.instantiate(&opts)? {
            Instance::Operator(mut i) => i.describe()?,
            Instance::Source(mut i) => i.describe()?,
            Instance::Sink(mut i) => i.describe()?,
        };
        let mut info = convert_info(info);
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
        name: crate::host::TIMER_STATE.into(),
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

fn convert_info(w: WitPluginInfo) -> PluginInfo {
    PluginInfo {
        name: w.name,
        version: w.version,
        kind: match w.kind {
            WitPluginKind::Operator => PluginKind::Operator,
            WitPluginKind::Source => PluginKind::Source,
            WitPluginKind::Sink => PluginKind::Sink,
        },
        description: w.description,
        states: w
            .states
            .into_iter()
            .map(|s| StateDescriptor {
                name: s.name,
                kind: match s.kind {
                    WitStateKind::Value => StateKind::Value,
                    WitStateKind::List => StateKind::List,
                    WitStateKind::Map => StateKind::Map,
                },
                schema_version: s.schema_version,
                codec: s.codec,
                schema_sha256: None,
            })
            .collect(),
        source_capability: w.source_capability.map(|c| match c {
            WitSourceCapability::Replayable => SourceCapability::Replayable,
            WitSourceCapability::TransactionalRead => SourceCapability::TransactionalRead,
            WitSourceCapability::AtLeastOnce => SourceCapability::AtLeastOnce,
            WitSourceCapability::BestEffort => SourceCapability::BestEffort,
        }),
        sink_capability: w.sink_capability.map(|c| match c {
            WitSinkCapability::TwoPhaseCommit => SinkCapability::TwoPhaseCommit,
            WitSinkCapability::StagedAtomicCommit => SinkCapability::StagedAtomicCommit,
            WitSinkCapability::OutboxEpochLog => SinkCapability::OutboxEpochLog,
            WitSinkCapability::Idempotent => SinkCapability::Idempotent,
            WitSinkCapability::UpsertByKey => SinkCapability::UpsertByKey,
            WitSinkCapability::AtLeastOnce => SinkCapability::AtLeastOnce,
            WitSinkCapability::BestEffort => SinkCapability::BestEffort,
        }),
        config_schema: w.config_schema,
        side_outputs: w.side_outputs,
        model: w.model,
        operator_states: Vec::new(),
    }
}

/// A live instance of any world.
pub enum Instance {
    /// An operator.
    Operator(OperatorInstance),
    /// A source.
    Source(SourceInstance),
    /// A sink.
    Sink(SinkInstance),
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
        let opts = InstanceOptions {
            site: site.clone(),
            limits: Limits::default(),
            grants: Vec::new(),
            state: None,
            pg: None,
            redis: None,
            nats: None,
        };
        let mut store = self.store(&opts)?;
        let ctx = CallCtx {
            site,
            limits: opts.limits.clone(),
            writable: Vec::new(),
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
            timers: crate::host::TimerIndex::default(),
            timers_removed: Vec::new(),
            watermark: i64::MIN,
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            stderr: Some(stderr),
            timer_state,
            side_tags: self.info.side_outputs.clone(),
            side: Vec::new(),
            op_state: crate::op_state::OperatorStates::new(self.info.operator_states.clone()),
            pg: crate::pg::PgState {
                access: opts.pg.clone(),
                open: 0,
                max_sessions: opts.limits.pg_sessions,
                statement_timeout_ms: opts.limits.pg_statement_timeout_ms,
                result_bytes: opts.limits.pg_result_bytes,
                connect_timeout_ms: opts.limits.pg_connect_timeout_ms,
            },
            redis: crate::redis::RedisState {
                access: opts.redis.clone(),
                open: BTreeMap::new(),
                reply_bytes: opts.limits.redis_reply_bytes,
                connect_timeout_ms: opts.limits.redis_connect_timeout_ms,
                command_timeout_ms: opts.limits.redis_command_timeout_ms,
            },
            nats: crate::nats::NatsState::new(opts.nats.clone(), &opts.limits),
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
    /// export (issue 11, `migrate-state`), on a fresh instance that is never opened, under
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
        let opts = InstanceOptions {
            site: Site {
                plugin: self.label.clone(),
                operator: operator.to_owned(),
                subtask: None,
            },
            limits: Limits::default(),
            grants: Vec::new(),
            state: None,
            pg: None,
            redis: None,
            nats: None,
        };
        let mut store = self.store(&opts)?;
        let ctx = CallCtx {
            site: opts.site.clone(),
            limits: opts.limits.clone(),
            writable: Vec::new(),
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
            writable: opts.grants.iter().filter(|g| g.writable).cloned().collect(),
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

#[derive(Debug, Clone)]
struct CallCtx {
    site: Site,
    limits: Limits,
    /// The instance's writable grants, to name a full file system behind an I/O error.
    writable: Vec<DirGrant>,
}

/// A writable grant with fewer free bytes than this is taken as the cause of a guest's I/O
/// error: one buffered write of a sink (64 KiB) no longer fits.
const FULL_BELOW_BYTES: u64 = 64 * 1024;

/// Bytes an unprivileged writer can still allocate on the file system of `dir`.
#[cfg(unix)]
fn available_bytes(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(not(unix))]
fn available_bytes(_dir: &Path) -> Option<u64> {
    None
}

/// Why an I/O error of a guest happened, when the host can tell: a writable grant whose
/// file system has no space left. The guest itself often cannot say so: WASI streams
/// report a failed write as a generic I/O error (`os error 29`, EIO in WASI numbering),
/// whatever the host's errno was.
fn io_cause(ctx: &CallCtx, message: &str) -> Option<String> {
    if !["os error", "I/O error", "space"]
        .iter()
        .any(|w| message.contains(w))
    {
        return None;
    }
    ctx.writable.iter().find_map(|g| {
        let free = available_bytes(&g.host)?;
        (free < FULL_BELOW_BYTES).then(|| {
            format!(
                "no space left on device: the file system of the directory granted as `{}` \
                 ({}) is full ({free} bytes free)",
                g.guest,
                g.host.display()
            )
        })
    })
}

/// Turns a wasmtime error from a call into a [`RuntimeError`] naming the limit that fired.
fn classify(
    ctx: &CallCtx,
    call: &'static str,
    e: wasmtime::Error,
    store: &Store<StoreData>,
) -> RuntimeError {
    let msg = format!("{e:#}");
    // The full chain carries the wasm backtrace: for developers, not for the one-line
    // reason a user reads.
    tracing::debug!(site = %ctx.site, call, "guest trap: {msg}");
    let root = e.root_cause().to_string();
    let reason = if matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        format!(
            "exceeded limit `cpu_ms_per_call` ({} ms per call)",
            ctx.limits.cpu_ms_per_call
        )
    } else if msg.contains("forcing trap when growing memory") {
        format!(
            "exceeded limit `memory_bytes` ({} bytes per instance): {root}",
            ctx.limits.memory_bytes
        )
    } else if let Some(h) = e.downcast_ref::<HostTrap>() {
        h.0.clone()
    } else {
        let mut reason = root;
        if let Some(pipe) = &store.data().stderr {
            let captured = pipe.contents();
            let text = String::from_utf8_lossy(&captured);
            let tail: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
                .rev()
                .take(8)
                .collect();
            if !tail.is_empty() {
                reason.push_str("; guest stderr: ");
                reason.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
            }
        }
        reason
    };
    let reason = match io_cause(ctx, &reason) {
        Some(cause) => format!("{cause} ({reason})"),
        None => reason,
    };
    RuntimeError::Trap {
        site: ctx.site.clone(),
        call,
        reason,
    }
}

/// The WIT name of an error code (`invalid-record`), as the guest SDK spells it.
fn error_code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidConfig => "invalid-config",
        ErrorCode::InvalidRecord => "invalid-record",
        ErrorCode::Io => "io",
        ErrorCode::State => "state",
        ErrorCode::Transaction => "transaction",
        ErrorCode::Internal => "internal",
    }
}

fn guest_error(ctx: &CallCtx, call: &'static str, e: GuestError) -> RuntimeError {
    let message = match io_cause(ctx, &e.message) {
        Some(cause) => format!("{cause} ({})", e.message),
        None => e.message,
    };
    RuntimeError::Guest {
        site: ctx.site.clone(),
        call,
        code: error_code_name(e.code),
        message: message.into(),
        record: None,
    }
}

/// Checks a batch returned by a guest against the layout rules and output limits.
///
/// # Errors
/// [`RuntimeError::MalformedBatch`] or [`RuntimeError::LimitExceeded`].
fn check_output(ctx: &CallCtx, call: &'static str, b: &WitBatch) -> Result<()> {
    let malformed = |detail: String| RuntimeError::MalformedBatch {
        site: ctx.site.clone(),
        call,
        detail,
    };
    let limit = |limit: &'static str, value: u64, max: u64| RuntimeError::LimitExceeded {
        site: ctx.site.clone(),
        call,
        limit,
        value,
        max,
    };
    let n = b.ends.len();
    let l = &ctx.limits;
    if n as u64 > u64::from(l.max_output_records) {
        return Err(limit(
            "max_output_records",
            n as u64,
            u64::from(l.max_output_records),
        ));
    }
    let bytes = (b.data.len() + b.keys.len()) as u64;
    if bytes > l.max_output_bytes {
        return Err(limit("max_output_bytes", bytes, l.max_output_bytes));
    }
    check_layout(&b.data, &b.ends, "records", l.max_record_bytes).map_err(|e| match e {
        LayoutError::Malformed(d) => malformed(d),
        LayoutError::TooLarge(v) => limit("max_record_bytes", v, u64::from(l.max_record_bytes)),
    })?;
    if !b.key_ends.is_empty() {
        if b.key_ends.len() != n {
            return Err(malformed(format!(
                "{} keys for {n} records",
                b.key_ends.len()
            )));
        }
        check_layout(&b.keys, &b.key_ends, "keys", l.max_record_bytes).map_err(|e| match e {
            LayoutError::Malformed(d) => malformed(d),
            LayoutError::TooLarge(v) => limit("max_record_bytes", v, u64::from(l.max_record_bytes)),
        })?;
    } else if !b.keys.is_empty() {
        return Err(malformed("key bytes without key offsets".into()));
    }
    if !b.timestamps.is_empty() && b.timestamps.len() != n {
        return Err(malformed(format!(
            "{} timestamps for {n} records",
            b.timestamps.len()
        )));
    }
    Ok(())
}

enum LayoutError {
    Malformed(String),
    TooLarge(u64),
}

fn check_layout(data: &[u8], ends: &[u32], what: &str, max_item: u32) -> Result<(), LayoutError> {
    let mut prev = 0u32;
    for &e in ends {
        if e < prev {
            return Err(LayoutError::Malformed(format!(
                "{what} end offsets decrease ({prev} then {e})"
            )));
        }
        if e - prev > max_item {
            return Err(LayoutError::TooLarge(u64::from(e - prev)));
        }
        prev = e;
    }
    if prev as usize != data.len() {
        return Err(LayoutError::Malformed(format!(
            "{what} end offsets cover {prev} bytes but the buffer holds {}",
            data.len()
        )));
    }
    Ok(())
}

macro_rules! guest_call {
    ($self:ident, $name:literal, |$inst:ident, $store:ident| $body:expr) => {{
        let ticks = $self.ctx.limits.cpu_ticks();
        $self.store.set_epoch_deadline(ticks);
        $self.store.data_mut().host_wait = Duration::ZERO;
        let $inst = Arc::clone(&$self.inst);
        let $store = &mut $self.store;
        match $body {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(guest_error(&$self.ctx, $name, e)),
            Err(e) => Err(classify(&$self.ctx, $name, e, &$self.store)),
        }
    }};
}

/// [`guest_call!`] for exports without a WIT `result`: only traps can fail them.
macro_rules! guest_call_infallible {
    ($self:ident, $name:literal, |$inst:ident, $store:ident| $body:expr) => {
        guest_call!($self, $name, |$inst, $store| ($body)
            .map(Ok::<_, GuestError>))
    };
}

/// A `process` call the guest answered with an error (WIT `error`, not a trap).
#[derive(Debug)]
pub struct Rejected {
    /// The [`RuntimeError::Guest`] naming site, code and message.
    pub error: RuntimeError,
    /// The batch the call was given, unchanged.
    pub input: Batch,
}

/// An operator instance serving one subtask.
pub struct OperatorInstance {
    store: Store<StoreData>,
    inst: Arc<Operator>,
    ctx: CallCtx,
}

impl OperatorInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<WitPluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_operator_plugin()
            .call_describe(s))
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i
            .nop_stream_operator_plugin()
            .call_open(s, &wit_task_info(task), config))
    }

    /// Calls `process` and checks the output.
    ///
    /// # Errors
    /// A trap, a guest error, a malformed batch or an output limit.
    pub fn process(&mut self, input: u32, batch: Batch) -> Result<Batch> {
        self.try_process(input, batch)?.map_err(|r| r.error)
    }

    /// Calls `process` like [`Self::process`], but a guest-reported error comes back as
    /// [`Rejected`] together with the input batch, so the caller can apply the operator's
    /// error policy to its records. Side outputs of a rejected call are still queued
    /// ([`Self::take_side_outputs`]); the caller decides what becomes of them.
    ///
    /// # Errors
    /// A trap, a malformed batch or an output limit.
    pub fn try_process(&mut self, input: u32, batch: Batch) -> Result<Result<Batch, Rejected>> {
        let batch = wit_batch(batch);
        let out = guest_call!(self, "process", |i, s| i
            .nop_stream_operator_plugin()
            .call_process(s, input, &batch));
        match out {
            Ok(out) => {
                check_output(&self.ctx, "process", &out)?;
                Ok(Ok(host_batch(out)))
            }
            Err(error @ RuntimeError::Guest { .. }) => Ok(Err(Rejected {
                error,
                input: host_batch(batch),
            })),
            Err(e) => Err(e),
        }
    }

    /// Calls `on-watermark` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn on_watermark(&mut self, watermark: i64) -> Result<Batch> {
        self.store.data_mut().watermark = watermark;
        let out = guest_call!(self, "on-watermark", |i, s| i
            .nop_stream_operator_plugin()
            .call_on_watermark(s, watermark))?;
        check_output(&self.ctx, "on-watermark", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `on-timers` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn on_timers(&mut self, timers: &[TimerGroup]) -> Result<Batch> {
        let out = guest_call!(self, "on-timers", |i, s| i
            .nop_stream_operator_plugin()
            .call_on_timers(s, timers))?;
        check_output(&self.ctx, "on-timers", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `prepare-checkpoint` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn prepare_checkpoint(&mut self, epoch: u64) -> Result<Batch> {
        let out = guest_call!(self, "prepare-checkpoint", |i, s| i
            .nop_stream_operator_plugin()
            .call_prepare_checkpoint(s, epoch))?;
        check_output(&self.ctx, "prepare-checkpoint", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `finish` and checks the output.
    ///
    /// # Errors
    /// As [`Self::process`].
    pub fn finish(&mut self) -> Result<Batch> {
        let out = guest_call!(self, "finish", |i, s| i
            .nop_stream_operator_plugin()
            .call_finish(s))?;
        check_output(&self.ctx, "finish", &out)?;
        Ok(host_batch(out))
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_operator_plugin()
            .call_close(s))
    }

    /// Removes and returns the side-output records emitted by the calls since the last
    /// take, as (tag, batch) in emission order. Undeclared tags already trapped.
    pub fn take_side_outputs(&mut self) -> Vec<(String, Batch)> {
        std::mem::take(&mut self.store.data_mut().side)
    }

    /// The keyed state of this instance, if the operator declared any.
    pub fn state_mut(&mut self) -> Option<&mut KeyedState> {
        self.store.data_mut().state.as_mut()
    }

    /// The non-keyed operator state of this instance (empty if none is declared).
    pub fn operator_state_mut(&mut self) -> &mut crate::op_state::OperatorStates {
        &mut self.store.data_mut().op_state
    }

    /// Advances the watermark the guest sees to `watermark`, then removes and returns the
    /// event-time timers due at it, grouped per (timestamp, namespace) in timestamp order.
    pub fn take_due_event_timers(&mut self, watermark: i64) -> Result<Vec<TimerGroup>> {
        let data = self.store.data_mut();
        // The guest sees the new watermark while its timers fire (as in Flink's timer
        // service: the watermark advances, then the due timers fire).
        data.watermark = data.watermark.max(watermark);
        Ok(take_due(data, 0, watermark))
    }

    /// Removes and returns processing-time timers due at `now` (ms since the Unix epoch),
    /// grouped as [`Self::take_due_event_timers`]. Timers restored overdue fire on the
    /// first call (design §8.4).
    pub fn take_due_processing_timers(&mut self, now: i64) -> Result<Vec<TimerGroup>> {
        Ok(take_due(self.store.data_mut(), 1, now))
    }

    /// Whether a processing-time timer is registered.
    pub fn has_processing_timers(&self) -> bool {
        self.store.data().timers.has_domain(1)
    }

    /// Plugin-defined counters.
    pub fn counters(&self) -> &BTreeMap<String, u64> {
        &self.store.data().counters
    }

    /// Every registered timer as (domain code, timestamp, key, namespace).
    pub fn timers(&mut self) -> Vec<crate::host::TimerEntry> {
        let mut out = Vec::with_capacity(self.store.data().timers.len());
        for (d, ts, ns, k, _) in self.store.data_mut().timers.entries_mut() {
            out.push((d, ts, k.to_vec(), ns.to_vec()));
        }
        out.sort();
        out
    }

    /// Writes pending timer changes to the `__timers` state; call before snapshotting
    /// the keyed state.
    ///
    /// # Errors
    /// A refused state access.
    pub fn sync_timers(&mut self) -> Result<()> {
        let site = self.ctx.site.to_string();
        self.store
            .data_mut()
            .sync_timers()
            .map_err(|e| RuntimeError::Internal(format!("{site}: timer state: {e}")))
    }

    /// Rebuilds the in-memory timer index from the `__timers` state (after a restore).
    ///
    /// # Errors
    /// A database failure or a corrupt timer entry.
    pub fn reload_timers(&mut self) -> Result<()> {
        let data = self.store.data_mut();
        let (Some(h), Some(ks)) = (data.timer_state, data.state.as_mut()) else {
            return Ok(());
        };
        let entries = ks
            .scan(h)
            .map_err(|e| RuntimeError::Internal(format!("timer state: {e}")))?;
        for (ns, key) in entries {
            let t = crate::host::timer_entry(&ns, key)
                .ok_or_else(|| RuntimeError::Internal("corrupt timer entry".into()))?;
            data.timers.insert(t.0, t.1, &t.2, &t.3, true);
        }
        Ok(())
    }

    /// Sets the watermark the guest sees through `current-watermark`.
    pub fn set_watermark(&mut self, watermark: i64) {
        self.store.data_mut().watermark = watermark;
    }
}

/// A source instance.
pub struct SourceInstance {
    store: Store<StoreData>,
    inst: Arc<Source>,
    ctx: CallCtx,
}

impl SourceInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<WitPluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_source_plugin()
            .call_describe(s))
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i.nop_stream_source_plugin().call_open(
            s,
            &wit_task_info(task),
            config
        ))
    }

    /// Calls `discover-splits`; split ids must be unique.
    ///
    /// # Errors
    /// A trap, a guest error, or duplicate split ids.
    pub fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>> {
        let splits = guest_call!(self, "discover-splits", |i, s| i
            .nop_stream_source_plugin()
            .call_discover_splits(s, parallelism))?;
        let splits: Vec<Split> = splits
            .into_iter()
            .map(|s| Split {
                id: s.id,
                descriptor: s.descriptor,
            })
            .collect();
        let mut seen = BTreeSet::new();
        for sp in &splits {
            if !seen.insert(sp.id.as_str()) {
                return Err(RuntimeError::MalformedBatch {
                    site: self.ctx.site.clone(),
                    call: "discover-splits",
                    detail: format!("split id `{}` appears twice", sp.id),
                });
            }
        }
        Ok(splits)
    }

    /// Calls `read` and checks the output.
    ///
    /// # Errors
    /// A trap, a guest error, a malformed batch or an output limit.
    pub fn read(&mut self, split: &Split, cursor: &[u8], max_records: u32) -> Result<ReadResult> {
        let split = wit_split(split);
        let out = guest_call!(self, "read", |i, s| i.nop_stream_source_plugin().call_read(
            s,
            &split,
            cursor,
            max_records
        ))?;
        check_output(&self.ctx, "read", &out.records)?;
        if out.records.ends.len() > max_records as usize {
            return Err(RuntimeError::LimitExceeded {
                site: self.ctx.site.clone(),
                call: "read",
                limit: "max_batch_records",
                value: out.records.ends.len() as u64,
                max: u64::from(max_records),
            });
        }
        Ok(ReadResult {
            records: host_batch(out.records),
            next_cursor: out.next_cursor,
            finished: out.finished,
            progress: out.progress,
        })
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_source_plugin()
            .call_close(s))
    }
}

/// A sink instance.
pub struct SinkInstance {
    store: Store<StoreData>,
    inst: Arc<Sink>,
    ctx: CallCtx,
}

impl SinkInstance {
    /// Calls `describe`.
    ///
    /// # Errors
    /// A trap.
    pub fn describe(&mut self) -> Result<WitPluginInfo> {
        guest_call_infallible!(self, "describe", |i, s| i
            .nop_stream_sink_plugin()
            .call_describe(s))
    }

    /// Calls `open`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn open(&mut self, task: &TaskInfo, config: &str) -> Result<()> {
        guest_call!(self, "open", |i, s| i.nop_stream_sink_plugin().call_open(
            s,
            &wit_task_info(task),
            config
        ))
    }

    /// Calls `begin`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn begin(&mut self, txn: &str) -> Result<()> {
        guest_call!(self, "begin", |i, s| i
            .nop_stream_sink_plugin()
            .call_begin(s, txn))
    }

    /// Calls `write`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn write(&mut self, txn: &str, batch: Batch) -> Result<()> {
        let batch = wit_batch(batch);
        guest_call!(self, "write", |i, s| i
            .nop_stream_sink_plugin()
            .call_write(s, txn, &batch))
    }

    /// Calls `pre-commit`, returning the committable.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        guest_call!(self, "pre-commit", |i, s| i
            .nop_stream_sink_plugin()
            .call_pre_commit(s, txn))
    }

    /// Calls `commit`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn commit(&mut self, committable: &[u8]) -> Result<()> {
        guest_call!(self, "commit", |i, s| i
            .nop_stream_sink_plugin()
            .call_commit(s, committable))
    }

    /// Calls `abort`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn abort(&mut self, txn: &str) -> Result<()> {
        guest_call!(self, "abort", |i, s| i
            .nop_stream_sink_plugin()
            .call_abort(s, txn))
    }

    /// Calls `recover`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        guest_call!(self, "recover", |i, s| i
            .nop_stream_sink_plugin()
            .call_recover(s, committable))
    }

    /// Calls `pending-transactions`.
    ///
    /// # Errors
    /// A trap or a guest error.
    pub fn pending_transactions(&mut self) -> Result<Vec<String>> {
        guest_call!(self, "pending-transactions", |i, s| i
            .nop_stream_sink_plugin()
            .call_pending_transactions(s))
    }

    /// Calls `close`.
    ///
    /// # Errors
    /// A trap.
    pub fn close(&mut self) -> Result<()> {
        guest_call_infallible!(self, "close", |i, s| i
            .nop_stream_sink_plugin()
            .call_close(s))
    }

    /// The sink's site.
    pub fn site(&self) -> &Site {
        &self.ctx.site
    }
}

/// Pops the due timers of `domain` up to `up_to` as WIT timer groups, remembering the
/// persisted ones for deletion from the `__timers` state at the next sync.
fn take_due(data: &mut crate::host::StoreData, domain: u8, up_to: i64) -> Vec<TimerGroup> {
    let wit_domain = if domain == 0 {
        crate::bindings::TimeDomain::EventTime
    } else {
        crate::bindings::TimeDomain::ProcessingTime
    };
    let groups = data.timers.pop_due(domain, up_to);
    let mut out = Vec::with_capacity(groups.len());
    for g in groups {
        let mut keys = Vec::with_capacity(g.keys.iter().map(|k| k.0.len()).sum());
        let mut key_ends = Vec::with_capacity(g.keys.len());
        for (key, persisted) in &g.keys {
            if *persisted {
                data.timers_removed.push((
                    g.domain,
                    g.timestamp,
                    key.to_vec(),
                    g.namespace.to_vec(),
                ));
            }
            keys.extend_from_slice(key);
            key_ends.push(keys.len() as u32);
        }
        out.push(TimerGroup {
            domain: wit_domain,
            timestamp: g.timestamp,
            namespace: g.namespace.into_vec(),
            keys,
            key_ends,
        });
    }
    out
}
