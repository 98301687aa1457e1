//! The object-level conformance suite and the failures a user meets, on a real
//! S3-compatible server: `scripts/s3-test-server.sh` (moto) started by `.ci/run`, which
//! exports `NOP_TEST_S3_URL` and the credentials. Ignored by a plain `cargo test`; without
//! the server these tests fail rather than pass vacuously.
//!
//! moto checks `If-None-Match` without a lock, so the race of two conditional creates is
//! tested on the local and in-memory backends (`backends.rs`), not here.

use nop_stream_storage::{ErrorKind, Location, ObjectStore, conformance};

fn url() -> String {
    std::env::var("NOP_TEST_S3_URL").expect(
        "NOP_TEST_S3_URL is not set: start the test server with \
         `eval \"$(scripts/s3-test-server.sh start)\"`",
    )
}

/// A prefix of its own for each test run.
fn unique(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("storage-tests/{tag}-{}-{n}", std::process::id())
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn an_s3_bucket_conforms() {
    let loc = Location::parse(&url())
        .unwrap()
        .join(&unique("conformance"));
    let store = loc.open().unwrap();
    conformance::run(&store, "");
    // Large objects go up in parts and come back whole.
    let big: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut w = store.writer("big/segment").unwrap();
    for chunk in big.chunks(3 << 20) {
        w.write(chunk).unwrap();
    }
    w.finish().unwrap();
    assert_eq!(store.get("big/segment").unwrap(), big);
    assert_eq!(
        store.get_range("big/segment", 9 << 20, 10).unwrap(),
        &big[9 << 20..(9 << 20) + 10]
    );
    // Listing pages through more than one page of 1,000 keys.
    for i in 0..1100 {
        store.put(&format!("many/{i:05}"), b"x").unwrap();
    }
    assert_eq!(store.list("many/").unwrap().len(), 1100);
}

#[test]
#[ignore = "needs the S3 test server (scripts/s3-test-server.sh)"]
fn a_missing_bucket_and_an_unreachable_endpoint_are_named() {
    let Location::S3 { endpoint, .. } = Location::parse(&url()).unwrap() else {
        panic!("NOP_TEST_S3_URL is not an s3:// URL");
    };
    let endpoint = endpoint.expect("the test server's endpoint");
    let missing =
        Location::parse(&format!("s3://no-such-bucket-here/p?endpoint={endpoint}")).unwrap();
    let e = missing.open().unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSuchBucket, "{e}");
    assert!(e.to_string().contains("s3://no-such-bucket-here"), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gone = Location::parse(&format!("s3://nop/p?endpoint=http://127.0.0.1:{port}")).unwrap();
    let t = std::time::Instant::now();
    let e = gone.open().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unreachable, "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(60),
        "bounded: {:?}",
        t.elapsed()
    );
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    for e in [
        missing.open().unwrap_err().to_string(),
        gone.open().unwrap_err().to_string(),
    ] {
        assert!(!e.contains(&secret), "no credential in {e}");
    }
    let _ = ObjectStore::describe(&Location::parse(&url()).unwrap().open().unwrap());
}
