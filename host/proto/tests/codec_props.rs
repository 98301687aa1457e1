//! Property tests of the wire codecs: arbitrary bytes never panic any decoder, and every
//! value round-trips through a frame.

use nop_stream_api::{
    AttemptId, Batch, ChannelId, EdgeId, EpochId, FencingToken, SubtaskIndex, TaskId,
};
use nop_stream_proto::codec::{FrameReader, MAX_CONTROL_FRAME, MAX_DATA_FRAME, write_frame};
use nop_stream_proto::{
    Deployment, FailureClass, Message, PayloadHead, SinkSettlement, StreamHeader, TaskCommand,
    TaskEvent, TaskFailure, TaskReport, decode, encode, records_from_parts, records_head,
};
use proptest::prelude::*;

fn batch() -> impl Strategy<Value = Batch> {
    (
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..6),
        any::<bool>(),
    )
        .prop_map(|(records, keyed)| {
            let mut b = Batch::default();
            for r in &records {
                b.data.extend_from_slice(r);
                b.ends.push(b.data.len() as u32);
                if keyed {
                    b.keys.extend_from_slice(&r[..r.len().min(2)]);
                    b.key_ends.push(b.keys.len() as u32);
                }
                b.timestamps.push(r.len() as i64 - 3);
            }
            b
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        batch().prop_map(Message::Records),
        any::<i64>().prop_map(Message::Watermark),
        any::<u64>().prop_map(|e| Message::Barrier(EpochId(e))),
        Just(Message::Idle),
        Just(Message::End),
    ]
}

fn task(sub: u32) -> TaskId {
    TaskId {
        job: "job".into(),
        pipeline: "main".into(),
        vertex: "v".into(),
        subtask: SubtaskIndex(sub),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn arbitrary_bytes_never_panic_a_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode::<Message>(&bytes, MAX_DATA_FRAME);
        let _ = decode::<StreamHeader>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<Deployment>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<TaskCommand>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<TaskEvent>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<SinkSettlement>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::Hello>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::CoordinatorFrame>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::HelloReply>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::NodeFrame>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::NodeRequestFrame>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::session::ComponentFrame>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::cli::CliRequest>(&bytes, MAX_CONTROL_FRAME);
        let _ = decode::<nop_stream_proto::cli::CliResponse>(&bytes, MAX_CONTROL_FRAME);
        let mut r = FrameReader::new(256);
        r.push(&bytes);
        while let Ok(Some(_)) = r.next_frame() {}
    }

    #[test]
    fn messages_round_trip_through_frames(msgs in proptest::collection::vec(message(), 0..8), chunk in 1usize..64) {
        let mut stream = Vec::new();
        for m in &msgs {
            write_frame(&mut stream, m, MAX_DATA_FRAME).unwrap();
        }
        let mut r = FrameReader::new(MAX_DATA_FRAME);
        let mut got = Vec::new();
        for piece in stream.chunks(chunk) {
            r.push(piece);
            while let Some(m) = r.next_value::<Message>().unwrap() {
                got.push(m);
            }
        }
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn a_payload_split_at_its_head_decodes_to_the_same_message(m in message(), cut in 0usize..16) {
        let payload = encode(&m, MAX_DATA_FRAME).unwrap();
        // Any prefix of the payload either decides or asks for more bytes; what it decides
        // does not depend on how much more of the payload it saw.
        let decided = records_head(&payload);
        prop_assert_ne!(decided, PayloadHead::Incomplete);
        let prefix = records_head(&payload[..cut.min(payload.len())]);
        prop_assert!(prefix == PayloadHead::Incomplete || prefix == decided, "{prefix:?} vs {decided:?}");
        match decided {
            PayloadHead::Records { head_len, data_len } => {
                let Message::Records(b) = &m else { panic!("split a non-records message: {m:?}") };
                prop_assert_eq!(&payload[head_len..head_len + data_len], &b.data[..]);
                let data = payload[head_len..head_len + data_len].to_vec();
                let back = records_from_parts(data, &payload[head_len + data_len..], MAX_DATA_FRAME).unwrap();
                prop_assert_eq!(back, m);
            }
            _ => prop_assert!(!matches!(m, Message::Records(_)), "records not recognised: {m:?}"),
        }
    }

    #[test]
    fn batch_columns_encode_as_byte_strings_of_varint_differences(b in batch()) {
        // The wire layout of `Batch` (protocol version 4): `data` and `keys` as byte
        // strings, `ends`, `key_ends` and `timestamps` as byte strings of varint
        // differences. Pinned here so that a change to it is deliberate.
        use nop_stream_api::delta::{encode_i64s, encode_u32s};
        #[derive(serde::Serialize)]
        struct Plain<'a> {
            #[serde(with = "serde_bytes")] data: &'a [u8],
            #[serde(with = "serde_bytes")] ends: &'a [u8],
            #[serde(with = "serde_bytes")] keys: &'a [u8],
            #[serde(with = "serde_bytes")] key_ends: &'a [u8],
            #[serde(with = "serde_bytes")] timestamps: &'a [u8],
        }
        let (ends, key_ends, timestamps) = (encode_u32s(&b.ends), encode_u32s(&b.key_ends), encode_i64s(&b.timestamps));
        let plain = Plain { data: &b.data, ends: &ends, keys: &b.keys, key_ends: &key_ends, timestamps: &timestamps };
        prop_assert_eq!(encode(&b, MAX_DATA_FRAME).unwrap(), encode(&plain, MAX_DATA_FRAME).unwrap());
        prop_assert_eq!(decode::<Batch>(&encode(&b, MAX_DATA_FRAME).unwrap(), MAX_DATA_FRAME).unwrap(), b);
    }

    #[test]
    fn events_and_headers_round_trip(sub in 0u32..64, attempt in any::<u32>(), epoch in any::<u64>(), msg in ".{0,40}") {
        let header = StreamHeader {
            job: "job".into(),
            generation: u64::from(attempt),
            token: FencingToken(u64::from(attempt)),
            channel: ChannelId { edge: EdgeId::new("a->b#0"), upstream: SubtaskIndex(sub), downstream: SubtaskIndex(0), index: 0 },
        };
        prop_assert_eq!(decode::<StreamHeader>(&encode(&header, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap(), header);
        let events: Vec<TaskEvent> = vec![
            TaskEvent::Committed { attempt: AttemptId(attempt), task: task(sub), epoch: EpochId(epoch) },
            TaskEvent::Failed { attempt: AttemptId(attempt), task: task(sub), error: TaskFailure { class: FailureClass::Recoverable, message: msg.clone() } },
            TaskEvent::Finished { attempt: AttemptId(attempt), report: TaskReport { task: task(sub).to_string(), records_in: epoch, ..TaskReport::default() } },
        ];
        for e in events {
            let back: TaskEvent = decode(&encode(&e, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap();
            prop_assert_eq!(format!("{back:?}"), format!("{e:?}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn watermark_frames_round_trip(
        generation in any::<u64>(),
        vertex in any::<u32>(),
        watermarks in proptest::collection::vec((any::<u32>(), any::<i64>()), 0..64),
        term in any::<u64>(),
    ) {
        use nop_stream_proto::session::{CoordinatorFrame, NodeFrame, SourceWatermarks, Stamped};
        let w = SourceWatermarks { job: "job".into(), generation, vertex, watermarks };
        let up = NodeFrame::Watermarks(w.clone());
        let back: NodeFrame = decode(&encode(&up, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap();
        let NodeFrame::Watermarks(got) = back else { panic!("not a watermarks frame") };
        prop_assert_eq!(&got, &w);
        let down = Stamped { term, frame: CoordinatorFrame::Watermarks(w) };
        let back: Stamped = decode(&encode(&down, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap();
        prop_assert_eq!(back, down);
    }
}

/// A watermark frame stays small: one entry per subtask, so a source at parallelism 1024
/// fits in 16 KiB (the control frame cap is 16 MiB).
#[test]
fn a_watermark_frame_of_a_wide_source_fits_a_control_frame() {
    use nop_stream_proto::session::{NodeFrame, SourceWatermarks};
    let w = SourceWatermarks {
        job: "a-job-with-a-long-name".into(),
        generation: u64::MAX,
        vertex: u32::MAX,
        watermarks: (0..1024).map(|s| (s, i64::MIN)).collect(),
    };
    let bytes = encode(&NodeFrame::Watermarks(w), MAX_CONTROL_FRAME).unwrap();
    assert!(bytes.len() < 16 * 1024, "{} bytes", bytes.len());
}

/// Regression: a snapshot whose split has no largest timestamp could not cross the control
/// plane (postcard cannot skip a field the way the manifest's JSON does).
#[test]
fn an_ack_with_split_states_round_trips_and_the_manifest_json_keeps_its_shape() {
    use nop_stream_checkpoint::{SplitState, TaskSnapshot};
    let split = |ts| SplitState {
        split_id: "s".into(),
        descriptor: "00".into(),
        cursor: "".into(),
        finished: false,
        max_timestamp: ts,
    };
    let snapshot = TaskSnapshot {
        task: task(0),
        epoch: EpochId(3),
        end_of_data: false,
        segments: Vec::new(),
        operator_state: Vec::new(),
        splits: vec![split(None), split(Some(-5))],
        watermarks: vec![("w".into(), 7)],
        ended_inputs: Vec::new(),
        pending_transactions: Vec::new(),
        sink_operator: None,
        snapshot_bytes: 0,
        alignment_ms: 0,
        duration_ms: 0,
        async_ms: 0,
        barrier_unix_ms: 0,
        compacted_bytes: 0,
        records_in_total: 0,
        records_out_total: 0,
    };
    let e: TaskEvent = TaskEvent::Ack {
        attempt: AttemptId(2),
        snapshot: Box::new(snapshot.clone()),
    };
    let back: TaskEvent =
        decode(&encode(&e, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap();
    let TaskEvent::Ack { snapshot: got, .. } = back else {
        panic!("not an ack");
    };
    assert_eq!(*got, snapshot);
    // `async_ms` crosses the control plane, and JSON leaves it out only when zero: a
    // manifest written before the field re-serialises to the same bytes (checksum).
    let timed = TaskSnapshot {
        async_ms: 1_234,
        barrier_unix_ms: 1_765_000_000_123,
        compacted_bytes: 5_678,
        records_in_total: 0,
        records_out_total: 0,
        ..snapshot.clone()
    };
    let e: TaskEvent = TaskEvent::Ack {
        attempt: AttemptId(2),
        snapshot: Box::new(timed.clone()),
    };
    let back: TaskEvent =
        decode(&encode(&e, MAX_CONTROL_FRAME).unwrap(), MAX_CONTROL_FRAME).unwrap();
    let TaskEvent::Ack { snapshot: got, .. } = back else {
        panic!("not an ack");
    };
    assert_eq!(got.async_ms, 1_234);
    assert_eq!(got.compacted_bytes, 5_678);
    assert_eq!(got.barrier_unix_ms, 1_765_000_000_123);
    let old_json = serde_json::to_string(&snapshot).unwrap();
    assert!(!old_json.contains("async_ms"), "{old_json}");
    assert!(!old_json.contains("compacted_bytes"), "{old_json}");
    assert!(!old_json.contains("barrier_unix_ms"), "{old_json}");
    let reread: TaskSnapshot = serde_json::from_str(&old_json).unwrap();
    assert_eq!(serde_json::to_string(&reread).unwrap(), old_json);
    let new_json = serde_json::to_string(&timed).unwrap();
    assert!(new_json.contains("\"async_ms\":1234"), "{new_json}");
    assert!(new_json.contains("\"compacted_bytes\":5678"), "{new_json}");
    assert!(
        new_json.contains("\"barrier_unix_ms\":1765000000123"),
        "{new_json}"
    );
    assert_eq!(
        serde_json::from_str::<TaskSnapshot>(&new_json).unwrap(),
        timed
    );
    let json = serde_json::to_string(&split(None)).unwrap();
    assert!(!json.contains("max_timestamp"), "{json}");
    assert!(
        serde_json::to_string(&split(Some(1)))
            .unwrap()
            .contains("\"max_timestamp\":1")
    );
}
