//! The helpers every suite shares: the repository root, the `nopstream` binary, a finished
//! process's output, and a sink directory's committed JSONL lines.

use std::path::{Path, PathBuf};
use std::process::Output;

/// The `nopstream` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_nopstream");

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// stdout and stderr of a finished process.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Committed JSONL output lines under `out` (sorted); staging files are not output.
pub fn committed(out: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            lines.extend(
                std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    lines.sort();
    lines
}

/// Writes `text`, a job file of the example directory `example_dir` (relative to the
/// repository root), to `dir/name` with its relative paths (`host = "..."` of grants,
/// `unzip`, `sort` and `into` of prepare steps) made absolute against the example
/// directory (values starting with `$` are left to the runner), so that a test's job files live in its temporary directory, never in
/// `examples/`. Returns the path written.
pub fn job_in(dir: &Path, name: &str, example_dir: &str, text: &str) -> PathBuf {
    let base = repo().join(example_dir).canonicalize().unwrap();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut line = line.to_owned();
        for key in ["host = \"", "unzip = \"", "sort = \"", "into = \""] {
            let mut from = 0;
            while let Some(at) = line[from..].find(key) {
                let start = from + at + key.len();
                let Some(len) = line[start..].find('"') else {
                    break;
                };
                let value = &line[start..start + len];
                // `$OUTPUT` and other variables are the runner's to expand.
                if !value.is_empty() && !value.starts_with('$') && !Path::new(value).is_absolute() {
                    let abs = base.join(value).display().to_string();
                    line.replace_range(start..start + len, &abs);
                    from = start + abs.len();
                } else {
                    from = start + len;
                }
            }
        }
        out.push_str(&line);
    }
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}
