//! The `config` object of `file-source`.

use serde::Deserialize;

use crate::event_time::EventTimeConfig;

/// Line format of the file; decides the `header` default only (records are raw lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Comma-separated values; the first line is a header by default.
    Csv,
    /// One JSON value per line; no header by default.
    Jsonl,
}

/// `{ "path": "/input/flights.csv", "format": "csv"|"jsonl", "header": bool, "splits": u32,
/// "event_time": { "column": .., "format": .., "add_minutes_column": .. },
/// "max_records_per_second": u64 }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    path: String,
    format: Option<Format>,
    header: Option<bool>,
    splits: Option<u32>,
    event_time: Option<EventTimeConfig>,
    max_records_per_second: Option<u64>,
}

/// Validated configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Path of the file inside a directory the job grants (e.g. `/input/flights.csv`).
    pub path: String,
    /// Line format; default from the extension (`.csv` → csv; `.jsonl`, `.ndjson` → jsonl).
    pub format: Format,
    /// Skip the line at offset 0; default `true` for csv, `false` for jsonl.
    pub header: bool,
    /// Number of splits; default: the parallelism passed to `discover-splits`. At least 1.
    pub splits: Option<u32>,
    /// Event time of each record, from CSV columns named by the header (see
    /// [`crate::event_time`]); `None`: records carry no timestamp.
    pub event_time: Option<EventTimeConfig>,
    /// Throttle: at most this many records per second per source instance, counted from
    /// its first read (demos and tests that need a job to run for a while), granted in
    /// whole batches ([`nop_stream_sdk::throttle`]). `None`: as fast as it reads. At
    /// least 1.
    pub max_records_per_second: Option<u64>,
}

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["path"],"properties":{"path":{"type":"string","description":"file to read, inside a granted directory"},"format":{"enum":["csv","jsonl"],"description":"default from the extension"},"header":{"type":"boolean","description":"skip the first line; default true for csv, false for jsonl"},"splits":{"type":"integer","minimum":1,"description":"number of byte-range splits; default the source parallelism"},"event_time":{"type":"object","additionalProperties":false,"required":["column","format"],"description":"csv with header only: give every record an event-time timestamp (ms since the Unix epoch) from a column","properties":{"column":{"type":"string","description":"header name of the column holding the time"},"format":{"enum":["rfc3339","epoch-ms","epoch-s","datetime"],"description":"rfc3339: 2013-01-01T10:00:00Z or with +HH:MM offset; epoch-ms: integer ms; epoch-s: seconds, optional fraction; datetime: naive 2013-01-01 10:00:00 taken as UTC"},"add_minutes_column":{"type":"string","description":"header name of an integer column of minutes added to the time (flights: minute)"}}},"max_records_per_second":{"type":"integer","minimum":1,"description":"throttle: at most this many records per second per source instance"}}}"#;

impl Config {
    /// Parses and validates the JSON config.
    ///
    /// # Errors
    /// Malformed JSON, unknown fields, `splits: 0`, no `format` and an extension that
    /// does not name one, or `event_time` without csv format and header.
    pub fn parse(json: &str) -> Result<Self, String> {
        let raw: Raw =
            serde_json::from_str(json).map_err(|e| format!("file-source config: {e}"))?;
        let format = match raw.format {
            Some(f) => f,
            None => {
                let ext = raw
                    .path
                    .rsplit_once('.')
                    .map(|(_, e)| e.to_ascii_lowercase());
                match ext.as_deref() {
                    Some("csv") => Format::Csv,
                    Some("jsonl" | "ndjson") => Format::Jsonl,
                    _ => {
                        return Err(format!(
                            "file-source config: cannot tell the format of {:?} from its extension; set \"format\" to \"csv\" or \"jsonl\"",
                            raw.path
                        ));
                    }
                }
            }
        };
        if raw.splits == Some(0) {
            return Err("file-source config: \"splits\" must be at least 1".into());
        }
        if raw.max_records_per_second == Some(0) {
            return Err("file-source config: \"max_records_per_second\" must be at least 1".into());
        }
        let header = raw.header.unwrap_or(format == Format::Csv);
        if raw.event_time.is_some() && (format != Format::Csv || !header) {
            return Err(
                "file-source config: \"event_time\" needs \"format\": \"csv\" and \"header\": true (its columns are named by the header line)".into(),
            );
        }
        Ok(Self {
            path: raw.path,
            format,
            header,
            splits: raw.splits,
            event_time: raw.event_time,
            max_records_per_second: raw.max_records_per_second,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_extension() {
        let c = Config::parse(r#"{"path":"/input/flights.csv"}"#).unwrap();
        assert_eq!((c.format, c.header, c.splits), (Format::Csv, true, None));
        let c = Config::parse(r#"{"path":"/input/x.jsonl","splits":3}"#).unwrap();
        assert_eq!(
            (c.format, c.header, c.splits),
            (Format::Jsonl, false, Some(3))
        );
        let c = Config::parse(r#"{"path":"/input/x.txt","format":"csv","header":false}"#).unwrap();
        assert_eq!((c.format, c.header), (Format::Csv, false));
    }

    #[test]
    fn rejects_bad_configs() {
        for bad in [
            "{}",
            r#"{"path":"/input/x.txt"}"#,
            r#"{"path":"/input/x.csv","splits":0}"#,
            r#"{"path":"/input/x.csv","colour":"red"}"#,
            r#"{"path":"/input/x.csv","format":"xml"}"#,
            r#"{"path":"/input/x.csv","event_time":{"column":"t"}}"#,
            r#"{"path":"/input/x.csv","event_time":{"column":"t","format":"epoch-s","y":1}}"#,
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        let schema: serde_json::Value = serde_json::from_str(CONFIG_SCHEMA).unwrap();
        assert_eq!(schema["required"][0], "path");
        assert_eq!(
            schema["properties"]["event_time"]["properties"]["format"]["enum"][1],
            "epoch-ms"
        );
    }

    #[test]
    fn event_time_needs_csv_with_header() {
        let et = r#""event_time":{"column":"time_hour","format":"rfc3339","add_minutes_column":"minute"}"#;
        let c = Config::parse(&format!(r#"{{"path":"/input/f.csv",{et}}}"#)).unwrap();
        let e = c.event_time.unwrap();
        assert_eq!(e.column, "time_hour");
        assert_eq!(e.format, crate::event_time::TimeFormat::Rfc3339);
        assert_eq!(e.add_minutes_column.as_deref(), Some("minute"));
        for bad in [
            format!(r#"{{"path":"/input/f.csv","header":false,{et}}}"#),
            format!(r#"{{"path":"/input/f.jsonl",{et}}}"#),
        ] {
            let err = Config::parse(&bad).unwrap_err();
            assert!(err.contains("\"event_time\" needs"), "{err}");
        }
    }
}
