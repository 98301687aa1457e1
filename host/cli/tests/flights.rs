//! The main job end to end through the real `nopstream` binary: the per-carrier figures
//! equal an independent computation over the same CSV, at parallelism 1 and 2.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Debug, Default, PartialEq)]
struct Expected {
    flights: u64,
    cancelled: u64,
    delayed_15: u64,
    sum: i64,
    n: u64,
}

/// Reads the zipped CSV with the `csv` crate and computes the figures directly.
fn expected() -> BTreeMap<String, Expected> {
    let zip_path = repo().join("examples/flights/data/flights.csv.zip");
    let file = std::fs::File::open(&zip_path).expect("flights zip in the repository");
    let mut zip = zip::ZipArchive::new(file).unwrap();
    let member = zip.by_name("flights.csv").unwrap();
    let mut rdr = csv::Reader::from_reader(member);
    let headers = rdr.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (carrier, dep_delay) = (col("carrier"), col("dep_delay"));
    let mut out: BTreeMap<String, Expected> = BTreeMap::new();
    for row in rdr.records() {
        let row = row.unwrap();
        let e = out.entry(row[carrier].to_owned()).or_default();
        e.flights += 1;
        match &row[dep_delay] {
            "NA" => e.cancelled += 1,
            d => {
                let d: i64 = d.parse().unwrap();
                e.sum += d;
                e.n += 1;
                if d > 15 {
                    e.delayed_15 += 1;
                }
            }
        }
    }
    out
}

fn run(parallelism: u32) -> (Vec<String>, Vec<String>) {
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

fn check(lines: &[String], expected: &BTreeMap<String, Expected>) {
    assert_eq!(
        lines.len(),
        expected.len(),
        "one line per carrier: {lines:#?}"
    );
    assert_eq!(expected.len(), 16);
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap();
        let carrier = v["carrier"].as_str().unwrap();
        let e = &expected[carrier];
        assert_eq!(v["flights"].as_u64(), Some(e.flights), "{carrier} flights");
        assert_eq!(
            v["cancelled"].as_u64(),
            Some(e.cancelled),
            "{carrier} cancelled"
        );
        assert_eq!(
            v["delayed_15"].as_u64(),
            Some(e.delayed_15),
            "{carrier} delayed_15"
        );
        let avg = e.sum as f64 / e.n as f64;
        assert_eq!(
            v["avg_dep_delay_min"].as_f64(),
            Some(avg),
            "{carrier} avg_dep_delay_min"
        );
    }
    let total: u64 = expected.values().map(|e| e.flights).sum();
    assert_eq!(total, 336_776);
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
