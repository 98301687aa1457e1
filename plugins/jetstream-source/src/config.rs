//! The `config` object of `jetstream-source`.

use serde::Deserialize;

use crate::event_time::{EventTimeConfig, TimeFormat};

/// Where a record's event time comes from.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "from", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EventTimeSpec {
    /// The time the server stored the message (ms since the Unix epoch).
    PublishTime {},
    /// A column of a CSV payload (one line per message), named by `header`, the CSV
    /// header line of the data (messages carry none); as file-source's `event_time`.
    Csv {
        /// The header line naming the columns, e.g. `year,month,day,...`.
        header: String,
        /// Column holding the time.
        column: String,
        /// How it is written.
        format: TimeFormat,
        /// Column of whole minutes added to the time (flights: `minute`).
        #[serde(default)]
        add_minutes_column: Option<String>,
    },
    /// A top-level field of a JSON object payload: a string in `format`, or a number for
    /// `epoch-ms` / `epoch-s`.
    Json {
        /// Field name.
        field: String,
        /// How it is written.
        format: TimeFormat,
    },
}

impl EventTimeSpec {
    /// The file-source config of a `csv` spec.
    #[must_use]
    pub fn csv_config(&self) -> Option<(EventTimeConfig, &str)> {
        match self {
            EventTimeSpec::Csv {
                header,
                column,
                format,
                add_minutes_column,
            } => Some((
                EventTimeConfig {
                    column: column.clone(),
                    format: *format,
                    add_minutes_column: add_minutes_column.clone(),
                },
                header.as_str(),
            )),
            _ => None,
        }
    }
}

/// `{ "connection": "q", "streams": ["FLIGHTS"], "subject": "flights.>", "bounded": true,
/// "event_time": {..}, "max_wait_ms": 100, "retry_timeout_ms": 60000 }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// A `nats` connection granted to the source node (`connections = [..]`). Required.
    pub connection: String,
    /// Streams to read, one split each, in this order. Required, non-empty, no repeats.
    pub streams: Vec<String>,
    /// Only messages whose subject matches this filter (`*`, `>` wildcards); default:
    /// every message of the stream.
    #[serde(default)]
    pub subject: Option<String>,
    /// `true` (default): read up to the stream's last sequence at discovery and finish,
    /// the same range after every restart. `false`: keep reading new messages.
    #[serde(default = "yes")]
    pub bounded: bool,
    /// Event time of each record; default: none.
    #[serde(default)]
    pub event_time: Option<EventTimeSpec>,
    /// How long one read waits on the server when no message is stored, in ms. Default
    /// 100 (the host caps it at its `nats_max_wait_ms`). A barrier waits behind a read.
    #[serde(default = "default_wait")]
    pub max_wait_ms: u32,
    /// How long reads may keep failing to reach the server (connection lost, timeouts)
    /// before the source fails its task, in ms; meanwhile reads return nothing and keep
    /// the cursor. Default 60,000.
    #[serde(default = "default_retry")]
    pub retry_timeout_ms: u64,
}

fn yes() -> bool {
    true
}

fn default_wait() -> u32 {
    100
}

fn default_retry() -> u64 {
    60_000
}

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["connection","streams"],"properties":{"connection":{"type":"string","description":"a nats connection granted to the source"},"streams":{"type":"array","minItems":1,"uniqueItems":true,"items":{"type":"string"},"description":"JetStream streams, one split each"},"subject":{"type":"string","description":"subject filter; default every message"},"bounded":{"type":"boolean","default":true,"description":"stop at the last sequence seen at discovery"},"event_time":{"type":"object","required":["from"],"properties":{"from":{"enum":["publish-time","csv","json"]},"header":{"type":"string"},"column":{"type":"string"},"field":{"type":"string"},"format":{"enum":["rfc3339","epoch-ms","epoch-s","datetime"]},"add_minutes_column":{"type":"string"}}},"max_wait_ms":{"type":"integer","minimum":0,"default":100},"retry_timeout_ms":{"type":"integer","minimum":0,"default":60000}}}"#;

/// Stream names the server accepts: no whitespace, `.`, `*`, `>`, path separators.
fn valid_stream(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
}

impl Config {
    /// Parses and validates the JSON config.
    ///
    /// # Errors
    /// Malformed JSON, unknown fields, a missing or empty `connection` or `streams`, a
    /// repeated or invalid stream name, an empty `subject`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let c: Config =
            serde_json::from_str(json).map_err(|e| format!("jetstream-source config: {e}"))?;
        if c.connection.is_empty() {
            return Err("jetstream-source config: \"connection\" is empty".into());
        }
        if c.streams.is_empty() {
            return Err("jetstream-source config: \"streams\" names no stream".into());
        }
        for (i, s) in c.streams.iter().enumerate() {
            if !valid_stream(s) {
                return Err(format!(
                    "jetstream-source config: \"streams\"[{i}] = {s:?} is not a stream name (no spaces, '.', '*', '>', '/')"
                ));
            }
            if c.streams[..i].contains(s) {
                return Err(format!(
                    "jetstream-source config: stream {s:?} is listed twice"
                ));
            }
        }
        if c.subject.as_deref().is_some_and(str::is_empty) {
            return Err(
                "jetstream-source config: \"subject\" is empty; leave it out to read every subject"
                    .into(),
            );
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_event_time_forms() {
        let c = Config::parse(r#"{"connection":"q","streams":["FLIGHTS"]}"#).unwrap();
        assert!(c.bounded && c.subject.is_none() && c.event_time.is_none());
        assert_eq!((c.max_wait_ms, c.retry_timeout_ms), (100, 60_000));
        let c = Config::parse(
            r#"{"connection":"q","streams":["A","B"],"subject":"a.>","bounded":false,"event_time":{"from":"publish-time"}}"#,
        )
        .unwrap();
        assert_eq!(c.event_time, Some(EventTimeSpec::PublishTime {}));
        let c = Config::parse(
            r#"{"connection":"q","streams":["A"],"event_time":{"from":"csv","header":"a,t","column":"t","format":"epoch-ms"}}"#,
        )
        .unwrap();
        let (et, header) = c.event_time.as_ref().unwrap().csv_config().unwrap();
        assert_eq!((et.column.as_str(), header), ("t", "a,t"));
        let c = Config::parse(
            r#"{"connection":"q","streams":["A"],"event_time":{"from":"json","field":"ts","format":"epoch-s"}}"#,
        )
        .unwrap();
        assert!(matches!(c.event_time, Some(EventTimeSpec::Json { .. })));
    }

    #[test]
    fn rejects_bad_configs() {
        for bad in [
            "{}",
            r#"{"connection":"q"}"#,
            r#"{"connection":"","streams":["A"]}"#,
            r#"{"connection":"q","streams":[]}"#,
            r#"{"connection":"q","streams":["A","A"]}"#,
            r#"{"connection":"q","streams":["a.b"]}"#,
            r#"{"connection":"q","streams":["A"],"subject":""}"#,
            r#"{"connection":"q","streams":["A"],"colour":1}"#,
            r#"{"connection":"q","streams":["A"],"event_time":{"from":"csv","column":"t","format":"epoch-ms"}}"#,
            r#"{"connection":"q","streams":["A"],"event_time":{"from":"publish-time","x":1}}"#,
            r#"{"connection":"q","streams":["A"],"event_time":{"from":"sundial"}}"#,
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        let schema: serde_json::Value = serde_json::from_str(CONFIG_SCHEMA).unwrap();
        assert_eq!(schema["required"][1], "streams");
    }
}
