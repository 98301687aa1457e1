//! Watermark alignment across nodes (design §8.5, `max_drift_ms`): the coordinator's table
//! of the watermarks of every subtask of every aligned source, per (job, generation,
//! source vertex), and which node reported each. Pure: [`WatermarkRelay::report`] takes a
//! node's report and returns the frames to push; the caller does the I/O.
//!
//! The rules:
//! - A node reports the watermarks of its own subtasks of a source ([`SourceWatermarks`]).
//!   Every node that reported for a (job, generation, vertex) is sent, whenever another
//!   node's report for it arrives, the latest watermarks of the subtasks it does not run;
//!   a node's first report for it is answered with what is known of the others. So a
//!   frame names only subtasks of one aligned source, at most its parallelism entries.
//! - Only the newest generation of a job is kept: a report of an older generation, or of
//!   a generation at or below the one [`WatermarkRelay::fence`] retired, is refused and
//!   counted ([`WatermarkRelay::refused`]); a report of a newer one drops the job's older
//!   tables.
//! - A subtask no report has named yet is absent from the frames: the receiving node keeps
//!   its slot at "not reported" (`i64::MIN`), which holds its own subtasks back. That is
//!   what alignment means. It cannot deadlock: on current values the slowest subtask is
//!   never held back, finished or idle subtasks report `i64::MAX`, and nodes repeat their
//!   reports, so a stale value is replaced within a relay.

use nop_stream_api::JobId;
use nop_stream_proto::session::SourceWatermarks;
use std::collections::{BTreeMap, HashMap};

/// One job's tables: the generation they belong to, and per source vertex, per subtask,
/// the node that reported it and its watermark.
#[derive(Debug)]
struct JobTables<N> {
    generation: u64,
    vertices: BTreeMap<u32, BTreeMap<u32, (N, i64)>>,
}

/// The coordinator's watermark tables, over node ids of type `N`.
#[derive(Debug)]
pub struct WatermarkRelay<N> {
    jobs: HashMap<JobId, JobTables<N>>,
    /// Per job, the highest generation fenced: reports of it and below are refused.
    fenced: HashMap<JobId, u64>,
    refused: u64,
}

impl<N> Default for WatermarkRelay<N> {
    fn default() -> Self {
        WatermarkRelay {
            jobs: HashMap::new(),
            fenced: HashMap::new(),
            refused: 0,
        }
    }
}

impl<N: Copy + Ord> WatermarkRelay<N> {
    /// Records `node`'s report `r` and returns the frames to push: `(node, frame)`, each
    /// naming the subtasks of `r`'s source that run on other nodes than the one it goes
    /// to. A refused report (stale generation) returns nothing and is counted.
    pub fn report(&mut self, node: N, r: &SourceWatermarks) -> Vec<(N, SourceWatermarks)> {
        if self.fenced.get(&r.job).is_some_and(|f| r.generation <= *f) {
            self.refused += 1;
            return Vec::new();
        }
        let t = self.jobs.entry(r.job.clone()).or_insert_with(|| JobTables {
            generation: r.generation,
            vertices: BTreeMap::new(),
        });
        if r.generation < t.generation {
            self.refused += 1;
            return Vec::new();
        }
        if r.generation > t.generation {
            t.generation = r.generation;
            t.vertices.clear();
        }
        let table = t.vertices.entry(r.vertex).or_default();
        let first = !table.values().any(|(n, _)| *n == node);
        for &(sub, wm) in &r.watermarks {
            table.insert(sub, (node, wm));
        }
        let mut nodes: Vec<N> = table.values().map(|(n, _)| *n).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
            .into_iter()
            .filter(|n| *n != node || first)
            .filter_map(|to| {
                let watermarks: Vec<(u32, i64)> = table
                    .iter()
                    .filter(|(_, (n, _))| *n != to)
                    .map(|(s, (_, w))| (*s, *w))
                    .collect();
                (!watermarks.is_empty()).then(|| {
                    (
                        to,
                        SourceWatermarks {
                            job: r.job.clone(),
                            generation: r.generation,
                            vertex: r.vertex,
                            watermarks,
                        },
                    )
                })
            })
            .collect()
    }

    /// Every generation of `job` up to `generation` is over: its tables go, and reports of
    /// it are refused from now on.
    pub fn fence(&mut self, job: &JobId, generation: u64) {
        let f = self.fenced.entry(job.clone()).or_insert(generation);
        *f = (*f).max(generation);
        if self
            .jobs
            .get(job)
            .is_some_and(|t| t.generation <= generation)
        {
            self.jobs.remove(job);
        }
    }

    /// The job ended here: its tables and fence go.
    pub fn forget(&mut self, job: &JobId) {
        self.jobs.remove(job);
        self.fenced.remove(job);
    }

    /// Reports refused as stale since this relay was made.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(generation: u64, vertex: u32, w: &[(u32, i64)]) -> SourceWatermarks {
        SourceWatermarks {
            job: JobId::new("j"),
            generation,
            vertex,
            watermarks: w.to_vec(),
        }
    }

    #[test]
    fn each_node_gets_the_subtasks_it_does_not_run() {
        let mut r = WatermarkRelay::default();
        // Node 1 runs subtask 0: nothing is known of the others yet.
        assert!(r.report(1u32, &report(4, 0, &[(0, 100)])).is_empty());
        // Node 2 runs subtasks 1 and 2: node 1 hears of them, node 2 (first report) of 0.
        let out = r.report(2, &report(4, 0, &[(1, 50), (2, i64::MIN)]));
        assert_eq!(
            out,
            vec![
                (1, report(4, 0, &[(1, 50), (2, i64::MIN)])),
                (2, report(4, 0, &[(0, 100)])),
            ]
        );
        // A later report of node 1 goes to node 2 only.
        let out = r.report(1, &report(4, 0, &[(0, 300)]));
        assert_eq!(out, vec![(2, report(4, 0, &[(0, 300)]))]);
        // Another vertex has its own table.
        assert!(r.report(1, &report(4, 7, &[(0, 1)])).is_empty());
        assert_eq!(r.refused(), 0);
    }

    #[test]
    fn a_single_node_source_sends_nothing() {
        let mut r = WatermarkRelay::default();
        assert!(r.report(1u32, &report(1, 0, &[(0, 5), (1, 6)])).is_empty());
        assert!(r.report(1u32, &report(1, 0, &[(0, 7), (1, 8)])).is_empty());
    }

    #[test]
    fn older_generations_are_refused_and_a_newer_one_starts_afresh() {
        let mut r = WatermarkRelay::default();
        r.report(1u32, &report(3, 0, &[(0, 100)]));
        // Generation 4 starts: generation 3's entries do not reach its nodes.
        assert!(r.report(2, &report(4, 0, &[(1, 10)])).is_empty());
        assert!(r.report(1, &report(3, 0, &[(0, 200)])).is_empty());
        assert_eq!(r.refused(), 1);
        let out = r.report(1, &report(4, 0, &[(0, 20)]));
        assert_eq!(
            out,
            vec![(1, report(4, 0, &[(1, 10)])), (2, report(4, 0, &[(0, 20)]))]
        );
    }

    #[test]
    fn a_fenced_generation_is_refused_even_before_its_successor_reports() {
        let mut r = WatermarkRelay::default();
        r.report(1u32, &report(2, 0, &[(0, 1)]));
        r.fence(&JobId::new("j"), 2);
        assert!(r.report(2, &report(2, 0, &[(1, 1)])).is_empty());
        assert_eq!(r.refused(), 1);
        // The next generation is served.
        assert!(r.report(2, &report(3, 0, &[(1, 1)])).is_empty());
        assert_eq!(
            r.report(1, &report(3, 0, &[(0, 2)])),
            vec![(1, report(3, 0, &[(1, 1)])), (2, report(3, 0, &[(0, 2)]))]
        );
        r.forget(&JobId::new("j"));
        assert!(r.report(2, &report(2, 0, &[(1, 1)])).is_empty());
        assert_eq!(r.refused(), 1, "a forgotten job starts afresh");
    }
}
