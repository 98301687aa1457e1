//! Every sandbox limit of a plugin instance fires with an error naming the plugin, the
//! operator, the subtask and the limit with its value (design §16); the failed job
//! publishes nothing; and the host survives: a healthy job run right after, in the same
//! process on the same [`PluginHost`](nop_stream_plugin_host::PluginHost), commits exactly the
//! right output.

mod common;

use common::{
    JobDir, Op, assert_host_survives, assert_nothing_committed, records, run_expecting_failure,
};
use nop_stream_plugin_host::{Limits, RuntimeError, Site};
use std::time::Duration;

/// Asserts the site names plugin and operator and a subtask below `parallelism`, and that
/// the rendered message says so too. Returns the subtask.
fn assert_site(site: &Site, plugin: &str, operator: &str, parallelism: u32, msg: &str) -> u32 {
    assert_eq!(site.plugin, plugin, "{msg}");
    assert_eq!(site.operator, operator, "{msg}");
    let sub = site
        .subtask
        .expect("a running task's error names its subtask");
    assert!(
        sub < parallelism,
        "subtask {sub} of parallelism {parallelism}"
    );
    let head = format!("plugin `{plugin}` (operator `{operator}`, subtask {sub})");
    assert!(
        msg.starts_with(&head),
        "message {msg:?} should start with {head:?}"
    );
    sub
}

fn trap_job(parallelism: u32) -> JobDir {
    JobDir::pipeline(
        "trap",
        parallelism,
        &records(10),
        &[Op::new("boom", "fault-trap@0.1.0", "{ after = 0 }")],
    )
}

#[test]
fn panic_is_a_trap_naming_plugin_operator_subtask_and_the_panic_message() {
    let job = trap_job(1);
    let (err, _) = run_expecting_failure(&job, Limits::default());
    let msg = err.to_string();
    let RuntimeError::Trap {
        site, call, reason, ..
    } = &err
    else {
        panic!("expected a trap, got {err:?}");
    };
    assert_eq!(assert_site(site, "fault-trap@0.1.0", "boom", 1, &msg), 0);
    assert_eq!(*call, "process");
    assert!(
        reason.contains("fault-trap: deliberate panic after 0 records"),
        "the guest's panic message (captured stderr) explains the trap: {reason}"
    );
    assert!(msg.contains("trapped in `process`"), "{msg}");
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn panic_at_parallelism_2_fails_the_job_with_the_root_cause_not_a_cancellation() {
    let job = trap_job(2);
    let (err, _) = run_expecting_failure(&job, Limits::default());
    let msg = err.to_string();
    let RuntimeError::Trap { site, reason, .. } = &err else {
        panic!("expected the trap as root cause, got {err:?}");
    };
    assert_site(site, "fault-trap@0.1.0", "boom", 2, &msg);
    assert!(reason.contains("deliberate panic"), "{reason}");
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn trap_behind_a_hash_edge_mid_stream_stops_every_task() {
    // Regression guard for hangs: upstream tasks blocked on full channels must notice the
    // failure of a downstream task (2 readers -> keyer -> HASH -> trap after 300 records).
    let job = JobDir::pipeline(
        "trap-behind-hash",
        2,
        &records(5000),
        &[
            Op::new("keyer", "keyer@0.1.0", "{}"),
            Op::new("boom", "fault-trap@0.1.0", "{ after = 300 }").partition("hash"),
        ],
    );
    let (err, _) = run_expecting_failure(&job, Limits::default());
    let msg = err.to_string();
    let RuntimeError::Trap { site, reason, .. } = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert_site(site, "fault-trap@0.1.0", "boom", 2, &msg);
    assert!(
        reason.contains("deliberate panic after 300 records"),
        "{reason}"
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn infinite_loop_is_stopped_by_cpu_ms_per_call() {
    let job = JobDir::pipeline(
        "loop",
        1,
        &records(10),
        &[Op::new("spin", "fault-loop@0.1.0", "{ after = 2 }")],
    );
    let limits = Limits {
        cpu_ms_per_call: 300,
        ..Limits::default()
    };
    let (err, took) = run_expecting_failure(&job, limits);
    let msg = err.to_string();
    let RuntimeError::Trap {
        site, call, reason, ..
    } = &err
    else {
        panic!("expected a trap, got {err:?}");
    };
    assert_site(site, "fault-loop@0.1.0", "spin", 1, &msg);
    assert_eq!(*call, "process");
    assert_eq!(
        reason, "exceeded limit `cpu_ms_per_call` (300 ms per call)",
        "{msg}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(10),
        "the loop ran {took:?} against a 300 ms budget"
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn infinite_loop_at_parallelism_2_is_stopped_in_every_subtask() {
    let job = JobDir::pipeline(
        "loop-p2",
        2,
        &records(10),
        &[Op::new("spin", "fault-loop@0.1.0", "{ after = 0 }")],
    );
    let limits = Limits {
        cpu_ms_per_call: 200,
        ..Limits::default()
    };
    let (err, took) = run_expecting_failure(&job, limits);
    let msg = err.to_string();
    let RuntimeError::Trap { site, reason, .. } = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert_site(site, "fault-loop@0.1.0", "spin", 2, &msg);
    assert!(
        reason.contains("`cpu_ms_per_call` (200 ms per call)"),
        "{reason}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn memory_hog_is_stopped_by_memory_bytes() {
    let job = JobDir::pipeline(
        "memory",
        1,
        &records(10),
        &[Op::new(
            "hog",
            "fault-memory@0.1.0",
            "{ chunk_bytes = 1048576 }",
        )],
    );
    let limits = Limits {
        memory_bytes: 32 << 20,
        ..Limits::default()
    };
    let (err, _) = run_expecting_failure(&job, limits);
    let msg = err.to_string();
    let RuntimeError::Trap {
        site, call, reason, ..
    } = &err
    else {
        panic!("expected a trap, got {err:?}");
    };
    assert_site(site, "fault-memory@0.1.0", "hog", 1, &msg);
    assert_eq!(*call, "process");
    assert!(
        reason.starts_with("exceeded limit `memory_bytes` (33554432 bytes per instance)"),
        "{msg}"
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

fn oversized(config: &str) -> JobDir {
    JobDir::pipeline(
        "oversized",
        1,
        &records(3),
        &[Op::new("flood", "fault-oversized@0.1.0", config)],
    )
}

/// Asserts `err` is `LimitExceeded` of `limit` in `process` with the given value and max.
fn assert_limit(err: &RuntimeError, limit: &str, value: u64, max: u64) {
    let msg = err.to_string();
    let RuntimeError::LimitExceeded {
        site,
        call,
        limit: l,
        value: v,
        max: m,
    } = err
    else {
        panic!("expected LimitExceeded, got {err:?}");
    };
    assert_site(site, "fault-oversized@0.1.0", "flood", 1, &msg);
    assert_eq!((*call, *l, *v, *m), ("process", limit, value, max), "{msg}");
    assert!(
        msg.ends_with(&format!(
            "exceeded limit `{limit}` in `process`: {value} > {max}"
        )),
        "{msg}"
    );
}

#[test]
fn too_many_output_records_exceed_max_output_records() {
    // 100 records of 10 bytes: only the record count is over its limit.
    let job = oversized("{ records = 100, bytes_per_record = 10 }");
    let limits = Limits {
        max_output_records: 50,
        ..Limits::default()
    };
    let (err, _) = run_expecting_failure(&job, limits);
    assert_limit(&err, "max_output_records", 100, 50);
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn too_many_output_bytes_exceed_max_output_bytes() {
    // 10 records of 1,000 bytes = 10,000 bytes: only the byte total is over its limit.
    let job = oversized("{ records = 10, bytes_per_record = 1000 }");
    let limits = Limits {
        max_output_bytes: 4096,
        ..Limits::default()
    };
    let (err, _) = run_expecting_failure(&job, limits);
    assert_limit(&err, "max_output_bytes", 10_000, 4096);
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn one_huge_record_exceeds_max_record_bytes() {
    let job = oversized("{ records = 1, bytes_per_record = 2048 }");
    let limits = Limits {
        max_record_bytes: 1024,
        ..Limits::default()
    };
    let (err, _) = run_expecting_failure(&job, limits);
    assert_limit(&err, "max_record_bytes", 2048, 1024);
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn default_oversized_output_hits_memory_bytes_before_any_output_limit() {
    // The default config builds ~1 GiB in guest memory: with 64 MiB per instance the guest
    // traps while building it, so the host never receives (or copies) the batch.
    let job = oversized("{}");
    let limits = Limits {
        memory_bytes: 64 << 20,
        ..Limits::default()
    };
    let (err, _) = run_expecting_failure(&job, limits);
    let msg = err.to_string();
    let RuntimeError::Trap { site, reason, .. } = &err else {
        panic!("expected the memory trap, got {err:?}");
    };
    assert_site(site, "fault-oversized@0.1.0", "flood", 1, &msg);
    assert!(
        reason.starts_with("exceeded limit `memory_bytes` (67108864 bytes per instance)"),
        "{msg}"
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn guest_error_is_reported_with_its_code_and_message() {
    let mut lines = records(6);
    lines[4] = r#"{"k":"bad","v":4}"#.into();
    let job = JobDir::pipeline(
        "guest-error",
        1,
        &lines,
        &[Op::new("check", "fault-error@0.1.0", "{}")],
    );
    let (err, _) = run_expecting_failure(&job, Limits::default());
    let msg = err.to_string();
    let RuntimeError::Guest {
        site,
        call,
        code,
        message,
        record,
        ..
    } = &err
    else {
        panic!("expected a guest error, got {err:?}");
    };
    assert_site(site, "fault-error@0.1.0", "check", 1, &msg);
    assert_eq!(*call, "process");
    assert_eq!(*code, "invalid-record", "{msg}");
    // batch_records = 4: the bad line is record 0 of the second batch.
    assert_eq!(&**message, r#"record 0 contains `bad`: {"k":"bad","v":4}"#);
    // on_error = "fail" (the default) names the record that failed.
    assert_eq!(
        record.as_ref().map(|r| r.printable.as_str()),
        Some(r#"{"k":"bad","v":4}"#)
    );
    assert!(
        msg.contains("failed in `process` (invalid-record)"),
        "{msg}"
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn state_of_a_key_outside_the_subtask_shards_is_refused() {
    // keyer (2 subtasks) -> HASH -> foreign (2 subtasks, 16 shards): `foreign` writes the
    // state of `k + "x"`, which for some of the keys a..e belongs to the other subtask.
    let job = JobDir::pipeline(
        "foreign-key",
        2,
        &records(40),
        &[
            Op::new("keyer", "keyer@0.1.0", "{}"),
            Op::new(
                "foreign",
                "fault-foreign-key@0.1.0",
                r#"{ role = "foreign" }"#,
            )
            .partition("hash"),
        ],
    );
    let (err, _) = run_expecting_failure(&job, Limits::default());
    let msg = err.to_string();
    let RuntimeError::Trap {
        site,
        call,
        reason,
        refused,
    } = &err
    else {
        panic!("expected a trap, got {err:?}");
    };
    assert_site(site, "fault-foreign-key@0.1.0", "foreign", 2, &msg);
    assert_eq!(*call, "process");
    assert!(reason.starts_with("state access refused: key "), "{msg}");
    assert!(reason.contains("outside the shards"), "{msg}");
    // The same input makes the same call again: final, not retried from a checkpoint.
    assert!(*refused, "{msg}");
    assert_eq!(
        nop_stream_proto::TaskError::class(&err),
        nop_stream_proto::FailureClass::Fatal
    );
    assert_nothing_committed(&job);
    assert_host_survives();
}

#[test]
fn healthy_pass_through_job_commits_every_record_at_parallelism_2() {
    let lines = records(57);
    let job = JobDir::pipeline(
        "healthy-p2",
        2,
        &lines,
        &[Op::new("pass", "fault-trap@0.1.0", "{ after = 1000 }")],
    );
    let report = common::run(&job, Limits::default()).expect("healthy job");
    assert_eq!(report.records_read, 57);
    assert_eq!(
        report.committed.len(),
        2,
        "one transaction per sink subtask"
    );
    let mut expected = lines.clone();
    expected.sort();
    assert_eq!(job.committed_lines(), expected);
}
