//! Directories and committed output as the suites compare them: a directory's files with
//! their bytes (to show it untouched), a recursive copy, the blackhole sink's committed
//! summaries merged, and the check of an output split between a finalized JSONL sink and
//! the blackhole sink that replaced it.

use std::path::{Path, PathBuf};

/// Every file under `dir` with its bytes, sorted by path, to show a directory is untouched.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Copies the tree `from` to `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).unwrap();
        }
    }
}

/// The blackhole sink's committed summaries in `out` (`summary-*.json`, one per subtask
/// and epoch) merged: (records, order-independent checksum).
pub fn blackhole_totals(out: &Path) -> (u64, u64) {
    let (mut records, mut checksum) = (0, 0u64);
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("summary-") && name.ends_with(".json") {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            records += v["records"].as_u64().unwrap();
            checksum = checksum.wrapping_add(v["checksum"].as_u64().unwrap());
        }
    }
    (records, checksum)
}

/// A sink swapped by `finalize-sink`: every committed JSONL line (`jsonl`, sorted) is in the
/// sorted `reference` once, and the blackhole sink in `out` got exactly the rest of the
/// reference, by count and order-independent checksum.
pub fn check_split_output(jsonl: &[String], reference: &[String], out: &Path) {
    let mut seen = std::collections::BTreeSet::new();
    for l in jsonl {
        assert!(seen.insert(l.clone()), "twice: {l}");
        assert!(
            reference.binary_search(l).is_ok(),
            "not in the reference: {l}"
        );
    }
    let rest: Vec<&String> = reference.iter().filter(|l| !seen.contains(*l)).collect();
    let expected_sum = rest.iter().fold(0u64, |a, l| {
        a.wrapping_add(u64::from(blackhole_sink::record_hash(l.as_bytes())))
    });
    assert_eq!(
        blackhole_totals(out),
        (rest.len() as u64, expected_sum),
        "the blackhole sink got every record after the savepoint once"
    );
}

/// The (first) checkpoint namespace in `<work>/checkpoints`, opened.
pub fn namespace_in(work: &Path) -> Option<nop_stream_checkpoint::Namespace> {
    let root = nop_stream_checkpoint::Location::Local(work.join("checkpoints"));
    let store = root.open().ok()?;
    let name = nop_stream_checkpoint::namespace::list_namespaces(&store)
        .ok()?
        .into_iter()
        .next()?;
    Some(nop_stream_checkpoint::Namespace::new(store.scope(&name)))
}

/// `bytes` of a component with every `nop:stream/<interface>@<from>` name rewritten to
/// `@<to>` (same length, so the component stays valid): the component as if built against
/// another WIT version. Also returns how many names were rewritten.
pub fn with_wit_version(bytes: &[u8], from: &str, to: &str) -> (Vec<u8>, usize) {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let prefix = b"nop:stream/";
    let mut n = 0;
    let mut i = 0;
    while let Some(p) = out[i..].windows(prefix.len()).position(|w| w == prefix) {
        let start = i + p + prefix.len();
        let name_end = start
            + out[start..]
                .iter()
                .take_while(|b| b.is_ascii_lowercase() || **b == b'-')
                .count();
        let at = format!("@{from}");
        if out[name_end..].starts_with(at.as_bytes()) {
            out[name_end + 1..name_end + 1 + to.len()].copy_from_slice(to.as_bytes());
            n += 1;
        }
        i = name_end;
    }
    (out, n)
}
