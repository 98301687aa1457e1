//! The guest SDK builds outside the workspace: it carries its own copy of the WIT
//! contract (`guest-sdk/wit/`), which must equal the repository's `wit/` file for file,
//! byte for byte, and name the package version the SDK says it targets.

use std::collections::BTreeMap;
use std::path::Path;

fn wit_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    collect(dir, "", &mut out);
    out
}

/// Every file under `dir`, keyed by its path relative to the root (`deps/postgres/..`).
fn collect(dir: &Path, rel: &str, out: &mut BTreeMap<String, Vec<u8>>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        let name = format!("{rel}{}", p.file_name().unwrap().to_string_lossy());
        if p.is_dir() {
            collect(&p, &format!("{name}/"), out);
        } else {
            out.insert(name, std::fs::read(&p).unwrap());
        }
    }
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_sdk_copy_of_the_wit_equals_the_repository_wit() {
    let wit = wit_files(&repo().join("wit"));
    let copy = wit_files(&repo().join("guest-sdk/wit"));
    assert!(wit.len() >= 7, "{:?}", wit.keys());
    assert_eq!(
        copy.keys().collect::<Vec<_>>(),
        wit.keys().collect::<Vec<_>>(),
        "same files; after editing wit/, run: cp -r wit/. guest-sdk/wit/"
    );
    for (name, bytes) in &wit {
        assert!(
            copy[name] == *bytes,
            "guest-sdk/wit/{name} differs from wit/{name}; run: cp -r wit/. guest-sdk/wit/"
        );
    }
}

#[test]
fn every_wit_file_declares_the_package_the_sdk_targets() {
    // `nop:%stream@0.2.0` in WIT is `nop:stream@0.2.0` (`%` escapes a keyword).
    let (ns, version) = nop_stream_sdk::WIT_PACKAGE
        .split_once('@')
        .expect("WIT_PACKAGE is name@version");
    let declared = format!("package {}@{version};", ns.replace(":stream", ":%stream"));
    // Packages the SDK depends on (`deps/`) declare their own.
    for (name, bytes) in wit_files(&repo().join("guest-sdk/wit")) {
        if name.starts_with("deps/") || !name.ends_with(".wit") {
            continue;
        }
        let text = String::from_utf8(bytes).unwrap();
        assert_eq!(text.lines().next(), Some(declared.as_str()), "{name}");
    }
}
