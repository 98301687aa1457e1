//! Builds every plugin component (`plugins/*`, `tests/plugins/*`) for `wasm32-wasip2` in
//! release mode with a nested cargo, and generates the path constants `lib.rs` includes.
//!
//! The nested build uses its own target dir, `wasm32` inside the outer build's target dir
//! (`<workspace>/target/wasm32` by default; `$CARGO_TARGET_DIR/wasm32` when that is set), so a
//! binary built in a target dir shared by several clones names plugins built beside it, not
//! in whichever clone built it. Sharing the outer target dir itself would deadlock on
//! cargo's build-directory lock. Variables the outer cargo sets for
//! build scripts (encoded rustflags, profile and feature variables, clippy's wrapper) are
//! removed so they do not leak into the guest build (as wasmtime's test-programs artifacts
//! build script does). `CARGO_MAKEFLAGS` is kept so the nested build shares the outer
//! jobserver and the machine is not oversubscribed.
//!
//! `NOPSTREAM_SKIP_PLUGIN_BUILD=1` skips the nested build (for clippy/doc runs); the
//! constants are generated all the same.

use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
/// First bytes of a component binary: magic, version 0x0d, layer 1.
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .ancestors()
        .nth(2)
        .expect("host/artifacts sits two levels below the workspace root")
        .to_path_buf();
    for watched in [
        "wit",
        "guest-sdk",
        "nexmark",
        "plugins",
        "tests/plugins",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=NOPSTREAM_SKIP_PLUGIN_BUILD");

    let packages = discover_packages(&root);
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let target_dir = outer_target_dir(&root).join("wasm32");
    let plugin_dir = target_dir.join(TARGET).join("release");

    let skip = env::var("NOPSTREAM_SKIP_PLUGIN_BUILD").is_ok_and(|v| v == "1");
    if skip {
        println!("cargo:warning=NOPSTREAM_SKIP_PLUGIN_BUILD=1: plugin components not built");
    } else if !packages.is_empty() {
        ensure_target_installed();
        build_plugins(&root, &target_dir, &packages);
        for (name, _) in &packages {
            check_component(&plugin_dir.join(artifact_file(name)), name);
        }
    }

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("plugins.rs");
    fs::write(&out, generate(&plugin_dir, &packages)).expect("write generated plugins.rs");
}

/// The target dir of the build running this script: `CARGO_TARGET_DIR` when it is an
/// absolute path, else the nearest ancestor of `OUT_DIR` that cargo marked with a
/// `CACHEDIR.TAG`, else `<workspace>/target`.
fn outer_target_dir(root: &Path) -> PathBuf {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR").map(PathBuf::from)
        && dir.is_absolute()
    {
        return dir;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    out.ancestors()
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map_or_else(|| root.join("target"), Path::to_path_buf)
}

/// `(package name, manifest dir)` of every directory under `plugins/` and `tests/plugins/`
/// holding a `Cargo.toml`, sorted by name.
fn discover_packages(root: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for parent in ["plugins", "tests/plugins"] {
        let Ok(entries) = fs::read_dir(root.join(parent)) else {
            continue;
        };
        for entry in entries {
            let dir = entry.expect("read plugin directory entry").path();
            let manifest = dir.join("Cargo.toml");
            if !manifest.is_file() {
                continue;
            }
            let text = fs::read_to_string(&manifest)
                .unwrap_or_else(|e| panic!("read {}: {e}", manifest.display()));
            let name = package_name(&text)
                .unwrap_or_else(|| panic!("{} has no [package] name", manifest.display()));
            found.push((name, dir));
        }
    }
    found.sort();
    if let Some(w) = found.windows(2).find(|w| w[0].0 == w[1].0) {
        panic!(
            "two plugin packages are named `{}`: {} and {}",
            w[0].0,
            w[0].1.display(),
            w[1].1.display()
        );
    }
    found
}

/// The `name` of the `[package]` table of a manifest (a plain line scan: plugin
/// manifests are simple and this keeps the build script dependency-free).
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if !in_package {
            continue;
        }
        if let Some(rest) = line.strip_prefix("name") {
            let value = rest.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_string());
        }
    }
    None
}

/// Cargo names a cdylib after the package with `-` replaced by `_`.
fn artifact_file(package: &str) -> String {
    format!("{}.wasm", package.replace('-', "_"))
}

fn rustc() -> OsString {
    env::var_os("RUSTC").unwrap_or_else(|| "rustc".into())
}

fn ensure_target_installed() {
    let out = Command::new(rustc())
        .args(["--print", "sysroot"])
        .output()
        .expect("run rustc --print sysroot");
    assert!(out.status.success(), "rustc --print sysroot failed");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if sysroot.join("lib/rustlib").join(TARGET).is_dir() {
        return;
    }
    println!(
        "cargo:warning=rust target {TARGET} is not installed; running `rustup target add {TARGET}`"
    );
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .expect("run rustup (install the wasm32-wasip2 target by hand if rustup is absent)");
    assert!(status.success(), "`rustup target add {TARGET}` failed");
}

/// Whether an environment variable set by the outer cargo must not reach the nested one.
fn leaks_from_outer_build(name: &str) -> bool {
    const KEEP: &[&str] = &[
        "CARGO_HOME",
        "CARGO_MAKEFLAGS",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_TERM_",
    ];
    if name.starts_with("CARGO_") {
        return !KEEP.iter().any(|k| name.starts_with(k));
    }
    matches!(
        name,
        "RUSTFLAGS"
            | "RUSTDOCFLAGS"
            | "RUSTC_WORKSPACE_WRAPPER"
            | "CLIPPY_ARGS"
            | "CLIPPY_CONF_DIR"
            | "TARGET"
            | "HOST"
            | "OUT_DIR"
            | "OPT_LEVEL"
            | "PROFILE"
            | "DEBUG"
            | "NUM_JOBS"
            | "RUSTC_LINKER"
    ) || name.starts_with("__CARGO")
}

/// The plugin components carry no DWARF (the workspace's release profile keeps line
/// tables for the host's profiles): 16 times smaller files (bids-parser 4.4 MB -> 272 KB)
/// to hash, load and upload, a few seconds less to build; the `name` section, which trap
/// backtraces and `perf` maps use, stays.
const NO_DEBUG_INFO: &str = "profile.release.debug=false";

fn build_plugins(root: &Path, target_dir: &Path, packages: &[(String, PathBuf)]) {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "--release", "--target", TARGET])
        .args(["--config", NO_DEBUG_INFO])
        .arg("--target-dir")
        .arg(target_dir);
    for (name, _) in packages {
        cmd.args(["-p", name]);
    }
    for (name, _) in env::vars_os() {
        if let Some(n) = name.to_str()
            && leaks_from_outer_build(n)
        {
            cmd.env_remove(&name);
        }
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to run nested cargo: {e}"));
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stdout));
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        let packages: Vec<&str> = packages.iter().map(|(n, _)| n.as_str()).collect();
        panic!(
            "building the plugin components failed ({}); the nested cargo output is above.\n\
             Reproduce with: cargo build --release --target {TARGET} --config {NO_DEBUG_INFO} --target-dir {} -p {}\n\
             Set NOPSTREAM_SKIP_PLUGIN_BUILD=1 to skip the plugin build.",
            output.status,
            target_dir.display(),
            packages.join(" -p ")
        );
    }
}

fn check_component(path: &Path, package: &str) {
    let bytes = fs::read(path).unwrap_or_else(|e| {
        panic!(
            "plugin `{package}` built but {} is missing ({e}); is its crate-type \"cdylib\"?",
            path.display()
        )
    });
    assert!(
        bytes.starts_with(&COMPONENT_HEADER),
        "{} is not a WebAssembly component (header {:02x?})",
        path.display(),
        &bytes[..bytes.len().min(8)]
    );
}

fn generate(plugin_dir: &Path, packages: &[(String, PathBuf)]) -> String {
    let mut s = String::new();
    let dir = plugin_dir.to_str().expect("plugin dir is not UTF-8");
    writeln!(
        s,
        "/// Absolute path of the directory holding the built plugin components \
         (`<target dir>/wasm32/{TARGET}/release`).\npub const PLUGIN_DIR: &str = {dir:?};\n"
    )
    .unwrap();
    writeln!(
        s,
        "/// Every plugin package (from `plugins/` and `tests/plugins/`), sorted by name, with \
         the absolute path of its component.\npub const PLUGINS: &[(&str, &str)] = &["
    )
    .unwrap();
    for (name, _) in packages {
        let path = plugin_dir.join(artifact_file(name));
        writeln!(
            s,
            "    ({name:?}, {:?}),",
            path.to_str().expect("UTF-8 path")
        )
        .unwrap();
    }
    writeln!(s, "];").unwrap();
    s
}
