//! Checkpoint figures read back from a run's work directory (design §5): per-epoch
//! duration from the epoch log (`created` → `durable`), snapshot size from the retained
//! manifests, and recovery time after a SIGKILL (restart → first epoch committed by the
//! new attempt).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// One line of a namespace's `epochs.log`: `state` is `created`, `durable`, `committed`
/// or `aborted`; `at_ms` Unix ms.
#[derive(Deserialize)]
pub(crate) struct LogRecord {
    pub(crate) epoch: u64,
    pub(crate) state: String,
    pub(crate) attempt: u32,
    pub(crate) at_ms: u64,
}

#[derive(Deserialize)]
struct Manifest {
    tasks: Vec<TaskSnapshot>,
}

#[derive(Deserialize)]
struct TaskSnapshot {
    snapshot_bytes: u64,
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

/// The checkpoint namespace directories under `<work>/checkpoints`.
pub(crate) fn namespaces(work: &Path) -> Result<Vec<PathBuf>> {
    let dir = work.join("checkpoints");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            out.push(p);
        }
    }
    Ok(out)
}

/// The records of `<ns>/epochs.log`, a torn last line (a killed or running job) skipped.
pub(crate) fn read_log(ns: &Path) -> Result<Vec<LogRecord>> {
    let path = ns.join("epochs.log");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    // A torn last line (a killed run) is skipped.
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// Reads the epoch log and retained manifests of a run's work directory.
///
/// # Errors
/// No checkpoint directory, or an unreadable log.
pub fn stats(work: &Path) -> Result<EpochStats> {
    let mut durations = Vec::new();
    let mut sizes = Vec::new();
    for ns in namespaces(work)? {
        let log = read_log(&ns)?;
        for d in log.iter().filter(|r| r.state == "durable") {
            if let Some(c) = log
                .iter()
                .find(|r| r.state == "created" && r.epoch == d.epoch && r.attempt == d.attempt)
            {
                durations.push(d.at_ms.saturating_sub(c.at_ms) as f64);
            }
        }
        let manifests = ns.join("manifests");
        if let Ok(dir) = std::fs::read_dir(&manifests) {
            for e in dir {
                let p = e?.path();
                if let Ok(m) = serde_json::from_slice::<Manifest>(&std::fs::read(&p)?) {
                    sizes.push(m.tasks.iter().map(|t| t.snapshot_bytes).sum::<u64>() as f64);
                }
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
    for ns in namespaces(work)? {
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
        let dir = std::env::temp_dir().join(format!("nopstream-epochs-{}", std::process::id()));
        let ns = dir.join("checkpoints").join("job.main");
        std::fs::create_dir_all(ns.join("manifests")).unwrap();
        std::fs::write(
            ns.join("epochs.log"),
            concat!(
                "{\"epoch\":1,\"state\":\"created\",\"attempt\":1,\"at_ms\":1000}\n",
                "{\"epoch\":1,\"state\":\"durable\",\"attempt\":1,\"at_ms\":1010}\n",
                "{\"epoch\":2,\"state\":\"created\",\"attempt\":1,\"at_ms\":2000}\n",
                "{\"epoch\":2,\"state\":\"durable\",\"attempt\":1,\"at_ms\":2030}\n",
                "{\"epoch\":3,\"state\":\"created\",\"attempt\":2,\"at_ms\":5000}\n",
                "{\"epoch\":3,\"state\":\"durable\",\"attempt\":2,\"at_ms\":5020}\n",
                "{\"epoch\":3,\"state\":\"committed\",\"attempt\":2,\"at_ms\":5025}\n",
                "{\"epoch\":4,\"sta"
            ),
        )
        .unwrap();
        std::fs::write(
            ns.join("manifests").join("3.json"),
            r#"{"tasks":[{"snapshot_bytes":100},{"snapshot_bytes":50}]}"#,
        )
        .unwrap();
        let s = stats(&dir).unwrap();
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
        assert_eq!(first_commit_after(&dir, 4_900).unwrap(), 125.0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
