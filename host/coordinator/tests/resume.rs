//! A restarted job manager resumes its jobs (`JobManager::resume_all`): a resume that fails
//! for a reason a retry may cure (the job store unavailable) is tried again in the
//! background and then runs once; one that keeps failing, or fails for good, leaves the job
//! failed with why; a job beside it resumes at once. A fake platform stands in for the
//! nodes: its runs block until the test ends, and it counts them.

mod common;

use nop_stream_checkpoint::Location;
use nop_stream_coordinator::JobReport;
use nop_stream_coordinator::jobs::{JobRecord, JobStore, JobStoreError, ObjectJobStore, Versioned};
use nop_stream_coordinator::manager::{
    Compiled, JobManager, JobRun, ManagerError, ManagerOptions, Platform, RunIn,
};
use nop_stream_core::{StreamModel, job_graph, partitioned_plan, stream_graph};
use nop_stream_proto::cli::{JobState, JobSubmission};
use nop_stream_storage::{ErrorKind, StoreError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Compiles against the fake catalog; its runs count themselves and block.
#[derive(Default)]
struct Nodes {
    /// Runs started, by job.
    runs: Mutex<BTreeMap<String, u32>>,
    /// Compile fails (a plugin gone from the registry).
    broken: bool,
}

impl Platform for Nodes {
    fn compile(&self, model: &StreamModel, _: &JobSubmission) -> Result<Compiled, ManagerError> {
        if self.broken {
            return Err(ManagerError::Compile(
                "plugin `agg@1.0.0` is not in the registry".into(),
            ));
        }
        let g =
            stream_graph(model, &common::Fake).map_err(|d| ManagerError::Compile(d.to_string()))?;
        Ok(Compiled {
            plan: Arc::new(partitioned_plan(&job_graph(&g))),
            components: BTreeMap::new(),
        })
    }

    fn migrate_state(
        &self,
        _: &Compiled,
        _: &str,
        _: &str,
        _: u32,
        _: &[nop_stream_coordinator::migrate::StateEntry],
    ) -> Result<Vec<Option<Vec<u8>>>, String> {
        Err("not in this test".into())
    }

    fn finalize_sinks(
        &self,
        _: &nop_stream_coordinator::from_savepoint::Savepoint,
        _: &nop_stream_coordinator::compat::Actions,
        _: &JobSubmission,
    ) -> Result<Vec<String>, ManagerError> {
        Ok(Vec::new())
    }

    fn claim_output(&self, _: &JobSubmission) -> Result<(), ManagerError> {
        Ok(())
    }

    fn run(&self, run: JobRun) -> Result<JobReport, ManagerError> {
        let job = run.compiled.plan.job.job_id.to_string();
        *self.runs.lock().unwrap().entry(job).or_default() += 1;
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    fn live_counts(&self, _: &str) -> nop_stream_coordinator::manager::LiveCounts {
        Default::default()
    }
}

impl Nodes {
    fn runs(&self, job: &str) -> u32 {
        self.runs.lock().unwrap().get(job).copied().unwrap_or(0)
    }
}

/// Job records in memory whose writes of a running record fail, for the jobs in
/// `failing`, as an unavailable store's would; the writes of failed records go through, so
/// how a job ended can be read back.
#[derive(Debug)]
struct Flaky {
    inner: ObjectJobStore,
    failing: Mutex<BTreeSet<String>>,
    /// Resumes refused: writes of a running record with no error.
    refused: AtomicU32,
}

impl JobStore for Flaky {
    fn load(&self, job: &str) -> Result<Option<Versioned<JobRecord>>, JobStoreError> {
        self.inner.load(job)
    }

    fn load_all(&self) -> Result<Vec<Versioned<JobRecord>>, JobStoreError> {
        self.inner.load_all()
    }

    fn save(&self, record: &JobRecord, expected: u64) -> Result<u64, JobStoreError> {
        if record.state == JobState::Running && self.failing.lock().unwrap().contains(&record.job) {
            // A resume writes its run's record with no error; a note of a failed
            // attempt writes one with its error.
            if record.error.is_none() {
                self.refused.fetch_add(1, Ordering::SeqCst);
            }
            return Err(JobStoreError::Store(StoreError::new(
                "memory://jobs",
                Some(&record.job),
                ErrorKind::Unavailable,
                "injected: the service is unavailable",
            )));
        }
        self.inner.save(record, expected)
    }
}

fn flaky(name: &str) -> Arc<Flaky> {
    let store = Location::parse(&format!("memory://{name}/jobs"))
        .unwrap()
        .open()
        .unwrap();
    Arc::new(Flaky {
        inner: ObjectJobStore::new(store),
        failing: Mutex::default(),
        refused: AtomicU32::new(0),
    })
}

fn options(name: &str, attempts: u32) -> ManagerOptions {
    let mut o = ManagerOptions::new(
        Location::parse(&format!("memory://{name}/checkpoints")).unwrap(),
        Location::parse(&format!("memory://{name}/savepoints")).unwrap(),
    );
    o.restart_delay = Duration::from_millis(10);
    o.resume_attempts = attempts;
    o
}

/// Two jobs, `a` and `b`, submitted to a first manager over `jobs` and running there.
fn two_running_jobs(name: &str, jobs: &Arc<Flaky>) -> (Arc<JobManager<Nodes>>, Arc<Nodes>) {
    let nodes = Arc::new(Nodes::default());
    let first = JobManager::new(
        Arc::clone(&nodes),
        Arc::clone(jobs) as Arc<dyn JobStore>,
        options(name, 1),
        |_| {},
    );
    for job in ["a", "b"] {
        let text = common::job(1, 4).replace("name = \"coord-test\"", &format!("name = \"{job}\""));
        let sub = JobSubmission::new(format!("{job}.toml"), text, "/".into(), "/out".into());
        first.submit(sub, RunIn::Background).unwrap();
        assert_eq!(first.record(job).unwrap().state, JobState::Running);
    }
    wait_for(
        || nodes.runs("a") == 1 && nodes.runs("b") == 1,
        "the first runs",
    );
    (first, nodes)
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A manager over `jobs` that has just started, as after a restart or a failover, with
/// `attempts` to resume each job.
fn restarted(
    name: &str,
    jobs: &Arc<Flaky>,
    nodes: &Arc<Nodes>,
    attempts: u32,
) -> Arc<JobManager<Nodes>> {
    JobManager::new(
        Arc::clone(nodes),
        Arc::clone(jobs) as Arc<dyn JobStore>,
        options(name, attempts),
        |_| {},
    )
}

fn stored(jobs: &Flaky, job: &str) -> JobRecord {
    jobs.load(job).unwrap().expect("a record").value
}

#[test]
fn a_resume_the_job_store_refuses_for_a_while_is_retried_and_runs_once() {
    let jobs = flaky("resume-retried");
    let _first = two_running_jobs("resume-retried", &jobs);
    jobs.failing.lock().unwrap().insert("a".into());

    let nodes = Arc::new(Nodes::default());
    let second = restarted("resume-retried", &jobs, &nodes, 10);
    let resumed = second.resume_all(Duration::ZERO).unwrap();
    assert_eq!(resumed, ["b"], "only the job beside it resumes at once");
    wait_for(|| jobs.refused.load(Ordering::SeqCst) >= 3, "two retries");
    assert_eq!(
        nodes.runs("a"),
        0,
        "a run started although its record was not written"
    );
    assert_eq!(stored(&jobs, "a").state, JobState::Running);

    jobs.failing.lock().unwrap().clear();
    wait_for(|| nodes.runs("a") == 1, "the retried resume's run");
    let a = stored(&jobs, "a");
    assert_eq!((a.state, a.error.as_deref()), (JobState::Running, None));
    // No further attempt once one succeeded, and `b` resumed once.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!((nodes.runs("a"), nodes.runs("b")), (1, 1));
}

#[test]
fn a_resume_that_keeps_failing_leaves_the_job_failed_after_its_attempts() {
    let jobs = flaky("resume-exhausted");
    let _first = two_running_jobs("resume-exhausted", &jobs);
    jobs.failing.lock().unwrap().insert("a".into());

    let nodes = Arc::new(Nodes::default());
    let second = restarted("resume-exhausted", &jobs, &nodes, 3);
    assert_eq!(second.resume_all(Duration::ZERO).unwrap(), ["b"]);
    wait_for(
        || stored(&jobs, "a").state == JobState::Failed,
        "the job to fail",
    );
    let error = stored(&jobs, "a").error.unwrap_or_default();
    assert!(
        error.starts_with("cannot resume after a restart (3 attempts): job store memory://jobs")
            && error.contains("injected: the service is unavailable"),
        "{error}"
    );
    assert_eq!(
        jobs.refused.load(Ordering::SeqCst),
        3,
        "one resume per attempt"
    );
    assert_eq!((nodes.runs("a"), nodes.runs("b")), (0, 1));
}

#[test]
fn a_resume_that_cannot_succeed_fails_the_job_at_once() {
    let jobs = flaky("resume-permanent");
    let _first = two_running_jobs("resume-permanent", &jobs);

    let nodes = Arc::new(Nodes {
        broken: true,
        ..Nodes::default()
    });
    let second = restarted("resume-permanent", &jobs, &nodes, 10);
    assert!(second.resume_all(Duration::ZERO).unwrap().is_empty());
    for job in ["a", "b"] {
        let r = stored(&jobs, job);
        assert_eq!(r.state, JobState::Failed, "{job}");
        assert_eq!(
            r.error.as_deref(),
            Some("cannot resume after a restart: plugin `agg@1.0.0` is not in the registry"),
            "{job}"
        );
    }
    assert_eq!((nodes.runs("a"), nodes.runs("b")), (0, 0));
}
