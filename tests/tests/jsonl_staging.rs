//! The JSONL sink's staging under the real component and WASI (design §7.5): subtasks of
//! one sink never disturb each other's staged files, and recovery's listing of pending
//! transactions holds while siblings write, seal and abort.

mod common;

use common::{host, wasm};
use nop_stream_api::{Batch, PluginKind, TaskInfo};
use nop_stream_runtime::{DirGrant, Instance, InstanceOptions, Limits, Site};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// An opened instance of `jsonl-sink` for subtask `subtask` of 2, writing into `out`.
fn sink(out: &Path, subtask: u32) -> nop_stream_runtime::plugin::SinkInstance {
    let p = host()
        .load(
            "jsonl-sink@0.1.0",
            Path::new(&wasm("jsonl-sink")),
            PluginKind::Sink,
        )
        .expect("jsonl-sink loads");
    let opts = InstanceOptions {
        site: Site {
            plugin: "jsonl-sink@0.1.0".into(),
            operator: "out".into(),
            subtask: Some(subtask),
        },
        limits: Limits::default(),
        grants: vec![DirGrant {
            host: out.to_owned(),
            guest: "/output".into(),
            writable: true,
        }],
        state: None,
        pg: None,
        redis: None,
        nats: None,
    };
    let Instance::Sink(mut s) = p.instantiate(&opts).expect("instantiate") else {
        panic!("not a sink instance");
    };
    let task = TaskInfo {
        job_id: "j".into(),
        pipeline_id: "main".into(),
        operator_id: "sinks/out".into(),
        operator_name: "out".into(),
        subtask_index: subtask,
        parallelism: 2,
        attempt: 1,
    };
    s.open(&task, r#"{"dir":"/output"}"#).expect("open");
    s
}

fn one_record() -> Batch {
    Batch {
        data: br#"{"v":1}"#.to_vec(),
        ends: vec![7],
        ..Batch::default()
    }
}

/// Pins a spurious extra recovery: right after a recovery deployed, one subtask's
/// `pending-transactions` failed with "cannot list /output/.staging: No such file or
/// directory (os error 44)" while its siblings aborted their transactions of a
/// non-durable epoch in the same directory (under WASI a listed entry that vanishes
/// before the host reads its type fails the listing). Here subtask 1 begins, seals and
/// aborts transactions in a loop while subtask 0 lists its own pending transactions: every
/// listing succeeds and names exactly subtask 0's.
#[test]
fn a_siblings_aborts_never_fail_a_subtasks_listing() {
    let out = tempfile::tempdir().unwrap();
    let mut mine = sink(out.path(), 0);
    let mut sibling = sink(out.path(), 1);
    // Subtask 0 has one sealed transaction of its own, pending.
    let own = "j:main:sinks/out:0:1";
    mine.begin(own).unwrap();
    mine.write(own, one_record()).unwrap();
    mine.pre_commit(own).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut epoch = 2u64;
            while !stop.load(Ordering::Relaxed) {
                // Several transactions at once, so a listing meets many entries that vanish.
                let txns: Vec<String> = (0..8)
                    .map(|k| format!("j:main:sinks/out:1:{}", epoch + k))
                    .collect();
                for t in &txns {
                    sibling.begin(t).unwrap();
                    sibling.write(t, one_record()).unwrap();
                    sibling.pre_commit(t).unwrap();
                }
                for t in &txns {
                    sibling.abort(t).unwrap();
                }
                epoch += 8;
            }
            epoch
        })
    };
    let mut failures = Vec::new();
    for _ in 0..3000 {
        match mine.pending_transactions() {
            Ok(p) => assert_eq!(p, [own], "only subtask 0's own transaction"),
            Err(e) => failures.push(e.to_string()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let epochs = churn.join().unwrap();
    assert!(epochs > 10, "the sibling churned ({epochs})");
    assert!(
        failures.is_empty(),
        "{} of 3000 listings failed, e.g. {}",
        failures.len(),
        failures[0]
    );
}

/// A staging directory that does not exist (nothing was ever staged, or it was removed)
/// means nothing is pending, for a fresh instance as for one that staged before.
#[test]
fn a_missing_staging_directory_means_nothing_pending() {
    let out = tempfile::tempdir().unwrap();
    let mut s = sink(out.path(), 0);
    assert_eq!(s.pending_transactions().unwrap(), Vec::<String>::new());
    let t = "j:main:sinks/out:0:1";
    s.begin(t).unwrap();
    s.write(t, one_record()).unwrap();
    s.pre_commit(t).unwrap();
    assert_eq!(s.pending_transactions().unwrap(), [t]);
    std::fs::remove_dir_all(out.path().join(".staging")).unwrap();
    assert_eq!(s.pending_transactions().unwrap(), Vec::<String>::new());
    let mut fresh = sink(out.path(), 0);
    assert_eq!(fresh.pending_transactions().unwrap(), Vec::<String>::new());
}
