//! The flights data set and expectations computed from it independently of the engine
//! (the `csv` crate over the zipped CSV).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The CSV's header and its data lines, as the file holds them (no line endings).
pub fn csv_lines() -> (String, Vec<String>) {
    use std::io::Read;
    let zip_path = super::job::repo().join("examples/flights/data/flights.csv.zip");
    let file = std::fs::File::open(&zip_path).expect("flights zip in the repository");
    let mut zip = zip::ZipArchive::new(file).unwrap();
    let mut text = String::new();
    zip.by_name("flights.csv")
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let mut lines = text
        .lines()
        .map(|l| l.trim_end_matches('\r').to_owned())
        .filter(|l| !l.is_empty());
    let header = lines.next().expect("a header line");
    (header, lines.collect())
}

/// Per-carrier figures of the flights job.
#[derive(Debug, Default, PartialEq)]
pub struct Expected {
    /// Departures.
    pub flights: u64,
    /// `dep_delay` = NA.
    pub cancelled: u64,
    /// `dep_delay` > 15.
    pub delayed_15: u64,
    /// Sum of `dep_delay`.
    pub sum: i64,
    /// Departures with a `dep_delay`.
    pub n: u64,
}

/// Reads the zipped CSV with the `csv` crate and computes the per-carrier figures.
pub fn expected_per_carrier() -> BTreeMap<String, Expected> {
    let zip_path = super::job::repo().join("examples/flights/data/flights.csv.zip");
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

/// Checks the per-carrier output lines of the flights job against `expected`.
pub fn check_per_carrier(lines: &[String], expected: &BTreeMap<String, Expected>) {
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

/// The natural key of a flight, `year/month/day/carrier/flight/origin/sched_dep_time`.
pub const NATURAL_KEY: [&str; 7] = [
    "year",
    "month",
    "day",
    "carrier",
    "flight",
    "origin",
    "sched_dep_time",
];

/// The natural key of a per-record output line (each field as JSON text).
pub fn natural_key(line: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(line).unwrap();
    NATURAL_KEY.iter().map(|f| v[f].to_string()).collect()
}

/// The natural keys of a per-record output, checking each appears once.
pub fn natural_keys(lines: &[String]) -> BTreeSet<Vec<String>> {
    let mut keys = BTreeSet::new();
    for l in lines {
        assert!(keys.insert(natural_key(l)), "duplicate natural key in {l}");
    }
    keys
}

/// Checks per-record output: 336,776 records with unique natural keys.
pub fn check_per_record(lines: &[String]) {
    assert_eq!(lines.len(), 336_776, "every departure exactly once");
    natural_keys(lines);
}

/// The flights job text `flights` (examples/flights/flights.toml) with
/// `tests/plugins/opstate-probe` (non-keyed operator state under every redistribution
/// policy; split entries for delays over 120 minutes, union entries over 300) in place of
/// the keyed aggregate.
pub fn probe_state_job_text(flights: String) -> String {
    let start = flights.find("[[operator]]\nname = \"parse\"").unwrap();
    let end = flights.find("[[sink]]").unwrap();
    let sink = flights[end..].replace("inputs = [\"per-carrier\"]", "inputs = [\"probe\"]");
    format!(
        "{}[[operator]]\nname = \"parse\"\nplugin = \"flights-mapper@0.1.0\"\ninputs = [\"flights\"]\n\
         config = {{ key = \"carrier\", fields = [\"year\", \"month\", \"day\", \"carrier\", \"flight\", \"origin\", \"sched_dep_time\", \"dep_delay\"] }}\n\n\
         [[operator]]\nname = \"probe\"\nplugin = \"opstate-probe@0.1.0\"\ninputs = [\"parse\"]\n\
         config = {{ split_over = 120, union_over = 300 }}\n\n{sink}",
        &flights[..start],
    )
}

/// Flights delayed over `over` minutes as `<prefix> <natural key> <delay>` (the key's
/// fields joined by `-`), sorted: the probe's split (`S`, 120) and union (`U`, 300)
/// entries, from the CSV itself.
pub fn delayed_flights(prefix: &str, over: i64) -> Vec<String> {
    let (header, lines) = csv_lines();
    let header: Vec<&str> = header.split(',').map(|h| h.trim_matches('"')).collect();
    let col = |n: &str| header.iter().position(|h| *h == n).unwrap();
    let key = NATURAL_KEY.map(col);
    let delay = col("dep_delay");
    let mut out = Vec::new();
    for l in &lines {
        let f: Vec<&str> = l.split(',').map(|x| x.trim_matches('"')).collect();
        if let Ok(d) = f[delay].parse::<i64>()
            && d > over
        {
            let id: Vec<&str> = key.iter().map(|&i| f[i]).collect();
            out.push(format!("{prefix} {} {d}", id.join("-")));
        }
    }
    out.sort();
    out
}
