//! Embedded runs with their checkpoints on an S3-compatible object store (design §14):
//! `nopstream run --checkpoints s3://...` through random SIGKILLs with exact output; a
//! savepoint written to the store, copied to another prefix and restored from there; and
//! the failures a user meets (refused credentials, a missing bucket, an unreachable
//! endpoint, a manifest written by a newer host), each named by its location with no
//! credential printed.
//!
//! Needs the S3 test server `scripts/s3-test-server.sh` (moto), which `.ci/run` starts and
//! whose `NOP_TEST_S3_URL` and credentials it exports; ignored by a plain `cargo test`, and
//! failing (not passing) without the server.

mod common;

use common::flights::check_per_record;
use common::job::{Job, kill_rounds, text};
use nop_stream_checkpoint::{Location, Namespace};
use nop_stream_storage::ObjectStore;
use std::time::Instant;

fn s3_url() -> String {
    std::env::var("NOP_TEST_S3_URL").expect(
        "NOP_TEST_S3_URL is not set: start the test server with \
         `eval \"$(scripts/s3-test-server.sh start)\"`",
    )
}

/// A prefix of the test bucket of its own: `s3://nop/<tag>-<pid>-<ns>?endpoint=...`.
fn unique(tag: &str) -> Location {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Location::parse(&s3_url())
        .unwrap()
        .join(&format!("cli-tests/{tag}-{}-{n}", std::process::id()))
}

/// The per-record flights job with 100 ms epochs.
fn per_record_text() -> String {
    std::fs::read_to_string(common::job::repo().join("examples/flights/flights-per-record.toml"))
        .unwrap()
        .replace(
            "checkpoint_interval_ms = 200",
            "checkpoint_interval_ms = 100",
        )
}

/// The job with its checkpoints at `checkpoints`.
fn job(tag: &str, checkpoints: &Location) -> Job {
    let mut j = Job::new("object-store", tag, &per_record_text());
    j.args = vec!["--checkpoints".into(), checkpoints.to_string()];
    j
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn an_embedded_run_on_the_object_store_survives_random_kills_with_exact_output() {
    let started = Instant::now();
    // One uninterrupted run gives the span kills are spread over.
    let reference = job("reference", &unique("reference"));
    let t = Instant::now();
    let (ok, out) = reference.run(None);
    assert!(ok, "{out}");
    let span = t.elapsed().as_millis() as u64;
    check_per_record(&reference.committed());
    assert!(
        out.contains("s3://nop/"),
        "the run names its checkpoint location: {out}"
    );
    let mut round_roots = Vec::new();
    kill_rounds(
        8,
        span.max(500),
        17,
        |round| {
            let root = unique(&format!("kills-{round}"));
            round_roots.push(root.clone());
            job(&format!("kills-{round}"), &root)
        },
        |j, round| {
            check_per_record(&j.committed());
            // The checkpoints are on the store, none in the work directory.
            assert!(
                !j.work.join("checkpoints").exists(),
                "round {round}: checkpoints went to the work directory"
            );
        },
    );
    for root in &round_roots {
        let store = root.open().unwrap();
        assert!(
            !store.list("").unwrap().is_empty(),
            "{root} holds the round's checkpoints"
        );
    }
    eprintln!(
        "[object store suite] random kills took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn a_savepoint_on_the_object_store_copied_to_another_prefix_restores_there() {
    let root = unique("sp-origin");
    let j = job("sp-origin", &root);
    let (ok, out) = j.run(Some("after-manifest-publish=3"));
    assert!(!ok && out.contains("failpoint"), "{out}");
    // Promote the durable epoch into a savepoint on the store.
    let sp = unique("sp-written");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(["savepoint", "promote"])
        .arg(&j.file)
        .arg("--work-dir")
        .arg(&j.work)
        .args(["--checkpoints", &root.to_string(), "--out", &sp.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // Relocate it: a copy of its prefix, elsewhere in the bucket.
    let copy = unique("sp-copied");
    let n = nop_stream_storage::copy_prefix(&sp.open().unwrap(), "", &copy.open().unwrap(), "")
        .unwrap();
    assert!(n >= 3, "the savepoint's objects were copied ({n})");
    // The original goes; the copy restores into a fresh namespace root, with the exact
    // output (the savepoint's committed part is in the output directory already).
    let original = sp.open().unwrap();
    for o in original.list("").unwrap() {
        original.delete(&o.name).unwrap();
    }
    let target_root = unique("sp-target");
    let mut restored = job("sp-target", &target_root);
    restored.out = j.out.clone();
    let o = restored
        .command(None)
        .args(["--from-savepoint", &copy.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("restoring savepoint"), "{}", text(&o));
    check_per_record(&restored.committed());
    let ns = Namespace::new(target_root.open().unwrap().scope("flights-per-record.main"));
    assert!(
        ns.has_durable().unwrap(),
        "the restore went to the new root"
    );
}

/// Runs the per-record job with its checkpoints at `url` and the environment `env`
/// changed; returns (exit code, output).
fn run_at(url: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let j = Job::new("object-store", "bad", &per_record_text());
    let mut c = j.command(None);
    c.args(["--checkpoints", url]);
    for (k, v) in env {
        c.env(k, v);
    }
    c.env("RUST_LOG", "debug");
    let o = c.output().unwrap();
    (o.status.code(), text(&o))
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn bad_locations_fail_clearly_naming_the_location_and_never_a_credential() {
    let Location::S3 { endpoint, .. } = Location::parse(&s3_url()).unwrap() else {
        panic!("NOP_TEST_S3_URL is not an s3:// URL");
    };
    let endpoint = endpoint.expect("the test server's endpoint");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let good = unique("bad-input").to_string();

    // Refused credentials: the message says so and names the location; neither the wrong
    // secret nor the right one appears, even at debug level.
    let wrong = "wrong-secret-SHOULD-NOT-APPEAR";
    let (code, out) = run_at(&good, &[("AWS_SECRET_ACCESS_KEY", wrong)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("s3://nop/"), "{out}");
    assert!(out.contains("credentials were refused"), "{out}");
    assert!(
        !out.contains(wrong) && !out.contains(&secret),
        "a credential leaked: {out}"
    );

    // A missing bucket.
    let (code, out) = run_at(&format!("s3://no-such-bucket/x?endpoint={endpoint}"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("s3://no-such-bucket") && out.contains("does not exist"),
        "{out}"
    );
    assert!(!out.contains(&secret), "{out}");

    // An endpoint nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, out) = run_at(&format!("s3://nop/x?endpoint=http://127.0.0.1:{port}"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!("127.0.0.1:{port}")) && out.contains("cannot be reached"),
        "{out}"
    );

    // Credentials in the URL are refused without being echoed.
    let (code, out) = run_at(&format!("s3://AKID:{wrong}@nop/x?endpoint={endpoint}"), &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("environment only") && !out.contains(wrong),
        "{out}"
    );

    // A manifest written by a newer host: refused, naming the location.
    let root = unique("newer-host");
    let j = job("newer-host", &root);
    let (ok, out) = j.run(Some("after-manifest-publish=2"));
    assert!(!ok, "{out}");
    let ns = Namespace::new(root.open().unwrap().scope("flights-per-record.main"));
    let mut m = ns.latest_manifest().unwrap().unwrap();
    m.state_format_version += 1;
    m.epoch = nop_stream_api::EpochId(m.epoch.0 + 100);
    m.seal();
    ns.publish_manifest(&m).unwrap();
    let (ok, out) = j.run(None);
    assert!(!ok, "{out}");
    let root_path = root.to_string();
    let root_path = root_path.split('?').next().unwrap();
    assert!(
        out.contains("written by a newer host") && out.contains(root_path),
        "{out}"
    );
}
