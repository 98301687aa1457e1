//! The savepoint checker, one case per finding code: each case changes one thing of a
//! savepoint's job, and asserts the code, its status, the remedies offered, that the right
//! action clears it, and that an action clearing nothing is an error.

use nop_stream_api::{
    OperatorStateDescriptor, PluginKind, Redistribution, StateDescriptor, StateKind,
};
use nop_stream_checkpoint::{InputMeta, META_FORMAT, OperatorMeta, SnapshotMeta};
use nop_stream_coordinator::compat::{
    Action, ActionError, Actions, CheckContext, Code, Report, Status, check,
    state_topology_fingerprint,
};

fn state(name: &str, version: u32) -> StateDescriptor {
    StateDescriptor {
        name: name.into(),
        kind: StateKind::Value,
        schema_version: version,
        codec: "postcard".into(),
        schema_sha256: None,
    }
}

fn op(id: &str, plugin: &str, states: Vec<StateDescriptor>, keyed: bool) -> OperatorMeta {
    OperatorMeta {
        operator_id: id.into(),
        origin: "model-path".into(),
        name: id.rsplit('/').next().unwrap().into(),
        kind: if id.starts_with("sources/") {
            PluginKind::Source
        } else if id.starts_with("sinks/") {
            PluginKind::Sink
        } else {
            PluginKind::Operator
        },
        parallelism: 2,
        plugin: plugin.into(),
        component_sha256: "a".repeat(64),
        world: "nop:stream/operator@0.2.0".into(),
        states,
        keyed,
        inputs: Vec::new(),
        sink_protocol: None,
        state_ttl_ms: Default::default(),
        operator_states: Vec::new(),
        state_layout: None,
    }
}

/// source -> parse -> HASH -> agg (stateful, keyed) -> sink.
fn base() -> SnapshotMeta {
    let mut acc = state("acc", 1);
    acc.schema_sha256 = Some("5".repeat(64));
    let mut agg = op("operators/agg", "keyed-aggregate@0.1.0", vec![acc], true);
    agg.inputs = vec![InputMeta {
        from: "operators/parse".into(),
        output: None,
        partition: "HASH".into(),
        key_source: Some("flights-mapper 0123456789abcdef".into()),
        key_spec: None,
    }];
    // A non-keyed operator with operator state that cannot be redistributed.
    let mut buffer = op("operators/buffer", "buffer@0.1.0", vec![], false);
    buffer.operator_states = vec![OperatorStateDescriptor {
        name: "pending".into(),
        schema_version: 1,
        codec: "postcard".into(),
        redistribution: Redistribution::None,
        schema_sha256: Some("6".repeat(64)),
    }];
    let mut sink = op("sinks/out", "jsonl-sink@0.1.0", vec![], false);
    sink.sink_protocol = Some("two-phase-commit:jsonl-sink".into());
    let mut m = SnapshotMeta {
        format: META_FORMAT,
        host_version: "0.1.0".into(),
        wit_packages: vec!["nop:stream@0.2.0".into()],
        plan_fingerprint: "p".repeat(64),
        state_topology_fingerprint: String::new(),
        state_shard_count: 128,
        hash_policy: "xxh3-64/v1".into(),
        semantic: "strict-exactly-once".into(),
        operators: vec![
            op("sources/flights", "file-source@0.1.0", vec![], false),
            op("operators/parse", "flights-mapper@0.1.0", vec![], false),
            agg,
            sink,
            buffer,
        ],
    };
    m.state_topology_fingerprint = state_topology_fingerprint(&m);
    m
}

fn agg(m: &mut SnapshotMeta) -> &mut OperatorMeta {
    m.operators
        .iter_mut()
        .find(|o| o.operator_id == "operators/agg")
        .unwrap()
}

fn run(
    new: &SnapshotMeta,
    ctx: &CheckContext,
    actions: Vec<Action>,
) -> Result<Report, ActionError> {
    check(&base(), new, ctx, &Actions { actions })
}

/// The single finding with `code`, wherever it is.
fn only(r: &Report, code: Code) -> nop_stream_coordinator::compat::Finding {
    let all: Vec<_> = r
        .job
        .iter()
        .chain(r.operators.iter().flat_map(|o| &o.findings))
        .filter(|f| f.code == code)
        .cloned()
        .collect();
    assert_eq!(all.len(), 1, "{code:?} in {}", r.to_text());
    all[0].clone()
}

/// A case: the change, the code, its status before actions, the remedies, and the action
/// that clears it (none for findings nothing clears).
struct Case {
    code: Code,
    status: Status,
    remedies: &'static [&'static str],
    change: fn(&mut SnapshotMeta),
    ctx: CheckContext,
    clears: Option<Action>,
}

fn buffer(m: &mut SnapshotMeta) -> &mut OperatorMeta {
    m.operators
        .iter_mut()
        .find(|o| o.operator_id == "operators/buffer")
        .unwrap()
}

fn drop_pending() -> Option<Action> {
    Some(Action::DropState {
        operator: "operators/buffer".into(),
        state: Some("pending".into()),
    })
}

fn drop_acc() -> Option<Action> {
    Some(Action::DropState {
        operator: "operators/agg".into(),
        state: Some("acc".into()),
    })
}

fn cases() -> Vec<Case> {
    let pending = CheckContext {
        pending_committables: [("sinks/out".to_owned(), 2)].into(),
        namespace_epochs: None,
    };
    vec![
        Case {
            code: Code::ManifestFormatNewer,
            status: Status::Incompatible,
            remedies: &[],
            // Applied to the *old* meta below: the new host is older.
            change: |_| {},
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::ParallelismChanged,
            status: Status::Compatible,
            remedies: &[],
            change: |m| agg(m).parallelism = 3,
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::ParallelismExceedsShards,
            status: Status::Incompatible,
            remedies: &["reshard"],
            change: |m| agg(m).parallelism = 200,
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::PluginLogicChanged,
            status: Status::Compatible,
            remedies: &[],
            change: |m| agg(m).component_sha256 = "b".repeat(64),
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::WitNotServed,
            status: Status::Incompatible,
            remedies: &[],
            change: |m| agg(m).world = "nop:stream/operator@0.9.0".into(),
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::StateAdded,
            status: Status::Compatible,
            remedies: &[],
            change: |m| agg(m).states.push(state("extra", 1)),
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::StateRemoved,
            status: Status::NeedsAction,
            remedies: &["drop-state", "rename-state"],
            change: |m| agg(m).states.clear(),
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::StateSchemaBumped,
            status: Status::NeedsAction,
            remedies: &["migrate-state", "drop-state"],
            change: |m| agg(m).states[0].schema_version = 2,
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::StateSchemaDowngraded,
            status: Status::Incompatible,
            remedies: &["drop-state"],
            change: |m| agg(m).states[0].schema_version = 0,
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::StateCodecChanged,
            status: Status::NeedsAction,
            remedies: &["migrate-state", "drop-state"],
            change: |m| agg(m).states[0].codec = "json".into(),
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::StateTtlChanged,
            status: Status::NeedsAction,
            remedies: &["drop-state"],
            change: |m| {
                agg(m).state_ttl_ms.insert("acc".into(), 60_000);
            },
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::StateKindChanged,
            status: Status::Incompatible,
            remedies: &["drop-state"],
            change: |m| agg(m).states[0].kind = StateKind::Map,
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::KeySpecChanged,
            status: Status::Incompatible,
            remedies: &["drop-state"],
            change: |m| {
                agg(m).inputs[0].key_source = Some("flights-mapper fedcba9876543210".into())
            },
            ctx: CheckContext::default(),
            clears: Some(Action::DropState {
                operator: "operators/agg".into(),
                state: None,
            }),
        },
        Case {
            code: Code::EdgePartitionChanged,
            status: Status::Incompatible,
            remedies: &["drop-state"],
            change: |m| agg(m).inputs[0].partition = "REBALANCE".into(),
            ctx: CheckContext::default(),
            clears: Some(Action::DropState {
                operator: "operators/agg".into(),
                state: None,
            }),
        },
        Case {
            code: Code::ShardCountChanged,
            status: Status::NeedsAction,
            remedies: &["reshard"],
            change: |m| m.state_shard_count = 256,
            ctx: CheckContext::default(),
            clears: Some(Action::Reshard { shards: 256 }),
        },
        Case {
            code: Code::HashPolicyChanged,
            status: Status::NeedsAction,
            remedies: &["reshard"],
            change: |m| m.hash_policy = "xxh3-64/v2".into(),
            ctx: CheckContext::default(),
            clears: Some(Action::Reshard { shards: 128 }),
        },
        Case {
            code: Code::StatelessOperatorChanged,
            status: Status::Compatible,
            remedies: &[],
            change: |m| {
                m.operators
                    .insert(2, op("operators/filter", "filter@0.1.0", vec![], false))
            },
            ctx: CheckContext::default(),
            clears: None,
        },
        Case {
            code: Code::StatefulOperatorRemoved,
            status: Status::NeedsAction,
            remedies: &["drop-state", "rename-operator"],
            change: |m| m.operators.retain(|o| o.operator_id != "operators/agg"),
            ctx: CheckContext::default(),
            clears: Some(Action::DropState {
                operator: "operators/agg".into(),
                state: None,
            }),
        },
        Case {
            code: Code::StatefulOperatorAdded,
            status: Status::NeedsAction,
            remedies: &["init-empty", "rename-operator"],
            change: |m| {
                m.operators.insert(
                    3,
                    op(
                        "operators/dedup",
                        "dedup@0.1.0",
                        vec![state("seen", 1)],
                        true,
                    ),
                )
            },
            ctx: CheckContext::default(),
            clears: Some(Action::InitEmpty {
                operator: "operators/dedup".into(),
            }),
        },
        Case {
            code: Code::SinkProtocolChanged,
            status: Status::NeedsAction,
            remedies: &["finalize-sink"],
            change: |m| {
                m.operators[3].sink_protocol = Some("idempotent:kv-sink".into());
            },
            ctx: pending,
            clears: None,
        },
        Case {
            code: Code::SemanticWeakened,
            status: Status::NeedsAction,
            remedies: &["accept-semantic-change"],
            change: |m| m.semantic = "at-least-once".into(),
            ctx: CheckContext::default(),
            clears: Some(Action::AcceptSemanticChange {
                from: "strict-exactly-once".into(),
                to: "at-least-once".into(),
            }),
        },
        Case {
            code: Code::StateSchemaChanged,
            status: Status::Incompatible,
            remedies: &["drop-state"],
            change: |m| agg(m).states[0].schema_sha256 = Some("7".repeat(64)),
            ctx: CheckContext::default(),
            clears: drop_acc(),
        },
        Case {
            code: Code::NonKeyedStateNotRedistributable,
            status: Status::NeedsAction,
            remedies: &["drop-state"],
            change: |m| buffer(m).parallelism = 3,
            ctx: CheckContext::default(),
            clears: drop_pending(),
        },
        Case {
            code: Code::NamespaceAdvanced,
            status: Status::Incompatible,
            remedies: &["fork"],
            change: |_| {},
            ctx: CheckContext {
                pending_committables: Default::default(),
                namespace_epochs: Some((9, 4)),
            },
            clears: Some(Action::Fork {
                namespace: "replay".into(),
            }),
        },
    ]
}

#[test]
fn an_unchanged_job_is_compatible_with_no_finding() {
    let r = run(&base(), &CheckContext::default(), vec![]).unwrap();
    assert_eq!(r.verdict, Status::Compatible);
    assert!(r.job.is_empty());
    assert!(
        r.operators.iter().all(|o| o.findings.is_empty()),
        "{}",
        r.to_text()
    );
    assert_eq!(r.state_topology.0, r.state_topology.1);
}

/// Pins the state-topology fingerprint hashing operators and states in declaration
/// order: the same job with its declarations reordered, or a plugin listing its states in
/// another order, got another fingerprint.
#[test]
fn the_state_topology_fingerprint_ignores_declaration_order() {
    let mut a = base();
    agg(&mut a).states.push(state("max", 1));
    let fa = state_topology_fingerprint(&a);
    let mut b = a.clone();
    b.operators.reverse();
    agg(&mut b).states.reverse();
    let buffer = b
        .operators
        .iter_mut()
        .find(|o| o.operator_id == "operators/buffer")
        .unwrap();
    let mut second = buffer.operator_states[0].clone();
    second.name = "later".into();
    buffer.operator_states.insert(0, second.clone());
    a.operators
        .iter_mut()
        .find(|o| o.operator_id == "operators/buffer")
        .unwrap()
        .operator_states
        .push(second);
    assert_eq!(
        state_topology_fingerprint(&a),
        state_topology_fingerprint(&b)
    );
    assert_ne!(
        state_topology_fingerprint(&a),
        fa,
        "a new operator state counts"
    );
    // What a savepoint recorded under the old scheme is recomputed, not trusted.
    a.state_topology_fingerprint = "old-scheme".into();
    let r = check(
        &a,
        &b,
        &CheckContext::default(),
        &Actions { actions: vec![] },
    )
    .unwrap();
    assert_eq!(r.state_topology.0, r.state_topology.1);
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
}

/// Pins a Delta that changed only the parser's `fields` (same `key`) being reported as
/// KEY_SPEC_CHANGED: the whole upstream config was compared, not the key spec.
#[test]
fn only_the_key_spec_decides_a_key_change_when_both_sides_record_one() {
    let with = |source: &str, spec: Option<&str>| {
        let mut m = base();
        let i = &mut agg(&mut m).inputs[0];
        i.key_source = Some(source.into());
        i.key_spec = spec.map(Into::into);
        m
    };
    let old = with(
        "flights-mapper 1111111111111111",
        Some("flights-mapper key aaaa"),
    );
    // Same key spec, another config (the fields): compatible.
    let same_key = with(
        "flights-mapper 2222222222222222",
        Some("flights-mapper key aaaa"),
    );
    let r = check(
        &old,
        &same_key,
        &CheckContext::default(),
        &Actions { actions: vec![] },
    )
    .unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    assert_eq!(r.state_topology.0, r.state_topology.1);
    // Another key spec: a key change.
    let other_key = with(
        "flights-mapper 2222222222222222",
        Some("flights-mapper key bbbb"),
    );
    let r = check(
        &old,
        &other_key,
        &CheckContext::default(),
        &Actions { actions: vec![] },
    )
    .unwrap();
    let f = only(&r, Code::KeySpecChanged);
    assert_eq!(
        (f.old.as_str(), f.new.as_str()),
        ("flights-mapper key aaaa", "flights-mapper key bbbb")
    );
    // A savepoint without key specs compares the whole config, as it always did.
    let older = with("flights-mapper 1111111111111111", None);
    let r = check(
        &older,
        &same_key,
        &CheckContext::default(),
        &Actions { actions: vec![] },
    )
    .unwrap();
    only(&r, Code::KeySpecChanged);
    let r = check(
        &older,
        &with("flights-mapper 1111111111111111", Some("x")),
        &CheckContext::default(),
        &Actions { actions: vec![] },
    )
    .unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
}

#[test]
fn every_finding_code_has_its_status_remedies_and_clearing_action() {
    for case in cases() {
        let mut new = base();
        (case.change)(&mut new);
        let r = if case.code == Code::ManifestFormatNewer {
            let mut old = base();
            old.format = META_FORMAT + 1;
            check(&old, &base(), &case.ctx, &Actions::default()).unwrap()
        } else {
            run(&new, &case.ctx, vec![]).unwrap()
        };
        let f = only(&r, case.code);
        assert_eq!(f.status, case.status, "{:?}", case.code);
        assert_eq!(f.remedies, case.remedies, "{:?}", case.code);
        assert_eq!(
            r.verdict,
            case.status,
            "{:?}: verdict\n{}",
            case.code,
            r.to_text()
        );
        assert_eq!(
            r.verdict.exit_code(),
            match case.status {
                Status::Compatible => 0,
                Status::NeedsAction => 2,
                Status::Incompatible => 3,
            }
        );
        if let Some(action) = case.clears {
            let described = action.describe();
            let r = run(&new, &case.ctx, vec![action]).unwrap();
            let f = only(&r, case.code);
            assert_eq!(
                f.cleared_by.as_deref(),
                Some(described.as_str()),
                "{:?}",
                case.code
            );
            assert_eq!(
                r.verdict,
                Status::Compatible,
                "{:?}\n{}",
                case.code,
                r.to_text()
            );
        }
    }
}

#[test]
fn an_action_that_clears_nothing_or_is_not_built_is_an_error() {
    let unused = run(
        &base(),
        &CheckContext::default(),
        vec![Action::DropState {
            operator: "operators/agg".into(),
            state: Some("typo".into()),
        }],
    )
    .unwrap_err();
    assert_eq!(
        unused,
        ActionError::Unused("drop-state operators/agg/typo".into())
    );
    // A rename of an operator that the savepoint does not have clears nothing either.
    let mut new = base();
    agg(&mut new).operator_id = "operators/agg2".into();
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    assert_eq!(r.verdict, Status::NeedsAction, "{}", r.to_text());
    assert!(
        run(
            &new,
            &CheckContext::default(),
            vec![Action::RenameOperator {
                from: "operators/nope".into(),
                to: "operators/agg2".into()
            }]
        )
        .is_err()
    );
    // The right rename clears both the removal and the addition.
    let r = run(
        &new,
        &CheckContext::default(),
        vec![Action::RenameOperator {
            from: "operators/agg".into(),
            to: "operators/agg2".into(),
        }],
    )
    .unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    // migrate-state clears a schema bump (and only of the state it names) ...
    let mut bumped = base();
    agg(&mut bumped).states[0].schema_version = 2;
    let r = run(
        &bumped,
        &CheckContext::default(),
        vec![Action::MigrateState {
            operator: "operators/agg".into(),
            state: "acc".into(),
        }],
    )
    .unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    assert_eq!(
        only(&r, Code::StateSchemaBumped).cleared_by.as_deref(),
        Some("migrate-state operators/agg/acc")
    );
    assert_eq!(
        run(
            &bumped,
            &CheckContext::default(),
            vec![Action::MigrateState {
                operator: "operators/agg".into(),
                state: "other".into(),
            }],
        )
        .unwrap_err(),
        ActionError::Unused("migrate-state operators/agg/other".into())
    );
    // finalize-sink clears a sink protocol change with pending committables (the host
    // commits them with the old plugin before the restore) ...
    let mut swapped = base();
    swapped.operators[3].sink_protocol = Some("idempotent:kv-sink".into());
    let pending = CheckContext {
        pending_committables: [("sinks/out".to_owned(), 2)].into(),
        namespace_epochs: None,
    };
    let finalize = |op: &str| Action::FinalizeSink {
        operator: op.into(),
        with: "jsonl-sink@0.1.0".into(),
        job: "old.toml".into(),
    };
    let r = run(&swapped, &pending, vec![finalize("sinks/out")]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    assert_eq!(
        only(&r, Code::SinkProtocolChanged).cleared_by.as_deref(),
        Some("finalize-sink sinks/out with jsonl-sink@0.1.0")
    );
    // ... and one naming another sink is unused, an error.
    assert_eq!(
        run(&swapped, &pending, vec![finalize("sinks/other")]).unwrap_err(),
        ActionError::Unused("finalize-sink sinks/other with jsonl-sink@0.1.0".into())
    );
}

#[test]
fn the_text_report_names_operators_plugins_findings_and_the_verdict() {
    let mut new = base();
    agg(&mut new).plugin = "keyed-aggregate@0.2.0".into();
    agg(&mut new).component_sha256 = "b".repeat(64);
    agg(&mut new).states[0].schema_version = 2;
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    let text = r.to_text();
    assert!(
        text.contains("keyed-aggregate@0.1.0 -> keyed-aggregate@0.2.0"),
        "{text}"
    );
    assert!(
        text.contains("STATE_SCHEMA_BUMPED acc v1 -> v2  -> migrate-state | drop-state"),
        "{text}"
    );
    assert!(text.contains("verdict NEEDS-ACTION (exit 2)"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["format"], "nopstream.compat-report/v1");
    assert_eq!(json["verdict"], "needs-action");
}

#[test]
fn another_ttl_duration_is_compatible_and_reported() {
    let mut old = base();
    agg(&mut old).state_ttl_ms.insert("acc".into(), 60_000);
    let mut new = old.clone();
    agg(&mut new).state_ttl_ms.insert("acc".into(), 120_000);
    let r = check(&old, &new, &CheckContext::default(), &Actions::default()).unwrap();
    let f = only(&r, Code::StateTtlChanged);
    assert_eq!(f.status, Status::Compatible);
    assert_eq!(
        (f.old.as_str(), f.new.as_str()),
        ("ttl 60000 ms", "ttl 120000 ms")
    );
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    // Turning it off again needs the state dropped.
    let mut off = old.clone();
    agg(&mut off).state_ttl_ms.clear();
    let r = check(&old, &off, &CheckContext::default(), &Actions::default()).unwrap();
    assert_eq!(only(&r, Code::StateTtlChanged).status, Status::NeedsAction);
}

/// Operator state (design §10.5): a changed layout of an operator state is
/// refused like a keyed one; a redistributable policy rescales with no finding; a
/// removed operator state needs an action; an added one is compatible; a description
/// missing on either side is never compared.
#[test]
fn operator_states_are_checked_like_keyed_states() {
    let mut new = base();
    buffer(&mut new).operator_states[0].schema_sha256 = Some("8".repeat(64));
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    assert_eq!(
        only(&r, Code::StateSchemaChanged).status,
        Status::Incompatible
    );

    let mut new = base();
    buffer(&mut new).operator_states[0].redistribution = Redistribution::SplitRegistry;
    buffer(&mut new).parallelism = 5;
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());

    let mut new = base();
    buffer(&mut new).operator_states[0].name = "queued".into();
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    assert_eq!(only(&r, Code::StateRemoved).status, Status::NeedsAction);
    assert_eq!(only(&r, Code::StateAdded).status, Status::Compatible);
    let renamed = Action::RenameState {
        operator: "operators/buffer".into(),
        from: "pending".into(),
        to: "queued".into(),
    };
    let r = run(&new, &CheckContext::default(), vec![renamed]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());

    let mut new = base();
    buffer(&mut new).operator_states[0].schema_sha256 = None;
    agg(&mut new).states[0].schema_sha256 = None;
    let r = run(&new, &CheckContext::default(), vec![]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
}

/// A config change that reshapes state values (the aggregate list of keyed-aggregate) is
/// refused unless the operator's whole state is dropped; a savepoint that predates layouts,
/// or a plugin that marks none, is not compared.
#[test]
fn a_changed_state_layout_is_incompatible_until_the_operator_state_is_dropped() {
    let with = |layout: Option<&str>| {
        let mut m = base();
        agg(&mut m).state_layout = layout.map(Into::into);
        m
    };
    let old = with(Some(
        "keyed-aggregate aggregates,key_field 1111111111111111",
    ));
    let check_against = |new: &SnapshotMeta, actions: Vec<Action>| {
        check(&old, new, &CheckContext::default(), &Actions { actions })
    };
    // The same layout: compatible.
    let r = check_against(&old.clone(), vec![]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    // Another layout: incompatible, with the remedy named.
    let other = with(Some(
        "keyed-aggregate aggregates,key_field 2222222222222222",
    ));
    let r = check_against(&other, vec![]).unwrap();
    let f = only(&r, Code::StateLayoutChanged);
    assert_eq!(f.status, Status::Incompatible);
    assert_eq!(f.remedies, vec!["drop-state".to_owned()]);
    assert_eq!(r.verdict, Status::Incompatible);
    assert!(
        r.to_text().contains("STATE_LAYOUT_CHANGED"),
        "{}",
        r.to_text()
    );
    // Dropping one state does not clear it (every state of the operator is shaped by the
    // config), so that action clears nothing and is an error.
    let one_state = Action::DropState {
        operator: "operators/agg".into(),
        state: Some("acc".into()),
    };
    assert!(check_against(&other, vec![one_state]).is_err());
    // Dropping the operator's state clears it.
    let all = Action::DropState {
        operator: "operators/agg".into(),
        state: None,
    };
    let r = check_against(&other, vec![all]).unwrap();
    assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    assert_eq!(
        only(&r, Code::StateLayoutChanged).cleared_by.as_deref(),
        Some("drop-state operators/agg")
    );
    // Either side without a layout: nothing to compare.
    for (a, b) in [(with(None), other.clone()), (old.clone(), with(None))] {
        let r = check(&a, &b, &CheckContext::default(), &Actions::default()).unwrap();
        assert_eq!(r.verdict, Status::Compatible, "{}", r.to_text());
    }
}
