//! The committed metrics inventory (`docs/metrics.md`) is the registry's: a family added,
//! removed or changed in `host/metrics/src/inventory.rs` without the document fails here.

use nop_stream_metrics::inventory::{INVENTORY, Kind, markdown};
use std::collections::BTreeSet;

fn doc_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md")
}

#[test]
fn docs_metrics_md_is_the_inventory() {
    let want = markdown();
    if std::env::var_os("NOPSTREAM_BLESS").is_some() {
        std::fs::write(doc_path(), &want).unwrap();
    }
    let have = std::fs::read_to_string(doc_path()).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md differs from the registry's inventory; regenerate it with \
         NOPSTREAM_BLESS=1 cargo test -p nop-stream-metrics --test inventory\n--- committed\n\
         {have}\n--- registry\n{want}"
    );
}

#[test]
fn names_follow_the_conventions() {
    let mut seen = BTreeSet::new();
    for f in INVENTORY {
        assert!(seen.insert(f.sample_name()), "{} twice", f.name);
        assert!(
            f.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{}: lower snake case",
            f.name
        );
        // prometheus-client adds `_total`, and panics in debug builds on a counter
        // already named so; units come from the unit, info's `_info` from the kind.
        for suffix in ["_total", "_seconds", "_bytes", "_ratios", "_info", "_ms"] {
            assert!(!f.name.ends_with(suffix), "{}: suffix {suffix}", f.name);
        }
        for l in f.labels {
            assert!(
                !["epoch", "attempt", "key", "record", "txn"].contains(l),
                "{}: label {l} has high cardinality",
                f.name
            );
        }
        assert!(f.help.len() > 20, "{}: a real help text", f.name);
        if f.kind == Kind::Info {
            assert!(!f.labels.is_empty());
        }
    }
}

#[test]
fn the_registry_exposes_exactly_the_inventory() {
    let text = nop_stream_metrics::encode(Vec::new()).unwrap();
    let exposed: BTreeSet<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            (name.to_owned(), kind.to_owned())
        })
        .collect();
    let inventory: BTreeSet<(String, String)> = INVENTORY
        .iter()
        .map(|f| (f.exposed_name(), f.kind.as_str().to_owned()))
        .collect();
    assert_eq!(exposed, inventory);
    assert_eq!(text.lines().last(), Some("# EOF"));
}
