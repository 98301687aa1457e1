//! A small plan compiled from a job file against a fake plugin catalog, shared by the
//! coordinator's tests.

#![allow(dead_code)]

use nop_stream_api::{
    PluginInfo, PluginKind, SinkCapability, SourceCapability, StateDescriptor, StateKind,
};
use nop_stream_core::{
    NodeSpec, PartitionedPlan, PluginCatalog, job_graph, parse_job_file, partitioned_plan,
    stream_graph,
};

/// source (p) -> hash -> keyed aggregate (p) -> sink (p).
pub fn job(parallelism: u32, shards: u32) -> String {
    format!(
        r#"[job]
name = "coord-test"
parallelism = {parallelism}
state_shards = {shards}
checkpoint_interval_ms = 1000

[[source]]
name = "src"
plugin = "src@1.0.0"

[[operator]]
name = "agg"
plugin = "agg@1.0.0"
inputs = [{{ from = "src", partition = "hash" }}]

[[sink]]
name = "out"
plugin = "out@1.0.0"
inputs = ["agg"]
"#
    )
}

/// A catalog of the three fake plugins `src`, `agg` (keyed state `acc`) and `out`.
pub struct Fake;

fn info(name: &str, kind: PluginKind) -> PluginInfo {
    PluginInfo {
        name: name.into(),
        version: "1.0.0".into(),
        kind,
        description: String::new(),
        states: if name == "agg" {
            vec![StateDescriptor {
                name: "acc".into(),
                kind: StateKind::Value,
                schema_version: 1,
                codec: "postcard".into(),
                schema_sha256: None,
            }]
        } else {
            Vec::new()
        },
        source_capability: (kind == PluginKind::Source).then_some(SourceCapability::Replayable),
        sink_capability: (kind == PluginKind::Sink).then_some(SinkCapability::TwoPhaseCommit),
        config_schema: "{}".into(),
        side_outputs: Vec::new(),
        model: None,
        operator_states: Vec::new(),
    }
}

impl PluginCatalog for Fake {
    fn describe(&self, node: &NodeSpec) -> Result<PluginInfo, String> {
        let name = node.plugin.to_string();
        let name = name.split('@').next().unwrap_or_default().to_owned();
        Ok(match name.as_str() {
            "src" => info("src", PluginKind::Source),
            "agg" => info("agg", PluginKind::Operator),
            "out" => info("out", PluginKind::Sink),
            other => return Err(format!("unknown plugin {other}")),
        })
    }
}

/// The plan of [`job`].
pub fn plan(parallelism: u32, shards: u32) -> PartitionedPlan {
    let m = parse_job_file("job.toml", &job(parallelism, shards)).unwrap_or_else(|d| panic!("{d}"));
    let g = stream_graph(&m, &Fake).unwrap_or_else(|d| panic!("{d}"));
    partitioned_plan(&job_graph(&g))
}

/// Two sources, `fast` (p) and `slow` (q), each into its own sink: their splits may share
/// ids, as two file sources' do.
pub fn two_sources_job(p: u32, q: u32) -> String {
    format!(
        r#"[job]
name = "coord-two-sources"
parallelism = 1
state_shards = 8
checkpoint_interval_ms = 1000

[[source]]
name = "fast"
plugin = "src@1.0.0"
parallelism = {p}

[[source]]
name = "slow"
plugin = "src@1.0.0"
parallelism = {q}

[[sink]]
name = "fast_out"
plugin = "out@1.0.0"
parallelism = {p}
inputs = ["fast"]

[[sink]]
name = "slow_out"
plugin = "out@1.0.0"
parallelism = {q}
inputs = ["slow"]
"#
    )
}

/// The plan of [`two_sources_job`].
pub fn two_sources_plan(p: u32, q: u32) -> PartitionedPlan {
    let m = parse_job_file("job.toml", &two_sources_job(p, q)).unwrap_or_else(|d| panic!("{d}"));
    let g = stream_graph(&m, &Fake).unwrap_or_else(|d| panic!("{d}"));
    partitioned_plan(&job_graph(&g))
}

/// The error of the scripted workers: a coordinator error (fatal) or a task failure of
/// a given class.
#[derive(Debug)]
pub enum FakeError {
    /// The coordinator failed.
    Coord(nop_stream_coordinator::CoordinatorError),
    /// A task failed with this class and message.
    Task(nop_stream_proto::FailureClass, String),
}

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FakeError::Coord(e) => write!(f, "{e}"),
            FakeError::Task(_, m) => f.write_str(m),
        }
    }
}

impl nop_stream_proto::TaskError for FakeError {
    fn class(&self) -> nop_stream_proto::FailureClass {
        match self {
            FakeError::Coord(_) => nop_stream_proto::FailureClass::Fatal,
            FakeError::Task(c, _) => *c,
        }
    }
}

impl From<nop_stream_coordinator::CoordinatorError> for FakeError {
    fn from(e: nop_stream_coordinator::CoordinatorError) -> Self {
        FakeError::Coord(e)
    }
}
