//! `file-source`: reads a text file line by line as byte-range splits (design §16, §6.4;
//! capability replayable).
//!
//! Config: `{ "path": "/input/flights.csv", "format": "csv"|"jsonl", "header": bool,
//! "splits": u32, "event_time": { "column": "time_hour", "format": "rfc3339",
//! "add_minutes_column": "minute" } }` (see [`config::Config`] for defaults). Each split is
//! a byte range of the file; [`reader`] defines which split owns which line and the cursor
//! (the exclusive next byte offset, `u64` little-endian). Records are the lines without
//! their line ending, unkeyed; empty lines are skipped. The file must not change while a
//! job reads it: a read refuses a file whose length differs from the one at discovery.
//!
//! # Event time
//! Without `event_time` records carry no timestamp. With it (csv with `header = true`
//! only), every record carries the event time of its `column` in ms since the Unix epoch,
//! plus `add_minutes_column` minutes; formats `rfc3339`, `epoch-ms`, `epoch-s`, `datetime`
//! (naive, UTC). See [`event_time`]. The column names are resolved against the file's
//! header line in `discover-splits` and on the first `read` of an instance; a name not in
//! the header is an `invalid-config` error naming it and listing the header. A record whose
//! value does not parse fails the `read` with `invalid-record` naming the file, the byte
//! offset of the record's line, the column and the value; the cursor does not move past
//! it. Fields may be quoted (RFC 4180 within one line). Splits, cursors and the records'
//! bytes are the same with and without `event_time`.
//!
//! The open file is cached per instance; a dropped instance only costs a re-open.

pub mod config;
pub mod event_time;
pub mod reader;
pub mod split;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};

use nop_stream_sdk::{
    Batch, PluginError, PluginInfo, Progress, ReadOutcome, Result, Source, SourceCapability, Split,
    TaskInfo,
};

use crate::config::{CONFIG_SCHEMA, Config};
use crate::event_time::EventTime;
use crate::reader::LineReader;
use crate::split::{SplitDescriptor, byte_ranges, split_id};

/// The source instance: its config, the cached reader of the last file read and the
/// `event_time` config resolved against that file's header.
#[derive(Debug)]
pub struct FileSource {
    config: Config,
    cached: Option<(String, LineReader<File>)>,
    event_time: Option<(String, EventTime)>,
    /// With `max_records_per_second`: its limit, from this instance's first read.
    throttle: Option<nop_stream_sdk::throttle::RateLimit>,
}

/// Longest header line read to resolve `event_time` columns: 1 MiB.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// Encodes a cursor: the byte offset as `u64` little-endian.
#[must_use]
pub fn encode_cursor(offset: u64) -> Vec<u8> {
    offset.to_le_bytes().to_vec()
}

/// Decodes a cursor; empty means "the split's start".
///
/// # Errors
/// A cursor that is neither empty nor 8 bytes.
pub fn decode_cursor(cursor: &[u8]) -> Result<Option<u64>> {
    if cursor.is_empty() {
        return Ok(None);
    }
    let bytes: [u8; 8] = cursor.try_into().map_err(|_| {
        PluginError::internal(format!(
            "cursor of {} bytes; file-source cursors are 8 bytes (u64 little-endian)",
            cursor.len()
        ))
    })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// The start of a record for error messages: at most 120 bytes, lossy UTF-8.
fn preview(line: &[u8]) -> String {
    const MAX: usize = 120;
    if line.len() <= MAX {
        String::from_utf8_lossy(line).into_owned()
    } else {
        format!("{}...", String::from_utf8_lossy(&line[..MAX]))
    }
}

fn io_error(path: &str, e: &std::io::Error) -> PluginError {
    PluginError::io(format!("{path}: {e}"))
}

/// The first line of `path` without its line ending (at most [`MAX_HEADER_BYTES`]).
fn read_header(path: &str) -> Result<Vec<u8>> {
    let f = File::open(path).map_err(|e| io_error(path, &e))?;
    let mut line = Vec::new();
    BufReader::new(f.take(MAX_HEADER_BYTES))
        .read_until(b'\n', &mut line)
        .map_err(|e| io_error(path, &e))?;
    if let Some(rest) = line.strip_suffix(b"\n") {
        line.truncate(rest.len());
    }
    if let Some(rest) = line.strip_suffix(b"\r") {
        line.truncate(rest.len());
    }
    Ok(line)
}

impl FileSource {
    /// Resolves the `event_time` config against the header of `path` unless already done
    /// for that file; a no-op without `event_time`.
    fn resolve_event_time(&mut self, path: &str) -> Result<()> {
        let Some(config) = &self.config.event_time else {
            return Ok(());
        };
        if self.event_time.as_ref().is_none_or(|(p, _)| p != path) {
            self.event_time = None;
            let header = read_header(path)?;
            let et =
                EventTime::resolve(config, &header, path).map_err(PluginError::invalid_config)?;
            self.event_time = Some((path.to_string(), et));
        }
        Ok(())
    }

    fn reader<'a>(
        cached: &'a mut Option<(String, LineReader<File>)>,
        d: &SplitDescriptor,
    ) -> Result<&'a mut LineReader<File>> {
        if cached.as_ref().is_none_or(|(p, _)| *p != d.path) {
            *cached = None;
            let f = File::open(&d.path).map_err(|e| io_error(&d.path, &e))?;
            let len = f.metadata().map_err(|e| io_error(&d.path, &e))?.len();
            if len != d.file_len {
                return Err(PluginError::io(format!(
                    "{} is {len} bytes but was {} bytes when its splits were made; the file changed",
                    d.path, d.file_len
                )));
            }
            *cached = Some((d.path.clone(), LineReader::new(f)));
        }
        cached
            .as_mut()
            .map(|(_, r)| r)
            .ok_or_else(|| PluginError::internal("reader cache vanished"))
    }
}

impl Source for FileSource {
    fn describe() -> PluginInfo {
        PluginInfo::source("file-source", "0.1.0")
            .description("Reads a CSV or JSON-lines file line by line, split into byte ranges")
            .source_capability(SourceCapability::Replayable)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(Self {
            config: Config::parse(config).map_err(PluginError::invalid_config)?,
            cached: None,
            event_time: None,
            throttle: None,
        })
    }

    fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>> {
        let path = self.config.path.clone();
        // Fails the job at its start, not at its first record, if a column is missing.
        self.resolve_event_time(&path)?;
        let path = &path;
        let file_len = std::fs::metadata(path)
            .map_err(|e| io_error(path, &e))?
            .len();
        let count = self.config.splits.unwrap_or(parallelism).max(1);
        Ok(byte_ranges(file_len, count)
            .into_iter()
            .zip(0..)
            .map(|((start, end), i)| Split {
                id: split_id(path, i),
                descriptor: SplitDescriptor {
                    path: path.clone(),
                    start,
                    end,
                    file_len,
                    header: self.config.header,
                }
                .encode(),
            })
            .collect())
    }

    fn read(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome> {
        let d = SplitDescriptor::decode(&split.descriptor).map_err(PluginError::internal)?;
        let mut max_records = max_records;
        if let Some(rate) = self.config.max_records_per_second {
            let limit = self
                .throttle
                .get_or_insert_with(|| nop_stream_sdk::throttle::RateLimit::new(rate));
            max_records = limit.grant(max_records);
            if max_records == 0 {
                // Nothing due yet: the same cursor, no records (the host waits a little).
                return Ok(ReadOutcome {
                    next_cursor: cursor.to_vec(),
                    finished: false,
                    progress: Progress {
                        consumed: decode_cursor(cursor)?
                            .unwrap_or(d.start)
                            .min(d.end)
                            .saturating_sub(d.start),
                        total: Some(d.end - d.start),
                    },
                });
            }
        }
        let cursor = decode_cursor(cursor)?;
        self.resolve_event_time(&d.path)?;
        let reader = Self::reader(&mut self.cached, &d)?;
        let mut event_time = self.event_time.as_mut().map(|(_, et)| et);
        let mut bad_record = None;
        let emit = |at: u64, line: &[u8]| {
            let Some(et) = event_time.as_deref_mut() else {
                out.push(line);
                return true;
            };
            match et.timestamp(line) {
                Ok(ts) => {
                    out.push_record(None, Some(ts), line);
                    true
                }
                Err(e) => {
                    bad_record = Some(format!(
                        "{}: record at byte {at}: {e}; the record: {:?}",
                        d.path,
                        preview(line)
                    ));
                    false
                }
            }
        };
        let step = match reader.read_records(&d, cursor, max_records, emit) {
            Ok(step) => step,
            Err(e) => {
                // The reader's position is unknown after a failure.
                self.cached = None;
                return Err(io_error(&d.path, &e));
            }
        };
        if let Some(message) = bad_record {
            return Err(PluginError::invalid_record(message));
        }
        if let Some(limit) = &mut self.throttle {
            limit.took(out.len() as u64);
        }
        Ok(ReadOutcome {
            next_cursor: encode_cursor(step.next),
            finished: step.finished,
            progress: Progress {
                consumed: step.next.min(d.end).saturating_sub(d.start),
                total: Some(d.end - d.start),
            },
        })
    }

    fn close(&mut self) {
        self.cached = None;
    }
}

nop_stream_sdk::export_source!(FileSource);

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file(content: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".csv").tempfile().unwrap();
        f.write_all(content.as_bytes()).unwrap();
        f.flush().unwrap();
        f
    }

    fn open(path: &std::path::Path, extra: &str) -> FileSource {
        let config = format!(r#"{{"path":{:?}{extra}}}"#, path.display().to_string());
        FileSource::open(&TaskInfo::for_tests(), &config).unwrap()
    }

    #[test]
    fn max_records_per_second_throttles_reads() {
        let lines: String = (0..20_000).map(|i| format!("{i}\n")).collect();
        let f = file(&format!("n\n{lines}"));
        let mut src = open(f.path(), r#","max_records_per_second":2000"#);
        let split = src.discover_splits(1).unwrap().remove(0);
        let started = std::time::Instant::now();
        let mut cursor = Vec::new();
        let mut read = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            let mut out = Batch::default();
            let r = src.read(&split, &cursor, 1024, &mut out).unwrap();
            read += out.len() as u64;
            cursor = r.next_cursor;
            assert!(!r.finished);
        }
        let bound = (started.elapsed().as_secs_f64() * 2000.0) as u64 + 1;
        assert!(read > 0 && read <= bound, "read {read}, at most {bound}");
        assert!(Config::parse(r#"{"path":"/x.csv","max_records_per_second":0}"#).is_err());
    }

    /// Reads all splits, `max` records per call, restarting each call from the returned
    /// cursor (on a fresh instance every third call).
    fn read_all(path: &std::path::Path, splits: u32, max: u32) -> Vec<String> {
        let mut src = open(path, "");
        let mut got = Vec::new();
        let mut calls = 0;
        for split in src.discover_splits(splits).unwrap() {
            let mut cursor = Vec::new();
            loop {
                calls += 1;
                if calls % 3 == 0 {
                    src = open(path, "");
                }
                let mut out = Batch::default();
                let r = src.read(&split, &cursor, max, &mut out).unwrap();
                assert!(out.len() <= max as usize);
                assert!(!out.is_keyed() && !out.has_timestamps());
                got.extend(
                    out.iter()
                        .map(|r| String::from_utf8(r.data.to_vec()).unwrap()),
                );
                assert_eq!(r.progress.total.unwrap(), {
                    let d = SplitDescriptor::decode(&split.descriptor).unwrap();
                    d.end - d.start
                });
                assert!(r.progress.consumed <= r.progress.total.unwrap());
                cursor = r.next_cursor;
                if r.finished {
                    assert_eq!(r.progress.consumed, r.progress.total.unwrap());
                    break;
                }
            }
        }
        got
    }

    #[test]
    fn splits_cover_the_file_for_any_count_and_cursor_stride() {
        let mut content = String::from("year,carrier\n");
        let mut want = Vec::new();
        for i in 0..200 {
            let line = format!("2013,C{}{}", i % 5, "x".repeat(i % 13));
            content.push_str(&line);
            content.push_str(if i % 2 == 0 { "\n" } else { "\r\n" });
            want.push(line);
            if i % 17 == 0 {
                content.push('\n');
            }
        }
        let f = file(&content);
        for splits in 1..=7 {
            for max in [1, 3, 1000] {
                assert_eq!(
                    read_all(f.path(), splits, max),
                    want,
                    "splits {splits} max {max}"
                );
            }
        }
    }

    #[test]
    fn split_ids_descriptors_and_config() {
        let f = file("h\na\nb\n");
        let path = f.path().display().to_string();
        let mut src = open(f.path(), r#","splits":3"#);
        let splits = src.discover_splits(8).unwrap();
        assert_eq!(splits.len(), 3);
        assert_eq!(splits[2].id, format!("{path}#2"));
        let d = SplitDescriptor::decode(&splits[2].descriptor).unwrap();
        assert_eq!((d.start, d.end, d.file_len, d.header), (4, 6, 6, true));
        assert_eq!(
            FileSource::open(&TaskInfo::for_tests(), "{}")
                .unwrap_err()
                .code,
            nop_stream_sdk::ErrorCode::InvalidConfig
        );
        let info = FileSource::describe();
        assert_eq!(info.source_capability, Some(SourceCapability::Replayable));
        // header=false keeps the first line.
        let mut src = open(f.path(), r#","header":false"#);
        let split = src.discover_splits(1).unwrap().remove(0);
        let mut out = Batch::default();
        let r = src.read(&split, &[], 10, &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(decode_cursor(&r.next_cursor).unwrap(), Some(6));
        assert!(decode_cursor(&[1, 2]).is_err());
    }

    /// Every read of every split as (cursor in, records, timestamps, cursor out,
    /// finished), restarting from each returned cursor on a fresh instance every other call.
    #[allow(clippy::type_complexity)]
    fn trace(
        path: &std::path::Path,
        extra: &str,
        splits: u32,
        max: u32,
    ) -> Vec<(Vec<u8>, Vec<String>, Vec<i64>, Vec<u8>, bool)> {
        let mut src = open(path, extra);
        let mut steps = Vec::new();
        for (n, split) in src.discover_splits(splits).unwrap().into_iter().enumerate() {
            let mut cursor = Vec::new();
            for call in 0.. {
                if (n + call) % 2 == 1 {
                    src = open(path, extra);
                }
                let mut out = Batch::default();
                let r = src.read(&split, &cursor, max, &mut out).unwrap();
                out.validate().unwrap();
                assert!(out.is_empty() || out.has_timestamps() != extra.is_empty());
                let recs = out
                    .iter()
                    .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
                    .collect();
                steps.push((
                    cursor.clone(),
                    recs,
                    out.timestamps.clone(),
                    r.next_cursor.clone(),
                    r.finished,
                ));
                cursor = r.next_cursor;
                if r.finished {
                    break;
                }
            }
        }
        steps
    }

    const FLIGHTS_HEADER: &str = "year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour";
    const FLIGHTS_ET: &str =
        r#","event_time":{"column":"time_hour","format":"rfc3339","add_minutes_column":"minute"}"#;
    /// 2013-01-01T00:00:00Z in ms.
    const Y2013: i64 = 1_356_998_400_000;

    fn flights_file(rows: usize) -> (tempfile::NamedTempFile, Vec<String>, Vec<i64>) {
        let mut content = format!("{FLIGHTS_HEADER}\r\n");
        let (mut lines, mut ts) = (Vec::new(), Vec::new());
        for i in 0..rows {
            let (h, m) = (5 + i % 14, (i * 7) % 60);
            let line = format!(
                "2013,1,1,517,515,{},830,819,11,UA,{i},{},EWR,IAH,227,1400,{},{m},2013-01-01T{:02}:00:00Z",
                if i % 5 == 0 {
                    "NA".to_string()
                } else {
                    (i % 40).to_string()
                },
                if i % 9 == 0 { "NA" } else { "N14228" },
                h,
                h + 5,
            );
            content.push_str(&line);
            content.push_str(if i % 3 == 0 { "\r\n" } else { "\n" });
            if i % 11 == 0 {
                content.push('\n');
            }
            lines.push(line);
            ts.push(Y2013 + ((h + 5) as i64) * 3_600_000 + (m as i64) * 60_000);
        }
        (file(&content), lines, ts)
    }

    #[test]
    fn event_time_stamps_every_record_and_leaves_cursors_unchanged() {
        let (f, lines, ts) = flights_file(120);
        for splits in [1, 2, 5] {
            for max in [1, 4, 1000] {
                let plain = trace(f.path(), "", splits, max);
                let timed = trace(f.path(), FLIGHTS_ET, splits, max);
                assert_eq!(plain.len(), timed.len());
                for (p, t) in plain.iter().zip(&timed) {
                    // Same cursors, same records, same finished flags.
                    assert_eq!((&p.0, &p.1, &p.3, p.4), (&t.0, &t.1, &t.3, t.4));
                    assert!(p.2.is_empty());
                    assert_eq!(t.2.len(), t.1.len());
                }
                let got: Vec<String> = timed.iter().flat_map(|s| s.1.clone()).collect();
                let got_ts: Vec<i64> = timed.iter().flat_map(|s| s.2.clone()).collect();
                assert_eq!(got, lines, "splits {splits} max {max}");
                assert_eq!(got_ts, ts, "splits {splits} max {max}");
            }
        }
        // The first record: time_hour 10:00Z plus minute 0.
        assert_eq!(ts[0], 1_357_034_400_000);
    }

    #[test]
    fn each_format_and_quoted_fields() {
        for (format, value) in [
            ("rfc3339", "2013-01-01T05:30:00-05:00"),
            ("rfc3339", "\"2013-01-01T10:30:00Z\""),
            ("datetime", "2013-01-01 10:30:00"),
            ("epoch-ms", "1357036200000"),
            ("epoch-s", "1357036200"),
            ("epoch-s", "1357036199.9999"),
        ] {
            let f = file(&format!("id,\"when\",note\n1,{value},\"a, b\"\n"));
            let et = format!(r#","event_time":{{"column":"when","format":"{format}"}}"#);
            let mut src = open(f.path(), &et);
            let split = src.discover_splits(1).unwrap().remove(0);
            let mut out = Batch::default();
            src.read(&split, &[], 10, &mut out).unwrap();
            let want = if value.ends_with(".9999") {
                1_357_036_199_999
            } else {
                1_357_036_200_000
            };
            assert_eq!(out.timestamps, vec![want], "{format} {value}");
            assert_eq!(out.record(0), format!("1,{value},\"a, b\"").as_bytes());
        }
    }

    #[test]
    fn a_missing_column_is_an_invalid_config_error() {
        let (f, _, _) = flights_file(3);
        for et in [
            r#","event_time":{"column":"dep_time_utc","format":"rfc3339"}"#,
            r#","event_time":{"column":"time_hour","format":"rfc3339","add_minutes_column":"minutes"}"#,
        ] {
            let mut src = open(f.path(), et);
            let err = src.discover_splits(2).unwrap_err();
            assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidConfig);
            assert!(
                (err.message.contains("\"dep_time_utc\"") || err.message.contains("\"minutes\""))
                    && err.message.contains(&FLIGHTS_HEADER.replace(',', ", "))
                    && err.message.contains(&f.path().display().to_string()),
                "{}",
                err.message
            );
            // A fresh instance reading a split finds it too.
            let split = open(f.path(), "").discover_splits(1).unwrap().remove(0);
            let err = open(f.path(), et)
                .read(&split, &[], 10, &mut Batch::default())
                .unwrap_err();
            assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidConfig);
        }
        let err = FileSource::open(
            &TaskInfo::for_tests(),
            &format!(r#"{{"path":"/x.csv","header":false{FLIGHTS_ET}}}"#),
        )
        .unwrap_err();
        assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidConfig);
    }

    #[test]
    fn a_bad_value_is_an_invalid_record_error_naming_where() {
        let content =
            "t,m\n2013-01-01T10:00:00Z,5\n2013-01-01 10:00:00,5\n2013-01-01T11:00:00Z,x\n";
        let f = file(content);
        let path = f.path().display().to_string();
        let mut src = open(
            f.path(),
            r#","event_time":{"column":"t","format":"rfc3339","add_minutes_column":"m"}"#,
        );
        let split = src.discover_splits(1).unwrap().remove(0);
        // All-or-nothing per call: the good first record is not returned with the error.
        let err = src
            .read(&split, &[], 10, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, nop_stream_sdk::ErrorCode::InvalidRecord);
        assert_eq!(
            err.message,
            format!(
                r#"{path}: record at byte 27: event_time column "t": value "2013-01-01 10:00:00" is not an rfc3339 timestamp (like 2013-01-01T10:00:00Z or 2013-01-01T05:00:00-05:00); the record: "2013-01-01 10:00:00,5""#
            )
        );
        // Reading one at a time returns the good record, then fails at the bad one
        // without moving the cursor past it.
        let mut out = Batch::default();
        let r = src.read(&split, &[], 1, &mut out).unwrap();
        assert_eq!(out.timestamps, vec![1_357_034_400_000 + 5 * 60_000]);
        assert_eq!(decode_cursor(&r.next_cursor).unwrap(), Some(27));
        assert!(
            src.read(&split, &r.next_cursor, 1, &mut Batch::default())
                .is_err()
        );
        let err = src
            .read(&split, &encode_cursor(49), 1, &mut Batch::default())
            .unwrap_err();
        assert_eq!(
            err.message,
            format!(
                r#"{path}: record at byte 49: event_time add_minutes_column "m": value "x" is not an integer number of minutes; the record: "2013-01-01T11:00:00Z,x""#
            )
        );
        // The same cursor still works for a source without event_time.
        let mut out = Batch::default();
        open(f.path(), "")
            .read(&split, &encode_cursor(49), 1, &mut out)
            .unwrap();
        assert_eq!(out.record(0), b"2013-01-01T11:00:00Z,x");
    }

    /// Stamps the whole real file when it is present (`unzip -p flights.csv.zip >
    /// /tmp/flights.csv`): every record gets time_hour + minute, 2013 only.
    #[test]
    fn stamps_the_real_flights_file_if_present() {
        let path = std::path::Path::new("/tmp/flights.csv");
        if !path.exists() {
            return;
        }
        let mut src = open(path, FLIGHTS_ET);
        let (mut n, mut min, mut max) = (0usize, i64::MAX, i64::MIN);
        for split in src.discover_splits(3).unwrap() {
            let mut cursor = Vec::new();
            loop {
                let mut out = Batch::default();
                let r = src.read(&split, &cursor, 4096, &mut out).unwrap();
                assert_eq!(out.timestamps.len(), out.len());
                n += out.len();
                for &t in &out.timestamps {
                    min = min.min(t);
                    max = max.max(t);
                }
                cursor = r.next_cursor;
                if r.finished {
                    break;
                }
            }
        }
        assert_eq!(n, 336_776);
        // 2013-01-01T10:00Z (05:00 EST) .. before 2014-01-01T05:00Z (midnight EST).
        assert!(
            min >= 1_357_034_400_000 && max < 1_388_552_400_000,
            "{min} {max}"
        );
    }

    #[test]
    fn a_changed_file_is_refused() {
        let mut f = file("h\na\nb\n");
        let mut src = open(f.path(), "");
        let split = src.discover_splits(1).unwrap().remove(0);
        f.write_all(b"c\n").unwrap();
        f.flush().unwrap();
        let err = src
            .read(&split, &[], 10, &mut Batch::default())
            .unwrap_err();
        assert_eq!(err.code, nop_stream_sdk::ErrorCode::Io);
        assert!(err.message.contains("changed"), "{}", err.message);
    }
}
