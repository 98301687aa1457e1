//! `nopstream-bench channel`: one channel hop over the real QUIC data plane on loopback
//! ([`DataPlane`], [`nop_stream_cluster::QuicSender`] → [`nop_stream_cluster::QuicReceiver`],
//! two mTLS endpoints with certificates of an in-memory cluster CA, the node's runtime
//! shape: a 2-worker tokio runtime, 16-message receive queues, default transport
//! settings), beside the in-process channel ([`LocalTransport`], what channels between
//! subtasks of one node use).
//!
//! The batches are the count workload's HASH edge: generated bids parsed and encoded by
//! `bids-parser`'s own code (`encode_bid`), keyed by auction (8 bytes), with event times.
//! A producer thread sends `batches` clones of one batch (the clone is part of both
//! measurements), a consumer thread receives and drops them, as task threads do. Wall
//! time runs from the first send to the last receive; CPU is this process's user + system
//! time over the same span (`getrusage`), which covers both ends and quinn's runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nop_stream_api::{Batch, ChannelId, EdgeId, FencingToken, JobId, SubtaskIndex};
use nop_stream_cluster::pki::DEFAULT_CA_VALIDITY;
use nop_stream_cluster::{
    CertificateAuthority, ClusterEndpoint, DataPlane, DataPlaneConfig, Identity, NodeId, Protocol,
    TransportSettings, handshake,
};
use nop_stream_proto::{Message, StreamHeader, codec};
use nop_stream_task::transport::{LocalTransport, Transport};
use serde::Serialize;

/// Messages each receiving queue holds (the node's default `channel_capacity`).
const QUEUE: usize = 16;

/// One measured transfer.
#[derive(Debug, Clone, Serialize)]
pub struct Transfer {
    /// `quic` or `in-process`.
    pub channel: String,
    /// Records per batch.
    pub batch_records: usize,
    /// Batches sent.
    pub batches: usize,
    /// Batch bytes (payloads, keys, offsets and timestamps as held in memory) per batch.
    pub batch_bytes: usize,
    /// Encoded frame bytes per batch (what QUIC carries, before QUIC and TLS overhead).
    pub frame_bytes: usize,
    /// First send to last receive, seconds.
    pub wall_s: f64,
    /// Process CPU seconds over the transfer (both ends).
    pub cpu_s: f64,
}

impl Transfer {
    /// Records per second of wall time.
    pub fn records_per_s(&self) -> f64 {
        (self.batches * self.batch_records) as f64 / self.wall_s
    }

    /// Batch megabytes (10^6) per second of wall time.
    pub fn mb_per_s(&self) -> f64 {
        (self.batches * self.batch_bytes) as f64 / self.wall_s / 1e6
    }

    /// Records per CPU second.
    pub fn records_per_cpu_s(&self) -> f64 {
        (self.batches * self.batch_records) as f64 / self.cpu_s.max(1e-9)
    }
}

/// A batch of `records` parsed bids as `bids-parser` emits them on the count job's HASH
/// edge.
///
/// # Errors
/// A generated line that does not parse (a bug).
pub fn bid_batch(records: usize) -> Result<Batch> {
    let mut csv = Vec::new();
    crate::bids::write_bids(&mut csv, records as u64, crate::KEYS, false)?;
    let mut b = Batch::default();
    for line in csv.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
        let bids_parser::Line::Bid(bid) = bids_parser::parse_line(line)
            .map_err(|e| anyhow::anyhow!("generated bid does not parse: {e}"))?
        else {
            bail!("unexpected header line");
        };
        bids_parser::encode_bid(&bid, &mut b.data);
        b.ends.push(b.data.len() as u32);
        b.keys.extend_from_slice(&bid.auction.to_le_bytes());
        b.key_ends.push(b.keys.len() as u32);
        b.timestamps.push(bid.date_time);
    }
    Ok(b)
}

/// Bytes of a batch as held in memory.
fn batch_bytes(b: &Batch) -> usize {
    b.data.len() + b.keys.len() + 4 * (b.ends.len() + b.key_ends.len()) + 8 * b.timestamps.len()
}

fn self_cpu_s() -> f64 {
    #[allow(unsafe_code)]
    // SAFETY: `rusage` is plain old data, valid when zeroed; getrusage fills it.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let s = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    s(u.ru_utime) + s(u.ru_stime)
}

fn channel_id() -> ChannelId {
    ChannelId {
        edge: EdgeId::new("parse->count#0"),
        upstream: SubtaskIndex(0),
        downstream: SubtaskIndex(1),
        index: 0,
    }
}

/// The in-process hop: [`LocalTransport`] between two threads.
///
/// # Errors
/// A channel error.
pub fn in_process(batch: &Batch, batches: usize) -> Result<Transfer> {
    let token = FencingToken(1);
    let t = LocalTransport::new(QUEUE, token, Arc::new(AtomicBool::new(false)));
    let id = channel_id();
    let rx = t.open_receiver(&id, token)?;
    let mut tx = t.open_sender(&id, token)?;
    let template = batch.clone();
    let cpu0 = self_cpu_s();
    let started = Instant::now();
    let producer = std::thread::spawn(move || -> Result<()> {
        for _ in 0..batches {
            tx.send(Message::Records(template.clone()))?;
        }
        tx.send(Message::End)?;
        Ok(())
    });
    let mut got = 0;
    loop {
        match rx.recv()? {
            Message::Records(b) => {
                got += b.len();
                drop(b);
            }
            Message::End => break,
            _ => {}
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = self_cpu_s() - cpu0;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))??;
    anyhow::ensure!(got == batches * batch.len(), "received {got} records");
    Ok(Transfer {
        channel: "in-process".into(),
        batch_records: batch.len(),
        batches,
        batch_bytes: batch_bytes(batch),
        frame_bytes: 0,
        wall_s,
        cpu_s,
    })
}

/// Two nodes' endpoints and data planes in this process, connected over loopback.
struct Pair {
    producer: DataPlane,
    consumer: DataPlane,
    connection: quinn::Connection,
    _accepted: quinn::Connection,
    _endpoints: (ClusterEndpoint, ClusterEndpoint),
    _runtime: tokio::runtime::Runtime,
}

impl Pair {
    fn start() -> Result<Self> {
        // The node process's runtime (`nopstream node`: 2 worker threads).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let ca = CertificateAuthority::generate("bench", DEFAULT_CA_VALIDITY)?;
        let node = |id| Identity::Node(NodeId(id));
        let loopback: SocketAddr = "127.0.0.1:0".parse()?;
        let settings = TransportSettings::default();
        let (consumer_ep, producer_ep, connection, accepted) = runtime.block_on(async {
            let consumer_ep = ClusterEndpoint::bind(
                loopback,
                &ca.issue_credentials(&node(1))?,
                &[Protocol::Node],
                &settings,
            )?;
            let producer_ep = ClusterEndpoint::bind(
                loopback,
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
            let (accepted, dialled) = tokio::time::timeout(Duration::from_secs(10), async {
                tokio::join!(accept, dial)
            })
            .await?;
            anyhow::Ok((
                consumer_ep,
                producer_ep,
                dialled?.connection,
                accepted?.connection,
            ))
        })?;
        let config = DataPlaneConfig::default();
        let producer = DataPlane::new(runtime.handle().clone(), config);
        let consumer = DataPlane::new(runtime.handle().clone(), config);
        consumer.serve(accepted.clone());
        Ok(Pair {
            producer,
            consumer,
            connection,
            _accepted: accepted,
            _endpoints: (consumer_ep, producer_ep),
            _runtime: runtime,
        })
    }
}

/// The QUIC hop: one data-plane stream between two endpoints on loopback. `generation`
/// distinguishes repeated transfers over the same pair.
fn quic_on(pair: &Pair, generation: u64, batch: &Batch, batches: usize) -> Result<Transfer> {
    let header = StreamHeader {
        job: JobId::new("bench"),
        generation,
        token: FencingToken(generation),
        channel: channel_id(),
    };
    let rx = pair.consumer.register_receiver(
        header.job.clone(),
        header.generation,
        header.token,
        header.channel.clone(),
        QUEUE,
    )?;
    // As the runtime does: it waits on the queue itself.
    let (queue, _guard) = rx.into_parts();
    let mut tx = pair.producer.open_sender(&pair.connection, header)?;
    let frame_bytes = codec::encode(&Message::Records(batch.clone()), codec::MAX_DATA_FRAME)?.len()
        + codec::LENGTH_PREFIX;
    let template = batch.clone();
    let cpu0 = self_cpu_s();
    let started = Instant::now();
    let producer = std::thread::spawn(move || -> Result<()> {
        for _ in 0..batches {
            tx.send(Message::Records(template.clone()))?;
        }
        tx.send(Message::End)?;
        tx.close()?;
        Ok(())
    });
    let mut got = 0;
    loop {
        match queue.recv_timeout(Duration::from_secs(30)) {
            Ok(Message::Records(b)) => {
                got += b.len();
                drop(b);
            }
            Ok(Message::End) => break,
            Ok(_) => {}
            Err(e) => bail!("receive: {e}"),
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = self_cpu_s() - cpu0;
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("producer panicked"))??;
    anyhow::ensure!(got == batches * batch.len(), "received {got} records");
    Ok(Transfer {
        channel: "quic".into(),
        batch_records: batch.len(),
        batches,
        batch_bytes: batch_bytes(batch),
        frame_bytes,
        wall_s,
        cpu_s,
    })
}

/// Median of `v` (0 if empty).
fn median(v: &[f64]) -> f64 {
    crate::epochs::Spread::of(v).median
}

/// Runs `runs` interleaved transfers of each kind for each batch size (each transfer moves
/// about `records` records), prints a side-by-side table and returns every transfer.
///
/// # Errors
/// A failed transfer.
pub fn run(batch_sizes: &[usize], records: usize, runs: usize) -> Result<Vec<Transfer>> {
    let pair = Pair::start()?;
    let mut all = Vec::new();
    let mut generation = 1;
    println!(
        "| records/batch | batch bytes | frame bytes | in-process rec/s | in-process MB/s | QUIC rec/s | QUIC MB/s | QUIC ÷ in-process (rec/s) | in-process rec/CPU-s | QUIC rec/CPU-s | QUIC ÷ in-process (rec/CPU-s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &size in batch_sizes {
        let batch = bid_batch(size)?;
        let batches = (records / size).max(1);
        // Warm-up of both paths (allocator, stream windows).
        in_process(&batch, batches / 10 + 1)?;
        quic_on(&pair, generation, &batch, batches / 10 + 1)?;
        generation += 1;
        let mut local = Vec::new();
        let mut quic = Vec::new();
        for _ in 0..runs {
            local.push(in_process(&batch, batches)?);
            quic.push(quic_on(&pair, generation, &batch, batches)?);
            generation += 1;
        }
        let m =
            |v: &[Transfer], f: fn(&Transfer) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        let (l_rps, q_rps) = (
            m(&local, Transfer::records_per_s),
            m(&quic, Transfer::records_per_s),
        );
        let (l_cpu, q_cpu) = (
            m(&local, Transfer::records_per_cpu_s),
            m(&quic, Transfer::records_per_cpu_s),
        );
        println!(
            "| {size} | {} | {} | {} | {:.0} | {} | {:.0} | {:.3} | {} | {} | {:.3} |",
            local[0].batch_bytes,
            quic[0].frame_bytes,
            crate::report::human(l_rps),
            m(&local, Transfer::mb_per_s),
            crate::report::human(q_rps),
            m(&quic, Transfer::mb_per_s),
            q_rps / l_rps,
            crate::report::human(l_cpu),
            crate::report::human(q_cpu),
            q_cpu / l_cpu,
        );
        all.extend(local);
        all.extend(quic);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bid_batches_look_like_the_parse_output_and_cross_both_channels() {
        let b = bid_batch(64).unwrap();
        assert_eq!(b.len(), 64);
        assert_eq!(b.keys.len(), 64 * 8);
        assert_eq!(b.timestamps.len(), 64);
        assert!(b.data.len() >= 64 * bids_parser::BID_FIXED_BYTES);
        let t = in_process(&b, 10).unwrap();
        assert_eq!(t.batches, 10);
        let pair = Pair::start().unwrap();
        let q = quic_on(&pair, 1, &b, 10).unwrap();
        assert!(q.frame_bytes > b.data.len(), "{q:?}");
        assert!(q.wall_s > 0.0);
    }
}
