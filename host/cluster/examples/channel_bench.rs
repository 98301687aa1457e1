//! Throughput of one data channel: batches of 1000 records of 64 bytes pushed through one
//! QUIC channel on loopback (mTLS, real certificates, `DataPlane` on both ends, sync
//! producer and consumer threads) and through an in-process `crossbeam_channel::bounded(16)`,
//! the embedded mode's queue. Prints MB/s of record payload, records/s and the ratio, and
//! the same bytes on a raw quinn stream (no codec, no thread hand-off) as the floor.
//!
//! `cargo run --release -p nop-stream-cluster --example channel_bench [batches]`
//! (default 5000 batches, i.e. 5 M records, 320 MB of payload).

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use nop_stream_api::{Batch, ChannelId, EdgeId, FencingToken, JobId, SubtaskIndex};
use nop_stream_cluster::pki::DEFAULT_CA_VALIDITY;
use nop_stream_cluster::{
    CertificateAuthority, ClusterEndpoint, DataPlane, DataPlaneConfig, Identity, NodeId, Protocol,
    TransportSettings, handshake,
};
use nop_stream_proto::{Message, StreamHeader};

const RECORDS: usize = 1000;
const RECORD_LEN: usize = 64;
const QUEUE: usize = 16;
const WARMUP: usize = 200;

fn batch() -> Batch {
    let mut b = Batch::default();
    for r in 0..RECORDS {
        b.data.extend((0..RECORD_LEN).map(|i| (r * 7 + i) as u8));
        b.ends.push(b.data.len() as u32);
    }
    b
}

struct Figures {
    elapsed: Duration,
    batches: usize,
}

impl Figures {
    fn mb_per_s(&self) -> f64 {
        (self.batches * RECORDS * RECORD_LEN) as f64 / 1e6 / self.elapsed.as_secs_f64()
    }
    fn records_per_s(&self) -> f64 {
        (self.batches * RECORDS) as f64 / self.elapsed.as_secs_f64()
    }
}

fn crossbeam(batches: usize, template: &Batch) -> anyhow::Result<Figures> {
    let (tx, rx) = crossbeam_channel::bounded::<Message>(QUEUE);
    let t = template.clone();
    let total = WARMUP + batches;
    let producer = thread::spawn(move || {
        for _ in 0..total {
            tx.send(Message::Records(t.clone())).unwrap();
        }
    });
    let mut records = 0;
    let mut start = Instant::now();
    for i in 0..total {
        if i == WARMUP {
            start = Instant::now();
        }
        if let Message::Records(b) = rx.recv()? {
            records += b.len();
        }
    }
    let elapsed = start.elapsed();
    producer.join().unwrap();
    ensure!(records == total * RECORDS);
    Ok(Figures { elapsed, batches })
}

/// Returns the raw-stream floor and the data plane's figures.
fn quic(batches: usize, template: &Batch) -> anyhow::Result<(Figures, Figures)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ca = CertificateAuthority::generate("bench", DEFAULT_CA_VALIDITY)?;
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let settings = TransportSettings::default();
    let (_eps, connection, accepted) = runtime.block_on(async {
        let consumer = ClusterEndpoint::bind(
            loopback,
            &ca.issue_credentials(&Identity::Node(NodeId(1)))?,
            &[Protocol::Node],
            &settings,
        )?;
        let producer = ClusterEndpoint::bind(
            loopback,
            &ca.issue_credentials(&Identity::Node(NodeId(2)))?,
            &[Protocol::Node],
            &settings,
        )?;
        let addr = consumer.local_addr()?;
        let accept = async {
            let incoming = consumer.accept().await.context("no incoming")?;
            anyhow::Ok(handshake(incoming).await?)
        };
        let dial = async {
            anyhow::Ok(
                producer
                    .connect(addr, &Identity::Node(NodeId(1)), Protocol::Node)
                    .await?,
            )
        };
        let (a, d) = tokio::join!(accept, dial);
        anyhow::Ok(((consumer, producer), d?.connection, a?.connection))
    })?;
    let raw = runtime.block_on(raw_stream(&connection, &accepted, batches))?;
    let plane = DataPlane::new(runtime.handle().clone(), DataPlaneConfig::default());
    plane.serve(accepted);
    let header = StreamHeader {
        job: JobId::new("bench"),
        generation: 1,
        token: FencingToken(1),
        channel: ChannelId {
            edge: EdgeId::new("source->sink#0"),
            upstream: SubtaskIndex(0),
            downstream: SubtaskIndex(0),
            index: 0,
        },
    };
    let mut rx = plane.register_receiver(
        header.job.clone(),
        header.generation,
        header.token,
        header.channel.clone(),
        QUEUE,
    )?;
    let mut tx = plane.open_sender(&connection, header)?;
    let t = template.clone();
    let total = WARMUP + batches;
    let producer = thread::spawn(move || -> anyhow::Result<()> {
        for _ in 0..total {
            tx.send(Message::Records(t.clone()))?;
        }
        tx.send(Message::End)?;
        Ok(tx.close()?)
    });
    let mut records = 0;
    let mut start = Instant::now();
    for i in 0..total {
        if i == WARMUP {
            start = Instant::now();
        }
        match rx.recv_timeout(Duration::from_secs(10))? {
            Some(Message::Records(b)) => records += b.len(),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    let elapsed = start.elapsed();
    ensure!(rx.recv_timeout(Duration::from_secs(10))? == Some(Message::End));
    producer.join().unwrap()?;
    ensure!(records == total * RECORDS);
    Ok((raw, Figures { elapsed, batches }))
}

/// The floor under the data plane: the same bytes (one 64 000-byte write per batch) on one
/// raw quinn stream, read in 64 KiB chunks, all async, no codec and no thread hand-off.
async fn raw_stream(
    connection: &quinn::Connection,
    accepted: &quinn::Connection,
    batches: usize,
) -> anyhow::Result<Figures> {
    let payload = vec![7u8; RECORDS * RECORD_LEN];
    let total = (WARMUP + batches) * payload.len();
    let mut send = connection.open_uni().await?;
    let writer = async move {
        for _ in 0..WARMUP + batches {
            send.write_all(&payload).await?;
        }
        send.finish()?;
        anyhow::Ok(())
    };
    let reader = async {
        let mut recv = accepted.accept_uni().await?;
        let mut got = 0;
        let mut start = Instant::now();
        while let Some(chunk) = recv.read_chunk(64 * 1024, true).await? {
            if got < WARMUP * RECORDS * RECORD_LEN
                && got + chunk.bytes.len() >= WARMUP * RECORDS * RECORD_LEN
            {
                start = Instant::now();
            }
            got += chunk.bytes.len();
        }
        ensure!(got == total);
        anyhow::Ok(start.elapsed())
    };
    let (w, r) = tokio::join!(writer, reader);
    w?;
    Ok(Figures {
        elapsed: r?,
        batches,
    })
}

fn main() -> anyhow::Result<()> {
    let batches: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("batches must be a number")?,
        None => 5000,
    };
    let template = batch();
    println!(
        "{batches} batches of {RECORDS} records × {RECORD_LEN} B ({} MB of payload), queue {QUEUE}",
        batches * RECORDS * RECORD_LEN / 1_000_000
    );
    let local = crossbeam(batches, &template)?;
    let (raw, remote) = quic(batches, &template)?;
    for (name, f) in [
        ("crossbeam bounded(16)", &local),
        ("QUIC channel (loopback)", &remote),
        ("raw quinn stream", &raw),
    ] {
        println!(
            "{name:<24} {:>9.1} MB/s {:>13.0} records/s  ({:?})",
            f.mb_per_s(),
            f.records_per_s(),
            f.elapsed
        );
    }
    println!(
        "ratio crossbeam / QUIC: {:.1}×",
        local.records_per_s() / remote.records_per_s()
    );
    println!(
        "data plane / raw quinn stream: {:.0}%",
        100.0 * remote.records_per_s() / raw.records_per_s()
    );
    Ok(())
}
