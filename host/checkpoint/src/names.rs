//! Every name of checkpoints and state, in one place (design §3.5, §6 "Storage by
//! location"): the checkpoint namespace, the objects of a namespace (epoch records,
//! manifests, segments, the epoch log, attempt claims), savepoints, StatePaths and state
//! directories. Ids become name components by one injective encoding, so two ids never
//! share an object. No other crate joins a name into checkpoint storage.
//!
//! A namespace's objects, relative to it:
//!
//! ```text
//! epochs/<epoch:020>.json                 the epoch record, created once (the point of
//!                                         linearisation: durable -> its manifest, or aborted)
//! manifests/<epoch:020>.a<attempt>.json   a manifest candidate of one attempt
//! manifests/<epoch:020>.json              a manifest of the older layout (durable by presence)
//! segments/<epoch>/<operator>/<subtask>.a<attempt>[.c<epoch>].seg   state segments
//! log/<epoch:020>.<rank>.<state>.a<attempt:010>.json   one epoch log record each
//! attempts/<attempt:010>                  attempt claims, created once
//! epochs.log, attempt                     the older layout's log and attempt counter (read)
//! savepoint.json                          in a savepoint: what it is (written last)
//! ```

use std::path::{Path, PathBuf};

/// An id as one path component, injectively: ASCII letters, digits, `-` and `_` are kept,
/// every other byte (`.` and `/` included) becomes `%XX` (upper-case hex). So no component
/// is empty-looking, `.` or `..`, and `a.b`, `a_b` and `a/b` stay three names.
pub fn component(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The checkpoint namespace of a job's pipeline (design §3.1): `<job>.<pipeline>`, each
/// encoded by [`component`] (which never yields a `.`, so the separator is unambiguous).
pub fn namespace(job: &str, pipeline: &str) -> String {
    format!("{}.{}", component(job), component(pipeline))
}

/// The directory (prefix) of a checkpoint root under which namespace `ns` lives.
pub fn namespace_prefix(ns: &str) -> String {
    format!("{ns}/")
}

/// Prefix of the epoch records.
pub const EPOCHS: &str = "epochs/";
/// Prefix of the manifests.
pub const MANIFESTS: &str = "manifests/";
/// Prefix of the segments.
pub const SEGMENTS: &str = "segments/";
/// Prefix of the epoch log records.
pub const LOG: &str = "log/";
/// Prefix of the attempt claims.
pub const ATTEMPTS: &str = "attempts/";
/// The older layout's epoch log (an append-only file; read, never written).
pub const LEGACY_LOG: &str = "epochs.log";
/// The older layout's attempt counter (read, never written).
pub const LEGACY_ATTEMPT: &str = "attempt";
/// A cluster's identity at the root of its storage location, created once.
pub const CLUSTER: &str = "cluster.json";
/// The checkpoint root inside a cluster's storage location.
pub const CHECKPOINTS: &str = "checkpoints";
/// The job records inside a cluster's storage location.
pub const JOBS: &str = "jobs";
/// The plugin registry inside a cluster's storage location.
pub const REGISTRY: &str = "registry";
/// The savepoint root inside a cluster's storage location.
pub const SAVEPOINTS: &str = "savepoints";

/// What a savepoint is; written last, so a prefix without it is no savepoint.
pub const SAVEPOINT_INFO: &str = "savepoint.json";

/// The epoch record of `epoch`.
pub fn epoch_record(epoch: u64) -> String {
    format!("{EPOCHS}{epoch:020}.json")
}

/// The epoch of an epoch record's name.
pub fn epoch_of_record(name: &str) -> Option<u64> {
    name.strip_prefix(EPOCHS)?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// The manifest candidate of `epoch` written by `attempt`.
pub fn manifest_candidate(epoch: u64, attempt: u32) -> String {
    format!("{MANIFESTS}{epoch:020}.a{attempt}.json")
}

/// The older layout's manifest of `epoch`.
pub fn legacy_manifest(epoch: u64) -> String {
    format!("{MANIFESTS}{epoch:020}.json")
}

/// A manifest name's epoch and, for a candidate, its attempt (`None`: the older layout).
pub fn parse_manifest(name: &str) -> Option<(u64, Option<u32>)> {
    let stem = name.strip_prefix(MANIFESTS)?.strip_suffix(".json")?;
    match stem.split_once(".a") {
        Some((e, a)) => Some((e.parse().ok()?, Some(a.parse().ok()?))),
        None => Some((stem.parse().ok()?, None)),
    }
}

/// The epoch log record of `epoch` entering `state` (`rank` orders the states of one
/// epoch and attempt) in `attempt`.
pub fn log_record(epoch: u64, rank: u8, state: &str, attempt: u32) -> String {
    format!("{LOG}{epoch:020}.{rank}.{state}.a{attempt:010}.json")
}

/// The epoch of a log record's name.
pub fn epoch_of_log_record(name: &str) -> Option<u64> {
    name.strip_prefix(LOG)?.split('.').next()?.parse().ok()
}

/// The claim of `attempt`.
pub fn attempt_claim(attempt: u32) -> String {
    format!("{ATTEMPTS}{attempt:010}")
}

/// The attempt of a claim's name.
pub fn attempt_of_claim(name: &str) -> Option<u32> {
    name.strip_prefix(ATTEMPTS)?.parse().ok()
}

/// The segment file (relative to the namespace) holding an operator's state of one
/// subtask at one epoch, written by one attempt: `segments/<epoch>/<operator>/<subtask>.a<attempt>.seg`.
/// The attempt keeps a fenced attempt's late writes away from the live one's files.
pub fn segment_file(epoch: u64, operator_id: &str, subtask: u32, attempt: u32) -> String {
    format!(
        "segments/{epoch}/{}/{subtask}.a{attempt}.seg",
        component(operator_id)
    )
}

/// The segment file a background compaction of incremental snapshots (design §5.5, §8.1)
/// writes for one subtask's chain of `operator_id`: the full payloads folded from the
/// chain a barrier of `epoch` saw, put in the directory of `dir_epoch` (the epoch of the
/// chain's newest file, which every manifest references until one adopts the compacted
/// chain, so retention never deletes the directory under it):
/// `segments/<dir_epoch>/<operator>/<subtask>.a<attempt>.c<epoch>.seg`.
pub fn compacted_segment_file(
    dir_epoch: u64,
    operator_id: &str,
    subtask: u32,
    attempt: u32,
    epoch: u64,
) -> String {
    format!(
        "segments/{dir_epoch}/{}/{subtask}.a{attempt}.c{epoch}.seg",
        component(operator_id)
    )
}

/// A segment file copied into a namespace by a restore from a savepoint: the savepoint's
/// file `rel` (`segments/<e>/...`), moved under the restored epoch's directory and a
/// prefix of its own (`restore` names the restore), so it shares a name with no file of
/// the namespace: `segments/<epoch>/restore-<restore>/<rel without segments/>`.
pub fn restored_segment_file(epoch: u64, restore: &str, rel: &str) -> String {
    format!(
        "segments/{epoch}/restore-{}/{}",
        component(restore),
        rel.strip_prefix(SEGMENTS).unwrap_or(rel)
    )
}

/// The epoch directory a segment file `rel` lies in (`segments/<epoch>/...`), if it is
/// one.
pub fn segment_dir_epoch(rel: &str) -> Option<u64> {
    rel.strip_prefix("segments/")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The packed segment file an offline migration (`savepoint migrate`, or a restore with
/// actions) writes for `operator_id` in a savepoint of `epoch` when it rewrites that
/// operator's state at `shards` shards (a reshard or a migrate-state, design §10.6): one file
/// per operator, named apart from the task files of [`segment_file`] (those end in
/// `.a<attempt>.seg`).
pub fn migrated_segment_file(epoch: u64, operator_id: &str, shards: u32) -> String {
    format!(
        "segments/{epoch}/{}/migrated-{shards}.seg",
        component(operator_id)
    )
}

/// The StatePath of one state of one shard (design §3.5): only stable ids, the epoch and
/// the state name.
pub fn state_path(
    namespace: &str,
    epoch: u64,
    operator_id: &str,
    subtask: u32,
    shard: u32,
    state: &str,
) -> String {
    format!("checkpoint/{namespace}/{epoch}/{operator_id}/{subtask}/{shard}/{state}")
}

/// The StatePath of a non-keyed operator state of one subtask (design §3.5):
/// `checkpoint/{ns}/{epoch}/{operatorId}/{subtask}/operator/{stateName}`.
pub fn operator_state_path(
    namespace: &str,
    epoch: u64,
    operator_id: &str,
    subtask: u32,
    state: &str,
) -> String {
    format!("checkpoint/{namespace}/{epoch}/{operator_id}/{subtask}/operator/{state}")
}

/// The redb database of an operator's subtask under a process's state root.
pub fn state_db(root: &Path, operator_id: &str, subtask: u32) -> PathBuf {
    root.join(component(operator_id))
        .join(format!("{subtask}.redb"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn components_keep_plain_ids_and_escape_the_rest() {
        assert_eq!(
            component("operators/per-carrier"),
            "operators%2Fper-carrier"
        );
        assert_eq!(component("a.b"), "a%2Eb");
        assert_eq!(component("a_b"), "a_b");
        assert_eq!(component(".."), "%2E%2E");
        assert_eq!(component("naïve"), "na%C3%AFve");
        assert_eq!(
            namespace("flights-per-carrier", "main"),
            "flights-per-carrier.main"
        );
        assert_eq!(
            segment_file(7, "operators/agg", 1, 3),
            "segments/7/operators%2Fagg/1.a3.seg"
        );
        let compacted = compacted_segment_file(5, "operators/agg", 1, 3, 9);
        assert_eq!(compacted, "segments/5/operators%2Fagg/1.a3.c9.seg");
        assert_eq!(segment_dir_epoch(&compacted), Some(5));
        assert_eq!(segment_dir_epoch("elsewhere/5/x.seg"), None);
    }

    proptest! {
        /// Distinct ids never share a component, nor namespaces a name.
        #[test]
        fn the_encoding_is_injective(a in "[a-z._/%-]{0,6}", b in "[a-z._/%-]{0,6}", c in "[a-z.]{0,3}") {
            prop_assert_eq!(component(&a) == component(&b), a == b);
            prop_assert_eq!(namespace(&a, &c) == namespace(&b, &c), a == b);
            prop_assert!(!component(&a).contains('.') && !component(&a).contains('/'));
        }
    }
}
