//! `nopstream plugin new`: writes a ready-to-build plugin crate (operator, source or sink)
//! outside the workspace, with a native unit test and a job-file stub that runs it.
//!
//! Files written into the crate directory:
//!
//! | file | content |
//! |---|---|
//! | `Cargo.toml` | `cdylib` + `rlib`, the SDK dependency, serde, its own `[workspace]` |
//! | `src/lib.rs` | the plugin (keyed operator with `ValueState`, replayable source, or staged-commit sink) and its `MockContext` / native tests |
//! | `job.toml` | a job running it with the bundled plugins (on the flights data of the checkout for operators and sinks) |
//! | `.gitignore` | `target/`, `nopstream-out/`, `data/` |
//! | `.cargo/config.toml` | WebAssembly SIMD for the `wasm32-wasip2` build, as the bundled plugins use |

use anyhow::{Context as _, Result, bail, ensure};
use std::path::{Path, PathBuf};

/// The `.cargo/config.toml` of a scaffolded crate: the bundled plugins' build flags
/// (the checkout's own `.cargo/config.toml`), so that `memchr` and LLVM's vectoriser use
/// 128-bit WebAssembly SIMD, which wasmtime runs by default.
const PLUGIN_CARGO_CONFIG: &str = include_str!("../../../.cargo/config.toml");

/// Which plugin world to scaffold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A keyed operator (`Operator`, `ValueState`).
    Operator,
    /// A replayable bounded source (`Source`).
    Source,
    /// A two-phase-commit file sink (`Sink`).
    Sink,
}

/// How the generated crate depends on `nop-stream-sdk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdkDep {
    /// `path = "..."`: the `guest-sdk` directory of a checkout (or a copy of it alone).
    Path(PathBuf),
    /// `git = "..."`, optionally at a branch, tag or rev (`rev = "..."`).
    Git {
        /// Repository URL (any form cargo accepts: `https://`, `ssh://`, `file://`).
        url: String,
        /// Commit, tag or branch name; none: the default branch.
        rev: Option<String>,
    },
}

impl SdkDep {
    fn toml(&self) -> String {
        match self {
            SdkDep::Path(p) => format!(
                "nop-stream-sdk = {{ path = {} }}",
                toml_str(&p.display().to_string())
            ),
            SdkDep::Git { url, rev: None } => {
                format!("nop-stream-sdk = {{ git = {} }}", toml_str(url))
            }
            SdkDep::Git { url, rev: Some(r) } => format!(
                "nop-stream-sdk = {{ git = {}, rev = {} }}",
                toml_str(url),
                toml_str(r)
            ),
        }
    }
}

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The SDK of the checkout this binary was built from, if it is still there.
pub fn checkout_sdk() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk");
    p.join("Cargo.toml")
        .is_file()
        .then(|| p.canonicalize().unwrap_or(p))
}

/// The zipped flights CSV of the checkout this binary was built from, if it is there.
fn checkout_flights_zip() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flights/data/flights.csv.zip");
    p.is_file().then(|| p.canonicalize().unwrap_or(p))
}

/// Whether `name` is a usable plugin name: lowercase ASCII letters, digits and `-`,
/// starting with a letter, not ending with `-` (it becomes the crate name and the
/// `name` of `name@version`).
fn check_name(name: &str) -> Result<()> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ensure!(
        ok,
        "plugin name `{name}` is not usable: use lowercase ASCII letters, digits and `-`, \
         starting with a letter (e.g. `delay-stats`)"
    );
    Ok(())
}

fn type_name(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut c = part.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Writes the crate for plugin `name` of `kind` into `dir` and returns the files written.
///
/// # Errors
/// An unusable name, a `dir` that exists and is not empty, no flights data for a kind
/// whose job stub needs it (`flights_zip` none and no checkout), or an I/O failure.
pub fn new_plugin(
    name: &str,
    kind: Kind,
    dir: &Path,
    sdk: &SdkDep,
    flights_zip: Option<PathBuf>,
) -> Result<Vec<PathBuf>> {
    check_name(name)?;
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        ensure!(
            entries.next().is_none(),
            "{} exists and is not empty; pass --dir with a new or empty directory",
            dir.display()
        );
    }
    let (lib, job) = match kind {
        Kind::Operator => (
            include_str!("../templates/operator.rs.tmpl"),
            include_str!("../templates/operator.toml.tmpl"),
        ),
        Kind::Source => (
            include_str!("../templates/source.rs.tmpl"),
            include_str!("../templates/source.toml.tmpl"),
        ),
        Kind::Sink => (
            include_str!("../templates/sink.rs.tmpl"),
            include_str!("../templates/sink.toml.tmpl"),
        ),
    };
    let zip = if job.contains("__FLIGHTS_ZIP__") {
        match flights_zip.or_else(checkout_flights_zip) {
            Some(z) => z.display().to_string(),
            None => bail!(
                "the job stub of a {kind:?} runs on the flights data, and this nopstream was not \
                 built from a checkout that has it; pass --flights PATH/flights.csv.zip"
            ),
        }
    } else {
        String::new()
    };
    let kind_word = match kind {
        Kind::Operator => "operator",
        Kind::Source => "source",
        Kind::Sink => "sink",
    };
    let fill = |t: &str| {
        t.replace("__SDK_DEP__", &sdk.toml())
            .replace("__TYPE__", &type_name(name))
            .replace("__CRATE__", &name.replace('-', "_"))
            .replace("__KIND__", kind_word)
            .replace("\"__FLIGHTS_ZIP__\"", &toml_str(&zip))
            .replace("__NAME__", name)
    };
    let files = [
        (
            "Cargo.toml",
            fill(include_str!("../templates/Cargo.toml.tmpl")),
        ),
        ("src/lib.rs", fill(lib)),
        ("job.toml", fill(job)),
        (".gitignore", "/target\n/nopstream-out\n/data\n".to_owned()),
        (".cargo/config.toml", PLUGIN_CARGO_CONFIG.to_owned()),
    ];
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_crate_and_type_names_and_bad_ones_are_refused() {
        assert_eq!(type_name("delay-stats"), "DelayStats");
        assert_eq!(type_name("x2"), "X2");
        for bad in ["", "Upper", "1st", "under_score", "trailing-", "sp ace"] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("plugin name `{bad}` is not usable")),
                "{err}"
            );
        }
    }

    #[test]
    fn sdk_dependency_forms() {
        assert_eq!(
            SdkDep::Path(PathBuf::from("/src/nop-stream/guest-sdk")).toml(),
            r#"nop-stream-sdk = { path = "/src/nop-stream/guest-sdk" }"#
        );
        assert_eq!(
            SdkDep::Git {
                url: "file:///src/nop-stream".into(),
                rev: Some("abc123".into())
            }
            .toml(),
            r#"nop-stream-sdk = { git = "file:///src/nop-stream", rev = "abc123" }"#
        );
    }

    #[test]
    fn a_non_empty_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep.txt"), "mine").unwrap();
        let err = new_plugin(
            "x",
            Kind::Source,
            dir.path(),
            &SdkDep::Path("/sdk".into()),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("exists and is not empty"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("keep.txt")).unwrap(),
            "mine"
        );
    }
}
