//! Job-file reading: TOML tables to the model's specs, with a diagnostic for every
//! wrong type, missing or unknown key, and the span of every field the semantic rules
//! ([`super::rules`]) may report on.

use super::{
    DEFAULT_BATCH_RECORDS, DEFAULT_PARALLELISM, DEFAULT_PIPELINE, DEFAULT_STATE_SHARDS, Span,
    model_path, parse_partition, parse_plugin_ref, parse_semantic, parse_size,
};
use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{ErrorPolicy, Grant, InputSpec, JobSpec, NodeSpec, PluginRef, PrepareStep};
use nop_stream_api::{PluginKind, SemanticMode};
use std::collections::{HashMap, HashSet};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The file being read and the diagnostics found in it so far.
pub(super) struct Cx<'t> {
    pub(super) file: &'t str,
    pub(super) text: &'t str,
    pub(super) diags: Vec<Diagnostic>,
}

impl Cx<'_> {
    /// 1-based (line, column in chars) of byte `offset`.
    pub(super) fn position(&self, offset: usize) -> (u32, u32) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line as u32, col as u32)
    }

    pub(super) fn err(
        &mut self,
        span: Option<Span>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (line, column) = match span {
            Some(s) => {
                let (l, c) = self.position(s.start);
                (Some(l), Some(c))
            }
            None => (None, None),
        };
        self.diags.push(Diagnostic {
            file: self.file.to_owned(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn finish(mut self) -> Diagnostics {
        // Stable: diagnostics without a position keep their order after positioned ones.
        self.diags
            .sort_by_key(|d| (d.line.unwrap_or(u32::MAX), d.column.unwrap_or(0)));
        Diagnostics(self.diags)
    }
}

/// Spans of the model's fields, for semantic diagnostics on a parsed file.
#[derive(Default)]
pub(super) struct ModelSpans {
    pub(super) job: HashMap<&'static str, Span>,
    pub(super) job_table: Option<Span>,
    pub(super) nodes: Vec<NodeSpans>,
    /// Fields that already have a shape diagnostic; semantic checks stay quiet on them.
    pub(super) reported: HashSet<String>,
}

#[derive(Default, Clone)]
pub(super) struct NodeSpans {
    pub(super) table: Option<Span>,
    pub(super) name: Option<Span>,
    pub(super) uid: Option<Span>,
    pub(super) plugin: Option<Span>,
    pub(super) parallelism: Option<Span>,
    pub(super) inputs: Option<Span>,
    /// Per input: span of `from`, span of `partition`.
    pub(super) input_items: Vec<(Option<Span>, Option<Span>)>,
    /// Per grant: span of `guest`.
    pub(super) grants: Vec<Option<Span>>,
    /// Per connection grant: span of the name.
    pub(super) connections: Vec<Option<Span>>,
}

pub(super) fn find<'a, 'i>(t: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
    t.iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

pub(super) fn check_keys(cx: &mut Cx<'_>, t: &DeTable<'_>, prefix: &str, allowed: &[&str]) {
    for (k, _) in t.iter() {
        let key = k.get_ref().as_ref();
        if !allowed.contains(&key) {
            cx.err(
                Some(k.span()),
                join(prefix, key),
                format!(
                    "unknown key `{key}`; expected one of: {}",
                    allowed.join(", ")
                ),
            );
        }
    }
}

/// The tables of an array of tables (`[[key]]`), with their index and span.
pub(super) fn tables_of<'a, 'i>(
    cx: &mut Cx<'_>,
    v: &'a Spanned<DeValue<'i>>,
    key: &str,
) -> Vec<(usize, &'a DeTable<'i>, Span)> {
    let mut out = Vec::new();
    match v.get_ref() {
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match item.get_ref() {
                    DeValue::Table(t) => out.push((i, t, item.span())),
                    other => cx.err(
                        Some(item.span()),
                        format!("{key}[{i}]"),
                        format!("expected a table, found {}", other.type_str()),
                    ),
                }
            }
        }
        other => cx.err(
            Some(v.span()),
            key,
            format!(
                "expected an array of tables `[[{key}]]`, found {}",
                other.type_str()
            ),
        ),
    }
    out
}

pub(super) fn get_str(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<String> {
    match v.get_ref() {
        DeValue::String(s) => Some(s.to_string()),
        other => {
            cx.err(
                Some(v.span()),
                field,
                format!("expected a string, found {}", other.type_str()),
            );
            None
        }
    }
}

pub(super) fn get_bool(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<bool> {
    match v.get_ref() {
        DeValue::Boolean(b) => Some(*b),
        other => {
            cx.err(
                Some(v.span()),
                field,
                format!("expected a boolean, found {}", other.type_str()),
            );
            None
        }
    }
}

pub(super) fn get_int(
    cx: &mut Cx<'_>,
    v: &Spanned<DeValue<'_>>,
    field: &str,
    max: u64,
) -> Option<u64> {
    match v.get_ref() {
        DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) if (0..=i128::from(max)).contains(&n) => Some(n as u64),
            _ => {
                cx.err(
                    Some(v.span()),
                    field,
                    format!("{i} is out of range (0..={max})"),
                );
                None
            }
        },
        other => {
            cx.err(
                Some(v.span()),
                field,
                format!("expected an integer, found {}", other.type_str()),
            );
            None
        }
    }
}

pub(super) fn get_size(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<u64> {
    match v.get_ref() {
        DeValue::String(s) => {
            let n = parse_size(s);
            if n.is_none() {
                cx.err(
                    Some(v.span()),
                    field,
                    format!(
                        "`{s}` is not a size; expected an integer number of bytes or a \
                         string like \"256MiB\" (units B, KiB, MiB, GiB, KB, MB, GB)"
                    ),
                );
            }
            n
        }
        _ => get_int(cx, v, field, u64::MAX),
    }
}

pub(super) fn get_u32(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<u32> {
    get_int(cx, v, field, u64::from(u32::MAX)).map(|n| n as u32)
}

pub(super) fn placeholder_job() -> JobSpec {
    JobSpec {
        name: String::new(),
        id: String::new(),
        pipeline: DEFAULT_PIPELINE.into(),
        parallelism: DEFAULT_PARALLELISM,
        state_shards: DEFAULT_STATE_SHARDS,
        semantic: SemanticMode::default(),
        checkpoint_interval_ms: None,
        checkpoint_every_records: None,
        checkpoint_timeout_ms: None,
        state_memory_bytes: None,
        async_snapshots: true,
        incremental_snapshots: true,
        batch_records: DEFAULT_BATCH_RECORDS,
    }
}

pub(super) fn read_job(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    span: Span,
    spans: &mut ModelSpans,
) -> JobSpec {
    const KEYS: &[&str] = &[
        "name",
        "id",
        "pipeline",
        "parallelism",
        "state_shards",
        "semantic",
        "checkpoint_interval_ms",
        "checkpoint_every_records",
        "checkpoint_timeout_ms",
        "batch_records",
        "state_memory_bytes",
        "async_snapshots",
        "incremental_snapshots",
    ];
    check_keys(cx, t, "job", KEYS);
    spans.job_table = Some(span.clone());
    let mut job = placeholder_job();
    for key in KEYS {
        if let Some(v) = find(t, key) {
            spans.job.insert(key, v.span());
        }
    }
    match find(t, "name") {
        Some(v) => {
            if let Some(s) = get_str(cx, v, "job.name") {
                job.name = s;
            }
        }
        None => cx.err(Some(span), "job.name", "missing required key `name`"),
    }
    job.id = match find(t, "id") {
        Some(v) => get_str(cx, v, "job.id").unwrap_or_default(),
        None => job.name.clone(),
    };
    if let Some(v) = find(t, "pipeline")
        && let Some(s) = get_str(cx, v, "job.pipeline")
    {
        job.pipeline = s;
    }
    if let Some(v) = find(t, "parallelism")
        && let Some(n) = get_u32(cx, v, "job.parallelism")
    {
        job.parallelism = n;
    }
    if let Some(v) = find(t, "state_shards")
        && let Some(n) = get_u32(cx, v, "job.state_shards")
    {
        job.state_shards = n;
    }
    if let Some(v) = find(t, "batch_records")
        && let Some(n) = get_u32(cx, v, "job.batch_records")
    {
        job.batch_records = n;
    }
    if let Some(v) = find(t, "checkpoint_interval_ms") {
        job.checkpoint_interval_ms = get_int(cx, v, "job.checkpoint_interval_ms", u64::MAX);
    }
    if let Some(v) = find(t, "checkpoint_every_records") {
        job.checkpoint_every_records = get_int(cx, v, "job.checkpoint_every_records", u64::MAX);
    }
    if let Some(v) = find(t, "checkpoint_timeout_ms") {
        job.checkpoint_timeout_ms = get_int(cx, v, "job.checkpoint_timeout_ms", u64::MAX);
    }
    if let Some(v) = find(t, "state_memory_bytes") {
        job.state_memory_bytes = get_size(cx, v, "job.state_memory_bytes");
    }
    if let Some(v) = find(t, "async_snapshots")
        && let Some(b) = get_bool(cx, v, "job.async_snapshots")
    {
        job.async_snapshots = b;
    }
    if let Some(v) = find(t, "incremental_snapshots")
        && let Some(b) = get_bool(cx, v, "job.incremental_snapshots")
    {
        job.incremental_snapshots = b;
    }
    if let Some(v) = find(t, "semantic")
        && let Some(s) = get_str(cx, v, "job.semantic")
    {
        match parse_semantic(&s) {
            Some(m) => job.semantic = m,
            None => cx.err(
                Some(v.span()),
                "job.semantic",
                format!(
                    "unknown semantic mode `{s}`; expected one of: strict-exactly-once, \
                     effectively-once, at-least-once, best-effort"
                ),
            ),
        }
    }
    job
}

pub(super) fn read_prepare(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    span: Span,
    prefix: &str,
) -> Option<PrepareStep> {
    let kind = if find(t, "unzip").is_some() {
        "unzip"
    } else if find(t, "sort").is_some() {
        "sort"
    } else {
        check_keys(cx, t, prefix, &["unzip", "sort"]);
        cx.err(
            Some(span),
            prefix,
            "a prepare step needs a kind key; expected one of: unzip, sort",
        );
        return None;
    };
    let req = |cx: &mut Cx<'_>, key: &str| -> Option<String> {
        let field = join(prefix, key);
        match find(t, key) {
            Some(v) => {
                let s = get_str(cx, v, &field)?;
                if s.is_empty() {
                    cx.err(Some(v.span()), field, "must not be empty");
                    return None;
                }
                Some(s)
            }
            None => {
                cx.err(
                    Some(span.clone()),
                    field,
                    format!("missing required key `{key}`"),
                );
                None
            }
        }
    };
    if kind == "sort" {
        check_keys(cx, t, prefix, &["sort", "by", "into"]);
        let file = req(cx, "sort");
        let into = req(cx, "into");
        let field = join(prefix, "by");
        let by = match find(t, "by") {
            Some(v) => match v.get_ref() {
                DeValue::Array(items) if !items.is_empty() => items
                    .iter()
                    .enumerate()
                    .map(|(j, it)| get_str(cx, it, &format!("{field}[{j}]")))
                    .collect::<Option<Vec<_>>>(),
                DeValue::Array(_) => {
                    cx.err(Some(v.span()), field, "must name at least one column");
                    None
                }
                other => {
                    cx.err(
                        Some(v.span()),
                        field,
                        format!(
                            "expected an array of column names, found {}",
                            other.type_str()
                        ),
                    );
                    None
                }
            },
            None => {
                cx.err(Some(span.clone()), field, "missing required key `by`");
                None
            }
        };
        return Some(PrepareStep::Sort {
            file: file?,
            by: by?,
            into: into?,
        });
    }
    check_keys(cx, t, prefix, &["unzip", "member", "into"]);
    let archive = req(cx, "unzip");
    let member = req(cx, "member");
    let into = req(cx, "into");
    Some(PrepareStep::Unzip {
        archive: archive?,
        member: member?,
        into: into?,
    })
}

/// Reads one `[[source]]`, `[[operator]]` or `[[sink]]` table into its spec and the spans
/// of its fields.
pub(super) fn read_node(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    span: Span,
    kind: PluginKind,
    prefix: &str,
) -> (NodeSpec, NodeSpans) {
    check_keys(
        cx,
        t,
        prefix,
        &[
            "name",
            "uid",
            "plugin",
            "parallelism",
            "inputs",
            "grants",
            "connections",
            "config",
            "watermarks",
            "start_new_chain",
            "on_error",
            "state_ttl_ms",
        ],
    );
    let mut ns = NodeSpans {
        table: Some(span.clone()),
        ..NodeSpans::default()
    };
    let f = |key: &str| join(prefix, key);

    let name = match find(t, "name") {
        Some(v) => {
            ns.name = Some(v.span());
            get_str(cx, v, &f("name")).unwrap_or_default()
        }
        None => {
            cx.err(Some(span.clone()), f("name"), "missing required key `name`");
            String::new()
        }
    };
    let uid = find(t, "uid").and_then(|v| {
        ns.uid = Some(v.span());
        get_str(cx, v, &f("uid"))
    });
    let plugin = match find(t, "plugin") {
        Some(v) => {
            ns.plugin = Some(v.span());
            get_str(cx, v, &f("plugin")).and_then(|s| match parse_plugin_ref(&s) {
                Ok(r) => Some(r),
                Err(e) => {
                    cx.err(Some(v.span()), f("plugin"), e);
                    None
                }
            })
        }
        None => {
            cx.err(
                Some(span.clone()),
                f("plugin"),
                "missing required key `plugin`",
            );
            None
        }
    };
    let plugin = plugin.unwrap_or(PluginRef::Path {
        path: "<invalid>.wasm".into(),
    });
    let parallelism = find(t, "parallelism").and_then(|v| {
        ns.parallelism = Some(v.span());
        get_u32(cx, v, &f("parallelism"))
    });

    let inputs = read_inputs(cx, t, prefix, &mut ns);
    let grants = read_grants(cx, t, prefix, &mut ns);
    let connections = read_connection_grants(cx, t, prefix, &mut ns);
    let config = read_config(cx, t, prefix);
    let watermarks = read_watermarks(cx, t, kind, prefix);
    let start_new_chain = read_start_new_chain(cx, t, kind, prefix);
    let on_error = read_on_error(cx, t, kind, prefix);
    let state_ttl_ms = read_state_ttls(cx, t, kind, prefix);

    let node = NodeSpec {
        path: model_path(kind, &name),
        name,
        kind,
        uid,
        plugin,
        parallelism,
        inputs,
        config,
        grants,
        connections,
        watermarks,
        start_new_chain,
        on_error,
        state_ttl_ms,
    };
    (node, ns)
}

/// Reads `inputs`: node names, or tables `{ from, partition, output }`, with their spans.
fn read_inputs(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    prefix: &str,
    ns: &mut NodeSpans,
) -> Vec<InputSpec> {
    let f = |key: &str| join(prefix, key);
    let mut inputs = Vec::new();
    if let Some(v) = find(t, "inputs") {
        ns.inputs = Some(v.span());
        match v.get_ref() {
            DeValue::Array(items) => {
                for (j, item) in items.iter().enumerate() {
                    let ip = format!("{prefix}.inputs[{j}]");
                    match item.get_ref() {
                        DeValue::String(s) => {
                            ns.input_items.push((Some(item.span()), None));
                            inputs.push(InputSpec {
                                from: s.to_string(),
                                partition: None,
                                output: None,
                            });
                        }
                        DeValue::Table(it) => {
                            let (input, spans) = read_input_table(cx, it, item.span(), &ip);
                            ns.input_items.push(spans);
                            inputs.push(input);
                        }
                        other => {
                            cx.err(
                                Some(item.span()),
                                ip,
                                format!(
                                    "expected a node name or a table {{ from = \"..\", \
                                     partition = \"..\" }}, found {}",
                                    other.type_str()
                                ),
                            );
                            ns.input_items.push((Some(item.span()), None));
                            inputs.push(InputSpec {
                                from: String::new(),
                                partition: None,
                                output: None,
                            });
                        }
                    }
                }
            }
            other => cx.err(
                Some(v.span()),
                f("inputs"),
                format!("expected an array, found {}", other.type_str()),
            ),
        }
    }
    inputs
}

/// Reads one input written as a table `{ from, partition, output }`, with the spans of
/// its `from` and `partition`.
fn read_input_table(
    cx: &mut Cx<'_>,
    it: &DeTable<'_>,
    item_span: Span,
    ip: &str,
) -> (InputSpec, (Option<Span>, Option<Span>)) {
    check_keys(cx, it, ip, &["from", "partition", "output"]);
    let mut spans = (None, None);
    let from = match find(it, "from") {
        Some(fv) => {
            spans.0 = Some(fv.span());
            get_str(cx, fv, &format!("{ip}.from")).unwrap_or_default()
        }
        None => {
            cx.err(
                Some(item_span),
                format!("{ip}.from"),
                "missing required key `from`",
            );
            String::new()
        }
    };
    let partition = find(it, "partition").and_then(|pv| {
        spans.1 = Some(pv.span());
        let s = get_str(cx, pv, &format!("{ip}.partition"))?;
        let p = parse_partition(&s);
        if p.is_none() {
            cx.err(
                Some(pv.span()),
                format!("{ip}.partition"),
                format!(
                    "unknown partition `{s}`; expected one of: forward, \
                     hash, rebalance, broadcast, union, singleton"
                ),
            );
        }
        p
    });
    let output = find(it, "output").and_then(|ov| {
        let s = get_str(cx, ov, &format!("{ip}.output"))?;
        if s.is_empty() {
            cx.err(Some(ov.span()), format!("{ip}.output"), "must not be empty");
            return None;
        }
        Some(s)
    });
    (
        InputSpec {
            from,
            partition,
            output,
        },
        spans,
    )
}

/// Reads `grants`: tables `{ guest, host, writable }`, with the span of each `guest`.
fn read_grants(cx: &mut Cx<'_>, t: &DeTable<'_>, prefix: &str, ns: &mut NodeSpans) -> Vec<Grant> {
    let f = |key: &str| join(prefix, key);
    let mut grants = Vec::new();
    if let Some(v) = find(t, "grants") {
        match v.get_ref() {
            DeValue::Array(items) => {
                for (j, item) in items.iter().enumerate() {
                    let gp = format!("{prefix}.grants[{j}]");
                    let DeValue::Table(gt) = item.get_ref() else {
                        cx.err(
                            Some(item.span()),
                            gp,
                            format!(
                                "expected a table {{ guest = \"/dir\", host = \"dir\" }}, found {}",
                                item.get_ref().type_str()
                            ),
                        );
                        continue;
                    };
                    check_keys(cx, gt, &gp, &["guest", "host", "writable"]);
                    let mut g = Grant {
                        guest: String::new(),
                        host: String::new(),
                        writable: false,
                    };
                    let mut guest_span = Some(item.span());
                    for key in ["guest", "host"] {
                        match find(gt, key) {
                            Some(x) => {
                                if key == "guest" {
                                    guest_span = Some(x.span());
                                }
                                let s = get_str(cx, x, &format!("{gp}.{key}")).unwrap_or_default();
                                if key == "guest" {
                                    g.guest = s;
                                } else {
                                    g.host = s;
                                }
                            }
                            None => cx.err(
                                Some(item.span()),
                                format!("{gp}.{key}"),
                                format!("missing required key `{key}`"),
                            ),
                        }
                    }
                    if let Some(x) = find(gt, "writable") {
                        g.writable = get_bool(cx, x, &format!("{gp}.writable")).unwrap_or(false);
                    }
                    ns.grants.push(guest_span);
                    grants.push(g);
                }
            }
            other => cx.err(
                Some(v.span()),
                f("grants"),
                format!("expected an array of tables, found {}", other.type_str()),
            ),
        }
    }
    grants
}

/// Reads `connections`: the names of the connections granted to the node, with their spans.
fn read_connection_grants(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    prefix: &str,
    ns: &mut NodeSpans,
) -> Vec<String> {
    let f = |key: &str| join(prefix, key);
    let mut connections = Vec::new();
    if let Some(v) = find(t, "connections") {
        match v.get_ref() {
            DeValue::Array(items) => {
                for (j, item) in items.iter().enumerate() {
                    if let Some(s) = get_str(cx, item, &format!("{prefix}.connections[{j}]")) {
                        ns.connections.push(Some(item.span()));
                        connections.push(s);
                    }
                }
            }
            other => cx.err(
                Some(v.span()),
                f("connections"),
                format!(
                    "expected an array of connection names, found {}",
                    other.type_str()
                ),
            ),
        }
    }
    connections
}

/// Reads `config`: any table, as JSON; `{}` when absent.
fn read_config(cx: &mut Cx<'_>, t: &DeTable<'_>, prefix: &str) -> serde_json::Value {
    let f = |key: &str| join(prefix, key);
    match find(t, "config") {
        Some(v) => match v.get_ref() {
            DeValue::Table(_) => to_json(cx, v, &f("config")),
            other => {
                cx.err(
                    Some(v.span()),
                    f("config"),
                    format!("expected a table, found {}", other.type_str()),
                );
                serde_json::Value::Object(Default::default())
            }
        },
        None => serde_json::Value::Object(Default::default()),
    }
}

/// Reads `watermarks`: the watermark bounds of a source.
fn read_watermarks(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    kind: PluginKind,
    prefix: &str,
) -> Option<crate::model::WatermarkSpec> {
    let f = |key: &str| join(prefix, key);
    find(t, "watermarks").and_then(|v| {
        let field = f("watermarks");
        let DeValue::Table(wt) = v.get_ref() else {
            cx.err(
                Some(v.span()),
                field,
                format!(
                    "expected a table {{ max_out_of_orderness_ms = .., idle_timeout_ms = .. }}, found {}",
                    v.get_ref().type_str()
                ),
            );
            return None;
        };
        if kind != PluginKind::Source {
            cx.err(
                Some(v.span()),
                field.clone(),
                "only sources generate watermarks (downstream tasks take the minimum of their inputs)",
            );
        }
        check_keys(
            cx,
            wt,
            &field,
            &["max_out_of_orderness_ms", "idle_timeout_ms", "max_drift_ms"],
        );
        let bound = find(wt, "max_out_of_orderness_ms")
            .and_then(|x| get_int(cx, x, &format!("{field}.max_out_of_orderness_ms"), i64::MAX as u64 / 2))
            .unwrap_or(0);
        let idle = find(wt, "idle_timeout_ms").and_then(|x| {
            let n = get_int(cx, x, &format!("{field}.idle_timeout_ms"), i64::MAX as u64 / 2)?;
            if n == 0 {
                cx.err(Some(x.span()), format!("{field}.idle_timeout_ms"), "must be >= 1");
            }
            Some(n)
        });
        let drift = find(wt, "max_drift_ms").and_then(|x| {
            get_int(cx, x, &format!("{field}.max_drift_ms"), i64::MAX as u64 / 2)
        });
        Some(crate::model::WatermarkSpec {
            max_out_of_orderness_ms: bound,
            idle_timeout_ms: idle,
            max_drift_ms: drift,
        })
    })
}

/// Reads `start_new_chain`, which a source may not set; `false` when absent.
fn read_start_new_chain(cx: &mut Cx<'_>, t: &DeTable<'_>, kind: PluginKind, prefix: &str) -> bool {
    let f = |key: &str| join(prefix, key);
    find(t, "start_new_chain")
        .and_then(|v| {
            let field = f("start_new_chain");
            let b = get_bool(cx, v, &field)?;
            if b && kind == PluginKind::Source {
                cx.err(
                    Some(v.span()),
                    field,
                    "a source always heads its chain; set start_new_chain on its consumer",
                );
            }
            Some(b)
        })
        .unwrap_or(false)
}

/// Reads `on_error` and checks it against the node's kind; `fail` when absent.
fn read_on_error(cx: &mut Cx<'_>, t: &DeTable<'_>, kind: PluginKind, prefix: &str) -> ErrorPolicy {
    let f = |key: &str| join(prefix, key);
    find(t, "on_error")
        .and_then(|v| {
            let field = f("on_error");
            let s = get_str(cx, v, &field)?;
            let Some(policy) = ErrorPolicy::parse(&s) else {
                cx.err(
                    Some(v.span()),
                    field,
                    format!("unknown error policy `{s}`; expected one of: fail, skip, dead-letter"),
                );
                return None;
            };
            match kind {
                PluginKind::Operator => Some(policy),
                PluginKind::Source => {
                    cx.err(
                        Some(v.span()),
                        field,
                        "a source processes no records; set on_error on the operator that \
                         parses them",
                    );
                    None
                }
                PluginKind::Sink if policy != ErrorPolicy::Fail => {
                    cx.err(
                        Some(v.span()),
                        field,
                        format!(
                            "a sink only takes on_error = \"fail\": a failed `write` may have \
                             written part of its batch into the open transaction, which the \
                             host cannot take back, so `{policy}` could not be exactly-once; \
                             set on_error on the operator upstream"
                        ),
                    );
                    None
                }
                PluginKind::Sink => Some(policy),
            }
        })
        .unwrap_or_default()
}

/// Reads `state_ttl_ms`, which only operators may set: milliseconds per keyed state.
fn read_state_ttls(
    cx: &mut Cx<'_>,
    t: &DeTable<'_>,
    kind: PluginKind,
    prefix: &str,
) -> std::collections::BTreeMap<String, u64> {
    let f = |key: &str| join(prefix, key);
    let mut state_ttl_ms = std::collections::BTreeMap::new();
    if let Some(v) = find(t, "state_ttl_ms") {
        let field = f("state_ttl_ms");
        match v.get_ref() {
            _ if kind != PluginKind::Operator => cx.err(
                Some(v.span()),
                field,
                "only operators hold keyed state; state_ttl_ms belongs on an [[operator]]",
            ),
            DeValue::Table(tt) => {
                for (k, item) in tt.iter() {
                    let name = k.get_ref().to_string();
                    let sf = format!("{field}.{name}");
                    if let Some(ms) = get_int(cx, item, &sf, u64::MAX) {
                        if ms == 0 {
                            cx.err(
                                Some(item.span()),
                                sf,
                                "must be >= 1 ms (omit the state to keep it forever)",
                            );
                        } else {
                            state_ttl_ms.insert(name, ms);
                        }
                    }
                }
            }
            other => cx.err(
                Some(v.span()),
                field,
                format!(
                    "expected a table {{ <state> = <milliseconds> }}, found {}",
                    other.type_str()
                ),
            ),
        }
    }
    state_ttl_ms
}

/// TOML value → JSON; non-finite floats are reported and become `null`.
pub(super) fn to_json(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> serde_json::Value {
    use serde_json::Value as J;
    match v.get_ref() {
        DeValue::String(s) => J::String(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
            Ok(n) => J::from(n),
            Err(_) => match u64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => J::from(n),
                Err(_) => {
                    cx.err(
                        Some(v.span()),
                        field,
                        format!("integer {i} is out of range"),
                    );
                    J::Null
                }
            },
        },
        DeValue::Float(x) => {
            let f: Option<f64> = x.as_str().replace('_', "").parse().ok();
            match f.and_then(serde_json::Number::from_f64) {
                Some(n) => J::Number(n),
                None => {
                    cx.err(
                        Some(v.span()),
                        field,
                        format!("float {x} has no JSON representation (must be finite)"),
                    );
                    J::Null
                }
            }
        }
        DeValue::Boolean(b) => J::Bool(*b),
        DeValue::Datetime(d) => J::String(d.to_string()),
        DeValue::Array(items) => J::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(cx, item, &format!("{field}[{i}]")))
                .collect(),
        ),
        DeValue::Table(t) => {
            let mut m = serde_json::Map::new();
            for (k, item) in t.iter() {
                let key = k.get_ref().to_string();
                let j = to_json(cx, item, &join(field, &key));
                m.insert(key, j);
            }
            J::Object(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ENDS, MINIMAL_JOB, at, errs};
    use super::super::{parse_job_file, parse_size};
    use crate::model::{ErrorPolicy, StreamModel};

    #[test]
    fn async_snapshots_defaults_to_true_and_stays_out_of_the_serialised_model() {
        let m = parse_job_file("job.toml", &format!("{MINIMAL_JOB}{ENDS}")).unwrap();
        assert!(m.job.async_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(!json.contains("async_snapshots"), "{json}");
        let m = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}async_snapshots = false\n{ENDS}"),
        )
        .unwrap();
        assert!(!m.job.async_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(json.contains("\"async_snapshots\":false"), "{json}");
        let back: crate::model::JobSpec = serde_json::from_str(&json).unwrap();
        assert!(!back.async_snapshots);
        let e = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}async_snapshots = \"yes\"\n"),
        )
        .unwrap_err();
        assert!(format!("{e:?}").contains("job.async_snapshots"), "{e:?}");
    }

    #[test]
    fn incremental_snapshots_defaults_to_true_and_stays_out_of_the_serialised_model() {
        let m = parse_job_file("job.toml", &format!("{MINIMAL_JOB}{ENDS}")).unwrap();
        assert!(m.job.incremental_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(!json.contains("incremental_snapshots"), "{json}");
        let m = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}incremental_snapshots = false\n{ENDS}"),
        )
        .unwrap();
        assert!(!m.job.incremental_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(json.contains("\"incremental_snapshots\":false"), "{json}");
        let e = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}incremental_snapshots = 1\n{ENDS}"),
        )
        .unwrap_err();
        assert!(
            format!("{e:?}").contains("job.incremental_snapshots"),
            "{e:?}"
        );
    }

    #[test]
    fn state_memory_bytes_takes_an_integer_or_a_size_with_a_unit() {
        for (text, bytes) in [
            ("268435456", 256 << 20),
            ("\"256MiB\"", 256 << 20),
            ("\"2 GiB\"", 2 << 30),
            ("\"1500KB\"", 1_500_000),
            ("\"1048576B\"", 1 << 20),
        ] {
            let m = parse_job_file(
                "job.toml",
                &format!("{MINIMAL_JOB}state_memory_bytes = {text}\n{ENDS}"),
            )
            .unwrap_or_else(|e| panic!("{text}: {e:?}"));
            assert_eq!(m.job.state_memory_bytes, Some(bytes), "{text}");
        }
        let m = parse_job_file("job.toml", &format!("{MINIMAL_JOB}{ENDS}")).unwrap();
        assert_eq!(m.job.state_memory_bytes, None);
        assert_eq!(parse_size("3 MB"), Some(3_000_000));
        assert_eq!(parse_size("3 mb"), None);
        assert_eq!(parse_size("MiB"), None);
        assert_eq!(parse_size("99999999999999999999GiB"), None);
    }

    /// source `s` -> operators `a`, `b`, `c` -> sink `k`; `extra[i]` is appended to the
    /// table of node i (0: source, 1..=3: operators, 4: sink).
    fn with_on_error(extra: [&str; 5]) -> String {
        format!(
            "{MINIMAL_JOB}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n{}\
             [[operator]]\nname = \"a\"\nplugin = \"o@1\"\ninputs = [\"s\"]\n{}\
             [[operator]]\nname = \"b\"\nplugin = \"o@1\"\ninputs = [\"a\"]\n{}\
             [[operator]]\nname = \"c\"\nplugin = \"o@1\"\ninputs = [\"b\"]\n{}\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"c\"]\n{}",
            extra[0], extra[1], extra[2], extra[3], extra[4]
        )
    }

    #[test]
    fn on_error_defaults_to_fail_and_takes_three_policies() {
        let text = with_on_error([
            "",
            "on_error = \"skip\"\n",
            "on_error = \"dead-letter\"\n",
            "",
            "on_error = \"fail\"\n",
        ]);
        let m = parse_job_file("job.toml", &text).unwrap();
        let policies: Vec<ErrorPolicy> = m.nodes.iter().map(|n| n.on_error).collect();
        assert_eq!(
            policies,
            vec![
                ErrorPolicy::Fail,
                ErrorPolicy::Skip,
                ErrorPolicy::DeadLetter,
                ErrorPolicy::Fail,
                ErrorPolicy::Fail,
            ]
        );
        // The default stays out of the serialized model (and so out of old fingerprints).
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json.matches("on_error").count(), 2, "{json}");
        let back: StreamModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn on_error_diagnostics_name_the_field_line_and_what_is_allowed() {
        // Lines: [job] 1-2, source 3-5 (+extra), operators and sink after.
        let text = with_on_error([
            "on_error = \"skip\"\n",
            "",
            "on_error = 3\n",
            "on_error = \"drop\"\n",
            "on_error = \"dead-letter\"\n",
        ]);
        let d = errs(&text);
        assert_eq!(d.len(), 4, "{d}");
        let src = at(&d, "source[0].on_error");
        assert_eq!(src.line, Some(6));
        assert!(src.message.contains("a source processes no records"), "{d}");
        let ty = at(&d, "operator[1].on_error");
        assert_eq!(ty.line, Some(15));
        assert!(ty.message.contains("expected a string"), "{d}");
        let unknown = at(&d, "operator[2].on_error");
        assert_eq!(unknown.line, Some(20));
        assert_eq!(
            unknown.message,
            "unknown error policy `drop`; expected one of: fail, skip, dead-letter"
        );
        assert_eq!(
            unknown.to_string(),
            "job.toml:20:12: operator[2].on_error: unknown error policy `drop`; expected one \
             of: fail, skip, dead-letter"
        );
        let sink = at(&d, "sink[0].on_error");
        assert_eq!(sink.line, Some(25));
        assert!(
            sink.message
                .starts_with("a sink only takes on_error = \"fail\""),
            "{d}"
        );
        // Like partition and semantic names: case-insensitive, `_` = `-`.
        let m = parse_job_file(
            "job.toml",
            &with_on_error(["", "on_error = \"Dead_Letter\"\n", "", "", ""]),
        )
        .unwrap();
        assert_eq!(m.nodes[1].on_error, ErrorPolicy::DeadLetter);
        let d = errs(&with_on_error([
            "",
            "on_error = \"deadletter\"\n",
            "",
            "",
            "",
        ]));
        assert_eq!(at(&d, "operator[0].on_error").line, Some(10), "{d}");
    }
}
