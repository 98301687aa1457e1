//! The source over an in-memory JetStream: splits, cursors, bounded ends, filters, event
//! time, trimming and transient failures.

use super::*;
use std::collections::BTreeMap;

/// One stream: sequence -> (subject, payload); `first` is the first sequence kept.
#[derive(Debug, Default)]
struct FakeStream {
    messages: BTreeMap<u64, (String, Vec<u8>)>,
    last: u64,
}

#[derive(Debug, Default)]
struct Fake {
    streams: BTreeMap<String, FakeStream>,
    /// Fail this many fetches with a connect error first.
    fail_next: u32,
    fetches: u32,
}

fn matches(filter: Option<&str>, subject: &str) -> bool {
    match filter {
        None => true,
        Some(f) if f.ends_with(".>") => subject.starts_with(&f[..f.len() - 1]),
        Some(f) => f == subject,
    }
}

impl Fake {
    fn publish(&mut self, stream: &str, subject: &str, payload: &str) -> u64 {
        let s = self.streams.entry(stream.into()).or_default();
        s.last += 1;
        s.messages
            .insert(s.last, (subject.into(), payload.as_bytes().to_vec()));
        s.last
    }
}

impl JetStream for Fake {
    fn stream_info(&mut self, connection: &str, stream: &str) -> Result<StreamState, NatsError> {
        let s = self.streams.get(stream).ok_or_else(|| NatsError {
            kind: ErrorKind::NotFound,
            message: format!("connection `{connection}`: stream `{stream}`: stream not found"),
        })?;
        Ok(StreamState {
            first_seq: s.messages.keys().next().copied().unwrap_or(s.last + 1),
            last_seq: s.last,
            messages: s.messages.len() as u64,
        })
    }

    fn fetch(
        &mut self,
        connection: &str,
        stream: &str,
        filter: Option<&str>,
        start_seq: u64,
        max_messages: u32,
        _max_wait_ms: u32,
    ) -> Result<Fetched, NatsError> {
        self.fetches += 1;
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(NatsError {
                kind: ErrorKind::Connect,
                message: format!("connection `{connection}`: disconnected"),
            });
        }
        let s = &self.streams[stream];
        let all: Vec<_> = s
            .messages
            .range(start_seq..)
            .filter(|(_, (subj, _))| matches(filter, subj))
            .collect();
        let take = all.len().min(max_messages as usize);
        Ok(Fetched {
            messages: all[..take]
                .iter()
                .map(|(seq, (subject, payload))| Message {
                    stream_seq: **seq,
                    subject: subject.clone(),
                    payload: payload.clone(),
                    published_ms: 1_000 * **seq as i64,
                })
                .collect(),
            pending: (all.len() - take) as u64,
        })
    }
}

fn source(fake: Fake, extra: &str) -> JetStreamSource<Fake> {
    let config = Config::parse(&format!(r#"{{"connection":"q","streams":["S"]{extra}}}"#)).unwrap();
    JetStreamSource::with(config, fake).unwrap()
}

/// Reads a split to its end, `max` per call, on a fresh instance every other call (the
/// cursor is all that carries over).
fn read_all(make: &dyn Fn() -> JetStreamSource<Fake>, split: &Split, max: u32) -> Vec<String> {
    let mut got = Vec::new();
    let mut cursor = Vec::new();
    let mut src = make();
    for call in 0.. {
        assert!(call < 10_000, "never finished");
        if call % 2 == 1 {
            src = make();
        }
        let mut out = Batch::default();
        let r = src.read_split(split, &cursor, max, &mut out).unwrap();
        assert!(out.len() <= max as usize);
        got.extend(
            out.iter()
                .map(|r| String::from_utf8(r.data.to_vec()).unwrap()),
        );
        cursor = r.next_cursor;
        if r.finished {
            let p = r.progress;
            assert_eq!(Some(p.consumed), p.total);
            break;
        }
    }
    got
}

fn fake_with(n: u64) -> Fake {
    let mut f = Fake::default();
    for i in 1..=n {
        f.publish(
            "S",
            if i % 3 == 0 { "b.x" } else { "a.x" },
            &format!("m{i}"),
        );
    }
    f
}

#[test]
fn bounded_split_ends_at_the_last_sequence_seen_at_discovery() {
    let mut src = source(fake_with(10), "");
    let splits = src.discover().unwrap();
    assert_eq!(splits.len(), 1);
    assert_eq!(splits[0].id, "S");
    let d = SplitDescriptor::decode(&splits[0].descriptor).unwrap();
    assert_eq!(
        d,
        SplitDescriptor {
            stream: "S".into(),
            subject: None,
            start_seq: 1,
            end_seq: Some(10)
        }
    );
    // Messages published after discovery are not part of the bounded split.
    let make = || {
        let mut f = fake_with(10);
        f.publish("S", "a.x", "late");
        source(f, "")
    };
    for max in [1, 3, 100] {
        let want: Vec<String> = (1..=10).map(|i| format!("m{i}")).collect();
        assert_eq!(read_all(&make, &splits[0], max), want, "max {max}");
    }
}

#[test]
fn a_filter_reads_matching_messages_and_finishes_when_none_is_left() {
    let mut src = source(fake_with(10), r#","subject":"a.>""#);
    let split = src.discover().unwrap().remove(0);
    assert_eq!(split.id, "S?a.>");
    let make = || source(fake_with(12), r#","subject":"a.>""#);
    let want: Vec<String> = (1..=10)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("m{i}"))
        .collect();
    for max in [1, 2, 50] {
        assert_eq!(read_all(&make, &split, max), want, "max {max}");
    }
}

#[test]
fn unbounded_keeps_reading_and_cursors_are_exclusive() {
    let mut src = source(fake_with(3), r#","bounded":false"#);
    let split = src.discover().unwrap().remove(0);
    assert_eq!(
        SplitDescriptor::decode(&split.descriptor).unwrap().end_seq,
        None
    );
    let mut out = Batch::default();
    let r = src.read_split(&split, &[], 10, &mut out).unwrap();
    assert_eq!((out.len(), r.finished), (3, false));
    assert_eq!(decode_cursor(&r.next_cursor).unwrap(), Some(4));
    let mut out = Batch::default();
    let r2 = src
        .read_split(&split, &r.next_cursor, 10, &mut out)
        .unwrap();
    assert_eq!((out.len(), r2.finished), (0, false));
    src.js.publish("S", "a.x", "m4");
    let mut out = Batch::default();
    let r3 = src
        .read_split(&split, &r2.next_cursor, 10, &mut out)
        .unwrap();
    assert_eq!(out.record(0), b"m4");
    assert_eq!(decode_cursor(&r3.next_cursor).unwrap(), Some(5));
}

#[test]
fn a_stream_trimmed_past_the_cursor_fails_loudly() {
    let mut src = source(fake_with(10), "");
    let split = src.discover().unwrap().remove(0);
    for seq in 1..=5 {
        src.js.streams.get_mut("S").unwrap().messages.remove(&seq);
    }
    let mut out = Batch::default();
    let e = src
        .read_split(&split, &encode_cursor(3), 10, &mut out)
        .unwrap_err();
    assert!(
        e.message.contains("trimmed past the cursor"),
        "{}",
        e.message
    );
    assert!(e.message.contains("3..5"), "{}", e.message);
    // Fatal to the job: a restart cannot bring the messages back.
    assert_eq!(e.code, nop_stream_sdk::ErrorCode::State);
    // An interior delete is not a trim.
    let mut src = source(fake_with(10), "");
    src.js.streams.get_mut("S").unwrap().messages.remove(&4);
    let mut out = Batch::default();
    let r = src
        .read_split(&split, &encode_cursor(4), 10, &mut out)
        .unwrap();
    assert_eq!(out.len(), 6);
    assert!(r.finished);
}

#[test]
fn transient_failures_keep_the_cursor_until_the_retry_timeout() {
    let mut f = fake_with(5);
    f.fail_next = 2;
    let mut src = source(f, "");
    let split = src.discover().unwrap().remove(0);
    let c = encode_cursor(2);
    for _ in 0..2 {
        let mut out = Batch::default();
        let r = src.read_split(&split, &c, 10, &mut out).unwrap();
        assert_eq!((out.len(), r.finished, &r.next_cursor), (0, false, &c));
    }
    let mut out = Batch::default();
    let r = src.read_split(&split, &c, 10, &mut out).unwrap();
    assert_eq!((out.len(), r.finished), (4, true));
    // With no patience the first failure fails the read.
    let mut f = fake_with(5);
    f.fail_next = 1;
    let mut src = source(f, r#","retry_timeout_ms":0"#);
    let mut out = Batch::default();
    let e = src.read_split(&split, &c, 10, &mut out).unwrap_err();
    assert!(e.message.contains("kept failing"), "{}", e.message);
}

#[test]
fn a_missing_stream_fails_discovery_naming_it() {
    let mut src = source(Fake::default(), "");
    let e = src.discover().unwrap_err();
    assert_eq!(e.code, nop_stream_sdk::ErrorCode::InvalidConfig);
    assert!(e.message.contains("stream `S`"), "{}", e.message);
}

#[test]
fn event_time_from_publish_time_csv_and_json() {
    let mut f = Fake::default();
    f.publish("S", "a", "2013,2013-01-01T05:00:00Z,17");
    let mut src = source(f, r#","event_time":{"from":"publish-time"}"#);
    let split = src.discover().unwrap().remove(0);
    let mut out = Batch::default();
    src.read_split(&split, &[], 10, &mut out).unwrap();
    assert_eq!(out.timestamp(0), Some(1_000));

    let mut f = Fake::default();
    f.publish("S", "a", "2013,2013-01-01T05:00:00Z,17");
    f.publish("S", "a", "2013,not-a-time,17");
    let mut src = source(
        f,
        r#","event_time":{"from":"csv","header":"year,time_hour,minute","column":"time_hour","format":"rfc3339","add_minutes_column":"minute"}"#,
    );
    let split = src.discover().unwrap().remove(0);
    let mut out = Batch::default();
    let e = src.read_split(&split, &[], 10, &mut out).unwrap_err();
    assert_eq!(e.code, nop_stream_sdk::ErrorCode::InvalidRecord);
    assert!(e.message.contains("sequence 2"), "{}", e.message);
    let mut out = Batch::default();
    src.read_split(&split, &[], 1, &mut out).unwrap();
    assert_eq!(out.timestamp(0), Some(1_357_016_400_000 + 17 * 60_000));

    let mut f = Fake::default();
    f.publish("S", "a", r#"{"ts":1357016400000}"#);
    let mut src = source(
        f,
        r#","event_time":{"from":"json","field":"ts","format":"epoch-ms"}"#,
    );
    let split = src.discover().unwrap().remove(0);
    let mut out = Batch::default();
    src.read_split(&split, &[], 10, &mut out).unwrap();
    assert_eq!(out.timestamp(0), Some(1_357_016_400_000));

    let config = Config::parse(
        r#"{"connection":"q","streams":["S"],"event_time":{"from":"csv","header":"a,b","column":"t","format":"epoch-ms"}}"#,
    )
    .unwrap();
    let e = JetStreamSource::with(config, Fake::default()).unwrap_err();
    assert!(e.message.contains("\"t\" is not a column"), "{}", e.message);
}

#[test]
fn describes_itself_as_replayable() {
    let info = JetStreamSource::<HostJetStream>::describe();
    assert_eq!(info.source_capability, Some(SourceCapability::Replayable));
    serde_json::from_str::<serde_json::Value>(&info.config_schema).unwrap();
}

/// Regression: a restarted server restored a consumer behind the cursor and the same
/// messages came twice; the source never emits a sequence below its cursor.
#[test]
fn messages_below_the_cursor_are_never_emitted_twice() {
    /// Every other fetch starts three sequences early.
    struct Rewinding(Fake, bool);
    impl JetStream for Rewinding {
        fn stream_info(&mut self, c: &str, s: &str) -> Result<StreamState, NatsError> {
            self.0.stream_info(c, s)
        }
        fn fetch(
            &mut self,
            c: &str,
            s: &str,
            f: Option<&str>,
            start: u64,
            max: u32,
            w: u32,
        ) -> Result<Fetched, NatsError> {
            self.1 = !self.1;
            let from = if self.1 {
                start.saturating_sub(3).max(1)
            } else {
                start
            };
            self.0.fetch(c, s, f, from, max, w)
        }
    }
    let config = Config::parse(r#"{"connection":"q","streams":["S"]}"#).unwrap();
    let mut src = JetStreamSource::with(config, Rewinding(fake_with(10), false)).unwrap();
    let split = src.discover().unwrap().remove(0);
    let mut got = Vec::new();
    let mut cursor = Vec::new();
    loop {
        let mut out = Batch::default();
        let r = src.read_split(&split, &cursor, 4, &mut out).unwrap();
        got.extend(
            out.iter()
                .map(|r| String::from_utf8(r.data.to_vec()).unwrap()),
        );
        cursor = r.next_cursor;
        if r.finished {
            break;
        }
    }
    let want: Vec<String> = (1..=10).map(|i| format!("m{i}")).collect();
    assert_eq!(got, want);
}
