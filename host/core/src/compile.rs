//! Plan compilation (design §2): `StreamModel -> StreamGraph -> JobGraph ->
//! PartitionedPlan -> DeploymentPlan`, with validation against what the plugins say about
//! themselves (kind, states, source/sink capabilities, design §13).
//!
//! Every step is a pure function of its input: compiling the same model against the same
//! plugin metadata twice yields byte-identical plans and the same fingerprint.

use crate::diag::{Diagnostic, Diagnostics};
use crate::jobfile::validate_model;
use crate::model::{
    DEAD_LETTER_OUTPUT, ErrorPolicy, JobSpec, NodeSpec, PluginRef, StreamModel, operator_id,
};
use crate::plan::{
    JobEdge, JobGraph, JobMeta, JobVertex, PartitionedEdge, PartitionedPlan, PartitionedVertex,
    PlannedOperator, PlannedSubtask, StreamEdge, StreamGraph,
};
use crate::shard::{HashPolicy, owner_of, shards_of};
use nop_stream_api::{
    ChannelId, EdgeId, JobId, OperatorId, PartitionPolicy, PipelineId, PluginInfo, PluginKind,
    SemanticMode, SinkCapability, SourceCapability, StateShardId, SubtaskIndex, TaskId, VertexId,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// Where the planner learns what a node's plugin is: the runtime implements it by
/// loading the component and calling its `describe()`; tests use a table.
pub trait PluginCatalog {
    /// Describes the plugin `node.plugin` refers to.
    ///
    /// # Errors
    /// A message saying why the plugin cannot be resolved or described (not found, not a
    /// component, wrong world, ...); it becomes a diagnostic at `<table>[i].plugin`.
    fn describe(&self, node: &NodeSpec) -> Result<PluginInfo, String>;
}

/// Builds the logical DAG: validates the model ([`validate_model`]), resolves every
/// plugin through `catalog` and checks it against its node, decides default partition
/// policies, checks edge policies against parallelism, and validates the semantic mode
/// against source and sink capabilities (design §13).
///
/// Rules:
/// - The plugin's kind must match the table the node is declared in.
/// - A `name@version` reference must resolve to a plugin describing itself with exactly
///   that name and version.
/// - Declared states need a non-empty name, unique within the plugin, and a codec.
/// - Sources must declare a source capability, sinks a sink capability. A sink's config
///   may select another capability where its schema says so
///   ([`configured_sink_capability`]); the plan carries the selected one.
/// - An edge without an explicit policy is FORWARD when both ends have equal
///   parallelism, else REBALANCE. FORWARD needs equal parallelism, SINGLETON a
///   downstream parallelism of 1, HASH `state_shards >=` downstream parallelism.
/// - Semantic mode (never silently downgraded): `strict-exactly-once` needs every source
///   replayable or transactional-read and every sink strict (2PC, staged atomic, outbox);
///   `effectively-once` needs such sources and idempotent, upsert or strict sinks;
///   `at-least-once` needs no best-effort source or sink; `best-effort` accepts all.
///   A refusal names the plugin, its capability and the mode, and suggests the strongest
///   mode the job does support, to be declared explicitly.
///
/// # Errors
/// Every problem found; fields are job-file paths (`operator[1].plugin`), without file
/// or position (see [`Diagnostics::with_file`]).
pub fn stream_graph(
    model: &StreamModel,
    catalog: &dyn PluginCatalog,
) -> Result<StreamGraph, Diagnostics> {
    validate_model(model)?;
    let mut diags = Vec::new();
    let prefixes: Vec<String> = (0..model.nodes.len())
        .map(|i| model.node_field(i))
        .collect();
    let infos = describe_plugins(model, catalog, &prefixes, &mut diags);
    let nodes = planned_operators(model, &infos);
    let edges = stream_edges(model, &nodes, &infos, &prefixes, &mut diags);
    check_error_policies(model, &infos, &prefixes, &mut diags);
    check_state_ttls(model, &infos, &prefixes, &mut diags);
    check_join_inputs(model, &infos, &prefixes, &mut diags);
    check_semantic(model, &infos, &prefixes, &mut diags);
    Diagnostics(diags).into_result()?;
    Ok(StreamGraph {
        job: job_meta(&model.job),
        nodes,
        edges,
    })
}

/// Describes each node's plugin through `catalog` and checks it against its node; a
/// node's entry is `None` when its plugin cannot be described or fails a check.
fn describe_plugins(
    model: &StreamModel,
    catalog: &dyn PluginCatalog,
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) -> Vec<Option<PluginInfo>> {
    let mut infos: Vec<Option<PluginInfo>> = Vec::with_capacity(model.nodes.len());
    for (i, node) in model.nodes.iter().enumerate() {
        let field = format!("{}.plugin", prefixes[i]);
        match catalog.describe(node) {
            Err(e) => {
                diags.push(Diagnostic::new(
                    field,
                    format!("cannot resolve plugin `{}`: {e}", node.plugin),
                ));
                infos.push(None);
            }
            Ok(info) => {
                let before = diags.len();
                check_plugin(node, &info, &field, diags);
                check_config(node, &info, &prefixes[i], diags);
                let mut info = info;
                if let Some((cap, _)) = configured_sink_capability(&info, &node.config) {
                    info.sink_capability = Some(cap);
                }
                infos.push((diags.len() == before).then_some(info));
            }
        }
    }
    infos
}

/// The planned operator of each node, in model order; a node whose plugin was not
/// described gets a placeholder description.
fn planned_operators(model: &StreamModel, infos: &[Option<PluginInfo>]) -> Vec<PlannedOperator> {
    model
        .nodes
        .iter()
        .zip(infos)
        .map(|(n, info)| PlannedOperator {
            operator_id: operator_id(n),
            name: n.name.clone(),
            model_path: n.path.clone(),
            kind: n.kind,
            plugin: n.plugin.clone(),
            plugin_info: info.clone().unwrap_or_else(|| placeholder_info(n)),
            config: n.config.clone(),
            grants: n.grants.clone(),
            connections: n
                .connections
                .iter()
                .filter_map(|c| Some((c.clone(), model.connections.get(c)?.clone())))
                .collect(),
            parallelism: model.parallelism_of(n),
            watermarks: n.watermarks,
            start_new_chain: n.start_new_chain,
            on_error: n.on_error,
            state_ttl_ms: n.state_ttl_ms.clone(),
        })
        .collect()
}

/// The edges of the logical DAG, one per input in model order, with their partition
/// policy (explicit, else FORWARD at equal parallelism and REBALANCE otherwise), each
/// checked against keyed state, parallelism and the upstream's side outputs.
fn stream_edges(
    model: &StreamModel,
    nodes: &[PlannedOperator],
    infos: &[Option<PluginInfo>],
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) -> Vec<StreamEdge> {
    let index: HashMap<&str, usize> = model
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut edges = Vec::new();
    for (i, n) in model.nodes.iter().enumerate() {
        let down = &nodes[i];
        for (j, input) in n.inputs.iter().enumerate() {
            // validate_model guarantees every input resolves.
            let Some(&u) = index.get(input.from.as_str()) else {
                continue;
            };
            let up = &nodes[u];
            let field = format!("{}.inputs[{j}].partition", prefixes[i]);
            let partition = match input.partition {
                Some(p) => p,
                None if up.parallelism == down.parallelism => PartitionPolicy::Forward,
                None => PartitionPolicy::Rebalance,
            };
            check_keyed_input(n, up, down, partition, infos[i].as_ref(), &field, diags);
            if partition == PartitionPolicy::Hash
                && input.output.as_deref() == Some(DEAD_LETTER_OUTPUT)
                && up.on_error == ErrorPolicy::DeadLetter
                && !up
                    .plugin_info
                    .side_outputs
                    .iter()
                    .any(|t| t == DEAD_LETTER_OUTPUT)
            {
                diags.push(Diagnostic::new(
                    field.clone(),
                    format!(
                        "the dead letters of `{}` (output `{DEAD_LETTER_OUTPUT}`) carry no key, \
                         so they cannot cross a HASH edge; read them with partition = \
                         \"rebalance\", \"forward\" or \"singleton\"",
                        up.name
                    ),
                ));
            }
            check_partition(up, down, partition, model.job.state_shards, field, diags);
            if let Some(tag) = &input.output
                && infos[u].is_some()
            {
                let field = format!("{}.inputs[{j}].output", prefixes[i]);
                check_side_output(up, tag, field, diags);
            }
            edges.push(StreamEdge {
                from: up.operator_id.clone(),
                to: down.operator_id.clone(),
                input_index: j as u32,
                partition,
                output: input.output.clone(),
            });
        }
    }
    edges
}

/// A node with keyed state at parallelism above 1 reads every input by HASH, so each
/// record reaches the subtask owning its key's state shard.
fn check_keyed_input(
    n: &NodeSpec,
    up: &PlannedOperator,
    down: &PlannedOperator,
    partition: PartitionPolicy,
    info: Option<&PluginInfo>,
    field: &str,
    diags: &mut Vec<Diagnostic>,
) {
    let pd = down.parallelism;
    if pd > 1
        && partition != PartitionPolicy::Hash
        && let Some(info) = info
        && !info.states.is_empty()
    {
        let states: Vec<String> = info
            .states
            .iter()
            .map(|s| format!("`{}`", s.name))
            .collect();
        diags.push(Diagnostic::new(
            field.to_owned(),
            format!(
                "`{}` ({}) declares keyed state ({}) and runs at parallelism {pd}, \
                 but its input from `{}` is {partition}, so records would reach a \
                 subtask that does not own their key's state shard; set \
                 `partition = \"hash\"` on this input (records keyed by the \
                 upstream), or run `{}` at parallelism 1",
                down.name,
                n.plugin,
                states.join(", "),
                up.name,
                down.name
            ),
        ));
    }
}

/// FORWARD needs equal parallelism, SINGLETON a downstream parallelism of 1, HASH
/// `state_shards >=` the downstream parallelism.
fn check_partition(
    up: &PlannedOperator,
    down: &PlannedOperator,
    partition: PartitionPolicy,
    state_shards: u32,
    field: String,
    diags: &mut Vec<Diagnostic>,
) {
    let (pu, pd) = (up.parallelism, down.parallelism);
    match partition {
        PartitionPolicy::Forward if pu != pd => diags.push(Diagnostic::new(
            field,
            format!(
                "FORWARD needs equal parallelism, but `{}` has {pu} and `{}` has {pd}; \
                 use rebalance or hash",
                up.name, down.name
            ),
        )),
        PartitionPolicy::Singleton if pd != 1 => diags.push(Diagnostic::new(
            field,
            format!(
                "SINGLETON sends everything to subtask 0, so `{}` must have \
                 parallelism 1, found {pd}",
                down.name
            ),
        )),
        PartitionPolicy::Hash if state_shards < pd => diags.push(Diagnostic::new(
            field,
            format!(
                "HASH into `{}` at parallelism {pd} needs state_shards >= {pd}, found {}",
                down.name, state_shards
            ),
        )),
        _ => {}
    }
}

/// An input reading side output `tag` of `up` names one its plugin declares, or the
/// dead-letter output of an upstream with `on_error = "dead-letter"`.
fn check_side_output(up: &PlannedOperator, tag: &str, field: String, diags: &mut Vec<Diagnostic>) {
    let declared_here = up.plugin_info.side_outputs.iter().any(|t| t == tag);
    let dead_letter = up.on_error == ErrorPolicy::DeadLetter && tag == DEAD_LETTER_OUTPUT;
    if declared_here || dead_letter {
        return;
    }
    let mut declared = if up.plugin_info.side_outputs.is_empty() {
        "it declares none".to_string()
    } else {
        format!("it declares: {}", up.plugin_info.side_outputs.join(", "))
    };
    if tag == DEAD_LETTER_OUTPUT {
        declared.push_str(&format!(
            "; set on_error = \"dead-letter\" on `{}` to send its failed records there",
            up.name
        ));
    }
    diags.push(Diagnostic::new(
        field,
        format!(
            "`{}` (plugin {}) has no side output `{tag}`; {declared}",
            up.name, up.plugin
        ),
    ));
}

/// The job-level part of the plan, copied from `[job]`.
fn job_meta(job: &JobSpec) -> JobMeta {
    JobMeta {
        job_id: JobId::new(job.id.clone()),
        pipeline_id: PipelineId::new(job.pipeline.clone()),
        name: job.name.clone(),
        semantic: job.semantic,
        checkpoint_interval_ms: job.checkpoint_interval_ms,
        checkpoint_every_records: job.checkpoint_every_records,
        checkpoint_timeout_ms: job.checkpoint_timeout_ms,
        state_memory_bytes: job.state_memory_bytes,
        async_snapshots: job.async_snapshots,
        incremental_snapshots: job.incremental_snapshots,
        state_shard_count: job.state_shards,
        batch_records: job.batch_records,
    }
}

/// The `operator` names of the guest SDK's join family in a plugin's model
/// (`nop_stream_sdk::join`'s `to_model_json`): a join takes its left input on input 0 and
/// its right input on input 1, and nothing else.
const JOIN_MODEL_OPERATORS: [&str; 3] = ["regular-join", "interval-join", "window-join"];

/// The join operator a plugin's model declares (`{"operator":"interval-join",...}`), if
/// any of [`JOIN_MODEL_OPERATORS`].
fn join_operator(info: &PluginInfo) -> Option<&'static str> {
    let model: serde_json::Value = serde_json::from_str(info.model.as_deref()?).ok()?;
    let op = model.get("operator")?.as_str()?;
    JOIN_MODEL_OPERATORS.into_iter().find(|j| *j == op)
}

/// The schema keyword by which a plugin whose number of inputs depends on a setting (a
/// multi-stage plugin, one stage of which is a join) maps the values of that top-level
/// property to the number of inputs a node must give it: `"stage": {"enum": ["max",
/// "join"], "x-inputs": {"max": 1, "join": 2}}`. See [`configured_inputs`].
pub const INPUTS_KEYWORD: &str = "x-inputs";

/// The number of inputs `config` asks of a plugin that marks a property with
/// [`INPUTS_KEYWORD`], with the property and its value (JSON text) that decided it; `None`
/// when nothing is marked or the value (the config's, else the schema's `default`) is not
/// in the map.
pub fn configured_inputs(
    info: &PluginInfo,
    config: &serde_json::Value,
) -> Option<(String, String, usize)> {
    let schema: serde_json::Value = serde_json::from_str(&info.config_schema).ok()?;
    let props = schema.get("properties")?.as_object()?;
    props.iter().find_map(|(k, p)| {
        let map = p.get(INPUTS_KEYWORD)?.as_object()?;
        let v = config.get(k).or_else(|| p.get("default"))?;
        let key = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let want = usize::try_from(map.get(&key)?.as_u64()?).ok()?;
        Some((k.clone(), v.to_string(), want))
    })
}

/// An operator whose model is a join ([`join_operator`]) has exactly two inputs: with one,
/// it would run and join nothing; with three, its third input's first record would fail
/// the task at run time. A plugin that marks a setting [`INPUTS_KEYWORD`] (a multi-stage
/// plugin) has the count its configured value maps to, whatever its model says.
fn check_join_inputs(
    model: &StreamModel,
    infos: &[Option<PluginInfo>],
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    let count = |k: usize| match k {
        0 => "none".to_owned(),
        1 => "one".to_owned(),
        2 => "two".to_owned(),
        k => k.to_string(),
    };
    for (i, n) in model.nodes.iter().enumerate() {
        if n.kind != PluginKind::Operator {
            continue;
        }
        if let Some((property, value, want)) = infos[i]
            .as_ref()
            .and_then(|info| configured_inputs(info, &n.config))
        {
            if n.inputs.len() != want {
                diags.push(Diagnostic::new(
                    format!("{}.inputs", prefixes[i]),
                    format!(
                        "`{}` ({}) with `{property} = {value}` takes exactly {} input{}, \
                         but it has {}",
                        n.name,
                        n.plugin,
                        count(want),
                        if want == 1 { "" } else { "s" },
                        count(n.inputs.len()),
                    ),
                ));
            }
            continue;
        }
        let Some(join) = infos[i].as_ref().and_then(join_operator) else {
            continue;
        };
        if n.inputs.len() == 2 {
            continue;
        }
        let had = count(n.inputs.len());
        diags.push(Diagnostic::new(
            format!("{}.inputs", prefixes[i]),
            format!(
                "`{}` ({}) is {} {join}, which takes exactly two inputs, the left one first \
                 (`inputs = [{{ from = \"left\", partition = \"hash\" }}, {{ from = \"right\", \
                 partition = \"hash\" }}]`), but it has {had}",
                n.name,
                n.plugin,
                if join == "interval-join" { "an" } else { "a" },
            ),
        ));
    }
}

/// `state_ttl_ms` names declared keyed states of the operator's plugin only.
fn check_state_ttls(
    model: &StreamModel,
    infos: &[Option<PluginInfo>],
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    for (i, n) in model.nodes.iter().enumerate() {
        let Some(info) = &infos[i] else { continue };
        for name in n.state_ttl_ms.keys() {
            if !info.states.iter().any(|s| s.name == *name) {
                let declared: Vec<String> = info
                    .states
                    .iter()
                    .map(|s| format!("`{}`", s.name))
                    .collect();
                diags.push(Diagnostic::new(
                    format!("{}.state_ttl_ms.{name}", prefixes[i]),
                    format!(
                        "plugin `{}` declares no keyed state `{name}`; it declares {}",
                        n.plugin,
                        if declared.is_empty() {
                            "none".to_owned()
                        } else {
                            declared.join(", ")
                        }
                    ),
                ));
            }
        }
    }
}

/// `on_error = "skip" | "dead-letter"` (docs/operations.md, "Error policy"): the host isolates a
/// failing record by calling `process` again one record at a time, which is exactly-once
/// only if the failed call left nothing behind. The host discards a failed call's output
/// and side outputs but cannot take back its keyed-state and timer writes, so both
/// policies are refused for operators that declare keyed state. `dead-letter` also needs
/// a reader of the `errors` output (dead letters nobody reads would be a silent loss)
/// and a plugin that does not declare a side output of that name itself.
fn check_error_policies(
    model: &StreamModel,
    infos: &[Option<PluginInfo>],
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    for (i, n) in model.nodes.iter().enumerate() {
        if n.on_error == ErrorPolicy::Fail {
            continue;
        }
        let field = format!("{}.on_error", prefixes[i]);
        let Some(info) = &infos[i] else { continue };
        if !info.states.is_empty() {
            let states: Vec<String> = info
                .states
                .iter()
                .map(|s| format!("`{}`", s.name))
                .collect();
            diags.push(Diagnostic::new(
                field.clone(),
                format!(
                    "`{}` ({}) declares keyed state ({}); on_error = \"{}\" re-runs a failed \
                     batch record by record and the host cannot take back the state writes \
                     of the failed call, so it is only allowed on operators without keyed \
                     state: put a stateless operator that validates records before `{}`, or \
                     use on_error = \"fail\"",
                    n.name,
                    n.plugin,
                    states.join(", "),
                    n.on_error,
                    n.name
                ),
            ));
        }
        if n.on_error != ErrorPolicy::DeadLetter {
            continue;
        }
        if info.side_outputs.iter().any(|t| t == DEAD_LETTER_OUTPUT) {
            diags.push(Diagnostic::new(
                field.clone(),
                format!(
                    "`{}` ({}) declares a side output named `{DEAD_LETTER_OUTPUT}` itself, \
                     which on_error = \"dead-letter\" would share; use on_error = \"skip\" \
                     or \"fail\"",
                    n.name, n.plugin
                ),
            ));
        }
        let read = model.nodes.iter().any(|d| {
            d.inputs
                .iter()
                .any(|inp| inp.from == n.name && inp.output.as_deref() == Some(DEAD_LETTER_OUTPUT))
        });
        if !read {
            diags.push(Diagnostic::new(
                field,
                format!(
                    "on_error = \"dead-letter\" sends failed records to the side output \
                     `{DEAD_LETTER_OUTPUT}` of `{}`, but nothing reads it; add a sink with \
                     inputs = [{{ from = \"{}\", output = \"{DEAD_LETTER_OUTPUT}\" }}]",
                    n.name, n.name
                ),
            ));
        }
    }
}

fn placeholder_info(n: &NodeSpec) -> PluginInfo {
    PluginInfo {
        name: String::new(),
        version: String::new(),
        kind: n.kind,
        description: String::new(),
        states: Vec::new(),
        source_capability: None,
        sink_capability: None,
        config_schema: String::new(),
        side_outputs: Vec::new(),
        model: None,
        operator_states: Vec::new(),
    }
}

fn article(kind: PluginKind) -> &'static str {
    match kind {
        PluginKind::Operator => "an",
        PluginKind::Source | PluginKind::Sink => "a",
    }
}

/// The node's `config` checked against the plugin's declared `config_schema` (the subset
/// of JSON Schema in [`crate::schema`]); fields are `operator[1].config.window.size_ms`.
fn check_config(node: &NodeSpec, info: &PluginInfo, prefix: &str, diags: &mut Vec<Diagnostic>) {
    if info.config_schema.trim().is_empty() {
        return;
    }
    let schema: serde_json::Value = match serde_json::from_str(&info.config_schema) {
        Ok(s) => s,
        Err(e) => {
            diags.push(Diagnostic::new(
                format!("{prefix}.plugin"),
                format!(
                    "`{}` declares a config_schema that is not JSON ({e}); fix the plugin's \
                     describe()",
                    node.plugin
                ),
            ));
            return;
        }
    };
    for v in crate::schema::check_config(&schema, &node.config) {
        let field = if v.path.is_empty() {
            format!("{prefix}.config")
        } else {
            format!("{prefix}.config.{}", v.path)
        };
        diags.push(Diagnostic::new(
            field,
            format!(
                "{} (the config schema of `{}`; `nopstream plugins` lists the plugins)",
                v.message, node.plugin
            ),
        ));
    }
}

/// The schema keyword by which a plugin marks the top-level config properties that decide
/// the keys of the records it emits: see [`key_spec`].
pub const KEY_SPEC_KEYWORD: &str = "x-key-spec";

/// The part of a node's `config` that decides the keys its plugin emits, as canonical JSON
/// (an object of the marked properties, keys sorted, each the config's value, else the
/// schema's `default`, else `null`), when the plugin's `config_schema` marks at least one
/// top-level property with `"x-key-spec": true`:
///
/// ```json
/// {"properties": {"key": {"type": "string", "default": "carrier", "x-key-spec": true},
///     "fields": {"type": "array"}}}
/// ```
///
/// A keyed operator's state depends on its upstream's key spec, not on the rest of that
/// upstream's config (design §12.2: operator parameters may change), so the savepoint
/// check compares this when both sides have it. `None` (nothing marked, or a schema that
/// is not JSON): the whole config decides the keys.
pub fn key_spec(info: &PluginInfo, config: &serde_json::Value) -> Option<String> {
    marked_properties(info, config, KEY_SPEC_KEYWORD)
}

/// The schema keyword by which a stateful plugin marks the top-level config properties
/// that shape the values of its state: see [`state_layout`].
pub const STATE_LAYOUT_KEYWORD: &str = "x-state-layout";

/// The part of a node's `config` that shapes the values its plugin keeps in state, as
/// canonical JSON (as [`key_spec`]: an object of the marked properties, keys sorted, each
/// the config's value, else the schema's `default`, else `null`), when the plugin's
/// `config_schema` marks at least one top-level property with `"x-state-layout": true`,
/// or with a list of the members of an object property that count (window-aggregate:
/// `"window": {…, "x-state-layout": ["kind", "size_ms", "slide_ms", "offset_ms", "time"]}`,
/// so a new `allowed_lateness_ms` is not a new layout). keyed-aggregate marks
/// `aggregates`: one accumulator slot per configured aggregate, so state written under
/// one list cannot be read under another.
///
/// The savepoint check compares it (`STATE_LAYOUT_CHANGED`, cleared only by dropping the
/// operator's state) when both sides record one. `None`: nothing is marked (or the schema
/// is not JSON), and a config change is not seen as a change of state.
pub fn state_layout(info: &PluginInfo, config: &serde_json::Value) -> Option<String> {
    marked_properties(info, config, STATE_LAYOUT_KEYWORD)
}

/// The top-level properties of `config` whose schema entry has `keyword: true` (the whole
/// value) or `keyword: ["member", …]` (only those members of an object value, each the
/// config's, else the member schema's `default`, else `null`), as canonical JSON; `None`
/// when none is marked.
fn marked_properties(
    info: &PluginInfo,
    config: &serde_json::Value,
    keyword: &str,
) -> Option<String> {
    use serde_json::Value;
    let schema: Value = serde_json::from_str(&info.config_schema).ok()?;
    let props = schema.get("properties")?.as_object()?;
    let value_of = |v: Option<&Value>, p: &Value| {
        v.or_else(|| p.get("default"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let spec: BTreeMap<&str, Value> = props
        .iter()
        .filter_map(|(k, p)| {
            let v = value_of(config.get(k), p);
            match p.get(keyword)? {
                Value::Bool(true) => Some((k.as_str(), canonical(v))),
                Value::Array(members) => {
                    let member_schemas = p.get("properties");
                    let picked: serde_json::Map<String, Value> = members
                        .iter()
                        .filter_map(Value::as_str)
                        .map(|m| {
                            let ms = member_schemas
                                .and_then(|s| s.get(m))
                                .unwrap_or(&Value::Null);
                            (m.to_owned(), canonical(value_of(v.get(m), ms)))
                        })
                        .collect();
                    Some((k.as_str(), Value::Object(picked)))
                }
                _ => None,
            }
        })
        .collect();
    if spec.is_empty() {
        return None;
    }
    Some(serde_json::to_string(&spec).expect("JSON values serialize"))
}

/// The schema keyword by which a sink lets a config value set its capability: see
/// [`configured_sink_capability`].
pub const SINK_CAPABILITY_KEYWORD: &str = "x-sink-capability";

/// The sink capability a node's `config` selects, and the `key = "value"` that selected
/// it, when the plugin's `config_schema` maps that value to one.
///
/// A sink whose guarantee depends on its config (postgres-sink with `transactions =
/// "none"` is idempotent, not two-phase-commit) annotates a top-level string property of
/// its schema with [`SINK_CAPABILITY_KEYWORD`], an object from values to capability names
/// (kebab-case, as in WIT `sink-capability`):
///
/// ```json
/// {"properties": {"transactions": {"enum": ["two-phase", "none"], "default": "two-phase",
///     "x-sink-capability": {"none": "idempotent"}}}}
/// ```
///
/// A config whose property holds a mapped value gets that capability in the plan (and so
/// in the semantic-mode check, the snapshot's sink protocol and the fingerprint); any
/// other value, or the property absent, keeps the capability of `describe()`. A schema
/// that is not JSON, or a mapping to an unknown capability name, is ignored here.
pub fn configured_sink_capability(
    info: &PluginInfo,
    config: &serde_json::Value,
) -> Option<(SinkCapability, String)> {
    if info.kind != PluginKind::Sink || info.config_schema.trim().is_empty() {
        return None;
    }
    let schema: serde_json::Value = serde_json::from_str(&info.config_schema).ok()?;
    let props = schema.get("properties")?.as_object()?;
    for (key, prop) in props {
        let Some(map) = prop
            .get(SINK_CAPABILITY_KEYWORD)
            .and_then(|m| m.as_object())
        else {
            continue;
        };
        let Some(value) = config.get(key).and_then(|v| v.as_str()) else {
            continue;
        };
        let Some(name) = map.get(value).and_then(|n| n.as_str()) else {
            continue;
        };
        let cap: SinkCapability =
            serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()?;
        return Some((cap, format!("{key} = {value:?}")));
    }
    None
}

fn check_plugin(node: &NodeSpec, info: &PluginInfo, field: &str, diags: &mut Vec<Diagnostic>) {
    let r = &node.plugin;
    if info.kind != node.kind {
        let described = info.reference();
        let named = if described == r.to_string() {
            format!("`{r}`")
        } else {
            format!("`{r}` (`{described}`)")
        };
        diags.push(Diagnostic::new(
            field,
            format!(
                "{named} is {} {} component, but `{}` is declared in a [[{}]] table; \
                 use {} {} plugin here or move the node to [[{}]]",
                article(info.kind),
                info.kind,
                node.name,
                node.kind,
                article(node.kind),
                node.kind,
                info.kind,
            ),
        ));
    }
    if let PluginRef::Named { name, version } = r
        && (&info.name != name || &info.version != version)
    {
        diags.push(Diagnostic::new(
            field,
            format!(
                "`{r}` resolved to a component that describes itself as `{}`",
                info.reference()
            ),
        ));
    }
    let mut names = HashSet::new();
    for (k, s) in info.states.iter().enumerate() {
        if s.name.trim().is_empty() {
            diags.push(Diagnostic::new(
                field,
                format!("`{r}` declares state #{k} with an empty name (design §13)"),
            ));
        } else if s.name.starts_with("__") {
            diags.push(Diagnostic::new(
                field,
                format!(
                    "`{r}` declares state `{}`; names starting with `__` are reserved for the \
                     host (timers live in `__timers`)",
                    s.name
                ),
            ));
        } else if !names.insert(s.name.as_str()) {
            diags.push(Diagnostic::new(
                field,
                format!("`{r}` declares state `{}` more than once", s.name),
            ));
        }
        if s.codec.trim().is_empty() {
            diags.push(Diagnostic::new(
                field,
                format!("`{r}` declares state `{}` without a codec", s.name),
            ));
        }
    }
    match node.kind {
        PluginKind::Source
            if info.kind == PluginKind::Source && info.source_capability.is_none() =>
        {
            diags.push(Diagnostic::new(
                field,
                format!("source plugin `{r}` declares no source capability"),
            ));
        }
        PluginKind::Sink if info.kind == PluginKind::Sink && info.sink_capability.is_none() => {
            diags.push(Diagnostic::new(
                field,
                format!("sink plugin `{r}` declares no sink capability"),
            ));
        }
        _ => {}
    }
}

/// Strength order of semantic modes: best-effort 0 .. strict-exactly-once 3.
fn mode_rank(m: SemanticMode) -> u8 {
    match m {
        SemanticMode::BestEffort => 0,
        SemanticMode::AtLeastOnce => 1,
        SemanticMode::EffectivelyOnce => 2,
        SemanticMode::StrictExactlyOnce => 3,
    }
}

fn mode_of_rank(r: u8) -> SemanticMode {
    match r {
        0 => SemanticMode::BestEffort,
        1 => SemanticMode::AtLeastOnce,
        2 => SemanticMode::EffectivelyOnce,
        _ => SemanticMode::StrictExactlyOnce,
    }
}

/// Strongest mode a source capability allows (design §6.1, §13).
pub fn strongest_mode_for_source(c: SourceCapability) -> SemanticMode {
    if c.supports_exactly_once() {
        SemanticMode::StrictExactlyOnce
    } else if c == SourceCapability::AtLeastOnce {
        SemanticMode::AtLeastOnce
    } else {
        SemanticMode::BestEffort
    }
}

/// Strongest mode a sink capability allows (design §7.1, §13).
pub fn strongest_mode_for_sink(c: SinkCapability) -> SemanticMode {
    if c.is_strict() {
        SemanticMode::StrictExactlyOnce
    } else if c.is_effectively_once() {
        SemanticMode::EffectivelyOnce
    } else if c == SinkCapability::AtLeastOnce {
        SemanticMode::AtLeastOnce
    } else {
        SemanticMode::BestEffort
    }
}

fn source_cap_name(c: SourceCapability) -> &'static str {
    match c {
        SourceCapability::Replayable => "replayable",
        SourceCapability::TransactionalRead => "transactional-read",
        SourceCapability::AtLeastOnce => "at-least-once",
        SourceCapability::BestEffort => "best-effort",
    }
}

fn sink_cap_name(c: SinkCapability) -> &'static str {
    match c {
        SinkCapability::TwoPhaseCommit => "two-phase-commit",
        SinkCapability::StagedAtomicCommit => "staged-atomic-commit",
        SinkCapability::OutboxEpochLog => "outbox-epoch-log",
        SinkCapability::Idempotent => "idempotent",
        SinkCapability::UpsertByKey => "upsert-by-key",
        SinkCapability::AtLeastOnce => "at-least-once",
        SinkCapability::BestEffort => "best-effort",
    }
}

fn requirement(kind: PluginKind, mode: SemanticMode) -> &'static str {
    match (kind, mode) {
        (PluginKind::Source, SemanticMode::AtLeastOnce) => {
            "a source that can recover its position (at-least-once, replayable or transactional-read)"
        }
        (PluginKind::Source, _) => "a replayable or transactional-read source",
        (_, SemanticMode::StrictExactlyOnce) => {
            "a strictly committing sink (two-phase-commit, staged-atomic-commit or outbox-epoch-log)"
        }
        (_, SemanticMode::EffectivelyOnce) => {
            "a sink that cannot duplicate visible output (idempotent, upsert-by-key or strict)"
        }
        _ => "a sink that does not drop output (at-least-once or better)",
    }
}

fn check_semantic(
    model: &StreamModel,
    infos: &[Option<PluginInfo>],
    prefixes: &[String],
    diags: &mut Vec<Diagnostic>,
) {
    let mode = model.job.semantic;
    // (node index, capability name, strongest mode)
    let mut caps: Vec<(usize, &'static str, SemanticMode)> = Vec::new();
    for (i, info) in infos.iter().enumerate() {
        let Some(info) = info else { continue };
        match model.nodes[i].kind {
            PluginKind::Source => {
                if let Some(c) = info.source_capability {
                    caps.push((i, source_cap_name(c), strongest_mode_for_source(c)));
                }
            }
            PluginKind::Sink => {
                if let Some(c) = info.sink_capability {
                    caps.push((i, sink_cap_name(c), strongest_mode_for_sink(c)));
                }
            }
            PluginKind::Operator => {}
        }
    }
    let job_max = mode_of_rank(
        caps.iter()
            .map(|c| mode_rank(c.2))
            .min()
            .unwrap_or(mode_rank(mode)),
    );
    for (i, cap, strongest) in caps {
        if mode_rank(strongest) >= mode_rank(mode) {
            continue;
        }
        let node = &model.nodes[i];
        let info = infos[i]
            .as_ref()
            .map(PluginInfo::reference)
            .unwrap_or_default();
        // A capability set by the node's config says which setting chose it.
        let cap = match infos[i]
            .as_ref()
            .and_then(|inf| configured_sink_capability(inf, &node.config))
        {
            Some((_, setting)) => format!("{cap} (config `{setting}`)"),
            None => cap.to_owned(),
        };
        diags.push(Diagnostic::new(
            format!("{}.plugin", prefixes[i]),
            format!(
                "{kind} `{name}` uses `{info}` with {kind} capability {cap}, which cannot \
                 take part in {mode} (it needs {req}); the strongest mode this job supports \
                 is {job_max}: declare `semantic = \"{job_max}\"` in [job] to accept it \
                 explicitly, or use a stronger {kind}",
                kind = node.kind,
                name = node.name,
                req = requirement(node.kind, mode),
            ),
        ));
    }
}

/// Fuses operators into chains and orders the vertices topologically.
///
/// Operator `b` is chained into its upstream `a` when the edge `a -> b` is FORWARD,
/// `b` does not set `start_new_chain`, both have the same parallelism, `b` has exactly
/// one input and `a` exactly one consumer. `start_new_chain` (Flink's
/// `startNewChain()`) trades one channel hop per batch for a thread of its own: worth it
/// when the chain is the bottleneck and a core is idle (e.g. a source reading and
/// splitting input while a parser runs on the other core). A vertex's id is its head operator's id; it is `keyed` when the head has a
/// HASH input. Vertices are in topological order (ties broken by job-file order of the
/// heads); edges are ordered by their downstream vertex, then input index. Edge ids are
/// `{from}->{to}#{input_index}`.
///
/// The graph is assumed to come from [`stream_graph`] (acyclic, every edge endpoint
/// present); operators on a cycle would be dropped.
pub fn job_graph(g: &StreamGraph) -> JobGraph {
    let n = g.nodes.len();
    let index: HashMap<&OperatorId, usize> = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, o)| (&o.operator_id, i))
        .collect();
    let mut ins: Vec<Vec<usize>> = vec![Vec::new(); n]; // edge indices into g.edges
    let mut outs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (k, e) in g.edges.iter().enumerate() {
        if let (Some(&f), Some(&t)) = (index.get(&e.from), index.get(&e.to)) {
            outs[f].push(k);
            ins[t].push(k);
        }
    }
    let chains_into_upstream = |b: usize| -> Option<usize> {
        let [k] = ins[b].as_slice() else { return None };
        let e = &g.edges[*k];
        let a = index[&e.from];
        (e.partition == PartitionPolicy::Forward
            && e.output.is_none()
            && !g.nodes[b].start_new_chain
            && g.nodes[a].parallelism == g.nodes[b].parallelism
            && outs[a].len() == 1)
            .then_some(a)
    };

    // Chains, keyed by head.
    let mut vertex_of = vec![usize::MAX; n];
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for head in 0..n {
        if chains_into_upstream(head).is_some() {
            continue;
        }
        let mut chain = vec![head];
        let mut cur = head;
        while let [k] = outs[cur].as_slice() {
            let next = index[&g.edges[*k].to];
            if chains_into_upstream(next) == Some(cur) {
                chain.push(next);
                cur = next;
            } else {
                break;
            }
        }
        for &op in &chain {
            vertex_of[op] = chains.len();
        }
        chains.push(chain);
    }

    // Topological order of chains (Kahn), ties by head position in job-file order.
    let c = chains.len();
    let mut indeg = vec![0usize; c];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); c];
    for e in &g.edges {
        let (Some(&f), Some(&t)) = (index.get(&e.from), index.get(&e.to)) else {
            continue;
        };
        let (vf, vt) = (vertex_of[f], vertex_of[t]);
        if vf != vt && vf != usize::MAX && vt != usize::MAX {
            succ[vf].push(vt);
            indeg[vt] += 1;
        }
    }
    let mut ready: BTreeSet<(usize, usize)> = (0..c)
        .filter(|&v| indeg[v] == 0)
        .map(|v| (chains[v][0], v))
        .collect();
    let mut order = Vec::with_capacity(c);
    while let Some((_, v)) = ready.pop_first() {
        order.push(v);
        for &w in &succ[v] {
            indeg[w] -= 1;
            if indeg[w] == 0 {
                ready.insert((chains[w][0], w));
            }
        }
    }
    let mut position = vec![usize::MAX; c];
    for (pos, &v) in order.iter().enumerate() {
        position[v] = pos;
    }

    let vertex_id = |v: usize| VertexId::new(g.nodes[chains[v][0]].operator_id.as_str());
    let vertices = order
        .iter()
        .map(|&v| {
            let head = chains[v][0];
            JobVertex {
                id: vertex_id(v),
                operators: chains[v].iter().map(|&op| g.nodes[op].clone()).collect(),
                parallelism: g.nodes[head].parallelism,
                keyed: ins[head]
                    .iter()
                    .any(|&k| g.edges[k].partition == PartitionPolicy::Hash),
            }
        })
        .collect();

    let mut edges: Vec<(usize, JobEdge)> = Vec::new();
    for e in &g.edges {
        let (Some(&f), Some(&t)) = (index.get(&e.from), index.get(&e.to)) else {
            continue;
        };
        let (vf, vt) = (vertex_of[f], vertex_of[t]);
        if vf == vt || position[vf] == usize::MAX || position[vt] == usize::MAX {
            continue;
        }
        let (from, to) = (vertex_id(vf), vertex_id(vt));
        edges.push((
            position[vt],
            JobEdge {
                id: edge_id(&from, &to, e.input_index),
                from,
                to,
                input_index: e.input_index,
                partition: e.partition,
                output: e.output.clone(),
            },
        ));
    }
    edges.sort_by_key(|(pos, e)| (*pos, e.input_index));

    JobGraph {
        job: g.job.clone(),
        vertices,
        edges: edges.into_iter().map(|(_, e)| e).collect(),
    }
}

/// `{from}->{to}#{input_index}`.
pub fn edge_id(from: &VertexId, to: &VertexId, input_index: u32) -> EdgeId {
    EdgeId::new(format!("{from}->{to}#{input_index}"))
}

/// The `(upstream, downstream)` subtask pairs connected by an edge with `policy` between
/// parallelism `up` and `down`, sorted.
///
/// - FORWARD: `i -> i` (the planner guarantees `up == down`; otherwise as UNION).
/// - HASH, REBALANCE, BROADCAST: all to all (`up * down` channels); HASH routes by shard
///   owner, REBALANCE round-robins, BROADCAST copies to all.
/// - SINGLETON: every upstream subtask to downstream subtask 0.
/// - UNION (pointwise): `i -> i mod down` when `up >= down`; when `up < down`, upstream
///   `i` also feeds every downstream `d` with `d mod up == i` (and round-robins over its
///   channels), so every subtask on both sides has at least one channel.
pub fn channel_pairs(policy: PartitionPolicy, up: u32, down: u32) -> Vec<(u32, u32)> {
    let mut pairs: Vec<(u32, u32)> = match policy {
        PartitionPolicy::Forward if up == down => (0..up).map(|i| (i, i)).collect(),
        PartitionPolicy::Hash | PartitionPolicy::Rebalance | PartitionPolicy::Broadcast => (0..up)
            .flat_map(|u| (0..down).map(move |d| (u, d)))
            .collect(),
        PartitionPolicy::Singleton => (0..up).map(|u| (u, 0)).collect(),
        PartitionPolicy::Forward | PartitionPolicy::Union => {
            if up == 0 || down == 0 {
                Vec::new()
            } else {
                let mut set: BTreeSet<(u32, u32)> = (0..up).map(|u| (u, u % down)).collect();
                set.extend((0..down).map(|d| (d % up, d)));
                set.into_iter().collect()
            }
        }
    };
    pairs.sort_unstable();
    pairs
}

/// Expands every vertex into subtasks and every edge into channels (design §2.2, §3.3,
/// §3.4, §4.2).
///
/// - Subtask `i` of vertex `v` has task id `job/pipeline/v/i`; keyed vertices own the
///   shards [`shards_of`]`(i, state_shard_count, parallelism)`.
/// - Channels follow [`channel_pairs`], with channel index 0. HASH edges carry
///   `shard_owners[s] =` [`owner_of`]`(s)` for every shard.
/// - A subtask's inputs are ordered by input index, then upstream subtask; its outputs
///   by edge (plan order), then downstream subtask.
/// - The ACK set is every task, in vertex then subtask order.
/// - The hash policy is [`HashPolicy::default`]; the fingerprint is [`fingerprint_of`].
pub fn partitioned_plan(g: &JobGraph) -> PartitionedPlan {
    let par: HashMap<&VertexId, u32> = g.vertices.iter().map(|v| (&v.id, v.parallelism)).collect();
    let count = g.job.state_shard_count;
    let task = |v: &VertexId, i: u32| TaskId {
        job: g.job.job_id.clone(),
        pipeline: g.job.pipeline_id.clone(),
        vertex: v.clone(),
        subtask: SubtaskIndex(i),
    };

    let edges: Vec<PartitionedEdge> = g
        .edges
        .iter()
        .map(|e| {
            let up = par.get(&e.from).copied().unwrap_or(0);
            let down = par.get(&e.to).copied().unwrap_or(0);
            let channels = channel_pairs(e.partition, up, down)
                .into_iter()
                .map(|(u, d)| ChannelId {
                    edge: e.id.clone(),
                    upstream: SubtaskIndex(u),
                    downstream: SubtaskIndex(d),
                    index: 0,
                })
                .collect();
            let shard_owners = if e.partition == PartitionPolicy::Hash && down > 0 {
                (0..count)
                    .map(|s| owner_of(StateShardId(s), count, down))
                    .collect()
            } else {
                Vec::new()
            };
            PartitionedEdge {
                id: e.id.clone(),
                from: e.from.clone(),
                to: e.to.clone(),
                input_index: e.input_index,
                partition: e.partition,
                output: e.output.clone(),
                channels,
                shard_owners,
            }
        })
        .collect();

    let vertices: Vec<PartitionedVertex> = g
        .vertices
        .iter()
        .map(|v| {
            let subtasks = (0..v.parallelism)
                .map(|i| {
                    let shards = if v.keyed && count > 0 {
                        shards_of(SubtaskIndex(i), count, v.parallelism)
                            .map(StateShardId)
                            .collect()
                    } else {
                        Vec::new()
                    };
                    let mut inputs: Vec<(u32, u32, ChannelId)> = edges
                        .iter()
                        .filter(|e| e.to == v.id)
                        .flat_map(|e| {
                            e.channels
                                .iter()
                                .filter(|c| c.downstream.0 == i)
                                .map(|c| (e.input_index, c.upstream.0, c.clone()))
                        })
                        .collect();
                    inputs.sort();
                    let outputs = edges
                        .iter()
                        .filter(|e| e.from == v.id)
                        .flat_map(|e| e.channels.iter().filter(|c| c.upstream.0 == i).cloned())
                        .collect();
                    PlannedSubtask {
                        index: SubtaskIndex(i),
                        task: task(&v.id, i),
                        shards,
                        inputs: inputs.into_iter().map(|(_, _, c)| c).collect(),
                        outputs,
                    }
                })
                .collect();
            PartitionedVertex {
                id: v.id.clone(),
                operators: v.operators.clone(),
                parallelism: v.parallelism,
                keyed: v.keyed,
                subtasks,
            }
        })
        .collect();

    let ack_set = vertices
        .iter()
        .flat_map(|v| v.subtasks.iter().map(|s| s.task.clone()))
        .collect();
    let mut plan = PartitionedPlan {
        job: g.job.clone(),
        hash_policy: HashPolicy::default(),
        vertices,
        edges,
        ack_set,
        fingerprint: String::new(),
    };
    plan.fingerprint = fingerprint_of(&plan);
    plan
}

/// The fingerprint scheme [`fingerprint_of`] computes. Scheme 1
/// ([`declaration_order_fingerprint_of`]) hashed arrays in declaration order; manifests
/// recorded before scheme 2 still match their plan through
/// [`PartitionedPlan::fingerprint_matches`].
pub const FINGERPRINT_SCHEME: u32 = 2;

/// sha256 (lower-case hex) of the plan's canonical form (design §4: fingerprints hash
/// canonical forms, sorted by id, never declaration order).
///
/// The canonical form is the plan with `fingerprint` set to `""`, every set-like array
/// sorted — vertices and edges by id, the ACK set, each subtask's output channels, and
/// per operator its plugin's keyed states, operator states and side outputs by name —
/// serialised by `serde_json` with every object's keys sorted. Arrays whose order is
/// meaning stay as they are: the operators of a chain, a subtask's inputs (by input
/// index), shard ownership. So reordering independent declarations of a job file, or the
/// state list of a plugin, changes nothing; the fingerprint covers everything else: job
/// settings, operator ids, plugin references and their `describe()` metadata (so a plugin
/// version change shows), config, grants, parallelism, policies, shard ownership and
/// channels.
pub fn fingerprint_of(plan: &PartitionedPlan) -> String {
    let mut plan = plan.clone();
    plan.vertices.sort_by(|a, b| a.id.cmp(&b.id));
    plan.edges.sort_by(|a, b| a.id.cmp(&b.id));
    plan.ack_set.sort();
    for v in &mut plan.vertices {
        for st in &mut v.subtasks {
            st.outputs.sort();
        }
        for op in &mut v.operators {
            let info = &mut op.plugin_info;
            info.states.sort_by(|a, b| a.name.cmp(&b.name));
            info.operator_states.sort_by(|a, b| a.name.cmp(&b.name));
            info.side_outputs.sort();
        }
    }
    declaration_order_fingerprint_of(&plan)
}

/// Fingerprint scheme 1: sha256 (lower-case hex) of the plan's JSON as it stands (arrays
/// in declaration order) with `fingerprint` set to `""` and every object's keys sorted.
/// Kept to read manifests recorded under it ([`PartitionedPlan::fingerprint_matches`]).
pub fn declaration_order_fingerprint_of(plan: &PartitionedPlan) -> String {
    use sha2::{Digest, Sha256};
    let mut value = serde_json::to_value(plan).expect("plans serialize to JSON");
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "fingerprint".into(),
            serde_json::Value::String(String::new()),
        );
    }
    let bytes = serde_json::to_vec(&canonical(value)).expect("JSON values serialize");
    hex::encode(Sha256::digest(&bytes))
}

impl PartitionedPlan {
    /// Whether a fingerprint recorded in a manifest is this plan's: its current one
    /// ([`fingerprint_of`]), or the one scheme 1 ([`declaration_order_fingerprint_of`])
    /// gives it, so checkpoints taken before fingerprints were canonical still restore.
    pub fn fingerprint_matches(&self, recorded: &str) -> bool {
        recorded == self.fingerprint || recorded == declaration_order_fingerprint_of(self)
    }
}

/// Rebuilds `v` with object keys inserted in sorted order.
fn canonical(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, canonical(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// A plan layer, as printed by `nopstream plan --layer <layer>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// [`StreamModel`].
    Model,
    /// [`StreamGraph`].
    Stream,
    /// [`JobGraph`].
    Job,
    /// [`PartitionedPlan`].
    Partitioned,
    /// [`crate::DeploymentPlan`].
    Deployment,
}

impl Layer {
    /// Every layer, in compilation order.
    pub const ALL: [Layer; 5] = [
        Layer::Model,
        Layer::Stream,
        Layer::Job,
        Layer::Partitioned,
        Layer::Deployment,
    ];

    /// The layer's name: `model`, `stream`, `job`, `partitioned` or `deployment`.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Model => "model",
            Layer::Stream => "stream",
            Layer::Job => "job",
            Layer::Partitioned => "partitioned",
            Layer::Deployment => "deployment",
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A layer name that is not one of [`Layer::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown plan layer `{0}`; expected one of: model, stream, job, partitioned, deployment")]
pub struct UnknownLayer(pub String);

impl FromStr for Layer {
    type Err = UnknownLayer;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Layer::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| UnknownLayer(s.to_owned()))
    }
}
