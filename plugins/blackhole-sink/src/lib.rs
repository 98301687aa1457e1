//! `blackhole-sink`: discards every record (Flink's `blackhole` connector), keeping only a
//! record count and an order-independent checksum per transaction, so a benchmark can
//! check that a job produced exactly the output of a reference computation without
//! writing it anywhere.
//!
//! Config: `{}` (none).
//!
//! Capability: two-phase commit, trivially — a transaction makes nothing visible, so
//! commit, abort and recover have nothing to do, and any semantic mode is honoured. The
//! committable is the transaction's summary as JSON text,
//! `{"records":N,"bytes":B,"checksum":C}`: `N` records with `B` payload bytes in total, and
//! `C` the wrapping sum of [`record_hash`] over their payloads (independent of order and
//! batching). The embedded runner reports committables in its JSON report.

use nop_stream_sdk::{
    Batch, CommitOutcome, PluginError, PluginInfo, Result, Sink, SinkCapability, TaskInfo,
};

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
        self.checksum = self
            .checksum
            .wrapping_add(u64::from(record_hash(payload)));
    }

    /// Adds another summary.
    pub fn merge(&mut self, other: &Summary) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.checksum = self.checksum.wrapping_add(other.checksum);
    }

    /// The committable text, `{"records":N,"bytes":B,"checksum":C}`.
    #[must_use]
    pub fn to_json(&self) -> String {
        format!(
            r#"{{"records":{},"bytes":{},"checksum":{}}}"#,
            self.records, self.bytes, self.checksum
        )
    }
}

/// The sink: the summary of the open transaction.
#[derive(Debug, Default)]
pub struct BlackholeSink {
    open: Option<(String, Summary)>,
}

impl Sink for BlackholeSink {
    fn describe() -> PluginInfo {
        PluginInfo::sink("blackhole-sink", "0.1.0")
            .description("Discards records; the committable holds their count and checksum")
            .sink_capability(SinkCapability::TwoPhaseCommit)
            .config_schema(r#"{"type":"object","additionalProperties":false}"#)
    }

    fn open(_task: &TaskInfo, _config: &str) -> Result<Self> {
        Ok(Self::default())
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
            Some((t, s)) if t == txn => Ok(s.to_json().into_bytes()),
            other => {
                self.open = other;
                Err(PluginError::transaction(format!(
                    "pre-commit of transaction {txn}, which is not open"
                )))
            }
        }
    }

    fn commit(&mut self, _committable: &[u8]) -> Result<()> {
        Ok(())
    }

    fn abort(&mut self, txn: &str) -> Result<()> {
        if self.open.as_ref().is_some_and(|(t, _)| t == txn) {
            self.open = None;
        }
        Ok(())
    }

    fn recover(&mut self, _committable: &[u8]) -> Result<CommitOutcome> {
        Ok(CommitOutcome::Committed)
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
        assert_eq!(c, want.to_json());
        assert!(c.starts_with(r#"{"records":3,"bytes":22,"#), "{c}");
        assert!(sink.pre_commit("t1").is_err());
        sink.commit(c.as_bytes()).unwrap();
        assert_eq!(
            sink.recover(c.as_bytes()).unwrap(),
            CommitOutcome::Committed
        );
        assert_ne!(record_hash(b"a"), record_hash(b"b"));
        assert_ne!(record_hash(b""), record_hash(&[0]));
    }
}
