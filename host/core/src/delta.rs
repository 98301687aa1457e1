//! Delta overlays (design §12): a small TOML file that patches a job's model —
//! never a runtime object — so an operator of the job can change a running pipeline's
//! parallelism, checkpoint interval, plugin version or config without editing the job
//! file. Every field a Delta may name has a [`ChangeClass`]; forbidden fields are refused
//! with the field named, and what a state-affecting change does to a checkpoint is then
//! decided by the savepoint compatibility checker, with the actions that clear its findings.
//!
//! ```toml
//! [job]
//! parallelism = 3                 # rescale
//! checkpoint_interval_ms = 500    # replan
//!
//! [node.per-carrier]              # a source, operator or sink, by its name
//! plugin = "keyed-aggregate@0.2.0"    # state-affecting
//! config = { field = "dep_delay" }    # state-affecting; merged key by key into the config
//! parallelism = 2                     # rescale
//!
//! [connections.pg]
//! url = "postgres://db2:5432/flights"  # replan (never a password: see the job file rules)
//! ```
//!
//! The patched document is parsed and validated exactly as a job file is
//! ([`parse_job_file`]), so a Delta can never produce a model the job file could not.

use crate::diag::{Diagnostic, Diagnostics, field_within};
use crate::jobfile::parse_job_file;
use crate::model::StreamModel;
use serde::Serialize;
use std::fmt;
use toml::{Table, Value};

/// What a changed field does to a job that resumes from a checkpoint (design §12.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeClass {
    /// A new plan over the same state: checkpoint interval, batch size, grants,
    /// connections, watermarks, chaining, a stronger semantic mode.
    Replan,
    /// The parallelism of the job or of a node: state shards move between subtasks, keys
    /// are never rewritten; at most the shard count.
    Rescale,
    /// May change what the state means or where it lives: a plugin version, a config
    /// (it may change the key), the shard count, a weaker semantic mode. The restore runs
    /// the compatibility check and needs the actions that clear its findings.
    StateAffecting,
    /// Not changeable by a Delta: identities (job name and id, pipeline, node names and
    /// uids, a connection's kind) and the topology (inputs, node kinds). Identity changes
    /// go through a new job file with `rename-operator` or `fork`.
    Forbidden,
}

impl fmt::Display for ChangeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChangeClass::Replan => "replan",
            ChangeClass::Rescale => "rescale",
            ChangeClass::StateAffecting => "state-affecting",
            ChangeClass::Forbidden => "forbidden",
        })
    }
}

/// One field a Delta changes: its job-file path, class, and the values before and after
/// (TOML text; `(unset)` when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Job-file path, e.g. `job.parallelism`, `operator.per-carrier.config`.
    pub field: String,
    /// Its change class.
    pub class: ChangeClass,
    /// The value before.
    pub from: String,
    /// The value after.
    pub to: String,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {} -> {}",
            self.field, self.class, self.from, self.to
        )
    }
}

fn job_field_class(key: &str) -> Option<ChangeClass> {
    Some(match key {
        "name" | "id" | "pipeline" => ChangeClass::Forbidden,
        "parallelism" => ChangeClass::Rescale,
        "state_shards" => ChangeClass::StateAffecting,
        // Decided by the modes' order (see `Patch::patch_job`).
        "semantic" => ChangeClass::Replan,
        "checkpoint_interval_ms"
        | "checkpoint_every_records"
        | "checkpoint_timeout_ms"
        | "batch_records"
        | "state_memory_bytes"
        | "async_snapshots"
        | "incremental_snapshots" => ChangeClass::Replan,
        _ => return None,
    })
}

fn node_field_class(key: &str) -> Option<ChangeClass> {
    Some(match key {
        "name" | "uid" | "inputs" => ChangeClass::Forbidden,
        "plugin" | "config" => ChangeClass::StateAffecting,
        "parallelism" => ChangeClass::Rescale,
        // Turning a TTL on or off changes how the state's values are stored; the
        // savepoint check decides what that needs (STATE_TTL_CHANGED).
        "state_ttl_ms" => ChangeClass::StateAffecting,
        "grants" | "connections" | "watermarks" | "start_new_chain" | "on_error" => {
            ChangeClass::Replan
        }
        _ => return None,
    })
}

fn connection_field_class(key: &str) -> Option<ChangeClass> {
    Some(match key {
        "kind" => ChangeClass::Forbidden,
        "url" | "password_env" => ChangeClass::Replan,
        _ => return None,
    })
}

/// Strength of a semantic mode, strongest highest.
fn strength(mode: &str) -> u8 {
    match mode {
        "strict-exactly-once" => 3,
        "effectively-once" => 2,
        "at-least-once" => 1,
        _ => 0,
    }
}

fn shown(v: Option<&Value>) -> String {
    v.map_or_else(|| "(unset)".to_owned(), ToString::to_string)
}

/// Applies the Delta `delta_text` (file name `delta_file`) to the job file `job_text`
/// (file name `job_file`): the patched model and every field whose value changed, sorted
/// by field. `[node.NAME]` tables address a `[[source]]`, `[[operator]]` or
/// `[[sink]]` by name; a `config` table merges key by key into the node's config (keys
/// not named keep their values); every other field replaces the old value.
///
/// # Errors
/// Diagnostics naming the Delta file and field: TOML syntax; a table or field a Delta
/// does not know; a node or connection the job lacks; a [`ChangeClass::Forbidden`]
/// change; a parallelism beyond the job's `state_shards`; anything the job-file
/// validation refuses in the patched document.
pub fn apply_delta(
    job_file: &str,
    job_text: &str,
    delta_file: &str,
    delta_text: &str,
) -> Result<(StreamModel, Vec<Change>), Diagnostics> {
    let mut p = Patch {
        delta_file,
        changes: Vec::new(),
        errors: Vec::new(),
    };
    let delta: Table = delta_text
        .parse()
        .map_err(|e: toml::de::Error| Diagnostics(vec![p.err(String::new(), e.to_string())]))?;
    // The job file is parsed (and so checked) once before the patch, for its own errors.
    parse_job_file(job_file, job_text)?;
    let mut doc: Table = job_text.parse().map_err(|e: toml::de::Error| {
        let mut d = Diagnostic::new("", e.to_string());
        d.file = job_file.to_owned();
        Diagnostics(vec![d])
    })?;
    for (section, value) in &delta {
        let Value::Table(entries) = value else {
            p.fail(section.clone(), "must be a table".into());
            continue;
        };
        match section.as_str() {
            "job" => p.patch_job(&mut doc, entries),
            "node" => p.patch_nodes(&mut doc, entries),
            "connections" => p.patch_connections(&mut doc, entries),
            other => p.fail(
                other.to_owned(),
                "a Delta has only [job], [node.NAME] and [connections.NAME] tables".into(),
            ),
        }
    }
    p.refuse_forbidden();
    if !p.errors.is_empty() {
        return Err(Diagnostics(p.errors));
    }
    let text = toml::to_string(&doc)
        .map_err(|e| Diagnostics(vec![p.err(String::new(), e.to_string())]))?;
    let model = parse_job_file(&format!("{job_file} with delta {delta_file}"), &text)?;
    let beyond = p.beyond_shards(&model);
    if !beyond.is_empty() {
        return Err(Diagnostics(beyond));
    }
    let mut changes = p.changes;
    changes.sort_by(|a, b| a.field.cmp(&b.field));
    Ok((model, changes))
}

/// Diagnostics found in a model a Delta patched, after [`apply_delta`] accepted it
/// (compiling it against the plugins: a config its plugin's schema refuses, say), each one
/// that lies in a field the Delta changed turned to name the Delta's file and field, with
/// the job file's field kept in its message:
///
/// `d.toml: node.per-carrier.config.key_field: must be string, found integer 7 (…); the
/// field is operator[1].config.key_field of flights.toml as the Delta patched it`
///
/// A diagnostic in a field the Delta did not change is left as it is; `job` and `delta`
/// are the files' names and texts, as [`apply_delta`] took them (the changes are worked
/// out again; a Delta that does not apply leaves every diagnostic as it is).
pub fn blame_delta(
    diags: Diagnostics,
    model: &StreamModel,
    job: (&str, &str),
    delta: (&str, &str),
) -> Diagnostics {
    let Ok((_, changes)) = apply_delta(job.0, job.1, delta.0, delta.1) else {
        return diags;
    };
    let delta_field = |field: &str| -> Option<String> {
        if field.starts_with("job.") || field.starts_with("connections.") {
            return changes
                .iter()
                .any(|c| field_within(field, &c.field))
                .then(|| field.to_owned());
        }
        // `operator[1].config.key_field`: the node's kind and ordinal, then the rest.
        let (node, rest) = field.split_at(field.find(']')? + 1);
        let i = (0..model.nodes.len()).find(|&i| model.node_field(i) == node)?;
        let n = &model.nodes[i];
        let as_changed = format!("{}.{}{rest}", n.kind.world(), n.name);
        changes
            .iter()
            .any(|c| field_within(&as_changed, &c.field))
            .then(|| format!("node.{}{rest}", n.name))
    };
    Diagnostics(
        diags
            .0
            .into_iter()
            .map(|mut d| {
                if let Some(field) = delta_field(&d.field) {
                    d.message = format!(
                        "{}; the field is {} of {} as the Delta patched it",
                        d.message, d.field, job.0
                    );
                    d.file = delta.0.to_owned();
                    d.field = field;
                    (d.line, d.column) = (None, None);
                }
                d
            })
            .collect(),
    )
}

/// The changes and errors of one Delta being applied; errors name the Delta file.
struct Patch<'f> {
    delta_file: &'f str,
    changes: Vec<Change>,
    errors: Vec<Diagnostic>,
}

impl Patch<'_> {
    /// A diagnostic at `field` of the Delta file.
    fn err(&self, field: String, message: String) -> Diagnostic {
        let mut d = Diagnostic::new(field, message);
        d.file = self.delta_file.to_owned();
        d
    }

    /// Records an error at `field` of the Delta file.
    fn fail(&mut self, field: String, message: String) {
        let d = self.err(field, message);
        self.errors.push(d);
    }

    /// Records a change of `field` when the value differs.
    fn note(&mut self, field: String, class: ChangeClass, from: Option<&Value>, to: &Value) {
        if from != Some(to) {
            // A URL is shown redacted, whatever the job-file check later says of it.
            self.changes.push(Change {
                field,
                class,
                from: crate::url::redact_url(&shown(from)),
                to: crate::url::redact_url(&to.to_string()),
            });
        }
    }

    /// Applies `[job]`: each field replaces the job's; a weaker semantic mode is
    /// state-affecting.
    fn patch_job(&mut self, doc: &mut Table, entries: &Table) {
        let job = doc
            .entry("job")
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(job) = job else {
            self.fail("job".into(), "the job file's `job` is not a table".into());
            return;
        };
        for (k, v) in entries {
            let field = format!("job.{k}");
            let Some(mut class) = job_field_class(k) else {
                self.fail(field, "not a field a Delta can change".into());
                continue;
            };
            if k == "semantic" {
                let old = job
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("strict-exactly-once");
                if strength(v.as_str().unwrap_or_default()) < strength(old) {
                    class = ChangeClass::StateAffecting;
                }
            }
            self.note(field, class, job.get(k), v);
            job.insert(k.clone(), v.clone());
        }
    }

    /// Applies `[node.NAME]` tables to the source, operator or sink of that name; a
    /// `config` table merges key by key.
    fn patch_nodes(&mut self, doc: &mut Table, entries: &Table) {
        for (name, patch) in entries {
            let Value::Table(patch) = patch else {
                self.fail(format!("node.{name}"), "must be a table".into());
                continue;
            };
            let mut at = None;
            for kind in ["source", "operator", "sink"] {
                if let Some(Value::Array(nodes)) = doc.get(kind)
                    && let Some(i) = nodes
                        .iter()
                        .position(|n| n.get("name").and_then(Value::as_str) == Some(name.as_str()))
                {
                    at = Some((kind, i));
                    break;
                }
            }
            let found = at.and_then(|(kind, i)| match doc.get_mut(kind) {
                Some(Value::Array(nodes)) => match nodes.get_mut(i) {
                    Some(Value::Table(t)) => Some((kind, t)),
                    _ => None,
                },
                _ => None,
            });
            let Some((kind, node)) = found else {
                self.fail(
                    format!("node.{name}"),
                    "the job has no source, operator or sink of this name (a Delta \
                         changes nodes; add or remove them in the job file)"
                        .into(),
                );
                continue;
            };
            for (k, v) in patch {
                let field = format!("{kind}.{name}.{k}");
                let Some(class) = node_field_class(k) else {
                    self.fail(field, "not a field a Delta can change".into());
                    continue;
                };
                let new = match (k.as_str(), node.get(k), v) {
                    ("config", Some(Value::Table(old)), Value::Table(add)) => {
                        let mut merged = old.clone();
                        merged.extend(add.iter().map(|(a, b)| (a.clone(), b.clone())));
                        Value::Table(merged)
                    }
                    _ => v.clone(),
                };
                self.note(field, class, node.get(k), &new);
                node.insert(k.clone(), new);
            }
        }
    }

    /// Applies `[connections.NAME]` tables to the declared connection of that name.
    fn patch_connections(&mut self, doc: &mut Table, entries: &Table) {
        for (name, patch) in entries {
            let Value::Table(patch) = patch else {
                self.fail(format!("connections.{name}"), "must be a table".into());
                continue;
            };
            let Some(Value::Table(conn)) = doc
                .get_mut("connections")
                .and_then(|c| c.as_table_mut())
                .and_then(|c| c.get_mut(name))
            else {
                self.fail(
                    format!("connections.{name}"),
                    "the job has no connection of this name".into(),
                );
                continue;
            };
            for (k, v) in patch {
                let field = format!("connections.{name}.{k}");
                let Some(class) = connection_field_class(k) else {
                    self.fail(field, "not a field a Delta can change".into());
                    continue;
                };
                self.note(field, class, conn.get(k), v);
                conn.insert(k.clone(), v.clone());
            }
        }
    }

    /// Refuses every [`ChangeClass::Forbidden`] change noted so far.
    fn refuse_forbidden(&mut self) {
        let forbidden: Vec<(String, String)> = self
            .changes
            .iter()
            .filter(|c| c.class == ChangeClass::Forbidden)
            .map(|c| {
                (
                    c.field.clone(),
                    format!(
                        "forbidden in a Delta ({} -> {}): identities and the topology change only \
                         in a new job file (with rename-operator or fork)",
                        c.from, c.to
                    ),
                )
            })
            .collect();
        for (field, message) in forbidden {
            self.fail(field, message);
        }
    }

    /// A diagnostic for the job's and each node's parallelism beyond `state_shards`.
    fn beyond_shards(&self, model: &StreamModel) -> Vec<Diagnostic> {
        let shards = model.job.state_shards;
        let mut beyond = Vec::new();
        if model.job.parallelism > shards {
            beyond.push(self.err(
                "job.parallelism".into(),
                format!(
                    "parallelism {} is beyond the shard count {shards}: a subtask needs at least \
                     one state shard (raise job.state_shards, a state-affecting change)",
                    model.job.parallelism
                ),
            ));
        }
        for n in &model.nodes {
            if let Some(p) = n.parallelism.filter(|p| *p > shards) {
                beyond.push(self.err(
                    format!("node.{}.parallelism", n.name),
                    format!("parallelism {p} is beyond the shard count {shards}"),
                ));
            }
        }
        beyond
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
[job]
name = "flights"
parallelism = 2
state_shards = 8
checkpoint_interval_ms = 200

[connections.pg]
kind = "postgres"
url = "postgres://127.0.0.1/flights"

[[source]]
name = "flights"
plugin = "file-source@0.1.0"
config = { path = "/input/flights.csv", format = "csv", header = true }

[[operator]]
name = "per-carrier"
plugin = "keyed-aggregate@0.1.0"
inputs = [{ from = "flights", partition = "hash" }]
config = { key = "carrier", field = "dep_delay" }

[[sink]]
name = "out"
plugin = "jsonl-sink@0.1.0"
inputs = ["per-carrier"]
connections = ["pg"]
config = { dir = "/output" }
"#;

    fn apply(delta: &str) -> Result<(StreamModel, Vec<Change>), Diagnostics> {
        apply_delta("job.toml", JOB, "d.toml", delta)
    }

    fn classes(delta: &str) -> Vec<(String, ChangeClass)> {
        apply(delta)
            .unwrap()
            .1
            .into_iter()
            .map(|c| (c.field, c.class))
            .collect()
    }

    #[test]
    fn each_field_has_its_class_and_unchanged_values_are_no_change() {
        assert_eq!(
            classes(
                "[job]\nparallelism = 3\ncheckpoint_interval_ms = 200\nbatch_records = 64\n\
                 [node.per-carrier]\nplugin = \"keyed-aggregate@0.2.0\"\nparallelism = 4\n\
                 [connections.pg]\nurl = \"postgres://db2/flights\"\n"
            ),
            [
                ("connections.pg.url".into(), ChangeClass::Replan),
                ("job.batch_records".into(), ChangeClass::Replan),
                ("job.parallelism".into(), ChangeClass::Rescale),
                (
                    "operator.per-carrier.parallelism".into(),
                    ChangeClass::Rescale
                ),
                (
                    "operator.per-carrier.plugin".into(),
                    ChangeClass::StateAffecting
                ),
            ]
        );
        assert_eq!(
            classes("[job]\nstate_shards = 16\n"),
            [("job.state_shards".into(), ChangeClass::StateAffecting)]
        );
    }

    #[test]
    fn a_delta_url_with_a_password_is_refused_without_echoing_it() {
        for url in [
            "postgres://u@db2/flights?pass%77ord=s3cret",
            "postgres://u:pa/s3cret@db2/flights",
        ] {
            let d = apply(&format!("[connections.pg]\nurl = \"{url}\"\n")).unwrap_err();
            assert!(d.to_string().contains("connections.pg.url"), "{d}");
            assert!(!d.to_string().contains("s3cret"), "{d}");
        }
    }

    #[test]
    fn the_patched_model_is_the_job_file_model_with_the_delta() {
        let (m, changes) = apply(
            "[job]\nparallelism = 3\n[node.per-carrier]\nconfig = { field = \"arr_delay\" }\n",
        )
        .unwrap();
        assert_eq!(m.job.parallelism, 3);
        let agg = m.nodes.iter().find(|n| n.name == "per-carrier").unwrap();
        // config merges key by key.
        assert_eq!(agg.config["key"], "carrier");
        assert_eq!(agg.config["field"], "arr_delay");
        assert_eq!(changes[1].field, "operator.per-carrier.config");
        assert_eq!(changes[1].class, ChangeClass::StateAffecting);
        // Everything else is the job file's.
        let plain = parse_job_file("job.toml", JOB).unwrap();
        assert_eq!(m.nodes.len(), plain.nodes.len());
        assert_eq!(m.job.id, plain.job.id);
    }

    #[test]
    fn a_weaker_semantic_mode_is_state_affecting_and_a_stronger_one_a_replan() {
        assert_eq!(
            classes("[job]\nsemantic = \"effectively-once\"\n"),
            [("job.semantic".into(), ChangeClass::StateAffecting)]
        );
        let weak = JOB.replace(
            "checkpoint_interval_ms = 200",
            "checkpoint_interval_ms = 200\nsemantic = \"at-least-once\"",
        );
        let (_, c) = apply_delta(
            "job.toml",
            &weak,
            "d.toml",
            "[job]\nsemantic = \"strict-exactly-once\"\n",
        )
        .unwrap();
        assert_eq!(c[0].class, ChangeClass::Replan);
    }

    #[test]
    fn forbidden_unknown_and_missing_fields_are_refused_naming_file_and_field() {
        for (delta, field, says) in [
            (
                "[job]\nname = \"other\"\n",
                "job.name",
                "forbidden in a Delta",
            ),
            ("[job]\nid = \"other\"\n", "job.id", "forbidden"),
            (
                "[node.per-carrier]\ninputs = [\"flights\"]\n",
                "operator.per-carrier.inputs",
                "forbidden",
            ),
            ("[node.out]\nuid = \"x\"\n", "sink.out.uid", "forbidden"),
            (
                "[connections.pg]\nkind = \"redis\"\n",
                "connections.pg.kind",
                "forbidden",
            ),
            (
                "[job]\ncolour = 1\n",
                "job.colour",
                "not a field a Delta can change",
            ),
            (
                "[node.nope]\nparallelism = 1\n",
                "node.nope",
                "no source, operator or sink",
            ),
            (
                "[connections.nope]\nurl = \"x\"\n",
                "connections.nope",
                "no connection",
            ),
            ("[source]\nx = 1\n", "source", "only [job]"),
            // The keyed operator needs a shard per subtask (the job-file rule) ...
            (
                "[job]\nparallelism = 9\n",
                "job.state_shards",
                "less than the parallelism 9 of keyed operator `per-carrier`",
            ),
            // ... and a Delta takes no node beyond the shard count.
            (
                "[node.out]\nparallelism = 12\n",
                "node.out.parallelism",
                "beyond the shard count 8",
            ),
        ] {
            let e = apply(delta).unwrap_err().to_string();
            assert!(e.contains("d.toml"), "{delta}: {e}");
            assert!(e.contains(field), "{delta}: {e}");
            assert!(e.contains(says), "{delta}: {e}");
        }
        // What the job file itself refuses is refused after the patch too.
        let e = apply("[job]\ncheckpoint_interval_ms = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("checkpoint_interval_ms"), "{e}");
    }

    #[test]
    fn diagnostics_in_fields_the_delta_changed_name_the_delta() {
        let delta = "[job]\ncheckpoint_interval_ms = 500\n\
                     [node.per-carrier]\nconfig = { key = 7 }\n";
        let (model, _) = apply(delta).unwrap();
        // What compiling the patched model against the plugins might find: three errors in
        // fields the Delta changed, one in a field it did not.
        let found = Diagnostics(vec![
            Diagnostic::new("operator[0].config.key", "must be string, found integer 7"),
            Diagnostic::new("operator[0].config.field", "unknown field"),
            Diagnostic::new("sink[0].config.dir", "must be absolute"),
            Diagnostic::new("job.checkpoint_interval_ms", "too short"),
        ]);
        let blamed =
            blame_delta(found, &model, ("job.toml", JOB), ("d.toml", delta)).with_file("job.toml");
        let shown: Vec<String> = blamed.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "d.toml: node.per-carrier.config.key: must be string, found integer 7; the \
                 field is operator[0].config.key of job.toml as the Delta patched it",
                // The Delta changed `config` (merged key by key): every config error may
                // be its doing.
                "d.toml: node.per-carrier.config.field: unknown field; the field is \
                 operator[0].config.field of job.toml as the Delta patched it",
                "job.toml: sink[0].config.dir: must be absolute",
                "d.toml: job.checkpoint_interval_ms: too short; the field is \
                 job.checkpoint_interval_ms of job.toml as the Delta patched it",
            ]
        );
        // A Delta that does not apply leaves them as they were.
        let kept = blame_delta(
            Diagnostics(vec![Diagnostic::new("operator[0].config.key", "x")]),
            &model,
            ("job.toml", JOB),
            ("d.toml", "[job]\nname = \"other\"\n"),
        );
        assert_eq!(kept.0[0].field, "operator[0].config.key");
    }
}
