//! `redis-source`: replays Redis Streams, one split per stream key, from exclusive
//! entry-id cursors (design §7.5, §16.1; capability replayable). It reaches Redis only through
//! the host's `nop:redis/streams` capability, on the connection the job file grants to its
//! node; it never sees the address or the password.
//!
//! Config:
//!
//! ```toml
//! config = { connection = "redis", streams = ["flights"], field = "line", bounded = true,
//!            event_time = { from = "id" } }
//! ```
//!
//! - `connection` (required): a connection name granted to the node (`connections = [..]`).
//! - `streams` (required, at least one, distinct): stream keys; each is one split, id
//!   `redis:<key>`.
//! - `field`: the entry field whose value is the record (default `line`). An entry without
//!   it fails the read with `invalid-record` naming the stream and the entry id; the cursor
//!   does not move past it.
//! - `bounded` (default `true`): read each stream up to its last entry at discovery
//!   (recorded in the split descriptor, which the checkpoint keeps, so a restart reads to
//!   the same end), then finish. `false`: keep reading; the split never finishes.
//! - `event_time` (default none: no timestamps): `{ from = "id" }` stamps each record with
//!   the millisecond part of its entry id (the time Redis added it, for `*` ids);
//!   `{ from = "field", field = "ts", format = "epoch-ms" | "epoch-s" }` with an integer
//!   field of the entry. Watermarks come from the job file's `watermarks` as for any
//!   source.
//! - `read_count`: entries per XRANGE call, at most the host's `max-records` per read
//!   (default 1,000).
//!
//! # Cursors (design §6.4)
//!
//! The cursor is `<id>@<added>`: the id of the last entry returned and `added`, the
//! number of entries ever added to the stream up to and including it (see below);
//! reading continues with `XRANGE key (<id> ...`, which is exclusive, so no entry
//! repeats. The empty cursor means the split's start: `start_after`, the id just below the
//! first entry present at discovery (or the stream's last generated id if it was empty
//! then), with `start_added` = `entries-added - length` at discovery.
//!
//! # Trimmed streams fail loudly
//!
//! An entry after the cursor that is deleted before it is read would be skipped silently.
//! Before every read, with `next` the smallest id above the cursor and the stream's
//! `XINFO STREAM` figures (Redis 7):
//!
//! 1. XDEL records the largest id it ever deleted in `max-deleted-entry-id`. If it is at
//!    or above `next`, an unread entry was deleted: the read fails.
//! 2. XTRIM (and XADD with MAXLEN/MINID) removes a prefix of the stream and does not move
//!    `max-deleted-entry-id`. If the first entry is still at or below the cursor, no entry
//!    above it was trimmed. Otherwise every entry present is above the cursor, so
//!    `entries-added - added` entries were added after the cursor and `length` remain; if
//!    fewer remain, some were trimmed (or deleted): the read fails.
//! 3. `entries-added` below `added`: the key was deleted and created anew: the read fails.
//!    A key that no longer exists after entries were read fails too.
//!
//! Each failure is a `state` error naming the stream and the read position: the restored
//! cursor cannot be honoured, and no restart can bring the entries back, so the task
//! fails at once, without the job's recoveries (an `io` error would be retried first, up
//! to `max_restarts` times). Deleting entries at or below the cursor is harmless. The
//! rules never skip; they are
//! conservative for a stream that had an entry deleted from its middle before the job
//! started (rule 1 fails at the first read, as its entries cannot be told from lost ones)
//! and assume nobody rewrites `entries-added` or `max-deleted-entry-id` with XSETID.
//!
//! # Progress
//!
//! Units are milliseconds of entry-id time: consumed is the cursor's time minus the
//! start's; total (bounded only) the last entry's minus the start's.

use nop_stream_sdk::{
    Batch, PluginError, PluginInfo, Progress, ReadOutcome, Result, Source, SourceCapability, Split,
    TaskInfo,
};
use serde::{Deserialize, Serialize};

#[allow(missing_docs, unsafe_code, clippy::all)]
mod wit {
    wit_bindgen::generate!({
        path: "../../wit/deps/redis",
        world: "imports",
    });
}

use wit::nop::redis::streams::{self as rs, RedisError, StreamInfo};

/// JSON Schema of the config, reported by `describe()`.
pub const CONFIG_SCHEMA: &str = r#"{"type":"object","additionalProperties":false,"required":["connection","streams"],"properties":{"connection":{"type":"string","description":"a connection granted to the node"},"streams":{"type":"array","minItems":1,"items":{"type":"string"},"description":"stream keys, one split each"},"field":{"type":"string","default":"line","description":"entry field holding the record"},"bounded":{"type":"boolean","default":true,"description":"stop at the last entry present at discovery"},"event_time":{"type":"object","additionalProperties":false,"required":["from"],"properties":{"from":{"enum":["id","field"]},"field":{"type":"string"},"format":{"enum":["epoch-ms","epoch-s"]}}},"read_count":{"type":"integer","minimum":1,"default":1000}}}"#;

/// Where a record's event time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum TimeSource {
    /// The millisecond part of the entry id.
    Id,
    /// An integer field of the entry.
    Field,
}

/// Unit of an event-time field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
enum TimeFormat {
    #[default]
    EpochMs,
    EpochS,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventTimeConfig {
    from: TimeSource,
    field: Option<String>,
    #[serde(default)]
    format: TimeFormat,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    connection: String,
    streams: Vec<String>,
    #[serde(default = "default_field")]
    field: String,
    #[serde(default = "default_bounded")]
    bounded: bool,
    event_time: Option<EventTimeConfig>,
    #[serde(default = "default_read_count")]
    read_count: u32,
}

fn default_field() -> String {
    "line".into()
}

fn default_bounded() -> bool {
    true
}

fn default_read_count() -> u32 {
    1000
}

fn parse_config(json: &str) -> Result<Config> {
    let bad = |m: String| PluginError::invalid_config(format!("redis-source config: {m}"));
    let c: Config = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    if c.streams.is_empty() {
        return Err(bad("\"streams\" must name at least one stream key".into()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for s in &c.streams {
        if s.is_empty() || !seen.insert(s) {
            return Err(bad(format!(
                "stream key {s:?} is empty or listed twice in \"streams\""
            )));
        }
    }
    if c.read_count == 0 {
        return Err(bad("\"read_count\" must be at least 1".into()));
    }
    if let Some(et) = &c.event_time {
        match (et.from, &et.field) {
            (TimeSource::Field, None) => {
                return Err(bad(
                    "\"event_time\" with from = \"field\" needs \"field\" (the entry field holding the time)".into(),
                ));
            }
            (TimeSource::Id, Some(_)) => {
                return Err(bad(
                    "\"event_time\" with from = \"id\" takes no \"field\"".into()
                ));
            }
            _ => {}
        }
    }
    Ok(c)
}

/// What a split needs to be read; JSON in the split descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitDescriptor {
    /// Stream key.
    pub key: String,
    /// The empty cursor's meaning: entries above this id are the split's.
    pub start_after: String,
    /// Entries ever added to the stream up to `start_after` (`entries-added - length` at
    /// discovery).
    pub start_added: u64,
    /// Bounded: the last entry at discovery (`None`: the stream was empty, nothing to read).
    /// Unbounded: `None` and never finished.
    pub last: Option<String>,
    /// Whether the split ends at `last`.
    pub bounded: bool,
}

/// An entry id as `(ms, seq)`.
///
/// # Errors
/// Not `<u64>-<u64>`.
pub fn parse_id(id: &str) -> std::result::Result<(u64, u64), String> {
    let bad = || format!("`{id}` is not a stream entry id");
    let (a, b) = id.split_once('-').ok_or_else(bad)?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|x| x.is_ascii_digit());
    if !digits(a) || !digits(b) {
        return Err(bad());
    }
    Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
}

/// The smallest id above `(ms, seq)`; `None` above the largest id.
pub fn successor((ms, seq): (u64, u64)) -> Option<(u64, u64)> {
    match seq.checked_add(1) {
        Some(s) => Some((ms, s)),
        None => Some((ms.checked_add(1)?, 0)),
    }
}

/// The largest id below `(ms, seq)` (`0-0` stays `0-0`).
pub fn predecessor((ms, seq): (u64, u64)) -> (u64, u64) {
    match (ms, seq) {
        (0, 0) => (0, 0),
        (m, 0) => (m - 1, u64::MAX),
        (m, s) => (m, s - 1),
    }
}

fn fmt_id((ms, seq): (u64, u64)) -> String {
    format!("{ms}-{seq}")
}

/// A read position: the last id returned and the entries ever added up to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Entry id `(ms, seq)`.
    pub id: (u64, u64),
    /// Entries ever added to the stream with ids up to `id`.
    pub added: u64,
}

impl Position {
    /// `<ms>-<seq>@<added>`.
    pub fn encode(&self) -> Vec<u8> {
        format!("{}@{}", fmt_id(self.id), self.added).into_bytes()
    }

    /// Parses [`Position::encode`]'s form.
    ///
    /// # Errors
    /// Anything else.
    pub fn decode(cursor: &[u8]) -> std::result::Result<Self, String> {
        let text = std::str::from_utf8(cursor).map_err(|_| "cursor is not UTF-8".to_owned())?;
        let (id, added) = text
            .split_once('@')
            .ok_or_else(|| format!("cursor {text:?} is not `<id>@<added>`"))?;
        Ok(Position {
            id: parse_id(id)?,
            added: added
                .parse()
                .map_err(|_| format!("cursor {text:?} is not `<id>@<added>`"))?,
        })
    }
}

/// The trim rules (see the module docs): reading above `pos` is safe unless an entry
/// above it was deleted. `info` is `None` when the key does not exist; `had_entries` says
/// whether the split ever had entries to read (a key that never existed is empty).
///
/// # Errors
/// A message naming the stream, the position and what was lost.
pub fn check_not_trimmed(
    key: &str,
    pos: Position,
    info: Option<&StreamInfo>,
    had_entries: bool,
) -> std::result::Result<(), String> {
    let at = fmt_id(pos.id);
    let Some(info) = info else {
        if had_entries {
            return Err(format!(
                "stream `{key}` no longer exists (deleted?) but entries after {at} were not read yet; refusing to skip them"
            ));
        }
        return Ok(());
    };
    let Some(next) = successor(pos.id) else {
        return Ok(());
    };
    let id_or_zero = |s: &str| parse_id(if s.is_empty() { "0-0" } else { s });
    let deleted = id_or_zero(&info.max_deleted_id)?;
    let first = id_or_zero(&info.first_id)?;
    let first_text = if info.first_id.is_empty() {
        "none"
    } else {
        &info.first_id
    };
    if deleted >= next {
        return Err(format!(
            "stream `{key}` was trimmed past the read position: entry {} was deleted (max-deleted-entry-id) but entries after {at} were not read yet (first entry now: {first_text}); refusing to skip them — restore the stream or start the job afresh",
            info.max_deleted_id
        ));
    }
    if info.entries_added < pos.added {
        return Err(format!(
            "stream `{key}` was deleted and created anew: it counts {} entries ever added, but {} had been added up to the read position {at}; refusing to read it as the same stream",
            info.entries_added, pos.added
        ));
    }
    if info.length == 0 || first > pos.id {
        let after = info.entries_added - pos.added;
        if after > info.length {
            return Err(format!(
                "stream `{key}` was trimmed past the read position: {after} entries were added after {at} but only {} remain (first entry now: {first_text}); refusing to skip them — restore the stream or start the job afresh",
                info.length
            ));
        }
    }
    Ok(())
}

fn redis_err(what: &str, e: RedisError) -> PluginError {
    let msg = format!("redis-source: {what}: {}", e.message);
    match e.kind {
        rs::ErrorKind::Refused => PluginError::invalid_config(msg),
        _ => PluginError::io(msg),
    }
}

/// The source instance.
#[derive(Debug)]
pub struct RedisSource {
    cfg: Config,
}

fn ms_since(id: (u64, u64), start: (u64, u64)) -> u64 {
    id.0.saturating_sub(start.0)
}

impl Source for RedisSource {
    fn describe() -> PluginInfo {
        PluginInfo::source("redis-source", "0.1.0")
            .description("Replays Redis Streams (one split per key) from exclusive entry-id cursors; fails loudly on a stream trimmed past its cursor")
            .source_capability(SourceCapability::Replayable)
            .config_schema(CONFIG_SCHEMA)
    }

    fn open(_task: &TaskInfo, config: &str) -> Result<Self> {
        Ok(RedisSource {
            cfg: parse_config(config)?,
        })
    }

    fn discover_splits(&mut self, _parallelism: u32) -> Result<Vec<Split>> {
        let mut out = Vec::with_capacity(self.cfg.streams.len());
        for key in &self.cfg.streams {
            let info = rs::info(&self.cfg.connection, key)
                .map_err(|e| redis_err(&format!("stream `{key}`"), e))?;
            if info.is_none() && self.cfg.bounded {
                return Err(PluginError::invalid_config(format!(
                    "redis-source: stream `{key}` does not exist on connection `{}` (a bounded source reads what is there at start)",
                    self.cfg.connection
                )));
            }
            let (start_after, last) = match &info {
                Some(i) if i.length > 0 => {
                    let first = parse_id(&i.first_id).map_err(PluginError::internal)?;
                    (
                        fmt_id(predecessor(first)),
                        self.cfg.bounded.then(|| i.last_id.clone()),
                    )
                }
                Some(i) => (i.last_generated_id.clone(), None),
                None => ("0-0".to_owned(), None),
            };
            let start_added = info
                .as_ref()
                .map_or(0, |i| i.entries_added.saturating_sub(i.length));
            let d = SplitDescriptor {
                key: key.clone(),
                start_after,
                start_added,
                last,
                bounded: self.cfg.bounded,
            };
            out.push(Split {
                id: format!("redis:{key}"),
                descriptor: serde_json::to_vec(&d)
                    .map_err(|e| PluginError::internal(e.to_string()))?,
            });
        }
        Ok(out)
    }

    fn read(
        &mut self,
        split: &Split,
        cursor: &[u8],
        max_records: u32,
        out: &mut Batch,
    ) -> Result<ReadOutcome> {
        let d: SplitDescriptor = serde_json::from_slice(&split.descriptor)
            .map_err(|e| PluginError::internal(format!("redis-source: split descriptor: {e}")))?;
        let key = &d.key;
        let start = parse_id(&d.start_after).map_err(PluginError::internal)?;
        let at = if cursor.is_empty() {
            Position {
                id: start,
                added: d.start_added,
            }
        } else {
            Position::decode(cursor)
                .map_err(|m| PluginError::internal(format!("redis-source: {m}")))?
        };
        let pos = at.id;
        let position = fmt_id(pos);
        let last = match &d.last {
            Some(l) => Some(parse_id(l).map_err(PluginError::internal)?),
            None => None,
        };
        let progress = |at: (u64, u64)| Progress {
            consumed: ms_since(at, start),
            total: if d.bounded {
                Some(last.map_or(0, |l| ms_since(l, start)))
            } else {
                None
            },
        };
        if d.bounded && last.is_none_or(|l| pos >= l) {
            return Ok(ReadOutcome {
                next_cursor: cursor.to_vec(),
                finished: true,
                progress: progress(last.unwrap_or(pos)),
            });
        }
        let conn = &self.cfg.connection;
        let info = rs::info(conn, key).map_err(|e| redis_err(&format!("stream `{key}`"), e))?;
        let had_entries = last.is_some() || pos > start;
        check_not_trimmed(key, at, info.as_ref(), had_entries)
            .map_err(|m| PluginError::state(format!("redis-source: {m}")))?;
        let count = max_records.min(self.cfg.read_count).max(1);
        let until = d.last.clone().unwrap_or_default();
        let entries = rs::range(conn, key, &position, &until, count)
            .map_err(|e| redis_err(&format!("reading stream `{key}`"), e))?;
        let mut next = pos;
        let mut added = at.added;
        for e in &entries {
            let id = parse_id(&e.id).map_err(PluginError::internal)?;
            let Some((_, value)) = e.fields.iter().find(|(f, _)| *f == self.cfg.field) else {
                out.truncate(0);
                return Err(PluginError::invalid_record(format!(
                    "redis-source: stream `{key}` entry {} has no field {:?} (fields: {})",
                    e.id,
                    self.cfg.field,
                    e.fields
                        .iter()
                        .map(|(f, _)| format!("{f:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            let ts = match &self.cfg.event_time {
                None => None,
                Some(et) if et.from == TimeSource::Id => {
                    Some(i64::try_from(id.0).map_err(|_| {
                        PluginError::invalid_record(format!(
                            "redis-source: stream `{key}` entry {}: id time overflows a timestamp",
                            e.id
                        ))
                    })?)
                }
                Some(et) => {
                    let name = et.field.as_deref().unwrap_or_default();
                    let raw = e.fields.iter().find(|(f, _)| f == name).map(|(_, v)| v);
                    let parsed = raw
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .and_then(|n| match et.format {
                            TimeFormat::EpochMs => Some(n),
                            TimeFormat::EpochS => n.checked_mul(1000),
                        });
                    match parsed {
                        Some(t) => Some(t),
                        None => {
                            out.truncate(0);
                            return Err(PluginError::invalid_record(format!(
                                "redis-source: stream `{key}` entry {}: event_time field {name:?} is {} (expected an integer, {})",
                                e.id,
                                raw.map_or("missing".to_owned(), |v| format!(
                                    "{:?}",
                                    String::from_utf8_lossy(v)
                                )),
                                if et.format == TimeFormat::EpochMs {
                                    "ms"
                                } else {
                                    "s"
                                }
                            )));
                        }
                    }
                }
            };
            out.push_record(None, ts, value);
            next = id;
            added += 1;
        }
        let finished = d.bounded && last.is_none_or(|l| next >= l);
        Ok(ReadOutcome {
            next_cursor: if next == pos {
                cursor.to_vec()
            } else {
                Position { id: next, added }.encode()
            },
            finished,
            progress: progress(next),
        })
    }
}

nop_stream_sdk::export_source!(RedisSource);

#[cfg(test)]
mod tests {
    use super::*;

    fn info(first: &str, max_deleted: &str) -> StreamInfo {
        StreamInfo {
            length: 1,
            first_id: first.into(),
            last_id: "100-0".into(),
            last_generated_id: "100-0".into(),
            max_deleted_id: max_deleted.into(),
            entries_added: 10,
        }
    }

    #[test]
    fn ids_successors_and_predecessors() {
        assert_eq!(successor((5, 3)), Some((5, 4)));
        assert_eq!(successor((5, u64::MAX)), Some((6, 0)));
        assert_eq!(successor((u64::MAX, u64::MAX)), None);
        assert_eq!(predecessor((5, 0)), (4, u64::MAX));
        assert_eq!(predecessor((5, 2)), (5, 1));
        assert_eq!(predecessor((0, 0)), (0, 0));
        assert!(parse_id("1-x").is_err() && parse_id("12").is_err());
    }

    fn at(id: &str, added: u64) -> Position {
        Position {
            id: parse_id(id).unwrap(),
            added,
        }
    }

    /// A stream whose first entry is `first`, `length` entries present, `added` ever added.
    fn stream(first: &str, length: u64, added: u64, max_deleted: &str) -> StreamInfo {
        StreamInfo {
            length,
            entries_added: added,
            ..info(first, max_deleted)
        }
    }

    #[test]
    fn an_xdel_above_the_cursor_fails_and_one_at_or_below_does_not() {
        // 10 entries 1-0..10-0 were added; the cursor is at 5-0 (5 added up to it).
        for (cursor, deleted) in [("5-0", "0-0"), ("5-0", "5-0"), ("5-0", "2-0")] {
            assert!(
                check_not_trimmed(
                    "s",
                    at(cursor, 5),
                    Some(&stream("1-0", 9, 10, deleted)),
                    true
                )
                .is_ok(),
                "{cursor} {deleted}"
            );
        }
        for (cursor, deleted) in [
            ("5-0", "5-1"),
            ("5-0", "9-0"),
            ("4-18446744073709551615", "5-0"),
        ] {
            let e = check_not_trimmed(
                "flights",
                at(cursor, 5),
                Some(&stream("1-0", 9, 10, deleted)),
                true,
            )
            .unwrap_err();
            assert!(
                e.contains("stream `flights` was trimmed past the read position")
                    && e.contains(deleted)
                    && e.contains(cursor),
                "{e}"
            );
        }
    }

    #[test]
    fn an_xtrim_past_the_cursor_fails_and_one_up_to_it_does_not() {
        // 10 entries 1-0..10-0 added; cursor at 5-0 (5 added up to it).
        // Trimmed up to the cursor: 6-0..10-0 remain; fine. So is a sparse id gap.
        assert!(
            check_not_trimmed("s", at("5-0", 5), Some(&stream("6-0", 5, 10, "0-0")), true).is_ok()
        );
        assert!(
            check_not_trimmed("s", at("5-0", 5), Some(&stream("9-0", 5, 10, "0-0")), true).is_ok()
        );
        // Not trimmed at all (first entry below the cursor).
        assert!(
            check_not_trimmed("s", at("5-0", 5), Some(&stream("1-0", 10, 10, "0-0")), true).is_ok()
        );
        // Trimmed past it: 7-0..10-0 remain, 6-0 is gone.
        let e = check_not_trimmed(
            "flights",
            at("5-0", 5),
            Some(&stream("7-0", 4, 10, "0-0")),
            true,
        )
        .unwrap_err();
        assert!(
            e.contains("stream `flights` was trimmed past the read position: 5 entries were added after 5-0 but only 4 remain"),
            "{e}"
        );
        // Everything trimmed (MAXLEN 0).
        assert!(
            check_not_trimmed("s", at("5-0", 5), Some(&stream("", 0, 10, "0-0")), true).is_err()
        );
        assert!(
            check_not_trimmed("s", at("10-0", 10), Some(&stream("", 0, 10, "0-0")), true).is_ok()
        );
        // Deleted and created anew.
        let e = check_not_trimmed("s", at("5-0", 5), Some(&stream("20-0", 2, 2, "0-0")), true)
            .unwrap_err();
        assert!(e.contains("created anew"), "{e}");
        // A stream that vanished after it had entries to read fails; one that never
        // existed (unbounded, empty) does not.
        assert!(check_not_trimmed("s", at("5-3", 5), None, true).is_err());
        assert!(check_not_trimmed("s", at("0-0", 0), None, false).is_ok());
        // Cursors round-trip.
        assert_eq!(
            Position::decode(&at("5-3", 7).encode()).unwrap(),
            at("5-3", 7)
        );
        assert!(Position::decode(b"5-3").is_err());
    }

    #[test]
    fn configs_are_checked() {
        assert!(parse_config(r#"{"connection":"r","streams":["a"]}"#).is_ok());
        let c = parse_config(r#"{"connection":"r","streams":["a","b"],"field":"v","bounded":false,"event_time":{"from":"field","field":"ts","format":"epoch-s"}}"#).unwrap();
        assert_eq!(
            (c.field.as_str(), c.bounded, c.read_count),
            ("v", false, 1000)
        );
        for bad in [
            r#"{"connection":"r","streams":[]}"#,
            r#"{"connection":"r","streams":["a","a"]}"#,
            r#"{"connection":"r","streams":[""]}"#,
            r#"{"streams":["a"]}"#,
            r#"{"connection":"r","streams":["a"],"x":1}"#,
            r#"{"connection":"r","streams":["a"],"read_count":0}"#,
            r#"{"connection":"r","streams":["a"],"event_time":{"from":"field"}}"#,
            r#"{"connection":"r","streams":["a"],"event_time":{"from":"id","field":"x"}}"#,
        ] {
            assert!(parse_config(bad).is_err(), "{bad}");
        }
        let info = RedisSource::describe();
        assert_eq!(info.source_capability, Some(SourceCapability::Replayable));
        serde_json::from_str::<serde_json::Value>(&info.config_schema).unwrap();
    }
}
