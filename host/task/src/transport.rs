//! Channels and transports (design §19, §4.2–§4.4).
//!
//! A channel carries [`Message`]s — record batches, watermarks, barriers and the end
//! marker — in order; order across channels is not defined. Every channel is a bounded
//! queue on the receiving side, so a full channel blocks its producer (backpressure). A
//! [`Transport`] opens the two ends of a channel for a task attempt and checks the
//! attempt's fencing token on open and on every send, even in-process (design §10.2): after
//! [`Transport::fence`], writes of older attempts are refused.
//!
//! Backends: [`LocalTransport`] (in-process queues), and the cluster's QUIC transport
//! (`nop-stream-server`), which delivers into the same bounded per-channel queues from its
//! stream readers, with QUIC flow control as the backpressure across nodes, and keeps
//! channels between subtasks of one node in-process. The frames themselves ([`Message`]) are the plain wire type
//! of `nop-stream-proto`.

use crossbeam_channel::{Receiver, SendTimeoutError, Sender};
use nop_stream_api::{ChannelId, FencingToken};
use nop_stream_plugin_host::{Result, RuntimeError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use nop_stream_proto::Message;

/// Admits a frame of `channel` sent or received under `token` only while it is the token in
/// force (`current`); every transport backend checks its ends with it.
///
/// # Errors
/// [`RuntimeError::Fenced`] naming both tokens.
pub fn admit(channel: &ChannelId, token: FencingToken, current: &AtomicU64) -> Result<()> {
    let current = FencingToken(current.load(Ordering::SeqCst));
    if current != token {
        return Err(RuntimeError::Fenced {
            channel: channel.clone(),
            token,
            current,
        });
    }
    Ok(())
}

/// The receiving end of one channel, bound to an attempt's fencing token. Fencing is
/// checked here, where the channel is received, and not only by the sender (design §2.5):
/// once the transport is fenced, [`ChannelReceiver::admit`] refuses every message still
/// queued or arriving.
pub struct ChannelReceiver {
    channel: ChannelId,
    rx: Receiver<Message>,
    token: FencingToken,
    current: Arc<AtomicU64>,
    guard: Option<Box<dyn ChannelGuard>>,
}

impl std::fmt::Debug for ChannelReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelReceiver")
            .field("channel", &self.channel)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// What a transport backend keeps alive for as long as a receiving end lives (e.g. the
/// registration of a QUIC channel), and what it knows about why the channel closed.
pub trait ChannelGuard: Send {
    /// Why the producer's side went away, if the backend knows (a broken stream, a lost
    /// connection).
    fn close_reason(&self) -> Option<String>;
}

impl ChannelReceiver {
    /// The receiving end of `channel` for the attempt holding `token`, over the queue `rx`
    /// that a transport backend fills in channel order. `current` is the token in force,
    /// shared with the backend's fence: once it differs from `token`, every message is
    /// refused here. The queue disconnecting means the producer is gone: after its
    /// [`Message::End`] that is the normal close, before it a broken channel.
    pub fn new(
        channel: ChannelId,
        rx: Receiver<Message>,
        token: FencingToken,
        current: Arc<AtomicU64>,
    ) -> Self {
        ChannelReceiver {
            channel,
            rx,
            token,
            current,
            guard: None,
        }
    }

    /// Keeps `guard` alive with this end; [`Self::close_reason`] asks it why the channel
    /// closed.
    pub fn with_guard(mut self, guard: Box<dyn ChannelGuard>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Why the producer's side went away, if the backend knows.
    pub fn close_reason(&self) -> Option<String> {
        self.guard.as_ref().and_then(|g| g.close_reason())
    }

    /// The channel.
    pub fn channel(&self) -> &ChannelId {
        &self.channel
    }

    /// The queue, to wait on (e.g. in a `crossbeam_channel::Select`). Every message taken
    /// from it must pass [`Self::admit`] before it is used.
    pub fn queue(&self) -> &Receiver<Message> {
        &self.rx
    }

    /// Checks that the attempt this end belongs to is still the one in force.
    ///
    /// # Errors
    /// [`RuntimeError::Fenced`] once the transport was fenced.
    pub fn admit(&self) -> Result<()> {
        admit(&self.channel, self.token, &self.current)
    }

    /// Receives the next message, blocking, and admits it.
    ///
    /// # Errors
    /// [`RuntimeError::Fenced`] as [`Self::admit`]; [`RuntimeError::ChannelClosed`] once every
    /// sender is gone and the queue is empty.
    pub fn recv(&self) -> Result<Message> {
        let m = self.rx.recv().map_err(|_| RuntimeError::ChannelClosed {
            channel: self.channel.clone(),
            message: "every sender went away".into(),
        })?;
        self.admit()?;
        Ok(m)
    }
}

/// The sending end of one channel, bound to an attempt's fencing token.
pub trait ChannelSender: Send {
    /// The channel.
    fn channel(&self) -> &ChannelId;

    /// Sends `msg`, blocking while the channel is full.
    ///
    /// # Errors
    /// [`RuntimeError::Fenced`] if the attempt was fenced, [`RuntimeError::ChannelClosed`]
    /// if the receiver went away, [`RuntimeError::Cancelled`] if the job is cancelled.
    fn send(&mut self, msg: Message) -> Result<()>;
}

/// A sender that adds the time its `send` takes to its subtask's backpressured time
/// (`nopstream_backpressured_time_seconds`, design §15): one clock read on each side of a
/// message (a batch, never a record); a send that does not block costs only those.
pub struct TimedSender {
    inner: Box<dyn ChannelSender>,
    metrics: Arc<nop_stream_metrics::TaskMetrics>,
}

impl TimedSender {
    /// Wraps `inner`, counting into `metrics`.
    pub fn wrap(
        inner: Box<dyn ChannelSender>,
        metrics: Arc<nop_stream_metrics::TaskMetrics>,
    ) -> Box<dyn ChannelSender> {
        Box::new(TimedSender { inner, metrics })
    }
}

impl ChannelSender for TimedSender {
    fn channel(&self) -> &ChannelId {
        self.inner.channel()
    }

    fn send(&mut self, msg: Message) -> Result<()> {
        let started = std::time::Instant::now();
        let r = self.inner.send(msg);
        self.metrics.backpressured(started.elapsed());
        r
    }
}

/// A transport backend.
pub trait Transport: Send + Sync {
    /// Backend name as it appears in the DeploymentPlan (e.g. `local-queue`).
    fn backend(&self) -> &'static str;

    /// Opens the receiving end of `channel` for the attempt holding `token`.
    ///
    /// # Errors
    /// [`RuntimeError::Fenced`] for a stale token; [`RuntimeError::Internal`] if opened twice.
    fn open_receiver(&self, channel: &ChannelId, token: FencingToken) -> Result<ChannelReceiver>;

    /// Opens the sending end of `channel` for the attempt holding `token`.
    ///
    /// # Errors
    /// [`RuntimeError::Fenced`] for a stale token.
    fn open_sender(
        &self,
        channel: &ChannelId,
        token: FencingToken,
    ) -> Result<Box<dyn ChannelSender>>;

    /// Makes `token` the only token accepted from now on.
    fn fence(&self, token: FencingToken);

    /// The token in force.
    fn current_token(&self) -> FencingToken;
}

/// Both ends of an in-process channel; the receiver stays here until a task takes it.
type LocalChannel = (Sender<Message>, Option<Receiver<Message>>);

/// In-process transport: one bounded crossbeam queue per channel.
pub struct LocalTransport {
    capacity: usize,
    token: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
    channels: Mutex<HashMap<ChannelId, LocalChannel>>,
}

impl std::fmt::Debug for LocalTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransport")
            .field("capacity", &self.capacity)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl LocalTransport {
    /// Default queue capacity per channel, in messages (batches). Worst-case memory per
    /// channel is `capacity × batch bytes`.
    pub const DEFAULT_CAPACITY: usize = 16;

    /// A transport accepting `token`, with `capacity` messages per channel; sends give up
    /// with [`RuntimeError::Cancelled`] once `cancel` is set.
    pub fn new(capacity: usize, token: FencingToken, cancel: Arc<AtomicBool>) -> Self {
        LocalTransport {
            capacity: capacity.max(1),
            token: Arc::new(AtomicU64::new(token.0)),
            cancel,
            channels: Mutex::new(HashMap::new()),
        }
    }

    fn check(&self, channel: &ChannelId, token: FencingToken) -> Result<()> {
        admit(channel, token, &self.token)
    }

    fn entry<R>(&self, channel: &ChannelId, f: impl FnOnce(&mut LocalChannel) -> R) -> R {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let e = map.entry(channel.clone()).or_insert_with(|| {
            let (s, r) = crossbeam_channel::bounded(self.capacity);
            (s, Some(r))
        });
        f(e)
    }
}

impl Transport for LocalTransport {
    fn backend(&self) -> &'static str {
        "local-queue"
    }

    fn open_receiver(&self, channel: &ChannelId, token: FencingToken) -> Result<ChannelReceiver> {
        self.check(channel, token)?;
        let rx = self.entry(channel, |e| e.1.take()).ok_or_else(|| {
            RuntimeError::Internal(format!("channel {channel} opened twice for receiving"))
        })?;
        Ok(ChannelReceiver::new(
            channel.clone(),
            rx,
            token,
            Arc::clone(&self.token),
        ))
    }

    fn open_sender(
        &self,
        channel: &ChannelId,
        token: FencingToken,
    ) -> Result<Box<dyn ChannelSender>> {
        self.check(channel, token)?;
        let sender = self.entry(channel, |e| e.0.clone());
        Ok(Box::new(LocalSender {
            channel: channel.clone(),
            sender,
            token,
            current: Arc::clone(&self.token),
            cancel: Arc::clone(&self.cancel),
        }))
    }

    fn fence(&self, token: FencingToken) {
        self.token.store(token.0, Ordering::SeqCst);
        // Drop the transport's own sender handles so receivers see disconnection once the
        // fenced attempt's senders are gone too.
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn current_token(&self) -> FencingToken {
        FencingToken(self.token.load(Ordering::SeqCst))
    }
}

struct LocalSender {
    channel: ChannelId,
    sender: Sender<Message>,
    token: FencingToken,
    current: Arc<AtomicU64>,
    cancel: Arc<AtomicBool>,
}

impl ChannelSender for LocalSender {
    fn channel(&self) -> &ChannelId {
        &self.channel
    }

    fn send(&mut self, mut msg: Message) -> Result<()> {
        loop {
            admit(&self.channel, self.token, &self.current)?;
            if self.cancel.load(Ordering::Relaxed) {
                return Err(RuntimeError::Cancelled);
            }
            match self.sender.send_timeout(msg, Duration::from_millis(100)) {
                Ok(()) => return Ok(()),
                Err(SendTimeoutError::Timeout(m)) => msg = m,
                Err(SendTimeoutError::Disconnected(_)) => {
                    return Err(RuntimeError::ChannelClosed {
                        channel: self.channel.clone(),
                        message: "the receiving task has ended".into(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nop_stream_api::{EdgeId, EpochId, SubtaskIndex};

    fn ch() -> ChannelId {
        ChannelId {
            edge: EdgeId::new("a->b#0"),
            upstream: SubtaskIndex(0),
            downstream: SubtaskIndex(1),
            index: 0,
        }
    }

    #[test]
    fn stale_token_is_refused_on_open_and_on_send() {
        let t = LocalTransport::new(2, FencingToken(1), Arc::new(AtomicBool::new(false)));
        let rx = t.open_receiver(&ch(), FencingToken(1)).unwrap();
        let mut tx = t.open_sender(&ch(), FencingToken(1)).unwrap();
        tx.send(Message::Watermark(5)).unwrap();
        assert!(matches!(rx.recv().unwrap(), Message::Watermark(5)));
        tx.send(Message::Watermark(6)).unwrap();
        t.fence(FencingToken(2));
        // Regression: a message queued before the fence is refused where it is received.
        assert!(matches!(
            rx.recv(),
            Err(RuntimeError::Fenced {
                token: FencingToken(1),
                current: FencingToken(2),
                ..
            })
        ));
        let err = tx.send(Message::End).unwrap_err();
        assert!(
            matches!(
                err,
                RuntimeError::Fenced {
                    token: FencingToken(1),
                    current: FencingToken(2),
                    ..
                }
            ),
            "{err}"
        );
        assert!(matches!(
            t.open_sender(&ch(), FencingToken(1)),
            Err(RuntimeError::Fenced { .. })
        ));
        assert!(t.open_sender(&ch(), FencingToken(2)).is_ok());
    }

    #[test]
    fn full_channel_blocks_until_cancelled() {
        let cancel = Arc::new(AtomicBool::new(false));
        let t = LocalTransport::new(1, FencingToken(1), Arc::clone(&cancel));
        let _rx = t.open_receiver(&ch(), FencingToken(1)).unwrap();
        let mut tx = t.open_sender(&ch(), FencingToken(1)).unwrap();
        tx.send(Message::Watermark(1)).unwrap();
        let c2 = Arc::clone(&cancel);
        let h = std::thread::spawn(move || tx.send(Message::Watermark(2)));
        std::thread::sleep(Duration::from_millis(250));
        assert!(!h.is_finished(), "a full channel must block its producer");
        c2.store(true, Ordering::SeqCst);
        assert!(matches!(h.join().unwrap(), Err(RuntimeError::Cancelled)));
    }

    #[test]
    fn order_is_kept_within_a_channel() {
        let t = LocalTransport::new(64, FencingToken(1), Arc::new(AtomicBool::new(false)));
        let rx = t.open_receiver(&ch(), FencingToken(1)).unwrap();
        let mut tx = t.open_sender(&ch(), FencingToken(1)).unwrap();
        for i in 0..50 {
            tx.send(Message::Watermark(i)).unwrap();
        }
        tx.send(Message::Barrier(EpochId(1))).unwrap();
        for i in 0..50 {
            assert!(matches!(rx.recv().unwrap(), Message::Watermark(w) if w == i));
        }
        assert!(matches!(rx.recv().unwrap(), Message::Barrier(EpochId(1))));
    }
}
