//! The checkpoint namespace protocol, as one conformance suite run against every backend:
//! a local directory and memory here, a real S3-compatible server in
//! [`protocol_on_s3`] (ignored unless `.ci/run` started one). Each check names the
//! failure it pins; faults are injected by `nop_stream_storage::faults::Faulty` around
//! the backend.
//!
//! The S3 test server (moto) checks `If-None-Match` without a lock, so the races of
//! conditional creates (attempt claims) run on the local and memory backends only.

use nop_stream_api::{AttemptId, EpochId, FencingToken, SubtaskIndex, TaskId};
use nop_stream_checkpoint::coordinator::EpochState;
use nop_stream_checkpoint::{
    EpochLogRecord, EpochManifest, Namespace, STATE_FORMAT_VERSION, SegmentDescriptor,
    StorageError, TaskSnapshot, names, payload, payload_checksum, savepoint,
};
use nop_stream_storage::faults::{Fault, Faulty, Op};
use nop_stream_storage::local::LocalDir;
use nop_stream_storage::memory::MemStore;
use nop_stream_storage::{Created, Location, ObjectMeta, ObjectStore, Scoped};
use std::collections::BTreeSet;
use std::sync::Arc;

fn descriptor(epoch: u64, dir: u64, attempt: u32, full: bool) -> SegmentDescriptor {
    SegmentDescriptor {
        state_path: format!("checkpoint/j.main/{epoch}/op/0/0/v"),
        operator_id: "op".into(),
        shard: 0,
        state: "v".into(),
        file: names::segment_file(dir, "op", 0, attempt),
        offset: 0,
        len: 1,
        checksum: payload_checksum(b"x"),
        codec: if full {
            payload::KV_CODEC
        } else {
            payload::KV_DELTA_CODEC
        }
        .into(),
        schema_version: 1,
        entries: 1,
    }
}

/// A manifest of `epoch` by `attempt` whose one task references the segment files of
/// `dirs` (a chain: the first full, the rest deltas).
fn manifest(epoch: u64, attempt: u32, dirs: &[u64]) -> EpochManifest {
    let mut m = EpochManifest {
        epoch: EpochId(epoch),
        job_id: "j".into(),
        pipeline_id: "main".into(),
        namespace: "j.main".into(),
        plan_fingerprint: "f".into(),
        state_shard_count: 8,
        attempt: AttemptId(attempt),
        fencing_token: FencingToken(u64::from(attempt)),
        final_epoch: false,
        tasks: vec![TaskSnapshot {
            task: TaskId {
                job: "j".into(),
                pipeline: "main".into(),
                vertex: "v".into(),
                subtask: SubtaskIndex(0),
            },
            epoch: EpochId(epoch),
            end_of_data: false,
            segments: dirs
                .iter()
                .enumerate()
                .map(|(i, d)| descriptor(epoch, *d, attempt, i == 0))
                .collect(),
            operator_state: Vec::new(),
            splits: Vec::new(),
            watermarks: Vec::new(),
            ended_inputs: Vec::new(),
            pending_transactions: Vec::new(),
            sink_operator: None,
            snapshot_bytes: 1,
            alignment_ms: 0,
            duration_ms: 0,
            async_ms: 0,
            barrier_unix_ms: 0,
            compacted_bytes: 0,
            records_in_total: 0,
            records_out_total: 0,
        }],
        enumerators: Vec::new(),
        state_format_version: STATE_FORMAT_VERSION,
        created_ms: 1,
        durable_ms: 2,
        meta: None,
        checksum: String::new(),
    };
    m.seal();
    m
}

/// Writes the segment of `epoch` by `attempt` and publishes a manifest referencing `dirs`.
fn epoch(ns: &Namespace, e: u64, attempt: u32, dirs: &[u64]) {
    ns.write_segment(&names::segment_file(e, "op", 0, attempt), b"x")
        .unwrap();
    ns.publish_manifest(&manifest(e, attempt, dirs)).unwrap();
}

fn log(ns: &Namespace, epoch: u64, state: EpochState, attempt: u32) {
    ns.append_log(&EpochLogRecord {
        epoch: EpochId(epoch),
        state,
        attempt: AttemptId(attempt),
        at_ms: epoch,
        detail: None,
    })
    .unwrap();
}

fn segment_dirs(ns: &Namespace) -> BTreeSet<u64> {
    ns.store()
        .list(names::SEGMENTS)
        .unwrap()
        .iter()
        .filter_map(|m| names::segment_dir_epoch(&m.name))
        .collect()
}

/// Runs every check of the suite on namespaces of `store` (each under its own prefix).
fn suite(store: Arc<dyn ObjectStore>) {
    let mut n = 0;
    let mut fresh = || {
        n += 1;
        Scoped::new(Arc::clone(&store), &format!("suite-{n}"))
    };
    manifests_publish_once_and_verify(fresh());
    segments_appear_whole_and_truncation_is_named(fresh());
    retention_keeps_what_kept_manifests_reference(fresh());
    the_epoch_log_is_one_object_per_record(fresh());
    a_zombie_attempt_loses_its_epoch_and_a_fenced_one_never_lands(fresh());
    a_lost_acknowledgement_of_the_epoch_record_is_a_success(fresh());
    an_unknown_outcome_keeps_its_files_until_it_is_resolved(fresh());
    attempts_are_claimed_once_each(fresh());
    savepoints_are_self_contained_prefixes(fresh(), fresh());
}

fn manifests_publish_once_and_verify(at: Scoped) {
    let ns = Namespace::new(at.clone());
    assert!(ns.latest_manifest().unwrap().is_none());
    epoch(&ns, 3, 1, &[3]);
    // Epoch 7 as the epoch loop publishes it: sealed and encoded once.
    ns.write_segment(&names::segment_file(7, "op", 0, 1), b"x")
        .unwrap();
    let mut m7 = manifest(7, 1, &[7]);
    m7.checksum = "stale".into();
    let mut buf = b"left over".to_vec();
    ns.seal_and_publish(&mut m7, &mut buf).unwrap();
    assert_eq!(m7.checksum, manifest(7, 1, &[7]).checksum, "as seal()");
    assert_eq!(buf, serde_json::to_vec(&m7).unwrap());
    assert!(m7.verify());
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(3), EpochId(7)]);
    assert_eq!(ns.read_manifest(EpochId(7)).unwrap(), m7);
    assert_eq!(ns.latest_manifest().unwrap().unwrap().epoch, EpochId(7));
    // Publishing the identical manifest again (a retry) succeeds and changes nothing.
    ns.publish_manifest(&manifest(7, 1, &[7])).unwrap();
    // Tampering with a manifest is detected.
    let name = names::manifest_candidate(7, 1);
    let text = String::from_utf8(at.get(&name).unwrap())
        .unwrap()
        .replace("\"plan_fingerprint\":\"f\"", "\"plan_fingerprint\":\"g\"");
    assert!(text.contains("\"g\""), "the manifest is compact JSON");
    at.put(&name, text.as_bytes()).unwrap();
    let e = ns.read_manifest(EpochId(7)).unwrap_err();
    assert!(matches!(e, StorageError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&name), "{e}");
}

fn segments_appear_whole_and_truncation_is_named(at: Scoped) {
    let ns = Namespace::new(at.clone());
    let rel = names::segment_file(3, "op", 0, 1);
    let mut w = ns.segment_writer(&rel).unwrap();
    w.write(b"hello ").unwrap();
    w.write(b"world").unwrap();
    assert_eq!(
        ns.segment_size(&rel).unwrap(),
        None,
        "not visible before the finish"
    );
    w.finish().unwrap();
    assert_eq!(ns.read_range(&rel, 6, 5).unwrap(), b"world");
    assert_eq!(ns.segment_size(&rel).unwrap(), Some(11));
    // Regression: a truncated segment surfaced as "failed to fill whole buffer".
    at.put(&rel, b"hello").unwrap();
    let e = ns.read_range(&rel, 3, 8).unwrap_err();
    assert!(matches!(e, StorageError::Corrupt { .. }), "{e}");
    assert!(
        e.to_string().contains("segment truncated") && e.to_string().contains(&rel),
        "{e}"
    );
}

fn retention_keeps_what_kept_manifests_reference(at: Scoped) {
    let ns = Namespace::new(at);
    // Epoch 1 full; epoch 2 a new full (a compaction); 3..=6 deltas on 2. Epoch 4 was
    // aborted, but its delta stays in the chain (a task never learns of an abort).
    for e in 1..=6u64 {
        let chain: Vec<u64> = if e == 1 { vec![1] } else { (2..=e).collect() };
        ns.write_segment(&names::segment_file(e, "op", 0, 1), b"x")
            .unwrap();
        if e == 4 {
            ns.abort_epoch(EpochId(4), AttemptId(1), "timed out")
                .unwrap();
        } else {
            ns.publish_manifest(&manifest(e, 1, &chain)).unwrap();
        }
    }
    ns.write_segment(&names::segment_file(7, "op", 0, 1), b"in flight")
        .unwrap();
    // An orphan: epoch 0's files, never published.
    ns.write_segment(&names::segment_file(0, "op", 0, 1), b"x")
        .unwrap();
    assert_eq!(
        ns.retain(1).unwrap(),
        [EpochId(1), EpochId(2), EpochId(3), EpochId(5)]
    );
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(6)]);
    assert_eq!(
        segment_dirs(&ns),
        BTreeSet::from([2, 3, 4, 5, 6, 7]),
        "the chain of epoch 6 (full 2, deltas 3..6, the aborted 4 included) and the in-flight \
         7 stay; epoch 1's full snapshot and the orphan 0 go"
    );
    assert!(ns.read_manifest(EpochId(6)).is_ok());
}

fn the_epoch_log_is_one_object_per_record(at: Scoped) {
    let ns = Namespace::new(at.clone());
    for e in 1..=40u64 {
        let attempt = if e > 30 { 2 } else { 1 };
        log(&ns, e, EpochState::Created, attempt);
        log(&ns, e, EpochState::Durable, attempt);
        epoch(&ns, e, attempt, &[e]);
        log(&ns, e, EpochState::Committed, attempt);
        // A retry of the same record (a lost acknowledgement) changes nothing.
        log(&ns, e, EpochState::Committed, attempt);
        ns.retain(3).unwrap();
    }
    log(&ns, 41, EpochState::Created, 3);
    let records = ns.read_log().unwrap();
    assert_eq!(
        records.len(),
        40 * 3 + 1,
        "every record within the history, once each (the bound is a unit test of \
         plan_retention)"
    );
    for e in 38..=40 {
        let states: Vec<_> = records
            .iter()
            .filter(|r| r.epoch.0 == e)
            .map(|r| r.state)
            .collect();
        assert_eq!(
            states,
            [
                EpochState::Created,
                EpochState::Durable,
                EpochState::Committed
            ],
            "retained epoch {e} keeps its records in order"
        );
    }
    assert_eq!(records.last().unwrap().epoch, EpochId(41));
    let log_objects = at.list(names::LOG).unwrap().len();
    assert_eq!(log_objects, records.len());
}

fn a_zombie_attempt_loses_its_epoch_and_a_fenced_one_never_lands(at: Scoped) {
    let ns = Namespace::new(at);
    epoch(&ns, 5, 1, &[5]);
    // A zombie of attempt 1 and the live attempt 2 both reach epoch 6; the first create
    // wins, the other loses and retires.
    epoch(&ns, 6, 2, &[6]);
    let refused = nop_stream_checkpoint::namespace::refused_epoch_claims();
    let e = ns.publish_manifest(&manifest(6, 1, &[6])).unwrap_err();
    // Counted (`nopstream_epoch_claims_refused_total`); other tests of this binary may
    // count theirs meanwhile, so at least this one.
    assert!(nop_stream_checkpoint::namespace::refused_epoch_claims() > refused);
    assert!(
        matches!(
            e,
            StorageError::EpochTaken {
                epoch: 6,
                attempt: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("durable by attempt 2"), "{e}");
    // Attempt 3 fences epoch 7, which attempt 2 created but never made durable; attempt
    // 2's late publish of it is refused.
    assert_eq!(
        ns.abort_epoch(EpochId(7), AttemptId(3), "fenced by attempt 3")
            .unwrap(),
        None
    );
    let e = ns.publish_manifest(&manifest(7, 2, &[7])).unwrap_err();
    assert!(e.to_string().contains("aborted by attempt 3"), "{e}");
    assert_eq!(ns.latest_manifest().unwrap().unwrap().attempt, AttemptId(2));
    assert_eq!(ns.latest_manifest().unwrap().unwrap().epoch, EpochId(6));
    // Fencing an epoch that turned out durable returns its record instead.
    assert!(
        ns.abort_epoch(EpochId(6), AttemptId(3), "fenced")
            .unwrap()
            .is_some()
    );
}

fn a_lost_acknowledgement_of_the_epoch_record_is_a_success(at: Scoped) {
    // FLINK-28265: the write succeeded, its acknowledgement was lost, the retry found the
    // object there and the state was discarded; the next recovery missed a file.
    let faulty = Arc::new(Faulty::new(Arc::new(at)));
    let ns = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    epoch(&ns, 1, 1, &[1]);
    faulty.inject(Op::PutIfAbsent, "epochs/", 1, Fault::LostAck);
    ns.write_segment(&names::segment_file(2, "op", 0, 1), b"x")
        .unwrap();
    ns.publish_manifest(&manifest(2, 1, &[2]))
        .expect("the retry finds its own record");
    assert_eq!(faulty.injected(), 1);
    ns.retain(1).unwrap();
    assert_eq!(ns.latest_manifest().unwrap().unwrap().epoch, EpochId(2));
    assert!(
        segment_dirs(&ns).contains(&2),
        "nothing referenced is deleted"
    );
    assert_eq!(
        ns.read_range(&names::segment_file(2, "op", 0, 1), 0, 1)
            .unwrap(),
        b"x"
    );
}

fn an_unknown_outcome_keeps_its_files_until_it_is_resolved(at: Scoped) {
    // FLINK-22494: a write whose outcome was unknown had its files collected.
    let faulty = Arc::new(Faulty::new(Arc::new(at)));
    let ns = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    epoch(&ns, 1, 1, &[1]);
    // Every try of epoch 2's record stalls: the outcome stays unknown.
    faulty.inject(
        Op::PutIfAbsent,
        "epochs/",
        nop_stream_checkpoint::namespace::RETRIES + 1,
        Fault::Stall,
    );
    ns.write_segment(&names::segment_file(2, "op", 0, 1), b"x")
        .unwrap();
    let e = ns.publish_manifest(&manifest(2, 1, &[2])).unwrap_err();
    assert!(e.outcome_unknown(), "{e}");
    assert_eq!(ns.unresolved_epochs(), BTreeSet::from([2]));
    // The next attempt goes on past it; retention must not touch epoch 2's files while
    // its outcome is unknown (its stalled create may still land).
    epoch(&ns, 4, 2, &[4]);
    faulty.inject(
        Op::PutIfAbsent,
        "epochs/",
        nop_stream_checkpoint::namespace::RETRIES + 1,
        Fault::Unavailable,
    );
    ns.retain(1).unwrap();
    assert!(
        segment_dirs(&ns).contains(&2),
        "unresolved: its segments stay"
    );
    assert!(
        ns.store().get(&names::manifest_candidate(2, 1)).is_ok(),
        "and its manifest"
    );
    // The stalled creates land now: epoch 2 is durable after all. Retention resolves it
    // (the same create finds its own record) and collects it like any old epoch.
    faulty.release_stalled().unwrap();
    ns.retain(1).unwrap();
    assert!(ns.unresolved_epochs().is_empty());
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(4)]);
    assert!(!segment_dirs(&ns).contains(&2));
}

fn attempts_are_claimed_once_each(at: Scoped) {
    let ns = Arc::new(Namespace::new(at));
    assert_eq!(ns.next_attempt(0).unwrap(), 1);
    assert_eq!(ns.next_attempt(0).unwrap(), 2);
    assert_eq!(ns.next_attempt(10).unwrap(), 11, "at least after a floor");
    assert_eq!(ns.next_attempt(0).unwrap(), 12);
}

fn savepoints_are_self_contained_prefixes(at: Scoped, out: Scoped) {
    let ns = Namespace::new(at);
    epoch(&ns, 1, 1, &[1]);
    epoch(&ns, 2, 1, &[1, 2]);
    let info = savepoint::export(&ns, "j", EpochId(2), &out).unwrap();
    assert_eq!(info.epoch, 2);
    // The job's checkpoints go; the savepoint stays whole.
    ns.delete_all().unwrap();
    let sp = Namespace::new(out.clone());
    let m = sp.latest_manifest().unwrap().unwrap();
    assert_eq!(m.epoch, EpochId(2));
    for s in &m.tasks[0].segments {
        assert_eq!(sp.read_range(&s.file, s.offset, s.len).unwrap(), b"x");
    }
    assert_eq!(savepoint::read_info(&out).unwrap(), info);
    // Never overwritten.
    let e = savepoint::export(&sp, "j", EpochId(2), &out).unwrap_err();
    assert!(e.to_string().contains("never overwritten"), "{e}");
}

#[test]
fn protocol_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    suite(Arc::new(LocalDir::open(dir.path()).unwrap()));
}

#[test]
fn protocol_in_memory() {
    suite(Arc::new(MemStore::new()));
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn protocol_on_s3() {
    let url = std::env::var("NOP_TEST_S3_URL").expect(
        "NOP_TEST_S3_URL is not set: start the test server with \
         `eval \"$(scripts/s3-test-server.sh start)\"`",
    );
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let loc = Location::parse(&url)
        .unwrap()
        .join(&format!("checkpoint-tests/{}-{n}", std::process::id()));
    let store = loc.open().unwrap();
    suite(Arc::new(store));
}

#[test]
fn attempt_claims_race_to_distinct_numbers() {
    let dir = tempfile::tempdir().unwrap();
    for store in [
        Arc::new(LocalDir::open(dir.path()).unwrap()) as Arc<dyn ObjectStore>,
        Arc::new(MemStore::new()),
    ] {
        let ns = Arc::new(Namespace::new(Scoped::new(store, "race")));
        let got: Vec<u32> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    let ns = Arc::clone(&ns);
                    s.spawn(move || ns.next_attempt(0).unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let distinct: BTreeSet<u32> = got.iter().copied().collect();
        assert_eq!(distinct.len(), 8, "{got:?}");
    }
}

#[test]
fn a_namespace_of_the_older_layout_reads_as_it_is() {
    // Checkpoint directories written by earlier hosts: manifests by epoch, an append-only
    // epochs.log (a torn last line included) and an attempt counter.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("manifests")).unwrap();
    std::fs::create_dir_all(root.join("segments/4/op")).unwrap();
    std::fs::write(root.join("segments/4/op/0.a2.seg"), b"x").unwrap();
    let m = manifest(4, 2, &[]);
    std::fs::write(
        root.join(names::legacy_manifest(4)),
        serde_json::to_vec_pretty(&m).unwrap(),
    )
    .unwrap();
    let line = serde_json::to_string(&EpochLogRecord {
        epoch: EpochId(4),
        state: EpochState::Durable,
        attempt: AttemptId(2),
        at_ms: 5,
        detail: None,
    })
    .unwrap();
    std::fs::write(
        root.join("epochs.log"),
        format!("{line}\n{{\"epoch\":5,\"sta"),
    )
    .unwrap();
    std::fs::write(root.join("attempt"), "2\n").unwrap();
    let ns = Namespace::new(Location::Local(root.to_owned()).open().unwrap());
    assert_eq!(ns.latest_manifest().unwrap().unwrap(), m);
    assert_eq!(ns.read_log().unwrap().len(), 1);
    assert_eq!(ns.next_attempt(0).unwrap(), 3, "past the old counter");
    // New epochs go on in the new layout beside it.
    epoch(&ns, 6, 3, &[6]);
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(4), EpochId(6)]);
    ns.retain(1).unwrap();
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(6)]);
    assert!(!root.join(names::legacy_manifest(4)).exists());
}

/// Retention read every kept manifest back on every epoch (three manifest decodes and
/// checksums per epoch at the default retention, most of the coordinator's CPU per epoch
/// with thousands of subtasks). A handle now remembers what the manifests it published
/// reference: with every manifest read failing, its retention still keeps each kept
/// epoch's chain and deletes the rest.
#[test]
fn retention_does_not_read_back_the_manifests_its_handle_published() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemStore::new())));
    let ns = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    faulty.inject(Op::Get, "manifests/", u32::MAX, Fault::Unavailable);
    for e in 1..=6u64 {
        // Epoch 3 a full snapshot, 4.. deltas on it.
        let chain: Vec<u64> = if e < 3 { vec![e] } else { (3..=e).collect() };
        ns.write_segment(&names::segment_file(e, "op", 0, 1), b"x")
            .unwrap();
        ns.publish_manifest(&manifest(e, 1, &chain)).unwrap();
        ns.retain(2).unwrap();
    }
    assert_eq!(segment_dirs(&ns), BTreeSet::from([3, 4, 5, 6]));
    assert_eq!(ns.manifest_epochs().unwrap(), [EpochId(5), EpochId(6)]);
    // A handle that published none of them reads them, and fails while it cannot.
    let other = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    assert!(other.retain(2).is_err());
}

/// A metrics scrape or status poll read every epoch log record (up to three per epoch of
/// the retained history) on every call. A handle now reads each record once: with every
/// read of the old records failing, a polled handle still lists the log, reads the new
/// record, and forgets what retention deleted; a fresh handle fails.
#[test]
fn a_polled_handle_reads_only_the_log_records_it_has_not_read() {
    let faulty = Arc::new(Faulty::new(Arc::new(MemStore::new())));
    let ns = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    for e in 1..=9u64 {
        log(&ns, e, EpochState::Created, 1);
        log(&ns, e, EpochState::Durable, 1);
        log(&ns, e, EpochState::Committed, 1);
    }
    let first = ns.read_log().unwrap();
    assert_eq!(first.len(), 27);
    // The records of epochs 1..=9: "log/" then 19 zeros and the digit.
    faulty.inject(
        Op::Get,
        &format!("{}{}", names::LOG, "0".repeat(19)),
        u32::MAX,
        Fault::Unavailable,
    );
    log(&ns, 10, EpochState::Created, 1);
    let second = ns.read_log().unwrap();
    assert_eq!(second.len(), 28);
    assert_eq!(&second[..27], &first[..]);
    assert_eq!(second[27].epoch, EpochId(10));
    assert_eq!(faulty.injected(), 0, "no old record was read again");
    // A record deleted (as retention does) is gone from the next read.
    let gone = names::log_record(1, 0, "created", 1);
    ns.store().delete(&gone).unwrap();
    let third = ns.read_log().unwrap();
    assert_eq!(third.len(), 27);
    assert!(
        !third
            .iter()
            .any(|r| r.epoch == EpochId(1) && r.state == EpochState::Created)
    );
    // A handle that has read nothing reads them all, and fails while it cannot.
    let other = Namespace::new(Scoped::new(Arc::clone(&faulty) as Arc<dyn ObjectStore>, ""));
    assert!(other.read_log().is_err());
}

/// `inner`, where the objects named in `vanish` are deleted just before their next read:
/// another process's retention deleting what this one has just listed.
#[derive(Debug)]
struct RetainedMeanwhile {
    inner: Arc<dyn ObjectStore>,
    vanish: std::sync::Mutex<Vec<String>>,
}

impl ObjectStore for RetainedMeanwhile {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn get(&self, name: &str) -> nop_stream_storage::Result<Vec<u8>> {
        let mut v = self.vanish.lock().unwrap();
        if let Some(i) = v.iter().position(|n| n == name) {
            v.remove(i);
            self.inner.delete(name)?;
        }
        drop(v);
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> nop_stream_storage::Result<Vec<u8>> {
        self.inner.get_range(name, offset, len)
    }
    fn put(&self, name: &str, bytes: &[u8]) -> nop_stream_storage::Result<()> {
        self.inner.put(name, bytes)
    }
    fn put_if_absent(&self, name: &str, bytes: &[u8]) -> nop_stream_storage::Result<Created> {
        self.inner.put_if_absent(name, bytes)
    }
    fn list(&self, prefix: &str) -> nop_stream_storage::Result<Vec<ObjectMeta>> {
        self.inner.list(prefix)
    }
    fn delete(&self, name: &str) -> nop_stream_storage::Result<()> {
        self.inner.delete(name)
    }
}

/// A CI run failed to resume a job after a leader change: the new leader listed the epoch
/// records, the deposed leader's last retention deleted the oldest, and the read of that
/// record failed the resume with "not found". A record or log record listed and then
/// retained away is skipped; the newest durable epoch is still found.
#[test]
fn records_retained_away_between_listing_and_reading_are_skipped() {
    let store = Arc::new(RetainedMeanwhile {
        inner: Arc::new(MemStore::new()),
        vanish: std::sync::Mutex::new(Vec::new()),
    });
    let ns = Namespace::new(Scoped::new(Arc::clone(&store) as Arc<dyn ObjectStore>, ""));
    for e in 1..=4u64 {
        epoch(&ns, e, 1, &[e]);
        log(&ns, e, EpochState::Durable, 1);
    }
    store.vanish.lock().unwrap().extend([
        names::epoch_record(1),
        names::log_record(1, 4, "durable", 1),
    ]);
    let other = Namespace::new(Scoped::new(Arc::clone(&store) as Arc<dyn ObjectStore>, ""));
    assert_eq!(
        other.manifest_epochs().unwrap(),
        [EpochId(2), EpochId(3), EpochId(4)]
    );
    assert_eq!(other.latest_manifest().unwrap().unwrap().epoch, EpochId(4));
    let epochs: Vec<u64> = other
        .read_log()
        .unwrap()
        .iter()
        .map(|r| r.epoch.0)
        .collect();
    assert!(
        store.vanish.lock().unwrap().is_empty(),
        "both were read and were gone"
    );
    assert_eq!(epochs, [2, 3, 4]);
}
