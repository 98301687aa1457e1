//! `file-source`: reads a text file line by line as byte-range splits (design §3, seed §6.4;
//! capability replayable).
//!
//! Config: `{ "path": "/input/flights.csv", "format": "csv"|"jsonl", "header": bool,
//! "splits": u32 }` (see [`config::Config`] for defaults). Each split is a byte range of
//! the file; [`reader`] defines which split owns which line and the cursor (the exclusive
//! next byte offset, `u64` little-endian). Records are the lines without their line ending,
//! unkeyed and without timestamps; empty lines are skipped. The file must not change while
//! a job reads it: a read refuses a file whose length differs from the one at discovery.
//!
//! The open file is cached per instance; a dropped instance only costs a re-open.

pub mod config;
pub mod reader;
pub mod split;

use std::fs::File;

use nop_stream_sdk::{
    Batch, PluginError, PluginInfo, Progress, ReadOutcome, Result, Source, SourceCapability, Split,
    TaskInfo,
};

use crate::config::{CONFIG_SCHEMA, Config};
use crate::reader::LineReader;
use crate::split::{SplitDescriptor, byte_ranges, split_id};

/// The source instance: its config and the cached reader of the last file read.
#[derive(Debug)]
pub struct FileSource {
    config: Config,
    cached: Option<(String, LineReader<File>)>,
}

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

fn io_error(path: &str, e: &std::io::Error) -> PluginError {
    PluginError::io(format!("{path}: {e}"))
}

impl FileSource {
    fn reader(&mut self, d: &SplitDescriptor) -> Result<&mut LineReader<File>> {
        if self.cached.as_ref().is_none_or(|(p, _)| *p != d.path) {
            self.cached = None;
            let f = File::open(&d.path).map_err(|e| io_error(&d.path, &e))?;
            let len = f.metadata().map_err(|e| io_error(&d.path, &e))?.len();
            if len != d.file_len {
                return Err(PluginError::io(format!(
                    "{} is {len} bytes but was {} bytes when its splits were made; the file changed",
                    d.path, d.file_len
                )));
            }
            self.cached = Some((d.path.clone(), LineReader::new(f)));
        }
        self.cached
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
        })
    }

    fn discover_splits(&mut self, parallelism: u32) -> Result<Vec<Split>> {
        let path = &self.config.path;
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
        let cursor = decode_cursor(cursor)?;
        let reader = self.reader(&d)?;
        let step = match reader.read(&d, cursor, max_records, |line| out.push(line)) {
            Ok(step) => step,
            Err(e) => {
                // The reader's position is unknown after a failure.
                self.cached = None;
                return Err(io_error(&d.path, &e));
            }
        };
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
