//! Self-description and identity shapes: [`PluginInfo`] (what `describe()` returns),
//! [`StateDescriptor`], capabilities, [`TaskInfo`], timers and log levels.

/// The kind of component; it must match the world the component exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    /// Exports the `operator` world.
    Operator,
    /// Exports the `source` world.
    Source,
    /// Exports the `sink` world.
    Sink,
}

/// The shape of a declared piece of keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// One value per key and namespace.
    Value,
    /// An append-only list of values per key and namespace.
    List,
    /// A map from user key to value per key and namespace.
    Map,
}

/// A keyed state the plugin declares in `describe()`; only declared states may be
/// opened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StateDescriptor {
    /// State name, unique within the plugin; part of the state path.
    pub name: String,
    /// Value, list or map.
    pub kind: StateKind,
    /// Version of the value encoding; a restore refuses a mismatch.
    pub schema_version: u32,
    /// Name of the value codec, e.g. `postcard` or `json`.
    pub codec: String,
    /// A canonical description of the values' structure, sent to the host through
    /// `state-declarations` (WIT `0.2.1`): the savepoint check refuses a restore whose
    /// plugin stores values of another structure under the same schema version
    /// (`STATE_SCHEMA_CHANGED`). The typed descriptors ([`crate::ValueState::descriptor`]
    /// and its kin) derive it from the value type's serde shape; `None` (the default of
    /// [`StateDescriptor::new`]) is never compared.
    pub schema: Option<String>,
}

impl StateDescriptor {
    /// A descriptor of any kind.
    pub fn new(
        name: impl Into<String>,
        kind: StateKind,
        schema_version: u32,
        codec: impl Into<String>,
    ) -> Self {
        StateDescriptor {
            name: name.into(),
            kind,
            schema_version,
            codec: codec.into(),
            schema: None,
        }
    }

    /// The same descriptor with the structure description `schema` (see
    /// [`StateDescriptor::schema`]).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// A [`StateKind::Value`] state.
    pub fn value(name: impl Into<String>, schema_version: u32, codec: impl Into<String>) -> Self {
        Self::new(name, StateKind::Value, schema_version, codec)
    }

    /// A [`StateKind::List`] state.
    pub fn list(name: impl Into<String>, schema_version: u32, codec: impl Into<String>) -> Self {
        Self::new(name, StateKind::List, schema_version, codec)
    }

    /// A [`StateKind::Map`] state.
    pub fn map(name: impl Into<String>, schema_version: u32, codec: impl Into<String>) -> Self {
        Self::new(name, StateKind::Map, schema_version, codec)
    }
}

/// How a restore at another parallelism hands out the entries of a non-keyed operator
/// state (design §10.5). At the same parallelism every policy but
/// [`Redistribution::Union`] gives each subtask back exactly its own entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Redistribution {
    /// The entries of all old subtasks are pooled and dealt in ascending id order round
    /// robin over the new subtasks: one owner each, balanced (Flink's even-split). Ids
    /// must be unique across subtasks (e.g. a source partition or file name).
    SplitRegistry,
    /// Every new subtask gets every entry of every old subtask, and filters what it needs
    /// (Flink's union redistribution). Ids must be unique across subtasks; copies of an
    /// id with the same value (a subtask kept every entry it was handed) count once.
    Union,
    /// Every subtask holds the same entries; a new subtask gets one copy. A restore fails
    /// if the old copies differ.
    Broadcast,
    /// No automatic redistribution: a restore at another parallelism needs a
    /// `drop-state` action.
    None,
}

/// A non-keyed operator state the plugin declares with
/// [`PluginInfo::operator_state`]: entries by string id that belong to an operator
/// subtask, not to a key (offsets, rules, a small model). Build it with
/// [`crate::OperatorState::descriptor`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperatorStateDescriptor {
    /// State name, unique among the plugin's keyed and operator states.
    pub name: String,
    /// Version of the value encoding.
    pub schema_version: u32,
    /// Name of the value codec.
    pub codec: String,
    /// How a restore at another parallelism hands out the entries.
    pub redistribution: Redistribution,
    /// A canonical description of the values' structure (see [`StateDescriptor::schema`]).
    pub schema: Option<String>,
}

/// Consistency level a source offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceCapability {
    /// Can be replayed from a checkpointed cursor.
    Replayable,
    /// The external system offers transactional or snapshot reads.
    TransactionalRead,
    /// Recoverable, but may repeat records.
    AtLeastOnce,
    /// No reliable cursor.
    BestEffort,
}

/// Consistency level a sink offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkCapability {
    /// begin / pre-commit / commit / abort / recover.
    TwoPhaseCommit,
    /// Writes go to a staging area and are published atomically after the epoch is durable.
    StagedAtomicCommit,
    /// Visibility is controlled by an epoch log in the target.
    OutboxEpochLog,
    /// Writes carry a deterministic de-duplication key.
    Idempotent,
    /// The final effect is decided by overwriting per key.
    UpsertByKey,
    /// May write duplicates.
    AtLeastOnce,
    /// No guarantee.
    BestEffort,
}

/// What a component says about itself; checked by the planner before a job runs.
///
/// Build it with [`PluginInfo::operator`], [`PluginInfo::source`] or [`PluginInfo::sink`]
/// and the chained setters:
///
/// ```
/// use nop_stream_sdk::{PluginInfo, StateDescriptor};
/// let info = PluginInfo::operator("counter", "0.1.0")
///     .description("counts records per key")
///     .state(StateDescriptor::value("count", 1, "postcard"))
///     .config_schema(r#"{"type":"object"}"#);
/// assert_eq!(info.states.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// Plugin name as referenced by jobs (`name@version`).
    pub name: String,
    /// Semantic version of the plugin.
    pub version: String,
    /// Must match the exported world.
    pub kind: PluginKind,
    /// One-line description; empty by default.
    pub description: String,
    /// Every keyed state the plugin may open; none by default.
    pub states: Vec<StateDescriptor>,
    /// Set by sources; `None` by default.
    pub source_capability: Option<SourceCapability>,
    /// Set by sinks; `None` by default.
    pub sink_capability: Option<SinkCapability>,
    /// JSON Schema of the `config` object `open` accepts; `{}` by default.
    pub config_schema: String,
    /// Side outputs this operator may emit to with [`crate::Context::side_output`];
    /// none by default. Emitting to an undeclared tag traps in the host.
    pub side_outputs: Vec<String>,
    /// Semantic model of the operator (a window spec, a CEP pattern) as JSON; it enters
    /// the plan fingerprint (design §9.2). `None` by default.
    pub model: Option<String>,
    /// Every non-keyed operator state the plugin may open (operators only); none by
    /// default.
    pub operator_states: Vec<OperatorStateDescriptor>,
}

impl PluginInfo {
    fn new(name: impl Into<String>, version: impl Into<String>, kind: PluginKind) -> Self {
        PluginInfo {
            name: name.into(),
            version: version.into(),
            kind,
            description: String::new(),
            states: Vec::new(),
            source_capability: None,
            sink_capability: None,
            config_schema: "{}".to_string(),
            side_outputs: Vec::new(),
            model: None,
            operator_states: Vec::new(),
        }
    }

    /// Info of an operator plugin.
    pub fn operator(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self::new(name, version, PluginKind::Operator)
    }

    /// Info of a source plugin (capability defaults to `None`; set it with
    /// [`PluginInfo::source_capability`]).
    pub fn source(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self::new(name, version, PluginKind::Source)
    }

    /// Info of a sink plugin (capability defaults to `None`; set it with
    /// [`PluginInfo::sink_capability`]).
    pub fn sink(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self::new(name, version, PluginKind::Sink)
    }

    /// Sets the one-line description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Declares one more keyed state.
    pub fn state(mut self, state: StateDescriptor) -> Self {
        self.states.push(state);
        self
    }

    /// Declares a non-keyed operator state (see [`crate::OperatorState`]). Operators only:
    /// sources keep their positions in split cursors and sinks in committables, and the
    /// host asks only operators for these declarations.
    pub fn operator_state(mut self, state: OperatorStateDescriptor) -> Self {
        self.operator_states.push(state);
        self
    }

    /// Sets the source capability.
    pub fn source_capability(mut self, capability: SourceCapability) -> Self {
        self.source_capability = Some(capability);
        self
    }

    /// Sets the sink capability.
    pub fn sink_capability(mut self, capability: SinkCapability) -> Self {
        self.sink_capability = Some(capability);
        self
    }

    /// Sets the JSON Schema of the `config` object (a JSON document as text).
    ///
    /// A sink whose guarantee depends on a setting annotates that top-level string
    /// property with `"x-sink-capability"`, an object from values to capability names
    /// (kebab-case): with `"transactions": {"enum": ["two-phase", "none"],
    /// "x-sink-capability": {"none": "idempotent"}}`, a job whose config says
    /// `transactions = "none"` is planned with capability `idempotent` instead of the one
    /// [`Self::sink_capability`] declares (so a strict job refuses it at plan time).
    ///
    /// A plugin whose output keys depend on only some settings marks those top-level
    /// properties `"x-key-spec": true` (`"key": {"type": "string", "x-key-spec": true}`):
    /// a savepoint check then calls a change of the other settings compatible for the
    /// keyed operators downstream, where without the mark any config change is a key
    /// change (`KEY_SPEC_CHANGED`).
    ///
    /// A stateful plugin whose stored values depend on settings marks those properties
    /// `"x-state-layout": true`, or lists the members of an object property that count
    /// (`"window": {"type": "object", "x-state-layout": ["kind", "size_ms"], …}`):
    /// keyed-aggregate marks `aggregates`, one accumulator slot per aggregate. A savepoint
    /// check then refuses a restore whose marked values differ (`STATE_LAYOUT_CHANGED`,
    /// cleared only by dropping the operator's state), where an unmarked change passes
    /// and the restored plugin meets values it cannot read.
    pub fn config_schema(mut self, schema: impl Into<String>) -> Self {
        self.config_schema = schema.into();
        self
    }

    /// Declares one more side output (see [`crate::Context::side_output`]).
    pub fn side_output(mut self, tag: impl Into<String>) -> Self {
        self.side_outputs.push(tag.into());
        self
    }

    /// Sets the semantic model (JSON) that enters the plan fingerprint.
    pub fn model(mut self, model_json: impl Into<String>) -> Self {
        self.model = Some(model_json.into());
        self
    }
}

/// Identity of the subtask an instance serves, given to `open`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskInfo {
    /// Logical job id, stable across restarts.
    pub job_id: String,
    /// Stable pipeline lineage id.
    pub pipeline_id: String,
    /// Stable operator id.
    pub operator_id: String,
    /// Operator name from the job file, for logs and errors.
    pub operator_name: String,
    /// Index of this subtask, `0 <= subtask_index < parallelism`.
    pub subtask_index: u32,
    /// Number of subtasks of this operator.
    pub parallelism: u32,
    /// Attempt number of this subtask, increasing on every restart.
    pub attempt: u32,
}

impl TaskInfo {
    /// A task info for unit tests: subtask 0 of 1, attempt 0, ids `"test"`.
    pub fn for_tests() -> Self {
        TaskInfo {
            job_id: "test".into(),
            pipeline_id: "test".into(),
            operator_id: "test".into(),
            operator_name: "test".into(),
            subtask_index: 0,
            parallelism: 1,
            attempt: 0,
        }
    }

    /// Refuses to open at a parallelism above 1, for an operator that puts every record
    /// under one key of its own (a global maximum, a top-N over all keys): at parallelism
    /// 2 each subtask would compute over its share of the records only and commit a
    /// partial result, and the host notices only when a checkpoint writes the key's state
    /// from a subtask that does not own it. Call it first in `open`.
    ///
    /// # Errors
    /// [`crate::ErrorCode::InvalidConfig`] naming `plugin`, the operator, `what` it
    /// computes and the fix (`parallelism = 1` behind a SINGLETON edge): the task fails
    /// at start and is not retried.
    pub fn require_parallelism_1(&self, plugin: &str, what: &str) -> crate::Result<()> {
        if self.parallelism <= 1 {
            return Ok(());
        }
        Err(crate::PluginError::invalid_config(format!(
            "{plugin}: `{}` computes {what} under one key, so it must run at parallelism 1 \
             (`parallelism = 1` and `partition = \"singleton\"` on its input), not {}",
            self.operator_name, self.parallelism
        )))
    }
}

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeDomain {
    /// Fires when the operator's watermark passes the timestamp.
    EventTime,
    /// Fires when the host's wall clock passes the timestamp.
    ProcessingTime,
}

/// One timer: (domain, key, namespace, timestamp). [`crate::Operator::on_timers`] receives
/// them grouped ([`TimerGroup`]); this owned form is for tests and helpers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FiredTimer {
    /// Clock of the timer.
    pub domain: TimeDomain,
    /// Key the timer was registered for.
    pub key: Vec<u8>,
    /// Namespace the timer was registered in.
    pub namespace: Vec<u8>,
    /// Timestamp in milliseconds since the Unix epoch.
    pub timestamp: i64,
}

/// Timers that fired together, delivered to [`crate::Operator::on_timers`]: every key
/// whose timer for one (domain, timestamp, namespace) came due, laid out flat like a
/// batch's keys (one boundary crossing for a window end that fires thousands of keys).
/// The host delivers groups in timestamp order, then namespace byte order, keys
/// ascending within a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TimerGroup {
    /// Clock of the timers.
    pub domain: TimeDomain,
    /// Timestamp in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Namespace the timers were registered in.
    pub namespace: Vec<u8>,
    /// The keys, concatenated.
    pub keys: Vec<u8>,
    /// Exclusive end offset in `keys` of each key.
    pub key_ends: Vec<u32>,
}

impl TimerGroup {
    /// Number of timers (keys) in the group.
    pub fn len(&self) -> usize {
        self.key_ends.len()
    }

    /// Whether the group holds no timer.
    pub fn is_empty(&self) -> bool {
        self.key_ends.is_empty()
    }

    /// The key of timer `i`.
    ///
    /// # Panics
    /// If `i >= self.len()` or the offsets are malformed.
    pub fn key(&self, i: usize) -> &[u8] {
        crate::context::nth_flat(&self.keys, &self.key_ends, i)
    }

    /// The keys in order.
    pub fn iter_keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(move |i| self.key(i))
    }

    /// The timers one by one (owned; for tests and simple operators).
    pub fn timers(&self) -> impl Iterator<Item = FiredTimer> + '_ {
        self.iter_keys().map(move |key| FiredTimer {
            domain: self.domain,
            key: key.to_vec(),
            namespace: self.namespace.clone(),
            timestamp: self.timestamp,
        })
    }

    /// Groups `timers` as the host does: consecutive timers with equal (domain,
    /// timestamp, namespace) form one group, in the given order.
    pub fn group(timers: &[FiredTimer]) -> Vec<TimerGroup> {
        let mut groups: Vec<TimerGroup> = Vec::new();
        for t in timers {
            let same = groups.last().is_some_and(|g| {
                g.domain == t.domain && g.timestamp == t.timestamp && g.namespace == t.namespace
            });
            if !same {
                groups.push(TimerGroup {
                    domain: t.domain,
                    timestamp: t.timestamp,
                    namespace: t.namespace.clone(),
                    keys: Vec::new(),
                    key_ends: Vec::new(),
                });
            }
            let g = groups.last_mut().expect("pushed above");
            g.keys.extend_from_slice(&t.key);
            g.key_ends.push(g.keys.len() as u32);
        }
        groups
    }

    /// Every timer of `groups`, in order.
    pub fn flatten(groups: &[TimerGroup]) -> Vec<FiredTimer> {
        groups.iter().flat_map(TimerGroup::timers).collect()
    }
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogLevel {
    /// Very verbose diagnostics.
    Trace,
    /// Diagnostics.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the plugin handled.
    Warn,
    /// Something failed.
    Error,
}
