//! The main job end to end through the real `nopstream` binary: the per-carrier figures
//! equal an independent computation over the same CSV, at parallelism 1 and 2.

mod common;

use common::kit::repo;

use common::flights::{check_per_carrier as check, expected_per_carrier as expected};
use std::process::Command;

fn run(parallelism: u32) -> (Vec<String>, Vec<String>) {
    run_with(parallelism, &[])
}

fn run_with(parallelism: u32, extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let status = Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .current_dir(tmp.path())
        .args([
            "run",
            "--no-progress",
            "-p",
            &parallelism.to_string(),
            "--output",
        ])
        .arg(&out)
        .arg("--work-dir")
        .arg(tmp.path().join("work"))
        .args(extra)
        .arg(repo().join("examples/flights/flights.toml"))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "nopstream run failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    let stdout = String::from_utf8(status.stdout).unwrap();
    let echoed: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(str::to_owned)
        .collect();
    let mut committed = Vec::new();
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "jsonl") {
            committed.extend(
                std::fs::read_to_string(&p)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    committed.sort();
    (echoed, committed)
}

#[test]
fn flights_per_carrier_matches_independent_computation_at_parallelism_1_and_2() {
    let expected = expected();
    let (echo1, committed1) = run(1);
    let (echo2, committed2) = run(2);
    check(&committed1, &expected);
    check(&committed2, &expected);
    assert_eq!(
        committed1, committed2,
        "parallelism 1 and 2 give identical output"
    );
    assert_eq!(
        echo1, committed1,
        "the run echoes exactly the committed output"
    );
    assert_eq!(echo2, committed2);
}

#[test]
fn a_state_ttl_longer_than_the_run_leaves_the_figures_exact() {
    // Through a Delta overlay: the aggregate's `acc` state gets an hour's TTL, so every
    // stored accumulator carries a write-time prefix the plugin must never see.
    let tmp = tempfile::tempdir().unwrap();
    let delta = tmp.path().join("ttl.toml");
    std::fs::write(
        &delta,
        "[node.per-carrier]\nstate_ttl_ms = { acc = 3600000 }\n",
    )
    .unwrap();
    let delta = delta.display().to_string();
    let (_, committed) = run_with(2, &["--delta", &delta]);
    check(&committed, &expected());
}
