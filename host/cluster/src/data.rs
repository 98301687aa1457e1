//! The QUIC data plane: channels between subtasks on different nodes (design §2.5, §19).
//!
//! One unidirectional QUIC stream carries one channel, opened by the producer. Its first
//! frame is a [`StreamHeader`]; then one frame per [`Message`], in the channel's order
//! (records, watermarks and barriers share the stream, so barrier alignment sees QUIC
//! stream order). Frames use the proto codec ([`nop_stream_proto::codec`]).
//!
//! # Usage
//!
//! ```no_run
//! # fn demo(plane: nop_stream_cluster::DataPlane, conn: quinn::Connection)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use nop_stream_api::{ChannelId, EdgeId, FencingToken, JobId, SubtaskIndex};
//! use nop_stream_proto::{Message, StreamHeader};
//! use std::time::Duration;
//!
//! let channel = ChannelId {
//!     edge: EdgeId::new("map->sink#0"),
//!     upstream: SubtaskIndex(0),
//!     downstream: SubtaskIndex(1),
//!     index: 0,
//! };
//! // Receiving node, before the producer is deployed (and `plane.serve(conn)` once per
//! // connection):
//! let mut rx = plane.register_receiver(JobId::new("job"), 3, FencingToken(42), channel.clone(), 16)?;
//! // Producing node, on a task thread:
//! let header = StreamHeader { job: JobId::new("job"), generation: 3, token: FencingToken(42), channel };
//! let mut tx = plane.open_sender(&conn, header)?;
//! tx.send(Message::Watermark(1_000))?; // blocks while the receiver does not keep up
//! tx.send(Message::End)?;
//! tx.close()?;
//! // Receiving task thread:
//! assert_eq!(rx.recv_timeout(Duration::from_secs(1))?, Some(Message::Watermark(1_000)));
//! # Ok(()) }
//! ```
//!
//! # Threads and tasks
//!
//! Subtasks run on plain std threads; quinn runs on tokio. The bridge is explicit:
//!
//! - **Producer**: [`QuicSender::send`] encodes on the calling thread, length prefix and
//!   postcard payload into one buffer, and hands that buffer to the channel's writer task
//!   through a bounded tokio queue of [`DataPlaneConfig::send_queue`] frames
//!   (`blocking_send`). The writer task gives each frame to quinn as one chunk
//!   (`write_chunk`, which takes the buffer over without a copy) and waits while QUIC flow
//!   control has no credit for the stream; the queue then fills and `send` blocks. That is
//!   the backpressure.
//! - **Receiver**: [`DataPlane::serve`] runs one acceptor task per connection; each
//!   accepted stream gets a reader task that reads the header (bounded by
//!   [`DataPlaneConfig::header_timeout`] and [`DataPlaneConfig::max_header_len`]), admits
//!   it against the [`FenceTable`], then decodes frames into the channel's bounded
//!   `crossbeam_channel` queue (capacity in messages, given to
//!   [`DataPlane::register_receiver`]). A records frame's payload bytes are read from quinn
//!   straight into the vector the delivered [`nop_stream_api::Batch`] owns (one copy, out
//!   of quinn's packet buffers) and its other fields are decoded from a second buffer
//!   ([`nop_stream_proto::records_head`]); any other message is read into one buffer and
//!   decoded. When the queue is full the reader waits (on a
//!   `tokio::sync::Notify` the receiver pokes after every receive) and stops reading the
//!   stream, so the stream's receive window fills and stalls that one producer; the
//!   connection and its other streams go on (size windows by the rule on
//!   [`crate::TransportSettings`]).
//!
//! # Fencing
//!
//! Fencing is checked on the receiving side (design §2.5), twice: a stream whose header does
//! not match what is registered is refused (stopped with a [`Refusal`] code, and counted
//! per job, [`FenceTable::refused`]); and after [`FenceTable::fence`] a receiver of an older
//! generation returns [`DataError::Fenced`] for queued and arriving messages alike.
//!
//! # Memory
//!
//! Per receiving channel at most `capacity` decoded messages, plus the one message its
//! reader is reading, plus `stream_receive_window` bytes in quinn. Per sending
//! channel `send_queue` encoded frames plus one being written.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{self as cb, RecvTimeoutError, TrySendError};
use nop_stream_api::{ChannelId, FencingToken, JobId};
use nop_stream_proto::codec::{self, CodecError, MAX_DATA_FRAME};
use nop_stream_proto::{
    MAX_PAYLOAD_HEAD, Message, PayloadHead, StreamHeader, records_from_parts, records_head,
};
use quinn::VarInt;
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

use crate::frame::{self, FrameError};

/// Why a receiver refused or abandoned a data stream. The receiver stops the stream
/// (`STOP_SENDING`) with [`Refusal::code`] as the QUIC application error code, so the
/// producer's next write fails with [`DataError::Refused`] naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Code 1 ([`frame::ERR_FRAME_TOO_LARGE`]): a length prefix over the cap (header or
    /// message); nothing of the claimed size was allocated.
    FrameTooLarge,
    /// Code 2: a frame is not a valid encoding of a header or message.
    Malformed,
    /// Code `0x20`: no receiver of the header's job is known here.
    UnknownJob,
    /// Code `0x21`: the header's generation is older than the one in force (fenced) or than
    /// the channel's registration.
    StaleGeneration,
    /// Code `0x22`: the header's generation is newer than the channel's registration (the
    /// receiver has not been deployed for it yet).
    FutureGeneration,
    /// Code `0x23`: the header's fencing token is not the one registered for the channel.
    WrongToken,
    /// Code `0x24`: the job is known but the channel is not registered to receive.
    UnknownChannel,
    /// Code `0x25`: the channel already has a stream.
    DuplicateStream,
    /// Code `0x26`: no complete header within [`DataPlaneConfig::header_timeout`].
    HeaderTimeout,
    /// Code `0x27`: the channel's generation was fenced while the stream was open.
    Fenced,
    /// Code `0x28`: the receiving task dropped its [`QuicReceiver`].
    ReceiverGone,
}

impl Refusal {
    const ALL: [Refusal; 11] = [
        Refusal::FrameTooLarge,
        Refusal::Malformed,
        Refusal::UnknownJob,
        Refusal::StaleGeneration,
        Refusal::FutureGeneration,
        Refusal::WrongToken,
        Refusal::UnknownChannel,
        Refusal::DuplicateStream,
        Refusal::HeaderTimeout,
        Refusal::Fenced,
        Refusal::ReceiverGone,
    ];

    /// The QUIC application error code the stream is stopped with.
    pub fn code(self) -> u32 {
        match self {
            Refusal::FrameTooLarge => frame::ERR_FRAME_TOO_LARGE,
            Refusal::Malformed => 2,
            Refusal::UnknownJob => 0x20,
            Refusal::StaleGeneration => 0x21,
            Refusal::FutureGeneration => 0x22,
            Refusal::WrongToken => 0x23,
            Refusal::UnknownChannel => 0x24,
            Refusal::DuplicateStream => 0x25,
            Refusal::HeaderTimeout => 0x26,
            Refusal::Fenced => 0x27,
            Refusal::ReceiverGone => 0x28,
        }
    }

    /// The refusal a stop code stands for, if it is one of ours.
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|r| u64::from(r.code()) == code)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::FrameTooLarge => "frame over the size cap",
            Refusal::Malformed => "malformed frame",
            Refusal::UnknownJob => "unknown job",
            Refusal::StaleGeneration => "stale generation",
            Refusal::FutureGeneration => "generation not yet deployed",
            Refusal::WrongToken => "wrong fencing token",
            Refusal::UnknownChannel => "channel not registered",
            Refusal::DuplicateStream => "channel already has a stream",
            Refusal::HeaderTimeout => "no header in time",
            Refusal::Fenced => "generation fenced",
            Refusal::ReceiverGone => "receiver gone",
        })
    }
}

/// What can go wrong on a data channel. Every message names the channel, and the peer
/// where one is known.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The receiver stopped the stream: a stale or unknown header, fencing, an oversized
    /// or malformed frame, or the receiving task went away.
    #[error("channel {channel} to {peer}: the receiver refused the stream: {reason} (code {code})")]
    Refused {
        /// The channel.
        channel: ChannelId,
        /// The receiving node's address.
        peer: SocketAddr,
        /// The QUIC application error code ([`Refusal::code`]).
        code: u64,
        /// The refusal the code stands for; `None` for a code that is not ours.
        reason: RefusalReason,
    },
    /// The connection carrying the channel is closed or lost.
    #[error("channel {channel} with {peer}: connection lost: {source}")]
    Connection {
        /// The channel.
        channel: ChannelId,
        /// The other node's address.
        peer: SocketAddr,
        /// quinn's reason (boxed: it is large, and errors travel by value).
        source: Box<quinn::ConnectionError>,
    },
    /// The sending task was cancelled (fenced) while its send was stalled.
    #[error("channel {channel} to {peer}: cancelled while stalled by backpressure")]
    Cancelled {
        /// The channel.
        channel: ChannelId,
        /// The receiving node's address.
        peer: SocketAddr,
    },
    /// The sender was closed, or its writer ended after an error already returned.
    #[error("channel {channel} to {peer}: the sender is closed")]
    Closed {
        /// The channel.
        channel: ChannelId,
        /// The receiving node's address.
        peer: SocketAddr,
    },
    /// A header or message could not be encoded within the frame cap.
    #[error("channel {channel}: cannot encode a frame: {source}")]
    Encode {
        /// The channel.
        channel: ChannelId,
        /// The codec's reason (with size and cap for [`CodecError::TooLarge`]).
        source: CodecError,
    },
    /// A blocking call was made on a thread inside a tokio runtime context, where
    /// blocking would stall the runtime.
    #[error("channel {channel}: blocking call from inside a tokio runtime context")]
    AsyncContext {
        /// The channel.
        channel: ChannelId,
    },
    /// The channel's writer task panicked or was cancelled (runtime shut down).
    #[error("channel {channel} to {peer}: writer task failed: {message}")]
    Writer {
        /// The channel.
        channel: ChannelId,
        /// The receiving node's address.
        peer: SocketAddr,
        /// The join error.
        message: String,
    },
    /// The receiver's generation is older than the one in force for its job.
    #[error(
        "channel {channel} of job {job}: generation {generation} is fenced (generation {in_force} in force)"
    )]
    Fenced {
        /// The job.
        job: JobId,
        /// The channel.
        channel: ChannelId,
        /// The receiver's generation.
        generation: u64,
        /// The generation in force.
        in_force: u64,
    },
    /// The channel is already registered to receive (drop the old receiver, or fence its
    /// generation, first).
    #[error("channel {channel} of job {job} is already registered at generation {generation}")]
    AlreadyRegistered {
        /// The job.
        job: JobId,
        /// The channel.
        channel: ChannelId,
        /// The generation of the existing registration.
        generation: u64,
    },
    /// A receive queue must hold at least one message.
    #[error("channel {channel}: receive queue capacity must be at least 1 message")]
    ZeroCapacity {
        /// The channel.
        channel: ChannelId,
    },
    /// The producer finished the stream; every message before it has been received.
    #[error("channel {channel}: the stream from {peer} ended")]
    Ended {
        /// The channel.
        channel: ChannelId,
        /// The producing node's address.
        peer: SocketAddr,
    },
    /// The stream broke (reset, connection lost, oversized or malformed frame, cut inside
    /// a frame); messages before it have been received.
    #[error("channel {channel}: the stream from {peer} failed: {reason}")]
    StreamFailed {
        /// The channel.
        channel: ChannelId,
        /// The producing node's address.
        peer: SocketAddr,
        /// What happened.
        reason: String,
    },
}

/// The decoded reason of a [`DataError::Refused`]: `Some` for our codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalReason(pub Option<Refusal>);

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => r.fmt(f),
            None => f.write_str("unknown reason"),
        }
    }
}

/// Data-plane settings; the same on every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataPlaneConfig {
    /// How long a receiver waits for a new stream's complete header frame before refusing
    /// it with [`Refusal::HeaderTimeout`]. Default 5 s.
    pub header_timeout: Duration,
    /// Cap on the header frame's payload, in bytes. Default 4 KiB.
    pub max_header_len: u32,
    /// Cap on one message frame's payload, in bytes, checked by the sender before sending
    /// and by the receiver from the length prefix. Default [`MAX_DATA_FRAME`] (80 MiB).
    pub max_frame_len: usize,
    /// Encoded frames a [`QuicSender`] queues ahead of its writer task before `send`
    /// blocks. Default 4; at least 1.
    pub send_queue: usize,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(5),
            max_header_len: 4 * 1024,
            max_frame_len: MAX_DATA_FRAME,
            send_queue: 4,
        }
    }
}

/// How a channel's stream ended, other than by the producer's clean finish.
#[derive(Debug, Clone)]
struct Terminal {
    peer: SocketAddr,
    /// `None`: finished cleanly.
    failure: Option<String>,
}

/// One channel registered to receive.
#[derive(Debug)]
struct Slot {
    job: JobId,
    channel: ChannelId,
    generation: u64,
    token: FencingToken,
    /// The job's generation in force, shared with [`FenceTable`].
    in_force: Arc<AtomicU64>,
    /// The queue's only sender: taken by the reader of the admitted stream and dropped
    /// when the stream ends, so the receiving side sees the queue disconnect after the
    /// last message.
    tx: Mutex<Option<cb::Sender<Message>>>,
    /// How the stream ended, set before the sender is dropped.
    terminal: Mutex<Option<Terminal>>,
    /// Poked after every receive, on fence and on drop of the receiver.
    space: Notify,
    /// Whether a stream has been admitted for this channel.
    claimed: AtomicBool,
}

impl Slot {
    fn fenced(&self) -> Option<u64> {
        let in_force = self.in_force.load(Ordering::Acquire);
        (in_force > self.generation).then_some(in_force)
    }

    fn terminal(&self) -> Option<Terminal> {
        self.terminal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records how the stream ended and drops the queue's sender.
    fn end(&self, terminal: Terminal) {
        *self.terminal.lock().unwrap_or_else(|e| e.into_inner()) = Some(terminal);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

#[derive(Debug, Default)]
struct JobEntry {
    in_force: Arc<AtomicU64>,
    channels: HashMap<ChannelId, Arc<Slot>>,
}

#[derive(Debug, Default)]
struct FenceState {
    jobs: HashMap<JobId, JobEntry>,
    refused: HashMap<JobId, u64>,
    refused_without_header: u64,
}

/// What is in force on this node, per job: the generation (raised by
/// [`FenceTable::fence`]) and the channels registered to receive, each with the generation
/// and fencing token its producer must present. Fencing tokens are per producing attempt
/// (design §10.2), so they are kept per channel.
///
/// Shared by a [`DataPlane`]'s reader tasks and receivers.
#[derive(Debug, Default)]
pub struct FenceTable {
    state: Mutex<FenceState>,
}

impl FenceTable {
    fn lock(&self) -> MutexGuard<'_, FenceState> {
        // The state stays consistent on panic (plain map updates), so a poisoned lock is
        // still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `generation` in force for `job`: streams and receivers of older generations are
    /// refused from now on, including messages already queued. Never lowers the
    /// generation. Receivers of older generations are unregistered.
    pub fn fence(&self, job: &JobId, generation: u64) {
        let mut state = self.lock();
        let entry = state.jobs.entry(job.clone()).or_default();
        entry.in_force.fetch_max(generation, Ordering::AcqRel);
        let in_force = entry.in_force.load(Ordering::Acquire);
        entry.channels.retain(|_, slot| {
            let keep = slot.generation >= in_force;
            if !keep {
                // Wakes a reader waiting for queue space, so it stops the stream.
                slot.space.notify_one();
            }
            keep
        });
        tracing::info!(%job, generation = in_force, "data channels fenced");
    }

    /// The generation in force for `job` (0 until fenced), or `None` if no receiver or
    /// fence of the job was ever seen.
    pub fn generation(&self, job: &JobId) -> Option<u64> {
        let state = self.lock();
        state
            .jobs
            .get(job)
            .map(|e| e.in_force.load(Ordering::Acquire))
    }

    /// Streams refused for `job` since the table was made: stale, unknown or duplicate
    /// headers, and streams of the job stopped on fencing. Oversized or malformed frames after an
    /// admitted header are not refusals of a header and are not counted here.
    pub fn refused(&self, job: &JobId) -> u64 {
        self.lock().refused.get(job).copied().unwrap_or(0)
    }

    /// Streams refused before a header could be read (timeout, oversized or malformed
    /// header, finished without one).
    pub fn refused_without_header(&self) -> u64 {
        self.lock().refused_without_header
    }

    fn count_refused(&self, job: &JobId) {
        *self.lock().refused.entry(job.clone()).or_default() += 1;
    }

    fn count_refused_without_header(&self) {
        self.lock().refused_without_header += 1;
    }

    fn register(
        &self,
        job: JobId,
        generation: u64,
        token: FencingToken,
        channel: ChannelId,
        capacity: usize,
    ) -> Result<(Arc<Slot>, cb::Receiver<Message>), DataError> {
        if capacity == 0 {
            return Err(DataError::ZeroCapacity { channel });
        }
        let mut state = self.lock();
        let entry = state.jobs.entry(job.clone()).or_default();
        let in_force = entry.in_force.load(Ordering::Acquire);
        if generation < in_force {
            return Err(DataError::Fenced {
                job,
                channel,
                generation,
                in_force,
            });
        }
        if let Some(existing) = entry.channels.get(&channel) {
            return Err(DataError::AlreadyRegistered {
                job,
                channel,
                generation: existing.generation,
            });
        }
        let (tx, rx) = cb::bounded(capacity);
        let slot = Arc::new(Slot {
            job,
            channel: channel.clone(),
            generation,
            token,
            in_force: entry.in_force.clone(),
            tx: Mutex::new(Some(tx)),
            terminal: Mutex::new(None),
            space: Notify::new(),
            claimed: AtomicBool::new(false),
        });
        entry.channels.insert(channel, slot.clone());
        Ok((slot, rx))
    }

    fn unregister(&self, slot: &Arc<Slot>) {
        let mut state = self.lock();
        if let Some(entry) = state.jobs.get_mut(&slot.job)
            && entry
                .channels
                .get(&slot.channel)
                .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            entry.channels.remove(&slot.channel);
        }
    }

    /// Checks a header against what is in force; refusals are counted.
    fn admit(&self, header: &StreamHeader) -> Result<Arc<Slot>, Refusal> {
        let verdict = self.check(header);
        if verdict.is_err() {
            self.count_refused(&header.job);
        }
        verdict
    }

    fn check(&self, header: &StreamHeader) -> Result<Arc<Slot>, Refusal> {
        let state = self.lock();
        let entry = state.jobs.get(&header.job).ok_or(Refusal::UnknownJob)?;
        if header.generation < entry.in_force.load(Ordering::Acquire) {
            return Err(Refusal::StaleGeneration);
        }
        let slot = entry
            .channels
            .get(&header.channel)
            .ok_or(Refusal::UnknownChannel)?;
        if header.generation < slot.generation {
            return Err(Refusal::StaleGeneration);
        }
        if header.generation > slot.generation {
            return Err(Refusal::FutureGeneration);
        }
        if header.token != slot.token {
            return Err(Refusal::WrongToken);
        }
        if slot.claimed.swap(true, Ordering::AcqRel) {
            return Err(Refusal::DuplicateStream);
        }
        Ok(slot.clone())
    }
}

/// The data plane of one node: opens channels to other nodes and receives channels from
/// them, with one [`FenceTable`]. Cheap to clone (handles).
#[derive(Debug, Clone)]
pub struct DataPlane {
    runtime: Handle,
    fences: Arc<FenceTable>,
    config: DataPlaneConfig,
}

impl DataPlane {
    /// A data plane whose tasks run on `runtime` (the process's tokio runtime, with the
    /// time driver enabled).
    pub fn new(runtime: Handle, config: DataPlaneConfig) -> Self {
        Self {
            runtime,
            fences: Arc::new(FenceTable::default()),
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &DataPlaneConfig {
        &self.config
    }

    /// What is in force on this node; fence a job's older generations with
    /// [`FenceTable::fence`].
    pub fn fences(&self) -> &FenceTable {
        &self.fences
    }

    /// Starts accepting data streams on `connection` (one acceptor task, one reader task
    /// per stream). The task ends when the connection closes. Callable from any thread.
    ///
    /// The data plane owns the connection's incoming unidirectional streams: every one is
    /// read as a data channel (control sessions and requests use bidirectional streams,
    /// notes §1.5). Call it once per connection.
    pub fn serve(&self, connection: quinn::Connection) -> JoinHandle<()> {
        let fences = self.fences.clone();
        let config = self.config;
        self.runtime
            .spawn(accept_streams(connection, fences, config))
    }

    /// Opens the channel `header.channel` to the peer of `connection`: a writer task opens
    /// one unidirectional stream and writes the header frame at once (quinn opens streams
    /// lazily, notes P1), then the frames given to [`QuicSender::send`]. Does not block,
    /// so it is callable from any thread; a refusal by the receiver surfaces at a later
    /// `send` or at [`QuicSender::close`].
    ///
    /// # Errors
    ///
    /// [`DataError::Connection`] if the connection is already closed,
    /// [`DataError::Encode`] if the header exceeds [`DataPlaneConfig::max_header_len`].
    pub fn open_sender(
        &self,
        connection: &quinn::Connection,
        header: StreamHeader,
    ) -> Result<QuicSender, DataError> {
        let channel = header.channel.clone();
        let peer = connection.remote_address();
        if let Some(source) = connection.close_reason() {
            return Err(DataError::Connection {
                channel,
                peer,
                source: Box::new(source),
            });
        }
        let header_frame =
            codec::frame(&header, self.config.max_header_len as usize).map_err(|source| {
                DataError::Encode {
                    channel: channel.clone(),
                    source,
                }
            })?;
        let (frames, queue) = mpsc::channel(self.config.send_queue.max(1));
        let writer = self.runtime.spawn(write_stream(
            connection.clone(),
            header_frame,
            queue,
            channel.clone(),
        ));
        Ok(QuicSender {
            channel,
            peer,
            frames: Some(frames),
            writer: Some(writer),
            runtime: self.runtime.clone(),
            max_frame_len: self.config.max_frame_len,
            cancel: None,
        })
    }

    /// Registers `channel` of `job` to receive from a producer of `generation` holding
    /// `token`, into a queue of `capacity` messages (each at most
    /// [`DataPlaneConfig::max_frame_len`] bytes encoded). Register before the producer
    /// opens its stream: a header for an unregistered channel is refused
    /// ([`Refusal::UnknownChannel`]). A registration admits one stream: channels are not
    /// resumed, a broken one fails the attempt (design §2.5), so a second stream is refused
    /// ([`Refusal::DuplicateStream`]). Dropping the receiver unregisters the channel.
    ///
    /// # Errors
    ///
    /// [`DataError::ZeroCapacity`], [`DataError::Fenced`] if `generation` is older than
    /// the one in force, [`DataError::AlreadyRegistered`].
    pub fn register_receiver(
        &self,
        job: JobId,
        generation: u64,
        token: FencingToken,
        channel: ChannelId,
        capacity: usize,
    ) -> Result<QuicReceiver, DataError> {
        let (slot, rx) = self
            .fences
            .register(job, generation, token, channel, capacity)?;
        Ok(QuicReceiver {
            guard: ReceiverGuard {
                slot,
                fences: self.fences.clone(),
            },
            rx,
        })
    }
}

/// The producing end of one channel. `send` blocks; use it from a task thread, not from
/// inside a tokio runtime. Dropping it finishes the stream (without waiting).
#[derive(Debug)]
pub struct QuicSender {
    channel: ChannelId,
    peer: SocketAddr,
    frames: Option<mpsc::Sender<Bytes>>,
    writer: Option<JoinHandle<Result<(), DataError>>>,
    runtime: Handle,
    max_frame_len: usize,
    /// Set when the task is cancelled (fencing); a send stalled by backpressure gives up
    /// within [`CANCEL_POLL`] once it is. `None`: a stalled send waits for the receiver or
    /// the connection's end.
    cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// How often a send stalled by backpressure looks at its cancel flag.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl QuicSender {
    /// Lets a send stalled by backpressure give up with [`DataError::Cancelled`] once
    /// `cancel` is set: a fenced task blocked towards a dead or partitioned node ends at
    /// once instead of waiting for the QUIC idle timeout (design §2.5, "fencing").
    pub fn cancel_on(&mut self, cancel: Arc<std::sync::atomic::AtomicBool>) {
        self.cancel = Some(cancel);
    }

    /// The channel.
    pub fn channel(&self) -> &ChannelId {
        &self.channel
    }

    /// The receiving node's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Sends `msg` after the messages sent before it. Blocks while the channel's send queue
    /// is full, i.e. while QUIC flow control stalls the stream because the receiver does
    /// not consume (backpressure, design §4.4).
    ///
    /// # Errors
    ///
    /// [`DataError::Encode`] if `msg` exceeds [`DataPlaneConfig::max_frame_len`] (nothing
    /// is sent; the channel stays usable); [`DataError::AsyncContext`] if called inside a
    /// tokio runtime context; once the writer has failed: [`DataError::Refused`] (the
    /// receiver stopped the stream), [`DataError::Connection`], and [`DataError::Closed`]
    /// on every later call. Messages after the one that failed were not delivered.
    pub fn send(&mut self, msg: Message) -> Result<(), DataError> {
        let frame = Bytes::from(codec::frame(&msg, self.max_frame_len).map_err(|source| {
            DataError::Encode {
                channel: self.channel.clone(),
                source,
            }
        })?);
        self.check_context()?;
        let Some(frames) = &self.frames else {
            return Err(self.closed());
        };
        let sent = match &self.cancel {
            None => frames.blocking_send(frame).is_ok(),
            Some(cancel) => match frames.try_send(frame) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
                Err(mpsc::error::TrySendError::Full(frame)) => {
                    // Stalled by backpressure: wait for room, looking at the cancel flag.
                    loop {
                        if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                            return Err(DataError::Cancelled {
                                channel: self.channel.clone(),
                                peer: self.peer,
                            });
                        }
                        // The timer is made inside `block_on`, in the runtime's context.
                        let waited = self.runtime.block_on(async {
                            tokio::time::timeout(CANCEL_POLL, frames.reserve()).await
                        });
                        match waited {
                            Ok(Ok(permit)) => {
                                permit.send(frame);
                                break true;
                            }
                            Ok(Err(_)) => break false,
                            Err(_) => {}
                        }
                    }
                }
            },
        };
        if !sent {
            // The writer ended; its result says why.
            self.frames = None;
            return Err(self.join_writer().err().unwrap_or_else(|| self.closed()));
        }
        Ok(())
    }

    /// Finishes the stream and waits until the receiving node has acknowledged every byte
    /// (which needs the receiver to consume all but its queue's and window's worth), or
    /// the receiver refused the stream.
    ///
    /// A short stream may be acknowledged before a refusal arrives, so `Ok` does not prove
    /// that the receiver admitted the stream; a refused stream never reaches a queue.
    ///
    /// # Errors
    ///
    /// [`DataError::Refused`], [`DataError::Connection`], [`DataError::AsyncContext`],
    /// [`DataError::Closed`] if an earlier call already returned the writer's error.
    pub fn close(mut self) -> Result<(), DataError> {
        self.check_context()?;
        self.frames = None;
        if self.writer.is_none() {
            return Err(self.closed());
        }
        self.join_writer()
    }

    fn check_context(&self) -> Result<(), DataError> {
        if Handle::try_current().is_ok() {
            return Err(DataError::AsyncContext {
                channel: self.channel.clone(),
            });
        }
        Ok(())
    }

    fn closed(&self) -> DataError {
        DataError::Closed {
            channel: self.channel.clone(),
            peer: self.peer,
        }
    }

    fn join_writer(&mut self) -> Result<(), DataError> {
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        match self.runtime.block_on(writer) {
            Ok(result) => result,
            Err(e) => Err(DataError::Writer {
                channel: self.channel.clone(),
                peer: self.peer,
                message: e.to_string(),
            }),
        }
    }
}

async fn write_stream(
    connection: quinn::Connection,
    header_frame: Vec<u8>,
    mut frames: mpsc::Receiver<Bytes>,
    channel: ChannelId,
) -> Result<(), DataError> {
    let peer = connection.remote_address();
    let lost = |source| DataError::Connection {
        channel: channel.clone(),
        peer,
        source: Box::new(source),
    };
    let mut send = connection.open_uni().await.map_err(lost)?;
    let write_failed = |e: quinn::WriteError| match e {
        quinn::WriteError::Stopped(code) => refused(&channel, peer, code),
        quinn::WriteError::ConnectionLost(source) => lost(source),
        quinn::WriteError::ClosedStream | quinn::WriteError::ZeroRttRejected => DataError::Closed {
            channel: channel.clone(),
            peer,
        },
    };
    send.write_chunk(Bytes::from(header_frame))
        .await
        .map_err(write_failed)?;
    while let Some(frame) = frames.recv().await {
        send.write_chunk(frame).await.map_err(write_failed)?;
    }
    // Fails only if the stream was stopped or reset; `stopped` reports the code then.
    let _ = send.finish();
    match send.stopped().await {
        Ok(None) => Ok(()),
        Ok(Some(code)) => Err(refused(&channel, peer, code)),
        Err(quinn::StoppedError::ConnectionLost(source)) => Err(lost(source)),
        Err(quinn::StoppedError::ZeroRttRejected) => Err(DataError::Closed {
            channel: channel.clone(),
            peer,
        }),
    }
}

fn refused(channel: &ChannelId, peer: SocketAddr, code: VarInt) -> DataError {
    let code = code.into_inner();
    DataError::Refused {
        channel: channel.clone(),
        peer,
        code,
        reason: RefusalReason(Refusal::from_code(code)),
    }
}

/// The receiving end of one channel, for a task thread. Dropping it unregisters the
/// channel and refuses the rest of its stream ([`Refusal::ReceiverGone`]).
#[derive(Debug)]
pub struct QuicReceiver {
    guard: ReceiverGuard,
    rx: cb::Receiver<Message>,
}

impl QuicReceiver {
    /// The channel.
    pub fn channel(&self) -> &ChannelId {
        &self.guard.slot.channel
    }

    /// The generation this receiver was registered for.
    pub fn generation(&self) -> u64 {
        self.guard.slot.generation
    }

    /// Messages waiting in the queue (at most the capacity).
    pub fn queued(&self) -> usize {
        self.rx.len()
    }

    /// The next message, waiting up to `timeout`; `Ok(None)` if none arrived in time. The
    /// fence is checked before waiting and again on the message received, so a message
    /// queued before [`FenceTable::fence`] is refused too.
    ///
    /// # Errors
    ///
    /// [`DataError::Fenced`] once the receiver's generation is fenced (then on every call);
    /// [`DataError::Ended`] after the producer finished the stream, and
    /// [`DataError::StreamFailed`] after it broke, both once every message before has been
    /// returned, and then on every call.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, DataError> {
        self.guard.check_fence()?;
        let msg = match self.rx.recv_timeout(timeout) {
            Ok(msg) => msg,
            Err(RecvTimeoutError::Timeout) => return Ok(None),
            // The reader dropped the queue's sender: the stream ended.
            Err(RecvTimeoutError::Disconnected) => {
                let t = self.guard.slot.terminal().unwrap_or(Terminal {
                    peer: SocketAddr::from(([0, 0, 0, 0], 0)),
                    failure: Some("the stream's reader ended".into()),
                });
                let channel = self.guard.slot.channel.clone();
                return Err(match t.failure {
                    None => DataError::Ended {
                        channel,
                        peer: t.peer,
                    },
                    Some(reason) => DataError::StreamFailed {
                        channel,
                        peer: t.peer,
                        reason,
                    },
                });
            }
        };
        self.guard.slot.space.notify_one();
        self.guard.check_fence()?;
        Ok(Some(msg))
    }

    /// Takes the receiver apart for a task driver that waits on many queues at once: the
    /// queue (it disconnects after the last message of the stream) and the guard that
    /// keeps the channel registered. A full queue is noticed by the reader within a
    /// millisecond of a receive, without [`Self::recv_timeout`]'s wake-up. The caller
    /// checks fencing itself (the runtime checks its attempt's token on every message).
    pub fn into_parts(self) -> (cb::Receiver<Message>, ReceiverGuard) {
        (self.rx, self.guard)
    }
}

/// Keeps a receiving channel registered; dropping it unregisters the channel and refuses
/// the rest of its stream ([`Refusal::ReceiverGone`]).
#[derive(Debug)]
pub struct ReceiverGuard {
    slot: Arc<Slot>,
    fences: Arc<FenceTable>,
}

impl ReceiverGuard {
    fn check_fence(&self) -> Result<(), DataError> {
        match self.slot.fenced() {
            Some(in_force) => Err(DataError::Fenced {
                job: self.slot.job.clone(),
                channel: self.slot.channel.clone(),
                generation: self.slot.generation,
                in_force,
            }),
            None => Ok(()),
        }
    }

    /// Why the stream ended, once it has: `None` while it runs or after a clean finish;
    /// the failure (naming the peer) otherwise.
    pub fn failure(&self) -> Option<String> {
        self.slot.terminal().and_then(|t| {
            t.failure
                .map(|f| format!("stream from {} failed: {f}", t.peer))
        })
    }
}

impl Drop for ReceiverGuard {
    fn drop(&mut self) {
        self.fences.unregister(&self.slot);
        // Wake the reader so it sees the receiver gone (its next delivery finds the queue
        // disconnected once the receiver is dropped too).
        self.slot.space.notify_one();
    }
}

async fn accept_streams(
    connection: quinn::Connection,
    fences: Arc<FenceTable>,
    config: DataPlaneConfig,
) {
    let peer = connection.remote_address();
    loop {
        match connection.accept_uni().await {
            Ok(recv) => {
                tokio::spawn(read_stream(recv, peer, fences.clone(), config));
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "data acceptor ends");
                return;
            }
        }
    }
}

/// How a stream's reading ended, other than by a clean finish.
struct Stop {
    /// The code to stop the stream with, if it is still open.
    refusal: Option<Refusal>,
    /// What to tell the receiving task, if anything.
    failure: Option<String>,
}

async fn read_stream(
    mut recv: quinn::RecvStream,
    peer: SocketAddr,
    fences: Arc<FenceTable>,
    config: DataPlaneConfig,
) {
    let header = tokio::time::timeout(
        config.header_timeout,
        frame::read_value::<StreamHeader>(&mut recv, config.max_header_len),
    )
    .await;
    let header = match header {
        Ok(Ok(Some(header))) => header,
        Ok(Ok(None)) => {
            fences.count_refused_without_header();
            tracing::warn!(%peer, "data stream finished before its header");
            return;
        }
        Ok(Err(e)) => {
            fences.count_refused_without_header();
            tracing::warn!(%peer, error = %e, "data stream refused before its header");
            let refusal = match e {
                FrameError::TooLarge { .. } => Refusal::FrameTooLarge,
                FrameError::Codec(_) => Refusal::Malformed,
                // Reset, lost or cut: nothing left to stop.
                FrameError::Truncated { .. } | FrameError::Read(_) | FrameError::Write(_) => {
                    return;
                }
            };
            let _ = recv.stop(VarInt::from_u32(refusal.code()));
            return;
        }
        Err(_) => {
            fences.count_refused_without_header();
            tracing::warn!(%peer, timeout = ?config.header_timeout, "no data stream header in time");
            let _ = recv.stop(VarInt::from_u32(Refusal::HeaderTimeout.code()));
            return;
        }
    };
    let slot = match fences.admit(&header) {
        Ok(slot) => slot,
        Err(refusal) => {
            tracing::warn!(
                %peer, job = %header.job, channel = %header.channel,
                generation = header.generation, token = %header.token, %refusal,
                "data stream refused"
            );
            let _ = recv.stop(VarInt::from_u32(refusal.code()));
            return;
        }
    };
    let Some(tx) = slot.tx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        // Admission claims the slot once, so the sender is there.
        return;
    };
    let end = match pump(&mut recv, &slot, &tx, config.max_frame_len).await {
        Ok(()) => Terminal {
            peer,
            failure: None,
        },
        Err(stop) => {
            if let Some(refusal) = stop.refusal {
                if matches!(refusal, Refusal::Fenced) {
                    fences.count_refused(&slot.job);
                }
                tracing::warn!(%peer, channel = %slot.channel, %refusal, "data stream stopped");
                let _ = recv.stop(VarInt::from_u32(refusal.code()));
            }
            Terminal {
                peer,
                failure: Some(
                    stop.failure
                        .unwrap_or_else(|| "the stream was stopped".to_owned()),
                ),
            }
        }
    };
    slot.end(end);
    drop(tx);
}

/// Reads frames into the slot's queue until the stream finishes.
async fn pump(
    recv: &mut quinn::RecvStream,
    slot: &Slot,
    tx: &cb::Sender<Message>,
    max_frame_len: usize,
) -> Result<(), Stop> {
    let mut prefix = Vec::with_capacity(codec::LENGTH_PREFIX);
    loop {
        prefix.clear();
        if !fill(recv, &mut prefix, codec::LENGTH_PREFIX, true).await? {
            return Ok(());
        }
        let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len > max_frame_len {
            return Err(Stop {
                refusal: Some(Refusal::FrameTooLarge),
                failure: Some(
                    CodecError::TooLarge {
                        size: len,
                        cap: max_frame_len,
                    }
                    .to_string(),
                ),
            });
        }
        let msg = read_message(recv, len, max_frame_len).await?;
        deliver(slot, tx, msg).await.map_err(|refusal| Stop {
            refusal: Some(refusal),
            failure: None,
        })?;
    }
}

/// Reads and decodes one message payload of `len` bytes. A records payload's `data` is
/// read into the batch's own vector; everything else is read into one buffer.
async fn read_message(
    recv: &mut quinn::RecvStream,
    len: usize,
    max_frame_len: usize,
) -> Result<Message, Stop> {
    let malformed = |e: CodecError| Stop {
        refusal: Some(Refusal::Malformed),
        failure: Some(e.to_string()),
    };
    // Enough of the payload to classify it, and never more than the payload.
    let mut head = Vec::with_capacity(MAX_PAYLOAD_HEAD.min(len));
    let decided = loop {
        match records_head(&head) {
            PayloadHead::Incomplete if head.len() < len => {
                let want = (head.len() + 1).max(MAX_PAYLOAD_HEAD.min(len));
                fill(recv, &mut head, want.min(len), false).await?;
            }
            PayloadHead::Incomplete => break PayloadHead::Other,
            decided => break decided,
        }
    };
    match decided {
        PayloadHead::Records { head_len, data_len }
            if head_len.checked_add(data_len).is_some_and(|n| n <= len) =>
        {
            // `head` may already hold the first bytes of `data`, and of the tail after it.
            let in_head = head.len() - head_len;
            let mut data = Vec::with_capacity(data_len);
            data.extend_from_slice(&head[head_len..head_len + in_head.min(data_len)]);
            fill(recv, &mut data, data_len, false).await?;
            let tail_len = len - head_len - data_len;
            let mut tail = Vec::with_capacity(tail_len);
            if in_head > data_len {
                tail.extend_from_slice(&head[head_len + data_len..]);
            }
            fill(recv, &mut tail, tail_len, false).await?;
            records_from_parts(data, &tail, max_frame_len).map_err(malformed)
        }
        _ => {
            let mut payload = head;
            payload.reserve_exact(len - payload.len());
            fill(recv, &mut payload, len, false).await?;
            codec::decode::<Message>(&payload, max_frame_len).map_err(malformed)
        }
    }
}

/// Reads from the stream into `buf` until it holds `upto` bytes, asking quinn for no more
/// than that, so nothing of what follows is taken. Returns `false` if the stream finished
/// before the first byte and `at_boundary` allows that (a clean end between frames).
async fn fill(
    recv: &mut quinn::RecvStream,
    buf: &mut Vec<u8>,
    upto: usize,
    at_boundary: bool,
) -> Result<bool, Stop> {
    while buf.len() < upto {
        match recv.read_chunk(upto - buf.len(), true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) if at_boundary && buf.is_empty() => return Ok(false),
            Ok(None) => {
                return Err(Stop {
                    refusal: None,
                    failure: Some(format!(
                        "stream finished inside a frame ({} of {upto} bytes of a frame part received)",
                        buf.len()
                    )),
                });
            }
            Err(e) => {
                return Err(Stop {
                    refusal: None,
                    failure: Some(format!("read failed: {e}")),
                });
            }
        }
    }
    Ok(true)
}

/// How long a reader waits for space in a full queue before looking again, when no
/// receive wakes it (a task driver receives from the queue directly).
const FULL_QUEUE_POLL: Duration = Duration::from_millis(1);

/// Puts `item` in the slot's queue, waiting (without blocking the runtime, and without
/// reading the stream) while it is full.
async fn deliver(slot: &Slot, tx: &cb::Sender<Message>, mut item: Message) -> Result<(), Refusal> {
    loop {
        if slot.fenced().is_some() {
            return Err(Refusal::Fenced);
        }
        match tx.try_send(item) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(back)) => {
                item = back;
                // A receive between the failed try and this wait leaves a permit, so no
                // wake-up is lost; the timeout covers receivers that do not poke.
                let _ = tokio::time::timeout(FULL_QUEUE_POLL, slot.space.notified()).await;
            }
            Err(TrySendError::Disconnected(_)) => return Err(Refusal::ReceiverGone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{EdgeId, SubtaskIndex};

    fn channel(i: u32) -> ChannelId {
        ChannelId {
            edge: EdgeId::new("a->b#0"),
            upstream: SubtaskIndex(0),
            downstream: SubtaskIndex(i),
            index: 0,
        }
    }

    fn header(job: &str, generation: u64, token: u64, ch: u32) -> StreamHeader {
        StreamHeader {
            job: JobId::new(job),
            generation,
            token: FencingToken(token),
            channel: channel(ch),
        }
    }

    #[test]
    fn refusal_codes_are_distinct_and_round_trip() {
        let mut codes: Vec<u32> = Refusal::ALL.iter().map(|r| r.code()).collect();
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_code(u64::from(r.code())), Some(r));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Refusal::ALL.len());
        assert_eq!(Refusal::from_code(0x99), None);
    }

    #[test]
    fn admission_checks_job_generation_channel_token_and_duplicates() {
        let table = FenceTable::default();
        let (_slot, _rx) = table
            .register(JobId::new("j"), 3, FencingToken(9), channel(0), 4)
            .unwrap();
        let refusal = |h: StreamHeader| table.admit(&h).map(|_| ()).unwrap_err();
        assert_eq!(refusal(header("other", 3, 9, 0)), Refusal::UnknownJob);
        assert_eq!(refusal(header("j", 2, 9, 0)), Refusal::StaleGeneration);
        assert_eq!(refusal(header("j", 4, 9, 0)), Refusal::FutureGeneration);
        assert_eq!(refusal(header("j", 3, 8, 0)), Refusal::WrongToken);
        assert_eq!(refusal(header("j", 3, 9, 1)), Refusal::UnknownChannel);
        assert!(table.admit(&header("j", 3, 9, 0)).is_ok());
        assert_eq!(refusal(header("j", 3, 9, 0)), Refusal::DuplicateStream);
        assert_eq!(table.refused(&JobId::new("j")), 5);
        assert_eq!(table.refused(&JobId::new("other")), 1);
    }

    #[test]
    fn fencing_raises_the_generation_and_unregisters_older_receivers() {
        let table = FenceTable::default();
        let job = JobId::new("j");
        let (old, _rx) = table
            .register(job.clone(), 1, FencingToken(1), channel(0), 1)
            .unwrap();
        table.fence(&job, 2);
        table.fence(&job, 1);
        assert_eq!(table.generation(&job), Some(2));
        assert_eq!(old.fenced(), Some(2));
        assert!(matches!(
            table.register(job.clone(), 1, FencingToken(1), channel(0), 1),
            Err(DataError::Fenced {
                generation: 1,
                in_force: 2,
                ..
            })
        ));
        // The old registration is gone, so the new generation can register the channel.
        let (new, _rx2) = table
            .register(job.clone(), 2, FencingToken(2), channel(0), 1)
            .unwrap();
        assert_eq!(new.fenced(), None);
        assert_eq!(
            table.admit(&header("j", 1, 1, 0)).map(|_| ()).unwrap_err(),
            Refusal::StaleGeneration
        );
        assert!(matches!(
            table.register(job, 2, FencingToken(2), channel(0), 1),
            Err(DataError::AlreadyRegistered { generation: 2, .. })
        ));
    }
}
