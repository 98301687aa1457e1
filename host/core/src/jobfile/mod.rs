//! The declarative job file (design §1, §12.1): TOML in, [`StreamModel`] out.
//!
//! [`parse_job_file`] reads the file, checks its shape (types, required and unknown keys)
//! and then the model's semantics ([`validate_model`]), and reports **every** problem it
//! finds as a [`Diagnostic`] with the file, line, column and dotted field path
//! (`operator[1].inputs[0].from`; tables are indexed from 0 within their own kind).
//! TOML syntax errors are reported the same way (at most one per line, since one typo
//! tends to cascade); shape and semantic checks only run on a syntactically valid file.
//!
//! # Format
//!
//! ```toml
//! [job]
//! name = "flights-per-carrier"      # required; free text
//! id = "flights-per-carrier"        # default: name; [A-Za-z0-9._-], starts alphanumeric
//! pipeline = "main"                 # default "main"; same charset as id
//! parallelism = 2                   # default 1; >= 1
//! state_shards = 128                # default 128; >= 1 and >= every keyed parallelism
//! semantic = "strict-exactly-once"  # default; also effectively-once, at-least-once,
//!                                   # best-effort (case-insensitive, `_` = `-`)
//! checkpoint_interval_ms = 1000     # optional (no periodic checkpoints); >= 1
//! checkpoint_every_records = 500000 # optional: also an epoch per this many records read
//!                                   # by the sources together; >= 1
//! checkpoint_timeout_ms = 60000     # optional (default 60000): an epoch not durable this
//!                                   # long after its barrier is aborted; >= 1
//! batch_records = 1024              # default 1024; 1..=65536
//! state_memory_bytes = "256MiB"     # optional: memory budget of the job's keyed state,
//!                                   # split over its stateful subtasks; an integer (bytes)
//!                                   # or a string with B, KiB, MiB, GiB, KB, MB or GB;
//!                                   # >= 1 MiB
//! async_snapshots = true            # default true: keyed-state snapshots are written by a
//!                                   # background thread after the barrier; false: on the
//!                                   # task thread, which stalls for the whole write
//! incremental_snapshots = true      # default true: an epoch writes only the keys changed
//!                                   # since the last snapshot (full again once the deltas
//!                                   # outweigh it); false: every epoch is full
//!
//! [connections.pg]                  # a named connection (a node reaches it only if granted)
//! kind = "postgres"                 # postgres, nats or redis
//! url = "postgres://nop@127.0.0.1:5432/shop"  # no password: a URL with one is refused
//! password_env = "PGPASSWORD"       # optional: host variable holding the password
//! # ca_file = "ca.pem"              # optional, TLS URLs only (rediss://, tls://): CAs to trust
//!
//! [[prepare]]                       # host-side steps run before the job, in order
//! unzip = "data/flights.csv.zip"    # archive, relative to the job file's directory
//! member = "flights.csv"            # required: member to extract
//! into = "data"                     # required: destination directory
//!
//! [[prepare]]                       # a CSV sorted by columns (numeric where both parse)
//! sort = "data/flights.csv"         # input, relative to the job file's directory
//! by = ["time_hour", "minute"]      # required: column names, most significant first
//! into = "data/flights-by-time.csv" # required: output file (redone if the input is newer)
//!
//! [[source]]
//! name = "flights"                  # required, unique among all nodes; same charset as id
//! uid = "flights-source"            # optional explicit operator id (design §3.2)
//! plugin = "file-source@0.1.0"      # name@version, or a path ending in .wasm
//! parallelism = 2                   # optional override of job.parallelism
//! grants = [{ guest = "/input", host = "data" }]   # read-only unless writable = true
//! config = { path = "/input/flights.csv", header = true }  # any table; default {}
//! watermarks = { max_out_of_orderness_ms = 60000, idle_timeout_ms = 5000, max_drift_ms = 600000 }
//!                                   # sources only; optional (see WatermarkSpec); bound
//!                                   # default 0, no idleness, no alignment
//!
//! [[operator]]
//! name = "parse"
//! plugin = "flights-mapper@0.1.0"
//! inputs = ["flights"]              # names, or tables { from = "x", partition = "hash" }
//!                                   # and `output = "late"` to read a declared side output
//! config = {}
//! on_error = "dead-letter"          # default "fail"; also "skip", "dead-letter" (failed
//!                                   # records to side output `errors`; operators without
//!                                   # keyed state only; see ErrorPolicy)
//! state_ttl_ms = { counts = 3600000 } # optional, operators: time-to-live of declared
//!                                   # keyed states (processing time since last write)
//!
//! [[operator]]
//! name = "per-carrier"
//! plugin = "keyed-aggregate@0.1.0"
//! inputs = [{ from = "parse", partition = "hash" }]
//!
//! [[sink]]
//! name = "out"
//! plugin = "jsonl-sink@0.1.0"
//! inputs = ["per-carrier"]
//! grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
//! config = { dir = "/output" }
//!
//! [[sink]]
//! name = "db"
//! plugin = "postgres-sink@0.1.0"
//! inputs = ["parse"]
//! connections = ["pg"]              # sources and sinks: the connections the plugin may open
//! config = { connection = "pg", table = "departures", columns = [{ name = "carrier" }] }
//! ```
//!
//! Rules:
//! - Unknown keys anywhere are errors; so are values of the wrong type.
//! - Partition names are case-insensitive: `forward`, `hash`, `rebalance`, `broadcast`,
//!   `union`, `singleton`. Without one, an edge is FORWARD when both ends have equal
//!   parallelism and REBALANCE otherwise (decided by [`crate::stream_graph`]).
//! - Sources take no `inputs`; operators and sinks need at least one; nothing may consume
//!   a sink; the graph must be acyclic.
//! - `config` may also be written as a sub-table (`[source.config]` after the
//!   `[[source]]` it belongs to). TOML datetimes become strings; floats must be finite.
//! - A grant's `guest` path must be absolute and unique within its node; `host` is
//!   relative to the job file's directory or starts with `$OUTPUT`.
//! - `connections` appear on sources and sinks only and name declared
//!   `[connections.<name>]`, each once; a connection's rules are those of
//!   [`check_connection`].
//! - Nodes keep job-file order in [`StreamModel::nodes`], whatever their kind; a node's
//!   model path is `sources/<name>`, `operators/<name>` or `sinks/<name>`.

use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{
    ConnectionSpec, ErrorPolicy, Grant, InputSpec, JobSpec, NodeSpec, PluginRef, PrepareStep,
    StreamModel,
};
use nop_stream_api::{PartitionPolicy, PluginKind, SemanticMode};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// Default of `job.parallelism`.
pub const DEFAULT_PARALLELISM: u32 = 1;
/// Default of `job.state_shards` (design §3.4: fixed for the job's life).
pub const DEFAULT_STATE_SHARDS: u32 = 128;
/// Smallest `job.state_memory_bytes` a job file may set, in bytes (1 MiB).
pub const MIN_STATE_MEMORY_BYTES: u64 = 1 << 20;
/// Default of `job.batch_records`.
pub const DEFAULT_BATCH_RECORDS: u32 = 1024;
/// Largest allowed `job.batch_records`.
pub const MAX_BATCH_RECORDS: u32 = 65536;
/// Default of `job.pipeline`.
pub const DEFAULT_PIPELINE: &str = "main";

type Span = Range<usize>;

/// Parses and validates the TOML job file `text`; `file` is the name used in messages.
///
/// # Errors
/// Every syntax, shape and semantic problem found, each with line and column where the
/// file has them (see the [module docs](self) for the format and the rules).
pub fn parse_job_file(file: &str, text: &str) -> Result<StreamModel, Diagnostics> {
    let mut cx = Cx {
        file,
        text,
        diags: Vec::new(),
    };
    let (doc, errors) = DeTable::parse_recoverable(text);
    if !errors.is_empty() {
        let mut seen_lines = HashSet::new();
        let mut errors: Vec<_> = errors.into_iter().collect();
        errors.sort_by_key(|e| e.span().map_or(usize::MAX, |s| s.start));
        for e in errors {
            let line = e.span().map(|s| cx.position(s.start).0);
            if seen_lines.insert(line) {
                cx.err(e.span(), "", e.message().to_owned());
            }
        }
        return Err(cx.finish());
    }

    let mut spans = ModelSpans::default();
    let doc = doc.get_ref();
    check_keys(
        &mut cx,
        doc,
        "",
        &[
            "job",
            "connections",
            "prepare",
            "source",
            "operator",
            "sink",
        ],
    );

    let job = match find(doc, "job") {
        Some(v) => match v.get_ref() {
            DeValue::Table(t) => read_job(&mut cx, t, v.span(), &mut spans),
            other => {
                cx.err(
                    Some(v.span()),
                    "job",
                    format!("expected a table `[job]`, found {}", other.type_str()),
                );
                placeholder_job()
            }
        },
        None => {
            cx.err(None, "job", "missing `[job]` table");
            placeholder_job()
        }
    };

    let connections = match find(doc, "connections") {
        Some(v) => read_connections(&mut cx, v),
        None => Default::default(),
    };

    let mut prepare = Vec::new();
    if let Some(v) = find(doc, "prepare") {
        for (i, t, span) in tables_of(&mut cx, v, "prepare") {
            if let Some(step) = read_prepare(&mut cx, t, span, &format!("prepare[{i}]")) {
                prepare.push(step);
            }
        }
    }

    let mut nodes: Vec<(usize, NodeSpec, NodeSpans)> = Vec::new();
    for (key, kind) in [
        ("source", PluginKind::Source),
        ("operator", PluginKind::Operator),
        ("sink", PluginKind::Sink),
    ] {
        if let Some(v) = find(doc, key) {
            for (i, t, span) in tables_of(&mut cx, v, key) {
                let (node, ns) = read_node(&mut cx, t, span.clone(), kind, &format!("{key}[{i}]"));
                nodes.push((span.start, node, ns));
            }
        }
    }
    nodes.sort_by_key(|(start, _, _)| *start);
    let (nodes, node_spans): (Vec<_>, Vec<_>) = nodes.into_iter().map(|(_, n, s)| (n, s)).unzip();
    spans.nodes = node_spans;

    let model = StreamModel {
        job,
        prepare,
        nodes,
        connections,
    };
    spans.reported = cx.diags.iter().map(|d| d.field.clone()).collect();
    for (field, span, message) in check_model(&model, Some(&spans)) {
        cx.err(span, field, message);
    }
    if cx.diags.is_empty() {
        Ok(model)
    } else {
        Err(cx.finish())
    }
}

/// Checks the semantic rules of the [module docs](self) on a model built any way (from
/// a file, from JSON, or after a Delta such as [`StreamModel::with_parallelism`]).
///
/// # Errors
/// One diagnostic per violated rule; they carry field paths but no file or position.
pub fn validate_model(model: &StreamModel) -> Result<(), Diagnostics> {
    Diagnostics(
        check_model(model, None)
            .into_iter()
            .map(|(field, _, message)| Diagnostic::new(field, message))
            .collect(),
    )
    .into_result()
}

/// Parses a plugin reference: a path ending in `.wasm`, else `name@version` where the
/// name is `[A-Za-z0-9][A-Za-z0-9._-]*` and the version is semver-ish
/// (`MAJOR[.MINOR[.PATCH]][-PRE][+BUILD]`).
///
/// # Errors
/// A message saying what is wrong with `s`.
pub fn parse_plugin_ref(s: &str) -> Result<PluginRef, String> {
    if s.ends_with(".wasm") {
        let r = PluginRef::Path { path: s.to_owned() };
        check_plugin_ref(&r)?;
        return Ok(r);
    }
    let Some((name, version)) = s.split_once('@') else {
        return Err(format!(
            "`{s}` is neither `name@version` nor a path ending in `.wasm`"
        ));
    };
    let r = PluginRef::Named {
        name: name.to_owned(),
        version: version.to_owned(),
    };
    check_plugin_ref(&r)?;
    Ok(r)
}

/// Checks that a plugin reference is well-formed (see [`parse_plugin_ref`]).
///
/// # Errors
/// A message saying what is wrong.
pub fn check_plugin_ref(r: &PluginRef) -> Result<(), String> {
    match r {
        PluginRef::Path { path } => {
            let stem = path.rsplit('/').next().unwrap_or(path);
            if !path.ends_with(".wasm") || stem.len() <= ".wasm".len() {
                return Err(format!(
                    "plugin path `{path}` must name a component file ending in `.wasm`"
                ));
            }
            if path.chars().any(char::is_control) {
                return Err(format!(
                    "plugin path `{}` contains a control character",
                    path.escape_debug()
                ));
            }
            Ok(())
        }
        PluginRef::Named { name, version } => {
            if !is_ident(name) {
                return Err(format!(
                    "plugin name `{name}` must match [A-Za-z0-9][A-Za-z0-9._-]* (in `{name}@{version}`)"
                ));
            }
            if !is_semverish(version) {
                return Err(format!(
                    "plugin version `{version}` is not a version like `1.2.3` (in `{name}@{version}`)"
                ));
            }
            Ok(())
        }
    }
}

/// Parses a partition policy name, case-insensitively (`hash`, `FORWARD`, ...).
pub fn parse_partition(s: &str) -> Option<PartitionPolicy> {
    Some(match s.to_ascii_lowercase().as_str() {
        "forward" => PartitionPolicy::Forward,
        "hash" => PartitionPolicy::Hash,
        "rebalance" => PartitionPolicy::Rebalance,
        "broadcast" => PartitionPolicy::Broadcast,
        "union" => PartitionPolicy::Union,
        "singleton" => PartitionPolicy::Singleton,
        _ => return None,
    })
}

/// Parses a semantic mode name, case-insensitively, `_` equivalent to `-`
/// (`strict-exactly-once`, `EFFECTIVELY_ONCE`, ...).
pub fn parse_semantic(s: &str) -> Option<SemanticMode> {
    Some(match s.to_ascii_lowercase().replace('_', "-").as_str() {
        "strict-exactly-once" => SemanticMode::StrictExactlyOnce,
        "effectively-once" => SemanticMode::EffectivelyOnce,
        "at-least-once" => SemanticMode::AtLeastOnce,
        "best-effort" => SemanticMode::BestEffort,
        _ => return None,
    })
}

/// Whether `s` is usable as a node name, id, pipeline or plugin name:
/// `[A-Za-z0-9][A-Za-z0-9._-]*`. Such names are safe inside edge ids
/// (`a->b#0`), task ids and state paths.
pub fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_semverish(v: &str) -> bool {
    let (v, build) = match v.split_once('+') {
        Some((v, b)) => (v, Some(b)),
        None => (v, None),
    };
    let (core, pre) = match v.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (v, None),
    };
    let tag_ok = |t: Option<&str>| {
        t.is_none_or(|t| {
            !t.is_empty()
                && t.split('.').all(|p| {
                    !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
        })
    };
    let parts: Vec<&str> = core.split('.').collect();
    (1..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        && tag_ok(pre)
        && tag_ok(build)
}

// ---------------------------------------------------------------------------------------
// Shape reading

struct Cx<'t> {
    file: &'t str,
    text: &'t str,
    diags: Vec<Diagnostic>,
}

impl Cx<'_> {
    /// 1-based (line, column in chars) of byte `offset`.
    fn position(&self, offset: usize) -> (u32, u32) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line as u32, col as u32)
    }

    fn err(&mut self, span: Option<Span>, field: impl Into<String>, message: impl Into<String>) {
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

    fn finish(mut self) -> Diagnostics {
        // Stable: diagnostics without a position keep their order after positioned ones.
        self.diags
            .sort_by_key(|d| (d.line.unwrap_or(u32::MAX), d.column.unwrap_or(0)));
        Diagnostics(self.diags)
    }
}

/// Spans of the model's fields, for semantic diagnostics on a parsed file.
#[derive(Default)]
struct ModelSpans {
    job: HashMap<&'static str, Span>,
    job_table: Option<Span>,
    nodes: Vec<NodeSpans>,
    /// Fields that already have a shape diagnostic; semantic checks stay quiet on them.
    reported: HashSet<String>,
}

#[derive(Default, Clone)]
struct NodeSpans {
    table: Option<Span>,
    name: Option<Span>,
    uid: Option<Span>,
    plugin: Option<Span>,
    parallelism: Option<Span>,
    inputs: Option<Span>,
    /// Per input: span of `from`, span of `partition`.
    input_items: Vec<(Option<Span>, Option<Span>)>,
    /// Per grant: span of `guest`.
    grants: Vec<Option<Span>>,
    /// Per connection grant: span of the name.
    connections: Vec<Option<Span>>,
}

fn find<'a, 'i>(t: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
    t.iter()
        .find(|(k, _)| k.get_ref().as_ref() == key)
        .map(|(_, v)| v)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

fn check_keys(cx: &mut Cx<'_>, t: &DeTable<'_>, prefix: &str, allowed: &[&str]) {
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
fn tables_of<'a, 'i>(
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

fn get_str(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<String> {
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

fn get_bool(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<bool> {
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

fn get_int(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str, max: u64) -> Option<u64> {
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

/// A byte size: an integer, or a string `<n><unit>` with unit `B`, `KiB`, `MiB`, `GiB`
/// (powers of 1024) or `KB`, `MB`, `GB` (powers of 1000); spaces between are allowed.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..digits].parse().ok()?;
    let unit: u64 = match t[digits..].trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

fn get_size(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<u64> {
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

fn get_u32(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> Option<u32> {
    get_int(cx, v, field, u64::from(u32::MAX)).map(|n| n as u32)
}

fn placeholder_job() -> JobSpec {
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

fn read_job(cx: &mut Cx<'_>, t: &DeTable<'_>, span: Span, spans: &mut ModelSpans) -> JobSpec {
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

/// `[connections.<name>]` tables: `kind`, `url` and `password_env`, checked here (the
/// rules are in [`check_connection`]).
fn read_connections(
    cx: &mut Cx<'_>,
    v: &Spanned<DeValue<'_>>,
) -> std::collections::BTreeMap<String, ConnectionSpec> {
    let mut out = std::collections::BTreeMap::new();
    let DeValue::Table(t) = v.get_ref() else {
        cx.err(
            Some(v.span()),
            "connections",
            format!(
                "expected tables `[connections.<name>]`, found {}",
                v.get_ref().type_str()
            ),
        );
        return out;
    };
    for (k, item) in t.iter() {
        let name = k.get_ref().to_string();
        let prefix = format!("connections.{name}");
        let DeValue::Table(ct) = item.get_ref() else {
            cx.err(
                Some(item.span()),
                prefix,
                format!(
                    "expected a table {{ kind = \"postgres\", url = \"..\" }}, found {}",
                    item.get_ref().type_str()
                ),
            );
            continue;
        };
        check_keys(cx, ct, &prefix, &["kind", "url", "password_env", "ca_file"]);
        let mut field = |key: &str, required: bool| -> Option<(String, Span)> {
            match find(ct, key) {
                Some(x) => get_str(cx, x, &format!("{prefix}.{key}")).map(|s| (s, x.span())),
                None => {
                    if required {
                        cx.err(
                            Some(item.span()),
                            format!("{prefix}.{key}"),
                            format!("missing required key `{key}`"),
                        );
                    }
                    None
                }
            }
        };
        let kind = field("kind", true);
        let url = field("url", true);
        let password_env = field("password_env", false);
        let ca_file = field("ca_file", false);
        let (Some((kind, kind_span)), Some((url, url_span))) = (kind, url) else {
            continue;
        };
        let spec = ConnectionSpec {
            kind,
            url,
            password_env: password_env.as_ref().map(|p| p.0.clone()),
            ca_file: ca_file.as_ref().map(|p| p.0.clone()),
        };
        let mut bad = false;
        for (key, message) in check_connection(&name, &spec) {
            let span = match key {
                "kind" => kind_span.clone(),
                "url" => url_span.clone(),
                "password_env" => password_env.as_ref().map_or(item.span(), |p| p.1.clone()),
                "ca_file" => ca_file.as_ref().map_or(item.span(), |p| p.1.clone()),
                _ => k.span(),
            };
            let field = if key.is_empty() {
                prefix.clone()
            } else {
                format!("{prefix}.{key}")
            };
            cx.err(Some(span), field, message);
            bad = true;
        }
        if !bad {
            out.insert(name, spec);
        }
    }
    out
}

/// The rules of one connection, as (key, message) per violation (empty key: the name):
/// - the name uses the id charset (`[A-Za-z0-9][A-Za-z0-9._-]*`);
/// - `kind` is one of [`crate::model::CONNECTION_KINDS`];
/// - the `url` scheme fits the kind: `postgres://` or `postgresql://` for `postgres`,
///   `nats://` or `tls://` for `nats`, `redis://` or `rediss://` for `redis`;
/// - the `url` holds no password, read the way the drivers read it
///   ([`crate::url::check_url`]: no `user:password@`, no parameter whose percent-decoded
///   name is a credential, no user-info any driver could read as one): passwords come
///   from the environment variable `password_env` on the host running the job;
/// - `password_env` is a variable name (`[A-Za-z_][A-Za-z0-9_]*`);
/// - `ca_file` goes only with a TLS URL (`rediss://`, `tls://`); Postgres has no TLS yet.
///
/// Messages never repeat the URL, so a misplaced password is not echoed.
pub fn check_connection(name: &str, spec: &ConnectionSpec) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if !is_ident(name) {
        out.push((
            "",
            format!("connection name `{name}` must match [A-Za-z0-9][A-Za-z0-9._-]*"),
        ));
    }
    if !crate::model::CONNECTION_KINDS.contains(&spec.kind.as_str()) {
        out.push((
            "kind",
            format!(
                "unknown connection kind `{}`; expected one of: {}",
                spec.kind,
                crate::model::CONNECTION_KINDS.join(", ")
            ),
        ));
    } else if let Err(e) = crate::url::check_url(&spec.kind, &spec.url) {
        out.push(("url", e));
    }
    if spec.ca_file.is_some() {
        if spec.kind == "postgres" {
            out.push((
                "ca_file",
                "TLS to PostgreSQL is not supported by this host yet".into(),
            ));
        } else if !(spec.url.starts_with("rediss://") || spec.url.starts_with("tls://")) {
            out.push((
                "ca_file",
                "goes with a TLS URL (`rediss://` for redis, `tls://` for nats)".into(),
            ));
        }
    }
    if let Some(var) = &spec.password_env {
        let mut chars = var.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            out.push((
                "password_env",
                "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*), not a password"
                    .into(),
            ));
        }
    }
    out
}

fn read_prepare(cx: &mut Cx<'_>, t: &DeTable<'_>, span: Span, prefix: &str) -> Option<PrepareStep> {
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

fn read_node(
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
                            check_keys(cx, it, &ip, &["from", "partition", "output"]);
                            let mut spans = (None, None);
                            let from = match find(it, "from") {
                                Some(fv) => {
                                    spans.0 = Some(fv.span());
                                    get_str(cx, fv, &format!("{ip}.from")).unwrap_or_default()
                                }
                                None => {
                                    cx.err(
                                        Some(item.span()),
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
                                    cx.err(
                                        Some(ov.span()),
                                        format!("{ip}.output"),
                                        "must not be empty",
                                    );
                                    return None;
                                }
                                Some(s)
                            });
                            ns.input_items.push(spans);
                            inputs.push(InputSpec {
                                from,
                                partition,
                                output,
                            });
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

    let config = match find(t, "config") {
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
    };

    let watermarks = find(t, "watermarks").and_then(|v| {
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
    });

    let start_new_chain = find(t, "start_new_chain")
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
        .unwrap_or(false);

    let on_error = find(t, "on_error")
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
        .unwrap_or_default();

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

/// TOML value → JSON; non-finite floats are reported and become `null`.
fn to_json(cx: &mut Cx<'_>, v: &Spanned<DeValue<'_>>, field: &str) -> serde_json::Value {
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

// ---------------------------------------------------------------------------------------
// Semantic checks

/// The canonical model path of a node (design §3.2 priority 2).
pub fn model_path(kind: PluginKind, name: &str) -> String {
    format!("{}/{name}", table_dir(kind))
}

fn table_dir(kind: PluginKind) -> &'static str {
    match kind {
        PluginKind::Source => "sources",
        PluginKind::Operator => "operators",
        PluginKind::Sink => "sinks",
    }
}

type Found = (String, Option<Span>, String);

/// All semantic problems of `model`: (field, span if known, message).
fn check_model(model: &StreamModel, spans: Option<&ModelSpans>) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    // Quiet on a field when it, or a table/array containing it, already has a shape
    // diagnostic.
    let reported = |field: &str| {
        spans.is_some_and(|s| {
            s.reported.iter().any(|r| {
                field
                    .strip_prefix(r.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
        })
    };
    let mut push = |field: String, span: Option<Span>, msg: String| {
        if !reported(&field) {
            out.push((field, span, msg));
        }
    };
    let job_span =
        |key: &str| spans.and_then(|s| s.job.get(key).cloned().or_else(|| s.job_table.clone()));
    let node_spans = |i: usize| {
        spans
            .and_then(|s| s.nodes.get(i))
            .cloned()
            .unwrap_or_default()
    };

    // [connections.<name>] (a parsed file already reported these while reading them)
    if spans.is_none() {
        for (name, spec) in &model.connections {
            for (key, message) in check_connection(name, spec) {
                let field = if key.is_empty() {
                    format!("connections.{name}")
                } else {
                    format!("connections.{name}.{key}")
                };
                push(field, None, message);
            }
        }
    }

    // [job]
    let job = &model.job;
    if job.name.trim().is_empty() {
        push(
            "job.name".into(),
            job_span("name"),
            "must not be empty".into(),
        );
    }
    if !is_ident(&job.id) {
        let defaulted = spans.is_some_and(|s| !s.job.contains_key("id"));
        let hint = if defaulted {
            " (it defaults to job.name; set `id` explicitly)"
        } else {
            ""
        };
        if !(defaulted && job.name.trim().is_empty()) {
            push(
                "job.id".into(),
                job_span("id"),
                format!(
                    "`{}` is not a valid id: use [A-Za-z0-9._-], starting with a letter or digit{hint}",
                    job.id
                ),
            );
        }
    }
    if !is_ident(&job.pipeline) {
        push(
            "job.pipeline".into(),
            job_span("pipeline"),
            format!(
                "`{}` is not a valid pipeline id: use [A-Za-z0-9._-], starting with a letter or digit",
                job.pipeline
            ),
        );
    }
    if job.parallelism < 1 {
        push(
            "job.parallelism".into(),
            job_span("parallelism"),
            format!("must be >= 1, found {}", job.parallelism),
        );
    }
    if job.state_shards < 1 {
        push(
            "job.state_shards".into(),
            job_span("state_shards"),
            format!("must be >= 1, found {}", job.state_shards),
        );
    }
    if !(1..=MAX_BATCH_RECORDS).contains(&job.batch_records) {
        push(
            "job.batch_records".into(),
            job_span("batch_records"),
            format!(
                "must be in 1..={MAX_BATCH_RECORDS}, found {}",
                job.batch_records
            ),
        );
    }
    if job.checkpoint_interval_ms == Some(0) {
        push(
            "job.checkpoint_interval_ms".into(),
            job_span("checkpoint_interval_ms"),
            "must be >= 1 (omit it to disable periodic checkpoints)".into(),
        );
    }
    if let Some(bytes) = job.state_memory_bytes
        && bytes < MIN_STATE_MEMORY_BYTES
    {
        push(
            "job.state_memory_bytes".into(),
            job_span("state_memory_bytes"),
            format!(
                "must be at least {MIN_STATE_MEMORY_BYTES} bytes (1 MiB), found {bytes} \
                 (omit it for the default budget)"
            ),
        );
    }
    if job.checkpoint_timeout_ms == Some(0) {
        push(
            "job.checkpoint_timeout_ms".into(),
            job_span("checkpoint_timeout_ms"),
            "must be >= 1 (omit it for the default, 60000)".into(),
        );
    }
    if job.checkpoint_every_records == Some(0) {
        push(
            "job.checkpoint_every_records".into(),
            job_span("checkpoint_every_records"),
            "must be >= 1 (omit it to disable record-count checkpoints)".into(),
        );
    }

    // Nodes
    let prefixes: Vec<String> = (0..model.nodes.len())
        .map(|i| model.node_field(i))
        .collect();
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    // An unknown reference is only reported when every node has a name; otherwise it
    // may well name the node whose name failed to parse.
    let names_complete = model.nodes.iter().all(|n| !n.name.is_empty());
    for (i, n) in model.nodes.iter().enumerate() {
        let p = &prefixes[i];
        let ns = node_spans(i);
        if n.name.is_empty() {
            push(
                format!("{p}.name"),
                ns.name.clone().or(ns.table.clone()),
                "must not be empty".into(),
            );
        } else if !is_ident(&n.name) {
            push(
                format!("{p}.name"),
                ns.name.clone(),
                format!(
                    "`{}` is not a valid node name: use [A-Za-z0-9._-], starting with a letter or digit",
                    n.name
                ),
            );
        } else if let Some(&first) = by_name.get(n.name.as_str()) {
            push(
                format!("{p}.name"),
                ns.name.clone(),
                format!("duplicate name `{}` (also {})", n.name, prefixes[first]),
            );
        } else {
            by_name.insert(&n.name, i);
        }
        let expected_path = model_path(n.kind, &n.name);
        if n.path != expected_path {
            push(
                format!("{p}.path"),
                None,
                format!("model path must be `{expected_path}`, found `{}`", n.path),
            );
        }
        if let Some(uid) = &n.uid
            && !is_ident(uid)
        {
            push(
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
                    push(
                        format!("{p}.uid"),
                        ns.uid.clone().or(ns.name.clone()),
                        format!(
                            "operator id `{id}` is also the id of {} (`{}`); operator ids must be unique (design §3.2)",
                            prefixes[first], model.nodes[first].name
                        ),
                    );
                }
            } else {
                by_id.insert(id, i);
            }
        }
        if let Err(e) = check_plugin_ref(&n.plugin) {
            push(format!("{p}.plugin"), ns.plugin.clone(), e);
        }
        if n.parallelism == Some(0) {
            push(
                format!("{p}.parallelism"),
                ns.parallelism.clone(),
                "must be >= 1, found 0".into(),
            );
        }
        if !n.config.is_object() {
            push(
                format!("{p}.config"),
                None,
                "must be a table (JSON object)".into(),
            );
        }
        let mut guests: HashMap<&str, usize> = HashMap::new();
        for (j, g) in n.grants.iter().enumerate() {
            let gspan = ns.grants.get(j).cloned().flatten();
            if !g.guest.starts_with('/') {
                push(
                    format!("{p}.grants[{j}].guest"),
                    gspan.clone(),
                    format!("guest path `{}` must be absolute (start with `/`)", g.guest),
                );
            } else if let Some(first) = guests.insert(&g.guest, j) {
                push(
                    format!("{p}.grants[{j}].guest"),
                    gspan.clone(),
                    format!(
                        "guest path `{}` is already granted by {p}.grants[{first}]",
                        g.guest
                    ),
                );
            }
            if g.host.is_empty() {
                push(
                    format!("{p}.grants[{j}].host"),
                    gspan,
                    "host directory must not be empty".into(),
                );
            }
        }
        let mut seen_connections: HashMap<&str, usize> = HashMap::new();
        for (j, c) in n.connections.iter().enumerate() {
            let cspan = ns.connections.get(j).cloned().flatten();
            let field = format!("{p}.connections[{j}]");
            if n.kind == PluginKind::Operator {
                push(
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
                push(
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
                push(
                    field,
                    cspan,
                    format!("connection `{c}` is already granted by {p}.connections[{first}]"),
                );
            }
        }
        match n.kind {
            PluginKind::Source => {
                if !n.inputs.is_empty() {
                    push(
                        format!("{p}.inputs"),
                        ns.inputs.clone(),
                        format!("source `{}` cannot have inputs", n.name),
                    );
                }
            }
            PluginKind::Operator | PluginKind::Sink => {
                if n.inputs.is_empty() {
                    push(
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

    // References
    // With duplicate names (reported above), a reference resolves to the first node.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, n) in model.nodes.iter().enumerate() {
        index.entry(n.name.as_str()).or_insert(i);
    }
    let mut adj: Vec<Vec<(usize, usize)>> = vec![Vec::new(); model.nodes.len()]; // (upstream, input)
    for (i, n) in model.nodes.iter().enumerate() {
        if n.kind == PluginKind::Source {
            continue;
        }
        let p = &prefixes[i];
        let ns = node_spans(i);
        for (j, input) in n.inputs.iter().enumerate() {
            let field = format!("{p}.inputs[{j}].from");
            let span = ns.input_items.get(j).and_then(|s| s.0.clone());
            if input.from.is_empty() {
                push(field, span, "must name an upstream node".into());
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
                        push(
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
                    push(field, span, format!("`{}` cannot consume itself", n.name));
                }
                Some(&u) if model.nodes[u].kind == PluginKind::Sink => {
                    push(
                        field,
                        span,
                        format!(
                            "`{}` is a sink ({}); sinks have no output to consume",
                            input.from, prefixes[u]
                        ),
                    );
                }
                Some(&u) => adj[i].push((u, j)),
            }
        }
    }

    // Cycles: DFS over upstream links; a back edge closes a cycle.
    let mut color = vec![0u8; model.nodes.len()]; // 0 new, 1 on stack, 2 done
    let mut stack: Vec<usize> = Vec::new();
    let mut cycles_seen: HashSet<Vec<usize>> = HashSet::new();
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
    let mut found = Vec::new();
    for v in 0..model.nodes.len() {
        if color[v] == 0 {
            dfs(v, &adj, &mut color, &mut stack, &mut found);
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
        let span = node_spans(first)
            .input_items
            .get(j)
            .and_then(|s| s.0.clone());
        push(
            format!("{}.inputs[{j}].from", prefixes[first]),
            span,
            format!("cycle: {}", names.join(" -> ")),
        );
    }

    // Keyed parallelism vs shard count.
    if job.state_shards >= 1 {
        for (i, n) in model.nodes.iter().enumerate() {
            let keyed = n
                .inputs
                .iter()
                .any(|x| x.partition == Some(PartitionPolicy::Hash));
            let par = n.parallelism.unwrap_or(job.parallelism);
            if keyed && par > job.state_shards {
                push(
                    "job.state_shards".into(),
                    job_span("state_shards"),
                    format!(
                        "state_shards = {} is less than the parallelism {par} of keyed {} `{}` ({}); \
                         every subtask of a keyed node needs at least one shard",
                        job.state_shards, n.kind, n.name, prefixes[i]
                    ),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the module docs.
    pub(crate) const EXAMPLE: &str = r#"[job]
name = "flights-per-carrier"
id = "flights-per-carrier"
pipeline = "main"
parallelism = 2
state_shards = 128
semantic = "strict-exactly-once"
checkpoint_interval_ms = 1000
batch_records = 1024

[[prepare]]
unzip = "data/flights.csv.zip"
member = "flights.csv"
into = "data"

[[source]]
name = "flights"
uid = "flights-source"
plugin = "file-source@0.1.0"
parallelism = 2
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", header = true }

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]
config = {}

[[operator]]
name = "per-carrier"
plugin = "keyed-aggregate@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["per-carrier"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { dir = "/output" }
"#;

    fn errs(text: &str) -> Diagnostics {
        parse_job_file("job.toml", text).expect_err("the file must be refused")
    }

    /// The diagnostic naming `field`, panicking with all diagnostics if there is none.
    fn at<'a>(d: &'a Diagnostics, field: &str) -> &'a Diagnostic {
        d.iter()
            .find(|x| x.field == field)
            .unwrap_or_else(|| panic!("no diagnostic for `{field}` in:\n{d}"))
    }

    const MINIMAL_JOB: &str = "[job]\nname = \"j\"\n";

    #[test]
    fn async_snapshots_defaults_to_true_and_stays_out_of_the_serialised_model() {
        let m = parse_job_file("job.toml", MINIMAL_JOB).unwrap();
        assert!(m.job.async_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(!json.contains("async_snapshots"), "{json}");
        let m = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}async_snapshots = false\n"),
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
        let m = parse_job_file("job.toml", MINIMAL_JOB).unwrap();
        assert!(m.job.incremental_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(!json.contains("incremental_snapshots"), "{json}");
        let m = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}incremental_snapshots = false\n"),
        )
        .unwrap();
        assert!(!m.job.incremental_snapshots);
        let json = serde_json::to_string(&m.job).unwrap();
        assert!(json.contains("\"incremental_snapshots\":false"), "{json}");
        let e = parse_job_file(
            "job.toml",
            &format!("{MINIMAL_JOB}incremental_snapshots = 1\n"),
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
                &format!("{MINIMAL_JOB}state_memory_bytes = {text}\n"),
            )
            .unwrap_or_else(|e| panic!("{text}: {e:?}"));
            assert_eq!(m.job.state_memory_bytes, Some(bytes), "{text}");
        }
        let m = parse_job_file("job.toml", MINIMAL_JOB).unwrap();
        assert_eq!(m.job.state_memory_bytes, None);
        assert_eq!(parse_size("3 MB"), Some(3_000_000));
        assert_eq!(parse_size("3 mb"), None);
        assert_eq!(parse_size("MiB"), None);
        assert_eq!(parse_size("99999999999999999999GiB"), None);
    }

    #[test]
    fn parses_the_full_example() {
        let m = parse_job_file("job.toml", EXAMPLE).unwrap();
        assert_eq!(m.job.name, "flights-per-carrier");
        assert_eq!(m.job.id, "flights-per-carrier");
        assert_eq!(m.job.pipeline, "main");
        assert_eq!(m.job.parallelism, 2);
        assert_eq!(m.job.state_shards, 128);
        assert_eq!(m.job.semantic, SemanticMode::StrictExactlyOnce);
        assert_eq!(m.job.checkpoint_interval_ms, Some(1000));
        assert_eq!(m.job.batch_records, 1024);
        assert_eq!(
            m.prepare,
            vec![PrepareStep::Unzip {
                archive: "data/flights.csv.zip".into(),
                member: "flights.csv".into(),
                into: "data".into(),
            }]
        );
        let names: Vec<_> = m.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["flights", "parse", "per-carrier", "out"]);
        let paths: Vec<_> = m.nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "sources/flights",
                "operators/parse",
                "operators/per-carrier",
                "sinks/out"
            ]
        );
        let src = &m.nodes[0];
        assert_eq!(src.kind, PluginKind::Source);
        assert_eq!(src.uid.as_deref(), Some("flights-source"));
        assert_eq!(
            src.plugin,
            PluginRef::Named {
                name: "file-source".into(),
                version: "0.1.0".into()
            }
        );
        assert_eq!(src.parallelism, Some(2));
        assert_eq!(
            src.grants,
            vec![Grant {
                guest: "/input".into(),
                host: "data".into(),
                writable: false
            }]
        );
        assert_eq!(
            src.config,
            serde_json::json!({"path": "/input/flights.csv", "header": true})
        );
        assert_eq!(
            m.nodes[2].inputs,
            vec![InputSpec {
                from: "parse".into(),
                partition: Some(PartitionPolicy::Hash),
                output: None,
            }]
        );
        assert_eq!(
            m.nodes[1].inputs,
            vec![InputSpec {
                from: "flights".into(),
                partition: None,
                output: None,
            }]
        );
        let sink = &m.nodes[3];
        assert_eq!(sink.kind, PluginKind::Sink);
        assert!(sink.grants[0].writable);
        assert_eq!(sink.grants[0].host, "$OUTPUT");
        assert_eq!(m.nodes[1].config, serde_json::json!({}));
        assert_eq!(m.nodes[2].config, serde_json::json!({}));
        assert_eq!(crate::model::operator_id(src).as_str(), "flights-source");
        assert_eq!(
            crate::model::operator_id(&m.nodes[1]).as_str(),
            "operators/parse"
        );
    }

    #[test]
    fn defaults_apply() {
        let m = parse_job_file(
            "j.toml",
            "[job]\nname = \"j\"\n[[source]]\nname = \"s\"\nplugin = \"p.wasm\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n",
        )
        .unwrap();
        assert_eq!(m.job.id, "j");
        assert_eq!(m.job.pipeline, DEFAULT_PIPELINE);
        assert_eq!(m.job.parallelism, 1);
        assert_eq!(m.job.state_shards, 128);
        assert_eq!(m.job.batch_records, 1024);
        assert_eq!(m.job.checkpoint_interval_ms, None);
        assert_eq!(m.job.semantic, SemanticMode::StrictExactlyOnce);
        assert!(m.prepare.is_empty());
        assert_eq!(
            m.nodes[0].plugin,
            PluginRef::Path {
                path: "p.wasm".into()
            }
        );
        assert_eq!(m.nodes[0].parallelism, None);
        assert!(m.nodes[0].grants.is_empty());
    }

    #[test]
    fn nodes_keep_file_order_across_kinds_and_config_subtables_work() {
        let text = format!(
            "{MINIMAL_JOB}[[operator]]\nname = \"o\"\nplugin = \"o@1.0.0\"\ninputs = [\"s\"]\n\
             [operator.config]\nfactor = 2.5\nnested = {{ when = 1979-05-27T07:32:00Z, list = [1, \"x\"] }}\n\
             [[source]]\nname = \"s\"\nplugin = \"s@1.0.0\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1.0.0\"\ninputs = [{{ from = \"o\", partition = \"SINGLETON\" }}]\n"
        );
        let m = parse_job_file("j.toml", &text).unwrap();
        let names: Vec<_> = m.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["o", "s", "k"]);
        assert_eq!(m.node_field(0), "operator[0]");
        assert_eq!(m.node_field(1), "source[0]");
        assert_eq!(
            m.nodes[0].config,
            serde_json::json!({"factor": 2.5, "nested": {"when": "1979-05-27T07:32:00Z", "list": [1, "x"]}})
        );
        assert_eq!(
            m.nodes[2].inputs[0].partition,
            Some(PartitionPolicy::Singleton)
        );
    }

    #[test]
    fn partition_and_semantic_names_are_case_insensitive() {
        for (s, p) in [
            ("forward", PartitionPolicy::Forward),
            ("HASH", PartitionPolicy::Hash),
            ("Rebalance", PartitionPolicy::Rebalance),
            ("broadcast", PartitionPolicy::Broadcast),
            ("UNION", PartitionPolicy::Union),
            ("singleton", PartitionPolicy::Singleton),
        ] {
            assert_eq!(parse_partition(s), Some(p));
        }
        assert_eq!(parse_partition("keyby"), None);
        assert_eq!(
            parse_semantic("EFFECTIVELY_ONCE"),
            Some(SemanticMode::EffectivelyOnce)
        );
        assert_eq!(parse_semantic("exactly-once"), None);
    }

    #[test]
    fn plugin_refs() {
        assert!(parse_plugin_ref("file-source@0.1.0").is_ok());
        assert!(parse_plugin_ref("a_b.c@1").is_ok());
        assert!(parse_plugin_ref("x@1.2.3-rc.1+build.5").is_ok());
        assert!(parse_plugin_ref("dir/x@y.wasm").is_ok());
        for bad in [
            "file-source",
            "@1.0.0",
            "x@",
            "x@1.2.3.4",
            "x@v1",
            "x y@1",
            ".wasm",
            "x@1.0.0-",
        ] {
            assert!(parse_plugin_ref(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let d = errs("[job]\nname = \"j\"\nparallelism = = 2\n");
        assert_eq!(d.0[0].line, Some(3), "{d}");
        assert!(d.0[0].column.is_some());
        assert_eq!(d.0[0].field, "");
        assert!(d.to_string().starts_with("job.toml:3:"), "{d}");
    }

    #[test]
    fn each_malformed_case_names_field_and_line() {
        // (file text, field, line)
        let src = "[[source]]\nname = \"s\"\nplugin = \"s@1.0.0\"\n"; // lines 3..5 after MINIMAL_JOB
        let cases: Vec<(String, &str, u32)> = vec![
            ("[job]\nnme = \"x\"\n".into(), "job.nme", 2),
            ("[job]\nnme = \"x\"\n".into(), "job.name", 1),
            ("[job]\nname = 5\n".into(), "job.name", 2),
            (
                format!("{MINIMAL_JOB}parallelism = \"2\"\n"),
                "job.parallelism",
                3,
            ),
            (
                format!("{MINIMAL_JOB}parallelism = 0\n"),
                "job.parallelism",
                3,
            ),
            (
                format!("{MINIMAL_JOB}parallelism = -1\n"),
                "job.parallelism",
                3,
            ),
            (
                format!("{MINIMAL_JOB}state_shards = 0\n"),
                "job.state_shards",
                3,
            ),
            (
                format!("{MINIMAL_JOB}batch_records = 65537\n"),
                "job.batch_records",
                3,
            ),
            (
                format!("{MINIMAL_JOB}batch_records = 0\n"),
                "job.batch_records",
                3,
            ),
            (
                format!("{MINIMAL_JOB}checkpoint_interval_ms = 0\n"),
                "job.checkpoint_interval_ms",
                3,
            ),
            (
                format!("{MINIMAL_JOB}checkpoint_timeout_ms = 0\n"),
                "job.checkpoint_timeout_ms",
                3,
            ),
            (
                format!("{MINIMAL_JOB}checkpoint_every_records = 0\n"),
                "job.checkpoint_every_records",
                3,
            ),
            (
                format!("{MINIMAL_JOB}state_memory_bytes = 1000\n"),
                "job.state_memory_bytes",
                3,
            ),
            (
                format!("{MINIMAL_JOB}state_memory_bytes = \"lots\"\n"),
                "job.state_memory_bytes",
                3,
            ),
            (
                format!("{MINIMAL_JOB}state_memory_bytes = \"12 TB\"\n"),
                "job.state_memory_bytes",
                3,
            ),
            (
                format!("{MINIMAL_JOB}semantic = \"exactly-once\"\n"),
                "job.semantic",
                3,
            ),
            (format!("{MINIMAL_JOB}id = \"a/b\"\n"), "job.id", 3),
            ("[job]\nname = \"my job\"\n".into(), "job.id", 1),
            (format!("{MINIMAL_JOB}pipeline = \"\"\n"), "job.pipeline", 3),
            (format!("{MINIMAL_JOB}[extra]\n"), "extra", 3),
            (
                format!("{MINIMAL_JOB}[[prepare]]\nunzip = \"a.zip\"\nmember = \"m\"\n"),
                "prepare[0].into",
                3,
            ),
            (
                format!("{MINIMAL_JOB}[[prepare]]\ncopy = \"a\"\n"),
                "prepare[0].copy",
                4,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nplugin = \"s@1.0.0\"\n"),
                "source[0].name",
                3,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nname = \"s\"\n"),
                "source[0].plugin",
                3,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nname = \"s\"\nplugin = \"file-source\"\n"),
                "source[0].plugin",
                5,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nname = \"s\"\nplugin = \"s@x.y\"\n"),
                "source[0].plugin",
                5,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nname = \"a b\"\nplugin = \"s@1\"\n"),
                "source[0].name",
                4,
            ),
            (
                format!("{MINIMAL_JOB}[[source]]\nname = \"\"\nplugin = \"s@1\"\n"),
                "source[0].name",
                4,
            ),
            (
                format!("{MINIMAL_JOB}{src}colour = 1\n"),
                "source[0].colour",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}parallelism = 0\n"),
                "source[0].parallelism",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}inputs = [\"x\"]\n"),
                "source[0].inputs",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}config = 3\n"),
                "source[0].config",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}config = {{ x = nan }}\n"),
                "source[0].config.x",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}grants = [{{ guest = \"input\", host = \"d\" }}]\n"),
                "source[0].grants[0].guest",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}grants = [{{ guest = \"/in\" }}]\n"),
                "source[0].grants[0].host",
                6,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}grants = [{{ guest = \"/in\", host = \"d\", mode = \"rw\" }}]\n"
                ),
                "source[0].grants[0].mode",
                6,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}grants = [{{ guest = \"/in\", host = \"d\", writable = \"yes\" }}]\n"
                ),
                "source[0].grants[0].writable",
                6,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}grants = [{{ guest = \"/in\", host = \"a\" }}, {{ guest = \"/in\", host = \"b\" }}]\n"
                ),
                "source[0].grants[1].guest",
                6,
            ),
            (
                format!("{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\n"),
                "operator[0].inputs",
                6,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\n\ninputs = [\"s\", \"nope\"]\n"
                ),
                "operator[0].inputs[1].from",
                10,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [{{ from = \"s\", partition = \"keyby\" }}]\n"
                ),
                "operator[0].inputs[0].partition",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [{{ partition = \"hash\" }}]\n"
                ),
                "operator[0].inputs[0].from",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [{{ from = \"s\", key = \"k\" }}]\n"
                ),
                "operator[0].inputs[0].key",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [3]\n"
                ),
                "operator[0].inputs[0]",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = \"s\"\n"
                ),
                "operator[0].inputs",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"s\"\nplugin = \"o@1\"\ninputs = [\"s\"]\n"
                ),
                "operator[0].name",
                7,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n[[sink]]\nname = \"k2\"\nplugin = \"k@1\"\ninputs = [\"k\"]\n"
                ),
                "sink[1].inputs[0].from",
                13,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}uid = \"u\"\n[[sink]]\nname = \"k\"\nuid = \"u\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n"
                ),
                "sink[0].uid",
                9,
            ),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[sink]]\nname = \"k\"\nuid = \"sources/s\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n"
                ),
                "sink[0].uid",
                8,
            ),
            (
                format!(
                    "{MINIMAL_JOB}state_shards = 2\n{src}parallelism = 2\n[[sink]]\nname = \"k\"\nplugin = \"k@1\"\nparallelism = 3\ninputs = [{{ from = \"s\", partition = \"hash\" }}]\n"
                ),
                "job.state_shards",
                3,
            ),
            (format!("source = 3\n{MINIMAL_JOB}"), "source", 1),
            (
                format!(
                    "{MINIMAL_JOB}{src}[[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [\"o\"]\n"
                ),
                "operator[0].inputs[0].from",
                9,
            ),
            ("name = \"x\"\n".into(), "name", 1),
        ];
        for (text, field, line) in cases {
            let d = errs(&text);
            let x = at(&d, field);
            assert_eq!(
                x.line,
                Some(line),
                "line of `{field}` in:\n{text}\n---\n{d}"
            );
            assert_eq!(x.file, "job.toml");
            assert!(!x.message.is_empty());
        }
        // A file without [job] names the table, without a position.
        let d = errs("");
        assert_eq!(at(&d, "job").line, None);
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

    fn with_connections(connections: &str, sink_extra: &str) -> String {
        format!(
            "{MINIMAL_JOB}{connections}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n{sink_extra}"
        )
    }

    #[test]
    fn connections_are_declared_by_name_and_granted_to_sinks() {
        let pg = "[connections.pg]\nkind = \"postgres\"\nurl = \"postgres://u@127.0.0.1:5432/db\"\npassword_env = \"PGPASSWORD\"\n";
        let m = parse_job_file(
            "job.toml",
            &with_connections(pg, "connections = [\"pg\"]\n"),
        )
        .unwrap();
        assert_eq!(m.connections["pg"].kind, "postgres");
        assert_eq!(
            m.connections["pg"].password_env.as_deref(),
            Some("PGPASSWORD")
        );
        assert_eq!(m.node("k").unwrap().connections, ["pg"]);
        validate_model(&m).unwrap();
        // Declared but not granted: fine (the sink just cannot open it).
        assert!(parse_job_file("job.toml", &with_connections(pg, "")).is_ok());

        let d = errs(&with_connections(pg, "connections = [\"pgx\"]\n"));
        let e = at(&d, "sink[0].connections[0]");
        assert!(
            e.message
                .contains("connection `pgx` is not declared; declared: `pg`"),
            "{d}"
        );
        assert!(e.line.is_some());
        let d = errs(&with_connections("", "connections = [\"pg\", \"pg\"]\n"));
        assert!(
            at(&d, "sink[0].connections[0]")
                .message
                .contains("add a `[connections.pg]` table"),
            "{d}"
        );

        for (conn, field, needle) in [
            (
                "url = \"postgres://u:s3cret@h/db\"",
                "connections.pg.url",
                "holds a password",
            ),
            (
                "url = \"postgres://u@h/db?password=s3cret\"",
                "connections.pg.url",
                "`password` parameter",
            ),
            // The two forms the PostgreSQL driver authenticated with while this check let
            // them through: a percent-encoded parameter name and a `/` in the password.
            (
                "url = \"postgres://u@h:5432/db?pass%77ord=s3cret\"",
                "connections.pg.url",
                "a credential",
            ),
            (
                "url = \"postgres://u:pa/s3cret@h/db\"",
                "connections.pg.url",
                "holds a password",
            ),
            (
                "url = \"host=h user=u\"",
                "connections.pg.url",
                "expected a URL",
            ),
            (
                "url = \"postgres://u@h/db\"\npassword_env = \"s3cret pw\"",
                "connections.pg.password_env",
                "variable name",
            ),
            (
                "url = \"postgres://u@h/db\"\nsecret = 1",
                "connections.pg.secret",
                "unknown key",
            ),
            (
                "url = \"postgres://u@h/db\"\nca_file = \"ca.pem\"",
                "connections.pg.ca_file",
                "not supported by this host yet",
            ),
        ] {
            let text = with_connections(
                &format!("[connections.pg]\nkind = \"postgres\"\n{conn}\n"),
                "",
            );
            let d = errs(&text);
            let e = at(&d, field);
            assert!(e.message.contains(needle), "{d}");
            assert!(
                !d.to_string().contains("s3cret"),
                "a password is echoed: {d}"
            );
        }
        let d = errs(&with_connections(
            "[connections.pg]\nkind = \"mysql\"\nurl = \"x\"\n",
            "",
        ));
        assert!(
            at(&d, "connections.pg.kind")
                .message
                .contains("unknown connection kind"),
            "{d}"
        );

        // Sources and sinks take connections; operators do not.
        let text = format!(
            "{MINIMAL_JOB}{pg}[[source]]\nname = \"s\"\nplugin = \"s@1\"\nconnections = [\"pg\"]\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"s\"]\n"
        );
        let m = parse_job_file("job.toml", &text).unwrap();
        assert_eq!(m.node("s").unwrap().connections, ["pg"]);
        let text = format!(
            "{MINIMAL_JOB}{pg}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[operator]]\nname = \"o\"\nplugin = \"o@1\"\ninputs = [\"s\"]\nconnections = [\"pg\"]\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [\"o\"]\n"
        );
        let d = errs(&text);
        assert!(
            at(&d, "operator[0].connections[0]")
                .message
                .contains("only sources and sinks"),
            "{d}"
        );
    }

    #[test]
    fn nats_and_redis_connections_take_their_own_schemes_and_no_password() {
        for (kind, url) in [
            ("nats", "nats://127.0.0.1:4222"),
            ("nats", "tls://nop@queue.example:4222"),
            ("redis", "redis://127.0.0.1:6379/0"),
            ("redis", "rediss://nop@cache.example:6380"),
        ] {
            let c = format!("[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\n");
            let m = parse_job_file("job.toml", &with_connections(&c, "connections = [\"q\"]\n"))
                .unwrap_or_else(|d| panic!("{kind} {url}: {d}"));
            assert_eq!(m.connections["q"].kind, kind);
        }
        for (kind, url, needle) in [
            ("nats", "redis://127.0.0.1:6379", "expected a URL `nats://"),
            ("redis", "nats://127.0.0.1:4222", "expected a URL `redis://"),
            ("postgres", "redis://h", "expected a URL `postgres://"),
            ("nats", "nats://u:s3cret@h:4222", "holds a password"),
            ("redis", "redis://:s3cret@h:6379", "holds a password"),
            (
                "redis",
                "redis://h:6379/0?password=s3cret",
                "`password` parameter",
            ),
        ] {
            let c = format!("[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\n");
            let d = errs(&with_connections(&c, ""));
            assert!(
                at(&d, "connections.q.url").message.contains(needle),
                "{kind} {url}: {d}"
            );
            assert!(
                !d.to_string().contains("s3cret"),
                "a password is echoed: {d}"
            );
        }
        // ca_file: only with a TLS URL.
        for (kind, url) in [("nats", "tls://h:4222"), ("redis", "rediss://h:6380")] {
            let c = format!(
                "[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\nca_file = \"certs/ca.pem\"\n"
            );
            let m = parse_job_file("job.toml", &with_connections(&c, "connections = [\"q\"]\n"))
                .unwrap_or_else(|d| panic!("{kind} {url}: {d}"));
            assert_eq!(m.connections["q"].ca_file.as_deref(), Some("certs/ca.pem"));
        }
        for (kind, url) in [("nats", "nats://h:4222"), ("redis", "redis://h:6379")] {
            let c = format!(
                "[connections.q]\nkind = \"{kind}\"\nurl = \"{url}\"\nca_file = \"ca.pem\"\n"
            );
            let d = errs(&with_connections(&c, ""));
            assert!(
                at(&d, "connections.q.ca_file")
                    .message
                    .contains("goes with a TLS URL"),
                "{kind} {url}: {d}"
            );
        }
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

    #[test]
    fn a_shape_error_is_not_repeated_by_semantic_checks() {
        // Regression: a non-string input also produced "must name an upstream node".
        let text = format!(
            "{MINIMAL_JOB}[[source]]\nname = \"s\"\nplugin = \"s@1\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"k@1\"\ninputs = [3]\n"
        );
        let d = errs(&text);
        assert_eq!(d.len(), 1, "{d}");
        assert_eq!(d.0[0].field, "sink[0].inputs[0]");
    }

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

    #[test]
    fn every_problem_is_reported_together_in_file_order() {
        let text = r#"[job]
name = "j"
parallelism = 0
colour = "red"

[[source]]
name = "s"
plugin = "nope"
inputs = ["x"]

[[operator]]
name = "s"
plugin = "o@1.0.0"
inputs = [{ from = "s", partition = "sideways" }]

[[sink]]
name = "k"
plugin = "k@1.0.0"
inputs = []
grants = [{ guest = "out", host = "$OUTPUT" }]
"#;
        let d = errs(text);
        let got: Vec<(String, Option<u32>)> = d.iter().map(|x| (x.field.clone(), x.line)).collect();
        let want = [
            ("job.parallelism", 3),
            ("job.colour", 4),
            ("source[0].plugin", 8),
            ("source[0].inputs", 9),
            ("operator[0].name", 12),
            ("operator[0].inputs[0].partition", 14),
            ("sink[0].inputs", 19),
            ("sink[0].grants[0].guest", 20),
        ];
        for (field, line) in want {
            assert!(
                got.contains(&(field.to_owned(), Some(line))),
                "missing {field} at line {line} in:\n{d}"
            );
        }
        // Sorted by position.
        let lines: Vec<u32> = d.iter().filter_map(|x| x.line).collect();
        assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{d}");
        assert!(d.to_string().lines().count() >= want.len());
    }

    #[test]
    fn validate_model_checks_models_built_elsewhere() {
        let m = parse_job_file("job.toml", EXAMPLE).unwrap();
        validate_model(&m).unwrap();
        let mut bad = m.clone();
        bad.nodes[1].path = "operators/other".into();
        bad.nodes[3].inputs.clear();
        let d = validate_model(&bad).unwrap_err();
        assert!(d.mentions("operator[0].path"), "{d}");
        assert!(d.mentions("sink[0].inputs"), "{d}");
        assert!(d.iter().all(|x| x.line.is_none() && x.file.is_empty()));
        let d = d.with_file("job.toml");
        assert!(d.iter().all(|x| x.file == "job.toml"));
    }

    #[test]
    fn with_parallelism_overrides_everything() {
        let m = parse_job_file("job.toml", EXAMPLE)
            .unwrap()
            .with_parallelism(5);
        assert_eq!(m.job.parallelism, 5);
        assert!(m.nodes.iter().all(|n| m.parallelism_of(n) == 5));
    }

    #[test]
    fn structural_ids_are_stable_and_topology_sensitive() {
        let m = parse_job_file("job.toml", EXAMPLE).unwrap();
        let node = &m.nodes[2];
        let up = [OperatorIdLike::parse()];
        let a = crate::model::structural_operator_id(node, &up, 0);
        let b = crate::model::structural_operator_id(node, &up, 0);
        assert_eq!(a, b);
        assert!(a.as_str().starts_with("struct-"));
        assert_eq!(a.as_str().len(), "struct-".len() + 20);
        // Config and version do not change it; ordinal, plugin and upstream do.
        let mut changed = node.clone();
        changed.config = serde_json::json!({"x": 1});
        changed.plugin = PluginRef::Named {
            name: "keyed-aggregate".into(),
            version: "9.9.9".into(),
        };
        assert_eq!(crate::model::structural_operator_id(&changed, &up, 0), a);
        assert_ne!(crate::model::structural_operator_id(node, &up, 1), a);
        let other_up = [nop_stream_api::OperatorId::new("operators/other")];
        assert_ne!(crate::model::structural_operator_id(node, &other_up, 0), a);
        changed.plugin = PluginRef::Named {
            name: "other".into(),
            version: "0.1.0".into(),
        };
        assert_ne!(crate::model::structural_operator_id(&changed, &up, 0), a);
    }

    struct OperatorIdLike;
    impl OperatorIdLike {
        fn parse() -> nop_stream_api::OperatorId {
            nop_stream_api::OperatorId::new("operators/parse")
        }
    }
}
