//! The object-level conformance suite every backend passes (run by this crate's tests on
//! the local, in-memory and fault-wrapped backends, and on a real S3-compatible server by
//! the `s3` suite that `.ci/run` starts one for). It panics on the first violation, naming
//! the backend and the check. Objects are written under `prefix`, which should be unique
//! per run on a shared server.
//!
//! The checkpoint protocol's own suite (retention, lost acknowledgements, unknown write
//! outcomes) lives in `nop-stream-checkpoint`'s tests and runs over these backends too.

use crate::{Created, ErrorKind, ObjectStore};

/// Runs every check.
pub fn run(store: &dyn ObjectStore, prefix: &str) {
    read_after_write(store, prefix);
    list_after_write(store, prefix);
    conditional_create(store, prefix);
    atomic_writer(store, prefix);
    ranges_and_errors(store, prefix);
    delete_is_idempotent(store, prefix);
}

fn at(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

/// A put is visible to the next get; a second put replaces it whole.
pub fn read_after_write(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let n = at(prefix, "raw/a.bin");
    store.put(&n, b"first").unwrap();
    assert_eq!(store.get(&n).unwrap(), b"first", "{d}: read after write");
    store.put(&n, b"second, longer").unwrap();
    assert_eq!(
        store.get(&n).unwrap(),
        b"second, longer",
        "{d}: read after overwrite"
    );
    let empty = at(prefix, "raw/empty");
    store.put(&empty, b"").unwrap();
    assert_eq!(store.get(&empty).unwrap(), b"", "{d}: an empty object");
}

/// A list sees every object written before it, sorted, and only those under the prefix.
pub fn list_after_write(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let names = [
        "list/a/1",
        "list/a/2",
        "list/a10/x",
        "list/b",
        "list/a/sub/3",
    ];
    for n in names {
        store.put(&at(prefix, n), n.as_bytes()).unwrap();
    }
    let got: Vec<String> = store
        .list(&at(prefix, "list/a/"))
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(
        got,
        ["list/a/1", "list/a/2", "list/a/sub/3"].map(|n| at(prefix, n)),
        "{d}: list after write, by prefix, sorted"
    );
    let got: Vec<String> = store
        .list(&at(prefix, "list/a"))
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(
        got.len(),
        4,
        "{d}: a prefix that is not a directory: {got:?}"
    );
    let sizes: Vec<u64> = store
        .list(&at(prefix, "list/b"))
        .unwrap()
        .into_iter()
        .map(|m| m.size)
        .collect();
    assert_eq!(sizes, [6], "{d}: sizes");
    assert!(
        store.list(&at(prefix, "list/none/")).unwrap().is_empty(),
        "{d}: an empty prefix lists nothing"
    );
}

/// put-if-absent creates once and then returns the bytes already there; a retry with
/// identical bytes finds them ([`Created::holds`]).
pub fn conditional_create(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let n = at(prefix, "cas/epoch-7");
    assert_eq!(
        store.put_if_absent(&n, b"mine").unwrap(),
        Created::Created,
        "{d}: create"
    );
    let again = store.put_if_absent(&n, b"mine").unwrap();
    assert_eq!(
        again,
        Created::Exists(b"mine".to_vec()),
        "{d}: a retry finds its own bytes"
    );
    assert!(again.holds(b"mine"));
    let other = store.put_if_absent(&n, b"theirs").unwrap();
    assert_eq!(
        other,
        Created::Exists(b"mine".to_vec()),
        "{d}: the loser gets the winner's bytes"
    );
    assert!(!other.holds(b"theirs"));
    assert_eq!(
        store.get(&n).unwrap(),
        b"mine",
        "{d}: the first create stands"
    );
}

/// A writer's object appears whole at its finish, not before; dropped unfinished it never
/// appears.
pub fn atomic_writer(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let n = at(prefix, "writer/seg");
    let mut w = store.writer(&n).unwrap();
    w.write(b"hello ").unwrap();
    w.write(b"world").unwrap();
    assert!(
        store.get(&n).unwrap_err().is_not_found(),
        "{d}: not visible before the finish"
    );
    w.finish().unwrap();
    assert_eq!(
        store.get(&n).unwrap(),
        b"hello world",
        "{d}: whole at the finish"
    );
    let dropped = at(prefix, "writer/dropped");
    let mut w = store.writer(&dropped).unwrap();
    w.write(b"partial").unwrap();
    drop(w);
    assert!(
        store.get(&dropped).unwrap_err().is_not_found(),
        "{d}: dropped writer"
    );
    assert!(
        store
            .list(&at(prefix, "writer/"))
            .unwrap()
            .iter()
            .all(|m| m.name == n),
        "{d}: nothing else listed"
    );
}

/// Ranges read exactly; a range past the end, a missing object and a bad name are told
/// apart.
pub fn ranges_and_errors(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let n = at(prefix, "range/x");
    store.put(&n, b"0123456789").unwrap();
    assert_eq!(store.get_range(&n, 3, 4).unwrap(), b"3456", "{d}: a range");
    assert_eq!(
        store.get_range(&n, 10, 0).unwrap(),
        b"",
        "{d}: an empty range at the end"
    );
    assert_eq!(
        store.get_range(&n, 8, 5).unwrap_err().kind,
        ErrorKind::ShortRead,
        "{d}: past the end"
    );
    let missing = store.get(&at(prefix, "range/missing")).unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound, "{d}: {missing}");
    assert!(
        missing.to_string().contains("range/missing"),
        "{d}: {missing}"
    );
    for bad in ["", "a//b", "../x", "a/./b"] {
        assert_eq!(
            store.put(bad, b"x").unwrap_err().kind,
            ErrorKind::Invalid,
            "{d}: bad name {bad:?}"
        );
    }
}

/// Deleting removes the object from gets and lists; deleting twice succeeds.
pub fn delete_is_idempotent(store: &dyn ObjectStore, prefix: &str) {
    let d = store.describe();
    let n = at(prefix, "del/x");
    store.put(&n, b"x").unwrap();
    store.delete(&n).unwrap();
    store.delete(&n).unwrap();
    assert!(store.get(&n).unwrap_err().is_not_found(), "{d}: deleted");
    assert!(
        store.list(&at(prefix, "del/")).unwrap().is_empty(),
        "{d}: not listed"
    );
}
