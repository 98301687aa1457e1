//! Job records and their store (design §8, "Storage by location"): what the job manager
//! keeps of every job, durable at the storage location, with a revision per write.
//!
//! [`JobStore::save`] is a compare-and-set on the revision: it writes revision `n + 1` only
//! if the latest is `n`, and a failed write is an error for the caller, never a log line.
//! [`ObjectJobStore`] implements it on any object store without conditional updates: each
//! revision is an immutable object `<job>/<revision:020>.json`, created once, so two
//! writers of the same revision cannot both succeed.

use nop_stream_checkpoint::names::component;
use nop_stream_checkpoint::{ObjectStore, Scoped};
use nop_stream_proto::cli::{JobState, JobSubmission, RefusedCounts};
use nop_stream_storage::{Created, StoreError};
use serde::{Deserialize, Serialize};

/// One earlier run of a job id, as its record keeps it once the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastRun {
    /// Its number (1 for the first submission of the job id).
    pub run: u32,
    /// How it ended.
    pub state: JobState,
    /// When it was submitted and when it ended, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// See `submitted_ms`.
    pub ended_ms: u64,
    /// Records its sources read and its sinks committed, as its final report counts them.
    pub records_read: u64,
    /// See `records_read`.
    pub records_written: u64,
    /// Its global recoveries.
    pub recoveries: u32,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// How many earlier runs a record keeps.
pub const HISTORY_RUNS: usize = 10;

/// What the job manager keeps of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub job: String,
    /// Job name.
    pub name: String,
    /// The submission, as it came (a restarted manager resumes from it).
    pub submission: JobSubmission,
    /// Where the job is.
    pub state: JobState,
    /// Semantic mode.
    pub semantic: String,
    /// When the current run was submitted, ms since the Unix epoch.
    pub submitted_ms: u64,
    /// The generation deployed last (0: never); generations never repeat for a job id.
    pub generation: u64,
    /// Global recoveries of the current run (over manager restarts): its deployments but
    /// the first, recorded as each one is made, or the run report's count.
    pub recoveries: u32,
    /// Deployments of the current run (over manager restarts), recorded as each is made.
    #[serde(default)]
    pub deployments: u32,
    /// Why the run failed, or what the last recovery recovered from.
    pub error: Option<String>,
    /// The DeploymentPlan of the live (or last) generation, as JSON.
    pub deployment_json: Option<String>,
    /// The run report once finished, as JSON.
    pub report_json: Option<String>,
    /// Stale work refused during the current run.
    pub refused: RefusedCounts,
    /// The nodes of the last placement (a restarted manager waits for them).
    #[serde(default)]
    pub last_nodes: Vec<String>,
    /// The plan fingerprint a restore accepts as an explicit action (a rescale or a
    /// savepoint restore at another parallelism), kept so a restarted manager resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale_from: Option<String>,
    /// The current run's number: 1 for the first submission of this job id, one more for
    /// each later one.
    #[serde(default)]
    pub run: u32,
    /// Earlier runs of this job id, newest last, at most [`HISTORY_RUNS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<PastRun>,
}

impl JobRecord {
    /// The record of run 1 of job `job` (also its name) submitted as `submission`, in
    /// `state`, under `semantic`: generation 0, no deployment, error, report, refusals or
    /// history yet; submitted at 1 ms past the Unix epoch (set `submitted_ms` for a real
    /// time).
    pub fn first_run(
        job: &str,
        submission: JobSubmission,
        state: JobState,
        semantic: &str,
    ) -> Self {
        JobRecord {
            job: job.to_owned(),
            name: job.to_owned(),
            submission,
            state,
            semantic: semantic.to_owned(),
            submitted_ms: 1,
            generation: 0,
            recoveries: 0,
            deployments: 0,
            error: None,
            deployment_json: None,
            report_json: None,
            refused: RefusedCounts::default(),
            last_nodes: Vec::new(),
            rescale_from: None,
            run: 1,
            history: Vec::new(),
        }
    }
}

/// A value and the revision it was read at (or written as).
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The revision (1 for the first write).
    pub revision: u64,
    /// The value.
    pub value: T,
}

/// Why a job store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JobStoreError {
    /// The object store failed.
    #[error("job store {0}")]
    Store(StoreError),
    /// Another writer saved the job since it was read: the write did not happen.
    #[error(
        "job store {location}: job `{job}` was written by another writer since revision \
         {expected} was read; this write of revision {} did not happen",
        expected + 1
    )]
    Conflict {
        /// The store's location.
        location: String,
        /// The job.
        job: String,
        /// The revision the writer had read.
        expected: u64,
    },
    /// The write was guarded on a leadership this coordinator no longer holds (design §8,
    /// "Coordinator HA"): it did not happen.
    #[error(
        "job store {location}: the write of job `{job}` was refused: this coordinator's \
         leadership (term {term}) is over"
    )]
    Fenced {
        /// The store's location.
        location: String,
        /// The job.
        job: String,
        /// The term the write was guarded on.
        term: u64,
    },
    /// A record does not decode.
    #[error("job store {location}: object {object}: not a job record")]
    Corrupt {
        /// The store's location.
        location: String,
        /// The object.
        object: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl From<StoreError> for JobStoreError {
    fn from(e: StoreError) -> Self {
        JobStoreError::Store(e)
    }
}

/// The job records' store.
pub trait JobStore: Send + Sync + std::fmt::Debug {
    /// The latest revision of `job`'s record, if it has one.
    ///
    /// # Errors
    /// Storage failures; a record that does not decode.
    fn load(&self, job: &str) -> Result<Option<Versioned<JobRecord>>, JobStoreError>;

    /// The latest revision of every job's record, oldest submission first.
    ///
    /// # Errors
    /// As [`Self::load`].
    fn load_all(&self) -> Result<Vec<Versioned<JobRecord>>, JobStoreError>;

    /// Writes `record` as revision `expected + 1`, only if the latest revision is
    /// `expected` (0: the job has no record yet). Returns the new revision.
    ///
    /// # Errors
    /// [`JobStoreError::Conflict`] if another writer got there first; storage failures
    /// (the write may not have happened: read again before retrying).
    fn save(&self, record: &JobRecord, expected: u64) -> Result<u64, JobStoreError>;
}

/// Job records on an object store: `<job>/<revision:020>.json` under its prefix.
#[derive(Debug)]
pub struct ObjectJobStore {
    store: Scoped,
}

/// Revisions kept per job besides the latest (older ones are deleted after a write).
const KEEP_REVISIONS: u64 = 2;

impl ObjectJobStore {
    /// The records at `store`'s prefix.
    pub fn new(store: Scoped) -> Self {
        ObjectJobStore { store }
    }

    fn name(job: &str, revision: u64) -> String {
        format!("{}/{revision:020}.json", component(job))
    }

    fn revisions(&self, job_dir: &str) -> Result<Vec<(u64, String)>, JobStoreError> {
        let mut out: Vec<(u64, String)> = self
            .store
            .list(&format!("{job_dir}/"))?
            .into_iter()
            .filter_map(|m| {
                let rev = m
                    .name
                    .rsplit('/')
                    .next()?
                    .strip_suffix(".json")?
                    .parse()
                    .ok()?;
                Some((rev, m.name))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn read(&self, object: &str, revision: u64) -> Result<Versioned<JobRecord>, JobStoreError> {
        let bytes = self.store.get(object)?;
        let value = serde_json::from_slice(&bytes).map_err(|source| JobStoreError::Corrupt {
            location: self.store.describe(),
            object: object.to_owned(),
            source,
        })?;
        Ok(Versioned { revision, value })
    }
}

impl JobStore for ObjectJobStore {
    fn load(&self, job: &str) -> Result<Option<Versioned<JobRecord>>, JobStoreError> {
        match self.revisions(&component(job))?.pop() {
            Some((rev, name)) => self.read(&name, rev).map(Some),
            None => Ok(None),
        }
    }

    fn load_all(&self) -> Result<Vec<Versioned<JobRecord>>, JobStoreError> {
        let mut dirs: Vec<String> = self
            .store
            .list("")?
            .into_iter()
            .filter_map(|m| m.name.split_once('/').map(|(d, _)| d.to_owned()))
            .collect();
        dirs.dedup();
        let mut out = Vec::new();
        for d in dirs {
            if let Some((rev, name)) = self.revisions(&d)?.pop() {
                out.push(self.read(&name, rev)?);
            }
        }
        out.sort_by_key(|r| r.value.submitted_ms);
        Ok(out)
    }

    fn save(&self, record: &JobRecord, expected: u64) -> Result<u64, JobStoreError> {
        let latest = self
            .revisions(&component(&record.job))?
            .last()
            .map_or(0, |(r, _)| *r);
        let conflict = || JobStoreError::Conflict {
            location: self.store.describe(),
            job: record.job.clone(),
            expected,
        };
        if latest != expected {
            return Err(conflict());
        }
        let revision = expected + 1;
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| JobStoreError::Corrupt {
            location: self.store.describe(),
            object: Self::name(&record.job, revision),
            source,
        })?;
        match self
            .store
            .put_if_absent(&Self::name(&record.job, revision), &bytes)?
        {
            c if c.holds(&bytes) => {}
            Created::Created | Created::Exists(_) => return Err(conflict()),
        }
        // The revision falling out of the kept ones goes; a failure leaves it behind (it
        // is never read: loads take the latest).
        if revision > KEEP_REVISIONS + 1 {
            let _ = self
                .store
                .delete(&Self::name(&record.job, revision - KEEP_REVISIONS - 1));
        }
        Ok(revision)
    }
}
