//! `jsonl-sink`: writes record payloads as JSON lines into one file per subtask and epoch,
//! staged and published by atomic rename after the epoch is durable (design §7.3, §7.5;
//! capability staged-atomic-commit). See [`staging`] for the files and their lifecycle.
//!
//! Config: `{ "dir": "/output", "prefix": "part" }` — `dir` is the output directory as the
//! guest sees it (a directory the job grants; default `/output`), `prefix` the published
//! file name prefix (default `part`; no `/`, not starting with `.`). Published files are
//! `{dir}/{prefix}-{subtask:02}-{epoch:06}.jsonl`.

pub mod staging;

use nop_stream_sdk::{
    Batch, CommitOutcome, PluginError, PluginInfo, Result, Sink, SinkCapability, TaskInfo,
};
use serde::Deserialize;

use crate::staging::{Committable, Staging};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"properties":{"dir":{"type":"string","default":"/output","description":"output directory (granted to the plugin)"},"prefix":{"type":"string","default":"part","description":"published file name prefix"}}}"#;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_dir")]
    dir: String,
    #[serde(default = "default_prefix")]
    prefix: String,
}

fn default_dir() -> String {
    "/output".into()
}

fn default_prefix() -> String {
    "part".into()
}

/// The sink: one [`Staging`] area per subtask.
#[derive(Debug)]
pub struct JsonlSink {
    staging: Staging,
}

impl Sink for JsonlSink {
    fn describe() -> PluginInfo {
        PluginInfo::sink("jsonl-sink", "0.1.0")
            .description("Writes records as JSON lines; one file per subtask and epoch, published atomically on commit")
            .sink_capability(SinkCapability::StagedAtomicCommit)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("jsonl-sink config: {e}")))?;
        if c.prefix.is_empty() || c.prefix.contains('/') || c.prefix.starts_with('.') {
            return Err(PluginError::invalid_config(format!(
                "jsonl-sink config \"prefix\": {:?} must be non-empty, without '/', and not start with '.'",
                c.prefix
            )));
        }
        Ok(Self {
            staging: Staging::new(c.dir, c.prefix, task.subtask_index).with_owner(format!(
                "{}:{}:{}:",
                task.job_id, task.pipeline_id, task.operator_id
            )),
        })
    }

    fn begin(&mut self, txn: &str) -> Result<()> {
        self.staging.begin(txn)
    }

    fn write(&mut self, txn: &str, batch: &Batch) -> Result<()> {
        self.staging
            .write(txn, (0..batch.len()).map(|i| batch.record(i)))
    }

    fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        Ok(self.staging.pre_commit(txn)?.encode())
    }

    fn commit(&mut self, committable: &[u8]) -> Result<()> {
        self.staging.commit(&Committable::decode(committable)?)
    }

    fn abort(&mut self, txn: &str) -> Result<()> {
        self.staging.abort(txn)
    }

    fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        Ok(self.staging.recover(&Committable::decode(committable)?))
    }

    fn pending_transactions(&mut self) -> Result<Vec<String>> {
        self.staging.pending()
    }

    fn close(&mut self) {
        self.staging.close();
    }
}

nop_stream_sdk::export_sink!(JsonlSink);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_round_trip_through_the_trait() {
        let dir = tempfile::tempdir().unwrap();
        let task = TaskInfo {
            subtask_index: 2,
            ..TaskInfo::for_tests()
        };
        let config = serde_json::json!({ "dir": dir.path(), "prefix": "flights" }).to_string();
        let mut sink = JsonlSink::open(&task, &config).unwrap();
        let txn = "job:main:sinks/out:2:1";
        sink.begin(txn).unwrap();
        let mut b = Batch::default();
        b.push(br#"{"carrier":"AA"}"#);
        b.push(br#"{"carrier":"UA"}"#);
        sink.write(txn, &b).unwrap();
        let c = sink.pre_commit(txn).unwrap();
        assert_eq!(sink.recover(&c).unwrap(), CommitOutcome::Aborted);
        sink.commit(&c).unwrap();
        sink.commit(&c).unwrap();
        assert_eq!(sink.recover(&c).unwrap(), CommitOutcome::Committed);
        let text = std::fs::read_to_string(dir.path().join("flights-02-000001.jsonl")).unwrap();
        assert_eq!(text, "{\"carrier\":\"AA\"}\n{\"carrier\":\"UA\"}\n");
        assert!(sink.pending_transactions().unwrap().is_empty());
        assert!(sink.recover(b"junk").is_err());
        let info = JsonlSink::describe();
        assert_eq!(info.name, "jsonl-sink");
        assert_eq!(
            info.sink_capability,
            Some(SinkCapability::StagedAtomicCommit)
        );
        serde_json::from_str::<serde_json::Value>(&info.config_schema).unwrap();
    }

    #[test]
    fn bad_configs_are_rejected() {
        let task = TaskInfo::for_tests();
        for bad in [
            r#"{"prefix":"a/b"}"#,
            r#"{"prefix":".x"}"#,
            r#"{"dir":1}"#,
            r#"{"x":1}"#,
        ] {
            let err = JsonlSink::open(&task, bad).unwrap_err();
            assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidConfig, "{bad}");
        }
        assert!(JsonlSink::open(&task, "{}").is_ok());
    }
}
