//! `jetstream-source`: replays NATS JetStream streams by stream sequence (design §7.5, §16.1;
//! capability replayable). It reaches the server only through the host's
//! `nop:nats/jetstream` capability, on the connection the job file grants to its node; it
//! never sees the address or the password.
//!
//! Config (see [`config::Config`]):
//!
//! ```toml
//! config = { connection = "q", streams = ["FLIGHTS"], subject = "flights", bounded = true,
//!            event_time = { from = "publish-time" }, max_wait_ms = 100 }
//! ```
//!
//! # Splits and cursors
//! One split per stream, id `<stream>` (`<stream>?<subject>` with a subject filter). Its
//! descriptor ([`SplitDescriptor`], JSON) records the stream, the filter, the first
//! sequence to read (the stream's first sequence at discovery) and, bounded, the end
//! sequence: the stream's last sequence at discovery. The coordinator keeps descriptors in
//! the checkpoint, so a restored job reads exactly the same range. The cursor is the next
//! stream sequence to read (exclusive, design §6.4), `u64` little-endian; empty means the
//! descriptor's first sequence.
//!
//! A bounded split is finished when the cursor passes the end sequence, or when the server
//! reports no message matching the filter after the cursor (sequences up to the end
//! sequence all existed at discovery, so none can appear later). An unbounded split never
//! finishes.
//!
//! # Records
//! One record per message: its payload, unkeyed (one CSV line each for the flights
//! parser). Event time (optional) comes from the message's publish time, a CSV column of
//! the payload (the header given in the config), or a JSON field; a record whose value
//! does not parse fails the read with `invalid-record` naming stream and sequence, and the
//! cursor does not move past it.
//!
//! # Failures
//! A stream that does not exist, a connection not granted, bad credentials: the read (or
//! discovery) fails with the host's message, which names the connection and the stream.
//! Without a subject filter, a message missing right at the cursor because the stream was
//! trimmed past it fails loudly, with a `state` error that fails the job at once (no
//! restart brings the messages back, so the job's recoveries are not spent on it): it is
//! never skipped. Losing the server (connection errors, timeouts) makes reads return
//! nothing, cursor unchanged, for up to `retry_timeout_ms`; then the read fails.

pub mod config;
#[path = "../../file-source/src/event_time.rs"]
pub mod event_time;

use nop_stream_sdk::{
    Batch, LogLevel, PluginError, PluginInfo, Progress, ReadOutcome, Result, Source,
    SourceCapability, Split, TaskInfo, log,
};
use serde::{Deserialize, Serialize};

use crate::config::{CONFIG_SCHEMA, Config, EventTimeSpec};
use crate::event_time::EventTime;

#[allow(missing_docs, unsafe_code, clippy::all)]
mod wit {
    wit_bindgen::generate!({
        path: "../../wit/deps/nats",
        world: "imports",
    });
}

pub use wit::nop::nats::jetstream::{ErrorKind, Fetched, Message, NatsError, StreamState};

/// The host calls the source makes; the component uses `nop:nats/jetstream`, unit tests a
/// fake.
pub trait JetStream {
    /// `stream-info` of the capability.
    ///
    /// # Errors
    /// As the host reports them.
    fn stream_info(&mut self, connection: &str, stream: &str) -> Result<StreamState, NatsError>;

    /// `fetch` of the capability.
    ///
    /// # Errors
    /// As the host reports them.
    fn fetch(
        &mut self,
        connection: &str,
        stream: &str,
        filter: Option<&str>,
        start_seq: u64,
        max_messages: u32,
        max_wait_ms: u32,
    ) -> Result<Fetched, NatsError>;
}

/// [`JetStream`] through the host capability.
#[derive(Debug, Default)]
pub struct HostJetStream;

impl JetStream for HostJetStream {
    fn stream_info(&mut self, connection: &str, stream: &str) -> Result<StreamState, NatsError> {
        wit::nop::nats::jetstream::stream_info(connection, stream)
    }

    fn fetch(
        &mut self,
        connection: &str,
        stream: &str,
        filter: Option<&str>,
        start_seq: u64,
        max_messages: u32,
        max_wait_ms: u32,
    ) -> Result<Fetched, NatsError> {
        wit::nop::nats::jetstream::fetch(
            connection,
            stream,
            filter,
            start_seq,
            max_messages,
            max_wait_ms,
        )
    }
}

/// What a reader needs to read one split; compact JSON in the WIT `split.descriptor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitDescriptor {
    /// Stream name.
    pub stream: String,
    /// Subject filter, if any.
    pub subject: Option<String>,
    /// First sequence to read: the stream's first sequence at discovery (at least 1).
    pub start_seq: u64,
    /// Bounded: the last sequence to read (the stream's last at discovery; `start_seq - 1`
    /// for an empty stream). Unbounded: none.
    pub end_seq: Option<u64>,
}

impl SplitDescriptor {
    /// Encodes the descriptor as compact JSON.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a descriptor made by [`SplitDescriptor::encode`].
    ///
    /// # Errors
    /// The bytes are not a descriptor.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            PluginError::internal(format!("jetstream-source: malformed split descriptor: {e}"))
        })
    }
}

/// The split id of `stream` (with `subject`): `<stream>` or `<stream>?<subject>`.
#[must_use]
pub fn split_id(stream: &str, subject: Option<&str>) -> String {
    match subject {
        Some(s) => format!("{stream}?{s}"),
        None => stream.to_owned(),
    }
}

/// Encodes a cursor: the next stream sequence, `u64` little-endian.
#[must_use]
pub fn encode_cursor(seq: u64) -> Vec<u8> {
    seq.to_le_bytes().to_vec()
}

/// Decodes a cursor; empty means "the split's first sequence".
///
/// # Errors
/// A cursor that is neither empty nor 8 bytes.
pub fn decode_cursor(cursor: &[u8]) -> Result<Option<u64>> {
    if cursor.is_empty() {
        return Ok(None);
    }
    let bytes: [u8; 8] = cursor.try_into().map_err(|_| {
        PluginError::internal(format!(
            "cursor of {} bytes; jetstream-source cursors are 8 bytes (u64 little-endian)",
            cursor.len()
        ))
    })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// A host error as a plugin error: refusals are config errors, the rest I/O.
fn nats_err(e: NatsError) -> PluginError {
    let msg = format!("jetstream-source: {}", e.message);
    match e.kind {
        ErrorKind::Refused | ErrorKind::NotFound | ErrorKind::Auth => {
            PluginError::invalid_config(msg)
        }
        _ => PluginError::io(msg),
    }
}

/// Whether an error may go away by itself (the server restarting).
fn transient(e: &NatsError) -> bool {
    matches!(
        e.kind,
        ErrorKind::Connect | ErrorKind::Timeout | ErrorKind::Other
    )
}

/// The source instance over a [`JetStream`] implementation.
#[derive(Debug)]
pub struct JetStreamSource<J: JetStream = HostJetStream> {
    config: Config,
    js: J,
    event_time: Option<EventTime>,
    /// When reads started failing transiently, if they are.
    failing_since: Option<std::time::Instant>,
}

/// The start of a payload for error messages: at most 120 bytes, lossy UTF-8.
fn preview(p: &[u8]) -> String {
    const MAX: usize = 120;
    if p.len() <= MAX {
        String::from_utf8_lossy(p).into_owned()
    } else {
        format!("{}...", String::from_utf8_lossy(&p[..MAX]))
    }
}

/// The event time of a JSON payload's `field`.
fn json_time(payload: &[u8], field: &str, format: event_time::TimeFormat) -> Result<i64, String> {
    let v: serde_json::Value =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    let f = v
        .get(field)
        .ok_or_else(|| format!("event_time field {field:?} is missing"))?;
    let text = match f {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(format!("event_time field {field:?} is {other}, not a time")),
    };
    format
        .parse(text.as_bytes())
        .ok_or_else(|| format!("event_time field {field:?}: value {text:?} is not {format:?}"))
}

impl<J: JetStream> JetStreamSource<J> {
    /// A source over `js` with a parsed config.
    ///
    /// # Errors
    /// An `event_time` CSV header that does not name the configured columns.
    pub fn with(config: Config, js: J) -> Result<Self> {
        let event_time = match config.event_time.as_ref().and_then(|e| e.csv_config()) {
            Some((et, header)) => Some(
                EventTime::resolve(&et, header.as_bytes(), "the configured CSV header").map_err(
                    |e| PluginError::invalid_config(e.replace("file-source", "jetstream-source")),
                )?,
            ),
            None => None,
        };
        Ok(Self {
            config,
            js,
            event_time,
            failing_since: None,
        })
    }

    fn timestamp(&mut self, m: &Message) -> Result<Option<i64>, String> {
        Ok(match &self.config.event_time {
            None => None,
            Some(EventTimeSpec::PublishTime {}) => Some(m.published_ms),
            Some(EventTimeSpec::Csv { .. }) => match &mut self.event_time {
                Some(et) => Some(et.timestamp(&m.payload)?),
                None => None,
            },
            Some(EventTimeSpec::Json { field, format }) => {
                Some(json_time(&m.payload, field, *format)?)
            }
        })
    }

    /// A transient failure: nothing read, the cursor kept, until `retry_timeout_ms`.
    fn retry(&mut self, e: NatsError, cursor: &[u8], progress: Progress) -> Result<ReadOutcome> {
        let since = *self
            .failing_since
            .get_or_insert_with(std::time::Instant::now);
        let waited = since.elapsed().as_millis() as u64;
        if waited >= self.config.retry_timeout_ms {
            return Err(PluginError::io(format!(
                "jetstream-source: {} (reads kept failing for {waited} ms; retry_timeout_ms = {})",
                e.message, self.config.retry_timeout_ms
            )));
        }
        log(
            LogLevel::Warn,
            &format!("jetstream-source: {}; retrying", e.message),
        );
        Ok(ReadOutcome {
            next_cursor: cursor.to_vec(),
            finished: false,
            progress,
        })
    }
}

fn progress(d: &SplitDescriptor, next: u64) -> Progress {
    Progress {
        consumed: next.saturating_sub(d.start_seq),
        total: d.end_seq.map(|e| (e + 1).saturating_sub(d.start_seq)),
    }
}

impl<J: JetStream> JetStreamSource<J> {
    /// `discover-splits`: one split per configured stream.
    ///
    /// # Errors
    /// A stream that does not exist or cannot be asked about (the host's message).
    pub fn discover(&mut self) -> Result<Vec<Split>> {
        let mut out = Vec::new();
        for stream in &self.config.streams {
            let state = self
                .js
                .stream_info(&self.config.connection, stream)
                .map_err(nats_err)?;
            // An empty stream reports first = last + 1 (or 0 if it never held one).
            let start_seq = state.first_seq.max(1);
            let end_seq = self
                .config
                .bounded
                .then(|| state.last_seq.max(start_seq - 1));
            let subject = self.config.subject.clone();
            out.push(Split {
                id: split_id(stream, subject.as_deref()),
                descriptor: SplitDescriptor {
                    stream: stream.clone(),
                    subject,
                    start_seq,
                    end_seq,
                }
                .encode(),
            });
        }
        Ok(out)
    }

    /// `read`: up to `max_records` messages of `split` from `cursor`.
    ///
    /// # Errors
    /// See the crate documentation.
    pub fn read_split(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome> {
        let d = SplitDescriptor::decode(&split.descriptor)?;
        let next = decode_cursor(cursor)?.unwrap_or(d.start_seq);
        let done = |next: u64| ReadOutcome {
            next_cursor: encode_cursor(next),
            finished: true,
            progress: progress(&d, next),
        };
        let mut max = max_records.max(1);
        if let Some(end) = d.end_seq {
            if next > end {
                return Ok(done(next));
            }
            if d.subject.is_none() {
                // Sequences are dense up to `end`: never fetch past it.
                max = max.min(u32::try_from(end - next + 1).unwrap_or(u32::MAX));
            }
        }
        let fetched = match self.js.fetch(
            &self.config.connection,
            &d.stream,
            d.subject.as_deref(),
            next,
            max,
            self.config.max_wait_ms,
        ) {
            Ok(f) => f,
            Err(e) if transient(&e) => return self.retry(e, cursor, progress(&d, next)),
            Err(e) => return Err(nats_err(e)),
        };
        if self.failing_since.take().is_some() {
            log(
                LogLevel::Info,
                &format!("jetstream-source: stream `{}` reachable again", d.stream),
            );
        }
        if d.subject.is_none()
            && let Some(first) = fetched.messages.first()
            && first.stream_seq > next
        {
            // A gap at the cursor: deleted messages are fine, a trimmed stream is not.
            let state = self
                .js
                .stream_info(&self.config.connection, &d.stream)
                .map_err(nats_err)?;
            if state.first_seq > next {
                return Err(PluginError::state(format!(
                    "jetstream-source: stream `{}` no longer holds sequence {next} (its first is now {}): it was trimmed past the cursor; refusing to skip messages {next}..{}",
                    d.stream,
                    state.first_seq,
                    state.first_seq - 1
                )));
            }
        }
        let mut cursor_after = next;
        let mut past_end = false;
        for m in &fetched.messages {
            if m.stream_seq < cursor_after {
                // Already read (the host guarantees sequences from `next` on, increasing;
                // this keeps the cursor contract should it ever not).
                log(
                    LogLevel::Warn,
                    &format!(
                        "jetstream-source: stream `{}`: sequence {} delivered again below the cursor {cursor_after}; dropped",
                        d.stream, m.stream_seq
                    ),
                );
                continue;
            }
            if d.end_seq.is_some_and(|end| m.stream_seq > end) {
                past_end = true;
                break;
            }
            let ts = self.timestamp(m).map_err(|e| {
                PluginError::invalid_record(format!(
                    "jetstream-source: stream `{}` sequence {}: {e}; the record: {:?}",
                    d.stream,
                    m.stream_seq,
                    preview(&m.payload)
                ))
            })?;
            out.push_record(None, ts, &m.payload);
            cursor_after = m.stream_seq + 1;
        }
        let finished = match d.end_seq {
            None => false,
            Some(end) => {
                if past_end {
                    // Delivery is in sequence order: nothing matching lies before `end`.
                    cursor_after = end + 1;
                }
                cursor_after > end || fetched.pending == 0
            }
        };
        Ok(ReadOutcome {
            next_cursor: encode_cursor(cursor_after),
            finished,
            progress: progress(&d, cursor_after),
        })
    }
}

impl Source for JetStreamSource<HostJetStream> {
    fn describe() -> PluginInfo {
        PluginInfo::source("jetstream-source", "0.1.0")
            .description(
                "Replays NATS JetStream streams by stream sequence, one split per stream (bounded: up to the last sequence at discovery)",
            )
            .source_capability(SourceCapability::Replayable)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_task: &TaskInfo, config: &str) -> Result<Self> {
        let config = Config::parse(config).map_err(PluginError::invalid_config)?;
        Self::with(config, HostJetStream)
    }

    fn discover_splits(&mut self, _parallelism: u32) -> Result<Vec<Split>> {
        self.discover()
    }

    fn read(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome> {
        self.read_split(split, cursor, max_records, out)
    }

    fn close(&mut self) {}
}

nop_stream_sdk::export_source!(JetStreamSource<HostJetStream>);

#[cfg(test)]
mod tests;
