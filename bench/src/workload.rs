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
    /// Event time: the source stamps records with `date_time` (file-source `event_time`)
    /// and emits watermarks (`max_out_of_orderness_ms = 0`; the generated bids are in
    /// time order). Windows and CEP need it; `bids-parser` stamps records with
    /// `date_time` either way, but watermarks derive from the source's own records.
    pub event_time: bool,
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

/// Nexmark q5-style hot items: parse, HASH by auction, sliding-window count (binary
/// accumulator), SINGLETON to the top-per-window stage, blackhole.
const Q5_PIPELINE: &str = r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "window"
plugin = "window-count@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]
config = { window = { kind = "sliding", size_ms = 10000, slide_ms = 2000 } }

[[operator]]
name = "top"
plugin = "hot-items@0.1.0"
parallelism = 1
inputs = [{ from = "window", partition = "singleton" }]
config = { slide_ms = 2000 }
{sink:top}"#;

/// CEP: parse, HASH by auction, three rising bids within 10 s, blackhole.
const CEP_PIPELINE: &str = r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]

[[operator]]
name = "rising"
plugin = "rising-bids@0.1.0"
inputs = [{ from = "parse", partition = "hash" }]
{sink:rising}"#;

/// The workloads, in table order.
pub const WORKLOADS: &[Workload] = &[
    Workload {
        name: "q0",
        description: "passthrough: CSV line -> parsed bid record -> blackhole (parse starts a new chain: the source reads on one core, parse and sink run on the other)",
        input: Input::Bids,
        pipeline: Some(
            r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]
start_new_chain = true
{sink:parse}"#,
        ),
        flink_query: Some("q0"),
        checkpoint_ms: None,
        floor: "q0",
        event_time: false,
    },
    Workload {
        name: "q1",
        description: "map: parsed bid -> price x 0.908 (decimal, scale 3) -> blackhole (parse starts a new chain, as in q0)",
        input: Input::Bids,
        pipeline: Some(
            r#"
[[operator]]
name = "parse"
plugin = "bids-parser@0.1.0"
inputs = ["bids"]
start_new_chain = true

[[operator]]
name = "map"
plugin = "bid-map@0.1.0"
inputs = ["parse"]
{sink:map}"#,
        ),
        flink_query: Some("q1"),
        checkpoint_ms: None,
        floor: "q1",
        event_time: false,
    },
    Workload {
        name: "count",
        description: "keyed running count per auction (HASH edge, redb-backed keyed state), one update per bid",
        input: Input::Bids,
        pipeline: Some(COUNT_PIPELINE),
        flink_query: Some("count"),
        checkpoint_ms: None,
        floor: "count",
        event_time: false,
    },
    Workload {
        name: "count-ckpt",
        description: "keyed running count with exactly-once checkpoints every 1 s (keyed state segments, manifests, 2PC sink)",
        input: Input::Bids,
        pipeline: Some(COUNT_PIPELINE),
        flink_query: Some("count"),
        checkpoint_ms: Some(1000),
        floor: "count",
        event_time: false,
    },
    Workload {
        name: "q5",
        description: "Nexmark q5-style hot items: bids per auction in 10 s windows sliding every 2 s (window-count), then the top auction per window (hot-items, singleton edge)",
        input: Input::Bids,
        pipeline: Some(Q5_PIPELINE),
        flink_query: Some("q5"),
        checkpoint_ms: None,
        floor: "q5",
        event_time: true,
    },
    Workload {
        name: "cep",
        description: "CEP: three strictly rising bids in a row on one auction within 10 s, skip past last event (rising-bids on the SDK CEP runtime)",
        input: Input::Bids,
        pipeline: Some(CEP_PIPELINE),
        flink_query: Some("cep"),
        checkpoint_ms: None,
        floor: "cep",
        event_time: true,
    },
    Workload {
        name: "flights",
        description: "examples/flights: CSV -> JSON -> HASH by carrier -> keyed aggregate -> jsonl sink",
        input: Input::Flights,
        pipeline: None,
        flink_query: None,
        checkpoint_ms: None,
        floor: "flights",
        event_time: false,
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
config = {{ path = "/input/{input_file}", format = "csv", header = true{event_time} }}
{watermarks}{body}"#,
        name = w.name,
        description = w.description,
        event_time = if w.event_time {
            r#", event_time = { column = "date_time", format = "epoch-ms" }"#
        } else {
            ""
        },
        watermarks = if w.event_time {
            "watermarks = { max_out_of_orderness_ms = 0 }\n"
        } else {
            ""
        },
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
        for name in ["q5", "cep"] {
            let t = job_text(find(name).unwrap(), "../data", "bids-1m.csv", 1024);
            assert!(
                t.contains("watermarks = { max_out_of_orderness_ms = 0 }"),
                "{t}"
            );
            assert!(t.contains(r#"event_time = { column = "date_time""#), "{t}");
            if let Err(e) = nop_stream_core::parse_job_file("job.toml", &t) {
                panic!("{t}\n{e:?}");
            }
        }
        let t = job_text(find("count").unwrap(), "../data", "bids-1m.csv", 1024);
        assert!(
            !t.contains("watermarks") && !t.contains("event_time"),
            "{t}"
        );
        assert!(flights_job().ends_with("examples/flights/flights.toml"));
    }
}
