//! Semantic rules of a model: the job's limits, each node's names, ids, plugin, grants,
//! connections and inputs, the references between nodes, cycles, and keyed parallelism
//! against the shard count. They run on a parsed file (with spans) and on a model built
//! any other way ([`super::validate_model`]).

use super::connection::check_connection;
use super::reader::{ModelSpans, NodeSpans};
use super::{
    MAX_BATCH_RECORDS, MAX_PARALLELISM, MAX_STATE_SHARDS, MIN_STATE_MEMORY_BYTES, Span,
    check_plugin_ref, is_ident, model_path,
};
use crate::model::{NodeSpec, StreamModel};
use nop_stream_api::{PartitionPolicy, PluginKind};
use std::collections::{HashMap, HashSet};

pub(super) type Found = (String, Option<Span>, String);

/// All semantic problems of `model`: (field, span if known, message).
///
/// The rule families run in this order, and diagnostics without a position keep it:
/// connections (on a model not parsed from a file), the job, each node in model order,
/// references between nodes, cycles, keyed parallelism against the shard count.
pub(super) fn check_model(model: &StreamModel, spans: Option<&ModelSpans>) -> Vec<Found> {
    let mut c = Checker {
        model,
        spans,
        prefixes: (0..model.nodes.len())
            .map(|i| model.node_field(i))
            .collect(),
        out: Vec::new(),
    };
    // A parsed file already reported its connections while reading them.
    if spans.is_none() {
        c.check_connections();
    }
    c.check_job();
    c.check_nodes();
    c.check_ends();
    let adj = c.check_references();
    c.check_cycles(&adj);
    c.check_keyed_shards();
    c.out
}

/// Upstream links of each node, by model index: (upstream node, input index).
type Upstreams = Vec<Vec<(usize, usize)>>;

/// The model under check, its spans when it was parsed from a file, and what was found.
struct Checker<'m> {
    model: &'m StreamModel,
    spans: Option<&'m ModelSpans>,
    /// Field path of each node (`operator[1]`), by model index.
    prefixes: Vec<String>,
    out: Vec<Found>,
}

impl<'m> Checker<'m> {
    /// Records a problem, unless `field` or a table or array containing it already has a
    /// shape diagnostic.
    fn push(&mut self, field: String, span: Option<Span>, msg: String) {
        let reported = self.spans.is_some_and(|s| {
            s.reported
                .iter()
                .any(|r| crate::diag::field_within(&field, r))
        });
        if !reported {
            self.out.push((field, span, msg));
        }
    }

    /// A job reads from at least one source and writes into at least one sink: without
    /// either it has no records, or nothing to commit them to (a job file cut short, say).
    fn check_ends(&mut self) {
        for (kind, table) in [(PluginKind::Source, "source"), (PluginKind::Sink, "sink")] {
            if !self.model.nodes.iter().any(|n| n.kind == kind) {
                self.push(
                    table.to_owned(),
                    None,
                    format!("the job declares no [[{table}]]; a job needs at least one"),
                );
            }
        }
    }

    /// Span of `job.<key>`, else of the `[job]` table (none without a file).
    fn job_span(&self, key: &str) -> Option<Span> {
        self.spans
            .and_then(|s| s.job.get(key).cloned().or_else(|| s.job_table.clone()))
    }

    /// Spans of node `i`'s fields (all none without a file).
    fn node_spans(&self, i: usize) -> NodeSpans {
        self.spans
            .and_then(|s| s.nodes.get(i))
            .cloned()
            .unwrap_or_default()
    }

    /// Checks every `[connections.<name>]` against [`check_connection`].
    fn check_connections(&mut self) {
        let model = self.model;
        for (name, spec) in &model.connections {
            for (key, message) in check_connection(name, spec) {
                let field = if key.is_empty() {
                    format!("connections.{name}")
                } else {
                    format!("connections.{name}.{key}")
                };
                self.push(field, None, message);
            }
        }
    }

    /// Checks the `[job]` table: ids, parallelism, shards, batch size, checkpoint
    /// intervals and the state memory budget.
    fn check_job(&mut self) {
        let model = self.model;
        let job = &model.job;
        if job.name.trim().is_empty() {
            self.push(
                "job.name".into(),
                self.job_span("name"),
                "must not be empty".into(),
            );
        }
        if !is_ident(&job.id) {
            let defaulted = self.spans.is_some_and(|s| !s.job.contains_key("id"));
            let hint = if defaulted {
                " (it defaults to job.name; set `id` explicitly)"
            } else {
                ""
            };
            if !(defaulted && job.name.trim().is_empty()) {
                self.push(
                    "job.id".into(),
                    self.job_span("id"),
                    format!(
                        "`{}` is not a valid id: use [A-Za-z0-9._-], starting with a letter or digit{hint}",
                        job.id
                    ),
                );
            }
        }
        if !is_ident(&job.pipeline) {
            self.push(
                "job.pipeline".into(),
                self.job_span("pipeline"),
                format!(
                    "`{}` is not a valid pipeline id: use [A-Za-z0-9._-], starting with a letter or digit",
                    job.pipeline
                ),
            );
        }
        if !(1..=MAX_PARALLELISM).contains(&job.parallelism) {
            self.push(
                "job.parallelism".into(),
                self.job_span("parallelism"),
                format!(
                    "must be in 1..={MAX_PARALLELISM}, found {}",
                    job.parallelism
                ),
            );
        }
        if !(1..=MAX_STATE_SHARDS).contains(&job.state_shards) {
            self.push(
                "job.state_shards".into(),
                self.job_span("state_shards"),
                format!(
                    "must be in 1..={MAX_STATE_SHARDS}, found {}",
                    job.state_shards
                ),
            );
        }
        if !(1..=MAX_BATCH_RECORDS).contains(&job.batch_records) {
            self.push(
                "job.batch_records".into(),
                self.job_span("batch_records"),
                format!(
                    "must be in 1..={MAX_BATCH_RECORDS}, found {}",
                    job.batch_records
                ),
            );
        }
        if job.checkpoint_interval_ms == Some(0) {
            self.push(
                "job.checkpoint_interval_ms".into(),
                self.job_span("checkpoint_interval_ms"),
                "must be >= 1 (omit it to disable periodic checkpoints)".into(),
            );
        }
        if let Some(bytes) = job.state_memory_bytes
            && bytes < MIN_STATE_MEMORY_BYTES
        {
            self.push(
                "job.state_memory_bytes".into(),
                self.job_span("state_memory_bytes"),
                format!(
                    "must be at least {MIN_STATE_MEMORY_BYTES} bytes (1 MiB), found {bytes} \
                 (omit it for the default budget)"
                ),
            );
        }
        if job.checkpoint_timeout_ms == Some(0) {
            self.push(
                "job.checkpoint_timeout_ms".into(),
                self.job_span("checkpoint_timeout_ms"),
                "must be >= 1 (omit it for the default, 60000)".into(),
            );
        }
        if job.checkpoint_every_records == Some(0) {
            self.push(
                "job.checkpoint_every_records".into(),
                self.job_span("checkpoint_every_records"),
                "must be >= 1 (omit it to disable record-count checkpoints)".into(),
            );
        }
    }

    /// Checks each node in model order: identity, plugin, parallelism, config, grants,
    /// connection grants and inputs.
    fn check_nodes(&mut self) {
        let model = self.model;
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        let mut by_id: HashMap<String, usize> = HashMap::new();
        for (i, n) in model.nodes.iter().enumerate() {
            let ns = self.node_spans(i);
            self.check_node_identity(i, n, &ns, &mut by_name, &mut by_id);
            self.check_node_settings(i, n, &ns);
            self.check_grants(i, n, &ns);
            self.check_connection_grants(i, n, &ns);
            self.check_has_inputs(i, n, &ns);
        }
    }

    /// Checks a node's name (valid, unique), model path, uid and operator id (unique);
    /// records the first node of each name and id.
    fn check_node_identity(
        &mut self,
        i: usize,
        n: &'m NodeSpec,
        ns: &NodeSpans,
        by_name: &mut HashMap<&'m str, usize>,
        by_id: &mut HashMap<String, usize>,
    ) {
        let model = self.model;
        let p = self.prefixes[i].clone();
        if n.name.is_empty() {
            self.push(
                format!("{p}.name"),
                ns.name.clone().or(ns.table.clone()),
                "must not be empty".into(),
            );
        } else if !is_ident(&n.name) {
            self.push(
                format!("{p}.name"),
                ns.name.clone(),
                format!(
                    "`{}` is not a valid node name: use [A-Za-z0-9._-], starting with a letter or digit",
                    n.name
                ),
            );
        } else if let Some(&first) = by_name.get(n.name.as_str()) {
            self.push(
                format!("{p}.name"),
                ns.name.clone(),
                format!(
                    "duplicate name `{}` (also {})",
                    n.name, self.prefixes[first]
                ),
            );
        } else {
            by_name.insert(&n.name, i);
        }
        let expected_path = model_path(n.kind, &n.name);
        if n.path != expected_path {
            self.push(
                format!("{p}.path"),
                None,
                format!("model path must be `{expected_path}`, found `{}`", n.path),
            );
        }
        if let Some(uid) = &n.uid
            && !is_ident(uid)
        {
            self.push(
                format!("{p}.uid"),
                ns.uid.clone(),
                format!(
                    "`{uid}` is not a valid uid: use [A-Za-z0-9._-], starting with a letter or digit"
                ),
            );
        }
        if !n.name.is_empty() {
            let id = crate::model::operator_id(n).0;
            if let Some(&first) = by_id.get(&id) {
                if by_name.get(n.name.as_str()) == Some(&i) {
                    self.push(
                        format!("{p}.uid"),
                        ns.uid.clone().or(ns.name.clone()),
                        format!(
                            "operator id `{id}` is also the id of {} (`{}`); operator ids must be unique (design §3.2)",
                            self.prefixes[first], model.nodes[first].name
                        ),
                    );
                }
            } else {
                by_id.insert(id, i);
            }
        }
    }

    /// Checks a node's plugin reference, parallelism and config.
    fn check_node_settings(&mut self, i: usize, n: &NodeSpec, ns: &NodeSpans) {
        let p = self.prefixes[i].clone();
        if let Err(e) = check_plugin_ref(&n.plugin) {
            self.push(format!("{p}.plugin"), ns.plugin.clone(), e);
        }
        if let Some(par) = n.parallelism
            && !(1..=MAX_PARALLELISM).contains(&par)
        {
            self.push(
                format!("{p}.parallelism"),
                ns.parallelism.clone(),
                format!("must be in 1..={MAX_PARALLELISM}, found {par}"),
            );
        }
        if !n.config.is_object() {
            self.push(
                format!("{p}.config"),
                None,
                "must be a table (JSON object)".into(),
            );
        }
    }

    /// Checks a node's grants: absolute, unique guest paths and non-empty host paths.
    fn check_grants(&mut self, i: usize, n: &NodeSpec, ns: &NodeSpans) {
        let p = self.prefixes[i].clone();
        let mut guests: HashMap<&str, usize> = HashMap::new();
        for (j, g) in n.grants.iter().enumerate() {
            let gspan = ns.grants.get(j).cloned().flatten();
            if !g.guest.starts_with('/') {
                self.push(
                    format!("{p}.grants[{j}].guest"),
                    gspan.clone(),
                    format!("guest path `{}` must be absolute (start with `/`)", g.guest),
                );
            } else if let Some(first) = guests.insert(&g.guest, j) {
                self.push(
                    format!("{p}.grants[{j}].guest"),
                    gspan.clone(),
                    format!(
                        "guest path `{}` is already granted by {p}.grants[{first}]",
                        g.guest
                    ),
                );
            }
            if g.host.is_empty() {
                self.push(
                    format!("{p}.grants[{j}].host"),
                    gspan,
                    "host directory must not be empty".into(),
                );
            }
        }
    }

    /// Checks a node's connection grants: sources and sinks only, each declared and
    /// granted once.
    fn check_connection_grants(&mut self, i: usize, n: &NodeSpec, ns: &NodeSpans) {
        let model = self.model;
        let p = self.prefixes[i].clone();
        let mut seen_connections: HashMap<&str, usize> = HashMap::new();
        for (j, c) in n.connections.iter().enumerate() {
            let cspan = ns.connections.get(j).cloned().flatten();
            let field = format!("{p}.connections[{j}]");
            if n.kind == PluginKind::Operator {
                self.push(
                    field,
                    cspan,
                    format!(
                        "only sources and sinks may be granted connections; `{}` is an {}",
                        n.name,
                        n.kind.world()
                    ),
                );
            } else if !model.connections.contains_key(c) {
                let declared: Vec<String> =
                    model.connections.keys().map(|k| format!("`{k}`")).collect();
                self.push(
                    field,
                    cspan,
                    format!(
                        "connection `{c}` is not declared; {}",
                        if declared.is_empty() {
                            format!("add a `[connections.{c}]` table")
                        } else {
                            format!("declared: {}", declared.join(", "))
                        }
                    ),
                );
            } else if let Some(first) = seen_connections.insert(c, j) {
                self.push(
                    field,
                    cspan,
                    format!("connection `{c}` is already granted by {p}.connections[{first}]"),
                );
            }
        }
    }

    /// Checks that a source has no inputs and that operators and sinks have some.
    fn check_has_inputs(&mut self, i: usize, n: &NodeSpec, ns: &NodeSpans) {
        let model = self.model;
        let p = self.prefixes[i].clone();
        match n.kind {
            PluginKind::Source => {
                if !n.inputs.is_empty() {
                    self.push(
                        format!("{p}.inputs"),
                        ns.inputs.clone(),
                        format!("source `{}` cannot have inputs", n.name),
                    );
                }
            }
            PluginKind::Operator | PluginKind::Sink => {
                if n.inputs.is_empty() {
                    self.push(
                        format!("{p}.inputs"),
                        ns.inputs.clone().or(ns.table.clone()),
                        {
                            let feeders: Vec<String> = model
                                .nodes
                                .iter()
                                .filter(|u| u.kind != PluginKind::Sink && u.name != n.name)
                                .map(|u| format!("`{}`", u.name))
                                .collect();
                            let what = if n.kind == PluginKind::Sink {
                                "would receive no record"
                            } else {
                                "would never run"
                            };
                            format!(
                                "{} `{}` has no input, so no one feeds it and it {what}; add \
                                 `inputs = [\"<node>\"]` naming {}",
                                n.kind,
                                n.name,
                                if feeders.is_empty() {
                                    "a source (the job declares none)".to_owned()
                                } else {
                                    format!("one of {}", feeders.join(", "))
                                }
                            )
                        },
                    );
                }
            }
        }
    }

    /// Checks that every input names another node that is not a sink; returns the
    /// upstream links of the inputs that do. With duplicate names (reported by
    /// [`Self::check_node_identity`]), a reference resolves to the first node.
    fn check_references(&mut self) -> Upstreams {
        let model = self.model;
        // With duplicate names (reported above), a reference resolves to the first node.
        // An unknown reference is only reported when every node has a name; otherwise it
        // may well name the node whose name failed to parse.
        let names_complete = model.nodes.iter().all(|n| !n.name.is_empty());
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, n) in model.nodes.iter().enumerate() {
            index.entry(n.name.as_str()).or_insert(i);
        }
        let mut adj: Vec<Vec<(usize, usize)>> = vec![Vec::new(); model.nodes.len()]; // (upstream, input)
        for (i, n) in model.nodes.iter().enumerate() {
            if n.kind == PluginKind::Source {
                continue;
            }
            let p = self.prefixes[i].clone();
            let ns = self.node_spans(i);
            for (j, input) in n.inputs.iter().enumerate() {
                let field = format!("{p}.inputs[{j}].from");
                let span = ns.input_items.get(j).and_then(|s| s.0.clone());
                if input.from.is_empty() {
                    self.push(field, span, "must name an upstream node".into());
                    continue;
                }
                match index.get(input.from.as_str()) {
                    None => {
                        if names_complete {
                            let mut known: Vec<&str> = model
                                .nodes
                                .iter()
                                .filter(|m| m.kind != PluginKind::Sink)
                                .map(|m| m.name.as_str())
                                .collect();
                            known.sort_unstable();
                            known.dedup();
                            self.push(
                                field,
                                span,
                                format!(
                                    "unknown node `{}`; known sources and operators: {}",
                                    input.from,
                                    known.join(", ")
                                ),
                            );
                        }
                    }
                    Some(&u) if u == i => {
                        self.push(field, span, format!("`{}` cannot consume itself", n.name));
                    }
                    Some(&u) if model.nodes[u].kind == PluginKind::Sink => {
                        self.push(
                            field,
                            span,
                            format!(
                                "`{}` is a sink ({}); sinks have no output to consume",
                                input.from, self.prefixes[u]
                            ),
                        );
                    }
                    Some(&u) => adj[i].push((u, j)),
                }
            }
        }
        adj
    }

    /// Reports each cycle once, in data-flow order from its first-declared node, at that
    /// node's input closing it.
    fn check_cycles(&mut self, adj: &Upstreams) {
        let model = self.model;
        let mut color = vec![0u8; model.nodes.len()]; // 0 new, 1 on stack, 2 done
        let mut stack: Vec<usize> = Vec::new();
        let mut cycles_seen: HashSet<Vec<usize>> = HashSet::new();
        let mut found = Vec::new();
        for v in 0..model.nodes.len() {
            if color[v] == 0 {
                dfs(v, adj, &mut color, &mut stack, &mut found);
            }
        }
        for (_, _, cycle) in found {
            let mut key = cycle.clone();
            key.sort_unstable();
            if !cycles_seen.insert(key) {
                continue;
            }
            // `cycle` runs downstream -> upstream; print it in data-flow order, starting at
            // the node declared first, and report it at that node's input closing the cycle.
            let mut flow: Vec<usize> = cycle.iter().rev().copied().collect();
            let start = (0..flow.len()).min_by_key(|&k| flow[k]).unwrap_or(0);
            flow.rotate_left(start);
            let first = flow[0];
            let last = flow[flow.len() - 1];
            let j = adj[first]
                .iter()
                .find(|&&(u, _)| u == last)
                .map_or(0, |&(_, j)| j);
            let mut names: Vec<&str> = flow.iter().map(|&k| model.nodes[k].name.as_str()).collect();
            names.push(names[0]);
            let span = self
                .node_spans(first)
                .input_items
                .get(j)
                .and_then(|s| s.0.clone());
            self.push(
                format!("{}.inputs[{j}].from", self.prefixes[first]),
                span,
                format!("cycle: {}", names.join(" -> ")),
            );
        }
    }

    /// Checks that every keyed node's parallelism fits within `job.state_shards`.
    fn check_keyed_shards(&mut self) {
        let model = self.model;
        let job = &model.job;
        if job.state_shards >= 1 {
            for (i, n) in model.nodes.iter().enumerate() {
                let keyed = n
                    .inputs
                    .iter()
                    .any(|x| x.partition == Some(PartitionPolicy::Hash));
                let par = n.parallelism.unwrap_or(job.parallelism);
                if keyed && par > job.state_shards {
                    self.push(
                        "job.state_shards".into(),
                        self.job_span("state_shards"),
                        format!(
                            "state_shards = {} is less than the parallelism {par} of keyed {} `{}` ({}); \
                             every subtask of a keyed node needs at least one shard",
                            job.state_shards, n.kind, n.name, self.prefixes[i]
                        ),
                    );
                }
            }
        }
    }
}

/// Depth-first search over upstream links from `v`; a back edge closes a cycle, pushed to
/// `found` as (node, input index, the nodes on the stack from the upstream end).
fn dfs(
    v: usize,
    adj: &[Vec<(usize, usize)>],
    color: &mut [u8],
    stack: &mut Vec<usize>,
    found: &mut Vec<(usize, usize, Vec<usize>)>,
) {
    color[v] = 1;
    stack.push(v);
    for &(u, j) in &adj[v] {
        if color[u] == 1 {
            let pos = stack.iter().position(|&x| x == u).unwrap_or(0);
            found.push((v, j, stack[pos..].to_vec()));
        } else if color[u] == 0 {
            dfs(u, adj, color, stack, found);
        }
    }
    stack.pop();
    color[v] = 2;
}

#[cfg(test)]
mod tests {
    use super::super::tests::{MINIMAL_JOB, errs};

    #[test]
    fn a_cycle_is_named_in_data_flow_order() {
        let text = format!(
            "{MINIMAL_JOB}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[operator]]\nname = \"a\"\nplugin = \"o@1\"\ninputs = [\"s\", \"c\"]\n\
             [[operator]]\nname = \"b\"\nplugin = \"o@1\"\ninputs = [\"a\"]\n\
             [[operator]]\nname = \"c\"\nplugin = \"o@1\"\ninputs = [\"b\"]\n"
        );
        let d = errs(&text);
        let cycles: Vec<_> = d
            .iter()
            .filter(|x| x.message.starts_with("cycle"))
            .collect();
        assert_eq!(cycles.len(), 1, "{d}");
        assert_eq!(cycles[0].message, "cycle: a -> b -> c -> a");
        assert_eq!(cycles[0].field, "operator[0].inputs[1].from");
        assert_eq!(cycles[0].line, Some(9));
    }
}
