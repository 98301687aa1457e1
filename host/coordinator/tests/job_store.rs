//! Job records on an object store: revisions are compare-and-set (two writers of one
//! revision cannot both succeed, a stale writer is refused and nothing is lost), records
//! survive being read by a fresh store (another coordinator process), and old revisions
//! are pruned.

use nop_stream_coordinator::jobs::{JobRecord, JobStore, JobStoreError, ObjectJobStore};
use nop_stream_proto::cli::{JobState, JobSubmission};
use nop_stream_storage::memory::MemStore;
use nop_stream_storage::{ObjectStore, Scoped};
use std::sync::Arc;

fn record(job: &str, state: JobState) -> JobRecord {
    JobRecord::first_run(
        job,
        JobSubmission::new("job.toml".into(), String::new(), ".".into(), "out".into()),
        state,
        "strict-exactly-once",
    )
}

#[test]
fn revisions_are_compare_and_set() {
    let inner: Arc<dyn ObjectStore> = Arc::new(MemStore::new());
    let a = ObjectJobStore::new(Scoped::new(Arc::clone(&inner), "jobs"));
    let b = ObjectJobStore::new(Scoped::new(Arc::clone(&inner), "jobs"));
    assert!(a.load("j").unwrap().is_none());
    assert_eq!(a.save(&record("j", JobState::Submitted), 0).unwrap(), 1);
    // A second create of the same job is a conflict, not an overwrite.
    let e = b.save(&record("j", JobState::Running), 0).unwrap_err();
    assert!(
        matches!(e, JobStoreError::Conflict { expected: 0, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("job `j`"), "{e}");
    // Both read revision 1; the first write wins, the second is refused.
    let seen = b.load("j").unwrap().unwrap();
    assert_eq!(seen.revision, 1);
    assert_eq!(a.save(&record("j", JobState::Running), 1).unwrap(), 2);
    let e = b
        .save(&record("j", JobState::Cancelled), seen.revision)
        .unwrap_err();
    assert!(
        matches!(e, JobStoreError::Conflict { expected: 1, .. }),
        "{e}"
    );
    let latest = b.load("j").unwrap().unwrap();
    assert_eq!(
        (latest.revision, latest.value.state),
        (2, JobState::Running)
    );
    // Read again, the write goes through.
    assert_eq!(b.save(&record("j", JobState::Finished), 2).unwrap(), 3);
    assert_eq!(
        a.load("j").unwrap().unwrap().value.state,
        JobState::Finished
    );
}

#[test]
fn records_load_in_submission_order_and_old_revisions_go() {
    let inner: Arc<dyn ObjectStore> = Arc::new(MemStore::new());
    let s = ObjectJobStore::new(Scoped::new(Arc::clone(&inner), "jobs"));
    for (i, job) in ["b/x", "a", "c.d"].iter().enumerate() {
        let mut r = record(job, JobState::Running);
        r.submitted_ms = 10 - i as u64;
        s.save(&r, 0).unwrap();
    }
    let all: Vec<String> = s
        .load_all()
        .unwrap()
        .into_iter()
        .map(|r| r.value.job)
        .collect();
    assert_eq!(
        all,
        ["c.d", "a", "b/x"],
        "oldest submission first; ids with / and . kept apart"
    );
    for rev in 1..20 {
        s.save(&record("a", JobState::Running), rev).unwrap();
    }
    let kept = inner.list("jobs/a/").unwrap().len();
    assert!(kept <= 3, "{kept} revisions kept");
    assert_eq!(s.load("a").unwrap().unwrap().revision, 20);
}
