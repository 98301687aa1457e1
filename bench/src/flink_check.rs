//! Checks what the Flink peer (`peers/flink_job.py` with `OUT`) wrote against an
//! expectation computed without Flink: the floor's output count for the append-only
//! queries, and each auction's final count for the running count, whose output is a
//! changelog (Debezium JSON: `"op":"c"` for an insert or an update's new row, `"op":"d"`
//! for an update's old row or a delete).
//!
//! Flink's mini-batched GROUP BY emits fewer updates than one per record, so the count's
//! rows cannot be compared one for one; what its changelog replays to can.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

/// What the output of one Flink query must be.
pub enum Expected {
    /// An append-only query: this many rows.
    Rows(u64),
    /// The running count: the changelog replays to exactly these (auction, count) pairs.
    FinalCounts(HashMap<i64, u64>),
}

/// The finished part files under `dir`, sorted (Flink's in-progress and checksum files
/// start with `.` and are skipped).
fn part_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let e = e?;
            let path = e.path();
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if e.file_type()?.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The lines of `files`.
fn count_rows(files: &[PathBuf]) -> Result<u64> {
    let mut rows = 0u64;
    for f in files {
        let r = BufReader::new(
            std::fs::File::open(f).with_context(|| format!("open {}", f.display()))?,
        );
        for line in r.split(b'\n') {
            line.with_context(|| format!("read {}", f.display()))?;
            rows += 1;
        }
    }
    Ok(rows)
}

/// The rows Flink wrote under `dir` (every finished part file's lines): what
/// `nopstream-bench nexmark` prints beside nop-stream's output count.
///
/// # Errors
/// No part file under `dir`, or an unreadable one (named).
pub fn rows(dir: &Path) -> Result<u64> {
    let files = part_files(dir)?;
    ensure!(
        !files.is_empty(),
        "Flink wrote no part file under {}",
        dir.display()
    );
    count_rows(&files)
}

#[derive(Deserialize)]
struct KeyCount {
    k: i64,
    v: u64,
}

#[derive(Deserialize)]
struct Change {
    before: Option<KeyCount>,
    after: Option<KeyCount>,
    op: String,
}

/// Checks the output Flink wrote under `dir` against `expected`; on success, a line for the
/// result row's note.
///
/// # Errors
/// No output directory, an unreadable or malformed part file (named), a row count or a
/// replayed count that differs from the expectation (the first differing auction named).
pub fn check(dir: &Path, expected: &Expected) -> Result<String> {
    let files = part_files(dir)?;
    ensure!(
        !files.is_empty(),
        "Flink wrote no part file under {}",
        dir.display()
    );
    match expected {
        Expected::Rows(want) => {
            let rows = count_rows(&files)?;
            ensure!(
                rows == *want,
                "Flink wrote {rows} rows under {}, the floor {want}",
                dir.display()
            );
            Ok(format!("{rows} rows = the floor's"))
        }
        Expected::FinalCounts(want) => {
            let mut state: HashMap<i64, u64> = HashMap::with_capacity(want.len());
            let mut changes = 0u64;
            for f in &files {
                let r = BufReader::new(
                    std::fs::File::open(f).with_context(|| format!("open {}", f.display()))?,
                );
                for (i, line) in r.lines().enumerate() {
                    let line = line.with_context(|| format!("read {}", f.display()))?;
                    let c: Change = serde_json::from_str(&line).with_context(|| {
                        format!("{}:{}: not a Debezium change", f.display(), i + 1)
                    })?;
                    match (c.op.as_str(), c.before, c.after) {
                        ("c" | "r" | "u", _, Some(a)) => {
                            state.insert(a.k, a.v);
                        }
                        ("d", Some(b), _) => {
                            if state.get(&b.k) == Some(&b.v) {
                                state.remove(&b.k);
                            }
                        }
                        (op, ..) => {
                            bail!("{}:{}: a change `{op}` without its row", f.display(), i + 1)
                        }
                    }
                    changes += 1;
                }
            }
            if let Some((k, v)) = want.iter().find(|(k, v)| state.get(k) != Some(v)) {
                bail!(
                    "Flink's changelog under {} replays auction {k} to {:?}, the input has {v} bids for it",
                    dir.display(),
                    state.get(k)
                );
            }
            ensure!(
                state.len() == want.len(),
                "Flink's changelog under {} replays to {} auctions, the input has {}",
                dir.display(),
                state.len(),
                want.len()
            );
            Ok(format!(
                "{changes} changelog rows replay to the input's count for each of its {} auctions",
                want.len()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// Rows are counted over every finished part file (nested ones too), hidden files
    /// skipped; one row too many or too few fails.
    #[test]
    fn rows_are_counted_over_finished_part_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "part-0", "1,2\n3,4\n");
        write(&dir.path().join("sub"), "part-1", "5,6\n");
        write(dir.path(), ".part-2.inprogress", "7,8\n");
        assert_eq!(
            check(dir.path(), &Expected::Rows(3)).unwrap(),
            "3 rows = the floor's"
        );
        assert_eq!(rows(dir.path()).unwrap(), 3);
        assert!(check(dir.path(), &Expected::Rows(2)).is_err());
        assert!(check(dir.path(), &Expected::Rows(4)).is_err());
        let empty = tempfile::tempdir().unwrap();
        assert!(
            check(empty.path(), &Expected::Rows(0)).is_err(),
            "no part file"
        );
        assert!(rows(empty.path()).is_err(), "no part file");
    }

    /// A changelog with updates replays to the final counts; a missing update, an extra
    /// key or a stale value fails and names the auction.
    #[test]
    fn a_changelog_replays_to_the_final_counts() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "part-0",
            concat!(
                r#"{"before":null,"after":{"k":1,"v":1},"op":"c"}"#,
                "\n",
                r#"{"before":null,"after":{"k":2,"v":1},"op":"c"}"#,
                "\n",
                r#"{"before":{"k":1,"v":1},"after":null,"op":"d"}"#,
                "\n",
                r#"{"before":null,"after":{"k":1,"v":3},"op":"c"}"#,
                "\n",
            ),
        );
        let want = |pairs: &[(i64, u64)]| Expected::FinalCounts(pairs.iter().copied().collect());
        assert!(check(dir.path(), &want(&[(1, 3), (2, 1)])).is_ok());
        let e = check(dir.path(), &want(&[(1, 4), (2, 1)])).unwrap_err();
        assert!(e.to_string().contains("auction 1"), "{e}");
        assert!(
            check(dir.path(), &want(&[(1, 3)])).is_err(),
            "an extra auction"
        );
        assert!(check(dir.path(), &want(&[(1, 3), (2, 1), (3, 1)])).is_err());
        write(dir.path(), "part-1", "not json\n");
        let e = check(dir.path(), &want(&[(1, 3), (2, 1)])).unwrap_err();
        assert!(format!("{e:#}").contains("part-1:1"), "{e:#}");
    }
}
