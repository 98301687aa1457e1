//! No reference a reader of the repository cannot follow: code, docs, job files and WIT
//! never cite a tracker issue ("issue 14") or the design seeds ("seed §10"); they cite
//! `docs/design.md` sections, which quote the rules they rest on. `docs/design.md` keeps
//! its own list of sources, so it is the one file left out. An upstream project's issue
//! is cited as `owner/repo#N`, which this check does not match.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Files under `dir` with one of the checked extensions, skipping build output and VCS
/// metadata.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "node_modules" | "nopstream-out"
            ) {
                files(&path, out);
            }
        } else if ["rs", "md", "toml", "wit", "sh", "yaml", "yml"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
            || name == "run"
            || name == "Dockerfile"
            || name == "Justfile"
        {
            out.push(path);
        }
    }
}

/// The 1-based line numbers in `text` that cite a tracker issue or a seed section.
fn offending_lines(text: &str) -> Vec<(usize, String)> {
    let mut hits = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let issue = lower.match_indices("issue ").any(|(i, m)| {
            lower[i + m.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        }) || lower.match_indices("issues ").any(|(i, m)| {
            lower[i + m.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        });
        if issue || lower.contains("seed §") || lower.contains("seeds §") {
            hits.push((n + 1, line.trim().to_string()));
        }
    }
    hits
}

#[test]
fn the_checker_finds_issue_and_seed_citations_and_passes_upstream_ones() {
    let text = "a\n// see issue 14 item 2\n// quinn-rs/quinn#2785\n// per seed §10.3\nIssues 3 and 4\n// an issue with it\n";
    let lines: Vec<usize> = offending_lines(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(lines, vec![2, 4, 5]);
}

#[test]
fn code_and_docs_cite_no_issue_number_and_no_seed_section() {
    let root = repo();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(
        all.len() > 100,
        "walked only {} files under {}",
        all.len(),
        root.display()
    );
    let own = root.join("tests/tests/references.rs");
    let mut found = Vec::new();
    for path in all {
        if path == root.join("docs/design.md") || path == own {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (n, line) in offending_lines(&text) {
            found.push(format!(
                "{}:{n}: {line}",
                path.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "cite docs/design.md sections instead:\n{}",
        found.join("\n")
    );
}
