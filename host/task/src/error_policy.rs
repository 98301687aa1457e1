//! The pieces of an operator's error policy (job-file `on_error`, [`ErrorPolicy`]) that
//! need no task: cutting a batch into one-record batches, joining outputs, and the
//! dead-letter record format. The task driver (`task.rs`) applies the policy.
//!
//! # The isolation rule
//!
//! A guest error in `process` covers its whole batch (WIT `result<batch, error>`). To act
//! on single records the task drops everything the failed call produced (its output and
//! side outputs) and calls `process` again once per record of the batch, in order: the
//! output of each good record is kept, each record that fails alone is skipped or
//! dead-lettered. That is exactly-once only if the failed call changed nothing that
//! outlives it. The host cannot take back keyed-state or timer writes, so the planner
//! accepts `skip` and `dead-letter` only for operators that declare no keyed state
//! (without state an operator cannot register timers either); a stateless operator's
//! failed call then leaves nothing in the host, and each good record is processed
//! exactly once, by its one-record call. What the guest keeps in its own memory is the
//! plugin's business: a plugin returning an error must not have changed instance memory
//! that later calls depend on (the WIT contract already keeps everything that must
//! survive in host state).
//!
//! # Dead-letter records
//!
//! One compact JSON object per failed record, on the operator's side output `errors`,
//! without a key and with the failed record's timestamp (if it had one):
//!
//! ```json
//! {"operator":"parse","plugin":"flights-mapper@0.1.0","subtask":0,"input":0,
//!  "code":"invalid-record","message":"record 0: column dep_delay: value \"x\" is not a number",
//!  "record":"2013,1,1,517,515,x,…"}
//! ```
//!
//! `record` is the failed record as text when it is UTF-8, otherwise `record_hex` holds
//! its bytes in hex; likewise `key` / `key_hex` for a keyed input record (absent when
//! unkeyed); `timestamp` (ms) when the record had one. `code` and `message` are what the
//! plugin reported for that record alone. Every field is a function of the plan and the
//! input, so a replay after recovery writes the same bytes.

use nop_stream_api::Batch;
use nop_stream_plugin_host::Site;
use serde::Serialize;

#[cfg(doc)]
use nop_stream_core::ErrorPolicy;

/// Record `i` of `b` as a batch of its own (payload, key and timestamp).
///
/// # Panics
/// If `i` is out of range.
pub(crate) fn one_record(b: &Batch, i: usize) -> Batch {
    let start = if i == 0 { 0 } else { b.ends[i - 1] as usize };
    let end = b.ends[i] as usize;
    let mut out = Batch {
        data: b.data[start..end].to_vec(),
        ends: vec![(end - start) as u32],
        ..Batch::default()
    };
    if b.key_ends.len() == b.ends.len() {
        let ks = if i == 0 {
            0
        } else {
            b.key_ends[i - 1] as usize
        };
        let ke = b.key_ends[i] as usize;
        out.keys = b.keys[ks..ke].to_vec();
        out.key_ends = vec![(ke - ks) as u32];
    }
    if b.timestamps.len() == b.ends.len() {
        out.timestamps = vec![b.timestamps[i]];
    }
    out
}

fn keyed(b: &Batch) -> bool {
    !b.ends.is_empty() && b.key_ends.len() == b.ends.len()
}

fn timed(b: &Batch) -> bool {
    !b.ends.is_empty() && b.timestamps.len() == b.ends.len()
}

/// Appends `src` to `dst`. Batches join only when both are keyed or both unkeyed, and
/// both timed or both untimed; otherwise `dst` is returned to be sent first and `src`
/// takes its place.
pub(crate) fn append(dst: &mut Batch, src: Batch) -> Option<Batch> {
    if src.is_empty() {
        return None;
    }
    if dst.is_empty() {
        *dst = src;
        return None;
    }
    if keyed(dst) != keyed(&src) || timed(dst) != timed(&src) {
        return Some(std::mem::replace(dst, src));
    }
    let base = dst.data.len() as u32;
    dst.data.extend_from_slice(&src.data);
    dst.ends.extend(src.ends.iter().map(|e| e + base));
    if keyed(&src) {
        let kbase = dst.keys.len() as u32;
        dst.keys.extend_from_slice(&src.keys);
        dst.key_ends.extend(src.key_ends.iter().map(|e| e + kbase));
    }
    dst.timestamps.extend_from_slice(&src.timestamps);
    None
}

/// The dead-letter record format (module docs).
#[derive(Serialize)]
struct DeadLetter<'a> {
    operator: &'a str,
    plugin: &'a str,
    subtask: Option<u32>,
    input: u32,
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    record_hex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_hex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<i64>,
}

/// The dead-letter record (module docs) of the one-record batch `failed`, which the
/// operator at `site` rejected on input `input` with the guest error `code`, `message`.
pub(crate) fn dead_letter(
    site: &Site,
    input: u32,
    failed: &Batch,
    code: &str,
    message: &str,
) -> Batch {
    let record = std::str::from_utf8(&failed.data).ok();
    let key = keyed(failed).then_some(failed.keys.as_slice());
    let key_text = key.and_then(|k| std::str::from_utf8(k).ok());
    let letter = DeadLetter {
        operator: &site.operator,
        plugin: &site.plugin,
        subtask: site.subtask,
        input,
        code,
        message,
        record,
        record_hex: record.is_none().then(|| hex::encode(&failed.data)),
        key: key_text,
        key_hex: key.filter(|_| key_text.is_none()).map(hex::encode),
        timestamp: timed(failed).then(|| failed.timestamps[0]),
    };
    let data = serde_json::to_vec(&letter).expect("plain data serializes");
    Batch {
        ends: vec![data.len() as u32],
        data,
        keys: Vec::new(),
        key_ends: Vec::new(),
        timestamps: letter.timestamp.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (payload, key, timestamp) of one test record.
    type Rec<'a> = (&'a [u8], Option<&'a [u8]>, Option<i64>);

    fn batch(records: &[Rec<'_>]) -> Batch {
        let mut b = Batch::default();
        for (data, key, ts) in records {
            b.data.extend_from_slice(data);
            b.ends.push(b.data.len() as u32);
            if let Some(k) = key {
                b.keys.extend_from_slice(k);
                b.key_ends.push(b.keys.len() as u32);
            }
            if let Some(t) = ts {
                b.timestamps.push(*t);
            }
        }
        b
    }

    #[test]
    fn one_record_batches_rejoin_into_the_original() {
        let b = batch(&[
            (b"alpha", Some(b"k1"), Some(10)),
            (b"", Some(b""), Some(11)),
            (b"gamma", Some(b"k333"), Some(12)),
        ]);
        let mut joined = Batch::default();
        for i in 0..b.len() {
            let one = one_record(&b, i);
            assert_eq!(one.len(), 1);
            assert!(append(&mut joined, one).is_none());
        }
        assert_eq!(joined, b);
        let plain = batch(&[(b"a", None, None), (b"bc", None, None)]);
        assert_eq!(
            one_record(&plain, 1),
            batch(&[(b"bc", None, None)]),
            "unkeyed and untimed stay so"
        );
    }

    #[test]
    fn append_hands_back_a_batch_of_another_layout() {
        let mut dst = batch(&[(b"a", Some(b"k"), None)]);
        let flushed = append(&mut dst, batch(&[(b"b", None, None)]));
        assert_eq!(flushed, Some(batch(&[(b"a", Some(b"k"), None)])));
        assert_eq!(dst, batch(&[(b"b", None, None)]));
        assert!(append(&mut dst, Batch::default()).is_none());
        assert_eq!(dst.len(), 1);
    }

    fn site() -> Site {
        Site {
            plugin: "flights-mapper@0.1.0".into(),
            operator: "parse".into(),
            subtask: Some(1),
        }
    }

    const MESSAGE: &str = "record 0: column dep_delay: value \"x\" is not a number";

    #[test]
    fn dead_letters_carry_record_error_and_origin_as_json() {
        let failed = batch(&[(b"2013,1,\"UA\",x", Some(b"UA"), Some(1_357_034_400_000))]);
        let dl = dead_letter(&site(), 0, &failed, "invalid-record", MESSAGE);
        assert_eq!(dl.len(), 1);
        assert!(dl.key_ends.is_empty(), "dead letters are unkeyed");
        assert_eq!(dl.timestamps, vec![1_357_034_400_000]);
        assert_eq!(
            std::str::from_utf8(&dl.data).unwrap(),
            r#"{"operator":"parse","plugin":"flights-mapper@0.1.0","subtask":1,"input":0,"code":"invalid-record","message":"record 0: column dep_delay: value \"x\" is not a number","record":"2013,1,\"UA\",x","key":"UA","timestamp":1357034400000}"#
        );
    }

    #[test]
    fn dead_letters_of_binary_records_use_hex() {
        let failed = batch(&[(&[0xff, 0x00], None, None)]);
        let dl = dead_letter(&site(), 2, &failed, "invalid-record", MESSAGE);
        let v: serde_json::Value = serde_json::from_slice(&dl.data).unwrap();
        assert_eq!(v["record_hex"], "ff00");
        assert!(v.get("record").is_none() && v.get("key").is_none());
        assert!(v.get("timestamp").is_none() && dl.timestamps.is_empty());
        assert_eq!(v["input"], 2);
    }
}
