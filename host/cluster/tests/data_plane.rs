//! The data plane over real QUIC on loopback with real certificates: order and content,
//! backpressure without closing the connection or starving other channels, refusal of
//! stale headers, fencing at receive time, and the frame size cap. Producers and consumers
//! are plain std threads, as task threads are. Every test is bounded by [`LIMIT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nop_stream_api::{Batch, ChannelId, EdgeId, EpochId, FencingToken, JobId, SubtaskIndex};
use nop_stream_cluster::pki::DEFAULT_CA_VALIDITY;
use nop_stream_cluster::{
    CertificateAuthority, ClusterEndpoint, DataError, DataPlane, DataPlaneConfig, Identity, NodeId,
    Protocol, QuicReceiver, QuicSender, Refusal, TransportSettings, handshake,
};
use nop_stream_proto::codec;
use nop_stream_proto::{Message, StreamHeader};

/// Upper bound of every test; nothing here may hang.
const LIMIT: Duration = Duration::from_secs(60);
/// One receive wait.
const WAIT: Duration = Duration::from_secs(10);

/// Runs `test` on its own thread and fails if it does not finish within [`LIMIT`].
fn bounded(test: impl FnOnce() -> anyhow::Result<()> + Send + 'static) {
    let (done, result) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(test());
    });
    match result.recv_timeout(LIMIT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e:#}"),
        Err(_) => panic!("test exceeded its time limit of {LIMIT:?} (or panicked)"),
    }
}

fn node(id: u32) -> Identity {
    Identity::Node(NodeId(id))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two nodes with one mTLS connection: node 2 produces, node 1 consumes.
struct Nodes {
    producer: DataPlane,
    consumer: DataPlane,
    /// The producer's side of the connection.
    connection: quinn::Connection,
    /// The consumer's side.
    accepted: quinn::Connection,
    _endpoints: (ClusterEndpoint, ClusterEndpoint),
    runtime: tokio::runtime::Runtime,
}

impl Nodes {
    fn start(settings: TransportSettings, config: DataPlaneConfig) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let ca = CertificateAuthority::generate("test", DEFAULT_CA_VALIDITY)?;
        let (consumer_ep, producer_ep, connection, accepted) = runtime.block_on(async {
            let consumer_ep = ClusterEndpoint::bind(
                loopback(),
                &ca.issue_credentials(&node(1))?,
                &[Protocol::Node],
                &settings,
            )?;
            let producer_ep = ClusterEndpoint::bind(
                loopback(),
                &ca.issue_credentials(&node(2))?,
                &[Protocol::Node],
                &settings,
            )?;
            let addr = consumer_ep.local_addr()?;
            let accept = async {
                let incoming = consumer_ep.accept().await.context("no incoming")?;
                anyhow::Ok(handshake(incoming).await?)
            };
            let dial =
                async { anyhow::Ok(producer_ep.connect(addr, &node(1), Protocol::Node).await?) };
            let (accepted, dialled) =
                tokio::time::timeout(WAIT, async { tokio::join!(accept, dial) }).await?;
            anyhow::Ok((
                consumer_ep,
                producer_ep,
                dialled?.connection,
                accepted?.connection,
            ))
        })?;
        let producer = DataPlane::new(runtime.handle().clone(), config);
        let consumer = DataPlane::new(runtime.handle().clone(), config);
        consumer.serve(accepted.clone());
        Ok(Self {
            producer,
            consumer,
            connection,
            accepted,
            _endpoints: (consumer_ep, producer_ep),
            runtime,
        })
    }

    fn default() -> anyhow::Result<Self> {
        Self::start(TransportSettings::default(), DataPlaneConfig::default())
    }

    fn sender(&self, header: StreamHeader) -> anyhow::Result<QuicSender> {
        Ok(self.producer.open_sender(&self.connection, header)?)
    }

    fn receiver(&self, h: &StreamHeader, capacity: usize) -> anyhow::Result<QuicReceiver> {
        Ok(self.consumer.register_receiver(
            h.job.clone(),
            h.generation,
            h.token,
            h.channel.clone(),
            capacity,
        )?)
    }

    /// Neither side of the connection has been closed.
    fn connection_open(&self) -> bool {
        self.connection.close_reason().is_none() && self.accepted.close_reason().is_none()
    }
}

fn channel(downstream: u32) -> ChannelId {
    ChannelId {
        edge: EdgeId::new("source->sink#0"),
        upstream: SubtaskIndex(0),
        downstream: SubtaskIndex(downstream),
        index: 0,
    }
}

fn header(job: &str, generation: u64, token: u64, downstream: u32) -> StreamHeader {
    StreamHeader {
        job: JobId::new(job),
        generation,
        token: FencingToken(token),
        channel: channel(downstream),
    }
}

/// A keyed, timestamped batch of `records` records of `size` bytes whose bytes depend on
/// `seed` and position, so any reordering or corruption changes them.
fn batch(seed: u64, records: usize, size: usize) -> Batch {
    let mut b = Batch::default();
    for r in 0..records {
        let base = seed.wrapping_mul(31).wrapping_add(r as u64);
        b.data
            .extend((0..size).map(|i| (base.wrapping_mul(7).wrapping_add(i as u64) % 251) as u8));
        b.ends.push(b.data.len() as u32);
        b.keys.extend_from_slice(&base.to_le_bytes());
        b.key_ends.push(b.keys.len() as u32);
        b.timestamps.push(base as i64 - 1000);
    }
    b
}

/// Receives until `n` messages arrived, failing on an error or a wait over [`WAIT`].
fn recv_n(rx: &mut QuicReceiver, n: usize) -> anyhow::Result<Vec<Message>> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match rx.recv_timeout(WAIT)? {
            Some(m) => got.push(m),
            None => bail!(
                "channel {}: {} of {n} messages after {WAIT:?}",
                rx.channel(),
                got.len()
            ),
        }
    }
    Ok(got)
}

/// Sends small messages until the sender fails; the error (the receiver's refusal arrives
/// one round trip after the header).
fn send_until_refused(tx: &mut QuicSender) -> anyhow::Result<DataError> {
    for i in 0..5_000 {
        if let Err(e) = tx.send(Message::Watermark(i)) {
            return Ok(e);
        }
        thread::sleep(Duration::from_millis(2));
    }
    bail!("channel {}: never refused", tx.channel())
}

fn refusal_of(e: &DataError) -> Option<Refusal> {
    match e {
        DataError::Refused { reason, .. } => reason.0,
        _ => None,
    }
}

/// Waits until `f` holds, polling; fails after [`WAIT`].
fn eventually(what: &str, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !f() {
        ensure!(start.elapsed() < WAIT, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

#[test]
fn order_and_content_survive_many_messages_of_every_kind() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let h = header("job", 1, 11, 0);
        let mut rx = nodes.receiver(&h, 16)?;
        let mut sent = Vec::new();
        for i in 0..3_000u64 {
            sent.push(match i % 6 {
                0 | 1 => Message::Records(batch(i, (i % 50) as usize, (i % 200) as usize)),
                2 => Message::Watermark(i as i64 * 10 - 500),
                3 => Message::Barrier(EpochId(i)),
                4 => Message::Idle,
                _ => Message::Records(Batch::default()),
            });
        }
        sent.push(Message::End);
        let mut tx = nodes.sender(h)?;
        let to_send = sent.clone();
        let producer = thread::spawn(move || -> anyhow::Result<()> {
            for m in to_send {
                tx.send(m)?;
            }
            Ok(tx.close()?)
        });
        let got = recv_n(&mut rx, sent.len())?;
        producer.join().unwrap()?;
        for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
            if let (Message::Records(g), Message::Records(s)) = (g, s) {
                ensure!(g.data == s.data, "record bytes of message {i} differ");
                ensure!(
                    g.ends == s.ends && g.keys == s.keys,
                    "layout of message {i} differs"
                );
            }
            ensure!(g == s, "message {i} differs: got {g:?}, sent {s:?}");
        }
        // After the producer finished: the end, not a silent wait.
        match rx.recv_timeout(WAIT) {
            Err(DataError::Ended { channel, .. }) => ensure!(channel == self::channel(0)),
            other => bail!("expected Ended, got {other:?}"),
        }
        ensure!(nodes.connection_open());
        Ok(())
    });
}

#[test]
fn a_slow_consumer_stalls_its_producer_but_not_the_connection_or_other_channels() {
    bounded(|| {
        let nodes = Nodes::default()?;
        const SLOW: usize = 100; // 100 × 64 KiB = 6.4 MiB, far above the 1 MiB stream window
        const FAST: usize = 60;
        let slow_h = header("job", 1, 11, 0);
        let fast_h = header("job", 1, 12, 1);
        let mut slow_rx = nodes.receiver(&slow_h, 4)?;
        let mut fast_rx = nodes.receiver(&fast_h, 4)?;
        let sent = Arc::new(AtomicUsize::new(0));
        let mut slow_tx = nodes.sender(slow_h)?;
        let progress = sent.clone();
        let slow_producer = thread::spawn(move || -> anyhow::Result<()> {
            for i in 0..SLOW {
                slow_tx.send(Message::Records(batch(i as u64, 1024, 64)))?;
                progress.fetch_add(1, Ordering::SeqCst);
            }
            Ok(slow_tx.close()?)
        });
        // The producer stalls: its count stops moving well below SLOW.
        let mut last = usize::MAX;
        let mut steady_since = Instant::now();
        eventually("the slow producer stalls", || {
            let now = sent.load(Ordering::SeqCst);
            if now != last {
                last = now;
                steady_since = Instant::now();
            }
            steady_since.elapsed() > Duration::from_millis(500)
        })?;
        let stalled_at = sent.load(Ordering::SeqCst);
        eprintln!("slow producer stalled after {stalled_at} of {SLOW} messages");
        ensure!(
            stalled_at < SLOW / 2,
            "producer did not stall: {stalled_at} sent"
        );
        ensure!(slow_rx.queued() == 4, "queue holds {}", slow_rx.queued());
        ensure!(!slow_producer.is_finished());
        ensure!(nodes.connection_open(), "the stall closed the connection");

        // The second channel flows while the first stays stalled.
        let mut fast_tx = nodes.sender(fast_h)?;
        let fast_producer = thread::spawn(move || -> anyhow::Result<()> {
            for i in 0..FAST {
                fast_tx.send(Message::Records(batch(1_000 + i as u64, 1024, 64)))?;
            }
            Ok(fast_tx.close()?)
        });
        let fast = recv_n(&mut fast_rx, FAST)?;
        fast_producer.join().unwrap()?;
        for (i, m) in fast.iter().enumerate() {
            ensure!(*m == Message::Records(batch(1_000 + i as u64, 1024, 64)));
        }
        ensure!(
            sent.load(Ordering::SeqCst) == stalled_at,
            "the slow producer moved while its consumer did not read"
        );

        // Once the consumer reads, everything arrives intact and the producer finishes.
        let slow = recv_n(&mut slow_rx, SLOW)?;
        slow_producer.join().unwrap()?;
        for (i, m) in slow.iter().enumerate() {
            ensure!(
                *m == Message::Records(batch(i as u64, 1024, 64)),
                "message {i}"
            );
        }
        ensure!(nodes.connection_open());
        Ok(())
    });
}

#[test]
fn stale_or_unknown_headers_are_refused_counted_and_never_queued() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let good = header("job", 2, 7, 0);
        let mut rx = nodes.receiver(&good, 8)?;
        let cases = [
            (header("job", 1, 7, 0), Refusal::StaleGeneration),
            (header("job", 3, 7, 0), Refusal::FutureGeneration),
            (header("job", 2, 6, 0), Refusal::WrongToken),
            (header("job", 2, 7, 5), Refusal::UnknownChannel),
            (header("other-job", 2, 7, 0), Refusal::UnknownJob),
        ];
        for (h, expected) in cases {
            let mut tx = nodes.sender(h.clone())?;
            let err = send_until_refused(&mut tx)?;
            ensure!(
                refusal_of(&err) == Some(expected),
                "{h:?}: expected {expected:?}, got {err}"
            );
            let text = err.to_string();
            ensure!(text.contains(&h.channel.to_string()), "{text}");
            ensure!(text.contains(&expected.to_string()), "{text}");
        }
        let fences = nodes.consumer.fences();
        ensure!(fences.refused(&JobId::new("job")) == 4);
        ensure!(fences.refused(&JobId::new("other-job")) == 1);
        ensure!(rx.queued() == 0, "a refused stream reached the queue");
        ensure!(rx.recv_timeout(Duration::from_millis(200))?.is_none());

        // The registered producer still gets through, and is not counted.
        let mut tx = nodes.sender(good)?;
        tx.send(Message::Barrier(EpochId(1)))?;
        ensure!(rx.recv_timeout(WAIT)? == Some(Message::Barrier(EpochId(1))));
        // A second stream for the same channel is refused.
        let mut dup = nodes.sender(header("job", 2, 7, 0))?;
        ensure!(refusal_of(&send_until_refused(&mut dup)?) == Some(Refusal::DuplicateStream));
        ensure!(fences.refused(&JobId::new("job")) == 5);
        tx.close()?;
        ensure!(nodes.connection_open());
        Ok(())
    });
}

#[test]
fn messages_queued_before_a_fence_are_refused_at_receive() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let job = JobId::new("job");
        let h = header("job", 1, 3, 0);
        let mut rx = nodes.receiver(&h, 16)?;
        let mut tx = nodes.sender(h)?;
        for i in 0..5 {
            tx.send(Message::Watermark(i))?;
        }
        eventually("five messages are queued", || rx.queued() == 5)?;
        nodes.consumer.fences().fence(&job, 2);
        match rx.recv_timeout(WAIT) {
            Err(DataError::Fenced {
                generation: 1,
                in_force: 2,
                ..
            }) => {}
            other => bail!("expected Fenced, got {other:?}"),
        }
        // It stays fenced, and the producer of the fenced generation is refused.
        ensure!(matches!(
            rx.recv_timeout(WAIT),
            Err(DataError::Fenced { .. })
        ));
        ensure!(refusal_of(&send_until_refused(&mut tx)?) == Some(Refusal::Fenced));
        // The old generation can neither register nor open a new stream; the new one can.
        ensure!(matches!(
            nodes.receiver(&header("job", 1, 3, 0), 4),
            Err(e) if e.to_string().contains("generation 1 is fenced (generation 2 in force)")
        ));
        let refused_before = nodes.consumer.fences().refused(&job);
        let mut new_rx = nodes.receiver(&header("job", 2, 4, 0), 4)?;
        let mut stale = nodes.sender(header("job", 1, 3, 0))?;
        ensure!(refusal_of(&send_until_refused(&mut stale)?) == Some(Refusal::StaleGeneration));
        ensure!(nodes.consumer.fences().refused(&job) == refused_before + 1);
        let mut new_tx = nodes.sender(header("job", 2, 4, 0))?;
        new_tx.send(Message::Watermark(42))?;
        ensure!(new_rx.recv_timeout(WAIT)? == Some(Message::Watermark(42)));
        ensure!(new_rx.queued() == 0);
        new_tx.close()?;
        ensure!(nodes.connection_open());
        Ok(())
    });
}

#[test]
fn an_oversized_frame_is_refused_without_allocating_its_claimed_size() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let h = header("job", 1, 1, 0);
        let mut rx = nodes.receiver(&h, 4)?;
        // A raw stream: a valid header, one message, then a prefix claiming 3 GiB (over
        // MAX_DATA_FRAME) followed by 4 bytes. Waiting for (or reserving) the claimed size
        // would never produce the refusal.
        let mut bytes = Vec::new();
        codec::write_frame(&mut bytes, &h, 4096)?;
        codec::write_frame(&mut bytes, &Message::Watermark(5), 4096)?;
        bytes.extend_from_slice(&0xC000_0000u32.to_be_bytes());
        bytes.extend_from_slice(b"tiny");
        let connection = nodes.connection.clone();
        let stopped = nodes.runtime.block_on(async move {
            let mut send = connection.open_uni().await?;
            send.write_all(&bytes).await?;
            anyhow::Ok(tokio::time::timeout(WAIT, send.stopped()).await??)
        })?;
        ensure!(
            stopped == Some(quinn::VarInt::from_u32(Refusal::FrameTooLarge.code())),
            "stream stopped with {stopped:?}"
        );
        ensure!(rx.recv_timeout(WAIT)? == Some(Message::Watermark(5)));
        match rx.recv_timeout(WAIT) {
            Err(DataError::StreamFailed { reason, .. }) => ensure!(
                reason.contains("frame of 3221225472 bytes exceeds the cap of 83886080 bytes"),
                "{reason}"
            ),
            other => bail!("expected StreamFailed, got {other:?}"),
        }

        // An oversized header is refused from its prefix too, and counted.
        let connection = nodes.connection.clone();
        let stopped = nodes.runtime.block_on(async move {
            let mut send = connection.open_uni().await?;
            send.write_all(&(1u32 << 20).to_be_bytes()).await?;
            anyhow::Ok(tokio::time::timeout(WAIT, send.stopped()).await??)
        })?;
        ensure!(stopped == Some(quinn::VarInt::from_u32(Refusal::FrameTooLarge.code())));
        ensure!(nodes.consumer.fences().refused_without_header() == 1);

        // The sender refuses a message over the cap before sending anything.
        let small = DataPlane::new(
            nodes.runtime.handle().clone(),
            DataPlaneConfig {
                max_frame_len: 1024,
                ..DataPlaneConfig::default()
            },
        );
        let h2 = header("job", 1, 1, 1);
        let mut rx2 = nodes.receiver(&h2, 4)?;
        let mut tx = small.open_sender(&nodes.connection, h2)?;
        match tx.send(Message::Records(batch(1, 64, 64))) {
            Err(DataError::Encode { source, .. }) => ensure!(
                matches!(source, codec::CodecError::TooLarge { cap: 1024, .. }),
                "{source}"
            ),
            other => bail!("expected Encode, got {other:?}"),
        }
        tx.send(Message::Watermark(1))?;
        ensure!(rx2.recv_timeout(WAIT)? == Some(Message::Watermark(1)));
        tx.close()?;
        ensure!(nodes.connection_open());
        Ok(())
    });
}

#[test]
fn a_blocking_send_inside_the_runtime_is_an_error_not_a_deadlock() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let h = header("job", 1, 1, 0);
        let _rx = nodes.receiver(&h, 4)?;
        let mut tx = nodes.sender(h)?;
        let _guard = nodes.runtime.enter();
        match tx.send(Message::Idle) {
            Err(DataError::AsyncContext { channel }) => ensure!(channel == self::channel(0)),
            other => bail!("expected AsyncContext, got {other:?}"),
        }
        Ok(())
    });
}

#[test]
fn a_lost_connection_fails_the_sender_and_the_receiver_naming_the_channel() {
    bounded(|| {
        let nodes = Nodes::default()?;
        let h = header("job", 1, 1, 0);
        let mut rx = nodes.receiver(&h, 4)?;
        let mut tx = nodes.sender(h)?;
        tx.send(Message::Watermark(1))?;
        ensure!(rx.recv_timeout(WAIT)? == Some(Message::Watermark(1)));
        nodes.accepted.close(7u32.into(), b"node stopping");
        match rx.recv_timeout(WAIT) {
            Err(DataError::StreamFailed {
                channel, reason, ..
            }) => {
                ensure!(channel == self::channel(0));
                ensure!(reason.contains("connection lost"), "{reason}");
            }
            other => bail!("expected StreamFailed, got {other:?}"),
        }
        let err = loop {
            if let Err(e) = tx.send(Message::Watermark(2)) {
                break e;
            }
            thread::sleep(Duration::from_millis(5));
        };
        ensure!(matches!(err, DataError::Connection { .. }), "{err}");
        ensure!(err.to_string().contains("source->sink#0/0/0/0"), "{err}");
        ensure!(matches!(
            nodes
                .producer
                .open_sender(&nodes.connection, header("job", 1, 1, 1)),
            Err(DataError::Connection { .. })
        ));
        Ok(())
    });
}

#[test]
fn a_stream_without_a_complete_header_in_time_is_refused_and_counted() {
    bounded(|| {
        let nodes = Nodes::start(
            TransportSettings::default(),
            DataPlaneConfig {
                header_timeout: Duration::from_millis(300),
                ..DataPlaneConfig::default()
            },
        )?;
        let connection = nodes.connection.clone();
        let (stopped, waited) = nodes.runtime.block_on(async move {
            let mut send = connection.open_uni().await?;
            // Half a length prefix, then silence.
            send.write_all(&[0, 0]).await?;
            let start = Instant::now();
            let stopped = tokio::time::timeout(WAIT, send.stopped()).await??;
            anyhow::Ok((stopped, start.elapsed()))
        })?;
        ensure!(stopped == Some(quinn::VarInt::from_u32(Refusal::HeaderTimeout.code())));
        ensure!(
            waited >= Duration::from_millis(250),
            "refused after {waited:?}"
        );
        ensure!(nodes.consumer.fences().refused_without_header() == 1);
        ensure!(nodes.connection_open());
        Ok(())
    });
}

/// Why the window rule on `TransportSettings` exists: with a connection window of a single
/// stream window, one stalled channel holds all the connection's credit and a second
/// channel on the same connection cannot move.
#[test]
fn a_connection_window_below_the_rule_lets_a_stalled_channel_starve_the_others() {
    bounded(|| {
        let settings = TransportSettings {
            receive_window: u64::from(TransportSettings::default().stream_receive_window),
            ..TransportSettings::default()
        };
        ensure!(settings.data_channels() == 1);
        let nodes = Nodes::start(settings, DataPlaneConfig::default())?;
        let slow_h = header("job", 1, 1, 0);
        let fast_h = header("job", 1, 2, 1);
        let slow_rx = nodes.receiver(&slow_h, 4)?;
        let mut fast_rx = nodes.receiver(&fast_h, 4)?;
        let mut slow_tx = nodes.sender(slow_h)?;
        let slow_producer = thread::spawn(move || {
            for i in 0..100 {
                if slow_tx.send(Message::Records(batch(i, 1024, 64))).is_err() {
                    return;
                }
            }
        });
        eventually("the slow queue is full", || slow_rx.queued() == 4)?;
        thread::sleep(Duration::from_millis(300));
        let mut fast_tx = nodes.sender(fast_h)?;
        let fast_producer = thread::spawn(move || {
            for i in 0..20 {
                if fast_tx.send(Message::Records(batch(i, 1024, 64))).is_err() {
                    return;
                }
            }
        });
        let got = fast_rx.recv_timeout(Duration::from_secs(1))?;
        ensure!(got.is_none(), "the second channel moved: {}", got.is_some());
        // Releasing the stalled channel releases the other one.
        drop(slow_rx);
        ensure!(fast_rx.recv_timeout(WAIT)?.is_some());
        slow_producer.join().unwrap();
        drop(fast_rx);
        fast_producer.join().unwrap();
        Ok(())
    });
}
