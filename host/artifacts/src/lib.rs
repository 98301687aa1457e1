//! Paths of the plugin components built for tests and the CLI.
//!
//! The build script compiles every plugin package under `plugins/` and `tests/plugins/`
//! for `wasm32-wasip2` in release mode (a nested `cargo build` into `wasm32` inside the
//! outer build's target dir, `<workspace>/target/wasm32` by default), checks each output is a component, and generates the
//! constants below. So depending on this crate is all a test needs to load a plugin, and
//! editing a plugin, the SDK or the WIT rebuilds them.
//!
//! With `NOPSTREAM_SKIP_PLUGIN_BUILD=1` nothing is built (for clippy and doc runs): the
//! constants still name the paths, but the files may be missing or stale.

include!(concat!(env!("OUT_DIR"), "/plugins.rs"));

use std::path::PathBuf;

/// Absolute path of the component of plugin package `package_name` (e.g. `file-source`
/// → `.../file_source.wasm`).
///
/// # Panics
/// If no plugin package of that name exists: a test naming an unknown fixture is a bug,
/// and the message lists the known ones.
pub fn plugin_path(package_name: &str) -> PathBuf {
    match PLUGINS.iter().find(|(name, _)| *name == package_name) {
        Some((_, path)) => PathBuf::from(path),
        None => panic!(
            "unknown plugin package `{package_name}`; known: {:?}",
            PLUGINS.iter().map(|(n, _)| *n).collect::<Vec<_>>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_cargo_artifact_naming() {
        assert!(PLUGIN_DIR.ends_with("/wasm32/wasm32-wasip2/release"));
        for (name, path) in PLUGINS {
            let expected = format!("{}/{}.wasm", PLUGIN_DIR, name.replace('-', "_"));
            assert_eq!(*path, expected);
            assert_eq!(plugin_path(name), PathBuf::from(path));
        }
    }

    #[test]
    #[should_panic(expected = "unknown plugin package `no-such-plugin`")]
    fn unknown_plugin_panics() {
        plugin_path("no-such-plugin");
    }
}
