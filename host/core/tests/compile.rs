//! Plan compilation end to end against a fake plugin catalog: layers, chaining, channels,
//! fingerprints, JSON round trips and semantic-mode refusals.

use nop_stream_api::{
    PartitionPolicy, PluginInfo, PluginKind, SemanticMode, SinkCapability, SourceCapability,
    StateDescriptor, StateKind, StateShardId, SubtaskIndex,
};
use nop_stream_core::*;
use serde::{Serialize, de::DeserializeOwned};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;

const EXAMPLE: &str = r#"[job]
name = "flights-per-carrier"
parallelism = 2
state_shards = 128
checkpoint_interval_ms = 1000

[[source]]
name = "flights"
uid = "flights-source"
plugin = "file-source@0.1.0"
grants = [{ guest = "/input", host = "data" }]
config = { path = "/input/flights.csv", header = true }

[[operator]]
name = "parse"
plugin = "flights-mapper@0.1.0"
inputs = ["flights"]

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

fn info(name: &str, version: &str, kind: PluginKind) -> PluginInfo {
    PluginInfo {
        name: name.into(),
        version: version.into(),
        kind,
        description: format!("{name} test plugin"),
        states: Vec::new(),
        source_capability: (kind == PluginKind::Source).then_some(SourceCapability::Replayable),
        sink_capability: (kind == PluginKind::Sink).then_some(SinkCapability::StagedAtomicCommit),
        config_schema: "{}".into(),
        side_outputs: Vec::new(),
        model: None,
        operator_states: Vec::new(),
    }
}

/// A catalog keyed by the reference as written (`name@version` or path).
#[derive(Clone)]
struct Fake(HashMap<String, PluginInfo>);

impl Fake {
    fn new() -> Self {
        let mut f = Fake(HashMap::new());
        f.add(info("file-source", "0.1.0", PluginKind::Source));
        f.add(info("file-source", "0.2.0", PluginKind::Source));
        f.add(info("flights-mapper", "0.1.0", PluginKind::Operator));
        f.add(info("map", "1.0.0", PluginKind::Operator));
        let mut agg = info("keyed-aggregate", "0.1.0", PluginKind::Operator);
        agg.states.push(StateDescriptor {
            name: "counts".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "postcard".into(),
            schema_sha256: None,
        });
        f.add(agg);
        f.add(info("jsonl-sink", "0.1.0", PluginKind::Sink));
        f
    }

    fn add(&mut self, i: PluginInfo) {
        self.0.insert(i.reference(), i);
    }

    fn with(mut self, r: &str, edit: impl FnOnce(&mut PluginInfo)) -> Self {
        edit(self.0.get_mut(r).expect("known plugin"));
        self
    }
}

impl PluginCatalog for Fake {
    fn describe(&self, node: &NodeSpec) -> Result<PluginInfo, String> {
        self.0
            .get(&node.plugin.to_string())
            .cloned()
            .ok_or_else(|| format!("no plugin `{}` in the plugin path", node.plugin))
    }
}

fn model(text: &str) -> StreamModel {
    parse_job_file("job.toml", text).unwrap_or_else(|d| panic!("{d}"))
}

fn plan_of(m: &StreamModel, cat: &Fake) -> PartitionedPlan {
    let s = stream_graph(m, cat).unwrap_or_else(|d| panic!("{d}"));
    partitioned_plan(&job_graph(&s))
}

fn refused(m: &StreamModel, cat: &Fake) -> Diagnostics {
    stream_graph(m, cat).expect_err("must be refused")
}

fn roundtrip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: &T) {
    let json = serde_json::to_string_pretty(v).unwrap();
    let back: T = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, v, "JSON round trip changed the value:\n{json}");
}

fn opts() -> DeploymentOptions {
    DeploymentOptions::embedded("state/", "file:checkpoints")
}

#[test]
fn example_compiles_through_every_layer() {
    let m = model(EXAMPLE);
    let s = stream_graph(&m, &Fake::new()).unwrap();
    assert_eq!(s.job.job_id.as_str(), "flights-per-carrier");
    assert_eq!(s.job.state_shard_count, 128);
    let ids: Vec<_> = s.nodes.iter().map(|n| n.operator_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "flights-source",
            "operators/parse",
            "operators/per-carrier",
            "sinks/out"
        ]
    );
    assert_eq!(s.nodes[2].plugin_info.states[0].name, "counts");
    let policies: Vec<_> = s.edges.iter().map(|e| e.partition).collect();
    assert_eq!(
        policies,
        [
            PartitionPolicy::Forward,
            PartitionPolicy::Hash,
            PartitionPolicy::Forward
        ]
    );

    let j = job_graph(&s);
    let vertices: Vec<(&str, Vec<&str>, bool)> = j
        .vertices
        .iter()
        .map(|v| {
            (
                v.id.as_str(),
                v.operators.iter().map(|o| o.name.as_str()).collect(),
                v.keyed,
            )
        })
        .collect();
    assert_eq!(
        vertices,
        [
            ("flights-source", vec!["flights", "parse"], false),
            ("operators/per-carrier", vec!["per-carrier", "out"], true),
        ]
    );
    assert_eq!(j.edges.len(), 1);
    assert_eq!(
        j.edges[0].id.as_str(),
        "flights-source->operators/per-carrier#0"
    );
    assert_eq!(j.edges[0].partition, PartitionPolicy::Hash);

    let p = partitioned_plan(&j);
    assert_eq!(p.ack_set.len(), 4);
    assert_eq!(
        p.ack_set[0].to_string(),
        "flights-per-carrier/main/flights-source/0"
    );
    let keyed = p.vertex(&"operators/per-carrier".into()).unwrap();
    assert_eq!(keyed.subtasks[0].shards.first(), Some(&StateShardId(0)));
    assert_eq!(keyed.subtasks[0].shards.len(), 64);
    assert_eq!(keyed.subtasks[1].shards.first(), Some(&StateShardId(64)));
    assert_eq!(keyed.subtasks[1].shards.last(), Some(&StateShardId(127)));
    let source = p.vertex(&"flights-source".into()).unwrap();
    assert!(source.subtasks.iter().all(|t| t.shards.is_empty()));
    let e = &p.edges[0];
    assert_eq!(e.channels.len(), 4);
    assert_eq!(e.shard_owners.len(), 128);
    assert_eq!(e.shard_owners[63], SubtaskIndex(0));
    assert_eq!(e.shard_owners[64], SubtaskIndex(1));
    for t in &keyed.subtasks {
        for s in &t.shards {
            assert_eq!(e.shard_owners[s.0 as usize], t.index);
        }
        // Inputs: one channel from each upstream subtask, in upstream order.
        let ups: Vec<u32> = t.inputs.iter().map(|c| c.upstream.0).collect();
        assert_eq!(ups, [0, 1]);
        assert!(t.outputs.is_empty());
    }
    assert_eq!(source.subtasks[1].outputs.len(), 2);
    assert!(source.subtasks[1].inputs.is_empty());
    assert_eq!(
        source.subtasks[1].outputs[0].to_string(),
        "flights-source->operators/per-carrier#0/1/0/0"
    );
    assert_eq!(p.fingerprint.len(), 64);
    assert_eq!(p.fingerprint, fingerprint_of(&p));

    let d = deployment_plan(&p, &opts()).unwrap();
    assert_eq!(d.plan_fingerprint, p.fingerprint);
    assert_eq!(d.tasks.len(), 4);
    assert_eq!(d.checkpoint_storage, "file:checkpoints");
    assert_eq!(
        d.tasks[3].state_backend,
        "redb:state/operators/per-carrier/1.redb"
    );
    assert!(
        d.tasks
            .iter()
            .all(|t| t.node == "local" && t.transport == "local-queue")
    );
}

#[test]
fn every_layer_round_trips_through_json() {
    let m = model(EXAMPLE);
    let s = stream_graph(&m, &Fake::new()).unwrap();
    let j = job_graph(&s);
    let p = partitioned_plan(&j);
    let d = deployment_plan(&p, &opts()).unwrap();
    roundtrip(&m);
    roundtrip(&s);
    roundtrip(&j);
    roundtrip(&p);
    roundtrip(&d);
    // A plan read back has the same fingerprint.
    let back: PartitionedPlan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(fingerprint_of(&back), p.fingerprint);
}

#[test]
fn fingerprint_is_stable_and_tracks_changes() {
    let cat = Fake::new();
    let a = plan_of(&model(EXAMPLE), &cat);
    let b = plan_of(&model(EXAMPLE), &cat);
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_eq!(a, b);

    // Key order in the file does not matter.
    let reordered = EXAMPLE.replace(
        "config = { path = \"/input/flights.csv\", header = true }",
        "config = { header = true, path = \"/input/flights.csv\" }",
    );
    assert_eq!(plan_of(&model(&reordered), &cat).fingerprint, a.fingerprint);

    let rescaled = plan_of(&model(EXAMPLE).with_parallelism(3), &cat);
    assert_ne!(rescaled.fingerprint, a.fingerprint);

    let config = EXAMPLE.replace("header = true", "header = false");
    assert_ne!(plan_of(&model(&config), &cat).fingerprint, a.fingerprint);

    let version = EXAMPLE.replace("file-source@0.1.0", "file-source@0.2.0");
    assert_ne!(plan_of(&model(&version), &cat).fingerprint, a.fingerprint);

    // Same reference, but the component now declares another state schema.
    let cat2 = cat.clone().with("keyed-aggregate@0.1.0", |i| {
        i.states[0].schema_version = 2;
    });
    assert_ne!(plan_of(&model(EXAMPLE), &cat2).fingerprint, a.fingerprint);
}

#[test]
fn chaining_decisions() {
    let base = "[job]\nname = \"j\"\nparallelism = 2\nsemantic = \"best-effort\"\n\
                [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n";
    let vertex_ops = |text: &str| -> Vec<Vec<String>> {
        let s = stream_graph(&model(text), &Fake::new()).unwrap_or_else(|d| panic!("{d}"));
        job_graph(&s)
            .vertices
            .iter()
            .map(|v| v.operators.iter().map(|o| o.name.clone()).collect())
            .collect()
    };
    let op = |name: &str, inputs: &str| {
        format!("[[operator]]\nname = \"{name}\"\nplugin = \"map@1.0.0\"\ninputs = {inputs}\n")
    };
    let sink = |inputs: &str| {
        format!("[[sink]]\nname = \"k\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = {inputs}\n")
    };

    // A straight FORWARD line is one chain.
    let t = format!(
        "{base}{}{}{}",
        op("a", "[\"s\"]"),
        op("b", "[\"a\"]"),
        sink("[\"b\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s", "a", "b", "k"]]);

    // `start_new_chain` cuts the line before the node, keeping the FORWARD edge.
    let t = format!(
        "{base}{}start_new_chain = true\n{}{}",
        op("a", "[\"s\"]"),
        op("b", "[\"a\"]"),
        sink("[\"b\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a", "b", "k"]]);
    let s = stream_graph(&model(&t), &Fake::new()).unwrap();
    assert_eq!(s.edges[0].partition, PartitionPolicy::Forward);
    assert!(s.nodes[1].start_new_chain);
    // It enters the plan (and its fingerprint) only where set.
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(json.matches("start_new_chain").count(), 1);
    // A source always heads its chain; a non-boolean is refused too.
    let bad = base.replace(
        "plugin = \"file-source@0.1.0\"\n",
        "plugin = \"file-source@0.1.0\"\nstart_new_chain = true\n",
    ) + &op("a", "[\"s\"]")
        + "start_new_chain = 1\n"
        + &sink("[\"a\"]");
    let d = parse_job_file("job.toml", &bad).expect_err("refused");
    let text = d.to_string();
    assert!(text.contains("source[0].start_new_chain"), "{text}");
    assert!(text.contains("a source always heads its chain"), "{text}");
    assert!(text.contains("operator[0].start_new_chain"), "{text}");

    // Fan-out: `s` has two consumers, so neither chains into it.
    let t = format!(
        "{base}{}{}{}",
        op("a", "[\"s\"]"),
        op("b", "[\"s\"]"),
        sink("[\"a\", \"b\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a"], vec!["b"], vec!["k"]]);

    // Explicit REBALANCE at equal parallelism breaks the chain.
    let t = format!(
        "{base}{}{}",
        op("a", "[{ from = \"s\", partition = \"rebalance\" }]"),
        sink("[\"a\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a", "k"]]);

    // Different parallelism: default REBALANCE, no chain.
    let t = format!(
        "{base}{}parallelism = 1\n{}",
        op("a", "[\"s\"]"),
        sink("[\"a\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a"], vec!["k"]]);
    let s = stream_graph(&model(&t), &Fake::new()).unwrap();
    assert_eq!(s.edges[0].partition, PartitionPolicy::Rebalance);

    // HASH input heads a new keyed vertex.
    let t = format!(
        "{base}{}{}",
        op("a", "[{ from = \"s\", partition = \"hash\" }]"),
        sink("[\"a\"]")
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a", "k"]]);

    // Vertices come in topological order even when the file lists consumers first.
    let t = format!(
        "[job]\nname = \"j\"\nsemantic = \"best-effort\"\n{}{}[[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n{}",
        sink("[\"b\"]"),
        op("b", "[{ from = \"a\", partition = \"broadcast\" }]"),
        op("a", "[{ from = \"s\", partition = \"rebalance\" }]"),
    );
    assert_eq!(vertex_ops(&t), [vec!["s"], vec!["a"], vec!["b", "k"]]);
}

#[test]
fn channel_pairs_per_policy() {
    use PartitionPolicy::*;
    assert_eq!(channel_pairs(Forward, 3, 3), [(0, 0), (1, 1), (2, 2)]);
    for p in [Hash, Rebalance, Broadcast] {
        assert_eq!(channel_pairs(p, 2, 3).len(), 6);
        assert_eq!(channel_pairs(p, 3, 2).len(), 6);
    }
    assert_eq!(channel_pairs(Singleton, 3, 1), [(0, 0), (1, 0), (2, 0)]);
    assert_eq!(channel_pairs(Union, 3, 2), [(0, 0), (1, 1), (2, 0)]);
    assert_eq!(channel_pairs(Union, 2, 3), [(0, 0), (0, 2), (1, 1)]);
    assert_eq!(channel_pairs(Union, 2, 2), [(0, 0), (1, 1)]);
    // Every subtask on both sides of a UNION edge has a channel.
    for up in 1..6 {
        for down in 1..6 {
            let pairs = channel_pairs(Union, up, down);
            assert!((0..up).all(|u| pairs.iter().any(|p| p.0 == u)));
            assert!((0..down).all(|d| pairs.iter().any(|p| p.1 == d)));
        }
    }
}

#[test]
fn plan_channels_and_input_order_for_multi_input_vertex() {
    let t = r#"[job]
name = "j"
semantic = "best-effort"
[[source]]
name = "a"
plugin = "file-source@0.1.0"
parallelism = 3
[[source]]
name = "b"
plugin = "file-source@0.1.0"
parallelism = 1
[[operator]]
name = "m"
plugin = "map@1.0.0"
parallelism = 2
inputs = [{ from = "b", partition = "broadcast" }, { from = "a", partition = "union" }]
[[sink]]
name = "k"
plugin = "jsonl-sink@0.1.0"
parallelism = 1
inputs = [{ from = "m", partition = "singleton" }]
"#;
    let p = plan_of(&model(t), &Fake::new());
    let ids: Vec<_> = p
        .edges
        .iter()
        .map(|e| (e.id.as_str(), e.channels.len()))
        .collect();
    assert_eq!(
        ids,
        [
            ("sources/b->operators/m#0", 2),
            ("sources/a->operators/m#1", 3),
            ("operators/m->sinks/k#0", 2),
        ]
    );
    assert!(p.edges.iter().all(|e| e.shard_owners.is_empty()));
    let m = p.vertex(&"operators/m".into()).unwrap();
    assert!(!m.keyed);
    let inputs: Vec<String> = m.subtasks[0].inputs.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        inputs,
        [
            "sources/b->operators/m#0/0/0/0",
            "sources/a->operators/m#1/0/0/0",
            "sources/a->operators/m#1/2/0/0",
        ]
    );
    let k = p.vertex(&"sinks/k".into()).unwrap();
    assert_eq!(k.subtasks[0].inputs.len(), 2);
    assert_eq!(p.ack_set.len(), 3 + 1 + 2 + 1);
}

fn first(d: &Diagnostics, field: &str) -> String {
    d.iter()
        .find(|x| x.field == field)
        .unwrap_or_else(|| panic!("no diagnostic at `{field}` in:\n{d}"))
        .message
        .clone()
}

#[test]
fn strict_mode_refuses_weak_sources_and_sinks_and_suggests_a_mode() {
    let m = model(EXAMPLE);
    let cat = Fake::new().with("file-source@0.1.0", |i| {
        i.source_capability = Some(SourceCapability::AtLeastOnce);
    });
    let d = refused(&m, &cat);
    let msg = first(&d, "source[0].plugin");
    for needle in [
        "file-source@0.1.0",
        "at-least-once",
        "strict-exactly-once",
        "semantic = \"at-least-once\"",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }

    let cat = Fake::new().with("jsonl-sink@0.1.0", |i| {
        i.sink_capability = Some(SinkCapability::Idempotent);
    });
    let d = refused(&m, &cat);
    assert_eq!(d.len(), 1, "{d}");
    let msg = first(&d, "sink[0].plugin");
    for needle in [
        "jsonl-sink@0.1.0",
        "idempotent",
        "strict-exactly-once",
        "semantic = \"effectively-once\"",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    // Declaring the weaker mode explicitly is accepted, and visible in the plan.
    let mut weaker = m.clone();
    weaker.job.semantic = SemanticMode::EffectivelyOnce;
    let s = stream_graph(&weaker, &cat).unwrap();
    assert_eq!(s.job.semantic, SemanticMode::EffectivelyOnce);
}

#[test]
fn a_config_value_can_select_a_weaker_sink_capability() {
    // postgres-sink's `transactions = "none"` makes it idempotent: a strict job must be
    // refused naming the sink and the setting, an effectively-once job accepted.
    let schema = r#"{"type":"object","properties":{"dir":{"type":"string"},"transactions":{"enum":["two-phase","none"],"x-sink-capability":{"none":"idempotent"}}}}"#;
    let cat = Fake::new().with("jsonl-sink@0.1.0", |i| {
        i.sink_capability = Some(SinkCapability::TwoPhaseCommit);
        i.config_schema = schema.into();
    });
    let with = |value: &str| {
        model(&EXAMPLE.replace(
            "config = { dir = \"/output\" }",
            &format!("config = {{ dir = \"/output\", transactions = \"{value}\" }}"),
        ))
    };
    // Absent or the default value: the described capability.
    let s = stream_graph(&model(EXAMPLE), &cat).unwrap();
    assert_eq!(
        s.nodes[3].plugin_info.sink_capability,
        Some(SinkCapability::TwoPhaseCommit)
    );
    let s = stream_graph(&with("two-phase"), &cat).unwrap();
    assert_eq!(
        s.nodes[3].plugin_info.sink_capability,
        Some(SinkCapability::TwoPhaseCommit)
    );
    let m = with("none");
    assert_eq!(m.job.semantic, SemanticMode::StrictExactlyOnce);
    let d = refused(&m, &cat);
    assert_eq!(d.len(), 1, "{d}");
    let msg = first(&d, "sink[0].plugin");
    for needle in [
        "sink `out`",
        "jsonl-sink@0.1.0",
        "idempotent (config `transactions = \"none\"`)",
        "strict-exactly-once",
        "semantic = \"effectively-once\"",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    let mut weaker = m.clone();
    weaker.job.semantic = SemanticMode::EffectivelyOnce;
    let s = stream_graph(&weaker, &cat).unwrap();
    assert_eq!(
        s.nodes[3].plugin_info.sink_capability,
        Some(SinkCapability::Idempotent)
    );
    // The capability is part of the plan, so it changes the fingerprint.
    let strict = plan_of(&with("two-phase"), &cat);
    let mut two_phase_weak = with("two-phase");
    two_phase_weak.job.semantic = SemanticMode::EffectivelyOnce;
    assert_ne!(
        plan_of(&two_phase_weak, &cat).fingerprint,
        plan_of(&weaker, &cat).fingerprint
    );
    assert_ne!(strict.fingerprint, plan_of(&weaker, &cat).fingerprint);
}

#[test]
fn weaker_modes_have_their_own_requirements() {
    let mut m = model(EXAMPLE);
    // effectively-once: an at-least-once sink is refused, suggesting at-least-once.
    m.job.semantic = SemanticMode::EffectivelyOnce;
    let cat = Fake::new().with("jsonl-sink@0.1.0", |i| {
        i.sink_capability = Some(SinkCapability::AtLeastOnce);
    });
    let msg = first(&refused(&m, &cat), "sink[0].plugin");
    assert!(
        msg.contains("effectively-once") && msg.contains("semantic = \"at-least-once\""),
        "{msg}"
    );
    // effectively-once: a non-replayable source is refused.
    let cat = Fake::new().with("file-source@0.1.0", |i| {
        i.source_capability = Some(SourceCapability::AtLeastOnce);
    });
    assert!(refused(&m, &cat).mentions("source[0].plugin"));
    // at-least-once: a best-effort sink is refused, suggesting best-effort.
    m.job.semantic = SemanticMode::AtLeastOnce;
    let cat = Fake::new().with("jsonl-sink@0.1.0", |i| {
        i.sink_capability = Some(SinkCapability::BestEffort);
    });
    let msg = first(&refused(&m, &cat), "sink[0].plugin");
    assert!(msg.contains("semantic = \"best-effort\""), "{msg}");
    // best-effort accepts anything.
    m.job.semantic = SemanticMode::BestEffort;
    let cat = cat.with("file-source@0.1.0", |i| {
        i.source_capability = Some(SourceCapability::BestEffort);
    });
    assert!(stream_graph(&m, &cat).is_ok());
}

#[test]
fn plugin_metadata_is_checked_against_the_job() {
    let m = model(EXAMPLE);
    // A source table naming an operator component.
    let text = EXAMPLE.replace("plugin = \"file-source@0.1.0\"", "plugin = \"map@1.0.0\"");
    let msg = first(&refused(&model(&text), &Fake::new()), "source[0].plugin");
    assert!(
        msg.contains("map@1.0.0")
            && msg.contains("operator component")
            && msg.contains("[[source]]"),
        "{msg}"
    );

    // The catalog cannot find it.
    let text = EXAMPLE.replace("jsonl-sink@0.1.0", "jsonl-sink@9.0.0");
    let msg = first(&refused(&model(&text), &Fake::new()), "sink[0].plugin");
    assert!(
        msg.contains("jsonl-sink@9.0.0") && msg.contains("no plugin"),
        "{msg}"
    );

    // The component describes itself with another version.
    let cat = Fake::new().with("flights-mapper@0.1.0", |i| i.version = "0.1.1".into());
    let msg = first(&refused(&m, &cat), "operator[0].plugin");
    assert!(msg.contains("flights-mapper@0.1.1"), "{msg}");

    // State descriptors need unique names and a codec.
    let cat = Fake::new().with("keyed-aggregate@0.1.0", |i| {
        let s = i.states[0].clone();
        i.states.push(s.clone());
        i.states.push(StateDescriptor {
            name: String::new(),
            ..s.clone()
        });
        i.states.push(StateDescriptor {
            name: "x".into(),
            codec: String::new(),
            schema_sha256: None,
            ..s
        });
    });
    let d = refused(&m, &cat);
    let msgs: Vec<_> = d
        .iter()
        .filter(|x| x.field == "operator[1].plugin")
        .map(|x| x.message.as_str())
        .collect();
    assert_eq!(msgs.len(), 3, "{d}");
    assert!(msgs.iter().any(|x| x.contains("more than once")));
    assert!(msgs.iter().any(|x| x.contains("empty name")));
    assert!(msgs.iter().any(|x| x.contains("without a codec")));

    // A sink without a declared capability.
    let cat = Fake::new().with("jsonl-sink@0.1.0", |i| i.sink_capability = None);
    assert!(first(&refused(&m, &cat), "sink[0].plugin").contains("no sink capability"));
}

#[test]
fn edge_policies_are_checked_against_parallelism() {
    let t = EXAMPLE.replace(
        "inputs = [\"per-carrier\"]",
        "parallelism = 3\ninputs = [{ from = \"per-carrier\", partition = \"forward\" }]",
    );
    let msg = first(
        &refused(&model(&t), &Fake::new()),
        "sink[0].inputs[0].partition",
    );
    assert!(
        msg.contains("FORWARD") && msg.contains('2') && msg.contains('3'),
        "{msg}"
    );

    let t = EXAMPLE.replace(
        "inputs = [\"per-carrier\"]",
        "inputs = [{ from = \"per-carrier\", partition = \"singleton\" }]",
    );
    let msg = first(
        &refused(&model(&t), &Fake::new()),
        "sink[0].inputs[0].partition",
    );
    assert!(msg.contains("SINGLETON"), "{msg}");

    // A Delta that makes a keyed vertex wider than the shard count is refused.
    let mut m = model(EXAMPLE);
    m.job.state_shards = 4;
    let d = refused(&m.with_parallelism(8), &Fake::new());
    assert!(first(&d, "job.state_shards").contains("per-carrier"), "{d}");
}

#[test]
fn layers_parse_and_print() {
    for l in Layer::ALL {
        assert_eq!(l.to_string().parse::<Layer>().unwrap(), l);
    }
    assert_eq!("partitioned".parse::<Layer>().unwrap(), Layer::Partitioned);
    let e = "graph".parse::<Layer>().unwrap_err();
    assert!(e.to_string().contains("graph"));
}

#[test]
fn side_outputs_are_validated_routed_and_never_chained() {
    let text = "[job]\nname = \"j\"\nsemantic = \"best-effort\"\n\
                [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n\
                watermarks = { max_out_of_orderness_ms = 5000, idle_timeout_ms = 100, max_drift_ms = 60000 }\n\
                [[operator]]\nname = \"w\"\nplugin = \"map@1.0.0\"\ninputs = [\"s\"]\n\
                [[sink]]\nname = \"main\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"w\"]\n\
                [[sink]]\nname = \"late\"\nplugin = \"jsonl-sink@0.1.0\"\n\
                inputs = [{ from = \"w\", output = \"late\" }]\n";
    let m = model(text);
    assert_eq!(
        m.nodes[0].watermarks,
        Some(WatermarkSpec {
            max_out_of_orderness_ms: 5000,
            idle_timeout_ms: Some(100),
            max_drift_ms: Some(60000),
        })
    );
    // `map` declares no side output: refused, naming the field and the tag.
    let d = refused(&m, &Fake::new());
    let msg = first(&d, "sink[1].inputs[0].output");
    assert!(msg.contains("no side output `late`"), "{msg}");
    // Declared: the edge carries the tag, and `w` (two outputs) ends its chain.
    let cat = Fake::new().with("map@1.0.0", |i| i.side_outputs.push("late".into()));
    let s = stream_graph(&m, &cat).unwrap_or_else(|d| panic!("{d}"));
    let side: Vec<_> = s.edges.iter().filter(|e| e.output.is_some()).collect();
    assert_eq!(side.len(), 1);
    assert_eq!(side[0].output.as_deref(), Some("late"));
    let jg = job_graph(&s);
    let chains: Vec<Vec<String>> = jg
        .vertices
        .iter()
        .map(|v| v.operators.iter().map(|o| o.name.clone()).collect())
        .collect();
    assert_eq!(chains, [vec!["s", "w"], vec!["main"], vec!["late"]]);
    let p = partitioned_plan(&jg);
    assert_eq!(
        p.edges
            .iter()
            .filter(|e| e.output.as_deref() == Some("late"))
            .count(),
        1
    );
    assert_eq!(p.vertices[0].operators[0].watermarks, m.nodes[0].watermarks);
    roundtrip(&p);
    // A single main output chains as before: `late` never chains into `w`.
    let only_side = text.replace(
        "[[sink]]\nname = \"main\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"w\"]\n",
        "",
    );
    let s = stream_graph(&model(&only_side), &cat).unwrap_or_else(|d| panic!("{d}"));
    let chains: Vec<usize> = job_graph(&s)
        .vertices
        .iter()
        .map(|v| v.operators.len())
        .collect();
    assert_eq!(chains, [2, 1]);
    // The model (a CEP pattern, a window spec) enters the fingerprint.
    let a = plan_of(&m, &cat);
    let b = plan_of(
        &m,
        &cat.clone()
            .with("map@1.0.0", |i| i.model = Some("{\"within\":1}".into())),
    );
    assert_ne!(a.fingerprint, b.fingerprint);
}

#[test]
fn watermarks_belong_to_sources_and_plugins_cannot_use_reserved_state_names() {
    let bad = "[job]\nname = \"j\"\nsemantic = \"best-effort\"\n\
               [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n\
               [[operator]]\nname = \"w\"\nplugin = \"map@1.0.0\"\ninputs = [\"s\"]\n\
               watermarks = { max_out_of_orderness_ms = 1, idle_timeout_ms = 0, bogus = 1 }\n\
               [[sink]]\nname = \"k\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"w\"]\n";
    let d = parse_job_file("job.toml", bad).expect_err("refused");
    let text = d.to_string();
    assert!(text.contains("only sources generate watermarks"), "{text}");
    assert!(text.contains("idle_timeout_ms"), "{text}");
    assert!(text.contains("bogus"), "{text}");
    let ok = bad.replace(
        "watermarks = { max_out_of_orderness_ms = 1, idle_timeout_ms = 0, bogus = 1 }\n",
        "",
    );
    let cat = Fake::new().with("map@1.0.0", |i| {
        i.states.push(StateDescriptor {
            name: "__timers".into(),
            kind: StateKind::Value,
            schema_version: 1,
            codec: "x".into(),
            schema_sha256: None,
        })
    });
    let d = refused(&model(&ok), &cat);
    assert!(first(&d, "operator[0].plugin").contains("reserved"), "{d}");
}

#[test]
fn sort_prepare_steps_parse_and_are_checked() {
    let text = "[job]\nname = \"j\"\n[[prepare]]\nsort = \"data/f.csv\"\nby = [\"t\", \"m\"]\ninto = \"data/g.csv\"\n\
                [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n\
                [[sink]]\nname = \"k\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"s\"]\n";
    assert_eq!(
        model(text).prepare,
        vec![PrepareStep::Sort {
            file: "data/f.csv".into(),
            by: vec!["t".into(), "m".into()],
            into: "data/g.csv".into(),
        }]
    );
    let d = parse_job_file(
        "job.toml",
        &text.replace("by = [\"t\", \"m\"]\n", "by = []\n"),
    )
    .expect_err("refused");
    assert!(d.to_string().contains("at least one column"), "{d}");
}

#[test]
fn keyed_state_behind_a_non_hash_input_is_refused_at_parallelism_above_1() {
    // `per-carrier` declares keyed state; at parallelism 2 its input must be HASH.
    for (partition, policy) in [
        ("forward", "FORWARD"),
        ("rebalance", "REBALANCE"),
        ("broadcast", "BROADCAST"),
    ] {
        let t = EXAMPLE.replace(
            "partition = \"hash\"",
            &format!("partition = \"{partition}\""),
        );
        let msg = first(
            &refused(&model(&t), &Fake::new()),
            "operator[1].inputs[0].partition",
        );
        assert_eq!(
            msg,
            format!(
                "`per-carrier` (keyed-aggregate@0.1.0) declares keyed state (`counts`) and runs at \
                 parallelism 2, but its input from `parse` is {policy}, so records would reach a \
                 subtask that does not own their key's state shard; set `partition = \"hash\"` on \
                 this input (records keyed by the upstream), or run `per-carrier` at parallelism 1"
            )
        );
    }
    // At parallelism 1 the one subtask owns every shard: any input is fine.
    let t = EXAMPLE
        .replace("parallelism = 2", "parallelism = 1")
        .replace("partition = \"hash\"", "partition = \"rebalance\"");
    plan_of(&model(&t), &Fake::new());
    // HASH at parallelism 2 is the fix.
    plan_of(&model(EXAMPLE), &Fake::new());
    // A stateless operator may follow any edge.
    let t = EXAMPLE.replace("partition = \"hash\"", "partition = \"rebalance\"");
    let cat = Fake::new().with("keyed-aggregate@0.1.0", |i| i.states.clear());
    plan_of(&model(&t), &cat);
}

#[test]
fn a_config_is_checked_against_the_plugin_config_schema() {
    let cat = Fake::new().with("file-source@0.1.0", |i| {
        i.config_schema = r#"{"type":"object","additionalProperties":false,"required":["path"],
            "properties":{"path":{"type":"string"},"header":{"type":"boolean"}}}"#
            .into();
    });
    plan_of(&model(EXAMPLE), &cat);
    let t = EXAMPLE.replace(
        "config = { path = \"/input/flights.csv\", header = true }",
        "config = { header = \"yes\", colour = 1 }",
    );
    let d = refused(&model(&t), &cat);
    let tail = "(the config schema of `file-source@0.1.0`; `nopstream plugins` lists the plugins)";
    assert_eq!(
        first(&d, "source[0].config"),
        format!("missing required field `path` {tail}")
    );
    assert_eq!(
        first(&d, "source[0].config.header"),
        format!("must be boolean, found string \"yes\" {tail}")
    );
    assert_eq!(
        first(&d, "source[0].config.colour"),
        format!("unknown field; known fields: header, path {tail}")
    );
    // A schema that is not JSON is the plugin's fault, reported on its reference.
    let cat = Fake::new().with("file-source@0.1.0", |i| {
        i.config_schema = "{not json".into()
    });
    assert!(
        first(&refused(&model(EXAMPLE), &cat), "source[0].plugin")
            .starts_with("`file-source@0.1.0` declares a config_schema that is not JSON"),
    );
}

fn cluster(nodes: &[(&str, u32)]) -> DeploymentOptions {
    DeploymentOptions {
        backend: "cluster".into(),
        nodes: nodes
            .iter()
            .map(|(n, s)| NodeSlots {
                node: (*n).into(),
                slots: *s,
            })
            .collect(),
        state_dir: "jobs/flights-per-carrier/state".into(),
        checkpoint_storage: "file:/shared/checkpoints".into(),
    }
}

#[test]
fn cluster_placement_shares_slots_by_subtask_and_marks_crossing_channels_quic() {
    let m = model(EXAMPLE).with_parallelism(3);
    let p = partitioned_plan(&job_graph(&stream_graph(&m, &Fake::new()).unwrap()));
    let d = deployment_plan(&p, &cluster(&[("node-1", 4), ("node-2", 4), ("node-3", 4)])).unwrap();
    assert_eq!(d.backend, "cluster");
    assert_eq!(d.tasks.len(), p.ack_set.len());
    for t in &d.tasks {
        // Slot group i (subtask i of every vertex) on node i+1.
        assert_eq!(
            t.node,
            format!("node-{}", t.task.subtask.0 + 1),
            "{}",
            t.task
        );
        assert_eq!(t.resource_group, format!("slot-{}", t.task.subtask.0));
        // Every task sends or receives on the HASH edge, which crosses nodes.
        assert_eq!(t.transport, "quic", "{}", t.task);
    }
    assert_eq!(d.nodes(), ["node-1", "node-2", "node-3"]);

    // On one node nothing crosses.
    let one = deployment_plan(&p, &cluster(&[("node-2", 3)])).unwrap();
    assert!(
        one.tasks
            .iter()
            .all(|t| t.node == "node-2" && t.transport == "local-queue")
    );
    // Slots are a cap: two groups on node-1 (2 slots), one on node-2 (1 slot) ...
    let capped = deployment_plan(&p, &cluster(&[("node-1", 2), ("node-2", 1)])).unwrap();
    let on = |n: &str| capped.tasks.iter().filter(|t| t.node == n).count();
    assert_eq!((on("node-1"), on("node-2")), (2 * 2, 2));
    // ... and too few slots are refused with what is needed and offered.
    let err = deployment_plan(&p, &cluster(&[("node-1", 1), ("node-2", 1)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the job needs 3 task slots (its largest parallelism) and the nodes offer 2 \
         (node-1: 1, node-2: 1); add nodes, give them more --slots, or lower the parallelism"
    );
    assert_eq!(
        deployment_plan(&p, &cluster(&[])).unwrap_err(),
        PlacementError::NoNodes
    );
}

mod placement_properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Placement is a deterministic function of plan and nodes; it never exceeds a
        /// node's slots; subtasks with one index share a node; slot groups spread evenly
        /// when every node has room; it fails exactly when the slots do not suffice.
        #[test]
        fn placement_is_deterministic_capped_and_balanced(
            parallelism in 1u32..6,
            slots in proptest::collection::vec(0u32..5, 1..5),
        ) {
            let m = model(EXAMPLE).with_parallelism(parallelism);
            let p = partitioned_plan(&job_graph(&stream_graph(&m, &Fake::new()).unwrap()));
            let names: Vec<String> = (1..=slots.len()).map(|i| format!("node-{i}")).collect();
            let nodes: Vec<(&str, u32)> =
                names.iter().map(String::as_str).zip(slots.iter().copied()).collect();
            let opts = cluster(&nodes);
            let offered: u32 = slots.iter().sum();
            let d = deployment_plan(&p, &opts);
            if offered < parallelism {
                let refused = matches!(d, Err(PlacementError::NotEnoughSlots { .. }));
                prop_assert!(refused);
                return Ok(());
            }
            let d = d.unwrap();
            prop_assert_eq!(&d, &deployment_plan(&p, &opts).unwrap());
            let mut group_of_node: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
            let mut node_of_group: BTreeMap<u32, String> = BTreeMap::new();
            for t in &d.tasks {
                group_of_node.entry(t.node.clone()).or_default().insert(t.task.subtask.0);
                let prev = node_of_group.insert(t.task.subtask.0, t.node.clone());
                prop_assert!(prev.is_none_or(|n| n == t.node), "subtask index split over nodes");
            }
            for (i, n) in names.iter().enumerate() {
                let held = group_of_node.get(n).map_or(0, |g| g.len()) as u32;
                prop_assert!(held <= slots[i], "{} holds {} groups with {} slots", n, held, slots[i]);
            }
            if slots.iter().all(|s| *s >= parallelism) {
                let counts: Vec<usize> = names
                    .iter()
                    .map(|n| group_of_node.get(n).map_or(0, |g| g.len()))
                    .collect();
                let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                prop_assert!(hi - lo <= 1, "unbalanced: {:?}", counts);
            }
        }
    }
}

#[test]
fn on_error_enters_the_plan_and_dead_letter_opens_the_errors_output() {
    let base = "[job]\nname = \"j\"\nsemantic = \"best-effort\"\n\
                [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n\
                [[operator]]\nname = \"parse\"\nplugin = \"map@1.0.0\"\ninputs = [\"s\"]\n\
                POLICY\
                [[sink]]\nname = \"good\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"parse\"]\n";
    let dead_sink = "[[sink]]\nname = \"dead\"\nplugin = \"jsonl-sink@0.1.0\"\n\
                     inputs = [{ from = \"parse\", output = \"errors\" }]\n";
    let cat = Fake::new();
    let fail = plan_of(&model(&base.replace("POLICY", "")), &cat);
    let skip = plan_of(
        &model(&base.replace("POLICY", "on_error = \"skip\"\n")),
        &cat,
    );
    // The default stays out of the plan's JSON, so fingerprints of existing jobs hold.
    let json = serde_json::to_string(&fail).unwrap();
    assert!(!json.contains("on_error"), "{json}");
    assert_ne!(
        fail.fingerprint, skip.fingerprint,
        "the policy is in the fingerprint"
    );
    let parse = |p: &PartitionedPlan| {
        p.vertices
            .iter()
            .flat_map(|v| &v.operators)
            .find(|o| o.name == "parse")
            .map(|o| o.on_error)
            .unwrap()
    };
    assert_eq!(parse(&fail), ErrorPolicy::Fail);
    assert_eq!(parse(&skip), ErrorPolicy::Skip);
    roundtrip(&skip);

    // `errors` is readable only with on_error = "dead-letter"; the message says so.
    let read_errors = format!("{}{dead_sink}", base.replace("POLICY", ""));
    let d = refused(&model(&read_errors), &cat);
    let msg = first(&d, "sink[1].inputs[0].output");
    assert!(
        msg.contains("has no side output `errors`")
            && msg.contains("set on_error = \"dead-letter\" on `parse`"),
        "{msg}"
    );
    let dl = format!(
        "{}{dead_sink}",
        base.replace("POLICY", "on_error = \"dead-letter\"\n")
    );
    let s = stream_graph(&model(&dl), &cat).unwrap_or_else(|d| panic!("{d}"));
    let errors: Vec<_> = s
        .edges
        .iter()
        .filter(|e| e.output.as_deref() == Some(DEAD_LETTER_OUTPUT))
        .collect();
    assert_eq!(errors.len(), 1);
    // `parse` has two consumers, so it ends its chain: dead letters leave from a tail.
    let chains: Vec<Vec<String>> = job_graph(&s)
        .vertices
        .iter()
        .map(|v| v.operators.iter().map(|o| o.name.clone()).collect())
        .collect();
    assert_eq!(chains, [vec!["s", "parse"], vec!["good"], vec!["dead"]]);

    // Dead letters carry no key: a HASH edge could not route them (before: accepted,
    // then the first bad record failed the job with a missing-key error).
    let hashed = dl.replace(
        "{ from = \"parse\", output = \"errors\" }",
        "{ from = \"parse\", output = \"errors\", partition = \"hash\" }",
    );
    assert_ne!(hashed, dl);
    let d = refused(&model(&hashed), &cat);
    assert_eq!(
        first(&d, "sink[1].inputs[0].partition"),
        "the dead letters of `parse` (output `errors`) carry no key, so they cannot cross a \
         HASH edge; read them with partition = \"rebalance\", \"forward\" or \"singleton\""
    );

    // Dead letters nobody reads would be a silent loss.
    let unread = base.replace("POLICY", "on_error = \"dead-letter\"\n");
    let d = refused(&model(&unread), &cat);
    let msg = first(&d, "operator[0].on_error");
    assert!(msg.contains("but nothing reads it"), "{msg}");
    // A plugin with its own `errors` output cannot share it with dead letters.
    let own = cat
        .clone()
        .with("map@1.0.0", |i| i.side_outputs.push("errors".into()));
    let d = refused(&model(&dl), &own);
    assert!(
        first(&d, "operator[0].on_error").contains("declares a side output named `errors`"),
        "{d}"
    );
}

#[test]
fn skip_and_dead_letter_are_refused_for_operators_with_keyed_state() {
    // Isolating a failed batch re-runs its records; a stateful operator's failed call
    // would leave its state writes behind, so good records could count twice.
    let text = "[job]\nname = \"j\"\nsemantic = \"best-effort\"\nparallelism = 1\n\
                [[source]]\nname = \"s\"\nplugin = \"file-source@0.1.0\"\n\
                [[operator]]\nname = \"agg\"\nplugin = \"keyed-aggregate@0.1.0\"\n\
                inputs = [{ from = \"s\", partition = \"hash\" }]\non_error = \"skip\"\n\
                [[sink]]\nname = \"k\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"agg\"]\n";
    let d = refused(&model(text), &Fake::new());
    let msg = first(&d, "operator[0].on_error");
    assert!(
        msg.starts_with(
            "`agg` (keyed-aggregate@0.1.0) declares keyed state (`counts`); on_error = \"skip\""
        ),
        "{msg}"
    );
    // `fail` needs no isolation and stays allowed.
    plan_of(
        &model(&text.replace("on_error = \"skip\"\n", "on_error = \"fail\"\n")),
        &Fake::new(),
    );
}

/// `branches` independent pipelines `s<i> -> agg<i> (keyed) -> k<i>`, declared in the
/// order `order` names them.
fn branches_job(order: &[usize]) -> String {
    let mut t = String::from("[job]\nname = \"j\"\nparallelism = 2\n");
    for &i in order {
        t.push_str(&format!(
            "[[source]]\nname = \"s{i}\"\nplugin = \"file-source@0.1.0\"\n\
             [[operator]]\nname = \"agg{i}\"\nplugin = \"keyed-aggregate@0.1.0\"\n\
             inputs = [{{ from = \"s{i}\", partition = \"hash\" }}]\n\
             [[sink]]\nname = \"k{i}\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"agg{i}\"]\n"
        ));
    }
    t
}

/// A catalog whose `keyed-aggregate` declares the states `names`, in that order.
fn catalog_with_states(names: &[&str]) -> Fake {
    Fake::new().with("keyed-aggregate@0.1.0", |i| {
        let proto = i.states[0].clone();
        i.states = names
            .iter()
            .map(|n| StateDescriptor {
                name: (*n).into(),
                ..proto.clone()
            })
            .collect();
    })
}

mod declaration_order {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pins fingerprints hashing arrays in declaration order: two job files differing
        /// only in the order of independent branches (or a plugin listing its states in
        /// another order) compiled to the same operators, yet their plan fingerprints
        /// differed, so a reordered job could not resume from its own checkpoints.
        #[test]
        fn fingerprints_do_not_depend_on_declaration_order(
            order in Just(vec![0usize, 1, 2, 3]).prop_shuffle(),
            states in Just(vec!["a", "b", "c"]).prop_shuffle(),
        ) {
            let reference = plan_of(&model(&branches_job(&[0, 1, 2, 3])), &catalog_with_states(&["a", "b", "c"]));
            let permuted = plan_of(&model(&branches_job(&order)), &catalog_with_states(&states));
            prop_assert_eq!(&permuted.fingerprint, &reference.fingerprint);
            // The plans hold the same vertices, whatever their order.
            let ids = |p: &PartitionedPlan| p.vertices.iter().map(|v| v.id.to_string()).collect::<BTreeSet<_>>();
            prop_assert_eq!(ids(&permuted), ids(&reference));
        }
    }
}

#[test]
fn fingerprints_still_tell_dependent_order_and_recorded_old_fingerprints_match() {
    let cat = Fake::new();
    let plan = plan_of(&model(EXAMPLE), &cat);
    // A manifest written before fingerprints were canonical recorded the
    // declaration-order fingerprint; the plan still recognises it as its own.
    let old = declaration_order_fingerprint_of(&plan);
    assert!(plan.fingerprint_matches(&old));
    assert!(plan.fingerprint_matches(&plan.fingerprint));
    let other = plan_of(
        &model(&EXAMPLE.replace("header = true", "header = false")),
        &cat,
    );
    assert!(!plan.fingerprint_matches(&other.fingerprint));
    assert!(!plan.fingerprint_matches(&declaration_order_fingerprint_of(&other)));
    // Input order of a multi-input operator is meaning, not declaration order.
    let two = |a: &str, b: &str| {
        format!(
            "[job]\nname = \"j\"\nsemantic = \"best-effort\"\n\
             [[source]]\nname = \"x\"\nplugin = \"file-source@0.1.0\"\n\
             [[source]]\nname = \"y\"\nplugin = \"file-source@0.1.0\"\n\
             [[sink]]\nname = \"k\"\nplugin = \"jsonl-sink@0.1.0\"\ninputs = [\"{a}\", \"{b}\"]\n"
        )
    };
    assert_ne!(
        plan_of(&model(&two("x", "y")), &cat).fingerprint,
        plan_of(&model(&two("y", "x")), &cat).fingerprint
    );
}

#[test]
fn the_key_spec_is_the_marked_config_properties_with_their_defaults() {
    let mut parser = info("flights-mapper", "0.1.0", PluginKind::Operator);
    parser.config_schema = r#"{"properties": {"key": {"type": "string", "default": "carrier", "x-key-spec": true}, "fields": {"type": "array"}}}"#.into();
    let spec = |config: serde_json::Value| key_spec(&parser, &config);
    let default = spec(serde_json::json!({"fields": ["carrier"]}));
    assert_eq!(default.as_deref(), Some(r#"{"key":"carrier"}"#));
    assert_eq!(
        spec(serde_json::json!({"key": "carrier", "fields": ["a", "b"]})),
        default,
        "fields are not the key"
    );
    assert_ne!(spec(serde_json::json!({"key": "origin"})), default);
    // Nothing marked: no key spec (the whole config decides).
    parser.config_schema = r#"{"properties": {"key": {"type": "string"}}}"#.into();
    assert_eq!(
        key_spec(&parser, &serde_json::json!({"key": "carrier"})),
        None
    );
}

#[test]
fn the_state_layout_is_the_marked_properties_or_the_marked_members_of_an_object() {
    let mut agg = info("window-aggregate", "0.1.0", PluginKind::Operator);
    agg.config_schema = r#"{"properties": {
        "aggregates": {"type": "array", "x-state-layout": true},
        "window": {"type": "object", "x-state-layout": ["kind", "size_ms"], "properties": {
            "kind": {"enum": ["tumbling"]}, "size_ms": {"type": "integer", "default": 1000},
            "allowed_lateness_ms": {"type": "integer"}}},
        "label": {"type": "string"}}}"#
        .into();
    let layout = |config: serde_json::Value| state_layout(&agg, &config);
    let base = layout(serde_json::json!({
        "aggregates": [{"fn": "count"}],
        "window": {"kind": "tumbling", "allowed_lateness_ms": 0},
        "label": "a"}));
    assert_eq!(
        base.as_deref(),
        Some(r#"{"aggregates":[{"fn":"count"}],"window":{"kind":"tumbling","size_ms":1000}}"#),
        "the member default fills a missing member"
    );
    // Unmarked properties and members do not change it.
    assert_eq!(
        layout(serde_json::json!({
            "aggregates": [{"fn": "count"}],
            "window": {"kind": "tumbling", "size_ms": 1000, "allowed_lateness_ms": 500},
            "label": "b"})),
        base
    );
    // Marked ones do.
    assert_ne!(
        layout(serde_json::json!({
            "aggregates": [{"fn": "count"}, {"fn": "sum"}],
            "window": {"kind": "tumbling"}})),
        base
    );
    assert_ne!(
        layout(serde_json::json!({
            "aggregates": [{"fn": "count"}],
            "window": {"kind": "tumbling", "size_ms": 2000}})),
        base
    );
    // Nothing marked: no layout.
    agg.config_schema = r#"{"properties": {"aggregates": {"type": "array"}}}"#.into();
    assert_eq!(
        state_layout(&agg, &serde_json::json!({"aggregates": []})),
        None
    );
}

/// Two sources, a join operator with `inputs`, and a sink.
fn join_job(inputs: &str) -> String {
    format!(
        r#"[job]
name = "j"
semantic = "best-effort"
[[source]]
name = "a"
plugin = "file-source@0.1.0"
[[source]]
name = "b"
plugin = "file-source@0.1.0"
[[operator]]
name = "joined"
plugin = "join@1.0.0"
inputs = [{inputs}]
[[sink]]
name = "k"
plugin = "jsonl-sink@0.1.0"
inputs = ["joined"]
"#
    )
}

#[test]
fn a_join_operator_takes_exactly_two_inputs() {
    let mut cat = Fake::new();
    let mut join = info("join", "1.0.0", PluginKind::Operator);
    join.model = Some(
        r#"{"operator":"interval-join","type":"inner","lower_ms":0,"upper_ms":5,"left_unique":false}"#
            .into(),
    );
    cat.add(join);
    let two = join_job(r#""a", "b""#);
    plan_of(&model(&two), &cat);

    let one = refused(&model(&join_job(r#""a""#)), &cat);
    assert_eq!(
        first(&one, "operator[0].inputs"),
        "`joined` (join@1.0.0) is an interval-join, which takes exactly two inputs, the left \
         one first (`inputs = [{ from = \"left\", partition = \"hash\" }, { from = \"right\", \
         partition = \"hash\" }]`), but it has one"
    );
    let three = refused(&model(&join_job(r#""a", "b", "a""#)), &cat);
    assert!(
        first(&three, "operator[0].inputs").ends_with("but it has 3"),
        "{three}"
    );

    // Every join of the SDK's family is checked; another model, or none, is not.
    for (model_json, checked) in [
        (r#"{"operator":"regular-join","type":"left"}"#, true),
        (r#"{"operator":"window-join","type":"inner"}"#, true),
        (r#"{"operator":"window","plugin":"x"}"#, false),
        ("not json", false),
    ] {
        let cat = cat
            .clone()
            .with("join@1.0.0", |i| i.model = Some(model_json.into()));
        let r = stream_graph(&model(&join_job(r#""a""#)), &cat);
        assert_eq!(r.is_err(), checked, "{model_json}: {r:?}");
    }
    let cat = cat.with("join@1.0.0", |i| i.model = None);
    plan_of(&model(&join_job(r#""a""#)), &cat);
}

/// A multi-stage plugin (nexmark-q7: `stage = "max"` reads one input, `stage = "join"`
/// two) declares its input count per setting with `x-inputs`; the planner checks it,
/// with the deciding setting named, and it wins over the plugin's model.
#[test]
fn a_multi_stage_plugin_takes_the_inputs_its_configured_stage_declares() {
    let mut cat = Fake::new();
    let mut staged = info("join", "1.0.0", PluginKind::Operator);
    staged.config_schema = r#"{"properties": {"stage": {"enum": ["max", "join"],
        "default": "join", "x-inputs": {"max": 1, "join": 2}}}}"#
        .into();
    staged.model = Some(r#"{"operator":"regular-join"}"#.into());
    cat.add(staged);
    let with = |inputs: &str, config: &str| {
        join_job(inputs).replace(
            "plugin = \"join@1.0.0\"\n",
            &format!("plugin = \"join@1.0.0\"\nconfig = {config}\n"),
        )
    };
    plan_of(&model(&with(r#""a", "b""#, r#"{ stage = "join" }"#)), &cat);
    plan_of(&model(&with(r#""a""#, r#"{ stage = "max" }"#)), &cat);
    let r = refused(&model(&with(r#""a""#, r#"{ stage = "join" }"#)), &cat);
    assert_eq!(
        first(&r, "operator[0].inputs"),
        "`joined` (join@1.0.0) with `stage = \"join\"` takes exactly two inputs, but it has one"
    );
    let r = refused(&model(&with(r#""a", "b""#, r#"{ stage = "max" }"#)), &cat);
    assert_eq!(
        first(&r, "operator[0].inputs"),
        "`joined` (join@1.0.0) with `stage = \"max\"` takes exactly one input, but it has two"
    );
    // The schema's default decides when the config says nothing.
    let r = refused(&model(&with(r#""a""#, "{}")), &cat);
    assert!(
        first(&r, "operator[0].inputs").contains("`stage = \"join\"`"),
        "{r}"
    );
}
