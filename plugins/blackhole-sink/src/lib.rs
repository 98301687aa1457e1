//! `blackhole-sink`: discards every record (Flink's `blackhole` connector), keeping only a
//! record count and an order-independent checksum per transaction, so a benchmark can
//! check that a job produced exactly the output of a reference computation without
//! writing the records anywhere.
//!
//! Config: `{ "summary_dir": "/output" }` (optional; a directory the job grants writable).
//!
//! Capability: two-phase commit. A transaction's only effect is its summary: the
//! committable is `{"txn":T,"records":N,"bytes":B,"checksum":C}` (`N` records with `B`
//! payload bytes, `C` the wrapping sum of [`record_hash`] over their payloads, independent
//! of order and batching), and `commit` makes it visible as
//! `<summary_dir>/summary-<txn>.json` (`:` and `/` in the txn id replaced by `_`;
//! overwriting, so idempotent). Without `summary_dir`, commit has no effect at all.

use nop_stream_sdk::{
    Batch, CommitOutcome, PluginError, PluginInfo, Result, Sink, SinkCapability, TaskInfo,
};
use serde::Deserialize;

/// A 32-bit hash of one record payload (Fx-style multiply-rotate over 8-byte words, folded).
/// Summed as `u64` over records it cannot overflow below 2^32 records.
#[inline]
#[must_use]
pub fn record_hash(payload: &[u8]) -> u32 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mut h = payload.len() as u64;
    let mut chunks = payload.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    ((h >> 32) ^ h) as u32
}

/// Count, bytes and checksum of a set of records; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Records.
    pub records: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Wrapping sum of [`record_hash`] of the payloads.
    pub checksum: u64,
}

impl Summary {
    /// Adds one record payload.
    #[inline]
    pub fn add(&mut self, payload: &[u8]) {
        self.records += 1;
        self.bytes += payload.len() as u64;
        self.checksum = self.checksum.wrapping_add(u64::from(record_hash(payload)));
    }

    /// Adds another summary.
    pub fn merge(&mut self, other: &Summary) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.checksum = self.checksum.wrapping_add(other.checksum);
    }

    /// The committable text of transaction `txn`,
    /// `{"txn":T,"records":N,"bytes":B,"checksum":C}`.
    #[must_use]
    pub fn to_json(&self, txn: &str) -> String {
        serde_json::json!({
            "txn": txn,
            "records": self.records,
            "bytes": self.bytes,
            "checksum": self.checksum,
        })
        .to_string()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    summary_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Committable {
    txn: String,
}

/// File name of the summary of transaction `txn`.
#[must_use]
pub fn summary_file(txn: &str) -> String {
    format!("summary-{}.json", txn.replace([':', '/'], "_"))
}

/// The sink: where summaries go, and the summary of the open transaction.
#[derive(Debug, Default)]
pub struct BlackholeSink {
    summary_dir: Option<String>,
    open: Option<(String, Summary)>,
}

impl BlackholeSink {
    fn summary_path(&self, committable: &[u8]) -> Result<Option<String>> {
        let Some(dir) = &self.summary_dir else {
            return Ok(None);
        };
        let c: Committable = serde_json::from_slice(committable)
            .map_err(|e| PluginError::transaction(format!("malformed committable: {e}")))?;
        Ok(Some(format!(
            "{}/{}",
            dir.trim_end_matches('/'),
            summary_file(&c.txn)
        )))
    }
}

impl Sink for BlackholeSink {
    fn describe() -> PluginInfo {
        PluginInfo::sink("blackhole-sink", "0.1.0")
            .description("Discards records; the committable holds their count and checksum")
            .sink_capability(SinkCapability::TwoPhaseCommit)
            .config_schema(r#"{"type":"object","additionalProperties":false,"properties":{"summary_dir":{"type":"string","description":"granted directory receiving one summary file per committed transaction"}}}"#)
    }

    fn open(_task: &TaskInfo, config: &str) -> Result<Self> {
        let c: Config = serde_json::from_str(config)
            .map_err(|e| PluginError::invalid_config(format!("blackhole-sink config: {e}")))?;
        Ok(Self {
            summary_dir: c.summary_dir,
            open: None,
        })
    }

    fn begin(&mut self, txn: &str) -> Result<()> {
        self.open = Some((txn.to_owned(), Summary::default()));
        Ok(())
    }

    fn write(&mut self, txn: &str, batch: &Batch) -> Result<()> {
        match &mut self.open {
            Some((t, s)) if t == txn => {
                for i in 0..batch.len() {
                    s.add(batch.record(i));
                }
                Ok(())
            }
            _ => Err(PluginError::transaction(format!(
                "write to transaction {txn}, which is not open"
            ))),
        }
    }

    fn pre_commit(&mut self, txn: &str) -> Result<Vec<u8>> {
        match self.open.take() {
            Some((t, s)) if t == txn => Ok(s.to_json(&t).into_bytes()),
            other => {
                self.open = other;
                Err(PluginError::transaction(format!(
                    "pre-commit of transaction {txn}, which is not open"
                )))
            }
        }
    }

    fn commit(&mut self, committable: &[u8]) -> Result<()> {
        if let Some(path) = self.summary_path(committable)? {
            std::fs::write(&path, committable)
                .map_err(|e| PluginError::io(format!("{path}: {e}")))?;
        }
        Ok(())
    }

    fn abort(&mut self, txn: &str) -> Result<()> {
        if self.open.as_ref().is_some_and(|(t, _)| t == txn) {
            self.open = None;
        }
        Ok(())
    }

    fn recover(&mut self, committable: &[u8]) -> Result<CommitOutcome> {
        Ok(match self.summary_path(committable)? {
            Some(path) if !std::path::Path::new(&path).exists() => CommitOutcome::Aborted,
            _ => CommitOutcome::Committed,
        })
    }

    fn pending_transactions(&mut self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

nop_stream_sdk::export_sink!(BlackholeSink);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_order_independent_and_committed() {
        let mut sink = BlackholeSink::open(&TaskInfo::for_tests(), "{}").unwrap();
        sink.begin("t1").unwrap();
        let mut b = Batch::default();
        for r in [&b"alpha"[..], b"", b"0123456789abcdef!"] {
            b.push(r);
        }
        sink.write("t1", &b).unwrap();
        assert!(sink.write("t2", &b).is_err());
        let c = String::from_utf8(sink.pre_commit("t1").unwrap()).unwrap();
        let mut want = Summary::default();
        for r in [&b"0123456789abcdef!"[..], b"alpha", b""] {
            want.add(r);
        }
        assert_eq!(c, want.to_json("t1"));
        assert!(
            c.contains(r#""records":3"#) && c.contains(r#""bytes":22"#),
            "{c}"
        );
        assert!(sink.pre_commit("t1").is_err());
        sink.commit(c.as_bytes()).unwrap();
        assert_eq!(
            sink.recover(c.as_bytes()).unwrap(),
            CommitOutcome::Committed
        );

        let dir = std::env::temp_dir().join(format!("blackhole-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = serde_json::json!({ "summary_dir": dir }).to_string();
        let mut sink = BlackholeSink::open(&TaskInfo::for_tests(), &config).unwrap();
        sink.begin("j:m:sinks/out:0:1").unwrap();
        sink.write("j:m:sinks/out:0:1", &b).unwrap();
        let c = sink.pre_commit("j:m:sinks/out:0:1").unwrap();
        assert_eq!(sink.recover(&c).unwrap(), CommitOutcome::Aborted);
        sink.commit(&c).unwrap();
        sink.commit(&c).unwrap();
        let file = dir.join(summary_file("j:m:sinks/out:0:1"));
        assert!(file.ends_with("summary-j_m_sinks_out_0_1.json"));
        assert_eq!(std::fs::read(&file).unwrap(), c);
        assert_eq!(sink.recover(&c).unwrap(), CommitOutcome::Committed);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_ne!(record_hash(b"a"), record_hash(b"b"));
        assert_ne!(record_hash(b""), record_hash(&[0]));
    }
}
