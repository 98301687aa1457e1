//! Records through a task's chain (design §19): each stage's output goes on down the
//! chain in the same call, the tail's to the output edges or into the sink's open
//! transaction; side outputs go to the edges that read them; a guest error in `process`
//! is handled by the operator's error policy (`on_error`).

use super::{Stage, Task};
use crate::error_policy;
use crate::partition::OutputEdge;
use nop_stream_api::Batch;
use nop_stream_core::{DEAD_LETTER_OUTPUT, ErrorPolicy};
use nop_stream_plugin_host::{
    FailedRecord, OperatorInstance, RecordHint, Rejected, Result, RuntimeError, Site,
    printable_record,
};

impl Task {
    /// Pushes `batch` into stage `from` (as input `input`) and on down the chain.
    pub(super) fn push(&mut self, from: usize, input: u32, batch: Batch) -> Result<()> {
        if batch.ends.is_empty() {
            return Ok(());
        }
        if batch.ends.len() > self.max_batch && from < self.stages.len() {
            for piece in split_batch(&batch, self.max_batch) {
                self.push(from, input, piece)?;
            }
            return Ok(());
        }
        if from == self.stages.len() {
            let site = &self.sites[self.sites.len() - 1];
            self.report.records_out += batch.ends.len() as u64;
            self.metrics
                .records_out(batch.ends.len() as u64, super::payload_bytes(&batch));
            return emit_to(&mut self.outputs, None, batch, site);
        }
        match &mut self.stages[from] {
            Stage::Operator(op) => {
                let out = match op.try_process(input, batch)? {
                    Ok(out) => out,
                    Err(rejected) => return self.on_rejected(from, input, rejected),
                };
                self.route_side_outputs(from)?;
                self.push(from + 1, 0, out)
            }
            Stage::Sink(sink) => {
                let txn = self
                    .sink
                    .as_ref()
                    .map(|s| s.txn.as_str())
                    .unwrap_or_default();
                let n = batch.ends.len() as u64;
                self.metrics.records_out(n, super::payload_bytes(&batch));
                sink.write(txn, batch)?;
                self.report.records_out += n;
                self.progress.add_written(n);
                Ok(())
            }
            Stage::Source(_) => Err(RuntimeError::Internal(
                "a source can only head a chain".into(),
            )),
        }
    }

    /// Sends what stage `i` emitted to side outputs during its last call to the edges
    /// reading them. Only a chain's tail can have such edges (the planner never chains
    /// past an operator whose side output is read); anything else is dropped and
    /// counted as `side_output_dropped`.
    pub(super) fn route_side_outputs(&mut self, i: usize) -> Result<()> {
        let Stage::Operator(op) = &mut self.stages[i] else {
            return Ok(());
        };
        let side = op.take_side_outputs();
        if side.is_empty() {
            return Ok(());
        }
        for (tag, batch) in side {
            self.emit_side(i, &tag, batch)?;
        }
        Ok(())
    }

    /// Sends `batch` from stage `i` to the edges reading its side output `tag`, or
    /// counts it as `side_output_dropped.<tag>` ([`Self::route_side_outputs`]).
    fn emit_side(&mut self, i: usize, tag: &str, batch: Batch) -> Result<()> {
        if tag == "late" {
            // The window and join families' records behind the watermark (design §9.1).
            self.metrics.late(batch.ends.len() as u64);
        }
        let read =
            i + 1 == self.stages.len() && self.outputs.iter().any(|o| o.output() == Some(tag));
        if read {
            self.report.records_out += batch.ends.len() as u64;
            self.metrics
                .records_out(batch.ends.len() as u64, super::payload_bytes(&batch));
            emit_to(&mut self.outputs, Some(tag), batch, &self.sites[i])
        } else {
            self.count(i, &format!("side_output_dropped.{tag}"), batch.len() as u64);
            Ok(())
        }
    }

    /// Adds `n` to the host counter `name` of stage `i`'s operator.
    fn count(&mut self, i: usize, name: &str, n: u64) {
        let per_op = self
            .report
            .counters
            .entry(self.sites[i].operator.clone())
            .or_default();
        *per_op.entry(name.to_owned()).or_default() += n;
    }

    fn operator(&mut self, i: usize) -> &mut OperatorInstance {
        match &mut self.stages[i] {
            Stage::Operator(op) => op,
            _ => unreachable!("stage {i} processed records, so it is an operator"),
        }
    }

    /// Stage `i`'s `process` reported a guest error for a batch (job-file `on_error`; the
    /// isolation rule is in [`error_policy`]). The failed call's output and side outputs
    /// are dropped. With `skip` or `dead-letter` (stateless operators only, so the
    /// failed call left nothing behind) the batch is processed again one record at a
    /// time: each good record's output goes on down the chain, exactly once; each record
    /// that fails alone is counted and dropped (`records_skipped`) or sent with its
    /// error to the side output `errors` (`records_dead_lettered`). With `fail`, and for
    /// an `io` error (about the channel to the outside world, not the record; recovery
    /// retries it), the task fails naming the record.
    fn on_rejected(&mut self, i: usize, input: u32, rejected: Rejected) -> Result<()> {
        let Rejected {
            error,
            input: batch,
        } = rejected;
        drop(self.operator(i).take_side_outputs());
        if is_io(&error) {
            return Err(error);
        }
        let policy = self.policies[i];
        if policy == ErrorPolicy::Fail {
            return Err(self.name_failed_record(i, input, error, &batch));
        }
        let mut out = Batch::default();
        let mut dead = Batch::default();
        let (mut skipped, mut dead_lettered) = (0u64, 0u64);
        for r in 0..batch.len() {
            let one = error_policy::one_record(&batch, r);
            match self.operator(i).try_process(input, one)? {
                Ok(o) => {
                    self.route_side_outputs(i)?;
                    if let Some(full) = error_policy::append(&mut out, o) {
                        self.push(i + 1, 0, full)?;
                    }
                }
                Err(Rejected { error, input: one }) => {
                    drop(self.operator(i).take_side_outputs());
                    let RuntimeError::Guest { code, message, .. } = &error else {
                        unreachable!("try_process rejects with guest errors only");
                    };
                    if *code == "io" {
                        return Err(with_record(error, &one.data, RecordHint::None));
                    }
                    if policy == ErrorPolicy::Skip {
                        skipped += 1;
                    } else {
                        let letter =
                            error_policy::dead_letter(&self.sites[i], input, &one, code, message);
                        if let Some(full) = error_policy::append(&mut dead, letter) {
                            self.emit_side(i, DEAD_LETTER_OUTPUT, full)?;
                        }
                        dead_lettered += 1;
                    }
                }
            }
        }
        if skipped + dead_lettered == 0 {
            tracing::warn!(
                site = %self.sites[i],
                "a batch of {} records failed ({error}) but none of its records fails alone;                  processed them one by one",
                batch.len()
            );
        }
        if skipped > 0 {
            self.count(i, "records_skipped", skipped);
            self.metrics.skipped(skipped);
        }
        if dead_lettered > 0 {
            self.count(i, "records_dead_lettered", dead_lettered);
            self.metrics.dead_lettered(dead_lettered);
        }
        self.push(i + 1, 0, out)?;
        if !dead.is_empty() {
            self.emit_side(i, DEAD_LETTER_OUTPUT, dead)?;
        }
        Ok(())
    }

    /// `error` (stage `i` rejected `batch`) with the failing record named: the batch's
    /// only record, or the first record that fails alone when the batch is run again one
    /// record at a time (only to find it: outputs are dropped and the task fails anyway,
    /// so state the re-run touches is discarded with the attempt). If none fails alone,
    /// the error names the batch's first record and says so.
    fn name_failed_record(
        &mut self,
        i: usize,
        input: u32,
        error: RuntimeError,
        batch: &Batch,
    ) -> RuntimeError {
        let hint = if matches!(&error, RuntimeError::Guest { code, .. } if *code == "invalid-config")
        {
            // The job's wiring or config, not the record: skipping records cannot help.
            RecordHint::None
        } else if self.operator(i).state_mut().is_some() {
            RecordHint::KeyedState
        } else {
            RecordHint::SkipOrDeadLetter
        };
        if batch.len() <= 1 {
            return with_record(error, &batch.data, hint);
        }
        for r in 0..batch.len() {
            let one = error_policy::one_record(batch, r);
            let result = self.operator(i).try_process(input, one);
            drop(self.operator(i).take_side_outputs());
            match result {
                Ok(Ok(_)) => {}
                Ok(Err(rejected)) => return with_record(error, &rejected.input.data, hint),
                // The instance broke while looking: report what was asked in the first place.
                Err(_) => return error,
            }
        }
        let first = error_policy::one_record(batch, 0);
        let mut error = with_record(error, &first.data, hint);
        if let RuntimeError::Guest { message, .. } = &mut error {
            *message = format!(
                "{message} (a batch of {} records failed, but none of them fails alone; the \
                 record shown is the batch's first)",
                batch.len()
            )
            .into();
        }
        error
    }
}

fn split_batch(b: &Batch, max: usize) -> Vec<Batch> {
    let n = b.ends.len();
    let keyed = b.key_ends.len() == n;
    let timed = b.timestamps.len() == n;
    let mut out = Vec::with_capacity(n.div_ceil(max));
    let mut i = 0;
    while i < n {
        let j = (i + max).min(n);
        let start = if i == 0 { 0 } else { b.ends[i - 1] as usize };
        let end = b.ends[j - 1] as usize;
        let mut piece = Batch {
            data: b.data[start..end].to_vec(),
            ends: b.ends[i..j].iter().map(|e| e - start as u32).collect(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        };
        if keyed {
            let ks = if i == 0 {
                0
            } else {
                b.key_ends[i - 1] as usize
            };
            let ke = b.key_ends[j - 1] as usize;
            piece.keys = b.keys[ks..ke].to_vec();
            piece.key_ends = b.key_ends[i..j].iter().map(|e| e - ks as u32).collect();
        }
        if timed {
            piece.timestamps = b.timestamps[i..j].to_vec();
        }
        out.push(piece);
        i = j;
    }
    out
}

/// Emits `batch` on every edge carrying `output` (`None`: the main output); every such
/// edge but the last gets a copy, the last takes the batch.
fn emit_to(
    outputs: &mut [OutputEdge],
    output: Option<&str>,
    batch: Batch,
    site: &Site,
) -> Result<()> {
    let n = outputs.iter().filter(|o| o.output() == output).count();
    let mut batch = Some(batch);
    let mut seen = 0;
    for out in outputs.iter_mut().filter(|o| o.output() == output) {
        seen += 1;
        let b = if seen == n {
            batch.take().expect("taken only by the last edge")
        } else {
            batch.clone().expect("kept until the last edge")
        };
        out.emit(b, site)?;
    }
    Ok(())
}

/// A guest error with the code `io`: about a capability, not a record.
fn is_io(error: &RuntimeError) -> bool {
    matches!(error, RuntimeError::Guest { code, .. } if *code == "io")
}

/// A guest error naming the record `data` (printable, truncated), followed by `hint`.
fn with_record(mut error: RuntimeError, data: &[u8], hint: RecordHint) -> RuntimeError {
    if let RuntimeError::Guest { record, .. } = &mut error {
        *record = Some(Box::new(FailedRecord {
            printable: printable_record(data),
            hint,
        }));
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_batch_keeps_records_keys_and_timestamps() {
        let mut b = Batch {
            data: Vec::new(),
            ends: Vec::new(),
            keys: Vec::new(),
            key_ends: Vec::new(),
            timestamps: Vec::new(),
        };
        for i in 0..10u32 {
            b.data.extend_from_slice(format!("r{i}").as_bytes());
            b.ends.push(b.data.len() as u32);
            b.keys.extend_from_slice(format!("k{}", i % 3).as_bytes());
            b.key_ends.push(b.keys.len() as u32);
            b.timestamps.push(i64::from(i));
        }
        let pieces = split_batch(&b, 4);
        assert_eq!(
            pieces.iter().map(|p| p.ends.len()).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        let mut i = 0;
        for p in &pieces {
            let mut s = 0;
            let mut ks = 0;
            for (j, &e) in p.ends.iter().enumerate() {
                assert_eq!(&p.data[s..e as usize], format!("r{i}").as_bytes());
                let ke = p.key_ends[j] as usize;
                assert_eq!(&p.keys[ks..ke], format!("k{}", i % 3).as_bytes());
                assert_eq!(p.timestamps[j], i as i64);
                s = e as usize;
                ks = ke;
                i += 1;
            }
        }
        assert_eq!(i, 10);
    }
}
