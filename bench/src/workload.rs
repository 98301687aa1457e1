//! The workloads: each is a nop-stream job file (wasm plugins end to end), a native floor
//! ([`crate::floor`]) and optionally a query of the Flink peer (`peers/flink_job.py`).
//!
//! A new variant (checkpointed count, q5 windows, CEP, RocksDB peer) is one more entry in
//! [`WORKLOADS`]: a job body, a floor name and a peer query.

use std::path::{Path, PathBuf};

/// What a workload reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The generated bids CSV of the run's size.
    Bids,
    /// The NYC flights 2013 file of `examples/flights` (fixed size, 336,776 rows).
    Flights,
}

/// One benchmark workload.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Short name (table rows, file names, floor selector).
    pub name: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// Input.
    pub input: Input,
    /// The operators and sink of the job after the `bids` source, in job-file TOML; `None`
    /// for a workload that runs an existing job file (flights).
    pub pipeline: Option<&'static str>,
    /// `Q` of `flink_job.py`, if the peer runs this workload.
    pub flink_query: Option<&'static str>,
    /// Exactly-once checkpoint interval in ms (nop-stream `checkpoint_interval_ms`, Flink
    /// `CKPT_MS` with the hashmap backend); `None`: only the final epoch.
    pub checkpoint_ms: Option<u64>,
    /// The floor to compare with (a workload name of [`crate::floor::run`]).
    pub floor: &'static str,
}

const SINK_AFTER: &str = r#"
[[sink]]
name = "out"
plugin = "blackhole-sink@0.1.0"
inputs = ["{from}"]
grants = [{ guest = "/output", host = "$OUTPUT", writable = true }]
config = { summary_dir = "/output" }
"#;

/// Keyed running count: parse, HASH by auction, count in keyed state, blackhole.
const COUNT_PIPELINE: &str = r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "count"
plugin = "keyed-count@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]
config = { emit = "record" }
{sink:count}"#;

/// The workloads, in table order.
pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "q0",
        description: "passthrough: CSV line -> parsed bid record -> blackhole",
        input: Input::Bids,
        pipeline: Some(
            r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]
{sink:parse}"#,
        ),
        flink_query: Some("q0"),
        checkpoint_ms: None,
        floor: "q0",
    },
    Workload {
        name: "q1",
        description: "map: parsed bid -> price x 0.908 (decimal, scale 3) -> blackhole",
        input: Input::Bids,
        pipeline: Some(
            r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "map"
plugin = "bid-map@0.1.0"
inputs = ["parse"]
{sink:map}"#,
        ),
        flink_query: Some("q1"),
        checkpoint_ms: None,
        floor: "q1",
    },
    Workload {
        name: "count",
        description: "keyed running count per auction (HASH edge, redb-backed keyed state), one update per bid",
        input: Input::Bids,
        pipeline: Some(COUNT_PIPELINE),
        flink_query: Some("count"),
        checkpoint_ms: None,
        floor: "count",
    },
    Workload {
        name: "count-ckpt",
        description: "keyed running count with exactly-once checkpoints every 1 s (keyed state segments, manifests, 2PC sink)",
        input: Input::Bids,
        pipeline: Some(COUNT_PIPELINE),
        flink_query: Some("count"),
        checkpoint_ms: Some(1000),
        floor: "count",
    },
    Workload {
        name: "flights",
        description: "examples/flights: CSV -> JSON -> HASH by carrier -> keyed aggregate -> jsonl sink",
        input: Input::Flights,
        pipeline: None,
        flink_query: None,
        checkpoint_ms: None,
        floor: "flights",
    },
];

/// Looks a workload up by name.
pub fn find(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// The repository's flights job file.
pub fn flights_job() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/flights/flights.toml")
}

/// The flights CSV (unpacked by the job's `[[prepare]]` step on its first run).
pub fn flights_csv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/flights/data/flights.csv")
}

/// The job file text of a bids workload reading `/input/<input_file>` from the granted
/// directory `data_dir` (relative to the job file's directory).
///
/// # Panics
/// If `w` has no pipeline (flights runs its own job file).
pub fn job_text(w: &Workload, data_dir: &str, input_file: &str, batch_records: u32) -> String {
    let pipeline = w.pipeline.expect("bids workloads have a pipeline");
    let mut body = pipeline.to_string();
    while let Some(start) = body.find("{sink:") {
        let end = start + body[start..].find('}').expect("closed placeholder");
        let from = body[start + 6..end].to_string();
        body.replace_range(start..=end, &SINK_AFTER.replace("{from}", &from));
    }
    format!(
        r#"# Generated by nopstream-bench: workload {name} ({description}).
[job]
name = "bench-{name}"
semantic = "strict-exactly-once"
batch_records = {batch_records}
{checkpoint}
[[source]]
name = "bids"
plugin = "file-source@0.1.0"
grants = [{{ guest = "/input", host = "{data_dir}" }}]
config = {{ path = "/input/{input_file}", format = "csv", header = true }}
{body}"#,
        name = w.name,
        description = w.description,
        checkpoint = w
            .checkpoint_ms
            .map(|ms| format!("checkpoint_interval_ms = {ms}\n"))
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_texts_name_their_plugins_and_sink() {
        for w in WORKLOADS.iter().filter(|w| w.pipeline.is_some()) {
            let t = job_text(w, "../data", "bids-1m.csv", 1024);
            assert!(t.contains("blackhole-sink@0.1.0"), "{t}");
            assert!(!t.contains("{sink"), "{t}");
            assert!(t.contains("/input/bids-1m.csv"), "{t}");
            assert_eq!(t.matches("[[sink]]").count(), 1);
        }
        assert!(find("count").is_some() && find("nope").is_none());
        assert!(flights_job().ends_with("examples/flights/flights.toml"));
    }
}
