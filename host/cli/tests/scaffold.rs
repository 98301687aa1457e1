//! The plugin author's path, as a new user walks it, from temporary directories outside
//! the workspace: `nopstream plugin new`, `cargo test` (the MockContext tests),
//! `cargo build --target wasm32-wasip2 --release`, and `nopstream run` of the job stub,
//! whose output is checked against a direct computation over the flights CSV. Once
//! against the checkout's SDK by path, once against a copy of the SDK crate alone, and
//! once through a `git` dependency on a local clone.
//!
//! The generated crates resolve their dependencies like any new crate (crates.io), and
//! share one cargo target directory under the workspace's, so reruns are fast.

#![cfg(feature = "bundled-plugins")] // the job stubs use the bundled plugins

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Target directory shared by every scaffolded crate of these tests.
fn shared_target() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target")
}

fn plugin_dir() -> PathBuf {
    shared_target().join("wasm32-wasip2/release")
}

fn show(what: &str, o: &Output) -> String {
    format!(
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn nopstream(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .current_dir(dir)
        .env(
            "NOPSTREAM_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("nopstream-cli-cache"),
        )
        .args(args)
        .output()
        .expect("run nopstream");
    assert!(
        o.status.success(),
        "{}",
        show(&format!("nopstream {args:?}"), &o)
    );
    o
}

/// `cargo args...` in `dir` with the shared target directory.
fn cargo(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", shared_target())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args(args)
        .output()
        .expect("run cargo");
    assert!(
        o.status.success(),
        "{}",
        show(&format!("cargo {args:?} in {}", dir.display()), &o)
    );
    o
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every line of the files under `dir` whose name does not start with `.`.
fn lines_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.') {
            out.extend(
                std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    out.sort();
    out
}

/// Per carrier: (flights, flights with dep_delay > 15), read from the zipped CSV directly.
fn flights_by_carrier() -> BTreeMap<String, (u64, u64)> {
    let file = std::fs::File::open(repo().join("examples/flights/data/flights.csv.zip"))
        .expect("flights zip in the repository");
    let mut zip = zip::ZipArchive::new(file).unwrap();
    let mut rdr = csv::Reader::from_reader(zip.by_name("flights.csv").unwrap());
    let headers = rdr.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (carrier, dep_delay) = (col("carrier"), col("dep_delay"));
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for row in rdr.records() {
        let row = row.unwrap();
        let e = out.entry(row[carrier].to_owned()).or_default();
        e.0 += 1;
        if row[dep_delay].parse::<f64>().is_ok_and(|d| d > 15.0) {
            e.1 += 1;
        }
    }
    out
}

#[test]
fn a_scaffolded_operator_builds_passes_its_tests_and_runs_on_the_flights_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("delay-stats");
    let o = nopstream(
        tmp.path(),
        &[
            "plugin",
            "new",
            "delay-stats",
            "--kind",
            "operator",
            "--dir",
            "delay-stats",
        ],
    );
    assert!(stdout(&o).starts_with("created operator plugin `delay-stats` in delay-stats:"));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!(
            "nop-stream-sdk = {{ path = \"{}\" }}",
            repo().join("guest-sdk").display()
        )),
        "{manifest}"
    );
    // The bundled plugins' build flags (WebAssembly SIMD) come with the crate.
    let config = std::fs::read_to_string(dir.join(".cargo/config.toml")).unwrap();
    assert_eq!(
        config,
        std::fs::read_to_string(repo().join(".cargo/config.toml")).unwrap()
    );
    assert!(config.contains("+simd128"), "{config}");

    let o = cargo(&dir, &["test"]);
    assert!(
        stdout(&o).contains("test result: ok. 2 passed"),
        "{}",
        show("cargo test", &o)
    );
    cargo(&dir, &["build", "--target", "wasm32-wasip2", "--release"]);
    assert!(plugin_dir().join("delay_stats.wasm").is_file());

    let plugins = plugin_dir().display().to_string();
    let o = nopstream(
        &dir,
        &[
            "run",
            "--no-progress",
            "--no-echo",
            "job.toml",
            "--plugins",
            &plugins,
        ],
    );
    let summary = stdout(&o);
    assert!(
        summary.contains("job `delay-stats-flights` finished"),
        "{summary}"
    );

    let got: BTreeMap<String, (u64, u64)> =
        lines_under(&dir.join("nopstream-out/delay-stats-flights/output"))
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["key"].as_str().unwrap().to_owned(),
                    (v["records"].as_u64().unwrap(), v["above"].as_u64().unwrap()),
                )
            })
            .collect();
    let want = flights_by_carrier();
    assert_eq!(want.len(), 16);
    assert_eq!(want.values().map(|c| c.0).sum::<u64>(), 336_776);
    assert_eq!(got, want);
}

/// Copies `from` (a directory tree without `target/`) to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            if e.file_name() != "target" {
                copy_tree(&src, &dst);
            }
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

#[test]
fn a_source_and_a_sink_build_against_a_copy_of_the_sdk_crate_alone() {
    // Only guest-sdk/ is copied: no workspace, no repository wit/ next to it.
    let tmp = tempfile::tempdir().unwrap();
    let sdk = tmp.path().join("vendor/nop-stream-sdk");
    copy_tree(&repo().join("guest-sdk"), &sdk);
    let sdk_arg = sdk.display().to_string();
    for (name, kind) in [("numbers", "source"), ("line-files", "sink")] {
        nopstream(
            tmp.path(),
            &[
                "plugin",
                "new",
                name,
                "--kind",
                kind,
                "--sdk-path",
                &sdk_arg,
            ],
        );
        let dir = tmp.path().join(name);
        let o = cargo(&dir, &["test"]);
        assert!(
            stdout(&o).contains("test result: ok. 1 passed"),
            "{}",
            show("cargo test", &o)
        );
        cargo(&dir, &["build", "--target", "wasm32-wasip2", "--release"]);
    }
    let plugins = plugin_dir().display().to_string();

    // The source's stub: numbers -> jsonl-sink.
    let dir = tmp.path().join("numbers");
    nopstream(
        &dir,
        &[
            "run",
            "--no-progress",
            "--no-echo",
            "job.toml",
            "--plugins",
            &plugins,
        ],
    );
    let mut got: Vec<u64> = lines_under(&dir.join("nopstream-out/numbers-numbers/output"))
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..1000).collect::<Vec<u64>>());

    // The sink's stub: flights -> flights-mapper -> line-files, with checkpoints.
    let dir = tmp.path().join("line-files");
    nopstream(
        &dir,
        &[
            "run",
            "--no-progress",
            "--no-echo",
            "job.toml",
            "--plugins",
            &plugins,
        ],
    );
    let out = dir.join("nopstream-out/line-files-flights/output");
    let mut per_carrier: BTreeMap<String, u64> = BTreeMap::new();
    for l in lines_under(&out) {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        *per_carrier
            .entry(v["carrier"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let want: BTreeMap<String, u64> = flights_by_carrier()
        .into_iter()
        .map(|(c, (n, _))| (c, n))
        .collect();
    assert_eq!(per_carrier, want);
    let staged: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".staged")
        })
        .collect();
    assert!(staged.is_empty(), "every transaction was committed");
}

#[test]
fn the_sdk_resolves_as_a_git_dependency_from_a_clone() {
    // No public repository exists; a `file://` URL of a clone is the same git form.
    let tmp = tempfile::tempdir().unwrap();
    let clone = tmp.path().join("nop-stream.git");
    let git = |args: &[&str], dir: &Path| {
        let o = Command::new("git")
            .current_dir(dir)
            .args(args)
            .output()
            .expect("git");
        assert!(o.status.success(), "{}", show(&format!("git {args:?}"), &o));
        o
    };
    // The committed tree of this checkout (HEAD), as a user's clone would have it.
    git(
        &[
            "clone",
            "--quiet",
            "--no-local",
            &repo().display().to_string(),
            &clone.display().to_string(),
        ],
        tmp.path(),
    );
    // The commit this checkout is at (the clone has every branch).
    let rev = String::from_utf8(git(&["rev-parse", "HEAD"], &repo()).stdout).unwrap();
    let url = format!("file://{}", clone.display());
    nopstream(
        tmp.path(),
        &[
            "plugin",
            "new",
            "by-git",
            "--kind",
            "source",
            "--sdk-git",
            &url,
            "--sdk-rev",
            rev.trim(),
        ],
    );
    let dir = tmp.path().join("by-git");
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!(
            "nop-stream-sdk = {{ git = \"{url}\", rev = \"{}\" }}",
            rev.trim()
        )),
        "{manifest}"
    );
    cargo(&dir, &["build", "--target", "wasm32-wasip2", "--release"]);
    assert!(plugin_dir().join("by_git.wasm").is_file());
}
