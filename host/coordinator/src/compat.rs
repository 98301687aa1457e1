//! Savepoint compatibility (design §10.4–§10.6): what a manifest records of the job
//! ([`snapshot_meta`]), and the pure checker ([`check`]) that compares it with a new job
//! and the actions a user names, per operator, with stable finding codes.
//!
//! The checker never guesses: every finding that is not compatible names the actions that
//! clear it, and there is no global "ignore" switch. An action that clears nothing, or names
//! an operator or state that is not there, is an error. The verdict of the job is the worst
//! status of its operators: exit code 0 compatible, 2 needs action, 3 incompatible.

use nop_stream_api::{PartitionPolicy, Redistribution};
use nop_stream_checkpoint::{InputMeta, META_FORMAT, OperatorMeta, SnapshotMeta};
use nop_stream_core::{PartitionedPlan, key_spec, state_layout};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The WIT packages this host serves to components.
pub const SERVED_WIT: &[&str] = &["nop:stream@0.2.2"];

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// What the manifests of `plan` record (see [`SnapshotMeta`]); `components` maps operator
/// ids to the sha256 of the component that runs them (missing: recorded empty).
pub fn snapshot_meta(
    plan: &PartitionedPlan,
    components: &BTreeMap<String, String>,
) -> SnapshotMeta {
    let wit = SERVED_WIT[0];
    let mut operators = Vec::new();
    for v in &plan.vertices {
        for (i, op) in v.operators.iter().enumerate() {
            let inputs = if i > 0 {
                vec![InputMeta {
                    from: v.operators[i - 1].operator_id.to_string(),
                    output: None,
                    partition: PartitionPolicy::Forward.to_string(),
                    key_source: None,
                    key_spec: None,
                }]
            } else {
                plan.edges
                    .iter()
                    .filter(|e| e.to == v.id)
                    .filter_map(|e| {
                        let up = plan.vertex(&e.from)?.operators.last()?;
                        Some(InputMeta {
                            from: up.operator_id.to_string(),
                            output: e.output.clone(),
                            partition: e.partition.to_string(),
                            key_source: (e.partition == PartitionPolicy::Hash).then(|| {
                                let config = up.config.to_string();
                                format!(
                                    "{} {}",
                                    up.plugin_info.name,
                                    &sha256_hex(config.as_bytes())[..16]
                                )
                            }),
                            key_spec: (e.partition == PartitionPolicy::Hash)
                                .then(|| key_spec(&up.plugin_info, &up.config))
                                .flatten()
                                .map(|spec| {
                                    format!(
                                        "{} key {}",
                                        up.plugin_info.name,
                                        &sha256_hex(spec.as_bytes())[..16]
                                    )
                                }),
                        })
                    })
                    .collect()
            };
            operators.push(OperatorMeta {
                operator_id: op.operator_id.to_string(),
                origin: if op.operator_id.as_str() == op.model_path {
                    "model-path".into()
                } else {
                    "uid".into()
                },
                name: op.name.clone(),
                kind: op.kind,
                parallelism: v.parallelism,
                plugin: op.plugin_info.reference(),
                component_sha256: components
                    .get(op.operator_id.as_str())
                    .cloned()
                    .unwrap_or_default(),
                world: format!(
                    "{}/{}@{}",
                    "nop:stream",
                    op.kind,
                    &wit["nop:stream@".len()..]
                ),
                states: op.plugin_info.states.clone(),
                keyed: v.keyed,
                inputs,
                sink_protocol: op
                    .plugin_info
                    .sink_capability
                    .map(|c| format!("{}:{}", kebab(&format!("{c:?}")), op.plugin_info.name)),
                state_ttl_ms: op.state_ttl_ms.clone(),
                operator_states: op.plugin_info.operator_states.clone(),
                state_layout: (!op.plugin_info.states.is_empty()
                    || !op.plugin_info.operator_states.is_empty())
                .then(|| state_layout(&op.plugin_info, &op.config))
                .flatten()
                .map(|layout| {
                    let names: Vec<String> =
                        serde_json::from_str::<BTreeMap<String, serde_json::Value>>(&layout)
                            .map(|m| m.into_keys().collect())
                            .unwrap_or_default();
                    format!(
                        "{} {} {}",
                        op.plugin_info.name,
                        names.join(","),
                        &sha256_hex(layout.as_bytes())[..16]
                    )
                }),
            });
        }
    }
    let mut meta = SnapshotMeta {
        format: META_FORMAT,
        host_version: env!("CARGO_PKG_VERSION").to_owned(),
        wit_packages: SERVED_WIT.iter().map(|s| (*s).to_owned()).collect(),
        plan_fingerprint: plan.fingerprint.clone(),
        state_topology_fingerprint: String::new(),
        state_shard_count: plan.job.state_shard_count,
        hash_policy: format!("{}/v{}", plan.hash_policy.name, plan.hash_policy.version),
        semantic: plan.job.semantic.to_string(),
        operators,
    };
    meta.state_topology_fingerprint = state_topology_fingerprint(&meta);
    meta
}

fn kebab(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// sha256 over what routes and shapes state: per stateful or keyed operator its id,
/// state descriptors and inputs (partition and key source), plus the shard count and the
/// hash policy. Parallelism, plugin versions and other config are left out.
///
/// It hashes a canonical form (design §4): operators sorted by id and their keyed and
/// operator states by name, so neither the order of a job file's declarations nor the
/// order in which a plugin lists its states changes it. An operator's inputs keep their
/// order (the input index is meaning). [`check`] recomputes a savepoint's value rather
/// than trusting the one it recorded, so savepoints recorded in declaration order
/// compare by content.
pub fn state_topology_fingerprint(meta: &SnapshotMeta) -> String {
    let mut stateful: Vec<&OperatorMeta> = meta
        .operators
        .iter()
        .filter(|o| o.keyed || !o.states.is_empty() || !o.operator_states.is_empty())
        .collect();
    stateful.sort_by(|a, b| a.operator_id.cmp(&b.operator_id));
    let ops: Vec<_> = stateful
        .into_iter()
        .map(|o| {
            let mut states = o.states.clone();
            states.sort_by(|a, b| a.name.cmp(&b.name));
            // An input's keys are decided by its key spec where one is recorded.
            let inputs: Vec<InputMeta> = o
                .inputs
                .iter()
                .map(|i| InputMeta {
                    key_source: i.key_spec.clone().or_else(|| i.key_source.clone()),
                    key_spec: None,
                    ..i.clone()
                })
                .collect();
            let mut v = serde_json::json!([&o.operator_id, states, inputs]);
            if !o.operator_states.is_empty() {
                let mut op_states = o.operator_states.clone();
                op_states.sort_by(|a, b| a.name.cmp(&b.name));
                v.as_array_mut()
                    .expect("an array")
                    .push(serde_json::json!(op_states));
            }
            v
        })
        .collect();
    let doc = serde_json::json!({
        "shards": meta.state_shard_count,
        "hash": meta.hash_policy,
        "operators": ops,
    });
    sha256_hex(doc.to_string().as_bytes())
}

/// How a finding bears on restoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Restores as it is.
    Compatible,
    /// Restores once a named action clears it.
    NeedsAction,
    /// Cannot be restored by this job.
    Incompatible,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Compatible => "compatible",
            Status::NeedsAction => "needs-action",
            Status::Incompatible => "incompatible",
        })
    }
}

impl Status {
    /// The exit code of a check with this verdict: 0, 2 or 3.
    pub fn exit_code(self) -> u8 {
        match self {
            Status::Compatible => 0,
            Status::NeedsAction => 2,
            Status::Incompatible => 3,
        }
    }
}

/// Stable finding codes. Tests and tools match on these, never on the prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    /// The savepoint's meta format is newer than this host (incompatible).
    ManifestFormatNewer,
    /// The savepoint has no meta (written by an older host): nothing can be compared.
    ManifestWithoutMeta,
    /// An operator's parallelism changed within the shard count (compatible: a rescale).
    ParallelismChanged,
    /// A keyed operator's parallelism exceeds the shard count (incompatible).
    ParallelismExceedsShards,
    /// The plugin's code changed (version or component), its state descriptors did not
    /// (compatible; the report shows both hashes).
    PluginLogicChanged,
    /// The new plugin's world is not one this host serves, or its component was built
    /// against a `nop:stream` version this host does not serve (incompatible; nothing but
    /// a rebuilt component clears it).
    WitNotServed,
    /// An operator declares a state the savepoint lacks (compatible: it starts empty).
    StateAdded,
    /// A state of the savepoint is gone from the operator (needs `drop-state` or
    /// `rename-state`).
    StateRemoved,
    /// A state's schema version rose (needs `migrate-state`, or `drop-state`).
    StateSchemaBumped,
    /// A state's schema version went down (incompatible).
    StateSchemaDowngraded,
    /// A state's values changed structure under the same schema version: the plugins'
    /// schema descriptions (WIT `state-declarations`) differ (incompatible; bump the
    /// schema version and export a migration, or `drop-state`). Not checked when either
    /// plugin gives no description.
    StateSchemaChanged,
    /// A non-keyed operator state without a redistribution policy (`none`) at another
    /// parallelism (needs `drop-state`, design §10.5).
    NonKeyedStateNotRedistributable,
    /// A state's codec changed (needs `migrate-state` or `drop-state`).
    StateCodecChanged,
    /// A state's kind (value, list, map) changed (incompatible; `drop-state` clears it).
    StateKindChanged,
    /// A state's time-to-live was turned on or off (needs `drop-state`: the stored values
    /// gain or lose their write-time prefix); a changed duration is compatible and
    /// reported.
    StateTtlChanged,
    /// What decides the keys of a keyed operator changed: the upstream plugin, or the
    /// config properties its schema marks `x-key-spec` (its whole config when it marks
    /// none, or when the savepoint predates key specs) (incompatible; `drop-state` clears
    /// it).
    KeySpecChanged,
    /// The config properties a stateful operator's plugin marks `x-state-layout` (those
    /// that shape its state values, e.g. keyed-aggregate's `aggregates`) changed: state
    /// written under the old values cannot be read under the new (incompatible;
    /// `drop-state` of the operator clears it). Not checked when either side records none.
    StateLayoutChanged,
    /// The shard count changed (needs `reshard`).
    ShardCountChanged,
    /// The hash policy changed (needs `reshard`).
    HashPolicyChanged,
    /// The partitioning of an edge into a keyed operator changed (incompatible).
    EdgePartitionChanged,
    /// A stateless operator is new or gone (compatible).
    StatelessOperatorChanged,
    /// A stateful operator of the savepoint is gone (needs `drop-state` or
    /// `rename-operator`).
    StatefulOperatorRemoved,
    /// A stateful operator is new (needs `init-empty`, or `rename-operator` from the old id).
    StatefulOperatorAdded,
    /// A sink's protocol changed while it has pending committables (needs
    /// `finalize-sink`).
    SinkProtocolChanged,
    /// The semantic mode is weaker than the savepoint's (needs `accept-semantic-change`).
    SemanticWeakened,
    /// The target namespace has durable epochs past the savepoint's (needs `fork`).
    NamespaceAdvanced,
    /// A segment the savepoint's manifest references is missing, short or fails its
    /// checksum (incompatible: nothing restores a damaged savepoint; the finding names the
    /// file).
    SavepointDamaged,
}

/// An action a user names to clear a finding (`--actions A.toml`, `[[action]]` tables).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Action {
    /// Drop a state of an operator, or all its state when `state` is absent.
    DropState {
        /// Operator id (as the savepoint has it).
        operator: String,
        /// State name; absent: every state of the operator.
        state: Option<String>,
    },
    /// The operator the savepoint calls `from` is `to` in the new job.
    RenameOperator {
        /// Old operator id.
        from: String,
        /// New operator id.
        to: String,
    },
    /// The state `from` of `operator` is `to` now.
    RenameState {
        /// Operator id (new).
        operator: String,
        /// Old state name.
        from: String,
        /// New state name.
        to: String,
    },
    /// A new stateful operator starts with empty state.
    InitEmpty {
        /// Operator id.
        operator: String,
    },
    /// Migrate a state to the new plugin's schema version (and codec) with that plugin's
    /// `nop:stream/state-migration` export.
    MigrateState {
        /// Operator id (new, after any rename-operator).
        operator: String,
        /// State name (new, after any rename-state).
        state: String,
    },
    /// Redistribute every key to a new shard count or hash policy.
    Reshard {
        /// New shard count.
        shards: u32,
    },
    /// Commit the old sink's pending committables with the old plugin first (design
    /// §10.6): the host opens `with` as the operator was configured in the old
    /// job file `job`, commits (or recovers) every pending committable the savepoint
    /// records for `operator`, and the restore then starts without them. The component
    /// must be the one the savepoint records (same sha256).
    FinalizeSink {
        /// Operator id (as the savepoint has it).
        operator: String,
        /// The old plugin, `name@version`.
        with: String,
        /// The job file the savepoint was taken with (for the sink's config, grants and
        /// connections); relative paths are relative to the actions file.
        job: String,
    },
    /// Accept a weaker semantic mode.
    AcceptSemanticChange {
        /// The savepoint's mode.
        from: String,
        /// The new mode.
        to: String,
    },
    /// Restore into a new checkpoint namespace with new transaction ids: the restored job
    /// runs as pipeline lineage `namespace` (job-file `[job] pipeline`), so its checkpoints
    /// live in namespace `<job>.<namespace>` and its sink transaction ids carry it; it shares
    /// neither with the job it forks from (design §3.1). Only on `run --from-savepoint`.
    Fork {
        /// The new pipeline lineage id (`[A-Za-z0-9][A-Za-z0-9._-]*`).
        namespace: String,
    },
}

impl Action {
    /// The action as a user writes it, for messages.
    pub fn describe(&self) -> String {
        match self {
            Action::DropState { operator, state } => match state {
                Some(s) => format!("drop-state {operator}/{s}"),
                None => format!("drop-state {operator}"),
            },
            Action::RenameOperator { from, to } => format!("rename-operator {from}->{to}"),
            Action::RenameState { operator, from, to } => {
                format!("rename-state {operator}/{from}->{to}")
            }
            Action::InitEmpty { operator } => format!("init-empty {operator}"),
            Action::MigrateState { operator, state } => format!("migrate-state {operator}/{state}"),
            Action::Reshard { shards } => format!("reshard {shards}"),
            Action::FinalizeSink { operator, with, .. } => {
                format!("finalize-sink {operator} with {with}")
            }
            Action::AcceptSemanticChange { from, to } => {
                format!("accept-semantic-change {from}->{to}")
            }
            Action::Fork { namespace } => format!("fork {namespace}"),
        }
    }

    /// Whether this host can carry the action out, on restore and in `savepoint migrate`
    /// ([`crate::migrate::apply`]; `fork` on restore only; `finalize-sink` needs the
    /// caller to have committed the pending committables with the old plugin first).
    pub fn supported(&self) -> bool {
        matches!(
            self,
            Action::DropState { .. }
                | Action::RenameOperator { .. }
                | Action::RenameState { .. }
                | Action::InitEmpty { .. }
                | Action::Reshard { .. }
                | Action::MigrateState { .. }
                | Action::AcceptSemanticChange { .. }
                | Action::Fork { .. }
                | Action::FinalizeSink { .. }
        )
    }
}

/// The `[[action]]` tables of an actions file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Actions {
    /// The actions, in file order.
    #[serde(default, rename = "action")]
    pub actions: Vec<Action>,
}

/// One finding about one operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable code.
    pub code: Code,
    /// How it bears on restoring, before actions.
    pub status: Status,
    /// The state concerned, if one.
    pub state: Option<String>,
    /// What the savepoint has.
    pub old: String,
    /// What the new job has.
    pub new: String,
    /// Actions that clear it (as written in an actions file's `kind`), none for findings
    /// that are compatible or that nothing clears.
    pub remedies: Vec<String>,
    /// The action that cleared it, if one did.
    pub cleared_by: Option<String>,
}

impl Finding {
    /// The status once actions are applied.
    pub fn effective(&self) -> Status {
        if self.cleared_by.is_some() {
            Status::Compatible
        } else {
            self.status
        }
    }
}

/// One operator's part of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorReport {
    /// Operator id (new, or old if it is gone).
    pub operator_id: String,
    /// Plugin in the savepoint (`name@version`), if the operator was there.
    pub plugin_old: Option<String>,
    /// Plugin in the new job, if the operator is there.
    pub plugin_new: Option<String>,
    /// Worst effective status of its findings.
    pub status: Status,
    /// Its findings.
    pub findings: Vec<Finding>,
}

/// The result of [`check`]: versioned JSON (`nopstream.compat-report/v1`) or a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// `nopstream.compat-report/v1`.
    pub format: String,
    /// Findings about the job as a whole (format, shards, hash policy, semantics,
    /// namespace).
    pub job: Vec<Finding>,
    /// Per operator, in the new job's order, then operators gone.
    pub operators: Vec<OperatorReport>,
    /// State-topology fingerprints, savepoint and new job.
    pub state_topology: (String, String),
    /// Plan fingerprints, savepoint and new job.
    pub plan: (String, String),
    /// The actions applied, as written.
    pub actions: Vec<String>,
    /// The worst effective status.
    pub verdict: Status,
}

/// Why the actions are wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// An action clears no finding.
    #[error("action `{0}` clears no finding of this check; remove it")]
    Unused(String),
    /// An action this host cannot carry out yet.
    #[error("action `{0}` is not supported by this host")]
    Unsupported(String),
}

/// What else the check needs to know of the savepoint and the target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckContext {
    /// Committables pending per sink operator id in the savepoint.
    pub pending_committables: BTreeMap<String, usize>,
    /// The latest durable epoch of the namespace the job would restore into, and the
    /// savepoint's epoch.
    pub namespace_epochs: Option<(u64, u64)>,
}

fn semantic_rank(s: &str) -> u8 {
    match s {
        "strict-exactly-once" => 3,
        "effectively-once" => 2,
        "at-least-once" => 1,
        _ => 0,
    }
}

fn finding(
    code: Code,
    status: Status,
    state: Option<&str>,
    old: impl Into<String>,
    new: impl Into<String>,
    remedies: &[&str],
) -> Finding {
    Finding {
        code,
        status,
        state: state.map(str::to_owned),
        old: old.into(),
        new: new.into(),
        remedies: remedies.iter().map(|s| (*s).to_owned()).collect(),
        cleared_by: None,
    }
}

/// Compares the savepoint's `old` meta with the `new` job's and applies `actions`.
///
/// # Errors
/// [`ActionError`] for an action that clears nothing (a typo must not pass silently) or
/// that this host cannot carry out.
pub fn check(
    old: &SnapshotMeta,
    new: &SnapshotMeta,
    ctx: &CheckContext,
    actions: &Actions,
) -> Result<Report, ActionError> {
    let used: Vec<std::cell::Cell<bool>> = vec![std::cell::Cell::new(false); actions.actions.len()];
    let clear = |f: &mut Finding, matches: &dyn Fn(&Action) -> bool| {
        if f.status == Status::Compatible || f.cleared_by.is_some() {
            return;
        }
        if let Some(i) = actions.actions.iter().position(matches) {
            used[i].set(true);
            f.cleared_by = Some(actions.actions[i].describe());
        }
    };
    let mut job = Vec::new();
    if old.format > META_FORMAT {
        job.push(finding(
            Code::ManifestFormatNewer,
            Status::Incompatible,
            None,
            old.format.to_string(),
            META_FORMAT.to_string(),
            &[],
        ));
    }
    if old.state_shard_count != new.state_shard_count {
        let mut f = finding(
            Code::ShardCountChanged,
            Status::NeedsAction,
            None,
            old.state_shard_count.to_string(),
            new.state_shard_count.to_string(),
            &["reshard"],
        );
        clear(
            &mut f,
            &|a| matches!(a, Action::Reshard { shards } if *shards == new.state_shard_count),
        );
        job.push(f);
    }
    if old.hash_policy != new.hash_policy {
        let mut f = finding(
            Code::HashPolicyChanged,
            Status::NeedsAction,
            None,
            &old.hash_policy,
            &new.hash_policy,
            &["reshard"],
        );
        clear(&mut f, &|a| matches!(a, Action::Reshard { .. }));
        job.push(f);
    }
    if semantic_rank(&new.semantic) < semantic_rank(&old.semantic) {
        let mut f = finding(
            Code::SemanticWeakened,
            Status::NeedsAction,
            None,
            &old.semantic,
            &new.semantic,
            &["accept-semantic-change"],
        );
        clear(
            &mut f,
            &|a| matches!(a, Action::AcceptSemanticChange { from, to } if *from == old.semantic && *to == new.semantic),
        );
        job.push(f);
    }
    if let Some((latest, sp)) = ctx.namespace_epochs
        && latest > sp
    {
        let mut f = finding(
            Code::NamespaceAdvanced,
            Status::Incompatible,
            None,
            format!("savepoint epoch {sp}"),
            format!("namespace at epoch {latest}"),
            &["fork"],
        );
        clear(&mut f, &|a| matches!(a, Action::Fork { .. }));
        job.push(f);
    }

    // Operators: renames map old ids to new ones.
    let renames: BTreeMap<&str, &str> = actions
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::RenameOperator { from, to } => Some((from.as_str(), to.as_str())),
            _ => None,
        })
        .collect();
    let old_by_new_id: BTreeMap<String, &OperatorMeta> = old
        .operators
        .iter()
        .map(|o| {
            let id = renames
                .get(o.operator_id.as_str())
                .copied()
                .unwrap_or(&o.operator_id);
            (id.to_owned(), o)
        })
        .collect();
    let new_ids: BTreeSet<&str> = new
        .operators
        .iter()
        .map(|o| o.operator_id.as_str())
        .collect();
    let stateful = |o: &OperatorMeta| !o.states.is_empty() || !o.operator_states.is_empty();
    let mut operators = Vec::new();
    for n in &new.operators {
        let mut findings = Vec::new();
        let Some(o) = old_by_new_id.get(&n.operator_id).copied() else {
            if stateful(n) {
                let mut f = finding(
                    Code::StatefulOperatorAdded,
                    Status::NeedsAction,
                    None,
                    "",
                    &n.plugin,
                    &["init-empty", "rename-operator"],
                );
                clear(
                    &mut f,
                    &|a| matches!(a, Action::InitEmpty { operator } if *operator == n.operator_id),
                );
                findings.push(f);
            } else {
                findings.push(finding(
                    Code::StatelessOperatorChanged,
                    Status::Compatible,
                    None,
                    "",
                    format!("added ({})", n.plugin),
                    &[],
                ));
            }
            operators.push(report(
                n.operator_id.clone(),
                None,
                Some(n.plugin.clone()),
                findings,
            ));
            continue;
        };
        if renames.contains_key(o.operator_id.as_str()) {
            let i = actions
                .actions
                .iter()
                .position(
                    |a| matches!(a, Action::RenameOperator { from, .. } if *from == o.operator_id),
                )
                .expect("a rename maps it");
            used[i].set(true);
        }
        if o.parallelism != n.parallelism {
            let over = n.keyed && n.parallelism > new.state_shard_count;
            findings.push(finding(
                if over {
                    Code::ParallelismExceedsShards
                } else {
                    Code::ParallelismChanged
                },
                if over {
                    Status::Incompatible
                } else {
                    Status::Compatible
                },
                None,
                o.parallelism.to_string(),
                n.parallelism.to_string(),
                if over { &["reshard"] } else { &[] },
            ));
        }
        if o.plugin != n.plugin || o.component_sha256 != n.component_sha256 {
            findings.push(finding(
                Code::PluginLogicChanged,
                Status::Compatible,
                None,
                format!("{} sha256 {}", o.plugin, short(&o.component_sha256)),
                format!("{} sha256 {}", n.plugin, short(&n.component_sha256)),
                &[],
            ));
        }
        if !new
            .wit_packages
            .iter()
            .any(|w| n.world.ends_with(&w["nop:stream".len()..]))
        {
            findings.push(finding(
                Code::WitNotServed,
                Status::Incompatible,
                None,
                &o.world,
                &n.world,
                &[],
            ));
        }
        // States, with renames.
        let state_renames: BTreeMap<&str, &str> = actions
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::RenameState { operator, from, to } if *operator == n.operator_id => {
                    Some((from.as_str(), to.as_str()))
                }
                _ => None,
            })
            .collect();
        let dropped_all = actions.actions.iter().any(|a| {
            matches!(a, Action::DropState { operator, state: None } if *operator == o.operator_id)
        });
        for s in &o.states {
            let new_name = state_renames
                .get(s.name.as_str())
                .copied()
                .unwrap_or(&s.name);
            match n.states.iter().find(|x| x.name == new_name) {
                None => {
                    let mut f = finding(
                        Code::StateRemoved,
                        Status::NeedsAction,
                        Some(&s.name),
                        &s.name,
                        "",
                        &["drop-state", "rename-state"],
                    );
                    clear(&mut f, &|a| drops(a, &o.operator_id, &s.name));
                    findings.push(f);
                }
                Some(ns) => {
                    if new_name != s.name {
                        let i = actions.actions.iter().position(|a| {
                            matches!(a, Action::RenameState { operator, from, .. } if *operator == n.operator_id && *from == s.name)
                        });
                        if let Some(i) = i {
                            used[i].set(true);
                        }
                    }
                    let mut state_finding =
                        |code, status, old: String, new: String, remedies: &[&str]| {
                            let mut f = finding(code, status, Some(&s.name), old, new, remedies);
                            let migratable = remedies.contains(&"migrate-state");
                            clear(&mut f, &|a| {
                                drops(a, &o.operator_id, &s.name)
                                    || (migratable
                                        && matches!(a, Action::MigrateState { operator, state } if *operator == n.operator_id && state == new_name))
                            });
                            findings.push(f);
                        };
                    if ns.kind != s.kind {
                        state_finding(
                            Code::StateKindChanged,
                            Status::Incompatible,
                            format!("{:?}", s.kind),
                            format!("{:?}", ns.kind),
                            &["drop-state"],
                        );
                    }
                    if ns.schema_version > s.schema_version {
                        state_finding(
                            Code::StateSchemaBumped,
                            Status::NeedsAction,
                            format!("v{}", s.schema_version),
                            format!("v{}", ns.schema_version),
                            &["migrate-state", "drop-state"],
                        );
                    } else if ns.schema_version < s.schema_version {
                        state_finding(
                            Code::StateSchemaDowngraded,
                            Status::Incompatible,
                            format!("v{}", s.schema_version),
                            format!("v{}", ns.schema_version),
                            &["drop-state"],
                        );
                    }
                    if ns.schema_version == s.schema_version
                        && let (Some(a), Some(b)) = (&s.schema_sha256, &ns.schema_sha256)
                        && a != b
                    {
                        state_finding(
                            Code::StateSchemaChanged,
                            Status::Incompatible,
                            format!("v{} schema {}", s.schema_version, short(a)),
                            format!("v{} schema {}", ns.schema_version, short(b)),
                            &["drop-state"],
                        );
                    }
                    if ns.codec != s.codec {
                        state_finding(
                            Code::StateCodecChanged,
                            Status::NeedsAction,
                            s.codec.clone(),
                            ns.codec.clone(),
                            &["migrate-state", "drop-state"],
                        );
                    }
                    let old_ttl = o.state_ttl_ms.get(&s.name).copied();
                    let new_ttl = n.state_ttl_ms.get(new_name).copied();
                    if old_ttl != new_ttl {
                        let show = |t: Option<u64>| {
                            t.map_or_else(|| "no ttl".to_owned(), |t| format!("ttl {t} ms"))
                        };
                        // On or off changes the stored encoding; another duration does not.
                        let (status, remedies): (Status, &[&str]) =
                            if old_ttl.is_some() == new_ttl.is_some() {
                                (Status::Compatible, &[])
                            } else {
                                (Status::NeedsAction, &["drop-state"])
                            };
                        let mut f = finding(
                            Code::StateTtlChanged,
                            status,
                            Some(&s.name),
                            show(old_ttl),
                            show(new_ttl),
                            remedies,
                        );
                        if status != Status::Compatible {
                            clear(&mut f, &|a| drops(a, &o.operator_id, &s.name));
                        }
                        findings.push(f);
                    }
                }
            }
        }
        for s in &n.states {
            let was = o.states.iter().any(|x| {
                state_renames
                    .get(x.name.as_str())
                    .copied()
                    .unwrap_or(&x.name)
                    == s.name
            });
            if !was || dropped_all {
                findings.push(finding(
                    Code::StateAdded,
                    Status::Compatible,
                    Some(&s.name),
                    "",
                    format!("v{} {}", s.schema_version, s.codec),
                    &[],
                ));
            }
        }
        operator_state_findings(
            (o, n),
            actions,
            &used,
            &clear,
            &state_renames,
            &mut findings,
        );
        // Keys and partitioning of a keyed operator's inputs.
        if n.keyed && stateful(o) {
            for (oi, ni) in o.inputs.iter().zip(&n.inputs) {
                let from_same =
                    renames.get(oi.from.as_str()).copied().unwrap_or(&oi.from) == ni.from;
                if oi.partition != ni.partition || !from_same {
                    let mut f = finding(
                        Code::EdgePartitionChanged,
                        Status::Incompatible,
                        None,
                        format!("{} from {}", oi.partition, oi.from),
                        format!("{} from {}", ni.partition, ni.from),
                        &["drop-state"],
                    );
                    clear(&mut f, &|a| drops(a, &o.operator_id, ""));
                    findings.push(f);
                } else if let Some((from, to)) = key_change(oi, ni) {
                    let mut f = finding(
                        Code::KeySpecChanged,
                        Status::Incompatible,
                        None,
                        from,
                        to,
                        &["drop-state"],
                    );
                    clear(&mut f, &|a| drops(a, &o.operator_id, ""));
                    findings.push(f);
                }
            }
        }
        if stateful(o)
            && let (Some(a), Some(b)) = (&o.state_layout, &n.state_layout)
            && a != b
        {
            let mut f = finding(
                Code::StateLayoutChanged,
                Status::Incompatible,
                None,
                a,
                b,
                &["drop-state"],
            );
            clear(&mut f, &|a| drops(a, &o.operator_id, ""));
            findings.push(f);
        }
        if o.sink_protocol != n.sink_protocol
            && ctx
                .pending_committables
                .get(&o.operator_id)
                .copied()
                .unwrap_or(0)
                > 0
        {
            let mut f = finding(
                Code::SinkProtocolChanged,
                Status::NeedsAction,
                None,
                o.sink_protocol.clone().unwrap_or_default(),
                n.sink_protocol.clone().unwrap_or_default(),
                &["finalize-sink"],
            );
            clear(
                &mut f,
                &|a| matches!(a, Action::FinalizeSink { operator, .. } if *operator == n.operator_id),
            );
            findings.push(f);
        }
        operators.push(report(
            n.operator_id.clone(),
            Some(o.plugin.clone()),
            Some(n.plugin.clone()),
            findings,
        ));
    }
    // Operators of the savepoint that the new job lacks.
    for o in &old.operators {
        let id = renames
            .get(o.operator_id.as_str())
            .copied()
            .unwrap_or(&o.operator_id);
        if new_ids.contains(id) {
            continue;
        }
        let mut findings = Vec::new();
        if stateful(o) {
            let mut f = finding(
                Code::StatefulOperatorRemoved,
                Status::NeedsAction,
                None,
                &o.plugin,
                "",
                &["drop-state", "rename-operator"],
            );
            clear(
                &mut f,
                &|a| matches!(a, Action::DropState { operator, state: None } if *operator == o.operator_id),
            );
            findings.push(f);
        } else {
            findings.push(finding(
                Code::StatelessOperatorChanged,
                Status::Compatible,
                None,
                format!("removed ({})", o.plugin),
                "",
                &[],
            ));
        }
        operators.push(report(
            o.operator_id.clone(),
            Some(o.plugin.clone()),
            None,
            findings,
        ));
    }
    if let Some(i) = used.iter().position(|u| !u.get()) {
        return Err(ActionError::Unused(actions.actions[i].describe()));
    }
    if let Some(a) = actions.actions.iter().find(|a| !a.supported()) {
        return Err(ActionError::Unsupported(a.describe()));
    }
    let verdict = job
        .iter()
        .map(Finding::effective)
        .chain(operators.iter().map(|o| o.status))
        .max()
        .unwrap_or(Status::Compatible);
    Ok(Report {
        format: "nopstream.compat-report/v1".into(),
        job,
        operators,
        state_topology: (
            state_topology_fingerprint(old),
            state_topology_fingerprint(new),
        ),
        plan: (old.plan_fingerprint.clone(), new.plan_fingerprint.clone()),
        actions: actions.actions.iter().map(Action::describe).collect(),
        verdict,
    })
}

/// A component a job names that this host cannot load because it was built against a
/// `nop:stream` WIT version the host does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnservedComponent {
    /// The operator id it would run (design §3.2).
    pub operator_id: String,
    /// The plugin reference as the job file names it.
    pub plugin: String,
    /// The package version it was built against, e.g. `nop:stream@0.1.0`.
    pub built_for: String,
    /// What this host serves, e.g. `nop:stream@0.2.2`.
    pub served: String,
}

/// The report of a savepoint check whose new job names components built for a WIT
/// version this host does not serve: one [`Code::WitNotServed`] finding (incompatible,
/// nothing clears it but a rebuilt component) per such component. The rest of a check
/// needs every component's `describe()`, so the report holds only these findings; the
/// new side's fingerprints are empty.
pub fn unserved_components_report(old: &SnapshotMeta, unserved: &[UnservedComponent]) -> Report {
    let operators: Vec<OperatorReport> = unserved
        .iter()
        .map(|u| {
            let before = old
                .operators
                .iter()
                .find(|o| o.operator_id == u.operator_id);
            report(
                u.operator_id.clone(),
                before.map(|o| o.plugin.clone()),
                Some(u.plugin.clone()),
                vec![finding(
                    Code::WitNotServed,
                    Status::Incompatible,
                    None,
                    before.map_or_else(String::new, |o| o.world.clone()),
                    format!(
                        "built for {}; this host serves {} (rebuild the plugin with this \
                         host's nop-stream-sdk)",
                        u.built_for, u.served
                    ),
                    &[],
                )],
            )
        })
        .collect();
    Report {
        format: "nopstream.compat-report/v1".into(),
        job: Vec::new(),
        verdict: operators
            .iter()
            .map(|o| o.status)
            .max()
            .unwrap_or(Status::Compatible),
        operators,
        state_topology: (state_topology_fingerprint(old), String::new()),
        plan: (old.plan_fingerprint.clone(), String::new()),
        actions: Vec::new(),
    }
}

/// What decided the keys of a HASH input before and after, when it changed: the key specs
/// when both metas record one (the upstream's config properties marked `x-key-spec`),
/// else the upstream's whole config (`key_source`).
fn key_change(old: &InputMeta, new: &InputMeta) -> Option<(String, String)> {
    let (o, n) = match (&old.key_spec, &new.key_spec) {
        (Some(o), Some(n)) => (Some(o), Some(n)),
        _ => (old.key_source.as_ref(), new.key_source.as_ref()),
    };
    (o != n).then(|| {
        (
            o.cloned().unwrap_or_default(),
            n.cloned().unwrap_or_default(),
        )
    })
}

/// Marks a finding cleared by the first action matching the predicate.
type ClearFn<'a> = dyn Fn(&mut Finding, &dyn Fn(&Action) -> bool) + 'a;

/// Findings on the non-keyed operator states of one operator (renamed by
/// `state_renames`): removed, added, schema and codec changes, and a state without a
/// redistribution policy at another parallelism (design §10.5). Operator states have no
/// `migrate-state`: a changed encoding needs `drop-state`.
fn operator_state_findings(
    (o, n): (&OperatorMeta, &OperatorMeta),
    actions: &Actions,
    used: &[std::cell::Cell<bool>],
    clear: &ClearFn<'_>,
    state_renames: &BTreeMap<&str, &str>,
    findings: &mut Vec<Finding>,
) {
    let renamed =
        |name: &str| -> String { state_renames.get(name).copied().unwrap_or(name).to_owned() };
    for s in &o.operator_states {
        let new_name = renamed(&s.name);
        let mut push = |code, status, old: String, new: String, remedies: &[&str]| {
            let mut f = finding(code, status, Some(&s.name), old, new, remedies);
            clear(&mut f, &|a| drops(a, &o.operator_id, &s.name));
            findings.push(f);
        };
        let Some(ns) = n.operator_states.iter().find(|x| x.name == new_name) else {
            push(
                Code::StateRemoved,
                Status::NeedsAction,
                format!("operator state {}", s.name),
                String::new(),
                &["drop-state", "rename-state"],
            );
            continue;
        };
        if new_name != s.name
            && let Some(i) = actions.actions.iter().position(|a| {
                matches!(a, Action::RenameState { operator, from, .. } if *operator == n.operator_id && *from == s.name)
            })
        {
            used[i].set(true);
        }
        if ns.schema_version != s.schema_version || ns.codec != s.codec {
            push(
                if ns.codec != s.codec {
                    Code::StateCodecChanged
                } else if ns.schema_version > s.schema_version {
                    Code::StateSchemaBumped
                } else {
                    Code::StateSchemaDowngraded
                },
                if ns.schema_version < s.schema_version {
                    Status::Incompatible
                } else {
                    Status::NeedsAction
                },
                format!("operator state v{} {}", s.schema_version, s.codec),
                format!("operator state v{} {}", ns.schema_version, ns.codec),
                &["drop-state"],
            );
        } else if let (Some(a), Some(b)) = (&s.schema_sha256, &ns.schema_sha256)
            && a != b
        {
            push(
                Code::StateSchemaChanged,
                Status::Incompatible,
                format!("operator state v{} schema {}", s.schema_version, short(a)),
                format!("operator state v{} schema {}", ns.schema_version, short(b)),
                &["drop-state"],
            );
        }
        if o.parallelism != n.parallelism && ns.redistribution == Redistribution::None {
            push(
                Code::NonKeyedStateNotRedistributable,
                Status::NeedsAction,
                format!("operator state {} at parallelism {}", s.name, o.parallelism),
                format!("redistribution none at parallelism {}", n.parallelism),
                &["drop-state"],
            );
        }
    }
    let dropped_all = actions.actions.iter().any(
        |a| matches!(a, Action::DropState { operator, state: None } if *operator == o.operator_id),
    );
    for s in &n.operator_states {
        let was = o.operator_states.iter().any(|x| renamed(&x.name) == s.name);
        if !was || dropped_all {
            findings.push(finding(
                Code::StateAdded,
                Status::Compatible,
                Some(&s.name),
                "",
                format!(
                    "operator state v{} {} {}",
                    s.schema_version, s.codec, s.redistribution
                ),
                &[],
            ));
        }
    }
}

/// Whether `a` drops `state` of `operator` (or all of the operator's state; `state` ""
/// asks for the whole operator only).
fn drops(a: &Action, operator: &str, state: &str) -> bool {
    match a {
        Action::DropState {
            operator: o,
            state: s,
        } if o == operator => match s {
            None => true,
            Some(s) => !state.is_empty() && s == state,
        },
        _ => false,
    }
}

fn short(sha: &str) -> &str {
    if sha.is_empty() {
        "unknown"
    } else {
        &sha[..sha.len().min(12)]
    }
}

fn report(
    operator_id: String,
    plugin_old: Option<String>,
    plugin_new: Option<String>,
    findings: Vec<Finding>,
) -> OperatorReport {
    OperatorReport {
        status: findings
            .iter()
            .map(Finding::effective)
            .max()
            .unwrap_or(Status::Compatible),
        operator_id,
        plugin_old,
        plugin_new,
        findings,
    }
}

impl Report {
    /// The report as a table: one block per operator (status, plugin old → new, findings
    /// with their remedies), then the verdict.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "state topology {} -> {}{}\nplan           {} -> {}\n\n",
            short(&self.state_topology.0),
            short(&self.state_topology.1),
            if self.state_topology.0 == self.state_topology.1 {
                " (unchanged)"
            } else {
                ""
            },
            short(&self.plan.0),
            short(&self.plan.1),
        ));
        let line = |f: &Finding| {
            let what = match &f.state {
                Some(s) => format!("{:?} {s}", f.code),
                None => format!("{:?}", f.code),
            };
            let change = if f.old.is_empty() && f.new.is_empty() {
                String::new()
            } else {
                format!(" {} -> {}", f.old, f.new)
            };
            let after = match (&f.cleared_by, f.remedies.is_empty(), f.status) {
                (Some(a), _, _) => format!("  [cleared by {a}]"),
                (None, false, s) if s != Status::Compatible => {
                    format!("  -> {}", f.remedies.join(" | "))
                }
                _ => String::new(),
            };
            format!("{}{change}{after}", screaming(&what))
        };
        for f in &self.job {
            out.push_str(&format!(
                "job: {:<12} {}\n",
                f.effective().to_string(),
                line(f)
            ));
        }
        out.push_str(&format!(
            "{:<36} {:<44} {:<13} findings\n",
            "operator", "plugin", "status"
        ));
        for o in &self.operators {
            let plugin = match (&o.plugin_old, &o.plugin_new) {
                (Some(a), Some(b)) if a == b => a.clone(),
                (Some(a), Some(b)) => format!("{a} -> {b}"),
                (Some(a), None) => format!("{a} (gone)"),
                (None, Some(b)) => format!("{b} (new)"),
                (None, None) => String::new(),
            };
            let mut lines = o.findings.iter().map(line);
            out.push_str(&format!(
                "{:<36} {:<44} {:<13} {}\n",
                o.operator_id,
                plugin,
                o.status.to_string(),
                lines.next().unwrap_or_default()
            ));
            for l in lines {
                out.push_str(&format!("{:<95}{l}\n", ""));
            }
        }
        out.push_str(&format!(
            "\nverdict {} (exit {})\n",
            self.verdict.to_string().to_uppercase(),
            self.verdict.exit_code()
        ));
        out
    }
}

fn screaming(debug: &str) -> String {
    let mut parts = debug.splitn(2, ' ');
    let code = parts.next().unwrap_or_default();
    let rest = parts.next();
    let mut out = String::new();
    for (i, c) in code.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    if let Some(r) = rest {
        out.push(' ');
        out.push_str(r);
    }
    out
}
