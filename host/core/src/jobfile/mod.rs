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
//! parallelism = 2                   # default 1; 1..=32768
//! state_shards = 128                # default 128; 1..=32768, >= every keyed parallelism
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
//!                                   # default 0, no idleness, no alignment; alignment
//!                                   # spans the source's subtasks on every cluster node
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

mod connection;
mod reader;
mod rules;

pub use connection::check_connection;

use crate::diag::{Diagnostic, Diagnostics};
use crate::model::{NodeSpec, PluginRef, StreamModel};
use connection::read_connections;
use nop_stream_api::{PartitionPolicy, PluginKind, SemanticMode};
use reader::{
    Cx, ModelSpans, NodeSpans, check_keys, find, placeholder_job, read_job, read_node,
    read_prepare, tables_of,
};
use rules::check_model;
use std::collections::HashSet;
use std::ops::Range;
use toml::de::{DeTable, DeValue};

/// Default of `job.parallelism`.
pub const DEFAULT_PARALLELISM: u32 = 1;
/// Default of `job.state_shards` (design §3.4: fixed for the job's life).
pub const DEFAULT_STATE_SHARDS: u32 = 128;
/// Largest allowed `job.state_shards`: Flink's bound on `maxParallelism` (2^15). The plan
/// lists every shard's owner per HASH edge, so the bound also bounds the plan.
pub const MAX_STATE_SHARDS: u32 = 1 << 15;
/// Largest allowed parallelism (`job.parallelism`, a node's `parallelism`, `-p`): as
/// many subtasks as state shards can have. The plan lists every subtask and channel.
pub const MAX_PARALLELISM: u32 = 1 << 15;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Grant, InputSpec, PrepareStep};

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

    pub(super) fn errs(text: &str) -> Diagnostics {
        parse_job_file("job.toml", text).expect_err("the file must be refused")
    }

    /// The diagnostic naming `field`, panicking with all diagnostics if there is none.
    pub(super) fn at<'a>(d: &'a Diagnostics, field: &str) -> &'a Diagnostic {
        d.iter()
            .find(|x| x.field == field)
            .unwrap_or_else(|| panic!("no diagnostic for `{field}` in:\n{d}"))
    }

    pub(super) const MINIMAL_JOB: &str = "[job]\nname = \"j\"\n";
    /// A source and a sink to follow [`MINIMAL_JOB`] (and any `[job]` keys added to it),
    /// for a job that must parse: a job reads from one and writes into the other.
    pub(super) const ENDS: &str = "[[source]]\nname = \"s\"\nplugin = \"src@1.0.0\"\n\
                                   [[sink]]\nname = \"k\"\nplugin = \"snk@1.0.0\"\ninputs = [\"s\"]\n";

    /// A job file cut short after `[job]` passed `validate` ("ok (0 operators, 0 tasks)")
    /// and failed `run` with an internal error, every task having ended before the final
    /// epoch committed (a user's report).
    #[test]
    fn a_job_without_a_source_or_a_sink_is_refused() {
        let d = errs(MINIMAL_JOB);
        assert_eq!(
            at(&d, "source").message,
            "the job declares no [[source]]; a job needs at least one"
        );
        assert_eq!(
            at(&d, "sink").message,
            "the job declares no [[sink]]; a job needs at least one"
        );
        let source_only = "[[source]]\nname = \"s\"\nplugin = \"src@1.0.0\"\n";
        let d = errs(&format!("{MINIMAL_JOB}{source_only}"));
        assert_eq!(d.len(), 1, "{d}");
        assert_eq!(at(&d, "sink").field, "sink");
        assert!(parse_job_file("job.toml", &format!("{MINIMAL_JOB}{ENDS}")).is_ok());
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
            // Before: no upper bound, and planning one shard owner per shard ran out of
            // memory.
            (
                format!("{MINIMAL_JOB}state_shards = 4294967295\n"),
                "job.state_shards",
                3,
            ),
            (
                format!("{MINIMAL_JOB}parallelism = 32769\n"),
                "job.parallelism",
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
                format!("{MINIMAL_JOB}{src}parallelism = 4000000000\n"),
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
    fn with_parallelism_sets_the_default_and_keeps_each_node_own() {
        let m = parse_job_file("job.toml", EXAMPLE)
            .unwrap()
            .with_parallelism(5);
        assert_eq!(m.job.parallelism, 5);
        for n in &m.nodes {
            let want = if n.name == "flights" { 2 } else { 5 };
            assert_eq!(m.parallelism_of(n), want, "{}", n.name);
        }
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
