//! Checkpoint figures read back from a run's work directory (design §5): per-epoch
//! duration from the epoch log (`created` → `durable`), snapshot size from the retained
//! manifests, and recovery time after a SIGKILL (restart → first epoch committed by the
//! new attempt).

use std::path::Path;

use anyhow::{Context, Result};
use nop_stream_checkpoint::{Location, Namespace};
use serde::{Deserialize, Serialize};

/// One record of a namespace's epoch log: `state` is `created`, `durable`, `committed`
/// or `aborted`; `at_ms` Unix ms.
pub(crate) struct LogRecord {
    pub(crate) epoch: u64,
    pub(crate) state: String,
    pub(crate) attempt: u32,
    pub(crate) at_ms: u64,
}

/// Median and maximum of a sample.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Maximum.
    pub max: f64,
}

impl Spread {
    /// Of `values` (zeros when empty).
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Spread {
            median,
            max: v[v.len() - 1],
        }
    }
}

/// Checkpoint figures of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EpochStats {
    /// Epochs that became durable.
    pub durable_epochs: usize,
    /// Epoch duration in ms, barrier injection (CREATED) to manifest durable.
    pub duration_ms: Spread,
    /// Snapshot bytes per epoch (all tasks), over the manifests retention kept.
    pub snapshot_bytes: Spread,
}

/// The checkpoint namespaces under `<work>/checkpoints`, by name.
pub(crate) fn namespaces(work: &Path) -> Result<Vec<(String, Namespace)>> {
    let root = Location::Local(work.join("checkpoints"));
    let store = root.open().with_context(|| format!("open {root}"))?;
    Ok(nop_stream_checkpoint::namespace::list_namespaces(&store)?
        .into_iter()
        .map(|n| {
            let ns = Namespace::new(store.scope(&n));
            (n, ns)
        })
        .collect())
}

/// The records of a namespace's epoch log.
pub(crate) fn read_log(ns: &Namespace) -> Result<Vec<LogRecord>> {
    Ok(ns
        .read_log()?
        .into_iter()
        .map(|r| LogRecord {
            epoch: r.epoch.0,
            state: serde_json::to_value(r.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            attempt: r.attempt.0,
            at_ms: r.at_ms,
        })
        .collect())
}

/// Reads the epoch log and retained manifests of a run's work directory.
///
/// # Errors
/// No checkpoint directory, or an unreadable log.
pub fn stats(work: &Path) -> Result<EpochStats> {
    let mut durations = Vec::new();
    let mut sizes = Vec::new();
    for (_, ns) in namespaces(work)? {
        let log = read_log(&ns)?;
        for d in log.iter().filter(|r| r.state == "durable") {
            if let Some(c) = log
                .iter()
                .find(|r| r.state == "created" && r.epoch == d.epoch && r.attempt == d.attempt)
            {
                durations.push(d.at_ms.saturating_sub(c.at_ms) as f64);
            }
        }
        for e in ns.manifest_epochs()? {
            // Retention may delete one between the listing and the read.
            if let Ok(m) = ns.read_manifest(e) {
                sizes.push(m.snapshot_bytes() as f64);
            }
        }
    }
    Ok(EpochStats {
        durable_epochs: durations.len(),
        duration_ms: Spread::of(&durations),
        snapshot_bytes: Spread::of(&sizes),
    })
}

/// Milliseconds from `restart_ms` (Unix ms) to the first epoch committed (or, if the
/// commit record is missing, made durable) by the newest attempt in the run's log.
///
/// # Errors
/// No log, or no epoch of the newest attempt.
pub fn first_commit_after(work: &Path, restart_ms: u64) -> Result<f64> {
    let mut best: Option<u64> = None;
    for (_, ns) in namespaces(work)? {
        let log = read_log(&ns)?;
        let Some(attempt) = log.iter().map(|r| r.attempt).max() else {
            continue;
        };
        let first_in = |state: &str| {
            log.iter()
                .filter(|r| r.attempt == attempt && r.state == state)
                .map(|r| r.at_ms)
                .min()
        };
        let first = first_in("committed").or_else(|| first_in("durable"));
        best = match (best, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let at = best.context("no epoch of the restarted attempt in the epoch log")?;
    Ok(at.saturating_sub(restart_ms) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_recovery_read_the_log_and_manifests() {
        use nop_stream_api::{AttemptId, EpochId, FencingToken};
        use nop_stream_checkpoint::coordinator::EpochState;
        use nop_stream_checkpoint::{EpochLogRecord, EpochManifest};
        let dir = tempfile::tempdir().unwrap();
        let ns =
            Namespace::open(&Location::Local(dir.path().join("checkpoints/job.main"))).unwrap();
        for (epoch, state, attempt, at_ms) in [
            (1, EpochState::Created, 1, 1000),
            (1, EpochState::Durable, 1, 1010),
            (2, EpochState::Created, 1, 2000),
            (2, EpochState::Durable, 1, 2030),
            (3, EpochState::Created, 2, 5000),
            (3, EpochState::Durable, 2, 5020),
            (3, EpochState::Committed, 2, 5025),
        ] {
            ns.append_log(&EpochLogRecord {
                epoch: EpochId(epoch),
                state,
                attempt: AttemptId(attempt),
                at_ms,
                detail: None,
            })
            .unwrap();
        }
        let mut m: EpochManifest = serde_json::from_str(&format!(
            r#"{{"epoch":3,"job_id":"job","pipeline_id":"main","namespace":"job.main","plan_fingerprint":"f",
               "state_shard_count":1,"attempt":2,"fencing_token":2,"final_epoch":false,"tasks":[],
               "enumerators":[],"state_format_version":{},"created_ms":0,"durable_ms":0,"checksum":""}}"#,
            nop_stream_checkpoint::STATE_FORMAT_VERSION
        ))
        .unwrap();
        for bytes in [100, 50] {
            let mut t: nop_stream_checkpoint::TaskSnapshot = serde_json::from_str(
                r#"{"task":{"job":"job","pipeline":"main","vertex":"v","subtask":0},"epoch":3,
                   "end_of_data":false,"segments":[],"splits":[],"watermarks":[],
                   "pending_transactions":[],"sink_operator":null,"snapshot_bytes":0,
                   "alignment_ms":0,"duration_ms":0}"#,
            )
            .unwrap();
            t.snapshot_bytes = bytes;
            m.tasks.push(t);
        }
        m.fencing_token = FencingToken(2);
        m.seal();
        ns.publish_manifest(&m).unwrap();
        let s = stats(dir.path()).unwrap();
        assert_eq!(s.durable_epochs, 3);
        assert_eq!(
            s.duration_ms,
            Spread {
                median: 20.0,
                max: 30.0
            }
        );
        assert_eq!(
            s.snapshot_bytes,
            Spread {
                median: 150.0,
                max: 150.0
            }
        );
        assert_eq!(first_commit_after(dir.path(), 4_900).unwrap(), 125.0);
    }
}
