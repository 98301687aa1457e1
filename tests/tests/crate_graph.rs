//! The host crates' dependency graph is the one `docs/design.md` §11.2 lists, edge for edge,
//! and keeps its rules: the coordinator links neither wasmtime nor quinn, the cluster crate
//! does not link wasmtime (checked on the resolved graph, so a transitive edge counts too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const PREFIX: &str = "nop-stream-";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The edges §11.2 lists: crate (without the prefix) → its host dependencies.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let design = std::fs::read_to_string(repo().join("docs/design.md")).unwrap();
    let section = &design[design.find("### 11.2").expect("design.md has §11.2")..];
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("§11.2 has a ```text block");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (from, to) = l.split_once("->").unwrap_or_else(|| panic!("no `->`: {l}"));
            let to = to
                .split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect();
            (from.trim().to_owned(), to)
        })
        .collect()
}

/// The host's target triple (`rustc -vV`).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("`{rustc} -vV` runs: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or_else(|| panic!("`{rustc} -vV` names no host"))
        .trim()
        .to_owned()
}

fn metadata(no_deps: bool) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(repo());
    if no_deps {
        cmd.arg("--no-deps");
    } else {
        // The graph this host builds. Without the filter, `cargo metadata` resolves every
        // platform and, offline, fails on a machine whose cargo cache holds only what
        // this host's builds downloaded (`android_system_properties` for one).
        cmd.args(["--filter-platform", &host_triple()]);
    }
    let out = cmd.output().expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The host crates' normal (not dev, not build) dependencies on other host crates, as
/// their manifests declare them.
fn declared() -> BTreeMap<String, BTreeSet<String>> {
    let meta = metadata(true);
    let host = |name: &str| {
        name.strip_prefix(PREFIX)
            .filter(|n| !["sdk", "tests", "bench"].contains(n))
            .map(str::to_owned)
    };
    let mut graph = BTreeMap::new();
    for p in meta["packages"].as_array().unwrap() {
        let Some(name) = host(p["name"].as_str().unwrap()) else {
            continue;
        };
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| host(d["name"].as_str().unwrap()))
            .collect();
        graph.insert(name, deps);
    }
    graph
}

#[test]
fn the_crate_graph_is_the_one_design_11_2_lists() {
    let documented = documented();
    let declared = declared();
    let mut problems = Vec::new();
    for name in documented
        .keys()
        .chain(declared.keys())
        .collect::<BTreeSet<_>>()
    {
        match (documented.get(name), declared.get(name)) {
            (Some(d), Some(c)) if d == c => {}
            (Some(d), Some(c)) => problems.push(format!(
                "{name}: §11.2 lists {:?}, Cargo.toml declares {:?} (missing from §11.2: {:?}; not declared: {:?})",
                d,
                c,
                c.difference(d).collect::<Vec<_>>(),
                d.difference(c).collect::<Vec<_>>()
            )),
            (Some(_), None) => problems.push(format!("{name}: in §11.2, not a workspace crate")),
            (None, _) => problems.push(format!("{name}: a host crate §11.2 does not list")),
        }
    }
    assert!(
        problems.is_empty(),
        "docs/design.md §11.2 and the manifests differ:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_coordinator_links_neither_wasmtime_nor_quinn_and_the_cluster_no_wasmtime() {
    let meta = metadata(false);
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: BTreeMap<&str, Vec<&str>> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let normal = n["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| d["pkg"].as_str().unwrap())
                .collect();
            (n["id"].as_str().unwrap(), normal)
        })
        .collect();
    let linked = |krate: &str| -> BTreeSet<&str> {
        let root = names
            .iter()
            .find(|(_, n)| **n == krate)
            .map(|(id, _)| *id)
            .unwrap();
        let mut seen = BTreeSet::new();
        let mut todo = vec![root];
        while let Some(id) = todo.pop() {
            if seen.insert(id) {
                todo.extend(nodes[id].iter().copied());
            }
        }
        seen.into_iter().map(|id| names[id]).collect()
    };
    let coordinator = linked("nop-stream-coordinator");
    for forbidden in ["wasmtime", "quinn"] {
        assert!(
            !coordinator.contains(forbidden),
            "nop-stream-coordinator links {forbidden} (design §11.2)"
        );
    }
    assert!(
        !linked("nop-stream-cluster").contains("wasmtime"),
        "nop-stream-cluster links wasmtime (design §11.2)"
    );
    // The check sees the graph: the task driver does link both.
    let task = linked("nop-stream-task");
    assert!(task.contains("wasmtime"), "{task:?}");
}

#[test]
fn the_readme_crate_map_names_every_host_crate_directory() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let map = &readme[readme.find("## Crate map").expect("README has a crate map")..];
    let map = &map[..map[3..].find("\n## ").map_or(map.len(), |i| i + 3)];
    let meta = metadata(true);
    let mut missing = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        let manifest = Path::new(p["manifest_path"].as_str().unwrap());
        let dir = manifest.parent().unwrap().strip_prefix(repo()).unwrap();
        let dir = dir.to_string_lossy().into_owned();
        // Capability crates are listed by their directory's glob.
        let listed = if dir.starts_with("host/capabilities/") {
            map.contains("`host/capabilities/*`")
        } else if dir.starts_with("host/") {
            map.contains(&format!("`{dir}`"))
        } else {
            continue;
        };
        if !listed {
            missing.push(dir);
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's crate map leaves out {missing:?}"
    );
}
