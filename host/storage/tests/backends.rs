//! The object-level conformance suite on every backend this machine has without a server
//! (a local directory, memory, both under a prefix and behind the fault wrapper), the
//! linearisability of conditional creates under a race (local and memory: the S3 test
//! server cannot arbitrate one, see `s3.rs`), and what each injected fault does.

use nop_stream_storage::faults::{Fault, Faulty, Op};
use nop_stream_storage::local::LocalDir;
use nop_stream_storage::memory::MemStore;
use nop_stream_storage::{Created, ErrorKind, Location, ObjectStore, Scoped, conformance};
use std::sync::Arc;

#[test]
fn a_local_directory_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    conformance::run(&store, "");
    conformance::run(&store, "nested/prefix/");
    // Temporary files are never objects, and nothing is left behind.
    let mut leftovers = Vec::new();
    for e in walk(dir.path()) {
        if e.file_name().unwrap().to_string_lossy().starts_with('.') {
            leftovers.push(e);
        }
    }
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn memory_scoped_and_fault_wrapped_stores_conform() {
    conformance::run(&MemStore::new(), "");
    let inner: Arc<dyn ObjectStore> = Arc::new(MemStore::new());
    let scoped = Scoped::new(Arc::clone(&inner), "jobs/a");
    conformance::run(&scoped, "");
    // The scope sees only its own objects, named relative to it.
    inner.put("jobs/b/x", b"other").unwrap();
    assert!(
        scoped
            .list("")
            .unwrap()
            .iter()
            .all(|m| !m.name.contains("other"))
    );
    assert!(scoped.get("x").unwrap_err().is_not_found());
    conformance::run(&Faulty::new(Arc::new(MemStore::new())), "");
    let dir = tempfile::tempdir().unwrap();
    conformance::run(
        &Faulty::new(Arc::new(LocalDir::open(dir.path()).unwrap())),
        "p/",
    );
}

#[test]
fn locations_open_their_backends() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::parse(&format!("file://{}", dir.path().display())).unwrap();
    let store = loc.join("sub").open().unwrap();
    store.put("x", b"1").unwrap();
    assert_eq!(std::fs::read(dir.path().join("sub/x")).unwrap(), b"1");
    let m = Location::parse("memory://locations-test/p")
        .unwrap()
        .open()
        .unwrap();
    m.put("y", b"2").unwrap();
    assert_eq!(MemStore::named("locations-test").get("p/y").unwrap(), b"2");
}

/// Of N threads creating one object with different bytes, exactly one wins and every
/// other finds the winner's bytes.
fn race(store: Arc<dyn ObjectStore>) {
    for round in 0..20 {
        let name = format!("race/{round}");
        let results: Vec<(usize, Created)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let store = Arc::clone(&store);
                    let name = name.clone();
                    s.spawn(move || {
                        (
                            i,
                            store
                                .put_if_absent(&name, format!("writer {i}").as_bytes())
                                .unwrap(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = results
            .iter()
            .filter(|(_, c)| *c == Created::Created)
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "{}: round {round}: {results:?}",
            store.describe()
        );
        let won = format!("writer {}", winners[0]).into_bytes();
        assert_eq!(store.get(&name).unwrap(), won);
        for (_, c) in &results {
            if let Created::Exists(b) = c {
                assert_eq!(
                    b,
                    &won,
                    "{}: a loser sees the winner's bytes",
                    store.describe()
                );
            }
        }
    }
}

#[test]
fn conditional_creates_are_linearisable_on_local_and_memory_stores() {
    let dir = tempfile::tempdir().unwrap();
    race(Arc::new(LocalDir::open(dir.path()).unwrap()));
    race(Arc::new(MemStore::new()));
}

#[test]
fn injected_faults_do_what_an_object_store_does() {
    let inner: Arc<dyn ObjectStore> = Arc::new(MemStore::new());
    let f = Faulty::new(Arc::clone(&inner));
    // A lost acknowledgement: written, but the caller is told the outcome is unknown; the
    // retry finds its own bytes.
    f.inject(Op::PutIfAbsent, "epoch", 1, Fault::LostAck);
    let e = f.put_if_absent("epoch-1", b"rec").unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutcomeUnknown);
    assert_eq!(inner.get("epoch-1").unwrap(), b"rec");
    assert!(f.put_if_absent("epoch-1", b"rec").unwrap().holds(b"rec"));
    // A 503 and a 409: nothing written.
    f.inject(Op::Put, "seg", 1, Fault::Unavailable);
    f.inject(Op::Put, "seg", 1, Fault::Conflict);
    for _ in 0..2 {
        assert_eq!(f.put("seg", b"x").unwrap_err().kind, ErrorKind::Unavailable);
        assert!(inner.get("seg").unwrap_err().is_not_found());
    }
    f.put("seg", b"x").unwrap();
    // A stall: not there yet; it lands at the release, under its own condition.
    f.inject(Op::PutIfAbsent, "late", 1, Fault::Stall);
    assert_eq!(
        f.put_if_absent("late", b"zombie").unwrap_err().kind,
        ErrorKind::OutcomeUnknown
    );
    assert!(inner.get("late").unwrap_err().is_not_found());
    assert_eq!(f.put_if_absent("late", b"live").unwrap(), Created::Created);
    assert_eq!(
        f.release_stalled().unwrap(),
        [Created::Exists(b"live".to_vec())]
    );
    assert_eq!(
        inner.get("late").unwrap(),
        b"live",
        "the stalled create lost"
    );
    assert_eq!(f.injected(), 4);
    // A failing read.
    f.inject(Op::Get, "seg", 1, Fault::Unavailable);
    assert_eq!(f.get("seg").unwrap_err().kind, ErrorKind::Unavailable);
    assert_eq!(f.get("seg").unwrap(), b"x");
}
